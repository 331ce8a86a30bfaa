"""Fused layers: a layer and the activation after it in one kernel call,
and attention in one; convolutions in the NCHW16c layout.

What :func:`mgtrace.traced_module.optimize` puts in a graph in place of a
convolution or linear layer followed by an activation (its ``FuseConvAct``
and ``FuseLinearAct`` passes), and usable directly. Each gives the same
values as the unfused sequence (the activations are elementwise and use the
same kernels as :mod:`mgtrace.functional.nn`'s); the gain is one pass over
the output less, made while the output is still in cache.

Activations (``act``): ``"none"``, ``"relu"``, ``"relu6"``, ``"silu"``,
``"hardswish"``, ``"sigmoid"``, ``"gelu"`` (exact erf GELU).

Dtypes: each function gives what its unfused sequence gives, promotion
included (MegEngine's rules, as :mod:`mgtrace.functional.nn`'s). Operands
a kernel does not take (the NCHW16c kernels take float32 CPU tensors only,
attention's integer ones) run that sequence instead, with its results and
errors: a float64 input to an optimized graph computes in float64, as
the eager model and the traced graph do, and an integer one raises the
conv's own TypeError.
"""
import numpy as np

from mgtrace._core import Tensor
from mgtrace._core import linalg as _linalg
from mgtrace._core import nn as _nn
from mgtrace._core import args as A
from mgtrace.functional import nn as _fnn

__all__ = ["conv2d_act", "linear_act", "linear_add_layer_norm", "attention", "conv2d_nchwc", "conv2d_nchwc_pw_dw", "conv2d_nchwc_pw_dw_pw",
           "max_pool2d_nchwc", "to_nchwc", "from_nchwc", "ACTIVATIONS"]

ACTIVATIONS = tuple(_nn.ACTIVATIONS)
"""The activation names ``act`` takes, in the kernels' order."""


def _act(fn, act):
    if not isinstance(act, str) or act not in _nn.ACTIVATIONS:
        raise ValueError(f"{fn}: act must be one of {', '.join(map(repr, ACTIVATIONS))}, "
                         f"got {act!r}")
    return act


def conv2d_act(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1, act="relu",
               residual=None):
    """``act(conv2d(x, weight, bias, stride, padding, dilation, groups) +
    residual)`` in one kernel call: the addition and the activation run in
    the convolution's epilogue.

    Args:
        x: float [N, C, H, W].
        weight: float [O, C/groups, KH, KW].
        bias: float [O] or [1, O, 1, 1], or None.
        stride, padding, dilation, groups: as :func:`mgtrace.functional.conv2d`.
        act: one of :data:`ACTIVATIONS`.
        residual: None, or a tensor that adds to the output as ``+`` does
            (a residual block's shortcut): one of the output's shape [N, O,
            OH, OW] and a float dtype is added in the kernel's epilogue;
            any other (broadcast, an integer dtype) after the kernel, with
            ``+``'s broadcasting and promotion. (A graph that
            ``optimize`` fused traced the add with a residual of the
            output's shape; called on other inputs it must still compute
            what the add did.)

    Returns:
        The promoted float dtype, equal to the conv2d, the addition and
        the activation function one after the other: [N, O, OH, OW], or the
        broadcast shape of the output and the residual.

    Raises:
        ValueError: an unknown ``act``, a residual that does not broadcast
            to the output; otherwise as :func:`mgtrace.functional.conv2d`.
        TypeError: as :func:`mgtrace.functional.conv2d`.

    >>> import numpy as np, mgtrace as mt, mgtrace.functional as F
    >>> x = mt.tensor(np.full((1, 1, 2, 2), -1.0, np.float32))
    >>> w = mt.tensor(np.ones((1, 1, 1, 1), np.float32))
    >>> F.conv2d_act(x, w, act="relu").tolist()
    [[[[0.0, 0.0], [0.0, 0.0]]]]
    """
    fn = "conv2d_act"
    _act(fn, act)
    x, weight, bias, residual = A.tensors(fn, optional=('bias', 'residual'),
        x=x, weight=weight, bias=bias, residual=residual)
    A.check_ndim(fn, "x", x, 4, "[N, C, H, W]")
    A.check_ndim(fn, "weight", weight, 4, "[O, C/groups, KH, KW]")
    for name, t in (("x", x), ("weight", weight), ("bias", bias)):
        if t is not None:
            A.check_float(fn, name, t)
    g = A.to_int(fn, "groups", groups, 1)
    bias = _fnn._conv_bias(fn, bias, weight.shape[0])
    st, pd = A.pair(fn, "stride", stride, 1), A.pair(fn, "padding", padding, 0)
    dl = A.pair(fn, "dilation", dilation, 1)
    if residual is not None and not _epilogue_residual(x, weight, st, pd, dl, residual):
        y = _nn.conv2d_act(x, weight, bias, None, st, pd, dl, g, "none") + residual
        return y if act == "none" else getattr(_fnn, act)(y)
    return _nn.conv2d_act(x, weight, bias, residual, st, pd, dl, g, act)


def conv2d_nchwc(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1, act="none",
                 residual=None):
    """:func:`conv2d_act` with the output in the NCHW16c layout: channels in
    blocks of 16, ``y[n, o // 16, h, w, o % 16]``, the layout
    ``optimize()``'s NCHWc pass runs chains of convolutions in (as ONNX
    Runtime's NCHWc transformer does on x86): the kernels then read and
    write whole vectors of 16 channels, with no im2col, GEMM packing or
    transposition.

    Args:
        x: float32 [N, ceil(C/16), H, W, 16] (NCHW16c: :func:`to_nchwc`'s
            or another conv2d_nchwc's output), or float32 [N, C, H, W]
            for a dense conv (a first layer: blocking 3 channels would pad
            them to 16).
        weight: float32 [O, C/groups, KH, KW], as :func:`conv2d`'s.
        bias: float32 [O] or [1, O, 1, 1] (MegEngine's), or None.
        stride, padding, dilation: as :func:`conv2d`.
        groups: 1, or C for a depthwise conv (C = O, weight [C, 1, KH,
            KW]; x NCHW16c).
        act: one of :data:`ACTIVATIONS`.
        residual: None, or float32 NCHW16c of the output's shape, added
            before the activation in the kernel; one that broadcasts to it
            is added after the kernel, as ``+`` does (the result's dtype,
            and its channels past O, are then what ``+`` and act give).

    Returns:
        [N, ceil(O/16), OH, OW, 16], float32 from float32 operands, else
        conv2d's promotion; :func:`from_nchwc` (y, O) equals
        ``conv2d_act`` on the NCHW tensors. The channels past O hold act(0).

    Raises:
        TypeError: as :func:`conv2d_act` (an integer x). Operands that are
            not all float32 CPU tensors run ``to_nchwc(conv2d_act(...))``
            on the NCHW views of x and the residual: conv2d's promoted
            dtype (float64 in, float64 out), on any device.
        ValueError: shapes that do not fit, other groups, an unknown act;
            otherwise as :func:`mgtrace.functional.conv2d`.

    >>> import numpy as np, mgtrace as mt, mgtrace.functional as F
    >>> x = F.to_nchwc(mt.tensor(np.ones((1, 2, 2, 2), np.float32)))
    >>> y = F.conv2d_nchwc(x, mt.tensor(np.ones((1, 2, 1, 1), np.float32)), act="relu")
    >>> y.shape, F.from_nchwc(y, 1).tolist()
    ((1, 1, 2, 2, 16), [[[[2.0, 2.0], [2.0, 2.0]]]])
    """
    fn = "conv2d_nchwc"
    if _plain_tensors(x, weight, bias) and (residual is None or isinstance(residual, Tensor)):
        # what an optimized graph passes, some 50 calls a MobileNetV2 forward:
        # the kernel checks the rest (dtypes, devices, act, the residual's
        # shape and dtype) with F's messages; a residual the kernel does not
        # take (one that only broadcasts, or another dtype) goes the general
        # way below, which adds it with +, and so do operands of a dtype or
        # device the kernel does not take (asked only once it refused them)
        try:
            return _nn.conv2d_nchwc(x, weight, bias, residual, stride, padding, dilation, groups, act)
        except (ValueError, TypeError):
            if residual is None and _kernel_takes(x, weight, bias):
                raise
    _act(fn, act)
    x, weight, bias, residual = A.tensors(fn, optional=('bias', 'residual'),
        x=x, weight=weight, bias=bias, residual=residual)
    A.check_ndim(fn, "x", x, (4, 5), "[N, ceil(C/16), H, W, 16] or [N, C, H, W]")
    A.check_ndim(fn, "weight", weight, 4, "[O, C/groups, KH, KW]")
    if not _kernel_takes(x, weight, bias, residual):
        return _conv2d_nchwc_unfused(x, weight, bias, stride, padding, dilation, groups, act, residual)
    bias = _fnn._conv_bias(fn, bias, weight.shape[0])
    if residual is not None and x.ndim in (4, 5) and \
            tuple(residual.shape) != _nchwc_out_shape(x, weight, stride, padding, dilation):
        # as conv2d_act: a residual that only broadcasts (a graph traced at
        # batch 1, now run at batch 8) is added after the kernel, with +
        y = _nn.conv2d_nchwc(x, weight, bias, None, stride, padding, dilation, groups, "none")
        try:
            np.broadcast_shapes(tuple(residual.shape), tuple(y.shape))
        except ValueError:
            raise ValueError(f"{fn}: residual of shape {tuple(residual.shape)} does not broadcast to the "
                             f"NCHW16c output's shape {tuple(y.shape)}") from None
        return _apply_act(y + residual, act)
    return _nn.conv2d_nchwc(x, weight, bias, residual, stride, padding, dilation, groups, act)


def _plain_tensors(x, weight, bias):
    """Whether the operands need no conversion: Tensors, a bias of [O] or
    none (the kernels check dtypes, devices and shapes themselves)."""
    return isinstance(x, Tensor) and isinstance(weight, Tensor) and \
        (bias is None or (isinstance(bias, Tensor) and bias.ndim == 1))


def _nchwc_out_shape(x, weight, stride, padding, dilation):
    """conv2d_nchwc's output shape for well-formed arguments (the kernel
    checks them)."""
    fn = "conv2d_nchwc"
    oh, ow = _out_hw(fn, x, weight, A.pair(fn, "stride", stride, 1), A.pair(fn, "padding", padding, 0),
                     A.pair(fn, "dilation", dilation, 1))
    return (x.shape[0], -(-weight.shape[0] // 16), oh, ow, 16)


def _out_hw(fn, x, weight, stride, padding, dilation):
    """A conv2d's output height and width, from (h, w) pairs of its
    stride, padding and dilation (the kernels' rule, window_output_size:
    ValueError naming ``fn`` when the kernel is larger than the padded
    input)."""
    return _fnn._windows_out(fn, tuple(x.shape[2:4]), tuple(weight.shape[2:4]), padding, stride, dilation)


def conv2d_nchwc_pw_dw(x, weight, bias, dw_weight, dw_bias, stride=1, padding=0, act="none",
                       dw_act="none"):
    """A pointwise conv and the depthwise conv that reads its output, in one
    kernel call on NCHW16c tensors: ``conv2d_nchwc(conv2d_nchwc(x, weight,
    bias, act=act), dw_weight, dw_bias, stride, padding, groups=E,
    act=dw_act)``, without the E-channel tensor between them (what
    ``optimize()``'s FusePointwiseDepthwise pass puts in place of
    MobileNet's expansion and depthwise layers: each thread keeps the few
    pointwise rows the depthwise taps read in a small buffer, instead of
    writing and reading back a tensor larger than the L2 cache).

    Args:
        x: float32 [N, ceil(C/16), H, W, 16] (NCHW16c).
        weight: float32 [E, C, 1, 1], the pointwise conv's.
        bias: float32 [E] or [1, E, 1, 1], or None.
        dw_weight: float32 [E, 1, KH, KW], the depthwise conv's.
        dw_bias: float32 [E] or [1, E, 1, 1], or None.
        stride, padding: the depthwise conv's, as :func:`conv2d`
            (dilation 1; the pointwise conv has stride 1 and no padding).
        act, dw_act: the two convs' activations, each one of
            :data:`ACTIVATIONS`.

    Returns:
        [N, ceil(E/16), OH, OW, 16], OH = (H + 2 * ph - KH) // sh
        + 1 (OW alike), equal to the two :func:`conv2d_nchwc` calls; the
        channels past E hold dw_act(0).

    Raises:
        TypeError: as :func:`conv2d_nchwc`; operands that are not all
            float32 CPU tensors run the two conv2d_nchwc calls (their dtype).
        ValueError: shapes that do not fit, an unknown act.

    >>> import numpy as np, mgtrace as mt, mgtrace.functional as F
    >>> x = F.to_nchwc(mt.tensor(np.ones((1, 2, 3, 3), np.float32)))
    >>> y = F.conv2d_nchwc_pw_dw(x, mt.tensor(np.ones((1, 2, 1, 1), np.float32)), None,
    ...                          mt.tensor(np.ones((1, 1, 3, 3), np.float32)), None, padding=1)
    >>> F.from_nchwc(y, 1)[0, 0].tolist()
    [[8.0, 12.0, 8.0], [12.0, 18.0, 12.0], [8.0, 12.0, 8.0]]
    """
    fn = "conv2d_nchwc_pw_dw"
    if _plain_tensors(x, weight, bias) and _plain_tensors(x, dw_weight, dw_bias):
        try:
            return _nn.conv2d_nchwc_pw_dw(x, weight, bias, dw_weight, dw_bias, stride, padding, act, dw_act)
        except TypeError:
            if _kernel_takes(x, weight, bias, dw_weight, dw_bias):
                raise
    x, weight, bias, dw_weight, dw_bias = A.tensors(fn, optional=('bias', 'dw_bias'), x=x, weight=weight,
                                                    bias=bias, dw_weight=dw_weight, dw_bias=dw_bias)
    if not _kernel_takes(x, weight, bias, dw_weight, dw_bias):
        A.check_ndim(fn, "weight", weight, 4, "[E, C, 1, 1]")
        y = conv2d_nchwc(x, weight, bias, act=act)
        return conv2d_nchwc(y, dw_weight, dw_bias, stride, padding, groups=weight.shape[0], act=dw_act)
    A.check_ndim(fn, "weight", weight, 4, "[E, C, 1, 1]")
    A.check_ndim(fn, "dw_weight", dw_weight, 4, "[E, 1, KH, KW]")
    bias = _fnn._conv_bias(fn, bias, weight.shape[0])
    dw_bias = _fnn._conv_bias(fn, dw_bias, weight.shape[0], "dw_bias")
    return _nn.conv2d_nchwc_pw_dw(x, weight, bias, dw_weight, dw_bias, stride, padding, act, dw_act)


def conv2d_nchwc_pw_dw_pw(x, weight, bias, dw_weight, dw_bias, proj_weight, proj_bias, stride=1, padding=0,
                          act="none", dw_act="none", proj_act="none", residual=None):
    """An inverted-residual block (MobileNetV2's: expansion, depthwise and
    projection convs) in one kernel call on NCHW16c tensors:
    ``conv2d_nchwc(conv2d_nchwc_pw_dw(x, weight, bias, dw_weight, dw_bias,
    stride, padding, act, dw_act), proj_weight, proj_bias,
    residual=residual, act=proj_act)``, with one output tensor and one
    parallel region where those two calls have two of each (what
    ``optimize()``'s FusePointwiseDepthwise pass makes of a
    conv2d_nchwc_pw_dw whose output only a 1x1 conv reads: MobileNetV2
    batch 1, 16 calls fewer a forward).

    Args:
        x: float32 [N, ceil(C/16), H, W, 16] (NCHW16c).
        weight: float32 [E, C, 1, 1], the expansion conv's.
        bias: float32 [E] or [1, E, 1, 1], or None.
        dw_weight: float32 [E, 1, KH, KW], the depthwise conv's.
        dw_bias: float32 [E] or [1, E, 1, 1], or None.
        proj_weight: float32 [O, E, 1, 1], the projection conv's.
        proj_bias: float32 [O] or [1, O, 1, 1], or None.
        stride, padding: the depthwise conv's, as :func:`conv2d`
            (dilation 1; the 1x1 convs have stride 1 and no padding).
        act, dw_act, proj_act: the three convs' activations, each one of
            :data:`ACTIVATIONS`.
        residual: None, or float32 NCHW16c of the output's shape, added
            before proj_act in the kernel; one that broadcasts to it is
            added after the kernel, as ``+`` does.

    Returns:
        [N, ceil(O/16), OH, OW, 16], OH = (H + 2 * ph - KH) // sh
        + 1 (OW alike), equal to the two calls above; the channels past O
        hold proj_act(0).

    Raises:
        TypeError: as :func:`conv2d_nchwc`; operands that are not all
            float32 CPU tensors run the two calls above (their dtype).
        ValueError: shapes that do not fit, an unknown act, a residual
            that does not broadcast to the output.

    >>> import numpy as np, mgtrace as mt, mgtrace.functional as F
    >>> one = lambda *s: mt.tensor(np.ones(s, np.float32))
    >>> x = F.to_nchwc(one(1, 2, 3, 3))
    >>> y = F.conv2d_nchwc_pw_dw_pw(x, one(1, 2, 1, 1), None, one(1, 1, 3, 3), None, one(1, 1, 1, 1), None,
    ...                             residual=F.to_nchwc(one(1, 1, 3, 3)), padding=1)
    >>> F.from_nchwc(y, 1)[0, 0].tolist()
    [[9.0, 13.0, 9.0], [13.0, 19.0, 13.0], [9.0, 13.0, 9.0]]
    """
    fn = "conv2d_nchwc_pw_dw_pw"
    if not (_plain_tensors(x, weight, bias) and _plain_tensors(x, dw_weight, dw_bias)
            and _plain_tensors(x, proj_weight, proj_bias) and (residual is None or isinstance(residual, Tensor))):
        x, weight, bias, dw_weight, dw_bias, proj_weight, proj_bias, residual = A.tensors(
            fn, optional=('bias', 'dw_bias', 'proj_bias', 'residual'),
            x=x, weight=weight, bias=bias, dw_weight=dw_weight, dw_bias=dw_bias,
            proj_weight=proj_weight, proj_bias=proj_bias, residual=residual)
        A.check_ndim(fn, "weight", weight, 4, "[E, C, 1, 1]")
        A.check_ndim(fn, "dw_weight", dw_weight, 4, "[E, 1, KH, KW]")
        A.check_ndim(fn, "proj_weight", proj_weight, 4, "[O, E, 1, 1]")
        bias = _fnn._conv_bias(fn, bias, weight.shape[0])
        dw_bias = _fnn._conv_bias(fn, dw_bias, weight.shape[0], "dw_bias")
        proj_bias = _fnn._conv_bias(fn, proj_bias, proj_weight.shape[0], "proj_bias")
    try:
        return _nn.conv2d_nchwc_pw_dw_pw(x, weight, bias, dw_weight, dw_bias, proj_weight, proj_bias, residual,
                                         stride, padding, act, dw_act, proj_act)
    except (ValueError, TypeError) as e:
        if not _kernel_takes(x, weight, bias, dw_weight, dw_bias, proj_weight, proj_bias, residual):
            # a dtype or device the kernel does not take: the two calls it stands for
            y = conv2d_nchwc_pw_dw(x, weight, bias, dw_weight, dw_bias, stride, padding, act, dw_act)
            return conv2d_nchwc(y, proj_weight, proj_bias, residual=residual, act=proj_act)
        if residual is None:
            raise
        refused = e
    # a residual of another shape, that only broadcasts (a graph traced at
    # batch 1 run at batch 8), is added with +, as conv2d_nchwc does; the
    # other arguments' errors raise here, and so does the kernel's refusal
    # of a residual of the output's shape (another dtype, a device)
    _act(fn, proj_act)
    y = _nn.conv2d_nchwc_pw_dw_pw(x, weight, bias, dw_weight, dw_bias, proj_weight, proj_bias, None, stride,
                                  padding, act, dw_act, "none")
    if tuple(residual.shape) == tuple(y.shape):
        raise refused
    try:
        np.broadcast_shapes(tuple(residual.shape), tuple(y.shape))
    except ValueError:
        raise ValueError(f"{fn}: residual of shape {tuple(residual.shape)} does not broadcast to the "
                         f"NCHW16c output's shape {tuple(y.shape)}") from None
    return _apply_act(y + residual, proj_act)


def max_pool2d_nchwc(x, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False):
    """:func:`mgtrace.functional.max_pool2d` on an NCHW16c tensor, the result
    NCHW16c (what the NCHWc pass puts after a converted conv: ResNet's stem
    and its pool stay blocked).

    Args:
        x: float32 [N, B, H, W, 16].
        kernel_size, stride, padding, dilation, ceil_mode: as
            :func:`mgtrace.functional.max_pool2d` (PyTorch's semantics:
            padded positions never win, a NaN in a window does).

    Returns:
        [N, B, OH, OW, 16], x's dtype.

    Raises:
        TypeError: as max_pool2d (an integer x). Another float dtype or
            device runs max_pool2d on the NCHW view (x's dtype).
        ValueError: x not [N, B, H, W, 16]; bad geometry, as max_pool2d.

    >>> import numpy as np, mgtrace as mt, mgtrace.functional as F
    >>> x = F.to_nchwc(mt.tensor(np.arange(4, dtype=np.float32).reshape(1, 1, 2, 2)))
    >>> F.from_nchwc(F.max_pool2d_nchwc(x, 2), 1).tolist()
    [[[[3.0]]]]
    """
    fn = "max_pool2d_nchwc"
    (x,) = A.tensors(fn, x=x)
    k, s = _fnn._pool_window(fn, kernel_size, stride)       # as max_pool2d: stride=() is an error
    p, d = A.pair(fn, "padding", padding, 0), A.pair(fn, "dilation", dilation, 1)
    if not _kernel_takes(x):
        _check_blocked(fn, x)
        y = _fnn.max_pool2d(_from_blocks(x, x.shape[1] * 16), k, s, p, d, bool(ceil_mode))
        return _to_blocks(y)
    return _nn.max_pool2d_nchwc(x, k, s, p, d, bool(ceil_mode))


def to_nchwc(x):
    """float32 NCHW [N, C, H, W] to NCHW16c [N, ceil(C/16), H, W, 16]:
    ``y[n, c // 16, h, w, c % 16] = x[n, c, h, w]``, zeros for the
    channels past C.

    Raises:
        ValueError: x not 4-D. A dtype or device the kernel does not take
        (it takes float32 CPU tensors) is blocked by a pad and views, in x's
        dtype; a quantized dtype is kept, the channels past C holding its
        zero point (a real 0).

    >>> import numpy as np, mgtrace as mt, mgtrace.functional as F
    >>> F.to_nchwc(mt.tensor(np.ones((2, 20, 3, 3), np.float32))).shape
    (2, 2, 3, 3, 16)
    """
    (x,) = A.tensors("to_nchwc", x=x)
    if not _kernel_takes(x):
        A.check_ndim("to_nchwc", "x", x, 4, "[N, C, H, W]")
        return _to_blocks(x)
    return _nn.to_nchwc(x)


def from_nchwc(x, channels):
    """float32 NCHW16c [N, B, H, W, 16] to NCHW [N, channels, H, W], the
    inverse of :func:`to_nchwc` (the channels past ``channels`` dropped).

    Raises:
        ValueError: x not [N, B, H, W, 16]; channels not in
            (16 * (B - 1), 16 * B]. (Any dtype and device: float32 CPU
            tensors take the kernel, others views, in x's dtype, a
            quantized one included.)

    >>> import numpy as np, mgtrace as mt, mgtrace.functional as F
    >>> x = mt.tensor(np.arange(3, dtype=np.float32).reshape(1, 3, 1, 1))
    >>> F.from_nchwc(F.to_nchwc(x), 3).tolist()
    [[[[0.0]], [[1.0]], [[2.0]]]]
    """
    (x,) = A.tensors("from_nchwc", x=x)
    if not _kernel_takes(x):
        return _from_blocks(x, _blocked_channels("from_nchwc", x, channels))
    return _nn.from_nchwc(x, channels)


def _epilogue_residual(x, weight, stride, padding, dilation, residual):
    """Whether the kernel's epilogue can add ``residual``: a float tensor of
    the conv's output shape (else the caller adds it as ``+`` does)."""
    if residual.dtype.kind != "f":
        return False
    out = (x.shape[0], weight.shape[0]) + _out_hw("conv2d_act", x, weight, stride, padding, dilation)
    return tuple(residual.shape) == out


def linear_act(x, weight, bias=None, act="relu"):
    """``act(linear(x, weight, bias))``: one GEMM, then the bias and the
    activation in a single pass over its fresh output.

    Args:
        x: float [..., in_features] (float32 or float64 take the fused
            path; other dtypes run linear and the activation one after the
            other).
        weight: [out_features, in_features].
        bias: [out_features] or None.
        act: one of :data:`ACTIVATIONS`.

    Returns:
        [..., out_features], equal to ``F.linear`` followed by the activation.

    Raises:
        ValueError: an unknown ``act``; otherwise as
            :func:`mgtrace.functional.linear`.

    >>> import mgtrace as mt, mgtrace.functional as F
    >>> F.linear_act(mt.tensor([[1.0, -2.0]]), mt.tensor([[1.0, 1.0], [0.0, 1.0]]),
    ...              act="relu").tolist()
    [[0.0, 0.0]]
    """
    fn = "linear_act"
    _act(fn, act)
    x, weight, bias = A.tensors(fn, optional=('bias',), x=x, weight=weight, bias=bias)
    A.check_ndim(fn, "weight", weight, 2, "[out_features, in_features]")
    dt = x.dtype.name
    if x.ndim == 0 or dt not in ("float32", "float64") or weight.dtype.name != dt or \
            (bias is not None and bias.dtype.name != dt) or x.device.type != "cpu":
        return _apply_act(_fnn.linear(x, weight, bias), act)
    if x.shape[-1] != weight.shape[1]:
        raise ValueError(f"{fn}: x has {x.shape[-1]} features but weight expects "
                         f"{weight.shape[1]} (x shape {x.shape}, weight shape {weight.shape})")
    if bias is not None and bias.shape != (weight.shape[0],):
        raise ValueError(f"{fn}: bias must have shape ({weight.shape[0]},), got {bias.shape}")
    y = _linalg.matmul(x, weight.transpose(1, 0))
    return _nn.bias_act_(y, bias, act)


def linear_add_layer_norm(x, weight, bias, residual, ln_weight=None, ln_bias=None, eps=1e-5):
    """``layer_norm(linear(x, weight, bias) + residual)`` over the last axis:
    one GEMM, then the bias, the residual add and the layer norm in one pass
    over each output row while it is in cache (a post-LayerNorm transformer
    block's tail, BERT's ``LayerNorm(dense(h) + input)``; what
    ``optimize()``'s FuseLinearAddNorm puts in place of that sequence).

    Args:
        x: float [..., in_features].
        weight: [out_features, in_features]; bias: [out_features] or None.
        residual: a tensor added to the linear layer's output as ``+`` does
            (broadcasting and promotion included).
        ln_weight, ln_bias: [out_features] or None (LayerNorm's affine).
        eps: added to the variance.

    Returns:
        [..., out_features] (the broadcast shape of the linear output and
        the residual), the promoted float dtype. Float32 and float64 CPU
        operands of one dtype, with a residual of the linear output's shape,
        take the fused kernel, whose additions are those of ``F.linear``
        and ``+`` in the same order and whose layer norm is
        ``F.layer_norm``'s: the result equals the unfused sequence bit for
        bit. Others run that sequence.

    Raises:
        ValueError: shapes that do not fit (as :func:`mgtrace.functional.linear`,
            ``+`` and :func:`mgtrace.functional.layer_norm` raise).
        TypeError: an integer x (as ``F.layer_norm``).

    >>> import mgtrace as mt, mgtrace.functional as F
    >>> y = F.linear_add_layer_norm(mt.tensor([[1.0, 0.0]]), mt.tensor([[1.0, 0.0], [0.0, 1.0]]),
    ...                             mt.tensor([0.0, 1.0]), mt.tensor([[0.0, 2.0]]))
    >>> [round(v, 3) for v in y.tolist()[0]]
    [-1.0, 1.0]
    """
    fn = "linear_add_layer_norm"
    x, weight, bias, residual, ln_weight, ln_bias = A.tensors(
        fn, optional=('bias', 'ln_weight', 'ln_bias'), x=x, weight=weight, bias=bias, residual=residual,
        ln_weight=ln_weight, ln_bias=ln_bias)
    A.check_ndim(fn, "weight", weight, 2, "[out_features, in_features]")
    eps = A.to_float(fn, "eps", eps)
    dt = x.dtype.name
    ops = (x, weight, bias, residual, ln_weight, ln_bias)
    out_shape = tuple(x.shape[:-1]) + (weight.shape[0],) if x.ndim else None
    if x.ndim == 0 or dt not in ("float32", "float64") or x.device.type != "cpu" or \
            any(t is not None and (t.dtype.name != dt or t.device != x.device) for t in ops) or \
            tuple(residual.shape) != out_shape or x.shape[-1] != weight.shape[1] or \
            any(t is not None and tuple(t.shape) != (weight.shape[0],) for t in (bias, ln_weight, ln_bias)):
        return _linear_add_layer_norm_unfused(x, weight, bias, residual, ln_weight, ln_bias, eps)
    h = _linalg.matmul(x, weight.transpose(1, 0))
    return _nn.add_layer_norm_rows(h, bias, residual, ln_weight, ln_bias, eps, into_x=True)


def _linear_add_layer_norm_unfused(x, weight, bias, residual, ln_weight, ln_bias, eps):
    """linear_add_layer_norm's sequence, one call after the other (its
    reference, its autodiff record and its path for other operands)."""
    s = _fnn.linear(x, weight, bias) + residual
    return _fnn.layer_norm(s, s.shape[-1] if s.ndim else (), ln_weight, ln_bias, eps)


def _attention_scale(scale):
    """:func:`attention`'s ``scale`` as a Python float (its checks and
    errors; also what the autodiff rule reads)."""
    return A.to_float_scalar("attention", "scale", scale, finite=True)


def attention(q, k, v, mask=None, scale=1.0):
    """``softmax(q @ k^T * scale + mask, axis=-1) @ v`` in one kernel call:
    per (batch, head) pair, with the scores kept in cache and the pairs
    shared over the threads (what ``optimize()``'s FuseAttention puts in
    place of that sequence).

    Args:
        q: float [B, H, Sq, D]; k: [B, H, Sk, D]; v: [B, H, Sk, Dv].
        mask: None, or a float tensor broadcastable to [B, H, Sq, Sk],
            added to the scaled scores (e.g. a large negative number on
            padded keys). With a mask the same for every query ([B, 1, 1,
            Sk] or [B, H, 1, Sk]), the float32 kernel leaves out the keys
            at the end of a row whose mask lies 2^100 or more below the
            row's largest (a padding mask of ``finfo(float32).min`` or
            -inf), when their probabilities are exactly 0 and leaving
            them out changes no bit of the result (scores below 2^96,
            their v finite; else it computes every key): padded tokens
            then cost nothing.
        scale: a finite real number multiplying ``q @ k^T`` (often
            1 / sqrt(D)): a Python int or float, a NumPy scalar, or a 0-d
            NumPy array or 0-d Tensor (read once per call, as a Python
            float: a traced graph reads a Tensor scale afresh on each call;
            ``mgtrace.compile`` refuses one, as it does any value read into
            Python; give a plan a number).

    Returns:
        [B, H, Sq, Dv], the promoted float dtype; equal to the sequence
        ``F.softmax(F.matmul(q, k, transpose_b=True) * scale + mask, -1) @ v``
        (float32 takes the fused kernel, other dtypes run that sequence).
        The fused kernel's result is a view of [B, Sq, H, Dv] memory (the
        heads inner), so ``F.transpose(out, (0, 2, 1, 3))`` reshaped to
        [B, Sq, H * Dv], a transformer's merge of the heads, copies nothing.

    Raises:
        ValueError: q, k, v not 4-d or of shapes that do not fit; a mask
            that does not broadcast to the scores.
        ValueError: scale inf or nan, or an array or Tensor that is not
            0-d.
        TypeError: scale not a real number (a bool, a str, a 0-d array of
            bool or complex dtype). Integer or bool operands run the
            sequence (its promotion: softmax gives float32; its errors).

    >>> import numpy as np, mgtrace as mt, mgtrace.functional as F
    >>> q = mt.tensor(np.ones((1, 1, 2, 2), np.float32))
    >>> F.attention(q, q, q * 3, scale=0.5).tolist()
    [[[[3.0, 3.0], [3.0, 3.0]]]]
    """
    fn = "attention"
    q, k, v, mask = A.tensors(fn, optional=('mask',), q=q, k=k, v=v, mask=mask)
    scale = _attention_scale(scale)
    if any(t is not None and t.dtype.kind != "f" for t in (q, k, v, mask)):
        # an integer or bool operand: the sequence's promotion (softmax gives
        # float32) and its errors, as the unfused graph
        from mgtrace.functional.math import matmul
        s = matmul(q, k, transpose_b=True) * scale
        return matmul(_fnn.softmax(s if mask is None else s + mask, axis=-1), v)
    return _nn.attention(q, k, v, mask, scale)


_ACT_FUNCTIONS = {"none": lambda y: y, "relu": _fnn.relu, "relu6": _fnn.relu6,
                  "silu": _fnn.silu, "hardswish": _fnn.hardswish, "sigmoid": _fnn.sigmoid,
                  "gelu": _fnn.gelu}


def _apply_act(y, act):
    return _ACT_FUNCTIONS[act](y)


# ----------------------------------------- operands the kernels do not take

_FLOAT32 = np.dtype(np.float32)     # (compared, not named: dtype.name costs microseconds)


def _kernel_takes(*tensors):
    """Whether the NCHW16c kernels take these operands: float32 Tensors on
    the CPU (None for an absent one). Others run the unfused sequence."""
    for t in tensors:
        if t is not None and (not isinstance(t, Tensor) or t.dtype != _FLOAT32
                              or t.device.type != "cpu"):
            return False
    return True


def _check_blocked(fn, x):
    if x.ndim != 5 or x.shape[4] != 16:
        raise ValueError(f"{fn}: x must be NCHW16c [N, B, H, W, 16], got shape {tuple(x.shape)}")


def _blocked_channels(fn, x, channels):
    """``channels`` checked against NCHW16c ``x``'s B blocks: in (16 * (B - 1), 16 * B]."""
    _check_blocked(fn, x)
    c = A.to_int(fn, "channels", channels, 1)
    if not 16 * (x.shape[1] - 1) < c <= 16 * x.shape[1]:
        raise ValueError(f"{fn}: channels must be in ({16 * (x.shape[1] - 1)}, {16 * x.shape[1]}] for "
                         f"{x.shape[1]} blocks of 16, got {c}")
    return c


def _to_blocks(x, fill=0.0):
    """:func:`to_nchwc` by views and a pad, for any dtype and device (the
    channels past C hold ``fill``; for a tensor of a quantized dtype, the
    integers of ``fill`` in that dtype, its zero point for 0)."""
    n, c, h, w = x.shape
    b = -(-c // 16)
    if b * 16 != c and x._qdtype is not None:
        # pad computes, and refuses a quantized dtype: concatenate the fill instead
        # (concat keeps the one quantized dtype of its inputs)
        from mgtrace.functional.tensor import concat
        pad = A.as_tensor("to_nchwc", "fill", np.full((n, b * 16 - c, h, w), fill, np.float32),
                          x.device)
        x = concat([x, pad.astype(x.dtype)], 1)
    elif b * 16 != c:
        x = _fnn.pad(x, ((0, 0), (0, b * 16 - c), (0, 0), (0, 0)), constant_value=fill)
    return x.reshape(n, b, 16, h, w).transpose(0, 1, 3, 4, 2)


def _from_blocks(x, channels):
    """:func:`from_nchwc` by views, for any dtype and device."""
    n, b, h, w, _ = x.shape
    return x.transpose(0, 1, 4, 2, 3).reshape(n, b * 16, h, w)[:, :channels]


_ACT_AT_ZERO = {"sigmoid": 0.5}      # act(0) for the channels past O; 0 for the others


def _conv2d_nchwc_unfused(x, weight, bias, stride, padding, dilation, groups, act, residual):
    """conv2d_nchwc as ``to_nchwc(conv2d_act(from_nchwc(x), ...))``, for
    operands its kernel does not take: the dtype is conv2d's promotion."""
    fn = "conv2d_nchwc"
    g = A.to_int(fn, "groups", groups, 1)
    out = weight.shape[0]
    if x.ndim == 5:
        x = _from_blocks(x, _blocked_channels(fn, x, weight.shape[1] * g))
    r = residual
    if r is not None and r.ndim == 5 and r.shape[4] == 16 and r.shape[1] == -(-out // 16):
        r = _from_blocks(r, out)
    elif r is not None:           # one that broadcasts to the NCHW16c output: added as + does
        y = _to_blocks(conv2d_act(x, weight, bias, stride, padding, dilation, g, act="none"))
        return _apply_act(y + r, act)
    y = conv2d_act(x, weight, bias, stride, padding, dilation, g, act=act, residual=r)
    return _to_blocks(y, _ACT_AT_ZERO.get(act, 0.0))
