"""Writes the MegEngine test files in this folder, with MegEngine 1.13 itself.

Run with a Python 3.10 venv that has ``megengine==1.13.0`` and ``numpy<2``
(MegEngine has no wheel for the 3.11 that CI runs)::

    python3.10 -m venv mge310 && mge310/bin/pip install megengine==1.13.0 'numpy<2'
    mge310/bin/python tests/megengine/data/make_files.py

For each case NAME it writes

* ``NAME.tm``: the traced module, as ``megengine.save`` writes it (a pickle);
* ``NAME.pkl``: the model's ``state_dict()``, as ``megengine.save`` writes it;
* ``NAME.npz``: MegEngine's inputs and outputs, at the traced batch and at
  another: ``in.B.PATH`` and ``out.B.PATH`` where B is the batch and PATH the
  place of the tensor in the (args, kwargs) / output tree, e.g.
  ``in.2.args.0``, ``in.2.kwargs.scale``, ``out.5.logits``.

Everything is seeded, so a rerun writes the same numbers (the pickles may
differ in MegEngine's object ids only).
"""
import os

import numpy as np

import megengine as mge
import megengine.functional as F
import megengine.module as M
import megengine.traced_module as tm

HERE = os.path.dirname(os.path.abspath(__file__))


def _randomize(net, seed):
    """Non-trivial values for every parameter and buffer (BatchNorm's
    statistics included), so a state dict loaded wrongly shows."""
    rng = np.random.RandomState(seed)
    def fresh(low, shape):
        return mge.Tensor(np.asarray(rng.uniform(low, low + 1.0, shape), "float32").reshape(shape))
    for _, t in sorted(net.named_parameters(), key=lambda kv: kv[0]):
        t._reset(fresh(-0.5, t.shape))
    for name, t in sorted(net.named_buffers(), key=lambda kv: kv[0]):
        t._reset(fresh(0.5 if name.endswith("running_var") else -0.5, t.shape))


# --------------------------------------------------------------- the models

class ConvBNBlock(M.Module):
    def __init__(self, cin, cout, groups=1, stride=1):
        super().__init__()
        self.conv = M.Conv2d(cin, cout, 3, stride=stride, padding=1, groups=groups, bias=True)
        self.bn = M.BatchNorm2d(cout)

    def forward(self, x):
        return F.relu(self.bn(self.conv(x)))


class CNN(M.Module):
    """Convs with BatchNorm, a grouped and a depthwise conv, pooling, a
    symbolic reshape (x.shape[0]) and linear layers."""

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
    """Modules in a plain list and a plain dict, a Sequential, and tensor
    attributes (buffers by MegEngine's rules), a conv-transpose and a 1-d
    conv (MegEngine 1.13's grouped Conv1d fails its own weight check)."""

    def __init__(self):
        super().__init__()
        self.blocks = [M.Linear(6, 6), M.Linear(6, 6, bias=False)]
        self.heads = {"a": M.Linear(6, 3), "b": M.Linear(6, 2)}
        self.seq = M.Sequential(M.Conv1d(2, 4, 3, padding=1), M.ReLU())
        self.up = M.ConvTranspose2d(4, 2, 2, stride=2)
        self.offset = mge.Tensor(np.linspace(-1, 1, 6).astype("float32"))
        self.gain = mge.Tensor(np.float32(1.5))

    def forward(self, x, img):
        for blk in self.blocks:
            x = F.relu(blk(x) + self.offset)
        y = self.seq(x.reshape(x.shape[0], 2, 3))
        z = self.up(img)
        return (self.heads["a"](x) * self.gain, self.heads["b"](x)), y.flatten(1), z


class DictIO(M.Module):
    """Dict inputs and outputs, keyword arguments (a keyword input of the
    traced call, functional keyword arguments), a tensor made in forward (a
    Constant of the graph), softmax and concat."""

    def __init__(self):
        super().__init__()
        self.enc = M.Linear(5, 7)
        self.norm = M.LayerNorm(7)
        self.cls = M.Linear(7, 3)

    def forward(self, batch, *, temperature):
        h = self.norm(F.gelu(self.enc(batch["feat"])))
        ramp = mge.tensor(np.linspace(0.5, 1.5, 7).astype("float32"))   # a graph Constant
        h = h + F.expand_dims(batch["bias"], axis=0) * ramp
        logits = self.cls(h) / temperature
        both = F.concat([logits, F.softmax(logits, axis=1)], axis=1)
        return {"logits": logits, "probs": F.softmax(logits, axis=-1),
                "both": both.reshape(both.shape[0], 2, -1).mean(axis=2)}


class Fused(M.Module):
    """MegEngine's fused float modules (ConvBn2d, ConvBnRelu2d with groups,
    ConvRelu2d, Elemwise) and a BatchNorm1d."""

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


def _inputs(case, batch, rng):
    if case == "cnn":
        return (rng.standard_normal((batch, 3, 8, 8)).astype("float32"),), {}
    if case == "fused":
        return (rng.standard_normal((batch, 3, 7, 7)).astype("float32"),), {}
    if case == "containers":
        return (rng.standard_normal((batch, 6)).astype("float32"),
                rng.standard_normal((batch, 4, 3, 3)).astype("float32")), {}
    return ({"feat": rng.standard_normal((batch, 5)).astype("float32"),
             "bias": rng.standard_normal((7,)).astype("float32")},), \
        {"temperature": np.float32(0.7)}


CASES = {"cnn": (CNN, 2, 5), "containers": (Containers, 3, 1), "dict_io": (DictIO, 2, 4),
         "fused": (Fused, 2, 3)}


def _flat(prefix, value, out):
    if isinstance(value, dict):
        for k, v in value.items():
            _flat(f"{prefix}.{k}", v, out)
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            _flat(f"{prefix}.{i}", v, out)
    else:
        out[prefix] = np.asarray(value.numpy() if hasattr(value, "numpy") else value)


def _to_mge(value):
    if isinstance(value, dict):
        return {k: _to_mge(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_to_mge(v) for v in value)
    return mge.Tensor(value)


def make(name, seed=0):
    cls, traced_batch, other_batch = CASES[name]
    np.random.seed(seed)
    net = cls()
    _randomize(net, seed)
    net.eval()
    rng = np.random.RandomState(seed + 1)
    arrays = {}
    traced = None
    for batch in (traced_batch, other_batch):
        args, kwargs = _inputs(name, batch, rng)
        margs, mkwargs = _to_mge(args), _to_mge(kwargs)
        if traced is None:
            traced = tm.trace_module(net, *margs, **mkwargs)
            traced.eval()
        _flat(f"in.{batch}.args", args, arrays)
        _flat(f"in.{batch}.kwargs", kwargs, arrays)
        want = net(*margs, **mkwargs)
        got = traced(*margs, **mkwargs)
        _flat(f"out.{batch}", want, arrays)
        check = {}
        _flat("", got, check)
        for k, v in check.items():
            assert np.allclose(v, arrays[f"out.{batch}{k}"], atol=1e-6), (name, k)
    mge.save(traced, os.path.join(HERE, name + ".tm"))
    mge.save(net.state_dict(), os.path.join(HERE, name + ".pkl"))
    np.savez(os.path.join(HERE, name + ".npz"), **arrays)
    print(name, traced_batch, other_batch, sorted(arrays))


if __name__ == "__main__":
    for case in CASES:
        make(case)
