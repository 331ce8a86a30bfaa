"""QAT QuantStub and DequantStub (MegEngine's ``module/qat/quant_dequant.py``)."""
from mgtrace.module import quant_dequant as _float
from mgtrace.module.qat.module import QATModule

__all__ = ["QuantStub", "DequantStub"]


class QuantStub(_float.QuantStub, QATModule):
    """Fake-quantizes its input with the activation observer's qparams
    (no weight)."""

    with_weight = False

    def forward(self, x):
        return self.apply_quant_activation(x)

    @classmethod
    def from_float_module(cls, float_module):
        return cls().train(float_module.training)


class DequantStub(_float.DequantStub, QATModule):
    """Returns its input (no weight, no activation to quantize)."""

    with_weight = False
    with_act = False

    def forward(self, x):
        return x

    @classmethod
    def from_float_module(cls, float_module):
        return cls().train(float_module.training)
