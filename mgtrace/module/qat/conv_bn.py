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


class _ConvBnActivation2d(_float._ConvBnActivation2d, QATModule):

    def _fold(self):
        bn, conv = self.bn, self.conv
        c = bn.num_features
        ones, zeros = F.ones((c,)), F.zeros((c,))
        gamma = bn.weight if bn.weight is not None else ones
        beta = bn.bias if bn.bias is not None else zeros
        mean = bn.running_mean if bn.running_mean is not None else zeros
        var = bn.running_var if bn.running_var is not None else ones
        k = gamma / F.sqrt(var + float(bn.eps))
        return k, beta, mean

    def calc_conv_bn_qat(self, x):
        conv = self.conv
        k, beta, mean = self._fold()
        w_qat = self.apply_quant_weight(conv.weight * k.reshape((-1, 1, 1, 1)))
        # the BatchNorm normalises with the batch's statistics: in training, or
        # always when it keeps no running ones
        batch_stats = self.bn.training or self.bn.running_mean is None
        if batch_stats:
            bias = None
        else:
            b = conv.bias if conv.bias is not None else F.zeros_like(mean)
            bias = self.apply_quant_bias(beta + k * (b - mean), x, w_qat)
        y = F.conv2d(conv._padded(x), w_qat, bias, conv.stride, conv._conv_padding(),
                     conv.dilation, conv.groups)
        if not batch_stats:
            return y
        y = y / k.reshape((1, -1, 1, 1))
        if conv.bias is not None:
            y = y + conv.bias.reshape((1, -1, 1, 1))
        return self.bn(y)

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
