"""QuantStub and DequantStub (MegEngine's ``module/quant_dequant.py``):
markers of where a model's quantized part begins and ends. Both return
their input in a float model; :func:`mgtrace.quantization.quantize_qat`
turns them into QAT stubs (a QuantStub then fake-quantizes its input).

Both are builtins (``mgtrace.module.QuantStub`` / ``DequantStub``, format
1.2), as every ``M.*`` module is in MegEngine's TracedModule: a trace
records a call to each, so a float model with stubs (a user's model
written MegEngine's way, or one :func:`mgtrace.quantization.quantize_adds`
rewrote) saves and loads as it is, and ``quantize_qat`` of the traced
model finds the stubs to convert.
"""
from mgtrace.module.builtin import _builtin
from mgtrace.module.module import Module

__all__ = ["QuantStub", "DequantStub"]


@_builtin
class QuantStub(Module):
    """Where a float tensor enters the quantized part: ``forward(x)`` is x
    (any shape and dtype). No arguments, no state."""

    def config(self):
        """The constructor arguments: none."""
        return {}

    def forward(self, x):
        return x


@_builtin
class DequantStub(Module):
    """Where a tensor leaves the quantized part: ``forward(x)`` is x (any
    shape and dtype). No arguments, no state."""

    def config(self):
        """The constructor arguments: none."""
        return {}

    def forward(self, x):
        return x
