"""MegEngine's fused float modules around a transposed convolution
(``module/conv.py``'s ``ConvTransposeRelu2d``, ``module/conv_transpose_bn.py``):
ConvTransposeRelu2d, ConvTransposeBn2d, ConvTransposeBnRelu2d.

They compute what their parts compute; :func:`mgtrace.quantization.quantize_qat`
maps each to its :mod:`mgtrace.module.qat` version. Arguments are
:class:`~mgtrace.module.ConvTranspose2d`'s (torch.nn's order: ``output_padding``
before ``groups``, ``dilation`` last; MegEngine puts ``dilation`` before
``groups``: pass them by keyword to write code for both). The Bn forms hold
``conv_transpose2d`` (a ConvTranspose2d) and ``bn`` (a BatchNorm2d), as
MegEngine, so state_dict keys read ``conv_transpose2d.weight``,
``bn.running_mean``; BatchNorm's ``momentum`` is mgtrace's (PyTorch's
convention, default 0.1). Builtins of format 1.2.
"""
import mgtrace.functional as F
from mgtrace.module.builtin import BatchNorm2d, ConvTranspose2d, _builtin
from mgtrace.module.fused import _PartThenBn, _initialized, _uninitialized

__all__ = ["ConvTransposeRelu2d", "ConvTransposeBn2d", "ConvTransposeBnRelu2d",
           "fold_transposed_weight"]


def fold_transposed_weight(weight, k, groups):
    """``weight`` [C_in, C_out/groups, KH, KW] times ``k`` [C_out] along its
    output channels (group g's C_out/groups channels are k's g-th block)."""
    c_in, per, kh, kw = weight.shape
    if groups == 1:
        return weight * k.reshape((1, -1, 1, 1))
    w = weight.reshape((groups, c_in // groups, per, kh, kw))
    return (w * k.reshape((groups, 1, per, 1, 1))).reshape((c_in, per, kh, kw))


@_builtin
class ConvTransposeRelu2d(ConvTranspose2d):
    """``relu(conv_transpose2d(x))``: a ConvTranspose2d (same arguments,
    config and state_dict keys ``weight`` [C_in, C_out/groups, KH, KW],
    ``bias`` [C_out]) followed by ReLU (MegEngine's ``ConvTransposeRelu2d``).
    x float32 [N, C_in, H, W] -> [N, C_out, OH, OW]."""

    def forward(self, x):
        return F.relu(super().forward(x))


class _ConvTransposeBnActivation2d(_PartThenBn):
    """``conv_transpose2d`` (ConvTranspose2d) then ``bn`` (BatchNorm2d)."""
    _PART = "conv_transpose2d"

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0,
                 output_padding=0, groups=1, bias=True, dilation=1, padding_mode="zeros",
                 eps=1e-5, momentum=0.1, affine=True, track_running_stats=True):
        super().__init__()
        build = _uninitialized if "reset_parameters" in self.__dict__ else _initialized
        self.conv_transpose2d = build(ConvTranspose2d, in_channels, out_channels, kernel_size,
                                      stride, padding, output_padding, groups, bias, dilation,
                                      padding_mode)
        self.bn = build(BatchNorm2d, out_channels, eps, momentum, affine, track_running_stats)


@_builtin
class ConvTransposeBn2d(_ConvTransposeBnActivation2d):
    """``bn(conv_transpose2d(x))`` (MegEngine's ``ConvTransposeBn2d``).
    Args: ConvTranspose2d's, then BatchNorm2d's ``eps``, ``momentum``,
    ``affine``, ``track_running_stats``. x float32 [N, C_in, H, W] ->
    [N, C_out, OH, OW]."""

    def forward(self, x):
        return self.bn(self.conv_transpose2d(x))


@_builtin
class ConvTransposeBnRelu2d(_ConvTransposeBnActivation2d):
    """``relu(bn(conv_transpose2d(x)))`` (MegEngine's ``ConvTransposeBnRelu2d``),
    as :class:`ConvTransposeBn2d`."""

    def forward(self, x):
        return F.relu(self.bn(self.conv_transpose2d(x)))
