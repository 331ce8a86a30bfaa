"""Int8 linear and conv2d kernels (issue 32, items 4-5): bitwise equal to a
NumPy integer reference (int64 accumulation, float64 requantization, round
half to even), on both paths (VNNI where this CPU has it, portable C),
including exact .5 ties, saturation at both ends, zero points at both ends,
tiny scales, odd K and N, grouped and depthwise convolutions with stride,
padding and dilation."""
import numpy as np
import pytest

from mgtrace.quantization import int8
from mgtrace.quantization.utils import QuantizationError

PATHS = [1] + ([0] if int8.has_vnni() else [])


def ref_requant(acc, mult, out_zp, lo, hi, dtype):
    y = np.rint(acc.astype(np.float64) * mult) + out_zp
    return np.clip(y, lo, hi).astype(dtype)


def ref_bias(bias, x_scale, w_scale):
    if bias is None:
        return 0
    b = np.rint(bias.astype(np.float64) / (np.float64(np.float32(x_scale))
                                           * w_scale.astype(np.float64)))
    return np.clip(b, -2 ** 31, 2 ** 31 - 1).astype(np.int64)


def ref_linear(x, x_zp, w, w_scale, bias, x_scale, out_scale, out_zp, dtype, relu):
    acc = (x.astype(np.int64) - x_zp) @ w.astype(np.int64).T + ref_bias(bias, x_scale, w_scale)
    mult = np.float64(np.float32(x_scale)) * w_scale.astype(np.float64) / \
        np.float64(np.float32(out_scale))
    info = np.iinfo(dtype)
    lo = max(info.min, out_zp) if relu else info.min
    return ref_requant(acc, mult, out_zp, lo, info.max, dtype)


def ref_conv(x, x_zp, w, groups, stride, padding, dilation):
    """int64 [N, Co, OH, OW] accumulators, padding with the zero point."""
    n, ci, h, wd = x.shape
    co, cig, kh, kw = w.shape
    (sh, sw), (ph, pw), (dh, dw) = stride, padding, dilation
    xp = np.full((n, ci, h + 2 * ph, wd + 2 * pw), x_zp, np.int64)
    xp[:, :, ph:ph + h, pw:pw + wd] = x
    xp -= x_zp
    oh = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    ow = (wd + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    out = np.zeros((n, co, oh, ow), np.int64)
    per = co // groups
    for o in range(co):
        g = o // per
        for i in range(kh):
            for j in range(kw):
                patch = xp[:, g * cig:(g + 1) * cig, i * dh:i * dh + sh * (oh - 1) + 1:sh,
                           j * dw:j * dw + sw * (ow - 1) + 1:sw]
                out[:, o] += np.einsum("nchw,c->nhw", patch, w[o, :, i, j].astype(np.int64))
    return out


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("signed", [True, False])
@pytest.mark.parametrize("relu", [False, True])
def test_linear_bitwise_equals_numpy(path, signed, relu):
    rng = np.random.default_rng(10 + signed + 2 * relu)
    m, k, n = 7, 37, 21                                  # K and N not block multiples
    if signed:
        x = rng.integers(-128, 128, (m, k)).astype(np.int8)
        x_zp, out_dtype, out_zp = 0, "qint8", 0
    else:
        x = rng.integers(0, 256, (m, k)).astype(np.uint8)
        x_zp, out_dtype, out_zp = 131, "quint8", 77
    x[0] = x.min() if signed else 0                      # an input at each end
    x[1] = 127 if signed else 255
    w = rng.integers(-127, 128, (n, k)).astype(np.int8)
    w[0] = 127
    w_scale = rng.uniform(0.001, 0.01, n).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32)
    weight = int8.Int8Weight(w, w_scale, bias)
    x_scale, out_scale = 0.05, 0.02
    got = int8.linear(x, x_scale, x_zp, weight, out_scale, out_zp, out_dtype, relu, path=path)
    want = ref_linear(x, x_zp, w, w_scale, bias, x_scale, out_scale, out_zp,
                      np.int8 if signed else np.uint8, relu)
    np.testing.assert_array_equal(got, want)
    info = np.iinfo(want.dtype)
    assert (want == info.max).any()                      # saturation is exercised
    assert (want == (max(info.min, out_zp) if relu else info.min)).any()


@pytest.mark.parametrize("path", PATHS)
def test_ties_round_half_to_even_and_tiny_scales(path):
    # mult = 0.5 exactly: every odd accumulator is a .5 tie
    x = np.arange(-9, 10, dtype=np.int8).reshape(-1, 1)
    w = np.ones((1, 1), np.int8)
    weight = int8.Int8Weight(w, 1.0)
    got = int8.linear(x, 1.0, 0, weight, 2.0, path=path)
    np.testing.assert_array_equal(got[:, 0], np.rint(np.arange(-9, 10) / 2).astype(np.int8))
    assert list(got[7:12, 0]) == [-1, 0, 0, 0, 1]         # -1, -0.5, 0, 0.5, 1: ties to even
    # tiny scales: a 1e-30 output scale saturates, a 1e-30 input scale gives 0 (+ zp)
    big = int8.linear(x, 1.0, 0, weight, 1e-30, path=path)
    assert big.min() == -128 and big.max() == 127
    small = int8.linear(x, 1e-30, 0, weight, 1.0, out_zp=3, path=path)
    assert (small == 3).all()


def test_both_paths_agree_on_a_large_product():
    if not int8.has_vnni():
        pytest.skip("no AVX-512 VNNI here")
    rng = np.random.default_rng(5)
    x = rng.integers(0, 256, (33, 300)).astype(np.uint8)
    w = rng.integers(-127, 128, (70, 300)).astype(np.int8)
    weight = int8.Int8Weight(w, 0.003)
    a = int8.linear(x, 0.1, 128, weight, 0.5, 128, "quint8", path=0)
    b = int8.linear(x, 0.1, 128, weight, 0.5, 128, "quint8", path=1)
    np.testing.assert_array_equal(a, b)


CONVS = {   # name: (x shape, Co, KH, KW, groups, stride, padding, dilation)
    "dense": ((2, 5, 9, 8), 6, 3, 3, 1, (1, 1), (1, 1), (1, 1)),
    "strided": ((1, 4, 10, 9), 5, 3, 2, 1, (2, 3), (2, 0), (1, 1)),
    "dilated": ((1, 3, 11, 11), 4, 3, 3, 1, (1, 1), (2, 2), (2, 2)),
    "grouped": ((2, 6, 7, 7), 9, 3, 3, 3, (1, 2), (1, 1), (1, 1)),
    "depthwise": ((1, 8, 9, 9), 8, 3, 3, 8, (2, 2), (1, 1), (1, 1)),
    "pointwise": ((1, 16, 5, 5), 24, 1, 1, 1, (1, 1), (0, 0), (1, 1)),
}


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("name", sorted(CONVS))
def test_conv2d_bitwise_equals_numpy(name, path):
    xs, co, kh, kw, g, stride, padding, dilation = CONVS[name]
    rng = np.random.default_rng(sorted(CONVS).index(name))
    x = rng.integers(0, 256, xs).astype(np.uint8)
    x_zp = 255 if name == "strided" else 0 if name == "dilated" else 100   # both ends
    w = rng.integers(-127, 128, (co, xs[1] // g, kh, kw)).astype(np.int8)
    w_scale = rng.uniform(0.002, 0.02, co).astype(np.float32)
    bias = rng.standard_normal(co).astype(np.float32)
    weight = int8.Int8Weight(w, w_scale, bias, groups=g)
    relu = name in ("grouped", "depthwise")
    got = int8.conv2d(x, 0.03, x_zp, weight, 0.05, 128, "quint8", relu, stride, padding,
                      dilation, path=path)
    acc = ref_conv(x, x_zp, w, g, stride, padding, dilation)
    acc += ref_bias(bias, 0.03, w_scale)[None, :, None, None]
    mult = np.float64(np.float32(0.03)) * w_scale.astype(np.float64) / np.float64(np.float32(0.05))
    want = ref_requant(acc, mult[None, :, None, None], 128, 128 if relu else 0, 255, np.uint8)
    np.testing.assert_array_equal(got, want)


def test_signed_conv_and_quantize_round_trip():
    rng = np.random.default_rng(9)
    xf = rng.standard_normal((1, 3, 6, 6)).astype(np.float32)
    xq = int8.quantize_array(xf, 0.05, 0, "qint8")
    assert xq.dtype == np.int8
    np.testing.assert_array_equal(xq, np.clip(np.rint(xf / np.float32(0.05)), -128, 127))
    np.testing.assert_allclose(int8.dequantize_array(xq, 0.05), xf, atol=0.025 + 1e-6)
    w = rng.integers(-127, 128, (4, 3, 3, 3)).astype(np.int8)
    weight = int8.Int8Weight(w, 0.01)
    got = int8.conv2d(xq, 0.05, 0, weight, 0.1, padding=1)
    acc = ref_conv(xq, 0, w, 1, (1, 1), (1, 1), (1, 1))
    mult = np.float64(np.float32(0.05)) * np.float64(np.float32(0.01)) / np.float64(np.float32(0.1))
    np.testing.assert_array_equal(got, ref_requant(acc, mult, 0, -128, 127, np.int8))


def test_bad_arguments_raise():
    w = int8.Int8Weight(np.ones((3, 4), np.int8), 0.1)
    with pytest.raises(QuantizationError, match="does not fit"):
        int8.linear(np.ones((2, 5), np.int8), 0.1, 0, w, 0.1)
    with pytest.raises(QuantizationError, match="symmetric"):
        int8.linear(np.ones((2, 4), np.int8), 0.1, 3, w, 0.1)
    with pytest.raises(QuantizationError, match="positive"):
        int8.Int8Weight(np.ones((3, 4), np.int8), 0.0)
    with pytest.raises(QuantizationError, match="int8"):
        int8.Int8Weight(np.ones((3, 4), np.float32), 0.1)
    with pytest.raises(QuantizationError, match="too large"):
        int8.Int8Weight(np.ones((1, 70000), np.int8), 0.1)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("relu", [False, True])
def test_float32_output_is_the_dequantized_accumulator(path, relu):
    rng = np.random.default_rng(12)
    x = rng.integers(0, 256, (5, 19)).astype(np.uint8)
    w = rng.integers(-127, 128, (6, 19)).astype(np.int8)
    ws = rng.uniform(0.001, 0.01, 6).astype(np.float32)
    bias = rng.standard_normal(6).astype(np.float32)
    got = int8.linear(x, 0.07, 120, int8.Int8Weight(w, ws, bias), None, out_dtype="float32",
                      relu=relu, path=path)
    acc = (x.astype(np.int64) - 120) @ w.astype(np.int64).T + ref_bias(bias, 0.07, ws)
    want = (acc * (np.float64(np.float32(0.07)) * ws.astype(np.float64)))
    if relu:
        want = np.maximum(want, 0)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, want.astype(np.float32))


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("out", ["qint8", "quint8", "float32"])
@pytest.mark.parametrize("relu", [False, True])
def test_blocked_kernel_and_vector_epilogue_match_numpy(path, out, relu):
    # M = 9 (two blocks of four rows and one row), N = 83 (five and a bit
    # blocks of 16 channels: pairs, a lone block, a partial one), K = 70
    rng = np.random.default_rng(21)
    x = rng.integers(0, 256, (9, 70)).astype(np.uint8)
    w = rng.integers(-127, 128, (83, 70)).astype(np.int8)
    ws = rng.uniform(0.001, 0.01, 83).astype(np.float32)
    bias = (rng.standard_normal(83) * 3).astype(np.float32)
    weight = int8.Int8Weight(w, ws, bias)
    out_zp = 0 if out == "qint8" else 90
    got = int8.linear(x, 0.03, 111, weight, 0.05, out_zp if out != "float32" else 0, out,
                      relu, x_dtype="quint8", path=path)
    if out == "float32":
        acc = (x.astype(np.int64) - 111) @ w.astype(np.int64).T + ref_bias(bias, 0.03, ws)
        want = acc * (np.float64(np.float32(0.03)) * ws.astype(np.float64))
        want = (np.maximum(want, 0) if relu else want).astype(np.float32)
    else:
        want = ref_linear(x, 111, w, ws, bias, 0.03, 0.05, out_zp,
                          np.int8 if out == "qint8" else np.uint8, relu)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("kind", ["dense", "depthwise"])
@pytest.mark.parametrize("out", ["quint8", "float32"])
def test_larger_convs_match_numpy(kind, out, path):
    # 40 output channels: full 16-channel blocks through the vector epilogue
    # with the [C_out, pixels] (strided) output; the depthwise one runs the
    # direct kernel on 2 x 48 planes (the split over threads:
    # test_int8_threads.py)
    rng = np.random.default_rng(31)
    if kind == "dense":
        xs, co, g, stride = (2, 12, 9, 9), 40, 1, (1, 1)
    else:
        xs, co, g, stride = (2, 48, 20, 20), 48, 48, (2, 2)
    x = rng.integers(0, 256, xs).astype(np.uint8)
    w = rng.integers(-127, 128, (co, xs[1] // g, 3, 3)).astype(np.int8)
    ws = rng.uniform(0.002, 0.02, co).astype(np.float32)
    bias = (rng.standard_normal(co) * 4).astype(np.float32)
    weight = int8.Int8Weight(w, ws, bias, groups=g)
    assert weight.depthwise == (kind == "depthwise")
    relu = out == "quint8"
    got = int8.conv2d(x, 0.03, 37, weight, 0.05 if out == "quint8" else None, 128 * relu, out,
                      relu, stride, (1, 1), (1, 1), path=path)
    acc = ref_conv(x, 37, w, g, stride, (1, 1), (1, 1))
    acc += ref_bias(bias, 0.03, ws)[None, :, None, None]
    if out == "float32":
        want = (acc * (np.float64(np.float32(0.03)) * ws.astype(np.float64))[None, :, None, None]
                ).astype(np.float32)
    else:
        mult = np.float64(np.float32(0.03)) * ws.astype(np.float64) / np.float64(np.float32(0.05))
        want = ref_requant(acc, mult[None, :, None, None], 128, 128, 255, np.uint8)
    np.testing.assert_array_equal(got, want)
