"""Quantized tensors: integer tensors that carry their quantization
parameters, as MegEngine's quantized dtypes carry scale and zero point.

A per-tensor quantized tensor is a core Tensor whose ``dtype`` is a
quantized dtype (:mod:`mgtrace.quantization.qdtype`): the core keeps it
through layout ops and refuses elementwise arithmetic on it. A
:class:`QuantizedTensor` is such a tensor made by :func:`quantize` or
``QuantizedTensor.wrap``, with ``qparams`` (a :class:`QParams`: dtype,
mode, scale and, for unsigned dtypes, zero point) as well; it may also hold
per-channel qparams (a weight's, along ``qparams.axis``), which no dtype
carries: such a tensor's ``dtype`` is its plain storage dtype, and its
layout methods and arithmetic raise :class:`QuantizationError`.
:func:`qparams_of` reads the qparams of either kind. Signed means
symmetric, unsigned asymmetric, as MegEngine.
"""
import numpy as np

from mgtrace._core import Tensor
from mgtrace.quantization import qdtype as _qd
from mgtrace.quantization.utils import (QuantMode, QuantizationError, check_qparams_values,
                                        create_qparams, quant_dtype)

__all__ = ["QuantizedTensor", "quantize", "dequantize", "is_quantized", "qparams_of"]


def _per_channel(t):
    return t.__dict__.get("qparams") if t._qdtype is None else None


def is_quantized(t):
    """Whether ``t`` is a quantized Tensor: its dtype is a quantized dtype
    (any view or copy of a QuantizedTensor too), or it is a QuantizedTensor
    with per-channel qparams."""
    return isinstance(t, Tensor) and (t._qdtype is not None or _per_channel(t) is not None)


def qparams_of(t):
    """The QParams of quantized tensor ``t`` (from its dtype, or a
    per-channel QuantizedTensor's ``qparams``). Raises QuantizationError
    for any other value."""
    if isinstance(t, Tensor):
        if t._qdtype is not None:
            q = t.__dict__.get("qparams")
            return q if q is not None else _qd.qparams_of_dtype(t._qdtype)
        q = _per_channel(t)
        if q is not None:
            return q
    raise QuantizationError(f"expected a quantized tensor, got {_describe(t)}")


def _describe(v):
    if isinstance(v, QuantizedTensor):
        return v.dtype_name
    dt = getattr(v, "dtype", None)
    return _qd.qdtype_str(dt) if dt is not None else type(v).__name__


class QuantizedTensor(Tensor):
    """An integer Tensor with ``qparams`` (see the module docstring). Build
    one with :func:`quantize`, or ``QuantizedTensor.wrap(int_array,
    qparams)``."""

    @classmethod
    def wrap(cls, data, qparams):
        """A QuantizedTensor holding ``data`` (integers of the storage dtype
        of ``qparams.dtype_meta``) with ``qparams``. Raises
        QuantizationError for another dtype or a missing scale."""
        meta = qparams.dtype_meta
        if meta is None or qparams.scale is None:
            raise QuantizationError(f"a quantized tensor needs qparams with a dtype and a "
                                    f"scale, got {qparams!r}")
        data = np.asarray(data.numpy() if isinstance(data, Tensor) else data)
        if data.dtype != np.dtype(meta.np_dtype_str):
            raise QuantizationError(f"{meta.name} is stored as {meta.np_dtype_str}, got "
                                    f"{data.dtype}")
        t = cls(np.ascontiguousarray(data))
        t.__dict__["qparams"] = qparams
        dt = _qd.dtype_of_qparams(qparams)
        if dt is not None:
            t._qdtype = dt
        return t

    @property
    def dtype_name(self):
        """``"qint8(scale=0.05)"``, ``"quint8(scale=0.1, zero_point=128)"``."""
        if self._qdtype is not None:
            return _qd.qdtype_str(self._qdtype)
        q = self.__dict__.get("qparams")
        if q is None:
            return "quantized (no qparams)"
        s = np.asarray(q.scale.numpy())
        text = f"scale={float(s)}" if s.ndim == 0 else f"{s.size} scales"
        if q.zero_point is not None and q.mode == QuantMode.ASYMMERTIC:
            z = np.asarray(q.zero_point.numpy())
            text += f", zero_point={int(z)}" if z.ndim == 0 else ", per-channel zero points"
        return f"{q.dtype_meta.name}({text})"

    def numpy_float(self):
        """The real values, float32 (``dequantize(self).numpy()``)."""
        return dequantize(self).numpy()

    def __repr__(self):
        return f"QuantizedTensor({self.numpy()!r}, dtype={self.dtype_name})"

    # layout methods: the core keeps a per-tensor dtype (the result is the
    # core's Tensor, the object a trace records); per-channel qparams have
    # an axis that would move, so those refuse
    def _layout(self, what):
        if self._qdtype is None and self.__dict__.get("qparams") is not None:
            raise QuantizationError(f"{what} of a per-channel quantized tensor: dequantize first")

    def reshape(self, *shape):
        self._layout("reshape")
        return Tensor.reshape(self, *shape)

    def flatten(self, start_axis=0, end_axis=-1):
        self._layout("flatten")
        return Tensor.flatten(self, start_axis, end_axis)

    def transpose(self, *axes):
        self._layout("transpose")
        return Tensor.transpose(self, *axes)

    def __getitem__(self, index):
        self._layout("indexing")
        return Tensor.__getitem__(self, index)

    def _refuse(self, other, op):
        raise QuantizationError(
            f"cannot apply {op} to {_describe(self)} and {_describe(other)}: quantized tensors "
            "do not take part in arithmetic (dequantize first with "
            "mgtrace.quantization.dequantize, or use mgtrace.module.quantized)")


def _refusing(op):
    def method(self, other=None):
        self._refuse(other, op)
    method.__name__ = op
    return method


for _op in ("__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__",
            "__truediv__", "__rtruediv__", "__matmul__", "__rmatmul__", "__pow__",
            "__floordiv__", "__mod__", "__iadd__", "__isub__", "__imul__"):
    setattr(QuantizedTensor, _op, _refusing(_op))
del _op


def quantize(x, qparams=None, *, dtype=None, scale=None, zero_point=None):
    """Quantize float ``x`` (a Tensor or array): ``clip(rint(x / scale) +
    zero_point, qmin, qmax)`` in float32, round half to even, stored as the
    dtype's integers: MegEngine's ``astype(quantized dtype)``.

    Args:
        x: float32 values, any shape.
        qparams: QParams (per-tensor, or per-channel along ``axis``); or
            give ``dtype``, ``scale`` (and ``zero_point`` for unsigned).

    Returns a :class:`QuantizedTensor`. Raises QuantizationError for a
    missing scale, an unknown dtype, a scale that is not positive and
    finite, or a zero point that is no integer in ``[qmin, qmax]`` (NaN and
    inf included, per channel too).
    """
    if qparams is None:
        meta = quant_dtype(dtype if dtype is not None else "qint8")
        mode = QuantMode.ASYMMERTIC if meta.is_unsigned else QuantMode.SYMMERTIC
        qparams = create_qparams(mode, meta, scale=scale,
                                 zero_point=zero_point if meta.is_unsigned else None)
    meta = qparams.dtype_meta
    if qparams.scale is None or meta is None:
        raise QuantizationError(f"quantize needs qparams with a scale and a dtype, got "
                                f"{qparams!r}")
    check_qparams_values(qparams)
    dt = _qd.dtype_of_qparams(qparams)
    if dt is not None:          # per-tensor: the core dtype and its C kernel
        t = _qd.quantize(x, dt, out=QuantizedTensor)
        t.__dict__["qparams"] = qparams
        return t
    v = np.asarray(x.numpy() if isinstance(x, Tensor) else x, np.float32)
    s = np.asarray(qparams.scale.numpy(), np.float32)
    z = np.float32(0) if qparams.zero_point is None or qparams.mode != QuantMode.ASYMMERTIC \
        else np.asarray(qparams.zero_point.numpy(), np.float32)
    _check_channels(qparams, v.shape, s, z)
    if qparams.axis is not None and s.ndim:
        shape = [1] * v.ndim
        shape[qparams.axis % v.ndim] = s.size
        s = s.reshape(shape)
        z = z.reshape(shape) if np.ndim(z) else z
    q = np.clip(np.rint(v / s) + z, meta.qmin, meta.qmax).astype(meta.np_dtype_str)
    return QuantizedTensor.wrap(q, qparams)


def _check_channels(qparams, shape, s, z):
    """Per-channel scales: one [C] vector along an int ``axis`` of x whose
    size is C (a wrong count leaked NumPy's broadcast error; axis 5 of a
    2-d x was read as axis 1)."""
    axis, nd = qparams.axis, len(shape)
    if s.ndim == 0 and np.ndim(z) == 0:
        return
    if axis is None or isinstance(axis, bool) or not isinstance(axis, (int, np.integer)) \
            or not -nd <= axis < nd:
        raise QuantizationError(f"per-channel qparams need an int axis of x (ndim {nd}), got "
                                f"axis {axis!r}")
    c = shape[axis % nd]
    for what, v in (("scale", s), ("zero_point", z)):
        if np.ndim(v) and (np.ndim(v) != 1 or np.size(v) != c):
            raise QuantizationError(f"per-channel {what} of shape {np.shape(v)} along axis "
                                    f"{axis} of x {tuple(shape)}: want ({c},)")


def dequantize(qt):
    """The float32 Tensor ``(q - zero_point) * scale`` of a QuantizedTensor
    or of any quantized tensor (MegEngine's ``astype("float32")``). Raises
    QuantizationError for a tensor that is not quantized."""
    from mgtrace._core import tensor as _tensor
    if not is_quantized(qt):
        raise QuantizationError(f"dequantize takes a QuantizedTensor, got {_describe(qt)}")
    if qt._qdtype is not None:
        return _qd.dequantize(qt)
    q = qparams_of(qt)
    v = Tensor.numpy(qt).astype(np.float32)
    s = np.asarray(q.scale.numpy(), np.float32)
    z = np.float32(0) if q.zero_point is None or q.mode != QuantMode.ASYMMERTIC \
        else np.asarray(q.zero_point.numpy(), np.float32)
    if q.axis is not None and s.ndim:
        shape = [1] * v.ndim
        shape[q.axis % v.ndim] = s.size
        s = s.reshape(shape)
        z = z.reshape(shape) if np.ndim(z) else z
    return _tensor(((v - z) * s).astype(np.float32))
