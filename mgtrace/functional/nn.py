"""Neural-network functions: linear and convolution layers, pooling,
normalization, activations, softmax, dropout, resizing, padding.

Thin wrappers over the core (:mod:`mgtrace._core.nn`, ``reduce``, ``index``,
``linalg`` and the elementwise table of ``dispatch``): each checks its
arguments with messages that name them, then calls core ops. Composite
functions (``batch_norm``, ``layer_norm``, ``group_norm``, ``leaky_relu``,
``normalize``, ``one_hot``, ``dropout``) are written as sequences of core
ops, so a module tracer sees exactly those ops.

Conventions (MegEngine's, which follow PyTorch's for these functions):

- Layout NCHW; weights in PyTorch/MegEngine layout (``linear`` weight is
  ``[out, in]``, ``conv2d`` weight is ``[O, C/groups, KH, KW]``).
- Per-channel vectors (bias, BatchNorm statistics and affine parameters)
  may be given as ``[C]`` (PyTorch) or ``[1, C, 1, 1]`` (MegEngine).
- Convolution, pooling and resizing need floating-point tensors (the core's
  kernels); elementwise activations take any dtype and follow the core's
  promotion (MegEngine: integer inputs of transcendental ones give float32).
- Tensor arguments may also be NumPy arrays or lists; they go to the device
  of the Tensor arguments.
"""
import functools
import math

import numpy as np

from mgtrace._core import Tensor
from mgtrace._core import tensor as _tensor
from mgtrace._core import dispatch as _dispatch
from mgtrace._core import index as _index
from mgtrace._core import linalg as _linalg
from mgtrace._core import nn as _nn
from mgtrace._core import reduce as _reduce
from mgtrace._core import args as A
from mgtrace.functional._trace import mutates as _mutates
from mgtrace.functional.math import norm, sigmoid, tanh  # noqa: F401  (nn exports them too)

_U, _B, _T = _dispatch.unary_ops, _dispatch.binary_ops, _dispatch.ternary_ops

__all__ = [
    # layers
    "linear", "conv1d", "conv2d", "conv_transpose2d",
    # pooling
    "max_pool2d", "avg_pool2d", "adaptive_avg_pool2d", "adaptive_max_pool2d",
    # normalization
    "batch_norm", "layer_norm", "group_norm", "normalize",
    # activations
    "relu", "relu6", "leaky_relu", "gelu", "silu", "hardswish", "hardsigmoid", "sigmoid",
    "tanh", "softplus", "softmax", "log_softmax",
    # others
    "embedding", "one_hot", "dropout", "pad", "interpolate", "warp_perspective",
]


# ------------------------------------------------------------------ helpers

def _channel_vector(fn, name, v, channels, ndim):
    """A per-channel Tensor of C elements ([C] or [1, C, 1, ...]) as [C]."""
    if v is None:
        return None
    shape = v.shape
    ok = shape == (channels,) or (len(shape) == ndim and shape[1:2] == (channels,)
                                  and all(s == 1 for i, s in enumerate(shape) if i != 1))
    if not ok:
        raise ValueError(f"{fn}: {name} must have shape ({channels},) or (1, {channels}, 1, ...) "
                         f"for {channels} channels, got shape {shape}")
    return v.reshape(channels)


def _bcast_shape(channels, ndim):
    """[1, C, 1, ...] with ndim axes: a per-channel vector against NC* data."""
    return (1, channels) + (1,) * (ndim - 2)


# ------------------------------------------------------------------ layers

def linear(x, weight, bias=None):
    """Fully connected layer: ``y = x @ weight.T + bias`` (PyTorch, MegEngine).

    Args:
        x: [..., in_features], any dtype.
        weight: [out_features, in_features] (PyTorch/MegEngine layout).
        bias: [out_features] or None.

    Returns:
        [..., out_features]; dtype by MegEngine promotion of x, weight and
        bias (e.g. int32 x with float32 weight gives float32).

    Raises:
        ValueError: weight not 2-d, x 0-d, x's last axis not in_features,
            bias not [out_features], or tensors on different devices.
        TypeError: arguments that are not tensors or arrays.

    >>> import mgtrace as mt, mgtrace.functional as F
    >>> F.linear(mt.tensor([[1.0, 2.0]]), mt.tensor([[1.0, 0.0], [1.0, 1.0], [0.0, 2.0]]),
    ...          mt.tensor([0.0, 0.0, 1.0])).tolist()
    [[1.0, 3.0, 5.0]]
    """
    x, weight, bias = A.tensors("linear", x=x, weight=weight, bias=bias)
    A.check_ndim("linear", "weight", weight, 2, "[out_features, in_features]")
    if x.ndim == 0:
        raise ValueError("linear: x must have at least 1 axis [..., in_features], got a 0-d tensor")
    out_f, in_f = weight.shape
    if x.shape[-1] != in_f:
        raise ValueError(f"linear: x has {x.shape[-1]} features but weight expects {in_f} "
                         f"(x shape {x.shape}, weight shape {weight.shape})")
    if bias is not None and bias.shape != (out_f,):
        raise ValueError(f"linear: bias must have shape ({out_f},), got {bias.shape}")
    y = _linalg.matmul(x, weight.transpose(1, 0))
    return y if bias is None else _B["add"](y, bias)


def _conv_bias(fn, bias, channels, name="bias"):
    if bias is None or (bias.ndim == 1 and bias.shape[0] == channels):
        return bias
    if bias.shape != (channels,) and not (bias.size == channels and bias.ndim >= 2
                                          and bias.shape[1] == channels):
        raise ValueError(f"{fn}: {name} must have shape ({channels},) or (1, {channels}, 1, 1), "
                         f"got {bias.shape}")
    return bias.reshape(channels)


def _groups(fn, groups):
    return A.to_size(fn, "groups", groups, 1)


def conv2d(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    """2-D convolution (cross-correlation, as in PyTorch and MegEngine).

    Args:
        x: float [N, C, H, W].
        weight: float [O, C/groups, KH, KW].
        bias: float [O] (PyTorch) or [1, O, 1, 1] (MegEngine), or None.
        stride, dilation: int or (h, w) pair, >= 1.
        padding: int or (h, w) pair, >= 0 (zero padding).
        groups: int >= 1 dividing C and O.

    Returns:
        [N, O, OH, OW], OH = (H + 2*ph - dh*(KH-1) - 1) // sh + 1 (OW alike),
        in the promoted float dtype of x, weight and bias.

    Raises:
        ValueError: x not 4-d, weight not 4-d, channel or groups mismatch,
            bias shape, a kernel larger than the padded input, bad geometry.
        TypeError: integer or bool tensors; non-int geometry.

    >>> import numpy as np, mgtrace as mt, mgtrace.functional as F
    >>> x = mt.tensor(np.ones((1, 2, 4, 4), np.float32))
    >>> w = mt.tensor(np.ones((3, 2, 3, 3), np.float32))
    >>> F.conv2d(x, w, padding=1).shape
    (1, 3, 4, 4)
    """
    fn = "conv2d"
    x, weight, bias = A.tensors(fn, x=x, weight=weight, bias=bias)
    A.check_ndim(fn, "x", x, 4, "[N, C, H, W]")
    A.check_ndim(fn, "weight", weight, 4, "[O, C/groups, KH, KW]")
    g = _groups(fn, groups)
    for name, t in (("x", x), ("weight", weight), ("bias", bias)):
        if t is not None:
            A.check_float(fn, name, t)
    c, o, cg = x.shape[1], weight.shape[0], weight.shape[1]
    if c % g or o % g:
        raise ValueError(f"{fn}: groups={g} must divide the {c} input channels of x and the "
                         f"{o} output channels of weight")
    if cg * g != c:
        raise ValueError(f"{fn}: x has {c} channels but weight expects {cg * g} "
                         f"(weight.shape[1] * groups = {cg} * {g})")
    bias = _conv_bias(fn, bias, o)
    return _nn.conv2d(x, weight, bias, A.pair(fn, "stride", stride, 1),
                      A.pair(fn, "padding", padding, 0), A.pair(fn, "dilation", dilation, 1), g)


def conv1d(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    """1-D convolution, run as :func:`conv2d` with a unit height axis.

    Args:
        x: float [N, C, L].
        weight: float [O, C/groups, K].
        bias: float [O] or [1, O, 1], or None.
        stride, dilation: int >= 1; padding: int >= 0 (each may be a 1-tuple).
        groups: int >= 1 dividing C and O.

    Returns:
        [N, O, OL], OL = (L + 2*padding - dilation*(K-1) - 1) // stride + 1,
        in the promoted float dtype (PyTorch / MegEngine conv1d).

    Raises:
        ValueError, TypeError: as :func:`conv2d`, with x and weight 3-d.

    >>> import numpy as np, mgtrace as mt, mgtrace.functional as F
    >>> x = mt.tensor(np.arange(5, dtype=np.float32).reshape(1, 1, 5))
    >>> F.conv1d(x, mt.tensor([[[1.0, 1.0]]])).tolist()
    [[[1.0, 3.0, 5.0, 7.0]]]
    """
    fn = "conv1d"
    x, weight, bias = A.tensors(fn, x=x, weight=weight, bias=bias)
    A.check_ndim(fn, "x", x, 3, "[N, C, L]")
    A.check_ndim(fn, "weight", weight, 3, "[O, C/groups, K]")
    s = A.single(fn, "stride", stride, 1)
    p = A.single(fn, "padding", padding, 0)
    d = A.single(fn, "dilation", dilation, 1)
    if bias is not None:
        bias = _conv_bias(fn, bias, weight.shape[0])
    try:
        y = conv2d(x.expand_dims(2), weight.expand_dims(2), bias, (1, s), (0, p), (1, d), groups)
    except (ValueError, TypeError) as e:
        raise type(e)(str(e).replace("conv2d:", "conv1d:", 1)) from None
    return y.squeeze(2)


def conv_transpose2d(x, weight, bias=None, stride=1, padding=0, output_padding=0, dilation=1,
                     groups=1):
    """2-D transposed convolution (the gradient of conv2d with respect to its
    input; PyTorch's ``conv_transpose2d``, MegEngine's ``conv_transpose2d``).

    Args:
        x: float [N, C, H, W].
        weight: float [C, O/groups, KH, KW] (PyTorch's layout).
        bias: float [O] or [1, O, 1, 1], or None.
        stride, dilation: int or pair >= 1; padding: int or pair >= 0;
        output_padding: int or pair, smaller than stride or dilation.
        groups: int >= 1 dividing C.

    Returns:
        [N, O, OH, OW], OH = (H-1)*sh - 2*ph + dh*(KH-1) + oph + 1, in the
        promoted float dtype.

    Raises:
        ValueError: x or weight not 4-d, x's channels not weight.shape[0],
            bad bias shape or geometry. TypeError: integer tensors.

    >>> import numpy as np, mgtrace as mt, mgtrace.functional as F
    >>> x = mt.tensor(np.ones((1, 2, 3, 3), np.float32))
    >>> w = mt.tensor(np.ones((2, 4, 3, 3), np.float32))
    >>> F.conv_transpose2d(x, w, stride=2, padding=1, output_padding=1).shape
    (1, 4, 6, 6)
    """
    fn = "conv_transpose2d"
    x, weight, bias = A.tensors(fn, x=x, weight=weight, bias=bias)
    A.check_ndim(fn, "x", x, 4, "[N, C, H, W]")
    A.check_ndim(fn, "weight", weight, 4, "[C, O/groups, KH, KW]")
    g = _groups(fn, groups)
    for name, t in (("x", x), ("weight", weight), ("bias", bias)):
        if t is not None:
            A.check_float(fn, name, t)
    if x.shape[1] != weight.shape[0]:
        raise ValueError(f"{fn}: x has {x.shape[1]} channels but weight.shape[0] is {weight.shape[0]} "
                         f"(weight is [C, O/groups, KH, KW])")
    if x.shape[1] % g:
        raise ValueError(f"{fn}: groups={g} does not divide the {x.shape[1]} channels of x")
    bias = _conv_bias(fn, bias, weight.shape[1] * g)
    return _nn.conv_transpose2d(x, weight, bias, A.pair(fn, "stride", stride, 1),
                                A.pair(fn, "padding", padding, 0),
                                A.pair(fn, "output_padding", output_padding, 0),
                                A.pair(fn, "dilation", dilation, 1), g)


# ------------------------------------------------------------------ pooling

def _pool_window(fn, kernel_size, stride):
    """A pooling's (kernel, stride) as pairs, the stride the kernel's when
    None (PyTorch's); the checks every pooling function shares."""
    k = A.pair(fn, "kernel_size", kernel_size, 1)
    return k, k if stride is None else A.pair(fn, "stride", stride, 1)


def _pool_input(fn, x):
    (x,) = A.tensors(fn, x=x)
    A.check_ndim(fn, "x", x, 4, "[N, C, H, W]")
    A.check_float(fn, "x", x)
    return x


def max_pool2d(x, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False,
               return_indices=False):
    """2-D max pooling (PyTorch semantics; MegEngine's ``max_pool2d``).

    Args:
        x: float [N, C, H, W].
        kernel_size: int or (h, w) >= 1.
        stride: int or (h, w) >= 1; None means kernel_size.
        padding: int or (h, w), at most half the kernel; padding never wins.
        dilation: int or (h, w) >= 1.
        ceil_mode: round the output size up (the last window must start
            inside the input or its left padding).
        return_indices: also return where each maximum came from (PyTorch's
            ``return_indices``).

    Returns:
        [N, C, OH, OW], OH = floor_or_ceil((H + 2*ph - dh*(KH-1) - 1) / sh) + 1;
        x's dtype. With ``return_indices``, the pair ``(values, indices)``:
        indices int64 [N, C, OH, OW], each the position ``h * W + w`` of its
        maximum in its own [H, W] input plane, as PyTorch's; among equal
        maxima the first in the window's row-major order, and a NaN if the
        window holds one (the first).

    Raises:
        ValueError: x not 4-d, bad geometry, an empty output.
        TypeError: an integer x, a non-bool return_indices.

    >>> import numpy as np, mgtrace as mt, mgtrace.functional as F
    >>> x = mt.tensor(np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4))
    >>> F.max_pool2d(x, 2).tolist()
    [[[[5.0, 7.0], [13.0, 15.0]]]]
    >>> F.max_pool2d(x, 2, return_indices=True)[1].tolist()
    [[[[5, 7], [13, 15]]]]
    """
    fn = "max_pool2d"
    x = _pool_input(fn, x)
    return_indices = A.to_bool(fn, "return_indices", return_indices)
    k, s = _pool_window(fn, kernel_size, stride)
    p, d = A.pair(fn, "padding", padding, 0), A.pair(fn, "dilation", dilation, 1)
    y = _nn.max_pool2d(x, k, s, p, d, bool(ceil_mode))
    if not return_indices:
        return y
    n, c, h, w = x.shape
    oh, ow = y.shape[2:]
    if n * c * oh * ow == 0:
        return y, _dispatch.full(y.shape, 0, "int64", x.device)
    # each window's elements side by side, the first maximum's slot in it,
    # then that slot's plane position
    table = _window_table(h, w, oh, ow, k, s, p, d)                # [OH*OW, KH*KW]
    windows = x.reshape(n, c, h * w)[:, :, table]                 # [N, C, OH*OW, KH*KW]
    slot = _dispatch.astype(_reduce.argmax(windows, -1), "int64")  # [N, C, OH*OW]
    flat = _B["add"](slot, np.arange(oh * ow, dtype=np.int64) * table.shape[1])
    positions = _tensor(table.reshape(-1), device=x.device)
    return y, positions[flat].reshape(n, c, oh, ow)


@functools.lru_cache(maxsize=64)
def _window_table(h, w, oh, ow, k, s, p, d):
    """max_pool2d's windows as positions in the [H, W] plane (row-major,
    ``h * W + w``): int64 [OH*OW, KH*KW], row-major over each window. A
    position in the padding repeats the window's first real position, so
    that it can only win as that element (padding never wins)."""
    ys = np.arange(oh)[:, None] * s[0] - p[0] + np.arange(k[0])[None, :] * d[0]   # [OH, KH]
    xs = np.arange(ow)[:, None] * s[1] - p[1] + np.arange(k[1])[None, :] * d[1]   # [OW, KW]
    yy = ys[:, None, :, None]                                                      # [OH, 1, KH, 1]
    xx = xs[None, :, None, :]                                                      # [1, OW, 1, KW]
    real = (yy >= 0) & (yy < h) & (xx >= 0) & (xx < w)
    pos = np.broadcast_to(yy * w + xx, real.shape).reshape(oh * ow, -1)
    real = real.reshape(oh * ow, -1)
    first = pos[np.arange(oh * ow), real.argmax(axis=1)]
    table = np.where(real, pos, first[:, None]).astype(np.int64)
    table.flags.writeable = False
    return table


_AVG_MODES = {"average_count_exclude_padding": False, "average": True}


def avg_pool2d(x, kernel_size, stride=None, padding=0, mode="average_count_exclude_padding",
               ceil_mode=False):
    """2-D average pooling (MegEngine's signature and default mode).

    Args:
        x: float [N, C, H, W].
        kernel_size, stride (None: kernel_size), padding, ceil_mode: as
            :func:`max_pool2d`.
        mode: "average_count_exclude_padding" (MegEngine's default: divide
            by the number of input elements in the window, PyTorch's
            ``count_include_pad=False``) or "average" (divide by the full
            window size, zero padding included; PyTorch's default). The two
            agree when padding is 0.

    Returns:
        [N, C, OH, OW] in x's dtype.

    Raises:
        ValueError: x not 4-d, unknown mode, bad geometry.
        TypeError: an integer x.

    >>> import numpy as np, mgtrace as mt, mgtrace.functional as F
    >>> x = mt.tensor(np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4))
    >>> F.avg_pool2d(x, 2).tolist()
    [[[[2.5, 4.5], [10.5, 12.5]]]]
    """
    fn = "avg_pool2d"
    x = _pool_input(fn, x)
    if mode not in _AVG_MODES:
        raise ValueError(f"{fn}: mode must be one of {', '.join(map(repr, _AVG_MODES))}, got {mode!r}")
    k, s = _pool_window(fn, kernel_size, stride)
    return _nn.avg_pool2d(x, k, s, A.pair(fn, "padding", padding, 0), bool(ceil_mode),
                          _AVG_MODES[mode])


def _oshp(fn, oshp):
    if isinstance(oshp, (tuple, list)):
        return A.pair(fn, "oshp", oshp, 1, allow_none=True)      # None keeps that axis
    return A.to_size(fn, "oshp", oshp, 1)


def adaptive_avg_pool2d(x, oshp):
    """Average pooling to a fixed output size (MegEngine's ``oshp``; PyTorch's
    ``output_size``). Output i of m along an axis of n averages the input
    window [floor(i*n/m), ceil((i+1)*n/m)) (PyTorch's windows).

    Args:
        x: float [N, C, H, W] with H, W >= 1.
        oshp: int or (oh, ow) >= 1; a None entry keeps that input size.

    Returns:
        [N, C, oh, ow] in x's dtype.

    Raises:
        ValueError: x not 4-d, oshp not positive. TypeError: integer x.

    >>> import numpy as np, mgtrace as mt, mgtrace.functional as F
    >>> x = mt.tensor(np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4))
    >>> F.adaptive_avg_pool2d(x, 1).tolist()
    [[[[7.5]]]]
    """
    fn = "adaptive_avg_pool2d"
    return _nn.adaptive_avg_pool2d(_pool_input(fn, x), _oshp(fn, oshp))


def adaptive_max_pool2d(x, oshp):
    """Max pooling to a fixed output size; windows, arguments and errors as
    :func:`adaptive_avg_pool2d`. Returns the values only.

    >>> import numpy as np, mgtrace as mt, mgtrace.functional as F
    >>> x = mt.tensor(np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4))
    >>> F.adaptive_max_pool2d(x, (1, 2)).tolist()
    [[[[13.0, 15.0]]]]
    """
    fn = "adaptive_max_pool2d"
    return _nn.adaptive_max_pool2d(_pool_input(fn, x), _oshp(fn, oshp))


# ------------------------------------------------------------------ normalization

@_mutates("running_mean", "running_var", when=lambda a: a["training"] and a["inplace"])
def batch_norm(x, running_mean=None, running_var=None, weight=None, bias=None, training=False,
               momentum=0.9, eps=1e-5, inplace=True):
    """Batch normalization over the channel axis 1 (MegEngine's ``batch_norm``).

    ``y = (x - mean) / sqrt(var + eps) * weight + bias`` per channel, where
    (mean, var) are the running statistics in inference (``training=False``)
    and the batch's own (biased) statistics over axes 0, 2, 3, ... in
    training.

    Running-statistics update, training only (MegEngine's momentum
    convention, the opposite of PyTorch's)::

        running_mean = momentum * running_mean + (1 - momentum) * batch_mean
        running_var  = momentum * running_var  + (1 - momentum) * batch_var_unbiased

    so the default ``momentum=0.9`` equals PyTorch's ``momentum=0.1``.
    ``batch_var_unbiased`` divides by n - 1 (n = N*H*W values per channel),
    as MegEngine and PyTorch do for the running estimate.

    Args:
        x: float [N, C] or [N, C, *spatial].
        running_mean, running_var: [C] or [1, C, 1, ...] Tensors. Needed
            for inference; in training they are updated in place when given
            and ``inplace`` is True.
        weight, bias: [C] or [1, C, 1, ...] affine parameters, or None.
        training: use batch statistics (and update the running ones).
        momentum: float in [0, 1], see above.
        eps: added to the variance.
        inplace: when False (training only) the running tensors are left
            alone and ``(y, new_mean, new_var)`` is returned instead of y.

    Returns:
        y of x's shape and dtype (weight/bias promote by MegEngine's rule).

    Raises:
        ValueError: x with fewer than 2 axes, per-channel tensors of the
            wrong size, no running statistics in inference, one value per
            channel in training, momentum outside [0, 1].
        TypeError: integer x; running tensors that are not Tensors when
            they must be updated in place.

    >>> import mgtrace as mt, mgtrace.functional as F
    >>> x = mt.tensor([[1.0, 2.0], [3.0, 6.0]])
    >>> rm, rv = mt.tensor([0.0, 0.0]), mt.tensor([1.0, 1.0])
    >>> [round(v, 3) for v in F.batch_norm(x, rm, rv, training=True).numpy()[:, 1].tolist()]
    [-1.0, 1.0]
    >>> [round(v, 3) for v in rm.tolist()]
    [0.2, 0.4]
    """
    fn = "batch_norm"
    given_mean, given_var = running_mean, running_var
    x, running_mean, running_var, weight, bias = A.tensors(
        fn, x=x, running_mean=running_mean, running_var=running_var, weight=weight, bias=bias)
    if x.ndim < 2:
        raise ValueError(f"{fn}: x must be [N, C] or [N, C, *spatial], got shape {x.shape}")
    A.check_float(fn, "x", x)
    momentum = A.to_float(fn, "momentum", momentum)
    if not 0.0 <= momentum <= 1.0:
        raise ValueError(f"{fn}: momentum must be in [0, 1] (MegEngine's convention: the weight "
                         f"of the old running value), got {momentum}")
    eps = A.to_float(fn, "eps", eps)
    c, nd = x.shape[1], x.ndim
    shape = _bcast_shape(c, nd)
    rm = _channel_vector(fn, "running_mean", running_mean, c, nd)
    rv = _channel_vector(fn, "running_var", running_var, c, nd)
    w = _channel_vector(fn, "weight", weight, c, nd)
    b = _channel_vector(fn, "bias", bias, c, nd)
    if not training:
        if rm is None or rv is None:
            raise ValueError(f"{fn}: running_mean and running_var are needed when training=False")
        mean, var = rm.reshape(shape), rv.reshape(shape)
    else:
        axes = (0,) + tuple(range(2, nd))
        n = x.size // max(c, 1)
        if n <= 1:
            raise ValueError(f"{fn}: training needs more than 1 value per channel, got x of shape "
                             f"{x.shape}")
        mean = _reduce.mean(x, axes, True)
        var = _reduce.var(x, axes, True)
    # per-channel scale and shift first, then two passes over x (PyTorch's
    # CPU kernel does the same): y = x * scale + (bias - mean * scale)
    scale = _U["rsqrt"](_B["add"](var, eps))
    if w is not None:
        scale = _B["mul"](scale, w.reshape(shape))
    shift = _U["neg"](_B["mul"](mean, scale))
    if b is not None:
        shift = _B["add"](shift, b.reshape(shape))
    y = _B["add"](_B["mul"](x, scale), shift)
    if not training:
        return y
    new_mean = new_var = None
    if rm is not None:
        new_mean = _B["add"](_B["mul"](rm, momentum), _B["mul"](mean.reshape(c), 1.0 - momentum))
    if rv is not None:
        unbiased = _B["mul"](var.reshape(c), n / (n - 1))
        new_var = _B["add"](_B["mul"](rv, momentum), _B["mul"](unbiased, 1.0 - momentum))
    if not inplace:
        return y, new_mean, new_var
    for name, given, new in (("running_mean", given_mean, new_mean),
                             ("running_var", given_var, new_var)):
        if new is None:
            continue
        if not isinstance(given, Tensor):
            raise TypeError(f"{fn}: {name} must be a Tensor to be updated in place, got "
                            f"{type(given).__name__}; pass inplace=False to get the new value")
        given[...] = new.reshape(given.shape)
    return y


_LN_FAST = (np.dtype("float32"), np.dtype("float64"))   # the dtypes of layer_norm's C kernel


def layer_norm(x, normalized_shape, weight=None, bias=None, eps=1e-5):
    """Layer normalization over the trailing ``normalized_shape`` axes
    (PyTorch's ``layer_norm``; MegEngine's with ``affine`` implied by weight).

    ``y = (x - mean) / sqrt(var + eps) * weight + bias``, mean and the
    biased var taken over the last ``len(normalized_shape)`` axes.

    Args:
        x: float [..., *normalized_shape].
        normalized_shape: int or tuple of ints, the trailing shape of x.
        weight, bias: normalized_shape tensors or None.
        eps: added to the variance.

    Returns:
        x's shape and dtype (weight and bias promote by MegEngine's rule).

    Raises:
        ValueError: normalized_shape not the trailing shape of x, weight or
            bias of another shape. TypeError: integer x.

    >>> import mgtrace as mt, mgtrace.functional as F
    >>> [round(v, 3) for v in F.layer_norm(mt.tensor([1.0, 3.0]), 2).tolist()]
    [-1.0, 1.0]
    """
    fn = "layer_norm"
    x, weight, bias = A.tensors(fn, x=x, weight=weight, bias=bias)
    A.check_float(fn, "x", x)
    ns = A.to_shape(fn, "normalized_shape", normalized_shape)
    k = len(ns)
    if k == 0 or k > x.ndim or x.shape[x.ndim - k:] != ns:
        raise ValueError(f"{fn}: normalized_shape {ns} must be the trailing shape of x, got x of "
                         f"shape {x.shape}")
    for name, t in (("weight", weight), ("bias", bias)):
        if t is not None and t.shape != ns:
            raise ValueError(f"{fn}: {name} must have shape {ns} (normalized_shape), got {t.shape}")
    eps = A.to_float(fn, "eps", eps)
    if x.dtype in _LN_FAST and all(t is None or t.dtype == x.dtype for t in (weight, bias)) and x.device.type == "cpu":
        # one C pass (mean and variance in double): same values, a fifth of the time
        return _nn.layer_norm_rows(x, weight, bias, math.prod(ns), eps)
    axes = tuple(range(x.ndim - k, x.ndim))
    mean = _reduce.mean(x, axes, True)
    var = _reduce.var(x, axes, True)
    y = _B["mul"](_B["sub"](x, mean), _U["rsqrt"](_B["add"](var, eps)))
    if weight is not None:
        y = _B["mul"](y, weight)
    if bias is not None:
        y = _B["add"](y, bias)
    return y


def group_norm(x, num_groups, weight=None, bias=None, eps=1e-5):
    """Group normalization (PyTorch's ``group_norm``, MegEngine's GroupNorm).

    The C channels split into ``num_groups`` groups of C/num_groups; each
    (sample, group) is normalized by its own mean and biased variance, then
    the per-channel affine transform applies.

    Args:
        x: float [N, C, *spatial].
        num_groups: int >= 1 dividing C.
        weight, bias: [C] (or [1, C, 1, ...]) or None.
        eps: added to the variance.

    Returns:
        x's shape and dtype.

    Raises:
        ValueError: x with fewer than 2 axes, num_groups not dividing C,
            weight/bias of the wrong size. TypeError: integer x.

    >>> import mgtrace as mt, mgtrace.functional as F
    >>> x = mt.tensor([[[1.0], [3.0], [5.0], [5.0]]])
    >>> [round(v, 3) for v in F.group_norm(x, 2).numpy().ravel().tolist()]
    [-1.0, 1.0, 0.0, 0.0]
    """
    fn = "group_norm"
    x, weight, bias = A.tensors(fn, x=x, weight=weight, bias=bias)
    if x.ndim < 2:
        raise ValueError(f"{fn}: x must be [N, C, *spatial], got shape {x.shape}")
    A.check_float(fn, "x", x)
    g = A.to_int(fn, "num_groups", num_groups, 1)
    n, c = x.shape[0], x.shape[1]
    if c % g:
        raise ValueError(f"{fn}: num_groups={g} must divide the {c} channels of x")
    w = _channel_vector(fn, "weight", weight, c, x.ndim)
    b = _channel_vector(fn, "bias", bias, c, x.ndim)
    xg = x.reshape(n, g, -1)
    mean = _reduce.mean(xg, 2, True)
    var = _reduce.var(xg, 2, True)
    y = _B["mul"](_B["sub"](xg, mean), _U["rsqrt"](_B["add"](var, A.to_float(fn, "eps", eps))))
    y = y.reshape(x.shape)
    shape = _bcast_shape(c, x.ndim)
    if w is not None:
        y = _B["mul"](y, w.reshape(shape))
    if b is not None:
        y = _B["add"](y, b.reshape(shape))
    return y


def normalize(x, ord=2, axis=-1, eps=1e-12):
    """``x / max(norm(x, ord, axis, keepdims=True), eps)`` (PyTorch's
    ``F.normalize``; MegEngine's ``normalize`` with an axis): L2 by default.

    Args:
        x: float (or int, computed in float32) Tensor.
        ord: as :func:`mgtrace.functional.norm` (2, 1, inf, -inf, p > 0).
        axis: int, or None for the whole tensor.
        eps: the smallest norm divided by.

    Returns:
        x's shape; float dtype (integers give float32).

    Raises:
        IndexError: axis out of range. ValueError/TypeError: as :func:`norm`.

    >>> import mgtrace as mt, mgtrace.functional as F
    >>> F.normalize(mt.tensor([3.0, 4.0])).tolist()
    [0.6000000238418579, 0.800000011920929]
    """
    fn = "normalize"
    (x,) = A.tensors(fn, x=x)
    n = norm(x, ord, axis, True)
    return _B["truediv"](x, _B["maximum"](n, A.to_float(fn, "eps", eps)))


# ------------------------------------------------------------------ activations

def relu(x):
    """max(x, 0) elementwise; x's dtype (MegEngine, PyTorch).

    >>> import mgtrace as mt, mgtrace.functional as F
    >>> F.relu(mt.tensor([-1.0, 2.0])).tolist()
    [0.0, 2.0]
    """
    return _U["relu"](A.check_operand("relu", "x", x))


def relu6(x):
    """min(max(x, 0), 6) elementwise; x's dtype.

    >>> import mgtrace as mt, mgtrace.functional as F
    >>> F.relu6(mt.tensor([-1, 3, 9])).tolist()
    [0, 3, 6]
    """
    return _U["relu6"](A.check_operand("relu6", "x", x))


def leaky_relu(x, negative_slope=0.01):
    """``x if x > 0 else negative_slope * x`` (PyTorch, MegEngine), composed
    as ``where(x > 0, x, x * negative_slope)``.

    Args:
        x: Tensor; integers promote to float32 with the float slope
            (MegEngine promotion).
        negative_slope: float.

    Raises:
        TypeError: x not a tensor/array, negative_slope not a number.

    >>> import mgtrace as mt, mgtrace.functional as F
    >>> F.leaky_relu(mt.tensor([-2.0, 3.0]), 0.5).tolist()
    [-1.0, 3.0]
    """
    fn = "leaky_relu"
    A.check_operand(fn, "x", x)
    slope = A.to_float(fn, "negative_slope", negative_slope)
    return _T["where"](_B["gt"](x, 0), x, _B["mul"](x, slope))


_GELU = {"none": "gelu", "tanh": "gelu_tanh"}


def gelu(x, approximate="none"):
    """GELU (PyTorch's ``F.gelu``): ``x * Phi(x)`` with the exact normal CDF
    (``approximate="none"``) or the tanh approximation
    ``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`` (``"tanh"``); each is
    one core kernel. Integer inputs give float32 (MegEngine).

    Raises:
        ValueError: approximate not "none" or "tanh".

    >>> import mgtrace as mt, mgtrace.functional as F
    >>> [round(v, 4) for v in F.gelu(mt.tensor([-1.0, 0.0, 1.0])).tolist()]
    [-0.1587, 0.0, 0.8413]
    """
    if approximate not in _GELU:
        raise ValueError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
    return _U[_GELU[approximate]](A.check_operand("gelu", "x", x))


def silu(x):
    """x * sigmoid(x) (a.k.a. swish); float dtype, ints give float32.

    >>> import mgtrace as mt, mgtrace.functional as F
    >>> [round(v, 4) for v in F.silu(mt.tensor([0.0, 1.0])).tolist()]
    [0.0, 0.7311]
    """
    return _U["silu"](A.check_operand("silu", "x", x))


def hardswish(x):
    """x * relu6(x + 3) / 6 (PyTorch, MegEngine); ints give float32.

    >>> import mgtrace as mt, mgtrace.functional as F
    >>> F.hardswish(mt.tensor([-4.0, 0.0, 3.0])).tolist()
    [-0.0, 0.0, 3.0]
    """
    return _U["hardswish"](A.check_operand("hardswish", "x", x))


def hardsigmoid(x):
    """relu6(x + 3) / 6 (PyTorch, MegEngine); ints give float32.

    >>> import mgtrace as mt, mgtrace.functional as F
    >>> F.hardsigmoid(mt.tensor([-4.0, 0.0, 4.0])).tolist()
    [0.0, 0.5, 1.0]
    """
    return _U["hardsigmoid"](A.check_operand("hardsigmoid", "x", x))


def softplus(x):
    """log(1 + exp(x)), computed stably; ints give float32.

    >>> import mgtrace as mt, mgtrace.functional as F
    >>> [round(v, 4) for v in F.softplus(mt.tensor([0.0])).tolist()]
    [0.6931]
    """
    return _U["softplus"](A.check_operand("softplus", "x", x))


def _softmax_axis(fn, x, axis):
    if axis is None:
        return -1
    return A.to_axis(fn, "axis", axis, max(x.ndim, 1))


def softmax(x, axis=None):
    """exp(x) / sum(exp(x)) along ``axis``, numerically stable (max subtracted).

    Args:
        x: Tensor of any dtype.
        axis: int; None means the last axis (PyTorch's usual choice; note
            MegEngine's None picks axis 0 for 0/1/3-d inputs and 1 otherwise).

    Returns:
        x's shape; float dtypes keep theirs, ints and bool give float32
        (MegEngine). A NaN makes its line NaN.

    Raises:
        IndexError: axis out of range. TypeError: axis not an int.

    >>> import mgtrace as mt, mgtrace.functional as F
    >>> F.softmax(mt.tensor([[0.0, 0.0]])).tolist()
    [[0.5, 0.5]]
    """
    (x,) = A.tensors("softmax", x=x)
    return _reduce.softmax(x, _softmax_axis("softmax", x, axis))


def log_softmax(x, axis=None):
    """x - logsumexp(x) along ``axis`` (stable); arguments, dtypes and errors
    as :func:`softmax`.

    >>> import mgtrace as mt, mgtrace.functional as F
    >>> [round(v, 4) for v in F.log_softmax(mt.tensor([1.0, 1.0])).tolist()]
    [-0.6931, -0.6931]
    """
    (x,) = A.tensors("log_softmax", x=x)
    return _reduce.log_softmax(x, _softmax_axis("log_softmax", x, axis))


# ------------------------------------------------------------------ others

def embedding(input, weight):
    """Rows of ``weight`` picked by the integer ``input`` (PyTorch/MegEngine
    ``embedding`` without max_norm or padding_idx).

    Args:
        input: integer Tensor [...] (or array/list) of row indices.
        weight: [num_embeddings, dim].

    Returns:
        [..., dim] in weight's dtype.

    Raises:
        ValueError: weight not 2-d. TypeError: non-integer input.
        IndexError: an index outside 0..num_embeddings-1 (named in the message).

    >>> import mgtrace as mt, mgtrace.functional as F
    >>> F.embedding(mt.tensor([2, 0]), mt.tensor([[0.0, 1.0], [2.0, 3.0], [4.0, 5.0]])).tolist()
    [[4.0, 5.0], [0.0, 1.0]]
    """
    fn = "embedding"
    input, weight = A.tensors(fn, input=input, weight=weight)
    A.check_ndim(fn, "weight", weight, 2, "[num_embeddings, dim]")
    A.check_int_dtype(fn, "input", input)
    try:
        return _index.embedding(weight, input)
    except IndexError as e:
        raise IndexError(f"{fn}: input holds an index outside 0..{weight.shape[0] - 1} "
                         f"(weight has {weight.shape[0]} rows): {e}") from None


def one_hot(x, num_classes):
    """One-hot encoding along a new last axis (MegEngine's ``one_hot``),
    composed as ``(x[..., None] == arange(num_classes)).astype(x.dtype)``.

    Args:
        x: integer Tensor [...], values in [0, num_classes).
        num_classes: int in 1 .. 2**31 - 1.

    Returns:
        [..., num_classes] in x's dtype (MegEngine; int32 for lists).

    Raises:
        TypeError: a non-integer x. ValueError: num_classes out of range, a
            value of x outside [0, num_classes), a result past 2**62 elements.

    >>> import mgtrace as mt, mgtrace.functional as F
    >>> F.one_hot(mt.tensor([1, 0]), 3).tolist()
    [[0, 1, 0], [1, 0, 0]]
    """
    fn = "one_hot"
    (x,) = A.tensors(fn, x=x)
    A.check_int_dtype(fn, "x", x)
    n = A.to_size(fn, "num_classes", num_classes, 1)
    if x.size:   # a check on the values, not part of the computation (no core ops)
        values = x.numpy()
        lo, hi = int(values.min()), int(values.max())
        if lo < 0 or hi >= n:
            raise ValueError(f"{fn}: x holds values in [{lo}, {hi}], outside [0, num_classes={n})")
    A.check_numel(fn, "num_classes", x.shape + (n,))
    # int64 classes: n may exceed what x's dtype holds (int8 x, 300 classes)
    classes = A.as_tensor(fn, "num_classes", np.arange(n, dtype=np.int64), x.device)
    return _dispatch.astype(_B["eq"](x.expand_dims(-1), classes), x.dtype)


def dropout(x, drop_prob, training=True):
    """Zero each element with probability ``drop_prob`` and scale the rest by
    1 / (1 - drop_prob) (MegEngine, PyTorch); identity when not training.

    The mask comes from :mod:`mgtrace.random` (``uniform(size=x.shape) >=
    drop_prob``), so ``mgtrace.random.seed(n)`` makes it reproducible.

    Args:
        x: Tensor.
        drop_prob: float in [0, 1).
        training: False returns x itself.

    Returns:
        x's shape; x's dtype for floats (ints give float32, true division).

    Raises:
        ValueError: drop_prob outside [0, 1).

    >>> import mgtrace as mt, mgtrace.functional as F
    >>> x = mt.tensor([1.0, 2.0])
    >>> F.dropout(x, 0.5, training=False) is x
    True
    """
    fn = "dropout"
    p = A.probability(fn, "drop_prob", drop_prob)
    if not training:
        return x
    (x,) = A.tensors(fn, x=x)
    if p == 0.0:
        return x
    from mgtrace import random as _random
    keep = _B["ge"](_random.uniform(size=x.shape, device=x.device), p)
    return _B["truediv"](_B["mul"](x, keep), 1.0 - p)


_PAD_MODES = {"constant": "constant", "reflect": "reflect", "replicate": "replicate",
              "edge": "replicate", "circular": "circular", "wrap": "circular"}


def pad(x, pad_width, mode="constant", constant_value=0.0):
    """Pad x (MegEngine's ``pad``; NumPy's ``np.pad`` layout of pad_width).

    Args:
        x: Tensor of any shape and dtype.
        pad_width: an int (every side of every axis), one (before, after)
            pair for every axis, or ndim pairs, first axis first.
        mode: "constant", "reflect" (mirror, edge not repeated),
            "replicate"/"edge" (repeat the edge) or "circular"/"wrap" (wrap
            around; padding longer than the axis repeats it again). The
            names are PyTorch's and NumPy's; the results are ``np.pad``'s.
        constant_value: the fill of "constant", converted to x's dtype.

    Returns:
        x's dtype; each axis longer by before + after.

    Raises:
        ValueError: unknown mode, negative padding, pairs that do not match
            ndim, reflect padding not smaller than its axis, replicate or
            circular padding of an empty axis.
        TypeError: pad_width not ints.

    >>> import mgtrace as mt, mgtrace.functional as F
    >>> F.pad(mt.tensor([1, 2, 3]), (2, 1), mode="reflect").tolist()
    [3, 2, 1, 2, 3, 2]
    >>> F.pad(mt.tensor([1, 2, 3]), (2, 1), mode="circular").tolist()
    [2, 3, 1, 2, 3, 1]
    """
    fn = "pad"
    (x,) = A.tensors(fn, x=x)
    if not isinstance(mode, str) or mode not in _PAD_MODES:
        raise ValueError(f"{fn}: mode must be one of {', '.join(map(repr, _PAD_MODES))}, got {mode!r}")
    if not A.is_scalar(constant_value):
        raise TypeError(f"{fn}: constant_value must be a Python number, got "
                        f"{type(constant_value).__name__}")
    return _nn.pad(x, pad_width, _PAD_MODES[mode], constant_value)


def interpolate(x, size=None, scale_factor=None, mode="nearest", align_corners=None):
    """Resize the two spatial axes (PyTorch's ``F.interpolate`` coordinates;
    MegEngine's ``interpolate`` for these modes).

    Args:
        x: float [N, C, H, W].
        size: int or (oh, ow); or scale_factor: float or pair > 0 (output =
            floor(input * factor)). Give exactly one.
        mode: "nearest" or "bilinear".
        align_corners: bilinear only; None/False uses half-pixel centres.

    Returns:
        [N, C, oh, ow] in x's dtype.

    Raises:
        ValueError: x not 4-d, unknown mode, both or neither of size and
            scale_factor, align_corners with "nearest". TypeError: integer x.

    >>> import mgtrace as mt, mgtrace.functional as F
    >>> F.interpolate(mt.tensor([[[[1.0, 2.0]]]]), scale_factor=2).tolist()
    [[[[1.0, 1.0, 2.0, 2.0], [1.0, 1.0, 2.0, 2.0]]]]
    """
    fn = "interpolate"
    (x,) = A.tensors(fn, x=x)
    A.check_ndim(fn, "x", x, 4, "[N, C, H, W]")
    A.check_float(fn, "x", x)
    if mode not in ("nearest", "bilinear"):
        raise ValueError(f"{fn}: mode must be 'nearest' or 'bilinear', got {mode!r}")
    if (size is None) == (scale_factor is None):
        raise ValueError(f"{fn}: give exactly one of size and scale_factor")
    if mode == "nearest" and align_corners is not None:
        raise ValueError(f"{fn}: align_corners can only be set with mode='bilinear'")
    if size is not None:
        size = A.pair(fn, "size", size, 1)
    return _nn.interpolate(x, size, scale_factor, mode, align_corners)


# (mode, index mapping) for warp_perspective's border modes (OpenCV's names):
# an integer index tensor i into an axis of size n -> an index in [0, n)
def _border_replicate(i, n):
    return _T["clip"](i, 0, n - 1)


def _border_wrap(i, n):
    return _B["mod"](i, n)


def _border_reflect(i, n):            # fedcba|abcdefgh|hgfedcb
    if n == 1:
        return _B["mul"](i, 0)
    j = _B["mod"](i, 2 * n)
    return _T["where"](_B["lt"](j, n), j, _B["sub"](2 * n - 1, j))


def _border_reflect_101(i, n):        # gfedcb|abcdefgh|gfedcba
    if n == 1:
        return _B["mul"](i, 0)
    j = _B["mod"](i, 2 * n - 2)
    return _T["where"](_B["lt"](j, n), j, _B["sub"](2 * n - 2, j))


_BORDERS = {"replicate": _border_replicate, "constant": _border_replicate,
            "wrap": _border_wrap, "reflect": _border_reflect, "reflect_101": _border_reflect_101}


def warp_perspective(inp, mat, out_shape, mat_idx=None, border_mode="replicate",
                     border_val=0.0, format="NCHW", interp_mode="linear"):
    """Perspective warp of batched images (MegEngine's ``warp_perspective``).

    Each output pixel (h, w) of image b samples its input image at::

        x = (M00*w + M01*h + M02) / (M20*w + M21*h + M22)
        y = (M10*w + M11*h + M12) / (M20*w + M21*h + M22)

    with M = ``mat[b]`` (the inverse of the matrix cv2.warpPerspective
    takes), bilinearly from the four pixels around (x, y); a neighbour
    outside the image is found by ``border_mode`` (OpenCV's rules) or, for
    "constant", is ``border_val``. Composed of core ops (gathers and
    elementwise arithmetic, in float32; float64 for float64 input).

    Args:
        inp: float [N, C, H, W] (or [N, H, W, C] with ``format="NHWC"``).
        mat: float [B, 3, 3]; B = N unless ``mat_idx`` is given.
        out_shape: (oh, ow) ints (or one int for both, or a 2-element int
            Tensor).
        mat_idx: B ints in [0, N): the input image for each matrix
            (sequence or int Tensor); None means image b for matrix b.
        border_mode: "replicate" (default), "constant", "reflect",
            "reflect_101" or "wrap".
        border_val: the value outside the image for "constant".
        format: "NCHW" (default) or "NHWC".
        interp_mode: "linear" (the one MegEngine supports).

    Returns:
        [B, C, oh, ow] (NHWC: [B, oh, ow, C]), float32 (float64 for float64
        input; float16 input gives float32, as in MegEngine).

    Raises:
        ValueError: bad shapes, unknown modes, a mat_idx of the wrong
            length or out of range. TypeError: integer inp.

    >>> import numpy as np, mgtrace as mt, mgtrace.functional as F
    >>> x = mt.tensor(np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4))
    >>> shift = mt.tensor([[[1.0, 0.0, 1.0], [0.0, 1.0, 1.0], [0.0, 0.0, 1.0]]])
    >>> F.warp_perspective(x, shift, (2, 2)).tolist()
    [[[[5.0, 6.0], [9.0, 10.0]]]]
    """
    fn = "warp_perspective"
    x, m = A.tensors(fn, inp=inp, mat=mat)
    A.check_float(fn, "inp", x)
    A.check_float(fn, "mat", m)
    if format not in ("NCHW", "NHWC"):
        raise ValueError(f"{fn}: format must be 'NCHW' or 'NHWC', got {format!r}")
    if interp_mode != "linear":
        raise ValueError(f"{fn}: interp_mode must be 'linear' (MegEngine supports only it), "
                         f"got {interp_mode!r}")
    if border_mode not in _BORDERS:
        raise ValueError(f"{fn}: border_mode must be one of {', '.join(map(repr, _BORDERS))}, "
                         f"got {border_mode!r}")
    A.check_ndim(fn, "inp", x, 4, "[N, C, H, W]" if format == "NCHW" else "[N, H, W, C]")
    if format == "NHWC":
        x = x.transpose((0, 3, 1, 2))
    if m.ndim != 3 or m.shape[1:] != (3, 3):
        raise ValueError(f"{fn}: mat must be [B, 3, 3], got shape {m.shape}")
    if isinstance(out_shape, Tensor):
        out_shape = out_shape.tolist()
    oh, ow = A.pair(fn, "out_shape", out_shape, 1)
    n, c, h, w = x.shape
    b = m.shape[0]
    if mat_idx is None:
        if b != n:
            raise ValueError(f"{fn}: mat has {b} matrices for {n} images; pass mat_idx to pick "
                             "an image for each matrix")
    else:
        idx = mat_idx.tolist() if isinstance(mat_idx, Tensor) else list(mat_idx)
        if len(idx) != b or not all(isinstance(i, (int, np.integer)) and 0 <= i < n for i in idx):
            raise ValueError(f"{fn}: mat_idx must hold {b} ints in [0, {n}), got {idx}")
        x = _index.getitem(x, _tensor(np.asarray(idx, np.int32), device=x.device))
    dt = "float64" if x.dtype == np.float64 else "float32"
    x = _dispatch.astype(x, dt)
    m = _dispatch.astype(m, dt).reshape(b, 9)
    # the output pixel grid, w fastest: [1, oh*ow] each
    gy, gx = np.meshgrid(np.arange(oh, dtype=dt), np.arange(ow, dtype=dt), indexing="ij")
    gx = _tensor(gx.reshape(1, -1), device=x.device)
    gy = _tensor(gy.reshape(1, -1), device=x.device)
    col = [m[:, k:k + 1] for k in range(9)]                       # [b, 1] each

    def affine(a, bb, cc):
        return _B["add"](_B["add"](_B["mul"](col[a], gx), _B["mul"](col[bb], gy)), col[cc])
    den = affine(6, 7, 8)
    sx, sy = _B["truediv"](affine(0, 1, 2), den), _B["truediv"](affine(3, 4, 5), den)
    x0, y0 = _U["floor"](sx), _U["floor"](sy)
    ax, ay = _B["sub"](sx, x0), _B["sub"](sy, y0)                # bilinear weights
    x0, y0 = _dispatch.astype(x0, "int32"), _dispatch.astype(y0, "int32")
    flat = x.reshape(b, c, h * w)
    border = _BORDERS[border_mode]
    out = None
    for dy, wy in ((0, _B["sub"](1.0, ay)), (1, ay)):
        for dx, wx in ((0, _B["sub"](1.0, ax)), (1, ax)):
            yi, xi = _B["add"](y0, dy), _B["add"](x0, dx)
            pos = _B["add"](_B["mul"](border(yi, h), w), border(xi, w))          # [b, p]
            pos = pos.reshape(b, 1, oh * ow).broadcast_to((b, c, oh * ow)).copy()
            vals = _index.gather(flat, 2, pos)
            if border_mode == "constant":
                inside = _B["logical_and"](
                    _B["logical_and"](_B["ge"](yi, 0), _B["lt"](yi, h)),
                    _B["logical_and"](_B["ge"](xi, 0), _B["lt"](xi, w)))
                vals = _T["where"](inside.reshape(b, 1, oh * ow), vals, float(border_val))
            term = _B["mul"](vals, _B["mul"](wy, wx).reshape(b, 1, oh * ow))
            out = term if out is None else _B["add"](out, term)
    out = out.reshape(b, c, oh, ow)
    return out.transpose((0, 2, 3, 1)).copy() if format == "NHWC" else out
