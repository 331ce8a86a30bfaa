"""Every function added for issue 36 is recorded by the tracer as one
CallFunction of its stable name, keeps the batch axis symbolic (traced at
batch 1, run at batch 4), and survives save/load (format 1.2)."""
import io

import numpy as np
import pytest

import mgtrace as mt
import mgtrace.functional as F
import mgtrace.module as M
from _models import ISSUE36_FUNCTIONS

# name: (shapes of the inputs after the batch axis, the call on them): the calls the 1.2
# golden archives are made of too (schema/golden/1.2/make_golden.py)
CALLS = ISSUE36_FUNCTIONS


class Call(M.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *xs):
        return self.fn(*xs)


def _flat(v):
    if isinstance(v, (tuple, list)):
        return [a for x in v for a in _flat(x)]
    return [v.numpy()]


@pytest.mark.filterwarnings("ignore:Call. attribute 'fn' is not saved")
@pytest.mark.parametrize("name", sorted(CALLS))
def test_traced_as_one_call_symbolic_batch_and_saved(name):
    shapes, fn = CALLS[name]
    rng = np.random.default_rng(len(name))

    def inputs(batch):
        return [mt.tensor(rng.standard_normal((batch,) + s).astype(np.float32)) for s in shapes]

    tm = mt.trace_module(Call(fn), *inputs(1))
    called = [e for e in tm.graph.exprs() if type(e).__name__ == "CallFunction"]
    assert any(getattr(e.func, "__name__", "") == name for e in called), tm.graph
    buf = io.BytesIO()
    mt.save(tm, buf)
    loaded = mt.load(io.BytesIO(buf.getvalue()))
    xs = inputs(4)
    want = _flat(fn(*xs))
    for m in (tm, loaded):
        got = _flat(m(*xs))
        assert [g.shape for g in got] == [w.shape for w in want]
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


def test_every_new_function_is_covered():
    new = {"sinh", "cosh", "asinh", "acosh", "atanh", "logaddexp", "left_shift", "right_shift",
           "cross", "diag", "meshgrid", "roll", "swapaxes", "cond_take", "non_zero", "hswish",
           "hsigmoid", "prelu", "logsigmoid", "logsumexp", "logsoftmax", "indexing_one_hot",
           "pixel_shuffle", "instance_norm", "general_norm", "local_response_norm",
           "sync_batch_norm", "einsum", "conv3d", "conv_transpose3d", "local_conv2d",
           "sliding_window", "sliding_window_transpose", "warp_affine", "remap",
           "multi_head_attention", "deformable_conv2d", "region_restricted_conv", "svd",
           "deformable_psroi_pooling"}
    assert set(CALLS) == new


@pytest.mark.filterwarnings("ignore:Call. attribute 'fn' is not saved")
def test_archives_using_them_need_a_1_2_reader():
    from mgtrace.serialization.layout import PREFIX
    import msgpack
    x = mt.tensor(np.ones((1, 3), np.float32))
    tm = mt.trace_module(Call(lambda x: F.logsumexp(x, 1)), x)
    buf = io.BytesIO()
    mt.save(tm, buf)
    data = buf.getvalue()
    _, hlen = PREFIX.unpack(data[:PREFIX.size])
    header = msgpack.unpackb(data[PREFIX.size:PREFIX.size + hlen], raw=False)
    assert header["min_reader_version"] == [1, 2]
    with pytest.raises(ValueError, match="'mgtrace.functional.logsumexp' is new since format 1.1"):
        mt.save(tm, io.BytesIO(), target_version=(1, 1))
    net = M.Sequential(M.PReLU(3))
    with pytest.raises(ValueError, match="'mgtrace.module.PReLU' is new since format 1.1"):
        mt.save(net, io.BytesIO(), target_version=(1, 1))
