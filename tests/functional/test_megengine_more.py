"""MegEngine 1.13's elementwise, math, tensor and nn names added for issue 36,
against NumPy (and PyTorch where installed and equivalent): values, edge
cases, dtypes, and bad arguments. Traced, saved and loaded with symbolic
shapes: tests/functional/test_megengine_traced.py."""
import math

import numpy as np
import pytest

import mgtrace as mt
import mgtrace.functional as F

RNG = np.random.default_rng(36)


def t(a):
    return mt.tensor(np.asarray(a))


# ------------------------------------------------------------ elementwise

HYPERBOLIC = [("sinh", np.sinh), ("cosh", np.cosh), ("asinh", np.arcsinh),
              ("acosh", np.arccosh), ("atanh", np.arctanh)]
POINTS = {"sinh": [-20.0, -1.0, -1e-6, 0.0, 3e-8, 0.5, 1.0, 20.0, 89.0],
          "cosh": [-20.0, -1.0, 0.0, 1e-4, 0.5, 20.0, 89.0],
          "asinh": [-1e30, -5.0, -1e-7, 0.0, 1e-7, 0.5, 3.0, 1e10, 3e38],
          "acosh": [1.0, 1.0 + 1e-6, 1.5, 3.0, 1e5, 1e20, 3e38],
          "atanh": [-0.999, -0.5, -1e-7, 0.0, 2e-8, 0.5, 0.9999]}


@pytest.mark.parametrize("name, ref", HYPERBOLIC)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_hyperbolic_against_numpy(name, ref, dtype):
    x = np.array(POINTS[name], dtype)
    got = getattr(F, name)(mt.tensor(x))
    assert got.dtype == np.dtype(dtype) and got.shape == x.shape
    want = ref(x.astype(np.float64))
    tol = 2e-6 if dtype == "float32" else 1e-13
    np.testing.assert_allclose(got.numpy(), want, rtol=tol, atol=0)


def test_hyperbolic_edges_and_dtypes():
    assert np.isnan(F.acosh(t([0.5])).numpy()).all()
    assert F.atanh(t([1.0, -1.0])).tolist() == [math.inf, -math.inf]
    assert np.isnan(F.atanh(t([1.5])).numpy()).all()
    assert F.sinh(t([1000.0])).tolist() == [math.inf]
    assert F.asinh(t([-math.inf, math.inf])).tolist() == [-math.inf, math.inf]
    # integers give float32, float16 keeps float16 (MegEngine's rule)
    r = F.cosh(t(np.array([0, 1], np.int32)))
    assert r.dtype == np.float32
    np.testing.assert_allclose(r.numpy(), np.cosh([0.0, 1.0]), rtol=1e-6)
    h = F.asinh(t(np.array([0.5, 2.0], np.float16)))
    assert h.dtype == np.float16
    np.testing.assert_allclose(h.numpy(), np.arcsinh([0.5, 2.0]), rtol=1e-3)
    assert F.sinh(2.0).shape == ()
    with pytest.raises(TypeError, match="sinh: x must be"):
        F.sinh("1")


def test_logaddexp_against_numpy():
    x = RNG.standard_normal((3, 4)) * 50
    y = RNG.standard_normal((4,)) * 50
    got = F.logaddexp(t(x.astype(np.float32)), t(y.astype(np.float32)))
    assert got.dtype == np.float32 and got.shape == (3, 4)
    np.testing.assert_allclose(got.numpy(), np.logaddexp(x, y), rtol=1e-6, atol=1e-6)
    inf = math.inf
    a = np.array([-inf, inf, -inf, 1000.0, 0.0, np.nan])
    b = np.array([-inf, inf, 2.0, 1000.0, -1e-30, 0.0])
    with np.errstate(invalid="ignore"):
        want = np.logaddexp(a, b)
    np.testing.assert_array_equal(F.logaddexp(t(a), t(b)).numpy(), want)
    assert F.logaddexp(t(np.array([1, 2], np.int8)), 0).dtype == np.float32
    assert F.logaddexp(t(np.array([1.0], np.float16)), 1.0).dtype == np.float16
    with pytest.raises(ValueError, match="logaddexp: x of shape .3,., y of shape .2,. do not"):
        F.logaddexp(t([1.0, 2.0, 3.0]), t([1.0, 2.0]))


def test_shifts_against_numpy():
    x = np.array([1, -8, 300, 7], np.int32)
    s = np.array([0, 1, 3, 2], np.int32)
    assert F.left_shift(t(x), t(s)).tolist() == np.left_shift(x, s).tolist()
    assert F.right_shift(t(x), t(s)).tolist() == np.right_shift(x, s).tolist()
    assert F.left_shift(t(np.array([1, 2], np.int8)), 2).dtype == np.int8
    u = np.array([[200], [7]], np.uint8)
    assert F.right_shift(t(u), t(np.array([1, 2], np.uint8))).tolist() == \
        np.right_shift(u, np.array([1, 2], np.uint8)).tolist()
    with pytest.raises(TypeError):
        F.left_shift(t([1.0]), 1)


def test_hswish_hsigmoid_prelu_logsigmoid():
    x = np.linspace(-5, 5, 41).astype(np.float32)
    relu6 = np.clip(x + 3, 0, 6)
    np.testing.assert_allclose(F.hswish(t(x)).numpy(), x * relu6 / 6, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(F.hsigmoid(t(x)).numpy(), relu6 / 6, rtol=1e-6, atol=1e-7)
    a = RNG.standard_normal((1, 3, 1)).astype(np.float32)
    xs = RNG.standard_normal((2, 3, 4)).astype(np.float32)
    np.testing.assert_allclose(F.prelu(t(xs), t(a)).numpy(),
                               np.maximum(xs, 0) + a * np.minimum(xs, 0), rtol=1e-6)
    np.testing.assert_allclose(F.logsigmoid(t(x)).numpy(),
                               -np.logaddexp(0, -x.astype(np.float64)), rtol=1e-6, atol=1e-7)
    assert F.logsigmoid(t([-200.0])).tolist() == [-200.0]
    assert F.prelu(t(np.array([-4, 2], np.int32)), 0.5).tolist() == [-2.0, 2.0]
    with pytest.raises(ValueError, match="prelu: x of shape"):
        F.prelu(t(xs), t(np.ones(4, np.float32)[:2]))


# ------------------------------------------------------------ reductions

def _logsumexp(x, axis, keepdims=False):
    m = np.max(x, axis=axis, keepdims=True)
    m = np.where(np.isfinite(m), m, 0)
    y = np.log(np.sum(np.exp(x - m), axis=axis, keepdims=True)) + m
    return y if keepdims else np.squeeze(y, axis=axis)


@pytest.mark.parametrize("axis", [0, 1, -1, (0, 2), (2, 0, 1)])
@pytest.mark.parametrize("keepdims", [False, True])
def test_logsumexp_against_numpy(axis, keepdims):
    x = (RNG.standard_normal((3, 4, 5)) * 30).astype(np.float32)
    got = F.logsumexp(t(x), axis, keepdims)
    want = _logsumexp(x.astype(np.float64), axis, keepdims)
    assert got.shape == want.shape and got.dtype == np.float32
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-5)


def test_logsumexp_edges():
    inf = math.inf
    x = np.array([[-inf, -inf], [inf, 1.0], [1e30, 1e30], [np.nan, 1.0]], np.float32)
    got = F.logsumexp(t(x), 1).numpy()
    assert got[0] == -inf and got[1] == inf and np.isnan(got[3])
    np.testing.assert_allclose(got[2], 1e30 + math.log(2), rtol=1e-6)
    assert F.logsumexp(t(np.array([1, 2], np.int32)), 0).dtype == np.float32
    with pytest.raises(IndexError, match="logsumexp: axis 3 is out of bounds"):
        F.logsumexp(t(x), 3)
    with pytest.raises(ValueError, match="logsumexp: repeated axis"):
        F.logsumexp(t(x), (0, -2))


def test_logsumexp_of_empty_axes_is_minus_inf():
    # NumPy: log(sum(exp([]))) = log(0) = -inf; the empty line has no max to shift by
    e = np.zeros((0, 3), np.float32)
    np.testing.assert_array_equal(F.logsumexp(t(e), 0).numpy(), np.full(3, -np.inf, np.float32))
    assert F.logsumexp(t(e), 1).shape == (0,)
    np.testing.assert_array_equal(F.logsumexp(t(e.T), 1, keepdims=True).numpy(),
                                  np.full((3, 1), -np.inf, np.float32))


def test_logsoftmax_against_numpy_and_megengine_example():
    x = np.arange(-5, 5, dtype=np.float32).reshape(2, 5)
    np.testing.assert_allclose(F.logsoftmax(t(x), axis=1).numpy(),
                               np.array([[-4.4519, -3.4519, -2.4519, -1.4519, -0.4519]] * 2),
                               atol=1e-4)
    y = RNG.standard_normal((2, 3, 4)).astype(np.float32)
    for axis in (0, (1, 2), (0, 2)):
        np.testing.assert_allclose(F.logsoftmax(t(y), axis).numpy(),
                                   y - _logsumexp(y.astype(np.float64), axis, True), rtol=1e-5,
                                   atol=1e-6)


# ------------------------------------------------------------ math

def test_cross_against_numpy():
    a = RNG.standard_normal((4, 3)).astype(np.float32)
    b = RNG.standard_normal((1, 3)).astype(np.float32)
    np.testing.assert_allclose(F.cross(t(a), t(b)).numpy(), np.cross(a, b), rtol=1e-5, atol=1e-6)
    a2 = RNG.standard_normal((3, 2, 5))
    b2 = RNG.standard_normal((5, 3))
    got = F.cross(t(a2), t(b2), axisa=0, axisb=-1, axisc=1)
    np.testing.assert_allclose(got.numpy(), np.cross(a2, b2, axisa=0, axisb=-1, axisc=1),
                               rtol=1e-12)
    got = F.cross(t(a2), t(a2[::-1].copy()), axis=0)
    np.testing.assert_allclose(got.numpy(), np.cross(a2, a2[::-1], axis=0), rtol=1e-12)
    # 2-vectors: the third component is 0 (MegEngine)
    assert F.cross(t([1.0, 2.0]), t([3.0, 4.0, 5.0])).tolist() == \
        np.cross([1.0, 2.0, 0.0], [3.0, 4.0, 5.0]).tolist()
    assert F.cross(t(np.array([[1, 0, 0]], np.int32)), t(np.array([[0, 1, 0]], np.int32))).tolist() \
        == [[0, 0, 1]]
    with pytest.raises(ValueError, match="cross: the vectors of a must have 2 or 3"):
        F.cross(t(np.ones((2, 4))), t(np.ones((2, 3))))
    with pytest.raises(IndexError, match="cross: axisb 2 is out of bounds"):
        F.cross(t(np.ones((2, 3))), t(np.ones((2, 3))), axisb=2)


# ------------------------------------------------------------ tensor

@pytest.mark.parametrize("k", [-3, -1, 0, 1, 2, 5])
def test_diag_against_numpy(k):
    v = np.array([1, -2, 3], np.int16)
    got = F.diag(t(v), k)
    assert got.dtype == np.int16 and got.tolist() == np.diag(v, k).tolist()
    m = np.arange(12, dtype=np.float32).reshape(3, 4)
    got = F.diag(t(m), k)
    assert got.dtype == np.float32 and got.tolist() == np.diag(m, k).tolist()
    assert F.diag(t(m.T), k).tolist() == np.diag(m.T, k).tolist()     # a strided view


def test_diag_errors():
    with pytest.raises(ValueError, match="diag: inp must be 1-d or 2-d"):
        F.diag(t(np.ones((2, 2, 2))))
    with pytest.raises(TypeError, match="diag: k must be an int"):
        F.diag(t([1, 2]), 1.0)


@pytest.mark.parametrize("indexing", ["xy", "ij"])
def test_meshgrid_against_numpy(indexing):
    a, b, c = np.arange(2), np.arange(3, dtype=np.float32) / 2, np.array([7, 8, 9, 10], np.int8)
    for ins in ((a,), (a, b), (a, b, c)):
        got = F.meshgrid(*[t(v) for v in ins], indexing=indexing)
        want = np.meshgrid(*ins, indexing=indexing)
        assert isinstance(got, list) and len(got) == len(want)
        for g, w in zip(got, want):
            assert g.dtype == w.dtype and g.tolist() == w.tolist()
    with pytest.raises(ValueError, match="meshgrid: indexing must be 'xy' or 'ij'"):
        F.meshgrid(t(a), indexing="yx")
    with pytest.raises(ValueError, match="meshgrid: every input must be 1-d, input 1"):
        F.meshgrid(t(a), t(np.ones((2, 2))))


@pytest.mark.parametrize("shift, axis", [(1, None), (-7, None), (2, 0), (-1, 1), ((1, 2), (0, 2)),
                                         ((1, 1, -3), (1, 1, 2)), (0, 1), (13, -1)])
def test_roll_against_numpy(shift, axis):
    x = np.arange(60).reshape(3, 4, 5).astype(np.int32)
    assert F.roll(t(x), shift, axis).tolist() == np.roll(x, shift, axis).tolist()


def test_roll_errors_and_empty():
    assert F.roll(t(np.zeros((0, 3))), 2, 0).shape == (0, 3)
    with pytest.raises(ValueError, match="roll: shift and axis must have the same length"):
        F.roll(t([1, 2]), (1, 2), 0)
    with pytest.raises(IndexError, match="roll: axis 2 is out of bounds"):
        F.roll(t([[1, 2]]), 1, 2)


def test_swapaxes_against_numpy():
    x = np.arange(24).reshape(2, 3, 4)
    for a, b in ((0, 2), (1, -1), (2, 2)):
        assert F.swapaxes(t(x), a, b).tolist() == np.swapaxes(x, a, b).tolist()
    with pytest.raises(IndexError, match="swapaxes: axis2 3 is out of bounds"):
        F.swapaxes(t(x), 0, 3)


def test_cond_take_against_numpy():
    x = RNG.standard_normal((3, 4)).astype(np.float32)
    mask = x > 0.2
    v, i = F.cond_take(t(mask), t(x))
    assert v.dtype == np.float32 and i.dtype == np.int32
    assert v.tolist() == x[mask].tolist() and i.tolist() == np.flatnonzero(mask).tolist()
    v, i = F.cond_take(t(np.zeros((2, 2), bool)), t(np.ones((2, 2))))
    assert v.shape == (0,) and i.shape == (0,)
    with pytest.raises(TypeError, match="cond_take: mask must be a bool tensor, got int32"):
        F.cond_take(t(np.ones(2, np.int32)), t(np.ones(2)))
    with pytest.raises(ValueError, match="cond_take: mask has shape"):
        F.cond_take(t(np.ones(2, bool)), t(np.ones(3)))
    with pytest.raises(TypeError, match="cond_take: x must be a Tensor"):
        F.cond_take(t(np.ones(2, bool)), np.ones(2))


def test_non_zero_against_numpy():
    x = np.array([[0, 1, 0], [2, 0, 3]], np.int8)
    got = F.non_zero(t(x))
    assert got.dtype == np.int32 and got.tolist() == np.argwhere(x).tolist()
    tup = F.non_zero(t(x), as_tuple=True)
    assert isinstance(tup, tuple) and [c.tolist() for c in tup] == [c.tolist() for c in np.nonzero(x)]
    assert F.non_zero(t([1, 1, 0, 1]), as_tuple=True)[0].tolist() == [0, 1, 3]
    with pytest.raises(TypeError, match="non_zero: condition must be a Tensor"):
        F.non_zero([1, 0])


# ------------------------------------------------------------ nn

def test_indexing_one_hot_against_numpy():
    src = RNG.standard_normal((2, 5, 3)).astype(np.float32)
    idx = RNG.integers(0, 5, size=(2, 3)).astype(np.int32)
    want = np.take_along_axis(src, idx[:, None, :], axis=1)
    assert F.indexing_one_hot(t(src), t(idx)).tolist() == want[:, 0, :].tolist()
    assert F.indexing_one_hot(t(src), t(idx), keepdims=True).tolist() == want.tolist()
    idx2 = RNG.integers(0, 3, size=(2, 5))
    assert F.indexing_one_hot(t(src), t(idx2), axis=-1).tolist() == \
        np.take_along_axis(src, idx2[..., None], axis=2)[..., 0].tolist()
    assert F.indexing_one_hot(t([[1.0, 2.0]]), t([0])).tolist() == [1.0]    # MegEngine's example
    with pytest.raises(ValueError, match="indexing_one_hot: index must have src's shape"):
        F.indexing_one_hot(t(src), t(idx[:, :2]))
    with pytest.raises(IndexError, match="indexing_one_hot: index holds a value outside 0..4"):
        F.indexing_one_hot(t(src), t(idx + 5))
    with pytest.raises(TypeError, match="indexing_one_hot: index must be an integer tensor"):
        F.indexing_one_hot(t(src), t(idx.astype(np.float32)))


def _pixel_shuffle_ref(x, r):
    *b, c, h, w = x.shape
    out = np.empty(tuple(b) + (c // (r * r), h * r, w * r), x.dtype)
    for oc in range(c // (r * r)):
        for i in range(h * r):
            for j in range(w * r):
                out[..., oc, i, j] = x[..., oc * r * r + (i % r) * r + j % r, i // r, j // r]
    return out


@pytest.mark.parametrize("shape, r", [((1, 4, 2, 3), 2), ((2, 18, 2, 2), 3), ((3, 2, 4, 1, 2), 1),
                                      ((8, 3, 2), 2), ((2, 3, 8, 2, 1), 2)])
def test_pixel_shuffle_against_a_loop(shape, r):
    x = RNG.standard_normal(shape).astype(np.float32)
    got = F.pixel_shuffle(t(x), r)
    np.testing.assert_array_equal(got.numpy(), _pixel_shuffle_ref(x, r))


def test_pixel_shuffle_errors():
    x = t(RNG.standard_normal((2, 8, 3, 4)).astype(np.float32))
    with pytest.raises(ValueError, match="pixel_shuffle: the 8 channels are not divisible by"):
        F.pixel_shuffle(x, 3)
    with pytest.raises(ValueError, match="pixel_shuffle: inp must be"):
        F.pixel_shuffle(x[0, 0], 2)
    with pytest.raises(ValueError, match="upscale_factor must be >= 1"):
        F.pixel_shuffle(x, 0)


def test_pixel_shuffle_against_torch():
    torch = pytest.importorskip("torch")
    x = RNG.standard_normal((2, 3, 18, 3, 4)).astype(np.float32)
    want = torch.nn.functional.pixel_shuffle(torch.from_numpy(x), 3).numpy()
    np.testing.assert_array_equal(F.pixel_shuffle(t(x), 3).numpy(), want)


def _norm_ref(x, axes, w=None, b=None, eps=1e-5):
    x = x.astype(np.float64)
    m = x.mean(axis=axes, keepdims=True)
    v = x.var(axis=axes, keepdims=True)
    y = (x - m) / np.sqrt(v + eps)
    return y if w is None else y * w + b


def test_instance_norm_against_numpy():
    x = RNG.standard_normal((2, 3, 4, 5)).astype(np.float32)
    w = RNG.standard_normal(3).astype(np.float32)
    b = RNG.standard_normal(3).astype(np.float32)
    np.testing.assert_allclose(F.instance_norm(t(x), False).numpy(), _norm_ref(x, (2, 3)),
                               rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(F.instance_norm(t(x), True, t(w), t(b), eps=1e-3).numpy(),
                               _norm_ref(x, (2, 3), w[:, None, None], b[:, None, None], 1e-3),
                               rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="instance_norm: affine=True needs both weight and bias"):
        F.instance_norm(t(x), True, t(w))
    with pytest.raises(ValueError, match="instance_norm: weight must have shape"):
        F.instance_norm(t(x), True, t(w[:2]), t(b))
    with pytest.raises(TypeError, match="instance_norm"):
        F.instance_norm(t(x.astype(np.int32)), False)


@pytest.mark.parametrize("axes", [0, (1,), (1, 2), (0, -1), (-3, -2, -1)])
def test_general_norm_against_numpy(axes):
    x = RNG.standard_normal((2, 3, 4, 5)).astype(np.float32)
    ax = tuple(a % 4 for a in (axes if isinstance(axes, tuple) else (axes,)))
    shape = tuple(x.shape[a] for a in ax)
    w = RNG.standard_normal(shape).astype(np.float32)
    b = RNG.standard_normal(shape).astype(np.float32)
    bshape = tuple(x.shape[a] if a in ax else 1 for a in range(4))
    got = F.general_norm(t(x), axes, True, t(w), t(b), 1e-4)
    np.testing.assert_allclose(got.numpy(), _norm_ref(x, ax, w.reshape(bshape), b.reshape(bshape),
                                                      1e-4), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(F.general_norm(t(x), axes, affine=False).numpy(),
                               _norm_ref(x, ax), rtol=1e-4, atol=1e-5)


def test_general_norm_errors():
    x = t(np.ones((2, 3, 4), np.float32))
    with pytest.raises(ValueError, match="general_norm: normalized_axis must be ascending"):
        F.general_norm(x, (2, 0), affine=False)
    with pytest.raises(ValueError, match="general_norm: repeated axis"):
        F.general_norm(x, (2, -1), affine=False)
    with pytest.raises(ValueError, match=r"general_norm: weight must have the normalized axes' shape \(3,\)"):
        F.general_norm(x, 1, True, t(np.ones(4, np.float32)), t(np.ones(3, np.float32)))
    with pytest.raises(ValueError, match="general_norm: affine=True needs both"):
        F.general_norm(x, 1)


def _lrn_ref(x, n, k, alpha, beta):
    x = x.astype(np.float64)
    c = x.shape[1]
    out = np.empty_like(x)
    for ch in range(c):
        lo, hi = max(0, ch - n // 2), min(c, ch + n // 2 + 1)
        out[:, ch] = x[:, ch] / (k + alpha * (x[:, lo:hi] ** 2).sum(axis=1)) ** beta
    return out


@pytest.mark.parametrize("n, k, alpha, beta", [(5, 2.0, 1e-4, 0.75), (3, 1.0, 0.1, 0.5),
                                               (1, 0.5, 0.3, 1.0), (7, 1.0, 0.05, 0.75)])
def test_local_response_norm_against_a_loop(n, k, alpha, beta):
    x = RNG.standard_normal((2, 6, 3, 4)).astype(np.float32) * 3
    got = F.local_response_norm(t(x), n, k, alpha, beta)
    np.testing.assert_allclose(got.numpy(), _lrn_ref(x, n, k, alpha, beta), rtol=1e-5, atol=1e-6)


def test_local_response_norm_megengine_example_and_torch():
    # MegEngine 1.13's doctest values (its LRN kernel)
    inp = np.arange(25, dtype=np.float32).reshape(1, 1, 5, 5)
    gt = [[0., 0.999925, 1.9994003, 2.9979765, 3.9952066],
          [4.9906454, 5.983851, 6.974385, 7.961814, 8.945709],
          [9.925651, 10.90122, 11.872011, 12.837625, 13.7976675],
          [14.751757, 15.699524, 16.640602, 17.574642, 18.501305],
          [19.420258, 20.331186, 21.233786, 22.127764, 23.012836]]
    out = F.local_response_norm(t(inp), kernel_size=3, k=1.0, alpha=1e-4, beta=0.75)
    np.testing.assert_allclose(out.numpy()[0, 0], gt, rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match="local_response_norm: kernel_size must be odd"):
        F.local_response_norm(t(inp), 4)
    torch = pytest.importorskip("torch")
    x = RNG.standard_normal((2, 7, 3, 3)).astype(np.float32)
    want = torch.nn.functional.local_response_norm(torch.from_numpy(x), 5, alpha=0.05 * 5,
                                                   beta=0.75, k=1.5).numpy()
    np.testing.assert_allclose(F.local_response_norm(t(x), 5, 1.5, 0.05, 0.75).numpy(), want,
                               rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("eps_mode", ["additive", "max"])
def test_sync_batch_norm_is_batch_norm_in_one_process(eps_mode):
    x = RNG.standard_normal((4, 3, 2, 2)).astype(np.float32)
    x[:, 1] *= 1e-3          # a tiny variance, where max(var, eps) differs from var + eps
    eps = 1e-4
    rm, rv = np.zeros(3, np.float32), np.ones(3, np.float32)
    tm, tv = t(rm.copy()), t(rv.copy())
    y = F.sync_batch_norm(t(x), tm, tv, training=True, momentum=0.9, eps=eps, eps_mode=eps_mode)
    var = x.astype(np.float64).var(axis=(0, 2, 3), keepdims=True)
    mean = x.astype(np.float64).mean(axis=(0, 2, 3), keepdims=True)
    den = np.sqrt(var + eps) if eps_mode == "additive" else np.sqrt(np.maximum(var, eps))
    np.testing.assert_allclose(y.numpy(), (x - mean) / den, rtol=1e-4, atol=1e-5)
    n = x.size // 3
    np.testing.assert_allclose(tm.numpy(), 0.1 * mean.ravel(), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(tv.numpy(), 0.9 + 0.1 * var.ravel() * n / (n - 1), rtol=1e-5)
    w, b = t(np.array([1.0, 2.0, 3.0], np.float32)), t(np.array([0.5, 0.0, -1.0], np.float32))
    y = F.sync_batch_norm(t(x), tm, tv, w, b, training=False, eps=eps, eps_mode=eps_mode)
    rvar = tv.numpy().reshape(1, 3, 1, 1).astype(np.float64)
    den = np.sqrt(rvar + eps) if eps_mode == "additive" else np.sqrt(np.maximum(rvar, eps))
    want = (x - tm.numpy().reshape(1, 3, 1, 1)) / den * w.numpy().reshape(1, 3, 1, 1) \
        + b.numpy().reshape(1, 3, 1, 1)
    np.testing.assert_allclose(y.numpy(), want, rtol=1e-4, atol=1e-5)


def test_sync_batch_norm_errors():
    x = t(np.ones((2, 3), np.float32))
    with pytest.raises(ValueError, match="sync_batch_norm: eps_mode must be"):
        F.sync_batch_norm(x, None, None, eps_mode="mul")
    with pytest.raises(ValueError, match="sync_batch_norm: mgtrace runs in one process"):
        F.sync_batch_norm(x, None, None, group="WORLD")
    with pytest.raises(ValueError, match="sync_batch_norm: running_mean and running_var are needed"):
        F.sync_batch_norm(x, None, None)


# ------------------------------------------------------------ svd

@pytest.mark.parametrize("shape, dtype", [((5, 3), "float64"), ((3, 5), "float64"),
                                          ((2, 4, 4), "float32"), ((2, 3, 6, 4), "float32"),
                                          ((1, 1), "float64"), ((0, 3), "float32")])
def test_svd_against_numpy(shape, dtype):
    a = RNG.standard_normal(shape).astype(dtype)
    u, s, vh = F.svd(t(a))
    k = min(shape[-2:])
    assert (u.shape, s.shape, vh.shape) == (shape[:-1] + (k,), shape[:-2] + (k,),
                                            shape[:-2] + (k, shape[-1]))
    assert u.dtype == s.dtype == vh.dtype == np.dtype(dtype)
    tol = 1e-12 if dtype == "float64" else 2e-5
    np.testing.assert_allclose(s.numpy(), np.linalg.svd(a, compute_uv=False), rtol=tol, atol=tol)
    if a.size:
        rec = np.einsum("...ik,...k,...kj->...ij", u.numpy(), s.numpy(), vh.numpy())
        np.testing.assert_allclose(rec, a, rtol=tol * 10, atol=tol * 10)
        eye = np.eye(k)
        np.testing.assert_allclose(np.swapaxes(u.numpy(), -1, -2) @ u.numpy(),
                                   np.broadcast_to(eye, shape[:-2] + (k, k)), atol=tol * 10)
        np.testing.assert_allclose(vh.numpy() @ np.swapaxes(vh.numpy(), -1, -2),
                                   np.broadcast_to(eye, shape[:-2] + (k, k)), atol=tol * 10)


def test_svd_edges_and_errors():
    _, s, _ = F.svd(t(np.array([[1.0, 2.0], [2.0, 4.0]])))      # rank 1
    np.testing.assert_allclose(s.numpy(), [5.0, 0.0], atol=1e-12)
    assert F.svd(t(np.eye(3)), compute_uv=False)[0] is None
    assert F.svd(t(np.diag([1.0, 3.0, 2.0])))[1].tolist() == [3.0, 2.0, 1.0]
    with pytest.raises(ValueError, match="svd: full_matrices=True needs square matrices"):
        F.svd(t(np.ones((3, 2))), full_matrices=True)
    with pytest.raises(ValueError, match=r"svd: inp must be \[..., M, N\]"):
        F.svd(t(np.ones(3)))
    with pytest.raises(TypeError, match="svd: inp must be a floating-point tensor"):
        F.svd(t(np.ones((2, 2), np.int32)))


def test_pad_of_none_is_a_type_error_not_a_garbage_shape():
    # the core's pad read None as a Tensor: "an output of shape (2, 140017321408760, ...)"
    with pytest.raises(TypeError, match="pad: x must be a tensor, got None"):
        F.pad(None, 1)
    np.testing.assert_array_equal(F.pad(t(np.array([1, 2], np.int32)), 1).numpy(),
                                  np.pad(np.array([1, 2], np.int32), 1))
