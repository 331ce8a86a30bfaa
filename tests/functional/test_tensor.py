"""mgtrace.functional.tensor against NumPy: manipulation (views and copies),
joining, indexing, repeat/tile, creation (default dtypes, devices); argument
errors must name the argument.
"""
import numpy as np
import pytest

import mgtrace as mt
import mgtrace.functional as F
from conftest import random_array


@pytest.fixture
def a(rng):
    return random_array((2, 3, 4), "int32", rng)


# ------------------------------------------------------------------ views

def test_reshape_flatten(a):
    t = mt.tensor(a)
    assert F.reshape(t, (4, -1)).tolist() == a.reshape(4, -1).tolist()
    assert F.reshape(t, 24).shape == (24,)
    assert F.flatten(t).tolist() == a.ravel().tolist()
    assert F.flatten(t, 1).shape == (2, 12)
    assert F.flatten(t, 0, 1).shape == (6, 4)
    assert F.flatten(mt.tensor(3)).shape == (1,)
    with pytest.raises(ValueError, match=r"reshape: target_shape \(5, 5\)"):
        F.reshape(t, (5, 5))
    with pytest.raises(ValueError, match="flatten: start_axis=2 comes after end_axis=1"):
        F.flatten(t, 2, 1)
    with pytest.raises(IndexError, match="flatten: start_axis 3 is out of bounds"):
        F.flatten(t, 3)


def test_transpose_pattern(a):
    t = mt.tensor(a)
    assert F.transpose(t, (2, 0, 1)).tolist() == a.transpose(2, 0, 1).tolist()
    assert F.transpose(t, (1, "x", 0, 2)).shape == (3, 1, 2, 4)     # MegEngine's "x"
    assert F.transpose(t, (-1, 0, 1)).shape == (4, 2, 3)
    with pytest.raises(ValueError, match="transpose: pattern .* must name each of the 3 axes"):
        F.transpose(t, (0, 1))
    with pytest.raises(ValueError, match="transpose: pattern"):
        F.transpose(t, (0, 0, 1))


def test_expand_dims_squeeze_broadcast_to(a):
    t = mt.tensor(a)
    assert F.expand_dims(t, 0).shape == (1, 2, 3, 4)
    assert F.expand_dims(t, (-1, 1)).shape == (2, 1, 3, 4, 1)
    s = mt.tensor(np.zeros((1, 3, 1)))
    assert F.squeeze(s).shape == (3,)
    assert F.squeeze(s, -1).shape == (1, 3)
    with pytest.raises(ValueError, match=r"squeeze: axis 1 of x has size 3, not 1"):
        F.squeeze(s, 1)
    with pytest.raises(ValueError, match="expand_dims: axis .* repeats an axis"):
        F.expand_dims(t, (0, 0))
    b = F.broadcast_to(mt.tensor([[1], [2]]), (3, 2, 4))
    assert b.tolist() == np.broadcast_to(np.array([[1], [2]]), (3, 2, 4)).tolist()
    with pytest.raises(ValueError, match=r"broadcast_to: x of shape \(2, 1\) does not broadcast to shape \(3, 4\)"):
        F.broadcast_to(mt.tensor([[1], [2]]), (3, 4))


def test_views_share_storage(a):
    t = mt.tensor(a)
    v = F.transpose(t, (1, 0, 2))
    t[0, 0, 0] = 99
    assert v[0, 0, 0].item() == 99


# ------------------------------------------------------------------ joining

def test_concat_stack_split(rng):
    x = random_array((2, 3), "int32", rng)
    y = random_array((1, 3), "float32", rng)
    out = F.concat([mt.tensor(x), mt.tensor(y)])
    assert out.dtype == np.float32                       # MegEngine promotion of the inputs
    np.testing.assert_array_equal(out.numpy(), np.concatenate([x, y]).astype(np.float32))
    assert F.concat([mt.tensor(x), x], axis=1).shape == (2, 6)
    st = F.stack([mt.tensor(x), mt.tensor(x + 1)], axis=-1)
    np.testing.assert_array_equal(st.numpy(), np.stack([x, x + 1], axis=-1))
    parts = F.split(mt.tensor(np.arange(10)), [2, 5])
    assert [p.tolist() for p in parts] == [[0, 1], [2, 3, 4], [5, 6, 7, 8, 9]]
    parts = F.split(mt.tensor(x), 3, axis=1)
    assert [p.shape for p in parts] == [(2, 1)] * 3
    assert F.concat([mt.tensor([1.0])], device="cpu:1").device == mt.Device("cpu:1")


def test_join_errors():
    with pytest.raises(ValueError, match=r"concat: inps\[1\] has shape \(2, 2\), which differs"):
        F.concat([mt.tensor(np.zeros((2, 3))), mt.tensor(np.zeros((2, 2)))])
    with pytest.raises(ValueError, match="concat: inps is empty"):
        F.concat([])
    with pytest.raises(TypeError, match="concat: inps must be a list or tuple"):
        F.concat(mt.tensor([1]))
    with pytest.raises(ValueError, match=r"stack: inps\[1\] has shape \(3,\) but inps\[0\] has \(2,\)"):
        F.stack([mt.tensor([1, 2]), mt.tensor([1, 2, 3])])
    with pytest.raises(ValueError, match="split: axis 0 of x has size 5, which does not divide into "
                                         "nsplits_or_sections=2"):
        F.split(mt.tensor(np.arange(5)), 2)
    with pytest.raises(ValueError, match="split: split points"):
        F.split(mt.tensor(np.arange(5)), [3, 1])


# ------------------------------------------------------------------ gather, scatter

def test_gather_scatter_match_numpy(rng):
    x = random_array((3, 4), "float32", rng)
    idx = rng.integers(0, 4, size=(3, 2))
    np.testing.assert_array_equal(F.gather(mt.tensor(x), 1, mt.tensor(idx)).numpy(),
                                  np.take_along_axis(x, idx, axis=1))
    idx0 = rng.integers(0, 3, size=(2, 4))
    np.testing.assert_array_equal(F.gather(mt.tensor(x), 0, mt.tensor(idx0)).numpy(),
                                  np.take_along_axis(x, idx0, axis=0))
    src = random_array((3, 2), "float32", rng)
    perm = np.stack([rng.permutation(4)[:2] for _ in range(3)])
    expected = x.copy()
    np.put_along_axis(expected, perm, src, axis=1)
    np.testing.assert_array_equal(F.scatter(mt.tensor(x), 1, mt.tensor(perm), mt.tensor(src)).numpy(),
                                  expected)


def test_gather_scatter_errors():
    x = mt.tensor(np.zeros((3, 4)))
    with pytest.raises(TypeError, match="gather: index must be an integer tensor"):
        F.gather(x, 0, mt.tensor([[0.0]]))
    with pytest.raises(ValueError, match="gather: index has 1 axes but x has 2"):
        F.gather(x, 0, mt.tensor([0]))
    with pytest.raises(IndexError, match="gather: index holds a value out of range for axis 1"):
        F.gather(x, 1, mt.tensor([[4]]))
    with pytest.raises(ValueError, match=r"scatter: source of shape \(3,\) does not broadcast to index's shape \(1, 2\)"):
        F.scatter(x, 1, mt.tensor([[0, 1]]), mt.tensor([1.0, 2.0, 3.0]))


# ------------------------------------------------------------------ repeat, tile

@pytest.mark.parametrize("repeats,axis", [(2, None), (3, 0), (2, 1), (1, -1), (0, 1)])
def test_repeat_matches_numpy(a, repeats, axis):
    np.testing.assert_array_equal(F.repeat(mt.tensor(a), repeats, axis).numpy(),
                                  np.repeat(a, repeats, axis))


@pytest.mark.parametrize("reps", [2, (2, 1), (1, 2, 3), (2, 1, 1, 2), (0, 1, 1)])
def test_tile_matches_numpy(a, reps):
    np.testing.assert_array_equal(F.tile(mt.tensor(a), reps).numpy(), np.tile(a, reps))


def test_repeat_tile_errors(a):
    with pytest.raises(TypeError, match="repeat: repeats must be an int"):
        F.repeat(mt.tensor(a), [1, 2])
    with pytest.raises(ValueError, match="repeat: repeats must be >= 0"):
        F.repeat(mt.tensor(a), -1)
    with pytest.raises(ValueError, match="tile: reps must be >= 0"):
        F.tile(mt.tensor(a), (1, -1))


# ------------------------------------------------------------------ copy, astype

def test_copy_and_astype(a):
    t = mt.tensor(a)
    c = F.copy(t)
    c[0, 0, 0] = 1234
    assert t[0, 0, 0].item() != 1234
    moved = F.copy(t, "cpu:1")
    assert moved.device == mt.Device("cpu:1") and moved.tolist() == a.tolist()
    f = F.astype(t, "float16")
    assert f.dtype == np.float16
    assert F.astype(mt.tensor([1.9, -1.9]), np.int8).tolist() == [1, -1]
    with pytest.raises(TypeError, match="astype: dtype 'uint32' is not supported"):
        F.astype(t, "uint32")


# ------------------------------------------------------------------ creation

def test_creation_default_dtypes():
    assert F.zeros((2, 3)).dtype == np.float32
    assert F.ones(4).dtype == np.float32
    assert F.zeros((2,), dtype="int8").tolist() == [0, 0]
    assert F.full((2,), 1.5).dtype == np.float32
    assert F.full((2,), 3).dtype == np.int32
    assert F.full((2,), True).dtype == np.bool_
    assert F.full((2,), 3, dtype="float64").dtype == np.float64
    assert F.arange(5).dtype == np.int32
    assert F.arange(0.0, 2.0).dtype == np.float32
    assert F.arange(0, 5, 2.5).dtype == np.float32
    assert F.linspace(0, 1, 3).dtype == np.float32
    assert F.eye(3).dtype == np.float32


def test_creation_values():
    assert F.arange(2, 11, 3).tolist() == np.arange(2, 11, 3).tolist()
    assert F.arange(5, 0, -2).tolist() == [5, 3, 1]
    np.testing.assert_allclose(F.arange(0, 1, 0.1).numpy(), np.arange(0, 1, 0.1).astype(np.float32))
    for start, stop, num in [(0, 1, 5), (-3.5, 7.25, 11), (2, 2, 3), (0, 1, 1), (0, 1, 0)]:
        np.testing.assert_allclose(F.linspace(start, stop, num).numpy(),
                                   np.linspace(start, stop, num).astype(np.float32))
    np.testing.assert_array_equal(F.eye(3, 5).numpy(), np.eye(3, 5, dtype=np.float32))
    np.testing.assert_array_equal(F.eye(2, dtype="int32").numpy(), np.eye(2, dtype=np.int32))
    assert F.full((2, 2), 7).tolist() == [[7, 7], [7, 7]]


def test_like_functions_follow_input():
    x = mt.tensor([[1, 2]], dtype="int16", device="cpu:1")
    for fn, val in [(F.zeros_like, 0), (F.ones_like, 1)]:
        y = fn(x)
        assert y.dtype == np.int16 and y.device == x.device and y.tolist() == [[val, val]]
    y = F.full_like(x, 5)
    assert y.dtype == np.int16 and y.tolist() == [[5, 5]]
    assert F.zeros_like(x, dtype="float32").dtype == np.float32


def test_creation_device_honoured():
    dev = mt.Device("cpu:1")
    for t in [F.zeros(2, device="cpu:1"), F.ones(2, device=dev), F.full(2, 1, device="cpu:1"),
              F.arange(3, device="cpu:1"), F.linspace(0, 1, 3, device="cpu:1"),
              F.eye(2, device="cpu:1")]:
        assert t.device == dev


def test_creation_errors():
    with pytest.raises(ValueError, match="arange: step must not be 0"):
        F.arange(0, 5, 0)
    with pytest.raises(TypeError, match="arange: stop must be a number"):
        F.arange(0, "5")
    with pytest.raises(ValueError, match="zeros: shape must not have negative entries"):
        F.zeros((2, -1))
    with pytest.raises(TypeError, match="full: value must be a Python bool, int or float"):
        F.full(2, "a")
    with pytest.raises(ValueError, match="linspace: num must be >= 0"):
        F.linspace(0, 1, -1)
    with pytest.raises(TypeError, match="eye: N must be an int"):
        F.eye(2.5)
    with pytest.raises(TypeError, match="ones: dtype 'bogus' is not supported"):
        F.ones(2, dtype="bogus")


# MegEngine's Tensor methods (ArrayMethodMixin and Tensor, less autograd): the
# reference for which array methods a Tensor has; everything else is a function
MEGENGINE_METHODS = ["reshape", "transpose", "T", "flatten", "astype", "sum", "prod", "min", "max",
                     "mean", "item", "tolist", "numpy", "shape", "dtype", "device", "ndim", "size",
                     "to"]


def test_tensor_has_megengines_array_methods():
    t = mt.tensor(np.arange(6, dtype="float32").reshape(2, 3))
    missing = [m for m in MEGENGINE_METHODS if not hasattr(t, m)]
    assert not missing


@pytest.mark.parametrize("name", ["exp", "abs", "sqrt", "clip", "log", "relu", "softmax", "concat"])
def test_a_function_called_as_a_method_names_the_function(name):
    t = mt.tensor(np.array([1.0, 4.0], "float32"))
    with pytest.raises(AttributeError) as e:
        getattr(t, name)()
    assert str(e.value) == (f"'Tensor' object has no attribute '{name}'; Tensor has the array "
                            f"methods only (as MegEngine's): call F.{name}(t), i.e. "
                            f"mgtrace.functional.{name}")
    assert e.value.name == name and e.value.obj is t
    assert not hasattr(t, name) and callable(getattr(F, name))


def test_other_missing_attributes_keep_the_plain_message():
    t = mt.tensor([1.0])
    with pytest.raises(AttributeError, match=r"^'Tensor' object has no attribute 'frobnicate'$"):
        t.frobnicate
    with pytest.raises(AttributeError, match=r"^'Tensor' object has no attribute '_exp'$"):
        t._exp
    assert not hasattr(t, "__array_struct__")
