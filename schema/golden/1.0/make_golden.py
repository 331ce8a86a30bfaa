"""Write the format-1.0 golden archives (run once, at the release of 1.0).

    python schema/golden/1.0/make_golden.py [--force]

Golden archives are never regenerated: tests/serialization/test_golden.py
checks each file against manifest.json (sha256) and loads it with the
current reader, comparing with ``expected(name)`` -- values built here from
NumPy alone -- or, for models, running the stored example inputs and
comparing with the stored outputs. A new format version adds a new folder.

The models (each saved with example inputs and the outputs it gave):

* ``sequential.tmod``: a Sequential of builtin modules (no tracing);
* ``resnet18_small.tmod``, ``mobilenet_v2_small.tmod``, ``minilm_small.tmod``:
  traced ResNet-18, MobileNetV2 and the MiniLM encoder, the same graph
  structure (mgtrace.models' classes) at reduced width and depth, random
  weights from fixed seeds;
* ``every_builtin.tmod``: a traced net calling every builtin module type
  of mgtrace.module (and Sequential, ModuleList, ModuleDict);
* ``every_expr.tmod``: every expr kind, pytrees (dict, namedtuple, nested)
  in arguments and results, a submodule traced for two argument structures,
  shared submodules, shape arithmetic (``operator`` functions), and
  :func:`scaled_tanh`, a user function registered as
  ``mgtrace_golden.v1_0.scaled_tanh`` (this module registers it, so a
  reader imports this file before loading that archive);
* ``functional.tmod``: a call of (almost) every mgtrace.functional function;
* ``edited.tmod``: the small ResNet with its graph edited (insert_exprs,
  replace_node, compile); ``flattened.tmod``: the small MobileNetV2 flattened.
"""
import collections
import hashlib
import json
import math
import pathlib
import struct
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
from mgtrace import OpDef, apply  # noqa: E402
from mgtrace.models import minilm as _minilm  # noqa: E402
from mgtrace.models import mobilenet as _mobilenet  # noqa: E402
from mgtrace.models import resnet as _resnet  # noqa: E402
from mgtrace.serialization import register_function  # noqa: E402

NAN_WITH_PAYLOAD = struct.unpack("<d", struct.pack("<Q", 0x7FF8_0000_0000_BEEF))[0]


def _tensor_values():
    return (np.arange(24, dtype=np.float32).reshape(2, 3, 4) / 4 - 2)


def _state_values():
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    return OrderedDict([
        ("fc.weight", a / 8),
        ("fc.bias", np.array([-0.0, 1.5, np.inf], np.float32)),
        ("half", (a[:2] / 3).astype(np.float16)),
        ("bf16", (a[0] - 1.5).astype(ml_dtypes.bfloat16)),
        ("bytes", np.array([-128, -1, 0, 127], np.int8)),
        ("mask", np.array([[True, False], [False, True]])),
        ("steps", np.array(7, np.int64)),
        ("empty", np.zeros((0, 3), np.float64)),
    ])


def _nested_values():
    return {
        "floats": (1.0, -0.0, NAN_WITH_PAYLOAD, math.inf),
        (1, 2): "tuple key",
        3: [None, True, False, 0, b"\x00bytes"],
        "numpy": [np.float32(1.5), np.int64(-7), np.float16(0.25), np.bool_(True)],
        "big": [2 ** 100, -(2 ** 70), 2 ** 64 - 1],
        "index": (slice(1, None, 2), Ellipsis, slice(None)),
        "types": (np.dtype("int8"), mt.Device("cpu:0")),
        "weights": OrderedDict([("w", np.arange(6, dtype=np.float32).reshape(2, 3))]),
    }


def expected(name):
    """The value ``name`` holds, as NumPy arrays where it holds tensors."""
    return {"tensor.tmod": _tensor_values, "state_dict.tmod": _state_values,
            "nested.tmod": _nested_values}[name]()


def _to_tensors(v):
    if isinstance(v, np.ndarray):
        return mt.tensor(v)
    if isinstance(v, OrderedDict):
        return OrderedDict((k, _to_tensors(x)) for k, x in v.items())
    if isinstance(v, dict):
        return {k: _to_tensors(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return type(v)(_to_tensors(x) for x in v)
    return v


def _model():
    net = M.Sequential(
        M.Conv2d(3, 4, 3, padding=1), M.BatchNorm2d(4), M.ReLU(), M.MaxPool2d(2),
        M.Conv2d(4, 4, 3, groups=2, bias=False), M.AdaptiveAvgPool2d(1), M.Flatten(),
        M.Linear(4, 5), M.GELU(), M.Dropout(0.1), M.Linear(5, 3), M.Softmax(dim=-1))
    rng = np.random.default_rng(2024)
    state = OrderedDict()
    for k, t in net.state_dict().items():
        if t.dtype == np.int64:
            state[k] = np.array(10, np.int64)
        elif k.endswith("running_var"):
            state[k] = rng.uniform(0.5, 1.5, t.shape).astype(np.float32)
        else:
            state[k] = (0.4 * rng.standard_normal(t.shape)).astype(np.float32)
    net.load_state_dict(state)
    x = mt.tensor(np.random.default_rng(7).standard_normal((2, 3, 8, 8)).astype(np.float32))
    return net.eval(), (x,)


# ---------------------------------------------------------------- traced models

@register_function(name="mgtrace_golden.v1_0.scaled_tanh")
@tmod.wrap
def scaled_tanh(x, k=1.0):
    """The user function every_expr.tmod calls (registered by this module)."""
    return F.tanh(x) * k


Pair = collections.namedtuple("Pair", "a b")


def _randn(rng, *shape, scale=1.0):
    return mt.tensor((scale * rng.standard_normal(shape)).astype(np.float32))


def _randomise(net, seed):
    """Every parameter and buffer random from ``seed`` (running variances
    positive, int buffers kept)."""
    rng = np.random.default_rng(seed)
    state = OrderedDict()
    for k, t in net.state_dict().items():
        if np.dtype(t.dtype).kind != "f":
            state[k] = t.numpy()
        elif k.endswith("running_var"):
            state[k] = rng.uniform(0.5, 1.5, t.shape).astype(np.float32)
        else:
            state[k] = (0.3 * rng.standard_normal(t.shape)).astype(np.float32)
    net.load_state_dict(state)
    return net.eval()


def _trace(net, *args):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tmod.TraceWarning)
        return mt.trace_module(net, *args)


class ResNet(_resnet.ResNet):
    """mgtrace.models.ResNet (BasicBlocks, torchvision's layout) at widths
    (8, 16, 32, 64) instead of (64, 128, 256, 512)."""

    def __init__(self, layers=(1, 1, 1, 1), num_classes=10, widths=(8, 16, 32, 64)):
        M.Module.__init__(self)
        self.inplanes = widths[0]
        self.conv1 = M.Conv2d(3, widths[0], 7, stride=2, padding=3, bias=False)
        self.bn1 = M.BatchNorm2d(widths[0])
        self.relu = M.ReLU()
        self.maxpool = M.MaxPool2d(3, stride=2, padding=1)
        self.layer1 = self._make_layer(widths[0], layers[0])
        self.layer2 = self._make_layer(widths[1], layers[1], stride=2)
        self.layer3 = self._make_layer(widths[2], layers[2], stride=2)
        self.layer4 = self._make_layer(widths[3], layers[3], stride=2)
        self.avgpool = M.AdaptiveAvgPool2d((1, 1))
        self.fc = M.Linear(widths[3], num_classes)


def _resnet_small():
    net = _randomise(ResNet(), 10)
    x = _randn(np.random.default_rng(11), 2, 3, 32, 32)
    return _trace(net, x), (x,)


def _mobilenet_small():
    """mgtrace.models.MobileNetV2 at width 0.25 with three inverted-residual
    stages (one with a residual connection) instead of seven."""
    saved = _mobilenet.INVERTED_RESIDUAL_SETTING
    _mobilenet.INVERTED_RESIDUAL_SETTING = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 1, 2))
    try:
        net = _mobilenet.MobileNetV2(num_classes=10, width_mult=0.25)
    finally:
        _mobilenet.INVERTED_RESIDUAL_SETTING = saved
    net.last_channel = 64
    net.features[-1] = _mobilenet.ConvBNReLU6(net.features[-2].out_channels, 64, kernel_size=1)
    net.classifier[1] = M.Linear(64, 10)
    net = _randomise(net, 20)
    x = _randn(np.random.default_rng(21), 2, 3, 32, 32)
    return _trace(net, x), (x,)


def _minilm_small():
    mt.random.seed(30)
    net = _randomise(_minilm.MiniLM(vocab_size=64, hidden_size=16, num_hidden_layers=2,
                                    num_attention_heads=2, intermediate_size=32,
                                    max_position_embeddings=32), 30)
    rng = np.random.default_rng(31)
    ids = mt.tensor(rng.integers(0, 64, (2, 7)).astype(np.int32))
    mask = mt.tensor(np.array([[1] * 7, [1] * 4 + [0] * 3], np.int32))
    return _trace(net, ids, mask), (ids, mask)


class EveryBuiltin(M.Module):
    """Calls every builtin module type of mgtrace.module once or more."""

    def __init__(self):
        super().__init__()
        self.embed = M.Embedding(10, 6)
        self.conv1d = M.Conv1d(6, 6, 3, padding=1)
        self.bn1d = M.BatchNorm1d(6)
        self.norm = M.LayerNorm(6)
        self.acts = M.ModuleList([M.ReLU(), M.ReLU6(), M.GELU(), M.SiLU(), M.Sigmoid(),
                                  M.Tanh(), M.Hardswish(), M.Hardsigmoid(), M.Identity()])
        self.conv = M.Sequential(M.Conv2d(3, 4, 3, padding=1), M.BatchNorm2d(4),
                                 M.GroupNorm(2, 4), M.MaxPool2d(2), M.AvgPool2d(2))
        self.up = M.ConvTranspose2d(4, 4, 2, stride=2)
        self.heads = M.ModuleDict({"pool": M.AdaptiveAvgPool2d(1), "flat": M.Flatten()})
        self.fc = M.Linear(4 + 6, 5)
        self.drop = M.Dropout(0.5)
        self.softmax = M.Softmax(dim=-1)

    def forward(self, tokens, image):
        h = self.conv1d(self.embed(tokens).transpose(0, 2, 1))
        h = self.norm(self.bn1d(h).transpose(0, 2, 1))
        for act in self.acts:
            h = act(h) + h
        t = h.mean(axis=1)
        y = self.up(self.conv(image))
        y = self.heads["flat"](self.heads["pool"](y))
        return self.softmax(self.drop(self.fc(F.concat([y, t], axis=1))))


def _every_builtin():
    mt.random.seed(40)
    net = _randomise(EveryBuiltin(), 40)
    rng = np.random.default_rng(41)
    tokens = mt.tensor(rng.integers(0, 10, (2, 5)).astype(np.int32))
    return _trace(net, tokens, _randn(rng, 2, 3, 8, 8)), (tokens, _randn(rng, 2, 3, 8, 8))


class Block(M.Module):
    def __init__(self):
        super().__init__()
        self.fc = M.Linear(4, 4)
        self.register_buffer("scale", mt.tensor(np.linspace(0.5, 1.5, 4).astype(np.float32)))

    def forward(self, x, extra=None):
        y = self.fc(x) * self.scale
        if extra is not None:
            y = y + extra["bias"]
        return y


class Swap(M.Module):
    def forward(self, p):
        return Pair(a=p.b * 2.0, b=p.a - 1.0)


class EveryExpr(M.Module):
    """Every expr kind: Input, GetAttr (submodules, a parameter, a buffer, a
    plain tensor attribute), CallMethod (module calls, tensor methods,
    operators, in-place operators, __setitem__, shape), CallFunction
    (mgtrace.functional, ``operator`` on shapes, a registered user function),
    Constant, Apply."""

    def __init__(self):
        super().__init__()
        self.block = Block()
        self.swap = Swap()
        self.swap_again = self.swap
        self.act = M.ReLU()
        self.alias = self.act
        self.seq = M.Sequential(M.Linear(4, 4), M.GELU())
        self.offsets = mt.tensor(np.arange(4, dtype=np.float32))
        self.k = 3
        self.weight = M.Parameter(mt.tensor(np.full((4,), 0.25, np.float32)))

    def forward(self, inp, pair):
        x = inp["x"]
        z = self.block(x) + self.block(x, {"bias": pair.a})
        q = self.swap_again(self.swap(pair))
        z = self.act(z) + self.alias(q.a) * self.weight
        z = self.seq(z)
        w = z * 1.0
        w += x
        w -= 0.5
        w *= 2.0
        w[0] = 0.0
        w[:, 1] = x[:, 0]
        s = apply(OpDef("sin"), w)
        t = scaled_tanh(s, k=2.0)
        n = x.shape[0]
        r = t.reshape(n * 2, -1)
        u = F.concat([r, r + self.offsets[:2]], axis=0)
        c = mt.tensor(np.array([0.5, -2.0], np.float32))
        v = (u * c).sum(axis=1, keepdims=True) @ mt.tensor(np.ones((1, 3), np.float32))
        m = (n + 1) // 2 - n % 2
        return ({"out": u, "pair": Pair(a=t.mean(axis=1), b=F.softmax(t, axis=-1)),
                 "v": v.astype("float64"), "cmp": (abs(-t) > 0.5, ~(t < 0))},
                [n, -m, x.reshape(m + n - m, 4)])


def _every_expr():
    mt.random.seed(50)
    net = _randomise(EveryExpr(), 50)
    rng = np.random.default_rng(51)

    def args(batch):
        return ({"x": _randn(rng, batch, 4)}, Pair(_randn(rng, batch, 4), _randn(rng, batch, 4)))
    return _trace(net, *args(2)), args(3)


class Functional(M.Module):
    """One call of (almost) every mgtrace.functional function."""

    def forward(self, x, v, idx):
        p = F.abs(v) + 0.5                                    # positive [N, 8]
        u = F.sigmoid(v) * 0.9                                # in (0, 0.9)
        out = {}
        for name in ("abs", "ceil", "cos", "erf", "exp", "expm1", "floor", "neg", "relu",
                     "relu6", "round", "sigmoid", "sign", "silu", "sin", "softplus", "square",
                     "tan", "tanh", "trunc", "hardsigmoid", "hardswish", "gelu"):
            out[name] = getattr(F, name)(v)
        for name in ("log", "log1p", "log2", "rsqrt", "sqrt"):
            out[name] = getattr(F, name)(p)
        out["acos"], out["asin"], out["atan"] = F.acos(u), F.asin(u), F.atan(v)
        for name in ("add", "sub", "mul", "div", "maximum", "minimum", "atan2", "pow",
                     "floor_div", "mod"):
            out[name] = getattr(F, name)(v, p)
        for name in ("equal", "not_equal", "greater", "greater_equal", "less", "less_equal"):
            out[name] = getattr(F, name)(v, u)
        b1, b2 = F.greater(v, 0.0), F.less(v, 0.5)
        for name in ("logical_and", "logical_or", "logical_xor"):
            out[name] = getattr(F, name)(b1, b2)
        out["logical_not"] = F.logical_not(b1)
        out["isfinite"], out["isinf"], out["isnan"] = F.isfinite(v), F.isinf(v), F.isnan(v)
        out["clip"] = F.clip(v, -0.5, 0.5)
        out["where"] = F.where(b1, v, p)
        out["leaky_relu"] = F.leaky_relu(v, 0.2)
        out["gelu_tanh"] = F.gelu(v, approximate="tanh")
        for name in ("sum", "mean", "prod", "max", "min", "argmax", "argmin"):
            out[name] = getattr(F, name)(v, axis=1)
        out["std"], out["var"] = F.std(v, axis=0), F.var(v, axis=1, ddof=1)
        out["norm"], out["normalize"] = F.norm(v, axis=1), F.normalize(v, axis=-1)
        out["softmax"], out["log_softmax"] = F.softmax(v, axis=-1), F.log_softmax(v, axis=-1)
        out["cumsum"] = F.cumsum(v, axis=1)
        out["sort"], out["argsort"] = F.sort(v, axis=-1), F.argsort(v, descending=True)
        out["topk"] = F.topk(v, 3, descending=True)
        n = x.shape[0]
        out["reshape"] = F.reshape(v, (n, 2, 4))
        out["transpose"] = F.transpose(out["reshape"], (0, 2, 1))
        out["flatten"] = F.flatten(out["transpose"], 1)
        out["expand_dims"] = F.expand_dims(v, 1)
        out["squeeze"] = F.squeeze(out["expand_dims"], 1)
        out["broadcast_to"] = F.broadcast_to(F.expand_dims(v, 0), (2, n, 8))
        out["concat"] = F.concat([v, p], axis=1)
        out["stack"] = F.stack([v, p], axis=0)
        out["split"] = F.split(v, 2, axis=1)
        out["repeat"] = F.repeat(v, 2, axis=0)
        out["tile"] = F.tile(v, (1, 2))
        out["pad"] = F.pad(v, ((0, 0), (1, 2)), constant_value=-1.0)
        out["gather"] = F.gather(v, 1, idx)
        out["scatter"] = F.scatter(v, 1, idx, p[:, :3])
        out["one_hot"] = F.one_hot(idx, 8)
        out["astype"] = F.astype(v, "float16")
        out["copy"] = F.copy(v)
        out["matmul"] = F.matmul(v, p, transpose_b=True)
        out["dot"] = F.dot(v[0], p[0])
        out["zeros_like"], out["ones_like"] = F.zeros_like(v), F.ones_like(v, dtype="int32")
        out["full_like"] = F.full_like(v, 2.5)
        out["zeros"], out["ones"] = F.zeros((n, 2)), F.ones((2, n), dtype="int32")
        out["full"], out["eye"] = F.full((2, 3), 7.0), F.eye(3, 4)
        out["arange"], out["linspace"] = F.arange(0, 6, 2, dtype="int32"), F.linspace(0.0, 1.0, 5)
        w = mt.tensor(np.linspace(-1, 1, 4 * 4 * 3 * 3, dtype=np.float32).reshape(4, 4, 3, 3))
        out["conv2d"] = F.conv2d(x, w, None, 1, 1)
        out["conv1d"] = F.conv1d(x.reshape(n, 4, 36), w[:, :, 0], None, 2)
        out["conv_transpose2d"] = F.conv_transpose2d(x, w, stride=2)
        out["max_pool2d"] = F.max_pool2d(x, 2)
        out["avg_pool2d"] = F.avg_pool2d(x, 3, stride=2, padding=1)
        out["adaptive_avg_pool2d"] = F.adaptive_avg_pool2d(x, (2, 3))
        out["adaptive_max_pool2d"] = F.adaptive_max_pool2d(x, (3, 2))
        out["interpolate"] = F.interpolate(x, scale_factor=2, mode="bilinear", align_corners=False)
        ones4 = mt.tensor(np.ones(4, np.float32))
        out["batch_norm"] = F.batch_norm(x, ones4 * 0.1, ones4 * 1.5, ones4, ones4 * 0.2)
        out["layer_norm"] = F.layer_norm(v, (8,))
        out["group_norm"] = F.group_norm(x, 2)
        out["linear"] = F.linear(v, p, None)
        out["embedding"] = F.embedding(idx, v)
        out["dropout"] = F.dropout(v, 0.5, training=False)
        return out


def _functional():
    rng = np.random.default_rng(60)

    def args(batch):
        return (_randn(rng, batch, 4, 6, 6), _randn(rng, batch, 8),
                mt.tensor(rng.integers(0, batch, (batch, 3)).astype(np.int32)))
    return _trace(Functional(), *args(2)), args(3)


def _edited():
    tm, inputs = _resnet_small()
    g = tm.graph
    fc = g.get_module_by_type(M.Linear).as_unique()
    call = fc.users[0]
    out = call.outputs[0]
    with g.insert_exprs(call):
        scaled = F.relu(out) * 0.5 - 1.0
    g.replace_node({out: scaled})
    g.compile().lint()
    return tm, inputs


def _flattened():
    tm, inputs = _mobilenet_small()
    return tm.flatten(), inputs


MODELS = {    # name -> (make() -> (traced module, example inputs), description)
    "resnet18_small.tmod": (_resnet_small,
                            "traced ResNet-18 structure, widths 8-64, 1 block a stage"),
    "mobilenet_v2_small.tmod": (_mobilenet_small,
                                "traced MobileNetV2 structure, width 0.25, 3 stages"),
    "minilm_small.tmod": (_minilm_small, "traced MiniLM encoder, hidden 16, 2 layers, 2 heads"),
    "every_builtin.tmod": (_every_builtin, "every builtin module type of mgtrace.module"),
    "every_expr.tmod": (_every_expr, "every expr kind, pytrees, shared modules, a user function"),
    "functional.tmod": (_functional, "every mgtrace.functional function"),
    "edited.tmod": (_edited, "the small ResNet after insert_exprs, replace_node, compile"),
    "flattened.tmod": (_flattened, "the small MobileNetV2 flattened"),
}


def _check_coverage(archives):
    """every_builtin.tmod holds every builtin type, functional.tmod every function."""
    import mgtrace.functional
    from mgtrace.serialization import read_header, registry
    types = set()
    for m in read_header(archives["every_builtin.tmod"])["modules"]:
        types.add(m.get("type") or f"mgtrace.module.{m.get('reads_as')}")
    missing = set(registry.own_module_types()) - set(registry.CONTAINERS) - types
    missing |= {"mgtrace.module.sequence", "mgtrace.module.dict"} - types   # traced into
    ops = {o["name"] for o in read_header(archives["functional.tmod"])["ops"]}
    missing |= {f"mgtrace.functional.{n}" for n in mgtrace.functional.__all__} - ops
    if missing:
        sys.exit(f"the golden models miss {sorted(missing)}")


def build():
    """name -> (object, save keyword arguments)."""
    model, inputs = _model()
    out = {
        "tensor.tmod": (_to_tensors(_tensor_values()), {"metadata": {"what": "a tensor"}}),
        "state_dict.tmod": (_to_tensors(_state_values()), {}),
        "nested.tmod": (_to_tensors(_nested_values()), {}),
        "sequential.tmod": (model, {"example_inputs": inputs,
                                    "metadata": {"what": "builtin-only Sequential"}}),
    }
    for name, (make, what) in MODELS.items():
        tm, inputs = make()
        out[name] = (tm, {"example_inputs": inputs, "metadata": {"what": what}})
    return out


def main():
    force = "--force" in sys.argv
    manifest = {}
    for name, (obj, kwargs) in build().items():
        path = HERE / name
        if path.exists() and not force:
            sys.exit(f"{path} exists; golden archives are never regenerated")
        mt.save(obj, path, **kwargs)
        manifest[name] = "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()
    _check_coverage({name: HERE / name for name in MODELS})
    (HERE / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")


if __name__ == "__main__":
    main()
