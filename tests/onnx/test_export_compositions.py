"""The compositions of core ops without a one-node ONNX form, beyond the one
case per mapping row: every interpolate mode, shifts of every integer
width, setitem with each index kind, run in ONNX Runtime at shapes other
than the traced ones against mgtrace (NumPy for the shifts)."""
import io

import numpy as np
import pytest

pytest.importorskip("onnx", reason="needs onnx (pip install 'mgtrace[onnx]')")
pytest.importorskip("onnxruntime", reason="needs onnxruntime (pip install 'mgtrace[onnx]')")

import mgtrace as mt  # noqa: E402
import mgtrace.functional as F  # noqa: E402
import mgtrace.module as M  # noqa: E402
import mgtrace.onnx as mo  # noqa: E402
from mgtrace.onnx.exporter import compare, run_ort  # noqa: E402


class _Fn(M.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *xs):
        return self.fn(*xs)


def _check(fn, traced, run, opset=None):
    mod = fn if isinstance(fn, M.Module) else _Fn(fn)
    tm = mt.trace_module(mod, *[mt.tensor(x) for x in traced])
    model = mo.export(tm, io.BytesIO(), opset=opset)
    got = run_ort(model, run)
    want = tm(*[mt.tensor(x) for x in run])
    want = want if isinstance(want, (tuple, list)) else [want]
    for g, w in zip(got, want):
        assert g.dtype == w.numpy().dtype
        msg = compare(g, w.numpy())
        assert msg is None, msg
    return got


_rng = np.random.default_rng(41)


@pytest.mark.parametrize("opset", [13, None])
@pytest.mark.parametrize("mode,align", [("nearest", None), ("bilinear", None),
                                        ("bilinear", False), ("bilinear", True)])
@pytest.mark.parametrize("how", ["size", "scale"])
def test_interpolate_every_mode_at_another_size(mode, align, how, opset):
    kw = dict(size=(7, 5)) if how == "size" else dict(scale_factor=(2.0, 1.5))
    traced = [_rng.standard_normal((1, 2, 4, 6)).astype(np.float32)]
    run = [_rng.standard_normal((3, 2, 5, 9)).astype(np.float32)]
    (y,) = _check(lambda x: F.interpolate(x, mode=mode, align_corners=align, **kw), traced, run,
                  opset)
    assert y.shape == ((3, 2, 7, 5) if how == "size" else (3, 2, 10, 13))


@pytest.mark.parametrize("dtype", ["int8", "uint8", "int16", "int32", "int64"])
def test_shifts_of_every_width_match_numpy(dtype):
    info = np.iinfo(dtype)
    bits = info.bits
    x = np.array([info.min, info.max, -1 if info.min else 1, 5, 0, 3, info.max // 3, 1],
                 dtype)
    y = np.array([1, 1, bits - 1, 2, 3, bits + 2, 4, bits], dtype)
    left, right = _check(lambda a, b: (F.left_shift(a, b), F.right_shift(a, b)), [x, y], [x, y])
    # NumPy with shifts of the width or more defined as mgtrace's: 0, or -1 for x < 0 right
    wide = x.astype(object)
    want_l = np.array([0 if s >= bits else int(v) << int(s) for v, s in zip(wide, y)], object)
    want_l = ((want_l - info.min) % (1 << bits) + info.min).astype(dtype)
    want_r = np.array([(-1 if v < 0 else 0) if s >= bits else int(v) >> int(s)
                       for v, s in zip(wide, y)]).astype(dtype)
    np.testing.assert_array_equal(left, want_l)
    np.testing.assert_array_equal(right, want_r)


def test_setitem_each_index_kind_at_another_batch():
    def fn(x, v, i):
        y = x * 1.0
        y[:, 1] = 0.5                   # an int and a number
        y[..., 1::2] = v                # a strided slice and a broadcast tensor
        y[i] = -1.0                     # an integer tensor index
        y[-1, :2, x.shape[2] - 1] = 9   # an index read from a shape
        return y
    traced = [_rng.standard_normal((4, 3, 6)).astype(np.float32),
              _rng.standard_normal((1, 3)).astype(np.float32), np.array([0, 2], np.int32)]
    run = [_rng.standard_normal((5, 3, 8)).astype(np.float32),
           _rng.standard_normal((1, 4)).astype(np.float32), np.array([1, 3], np.int32)]
    _check(fn, traced, run)


def test_cumprod_and_nonzero_at_another_size():
    traced = [_rng.integers(-3, 4, (2, 5)).astype(np.int32)]
    run = [_rng.integers(-3, 4, (3, 7)).astype(np.int32)]
    got = _check(lambda x: (F.cumprod(x, 1) if hasattr(F, "cumprod") else
                            mt.apply(mt.OpDef("cumprod", {"axis": 1}), x), F.non_zero(x)),
                 traced, run)
    np.testing.assert_array_equal(got[0], np.cumprod(run[0], 1))
    np.testing.assert_array_equal(got[1], np.argwhere(run[0]))


@pytest.mark.parametrize("opset", [13, None])
def test_lstm_and_rnn_at_another_length_and_batch(opset):
    class Net(M.Module):
        def __init__(self):
            super().__init__()
            self.lstm = M.LSTM(4, 6, num_layers=2, bidirectional=True)
            self.rnn = M.RNN(12, 3, nonlinearity="tanh", batch_first=True)

        def forward(self, x):
            y, (h, c) = self.lstm(x)
            z, hr = self.rnn(y.transpose(1, 0, 2))
            return y, h, c, z, hr
    net = Net().eval()
    state = {k: _rng.standard_normal(v.shape).astype(np.float32) * 0.4
             for k, v in net.state_dict().items()}
    net.load_state_dict(state)
    traced = [_rng.standard_normal((3, 2, 4)).astype(np.float32)]
    run = [_rng.standard_normal((7, 5, 4)).astype(np.float32)]       # T 3 -> 7, N 2 -> 5
    got = _check(net, traced, run, opset)
    assert got[0].shape == (7, 5, 12) and got[1].shape == (4, 5, 6) and got[4].shape == (1, 5, 3)
