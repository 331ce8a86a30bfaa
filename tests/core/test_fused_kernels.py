"""The kernels optimize() leans on: vector exp/erf, activation epilogues of
conv2d (every algorithm), the bias + activation pass of linear, and matmul
folding the leading axes of x [..., M, K] @ w [K, N] into one GEMM.

References: double-precision libm (math.erf, numpy.exp) and the unfused
ops one after the other.
"""
import math

import numpy as np
import pytest

import mgtrace as mt
import mgtrace.functional as F
from mgtrace._core import nn as N

ERF = np.vectorize(math.erf, otypes=[np.float64])
ACTS = {"relu": F.relu, "relu6": F.relu6, "silu": F.silu, "hardswish": F.hardswish,
        "sigmoid": F.sigmoid, "gelu": F.gelu, "none": lambda y: y}


def _grid():
    # lengths that are not multiples of the 16 lanes exercise the tail
    return np.linspace(-9.0, 9.0, 40001).astype(np.float32)


def test_vector_erf_and_gelu_accuracy():
    x = _grid()
    got = F.erf(mt.tensor(x)).numpy()
    assert np.abs(got - ERF(x.astype(np.float64))).max() <= 4e-7
    g = F.gelu(mt.tensor(x)).numpy()
    want = 0.5 * x.astype(np.float64) * (1 + ERF(x / np.sqrt(2.0)))
    assert np.abs(g - want).max() <= 1e-6
    # the strided (non-contiguous) path agrees with the vector path
    strided = F.gelu(mt.tensor(np.stack([x, x], 1))[:, 0]).numpy()
    np.testing.assert_allclose(strided, g, rtol=1e-5, atol=1e-6)


def test_vector_exp_family_accuracy():
    x = np.concatenate([_grid() * 10, np.float32([-100.0, -88.0, 88.5, 89.0])])
    want = np.exp(x.astype(np.float64))
    got = F.exp(mt.tensor(x)).numpy().astype(np.float64)
    finite = np.isfinite(want) & (want < 3.4e38)
    rel = np.abs(got[finite] - want[finite]) / np.maximum(want[finite], 1e-45)
    assert rel[want[finite] > 1e-37].max() <= 2.5e-7     # normal results within 2 ulp
    assert np.abs(got[finite] - want[finite])[want[finite] <= 1e-37].max() <= 1e-44  # subnormal: a few of their ulps
    s = _grid()
    np.testing.assert_allclose(F.sigmoid(mt.tensor(s)).numpy(), 1 / (1 + np.exp(-s.astype(np.float64))),
                               rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(F.silu(mt.tensor(s)).numpy(), s / (1 + np.exp(-s.astype(np.float64))),
                               rtol=1e-6, atol=1e-6)


def test_vector_math_special_values():
    x = mt.tensor(np.float32([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-30, -1e-30]))
    erf = F.erf(x).numpy()
    assert np.isnan(erf[0]) and erf[1] == 1 and erf[2] == -1 and erf[3] == 0
    assert np.signbit(erf[4]) and erf[5] == pytest.approx(1.1283791670955126e-30)
    exp = F.exp(x).numpy()
    assert np.isnan(exp[0]) and exp[1] == np.inf and exp[2] == 0 and exp[3] == 1
    gelu = F.gelu(x).numpy()
    assert np.isnan(gelu[0]) and gelu[1] == np.inf and gelu[3] == 0


CONV_CASES = {   # algorithm: (x shape, weight shape, stride, padding, groups)
    "gemm1x1": ((2, 16, 7, 9), (24, 16, 1, 1), 1, 0, 1),
    "im2col": ((2, 16, 9, 7), (24, 16, 3, 3), 2, 1, 1),           # small planes: span images
    "shifted": ((1, 16, 40, 36), (20, 16, 3, 3), 1, 1, 1),
    "winograd": ((2, 16, 11, 13), (32, 16, 3, 3), 1, 1, 1),       # odd sizes: partial tiles
    "winograd4": ((2, 16, 11, 14), (32, 16, 3, 3), 1, 1, 1),      # 3 and 2 of a 4x4 tile's rows, columns
    "depthwise": ((2, 8, 10, 11), (8, 1, 3, 3), 2, 1, 8),
    "direct": ((2, 3, 19, 17), (11, 3, 5, 5), 2, 2, 1),             # a partial block of output channels
}


@pytest.mark.parametrize("algo", sorted(CONV_CASES))
@pytest.mark.parametrize("act", sorted(ACTS))
def test_conv2d_epilogue_equals_the_activation_after(rng, algo, act):
    xs, ws, stride, pad, groups = CONV_CASES[algo]
    x = mt.tensor(rng.standard_normal(xs).astype(np.float32))
    w = mt.tensor((rng.standard_normal(ws) * 0.3).astype(np.float32))
    b = mt.tensor(rng.standard_normal(ws[0]).astype(np.float32))
    plain = N._conv2d(x, w, b, stride, pad, 1, groups, algo)
    fused = N._conv2d(x, w, b, stride, pad, 1, groups, algo, act)
    np.testing.assert_allclose(fused.numpy(), ACTS[act](plain).numpy(), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("algo", sorted(CONV_CASES))
@pytest.mark.parametrize("act", ["none", "relu"])
def test_conv2d_epilogue_adds_the_residual_first(rng, algo, act):
    xs, ws, stride, pad, groups = CONV_CASES[algo]
    x = mt.tensor(rng.standard_normal(xs).astype(np.float32))
    w = mt.tensor((rng.standard_normal(ws) * 0.3).astype(np.float32))
    plain = N._conv2d(x, w, None, stride, pad, 1, groups, algo)
    r = mt.tensor(rng.standard_normal(plain.shape).astype(np.float32))
    fused = N._conv2d(x, w, None, stride, pad, 1, groups, algo, act, r)
    np.testing.assert_allclose(fused.numpy(), ACTS[act](plain + r).numpy(), rtol=1e-6, atol=1e-6)


def test_conv2d_act_residual_checks(rng):
    """A residual of the output's shape and a float dtype goes into the
    epilogue; any other adds as ``+`` does (a fused graph called on inputs
    other than its trace's must compute what the add did)."""
    x = mt.tensor(rng.standard_normal((1, 2, 5, 5)).astype(np.float32))
    w = mt.tensor(rng.standard_normal((3, 2, 3, 3)).astype(np.float32))
    plain = F.conv2d(x, w)
    for r in (rng.standard_normal((1, 3, 1, 1)).astype(np.float32),       # broadcast
              rng.integers(-3, 3, (1, 3, 3, 3)).astype(np.int32),          # promoted
              rng.standard_normal((2, 1, 3, 3, 3)).astype(np.float32)):    # a larger result
        got = F.conv2d_act(x, w, residual=mt.tensor(r), act="relu")
        want = np.maximum(plain.numpy() + r, 0)
        assert got.shape == want.shape and got.dtype == np.float32
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError):
        F.conv2d_act(x, w, residual=mt.tensor(np.zeros((1, 2, 3, 3), np.float32)))
    # a float64 residual promotes the result, as conv2d(...) + residual does
    r = mt.tensor(rng.standard_normal((1, 3, 3, 3)))
    got = F.conv2d_act(x, w, residual=r, act="none")
    assert got.dtype == np.float64
    want = (F.conv2d(x, w) + r).numpy()       # (a float32 conv: its rounding, relative to the scale)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-6, atol=1e-6 * np.abs(want).max())


@pytest.mark.parametrize("dtype", ["float64", "float16"])
def test_conv2d_act_other_dtypes(rng, dtype):
    x = mt.tensor(rng.standard_normal((1, 4, 6, 6)).astype(dtype))
    w = mt.tensor(rng.standard_normal((5, 4, 3, 3)).astype(dtype))
    got = F.conv2d_act(x, w, None, padding=1, act="silu")
    want = F.silu(F.conv2d(x, w, None, padding=1))
    assert got.dtype == want.dtype == np.dtype(dtype)
    np.testing.assert_allclose(got.numpy().astype(np.float64), want.numpy().astype(np.float64),
                               rtol=1e-3 if dtype == "float16" else 1e-12, atol=1e-3 if dtype == "float16" else 1e-12)


def test_fused_functions_check_act(rng):
    x = mt.tensor(np.ones((1, 1, 3, 3), np.float32))
    with pytest.raises(ValueError, match="act must be one of"):
        F.conv2d_act(x, x, act="tanh")
    with pytest.raises(ValueError, match="act must be one of"):
        F.linear_act(mt.tensor(np.ones((2, 3), np.float32)), mt.tensor(np.ones((4, 3), np.float32)),
                     act=None)
    with pytest.raises(TypeError, match="contiguous float32 or float64"):
        N.bias_act_(mt.tensor(np.ones((2, 3), np.int32)), None, "relu")
    with pytest.raises(ValueError, match=r"bias must be a Tensor of shape \(3,\)"):
        N.bias_act_(mt.tensor(np.ones((2, 3), np.float32)), mt.tensor(np.ones(2, np.float32)), "relu")


@pytest.mark.parametrize("act", sorted(ACTS))
@pytest.mark.parametrize("shape", [(7,), (3, 7), (2, 5, 7)])
def test_linear_act_equals_linear_then_act(rng, act, shape):
    x = mt.tensor(rng.standard_normal(shape).astype(np.float32))
    w = mt.tensor(rng.standard_normal((9, 7)).astype(np.float32))
    b = mt.tensor(rng.standard_normal(9).astype(np.float32))
    want = ACTS[act](F.linear(x, w, b)).numpy()
    np.testing.assert_allclose(F.linear_act(x, w, b, act=act).numpy(), want, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(F.linear_act(x, w, None, act=act).numpy(),
                               ACTS[act](F.linear(x, w)).numpy(), rtol=1e-6, atol=1e-6)


def test_linear_act_falls_back_for_other_dtypes(rng):
    x = mt.tensor(rng.integers(-3, 3, (2, 4)).astype(np.int32))
    w = mt.tensor(rng.standard_normal((3, 4)).astype(np.float32))
    got = F.linear_act(x, w, act="relu")
    assert got.dtype == np.float32
    np.testing.assert_allclose(got.numpy(), np.maximum(x.numpy() @ w.numpy().T, 0), rtol=1e-6)


@pytest.mark.parametrize("make", [
    lambda a: a,                                   # contiguous [B, M, K]: one folded GEMM
    lambda a: a[:, 1:4],                           # a slice of rows: still one run
    lambda a: a.transpose(1, 0, 2),                # leading axes out of order: a batch
    lambda a: a[:, :, :5],                         # rows farther apart than K
    lambda a: a[:1],                               # batch of one
    lambda a: a.reshape(2, 2, 5, 6)[:, :1],        # a size-1 axis in the middle
])
def test_matmul_folds_leading_axes_of_a_3d_left_operand(rng, make):
    base = rng.standard_normal((4, 5, 6)).astype(np.float32)
    w = rng.standard_normal((7, 6)).astype(np.float32)
    a = make(mt.tensor(base))
    an = make(base)
    k = an.shape[-1]
    got = (a @ mt.tensor(w[:, :k].T.copy())).numpy()
    np.testing.assert_allclose(got, an @ w[:, :k].T, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(F.linear(a, mt.tensor(w[:, :k].copy())).numpy(), an @ w[:, :k].T,
                               rtol=1e-5, atol=1e-5)


def _attention_ref(q, k, v, mask, scale):
    s = np.einsum("bhqd,bhkd->bhqk", q.astype(np.float64), k.astype(np.float64)) * scale
    if mask is not None:
        s = s + mask
    s = s - s.max(-1, keepdims=True)
    p = np.exp(s)
    p /= p.sum(-1, keepdims=True)
    return np.einsum("bhqk,bhkd->bhqd", p, v.astype(np.float64))


@pytest.mark.parametrize("mask_shape", [None, (2, 1, 1, 9), (1, 3, 5, 9), (9,)])
def test_attention_kernel_matches_softmax_attention(rng, mask_shape):
    q = rng.standard_normal((2, 3, 5, 4)).astype(np.float32)
    k = rng.standard_normal((2, 3, 9, 4)).astype(np.float32)
    v = rng.standard_normal((2, 3, 9, 6)).astype(np.float32)
    mask = None if mask_shape is None else \
        np.where(rng.random(mask_shape) < 0.3, np.finfo(np.float32).min, 0).astype(np.float32)
    got = F.attention(mt.tensor(q), mt.tensor(k), mt.tensor(v),
                      None if mask is None else mt.tensor(mask), scale=0.5)
    np.testing.assert_allclose(got.numpy(), _attention_ref(q, k, v, mask, 0.5), rtol=1e-5, atol=1e-6)
    # strided views (a transposed [B, S, H, D] layout, as in BERT) take the kernel too
    qt = mt.tensor(q.transpose(0, 2, 1, 3).copy()).transpose(0, 2, 1, 3)
    got = F.attention(qt, mt.tensor(k), mt.tensor(v), scale=0.5)
    np.testing.assert_allclose(got.numpy(), _attention_ref(q, k, v, None, 0.5), rtol=1e-5, atol=1e-6)
    # float64 runs the sequence
    got = F.attention(mt.tensor(q.astype(np.float64)), mt.tensor(k.astype(np.float64)),
                      mt.tensor(v.astype(np.float64)), scale=0.5)
    assert got.dtype == np.float64
    np.testing.assert_allclose(got.numpy(), _attention_ref(q, k, v, None, 0.5), rtol=1e-10)


@pytest.mark.parametrize("sq,sk,d,dv", [(1, 1, 1, 1), (7, 15, 3, 15), (8, 16, 32, 16), (9, 17, 5, 17),
                                         (17, 33, 32, 32), (3, 64, 64, 33), (10, 40, 7, 70)])
@pytest.mark.parametrize("masked", [False, True])
def test_attention_tiles_and_their_tails(rng, sq, sk, d, dv, masked):
    """The kernel's register tiles (8 query rows by 32 keys or 32 output
    columns) and each of their tails: query rows past a multiple of 8,
    keys past 16 and 32, output columns past 16 and 32 and over two tiles,
    head sizes from 1, with a padding mask whose keys the kernel leaves out,
    on one and two threads, against the float64 NumPy reference."""
    q = rng.standard_normal((2, 3, sq, d)).astype(np.float32)
    k = rng.standard_normal((2, 3, sk, d)).astype(np.float32)
    v = rng.standard_normal((2, 3, sk, dv)).astype(np.float32)
    mask = None
    if masked:
        mask = np.zeros((2, 1, 1, sk), np.float32)
        mask[1, :, :, sk // 2 + 1:] = np.finfo(np.float32).min     # image 1: its last keys padding
    want = _attention_ref(q, k, v, mask, 0.7)
    before = mt.get_num_threads()
    try:
        for threads in (1, 2):
            mt.set_num_threads(threads)
            got = F.attention(mt.tensor(q), mt.tensor(k), mt.tensor(v),
                              None if mask is None else mt.tensor(mask), scale=0.7).numpy()
            np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)
    finally:
        mt.set_num_threads(before)


@pytest.mark.parametrize("half", ["q", "k", "v"])
def test_attention_of_a_float16_operand_beside_float32_ones(rng, half):
    # they promote to float32, which took the fused kernel: the float16
    # operand's bytes were read as float32 (wrong numbers, errors of 0.2 to
    # 9, and reads past the end of its buffer); it runs the fallback now
    ops = {"q": rng.standard_normal((1, 2, 3, 4)), "k": rng.standard_normal((1, 2, 5, 4)),
           "v": rng.standard_normal((1, 2, 5, 6))}
    ops = {n: a.astype(np.float16 if n == half else np.float32) for n, a in ops.items()}
    mask = rng.standard_normal((3, 5)).astype(np.float32)
    for m in (None, mask):
        got = F.attention(*(mt.tensor(ops[n]) for n in "qkv"),
                          None if m is None else mt.tensor(m), scale=0.5)
        assert got.dtype == np.float32
        np.testing.assert_allclose(got.numpy(), _attention_ref(ops["q"], ops["k"], ops["v"], m, 0.5),
                                   rtol=1e-5, atol=1e-6)


def test_attention_writes_heads_inner_so_merging_the_heads_is_a_view(rng):
    """The [B, H, S, Dv] result is a view of [B, S, H, Dv] memory: BERT's
    transpose and reshape to [B, S, H * Dv] after it copy nothing, and each
    (batch, head) pair holds the bits a call of that pair alone gives."""
    from mgtrace._core import plan as _cplan
    q = rng.standard_normal((2, 3, 5, 4)).astype(np.float32)
    k = rng.standard_normal((2, 3, 9, 4)).astype(np.float32)
    v = rng.standard_normal((2, 3, 9, 6)).astype(np.float32)
    out = F.attention(mt.tensor(q), mt.tensor(k), mt.tensor(v), scale=0.5)
    assert out.shape == (2, 3, 5, 6)
    merged = F.reshape(F.transpose(out, (0, 2, 1, 3)), (2, 5, 18))
    assert _cplan.tensor_info(merged)[0] == _cplan.tensor_info(out)[0]        # the same memory
    np.testing.assert_array_equal(merged.numpy(), out.numpy().transpose(0, 2, 1, 3).reshape(2, 5, 18))
    np.testing.assert_allclose(out.numpy(), _attention_ref(q, k, v, None, 0.5), rtol=1e-5, atol=1e-6)
    for b in range(2):
        for h in range(3):
            one = F.attention(mt.tensor(q[b:b + 1, h:h + 1]), mt.tensor(k[b:b + 1, h:h + 1]),
                              mt.tensor(v[b:b + 1, h:h + 1]), scale=0.5)
            assert one.numpy().tobytes() == out.numpy()[b, h].tobytes()


def test_attention_softmax_lanes_and_special_rows(rng):
    """The softmax's 8-lane max and sums over rows longer than the lanes
    (37 keys: lanes and a tail), with a NaN in one row (that row's outputs
    are NaN, the others unchanged) and a fully masked row (NaN, as the
    unfused softmax gives), on every thread count."""
    q = rng.standard_normal((2, 2, 6, 8)).astype(np.float32)
    k = rng.standard_normal((2, 2, 37, 8)).astype(np.float32)
    v = rng.standard_normal((2, 2, 37, 5)).astype(np.float32)
    mask = np.zeros((2, 1, 6, 37), np.float32)
    mask[1, 0, 4] = -np.inf                       # every key of query 4 of image 1 masked
    k_nan = k.copy()
    k_nan[0, 1, 30, 2] = np.nan                   # one key of head 1 of image 0
    with np.errstate(invalid="ignore"):          # the reference's NaN rows
        want = _attention_ref(q, k_nan, v, mask, 0.3)
    before = mt.get_num_threads()
    try:
        for threads in (1, 2):
            mt.set_num_threads(threads)
            got = F.attention(mt.tensor(q), mt.tensor(k_nan), mt.tensor(v), mt.tensor(mask), scale=0.3).numpy()
            assert np.isnan(got[0, 1]).all() and np.isnan(got[1, :, 4]).all()
            ok = ~np.isnan(want)
            np.testing.assert_allclose(got[ok], want[ok], rtol=1e-5, atol=1e-6)
            assert np.array_equal(np.isnan(got), np.isnan(want))
    finally:
        mt.set_num_threads(before)


def test_attention_checks_its_arguments(rng):
    q = mt.tensor(rng.standard_normal((1, 2, 3, 4)).astype(np.float32))
    with pytest.raises(ValueError, match=r"expected q of shape \[B, H, S, D\]"):
        F.attention(q[0], q, q)
    with pytest.raises(ValueError, match="shapes do not fit"):
        F.attention(q, q[:, :1], q)
    with pytest.raises(ValueError, match="does not broadcast"):
        F.attention(q, q, q, mt.tensor(np.zeros((5,), np.float32)))
    # an integer operand runs the sequence, with its promotion (issue 29 item 10)
    v = np.arange(24, dtype=np.int32).reshape(1, 2, 3, 4)
    got = F.attention(q, q, mt.tensor(v))
    s = q.numpy().astype(np.float64) @ q.numpy().astype(np.float64).transpose(0, 1, 3, 2)
    p = np.exp(s - s.max(-1, keepdims=True))
    assert got.dtype == np.float32
    np.testing.assert_allclose(got.numpy(), (p / p.sum(-1, keepdims=True)) @ v, rtol=1e-5, atol=1e-5)
    with pytest.raises(TypeError, match="scale"):
        F.attention(q, q, q, scale="half")


def _layer_norm_ref(x, k, w, b, eps):
    axes = tuple(range(x.ndim - k, x.ndim))
    x = x.astype(np.float64)
    y = (x - x.mean(axes, keepdims=True)) / np.sqrt(x.var(axes, keepdims=True) + eps)
    return y * (1 if w is None else w) + (0 if b is None else b)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("shape, k", [((8, 13, 384), 1), ((3, 5, 7), 2), ((37,), 1), ((4, 1), 1),
                                      ((2, 0, 6), 1)], ids=str)
def test_layer_norm_kernel_matches_numpy(rng, dtype, shape, k):
    """F.layer_norm's C kernel (one pass, mean and variance in double) over
    rows of odd lengths (lanes and tails), several trailing axes, a strided
    input, with and without weight and bias, on every thread count."""
    x = (rng.standard_normal(shape) * 3 + 1).astype(dtype)
    ns = shape[len(shape) - k:]
    w = rng.standard_normal(ns).astype(dtype)
    b = rng.standard_normal(ns).astype(dtype)
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == "float32" else dict(rtol=1e-12, atol=1e-12)
    before = mt.get_num_threads()
    try:
        for threads in (1, 2):
            mt.set_num_threads(threads)
            for wt, bt in ((w, b), (None, None), (w, None), (None, b)):
                got = F.layer_norm(mt.tensor(x), ns, None if wt is None else mt.tensor(wt),
                                   None if bt is None else mt.tensor(bt), eps=1e-5)
                assert got.dtype == dtype and got.shape == shape
                np.testing.assert_allclose(got.numpy(), _layer_norm_ref(x, k, wt, bt, 1e-5), **tol)
    finally:
        mt.set_num_threads(before)
    if x.ndim == 3 and x.shape[1] > 1:                   # a strided view takes a contiguous copy
        xs = mt.tensor(np.ascontiguousarray(x.transpose(1, 0, 2))).transpose(1, 0, 2)
        np.testing.assert_allclose(F.layer_norm(xs, ns).numpy(), _layer_norm_ref(x, k, None, None, 1e-5), **tol)


def test_layer_norm_mixed_dtypes_take_the_composed_path(rng):
    x = rng.standard_normal((4, 6)).astype(np.float16)
    w = rng.standard_normal(6).astype(np.float32)
    got = F.layer_norm(mt.tensor(x), 6, mt.tensor(w))
    assert got.dtype == np.float32                        # MegEngine promotion, as before
    np.testing.assert_allclose(got.numpy(), _layer_norm_ref(x, 1, w, None, 1e-5), rtol=2e-3, atol=2e-3)
    c = rng.standard_normal((2, 5)).astype(np.float32)
    c[1] = 7.0                                            # a constant row: var 0, output 0
    np.testing.assert_allclose(F.layer_norm(mt.tensor(c), 5).numpy()[1], 0.0, atol=1e-6)


# ------------------------------------------------------- linear_add_layer_norm

@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("shape", [(8, 13, 24), (37,), (3, 1), (0, 5)], ids=str)
def test_linear_add_layer_norm_is_the_unfused_sequence_bitwise_and_matches_numpy(rng, dtype, shape):
    """The fused bias + residual + layer norm pass gives the bits of
    F.linear, + and F.layer_norm one after the other (same additions, same
    moments), with and without each vector, at 1 and 2 threads, and the
    NumPy float64 value within rounding."""
    from mgtrace.functional.fused import _linear_add_layer_norm_unfused
    k, n = 7, shape[-1]
    x = rng.standard_normal(shape[:-1] + (k,)).astype(dtype)
    w = rng.standard_normal((n, k)).astype(dtype)
    r = (rng.standard_normal(shape) * 2).astype(dtype)
    vb, g, b = (rng.standard_normal(n).astype(dtype) for _ in range(3))
    tol = dict(rtol=2e-5, atol=2e-5) if dtype == "float32" else dict(rtol=1e-11, atol=1e-11)
    before = mt.get_num_threads()
    try:
        for threads in (1, 2):
            mt.set_num_threads(threads)
            for vb_, g_, b_ in ((vb, g, b), (None, None, None), (vb, None, b), (None, g, None)):
                t = [None if v is None else mt.tensor(v) for v in (x, w, vb_, r, g_, b_)]
                got = F.linear_add_layer_norm(*t, eps=1e-6)
                want = _linear_add_layer_norm_unfused(*t, 1e-6)
                assert got.dtype == dtype and got.shape == shape
                assert got.numpy().tobytes() == want.numpy().tobytes()
                s = x.astype(np.float64) @ w.T.astype(np.float64) + (0 if vb_ is None else vb_) + r
                np.testing.assert_allclose(got.numpy(), _layer_norm_ref(s, 1, g_, b_, 1e-6), **tol)
    finally:
        mt.set_num_threads(before)


def test_linear_add_layer_norm_other_operands_run_the_sequence(rng):
    """A residual that broadcasts, a strided one, mixed dtypes: the unfused
    sequence's values (and its promotion); bad shapes raise its errors."""
    x = rng.standard_normal((2, 3, 4)).astype("float32")
    w = rng.standard_normal((5, 4)).astype("float32")
    r = rng.standard_normal((1, 1, 5)).astype("float32")
    s = x.astype(np.float64) @ w.T + r
    got = F.linear_add_layer_norm(mt.tensor(x), mt.tensor(w), None, mt.tensor(r))
    np.testing.assert_allclose(got.numpy(), _layer_norm_ref(s, 1, None, None, 1e-5), rtol=2e-5, atol=2e-5)
    rs = np.ascontiguousarray(rng.standard_normal((2, 5, 3)).astype("float32"))
    strided = mt.tensor(rs).transpose(0, 2, 1)
    got = F.linear_add_layer_norm(mt.tensor(x), mt.tensor(w), None, strided)
    want = _layer_norm_ref(x.astype(np.float64) @ w.T + rs.transpose(0, 2, 1), 1, None, None, 1e-5)
    np.testing.assert_allclose(got.numpy(), want, rtol=2e-5, atol=2e-5)
    got = F.linear_add_layer_norm(mt.tensor(x), mt.tensor(w.astype("float64")), None, mt.tensor(r))
    assert got.dtype == np.float64
    with pytest.raises(ValueError, match="features"):
        F.linear_add_layer_norm(mt.tensor(x), mt.tensor(w[:, :3]), None, mt.tensor(r))
    with pytest.raises(ValueError):
        F.linear_add_layer_norm(mt.tensor(x), mt.tensor(w), None, mt.tensor(r[..., :2]))
    with pytest.raises(TypeError):
        F.linear_add_layer_norm(mt.tensor(x.astype("int32")), mt.tensor(w.astype("int32")), None,
                                mt.tensor(r.astype("int32")))
