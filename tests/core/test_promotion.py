"""MegEngine promotion, checked from the documented example table."""
import operator

import numpy as np
import pytest

import mgtrace as mt
from mgtrace._core.promotion_examples import EXAMPLES

OPS = {"+": operator.add, "*": operator.mul, "/": operator.truediv, "**": operator.pow,
       "==": operator.eq}


def operand(spec):
    return mt.tensor([1, 2], dtype=spec) if isinstance(spec, str) else spec


@pytest.mark.parametrize("left,op,right,expected", EXAMPLES, ids=[f"{l}{o}{r}" for l, o, r, _ in EXAMPLES])
def test_documented_example(left, op, right, expected):
    out = OPS[op](operand(left), operand(right))
    assert out.dtype == expected
    if op in "+*":  # dtype_promotion itself agrees for the SAME-rule ops
        assert mt.dtype_promotion(operand(left), operand(right)) == expected


def test_reflected_operands_promote_the_same():
    for left, op, right, expected in EXAMPLES:
        if not isinstance(right, str):
            assert OPS[op](operand(right), operand(left)).dtype == expected


def test_zero_dim_tensor_is_a_tensor_not_a_scalar():
    assert (mt.tensor(2.0) * 1.5).dtype == "float32"
    assert (mt.tensor([2.0]) * 1.5).dtype == "float32"
    assert (mt.tensor(2, dtype="int8") + 3).dtype == "int8"
    assert (mt.tensor(2, dtype="int8") + mt.tensor([3], dtype="int16")).dtype == "int16"


def test_numpy_operands_count_as_tensors():
    assert mt.dtype_promotion(mt.tensor([1], dtype="int8"), np.int16(3)) == "int16"
    assert mt.dtype_promotion(mt.tensor([1], dtype="float16"), np.float64(3)) == "float64"
    assert (mt.tensor([1], dtype="int8") + np.array([3], dtype=np.int16)).dtype == "int16"


def test_setitem_casts_to_destination():
    x = mt.tensor([1, 2], "int32")
    x[0] = 2.7
    assert x.dtype == "int32"
    assert x.tolist() == [2, 2]


def test_python_int_overflow_is_an_error():
    with pytest.raises(OverflowError, match="300.*uint8"):
        mt.tensor([1], "uint8") + 300
    with pytest.raises(OverflowError, match="200.*int8"):
        mt.tensor([1], "int8") * 200
    with pytest.raises(OverflowError):
        mt.tensor([1], "bool") + 2 ** 40


def test_in_range_python_int_wraps_in_tensor_dtype():
    out = mt.tensor([250], "uint8") + 10
    assert out.dtype == "uint8" and out.tolist() == [4]


def test_mean_and_division_of_ints_give_float32():
    assert (mt.tensor([1, 2], "int32") / mt.tensor([2, 2], "int32")).dtype == "float32"


def test_no_operand_with_dtype_is_an_error():
    with pytest.raises(TypeError, match="at least one operand"):
        mt.dtype_promotion()
    with pytest.raises(TypeError):
        mt.dtype_promotion(None)


def test_unsupported_operand_types():
    with pytest.raises(TypeError):
        mt.dtype_promotion("abc")
    with pytest.raises(TypeError):
        mt.tensor([1.0]) + "abc"
    with pytest.raises(TypeError):
        mt.tensor(["1 + 2j"])
    assert mt.tensor([1 + 2j]).dtype == "complex64"      # complex data: the complex dtype
