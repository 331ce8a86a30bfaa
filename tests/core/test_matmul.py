"""matmul against NumPy: shapes, broadcasting, layouts and dtypes."""
import numpy as np
import pytest

import mgtrace as mt
from conftest import assert_close

CASES = [((3, 4), (4, 5)), ((4,), (4, 5)), ((3, 4), (4,)), ((4,), (4,)), ((2, 3, 4), (4, 5)),
         ((2, 1, 3, 4), (5, 4, 2)), ((7, 1, 8), (8, 1)), ((0, 4), (4, 3)), ((3, 0), (0, 2)),
         ((16, 64, 32), (16, 32, 48))]


@pytest.mark.parametrize("sa,sb", CASES)
@pytest.mark.parametrize("dtype", ["float32", "float64", "int32", "int8"])
def test_matmul_matches_numpy(sa, sb, dtype, rng):
    a = (rng.integers(-4, 4, sa)).astype(dtype)
    b = (rng.integers(-4, 4, sb)).astype(dtype)
    out = mt.tensor(a) @ mt.tensor(b)
    assert out.dtype == dtype
    assert_close(out, np.matmul(a, b), rtol=1e-5, atol=1e-5)


def test_transposed_and_strided_layouts(rng):
    a = rng.standard_normal((6, 8)).astype(np.float32)
    b = rng.standard_normal((5, 8)).astype(np.float32)
    ta, tb = mt.tensor(a), mt.tensor(b)
    assert_close(ta @ tb.T, a @ b.T, rtol=1e-5, atol=1e-5)
    assert_close(ta[::2] @ tb.T, a[::2] @ b.T, rtol=1e-5, atol=1e-5)
    assert_close(tb.T.T.T.T @ ta.T, b @ a.T, rtol=1e-5, atol=1e-5)
    assert_close(ta[:, ::2] @ tb[:, ::2].T, a[:, ::2] @ b[:, ::2].T, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_one_row_products_take_the_gemv_path(rng, dtype):
    """A single row (Linear at batch 1) runs as a GEMV: every layout of A's
    row and B (transposed, strided, a column of a larger matrix) and batches
    of single rows agree with NumPy."""
    a = rng.standard_normal((3, 40)).astype(dtype)
    b = rng.standard_normal((40, 70)).astype(dtype)
    ta, tb = mt.tensor(a), mt.tensor(b)
    tol = dict(rtol=1e-5, atol=1e-5)
    assert_close(ta[:1] @ tb, a[:1] @ b, **tol)                    # B not transposed
    assert_close(ta[:1] @ mt.tensor(b.T.copy()).T, a[:1] @ b, **tol)  # B transposed (F.linear's weight.T)
    assert_close(ta[1] @ tb, a[1] @ b, **tol)                      # 1-d x
    assert_close(ta[:1, ::2] @ tb[::2, 1::3], a[:1, ::2] @ b[::2, 1::3], **tol)   # strided
    assert_close(ta.T[:, :1].T @ tb, a[:1] @ b, **tol)             # A's row read with a stride
    assert_close(ta[:, None, :] @ tb, a[:, None, :] @ b, **tol)    # a batch of single rows
    assert_close(mt.functional.linear(ta[:1], mt.tensor(b.T.copy())), a[:1] @ b, **tol)


@pytest.mark.parametrize("n, k", [(1000, 1280), (70, 40), (9, 17), (2, 1), (123, 16)])
def test_one_row_float32_products_by_rows_of_the_weight_against_numpy(rng, n, k):
    """Float32 one-row products whose B is a row-major weight's transpose
    (F.linear at batch 1) run as dot products, 8 weight rows at a time (and
    split over the threads by whole rows): against float64 NumPy for row
    counts not a multiple of 8 and K not a multiple of 16, with a weight
    whose rows are strided (a slice of a wider one), and bitwise equal on
    1-3 threads."""
    a = rng.standard_normal((4, k)).astype(np.float32)
    wide = rng.standard_normal((n, k + 5)).astype(np.float32)
    w = wide[:, 2:k + 2]
    want = a[:1].astype(np.float64) @ w.T.astype(np.float64)
    tw = mt.tensor(wide)[:, 2:k + 2]
    before = mt.get_num_threads()
    try:
        got = []
        for t in (1, 2, 3):
            mt.set_num_threads(t)
            got.append(mt.functional.linear(mt.tensor(a[:1]), tw).numpy())
    finally:
        mt.set_num_threads(before)
    for g in got:
        np.testing.assert_allclose(g, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
        np.testing.assert_array_equal(g, got[0])


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_batches_of_small_products_split_over_threads(rng, dtype, threads):
    """A batch of small products (attention's heads: transposed views of
    [B, S, H, D]) runs as one loop over the batch with single-threaded
    GEMMs, a batch of few large ones as threaded GEMMs: both agree with
    NumPy at every thread count, broadcast batch axes and odd batch sizes
    included, and leave BLAS's thread count as it was."""
    x = rng.standard_normal((3, 40, 5, 16)).astype(dtype)          # [B, S, H, D]
    y = rng.standard_normal((3, 40, 5, 16)).astype(dtype)
    w = rng.standard_normal((5, 16, 24)).astype(dtype)
    big_a = rng.standard_normal((3, 160, 170)).astype(dtype)
    big_b = rng.standard_normal((170, 180)).astype(dtype)
    before = mt.get_num_threads()
    mt.set_num_threads(threads)
    try:
        blas = mt._core.linalg.get_blas_threads()
        q = mt.tensor(x).transpose((0, 2, 1, 3))                    # [B, H, S, D] view
        k = mt.tensor(y).transpose((0, 2, 3, 1))                    # [B, H, D, S] view
        xq, yk = x.transpose(0, 2, 1, 3), y.transpose(0, 2, 3, 1)
        assert_close(q @ k, xq @ yk, rtol=1e-5, atol=1e-4)
        s = (q @ k).numpy()
        assert_close(mt.tensor(s) @ q, s @ xq, rtol=1e-5, atol=1e-3)
        assert_close(q @ mt.tensor(w), xq @ w, rtol=1e-5, atol=1e-4)          # batch axes broadcast
        assert_close(mt.tensor(x[:, :7]) @ mt.tensor(w[:, :, :3]).reshape(1, 5, 16, 3)[:, 1:2],
                     x[:, :7] @ w[None, 1:2, :, :3], rtol=1e-5, atol=1e-4)
        assert_close(mt.tensor(big_a) @ mt.tensor(big_b), big_a @ big_b, rtol=1e-4, atol=1e-3)
        assert mt._core.linalg.get_blas_threads() == blas
    finally:
        mt.set_num_threads(before)


def test_half_precision_and_promotion(rng):
    a = rng.standard_normal((4, 8)).astype(np.float16)
    b = rng.standard_normal((8, 3)).astype(np.float32)
    out = mt.tensor(a) @ mt.tensor(a.T.copy())
    assert out.dtype == "float16"
    assert_close(out, (a.astype(np.float32) @ a.T.astype(np.float32)).astype(np.float16), rtol=2e-3, atol=2e-2)
    assert (mt.tensor(a) @ mt.tensor(b)).dtype == "float32"
    assert (mt.tensor([[1, 2]]) @ mt.tensor([[1.5], [2.0]])).dtype == "float32"


def test_matmul_errors():
    with pytest.raises(ValueError, match="inner dimensions"):
        mt.tensor(np.ones((2, 3))) @ mt.tensor(np.ones((4, 2)))
    with pytest.raises(ValueError, match="0-d"):
        mt.tensor(1.0) @ mt.tensor([1.0])
    with pytest.raises(ValueError, match="batch"):
        mt.tensor(np.ones((2, 2, 3))) @ mt.tensor(np.ones((3, 3, 2)))
    with pytest.raises(TypeError, match="bool"):
        mt.tensor([[True]]) @ mt.tensor([[True]])
    with pytest.raises(ValueError, match="ambiguous device"):
        mt.tensor([[1.0]]) @ mt.tensor([[1.0]], device="cpu:1")
