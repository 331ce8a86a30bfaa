"""Every elementwise op against NumPy, per dtype, with broadcasting and
non-contiguous operands. Tolerances: see conftest.tolerance (exact for ints
and bool; float16 2e-3, bfloat16 1.6e-2, float32 2e-6 relative)."""
import math
import warnings

import ml_dtypes
import numpy as np
import pytest

import mgtrace as mt
from mgtrace._core import dispatch
from conftest import ALL_DTYPES, FLOAT_DTYPES, INT_DTYPES, assert_close, np_dtype, random_array

F32 = np.float32
np_erf = np.vectorize(math.erf, otypes=[np.float64])


def np_ref(name):
    """NumPy reference for op ``name`` computed in float64 or the int dtype."""
    g = 0.7978845608028654
    return {
        "neg": np.negative, "abs": np.abs, "sign": np.sign, "square": np.square,
        "round": np.round, "floor": np.floor, "ceil": np.ceil, "trunc": np.trunc,
        "exp": np.exp, "expm1": np.expm1, "log": np.log, "log1p": np.log1p, "log2": np.log2,
        "sqrt": np.sqrt, "rsqrt": lambda x: 1 / np.sqrt(x), "sin": np.sin, "cos": np.cos,
        "tan": np.tan, "tanh": np.tanh, "erf": np_erf, "asin": np.arcsin, "acos": np.arccos,
        "atan": np.arctan, "relu": lambda x: np.maximum(x, 0).astype(x.dtype),
        "relu6": lambda x: np.clip(x, 0, 6).astype(x.dtype),
        "sigmoid": lambda x: 1 / (1 + np.exp(-x)),
        "gelu": lambda x: 0.5 * x * (1 + np_erf(x / np.sqrt(2))),
        "gelu_tanh": lambda x: 0.5 * x * (1 + np.tanh(g * (x + 0.044715 * x ** 3))),
        "silu": lambda x: x / (1 + np.exp(-x)),
        "hardswish": lambda x: x * np.clip(x + 3, 0, 6) / 6,
        "hardsigmoid": lambda x: np.clip(x + 3, 0, 6) / 6,
        "softplus": lambda x: np.log1p(np.exp(x)),
        "isnan": np.isnan, "isinf": np.isinf, "isfinite": np.isfinite,
        "logical_not": np.logical_not, "bitwise_not": np.invert,
        "add": np.add, "sub": np.subtract, "mul": np.multiply, "truediv": np.true_divide,
        "floordiv": np.floor_divide, "mod": np.mod, "pow": np.power, "maximum": np.maximum,
        "minimum": np.minimum, "atan2": np.arctan2, "eq": np.equal, "ne": np.not_equal,
        "lt": np.less, "le": np.less_equal, "gt": np.greater, "ge": np.greater_equal,
        "logical_and": np.logical_and, "logical_or": np.logical_or,
        "logical_xor": np.logical_xor, "bitwise_and": np.bitwise_and,
        "bitwise_or": np.bitwise_or, "bitwise_xor": np.bitwise_xor,
        "left_shift": np.left_shift, "right_shift": np.right_shift,
    }[name]


DOMAIN = {  # inputs inside each function's domain
    "log": (0.5, 20), "log1p": (0, 20), "log2": (0.5, 20), "sqrt": (0, 20), "rsqrt": (0.5, 20),
    "asin": (-1, 1), "acos": (-1, 1), "exp": (-10, 10), "expm1": (-10, 10), "tan": (-1.2, 1.2),
    "softplus": (-10, 10), "pow": (0, 4),
}


def supported(name, dtype):
    rule = dispatch.RULES[name]
    if name in ("left_shift", "right_shift"):
        return dtype in INT_DTYPES
    if rule == "int":
        return dtype in INT_DTYPES or dtype == "bool"
    if name in ("sub", "neg", "abs", "sign", "square", "floordiv", "mod", "round", "floor",
                "ceil", "trunc", "relu", "relu6"):
        return dtype != "bool"
    if name in ("left_shift", "right_shift"):
        return dtype in INT_DTYPES
    return True


def inputs(name, dtype, shape, rng):
    if dtype in FLOAT_DTYPES and name in DOMAIN:
        lo, hi = DOMAIN[name]
        return rng.uniform(lo, hi, size=shape).astype(np_dtype(dtype))
    if name in ("left_shift", "right_shift"):
        return rng.integers(0, 5, size=shape).astype(dtype)
    if name == "pow" and dtype in INT_DTYPES:
        return rng.integers(0, 4, size=shape).astype(dtype)
    return random_array(shape, dtype, rng)


def expected_unary(name, a, dtype):
    rule = dispatch.RULES[name]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if dtype in FLOAT_DTYPES or rule == "float":
            ref = np_ref(name)(a.astype(np.float64))
            if rule == "bool":
                return ref
            out_dtype = np_dtype(dtype) if dtype in FLOAT_DTYPES else np.dtype("float32")
            return ref.astype(out_dtype)
        return np_ref(name)(a)


@pytest.mark.parametrize("name", sorted(dispatch.UNARY))
@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_unary_matches_numpy(name, dtype, rng):
    if not supported(name, dtype):
        with pytest.raises((NotImplementedError, TypeError)):
            dispatch.unary_ops[name](mt.tensor(random_array((3,), dtype, rng)))
        return
    a = inputs(name, dtype, (5, 7), rng)
    expected = expected_unary(name, a, dtype)
    out = dispatch.unary_ops[name](mt.tensor(a))
    assert out.dtype == expected.dtype
    assert_close(out, expected, rtol=None if name not in ("tan", "softplus") else 1e-2)
    # non-contiguous input: a transposed view
    out_t = dispatch.unary_ops[name](mt.tensor(a).T)
    assert_close(out_t, expected.T, rtol=None if name not in ("tan", "softplus") else 1e-2)


SHAPES = [((4, 5), (4, 5)), ((4, 1), (1, 5)), ((3, 4, 5), (5,)), ((1,), (2, 3)), ((), (3,)),
          ((0, 3), (1, 3))]


@pytest.mark.parametrize("name", sorted(dispatch.BINARY))
@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_binary_matches_numpy(name, dtype, rng):
    fn = dispatch.binary_ops[name]
    if not supported(name, dtype):
        with pytest.raises((NotImplementedError, TypeError)):
            fn(mt.tensor(random_array((3,), dtype, rng)), mt.tensor(random_array((3,), dtype, rng)))
        return
    rule = dispatch.RULES[name]
    for sa, sb in SHAPES:
        a = inputs(name, dtype, sa, rng)
        b = inputs(name, dtype, sb, rng)
        if name in ("floordiv", "mod", "truediv") and dtype in INT_DTYPES + ["bool"]:
            b = np.where(b == 0, 1, b).astype(b.dtype)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if dtype in FLOAT_DTYPES or rule == "float":
                ref = np_ref(name)(a.astype(np.float64), b.astype(np.float64))
                out_dtype = np_dtype(dtype) if dtype in FLOAT_DTYPES else np.dtype("float32")
                expected = ref if rule == "bool" else ref.astype(out_dtype)
            else:
                expected = np_ref(name)(a, b)
                if dtype == "bool" and name in ("add", "mul", "maximum", "minimum"):
                    expected = expected.astype(bool)
        out = fn(mt.tensor(a), mt.tensor(b))
        assert out.dtype == expected.dtype, (sa, sb)
        assert_close(out, expected, rtol=1e-2 if name == "pow" and dtype == "bfloat16" else None)


@pytest.mark.parametrize("dtype", ["int8", "uint8", "int32", "int64", "float32", "float64"])
def test_binary_non_contiguous_and_scalar_operands(dtype, rng):
    a = random_array((6, 8), dtype, rng)
    b = random_array((8, 6), dtype, rng)
    ta, tb = mt.tensor(a), mt.tensor(b)
    assert_close(ta[::2, 1::3] + tb.T[::2, 1::3], a[::2, 1::3] + b.T[::2, 1::3])
    assert_close(ta * 3, (a * np.array(3, dtype=a.dtype)).astype(a.dtype))
    assert_close(3 - ta, (np.array(3, dtype=a.dtype) - a).astype(a.dtype))
    assert_close(ta.T - tb, a.T - b)


def test_large_strided_and_threaded(rng):
    # big enough for the multi-threaded path, with an odd inner size
    a = rng.standard_normal((513, 1031)).astype(F32)
    b = rng.standard_normal((1031,)).astype(F32)
    assert_close(mt.tensor(a) * mt.tensor(b), a * b)
    assert_close(mt.tensor(a).T + 1.0, a.T + F32(1))
    assert_close(dispatch.unary_ops["exp"](mt.tensor(a)), np.exp(a))


def test_integer_division_edge_cases():
    a = mt.tensor([7, -7, 7, -7, -2147483648, 5], "int32")
    b = mt.tensor([2, 2, -2, -2, -1, 0], "int32")
    with np.errstate(all="ignore"):
        na, nb = a.numpy(), b.numpy()
        assert (a // b).tolist() == (na // nb).tolist()
        assert (a % b).tolist() == (na % nb).tolist()


def test_float_floordiv_and_mod_follow_python():
    a = mt.tensor([7.5, -7.5, 7.5, -7.5, 0.0], "float64")
    b = mt.tensor([2.0, 2.0, -2.0, -2.0, -3.0], "float64")
    assert (a // b).tolist() == [7.5 // 2, -7.5 // 2, 7.5 // -2, -7.5 // -2, 0.0 // -3.0]
    assert (a % b).tolist() == [7.5 % 2, -7.5 % 2, 7.5 % -2, -7.5 % -2, 0.0 % -3.0]


def test_nan_propagation_in_max_min():
    a = mt.tensor([np.nan, 1.0, 2.0])
    b = mt.tensor([1.0, np.nan, 0.0])
    np.testing.assert_array_equal(dispatch.binary_ops["maximum"](a, b).numpy(),
                                  np.maximum(a.numpy(), b.numpy()))
    np.testing.assert_array_equal(dispatch.binary_ops["minimum"](a, b).numpy(),
                                  np.minimum(a.numpy(), b.numpy()))


def test_half_precision_rounding_matches_numpy(rng):
    # conversions round to nearest even, incl. subnormals, overflow and nan
    vals = np.concatenate([rng.standard_normal(1000) * 1e3, rng.standard_normal(1000) * 1e-6,
                           [65504, 65520, 1e9, -1e9, np.inf, -np.inf, np.nan, 5.96e-8, 2.98e-8,
                            6.1e-5, -0.0]]).astype(F32)
    for name in ("float16", "bfloat16"):
        got = mt.tensor(vals).astype(name).numpy()
        want = vals.astype(np_dtype(name))
        np.testing.assert_array_equal(got.view(np.uint16)[~np.isnan(want.astype(F32))],
                                      want.view(np.uint16)[~np.isnan(want.astype(F32))])
        assert np.isnan(got.astype(F32)[np.isnan(want.astype(F32))]).all()


@pytest.mark.parametrize("src", ALL_DTYPES)
@pytest.mark.parametrize("dst", ALL_DTYPES)
def test_cast_matches_numpy(src, dst, rng):
    a = random_array((4, 6), src, rng, low=-100, high=100)
    if dst in INT_DTYPES and src in FLOAT_DTYPES:
        a = np.abs(a)  # negative float -> unsigned is undefined in C and NumPy alike
    if dst.startswith("uint") and src.startswith("int"):
        a = np.abs(a).astype(a.dtype)
    got = mt.tensor(a).T.astype(dst)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want = a.T.astype(np_dtype(dst))
    assert got.dtype == np_dtype(dst)
    assert_close(got, want)


def test_where_and_clip(rng):
    c = rng.random((3, 4)) > 0.5
    a = rng.standard_normal((3, 4)).astype(F32)
    b = rng.standard_normal((4,)).astype(F32)
    assert_close(dispatch.ternary_ops["where"](mt.tensor(c), mt.tensor(a), mt.tensor(b)),
                 np.where(c, a, b))
    assert_close(dispatch.ternary_ops["where"](mt.tensor(c), mt.tensor(a), 0.0), np.where(c, a, F32(0)))
    assert_close(dispatch.ternary_ops["clip"](mt.tensor(a), -0.5, 0.5), np.clip(a, -0.5, 0.5))
    i = rng.integers(-10, 10, (5,)).astype(np.int16)
    out = dispatch.ternary_ops["clip"](mt.tensor(i), -3, 4)
    assert out.dtype == "int16" and out.tolist() == np.clip(i, -3, 4).tolist()


def test_inplace_operators(rng):
    a = rng.standard_normal((3, 4)).astype(F32)
    t = mt.tensor(a)
    ptr = t.data_ptr
    t += 1.0
    t *= mt.tensor(a)
    t -= 2
    t /= 4
    assert t.data_ptr == ptr
    assert_close(t, ((a + F32(1)) * a - F32(2)) / F32(4))
    i = mt.tensor([1, 2, 3], "int8")
    i += mt.tensor([1, 1, 1], "int16")  # same kind: computed in int16, stored as int8
    assert i.dtype == "int8" and i.tolist() == [2, 3, 4]
    with pytest.raises(TypeError, match="same-kind"):
        i += 1.5
    with pytest.raises(ValueError, match="does not match"):
        x = mt.tensor([1.0, 2.0])
        x += mt.tensor([[1.0, 2.0], [3.0, 4.0]])


def test_inplace_with_overlapping_views_reads_before_writing():
    a = np.arange(10, dtype=F32)
    t = mt.tensor(a)
    t[1:] += t[:-1]
    a[1:] += a[:-1].copy()
    assert_close(t, a)


def test_broadcast_error_names_shapes():
    with pytest.raises(ValueError, match=r"\(2, 3\) \(4,\)"):
        mt.tensor(np.ones((2, 3), F32)) + mt.tensor(np.ones(4, F32))


@pytest.mark.parametrize("dtype", INT_DTYPES + ["bool"])
def test_integer_power_is_computed_in_float32(dtype):
    """pow of integer and bool operands is computed in float32, as MegEngine's
    POW is (its dtype promotion casts all-integer POW inputs to float32): a
    negative exponent gives fractions, never the integer 0 it once silently
    gave. NumPy refuses integers to negative integer powers instead; the
    values here are NumPy's float64 results rounded to float32."""
    signed = dtype.startswith("int")
    base = np.array([2, 0, -2, 3] if signed else [2, 0, 5, 3]).astype(dtype)
    exps = [-1, -2, 3, np.array([-1, 2, -3, 0] if signed else [1, 2, 0, 3]).astype(dtype)]
    if dtype == "bool":
        exps = [True, False, np.array([True, False, True, False])]
    for e in exps:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")        # 0 ** -1: inf, as NumPy's float power
            want = np.power(base.astype(np.float64), np.asarray(e).astype(np.float64)).astype(np.float32)
        operand = mt.tensor(e) if isinstance(e, np.ndarray) else e
        for got in (mt.tensor(base) ** operand, dispatch.binary_ops["pow"](mt.tensor(base), operand)):
            assert got.dtype == "float32"
            np.testing.assert_array_equal(got.numpy(), want)
    if signed:
        # the reflected operator: a Python int base, an integer tensor exponent
        got = 2 ** mt.tensor(np.array([-1, 0, 3], dtype))
        assert got.dtype == "float32" and got.tolist() == [0.5, 1.0, 8.0]
        # NumPy's own rule, which MegEngine's (followed here) replaces
        with pytest.raises(ValueError, match="Integers to negative integer powers are not allowed"):
            np.power(base, -1)


def test_integer_power_in_place_keeps_the_same_kind_rule():
    t = mt.tensor([2, 3], "int32")
    with pytest.raises(TypeError, match=r"pow: cannot store a float32 result in place into a int32"):
        t **= -1
    assert t.tolist() == [2, 3]
    f = mt.tensor([2.0, 4.0])
    f **= -1
    assert f.tolist() == [0.5, 0.25]


BOOL_REFUSED = [  # (what a user writes, the NumPy spelling, the fix the message must name)
    ("bool - bool", lambda a, b: a - b, "^"),
    ("bool - True", lambda a, b: a - True, "^"),
    ("True - bool", lambda a, b: True - a, "^"),
    ("-bool", lambda a, b: -a, "~"),
]


@pytest.mark.parametrize("label, op, fix", BOOL_REFUSED, ids=[r[0] for r in BOOL_REFUSED])
def test_bool_sub_and_neg_raise_type_error_naming_the_fix(label, op, fix):
    """bool subtraction and negation are refused as NumPy refuses them (its
    TypeError is the reference), with the logical op to use instead."""
    a, b = np.array([True, False, True]), np.array([True, True, False])
    with pytest.raises(TypeError):
        op(a, b)
    with pytest.raises(TypeError, match=r"not supported") as err:
        op(mt.tensor(a), mt.tensor(b))
    assert fix in str(err.value) and ("sub" in str(err.value) or "neg" in str(err.value))


def test_bool_in_place_sub_raises_and_leaves_the_tensor_alone():
    a = np.array([True, False])
    with pytest.raises(TypeError):
        a -= True
    t = mt.tensor(np.array([True, False]))
    with pytest.raises(TypeError, match=r"\^"):
        t -= True
    assert t.numpy().tolist() == [True, False]


def test_bool_with_int_scalar_still_promotes():
    """The refusal is for a bool compute dtype only: bool - 1 is int32 by the promotion rule."""
    out = mt.tensor(np.array([True, False])) - 1
    assert out.dtype == "int32" and out.numpy().tolist() == [0, -1]
    assert (-mt.tensor(np.array([True, False]), dtype="int8")).numpy().tolist() == [-1, 0]
