"""The MegEngine test files in data/ (written by data/make_files.py with
MegEngine 1.13), the same models written with mgtrace.module, and
MegEngine's stored inputs and outputs."""
import os

import numpy as np

import mgtrace as mt
import mgtrace.functional as F
import mgtrace.module as M

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")
CASES = ["cnn", "containers", "dict_io", "fused"]


def path(name, ext):
    return os.path.join(DATA, name + ext)


class ConvBNBlock(M.Module):
    def __init__(self, cin, cout, groups=1, stride=1):
        super().__init__()
        self.conv = M.Conv2d(cin, cout, 3, stride=stride, padding=1, groups=groups)
        self.bn = M.BatchNorm2d(cout)

    def forward(self, x):
        return F.relu(self.bn(self.conv(x)))


class CNN(M.Module):
    def __init__(self):
        super().__init__()
        self.stem = ConvBNBlock(3, 8)
        self.grouped = ConvBNBlock(8, 12, groups=4, stride=2)
        self.depthwise = M.Conv2d(12, 12, 3, padding=1, groups=12)
        self.pw = M.Conv2d(12, 16, 1, bias=False)
        self.bn = M.BatchNorm2d(16)
        self.pool = M.MaxPool2d(2)
        self.fc1 = M.Linear(16 * 2 * 2, 10)
        self.fc2 = M.Linear(10, 4)

    def forward(self, x):
        x = self.grouped(self.stem(x))
        x = F.relu(self.bn(self.pw(self.depthwise(x))))
        x = self.pool(x)
        x = x.reshape(x.shape[0], -1)
        return self.fc2(F.relu(self.fc1(x)))


class Containers(M.Module):
    def __init__(self):
        super().__init__()
        self.blocks = [M.Linear(6, 6), M.Linear(6, 6, bias=False)]
        self.heads = {"a": M.Linear(6, 3), "b": M.Linear(6, 2)}
        self.seq = M.Sequential(M.Conv1d(2, 4, 3, padding=1), M.ReLU())
        self.up = M.ConvTranspose2d(4, 2, 2, stride=2)
        self.offset = mt.tensor(np.zeros(6, np.float32))
        self.gain = mt.tensor(np.float32(1.0))

    def forward(self, x, img):
        for blk in self.blocks:
            x = F.relu(blk(x) + self.offset)
        y = self.seq(x.reshape(x.shape[0], 2, 3))
        z = self.up(img)
        return (self.heads["a"](x) * self.gain, self.heads["b"](x)), y.flatten(1), z


class DictIO(M.Module):
    def __init__(self):
        super().__init__()
        self.enc = M.Linear(5, 7)
        self.norm = M.LayerNorm(7)
        self.cls = M.Linear(7, 3)

    def forward(self, batch, *, temperature):
        h = self.norm(F.gelu(self.enc(batch["feat"])))
        ramp = mt.tensor(np.linspace(0.5, 1.5, 7).astype("float32"))
        h = h + F.expand_dims(batch["bias"], axis=0) * ramp
        logits = self.cls(h) / temperature
        both = F.concat([logits, F.softmax(logits, axis=1)], axis=1)
        return {"logits": logits, "probs": F.softmax(logits, axis=-1),
                "both": both.reshape(both.shape[0], 2, -1).mean(axis=2)}


class Fused(M.Module):
    def __init__(self):
        super().__init__()
        self.cbr = M.ConvBnRelu2d(3, 6, 3, padding=1, groups=3)
        self.cb = M.ConvBn2d(6, 6, 1, bias=False)
        self.cr = M.ConvRelu2d(6, 4, 3, stride=2)
        self.add = M.Elemwise("fuse_add_relu")
        self.bn1 = M.BatchNorm1d(4)

    def forward(self, x):
        y = self.cb(self.cbr(x))
        y = self.cr(self.add(y, F.concat([x, x], axis=1)))
        return self.bn1(y.mean(axis=(2, 3)))


MODELS = {"cnn": CNN, "containers": Containers, "dict_io": DictIO, "fused": Fused}


def stored(name):
    """{batch: (args, kwargs, {output path: array})} from data/NAME.npz."""
    with np.load(path(name, ".npz")) as z:
        arrays = {k: z[k] for k in z.files}
    batches = sorted({int(k.split(".")[1]) for k in arrays})
    out = {}
    for b in batches:
        ins = {k[len(f"in.{b}."):]: v for k, v in arrays.items() if k.startswith(f"in.{b}.")}
        outs = {k[len(f"out.{b}"):]: v for k, v in arrays.items() if k.startswith(f"out.{b}")}
        out[b] = (_build(ins, "args"), _build(ins, "kwargs"), outs)
    return out


def _build(flat, root):
    """Nested args (a tuple) or kwargs (a dict) of Tensors from 'args.0.feat'
    style keys (digits index tuples, words key dicts)."""
    tree = {}
    for key, v in flat.items():
        parts = key.split(".")
        if parts[0] != root:
            continue
        node = tree
        for p in parts[1:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = mt.tensor(v)

    def fix(node):
        if not isinstance(node, dict):
            return node
        node = {k: fix(v) for k, v in node.items()}
        if node and all(k.isdigit() for k in node):
            return tuple(node[str(i)] for i in range(len(node)))
        return node
    built = fix(tree)
    if root == "args":
        return built if isinstance(built, tuple) else ()
    return built if isinstance(built, dict) else {}


def flat_outputs(value, prefix=""):
    """{'.logits': array, '.0.1': array, '': array} as make_files.py names them."""
    out = {}
    if isinstance(value, dict):
        for k, v in value.items():
            out.update(flat_outputs(v, f"{prefix}.{k}"))
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            out.update(flat_outputs(v, f"{prefix}.{i}"))
    else:
        out[prefix] = np.asarray(value.numpy())
    return out


def assert_matches(got, want, rtol=1e-5):
    """Every output within rtol of its own scale (max |want|) of MegEngine's."""
    got = flat_outputs(got)
    assert sorted(got) == sorted(want)
    for k, w in want.items():
        g = got[k]
        assert g.shape == w.shape, (k, g.shape, w.shape)
        scale = max(float(np.abs(w).max()), 1e-30)
        err = float(np.abs(g.astype(np.float64) - w).max())
        assert err <= rtol * scale, f"output {k!r}: max error {err:.3g}, scale {scale:.3g}"
