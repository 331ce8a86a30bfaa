"""Fused layers: a layer and the activation after it in one kernel call,
and attention in one.

What :func:`mgtrace.traced_module.optimize` puts in a graph in place of a
convolution or linear layer followed by an activation (its ``FuseConvAct``
and ``FuseLinearAct`` passes), and usable directly. Each gives the same
values as the unfused sequence (the activations are elementwise and use the
same kernels as :mod:`mgtrace.functional.nn`'s); the gain is one pass over
the output less, made while the output is still in cache.

Activations (``act``): ``"none"``, ``"relu"``, ``"relu6"``, ``"silu"``,
``"hardswish"``, ``"sigmoid"``, ``"gelu"`` (exact erf GELU).
"""
from mgtrace._core import linalg as _linalg
from mgtrace._core import nn as _nn
from mgtrace._core import args as A
from mgtrace.functional import nn as _fnn

__all__ = ["conv2d_act", "linear_act", "attention", "ACTIVATIONS"]

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
    x, weight, bias, residual = A.tensors(fn, x=x, weight=weight, bias=bias, residual=residual)
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


def _epilogue_residual(x, weight, stride, padding, dilation, residual):
    """Whether the kernel's epilogue can add ``residual``: a float tensor of
    the conv's output shape (else the caller adds it as ``+`` does)."""
    if residual.dtype.kind != "f":
        return False
    out = [x.shape[0], weight.shape[0]]
    for i in range(2):
        span = dilation[i] * (weight.shape[2 + i] - 1) + 1
        out.append((x.shape[2 + i] + 2 * padding[i] - span) // stride[i] + 1)
    return tuple(residual.shape) == tuple(out)


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
    x, weight, bias = A.tensors(fn, x=x, weight=weight, bias=bias)
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


def attention(q, k, v, mask=None, scale=1.0):
    """``softmax(q @ k^T * scale + mask, axis=-1) @ v`` in one kernel call:
    per (batch, head) pair, with the scores kept in cache and the pairs
    shared over the threads (what ``optimize()``'s FuseAttention puts in
    place of that sequence).

    Args:
        q: float [B, H, Sq, D]; k: [B, H, Sk, D]; v: [B, H, Sk, Dv].
        mask: None, or a float tensor broadcastable to [B, H, Sq, Sk],
            added to the scaled scores (e.g. a large negative number on
            padded keys).
        scale: a float multiplying ``q @ k^T`` (often 1 / sqrt(D)).

    Returns:
        [B, H, Sq, Dv], the promoted float dtype; equal to the sequence
        ``F.softmax(F.matmul(q, k, transpose_b=True) * scale + mask, -1) @ v``
        (float32 takes the fused kernel, other dtypes run that sequence).

    Raises:
        ValueError: q, k, v not 4-d or of shapes that do not fit; a mask
            that does not broadcast to the scores.
        TypeError: integer or bool tensors; scale not a number.

    >>> import numpy as np, mgtrace as mt, mgtrace.functional as F
    >>> q = mt.tensor(np.ones((1, 1, 2, 2), np.float32))
    >>> F.attention(q, q, q * 3, scale=0.5).tolist()
    [[[[3.0, 3.0], [3.0, 3.0]]]]
    """
    fn = "attention"
    q, k, v, mask = A.tensors(fn, q=q, k=k, v=v, mask=mask)
    for name, t in (("q", q), ("k", k), ("v", v), ("mask", mask)):
        if t is not None:
            A.check_float(fn, name, t)
    return _nn.attention(q, k, v, mask, A.to_float(fn, "scale", scale))


_ACT_FUNCTIONS = {"none": lambda y: y, "relu": _fnn.relu, "relu6": _fnn.relu6,
                  "silu": _fnn.silu, "hardswish": _fnn.hardswish, "sigmoid": _fnn.sigmoid,
                  "gelu": _fnn.gelu}


def _apply_act(y, act):
    return _ACT_FUNCTIONS[act](y)
