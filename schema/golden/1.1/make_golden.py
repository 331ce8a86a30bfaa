"""Write the format-1.1 golden compendium (frozen: 1.1 is released, as mgtrace 0.2.0).

    python schema/golden/1.1/make_golden.py [--force | --new]

Written by mgtrace 0.3.0.dev0 at ``target_version=(1, 1)``, once, and then
never regenerated: tests/serialization/test_golden.py checks each file
against manifest.json (sha256), loads it, runs its stored example inputs
and compares with its stored outputs (per op family, in ULPs of each
output's scale), and saves the loaded archive again at 1.1, which must give
the committed bytes. tests/release/test_coverage.py reads the headers
(schema/golden/coverage.py) and fails unless the golden archives of all
versions together hold every (function, version) and (builtin module type,
version) of schema/ops.json and every value tag; this script refuses to
write a compendium that misses one of 1.1's.

The archives: those of the 1.0 compendium (its maker, ../1.0/make_golden.py,
builds them; here they are written by a 1.1 writer: sealed headers, graph
ids after edits) and what 1.1 added:

* ``tensor.tmod``, ``state_dict.tmod``, ``nested.tmod``: values, every value
  tag (tuple, list, dict, odict, namedtuple, int, scalar, slice, ellipsis,
  dtype, device, tensor), ``dtypes.tmod`` a tensor of every dtype (0-d,
  empty, strided);
* ``sequential.tmod``: builtin modules in a Sequential, no tracing;
  ``containers.tmod``: ModuleList and ModuleDict of builtin modules;
* ``resnet18_small.tmod``, ``mobilenet_v2_small.tmod``, ``minilm_small.tmod``
  (module, node tags; hierarchy);
* ``every_builtin.tmod``: every builtin module type, 1.1's Elemwise (every
  mode), ConvRelu2d, ConvBn2d and ConvBnRelu2d included;
* ``every_expr.tmod``: every expr kind, pytrees, shared modules, a
  registered user function, a submodule traced for two argument structures;
* ``functional.tmod``: (almost) every mgtrace.functional function of 1.0;
  ``functional_1_1.tmod``: the functions 1.1 added (the fused, NCHW16c and
  attention calls, warp_perspective, matinv, ``mgtrace.tensor``) and every
  ``operator`` function of the op table (int arithmetic on shapes as a
  trace records it; the others called through ``tmod.wrap``);
* ``methods.tmod``: every tensor method a graph records (traced, and by
  graph edits where a trace records a function instead);
* ``edited.tmod`` (graph ids), ``flattened.tmod``, ``outputs.tmod`` (graph
  outputs and inputs reset after tracing: what end points select, kept in
  the graph; watch and end points themselves are run state, never stored);
* ``kwargs.tmod``: a model traced with a keyword argument, saved with
  ``example_kwargs``;
* ``resnet18_optimized.tmod``, ``mobilenet_v2_optimized.tmod``,
  ``minilm_optimized.tmod``: the small models after ``optimize()`` with
  every pass named (so the result does not depend on the CPU);
* ``core_ops.tmod`` (added after the release by ``--new``, which writes
  only the cases manifest.json lacks and adds their entries): every core op
  of the op table but gather and scatter as an Apply expr
  (``mgtrace.apply(OpDef(name, params), *inputs)``); those two are
  ../1.2/core_ops_index.tmod's.
"""
import contextlib
import hashlib
import importlib.util
import json
import operator
import pathlib
import sys
import warnings
from collections import OrderedDict

import numpy as np

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2]))

import ml_dtypes  # noqa: E402
import mgtrace as mt  # noqa: E402
import mgtrace.functional as F  # noqa: E402
import mgtrace.module as M  # noqa: E402
import mgtrace.traced_module as tmod  # noqa: E402
from mgtrace.module.fused import ELEMWISE_MODES  # noqa: E402
from mgtrace.serialization import registry  # noqa: E402
from mgtrace.traced_module import optimize  # noqa: E402

VERSION = (1, 1)


def _maker(version):
    """The maker module of another golden folder (imported once, under the
    name the golden test imports it by, so its user functions register once)."""
    name = f"golden_{version.replace('.', '_')}"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, HERE.parent / version /
                                                      "make_golden.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
    return sys.modules[name]


V10 = _maker("1.0")

DTYPES = ["bool", "int8", "uint8", "int16", "uint16", "int32", "int64", "float16", "bfloat16",
          "float32", "float64"]


def _dtype_values():
    out = OrderedDict()
    base = np.arange(-6, 6).reshape(3, 4)
    for name in DTYPES:
        dt = np.dtype(ml_dtypes.bfloat16) if name == "bfloat16" else np.dtype(name)
        if name == "bool":
            a = base % 3 == 0
        elif dt.kind == "u":
            a = (base + 6).astype(dt)
        elif dt.kind == "i":
            a = base.astype(dt)
        else:
            a = (base / 4).astype(dt)
        out[name] = a
        out[f"{name}_strided"] = a[::2, ::-1]
    out["scalar"] = np.array(2.5, np.float32)
    out["empty"] = np.zeros((0, 3), np.int16)
    return out


def _containers():
    """ModuleList and ModuleDict stored as containers (a traced model's are
    traced into): builtin modules in them, nested, with fixed weights."""
    mt.random.seed(130)
    lst = M.ModuleList([M.Linear(3, 2), M.ReLU(), M.ModuleDict({"inner": M.Tanh()})])
    dct = M.ModuleDict({"norm": M.LayerNorm(2), "seq": M.Sequential(M.Identity(), M.GELU())})
    for i, (k, t) in enumerate(sorted({**lst.state_dict(), **dct.state_dict()}.items())):
        del k
        t[...] = mt.tensor(np.linspace(-1, 1, t.size).reshape(t.shape).astype(np.float32) + i)
    return {"list": lst, "dict": dct}


def describe(obj, arrays=False):
    """A loaded value as plain data, modules as (type, config, state) or
    (container type, [(name, child)]), so it compares with ``expected``
    (tensors as NumPy arrays with ``arrays``)."""
    if isinstance(obj, (M.ModuleList, M.ModuleDict, M.Sequential)):
        return (type(obj).__name__, [(n, describe(c, arrays)) for n, c in obj._modules.items()])
    if isinstance(obj, M.Module):
        return (type(obj).__name__, obj.config(),
                OrderedDict((k, t.numpy() if arrays else t)
                            for k, t in obj.state_dict().items()))
    if type(obj) in (dict, OrderedDict):
        return type(obj)((k, describe(v, arrays)) for k, v in obj.items())
    return obj


def expected(name):
    """The value ``name`` holds, as NumPy arrays where it holds tensors
    (modules through :func:`describe`)."""
    if name == "dtypes.tmod":
        return _dtype_values()
    if name == "containers.tmod":
        return describe(_containers(), arrays=True)
    return V10.expected(name)


def _tensors(values):
    return OrderedDict((k, mt.tensor(np.array(v, order="C"))) for k, v in values.items())


# ---------------------------------------------------------------- builtins

class EveryBuiltin(M.Module):
    """1.0's EveryBuiltin and the builtin types 1.1 added: Elemwise in every
    mode, ConvRelu2d, ConvBn2d, ConvBnRelu2d."""

    def __init__(self):
        super().__init__()
        self.v10 = V10.EveryBuiltin()
        self.conv_relu = M.ConvRelu2d(3, 4, 3, padding=1)
        self.conv_bn = M.ConvBn2d(4, 4, 1)
        self.conv_bn_relu = M.ConvBnRelu2d(4, 4, 3, padding=1, groups=2)
        self.modes = M.ModuleList([M.Elemwise(m) for m in ELEMWISE_MODES])

    def forward(self, tokens, image):
        y = self.conv_bn_relu(self.conv_bn(self.conv_relu(image)))
        a, b, c, d = F.tanh(y), F.sigmoid(y) + 0.5, y * 0.25, F.abs(y) + 1.0
        outs = []
        for m in self.modes:
            n = _elemwise_arity(m.method)
            outs.append(m(*(a, b, c, d)[:n]).astype("float32").mean(axis=(2, 3)))
        return self.v10(tokens, image), F.concat(outs, axis=1)


def _elemwise_arity(mode):
    import inspect
    return sum(p.default is inspect.Parameter.empty
               for p in inspect.signature(ELEMWISE_MODES[mode]).parameters.values())


def _every_builtin():
    mt.random.seed(140)
    net = V10._randomise(EveryBuiltin(), 140)
    rng = np.random.default_rng(141)

    def args():
        return (mt.tensor(rng.integers(0, 10, (2, 5)).astype(np.int32)),
                V10._randn(rng, 2, 3, 8, 8))
    return V10._trace(net, *args()), args()


# ---------------------------------------------------------------- functions

_INT_OPERATORS = ("add", "sub", "mul", "floordiv", "mod", "neg")


# every operator function of the op table, as a call the trace records
# (the Python operators on tensors record tensor methods instead; a graph may
# call these by name all the same)
OPERATORS = {name: tmod.wrap(getattr(operator, name)) for name in registry.OPERATOR_FUNCTIONS}


def _operator_calls(v, p, u):
    """``{name: operator.name(...)}`` on float [N, 8] ``v``, positive ``p``, ``u``."""
    op = OPERATORS
    b1, b2 = v > 0, u < 0.5
    i, k = (v * 8).astype("int32"), (p * 2).astype("int32")
    args = {"abs": (v,), "neg": (v,), "pos": (v,), "invert": (b1,),
            "add": (v, p), "sub": (v, p), "mul": (v, p), "truediv": (v, p),
            "floordiv": (v, p), "mod": (v, p), "pow": (p, v),
            "eq": (i, k), "ne": (i, k), "lt": (v, u), "le": (v, u), "gt": (v, u), "ge": (v, u),
            "and_": (b1, b2), "or_": (b1, b2), "xor": (b1, b2),
            "lshift": (i, k), "rshift": (i, k), "matmul": (v, p.transpose(1, 0)),
            "getitem": (v, (slice(None), 2))}
    assert set(args) == set(op), sorted(set(op) ^ set(args))
    return {name: op[name](*args[name]) for name in sorted(op)}


class Functional11(M.Module):
    """One call of each function format 1.1 added, int arithmetic on shapes
    (the ``operator`` functions a trace records) and every other operator
    function of the op table."""

    def __init__(self):
        super().__init__()
        rng = np.random.default_rng(150)
        w = lambda *s: M.Parameter(mt.tensor((0.3 * rng.standard_normal(s)).astype(np.float32)))
        self.w = w(20, 6, 3, 3)
        self.b = w(20)
        self.pw = w(24, 20, 1, 1)
        self.dw = w(24, 1, 3, 3)
        self.proj = w(20, 24, 1, 1)
        self.fc = w(5, 6)

    def forward(self, x, v, q):
        out = {}
        n = x.shape[0]
        h = x.shape[2]
        out["ints"] = mt.tensor([n + 1, n - h, n * 2, h // 2, h % 5, -n], dtype="int32")
        out["conv2d_act"] = F.conv2d_act(x, self.w, self.b, 1, 1, act="relu")
        out["linear_act"] = F.linear_act(v, self.fc, None, act="gelu")
        out["attention"] = F.attention(q, q * 0.5, q + 1.0, scale=0.125)
        blocked = F.conv2d_nchwc(x, self.w, self.b, 1, 1, act="relu")   # dense first layer
        pooled = F.max_pool2d_nchwc(blocked, 2)
        pd = F.conv2d_nchwc_pw_dw(pooled, self.pw, None, self.dw, None, 1, 1, act="relu6",
                                  dw_act="relu6")
        pdp = F.conv2d_nchwc_pw_dw_pw(pooled, self.pw, None, self.dw, None, self.proj, self.b,
                                      1, 1, act="relu6", dw_act="relu6", residual=pooled)
        out["nchwc"] = F.from_nchwc(pdp, 20)
        out["pw_dw"] = F.from_nchwc(pd, 24)
        out["to_nchwc"] = F.to_nchwc(x)
        mat = mt.tensor(np.array([[[1.0, 0.1, 0.5], [-0.1, 0.9, 0.25], [0.01, 0.0, 1.0]]] * 2,
                                 np.float32))
        out["warp_perspective"] = F.warp_perspective(x, mat, (5, 7))
        m = v[:, :4].reshape(-1, 2, 2) + mt.tensor(np.eye(2, dtype=np.float32) * 3)
        out["matinv"] = F.matinv(m)
        p = F.abs(v) + 0.5
        out["operator"] = _operator_calls(F.concat([v, v], axis=1), F.concat([p, p], axis=1),
                                          F.sigmoid(F.concat([v, -v], axis=1)))
        # copies: a 1.1 archive cannot keep outputs that view each other
        return tmod.tree_map(F.copy, out, lambda t: isinstance(t, mt.Tensor))


def _functional11():
    rng = np.random.default_rng(151)

    def args(batch):
        return (V10._randn(rng, batch, 6, 9, 9), V10._randn(rng, batch, 6),
                V10._randn(rng, batch, 2, 5, 8))
    return V10._trace(Functional11(), *args(2)), args(2)


class Functional(V10.Functional):
    """1.0's Functional, each output copied: a 1.1 archive cannot keep an
    output that is a view of an input (reshape, transpose...) as one (that
    is 1.2's storage views), so it stores a copy of it."""

    def forward(self, x, v, idx):
        return tmod.tree_map(F.copy, super().forward(x, v, idx),
                             lambda t: isinstance(t, mt.Tensor))


def _functional():
    rng = np.random.default_rng(60)

    def args(batch):
        return (V10._randn(rng, batch, 4, 6, 6), V10._randn(rng, batch, 8),
                mt.tensor(rng.integers(0, batch, (batch, 3)).astype(np.int32)))
    return V10._trace(Functional(), *args(2)), args(3)


class Methods(M.Module):
    """Every tensor method a stored graph may call (ops.json's
    tensor_methods) that mgtrace records (``to``, ``item``, ``numpy`` and
    ``tolist`` it never does): operators, reflected and in-place operators,
    __getitem__ / __setitem__ and the named methods, on a float ``x``
    [2, 3, 4], an int32 ``i`` of small positive values and a bool ``b``."""

    def forward(self, x, i, b):
        out = {}
        p = abs(x) + 1.0
        out["unary"] = (-x, ~b, abs(x))
        out["binary"] = (x + p, x - p, x * p, x / p, x // p, x % p, p ** x, x @ p.transpose(0, 2, 1),
                         x < p, x <= p, x > p, x >= p, i == 3, i != 3,
                         i & 6, i | 8, i ^ 5, i << 2, i >> 1)
        out["reflected"] = (1.5 + x, 2.0 - x, 3.0 * x, 2.0 / p, 3.0 // p, 3.0 % p, 2.0 ** x,
                            6 & i, 8 | i, 5 ^ i, 1 << i, 64 >> i)
        y, j = x * 1.0, i * 1
        y += p
        y -= 0.5
        y *= p
        y /= p
        y **= 2.0
        y //= 0.75
        y %= 2.0
        j &= 7
        j |= 8
        j ^= 3
        j <<= 1
        j >>= 1
        out["inplace"] = (y, j)
        z = x * 1.0
        z[0, 1] = 0.5
        z[:, :, 2] = p[:, :, 0]
        out["index"] = (x[0], x[:, 1:, ::2], z)
        n = x.shape[0]
        out["methods"] = (b.all(), b.any(axis=1), x.argmax(axis=2), x.argmin(axis=1),
                          x.astype("float16"), x[:1].broadcast_to((n, 3, 4)),
                          x.transpose(0, 2, 1).contiguous(), x.copy(), x.expand_dims(1),
                          x.flatten(1), x.max(axis=1), x.min(axis=2), x.mean(), x.sum(axis=0),
                          x.prod(axis=2), x.std(axis=1), x.var(axis=2), x.permute(2, 0, 1),
                          x.reshape(n, 12), x.expand_dims(0).squeeze(0),
                          x.transpose(1, 0, 2), x.view(n, -1), x.to("cpu"))
        return tmod.tree_map(F.copy, out, lambda t: isinstance(t, mt.Tensor))


def _methods():
    rng = np.random.default_rng(180)

    def args(batch):
        return (V10._randn(rng, batch, 3, 4),
                mt.tensor(rng.integers(1, 5, (batch, 3, 4)).astype(np.int32)),
                mt.tensor(rng.random((batch, 3, 4)) > 0.5))
    tm = V10._trace(Methods(), *args(2))
    # the methods a trace records otherwise (a function, or nothing), as graph edits
    g = tm.graph
    x = g.inputs[1]
    with g.insert_exprs():
        edits = {"contiguous": x.transpose(0, 2, 1).contiguous().copy(), "copy": x.copy(),
                 "flatten": x.flatten(1).copy(), "permute": x.permute(2, 0, 1).copy(),
                 "rmatmul": x.__rmatmul__(x.transpose(0, 2, 1))}   # copies: no views in 1.1
    g.reset_outputs((g.out_def.unflatten(g.outputs), edits))
    g.compile().lint()
    return tm, args(3)


# ---------------------------------------------------------------- core ops

_POSITIVE = "exp expm1 log log1p log2 sqrt rsqrt acos asin".split()   # on (0, 1)


def A(name, *inputs, **params):
    """``mgtrace.apply(OpDef(name, params), *inputs)``: a raw core op."""
    return mt.apply(mt.OpDef(name, params), *inputs)


class CoreOps(M.Module):
    """Every core op of the op table (schema/ops.json's core_ops) but gather
    and scatter (see ../1.2/make_golden.py's CoreIndexOps) applied raw,
    ``mgtrace.apply(OpDef(name, params), *inputs)``, each with its params in
    full, on a float ``x`` [N, 3, 4], an image [N, 3, 8, 8] and an
    int32 ``i`` of small positive values. No core op draws random numbers;
    the one that writes in place (setitem) writes into a fresh product, never
    into an input. Traced by :func:`_core_ops` with the Tensor method forms
    off, so that every op is an Apply expr (the tracer records an op with a
    method, ``add`` or ``sum``, as that method call otherwise)."""

    def __init__(self):
        super().__init__()
        rng = np.random.default_rng(190)
        w = lambda *s: M.Parameter(mt.tensor((0.3 * rng.standard_normal(s)).astype(np.float32)))
        self.w, self.b = w(16, 3, 3, 3), w(16)
        self.pw, self.dw, self.proj = w(16, 16, 1, 1), w(16, 1, 3, 3), w(16, 16, 1, 1)
        self.wt, self.emb = w(3, 4, 3, 3), w(10, 4)

    def forward(self, x, img, i):
        o = {}
        u = A("sigmoid", x)            # (0, 1): acos, asin, log, sqrt...
        p = A("add", A("abs", x), A("abs", x))
        for n in ("neg abs sign square round floor ceil trunc sin cos tan tanh erf atan relu relu6 "
                  "sigmoid gelu gelu_tanh silu hardswish hardsigmoid softplus isnan isinf "
                  "isfinite").split():
            o[n] = A(n, x)
        for n in _POSITIVE:
            o[n] = A(n, u)
        c = A("gt", x, u)
        d = A("lt", x, u)
        o["logical_not"] = A("logical_not", c)
        o["bitwise_not"] = A("bitwise_not", i)
        for n in "add sub mul truediv floordiv mod maximum minimum atan2".split():
            o[n] = A(n, x, A("add", p, u))
        o["pow"] = A("pow", A("add", p, u), x)
        for n in "eq ne lt le gt ge".split():
            o[n] = A(n, x, u)
        for n in "logical_and logical_or logical_xor".split():
            o[n] = A(n, c, d)
        j = A("astype", A("add", A("bitwise_and", i, A("bitwise_or", i, i)), i), dtype="int32")
        for n in "bitwise_and bitwise_or bitwise_xor left_shift right_shift".split():
            o[n] = A(n, i, j)
        o["where"] = A("where", c, x, u)
        o["clip"] = A("clip", x, A("neg", u), u)
        o["astype"] = A("astype", x, dtype="float16")
        o["reshape"] = A("reshape", x, shape=(2, 12))
        o["transpose"] = A("transpose", x, axes=(2, 0, 1))
        o["expand_dims"] = A("expand_dims", x, axis=1)
        o["squeeze"] = A("squeeze", A("expand_dims", x, axis=0), axis=0)
        o["broadcast_to"] = A("broadcast_to", A("sum", x, axis=0, keepdims=True), shape=(2, 3, 4))
        for n in "sum mean prod max min argmax argmin".split():
            o[n] = A(n, x, axis=1, keepdims=False)
        for n in "any all".split():
            o[n] = A(n, c, axis=2, keepdims=True)
        for n in "var std".split():
            o[n] = A(n, x, axis=2, keepdims=False, ddof=1)
        for n in "softmax log_softmax cumsum cumprod".split():
            o[n] = A(n, x, axis=-1)
        o["sort"] = A("sort", x, axis=-1, descending=True)
        o["argsort"] = A("argsort", x, axis=1, descending=False)
        o["topk"] = A("topk", x, k=2, axis=-1, descending=True, sorted=True)
        o["getitem"] = A("getitem", x, (slice(None), 1, slice(1, None)))
        y = A("mul", x, 1.0)           # a fresh tensor: setitem writes into it, not into x
        A("setitem", y, (0, slice(None), 2), A("neg", u)[0, :, 0])
        o["setitem"] = y
        o["nonzero"] = A("nonzero", c, as_tuple=False)
        # gather and scatter: in ../1.2/core_ops_index.tmod (release 0.2.0's apply() gave
        # their kernels the index where they take axis: no 1.1 reader runs them)
        o["embedding"] = A("embedding", self.emb, i)
        o["concat"] = A("concat", x, u, axis=0)
        o["stack"] = A("stack", x, u, axis=1)
        o["split"] = A("split", x, nsplits_or_sections=2, axis=2)
        o["matmul"] = A("matmul", x, A("transpose", u, axes=(0, 2, 1)))
        o["conv2d"] = A("conv2d", img, self.w, self.b, stride=1, padding=1, dilation=1, groups=1)
        o["conv2d_act"] = A("conv2d_act", img, self.w, self.b, None, stride=1, padding=1,
                            dilation=1, groups=1, act="relu")
        blocked = A("conv2d_nchwc", img, self.w, self.b, None, stride=1, padding=1, dilation=1,
                    groups=1, act="relu")
        pooled = A("max_pool2d_nchwc", blocked, kernel_size=2, stride=2, padding=0, dilation=1,
                   ceil_mode=False)
        pd = A("conv2d_nchwc_pw_dw", pooled, self.pw, None, self.dw, None, stride=1, padding=1,
               act="relu6", dw_act="relu6")
        pdp = A("conv2d_nchwc_pw_dw_pw", pooled, self.pw, None, self.dw, None, self.proj, self.b,
                pooled, stride=1, padding=1, act="relu6", dw_act="relu6", proj_act="none")
        o["conv2d_nchwc"] = A("from_nchwc", blocked, channels=16)
        o["max_pool2d_nchwc"] = A("from_nchwc", pooled, channels=16)
        o["conv2d_nchwc_pw_dw"] = A("from_nchwc", pd, channels=16)
        o["conv2d_nchwc_pw_dw_pw"] = A("from_nchwc", pdp, channels=16)
        o["to_nchwc"] = A("to_nchwc", img)
        o["conv_transpose2d"] = A("conv_transpose2d", img, self.wt, None, stride=2, padding=1,
                                  output_padding=1, dilation=1, groups=1)
        q = A("reshape", x, shape=(2, 1, 3, 4))
        o["attention"] = A("attention", q, A("mul", q, 0.5), A("add", q, 1.0), None, scale=0.5)
        o["max_pool2d"] = A("max_pool2d", img, kernel_size=2, stride=2, padding=0, dilation=1,
                            ceil_mode=False)
        o["avg_pool2d"] = A("avg_pool2d", img, kernel_size=3, stride=2, padding=1,
                            ceil_mode=True, count_include_pad=False)
        o["adaptive_avg_pool2d"] = A("adaptive_avg_pool2d", img, output_size=(3, 2))
        o["adaptive_max_pool2d"] = A("adaptive_max_pool2d", img, output_size=(2, 3))
        o["interpolate"] = A("interpolate", img, size=None, scale_factor=2.0, mode="bilinear",
                             align_corners=False)
        o["pad"] = A("pad", img, pad_width=((0, 0), (0, 0), (1, 2), (2, 1)), mode="constant",
                     value=0.5)
        # copies: a 1.1 archive cannot keep outputs that view an input or each other
        return tmod.tree_map(F.copy, o, lambda t: isinstance(t, mt.Tensor))

def _core_op_args(rng, batch=2):
    return (mt.tensor(rng.standard_normal((batch, 3, 4)).astype(np.float32)),
            mt.tensor(rng.standard_normal((batch, 3, 8, 8)).astype(np.float32)),
            mt.tensor(rng.integers(1, 5, (batch, 3, 4)).astype(np.int32)))


@contextlib.contextmanager
def _method_forms_off():
    """The tracer records every core op as an Apply expr, none as a Tensor
    method call (its method_form says none has one)."""
    from mgtrace.traced_module import tracer
    saved = tracer.method_form
    tracer.method_form = lambda name, inputs, params: None
    try:
        yield
    finally:
        tracer.method_form = saved


def _core_ops():
    """Added after 1.1's release (issue 37): 1.1's readers know every core op
    (released_ops/1.1.json's core_ops), so the case is a 1.1 archive; 0.2.0
    runs each of these (not gather and scatter, whose Apply exprs it fails)."""
    mt.random.seed(190)
    rng = np.random.default_rng(191)
    with _method_forms_off():
        tm = V10._trace(CoreOps(), *_core_op_args(rng))
    tm.graph.compile().lint()
    return tm, _core_op_args(rng)      # fixed shapes (reshape, broadcast_to): batch 2 again


# ---------------------------------------------------------------- graph features

class Outputs(M.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = M.Linear(4, 6)
        self.fc2 = M.Linear(6, 3)

    def forward(self, x, y):
        h = F.relu(self.fc1(x))
        return self.fc2(h) + y


def _outputs():
    """A graph whose outputs were reset after tracing: the hidden activation
    added as an output (what set_end_points selects, kept in the graph)."""
    mt.random.seed(160)
    net = V10._randomise(Outputs(), 160)
    rng = np.random.default_rng(161)
    x, y = V10._randn(rng, 2, 4), V10._randn(rng, 2, 3)
    tm = V10._trace(net, x, y)
    g = tm.graph
    hidden = g.get_function_by_type(F.relu).as_unique().outputs[0]
    g.reset_outputs((g.outputs[0], {"hidden": hidden}))
    g.compile().lint()
    return tm, (V10._randn(rng, 3, 4), V10._randn(rng, 3, 3))


class Scaled(M.Module):
    def __init__(self):
        super().__init__()
        self.fc = M.Linear(4, 4)

    def forward(self, x, scale=1.0, bias=None):
        y = self.fc(x) * scale
        return y if bias is None else y + bias


def _kwargs():
    """Traced with keyword arguments (a constant, a tensor), saved with
    example_kwargs."""
    mt.random.seed(170)
    net = V10._randomise(Scaled(), 170)
    rng = np.random.default_rng(171)
    x = V10._randn(rng, 2, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tmod.TraceWarning)
        tm = mt.trace_module(net, x, scale=3.0, bias=V10._randn(rng, 4))
    return tm, (V10._randn(rng, 3, 4),), {"scale": 3.0, "bias": V10._randn(rng, 4)}


PASSES = ["FoldConstant", "EliminateIdentity", "FuseConvBn", "FuseAddMul", "FuseConvAct",
          "FuseLinearAct", "FuseAttention", "NCHWc", "FusePointwiseDepthwise",
          "EliminateDeadCode"]


def _optimized(make):
    def build():
        tm, inputs = make()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return optimize(tm, PASSES, flatten=True), inputs
    return build


MODELS = {    # name -> (make() -> (traced module, example inputs[, example kwargs]), description)
    **V10.MODELS,
    "functional.tmod": (_functional, "every mgtrace.functional function of format 1.0"),
    "every_builtin.tmod": (_every_builtin, "every builtin module type of mgtrace.module, "
                                           "1.1's Elemwise (every mode) and fused convs"),
    "functional_1_1.tmod": (_functional11, "the functions format 1.1 added, int arithmetic "
                                           "on shapes, every operator function"),
    "methods.tmod": (_methods, "every tensor method a graph may call"),
    "outputs.tmod": (_outputs, "graph outputs reset after tracing (a hidden activation)"),
    "kwargs.tmod": (_kwargs, "traced with keyword arguments, saved with example_kwargs"),
    "resnet18_optimized.tmod": (_optimized(V10._resnet_small),
                                "the small ResNet after optimize() with every pass"),
    "mobilenet_v2_optimized.tmod": (_optimized(V10._mobilenet_small),
                                    "the small MobileNetV2 after optimize() with every pass"),
    "minilm_optimized.tmod": (_optimized(V10._minilm_small),
                              "the small MiniLM after optimize() with every pass"),
    # added after the release by `make_golden.py --new` (the others stay as written)
    "core_ops.tmod": (_core_ops, "every core op as an Apply expr (mgtrace.apply(OpDef))"),
}


def build():
    """name -> (object, save keyword arguments), in a fixed order."""
    model, inputs = V10._model()
    out = {
        "tensor.tmod": (V10._to_tensors(V10._tensor_values()), {"metadata": {"what": "a tensor"}}),
        "state_dict.tmod": (V10._to_tensors(V10._state_values()), {}),
        "nested.tmod": (V10._to_tensors(V10._nested_values()), {}),
        "dtypes.tmod": (_tensors(_dtype_values()), {"metadata": {"what": "every dtype"}}),
        "containers.tmod": (_containers(), {"metadata": {"what": "ModuleList, ModuleDict"}}),
        "sequential.tmod": (model, {"example_inputs": inputs,
                                    "metadata": {"what": "builtin-only Sequential"}}),
    }
    for name, (make, what) in MODELS.items():
        tm, inputs, *kwargs = make()
        kw = {"example_inputs": inputs, "metadata": {"what": what}}
        if kwargs:
            kw["example_kwargs"] = kwargs[0]
        out[name] = (tm, kw)
    return out


def _coverage():
    """schema/golden/coverage.py (by path: PyPI's coverage has that name)."""
    name = "golden_coverage"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, HERE.parent / "coverage.py")
        sys.modules[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules[name])
    return sys.modules[name]


def check(folder=HERE, version=VERSION):
    """What this folder's archives must hold, as messages (empty: all good):
    every function and builtin module type a ``version`` reader knows (at
    its version), every value tag, the module kinds, every dtype, and each
    archive written as ``version``."""
    coverage = _coverage()
    from mgtrace.serialization import values
    from mgtrace.serialization.version import released_names
    uses = coverage.folder_uses(folder)
    got = coverage.totals(uses.values())
    names = released_names(version) or {}
    out = []
    for name, u in uses.items():
        fv = u["versions"][0]
        if fv != version:
            out.append(f"{name} is format {'.'.join(map(str, fv))}, not "
                       f"{'.'.join(map(str, version))}")
    want = {"functions": set(names.get("functions", {}).items()),
            "module_types": set(names.get("module_types", {}).items()),
            # the tags a later format added (1.2's complex) are not this one's
            "tags": {t for t, d in values.TAGS.items() if tuple(d.since) <= tuple(version)},
            "kinds": {"builtin", "container", "traced"},
            "dtypes": set(DTYPES)}
    for k, items in want.items():
        missing = sorted(items - got[k])
        if missing:
            out.append(f"the {'.'.join(map(str, version))} golden archives miss {k} {missing}")
    return out


def main():
    force = "--force" in sys.argv
    if "--new" in sys.argv:     # write the archives not yet written, add them to the manifest
        return add_new()
    manifest = {}
    for name, (obj, kwargs) in build().items():
        path = HERE / name
        if path.exists() and not force:
            sys.exit(f"{path} exists; golden archives of a released format are never "
                     "regenerated (`--new` writes only the cases added since)")
        print(name, flush=True)
        mt.save(obj, path, target_version=VERSION, **kwargs)
        manifest[name] = "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()
    (HERE / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    problems = check()
    if problems:
        sys.exit("\n".join(problems))


def add_new():
    """``--new``: write each archive of MODELS that is not in manifest.json
    yet (a case added after the release, readable by 1.1's readers) and add
    its entry; every archive written before stays as it is, byte for byte."""
    manifest = json.loads((HERE / "manifest.json").read_text())
    for name, (make, what) in MODELS.items():
        if name in manifest:
            continue
        path = HERE / name
        if path.exists():
            sys.exit(f"{path} exists but is not in manifest.json")
        print(name, flush=True)
        tm, inputs, *kwargs = make()
        kw = {"example_inputs": inputs, "metadata": {"what": what}}
        if kwargs:
            kw["example_kwargs"] = kwargs[0]
        mt.save(tm, path, target_version=VERSION, **kw)
        manifest[name] = "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()
    (HERE / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    problems = check()
    if problems:
        sys.exit("\n".join(problems))


if __name__ == "__main__":
    main()
