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

They are builtins (leaves for the tracer) named
``mgtrace.module.quantized.<Name>``, stored in archives (format 1.2) by
config (geometry, ``act_qparams`` as ``{dtype, scale, zero_point}``) and
tensors (the int8 ``weight``, ``weight_scale``, ``bias``). Not yet:
ConvTranspose2d, BatchMatMulActivation and the Linear-BN forms have no
quantized version.
"""
from mgtrace.module.quantized.modules import (Concat, Conv2d, ConvBn2d, ConvBnRelu2d,
                                              ConvRelu2d, DequantStub, Elemwise, Linear,
                                              LinearRelu, QuantizedModule, QuantStub)

from mgtrace.module.builtin import register_as_builtin as _register

for _cls in (QuantStub, DequantStub, Linear, LinearRelu, Conv2d, ConvRelu2d, ConvBn2d,
             ConvBnRelu2d, Elemwise, Concat):
    _register(_cls, name=f"mgtrace.module.quantized.{_cls.__name__}")
del _cls

__all__ = ["QuantizedModule", "QuantStub", "DequantStub", "Linear", "LinearRelu", "Conv2d",
           "ConvRelu2d", "ConvBn2d", "ConvBnRelu2d", "Elemwise", "Concat"]
