"""Small hand-written nets for the traced-module archive tests.

Between them they record every expr kind (Input, GetAttr, CallMethod for
module calls, tensor methods, operators, in-place operators and
``__setitem__``, CallFunction of mgtrace.functional, of ``operator`` on
symbolic shapes and of a registered user function made traceable with
``wrap``, Constant, Apply), pytrees in arguments and results (dict,
namedtuple, nested, a list holding a symbolic int), a submodule traced for
two argument structures (two graphs), a traced submodule taking and
returning a namedtuple, and shared submodules.
"""
import collections
import warnings

import numpy as np

import mgtrace as mt
import mgtrace.functional as F
import mgtrace.module as M
import mgtrace.traced_module as tmod
from mgtrace import OpDef, apply
from mgtrace.serialization import register_function
from mgtrace.traced_module import TraceWarning

Pair = collections.namedtuple("Pair", "a b")


@register_function(name="tests.serialization.scaled_tanh")
@tmod.wrap
def scaled_tanh(x, k=1.0):
    return F.tanh(x) * k


class Block(M.Module):
    """Called with and without ``extra``: two graphs."""

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
    """Takes and returns a namedtuple (traced into: a graph with namedtuple in/out defs)."""

    def forward(self, p):
        return Pair(a=p.b * 2.0, b=p.a - 1.0)


class EveryExpr(M.Module):
    def __init__(self):
        super().__init__()
        self.block = Block()
        self.swap = Swap()
        self.swap_again = self.swap             # a shared traced submodule
        self.act = M.ReLU()
        self.alias = self.act                   # a shared builtin submodule
        self.seq = M.Sequential(M.Linear(4, 4), M.GELU())
        self.offsets = mt.tensor(np.arange(4, dtype=np.float32))   # a plain tensor attribute
        self.k = 3                                                   # a plain attribute
        self.weight = M.Parameter(mt.tensor(np.full((4,), 0.25, np.float32)))

    def forward(self, inp, pair):
        x = inp["x"]
        z = self.block(x) + self.block(x, {"bias": pair.a})
        q = self.swap_again(self.swap(pair))
        z = self.act(z) + self.alias(q.a) * self.weight
        z = self.seq(z)
        w = z * 1.0
        w += x                                   # in place: __iadd__
        w *= 2.0
        w[0] = 0.0                               # __setitem__
        w[:, 1] = x[:, 0]
        s = apply(OpDef("sin"), w)               # Apply (no method form)
        t = scaled_tanh(s, k=2.0)                # a registered user function
        n = x.shape[0]                           # symbolic shape
        r = t.reshape(n * 2, -1)
        u = F.concat([r, r + self.offsets[:2]], axis=0)
        c = mt.tensor(np.array([0.5, -2.0], np.float32))             # Constant
        v = (u * c).sum(axis=1, keepdims=True) @ mt.tensor(np.ones((1, 3), np.float32))
        return {"out": u, "pair": Pair(a=t.mean(axis=1), b=F.softmax(t, axis=-1)),
                "v": v.astype("float64")}, [n, -q.b]


def trace_quiet(net, *args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TraceWarning)
        return mt.trace_module(net, *args, **kwargs)


def every_expr_inputs(batch, seed=0):
    rng = np.random.default_rng(seed)

    def t(*shape):
        return mt.tensor(rng.standard_normal(shape).astype(np.float32))
    return {"x": t(batch, 4)}, Pair(t(batch, 4), t(batch, 4))


def every_expr_net(seed=0):
    mt.random.seed(seed)
    return EveryExpr().eval()


def assert_identical(a, b, path="out"):
    """Bit-for-bit equal results: tensors of the same dtype, shape and bytes;
    namedtuples of the same name and fields (a loaded module returns
    look-alike classes); other containers of the same type."""
    if isinstance(a, mt.Tensor):
        assert isinstance(b, mt.Tensor), f"{path}: {type(b).__name__}"
        assert (a.dtype, a.shape) == (b.dtype, b.shape), \
            f"{path}: {a.dtype}{a.shape} != {b.dtype}{b.shape}"
        assert a.numpy().tobytes() == b.numpy().tobytes(), f"{path}: values differ"
        return
    if isinstance(a, tuple) and hasattr(type(a), "_fields"):
        assert type(a).__name__ == type(b).__name__, path
        assert a._fields == getattr(b, "_fields", None), path
    else:
        assert type(a) is type(b), f"{path}: {type(a).__name__} != {type(b).__name__}"
    if isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            assert_identical(x, y, f"{path}[{i}]")
    elif isinstance(a, dict):
        assert list(a) == list(b), f"{path}: keys {list(a)} != {list(b)}"
        for k in a:
            assert_identical(a[k], b[k], f"{path}[{k!r}]")
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"
