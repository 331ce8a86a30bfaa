"""mgtrace.module (imported as ``M``): Module, Parameter, containers, builtin modules.

>>> import mgtrace as mt, mgtrace.module as M
>>> net = M.Sequential(M.Conv2d(3, 8, 3, padding=1), M.BatchNorm2d(8), M.ReLU())
>>> [k for k in net.state_dict()][:3]
['0.weight', '0.bias', '1.weight']
>>> M.is_builtin(net[0]), M.is_builtin(net)
(True, False)

Builtin modules are leaves for the tracer and are archived by stable name,
version and config (see :mod:`mgtrace.module.builtin`). Initialisers live in
:mod:`mgtrace.module.init`.
"""
from mgtrace.module.parameter import Parameter
from mgtrace.module.module import IncompatibleKeys, Module, StateDictError
from mgtrace.module.container import ModuleDict, ModuleList, Sequential
from mgtrace.module import init
from mgtrace.module.builtin import (
    UnknownBuiltinError, builtin_type, builtin_types, is_builtin, register_as_builtin,
    # layers
    Linear, Conv1d, Conv2d, ConvTranspose2d, Embedding,
    # normalization
    BatchNorm1d, BatchNorm2d, LayerNorm, GroupNorm,
    # activations
    ReLU, ReLU6, GELU, SiLU, Sigmoid, Tanh, Softmax, Hardswish, Hardsigmoid,
    # pooling and shape
    MaxPool2d, AvgPool2d, AdaptiveAvgPool2d, Flatten,
    # misc
    Dropout, Identity,
    # MegEngine's further modules
    LeakyReLU, PReLU, PixelShuffle, Pad, AdaptiveMaxPool2d, InstanceNorm, GeneralNorm,
    LocalResponseNorm, SyncBatchNorm, Conv3d, ConvTranspose3d, LocalConv2d, SlidingWindow,
    SlidingWindowTranspose, DeformableConv2d, RegionRestrictedConv, DeformablePSROIPooling)
from mgtrace.module.rnn import LSTM, LSTMCell, RNN, RNNCell
from mgtrace.module.attention import MultiHeadAttention
from mgtrace.module.fused import (ConvBn2d, ConvBnRelu2d, ConvRelu2d, Elemwise,
                                  fuse_conv_bn_relu_module)
from mgtrace.module.fused_linear import (BatchMatMulActivation, Concat, LinearBn1d,
                                         LinearBnRelu1d)
from mgtrace.module.fused_conv_transpose import (ConvTransposeBn2d, ConvTransposeBnRelu2d,
                                                 ConvTransposeRelu2d)
from mgtrace.module.quant_dequant import DequantStub, QuantStub

__all__ = [
    "Parameter", "Module", "StateDictError", "IncompatibleKeys",
    "Sequential", "ModuleList", "ModuleDict", "init",
    "register_as_builtin", "is_builtin", "builtin_type", "builtin_types", "UnknownBuiltinError",
    "Linear", "Conv1d", "Conv2d", "ConvTranspose2d", "Embedding",
    "BatchNorm1d", "BatchNorm2d", "LayerNorm", "GroupNorm",
    "ReLU", "ReLU6", "GELU", "SiLU", "Sigmoid", "Tanh", "Softmax", "Hardswish", "Hardsigmoid",
    "MaxPool2d", "AvgPool2d", "AdaptiveAvgPool2d", "Flatten", "Dropout", "Identity",
    "LeakyReLU", "PReLU", "PixelShuffle", "Pad", "AdaptiveMaxPool2d", "InstanceNorm",
    "GeneralNorm", "LocalResponseNorm", "SyncBatchNorm", "Conv3d", "ConvTranspose3d", "LocalConv2d",
    "SlidingWindow", "SlidingWindowTranspose", "RNNCell", "LSTMCell", "RNN", "LSTM",
    "MultiHeadAttention", "DeformableConv2d", "RegionRestrictedConv", "DeformablePSROIPooling",
    "Elemwise", "ConvRelu2d", "ConvBn2d", "ConvBnRelu2d", "fuse_conv_bn_relu_module",
    "QuantStub", "DequantStub", "LinearBn1d", "LinearBnRelu1d", "BatchMatMulActivation",
    "Concat", "ConvTransposeRelu2d", "ConvTransposeBn2d", "ConvTransposeBnRelu2d",
]
