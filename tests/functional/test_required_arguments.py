"""Bad arguments the breaker found, each refused with the documented error:
None for a required tensor, None reaching the core's casts, negative
indices of indexing_one_hot, keepdims that is no flag; and non_zero of a
0-d tensor shaped as NumPy's argwhere."""
import inspect

import numpy as np
import pytest

import mgtrace as mt
import mgtrace.functional as F
from mgtrace._core import nn as core_nn


def _x(*shape):
    return mt.tensor(np.ones(shape, np.float32))


# (function, arguments with one required tensor set to None, the name the message gives)
NONE_CASES = [
    (F.linear, (None, _x(2, 3)), "x"),
    (F.linear, (_x(1, 3), None), "weight"),
    (F.conv2d, (_x(1, 1, 3, 3), None), "weight"),
    (F.conv1d, (None, _x(1, 1, 1)), "x"),
    (F.conv_transpose2d, (_x(1, 1, 3, 3), None), "weight"),
    (F.conv3d, (_x(1, 1, 2, 2, 2), None), "weight"),
    (F.conv_transpose3d, (None, _x(1, 1, 1, 1, 1)), "inp"),
    (F.local_conv2d, (_x(1, 1, 3, 3), None), "weight"),
    (F.embedding, (mt.tensor([0]), None), "weight"),
    (F.matmul, (None, _x(2, 2)), "a"),
    (F.matmul, (_x(2, 2), None), "b"),
    (F.dot, (_x(2), None), "y"),
    (F.cross, (_x(3), None), "b"),
    (F.indexing_one_hot, (_x(2, 2), None), "index"),
    (F.cond_take, (None, _x(2)), "mask"),
    (F.warp_perspective, (_x(1, 1, 2, 2), None, (2, 2)), "mat"),
    (F.remap, (_x(1, 1, 2, 2), None), "map_xy"),
    (F.layer_norm, (None, (3,)), "x"),
    (F.group_norm, (None, 1), "x"),
    (F.batch_norm, (None,), "x"),
    (F.general_norm, (None, (1,)), "inp"),
    (F.logsumexp, (None, 0), "x"),
    (F.logsoftmax, (None, 0), "x"),
    (F.softmax, (None,), "x"),
    (F.deformable_conv2d, (_x(1, 1, 3, 3), _x(1, 1, 1, 1), None, _x(1, 1, 3, 3)), "offset"),
]


@pytest.mark.parametrize("fn,args,name", NONE_CASES,
                         ids=[f"{f.__name__}-{n}" for f, _, n in NONE_CASES])
def test_none_for_a_required_tensor_is_a_type_error_naming_it(fn, args, name):
    with pytest.raises(TypeError, match=rf"{fn.__name__}: {name} must be a [Tt]ensor, got None"):
        fn(*args)


def test_optional_tensors_may_still_be_none():
    x, w = _x(2, 3), _x(4, 3)
    np.testing.assert_array_equal(F.linear(x, w, None).numpy(), np.full((2, 4), 3.0, np.float32))
    y = F.layer_norm(mt.tensor([[1.0, 3.0]]), (2,), None, None)
    np.testing.assert_allclose(y.numpy(), [[-1.0, 1.0]], atol=1e-4)


@pytest.mark.parametrize("call", [
    lambda: core_nn.interpolate(None, 2),
    lambda: core_nn.pad(None, [(1, 1)]),
    lambda: core_nn.max_pool2d(None, 2),
    lambda: core_nn.avg_pool2d(None, 2),
], ids=["interpolate", "pad", "max_pool2d", "avg_pool2d"])
def test_the_cores_entry_points_refuse_none(call):
    with pytest.raises(TypeError, match="x must be a tensor, got None"):
        call()


def test_indexing_one_hot_refuses_negative_indices_as_megengine():
    # MegEngine 1.13 asserts "bad value in IndexingOneHot index: input shape
    # is 2, index value is -1"; it never counts from the end
    x = mt.tensor(np.arange(6, dtype=np.float32).reshape(3, 2))
    with pytest.raises(IndexError, match="indexing_one_hot: index holds -1, outside 0..1"):
        F.indexing_one_hot(x, mt.tensor([1, 0, -1]), 1)
    with pytest.raises(IndexError, match="outside 0..1"):
        F.indexing_one_hot(x, mt.tensor([1, 0, 2]), 1)
    assert F.indexing_one_hot(x, mt.tensor([1, 0, 1]), 1).tolist() == [1.0, 2.0, 5.0]


@pytest.mark.parametrize("value,rows", [(3.0, 1), (0.0, 0), (True, 1)])
def test_non_zero_of_a_0d_tensor_is_shaped_as_numpys_argwhere(value, rows):
    got = F.non_zero(mt.tensor(value))
    want = np.argwhere(np.array(value))
    assert got.shape == want.shape == (rows, 0)
    assert got.dtype == np.int32
    assert F.non_zero(mt.tensor(value), as_tuple=True) == ()


@pytest.mark.parametrize("call", [
    lambda x: F.logsumexp(x, 1, keepdims="yes"),
    lambda x: F.sum(x, 1, keepdims="yes"),
    lambda x: F.mean(x, 1, keepdims=None),
    lambda x: F.max(x, 1, keepdims=1.0),
    lambda x: F.norm(x, 2, 1, keepdims="no"),
    lambda x: F.indexing_one_hot(x, mt.tensor([0, 1]), 1, keepdims="yes"),
    lambda x: x.sum(1, keepdims="yes"),
    lambda x: F.argmax(x, 1, keepdims=[True]),
], ids=["logsumexp", "sum", "mean", "max", "norm", "indexing_one_hot", "Tensor.sum", "argmax"])
def test_keepdims_must_be_a_flag(call):
    with pytest.raises(TypeError, match="keepdims must be a bool"):
        call(_x(2, 3))


def test_keepdims_takes_bools_and_ints_as_megengine():
    x = mt.tensor(np.arange(6, dtype=np.float32).reshape(2, 3))
    # MegEngine 1.13: F.logsumexp(x, 1, keepdims=1) and F.sum(x, 1, keepdims=1) keep the axis
    assert F.logsumexp(x, 1, keepdims=1).shape == (2, 1)
    assert F.sum(x, 1, keepdims=np.bool_(True)).shape == (2, 1)
    assert F.sum(x, 1, keepdims=0).shape == (2,)
    np.testing.assert_allclose(F.logsumexp(x, 1, keepdims=True).numpy(),
                               np.log(np.exp(np.arange(6.0).reshape(2, 3)).sum(1, keepdims=True)),
                               rtol=1e-6)
