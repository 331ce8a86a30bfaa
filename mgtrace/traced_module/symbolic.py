"""Symbolic numbers, and the state of the trace they record into.

While :func:`~mgtrace.traced_module.trace_module` runs, an int read from a
tensor's shape is a :class:`SymInt`: its arithmetic is recorded in the graph
being built (through the running Tracer, :data:`state`), so shapes computed
from it stay right at other input shapes; uses the trace cannot follow
(comparisons, ``int()``, ``range(n)``) warn with TraceWarning and keep this
run's value. ``builtins.range`` is patched while a trace runs
(:func:`warning_range`) because ``range(n)`` reads an int subclass without
asking it.

The Tracer (``tracer.py``) sets :data:`state`; this module imports no other
layer of the tracer, so the IR and the graph can use SymInt freely.
"""
import builtins
import contextlib
import math
import operator
import sys
import warnings

import numpy as np

from mgtrace._core import Tensor, op_table
from mgtrace.traced_module.errors import TraceWarning
from mgtrace.traced_module.expr import is_user_file, user_frame

__all__ = ["SymInt", "SymFloat", "state", "active_tracer", "NUMBER_TYPES", "plain",
           "warning_range", "warn_traced"]


class _TraceState:
    """What is running: ``tracer``, the Tracer while a trace or an
    insert_exprs block runs (else None); ``quiet``, True while the tracer's
    own bookkeeping runs (``core_off``), which is neither recorded nor
    warned about."""
    __slots__ = ("tracer", "quiet")

    def __init__(self):
        self.tracer = None
        self.quiet = False


state = _TraceState()


def active_tracer():
    """The Tracer of the running trace or insert_exprs block, or None."""
    return state.tracer


def warn_traced(message):
    """Warn with TraceWarning, attributed to the user's line being traced."""
    _, level = user_frame()
    warnings.warn(message, TraceWarning, stacklevel=level)


def plain(v):
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
        t = state.tracer
        if t is None or state.quiet or type(other) not in NUMBER_TYPES:
            if t is not None and not state.quiet and op is operator.mul and \
                    isinstance(other, (list, tuple, str, bytes)):
                _warn_fixed(f"repeating a {type(other).__name__} ({type(other).__name__} * n)",
                            self, sys._getframe(1))
            return op(plain(a) if a is self else a, plain(b) if b is self else b)
        return t.record_function(op, (a, b), {}, ints_out=True)
    return method


def _sym_unary(op):
    def method(self):
        t = state.tracer
        if t is None or state.quiet:
            return op(plain(self))
        return t.record_function(op, (self,), {}, ints_out=True)
    return method


def _warn_fixed(what, value, caller):
    """Warn (once per line) that ``what`` fixes shape-derived ``value`` in
    the graph, when ``caller`` (the frame that used it) is user code:
    checks in mgtrace's own code (argument validation) are not the user's
    to fix."""
    t = state.tracer
    if t is not None and not state.quiet and is_user_file(caller.f_code.co_filename):
        t.warn_once(f"{what} of a shape-derived number ({plain(value)!r}) while tracing "
                          f"{t.frame.graph.qualname}: the traced graph keeps this run's "
                          "result (a branch stays taken, a check is not re-run, a count or "
                          "size stays fixed at other input shapes)")


def _sym_fixed(what, convert):
    """A use the trace cannot follow: warn, then give the plain value."""
    def method(self, *args):
        _warn_fixed(what, self, sys._getframe(1))
        return convert(plain(self), *args)
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
        return str(plain(self))

    def __format__(self, spec):
        return format(plain(self), spec)
    # the trace keeps what these gave this time (comparisons: _sym_operators)
    __bool__ = _sym_fixed("a branch on (bool())", bool)
    __int__ = _sym_fixed("int()", int)
    __float__ = _sym_fixed("float() (math functions, NumPy)", float)
    __round__ = _sym_fixed("round()", round)
    __divmod__ = _sym_fixed("divmod()", divmod)

    def __hash__(self):
        return hash(plain(self))


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
        return f"SymInt({plain(self)})"


# bitwise arithmetic on ints (padding to a multiple of 8: (h + 7) & ~7)
_sym_operators(SymInt, ("bitwise",))


class SymFloat(_SymNumber, float):
    """A float computed from shapes while tracing (e.g. ``h / w``); like
    SymInt, its arithmetic is recorded."""

    def __repr__(self):
        return f"SymFloat({plain(self)!r})"


NUMBER_TYPES = (int, float, SymInt, SymFloat)

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
def warning_range():
    """``with warning_range():`` builtins.range warns for a SymInt argument."""
    builtins.range = _TracingRange
    try:
        yield
    finally:
        builtins.range = _builtin_range
