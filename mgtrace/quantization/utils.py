"""Quantized dtype metadata, quantization modes, qparams and the fake
quantization functions every observer and fake-quant module uses.

The rounding rule, for every path in this package: **round half to even**
(``numpy.rint``, ONNX ``QuantizeLinear``), applied to ``x / scale`` before
the zero point is added::

    q = clip(rint(x / scale) + zero_point, qmin, qmax)      # quantize
    y = (q - zero_point) * scale                            # dequantize

all in float32. MegEngine's C++ kernels round half away from zero and add
the zero point before rounding; mgtrace departs from both to keep one rule
that ONNX Runtime and NumPy share (an exact ``.5`` tie therefore goes to the
even integer: ``2.5 -> 2``, ``-0.5 -> 0``).
"""
import collections
import enum

import numpy as np

import mgtrace.functional as F
from mgtrace._core import tensor as _tensor
from mgtrace.errors import Error, did_you_mean

__all__ = ["QuantDtypeMeta", "QUANT_DTYPES", "QuantMode", "QParams", "LSQParams",
           "QuantizationError", "create_qparams", "quant_dtype", "fake_quant_tensor",
           "tqt_forward", "lsq_forward"]


class QuantizationError(Error, ValueError):
    """Bad quantization arguments: an unknown dtype name, a mode the dtype or
    module does not support, qparams that are missing or do not match."""


class QuantDtypeMeta(collections.namedtuple(
        "QuantDtypeMeta", ["name", "cname", "np_dtype_str", "qmin", "qmax", "is_unsigned"])):
    """A quantized dtype's metadata (MegEngine's ``QuantDtypeMeta``): its
    name, MegEngine's C name, the NumPy storage dtype and the integer range
    ``[qmin, qmax]``."""

    def __repr__(self):
        return f"QuantDtypeMeta({self.name!r}, qmin={self.qmin}, qmax={self.qmax})"


def _meta(name, cname, storage, qmin, qmax):
    return QuantDtypeMeta(name, cname, storage, qmin, qmax, storage.startswith("u"))


#: MegEngine's builtin quantized dtypes and ranges (core/tensor/dtype.py).
#: ``qint8_narrow`` drops -128 so that a weight times an activation sum of
#: two products cannot overflow int16 (MegEngine's QConfig note).
QUANT_DTYPES = {m.name: m for m in (
    _meta("qint8", "QuantizedS8", "int8", -128, 127),
    _meta("qint8_narrow", "QuantizedS8", "int8", -127, 127),
    _meta("quint8", "Quantized8Asymm", "uint8", 0, 255),
    _meta("qint4", "QuantizedS4", "int8", -8, 7),
    _meta("quint4", "Quantized4Asymm", "uint8", 0, 15),
    _meta("qint32", "QuantizedS32", "int32", -(2 ** 31), 2 ** 31 - 1),
)}


def quant_dtype(dtype):
    """The :class:`QuantDtypeMeta` for ``dtype`` (a name in
    :data:`QUANT_DTYPES` or a QuantDtypeMeta). Raises QuantizationError for
    an unknown name."""
    if isinstance(dtype, QuantDtypeMeta):
        return dtype
    try:
        return QUANT_DTYPES[dtype]
    except (KeyError, TypeError):
        raise QuantizationError(
            f"unknown quantized dtype {dtype!r}: expected one of {', '.join(QUANT_DTYPES)}."
            + did_you_mean(dtype, QUANT_DTYPES)) from None


class QuantMode(enum.Enum):
    """Symmetric (zero point 0; MegEngine's signed dtypes) or asymmetric
    (a zero point; its unsigned dtypes). MegEngine spells the members
    ``SYMMERTIC``/``ASYMMERTIC``; both spellings are accepted."""
    SYMMERTIC = 1
    ASYMMERTIC = 2
    SYMMETRIC = 1
    ASYMMETRIC = 2


def _as_tensor(value, what):
    if value is None:
        return None
    if hasattr(value, "numpy") and hasattr(value, "dtype"):
        return value
    if np.asarray(value).dtype == np.bool_:     # float32(True) would quietly be 1.0
        raise QuantizationError(f"qparams: {what} must be a number, got {value!r}")
    return _tensor(np.asarray(value, dtype=np.float32))


def check_qparams_values(qparams, what=None):
    """Raise QuantizationError unless every scale of ``qparams`` is
    positive and finite and, for an asymmetric one, every zero point an
    integer in the dtype's ``[qmin, qmax]`` (per tensor or per channel).
    ``what`` (``"Linear's activation qparams"``) starts the message."""
    meta = qparams.dtype_meta
    head = f"{what}: {meta.name}" if what else meta.name
    s = np.asarray(qparams.scale.numpy() if hasattr(qparams.scale, "numpy")
                   else qparams.scale, np.float64)
    if not np.all(np.isfinite(s) & (s > 0)):
        shown = s.item() if s.size == 1 else s[~(np.isfinite(s) & (s > 0))].tolist()
        raise QuantizationError(f"{head}: scale must be positive and finite, got {shown}")
    if qparams.mode != QuantMode.ASYMMERTIC or qparams.zero_point is None:
        return
    z = np.asarray(qparams.zero_point.numpy() if hasattr(qparams.zero_point, "numpy")
                   else qparams.zero_point, np.float64)
    with np.errstate(invalid="ignore"):
        ok = np.isfinite(z) & (z == np.rint(z)) & (z >= meta.qmin) & (z <= meta.qmax)
    if not np.all(ok):
        shown = z.item() if z.size == 1 else z[~ok].tolist()
        raise QuantizationError(f"{head}: zero_point must be an integer in "
                                f"{meta.qmin}..{meta.qmax}, got {shown}")


def _same(a, b):
    if a is None or b is None:
        return a is b
    a = a.numpy() if hasattr(a, "numpy") else np.asarray(a)
    b = b.numpy() if hasattr(b, "numpy") else np.asarray(b)
    return a.shape == b.shape and bool(np.array_equal(a, b))


class QParams:
    """How a tensor is quantized: ``mode`` (QuantMode), ``dtype_meta``
    (QuantDtypeMeta), ``scale`` (float32 tensor, scalar or ``[C]`` per
    channel), ``zero_point`` (float32 tensor of integer values, or None for
    symmetric) and ``axis`` (the channel axis of a per-channel scale, else
    None; beyond MegEngine, as ONNX's ``axis``)."""

    __slots__ = ("mode", "dtype_meta", "scale", "zero_point", "axis")
    _FIELDS = __slots__

    def __init__(self, mode, dtype_meta, scale, zero_point, axis=None):
        self.mode = mode
        self.dtype_meta = dtype_meta
        self.scale = scale
        self.zero_point = zero_point
        self.axis = axis

    def update(self, qparams):
        """Copy every slot of ``qparams`` into self."""
        for key in self._FIELDS:
            setattr(self, key, getattr(qparams, key))

    def __eq__(self, other):
        if type(self) is not type(other):
            return NotImplemented
        return all(_same(getattr(self, k), getattr(other, k)) if k in ("scale", "zero_point",
                                                                      "grad_scale")
                   else getattr(self, k) == getattr(other, k) for k in self._FIELDS)

    __hash__ = None

    def __repr__(self):
        return f"{type(self).__name__}(" + ", ".join(
            f"{k}={getattr(self, k)!r}" for k in self._FIELDS) + ")"


class LSQParams(QParams):
    """QParams with LSQ's gradient scale ``grad_scale``."""

    __slots__ = ("grad_scale",)
    _FIELDS = QParams._FIELDS + ("grad_scale",)

    def __init__(self, mode, dtype_meta, scale, zero_point, grad_scale, axis=None):
        super().__init__(mode, dtype_meta, scale, zero_point, axis)
        self.grad_scale = grad_scale


def create_qparams(mode=QuantMode.SYMMERTIC, dtype_meta=None, scale=None, zero_point=None,
                   axis=None):
    """QParams from a mode, a dtype (name or QuantDtypeMeta), a scale and a
    zero point (plain numbers or arrays are made float32 tensors)."""
    if mode is not None and not isinstance(mode, QuantMode):
        raise QuantizationError(f"mode must be a QuantMode, got {mode!r}")
    if dtype_meta is not None:
        dtype_meta = quant_dtype(dtype_meta)
    return QParams(mode, dtype_meta, _as_tensor(scale, "scale"), _as_tensor(zero_point, "zero_point"), axis)


def _channel_shape(param, x, axis):
    """Reshape a per-channel ``[C]`` tensor to broadcast along ``axis`` of x."""
    if axis is None or param.ndim == 0:
        return param
    axis = axis % x.ndim
    shape = [1] * x.ndim
    shape[axis] = param.shape[0]
    return param.reshape(tuple(shape))


def _fake_quant(x, scale, zero_point, qmin, qmax):
    # the zero point is added even when it is 0: -0.0 + 0.0 is +0.0, so a
    # small negative x dequantizes to +0.0 like the integer 0 it quantizes to
    if zero_point is None:
        zero_point = 0.0
    q = F.clip(F.round(x / scale) + zero_point, float(qmin), float(qmax))
    return (q - zero_point) * scale


def fake_quant_tensor(inp, qparams):
    """Quantize ``inp`` with ``qparams`` and dequantize it back, in float32.

    Args:
        inp: float32 tensor, any shape.
        qparams: QParams with a scale (scalar, or ``[C]`` along
            ``qparams.axis``); the zero point is used only in ASYMMERTIC mode.

    Returns a float32 tensor of inp's shape, bitwise equal to
    ``(clip(rint(x / s) + zp, qmin, qmax) - zp) * s`` computed in NumPy
    float32 (round half to even, see the module docstring).

    For ``qint32`` the computation is float32 too, so values near its ends
    are only as exact as float32 (2**31 - 1 is not a float32); it stands for
    a bias's quantization, not for bitwise int32 work.

    Gradient (under a GradManager): straight through where the rounded
    value lies in ``[qmin, qmax]``, 0 where it saturates (MegEngine's
    FakeQuant backward); none for the scale and zero point.

    Raises QuantizationError when qparams has no scale or no dtype.
    """
    if qparams.scale is None or qparams.dtype_meta is None:
        raise QuantizationError(f"fake_quant_tensor needs qparams with a scale and a dtype, "
                                f"got {qparams!r}")
    meta = qparams.dtype_meta
    scale = _channel_shape(qparams.scale, inp, qparams.axis)
    zp = None
    if qparams.mode in (QuantMode.ASYMMERTIC,) and qparams.zero_point is not None:
        zp = _channel_shape(qparams.zero_point, inp, qparams.axis)
    return _FakeQuantSTE(meta.qmin, meta.qmax)(inp, scale, zp)


def tqt_forward(qmin, qmax, inp, scale):
    """TQT's forward (arXiv:1903.08066): symmetric fake quantization with the
    power-of-two scale ``2 ** scale`` (``scale`` holds log2 of the step).

    Gradients (MegEngine's TQT backward, under a GradManager): with ``v =
    x / 2**scale``, ``dx`` passes where ``qmin - 0.5 <= v <= qmax + 0.5``
    and is 0 outside; ``d scale`` is ``dy * (clip(rint(v)) - v) * 2**scale *
    ln 2`` inside and ``dy * clip(rint(v)) * 2**scale * ln 2`` outside,
    summed to ``scale``'s shape."""
    return _TQT(qmin, qmax)(inp, scale)


def lsq_forward(qmin, qmax, inp, step_size, zero_point=None, scale_grad=None):
    """LSQ's forward (arXiv:1902.08153): fake quantization with the learned
    ``step_size`` and ``zero_point``; ``scale_grad`` only scales the step's
    gradient, so the forward ignores it.

    Gradients: with ``u = x / step + zp``, ``dx`` passes where ``qmin <= u
    <= qmax``; ``d step`` is ``dy * scale_grad * (rint(u) - u)`` inside and
    ``dy * scale_grad * (qmin - zp)`` (or ``qmax - zp``) outside, summed to
    the step's shape: the exact derivative of the forward under the
    straight-through rounding. MegEngine's kernel uses ``qmin``/``qmax``
    outside, which differs only for a nonzero zero point. The zero point
    gets no gradient."""
    return _LSQ(qmin, qmax)(inp, step_size, zero_point, scale_grad)


# ----------------------------------------------------------------- gradients
# Fake quantization's backward rules, as autodiff Functions: the forward is
# _fake_quant (so it stays bitwise the quantize-dequantize it always was);
# rounding passes gradients straight through (STE) inside the range.

def _reduce_to(g, like):
    """``g`` summed to the shape of ``like`` (a scalar or broadcastable)."""
    if like.ndim == 0:
        return g.sum()
    axes = tuple(i for i in range(g.ndim) if i >= g.ndim - like.ndim
                 and like.shape[i - (g.ndim - like.ndim)] == 1 and g.shape[i] != 1)
    lead = tuple(range(g.ndim - like.ndim))
    if lead:
        g = g.sum(axis=lead)
    axes = tuple(a - len(lead) for a in axes)
    if axes:
        g = g.sum(axis=axes, keepdims=True)
    return g


def _function_base():
    from mgtrace.autodiff import Function
    return Function


class _LazyFunction:
    """A Function subclass made on first use (mgtrace.autodiff imports the
    core only, but keeping it out of import time keeps the layers plain)."""

    def __init__(self, make):
        self.make = make
        self.cls = None

    def __call__(self, *args):
        if self.cls is None:
            self.cls = self.make(_function_base())
        return self.cls(*args)


def _make_fake_quant(Function):
    class FakeQuantSTE(Function):
        """Fake quantization with observer qparams: ``dx = dy`` where
        ``qmin <= rint(x / s) + zp <= qmax`` (MegEngine's FakeQuant
        backward), else 0; no gradient for the scale or zero point."""

        def __init__(self, qmin, qmax):
            self.qmin, self.qmax = float(qmin), float(qmax)

        def forward(self, x, scale, zero_point):
            self.x, self.scale, self.zp = x, scale, zero_point
            return _fake_quant(x, scale, zero_point, self.qmin, self.qmax)

        def backward(self, dy):
            zp = 0.0 if self.zp is None else self.zp
            q = F.round(self.x / self.scale) + zp
            inside = ((q >= self.qmin) & (q <= self.qmax)).astype("float32")
            return dy * inside, None, None
    return FakeQuantSTE


def _make_tqt(Function):
    class TQTFunction(Function):
        def __init__(self, qmin, qmax):
            self.qmin, self.qmax = float(qmin), float(qmax)

        def forward(self, x, scale):
            self.x, self.scale = x, scale
            return _fake_quant(x, 2.0 ** scale, None, self.qmin, self.qmax)

        def backward(self, dy):
            t = 2.0 ** self.scale
            v = self.x / t
            q = F.clip(F.round(v), self.qmin, self.qmax)
            clipped = ((v < self.qmin - 0.5) | (v > self.qmax + 0.5)).astype("float32")
            inside = 1.0 - clipped
            per = dy * (inside * (q - v) + clipped * q) * t * float(np.log(2.0))
            return dy * inside, _reduce_to(per, self.scale)
    return TQTFunction


def _make_lsq(Function):
    class LSQFunction(Function):
        def __init__(self, qmin, qmax):
            self.qmin, self.qmax = float(qmin), float(qmax)

        def forward(self, x, step, zero_point, grad_scale):
            self.x, self.step, self.zp, self.gs = x, step, zero_point, grad_scale
            return _fake_quant(x, step, zero_point, self.qmin, self.qmax)

        def backward(self, dy):
            zp = 0.0 if self.zp is None else self.zp
            u = self.x / self.step + zp
            small = (u < self.qmin).astype("float32")
            big = (u > self.qmax).astype("float32")
            inside = 1.0 - small - big
            d = inside * (F.round(u) - u) + small * (self.qmin - zp) + big * (self.qmax - zp)
            per = dy * d
            if self.gs is not None:
                per = per * self.gs
            return dy * inside, _reduce_to(per, self.step), None, None
    return LSQFunction


_FakeQuantSTE = _LazyFunction(_make_fake_quant)
_TQT = _LazyFunction(_make_tqt)
_LSQ = _LazyFunction(_make_lsq)
