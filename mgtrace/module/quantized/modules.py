"""The quantized modules (see the package docstring)."""
import numpy as np

import mgtrace.functional as F
from mgtrace._core import Tensor, empty_tensor, tensor as _tensor
from mgtrace._core.tensor import unshared_view
from mgtrace.module.module import Module
from mgtrace.quantization import int8
from mgtrace.quantization.qtensor import (QuantizedTensor, dequantize, is_quantized, qparams_of,
                                          quantize)
from mgtrace.quantization import qdtype as _qdtype
from mgtrace.quantization.qdtype import dtype_of_qparams
from mgtrace.quantization.utils import (QuantMode, QuantizationError, check_qparams_values,
                                        create_qparams)

__all__ = ["QuantizedModule", "QuantStub", "DequantStub", "Linear", "LinearRelu", "Conv2d",
           "ConvRelu2d", "ConvBn2d", "ConvBnRelu2d", "Elemwise", "Concat"]


def _act_qparams(qat, required=True):
    q = qat.get_activation_qparams()
    if q is None and not required:
        return None
    if q is None:
        raise QuantizationError(f"{type(qat).__name__} has no activation qparams (no act "
                                "observer or fake quantizer): calibrate it before quantize()")
    if q.dtype_meta.name not in ("qint8", "quint8") or np.ndim(q.scale.numpy()):
        raise QuantizationError(f"quantized modules output per-tensor qint8 or quint8, got "
                                f"{q.dtype_meta.name} with scale shape "
                                f"{tuple(q.scale.shape)}")
    # a NaN / inf range (a NaN seen in calibration) is refused here, naming
    # the layer, not at the first forward
    check_qparams_values(q, f"{type(qat).__name__}'s activation qparams")
    return q


def _zp(q):
    if q.zero_point is None or q.mode != QuantMode.ASYMMERTIC:
        return 0
    return int(np.asarray(q.zero_point.numpy()))


def _act_config(q):
    """``act_qparams`` as plain values (config()): None or {dtype, scale,
    zero_point}."""
    if q is None:
        return None
    return {"dtype": q.dtype_meta.name, "scale": float(np.asarray(q.scale.numpy())),
            "zero_point": _zp(q)}


def _act(value):
    """QParams from a QParams, a config dict or None."""
    if value is None:
        return None
    if not isinstance(value, dict):
        check_qparams_values(value, "act_qparams")
        return value
    if set(value) != {"dtype", "scale", "zero_point"}:
        raise QuantizationError(f"act_qparams as a dict needs dtype, scale and zero_point, "
                                f"got {value!r}")
    from mgtrace.quantization.utils import quant_dtype
    meta = quant_dtype(value["dtype"])
    for key in ("scale", "zero_point"):
        v = value[key]
        if isinstance(v, (str, bytes, bool)) or np.ndim(v) != 0:
            raise QuantizationError(
                f"act_qparams: the {key} is one number (per tensor), got "
                + (f"shape {np.shape(v)}" if np.ndim(v) else repr(v)))
    if not meta.is_unsigned and value["zero_point"] != 0:    # was dropped silently
        raise QuantizationError(f"act_qparams: {meta.name} is symmetric: zero_point 0, got "
                                f"{value['zero_point']!r}")
    if meta.is_unsigned:
        q = create_qparams(QuantMode.ASYMMERTIC, meta, value["scale"], float(value["zero_point"]))
    else:
        q = create_qparams(QuantMode.SYMMERTIC, meta, value["scale"])
    check_qparams_values(q, "act_qparams")
    return q


# the last input's (qparams, (scale, zero point, dtype name)), one tuple
# read at once (threads): consecutive layers mostly read one value's qparams
_LAST_INPUT = [(None, None)]


def _input(x, who):
    q = qparams_of(x) if is_quantized(x) else None
    if q is None:
        raise QuantizationError(f"{who} takes a QuantizedTensor (put a QuantStub before it), "
                                f"got {getattr(x, 'dtype', type(x).__name__)}")
    last = _LAST_INPUT[0]
    if last[0] is q:
        return (_host_view(x),) + last[1]
    s = np.asarray(q.scale.numpy())
    if s.ndim:
        raise QuantizationError(f"{who} takes per-tensor quantized inputs")
    parsed = (float(s), _zp(q), q.dtype_meta.name)
    _LAST_INPUT[0] = (q, parsed)
    return (_host_view(x),) + parsed


def _host_view(x):
    """x's integers as a NumPy array, without a copy where x is a contiguous
    CPU tensor."""
    if x.device.type == "cpu" and x.is_contiguous:
        return unshared_view(x)
    return np.asarray(Tensor.numpy(x))


class QuantizedModule(Module):
    """Base of the quantized modules: ``act_qparams`` (the output's
    QParams) and ``__repr__`` marked ``Quantized.``."""

    def __repr__(self):
        return "Quantized." + super().__repr__()

    def _new_output(self):
        """``(holder, alloc)``: ``alloc(shape, dtype)`` makes the result
        tensor (a QuantizedTensor of ``act_qparams``, or a float32 Tensor)
        and hands the kernel a NumPy view of its memory; ``holder[0]`` is
        then the tensor."""
        holder = []
        q = self.act_qparams

        def alloc(shape, dtype):
            t = empty_tensor(shape, dtype, cls=Tensor if q is None else QuantizedTensor)
            if q is not None:
                t.__dict__["qparams"] = q
                t._qdtype = self._act_dtype()
            holder.append(t)
            return unshared_view(t, True)
        return holder, alloc

    def _act_dtype(self):
        q = self.act_qparams
        key = self.__dict__.get("_act_dtype_key")
        if key is None or key[0] is not q:
            self.__dict__["_act_dtype_key"] = key = (q, dtype_of_qparams(q))
        return key[1]

    @property
    def out_args(self):
        """(scale, zero point, dtype name) of the output; kept while
        ``act_qparams`` stays the same object."""
        q = self.act_qparams
        if q is None:               # no activation quantization: float32 out
            return None, 0, "float32"
        key = self.__dict__.get("_out_args")
        if key is None or key[0] is not q:
            self.__dict__["_out_args"] = key = (
                q, (float(np.asarray(q.scale.numpy())), _zp(q), q.dtype_meta.name))
        return key[1]


class QuantStub(QuantizedModule):
    """Float32 -> QuantizedTensor with the QAT QuantStub's activation qparams
    (``act_qparams``: a QParams, or ``{dtype, scale, zero_point}``)."""

    def __init__(self, act_qparams):
        super().__init__()
        self.act_qparams = _act(act_qparams)

    def config(self):
        return {"act_qparams": _act_config(self.act_qparams)}

    def forward(self, x):
        dt = self._act_dtype() if type(x) is Tensor else None
        if dt is None:
            return quantize(x, self.act_qparams)
        # quantize()'s per-tensor path with the core dtype kept (_act_dtype)
        t = _qdtype.quantize(x, dt, out=QuantizedTensor)
        t.__dict__["qparams"] = self.act_qparams
        return t

    @classmethod
    def from_qat_module(cls, qat):
        return cls(_act_qparams(qat))


class DequantStub(QuantizedModule):
    """QuantizedTensor -> float32 Tensor (a float input passes through; a
    plain int8 / uint8 Tensor is refused: it is a quantized value whose
    qparams a float module dropped)."""

    def config(self):
        return {}

    def forward(self, x):
        if is_quantized(x):
            return dequantize(x)
        dt = getattr(x, "dtype", None)
        if dt is not None and np.dtype(dt) in (np.int8, np.uint8):
            # M.ReLU after a quantized ConvBn2d sees the integers and returns
            # them without qparams: passing them on made the model's output
            # raw int8 (and its ONNX export an int8 output)
            raise QuantizationError(
                f"DequantStub got a plain {np.dtype(dt)} Tensor, not a QuantizedTensor: a "
                f"float module between the quantized layer and this stub saw its integers "
                f"and dropped the qparams (a separate ReLU after a quantized Conv2d / "
                f"ConvBn2d / Linear: use the fused ConvRelu2d / ConvBnRelu2d / LinearRelu "
                f"before quantize_qat, or put a DequantStub before the float module)")
        return x

    @classmethod
    def from_qat_module(cls, qat):
        return cls()


class _Weighted(QuantizedModule):
    """A weight quantized once (int8 buffer ``weight``, float32 buffer
    ``weight_scale``: one or one per output channel), a float32 ``bias``
    (or None), the output's ``act_qparams``: None when the QAT module
    quantized no activation (no act observer or fake quantizer), and then
    the output is the float32 accumulator ``acc * x_scale * w_scale``."""

    relu = False

    def _buffers_for(self, weight_shape, bias, weight_channels, act_qparams):
        """Zeros of the right shapes (an archive or _setup fills them)."""
        self.weight = _tensor(np.zeros(weight_shape, np.int8))
        shape = () if weight_channels is None else (int(weight_channels),)
        self.weight_scale = _tensor(np.ones(shape, np.float32))
        self.bias = _tensor(np.zeros(weight_shape[0], np.float32)) if bias else None
        self.act_qparams = _act(act_qparams)
        self.__dict__["_packed"] = None

    def _weight_config(self):
        return {"bias": self.bias is not None,
                "weight_channels": int(self.weight_scale.shape[0]) if self.weight_scale.ndim
                else None, "act_qparams": _act_config(self.act_qparams)}

    def _setup(self, w_float, w_qparams, bias, act_qparams):
        if w_qparams is None:
            raise QuantizationError(f"{type(self).__name__}: the QAT module has no weight "
                                    "qparams (no weight observer or fake quantizer)")
        if w_qparams.dtype_meta.name not in ("qint8", "qint8_narrow"):
            raise QuantizationError(f"int8 weights are qint8 or qint8_narrow, got "
                                    f"{w_qparams.dtype_meta.name}")
        if w_qparams.mode == QuantMode.ASYMMERTIC and np.any(w_qparams.zero_point.numpy()):
            raise QuantizationError("int8 weights are symmetric (zero point 0)")
        check_qparams_values(w_qparams, f"{type(self).__name__}'s weight qparams")
        w = np.asarray(w_float.numpy() if isinstance(w_float, Tensor) else w_float)
        bad = int(np.size(w) - np.count_nonzero(np.isfinite(w)))
        if bad:     # NaN / inf quantized to arbitrary integers without a word
            raise QuantizationError(f"{type(self).__name__}: the weight has {bad} non-finite "
                                    f"value(s) (NaN or inf); it cannot be quantized")
        wq = quantize(w_float, create_qparams(QuantMode.SYMMERTIC, w_qparams.dtype_meta,
                                              w_qparams.scale, None, w_qparams.axis))
        self.weight = _tensor(np.asarray(wq.numpy()))
        self.weight_scale = _tensor(np.asarray(w_qparams.scale.numpy(), np.float32))
        self.bias = None if bias is None else _tensor(np.asarray(bias.numpy(), np.float32))
        self.act_qparams = act_qparams
        self.__dict__["_packed"] = None

    def _packed_weight(self, groups=1):
        # the tensors themselves (an id of a freed weight was reused by the
        # next one assigned: stale packed weights) and their storages' write
        # counts (an in-place write, m.weight[...] = v, was not seen), and the
        # groups the weight is packed for (a later m.groups change was not seen)
        w, s, b = self.weight, self.weight_scale, self.bias
        key = (w, s, b, w._version, s._version, None if b is None else b._version, int(groups))
        packed = self.__dict__.get("_packed")
        if packed is None or packed[0][0] is not w or packed[0][1] is not s or \
                packed[0][2] is not b or packed[0][3:] != key[3:]:
            self.__dict__["_packed"] = packed = (key, int8.Int8Weight(
                self.weight.numpy(), self.weight_scale.numpy(),
                None if self.bias is None else self.bias.numpy(), groups=groups))
        return packed[1]


class Linear(_Weighted):
    """Int8 ``linear``: QuantizedTensor [..., in_features] -> QuantizedTensor
    [..., out_features] (float32 when ``act_qparams`` is None). Buffers:
    ``weight`` int8 [out, in], ``weight_scale`` float32 (scalar, or
    [weight_channels] per output channel), ``bias`` float32 [out]."""

    def __init__(self, in_features, out_features, bias=True, weight_channels=None,
                 act_qparams=None):
        super().__init__()
        self.in_features, self.out_features = int(in_features), int(out_features)
        self._buffers_for((self.out_features, self.in_features), bias, weight_channels,
                          act_qparams)

    def config(self):
        return dict(in_features=self.in_features, out_features=self.out_features,
                    **self._weight_config())

    def forward(self, x):
        data, s, zp, name = _input(x, type(self).__name__)
        o_s, o_zp, o_dt = self.out_args
        holder, alloc = self._new_output()
        int8.linear(data, s, zp, self._packed_weight(), o_s, o_zp, o_dt, self.relu,
                    x_dtype=name, alloc=alloc)
        return holder[0]

    @classmethod
    def from_qat_module(cls, qat):
        m = cls(qat.in_features, qat.out_features, qat.bias is not None)
        m._setup(qat.weight, qat.get_weight_qparams(), qat.bias, _act_qparams(qat, False))
        return m


class LinearRelu(Linear):
    """``relu`` fused into :class:`Linear`'s saturation."""
    relu = True


class Conv2d(_Weighted):
    """Int8 ``conv2d`` (zeros padding): QuantizedTensor [N, C, H, W] ->
    QuantizedTensor [N, C_out, OH, OW] (float32 when ``act_qparams`` is
    None); any groups, stride, padding, dilation. Buffers as
    :class:`Linear`'s, ``weight`` int8 [C_out, C_in / groups, KH, KW]."""

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0,
                 dilation=1, groups=1, bias=True, weight_channels=None, act_qparams=None):
        super().__init__()
        pair = lambda v: (int(v), int(v)) if np.ndim(v) == 0 else (int(v[0]), int(v[1]))  # noqa: E731
        self.in_channels, self.out_channels = int(in_channels), int(out_channels)
        self.kernel_size, self.stride = pair(kernel_size), pair(stride)
        self.padding, self.dilation, self.groups = pair(padding), pair(dilation), int(groups)
        if self.groups < 1 or self.in_channels % self.groups or self.out_channels % self.groups:
            raise QuantizationError(f"Conv2d: {in_channels} -> {out_channels} channels do not "
                                    f"split into {groups} groups")
        self._buffers_for((self.out_channels, self.in_channels // self.groups)
                          + self.kernel_size, bias, weight_channels, act_qparams)

    def config(self):
        return dict(in_channels=self.in_channels, out_channels=self.out_channels,
                    kernel_size=self.kernel_size, stride=self.stride, padding=self.padding,
                    dilation=self.dilation, groups=self.groups, **self._weight_config())

    def forward(self, x):
        data, s, zp, name = _input(x, type(self).__name__)
        weight = self._packed_weight(self.groups)
        # the checked call for this input (int8._conv2d_plan), kept while the
        # input's shape and qparams, the weight, act_qparams and relu stay
        key = (data.shape, data.dtype, s, zp, name, self.relu, self.stride, self.padding,
               self.dilation)
        held = self.__dict__.get("_plan")
        if held is None or held[0] != key or held[1] is not weight or \
                held[2] is not self.act_qparams:
            o_s, o_zp, o_dt = self.out_args
            plan = int8._conv2d_plan(data.shape, data.dtype, s, zp, weight, o_s, o_zp, o_dt,
                                    self.relu, self.stride, self.padding, self.dilation, name)
            self.__dict__["_plan"] = held = (key, weight, self.act_qparams, plan)
        plan = held[3]
        holder, alloc = self._new_output()
        plan(data, alloc(plan.out_shape, plan.out_dtype))
        return holder[0]

    @classmethod
    def _like(cls, conv):
        if getattr(conv, "padding_mode", "zeros") != "zeros":
            raise QuantizationError(f"quantized Conv2d pads with zeros only, got "
                                    f"padding_mode={conv.padding_mode!r}")
        return cls(conv.in_channels, conv.out_channels, conv.kernel_size, conv.stride,
                   conv.padding, conv.dilation, conv.groups)

    @classmethod
    def from_qat_module(cls, qat):
        m = cls._like(qat)
        m._setup(qat.weight, qat.get_weight_qparams(), qat.bias, _act_qparams(qat, False))
        return m


class ConvRelu2d(Conv2d):
    """``relu`` fused into :class:`Conv2d`'s saturation."""
    relu = True


class ConvBn2d(Conv2d):
    """A QAT ConvBn2d in its eval form: the BatchNorm folded into the weight
    (``w * k``) and bias (``beta + k * (b - running_mean)``)."""

    @classmethod
    def from_qat_module(cls, qat):
        m = cls._like(qat.conv)
        k, beta, mean = qat._fold()
        w = qat.conv.weight * k.reshape((-1, 1, 1, 1))
        b = qat.conv.bias if qat.conv.bias is not None else F.zeros_like(mean)
        m._setup(w, qat.get_weight_qparams(), beta + k * (b - mean),
                 _act_qparams(qat, False))
        return m


class ConvBnRelu2d(ConvBn2d):
    """``relu`` fused into :class:`ConvBn2d`'s saturation."""
    relu = True


# the Elemwise methods that run on the integers: method -> fused ReLU
_INT_ADD = {"add": False, "fuse_add_relu": True}


def _qint8():
    from mgtrace._core import qint8
    return qint8


class Elemwise(QuantizedModule):
    """MegEngine's quantized Elemwise: the float method of
    :class:`mgtrace.module.Elemwise` on the dequantized inputs, the result
    quantized with ``act_qparams``."""

    def __init__(self, method, act_qparams):
        super().__init__()
        from mgtrace.module import Elemwise as FloatElemwise
        self.__dict__["float_op"] = FloatElemwise(method)     # a helper, not a child
        self.method = self.float_op.method
        self.act_qparams = _act(act_qparams)

    def config(self):
        return {"method": self.method, "act_qparams": _act_config(self.act_qparams)}

    def forward(self, *inps):
        relu = _INT_ADD.get(self.method.lower())
        if relu is not None and len(inps) == 2:
            out = self._add_on_integers(inps[0], inps[1], relu)
            if out is not None:
                return out
        xs = [dequantize(x) if is_quantized(x) else x for x in inps]
        return quantize(self.float_op(*xs), self.act_qparams)

    def _add_on_integers(self, a, b, relu):
        """``add`` / ``fuse_add_relu`` of two per-tensor quantized CPU
        tensors of one shape in one C pass (qelemwise.c), the same bits as
        the dequantize / add / quantize passes; None where that does not
        apply (broadcasting, per-channel qparams, another device, 4-bit or
        int32 storage), and the float path runs."""
        out_dt = self._act_dtype() if self.act_qparams is not None else None
        if out_dt is None or not isinstance(a, Tensor) or not isinstance(b, Tensor):
            return None
        if a.shape != b.shape or a.device.type != "cpu" or b.device.type != "cpu" or \
                not a.is_contiguous or not b.is_contiguous:
            return None
        da, db = a._qdtype, b._qdtype
        if da is None or db is None:
            return None
        metas = [_qdtype.quantized_meta(d) for d in (da, db, out_dt)]
        if any(m.np_dtype_str not in ("int8", "uint8") for m in metas):
            return None
        holder, alloc = self._new_output()
        alloc(tuple(a.shape), metas[2].np_dtype_str)
        _qint8().add_into(a, b, holder[0], _qdtype.get_scale(da),
                          float(_qdtype.get_zero_point(da)), _qdtype.get_scale(db),
                          float(_qdtype.get_zero_point(db)), _qdtype.get_scale(out_dt),
                          float(_qdtype.get_zero_point(out_dt)), float(metas[2].qmin),
                          float(metas[2].qmax), relu)
        return holder[0]

    @classmethod
    def from_qat_module(cls, qat):
        return cls(qat.method, _act_qparams(qat))


class Concat(QuantizedModule):
    """``concat`` of quantized inputs, each requantized to ``act_qparams``
    (MegEngine's quantized Concat), exactly as dequantizing in float32 and
    quantizing: ``clamp(rint(((q - zp) * scale) / out_scale) + out_zp)``.

    Per-tensor quantized CPU inputs of int8 / uint8 storage and one shape
    but along ``axis`` run on the integers in one C pass (qelemwise.c: a
    256-entry table per input, a plain copy where an input has the output's
    qparams), the same bits; other inputs (float, per-channel, 4-bit,
    other devices) take the dequantize / concat / quantize passes."""

    def __init__(self, act_qparams):
        super().__init__()
        self.act_qparams = _act(act_qparams)

    def config(self):
        return {"act_qparams": _act_config(self.act_qparams)}

    def forward(self, inps, axis=0):
        out = self._concat_on_integers(inps, axis)
        if out is not None:
            return out
        xs = [dequantize(x) if is_quantized(x) else x for x in inps]
        return quantize(F.concat(xs, axis), self.act_qparams)

    def _concat_on_integers(self, inps, axis):
        """The C path, or None where it does not apply."""
        out_dt = self._act_dtype() if self.act_qparams is not None else None
        if out_dt is None or not isinstance(inps, (list, tuple)) or not inps or \
                not all(isinstance(x, Tensor) and x._qdtype is not None for x in inps):
            return None
        if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)):
            return None
        shape0 = tuple(inps[0].shape)
        nd = len(shape0)
        if not -nd <= axis < nd:
            return None
        axis = int(axis) % nd
        for x in inps:
            shape = tuple(x.shape)
            if len(shape) != nd or shape[:axis] != shape0[:axis] or \
                    shape[axis + 1:] != shape0[axis + 1:] or x.device.type != "cpu":
                return None
        dts = [x._qdtype for x in inps]
        metas = [_qdtype.quantized_meta(d) for d in dts + [out_dt]]
        if any(m.np_dtype_str not in ("int8", "uint8") for m in metas):
            return None
        shape = shape0[:axis] + (sum(int(x.shape[axis]) for x in inps),) + shape0[axis + 1:]
        holder, alloc = self._new_output()
        alloc(shape, metas[-1].np_dtype_str)
        if 0 in shape:
            return holder[0]
        outer = int(np.prod(shape0[:axis], dtype=np.int64))
        xs = [x if x.is_contiguous else x.contiguous() for x in inps]
        _qint8().concat_into(xs, [_qdtype.get_scale(d) for d in dts],
                             [float(_qdtype.get_zero_point(d)) for d in dts], outer, holder[0],
                             _qdtype.get_scale(out_dt), float(_qdtype.get_zero_point(out_dt)),
                             float(metas[-1].qmin), float(metas[-1].qmax))
        return holder[0]

    @classmethod
    def from_qat_module(cls, qat):
        return cls(_act_qparams(qat))
