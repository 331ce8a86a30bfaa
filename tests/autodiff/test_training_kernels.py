"""The training kernels of kernels/cpu/train.c (batch norm in training,
forward and backward; the SGD step) against NumPy references written here,
and through F.batch_norm, GradManager and optimizer.SGD."""
import contextlib

import numpy as np
import pytest

import mgtrace as mt
import mgtrace.functional as F
from mgtrace import optimizer as optim
from mgtrace._core import nn as _nn
from mgtrace.autodiff import GradManager
from mgtrace.errors import AutodiffError


@contextlib.contextmanager
def _threads(n):
    before = mt.get_num_threads()
    mt.set_num_threads(n)
    try:
        yield
    finally:
        mt.set_num_threads(before)


def _bn_ref(x, w, b, eps):
    """y, mean, biased var of training batch norm over axis 1, float64."""
    x = x.astype(np.float64)
    axes = (0,) + tuple(range(2, x.ndim))
    shape = (1, x.shape[1]) + (1,) * (x.ndim - 2)
    mean = x.mean(axes)
    var = ((x - mean.reshape(shape)) ** 2).mean(axes)
    y = (x - mean.reshape(shape)) / np.sqrt(var.reshape(shape) + eps)
    if w is not None:
        y = y * w.astype(np.float64).reshape(shape)
    if b is not None:
        y = y + b.astype(np.float64).reshape(shape)
    return y, mean, var


def _bn_grads_ref(x, w, gy, eps):
    """dx, dweight, dbias from the formula's pieces (PyTorch's), float64."""
    x, gy = x.astype(np.float64), gy.astype(np.float64)
    axes = (0,) + tuple(range(2, x.ndim))
    shape = (1, x.shape[1]) + (1,) * (x.ndim - 2)
    m = x.size // x.shape[1]
    mean = x.mean(axes, keepdims=True)
    rstd = 1 / np.sqrt(((x - mean) ** 2).mean(axes, keepdims=True) + eps)
    xhat = (x - mean) * rstd
    k = rstd * (w.astype(np.float64).reshape(shape) if w is not None else 1.0)
    gx = k * (gy - gy.sum(axes, keepdims=True) / m - xhat * (gy * xhat).sum(axes, keepdims=True) / m)
    return gx, (gy * xhat).sum(axes), gy.sum(axes)


SHAPES = [(8, 3), (4, 5, 7), (2, 6, 9, 11), (3, 70, 16, 16)]       # the last one takes the threaded path


@pytest.mark.parametrize("dtype,tol", [("float32", 3e-5), ("float64", 1e-12)])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("affine", [True, False])
def test_batch_norm_train_kernel(dtype, tol, shape, affine):
    rng = np.random.default_rng(1)
    x = (rng.standard_normal(shape) * 3 + 1.5).astype(dtype)
    c = shape[1]
    w = rng.uniform(0.5, 2, c).astype(dtype) if affine else None
    b = rng.uniform(-1, 1, c).astype(dtype) if affine else None
    with _threads(2):
        y, mean, var = _nn.batch_norm_train(mt.tensor(x), None if w is None else mt.tensor(w),
                                            None if b is None else mt.tensor(b), 1e-5)
    ry, rm, rv = _bn_ref(x, w, b, 1e-5)
    assert y.dtype == mean.dtype == var.dtype == np.dtype(dtype) and mean.shape == (c,)
    np.testing.assert_allclose(y.numpy(), ry, rtol=tol, atol=tol)
    np.testing.assert_allclose(mean.numpy(), rm, rtol=tol, atol=tol)
    np.testing.assert_allclose(var.numpy(), rv, rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype,tol", [("float32", 5e-5), ("float64", 1e-11)])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("affine", [True, False])
def test_batch_norm_backward_kernel(dtype, tol, shape, affine):
    rng = np.random.default_rng(2)
    x = (rng.standard_normal(shape) * 2 - 0.5).astype(dtype)
    gy = rng.standard_normal(shape).astype(dtype)
    w = rng.uniform(0.5, 2, shape[1]).astype(dtype) if affine else None
    with _threads(2):
        gx, gw, gb = _nn.batch_norm_backward(mt.tensor(x), None if w is None else mt.tensor(w),
                                             mt.tensor(gy), 1e-5)
    rx, rw, rb = _bn_grads_ref(x, w, gy, 1e-5)
    scale = max(1.0, np.abs(rx).max())
    np.testing.assert_allclose(gx.numpy(), rx, rtol=tol, atol=tol * scale)
    np.testing.assert_allclose(gb.numpy(), rb, rtol=tol, atol=tol * max(1.0, np.abs(rb).max()))
    if affine:
        np.testing.assert_allclose(gw.numpy(), rw, rtol=tol, atol=tol * max(1.0, np.abs(rw).max()))
    else:
        assert gw is None
    only_b = _nn.batch_norm_backward(mt.tensor(x), None, mt.tensor(gy), 1e-5, False, False, True)
    assert only_b[0] is None and only_b[1] is None
    np.testing.assert_array_equal(only_b[2].numpy(), gb.numpy())


def test_batch_norm_kernels_refuse_bad_operands():
    x = mt.tensor(np.ones((2, 3, 4), np.float32))
    with pytest.raises(TypeError, match="float32 or float64"):
        _nn.batch_norm_train(mt.tensor(np.ones((2, 3), np.int32)), None, None, 1e-5)
    with pytest.raises(TypeError, match="float32 or float64"):
        _nn.batch_norm_train(mt.tensor(np.ones(3, np.float32)), None, None, 1e-5)
    with pytest.raises(ValueError, match="3 elements"):
        _nn.batch_norm_train(x, mt.tensor(np.ones(4, np.float32)), None, 1e-5)
    with pytest.raises(TypeError, match="dtype"):
        _nn.batch_norm_train(x, mt.tensor(np.ones(3)), None, 1e-5)
    with pytest.raises(ValueError, match="differ in shape"):
        _nn.batch_norm_backward(x, None, mt.tensor(np.ones((2, 3, 5), np.float32)), 1e-5)
    with pytest.raises(TypeError, match="gy"):
        _nn.batch_norm_backward(x, None, mt.tensor(np.ones((2, 3, 4))), 1e-5)


@pytest.mark.parametrize("dtype,tol", [("float32", 3e-5), ("float64", 1e-12)])
def test_f_batch_norm_training_takes_the_kernel(dtype, tol):
    # F.batch_norm in training: y, and MegEngine's running-statistics update
    # (momentum the old value's weight, unbiased var), from the kernel's statistics
    rng = np.random.default_rng(3)
    x = rng.standard_normal((4, 3, 5, 5)).astype(dtype)[:, :, ::2, 1:]     # a strided view
    w, b = rng.uniform(0.5, 2, 3).astype(dtype), rng.uniform(-1, 1, 3).astype(dtype)
    rm0, rv0 = rng.standard_normal(3).astype(dtype), rng.uniform(1, 2, 3).astype(dtype)
    rm, rv = mt.tensor(rm0), mt.tensor(rv0)
    y = F.batch_norm(mt.tensor(x), rm, rv, mt.tensor(w).reshape(1, 3, 1, 1), mt.tensor(b), training=True,
                     momentum=0.8, eps=1e-3)
    ry, mean, var = _bn_ref(x, w, b, 1e-3)
    n = x.size // 3
    np.testing.assert_allclose(y.numpy(), ry, rtol=tol, atol=tol)
    np.testing.assert_allclose(rm.numpy(), 0.8 * rm0 + 0.2 * mean, rtol=tol, atol=tol)
    np.testing.assert_allclose(rv.numpy(), 0.8 * rv0 + 0.2 * var * n / (n - 1), rtol=tol, atol=tol)


def _recorded_grads(fn, arrays, seed=4):
    ts = [mt.tensor(a) for a in arrays]
    gm = GradManager().attach(ts)
    with gm:
        y = fn(*ts)
        gy = np.random.default_rng(seed).standard_normal(y.shape).astype(arrays[0].dtype)
        gm.backward((y * mt.tensor(gy)).sum())
    return [t.grad.numpy() for t in ts], gy


@pytest.mark.parametrize("wshape", [(5,), (1, 5, 1, 1)])
def test_recorded_batch_norm_is_one_node_with_the_kernels_gradient(wshape):
    rng = np.random.default_rng(5)
    x = rng.standard_normal((3, 5, 4, 6))
    w, b = rng.uniform(0.5, 2, wshape), rng.uniform(-1, 1, wshape)
    (gx, gw, gb), gy = _recorded_grads(
        lambda x, w, b: F.batch_norm(x, None, None, w, b, training=True, eps=1e-4), [x, w, b])
    rx, rw, rb = _bn_grads_ref(x, w.reshape(5), gy, 1e-4)
    assert gw.shape == gb.shape == wshape
    np.testing.assert_allclose(gx, rx, rtol=1e-11, atol=1e-11)
    np.testing.assert_allclose(gw.reshape(5), rw, rtol=1e-11, atol=1e-11)
    np.testing.assert_allclose(gb.reshape(5), rb, rtol=1e-11, atol=1e-11)
    # what the tape holds: one batch_norm node (no chain of elementwise ops)
    t = mt.tensor(x)
    gm = GradManager().attach([t])
    with gm:
        y = F.batch_norm(t, None, None, training=True)
        assert y.__dict__["_ad"][0].name == "batch_norm"
        gm.backward(y.sum())


def test_recorded_batch_norm_matches_finite_differences():
    rng = np.random.default_rng(6)
    x, w, b = rng.standard_normal((4, 2, 3)), rng.uniform(0.5, 2, 2), rng.uniform(-1, 1, 2)
    fn = lambda x, w, b: F.batch_norm(x, None, None, w, b, training=True)
    (gx, gw, _), gy = _recorded_grads(fn, [x, w, b])
    h = 1e-6
    for arr, got in ((x, gx), (w, gw)):
        num = np.zeros_like(arr)
        for i in np.ndindex(arr.shape):
            hi, lo = arr.copy(), arr.copy()
            hi[i] += h
            lo[i] -= h
            args = [hi if a is arr else a for a in (x, w, b)], [lo if a is arr else a for a in (x, w, b)]
            f = [(fn(*map(mt.tensor, a)).numpy() * gy).sum() for a in args]
            num[i] = (f[0] - f[1]) / (2 * h)
        np.testing.assert_allclose(got, num, rtol=1e-6, atol=1e-7)


def test_batch_norm_other_forms_stay_composite():
    # float16 x, and the inplace=False form (three outputs), are recorded op by op
    x = mt.tensor(np.random.default_rng(7).standard_normal((4, 3)))
    gm = GradManager().attach([x])
    with gm:
        y, m, v = F.batch_norm(x, mt.tensor(np.zeros(3)), mt.tensor(np.ones(3)), training=True,
                               inplace=False)
        assert y.__dict__["_ad"][0].name != "batch_norm"
        gm.backward(y.sum())
    np.testing.assert_allclose(x.grad.numpy(), 0, atol=1e-12)


# ------------------------------------------------------------------ SGD
def _sgd_numpy(p, grads, lr, momentum, wd, nesterov, dtype):
    """mgtrace.optimizer.SGD's formula in NumPy, each operation rounded to dtype."""
    p, buf = p.astype(dtype), None
    lr_, m_, wd_ = dtype(lr), dtype(momentum), dtype(wd)
    for g in grads:
        g = g.astype(dtype)
        if wd:
            g = g + p * wd_
        if momentum:
            buf = g.copy() if buf is None else buf * m_ + g
            g = g + buf * m_ if nesterov else buf
        p = p - g * lr_
    return p, buf


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("momentum,nesterov,wd", [(0.0, False, 0.0), (0.0, False, 0.01), (0.9, False, 0.0),
                                                  (0.9, True, 0.05), (0.5, False, 0.1)])
def test_sgd_step_kernel_gives_the_formulas_bits(dtype, momentum, nesterov, wd):
    rng = np.random.default_rng(8)
    shape = (70, 600)                     # several chunks: the threaded path
    p0 = rng.standard_normal(shape).astype(dtype)
    grads = [rng.standard_normal(shape).astype(dtype) for _ in range(3)]
    p = mt.tensor(p0)
    opt = optim.SGD([p], lr=0.01, momentum=momentum, nesterov=nesterov, weight_decay=wd)
    with _threads(2):
        for g in grads:
            p.grad = mt.tensor(g)
            opt.step()
    want_p, want_buf = _sgd_numpy(p0, grads, 0.01, momentum, wd, nesterov, dtype)
    np.testing.assert_array_equal(p.numpy(), want_p)
    if momentum:
        np.testing.assert_array_equal(opt.state_dict()["state"][0]["momentum_buffer"], want_buf)


def test_sgd_composed_path_where_the_kernel_does_not_apply():
    # a strided parameter, a gradient of another dtype: the tensor formula, same values
    rng = np.random.default_rng(9)
    base = rng.standard_normal((4, 6)).astype(np.float32)
    grads = [rng.standard_normal((4, 3)) for _ in range(2)]
    holder = mt.tensor(base)
    p = holder[:, ::2]
    assert not _nn.sgd_step(p, mt.tensor(grads[0].astype(np.float32)), None, 0.1, 0.0, 0.0, False, False)
    opt = optim.SGD([p], lr=0.1, momentum=0.9)
    for g in grads:
        p.grad = mt.tensor(g)             # float64 gradient of a float32 parameter
        opt.step()
    want, _ = _sgd_numpy(base[:, ::2], [g.astype(np.float32) for g in grads], 0.1, 0.9, 0.0, False,
                         np.float32)
    np.testing.assert_allclose(holder.numpy()[:, ::2], want, rtol=1e-6)
    np.testing.assert_array_equal(holder.numpy()[:, 1::2], base[:, 1::2])


def test_sgd_step_counts_as_a_write():
    # the in-place update bumps the version: a backward that saved the
    # parameter refuses, and the conv weight cache sees the new weights
    rng = np.random.default_rng(10)
    w = mt.tensor(rng.standard_normal((4, 3, 3, 3)).astype(np.float32))
    x = mt.tensor(rng.standard_normal((1, 3, 6, 6)).astype(np.float32))
    opt = optim.SGD([w], lr=0.5)
    F.conv2d(x, w)                                    # fills any cache of the packed weight
    w.grad = mt.tensor(np.ones((4, 3, 3, 3), np.float32))
    opt.step()
    want = F.conv2d(x, mt.tensor(w.numpy().copy())).numpy()
    np.testing.assert_array_equal(F.conv2d(x, w).numpy(), want)
    gm = GradManager().attach([w])
    with gm:
        y = (F.conv2d(x, w) * 2).sum()
        v = w._version
        opt.step()                                    # under no_grad, as training loops do
        assert w._version > v
        with pytest.raises(AutodiffError, match="written in place"):
            gm.backward(y)


# ------------------------------------------------------------------ conv2d's input gradient
@pytest.mark.parametrize("c,o,k,p,groups", [(3, 5, (3, 3), (1, 1), 1), (4, 6, (3, 3), (0, 2), 2),
                                            (6, 6, (3, 3), (1, 1), 6), (2, 3, (5, 3), (2, 0), 1),
                                            (4, 4, (1, 1), (0, 0), 1)])
def test_conv_input_gradient_at_stride_1_is_the_transposed_conv(c, o, k, p, groups):
    # at stride 1 the rule runs the input gradient as conv2d with the
    # adjoint weight; it equals conv_transpose2d of the output gradient
    from mgtrace.autodiff import rules
    rng = np.random.default_rng(11)
    x = mt.tensor(rng.standard_normal((2, c, 7, 8)))
    w = mt.tensor(rng.standard_normal((o, c // groups) + k))
    g = mt.tensor(rng.standard_normal(F.conv2d(x, w, padding=p, groups=groups).shape))
    gx, _, _ = rules._conv_vjp(x, w, None, g, (1, 1), p, (1, 1), groups, (True, False, False))
    want = F.conv_transpose2d(g, w, None, stride=1, padding=p, groups=groups)
    np.testing.assert_allclose(gx.numpy(), want.numpy(), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_relu_backward_edges(dtype):
    # PyTorch's subgradients: 0 at 0 (and at 6 for relu6), 1 at +inf for relu,
    # 0 at NaN; gy * 0 kept (an infinite gy at a zero slope gives NaN)
    x = np.array([-1, 0, 1e-30, 1, np.inf, np.nan, 5, 6, 7, -np.inf, 2, -2], dtype)
    gy = np.array([1, 1, 1, 1, 1, 1, np.inf, 1, 1, 1, 3, np.inf], dtype)
    with np.errstate(invalid="ignore"):
        relu = gy * (x > 0)
        relu6 = gy * ((x > 0) & (x < 6))
        np.testing.assert_array_equal(_nn.act_backward("relu", mt.tensor(x), mt.tensor(gy)).numpy(), relu)
        np.testing.assert_array_equal(_nn.act_backward("relu6", mt.tensor(x), mt.tensor(gy)).numpy(), relu6)


@pytest.mark.parametrize("x_shape", [(4, 3, 5), (6, 5)])
def test_linear_weight_gradient_is_one_contiguous_gemm(x_shape):
    # F.linear's y = x @ weight.T: the weight's gradient g^T x over all rows
    # comes out of one GEMM already [out, in] contiguous (SGD's one-pass
    # step then reads it as it is), with the NumPy product's values
    rng = np.random.default_rng(21)
    xs, ws, gs = rng.standard_normal(x_shape), rng.standard_normal((7, 5)), rng.standard_normal(x_shape[:-1] + (7,))
    x, w, b = mt.tensor(xs), mt.tensor(ws), mt.tensor(np.zeros(7))
    gm = GradManager().attach([x, w, b])
    with gm:
        gm.backward((F.linear(x, w, b) * mt.tensor(gs)).sum())
    g2, x2 = gs.reshape(-1, 7), xs.reshape(-1, 5)
    assert w.grad.shape == (7, 5) and w.grad.strides == (5, 1)
    np.testing.assert_allclose(w.grad.numpy(), g2.T @ x2, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(x.grad.numpy(), (g2 @ ws).reshape(x_shape), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(b.grad.numpy(), g2.sum(0), rtol=1e-12, atol=1e-12)


def test_linear_gradients_from_a_strided_output_gradient():
    # the output used through a transpose (attention's heads): the gradient
    # reaching the linear layer is strided, made contiguous once for both GEMMs
    rng = np.random.default_rng(22)
    xs, ws, gs = rng.standard_normal((2, 5, 6)), rng.standard_normal((6, 6)), rng.standard_normal((2, 6, 5))
    x, w = mt.tensor(xs), mt.tensor(ws)
    gm = GradManager().attach([x, w])
    with gm:
        gm.backward((F.linear(x, w).transpose(0, 2, 1) * mt.tensor(gs)).sum())
    g2 = gs.transpose(0, 2, 1).reshape(-1, 6)
    np.testing.assert_allclose(w.grad.numpy(), g2.T @ xs.reshape(-1, 6), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(x.grad.numpy(), (g2 @ ws).reshape(2, 5, 6), rtol=1e-12, atol=1e-12)
