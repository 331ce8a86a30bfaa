"""The module-tracing switch: while on, every op reaches the hook."""
import numpy as np
import pytest

import mgtrace as mt
import mgtrace.functional as F
import mgtrace.module as M
from mgtrace._core import dispatch, trace_hooks


class RecordingHook(trace_hooks.TraceHook):
    def __init__(self):
        self.calls = []

    def on_apply(self, op, *inputs):
        self.calls.append((op.name, op.params, inputs))
        assert not dispatch.is_tracing_module()   # ops run untraced inside the hook
        return mt.apply(op, *inputs)


@pytest.fixture
def hook():
    h = RecordingHook()
    with trace_hooks.installed(h):
        yield h


def test_every_op_reaches_the_hook(hook):
    x = mt.tensor([1.0, -2.0, 3.0])
    y = mt.tensor([[1.0], [2.0]])
    out = abs(-(x + 1) * y)
    z = out[0, 1:]
    m = (out @ mt.tensor([1.0, 1.0, 1.0]))
    names = [c[0] for c in hook.calls]
    assert names == ["add", "neg", "mul", "abs", "getitem", "matmul"]
    assert hook.calls[0][2][0] is x and hook.calls[0][2][1] == 1
    with trace_hooks.installed(None):
        np.testing.assert_allclose(out.numpy(), np.abs(-(x.numpy() + 1) * y.numpy()))
        np.testing.assert_allclose(z.numpy(), out.numpy()[0, 1:])
        np.testing.assert_allclose(m.numpy(), out.numpy().sum(1))


def test_astype_and_params_reach_the_hook(hook):
    x = mt.tensor([1.5, 2.5])
    x.astype("int32")
    assert hook.calls[-1][0] == "astype" and hook.calls[-1][1] == {"dtype": "int32"}


def test_no_calls_when_off():
    h = RecordingHook()
    with trace_hooks.installed(h, tracing=False):
        mt.tensor([1.0]) + 1
        mt.tensor([1.0]).sum()
    assert h.calls == []


def test_enabling_without_hook_is_an_error():
    with pytest.raises(RuntimeError, match="hook"):
        with trace_hooks.installed(None, tracing=True):
            pass
    assert not dispatch.is_tracing_module() and trace_hooks.active is None
    with pytest.raises(TypeError, match="TraceHook"):
        trace_hooks.installed(42)
    with pytest.raises(TypeError, match="TraceHook"):
        trace_hooks.installed(lambda op, *inputs: None)   # the old callable form


def test_installed_restores_what_was_there_however_the_block_ends():
    outer, inner = RecordingHook(), RecordingHook()
    with trace_hooks.installed(outer):
        with pytest.raises(ZeroDivisionError):
            with trace_hooks.installed(inner):
                mt.tensor([1.0]) + 1
                1 / 0
        assert trace_hooks.active is outer and dispatch.is_tracing_module()
        with trace_hooks.installed(None):
            assert trace_hooks.active is None and not dispatch.is_tracing_module()
            mt.tensor([2.0]) * 3
        with trace_hooks.installed(outer, tracing=False):    # functions and modules only
            assert trace_hooks.active is outer and not dispatch.is_tracing_module()
        mt.tensor([1.0]) - 1
    assert trace_hooks.active is None and not dispatch.is_tracing_module()
    assert [c[0] for c in inner.calls] == ["add"] and [c[0] for c in outer.calls] == ["sub"]


def test_one_hook_object_sees_functions_modules_and_tensor_events():
    events = []

    class Hook(trace_hooks.TraceHook):
        def on_function(self, wrapper, fn, args, kwargs):
            events.append(("function", fn.__name__))
            with trace_hooks.installed(None):
                return fn(*args, **kwargs)

        def on_module_call(self, module, args, kwargs):
            events.append(("module", type(module).__name__))
            return super().on_module_call(module, args, kwargs)

        def on_apply(self, op, *inputs):
            events.append(("op", op.name))
            return super().on_apply(op, *inputs)

        def on_shape(self, t):
            events.append(("shape",))
            return super().on_shape(t)

        def on_bool(self, t):
            events.append(("bool",))

    x = mt.tensor(np.array([[1.0, -2.0]], np.float32))
    with trace_hooks.installed(Hook()):
        y = M.ReLU()(F.abs(x)).sum(axis=1)
        n = x.shape[1]
        flag = bool(y)
    # ReLU's forward runs hooked (the default on_module_call), so its F.relu is seen;
    # bool(y) reads the value with item(), which reads y.shape once more
    assert events == [("function", "abs"), ("module", "ReLU"), ("function", "relu"),
                      ("op", "sum"), ("shape",), ("bool",), ("shape",)]
    assert n == 2 and flag and y.tolist() == [3.0]
    assert bool(mt.tensor([1.0])) and len(events) == 7     # no hook: nobody is told


def test_apply_runs_op_defs():
    out = mt.apply(mt.OpDef("add"), mt.tensor([1, 2]), 3)
    assert out.tolist() == [4, 5]
    assert mt.OpDef("add") == mt.OpDef("add") and "add" in repr(mt.OpDef("add"))
    with pytest.raises(NotImplementedError, match="no op named"):
        mt.apply(mt.OpDef("frobnicate"), mt.tensor([1]))
    with pytest.raises(TypeError):
        mt.apply("add", 1, 2)


def test_views_and_setitem_reach_the_hook(hook):
    x = mt.tensor(np.arange(6.0))
    y = x.reshape(2, 3).transpose(1, 0).expand_dims(0).squeeze(0).broadcast_to((2, 3, 2))
    x[0] = 5.0
    names = [c[0] for c in hook.calls]
    assert names == ["reshape", "transpose", "expand_dims", "squeeze", "broadcast_to", "setitem"]
    assert hook.calls[0][1] == {"shape": (2, 3)}
    with trace_hooks.installed(None):
        assert y.shape == (2, 3, 2) and x[0].item() == 5.0
        want = np.arange(6.0)
        want[0] = 5.0      # y views x's memory
        np.testing.assert_array_equal(y.numpy()[0], want.reshape(2, 3).T)
