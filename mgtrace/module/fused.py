"""MegEngine's float modules for fused operators: ``Elemwise``, ``ConvRelu2d``,
``ConvBn2d``, ``ConvBnRelu2d``, and :func:`fuse_conv_bn_relu_module`.

They compute what their parts compute, one after the other; being single
builtin modules (leaves for the tracer, archived by stable name and config,
format 1.1), they mark where a deployment may run one fused kernel. Their
state_dict names are MegEngine's: ``ConvRelu2d`` is a Conv2d (``weight``,
``bias``); ``ConvBn2d`` and ``ConvBnRelu2d`` hold ``conv`` (a Conv2d) and
``bn`` (a BatchNorm2d), so keys read ``conv.weight``, ``bn.running_mean``.

BatchNorm's ``momentum`` is mgtrace's (PyTorch's convention, default 0.1),
as for :class:`~mgtrace.module.BatchNorm2d`.
"""
import copy

import mgtrace.functional as F
from mgtrace.module.builtin import BatchNorm2d, Conv2d, ReLU, _builtin
from mgtrace.module.module import Module
from mgtrace.module.parameter import Parameter

__all__ = ["Elemwise", "ConvRelu2d", "ConvBn2d", "ConvBnRelu2d", "fuse_conv_bn_relu_module",
           "ELEMWISE_MODES"]

def _fuse_add(act):
    return lambda x, y: act(F.add(x, y))


# MegEngine's Elemwise modes (lower case; any case is accepted) -> the function
ELEMWISE_MODES = {
    # unary
    "relu": F.relu, "abs": F.abs, "neg": F.neg, "exp": F.exp, "expm1": F.expm1, "log": F.log,
    "log1p": F.log1p, "sin": F.sin, "cos": F.cos, "tan": F.tan, "tanh": F.tanh,
    "sigmoid": F.sigmoid, "sqrt": F.sqrt, "rsqrt": F.rsqrt, "floor": F.floor, "ceil": F.ceil,
    "round": F.round, "erf": F.erf, "square": F.square, "sign": F.sign, "h_swish": F.hardswish,
    "gelu": F.gelu, "silu": F.silu, "relu6": F.relu6,
    # binary
    "add": F.add, "sub": F.sub, "mul": F.mul, "true_div": F.div, "floor_div": F.floor_div,
    "mod": F.mod, "pow": F.pow, "max": F.maximum, "min": F.minimum, "atan2": F.atan2,
    "eq": F.equal, "lt": F.less, "leq": F.less_equal,
    "fuse_add_relu": _fuse_add(F.relu), "fuse_add_sigmoid": _fuse_add(F.sigmoid),
    "fuse_add_tanh": _fuse_add(F.tanh), "fuse_add_h_swish": _fuse_add(F.hardswish),
    "switch_gt0": lambda x, y: F.where(F.greater(x, 0), y, F.zeros_like(y)),
    # ternary and more
    "fuse_mul_add3": lambda a, b, c: F.add(F.mul(a, b), c),
    "fuse_mul_add4": lambda a, b, c, d: F.add(F.mul(a, b), F.mul(c, d)),
    "cond_leq_mov": lambda a, b, c: F.where(F.less_equal(a, b), c, F.zeros_like(c)),
}


@_builtin
class Elemwise(Module):
    """An elementwise operator as a module (MegEngine's ``Elemwise``):
    ``Elemwise("add")(x, y)`` is ``x + y``, ``Elemwise("fuse_add_relu")(x,
    y)`` is ``relu(x + y)``.

    Args:
        method: a mode of :data:`ELEMWISE_MODES` (any case: "ADD" works).

    forward takes as many tensors as the mode does; dtypes and broadcasting
    are those of the function (mgtrace.functional).

    Raises:
        ValueError: an unknown mode (the message lists them).

    >>> import mgtrace as mt, mgtrace.module as M
    >>> M.Elemwise("fuse_mul_add3")(mt.tensor([2.0]), mt.tensor([3.0]), mt.tensor([1.0])).tolist()
    [7.0]
    """
    def __init__(self, method):
        super().__init__()
        if not isinstance(method, str) or method.lower() not in ELEMWISE_MODES:
            raise ValueError(f"Elemwise: method must be one of {', '.join(ELEMWISE_MODES)}, "
                             f"got {method!r}")
        self.method = method

    def config(self):
        return {"method": self.method}

    def extra_repr(self):
        return repr(self.method)

    def forward(self, *inps):
        return ELEMWISE_MODES[self.method.lower()](*inps)


@_builtin
class ConvRelu2d(Conv2d):
    """``relu(conv2d(x))``: a Conv2d (same arguments, config and state_dict
    keys ``weight``, ``bias``) followed by ReLU (MegEngine's ``ConvRelu2d``)."""
    def forward(self, x):
        return F.relu(super().forward(x))


class _PartThenBn(Module):
    """A fused module of one part (its attribute ``_PART``: ``conv`` or
    ``linear``) followed by BatchNorm ``bn``: the parts' reset, the config
    (the part's, then bn's settings) and the state effect, shared by the
    conv and linear forms."""
    _PART = None

    def reset_parameters(self):
        getattr(self, self._PART).reset_parameters()
        self.bn.reset_parameters()

    def config(self):
        cfg = getattr(self, self._PART).config()
        cfg.update(eps=self.bn.eps, momentum=self.bn.momentum, affine=self.bn.affine,
                   track_running_stats=self.bn.track_running_stats)
        return cfg

    @property
    def mutates_state(self):
        """A call in training mode updates bn's running statistics."""
        return self.bn.training and self.bn.track_running_stats


class _ConvBnActivation2d(_PartThenBn):
    """``conv`` (Conv2d) then ``bn`` (BatchNorm2d), MegEngine's layout."""
    _PART = "conv"

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0,
                 dilation=1, groups=1, bias=True, padding_mode="zeros", eps=1e-5,
                 momentum=0.1, affine=True, track_running_stats=True):
        super().__init__()
        # an archive being loaded shadows reset_parameters (its tensors replace the
        # initial values): the parts are then built without initialising theirs
        build = _uninitialized if "reset_parameters" in self.__dict__ else _initialized
        self.conv = build(Conv2d, in_channels, out_channels, kernel_size, stride, padding,
                          dilation, groups, bias, padding_mode)
        self.bn = build(BatchNorm2d, out_channels, eps, momentum, affine, track_running_stats)



def _initialized(cls, *args):
    return cls(*args)


def _uninitialized(cls, *args):
    m = cls.__new__(cls)
    m.__dict__["reset_parameters"] = lambda: None
    try:
        cls.__init__(m, *args)
    finally:
        m.__dict__.pop("reset_parameters", None)
    return m


@_builtin
class ConvBn2d(_ConvBnActivation2d):
    """``bn(conv(x))`` (MegEngine's ``ConvBn2d``). Args: Conv2d's, then
    BatchNorm2d's ``eps``, ``momentum``, ``affine``, ``track_running_stats``.
    state_dict: ``conv.weight``, ``conv.bias``, ``bn.weight``, ``bn.bias``,
    ``bn.running_mean``, ``bn.running_var``, ``bn.num_batches_tracked``."""

    def forward(self, x):
        return self.bn(self.conv(x))


@_builtin
class ConvBnRelu2d(_ConvBnActivation2d):
    """``relu(bn(conv(x)))`` (MegEngine's ``ConvBnRelu2d``); arguments and
    state_dict as :class:`ConvBn2d`."""

    def forward(self, x):
        return F.relu(self.bn(self.conv(x)))


def fuse_conv_bn_relu_module(conv, bn=None, relu=None):
    """One fused module for ``conv`` followed by ``bn`` and/or ``relu``
    (MegEngine's ``megengine.utils.bn_fusion.fuse_conv_bn_relu_module``).

    In training mode BatchNorm still has to learn, so the result is a
    ConvBn2d / ConvBnRelu2d holding copies of ``conv``'s weights and of
    ``bn``. In eval mode the BatchNorm folds into the convolution::

        w' = w * gamma / sqrt(var + eps)        (per output channel)
        b' = beta + (b - mean) * gamma / sqrt(var + eps)

    giving a Conv2d (or ConvRelu2d with ``relu``) with a bias. A
    ConvTranspose2d (as MegEngine's) gives ConvTransposeBn2d /
    ConvTransposeBnRelu2d, or a folded ConvTranspose2d / ConvTransposeRelu2d,
    its weight [C_in, C_out/groups, KH, KW] scaled along the output channels.

    Args:
        conv: a Conv2d or ConvTranspose2d. bn: a BatchNorm2d over its output
            channels, or None. relu: a ReLU, or None.

    Returns:
        the new module (the inputs are not changed), in conv's mode.

    Raises:
        TypeError: arguments of other types.
        ValueError: conv and bn in different modes, or bn.num_features !=
            conv.out_channels; nothing to fuse (bn and relu both None).
    """
    from mgtrace.module import fused_conv_transpose as _ct
    fn = "fuse_conv_bn_relu_module"
    transposed = type(conv) is _ct.ConvTranspose2d
    if type(conv) is not Conv2d and not transposed:
        raise TypeError(f"{fn}: conv must be an mgtrace.module.Conv2d or ConvTranspose2d, got "
                        f"{type(conv).__name__}")
    if bn is not None and not isinstance(bn, BatchNorm2d):
        raise TypeError(f"{fn}: bn must be a BatchNorm2d or None, got {type(bn).__name__}")
    if relu is not None and not isinstance(relu, ReLU):
        raise TypeError(f"{fn}: relu must be a ReLU or None, got {type(relu).__name__}")
    if bn is None and relu is None:
        raise ValueError(f"{fn}: give bn and/or relu to fuse into conv")
    cfg = conv.config()
    if bn is not None:
        if conv.training != bn.training:
            raise ValueError(f"{fn}: conv and bn must be in the same mode (train or eval)")
        if bn.num_features != conv.out_channels:
            raise ValueError(f"{fn}: bn has {bn.num_features} features but conv has "
                             f"{conv.out_channels} output channels")
    if transposed:
        with_bn = _ct.ConvTransposeBnRelu2d if relu is not None else _ct.ConvTransposeBn2d
        folded = _ct.ConvTransposeRelu2d if relu is not None else _ct.ConvTranspose2d
    else:
        with_bn = ConvBnRelu2d if relu is not None else ConvBn2d
        folded = ConvRelu2d if relu is not None else Conv2d
    if bn is not None and conv.training:
        fused = with_bn(**cfg)
        getattr(fused, with_bn._PART).load_state_dict(conv.state_dict())
        fused.bn = copy.deepcopy(bn)
    else:
        weight, bias = conv.weight, conv.bias
        if bn is not None:
            weight, bias = _fold(conv, bn, transposed)
            cfg["bias"] = True
        fused = folded(**cfg)
        fused.weight = Parameter(weight)
        if bias is not None:
            fused.bias = Parameter(bias)
    return fused.train(conv.training)


def _fold(conv, bn, transposed=False):
    """conv's weight and bias with bn (eval mode) folded in (a transposed
    convolution's weight along its output channels, axis 1 of each group)."""
    c = conv.out_channels
    mean = bn.running_mean if bn.running_mean is not None else F.zeros((c,))
    var = bn.running_var if bn.running_var is not None else F.ones((c,))
    gamma = bn.weight if bn.weight is not None else F.ones((c,))
    beta = bn.bias if bn.bias is not None else F.zeros((c,))
    scale = F.div(gamma, F.sqrt(F.add(var, bn.eps)))
    if transposed:
        from mgtrace.module.fused_conv_transpose import fold_transposed_weight
        weight = fold_transposed_weight(conv.weight, scale, conv.groups)
    else:
        weight = F.mul(conv.weight, scale.reshape(c, 1, 1, 1))
    bias = conv.bias if conv.bias is not None else F.zeros((c,))
    return weight, F.add(beta, F.mul(F.sub(bias, mean), scale))
