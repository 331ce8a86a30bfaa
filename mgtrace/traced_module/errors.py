"""The exceptions and the warning of mgtrace.traced_module, in one place so
that every layer (expr, graph, tracer, checker, passes) raises them without
importing another layer for its error class.

Each class subclasses :class:`mgtrace.errors.Error` and the matching builtin
(STYLE.md item 6): ``except ValueError`` catches a GraphError, ``except
RuntimeError`` a TraceError.
"""
from mgtrace.errors import Error

__all__ = ["GraphError", "TraceError", "TraceCheckError", "TraceWarning", "PassError",
           "PassOrderError", "InferenceOnlyError"]


class GraphError(Error, ValueError):
    """A graph is malformed, or an edit would make it so."""


class TraceError(Error, RuntimeError):
    """Tracing failed; the message names the module path and source line."""


class TraceCheckError(TraceError):
    """The TracedModule that trace_module made does not reproduce the eager
    run: the message names the first differing output (or expr, with the
    expr checker), its source line, and the size of the difference."""


class TraceWarning(UserWarning):
    """The trace fixed something that may vary between runs (a branch on a
    tensor's value, a captured constant)."""


class PassError(Error, RuntimeError):
    """A pass run by :func:`~mgtrace.traced_module.optimize` raised: the
    message names the pass, :attr:`pass_name` holds it, and the pass's own
    exception is ``__cause__``."""

    def __init__(self, message, pass_name=None):
        super().__init__(message)
        self.pass_name = pass_name


class PassOrderError(Error, ValueError):
    """The passes asked for cannot be ordered: one requires a pass that is
    not registered, or their ``after``/``requires`` constraints form a cycle
    (the message names the passes of the cycle)."""


class InferenceOnlyError(Error, RuntimeError):
    """A TracedModule that :func:`~mgtrace.traced_module.optimize` made for
    inference from one in eval mode (BatchNorms folded into convs, Dropout
    dropped) was put in training mode: it would go on computing the eval-mode
    function. The message names each pass and what it removed."""
