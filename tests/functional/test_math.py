"""mgtrace.functional.math against NumPy (values, broadcasting, MegEngine
promotion) and hand-computed results; argument errors must name the argument.
"""
import doctest
import importlib
import math

import numpy as np
import pytest

import mgtrace as mt
import mgtrace.functional as F
from conftest import assert_close, random_array

# ------------------------------------------------------------------ elementwise

_erf = np.vectorize(math.erf, otypes=[np.float64])

# name: (NumPy reference, input domain)
UNARY = {
    "neg": (np.negative, "any"), "abs": (np.abs, "any"), "sign": (np.sign, "any"),
    "square": (np.square, "any"), "round": (np.round, "any"), "floor": (np.floor, "any"),
    "ceil": (np.ceil, "any"), "trunc": (np.trunc, "any"),
    "exp": (np.exp, "small"), "expm1": (np.expm1, "small"), "log": (np.log, "pos"),
    "log1p": (np.log1p, "pos"), "log2": (np.log2, "pos"), "sqrt": (np.sqrt, "pos"),
    "rsqrt": (lambda a: 1 / np.sqrt(a), "pos"), "sin": (np.sin, "any"), "cos": (np.cos, "any"),
    "tan": (np.tan, "unit"), "asin": (np.arcsin, "unit"), "acos": (np.arccos, "unit"),
    "atan": (np.arctan, "any"), "tanh": (np.tanh, "any"),
    "sigmoid": (lambda a: 1 / (1 + np.exp(-a)), "any"), "erf": (_erf, "any"),
    "isnan": (np.isnan, "any"), "isinf": (np.isinf, "any"), "isfinite": (np.isfinite, "any"),
    "logical_not": (np.logical_not, "any"),
}
FLOAT_RESULT = {"exp", "expm1", "log", "log1p", "log2", "sqrt", "rsqrt", "sin", "cos", "tan",
                "asin", "acos", "atan", "tanh", "sigmoid", "erf"}
BOOL_RESULT = {"isnan", "isinf", "isfinite", "logical_not"}


def _domain(kind, rng, dtype):
    if kind == "pos":
        a = rng.integers(1, 20, size=(3, 4)) / 2
    elif kind == "unit":
        a = rng.integers(-9, 10, size=(3, 4)) / 10
    elif kind == "small":
        a = rng.integers(-8, 8, size=(3, 4)) / 2
    else:
        a = rng.integers(-20, 20, size=(3, 4)) / 2
    if dtype.startswith("int"):
        a = np.ceil(a) if kind != "unit" else np.zeros_like(a)
    return a.astype(dtype)


@pytest.mark.parametrize("name", sorted(UNARY))
@pytest.mark.parametrize("dtype", ["float32", "int32"])
def test_unary_matches_numpy(name, dtype, rng):
    ref, kind = UNARY[name]
    a = _domain(kind, rng, dtype)
    if name == "rsqrt" and dtype == "int32":
        a = np.maximum(a, 1).astype(dtype)
    out = getattr(F, name)(mt.tensor(a))
    if name in BOOL_RESULT:
        want = "bool"
    elif name in FLOAT_RESULT:
        want = "float32"     # MegEngine: transcendental functions of ints give float32
    else:
        want = dtype
    expected = ref(a.astype(np.float64) if want == "float32" else a)
    if name == "round" and dtype == "float32":
        expected = np.round(a)
    assert_close(out, np.asarray(expected).astype(want), dtype=want, rtol=1e-6, atol=1e-6)


def test_unary_accepts_scalars_and_arrays():
    assert F.exp(0.0).item() == 1.0
    assert F.abs(np.array([-2, 3], np.int8)).dtype == np.int8
    assert F.sqrt([4.0, 9.0]).tolist() == [2.0, 3.0]


def test_unary_bad_argument_names_x():
    with pytest.raises(TypeError, match=r"exp: x must be a Tensor"):
        F.exp("1.0")
    with pytest.raises(TypeError, match=r"neg: x must be"):
        F.neg(None)


BINARY = {
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.true_divide,
    "floor_div": np.floor_divide, "mod": np.mod, "pow": np.power, "maximum": np.maximum,
    "minimum": np.minimum, "atan2": np.arctan2,
    "equal": np.equal, "not_equal": np.not_equal, "less": np.less, "less_equal": np.less_equal,
    "greater": np.greater, "greater_equal": np.greater_equal,
    "logical_and": np.logical_and, "logical_or": np.logical_or, "logical_xor": np.logical_xor,
}


@pytest.mark.parametrize("name", sorted(BINARY))
@pytest.mark.parametrize("dtype", ["float32", "int32"])
def test_binary_matches_numpy_with_broadcasting(name, dtype, rng):
    a = random_array((3, 1), dtype, rng, low=1, high=6)
    b = random_array((4,), dtype, rng, low=1, high=4)
    out = getattr(F, name)(mt.tensor(a), mt.tensor(b))
    expected = BINARY[name](a, b)
    if name in ("div", "atan2", "pow") and dtype == "int32":   # the FLOAT rule: float32
        expected = BINARY[name](a.astype(np.float64), b.astype(np.float64)).astype(np.float32)
    assert out.shape == (3, 4)
    assert_close(out, expected, dtype=str(expected.dtype), rtol=1e-6, atol=1e-6)


# MegEngine promotion (DESIGN.md): (x, y, result dtype)
PROMOTION = [
    (("int8", [1, 2]), 3, "int8"),
    (("int8", [1, 2]), 3.0, "float32"),
    (("float16", [1, 2]), 3.0, "float16"),
    (("int32", [1, 2]), ("float16", [1, 1]), "float16"),
    (("uint8", [1, 2]), ("int8", [1, 1]), "int16"),
    (("bool", [True, False]), ("bool", [True, True]), "bool"),
    (("bool", [True, False]), 1, "int32"),
    (("float32", [1, 2]), ("float64", [1, 1]), "float64"),
]


def _operand(v):
    return mt.tensor(v[1], dtype=v[0]) if isinstance(v, tuple) else v


@pytest.mark.parametrize("x,y,want", PROMOTION)
def test_add_follows_megengine_promotion(x, y, want):
    out = F.add(_operand(x), _operand(y))
    assert out.dtype == np.dtype(want)
    ref = np.add(np.asarray(x[1], dtype=want), np.asarray(y[1] if isinstance(y, tuple) else y,
                                                          dtype=want))
    np.testing.assert_array_equal(out.numpy(), ref)


def test_mixed_promotion_other_ops():
    i8 = mt.tensor([4, -6], dtype="int8")
    assert F.div(i8, 2).dtype == np.float32                 # true division of ints
    assert F.floor_div(i8, 4).tolist() == [1, -2]
    assert F.floor_div(i8, 4).dtype == np.int8
    assert F.mul(i8, 0.5).dtype == np.float32
    assert F.maximum(mt.tensor([1, 5], dtype="uint8"), mt.tensor([3, 2], dtype="int8")).dtype == np.int16
    assert F.equal(i8, 4.0).dtype == np.bool_
    assert F.add(np.array([1, 2], np.int16), i8).dtype == np.int16   # arrays count as tensors
    with pytest.raises(OverflowError):
        F.add(i8, 1000)


def test_binary_errors_name_arguments():
    with pytest.raises(ValueError, match=r"sub: x of shape \(2,\), y of shape \(3,\) do not broadcast"):
        F.sub(mt.tensor([1, 2]), mt.tensor([1, 2, 3]))
    with pytest.raises(TypeError, match=r"mul: y must be a Tensor"):
        F.mul(mt.tensor([1]), "2")
    with pytest.raises(ValueError, match="ambiguous device"):
        F.add(mt.tensor([1.0]), mt.tensor([1.0], device="cpu:1"))


def test_python_scalars_both():
    assert F.add(1, 2).item() == 3
    assert F.add(1, 2).dtype == np.int32


# ------------------------------------------------------------------ clip, where

def test_clip():
    x = mt.tensor([-3, 0, 4, 9])
    assert F.clip(x, 0, 5).tolist() == [0, 0, 4, 5]
    assert F.clip(x, lower=1).tolist() == [1, 1, 4, 9]
    assert F.clip(x, upper=2).tolist() == [-3, 0, 2, 2]
    y = F.clip(x, 0.5, 5)
    assert y.dtype == np.float32                          # MegEngine promotion with a float bound
    np.testing.assert_allclose(y.numpy(), np.clip([-3, 0, 4, 9], 0.5, 5))
    lo = mt.tensor([[0], [5]])
    assert F.clip(x, lo, 6).tolist() == np.clip(np.array([-3, 0, 4, 9]), [[0], [5]], 6).tolist()


def test_clip_errors():
    with pytest.raises(ValueError, match="clip: give lower, upper or both"):
        F.clip(mt.tensor([1]))
    with pytest.raises(ValueError, match="clip: lower=3 is greater than upper=1"):
        F.clip(mt.tensor([1]), 3, 1)
    with pytest.raises(ValueError, match="clip: x of shape .*lower of shape"):
        F.clip(mt.tensor([1, 2]), mt.tensor([1, 2, 3]), 5)
    with pytest.raises(TypeError, match="clip: upper must be"):
        F.clip(mt.tensor([1]), 0, "5")


def test_where(rng):
    m = rng.random((3, 4)) > 0.5
    a = random_array((3, 4), "int32", rng)
    b = random_array((4,), "float32", rng)
    out = F.where(mt.tensor(m), mt.tensor(a), mt.tensor(b))
    assert out.dtype == np.float32
    assert_close(out, np.where(m, a, b).astype(np.float32))
    assert F.where(True, mt.tensor([1, 2]), 0).tolist() == [1, 2]
    assert F.where(np.array([False, True]), 1, 2).tolist() == [2, 1]


def test_where_errors():
    with pytest.raises(TypeError, match="where: mask must be a bool tensor, got int32"):
        F.where(mt.tensor([1, 0]), 1, 2)
    with pytest.raises(ValueError, match="where: mask of shape .* do not broadcast"):
        F.where(mt.tensor([True, False]), mt.tensor([1, 2, 3]), 0)


# ------------------------------------------------------------------ reductions

@pytest.mark.parametrize("axis", [None, 0, 1, -1, (0, 2)])
@pytest.mark.parametrize("keepdims", [False, True])
def test_reductions_match_numpy(axis, keepdims, rng):
    a = random_array((3, 4, 5), "float32", rng)
    t = mt.tensor(a)
    for name, ref in [("sum", np.sum), ("mean", np.mean), ("max", np.max), ("min", np.min),
                      ("var", np.var), ("std", np.std)]:
        out = getattr(F, name)(t, axis=axis, keepdims=keepdims)
        assert_close(out, ref(a.astype(np.float64), axis=axis, keepdims=keepdims).astype(np.float32),
                     rtol=1e-5, atol=1e-5)
    p = random_array((3, 4, 5), "float32", rng, low=1, high=3)
    assert_close(F.prod(mt.tensor(p), axis=axis, keepdims=keepdims),
                 np.prod(p.astype(np.float64), axis=axis, keepdims=keepdims).astype(np.float32),
                 rtol=1e-5)


def test_reduction_dtypes():
    i = mt.tensor([[1, 2], [3, 4]], dtype="int8")
    assert F.sum(i).dtype == np.int8
    assert F.sum(mt.tensor([True, True, False])).dtype == np.int32   # bool sums to int32
    assert F.sum(mt.tensor([True, True, False])).item() == 2
    assert F.mean(i).dtype == np.float32
    assert F.mean(i).item() == 2.5
    assert F.var(i, ddof=1).dtype == np.float32
    np.testing.assert_allclose(F.var(i, ddof=1).item(), np.var([1, 2, 3, 4], ddof=1))
    np.testing.assert_allclose(F.std(mt.tensor([1.0, 2.0, 4.0]), ddof=1).item(),
                               np.std([1.0, 2.0, 4.0], ddof=1), rtol=1e-6)
    assert F.argmax(i, axis=1).dtype == np.int32
    assert F.argmax(mt.tensor([[1, 9], [7, 2]])).item() == 1          # flat index
    assert F.argmin(mt.tensor([[1, 9], [0, 2]]), axis=0).tolist() == [1, 1]


def test_reduction_errors():
    with pytest.raises(IndexError, match="axis"):
        F.sum(mt.tensor([1, 2]), axis=3)
    with pytest.raises(TypeError, match="var: ddof must be a real number"):
        F.var(mt.tensor([1.0]), ddof="1")
    with pytest.raises(TypeError, match="sum: x must be"):
        F.sum(object())


@pytest.mark.parametrize("ord", [2, 1, 3, 0.5, 0, math.inf, -math.inf])
@pytest.mark.parametrize("axis", [None, 1])
def test_norm_matches_numpy(ord, axis, rng):
    a = random_array((3, 4), "float32", rng)
    a[0, 0] = 0
    out = F.norm(mt.tensor(a), ord=ord, axis=axis)
    flat = a.astype(np.float64).ravel() if axis is None else a.astype(np.float64)
    expected = np.linalg.norm(flat, ord=ord, axis=None if axis is None else axis)
    assert_close(out, np.asarray(expected, np.float32), rtol=1e-5, atol=1e-5)


def test_norm_int_input_and_keepdims():
    out = F.norm(mt.tensor([[3, 4]]), axis=1, keepdims=True)
    assert out.dtype == np.float32 and out.tolist() == [[5.0]]
    with pytest.raises(TypeError, match="norm: ord must be a real number"):
        F.norm(mt.tensor([1.0]), ord="fro")


def test_cumsum():
    a = np.array([[1, 2, 3], [4, 5, 6]], np.int16)
    assert F.cumsum(mt.tensor(a), axis=1).tolist() == np.cumsum(a, axis=1).tolist()
    assert F.cumsum(mt.tensor(a), axis=0).dtype == np.int16
    assert F.cumsum(mt.tensor([True, True]), axis=0).dtype == np.int32
    with pytest.raises(IndexError):
        F.cumsum(mt.tensor(a), axis=2)


# ------------------------------------------------------------------ sorting

def test_sort_argsort(rng):
    a = random_array((3, 6), "float32", rng)
    v, i = F.sort(mt.tensor(a))
    assert_close(v, np.sort(a, axis=-1))
    assert i.dtype == np.int32
    assert_close(i, np.argsort(a, axis=-1, kind="stable").astype(np.int32))
    v, i = F.sort(mt.tensor(a), descending=True, axis=0)
    assert_close(v, -np.sort(-a, axis=0))
    assert F.argsort(mt.tensor([3, 1, 2])).tolist() == [1, 2, 0]
    assert F.argsort(mt.tensor([3, 1, 2]), descending=True).tolist() == [0, 2, 1]


def test_topk_megengine_defaults():
    x = mt.tensor([[5, 1, 4, 2], [0, 9, 8, 7]])
    v, i = F.topk(x, 2)                                   # MegEngine: the k smallest
    assert v.tolist() == [[1, 2], [0, 7]] and i.tolist() == [[1, 3], [0, 3]]
    v, i = F.topk(x, 2, descending=True)
    assert v.tolist() == [[5, 4], [9, 8]] and i.tolist() == [[0, 2], [1, 2]]
    kth, none = F.topk(x, 3, kth_only=True)
    assert none is None and kth.tolist() == [4, 8]
    kth, _ = F.topk(x, 2, descending=True, kth_only=True)
    assert kth.tolist() == [4, 8]
    v, i = F.topk(x, 2, no_sort=True)
    assert sorted(v.tolist()[0]) == [1, 2]
    v, _ = F.topk(x, 1, axis=0, descending=True)
    assert v.tolist() == [[5, 9, 8, 7]]


def test_topk_errors():
    with pytest.raises(ValueError, match="topk: k=5 is larger than the 4 elements"):
        F.topk(mt.tensor([1, 2, 3, 4]), 5)
    with pytest.raises(TypeError, match="topk: k must be an int"):
        F.topk(mt.tensor([1, 2]), 1.5)
    with pytest.raises(ValueError, match="topk: k must be >= 1"):
        F.topk(mt.tensor([1, 2]), 0, kth_only=True)


# ------------------------------------------------------------------ products

@pytest.mark.parametrize("sa,sb", [((3, 4), (4, 5)), ((2, 3, 4), (4, 5)), ((2, 1, 3, 4), (5, 4, 2)),
                                   ((4,), (4, 5)), ((3, 4), (4,)), ((4,), (4,))])
def test_matmul_matches_numpy(sa, sb, rng):
    a = random_array(sa, "float32", rng)
    b = random_array(sb, "float32", rng)
    assert_close(F.matmul(mt.tensor(a), mt.tensor(b)), np.matmul(a, b), rtol=1e-5, atol=1e-4)


def test_matmul_transpose_flags_and_promotion(rng):
    a = random_array((2, 4, 3), "float32", rng)
    b = random_array((5, 4), "int32", rng)
    out = F.matmul(mt.tensor(a), mt.tensor(b), transpose_a=True, transpose_b=True)
    assert out.dtype == np.float32                        # int32 @ float32 -> float32
    assert_close(out, np.matmul(a.transpose(0, 2, 1), b.T.astype(np.float32)), rtol=1e-5, atol=1e-4)
    i = F.matmul(mt.tensor([[1, 2]], dtype="int16"), mt.tensor([[3], [4]], dtype="int16"))
    assert i.dtype == np.int16 and i.tolist() == [[11]]


def test_matmul_errors():
    with pytest.raises(ValueError, match=r"matmul: a has 3 columns but b has 4 rows"):
        F.matmul(mt.tensor(np.zeros((2, 3))), mt.tensor(np.zeros((4, 2))))
    with pytest.raises(ValueError, match="matmul: a must have at least 1 axis"):
        F.matmul(mt.tensor(1.0), mt.tensor([1.0]))
    with pytest.raises(ValueError, match="matmul: transpose_b needs b with 2 or more axes"):
        F.matmul(mt.tensor(np.zeros((2, 3))), mt.tensor(np.zeros(3)), transpose_b=True)
    with pytest.raises(ValueError, match=r"matmul: the batch axes of a \(2,\) and b \(3,\)"):
        F.matmul(mt.tensor(np.zeros((2, 2, 2))), mt.tensor(np.zeros((3, 2, 2))))
    with pytest.raises(TypeError, match="matmul: b must not be bool"):
        F.matmul(mt.tensor([[1.0]]), mt.tensor([[True]]))


def test_dot():
    out = F.dot(mt.tensor([1.0, 2.0, 3.0]), np.array([4.0, 5.0, 6.0], np.float32))
    assert out.shape == () and out.item() == 32.0
    assert F.dot(mt.tensor([1, 2]), mt.tensor([3, 4])).dtype == np.int32
    with pytest.raises(ValueError, match="dot: y must be 1-d"):
        F.dot(mt.tensor([1.0]), mt.tensor([[1.0]]))
    with pytest.raises(ValueError, match="dot: x has 2 elements but y has 3"):
        F.dot(mt.tensor([1.0, 2.0]), mt.tensor([1.0, 2.0, 3.0]))


# ------------------------------------------------------------------ docs

@pytest.mark.parametrize("name", ["math", "nn", "tensor"])
def test_docstring_examples_run(name):
    mod = importlib.import_module(f"mgtrace.functional.{name}")
    result = doctest.testmod(mod, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0
    assert result.attempted >= 40


def test_every_public_function_is_documented_with_an_example():
    for name in F.__all__:
        fn = getattr(F, name)
        assert fn.__doc__ and ">>>" in fn.__doc__, f"F.{name} lacks a doctest example"


def test_pow_of_integers_gives_float32_never_a_silent_zero():
    """F.pow and ** follow MegEngine's POW (integer operands in float32):
    the issue's example, with a scalar, a tensor and a NumPy exponent."""
    x = mt.tensor([2, 0, -2, 3], dtype="int32")
    want = [0.5, float("inf"), -0.5, np.float32(1 / 3).item()]
    assert (x ** -1).tolist() == want and (x ** -1).dtype == "float32"
    assert F.pow(x, -1).tolist() == want
    assert F.pow(x, mt.tensor([-1, -1, -1, -1])).tolist() == want
    assert F.pow(x.numpy(), np.int64(-1)).tolist() == want
    e = np.array([-2, 3, -1, 2], np.int32)
    with np.errstate(divide="ignore"):
        np.testing.assert_array_equal(F.pow(x, e).numpy(),
                                      np.power(x.numpy().astype(np.float64), e).astype(np.float32))
