"""Int8 inference kernels: linear and conv2d on quantized integers with
int32 accumulation and a fused requantize + bias + ReLU epilogue
(``mgtrace._core.qint8``: AVX-512 VNNI ``vpdpbusd`` where the CPU has it,
AMX ``tdpbsud`` for dense convs where it has that too, portable C otherwise,
chosen at run time; all give the same bits).

The arithmetic, exactly (the NumPy reference in the tests is this)::

    acc = sum_k (x_q - x_zp) * w_q   (+ bias_q)                    # integers
    y_q = clip(rint(acc * (x_scale * w_scale / y_scale)) + y_zp, qmin, qmax)

with ``rint`` round half to even in float64 (the rule of
:mod:`mgtrace.quantization`), ``bias_q = rint(bias / (x_scale * w_scale))``
(MegEngine's qint32 bias), per-tensor or per-output-channel weight scales,
and ReLU as ``qmin = max(qmin, y_zp)``. Weights are signed and symmetric
(``qint8`` or ``qint8_narrow``); activations ``qint8`` (zero point 0) or
``quint8`` (any zero point in 0..255). A layer whose output stays float
(``out_dtype="float32"``) gets ``acc * x_scale * w_scale`` (bias included),
in float64 then rounded once to float32.

Arguments are NumPy arrays or mgtrace Tensors of int8/uint8; results are
NumPy arrays. The quantized modules (``mgtrace.module.quantized``) run
these kernels on QuantizedTensors.
"""
import functools
import math

import numpy as np

from mgtrace.quantization.utils import QuantizationError, quant_dtype

__all__ = ["has_vnni", "Int8Weight", "quantize_array", "dequantize_array", "linear", "conv2d",
           "max_pool2d", "avg_pool2d", "adaptive_avg_pool2d"]

_MAX_K = 65792          # K * 255 * 128 < 2**31: the int32 dot product is exact


def _kernels():
    from mgtrace._core import qint8
    return qint8


def has_vnni():
    """Whether the int8 kernels run on AVX-512 VNNI on this CPU."""
    return _kernels().has_vnni()


def _array(x, what):
    if hasattr(x, "numpy") and not isinstance(x, np.ndarray):
        x = x.numpy()
    return np.asarray(x)


def _zeros64(shape):
    """A C-contiguous int8 array of zeros of ``shape`` at a 64-byte boundary."""
    size = math.prod(shape)
    raw = np.zeros(size + 64, np.int8)
    at = -raw.ctypes.data % 64
    return raw[at:at + size].reshape(shape)


def _aligned64(a):
    """``a`` (C-contiguous int8), or a copy of it at a 64-byte boundary."""
    if a.ctypes.data % 64 == 0:
        return a
    out = _zeros64(a.shape)
    out[...] = a
    return out


def quantize_array(x, scale, zero_point=0, dtype="qint8"):
    """``clip(rint(x / scale) + zero_point, qmin, qmax)`` in float32 (as
    fake quantization), stored as the dtype's integers (int8, uint8,
    int32). ``scale``/``zero_point`` broadcast against x."""
    meta = quant_dtype(dtype)
    x = _array(x, "x").astype(np.float32)
    q = np.clip(np.rint(x / np.float32(scale)) + np.float32(zero_point), meta.qmin, meta.qmax)
    return q.astype(meta.np_dtype_str)


def dequantize_array(q, scale, zero_point=0):
    """``(q - zero_point) * scale`` in float32."""
    q = _array(q, "q")
    return ((q.astype(np.float32) - np.float32(zero_point)) * np.float32(scale)).astype(np.float32)


def _flipped(x):
    """int8 ``x``'s integers as uint8 bytes, x ^ 0x80 (the kernels' u8 input,
    zero point + 128), by the quant table's flip (a plan replays it)."""
    x = np.ascontiguousarray(x)
    out = np.empty(x.shape, np.uint8)
    _kernels().flip_into(x, out)
    return out


def _as_u8(x, zp, meta):
    """uint8 bytes and zero point standing for activation ``x`` of ``meta``."""
    if meta.name == "quint8":
        if x.dtype != np.uint8:
            raise QuantizationError(f"a quint8 activation is uint8, got {x.dtype}")
        return np.ascontiguousarray(x), int(zp)
    if meta.name in ("qint8", "qint8_narrow"):
        if x.dtype != np.int8:
            raise QuantizationError(f"a {meta.name} activation is int8, got {x.dtype}")
        if zp:
            raise QuantizationError(f"{meta.name} is symmetric: zero point 0, got {zp}")
        return _flipped(x), 128
    raise QuantizationError(f"int8 kernels take qint8 or quint8 activations, got {meta.name}")


class Int8Weight:
    """A weight quantized and packed once for the int8 kernels.

    Args:
        w_q: int8 [N, K] (linear) or [C_out, C_in / groups, KH, KW] (conv2d),
            symmetric (qint8_narrow recommended: -127..127).
        scale: float, or float32 [N] per output channel.
        bias: float32 [N] or None, quantized to int32 at each call's input
            scale (``rint(bias / (x_scale * scale))``, saturated to int32).

    Raises QuantizationError for a non-int8 weight, a scale of the wrong
    size or not positive, or K too large for exact int32 accumulation.
    """

    def __init__(self, w_q, scale, bias=None, groups=1):
        w = _array(w_q, "w_q")
        if w.dtype != np.int8 or w.ndim not in (2, 4):
            raise QuantizationError(f"Int8Weight takes int8 [N, K] or [Co, Ci/g, KH, KW], got "
                                    f"{w.dtype} {w.shape}")
        self.shape = w.shape
        self.groups = int(groups)
        n = w.shape[0]
        if n % self.groups:
            raise QuantizationError(f"{n} output channels do not split into {groups} groups")
        scale = np.broadcast_to(np.asarray(scale, np.float32), (n,)).copy()
        if not np.all(scale > 0):
            raise QuantizationError(f"weight scales must be positive, got {scale}")
        self.scale = scale
        self.bias = None if bias is None else np.asarray(_array(bias, "bias"), np.float32)
        if self.bias is not None and self.bias.shape != (n,):
            raise QuantizationError(f"bias must be [{n}], got {self.bias.shape}")
        k = int(np.prod(w.shape[1:]))
        if k > _MAX_K:
            raise QuantizationError(f"K={k} is too large for exact int32 accumulation "
                                    f"(at most {_MAX_K})")
        per = n // self.groups
        # depthwise (one input channel per group, one filter each): the direct kernel
        self.depthwise = w.ndim == 4 and per == 1 and w.shape[1] == 1
        self.raw = np.ascontiguousarray(w.reshape(n, k)) if self.depthwise else None
        self.packs, self.rows, self.wsum = [], None, None
        if w.ndim == 2:         # linear: the GEMM's blocks of 16 channels
            # at a 64-byte boundary: AMX loads the packed blocks 64 bytes a
            # row, one cache line each only when aligned (MiniLM's shapes,
            # one thread: 0.30 -> 0.22 ms for 1024 x 384 x 384)
            packed, wsum = _kernels().pack_weight(np.ascontiguousarray(w))
            self.packs = [(_aligned64(packed), wsum)]
        elif not self.depthwise:
            # conv2d (qconv.c): each channel's filter a row, k rounded up to
            # 64 and 31 zero rows after (AMX reads 32 rows x 64 k at a time),
            # at a 64-byte boundary so that each 64-k step of a row is one
            # cache line (NumPy's 16-byte alignment split every one in two:
            # ResNet-18's int8 convs took 10% longer)
            self.rows = _zeros64((n + 31, -(-k // 64) * 64))
            self.rows[:n, :k] = w.reshape(n, k)
            self.wsum = w.reshape(n, k).sum(axis=1, dtype=np.int32)
        self._epilogues = {}

    def _epilogue(self, g, x_scale, out_scale):
        """(mult, bias) of group ``g``'s output channels (None: all channels),
        kept for the next call with the same scales."""
        if out_scale is None:       # float32 out
            out_scale = 1.0
        key = (g, float(x_scale), float(out_scale))
        hit = self._epilogues.get(key)
        if hit is None:
            if len(self._epilogues) > 16:
                self._epilogues.clear()
            hit = self._epilogues[key] = self._epilogue_of(g, x_scale, out_scale)
        return hit

    def _epilogue_of(self, g, x_scale, out_scale):
        per = self.shape[0] // self.groups
        sl = slice(None) if g is None else slice(g * per, (g + 1) * per)
        ws = self.scale[sl].astype(np.float64)
        mult = (np.float64(np.float32(x_scale)) * ws) / np.float64(np.float32(out_scale))
        bias = None
        if self.bias is not None:
            b = np.rint(self.bias[sl].astype(np.float64)
                        / (np.float64(np.float32(x_scale)) * ws))
            bias = np.clip(b, -(2 ** 31), 2 ** 31 - 1).astype(np.int32)
        return np.ascontiguousarray(mult), bias


class _Float32:
    name = np_dtype_str = "float32"


def _out_range(out_dtype, out_zp, relu):
    if out_dtype in ("float32", np.float32):
        return _Float32, (0 if relu else -1), 0
    meta = quant_dtype(out_dtype)
    if meta.name not in ("qint8", "qint8_narrow", "quint8"):
        raise QuantizationError(f"int8 kernels write qint8 or quint8, got {meta.name}")
    lo = meta.qmin
    if relu:
        lo = max(lo, int(out_zp))
    return meta, lo, meta.qmax


def linear(x_q, x_scale, x_zp, weight, out_scale, out_zp=0, out_dtype="qint8", relu=False,
           x_dtype=None, path=0, alloc=np.empty):
    """Int8 ``linear``: x_q int8/uint8 [..., K] -> out_dtype [..., N].

    Args:
        x_q, x_scale, x_zp: the quantized input and its qparams; x_dtype
            (default: qint8 for int8 data, quint8 for uint8).
        weight: an :class:`Int8Weight` of shape [N, K].
        out_scale, out_zp, out_dtype: the output's qparams and dtype;
            out_dtype "float32" writes the dequantized accumulator
            ``acc * x_scale * w_scale`` instead (out_scale, out_zp unused).
        relu: fuse ReLU into the saturation.
        path: 0 the best kernel here (AMX for the whole blocks of 16 rows
            where K is a multiple of 64, else AVX-512 VNNI, else AVX2, else
            portable C), 1 the portable one, 2 VNNI, 3 AMX, 4 AVX2, each
            where the CPU has it (for tests; every path gives the same bits).
        alloc: ``alloc(shape, dtype)`` gives the C-contiguous NumPy array
            the result is written into (default ``numpy.empty``; the
            quantized modules pass one over a new core Tensor's memory).

    Returns a NumPy array. Raises QuantizationError for mismatched shapes or
    dtypes.
    """
    x = _array(x_q, "x_q")
    meta_in = quant_dtype(x_dtype or ("quint8" if x.dtype == np.uint8 else "qint8"))
    if weight.groups != 1 or len(weight.shape) != 2 or x.shape[-1:] != weight.shape[1:]:
        raise QuantizationError(f"linear: input [..., {x.shape[-1:]}] does not fit weight "
                                f"{weight.shape}")
    meta, lo, hi = _out_range(out_dtype, out_zp, relu)
    a, a_zp = _as_u8(x.reshape(math.prod(x.shape[:-1]), x.shape[-1]), x_zp, meta_in)
    n = weight.shape[0]
    out = alloc(x.shape[:-1] + (n,), meta.np_dtype_str)
    mult, bias = weight._epilogue(0, x_scale, None if meta is _Float32 else out_scale)
    packed, wsum = weight.packs[0]
    _kernels().gemm(a, a_zp, packed, wsum, bias, mult, int(out_zp), lo, hi,
                    out.reshape(a.shape[0], n), n, 1, path)
    return out


def _pair(v):
    if isinstance(v, int):
        return v, v
    return (int(v), int(v)) if np.ndim(v) == 0 else (int(v[0]), int(v[1]))


_GEOMETRY_MAX = 2 ** 31 - 1


def _geometry(fn, name, v):
    """A pooling's int or (h, w) argument as a pair of Python ints, as the
    float pools take it: integers (not bool, not float; a TypeError) at most
    2**31 - 1 (a QuantizationError; the kernels' buffers are sized from
    them, and a float x refuses the same values)."""
    vals = (v, v) if np.ndim(v) == 0 else tuple(v)
    if len(vals) != 2 or not all(isinstance(a, (int, np.integer)) and
                                 not isinstance(a, (bool, np.bool_)) for a in vals):
        raise TypeError(f"{fn}: {name} must be an int or a pair of ints, got {v!r}")
    if max(vals) > _GEOMETRY_MAX:
        raise QuantizationError(f"{fn}: {name} must be at most {_GEOMETRY_MAX} (2**31 - 1), "
                                f"got {v!r}")
    return int(vals[0]), int(vals[1])


def conv2d(x_q, x_scale, x_zp, weight, out_scale, out_zp=0, out_dtype="qint8", relu=False,
           stride=1, padding=0, dilation=1, x_dtype=None, path=0, alloc=np.empty):
    """Int8 ``conv2d`` (NCHW): x_q int8/uint8 [N, C_in, H, W] -> out_dtype
    [N, C_out, OH, OW]; ``weight`` an :class:`Int8Weight` of shape [C_out,
    C_in / groups, KH, KW] (its ``groups``: dense, grouped or depthwise).
    Padding reads the input's zero point (a real 0). Other arguments as
    :func:`linear`; stride, padding, dilation ints or pairs. ``path``: 0
    the best kernel here, 1 the portable C ones, 2 AVX-512 VNNI (depthwise:
    its vpmaddwd kernel), 3 AMX (depthwise: vpermb + vpdpbusd, VBMI), 4
    AVX2 for dense convs, 5 (depthwise) 16 channels in the lanes (channel
    counts a multiple of 16), 6 (depthwise) 16 output pixels a vector
    across row ends (what path 0 runs where outputs are at most 8 wide and
    the plane is small: MobileNetV2's 7 wide layers), each where the CPU
    has it, else the next best; every path gives the same bits
    (kernels/cpu/qconv.c).
    """
    x = _array(x_q, "x_q")
    plan = _conv2d_plan(x.shape, x.dtype, x_scale, x_zp, weight, out_scale, out_zp, out_dtype,
                       relu, stride, padding, dilation, x_dtype, path)
    out = alloc(plan.out_shape, plan.out_dtype)
    plan(x, out)
    return out


class _ConvPlan:
    """One int8 conv2d's checked arguments (:func:`_conv2d_plan`)."""

    def __init__(self, kern_args, depthwise, signed, out_shape, out_dtype, x_shape, x_dtype):
        self.kern = _kernels().dwconv if depthwise else _kernels().conv
        self.args = kern_args
        self.signed = signed
        self.out_shape, self.out_dtype = out_shape, out_dtype
        self.x_shape, self.x_dtype = x_shape, x_dtype

    def __call__(self, x, out):
        """Run on x (int8/uint8 of the planned shape) into out (a C-contiguous
        array of ``out_shape`` and ``out_dtype``)."""
        if x.shape != self.x_shape or x.dtype != self.x_dtype:
            raise QuantizationError(f"conv2d planned for {self.x_dtype} {self.x_shape}, got "
                                    f"{x.dtype} {x.shape}")
        # a signed x: the same integers as uint8 with the zero point 128
        a = _flipped(x) if self.signed else np.ascontiguousarray(x)
        a0, rest = self.args[0], self.args[1:]
        self.kern(a, a0, *rest[:-1], out, rest[-1])


def _conv2d_plan(x_shape, x_np_dtype, x_scale, x_zp, weight, out_scale, out_zp=0,
                out_dtype="qint8", relu=False, stride=1, padding=0, dilation=1, x_dtype=None,
                path=0):
    """:func:`conv2d`'s checks and epilogue constants done once for inputs of
    ``x_shape`` and NumPy dtype ``x_np_dtype`` (int8 or uint8): returns a
    callable ``plan(x_q, out)`` running the conv on such an input into a
    C-contiguous ``out`` of ``plan.out_shape`` / ``plan.out_dtype`` (the
    quantized modules keep one per input). Raises QuantizationError as
    :func:`conv2d` does."""
    x_np_dtype = np.dtype(x_np_dtype)
    meta_in = quant_dtype(x_dtype or ("quint8" if x_np_dtype == np.uint8 else "qint8"))
    if len(x_shape) != 4 or len(weight.shape) != 4:
        raise QuantizationError(f"conv2d takes x [N, C, H, W] and a 4-d weight, got "
                                f"{tuple(x_shape)} and {weight.shape}")
    co, cig, kh, kw = weight.shape
    g = weight.groups
    nb, ci, h, w = x_shape
    if ci != cig * g:
        raise QuantizationError(f"conv2d: {ci} input channels, the weight takes {cig} x {g} "
                                "groups")
    (sh, sw), (ph, pw), (dh, dw) = _pair(stride), _pair(padding), _pair(dilation)
    # the kernels index the padded planes with these: a negative padding
    # wrote outside the depthwise kernels' buffers (heap corruption)
    if min(sh, sw, dh, dw, kh, kw) < 1 or min(ph, pw) < 0:
        raise QuantizationError(f"conv2d: stride {(sh, sw)}, dilation {(dh, dw)} and kernel "
                                f"{(kh, kw)} must be >= 1 and padding {(ph, pw)} >= 0")
    oh = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    ow = (w + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    if oh <= 0 or ow <= 0:
        raise QuantizationError(f"conv2d: output size {oh}x{ow} is empty")
    meta, lo, hi = _out_range(out_dtype, out_zp, relu)
    # _as_u8's checks on an empty array of the input's dtype
    _, a_zp = _as_u8(np.empty(0, x_np_dtype), x_zp, meta_in)
    mult, bias = weight._epilogue(None, x_scale, None if meta is _Float32 else out_scale)
    if weight.depthwise:
        args = (a_zp, weight.raw, kh, kw, sh, sw, ph, pw, dh, dw, bias, mult, int(out_zp), lo,
                hi, path)
    else:
        args = (a_zp, weight.rows, weight.wsum, g, kh, kw, sh, sw, ph, pw, dh, dw, bias, mult,
                int(out_zp), lo, hi, path)
    return _ConvPlan(args, weight.depthwise, meta_in.name != "quint8", (nb, co, oh, ow),
                     meta.np_dtype_str, tuple(x_shape), x_np_dtype)


def _pool_size(n, k, s, p, d, ceil_mode):
    """F.max_pool2d's output size along one axis (PyTorch's rule)."""
    span = n + 2 * p - d * (k - 1) - 1
    o = (-(-span // s) if ceil_mode else span // s) + 1
    if ceil_mode and (o - 1) * s >= n + p:     # the last window starts past the input
        o -= 1
    return o


def max_pool2d(x_q, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, path=0,
               alloc=np.empty):
    """Max pooling of quantized integers: x_q int8 / uint8 [N, C, H, W] ->
    the same dtype [N, C, OH, OW], F.max_pool2d's geometry (``stride``
    None: the kernel's; padding at most half the kernel, never winning;
    ``ceil_mode``). Quantizing is monotone, so this is the max pool of the
    dequantized values quantized again with the same qparams, bit for bit:
    a quantized tensor's max pool keeps its scale and zero point (as
    MegEngine's max pooling of a quantized tensor does). ``path`` 0: the
    C kernel (kernels/cpu/qpool.c; int8 runs as uint8 with the sign bit
    flipped, which keeps the order); 1: NumPy (for tests, the same bits).
    Raises QuantizationError for another dtype, rank or geometry (values
    above 2**31 - 1 included, as a float x's pool), TypeError for geometry
    that is no int or pair of ints."""
    x = _array(x_q, "x_q")
    if x.dtype not in (np.int8, np.uint8) or x.ndim != 4:
        raise QuantizationError(f"max_pool2d takes int8 / uint8 [N, C, H, W], got {x.dtype} "
                                f"{x.shape}")
    fn = "max_pool2d"
    (kh, kw) = _geometry(fn, "kernel_size", kernel_size)
    (sh, sw) = (kh, kw) if stride is None else _geometry(fn, "stride", stride)
    (ph, pw), (dh, dw) = _geometry(fn, "padding", padding), _geometry(fn, "dilation", dilation)
    if min(kh, kw, sh, sw, dh, dw) < 1 or min(ph, pw) < 0 or 2 * ph > kh or 2 * pw > kw:
        raise QuantizationError(f"max_pool2d: kernel {(kh, kw)}, stride {(sh, sw)} and "
                                f"dilation {(dh, dw)} must be >= 1, padding {(ph, pw)} in "
                                f"[0, kernel / 2]")
    n, c, h, w = x.shape
    oh, ow = (_pool_size(h, kh, sh, ph, dh, ceil_mode), _pool_size(w, kw, sw, pw, dw, ceil_mode))
    if oh < 1 or ow < 1:
        raise QuantizationError(f"max_pool2d: output size {oh}x{ow} of a {h}x{w} input is empty")
    out = alloc((n, c, oh, ow), x.dtype)
    if n * c == 0:
        return out
    if path == 1:
        lo = np.iinfo(x.dtype).min
        xp = np.full((n, c, h + 2 * ph + sh * oh + dh * kh, w + 2 * pw + sw * ow + dw * kw), lo,
                     x.dtype)
        xp[:, :, ph:ph + h, pw:pw + w] = x
        best = np.full((n, c, oh, ow), lo, x.dtype)
        for i in range(kh):
            for j in range(kw):
                tap = xp[:, :, i * dh:i * dh + sh * oh:sh, j * dw:j * dw + sw * ow:sw]
                best = np.maximum(best, tap)
        out[...] = best
        return out
    signed = x.dtype == np.int8
    a = _flipped(x) if signed else np.ascontiguousarray(x)
    o = out if not signed else np.empty((n, c, oh, ow), np.uint8)
    # one window along an axis: its stride moves nothing, and qpool.c lays
    # the input out in stride-phases (sh * sw of them: a stride of 2**32
    # overflowed that count and wrote past its buffer)
    sh, sw = (1 if oh == 1 else sh), (1 if ow == 1 else sw)
    kh, ph = _taps_on_input(h, kh, sh, ph, dh, oh)
    kw, pw = _taps_on_input(w, kw, sw, pw, dw, ow)
    _kernels().maxpool(a, kh, kw, sh, sw, ph, pw, dh, dw, o)
    if signed:                  # back to int8: the same byte flip
        _kernels().flip_into(o.view(np.int8), out.view(np.uint8))
    return out


def _taps_on_input(n, k, s, p, d, o):
    """(kernel, padding) along one axis of a max pool without the taps that
    read the padding in every window: qpool.c walks every tap of the kernel
    over every output, so a kernel of 2**20 with padding 2**19 (legal, as
    the float pool's) over 5 inputs ran for minutes. Tap t of window i reads
    input i * s + t * d - p: taps before the last window's first input and
    past the first window's last input only ever read padding, which never
    wins. The same outputs; the geometry unchanged where the trimmed one
    would break qpool.c's rules (padding in [0, kernel / 2], every window
    starting before the input's end)."""
    t0 = max(0, -(-(p - (o - 1) * s) // d))
    t1 = min(k, (p + n - 1) // d + 1)
    k2, p2 = t1 - t0, p - t0 * d
    if k2 < 1 or p2 < 0 or 2 * p2 > k2 or (o - 1) * s - p2 >= n:
        return k, p
    return k2, p2


def max_pool2d_tensor(x, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False):
    """:func:`max_pool2d` of a per-tensor quantized CPU Tensor (int8 / uint8
    storage): a QuantizedTensor of x's dtype and qparams. What
    ``F.max_pool2d`` runs for such an input."""
    return _pooled_tensor(x, "max_pool2d", lambda data, alloc: max_pool2d(
        data, kernel_size, stride, padding, dilation, ceil_mode, alloc=alloc))


_AVG_MODES = ("average_count_exclude_padding", "average")


def _frozen(*arrays):
    for a in arrays:
        a.flags.writeable = False
    return arrays


@functools.lru_cache(maxsize=128)
def _avg_windows(n, k, s, p, o, include_pad):
    """avg_pool2d's windows along one axis (pool.c's rule): int64 starts,
    ends (clipped to the input) and divisors, each [o] (read-only, cached)."""
    i = np.arange(o, dtype=np.int64)
    w0 = i * s - p
    w1 = np.minimum(w0 + k, n + p)
    start = np.minimum(np.maximum(w0, 0), n)
    end = np.maximum(np.minimum(w1, n), start)
    return _frozen(start, end, (w1 - w0) if include_pad else end - start)


@functools.lru_cache(maxsize=128)
def _adaptive_windows(n, m):
    """adaptive pooling's windows along one axis: [floor(i n / m),
    ceil((i + 1) n / m)), their sizes the divisors (read-only, cached)."""
    i = np.arange(m, dtype=np.int64)
    start, end = i * n // m, -(-(i + 1) * n // m)
    return _frozen(start, end, end - start)


def _avg_pool(fn, x, rows, cols, zero_point, path, alloc):
    """Average of int8 / uint8 x [N, C, H, W] over the windows ``rows`` and
    ``cols`` ((start, end, divisor) per axis): see :func:`avg_pool2d`."""
    info = np.iinfo(x.dtype)
    # an integer (a QParams' float32 zero point holds one); "3", 1.5 and
    # None were read by int() as 3, 1 and a raw TypeError
    if isinstance(zero_point, (bool, np.bool_)) or not isinstance(
            zero_point, (int, float, np.integer, np.floating)) or \
            not float(zero_point).is_integer():
        raise QuantizationError(f"{fn}: zero point must be an integer, got {zero_point!r}")
    zp = int(zero_point)
    if not info.min <= zp <= info.max:
        raise QuantizationError(f"{fn}: zero point {zp} outside {x.dtype}'s range")
    n, c = x.shape[:2]
    out = alloc((n, c, len(rows[0]), len(cols[0])), x.dtype)
    if out.size == 0:
        return out
    if path == 1:
        q = x.astype(np.int64) - zp
        for a, (ys, ye, dy) in enumerate(zip(*rows)):
            for b, (xs, xe, dx) in enumerate(zip(*cols)):
                total = q[:, :, ys:ye, xs:xe].sum(axis=(2, 3))
                d = int(dy * dx)
                if d == 0:
                    v = np.zeros_like(total)
                else:
                    v, r = np.divmod(total, d)           # floor; r in [0, d)
                    v = v + ((2 * r > d) | ((2 * r == d) & (v % 2 == 1)))
                out[:, :, a, b] = np.clip(v + zp, info.min, info.max)
        return out
    _kernels().avgpool(np.ascontiguousarray(x), *rows, *cols, zp, int(info.min), int(info.max),
                       out)
    return out


def avg_pool2d(x_q, kernel_size, stride=None, padding=0, mode="average_count_exclude_padding",
               ceil_mode=False, zero_point=0, path=0, alloc=np.empty):
    """Average pooling of quantized integers: x_q int8 / uint8 [N, C, H, W]
    with ``zero_point`` -> the same dtype [N, C, OH, OW] with the same
    scale and zero point (MegEngine's quantized pooling keeps the dtype).
    Geometry and ``mode`` as F.avg_pool2d ("average_count_exclude_padding",
    MegEngine's default: divide by the input elements in the window;
    "average": by the window, padding included, the padding the real 0).

    Each output is the window's sum in integers, exactly::

        y_q = round_half_even((sum(x_q) - zero_point * n) / divisor) + zero_point

    (n the input elements in the window; a zero divisor gives zero_point),
    the exact mean of the dequantized values quantized again with the same
    qparams under the one rounding rule of :mod:`mgtrace.quantization`
    (MegEngine's kernels round half away from zero). A float pool of the
    dequantized values then quantized can differ by one step where float
    rounding moves a tie. ``path`` 0: the C kernel (kernels/cpu/qpool.c);
    1: NumPy (for tests, the same bits). Raises QuantizationError for
    another dtype, rank, mode, geometry (values above 2**31 - 1 included)
    or a zero point that is no integer in the dtype's range, TypeError for
    geometry that is no int or pair of ints.

    >>> avg_pool2d(np.array([[[[0, 1, 1, 2, -3, 0]]]], np.int8), (1, 2)).tolist()
    [[[[0, 2, -2]]]]
    """
    x = _array(x_q, "x_q")
    if x.dtype not in (np.int8, np.uint8) or x.ndim != 4:
        raise QuantizationError(f"avg_pool2d takes int8 / uint8 [N, C, H, W], got {x.dtype} "
                                f"{x.shape}")
    if mode not in _AVG_MODES:
        raise QuantizationError(f"avg_pool2d: mode must be one of {_AVG_MODES}, got {mode!r}")
    fn = "avg_pool2d"
    (kh, kw) = _geometry(fn, "kernel_size", kernel_size)
    (sh, sw) = (kh, kw) if stride is None else _geometry(fn, "stride", stride)
    (ph, pw) = _geometry(fn, "padding", padding)
    if min(kh, kw, sh, sw) < 1 or min(ph, pw) < 0 or 2 * ph > kh or 2 * pw > kw:
        raise QuantizationError(f"avg_pool2d: kernel {(kh, kw)} and stride {(sh, sw)} must be "
                                f">= 1, padding {(ph, pw)} in [0, kernel / 2]")
    h, w = x.shape[2:]
    oh, ow = (_pool_size(h, kh, sh, ph, 1, ceil_mode), _pool_size(w, kw, sw, pw, 1, ceil_mode))
    if oh < 1 or ow < 1:
        raise QuantizationError(f"avg_pool2d: output size {oh}x{ow} of a {h}x{w} input is empty")
    include = mode == "average"
    return _avg_pool("avg_pool2d", x, _avg_windows(h, kh, sh, ph, oh, include),
                     _avg_windows(w, kw, sw, pw, ow, include), zero_point, path, alloc)


def adaptive_avg_pool2d(x_q, oshp, zero_point=0, path=0, alloc=np.empty):
    """Adaptive average pooling of quantized integers (F.adaptive_avg_pool2d's
    windows: output i of m along an axis of n averages [floor(i n / m),
    ceil((i + 1) n / m)); ``oshp`` an int or (oh, ow), None keeping an
    axis), rounded as :func:`avg_pool2d`; ``oshp`` 1 is the global average
    pool. Raises QuantizationError for another dtype or rank, an empty
    input plane or a size below 1."""
    x = _array(x_q, "x_q")
    if x.dtype not in (np.int8, np.uint8) or x.ndim != 4:
        raise QuantizationError(f"adaptive_avg_pool2d takes int8 / uint8 [N, C, H, W], got "
                                f"{x.dtype} {x.shape}")
    h, w = x.shape[2:]
    oh, ow = (oshp, oshp) if not isinstance(oshp, (tuple, list)) else tuple(oshp)
    oh, ow = h if oh is None else oh, w if ow is None else ow
    if h < 1 or w < 1 or not all(isinstance(v, (int, np.integer)) and v >= 1 for v in (oh, ow)):
        raise QuantizationError(f"adaptive_avg_pool2d: output size {oshp!r} must be >= 1 and "
                                f"the input plane {h}x{w} non-empty")
    return _avg_pool("adaptive_avg_pool2d", x, _adaptive_windows(h, int(oh)),
                     _adaptive_windows(w, int(ow)), zero_point, path, alloc)


def avg_pool2d_tensor(x, kernel_size, stride=None, padding=0,
                      mode="average_count_exclude_padding", ceil_mode=False):
    """:func:`avg_pool2d` of a per-tensor quantized CPU Tensor: a
    QuantizedTensor of x's dtype and qparams. What ``F.avg_pool2d`` runs for
    such an input."""
    zp = _zero_point(x)
    return _pooled_tensor(x, "avg_pool2d", lambda data, alloc: avg_pool2d(
        data, kernel_size, stride, padding, mode, ceil_mode, zp, alloc=alloc))


def adaptive_avg_pool2d_tensor(x, oshp):
    """:func:`adaptive_avg_pool2d` of a per-tensor quantized CPU Tensor, as
    :func:`avg_pool2d_tensor`. What ``F.adaptive_avg_pool2d`` runs."""
    zp = _zero_point(x)
    return _pooled_tensor(x, "adaptive_avg_pool2d", lambda data, alloc: adaptive_avg_pool2d(
        data, oshp, zp, alloc=alloc))


def _zero_point(x):
    from mgtrace.quantization import qdtype
    return int(qdtype.get_zero_point(x._qdtype))


def _pooled_tensor(x, fn, run):
    """``run(integers, alloc)`` on per-tensor quantized CPU Tensor x, its
    result a QuantizedTensor of x's dtype and qparams."""
    from mgtrace._core import empty_tensor
    from mgtrace._core.tensor import unshared_view
    from mgtrace.quantization.qtensor import QuantizedTensor
    device = x.device
    # the device's int8 table (NoKernelError naming fn and the device without one)
    from mgtrace.quantization import qdtype
    _kernels().require(fn, device, qdtype.quantized_meta(x._qdtype).name
                       if x._qdtype is not None else x.dtype.name)
    if device.type != "cpu":
        x = x.to("cpu")
    holder = []

    def alloc(shape, dtype):
        t = empty_tensor(shape, np.dtype(dtype).name, cls=QuantizedTensor)
        q = x.__dict__.get("qparams")
        if q is not None:
            t.__dict__["qparams"] = q
        t._qdtype = x._qdtype
        holder.append(t)
        return unshared_view(t, True)
    # the integers in place (Tensor.numpy copies them)
    data = unshared_view(x) if x.is_contiguous else np.asarray(x.numpy())
    run(data, alloc)
    return holder[0] if device.type == "cpu" else holder[0].to(device)
