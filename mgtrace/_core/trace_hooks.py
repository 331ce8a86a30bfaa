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
"""
import threading

from mgtrace._core import dispatch as _dispatch

__all__ = ["TraceHook", "active", "installed"]

active = None     # the installed hook object, or None

# The hook and the switch are the process's, not a thread's: while one
# thread traces (trace_module, a plan recording a new input signature),
# another thread's trace saw its ops and unset its hook (two threads calling
# a plan with new shapes failed with "'NoneType' object has no attribute
# 'buf'"). A thread holds this from its outermost installed() to the end of
# it, so traces and recordings run one at a time; nested blocks re-enter.
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
        global active
        one_trace.acquire()
        try:
            self.saved = active, _dispatch.is_tracing_module()
            _dispatch._install_hook(self.hook, self.tracing)
        except BaseException:
            one_trace.release()
            raise
        active = self.hook
        return self.hook

    def __exit__(self, *exc):
        global active
        active, was = self.saved
        try:
            _dispatch._install_hook(active, was)
        finally:
            one_trace.release()
        return False
