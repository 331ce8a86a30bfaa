"""QAT Conv2d and ConvRelu2d (MegEngine's ``module/qat/conv.py``)."""
import mgtrace.functional as F
from mgtrace.module import builtin as _float
from mgtrace.module.qat.module import QATModule, sharing_float_weights

__all__ = ["Conv2d", "ConvRelu2d"]


class Conv2d(_float.Conv2d, QATModule):
    """:class:`mgtrace.module.Conv2d` with a fake-quantized weight and
    output (and the bias to qint32, :meth:`QATModule.apply_quant_bias`).
    Arguments, shapes and parameters as the float Conv2d (any groups,
    stride, padding, dilation, padding_mode)."""

    def calc_conv_qat(self, x):
        w_qat = self.apply_quant_weight(self.weight)
        return F.conv2d(self._padded(x), w_qat, self.apply_quant_bias(self.bias, x, w_qat),
                        self.stride, self._conv_padding(), self.dilation, self.groups)

    def forward(self, x):
        return self.apply_quant_activation(self.calc_conv_qat(x))

    @classmethod
    def from_float_module(cls, float_module):
        return sharing_float_weights(cls, float_module)


class ConvRelu2d(Conv2d):
    """``act_fq(relu(conv2d(...)))``, from :class:`mgtrace.module.ConvRelu2d`."""

    def forward(self, x):
        return self.apply_quant_activation(F.relu(self.calc_conv_qat(x)))
