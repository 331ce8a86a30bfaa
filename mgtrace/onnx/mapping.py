"""What exports to ONNX, as one table beside the op table.

One :class:`Rule` per core op (``kind="op"``: the rows of
:mod:`mgtrace._core.op_table`, reached as tensor methods, operators and
``Apply`` exprs), per ``mgtrace.functional`` function (``"function"``)
and per builtin module type (``"module"``): the ONNX ops it becomes and
the lowest opset it exports at. An op, function or module missing here
raises :class:`~mgtrace.onnx.ExportError` naming it, the node and the
user's line. :func:`coverage` prints the table (README's "ONNX" section
is generated from it, see scripts/onnx_coverage.py).

Opsets: :data:`MIN_OPSET` (13) up to the newest that both the installed
``onnx`` and ``onnxruntime`` support (:func:`default_opset`). Where a
newer opset has a one-node form (Gelu at 20, LayerNormalization at 17)
the converter takes it, and the decomposition below it.
"""
import inspect
from types import SimpleNamespace
from typing import Callable, NamedTuple

import numpy as np

from mgtrace.onnx import _convert as C
from mgtrace.onnx._builder import V

__all__ = ["Rule", "RULES", "MIN_OPSET", "rule_for", "coverage"]

MIN_OPSET = 13


class Rule(NamedTuple):
    kind: str               # "op", "function", "module"
    name: str               # op name, "F.<name>", or the module's class name
    onnx: tuple             # the ONNX ops it becomes (at the newest opset)
    since: int              # the lowest opset it exports at
    convert: Callable


# ------------------------------------------------------------------ core ops
_U = C.unary
_K = C.composed
_OPS = {
    # elementwise, one input
    "neg": _U("Neg"), "abs": _U("Abs"), "sign": _U("Sign"),
    "square": _K(C._square, ("Mul",), "same"), "round": _K(C._round, ("Round",), "same"),
    "floor": _U("Floor"), "ceil": _U("Ceil"), "trunc": _K(C._trunc, ("Ceil", "Floor", "Where"),
                                                          "same"),
    "exp": _U("Exp", "float"), "expm1": _K(C._expm1, ("Exp", "Sub")),
    "log": _U("Log", "float"), "log1p": _K(C._log1p, ("Add", "Log")),
    "log2": _K(C._log2, ("Log", "Div")), "sqrt": _U("Sqrt", "float"),
    "rsqrt": _K(C._rsqrt, ("Sqrt", "Reciprocal")),
    **{n: _U(n.capitalize(), "float") for n in ("sin", "cos", "tan", "tanh", "erf")},
    "asin": _U("Asin", "float"), "acos": _U("Acos", "float"), "atan": _U("Atan", "float"),
    "relu": _U("Relu"), "relu6": _K(C._relu6, ("Clip",), "same"),
    "sigmoid": _U("Sigmoid", "float"), "gelu": _K(C._gelu, ("Gelu", "Erf")),
    "gelu_tanh": _K(C._gelu_tanh, ("Gelu", "Tanh")), "silu": _K(C._silu, ("Sigmoid", "Mul")),
    "hardswish": _K(C._hardswish, ("HardSwish", "HardSigmoid")),
    "hardsigmoid": _K(C._hardsigmoid, ("HardSigmoid",)),
    "softplus": _U("Softplus", "float"),
    "isnan": _U("IsNaN", "float"), "isinf": _U("IsInf", "float"),
    "isfinite": _K(C._isfinite, ("IsNaN", "IsInf", "Not")),
    "logical_not": _K(lambda b, x, dt: b.op("Not", [x], dt, x.shape), ("Not",), "bool"),
    "pos": _K(lambda b, x, dt: x, (), "same"),
    "bitwise_not": C._bitwise_not,
    # elementwise, two inputs
    "add": C.binary("Add"), "sub": C.binary("Sub"), "mul": C.binary("Mul"),
    "truediv": C._truediv, "floordiv": C._floordiv, "mod": C._mod, "pow": C.binary("Pow"),
    "maximum": C.binary("Max"), "minimum": C.binary("Min"),
    "eq": C.binary("Equal", "in"), "ne": C._ne, "lt": C.binary("Less", "in"),
    "le": C.binary("LessOrEqual", "in"), "gt": C.binary("Greater", "in"),
    "ge": C.binary("GreaterOrEqual", "in"),
    "logical_and": C.binary("And", "bool"), "logical_or": C.binary("Or", "bool"),
    "logical_xor": C.binary("Xor", "bool"),
    "bitwise_and": C._bitwise("And", "BitwiseAnd"), "bitwise_or": C._bitwise("Or", "BitwiseOr"),
    "bitwise_xor": C._bitwise("Xor", "BitwiseXor"),
    # three inputs
    "where": C._where, "clip": C._clip,
    # dtype and views
    "astype": C._astype, "reshape": C._reshape, "transpose": C._transpose,
    "expand_dims": C._expand_dims, "squeeze": C._squeeze, "broadcast_to": C._broadcast_to,
    # reductions
    "sum": C.reduction("ReduceSum"), "mean": C.reduction("ReduceMean", "float"),
    "prod": C.reduction("ReduceProd"), "max": C.reduction("ReduceMax"),
    "min": C.reduction("ReduceMin"), "any": C._any_all("ReduceMax"),
    "all": C._any_all("ReduceMin"), "argmax": C._arg("ArgMax"), "argmin": C._arg("ArgMin"),
    "var": C._var(False), "std": C._var(True),
    "softmax": C._softmax("Softmax"), "log_softmax": C._softmax("LogSoftmax"),
    "cumsum": C._cumsum, "sort": C._sort, "argsort": C._argsort, "topk": C._topk_op,
    # indexing and joining
    "getitem": C._getitem, "gather": C._gather, "scatter": C._scatter,
    "embedding": C._embedding, "concat": C._concat, "stack": C._stack, "split": C._split,
    # linear algebra and nn
    "matmul": C._matmul, "conv2d": C._conv2d, "conv2d_act": C._conv2d_act,
    "conv_transpose2d": C._conv_transpose2d, "attention": C._attention,
    "max_pool2d": C._max_pool2d, "avg_pool2d": C._avg_pool2d,
    "adaptive_avg_pool2d": C._adaptive("GlobalAveragePool", "adaptive_avg_pool2d"),
    "adaptive_max_pool2d": C._adaptive("GlobalMaxPool", "adaptive_max_pool2d"),
    "pad": C._pad,
    # optimize()'s NCHW16c layout, exported as NCHW
    "to_nchwc": C._blocked, "from_nchwc": C._from_nchwc, "conv2d_nchwc": C._conv2d_nchwc,
    "conv2d_nchwc_pw_dw": C._pw_dw, "conv2d_nchwc_pw_dw_pw": C._pw_dw,
    "max_pool2d_nchwc": C._max_pool2d_nchwc,
    # compositions (no one-node ONNX form)
    "atan2": C._atan2, "left_shift": C._shift(True), "right_shift": C._shift(False),
    "cumprod": C._cumprod, "nonzero": C._nonzero, "setitem": C._setitem,
    "interpolate": C._interpolate,
}
# ops whose ONNX form needs a newer opset than MIN_OPSET
_SINCE = {"bitwise_and": 18, "bitwise_or": 18, "bitwise_xor": 18,
          "bitwise_not": 18}
ELEMENTWISE_BLOCKED_OK = frozenset(
    {"neg", "abs", "relu", "relu6", "sigmoid", "silu", "hardswish", "gelu", "add", "sub", "mul",
     "maximum", "minimum", "tanh", "hardsigmoid", "gelu_tanh"})
"""Ops that may run on optimize()'s NCHW16c values kept as NCHW: elementwise
ops whose tensor operands are all blocked alike (or numbers)."""


# ---------------------------------------------------- functional functions

def _fn(op, inputs, params=(), fixed=None):
    """F.<name> as core op ``op``: ``inputs`` name the F arguments that are
    the op's tensor inputs; ``params`` maps op params to F argument names
    (a name alone when they agree); ``fixed`` gives params fixed values."""
    params = [p if isinstance(p, tuple) else (p, p) for p in params]
    conv = _OPS[op]

    def convert(b, out, a):
        ins = [a[n] for n in inputs]
        ps = {p: a[n] for p, n in params}
        ps.update(fixed or {})
        return conv(b, out, ins, ps)
    convert.onnx = conv.onnx
    convert.op = op
    return convert


def _f_linear(b, out, a, act="none"):
    x, w, bias = a["x"], a["weight"], a["bias"]
    dt = C._dt(out)
    if x.ndim == 2 and dt.kind == "f":          # the one-node form ORT runs best
        ins = [b.cast(x, dt), b.cast(w, dt)] + ([b.cast(bias, dt)] if bias is not None else [])
        return C.act_of(b, b.op("Gemm", ins, dt, out[0].shape, transB=1), act)
    wt = b.op("Transpose", [b.cast(w, dt)], dt, w.shape[::-1], perm=[1, 0])
    y = b.op("MatMul", [b.cast(x, dt), wt], dt, out[0].shape)
    if bias is not None:
        y = b.op("Add", [y, b.cast(bias, dt)], dt, y.shape)
    return C.act_of(b, y, act)


_f_linear.onnx = ("Gemm", "Transpose", "MatMul", "Add")


def _f_linear_act(b, out, a):
    return _f_linear(b, out, a, a["act"])


_f_linear_act.onnx = _f_linear.onnx + ("Relu",)


def _f_linear_add_layer_norm(b, out, a):
    """Decomposed: the linear layer (Gemm or MatMul + Add), the residual's
    Add, and the layer norm over the last axis (SkipLayerNormalization
    where the contrib ops are on, as for the unfused sequence)."""
    x, w = a["x"], a["weight"]
    lin = [SimpleNamespace(shape=tuple(x.shape[:-1]) + (w.shape[0],), dtype=out[0].dtype)]
    y = _f_linear(b, lin, a)
    dt = C._dt(out)
    y = b.op("Add", [y, b.cast(a["residual"], dt)], dt, out[0].shape)
    return layer_norm_of(b, out, y, (out[0].shape[-1],), a["ln_weight"], a["ln_bias"], a["eps"])


_f_linear_add_layer_norm.onnx = _f_linear.onnx + ("LayerNormalization", "ReduceMean")


def _channel(b, v, c, dt):
    if v is not None and v.shape == (c,):
        return b.cast(v, dt)
    return None if v is None else b.op("Reshape", [b.cast(v, dt), b.ints([c])], dt, (c,))


def _f_conv2d(b, out, a):
    o = a["weight"].shape[0]
    return C.conv_of(b, a["x"], a["weight"], _channel(b, a["bias"], o, C._dt(out)), a["stride"],
                     a["padding"], a["dilation"], a["groups"], C._dt(out), out[0].shape)


_f_conv2d.onnx = ("Conv",)


def _f_conv2d_act(b, out, a):
    o = a["weight"].shape[0]
    ps = {k: a[k] for k in ("stride", "padding", "dilation", "groups", "act")}
    return C._conv2d_act(b, out, [a["x"], a["weight"], _channel(b, a["bias"], o, C._dt(out)),
                                  a["residual"]], ps)


_f_conv2d_act.onnx = C._conv2d_act.onnx


def _f_conv1d(b, out, a):
    x, w = a["x"], a["weight"]
    dt = C._dt(out)
    x4 = b.op("Unsqueeze", [b.cast(x, dt), b.ints([2])], dt, x.shape[:2] + (1,) + x.shape[2:])
    w4 = b.op("Unsqueeze", [b.cast(w, dt), b.ints([2])], dt, w.shape[:2] + (1,) + w.shape[2:])
    bias = _channel(b, a["bias"], w.shape[0], dt)
    y = C.conv_of(b, x4, w4, bias, (1, a["stride"]), (0, a["padding"]), (1, a["dilation"]),
                  a["groups"], dt, ())
    return b.op("Squeeze", [y, b.ints([2])], dt, out[0].shape)


_f_conv1d.onnx = ("Unsqueeze", "Conv", "Squeeze")


def _f_max_pool2d(b, out, a):
    if a.get("return_indices"):
        raise b.error("max_pool2d with return_indices=True has no ONNX form here")
    stride = a["kernel_size"] if a["stride"] is None else a["stride"]
    return C._max_pool2d(b, out, [a["x"]], dict(a, stride=stride))


_f_max_pool2d.onnx = ("MaxPool",)


def _f_avg_pool2d(b, out, a):
    stride = a["kernel_size"] if a["stride"] is None else a["stride"]
    return C._avg_pool2d(b, out, [a["x"]], dict(
        a, stride=stride, count_include_pad=a["mode"] == "average"))


_f_avg_pool2d.onnx = ("AveragePool",)


def _f_adaptive(op):
    def convert(b, out, a):
        return _OPS[op](b, out, [a["x"]], {"output_size": a["oshp"]})
    convert.onnx = _OPS[op].onnx
    return convert


def batch_norm_of(b, out, x, mean, var, w, bias, eps):
    dt = C._flt(C._dt(out))
    x = b.cast(x, dt)
    c = x.shape[1]
    ones = np.ones(c, dt)
    w = _channel(b, w, c, dt) if w is not None else b.const(ones)
    bias = _channel(b, bias, c, dt) if bias is not None else b.const(np.zeros(c, dt))
    return b.op("BatchNormalization", [x, w, bias, _channel(b, mean, c, dt),
                                       _channel(b, var, c, dt)], dt, out[0].shape,
                epsilon=float(eps))


def _f_batch_norm(b, out, a):
    if a["training"] or a["running_mean"] is None:
        raise b.error("batch_norm in training mode (batch statistics, running-average "
                      "updates) has no ONNX inference form; export the module in eval()")
    return batch_norm_of(b, out, a["x"], a["running_mean"], a["running_var"], a["weight"],
                         a["bias"], a["eps"])


_f_batch_norm.onnx = ("BatchNormalization",)


def _skip_layer_norm(b, out, x, w, bias, eps):
    """com.microsoft SkipLayerNormalization in place of ``Add(a, s)`` and the
    layer norm over the last axis of its sum (a transformer's residual), when
    the Add made x, both its operands are graph values of x's shape, and no
    node since reads x: the Add node is dropped and x becomes the fused op's
    fourth output (the sum), so later readers of x still find it. None
    where it does not apply."""
    if not (b.contrib and x.ndim == 3 and x.dtype == np.float32 and w is not None and
            b.nodes and x.name in b.nodes[-1].output):
        return None
    add = b.nodes[-1]
    if add.op_type != "Add" or add.domain or any(b.shapes.get(i) != x.shape for i in add.input):
        return None
    gamma = b.cast(w, x.dtype)
    beta = b.cast(bias, x.dtype) if bias is not None else None
    if gamma.ndim != 1 or beta is not None and beta.ndim != 1:
        return None
    b.nodes.pop()
    y = b.fresh(f"{b.scope}/SkipLayerNormalization")
    b.nodes.append(b._helper.make_node(
        "SkipLayerNormalization", list(add.input) + [gamma.name] + ([beta.name] if beta else []),
        [y, "", "", x.name], name=b.fresh(f"{b.scope}/SkipLayerNormalization#node"),
        domain=C.MS, epsilon=float(eps)))
    b.domains.add(C.MS)
    return V(y, x.dtype, out[0].shape)


def layer_norm_of(b, out, x, shape, w, bias, eps):
    dt = C._flt(C._dt(out))
    x = b.cast(x, dt)
    shape = tuple(shape) if isinstance(shape, (tuple, list)) else (shape,)
    k = len(shape)
    axes = list(range(x.ndim - k, x.ndim))
    if k == 1:
        fused = _skip_layer_norm(b, out, x, w, bias, eps)
        if fused is not None:
            return fused
    if b.opset >= 17:
        w = b.cast(w, dt) if w is not None else b.const(np.ones(shape, dt))
        ins = [x, w] + ([b.cast(bias, dt)] if bias is not None else [])
        return b.op("LayerNormalization", ins, dt, out[0].shape, axis=x.ndim - k,
                    epsilon=float(eps))
    mean = C.reduce_op(b, "ReduceMean", x, axes, True, dt, ())
    d = b.op("Sub", [x, mean], dt, x.shape)
    var = C.reduce_op(b, "ReduceMean", b.op("Mul", [d, d], dt, x.shape), axes, True, dt, ())
    inv = b.op("Reciprocal", [b.op("Sqrt", [b.op("Add", [var, b.const(np.asarray(eps, dt))],
                                                  dt, ())], dt, ())], dt, ())
    y = b.op("Mul", [d, inv], dt, x.shape)
    if w is not None:
        y = b.op("Mul", [y, b.cast(w, dt)], dt, x.shape)
    if bias is not None:
        y = b.op("Add", [y, b.cast(bias, dt)], dt, x.shape)
    return y


def _f_layer_norm(b, out, a):
    return layer_norm_of(b, out, a["x"], a["normalized_shape"], a["weight"], a["bias"], a["eps"])


_f_layer_norm.onnx = ("LayerNormalization", "ReduceMean")


def group_norm_of(b, out, x, groups, w, bias, eps):
    dt = C._flt(C._dt(out))
    x = b.cast(x, dt)
    n = b.dim(x, 0)
    g = b.op("Reshape", [x, b.shape_tensor([n, int(groups), -1])], dt, (0, 0, 0))
    mean = C.reduce_op(b, "ReduceMean", g, [2], True, dt, ())
    d = b.op("Sub", [g, mean], dt, ())
    var = C.reduce_op(b, "ReduceMean", b.op("Mul", [d, d], dt, ()), [2], True, dt, ())
    y = b.op("Div", [d, b.op("Sqrt", [b.op("Add", [var, b.const(np.asarray(eps, dt))], dt, ())],
                             dt, ())], dt, ())
    y = b.op("Reshape", [y, b.shape_of(x)], dt, x.shape)
    c = x.shape[1]
    shape = [1, c] + [1] * (x.ndim - 2)
    if w is not None:
        y = b.op("Mul", [y, b.op("Reshape", [b.cast(w, dt), b.ints(shape)], dt, ())], dt, x.shape)
    if bias is not None:
        y = b.op("Add", [y, b.op("Reshape", [b.cast(bias, dt), b.ints(shape)], dt, ())],
                 dt, x.shape)
    return y


def _f_group_norm(b, out, a):
    return group_norm_of(b, out, a["x"], a["num_groups"], a["weight"], a["bias"], a["eps"])


_f_group_norm.onnx = ("Reshape", "ReduceMean", "Sqrt", "Div")


def _f_normalize(b, out, a):
    dt = C._flt(C._dt(out))
    x = b.cast(a["x"], dt)
    ord_, axis = a["ord"], a["axis"]
    if ord_ not in (1, 2):
        raise b.error(f"normalize with ord={ord_!r} has no ONNX form here (ord 1 and 2 export)")
    axes = C._axes(axis, x.ndim)
    n = C.reduce_op(b, "ReduceL2" if ord_ == 2 else "ReduceL1", x, axes, True, dt, ())
    n = b.op("Max", [n, b.const(np.asarray(a["eps"], dt))], dt, ())
    return b.op("Div", [x, n], dt, out[0].shape)


_f_normalize.onnx = ("ReduceL2", "Max", "Div")


def _f_leaky_relu(b, out, a):
    dt = C._dt(out)
    return b.op("LeakyRelu", [b.cast(a["x"], dt)], dt, out[0].shape,
                alpha=float(a["negative_slope"]))


_f_leaky_relu.onnx = ("LeakyRelu",)


def _f_gelu(b, out, a):
    op = "gelu" if a["approximate"] == "none" else "gelu_tanh"
    return _OPS[op](b, out, [a["x"]], {})


_f_gelu.onnx = ("Gelu",)


def _f_dropout(b, out, a):
    if a["training"] and a["drop_prob"]:
        raise b.error("dropout in training mode draws random numbers; export the module in "
                      "eval() (dropout is then the identity)")
    return a["x"]


_f_dropout.onnx = ()


def _f_softmax(name):
    def convert(b, out, a):
        x, axis = a["x"], a["axis"]
        return _OPS[name](b, out, [x], {"axis": axis})
    convert.onnx = _OPS[name].onnx
    return convert


def _f_flatten(b, out, a):
    x = a["x"]
    s, e = a["start_axis"] % max(x.ndim, 1), a["end_axis"] % max(x.ndim, 1)
    if e == x.ndim - 1 and s > 0:
        return b.op("Flatten", [x], x.dtype, out[0].shape, axis=s)
    keep = [b.dim(x, i) for i in range(s)] + [-1] + [b.dim(x, i) for i in range(e + 1, x.ndim)]
    return C.reshape_to(b, x, keep, out[0].shape)


_f_flatten.onnx = ("Flatten", "Reshape")


def _f_matmul(b, out, a):
    dt = C._dt(out)
    x, y = b.cast(a["a"], dt), b.cast(a["b"], dt)
    for key, t in (("transpose_a", 0), ("transpose_b", 1)):
        if a[key]:
            v = (x, y)[t]
            v = b.op("Transpose", [v], dt, v.shape,
                     perm=list(range(v.ndim - 2)) + [v.ndim - 1, v.ndim - 2])
            x, y = (v, y) if t == 0 else (x, v)
    return b.op("MatMul", [x, y], dt, out[0].shape)


_f_matmul.onnx = ("MatMul", "Transpose")


def _f_transpose(b, out, a):
    x, pattern = a["x"], a["pattern"]
    pattern = (pattern,) if isinstance(pattern, (int, str)) else tuple(pattern)
    axes = [int(p) % x.ndim for p in pattern if not isinstance(p, str)]
    new = [i for i, p in enumerate(pattern) if isinstance(p, str)]
    y = b.op("Transpose", [x], x.dtype, (), perm=axes) if x.ndim else x
    if new:
        y = b.op("Unsqueeze", [y, b.ints(new)], x.dtype, ())
    return V(y.name, y.dtype, out[0].shape)


_f_transpose.onnx = ("Transpose", "Unsqueeze")


def _f_like(value):
    def convert(b, out, a):
        x = a["x"]
        dt = C._dt(out)
        v = a.get("value", value)
        fill = b.const(np.asarray([v], dt))
        return b.op("Expand", [fill, b.shape_of(x)], dt, out[0].shape)
    convert.onnx = ("Shape", "Expand")
    return convert


def _f_full(value):
    def convert(b, out, a):
        dt = C._dt(out)
        v = a.get("value", value)
        shape = a["shape"]
        shape = tuple(shape) if isinstance(shape, (tuple, list)) else (shape,)
        fill = b.const(np.asarray([v], dt))
        if all(not isinstance(s, V) for s in shape):
            return b.const(np.full(shape, v, dt))
        return b.op("Expand", [fill, b.shape_tensor(shape)], dt, out[0].shape)
    convert.onnx = ("Expand",)
    return convert


def _f_arange(b, out, a):
    dt = C._dt(out)
    start, stop, step = a["start"], a["stop"], a["step"]
    if stop is None:
        start, stop = 0, start
    ins = [b.operand(v, dt) if not isinstance(v, V) else b.cast(v, dt) for v in (start, stop, step)]
    return b.op("Range", ins, dt, out[0].shape)


_f_arange.onnx = ("Range",)


def _f_split(b, out, a):
    return C._split(b, out, [a["x"]], {"nsplits_or_sections": a["nsplits_or_sections"],
                                      "axis": a["axis"]})


_f_split.onnx = C._split.onnx


def _f_copy(b, out, a):
    return a["x"]


_f_copy.onnx = ()


def _f_one_hot(b, out, a):
    # Equal against a Range, not OneHot: onnxruntime lacks OneHot's newest
    # versions, and the comparison is what mgtrace computes
    dt = C._dt(out)
    x = b.cast(a["x"], np.int64)
    n = a["num_classes"]
    n = b.cast(n, np.int64) if isinstance(n, V) else b.const(np.int64(n))
    classes = b.op("Range", [b.const(np.int64(0)), n, b.const(np.int64(1))], np.int64, (0,))
    xe = b.op("Unsqueeze", [x, b.ints([-1])], np.int64, ())
    return b.cast(b.op("Equal", [xe, classes], np.bool_, out[0].shape), dt)


_f_one_hot.onnx = ("Range", "Equal", "Cast")


def _f_tile(b, out, a):
    x = a["x"]
    reps = tuple(a["reps"]) if isinstance(a["reps"], (tuple, list)) else (a["reps"],)
    if len(reps) > x.ndim:
        x = b.op("Reshape", [x, b.shape_tensor([1] * (len(reps) - x.ndim) + [
            b.dim(x, i) for i in range(x.ndim)])], x.dtype, (1,) * (len(reps) - x.ndim) + x.shape)
    reps = (1,) * (x.ndim - len(reps)) + reps
    return b.op("Tile", [x, b.shape_tensor(reps)], x.dtype, out[0].shape)


_f_tile.onnx = ("Tile",)


def _f_embedding(b, out, a):
    return C._embedding(b, out, [a["weight"], a["input"]], {})


_f_embedding.onnx = ("Gather",)


def _f_einsum(b, out, a):
    dt = C._dt(out)
    xs = [b.cast(x, dt) for x in a["args"]]
    eq = b.static(a["equation"], "einsum's equation").replace(" ", "")
    return b.op("Einsum", xs, dt, out[0].shape, equation=eq)


_f_einsum.onnx = ("Einsum",)


def _flip_kernel(b, w, k):
    """The weight with its ``k`` spatial axes reversed (conv_mode="convolution")."""
    return b.op("Slice", [w, b.ints([-1] * k), b.ints([C.INT64_MIN] * k),
                          b.ints(range(2, 2 + k)), b.ints([-1] * k)], w.dtype, w.shape)


def _triple(v):
    return tuple(v) if isinstance(v, (tuple, list)) else (v, v, v)


def _f_conv3d(b, out, a):
    dt = C._dt(out)
    w = b.cast(a["weight"], dt)
    if a.get("conv_mode", "cross_correlation") == "convolution":
        w = _flip_kernel(b, w, 3)
    elif a.get("conv_mode", "cross_correlation") != "cross_correlation":
        raise b.error(f"conv3d with conv_mode={a['conv_mode']!r} has no ONNX form")
    p = _triple(a["padding"])
    ins = [b.cast(a["inp"], dt), w] + ([_channel(b, a["bias"], w.shape[0], dt)]
                                       if a["bias"] is not None else [])
    return b.op("Conv", ins, dt, out[0].shape, strides=list(_triple(a["stride"])),
                pads=list(p) * 2, dilations=list(_triple(a["dilation"])),
                group=int(a["groups"]), kernel_shape=list(w.shape[2:]))


_f_conv3d.onnx = ("Conv",)


def _f_conv_transpose3d(b, out, a):
    dt = C._dt(out)
    w = b.cast(a["weight"], dt)
    c_out = w.shape[1] * int(a["groups"])
    ins = [b.cast(a["inp"], dt), w] + ([_channel(b, a["bias"], c_out, dt)]
                                       if a["bias"] is not None else [])
    return b.op("ConvTranspose", ins, dt, out[0].shape, strides=list(_triple(a["stride"])),
                pads=list(_triple(a["padding"])) * 2, dilations=list(_triple(a["dilation"])),
                output_padding=list(_triple(a["output_padding"])), group=int(a["groups"]),
                kernel_shape=list(w.shape[2:]))


_f_conv_transpose3d.onnx = ("ConvTranspose",)


def _f_instance_norm(b, out, a):
    dt = C._flt(C._dt(out))
    x = b.cast(a["inp"], dt)
    c = x.shape[1]
    affine = a["affine"]
    w = _channel(b, a["weight"], c, dt) if affine and a["weight"] is not None \
        else b.const(np.ones(c, dt))
    bias = _channel(b, a["bias"], c, dt) if affine and a["bias"] is not None \
        else b.const(np.zeros(c, dt))
    if x.ndim < 3:          # [N, C]: one element a channel (normalized to 0)
        return group_norm_of(b, out, x, c, w, bias, a["eps"])
    return b.op("InstanceNormalization", [x, w, bias], dt, out[0].shape,
                epsilon=float(a["eps"]))


_f_instance_norm.onnx = ("InstanceNormalization",)


def _f_local_response_norm(b, out, a):
    # MegEngine's x / (k + alpha * sum)^beta; ONNX divides alpha by size
    dt = C._flt(C._dt(out))
    n = int(a["kernel_size"])
    return b.op("LRN", [b.cast(a["inp"], dt)], dt, out[0].shape, size=n,
                alpha=float(a["alpha"]) * n, beta=float(a["beta"]), bias=float(a["k"]))


_f_local_response_norm.onnx = ("LRN",)


def _f_pixel_shuffle(b, out, a):
    """DepthToSpace in CRD order (PyTorch's and MegEngine's channel order);
    leading axes other than one batch axis are folded into it and back."""
    x = a["inp"]
    r = int(a["upscale_factor"])
    nd = x.ndim
    c, h, w = (b.dim(x, i) for i in (nd - 3, nd - 2, nd - 1))
    y = x
    if nd != 4:
        y = b.op("Reshape", [x, b.shape_tensor([-1, c, h, w])], x.dtype, (0,) * 4)
    y = b.op("DepthToSpace", [y], x.dtype, (0,) * 4, blocksize=r, mode="CRD")
    if nd != 4:
        lead = [b.dim(x, i) for i in range(nd - 3)]
        rr = b.const(np.int64(r))
        y = b.op("Reshape", [y, b.shape_tensor(lead + [
            b.op("Div", [c, b.const(np.int64(r * r))], np.int64, ()),
            b.op("Mul", [h, rr], np.int64, ()), b.op("Mul", [w, rr], np.int64, ())])],
            x.dtype, ())
    return V(y.name, y.dtype, out[0].shape)


_f_pixel_shuffle.onnx = ("DepthToSpace", "Reshape")


def _f_local_conv2d(b, out, a):
    """F.local_conv2d as its composition with the windows unrolled: the
    weight fixes the kernel and the output grid (OH, OW), so each kernel
    tap is one strided Slice of the padded input; the taps stacked are
    sliding_window's columns, multiplied by the weight in one batched
    MatMul over the output positions (as the function computes it)."""
    x, w, bias = a["inp"], a["weight"], a["bias"]
    if a.get("conv_mode", "cross_correlation") != "cross_correlation":
        raise ValueError(f"conv_mode={a['conv_mode']!r}")
    b.static((a["stride"], a["padding"], a["dilation"]), "local_conv2d's geometry")
    dt = C._flt(C._dt(out))
    x = b.cast(x, dt)
    wt = b.cast(w, dt)
    if w.ndim == 6:
        wt = b.op("Unsqueeze", [wt, b.ints([0])], dt, (1,) + tuple(w.shape))
    g, oh, ow, cg, kh, kw, og = (int(d) for d in wt.shape)
    (sh, sw), (ph, pw), (dh, dw) = (C._pair(a[k]) for k in ("stride", "padding", "dilation"))
    xp = b.op("Pad", [x, b.ints([0, 0, ph, pw, 0, 0, ph, pw])], dt, x.shape) \
        if ph or pw else x
    taps = []
    for i in range(kh):
        for j in range(kw):
            t = b.op("Slice", [xp, b.ints([i * dh, j * dw]),
                               b.ints([i * dh + (oh - 1) * sh + 1, j * dw + (ow - 1) * sw + 1]),
                               b.ints([2, 3]), b.ints([sh, sw])], dt, (0, 0, oh, ow))
            taps.append(b.op("Unsqueeze", [t, b.ints([4])], dt, (0, 0, oh, ow, 1)))
    cols = taps[0] if len(taps) == 1 else b.op("Concat", taps, dt, (0, 0, oh, ow, kh * kw),
                                                axis=4)
    # [N, G, C/G, OH, OW, K] -> [OH, OW, G, N, C/G, K] -> [OH*OW*G, N, C/G*K]
    cols = b.op("Reshape", [cols, b.ints([0, g, cg, oh, ow, kh * kw])], dt, (0,) * 6)
    cols = b.op("Transpose", [cols], dt, (0,) * 6, perm=[3, 4, 1, 0, 2, 5])
    cols = b.op("Reshape", [cols, b.ints([oh * ow * g, -1, cg * kh * kw])], dt, (0,) * 3)
    wm = b.op("Transpose", [wt], dt, (0,) * 7, perm=[1, 2, 0, 3, 4, 5, 6])
    wm = b.op("Reshape", [wm, b.ints([oh * ow * g, cg * kh * kw, og])], dt, (0,) * 3)
    y = b.op("MatMul", [cols, wm], dt, (0,) * 3)                # [OH*OW*G, N, O/G]
    y = b.op("Reshape", [y, b.ints([oh, ow, g, -1, og])], dt, (0,) * 5)
    y = b.op("Transpose", [y], dt, (0,) * 5, perm=[3, 2, 4, 0, 1])
    y = b.op("Reshape", [y, b.ints([0, g * og, oh, ow])], dt, out[0].shape)
    if bias is not None:
        y = b.op("Add", [y, b.op("Reshape", [b.cast(bias, dt), b.ints([1, g * og, 1, 1])], dt,
                                 (1, g * og, 1, 1))], dt, out[0].shape)
    return y


_f_local_conv2d.onnx = ("Pad", "Slice", "Concat", "Transpose", "Reshape", "MatMul")


def _f_cond_take(b, out, a):
    """MegEngine's cond_take: the elements where mask is true, flattened, and
    their flat indices (int32): Compress of both flattened."""
    x, mask = a["x"], a["mask"]
    flat = b.ints([-1])
    m = b.op("Reshape", [b.cast(mask, np.bool_), flat], np.bool_, (0,))
    vals = b.op("Compress", [b.op("Reshape", [x, flat], x.dtype, (0,)), m], x.dtype,
                out[0].shape, axis=0)
    n = C.reduce_op(b, "ReduceProd", b.shape_of(x), [0], False, np.int64, ())
    pos = b.op("Range", [b.const(np.int64(0)), n, b.const(np.int64(1))], np.int64, (0,))
    idx = b.op("Compress", [pos, m], np.int64, out[-1].shape, axis=0)
    return [vals, idx]


_f_cond_take.onnx = ("Compress", "Range")


def _decomposed():
    """Rows converted as the graph of the function's own body (its
    composition of core ops, traced at export with symbolic shapes)."""
    def convert(*args):
        raise AssertionError("decomposed rows are converted by the exporter")
    convert.decompose = True
    convert.onnx = ("(its composition of core ops)",)
    return convert


def _no_onnx(reason):
    """A row that says why it has no ONNX equivalent (export raises)."""
    def convert(*args):
        raise AssertionError("refused by the exporter")
    convert.no_onnx = reason
    convert.onnx = ()
    return convert


def _math_functions():
    from mgtrace.functional import math as fm
    rows = {}
    for table, inputs in ((fm._UNARY_TABLE, ("x",)), (fm._BINARY_TABLE, ("x", "y"))):
        for name, row in table.items():
            if row[0] in _OPS:
                rows[name] = _fn(row[0], inputs)
    return rows


_AXES = ("axis", "keepdims")
# F functions exported as their body's composition of core ops
_DECOMPOSED_FUNCTIONS = (
    "sinh", "cosh", "asinh", "acosh", "atanh", "logaddexp", "cross", "diag", "meshgrid",
    "roll", "swapaxes", "hswish", "hsigmoid", "prelu", "logsigmoid", "logsumexp",
    "logsoftmax", "indexing_one_hot", "general_norm", "topk", "norm", "dot", "repeat",
    "linspace", "eye", "sync_batch_norm", "multi_head_attention", "l1_loss", "square_loss",
    "mse_loss", "smooth_l1_loss", "cross_entropy", "nll_loss", "binary_cross_entropy",
    "sliding_window", "sliding_window_transpose", "warp_affine",
    "warp_perspective", "remap")
_NO_ONNX_FUNCTIONS = {
    "svd": "ONNX has no singular value decomposition",
    "matinv": "ONNX's default domain has no matrix inverse",
    "deformable_conv2d": "ONNX's DeformConv (opset 19) has no onnxruntime kernel",
    "region_restricted_conv": "ONNX has no region-restricted convolution",
    "deformable_psroi_pooling": "ONNX has no deformable position-sensitive RoI pooling",
}
_FUNCTIONS = {
    **_math_functions(),
    "clip": _fn("clip", ("x", "lower", "upper")), "where": _fn("where", ("mask", "x", "y")),
    **{n: _fn(n, ("x",), _AXES) for n in ("sum", "mean", "prod", "max", "min", "argmax",
                                          "argmin")},
    "var": _fn("var", ("x",), _AXES + ("ddof",)), "std": _fn("std", ("x",), _AXES + ("ddof",)),
    "cumsum": _fn("cumsum", ("x",), ("axis",)),
    "sort": _fn("sort", ("x",), ("descending", "axis")),
    "argsort": _fn("argsort", ("x",), ("descending", "axis")),
    "matmul": _f_matmul, "linear": _f_linear, "linear_act": _f_linear_act,
    "linear_add_layer_norm": _f_linear_add_layer_norm,
    "conv1d": _f_conv1d, "conv2d": _f_conv2d, "conv2d_act": _f_conv2d_act,
    "conv_transpose2d": _fn("conv_transpose2d", ("x", "weight", "bias"),
                            ("stride", "padding", "output_padding", "dilation", "groups")),
    "max_pool2d": _f_max_pool2d, "avg_pool2d": _f_avg_pool2d,
    "adaptive_avg_pool2d": _f_adaptive("adaptive_avg_pool2d"),
    "adaptive_max_pool2d": _f_adaptive("adaptive_max_pool2d"),
    "batch_norm": _f_batch_norm, "layer_norm": _f_layer_norm, "group_norm": _f_group_norm,
    "normalize": _f_normalize,
    **{n: _fn(n, ("x",)) for n in ("relu", "relu6", "silu", "hardswish", "hardsigmoid",
                                   "sigmoid", "tanh", "softplus")},
    "leaky_relu": _f_leaky_relu, "gelu": _f_gelu,
    "softmax": _f_softmax("softmax"), "log_softmax": _f_softmax("log_softmax"),
    "embedding": _f_embedding, "one_hot": _f_one_hot, "dropout": _f_dropout,
    "pad": _fn("pad", ("x",), ("pad_width", "mode", ("value", "constant_value"))),
    "reshape": _fn("reshape", ("x",), (("shape", "target_shape"),)),
    "flatten": _f_flatten, "transpose": _f_transpose,
    "expand_dims": _fn("expand_dims", ("x",), ("axis",)),
    "squeeze": _fn("squeeze", ("x",), ("axis",)),
    "broadcast_to": _fn("broadcast_to", ("x",), ("shape",)),
    "concat": _fn("concat", ("inps",), ("axis",)), "stack": _fn("stack", ("inps",), ("axis",)),
    "split": _f_split, "gather": _fn("gather", ("x", "index"), ("axis",)),
    "scatter": _fn("scatter", ("x", "index", "source"), ("axis",)),
    "tile": _f_tile, "copy": _f_copy, "astype": _fn("astype", ("x",), ("dtype",)),
    "zeros_like": _f_like(0), "ones_like": _f_like(1), "full_like": _f_like(None),
    "zeros": _f_full(0), "ones": _f_full(1), "full": _f_full(None), "arange": _f_arange,
    "attention": _fn("attention", ("q", "k", "v", "mask"), ("scale",)),
    "to_nchwc": _fn("to_nchwc", ("x",)), "from_nchwc": _fn("from_nchwc", ("x",), ("channels",)),
    "conv2d_nchwc": _fn("conv2d_nchwc", ("x", "weight", "bias", "residual"),
                        ("stride", "padding", "dilation", "groups", "act")),
    "conv2d_nchwc_pw_dw": _fn("conv2d_nchwc_pw_dw", ("x", "weight", "bias", "dw_weight",
                                                     "dw_bias"),
                              ("stride", "padding", "act", "dw_act")),
    "conv2d_nchwc_pw_dw_pw": _fn("conv2d_nchwc_pw_dw_pw",
                                 ("x", "weight", "bias", "dw_weight", "dw_bias", "proj_weight",
                                  "proj_bias", "residual"),
                                 ("stride", "padding", "act", "dw_act", "proj_act")),
    "max_pool2d_nchwc": _fn("max_pool2d_nchwc", ("x",),
                            ("kernel_size", "stride", "padding", "dilation", "ceil_mode")),
    "left_shift": _fn("left_shift", ("x", "y")), "right_shift": _fn("right_shift", ("x", "y")),
    "interpolate": _fn("interpolate", ("x",), ("size", "scale_factor", "mode",
                                               "align_corners")),
    "non_zero": _fn("nonzero", ("condition",), ("as_tuple",)),
    "einsum": _f_einsum, "conv3d": _f_conv3d, "conv_transpose3d": _f_conv_transpose3d,
    "instance_norm": _f_instance_norm, "local_response_norm": _f_local_response_norm,
    "pixel_shuffle": _f_pixel_shuffle, "cond_take": _f_cond_take,
    "local_conv2d": _f_local_conv2d,
    **{n: _decomposed() for n in _DECOMPOSED_FUNCTIONS},
    **{n: _no_onnx(r) for n, r in _NO_ONNX_FUNCTIONS.items()},
}


# --------------------------------------------------------- builtin modules

def _m(fn_name, args, x_name="x"):
    """A builtin module as the F function its forward calls: ``args(m)``
    gives that function's arguments other than the input (``x_name``)."""
    fconv = _FUNCTIONS[fn_name]

    def convert(b, out, m, x, param):
        return fconv(b, out, dict(args(m, param), **{x_name: x}))
    convert.onnx = fconv.onnx
    return convert


def _p(m, param, name):
    return None if getattr(m, name, None) is None else param(name)


def _m_batch_norm(b, out, m, x, param):
    if m.training and m.track_running_stats or not m.track_running_stats:
        raise b.error(f"{type(m).__name__} in training mode (or without running statistics) "
                      "has no ONNX inference form; export the module in eval()")
    return batch_norm_of(b, out, x, param("running_mean"), param("running_var"),
                         _p(m, param, "weight"), _p(m, param, "bias"), m.eps)


_m_batch_norm.onnx = ("BatchNormalization",)


def _m_conv(fn):
    def args(m, param):
        if getattr(m, "padding_mode", "zeros") != "zeros":
            raise ValueError(f"padding_mode={m.padding_mode!r}")
        d = dict(weight=param("weight"), bias=_p(m, param, "bias"), stride=m.stride,
                 padding=m.padding, dilation=m.dilation, groups=m.groups)
        if fn == "conv1d":
            d.update(stride=m.stride[0], padding=m.padding[0], dilation=m.dilation[0])
        if fn == "conv_transpose2d":
            d["output_padding"] = m.output_padding
        return d
    return _m(fn, args)


def _m_softmax(b, out, m, x, param):
    dim = m.dim
    if dim is None:                 # the legacy rule of Softmax.forward
        dim = 0 if x.ndim in (0, 1, 3) else 1
    return _FUNCTIONS["softmax"](b, out, {"x": x, "axis": dim})


_m_softmax.onnx = ("Softmax",)


def _m_recurrent(lstm):
    """RNN / LSTM as ONNX RNN / LSTM, one node a layer (both directions in
    it): torch's gate rows (input, forget, cell, output) reordered into
    ONNX's (input, output, forget, cell) and stacked into initializers
    ``<module>.W_l<k>`` / ``R_l<k>`` / ``B_l<k>`` (the two biases
    concatenated); ONNX's Y [T, D, N, H] reshaped to [T, N, D * H] for the
    next layer; h_n (and c_n) the layers' final states concatenated. The
    sequence length stays symbolic (one node runs every step). ``hx`` (RNN:
    h_0; LSTM: (h_0, c_0), each [layers * D, N, H]) gives each layer its
    initial_h / initial_c rows; None: zero states."""
    op = "LSTM" if lstm else "RNN"

    def convert(b, out, m, x, param):
        if m.training and m.dropout and m.num_layers > 1:
            raise b.error(f"{op} in training mode with dropout between layers draws random "
                          f"numbers; export the module in eval()")
        dt = C._flt(C._dt(out))
        x = b.cast(x, dt)
        hx = getattr(param, "hx", None)
        if hx is None:
            hx = (None, None)
        elif lstm:
            if not isinstance(hx, (tuple, list)) or len(hx) != 2 or \
                    not all(isinstance(h, V) for h in hx):
                raise b.error("LSTM's hx must be a pair of tensors (h_0, c_0)")
        elif isinstance(hx, V):
            hx = (hx, None)
        else:
            raise b.error("RNN's hx must be a tensor")
        if m.batch_first:
            x = b.op("Transpose", [x], dt, (), perm=[1, 0, 2])
        hid, ndir = m.hidden_size, m.num_directions
        order = [0, 3, 1, 2] if lstm else [0]
        attrs = {"hidden_size": hid, "direction": "bidirectional" if ndir == 2 else "forward"}
        if not lstm:
            attrs["activations"] = [m.nonlinearity.capitalize()] * ndir

        def array(name):
            a = np.asarray(getattr(m, name).numpy(), np.float32)
            if lstm:
                a = np.concatenate([a[k * hid:(k + 1) * hid] for k in order], 0)
            return a

        def init(kind, layer, parts):
            # ONNX's stacked, gate-reordered weights: one initializer a layer,
            # named after the module (``lstm.W_l0``) and precomputed, so an
            # importer sees constants
            path = getattr(param, "path", "")
            name = f"{path}.{kind}_l{layer}" if path else f"{kind}_l{layer}"
            return b.const(np.stack(parts, 0).astype(dt), name=name)

        finals = [[], []]
        layers = range(m.num_layers)
        if getattr(m, "proj_size", 0):      # ONNX's LSTM has no projection: Scan
            from mgtrace.onnx._scan_lstm import lstm_proj
            x, hs, cs = lstm_proj(b, m, x, hx, getattr(param, "path", "") or "lstm", dt)
            finals, layers = [hs, cs], ()
        for layer in layers:
            sfx = m._suffixes(layer)
            w = init("W", layer, [array(f"weight_ih{s}") for s in sfx])
            r = init("R", layer, [array(f"weight_hh{s}") for s in sfx])
            bias = None
            if m.bias:
                bias = init("B", layer, [np.concatenate([array(f"bias_ih{s}"),
                                                          array(f"bias_hh{s}")]) for s in sfx])
            states = [None, None]
            for k, h in enumerate(hx):
                if h is not None:
                    states[k] = b.op("Slice", [b.cast(h, dt), b.ints([layer * ndir]),
                                               b.ints([(layer + 1) * ndir]), b.ints([0])],
                                     dt, ())
            ins = [x, w, r, bias, None, states[0]] + ([states[1]] if lstm else [])
            names = b.node(op, ins, n_out=3 if lstm else 2, **attrs)
            y = b.op("Transpose", [V(names[0], dt, ())], dt, (), perm=[0, 2, 1, 3])
            x = b.op("Reshape", [y, b.ints([0, 0, -1])], dt, ())
            for k, n in enumerate(names[1:]):
                finals[k].append(V(n, dt, ()))
        if m.batch_first:
            x = b.op("Transpose", [x], dt, (), perm=[1, 0, 2])
        res = [V(x.name, dt, out[0].shape)]
        for k, fs in enumerate(finals[:2 if lstm else 1]):
            v = fs[0] if len(fs) == 1 else b.op("Concat", fs, dt, (), axis=0)
            res.append(V(v.name, dt, out[1 + k].shape))
        return res
    convert.onnx = (op, "Slice", "Concat", "Transpose", "Reshape") + (
        ("Scan (proj_size)",) if lstm else ())
    convert.takes_hx = True
    return convert


def _m_identity(b, out, m, x, param):
    return x


_m_identity.onnx = ()

_MODULES = {
    "Linear": _m("linear", lambda m, p: dict(weight=p("weight"), bias=_p(m, p, "bias"))),
    "Conv1d": _m_conv("conv1d"), "Conv2d": _m_conv("conv2d"),
    "ConvTranspose2d": _m_conv("conv_transpose2d"),
    "BatchNorm1d": _m_batch_norm, "BatchNorm2d": _m_batch_norm,
    "LayerNorm": _m("layer_norm", lambda m, p: dict(
        normalized_shape=m.normalized_shape, weight=_p(m, p, "weight"), bias=_p(m, p, "bias"),
        eps=m.eps)),
    "GroupNorm": _m("group_norm", lambda m, p: dict(
        num_groups=m.num_groups, weight=_p(m, p, "weight"), bias=_p(m, p, "bias"), eps=m.eps)),
    "Embedding": _m("embedding", lambda m, p: dict(weight=p("weight")), "input"),
    **{n: _m(f, lambda m, p: {}) for n, f in (
        ("ReLU", "relu"), ("ReLU6", "relu6"), ("SiLU", "silu"), ("Sigmoid", "sigmoid"),
        ("Tanh", "tanh"), ("Hardswish", "hardswish"), ("Hardsigmoid", "hardsigmoid"))},
    "GELU": _m("gelu", lambda m, p: dict(approximate=m.approximate)),
    "Softmax": _m_softmax,
    "MaxPool2d": _m("max_pool2d", lambda m, p: dict(
        kernel_size=m.kernel_size, stride=m.stride, padding=m.padding, dilation=m.dilation,
        ceil_mode=m.ceil_mode, return_indices=m.return_indices)),
    "AvgPool2d": _m("avg_pool2d", lambda m, p: dict(
        kernel_size=m.kernel_size, stride=m.stride, padding=m.padding, ceil_mode=m.ceil_mode,
        mode="average" if m.count_include_pad else "average_count_exclude_padding")),
    "AdaptiveAvgPool2d": _m("adaptive_avg_pool2d", lambda m, p: dict(oshp=m.output_size)),
    "Dropout": _m("dropout", lambda m, p: dict(drop_prob=m.p, training=m.training)),
    "Identity": _m_identity,
    "QuantStub": _m_identity, "DequantStub": _m_identity,   # the float stubs
    "Flatten": _m("flatten", lambda m, p: dict(start_axis=m.start_dim, end_axis=m.end_dim)),
    **{n: _decomposed() for n in (
        "LeakyReLU", "PReLU", "PixelShuffle", "Pad", "AdaptiveMaxPool2d", "InstanceNorm",
        "GeneralNorm", "LocalResponseNorm", "SyncBatchNorm", "Conv3d", "ConvTranspose3d",
        "SlidingWindow", "SlidingWindowTranspose", "RNNCell", "LSTMCell",
        "MultiHeadAttention", "Elemwise", "ConvRelu2d", "ConvBn2d", "ConvBnRelu2d",
        "Concat", "BatchMatMulActivation", "LinearBn1d", "LinearBnRelu1d",
        "ConvTransposeRelu2d", "ConvTransposeBn2d", "ConvTransposeBnRelu2d")},
    "RNN": _m_recurrent(False), "LSTM": _m_recurrent(True),
    "LocalConv2d": _m("local_conv2d", lambda m, p: dict(
        weight=p("weight"), bias=None, stride=m.stride, padding=m.padding, dilation=m.dilation),
        "inp"),
    "DeformableConv2d": _no_onnx(_NO_ONNX_FUNCTIONS["deformable_conv2d"]),
    "RegionRestrictedConv": _no_onnx(_NO_ONNX_FUNCTIONS["region_restricted_conv"]),
    "DeformablePSROIPooling": _no_onnx(_NO_ONNX_FUNCTIONS["deformable_psroi_pooling"]),
}


# ------------------------------------- core ops with dedicated CPU kernels (issue 36)

def _conv3d_attrs(params, w):
    return dict(strides=list(_triple(params["stride"])), pads=list(_triple(params["padding"])) * 2,
                dilations=list(_triple(params["dilation"])), group=int(params["groups"]),
                kernel_shape=list(w.shape[2:]))


def _op_conv3d(b, out, inputs, params):
    x, w, bias = inputs
    dt = C._dt(out)
    ins = [b.cast(x, dt), b.cast(w, dt)] + ([b.cast(bias, dt)] if bias is not None else [])
    return b.op("Conv", ins, dt, out[0].shape, **_conv3d_attrs(params, w))


_op_conv3d.onnx = ("Conv",)


def _op_conv_transpose3d(b, out, inputs, params):
    x, w, bias = inputs
    dt = C._dt(out)
    ins = [b.cast(x, dt), b.cast(w, dt)] + ([b.cast(bias, dt)] if bias is not None else [])
    return b.op("ConvTranspose", ins, dt, out[0].shape, **_conv3d_attrs(params, w),
                output_padding=list(_triple(params["output_padding"])))


_op_conv_transpose3d.onnx = ("ConvTranspose",)


def _cell_gates(b, out, inputs, dt):
    """gx + h @ w_hh^T (+ b_hh): the ONNX nodes of a recurrent step's GEMM"""
    gx, h, w_hh, b_hh = inputs[0], inputs[1], inputs[-2], inputs[-1]
    wt = b.op("Transpose", [b.cast(w_hh, dt)], dt, w_hh.shape[::-1], perm=[1, 0])
    g = b.op("Add", [b.cast(gx, dt), b.op("MatMul", [b.cast(h, dt), wt], dt, gx.shape)], dt, gx.shape)
    return g if b_hh is None else b.op("Add", [g, b.cast(b_hh, dt)], dt, gx.shape)


def _op_lstm_cell(b, out, inputs, params):
    # ONNX's LSTM runs whole sequences (mgtrace.module.LSTM exports to it);
    # one step is its formula in elementwise nodes
    dt = C._dt(out)
    g = _cell_gates(b, out, inputs, dt)
    shape = out[0].shape
    extra = {"num_outputs": 4} if b.opset >= 18 else {}
    i, f, gg, o = (V(n, dt, shape) for n in b.node("Split", [g], n_out=4, axis=1, **extra))
    c = b.cast(inputs[2], dt)
    c2 = b.op("Add", [b.op("Mul", [b.op("Sigmoid", [f], dt, shape), c], dt, shape),
                      b.op("Mul", [b.op("Sigmoid", [i], dt, shape), b.op("Tanh", [gg], dt, shape)], dt,
                           shape)], dt, shape)
    h2 = b.op("Mul", [b.op("Sigmoid", [o], dt, shape), b.op("Tanh", [c2], dt, shape)], dt, shape)
    return [h2, c2]


_op_lstm_cell.onnx = ("Transpose", "MatMul", "Add", "Split", "Sigmoid", "Tanh", "Mul")


def _op_rnn_cell(b, out, inputs, params):
    dt = C._dt(out)
    act = {"tanh": "Tanh", "relu": "Relu"}[params.get("nonlinearity", "tanh")]
    return b.op(act, [_cell_gates(b, out, inputs, dt)], dt, out[0].shape)


_op_rnn_cell.onnx = ("Transpose", "MatMul", "Add", "Tanh", "Relu")

_OPS.update({"conv3d": _op_conv3d, "conv_transpose3d": _op_conv_transpose3d,
             "lstm_cell": _op_lstm_cell, "rnn_cell": _op_rnn_cell})


def _since(conv, name):
    s = _SINCE.get(name) or _SINCE.get(getattr(conv, "op", None), MIN_OPSET)
    return max(s, MIN_OPSET)


RULES = tuple(
    [Rule("op", n, c.onnx, _since(c, n), c) for n, c in _OPS.items()]
    + [Rule("function", f"F.{n}", c.onnx, _since(c, n), c) for n, c in _FUNCTIONS.items()]
    + [Rule("module", n, c.onnx, MIN_OPSET, c) for n, c in _MODULES.items()])
_BY_KEY = {(r.kind, r.name): r for r in RULES}


def rule_for(kind, name):
    """The Rule for ``(kind, name)`` or None."""
    return _BY_KEY.get((kind, name))


def coverage():
    """The mapping table as Markdown: one row per rule, ``| kind | mgtrace |
    ONNX ops | lowest opset |`` (every rule exports up to
    :func:`~mgtrace.onnx.max_opset`). docs/onnx_coverage.md is this text
    (scripts/onnx_coverage.py writes it)."""
    lines = ["| kind | mgtrace | ONNX | lowest opset |", "|---|---|---|---|"]
    for r in RULES:
        reason = getattr(r.convert, "no_onnx", None)
        if reason:
            lines.append(f"| {r.kind} | `{r.name}` | no ONNX equivalent: {reason} | - |")
            continue
        ops = ", ".join(r.onnx) or "(no node: identity or layout)"
        lines.append(f"| {r.kind} | `{r.name}` | {ops} | {r.since} |")
    from mgtrace.onnx import _quant
    for prefix, table in _quant.TABLES.items():
        for name, conv in table.items():
            short = prefix.rpartition(".")[2]
            ops = ", ".join(conv.onnx) or "(no node: identity)"
            lines.append(f"| module | `{short}.{name}` | {ops} (QDQ) | "
                         f"{MIN_OPSET} |")
    return "\n".join(lines)


def bind_function(func, args, kwargs):
    """An F function's arguments by name, defaults filled in."""
    bound = inspect.signature(func).bind(*args, **kwargs)
    bound.apply_defaults()
    return dict(bound.arguments)
