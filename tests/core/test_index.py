"""Indexing and the index ops against NumPy."""
import numpy as np
import pytest

import mgtrace as mt
from mgtrace._core import index as I
from conftest import ALL_DTYPES, assert_close, random_array

A = np.arange(120, dtype=np.float32).reshape(4, 5, 6)

INDICES = [
    1, -1, (1, 2), (1, 2, 3), slice(None, None, 2), slice(3, 0, -1), (Ellipsis, 1), (None, 1),
    (slice(1, 3), None, Ellipsis, slice(None, None, -2)), slice(10, 20), [0, 2, 3], [[0, 1], [2, 3]],
    (slice(None), [0, 4], [1, 5]), ([0, 3], slice(None), [1, 2]), (1, slice(None), [[0, 1], [2, 5]]),
    (Ellipsis, [5, 0]), (A[:, :, 0] > 40,), (A[:, 0, 0] > 30, 2), (np.array([True, False, True, True]),),
    (slice(None), np.int64(3)), ([-1, -4],), (np.array([], dtype=np.int64),),
]


def to_mt(idx):
    if isinstance(idx, tuple):
        return tuple(to_mt(i) for i in idx)
    if isinstance(idx, np.ndarray):
        return mt.tensor(idx)
    return idx


@pytest.mark.parametrize("idx", INDICES, ids=[str(i)[:40] for i in range(len(INDICES))])
def test_getitem_matches_numpy(idx):
    want = A[idx]
    assert_close(mt.tensor(A)[to_mt(idx)], want)
    assert_close(mt.tensor(A)[idx], want)          # NumPy arrays and lists as indices too
    assert_close(mt.tensor(A).transpose(0, 2, 1).transpose(0, 2, 1)[to_mt(idx)], want)


@pytest.mark.parametrize("idx", INDICES, ids=[str(i)[:40] for i in range(len(INDICES))])
def test_setitem_matches_numpy(idx, rng):
    want = A.copy()
    shape = want[idx].shape
    value = rng.standard_normal(shape[1:] if len(shape) > 1 else shape).astype(np.float32)
    want[idx] = value
    t = mt.tensor(A)
    t[to_mt(idx)] = mt.tensor(value)
    assert_close(t, want)
    t2 = mt.tensor(A)
    t2[to_mt(idx)] = 7
    want2 = A.copy()
    want2[idx] = 7
    assert_close(t2, want2)


@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_indexing_every_dtype(dtype, rng):
    a = random_array((5, 4), dtype, rng)
    t = mt.tensor(a)
    assert_close(t[[4, 0, 0]], a[[4, 0, 0]])
    assert_close(t[1:4:2, ::-1], a[1:4:2, ::-1])
    t[[1, 2]] = t[0]
    a[[1, 2]] = a[0]
    assert_close(t, a)


def test_index_errors():
    t = mt.tensor(A)
    with pytest.raises(IndexError, match="out of bounds for axis 0 with size 4"):
        t[4]
    with pytest.raises(IndexError, match="index 9 is out of bounds for axis 1"):
        t[:, [1, 9]]
    with pytest.raises(IndexError, match="too many indices"):
        t[1, 2, 3, 4]
    with pytest.raises(IndexError, match="integer or bool"):
        t[mt.tensor([1.0])]
    with pytest.raises(IndexError, match="boolean index did not match"):
        t[mt.tensor([True, False])]
    with pytest.raises(IndexError, match="could not be broadcast"):
        t[[0, 1], [0, 1, 2]]
    with pytest.raises(ValueError, match="step cannot be zero"):
        t[::0]
    with pytest.raises(IndexError):
        t["a"]
    with pytest.raises(ValueError, match="broadcast"):
        t[0] = mt.tensor(np.ones((3, 3), np.float32))
    with pytest.raises(IndexError, match="single ellipsis"):
        t[..., ...]


def test_repeated_indices_last_write_wins():
    t = mt.tensor(np.zeros(3, np.float32))
    t[[0, 0, 1]] = mt.tensor([1.0, 2.0, 3.0])
    assert t.tolist() == [2.0, 3.0, 0.0]


def test_gather_scatter(rng):
    x = rng.standard_normal((3, 4)).astype(np.float32)
    idx = rng.integers(0, 4, (3, 2))
    assert_close(I.gather(mt.tensor(x), 1, mt.tensor(idx)), np.take_along_axis(x, idx, 1))
    idx0 = rng.integers(0, 3, (2, 4))
    assert_close(I.gather(mt.tensor(x), 0, mt.tensor(idx0)), np.take_along_axis(x, idx0, 0))
    src = rng.standard_normal((3, 4)).astype(np.float32)
    perm = np.argsort(rng.random((3, 4)), axis=1)
    want = x.copy()
    np.put_along_axis(want, perm, src, 1)
    assert_close(I.scatter(mt.tensor(x), 1, mt.tensor(perm), mt.tensor(src)), want)
    with pytest.raises(ValueError):
        I.gather(mt.tensor(x), 1, mt.tensor(idx[0]))
    with pytest.raises(IndexError):
        I.gather(mt.tensor(x), 1, mt.tensor(idx + 10))


def test_concat_stack_split(rng):
    a = rng.standard_normal((2, 3)).astype(np.float32)
    b = rng.integers(0, 5, (4, 3)).astype(np.int16)
    out = I.concat([mt.tensor(a), mt.tensor(b)], 0)
    assert out.dtype == "float32"
    assert_close(out, np.concatenate([a, b.astype(np.float32)], 0))
    assert_close(I.stack([mt.tensor(a), mt.tensor(a)], -1), np.stack([a, a], -1))
    parts = I.split(mt.tensor(b), 2, 0)
    assert [p.shape for p in parts] == [(2, 3), (2, 3)]
    parts = I.split(mt.tensor(b), [1, 3], 0)
    for p, w in zip(parts, np.split(b, [1, 3], 0)):
        assert_close(p, w)
    with pytest.raises(ValueError):
        I.concat([mt.tensor(a), mt.tensor(b.T)], 0)
    with pytest.raises(ValueError):
        I.split(mt.tensor(b), 3, 0)
    with pytest.raises(ValueError):
        I.concat([], 0)
    with pytest.raises(ValueError, match="ambiguous device"):
        I.concat([mt.tensor(a), mt.tensor(a, device="cpu:1")])


def test_nonzero_and_embedding(rng):
    x = rng.integers(0, 2, (3, 4)).astype(np.int32)
    nz = I.nonzero(mt.tensor(x))
    assert nz.dtype == "int32"
    np.testing.assert_array_equal(nz.numpy(), np.argwhere(x))
    for got, want in zip(I.nonzero(mt.tensor(x), as_tuple=True), np.nonzero(x)):
        np.testing.assert_array_equal(got.numpy(), want)
    w = rng.standard_normal((10, 4)).astype(np.float32)
    ids = rng.integers(0, 10, (2, 5)).astype(np.int32)
    assert_close(I.embedding(mt.tensor(w), mt.tensor(ids)), w[ids])
    with pytest.raises(IndexError):
        I.embedding(mt.tensor(w), mt.tensor([10]))
