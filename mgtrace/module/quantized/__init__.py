"""mgtrace.module.quantized: MegEngine's quantized (int8 inference) modules.

:func:`mgtrace.quantization.quantize` makes them from QAT modules
(``from_qat_module``): the weight is quantized once with the weight
fake quantizer's (or observer's) qparams, BatchNorms are folded as in the
QAT module's eval mode, and the output gets the activation qparams. They
take and return :class:`~mgtrace.quantization.QuantizedTensor` s
(``QuantStub`` quantizes a float input, ``DequantStub`` gives floats back)
and compute with the int8 kernels of :mod:`mgtrace.quantization.int8`:
int32 accumulation, the float bias quantized to int32 at ``x_scale *
w_scale`` (MegEngine's qint32 bias), one requantization rounding half to
even, ReLU fused. ``Elemwise`` and ``Concat`` compute in float32 on the
dequantized inputs and requantize (MegEngine's quantized Elemwise does the
same); activations are qint8 or quint8 per tensor, weights qint8 /
qint8_narrow per tensor or per output channel.

Not yet: these are not tracer builtins (no archive of a quantized model),
and ConvTranspose2d, BatchMatMulActivation and the Linear-BN forms have no
quantized version.
"""
from mgtrace.module.quantized.modules import (Concat, Conv2d, ConvBn2d, ConvBnRelu2d,
                                              ConvRelu2d, DequantStub, Elemwise, Linear,
                                              LinearRelu, QuantizedModule, QuantStub)

__all__ = ["QuantizedModule", "QuantStub", "DequantStub", "Linear", "LinearRelu", "Conv2d",
           "ConvRelu2d", "ConvBn2d", "ConvBnRelu2d", "Elemwise", "Concat"]
