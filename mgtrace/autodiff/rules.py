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

from mgtrace._core import Tensor
from mgtrace._core import nn as _nn
from mgtrace._core import reduce as _reduce
from mgtrace import functional as F
from mgtrace.errors import AutodiffError, NoKernelError

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
    # one C pass (nn's act_backward: y > 0 exactly where x > 0) where the device has it
    "relu": ("o", lambda c, g: _act_or_mask("relu", _y(c), g, lambda y: y > 0)),
    "relu6": ("i", lambda c, g: _act_or_mask("relu6", _x(c), g,
                                             lambda x: F.logical_and(x > 0, x < 6))),
    "sigmoid": ("o", lambda c, g: g * _y(c) * (1 - _y(c))),
    "softplus": ("i", lambda c, g: g * F.sigmoid(_x(c))),
    # one C pass each (nn's act_backward) instead of a chain of elementwise ops
    "silu": ("i", lambda c, g: _nn.act_backward("silu", _x(c), g)),
    "gelu": ("i", lambda c, g: _nn.act_backward("gelu", _x(c), g)),
    "gelu_tanh": ("i", lambda c, g: _gelu_tanh_grad(_x(c), g)),
    "hardswish": ("i", lambda c, g: _nn.act_backward("hardswish", _x(c), g)),
    "hardsigmoid": ("i", lambda c, g: _mask(F.logical_and(_x(c) > -3, _x(c) < 3), g) / 6),
    # piecewise constant: zero almost everywhere (PyTorch's choice)
    **{n: ("i", lambda c, g: g * 0) for n in ("sign", "round", "floor", "ceil", "trunc")},
}


def _act_or_mask(act, x, g, cond):
    """``g * act'(x)`` for relu / relu6: the C act_backward pass, or where
    the device has none (CUDA) the mask composed of core ops."""
    try:
        return _nn.act_backward(act, x, g)
    except NoKernelError:
        return _mask(cond(x), g)


def _gelu_tanh_grad(x, g):
    k = math.sqrt(2 / math.pi)
    inner = (x + x * x * x * 0.044715) * k
    t = F.tanh(inner)
    dinner = (x * x * (3 * 0.044715) + 1) * k
    return g * ((t + 1) * 0.5 + x * 0.5 * (1 - t * t) * dinner)


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
    if m == 0:
        return F.zeros(shape, dtype=x.dtype, device=x.device)
    one = F.ones(flat.shape[:-1] + (1,), dtype=x.dtype, device=x.device)
    left = _reduce.cumprod(F.concat([one, flat[..., :-1]], axis=-1), -1)
    right = _reduce.cumprod(F.concat([one, flat[..., :0:-1]], axis=-1), -1)[..., ::-1]
    others = (left * right).reshape(xt.shape)
    inv = [0] * x.ndim
    for i, p in enumerate(perm):
        inv[p] = i
    return _unreduce(c, g) * others.transpose(*inv)


def _softmax_rule(c, g):
    y = c.outputs[0]
    ax = c.params["axis"] if y.ndim else None      # a 0-d y: over its one element
    if _rows_along(y, ax):
        try:            # one C pass per row (nn's softmax_backward)
            return _nn.softmax_backward(y, g, ax)
        except NoKernelError:
            pass
    return y * (g - (g * y).sum(axis=ax, keepdims=True))


def _log_softmax_rule(c, g):
    y = c.outputs[0]
    ax = c.params["axis"] if y.ndim else None
    if _rows_along(y, ax):
        try:
            return _nn.softmax_backward(y, g, ax, log=True)
        except NoKernelError:
            pass
    return g - F.exp(y) * g.sum(axis=ax, keepdims=True)


def _rows_along(y, ax):
    """Whether softmax's axis ``ax`` of y is its last of size > 1 (so y's
    lines are rows of a contiguous copy: nn.softmax_backward's case); an
    axis elsewhere (over channels of NCHW) composes core ops."""
    if ax is None or y.ndim == 0 or not -y.ndim <= ax < y.ndim:
        return False
    return all(d == 1 for d in y.shape[ax % y.ndim + 1:])


def _cumsum_rule(c, g):
    ax = c.params["axis"]
    if ax is None:
        g = g.reshape(-1)
        ax = 0
    return (g.sum(axis=ax, keepdims=True) - F.cumsum(g, ax) + g).reshape(c.input_shape(0))


def _cumprod_rule(c, g):
    # d y_j / d x_i = prod_{k <= j, k != i} x_k (j >= i), exact with zeros:
    # before a line's first zero z the terms are y_j / x_i (x_i != 0; for
    # j >= z both sides are 0); at z, the products of x with x_z set to 1;
    # after z, 0 (every product holds x_z)
    x, ax = c.inputs[0], c.params["axis"]
    if ax is None:
        x, ax = x.reshape(-1), 0
        g = g.reshape(-1)
    ax %= max(x.ndim, 1)
    n = x.shape[ax]
    pos = F.arange(n, dtype="int32", device=x.device).reshape((n,) + (1,) * (x.ndim - 1 - ax))
    zero = x == 0
    has = zero.any(axis=ax, keepdims=True)
    z = F.where(has, zero.astype("int32").argmax(axis=ax, keepdims=True).astype("int32"),
                F.full_like(has.astype("int32"), n))
    before, at = pos < z, pos == z
    y = _reduce.cumprod(x, ax)
    gy = g * y
    rev = gy.sum(axis=ax, keepdims=True) - F.cumsum(gy, ax) + gy      # sum over j >= i
    safe = F.where(before, x, F.ones_like(x))
    gx = _mask(before, rev / safe)
    ones_at = F.where(at, F.ones_like(x), x)
    tail = (g * _reduce.cumprod(ones_at, ax) * (pos >= z).astype(g.dtype)).sum(axis=ax, keepdims=True)
    gx = gx + _mask(at, tail)
    return gx.reshape(c.input_shape(0))


def _sorted_rule(c, gs):
    """sort and topk: each selected value's gradient goes back to where it
    came from (the indices output)."""
    gv = gs[0]
    if gv is None:
        return None
    shape, ax = c.input_shape(0), c.params["axis"]
    if len(shape) == 0:
        return gv.reshape(())
    pos = F.gather(_positions(shape, gv.device), ax % len(shape), c.outputs[1].astype("int64"))
    return _scatter_add(shape, c.input_dtype(0), pos, gv)


# ------------------------------------------------------------- indexing, joining
def _is_basic(index):
    """An index of slices, ints, None and Ellipsis only (no tensor, list or mask)."""
    items = index if isinstance(index, tuple) else (index,)
    return all(i is None or i is Ellipsis or isinstance(i, (int, slice)) and not isinstance(i, bool)
               for i in items)


def _positions(shape, device):
    """Each element's flat position, an int64 tensor of ``shape`` on ``device``."""
    return F.arange(math.prod(shape), dtype="int64", device=device).reshape(shape)


def _scatter_add(shape, dtype, pos, g):
    """zeros(shape) with g's elements added at flat positions ``pos`` (g's
    shape; repeated positions add up): the C index-add kernel."""
    return _nn.index_add((math.prod(shape),), pos, g.astype(dtype)).reshape(shape)


def _getitem_rule(c, g):
    shape, dtype, index = c.input_shape(0), c.input_dtype(0), c.inputs[1]
    if _is_basic(index):          # a view: the gradient written through the same index
        gx = F.zeros(shape, dtype=dtype, device=g.device)
        gx[index] = g
        return gx
    rows = index[0] if isinstance(index, tuple) and len(index) == 1 else index
    if isinstance(rows, Tensor) and rows.dtype.kind in "iu" and len(shape) >= 1:
        # x[ids]: whole rows, added up by row number (no position table)
        return _nn.index_add(tuple(shape), rows, g.astype(dtype))
    return _scatter_add(shape, dtype, _positions(shape, g.device)[index], g)


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


def _device_of(gs):
    return next(g.device for g in gs if g is not None)


def _split_rule(c, gs):
    parts = [g if g is not None else F.zeros(m[0], dtype=m[1], device=_device_of(gs)) for g, m in zip(gs, c.out_meta)]
    return F.concat(parts, axis=c.params["axis"])


def _gather_rule(c, g):
    x_shape, index, ax = c.input_shape(0), c.inputs[1], c.params["axis"]
    pos = F.gather(_positions(x_shape, g.device), ax, index)
    return _scatter_add(x_shape, c.input_dtype(0), pos, g), None


def _scatter_rule(c, g):
    index, ax = c.inputs[1], c.params["axis"]
    gx = F.scatter(g, ax, index, F.zeros(index.shape, dtype=g.dtype, device=g.device)) if c.needs(0) else None
    gs = F.gather(g, ax, index) if c.needs(2) else None
    return gx, None, gs


def _embedding_rule(c, g):
    shape, dtype = c.input_shape(0), c.input_dtype(0)      # weight [V, D]
    return _nn.index_add(tuple(shape), c.inputs[1], g.astype(dtype)), None


# ------------------------------------------------------------- linear algebra
def _matmul_rule(c, g):
    a, b = c.inputs
    if b.ndim == 2 and a.ndim > 2 and not g.is_contiguous:
        # a weight shared by a batch: both GEMMs below fold the batch into
        # rows, which a strided gradient (attention's key projection gets
        # its heads' gradient transposed back) cannot; one copy instead of
        # a GEMM per batch item for a's gradient and a reshape's copy for b's
        g = g.contiguous()
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
        if b.ndim == 2 and a.ndim >= 2:    # a weight shared by a batch: one GEMM over all rows
            a_rows, g_rows = a.reshape(-1, a.shape[-1]), g.reshape(-1, g.shape[-1])
            if _transposed(b):
                # F.linear's weight.T: the weight's gradient g^T a [N, K] made
                # contiguous by the GEMM itself, returned as the view b's
                # gradient is ([K, N]); transpose's rule views it back. The
                # gradient of a^T g would reach the weight transposed, and
                # SGD's one-pass step copied it contiguous first
                return ga, _swap(F.matmul(_swap(g_rows), a_rows))
            return ga, F.matmul(_swap(a_rows), g_rows)
        gb = F.matmul(_swap(a2), g2)
        if b.ndim == 1:          # [..., k, 1]
            gb = gb.reshape(-1, b.shape[0]).sum(axis=0)
    return ga, gb


def _transposed(t):
    """Whether 2-d t is the transpose of a contiguous tensor (column-major,
    as F.linear's ``weight.T``)."""
    return t.ndim == 2 and t.shape[0] > 1 and t.shape[1] > 1 and t.strides == (1, t.shape[0])


def _swap(t):
    axes = list(range(t.ndim))
    axes[-1], axes[-2] = axes[-2], axes[-1]
    return t.transpose(*axes)


# ------------------------------------------------------------- convolution
def _pair(v):
    return tuple(v) if isinstance(v, (tuple, list)) else (v, v)


def _conv_weight_grad(x, g, w_shape, stride, padding, dilation, groups):
    """d(conv2d(x, w)) / dw given the output gradient g: the C kernel (per
    group one GEMM of g by x's patches)."""
    return _nn.conv2d_backward_weight(x, g, tuple(w_shape), stride, padding, dilation, groups).astype(x.dtype)


def _adjoint_weight(w, groups):
    """The weight of the conv2d that is conv2d(., w)'s adjoint at stride 1
    and dilation 1: w [O, C/groups, kh, kw] regrouped to [C, O/groups, kh,
    kw] and flipped in both spatial axes (padding k - 1 - p). Running the
    input gradient as that forward conv2d takes conv2d's algorithm choice
    (Winograd, packed GEMM): about half the CPU time of the col2im
    transposed kernel on ResNet-18's 3x3 layers."""
    o, cg, kh, kw = w.shape
    wg = w.reshape(groups, o // groups, cg, kh, kw).transpose(0, 2, 1, 3, 4)
    # contiguous here: conv2d copied the strided view itself, and slower
    # (ResNet-18's 512-channel 3x3 input gradient at batch 8, one thread,
    # its weight just updated: 20.8 ms a call with the view, 18.5 ms so)
    return wg[:, :, :, ::-1, ::-1].contiguous().reshape(groups * cg, o // groups, kh, kw)


def _conv_vjp(x, w, b, g, s, p, d, groups, need=(True, True, True)):
    """conv2d(x, w, b)'s gradients (x, w, bias) given the output's gradient g."""
    gx = gw = gb = None
    if need[0]:
        h, wd = x.shape[2], x.shape[3]
        kh, kw = w.shape[2], w.shape[3]
        op = tuple(size - ((n - 1) * st - 2 * pd + dl * (k - 1) + 1)
                   for size, n, st, pd, dl, k in zip((h, wd), g.shape[2:], s, p, d, (kh, kw)))
        if s == (1, 1) and d == (1, 1) and op == (0, 0) and p[0] < kh and p[1] < kw:
            gx = F.conv2d(g, _adjoint_weight(w, groups), None, padding=(kh - 1 - p[0], kw - 1 - p[1]),
                          groups=groups)
        else:
            gx = F.conv_transpose2d(g, w, None, stride=s, padding=p, output_padding=op,
                                    dilation=d, groups=groups)
    if need[1]:
        gw = _conv_weight_grad(x, g, w.shape, s, p, d, groups)
    if b is not None and need[2]:
        gb = g.sum(axis=(0, 2, 3))
    return gx, gw, gb


def _conv_params(c):
    return (_pair(c.params["stride"]), _pair(c.params["padding"]),
            _pair(c.params.get("dilation", 1)), c.params.get("groups", 1))


def _conv2d_rule(c, g):
    x, w, b = c.inputs
    return _conv_vjp(x, w, b, g, *_conv_params(c), need=(c.needs(0), c.needs(1), c.needs(2)))


def _act_grad(act, z, g):
    """g through a fused activation at pre-activation z (mt_act's names)."""
    if act in (None, "none"):
        return g
    return _nn.act_backward(act, z, g)


_ACT_FN = {"relu": F.relu, "relu6": F.relu6, "silu": F.silu, "hardswish": F.hardswish,
           "sigmoid": F.sigmoid, "gelu": F.gelu}


def _conv2d_act_rule(c, g):
    """conv2d_act (what optimize() fuses conv + activation into): the
    pre-activation recomputed by conv2d, then conv2d's rule."""
    x, w, b, res = c.inputs
    s, p, d, groups = _conv_params(c)
    z = F.conv2d(x, w, b, stride=s, padding=p, dilation=d, groups=groups)
    if res is not None:
        z = z + res
    gz = _act_grad(c.params["act"], z, g)
    gx, gw, gb = _conv_vjp(x, w, b, gz, s, p, d, groups, (c.needs(0), c.needs(1), c.needs(2)))
    return gx, gw, gb, (gz if res is not None and c.needs(3) else None)


def _blocked(t):
    return t.ndim == 5


def _conv2d_nchwc_rule(c, g):
    """conv2d_nchwc: conv2d_act in the NCHW16c layout; the gradient is
    computed in NCHW and put back in each input's layout."""
    x, w, b, res = c.inputs
    s, p, d, groups = _conv_params(c)
    cin = w.shape[1] * groups
    xn = _nn.from_nchwc(x, cin) if _blocked(x) else x
    gn = _nn.from_nchwc(g, w.shape[0])
    z = F.conv2d(xn, w, b, stride=s, padding=p, dilation=d, groups=groups)
    if res is not None:
        z = z + _nn.from_nchwc(res, w.shape[0])
    gz = _act_grad(c.params["act"], z, gn)
    gx, gw, gb = _conv_vjp(xn, w, b, gz, s, p, d, groups, (c.needs(0), c.needs(1), c.needs(2)))
    if gx is not None and _blocked(x):
        gx = _nn.to_nchwc(gx)
    gres = _nn.to_nchwc(gz) if res is not None and c.needs(3) else None
    return gx, gw, gb, gres


def _pw_dw_chain(c, convs, g):
    """The NCHW16c chains (pointwise, depthwise[, projection]): each conv
    recomputed in NCHW from the chain's input, then the gradients back
    through them in reverse. ``convs``: per conv (weight index, bias index,
    stride, padding, groups of the weight, act); returns the gradients of
    c.inputs in order (the residual last when the chain has one)."""
    x = c.inputs[0]
    w0 = c.inputs[convs[0][0]]
    a = _nn.from_nchwc(x, w0.shape[1])
    saved = []
    for wi, bi, s, p, grp, act in convs:
        w, b = c.inputs[wi], c.inputs[bi]
        z = F.conv2d(a, w, b, stride=s, padding=p, groups=w.shape[0] if grp else 1)
        saved.append((a, z))
        a = _ACT_FN[act](z) if act not in (None, "none") else z
    res = c.inputs[7] if len(c.inputs) > 7 else None
    if res is not None:      # the projection's residual: act(z + res)
        a_prev, z = saved[-1]
        z = z + _nn.from_nchwc(res, c.inputs[convs[-1][0]].shape[0])
        saved[-1] = (a_prev, z)
    gout = [None] * len(c.inputs)
    ga = _nn.from_nchwc(g, c.inputs[convs[-1][0]].shape[0])
    for (wi, bi, s, p, grp, act), (a_in, z) in zip(reversed(convs), reversed(saved)):
        w, b = c.inputs[wi], c.inputs[bi]
        gz = _act_grad(act, z, ga)
        if res is not None and wi == convs[-1][0]:
            gout[7] = _nn.to_nchwc(gz) if c.needs(7) else None
        ga, gout[wi], gout[bi] = _conv_vjp(a_in, w, b, gz, _pair(s), _pair(p), (1, 1),
                                           w.shape[0] if grp else 1,
                                           (True, c.needs(wi), b is not None and c.needs(bi)))
    gout[0] = _nn.to_nchwc(ga) if c.needs(0) else None
    return tuple(gout)


def _pw_dw_rule(c, g):
    p = c.params
    return _pw_dw_chain(c, [(1, 2, 1, 0, False, p["act"]),
                            (3, 4, p["stride"], p["padding"], True, p["dw_act"])], g)


def _pw_dw_pw_rule(c, g):
    p = c.params
    return _pw_dw_chain(c, [(1, 2, 1, 0, False, p["act"]),
                            (3, 4, p["stride"], p["padding"], True, p["dw_act"]),
                            (5, 6, 1, 0, False, p["proj_act"])], g)


def _max_pool2d_nchwc_rule(c, g):
    x, p = c.inputs[0], c.params
    ch = x.shape[1] * 16
    gx = _nn.pool2d_backward("max", _nn.from_nchwc(x, ch), _nn.from_nchwc(g, ch), p["kernel_size"],
                             p["stride"], p["padding"], p["dilation"], p["ceil_mode"])
    return _nn.to_nchwc(gx)


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


def _triple(v):
    return tuple(v) if isinstance(v, (tuple, list)) else (v, v, v)


def _conv3d_params(c):
    return (_triple(c.params["stride"]), _triple(c.params["padding"]),
            _triple(c.params["dilation"]), c.params["groups"])


def _conv3d_rule(c, g):
    # conv3d's C kernels: dx is the transposed conv of g (conv_transpose3d,
    # output_padding restoring x's size), dw one GEMM of g by x's patches
    x, w, b = c.inputs
    s, p, d, groups = _conv3d_params(c)
    gx = gw = gb = None
    if c.needs(0):
        op = tuple(size - ((n - 1) * st - 2 * pd + dl * (k - 1) + 1)
                   for size, n, st, pd, dl, k in zip(x.shape[2:], g.shape[2:], s, p, d, w.shape[2:]))
        gx = _nn.conv_transpose3d(g, w, None, s, p, op, d, groups)
    if c.needs(1):
        gw = _nn.conv3d_backward_weight(x, g, tuple(w.shape), s, p, d, groups).astype(x.dtype)
    if b is not None and c.needs(2):
        gb = g.sum(axis=(0, 2, 3, 4))
    return gx, gw, gb


def _conv_transpose3d_rule(c, g):
    # conv_transpose3d is conv3d's adjoint, as conv_transpose2d is conv2d's
    x, w, b = c.inputs
    s, p, d, groups = _conv3d_params(c)
    gx = gw = gb = None
    if c.needs(0):
        gx = _nn.conv3d(g, w, None, s, p, d, groups)
    if c.needs(1):
        gw = _nn.conv3d_backward_weight(g, x, tuple(w.shape), s, p, d, groups).astype(x.dtype)
    if b is not None and c.needs(2):
        gb = g.sum(axis=(0, 2, 3, 4))
    return gx, gw, gb


# ------------------------------------------------------------- recurrent steps (C kernels)
def _cell_weight_grads(c, dgates, h, w_hh, first):
    """The gradients of the gates' GEMM gates = gx + h @ w_hh^T + b_hh,
    inputs ``first`` (gx), first + 1 (h), w_hh and b_hh next to last and last."""
    n = len(c.inputs)
    gh = F.matmul(dgates, w_hh) if c.needs(first + 1) else None
    gw = F.matmul(dgates, h, transpose_a=True) if c.needs(n - 2) else None
    gb = dgates.sum(axis=0) if c.inputs[n - 1] is not None and c.needs(n - 1) else None
    return (dgates if c.needs(first) else None), gh, gw, gb


def _lstm_cell_rule(c, gs):
    # the step recomputed from its inputs (gates, then PyTorch's formulas
    # for c' = sf c + si tg, h' = so tanh(c'))
    gx, h, cx, w_hh, b_hh = c.inputs
    g = gx + F.matmul(h, w_hh, transpose_b=True)
    if b_hh is not None:
        g = g + b_hh
    i, f, gg, o = F.split(g, 4, axis=1)
    si, sf, tg, so = F.sigmoid(i), F.sigmoid(f), F.tanh(gg), F.sigmoid(o)
    tc = F.tanh(sf * cx + si * tg)
    gh_out, gc_out = gs
    dc = gc_out if gc_out is not None else F.zeros(cx.shape, dtype=cx.dtype, device=cx.device)
    if gh_out is not None:
        dc = dc + gh_out * so * (1 - tc * tc)
        do = gh_out * tc * so * (1 - so)
    else:
        do = F.zeros(cx.shape, dtype=cx.dtype, device=cx.device)
    dgates = F.concat([dc * tg * si * (1 - si), dc * cx * sf * (1 - sf), dc * si * (1 - tg * tg), do],
                      axis=1)
    d_gx, d_h, d_w, d_b = _cell_weight_grads(c, dgates, h, w_hh, 0)
    return d_gx, d_h, (dc * sf if c.needs(2) else None), d_w, d_b


def _rnn_cell_rule(c, g):
    gx, h, w_hh, b_hh = c.inputs
    y = c.outputs[0]
    if c.params["nonlinearity"] == "tanh":
        dpre = g * (1 - y * y)
    else:
        dpre = _mask(y > 0, g)
    return _cell_weight_grads(c, dpre, h, w_hh, 0)


# ------------------------------------------------------------- pooling, resampling (C kernels)
def _max_pool2d_rule(c, g):
    p = c.params
    return _nn.pool2d_backward("max", c.inputs[0], g, p["kernel_size"], p["stride"], p["padding"],
                               p["dilation"], p["ceil_mode"])


def _avg_pool2d_rule(c, g):
    p = c.params
    return _nn.pool2d_backward("avg", tuple(c.input_shape(0)), g, p["kernel_size"], p["stride"],
                               p["padding"], 1, p["ceil_mode"], p["count_include_pad"])


def _adaptive_rule(kind):
    def rule(c, g):
        x = c.inputs[0] if kind == "max" else tuple(c.input_shape(0))
        return _nn.adaptive_pool2d_backward(kind, x, g)
    return rule


def _interpolate_rule(c, g):
    p = c.params
    gx = _nn.interpolate_backward(g, tuple(c.input_shape(0)), p["scale_factor"], p["mode"],
                                  p["align_corners"])
    return gx.astype(c.input_dtype(0))


def _pad_rule(c, g):
    shape, p = tuple(c.input_shape(0)), c.params
    if p["mode"] in ("constant", 0):
        pw = p["pad_width"]
        pairs = _pad_pairs(pw, len(shape))
        return g[tuple(slice(lo, lo + n) for (lo, _), n in zip(pairs, shape))]
    # reflect / replicate / circular: each output element copies one input
    # element; its gradient goes back there (repeated sources add up)
    pos = F.pad(_positions(shape, g.device), p["pad_width"], mode=p["mode"])
    return _scatter_add(shape, c.input_dtype(0), pos, g)


def _pad_pairs(pw, nd):
    """np.pad's broadcasting of pad_width to nd (before, after) pairs."""
    if isinstance(pw, Tensor):
        pw = pw.tolist()
    if isinstance(pw, int):
        return [(pw, pw)] * nd
    pw = list(pw)
    if len(pw) == 2 and all(isinstance(v, int) for v in pw):
        return [tuple(pw)] * nd
    pairs = [tuple(v) if isinstance(v, (tuple, list)) else (v, v) for v in pw]
    return pairs * nd if len(pairs) == 1 else pairs


def _attention_rule(c, g):
    q, k, v, mask = c.inputs
    scale = c.params["scale"]
    if all(t is None or t.dtype.name == "float32" for t in (q, k, v, mask, g)):
        # one C pass per (batch, head) pair, the probabilities recomputed
        # (nn.attention_backward); the gradients are views of heads-inner
        # memory, so a model's split of the heads (reshape, transpose)
        # gives them back to its projections without a copy
        need_mask = mask is not None and c.needs(3)
        # F.attention under a recording manager saved the probabilities
        # (attention_train); the core op's node (multi_head_attention's)
        # has them recomputed. Taken out of the node: freed once used
        probs = c.params.pop("probs", None)
        try:
            gq, gk, gv, gs = _nn.attention_backward(q, k, v, mask, g, scale, need_mask, probs)
        except NoKernelError:
            pass
        else:
            return gq, gk, gv, gs
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
    runs the same C forward and is recorded as one ``layer_norm`` node whose
    backward is one C pass (nn.layer_norm_backward_rows) where the forward
    took that path (float32/float64 on the CPU, weight and bias of x's
    dtype); otherwise it runs as its composite (mean, var, rsqrt: the same
    formula), each op recorded."""
    from mgtrace.autodiff import _tape
    a = _bind(fn, args, kwargs)
    x, w, b, ns = a["x"], a["weight"], a["bias"], a["normalized_shape"]
    if isinstance(x, Tensor) and x.dtype.name in ("float32", "float64") and x.device.type == "cpu" \
            and all(t is None or (isinstance(t, Tensor) and t.dtype == x.dtype and t.device == x.device)
                    for t in (w, b)):
        with _tape.no_grad():
            y = fn(*args, **kwargs)          # checks the arguments, runs the C kernel
        cols = math.prod((ns,) if isinstance(ns, int) else tuple(ns))
        return _tape.record_computed("layer_norm", _LAYER_NORM_RULE, (x, w, b), y,
                                     {"cols": cols, "eps": float(a["eps"])})
    k = 1 if isinstance(ns, int) else len(tuple(ns))
    axes = tuple(range(x.ndim - k, x.ndim))
    mean = x.mean(axis=axes, keepdims=True)
    var = x.var(axis=axes, keepdims=True)
    y = (x - mean) * F.rsqrt(var + a["eps"])
    if w is not None:
        y = y * w
    if b is not None:
        y = y + b
    return y


def _layer_norm_rule(c, g):
    x, w, _ = c.inputs
    if g.dtype != x.dtype:
        g = g.astype(x.dtype)
    gx, gw, gb = _nn.layer_norm_backward_rows(x, w, g, c.params["cols"], c.params["eps"],
                                              c.needs(1), c.needs(2))
    if gw is not None:
        gw = gw.reshape(c.input_shape(1))
    if gb is not None:
        gb = gb.reshape(c.input_shape(2))
    return (gx if c.needs(0) else None), gw, gb


_LAYER_NORM_RULE = Rule(_layer_norm_rule, True)


def _batch_norm_fn(fn, args, kwargs):
    """F.batch_norm in training takes one C pass per channel (cpu/train.c)
    for float32/float64 x whose weight and bias are of its dtype and device:
    under a recording manager that call runs unrecorded (it updates the
    running statistics as always) and is recorded as one ``batch_norm`` node
    whose backward is one C pass (nn.batch_norm_backward, the statistics
    recomputed from x). Inference, the ``inplace=False`` form, other dtypes
    and devices without the kernel run as the composite, each op recorded."""
    from mgtrace.autodiff import _tape
    a = _bind(fn, args, kwargs)
    x, w, b = a["x"], a["weight"], a["bias"]
    fast = a["training"] and a["inplace"] and isinstance(x, Tensor) and x.ndim >= 2 \
        and x.dtype.name in ("float32", "float64") \
        and all(t is None or (isinstance(t, Tensor) and t.dtype == x.dtype and t.device == x.device)
                for t in (w, b)) and _nn.has_batch_norm_train(x)
    if not fast:
        return fn(*args, **kwargs)
    with _tape.no_grad():
        y = fn(*args, **kwargs)          # checks the arguments, runs the C kernel
    return _tape.record_computed("batch_norm", _BATCH_NORM_RULE, (x, w, b), y, {"eps": float(a["eps"])})


def _batch_norm_rule(c, g):
    x, w, _ = c.inputs
    if g.dtype != x.dtype:
        g = g.astype(x.dtype)
    gx, gw, gb = _nn.batch_norm_backward(x, w, g, c.params["eps"], c.needs(0), c.needs(1), c.needs(2))
    if gw is not None:
        gw = gw.reshape(c.input_shape(1))
    if gb is not None:
        gb = gb.reshape(c.input_shape(2))
    return gx, gw, gb


_BATCH_NORM_RULE = Rule(_batch_norm_rule, True)


def _local_response_norm_fn(fn, args, kwargs):
    """F.local_response_norm's C pass (kernels/cpu/lrn.c) is no op: under a
    recording manager it runs as its composite (square, pad, shifted sums,
    pow, div), each op recorded."""
    from mgtrace.autodiff import _tape
    from mgtrace.functional import nn as _fnn
    with _tape.no_grad():
        fn(*args, **kwargs)              # checks the arguments as the call would
    a = _bind(fn, args, kwargs)
    return _fnn._lrn_composed(a["inp"], int(a["kernel_size"]), float(a["k"]), float(a["alpha"]),
                              float(a["beta"]))


def _attention_fn(fn, args, kwargs):
    """F.attention under a recording manager: float32 CPU operands run the
    training forward (nn.attention_train: the output and the probabilities,
    which the node keeps for its backward instead of recomputing them, one
    [B, H, Sq, Sk] tensor until then), recorded as one ``attention`` node;
    other operands, and operands no gradient flows through (no
    probabilities worth keeping), as F.attention records them (the core
    op, or the sequence for integer ones)."""
    from mgtrace.autodiff import _tape
    from mgtrace.functional.fused import _attention_scale
    a = _bind(fn, args, kwargs)
    q, k, v, mask = a["q"], a["k"], a["v"], a["mask"]
    if not _tape._no_grad.depth and _tape.edge_of(a["scale"]) is not None:
        # read as a number below: a gradient for it would be dropped without a word
        raise AutodiffError(
            "attention: scale is a Tensor a recording GradManager tracks (attached, or computed "
            "from one), but attention reads it as a number and gives it no gradient; to learn "
            "it, scale q instead (F.attention(q * s, k, v)), or pass s.detach() for a constant")
    scale = _attention_scale(a["scale"])     # a number or a 0-d array or Tensor, read once
    if all(isinstance(t, Tensor) and t.dtype.name == "float32" and t.device.type == "cpu"
           for t in (q, k, v)) and (mask is None or (isinstance(mask, Tensor) and mask.dtype.name == "float32"
                                                      and mask.device.type == "cpu")) \
            and not _tape._no_grad.depth and any(_tape.edge_of(t) for t in (q, k, v, mask)):
        try:
            y, probs = _nn.attention_train(q, k, v, mask, scale)
        except NoKernelError:
            return fn(*args, **kwargs)
        return _tape.record_computed("attention", RULES["attention"], (q, k, v, mask), y,
                                     {"scale": scale, "probs": probs})
    return fn(*args, **kwargs)


def _linear_act_fn(fn, args, kwargs):
    """F.linear_act's fused bias-and-activation kernel is no op: recorded
    as F.linear followed by the activation."""
    from mgtrace.functional import fused
    a = _bind(fn, args, kwargs)
    return fused._apply_act(F.linear(a["x"], a["weight"], a["bias"]), a["act"])


def _linear_add_layer_norm_fn(fn, args, kwargs):
    """F.linear_add_layer_norm's fused kernel is no op: recorded as its
    sequence (F.linear, +, F.layer_norm)."""
    from mgtrace.functional import fused
    a = _bind(fn, args, kwargs)
    return fused._linear_add_layer_norm_unfused(a["x"], a["weight"], a["bias"], a["residual"],
                                                a["ln_weight"], a["ln_bias"], float(a["eps"]))


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
        "cumprod": Rule(_cumprod_rule, True),
        "sort": Rule(_sorted_rule, False, True),
        "topk": Rule(_sorted_rule, False, True),
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
        "conv3d": Rule(_conv3d_rule, True),
        "conv_transpose3d": Rule(_conv_transpose3d_rule, True),
        "lstm_cell": Rule(_lstm_cell_rule, True),
        "rnn_cell": Rule(_rnn_cell_rule, True, True),
        "conv2d_act": Rule(_conv2d_act_rule, True),
        "conv2d_nchwc": Rule(_conv2d_nchwc_rule, True),
        "conv2d_nchwc_pw_dw": Rule(_pw_dw_rule, True),
        "conv2d_nchwc_pw_dw_pw": Rule(_pw_dw_pw_rule, True),
        "to_nchwc": Rule(lambda c, g: _nn.from_nchwc(g, c.input_shape(0)[1])),
        "from_nchwc": Rule(lambda c, g: _nn.to_nchwc(g)),
        "max_pool2d_nchwc": Rule(_max_pool2d_nchwc_rule, True),
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
FUNCTION_RULES = {"attention": _attention_fn, "layer_norm": _layer_norm_fn, "batch_norm": _batch_norm_fn,
                  "linear_act": _linear_act_fn, "local_response_norm": _local_response_norm_fn,
                  "linear_add_layer_norm": _linear_add_layer_norm_fn}
