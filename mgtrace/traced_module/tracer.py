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

Each graph being built has a :class:`Frame` that maps the Python objects
seen so far (by identity) to its nodes. A tensor it has not seen is a
parameter or buffer of the module (``GetAttr``) or else a ``Constant``.

Beside it: ``symbolic.py`` (SymInt, SymFloat and the running trace's
state), ``signature.py`` (forward signatures and argument binding),
``edit.py`` (the recorder graph edits run under, a Tracer subclass), and
``errors.py`` (TraceError, TraceWarning).
"""
import contextlib
import sys

import numpy as np

from mgtrace._core import Tensor, apply, as_dtype, op_table, tensor as _tensor
from mgtrace._core import trace_hooks as _hooks
from mgtrace.module.builtin import is_builtin
from mgtrace.traced_module.checker import snapshot
from mgtrace.traced_module.codegen import GENERATED
from mgtrace.traced_module.errors import TraceError, TraceWarning
from mgtrace.traced_module.expr import (Apply, CallFunction, CallMethod, Constant, GetAttr,
                                        is_user_file, user_source)
from mgtrace.traced_module.graph import InternalGraph
from mgtrace.traced_module.node import ModuleNode, Node, TensorNode, ValueNode, python_name
from mgtrace.traced_module.pytree import tree_flatten
from mgtrace.traced_module.signature import bind_arguments, input_names, signature_of, type_name
from mgtrace.traced_module.symbolic import (NUMBER_TYPES, SymFloat, SymInt, warn_traced, active_tracer,
                                            plain, state, warning_range)

# TraceError, TraceWarning and SymInt are also importable from here, as before the split
__all__ = ["Tracer", "Frame", "core_off", "method_form", "traced_leaf", "SymInt", "TraceError",
           "TraceWarning", "active_tracer"]


def traced_leaf(v):
    """Whether ``v`` is a leaf the trace follows: a tensor, a symbolic number, a node."""
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
class Frame:
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
            values[id(node)] = (node, snapshot(obj) if isinstance(obj, Tensor)
                                else plain(obj) if isinstance(obj, (SymInt, SymFloat)) else obj)

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
            return self._constant(plain(v), "const", ValueNode, value=plain(v))
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
                p = _tensor(np.zeros(node.shape or (), node.dtype or np.float32), None,
                            self._device())
            elif isinstance(node, ValueNode):
                p = SymInt(node.value if node.value is not None else 1)
            else:
                p = node.owner
            self.placeholders[id(node)] = p
            self.bind(p, node)
        return p

    def _device(self):
        """The device of the module whose graph this is (its first parameter
        or buffer), so that editing a module placed off the default device
        makes its stand-in values there too; None (the default device) for a
        module without tensors."""
        owner = self.tm if self.tm is not None else self.module
        for kind in ("parameters", "buffers"):
            walk = getattr(type(owner), kind, None)    # through the class: see Module's shadowing rule
            for t in (walk(owner) if walk is not None else ()):
                return t.device
        return None

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
            warn_traced(f"{self.graph.qualname}: a tensor made outside the traced calls (shape "
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


def _reads_training(fn):
    """Whether ``fn``'s code (nested functions included) reads an attribute
    named ``training`` (``self.training``): a trace fixes its value."""
    code = getattr(fn, "__code__", None)
    todo = [code] if code is not None else []
    while todo:
        c = todo.pop()
        if "training" in c.co_names:
            return True
        todo += [k for k in c.co_consts if hasattr(k, "co_names")]
    return False


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
        # a trace in another thread is waited for (the hook is the
        # process's); one in this thread is a nested trace
        with _hooks.one_trace:
            if state.tracer is not None:
                raise TraceError("trace_module is already running (nested traces are not "
                                 "supported)")
            state.tracer = self
            try:
                with _hooks.installed(self), warning_range():
                    yield self
            finally:
                state.tracer = None

    @contextlib.contextmanager
    def suspended(self):
        """Run real code with every hook off (the body of a recorded call)."""
        saved, state.tracer = state.tracer, None
        try:
            with _hooks.installed(None, tracing=False):
                yield
        finally:
            state.tracer = saved

    # ------------------------------------------------------------ recording
    def _record(self, make_expr, run, args, kwargs, base, ints_out=False, suspend=True):
        """Map inputs to nodes, run, make the expr, bind its outputs."""
        frame = self.frame
        with core_off():
            leaves, tdef = tree_flatten((args, kwargs), traced_leaf)
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
            is_out = lambda v: isinstance(v, Tensor) or (type(v) in NUMBER_TYPES)    # noqa: E731
        else:
            is_out = lambda v: isinstance(v, (Tensor, SymInt, SymFloat))             # noqa: E731
        leaves, out_def = tree_flatten(out, is_out)
        results, nodes = [], []
        for i, v in enumerate(leaves):
            name = base if len(leaves) == 1 else f"{base}_{i}"
            if isinstance(v, Tensor):
                node = frame.new_node(TensorNode, name, shape=v.shape, dtype=v.dtype)
            else:
                v = SymInt(plain(v)) if isinstance(v, int) else SymFloat(plain(v))
                node = frame.new_node(ValueNode, name, value=plain(v))
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
        warn_traced(message.replace(" while tracing", f" at {src} while tracing", 1))

    def on_frozen(self, t, what):
        if state.quiet or not self.frames or not is_user_file(sys._getframe(1).f_code.co_filename):
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
        if state.quiet or not self.frames or not _user_call(sys._getframe(1)):
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
        if state.quiet or not self.frames or not _user_call(sys._getframe(1)):
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
        sub = Frame(self, graph, module, tm, path)
        self_node = graph._add_node(ModuleNode(name="self", owner=tm), "self")
        graph._add_input(self_node)
        with core_off():
            for v, name in zip(leaves, input_names(signature_of(module), arg_def)):
                if isinstance(v, Tensor):
                    node = TensorNode(name=name, shape=v.shape, dtype=v.dtype)
                else:
                    node = ValueNode(name=name, value=plain(v))
                graph._add_input(graph._add_node(node, name))
                if id(v) in sub.env:
                    if isinstance(v, Tensor):
                        warn_traced(f"{graph.qualname}: one tensor is passed as both "
                              f"{sub.env[id(v)].name} and {name}; the graph reads it as "
                              f"{sub.env[id(v)].name} everywhere (trace with distinct tensors)")
                else:
                    sub.bind(v, node)
        graph._in_def = arg_def
        if not state.quiet and _reads_training(type(module).forward):
            warn_traced(f"{graph.qualname}: {type(module).__qualname__}.forward reads "
                        f"self.training while tracing: the trace fixes it to "
                        f"{bool(module.training)}, so train()/eval() of the traced module does "
                        "not change what this forward computes (builtin modules such as "
                        "Dropout and BatchNorm follow their own flag); trace it again in the "
                        "other mode, or move the branch into a builtin module")
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
        self.quiet, state.quiet = state.quiet, True
        self.inner = _hooks.installed(_hooks.active, tracing=False)
        self.inner.__enter__()

    def __exit__(self, *exc):
        self.inner.__exit__(*exc)
        state.quiet = self.quiet
        return False


def _base_name(fn):
    name = getattr(fn, "__name__", "call")
    return name.strip("_") or "call"


def _method_base(method, op):
    if method.startswith("__"):
        return op
    return method
