"""What the passes share: walking a module's graphs, recognising module and
function calls, and reading constant operands.

Nothing here edits a graph; the passes do (through the graph's own editing
API: ``insert_exprs``, ``replace_node``, ``compile``).
"""
import inspect

import numpy as np

from mgtrace._core import Tensor
from mgtrace.traced_module.expr import CallFunction, CallMethod, Constant, GetAttr
from mgtrace.traced_module.node import ModuleNode, TensorNode

__all__ = ["graphs_of", "module_call", "is_function", "bound_args", "sole_user", "attr_value",
           "const_value", "call_counts", "insert_constant", "float_node"]


def graphs_of(tm):
    """The graphs a call of ``tm`` can run, each once: its own and, through
    module calls, those of the traced submodules it calls (a submodule left
    behind by flatten() or an edit, which nothing calls, is not visited)."""
    from mgtrace.traced_module.graph import called_graph
    seen, todo = set(), list(tm._graphs)
    while todo:
        g = todo.pop(0)
        if id(g) in seen:
            continue
        seen.add(id(g))
        yield g
        todo.extend(sub for sub in map(called_graph, list(g._exprs)) if sub is not None)


def module_call(e, cls=None):
    """The builtin module ``e`` calls (``module(x)``), when it calls one (an
    instance of ``cls`` when given, of exactly that class), else None."""
    from mgtrace.traced_module.traced_module import TracedModule
    if not (isinstance(e, CallMethod) and e.method == "__call__" and e.args
            and isinstance(e.args[0], ModuleNode)):
        return None
    m = e.args[0].owner
    if isinstance(m, TracedModule) or (cls is not None and type(m) is not cls):
        return None
    return m


def _unwrap(fn):
    while hasattr(fn, "__wrapped__"):
        fn = fn.__wrapped__
    return fn


def is_function(e, fn):
    """Whether ``e`` calls ``fn`` (or what the traceable wrapper ``fn`` wraps)."""
    return isinstance(e, CallFunction) and (e.func is fn or _unwrap(e.func) is _unwrap(fn))


def bound_args(e):
    """A CallFunction's arguments by parameter name, defaults filled in
    (None when they do not bind)."""
    try:
        b = inspect.signature(_unwrap(e.func)).bind(*e.args, **e.kwargs)
    except (TypeError, ValueError):
        return None
    b.apply_defaults()
    return dict(b.arguments)


def sole_user(node):
    """The one expr that reads ``node``, when nothing else does: not another
    expr, not the graph's result, not a watch or end point; else None."""
    if len(node.users) != 1 or id(node) in node.graph._kept_ids():
        return None
    return node.users[0]


def attr_value(node):
    """The object a GetAttr node reads from its graph's owner (None when
    ``node`` is not such a read)."""
    from mgtrace.traced_module.codegen import member
    e = node.expr
    if not isinstance(e, GetAttr) or e.args[0] is not node.graph._inputs[0]:
        return None
    obj = node.graph.owner
    try:
        for p in e.name.split("."):
            obj = member(obj, p)
    except AttributeError:
        return None
    return obj


def const_value(v):
    """The value of a constant operand, else None: a Python int or float, a
    tensor held by a Constant expr, or a tensor attribute (parameter or
    buffer) read by GetAttr (constants for inference: an optimized module's
    weights are not expected to change)."""
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return v
    if isinstance(v, TensorNode):
        if isinstance(v.expr, Constant) and isinstance(v.expr.value, Tensor):
            return v.expr.value
        t = attr_value(v)
        if isinstance(t, Tensor):
            return t
    return None


def call_counts(tm):
    """``{id(module): number of call exprs}`` over every graph of ``tm``: a
    pass may rewrite a module's weights only when one call uses it."""
    counts = {}
    for g in graphs_of(tm):
        for e in g._exprs:
            if isinstance(e, CallMethod) and e.method == "__call__" and isinstance(e.args[0], ModuleNode):
                k = id(e.args[0].owner)
                counts[k] = counts.get(k, 0) + 1
    return counts


def insert_constant(graph, before, value, name):
    """A new Constant expr holding ``value`` right before expr ``before``;
    returns its TensorNode."""
    c = Constant(value, name)
    node = TensorNode(name=name, shape=tuple(value.shape), dtype=np.dtype(value.dtype.name))
    graph._add_node(node, name)
    node.expr = c
    c.outputs = [node]
    graph._append(c, at=graph._exprs.index(before))
    return node


def float_node(n):
    """Whether ``n`` is a TensorNode of a floating dtype."""
    return isinstance(n, TensorNode) and n.dtype is not None and np.dtype(n.dtype).kind == "f" \
        or (isinstance(n, TensorNode) and getattr(n.dtype, "name", "") == "bfloat16")
