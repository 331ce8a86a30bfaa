"""The int8 conv kernels of cpu/qconv.c on each path forced (issue 32): the
portable C one, AVX2, AVX-512 VNNI and AMX where this CPU has them, bitwise equal
to each other and to the NumPy integer reference, on the shapes that reach
each kernel's edges: K past a 64-k tile step and not a multiple of 4,
channel counts not a multiple of 4 or 32, pixel counts not a multiple of
16 or 32, groups, the 1x1 stride-1 direct read, strided and dilated
im2col, depthwise strides 1, 2 and 3 (3: the scalar kernel)."""
import numpy as np
import pytest

from mgtrace._core import qint8
from mgtrace.quantization import int8

from .test_int8_kernels import ref_bias, ref_conv, ref_requant

# path asked -> path that runs it (1 portable, 2 VNNI, 3 AMX)
AVAILABLE = [1] + ([2] if int8.has_vnni() else []) + ([3] if qint8.has_amx() else [])


def _cpu_flag(name):
    try:
        with open("/proc/cpuinfo") as f:
            return name in f.read().split()
    except OSError:
        return False


VBMI = _cpu_flag("avx512vbmi")

SHAPES = {  # name: (x shape, Co, KH, KW, groups, stride, padding, dilation)
    "k_past_64": ((1, 9, 11, 13), 37, 3, 3, 1, (1, 1), (1, 1), (1, 1)),      # K = 81
    "pointwise_direct": ((2, 70, 6, 7), 45, 1, 1, 1, (1, 1), (0, 0), (1, 1)),
    "pointwise_strided": ((1, 66, 9, 9), 33, 1, 1, 1, (2, 2), (0, 0), (1, 1)),
    "wide_stem": ((1, 3, 30, 30), 20, 7, 7, 1, (2, 2), (3, 3), (1, 1)),      # K = 147
    "grouped_dilated": ((1, 40, 12, 12), 36, 3, 3, 4, (1, 2), (2, 1), (2, 1)),
    "deep_few_pixels": ((1, 80, 3, 3), 70, 3, 3, 1, (1, 1), (1, 1), (1, 1)),  # K = 720
    # 16-pixel blocks over 2-4 output rows (7 and 14 wide, stride 1 and 2)
    "rows_of_7": ((2, 20, 9, 7), 40, 3, 3, 1, (1, 1), (1, 1), (1, 1)),
    "rows_of_14_strided": ((1, 24, 30, 28), 33, 3, 3, 1, (2, 2), (1, 1), (1, 1)),
    "rows_of_5": ((1, 16, 11, 5), 8, 3, 3, 1, (1, 1), (1, 1), (1, 1)),       # over 4: per byte
}


def _case(name, seed):
    xs, co, kh, kw, g, stride, padding, dilation = SHAPES[name]
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 256, xs).astype(np.uint8)
    w = rng.integers(-127, 128, (co, xs[1] // g, kh, kw)).astype(np.int8)
    w[0] = 127                  # a row of extremes: the largest |dot| the data allows
    ws = rng.uniform(0.002, 0.02, co).astype(np.float32)
    bias = (rng.standard_normal(co) * 5).astype(np.float32)
    return x, w, ws, bias, g, stride, padding, dilation


def _reference(x, x_zp, w, ws, bias, g, stride, padding, dilation, x_scale, out, out_scale,
               out_zp, relu):
    acc = ref_conv(x, x_zp, w, g, stride, padding, dilation)
    acc += ref_bias(bias, x_scale, ws)[None, :, None, None]
    if out == "float32":
        f = acc * (np.float64(np.float32(x_scale)) * ws.astype(np.float64))[None, :, None, None]
        return (np.maximum(f, 0) if relu else f).astype(np.float32)
    mult = np.float64(np.float32(x_scale)) * ws.astype(np.float64) / \
        np.float64(np.float32(out_scale))
    dt = np.int8 if out == "qint8" else np.uint8
    info = np.iinfo(dt)
    lo = max(info.min, out_zp) if relu else info.min
    return ref_requant(acc, mult[None, :, None, None], out_zp, lo, info.max, dt)


@pytest.mark.parametrize("path", [1, 2, 3, 4])
@pytest.mark.parametrize("name", sorted(SHAPES))
@pytest.mark.parametrize("out", ["quint8", "qint8", "float32"])
def test_each_path_matches_numpy(name, path, out):
    x, w, ws, bias, g, stride, padding, dilation = _case(name, sorted(SHAPES).index(name))
    weight = int8.Int8Weight(w, ws, bias, groups=g)
    out_zp = {"quint8": 131, "qint8": -5, "float32": 0}[out]
    relu = name in ("k_past_64", "grouped_dilated")
    x_zp = 0 if name == "wide_stem" else 255 if name == "deep_few_pixels" else 97
    got = int8.conv2d(x, 0.04, x_zp, weight, None if out == "float32" else 0.07, out_zp, out,
                      relu, stride, padding, dilation, x_dtype="quint8", path=path)
    want = _reference(x, x_zp, w, ws, bias, g, stride, padding, dilation, 0.04, out, 0.07,
                      out_zp, relu)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("path", [1, 2, 3, 4])
def test_the_path_used_is_the_one_asked_where_available(path):
    x, w, ws, bias, g, stride, padding, dilation = _case("k_past_64", 0)
    weight = int8.Int8Weight(w, ws, bias, groups=g)
    out = np.empty((1, 37, 11, 13), np.uint8)
    mult, b = weight._epilogue(None, 0.04, 0.07)
    used = qint8.conv(x, 3, weight.rows, weight.wsum, 1, 3, 3, 1, 1, 1, 1, 1, 1, b, mult, 0, 0,
                      255, out, path)
    if path == 4:               # AVX2 (vpmaddwd) where the CPU has it, else portable C
        assert used == (4 if _cpu_flag("avx2") else 1)
    else:
        assert used == max(p for p in AVAILABLE if p <= path)


def _flat_kernel(hw, kh, kw, stride, padding, dilation, forced=False):
    """Whether path 0 (forced: path 6) runs qconv.c's flat-pixel depthwise
    kernel here: AVX-512 VNNI and VBMI, outputs at most 8 wide, or under 16
    where the three-row kernel does not apply (unless forced), at most 512
    vectors x chunks of 4 taps, and each chunk's input bytes within 127 of
    each other."""
    if not (int8.has_vnni() and VBMI):
        return False
    (h, w), (sh, sw), (ph, pw), (dh, dw) = hw, stride, padding, dilation
    oh = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    ow = (w + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    three = kh == 3 and kw <= 4 and dh == 1 and sh in (1, 2) and sw in (1, 2) and \
        15 * sw + 3 * dw < 64
    if not (ow <= 8 or (not three and ow < 16)) and not forced:
        return False
    nv, kc = -(-oh * ow // 16), -(-kw // 4)
    if nv * kh * kc > 512:
        return False
    for i in range(kh):
        for c in range(kc):
            for v in range(nv):
                q = np.arange(v * 16, min(v * 16 + 16, oh * ow))[:, None]
                j = c * 4 + np.arange(4)[None, :]
                ih = (q // ow) * sh + i * dh - ph
                iw = (q % ow) * sw + j * dw - pw
                ok = (ih >= 0) & (ih < h) & (iw >= 0) & (iw < w) & (j < kw)
                at = (ih * w + iw)[ok]
                if at.size and at.max() - at.min() >= 127:
                    return False
    return True


DEPTHWISE = {   # name: (x shape, KH, KW, stride, padding, dilation)
    "s1": ((1, 19, 17, 35), 3, 3, (1, 1), (1, 1), (1, 1)),
    "s2": ((2, 24, 23, 21), 3, 3, (2, 2), (1, 1), (1, 1)),
    "s2_5x5_dilated": ((1, 18, 20, 40), 5, 5, (2, 2), (4, 2), (2, 1)),
    "s1_rect_unpadded": ((1, 7, 9, 50), 1, 4, (3, 1), (0, 0), (1, 3)),
    "s1_7x7": ((1, 6, 15, 37), 7, 7, (1, 1), (3, 3), (1, 1)),                # 2 chunks of 4 taps
    "s2_wide_dilation": ((1, 4, 9, 60), 2, 3, (1, 2), (1, 12), (1, 12)),     # 15*2 + 3*12 >= 64
    "s3_scalar": ((1, 5, 13, 13), 3, 3, (3, 3), (1, 1), (1, 1)),
    # three kernel rows of at most 4 taps, no vertical dilation: each input
    # row gathered once for the output rows that read it (dw_plane_vbmi3),
    # strips of 16 with a partial last one, odd heights
    "rows3_s1_two_strips": ((2, 6, 11, 37), 3, 3, (1, 1), (1, 1), (1, 1)),
    "rows3_s2_odd_height": ((1, 5, 15, 70), 3, 3, (2, 2), (1, 1), (1, 1)),
    "rows3_4_taps_dilated": ((1, 4, 9, 45), 3, 4, (1, 1), (0, 3), (1, 2)),
    "rows3_s2_rows_s1_cols": ((1, 3, 12, 33), 3, 2, (2, 1), (2, 0), (1, 1)),
}


@pytest.mark.parametrize("name", sorted(DEPTHWISE))
@pytest.mark.parametrize("out", ["quint8", "qint8", "float32"])
def test_depthwise_vector_and_scalar_kernels_match_numpy(name, out):
    xs, kh, kw, stride, padding, dilation = DEPTHWISE[name]
    rng = np.random.default_rng(40 + sorted(DEPTHWISE).index(name))
    c = xs[1]
    x = rng.integers(0, 256, xs).astype(np.uint8)
    w = rng.integers(-127, 128, (c, 1, kh, kw)).astype(np.int8)
    w[0] = -127
    ws = rng.uniform(0.002, 0.02, c).astype(np.float32)
    bias = (rng.standard_normal(c) * 5).astype(np.float32)
    weight = int8.Int8Weight(w, ws, bias, groups=c)
    assert weight.depthwise
    out_zp = {"quint8": 0, "qint8": 3, "float32": 0}[out]
    relu = out != "qint8"
    want = _reference(x, 250, w, ws, bias, c, stride, padding, dilation, 0.04, out, 0.07,
                      out_zp, relu)
    for path in (0, 1, 2, 3, 4):
        got = int8.conv2d(x, 0.04, 250, weight, None if out == "float32" else 0.07, out_zp,
                          out, relu, stride, padding, dilation, x_dtype="quint8", path=path)
        np.testing.assert_array_equal(got, want)
    # the kernel that ran, each forced: vector ones for strides 1 and 2 where the
    # CPU has AVX-512 VNNI (3: vpermb + vpdpbusd where it also has VBMI), or AVX2 (4)
    mult, b = weight._epilogue(None, 0.04, None if out == "float32" else 0.07)
    for path in (0, 1, 2, 4):
        o = np.empty(want.shape, want.dtype)
        lo = ((0 if relu else -1) if out == "float32"
              else (out_zp if relu else np.iinfo(o.dtype).min))
        used = qint8.dwconv(x, 250, weight.raw, kh, kw, *stride, *padding, *dilation, b, mult,
                            out_zp, lo, np.iinfo(o.dtype).max if out != "float32" else 0, o, path)
        vector = int8.has_vnni() and stride[1] in (1, 2)
        vbmi = VBMI and 15 * stride[1] + 3 * dilation[1] < 64
        if path == 4:           # the AVX2 kernel
            assert used == (4 if _cpu_flag("avx2") and stride[1] in (1, 2) else 1)
        elif path == 0 and _flat_kernel(x.shape[2:], kh, kw, stride, padding, dilation):
            assert used == 6    # short rows: the flat-pixel kernel
        else:
            assert used == (1 if path == 1 or not vector else 2 if path == 2 or not vbmi else 3)
        np.testing.assert_array_equal(o, want)


EPILOGUES = [   # (out dtype, x_scale, w_scale, out scale, out zp, relu): the vector epilogue's clamp
    ("quint8", 1.0, 1.0, 2.0, 0, False),        # mult 0.5: every odd sum a .5 tie
    ("quint8", 1.0, 1.0, 2.0, 255, True),       # zero point at the top, ReLU clamps at 255
    ("qint8", 1.0, 1.0, 2.0, -128, False),
    ("qint8", 1.0, 1.0, 2.0, 127, True),
    ("quint8", 0.04, 0.01, 1e-6, 131, False),   # a tiny scale: both ends saturate
    ("qint8", 0.04, 0.01, 1e-6, 3, True),
    # mult 0.1: both ends saturate with |dot - corr| mult far under 2^31, where
    # the dense tiles clamp in int32 after the conversion (put16i); at mult
    # 400 above the bound fails and they clamp in double first (put16)
    ("quint8", 0.04, 0.01, 4e-3, 131, False),
    ("qint8", 0.04, 0.01, 4e-3, 3, True),
]


@pytest.mark.parametrize("path", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("depthwise", [False, True])
@pytest.mark.parametrize("case", range(len(EPILOGUES)))
def test_epilogue_ties_and_saturation(case, depthwise, path):
    out, xs, wsc, out_scale, out_zp, relu = EPILOGUES[case]
    rng = np.random.default_rng(90 + case)
    c = 32
    g = c if depthwise else 1
    if out_scale == 2.0:        # small sums around the zero point: the ties show
        x = (100 + rng.integers(-3, 4, (1, c, 9, 21))).astype(np.uint8)
        w = rng.integers(-1, 2, (c, c // g, 3, 3)).astype(np.int8)
    else:
        x = rng.integers(0, 256, (1, c, 9, 21)).astype(np.uint8)
        w = rng.integers(-127, 128, (c, c // g, 3, 3)).astype(np.int8)
    ws = np.full(c, wsc, np.float32)
    weight = int8.Int8Weight(w, ws, None, groups=g)
    got = int8.conv2d(x, xs, 100, weight, out_scale, out_zp, out, relu, 1, 1,
                      x_dtype="quint8", path=path)
    acc = ref_conv(x, 100, w, g, (1, 1), (1, 1), (1, 1))
    mult = np.float64(np.float32(xs)) * ws.astype(np.float64) / np.float64(np.float32(out_scale))
    dt = np.int8 if out == "qint8" else np.uint8
    info = np.iinfo(dt)
    want = ref_requant(acc, mult[None, :, None, None], out_zp,
                       max(info.min, out_zp) if relu else info.min, info.max, dt)
    if out_scale < 1e-2 and not relu:                           # both ends reached
        assert {info.min, info.max} <= set(np.unique(want).tolist())
    elif not relu:              # not all one value (a ReLU at the top zero point is)
        assert len(np.unique(want)) > 2
    if out_scale == 2.0:
        assert np.any(acc % 2 == 1)                             # .5 ties among them
    np.testing.assert_array_equal(got, want)


BLOCKED = {     # the channel-blocked depthwise kernel's shapes: (x shape, KH, KW, stride, padding, dilation)
    "7x7_s1": ((2, 32, 7, 7), 3, 3, (1, 1), (1, 1), (1, 1)),
    "14_to_7_s2": ((1, 16, 14, 14), 3, 3, (2, 2), (1, 1), (1, 1)),
    "5x5_rect": ((1, 48, 5, 9), 5, 5, (1, 1), (2, 2), (1, 1)),
    "taps_past_4_dilated_rows": ((1, 16, 9, 6), 2, 7, (2, 1), (1, 3), (2, 1)),
    "stride_3_unpadded": ((1, 32, 12, 11), 4, 4, (1, 3), (0, 0), (1, 1)),
    "wide_rows_forced": ((1, 16, 6, 21), 3, 3, (1, 1), (1, 1), (1, 1)),   # path 0: per plane
    "19_channels": ((1, 19, 7, 7), 3, 3, (1, 1), (1, 1), (1, 1)),         # not 16s: per plane
}


def _depthwise_case(geometry, out, seed, x_zp, saturated, out_zps):
    """A random uint8 input (zero point ``x_zp``, scale 0.04), int8
    depthwise weights with channel ``saturated`` all 127, per-channel
    scales and a bias, and the NumPy reference for output dtype ``out``
    (scale 0.07, zero point from ``out_zps``, ReLU unless qint8): x, the
    Int8Weight, want, the epilogue's multipliers and bias, out_zp, relu."""
    xs, kh, kw, stride, padding, dilation = geometry
    rng = np.random.default_rng(seed)
    c = xs[1]
    x = rng.integers(0, 256, xs).astype(np.uint8)
    w = rng.integers(-127, 128, (c, 1, kh, kw)).astype(np.int8)
    w[saturated] = 127
    ws = rng.uniform(0.002, 0.02, c).astype(np.float32)
    bias = (rng.standard_normal(c) * 5).astype(np.float32)
    weight = int8.Int8Weight(w, ws, bias, groups=c)
    out_zp = out_zps.get(out, 0)
    relu = out != "qint8"
    want = _reference(x, x_zp, w, ws, bias, c, stride, padding, dilation, 0.04, out, 0.07,
                      out_zp, relu)
    mult, b = weight._epilogue(None, 0.04, None if out == "float32" else 0.07)
    return x, weight, want, mult, b, out_zp, relu


@pytest.mark.parametrize("name", sorted(BLOCKED))
@pytest.mark.parametrize("out", ["quint8", "qint8", "float32"])
def test_channel_blocked_depthwise_matches_numpy(name, out):
    xs, kh, kw, stride, padding, dilation = BLOCKED[name]
    c = xs[1]
    x, weight, want, mult, b, out_zp, relu = _depthwise_case(
        BLOCKED[name], out, seed=80 + sorted(BLOCKED).index(name), x_zp=61, saturated=1,
        out_zps={"quint8": 17, "qint8": -3})
    blocks = int8.has_vnni() and c % 16 == 0
    ow = want.shape[3]
    flat = _flat_kernel(xs[2:], kh, kw, stride, padding, dilation)
    for path, kernel in ((5, 5 if blocks else None),
                         (0, 6 if flat else 5 if blocks and ow <= 8 else None)):
        o = np.empty(want.shape, want.dtype)
        lo = ((0 if relu else -1) if out == "float32"
              else (out_zp if relu else np.iinfo(o.dtype).min))
        used = qint8.dwconv(x, 61, weight.raw, kh, kw, *stride, *padding, *dilation, b, mult,
                            out_zp, lo, np.iinfo(o.dtype).max if out != "float32" else 0, o, path)
        assert (used == 5) == (kernel == 5) and (used == 6) == (kernel == 6)
        np.testing.assert_array_equal(o, want)
        got = int8.conv2d(x, 0.04, 61, weight, None if out == "float32" else 0.07, out_zp, out,
                          relu, stride, padding, dilation, x_dtype="quint8", path=path)
        np.testing.assert_array_equal(got, want)


FLAT = {    # the flat-pixel depthwise kernel's windows: (x shape, KH, KW, stride, padding, dilation)
    "plane_in_one_window_7x7": ((2, 21, 7, 7), 3, 3, (1, 1), (1, 1), (1, 1)),
    "plane_in_one_window_s2": ((1, 5, 9, 13), 3, 3, (2, 2), (1, 1), (1, 1)),
    "window_per_vector_14x14": ((1, 19, 14, 14), 3, 3, (1, 1), (1, 1), (1, 1)),
    "window_per_vector_28_odd": ((1, 3, 27, 29), 3, 3, (1, 1), (1, 1), (1, 1)),
    "window_per_vector_28_s2": ((2, 6, 28, 28), 3, 3, (2, 2), (1, 1), (1, 1)),
    "window_per_vector_taps_past_4": ((1, 4, 12, 20), 5, 7, (1, 2), (2, 3), (1, 1)),
    "window_per_chunk_56_s2": ((2, 3, 12, 56), 3, 3, (2, 2), (1, 1), (1, 1)),
    "dilated_unpadded": ((1, 7, 13, 11), 2, 3, (1, 1), (0, 0), (2, 2)),
    "one_pixel": ((3, 9, 1, 1), 3, 3, (1, 1), (1, 1), (1, 1)),
    "all_padding_chunks": ((1, 5, 2, 3), 3, 5, (1, 1), (3, 4), (1, 1)),
    "stride_3": ((1, 8, 17, 19), 3, 3, (3, 3), (1, 1), (1, 1)),
    "spans_past_127": ((1, 4, 20, 100), 3, 3, (2, 2), (1, 1), (1, 1)),     # per-row kernels
    "rows_of_16_forced": ((1, 6, 16, 16), 3, 3, (1, 1), (1, 1), (1, 1)),  # path 0: per row
}


@pytest.mark.parametrize("name", sorted(FLAT))
@pytest.mark.parametrize("out", ["quint8", "qint8", "float32"])
def test_flat_depthwise_matches_numpy(name, out):
    """Path 6 (and path 0 where it takes it) against the reference at 1, 2
    and 3 threads: windows per plane, per vector and per chunk, padding
    chunks, several chunks of 4 taps, and geometries it refuses."""
    import mgtrace as mt
    xs, kh, kw, stride, padding, dilation = FLAT[name]
    c = xs[1]
    x, weight, want, mult, b, out_zp, relu = _depthwise_case(
        FLAT[name], out, seed=60 + sorted(FLAT).index(name), x_zp=77, saturated=0,
        out_zps={"quint8": 9, "qint8": -5})
    lo = ((0 if relu else -1) if out == "float32" else (out_zp if relu else np.iinfo(want.dtype).min))
    hi = np.iinfo(want.dtype).max if out != "float32" else 0
    forced = _flat_kernel(xs[2:], kh, kw, stride, padding, dilation, forced=True)
    best = _flat_kernel(xs[2:], kh, kw, stride, padding, dilation)
    assert forced == (name != "spans_past_127" or not VBMI) or not int8.has_vnni()
    old = mt.get_num_threads()
    try:
        for n in (1, 2, 3):
            mt.set_num_threads(n)
            for path, flat in ((6, forced), (0, best)):
                o = np.empty(want.shape, want.dtype)
                used = qint8.dwconv(x, 77, weight.raw, kh, kw, *stride, *padding, *dilation, b,
                                    mult, out_zp, lo, hi, o, path)
                assert (used == 6) == flat, (path, used)
                np.testing.assert_array_equal(o, want, err_msg=f"path {path}, {n} threads")
    finally:
        mt.set_num_threads(old)


# multipliers whose products lie within 2^-40 of the .5 ties (0.5 and 1.5 in
# float32): the float32 epilogue (put16q) must hand such vectors to the
# double one, else it rounds the ties to even where the double product is
# past them; 1/3: ordinary values, few ties
NEAR_TIES = [0.5 + 2.0 ** -40, 0.5 - 2.0 ** -40, 1.5 + 2.0 ** -38, 1 / 3]


@pytest.mark.parametrize("mult", NEAR_TIES)
@pytest.mark.parametrize("out", ["quint8", "qint8"])
@pytest.mark.parametrize("kind", ["depthwise_rows", "depthwise_flat", "dense_vnni", "dense_amx"])
def test_float_epilogue_near_ties_match_double(kind, out, mult):
    """The int8 / uint8 epilogue through float32 (qconv.c's put16q) against
    the double reference on products a hair from .5 ties, both signs, with a
    zero point and with and without a ReLU clamp."""
    rng = np.random.default_rng(5)
    dw = kind.startswith("depthwise")
    c, co = (16, 16) if dw else (24, 40)
    h, wd = (9, 40) if kind == "depthwise_rows" else (7, 7) if dw else (6, 23)
    # small sums around the zero point: every odd one a tie at 0.5
    x = (120 + rng.integers(-4, 5, (1, c, h, wd))).astype(np.uint8)
    w = rng.integers(-2, 3, (co, 1 if dw else c, 3, 3)).astype(np.int8)
    acc = ref_conv(x, 120, w, c if dw else 1, (1, 1), (1, 1), (1, 1))
    dt = np.uint8 if out == "quint8" else np.int8
    info = np.iinfo(dt)
    out_zp = 100 if out == "quint8" else -3
    m = np.full(co, mult)
    for lo in (info.min, out_zp):           # no clamp, ReLU
        want = ref_requant(acc, m[None, :, None, None], out_zp, lo, info.max, dt)
        o = np.empty(want.shape, dt)
        if dw:
            used = qint8.dwconv(x, 120, w.reshape(co, 9), 3, 3, 1, 1, 1, 1, 1, 1, None, m,
                                out_zp, lo, info.max, o, 0)
            assert not VBMI or used == (3 if kind == "depthwise_rows" else 6)
        else:
            weight = int8.Int8Weight(w, np.ones(co, np.float32), None)
            path = 2 if kind == "dense_vnni" else 3
            used = qint8.conv(x, 120, weight.rows, weight.wsum, 1, 3, 3, 1, 1, 1, 1, 1, 1, None,
                              m, out_zp, lo, info.max, o, path)
            assert used == max(p for p in AVAILABLE if p <= path)
        np.testing.assert_array_equal(o, want)
        if mult != 1 / 3:
            assert np.any(acc % 2 == 1)     # the ties are there


def _guarded(a, after=True):
    """A copy of the C-contiguous array a whose last byte ends a page and
    whose next page is unreadable (after), or whose first byte starts a page
    after an unreadable one: a kernel that reads a byte past (before) the
    array faults. Returns (copy, keep-alive)."""
    import ctypes
    import mmap
    page = mmap.PAGESIZE
    n = a.nbytes
    size = (n + page - 1) // page * page
    buf = mmap.mmap(-1, size + 2 * page)
    base = ctypes.addressof(ctypes.c_char.from_buffer(buf))
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    assert libc.mprotect(ctypes.c_void_p(base), page, 0) == 0                 # before
    assert libc.mprotect(ctypes.c_void_p(base + page + size), page, 0) == 0   # after
    start = page + (size - n if after else 0)
    g = np.frombuffer(buf, np.uint8, n, start).view(a.dtype).reshape(a.shape)
    g[...] = a
    return g, buf


GUARDED = [  # (x shape, Co, K, groups, stride, padding): every conv kernel at the array's ends
    ((1, 70, 7, 7), 45, 1, 1, 1, 0),        # 1x1 direct: K 70, a partial pixel block
    ((1, 96, 7, 7), 96, 1, 1, 1, 0),        # 1x1 direct on AMX: K past the 64-k tile
    ((1, 3, 37, 37), 16, 3, 1, 2, 1),       # im2col, K 27
    ((1, 32, 7, 7), 32, 3, 32, 1, 1),       # depthwise flat
    ((1, 16, 14, 14), 16, 3, 16, 2, 1),     # depthwise flat, stride 2
    ((1, 8, 20, 40), 8, 3, 8, 1, 1),        # depthwise three-row
    ((1, 8, 21, 35), 8, 3, 8, 2, 1),        # depthwise three-row, stride 2
]


@pytest.mark.parametrize("after", [True, False])
@pytest.mark.parametrize("case", range(len(GUARDED)))
def test_conv_reads_nothing_outside_the_input(case, after):
    """Each conv path with its input against an unreadable page (after its
    last byte, or before its first): masked loads only, no byte outside
    (the 1x1 packing once read the rows past K that the AMX tiles' 64-k
    steps count: a crash at 2 threads in MobileNetV2)."""
    xs, co, k, g, s, p = GUARDED[case]
    rng = np.random.default_rng(30 + case)
    x = rng.integers(0, 256, xs).astype(np.uint8)
    w = rng.integers(-127, 128, (co, xs[1] // g, k, k)).astype(np.int8)
    ws = rng.uniform(0.002, 0.02, co).astype(np.float32)
    bias = (rng.standard_normal(co) * 5).astype(np.float32)
    weight = int8.Int8Weight(w, ws, bias, groups=g)
    want = _reference(x, 9, w, ws, bias, g, (s, s), (p, p), (1, 1), 0.04, "quint8", 0.07, 3,
                      True)
    gx, keep = _guarded(x, after)
    paths = (0, 3, 5, 6) if g > 1 else (0, 2, 3)
    for path in paths:
        got = int8.conv2d(gx, 0.04, 9, weight, 0.07, 3, "quint8", True, s, p, 1,
                          x_dtype="quint8", path=path)
        np.testing.assert_array_equal(got, want, err_msg=f"path {path}")
    del gx
    keep.close()


# a float32 output whose float gets the ReLU6 where hi > 0 (the plan folds a
# ReLU6 into the layer so: hi 6, lo as the layer's): every kernel path,
# dense, depthwise (the row, flat and 16-channel kernels) and the GEMM,
# against the elementwise ReLU6's formula on the float32 output (bytes: a -0
# stays -0)


def _relu6(y):
    return np.where(y < 0, np.float32(0), np.where(y > 6, np.float32(6), y)).astype(np.float32)
RELU6_CONVS = {  # name: (x shape, Co, KH, KW, groups, stride)
    "dense_3x3": ((1, 20, 9, 23), 40, 3, 3, 1, 1),
    "pointwise_k24": ((1, 24, 6, 30), 48, 1, 1, 1, 1),      # under 64 k (AMX's short tiles)
    "depthwise_rows": ((1, 16, 9, 40), 16, 3, 3, 16, 1),
    "depthwise_flat": ((1, 32, 7, 7), 32, 3, 3, 32, 1),
    "depthwise_stride3": ((1, 16, 11, 11), 16, 3, 3, 16, 3),  # the scalar kernel
}


@pytest.mark.parametrize("path", [0, 1, 2, 3, 4, 5])
@pytest.mark.parametrize("name", sorted(RELU6_CONVS))
def test_a_float_output_clamped_at_hi_is_relu6(name, path):
    xs, co, kh, kw, g, s = RELU6_CONVS[name]
    rng = np.random.default_rng(sorted(RELU6_CONVS).index(name))
    x = rng.integers(0, 256, xs).astype(np.uint8)
    w = rng.integers(-127, 128, (co, xs[1] // g, kh, kw)).astype(np.int8)
    acc = ref_conv(x, 97, w, g, (s, s), (1, 1) if kh == 3 else (0, 0), (1, 1))
    mult = rng.uniform(1e-4, 4e-4, co)      # outputs of both signs, many past 6
    mult[:4] = 1e-49                        # negative products rounding to -0 in float32
    y = (acc * mult[None, :, None, None]).astype(np.float32)
    relu = (np.maximum(acc, 0) * mult[None, :, None, None]).astype(np.float32)
    assert (y > 6).any() and (y < 0).any() and ((y > 0) & (y < 6)).any()
    assert np.signbit(y[y == 0]).any()
    for lo, hi, ref in ((-1, 6, _relu6(y)), (0, 6, _relu6(relu)), (-1, 0, y), (0, 0, relu)):
        o = np.empty(y.shape, np.float32)
        if g > 1:
            if path > 1 and path not in (5,):
                continue                    # dwconv's paths: 0 best, 1 portable, 5 16 channels
            qint8.dwconv(x, 97, w.reshape(co, kh * kw), kh, kw, s, s, 1, 1, 1, 1, None, mult,
                         0, lo, hi, o, path)
        else:
            if path == 5:
                continue
            weight = int8.Int8Weight(w, np.ones(co, np.float32), None)
            pad = 1 if kh == 3 else 0
            qint8.conv(x, 97, weight.rows, weight.wsum, 1, kh, kw, s, s, pad, pad, 1, 1, None,
                       mult, 0, lo, hi, o, path)
        assert o.tobytes() == ref.tobytes(), f"lo {lo} hi {hi}"


@pytest.mark.parametrize("path", [0, 1, 2])
def test_a_float_gemm_output_clamped_at_hi_is_relu6(path):
    rng = np.random.default_rng(3)
    m, k, n = 37, 128, 45
    a = rng.integers(0, 256, (m, k)).astype(np.uint8)
    w = rng.integers(-127, 128, (n, k)).astype(np.int8)
    mult = rng.uniform(1e-4, 4e-4, n)
    mult[:3] = 1e-49
    packed, wsum = qint8.pack_weight(w)
    acc = (a.astype(np.int64) - 90) @ w.astype(np.int64).T
    y = (acc * mult[None, :]).astype(np.float32)
    assert (y > 6).any() and (y < 0).any()
    o = np.empty((m, n), np.float32)
    qint8.gemm(a, 90, packed, wsum, None, mult, 0, -1, 6, o, n, 1, path)
    assert o.tobytes() == _relu6(y).tobytes()
