"""Passes that merge a layer with what follows it.

- ``FuseConvBn`` (MegEngine's): ``bn(conv(x))`` with an inference-mode
  BatchNorm2d becomes ``conv'(x)``, the BatchNorm folded into the conv's
  weight and bias: ``w' = w * s``, ``b' = (b - mean) * s + beta`` with
  ``s = gamma / sqrt(var + eps)`` per output channel.
- ``BackwardFoldScale`` (MegEngine's): ``conv(x) * c`` (or ``linear(x) *
  c``, or either through a ReLU when every ``c > 0``) with a constant ``c``
  that is a scalar or one value per output channel becomes ``conv'(x)``,
  ``c`` folded into the weight and bias.
- ``FuseConvAct``: ``act(conv2d(x))`` for act in ReLU, ReLU6, SiLU,
  Hardswish, Sigmoid, GELU becomes one ``F.conv2d_act`` call (the activation
  runs in the convolution's epilogue), and so does ``act(conv2d(x) + r)``
  with a tensor ``r`` of the conv's output shape and dtype (a residual
  block's shortcut, added in the epilogue too); ``conv2d(x) + r`` without
  an activation (MobileNetV2's linear bottleneck) becomes a ``conv2d_act``
  with ``act="none"``.
- ``FuseLinearAct``: ``act(linear(x))`` becomes one ``F.linear_act`` call.
- ``FuseAttention``: ``softmax(matmul(q, k, transpose_b=True) * scale +
  mask, axis=-1)`` followed by ``matmul(..., v)`` (the scale and the mask
  optional) on float32 [B, H, S, D] tensors becomes one ``F.attention``
  call (run EliminateIdentity first so that an inference Dropout between
  the softmax and the product does not hide the pattern).

Each fuses only where the intermediate value has no other user (not
another expr, not the graph's result, not a watch point), and no expr with
a side effect (an in-place write) runs between the layer and the
activation or add that the fused call replaces: a conv whose output is also
read elsewhere, or whose input is written in place before its activation,
stays as it is.

Folding (FuseConvBn, BackwardFoldScale) gives the layer new Parameter
objects holding the folded values; the old ones are never written, so
another module holding the same Parameter (tied weights) still computes
with the original. A layer is folded only where the call being fused is
the only reader of the layer and its weight and bias
(:meth:`~mgtrace.traced_module.passes.util.StateUses.may_rewrite`): a
module called twice (a shared submodule, one held under two names), one
whose weight another expr reads (``F.conv2d(x, self.conv.weight)``,
``self.alias.weight``), or whose tensors the forward writes into, is
skipped and computes as before. The values folded in (the BatchNorm's
statistics, the scale) must not be written by the forward either, and
nothing is ever folded from a BatchNorm in training mode (whose batch
statistics change every call). FuseConvAct, FuseLinearAct and
FuseAttention rewrite no parameter: the fused call reads the same tensors.

The matchers they use live in ``match.py``. FuseConvAct and FuseLinearAct
were tried as :func:`~mgtrace.traced_module.replace_pattern` patterns
(``F.relu(F.linear(x, w, b))`` -> ``F.linear_act(x, w, b, act="relu")``)
and kept as matchers: a pattern records calls of functions only, so the
module forms (``self.act(self.fc(x))``, what models write) never match; it
is recorded on shapeless placeholders, which ``F.linear`` and ``F.conv2d``
refuse (their argument checks need a 2-d / 4-d weight); and each
activation and argument spelling would be one more pattern, where one
matcher reads them all and also checks what a pattern cannot (no in-place
write between the layer and its activation, the residual add).
"""
import numpy as np

import mgtrace.functional as F
import mgtrace.module as M
from mgtrace._core import tensor
from mgtrace.module.parameter import Parameter
from mgtrace.traced_module.passes.match import (ADD, activation, bound_args, conv_call,
                                                conv_module, float64, is_function, linear_call,
                                                module_call, residual_add, scaled_operand,
                                                side_effect_between, sole_user)
from mgtrace.traced_module.passes.util import StateUses, graphs_of

__all__ = ["fuse_conv_bn", "backward_fold_scale", "fuse_conv_act", "fuse_linear_act",
           "fuse_attention"]





def _set_weights(mod, weight, bias):
    """Give ``mod`` new float64-computed weight and bias, in its weight's dtype."""
    dt = mod.weight.dtype.name
    mod.weight = Parameter(tensor(weight.astype(dt)))
    mod.bias = Parameter(tensor(bias.astype(dt)))


def _channel_scale(c, channels, axis, ndim):
    """A constant ``c`` as one float64 value per channel ([channels]) when it
    broadcasts along ``axis`` only (a scalar, or ones except ``channels``
    there), else None."""
    if isinstance(c, (int, float)):
        return np.full(channels, float(c))
    a = float64(c)
    if a.size == 1 and a.ndim <= ndim:
        return np.full(channels, float(a.reshape(())))
    if a.ndim > ndim:
        return None
    shape = (1,) * (ndim - a.ndim) + a.shape
    if shape[axis] != channels or any(s != 1 for i, s in enumerate(shape) if i != axis):
        return None
    return a.reshape(channels)


# ------------------------------------------------------------------ FuseConvBn

def fuse_conv_bn(tm):
    """Fold each inference-mode BatchNorm2d that follows a Conv2d into the
    conv (see the module docstring): the conv gets new Parameters, and a
    conv with another reader (a second call, its module or weight read
    elsewhere, a tensor the forward writes) is skipped. Returns the number
    of folds."""
    uses = StateUses(tm)
    done = 0
    for g in list(graphs_of(tm)):
        for e in list(g._exprs):
            bn = module_call(e, M.BatchNorm2d)
            if bn is None or bn.training or bn.running_mean is None or bn.running_var is None \
                    or len(e.args) != 2 or e.kwargs:
                continue
            y = e.args[1]
            conv = conv_module(y.expr) if y.expr is not None else None
            if conv is None or sole_user(y) is not e or not uses.may_rewrite(conv, bn) \
                    or conv.weight.dtype.name not in ("float32", "float64"):
                continue
            s = 1.0 / np.sqrt(float64(bn.running_var) + bn.eps)
            if bn.weight is not None:
                s = s * float64(bn.weight)
            shift = -float64(bn.running_mean) * s
            if bn.bias is not None:
                shift = shift + float64(bn.bias)
            b = float64(conv.bias) if conv.bias is not None else 0.0
            _set_weights(conv, float64(conv.weight) * s.reshape(-1, 1, 1, 1), b * s + shift)
            g.replace_node({e.outputs[0]: y})
            done += 1
        g.compile()
    return done


# ------------------------------------------------------------ BackwardFoldScale


def backward_fold_scale(tm):
    """Fold constant scales into the Conv2d or Linear that produces the
    scaled value (see the module docstring): new Parameters, and only for a
    layer the fused call alone reads, and a scale the forward does not
    write. Returns the number of folds."""
    uses = StateUses(tm)
    done = 0
    for g in list(graphs_of(tm)):
        for e in list(g._exprs):
            if e.top_graph is not g or not e.outputs:
                continue
            hit = scaled_operand(e, uses)
            if hit is None:
                continue
            y, c = hit
            src = y.expr
            through_relu = None
            act = activation(src) if src is not None else None
            if act is not None and act[0] == "relu" and sole_user(y) is e:
                through_relu, y = src, act[1]
                src = y.expr
            mod = module_call(src, M.Conv2d) or module_call(src, M.Linear) if src is not None else None
            if mod is None or not uses.may_rewrite(mod) or sole_user(y) is not (through_relu or e):
                continue
            if isinstance(mod, M.Conv2d) and conv_module(src) is None:
                continue
            out = mod.weight.shape[0]
            if isinstance(mod, M.Linear) and (len(src.args) != 2 or src.kwargs):
                continue
            z, layer_out = e.outputs[0], (through_relu or src).outputs[0]
            if z.shape is None or z.shape != layer_out.shape or z.dtype != layer_out.dtype:
                continue      # the scale broadcasts or promotes the value
            ndim = len(z.shape)
            axis = 1 if isinstance(mod, M.Conv2d) else ndim - 1
            s = _channel_scale(c, out, axis, ndim)
            if s is None or (through_relu is not None and not (s > 0).all()):
                continue
            w = float64(mod.weight)
            b = float64(mod.bias) if mod.bias is not None else np.zeros(out)
            _set_weights(mod, w * s.reshape((-1,) + (1,) * (w.ndim - 1)), b * s)
            g.replace_node({e.outputs[0]: (through_relu or src).outputs[0]})
            done += 1
        g.compile()
    return done


# --------------------------------------------------------------- FuseConvAct


def _fuse_act(tm, match_layer, fused, what, residual=False):
    done = 0
    for g in list(graphs_of(tm)):
        taken = set()           # residual adds now inside a fused call
        for e in list(g._exprs):
            act = activation(e) if e.top_graph is g else None
            if act is None:
                continue
            name, y = act
            if y.expr is None or sole_user(y) is not e:
                continue
            call, extra, layer = match_layer(y.expr), {}, y.expr
            if call is None and residual:
                hit = residual_add(y, match_layer)
                if hit is not None:
                    call, extra, layer = hit[0], {"residual": hit[1]}, hit[2]
            if call is None or side_effect_between(g, layer, e):
                continue
            if extra:
                taken.add(id(y.expr))
            with g.insert_exprs(e):
                new = fused(*call, act=name, **extra)
            g.replace_node({e.outputs[0]: new})
            done += 1
        if residual:
            done += _fuse_residual_adds(g, match_layer, fused, taken)
        if done:
            g.compile()
    return done


def _fuse_residual_adds(g, match_layer, fused, taken):
    """``layer(x) + r`` with no activation after it (MobileNetV2's linear
    bottleneck) to one fused call with ``act="none"``; skips the adds of
    ``taken`` (ids of adds the activation fusions consumed)."""
    done = 0
    for e in list(g._exprs):
        if e.top_graph is not g or id(e) in taken or len(e.outputs) != 1:
            continue
        hit = residual_add(e.outputs[0], match_layer)
        if hit is None or side_effect_between(g, hit[2], e):
            continue
        with g.insert_exprs(e):
            new = fused(*hit[0], act="none", residual=hit[1])
        g.replace_node({e.outputs[0]: new})
        done += 1
    return done


def fuse_conv_act(tm):
    """``act(conv2d(x))`` to ``F.conv2d_act(x, ..., act=...)``; returns the
    number of fusions."""
    return _fuse_act(tm, conv_call, F.conv2d_act, "conv2d", residual=True)


def fuse_linear_act(tm):
    """``act(linear(x))`` to ``F.linear_act(x, weight, bias, act=...)``;
    returns the number of fusions."""
    return _fuse_act(tm, linear_call, F.linear_act, "linear")


# ------------------------------------------------------------ FuseAttention

def _matmul_args(e, transpose_b):
    """``(a, b)`` of ``F.matmul(a, b, transpose_b=transpose_b)``, else None."""
    if not is_function(e, F.matmul):
        return None
    a = bound_args(e)
    if a is None or a["transpose_a"] or bool(a["transpose_b"]) != transpose_b:
        return None
    return a["a"], a["b"]


def _softmax_input(e):
    if not is_function(e, F.softmax):
        return None
    a = bound_args(e)
    x = a["x"] if a is not None else None
    if x is None or getattr(x, "shape", None) is None or a["axis"] not in (-1, len(x.shape) - 1):
        return None
    return x


def _mask_add(e):
    """``[(scores, mask), ...]``: the ways to read ``e`` as scores + mask."""
    if e.kind == "call_method" and e.method in ADD and len(e.args) == 2:
        a, b = e.args
    elif is_function(e, F.add):
        args = bound_args(e)
        if args is None or len(args) != 2:
            return []
        a, b = args.values()
    else:
        return []
    return [(x, y) for x, y in ((a, b), (b, a)) if getattr(x, "kind", None) == "tensor"
            and getattr(y, "kind", None) == "tensor"]


def _scores(s):
    """``(q, k, scale, matmul expr)`` when node ``s`` is ``matmul(q, k,
    transpose_b=True)`` times a Python number (or divided by one, or not
    scaled), each step's value used once."""
    e, scale = s.expr, 1.0
    hit = scaled_operand(e) if e is not None else None
    if hit is not None:
        y, c = hit
        if not isinstance(c, (int, float)) or sole_user(y) is not e:
            return None
        e, scale = y.expr, float(c)
    qk = _matmul_args(e, True) if e is not None else None
    return None if qk is None else (qk[0], qk[1], scale, e)


def _f32_4d(*nodes):
    return all(getattr(n, "kind", None) == "tensor" and n.shape is not None and len(n.shape) == 4
               and n.dtype is not None and np.dtype(n.dtype) == np.float32 for n in nodes)


def fuse_attention(tm):
    """``softmax(q k^T * scale + mask) @ v`` to ``F.attention`` (see the
    module docstring); returns the number of fusions."""
    done = 0
    for g in list(graphs_of(tm)):
        for e in list(g._exprs):
            pv = _matmul_args(e, False) if e.top_graph is g else None
            if pv is None:
                continue
            p, v = pv
            t = _softmax_input(p.expr) if p.expr is not None and sole_user(p) is e else None
            if t is None or sole_user(t) is not p.expr:
                continue
            found = None
            for s, mask in _mask_add(t.expr) if t.expr is not None else []:
                if sole_user(s) is t.expr and s.shape == t.shape:
                    qks = _scores(s)
                    if qks is not None and _f32_4d(mask):
                        found = qks + (mask,)
                        break
            if found is None:
                qks = _scores(t)
                found = qks + (None,) if qks is not None else None
            if found is None:
                continue
            q, k, scale, first, mask = found
            if not _f32_4d(q, k, v) or not (q.shape[:2] == k.shape[:2] == v.shape[:2]):
                continue
            if side_effect_between(g, first, e):      # q, k or the mask written in between
                continue
            with g.insert_exprs(e):
                new = F.attention(q, k, v, mask, scale=scale)
            g.replace_node({e.outputs[0]: new})
            done += 1
        if done:
            g.compile()
    return done
