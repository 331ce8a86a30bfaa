"""Passes that merge a layer with what follows it.

- ``FuseConvBn`` (MegEngine's): ``bn(conv(x))`` with an inference-mode
  BatchNorm2d becomes ``conv'(x)``, the BatchNorm folded into the conv's
  weight and bias: ``w' = w * s``, ``b' = (b - mean) * s + beta`` with
  ``s = gamma / sqrt(var + eps)`` per output channel. The functional forms
  fold too, as in MegEngine's pass: an ``F.batch_norm(y, mean, var, gamma,
  beta, training=False)`` of constant statistics (tensor attributes, as a
  flattened graph reads a user subclass of Conv2d / BatchNorm2d) after an
  ``F.conv2d`` of a constant weight (or a Conv2d call, or a BatchNorm2d call
  after an ``F.conv2d``) becomes one ``F.conv2d`` of folded constants; the
  tensors it read are left as they were (tied weights keep computing with
  them).
- ``BackwardFoldScale`` (MegEngine's): ``conv(x) * c`` (or ``linear(x) *
  c``, or either through a ReLU when every ``c > 0``) with a constant ``c``
  that is a scalar or one value per output channel becomes ``conv'(x)``,
  ``c`` folded into the weight and bias. A scalar ``c`` (a number, a
  one-element constant, or an element of a tensor attribute picked by a
  constant index: ``x * self.scale[0]``) also travels further back, as in
  MegEngine's pass: through ReLUs, max pools and min/max reductions
  (c > 0), average pools, reshapes, constant indexing and the like, adds
  (into both branches; a constant added on the way is multiplied by c),
  concats (into every input), and further products by constants and negs
  on the way (which go too, their factor taken into c), into every
  Conv2d, Linear or ``F.conv2d`` it reaches; a value several exprs read
  takes the scale when all of them carry the same one (MegEngine's rule:
  ``x1 = r + 3; x2 = r + 4; (x1 + x2) * 3`` scales r, so its conv, by 3).
  ``-conv(x)`` is a product by -1. The product goes away only when every
  path ends in such a layer.
- ``FuseConvAct``: ``act(conv2d(x))`` for act in ReLU, ReLU6, SiLU,
  Hardswish, Sigmoid, GELU becomes one ``F.conv2d_act`` call (the activation
  runs in the convolution's epilogue), and so does ``act(conv2d(x) + r)``
  with a tensor ``r`` of the conv's output shape and dtype (a residual
  block's shortcut, added in the epilogue too); ``conv2d(x) + r`` without
  an activation (MobileNetV2's linear bottleneck) becomes a ``conv2d_act``
  with ``act="none"``.
- ``FuseLinearAct``: ``act(linear(x))`` becomes one ``F.linear_act`` call,
  and so does a linear layer with a bias and no activation (``act="none"``:
  the bias added in place into the GEMM's output).
- ``FuseLinearAddNorm``: ``layer_norm(linear(x) + r)`` over the last axis
  (a LayerNorm module or ``F.layer_norm``), with ``r`` a tensor of the
  linear output's shape and dtype, becomes one ``F.linear_add_layer_norm``
  call (BERT's post-LayerNorm residual: the bias, the add and the layer
  norm in one pass over the GEMM's output).
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
from mgtrace._core import Tensor, tensor
from mgtrace.module.parameter import Parameter
from mgtrace.traced_module.passes.match import (ADD, activation, bound_args, conv_call,
                                                conv_module, float64, is_function, linear_call,
                                                module_call, residual_add, scaled_operand,
                                                side_effect_between, sole_user)
from mgtrace.traced_module.expr import CallMethod
from mgtrace.traced_module.node import TensorNode
from mgtrace.traced_module.passes.match import DIV, MUL
from mgtrace.traced_module.passes.util import StateUses, float_node, graphs_of

__all__ = ["fuse_conv_bn", "backward_fold_scale", "fuse_conv_act", "fuse_linear_act",
           "fuse_linear_add_norm", "fuse_attention"]





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

def _bn_stats(e, uses):
    """``(input node, mean, var, gamma, beta, eps)`` of an inference batch
    norm over channel axis 1 that ``e`` computes with constant statistics:
    a BatchNorm2d call or ``F.batch_norm(..., training=False)`` (gamma and
    beta None when absent; arrays float64, one value per channel), else
    None."""
    bn = module_call(e, M.BatchNorm2d)
    if bn is not None:
        vals = (bn.running_mean, bn.running_var, bn.weight, bn.bias)
        if bn.training or bn.running_mean is None or bn.running_var is None \
                or len(e.args) != 2 or e.kwargs \
                or any(t is not None and id(t) in uses.written for t in vals):
            return None
        eps = bn.eps
        y = e.args[1]
    elif is_function(e, F.batch_norm):
        a = bound_args(e)
        if a is None or a["training"] is not False or not isinstance(a["eps"], (int, float)):
            return None
        vals = []
        for name in ("running_mean", "running_var", "weight", "bias"):
            v = a[name]
            c = None if v is None else uses.constant(v)
            if (v is not None and not isinstance(c, Tensor)) or (c is None and name.startswith("r")):
                return None
            vals.append(c)
        eps, y = float(a["eps"]), a["x"]
    else:
        return None
    if not isinstance(y, TensorNode) or len(e.outputs) != 1:
        return None
    arrays = [None if v is None else float64(v).reshape(-1) for v in vals]
    return (y, *arrays, eps)


def _fold_conv_bn_call(g, e, uses):
    """Fold the batch norm ``e`` into the F.conv2d or Conv2d call that
    produces its input, as one new ``F.conv2d`` of folded constants, when
    one of them is in functional form; True when the graph changed."""
    stats = _bn_stats(e, uses)
    if stats is None:
        return False
    y, mean, var, gamma, beta, eps = stats
    src = y.expr
    call = conv_call(src) if src is not None else None
    if call is None or sole_user(y) is not e or side_effect_between(g, src, e):
        return False
    x, w, b, stride, padding, dilation, groups = call
    w = uses.constant(w) if isinstance(w, TensorNode) else w
    b = uses.constant(b) if isinstance(b, TensorNode) else b
    if not isinstance(w, Tensor) or (b is not None and not isinstance(b, Tensor)) \
            or w.ndim != 4 or w.dtype.name not in ("float32", "float64") \
            or (isinstance(src, CallMethod) and not uses.may_rewrite(conv_module(src))):
        return False
    out = w.shape[0]
    if any(v is not None and v.size != out for v in (mean, var, gamma, beta)) \
            or (b is not None and b.size != out):
        return False
    s = 1.0 / np.sqrt(var + eps) * (gamma if gamma is not None else 1.0)
    shift = (beta if beta is not None else 0.0) - mean * s
    bias = (float64(b).reshape(-1) if b is not None else 0.0) * s + shift
    dt = w.dtype.name
    new_w = tensor((float64(w) * s.reshape(-1, 1, 1, 1)).astype(dt))
    new_b = tensor(bias.astype(dt))
    with g.insert_exprs(e):
        new = F.conv2d(x, new_w, new_b, stride=stride, padding=padding, dilation=dilation,
                       groups=groups)
    g.replace_node({e.outputs[0]: new})
    return True


def fuse_conv_bn(tm):
    """Fold each inference-mode BatchNorm2d that follows a Conv2d into the
    conv (see the module docstring): the conv gets new Parameters, and a
    conv with another reader (a second call, its module or weight read
    elsewhere, a tensor the forward writes) is skipped. Functional forms
    (``F.conv2d``, ``F.batch_norm``: a flattened graph's) become one
    ``F.conv2d`` of folded constants. Returns the number of folds."""
    uses = StateUses(tm)
    done = 0
    for g in list(graphs_of(tm)):
        for e in list(g._exprs):
            if e.top_graph is not g:
                continue
            if is_function(e, F.batch_norm) or (
                    module_call(e, M.BatchNorm2d) is not None and e.args[1:]
                    and getattr(e.args[1], "expr", None) is not None
                    and is_function(e.args[1].expr, F.conv2d)):
                if _fold_conv_bn_call(g, e, uses):
                    done += 1
                continue
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


def _fold_direct(g, e, uses):
    """``layer(x) * c`` (through one ReLU for c > 0) with c a scalar or one
    value per output channel: c folded into the Conv2d / Linear module's new
    Parameters. True when the graph changed."""
    hit = scaled_operand(e, uses)
    if hit is None:
        return False
    y, c = hit
    src = y.expr
    through_relu = None
    act = activation(src) if src is not None else None
    if act is not None and act[0] == "relu" and sole_user(y) is e:
        through_relu, y = src, act[1]
        src = y.expr
    mod = module_call(src, M.Conv2d) or module_call(src, M.Linear) if src is not None else None
    if mod is None or not uses.may_rewrite(mod) or sole_user(y) is not (through_relu or e):
        return False
    if isinstance(mod, M.Conv2d) and conv_module(src) is None:
        return False
    out = mod.weight.shape[0]
    if isinstance(mod, M.Linear) and (len(src.args) != 2 or src.kwargs):
        return False
    z, layer_out = e.outputs[0], (through_relu or src).outputs[0]
    if z.shape is None or z.shape != layer_out.shape or z.dtype != layer_out.dtype:
        return False      # the scale broadcasts or promotes the value
    ndim = len(z.shape)
    axis = 1 if isinstance(mod, M.Conv2d) else ndim - 1
    s = _channel_scale(c, out, axis, ndim)
    if s is None or (through_relu is not None and not (s > 0).all()):
        return False
    w = float64(mod.weight)
    b = float64(mod.bias) if mod.bias is not None else np.zeros(out)
    _set_weights(mod, w * s.reshape((-1,) + (1,) * (w.ndim - 1)), b * s)
    g.replace_node({e.outputs[0]: (through_relu or src).outputs[0]})
    return True


# ------------------------------------- BackwardFoldScale: through the graph

# ops a scalar scale passes through unchanged (s * f(x) == f(s * x)): the
# shape methods and functions; ReLU only for s > 0
_SHAPE_METHODS = ("reshape", "flatten", "transpose", "permute", "expand_dims", "squeeze")
_SHAPE_FUNCTIONS = (F.reshape, F.flatten, F.transpose, F.expand_dims, F.squeeze)
# pools: an average commutes with any scale, a maximum with a positive one
_POOL_MODULES = {M.AvgPool2d: False, M.AdaptiveAvgPool2d: False, M.MaxPool2d: True,
                 M.AdaptiveMaxPool2d: True}
_POOL_FUNCTIONS = ((F.avg_pool2d, False), (F.adaptive_avg_pool2d, False),
                   (F.max_pool2d, True), (F.adaptive_max_pool2d, True))


def _scalar(v):
    """v as a Python float when it is a number or holds one element."""
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return float(v)
    if isinstance(v, Tensor) and v.size == 1 and v.dtype.kind == "f":
        return float(float64(v).reshape(()))
    if isinstance(v, (np.ndarray, np.generic)) and v.size == 1 and v.dtype.kind == "f":
        return float(np.asarray(v).reshape(()))
    return None


def _const_scalar(v, uses):
    """A constant scalar operand: a number, a one-element constant tensor,
    or an element of a constant tensor picked by a constant index
    (``self.scale[0]``, as MegEngine models write it); else None."""
    c = _scalar(uses.constant(v))
    if c is not None or not isinstance(v, TensorNode):
        return c
    e = v.expr
    if isinstance(e, CallMethod) and e.method == "__getitem__" and len(e.args) == 2 \
            and not e.kwargs and isinstance(e.args[0], TensorNode):
        base, index = e.args
        t = uses.constant(base)
        if isinstance(t, Tensor) and _static_index(index):
            try:
                return _scalar(t.numpy()[index])
            except (IndexError, TypeError):
                return None
    return None


def _static_index(index):
    items = index if isinstance(index, tuple) else (index,)
    return all(i is None or i is Ellipsis or (isinstance(i, int) and not isinstance(i, bool))
               or (isinstance(i, slice) and all(p is None or isinstance(p, int)
                                                for p in (i.start, i.stop, i.step)))
               for i in items)


def _mul_scale(e, uses):
    """``(node, s)`` when ``e`` is ``node * s`` or ``node / (1 / s)`` with a
    constant scalar s (:func:`_const_scalar`), or ``-node`` (s = -1, as
    MegEngine's pass counts F.neg), else None."""
    if (isinstance(e, CallMethod) and e.method == "__neg__" and len(e.args) == 1) or \
            (is_function(e, F.neg) and len(e.args) + len(e.kwargs) == 1):
        node = e.args[0] if e.args else next(iter(e.kwargs.values()))
        return (node, -1.0) if isinstance(node, TensorNode) and float_node(node) else None
    if not (isinstance(e, CallMethod) and e.method in MUL + DIV and len(e.args) == 2
            and not e.kwargs):
        return None
    a, b = e.args
    pairs = ((a, b),) if e.method in DIV else ((a, b), (b, a))
    for node, c in pairs:
        if not isinstance(node, TensorNode) or not float_node(node):
            continue
        v = _const_scalar(c, uses)
        if v is None or (e.method in DIV and v == 0.0):
            continue
        return node, (1.0 / v if e.method in DIV else v)
    return None


def _readers_agree(node, s, user, pending):
    """Several exprs read ``node``: record that ``user`` wants it times s.
    None when they disagree (or node leaves the graph), False while some
    reader has not asked yet, True once every reader asked for s (then node
    itself may be scaled: MegEngine's pass folds where every user carries
    the same scale)."""
    if id(node) in node.graph._kept_ids() or not any(u is user for u in node.users):
        return None
    entry = pending.setdefault(id(node), [node, s, set()])
    if entry[1] != s:
        return None
    entry[2].add(id(user))
    return len(entry[2]) == len({id(u) for u in node.users})


def _plan(g, node, s, user, uses, actions, pending):
    """Collect in ``actions`` the rewrites ``(kind, obj, scale)`` that make
    ``node`` come out multiplied by scalar ``s`` where it is produced; False
    (nothing to do) when a branch cannot take the scale. A node several
    exprs read is entered once all of them asked for the same scale
    (``pending``: id -> [node, scale, ids of the readers that asked])."""
    e = node.expr
    if e is None or e.top_graph is not g or not float_node(node):
        return False
    if sole_user(node) is not user:
        agree = _readers_agree(node, s, user, pending)
        if not agree:
            return agree is not None        # False: the others are yet to ask
    mod = conv_module(e) or (module_call(e, M.Linear) if len(e.args) == 2 and not e.kwargs
                             else None)
    if mod is not None:
        if not uses.may_rewrite(mod) or mod.weight.dtype.name not in ("float32", "float64"):
            return False
        actions.append(("module", mod, s))
        return True
    inner = _mul_scale(e, uses)         # a product (or neg) on the way: it goes, s takes it in
    if inner is not None and e.outputs[0].shape == inner[0].shape and \
            e.outputs[0].dtype == inner[0].dtype:
        actions.append(("drop", e, None))
        return _plan(g, inner[0], s * inner[1], e, uses, actions, pending)
    if is_function(e, F.concat):        # every input scaled alike
        args = bound_args(e)
        parts = args.get("inps") if args else None
        return isinstance(parts, (list, tuple)) and len(parts) > 0 and \
            all(isinstance(x, TensorNode) for x in parts) and \
            len({id(x) for x in parts}) == len(parts) and \
            all(_plan(g, x, s, e, uses, actions, pending) for x in parts)
    if s > 0 and (is_function(e, F.max) or is_function(e, F.min) or (
            isinstance(e, CallMethod) and e.method in ("max", "min"))):
        first = e.args[0] if e.args else None      # a positive scale keeps the order
        return isinstance(first, TensorNode) and _plan(g, first, s, e, uses, actions, pending)
    if is_function(e, F.conv2d):
        call = conv_call(e)
        w = uses.constant(call[1]) if isinstance(call[1], TensorNode) else None
        b = call[2]
        if not isinstance(w, Tensor) or w.dtype.name not in ("float32", "float64") or \
                (b is not None and not isinstance(uses.constant(b), Tensor)):
            return False
        actions.append(("conv", e, s))
        return True
    act = activation(e)
    if act is not None:
        return act[0] == "relu" and s > 0 and _plan(g, act[1], s, e, uses, actions, pending)
    if len(e.outputs) != 1:
        return False
    pool = module_call(e)
    if type(pool) in _POOL_MODULES and len(e.args) == 2 and not e.kwargs:
        return (s > 0 or not _POOL_MODULES[type(pool)]) and \
            _plan(g, e.args[1], s, e, uses, actions, pending)
    for fn, positive in _POOL_FUNCTIONS:
        if is_function(e, fn):
            args = bound_args(e)
            first = next(iter(args.values())) if args else None
            return isinstance(first, TensorNode) and (s > 0 or not positive) and \
                _plan(g, first, s, e, uses, actions, pending)
    if isinstance(e, CallMethod) and e.method == "__getitem__" and len(e.args) == 2 \
            and isinstance(e.args[0], TensorNode) and _static_index(e.args[1]):
        return _plan(g, e.args[0], s, e, uses, actions, pending)
    if isinstance(e, CallMethod) and e.method in _SHAPE_METHODS and isinstance(e.args[0], TensorNode):
        return _plan(g, e.args[0], s, e, uses, actions, pending)
    if any(is_function(e, fn) for fn in _SHAPE_FUNCTIONS):
        args = bound_args(e)
        first = next(iter(args.values())) if args else None
        return isinstance(first, TensorNode) and _plan(g, first, s, e, uses, actions, pending)
    if isinstance(e, CallMethod) and e.method in ADD and len(e.args) == 2 and not e.kwargs:
        a, b = e.args
        if a is b:
            return False
        ca, cb = (None if not isinstance(x, TensorNode) else uses.constant(x) for x in (a, b))
        ca = a if isinstance(a, (int, float)) and not isinstance(a, bool) else ca
        cb = b if isinstance(b, (int, float)) and not isinstance(b, bool) else cb
        if ca is None and cb is None:            # node + node: both branches
            return all(isinstance(x, TensorNode) and _plan(g, x, s, e, uses, actions, pending)
                       for x in (a, b))
        if (ca is None) == (cb is None):
            return False
        x = a if ca is None else b
        if not isinstance(x, TensorNode):
            return False
        actions.append(("add", e, s))
        return _plan(g, x, s, e, uses, actions, pending)
    return False


def _scaled_conv(g, e, s, uses):
    """Replace the F.conv2d call ``e`` with one of weight and bias times s."""
    x, w, b, stride, padding, dilation, groups = conv_call(e)
    w, b = uses.constant(w), (uses.constant(b) if b is not None else None)
    dt = w.dtype.name
    new_w = tensor((float64(w) * s).astype(dt))       # computed outside the recording block
    new_b = None if b is None else tensor((float64(b) * s).astype(dt))
    with g.insert_exprs(e):
        new = F.conv2d(x, new_w, new_b, stride=stride, padding=padding, dilation=dilation,
                       groups=groups)
    g.replace_node({e.outputs[0]: new})


def _scaled_add(g, e, s, uses):
    """Replace ``node + c`` (``e``) with ``node + c * s``."""
    a, b = e.args
    node, c = (a, b) if isinstance(a, TensorNode) and uses.constant(a) is None else (b, a)
    v = uses.constant(c) if isinstance(c, TensorNode) else c
    v = v * s if isinstance(v, (int, float)) else tensor((float64(v) * s).astype(v.dtype.name))
    with g.insert_exprs(e):
        new = node + v
    g.replace_node({e.outputs[0]: new})


def _fold_through(g, e, uses):
    """``f(...) * s`` with a scalar s, where every path back from the product
    reaches a Conv2d, Linear or F.conv2d through ReLUs (s > 0), shape ops and
    adds (a constant added on the way is multiplied by s): s goes into
    those layers and the product goes away. True when the graph changed."""
    hit = _mul_scale(e, uses)
    if hit is None:
        return False
    y, s = hit
    z = e.outputs[0]
    if z.shape is None or z.shape != y.shape or z.dtype != y.dtype:
        return False
    actions, pending = [], {}
    if not _plan(g, y, s, e, uses, actions, pending) or \
            len({id(o) for _, o, _ in actions}) != len(actions) or \
            any(len(users) != len({id(u) for u in n.users}) for n, _, users in pending.values()):
        return False        # a branch that cannot take it, or a reader left out
    for kind, obj, scale in actions:
        if kind == "module":
            w = float64(obj.weight)
            b = float64(obj.bias) if obj.bias is not None else np.zeros(w.shape[0])
            _set_weights(obj, w * scale, b * scale)
        elif kind == "conv":
            _scaled_conv(g, obj, scale, uses)
        elif kind == "add":
            _scaled_add(g, obj, scale, uses)
        else:               # a product or neg on the way: its input stands for it
            g.replace_node({obj.outputs[0]: _mul_scale(obj, uses)[0]})
    y, _ = _mul_scale(e, uses)          # the node the product reads now
    g.replace_node({z: y})
    return True


def backward_fold_scale(tm):
    """Fold constant scales into the Conv2d, Linear or F.conv2d that
    produces the scaled value (see the module docstring): new Parameters or
    constants, and only for a layer the fused call alone reads, and a scale
    the forward does not write. Returns the number of folds."""
    uses = StateUses(tm)
    done = 0
    for g in list(graphs_of(tm)):
        for e in list(g._exprs):
            if e.top_graph is not g or not e.outputs:
                continue
            if _fold_direct(g, e, uses) or _fold_through(g, e, uses):
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
    """``act(linear(x))`` to ``F.linear_act(x, weight, bias, act=...)``, and
    a linear layer with a bias and no activation to ``act="none"`` (the bias
    added in place into the GEMM's output, not into a new tensor: BERT's
    query, key and value layers); returns the number of fusions."""
    done = _fuse_act(tm, linear_call, F.linear_act, "linear")
    for g in list(graphs_of(tm)):
        n = 0
        for e in list(g._exprs):
            call = linear_call(e) if e.top_graph is g and len(e.outputs) == 1 else None
            if call is None or call[2] is None:
                continue
            with g.insert_exprs(e):
                new = F.linear_act(*call, act="none")
            g.replace_node({e.outputs[0]: new})
            n += 1
        if n:
            g.compile()
        done += n
    return done


# -------------------------------------------------------- FuseLinearAddNorm

def _last_axis_layer_norm(e):
    """``(input node, weight, bias, eps)`` when ``e`` is a layer norm over
    its input's last axis alone (a LayerNorm module call or F.layer_norm),
    else None."""
    m = module_call(e, M.LayerNorm)
    if m is not None:
        if len(e.args) != 2 or e.kwargs:
            return None
        x, shape, w, b, eps = e.args[1], m.normalized_shape, m.weight, m.bias, m.eps
    elif is_function(e, F.layer_norm):
        a = bound_args(e)
        if a is None:
            return None
        x, shape, w, b, eps = a["x"], a["normalized_shape"], a["weight"], a["bias"], a["eps"]
    else:
        return None
    shape = tuple(shape) if isinstance(shape, (tuple, list)) else (shape,)
    if getattr(x, "kind", None) != "tensor" or x.shape is None or len(x.shape) == 0 or \
            len(shape) != 1 or shape[0] != x.shape[-1] or not isinstance(eps, (int, float)):
        return None
    return x, w, b, float(eps)


def _linear_no_act(e):
    """``(x, weight, bias)`` of a linear layer (linear_call's), or of an
    ``F.linear_act`` call with ``act="none"`` (FuseLinearAct's form of
    one), else None."""
    call = linear_call(e)
    if call is None and is_function(e, F.linear_act):
        a = bound_args(e)
        if a is not None and a["act"] == "none":
            call = (a["x"], a["weight"], a["bias"])
    return call


def fuse_linear_add_norm(tm):
    """``layer_norm(linear(x) + r)`` to ``F.linear_add_layer_norm(x, weight,
    bias, r, ln_weight, ln_bias, eps)``; returns the number of fusions."""
    done = 0
    for g in list(graphs_of(tm)):
        for e in list(g._exprs):
            hit = _last_axis_layer_norm(e) if e.top_graph is g and len(e.outputs) == 1 else None
            if hit is None:
                continue
            s, ln_w, ln_b, eps = hit
            if s.expr is None or sole_user(s) is not e:
                continue
            add = residual_add(s, _linear_no_act)
            if add is None or side_effect_between(g, add[2], e):
                continue
            (x, w, b), r = add[0], add[1]
            with g.insert_exprs(e):
                new = F.linear_add_layer_norm(x, w, b, r, ln_w, ln_b, eps=eps)
            g.replace_node({e.outputs[0]: new})
            done += 1
        if done:
            g.compile()
    return done


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
