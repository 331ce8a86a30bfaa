"""Composite fallbacks: an op written in other core ops, run when a device
has no kernel of its own for it (op_table.py's ``fallback`` column names
the function here). Each gives the fused kernel's values up to rounding.

Pure Python over the core's public ops, so it runs on any device whose
backend has those ops (matmul, softmax, the elementwise ones).
"""

__all__ = ["attention", "conv3d", "conv_transpose3d", "lstm_cell", "rnn_cell"]


def attention(q, k, v, mask, scale):
    """``softmax(q @ k^T * scale + mask) @ v`` over the last axis, q [B, H,
    Sq, D], k [B, H, Sk, D], v [B, H, Sk, Dv], mask None or broadcast to [B,
    H, Sq, Sk] (already checked by the caller); [B, H, Sq, Dv] in q's dtype.
    Raises NoKernelError where the device lacks matmul or softmax too."""
    from mgtrace._core import linalg, reduce
    s = linalg.matmul(q, k.transpose((0, 1, 3, 2))) * float(scale)
    if mask is not None:
        s = s + mask
    return linalg.matmul(reduce.softmax(s, -1), v)


def _fold_depth(x):
    """[N, C, D, H, W] -> [N * D, C, H, W]"""
    n, c, d, h, w = x.shape
    return x.transpose((0, 2, 1, 3, 4)).reshape((n * d, c, h, w))


def _unfold_depth(y, n, d):
    """[N * D, O, H, W] -> [N, O, D, H, W]"""
    _, o, h, w = y.shape
    return y.reshape((n, d, o, h, w)).transpose((0, 2, 1, 3, 4))


def _triples(fn, *named):
    from mgtrace._core import args as A
    return [A.ntuple(fn, name, v, 3, lo) for name, v, lo in named]


def conv3d(x, weight, bias, stride, padding, dilation, groups):
    """conv3d as conv2d per kernel depth tap: tap k is one conv2d over every
    output depth at once (the depth folded into the batch), the taps
    summed. x [N, C, D, H, W], weight [O, C/groups, KD, KH, KW], bias [O] or
    None; [N, O, OD, OH, OW]. ValueError for 5-d shapes that are not one
    conv3d (the rest as conv2d's)."""
    from mgtrace._core import nn
    (sd, sh, sw), (pd, ph, pw), (dd, dh, dw) = _triples(
        "conv3d", ("stride", stride, 1), ("padding", padding, 0), ("dilation", dilation, 1))
    if x.ndim != 5 or weight.ndim != 5:
        raise ValueError(f"conv3d: expected 5-D x and weight, got shapes {x.shape} and {weight.shape}")
    n, d = x.shape[0], x.shape[2]
    o, kd = weight.shape[0], weight.shape[2]
    od = (d + 2 * pd - dd * (kd - 1) - 1) // sd + 1
    if od < 1:
        raise ValueError(f"conv3d: the kernel depth {kd} (dilation {dd}) is larger than the "
                         f"padded input depth {d + 2 * pd}")
    if pd:
        x = nn.pad(x, ((0, 0), (0, 0), (pd, pd), (0, 0), (0, 0)), "constant", 0.0)
    out = None
    for k in range(kd):
        xs = x[:, :, k * dd:k * dd + (od - 1) * sd + 1:sd]                  # [N, C, OD, H, W]
        y = nn.conv2d(_fold_depth(xs), weight[:, :, k], None, (sh, sw), (ph, pw), (dh, dw), groups)
        out = y if out is None else out + y
    out = _unfold_depth(out, n, od)
    return out if bias is None else out + bias.reshape((1, o, 1, 1, 1))


def conv_transpose3d(x, weight, bias, stride, padding, output_padding, dilation, groups):
    """conv_transpose3d as conv_transpose2d per kernel depth tap over every
    input depth at once, each result spread to its output depths (stride)
    and summed, then cropped by the depth padding. x [N, C, D, H, W], weight
    [C, O/groups, KD, KH, KW], bias [O] or None; [N, O, OD, OH, OW]."""
    from mgtrace._core import nn, index
    (sd, sh, sw), (pd, ph, pw), (opd, oph, opw), (dd, dh, dw) = _triples(
        "conv_transpose3d", ("stride", stride, 1), ("padding", padding, 0),
        ("output_padding", output_padding, 0), ("dilation", dilation, 1))
    if x.ndim != 5 or weight.ndim != 5:
        raise ValueError(f"conv_transpose3d: expected 5-D x and weight, got shapes {x.shape} and "
                         f"{weight.shape}")
    n, d = x.shape[0], x.shape[2]
    o, kd = weight.shape[1] * groups, weight.shape[2]
    full = (d - 1) * sd + dd * (kd - 1) + 1 + opd          # output depth before the crop
    od = full - 2 * pd
    if od < 1:
        raise ValueError(f"conv_transpose3d: padding {pd} leaves no output depth ({full} - 2 * {pd})")
    xf = _fold_depth(x)
    out = None
    for k in range(kd):
        y = nn.conv_transpose2d(xf, weight[:, :, k], None, (sh, sw), (ph, pw), (oph, opw),
                                (dh, dw), groups)
        y = _unfold_depth(y, n, d)                                          # [N, O, D, OH, OW]
        if sd > 1:        # input depth i lands at output depth i * sd: zeros between
            zeros = y * 0.0
            y = index.stack([y] + [zeros] * (sd - 1), 3)
            y = y.reshape(y.shape[:2] + (d * sd,) + y.shape[4:])[:, :, :(d - 1) * sd + 1]
        before = k * dd
        after = full - before - y.shape[2]
        y = nn.pad(y, ((0, 0), (0, 0), (before, after), (0, 0), (0, 0)), "constant", 0.0)
        out = y if out is None else out + y
    out = out[:, :, pd:pd + od]
    return out if bias is None else out + bias.reshape((1, o, 1, 1, 1))


def transpose3d_as_conv3d(x, weight, bias, padding, groups):
    """conv_transpose3d at stride 1 and dilation 1 (no output_padding then)
    as the conv3d it equals: the weight [C, O/groups, KD, KH, KW] regrouped
    to [O, C/groups, ...] and flipped along the three kernel axes, padding
    K - 1 - p per axis (each p <= K - 1, checked by the caller). Not a
    device fallback: nn.conv_transpose3d's choice on the CPU, where conv3d's
    own policy (GEMM per tap, or conv2d's Winograd per depth tap) measured
    about twice as fast as the col2vol kernel at stride 1."""
    from mgtrace._core import nn
    c, og, kd, kh, kw = weight.shape
    w = weight.reshape((groups, c // groups, og, kd, kh, kw)).transpose((0, 2, 1, 3, 4, 5))
    w = w.reshape((groups * og, c // groups, kd, kh, kw))[:, :, ::-1, ::-1, ::-1]
    pd, ph, pw = padding
    return nn.conv3d(x, w, bias, 1, (kd - 1 - pd, kh - 1 - ph, kw - 1 - pw), 1, groups)


def _cell_gates(gx, h, w_hh, b_hh):
    from mgtrace._core import linalg
    g = gx + linalg.matmul(h, w_hh.transpose((1, 0)))
    return g if b_hh is None else g + b_hh


def lstm_cell(gx, h, c, w_hh, b_hh):
    """One LSTM step in core ops: gates = gx + b_hh + h @ w_hh^T, then
    (torch.nn's order i, f, g, o) c' = sigmoid(f) c + sigmoid(i) tanh(g),
    h' = sigmoid(o) tanh(c'). Shapes as nn.lstm_cell's (checked there);
    returns (h', c')."""
    from mgtrace._core.dispatch import unary_ops as U
    g = _cell_gates(gx, h, w_hh, b_hh)
    hid = c.shape[1]
    i, f, gg, o = (g[:, k * hid:(k + 1) * hid] for k in range(4))
    c2 = U["sigmoid"](f) * c + U["sigmoid"](i) * U["tanh"](gg)
    return U["sigmoid"](o) * U["tanh"](c2), c2


def rnn_cell(gx, h, w_hh, b_hh, nonlinearity):
    """One simple-RNN step in core ops: act(gx + b_hh + h @ w_hh^T), act
    tanh or relu."""
    from mgtrace._core.dispatch import unary_ops as U
    return U[nonlinearity](_cell_gates(gx, h, w_hh, b_hh))
