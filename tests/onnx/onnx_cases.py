"""One small traced example per row of mgtrace.onnx.mapping.RULES.

``CASES[(kind, name)]`` is ``(forward, inputs)``: a function of tensors that
reaches that row (a core op through ``mgtrace.apply`` or its method /
operator, an F function, a builtin module call) and NumPy inputs for it,
seeded. test_export_ops.py and test_import.py run each in ONNX Runtime against
mgtrace at the lowest and the highest opset.
"""
import numpy as np

import mgtrace as mt
import mgtrace.functional as F
import mgtrace.module as M
from mgtrace.functional import math as _fm

_rng = np.random.default_rng(20261205)


def _f(*shape):
    return _rng.standard_normal(shape).astype(np.float32)


def _pos(*shape):
    return (_rng.random(shape) * 3 + 0.1).astype(np.float32)


def _unit(*shape):
    return (_rng.random(shape) * 1.8 - 0.9).astype(np.float32)


def _i(*shape, lo=-7, hi=8):
    return _rng.integers(lo, hi, shape).astype(np.int32)


def _nz(*shape):
    v = _i(*shape, lo=-5, hi=6)
    return np.where(v == 0, 3, v).astype(np.int32)


def _b(*shape):
    return _rng.random(shape) > 0.5


def _special():
    return np.array([[1.0, np.nan, np.inf], [-np.inf, 0.0, -2.5]], np.float32)


def _apply(name, **params):
    return lambda *xs: mt.apply(mt.OpDef(name, params), *xs)


S = (2, 3, 4)
_UNARY_INPUT = {"log": _pos, "log1p": _pos, "log2": _pos, "sqrt": _pos, "rsqrt": _pos,
                "asin": _unit, "acos": _unit, "isnan": None, "isinf": None, "isfinite": None,
                "logical_not": _b, "bitwise_not": _i, "round": None}
_BINARY_INPUTS = {"floordiv": (_i, _nz), "mod": (_i, _nz), "pow": (_pos, _f),
                  "eq": (_i, _i), "ne": (_i, _i), "lt": (_i, _i), "le": (_i, _i),
                  "gt": (_i, _i), "ge": (_i, _i), "logical_and": (_b, _b),
                  "logical_or": (_b, _b), "logical_xor": (_b, _b), "bitwise_and": (_i, _i),
                  "bitwise_or": (_i, _i), "bitwise_xor": (_i, _i)}


def _unary_input(name):
    if name in ("isnan", "isinf", "isfinite"):
        return [_special()]
    if name == "round":
        return [np.array([[0.5, 1.5, -2.5, 2.4], [-0.6, 3.5, 7.0, -1.2]], np.float32)]
    return [_UNARY_INPUT.get(name, _f)(*S)]


def _binary_inputs(name):
    a, b = _BINARY_INPUTS.get(name, (_f, _f))
    return [a(*S), b(*S)]


_UNARY_OPS = ("neg abs sign square round floor ceil trunc exp expm1 log log1p log2 sqrt rsqrt "
              "sin cos tan tanh erf asin acos atan relu relu6 sigmoid gelu gelu_tanh silu "
              "hardswish hardsigmoid softplus isnan isinf isfinite logical_not bitwise_not "
              "pos").split()
_BINARY_OPS = ("add sub mul truediv floordiv mod pow maximum minimum eq ne lt le gt ge "
               "logical_and logical_or logical_xor bitwise_and bitwise_or bitwise_xor").split()

_CONV = dict(stride=(2, 1), padding=(1, 1), dilation=(1, 1), groups=2)
_POOL = dict(kernel_size=(3, 3), stride=(2, 2), padding=(1, 1), ceil_mode=False)
_NCHWC = dict(stride=(1, 1), padding=(1, 1), dilation=(1, 1), groups=1, act="relu")


def _op_cases():
    c = {}
    for n in _UNARY_OPS:
        c[n] = ((lambda x: +x) if n == "pos" else _apply(n), _unary_input(n))
    for n in _BINARY_OPS:
        c[n] = (_apply(n), _binary_inputs(n))
    c.update({
        "where": (_apply("where"), [_b(*S), _f(*S), _f(*S)]),
        "clip": (_apply("clip"), [_f(*S), np.float32(-0.5), np.float32(0.7)]),
        "astype": (lambda x: (x * 3).astype("int32"), [_f(*S)]),
        "reshape": (lambda x: x.reshape(x.shape[0], -1), [_f(*S)]),
        "transpose": (lambda x: x.transpose(2, 0, 1), [_f(*S)]),
        "expand_dims": (_apply("expand_dims", axis=1), [_f(*S)]),
        "squeeze": (_apply("squeeze", axis=1), [_f(2, 1, 4)]),
        "broadcast_to": (_apply("broadcast_to", shape=(2, 3, 4)), [_f(3, 1)]),
        **{n: (_apply(n, axis=1, keepdims=False), [_f(*S)])
           for n in ("sum", "mean", "prod", "max", "min", "argmax", "argmin")},
        "any": (_apply("any", axis=2, keepdims=True), [_b(*S)]),
        "all": (_apply("all", axis=None, keepdims=False), [_b(*S)]),
        "var": (_apply("var", axis=(1, 2), keepdims=True, ddof=1), [_f(*S)]),
        "std": (_apply("std", axis=2, keepdims=False, ddof=0), [_f(*S)]),
        "softmax": (_apply("softmax", axis=-1), [_f(*S)]),
        "log_softmax": (_apply("log_softmax", axis=1), [_f(*S)]),
        "cumsum": (_apply("cumsum", axis=1), [_f(*S)]),
        "sort": (_apply("sort", axis=-1, descending=True), [_f(*S)]),
        "argsort": (_apply("argsort", axis=-1, descending=False), [_f(*S)]),
        "topk": (_apply("topk", k=2, axis=-1, descending=True, sorted=True), [_f(*S)]),
        "getitem": (lambda x: x[:, 1, ::2], [_f(*S)]),
        # (mt.apply(OpDef("gather"/"scatter")) fails in the core: "gather() got
        # multiple values for keyword argument 'axis'"; the F functions reach them)
        "gather": (lambda x, i: F.gather(x, 1, i), [_f(*S), _i(*S, lo=0, hi=3)]),
        "scatter": (lambda x, i, s: F.scatter(x, 1, i, s),
                    [_f(*S), np.argsort(_rng.random(S), axis=1)[:, :2].astype(np.int32),
                     _f(2, 2, 4)]),
        "embedding": (_apply("embedding"), [_f(10, 4), _i(2, 3, lo=0, hi=10)]),
        "concat": (_apply("concat", axis=1), [_f(*S), _f(2, 2, 4)]),
        "stack": (_apply("stack", axis=0), [_f(*S), _f(*S)]),
        "split": (_apply("split", nsplits_or_sections=2, axis=2), [_f(*S)]),
        "matmul": (lambda a, b: a @ b, [_f(*S), _f(4, 5)]),
        "conv2d": (_apply("conv2d", **_CONV), [_f(1, 4, 8, 8), _f(6, 2, 3, 3), _f(6)]),
        "conv2d_act": (_apply("conv2d_act", act="relu6", **_CONV),
                       [_f(1, 4, 8, 8), _f(6, 2, 3, 3), _f(6), _f(1, 6, 4, 8)]),
        "conv_transpose2d": (_apply("conv_transpose2d", stride=(2, 2), padding=(1, 1),
                                    output_padding=(1, 1), dilation=(1, 1), groups=1),
                             [_f(1, 4, 5, 5), _f(4, 3, 3, 3), _f(3)]),
        "attention": (_apply("attention", scale=0.5),
                      [_f(1, 2, 3, 4), _f(1, 2, 5, 4), _f(1, 2, 5, 4), _f(1, 1, 3, 5)]),
        "max_pool2d": (_apply("max_pool2d", dilation=(1, 1), **_POOL), [_f(1, 2, 7, 7)]),
        "avg_pool2d": (_apply("avg_pool2d", count_include_pad=False, **_POOL),
                       [_f(1, 2, 7, 7)]),
        "adaptive_avg_pool2d": (_apply("adaptive_avg_pool2d", output_size=(1, 1)),
                                [_f(2, 3, 5, 5)]),
        "adaptive_max_pool2d": (_apply("adaptive_max_pool2d", output_size=(1, 1)),
                                [_f(2, 3, 5, 5)]),
        "pad": (_apply("pad", pad_width=((0, 0), (0, 0), (1, 2), (2, 1)), mode="constant",
                       value=0.5), [_f(1, 2, 3, 3)]),
        "to_nchwc": (lambda x: F.from_nchwc(_apply("to_nchwc")(x) * 2.0, 20),
                     [_f(1, 20, 3, 3)]),
        "from_nchwc": (lambda x: _apply("from_nchwc", channels=20)(F.to_nchwc(x)),
                       [_f(1, 20, 3, 3)]),
        "conv2d_nchwc": (lambda x, w, b: F.from_nchwc(_apply("conv2d_nchwc", **_NCHWC)(
            F.to_nchwc(x), w, b, None), 18), [_f(1, 20, 6, 6), _f(18, 20, 3, 3), _f(18)]),
        "conv2d_nchwc_pw_dw": (
            lambda x, w, b, dw, db: F.from_nchwc(_apply(
                "conv2d_nchwc_pw_dw", stride=(2, 2), padding=(1, 1), act="relu6",
                dw_act="relu")(F.to_nchwc(x), w, b, dw, db), 32),
            [_f(1, 16, 6, 6), _f(32, 16, 1, 1), _f(32), _f(32, 1, 3, 3), _f(32)]),
        "conv2d_nchwc_pw_dw_pw": (
            lambda x, w, b, dw, db, pw, pb: F.from_nchwc(_apply(
                "conv2d_nchwc_pw_dw_pw", stride=(1, 1), padding=(1, 1), act="relu6",
                dw_act="relu6", proj_act="none")(F.to_nchwc(x), w, b, dw, db, pw, pb,
                                                  F.to_nchwc(x)), 16),
            [_f(1, 16, 6, 6), _f(32, 16, 1, 1), _f(32), _f(32, 1, 3, 3), _f(32),
             _f(16, 32, 1, 1), _f(16)]),
        "max_pool2d_nchwc": (lambda x: F.from_nchwc(_apply(
            "max_pool2d_nchwc", kernel_size=(3, 3), stride=(2, 2), padding=(1, 1),
            dilation=(1, 1), ceil_mode=False)(F.to_nchwc(x)), 20), [_f(1, 20, 7, 7)]),
        "atan2": (_apply("atan2"), [np.array([[0.0, 1.0, -1.0, 0.0, -0.0, 2.0, -3.0]] * 2,
                                             np.float32),
                                    np.array([[0.0, 0.0, 0.0, -1.0, -1.0, -0.5, 2.5],
                                              [1.0, -1.0, 2.0, -0.0, 0.0, 3.0, -2.0]],
                                             np.float32)]),
        "left_shift": (_apply("left_shift"), [_shifted(), _amounts()]),
        "right_shift": (_apply("right_shift"), [_shifted(), _amounts()]),
        "cumprod": (_apply("cumprod", axis=1), [_unit(*S) * 2]),
        "nonzero": (_apply("nonzero", as_tuple=False), [_i(3, 4, lo=-1, hi=2)]),
        "setitem": (_setitem_case, [_f(*S), _f(2, 2, 1)]),
        "interpolate": (_apply("interpolate", size=None, scale_factor=(2.0, 1.5),
                               mode="bilinear", align_corners=False), [_f(1, 2, 4, 5)]),
        # issue 36's kernels
        "conv3d": (_apply("conv3d", stride=(1, 2, 1), padding=1, dilation=(2, 1, 1), groups=2),
                   [_f(1, 4, 6, 5, 4), _f(6, 2, 2, 3, 3), _f(6)]),
        "conv_transpose3d": (_apply("conv_transpose3d", stride=2, padding=(1, 0, 1),
                                    output_padding=(1, 0, 1), dilation=1, groups=1),
                             [_f(1, 4, 3, 2, 3), _f(4, 3, 3, 2, 3), _f(3)]),
        "lstm_cell": (lambda gx, h, c, w, b: list(_apply("lstm_cell")(gx, h, c, w, b)),
                      [_f(2, 12), _f(2, 3), _f(2, 3), _f(12, 3), _f(12)]),
        "rnn_cell": (_apply("rnn_cell", nonlinearity="relu"), [_f(2, 5), _f(2, 5), _f(5, 5), _f(5)]),
    })
    return {("op", k): v for k, v in c.items()}


def _shifted():
    return np.array([[-7, 7, -1, 5, 123456, -123456, 1, -2147483647]] * 2, np.int32)


def _amounts():
    return np.array([[1, 2, 31, 33, 3, 5, 31, 0], [0, 40, 1, 4, 15, 31, 30, 2]], np.int32)


def _setitem_case(x, v):
    y = x * 1.0
    y[:, 1:3, ::2] = v
    y[0, 0] = 5.0
    return y


def _fn(name, *args, **kwargs):
    fn = getattr(F, name)
    return lambda *xs: fn(*xs, *args, **kwargs)


def _function_cases():
    c = {}
    ops = _op_cases()
    for table in (_fm._UNARY_TABLE, _fm._BINARY_TABLE):
        for name, row in table.items():
            if ("op", row[0]) in ops:
                c[name] = (getattr(F, name), ops[("op", row[0])][1])
    x4 = _f(2, 4, 5, 5)
    c.update({
        "clip": (lambda x: F.clip(x, -0.5, 0.5), [_f(*S)]),
        "where": (F.where, [_b(*S), _f(*S), _f(*S)]),
        **{n: (_fn(n, axis=1), [_f(*S)]) for n in ("sum", "mean", "prod", "max", "min",
                                                   "argmax", "argmin")},
        "var": (_fn("var", axis=2, ddof=1), [_f(*S)]),
        "std": (_fn("std", axis=None), [_f(*S)]),
        "cumsum": (_fn("cumsum", 2), [_f(*S)]),
        "sort": (_fn("sort", descending=True), [_f(*S)]),
        "argsort": (_fn("argsort"), [_f(*S)]),
        "matmul": (lambda a, b: F.matmul(a, b, transpose_b=True), [_f(*S), _f(2, 5, 4)]),
        "linear": (F.linear, [_f(*S), _f(5, 4), _f(5)]),
        "linear_act": (lambda x, w, b: F.linear_act(x, w, b, act="silu"),
                       [_f(*S), _f(5, 4), _f(5)]),
        "linear_add_layer_norm": (lambda x, w, b, r, g: F.linear_add_layer_norm(x, w, b, r, g, b * 0.5,
                                                                                eps=1e-6),
                                  [_f(*S), _f(5, 4), _f(5), _f(2, 3, 5), _f(5)]),
        "conv1d": (lambda x, w, b: F.conv1d(x, w, b, stride=2, padding=1),
                   [_f(2, 4, 9), _f(3, 4, 3), _f(3)]),
        "conv2d": (lambda x, w, b: F.conv2d(x, w, b, stride=2, padding=1, groups=2),
                   [x4, _f(6, 2, 3, 3), _f(6)]),
        "conv2d_act": (lambda x, w, b, r: F.conv2d_act(x, w, b, padding=1, act="relu", residual=r),
                       [x4, _f(6, 4, 3, 3), _f(6), _f(2, 6, 5, 5)]),
        "conv_transpose2d": (lambda x, w: F.conv_transpose2d(x, w, stride=2),
                             [x4, _f(4, 2, 3, 3)]),
        "max_pool2d": (_fn("max_pool2d", 3, 2, 1), [x4]),
        "avg_pool2d": (_fn("avg_pool2d", 2), [x4]),
        "adaptive_avg_pool2d": (_fn("adaptive_avg_pool2d", 1), [x4]),
        "adaptive_max_pool2d": (_fn("adaptive_max_pool2d", (1, 1)), [x4]),
        "batch_norm": (lambda x, m, v, w, b: F.batch_norm(x, m, v, w, b, training=False,
                                                          eps=1e-3),
                       [x4, _f(4), _pos(4), _f(4), _f(4)]),
        "layer_norm": (lambda x, w, b: F.layer_norm(x, (5, 5), w, b, eps=1e-5),
                       [x4, _f(5, 5), _f(5, 5)]),
        "group_norm": (lambda x, w, b: F.group_norm(x, 2, w, b), [x4, _f(4), _f(4)]),
        "normalize": (_fn("normalize", axis=1), [_f(*S)]),
        **{n: (getattr(F, n), [_f(*S)]) for n in ("relu", "relu6", "silu", "hardswish",
                                                  "hardsigmoid", "sigmoid", "tanh",
                                                  "softplus")},
        "leaky_relu": (_fn("leaky_relu", 0.2), [_f(*S)]),
        "gelu": (_fn("gelu", "tanh"), [_f(*S)]),
        "softmax": (_fn("softmax"), [_f(*S)]),
        "log_softmax": (_fn("log_softmax", axis=-1), [_f(*S)]),
        "embedding": (F.embedding, [_i(2, 3, lo=0, hi=10), _f(10, 4)]),
        "one_hot": (_fn("one_hot", 10), [_i(2, 3, lo=0, hi=10)]),
        "dropout": (_fn("dropout", 0.5, training=False), [_f(*S)]),
        "pad": (_fn("pad", ((0, 0), (1, 1), (2, 0)), mode="reflect"), [_f(*S)]),
        "reshape": (lambda x: F.reshape(x, (x.shape[0], 2, -1)), [_f(*S)]),
        "flatten": (_fn("flatten", 1), [_f(*S)]),
        "transpose": (_fn("transpose", (2, "x", 0, 1)), [_f(*S)]),
        "expand_dims": (_fn("expand_dims", -1), [_f(*S)]),
        "squeeze": (_fn("squeeze"), [_f(2, 1, 4)]),
        "broadcast_to": (_fn("broadcast_to", (2, 3, 4)), [_f(3, 1)]),
        "concat": (lambda a, b: F.concat([a, b], axis=2), [_f(*S), _f(2, 3, 2)]),
        "stack": (lambda a, b: F.stack([a, b], axis=1), [_f(*S), _f(*S)]),
        "split": (_fn("split", [1, 3], axis=2), [_f(*S)]),
        "gather": (lambda x, i: F.gather(x, 2, i), [_f(*S), _i(*S, lo=0, hi=4)]),
        "scatter": (lambda x, i, s: F.scatter(x, 0, i, s),
                    [_f(*S), np.stack([np.zeros((3, 4)), np.ones((3, 4))]).astype(np.int32),
                     _f(*S)]),
        "tile": (_fn("tile", (2, 1, 2)), [_f(*S)]),
        "copy": (F.copy, [_f(*S)]),
        "astype": (_fn("astype", "float16"), [_f(*S)]),
        "zeros_like": (F.zeros_like, [_f(*S)]),
        "ones_like": (F.ones_like, [_i(*S)]),
        "full_like": (_fn("full_like", 2.5), [_f(*S)]),
        "zeros": (lambda x: x + F.zeros((x.shape[0], 1, 4)), [_f(*S)]),
        "ones": (lambda x: x * F.ones((3, 4)), [_f(*S)]),
        "full": (lambda x: x - F.full((x.shape[0], 3, 1), 1.5), [_f(*S)]),
        "arange": (lambda x: x + F.arange(x.shape[2], dtype="float32"), [_f(*S)]),
        "attention": (lambda q, k, v: F.attention(q, k, v, scale=0.3),
                      [_f(1, 2, 3, 4), _f(1, 2, 5, 4), _f(1, 2, 5, 4)]),
        "left_shift": (F.left_shift, [_shifted(), _amounts()]),
        "right_shift": (F.right_shift, [_shifted(), _amounts()]),
        "interpolate": (_fn("interpolate", size=(7, 3)), [_f(2, 3, 4, 5)]),
        "non_zero": (_fn("non_zero", as_tuple=True), [_i(3, 4, lo=-1, hi=2)]),
        "cond_take": (lambda m, x: F.cond_take(m, x), [_b(3, 4), _f(3, 4)]),
        "einsum": (lambda a, b: F.einsum("bij,bjk->bik", a, b), [_f(*S), _f(2, 4, 5)]),
        "conv3d": (lambda x, w, b: F.conv3d(x, w, b, stride=(1, 2, 1), padding=1),
                   [_f(1, 2, 4, 5, 5), _f(3, 2, 3, 3, 3), _f(1, 3, 1, 1, 1)]),
        "conv_transpose3d": (lambda x, w: F.conv_transpose3d(x, w, stride=2, padding=1),
                             [_f(1, 2, 3, 3, 3), _f(2, 3, 3, 3, 3)]),
        "instance_norm": (lambda x, w, b: F.instance_norm(x, True, w, b), [x4, _f(4), _f(4)]),
        "local_response_norm": (_fn("local_response_norm", 3, 1.5, 0.1, 0.75), [x4]),
        "pixel_shuffle": (_fn("pixel_shuffle", 2), [_f(2, 3, 8, 2, 3)]),
        "sinh": (F.sinh, [_f(*S)]), "cosh": (F.cosh, [_f(*S)]), "asinh": (F.asinh, [_f(*S)]),
        "acosh": (F.acosh, [_pos(*S) + 1]), "atanh": (F.atanh, [_unit(*S)]),
        "logaddexp": (F.logaddexp, [_f(*S), _f(*S)]),
        "cross": (F.cross, [_f(4, 3), _f(4, 3)]),
        "diag": (_fn("diag", 1), [_f(4, 4)]),
        "meshgrid": (lambda a, b: F.meshgrid(a, b, indexing="ij"), [_f(3), _f(4)]),
        "roll": (_fn("roll", 2, 1), [_f(*S)]),
        "swapaxes": (_fn("swapaxes", 0, 2), [_f(*S)]),
        "hswish": (F.hswish, [_f(*S) * 4]), "hsigmoid": (F.hsigmoid, [_f(*S) * 4]),
        "prelu": (F.prelu, [_f(*S), _f(1, 3, 1)]),
        "logsigmoid": (F.logsigmoid, [_f(*S)]),
        "logsumexp": (_fn("logsumexp", 1), [_f(*S)]),
        "logsoftmax": (_fn("logsoftmax", 2), [_f(*S)]),
        "indexing_one_hot": (lambda x, i: F.indexing_one_hot(x, i, 1),
                             [_f(*S), _i(2, 4, lo=0, hi=3)]),
        "general_norm": (lambda x, w, b: F.general_norm(x, 1, True, w, b), [_f(*S), _f(3),
                                                                           _f(3)]),
        "topk": (lambda x: F.topk(x, 2, descending=True), [_f(*S)]),
        "norm": (_fn("norm", 2, 1), [_f(*S)]),
        "dot": (F.dot, [_f(5), _f(5)]),
        "repeat": (_fn("repeat", 2, 1), [_f(*S)]),
        "linspace": (lambda x: x + F.linspace(0.0, 1.0, 4), [_f(*S)]),
        "eye": (lambda x: x + F.eye(3, 4), [_f(*S)]),
        "sync_batch_norm": (lambda x, m, v, w, b: F.sync_batch_norm(x, m, v, w, b),
                            [x4, _f(1, 4, 1, 1), _pos(1, 4, 1, 1), _f(1, 4, 1, 1),
                             _f(1, 4, 1, 1)]),
        "multi_head_attention": (
            lambda q, k, v, w: F.multi_head_attention(q, k, v, 8, 2, 0.0, 0.0, w, qbias=True,
                                                      kbias=True, vbias=True, obias=True,
                                                      training=False)[0],
            [_f(3, 2, 8), _f(3, 5, 8), _f(3, 5, 8), _f(1, 4 * 8 * 8 + 4 * 8) * 0.3]),
        "l1_loss": (F.l1_loss, [_f(*S), _f(*S)]),
        "square_loss": (F.square_loss, [_f(*S), _f(*S)]),
        "mse_loss": (_fn("mse_loss", reduction="sum"), [_f(*S), _f(*S)]),
        "smooth_l1_loss": (F.smooth_l1_loss, [_f(*S), _f(*S)]),
        "cross_entropy": (F.cross_entropy, [_f(4, 5), _i(4, lo=0, hi=5)]),
        "nll_loss": (F.nll_loss, [_f(4, 5), _i(4, lo=0, hi=5)]),
        "binary_cross_entropy": (F.binary_cross_entropy, [_f(*S), _rng.random(S).astype(
            np.float32)]),
        "sliding_window": (_fn("sliding_window", 2, 1), [x4]),
        "sliding_window_transpose": (_fn("sliding_window_transpose", (5, 5), 2),
                                     [_f(2, 4, 4, 4, 2, 2)]),
        "warp_affine": (lambda x, m: F.warp_affine(x, m, (4, 5)),
                        [_f(2, 6, 6, 3), np.array([[[1.0, 0.1, 0.5], [0.05, 0.9, 0.2]]] * 2,
                                                  np.float32)]),
        "warp_perspective": (lambda x, m: F.warp_perspective(x, m, (4, 5)),
                             [x4, np.array([[[1.0, 0.1, 0.5], [0.05, 0.9, 0.2],
                                             [0.01, 0.02, 1.0]]] * 2, np.float32)]),
        "remap": (F.remap, [x4, (_rng.random((2, 3, 4, 2)) * 5).astype(np.float32)]),
        "local_conv2d": (lambda x, w, bias: F.local_conv2d(x, w, bias, 2, 1),
                         [_f(2, 4, 5, 5), _f(3, 3, 4, 3, 3, 2) * 0.3, _f(2)]),
        # rows with no ONNX equivalent: the export is refused, naming the row
        "svd": (lambda x: F.svd(x)[1], [_f(3, 3)]),
        "matinv": (F.matinv, [np.eye(3, dtype=np.float32) * 2 + _f(3, 3) * 0.1]),
    })
    out = {("function", f"F.{k}"): v for k, v in c.items()}
    for name in ("to_nchwc", "from_nchwc", "conv2d_nchwc", "conv2d_nchwc_pw_dw",
                 "conv2d_nchwc_pw_dw_pw", "max_pool2d_nchwc"):
        out[("function", f"F.{name}")] = ops[("op", name)]
    return out


class _Call(M.Module):
    def __init__(self, mod):
        super().__init__()
        self.m = mod

    def forward(self, x):
        return self.m(x)


class _SelfAttention(M.Module):
    """MultiHeadAttention called as self-attention, its first output."""

    def __init__(self, mha):
        super().__init__()
        self.mha = mha

    def forward(self, x):
        return self.mha(x, x, x)[0]


class _ConcatSelf(M.Module):
    """Concat called on [x, x * 2] along the channels."""

    def __init__(self, cat):
        super().__init__()
        self.cat = cat

    def forward(self, x):
        return self.cat([x, x * 2], 1)


def _mod(m, *inputs):
    """m (weights and statistics drawn afresh, seeded) called on inputs."""
    state = {}
    for k, v in m.state_dict().items():
        v = v.numpy()
        if v.dtype.kind == "f":
            v = _pos(*v.shape) if k.endswith("var") else _f(*v.shape)
        state[k] = v
    m.load_state_dict(state)
    return (_Call(m.eval()), list(inputs))


def _module_cases():
    x4 = _f(2, 4, 6, 6)
    c = {
        "Linear": _mod(M.Linear(4, 5), _f(*S)),
        "Conv1d": _mod(M.Conv1d(4, 6, 3, stride=2, padding=1), _f(2, 4, 9)),
        "Conv2d": _mod(M.Conv2d(4, 6, 3, stride=1, padding=2, dilation=2), x4),
        "ConvTranspose2d": _mod(M.ConvTranspose2d(4, 3, 3, stride=2, padding=1), x4),
        "BatchNorm1d": _mod(M.BatchNorm1d(4), _f(3, 4)),
        "BatchNorm2d": _mod(M.BatchNorm2d(4), x4),
        "LayerNorm": _mod(M.LayerNorm(6), x4),
        "GroupNorm": _mod(M.GroupNorm(2, 4), x4),
        "Embedding": _mod(M.Embedding(10, 3), _i(2, 5, lo=0, hi=10)),
        "Softmax": _mod(M.Softmax(1), x4),
        "MaxPool2d": _mod(M.MaxPool2d(3, 2, 1), x4),
        "AvgPool2d": _mod(M.AvgPool2d(2), x4),
        "AdaptiveAvgPool2d": _mod(M.AdaptiveAvgPool2d(1), x4),
        "Dropout": _mod(M.Dropout(0.3), x4),
        "Identity": _mod(M.Identity(), x4),
        "QuantStub": _mod(M.QuantStub(), x4), "DequantStub": _mod(M.DequantStub(), x4),
        "Flatten": _mod(M.Flatten(), x4),
        "GELU": _mod(M.GELU(), x4),
    }
    x5 = _f(1, 2, 4, 4, 4)
    c.update({
        "LeakyReLU": _mod(M.LeakyReLU(0.2), x4),
        "PReLU": _mod(M.PReLU(4), x4),
        "PixelShuffle": _mod(M.PixelShuffle(2), x4),
        "Pad": _mod(M.Pad(((0, 0), (0, 0), (1, 2), (2, 1)), "reflect"), x4),
        "AdaptiveMaxPool2d": _mod(M.AdaptiveMaxPool2d((3, 2)), x4),
        "InstanceNorm": _mod(M.InstanceNorm(4), x4),
        "GeneralNorm": _mod(M.GeneralNorm((4,), 1), x4),
        "LocalResponseNorm": _mod(M.LocalResponseNorm(3, 1.0, 0.01, 0.5), x4),
        "SyncBatchNorm": _mod(M.SyncBatchNorm(4), x4),
        "Conv3d": _mod(M.Conv3d(2, 3, 3, padding=1), x5),
        "ConvTranspose3d": _mod(M.ConvTranspose3d(2, 3, 3, stride=2), x5),
        "LocalConv2d": _mod(M.LocalConv2d(4, 2, 6, 6, 3, groups=2, padding=1), x4),
        "SlidingWindow": _mod(M.SlidingWindow(3, padding=1), x4),
        "SlidingWindowTranspose": _mod(M.SlidingWindowTranspose((6, 6), 3), _f(2, 4, 4, 4, 3,
                                                                                 3)),
        "RNNCell": _mod(M.RNNCell(4, 5), _f(3, 4)),
        "LSTMCell": _mod(M.LSTMCell(4, 5), _f(3, 4)),
        "MultiHeadAttention": _mod(_SelfAttention(M.MultiHeadAttention(8, 2)), _f(3, 2, 8)),
        "Elemwise": _mod(M.Elemwise("relu"), x4),
        "ConvRelu2d": _mod(M.ConvRelu2d(4, 3, 3), x4),
        "ConvBn2d": _mod(M.ConvBn2d(4, 3, 3), x4),
        "ConvBnRelu2d": _mod(M.ConvBnRelu2d(4, 3, 3), x4),
        "Concat": _mod(_ConcatSelf(M.Concat()), x4),
        "BatchMatMulActivation": _mod(M.BatchMatMulActivation(2, 5, 3, nonlinear_mode="relu"),
                                      _f(2, 5, 3)),
        "LinearBn1d": _mod(M.LinearBn1d(4, 3), _f(5, 4)),
        "LinearBnRelu1d": _mod(M.LinearBnRelu1d(4, 3), _f(5, 4)),
        "ConvTransposeRelu2d": _mod(M.ConvTransposeRelu2d(4, 3, 3, stride=2), x4),
        "ConvTransposeBn2d": _mod(M.ConvTransposeBn2d(4, 3, 3, padding=1), x4),
        "ConvTransposeBnRelu2d": _mod(M.ConvTransposeBnRelu2d(4, 6, 3, groups=2), x4),
        "RNN": _mod(M.RNN(4, 5, num_layers=2, nonlinearity="relu", bidirectional=True),
                    _f(3, 2, 4)),
        "LSTM": _mod(M.LSTM(4, 5, num_layers=2, bidirectional=True, batch_first=True),
                     _f(2, 3, 4)),
    })
    for n in ("ReLU", "ReLU6", "SiLU", "Sigmoid", "Tanh", "Hardswish", "Hardsigmoid"):
        c[n] = _mod(getattr(M, n)(), x4 * 4)
    return {("module", k): v for k, v in c.items()}


CASES = {**_op_cases(), **_function_cases(), **_module_cases()}
