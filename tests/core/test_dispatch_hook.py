"""The module-tracing switch: while on, every op reaches the hook."""
import numpy as np
import pytest

import mgtrace as mt
from mgtrace._core import dispatch


class RecordingHook:
    def __init__(self):
        self.calls = []

    def __call__(self, op, *inputs):
        self.calls.append((op.name, op.params, inputs))
        assert not dispatch.is_tracing_module()   # ops run untraced inside the hook
        return mt.apply(op, *inputs)


@pytest.fixture
def hook():
    h = RecordingHook()
    dispatch.set_module_trace_hook(h)
    dispatch.set_module_tracing(True)
    try:
        yield h
    finally:
        dispatch.set_module_tracing(False)
        dispatch.set_module_trace_hook(None)


def test_every_op_reaches_the_hook(hook):
    x = mt.tensor([1.0, -2.0, 3.0])
    y = mt.tensor([[1.0], [2.0]])
    out = abs(-(x + 1) * y)
    z = out[0, 1:]
    m = (out @ mt.tensor([1.0, 1.0, 1.0]))
    names = [c[0] for c in hook.calls]
    assert names == ["add", "neg", "mul", "abs", "getitem", "matmul"]
    assert hook.calls[0][2][0] is x and hook.calls[0][2][1] == 1
    dispatch.set_module_tracing(False)
    np.testing.assert_allclose(out.numpy(), np.abs(-(x.numpy() + 1) * y.numpy()))
    np.testing.assert_allclose(z.numpy(), out.numpy()[0, 1:])
    np.testing.assert_allclose(m.numpy(), out.numpy().sum(1))


def test_astype_and_params_reach_the_hook(hook):
    x = mt.tensor([1.5, 2.5])
    x.astype("int32")
    assert hook.calls[-1][0] == "astype" and hook.calls[-1][1] == {"dtype": "int32"}


def test_no_calls_when_off():
    h = RecordingHook()
    dispatch.set_module_trace_hook(h)
    try:
        mt.tensor([1.0]) + 1
    finally:
        dispatch.set_module_trace_hook(None)
    assert h.calls == []


def test_enabling_without_hook_is_an_error():
    dispatch.set_module_trace_hook(None)
    with pytest.raises(RuntimeError, match="hook"):
        dispatch.set_module_tracing(True)
    with pytest.raises(TypeError):
        dispatch.set_module_trace_hook(42)


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
    dispatch.set_module_tracing(False)
    assert y.shape == (2, 3, 2) and x[0].item() == 5.0
    want = np.arange(6.0)
    want[0] = 5.0      # y views x's memory
    np.testing.assert_array_equal(y.numpy()[0], want.reshape(2, 3).T)
