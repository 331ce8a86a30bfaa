"""F.group_norm / F.instance_norm run each (sample, group) as a row of
layer_norm's C kernel for float32/float64 on the CPU: values against NumPy
and against the mean/var composition they replaced, and gradients (the
layer_norm C backward, recorded through the nested F.layer_norm call)
against central finite differences in float64."""
import numpy as np
import pytest

import mgtrace as mt
import mgtrace.functional as F
from mgtrace._core import reduce as R
from mgtrace.autodiff import GradManager

RNG = np.random.default_rng(36)


def _ref(x, groups, w=None, b=None, eps=1e-5):
    n, c = x.shape[:2]
    xg = x.astype(np.float64).reshape(n, groups, -1)
    y = ((xg - xg.mean(2, keepdims=True)) / np.sqrt(xg.var(2, keepdims=True) + eps)).reshape(x.shape)
    if w is not None:
        shape = (c,) + (1,) * (x.ndim - 2)
        y = y * w.reshape(shape) + b.reshape(shape)
    return y


def _composition(x, groups, eps=1e-5):
    """the mean/var/rsqrt composition group_norm used before the kernel"""
    n = x.shape[0]
    xg = x.reshape(n, groups, -1)
    y = (xg - R.mean(xg, 2, True)) * F.rsqrt(R.var(xg, 2, True) + eps)
    return y.reshape(x.shape)


@pytest.mark.parametrize("dtype,tol", [(np.float32, 2e-5), (np.float64, 1e-12)])
@pytest.mark.parametrize("shape", [(2, 3, 5, 4), (1, 4, 7), (3, 2, 2, 3, 2)])
def test_instance_norm_values(dtype, tol, shape):
    x = (RNG.standard_normal(shape) * 3 + 1).astype(dtype)
    c = shape[1]
    w = RNG.standard_normal(c).astype(dtype)
    b = RNG.standard_normal(c).astype(dtype)
    got = F.instance_norm(mt.tensor(x), False)
    assert got.dtype == dtype and got.shape == shape
    np.testing.assert_allclose(got.numpy(), _ref(x, c), rtol=tol, atol=tol)
    np.testing.assert_allclose(got.numpy(), _composition(mt.tensor(x), c).numpy(), rtol=tol, atol=tol)
    aff = F.instance_norm(mt.tensor(x), True, mt.tensor(w), mt.tensor(b), eps=1e-3)
    np.testing.assert_allclose(aff.numpy(), _ref(x, c, w, b, 1e-3), rtol=tol, atol=tol)
    m = mt.module.InstanceNorm(c, affine=True)           # float32 parameters
    m.weight[...] = mt.tensor(w.astype(np.float32))
    m.bias[...] = mt.tensor(b.astype(np.float32))
    np.testing.assert_allclose(m(mt.tensor(x)).numpy(), _ref(x, c, w.astype(np.float32),
                               b.astype(np.float32)), rtol=max(tol, 2e-5), atol=max(tol, 2e-5))


def test_group_norm_values_and_constant_rows():
    x = RNG.standard_normal((2, 6, 3, 3)).astype(np.float32)
    x[1, 2:4] = 5.0                      # a constant group: (x - mean) is 0, not NaN
    got = F.group_norm(mt.tensor(x), 3).numpy()
    np.testing.assert_allclose(got, _ref(x, 3), rtol=2e-5, atol=2e-5)
    assert np.all(got[1, 2:4] == 0.0)


def test_empty_spatial_keeps_the_composition():
    x = mt.tensor(np.zeros((2, 3, 0), np.float32))
    assert F.instance_norm(x, False).shape == (2, 3, 0)


@pytest.mark.parametrize("affine", [False, True])
def test_instance_norm_gradient_matches_finite_differences(affine):
    x = RNG.uniform(-2, 2, (2, 3, 4))
    w = RNG.uniform(-1, 1, 3)
    b = RNG.uniform(-1, 1, 3)
    gy = RNG.uniform(-1, 1, x.shape)

    def run(xa, wa, ba):
        return F.instance_norm(mt.tensor(xa), affine, mt.tensor(wa) if affine else None,
                               mt.tensor(ba) if affine else None)

    ts = [mt.tensor(a) for a in (x, w, b)]
    gm = GradManager().attach(ts if affine else ts[:1])
    with gm:
        y = F.instance_norm(ts[0], affine, *(ts[1:] if affine else (None, None)))
        gm.backward((y * mt.tensor(gy)).sum())
    eps = 1e-6
    for k, a in enumerate((x, w, b) if affine else (x,)):
        num = np.zeros_like(a)
        for idx in np.ndindex(a.shape):
            hi = [v.copy() for v in (x, w, b)]
            lo = [v.copy() for v in (x, w, b)]
            hi[k][idx] += eps
            lo[k][idx] -= eps
            num[idx] = ((run(*hi).numpy() - run(*lo).numpy()) * gy).sum() / (2 * eps)
        np.testing.assert_allclose(ts[k].grad.numpy(), num, rtol=1e-5, atol=1e-6, err_msg=f"input {k}")
