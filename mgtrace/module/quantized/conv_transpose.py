"""Quantized ConvTranspose2d, ConvTransposeRelu2d, ConvTransposeBn2d and
ConvTransposeBnRelu2d (MegEngine's ``module/quantized/conv.py`` and
``conv_transpose_bn.py``).

There is no int8 transposed-convolution kernel: the integer accumulator
``sum (x_q - x_zp) * w_q`` is computed by the float64 transposed convolution
on the integers themselves (every product and partial sum is an integer far
below 2**53, so exact; the result is snapped with ``rint``, which also
absorbs the last-bit error of a Winograd path), then bias and requantization
follow :mod:`mgtrace.module.quantized.exact`, the int8 kernels' rule. The
output is therefore bitwise an integer implementation's (the tests check it
against a NumPy integer reference).

Departure from MegEngine 1.13: its quantized ConvTransposeRelu2d and
ConvTransposeBnRelu2d fail an ``assert nonlinear_mode == "identity"``;
here they fuse ReLU into the saturation as the other quantized layers do.
"""
import numpy as np

import mgtrace.functional as F
from mgtrace._core import tensor as _tensor
from mgtrace.module.quantized.exact import bias_int32, requantize
from mgtrace.module.quantized.modules import _Weighted, _act, _act_qparams, _input
from mgtrace.quantization.utils import QuantizationError

__all__ = ["ConvTranspose2d", "ConvTransposeRelu2d", "ConvTransposeBn2d",
           "ConvTransposeBnRelu2d"]


def _pair(v):
    return (int(v), int(v)) if np.ndim(v) == 0 else (int(v[0]), int(v[1]))


class ConvTranspose2d(_Weighted):
    """Int8 ``conv_transpose2d`` (zeros padding): QuantizedTensor (qint8 or
    quint8, per tensor) [N, C_in, H, W] -> QuantizedTensor [N, C_out, OH,
    OW] of ``act_qparams`` (float32 when it is None), OH as
    :func:`mgtrace.functional.conv_transpose2d`. Arguments in
    :class:`mgtrace.module.ConvTranspose2d`'s order, then
    ``weight_channels`` (None, or C_out for per-output-channel scales,
    groups=1 only) and ``act_qparams``.

    Buffers: ``weight`` int8 [C_in, C_out/groups, KH, KW], ``weight_scale``
    float32 (scalar or [C_out]), ``bias`` float32 [C_out] or None
    (quantized to int32 at ``x_scale * weight_scale`` per call).

    Raises QuantizationError for channels that do not split into groups,
    a float or per-channel input, or (``from_qat_module``) weight qparams
    that are not qint8 / qint8_narrow, symmetric, per tensor or along
    axis 1.
    """

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0,
                 output_padding=0, groups=1, bias=True, dilation=1, weight_channels=None,
                 act_qparams=None):
        super().__init__()
        self.in_channels, self.out_channels = int(in_channels), int(out_channels)
        self.kernel_size, self.stride = _pair(kernel_size), _pair(stride)
        self.padding, self.output_padding = _pair(padding), _pair(output_padding)
        self.dilation, self.groups = _pair(dilation), int(groups)
        if self.groups < 1 or self.in_channels % self.groups or self.out_channels % self.groups:
            raise QuantizationError(f"ConvTranspose2d: {in_channels} -> {out_channels} channels "
                                    f"do not split into {groups} groups")
        if weight_channels is not None and (int(weight_channels) != self.out_channels
                                            or self.groups != 1):
            raise QuantizationError(f"ConvTranspose2d: per-channel weight scales are one per "
                                    f"output channel ({self.out_channels}) with groups=1, got "
                                    f"weight_channels={weight_channels}, groups={groups}")
        self.weight = _tensor(np.zeros((self.in_channels, self.out_channels // self.groups)
                                       + self.kernel_size, np.int8))
        shape = () if weight_channels is None else (int(weight_channels),)
        self.weight_scale = _tensor(np.ones(shape, np.float32))
        self.bias = _tensor(np.zeros(self.out_channels, np.float32)) if bias else None
        self.act_qparams = _act(act_qparams)
        self.__dict__["_packed"] = None

    def config(self):
        return dict(in_channels=self.in_channels, out_channels=self.out_channels,
                    kernel_size=self.kernel_size, stride=self.stride, padding=self.padding,
                    output_padding=self.output_padding, groups=self.groups,
                    dilation=self.dilation, **self._weight_config())

    def forward(self, x):
        data, s, zp, _ = _input(x, type(self).__name__)
        if data.ndim != 4 or data.shape[1] != self.in_channels:
            raise QuantizationError(f"{type(self).__name__} takes [N, {self.in_channels}, H, W], "
                                    f"got {tuple(data.shape)}")
        xi = _tensor(data.astype(np.float64) - zp)
        w = _tensor(np.asarray(self.weight.numpy()).astype(np.float64))
        acc = np.rint(np.asarray(F.conv_transpose2d(
            xi, w, None, self.stride, self.padding, self.output_padding, self.dilation,
            self.groups).numpy()))
        ws = np.asarray(self.weight_scale.numpy(), np.float32)
        ws_c = ws.reshape(-1, 1, 1) if ws.ndim else ws
        if self.bias is not None:
            acc = acc + bias_int32(self.bias.numpy(), s, np.broadcast_to(
                ws, (self.out_channels,))).reshape(-1, 1, 1)
        o_s, o_zp, o_dt = self.out_args
        holder, alloc = self._new_output()
        requantize(acc, s, ws_c, o_s, o_zp, o_dt, self.relu, alloc)
        return holder[0]

    @classmethod
    def _like(cls, ct, **kw):
        if getattr(ct, "padding_mode", "zeros") != "zeros":
            raise QuantizationError(f"quantized {cls.__name__} pads with zeros only, got "
                                    f"padding_mode={ct.padding_mode!r}")
        return cls(ct.in_channels, ct.out_channels, ct.kernel_size, ct.stride, ct.padding,
                   ct.output_padding, ct.groups, ct.bias is not None, ct.dilation, **kw)

    def _setup_transposed(self, w_float, w_qparams, bias, act_qparams):
        if w_qparams is not None and np.ndim(w_qparams.scale.numpy()):
            if w_qparams.axis is None or w_qparams.axis % 4 != 1 or self.groups != 1:
                raise QuantizationError(
                    f"{type(self).__name__}: per-channel weight scales must be along axis 1 "
                    f"(the output channels of the [C_in, C_out, KH, KW] weight) with groups=1, "
                    f"got axis {w_qparams.axis}, groups {self.groups}")
        self._setup(w_float, w_qparams, bias, act_qparams)

    @classmethod
    def from_qat_module(cls, qat):
        per_channel = qat.get_weight_qparams() is not None and np.ndim(
            qat.get_weight_qparams().scale.numpy())
        m = cls._like(qat, weight_channels=qat.out_channels if per_channel else None)
        m._setup_transposed(qat.weight, qat.get_weight_qparams(), qat.bias,
                            _act_qparams(qat, False))
        return m


class ConvTransposeRelu2d(ConvTranspose2d):
    """``relu`` fused into :class:`ConvTranspose2d`'s saturation."""
    relu = True


class ConvTransposeBn2d(ConvTranspose2d):
    """A QAT ConvTransposeBn2d in its eval form: the BatchNorm folded into
    the weight (``w * k`` along the output channels) and the bias
    (``beta + k * (b - running_mean)``), then as :class:`ConvTranspose2d`
    (always with a bias)."""

    @classmethod
    def from_qat_module(cls, qat):
        ct = qat.conv_transpose2d
        q = qat.get_weight_qparams()
        per_channel = q is not None and np.ndim(q.scale.numpy())
        m = cls(ct.in_channels, ct.out_channels, ct.kernel_size, ct.stride, ct.padding,
                ct.output_padding, ct.groups, True, ct.dilation,
                weight_channels=ct.out_channels if per_channel else None)
        if getattr(ct, "padding_mode", "zeros") != "zeros":
            raise QuantizationError(f"quantized {cls.__name__} pads with zeros only, got "
                                    f"padding_mode={ct.padding_mode!r}")
        k, beta, mean = qat._fold()
        b = ct.bias if ct.bias is not None else F.zeros_like(mean)
        m._setup_transposed(qat.folded_weight(k), q, beta + k * (b - mean),
                            _act_qparams(qat, False))
        return m


class ConvTransposeBnRelu2d(ConvTransposeBn2d):
    """``relu`` fused into :class:`ConvTransposeBn2d`'s saturation."""
    relu = True
