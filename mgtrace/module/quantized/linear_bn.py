"""Quantized LinearBn1d and LinearBnRelu1d (MegEngine's
``module/quantized/linear_bn.py``): a QAT LinearBn1d in its eval form, the
BatchNorm folded into the weight and bias exactly as the QAT module folds it
(``k = gamma / sqrt(running_var + eps)``, ``w * k``, ``beta + k * (b -
running_mean)``), then an int8 :class:`~mgtrace.module.quantized.Linear`
(the same kernels, buffers and config; always with a bias)."""
import mgtrace.functional as F
from mgtrace.module.quantized.modules import Linear, _act_qparams

__all__ = ["LinearBn1d", "LinearBnRelu1d"]


def fold_linear_bn(qat):
    """``(weight, bias)`` of QAT LinearBn1d ``qat`` with its BatchNorm's
    running statistics folded in (MegEngine's ``fold_weight_bias``)."""
    bn, linear = qat.bn, qat.linear
    c = bn.num_features
    gamma = bn.weight if bn.weight is not None else F.ones((c,))
    beta = bn.bias if bn.bias is not None else F.zeros((c,))
    mean = bn.running_mean if bn.running_mean is not None else F.zeros((c,))
    var = bn.running_var if bn.running_var is not None else F.ones((c,))
    k = gamma / F.sqrt(var + float(bn.eps))
    b = linear.bias if linear.bias is not None else F.zeros_like(mean)
    return linear.weight * k.reshape((-1, 1)), beta + k * (b - mean)


class LinearBn1d(Linear):
    """Int8 ``bn(linear(x))`` folded: QuantizedTensor [..., in_features] ->
    QuantizedTensor [..., out_features] (float32 when ``act_qparams`` is
    None). Buffers and arguments as :class:`~mgtrace.module.quantized.Linear`."""

    @classmethod
    def from_qat_module(cls, qat):
        lin = qat.linear
        m = cls(lin.in_features, lin.out_features, True)
        w, b = fold_linear_bn(qat)
        m._setup(w, qat.get_weight_qparams(), b, _act_qparams(qat, False))
        return m


class LinearBnRelu1d(LinearBn1d):
    """``relu`` fused into :class:`LinearBn1d`'s saturation."""
    relu = True
