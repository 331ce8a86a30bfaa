"""The tracer: runs forward with real values and records what happens.

While :func:`~mgtrace.traced_module.trace_module` runs, the :class:`Tracer`
is the trace hook (:mod:`mgtrace._core.trace_hooks`, installed for the
whole trace) and records:

- ``Module.__call__`` (``on_module_call``): a builtin module
  is recorded as one ``CallMethod(__call__)`` and run untraced; any other
  module is traced into its own graph (once per call signature) and
  recorded in the caller as a call.
- mgtrace.functional (``on_function``): one
  ``CallFunction``, the body runs untraced.
- core ops (``on_apply``): tensor operators and methods become
  ``CallMethod`` (``__add__``, ``reshape``, ``__getitem__``; the forms come
  from the op table), raw ops without a method form ``Apply``; Tensor
  methods that apply no core op (``view``, ``copy.copy(t)``) are one
  ``CallMethod`` too (``on_method``).
- ``Tensor.shape``: a ``CallMethod(shape)`` whose outputs are ValueNodes;
  the ints handed back are :class:`SymInt`, which record their arithmetic,
  so ``x.reshape(x.shape[0], -1)`` stays valid at other batch sizes.
- ``mgtrace.tensor(...)`` and ``Tensor(...)`` called from user code (or
  from generated graph code, when a TracedModule is traced again): one
  ``CallFunction(mgtrace.tensor, data)``, so every call makes the tensor
  afresh from its own values (:meth:`Tracer.on_create`).
- ``tensor.name = ...``: renames the tensor's node (:meth:`Tracer.on_name`).

Each graph being built has a :class:`_Frame` that maps the Python objects
seen so far (by identity) to its nodes. A tensor it has not seen is a
parameter or buffer of the module (``GetAttr``) or else a ``Constant``.
"""
import builtins
import collections
import contextlib
import inspect
import math
import operator
import sys
import warnings

import numpy as np

from mgtrace.errors import Error
from mgtrace._core import Tensor, apply, as_dtype, op_table, tensor as _tensor
from mgtrace._core import trace_hooks as _hooks
from mgtrace.module.builtin import is_builtin
from mgtrace.traced_module.expr import (Apply, CallFunction, CallMethod, Constant, GetAttr,
                                        is_user_file, user_frame, user_source)
from mgtrace.traced_module.graph import InternalGraph
from mgtrace.traced_module.node import ModuleNode, Node, TensorNode, ValueNode, python_name
from mgtrace.traced_module.pytree import LeafDef, tree_flatten

__all__ = ["SymInt", "TraceError", "TraceWarning", "Tracer", "insertion", "traceable_call",
           "active_tracer"]


class TraceError(Error, RuntimeError):
    """Tracing failed; the message names the module path and source line."""


class TraceWarning(UserWarning):
    """The trace fixed something that may vary between runs (a branch on a
    tensor's value, a captured constant)."""


def _warn(message):
    """Warn with TraceWarning, attributed to the user's line being traced."""
    _, level = user_frame()
    warnings.warn(message, TraceWarning, stacklevel=level)


_active = None     # the Tracer while one runs


def active_tracer():
    return _active


# ------------------------------------------------------- symbolic numbers
_quiet = False     # the tracer's own bookkeeping is running: no warnings about it


def _plain(v):
    """The plain int/float value of a symbolic number (no warning)."""
    return int.__int__(v) if isinstance(v, int) else float.__float__(v)


def _sym_binary(op, reflected=False):
    def method(self, other):
        if isinstance(other, np.generic) and not isinstance(other, np.bool_):
            other = other.item()       # a NumPy scalar: its Python value, recorded alike
        if isinstance(other, Tensor):
            # ``n + x``: the tensor's reflected operator records n as a graph value
            return NotImplemented
        a, b = (other, self) if reflected else (self, other)
        t = _active
        if t is None or _quiet or type(other) not in _NUMBER_TYPES:
            if t is not None and not _quiet and op is operator.mul and \
                    isinstance(other, (list, tuple, str, bytes)):
                _warn_fixed(f"repeating a {type(other).__name__} ({type(other).__name__} * n)",
                            self, sys._getframe(1))
            return op(_plain(a) if a is self else a, _plain(b) if b is self else b)
        return t.record_function(op, (a, b), {}, ints_out=True)
    return method


def _sym_unary(op):
    def method(self):
        t = _active
        if t is None or _quiet:
            return op(_plain(self))
        return t.record_function(op, (self,), {}, ints_out=True)
    return method


def _warn_fixed(what, value, caller):
    """Warn (once per line) that ``what`` fixes shape-derived ``value`` in
    the graph, when ``caller`` (the frame that used it) is user code:
    checks in mgtrace's own code (argument validation) are not the user's
    to fix."""
    if _active is not None and not _quiet and is_user_file(caller.f_code.co_filename):
        _active.warn_once(f"{what} of a shape-derived number ({_plain(value)!r}) while tracing "
                          f"{_active.frame.graph.qualname}: the traced graph keeps this run's "
                          "result (a branch stays taken, a check is not re-run, a count or "
                          "size stays fixed at other input shapes)")


def _sym_fixed(what, convert):
    """A use the trace cannot follow: warn, then give the plain value."""
    def method(self, *args):
        _warn_fixed(what, self, sys._getframe(1))
        return convert(_plain(self), *args)
    return method


def _sym_operators(cls, groups):
    """Give ``cls`` the operators of the op table's ``groups`` that Python's
    numbers have: arithmetic is recorded, comparisons are fixed."""
    for op in op_table.OPS.values():
        if op.group not in groups or op.pyop is None:
            continue
        fn = getattr(operator, op.pyop)
        if op.group == "compare":
            setattr(cls, op.method, _sym_fixed(f"comparing ({op.symbol})", fn))
        elif op.arity == 1:
            setattr(cls, op.method, _sym_unary(fn))
        else:
            setattr(cls, op.method, _sym_binary(fn))
            setattr(cls, op.reflected, _sym_binary(fn, True))


class _SymNumber:
    """What SymInt and SymFloat share: recorded arithmetic (``+ - * / // %
    **``, unary ``-``, ``abs``), warned conversions and comparisons."""
    __floor__ = _sym_fixed("math.floor()", math.floor)
    __ceil__ = _sym_fixed("math.ceil()", math.ceil)
    __trunc__ = _sym_fixed("math.trunc()", math.trunc)

    def __str__(self):
        return str(_plain(self))

    def __format__(self, spec):
        return format(_plain(self), spec)
    # the trace keeps what these gave this time (comparisons: _sym_operators)
    __bool__ = _sym_fixed("a branch on (bool())", bool)
    __int__ = _sym_fixed("int()", int)
    __float__ = _sym_fixed("float() (math functions, NumPy)", float)
    __round__ = _sym_fixed("round()", round)
    __divmod__ = _sym_fixed("divmod()", divmod)

    def __hash__(self):
        return hash(_plain(self))


_sym_operators(_SymNumber, ("unary", "binary", "compare"))


class SymInt(_SymNumber, int):
    """An int read from a shape while tracing. Arithmetic on it (``+ - * /
    // % **``, unary ``-``, ``abs``) is recorded and gives SymInt/SymFloat
    again, so ``x.reshape(x.shape[0], -1)`` or ``x / (h * w) ** 0.5`` stay
    right at other input shapes.

    Uses the trace cannot follow -- comparisons and branches, ``int()``,
    ``float()`` (``math.sqrt(n)``), ``round()``, ``range(n)``, repeating a
    list (``[0] * n``) -- see the value of this run and are fixed in the
    graph; each warns (TraceWarning) once per source line. Indexing a
    Python list with ``n`` is fixed silently: Python reads an int subclass
    there without asking it. ``n + x`` with a tensor ``x`` is recorded (as
    ``x.__radd__(n)``). Outside a trace it behaves as a plain int.

    >>> SymInt(6) * 2, type(SymInt(6) * 2).__name__
    (12, 'int')
    """
    def __repr__(self):
        return f"SymInt({_plain(self)})"


# bitwise arithmetic on ints (padding to a multiple of 8: (h + 7) & ~7)
_sym_operators(SymInt, ("bitwise",))


class SymFloat(_SymNumber, float):
    """A float computed from shapes while tracing (e.g. ``h / w``); like
    SymInt, its arithmetic is recorded."""

    def __repr__(self):
        return f"SymFloat({_plain(self)!r})"


_NUMBER_TYPES = (int, float, SymInt, SymFloat)

# ``range(n)`` reads an int subclass's value without asking it (nor does
# indexing a list with it), so SymInt cannot see that use; while a trace
# runs, builtins.range is this class, which warns for a SymInt argument and
# returns a real range (isinstance and issubclass checks still see range).
_builtin_range = builtins.range


class _RangeType(type):
    def __instancecheck__(cls, obj):
        return isinstance(obj, _builtin_range)

    def __subclasscheck__(cls, sub):
        return issubclass(sub, _builtin_range)


class _TracingRange(metaclass=_RangeType):
    __doc__ = _builtin_range.__doc__

    def __new__(cls, *args):
        for a in args:
            if isinstance(a, SymInt):
                _warn_fixed("range()", a, sys._getframe(1))
                break
        return _builtin_range(*args)


@contextlib.contextmanager
def _warning_range():
    builtins.range = _TracingRange
    try:
        yield
    finally:
        builtins.range = _builtin_range


def _traced_leaf(v):
    return isinstance(v, (Tensor, SymInt, SymFloat, Node))


# ----------------------------------------------------- tensor op -> method
_METHOD_OPS = {op.name: op for op in op_table.OPS.values() if op.method}


def method_form(name, inputs, params):
    """``(method, args, kwargs)`` when core op ``name`` on ``inputs`` is a
    Tensor method or operator call (the op table's forms), else None
    (recorded as Apply)."""
    op = _METHOD_OPS.get(name)
    if op is None:
        return None
    first = inputs[0] if inputs else None
    if op.group == "index":                                # x[i], x[i] = v
        return op.method, inputs, {}
    if op.method.startswith("__"):                         # an operator
        out = params.get("out")
        if len(inputs) != op.arity or set(params) - {"out"}:
            return None
        if out is not None:                                # x += y
            return (op.inplace, inputs, {}) if op.inplace and out is first else None
        if op.arity == 1 or isinstance(first, Tensor):
            return op.method, inputs, {}
        return op.reflected, (inputs[1], first), {}        # 2 + x: x.__radd__(2)
    if op.group in op_table.POSITIONAL_PARAMS:             # x.reshape(shape)
        return op.method, inputs + tuple(params.values()), {}
    if "out" in params:
        return None
    return op.method, inputs, dict(params)                 # x.sum(axis=1)


# ------------------------------------------------------------------- frames
class _Frame:
    """One graph under construction: its module and the object -> node map."""

    def __init__(self, tracer, graph, module, tm, path, insert_at=None):
        self.tracer = tracer
        self.graph = graph
        self.module = module            # the module whose forward runs
        self.tm = tm                    # the TracedModule that will own the graph
        self.path = path                # dotted path from the root ("" for the root)
        self.env = {}                   # id(obj) -> Node
        self.keep = []                  # keeps mapped objects alive (ids stay unique)
        self.modules = {}               # id(module) -> ModuleNode
        self.insert_at = insert_at      # index for inserted exprs (editing), else append
        self.placeholders = {}          # id(Node) -> value standing in for it (editing)

    @property
    def self_node(self):
        return self.graph._inputs[0]

    def bind(self, obj, node):
        self.env[id(obj)] = node
        self.keep.append(obj)
        values = self.tracer.values
        if values is not None and id(node) not in values and isinstance(obj, (Tensor, int, float)):
            from mgtrace.traced_module.checker import snapshot
            values[id(node)] = (node, snapshot(obj) if isinstance(obj, Tensor)
                                else _plain(obj) if isinstance(obj, (SymInt, SymFloat)) else obj)

    def append(self, expr):
        expr.source = expr.source or user_source()
        if self.insert_at is None:
            self.graph._append(expr)
        else:
            self.graph._append(expr, at=self.insert_at)
            self.insert_at += 1
        return expr

    def new_node(self, cls, base, **attrs):
        return self.graph._add_node(cls(name=base, **attrs), base)

    # --- nodes of values
    def node_of(self, v):
        n = self.env.get(id(v))
        if n is not None:
            return n
        if isinstance(v, Node):
            if v.graph is not self.graph:
                where = v.graph.qualname if v.graph else "no graph"
                raise TraceError(f"node {v!r} belongs to {where}, not {self.graph.qualname}")
            return v
        if isinstance(v, (SymInt, SymFloat)):      # from another frame: this run's value
            return self._constant(_plain(v), "const", ValueNode, value=_plain(v))
        return self._tensor_source(v)

    def value_of(self, v):
        if isinstance(v, Node):
            return self.placeholder(v)
        return v

    def placeholder(self, node):
        """A real value standing in for ``node`` while editing a graph."""
        p = self.placeholders.get(id(node))
        if p is None:
            if isinstance(node, TensorNode):
                p = _tensor(np.zeros(node.shape or (), node.dtype or np.float32))
            elif isinstance(node, ValueNode):
                p = SymInt(node.value if node.value is not None else 1)
            else:
                p = node.owner
            self.placeholders[id(node)] = p
            self.bind(p, node)
        return p

    def _tensor_source(self, t):
        for owner, name in self.tracer.attr_of(t) or ():
            rel = self.tracer.relpath(self, owner)
            if rel is not None:
                path = f"{rel}.{name}" if rel else name
                e = GetAttr(self.self_node, path)
                node = self.new_node(TensorNode, path.replace(".", "_"), shape=t.shape,
                                     dtype=t.dtype)
                return self._finish(e, node, t)
        if self.tracer.warn_constants:
            _warn(f"{self.graph.qualname}: a tensor made outside the traced calls (shape "
                  f"{t.shape}, {t.dtype}), first used at {user_source()}, is kept as a constant: "
                  "every run reuses these values (make it with mgtrace.functional, e.g. "
                  "F.zeros, to get a fresh tensor per run, or register it as a buffer)")
        return self._constant(t, "const", TensorNode, shape=t.shape, dtype=t.dtype)

    def _constant(self, value, base, cls, **attrs):
        node = self.new_node(cls, base, **attrs)
        return self._finish(Constant(value, node.name), node, value)

    def _finish(self, expr, node, value):
        expr.outputs = [node]
        node.expr = expr
        self.append(expr)
        self.bind(value, node)
        return node

    def module_node(self, module):
        """The ModuleNode for ``module`` in this graph (GetAttr made once)."""
        if module is self.module or module is self.tm:
            return self.self_node
        n = self.modules.get(id(module))
        if n is not None:
            return n
        rel = self.tracer.relpath(self, module)
        if rel is None:
            raise TraceError(f"{self.graph.qualname} calls a module that is not one of its "
                             f"submodules ({type(module).__name__}); make it an attribute of "
                             f"the module that calls it")
        owner = self.tracer.converted.get(id(module), module)
        node = self.new_node(ModuleNode, rel.replace(".", "_"), owner=owner)
        self._finish(GetAttr(self.self_node, rel), node, module)
        self.modules[id(module)] = node
        return node


# ------------------------------------------------------------------ tracer
class _PathNames:
    """The attribute paths of a module tree, by the form Python reads them
    in (NFKC: ``python_name``): two keys with one form (``"fi"`` and
    ``"\ufb01"``, set with setattr or as dict keys) are one name to Python
    code (``self.\ufb01`` reads ``self.fi``) and to the graph's node names;
    the second is refused."""

    def __init__(self, root):
        self.root = root
        self.seen = {}

    def claim(self, path, name=None):
        if name is not None:
            path = f"{path}.{name}" if path else name
        form = python_name(path)
        other = self.seen.setdefault(form, path)
        if other != path:
            raise TraceError(f"{type_name(self.root)}: the members {other!r} and {path!r} are "
                             f"one name to Python (NFKC form {form!r}): code that names one "
                             "reads the other; rename one of them")


class Tracer(_hooks.TraceHook):
    """The trace hook, frames, and the module-path bookkeeping of one trace."""

    def __init__(self, root, converted, warn_constants=True, record_values=False):
        self.root = root
        self.converted = converted      # id(original module) -> module in the TracedModule tree
        self.frames = []
        # id(node) -> (node, value seen while tracing), for the expr checker
        self.values = {} if record_values else None
        self._warned = set()            # (source line, message kind) already warned about
        self.warn_constants = warn_constants
        self.before_write = None        # called with a tensor a core op is about to write
        self.paths = {}                 # id(module) -> dotted path from the root
        # id(tensor) -> [(owner module, attribute name), ...]: every holder, in
        # tree order (a buffer one submodule owns and another holds too is
        # reached from either's graph through its own attribute)
        self.attrs = {}
        names = _PathNames(root)
        for path, m in type(root).named_modules(root):
            self.paths.setdefault(id(m), path)
            names.claim(path)
            for name, t in list(m._parameters.items()) + list(m._buffers.items()):
                if t is not None:
                    self._hold(t, m, name)
                    names.claim(path, name)
            for name, t in m.__dict__.items():
                if isinstance(t, Tensor):
                    self._hold(t, m, name)
                    names.claim(path, name)
            for name, t in m._structure_members():       # in lists/dicts: "anchors.0"
                if isinstance(t, Tensor):
                    self._hold(t, m, name)
                    names.claim(path, name)

    def _hold(self, t, module, name):
        holders = self.attrs.setdefault(id(t), [])
        if not any(m is module and n == name for m, n in holders):
            holders.append((module, name))

    @property
    def frame(self):
        return self.frames[-1]

    def attr_of(self, t):
        return self.attrs.get(id(t))

    def relpath(self, frame, module):
        """Path of ``module`` below the frame's module ('' for itself), else None."""
        p = self.paths.get(id(module))
        if p is None:
            return None
        base = frame.path
        if p == base:
            return ""
        if base == "":
            return p
        return p[len(base) + 1:] if p.startswith(base + ".") else None

    # ------------------------------------------------------------- hooks on
    @contextlib.contextmanager
    def active(self):
        global _active
        if _active is not None:
            raise TraceError("trace_module is already running (nested traces are not supported)")
        _active = self
        try:
            with _hooks.installed(self), _warning_range():
                yield self
        finally:
            _active = None

    @contextlib.contextmanager
    def suspended(self):
        """Run real code with every hook off (the body of a recorded call)."""
        global _active
        saved, _active = _active, None
        try:
            with _hooks.installed(None, tracing=False):
                yield
        finally:
            _active = saved

    # ------------------------------------------------------------ recording
    def _record(self, make_expr, run, args, kwargs, base, ints_out=False, suspend=True):
        """Map inputs to nodes, run, make the expr, bind its outputs."""
        frame = self.frame
        with core_off():
            leaves, tdef = tree_flatten((args, kwargs), _traced_leaf)
            nodes = [frame.node_of(v) for v in leaves]
            vargs, vkwargs = tdef.unflatten([frame.value_of(v) for v in leaves])
        if suspend:
            with self.suspended():
                out = run(vargs, vkwargs)
        else:
            out = run(vargs, vkwargs)
        with core_off():
            nargs, nkwargs = tdef.unflatten(nodes)
            expr = make_expr(nargs, nkwargs)
            return self._bind_outputs(frame, expr, out, base, ints_out)

    def _bind_outputs(self, frame, expr, out, base, ints_out):
        if ints_out:
            is_out = lambda v: isinstance(v, Tensor) or (type(v) in _NUMBER_TYPES)    # noqa: E731
        else:
            is_out = lambda v: isinstance(v, (Tensor, SymInt, SymFloat))             # noqa: E731
        leaves, out_def = tree_flatten(out, is_out)
        results, nodes = [], []
        for i, v in enumerate(leaves):
            name = base if len(leaves) == 1 else f"{base}_{i}"
            if isinstance(v, Tensor):
                node = frame.new_node(TensorNode, name, shape=v.shape, dtype=v.dtype)
            else:
                v = SymInt(_plain(v)) if isinstance(v, int) else SymFloat(_plain(v))
                node = frame.new_node(ValueNode, name, value=_plain(v))
            node.expr = expr
            frame.bind(v, node)
            nodes.append(node)
            results.append(v)
        expr.outputs = nodes
        expr.out_def = out_def
        frame.append(expr)
        if frame.insert_at is not None:            # editing: the user works with nodes
            return out_def.unflatten(nodes)
        return out_def.unflatten(results)

    def record_function(self, fn, args, kwargs, ints_out=False, wrapper=None):
        return self._record(lambda a, k: CallFunction(wrapper or fn, a, k),
                            lambda a, k: fn(*a, **k), args, kwargs,
                            _base_name(fn), ints_out)

    # --------------------------------------------------------- hook bodies
    def on_function(self, wrapper, fn, args, kwargs):
        return self.record_function(fn, args, kwargs, wrapper=wrapper)

    def on_apply(self, opdef, *inputs):
        name, params = opdef.name, dict(opdef.params)
        if self.before_write is not None:       # the caller's state, taken before a write
            target = params.get("out", inputs[0] if name == "setitem" and inputs else None)
            if isinstance(target, Tensor):
                self.before_write(target)
        form = method_form(name, inputs, params)
        if form is not None:
            method, margs, mkwargs = form
            # run the method itself: exactly what the generated code will do
            return self._record(lambda a, k: CallMethod(a[0], method, a[1:], k),
                                lambda a, k: getattr(a[0], method)(*a[1:], **k),
                                margs, mkwargs, _method_base(method, name))
        return self._record(lambda a, k: Apply(name, a, k),
                            lambda a, k: apply(opdef.__class__(name, k), *a),
                            inputs, params, name)

    def on_method(self, t, method, args):
        """A Tensor method that applies no core op (``view``; ``copy`` for
        ``copy.copy(t)``): one CallMethod that the generated code calls."""
        return self._record(lambda a, k: CallMethod(a[0], method, a[1:], k),
                            lambda a, k: getattr(a[0], method)(*a[1:], **k),
                            (t,) + tuple(args), {}, method)

    def on_shape(self, t):
        frame = self.frame
        with core_off():
            node = frame.node_of(t)
            shape = t.shape
            return self._bind_outputs(frame, CallMethod(node, "shape"), shape,
                                      f"{node.name}_shape", ints_out=True)

    def warn_once(self, message, kind=None):
        """TraceWarning at the user's line, once per line and ``kind``."""
        src = user_source()
        key = (src, kind or message.split(" of ", 1)[0])
        if key in self._warned:
            return
        self._warned.add(key)
        _warn(message.replace(" while tracing", f" at {src} while tracing", 1))

    def on_frozen(self, t, what):
        if _quiet or not self.frames or not is_user_file(sys._getframe(1).f_code.co_filename):
            return
        self.warn_once(f"{what} takes a value out of the graph while tracing "
                       f"{self.frame.graph.qualname}: the trace fixes it to this run's value "
                       "(compute with tensor ops, or wrap the function with "
                       "mgtrace.traced_module.wrap, to keep it live)", kind="frozen")

    def on_create(self, target, data, dtype, device):
        """``mgtrace.tensor(data, ...)`` (``target`` None) or ``Tensor(data,
        ...)`` (``target`` the new, still empty Tensor) while tracing: one
        ``CallFunction(tensor, data)``, so every run builds a fresh tensor
        from the values of that run (shape entries stay symbolic). Data
        that is not numbers, shape entries and tensors (a NumPy array) is
        kept as a constant tensor that each run copies. Calls from mgtrace's
        own code are not recorded."""
        if target is None:
            make = lambda d, dtype=None, device=None: _tensor(d, dtype, device)      # noqa: E731
        else:
            make = lambda d, dtype=None, device=None: (                           # noqa: E731
                Tensor.__init__(target, d, dtype, device), target)[1]
        if _quiet or not self.frames or not _user_call(sys._getframe(1)):
            with core_off():
                return make(data, dtype, device)
        kwargs = {}
        if dtype is not None:
            kwargs["dtype"] = as_dtype(dtype)
        if device is not None:
            kwargs["device"] = device
        if not _plain_data(data):
            with core_off():
                data = _tensor(data)
                self.frame._constant(data, "const", TensorNode, shape=data.shape,
                                     dtype=data.dtype)
        return self._record(lambda a, k: CallFunction(_tensor, a, k),
                            lambda a, k: make(*a, **k), (data,), kwargs, "tensor")

    def on_name(self, t, name):
        """``t.name = name`` while tracing names ``t``'s node (made unique
        in its graph: ``name_1`` when taken, also by a name that Python
        reads the same, ``"\ufb01"`` when ``"fi"`` is taken)."""
        if _quiet or not self.frames or not _user_call(sys._getframe(1)):
            return
        node = self.frame.env.get(id(t))
        if node is None or node is self.frame.self_node:
            return
        g = node.graph
        if g._names.get(python_name(name)) is not node:
            node.name = g._unique_name(name)

    def on_bool(self, t):
        self.warn_once(f"a tensor was converted to a Python bool while tracing "
                       f"{self.frame.graph.qualname}: the trace follows the branch taken this "
                       "time and will not re-check it", kind="frozen")

    def on_module_call(self, module, args, kwargs):
        frame = self.frame
        mnode = frame.module_node(module)
        base = f"{mnode.name}_out" if mnode is not frame.self_node else "self_out"
        if is_builtin(module) or frame.insert_at is not None:
            return self._record(lambda a, k: CallMethod(mnode, "__call__", a, k),
                                lambda a, k: module._call_impl(a, k), args, kwargs, base)
        return self._call_traced(frame, module, mnode, args, kwargs, base)

    def _call_traced(self, frame, module, mnode, args, kwargs, base):
        tm = self.converted[id(module)]
        canon = bind_arguments(signature_of(module), args, kwargs, type_name(module))
        # the same leaves as _record maps to nodes, so call args and graph inputs line up
        leaves, arg_def = tree_flatten(canon, lambda v: isinstance(v, (Tensor, SymInt, SymFloat)))
        graph = tm._graph_for(arg_def)

        def run(a, k):
            if graph is not None:
                with self.suspended():
                    return module._call_impl(a, k)
            return self._trace_into(module, tm, arg_def, leaves, a, k)

        def make(a, k):
            e = CallMethod(mnode, "__call__", a, k)
            e.arg_def = arg_def
            return e
        return self._record(make, run, args, kwargs, base, suspend=False)

    def _trace_into(self, module, tm, arg_def, leaves, args, kwargs):
        """Run ``module(*args, **kwargs)`` with a new frame and add the graph
        it records to ``tm``. ``arg_def`` is the structure of the bound
        arguments, ``leaves`` its tensors and SymInts (the graph's inputs)."""
        path = self.paths[id(module)]
        # MegEngine's graph names: the qualname with dots as underscores (Net_layer1_0)
        graph = InternalGraph(tm._qualname_base().replace(".", "_"), tm._qualname_base(), owner=tm)
        sub = _Frame(self, graph, module, tm, path)
        self_node = graph._add_node(ModuleNode(name="self", owner=tm), "self")
        graph._add_input(self_node)
        with core_off():
            for v, name in zip(leaves, _input_names(signature_of(module), arg_def)):
                if isinstance(v, Tensor):
                    node = TensorNode(name=name, shape=v.shape, dtype=v.dtype)
                else:
                    node = ValueNode(name=name, value=_plain(v))
                graph._add_input(graph._add_node(node, name))
                if id(v) in sub.env:
                    if isinstance(v, Tensor):
                        _warn(f"{graph.qualname}: one tensor is passed as both "
                              f"{sub.env[id(v)].name} and {name}; the graph reads it as "
                              f"{sub.env[id(v)].name} everywhere (trace with distinct tensors)")
                else:
                    sub.bind(v, node)
        graph._in_def = arg_def
        self.frames.append(sub)
        try:
            out = module._call_impl(args, kwargs)
            with core_off():
                out_leaves, out_def = tree_flatten(out, lambda v: isinstance(v, (Tensor, SymInt, SymFloat)))
                graph._outputs = [sub.node_of(v) for v in out_leaves]
                graph._out_def = out_def
        except Exception as e:
            err = _annotated(e, graph)
            if err is e:
                raise
            raise err from e
        finally:
            self.frames.pop()
        tm._graphs.append(graph)
        return out


def _user_call(frame):
    """Whether ``frame`` (the caller of a core entry point) is user code or
    generated graph code (a TracedModule being traced again), not
    mgtrace's own."""
    from mgtrace.traced_module.codegen import GENERATED
    name = frame.f_code.co_filename
    return name.startswith(GENERATED) or is_user_file(name)


def _plain_data(data, depth=0):
    """Whether ``data`` is numbers, shape entries and tensors in nested
    lists/tuples: what a graph can hold as arguments of ``tensor``."""
    if isinstance(data, (list, tuple)):
        return depth < 32 and all(_plain_data(d, depth + 1) for d in data)
    return isinstance(data, (bool, int, float, np.generic, Tensor, Node))


_HAS_NOTES = sys.version_info >= (3, 11)     # BaseException.add_note


def _annotated(e, graph):
    """``e`` with a note naming the module being traced and the user's line
    that raised it. Only the innermost traced module adds one (outer ones
    pass the exception on). Python < 3.11 has no notes: there the result is
    a TraceError saying the same, to be raised ``from e``."""
    if getattr(e, "_mgtrace_note", None) is not None:
        return e
    site = _raise_site(e.__traceback__)
    owner = getattr(graph.owner, "_orig_name", None) or graph.name
    note = (f"while tracing {graph.qualname} ({owner}.forward)"
            + (f", raised at {site}" if site else ""))
    if _HAS_NOTES:
        e.add_note(note)
        e._mgtrace_note = note
        return e
    err = TraceError(f"{type(e).__name__}: {e}\n{note}")
    err._mgtrace_note = note
    return err


def _raise_site(tb):
    """``"file.py:42"`` of the innermost user frame in traceback ``tb``."""
    site = None
    while tb is not None:
        filename = tb.tb_frame.f_code.co_filename
        if is_user_file(filename):
            site = f"{filename}:{tb.tb_lineno}"
        tb = tb.tb_next
    return site


class core_off:
    """``with core_off():`` the core's op and tensor events off, function
    and module calls still hooked (the tracer's own bookkeeping). A class,
    not a generator: it is entered several times per recorded expr."""
    __slots__ = ("quiet", "inner")

    def __enter__(self):
        global _quiet
        self.quiet, _quiet = _quiet, True
        self.inner = _hooks.installed(_hooks.active, tracing=False)
        self.inner.__enter__()

    def __exit__(self, *exc):
        global _quiet
        self.inner.__exit__(*exc)
        _quiet = self.quiet
        return False


def _base_name(fn):
    name = getattr(fn, "__name__", "call")
    return name.strip("_") or "call"


def _method_base(method, op):
    if method.startswith("__"):
        return op
    return method


def type_name(module):
    """The class name of ``module``; for a TracedModule, that of the module
    it was traced from (so re-tracing keeps the names)."""
    return module.__dict__.get("_orig_name") or type(module).__name__


_SIGNATURES = {}     # forward function of a class -> signature of the bound method


def signature_of(module):
    """The signature of ``module.forward`` (bound: no ``self``); for a
    TracedModule, that of the forward it was traced from. Cached per class,
    as the tracer asks for it on every module call."""
    sig = module.__dict__.get("_signature")
    if sig is not None:
        return sig
    if "forward" in module.__dict__:            # forward replaced on the instance
        return inspect.signature(module.forward)
    fn = type(module).forward
    sig = _SIGNATURES.get(fn)
    if sig is None:
        sig = _SIGNATURES[fn] = inspect.signature(module.forward)
    return sig


def bind_arguments(sig, args, kwargs, owner):
    """forward's arguments in parameter order, defaults filled in: a tuple
    (``*args`` as a tuple, ``**kwargs`` as a dict).

    Raises:
        TypeError: the arguments do not bind; a keyword that names no
            parameter is named first (``tm(y=x)`` for ``forward(x)`` says
            ``y``, not only that ``x`` is missing)."""
    unknown = _unknown_keywords(sig, kwargs)
    if unknown:
        raise TypeError(f"{owner}.forward{sig}: unexpected keyword argument"
                        f"{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}; "
                        f"forward's parameters are {', '.join(sig.parameters) or 'none'}")
    try:
        bound = sig.bind(*args, **kwargs)
    except TypeError as e:
        raise TypeError(f"{owner}.forward{sig}: {e}") from None
    bound.apply_defaults()
    return tuple(bound.arguments.values())


def _unknown_keywords(sig, kwargs):
    """Keywords of ``kwargs`` that no parameter of ``sig`` takes."""
    params = sig.parameters.values()
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return []
    return [k for k in kwargs if k not in sig.parameters]


def _input_names(sig, arg_def):
    """A name per input slot of ``arg_def``: the parameter's name, joined
    with the path to the leaf for a container argument (``batch_img`` for
    ``batch["img"]``, ``pair_0`` for ``pair[0]``)."""
    names = []
    for p, c in zip(sig.parameters, arg_def.children):
        names += _leaf_names(p, c)
    return names


def _leaf_names(prefix, tdef):
    if isinstance(tdef, LeafDef):
        return [prefix] if tdef.is_slot else []
    keys = tdef.aux if tdef.type in (dict, collections.OrderedDict) else range(len(tdef.children))
    names = []
    for k, c in zip(keys, tdef.children):
        names += _leaf_names(f"{prefix}_{k}", c)
    return names


# ------------------------------------------------------------------ editing
# What graph.insert_exprs() runs under: a Tracer on the graph's owner with
# one frame whose exprs go to a fixed position, Nodes standing in for values
# (node.py forwards their operators and methods here), and module calls
# checked against the callee's traced signatures.

class _EditFrame(_Frame):
    """The frame of an insert_exprs block: Nodes of the graph may be used
    directly, but only those defined before the insertion point."""

    def node_of(self, v):
        if isinstance(v, Node):
            from mgtrace.traced_module.graph import GraphError
            if v.graph is not self.graph:
                where = v.graph.qualname if v.graph is not None else "no graph"
                raise GraphError(f"insert_exprs on {self.graph.qualname}: {v!r} belongs to "
                                 f"{where}; use nodes of the graph being edited")
            if not any(e is v.expr for e in self.graph._exprs[:self.insert_at]):
                raise GraphError(f"insert_exprs on {self.graph.qualname}: {v!r} is defined after "
                                 f"the insertion point; insert after {v.expr!r} instead")
            return v
        return super().node_of(v)


class _EditTracer(Tracer):
    """Tracer for insert_exprs: module calls are single exprs; a call of a
    traced submodule must match one of its graphs (and records which).

    Work that does not touch the graph runs as usual, unrecorded: tensor
    operations and shape reads on tensors that are neither graph values
    nor parameters/buffers of the owner (so building a module inside the
    block works), and functional calls whose tensors are all such (a call
    without tensor arguments, e.g. ``F.ones((2, 3))``, is recorded)."""

    def _refresh(self):
        """Re-read module paths and attribute tensors: modules and tensors
        may be set on the owner inside the block."""
        fresh = Tracer(self.root, self.converted, self.warn_constants)
        self.paths, self.attrs = fresh.paths, fresh.attrs

    def attr_of(self, t):
        where = self.attrs.get(id(t))
        if where is None:
            self._refresh()
            where = self.attrs.get(id(t))
        return where

    def relpath(self, frame, module):
        if id(module) not in self.paths:
            self._refresh()
        return super().relpath(frame, module)

    def _graph_value(self, v):
        return isinstance(v, Node) or id(v) in self.frame.env or \
            (isinstance(v, Tensor) and self.attr_of(v) is not None)

    def _touches_graph(self, args, kwargs, creation_counts=False):
        leaves = tree_flatten((args, kwargs), _traced_leaf)[0]
        if any(self._graph_value(v) for v in leaves):
            return True
        return creation_counts and not any(isinstance(v, Tensor) for v in leaves)

    def on_function(self, wrapper, fn, args, kwargs):
        if self._touches_graph(args, kwargs, creation_counts=True):
            return super().on_function(wrapper, fn, args, kwargs)
        with self.suspended():
            return fn(*args, **kwargs)

    def on_apply(self, opdef, *inputs):
        if self._touches_graph(inputs, opdef.params):
            return super().on_apply(opdef, *inputs)
        with self.suspended():
            return apply(opdef, *inputs)

    def on_method(self, t, method, args):
        if self._touches_graph((t,) + tuple(args), {}):
            return super().on_method(t, method, args)
        with self.suspended():
            return getattr(t, method)(*args)

    def on_shape(self, t):
        if self._graph_value(t):
            return super().on_shape(t)
        with core_off():
            return t.shape

    def on_create(self, target, data, dtype, device):
        # a tensor made from graph values is recorded; one made from plain data
        # (e.g. for a module built inside the block) is not
        if self._touches_graph((data,), {}):
            return super().on_create(target, data, dtype, device)
        with core_off():
            if target is None:
                return _tensor(data, dtype, device)
            Tensor.__init__(target, data, dtype, device)

    def on_bool(self, t):
        if self._graph_value(t):
            super().on_bool(t)

    def on_module_call(self, module, args, kwargs):
        from mgtrace.traced_module.graph import GraphError
        frame = self.frame
        if module is frame.module:
            raise GraphError(f"insert_exprs on {frame.graph.qualname}: a graph cannot call its "
                             "own module (that would recurse forever)")
        try:
            mnode = frame.module_node(module)
        except TraceError as e:
            raise GraphError(f"insert_exprs: {e}") from None
        if is_builtin(module):
            return super().on_module_call(module, args, kwargs)
        graphs = getattr(module, "_graphs", None)
        name = getattr(module, "_qualname", type(module).__name__)
        canon = bind_arguments(signature_of(module), args, kwargs, name)
        arg_def = tree_flatten(canon, lambda v: isinstance(v, (Node, Tensor, SymInt, SymFloat)))[1]
        if not graphs:           # a user module, or a traced one never called: trace it now
            module, mnode = self._trace_on_first_use(frame, module, mnode, args, kwargs)
        elif module._graph_for(arg_def) is None:
            raise GraphError(f"insert_exprs: {name} was traced for arguments "
                             f"{[g.in_def for g in graphs]}, not {arg_def}; call it as it was "
                             "traced")

        def make(a, k):
            e = CallMethod(mnode, "__call__", a, k)
            e.arg_def = arg_def
            return e
        return self._record(make, lambda a, k: module._call_impl(a, k), args, kwargs,
                            f"{mnode.name}_out")


    def _trace_on_first_use(self, frame, module, mnode, args, kwargs):
        """Trace ``module`` (a user module, or a traced submodule that was
        never called) with placeholder values of ``args``, put the new
        TracedModule in its place in the owner's tree (same path, qualnames
        and ids of this tree) and return it with its ModuleNode."""
        from mgtrace.traced_module.graph import GraphError, reset_ids
        from mgtrace.traced_module.traced_module import TracedModule, trace_module
        source = module
        if isinstance(module, TracedModule):
            ref = module.__dict__.get("_orig_module")
            source = ref() if ref is not None else None
            if source is None:
                raise GraphError(f"insert_exprs: {module._qualname} was never called while "
                                 "tracing, so it has no graph, and the module it was traced "
                                 "from is gone (or it was loaded from an archive): trace the "
                                 "model again with a call of it")
        rel = self.relpath(frame, module)
        with core_off():
            leaves, tdef = tree_flatten((args, kwargs), _traced_leaf)
            vargs, vkwargs = tdef.unflatten([frame.value_of(v) for v in leaves])
        with self.suspended():
            new = trace_module(source, *vargs, **vkwargs)
        new._is_top = False
        old_prefix = new._qualname
        prefix = f"{frame.graph.owner._qualname}.{rel}"
        for m in type(new).modules(new):
            if isinstance(m, TracedModule):
                m._qualname = prefix + m._qualname[len(old_prefix):]
                for g in m._graphs:
                    g._qualname = prefix + g._qualname[len(old_prefix):]
                    g._name = g._qualname.replace(".", "_")
        if frame.graph._ids is not None:    # the ids of this tree continue
            reset_ids(new, frame.graph._ids)
        from mgtrace.traced_module.codegen import member
        *head, last = rel.split(".")
        parent = frame.module
        for p in head:
            parent = member(parent, p)
        parent._modules[last] = new
        parent.__dict__.pop(last, None)
        self._refresh()
        for n in frame.graph.nodes(False):
            if isinstance(n, ModuleNode) and n.owner is module:
                n.owner = new
        frame.modules.pop(id(module), None)
        frame.modules[id(new)] = mnode
        return new, mnode


class _EditHooks:
    """What node.py calls for an operator or method on a Node."""

    def __init__(self, tracer):
        self.tracer = tracer

    def record_method(self, node, method, args, kwargs):
        if "out" in kwargs:
            from mgtrace.traced_module.graph import GraphError
            raise GraphError(f"{node!r}.{method}(out=...): in-place results are not recorded on "
                             "graph nodes; use the returned node")
        return self.tracer._record(lambda a, k: CallMethod(a[0], method, a[1:], k),
                                   lambda a, k: getattr(a[0], method)(*a[1:], **k),
                                   (node,) + tuple(args), dict(kwargs),
                                   method.strip("_") or "call")

    def record_function(self, fn, args, kwargs):
        return self.tracer.record_function(fn, args, kwargs, ints_out=True)

    def record_getattr(self, node, name):
        """``module_node.<name>``: a ModuleNode for a submodule, a TensorNode
        for a parameter or buffer (a GetAttr from the graph's self), the
        plain value for anything else."""
        from mgtrace.traced_module.codegen import member
        owner = node.owner
        try:
            value = member(owner, name)
        except AttributeError:
            raise AttributeError(f"{node!r} ({type(owner).__name__}) has no attribute "
                                 f"{name!r}") from None
        frame = self.tracer.frame
        from mgtrace.module.module import Module
        if isinstance(value, Module):
            try:
                return frame.module_node(value)
            except TraceError as e:
                from mgtrace.traced_module.graph import GraphError
                raise GraphError(f"insert_exprs: {e}") from None
        if isinstance(value, Tensor):
            with core_off():
                return frame.node_of(value)
        return value


@contextlib.contextmanager
def insertion(graph, pos):
    """Record calls on ``graph``'s nodes as exprs inserted at index ``pos``.

    Inside: mgtrace.functional calls, module calls on the owner's
    submodules, and operators / tensor methods on the graph's Nodes each
    add one expr (returning Nodes); other tensor operations are recorded
    too (their tensors as constants). Yields the frame."""
    import mgtrace.traced_module.node as _node
    from mgtrace.traced_module.graph import GraphError
    owner = graph.owner
    if owner is None:
        raise GraphError(f"insert_exprs: graph {graph.qualname} has no owning TracedModule")
    if _active is not None:
        raise GraphError("insert_exprs: another insert_exprs block or trace_module is running; "
                         "finish it before editing a graph")
    tracer = _EditTracer(owner, {}, warn_constants=False)
    frame = _EditFrame(tracer, graph, owner, owner, "", insert_at=pos)
    for e in graph._exprs[:pos]:
        if isinstance(e, GetAttr) and isinstance(e.outputs[0], ModuleNode):
            frame.modules[id(e.outputs[0].owner)] = e.outputs[0]
    tracer.frames.append(frame)
    with tracer.active():
        saved, _node.edit_hooks = _node.edit_hooks, _EditHooks(tracer)
        try:
            yield frame
        finally:
            _node.edit_hooks = saved


def traceable_call(func):
    """``func`` such that calling it on Nodes inside insert_exprs records
    it: functions made traceable (mgtrace.functional, ``wrap``) become one
    CallFunction; any other callable runs on the Nodes, so what its body
    does is recorded expr by expr (MegEngine's insert_function)."""
    if not callable(func):
        raise TypeError(f"insert_function takes a callable, not {type(func).__name__}")
    return func
