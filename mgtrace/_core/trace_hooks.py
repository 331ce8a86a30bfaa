"""The trace hook: one object told about what a traced run does.

While :func:`mgtrace.trace_module` runs, its tracer is installed here with
:func:`installed` and receives every event below; nothing else is hooked.
The events come from four places, each checking one thing per call when
nobody traces:

- core ops (``on_apply``): dispatch's tracing switch, one C flag per op;
- Tensor (``on_shape``, ``on_bool``, ``on_frozen``, ``on_create``,
  ``on_name``, ``on_method``): the same flag;
- ``mgtrace.functional`` (``on_function``) and ``Module.__call__``
  (``on_module_call``): :data:`active`, one global read per call.

:func:`installed` is the only writer of all of them: it installs a hook
(or None) and sets the switch for a block, and puts back what was there,
however the block ends. ``installed(hook, tracing=False)`` keeps the hook
for functions and modules but runs core ops untraced (the tracer's own
bookkeeping); ``installed(None)`` runs real code with every hook off.

A hook belongs to the thread that installed it (:data:`owner`): while one
thread traces, another thread's ops, functions and module calls run
eagerly, unrecorded, as if nothing were installed (a data-loader thread, a
server's other requests). Readers test ``active is not None and owner ==
get_ident()``, or call :func:`current`.
"""
import threading

from mgtrace._core import dispatch as _dispatch

__all__ = ["TraceHook", "active", "current", "installed", "owner"]

active = None     # the installed hook object, or None
owner = 0         # the id of the thread that installed it (threading.get_ident()), 0 for none
get_ident = threading.get_ident


def current():
    """The hook installed by the calling thread, or None (a hook another
    thread installed is not this thread's)."""
    hook = active
    if hook is None or owner != get_ident():
        return None
    return hook

# There is one hook and one switch in the process, owned by one thread at a
# time: two threads tracing at once (trace_module, a plan recording a new
# input signature) unset each other's hook (two threads calling a plan with
# new shapes failed with "'NoneType' object has no attribute 'buf'"). A
# thread holds this from its outermost installed() to the end of it, so
# traces and recordings run one at a time: a second thread's trace waits
# for the first to end, then makes its own; nested blocks re-enter.
# installed(None) in a thread that owns no hook changes nothing and takes
# no lock (its ops already run eagerly).
one_trace = threading.RLock()


class TraceHook:
    """What a trace hook receives; each default runs the real thing, so a
    hook overrides only what it records. Every event runs with the core's
    tracing switch off (ops inside it are not traced again)."""

    def on_apply(self, op, *inputs):
        """A core op (an :class:`~mgtrace.OpDef`) on ``inputs``; returns its outputs."""
        return _dispatch.apply(op, *inputs)

    def on_function(self, wrapper, fn, args, kwargs):
        """A public ``mgtrace.functional`` function (``wrapper`` is what the
        user called, ``fn`` what it wraps)."""
        return fn(*args, **kwargs)

    def on_module_call(self, module, args, kwargs):
        """``module(*args, **kwargs)``."""
        return module._call_impl(args, kwargs)

    def on_shape(self, t):
        """``t.shape``: returns the shape tuple to hand out."""
        with installed(self, tracing=False):
            return t.shape

    def on_create(self, target, data, dtype, device):
        """``mgtrace.tensor(data, ...)`` (``target`` None: returns the tensor)
        or ``Tensor(data, ...)`` (``target`` the new, still empty Tensor,
        which the hook initialises)."""
        from mgtrace._core.tensor import Tensor, tensor
        with installed(self, tracing=False):
            if target is None:
                return tensor(data, dtype, device)
            Tensor.__init__(target, data, dtype, device)
            return target

    def on_method(self, t, method, args):
        """``t.<method>(*args)`` for a Tensor method that applies no core op
        (``view``; ``copy.copy(t)`` arrives as ``"copy"``); returns its result."""
        with installed(self, tracing=False):
            return getattr(t, method)(*args)

    def on_name(self, t, name):
        """``t.name = name``."""

    def on_bool(self, t):
        """``bool(t)``: a branch on a tensor's value."""

    def on_frozen(self, t, what):
        """A value leaves the graph: ``what`` is ``"t.item()"``, ``"len(t)"``..."""

    def on_random(self, rng):
        """``rng`` (a :class:`mgtrace.random.RNG`) is about to draw: values
        that differ on every call, made from no tensor."""


class installed:
    """``with installed(hook, tracing=None):`` inside the block ``hook`` (a
    :class:`TraceHook`, or None for none) receives the events, and the
    core's ops are traced when ``tracing`` (default: whenever there is a
    hook). The previous hook and switch come back at the end, however the
    block ends. (A class, not a generator: the tracer enters one per
    recorded call.)

    Raises:
        TypeError: ``hook`` is neither None nor a TraceHook.
    """
    __slots__ = ("hook", "tracing", "saved")

    def __init__(self, hook, tracing=None):
        if hook is not None and not isinstance(hook, TraceHook):
            raise TypeError(f"a trace hook is a mgtrace._core.trace_hooks.TraceHook, "
                            f"not {type(hook).__name__}")
        self.hook = hook
        self.tracing = hook is not None if tracing is None else tracing

    def __enter__(self):
        global active, owner
        if self.hook is None and not self.tracing and (active is None or owner != get_ident()):
            self.saved = None           # nothing of this thread's to switch off
            return None
        one_trace.acquire()
        try:
            self.saved = active, owner, _dispatch._tracing_thread()
            _dispatch._install_hook(self.hook, self.tracing)
        except BaseException:
            one_trace.release()
            raise
        # owner before active: another thread that sees the new hook sees its owner
        owner = get_ident() if self.hook is not None else 0
        active = self.hook
        return self.hook

    def __exit__(self, *exc):
        global active, owner
        if self.saved is None:
            return False
        hook, who, switch = self.saved
        try:
            _dispatch._install_hook(hook, switch)
        finally:
            active = hook               # active before owner (see __enter__)
            owner = who
            one_trace.release()
        return False
