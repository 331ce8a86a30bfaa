"""QAT ConvTranspose2d, ConvTransposeRelu2d (MegEngine's ``module/qat/conv.py``)
and ConvTransposeBn2d, ConvTransposeBnRelu2d (``module/qat/conv_transpose_bn.py``)
with MegEngine's approximate BatchNorm folding (``approx=True``, its default),
as :mod:`mgtrace.module.qat.conv_bn` does for convolutions.

The weight is [C_in, C_out/groups, KH, KW], so the folding factor
``k = gamma / sqrt(running_var + eps)`` multiplies it along the output
channels of each group (axis 1): ``w_fold = w * k``.

* eval: ``conv_transpose2d(x, fq(w_fold), beta + k * (b - running_mean))``;
* training: ``bn(conv_transpose2d(x, fq(w_fold)) / k + b)`` (the BatchNorm
  uses the batch's statistics and updates its running ones).

A per-channel weight observer for these modules takes ``axis=1`` (the
output channels; the int8 version needs groups=1 for it).
"""
import mgtrace.functional as F
from mgtrace.module import builtin as _builtin_float
from mgtrace.module import fused_conv_transpose as _float
from mgtrace.module.fused_conv_transpose import fold_transposed_weight
from mgtrace.module.qat.conv_bn import approx_bn_forward, fold_bn
from mgtrace.module.qat.module import QATModule, build_uninitialized, sharing_float_weights

__all__ = ["ConvTranspose2d", "ConvTransposeRelu2d", "ConvTransposeBn2d",
           "ConvTransposeBnRelu2d"]


class ConvTranspose2d(_builtin_float.ConvTranspose2d, QATModule):
    """:class:`mgtrace.module.ConvTranspose2d` with a fake-quantized weight
    and output: ``act_fq(conv_transpose2d(x, weight_fq(weight), bias))``.
    Arguments, shapes and parameters as the float module."""

    def calc_conv_transpose2d_qat(self, x):
        w_qat = self.apply_quant_weight(self.weight)
        return F.conv_transpose2d(x, w_qat, self.apply_quant_bias(self.bias, x, w_qat, 1),
                                  self.stride, self.padding, self.output_padding,
                                  self.dilation, self.groups)

    def forward(self, x):
        return self.apply_quant_activation(self.calc_conv_transpose2d_qat(x))

    @classmethod
    def from_float_module(cls, float_module):
        return sharing_float_weights(cls, float_module)


class ConvTransposeRelu2d(ConvTranspose2d):
    """``act_fq(relu(conv_transpose2d(...)))``, from
    :class:`mgtrace.module.ConvTransposeRelu2d`."""

    def forward(self, x):
        return self.apply_quant_activation(F.relu(self.calc_conv_transpose2d_qat(x)))


class _ConvTransposeBnActivation2d(_float._ConvTransposeBnActivation2d, QATModule):

    def _fold(self):
        """``(k, beta, running_mean)`` [C_out] each (see :func:`fold_bn`)."""
        return fold_bn(self.bn)

    def folded_weight(self, k):
        """The weight with ``k`` folded in (before fake quantization)."""
        ct = self.conv_transpose2d
        return fold_transposed_weight(ct.weight, k, ct.groups)

    def calc_conv_transpose2d_bn_qat(self, x):
        ct = self.conv_transpose2d
        k, beta, mean = self._fold()
        w_qat = self.apply_quant_weight(self.folded_weight(k))
        return approx_bn_forward(self, ct, x, w_qat, (k, beta, mean), lambda w, bias: F.conv_transpose2d(
            x, w, bias, ct.stride, ct.padding, ct.output_padding, ct.dilation, ct.groups), 1)

    @classmethod
    def from_float_module(cls, float_module):
        qmod = build_uninitialized(cls, **float_module.config())
        qmod.conv_transpose2d = float_module.conv_transpose2d
        qmod.bn = float_module.bn
        return qmod.train(float_module.training)


class ConvTransposeBn2d(_ConvTransposeBnActivation2d):
    """``act_fq(bn(conv_transpose2d(x)))`` with the BatchNorm folded into the
    fake-quantized weight (see the module docstring); from
    :class:`mgtrace.module.ConvTransposeBn2d`, same arguments and state_dict
    keys (``conv_transpose2d.weight``, ``bn.running_mean``, ...) plus the
    observers'."""

    def forward(self, x):
        return self.apply_quant_activation(self.calc_conv_transpose2d_bn_qat(x))


class ConvTransposeBnRelu2d(_ConvTransposeBnActivation2d):
    """``act_fq(relu(bn(conv_transpose2d(x))))``, as :class:`ConvTransposeBn2d`."""

    def forward(self, x):
        return self.apply_quant_activation(F.relu(self.calc_conv_transpose2d_bn_qat(x)))
