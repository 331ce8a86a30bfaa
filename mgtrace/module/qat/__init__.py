"""mgtrace.module.qat: MegEngine's quantization-aware-training modules.

Each is its float module (same constructor, parameters and state_dict keys)
plus four optional children that a :class:`~mgtrace.quantization.QConfig`
fills: ``weight_observer``, ``weight_fake_quant``, ``act_observer``,
``act_fake_quant``. The forward fake-quantizes the weight before the layer
and the output after it. Build them from float modules with
``from_float_module`` or, for a whole model,
:func:`mgtrace.quantization.quantize_qat`. Import this package explicitly
(``import mgtrace.module.qat as QM``); ``mgtrace.module`` does not.

As MegEngine's, a QAT layer whose input is the output of an enabled fake
quantizer (another QAT layer's, a QuantStub's; symmetric qint8) and whose
weight and activation fake quantizers are enabled fake-quantizes its bias
to qint32 with scale ``s_in * s_w`` (per output channel with per-channel
weights): the bias the int8 layer adds (:meth:`QATModule.apply_quant_bias`).
The qparams ride on the fake quantizer's output tensor (its
``_fq_qparams``, MegEngine's ``Tensor.qparams``), so an op between the
two layers (a reshape) drops them, as in MegEngine, and the bias stays float.

Every class here is a builtin (a leaf for the tracer) named
``mgtrace.module.qat.<Name>``, stored in archives (format 1.2) with its
observers' and fake quantizers' configs (``config()["quant"]``). A user's
subclass of one is not: it is traced into, as MegEngine's ``is_qat``
TracedModule, which ``flatten()`` keeps whole.
"""
from mgtrace.module.qat.module import QATModule
from mgtrace.module.qat.linear import Linear, LinearRelu
from mgtrace.module.qat.conv import Conv2d, ConvRelu2d
from mgtrace.module.qat.conv_bn import ConvBn2d, ConvBnRelu2d
from mgtrace.module.qat.elemwise import Elemwise
from mgtrace.module.qat.quant_dequant import DequantStub, QuantStub
from mgtrace.module.qat.linear_bn import LinearBn1d, LinearBnRelu1d
from mgtrace.module.qat.concat import BatchMatMulActivation, Concat
from mgtrace.module.qat.conv_transpose import (ConvTranspose2d, ConvTransposeBn2d,
                                               ConvTransposeBnRelu2d, ConvTransposeRelu2d)

from mgtrace.module.builtin import register_as_builtin as _register

for _cls in (Linear, LinearRelu, Conv2d, ConvRelu2d, ConvBn2d, ConvBnRelu2d, Elemwise,
             QuantStub, DequantStub, LinearBn1d, LinearBnRelu1d, Concat,
             BatchMatMulActivation, ConvTranspose2d, ConvTransposeRelu2d, ConvTransposeBn2d,
             ConvTransposeBnRelu2d):
    _register(_cls, name=f"mgtrace.module.qat.{_cls.__name__}")
del _cls

__all__ = ["QATModule", "Linear", "LinearRelu", "Conv2d", "ConvRelu2d", "ConvBn2d",
           "ConvBnRelu2d", "Elemwise", "QuantStub", "DequantStub", "LinearBn1d",
           "LinearBnRelu1d", "Concat", "BatchMatMulActivation", "ConvTranspose2d",
           "ConvTransposeRelu2d", "ConvTransposeBn2d", "ConvTransposeBnRelu2d"]
