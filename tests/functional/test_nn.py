"""mgtrace.functional.nn against NumPy references and PyTorch (importorskip):
layers, pooling, normalization (incl. MegEngine's momentum convention),
activations, softmax, dropout, embedding, pad, interpolate; argument errors
must name the argument.
"""
import numpy as np
import pytest

import mgtrace as mt
import mgtrace.functional as F
import mgtrace.random as R


def rand(rng, *shape, dtype="float32"):
    return rng.standard_normal(shape).astype(dtype)


def close(actual, expected, tol=1e-5):
    a = actual.numpy() if isinstance(actual, mt.Tensor) else np.asarray(actual)
    e = np.asarray(expected)
    assert a.shape == e.shape, f"{a.shape} != {e.shape}"
    scale = max(1.0, float(np.abs(e).max())) if e.size else 1.0
    np.testing.assert_allclose(a.astype(np.float64), e.astype(np.float64), rtol=tol, atol=tol * scale)


@pytest.fixture
def torch():
    return pytest.importorskip("torch")


def T(torch, a):
    return torch.from_numpy(np.ascontiguousarray(a))


# ------------------------------------------------------------------ linear, conv

def test_linear_matches_numpy(rng):
    x, w, b = rand(rng, 2, 3, 4), rand(rng, 5, 4), rand(rng, 5)
    close(F.linear(mt.tensor(x), mt.tensor(w), mt.tensor(b)), x @ w.T + b)
    close(F.linear(x, w), x @ w.T)                        # NumPy arrays accepted
    close(F.linear(mt.tensor(x[0, 0]), mt.tensor(w)), x[0, 0] @ w.T)


def test_linear_promotes_int_input(rng):
    w = rand(rng, 3, 2)
    y = F.linear(mt.tensor([[1, 2]]), mt.tensor(w))
    assert y.dtype == np.float32
    close(y, np.array([[1, 2]], np.float32) @ w.T)


def test_linear_errors():
    with pytest.raises(ValueError, match="linear: x has 5 features but weight expects 4"):
        F.linear(mt.tensor(np.zeros((2, 5), np.float32)), mt.tensor(np.zeros((3, 4), np.float32)))
    with pytest.raises(ValueError, match=r"linear: weight must be 2-d \[out_features, in_features\]"):
        F.linear(mt.tensor(np.zeros((2, 4), np.float32)), mt.tensor(np.zeros(4, np.float32)))
    with pytest.raises(ValueError, match=r"linear: bias must have shape \(3,\)"):
        F.linear(np.zeros((2, 4), np.float32), np.zeros((3, 4), np.float32), np.zeros(4, np.float32))
    with pytest.raises(TypeError, match="linear: x must be"):
        F.linear("x", np.zeros((3, 4), np.float32))


@pytest.mark.parametrize("stride,padding,dilation,groups", [(1, 0, 1, 1), (2, 1, 1, 1), (1, 2, 2, 2),
                                                            ((2, 1), (1, 0), 1, 4)])
def test_conv2d_matches_torch(torch, rng, stride, padding, dilation, groups):
    x, w, b = rand(rng, 2, 4, 9, 8), rand(rng, 8, 4 // groups, 3, 3), rand(rng, 8)
    ref = torch.nn.functional.conv2d(T(torch, x), T(torch, w), T(torch, b), stride, padding, dilation,
                                     groups).numpy()
    close(F.conv2d(mt.tensor(x), mt.tensor(w), mt.tensor(b), stride, padding, dilation, groups), ref)
    # MegEngine's [1, O, 1, 1] bias gives the same result
    close(F.conv2d(mt.tensor(x), mt.tensor(w), mt.tensor(b.reshape(1, 8, 1, 1)), stride, padding,
                   dilation, groups), ref)


def test_conv2d_errors():
    x = mt.tensor(np.zeros((1, 3, 5, 5), np.float32))
    with pytest.raises(ValueError, match=r"conv2d: weight must be 4-d \[O, C/groups, KH, KW\], got shape \(3, 3\)"):
        F.conv2d(x, mt.tensor(np.zeros((3, 3), np.float32)))
    with pytest.raises(ValueError, match=r"conv2d: x must be 4-d \[N, C, H, W\]"):
        F.conv2d(mt.tensor(np.zeros((3, 5, 5), np.float32)), mt.tensor(np.zeros((2, 3, 3, 3), np.float32)))
    with pytest.raises(ValueError, match="conv2d: x has 3 channels but weight expects 4"):
        F.conv2d(x, mt.tensor(np.zeros((2, 4, 3, 3), np.float32)))
    with pytest.raises(ValueError, match="conv2d: groups=2 must divide the 3 input channels"):
        F.conv2d(x, mt.tensor(np.zeros((2, 3, 3, 3), np.float32)), groups=2)
    with pytest.raises(ValueError, match=r"conv2d: bias must have shape \(2,\)"):
        F.conv2d(x, mt.tensor(np.zeros((2, 3, 3, 3), np.float32)), mt.tensor(np.zeros(3, np.float32)))
    with pytest.raises(TypeError, match="conv2d: x must be a floating-point tensor, got int32"):
        F.conv2d(mt.tensor(np.zeros((1, 3, 5, 5), np.int32)), mt.tensor(np.zeros((2, 3, 3, 3), np.float32)))
    with pytest.raises(ValueError, match="conv2d: stride must be >= 1"):
        F.conv2d(x, mt.tensor(np.zeros((2, 3, 3, 3), np.float32)), stride=0)
    with pytest.raises(TypeError, match="conv2d: padding must be an int"):
        F.conv2d(x, mt.tensor(np.zeros((2, 3, 3, 3), np.float32)), padding=1.5)
    with pytest.raises(TypeError, match="conv2d: weight must be a tensor, got None"):
        F.conv2d(x, None)


@pytest.mark.parametrize("kw", [{"stride": ()}, {"stride": 0}, {"padding": -1}, {"kernel_size": (2, 2, 2)},
                                {"dilation": (1,)}])
def test_max_pool2d_nchwc_checks_arguments_as_max_pool2d(kw):
    x = mt.tensor(np.zeros((1, 16, 4, 4), np.float32))
    args = {"kernel_size": 2, **kw}
    with pytest.raises(ValueError) as plain:
        F.max_pool2d(x, **args)
    with pytest.raises(ValueError) as blocked:
        F.max_pool2d_nchwc(F.to_nchwc(x), **args)
    assert str(blocked.value) == str(plain.value).replace("max_pool2d", "max_pool2d_nchwc")


def test_conv2d_nchwc_residual_that_does_not_broadcast_names_the_op():
    x = F.to_nchwc(mt.tensor(np.ones((1, 20, 7, 7), np.float32)))
    w = mt.tensor(np.ones((33, 20, 3, 3), np.float32))
    with pytest.raises(ValueError, match=r"conv2d_nchwc: residual of shape \(1, 33, 5, 5\) does not "
                                         r"broadcast to the NCHW16c output's shape \(1, 3, 5, 5, 16\)"):
        F.conv2d_nchwc(x, w, residual=mt.tensor(np.ones((1, 33, 5, 5), np.float32)))
    # one that broadcasts is added after the kernel (a graph traced at batch 1, run at batch 2)
    r = F.to_nchwc(mt.tensor(np.full((1, 33, 5, 5), 2.0, np.float32)))
    x2 = F.to_nchwc(mt.tensor(np.ones((2, 20, 7, 7), np.float32)))
    y = F.from_nchwc(F.conv2d_nchwc(x2, w, residual=r), 33).numpy()
    np.testing.assert_array_equal(y, np.full((2, 33, 5, 5), 20 * 9 + 2.0, np.float32))


def test_conv2d_nchwc_residual_of_another_dtype_is_added_as_plus_adds_it():
    x = F.to_nchwc(mt.tensor(np.ones((1, 2, 4, 4), np.float32)))
    w = mt.tensor(np.ones((3, 2, 3, 3), np.float32))
    r = np.full((1, 1, 1, 1, 16), 0.5, np.float64)
    y = F.conv2d_nchwc(x, w, residual=mt.tensor(r))
    assert y.dtype == "float64"       # + promotes float32 with float64
    np.testing.assert_array_equal(y.numpy()[..., :3], np.full((1, 1, 2, 2, 3), 2 * 9 + 0.5))
    # so is one of the output's shape (the kernel takes float32 only): the promotion of +
    y = F.conv2d_nchwc(x, w, residual=mt.tensor(np.ones((1, 1, 2, 2, 16), np.float64)))
    assert y.dtype == "float64"
    np.testing.assert_array_equal(F.from_nchwc(y, 3).numpy(), np.full((1, 3, 2, 2), 2 * 9 + 1.0))


def test_nchwc_output_past_the_element_limit_names_the_op():
    e = mt.tensor(np.zeros(0, np.float32))
    with pytest.raises(ValueError, match=r"conv2d_nchwc: the output: tensor too large"):
        F.conv2d_nchwc(e.reshape(2 ** 40, 0, 4, 4, 16), e.reshape(2 ** 27, 0, 1, 1))


def test_nchwc_convolution_errors_name_the_argument():
    x = F.to_nchwc(mt.tensor(np.zeros((1, 2, 4, 4), np.float32)))
    w, dw = mt.tensor(np.zeros((20, 2, 1, 1), np.float32)), mt.tensor(np.zeros((20, 1, 3, 3), np.float32))
    with pytest.raises(TypeError, match="conv2d_nchwc_pw_dw: weight must be a tensor, got None"):
        F.conv2d_nchwc_pw_dw(x, None, None, dw, None)
    with pytest.raises(TypeError, match="conv2d_nchwc_pw_dw: dw_weight must be a tensor, got None"):
        F.conv2d_nchwc_pw_dw(x, w, None, None, None)
    with pytest.raises(ValueError, match=r"conv2d_nchwc_pw_dw: dw_bias must have shape \(20,\)"):
        F.conv2d_nchwc_pw_dw(x, w, None, dw, mt.tensor(np.zeros(19, np.float32)))
    with pytest.raises(TypeError, match="conv2d_nchwc: weight must be a tensor, got None"):
        F.conv2d_nchwc(x, None, residual=x)
    with pytest.raises(TypeError, match="conv2d_nchwc: x must be a tensor, got None"):
        F.conv2d_nchwc(None, w, residual=x)
    # a pointwise conv's residual takes the fast path only for plain spellings
    w1, r = mt.tensor(np.ones((16, 2, 1, 1), np.float32)), F.to_nchwc(mt.tensor(np.ones((1, 16, 4, 4), np.float32)))
    with pytest.raises(TypeError, match="conv2d_nchwc: stride must be an int, got ndarray"):
        F.conv2d_nchwc(x, w1, stride=np.array([1, 1]), residual=r)
    np.testing.assert_array_equal(F.conv2d_nchwc(x, w1, stride=[1, 1], padding=np.int64(0), residual=r).numpy(),
                                  F.conv2d_nchwc(x, w1, residual=r).numpy())


@pytest.mark.parametrize("stride,padding,dilation,groups", [(1, 0, 1, 1), (2, 1, 2, 2)])
def test_conv1d_matches_torch(torch, rng, stride, padding, dilation, groups):
    x, w, b = rand(rng, 2, 4, 11), rand(rng, 6, 4 // groups, 3), rand(rng, 6)
    ref = torch.nn.functional.conv1d(T(torch, x), T(torch, w), T(torch, b), stride, padding, dilation,
                                     groups).numpy()
    close(F.conv1d(mt.tensor(x), mt.tensor(w), mt.tensor(b), stride, padding, dilation, groups), ref)


def test_conv1d_errors():
    with pytest.raises(ValueError, match=r"conv1d: weight must be 3-d \[O, C/groups, K\]"):
        F.conv1d(mt.tensor(np.zeros((1, 2, 5), np.float32)), mt.tensor(np.zeros((2, 2, 1, 3), np.float32)))
    with pytest.raises(ValueError, match="conv1d: x has 2 channels but weight expects 3"):
        F.conv1d(mt.tensor(np.zeros((1, 2, 5), np.float32)), mt.tensor(np.zeros((2, 3, 3), np.float32)))


@pytest.mark.parametrize("stride,padding,output_padding,groups", [(1, 0, 0, 1), (2, 1, 1, 1), (2, 0, 1, 2)])
def test_conv_transpose2d_matches_torch(torch, rng, stride, padding, output_padding, groups):
    x, w, b = rand(rng, 2, 4, 5, 6), rand(rng, 4, 6 // groups, 3, 3), rand(rng, 6)
    ref = torch.nn.functional.conv_transpose2d(T(torch, x), T(torch, w), T(torch, b), stride, padding,
                                               output_padding, groups).numpy()
    close(F.conv_transpose2d(mt.tensor(x), mt.tensor(w), mt.tensor(b), stride, padding, output_padding,
                             1, groups), ref)


def test_conv_transpose2d_errors():
    with pytest.raises(ValueError, match="conv_transpose2d: x has 3 channels but weight.shape.0. is 4"):
        F.conv_transpose2d(mt.tensor(np.zeros((1, 3, 4, 4), np.float32)),
                           mt.tensor(np.zeros((4, 2, 3, 3), np.float32)))


# ------------------------------------------------------------------ pooling

def test_max_pool2d_matches_torch(torch, rng):
    x = rand(rng, 2, 3, 9, 8)
    for k, s, p, ceil in [(2, None, 0, False), (3, 2, 1, False), (3, 2, 1, True)]:
        ref = torch.nn.functional.max_pool2d(T(torch, x), k, s, p, ceil_mode=ceil).numpy()
        close(F.max_pool2d(mt.tensor(x), k, s, p, ceil_mode=ceil), ref)


def _ref_max_pool_indices(x, k, s, p, d, oh, ow):
    """NumPy: for each window, the position h * W + w of its first maximum
    (row-major over the window), as PyTorch's return_indices."""
    n, c, h, w = x.shape
    out = np.zeros((n, c, oh, ow), np.int64)
    for i in range(oh):
        for j in range(ow):
            pos = [(y, z) for y in range(i * s[0] - p[0], i * s[0] - p[0] + d[0] * (k[0] - 1) + 1, d[0])
                   for z in range(j * s[1] - p[1], j * s[1] - p[1] + d[1] * (k[1] - 1) + 1, d[1])
                   if 0 <= y < h and 0 <= z < w]
            vals = np.stack([x[:, :, y, z] for y, z in pos], -1)          # [N, C, window]
            out[:, :, i, j] = np.array([y * w + z for y, z in pos])[vals.argmax(-1)]
    return out


@pytest.mark.parametrize("k, s, p, d, ceil", [
    (2, None, 0, 1, False), (3, 2, 1, 1, False), (3, 2, 1, 1, True), ((3, 2), (2, 1), (1, 1), (1, 2), False),
    (2, 1, 1, 2, True)], ids=str)
def test_max_pool2d_return_indices(rng, k, s, p, d, ceil):
    x = rand(rng, 2, 3, 9, 8)
    x[0, 0, :4, :4] = 1.5                       # ties: the first in the window wins
    x[1, 2] = -np.inf                           # all -inf: never a padding position
    y, idx = F.max_pool2d(mt.tensor(x), k, s, p, d, ceil_mode=ceil, return_indices=True)
    np.testing.assert_array_equal(y.numpy(), F.max_pool2d(mt.tensor(x), k, s, p, d, ceil_mode=ceil).numpy())
    assert idx.dtype == np.int64 and idx.shape == y.shape
    pair = lambda v: (v, v) if isinstance(v, int) else v      # noqa: E731
    ref = _ref_max_pool_indices(x, pair(k), pair(k if s is None else s), pair(p), pair(d), *y.shape[2:])
    np.testing.assert_array_equal(idx.numpy(), ref)
    # the index points at the value
    flat = x.reshape(2, 3, -1)
    np.testing.assert_array_equal(np.take_along_axis(flat, idx.numpy().reshape(2, 3, -1), -1),
                                  y.numpy().reshape(2, 3, -1))


def test_max_pool2d_return_indices_match_torch(torch, rng):
    x = rand(rng, 2, 3, 11, 10)
    for k, s, p, d, ceil in [(2, 2, 0, 1, False), (3, 2, 1, 1, True), (3, 1, 1, 2, False)]:
        ty, ti = torch.nn.functional.max_pool2d(T(torch, x), k, s, p, d, ceil_mode=ceil,
                                                return_indices=True)
        y, i = F.max_pool2d(mt.tensor(x), k, s, p, d, ceil_mode=ceil, return_indices=True)
        np.testing.assert_array_equal(y.numpy(), ty.numpy())
        np.testing.assert_array_equal(i.numpy(), ti.numpy())


def test_max_pool2d_return_indices_empty_and_errors():
    y, i = F.max_pool2d(mt.tensor(np.zeros((0, 2, 4, 4), np.float32)), 2, return_indices=True)
    assert y.shape == i.shape == (0, 2, 2, 2) and i.dtype == np.int64
    with pytest.raises(TypeError, match="max_pool2d: return_indices must be a bool, got int"):
        F.max_pool2d(mt.tensor(np.zeros((1, 1, 4, 4), np.float32)), 2, return_indices=1)


def test_avg_pool2d_modes_match_torch(torch, rng):
    x = rand(rng, 2, 3, 8, 8)
    t = T(torch, x)
    ref_ex = torch.nn.functional.avg_pool2d(t, 3, 2, 1, count_include_pad=False).numpy()
    ref_in = torch.nn.functional.avg_pool2d(t, 3, 2, 1, count_include_pad=True).numpy()
    close(F.avg_pool2d(mt.tensor(x), 3, 2, 1), ref_ex)                 # MegEngine's default mode
    close(F.avg_pool2d(mt.tensor(x), 3, 2, 1, mode="average"), ref_in)


def test_adaptive_pools_match_torch(torch, rng):
    x = rand(rng, 2, 3, 7, 9)
    for o in [1, (3, 4), (2, None)]:
        close(F.adaptive_avg_pool2d(mt.tensor(x), o),
              torch.nn.functional.adaptive_avg_pool2d(T(torch, x), o).numpy())
        close(F.adaptive_max_pool2d(mt.tensor(x), o),
              torch.nn.functional.adaptive_max_pool2d(T(torch, x), o).numpy())


def test_pool_errors():
    with pytest.raises(ValueError, match=r"max_pool2d: x must be 4-d \[N, C, H, W\], got shape \(3, 4\)"):
        F.max_pool2d(mt.tensor(np.zeros((3, 4), np.float32)), 2)
    with pytest.raises(TypeError, match="avg_pool2d: x must be a floating-point tensor"):
        F.avg_pool2d(mt.tensor(np.zeros((1, 1, 4, 4), np.int32)), 2)
    with pytest.raises(ValueError, match="avg_pool2d: mode must be one of"):
        F.avg_pool2d(mt.tensor(np.zeros((1, 1, 4, 4), np.float32)), 2, mode="max")
    with pytest.raises(ValueError, match="max_pool2d: kernel_size must be >= 1"):
        F.max_pool2d(mt.tensor(np.zeros((1, 1, 4, 4), np.float32)), 0)
    with pytest.raises(ValueError, match="adaptive_avg_pool2d: oshp must be >= 1"):
        F.adaptive_avg_pool2d(mt.tensor(np.zeros((1, 1, 4, 4), np.float32)), 0)


# ------------------------------------------------------------------ normalization

@pytest.mark.parametrize("shape", [(4, 3), (4, 3, 5), (2, 3, 4, 5)])
def test_batch_norm_inference_matches_torch(torch, rng, shape):
    x = rand(rng, *shape)
    rm, rv = rand(rng, 3), np.abs(rand(rng, 3)) + 0.5
    w, b = rand(rng, 3), rand(rng, 3)
    ref = torch.nn.functional.batch_norm(T(torch, x), T(torch, rm), T(torch, rv), T(torch, w),
                                         T(torch, b), training=False, eps=1e-5).numpy()
    close(F.batch_norm(mt.tensor(x), mt.tensor(rm), mt.tensor(rv), mt.tensor(w), mt.tensor(b)), ref)
    # MegEngine's [1, C, 1, ...] parameter layout
    bshape = (1, 3) + (1,) * (len(shape) - 2)
    close(F.batch_norm(mt.tensor(x), mt.tensor(rm.reshape(bshape)), mt.tensor(rv.reshape(bshape)),
                       mt.tensor(w.reshape(bshape)), mt.tensor(b.reshape(bshape))), ref)


def test_batch_norm_training_updates_running_stats_megengine_momentum(torch, rng):
    x = rand(rng, 4, 3, 5, 5)
    rm, rv = rand(rng, 3), np.abs(rand(rng, 3)) + 0.5
    trm, trv = T(torch, rm.copy()), T(torch, rv.copy())
    # MegEngine momentum 0.9 (weight of the old value) == PyTorch momentum 0.1
    ref = torch.nn.functional.batch_norm(T(torch, x), trm, trv, training=True, momentum=0.1,
                                         eps=1e-5).numpy()
    m_rm, m_rv = mt.tensor(rm), mt.tensor(rv)
    y = F.batch_norm(mt.tensor(x), m_rm, m_rv, training=True, momentum=0.9)
    close(y, ref, 1e-4)
    close(m_rm, trm.numpy())
    close(m_rv, trv.numpy())
    # by hand: the unbiased batch variance goes into the running estimate
    bm = x.mean(axis=(0, 2, 3))
    bv = x.var(axis=(0, 2, 3), ddof=1)
    close(m_rm, 0.9 * rm + 0.1 * bm)
    close(m_rv, 0.9 * rv + 0.1 * bv)


def test_batch_norm_training_not_inplace(rng):
    x = rand(rng, 6, 2)
    rm, rv = mt.tensor([0.0, 0.0]), mt.tensor([1.0, 1.0])
    y, nm, nv = F.batch_norm(mt.tensor(x), rm, rv, training=True, momentum=0.5, inplace=False)
    assert rm.tolist() == [0.0, 0.0] and rv.tolist() == [1.0, 1.0]
    close(nm, 0.5 * x.mean(0))
    close(nv, 0.5 + 0.5 * x.var(0, ddof=1))
    close(y, (x - x.mean(0)) / np.sqrt(x.var(0) + 1e-5), 1e-4)


def test_batch_norm_errors():
    x = mt.tensor(np.zeros((2, 3, 4), np.float32))
    with pytest.raises(ValueError, match=r"batch_norm: running_mean must have shape \(3,\) or \(1, 3, 1, ...\)"):
        F.batch_norm(x, mt.tensor(np.zeros(4, np.float32)), mt.tensor(np.ones(3, np.float32)))
    with pytest.raises(ValueError, match="batch_norm: running_mean and running_var are needed"):
        F.batch_norm(x)
    with pytest.raises(ValueError, match="batch_norm: training needs more than 1 value per channel"):
        F.batch_norm(mt.tensor(np.zeros((1, 3), np.float32)), training=True)
    with pytest.raises(TypeError, match="batch_norm: running_mean must be a Tensor to be updated"):
        F.batch_norm(x, np.zeros(3, np.float32), np.ones(3, np.float32), training=True)
    with pytest.raises(ValueError, match="batch_norm: momentum must be in"):
        F.batch_norm(x, training=True, momentum=1.5)
    with pytest.raises(TypeError, match="batch_norm: x must be a floating-point tensor"):
        F.batch_norm(mt.tensor(np.zeros((2, 3), np.int32)), training=True)


@pytest.mark.parametrize("ns", [5, (4, 5)])
def test_layer_norm_matches_torch(torch, rng, ns):
    x = rand(rng, 2, 3, 4, 5)
    shp = (ns,) if isinstance(ns, int) else ns
    w, b = rand(rng, *shp), rand(rng, *shp)
    ref = torch.nn.functional.layer_norm(T(torch, x), shp, T(torch, w), T(torch, b), 1e-5).numpy()
    close(F.layer_norm(mt.tensor(x), ns, mt.tensor(w), mt.tensor(b)), ref, 1e-4)
    ref = torch.nn.functional.layer_norm(T(torch, x), shp).numpy()
    close(F.layer_norm(mt.tensor(x), ns), ref, 1e-4)


def test_layer_norm_errors():
    x = mt.tensor(np.zeros((2, 3), np.float32))
    with pytest.raises(ValueError, match=r"layer_norm: normalized_shape \(4,\) must be the trailing shape of x"):
        F.layer_norm(x, 4)
    with pytest.raises(ValueError, match=r"layer_norm: weight must have shape \(3,\)"):
        F.layer_norm(x, 3, mt.tensor(np.ones(2, np.float32)))


def test_group_norm_matches_torch(torch, rng):
    x = rand(rng, 2, 6, 4, 3)
    w, b = rand(rng, 6), rand(rng, 6)
    ref = torch.nn.functional.group_norm(T(torch, x), 3, T(torch, w), T(torch, b), 1e-5).numpy()
    close(F.group_norm(mt.tensor(x), 3, mt.tensor(w), mt.tensor(b)), ref, 1e-4)
    with pytest.raises(ValueError, match="group_norm: num_groups=4 must divide the 6 channels of x"):
        F.group_norm(mt.tensor(x), 4)
    with pytest.raises(ValueError, match="group_norm: weight must have shape"):
        F.group_norm(mt.tensor(x), 3, mt.tensor(np.ones(3, np.float32)))


def test_normalize_matches_torch(torch, rng):
    x = rand(rng, 3, 4)
    x[1] = 0
    for ord, axis in [(2, -1), (2, 0), (1, 1)]:
        ref = torch.nn.functional.normalize(T(torch, x), p=ord, dim=axis).numpy()
        close(F.normalize(mt.tensor(x), ord, axis), ref)
    close(F.normalize(mt.tensor(x), axis=None), x / np.linalg.norm(x))


# ------------------------------------------------------------------ activations

ACTS = [
    ("relu", lambda tf, t: tf.relu(t)),
    ("relu6", lambda tf, t: tf.relu6(t)),
    ("silu", lambda tf, t: tf.silu(t)),
    ("hardswish", lambda tf, t: tf.hardswish(t)),
    ("hardsigmoid", lambda tf, t: tf.hardsigmoid(t)),
    ("sigmoid", lambda tf, t: tf.sigmoid(t)),
    ("tanh", lambda tf, t: tf.tanh(t)),
    ("softplus", lambda tf, t: tf.softplus(t)),
]


@pytest.mark.parametrize("name,ref", ACTS)
def test_activations_match_torch(torch, rng, name, ref):
    x = rand(rng, 3, 7) * 4
    close(getattr(F, name)(mt.tensor(x)), ref(torch.nn.functional, T(torch, x)).numpy(), 1e-5)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_matches_torch(torch, rng, approximate):
    x = rand(rng, 4, 5) * 3
    ref = torch.nn.functional.gelu(T(torch, x), approximate=approximate).numpy()
    close(F.gelu(mt.tensor(x), approximate=approximate), ref, 1e-5)
    with pytest.raises(ValueError, match="gelu: approximate must be 'none' or 'tanh'"):
        F.gelu(mt.tensor(x), approximate="erf")


def test_leaky_relu(torch, rng):
    x = rand(rng, 10)
    close(F.leaky_relu(mt.tensor(x)), torch.nn.functional.leaky_relu(T(torch, x)).numpy())
    close(F.leaky_relu(mt.tensor(x), 0.2), np.where(x > 0, x, 0.2 * x))
    y = F.leaky_relu(mt.tensor([-2, 3]), 0.5)
    assert y.dtype == np.float32 and y.tolist() == [-1.0, 3.0]   # MegEngine promotion
    with pytest.raises(TypeError, match="leaky_relu: negative_slope must be a real number"):
        F.leaky_relu(mt.tensor(x), "0.1")


def test_activation_dtypes():
    assert F.relu(mt.tensor([-1, 2], dtype="int8")).dtype == np.int8
    assert F.sigmoid(mt.tensor([0, 1])).dtype == np.float32
    assert F.gelu(mt.tensor([0.0], dtype="float16")).dtype == np.float16


def _np_softmax(x, axis):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def test_softmax_log_softmax(rng):
    x = rand(rng, 3, 4, 5)
    close(F.softmax(mt.tensor(x)), _np_softmax(x, -1))           # None -> last axis
    close(F.softmax(mt.tensor(x), axis=1), _np_softmax(x, 1))
    close(F.log_softmax(mt.tensor(x), 0), np.log(_np_softmax(x.astype(np.float64), 0)))
    assert F.softmax(mt.tensor([1, 2])).dtype == np.float32
    with pytest.raises(IndexError, match="softmax: axis 3 is out of bounds for a tensor of dimension 3"):
        F.softmax(mt.tensor(x), 3)


# ------------------------------------------------------------------ others

def test_embedding(rng):
    w = rand(rng, 6, 3)
    idx = np.array([[0, 5], [2, 2]])
    close(F.embedding(mt.tensor(idx), mt.tensor(w)), w[idx])
    with pytest.raises(IndexError, match="embedding: input holds an index outside 0..5"):
        F.embedding(mt.tensor([6]), mt.tensor(w))
    with pytest.raises(TypeError, match="embedding: input must be an integer tensor"):
        F.embedding(mt.tensor([1.0]), mt.tensor(w))
    with pytest.raises(ValueError, match=r"embedding: weight must be 2-d"):
        F.embedding(mt.tensor([1]), mt.tensor(np.zeros(3, np.float32)))


def test_one_hot():
    x = np.array([[0, 2], [1, 1]], np.int64)
    out = F.one_hot(mt.tensor(x), 3)
    assert out.dtype == np.int64                          # MegEngine: x's dtype
    assert out.tolist() == np.eye(3, dtype=np.int64)[x].tolist()
    with pytest.raises(ValueError, match=r"one_hot: x holds values in \[0, 3\], outside \[0, num_classes=3\)"):
        F.one_hot(mt.tensor([0, 3]), 3)
    with pytest.raises(TypeError, match="one_hot: x must be an integer tensor"):
        F.one_hot(mt.tensor([0.0]), 3)
    with pytest.raises(ValueError, match="one_hot: num_classes must be >= 1"):
        F.one_hot(mt.tensor([0]), 0)


def test_dropout():
    x = mt.tensor(np.ones((100, 50), np.float32))
    assert F.dropout(x, 0.3, training=False) is x
    R.seed(123)
    y = F.dropout(x, 0.3).numpy()
    R.seed(123)
    y2 = F.dropout(x, 0.3).numpy()
    np.testing.assert_array_equal(y, y2)                  # reproducible after seed
    kept = y != 0
    np.testing.assert_allclose(y[kept], 1 / 0.7, rtol=1e-6)
    assert 0.2 < 1 - kept.mean() < 0.4
    # the mask is uniform(size=x.shape) >= p from mgtrace.random
    R.seed(5)
    mask = R.uniform(size=(100, 50)).numpy() >= 0.3
    R.seed(5)
    np.testing.assert_array_equal(F.dropout(x, 0.3).numpy() != 0, mask)
    assert F.dropout(mt.tensor([1.0], dtype="float16"), 0.5).dtype == np.float16
    with pytest.raises(ValueError, match=r"dropout: drop_prob must be in \[0, 1\)"):
        F.dropout(x, 1.0)


def test_pad():
    a = np.arange(12, dtype=np.int16).reshape(3, 4)
    assert F.pad(mt.tensor(a), ((1, 0), (2, 1)), constant_value=7).tolist() == \
        np.pad(a, ((1, 0), (2, 1)), constant_values=7).tolist()
    assert F.pad(mt.tensor(a), 1, mode="reflect").tolist() == np.pad(a, 1, mode="reflect").tolist()
    assert F.pad(mt.tensor(a), (1, 2), mode="edge").tolist() == np.pad(a, (1, 2), mode="edge").tolist()
    with pytest.raises(ValueError, match="pad: mode must be one of"):
        F.pad(mt.tensor(a), 1, mode="symmetric")
    with pytest.raises(TypeError, match="pad: constant_value must be a Python number"):
        F.pad(mt.tensor(a), 1, constant_value="0")


@pytest.mark.parametrize("mode, np_mode", [("circular", "wrap"), ("wrap", "wrap"),
                                           ("replicate", "edge"), ("reflect", "reflect")])
@pytest.mark.parametrize("pad_width", [((0, 0), (1, 2)), ((2, 1), (3, 0)), 1], ids=str)
def test_pad_modes_match_numpy(mode, np_mode, pad_width):
    a = np.arange(20, dtype=np.float32).reshape(4, 5) ** 1.5
    assert F.pad(mt.tensor(a), pad_width, mode=mode).numpy().tolist() == \
        np.pad(a, pad_width, mode=np_mode).tolist()


def test_circular_pad_longer_than_the_axis_and_errors():
    a = np.arange(6, dtype=np.int32).reshape(2, 3)
    assert F.pad(mt.tensor(a), ((3, 4), (7, 2)), mode="circular").tolist() == \
        np.pad(a, ((3, 4), (7, 2)), mode="wrap").tolist()
    with pytest.raises(ValueError, match="pad: cannot circular-pad axis 1 of size 0"):
        F.pad(mt.tensor(np.zeros((2, 0), np.float32)), 1, mode="circular")


@pytest.mark.parametrize("mode", ["reflect", "replicate", "circular"])
def test_pad_modes_match_torch(torch, rng, mode):
    x = rand(rng, 2, 3, 5, 6)
    ref = torch.nn.functional.pad(T(torch, x), (2, 1, 0, 3), mode=mode).numpy()
    got = F.pad(mt.tensor(x), ((0, 0), (0, 0), (0, 3), (2, 1)), mode=mode)
    assert got.numpy().tolist() == ref.tolist()


def test_interpolate_matches_torch(torch, rng):
    x = rand(rng, 1, 2, 5, 6)
    t = T(torch, x)
    tf = torch.nn.functional
    close(F.interpolate(mt.tensor(x), size=(7, 9)), tf.interpolate(t, size=(7, 9)).numpy())
    close(F.interpolate(mt.tensor(x), scale_factor=2, mode="bilinear"),
          tf.interpolate(t, scale_factor=2, mode="bilinear", align_corners=False).numpy())
    close(F.interpolate(mt.tensor(x), size=8, mode="bilinear", align_corners=True),
          tf.interpolate(t, size=8, mode="bilinear", align_corners=True).numpy())
    with pytest.raises(ValueError, match="interpolate: mode must be 'nearest' or 'bilinear'"):
        F.interpolate(mt.tensor(x), size=3, mode="bicubic")
    with pytest.raises(ValueError, match="interpolate: give exactly one of size and scale_factor"):
        F.interpolate(mt.tensor(x))
