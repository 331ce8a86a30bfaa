"""Reductions, scans, softmax and sorting (mgtrace._core.reduce) against NumPy.

Every value is checked against an independent NumPy reference computed in
float64 / int64 and cast to the result dtype mgtrace promises (MegEngine's
rules). Tolerances, per result dtype, scaled by the magnitude of what was
summed (sum of |x| for sums, |ref| elsewhere):

    float16 2e-3, bfloat16 1.6e-2, float32 1e-5, float64 1e-12, plus the
    dtype's smallest subnormal (results that round into the subnormal
    range); integers, bool, max/min, arg-reductions, sort and topk are exact.

Views: transposes (``.transpose``/``.T``), and strided or reversed slices
made with ``mgtrace.from_dlpack`` of a sliced NumPy array (zero-copy, the
tensor keeps NumPy's strides), plus broadcast (stride 0) views.
"""
import doctest
import math

import ml_dtypes
import numpy as np
import pytest

import mgtrace as mt
import mgtrace._core.reduce as R
from mgtrace._core import dispatch, op_table, trace_hooks

BF16 = np.dtype(ml_dtypes.bfloat16)
DTYPES = ["bool", "int8", "uint8", "int16", "uint16", "int32", "int64",
          "float16", "bfloat16", "float32", "float64"]
INTS = ["int8", "uint8", "int16", "uint16", "int32", "int64"]
FLOATS = ["float16", "bfloat16", "float32", "float64"]
RTOL = {"float16": 2e-3, "bfloat16": 1.6e-2, "float32": 1e-5, "float64": 1e-12}
ATOL = {n: float(ml_dtypes.finfo(BF16 if n == "bfloat16" else n).smallest_subnormal) for n in RTOL}

AXES_3D = [None, 0, 1, 2, -1, (0, 2), (1, 2), (2, 0), (0, 1, 2), (), [1], (-3, -1)]


def npdt(name):
    return BF16 if name == "bfloat16" else np.dtype(name)


def is_float(name):
    return name in FLOATS


def sum_dtype(name):          # SUM rule: bool -> int32, else keep
    return "int32" if name == "bool" else name


def float_dtype(name):        # FLOAT rule: ints and bool -> float32
    return name if is_float(name) else "float32"


def make(shape, dtype, seed=0, low=None, high=None):
    """Random data of ``dtype`` (NumPy array), small so int sums do not wrap
    unless a test wants them to."""
    rng = np.random.default_rng(seed)
    if dtype == "bool":
        return rng.random(shape) < 0.5
    if dtype in INTS:
        lo = low if low is not None else (0 if dtype.startswith("u") else -20)
        hi = high if high is not None else 20
        return rng.integers(lo, hi, size=shape).astype(dtype)
    if low is not None:
        a = rng.uniform(low, high, size=shape)
    else:
        a = rng.standard_normal(shape) * 3
    return a.astype(npdt(dtype))


def strided(base, index):
    """(tensor, array) for base[index] as a zero-copy strided view: DLPack of
    the sliced NumPy array; bfloat16, which NumPy cannot export, is sliced by
    mgtrace itself. None when neither is possible."""
    arr = base[index]
    try:
        return mt.from_dlpack(arr), arr
    except BufferError:
        try:
            return mt.tensor(base)[index], arr
        except (KeyError, NotImplementedError, TypeError):  # no getitem in this build
            return None


def f64(a):
    return np.asarray(a).astype(np.float64)


def norm_axes(axis, nd):
    if axis is None:
        return tuple(range(nd))
    axes = axis if isinstance(axis, (tuple, list)) else (axis,)
    return tuple(sorted(a % nd for a in axes))


def check_float(got, ref, dtype, scale):
    """got (Tensor) against ref (float64 array): |got - ref| <= rtol * scale,
    NaNs in the same places."""
    g = f64(got.numpy())
    ref = np.asarray(ref, dtype=np.float64)
    assert g.shape == ref.shape
    assert np.array_equal(np.isnan(g), np.isnan(ref))
    ok = ~np.isnan(ref)
    tol = RTOL[dtype] * np.broadcast_to(np.asarray(scale, dtype=np.float64), ref.shape)[ok] + ATOL[dtype]
    err = np.abs(g[ok] - ref[ok])
    assert np.all(err <= tol), f"max error {err.max() if err.size else 0} (tol {tol.max() if tol.size else 0})"


def check_exact(got, ref, dtype):
    g = got.numpy()
    assert got.dtype == npdt(dtype), (got.dtype, dtype)
    ref = np.asarray(ref).astype(npdt(dtype))
    assert g.shape == ref.shape, (g.shape, ref.shape)
    if is_float(dtype):
        assert np.array_equal(f64(g), f64(ref), equal_nan=True)
    else:
        assert np.array_equal(g, ref)


# ------------------------------------------------------------------ reference reductions

def ref_sum(a, axis, keepdims, dtype):
    if is_float(dtype):
        return np.sum(f64(a), axis=axis, keepdims=keepdims)
    return np.sum(a.astype(np.int64), axis=axis, keepdims=keepdims).astype(npdt(sum_dtype(dtype)))


def ref_prod(a, axis, keepdims, dtype):
    if is_float(dtype):
        return np.prod(f64(a), axis=axis, keepdims=keepdims)
    return np.prod(a.astype(np.int64), axis=axis, keepdims=keepdims).astype(npdt(sum_dtype(dtype)))


def ref_arg(a, axis, keepdims, fn):
    """np.argmax/argmin generalised to several axes: flat C-order index over them."""
    a = f64(a) if a.dtype.kind in "fV" else a
    nd = a.ndim
    axes = norm_axes(axis, nd)
    kept = [d for d in range(nd) if d not in axes]
    moved = np.transpose(a, kept + list(axes))
    flat = moved.reshape(moved.shape[:len(kept)] + (-1,))
    r = fn(flat, axis=-1)
    if keepdims:
        r = np.expand_dims(r, axes)
    return r


def run_reduce(op, t, a, axis, keepdims, dtype):
    """Calls op on tensor t and checks it against array a (same values)."""
    ax = tuple(axis) if isinstance(axis, list) else axis
    got = getattr(R, op)(t, axis=axis, keepdims=keepdims)
    if op == "sum":
        assert got.dtype == npdt(sum_dtype(dtype))
        ref = ref_sum(a, ax, keepdims, dtype)
        if is_float(dtype):
            check_float(got, ref, dtype, np.sum(np.abs(f64(a)), axis=ax, keepdims=keepdims) + 1e-30)
        else:
            check_exact(got, ref, sum_dtype(dtype))
    elif op == "prod":
        assert got.dtype == npdt(sum_dtype(dtype))
        ref = ref_prod(a, ax, keepdims, dtype)
        if is_float(dtype):
            check_float(got, ref, dtype, np.abs(ref))
        else:
            check_exact(got, ref, sum_dtype(dtype))
    elif op == "mean":
        assert got.dtype == npdt(float_dtype(dtype))
        ref = np.mean(f64(a), axis=ax, keepdims=keepdims)
        check_float(got, ref, float_dtype(dtype), np.mean(np.abs(f64(a)), axis=ax, keepdims=keepdims) + 1e-30)
    elif op in ("max", "min"):
        fn = np.max if op == "max" else np.min
        ref = fn(f64(a), axis=ax, keepdims=keepdims) if is_float(dtype) else fn(a, axis=ax, keepdims=keepdims)
        check_exact(got, ref, dtype)
    elif op in ("argmax", "argmin"):
        ref = ref_arg(a, ax, keepdims, np.argmax if op == "argmax" else np.argmin)
        check_exact(got, ref, "int32")
    elif op in ("any", "all"):
        fn = np.any if op == "any" else np.all
        check_exact(got, fn(a != 0, axis=ax, keepdims=keepdims), "bool")
    else:
        raise AssertionError(op)


REDUCE_OPS = ["sum", "prod", "mean", "max", "min", "argmax", "argmin", "any", "all"]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", REDUCE_OPS)
def test_reduce_every_dtype_and_axis(op, dtype):
    low, high = (0.5, 1.5) if op == "prod" and is_float(dtype) else (None, None)
    if op == "prod" and dtype in INTS:
        low, high = (0 if dtype.startswith("u") else -3), 4
    a = make((3, 4, 5), dtype, seed=1, low=low, high=high)
    t = mt.tensor(a)
    for axis in AXES_3D:
        if op in ("argmax", "argmin") and axis == ():
            continue  # arg-reductions need at least one axis... covered below
        for keepdims in (False, True):
            run_reduce(op, t, a, axis, keepdims, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", REDUCE_OPS)
def test_reduce_views(op, dtype):
    """Transposed, strided, reversed and broadcast views: no copy, same values."""
    low, high = (0.5, 1.5) if op == "prod" and is_float(dtype) else (None, None)
    if op == "prod" and dtype in INTS:
        low, high = (0 if dtype.startswith("u") else -3), 4
    base = make((6, 7, 8), dtype, seed=2, low=low, high=high)
    views = [
        (mt.tensor(base).transpose(2, 0, 1), base.transpose(2, 0, 1)),
        (mt.tensor(base).T, base.T),
        strided(base, (slice(None, None, 2), slice(1, None), slice(None, None, 3))),
        strided(base, (slice(None), slice(None, None, -1), slice(2, 7))),
        (mt.tensor(base[0]).broadcast_to((3, 7, 8)), np.broadcast_to(base[0], (3, 7, 8))),
        (mt.tensor(base).transpose(1, 2, 0), base.transpose(1, 2, 0)),
    ]
    for t, a in filter(None, views):
        assert t.shape == a.shape
        for axis in [None, 0, 1, 2, (0, 1), (1, 2), (0, 2)]:
            for keepdims in (False, True):
                run_reduce(op, t, a, axis, keepdims, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("ddof", [0, 1, 2.5])
@pytest.mark.parametrize("op", ["var", "std"])
def test_var_std(op, dtype, ddof):
    a = make((4, 5, 6), dtype, seed=3)
    views = [(mt.tensor(a), a), (mt.tensor(a).transpose(2, 1, 0), a.transpose(2, 1, 0))]
    for t, arr in views:
        for axis in [None, 0, 1, -1, (0, 2), (1, 2)]:
            for keepdims in (False, True):
                got = getattr(R, op)(t, axis=axis, keepdims=keepdims, ddof=ddof)
                assert got.dtype == npdt(float_dtype(dtype))
                ref = getattr(np, op)(f64(arr), axis=axis, keepdims=keepdims, ddof=ddof)
                check_float(got, ref, float_dtype(dtype), np.abs(ref) + 1e-12)
                # Tensor methods reach the same kernel
                m = getattr(t, op)(axis, keepdims, ddof)
                assert np.array_equal(m.numpy(), got.numpy(), equal_nan=True)


@pytest.mark.filterwarnings("ignore:Degrees of freedom:RuntimeWarning")
def test_var_degenerate_ddof():
    """max(N - ddof, 0) as the divisor, like NumPy: 0/0 -> NaN, x/0 -> inf."""
    with np.errstate(all="ignore"):
        for data, ddof in [([1.0, 1.0, 1.0], 3), ([1.0, 1.0, 1.0], 5), ([1.0, 2.0], 2), ([3.0], 1)]:
            ref = np.var(np.array(data), ddof=ddof)
            got = R.var(mt.tensor(data), ddof=ddof).item()
            assert (math.isnan(got) and math.isnan(ref)) or got == ref


def test_var_is_accurate_with_a_large_offset():
    """Two-pass blocks: no catastrophic cancellation (naive E[x^2]-E[x]^2 fails)."""
    rng = np.random.default_rng(4)
    a = (1e6 + rng.standard_normal(300_000)).astype(np.float64)
    got = R.var(mt.tensor(a)).item()
    assert abs(got - np.var(a)) <= 1e-9 * np.var(a)
    got32 = R.std(mt.tensor(a.astype(np.float32))).item()
    ref32 = np.std(a.astype(np.float32).astype(np.float64))
    assert abs(got32 - ref32) <= 1e-5 * ref32


# ------------------------------------------------------------------ dtype rules

@pytest.mark.parametrize("dtype", DTYPES)
def test_result_dtypes(dtype):
    t = mt.tensor(make((2, 3), dtype))
    expect = {
        "sum": sum_dtype(dtype), "prod": sum_dtype(dtype), "mean": float_dtype(dtype),
        "var": float_dtype(dtype), "std": float_dtype(dtype), "max": dtype, "min": dtype,
        "argmax": "int32", "argmin": "int32", "any": "bool", "all": "bool",
    }
    for op, want in expect.items():
        assert getattr(R, op)(t, axis=1).dtype == npdt(want), op
        assert getattr(t, op)(axis=1).dtype == npdt(want), op
    assert R.cumsum(t, 1).dtype == npdt(sum_dtype(dtype))
    assert R.cumprod(t, 1).dtype == npdt(sum_dtype(dtype))
    assert R.softmax(t).dtype == npdt(float_dtype(dtype))
    assert R.log_softmax(t).dtype == npdt(float_dtype(dtype))
    v, i = R.sort(t)
    assert v.dtype == npdt(dtype) and i.dtype == np.int32
    v, i = R.topk(t, 2)
    assert v.dtype == npdt(dtype) and i.dtype == np.int32


def test_integer_sums_wrap_in_the_input_dtype():
    """Accumulated in int64, stored in the input dtype (MegEngine keeps int8)."""
    a = np.full((1000,), 100, dtype=np.int8)
    assert R.sum(mt.tensor(a)).item() == np.int64(100_000).astype(np.int8)
    assert R.sum(mt.tensor(np.full(3, 60_000, np.uint16))).item() == (180_000 % 65536)
    big = np.array([2**62, 2**62, 5], dtype=np.int64)
    assert R.sum(mt.tensor(big)).item() == int(np.sum(big))   # wraps like NumPy
    assert R.cumsum(mt.tensor(np.array([100, 100, 100], np.int8)), 0).tolist() == [100, -56, 44]
    assert R.sum(mt.tensor(np.ones(70_000, bool))).item() == 70_000   # bool -> int32
    # mean accumulates in float64: no int64 overflow (its result is float32)
    huge = np.full(4, 2**62, np.int64)
    assert R.mean(mt.tensor(huge)).item() == pytest.approx(2.0**62, rel=1e-7)


# ------------------------------------------------------------------ empty, NaN, edge cases

def test_empty_reductions():
    a = np.zeros((0, 3), np.float32)
    t = mt.tensor(a)
    assert R.sum(t, axis=0).tolist() == [0, 0, 0]
    assert R.prod(t, axis=0).tolist() == [1, 1, 1]
    assert R.sum(t).item() == 0 and R.prod(t).item() == 1
    assert np.isnan(R.mean(t, axis=0).numpy()).all()
    assert np.isnan(R.var(t, axis=0).numpy()).all()
    assert R.any(t, axis=0).tolist() == [False] * 3
    assert R.all(t, axis=0).tolist() == [True] * 3
    for op in ("max", "min", "argmax", "argmin"):
        with pytest.raises(ValueError, match="empty"):
            getattr(R, op)(t, axis=0)
        with pytest.raises(ValueError, match="empty"):
            getattr(R, op)(t)
        # nothing to reduce into: an empty result, no error (NumPy)
        assert getattr(R, op)(t, axis=1).shape == (0,)
    assert R.sum(t, axis=1).shape == (0,)
    assert R.sum(t, axis=0, keepdims=True).shape == (1, 3)
    ti = mt.tensor(np.zeros((2, 0), np.int16))
    assert R.sum(ti, axis=1).tolist() == [0, 0] and R.sum(ti, axis=1).dtype == np.int16
    assert R.cumsum(ti, 1).shape == (2, 0)
    assert R.softmax(mt.tensor(np.zeros((0, 4), np.float32))).shape == (0, 4)
    v, i = R.sort(ti)
    assert v.shape == (2, 0) and i.shape == (2, 0)


def test_zero_d_inputs():
    s = mt.tensor(3.5)
    assert R.sum(s).item() == 3.5 and R.sum(s).shape == ()
    assert R.max(s, axis=None, keepdims=True).shape == ()
    assert R.argmax(s).item() == 0
    assert R.softmax(s).shape == () and R.softmax(s).item() == 1.0
    assert R.cumsum(s, 0).item() == 3.5
    v, i = R.sort(s)
    assert v.shape == () and v.item() == 3.5 and i.item() == 0
    assert R.sum(2.5).item() == 2.5  # Python scalars become tensors
    with pytest.raises(IndexError):
        R.sum(s, axis=0)


def test_nan_handling():
    nan = float("nan")
    a = np.array([[1.0, nan, 3.0, nan], [4.0, 2.0, 1.0, 0.0], [nan, 9.0, -1.0, 2.0]], np.float32)
    for dtype in FLOATS:
        t = mt.tensor(a.astype(npdt(dtype)))
        for op, fn in (("max", np.max), ("min", np.min), ("argmax", np.argmax), ("argmin", np.argmin)):
            for axis in (None, 0, 1):
                check_exact(getattr(R, op)(t, axis=axis), fn(a, axis=axis),
                            "int32" if op.startswith("arg") else dtype)
        assert np.isnan(R.sum(t).item()) and np.isnan(R.mean(t, axis=1).numpy()[0])
        assert R.any(mt.tensor(np.array([0.0, nan], npdt(dtype)))).item() is True
        v, i = R.sort(t, axis=1)
        assert np.array_equal(f64(v.numpy()), np.sort(a, axis=1).astype(np.float64), equal_nan=True)
        assert np.array_equal(i.numpy(), np.argsort(a, axis=1, kind="stable"))
    # a long run: the vectorised block path (NaN far from the start)
    b = np.arange(5000, dtype=np.float32)
    b[3001] = nan
    b[4000] = nan
    assert R.argmax(mt.tensor(b)).item() == 3001 and R.argmin(mt.tensor(b)).item() == 3001
    assert np.isnan(R.max(mt.tensor(b)).item()) and np.isnan(R.min(mt.tensor(b)).item())


def test_arg_first_occurrence_and_extremes():
    for dtype in INTS + ["bool"]:
        info = np.iinfo(dtype) if dtype != "bool" else None
        lo = info.min if info else False
        hi = info.max if info else True
        a = np.array([lo, hi, lo, hi, lo], dtype=dtype)
        assert R.argmax(mt.tensor(a)).item() == 1
        assert R.argmin(mt.tensor(a)).item() == 0
        assert R.max(mt.tensor(np.full(7, lo, dtype))).item() == lo
        assert R.argmax(mt.tensor(np.full(7, lo, dtype))).item() == 0
        assert R.argmin(mt.tensor(np.full(7, hi, dtype))).item() == 0
    f = np.array([-np.inf, -np.inf], np.float32)
    assert R.argmax(mt.tensor(f)).item() == 0 and R.max(mt.tensor(f)).item() == -np.inf


# ------------------------------------------------------------------ big inputs: the parallel paths

def test_float32_sum_is_accurate():
    """Within 1e-6 relative of NumPy's float64 sum on 1M random values."""
    rng = np.random.default_rng(5)
    a = rng.random(1 << 20, dtype=np.float32)
    got = R.sum(mt.tensor(a)).item()
    ref = np.sum(a, dtype=np.float64)
    assert abs(got - ref) <= 1e-6 * abs(ref)
    a2 = (rng.standard_normal(3_000_001) + 0.1).astype(np.float32)
    got = R.sum(mt.tensor(a2)).item()
    ref = np.sum(a2, dtype=np.float64)
    assert abs(got - ref) <= 1e-6 * np.sum(np.abs(a2), dtype=np.float64)
    h = rng.random(20_000).astype(np.float16)   # the sum stays below float16's max
    check_float(R.sum(mt.tensor(h)), np.sum(f64(h)), "float16", np.sum(f64(h)))


@pytest.mark.parametrize("dtype", ["float32", "float64", "int32", "int8", "bfloat16", "bool"])
def test_large_paths(dtype):
    """Shapes that pick each kernel path: contiguous full reduction split over
    threads, inner-axis rows, outer-axis rows (tiles, and few tiles split over
    threads), strided per-output."""
    shapes_axes = [
        ((1 << 19,), 0),            # full contiguous, chunks + ordered combine
        ((3, 200_000), 1),          # few outputs, long inner runs
        ((200_000, 3), 0),          # rows path, one tile, rows split over threads
        ((600, 700), 0),            # rows path, several tiles (700 = 2*256 + 188)
        ((700, 600), 1),            # many outputs, inner contiguous
        ((50, 40, 30), (0, 2)),     # rows path with two reduced dims
    ]
    for shape, axis in shapes_axes:
        a = make(shape, dtype, seed=6)
        for t, arr in ((mt.tensor(a), a), (mt.tensor(np.ascontiguousarray(a.T)).T, a)):
            for op in ("sum", "mean", "max", "argmax", "argmin", "any"):
                if op.startswith("arg") and isinstance(axis, tuple):
                    continue
                run_reduce(op, t, arr, axis, False, dtype)
            got = R.var(t, axis=axis)
            ref = np.var(f64(arr), axis=axis)
            check_float(got, ref, float_dtype(dtype), np.abs(ref) + 1e-12)


def test_argmax_first_occurrence_across_threads():
    """Equal maxima in different chunks: the lowest index wins after combine."""
    a = np.zeros(1 << 20, np.float32)
    a[[700_000, 100_000, 900_000]] = 5
    assert R.argmax(mt.tensor(a)).item() == 100_000
    a = np.zeros((4, 300_000), np.int16)
    a[:, 250_000] = 3
    a[:, 20] = 3
    assert R.argmax(mt.tensor(a), axis=1).tolist() == [20] * 4
    b = np.zeros((300_000, 5), np.float64)
    b[10, :] = -1
    b[200_000, :] = -1
    assert R.argmin(mt.tensor(b), axis=0).tolist() == [10] * 5


def test_num_threads_do_not_change_results():
    rng = np.random.default_rng(7)
    a = rng.standard_normal((5, 400_000)).astype(np.float32)
    t = mt.tensor(a)
    try:
        old = dispatch.get_num_threads()
        results = []
        for n in (1, 2, 3):
            dispatch.set_num_threads(n)
            results.append((R.sum(t, axis=1).numpy(), R.argmax(t).item(), R.max(t, axis=0).numpy()))
        dispatch.set_num_threads(old)
    except ImportError:  # set_num_threads also sizes BLAS (linalg extension)
        pytest.skip("mgtrace._core.linalg is not built")
    for s, am, mx in results:
        assert np.allclose(s, results[0][0], rtol=1e-6, atol=1e-3)
        assert am == results[0][1] and np.array_equal(mx, results[0][2])


# ------------------------------------------------------------------ softmax

def ref_softmax(a, axis, log=False):
    x = f64(a)
    m = np.max(x, axis=axis, keepdims=True)
    e = np.exp(x - m)
    s = np.sum(e, axis=axis, keepdims=True)
    return (x - m - np.log(s)) if log else e / s


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("log", [False, True])
def test_softmax(dtype, log):
    fn = R.log_softmax if log else R.softmax
    a = make((4, 5, 6), dtype, seed=8)
    views = [(mt.tensor(a), a), (mt.tensor(a).transpose(2, 0, 1), a.transpose(2, 0, 1)),
             strided(a, (slice(None), slice(None, None, -2)))]
    for t, arr in filter(None, views):
        for axis in (0, 1, 2, -1, -2):
            got = fn(t, axis=axis)
            assert got.dtype == npdt(float_dtype(dtype)) and got.shape == arr.shape
            ref = ref_softmax(arr.astype(np.float32) if dtype == "bool" else arr, axis, log)
            check_float(got, ref, float_dtype(dtype), np.abs(ref) + (0 if log else 1e-7))
    assert np.allclose(fn(mt.tensor(a)).numpy().astype(np.float64), fn(mt.tensor(a), axis=-1).numpy().astype(np.float64))


def test_softmax_is_stable_and_nan_stays_in_its_line():
    x = mt.tensor([[1000.0, 1000.0], [-1000.0, 0.0], [float("nan"), 1.0]])
    s = R.softmax(x).numpy()
    assert np.allclose(s[0], [0.5, 0.5]) and np.allclose(s[1], [0.0, 1.0])
    assert np.isnan(s[2]).all()
    ls = R.log_softmax(x).numpy()
    assert np.allclose(ls[0], [-math.log(2)] * 2) and np.allclose(ls[1], [-1000.0, 0.0])
    # a big tiled case: softmax over axis 1 of NCHW reads whole rows
    a = make((2, 37, 9, 300), "float32", seed=9)
    check_float(R.softmax(mt.tensor(a), axis=1), ref_softmax(a, 1), "float32", 1)
    check_float(R.log_softmax(mt.tensor(a), axis=1), ref_softmax(a, 1, True), "float32",
                np.abs(ref_softmax(a, 1, True)))


# ------------------------------------------------------------------ cumsum / cumprod

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", ["cumsum", "cumprod"])
def test_scans(op, dtype):
    low, high = (None, None)
    if op == "cumprod":
        low, high = ((0.8, 1.25) if is_float(dtype) else ((0 if dtype.startswith("u") else -2), 3))
    a = make((4, 5, 6), dtype, seed=10, low=low, high=high)
    fn, npfn = getattr(R, op), getattr(np, op)
    views = [(mt.tensor(a), a), (mt.tensor(a).transpose(1, 2, 0), a.transpose(1, 2, 0)),
             strided(a, (slice(None, None, -1), slice(1, None), slice(None, None, 2)))]
    for t, arr in filter(None, views):
        for axis in (0, 1, 2, -1, None):
            got = fn(t, axis)
            if is_float(dtype):
                ref = npfn(f64(arr), axis=axis)
                check_float(got, ref, dtype, np.abs(ref) + (1 if op == "cumsum" else 0)
                            * np.max(np.abs(f64(arr))))
            else:
                check_exact(got, npfn(arr.astype(np.int64), axis=axis), sum_dtype(dtype))
    with pytest.raises(TypeError):
        fn(mt.tensor(a))   # axis is required (None: flattened)


def test_cumsum_tiled_and_long():
    a = make((3, 1000, 257), "float32", seed=11)
    check_float(R.cumsum(mt.tensor(a), 1), np.cumsum(f64(a), axis=1), "float32",
                np.cumsum(np.abs(f64(a)), axis=1))
    b = make((2_000_000,), "int32", seed=11)
    check_exact(R.cumsum(mt.tensor(b), 0), np.cumsum(b.astype(np.int64)), "int32")


# ------------------------------------------------------------------ sort / argsort / topk

def ref_order(line, descending):
    """Stable order of a 1-d float64/int line: NaN is the largest value."""
    def key(i):
        v = line[i]
        nan = isinstance(v, float) and math.isnan(v)
        if descending:
            return (not nan, 0 if nan else -v, i)
        return (nan, 0 if nan else v, i)
    return sorted(range(len(line)), key=key)


def ref_sort(a, axis, descending, k=None):
    """(values, indices) by ref_order along axis, first k."""
    moved = np.moveaxis(a, axis, -1)
    n = moved.shape[-1]
    k = n if k is None else k
    flat = moved.reshape(-1, n)
    keyd = f64(flat) if a.dtype.kind in "fV" else flat.astype(object)
    idx = np.array([ref_order([x if not isinstance(x, np.floating) else float(x) for x in row],
                              descending)[:k] for row in keyd], dtype=np.int64).reshape(flat.shape[0], k)
    vals = np.take_along_axis(flat, idx, axis=1)
    shape = moved.shape[:-1] + (k,)
    return (np.moveaxis(vals.reshape(shape), -1, axis), np.moveaxis(idx.reshape(shape), -1, axis))


@pytest.mark.parametrize("dtype", DTYPES)
def test_sort_and_argsort(dtype):
    a = make((3, 4, 9), dtype, seed=12, low=(-4 if dtype not in ("uint8", "uint16") else 0), high=4) \
        if dtype in INTS else make((3, 4, 9), dtype, seed=12)
    if is_float(dtype):
        a = np.round(f64(a)).astype(npdt(dtype))   # ties
        a[0, 1, 3] = np.nan
        a[2, 0, 0] = np.nan
    views = [(mt.tensor(a), a), (mt.tensor(a).transpose(2, 0, 1), a.transpose(2, 0, 1)),
             strided(a, (slice(None), slice(None, None, -1)))]
    for t, arr in filter(None, views):
        for axis in (0, 1, 2, -1):
            for desc in (False, True):
                v, i = R.sort(t, axis=axis, descending=desc)
                rv, ri = ref_sort(arr, axis, desc)
                check_exact(i, ri, "int32")
                check_exact(v, rv, dtype)
                check_exact(R.argsort(t, axis=axis, descending=desc), ri, "int32")
                if not desc:   # NumPy's own stable sort agrees
                    npv = np.sort(f64(arr) if is_float(dtype) else arr, axis=axis, kind="stable")
                    assert np.array_equal(f64(v.numpy()), f64(npv), equal_nan=True)


@pytest.mark.parametrize("dtype", ["int8", "uint16", "int64", "float16", "bfloat16", "float32", "float64", "bool"])
def test_topk(dtype):
    a = make((5, 40), dtype, seed=13, low=0, high=9) if dtype in INTS else make((5, 40), dtype, seed=13)
    if is_float(dtype):
        a[1, 7] = np.nan
    t = mt.tensor(a)
    for k in (0, 1, 3, 17, 39, 40):
        for desc in (True, False):
            v, i = R.topk(t, k, descending=desc)
            rv, ri = ref_sort(a, 1, desc, k)
            check_exact(i, ri, "int32")
            check_exact(v, rv, dtype)
            v2, i2 = R.topk(t, k, descending=desc, sorted=False)
            assert np.array_equal(np.sort(i2.numpy(), axis=1), np.sort(ri, axis=1))
            assert np.array_equal(np.take_along_axis(a, i2.numpy().astype(np.int64), 1).astype(np.float64),
                                  f64(v2.numpy()), equal_nan=True)
    # along axis 0 of a transposed view
    v, i = R.topk(t.T, 2, axis=0)
    rv, ri = ref_sort(a.T, 0, True, 2)
    check_exact(i, ri, "int32")
    check_exact(v, rv, dtype)


def test_topk_large_and_adversarial():
    rng = np.random.default_rng(14)
    for a in (rng.standard_normal(100_000).astype(np.float32),
              np.arange(100_000, dtype=np.int32),               # sorted
              np.arange(100_000, dtype=np.int32)[::-1].copy(),  # reversed
              np.full(100_000, 7, np.int16),                    # all ties
              np.tile(np.arange(10, dtype=np.float64), 10_000)):  # organ pipe of ties
        for desc in (True, False):
            # k <= n/16 streams through a heap; larger k uses introselect
            for k in (10, 6_250, 30_000):
                v, i = R.topk(mt.tensor(a), k, descending=desc)
                key = -f64(a) if desc else f64(a)
                ri = np.argsort(key, kind="stable")[:k]
                assert np.array_equal(i.numpy(), ri)
                assert np.array_equal(v.numpy(), a[ri])
                _, iu = R.topk(mt.tensor(a), k, descending=desc, sorted=False)
                assert np.array_equal(np.sort(iu.numpy()), np.sort(ri))
    s = rng.standard_normal((64, 3000)).astype(np.float32)
    v, i = R.sort(mt.tensor(s), axis=1)
    assert np.array_equal(v.numpy(), np.sort(s, axis=1))
    assert np.array_equal(i.numpy(), np.argsort(s, axis=1, kind="stable"))


# ------------------------------------------------------------------ bad input

def test_bad_axes():
    t = mt.tensor(np.zeros((2, 3), np.float32))
    for op in ("sum", "mean", "max", "argmax", "any", "var"):
        f = getattr(R, op)
        with pytest.raises(IndexError, match="out of bounds"):
            f(t, axis=2)
        with pytest.raises(IndexError, match="out of bounds"):
            f(t, axis=(0, -3))
        with pytest.raises(ValueError, match="more than once"):
            f(t, axis=(1, -1))
        with pytest.raises(TypeError):
            f(t, axis=1.0)
        with pytest.raises(TypeError):
            f(t, axis=True)
        with pytest.raises(TypeError):
            f(t, axis="0")
    for f in (R.softmax, R.log_softmax, R.argsort):
        with pytest.raises(IndexError):
            f(t, axis=5)
        with pytest.raises(TypeError):
            f(t, axis=None)
    with pytest.raises(IndexError):
        R.cumsum(t, 2)
    with pytest.raises(IndexError):
        R.sort(t, axis=-3)


def test_bad_k_and_inputs():
    t = mt.tensor(np.arange(6, dtype=np.float32).reshape(2, 3))
    with pytest.raises(ValueError, match="out of range"):
        R.topk(t, 4)
    with pytest.raises(ValueError, match="out of range"):
        R.topk(t, -1)
    with pytest.raises(TypeError):
        R.topk(t, 1.5)
    with pytest.raises(TypeError):
        R.topk(t, None)
    with pytest.raises(TypeError):
        R.sum(None)
    with pytest.raises(TypeError):
        R.sum("abc")
    with pytest.raises(TypeError):
        R.sum(object())
    # array-likes are converted (MegEngine's defaults for Python data)
    assert R.sum([[1, 2], [3, 4]], axis=1).tolist() == [3, 7]
    assert R.sum([1.5, 2.5]).dtype == np.float32
    assert R.max(np.array([1, 5, 3], np.int16)).dtype == np.int16
    assert R.argsort((3, 1, 2)).tolist() == [1, 2, 0]


def test_logical_cpu_devices_keep_their_device():
    a = make((3, 4), "float32", seed=15)
    t = mt.tensor(a, device="cpu:1")
    for r in (R.sum(t, axis=0), R.argmax(t, axis=1), R.var(t), R.softmax(t), R.cumsum(t, 0),
              R.sort(t)[0], R.sort(t)[1], R.topk(t, 2)[1], R.argsort(t), t.mean()):
        assert r.device == mt.Device("cpu:1")
    assert np.allclose(R.sum(t, axis=0).numpy(), a.sum(axis=0), rtol=1e-6)
    ti = mt.tensor(np.arange(4, dtype=np.int32), device="cpu:2")
    s = R.softmax(ti)   # int -> float32 cast keeps the device
    assert s.device == mt.Device("cpu:2") and s.dtype == np.float32


# ------------------------------------------------------------------ methods, apply(), tracing

def test_tensor_methods():
    a = make((3, 4), "int16", seed=16)
    t = mt.tensor(a)
    assert t.sum().item() == int(a.astype(np.int64).sum())
    assert t.sum(1, True).shape == (3, 1)
    assert t.max(axis=0).tolist() == a.max(axis=0).tolist()
    assert t.argmin().item() == int(np.argmin(a))
    assert t.any() .item() == bool(a.any()) and t.all(axis=1).tolist() == a.all(axis=1).tolist()
    assert abs(t.std(ddof=1).item() - np.std(a.astype(np.float64), ddof=1)) < 1e-5
    assert abs(t.mean().item() - a.mean()) < 1e-5
    assert t.prod(axis=0).tolist() == np.prod(a.astype(np.int64), axis=0).astype(np.int16).tolist()


def test_apply_runs_registered_ops():
    t = mt.tensor(np.array([[3, 1], [2, 5]], np.int32))
    assert mt.apply(mt.OpDef("sum", {"axis": 0}), t).tolist() == [5, 6]
    assert mt.apply(mt.OpDef("argmax", {"axis": 1, "keepdims": True}), t).tolist() == [[0], [1]]
    v, i = mt.apply(mt.OpDef("topk", {"k": 1, "axis": 0}), t)
    assert v.tolist() == [[3, 5]] and i.tolist() == [[0, 1]]
    assert mt.apply(mt.OpDef("var", {"ddof": 1}), t).item() == pytest.approx(np.var([3, 1, 2, 5], ddof=1))
    assert mt.apply(mt.OpDef("cumsum", {"axis": 1}), t).tolist() == [[3, 4], [2, 7]]
    for name in op_table.GROUPS["reduce"] + op_table.GROUPS["sort"]:
        assert name in dispatch._IMPLS


def test_module_tracing_sees_every_op():
    t = mt.tensor(np.arange(6, dtype=np.float32).reshape(2, 3))
    seen = []

    class Hook(trace_hooks.TraceHook):
        def on_apply(self, op, *inputs):
            seen.append((op.name, dict(op.params)))
            return mt.apply(op, *inputs)

    with trace_hooks.installed(Hook()):
        s = R.sum(t, axis=1)
        m = t.mean(0, True)
        sd = t.std(None, False, 1)
        v, i = R.topk(t, 2, axis=1, sorted=False)
        sm = R.softmax(t, axis=0)
        cs = R.cumsum(t, 1)
        am = t.argmax()
    assert seen == [
        ("sum", {"axis": 1, "keepdims": False}),
        ("mean", {"axis": 0, "keepdims": True}),
        ("std", {"axis": None, "keepdims": False, "ddof": 1}),
        ("topk", {"k": 2, "axis": 1, "descending": True, "sorted": False}),
        ("softmax", {"axis": 0}),
        ("cumsum", {"axis": 1}),
        ("argmax", {"axis": None, "keepdims": False}),
    ]
    # the hook ran the ops for real
    assert s.tolist() == [3.0, 12.0] and m.shape == (1, 3) and am.item() == 5
    assert sorted(i.numpy()[0].tolist()) == [1, 2]
    assert np.allclose(sm.numpy(), ref_softmax(t.numpy(), 0))
    assert cs.tolist() == [[0, 1, 3], [3, 7, 12]]
    assert sd.item() == pytest.approx(np.std(np.arange(6), ddof=1), rel=1e-6)


def test_docstring_examples_run():
    result = doctest.testmod(R, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 15 and result.failed == 0
