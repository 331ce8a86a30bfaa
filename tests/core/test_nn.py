"""mgtrace._core.nn against independent NumPy references (and PyTorch, when
it is importable).

References: conv2d is the direct definition (one einsum per kernel tap over
a zero-padded input), conv_transpose2d scatters each tap's contribution,
pools take the max/mean of explicit windows, interpolate evaluates
PyTorch's coordinate formulas, pad is np.pad.

Tolerances: float64 to 1e-10 of the output's scale; float32 to 1e-5 relative
plus 1e-5 of the output's largest magnitude (convolutions sum up to a few
hundred products); float16 and bfloat16 compare with the reference computed
from the rounded inputs, to 1e-2 and 4e-2 of the output's scale. Pooling,
nearest resize and pad move values and must match exactly.
"""
import math
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest

from mgtrace._core import dispatch, nn, trace_hooks
from mgtrace._core.tensor import from_dlpack, tensor

RNG = np.random.default_rng(1234)
FLOATS = ["float32", "float64"]


def _pair(v):
    return (v, v) if isinstance(v, int) else tuple(v)


def rand(*shape, dtype="float32"):
    return RNG.standard_normal(shape).astype(dtype)


def close(actual, ref, dtype):
    """Compare with the tolerance for dtype, scaled by the reference's magnitude."""
    actual = np.asarray(actual, dtype=np.float64)
    scale = max(1.0, float(np.abs(ref).max())) if ref.size else 1.0
    rtol, atol = {"float64": (1e-10, 1e-10), "float32": (1e-5, 1e-5),
                  "float16": (1e-2, 1e-2), "bfloat16": (4e-2, 4e-2)}[str(dtype)]
    np.testing.assert_allclose(actual, ref, rtol=rtol, atol=atol * scale)


def as_dtype(a, dtype):
    return a.astype(ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype)


# ------------------------------------------------------------------ references

def ref_conv2d(x, w, b=None, stride=1, padding=0, dilation=1, groups=1):
    sh, sw = _pair(stride)
    ph, pw = _pair(padding)
    dh, dw = _pair(dilation)
    x, w = x.astype(np.float64), w.astype(np.float64)
    n, c, h, wd = x.shape
    o, cg, kh_, kw_ = w.shape
    oh = (h + 2 * ph - dh * (kh_ - 1) - 1) // sh + 1
    ow = (wd + 2 * pw - dw * (kw_ - 1) - 1) // sw + 1
    xp = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    out = np.zeros((n, o, oh, ow))
    og = o // groups
    for g in range(groups):
        xs = xp[:, g * cg:(g + 1) * cg]
        for kh in range(kh_):
            for kw in range(kw_):
                patch = xs[:, :, kh * dh:kh * dh + sh * (oh - 1) + 1:sh, kw * dw:kw * dw + sw * (ow - 1) + 1:sw]
                out[:, g * og:(g + 1) * og] += np.einsum("nchw,oc->nohw", patch, w[g * og:(g + 1) * og, :, kh, kw])
    if b is not None:
        out += b.astype(np.float64)[None, :, None, None]
    return out


def ref_conv_transpose2d(x, w, b=None, stride=1, padding=0, output_padding=0, dilation=1, groups=1):
    sh, sw = _pair(stride)
    ph, pw = _pair(padding)
    oph, opw = _pair(output_padding)
    dh, dw = _pair(dilation)
    x, w = x.astype(np.float64), w.astype(np.float64)
    n, c, h, wd = x.shape
    _, og, kh_, kw_ = w.shape
    cg = c // groups
    full_h = (h - 1) * sh + dh * (kh_ - 1) + 1 + oph
    full_w = (wd - 1) * sw + dw * (kw_ - 1) + 1 + opw
    full = np.zeros((n, og * groups, full_h, full_w))
    for g in range(groups):
        xs = x[:, g * cg:(g + 1) * cg]
        for kh in range(kh_):
            for kw in range(kw_):
                contrib = np.einsum("nchw,co->nohw", xs, w[g * cg:(g + 1) * cg, :, kh, kw])
                full[:, g * og:(g + 1) * og, kh * dh:kh * dh + sh * (h - 1) + 1:sh,
                     kw * dw:kw * dw + sw * (wd - 1) + 1:sw] += contrib
    out = full[:, :, ph:full_h - ph, pw:full_w - pw]
    if b is not None:
        out = out + b.astype(np.float64)[None, :, None, None]
    return out


def pool_out(size, k, p, s, d, ceil_mode):
    """PyTorch's pooling output size (torch.nn.MaxPool2d docs)."""
    num = size + 2 * p - d * (k - 1) - 1
    out = (-(-num // s) if ceil_mode else num // s) + 1
    if ceil_mode and (out - 1) * s >= size + p:
        out -= 1
    return out


def ref_max_pool2d(x, k, s=None, p=0, d=1, ceil_mode=False):
    kh, kw = _pair(k)
    sh, sw = _pair(s if s is not None else k)
    ph, pw = _pair(p)
    dh, dw = _pair(d)
    n, c, h, w = x.shape
    oh, ow = pool_out(h, kh, ph, sh, dh, ceil_mode), pool_out(w, kw, pw, sw, dw, ceil_mode)
    extra_h = max(0, (oh - 1) * sh + dh * (kh - 1) + 1 - (h + 2 * ph))
    extra_w = max(0, (ow - 1) * sw + dw * (kw - 1) + 1 - (w + 2 * pw))
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (ph, ph + extra_h), (pw, pw + extra_w)),
                constant_values=-np.inf)
    out = np.empty((n, c, oh, ow))
    for i in range(oh):
        for j in range(ow):
            win = xp[:, :, i * sh:i * sh + dh * (kh - 1) + 1:dh, j * sw:j * sw + dw * (kw - 1) + 1:dw]
            out[:, :, i, j] = win.max(axis=(2, 3))
    return out


def ref_avg_pool2d(x, k, s=None, p=0, ceil_mode=False, count_include_pad=True):
    """PyTorch's AvgPool2d: the window clipped to the padded input gives the
    divisor with count_include_pad; clipped to the input, the sum."""
    kh, kw = _pair(k)
    sh, sw = _pair(s if s is not None else k)
    ph, pw = _pair(p)
    n, c, h, w = x.shape
    oh, ow = pool_out(h, kh, ph, sh, 1, ceil_mode), pool_out(w, kw, pw, sw, 1, ceil_mode)
    x = x.astype(np.float64)
    out = np.empty((n, c, oh, ow))
    for i in range(oh):
        hs, he = i * sh - ph, min(i * sh - ph + kh, h + ph)
        for j in range(ow):
            ws, we = j * sw - pw, min(j * sw - pw + kw, w + pw)
            win = x[:, :, max(hs, 0):min(he, h), max(ws, 0):min(we, w)]
            div = (he - hs) * (we - ws) if count_include_pad else win.shape[2] * win.shape[3]
            out[:, :, i, j] = win.sum(axis=(2, 3)) / div
    return out


def ref_adaptive(x, oh, ow, reduce):
    n, c, h, w = x.shape
    out = np.empty((n, c, oh, ow))
    for i in range(oh):
        hs, he = (i * h) // oh, -((-(i + 1) * h) // oh)
        for j in range(ow):
            ws, we = (j * w) // ow, -((-(j + 1) * w) // ow)
            out[:, :, i, j] = reduce(x[:, :, hs:he, ws:we].astype(np.float64), axis=(2, 3))
    return out


def ref_nearest_index(n_in, n_out, scale_factor=None):
    """PyTorch: floor(dst * scale) in float32, scale = in/out or 1/scale_factor."""
    scale = np.float32(1.0 / scale_factor) if scale_factor else np.float32(n_in) / np.float32(n_out)
    src = np.floor(np.arange(n_out, dtype=np.float32) * scale).astype(np.int64)
    return np.minimum(src, n_in - 1)


def ref_linear_taps(n_in, n_out, align_corners, scale_factor=None):
    dst = np.arange(n_out, dtype=np.float64)
    if align_corners:
        src = dst * ((n_in - 1) / (n_out - 1) if n_out > 1 else 0.0)
    else:
        scale = 1.0 / scale_factor if scale_factor else n_in / n_out
        src = np.maximum((dst + 0.5) * scale - 0.5, 0.0)
    i0 = np.floor(src).astype(np.int64)
    i1 = np.minimum(i0 + 1, n_in - 1)
    return i0, i1, src - i0


def ref_bilinear(x, oh, ow, align_corners, sf=(None, None)):
    y0, y1, fy = ref_linear_taps(x.shape[2], oh, align_corners, sf[0])
    x0, x1, fx = ref_linear_taps(x.shape[3], ow, align_corners, sf[1])
    x = x.astype(np.float64)
    top = x[:, :, y0][:, :, :, x0] * (1 - fx) + x[:, :, y0][:, :, :, x1] * fx
    bot = x[:, :, y1][:, :, :, x0] * (1 - fx) + x[:, :, y1][:, :, :, x1] * fx
    return top * (1 - fy)[:, None] + bot * fy[:, None]


# ------------------------------------------------------------------ conv2d

def _on_threads(fn, counts=(1, 2, 3)):
    """fn() on each thread count (the kernels split work by it), results in order."""
    before = dispatch.get_num_threads()
    try:
        out = []
        for t in counts:
            dispatch.set_num_threads(t)
            out.append(fn())
        return out
    finally:
        dispatch.set_num_threads(before)


# (N, C, H, W, O, KH, KW, stride, padding, dilation, groups)
CONV_CASES = [
    (2, 4, 7, 9, 6, 3, 3, 1, 1, 1, 1),          # odd sizes
    (2, 4, 8, 8, 6, 3, 3, 2, 1, 1, 2),          # stride 2, groups 2
    (1, 16, 10, 11, 8, 3, 3, 2, 2, 2, 1),       # dilation 2
    (2, 6, 9, 7, 4, 3, 5, (1, 2), (2, 0), 1, 1),  # non-square kernel, mixed stride/padding
    (2, 8, 9, 9, 4, 5, 5, 3, 2, 1, 2),          # 5x5 stride 3
    (3, 16, 5, 5, 8, 1, 1, 1, 0, 1, 1),         # 1x1
    (2, 16, 9, 9, 32, 1, 1, 2, 0, 1, 1),        # strided 1x1
    (2, 6, 6, 6, 6, 3, 3, 1, 1, (2, 1), 3),     # groups 3, anisotropic dilation
    (1, 3, 20, 20, 8, 7, 7, 2, 3, 1, 1),        # a stem: few channels, 7x7 stride 2
    (2, 32, 24, 24, 16, 3, 3, 1, 1, 1, 1),      # a plane big enough for per-image tiles
    (2, 32, 24, 26, 16, 3, 3, 2, 1, 1, 1),      # strided, per-image tiles
    (4, 16, 4, 4, 64, 3, 3, 1, 1, 1, 1),        # tiny plane, tiles span images
    (1, 8, 3, 3, 4, 3, 3, 1, 0, 1, 1),          # kernel as large as the input
    (2, 4, 5, 5, 4, 2, 2, 1, 3, 1, 1),          # padding wider than the kernel
    (2, 16, 13, 11, 24, 3, 3, 1, 1, 1, 1),      # odd output: Winograd's half tiles
    (2, 32, 17, 16, 16, 3, 3, 1, (0, 2), 1, 2),  # Winograd per group, asymmetric padding
    (1, 16, 1, 1, 16, 3, 3, 1, 1, 1, 1),        # a 1x1 image
    # stride phases that taps share (row: stride 4, dilation 6 -> period 2;
    # column: stride 3, dilation 2 -> period 3); strides far past the input
    # are in tests/core/test_bad_input.py, in a subprocess
    (1, 16, 19, 17, 8, 3, 3, (4, 3), 2, (6, 2), 1),
]


def _winograd_applies(case):
    _, _, _, _, _, kh, kw, s, _, d, _ = case
    return kh == kw == 3 and _pair(s) == (1, 1) and _pair(d) == (1, 1)


CONV_PARAMS = [(case, algo) for case in CONV_CASES
               for algo in ("auto", "shifted", "im2col", "direct", "blocked", "winograd", "winograd4")
               if not algo.startswith("winograd") or _winograd_applies(case)]


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("case, algo", CONV_PARAMS, ids=str)
def test_conv2d_matches_reference(case, algo, dtype):
    n, c, h, w, o, kh, kw, s, p, d, g = case
    x, wt, b = rand(n, c, h, w, dtype=dtype), rand(o, c // g, kh, kw, dtype=dtype), rand(o, dtype=dtype)
    y = nn._conv2d(tensor(x), tensor(wt), tensor(b), s, p, d, g, algo)
    assert y.dtype == dtype
    close(y.numpy(), ref_conv2d(x, wt, b, s, p, d, g), dtype)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("case", [
    (2, 6, 8, 8, 6, 3, 1, 1, 1),       # MobileNetV2: groups == C == O
    (2, 5, 9, 7, 5, 3, 2, 1, 1),       # stride 2, odd sizes
    (1, 4, 10, 10, 4, 3, 1, 2, 2),     # dilation 2
    (2, 3, 8, 8, 6, 3, 1, 1, 1),       # channel multiplier 2
    (1, 4, 6, 6, 4, 5, 1, 0, 1),       # 5x5, no padding
    (2, 1, 9, 9, 8, 3, 1, 1, 1),       # one input channel, groups 1
], ids=str)
@pytest.mark.parametrize("algo", ["auto", "depthwise", "im2col"])
def test_depthwise_conv2d(case, algo, dtype):
    n, c, h, w, o, k, s, p, d = case
    groups = c
    x, wt, b = rand(n, c, h, w, dtype=dtype), rand(o, 1, k, k, dtype=dtype), rand(o, dtype=dtype)
    if algo == "auto":
        assert nn.conv2d_algorithm(x.shape, wt.shape, s, p, d, groups) == "depthwise"
    y = nn._conv2d(tensor(x), tensor(wt), tensor(b), s, p, d, groups, algo)
    close(y.numpy(), ref_conv2d(x, wt, b, s, p, d, groups), dtype)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("case", [
    # (n, c, h, w, multiplier, (kh, kw), stride, padding, dilation)
    (1, 5, 7, 7, 1, (3, 3), 1, 1, 1),            # MobileNet's 7x7 planes: wide rows shorter than a vector
    (3, 4, 13, 11, 1, (3, 3), 2, 1, 1),          # odd sizes, stride 2 (the deinterleaving pack)
    (2, 3, 12, 14, 1, (3, 3), 2, 0, 1),          # stride 2 without padding
    (2, 3, 11, 12, 1, (3, 3), (2, 1), (0, 2), 1),  # stride and padding differ per axis
    (1, 2, 17, 16, 2, (3, 3), 3, 2, 1),          # stride 3, multiplier 2
    (1, 3, 15, 13, 1, (3, 3), 2, 2, 2),          # stride and dilation together
    (2, 2, 9, 10, 1, (5, 3), 1, (2, 1), 1),      # kh != kw: the tap-by-tap path
    (1, 2, 12, 12, 1, (7, 7), 2, 3, 1),
    (1, 3, 4, 5, 1, (3, 3), 1, 3, 1),            # padding wider than the input
    (2, 2, 1, 1, 1, (1, 1), 1, 0, 1),            # 1x1 depthwise
    (1, 3, 7, 7, 1, (4, 4), 4, 0, 1),            # rows/columns 4..6 read by no output: the map's bin
    (1, 3, 40, 37, 1, (3, 3), 2, 1, 1),          # over 1024 inputs: packed row by row, not by index map
    (1, 2, 33, 32, 1, (3, 3), 1, 1, 1),
], ids=str)
def test_depthwise_packed_geometries(case, dtype):
    """DEPTHWISE's packed plane (zero padding written once per thread, the
    stride's phases, wide rows; small planes packed through an index map,
    inputs no output reads into a bin) over geometries the MobileNet ones do
    not reach, on every thread count."""
    n, c, h, w, mult, (kh, kw), s, p, d = case
    x, wt, b = rand(n, c, h, w, dtype=dtype), rand(c * mult, 1, kh, kw, dtype=dtype), rand(c * mult, dtype=dtype)
    ref = ref_conv2d(x, wt, b, s, p, d, c)
    for y in _on_threads(lambda: nn._conv2d(tensor(x), tensor(wt), tensor(b), s, p, d, c, "depthwise")):
        close(y.numpy(), ref, dtype)


NP_ACTS = {"none": lambda y: y, "relu": lambda y: np.maximum(y, 0), "relu6": lambda y: np.clip(y, 0, 6),
           "silu": lambda y: y / (1 + np.exp(-y))}



@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("case", [
    # (n, c, h, w, (kh, kw), stride, padding, dilation): DEPTHWISE's vector loop in whole
    # vectors past the last output, and its row copies in whole vectors while they stay in the plane
    (2, 7, 7, 7, (3, 3), 1, 1, 1),        # MobileNet's 7x7: a row is 7 lanes of 16
    (1, 5, 14, 14, (3, 3), 2, 1, 1),      # 14x14 stride 2: 7x7 output
    (1, 4, 17, 16, (3, 3), 1, 1, 1),      # rows of exactly 16 and of 17
    (3, 3, 5, 3, (3, 3), 1, 1, 1),        # 3 wide: one vector covers five rows
    (1, 3, 1, 9, (1, 3), 1, (0, 1), 1),   # one row: no whole-vector copy fits
    (1, 2, 9, 9, (5, 5), 1, 4, 2),        # tap by tap, dilated
], ids=str)
@pytest.mark.parametrize("act, residual", [("relu6", False), ("relu", False), ("none", False), ("silu", False),
                                           ("relu6", True)], ids=str)
def test_depthwise_small_planes_epilogue(case, act, residual, dtype):
    """DEPTHWISE's packed path with the ReLU/ReLU6 clamp in the vector loop
    and the other epilogues after the copy, on 1, 2 and 3 threads (threads
    split the planes: a row copy must not spill into another thread's)."""
    n, c, h, w, (kh, kw), s, p, d = case
    x, wt, b = rand(n, c, h, w, dtype=dtype) * 4, rand(c, 1, kh, kw, dtype=dtype), rand(c, dtype=dtype)
    x[0, 0, 0, :] = np.nan      # NaN stays NaN through the clamp, as in act.c
    plain = ref_conv2d(x, wt, b, s, p, d, c)
    r = rand(*plain.shape, dtype=dtype) if residual else None
    ref = NP_ACTS[act](plain + (r if residual else 0))
    args = (tensor(x), tensor(wt), tensor(b), s, p, d, c, "depthwise", act, tensor(r) if residual else None)
    for y in _on_threads(lambda: nn._conv2d(*args).numpy()):
        assert np.array_equal(np.isnan(y), np.isnan(ref))
        close(np.nan_to_num(y), np.nan_to_num(ref), dtype)


def test_depthwise_large_plane_falls_back():
    """A plane whose packed copy would pass DEPTHWISE's 4 MiB scratch takes
    the direct path; both paths agree with the reference."""
    x, wt, b = rand(1, 1, 1030, 1030), rand(1, 1, 3, 3), rand(1)
    y = nn._conv2d(tensor(x), tensor(wt), tensor(b), 1, 1, 1, 1, "depthwise")
    close(y.numpy(), ref_conv2d(x, wt, b, 1, 1, 1, 1), "float32")


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("shape", [(2, 8, 40, 40, 16, 1), (1, 32, 7, 9, 8, 1), (3, 12, 33, 32, 6, 3)], ids=str)
def test_conv2d_1x1_is_a_gemm(shape, dtype):
    n, c, h, w, o, g = shape
    x, wt, b = rand(n, c, h, w, dtype=dtype), rand(o, c // g, 1, 1, dtype=dtype), rand(o, dtype=dtype)
    if h * w >= 1024:
        assert nn.conv2d_algorithm(x.shape, wt.shape, groups=g) == "gemm1x1"
    for algo in ("auto", "gemm1x1"):
        y = nn._conv2d(tensor(x), tensor(wt), tensor(b), 1, 0, 1, g, algo)
        close(y.numpy(), ref_conv2d(x, wt, b, 1, 0, 1, g), dtype)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("shape", [
    # (n, c, h, w, o, groups): how GEMM1X1 shares an image over threads
    (1, 24, 30, 31, 72, 1),     # output channels split; column sub-tiles (930 > 64 KiB / 36 rows)
    (1, 40, 33, 35, 8, 1),      # few output channels: 16-aligned pixel ranges, the last shorter
    (3, 16, 9, 11, 40, 1),      # odd batch: each image in pieces so threads get equal shares
    (1, 12, 3, 3, 6, 1),        # 9 pixels: rows split even below the row minimum
    (1, 16, 20, 20, 32, 2),     # groups: a piece within a group's rows
    (2, 8, 5, 7, 12, 1),        # an image a thread
], ids=str)
@pytest.mark.parametrize("bias, act, residual", [(True, "none", False), (False, "relu6", False),
                                                  (True, "silu", True), (False, "none", True)], ids=str)
def test_conv2d_1x1_pieces(shape, dtype, bias, act, residual):
    """GEMM1X1's pieces (output-channel blocks, pixel ranges, column
    sub-tiles filled with the bias before the GEMM adds onto them) on 1, 2
    and 3 threads, with and without bias, activation and residual."""
    n, c, h, w, o, g = shape
    x, wt = rand(n, c, h, w, dtype=dtype), rand(o, c // g, 1, 1, dtype=dtype)
    b = rand(o, dtype=dtype) if bias else None
    r = rand(n, o, h, w, dtype=dtype) if residual else None
    ref = NP_ACTS[act](ref_conv2d(x, wt, b, 1, 0, 1, g) + (r if residual else 0))
    args = (tensor(x), tensor(wt), tensor(b) if bias else None, 1, 0, 1, g, "gemm1x1", act,
            tensor(r) if residual else None)
    for y in _on_threads(lambda: nn._conv2d(*args).numpy()):
        close(y, ref, dtype)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("case", [
    # (n, c, h, w, o, k, stride, padding): IM2COL tiles within an image (planes of
    # 256 outputs or more), K = c * k * k small: several cache-sized tiles a thread
    (1, 3, 70, 66, 16, 3, 1, 1),      # K = 27 (MobileNet's stem), 4620 outputs
    (2, 3, 81, 80, 8, 3, 2, 1),       # stride 2, two images
    (1, 2, 40, 41, 5, 5, 1, 2),       # 5x5, odd output count
], ids=str)
@pytest.mark.parametrize("bias, act, residual", [(True, "relu6", False), (False, "none", False),
                                                  (True, "silu", True), (False, "relu", True)], ids=str)
def test_conv2d_im2col_tiles_epilogue(case, dtype, bias, act, residual):
    """IM2COL's per-image tiles: filled with the bias before the GEMM adds
    onto them (beta 1), the epilogue after, on 1, 2 and 3 threads."""
    n, c, h, w, o, k, s, p = case
    x, wt = rand(n, c, h, w, dtype=dtype), rand(o, c, k, k, dtype=dtype)
    b = rand(o, dtype=dtype) if bias else None
    plain = ref_conv2d(x, wt, b, s, p)
    r = rand(*plain.shape, dtype=dtype) if residual else None
    ref = NP_ACTS[act](plain + (r if residual else 0))
    args = (tensor(x), tensor(wt), tensor(b) if bias else None, s, p, 1, 1, "im2col", act,
            tensor(r) if residual else None)
    for y in _on_threads(lambda: nn._conv2d(*args).numpy()):
        close(y, ref, dtype)


def test_conv2d_algorithm_choice():
    # F(4x4) Winograd where a plane has many 4x4 tiles and drops no more
    # outputs than F(2x2) does; F(2x2) on 14x14 (F(4x4) would compute 16x16)
    assert nn.conv2d_algorithm((8, 64, 56, 56), (64, 64, 3, 3), 1, 1) == "winograd4"
    assert nn.conv2d_algorithm((1, 128, 28, 28), (128, 128, 3, 3), 1, 1) == "winograd4"
    assert nn.conv2d_algorithm((8, 256, 14, 14), (256, 256, 3, 3), 1, 1) == "winograd"
    assert nn.conv2d_algorithm((1, 64, 12, 12), (64, 64, 3, 3), 1, 1) == "winograd"     # 9 tiles of 4x4
    assert nn.conv2d_algorithm((8, 64, 56, 56), (64, 64, 3, 3), 1, 2, 2) == "shifted"
    # DIRECT for strided layers with 28x28 outputs and up, and for stems
    assert nn.conv2d_algorithm((2, 64, 112, 112), (64, 64, 3, 3), 2, 1) == "direct"
    assert nn.conv2d_algorithm((8, 64, 56, 56), (128, 64, 3, 3), 2, 1) == "direct"   # 28x28 out
    assert nn.conv2d_algorithm((8, 128, 28, 28), (256, 128, 3, 3), 2, 1) == "im2col"  # 14x14 out
    assert nn.conv2d_algorithm((8, 256, 14, 14), (512, 256, 1, 1), 2) == "im2col"
    with pytest.raises(ValueError, match="conv2d: groups must be >= 1, got 0"):
        nn.conv2d_algorithm((1, 4, 5, 5), (4, 4, 3, 3), groups=0)
    with pytest.raises(ValueError, match="conv2d: kernel .* larger than the padded input"):
        nn.conv2d_algorithm((1, 4, 2, 2), (4, 4, 3, 3))
    assert nn.conv2d_algorithm((8, 3, 224, 224), (64, 3, 7, 7), 2, 3) == "direct"
    assert nn.conv2d_algorithm((1, 3, 224, 224), (32, 3, 3, 3), 2, 1) == "direct"
    assert nn.conv2d_algorithm((8, 144, 56, 56), (144, 1, 3, 3), 1, 1, 1, 144) == "depthwise"
    assert nn.conv2d_algorithm((8, 256, 56, 56), (64, 256, 1, 1)) == "gemm1x1"
    assert nn.conv2d_algorithm((8, 256, 7, 7), (64, 256, 1, 1)) == "gemm1x1"       # small planes too
    # Winograd's tiles count over the batch: 7x7 planes of 512 channels pay from 64 tiles (4 images)
    assert nn.conv2d_algorithm((8, 512, 7, 7), (512, 512, 3, 3), 1, 1) == "winograd"
    assert nn.conv2d_algorithm((2, 512, 7, 7), (512, 512, 3, 3), 1, 1) == "im2col"
    assert nn.conv2d_algorithm((1, 256, 14, 14), (256, 256, 3, 3), 1, 1) == "winograd"


@pytest.fixture(params=[False, True], ids=["cpu_kernels", "narrow_kernels"])
def kernels(request):
    """The conv kernels AUTO picks from: the CPU's (AVX-512 where it has it)
    or, forced, the AVX2/baseline ones; yields whether they are AVX-512."""
    nn._direct_force_narrow(request.param)
    try:
        yield nn._wide_conv_kernels()
    finally:
        nn._direct_force_narrow(False)


def test_conv2d_algorithm_choice_with_cached_weights(kernels):
    """For a weight whose packed copy is cached: with AVX-512 kernels,
    BLOCKED on strided layers with 256 and more multiply-adds an output (64
    for 1x1 kernels),
    on 3x3 layers with fewer than 400 F(2x2) tiles and on 1x1 layers with
    512 and more channels on small planes; without, DIRECT on strided layers
    of any plane size and on 3x3 layers with fewer than 128 tiles."""
    def pick(x, w, *args):
        return nn.conv2d_algorithm(x, w, *args, cached=True)
    blocked = "blocked" if kernels else "direct"
    assert pick((8, 128, 28, 28), (256, 128, 3, 3), 2, 1) == blocked          # 14x14 out
    assert pick((1, 256, 14, 14), (512, 256, 3, 3), 2, 1) == blocked          # 7x7 out
    assert pick((1, 512, 7, 7), (512, 512, 3, 3), 1, 1) == blocked            # 16 tiles
    assert pick((1, 256, 14, 14), (256, 256, 3, 3), 1, 1) == blocked          # 49 tiles
    assert pick((1, 128, 28, 28), (128, 128, 3, 3), 1, 1) == ("blocked" if kernels else "winograd4")
    assert pick((8, 128, 28, 28), (128, 128, 3, 3), 1, 1) == "winograd4"      # 1568 tiles
    assert pick((8, 512, 7, 7), (512, 512, 3, 3), 1, 1) == ("blocked" if kernels else "winograd4")
    assert pick((1, 64, 12, 12), (8, 64, 3, 3), 1, 1) == "im2col"             # 8 outputs
    assert pick((1, 3, 224, 224), (64, 3, 7, 7), 2, 3) == "direct"            # the stem: 147 MACs
    assert pick((1, 256, 14, 14), (512, 256, 1, 1), 2) == ("blocked" if kernels else "im2col")
    assert pick((1, 64, 56, 56), (128, 64, 1, 1), 2) == ("blocked" if kernels else "im2col")
    assert pick((1, 32, 56, 56), (128, 32, 1, 1), 2) == "im2col"              # 32 MACs an output
    assert pick((1, 960, 7, 7), (320, 960, 1, 1)) == ("blocked" if kernels else "gemm1x1")
    assert pick((1, 96, 14, 14), (576, 96, 1, 1)) == "gemm1x1"                # 96 MACs an output
    assert pick((1, 576, 28, 28), (96, 576, 1, 1)) == "gemm1x1"               # a larger plane
    # a weight packed on every call keeps the choices of before
    assert nn.conv2d_algorithm((1, 512, 7, 7), (512, 512, 3, 3), 1, 1) == "im2col"


def test_conv2d_many_image_batches():
    """SHIFTED, WINOGRAD and IM2COL copy at most ~32 MiB of padded input at a
    time: 5 images of 64 x 130 x 130 float64 take two batches."""
    x, wt, b = rand(5, 64, 128, 128, dtype="float64"), rand(4, 64, 3, 3, dtype="float64"), rand(4, dtype="float64")
    ref = ref_conv2d(x, wt, b, 1, 1)
    for algo in ("shifted", "winograd", "winograd4", "im2col"):
        close(nn._conv2d(tensor(x), tensor(wt), tensor(b), 1, 1, 1, 1, algo).numpy(), ref, "float64")


@pytest.mark.parametrize("k, padding", [(3, 1), (1, 1)])
def test_conv2d_im2col_small_planes_in_batches(k, padding):
    """IM2COL on small planes: column tiles span images and start inside
    rows (84-column tiles of 5x5 outputs), and 8192 channels of 7x7 padded
    float64 (3.2 MB an image) split 12 images into batches of 10 and 2 for
    the packed copy; the 1x1 case uses the packed copy as the GEMM operand
    itself."""
    x, wt, b = rand(12, 8192, 5, 5, dtype="float64"), rand(5, 8192, k, k, dtype="float64"), rand(5, dtype="float64")
    y = nn._conv2d(tensor(x), tensor(wt), tensor(b), 1, padding, 1, 1, "im2col")
    close(y.numpy(), ref_conv2d(x, wt, b, 1, padding), "float64")


@pytest.mark.parametrize("algo", ["winograd", "winograd4"])
def test_conv2d_winograd_chunks_span_images(algo):
    """WINOGRAD transforms ~8 MiB of tiles at a time: 5 images of 256
    channels at 14x14 (35 rows of 7 tiles, float64) take two chunks of 18
    tile rows, the first ending inside the third image; WINOGRAD4 (20 rows
    of 4 tiles, 36 points a tile) takes four chunks of 5 rows, one per
    image but the last, which is split."""
    x, wt, b = rand(5, 256, 14, 14, dtype="float64"), rand(256, 256, 3, 3, dtype="float64"), rand(256, dtype="float64")
    y = nn._conv2d(tensor(x), tensor(wt), tensor(b), 1, 1, 1, 1, algo)
    close(y.numpy(), ref_conv2d(x, wt, b, 1, 1), "float64")


def test_conv2d_delta_kernel_is_identity():
    x = rand(2, 3, 6, 7)
    wt = np.zeros((3, 3, 3, 3), np.float32)
    for i in range(3):
        wt[i, i, 1, 1] = 1
    for algo in ("shifted", "im2col"):
        np.testing.assert_array_equal(nn._conv2d(tensor(x), tensor(wt), None, 1, 1, 1, 1, algo).numpy(), x)
    # Winograd's transforms round (a few ulps), so it is close rather than exact
    for algo in ("winograd", "winograd4"):
        close(nn._conv2d(tensor(x), tensor(wt), None, 1, 1, 1, 1, algo).numpy(), x.astype(np.float64), "float32")


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("algo", ["auto", "winograd", "winograd4"])
def test_conv2d_half_types_compute_in_float32(dtype, algo):
    x, wt, b = as_dtype(rand(2, 8, 9, 9), dtype), as_dtype(rand(6, 8, 3, 3), dtype), as_dtype(rand(6), dtype)
    y = nn._conv2d(tensor(x), tensor(wt), tensor(b), 1, 1, 1, 1, algo)
    assert y.dtype == np.dtype(ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype)
    close(y.numpy().astype(np.float64), ref_conv2d(x.astype(np.float64), wt.astype(np.float64),
                                                   b.astype(np.float64), 1, 1), dtype)


def test_conv2d_non_contiguous_inputs():
    xb, wb = rand(2, 5, 10, 8), rand(4, 6, 3, 3)
    x = tensor(xb).transpose(0, 1, 3, 2)           # [2, 5, 8, 10], strided
    wt = tensor(wb)[:, 1:6]                         # a slice of the channel axis
    b = tensor(rand(8))[::2]                        # stride 2
    assert not x.is_contiguous and not wt.is_contiguous and not b.is_contiguous
    y = nn.conv2d(x, wt, b, stride=(2, 1), padding=1)
    close(y.numpy(), ref_conv2d(x.numpy(), wt.numpy(), b.numpy(), (2, 1), 1), "float32")


def test_conv2d_promotes_and_accepts_arrays():
    x, wt = rand(1, 2, 5, 5), rand(3, 2, 3, 3, dtype="float64")
    y = nn.conv2d(tensor(x), wt)                    # a NumPy float64 weight
    assert y.dtype == "float64"
    close(y.numpy(), ref_conv2d(x, wt), "float64")


def test_conv2d_zero_sizes():
    y = nn.conv2d(tensor(rand(0, 3, 5, 5)), tensor(rand(4, 3, 3, 3)))
    assert y.shape == (0, 4, 3, 3)
    b = rand(4)
    y = nn.conv2d(tensor(rand(2, 0, 5, 5)), tensor(rand(4, 0, 3, 3)), tensor(b), padding=1)
    np.testing.assert_array_equal(y.numpy(), np.broadcast_to(b[None, :, None, None], (2, 4, 5, 5)))


def test_conv2d_thread_count_does_not_change_results():
    x, wt = rand(4, 32, 20, 20), rand(16, 32, 3, 3)
    before = dispatch.get_num_threads()
    try:
        outs = []
        for n in (1, 2, 3):
            try:
                dispatch.set_num_threads(n)
            except ImportError:     # linalg (the BLAS half) not built here; kernels are set
                pass
            outs.append(nn.conv2d(tensor(x), tensor(wt), padding=1).numpy())
    finally:
        try:
            dispatch.set_num_threads(before)
        except ImportError:
            pass
    for o in outs[1:]:
        np.testing.assert_allclose(o, outs[0], rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("kwargs, exc, match", [
    ({"x": (2, 4, 5), "w": (3, 4, 3, 3)}, ValueError, r"x of shape \[N, C, H, W\]"),
    ({"w": (3, 4, 3)}, ValueError, "weight of shape"),
    ({"w": (3, 5, 3, 3)}, ValueError, "x has 4 channels but weight expects 5"),
    ({"w": (3, 2, 3, 3), "groups": 2}, ValueError, "does not divide the 3 output channels"),
    ({"w": (4, 1, 3, 3), "groups": 3}, ValueError, "groups=3 does not divide the 4 input channels"),
    ({"groups": 0}, ValueError, "groups must be >= 1, got 0"),
    ({"w": (3, 4, 9, 9)}, ValueError, "larger than the padded input"),
    ({"stride": 0}, ValueError, "stride must be >= 1, got 0"),
    ({"stride": (1, -1)}, ValueError, "stride must be >= 1, got -1"),
    ({"padding": -1}, ValueError, "padding must be >= 0, got -1"),
    ({"dilation": 0}, ValueError, "dilation must be >= 1, got 0"),
    ({"stride": 1.5}, TypeError, "stride must be an int, got float"),
    ({"padding": (1, 2, 3)}, ValueError, r"padding must be an int or a pair of ints, got \(1, 2, 3\)"),
    ({"b": (4,)}, ValueError, r"bias must have shape \(3,\)"),
    ({"b": (3, 1)}, ValueError, r"bias must have shape \(3,\)"),
    ({"w": (3, 4, 0, 3)}, ValueError, "kernel size must be positive"),
])
def test_conv2d_bad_input(kwargs, exc, match):
    x = tensor(rand(*kwargs.pop("x", (2, 4, 6, 6))))
    w = tensor(rand(*kwargs.pop("w", (3, 4, 3, 3))))
    b = kwargs.pop("b", None)
    b = tensor(rand(*b)) if b is not None else None
    with pytest.raises(exc, match=match):
        nn.conv2d(x, w, b, **kwargs)


def test_conv2d_bad_algorithm_requests():
    x, w = tensor(rand(1, 4, 6, 6)), tensor(rand(2, 4, 3, 3))
    with pytest.raises(ValueError, match="unknown algorithm"):
        nn._conv2d(x, w, None, 1, 0, 1, 1, "winograd9")
    with pytest.raises(ValueError, match="one input channel per group"):
        nn._conv2d(x, w, None, 1, 0, 1, 1, "depthwise")
    with pytest.raises(ValueError, match="1x1 kernel"):
        nn._conv2d(x, w, None, 1, 0, 1, 1, "gemm1x1")
    for stride, dilation in ((2, 1), (1, 2)):
        with pytest.raises(ValueError, match="winograd kernel needs a 3x3 kernel, stride 1"):
            nn._conv2d(x, w, None, stride, 1, dilation, 1, "winograd")


@pytest.mark.parametrize("dtype", ["int32", "int8", "bool"])
def test_conv2d_rejects_integer_tensors(dtype):
    x = tensor(np.ones((1, 2, 4, 4), dtype))
    with pytest.raises(TypeError, match=f"conv2d: expected floating-point tensors, got {dtype}"):
        nn.conv2d(x, tensor(rand(2, 2, 3, 3)))


def test_devices():
    x, w = rand(1, 2, 5, 5), rand(3, 2, 3, 3)
    y = nn.conv2d(tensor(x, device="cpu:1"), tensor(w, device="cpu:1"), padding=1)
    assert str(y.device) == "cpu:1"
    close(y.numpy(), ref_conv2d(x, w, None, 1, 1), "float32")
    with pytest.raises(ValueError, match="ambiguous device: cpu:0 vs cpu:1"):
        nn.conv2d(tensor(x), tensor(w, device="cpu:1"))
    with pytest.raises(ValueError, match="ambiguous device: cpu:1 vs cpu:0"):
        nn.conv_transpose2d(tensor(x, device="cpu:1"), tensor(rand(2, 3, 3, 3)))
    for op in (lambda t: nn.max_pool2d(t, 2), lambda t: nn.interpolate(t, size=7),
               lambda t: nn.pad(t, 1), lambda t: nn.adaptive_avg_pool2d(t, 2)):
        assert str(op(tensor(x, device="cpu:1")).device) == "cpu:1"


# ------------------------------------------------------------------ conv_transpose2d

# (N, C, H, W, Og, K, stride, padding, output_padding, dilation, groups)
TRANSPOSE_CASES = [
    (2, 4, 5, 5, 3, 3, 1, 0, 0, 1, 1),
    (2, 4, 5, 6, 3, 3, 2, 1, 1, 1, 1),
    (1, 6, 4, 4, 2, 4, 2, 1, 0, 1, 3),
    (3, 4, 5, 5, 3, 3, (2, 3), (1, 0), (1, 2), 1, 2),
    (2, 2, 6, 5, 2, 3, 1, 2, 1, 2, 1),       # output_padding < dilation
    (1, 8, 3, 3, 4, 5, 3, 2, 2, (2, 1), 1),
    (4, 2, 7, 7, 5, 2, 2, 0, 0, 1, 1),       # the classic 2x upsampling
]


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("case", TRANSPOSE_CASES, ids=str)
def test_conv_transpose2d_matches_reference(case, dtype):
    n, c, h, w, og, k, s, p, op, d, g = case
    x, wt, b = rand(n, c, h, w, dtype=dtype), rand(c, og, k, k, dtype=dtype), rand(og * g, dtype=dtype)
    y = nn.conv_transpose2d(tensor(x), tensor(wt), tensor(b), s, p, op, d, g)
    ref = ref_conv_transpose2d(x, wt, b, s, p, op, d, g)
    assert y.shape == ref.shape
    close(y.numpy(), ref, dtype)
    close(nn.conv_transpose2d(tensor(x), tensor(wt), None, s, p, op, d, g).numpy(),
          ref_conv_transpose2d(x, wt, None, s, p, op, d, g), dtype)


def test_conv_transpose2d_is_the_adjoint_of_conv2d():
    """<conv2d(x, w), y> == <x, conv_transpose2d(y, w)> for the same geometry."""
    x, w = rand(2, 3, 9, 8, dtype="float64"), rand(5, 3, 3, 3, dtype="float64")
    cy = nn.conv2d(tensor(x), tensor(w), stride=2, padding=1).numpy()
    y = rand(*cy.shape, dtype="float64")
    out_pad = ((9 + 2 - 3) % 2, (8 + 2 - 3) % 2)
    xt = nn.conv_transpose2d(tensor(y), tensor(w), stride=2, padding=1, output_padding=out_pad).numpy()
    assert xt.shape == x.shape
    assert math.isclose((cy * y).sum(), (x * xt).sum(), rel_tol=1e-10)


def test_conv_transpose2d_half_and_non_contiguous():
    x = tensor(rand(2, 6, 4, 5)).transpose(0, 1, 3, 2)
    w = tensor(rand(6, 2, 3, 3)).astype("float16")
    y = nn.conv_transpose2d(x, w, stride=2, groups=2)
    assert y.dtype == "float32"    # float32 x, float16 weight: promoted
    close(y.numpy(), ref_conv_transpose2d(x.numpy(), w.numpy().astype(np.float64), None, 2, groups=2), "float32")
    xh = tensor(rand(1, 2, 4, 4)).astype("float16")
    yh = nn.conv_transpose2d(xh, w[:2], stride=2)
    assert yh.dtype == "float16"
    close(yh.numpy(), ref_conv_transpose2d(xh.numpy(), w[:2].numpy(), None, 2), "float16")


@pytest.mark.parametrize("kwargs, match", [
    ({"w": (3, 2, 3, 3)}, "x has 4 channels but weight.shape"),
    ({"groups": 3}, "groups=3 does not divide the 4 input channels"),
    ({"output_padding": 1}, "output_padding .* must be smaller than either stride"),
    ({"stride": 2, "output_padding": 2}, "must be smaller than either stride"),
    ({"padding": 4}, "leaves no output"),
    ({"b": (3,)}, r"bias must have shape \(2,\)"),
    ({"x": (4, 5, 5)}, r"x of shape \[N, C, H, W\]"),
    ({"dilation": 0}, "dilation must be >= 1, got 0"),
])
def test_conv_transpose2d_bad_input(kwargs, match):
    x = tensor(rand(*kwargs.pop("x", (1, 4, 5, 5))))
    w = tensor(rand(*kwargs.pop("w", (4, 2, 3, 3))))
    b = kwargs.pop("b", None)
    with pytest.raises(ValueError, match=match):
        nn.conv_transpose2d(x, w, tensor(rand(*b)) if b else None, **kwargs)


# ------------------------------------------------------------------ pooling

MAX_POOL_CASES = [  # kernel, stride, padding, dilation, ceil_mode
    (2, None, 0, 1, False), (3, 2, 1, 1, False), (3, 2, 1, 1, True), (2, 2, 0, 1, True),
    ((2, 3), (1, 2), (1, 1), 1, False), (3, 1, 1, 2, False), (3, 3, 1, (2, 1), True),
    (4, 3, 2, 1, True), (1, 1, 0, 1, False),
]


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("case", MAX_POOL_CASES, ids=str)
@pytest.mark.parametrize("hw", [(7, 9), (8, 8)])
def test_max_pool2d(case, hw, dtype):
    k, s, p, d, ceil_mode = case
    x = rand(2, 3, *hw, dtype=dtype) - 5      # all negative: a padded 0 would win
    y = nn.max_pool2d(tensor(x), k, s, p, d, ceil_mode)
    np.testing.assert_array_equal(y.numpy(), ref_max_pool2d(x, k, s, p, d, ceil_mode))


def test_max_pool2d_propagates_nan():
    x = rand(1, 1, 4, 4)
    x[0, 0, 1, 2] = np.nan
    y = nn.max_pool2d(tensor(x), 2).numpy()
    assert np.isnan(y[0, 0, 0, 1]) and not np.isnan(y[0, 0, 0, 0]) and not np.isnan(y[0, 0, 1]).any()


@pytest.mark.parametrize("dtype", FLOATS)
def test_max_pool2d_packed_planes_on_threads(dtype):
    """ResNet's 3x3 / 2 pool (the packed, phase-split path) on odd planes,
    batch > 1 and every thread count, with NaNs at borders and inside, and
    a plane too large for the packed copy (the direct loops)."""
    x = rand(3, 5, 23, 17, dtype=dtype) - 5
    x[0, 0, 0, 0] = x[1, 2, 22, 16] = x[2, 4, 11, 8] = np.nan
    ref = ref_max_pool2d(x, 3, 2, 1)
    big = rand(1, 1, 1100, 1100, dtype=dtype)
    before = dispatch.get_num_threads()
    try:
        for threads in (1, 2, 3):
            dispatch.set_num_threads(threads)
            np.testing.assert_array_equal(nn.max_pool2d(tensor(x), 3, 2, 1).numpy(), ref)
            np.testing.assert_array_equal(nn.max_pool2d(tensor(x), 3, 2, 1, ceil_mode=True).numpy(),
                                          ref_max_pool2d(x, 3, 2, 1, ceil_mode=True))
        np.testing.assert_array_equal(nn.max_pool2d(tensor(big), 3, 2, 1).numpy(), ref_max_pool2d(big, 3, 2, 1))
    finally:
        dispatch.set_num_threads(before)


AVG_POOL_CASES = [  # kernel, stride, padding, ceil_mode, count_include_pad
    (2, None, 0, False, True), (3, 2, 1, False, True), (3, 2, 1, False, False),
    (3, 2, 1, True, True), (3, 2, 1, True, False), ((2, 4), (2, 3), (1, 2), True, False),
    (4, 3, 2, True, True), (3, 1, 0, False, True),
]


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("case", AVG_POOL_CASES, ids=str)
@pytest.mark.parametrize("hw", [(7, 9), (8, 8)])
def test_avg_pool2d(case, hw, dtype):
    k, s, p, ceil_mode, cip = case
    x = rand(2, 3, *hw, dtype=dtype)
    y = nn.avg_pool2d(tensor(x), k, s, p, ceil_mode, cip)
    close(y.numpy(), ref_avg_pool2d(x, k, s, p, ceil_mode, cip), dtype)


def test_avg_pool2d_count_include_pad_is_a_mean_over_zero_padding():
    x = rand(2, 2, 6, 6, dtype="float64")
    y = nn.avg_pool2d(tensor(x), 3, 1, 1).numpy()
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    ref = np.lib.stride_tricks.sliding_window_view(xp, (3, 3), axis=(2, 3)).mean(axis=(-2, -1))
    close(y, ref, "float64")


@pytest.mark.parametrize("dtype", FLOATS + ["float16"])
@pytest.mark.parametrize("out", [(1, 1), (3, 3), (4, 5), (7, 9), (10, 12), (None, 2)], ids=str)
def test_adaptive_pools(out, dtype):
    x = as_dtype(rand(2, 3, 7, 9), dtype)
    oh, ow = out[0] or 7, out[1] or 9
    size = out if out[0] is not None else (None, out[1])
    xa = x.astype(np.float64)
    close(nn.adaptive_avg_pool2d(tensor(x), size).numpy(), ref_adaptive(xa, oh, ow, np.mean), dtype)
    np.testing.assert_array_equal(nn.adaptive_max_pool2d(tensor(x), size).numpy().astype(np.float64),
                                  ref_adaptive(xa, oh, ow, np.max))
    assert nn.adaptive_avg_pool2d(tensor(x), 4).shape == (2, 3, 4, 4)


def test_pools_half_and_non_contiguous():
    x = tensor(rand(2, 3, 9, 8)).transpose(0, 1, 3, 2)
    close(nn.avg_pool2d(x, 3, 2, 1).numpy(), ref_avg_pool2d(x.numpy(), 3, 2, 1), "float32")
    xh = x.astype("bfloat16")
    y = nn.max_pool2d(xh, 3, 2, 1, ceil_mode=True)
    assert y.dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(y.numpy().astype(np.float64),
                                  ref_max_pool2d(xh.numpy().astype(np.float64), 3, 2, 1, ceil_mode=True))


@pytest.mark.parametrize("call, exc, match", [
    (lambda x: nn.max_pool2d(x, 3, padding=2), ValueError, "at most half the kernel size"),
    (lambda x: nn.max_pool2d(x, 9), ValueError, "larger than the padded input"),
    (lambda x: nn.max_pool2d(x, 2, stride=0), ValueError, "stride must be >= 1, got 0"),
    (lambda x: nn.max_pool2d(x, 0), ValueError, "kernel_size must be >= 1, got 0"),
    (lambda x: nn.max_pool2d(x, 2, dilation=0), ValueError, "dilation must be >= 1, got 0"),
    (lambda x: nn.avg_pool2d(x, (2, 2, 2)), ValueError, "kernel_size must be an int or a pair"),
    (lambda x: nn.avg_pool2d(x[0], 2), ValueError, r"x of shape \[N, C, H, W\]"),
    (lambda x: nn.avg_pool2d(x.astype("int32"), 2), TypeError, "avg_pool2d: expected floating-point tensors, got int32"),
    (lambda x: nn.adaptive_avg_pool2d(x, 0), ValueError, "output_size must be >= 1, got 0"),
    (lambda x: nn.adaptive_max_pool2d(x, 2.5), TypeError, "output_size must be an int"),
    (lambda x: nn.adaptive_max_pool2d(x.astype("uint8"), 2), TypeError, "adaptive_max_pool2d: .* got uint8"),
])
def test_pool_bad_input(call, exc, match):
    with pytest.raises(exc, match=match):
        call(tensor(rand(1, 2, 5, 5)))


# ------------------------------------------------------------------ interpolate

@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("size, sf", [((14, 18), None), ((3, 4), None), ((7, 9), None), ((10, 5), None),
                                      (None, 2.0), (None, 0.5), (None, (1.7, 2.3)), (None, 3)], ids=str)
def test_interpolate_nearest(size, sf, dtype):
    x = rand(2, 3, 7, 9, dtype=dtype)
    y = nn.interpolate(tensor(x), size=size, scale_factor=sf)
    if sf is not None:
        fh, fw = _pair(sf) if not isinstance(sf, float) else (sf, sf)
        oh, ow = math.floor(7 * fh), math.floor(9 * fw)
        iy, ix = ref_nearest_index(7, oh, fh), ref_nearest_index(9, ow, fw)
    else:
        oh, ow = size
        iy, ix = ref_nearest_index(7, oh), ref_nearest_index(9, ow)
    assert y.shape == (2, 3, oh, ow)
    np.testing.assert_array_equal(y.numpy(), x[:, :, iy][:, :, :, ix])


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("align_corners", [None, False, True])
@pytest.mark.parametrize("size, sf", [((14, 18), None), ((3, 4), None), ((7, 9), None), ((1, 1), None),
                                      ((10, 5), None), (None, 2.0), (None, (0.6, 1.5))], ids=str)
def test_interpolate_bilinear(size, sf, align_corners, dtype):
    x = rand(2, 3, 7, 9, dtype=dtype)
    y = nn.interpolate(tensor(x), size=size, scale_factor=sf, mode="bilinear", align_corners=align_corners)
    if sf is not None:
        fh, fw = (sf, sf) if isinstance(sf, float) else sf
        oh, ow = math.floor(7 * fh), math.floor(9 * fw)
        ref = ref_bilinear(x, oh, ow, bool(align_corners), (fh, fw))
    else:
        ref = ref_bilinear(x, *size, bool(align_corners))
    close(y.numpy(), ref, dtype)


def test_interpolate_same_size_is_a_copy():
    x = rand(1, 2, 5, 6)
    for mode, ac in (("nearest", None), ("bilinear", False), ("bilinear", True)):
        np.testing.assert_array_equal(nn.interpolate(tensor(x), size=(5, 6), mode=mode, align_corners=ac).numpy(), x)


def test_interpolate_half_and_non_contiguous():
    x = tensor(rand(1, 2, 6, 5)).transpose(0, 1, 3, 2)
    close(nn.interpolate(x, size=(8, 9), mode="bilinear").numpy(), ref_bilinear(x.numpy(), 8, 9, False), "float32")
    xh = x.astype("float16")
    y = nn.interpolate(xh, scale_factor=2, mode="bilinear", align_corners=True)
    assert y.dtype == "float16"
    close(y.numpy(), ref_bilinear(xh.numpy(), 10, 12, True), "float16")


@pytest.mark.parametrize("kwargs, exc, match", [
    ({}, ValueError, "exactly one of size and scale_factor"),
    ({"size": 4, "scale_factor": 2}, ValueError, "exactly one of size and scale_factor"),
    ({"size": 4, "mode": "bicubic"}, ValueError, "unsupported mode 'bicubic'"),
    ({"size": 4, "align_corners": True}, ValueError, "align_corners can only be set with mode='bilinear'"),
    ({"size": 0}, ValueError, "size must be >= 1, got 0"),
    ({"size": (2, 3, 4)}, ValueError, "size must be an int or a pair"),
    ({"scale_factor": 0.1}, ValueError, "gives an empty output"),
    ({"scale_factor": -1.0}, ValueError, "scale_factor must be positive"),
    ({"scale_factor": "2"}, TypeError, "scale_factor must be a number"),
])
def test_interpolate_bad_input(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        nn.interpolate(tensor(rand(1, 2, 5, 5)), **kwargs)
    with pytest.raises(ValueError, match=r"x of shape \[N, C, H, W\]"):
        nn.interpolate(tensor(rand(2, 5, 5)), size=3)


# ------------------------------------------------------------------ pad

NP_MODE = {"constant": "constant", "reflect": "reflect", "replicate": "edge", "circular": "wrap"}


@pytest.mark.parametrize("mode", ["constant", "reflect", "replicate", "circular"])
@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16", "int8", "int64", "uint16", "bool"])
@pytest.mark.parametrize("shape, pad_width", [
    ((5,), (2, 3)), ((4, 6), ((1, 2), (3, 0))), ((3, 4, 5), 2), ((2, 3, 4, 5), ((0, 0), (1, 1), (2, 3), (3, 1))),
    ((2, 3, 4, 5), ((1, 2),)), ((4, 5), [[0, 3], [2, 0]]), ((3, 1, 4), ((1, 2), (0, 0), (3, 3))),
], ids=str)
def test_pad(shape, pad_width, dtype, mode):
    if mode == "reflect" and np.any(np.broadcast_to(np.asarray(pad_width), (len(shape), 2)) >= np.array(shape)[:, None]):
        pytest.skip("reflect needs padding smaller than the axis")
    x = (RNG.standard_normal(shape) * 10)
    x = x > 0 if dtype == "bool" else as_dtype(x, dtype)
    value = True if dtype == "bool" else 7
    y = nn.pad(tensor(x), pad_width, mode=mode, value=value)
    kw = {"constant_values": value} if mode == "constant" else {}
    ref = np.pad(x, pad_width, mode=NP_MODE[mode], **kw)
    assert y.dtype == x.dtype
    np.testing.assert_array_equal(y.numpy(), ref)


def test_pad_non_contiguous_zero_size_and_0d():
    x = tensor(rand(4, 6)).transpose()
    for mode in ("constant", "reflect", "replicate", "circular"):
        np.testing.assert_array_equal(nn.pad(x, ((1, 2), (2, 1)), mode).numpy(),
                                      np.pad(x.numpy(), ((1, 2), (2, 1)), NP_MODE[mode]))
    # circular padding longer than the axis wraps around again (np.pad's "wrap")
    np.testing.assert_array_equal(nn.pad(x, ((13, 2), (0, 9)), "circular").numpy(),
                                  np.pad(x.numpy(), ((13, 2), (0, 9)), "wrap"))
    z = nn.pad(tensor(np.zeros((0, 3), np.float32)), ((1, 1), (0, 2)), value=-1.5)
    np.testing.assert_array_equal(z.numpy(), np.full((2, 5), -1.5, np.float32))
    assert nn.pad(tensor(np.zeros((0, 3), np.float32)), ((0, 0), (1, 1)), "reflect").shape == (0, 5)
    s = nn.pad(tensor(np.float32(2.5)), ())
    assert s.shape == () and s.item() == 2.5


@pytest.mark.parametrize("args, exc, match", [
    (((2, 2), "reflect"), ValueError, r"reflect padding \(2, 2\) on axis 1 must be smaller"),
    ((((0, 0), (0, 3)), "reflect"), ValueError, "must be smaller than the axis"),
    ((-1, "constant"), ValueError, "padding must be non-negative"),
    ((((1, 1), (1, 1), (1, 1)), "constant"), ValueError, r"one \(before, after\) pair per axis \(2 axes\)"),
    ((1, "wrap"), ValueError, "unsupported mode 'wrap'"),
    ((1.5, "constant"), TypeError, "pad_width must be an int or"),
    ((((1, 2), (3, "a")), "constant"), TypeError, "pad_width must be an int or"),
])
def test_pad_bad_input(args, exc, match):
    with pytest.raises(exc, match=match):
        nn.pad(tensor(rand(3, 2)), *args)
    for mode in ("replicate", "circular"):
        with pytest.raises(ValueError, match=f"cannot {mode}-pad axis 0 of size 0"):
            nn.pad(tensor(np.zeros((0, 2), np.float32)), 1, mode)


# ------------------------------------------------------------------ tracing and apply()

OPS = {
    "conv2d": (lambda: (tensor(rand(1, 2, 5, 5)), tensor(rand(3, 2, 3, 3)), tensor(rand(3))),
               {"stride": 1, "padding": (1, 1), "dilation": 1, "groups": 1}),
    "conv2d_act": (lambda: (tensor(rand(1, 2, 5, 5)), tensor(rand(3, 2, 3, 3)), tensor(rand(3)),
                            tensor(rand(1, 3, 5, 5))),
                   {"stride": 1, "padding": 1, "dilation": 1, "groups": 1, "act": "silu"}),
    "attention": (lambda: (tensor(rand(1, 2, 3, 4)), tensor(rand(1, 2, 5, 4)), tensor(rand(1, 2, 5, 6)),
                           tensor(rand(1, 1, 1, 5))), {"scale": 0.5}),
    "conv2d_nchwc": (lambda: (tensor(rand(1, 1, 5, 5, 16)), tensor(rand(3, 2, 3, 3)), tensor(rand(3)),
                              tensor(rand(1, 1, 5, 5, 16))),
                     {"stride": 1, "padding": 1, "dilation": 1, "groups": 1, "act": "relu"}),
    "conv2d_nchwc_pw_dw": (lambda: (tensor(rand(1, 1, 5, 5, 16)), tensor(rand(20, 2, 1, 1)), tensor(rand(20)),
                                    tensor(rand(20, 1, 3, 3)), tensor(rand(20))),
                           {"stride": 2, "padding": 1, "act": "relu6", "dw_act": "silu"}),
    "conv2d_nchwc_pw_dw_pw": (lambda: (tensor(rand(1, 1, 5, 5, 16)), tensor(rand(20, 2, 1, 1)), tensor(rand(20)),
                                       tensor(rand(20, 1, 3, 3)), tensor(rand(20)), tensor(rand(3, 20, 1, 1)),
                                       tensor(rand(3)), tensor(rand(1, 1, 3, 3, 16))),
                              {"stride": 2, "padding": 1, "act": "relu6", "dw_act": "silu", "proj_act": "relu"}),
    "to_nchwc": (lambda: (tensor(rand(1, 2, 5, 5)),), {}),
    "from_nchwc": (lambda: (tensor(rand(1, 1, 5, 5, 16)),), {"channels": 3}),
    "max_pool2d_nchwc": (lambda: (tensor(rand(1, 1, 5, 5, 16)),),
                         {"kernel_size": 3, "stride": 2, "padding": 1, "dilation": 1, "ceil_mode": False}),
    "conv_transpose2d": (lambda: (tensor(rand(1, 2, 5, 5)), tensor(rand(2, 3, 3, 3)), None),
                         {"stride": 2, "padding": 1, "output_padding": 1, "dilation": 1, "groups": 1}),
    "max_pool2d": (lambda: (tensor(rand(1, 2, 5, 5)),),
                   {"kernel_size": 3, "stride": 2, "padding": 1, "dilation": 1, "ceil_mode": True}),
    "avg_pool2d": (lambda: (tensor(rand(1, 2, 5, 5)),),
                   {"kernel_size": 2, "stride": None, "padding": 0, "ceil_mode": False, "count_include_pad": True}),
    "adaptive_avg_pool2d": (lambda: (tensor(rand(1, 2, 5, 5)),), {"output_size": (2, 3)}),
    "adaptive_max_pool2d": (lambda: (tensor(rand(1, 2, 5, 5)),), {"output_size": 2}),
    "interpolate": (lambda: (tensor(rand(1, 2, 5, 5)),),
                    {"size": None, "scale_factor": 2.0, "mode": "bilinear", "align_corners": False}),
    "pad": (lambda: (tensor(rand(1, 2, 5, 5)),), {"pad_width": ((0, 0), (0, 0), (1, 2), (2, 1)),
                                                  "mode": "reflect", "value": 0.0}),
    "conv3d": (lambda: (tensor(rand(1, 8, 3, 4, 4)), tensor(rand(2, 8, 2, 3, 3)), tensor(rand(2))),
               {"stride": 1, "padding": 1, "dilation": 1, "groups": 1}),
    "conv_transpose3d": (lambda: (tensor(rand(1, 2, 2, 3, 3)), tensor(rand(2, 3, 2, 2, 2)), None),
                         {"stride": 2, "padding": 0, "output_padding": 1, "dilation": 1, "groups": 1}),
    "lstm_cell": (lambda: (tensor(rand(2, 8)), tensor(rand(2, 2)), tensor(rand(2, 2)), tensor(rand(8, 2)),
                           tensor(rand(8))), {}),
    "rnn_cell": (lambda: (tensor(rand(2, 3)), tensor(rand(2, 3)), tensor(rand(3, 3)), None),
                 {"nonlinearity": "relu"}),
}


def _arrays(v):
    """an op's result as a list of arrays (lstm_cell gives two tensors)"""
    return [t.numpy() for t in v] if isinstance(v, tuple) else [v.numpy()]


@pytest.mark.parametrize("name", sorted(OPS))
def test_tracing_reports_the_op_and_apply_runs_it(name):
    make, params = OPS[name]
    inputs = make()
    direct = getattr(nn, name)(*inputs, **params)
    # apply() runs the registered implementation with the same params
    via_apply = dispatch.apply(dispatch.OpDef(name, params), *inputs)
    for a, b in zip(_arrays(via_apply), _arrays(direct), strict=True):
        np.testing.assert_array_equal(a, b)
    seen = []

    class Hook(trace_hooks.TraceHook):
        def on_apply(self, op, *args):
            seen.append((op, args))
            return dispatch.apply(op, *args)

    with trace_hooks.installed(Hook()):
        traced = getattr(nn, name)(*inputs, **params)
    assert len(seen) == 1
    op, args = seen[0]
    assert op.name == name and op.params == params
    assert all(a is b for a, b in zip(args, inputs))
    for a, b in zip(_arrays(traced), _arrays(direct), strict=True):
        np.testing.assert_array_equal(a, b)


def test_public_surface():
    assert sorted(nn.__all__) == sorted(OPS)
    for name in nn.__all__:
        assert getattr(nn, name).__doc__


# ------------------------------------------------------------------ PyTorch, when present

@pytest.fixture(scope="module")
def torch():
    return pytest.importorskip("torch", exc_type=ImportError)


@pytest.mark.parametrize("case", CONV_CASES + [(2, 6, 8, 8, 12, 3, 3, 2, 1, 1, 6)], ids=str)
def test_conv2d_against_torch(torch, case):
    n, c, h, w, o, kh, kw, s, p, d, g = case
    x, wt, b = rand(n, c, h, w), rand(o, c // g, kh, kw), rand(o)
    ref = torch.nn.functional.conv2d(torch.from_numpy(x), torch.from_numpy(wt), torch.from_numpy(b), s, p, d, g)
    close(nn.conv2d(tensor(x), tensor(wt), tensor(b), s, p, d, g).numpy(), ref.double().numpy(), "float32")


@pytest.mark.parametrize("case", TRANSPOSE_CASES, ids=str)
def test_conv_transpose2d_against_torch(torch, case):
    n, c, h, w, og, k, s, p, op, d, g = case
    x, wt, b = rand(n, c, h, w), rand(c, og, k, k), rand(og * g)
    ref = torch.nn.functional.conv_transpose2d(torch.from_numpy(x), torch.from_numpy(wt), torch.from_numpy(b),
                                               s, p, op, g, d)
    close(nn.conv_transpose2d(tensor(x), tensor(wt), tensor(b), s, p, op, d, g).numpy(), ref.double().numpy(),
          "float32")


@pytest.mark.parametrize("hw", [(7, 9), (8, 8), (11, 6)])
def test_pools_against_torch(torch, hw):
    x = rand(2, 3, *hw)
    tx = torch.from_numpy(x)
    F = torch.nn.functional
    for k, s, p, d, cm in MAX_POOL_CASES:
        np.testing.assert_array_equal(nn.max_pool2d(tensor(x), k, s, p, d, cm).numpy(),
                                      F.max_pool2d(tx, k, s, p, d, cm).numpy())
    for k, s, p, cm, cip in AVG_POOL_CASES:
        close(nn.avg_pool2d(tensor(x), k, s, p, cm, cip).numpy(),
              F.avg_pool2d(tx, k, s, p, cm, cip).double().numpy(), "float32")
    for out in ((1, 1), (3, 4), (5, 5), (13, 2)):
        close(nn.adaptive_avg_pool2d(tensor(x), out).numpy(), F.adaptive_avg_pool2d(tx, out).double().numpy(),
              "float32")
        np.testing.assert_array_equal(nn.adaptive_max_pool2d(tensor(x), out).numpy(),
                                      F.adaptive_max_pool2d(tx, out).numpy())


@pytest.mark.parametrize("mode, ac", [("nearest", None), ("bilinear", False), ("bilinear", True)])
def test_interpolate_against_torch(torch, mode, ac):
    x = rand(2, 3, 7, 9)
    tx = torch.from_numpy(x)
    for kw in ({"size": (14, 18)}, {"size": (3, 4)}, {"size": (10, 5)}, {"size": (13, 31)},
               {"scale_factor": 2.0}, {"scale_factor": 0.5}, {"scale_factor": (1.7, 2.3)}, {"scale_factor": 3}):
        ref = torch.nn.functional.interpolate(tx, mode=mode, align_corners=ac, **kw).numpy()
        y = nn.interpolate(tensor(x), mode=mode, align_corners=ac, **kw).numpy()
        if mode == "nearest":
            np.testing.assert_array_equal(y, ref)
        else:
            np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mode", ["constant", "reflect", "replicate", "circular"])
def test_pad_against_torch(torch, mode):
    x = rand(2, 3, 5, 6)
    ref = torch.nn.functional.pad(torch.from_numpy(x), (2, 1, 3, 4), mode=mode,
                                  **({"value": 1.5} if mode == "constant" else {})).numpy()
    y = nn.pad(tensor(x), ((0, 0), (0, 0), (3, 4), (2, 1)), mode, value=1.5).numpy()
    np.testing.assert_array_equal(y, ref)


# ------------------------------------- cached packed weights (Winograd, DIRECT)

def _wino_case(dtype="float32"):
    x, wt, b = rand(3, 16, 14, 14, dtype=dtype), rand(24, 16, 3, 3, dtype=dtype), rand(24, dtype=dtype)
    assert nn.conv2d_algorithm(x.shape, wt.shape, 1, 1) == "winograd"
    assert nn.conv2d_algorithm(x.shape, wt.shape, 1, 1, cached=True) == "winograd"     # 147 tiles
    return x, wt, b


def _wino(x, w, b, algo="auto"):
    return nn._conv2d(tensor(x), w, tensor(b), 1, 1, 1, 1, algo).numpy()


PACKING = pytest.mark.parametrize("algo", ["winograd", "direct", "blocked"])


@pytest.mark.parametrize("dtype", FLOATS)
def test_winograd_weights_are_transformed_once(dtype):
    x, wt, b = _wino_case(dtype)
    nn.clear_weight_cache()
    w = tensor(wt)
    first = _wino(x, w, b)
    assert nn.weight_cache_info()[0] == 1
    again = _wino(x, w, b)                     # served from the cache: the same values
    assert nn.weight_cache_info()[0] == 1
    np.testing.assert_array_equal(again, first)
    close(first, ref_conv2d(x, wt, b, 1, 1), dtype)
    # the workspace path (no cache) computes the same
    np.testing.assert_array_equal(nn._conv2d(tensor(x), w, tensor(b), 1, 1, 1, 1, "winograd").numpy(), first)


@PACKING
@pytest.mark.parametrize("write", ["setitem", "copy_", "iadd", "slice_of_view"])
def test_weight_cache_sees_in_place_writes(write, algo):
    """A weight written in place after its packed copy was cached is
    packed afresh: the result is the new weight's, never the old."""
    x, wt, b = _wino_case()
    nn.clear_weight_cache()
    w = tensor(wt)
    _wino(x, w, b, algo)
    new = wt.copy()
    if write == "setitem":
        w[3] = tensor(wt[3] * 2)
        new[3] *= 2
    elif write == "copy_":
        dispatch.copy_(w, tensor(wt + 1))
        new += 1
    elif write == "iadd":
        w += 0.5
        new += 0.5
    else:                                      # a write through another view of the storage
        w.reshape(-1)[:10] = 0.0
        new.reshape(-1)[:10] = 0.0
    close(_wino(x, w, b, algo), ref_conv2d(x, new, b, 1, 1), "float32")
    assert nn.weight_cache_info()[0] == 1      # the stale entry was replaced, not kept beside


@PACKING
def test_weight_cache_frees_a_dead_weights_pack(algo):
    """A weight's packed copy goes when the last tensor holding the weight's
    storage is freed (it stayed until 256 MiB of newer packs pushed it out);
    a view of the weight still alive keeps it."""
    x, wt, b = _wino_case()
    nn.clear_weight_cache()
    w = tensor(wt)
    close(_wino(x, w, b, algo), ref_conv2d(x, wt, b, 1, 1), "float32")
    entries, nbytes = nn.weight_cache_info()
    assert entries == 1 and nbytes > 0
    other = tensor(wt * 2)
    close(_wino(x, other, b, algo), ref_conv2d(x, wt * 2, b, 1, 1), "float32")
    assert nn.weight_cache_info() == (2, 2 * nbytes)
    view = w.reshape(-1)          # another holder of w's storage
    del w
    assert nn.weight_cache_info() == (2, 2 * nbytes)
    del view
    assert nn.weight_cache_info() == (1, nbytes)     # other's pack is still served
    close(_wino(x, other, b, algo), ref_conv2d(x, wt * 2, b, 1, 1), "float32")
    assert nn.weight_cache_info() == (1, nbytes)
    del other
    assert nn.weight_cache_info() == (0, 0)


@PACKING
def test_weight_cache_keys_views_and_storages_apart(algo):
    x, wt, b = _wino_case()
    nn.clear_weight_cache()
    both = tensor(np.concatenate([wt, -wt]))   # two weights, views of one storage
    close(_wino(x, both[:24], b, algo), ref_conv2d(x, wt, b, 1, 1), "float32")
    close(_wino(x, both[24:], b, algo), ref_conv2d(x, -wt, b, 1, 1), "float32")
    # a new weight whose storage reuses a freed one's memory is not served the old packing
    for k in range(3):
        close(_wino(x, tensor(wt * (k + 2)), b, algo), ref_conv2d(x, wt * (k + 2), b, 1, 1), "float32")


@PACKING
def test_weight_cache_skips_memory_others_may_write(algo):
    """Memory exported writable through DLPack (NumPy may write it unseen)
    is packed on every call."""
    x, wt, b = _wino_case()
    nn.clear_weight_cache()
    w = tensor(wt)
    view = np.from_dlpack(w)
    _wino(x, w, b, algo)
    assert nn.weight_cache_info()[0] == 0
    view[:] = -wt                             # a write mgtrace does not see
    close(_wino(x, w, b, algo), ref_conv2d(x, -wt, b, 1, 1), "float32")


@PACKING
def test_weight_cache_skips_read_only_imports(algo):
    """A tensor imported through DLPack from a read-only NumPy view of a
    writable array is not cached: its owner writes it unseen."""
    x, wt, b = _wino_case()
    nn.clear_weight_cache()
    base = wt.copy()
    ro = base.view()
    ro.flags.writeable = False
    w = from_dlpack(ro)
    assert w.readonly
    _wino(x, w, b, algo)
    assert nn.weight_cache_info()[0] == 0
    base *= -1                                 # a legal write through the writable base
    close(_wino(x, w, b, algo), ref_conv2d(x, -wt, b, 1, 1), "float32")


@pytest.mark.parametrize("algo", ["blocked", "direct", "auto"])
def test_weight_cache_keys_groups_apart(algo):
    """One weight [O, cg, KH, KW] used with groups 1 and 2 (on inputs of
    cg and 2 cg channels) is packed per groups: each group's last block is
    padded apart, so a packing for one groups count does not serve the
    other (it gave wrong values, and read past the packed buffer for groups
    256)."""
    rng = np.random.default_rng(5)
    wt, b = rng.standard_normal((40, 8, 3, 3)).astype(np.float32), rand(40)
    nn.clear_weight_cache()
    w = tensor(wt)
    for groups in (1, 2, 1, 4):
        x = rand(1, 8 * groups, 9, 9)
        y = nn._conv2d(tensor(x), w, tensor(b), 1, 1, 1, groups, algo).numpy()
        close(y, ref_conv2d(x, wt, b, 1, 1, 1, groups), "float32")
    nn.clear_weight_cache()


@pytest.mark.parametrize("algo", ["blocked", "direct", "winograd"])
def test_weight_cache_after_a_write_during_packing(algo):
    """A weight written from another thread while conv2d packs it (without
    the GIL) is packed afresh on the next call: the entry keeps the version
    from before the packing, never the write's. (The write lands during the
    packing in most of the rounds; before the fix every such round left the
    old weights' result for good.)"""
    import threading
    rng = np.random.default_rng(0)
    x = tensor(rng.standard_normal((1, 512, 7, 7)).astype(np.float32))
    ones = np.ones((512, 512, 3, 3), np.float32)
    want = nn._conv2d(x, tensor(ones), None, 1, 1, 1, 1, "im2col").numpy()
    for _ in range(3):
        nn.clear_weight_cache()
        w = tensor(np.zeros_like(ones))
        go = threading.Event()

        def conv():
            go.wait()
            nn._conv2d(x, w, None, 1, 1, 1, 1, algo)

        def write():
            go.wait()
            w[...] = 1.0
        threads = [threading.Thread(target=conv), threading.Thread(target=write)]
        for t in threads:
            t.start()
        go.set()
        for t in threads:
            t.join()
        close(nn._conv2d(x, w, None, 1, 1, 1, 1, algo).numpy(), want, "float32")
    nn.clear_weight_cache()


@pytest.mark.parametrize("dtype", FLOATS)
def test_direct_cache_keys_kernel_layouts_apart(dtype):
    """DIRECT packs a weight for its AVX-512 kernel (blocks of 8 output
    channels) or its AVX2/baseline one (blocks of 6): one weight run through
    both keeps a packing for each (one where the CPU lacks AVX-512), and
    each gives the reference's values."""
    x, wt, b = _wino_case(dtype)
    nn.clear_weight_cache()
    w, ref = tensor(wt), ref_conv2d(x, wt, b, 1, 1)
    for narrow in (False, True, False):
        nn._direct_force_narrow(narrow)
        try:
            close(_wino(x, w, b, "direct"), ref, dtype)
        finally:
            nn._direct_force_narrow(False)
    assert nn.weight_cache_info()[0] in (1, 2)
    nn.clear_weight_cache()


def test_winograd_cache_is_bounded(monkeypatch):
    x, wt, b = _wino_case()
    nn.clear_weight_cache()
    one = 16 * (24 * 16 + 16) * 4
    monkeypatch.setattr(nn, "WEIGHT_CACHE_BYTES", 2 * one + 100)
    ws = [tensor(wt + k) for k in range(4)]
    for w in ws:
        _wino(x, w, b)
    assert nn.weight_cache_info()[0] == 2 and nn.weight_cache_info()[1] <= 2 * one + 100
    close(_wino(x, ws[0], b), ref_conv2d(x, wt, b, 1, 1), "float32")   # evicted: rebuilt
    nn.clear_weight_cache()
    assert nn.weight_cache_info() == (0, 0)


def test_cached_weights_change_the_algorithm(kernels):
    """512 channels on 7x7 planes: IM2COL at batch 2 and F(2x2) Winograd at
    batch 8 when the weights are packed every call; for a weight whose
    packing is cached BLOCKED (AVX-512) or DIRECT at batch 2 and BLOCKED or
    F(4x4) at batch 8. All give the reference's values, through the
    packed-weight cache."""
    few, many = ("blocked", "blocked") if kernels else ("direct", "winograd4")
    for n, uncached, cached in ((2, "im2col", few), (8, "winograd", many)):
        # (data of its own: the module's RNG stream depends on which tests ran before)
        rng = np.random.default_rng(n)
        x, wt, b = (rng.standard_normal(s).astype("float32") for s in ((n, 512, 7, 7), (512, 512, 3, 3), 512))
        wt *= 0.05
        assert nn.conv2d_algorithm(x.shape, wt.shape, 1, 1) == uncached
        assert nn.conv2d_algorithm(x.shape, wt.shape, 1, 1, cached=True) == cached
        nn.clear_weight_cache()
        weight = tensor(wt)     # alive: the cache drops a pack when its weight's memory goes
        got = nn._conv2d(tensor(x), weight, tensor(b), 1, 1, 1, 1, "auto").numpy()
        assert nn.weight_cache_info()[0] == 1
        del weight
        ref = ref_conv2d(x, wt, b, 1, 1)
        # F(4x4) Winograd's transforms scale float32 rounding up: 4608-term
        # sums came within 1.2e-5 of the output's scale, not 1e-5
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=3e-5 * np.abs(ref).max())
    nn.clear_weight_cache()


def test_winograd_cache_follows_load_state_dict():
    """A module's weights replaced by load_state_dict after a forward (the
    cache holds their transform) give the new weights' result."""
    import mgtrace.module as M
    x, wt, b = _wino_case()
    conv = M.Conv2d(16, 24, 3, padding=1).eval()
    conv.load_state_dict({"weight": wt, "bias": b})
    close(conv(tensor(x)).numpy(), ref_conv2d(x, wt, b, 1, 1), "float32")
    conv.load_state_dict({"weight": -2 * wt, "bias": b})
    close(conv(tensor(x)).numpy(), ref_conv2d(x, -2 * wt, b, 1, 1), "float32")


@pytest.mark.parametrize("dtype", FLOATS)
def test_winograd_variants_cache_their_own_transforms(dtype):
    """F(2x2) and F(4x4) transform one weight into different U (16 and 36
    points): each is cached under its own key and serves its own variant."""
    x, wt, b = _wino_case(dtype)
    nn.clear_weight_cache()
    w = tensor(wt)
    ref = ref_conv2d(x, wt, b, 1, 1)
    for algo in ("winograd4", "winograd", "winograd4"):
        close(nn._conv2d(tensor(x), w, tensor(b), 1, 1, 1, 1, algo).numpy(), ref, dtype)
    assert nn.weight_cache_info()[0] == 2
    nn.clear_weight_cache()


def test_winograd4_rounding_stays_small_with_many_channels():
    """F(4x4)'s transforms scale by up to 8 and 1/24; with 512 input
    channels of unit-normal values its float32 error stays within 1e-5 of
    the output's largest magnitude (measured about 4e-6)."""
    rng = np.random.default_rng(7)
    x = rng.standard_normal((1, 512, 8, 8)).astype(np.float32)
    wt = rng.standard_normal((32, 512, 3, 3)).astype(np.float32)
    ref = ref_conv2d(x, wt, None, 1, 1)
    y = nn._conv2d(tensor(x), tensor(wt), None, 1, 1, 1, 1, "winograd4").numpy()
    assert np.abs(y - ref).max() <= 1e-5 * np.abs(ref).max()


@pytest.mark.parametrize("narrow", [False, True], ids=["cpu_kernel", "narrow_kernel"])
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("case", [
    # (N, C, H, W, O, KH, KW, stride, padding, dilation, groups)
    (2, 3, 41, 37, 40, 7, 7, 2, 3, 1, 1),        # a stem: 19-pixel rows in 2 or 4 segments; 40 = 32 + 8
    (1, 24, 7, 7, 64, 3, 3, 1, 1, 1, 1),         # ResNet's 7x7: one segment of 7
    (2, 8, 30, 29, 17, 3, 3, 1, 0, 1, 1),        # 27 pixels: 9 + 9 + 9 (wide), 6 + 6 + 5 + 5 + 5
    (1, 16, 13, 14, 16, 3, 3, 2, 1, 1, 1),       # stride 2, exactly one block (narrow float32: one)
    (2, 8, 15, 17, 9, 3, 5, (3, 1), (1, 2), (1, 2), 1),   # stride 3 rows, anisotropic dilation
    (1, 6, 11, 13, 8, 3, 3, 3, 0, 1, 1),         # column stride 3 (no compile-time kernel)
    (1, 12, 9, 9, 6, 3, 3, 1, 0, 1, 3),          # groups: each group's blocks apart
    (1, 8, 1, 1, 24, 3, 3, 1, 1, 1, 1),          # a 1x1 image: one pixel
], ids=str)
@pytest.mark.parametrize("act, residual", [("none", False), ("relu", True)], ids=str)
def test_blocked_conv_geometries(case, dtype, narrow, act, residual):
    """BLOCKED (output-channel vectors times pixels of a row in registers)
    on partial blocks, rows split into segments of two sizes, strides 1, 2
    (compile-time) and 3 (run-time), dilation, groups and one-pixel planes,
    with the fused residual and activation, with the AVX-512 kernel (where
    the CPU has it) and the AVX2/baseline one, on 1-3 threads."""
    n, c, h, w, o, kh, kw, s, p, d, g = case
    x, wt, b = rand(n, c, h, w, dtype=dtype), rand(o, c // g, kh, kw, dtype=dtype), rand(o, dtype=dtype)
    plain = ref_conv2d(x, wt, b, s, p, d, g)
    r = rand(*plain.shape, dtype=dtype) if residual else None
    ref = NP_ACTS[act](plain + (r if residual else 0))
    args = (tensor(x), tensor(wt), tensor(b), s, p, d, g, "blocked", act, tensor(r) if residual else None)
    nn._direct_force_narrow(narrow)
    try:
        ys = _on_threads(lambda: nn._conv2d(*args))
    finally:
        nn._direct_force_narrow(False)
    for y in ys:
        close(y.numpy(), ref, dtype)


@pytest.mark.parametrize("narrow", [False, True], ids=["cpu_kernel", "narrow_kernel"])
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("case", [
    # (N, C, H, W, O, KH, KW, stride, padding, dilation, groups)
    (2, 3, 41, 37, 20, 7, 7, 2, 3, 1, 1),        # a stem: 20 = 2 blocks of 8 + 4 (and 3 x 6 + 2)
    (1, 160, 58, 60, 13, 3, 3, 2, 1, 1, 1),      # 80 KiB of input rows an output row: 5 ranges of wide outputs
    (2, 8, 15, 17, 9, 3, 5, (2, 1), (1, 2), (1, 2), 1),
    (1, 12, 9, 9, 6, 3, 3, 1, 0, 1, 3),          # groups: each group's channels packed apart
], ids=str)
def test_direct_conv_geometries(case, dtype, narrow):
    """DIRECT (no GEMM: output-channel blocks times vectors of wide outputs
    in registers) on partial blocks, several output ranges, anisotropic
    stride and dilation and groups, with the AVX-512 kernel (where the CPU
    has it) and the AVX2/baseline one, on 1-3 threads."""
    n, c, h, w, o, kh, kw, s, p, d, g = case
    x, wt, b = rand(n, c, h, w, dtype=dtype), rand(o, c // g, kh, kw, dtype=dtype), rand(o, dtype=dtype)
    ref = ref_conv2d(x, wt, b, s, p, d, g)
    nn._direct_force_narrow(narrow)
    try:
        ys = _on_threads(lambda: nn._conv2d(tensor(x), tensor(wt), tensor(b), s, p, d, g, "direct"))
    finally:
        nn._direct_force_narrow(False)
    for y in ys:
        close(y.numpy(), ref, dtype)


# ------------------------------------------------------------------ NCHW16c

REF_ACTS = {"none": lambda y: y, "relu": lambda y: np.maximum(y, 0),
            "relu6": lambda y: np.clip(y, 0, 6), "silu": lambda y: y / (1 + np.exp(-y)),
            "hardswish": lambda y: y * np.clip(y + 3, 0, 6) / 6, "sigmoid": lambda y: 1 / (1 + np.exp(-y))}


def blocked(a):
    """NumPy NCHW [N, C, H, W] -> NCHW16c [N, ceil(C/16), H, W, 16], zero-padded."""
    n, c, h, w = a.shape
    b = -(-c // 16)
    padded = np.zeros((n, b * 16, h, w), a.dtype)
    padded[:, :c] = a
    return padded.reshape(n, b, 16, h, w).transpose(0, 1, 3, 4, 2)


@pytest.mark.parametrize("c", [1, 3, 16, 17, 40])
@pytest.mark.parametrize("hw", [(5, 3), (8, 8), (7, 9), (1, 17)])   # 16-pixel transposes and the rest
def test_nchwc_conversions_against_numpy(c, hw):
    x = rand(2, c, *hw)
    got = nn.to_nchwc(tensor(x)).numpy()
    np.testing.assert_array_equal(got, blocked(x))
    np.testing.assert_array_equal(nn.from_nchwc(tensor(got), c).numpy(), x)


NCHWC_DENSE = [  # (C, O, H, W, kernel, stride, padding, dilation)
    (3, 32, 17, 19, 3, 2, 1, 1), (16, 96, 9, 9, 1, 1, 0, 1), (24, 40, 7, 7, 1, 1, 0, 1),
    (40, 17, 11, 8, 3, 1, 1, 1), (33, 48, 7, 7, 3, 1, 1, 1), (64, 16, 10, 10, 3, 2, 1, 1),
    (5, 7, 14, 13, 7, 2, 3, 1), (20, 24, 9, 10, 3, 1, 2, 2), (17, 33, 8, 8, 1, 2, 0, 1),
    (8, 20, 9, 9, 3, 3, 0, 1), (12, 16, 6, 7, 2, 1, 0, 1), (16, 32, 1, 1, 3, 1, 1, 1),
    (16, 3, 4, 5, 1, 1, 1, 1), (20, 18, 6, 3, 1, 1, 2, 1),      # 1x1 with padding: not one flat row
    (16, 32, 14, 14, 3, 1, 1, 1), (18, 24, 13, 13, 3, 1, 1, 1),  # one tile of 14 (13) pixels a row
    (20, 24, 8, 7, 3, 1, 2, 2),                                  # two rows a call, dilated
]


@pytest.mark.parametrize("geom", NCHWC_DENSE)
@pytest.mark.parametrize("layout", ["nchwc", "nchw"])
def test_conv2d_nchwc_dense_against_numpy(geom, layout):
    c, o, h, w, k, s, p, d = geom
    x, wt, b = rand(2, c, h, w), rand(o, c, k, k), rand(o)
    ref = ref_conv2d(x, wt, b, s, p, d)
    r = rand(*ref.shape)
    for act, res in (("relu", None), ("none", r), ("relu6", r), ("silu", None)):
        want = REF_ACTS[act](ref + (0 if res is None else r))
        xin = tensor(blocked(x) if layout == "nchwc" else x)
        y = nn.conv2d_nchwc(xin, tensor(wt), tensor(b), None if res is None else tensor(blocked(res)),
                            s, p, d, 1, act)
        assert y.shape == blocked(want).shape
        np.testing.assert_allclose(nn.from_nchwc(y, o).numpy(), want, rtol=1e-5,
                                   atol=1e-5 * np.abs(ref).max())
        # the channels past O hold act(0) = 0
        assert not y.numpy()[:, -1, :, :, (o - 1) % 16 + 1:].any()


NCHWC_PARTIAL = [  # (C, O, H, W, kernel, padding): channels that fill part of their last block
    (24, 24, 9, 11, 1, 0),      # MobileNetV2's projection to 24: a block and a half in and out
    (40, 17, 7, 7, 1, 0),       # one lane of the second output block
    (8, 25, 6, 5, 1, 0),        # 9 lanes: past half a block, the two-block kernel
    (24, 40, 5, 6, 1, 0),       # the half block alone in its pair: the one-block kernel
    (17, 24, 15, 15, 3, 1),     # padded 3x3: interior tiles and border columns
]


@pytest.mark.parametrize("geom", NCHWC_PARTIAL)
def test_conv2d_nchwc_partial_blocks_against_numpy_and_the_zero_padded_channels(geom):
    """The dense kernels sum the last input block's channels only (not the
    zero lanes past C) and compute an output block of 8 or fewer channels
    as half a block: against NumPy, and bitwise equal on every thread count
    to the same conv with C and O padded to whole blocks by zero channels,
    which the full-block kernels compute."""
    c, o, h, w, k, p = geom
    cp, op = -(-c // 16) * 16, -(-o // 16) * 16
    x, wt, b = rand(2, c, h, w), rand(o, c, k, k), rand(o)
    ref = ref_conv2d(x, wt, b, 1, p)
    r = rand(*ref.shape)
    xp, wp, bp, rp = (np.zeros((2, cp, h, w), np.float32), np.zeros((op, cp, k, k), np.float32),
                      np.zeros(op, np.float32), np.zeros((2, op) + ref.shape[2:], np.float32))
    xp[:, :c], wp[:o, :c], bp[:o], rp[:, :o] = x, wt, b, r
    for act, res in (("relu6", r), ("none", None)):
        want = REF_ACTS[act](ref + (0 if res is None else r))
        ys = _on_threads(lambda: nn.conv2d_nchwc(tensor(blocked(x)), tensor(wt), tensor(b),
                                                 None if res is None else tensor(blocked(res)), 1, p, 1, 1, act))
        whole = nn.conv2d_nchwc(tensor(blocked(xp)), tensor(wp), tensor(bp),
                                None if res is None else tensor(blocked(rp)), 1, p, 1, 1, act).numpy()
        for y in ys:
            np.testing.assert_allclose(nn.from_nchwc(y, o).numpy(), want, rtol=1e-5,
                                       atol=1e-5 * np.abs(ref).max())
            np.testing.assert_array_equal(y.numpy(), whole)
            assert not y.numpy()[:, -1, :, :, (o - 1) % 16 + 1:].any()


NCHWC_IN_PLACE = [  # (C, O, H, W, kernel, stride, (ph, pw)): padded, output rows wider than 7
    (16, 40, 40, 37, 3, 2, (1, 1)),     # ResNet's stride-2 3x3: one border column, two bands of rows
    (3, 20, 33, 40, 7, 2, (3, 3)),      # its stem on NCHW: two border columns left, one right
    (20, 33, 30, 20, 3, 1, (2, 1)),     # two border rows top and bottom, O % 16 a partial block
    (17, 32, 19, 31, 5, 3, (4, 2)),     # stride 3, a row of taps wholly in the padding
    (16, 16, 3, 12, 3, 1, (1, 1)),      # one interior row
    (16, 16, 12, 9, 3, 1, (0, 5)),      # padding wider than the kernel: no interior column
]


@pytest.mark.parametrize("geom", NCHWC_IN_PLACE)
def test_conv2d_nchwc_padded_in_place_equals_the_conv_of_the_padded_input(geom):
    """A dense conv with padding and rows wider than 7 reads its input in
    place, the border columns in tiles down the column (nchwc.c's
    nc_apart): bit for bit the conv with no padding of the input padded by
    NumPy (the taps left out add zeros), on 1, 2 and 3 threads, and the
    NumPy reference's values, with a residual and activations in registers
    (ReLU, ReLU6) and after the store (sigmoid)."""
    c, o, h, w, k, s, p = geom
    # (a generator of its own: the module's RNG stream, which the tests
    # after this one draw from, stays as it was)
    g = np.random.default_rng(34)
    x, wt, b = (g.standard_normal(shape).astype(np.float32) for shape in ((2, c, h, w), (o, c, k, k), (o,)))
    xp = np.pad(x, ((0, 0), (0, 0), (p[0], p[0]), (p[1], p[1])))
    layout = (lambda a: a) if c == 3 else blocked
    ref = ref_conv2d(x, wt, b, s, p, 1)
    r = g.standard_normal(ref.shape).astype(np.float32)
    for act, res in (("relu", None), ("relu6", r), ("sigmoid", r)):
        rt = None if res is None else tensor(blocked(res))
        want = REF_ACTS[act](ref + (0 if res is None else r))
        ys = _on_threads(lambda: nn.conv2d_nchwc(tensor(layout(x)), tensor(wt), tensor(b), rt, s, p, 1, 1,
                                                 act).numpy())
        y0 = nn.conv2d_nchwc(tensor(layout(xp)), tensor(wt), tensor(b), rt, s, 0, 1, 1, act).numpy()
        for y in ys:
            np.testing.assert_array_equal(y, y0)
        np.testing.assert_allclose(nn.from_nchwc(tensor(ys[0]), o).numpy(), want, rtol=1e-5,
                                   atol=1e-5 * np.abs(ref).max())
        tail = ys[0][:, -1, :, :, (o - 1) % 16 + 1:]
        np.testing.assert_array_equal(tail, REF_ACTS[act](np.zeros_like(tail)))


NCHWC_BANDS = [  # (N, C, O, H, W, kernel, stride, padding): the input outweighs the weights, units outer
    (1, 16, 64, 40, 40, 3, 2, 1),       # ResNet's layer2.0.conv1 in small: border columns of their own
    (3, 17, 40, 23, 29, 3, 2, 0),       # three images, no padding, a partial block in and out
    (2, 16, 48, 5, 120, 3, 1, 1),       # 5 rows in 2 chunks: bands of 3 and 4 rows on 3 threads
]


@pytest.mark.parametrize("geom", NCHWC_BANDS)
def test_conv2d_nchwc_row_bands_against_numpy_and_the_unbanded_order(geom):
    """Where each thread would read the whole input once per pair of
    output blocks, a direct conv on several threads may give each thread a
    band of the rows, its units in turn over it (nchwc.c's bands, on by
    default on Intel; NCHW16c input only): bit for bit the order without
    bands on 1, 2 and 3 threads, with a residual and ReLU6, and NumPy's
    values."""
    n, c, o, h, w, k, s, p = geom
    g = np.random.default_rng(35)
    x, wt, b = (g.standard_normal(shape).astype(np.float32) for shape in ((n, c, h, w), (o, c, k, k), (o,)))
    ref = ref_conv2d(x, wt, b, s, p)
    r = g.standard_normal(ref.shape).astype(np.float32)
    want = REF_ACTS["relu6"](ref + r)
    xin = tensor(blocked(x))
    before_w, before_b = nn._set_nchwc_winograd(False), nn._set_nchwc_bands(False)
    try:
        def conv():
            return nn.conv2d_nchwc(xin, tensor(wt), tensor(b), tensor(blocked(r)), s, p, 1, 1, "relu6").numpy()
        plain = _on_threads(conv)
        nn._set_nchwc_bands(True)
        banded = _on_threads(conv)
    finally:
        nn._set_nchwc_winograd(before_w)
        nn._set_nchwc_bands(before_b)
    for y in plain[1:] + banded:
        np.testing.assert_array_equal(y, plain[0])
    np.testing.assert_allclose(nn.from_nchwc(tensor(banded[1]), o).numpy(), want, rtol=1e-5,
                               atol=1e-5 * np.abs(ref).max())


def test_set_nchwc_bands_refuses_other_modes():
    with pytest.raises(ValueError, match="None, False or True"):
        nn._set_nchwc_bands(2)


NCHWC_WINOGRAD = [  # (N, C, O, H, W, padding): 3x3, stride 1
    (1, 16, 32, 14, 14, 1), (2, 40, 17, 11, 8, 1), (3, 33, 48, 7, 7, 1), (1, 70, 35, 13, 9, 1),
    (2, 17, 16, 5, 6, 0), (1, 24, 40, 3, 3, 0), (1, 20, 20, 9, 4, 2), (2, 3, 5, 6, 6, 1),
    (1, 48, 64, 1, 12, 1), (1, 32, 16, 500, 30, 1),     # one row; a plane in more than one round
    (3, 512, 24, 20, 20, 1),    # rounds (4 MB of V) that end inside an image
]


@pytest.mark.parametrize("geom", NCHWC_WINOGRAD)
@pytest.mark.parametrize("winograd", [2, 4, False])
def test_conv2d_nchwc_winograd_against_numpy(geom, winograd):
    """F(2x2, 3x3) and F(4x4, 3x3) on NCHW16c (forced, and off for the
    direct kernel on the same shapes): planes that are not a multiple of
    the tile leave partial tiles, O % 16 a partial block, and padding 0
    and 2 move the tiles against the input."""
    n, c, o, h, w, p = geom
    # (values of the case's own: drawn from the module's RNG, they moved
    # with the tests run before, and F(4x4)'s rounding with them)
    rng = np.random.default_rng(list(geom))
    x, wt, b = (rng.standard_normal(s).astype(np.float32) for s in ((n, c, h, w), (o, c, 3, 3), (o,)))
    ref = ref_conv2d(x, wt, b, 1, p, 1)
    r = rng.standard_normal(ref.shape).astype(np.float32)
    before = nn._set_nchwc_winograd(winograd)
    try:
        for act, res in (("relu", None), ("none", r), ("relu6", r), ("sigmoid", None)):
            want = REF_ACTS[act](ref + (0 if res is None else r))
            ys = _on_threads(lambda: nn.conv2d_nchwc(tensor(blocked(x)), tensor(wt), tensor(b),
                                                     None if res is None else tensor(blocked(res)), 1, p, 1, 1,
                                                     act))
            for y in ys:
                # (F(4x4) rounds more: its transforms scale by up to 8 and
                # 1/24; over 9,632 random shapes of 1-1024 channels its
                # largest error was 3.2e-5 of the largest output)
                np.testing.assert_allclose(nn.from_nchwc(y, o).numpy(), want, rtol=1e-5,
                                           atol=(4e-5 if winograd == 4 else 2e-6) * np.abs(ref).max())
                # the channels past O hold act(0)
                tail = y.numpy()[:, -1, :, :, (o - 1) % 16 + 1:]
                np.testing.assert_array_equal(tail, REF_ACTS[act](np.zeros_like(tail)))
    finally:
        nn._set_nchwc_winograd(before)


def test_conv2d_nchwc_algorithm_picks_winograd_where_the_tiles_are_many():
    """Winograd's U is 16/9 (F(2x2)) or 4 (F(4x4)) times the weight's
    bytes: at batch 1 on 7x7 planes (16 tiles) it streams more weight than
    it saves arithmetic; F(4x4) needs 48 of its tiles, and its U within 12
    MiB (the memory a plan holds)."""
    assert nn.conv2d_nchwc_algorithm((1, 256, 14, 14), (256, 256, 3, 3), padding=1) == "winograd"   # 16 4x4 tiles
    assert nn.conv2d_nchwc_algorithm((3, 256, 14, 14), (256, 256, 3, 3), padding=1) == "winograd4"  # 48
    assert nn.conv2d_nchwc_algorithm((1, 64, 56, 56), (64, 64, 3, 3), padding=1) == "winograd4"
    assert nn.conv2d_nchwc_algorithm((1, 128, 28, 28), (128, 128, 3, 3), padding=1) == "winograd4"
    assert nn.conv2d_nchwc_algorithm((8, 0, 28, 28), (128, 0, 3, 3), padding=1) == "direct"
    assert nn.conv2d_nchwc_algorithm((1, 512, 7, 7), (512, 512, 3, 3), padding=1) == "direct"
    assert nn.conv2d_nchwc_algorithm((2, 512, 7, 7), (512, 512, 3, 3), padding=1) == "winograd"  # 8 4x4 tiles
    # 32 4x4 tiles, but U of 36 MiB
    assert nn.conv2d_nchwc_algorithm((8, 512, 7, 7), (512, 512, 3, 3), padding=1) == "winograd"
    assert nn.conv2d_nchwc_algorithm((8, 256, 14, 14), (256, 256, 3, 3), padding=1) == "winograd4"
    assert nn.conv2d_nchwc_algorithm((8, 256, 14, 14), (256, 256, 3, 3), 2, 1) == "direct"
    assert nn.conv2d_nchwc_algorithm((8, 256, 14, 14), (256, 256, 3, 3), 1, 2, 2) == "direct"
    assert nn.conv2d_nchwc_algorithm((8, 8, 14, 14), (8, 8, 3, 3), padding=1) == "direct"
    assert nn.conv2d_nchwc_algorithm((8, 16, 14, 14), (16, 1, 3, 3), padding=1, groups=16) == "depthwise"


@pytest.mark.parametrize("winograd", [2, 4])
def test_conv2d_nchwc_winograd_batch_is_each_image_bitwise(winograd):
    """A round of tiles runs on from one image into the next (4 MB of V:
    12 tile rows a round here of 10 an image for F(2x2), 11 of 5 for
    F(4x4)); each tile's arithmetic is its own, so the batch's outputs are
    each image's alone, bit for bit, the residual and bias read from the
    right image."""
    x, wt, b, r = rand(3, 512, 20, 20), rand(24, 512, 3, 3), rand(24), rand(3, 24, 20, 20)
    before = nn._set_nchwc_winograd(winograd)
    try:
        def conv(i):
            return nn.conv2d_nchwc(tensor(blocked(x[i])), tensor(wt), tensor(b), tensor(blocked(r[i])), 1, 1, 1, 1,
                                   "relu").numpy()
        for y in _on_threads(lambda: conv(slice(None))):
            for i in range(3):
                np.testing.assert_array_equal(y[i:i + 1], conv(slice(i, i + 1)))
    finally:
        nn._set_nchwc_winograd(before)


@pytest.mark.parametrize("winograd", [2, 4])
def test_conv2d_nchwc_forced_winograd_with_no_input_channels_gives_the_bias(winograd):
    """(Forced F(2x2) or F(4x4) on C = 0 divided by zero in the plan: the
    process died of SIGFPE.)"""
    before = nn._set_nchwc_winograd(winograd)
    try:
        x, w = np.zeros((1, 0, 8, 8, 16), np.float32), np.zeros((4, 0, 3, 3), np.float32)
        y = nn.conv2d_nchwc(tensor(x), tensor(w), tensor(np.arange(4, dtype=np.float32)), None, 1, 1, 1, 1,
                            "sigmoid")
    finally:
        nn._set_nchwc_winograd(before)
    want = 1 / (1 + np.exp(-np.arange(4, dtype=np.float32)))
    np.testing.assert_allclose(nn.from_nchwc(y, 4).numpy(),
                               np.broadcast_to(want[None, :, None, None], (1, 4, 8, 8)), rtol=1e-6)


def test_conv2d_nchwc_winograd_keeps_unused_channels_zero_after_an_infinite_input():
    x = rand(1, 16, 12, 12)
    x[0, 3, 5, 5] = np.inf
    before = nn._set_nchwc_winograd(2)
    try:
        y = nn.conv2d_nchwc(tensor(blocked(x)), tensor(rand(5, 16, 3, 3)), None, None, 1, 1).numpy()
    finally:
        nn._set_nchwc_winograd(before)
    assert not y[..., 5:].any()
    # (the inf stays in its receptive field, as a direct sum puts it: tests/functional/test_conv_nonfinite.py)
    assert not np.isfinite(y[0, 0, 4:7, 4:7, :5]).any() and np.isfinite(y[0, 0, 8:, 8:, :5]).all()


def test_conv2d_nchwc_winograd_gives_an_infinite_weights_direct_sum():
    """An infinite weight runs on the direct kernel (a Winograd U mixes it
    into inf - inf = NaN: 11 +inf and 53 NaN in that channel, once): with
    positive inputs and a +inf centre tap, every output of that channel is
    +inf, as the direct sum's, and the other channels are the reference."""
    rng = np.random.default_rng(3)
    x = np.abs(rng.standard_normal((1, 20, 10, 10), dtype=np.float32)) + 0.1
    w = np.abs(rng.standard_normal((8, 20, 3, 3), dtype=np.float32))
    ref = ref_conv2d(x, w, None, 1, 0, 1)
    w[3, 5, 1, 1] = np.inf
    before = nn._set_nchwc_winograd(2)
    try:
        y = nn.from_nchwc(nn.conv2d_nchwc(tensor(blocked(x)), tensor(w), None, None, 1, 0), 8).numpy()
    finally:
        nn._set_nchwc_winograd(before)
    assert np.isposinf(y[0, 3]).all()
    others = [o for o in range(8) if o != 3]
    np.testing.assert_allclose(y[:, others], ref[:, others], rtol=1e-5, atol=2e-6 * np.abs(ref).max())


@pytest.mark.parametrize("winograd", [2, 4])
def test_conv2d_nchwc_packs_winograd_weights_on_a_thread_with_a_small_stack(winograd):
    """Packing runs on the calling thread: a 32 KiB stack (Python's least)
    must do (the packing once kept 41 KB of arrays on it and crashed)."""
    script = f"""
import threading, numpy as np
from mgtrace._core import nn
from mgtrace._core.tensor import tensor
nn._set_nchwc_winograd({winograd})
x = np.random.default_rng(0).standard_normal((1, 3, 8, 8, 16), dtype=np.float32)
w = np.random.default_rng(1).standard_normal((40, 40, 3, 3), dtype=np.float32)
x[:, 2, :, :, 8:] = 0
out = []
threading.stack_size(32768)
t = threading.Thread(target=lambda: out.append(nn.conv2d_nchwc(tensor(x), tensor(w), None, None, 1, 1).shape))
t.start(); t.join()
print(out[0])
"""
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "(1, 3, 8, 8, 16)"


@pytest.mark.parametrize("geom", [(16, 12, 12, 3, 1, 1, 1), (40, 9, 10, 3, 2, 1, 1), (96, 7, 7, 3, 1, 1, 1),
                                  (24, 13, 11, 5, 2, 2, 1), (16, 8, 8, 3, 1, 2, 2), (7, 3, 2, 3, 3, 1, 1),
                                  (32, 6, 6, 1, 1, 0, 1)])
@pytest.mark.parametrize("act", ["relu6", "none", "hardswish", "sigmoid"])
def test_conv2d_nchwc_depthwise_against_numpy(geom, act):
    c, h, w, k, s, p, d = geom
    x, wt, b = rand(1, c, h, w), rand(c, 1, k, k), rand(c)
    ref = ref_conv2d(x, wt, b, s, p, d, groups=c)
    r = rand(*ref.shape)
    want = REF_ACTS[act](ref + r)
    y = nn.conv2d_nchwc(tensor(blocked(x)), tensor(wt), tensor(b), tensor(blocked(r)), s, p, d, c, act)
    np.testing.assert_allclose(nn.from_nchwc(y, c).numpy(), want, rtol=1e-5, atol=1e-5 * np.abs(ref).max())


def test_conv2d_nchwc_threads_and_weight_cache_agree():
    x, wt = tensor(blocked(rand(2, 32, 20, 20))), tensor(rand(48, 32, 3, 3))
    before = dispatch.get_num_threads()
    try:
        outs = []
        for t in (1, 2):
            dispatch.set_num_threads(t)
            outs.append(nn.conv2d_nchwc(x, wt, None, None, 1, 1).numpy())
    finally:
        dispatch.set_num_threads(before)
    np.testing.assert_array_equal(outs[0], outs[1])
    # the packed weights are cached per weight; a write to the weight is seen
    wt[0] = 0.0
    y = nn.conv2d_nchwc(x, wt, None, None, 1, 1).numpy()
    assert not y[:, 0, :, :, 0].any() and np.array_equal(y[:, 0, :, :, 1:], outs[0][:, 0, :, :, 1:])
    # a non-contiguous weight is one entry too (keyed by the view, not its copy)
    view = tensor(np.ascontiguousarray(rand(48, 32, 3, 3).transpose(1, 0, 2, 3))).transpose((1, 0, 2, 3))
    nn.clear_weight_cache()
    for _ in range(3):
        nn.conv2d_nchwc(x, view, None, None, 1, 1)
    assert nn.weight_cache_info()[0] == 1
    nn.clear_weight_cache()


@pytest.mark.parametrize("n, c, o, hw, k, s", [
    (1, 64, 160, 7, 3, 1), (3, 64, 160, 7, 3, 1),       # units of the 7x7 layers: two rows a task
    (2, 48, 96, 14, 1, 2), (3, 32, 80, 6, 3, 2),        # a 1x1 downsample; 3 units over 2 threads
    (2, 40, 112, 5, 3, 1)])
def test_conv2d_nchwc_weight_prefetch_across_units_threads_and_images(n, c, o, hw, k, s):
    """Layers whose weights outweigh their input run a unit (pair of output
    blocks) at a time, each of its tasks prefetching part of the thread's
    next unit, the first one again for the next image: 1 and 2 threads
    (units split between them mid-way) give the same bits and NumPy's
    values, the residual and activation included."""
    x, wt, b = rand(n, c, hw, hw), rand(o, c, k, k), rand(o)
    ref = ref_conv2d(x, wt, b, s, k // 2, 1)
    r = rand(*ref.shape)
    want = np.maximum(ref + r, 0)
    before = dispatch.get_num_threads()
    try:
        outs = []
        for t in (1, 2):
            dispatch.set_num_threads(t)
            outs.append(nn.conv2d_nchwc(tensor(blocked(x)), tensor(wt), tensor(b), tensor(blocked(r)),
                                        s, k // 2, 1, 1, "relu"))
    finally:
        dispatch.set_num_threads(before)
    np.testing.assert_array_equal(outs[0].numpy(), outs[1].numpy())
    np.testing.assert_allclose(nn.from_nchwc(outs[0], o).numpy(), want, rtol=1e-5, atol=1e-5 * np.abs(ref).max())


@pytest.mark.parametrize("c, h, w, k, s, p, d, ceil", [
    (64, 20, 20, 3, 2, 1, 1, False), (17, 9, 7, 3, 2, 1, 1, True), (20, 8, 8, 2, 2, 0, 1, False),
    (5, 10, 9, 3, 1, 1, 2, False), (33, 5, 6, 5, 1, 2, 1, False),
    (16, 4, 40, 3, 1, 1, 1, False), (3, 5, 37, 3, 2, 1, 2, True)])     # several 8-pixel tiles a row
def test_max_pool2d_nchwc_against_numpy(c, h, w, k, s, p, d, ceil):
    x = rand(2, c, h, w)
    x[0, 1, 2, 2] = np.nan       # a NaN wins its windows
    x[0, 0, 1, w // 2] = np.nan
    x[1, 0] = -np.inf
    want = ref_max_pool2d(x, k, s, p, d, ceil)
    y = nn.max_pool2d_nchwc(tensor(blocked(x)), k, s, p, d, ceil)
    np.testing.assert_array_equal(nn.from_nchwc(y, c).numpy(), want)
    assert not y.numpy()[:, -1, :, :, (c - 1) % 16 + 1:].any()       # zeros pool to zeros


NCHWC_PW_DW = [  # (N, C, E, H, W, kernel, stride, padding)
    (1, 16, 96, 23, 21, 3, 2, 1), (2, 24, 40, 9, 10, 3, 1, 1), (1, 5, 17, 6, 7, 5, 2, 2),
    (1, 33, 48, 7, 7, 3, 1, 1), (1, 16, 32, 1, 1, 3, 1, 1), (1, 8, 20, 4, 13, 1, 1, 0),
    (3, 7, 31, 10, 3, 3, 3, 1), (1, 8, 32, 9, 9, 2, 2, 0), (1, 8, 16, 3, 3, 3, 1, 4),
    (1, 3, 1, 5, 5, 3, 1, 0),                                  # one channel: depthwise is dense
]


@pytest.mark.parametrize("geom", NCHWC_PW_DW)
@pytest.mark.parametrize("acts", [("relu6", "relu6"), ("none", "relu"), ("sigmoid", "silu"),
                                  ("hardswish", "none")])
def test_conv2d_nchwc_pw_dw_against_numpy(geom, acts):
    n, c, e, h, w, k, s, p = geom
    x, w1, b1, w2, b2 = rand(n, c, h, w), rand(e, c, 1, 1), rand(e), rand(e, 1, k, k), rand(e)
    mid = REF_ACTS[acts[0]](ref_conv2d(x, w1, b1))
    ref = ref_conv2d(mid, w2, b2, s, p, 1, groups=e)
    want = REF_ACTS[acts[1]](ref)
    ys = _on_threads(lambda: nn.conv2d_nchwc_pw_dw(tensor(blocked(x)), tensor(w1), tensor(b1), tensor(w2),
                                                   tensor(b2), s, p, *acts))
    for y in ys:
        assert y.shape == blocked(want).shape
        np.testing.assert_allclose(nn.from_nchwc(y, e).numpy(), want, rtol=1e-5,
                                   atol=1e-5 * np.abs(ref).max())
    np.testing.assert_array_equal(ys[0].numpy(), ys[1].numpy())   # rows split over threads the same


def test_conv2d_nchwc_pw_dw_equals_the_two_calls_and_keeps_unused_channels_finite():
    x = rand(1, 16, 12, 12)
    x[0, 3, 5, 5] = np.inf                 # inf * 0 in the unused channels must not turn NaN
    w1, w2 = rand(20, 16, 1, 1), rand(20, 1, 3, 3)
    xb = tensor(blocked(x))
    two = nn.conv2d_nchwc(nn.conv2d_nchwc(xb, tensor(w1), None, None, 1, 0, 1, 1, "relu6"), tensor(w2),
                          None, None, 2, 1, 1, 20, "relu6").numpy()
    one = nn.conv2d_nchwc_pw_dw(xb, tensor(w1), None, tensor(w2), None, 2, 1, "relu6", "relu6").numpy()
    np.testing.assert_array_equal(one, two)
    assert not one[:, -1, :, :, 20 - 16:].any()


@pytest.mark.parametrize("geom", NCHWC_PW_DW)
@pytest.mark.parametrize("acts", [("relu6", "relu6", "none"), ("none", "relu", "sigmoid")])
def test_conv2d_nchwc_pw_dw_pw_against_numpy(geom, acts):
    """The block (expansion, depthwise, projection with a residual) against
    NumPy, and bitwise equal to its two calls on every thread count."""
    n, c, e, h, w, k, s, p = geom
    o = c + 3
    x, w1, b1, w2, b2 = rand(n, c, h, w), rand(e, c, 1, 1), rand(e), rand(e, 1, k, k), rand(e)
    w3, b3 = rand(o, e, 1, 1), rand(o)
    mid = REF_ACTS[acts[1]](ref_conv2d(REF_ACTS[acts[0]](ref_conv2d(x, w1, b1)), w2, b2, s, p, 1, groups=e))
    ref = ref_conv2d(mid, w3, b3)
    r = rand(*ref.shape)
    want = REF_ACTS[acts[2]](ref + r)
    args = [tensor(blocked(x)), tensor(w1), tensor(b1), tensor(w2), tensor(b2), tensor(w3), tensor(b3),
            tensor(blocked(r))]
    ys = _on_threads(lambda: nn.conv2d_nchwc_pw_dw_pw(*args, s, p, *acts))
    two = nn.conv2d_nchwc(nn.conv2d_nchwc_pw_dw(*args[:5], s, p, *acts[:2]), args[5], args[6], args[7], 1, 0,
                          1, 1, acts[2]).numpy()
    for y in ys:
        assert y.shape == blocked(want).shape
        np.testing.assert_allclose(nn.from_nchwc(y, o).numpy(), want, rtol=1e-5,
                                   atol=1e-5 * max(np.abs(ref).max(), np.abs(mid).max()))
        np.testing.assert_array_equal(y.numpy(), two)


def test_conv2d_nchwc_calls_read_a_strided_residual_they_copied():
    """A non-contiguous residual is copied for the kernel; the copy was
    freed before the kernel ran and the output was garbage (found by a
    fuzzing helper)."""
    x, w1, w2, w3 = rand(1, 16, 4, 5), rand(16, 16, 1, 1), rand(16, 1, 3, 3), rand(16, 16, 1, 1)
    r = rand(1, 16, 5, 4)
    strided = tensor(blocked(r)).transpose((0, 1, 3, 2, 4))     # [1, 1, 4, 5, 16], not contiguous
    want_r = tensor(np.ascontiguousarray(blocked(r).transpose(0, 1, 3, 2, 4)))
    xb = tensor(blocked(x))
    for _ in range(3):
        np.testing.assert_array_equal(nn.conv2d_nchwc(xb, tensor(w1), None, strided, 1, 0).numpy(),
                                      nn.conv2d_nchwc(xb, tensor(w1), None, want_r, 1, 0).numpy())
        args = (xb, tensor(w1), None, tensor(w2), None, tensor(w3), None)
        np.testing.assert_array_equal(nn.conv2d_nchwc_pw_dw_pw(*args, strided, 1, 1).numpy(),
                                      nn.conv2d_nchwc_pw_dw_pw(*args, want_r, 1, 1).numpy())


def test_conv2d_nchwc_pw_dw_pw_through_f_broadcasts_a_residual_and_converts_biases():
    """F's wrapper: a residual the kernel does not take (one that only
    broadcasts) is added with +, as F.conv2d_nchwc does; [1, C, 1, 1]
    biases (MegEngine's) are taken."""
    import mgtrace.functional as F
    x, w1, w2, w3 = rand(2, 16, 6, 6), rand(24, 16, 1, 1), rand(24, 1, 3, 3), rand(16, 24, 1, 1)
    b1, b2, b3 = rand(1, 24, 1, 1), rand(24), rand(1, 16, 1, 1)
    r = rand(1, 16, 6, 6)
    mid = np.clip(ref_conv2d(np.maximum(ref_conv2d(x, w1, b1.ravel()), 0), w2, b2, 1, 1, 1, groups=24), 0, 6)
    want = np.maximum(ref_conv2d(mid, w3, b3.ravel()) + r, 0)
    y = F.conv2d_nchwc_pw_dw_pw(tensor(blocked(x)), tensor(w1), tensor(b1), tensor(w2), tensor(b2), tensor(w3),
                                tensor(b3), residual=tensor(blocked(r)), padding=1, act="relu", dw_act="relu6",
                                proj_act="relu")
    np.testing.assert_allclose(F.from_nchwc(y, 16).numpy(), want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    with pytest.raises(ValueError, match="does not broadcast"):
        F.conv2d_nchwc_pw_dw_pw(tensor(blocked(x)), tensor(w1), None, tensor(w2), None, tensor(w3), None,
                                residual=tensor(rand(1, 1, 5, 6, 16)), padding=1)
    with pytest.raises(ValueError, match="proj_weight must be"):
        F.conv2d_nchwc_pw_dw_pw(tensor(blocked(x)), tensor(w1), None, tensor(w2), None, tensor(w3[:, :5]), None,
                                residual=tensor(blocked(r)), padding=1)
    # a residual of the output's shape in another dtype runs the calls it stands for, with +'s
    # promotion (float64), as the unfused graph does (issue 29 item 10)
    r64 = tensor(np.broadcast_to(blocked(r), (2, 1, 6, 6, 16)).astype(np.float64))
    want = ref_conv2d(ref_conv2d(ref_conv2d(x, w1), w2, None, 1, 1, 1, groups=24), w3) + r
    for y in (F.conv2d_nchwc_pw_dw_pw(tensor(blocked(x)), tensor(w1), None, tensor(w2), None, tensor(w3), None,
                                      residual=r64, padding=1),
              F.conv2d_nchwc(F.conv2d_nchwc_pw_dw(tensor(blocked(x)), tensor(w1), None, tensor(w2), None,
                                                  padding=1), tensor(w3), residual=r64)):
        assert y.dtype == np.float64
        np.testing.assert_allclose(F.from_nchwc(y, 16).numpy(), want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


@pytest.mark.parametrize("args, err, match", [
    (lambda t: (t(1, 1, 4, 4, 16), t(8, 16, 1, 1), None, t(8, 1, 3, 3), None, t(4, 8, 3, 3), None), ValueError,
     "proj_weight must be"),
    (lambda t: (t(1, 1, 4, 4, 16), t(8, 16, 1, 1), None, t(8, 1, 3, 3), None, t(4, 7, 1, 1), None), ValueError,
     "proj_weight must be"),
    (lambda t: (t(1, 1, 4, 4, 16), t(8, 16, 1, 1), None, t(8, 1, 3, 3), None, t(4, 8, 1, 1), t(5)), ValueError,
     "proj_bias"),
    (lambda t: (t(1, 1, 4, 4, 16), t(8, 16, 1, 1), None, t(4, 1, 3, 3), None, t(4, 8, 1, 1), None), ValueError,
     "dw_weight must be"),
    (lambda t: (t(1, 1, 4, 4, 16), t(8, 16, 1, 1), None, t(8, 1, 3, 3), None, t(4, 8, 1, 1), None,
                t(1, 1, 4, 3, 16)), ValueError, "residual must have"),
    (lambda t: (t(1, 1, 4, 4, 16), t(8, 16, 1, 1), None, t(8, 1, 3, 3), None, t(4, 8, 1, 1), None, None, 1, 1,
                "none", "none", "tanh"), ValueError, "act must be one of"),
    (lambda t: (t(1, 1, 4, 4, 16), t(8, 16, 1, 1), None, t(8, 1, 3, 3), None, "w", None), TypeError, "Tensor"),
])
def test_conv2d_nchwc_pw_dw_pw_bad_arguments(args, err, match):
    with pytest.raises(err, match=match):
        nn.conv2d_nchwc_pw_dw_pw(*args(lambda *s: tensor(rand(*s))))


@pytest.mark.parametrize("args, err, match", [
    (lambda t: (t(1, 1, 4, 4, 16), t(8, 16, 3, 3), None, t(8, 1, 3, 3), None), ValueError, "pointwise"),
    (lambda t: (t(1, 1, 4, 4, 16), t(8, 16, 1, 1), None, t(4, 1, 3, 3), None), ValueError, "depthwise"),
    (lambda t: (t(1, 16, 4, 4), t(8, 16, 1, 1), None, t(8, 1, 3, 3), None), ValueError, "NCHW16c"),
    (lambda t: (t(1, 2, 4, 4, 16), t(8, 16, 1, 1), None, t(8, 1, 3, 3), None), ValueError, "NCHW16c"),
    (lambda t: (t(1, 1, 4, 4, 16), t(8, 16, 1, 1), t(7), t(8, 1, 3, 3), None), ValueError, "bias"),
    (lambda t: (t(1, 1, 2, 2, 16), t(8, 16, 1, 1), None, t(8, 1, 5, 5), None), ValueError,
     r"\(depthwise conv\): kernel \(5, 5\) .* larger"),
    (lambda t: (t(1, 1, 0, 2, 16), t(8, 16, 1, 1), None, t(8, 1, 3, 3), None), ValueError,
     r"\(pointwise conv\): kernel \(1, 1\) .* larger than the padded input \(0, 2\)"),
    (lambda t: (t(1, 1, 4, 4, 16), t(8, 16, 1, 1), None, "w", None), TypeError, "Tensor"),
])
def test_conv2d_nchwc_pw_dw_bad_arguments(args, err, match):
    with pytest.raises(err, match=match):
        nn.conv2d_nchwc_pw_dw(*args(lambda *s: tensor(rand(*s))))
    with pytest.raises(ValueError, match="act must be one of"):
        nn.conv2d_nchwc_pw_dw(tensor(rand(1, 1, 4, 4, 16)), tensor(rand(8, 16, 1, 1)), None,
                              tensor(rand(8, 1, 3, 3)), None, 1, 1, "tanh")


def test_conv2d_nchwc_unused_channels_stay_zero_after_an_infinite_input():
    """The channels past O are x * 0; an infinite x would make them NaN, and
    the next conv would spread the NaN to real channels (0 * NaN)."""
    x = rand(1, 16, 5, 5)
    x[0, 3, 2, 2] = np.inf
    w1, w2 = rand(3, 16, 1, 1), rand(4, 3, 3, 3)
    y1 = nn.conv2d_nchwc(tensor(blocked(x)), tensor(w1), None, None, 1, 0, 1, 1, "relu")
    assert not y1.numpy()[..., 3:].any()
    y2 = nn.from_nchwc(nn.conv2d_nchwc(y1, tensor(w2), None, None, 1, 1), 4).numpy()
    ref = ref_conv2d(np.maximum(ref_conv2d(x, w1), 0), w2, None, 1, 1)
    np.testing.assert_array_equal(np.isnan(y2), np.isnan(ref))


@pytest.mark.parametrize("call, err, match", [
    (lambda: nn.conv2d_nchwc(tensor(rand(1, 1, 1, 1, 16)), tensor(rand(1, 1, 3, 3)),
                             stride=2 ** 31 - 1, padding=((2 ** 29 - 2 ** 15) // 2, (2 ** 29 + 2 ** 15) // 2)),
     ValueError, "exceeds"),         # the padded copy's byte count would wrap int64
    (lambda: nn.conv2d_nchwc(tensor(rand(1, 1, 4, 4, 16, dtype="float64")), tensor(rand(2, 3, 1, 1))),
     TypeError, "float32"),
    (lambda: nn.conv2d_nchwc(tensor(rand(1, 2, 4, 4, 16)), tensor(rand(2, 3, 1, 1))), ValueError, "NCHW16c"),
    (lambda: nn.conv2d_nchwc(tensor(rand(1, 3, 4, 4)), tensor(rand(2, 4, 1, 1))), ValueError, "channels"),
    (lambda: nn.conv2d_nchwc(tensor(rand(1, 1, 4, 4, 16)), tensor(rand(4, 8, 1, 1)), groups=2),
     ValueError, "groups"),
    (lambda: nn.conv2d_nchwc(tensor(rand(1, 16, 4, 4)), tensor(rand(16, 1, 3, 3)), groups=16),
     ValueError, "groups"),
    (lambda: nn.conv2d_nchwc(tensor(rand(1, 1, 4, 4, 16)), tensor(rand(2, 3, 5, 5))), ValueError, "larger"),
    (lambda: nn.conv2d_nchwc(tensor(rand(1, 1, 4, 4, 16)), tensor(rand(2, 3, 1, 1)),
                             residual=tensor(rand(1, 1, 4, 4))), ValueError, "residual"),
    (lambda: nn.conv2d_nchwc(tensor(rand(1, 1, 4, 4, 16)), tensor(rand(2, 3, 1, 1)), act="tanh"),
     ValueError, "act"),
    (lambda: nn.conv2d_nchwc(tensor(rand(1, 4, 4)), tensor(rand(2, 3, 1, 1))), ValueError, "4-D"),
    # sizes past BLAS's int take the Python-int checks: no wrapped int64 slips through
    (lambda: nn.conv2d_nchwc(tensor(rand(1, 1, 4, 4, 16)), tensor(np.zeros((0, 16, 2 ** 31 + 5, 1), np.float32))),
     ValueError, "larger"),
    (lambda: nn.conv2d_nchwc(tensor(rand(1, 1, 4, 4, 16)), tensor(np.zeros((0, 16, 2 ** 31 + 5, 1), np.float32)),
                             padding=(2 ** 31 - 1, 0)), ValueError, "32-bit BLAS"),
    (lambda: nn.conv2d_nchwc(tensor(rand(1, 1, 4, 4, 16)), tensor(np.zeros((0, 16, 1, 2 ** 40), np.float32)),
                             dilation=2 ** 31 - 1), ValueError, "larger"),
    (lambda: nn.conv2d_nchwc(tensor(rand(1, 1, 4, 4, 16)), tensor(rand(16, 16, 1, 1)), padding=2 ** 31 - 1),
     ValueError, "32-bit BLAS"),
    (lambda: nn.conv2d_nchwc(tensor(rand(1, 1, 4, 4, 16)), tensor(np.zeros((0, 2 ** 40, 1, 1), np.float32)),
                             groups=2 ** 31 - 1), ValueError, "more channels"),
    (lambda: nn.conv2d_nchwc(tensor(rand(1, 1, 4, 4, 16)), tensor(rand(2, 16, 1, 1)),
                             residual=tensor(rand(1, 1, 4, 5, 16))), ValueError, "residual"),
    (lambda: nn.conv2d_nchwc(tensor(rand(1, 1, 4, 4, 16)), tensor(rand(2, 16, 1, 1)), tensor(rand(1, 2))),
     ValueError, "bias"),
    (lambda: nn.conv2d_nchwc_pw_dw(tensor(rand(1, 1, 4, 4, 16)), tensor(np.zeros((0, 16, 1, 1), np.float32)), None,
                                   tensor(np.zeros((0, 1, 2 ** 31 + 5, 3), np.float32)), None), ValueError, "larger"),
    (lambda: nn.from_nchwc(tensor(rand(1, 2, 4, 4, 16)), 40), ValueError, "blocks"),
    (lambda: nn.from_nchwc(tensor(rand(1, 2, 4, 4, 16)), 2 ** 63), ValueError, "blocks"),
    (lambda: nn.from_nchwc(tensor(rand(1, 2, 4, 4, 8)), 20), ValueError, "NCHW16c"),
    (lambda: nn.to_nchwc(tensor(rand(1, 2, 4))), ValueError, "4"),
    (lambda: nn.max_pool2d_nchwc(tensor(rand(1, 2, 4, 4)), 2), ValueError, "NCHW16c"),
    (lambda: nn.max_pool2d_nchwc(tensor(rand(1, 1, 4, 4, 16)), 2, padding=2), ValueError, "half"),
    (lambda: nn.max_pool2d_nchwc(tensor(rand(1, 1, 4, 4, 16, dtype="float64")), 2), TypeError, "float32"),
])
def test_nchwc_bad_arguments_raise(call, err, match):
    with pytest.raises(err, match=match):
        call()


@pytest.mark.parametrize("geom", [(1, 16, 64, 40, 40, 1), (2, 24, 70, 30, 22, 1), (1, 64, 64, 56, 56, 1)])
@pytest.mark.parametrize("winograd", [2, 4])
def test_conv2d_nchwc_winograd_same_bits_on_any_thread_count(geom, winograd):
    """Where V outweighs U (few channels, many tiles: ResNet's 64-channel
    layers), the threads take the tiles' groups in turn rather than the
    output block pairs; each tile's arithmetic is the same, so 1, 2 and 3
    threads give the same bits, and the NumPy reference within rounding."""
    n, c, o, h, w, p = geom
    # its own generator: the draws (and so the rounding error) do not depend
    # on which tests ran before it
    g = np.random.default_rng(sum(geom) * 10 + winograd)
    x, wt, b = (g.standard_normal(s, dtype=np.float32) for s in ((n, c, h, w), (o, c, 3, 3), (o,)))
    ref = ref_conv2d(x, wt, b, 1, p, 1)
    before = nn._set_nchwc_winograd(winograd)
    try:
        ys = [y.numpy() for y in _on_threads(lambda: nn.conv2d_nchwc(tensor(blocked(x)), tensor(wt), tensor(b),
                                                                     None, 1, p, 1, 1, "relu"))]
    finally:
        nn._set_nchwc_winograd(before)
    for y in ys[1:]:
        np.testing.assert_array_equal(y, ys[0])
    got = nn.from_nchwc(tensor(ys[0]), o).numpy()
    # F(4x4, 3x3) rounds more: nchwc.c bounds it by 1.5e-5 of the output's scale
    np.testing.assert_allclose(got, np.maximum(ref, 0), rtol=1e-5,
                               atol=(1.5e-5 if winograd == 4 else 2e-6) * np.abs(ref).max())
