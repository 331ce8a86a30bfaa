"""QAT LinearBn1d and LinearBnRelu1d (MegEngine's ``module/qat/linear_bn.py``)
with the BatchNorm folded into the fake-quantized weight as MegEngine's
approximate mode (its default), as :mod:`mgtrace.module.qat.conv_bn` does
for convolutions: ``k = gamma / sqrt(running_var + eps)`` per output
feature, ``w_fold = w * k``;

* eval: ``linear(x, fq(w_fold), beta + k * (b - running_mean))``;
* training: ``bn(linear(x, fq(w_fold)) / k + b)`` (the BatchNorm uses the
  batch's statistics and updates its running ones).
"""
import mgtrace.functional as F
from mgtrace.module import fused_linear as _float
from mgtrace.module.qat.module import QATModule, build_uninitialized

__all__ = ["LinearBn1d", "LinearBnRelu1d"]


class _LinearBnActivation1d(_float._LinearBnActivation1d, QATModule):

    def calc_linear_bn_qat(self, x):
        bn, linear = self.bn, self.linear
        c = bn.num_features
        gamma = bn.weight if bn.weight is not None else F.ones((c,))
        beta = bn.bias if bn.bias is not None else F.zeros((c,))
        mean = bn.running_mean if bn.running_mean is not None else F.zeros((c,))
        var = bn.running_var if bn.running_var is not None else F.ones((c,))
        k = gamma / F.sqrt(var + float(bn.eps))
        w_qat = self.apply_quant_weight(linear.weight * k.reshape((-1, 1)))
        batch_stats = bn.training or bn.running_mean is None
        if not batch_stats:
            b = linear.bias if linear.bias is not None else F.zeros_like(mean)
            return F.linear(x, w_qat, self.apply_quant_bias(beta + k * (b - mean), x, w_qat))
        y = F.linear(x, w_qat) / k
        if linear.bias is not None:
            y = y + linear.bias
        return bn(y)

    @classmethod
    def from_float_module(cls, float_module):
        qmod = build_uninitialized(cls, **float_module.config())
        qmod.linear = float_module.linear
        qmod.bn = float_module.bn
        return qmod.train(float_module.training)


class LinearBn1d(_LinearBnActivation1d):
    """``act_fq(bn(linear(x)))``, folded (see the module docstring); from
    :class:`mgtrace.module.LinearBn1d`, same arguments and state_dict keys
    plus the observers'. x float32 [N, in_features]."""

    def forward(self, x):
        return self.apply_quant_activation(self.calc_linear_bn_qat(x))


class LinearBnRelu1d(_LinearBnActivation1d):
    """``act_fq(relu(bn(linear(x))))``, as :class:`LinearBn1d`."""

    def forward(self, x):
        return self.apply_quant_activation(F.relu(self.calc_linear_bn_qat(x)))
