"""QAT Linear and LinearRelu (MegEngine's ``module/qat/linear.py``)."""
import mgtrace.functional as F
from mgtrace.module import builtin as _float
from mgtrace.module.qat.module import QATModule, sharing_float_weights

__all__ = ["Linear", "LinearRelu"]


class Linear(_float.Linear, QATModule):
    """:class:`mgtrace.module.Linear` with a fake-quantized weight and
    output: ``act_fq(linear(x, weight_fq(weight), bias_fq(bias)))``, the
    bias fake-quantized to qint32 as :meth:`QATModule.apply_quant_bias`
    says. Arguments, shapes and parameters as the float Linear."""

    def calc_linear_qat(self, x):
        w_qat = self.apply_quant_weight(self.weight)
        return F.linear(x, w_qat, self.apply_quant_bias(self.bias, x, w_qat))

    def forward(self, x):
        return self.apply_quant_activation(self.calc_linear_qat(x))

    @classmethod
    def from_float_module(cls, float_module):
        return sharing_float_weights(cls, float_module)


class LinearRelu(Linear):
    """``act_fq(relu(linear(...)))``: a QAT Linear followed by ReLU."""

    def forward(self, x):
        return self.apply_quant_activation(F.relu(self.calc_linear_qat(x)))
