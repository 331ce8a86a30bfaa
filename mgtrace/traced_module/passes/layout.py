"""``NCHWc``: run chains of convolutions in the NCHW16c layout.

Each float32 conv2d of a chain (a Conv2d call, ``F.conv2d`` or the
``F.conv2d_act`` of FuseConvAct) becomes an ``F.conv2d_nchwc`` call whose
output is NCHW16c (channels in blocks of 16, ``[N, ceil(C/16), H, W,
16]``), and reads its input in that layout when a converted conv made it.
The layout only changes where it pays: ``F.from_nchwc`` goes in front of
each other reader of a converted output (a pooling, a flatten, the graph's
result), ``F.to_nchwc`` in front of a residual that is not a converted
conv's output, and the first conv of a chain reads its NCHW input directly
(so a model's 3-channel first layer is not padded to 16). ONNX Runtime's
NCHWc transformer does the same on x86. On a 2-core Zen 5
(``python benchmarks/ab_passes.py``: the model optimized with and without
this pass, timed in alternation): MobileNetV2 batch 1 3.55 ms against 4.47
without it, ResNet-18 batch 1 10.4 against 11.3, batch 8 65.3 against 66.9.

Which convs: dense ones (groups 1) and depthwise ones (groups = channels
= output channels), float32, with static channel counts, that are part of
a chain. A conv stays as it is when neither its input comes from a
converted conv nor a converted conv reads its output (one lone conv would
only gain two conversions). A depthwise conv needs a converted producer
(its kernel reads NCHW16c only), and so does a max pooling, which then
joins the chain (``F.max_pool2d_nchwc``: ResNet's stem and pool stay
blocked). A global average pooling of a converted output becomes a mean
over the blocked planes, converted back after it (1/(H*W) of the
values). A graph with in-place writes is left alone. No parameter is
rewritten: the converted calls read the same weight tensors (the kernels
pack a copy, cached by the weight's storage and version), so other readers
of a weight see it as it was.

A dense 3x3 conv of stride 1 runs as Winograd in either layout where the
tiles are many enough (``conv2d_algorithm``, ``conv2d_nchwc_algorithm``).
One that conv2d runs with Winograd stays NCHW where conv2d_nchwc would
not (its direct kernel does 2.25-4x the multiply-adds), or would with
smaller tiles than conv2d's F(4x4, 3x3). Otherwise it goes NCHW16c, where
the transforms are whole-vector adds: on a 2-core Zen 5, ResNet-18
optimized took 6.7 ms at batch 1 and 47 ms at batch 8 against 8.7 and 69
with conv2d_nchwc's direct kernel only, the convs of 64 channels of 56x56
0.24 ms (F(4x4) in NCHW: 0.30) (``python
benchmarks/bench_nchwc_winograd.py``).

``FusePointwiseDepthwise`` (after NCHWc) then makes each converted
pointwise conv whose output only a depthwise conv reads, with that conv,
one ``F.conv2d_nchwc_pw_dw`` call: MobileNet's expanded tensors are never
written whole; and each of those whose output only a pointwise conv reads
(the block's projection), with that conv, one
``F.conv2d_nchwc_pw_dw_pw`` call.
"""
import mgtrace.functional as F
import mgtrace.module as M
from mgtrace._core import nn as _nn
from mgtrace.traced_module.graph import has_side_effect
from mgtrace.traced_module.node import TensorNode
from mgtrace.traced_module.passes.match import (bound_args, conv_call, is_function, module_call,
                                                sole_user)
from mgtrace.traced_module.passes.util import graphs_of

__all__ = ["convert_to_nchwc", "fuse_pointwise_depthwise"]


def _pair_ok(v):
    if isinstance(v, int) and not isinstance(v, bool):
        return True
    return isinstance(v, (tuple, list)) and len(v) == 2 and all(
        isinstance(i, int) and not isinstance(i, bool) for i in v)


def _is_pair(v, want):
    """Whether ``v`` is ``want`` as an int or as an (h, w) pair."""
    return _pair_ok(v) and (v == want if isinstance(v, int) else tuple(v) == (want, want))


def _shape(v):
    """The static shape of a node or tensor operand (None when unknown)."""
    shape = getattr(v, "shape", None)
    if shape is None or not all(isinstance(d, int) for d in shape):
        return None
    return tuple(shape)


def _f32(v):
    dt = getattr(v, "dtype", None)
    return dt is not None and getattr(dt, "name", str(dt)) == "float32"


def _conv_info(e):
    """The arguments of the float32 conv2d that ``e`` computes when the
    NCHW16c kernels take it, else None."""
    if len(e.outputs) != 1 or not isinstance(e.outputs[0], TensorNode):
        return None
    if is_function(e, F.conv2d_act):
        a = bound_args(e)
        if a is None:
            return None
        info = {k: a[k] for k in ("x", "weight", "bias", "stride", "padding", "dilation", "groups",
                                  "act", "residual")}
    else:
        call = conv_call(e)
        if call is None:
            return None
        info = dict(zip(("x", "weight", "bias", "stride", "padding", "dilation", "groups"), call),
                    act="none", residual=None)
    x, w, y, r = info["x"], info["weight"], e.outputs[0], info["residual"]
    xs, ws, ys = _shape(x), _shape(w), _shape(y)
    if not (isinstance(x, TensorNode) and xs and ws and ys and len(xs) == len(ws) == len(ys) == 4):
        return None
    if not all(_f32(v) for v in (x, w, y) + ((info["bias"],) if info["bias"] is not None else ())):
        return None
    if r is not None and not (isinstance(r, TensorNode) and _f32(r) and _shape(r) == ys):
        return None
    if not all(_pair_ok(info[k]) for k in ("stride", "padding", "dilation")):
        return None
    groups, c, o = info["groups"], xs[1], ws[0]
    if not isinstance(groups, int) or isinstance(info["act"], TensorNode):
        return None
    if groups != 1 and not (groups == c == o and ws[1] == 1):
        return None
    if groups == 1 and _keeps_nchw(xs, ws, info):
        return None
    info.update(pool=False, needs_feed=groups != 1, out_channels=o)
    return info


def _keeps_nchw(xs, ws, info):
    """Whether a dense conv of these shapes runs faster in NCHW: where
    conv2d runs it as Winograd and conv2d_nchwc would not, or would with
    smaller tiles (see the module's text)."""
    args = (xs, ws, info["stride"], info["padding"], info["dilation"])
    nchw = _nn.conv2d_algorithm(*args, cached=True)
    if not nchw.startswith("winograd"):
        return False
    nchwc = _nn.conv2d_nchwc_algorithm(*args)
    return nchwc == "direct" or nchw == "winograd4" and nchwc == "winograd"


def _pool_info(e):
    """The arguments of a float32 max_pool2d that ``e`` computes (an
    F.max_pool2d or a MaxPool2d call, no indices), else None."""
    if len(e.outputs) != 1 or not isinstance(e.outputs[0], TensorNode):
        return None
    m = module_call(e, M.MaxPool2d)
    if m is not None and len(e.args) == 2 and not e.kwargs and not m.return_indices:
        info = {"x": e.args[1], "kernel_size": m.kernel_size, "stride": m.stride, "padding": m.padding,
                "dilation": m.dilation, "ceil_mode": m.ceil_mode}
    elif is_function(e, F.max_pool2d):
        a = bound_args(e)
        if a is None or a["return_indices"] is not False:
            return None
        info = {k: a[k] for k in ("x", "kernel_size", "stride", "padding", "dilation", "ceil_mode")}
    else:
        return None
    x, xs = info["x"], _shape(info["x"])
    if not (isinstance(x, TensorNode) and xs and len(xs) == 4 and _f32(x) and _f32(e.outputs[0])):
        return None
    if not all(_pair_ok(info[k]) for k in ("kernel_size", "padding", "dilation")):
        return None
    if not (info["stride"] is None or _pair_ok(info["stride"])) or not isinstance(info["ceil_mode"], bool):
        return None
    # with dilation a window can hold no input: -inf in the unused channels too,
    # which the next conv's zero weights would turn to NaN
    if not _is_pair(info["dilation"], 1):
        return None
    info.update(pool=True, residual=None, needs_feed=True, out_channels=xs[1])
    return info


def _reads_blocked(info, node):
    """Whether a converted conv reads ``node`` as its input or residual."""
    return info["x"] is node or info["residual"] is node


def _chains(g):
    """``{id(expr): info}`` of the convs of graph ``g`` to convert: the
    candidates, less those outside a chain, until none changes."""
    cand = {}
    for e in g._exprs:
        if e.top_graph is g:
            info = _conv_info(e) or _pool_info(e)
            if info is not None:
                cand[id(e)] = (e, info)
    changed = True
    while changed:
        changed = False
        for k, (e, info) in list(cand.items()):
            src = info["x"].expr
            fed = src is not None and id(src) in cand
            feeds = any(id(u) in cand and _reads_blocked(cand[id(u)][1], e.outputs[0])
                        for u in e.outputs[0].users)
            if (info["needs_feed"] and not fed) or not (fed or feeds):
                del cand[k]
                changed = True
    return cand


def _outside_readers(g, node, cand):
    """Whether anything but a converted conv's input or residual reads
    ``node``: another expr, the graph's result, a watch or end point."""
    if id(node) in g._kept_ids():
        return True
    return any(id(u) not in cand or not _reads_blocked(cand[id(u)][1], node) for u in node.users)


def _convert(g, cand):
    blocked = {}         # id(NCHW node) -> its NCHW16c node
    for e in [e for e in g._exprs if id(e) in cand]:
        info = cand[id(e)][1]
        y, r = e.outputs[0], info["residual"]
        with g.insert_exprs(e):
            if r is not None and id(r) not in blocked:
                blocked[id(r)] = F.to_nchwc(r)
            if info["pool"]:
                y5 = F.max_pool2d_nchwc(blocked[id(info["x"])], info["kernel_size"], info["stride"],
                                        info["padding"], info["dilation"], info["ceil_mode"])
            else:
                y5 = F.conv2d_nchwc(blocked.get(id(info["x"]), info["x"]), info["weight"], info["bias"],
                                    info["stride"], info["padding"], info["dilation"], info["groups"],
                                    act=info["act"], residual=None if r is None else blocked[id(r)])
            back = F.from_nchwc(y5, info["out_channels"]) if _outside_readers(g, y, cand) else None
        blocked[id(y)] = y5
        if back is not None:
            g.replace_node({y: back})


def _global_avg_pool_input(e):
    """The input node of a global average pooling ``e`` computes
    (``F.adaptive_avg_pool2d`` or an AdaptiveAvgPool2d call, to 1 x 1), else
    None."""
    m = module_call(e, M.AdaptiveAvgPool2d)
    if m is not None and len(e.args) == 2 and not e.kwargs:
        x, size = e.args[1], m.output_size
    elif is_function(e, F.adaptive_avg_pool2d):
        a = bound_args(e)
        if a is None:
            return None
        x, size = a["x"], a["oshp"]
    else:
        return None
    return x if _is_pair(size, 1) else None


def _pool_globally_in_nchwc(g):
    """Each global average pooling of a converted conv's output (through
    its ``from_nchwc``) to a mean over the NCHW16c planes, then
    ``from_nchwc`` of the [N, B, 1, 1, 16] means: the conversion moves
    1/(H*W) of the values (MobileNetV2's pool and its conversion took 35
    us; the mean and conversion 10). ONNX Runtime pools in NCHWc too."""
    for e in [e for e in g._exprs if is_function(e, F.from_nchwc)]:
        pool = sole_user(e.outputs[0])
        if pool is None or _global_avg_pool_input(pool) is not e.outputs[0]:
            continue
        a = bound_args(e)
        with g.insert_exprs(pool):
            y = F.from_nchwc(F.mean(a["x"], axis=(2, 3), keepdims=True), a["channels"])
        g.replace_node({pool.outputs[0]: y})


def convert_to_nchwc(tm):
    """Chains of float32 convolutions to ``F.conv2d_nchwc`` calls in the
    NCHW16c layout (see the module docstring); returns the number of convs
    converted. A graph that writes into a tensor in place is left as it is:
    a conv reading the blocked copy of a value would miss a write to it."""
    done = 0
    for g in list(graphs_of(tm)):
        if any(has_side_effect(e) for e in g._exprs):
            continue
        cand = _chains(g)
        if cand:
            _convert(g, cand)
            _pool_globally_in_nchwc(g)
            g.compile()
            done += len(cand)
    return done


# ------------------------------------------------- FusePointwiseDepthwise

def _pointwise(a):
    """Whether conv2d_nchwc arguments ``a`` are a pointwise conv (1x1,
    stride 1, no padding, no residual) of an NCHW16c input."""
    w, x = _shape(a["weight"]), _shape(a["x"])
    return (w is not None and len(w) == 4 and w[2:] == (1, 1) and x is not None and len(x) == 5
            and a["groups"] == 1 and _is_pair(a["stride"], 1) and _is_pair(a["padding"], 0)
            and _is_pair(a["dilation"], 1) and a["residual"] is None)


def _depthwise(a, channels):
    """Whether conv2d_nchwc arguments ``a`` are a depthwise conv over
    ``channels`` (dilation 1, no residual)."""
    w = _shape(a["weight"])
    return (w is not None and len(w) == 4 and w[:2] == (channels, 1) and channels > 1
            and a["groups"] == channels and _pair_ok(a["stride"]) and _pair_ok(a["padding"])
            and _is_pair(a["dilation"], 1) and a["residual"] is None)


def _projection(a, mid):
    """Whether conv2d_nchwc arguments ``a`` are a pointwise conv (1x1,
    stride 1, no padding) of ``mid``, with any residual but ``mid``."""
    w = _shape(a["weight"])
    return (a["x"] is mid and a["residual"] is not mid and w is not None and len(w) == 4 and w[2:] == (1, 1)
            and a["groups"] == 1 and _is_pair(a["stride"], 1) and _is_pair(a["padding"], 0)
            and _is_pair(a["dilation"], 1))


def fuse_pointwise_depthwise(tm):
    """Each ``F.conv2d_nchwc`` pointwise conv whose output only a depthwise
    ``F.conv2d_nchwc`` reads, and that depthwise conv, to one
    ``F.conv2d_nchwc_pw_dw`` call (MobileNet's expansion and depthwise
    layers, after the NCHWc pass): the expanded tensor, up to 4.8 MB in
    MobileNetV2, is never written whole. MobileNetV2 batch 1 on a 2-core
    Zen 5 (``python benchmarks/ab_passes.py --pass FusePointwiseDepthwise
    --model mobilenet_v2 --full``): 3.64 ms against 4.26 without it, 6.16
    against 7.09 on one thread.

    Then each such call whose output only a pointwise conv reads (the
    block's projection, with its residual) joins it in one
    ``F.conv2d_nchwc_pw_dw_pw`` call: one call, output and parallel region
    a block fewer. Returns the number of calls fused (pairs, then
    projections)."""
    done = 0
    for g in list(graphs_of(tm)):
        fused = 0
        for e in list(g._exprs):
            a = bound_args(e) if is_function(e, F.conv2d_nchwc) else None
            if a is None or not _pointwise(a):
                continue
            b = sole_user(e.outputs[0])
            d = bound_args(b) if b is not None and is_function(b, F.conv2d_nchwc) else None
            if d is None or d["x"] is not e.outputs[0] or not _depthwise(d, _shape(a["weight"])[0]):
                continue
            with g.insert_exprs(b):
                y = F.conv2d_nchwc_pw_dw(a["x"], a["weight"], a["bias"], d["weight"], d["bias"],
                                         d["stride"], d["padding"], act=a["act"], dw_act=d["act"])
            g.replace_node({b.outputs[0]: y})
            fused += 1
        if fused:
            g.compile()         # (the pairs' exprs in order, for the projections' search)
            done += fused
        fused = 0
        for e in list(g._exprs):
            a = bound_args(e) if is_function(e, F.conv2d_nchwc_pw_dw) else None
            b = sole_user(e.outputs[0]) if a is not None else None
            d = bound_args(b) if b is not None and is_function(b, F.conv2d_nchwc) else None
            if d is None or not _projection(d, e.outputs[0]):
                continue
            with g.insert_exprs(b):
                y = F.conv2d_nchwc_pw_dw_pw(a["x"], a["weight"], a["bias"], a["dw_weight"], a["dw_bias"],
                                            d["weight"], d["bias"], residual=d["residual"], stride=a["stride"],
                                            padding=a["padding"], act=a["act"], dw_act=a["dw_act"],
                                            proj_act=d["act"])
            g.replace_node({b.outputs[0]: y})
            fused += 1
        if fused:
            g.compile()
            done += fused
    return done
