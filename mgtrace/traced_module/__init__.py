"""mgtrace.traced_module: trace modules into hierarchical graphs, edit, run.

Layers, one concept per module, each importing only those above it in this
list (``tests/traced_module/test_import_graph.py`` checks it, and that no
module-level import closes a cycle): ``errors`` (GraphError, TraceError,
TraceWarning, PassError), ``pytree`` (argument structures), ``node`` (the
IR's values), ``signature`` (forward signatures and argument binding),
``expr`` (the IR's statements), ``graph`` (InternalGraph: queries, edits,
lint), ``codegen`` (Python source for a graph), ``checker`` (the
end-of-trace check against eager and the module state trace_module puts
back), ``symbolic`` (SymInt, and the state of the running trace),
``tracer`` (the hooks that record a real run), ``traced_module``
(TracedModule, trace_module, flatten), ``edit`` (the recorder
``graph.insert_exprs`` runs under), ``folder`` (``to_folder``: a
traced module as a Python package), ``passes`` (optimize,
replace_pattern). Three imports stay inside functions, each where a layer
calls back into one below it: ``graph`` -> ``edit`` (an edit block runs a
Tracer, which builds graphs), ``codegen`` -> ``traced_module`` (the
module classes whose members generated code must not shadow) and
``traced_module`` -> ``folder`` (``TracedModule.to_folder``).

DESIGN.md, "Tracing and the graph", has the semantics; they follow
MegEngine's TracedModule.
"""
import sys

from mgtrace.functional._trace import traceable as _traceable
from mgtrace.traced_module.checker import disable_default_checker, enable_expr_checker
from mgtrace.traced_module.errors import (GraphError, InferenceOnlyError, PassError,
                                          PassOrderError, TraceCheckError, TraceError,
                                          TraceWarning)
from mgtrace.traced_module.expr import (Apply, CallFunction, CallMethod, Constant, Expr,
                                        GetAttr, Input)
from mgtrace.traced_module.graph import ExprFilter, InternalGraph, NodeFilter
from mgtrace.traced_module.node import ModuleNode, Node, TensorNode, ValueNode
from mgtrace.traced_module.pytree import (TreeDef, register_supported_type, tree_flatten,
                                          tree_map)
from mgtrace.traced_module.symbolic import SymInt
from mgtrace.traced_module.traced_module import TracedModule, trace_module
from mgtrace.traced_module.passes import (Match, OptimizeReport, PassResult, optimize,
                                          register_pass, registered_passes, replace_pattern)

__all__ = ["trace_module", "TracedModule", "wrap", "InternalGraph", "GraphError", "Node",
           "TensorNode", "ModuleNode", "ValueNode", "Expr", "Input", "GetAttr", "CallMethod",
           "CallFunction", "Constant", "Apply", "NodeFilter", "ExprFilter", "TreeDef",
           "tree_flatten", "tree_map", "register_supported_type", "SymInt", "TraceError",
           "TraceWarning", "TraceCheckError", "enable_expr_checker", "disable_default_checker",
           "optimize", "register_pass", "registered_passes", "replace_pattern", "Match",
           "PassResult", "OptimizeReport", "PassError", "PassOrderError", "InferenceOnlyError"]


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
