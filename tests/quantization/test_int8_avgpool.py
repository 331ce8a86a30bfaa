"""Int8 average pooling on the integers (qpool.c): each output the window's
integer sum less the zero point per element, divided exactly and rounded
half to even, plus the zero point, bitwise a NumPy integer reference
written here (both modes, padding, ceil_mode, adaptive and global windows,
exact .5 ties of both signs, zero points at both ends of uint8, a plane
split over threads); F.avg_pool2d / F.adaptive_avg_pool2d and the pooling
modules of a quantized tensor keep its dtype and qparams."""
import numpy as np
import pytest

import mgtrace as mt
import mgtrace.functional as F
import mgtrace.module as M
from mgtrace.quantization import int8
from mgtrace.quantization.qtensor import dequantize, is_quantized, qparams_of, quantize
from mgtrace.quantization.utils import QuantMode, QuantizationError, create_qparams, quant_dtype

F32 = np.float32


def _round_half_even(total, d):
    """total / d rounded half to even (float64 division of integers this
    small is exact at the ties and never lands on one elsewhere)."""
    return np.rint(total.astype(np.float64) / d).astype(np.int64)


def _reference(x, zp, rows, cols):
    """rows / cols: per output index, (the input indices it reads, divisor)."""
    n, c = x.shape[:2]
    info = np.iinfo(x.dtype)
    out = np.empty((n, c, len(rows), len(cols)), x.dtype)
    q = x.astype(np.int64) - zp
    for i, (ri, dy) in enumerate(rows):
        for j, (ci, dx) in enumerate(cols):
            total = q[:, :, ri][:, :, :, ci].sum(axis=(2, 3))
            v = _round_half_even(total, dy * dx) if dy * dx else np.zeros_like(total)
            out[:, :, i, j] = np.clip(v + zp, info.min, info.max)
    return out


def _pool_axis(n, k, s, p, ceil, include):
    """PyTorch's avg_pool2d windows along one axis: (input indices, divisor)."""
    span = n + 2 * p - k
    o = (-(-span // s) if ceil else span // s) + 1
    if ceil and (o - 1) * s >= n + p:
        o -= 1
    out = []
    for i in range(o):
        a, b = i * s - p, min(i * s - p + k, n + p)
        idx = [t for t in range(a, b) if 0 <= t < n]
        out.append((idx, (b - a) if include else len(idx)))
    return out


def _adaptive_axis(n, m):
    return [(list(range(i * n // m, -(-(i + 1) * n // m))),
             -(-(i + 1) * n // m) - i * n // m) for i in range(m)]


CASES = [   # (shape, kernel, stride, padding, ceil_mode)
    ((2, 3, 9, 11), (3, 3), (2, 2), (1, 1), False),
    ((1, 2, 8, 8), (2, 2), (2, 2), (0, 0), False),
    ((2, 2, 7, 10), (3, 2), (1, 3), (1, 1), True),
    ((1, 3, 5, 1), (1, 3), (1, 3), (0, 1), True),       # one column, padding each side
    ((1, 2, 13, 12), (4, 3), (3, 2), (2, 1), True),     # last window mostly padding
    ((1, 64, 56, 56), (3, 3), (2, 2), (1, 1), False),   # split over threads
]
ZPS = {np.uint8: (0, 131, 255), np.int8: (0, -7)}


def _data(shape, dtype, seed):
    rng = np.random.default_rng(seed)
    info = np.iinfo(dtype)
    x = rng.integers(info.min, int(info.max) + 1, shape).astype(dtype)
    x.flat[::7] = info.min
    x.flat[3::11] = info.max
    return x


@pytest.mark.parametrize("case", range(len(CASES)))
@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
@pytest.mark.parametrize("mode", ["average_count_exclude_padding", "average"])
def test_kernel_is_the_rounded_integer_mean(case, dtype, mode):
    shape, k, s, p, ceil = CASES[case]
    x = _data(shape, dtype, case)
    include = mode == "average"
    rows = _pool_axis(shape[2], k[0], s[0], p[0], ceil, include)
    cols = _pool_axis(shape[3], k[1], s[1], p[1], ceil, include)
    for zp in ZPS[dtype]:
        want = _reference(x, zp, rows, cols)
        got = int8.avg_pool2d(x, k, s, p, mode, ceil, zero_point=zp)
        assert got.dtype == dtype
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(int8.avg_pool2d(x, k, s, p, mode, ceil, zp, path=1), want)


@pytest.mark.parametrize("shape, oshp", [
    ((2, 64, 7, 7), 1),                 # ResNet-18's global pool
    ((1, 3, 7, 5), (3, 2)),             # overlapping windows
    ((2, 2, 5, 9), (None, 4)),          # None keeps the rows
    ((1, 1, 3, 3), (5, 4)),             # more outputs than inputs
])
@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
def test_adaptive_kernel_is_the_rounded_integer_mean(shape, oshp, dtype):
    x = _data(shape, dtype, sum(shape))
    oh, ow = (oshp, oshp) if isinstance(oshp, int) else oshp
    oh, ow = shape[2] if oh is None else oh, shape[3] if ow is None else ow
    rows, cols = _adaptive_axis(shape[2], oh), _adaptive_axis(shape[3], ow)
    for zp in ZPS[dtype]:
        want = _reference(x, zp, rows, cols)
        np.testing.assert_array_equal(int8.adaptive_avg_pool2d(x, oshp, zp), want)
        np.testing.assert_array_equal(int8.adaptive_avg_pool2d(x, oshp, zp, path=1), want)


def test_ties_round_half_to_even_on_both_signs():
    # windows of two: (0, 1) 0.5 -> 0, (1, 2) 1.5 -> 2, (-1, 0) -0.5 -> 0,
    # (-2, -1) -1.5 -> -2, (-3, 0) -1.5 -> -2, (126, 127) 126.5 -> 126
    x = np.array([0, 1, 1, 2, -1, 0, -2, -1, -3, 0, 126, 127], np.int8).reshape(1, 1, 1, 12)
    got = int8.avg_pool2d(x, (1, 2))
    np.testing.assert_array_equal(got.reshape(-1), [0, 2, 0, -2, -2, 126])
    # uint8 with zero point 128: the same values shifted
    u = (x.astype(np.int16) + 128).astype(np.uint8)
    np.testing.assert_array_equal(int8.avg_pool2d(u, (1, 2), zero_point=128).reshape(-1),
                                  np.array([0, 2, 0, -2, -2, 126]) + 128)
    # "average" mode: a padded corner is the real 0, the zero point; 3 / 4 -> 1,
    # 2 / 4 -> 0 (a tie, even), 6 / 4 -> 2 (a tie, even)
    y = np.array([[3, 0], [2, 6]], np.uint8).reshape(1, 1, 2, 2)
    got = int8.avg_pool2d(y + 10, 2, 1, 1, "average", zero_point=10)
    np.testing.assert_array_equal(got[0, 0] - 10, [[1, 1, 0], [1, 3, 2], [0, 2, 2]])


def _qt(x, dtype, scale, zp):
    q = create_qparams(QuantMode.SYMMERTIC if dtype == "qint8" else QuantMode.ASYMMERTIC,
                       quant_dtype(dtype), mt.tensor(F32(scale)),
                       None if dtype == "qint8" else mt.tensor(F32(zp)))
    return quantize(mt.tensor(x), q)


@pytest.mark.parametrize("dtype, scale, zp", [("qint8", 0.05, 0), ("quint8", 0.1, 7),
                                               ("quint8", 0.02, 255)])
def test_functional_and_modules_pool_a_quantized_tensor_on_its_integers(dtype, scale, zp):
    rng = np.random.default_rng(5)
    x = _qt((rng.standard_normal((2, 4, 9, 8)) * 3).astype(F32), dtype, scale, zp)
    ints = np.asarray(x.numpy())
    calls = [
        (F.avg_pool2d(x, 3, 2, 1), int8.avg_pool2d(ints, 3, 2, 1, zero_point=zp)),
        (F.avg_pool2d(x, 3, 2, 1, mode="average", ceil_mode=True),
         int8.avg_pool2d(ints, 3, 2, 1, "average", True, zp)),
        (M.AvgPool2d(2)(x), int8.avg_pool2d(ints, 2, zero_point=zp)),
        (F.adaptive_avg_pool2d(x, 1), int8.adaptive_avg_pool2d(ints, 1, zp)),
        (M.AdaptiveAvgPool2d((2, 3))(x), int8.adaptive_avg_pool2d(ints, (2, 3), zp)),
    ]
    for got, want in calls:
        assert is_quantized(got) and got.dtype == x.dtype
        assert qparams_of(got) == qparams_of(x)
        np.testing.assert_array_equal(np.asarray(got.numpy()), want)
    # the float pool of the dequantized values, quantized again: the same but
    # where float rounding moves a tie (at most one step)
    fl = quantize(F.avg_pool2d(dequantize(x), 3, 2, 1), qparams_of(x))
    diff = np.asarray(calls[0][0].numpy()).astype(int) - np.asarray(fl.numpy()).astype(int)
    assert np.abs(diff).max() <= 1 and (diff == 0).mean() > 0.95


def test_bad_input_is_refused_by_name():
    x = np.zeros((1, 1, 4, 4), np.int8)
    with pytest.raises(QuantizationError, match="mode"):
        int8.avg_pool2d(x, 2, mode="max")
    with pytest.raises(QuantizationError, match="padding"):
        int8.avg_pool2d(x, 2, padding=2)
    with pytest.raises(QuantizationError, match="int8 / uint8"):
        int8.avg_pool2d(x.astype(np.int32), 2)
    with pytest.raises(QuantizationError, match="zero point"):
        int8.avg_pool2d(x, 2, zero_point=200)
    with pytest.raises(QuantizationError, match="output size"):
        int8.adaptive_avg_pool2d(x, 0)
    with pytest.raises(QuantizationError, match="mode"):
        F.avg_pool2d(_qt(np.zeros((1, 1, 4, 4), F32), "qint8", 0.1, 0), 2, mode="median")


@pytest.mark.parametrize("qconfig", ["min_max_fakequant_qconfig", "per_channel_quint8_qconfig"])
def test_a_model_written_with_stubs_pools_globally_on_the_integers(qconfig):
    """QuantStub, ConvBnRelu2d, a global average pool, DequantStub
    (MegEngine's way) quantized: the pool reads the conv's int8 output
    and averages its integers (qint8 with MinMax, quint8 per channel)."""
    import mgtrace.quantization as Q
    mt.random.seed(3)
    rng = np.random.default_rng(3)
    net = Q.quantize_qat(M.Sequential(M.QuantStub(), M.ConvBnRelu2d(3, 8, 3, padding=1),
                                      M.AdaptiveAvgPool2d(1), M.DequantStub()),
                         qconfig=getattr(Q, qconfig))
    net(mt.tensor(rng.random((4, 3, 8, 8)).astype(F32)))
    net = Q.quantize(net.eval())
    x = mt.tensor(rng.random((2, 3, 8, 8)).astype(F32))
    conv_out = net[1](net[0](x))
    assert is_quantized(conv_out)
    ints = np.asarray(conv_out.numpy())
    zp = qparams_of(conv_out).zero_point
    zp = 0 if zp is None else int(np.asarray(zp.numpy()))
    assert ints.dtype == (np.uint8 if "quint8" in qconfig else np.int8)
    pooled = net[2](conv_out)
    np.testing.assert_array_equal(np.asarray(pooled.numpy()),
                                  int8.adaptive_avg_pool2d(ints, 1, zp, path=1))
    y = net(x)
    assert y.dtype == np.float32 and y.shape == (2, 8, 1, 1)
    np.testing.assert_array_equal(y.numpy(), dequantize(pooled).numpy())
    # traced, saved and loaded, it pools the same integers
    import io
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tm = mt.trace_module(net, x)
    f = io.BytesIO()
    mt.save(tm, f)
    f.seek(0)
    np.testing.assert_array_equal(mt.load(f)(x).numpy(), y.numpy())


def test_megengine_differs_only_where_a_tie_rounds_away_from_zero():
    # MegEngine 1.13's F.avg_pool2d(t, (1, 2), (1, 2)) and F.adaptive_avg_pool2d(t,
    # (1, 1)) of these qint8(0.5) integers, recorded from its CPU build
    # (/work/venvs/mge310): it keeps the dtype and rounds half away from zero
    x = np.array([0, 1, 1, 2, -1, 0, -2, -1, -3, 0, 126, 127, 5, 6, 100, 100],
                 np.int8).reshape(1, 1, 1, 16)
    megengine = np.array([1, 2, -1, -2, -2, 127, 6, 100])
    got = int8.avg_pool2d(x, (1, 2)).reshape(-1)
    ties_away = [0, 2, 5]          # 0.5, -0.5, 126.5: half to even gives 0, 0, 126
    np.testing.assert_array_equal(np.delete(got, ties_away), np.delete(megengine, ties_away))
    np.testing.assert_array_equal(got[ties_away], [0, 0, 126])
    assert int8.adaptive_avg_pool2d(x, 1).item() == 29         # MegEngine's 29 (461 / 16)


def test_a_plane_too_large_for_int32_sums():
    # 4200 x 2048 uint8 of mostly 255 sum past 2**31: the kernel sums in int64
    x = np.full((1, 1, 4200, 2048), 255, np.uint8)
    x[0, 0, ::97, ::89] = 0
    assert x.astype(np.int64).sum() > 2 ** 31
    for oshp in (1, (2, 1)):
        rows = _adaptive_axis(4200, 1 if oshp == 1 else 2)
        np.testing.assert_array_equal(int8.adaptive_avg_pool2d(x, oshp, 5),
                                      _reference(x, 5, rows, _adaptive_axis(2048, 1)))


def test_onnx_export_refuses_an_average_pool_of_a_quantized_tensor(tmp_path):
    # ONNX's float AveragePool between DequantizeLinear and QuantizeLinear
    # rounds some ties otherwise: the exporter names the fix, writes nothing
    pytest.importorskip("onnx")
    import warnings
    import mgtrace.onnx
    import mgtrace.quantization as Q
    mt.random.seed(4)
    rng = np.random.default_rng(4)
    net = Q.quantize_qat(M.Sequential(M.QuantStub(), M.ConvBnRelu2d(3, 4, 3, padding=1),
                                      M.AdaptiveAvgPool2d(1), M.DequantStub()),
                         qconfig=Q.per_channel_quint8_qconfig)
    net(mt.tensor(rng.random((2, 3, 6, 6)).astype(F32)))
    net = Q.quantize(net.eval())
    x = mt.tensor(rng.random((1, 3, 6, 6)).astype(F32))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tm = mt.trace_module(net, x)
    path = tmp_path / "pool.onnx"
    with pytest.raises(mgtrace.onnx.ExportError, match="DequantStub before the pool"):
        mgtrace.onnx.export(tm, str(path), example_inputs=(x,))
    assert not path.exists()


@pytest.mark.parametrize("zp", [float("nan"), 1.5, "3", None, True, float("inf")])
def test_a_zero_point_that_is_no_integer_is_refused(zp):
    # int() read "3" as 3 and 1.5 as 1; NaN and None leaked its ValueError /
    # TypeError
    x = np.full((1, 1, 2, 2), 9, np.uint8)
    for pool in (lambda: int8.avg_pool2d(x, 2, zero_point=zp),
                 lambda: int8.adaptive_avg_pool2d(x, 1, zero_point=zp)):
        with pytest.raises(QuantizationError, match="zero point must be an integer"):
            pool()


def test_an_integral_float_zero_point_is_its_integer():
    x = np.array([[[[9, 10], [12, 200]]]], np.uint8)
    for zp in (7.0, np.float32(7), np.int64(7)):
        assert int8.avg_pool2d(x, 2, zero_point=zp).tolist() == [[[[58]]]]   # 231 / 4 - 7 * 0
