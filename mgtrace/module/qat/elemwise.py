"""QAT Elemwise (MegEngine's ``module/qat/elemwise.py``)."""
from mgtrace.module import fused as _float
from mgtrace.module.qat.module import QATModule

__all__ = ["Elemwise"]


class Elemwise(_float.Elemwise, QATModule):
    """:class:`mgtrace.module.Elemwise` with a fake-quantized output (no
    weight): ``Elemwise("fuse_add_relu")(x, y)`` is ``act_fq(relu(x + y))``."""

    with_weight = False

    def forward(self, *inps):
        return self.apply_quant_activation(super().forward(*inps))

    @classmethod
    def from_float_module(cls, float_module):
        return cls(float_module.method).train(float_module.training)
