"""Quantized and QAT modules as QDQ ONNX: QuantizeLinear / DequantizeLinear
around the float ops (the form ONNX Runtime's quantizer writes and fuses
into its integer kernels).

* ``mgtrace.module.quantized``: a quantized tensor is its integers in the
  ONNX graph (int8 for qint8, uint8 for quint8), the V carrying its
  per-tensor :class:`Q`. A weighted layer is ``DequantizeLinear`` of its
  int8 weight (per-tensor, or per output channel along axis 0), of its
  input and of its bias as int32 at ``x_scale * w_scale`` (the bias of
  mgtrace's int8 kernels, ``rint(bias / (x_scale * w_scale))``), the float
  op (Gemm / MatMul / Conv), Relu where fused, and ``QuantizeLinear`` to
  the output's qparams (none when the layer outputs float). QuantStub is a
  QuantizeLinear, DequantStub a DequantizeLinear, Elemwise and Concat the
  float op between them.
* ``mgtrace.module.qat``: each fake quantization (``fq(x) = (clip(rint(x /
  s) + z) - z) * s``) is a QuantizeLinear + DequantizeLinear pair on
  activations; a fake-quantized weight is quantized at export (an int8
  initializer) and dequantized in the graph.

Rounding is the same rule on both sides (round half to even). ONNX
Runtime computes the requantization in float32 where mgtrace's int8
kernels use float64, so an int8 output may differ from mgtrace's by one
quantum where the real value lies within float32 rounding of a half.

Every read of a quantized module's quantization parameters goes through
:func:`qparams` and :func:`weight_of` (the tensor type behind them may
change; this is the one place that knows it).
"""
from typing import NamedTuple

import numpy as np

from mgtrace.onnx._builder import V

__all__ = ["Q", "qparams", "weight_of", "convert_module", "keeps_qparams"]


class Q(NamedTuple):
    """Per-tensor quantization of a graph value: ``scale`` (float32),
    ``zero_point`` (a NumPy scalar of the storage dtype: int8 or uint8) and
    the mgtrace dtype name."""
    scale: np.float32
    zero_point: np.generic
    dtype: str


# ---------------------------------------------------------------- adapter
def qparams(q, what, per_tensor=True):
    """A QParams (``mgtrace.quantization.QParams``) as plain NumPy values:
    ``(scale float32 array, zero_point array of the storage dtype, dtype
    name, qmin, qmax, axis)``; or, with ``per_tensor``, a :class:`Q`
    (refusing per-channel qparams and dtypes ONNX's QuantizeLinear does not
    saturate to: only qint8 and quint8). None gives None. ``what`` names
    the value in errors."""
    from mgtrace.onnx._builder import ExportError
    from mgtrace.quantization.utils import QuantMode
    if q is None:
        return None
    meta = q.dtype_meta
    scale = np.asarray(q.scale.numpy(), np.float32)
    storage = np.dtype(meta.np_dtype_str)
    if q.zero_point is not None and q.mode == QuantMode.ASYMMERTIC:
        zp = np.asarray(q.zero_point.numpy()).astype(np.float64)
        zp = np.rint(zp).astype(storage)
    else:
        zp = np.zeros(scale.shape, storage)
    if not per_tensor:
        return scale, zp, meta.name, meta.qmin, meta.qmax, q.axis
    if scale.ndim:
        raise ExportError(f"{what}: per-channel quantized activations have no QDQ form here "
                          f"(QuantizeLinear's per-axis scales are for weights)")
    if meta.name not in ("qint8", "quint8"):
        raise ExportError(f"{what}: {meta.name} has no ONNX QuantizeLinear form (int8 and "
                          f"uint8 saturate to the full range; qint8 and quint8 export)")
    return Q(np.float32(scale), storage.type(zp), meta.name)


def weight_of(m):
    """A quantized weighted module's state for export: ``(weight int8
    array, weight_scale float32 array (0-d or [C_out]), bias float32 array
    or None, output Q or None)``."""
    bias = None if m.bias is None else np.asarray(m.bias.numpy(), np.float32)
    return (np.asarray(m.weight.numpy()), np.asarray(m.weight_scale.numpy(), np.float32), bias,
            qparams(m.act_qparams, f"{type(m).__name__}'s output"))


# ------------------------------------------------------------------- nodes
def _scalar(b, q):
    return b.const(np.asarray(q.scale, np.float32)), b.const(np.asarray(q.zero_point))


def quantize(b, x, q, shape):
    """QuantizeLinear of float ``x`` to ``q``: the integers, as a V carrying q."""
    s, z = _scalar(b, q)
    b.qdq.add(("q", z.dtype.name))
    y = b.op("QuantizeLinear", [b.cast(x, np.float32), s, z], z.dtype, shape)
    y.q = q
    return y


def dequantize(b, x):
    """DequantizeLinear of quantized V ``x`` (float32); a float V passes."""
    if x.q is None:
        return x
    s, z = _scalar(b, x.q)
    b.qdq.add(("q", z.dtype.name))
    return b.op("DequantizeLinear", [x, s, z], np.float32, x.shape)


def _dq_array(b, data, scale, name, axis=0):
    """DequantizeLinear of integer initializer ``data`` (named ``name``)
    with ``scale`` (0-d, or 1-d along ``axis``): zero points 0."""
    w = b.const(data, name=name)
    s = b.const(np.asarray(scale, np.float32))
    z = b.const(np.zeros(np.shape(scale), data.dtype))
    b.qdq.add(("dq", z.dtype.name))
    return b.op("DequantizeLinear", [w, s, z], np.float32, data.shape,
                axis=axis if np.ndim(scale) else None)


def _fake_quant(b, x, q):
    """fq(x): QuantizeLinear + DequantizeLinear to per-tensor ``q``."""
    return dequantize(b, quantize(b, x, q, x.shape))


def _weight_quantized(b, w, qp, name, what, axes=(0,)):
    """Weight ``w`` (float array) fake-quantized by QParams ``qp``: its
    integers as an initializer, dequantized in the graph (per-channel
    scales along one of ``axes``)."""
    from mgtrace.onnx._builder import ExportError
    scale, zp, dname, qmin, qmax, axis = qparams(qp, what, per_tensor=False)
    if np.any(zp):
        raise ExportError(f"{what}: an asymmetric weight (zero point not 0) has no int8 "
                          f"initializer form here")
    if qmin < -128 or qmax > 127:
        raise ExportError(f"{what}: {dname} weights do not fit int8")
    s, axis = scale, 0 if axis is None else axis % w.ndim
    if scale.ndim:
        if axis not in axes:
            raise ExportError(f"{what}: per-channel weight scales along axis {axis}; QDQ "
                              f"export takes them along the output channels (axis "
                              f"{' or '.join(map(str, axes))})")
        s = scale.reshape((1,) * axis + (-1,) + (1,) * (w.ndim - 1 - axis))
    q = np.clip(np.rint(w.astype(np.float32) / s), qmin, qmax).astype(np.int8)
    return _dq_array(b, q, scale, name, axis)


# ------------------------------------------------------- quantized modules
def _x(ex, args, who):
    from mgtrace.onnx._builder import ExportError
    if len(args) != 1 or not isinstance(args[0], V):
        raise ex.b.error(f"{who} called with arguments other than one tensor")
    x = ex.plain(args[0])
    if x.q is None:
        raise ExportError(f"{who} reads a tensor the exporter does not know to be quantized "
                          f"(node {ex.b.scope}); put a QuantStub before it")
    return x


def _bias_q(b, bias, x_q, w_scale, name):
    """The int32 bias of mgtrace's int8 kernels, dequantized at x_scale * w_scale."""
    xs = np.float64(np.float32(x_q.scale))
    return _dq_array(b, _bias_int32(bias, x_q, w_scale),
                     (xs * w_scale.astype(np.float64)).astype(np.float32), name)


def _finish(b, y, out_q, relu, shape):
    if relu:
        y = b.op("Relu", [y], np.float32, shape)
    if out_q is None:
        return V(y.name, np.float32, shape)
    return quantize(b, y, out_q, shape)


def _qlinear_conv(ex, m, x, w, ws, bias, out_q, shape, **attrs):
    """QLinearConv of quantized ``x`` (4-d) with int8 weight ``w`` to
    ``out_q``; ReLU as a Max with the output's zero point (the saturation
    of mgtrace's kernels: rounding is monotone, so clamping after it is
    clamping before)."""
    b = ex.b
    xs, xz = _scalar(b, x.q)
    os_, oz = _scalar(b, out_q)
    wv = b.const(w, name=f"{m.path}.weight")
    wsv = b.const(np.asarray(ws, np.float32))
    wz = b.const(np.zeros(np.shape(ws), np.int8))
    ins = [x, xs, xz, wv, wsv, wz, os_, oz]
    if bias is not None:
        bq = _bias_int32(bias, x.q, ws)
        ins.append(b.const(bq, name=f"{m.path}.bias.int32"))
    y = b.op("QLinearConv", ins, oz.dtype, shape, kernel_shape=list(w.shape[2:]), **attrs)
    if m.relu:
        y = b.op("Max", [y, oz], oz.dtype, shape)
    y.q = out_q
    return y


def _bias_int32(bias, x_q, w_scale):
    ws = np.broadcast_to(w_scale.astype(np.float64), bias.shape)
    xs = np.float64(np.float32(x_q.scale))
    return np.clip(np.rint(bias.astype(np.float64) / (xs * ws)), -2 ** 31,
                   2 ** 31 - 1).astype(np.int32)


def _q_linear(ex, e, m, args, kwargs, out):
    b = ex.b
    x = _x(ex, args, type(m).__name__)
    w, ws, bias, out_q = weight_of(m)
    if ex.quant_format == "qoperator" and out_q is not None:
        # [..., K] -> [M, K, 1, 1] -> QLinearConv 1x1 -> [M, N] -> [..., N]
        k, n_out = w.shape[1], w.shape[0]
        x4 = b.op("Reshape", [x, b.ints([-1, k, 1, 1])], x.dtype, (0, k, 1, 1))
        x4.q = x.q
        y = _qlinear_conv(ex, m, x4, w.reshape(n_out, k, 1, 1), ws, bias, out_q,
                          (0, n_out, 1, 1))
        lead = b.op("Slice", [b.shape_of(x), b.ints([0]), b.ints([-1]), b.ints([0])],
                    np.int64, (x.ndim - 1,))
        target = b.op("Concat", [lead, b.ints([n_out])], np.int64, (x.ndim,), axis=0)
        y2 = b.op("Reshape", [y, target], y.dtype, out[0].shape)
        y2.q = out_q
        return y2
    xf = dequantize(b, x)
    wf = _dq_array(b, w, ws, f"{m.path}.weight")
    bf = None if bias is None else _bias_q(b, bias, x.q, ws, f"{m.path}.bias.int32")
    shape = out[0].shape
    if x.ndim == 2:
        y = b.op("Gemm", [xf, wf] + ([bf] if bf is not None else []), np.float32, shape,
                 transB=1)
    else:
        wt = b.op("Transpose", [wf], np.float32, w.shape[::-1], perm=[1, 0])
        y = b.op("MatMul", [xf, wt], np.float32, shape)
        if bf is not None:
            y = b.op("Add", [y, bf], np.float32, shape)
    return _finish(b, y, out_q, m.relu, shape)


def _q_conv(ex, e, m, args, kwargs, out):
    b = ex.b
    x = _x(ex, args, type(m).__name__)
    w, ws, bias, out_q = weight_of(m)
    if ex.quant_format == "qoperator" and out_q is not None:
        (ph, pw) = m.padding
        return _qlinear_conv(ex, m, x, w, ws, bias, out_q, out[0].shape,
                             strides=list(m.stride), pads=[ph, pw, ph, pw],
                             dilations=list(m.dilation), group=m.groups)
    xf = dequantize(b, x)
    wf = _dq_array(b, w, ws, f"{m.path}.weight")
    ins = [xf, wf]
    if bias is not None:
        ins.append(_bias_q(b, bias, x.q, ws, f"{m.path}.bias.int32"))
    (ph, pw), shape = m.padding, out[0].shape
    y = b.op("Conv", ins, np.float32, shape, kernel_shape=list(w.shape[2:]),
             strides=list(m.stride), pads=[ph, pw, ph, pw], dilations=list(m.dilation),
             group=m.groups)
    return _finish(b, y, out_q, m.relu, shape)


def _q_quant_stub(ex, e, m, args, kwargs, out):
    if len(args) != 1 or not isinstance(args[0], V):
        raise ex.b.error("QuantStub called with arguments other than one tensor")
    q = qparams(m.act_qparams, "QuantStub")
    return quantize(ex.b, ex.plain(args[0]), q, out[0].shape)


def _q_dequant_stub(ex, e, m, args, kwargs, out):
    if len(args) != 1 or not isinstance(args[0], V):
        raise ex.b.error("DequantStub called with arguments other than one tensor")
    return dequantize(ex.b, ex.plain(args[0]))


def _float_forward(ex, e, m, args, kwargs, forward):
    """``forward`` (a float module's forward) on the dequantized arguments,
    converted as its composition of core ops; its one output."""
    from mgtrace.onnx.exporter import _substitute
    args = _map(args, lambda v: dequantize(ex.b, ex.plain(v)))
    kwargs = _map(kwargs, lambda v: dequantize(ex.b, ex.plain(v)))
    res = ex.decompose(e, lambda body, xs: forward(*_substitute(args, xs),
                                                   **_substitute(kwargs, xs)),
                       (args, kwargs), None)
    return res[0]


def _map(obj, f):
    if isinstance(obj, V):
        return f(obj)
    if isinstance(obj, (list, tuple)):
        return type(obj)(_map(o, f) for o in obj)
    if isinstance(obj, dict):
        return {k: _map(o, f) for k, o in obj.items()}
    return obj


def _q_elemwise(ex, e, m, args, kwargs, out):
    y = _float_forward(ex, e, m, args, kwargs, m.float_op.forward)
    return quantize(ex.b, y, qparams(m.act_qparams, "Elemwise's output"), out[0].shape)


def _concat_forward(inps, axis=0):
    import mgtrace.functional as F
    return F.concat(inps, axis)


def _q_concat(ex, e, m, args, kwargs, out):
    y = _float_forward(ex, e, m, args, kwargs, _concat_forward)
    return quantize(ex.b, y, qparams(m.act_qparams, "Concat's output"), out[0].shape)


# ------------------------------------------------------------- QAT modules
def _fq_enabled(fq):
    return fq is not None and getattr(fq, "enabled", True)


def _act_fq(ex, m, y):
    """The QAT module's output fake quantization (none when disabled)."""
    if not _fq_enabled(m.act_fake_quant):
        return y
    qp = m.get_activation_qparams()
    q = qparams(qp, f"{type(m).__name__}'s output")
    if q is None:
        raise ex.b.error(f"QAT {type(m).__name__} fake-quantizes its output without qparams "
                         f"(calibrate it first)")
    out = _fake_quant(ex.b, y, q)
    _fq_outputs(ex.b)[out.name] = qp       # what the eager output carries (_mark)
    return out


def _fq_outputs(b):
    """{value name: QParams} of the QAT fake quantizers' outputs in ``b``'s
    graph (MegEngine's ``Tensor.qparams``, mgtrace's ``_fq_qparams``)."""
    d = getattr(b, "_qat_fq_outputs", None)
    if d is None:
        d = b._qat_fq_outputs = {}
    return d


def _qat_bias(ex, m, x, bias, w_ndim, channel_axis=0):
    """The QAT module's bias (a float32 array or None) as it computes it:
    fake-quantized to qint32 at ``s_in * s_w`` where its input ``x`` is a
    QAT fake quantizer's output (:meth:`QATModule.apply_quant_bias`'s rule,
    ``bias_qparams``), else as it is."""
    from mgtrace._core import tensor as _tensor
    from mgtrace.module.qat.module import bias_qparams
    from mgtrace.quantization.utils import fake_quant_tensor
    if bias is None or not (_fq_enabled(m.act_fake_quant) and _fq_enabled(m.weight_fake_quant)):
        return bias
    bq = bias_qparams(_fq_outputs(ex.b).get(x.name), m.get_weight_qparams(), bias.shape,
                      w_ndim, channel_axis)
    if bq is None:
        return bias
    return np.asarray(fake_quant_tensor(_tensor(bias), bq).numpy(), np.float32)


def _qat_weight(ex, m, w, path, axes=(0,)):
    """The QAT module's weight ``w`` (a float array) as it fake-quantizes it
    (per-channel scales along one of ``axes``)."""
    b = ex.b
    if not _fq_enabled(m.weight_fake_quant):
        return b.const(w.astype(np.float32), name=path)
    qp = m.get_weight_qparams()
    if qp is None:
        raise b.error(f"QAT {type(m).__name__} fake-quantizes its weight without qparams "
                      f"(calibrate it first)")
    return _weight_quantized(b, w, qp, path, f"QAT {type(m).__name__}'s weight", axes)


def _qat_float(rule_name, relu=False):
    """A QAT Linear / Conv2d / ConvRelu2d / LinearRelu: the float module's
    row with the weight fake-quantized, ReLU, the output fake-quantized."""
    def convert(ex, e, m, args, kwargs, out):
        from mgtrace.onnx import mapping
        b = ex.b
        if len(args) != 1 or kwargs or not isinstance(args[0], V):
            raise b.error(f"QAT {type(m).__name__} called with arguments other than one tensor")
        x = ex.plain(args[0])

        def param(name):
            t = getattr(m, name)
            if name == "weight":
                return _qat_weight(ex, m, np.asarray(t.numpy()), f"{m.path}.weight")
            if name == "bias" and t is not None:
                arr = np.asarray(t.numpy(), np.float32)
                bq = _qat_bias(ex, m, x, arr, m.weight.ndim)
                if bq is not arr:
                    return b.const(bq, name=f"{m.path}.bias.qint32")
            return ex.param(t, f"{m.path}.{name}")
        y = mapping.rule_for("module", rule_name).convert(b, out, m, x, param)
        if relu:
            y = b.op("Relu", [y], y.dtype, y.shape)
        return _act_fq(ex, m, y)
    return convert


def _qat_conv_bn(relu):
    def convert(ex, e, m, args, kwargs, out):
        b = ex.b
        if len(args) != 1 or kwargs or not isinstance(args[0], V):
            raise b.error(f"QAT {type(m).__name__} called with arguments other than one tensor")
        if m.bn.training or m.bn.running_mean is None:
            raise b.error(f"QAT {type(m).__name__} normalises with batch statistics (training "
                          f"mode or no running statistics); export it in eval()")
        conv = m.conv
        if getattr(conv, "padding_mode", "zeros") != "zeros":
            raise b.error(f"QAT {type(m).__name__} with padding_mode={conv.padding_mode!r} has "
                          f"no QDQ form here")
        k, beta, mean = (np.asarray(t.numpy(), np.float32) for t in m._fold())
        w = np.asarray(conv.weight.numpy(), np.float32) * k.reshape(-1, 1, 1, 1)
        cb = np.zeros_like(mean) if conv.bias is None else np.asarray(conv.bias.numpy())
        bias = (beta + k * (cb - mean)).astype(np.float32)
        wf = _qat_weight(ex, m, w, f"{m.path}.conv.weight")
        x = b.cast(ex.plain(args[0]), np.float32)
        bias = _qat_bias(ex, m, x, bias, 4)
        (ph, pw), shape = conv.padding, out[0].shape
        y = b.op("Conv", [x, wf, b.const(bias, name=f"{m.path}.bias.folded")],
                 np.float32, shape, kernel_shape=list(w.shape[2:]), strides=list(conv.stride),
                 pads=[ph, pw, ph, pw], dilations=list(conv.dilation), group=conv.groups)
        if relu:
            y = b.op("Relu", [y], np.float32, shape)
        return _act_fq(ex, m, y)
    return convert


def _qat_linear_bn(relu):
    """QAT LinearBn1d / LinearBnRelu1d in eval: the BatchNorm folded as the
    module folds it (``w * k``, ``beta + k * (b - running_mean)``), the
    folded weight fake-quantized, Gemm (MatMul for more than 2 axes)."""
    def convert(ex, e, m, args, kwargs, out):
        b = ex.b
        if len(args) != 1 or kwargs or not isinstance(args[0], V):
            raise b.error(f"QAT {type(m).__name__} called with arguments other than one tensor")
        bn, lin = m.bn, m.linear
        if bn.training or bn.running_mean is None:
            raise b.error(f"QAT {type(m).__name__} normalises with batch statistics (training "
                          f"mode or no running statistics); export it in eval()")
        arr = lambda t, fill: np.full(bn.num_features, fill, np.float32) if t is None \
            else np.asarray(t.numpy(), np.float32)                          # noqa: E731
        gamma, beta = arr(bn.weight, 1.0), arr(bn.bias, 0.0)
        mean, var = arr(bn.running_mean, 0.0), arr(bn.running_var, 1.0)
        k = (gamma / np.sqrt(var + np.float32(bn.eps))).astype(np.float32)
        w = np.asarray(lin.weight.numpy(), np.float32) * k.reshape(-1, 1)
        bias = (beta + k * (arr(lin.bias, 0.0) - mean)).astype(np.float32)
        wf = _qat_weight(ex, m, w, f"{m.path}.linear.weight")
        x = b.cast(ex.plain(args[0]), np.float32)
        bf = b.const(_qat_bias(ex, m, x, bias, 2), name=f"{m.path}.bias.folded")
        shape = out[0].shape
        if x.ndim == 2:
            y = b.op("Gemm", [x, wf, bf], np.float32, shape, transB=1)
        else:
            wt = b.op("Transpose", [wf], np.float32, w.shape[::-1], perm=[1, 0])
            y = b.op("Add", [b.op("MatMul", [x, wt], np.float32, shape), bf], np.float32, shape)
        if relu:
            y = b.op("Relu", [y], np.float32, shape)
        return _act_fq(ex, m, y)
    return convert


def _qat_batch_matmul(ex, e, m, args, kwargs, out):
    """QAT BatchMatMulActivation: ``act_fq(act(weight_fq(weight) @ x + bias))``."""
    b = ex.b
    if len(args) != 1 or kwargs or not isinstance(args[0], V):
        raise b.error(f"QAT {type(m).__name__} called with arguments other than one tensor")
    w = _qat_weight(ex, m, np.asarray(m.weight.numpy(), np.float32), f"{m.path}.weight")
    shape = out[0].shape
    x = b.cast(ex.plain(args[0]), np.float32)
    y = b.op("MatMul", [w, x], np.float32, shape)
    if m.bias is not None:
        bias = np.asarray(m.bias.numpy(), np.float32)
        y = b.op("Add", [y, b.const(_qat_bias(ex, m, x, bias, 3, None), name=f"{m.path}.bias")],
                 np.float32, shape)
    if m.nonlinear_mode == "relu":
        y = b.op("Relu", [y], np.float32, shape)
    return _act_fq(ex, m, y)


def _one_tensor(ex, m, args, kwargs, kind="QAT"):
    if len(args) != 1 or kwargs or not isinstance(args[0], V):
        raise ex.b.error(f"{kind} {type(m).__name__} called with arguments other than one tensor")
    return ex.plain(args[0])


def _conv_transpose(b, m, x, w, bias, shape):
    """ConvTranspose of float ``x`` with weight V ``w`` (its array shape
    ``m``'s [C_in, C_out/groups, KH, KW]) and bias V or None."""
    (ph, pw) = m.padding
    return b.op("ConvTranspose", [x, w] + ([bias] if bias is not None else []), np.float32,
                shape, kernel_shape=list(m.kernel_size), strides=list(m.stride),
                pads=[ph, pw, ph, pw], dilations=list(m.dilation),
                output_padding=list(m.output_padding), group=m.groups)


def _qat_conv_transpose(relu):
    """QAT ConvTranspose2d / ConvTransposeRelu2d: ConvTranspose on the
    fake-quantized weight (per-channel scales along axis 0 or 1)."""
    def convert(ex, e, m, args, kwargs, out):
        b = ex.b
        x = b.cast(_one_tensor(ex, m, args, kwargs), np.float32)
        w = _qat_weight(ex, m, np.asarray(m.weight.numpy(), np.float32), f"{m.path}.weight",
                        axes=(0, 1))
        bias = None if m.bias is None else b.const(
            _qat_bias(ex, m, x, np.asarray(m.bias.numpy(), np.float32), 4, 1),
            name=f"{m.path}.bias")
        y = _conv_transpose(b, m, x, w, bias, out[0].shape)
        if relu:
            y = b.op("Relu", [y], np.float32, y.shape)
        return _act_fq(ex, m, y)
    return convert


def _qat_conv_transpose_bn(relu):
    """QAT ConvTransposeBn2d / ConvTransposeBnRelu2d in eval: the BatchNorm
    folded as the module folds it, the folded weight fake-quantized."""
    def convert(ex, e, m, args, kwargs, out):
        b = ex.b
        x = b.cast(_one_tensor(ex, m, args, kwargs), np.float32)
        if m.bn.training or m.bn.running_mean is None:
            raise b.error(f"QAT {type(m).__name__} normalises with batch statistics (training "
                          f"mode or no running statistics); export it in eval()")
        ct = m.conv_transpose2d
        k, beta, mean = m._fold()
        w = np.asarray(m.folded_weight(k).numpy(), np.float32)
        k, beta, mean = (np.asarray(t.numpy(), np.float32) for t in (k, beta, mean))
        cb = np.zeros_like(mean) if ct.bias is None else np.asarray(ct.bias.numpy())
        bias = (beta + k * (cb - mean)).astype(np.float32)
        wf = _qat_weight(ex, m, w, f"{m.path}.conv_transpose2d.weight", axes=(0, 1))
        bias = _qat_bias(ex, m, x, bias, 4, 1)
        y = _conv_transpose(b, ct, x, wf, b.const(bias, name=f"{m.path}.bias.folded"),
                            out[0].shape)
        if relu:
            y = b.op("Relu", [y], np.float32, y.shape)
        return _act_fq(ex, m, y)
    return convert


def _q_conv_transpose(ex, e, m, args, kwargs, out):
    """Quantized ConvTranspose2d (and its Relu / Bn forms): QDQ around a
    float ConvTranspose (ONNX has no QLinearConvTranspose: the QOperator
    format uses this form too)."""
    b = ex.b
    x = _x(ex, args, type(m).__name__)
    w, ws, bias, out_q = weight_of(m)
    xf = dequantize(b, x)
    wf = _dq_array(b, w, ws, f"{m.path}.weight", axis=1)
    bf = None if bias is None else _bias_q(b, bias, x.q, ws, f"{m.path}.bias.int32")
    shape = out[0].shape
    return _finish(b, _conv_transpose(b, m, xf, wf, bf, shape), out_q, m.relu, shape)


def _q_batch_matmul(ex, e, m, args, kwargs, out):
    """Quantized BatchMatMulActivation: QDQ around MatMul(weight, x), the
    int32 bias (along the last axis) and Relu."""
    b = ex.b
    x = _x(ex, args, type(m).__name__)
    w, ws, bias, out_q = weight_of(m)
    shape = out[0].shape
    y = b.op("MatMul", [_dq_array(b, w, ws, f"{m.path}.weight"), dequantize(b, x)], np.float32,
             shape)
    if bias is not None:
        y = b.op("Add", [y, _bias_q(b, bias, x.q, ws, f"{m.path}.bias.int32")], np.float32,
                 shape)
    return _finish(b, y, out_q, m.relu, shape)


def _qat_quant_stub(ex, e, m, args, kwargs, out):
    if len(args) != 1 or not isinstance(args[0], V):
        raise ex.b.error("QAT QuantStub called with arguments other than one tensor")
    return _act_fq(ex, m, ex.b.cast(ex.plain(args[0]), np.float32))


def _qat_dequant_stub(ex, e, m, args, kwargs, out):
    if len(args) != 1 or not isinstance(args[0], V):
        raise ex.b.error("QAT DequantStub called with arguments other than one tensor")
    return args[0]


def _qat_elemwise(ex, e, m, args, kwargs, out):
    from mgtrace.module.fused import Elemwise
    return _act_fq(ex, m, _float_forward(ex, e, m, args, kwargs, Elemwise.forward.__get__(m._obj)))


def _qat_concat(ex, e, m, args, kwargs, out):
    return _act_fq(ex, m, _float_forward(ex, e, m, args, kwargs, _concat_forward))


_QUANTIZED = {
    "Linear": _q_linear, "LinearRelu": _q_linear, "Conv2d": _q_conv, "ConvRelu2d": _q_conv,
    "ConvBn2d": _q_conv, "ConvBnRelu2d": _q_conv, "QuantStub": _q_quant_stub,
    "DequantStub": _q_dequant_stub, "Elemwise": _q_elemwise, "Concat": _q_concat,
    "ConvTranspose2d": _q_conv_transpose, "ConvTransposeRelu2d": _q_conv_transpose,
    "ConvTransposeBn2d": _q_conv_transpose, "ConvTransposeBnRelu2d": _q_conv_transpose,
    "LinearBn1d": _q_linear, "LinearBnRelu1d": _q_linear,
    "BatchMatMulActivation": _q_batch_matmul,
}
_QAT = {
    "Linear": _qat_float("Linear"), "LinearRelu": _qat_float("Linear", True),
    "Conv2d": _qat_float("Conv2d"), "ConvRelu2d": _qat_float("Conv2d", True),
    "ConvBn2d": _qat_conv_bn(False), "ConvBnRelu2d": _qat_conv_bn(True),
    "QuantStub": _qat_quant_stub, "DequantStub": _qat_dequant_stub,
    "Elemwise": _qat_elemwise, "Concat": _qat_concat,
    "LinearBn1d": _qat_linear_bn(False), "LinearBnRelu1d": _qat_linear_bn(True),
    "BatchMatMulActivation": _qat_batch_matmul,
    "ConvTranspose2d": _qat_conv_transpose(False), "ConvTransposeRelu2d": _qat_conv_transpose(True),
    "ConvTransposeBn2d": _qat_conv_transpose_bn(False),
    "ConvTransposeBnRelu2d": _qat_conv_transpose_bn(True),
}
_QL, _DQL = "QuantizeLinear", "DequantizeLinear"
for _name, _ops in (("Linear", ("Gemm", "MatMul")), ("LinearRelu", ("Gemm", "MatMul", "Relu")),
                    ("Conv2d", ("Conv",)), ("ConvRelu2d", ("Conv", "Relu")),
                    ("ConvBn2d", ("Conv",)), ("ConvBnRelu2d", ("Conv", "Relu")),
                    ("QuantStub", ()), ("DequantStub", ()),
                    ("Elemwise", ("(its float composition)",)), ("Concat", ("Concat",))):
    _QUANTIZED[_name].onnx = ((_QL,) if _name != "DequantStub" else ()) + (
        (_DQL,) if _name != "QuantStub" else ()) + _ops
    _QAT[_name].onnx = ((_QL, _DQL) if _name != "DequantStub" else ()) + _ops
for _name, _ops in (("LinearBn1d", ("Gemm", "MatMul")),
                    ("LinearBnRelu1d", ("Gemm", "MatMul", "Relu")),
                    ("BatchMatMulActivation", ("MatMul", "Add", "Relu"))):
    _QAT[_name].onnx = (_QL, _DQL) + _ops
for _name, _ops in (("ConvTranspose2d", ("ConvTranspose",)),
                    ("ConvTransposeRelu2d", ("ConvTranspose", "Relu")),
                    ("ConvTransposeBn2d", ("ConvTranspose",)),
                    ("ConvTransposeBnRelu2d", ("ConvTranspose", "Relu"))):
    _QAT[_name].onnx = (_QL, _DQL) + _ops
# the quantized rows shared by several names list every op any of them writes
_q_conv_transpose.onnx = (_QL, _DQL, "ConvTranspose", "Relu")
_q_batch_matmul.onnx = (_QL, _DQL, "MatMul", "Add", "Relu")
del _name, _ops
TABLES = {"mgtrace.module.quantized": _QUANTIZED, "mgtrace.module.qat": _QAT}
"""Builtin name prefix -> {class name: convert}: the rows of
:func:`mgtrace.onnx.coverage` for quantized and QAT modules."""


def convert_module(ex, e, m, args, kwargs, out):
    """The QDQ form of quantized or QAT module ``m.obj`` (a builtin of
    ``mgtrace.module.quantized`` / ``mgtrace.module.qat``); None for a
    module of neither kind. ExportError for one of them with no row."""
    from mgtrace.onnx._builder import ExportError
    obj = m.obj
    name = getattr(type(obj), "builtin_name", None) or ""
    prefix, _, cls = name.rpartition(".")
    table = TABLES.get(prefix)
    if table is None or type(obj).__dict__.get("builtin_name") != name:
        return None
    conv = table.get(cls)
    if conv is None:
        at = f" at {e.source}" if e.source else ""
        raise ExportError(f"module {name} has no ONNX mapping (node {ex.b.scope}{at}); "
                          f"mgtrace.onnx.coverage() lists what exports")
    return conv(ex, e, _Bound(obj, m.path), args, kwargs, out)


class _Bound:
    """A module with its state_dict prefix (``path``); attributes read through."""
    __slots__ = ("_obj", "path")

    def __init__(self, obj, path):
        object.__setattr__(self, "_obj", obj)
        object.__setattr__(self, "path", path)

    def __getattr__(self, name):
        return getattr(self._obj, name)


_LAYOUT = frozenset({"reshape", "flatten", "transpose", "__getitem__", "getitem"})


def keeps_qparams(e):
    """Whether expr ``e`` rearranges a quantized tensor's integers keeping
    its qparams (QuantizedTensor's reshape, flatten, transpose, indexing),
    or max-pools them (``F.max_pool2d`` / ``M.MaxPool2d`` of a quantized
    tensor: its integers' max, the same qparams; ONNX's MaxPool takes int8
    and uint8): then :func:`qparams_source` is the tensor it reads."""
    if e.kind == "call_method":
        return e.method in _LAYOUT or _max_pool_source(e) is not None
    if e.kind == "apply":
        return getattr(e.op, "name", None) in _LAYOUT
    return _max_pool_source(e) is not None


def _max_pool_source(e):
    import mgtrace.functional as F
    import mgtrace.module as M
    from mgtrace.traced_module.passes.match import is_function, module_call
    if module_call(e, M.MaxPool2d) is not None and len(e.args) == 2:
        return e.args[1]
    if is_function(e, F.max_pool2d) and e.args:
        return e.args[0]
    return None


def avg_pool_source(e):
    """The tensor node an average pool expr (``F.avg_pool2d``,
    ``F.adaptive_avg_pool2d``, ``M.AvgPool2d``, ``M.AdaptiveAvgPool2d``)
    reads, else None: of a quantized tensor it averages the integers,
    rounding the exact mean half to even, which ONNX's float AveragePool
    between a DequantizeLinear and a QuantizeLinear does not reproduce
    (float rounding moves some ties), so the exporter refuses it."""
    import mgtrace.functional as F
    import mgtrace.module as M
    from mgtrace.traced_module.passes.match import is_function, module_call
    for cls in (M.AvgPool2d, M.AdaptiveAvgPool2d):
        if module_call(e, cls) is not None and len(e.args) == 2:
            return e.args[1]
    if (is_function(e, F.avg_pool2d) or is_function(e, F.adaptive_avg_pool2d)) and e.args:
        return e.args[0]
    return None


def qparams_source(e):
    """The node whose qparams the result of expr ``e`` keeps (where
    :func:`keeps_qparams`): the max pool's input, else ``e.args[0]``."""
    src = _max_pool_source(e)
    return e.args[0] if src is None else src
