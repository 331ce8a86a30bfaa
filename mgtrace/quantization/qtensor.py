"""Quantized tensors: integer tensors that carry their quantization
parameters, as MegEngine's quantized dtypes carry scale and zero point.

A :class:`QuantizedTensor` is an mgtrace Tensor of the storage dtype
(int8 for ``qint8``/``qint8_narrow``/``qint4``, uint8 for ``quint8``/
``quint4``, int32 for ``qint32``) with ``qparams`` (a :class:`QParams`:
dtype, mode, scale and, for unsigned dtypes, zero point). Signed means
symmetric, unsigned asymmetric, as MegEngine. Arithmetic on one is refused
with a :class:`QuantizationError` naming both operands' dtypes: the
integers alone mean nothing; use :func:`dequantize`, or the modules of
:mod:`mgtrace.module.quantized`, which compute with int8 kernels. The
layout methods ``reshape``, ``flatten``, ``transpose`` and indexing keep
the qparams (per-tensor ones): their results are core Tensors tagged with
them (:func:`is_quantized`), so that a trace records them as the core ops
they are; a second layout op on such a result (a plain Tensor) drops
them.

Here, not in the tensor core: a core dtype with metadata is future work,
so core ops applied directly (``F.relu(qt)``) see the integers and return a
plain Tensor.
"""
import numpy as np

from mgtrace._core import Tensor
from mgtrace.quantization.utils import (QParams, QuantMode, QuantizationError, create_qparams,
                                        quant_dtype)

__all__ = ["QuantizedTensor", "quantize", "dequantize", "is_quantized"]


def is_quantized(t):
    """Whether ``t`` is a Tensor carrying qparams: a QuantizedTensor, or the
    result of one's ``reshape``/``flatten``/``transpose``/indexing."""
    return isinstance(t, Tensor) and t.__dict__.get("qparams") is not None


def _describe(v):
    if isinstance(v, QuantizedTensor):
        return v.dtype_name
    dt = getattr(v, "dtype", None)
    return str(dt) if dt is not None else type(v).__name__


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
        return t

    @property
    def dtype_name(self):
        """``"qint8(scale=0.05)"``, ``"quint8(scale=0.1, zero_point=128)"``."""
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

    # layout methods keep the qparams (per-tensor ones: a per-channel axis
    # would move); the integers are only rearranged
    def _same_qparams(self, out, what):
        # the result is the core's Tensor (the same object a trace records),
        # tagged with the qparams: is_quantized() and the quantized modules read them
        q = self.__dict__.get("qparams")
        if q is not None and q.axis is not None and np.ndim(q.scale.numpy()):
            raise QuantizationError(f"{what} of a per-channel quantized tensor: dequantize first")
        out.__dict__["qparams"] = q
        return out

    def reshape(self, *shape):
        return self._same_qparams(Tensor.reshape(self, *shape), "reshape")

    def flatten(self, start_axis=0, end_axis=-1):
        return self._same_qparams(Tensor.flatten(self, start_axis, end_axis), "flatten")

    def transpose(self, *axes):
        return self._same_qparams(Tensor.transpose(self, *axes), "transpose")

    def __getitem__(self, index):
        return self._same_qparams(Tensor.__getitem__(self, index), "indexing")

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
    missing scale or an unknown dtype.
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
    v = np.asarray(x.numpy() if isinstance(x, Tensor) else x, np.float32)
    s = np.asarray(qparams.scale.numpy(), np.float32)
    z = np.float32(0) if qparams.zero_point is None or qparams.mode != QuantMode.ASYMMERTIC \
        else np.asarray(qparams.zero_point.numpy(), np.float32)
    if qparams.axis is not None and s.ndim:
        shape = [1] * v.ndim
        shape[qparams.axis % v.ndim] = s.size
        s = s.reshape(shape)
        z = z.reshape(shape) if np.ndim(z) else z
    q = np.clip(np.rint(v / s) + z, meta.qmin, meta.qmax).astype(meta.np_dtype_str)
    return QuantizedTensor.wrap(q, qparams)


def dequantize(qt):
    """The float32 Tensor ``(q - zero_point) * scale`` of a QuantizedTensor
    (MegEngine's ``astype("float32")``). Raises QuantizationError for a
    tensor without qparams."""
    from mgtrace._core import tensor as _tensor
    q = qt.__dict__.get("qparams") if isinstance(qt, Tensor) else None
    if q is None:
        raise QuantizationError(f"dequantize takes a QuantizedTensor, got {_describe(qt)}")
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
