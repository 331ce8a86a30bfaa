"""QuantStub and DequantStub (MegEngine's ``module/quant_dequant.py``):
markers of where a model's quantized part begins and ends. Both return
their input in a float model; :func:`mgtrace.quantization.quantize_qat`
turns them into QAT stubs (a QuantStub then fake-quantizes its input).
They are not builtins yet, so tracing a float model goes through them and
records nothing.
"""
from mgtrace.module.module import Module

__all__ = ["QuantStub", "DequantStub"]


class QuantStub(Module):
    """Where a float tensor enters the quantized part: ``forward(x)`` is x."""

    def forward(self, x):
        return x


class DequantStub(Module):
    """Where a tensor leaves the quantized part: ``forward(x)`` is x."""

    def forward(self, x):
        return x
