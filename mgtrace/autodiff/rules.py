"""Every op's gradient, written once (PyTorch's ``derivatives.yaml``, here a
table of small functions keyed by the op table's names,
:mod:`mgtrace._core.op_table`).

A rule ``fn(ctx, g)`` gets the recorded node (``ctx.inputs``: the op's
inputs as the rule saved them, non-tensor inputs always; ``ctx.outputs``
likewise; ``ctx.params``; ``ctx.needs(i)``; ``ctx.input_shape(i)``) and
the gradient of its output (a list, one per output, for ops with several)
and returns one gradient per input (None: none flows there). Broadcast
inputs need no care: the engine sums a gradient back to its input's shape
and casts it to its input's float dtype. Rules are composites of the
core's forward ops and run unrecorded.

``saves`` says what a rule reads at backward: ``"i"`` the inputs, ``"o"``
the outputs; nothing else is kept. Subgradients follow PyTorch's choices:
``abs`` at 0 is 0, ``relu`` at 0 is 0, ``maximum``/``minimum`` and
``max``/``min`` reductions split a tie evenly, ``clip`` passes the
gradient where ``lower <= x <= upper``.

:data:`NONDIFF` lists ops whose outputs carry no gradient (predicates,
integer results); an op in neither table is recorded and raises
:class:`~mgtrace.errors.AutodiffError` if a gradient is asked through it.
:data:`FUNCTION_RULES` covers the ``mgtrace.functional`` functions that
reach core code which is no op (``layer_norm``'s fused kernel).
"""
import math
from typing import Callable, NamedTuple

import numpy as np

from mgtrace._core import Tensor
from mgtrace import functional as F

__all__ = ["Rule", "RULES", "NONDIFF", "FUNCTION_RULES"]


class Rule(NamedTuple):
    fn: Callable
    saves_inputs: bool = False
    saves_outputs: bool = False


def _mask(cond, g):
    """``g`` where ``cond`` holds, 0 elsewhere (cond a bool tensor)."""
    return g * cond.astype(g.dtype)


# ------------------------------------------------------------- elementwise
def _x(c):
    return c.inputs[0]


def _y(c):
    return c.outputs[0]


_UNARY = {
    "neg": ("", lambda c, g: -g),
    "abs": ("i", lambda c, g: g * F.sign(_x(c))),
    "square": ("i", lambda c, g: g * 2 * _x(c)),
    "exp": ("o", lambda c, g: g * _y(c)),
    "expm1": ("o", lambda c, g: g * (_y(c) + 1)),
    "log": ("i", lambda c, g: g / _x(c)),
    "log1p": ("i", lambda c, g: g / (_x(c) + 1)),
    "log2": ("i", lambda c, g: g / (_x(c) * math.log(2.0))),
    "sqrt": ("o", lambda c, g: g / (_y(c) * 2)),
    "rsqrt": ("o", lambda c, g: g * (_y(c) ** 3) * -0.5),
    "sin": ("i", lambda c, g: g * F.cos(_x(c))),
    "cos": ("i", lambda c, g: -g * F.sin(_x(c))),
    "tan": ("o", lambda c, g: g * (_y(c) * _y(c) + 1)),
    "tanh": ("o", lambda c, g: g * (1 - _y(c) * _y(c))),
    "erf": ("i", lambda c, g: g * F.exp(-_x(c) * _x(c)) * (2 / math.sqrt(math.pi))),
    "asin": ("i", lambda c, g: g / F.sqrt(1 - _x(c) * _x(c))),
    "acos": ("i", lambda c, g: -g / F.sqrt(1 - _x(c) * _x(c))),
    "atan": ("i", lambda c, g: g / (_x(c) * _x(c) + 1)),
    "relu": ("o", lambda c, g: _mask(_y(c) > 0, g)),
    "relu6": ("i", lambda c, g: _mask(F.logical_and(_x(c) > 0, _x(c) < 6), g)),
    "sigmoid": ("o", lambda c, g: g * _y(c) * (1 - _y(c))),
    "softplus": ("i", lambda c, g: g * F.sigmoid(_x(c))),
    "silu": ("i", lambda c, g: _silu_grad(_x(c), g)),
    "gelu": ("i", lambda c, g: _gelu_grad(_x(c), g)),
    "gelu_tanh": ("i", lambda c, g: _gelu_tanh_grad(_x(c), g)),
    "hardswish": ("i", lambda c, g: _hardswish_grad(_x(c), g)),
    "hardsigmoid": ("i", lambda c, g: _mask(F.logical_and(_x(c) > -3, _x(c) < 3), g) / 6),
    # piecewise constant: zero almost everywhere (PyTorch's choice)
    **{n: ("i", lambda c, g: g * 0) for n in ("sign", "round", "floor", "ceil", "trunc")},
}


def _silu_grad(x, g):
    s = F.sigmoid(x)
    return g * s * (1 + x * (1 - s))


def _gelu_grad(x, g):
    cdf = (F.erf(x * (1 / math.sqrt(2))) + 1) * 0.5
    pdf = F.exp(x * x * -0.5) * (1 / math.sqrt(2 * math.pi))
    return g * (cdf + x * pdf)


def _gelu_tanh_grad(x, g):
    k = math.sqrt(2 / math.pi)
    inner = (x + x * x * x * 0.044715) * k
    t = F.tanh(inner)
    dinner = (x * x * (3 * 0.044715) + 1) * k
    return g * ((t + 1) * 0.5 + x * 0.5 * (1 - t * t) * dinner)


def _hardswish_grad(x, g):
    # PyTorch: 0 below -3, 1 above 3, (2x + 3) / 6 between (-3 and 3 inclusive)
    mid = F.logical_and(x >= -3, x <= 3)
    return _mask(mid, g * (x * 2 + 3) / 6) + _mask(x > 3, g)


def _where_tie(a, b, g, pick):
    """maximum/minimum: the gradient goes to the operand picked, half each on a tie."""
    eq = (a == b).astype(g.dtype)
    win = pick.astype(g.dtype)
    return g * (win + eq * 0.5)


def _minmax2(c, g, wins):
    a, b = c.inputs
    return _where_tie(a, b, g, wins(a, b)), _where_tie(a, b, g, wins(b, a))


def _pow_x(c, g):
    x, y = c.inputs[0], c.inputs[1]
    # PyTorch: 0 where y == 0 (x ** 0 is constant), else y * x ** (y - 1)
    d = g * y * (x ** (y - 1))
    return _mask(F.not_equal(y if isinstance(y, Tensor) else F.full_like(x, y), 0), d)


def _pow_y(c, g):
    x, y = c.inputs[0], c.inputs[1]
    out = x ** y
    # PyTorch: 0 where x == 0 and y >= 0
    safe = F.where(x == 0, F.ones_like(out), x) if isinstance(x, Tensor) else x
    d = g * out * F.log(safe if isinstance(safe, Tensor) else F.full_like(out, safe))
    if isinstance(x, Tensor):
        d = _mask(F.logical_not(F.logical_and(x == 0, y >= 0)), d)
    return d


def _binary():
    return {
        "add": ("", lambda c, g: (g, g)),
        "sub": ("", lambda c, g: (g, -g)),
        "mul": ("i", lambda c, g: (g * c.inputs[1] if c.needs(0) else None,
                                   g * c.inputs[0] if c.needs(1) else None)),
        "truediv": ("i", lambda c, g: (
            g / c.inputs[1] if c.needs(0) else None,
            -g * c.inputs[0] / (c.inputs[1] * c.inputs[1]) if c.needs(1) else None)),
        "pow": ("i", lambda c, g: (_pow_x(c, g) if c.needs(0) else None,
                                   _pow_y(c, g) if c.needs(1) else None)),
        "maximum": ("i", lambda c, g: _minmax2(c, g, lambda a, b: a > b)),
        "minimum": ("i", lambda c, g: _minmax2(c, g, lambda a, b: a < b)),
        "atan2": ("i", lambda c, g: _atan2(c.inputs[0], c.inputs[1], g)),
        # floor division is piecewise constant; x mod y = x - floor(x / y) * y
        "floordiv": ("i", lambda c, g: (g * 0, g * 0)),
        "mod": ("i", lambda c, g: (g, -g * F.floor(c.inputs[0] / c.inputs[1]))),
    }


def _atan2(y, x, g):
    d = y * y + x * x
    return g * x / d, -g * y / d


def _where_rule(c, g):
    cond = c.inputs[0]
    return None, _mask(cond, g), _mask(F.logical_not(cond), g)


def _clip_rule(c, g):
    x, lo, hi = c.inputs
    keep = F.ones_like(x).astype("bool") if lo is None else x >= lo
    if hi is not None:
        keep = F.logical_and(keep, x <= hi)
    glo = _mask(x < lo, g) if lo is not None and c.needs(1) else None
    ghi = _mask(x > hi, g) if hi is not None and c.needs(2) else None
    return _mask(keep, g), glo, ghi


# ------------------------------------------------------------- views
def _reshape_rule(c, g):
    return g.reshape(c.input_shape(0))


def _transpose_rule(c, g):
    axes = c.params["axes"]
    nd = len(c.input_shape(0))
    if not axes:
        axes = tuple(range(nd))[::-1]
    inv = [0] * nd
    for i, a in enumerate(axes):
        inv[a % nd] = i
    return g.transpose(*inv)


def _astype_rule(c, g):
    dt = c.input_dtype(0)
    if dt.kind != "f" and dt.name != "bfloat16":
        return None
    return g.astype(dt)


# ------------------------------------------------------------- reductions
def _axes(axis, nd):
    if axis is None:
        return tuple(range(nd))
    if isinstance(axis, int):
        axis = (axis,)
    return tuple(sorted(a % nd for a in axis))


def _unreduce(c, g):
    """g (a reduction's result) broadcast back to the input's shape."""
    shape = c.input_shape(0)
    if not c.params.get("keepdims"):
        kept = list(shape)
        for a in _axes(c.params.get("axis"), len(shape)):
            kept[a] = 1
        g = g.reshape(tuple(kept))
    return g.broadcast_to(shape)


def _count(c):
    shape = c.input_shape(0)
    return math.prod(shape[a] for a in _axes(c.params.get("axis"), len(shape)))


def _minmax_rule(c, g):
    x = c.inputs[0]
    y = _unreduce(c, c.outputs[0])
    hit = (x == y).astype(g.dtype)
    ties = hit.sum(axis=_axes(c.params.get("axis"), x.ndim), keepdims=True)
    return _unreduce(c, g) * hit / ties


def _var_rule(c, g):
    x = c.inputs[0]
    ax = _axes(c.params.get("axis"), x.ndim)
    n = _count(c) - c.params.get("ddof", 0)
    return _unreduce(c, g) * (x - x.mean(axis=ax, keepdims=True)) * (2.0 / n)


def _std_rule(c, g):
    x = c.inputs[0]
    ax = _axes(c.params.get("axis"), x.ndim)
    n = _count(c) - c.params.get("ddof", 0)
    return _unreduce(c, g / c.outputs[0]) * (x - x.mean(axis=ax, keepdims=True)) * (1.0 / n)


def _prod_rule(c, g):
    # the product of the other elements, exact where x has zeros: over the
    # reduced elements laid out on one axis, exclusive cumprods from each side
    x = c.inputs[0]
    shape = x.shape
    ax = _axes(c.params.get("axis"), x.ndim)
    rest = [a for a in range(x.ndim) if a not in ax]
    perm = rest + list(ax)
    xt = x.transpose(*perm)
    m = math.prod(shape[a] for a in ax)
    flat = xt.reshape(tuple(shape[a] for a in rest) + (m,))
    a = flat.numpy().astype(np.float64)
    left = np.cumprod(np.concatenate([np.ones(a.shape[:-1] + (1,)), a[..., :-1]], -1), -1)
    right = np.cumprod(np.concatenate([np.ones(a.shape[:-1] + (1,)), a[..., :0:-1]], -1),
                       -1)[..., ::-1]
    others = F.astype(Tensor(left * right), x.dtype)
    others = others.reshape(xt.shape)
    inv = [0] * x.ndim
    for i, p in enumerate(perm):
        inv[p] = i
    return _unreduce(c, g) * others.transpose(*inv)


def _softmax_rule(c, g):
    y = c.outputs[0]
    ax = c.params["axis"]
    return y * (g - (g * y).sum(axis=ax, keepdims=True))


def _log_softmax_rule(c, g):
    ax = c.params["axis"]
    return g - F.exp(c.outputs[0]) * g.sum(axis=ax, keepdims=True)


def _cumsum_rule(c, g):
    ax = c.params["axis"]
    if ax is None:
        g = g.reshape(-1)
        ax = 0
    return (g.sum(axis=ax, keepdims=True) - F.cumsum(g, ax) + g).reshape(c.input_shape(0))


# ------------------------------------------------------------- indexing, joining
def _index_add(shape, dtype, index, g):
    """zeros(shape) with ``g`` added at ``index`` (repeated indices add up:
    NumPy's ``np.add.at``; host memory), summed in float32 or float64 as
    ``dtype`` is (float16 and bfloat16 in float32)."""
    wide = np.float64 if dtype == np.float64 else np.float32
    acc = np.zeros(shape, dtype=wide)
    np.add.at(acc, _np_index(index), g.numpy().astype(wide, copy=False))
    return Tensor(acc if acc.dtype == dtype else acc.astype(dtype))


def _np_index(index):
    if isinstance(index, Tensor):
        return index.numpy()
    if isinstance(index, tuple):
        return tuple(_np_index(i) for i in index)
    if isinstance(index, list):
        return np.asarray([i.numpy() if isinstance(i, Tensor) else i for i in index])
    return index


def _getitem_rule(c, g):
    return _index_add(c.input_shape(0), c.input_dtype(0), c.inputs[1], g)


def _setitem_rule(c, g):
    index = c.inputs[1]
    gx = None
    if c.needs(0):
        gx = g.copy()
        gx[index] = 0
    gv = g[index] if c.needs(2) else None
    return gx, None, gv


def _concat_rule(c, g):
    ax = c.params["axis"]
    out, at = [], 0
    for i in range(len(c.edges)):
        n = c.input_shape(i)[ax]
        sl = [slice(None)] * g.ndim
        sl[ax] = slice(at, at + n)
        out.append(g[tuple(sl)] if c.needs(i) else None)
        at += n
    return tuple(out)


def _stack_rule(c, g):
    ax = c.params["axis"] % g.ndim
    out = []
    for i in range(len(c.edges)):
        sl = [slice(None)] * g.ndim
        sl[ax] = i
        out.append(g[tuple(sl)] if c.needs(i) else None)
    return tuple(out)


def _split_rule(c, gs):
    parts = [g if g is not None else F.zeros(m[0], dtype=m[1]) for g, m in zip(gs, c.out_meta)]
    return F.concat(parts, axis=c.params["axis"])


def _gather_rule(c, g):
    x_shape, index, ax = c.input_shape(0), c.inputs[1], c.params["axis"]
    idx = index.numpy()
    grid = list(np.indices(idx.shape, sparse=True))
    grid[ax % len(x_shape)] = idx
    return _index_add(x_shape, c.input_dtype(0), tuple(grid), g), None


def _scatter_rule(c, g):
    index, ax = c.inputs[1], c.params["axis"]
    gx = F.scatter(g, ax, index, F.zeros(index.shape, dtype=g.dtype)) if c.needs(0) else None
    gs = F.gather(g, ax, index) if c.needs(2) else None
    return gx, None, gs


def _embedding_rule(c, g):
    return _index_add(c.input_shape(0), c.input_dtype(0), c.inputs[1], g), None


# ------------------------------------------------------------- linear algebra
def _matmul_rule(c, g):
    a, b = c.inputs
    a2 = a.reshape(1, -1) if a.ndim == 1 else a
    b2 = b.reshape(-1, 1) if b.ndim == 1 else b
    g2 = g
    if a.ndim == 1:
        g2 = F.expand_dims(g2, -2)
    if b.ndim == 1:
        g2 = F.expand_dims(g2, -1)
    ga = gb = None
    if c.needs(0):
        ga = F.matmul(g2, _swap(b2))
        if a.ndim == 1:          # [..., 1, k]: a was shared by every batch
            ga = ga.reshape(-1, a.shape[0]).sum(axis=0)
    if c.needs(1):
        if b.ndim == 2 and a.ndim > 2:     # a weight shared by a batch: one GEMM over all rows
            gb = F.matmul(_swap(a.reshape(-1, a.shape[-1])), g.reshape(-1, g.shape[-1]))
            return ga, gb
        gb = F.matmul(_swap(a2), g2)
        if b.ndim == 1:          # [..., k, 1]
            gb = gb.reshape(-1, b.shape[0]).sum(axis=0)
    return ga, gb


def _swap(t):
    axes = list(range(t.ndim))
    axes[-1], axes[-2] = axes[-2], axes[-1]
    return t.transpose(*axes)


# ------------------------------------------------------------- convolution
def _pair(v):
    return tuple(v) if isinstance(v, (tuple, list)) else (v, v)


def _conv_weight_grad(x, g, w_shape, stride, padding, dilation, groups):
    """d(conv2d(x, w)) / dw given the output gradient g, per group one GEMM:
    g [O/G, N*Ho*Wo] times the patches of x [N*Ho*Wo, C/G*kh*kw] (x's
    patches gathered on the host by a strided view, im2col)."""
    n, c, h, w = x.shape
    o, cg, kh, kw = w_shape
    og = o // groups
    ho, wo = g.shape[2], g.shape[3]
    xa = np.ascontiguousarray(x.numpy())
    if padding[0] or padding[1]:
        xa = np.pad(xa, ((0, 0), (0, 0), (padding[0],) * 2, (padding[1],) * 2))
    sn, sc, sh, sw = xa.strides
    cols = np.lib.stride_tricks.as_strided(
        xa, (n, groups, cg, kh, kw, ho, wo),
        (sn, sc * cg, sc, sh * dilation[0], sw * dilation[1], sh * stride[0], sw * stride[1]))
    cols = cols.transpose(1, 2, 3, 4, 0, 5, 6).reshape(groups, cg * kh * kw, n * ho * wo)
    ga = g.numpy().reshape(n, groups, og, ho * wo).transpose(1, 2, 0, 3).reshape(
        groups, og, n * ho * wo)
    gw = F.matmul(Tensor(np.ascontiguousarray(ga)),
                  Tensor(np.ascontiguousarray(cols)).transpose(0, 2, 1))
    return gw.reshape(o, cg, kh, kw).astype(x.dtype)


def _conv2d_rule(c, g):
    x, w, b = c.inputs
    s, p, d = _pair(c.params["stride"]), _pair(c.params["padding"]), _pair(c.params["dilation"])
    groups = c.params["groups"]
    gx = gw = gb = None
    if c.needs(0):
        h, wd = x.shape[2], x.shape[3]
        kh, kw = w.shape[2], w.shape[3]
        op = tuple(size - ((n - 1) * st - 2 * pd + dl * (k - 1) + 1)
                   for size, n, st, pd, dl, k in zip((h, wd), g.shape[2:], s, p, d, (kh, kw)))
        gx = F.conv_transpose2d(g, w, None, stride=s, padding=p, output_padding=op,
                                dilation=d, groups=groups)
    if c.needs(1):
        gw = _conv_weight_grad(x, g, w.shape, s, p, d, groups)
    if b is not None and c.needs(2):
        gb = g.sum(axis=(0, 2, 3))
    return gx, gw, gb


def _conv_transpose2d_rule(c, g):
    # conv_transpose2d is conv2d's adjoint: y = conv2d^T(x; w), so
    # dx = conv2d(g; w) and dw is conv2d's weight gradient with g as input
    x, w, b = c.inputs
    s, p, d = _pair(c.params["stride"]), _pair(c.params["padding"]), _pair(c.params["dilation"])
    groups = c.params["groups"]
    gx = gw = gb = None
    if c.needs(0):
        gx = F.conv2d(g, w, None, stride=s, padding=p, dilation=d, groups=groups)
    if c.needs(1):
        full = _conv_weight_grad(g, x, (w.shape[0], w.shape[1], w.shape[2], w.shape[3]),
                                 s, p, d, groups)
        gw = full
    if b is not None and c.needs(2):
        gb = g.sum(axis=(0, 2, 3))
    return gx, gw, gb


# ------------------------------------------------------------- pooling (host code)
def _windows(size, k, s, p, d, n_out):
    """For each output index and kernel offset, the input index (may be out of range)."""
    return (np.arange(n_out)[:, None] * s - p + np.arange(k)[None, :] * d)


def _max_pool_grad(x, g, ks, st, pd, dl):
    xa = x.numpy()
    ga = g.numpy().astype(np.float64)
    n, ch, h, w = xa.shape
    oh, ow = ga.shape[2], ga.shape[3]
    ih = _windows(h, ks[0], st[0], pd[0], dl[0], oh)          # [oh, kh]
    iw = _windows(w, ks[1], st[1], pd[1], dl[1], ow)          # [ow, kw]
    vh = (ih >= 0) & (ih < h)
    vw = (iw >= 0) & (iw < w)
    vals = xa[:, :, np.clip(ih, 0, h - 1)[:, :, None, None], np.clip(iw, 0, w - 1)[None, None]]
    valid = vh[:, :, None, None] & vw[None, None]              # [oh, kh, ow, kw]
    vals = np.where(valid, vals.astype(np.float64), -np.inf)   # [n, c, oh, kh, ow, kw]
    vals = vals.transpose(0, 1, 2, 4, 3, 5).reshape(n, ch, oh, ow, -1)
    # the first maximum of each window (PyTorch); NaN wins as in the forward
    arg = np.where(np.isnan(vals).any(-1), np.isnan(vals).argmax(-1), vals.argmax(-1))
    kh_i, kw_i = np.divmod(arg, ks[1])
    rows = ih[np.arange(oh)[None, None, :, None], kh_i]
    cols = iw[np.arange(ow)[None, None, None, :], kw_i]
    acc = np.zeros((n, ch, h, w))
    nn_, cc = np.indices((n, ch), sparse=True)
    np.add.at(acc, (nn_[..., None, None], cc[..., None, None], rows, cols), ga)
    return Tensor(acc.astype(x.dtype))


def _max_pool2d_rule(c, g):
    x = c.inputs[0]
    ks = _pair(c.params["kernel_size"])
    st = _pair(c.params["stride"] if c.params["stride"] is not None else ks)
    return _max_pool_grad(x, g, ks, st, _pair(c.params["padding"]), _pair(c.params["dilation"]))


def _avg_pool2d_rule(c, g):
    shape, dtype = c.input_shape(0), c.input_dtype(0)
    ks = _pair(c.params["kernel_size"])
    st = _pair(c.params["stride"] if c.params["stride"] is not None else ks)
    pd = _pair(c.params["padding"])
    ga = g.numpy().astype(np.float64)
    n, ch, h, w = shape
    oh, ow = ga.shape[2], ga.shape[3]
    ih = _windows(h, ks[0], st[0], pd[0], 1, oh)
    iw = _windows(w, ks[1], st[1], pd[1], 1, ow)
    if c.params["count_include_pad"]:       # the window clipped to the padded input
        ch_ = ((ih >= -pd[0]) & (ih < h + pd[0])).sum(1)
        cw_ = ((iw >= -pd[1]) & (iw < w + pd[1])).sum(1)
    else:                                    # the window clipped to the input
        ch_ = ((ih >= 0) & (ih < h)).sum(1)
        cw_ = ((iw >= 0) & (iw < w)).sum(1)
    div = np.maximum(ch_[:, None] * cw_[None, :], 1)
    gd = ga / div
    acc = np.zeros((n, ch, h + 2 * pd[0] + ks[0] * st[0], w + 2 * pd[1] + ks[1] * st[1]))
    for a in range(ks[0]):
        for b in range(ks[1]):
            rows = ih[:, a] + pd[0]
            cols = iw[:, b] + pd[1]
            acc[:, :, rows[:, None], cols[None, :]] += gd
    out = acc[:, :, pd[0]:pd[0] + h, pd[1]:pd[1] + w]
    return Tensor(np.ascontiguousarray(out).astype(dtype))


def _adaptive_bounds(size, n_out):
    i = np.arange(n_out)
    return (i * size) // n_out, -((-(i + 1) * size) // n_out)


def _adaptive_rule(kind):
    def rule(c, g):
        shape, dtype = c.input_shape(0), c.input_dtype(0)
        n, ch, h, w = shape
        ga = g.numpy().astype(np.float64)
        oh, ow = ga.shape[2], ga.shape[3]
        hs, he = _adaptive_bounds(h, oh)
        ws, we = _adaptive_bounds(w, ow)
        acc = np.zeros(shape)
        xa = c.inputs[0].numpy() if kind == "max" else None
        for i in range(oh):
            for j in range(ow):
                gij = ga[:, :, i, j]
                if kind == "avg":
                    area = (he[i] - hs[i]) * (we[j] - ws[j])
                    acc[:, :, hs[i]:he[i], ws[j]:we[j]] += (gij / area)[:, :, None, None]
                else:
                    win = xa[:, :, hs[i]:he[i], ws[j]:we[j]].reshape(n, ch, -1)
                    a = win.argmax(-1)
                    r, q = np.divmod(a, we[j] - ws[j])
                    nn_, cc = np.indices((n, ch))
                    np.add.at(acc, (nn_, cc, r + hs[i], q + ws[j]), gij)
        return Tensor(acc.astype(dtype))
    return rule


# ------------------------------------------------------------- resampling, padding, attention
def _interp_matrix(c, axis):
    """The [out, in] weights of interpolate along spatial ``axis`` (2 or 3),
    read off the op itself: the op is separable and its rows sum to 1, so
    one-hot rows along a channel axis give them."""
    n, ch, h, w = c.input_shape(0)
    size = (h, w)[axis - 2]
    basis = np.zeros((1, size, h, w))
    if axis == 2:
        basis[0, np.arange(size), np.arange(size), :] = 1.0
    else:
        basis[0, np.arange(size), :, np.arange(size)] = 1.0
    p = c.params
    out = F.interpolate(Tensor(basis), p["size"], p["scale_factor"], p["mode"],
                        p["align_corners"]).numpy()
    # out[0, i, oh, ow]: constant along the other axis
    return out[0, :, :, 0].T if axis == 2 else out[0, :, 0, :].T


def _interpolate_rule(c, g):
    wh = _interp_matrix(c, 2)        # [oh, h]
    ww = _interp_matrix(c, 3)        # [ow, w]
    gx = np.einsum("ncij,ih,jw->nchw", g.numpy().astype(np.float64), wh, ww)
    return Tensor(gx.astype(c.input_dtype(0)))


def _pad_rule(c, g):
    if c.params["mode"] not in ("constant", 0):
        from mgtrace.errors import AutodiffError
        raise AutodiffError(f"no gradient is defined for pad mode {c.params['mode']!r} yet "
                            "(constant padding has one)")
    shape = c.input_shape(0)
    pw = np.broadcast_to(np.asarray(c.params["pad_width"], dtype=np.int64).reshape(-1, 2)
                         if np.ndim(c.params["pad_width"]) else
                         np.full((1, 2), c.params["pad_width"]), (len(shape), 2))
    sl = tuple(slice(int(lo), int(lo) + n) for (lo, _), n in zip(pw, shape))
    return g[sl]


def _attention_rule(c, g):
    q, k, v, mask = c.inputs
    scale = c.params["scale"]
    s = F.matmul(q, _swap(k)) * scale
    if mask is not None:
        s = s + mask
    p = F.softmax(s, axis=-1)
    gv = F.matmul(_swap(p), g) if c.needs(2) else None
    gp = F.matmul(g, _swap(v))
    gs = p * (gp - (gp * p).sum(axis=-1, keepdims=True))
    gq = F.matmul(gs, k) * scale if c.needs(0) else None
    gk = F.matmul(_swap(gs), q) * scale if c.needs(1) else None
    return gq, gk, gv, (gs if mask is not None and c.needs(3) else None)


# ------------------------------------------------------------- functions that are no op
def _bind(fn, args, kwargs):
    import inspect
    sig = inspect.signature(fn)
    b = sig.bind(*args, **kwargs)
    b.apply_defaults()
    return b.arguments


def _layer_norm_fn(fn, args, kwargs):
    """F.layer_norm's fused C path is no op: under a recording manager it
    runs as its composite (mean, var, rsqrt: the same formula)."""
    a = _bind(fn, args, kwargs)
    x = a["x"]
    ns = a["normalized_shape"]
    k = 1 if isinstance(ns, int) else len(tuple(ns))
    axes = tuple(range(x.ndim - k, x.ndim))
    mean = x.mean(axis=axes, keepdims=True)
    var = x.var(axis=axes, keepdims=True)
    y = (x - mean) * F.rsqrt(var + a["eps"])
    if a["weight"] is not None:
        y = y * a["weight"]
    if a["bias"] is not None:
        y = y + a["bias"]
    return y


def _linear_act_fn(fn, args, kwargs):
    """F.linear_act's fused bias-and-activation kernel is no op: recorded
    as F.linear followed by the activation."""
    from mgtrace.functional import fused
    a = _bind(fn, args, kwargs)
    return fused._apply_act(F.linear(a["x"], a["weight"], a["bias"]), a["act"])


NONDIFF = frozenset([
    "isnan", "isinf", "isfinite", "logical_not", "bitwise_not",
    "eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or", "logical_xor",
    "bitwise_and", "bitwise_or", "bitwise_xor", "left_shift", "right_shift",
    "any", "all", "argmax", "argmin", "argsort", "nonzero",
])


def _build():
    rules = {}
    for name, (saves, fn) in {**_UNARY, **_binary()}.items():
        rules[name] = Rule(fn, "i" in saves, "o" in saves)
    rules.update({
        "where": Rule(_where_rule, True),
        "clip": Rule(_clip_rule, True),
        "astype": Rule(_astype_rule),
        "reshape": Rule(_reshape_rule),
        "transpose": Rule(_transpose_rule),
        "expand_dims": Rule(_reshape_rule),
        "squeeze": Rule(_reshape_rule),
        "broadcast_to": Rule(lambda c, g: g),        # the engine sums back to x's shape
        # Tensor.to(device), no core op: recorded by the tape's on_method
        "to": Rule(lambda c, g: g.to(c.params["device"])),
        "sum": Rule(_unreduce),
        "mean": Rule(lambda c, g: _unreduce(c, g) * (1.0 / max(_count(c), 1))),
        "prod": Rule(_prod_rule, True),
        "max": Rule(_minmax_rule, True, True),
        "min": Rule(_minmax_rule, True, True),
        "var": Rule(_var_rule, True),
        "std": Rule(_std_rule, True, True),
        "softmax": Rule(_softmax_rule, False, True),
        "log_softmax": Rule(_log_softmax_rule, False, True),
        "cumsum": Rule(_cumsum_rule),
        "getitem": Rule(_getitem_rule),
        "setitem": Rule(_setitem_rule),
        "gather": Rule(_gather_rule),
        "scatter": Rule(_scatter_rule),
        "embedding": Rule(_embedding_rule),
        "concat": Rule(_concat_rule),
        "stack": Rule(_stack_rule),
        "split": Rule(_split_rule),
        "matmul": Rule(_matmul_rule, True),
        "conv2d": Rule(_conv2d_rule, True),
        "conv_transpose2d": Rule(_conv_transpose2d_rule, True),
        "max_pool2d": Rule(_max_pool2d_rule, True),
        "avg_pool2d": Rule(_avg_pool2d_rule),
        "adaptive_avg_pool2d": Rule(_adaptive_rule("avg")),
        "adaptive_max_pool2d": Rule(_adaptive_rule("max"), True),
        "interpolate": Rule(_interpolate_rule),
        "pad": Rule(_pad_rule),
        "attention": Rule(_attention_rule, True),
    })
    return rules


RULES = _build()
FUNCTION_RULES = {"layer_norm": _layer_norm_fn, "linear_act": _linear_act_fn}
