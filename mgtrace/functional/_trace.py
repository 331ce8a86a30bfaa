"""The point where the module tracer meets the functional API.

Every public function of :mod:`mgtrace.functional` is wrapped once, when
the package is imported, by :func:`traceable`. Eagerly the wrapper only
checks one module global and calls the function. While
:func:`mgtrace.trace_module` runs, it hands the call to the tracer's
``function_hook(wrapper, fn, args, kwargs)``, which records one
``CallFunction`` expr and runs ``fn`` itself. Wrapping happens here,
below the tracer, so code that did ``from mgtrace.functional import relu``
is traced too (no monkey-patching of other modules' globals).
"""
import functools

# set by mgtrace.traced_module while it traces
function_hook = None

_WRAPPED = {}   # id(fn) -> wrapper, so a function re-exported elsewhere wraps once


def traceable(fn):
    """``fn`` wrapped so that the module tracer records calls to it.

    The wrapper has fn's name, docstring and signature (``__wrapped__`` is
    fn). Wrapping twice returns the first wrapper.
    """
    if getattr(fn, "__mgtrace_traceable__", False):
        return fn
    w = _WRAPPED.get(id(fn))
    if w is not None:
        return w

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        hook = function_hook
        if hook is None:
            return fn(*args, **kwargs)
        return hook(wrapper, fn, args, kwargs)

    wrapper.__mgtrace_traceable__ = True
    _WRAPPED[id(fn)] = wrapper
    return wrapper


def wrap_public(module):
    """Replace each public function of ``module`` (its ``__all__``) by its
    traceable wrapper."""
    for name in module.__all__:
        obj = getattr(module, name)
        if callable(obj) and not isinstance(obj, type):
            setattr(module, name, traceable(obj))
