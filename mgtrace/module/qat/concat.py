"""QAT Concat and BatchMatMulActivation (MegEngine's ``module/qat/concat.py``
and ``module/qat/batch_matmul_activation.py``)."""
from mgtrace.module import fused_linear as _float
from mgtrace.module.qat.module import QATModule, sharing_float_weights

__all__ = ["Concat", "BatchMatMulActivation"]


class Concat(_float.Concat, QATModule):
    """``act_fq(concat(inps, axis))`` (no weight): the concatenation gets one
    set of qparams, as its int8 version needs."""

    with_weight = False

    def forward(self, inps, axis=0):
        return self.apply_quant_activation(super().forward(inps, axis))

    @classmethod
    def from_float_module(cls, float_module):
        return cls().train(float_module.training)


class BatchMatMulActivation(_float.BatchMatMulActivation, QATModule):
    """``act_fq(act(matmul(weight_fq(weight), x) + bias))``; arguments and
    shapes as :class:`mgtrace.module.BatchMatMulActivation` (its
    ``nonlinear_mode`` is kept; MegEngine's ``from_float_module`` drops it)."""

    def forward(self, x):
        w_qat = self.apply_quant_weight(self.weight)
        return self.apply_quant_activation(
            self._calc_linear(x, w_qat, self.apply_quant_bias(self.bias, x, w_qat, None)))

    @classmethod
    def from_float_module(cls, float_module):
        return sharing_float_weights(cls, float_module)
