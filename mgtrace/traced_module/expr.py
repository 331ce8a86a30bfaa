"""Exprs: the statements of a graph. One closed set (:data:`EXPR_KINDS`):

==============  ==========================================================
Input           a graph input (``self`` or an argument of forward)
GetAttr         ``self.<dotted.path>``: a submodule, parameter or buffer
CallMethod      a method of a node: a module call (``__call__``), a tensor
                method or operator (``reshape``, ``__add__``, ``shape``)
CallFunction    a function: ``mgtrace.functional``, ``operator`` (shape
                arithmetic), or a user function made traceable with ``wrap``
Constant        a value captured while tracing (a tensor made outside the
                recorded calls, a non-parameter tensor attribute, ...)
Apply           a raw core op (``mgtrace.apply(OpDef(...), ...)``) that has
                no method form
==============  ==========================================================

Arguments are kept as given (``args`` tuple and ``kwargs`` dict) with Nodes
in place of traced values, wherever they sit in nested containers, as in
torch.fx. ``inputs`` lists those nodes in order; ``outputs`` are the nodes
the expr produces, ``out_def`` the TreeDef that rebuilds its result.
"""
import functools
import inspect
import itertools
import operator
import os
import sys
import sysconfig

import numpy as np

from mgtrace._core import Tensor, op_table, tensor as _core_tensor
from mgtrace._core.dtype import qdtype_name, qdtype_str
from mgtrace.traced_module.errors import GraphError
from mgtrace.traced_module.node import ModuleNode, Node
from mgtrace.traced_module.pytree import tree_flatten, tree_leaves, tree_map
from mgtrace.traced_module.signature import bind_arguments, signature_of

__all__ = ["Expr", "Input", "GetAttr", "CallMethod", "CallFunction", "Constant", "Apply",
           "EXPR_KINDS", "is_node", "user_source", "user_frame", "called_graph"]

_ids = itertools.count()
_PKG = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def is_node(v):
    return isinstance(v, Node)


@functools.lru_cache(maxsize=4096)
def is_user_file(filename):
    """False for mgtrace's own code: its Python files, its Cython sources
    (tracebacks name them relative, ``mgtrace/_core/tensor.pyx``) and the
    generated code (``mgtrace-generated:...``)."""
    return not (filename.startswith(_PKG) or filename.startswith("mgtrace-generated:")
                or filename.startswith("mgtrace" + os.sep))


_LIBRARY_DIRS = tuple({sysconfig.get_paths()[k] for k in ("stdlib", "purelib", "platlib")})


@functools.lru_cache(maxsize=4096)
def is_library_file(filename):
    """Installed libraries and the standard library (NumPy, math wrappers...):
    a warning caused there is reported at the user's line that called them."""
    return filename.startswith(_LIBRARY_DIRS) or filename.startswith("<frozen")


def user_frame():
    """``(frame, stacklevel)``: the innermost frame outside mgtrace, and how
    many frames up from the caller it is (what ``warnings.warn`` takes as
    ``stacklevel`` when the caller warns); ``(None, 1)`` if there is none."""
    f = sys._getframe(1)
    level = 1
    while f is not None:
        name = f.f_code.co_filename
        if is_user_file(name) and not is_library_file(name):
            return f, level
        f = f.f_back
        level += 1
    return None, 1


def user_source():
    """``"file.py:42"`` of the innermost caller outside mgtrace (or None)."""
    f, _ = user_frame()
    return None if f is None else f"{f.f_code.co_filename}:{f.f_lineno}"


class Expr:
    """One statement of an InternalGraph (see the module docstring)."""
    kind = "expr"

    def __init__(self, args=(), kwargs=None):
        self._id = next(_ids)
        self._top_graph = None      # the graph that holds this expr
        self.outputs = []
        self.out_def = None
        self.source = None          # "file.py:line" of the user code that made it
        self._set_args(tuple(args), dict(kwargs or {}))

    # ----------------------------------------------------------- arguments
    def _set_args(self, args, kwargs):
        self.args = args
        self.kwargs = kwargs
        self._inputs = tree_leaves((args, kwargs), is_node)

    @property
    def id(self):
        return self._id

    @property
    def inputs(self):
        """Input nodes in argument order (a node passed twice appears twice)."""
        return list(self._inputs)

    def replace_input(self, old, new):
        """Make the expr read ``new`` wherever it read ``old``."""
        self._swap_input(old, new)
        if self._top_graph is not None:
            old._remove_user(self)
            new._add_user(self)

    def _swap_input(self, old, new):
        """The arguments part of :meth:`replace_input`, with the users lists
        left to the caller (a graph moving many users at once)."""
        swap = lambda v: new if v is old else v          # noqa: E731
        args, kwargs = tree_map(swap, (self.args, self.kwargs), is_node)
        self._set_args(args, kwargs)

    @property
    def top_graph(self):
        """The InternalGraph that holds this expr (MegEngine's ``top_graph``)."""
        return self._top_graph

    # ------------------------------------------- editing arguments (MegEngine's)
    def _signature(self):
        """The signature ``args``/``kwargs`` bind to (``self`` first for a
        method)."""
        raise TypeError(f"{type(self).__name__} exprs take no arguments to edit")

    @property
    def named_args(self):
        """The call's arguments by parameter name, defaults filled in
        (``{"self": module_node, "x": node}`` for a module call).

        Raises:
            TypeError: an Input, GetAttr or Constant expr (no call)."""
        bound = self._signature().bind(*self.args, **self.kwargs)
        bound.apply_defaults()
        return dict(bound.arguments)

    def set_arg(self, name, value):
        """Give argument ``name`` (a parameter name; see :attr:`named_args`)
        the value ``value`` (a node of this graph defined before this expr,
        or a constant), keeping the others. Raises as
        :meth:`set_args_kwargs`, and GraphError for an unknown name."""
        sig = self._signature()
        if name not in sig.parameters:
            raise GraphError(f"set_arg: {self!r} has no parameter {name!r} "
                             f"(it takes {', '.join(sig.parameters)})")
        bound = sig.bind(*self.args, **self.kwargs)
        bound.arguments[name] = value
        self.set_args_kwargs(*bound.args, **bound.kwargs)

    def set_args_kwargs(self, *args, **kwargs):
        """Replace the call's arguments (``self`` node first for a method).
        Users of the nodes are updated; the graph's code is rebuilt on the
        next call.

        Raises:
            GraphError: the arguments do not fit the signature; a node is not
                of this graph or is defined after this expr; a traced module
                was not traced for this argument structure.
            TypeError: an expr that takes no arguments.
        """
        try:
            self._signature().bind(*args, **kwargs)
        except TypeError as e:
            raise GraphError(f"set_args_kwargs on {self!r}: {e}") from None
        g = self._top_graph
        nodes = tree_leaves((args, kwargs), is_node)
        if g is not None:
            index = {id(e): i for i, e in enumerate(g._exprs)}
            me = index.get(id(self), len(g._exprs))
            for n in nodes:
                if n.graph is not g or index.get(id(n.expr), me) >= me:
                    raise GraphError(f"set_args_kwargs on {self!r}: {n!r} is not a node of "
                                     f"{g.qualname} defined before this expr")
        self._check_new_args(args, kwargs)
        if g is not None:
            for n in self._inputs:
                n._remove_user(self)
        self._set_args(tuple(args), dict(kwargs))
        if g is not None:
            for n in self._inputs:
                n._add_user(self)
            g._touch()

    def _check_new_args(self, args, kwargs):
        """Raise GraphError when these arguments cannot replace the current
        ones (beyond binding); may update derived state."""

    @property
    def return_val(self):
        """The expr's result: its output nodes in the structure the call
        returns (one node, or a tuple/list/dict of them).

        Settable (MegEngine's ``return_val``) to nodes of a new structure:
        each is one of the current outputs or a new node (not in a graph
        yet; it is added with its name made unique); outputs left out must
        have no users. GraphError otherwise."""
        if self.out_def is None:
            return self.outputs[0] if len(self.outputs) == 1 else tuple(self.outputs)
        return self.out_def.unflatten(self.outputs)

    @return_val.setter
    def return_val(self, value):
        leaves, out_def = tree_flatten(value, is_node)
        current = {id(o) for o in self.outputs}
        for n in leaves:
            if not isinstance(n, Node):
                raise GraphError(f"return_val of {self!r}: {n!r} is not a node")
            if id(n) not in current and (n.graph is not None or n.expr not in (None, self)):
                raise GraphError(f"return_val of {self!r}: {n!r} is produced elsewhere")
        g = self._top_graph
        dropped = [o for o in self.outputs if not any(o is n for n in leaves)]
        for o in dropped:
            if o.users or (g is not None and any(o is x for x in g._outputs)):
                raise GraphError(f"return_val of {self!r}: {o!r} is still used")
        for o in dropped:
            if g is not None and g._names.get(o._name) is o:
                del g._names[o._name]
            o.expr = None
        for n in leaves:
            if n.graph is None and g is not None:
                g._add_node(n, n.name)
            n.expr = self
        self.outputs = list(leaves)
        self.out_def = out_def
        if g is not None:
            g._touch()

    @property
    def graph(self):
        """The graph this expr runs: for a call of a traced submodule, the
        callee's graph (the one traced for this call's arguments); None for
        every other expr, a builtin module call included (MegEngine's
        ``CallMethod.graph``). The graph holding the expr is
        :attr:`top_graph`."""
        return None

    # ------------------------------------------------------------ printing
    def _format_args(self, skip=0):
        parts = [_fmt(a) for a in self.args[skip:]]
        parts += [f"{k}={_fmt(v)}" for k, v in self.kwargs.items()]
        return ", ".join(parts)

    def _lhs(self):
        if not self.outputs:
            return ""
        return ", ".join(map(repr, self.outputs)) + " = "

    def __repr__(self):
        return f"{self._lhs()}{self._rhs()}"

    def _rhs(self):
        raise NotImplementedError


def _fmt(v):
    if isinstance(v, Node):
        return repr(v)
    if isinstance(v, tuple):
        inner = ", ".join(map(_fmt, v))
        return f"({inner}{',' if len(v) == 1 else ''})"
    if isinstance(v, list):
        return "[" + ", ".join(map(_fmt, v)) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k!r}: {_fmt(x)}" for k, x in v.items()) + "}"
    if isinstance(v, slice):
        parts = ("" if p is None else _fmt(p) for p in (v.start, v.stop, v.step))
        return ":".join(parts).rstrip(":") or ":"
    if isinstance(v, np.dtype) and qdtype_name(v) is not None:      # a quantized dtype: its name, scale and zero point
        return qdtype_str(v)
    return repr(v)


class Input(Expr):
    """A graph input; its one output is the input node."""
    kind = "input"

    def __init__(self, name):
        super().__init__()
        self.name = name

    def _rhs(self):
        return f"Input({self.name!r})"


class GetAttr(Expr):
    """``module_node.<name>``; ``name`` may be dotted (``layer1.0.conv1``)."""
    kind = "getattr"

    def __init__(self, module_node, name):
        super().__init__((module_node,))
        self.name = name

    def _rhs(self):
        return f"getattr({self.args[0]!r}, {self.name!r})"


class CallMethod(Expr):
    """``self_node.method(*args, **kwargs)``; ``args[0]`` is the self node.
    For a module call (``method == "__call__"``) ``arg_def`` is the TreeDef of
    the call's bound arguments, which selects the callee's graph."""
    kind = "call_method"
    PROPERTIES = frozenset({"shape"})          # read, not called
    # tensor methods that write into their self tensor (x[i] = v, x += y, ...)
    IN_PLACE = op_table.inplace_methods()

    def __init__(self, self_node, method, args=(), kwargs=None):
        super().__init__((self_node,) + tuple(args), kwargs)
        self.method = method
        self.arg_def = None

    @property
    def graph(self):
        """For a call of a traced submodule, the callee's graph for this
        call's arguments; None for a builtin module call or a tensor method."""
        return called_graph(self)

    def _signature(self):
        first = inspect.Parameter("self", inspect.Parameter.POSITIONAL_ONLY)
        owner = getattr(self.args[0], "owner", None)
        if self.method == "__call__" and owner is not None:
            sig = signature_of(owner)
            return sig.replace(parameters=[first] + list(sig.parameters.values()))
        try:
            return inspect.signature(getattr(Tensor, self.method))
        except (AttributeError, TypeError, ValueError):
            return _positional_signature(len(self.args), self.kwargs, first)

    def _check_new_args(self, args, kwargs):
        if self.method != "__call__" or not args or getattr(args[0], "owner", None) is None:
            return
        owner = args[0].owner
        canon = bind_arguments(signature_of(owner), args[1:], kwargs, type(owner).__name__)
        arg_def = tree_flatten(canon, is_node)[1]
        graphs = getattr(owner, "_graphs", None)
        if graphs and not any(g._in_def == arg_def for g in graphs):
            raise GraphError(f"set_args_kwargs on {self!r}: {owner._qualname} was traced for "
                             f"arguments {[g.in_def for g in graphs]}, not {arg_def}")
        if self.arg_def is not None or graphs:
            self.arg_def = arg_def

    def _rhs(self):
        if self.method in self.PROPERTIES:
            return f"{self.args[0]!r}.{self.method}"
        return f"{self.args[0]!r}.{self.method}({self._format_args(1)})"


class CallFunction(Expr):
    """``func(*args, **kwargs)``."""
    kind = "call_function"

    def __init__(self, func, args=(), kwargs=None):
        super().__init__(args, kwargs)
        self.func = func

    def _signature(self):
        try:
            return inspect.signature(self.func)
        except (TypeError, ValueError):
            return _positional_signature(len(self.args), self.kwargs)

    def _rhs(self):
        return f"{function_name(self.func)}({self._format_args()})"


class Constant(Expr):
    """A value captured while tracing (``value``: usually a Tensor)."""
    kind = "constant"

    def __init__(self, value, name=None):
        super().__init__()
        self.value = value
        self.name = name

    def _rhs(self):
        v = self.value
        shape = getattr(v, "shape", None)
        if shape is not None:
            return f"Constant({type(v).__name__} shape={tuple(shape)} dtype={v.dtype})"
        return f"Constant({v!r})"


class Apply(Expr):
    """``mgtrace.apply(opdef, *args)``; ``kwargs`` are the op's params."""
    kind = "apply"

    def __init__(self, opdef_name, args=(), params=None):
        super().__init__(args, params)
        self.op = opdef_name

    def _signature(self):
        return _positional_signature(len(self.args), self.kwargs)

    def _rhs(self):
        return f"apply[{self.op}]({self._format_args()})"


def _positional_signature(n, kwargs, first=None):
    """``(arg0, ..., /, *, k=...)``: for callables without a signature."""
    P = inspect.Parameter
    params = [first] if first is not None else []
    params += [P(f"arg{i}", P.POSITIONAL_ONLY) for i in range(len(params), n)]
    params += [P(k, P.KEYWORD_ONLY) for k in kwargs if isinstance(k, str) and k.isidentifier()]
    return inspect.Signature(params)


def called_graph(e):
    """The graph a module-call expr runs, when the callee is a TracedModule
    (the one of its graphs traced for this call's argument structure)."""
    if isinstance(e, CallMethod) and e.method == "__call__" and e.arg_def is not None:
        mod = e.args[0].owner if isinstance(e.args[0], ModuleNode) else None
        graphs = getattr(mod, "_graphs", None)
        if graphs:
            for g in graphs:
                if g._in_def == e.arg_def:
                    return g
    return None


EXPR_KINDS = {cls.kind: cls for cls in (Input, GetAttr, CallMethod, CallFunction, Constant, Apply)}

# the operator functions of the op table by their public name (operator.and_,
# whose __module__ is the private _operator)
_OPERATOR_NAMES = {getattr(operator, n): f"operator.{n}" for n in op_table.operator_functions()}


def function_name(fn):
    """A readable dotted name: ``F.relu``, ``operator.mul``, ``mymod.fn``,
    ``mgtrace.tensor``."""
    if fn in _OPERATOR_NAMES:
        return _OPERATOR_NAMES[fn]
    if fn is _core_tensor:
        return "mgtrace.tensor"
    mod = getattr(fn, "__module__", "") or ""
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", repr(fn))
    if mod.startswith("mgtrace.functional"):
        return f"F.{name}"
    return f"{mod}.{name}" if mod else name
