"""The point where the module tracer meets the functional API.

Every public function of :mod:`mgtrace.functional` is wrapped once, when
the package is imported, by :func:`traceable`. Eagerly the wrapper only
checks one global (:data:`mgtrace._core.trace_hooks.active`) and calls the
function (also while another thread traces: a hook is its thread's). While :func:`mgtrace.trace_module` runs, it hands the call to the
tracer's ``on_function(wrapper, fn, args, kwargs)``, which records one
``CallFunction`` expr and runs ``fn`` itself. Wrapping happens here,
below the tracer, so code that did ``from mgtrace.functional import relu``
is traced too (no monkey-patching of other modules' globals).

It is also where a function declares that it writes into its arguments
(:func:`mutates`): graph passes ask :func:`mutated_arguments` instead of
guessing from names, so ``graph.compile()`` never drops a call whose effect
is on its arguments (``F.batch_norm(..., training=True)`` updating the
running statistics).
"""
import functools
import inspect

from mgtrace._core import trace_hooks as _hooks

_get_ident = _hooks.get_ident

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
        hook = _hooks.active
        if hook is None or _hooks.owner != _get_ident():     # another thread's trace is not ours
            return fn(*args, **kwargs)
        return hook.on_function(wrapper, fn, args, kwargs)

    wrapper.__mgtrace_traceable__ = True
    _WRAPPED[id(fn)] = wrapper
    return wrapper


def mutates(*params, when=None):
    """Declare that the decorated function writes into its arguments named
    ``params``; ``when(arguments)`` (the bound arguments by name, defaults
    filled in) says whether a given call does (default: always).

    >>> @mutates("acc")
    ... def accumulate(acc, x):
    ...     acc[...] = acc + x
    >>> mutated_arguments(accumulate, (1, 2), {})
    ('acc',)
    """
    def deco(fn):
        fn.__mgtrace_mutates__ = (tuple(params), when)
        return fn
    return deco


def mutated_arguments(fn, args, kwargs):
    """The names of the parameters a call ``fn(*args, **kwargs)`` writes
    into, as declared with :func:`mutates` (``()`` for a function that
    declares nothing or arguments that do not bind)."""
    decl = getattr(fn, "__mgtrace_mutates__", None)
    if decl is None:
        return ()
    params, when = decl
    try:
        bound = inspect.signature(fn).bind(*args, **kwargs)
    except (TypeError, ValueError):
        return params          # cannot tell: assume the worst
    bound.apply_defaults()
    named = bound.arguments
    if when is not None and not when(named):
        return ()
    return tuple(p for p in params if named.get(p) is not None)


def wrap_public(module):
    """Replace each public function of ``module`` (its ``__all__``) by its
    traceable wrapper."""
    for name in module.__all__:
        obj = getattr(module, name)
        if callable(obj) and not isinstance(obj, type):
            setattr(module, name, traceable(obj))
