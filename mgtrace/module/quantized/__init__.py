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
same). ConvTranspose2d (and its Relu / Bn forms) and BatchMatMulActivation
have no int8 kernel: they compute the integer accumulator exactly by
another path and requantize by the same rule (:mod:`.exact`), so their
results are bitwise an integer implementation's. Activations are qint8 or
quint8 per tensor, weights qint8 / qint8_narrow per tensor or per output
channel.

They are builtins (leaves for the tracer) named
``mgtrace.module.quantized.<Name>``, stored in archives (format 1.2) by
config (geometry, ``act_qparams`` as ``{dtype, scale, zero_point}``) and
tensors (the int8 ``weight``, ``weight_scale``, ``bias``).
"""
from mgtrace.module.quantized.modules import (Concat, Conv2d, ConvBn2d, ConvBnRelu2d,
                                              ConvRelu2d, DequantStub, Elemwise, Linear,
                                              LinearRelu, QuantizedModule, QuantStub)
from mgtrace.module.quantized.conv_transpose import (ConvTranspose2d, ConvTransposeBn2d,
                                                     ConvTransposeBnRelu2d, ConvTransposeRelu2d)
from mgtrace.module.quantized.linear_bn import LinearBn1d, LinearBnRelu1d
from mgtrace.module.quantized.batch_matmul import BatchMatMulActivation

from mgtrace.module.builtin import register_as_builtin as _register

for _cls in (QuantStub, DequantStub, Linear, LinearRelu, Conv2d, ConvRelu2d, ConvBn2d,
             ConvBnRelu2d, Elemwise, Concat, ConvTranspose2d, ConvTransposeRelu2d,
             ConvTransposeBn2d, ConvTransposeBnRelu2d, LinearBn1d, LinearBnRelu1d,
             BatchMatMulActivation):
    _register(_cls, name=f"mgtrace.module.quantized.{_cls.__name__}")
del _cls

__all__ = ["QuantizedModule", "QuantStub", "DequantStub", "Linear", "LinearRelu", "Conv2d",
           "ConvRelu2d", "ConvBn2d", "ConvBnRelu2d", "Elemwise", "Concat", "ConvTranspose2d",
           "ConvTransposeRelu2d", "ConvTransposeBn2d", "ConvTransposeBnRelu2d", "LinearBn1d",
           "LinearBnRelu1d", "BatchMatMulActivation"]
