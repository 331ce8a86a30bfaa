"""mgtrace.traced_module: trace modules into hierarchical graphs, edit, run.

Layers, one concept per module: ``pytree`` (argument structures),
``node`` and ``expr`` (the IR), ``graph`` (InternalGraph: queries, edits,
lint), ``tracer`` (the hooks that record a real run), ``codegen`` (Python
source for a graph), ``checker`` (the end-of-trace check against eager and
the module state trace_module puts back), ``traced_module`` (TracedModule,
trace_module, flatten). DESIGN.md, "Tracing and the graph", has the semantics; they
follow MegEngine's TracedModule.
"""
import sys

from mgtrace.functional._trace import traceable as _traceable
from mgtrace.traced_module.checker import (TraceCheckError, disable_default_checker,
                                           enable_expr_checker)
from mgtrace.traced_module.expr import (Apply, CallFunction, CallMethod, Constant, Expr,
                                        GetAttr, Input)
from mgtrace.traced_module.graph import ExprFilter, GraphError, InternalGraph, NodeFilter
from mgtrace.traced_module.node import ModuleNode, Node, TensorNode, ValueNode
from mgtrace.traced_module.pytree import (TreeDef, register_supported_type, tree_flatten,
                                          tree_map)
from mgtrace.traced_module.tracer import SymInt, TraceError, TraceWarning
from mgtrace.traced_module.traced_module import TracedModule, trace_module
from mgtrace.traced_module.passes import (Match, optimize, register_pass, registered_passes,
                                          replace_pattern)

__all__ = ["trace_module", "TracedModule", "wrap", "InternalGraph", "GraphError", "Node",
           "TensorNode", "ModuleNode", "ValueNode", "Expr", "Input", "GetAttr", "CallMethod",
           "CallFunction", "Constant", "Apply", "NodeFilter", "ExprFilter", "TreeDef",
           "tree_flatten", "tree_map", "register_supported_type", "SymInt", "TraceError",
           "TraceWarning", "TraceCheckError", "enable_expr_checker", "disable_default_checker",
           "optimize", "register_pass", "registered_passes", "replace_pattern", "Match"]


def wrap(fn):
    """Make calls of the user function ``fn`` one CallFunction expr in
    traces (its body is not traced). Use as a decorator, or call
    ``wrap(fn)`` at the top level of the module that defines ``fn`` (that
    module's global ``fn`` is replaced by the wrapper).

    >>> import mgtrace.traced_module as tmod
    >>> @tmod.wrap
    ... def scale(x, k):
    ...     return x * k
    """
    if not callable(fn):
        raise TypeError(f"wrap takes a function, not {type(fn).__name__}")
    w = _traceable(fn)
    caller = sys._getframe(1).f_globals
    name = getattr(fn, "__name__", None)
    if name and caller.get(name) is fn:
        caller[name] = w
    return w
