"""Quantized dtypes: MegEngine's ``qint8(scale)``, ``quint8(scale,
zero_point)``... as NumPy dtypes of the storage type carrying the scale
(and zero point) in MegEngine's metadata, and tensors of them.

A quantized dtype is what ``megengine.core.tensor.dtype.qint8(0.1)`` is: a
NumPy dtype of the storage type (int8 for ``qint8``/``qint8_narrow``/
``qint4``, uint8 for ``quint8``/``quint4``, int32 for ``qint32``) whose
``metadata`` is ``{"mgb_dtype": {"name": "QuantizedS8", "scale": 0.1}}``
(``"zero_point"`` too for the unsigned ones), so ``qint8(0.1) == "int8"``
holds as in MegEngine; :func:`is_quantize`, :func:`get_scale` and
:func:`get_zero_point` read it, :func:`same_dtype` compares it whole.
``qint8_narrow`` (-127..127, for weights), which MegEngine cannot tell from
qint8 once it is a dtype, adds ``"mgtrace": "qint8_narrow"``.

A quantized tensor is a core Tensor of the storage dtype whose ``dtype``
is the quantized one: the core keeps that dtype through every layout op
(reshape, flatten, transpose, expand_dims, squeeze, broadcast_to, indexing,
copy, to; ``F.concat`` of inputs of one quantized dtype) and refuses
elementwise arithmetic on it with a :class:`QuantizationError` naming the
dtypes, as every other core op that computes does (matmul, conv, pooling,
reductions, sort, gather, a cast to another dtype; setitem takes a value of
the tensor's own quantized dtype only). Convert with ``x.astype(dtype)``,
:func:`quantize` / :func:`dequantize` (also ``mgtrace.functional``'s
``quantize``/``dequantize``), or run it through
:mod:`mgtrace.module.quantized`.

Signed dtypes are symmetric (zero point 0), unsigned asymmetric, as
MegEngine. Rounding is the package's one rule, round half to even
(``q = clip(rint(x / scale) + zero_point, qmin, qmax)`` in float32);
MegEngine's ``astype`` rounds half away from zero (0.25 at scale 0.1 gives
3 there, 2 here). Per-channel scales are not dtypes (MegEngine has none):
they live on :class:`~mgtrace.quantization.QuantizedTensor` weights.

>>> import numpy as np, mgtrace as mt
>>> from mgtrace.quantization import qint8, get_scale
>>> q = mt.tensor(np.array([0.1, 0.25, -1.3], np.float32)).astype(qint8(0.1))
>>> q.numpy().tolist(), str(q.reshape(3, 1).T.dtype), round(get_scale(q.dtype), 6)
([1, 2, -13], 'int8', 0.1)
>>> q.astype("float32").numpy().tolist() == np.float32([0.1, 0.2, -1.3]).tolist()
True
"""
import numpy as np

from mgtrace._core import Tensor, empty_tensor, tensor as _tensor
from mgtrace._core.dtype import as_dtype, qdtype_name, qdtype_str
from mgtrace.quantization.utils import (QUANT_DTYPES, QuantizationError,
                                        QuantMode, create_qparams, quant_dtype)

__all__ = ["create_quantized_dtype", "qint8", "qint8_narrow", "quint8", "qint32", "qint4",
           "quint4", "is_quantize", "get_scale", "get_zero_point", "quantized_meta",
           "same_dtype", "quantize", "dequantize", "int_repr", "qdtype_str"]


def create_quantized_dtype(dtype_meta, scale, zero_point=None):
    """The quantized NumPy dtype of ``dtype_meta`` (a QuantDtypeMeta or a
    name in :data:`QUANT_DTYPES`) with ``scale`` (a positive finite number,
    kept as its float32 value) and, for unsigned dtypes, ``zero_point`` (an
    integer in ``[qmin, qmax]``). MegEngine's ``create_quantized_dtype``.

    Raises QuantizationError for an unknown dtype, a bad scale, a missing or
    out-of-range zero point, or a zero point given to a signed dtype."""
    meta = quant_dtype(dtype_meta)
    s = float(np.float32(_number(scale, "scale")))
    if not (np.isfinite(s) and s > 0):
        raise QuantizationError(f"{meta.name}: scale must be positive and finite, got {scale!r}")
    mgb = {"name": meta.cname, "scale": s}
    if meta.is_unsigned:
        if zero_point is None:
            raise QuantizationError(f"{meta.name} is asymmetric: give a zero_point "
                                    f"({meta.qmin}..{meta.qmax})")
        z = _number(zero_point, "zero_point")
        # NaN / inf first: int() of them leaked a bare ValueError / OverflowError
        if not np.isfinite(z) or z != int(z) or not meta.qmin <= z <= meta.qmax:
            raise QuantizationError(f"{meta.name}: zero_point must be an integer in "
                                    f"{meta.qmin}..{meta.qmax}, got {zero_point!r}")
        mgb["zero_point"] = int(z)
    elif zero_point not in (None, 0):
        raise QuantizationError(f"{meta.name} is symmetric: zero point 0, got {zero_point!r}")
    metadata = {"mgb_dtype": mgb}
    if meta.name == "qint8_narrow":
        metadata["mgtrace"] = meta.name
    return np.dtype(meta.np_dtype_str, metadata=metadata)


def _number(v, what):
    if isinstance(v, Tensor):
        v = v.numpy()
    a = np.asarray(v)
    if a.dtype == np.bool_:
        raise QuantizationError(f"a quantized dtype's {what} is a number, got {v!r}")
    if a.size != 1:
        raise QuantizationError(f"a quantized dtype's {what} is one number (per-tensor), got "
                                f"shape {a.shape}")
    return a.reshape(()).item()


def qint8(scale):
    """``qint8`` with ``scale``: int8 storage, -128..127, symmetric."""
    return create_quantized_dtype("qint8", scale)


def qint8_narrow(scale):
    """``qint8_narrow`` with ``scale``: int8 storage, -127..127 (weights)."""
    return create_quantized_dtype("qint8_narrow", scale)


def quint8(scale, zero_point):
    """``quint8`` with ``scale`` and ``zero_point``: uint8 storage, 0..255."""
    return create_quantized_dtype("quint8", scale, zero_point)


def qint32(scale):
    """``qint32`` with ``scale``: int32 storage (biases, accumulators)."""
    return create_quantized_dtype("qint32", scale)


def qint4(scale):
    """``qint4`` with ``scale``: -8..7, stored one per int8 (not packed)."""
    return create_quantized_dtype("qint4", scale)


def quint4(scale, zero_point):
    """``quint4`` with ``scale`` and ``zero_point``: 0..15, one per uint8."""
    return create_quantized_dtype("quint4", scale, zero_point)


def is_quantize(dtype):
    """Whether ``dtype`` is a quantized dtype (MegEngine's ``is_quantize``)."""
    return qdtype_name(dtype) is not None


def quantized_meta(dtype):
    """The :class:`QuantDtypeMeta` of a quantized dtype. Raises
    QuantizationError for any other dtype."""
    name = qdtype_name(dtype)
    if name is None:
        raise QuantizationError(f"{qdtype_str(dtype)} is not a quantized dtype")
    return QUANT_DTYPES[name]


def get_scale(dtype):
    """The scale (a float) of a quantized dtype (MegEngine's ``get_scale``)."""
    quantized_meta(dtype)
    return dtype.metadata["mgb_dtype"]["scale"]


def get_zero_point(dtype):
    """The zero point (an int; 0 for symmetric dtypes) of a quantized dtype
    (MegEngine's ``get_zero_point``, which refuses signed ones)."""
    quantized_meta(dtype)
    return int(dtype.metadata["mgb_dtype"].get("zero_point", 0))


def same_dtype(a, b):
    """Whether two dtypes are equal including quantized name, scale and zero
    point (NumPy's ``==`` ignores the metadata: ``qint8(0.1) == qint8(0.2)``)."""
    na, nb = qdtype_name(a), qdtype_name(b)
    if na is None or nb is None:
        return na is nb and np.dtype(a) == np.dtype(b)
    return na == nb and get_scale(a) == get_scale(b) and get_zero_point(a) == get_zero_point(b)


def common_dtype(fn, tensors):
    """The one quantized dtype of ``tensors`` (for ``fn``, e.g. concat).
    Raises QuantizationError naming the dtypes when they differ or some are
    not quantized."""
    first = tensors[0].dtype
    for t in tensors[1:]:
        if not same_dtype(first, t.dtype):
            raise QuantizationError(
                f"{fn}: cannot join {qdtype_str(first)} and {qdtype_str(t.dtype)}: quantized "
                "inputs must share one quantized dtype (requantize with x.astype(dtype), or "
                "use mgtrace.module.quantized.Concat)")
    if qdtype_name(first) is None:
        raise QuantizationError(f"{fn}: cannot join {qdtype_str(first)} and a quantized tensor")
    return first


def dtype_of_qparams(qparams):
    """The quantized dtype of per-tensor ``qparams``, or None for per-channel ones."""
    s = np.asarray(qparams.scale.numpy() if isinstance(qparams.scale, Tensor)
                   else qparams.scale)
    if s.size != 1 or (qparams.axis is not None and s.ndim):
        return None
    meta = qparams.dtype_meta
    if not meta.is_unsigned and qparams.mode == QuantMode.ASYMMERTIC \
            and qparams.zero_point is not None and _number(qparams.zero_point, "zero_point"):
        return None         # a signed dtype with a zero point: no MegEngine dtype says that
    zp = None
    if meta.is_unsigned:
        zp = 0 if qparams.zero_point is None or qparams.mode != QuantMode.ASYMMERTIC \
            else _number(qparams.zero_point, "zero_point")
    return create_quantized_dtype(meta, s, zp)


def qparams_of_dtype(dtype):
    """QParams (mode, meta, scale, zero point) of a quantized dtype."""
    meta = quantized_meta(dtype)
    if meta.is_unsigned:
        return create_qparams(QuantMode.ASYMMERTIC, meta, get_scale(dtype),
                              float(get_zero_point(dtype)))
    return create_qparams(QuantMode.SYMMERTIC, meta, get_scale(dtype))


def tag(t, dtype):
    """``t`` (a Tensor of the storage dtype) marked as holding ``dtype``."""
    meta = quantized_meta(dtype)
    if t.dtype != np.dtype(meta.np_dtype_str):
        raise QuantizationError(f"{meta.name} is stored as {meta.np_dtype_str}, got "
                                f"{qdtype_str(t.dtype)}")
    t._qdtype = dtype
    return t


def _kernels():
    from mgtrace._core import qint8
    return qint8


def _host_float32(x):
    """x as a contiguous float32 CPU Tensor (x itself when it is one)."""
    if not isinstance(x, Tensor):
        return _tensor(np.ascontiguousarray(x, dtype=np.float32))
    if x.device.type != "cpu":
        x = x.to("cpu")
    if x.dtype != np.float32:
        x = x.astype("float32")
    return x.contiguous()


def quantize(x, dtype, out=None):
    """``x`` quantized to ``dtype``: ``clip(rint(x / scale) + zero_point,
    qmin, qmax)`` computed in float32 with round half to even (NumPy's
    arithmetic, bit for bit; a NaN gives qmin), stored as the dtype's
    integers, by one C pass (AVX-512 where the CPU has it).

    Args:
        x: Tensor or array of any real dtype (cast to float32 first); a
            quantized x is dequantized first (a requantization).
        dtype: a quantized dtype (:func:`qint8` ...).
        out: None, or a Tensor class (a subclass of Tensor) to make the
            result an instance of.

    Returns a Tensor of x's shape (on x's device) whose ``dtype`` is
    ``dtype``. Raises QuantizationError when dtype is not quantized.
    """
    meta = quantized_meta(dtype)
    if isinstance(x, Tensor) and x._qdtype is not None:
        x = dequantize(x)
    device = x.device if isinstance(x, Tensor) else None
    xf = _host_float32(x)
    q = empty_tensor(xf.shape, meta.np_dtype_str, cls=out or Tensor)
    _kernels().quantize_into(xf, q, get_scale(dtype), float(get_zero_point(dtype)),
                             float(meta.qmin), float(meta.qmax))
    if device is not None and device.type != "cpu":
        q = q.to(device)
    return tag(q, dtype)


def dequantize(x, dtype="float32"):
    """The real values ``(q - zero_point) * scale`` of quantized ``x``, in
    float32 (then cast to ``dtype``, a float dtype), one C pass.

    Raises QuantizationError when x is not a quantized tensor."""
    q = x.dtype if isinstance(x, Tensor) else None
    if q is None or qdtype_name(q) is None:
        got = qdtype_str(x.dtype) if hasattr(x, "dtype") else type(x).__name__
        raise QuantizationError(f"dequantize takes a quantized tensor, got {got}")
    device = x.device
    src = x if device.type == "cpu" else x.to("cpu")
    src = src.contiguous()
    res = empty_tensor(src.shape, "float32")
    _kernels().dequantize_into(src, res, get_scale(q), float(get_zero_point(q)))
    if device.type != "cpu":
        res = res.to(device)
    return res if as_dtype(dtype) == np.float32 else res.astype(dtype)


def int_repr(x):
    """The integers of quantized ``x`` as a plain Tensor of the storage
    dtype (sharing x's memory; PyTorch's ``int_repr``)."""
    if not isinstance(x, Tensor) or qdtype_name(x.dtype) is None:
        raise QuantizationError("int_repr takes a quantized tensor")
    from mgtrace._core.tensor import share_as
    out = share_as(x, Tensor)
    out._qdtype = None
    return out


def astype(x, dtype):
    """``x.astype(dtype)`` where x or dtype is quantized (the core calls
    this): float -> quantized quantizes, quantized -> float dequantizes,
    quantized -> quantized requantizes through float32. Raises
    QuantizationError for quantized -> a plain integer or bool dtype (use
    :func:`int_repr` for the integers, or dequantize)."""
    import mgtrace.functional as F       # (the traced functions: a trace records the call)
    if is_quantize(dtype):
        return F.quantize(x, dtype)
    target = as_dtype(dtype)
    if target.kind != "f" and target.name != "bfloat16":
        raise QuantizationError(f"astype: {qdtype_str(x.dtype)} to {target.name}: a quantized "
                                "tensor converts to a float dtype or another quantized one "
                                "(mgtrace.quantization.int_repr gives its integers)")
    y = F.dequantize(x)
    return y if target == np.float32 else y.astype(target)
