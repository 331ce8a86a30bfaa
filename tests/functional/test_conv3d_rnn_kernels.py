"""The dedicated kernels of issue 36: conv3d / conv_transpose3d
(kernels/cpu/conv3d.c, vol2col and GEMM) and the fused LSTM / RNN time
steps (kernels/cpu/rnn_cell.c), against NumPy written here, the core-op
compositions they replace (mgtrace._core.fallbacks), and PyTorch where
installed; their gradients against central finite differences."""
import numpy as np
import pytest

import mgtrace as mt
import mgtrace.functional as F
import mgtrace.module as M
from mgtrace._core import fallbacks, nn as _nn
from mgtrace.autodiff import GradManager

RNG = np.random.default_rng(3636)


def t(a):
    return mt.tensor(np.asarray(a))


def randn(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


def _triple(v):
    return (v,) * 3 if isinstance(v, int) else tuple(v)


def conv3d_ref(x, w, b, stride, padding, dilation, groups):
    """Direct sums over the kernel taps, float64."""
    s, p, d = _triple(stride), _triple(padding), _triple(dilation)
    x = np.pad(x.astype(np.float64), ((0, 0), (0, 0)) + tuple((q, q) for q in p))
    n = x.shape[0]
    o, cg, *k = w.shape
    size = [(x.shape[2 + i] - d[i] * (k[i] - 1) - 1) // s[i] + 1 for i in range(3)]
    out = np.zeros((n, o) + tuple(size))
    og = o // groups
    for g in range(groups):
        xs = x[:, g * cg:(g + 1) * cg]
        for a in range(k[0]):
            for bb in range(k[1]):
                for cc in range(k[2]):
                    patch = xs[:, :, a * d[0]:a * d[0] + (size[0] - 1) * s[0] + 1:s[0],
                               bb * d[1]:bb * d[1] + (size[1] - 1) * s[1] + 1:s[1],
                               cc * d[2]:cc * d[2] + (size[2] - 1) * s[2] + 1:s[2]]
                    out[:, g * og:(g + 1) * og] += np.einsum(
                        "ncdhw,oc->nodhw", patch, w[g * og:(g + 1) * og, :, a, bb, cc])
    return out if b is None else out + b.reshape(1, o, 1, 1, 1)


# (x shape, weight shape, stride, padding, dilation, groups, bias)
CONV3D = [
    ((2, 3, 5, 6, 7), (4, 3, 3, 3, 3), 1, 1, 1, 1, True),
    ((1, 4, 6, 5, 4), (6, 2, 2, 3, 1), (2, 1, 2), (0, 1, 1), (1, 2, 1), 2, False),
    ((2, 2, 7, 4, 4), (2, 2, 3, 1, 2), 3, (2, 0, 1), (2, 1, 1), 1, True),
    ((2, 6, 3, 4, 5), (6, 2, 1, 1, 1), 1, 0, 1, 3, True),         # 1x1x1: x read as its own columns
    ((1, 1, 1, 1, 1), (1, 1, 1, 1, 1), 1, 0, 1, 1, False),
    ((3, 2, 4, 4, 4), (3, 2, 3, 3, 3), 2, 1, 1, 1, True),         # stride 2 with padding: edges
    # stride 1 with >= 8 channels a group: one GEMM per tap over a padded copy
    ((2, 16, 5, 6, 7), (8, 8, 3, 2, 3), 1, (1, 0, 2), (2, 1, 1), 2, True),
    ((1, 8, 3, 3, 3), (4, 8, 3, 3, 3), 1, 0, 1, 1, False),        # one output voxel
    # 32 channels, 2-d slices conv2d runs by Winograd: conv2d per depth tap
    ((1, 32, 7, 16, 16), (32, 32, 2, 3, 3), 1, 1, 1, 1, True),
]


@pytest.fixture(params=["policy", "kernel"])
def conv3d_path(request):
    """conv3d as its policy picks, and every forward through conv3d.c (its
    vol2col too, which the policy leaves to conv2d per tap)."""
    _nn._conv3d_force_kernel(request.param == "kernel")
    yield request.param
    _nn._conv3d_force_kernel(False)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("xs, ws, stride, padding, dilation, groups, bias", CONV3D)
def test_conv3d_kernel_against_numpy_and_the_composition(xs, ws, stride, padding, dilation, groups,
                                                         bias, dtype, conv3d_path):
    x, w = randn(*xs, dtype=dtype), randn(*ws, dtype=dtype)
    b = randn(ws[0], dtype=dtype) if bias else None
    got = _nn.conv3d(t(x), t(w), None if b is None else t(b), stride, padding, dilation, groups)
    want = conv3d_ref(x, w, b, stride, padding, dilation, groups)
    # conv2d's Winograd (the per-tap path) rounds to ~5e-6 of the largest output
    tol = (1e-5 if dtype == np.float32 else 1e-13) * max(10.0, float(np.abs(want).max()))
    assert got.shape == want.shape and got.dtype == dtype
    np.testing.assert_allclose(got.numpy(), want, rtol=tol, atol=tol)
    comp = fallbacks.conv3d(t(x), t(w), None if b is None else t(b), stride, padding, dilation, groups)
    np.testing.assert_allclose(comp.numpy(), want, rtol=tol, atol=tol)


def test_conv3d_picks_conv2d_per_tap_where_conv2d_runs_winograd(monkeypatch):
    calls = []
    composed = fallbacks.conv3d
    monkeypatch.setattr(fallbacks, "conv3d", lambda *a: calls.append(1) or composed(*a))
    # 32 channels, 16x16 slices: conv2d's Winograd per depth tap
    x, w = randn(1, 32, 7, 16, 16), randn(32, 32, 2, 3, 3)
    got = _nn.conv3d(t(x), t(w), None, 1, 1)
    assert len(calls) == 1
    want = conv3d_ref(x, w, None, 1, 1, 1, 1)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-4, atol=1e-5 * np.abs(want).max())
    # 16 channels: the GEMM per tap of conv3d.c, though conv2d would run Winograd too
    _nn.conv3d(t(randn(4, 16, 6, 8, 8)), t(randn(16, 16, 3, 3, 3)), None, 1, 1)
    assert len(calls) == 1


def test_conv3d_in_tiles_of_depth_slices(conv3d_path):
    # 16 channels x 27 taps x 64 x 64 float64 columns are 14 MiB a depth
    # slice: each of the 4 output slices is its own vol2col tile (16 MiB a
    # tile); stride 2 in depth, so that the policy takes conv2d per tap
    x, w = randn(1, 16, 8, 64, 64, dtype=np.float64), randn(2, 16, 3, 3, 3, dtype=np.float64)
    got = F.conv3d(t(x), t(w), None, (2, 1, 1), 1)
    np.testing.assert_allclose(got.numpy(), conv3d_ref(x, w, None, (2, 1, 1), 1, 1, 1), rtol=1e-11,
                               atol=1e-11)


def test_conv3d_half_types_compute_in_float32():
    x, w = randn(1, 2, 3, 4, 4), randn(3, 2, 2, 2, 2)
    got = F.conv3d(t(x).astype("float16"), t(w).astype("float16"))
    assert got.dtype == np.float16
    want = conv3d_ref(x.astype(np.float16), w.astype(np.float16), None, 1, 0, 1, 1)
    np.testing.assert_allclose(got.numpy().astype(np.float64), want, rtol=2e-2, atol=2e-2)


def conv_transpose3d_ref(x, w, b, stride, padding, output_padding, dilation, groups):
    s, p, op, d = _triple(stride), _triple(padding), _triple(output_padding), _triple(dilation)
    n, c = x.shape[:2]
    cg, og, *k = w.shape
    full = [(x.shape[2 + i] - 1) * s[i] + d[i] * (k[i] - 1) + 1 + op[i] for i in range(3)]
    out = np.zeros((n, og * groups) + tuple(full))
    cpg = c // groups
    for g in range(groups):
        xs = x[:, g * cpg:(g + 1) * cpg].astype(np.float64)
        for a in range(k[0]):
            for bb in range(k[1]):
                for cc in range(k[2]):
                    out[:, g * og:(g + 1) * og,
                        a * d[0]:a * d[0] + (x.shape[2] - 1) * s[0] + 1:s[0],
                        bb * d[1]:bb * d[1] + (x.shape[3] - 1) * s[1] + 1:s[1],
                        cc * d[2]:cc * d[2] + (x.shape[4] - 1) * s[2] + 1:s[2]] += np.einsum(
                        "ncdhw,co->nodhw", xs, w[g * cpg:(g + 1) * cpg, :, a, bb, cc])
    out = out[:, :, p[0]:full[0] - p[0], p[1]:full[1] - p[1], p[2]:full[2] - p[2]]
    return out if b is None else out + b.reshape(1, -1, 1, 1, 1)


CONV_T3D = [((2, 4, 3, 2, 3), (4, 3, 3, 2, 2), 2, 1, 1, 1, 1, True),
            ((1, 4, 2, 3, 2), (4, 2, 2, 3, 1), (1, 2, 2), (0, 1, 0), (0, 1, 1), (2, 1, 1), 2, False),
            ((2, 3, 3, 3, 3), (3, 5, 1, 1, 1), 1, 0, 0, 1, 1, True)]


@pytest.mark.parametrize("xs, ws, stride, padding, output_padding, dilation, groups, bias", CONV_T3D)
def test_conv_transpose3d_kernel_against_numpy(xs, ws, stride, padding, output_padding, dilation,
                                               groups, bias):
    x, w = randn(*xs, dtype=np.float64), randn(*ws, dtype=np.float64)
    b = randn(ws[1] * groups, dtype=np.float64) if bias else None
    args = (stride, padding, output_padding, dilation, groups)
    got = _nn.conv_transpose3d(t(x), t(w), None if b is None else t(b), *args)
    want = conv_transpose3d_ref(x, w, b, *args)
    assert got.shape == want.shape
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-11, atol=1e-11)
    comp = fallbacks.conv_transpose3d(t(x), t(w), None if b is None else t(b), *args)
    np.testing.assert_allclose(comp.numpy(), want, rtol=1e-11, atol=1e-11)


# stride 1, dilation 1: run as the conv3d they equal (flipped, regrouped weight)
CONV_T3D_AS_CONV = [((2, 4, 3, 5, 4), (4, 3, 3, 3, 3), 1, True),
                    ((1, 6, 4, 3, 5), (6, 2, 2, 3, 2), (0, 1, 1), False),   # groups 2 below
                    ((1, 16, 3, 6, 6), (16, 8, 3, 3, 3), (2, 0, 1), True)]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("xs, ws, padding, bias", CONV_T3D_AS_CONV)
def test_conv_transpose3d_at_stride_1_runs_as_conv3d(monkeypatch, xs, ws, padding, bias, dtype):
    groups = 2 if xs[1] == 6 else 1
    x, w = randn(*xs, dtype=np.float64), randn(*ws, dtype=np.float64)
    b = randn(ws[1] * groups, dtype=np.float64) if bias else None
    args = (1, padding, 0, 1, groups)
    want = conv_transpose3d_ref(x, w, b, *args)
    tb = None if b is None else t(b.astype(dtype))
    calls = []
    as_conv = fallbacks.transpose3d_as_conv3d
    monkeypatch.setattr(fallbacks, "transpose3d_as_conv3d", lambda *a: calls.append(1) or as_conv(*a))
    got = _nn.conv_transpose3d(t(x.astype(dtype)), t(w.astype(dtype)), tb, *args)
    assert calls == [1] and got.dtype == dtype and got.shape == want.shape
    tol = 1e-11 if dtype == np.float64 else 1e-4
    np.testing.assert_allclose(got.numpy(), want, rtol=tol, atol=tol * np.abs(want).max())
    _nn._conv3d_force_kernel(True)        # the col2vol kernel on the same call
    try:
        kern = _nn.conv_transpose3d(t(x.astype(dtype)), t(w.astype(dtype)), tb, *args)
    finally:
        _nn._conv3d_force_kernel(False)
    assert calls == [1]
    np.testing.assert_allclose(kern.numpy(), got.numpy(), rtol=tol, atol=tol * np.abs(want).max())
    # strided, dilated, or padded past the kernel: the kernel, not conv3d
    _nn.conv_transpose3d(t(x), t(w), None, 2, padding, 1, 1, groups)
    _nn.conv_transpose3d(t(x), t(w), None, 1, padding, 0, 2, groups)
    assert calls == [1]


def test_conv3d_core_op_errors():
    x = t(randn(1, 2, 3, 3, 3))
    with pytest.raises(ValueError, match=r"conv3d: expected x of shape \[N, C, D, H, W\]"):
        _nn.conv3d(t(randn(2, 3, 3, 3)), t(randn(1, 3, 1, 1, 1)))
    with pytest.raises(ValueError, match="conv3d: x has 2 channels but weight expects 3"):
        _nn.conv3d(x, t(randn(1, 3, 1, 1, 1)))
    with pytest.raises(ValueError, match="is larger than the padded input"):
        _nn.conv3d(x, t(randn(1, 2, 1, 4, 1)))
    with pytest.raises(ValueError, match=r"conv3d: bias must have shape \(1,\)"):
        _nn.conv3d(x, t(randn(1, 2, 1, 1, 1)), t(randn(2)))
    with pytest.raises(ValueError, match="groups=2 must divide the 3 output channels"):
        _nn.conv3d(x, t(randn(3, 1, 1, 1, 1)), None, 1, 0, 1, 2)
    with pytest.raises(TypeError, match="expected floating-point tensors"):
        _nn.conv3d(x.astype("int32"), t(randn(1, 2, 1, 1, 1)))
    with pytest.raises(ValueError, match="output_padding"):
        _nn.conv_transpose3d(x, t(randn(2, 1, 2, 2, 2)), None, 1, 0, 1)
    with pytest.raises(ValueError, match="leaves no output"):
        _nn.conv_transpose3d(x, t(randn(2, 1, 1, 1, 1)), None, 1, 3)
    assert mt.has_kernel("conv3d", "cpu", "float64") and mt.has_kernel("conv_transpose3d", "cpu")
    assert not mt.has_kernel("conv3d", "cpu", "int32")


# ------------------------------------------------------------------ gradients

def _fd_check(fn, arrays, eps=1e-6, tol=1e-6):
    """fn's gradient (of sum(fn * seeded weights)) against central finite
    differences, float64, every input."""
    out0 = fn(*[t(a) for a in arrays]).numpy()
    cot = RNG.standard_normal(out0.shape)
    xs = [M.Parameter(a.copy()) for a in arrays]
    gm = GradManager().attach(xs)
    with gm:
        y = fn(*xs)
        gm.backward((y * t(cot)).sum())
    for k, a in enumerate(arrays):
        num = np.zeros_like(a)
        flat = a.reshape(-1)
        for i in range(flat.size):
            keep = flat[i]
            vals = []
            for sgn in (1, -1):
                flat[i] = keep + sgn * eps
                vals.append((fn(*[t(b) for b in arrays]).numpy() * cot).sum())
            flat[i] = keep
            num.reshape(-1)[i] = (vals[0] - vals[1]) / (2 * eps)
        np.testing.assert_allclose(xs[k].grad.numpy(), num, rtol=tol, atol=tol)


def test_conv3d_gradients_against_finite_differences():
    arrays = [randn(2, 4, 3, 4, 3, dtype=np.float64), randn(4, 2, 2, 3, 2, dtype=np.float64),
              randn(4, dtype=np.float64)]
    _fd_check(lambda x, w, b: F.conv3d(x, w, b, (1, 2, 1), (1, 1, 0), (2, 1, 1), 2), arrays)


def test_conv_transpose3d_gradients_against_finite_differences():
    arrays = [randn(1, 4, 2, 3, 2, dtype=np.float64), randn(4, 3, 2, 2, 3, dtype=np.float64),
              randn(6, dtype=np.float64)]
    _fd_check(lambda x, w, b: F.conv_transpose3d(x, w, b, 2, (0, 1, 1), (1, 0, 1), 1, 2), arrays)


# ------------------------------------------------------------------ recurrent steps

def _sig(v):
    return 1 / (1 + np.exp(-v))


def lstm_step_ref(gx, h, c, w_hh, b_hh):
    g = gx + h @ w_hh.T + (0 if b_hh is None else b_hh)
    hid = c.shape[1]
    i, f, gg, o = (g[:, k * hid:(k + 1) * hid] for k in range(4))
    c2 = _sig(f) * c + _sig(i) * np.tanh(gg)
    return _sig(o) * np.tanh(c2), c2


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n, hid, width, bias", [(3, 5, 5, True), (1, 4, 2, False), (0, 3, 3, True)])
def test_lstm_cell_against_numpy(n, hid, width, bias, dtype):
    gx, h, c = randn(n, 4 * hid, dtype=dtype), randn(n, width, dtype=dtype), randn(n, hid, dtype=dtype)
    w, b = randn(4 * hid, width, dtype=dtype), randn(4 * hid, dtype=dtype) if bias else None
    h2, c2 = _nn.lstm_cell(t(gx), t(h), t(c), t(w), None if b is None else t(b))
    wh, wc = lstm_step_ref(gx.astype(np.float64), h, c, w, b)
    tol = 1e-5 if dtype == np.float32 else 1e-12
    assert h2.shape == c2.shape == (n, hid) and h2.dtype == dtype
    np.testing.assert_allclose(h2.numpy(), wh, rtol=tol, atol=tol)
    np.testing.assert_allclose(c2.numpy(), wc, rtol=tol, atol=tol)
    fh, fc = fallbacks.lstm_cell(t(gx), t(h), t(c), t(w), None if b is None else t(b))
    np.testing.assert_allclose(fh.numpy(), wh, rtol=tol, atol=tol)
    np.testing.assert_allclose(fc.numpy(), wc, rtol=tol, atol=tol)


@pytest.mark.parametrize("nonlinearity", ["tanh", "relu"])
def test_rnn_cell_against_numpy(nonlinearity):
    gx, h, w, b = randn(4, 6), randn(4, 6), randn(6, 6), randn(6)
    pre = gx.astype(np.float64) + h @ w.T + b
    want = np.tanh(pre) if nonlinearity == "tanh" else np.maximum(pre, 0)
    got = _nn.rnn_cell(t(gx), t(h), t(w), t(b), nonlinearity)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(fallbacks.rnn_cell(t(gx), t(h), t(w), t(b), nonlinearity).numpy(), want,
                               rtol=1e-5, atol=1e-5)


def test_cell_errors():
    z = t(randn(2, 3))
    with pytest.raises(ValueError, match=r"lstm_cell: gx must have shape \(2, 12\)"):
        _nn.lstm_cell(t(randn(2, 11)), z, z, t(randn(12, 3)))
    with pytest.raises(ValueError, match=r"lstm_cell: w_hh must have shape \(12, 3\)"):
        _nn.lstm_cell(t(randn(2, 12)), z, z, t(randn(12, 4)))
    with pytest.raises(ValueError, match=r"rnn_cell: b_hh must have shape \(3,\)"):
        _nn.rnn_cell(z, z, t(randn(3, 3)), t(randn(4)))
    with pytest.raises(ValueError, match="nonlinearity must be 'tanh' or 'relu'"):
        _nn.rnn_cell(z, z, t(randn(3, 3)), None, "gelu")
    with pytest.raises(ValueError, match=r"h must be \[N, hidden\]"):
        _nn.rnn_cell(z, t(randn(3)), t(randn(3, 3)))
    with pytest.raises(TypeError, match="expected floating-point tensors"):
        _nn.rnn_cell(z.astype("int32"), z, t(randn(3, 3)))


def test_lstm_cell_gradients_against_finite_differences():
    arrays = [randn(2, 12, dtype=np.float64), randn(2, 2, dtype=np.float64), randn(2, 3, dtype=np.float64),
              randn(12, 2, dtype=np.float64), randn(12, dtype=np.float64)]

    def both(gx, h, c, w, b):     # h' and c' both reach the loss
        h2, c2 = _nn.lstm_cell(gx, h, c, w, b)
        return F.concat([h2, c2 * 0.5], axis=1)

    _fd_check(both, arrays)
    _fd_check(lambda *a: _nn.lstm_cell(*a)[1], arrays)          # c' alone: h' gets no gradient


@pytest.mark.parametrize("nonlinearity", ["tanh", "relu"])
def test_rnn_cell_gradients_against_finite_differences(nonlinearity):
    arrays = [randn(3, 4, dtype=np.float64), randn(3, 4, dtype=np.float64), randn(4, 4, dtype=np.float64),
              randn(4, dtype=np.float64)]
    _fd_check(lambda *a: _nn.rnn_cell(*a, nonlinearity), arrays)


@pytest.mark.parametrize("kind", ["LSTM", "RNN"])
def test_recurrent_module_gradients_against_torch(kind):
    torch = pytest.importorskip("torch")
    extra = {"proj_size": 2} if kind == "LSTM" else {"nonlinearity": "relu"}
    m = getattr(M, kind)(3, 4, num_layers=2, bidirectional=True, **extra)
    ref = getattr(torch.nn, kind)(3, 4, num_layers=2, bidirectional=True, **extra)
    with torch.no_grad():
        for name, p in ref.named_parameters():
            p.copy_(torch.from_numpy(getattr(m, name).numpy()))
    x = randn(5, 2, 3)
    params = list(m.parameters())
    gm = GradManager().attach(params)
    with gm:
        y, state = m(t(x))
        finals = state if kind == "LSTM" else (state,)
        gm.backward(y.sum() + sum((s * (k + 2)).sum() for k, s in enumerate(finals)))
    ty, tstate = ref(torch.from_numpy(x))
    tfinals = tstate if kind == "LSTM" else (tstate,)
    (ty.sum() + sum((s * (k + 2)).sum() for k, s in enumerate(tfinals))).backward()
    np.testing.assert_allclose(y.numpy(), ty.detach().numpy(), rtol=1e-5, atol=1e-5)
    for name, p in ref.named_parameters():
        np.testing.assert_allclose(getattr(m, name).grad.numpy(), p.grad.numpy(), rtol=1e-4, atol=1e-5)
