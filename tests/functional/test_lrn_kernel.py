"""F.local_response_norm's C pass (kernels/cpu/lrn.c) against NumPy and
against the core-op composition it replaced on the CPU, and its gradient
(the composition recorded under autodiff) against finite differences."""
import numpy as np
import pytest

import mgtrace as mt
import mgtrace.functional as F
from mgtrace.autodiff import GradManager
from mgtrace.functional import nn as fnn

RNG = np.random.default_rng(37)


def lrn_ref(x, n, k, alpha, beta):
    x = x.astype(np.float64)
    c, half = x.shape[1], n // 2
    sq = x * x
    s = np.zeros_like(x)
    for ci in range(c):
        s[:, ci] = sq[:, max(0, ci - half):ci + half + 1].sum(axis=1)
    return x / (k + alpha * s) ** beta


@pytest.mark.parametrize("dtype,tol", [(np.float32, 2e-6), (np.float64, 1e-13)])
@pytest.mark.parametrize("shape,n,k,alpha,beta", [
    ((2, 7, 3, 4), 5, 2.0, 1e-2, 0.75),
    ((1, 3, 17, 19), 3, 1.0, 0.5, 0.5),         # a block past 256 positions
    ((3, 4), 1, 0.5, 1.0, 1.0),
    ((2, 3, 2, 2, 2), 9, 2.0, 0.1, 0.75),       # the window wider than C
])
def test_lrn_kernel_against_numpy_and_the_composition(dtype, tol, shape, n, k, alpha, beta):
    x = (RNG.standard_normal(shape) * 2).astype(dtype)
    got = F.local_response_norm(mt.tensor(x), n, k, alpha, beta)
    assert got.dtype == dtype and got.shape == shape
    np.testing.assert_allclose(got.numpy(), lrn_ref(x, n, k, alpha, beta), rtol=tol, atol=tol)
    comp = fnn._lrn_composed(mt.tensor(x), n, k, alpha, beta)
    np.testing.assert_allclose(got.numpy(), comp.numpy(), rtol=tol * 4, atol=tol * 4)


def test_lrn_kernel_on_a_strided_view_and_the_module():
    x = RNG.standard_normal((2, 8, 6, 5)).astype(np.float32)
    view = mt.tensor(x)[:, ::2, :, ::2]
    np.testing.assert_allclose(F.local_response_norm(view, 3, 1.0, 0.3, 0.75).numpy(),
                               lrn_ref(x[:, ::2, :, ::2], 3, 1.0, 0.3, 0.75), rtol=2e-6, atol=2e-6)
    m = mt.module.LocalResponseNorm(5, 2.0, 1e-4, 0.75)
    np.testing.assert_allclose(m(mt.tensor(x)).numpy(), lrn_ref(x, 5, 2.0, 1e-4, 0.75),
                               rtol=2e-6, atol=2e-6)
    with pytest.raises(ValueError, match="kernel_size must be odd"):
        F.local_response_norm(mt.tensor(x), 4)


def test_lrn_gradient_matches_finite_differences():
    x = RNG.uniform(-2, 2, (2, 5, 3))
    gy = RNG.uniform(-1, 1, x.shape)
    tx = mt.tensor(x)
    gm = GradManager().attach([tx])
    with gm:
        y = F.local_response_norm(tx, 3, 1.0, 0.4, 0.75)
        gm.backward((y * mt.tensor(gy)).sum())
    np.testing.assert_allclose(y.numpy(), lrn_ref(x, 3, 1.0, 0.4, 0.75), rtol=1e-13, atol=1e-13)
    eps = 1e-6
    num = np.zeros_like(x)
    for idx in np.ndindex(x.shape):
        hi, lo = x.copy(), x.copy()
        hi[idx] += eps
        lo[idx] -= eps
        num[idx] = ((lrn_ref(hi, 3, 1.0, 0.4, 0.75) - lrn_ref(lo, 3, 1.0, 0.4, 0.75)) * gy).sum() / (2 * eps)
    np.testing.assert_allclose(tx.grad.numpy(), num, rtol=1e-6, atol=1e-7)
