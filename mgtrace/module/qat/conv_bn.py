"""QAT ConvBn2d and ConvBnRelu2d with MegEngine's approximate BatchNorm
folding (``module/qat/conv_bn.py``, ``approx=True``, its default).

The BatchNorm is folded into the weight that gets fake-quantized, with the
running statistics: ``k = gamma / sqrt(running_var + eps)`` per output
channel and ``w_fold = w * k``.

* eval: ``conv2d(x, fq(w_fold), beta + k * (b - running_mean))``, the
  folded layer a deployment runs.
* training: ``bn(conv2d(x, fq(w_fold)) / k + b)``: the fake-quantized
  convolution is scaled back and the BatchNorm then normalises with the
  batch's statistics (and updates its running ones, mgtrace's momentum
  convention), so training sees the weight's quantization error without
  a second convolution. MegEngine's exact mode (``approx=False``) is not
  provided.
"""
import mgtrace.functional as F
from mgtrace.module import fused as _float
from mgtrace.module.qat.module import QATModule, build_uninitialized

__all__ = ["ConvBn2d", "ConvBnRelu2d"]


def fold_bn(bn):
    """``(k, beta, running_mean)`` [C] each for BatchNorm ``bn``, with
    ``k = gamma / sqrt(running_var + eps)`` (ones / zeros where it has no
    affine parameters or running statistics)."""
    c = bn.num_features
    ones, zeros = F.ones((c,)), F.zeros((c,))
    gamma = bn.weight if bn.weight is not None else ones
    beta = bn.bias if bn.bias is not None else zeros
    mean = bn.running_mean if bn.running_mean is not None else zeros
    var = bn.running_var if bn.running_var is not None else ones
    return gamma / F.sqrt(var + float(bn.eps)), beta, mean


def approx_bn_forward(qmod, layer, x, w_qat, fold, conv, channel_axis=0):
    """MegEngine's approx-mode forward of a QAT conv (or transposed conv)
    with BatchNorm ``qmod.bn`` (see the module docstring), given the
    fake-quantized folded weight ``w_qat``, ``fold = (k, beta, mean)`` and
    ``conv(weight, bias)`` running ``layer``'s convolution on ``x``; the
    bias is fake-quantized along ``channel_axis`` of the weight."""
    k, beta, mean = fold
    # the BatchNorm normalises with the batch's statistics: in training, or
    # always when it keeps no running ones
    batch_stats = qmod.bn.training or qmod.bn.running_mean is None
    bias = None
    if not batch_stats:
        b = layer.bias if layer.bias is not None else F.zeros_like(mean)
        bias = qmod.apply_quant_bias(beta + k * (b - mean), x, w_qat, channel_axis)
    y = conv(w_qat, bias)
    if not batch_stats:
        return y
    y = y / k.reshape((1, -1, 1, 1))
    if layer.bias is not None:
        y = y + layer.bias.reshape((1, -1, 1, 1))
    return qmod.bn(y)


class _ConvBnActivation2d(_float._ConvBnActivation2d, QATModule):

    def _fold(self):
        return fold_bn(self.bn)

    def calc_conv_bn_qat(self, x):
        conv = self.conv
        k, beta, mean = self._fold()
        w_qat = self.apply_quant_weight(conv.weight * k.reshape((-1, 1, 1, 1)))
        return approx_bn_forward(self, conv, x, w_qat, (k, beta, mean), lambda w, bias: F.conv2d(
            conv._padded(x), w, bias, conv.stride, conv._conv_padding(), conv.dilation, conv.groups))

    @classmethod
    def from_float_module(cls, float_module):
        qmod = build_uninitialized(cls, **float_module.config())
        qmod.conv = float_module.conv
        qmod.bn = float_module.bn
        return qmod.train(float_module.training)


class ConvBn2d(_ConvBnActivation2d):
    """``act_fq(bn(conv(x)))`` with the BatchNorm folded into the
    fake-quantized weight (see the module docstring); from
    :class:`mgtrace.module.ConvBn2d`, same arguments and state_dict keys
    (``conv.weight``, ``bn.running_mean``, ...) plus the observers'."""

    def forward(self, x):
        return self.apply_quant_activation(self.calc_conv_bn_qat(x))


class ConvBnRelu2d(_ConvBnActivation2d):
    """``act_fq(relu(bn(conv(x))))``, as :class:`ConvBn2d`."""

    def forward(self, x):
        return self.apply_quant_activation(F.relu(self.calc_conv_bn_qat(x)))
