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
    x, weight, bias = A.tensors("linear", optional=('bias',), x=x, weight=weight, bias=bias)
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
    x, weight, bias = A.tensors(fn, optional=('bias',), x=x, weight=weight, bias=bias)
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
    x, weight, bias = A.tensors(fn, optional=('bias',), x=x, weight=weight, bias=bias)
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
    x, weight, bias = A.tensors(fn, optional=('bias',), x=x, weight=weight, bias=bias)
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

    A per-tensor quantized x (int8 / uint8 storage, a QuantStub's or an int8
    layer's output) pools its integers, as MegEngine pools a quantized
    tensor: the result keeps x's dtype, scale and zero point, bitwise the
    float pool of the dequantized values quantized again (quantizing is
    monotone; :func:`mgtrace.quantization.int8.max_pool2d`); CPU only, no
    ``return_indices``.

    Raises:
        ValueError: x not 4-d, bad geometry, an empty output.
        TypeError: an integer x, a non-bool return_indices.
        QuantizationError: (a ValueError) a quantized x with bad geometry, on
            another device, or with ``return_indices``.

    >>> import numpy as np, mgtrace as mt, mgtrace.functional as F
    >>> x = mt.tensor(np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4))
    >>> F.max_pool2d(x, 2).tolist()
    [[[[5.0, 7.0], [13.0, 15.0]]]]
    >>> F.max_pool2d(x, 2, return_indices=True)[1].tolist()
    [[[[5, 7], [13, 15]]]]
    """
    fn = "max_pool2d"
    if isinstance(x, Tensor) and x._qdtype is not None and return_indices is False:
        from mgtrace.quantization.int8 import max_pool2d_tensor
        return max_pool2d_tensor(x, kernel_size, stride, padding, dilation, bool(ceil_mode))
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

    A per-tensor quantized x (int8 / uint8 storage) pools its integers, as
    MegEngine pools a quantized tensor: the result keeps x's dtype, scale
    and zero point; each output is the window's integer sum less the zero
    point per element, divided exactly and rounded half to even, plus the
    zero point (:func:`mgtrace.quantization.int8.avg_pool2d`); CPU only.

    Raises:
        ValueError: x not 4-d, unknown mode, bad geometry.
        TypeError: an integer x.
        QuantizationError: (a ValueError) a quantized x with bad geometry or
            mode, or on another device.

    >>> import numpy as np, mgtrace as mt, mgtrace.functional as F
    >>> x = mt.tensor(np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4))
    >>> F.avg_pool2d(x, 2).tolist()
    [[[[2.5, 4.5], [10.5, 12.5]]]]
    """
    fn = "avg_pool2d"
    if isinstance(x, Tensor) and x._qdtype is not None:
        from mgtrace.quantization.int8 import avg_pool2d_tensor
        return avg_pool2d_tensor(x, kernel_size, stride, padding, mode, bool(ceil_mode))
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

    A per-tensor quantized x (int8 / uint8 storage) pools its integers as
    :func:`avg_pool2d` does (the result keeps x's dtype, scale and zero
    point; :func:`mgtrace.quantization.int8.adaptive_avg_pool2d`); CPU only.

    Raises:
        ValueError: x not 4-d, oshp not positive. TypeError: integer x.
        QuantizationError: (a ValueError) a quantized x on another device.

    >>> import numpy as np, mgtrace as mt, mgtrace.functional as F
    >>> x = mt.tensor(np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4))
    >>> F.adaptive_avg_pool2d(x, 1).tolist()
    [[[[7.5]]]]
    """
    fn = "adaptive_avg_pool2d"
    if isinstance(x, Tensor) and x._qdtype is not None:
        from mgtrace.quantization.int8 import adaptive_avg_pool2d_tensor
        return adaptive_avg_pool2d_tensor(x, _oshp(fn, oshp))
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
        fn, optional=('running_mean', 'running_var', 'weight', 'bias'),
        x=x, running_mean=running_mean, running_var=running_var, weight=weight, bias=bias)
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
        fused = _batch_norm_fused(x, w, b, eps) if inplace else None
        if fused is not None:       # one C pass per channel: y and the batch statistics
            y, mean, var = fused
            mean, var = mean.reshape(shape), var.reshape(shape)
            return _batch_norm_running(fn, y, mean, var, rm, rv, given_mean, given_var, c, n,
                                       momentum, inplace)
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
    return _batch_norm_running(fn, y, mean, var, rm, rv, given_mean, given_var, c, n, momentum, inplace)


def _batch_norm_fused(x, w, b, eps):
    """Training batch norm's C kernel (kernels/cpu/train.c): ``(y, mean,
    var)`` for float32/float64 x with weight/bias (flat [C]) of x's dtype and
    device, or None where it does not apply (other dtypes, a device without
    the kernel): the caller composes core ops."""
    if x.dtype not in _LN_FAST or any(t is not None and (t.dtype != x.dtype or t.device != x.device)
                                      for t in (w, b)):
        return None
    return _nn.batch_norm_train(x, w, b, eps)


def _batch_norm_running(fn, y, mean, var, rm, rv, given_mean, given_var, c, n, momentum, inplace):
    """Training batch norm's running-statistics update (see batch_norm)."""
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
    x, weight, bias = A.tensors(fn, optional=('weight', 'bias'), x=x, weight=weight, bias=bias)
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
    the per-channel affine transform applies. Float32/float64 on the CPU
    run each (sample, group) as one row of :func:`layer_norm`'s C kernel
    (mean and variance in double, one pass; its C backward under
    autodiff), the affine after it; other dtypes, devices and empty groups
    compose core reductions (mean, var, rsqrt), the same formula.

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
    x, weight, bias = A.tensors(fn, optional=('weight', 'bias'), x=x, weight=weight, bias=bias)
    if x.ndim < 2:
        raise ValueError(f"{fn}: x must be [N, C, *spatial], got shape {x.shape}")
    A.check_float(fn, "x", x)
    g = A.to_int(fn, "num_groups", num_groups, 1)
    n, c = x.shape[0], x.shape[1]
    if c % g:
        raise ValueError(f"{fn}: num_groups={g} must divide the {c} channels of x")
    w = _channel_vector(fn, "weight", weight, c, x.ndim)
    b = _channel_vector(fn, "bias", bias, c, x.ndim)
    eps = A.to_float(fn, "eps", eps)
    xg = x.reshape(n, g, -1)
    if xg.shape[2] and x.dtype in _LN_FAST and x.device.type == "cpu":
        # each (sample, group) a row of layer_norm's one-pass C kernel (and its
        # C backward under autodiff): same formula, no affine there
        y = layer_norm(xg, xg.shape[2], None, None, eps)
    else:
        mean = _reduce.mean(xg, 2, True)
        var = _reduce.var(xg, 2, True)
        y = _B["mul"](_B["sub"](xg, mean), _U["rsqrt"](_B["add"](var, eps)))
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
        TypeError: a non-integer x. QuantizationError: x of a quantized
            dtype (its integers are no class indices; as every computing op).
        ValueError: num_classes out of range, a value of x outside [0,
            num_classes), a result past 2**62 elements.

    >>> import mgtrace as mt, mgtrace.functional as F
    >>> F.one_hot(mt.tensor([1, 0]), 3).tolist()
    [[0, 1, 0], [1, 0, 0]]
    """
    fn = "one_hot"
    (x,) = A.tensors(fn, x=x)
    if x._qdtype is not None:       # before the range check reads its integers as classes
        A.refuse_quantized(fn, x)
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
    if x is None:       # the core's pad casts None to a Tensor unchecked (reads garbage)
        raise TypeError(f"{fn}: x must be a tensor, got None")
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



def _sample(x, sx, sy, border_mode, border_val, interp_mode="linear"):
    """x [b, c, h, w] read at the points (sx, sy) [b, p] (float32/float64,
    x's dtype): bilinearly from the four pixels around each point, or the
    nearest one (coordinates rounded half to even, OpenCV's cvRound) for
    ``interp_mode="nearest"``; a neighbour outside the image is found by
    ``border_mode`` or, for "constant", is ``border_val``. Returns [b, c, p]."""
    b, c, h, w = x.shape
    p = sx.shape[1]
    flat = x.reshape(b, c, h * w)
    border = _BORDERS[border_mode]

    def read(yi, xi):
        pos = _B["add"](_B["mul"](border(yi, h), w), border(xi, w))          # [b, p]
        pos = pos.reshape(b, 1, p).broadcast_to((b, c, p)).copy()
        vals = _index.gather(flat, 2, pos)
        if border_mode == "constant":
            inside = _B["logical_and"](
                _B["logical_and"](_B["ge"](yi, 0), _B["lt"](yi, h)),
                _B["logical_and"](_B["ge"](xi, 0), _B["lt"](xi, w)))
            vals = _T["where"](inside.reshape(b, 1, p), vals, float(border_val))
        return vals

    if interp_mode == "nearest":
        return read(_dispatch.astype(_U["round"](sy), "int32"),
                    _dispatch.astype(_U["round"](sx), "int32"))
    x0, y0 = _U["floor"](sx), _U["floor"](sy)
    ax, ay = _B["sub"](sx, x0), _B["sub"](sy, y0)                # bilinear weights
    x0, y0 = _dispatch.astype(x0, "int32"), _dispatch.astype(y0, "int32")
    out = None
    for dy, wy in ((0, _B["sub"](1.0, ay)), (1, ay)):
        for dx, wx in ((0, _B["sub"](1.0, ax)), (1, ax)):
            term = _B["mul"](read(_B["add"](y0, dy), _B["add"](x0, dx)),
                             _B["mul"](wy, wx).reshape(b, 1, p))
            out = term if out is None else _B["add"](out, term)
    return out


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
    out = _sample(x, sx, sy, border_mode, border_val)
    out = out.reshape(b, c, oh, ow)
    return out.transpose((0, 2, 3, 1)).copy() if format == "NHWC" else out


# --------------------------------------------- more of MegEngine 1.13's nn functions
#
# Composed of core ops, each docstring says of which: elementwise chains
# and reductions whose passes each run a C kernel already, or layout changes
# (one copy, no arithmetic). instance_norm (layer_norm's C rows, through
# group_norm) and local_response_norm (kernels/cpu/lrn.c) have kernels.

__all__ += ["hswish", "hsigmoid", "prelu", "logsigmoid", "logsumexp", "logsoftmax",
            "indexing_one_hot", "pixel_shuffle", "instance_norm", "general_norm",
            "local_response_norm", "sync_batch_norm"]


def hswish(x):
    """``x * relu6(x + 3) / 6`` (MegEngine's name for :func:`hardswish`;
    the same core kernel ``hardswish``); ints give float32.

    >>> import mgtrace as mt, mgtrace.functional as F
    >>> [round(v, 4) for v in F.hswish(mt.tensor([0.0, 1.0, 3.0])).tolist()]
    [0.0, 0.6667, 3.0]
    """
    return _U["hardswish"](A.check_operand("hswish", "x", x))


def hsigmoid(x):
    """``relu6(x + 3) / 6`` (MegEngine's name for :func:`hardsigmoid`; core
    kernel ``hardsigmoid``); ints give float32.

    >>> import mgtrace as mt, mgtrace.functional as F
    >>> F.hsigmoid(mt.tensor([-4.0, 0.0, 4.0])).tolist()
    [0.0, 0.5, 1.0]
    """
    return _U["hardsigmoid"](A.check_operand("hsigmoid", "x", x))


def prelu(x, y):
    """Elementwise ``max(x, 0) + y * min(x, 0)`` (MegEngine's ``prelu``),
    composed of core ops. ``y`` broadcasts against x by NumPy's rule
    (MegEngine's PReLU module passes [1, C, 1, 1]; :class:`~mgtrace.module.PReLU`
    reshapes its [C] weight so).

    Args:
        x: Tensor. y: the slope for negative x, a Tensor or number.

    Returns:
        The broadcast shape; MegEngine promotion of x and y.

    Raises:
        ValueError: shapes that do not broadcast. TypeError: operands that
            are not tensors, arrays or numbers.

    >>> import mgtrace as mt, mgtrace.functional as F
    >>> F.prelu(mt.tensor([-2.0, 3.0]), 0.25).tolist()
    [-0.5, 3.0]
    """
    fn = "prelu"
    A.check_operand(fn, "x", x)
    A.check_operand(fn, "y", y)
    A.check_broadcast(fn, x=x, y=y)
    return _B["add"](_B["maximum"](x, 0), _B["mul"](y, _B["minimum"](x, 0)))


def logsigmoid(x):
    """Elementwise ``log(1 / (1 + exp(-x))) = -softplus(-x)`` (MegEngine's
    ``logsigmoid``), composed of the core's stable softplus.

    Returns:
        x's shape; float dtypes keep theirs, ints give float32.

    >>> import mgtrace as mt, mgtrace.functional as F
    >>> [round(v, 4) for v in F.logsigmoid(mt.tensor([-5.0, 0.0, 4.0])).tolist()]
    [-5.0067, -0.6931, -0.0181]
    """
    x = A.check_operand("logsigmoid", "x", x)
    return _U["neg"](_U["softplus"](_U["neg"](x)))


def _axes(fn, axis, ndim):
    axes = axis if isinstance(axis, (tuple, list)) else (axis,)
    if not axes:
        raise ValueError(f"{fn}: axis must name at least one axis")
    out = tuple(A.to_axis(fn, "axis", a, ndim) for a in axes)
    if len(set(out)) != len(out):
        raise ValueError(f"{fn}: repeated axis in {axis!r}")
    return out


def logsumexp(inp, axis, keepdims=False):
    """``log(sum(exp(inp), axis))`` without overflow (MegEngine's
    ``logsumexp``): ``b + log(sum(exp(inp - b)))`` with b the maximum
    (0 where the maximum is infinite), composed of core reductions.

    Args:
        inp: Tensor; integers give float32.
        axis: int or sequence of ints (required, as MegEngine's).
        keepdims: bool (or an int, as MegEngine takes 1): keep the reduced
            axes with size 1.

    Returns:
        float Tensor; -inf over a line of -inf, NaN over a line with NaN.

    Raises:
        IndexError: axis out of range. ValueError: repeated or no axes.
        TypeError: axis not an int; keepdims not a bool or int.

    >>> import mgtrace as mt, mgtrace.functional as F
    >>> [round(v, 4) for v in F.logsumexp(mt.tensor([[0.0, 0.0], [1.0, 2.0]]), 1).tolist()]
    [0.6931, 2.3133]
    """
    fn = "logsumexp"
    (x,) = A.tensors(fn, x=inp)
    keepdims = A.to_flag(fn, "keepdims", keepdims)
    if x.dtype.kind not in "fV":
        x = _dispatch.astype(x, "float32")
    axes = _axes(fn, axis, x.ndim)
    if x.size:
        b = _reduce.max(x, axes, True)
        b = _T["where"](_U["isfinite"](b), b, 0.0)
    else:       # max has no identity; an empty sum is 0, so log(0) = -inf over empty axes
        b = _reduce.sum(x, axes, True)
    s = _U["log"](_reduce.sum(_U["exp"](_B["sub"](x, b)), axes, True))
    y = _B["add"](s, b)
    return y if keepdims else y.squeeze(axes)


def logsoftmax(inp, axis):
    """``inp - logsumexp(inp, axis, keepdims=True)`` (MegEngine's
    ``logsoftmax``): one core ``log_softmax`` kernel for a single axis,
    composed of :func:`logsumexp` for several.

    Args:
        inp: Tensor; integers give float32.
        axis: int or sequence of ints (required, as MegEngine's).

    Returns:
        inp's shape, float dtype.

    Raises:
        IndexError: axis out of range. ValueError: repeated axes.

    >>> import mgtrace as mt, mgtrace.functional as F
    >>> [round(v, 4) for v in F.logsoftmax(mt.tensor([[1.0, 1.0]]), axis=1)[0].tolist()]
    [-0.6931, -0.6931]
    """
    fn = "logsoftmax"
    (x,) = A.tensors(fn, x=inp)
    axes = _axes(fn, axis, max(x.ndim, 1))
    if len(axes) == 1:
        return _reduce.log_softmax(x, axes[0])
    if x.dtype.kind not in "fV":
        x = _dispatch.astype(x, "float32")
    return _B["sub"](x, logsumexp(x, axes, True))


def indexing_one_hot(src, index, axis=1, keepdims=False):
    """``src[..., index[...], ...]`` along ``axis``: for every position of
    the other axes, the element that ``index`` picks there (MegEngine's
    ``indexing_one_hot``), composed of the core's ``gather``.

    Args:
        src: Tensor [d0, ..., d_axis, ..., dn].
        index: integer Tensor (or array) of src's shape without ``axis``.
        axis: int, the axis indexed.
        keepdims: keep ``axis`` with size 1.

    Returns:
        src's dtype, src's shape without ``axis`` (or with it of size 1).

    Raises:
        ValueError: index of another shape. TypeError: a non-integer index,
            keepdims not a bool or int.
        IndexError: axis out of range, or an index outside ``0..d_axis - 1``
            (a negative one too: MegEngine 1.13 refuses -1, "bad value in
            IndexingOneHot index").

    >>> import mgtrace as mt, mgtrace.functional as F
    >>> F.indexing_one_hot(mt.tensor([[1.0, 2.0], [3.0, 4.0]]), mt.tensor([1, 0])).tolist()
    [2.0, 3.0]
    """
    fn = "indexing_one_hot"
    src, index = A.tensors(fn, src=src, index=index)
    A.check_int_dtype(fn, "index", index)
    keepdims = A.to_flag(fn, "keepdims", keepdims)
    ax = A.to_axis(fn, "axis", axis, src.ndim)
    want = src.shape[:ax] + src.shape[ax + 1:]
    if index.shape != want:
        raise ValueError(f"{fn}: index must have src's shape without axis {ax}, {want}; got "
                         f"{index.shape}")
    if index.size and index.dtype.kind == "i" and int(_reduce.min(index).item()) < 0:
        raise IndexError(f"{fn}: index holds {int(_reduce.min(index).item())}, outside "
                         f"0..{src.shape[ax] - 1} (negative indices do not count from the end)")
    try:
        y = _index.gather(src, ax, index.expand_dims(ax))
    except IndexError as e:
        raise IndexError(f"{fn}: index holds a value outside 0..{src.shape[ax] - 1}: {e}") from None
    return y if keepdims else y.squeeze(ax)


def pixel_shuffle(inp, upscale_factor):
    """Rearrange [..., C * r * r, H, W] into [..., C, H * r, W * r]
    (MegEngine's and PyTorch's ``pixel_shuffle``): out[..., c, h*r + i,
    w*r + j] = inp[..., c*r*r + i*r + j, h, w]; a reshape, a transpose and a
    reshape (a layout change: one strided copy, nothing a kernel would save).

    Args:
        inp: Tensor with at least 3 axes, any dtype.
        upscale_factor: int r >= 1.

    Raises:
        ValueError: fewer than 3 axes, channels not divisible by r * r,
            r < 1. TypeError: r not an int.

    >>> import numpy as np, mgtrace as mt, mgtrace.functional as F
    >>> x = mt.tensor(np.arange(4).reshape(1, 4, 1, 1))
    >>> F.pixel_shuffle(x, 2).tolist()
    [[[[0, 1], [2, 3]]]]
    """
    fn = "pixel_shuffle"
    (x,) = A.tensors(fn, inp=inp)
    r = A.to_size(fn, "upscale_factor", upscale_factor, 1)
    if x.ndim < 3:
        raise ValueError(f"{fn}: inp must be [..., C * r * r, H, W], got shape {x.shape}")
    *batch, c, h, w = x.shape
    if c % (r * r):
        raise ValueError(f"{fn}: the {c} channels are not divisible by upscale_factor ** 2 = "
                         f"{r * r}")
    n = math.prod(batch)
    y = x.reshape(n, c // (r * r), r, r, h, w).transpose(0, 1, 4, 2, 5, 3)
    return y.reshape(tuple(batch) + (c // (r * r), h * r, w * r))


def instance_norm(inp, affine, weight=None, bias=None, eps=1e-5):
    """Instance normalization (MegEngine's ``instance_norm``): each (sample,
    channel) normalized by its own mean and biased variance over the
    spatial axes, then ``* weight + bias`` per channel when ``affine``;
    :func:`group_norm` with one channel a group, so float32/float64 on the
    CPU run as rows of layer_norm's C kernel (a (8, 64, 56, 56) float32
    input in about half the time of the mean/var composition).

    Args:
        inp: float [N, C, *spatial].
        affine: apply weight and bias (both required then).
        weight, bias: [C] (or [1, C, 1, ...]).
        eps: added to the variance.

    Returns:
        inp's shape and dtype.

    Raises:
        ValueError: affine without weight or bias, or shapes as group_norm.
        TypeError: integer inp.

    >>> import mgtrace as mt, mgtrace.functional as F
    >>> F.instance_norm(mt.tensor([[[1.0, 3.0]]]), False).numpy().round(3).tolist()
    [[[-1.0, 1.0]]]
    """
    fn = "instance_norm"
    (x,) = A.tensors(fn, inp=inp)
    if x.ndim < 2:
        raise ValueError(f"{fn}: inp must be [N, C, *spatial], got shape {x.shape}")
    if A.to_bool(fn, "affine", affine):
        if weight is None or bias is None:
            raise ValueError(f"{fn}: affine=True needs both weight and bias")
    else:
        weight = bias = None
    try:
        return group_norm(x, max(x.shape[1], 1), weight, bias, eps)
    except (ValueError, TypeError) as e:
        raise type(e)(str(e).replace("group_norm:", f"{fn}:", 1)) from None


def general_norm(inp, normalized_axis, affine=True, weight=None, bias=None, eps=1e-5):
    """Normalization over any axes (MegEngine's ``general_norm``):
    ``(x - mean) / sqrt(var + eps) * weight + bias``, mean and biased
    variance over ``normalized_axis``; composed of core reductions (any
    set of axes, which layer_norm's row kernel cannot take without a
    transposing copy; the mean and var reductions are C kernels already).

    Args:
        inp: float Tensor.
        normalized_axis: int or ascending sequence of ints (negative ones
            count from the end; after that, the order must be ascending, as
            MegEngine requires).
        affine: apply weight and bias (both required then).
        weight, bias: Tensors of the normalized axes' sizes, in order.
        eps: added to the variance.

    Returns:
        inp's shape and dtype.

    Raises:
        ValueError: axes repeated or not ascending, affine without weight or
            bias, weight/bias of the wrong shape. IndexError: an axis out of
            range. TypeError: integer inp.

    >>> import mgtrace as mt, mgtrace.functional as F
    >>> F.general_norm(mt.tensor([[1.0], [3.0]]), 0, affine=False).numpy().round(3).tolist()
    [[-1.0], [1.0]]
    """
    fn = "general_norm"
    x, weight, bias = A.tensors(fn, optional=('weight', 'bias'), inp=inp, weight=weight, bias=bias)
    A.check_float(fn, "inp", x)
    axes = _axes(fn, normalized_axis, x.ndim)
    if list(axes) != sorted(axes):
        raise ValueError(f"{fn}: normalized_axis must be ascending (MegEngine's rule), got "
                         f"{normalized_axis!r}, i.e. {axes}; write {tuple(sorted(axes))}")
    eps = A.to_float(fn, "eps", eps)
    mean = _reduce.mean(x, axes, True)
    var = _reduce.var(x, axes, True)
    y = _B["mul"](_B["sub"](x, mean), _U["rsqrt"](_B["add"](var, eps)))
    if not A.to_bool(fn, "affine", affine):
        return y
    if weight is None or bias is None:
        raise ValueError(f"{fn}: affine=True needs both weight and bias")
    want = tuple(x.shape[a] for a in axes)
    shape = tuple(x.shape[a] if a in axes else 1 for a in range(x.ndim))
    for name, t in (("weight", weight), ("bias", bias)):
        if t.shape != want:
            raise ValueError(f"{fn}: {name} must have the normalized axes' shape {want}, got "
                             f"{t.shape}")
    return _B["add"](_B["mul"](y, weight.reshape(shape)), bias.reshape(shape))


def local_response_norm(inp, kernel_size=5, k=2.0, alpha=1e-4, beta=0.75):
    """Local response normalization across channels (MegEngine's
    ``local_response_norm``, its LRN operator)::

        y[n, c, ...] = x[n, c, ...] / (k + alpha * sum(x[n, c', ...] ** 2)) ** beta

    the sum over the ``kernel_size`` channels c' centred on c (zeros past
    the ends). Note alpha is not divided by kernel_size (PyTorch's
    ``local_response_norm(x, n, alpha * n, beta, k)`` is the same).
    Float32/float64 on a device with the kernel (the CPU) run one C pass
    (kernels/cpu/lrn.c, the window sums in double: AlexNet's
    (1, 96, 55, 55) in about 40% of the composed time); elsewhere, and
    under autodiff recording (whose gradient comes from the recorded core
    ops), it is composed of core ops: the squares padded along C and
    ``kernel_size`` shifted slices summed.

    Args:
        inp: float [N, C, *spatial].
        kernel_size: odd int >= 1.
        k, alpha, beta: floats.

    Returns:
        inp's shape and dtype.

    Raises:
        ValueError: inp with fewer than 2 axes, an even or non-positive
            kernel_size. TypeError: integer inp, non-int kernel_size.

    >>> import numpy as np, mgtrace as mt, mgtrace.functional as F
    >>> x = mt.tensor(np.arange(25, dtype=np.float32).reshape(1, 1, 5, 5))
    >>> round(F.local_response_norm(x, 3, 1.0, 1e-4, 0.75).numpy()[0, 0, 0, 1].item(), 6)
    0.999925
    """
    fn = "local_response_norm"
    (x,) = A.tensors(fn, inp=inp)
    A.check_float(fn, "inp", x)
    if x.ndim < 2:
        raise ValueError(f"{fn}: inp must be [N, C, *spatial], got shape {x.shape}")
    n = A.to_size(fn, "kernel_size", kernel_size, 1)
    if n % 2 == 0:
        raise ValueError(f"{fn}: kernel_size must be odd (MegEngine's LRN), got {n}")
    k, alpha, beta = (A.to_float(fn, nm, v) for nm, v in (("k", k), ("alpha", alpha),
                                                          ("beta", beta)))
    if x.dtype in _LN_FAST:
        y = _nn.lrn_rows(x, n, k, alpha, beta)
        if y is not None:
            return y
    return _lrn_composed(x, n, k, alpha, beta)


def _lrn_composed(x, n, k, alpha, beta):
    """local_response_norm of checked arguments in core ops"""
    c, half = x.shape[1], n // 2
    sq = _B["mul"](x, x)
    padded = _nn.pad(sq, ((0, 0), (half, half)) + ((0, 0),) * (x.ndim - 2), "constant", 0.0)
    s = padded[:, 0:c]
    for i in range(1, n):
        s = _B["add"](s, padded[:, i:i + c])
    return _B["truediv"](x, _B["pow"](_B["add"](_B["mul"](s, alpha), k), beta))


@_mutates("running_mean", "running_var", when=lambda a: a["training"])
def sync_batch_norm(inp, running_mean, running_var, weight=None, bias=None, training=False,
                    momentum=0.9, eps=1e-5, eps_mode="additive", group=None):
    """Synchronized batch normalization (MegEngine's ``sync_batch_norm``)
    in one process: the statistics of the whole batch, as
    :func:`batch_norm` (same momentum convention and running-statistics
    update, in place). mgtrace has no process group, so ``group`` must be
    None (a single process is the whole group).

    Args:
        inp, running_mean, running_var, weight, bias, training, momentum,
        eps: as :func:`batch_norm`.
        eps_mode: "additive" (``rsqrt(var + eps)``) or "max"
            (``rsqrt(max(var, eps))``), MegEngine's two modes.
        group: None.

    Returns:
        inp's shape and dtype.

    Raises:
        ValueError: an unknown eps_mode, a group given; and as batch_norm.

    >>> import mgtrace as mt, mgtrace.functional as F
    >>> x = mt.tensor([[1.0], [3.0]])
    >>> rm, rv = mt.tensor([0.0]), mt.tensor([1.0])
    >>> F.sync_batch_norm(x, rm, rv, training=True).numpy().round(3).ravel().tolist()
    [-1.0, 1.0]
    """
    fn = "sync_batch_norm"
    if eps_mode not in ("additive", "max"):
        raise ValueError(f"{fn}: eps_mode must be 'additive' or 'max', got {eps_mode!r}")
    if group is not None:
        raise ValueError(f"{fn}: mgtrace runs in one process and has no process group; pass "
                         f"group=None")
    if eps_mode == "additive":
        try:
            return batch_norm(inp, running_mean, running_var, weight, bias, training, momentum,
                              eps, True)
        except (ValueError, TypeError) as e:
            raise type(e)(str(e).replace("batch_norm:", f"{fn}:", 1)) from None
    (x,) = A.tensors(fn, inp=inp)
    eps = A.to_float(fn, "eps", eps)
    if x.ndim < 2:
        raise ValueError(f"{fn}: inp must be [N, C] or [N, C, *spatial], got shape {x.shape}")
    c, shape = x.shape[1], _bcast_shape(x.shape[1], x.ndim)

    def channels(name, v):      # a per-channel tensor as [1, C, 1, ...]
        t = _channel_vector(fn, name, A.as_tensor(fn, name, v, x.device), c, x.ndim)
        return t.reshape(shape)

    if training:    # the batch statistics and the running update, as batch_norm's
        batch_norm(x, running_mean, running_var, None, None, True, momentum, 0.0, True)
        axes = (0,) + tuple(range(2, x.ndim))
        mean, var = _reduce.mean(x, axes, True), _reduce.var(x, axes, True)
    else:
        if running_mean is None or running_var is None:
            raise ValueError(f"{fn}: running_mean and running_var are needed when "
                             f"training=False")
        mean, var = channels("running_mean", running_mean), channels("running_var", running_var)
    scale = _U["rsqrt"](_B["maximum"](var, eps))
    if weight is not None:
        scale = _B["mul"](scale, channels("weight", weight))
    y = _B["mul"](_B["sub"](x, mean), scale)
    if bias is not None:
        y = _B["add"](y, channels("bias", bias))
    return y


# --------------------------------------------- 3-d and untied convolutions, windows, remap
#
# conv3d and conv_transpose3d are the core's ops (kernels/cpu/conv3d.c); the
# others are composed of the core's 2-d convolutions, slices and gathers.

__all__ += ["conv3d", "conv_transpose3d", "local_conv2d", "sliding_window",
            "sliding_window_transpose", "warp_affine", "remap"]


def _check_conv_mode(fn, conv_mode):
    if not isinstance(conv_mode, str) or conv_mode.lower() != "cross_correlation":
        raise ValueError(f"{fn}: conv_mode must be 'cross_correlation' (the one MegEngine "
                         f"supports), got {conv_mode!r}")


def conv3d(inp, weight, bias=None, stride=1, padding=0, dilation=1, groups=1,
           conv_mode="cross_correlation"):
    """3-d convolution (cross-correlation; MegEngine's ``conv3d``,
    PyTorch's ``conv3d``). The core's conv3d op: at stride 1 with 8 to 31
    channels a group one BLAS GEMM per kernel tap over a padded copy
    (kernels/cpu/conv3d.c), elsewhere conv2d per kernel depth tap
    (mgtrace._core.fallbacks.conv3d; conv2d's Winograd and im2col measured
    faster there); its gradients are conv3d.c's kernels.

    Args:
        inp: float [N, C, D, H, W].
        weight: float [O, C/groups, KD, KH, KW] (PyTorch's layout).
        bias: float [O] or [1, O, 1, 1, 1], or None.
        stride, dilation: int or (d, h, w) triple, >= 1.
        padding: int or triple, >= 0 (zero padding).
        groups: int >= 1 dividing C and O.
        conv_mode: "cross_correlation" (the one MegEngine supports).

    Returns:
        [N, O, OD, OH, OW], OD = (D + 2*pd - dd*(KD-1) - 1) // sd + 1 (OH,
        OW alike), in the promoted float dtype.

    Raises:
        ValueError: inp or weight not 5-d, channel or groups mismatch, bias
            shape, a kernel larger than the padded input, a bad conv_mode.
        TypeError: integer tensors; non-int geometry.

    >>> import numpy as np, mgtrace as mt, mgtrace.functional as F
    >>> x = mt.tensor(np.ones((1, 1, 3, 3, 3), np.float32))
    >>> F.conv3d(x, mt.tensor(np.ones((2, 1, 2, 2, 2), np.float32))).shape
    (1, 2, 2, 2, 2)
    """
    fn = "conv3d"
    _check_conv_mode(fn, conv_mode)
    x, weight, bias = A.tensors(fn, optional=('bias',), inp=inp, weight=weight, bias=bias)
    A.check_ndim(fn, "inp", x, 5, "[N, C, D, H, W]")
    A.check_ndim(fn, "weight", weight, 5, "[O, C/groups, KD, KH, KW]")
    for name, t in (("inp", x), ("weight", weight), ("bias", bias)):
        if t is not None:
            A.check_float(fn, name, t)
    g = _groups(fn, groups)
    (sd, sh, sw), (pd, ph, pw), (dd, dh, dw) = (A.ntuple(fn, name, v, 3, lo) for name, v, lo in (
        ("stride", stride, 1), ("padding", padding, 0), ("dilation", dilation, 1)))
    n, c, d = x.shape[:3]
    o, cg, kd = weight.shape[:3]
    if c % g or o % g:
        raise ValueError(f"{fn}: groups={g} must divide the {c} input channels of inp and the "
                         f"{o} output channels of weight")
    if cg * g != c:
        raise ValueError(f"{fn}: inp has {c} channels but weight expects {cg * g} "
                         f"(weight.shape[1] * groups = {cg} * {g})")
    bias = _conv_bias(fn, bias, o)
    # the one output-size rule (and "larger than the padded input" message) of every conv/pool
    _nn.window_output_size(fn, tuple(x.shape[2:]), tuple(weight.shape[2:]), (sd, sh, sw), (pd, ph, pw),
                           (dd, dh, dw))
    return _nn.conv3d(x, weight, bias, (sd, sh, sw), (pd, ph, pw), (dd, dh, dw), g)


def conv_transpose3d(inp, weight, bias=None, stride=1, padding=0, output_padding=0, dilation=1,
                     groups=1):
    """3-d transposed convolution (the gradient of conv3d with respect to its
    input; MegEngine's and PyTorch's ``conv_transpose3d``). The core's
    kernel: one GEMM of the weight's transpose by x per image and group, the
    columns added back onto the output (col2vol, kernels/cpu/conv3d.c); a
    device without it runs conv_transpose2d per kernel depth tap
    (mgtrace._core.fallbacks.conv_transpose3d).

    Args:
        inp: float [N, C, D, H, W].
        weight: float [C, O/groups, KD, KH, KW] (PyTorch's layout).
        bias: float [O] or [1, O, 1, 1, 1], or None.
        stride, dilation: int or triple >= 1; padding: int or triple >= 0;
        output_padding: int or triple, each smaller than its stride or
            dilation.
        groups: int >= 1 dividing C.

    Returns:
        [N, O, OD, OH, OW], OD = (D-1)*sd - 2*pd + dd*(KD-1) + opd + 1 (OH,
        OW alike), in the promoted float dtype.

    Raises:
        ValueError: inp or weight not 5-d, inp's channels not
            weight.shape[0], bad bias shape or geometry. TypeError: integer
            tensors.

    >>> import numpy as np, mgtrace as mt, mgtrace.functional as F
    >>> x = mt.tensor(np.ones((1, 2, 2, 3, 3), np.float32))
    >>> w = mt.tensor(np.ones((2, 4, 3, 3, 3), np.float32))
    >>> F.conv_transpose3d(x, w, stride=2, padding=1, output_padding=1).shape
    (1, 4, 4, 6, 6)
    """
    fn = "conv_transpose3d"
    x, weight, bias = A.tensors(fn, optional=('bias',), inp=inp, weight=weight, bias=bias)
    A.check_ndim(fn, "inp", x, 5, "[N, C, D, H, W]")
    A.check_ndim(fn, "weight", weight, 5, "[C, O/groups, KD, KH, KW]")
    for name, t in (("inp", x), ("weight", weight), ("bias", bias)):
        if t is not None:
            A.check_float(fn, name, t)
    g = _groups(fn, groups)
    (sd, sh, sw), (pd, ph, pw), (opd, oph, opw), (dd, dh, dw) = (
        A.ntuple(fn, name, v, 3, lo) for name, v, lo in (
            ("stride", stride, 1), ("padding", padding, 0), ("output_padding", output_padding, 0),
            ("dilation", dilation, 1)))
    if any(op >= max(s, dl) for op, s, dl in ((opd, sd, dd), (oph, sh, dh), (opw, sw, dw))):
        raise ValueError(f"{fn}: output_padding {(opd, oph, opw)} must be smaller than stride "
                         f"{(sd, sh, sw)} or dilation {(dd, dh, dw)}")
    n, c, d = x.shape[:3]
    if c != weight.shape[0]:
        raise ValueError(f"{fn}: inp has {c} channels but weight.shape[0] is {weight.shape[0]} "
                         f"(weight is [C, O/groups, KD, KH, KW])")
    if c % g:
        raise ValueError(f"{fn}: groups={g} does not divide the {c} channels of inp")
    o, kd = weight.shape[1] * g, weight.shape[2]
    bias = _conv_bias(fn, bias, o)
    full = (d - 1) * sd + dd * (kd - 1) + 1 + opd          # output depth before the crop
    od = full - 2 * pd
    if od < 1:
        raise ValueError(f"{fn}: padding {pd} leaves no output depth ({full} - 2 * {pd})")
    return _nn.conv_transpose3d(x, weight, bias, (sd, sh, sw), (pd, ph, pw), (opd, oph, opw),
                                (dd, dh, dw), g)


def _window_geometry(fn, x, kernel_size, padding, stride, dilation):
    A.check_ndim(fn, "inp", x, 4, "[N, C, H, W]")
    k = A.pair(fn, "kernel_size", kernel_size, 1)
    p = A.pair(fn, "padding", padding, 0)
    s = A.pair(fn, "stride", stride, 1)
    d = A.pair(fn, "dilation", dilation, 1)
    return k, p, s, d


def _windows_out(fn, size, k, p, s, d):
    """The output size of fn's sliding windows along each axis of ``size``:
    the kernels' rule (window_output_size), its ValueError when a window
    is larger than the padded input.

    A symbolic size (a SymInt, while tracing with symbolic shapes) gets
    the same rule written on it, so that the graph stays general: the C
    rule alone would turn it into the traced value (the ONNX exporter's
    re-trace of SlidingWindow then fixed the window grid)."""
    out = _nn.window_output_size(fn, tuple(int(v) for v in size), tuple(k), tuple(s), tuple(p), tuple(d))
    if all(type(v) is int for v in size):
        return out
    return tuple(v if type(n) is int else (n + 2 * pi - di * (ki - 1) - 1) // si + 1
                 for v, n, ki, si, pi, di in zip(out, size, k, s, p, d))


def sliding_window(inp, kernel_size, padding=0, stride=1, dilation=1):
    """The sliding local blocks of a batch of images (MegEngine's
    ``sliding_window``, its Images2Neibs; PyTorch's ``unfold`` laid out by
    position): ``out[n, c, i, j, ki, kj] = x_padded[n, c, i*sh + ki*dh,
    j*sw + kj*dw]``, zero padding. Composed of KH*KW strided slices of the
    padded input, stacked; no dedicated kernel yet.

    Args:
        inp: [N, C, H, W], any dtype.
        kernel_size: int or (kh, kw); padding, stride, dilation: int or pair.

    Returns:
        [N, C, OH, OW, KH, KW] in inp's dtype, OH = (H + 2*ph - dh*(KH-1)
        - 1) // sh + 1 (OW alike).

    Raises:
        ValueError: inp not 4-d, a window larger than the padded input, bad
            geometry. TypeError: non-int geometry.

    >>> import numpy as np, mgtrace as mt, mgtrace.functional as F
    >>> x = mt.tensor(np.arange(9).reshape(1, 1, 3, 3))
    >>> F.sliding_window(x, 2)[0, 0, 1, 0].tolist()
    [[3, 4], [6, 7]]
    """
    fn = "sliding_window"
    (x,) = A.tensors(fn, inp=inp)
    k, p, s, d = _window_geometry(fn, x, kernel_size, padding, stride, dilation)
    n, c, h, w = x.shape
    oh, ow = _windows_out(fn, (h, w), k, p, s, d)
    if any(p):
        x = _nn.pad(x, ((0, 0), (0, 0), (p[0], p[0]), (p[1], p[1])), "constant", 0)
    taps = [x[:, :, i * d[0]:i * d[0] + (oh - 1) * s[0] + 1:s[0],
              j * d[1]:j * d[1] + (ow - 1) * s[1] + 1:s[1]]
            for i in range(k[0]) for j in range(k[1])]
    return _index.stack(taps, 4).reshape(n, c, oh, ow, k[0], k[1])


def sliding_window_transpose(inp, output_size, kernel_size, padding=0, stride=1, dilation=1):
    """The adjoint of :func:`sliding_window` (MegEngine's
    ``sliding_window_transpose``, PyTorch's ``fold``): each window element
    is added back at its place, ``out[n, c, y, x] = sum of inp[n, c, i, j,
    ki, kj]`` over the windows that cover (y, x) of the padded image, which
    is then cropped by the padding. Composed of strided in-place adds into a
    zero image; no dedicated kernel yet.

    Args:
        inp: [N, C, OH, OW, KH, KW], OH and OW those :func:`sliding_window`
            gives for ``output_size``.
        output_size: int or (h, w), the image size.
        kernel_size, padding, stride, dilation: as :func:`sliding_window`.

    Returns:
        [N, C, H, W] in inp's dtype.

    Raises:
        ValueError: inp not 6-d, or its window grid or kernel not the one
            output_size gives.

    >>> import numpy as np, mgtrace as mt, mgtrace.functional as F
    >>> x = mt.tensor(np.ones((1, 1, 2, 2, 2, 2), np.float32))
    >>> F.sliding_window_transpose(x, 3, 2).numpy()[0, 0].tolist()
    [[1.0, 2.0, 1.0], [2.0, 4.0, 2.0], [1.0, 2.0, 1.0]]
    """
    fn = "sliding_window_transpose"
    (x,) = A.tensors(fn, inp=inp)
    A.check_ndim(fn, "inp", x, 6, "[N, C, OH, OW, KH, KW]")
    hw = A.pair(fn, "output_size", output_size, 1)
    k = A.pair(fn, "kernel_size", kernel_size, 1)
    p = A.pair(fn, "padding", padding, 0)
    s = A.pair(fn, "stride", stride, 1)
    d = A.pair(fn, "dilation", dilation, 1)
    oh, ow = _windows_out(fn, hw, k, p, s, d)
    n, c = x.shape[:2]
    if x.shape[2:] != (oh, ow) + k:
        raise ValueError(f"{fn}: inp must be [N, C, {oh}, {ow}, {k[0]}, {k[1]}] for output_size "
                         f"{hw}, kernel_size {k}, padding {p}, stride {s}, dilation {d}; got "
                         f"shape {x.shape}")
    hp, wp = hw[0] + 2 * p[0], hw[1] + 2 * p[1]
    out = _B["mul"](_nn.pad(x[:, :, :1, :1, 0, 0], ((0, 0), (0, 0), (0, hp - 1), (0, wp - 1)),
                            "constant", 0), 0)      # zeros [N, C, hp, wp] in x's dtype and device
    for i in range(k[0]):
        for j in range(k[1]):
            idx = (slice(None), slice(None), slice(i * d[0], i * d[0] + (oh - 1) * s[0] + 1, s[0]),
                   slice(j * d[1], j * d[1] + (ow - 1) * s[1] + 1, s[1]))
            _index.setitem(out, idx, _B["add"](out[idx], x[:, :, :, :, i, j]))
    return out[:, :, p[0]:p[0] + hw[0], p[1]:p[1] + hw[1]]


def local_conv2d(inp, weight, bias=None, stride=1, padding=0, dilation=1,
                 conv_mode="cross_correlation"):
    """Locally connected 2-d layer (MegEngine's ``local_conv2d``, its
    GroupLocal): a convolution whose kernel differs at every output
    position. Composed of :func:`sliding_window` and one batched matmul over
    the output positions (the GEMM path); no dedicated kernel yet.

    Args:
        inp: float [N, C, H, W].
        weight: float [OH, OW, C, KH, KW, O] (MegEngine's dense layout) or
            [G, OH, OW, C/G, KH, KW, O/G] (grouped, as M.LocalConv2d keeps
            it), OH and OW the output size.
        bias: float [O] or [1, O, 1, 1], or None.
        stride, padding, dilation: int or pair.
        conv_mode: "cross_correlation".

    Returns:
        [N, O, OH, OW] in the promoted float dtype.

    Raises:
        ValueError: shapes that do not fit (the output grid, channels,
            kernel), a bad conv_mode. TypeError: integer tensors.

    >>> import numpy as np, mgtrace as mt, mgtrace.functional as F
    >>> x = mt.tensor(np.ones((1, 2, 3, 3), np.float32))
    >>> w = mt.tensor(np.ones((2, 2, 2, 2, 2, 4), np.float32))
    >>> F.local_conv2d(x, w).shape
    (1, 4, 2, 2)
    """
    fn = "local_conv2d"
    _check_conv_mode(fn, conv_mode)
    x, weight, bias = A.tensors(fn, optional=('bias',), inp=inp, weight=weight, bias=bias)
    A.check_ndim(fn, "inp", x, 4, "[N, C, H, W]")
    A.check_ndim(fn, "weight", weight, (6, 7), "[OH, OW, C, KH, KW, O] or "
                                              "[G, OH, OW, C/G, KH, KW, O/G]")
    for name, t in (("inp", x), ("weight", weight), ("bias", bias)):
        if t is not None:
            A.check_float(fn, name, t)
    wt = weight if weight.ndim == 7 else weight.expand_dims(0)
    g, oh, ow, cg, kh, kw, og = wt.shape
    n, c, h, w = x.shape
    if cg * g != c:
        raise ValueError(f"{fn}: inp has {c} channels but weight expects {cg * g}")
    cols = sliding_window(x, (kh, kw), padding, stride, dilation)     # [N, C, OH, OW, KH, KW]
    if cols.shape[2:4] != (oh, ow):
        raise ValueError(f"{fn}: weight is for a {oh}x{ow} output but inp gives "
                         f"{cols.shape[2]}x{cols.shape[3]}")
    bias = _conv_bias(fn, bias, g * og)
    # [OH*OW*G, N, C/G*KH*KW] @ [OH*OW*G, C/G*KH*KW, O/G]
    a = cols.reshape(n, g, cg, oh, ow, kh, kw).transpose(3, 4, 1, 0, 2, 5, 6)
    a = a.reshape(oh * ow * g, n, cg * kh * kw)
    b = wt.transpose(1, 2, 0, 3, 4, 5, 6).reshape(oh * ow * g, cg * kh * kw, og)
    y = _linalg.matmul(a, b)                                                # [OH*OW*G, N, O/G]
    y = y.reshape(oh, ow, g, n, og).transpose(3, 2, 4, 0, 1).reshape(n, g * og, oh, ow)
    if bias is not None:
        y = _B["add"](y, bias.reshape(1, g * og, 1, 1))
    return y


def warp_affine(inp, mat, out_shape, border_mode="replicate", border_val=0.0, format="NHWC",
                interp_mode="linear"):
    """Affine warp of batched images (MegEngine's ``warp_affine``): output
    pixel (h, w) samples the input at ``mat[b] @ [w, h, 1]``, bilinearly;
    :func:`warp_perspective` with the matrix completed by [0, 0, 1].
    MegEngine's default layout here is NHWC (as its own); its NHWC CPU kernel
    rounds the interpolation weights to fixed point (its values differ from
    these, and from its NCHW kernel's, by up to 1/64 of the pixel range),
    this computes in float as its NCHW kernel does.

    Args:
        inp: float [N, H, W, C] (``format="NHWC"``, the default) or
            [N, C, H, W] (``"NCHW"``).
        mat: float [N, 2, 3].
        out_shape: (oh, ow).
        border_mode, border_val: as :func:`warp_perspective`.
        format: "NHWC" or "NCHW". interp_mode: "linear".

    Returns:
        [N, oh, ow, C] (NHWC) or [N, C, oh, ow], float32 (float64 input
        gives float64).

    Raises:
        ValueError: mat not [N, 2, 3]; and as :func:`warp_perspective`.

    >>> import numpy as np, mgtrace as mt, mgtrace.functional as F
    >>> x = mt.tensor(np.arange(16, dtype=np.float32).reshape(1, 4, 4, 1))
    >>> m = mt.tensor([[[1.0, 0.0, 1.0], [0.0, 1.0, 1.0]]])
    >>> F.warp_affine(x, m, (2, 2)).numpy().ravel().tolist()
    [5.0, 6.0, 9.0, 10.0]
    """
    fn = "warp_affine"
    (m,) = A.tensors(fn, mat=mat)
    if m.ndim != 3 or m.shape[1:] != (2, 3):
        raise ValueError(f"{fn}: mat must be [N, 2, 3], got shape {m.shape}")
    last = _B["add"](_B["mul"](m[:, :1, :], 0), A.as_tensor(
        fn, "mat", np.array([[[0.0, 0.0, 1.0]]], np.float32), m.device))
    try:
        return warp_perspective(inp, _index.concat([m, last], 1), out_shape, None, border_mode,
                                border_val, format, interp_mode)
    except (ValueError, TypeError) as e:
        raise type(e)(str(e).replace("warp_perspective:", f"{fn}:", 1)) from None


def remap(inp, map_xy, border_mode="replicate", scalar=0.0, interp_mode="linear"):
    """Sample images at given coordinates (MegEngine's ``remap``, OpenCV's
    ``cv2.remap``): ``out[b, c, i, j] = inp[b, c]`` read at x =
    ``map_xy[b, i, j, 0]``, y = ``map_xy[b, i, j, 1]``, bilinearly
    ("linear") or at the nearest pixel ("nearest", coordinates rounded half
    to even, as MegEngine). Neighbours outside the image follow
    ``border_mode`` ("replicate", "constant" with ``scalar``, "reflect",
    "reflect_101", "wrap"). Composed of gathers; no dedicated kernel yet.

    Args:
        inp: float [N, C, H, W].
        map_xy: float [N, OH, OW, 2].
        border_mode, scalar, interp_mode: see above.

    Returns:
        [N, C, OH, OW], float32 (float64 input gives float64).

    Raises:
        ValueError: shapes that do not fit, unknown modes. TypeError:
            integer tensors.

    >>> import numpy as np, mgtrace as mt, mgtrace.functional as F
    >>> x = mt.tensor(np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4))
    >>> xy = np.array([[1., 0.], [0., 1.], [0., 1.], [0., 1.]], np.float32)
    >>> xy = mt.tensor(xy.reshape(1, 2, 2, 2))
    >>> F.remap(x, xy).numpy().ravel().tolist()
    [1.0, 4.0, 4.0, 4.0]
    """
    fn = "remap"
    x, mp = A.tensors(fn, inp=inp, map_xy=map_xy)
    A.check_ndim(fn, "inp", x, 4, "[N, C, H, W]")
    A.check_float(fn, "inp", x)
    A.check_float(fn, "map_xy", mp)
    if mp.ndim != 4 or mp.shape[0] != x.shape[0] or mp.shape[3] != 2:
        raise ValueError(f"{fn}: map_xy must be [{x.shape[0]}, OH, OW, 2] for inp of shape "
                         f"{x.shape}, got {mp.shape}")
    if border_mode not in _BORDERS:
        raise ValueError(f"{fn}: border_mode must be one of {', '.join(map(repr, _BORDERS))}, "
                         f"got {border_mode!r}")
    if interp_mode not in ("linear", "nearest"):
        raise ValueError(f"{fn}: interp_mode must be 'linear' or 'nearest', got {interp_mode!r}")
    scalar = A.to_float(fn, "scalar", scalar)
    dt = "float64" if x.dtype == np.float64 else "float32"
    x, mp = _dispatch.astype(x, dt), _dispatch.astype(mp, dt)
    n, oh, ow = mp.shape[:3]
    sx = mp[..., 0].reshape(n, oh * ow)
    sy = mp[..., 1].reshape(n, oh * ow)
    return _sample(x, sx, sy, border_mode, scalar, interp_mode).reshape(n, x.shape[1], oh, ow)


# --------------------------------------------- multi-head attention

__all__ += ["multi_head_attention"]


def _float_mask(fn, name, mask, dtype):
    """A bool mask (True: masked out) as 0 / -inf of ``dtype``; a float mask as is."""
    if mask is None:
        return None
    if mask.dtype.kind == "b":
        return _T["where"](mask, -math.inf, _dispatch.astype(_B["mul"](mask, 0), dtype))
    if mask.dtype.kind not in "fV":
        raise TypeError(f"{fn}: {name} must be bool or floating-point, got {mask.dtype.name}")
    return mask


def multi_head_attention(query, key, value, embed_dim, num_heads, attn_drop, out_drop,
                         io_weight_bias, qproj_size=None, kproj_size=None, vproj_size=None,
                         oproj_size=None, qbias=False, kbias=False, vbias=False, obias=False,
                         bias_k=None, bias_v=None, add_zero_attn=False, key_padding_mask=None,
                         attn_mask=None, need_weights=False, average_attn_weights=False,
                         is_causal=False, maybe_cudnn_style_mask=False, reslink=False,
                         training=True):
    """Multi-head attention (MegEngine's ``multi_head_attention``; "Attention
    Is All You Need"), batch first, with MegEngine's packed parameters.

    ``io_weight_bias`` [1, n] holds, in order, the query, key, value and
    output projection weights, each [in, out] (``Y = X @ W``, MegEngine's
    layout, the transpose of PyTorch's), then their biases; a projection of
    size 0 is absent (its input passes through), a bias absent unless its
    flag is set. Per head h of size d = embed_dim / num_heads::

        out = concat_h(softmax(q_h @ k_h^T / sqrt(d) + mask) @ v_h) @ W_o + b_o

    The scores and softmax run on the core's fused ``attention`` kernel
    (float32; other float dtypes run the same sequence of ops); the
    projections are matmuls. Weights are returned when ``need_weights``.

    Args:
        query: float [N, L, E] (or unbatched [L, E]). key: [N, S, kdim],
            value: [N, S, vdim].
        embed_dim: E. num_heads: dividing E.
        attn_drop, out_drop: dropout probabilities on the attention weights
            and on the output, applied when ``training``.
        io_weight_bias: float [1, n], see above.
        qproj_size, kproj_size, vproj_size, oproj_size: projection sizes,
            default embed_dim; 0 for none.
        qbias, kbias, vbias, obias: whether io_weight_bias holds that bias.
        bias_k, bias_v: [1, 1, E] rows appended to the projected keys and
            values (MegEngine's add_bias_kv), or None.
        add_zero_attn: append a zero key and value.
        key_padding_mask: [N, S] bool (True: ignore that key) or float (added).
        attn_mask: [L, S] or [N * num_heads, L, S], bool (True: masked) or
            float (added to the scores).
        need_weights: also return the attention weights.
        average_attn_weights: average the returned weights over the heads.
        is_causal: with no attn_mask, mask the keys after each query.
        maybe_cudnn_style_mask, reslink: must be False (MegEngine's cuDNN
            options).
        training: apply the dropouts.

    Returns:
        ``(out, weights)``: out [N, L, oproj_size] (unbatched: [L, ...]);
        weights [N * num_heads, L, S] ([N, L, S] averaged), or None.

    Raises:
        ValueError: shapes that do not fit, io_weight_bias of the wrong size,
            num_heads not dividing the projection size, cuDNN-only options.
        TypeError: integer tensors, masks neither bool nor float.

    >>> import numpy as np, mgtrace as mt, mgtrace.functional as F
    >>> x = mt.tensor(np.ones((1, 2, 2), np.float32))
    >>> w = mt.tensor(np.concatenate([np.eye(2).ravel()] * 4)[None].astype(np.float32))
    >>> F.multi_head_attention(x, x, x, 2, 1, 0.0, 0.0, w)[0].tolist()
    [[[1.0, 1.0], [1.0, 1.0]]]
    """
    fn = "multi_head_attention"
    if maybe_cudnn_style_mask or reslink:
        raise ValueError(f"{fn}: maybe_cudnn_style_mask and reslink are MegEngine's cuDNN-only "
                         f"options; pass False")
    q, k, v, wb, bias_k, bias_v, kpm, am = A.tensors(
        fn, optional=('bias_k', 'bias_v', 'key_padding_mask', 'attn_mask'),
        query=query, key=key, value=value, io_weight_bias=io_weight_bias, bias_k=bias_k,
        bias_v=bias_v, key_padding_mask=key_padding_mask, attn_mask=attn_mask)
    for name, t in (("query", q), ("key", k), ("value", v), ("io_weight_bias", wb)):
        A.check_float(fn, name, t)
    e = A.to_size(fn, "embed_dim", embed_dim, 1)
    h = A.to_size(fn, "num_heads", num_heads, 1)
    p_attn = A.probability(fn, "attn_drop", attn_drop)
    p_out = A.probability(fn, "out_drop", out_drop)
    batched = q.ndim == 3
    if q.ndim not in (2, 3) or k.ndim != q.ndim or v.ndim != q.ndim:
        raise ValueError(f"{fn}: query, key and value must all be [N, L, E] or all [L, E], got "
                         f"{q.shape}, {k.shape}, {v.shape}")
    if not batched:
        q, k, v = q.expand_dims(0), k.expand_dims(0), v.expand_dims(0)
        if kpm is not None:
            kpm = kpm.expand_dims(0)
    n, lq, eq = q.shape
    s = k.shape[1]
    if k.shape[0] != n or v.shape[0] != n or v.shape[1] != s:
        raise ValueError(f"{fn}: key {k.shape} and value {v.shape} must be [{n}, S, *] with one S "
                         f"for query {q.shape}")
    if eq != e:
        raise ValueError(f"{fn}: query has {eq} features, embed_dim is {e}")
    sizes = [e if p is None else A.to_size(fn, name, p, 0) for name, p in (
        ("qproj_size", qproj_size), ("kproj_size", kproj_size), ("vproj_size", vproj_size),
        ("oproj_size", oproj_size))]
    flags = [A.to_bool(fn, name, f) for name, f in (("qbias", qbias), ("kbias", kbias),
                                                   ("vbias", vbias), ("obias", obias))]
    ins = [e, k.shape[2], v.shape[2], sizes[2] or v.shape[2]]
    for name, size, flag in zip("qkvo", sizes, flags):
        if flag and not size:
            raise ValueError(f"{fn}: {name}bias needs a {name} projection ({name}proj_size > 0)")
    want = sum(i * o for i, o in zip(ins, sizes)) + sum(o for o, f in zip(sizes, flags) if f)
    if wb.size != want:
        raise ValueError(f"{fn}: io_weight_bias has {wb.size} elements; these sizes need {want} "
                         f"(weights {[(i, o) for i, o in zip(ins, sizes)]}, biases "
                         f"{[o for o, f in zip(sizes, flags) if f]})")
    flat = wb.reshape(want)
    pos, weights, biases = 0, [], []
    for i, o in zip(ins, sizes):
        weights.append(flat[pos:pos + i * o].reshape(i, o) if o else None)
        pos += i * o
    for o, f in zip(sizes, flags):
        biases.append(flat[pos:pos + o] if f else None)
        pos += o if f else 0

    def project(x, j):
        if weights[j] is None:
            return x
        y = _linalg.matmul(x, weights[j])
        return y if biases[j] is None else _B["add"](y, biases[j])

    qp, kp, vp = project(q, 0), project(k, 1), project(v, 2)
    dq, dv = qp.shape[2], vp.shape[2]
    if kp.shape[2] != dq:
        raise ValueError(f"{fn}: the projected query ({dq}) and key ({kp.shape[2]}) sizes differ")
    if dq % h or dv % h:
        raise ValueError(f"{fn}: num_heads={h} must divide the projected query ({dq}) and value "
                         f"({dv}) sizes")
    if bias_k is not None or bias_v is not None:
        if bias_k is None or bias_v is None:
            raise ValueError(f"{fn}: give both bias_k and bias_v, or neither")
        kp = _index.concat([kp, bias_k.reshape(1, 1, dq).broadcast_to((n, 1, dq))], 1)
        vp = _index.concat([vp, bias_v.reshape(1, 1, dv).broadcast_to((n, 1, dv))], 1)
    if A.to_bool(fn, "add_zero_attn", add_zero_attn):
        kp = _index.concat([kp, _B["mul"](kp[:, :1], 0)], 1)
        vp = _index.concat([vp, _B["mul"](vp[:, :1], 0)], 1)
    extra = kp.shape[1] - s
    # the additive mask [N, H, L, S'] (or one that broadcasts to it)
    dt = qp.dtype
    am = _float_mask(fn, "attn_mask", am, dt)
    kpm = _float_mask(fn, "key_padding_mask", kpm, dt)
    mask = None
    if am is not None:
        if am.ndim == 2 and am.shape == (lq, s):
            mask = am.reshape(1, 1, lq, s)
        elif am.ndim == 3 and am.shape == (n * h, lq, s):
            mask = am.reshape(n, h, lq, s)
        else:
            raise ValueError(f"{fn}: attn_mask must be [{lq}, {s}] or [{n * h}, {lq}, {s}], got "
                             f"{am.shape}")
    elif A.to_bool(fn, "is_causal", is_causal):
        causal = np.triu(np.full((lq, s), -np.inf, np.float32), 1)
        mask = _dispatch.astype(A.as_tensor(fn, "is_causal", causal.reshape(1, 1, lq, s),
                                            qp.device), dt)
    if kpm is not None:
        if kpm.shape != (n, s):
            raise ValueError(f"{fn}: key_padding_mask must be [{n}, {s}], got {kpm.shape}")
        kpm = kpm.reshape(n, 1, 1, s)
        mask = kpm if mask is None else _B["add"](mask, kpm)
    if mask is not None and extra:
        mask = _nn.pad(mask.broadcast_to(mask.shape[:2] + (lq, s)),
                       ((0, 0), (0, 0), (0, 0), (0, extra)), "constant", 0.0)

    def heads(x, d):
        return x.reshape(n, x.shape[1], h, d // h).transpose(0, 2, 1, 3)

    qh, kh, vh = heads(qp, dq), heads(kp, dq), heads(vp, dv)
    scale = (dq // h) ** -0.5
    attn_weights = None
    if need_weights or (training and p_attn > 0):
        scores = _B["mul"](_linalg.matmul(qh, kh.transpose(0, 1, 3, 2)), scale)
        if mask is not None:
            scores = _B["add"](scores, mask)
        probs = _reduce.softmax(scores, -1)
        attn_weights = probs
        if training and p_attn > 0:
            probs = dropout(probs, p_attn, True)
        o = _linalg.matmul(probs, vh)
    elif dt == np.float32 and (mask is None or mask.dtype == np.float32):
        o = _nn.attention(qh, kh, vh, mask, scale)
    else:
        scores = _B["mul"](_linalg.matmul(qh, kh.transpose(0, 1, 3, 2)), scale)
        o = _linalg.matmul(_reduce.softmax(scores if mask is None else _B["add"](scores, mask),
                                           -1), vh)
    o = o.transpose(0, 2, 1, 3).reshape(n, lq, dv)
    out = project(o, 3)
    if training and p_out > 0:
        out = dropout(out, p_out, True)
    if not batched:
        out = out.squeeze(0)
    if not need_weights:
        return out, None
    w = attn_weights
    if average_attn_weights:
        w = _reduce.mean(w, 1, False)
        return out, (w if batched else w.squeeze(0))
    w = w.reshape(n * h, lq, w.shape[3])
    return out, w


# --------------------------------------------- deformable and region-restricted convolutions

__all__ += ["deformable_conv2d", "region_restricted_conv"]


def _grouped_weight(fn, weight, groups):
    """A conv weight as [G, O/G, C/G, KH, KW]: PyTorch's [O, C/groups, KH, KW]
    (mgtrace's conv modules) or MegEngine's grouped 5-d layout."""
    if weight.ndim == 5:
        if weight.shape[0] != groups:
            raise ValueError(f"{fn}: a 5-d weight [G, O/G, C/G, KH, KW] must have G = groups "
                             f"({groups}), got shape {weight.shape}")
        return weight
    A.check_ndim(fn, "weight", weight, (4, 5), "[O, C/groups, KH, KW] or [G, O/G, C/G, KH, KW]")
    o = weight.shape[0]
    if o % groups:
        raise ValueError(f"{fn}: groups={groups} must divide the {o} output channels of weight")
    return weight.reshape((groups, o // groups) + weight.shape[1:])


def _grouped_gemm(cols, w, n, p):
    """cols [N, C, K, P] times w [G, O/G, C/G, KH, KW] per group -> [N, O, P]."""
    g, og, cg = w.shape[:3]
    k = w.shape[3] * w.shape[4]
    a = cols.reshape(n, g, cg * k, p)
    y = _linalg.matmul(w.reshape(g, og, cg * k), a)                   # [N, G, O/G, P]
    return y.reshape(n, g * og, p)


def deformable_conv2d(inp, weight, offset, mask, bias=None, stride=1, padding=0, dilation=1,
                      groups=1, conv_mode="cross_correlation", compute_mode="default"):
    """Modulated deformable convolution (DCNv2; MegEngine's
    ``deformable_conv2d``, torchvision's ``deform_conv2d`` with a mask).

    Kernel tap k = (a, b) of output (i, j) reads the input at
    ``(i*sh - ph + a*dh + dy, j*sw - pw + b*dw + dx)``, (dy, dx) =
    ``offset[n, 2*(d*K + k) : 2*(d*K + k) + 2, i, j]`` for deformable group
    d, bilinearly (zero outside the image), times ``mask[n, d*K + k, i,
    j]``; the taps then meet the weights as in a convolution. Composed of
    one gather-based bilinear sample per tap and one batched matmul; no
    dedicated kernel yet.

    Args:
        inp: float [N, C, H, W].
        weight: float [O, C/groups, KH, KW], or MegEngine's grouped
            [groups, O/groups, C/groups, KH, KW].
        offset: float [N, 2 * dg * KH * KW, OH, OW]; mask: float
            [N, dg * KH * KW, OH, OW]; dg (deformable groups) divides C.
        bias: [O] or [1, O, 1, 1], or None.
        stride, padding, dilation: int or pair. groups: int.
        conv_mode: "cross_correlation". compute_mode: "default" (float32
            accumulation either way).

    Returns:
        [N, O, OH, OW], float32 (float64 for float64 input).

    Raises:
        ValueError: shapes that do not fit (offset or mask channels, output
            grid, channels and groups). TypeError: integer tensors.

    >>> import numpy as np, mgtrace as mt, mgtrace.functional as F
    >>> x = mt.tensor(np.arange(9, dtype=np.float32).reshape(1, 1, 3, 3))
    >>> off = np.zeros((1, 2, 3, 3), np.float32); off[0, 1] = 1.0   # (dy, dx) = (0, 1)
    >>> F.deformable_conv2d(x, mt.tensor(np.ones((1, 1, 1, 1), np.float32)), mt.tensor(off),
    ...                     mt.tensor(np.ones((1, 1, 3, 3), np.float32))).numpy()[0, 0].tolist()
    [[1.0, 2.0, 0.0], [4.0, 5.0, 0.0], [7.0, 8.0, 0.0]]
    """
    fn = "deformable_conv2d"
    _check_conv_mode(fn, conv_mode)
    if compute_mode not in ("default", "float32"):
        raise ValueError(f"{fn}: compute_mode must be 'default' or 'float32', got {compute_mode!r}")
    x, weight, offset, mask, bias = A.tensors(fn, optional=('bias',),
        inp=inp, weight=weight, offset=offset,
                                              mask=mask, bias=bias)
    A.check_ndim(fn, "inp", x, 4, "[N, C, H, W]")
    for name, t in (("inp", x), ("weight", weight), ("offset", offset), ("mask", mask),
                    ("bias", bias)):
        if t is not None:
            A.check_float(fn, name, t)
    g = _groups(fn, groups)
    w = _grouped_weight(fn, weight, g)
    n, c, h, wd = x.shape
    _, og, cg, kh, kw = w.shape
    if cg * g != c:
        raise ValueError(f"{fn}: inp has {c} channels but weight expects {cg * g}")
    (sh, sw), (ph, pw), (dh, dw) = (A.pair(fn, nm, v, lo) for nm, v, lo in (
        ("stride", stride, 1), ("padding", padding, 0), ("dilation", dilation, 1)))
    oh, ow = _windows_out(fn, (h, wd), (kh, kw), (ph, pw), (sh, sw), (dh, dw))
    k = kh * kw
    A.check_ndim(fn, "offset", offset, 4, "[N, 2 * dg * KH * KW, OH, OW]")
    A.check_ndim(fn, "mask", mask, 4, "[N, dg * KH * KW, OH, OW]")
    if offset.shape[0] != n or offset.shape[2:] != (oh, ow) or offset.shape[1] % (2 * k):
        raise ValueError(f"{fn}: offset must be [{n}, 2 * dg * {k}, {oh}, {ow}], got "
                         f"{offset.shape}")
    dg = offset.shape[1] // (2 * k)
    if c % dg:
        raise ValueError(f"{fn}: the {dg} deformable groups of offset do not divide the {c} "
                         f"channels")
    if mask.shape != (n, dg * k, oh, ow):
        raise ValueError(f"{fn}: mask must be [{n}, {dg * k}, {oh}, {ow}], got {mask.shape}")
    bias = _conv_bias(fn, bias, g * og)
    dt = "float64" if x.dtype == np.float64 else "float32"
    xs = _dispatch.astype(x, dt).reshape(n * dg, c // dg, h, wd)
    off = _dispatch.astype(offset, dt).reshape(n, dg, k, 2, oh * ow)
    msk = _dispatch.astype(mask, dt).reshape(n, dg, k, oh * ow)
    gy, gx = np.meshgrid(np.arange(oh) * sh - ph, np.arange(ow) * sw - pw, indexing="ij")
    taps = []
    for a in range(kh):
        for b in range(kw):
            t = a * kw + b
            base_y = A.as_tensor(fn, "inp", (gy + a * dh).reshape(1, 1, -1).astype(dt), x.device)
            base_x = A.as_tensor(fn, "inp", (gx + b * dw).reshape(1, 1, -1).astype(dt), x.device)
            sy = _B["add"](off[:, :, t, 0], base_y).reshape(n * dg, oh * ow)
            sx = _B["add"](off[:, :, t, 1], base_x).reshape(n * dg, oh * ow)
            v = _sample(xs, sx, sy, "constant", 0.0)                        # [N*dg, C/dg, P]
            v = _B["mul"](v, msk[:, :, t].reshape(n * dg, 1, oh * ow))
            taps.append(v.reshape(n, c, 1, oh * ow))
    cols = _index.concat(taps, 2)                                           # [N, C, K, P]
    y = _grouped_gemm(cols, _dispatch.astype(w, dt), n, oh * ow).reshape(n, g * og, oh, ow)
    if bias is not None:
        y = _B["add"](y, bias.reshape(1, g * og, 1, 1))
    return y


def region_restricted_conv(inp, weight, rin, rout, bias=None, stride=1, padding=0, dilation=1,
                           groups=1, conv_mode="cross_correlation", compute_mode="default"):
    """Region-restricted convolution (MegEngine's ``region_restricted_conv``):
    a convolution in which output (i, j) of sample n reads only the input
    pixels whose region id ``rin[n, y, x]`` equals ``rout[n, i, j]`` (the
    others count as zero). Composed of :func:`sliding_window` (of the input
    and of rin), an equality mask and one batched matmul; no dedicated
    kernel yet.

    Args:
        inp: float [N, C, H, W].
        weight: float [O, C/groups, KH, KW], or MegEngine's grouped
            [groups, O/groups, C/groups, KH, KW].
        rin: integer [N, H, W]; rout: integer [N, OH, OW].
        bias: [O] or [1, O, 1, 1], or None.
        stride, padding, dilation: int or pair (zero padding: padded pixels
            contribute 0). groups: int.
        conv_mode: "cross_correlation". compute_mode: "default" or "float32".

    Returns:
        [N, O, OH, OW] in the promoted float dtype.

    Raises:
        ValueError: shapes that do not fit. TypeError: float region ids,
            integer inp or weight.

    >>> import numpy as np, mgtrace as mt, mgtrace.functional as F
    >>> x = mt.tensor(np.ones((1, 1, 2, 3), np.float32))
    >>> rin = mt.tensor(np.array([[[0, 0, 1], [0, 1, 1]]], np.int32))
    >>> rout = mt.tensor(np.array([[[0, 1]]], np.int32))
    >>> F.region_restricted_conv(x, mt.tensor(np.ones((1, 1, 2, 2), np.float32)), rin, rout).tolist()
    [[[[3.0, 3.0]]]]
    """
    fn = "region_restricted_conv"
    _check_conv_mode(fn, conv_mode)
    if compute_mode not in ("default", "float32"):
        raise ValueError(f"{fn}: compute_mode must be 'default' or 'float32', got {compute_mode!r}")
    x, weight, rin, rout, bias = A.tensors(fn, optional=('bias',),
        inp=inp, weight=weight, rin=rin, rout=rout,
                                           bias=bias)
    A.check_ndim(fn, "inp", x, 4, "[N, C, H, W]")
    for name, t in (("inp", x), ("weight", weight), ("bias", bias)):
        if t is not None:
            A.check_float(fn, name, t)
    A.check_int_dtype(fn, "rin", rin)
    A.check_int_dtype(fn, "rout", rout)
    g = _groups(fn, groups)
    w = _grouped_weight(fn, weight, g)
    n, c, h, wd = x.shape
    _, og, cg, kh, kw = w.shape
    if cg * g != c:
        raise ValueError(f"{fn}: inp has {c} channels but weight expects {cg * g}")
    if rin.shape != (n, h, wd):
        raise ValueError(f"{fn}: rin must be [{n}, {h}, {wd}] (inp's N, H, W), got {rin.shape}")
    cols = sliding_window(x, (kh, kw), padding, stride, dilation)        # [N, C, OH, OW, KH, KW]
    oh, ow = cols.shape[2:4]
    if rout.shape != (n, oh, ow):
        raise ValueError(f"{fn}: rout must be [{n}, {oh}, {ow}] (the output grid), got "
                         f"{rout.shape}")
    bias = _conv_bias(fn, bias, g * og)
    ids = sliding_window(rin.expand_dims(1), (kh, kw), padding, stride, dilation)
    keep = _B["eq"](ids, rout.reshape(n, 1, oh, ow, 1, 1))               # [N, 1, OH, OW, KH, KW]
    cols = _T["where"](keep, cols, 0.0)
    cols = cols.transpose(0, 1, 4, 5, 2, 3).reshape(n, c, kh * kw, oh * ow)
    y = _grouped_gemm(cols, w, n, oh * ow).reshape(n, g * og, oh, ow)
    if bias is not None:
        y = _B["add"](y, bias.reshape(1, g * og, 1, 1))
    return y


__all__ += ["deformable_psroi_pooling"]


def deformable_psroi_pooling(inp, rois, trans, no_trans, part_size, pooled_h, pooled_w,
                             sample_per_part, spatial_scale, trans_std=0.1):
    """Deformable RoI pooling (MegEngine's ``deformable_psroi_pooling``, its
    DeformablePSROIPooling operator as its CPU kernel computes it).

    For RoI r = ``rois[r] = (batch index, x1, y1, x2, y2)`` (image
    coordinates, rounded half away from zero, times ``spatial_scale``, the
    box [x1 - 0.5, x2 + 0.5] at least 0.1 wide), output bin (i, j) of every
    channel averages ``sample_per_part ** 2`` bilinear samples on a grid
    over the bin; unless ``no_trans``, the bin is first moved by ``trans[r,
    :, i, j] * trans_std`` times the RoI's size (x then y). Samples more
    than half a pixel outside the image are skipped (an empty bin gives 0);
    the others are clamped to the image. Composed of core ops (the sample
    grid, one gather-based bilinear read, a masked mean); no dedicated kernel.

    Args:
        inp: float [N, C, H, W].
        rois: float [R, 5].
        trans: float [R, 2, pooled_h, pooled_w] (ignored when ``no_trans``).
        no_trans: bool, pool without offsets (MegEngine's first phase).
        part_size: int, equal to pooled_h and pooled_w when trans is used
            (MegEngine indexes trans by it).
        pooled_h, pooled_w, sample_per_part: ints >= 1.
        spatial_scale, trans_std: floats.

    Returns:
        [R, C, pooled_h, pooled_w] in inp's float dtype.

    Raises:
        ValueError: shapes that do not fit, part_size not the pooled size.
        TypeError: integer inp, non-int sizes.

    >>> import numpy as np, mgtrace as mt, mgtrace.functional as F
    >>> x = mt.tensor(np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4))
    >>> rois = mt.tensor([[0.0, 0.0, 0.0, 3.0, 3.0]])
    >>> F.deformable_psroi_pooling(x, rois, mt.tensor(np.zeros((1, 2, 1, 1), np.float32)),
    ...                            True, 1, 1, 1, 2, 1.0).tolist()
    [[[[3.75]]]]
    """
    fn = "deformable_psroi_pooling"
    x, rois, trans = A.tensors(fn, optional=('trans',), inp=inp, rois=rois, trans=trans)
    A.check_ndim(fn, "inp", x, 4, "[N, C, H, W]")
    for name, t in (("inp", x), ("rois", rois), ("trans", trans)):
        A.check_float(fn, name, t)
    no_trans = A.to_bool(fn, "no_trans", no_trans)
    part = A.to_size(fn, "part_size", part_size, 1)
    ph_n = A.to_size(fn, "pooled_h", pooled_h, 1)
    pw_n = A.to_size(fn, "pooled_w", pooled_w, 1)
    sp = A.to_size(fn, "sample_per_part", sample_per_part, 1)
    scale = A.to_float(fn, "spatial_scale", spatial_scale)
    std = A.to_float(fn, "trans_std", trans_std)
    if rois.ndim != 2 or rois.shape[1] != 5:
        raise ValueError(f"{fn}: rois must be [R, 5] (batch index, x1, y1, x2, y2), got "
                         f"{rois.shape}")
    r = rois.shape[0]
    A.check_ndim(fn, "trans", trans, 4, "[R, 2, pooled_h, pooled_w]")
    if not no_trans:
        if trans.shape != (r, 2, ph_n, pw_n):
            raise ValueError(f"{fn}: trans must be [{r}, 2, {ph_n}, {pw_n}], got {trans.shape}")
        if part != ph_n or part != pw_n:
            raise ValueError(f"{fn}: part_size ({part}) must equal pooled_h and pooled_w "
                             f"({ph_n}, {pw_n}) when trans is used")
    n, c, h, w = x.shape
    dt = "float64" if x.dtype == np.float64 else "float32"
    xs, b = _dispatch.astype(x, dt), _dispatch.astype(rois, dt)

    def round_away(v):          # C's round(): halves away from zero
        return _B["mul"](_U["sign"](v), _U["floor"](_B["add"](_U["abs"](v), 0.5)))

    left = _B["sub"](_B["mul"](round_away(b[:, 1:2]), scale), 0.5)                  # [R, 1]
    top = _B["sub"](_B["mul"](round_away(b[:, 2:3]), scale), 0.5)
    rw = _B["maximum"](_B["sub"](_B["sub"](_B["mul"](_B["add"](round_away(b[:, 3:4]), 1.0),
                                                     scale), 0.5), left), 0.1)
    rh = _B["maximum"](_B["sub"](_B["sub"](_B["mul"](_B["add"](round_away(b[:, 4:5]), 1.0),
                                                     scale), 0.5), top), 0.1)
    # the sample grid, bins then samples: [1, P], P = pooled_h * pooled_w * sp * sp
    bi, bj, si, sj = np.meshgrid(np.arange(ph_n), np.arange(pw_n), np.arange(sp), np.arange(sp),
                                 indexing="ij")
    fy = A.as_tensor(fn, "inp", (bi + si / sp).reshape(1, -1).astype(dt), x.device)
    fx = A.as_tensor(fn, "inp", (bj + sj / sp).reshape(1, -1).astype(dt), x.device)
    sy = _B["add"](top, _B["mul"](fy, _B["truediv"](rh, ph_n)))                      # [R, P]
    sx = _B["add"](left, _B["mul"](fx, _B["truediv"](rw, pw_n)))
    if not no_trans:
        t = _dispatch.astype(trans, dt).reshape(r, 2, ph_n * pw_n)
        rep = A.as_tensor(fn, "trans", np.repeat(np.arange(ph_n * pw_n), sp * sp).astype(np.int32),
                          x.device)
        tx = _index.getitem(t[:, 0], (slice(None), rep))
        ty = _index.getitem(t[:, 1], (slice(None), rep))
        sx = _B["add"](sx, _B["mul"](_B["mul"](tx, std), rw))
        sy = _B["add"](sy, _B["mul"](_B["mul"](ty, std), rh))
    valid = _B["logical_and"](
        _B["logical_and"](_B["ge"](sx, -0.5), _B["le"](sx, w - 0.5)),
        _B["logical_and"](_B["ge"](sy, -0.5), _B["le"](sy, h - 0.5)))
    sx, sy = _T["clip"](sx, 0.0, w - 1.0), _T["clip"](sy, 0.0, h - 1.0)
    idx = _dispatch.astype(b[:, 0], "int32")
    try:
        imgs = _index.getitem(xs, idx)                                               # [R, C, H, W]
    except IndexError:
        raise IndexError(f"{fn}: rois[:, 0] holds a batch index outside 0..{n - 1}") from None
    v = _sample(imgs, sx, sy, "replicate", 0.0)                                      # [R, C, P]
    keep = _dispatch.astype(valid, dt).reshape(r, 1, ph_n * pw_n, sp * sp)
    v = _B["mul"](v.reshape(r, c, ph_n * pw_n, sp * sp), keep)
    total = _reduce.sum(v, -1, False)
    count = _reduce.sum(keep, -1, False)
    out = _T["where"](_B["eq"](count, 0), 0.0, _B["truediv"](total, _B["maximum"](count, 1.0)))
    return _dispatch.astype(out.reshape(r, c, ph_n, pw_n), x.dtype)
