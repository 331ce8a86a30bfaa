"""Builtin modules built from a blueprint (mgtrace.module.blueprint) are
the modules their constructor makes: the same attributes, tables, children,
repr and state, and the same outputs, for every builtin type whose state is
plain; a load builds all but the first module of a type and config that way
(its constructor, the reference, runs once)."""
import numpy as np
import pytest

import mgtrace as mt
import mgtrace.module as M
from mgtrace.module.blueprint import Blueprint, plain_value
from mgtrace.module.module import _Table
from mgtrace.serialization import builtin_modules

from .helpers import load_bytes, save_bytes
from .test_builtin_modules import EXAMPLES


def _fill(m, state):
    """``m``'s state set to ``state``'s tensors (the archive reader's way)."""
    for key, t in state.items():
        *path, name = key.split(".")
        owner = m
        for p in path:
            owner = owner._modules[p]
        table = owner._parameters if name in owner._parameters else owner._buffers
        table[name] = t


def _same_structure(a, b, where="m"):
    assert type(a) is type(b), where
    da, db = a.__dict__, b.__dict__
    assert list(da) == list(db), where
    for k in da:
        if k in ("_parameters", "_buffers", "_modules"):
            assert type(db[k]) is _Table and db[k] is not da[k], f"{where}.{k}"
            assert list(da[k]) == list(db[k]), f"{where}.{k}"
        elif k != "_non_persistent_buffers":
            assert type(da[k]) is type(db[k]) and da[k] == db[k], f"{where}.{k}"
    for name, child in da["_modules"].items():
        if child is None:
            assert db["_modules"][name] is None
        else:
            _same_structure(child, db["_modules"][name], f"{where}.{name}")


@pytest.mark.parametrize("name", EXAMPLES)
def test_a_blueprint_builds_what_the_constructor_does(name):
    mt.random.seed(0)
    m = getattr(M, name)(*EXAMPLES[name])
    bp = Blueprint.of(m)
    if bp is None:      # not plain: the reader runs the constructor for every copy
        d = {k: v for k, v in m.__dict__.items()
             if k not in ("_parameters", "_buffers", "_modules", "_non_persistent_buffers")}
        assert m.__dict__["_non_persistent_buffers"] or not all(map(plain_value, d.values())) \
            or any(Blueprint.of(c) is None for c in m._modules.values() if c is not None)
        return
    state = dict(m.state_dict(keep_vars=True))
    assert bp.state_shapes == {k: t.shape for k, t in state.items()}
    copy = bp.build()
    assert all(v is None for v in copy.state_dict(keep_vars=True).values()) or not state
    _fill(copy, state)
    _same_structure(m, copy)
    assert repr(copy) == repr(m)
    assert list(copy.state_dict(keep_vars=True).items()) == list(state.items())
    assert copy.config() == m.config()


class Pairs(M.Module):
    """Two of each of several builtin types, alike; a conv+bn fused module
    (children of its own) among them."""

    def __init__(self):
        super().__init__()
        self.blocks = [[M.Conv2d(4, 4, 3, padding=1), M.BatchNorm2d(4), M.ReLU(),
                        M.ConvBnRelu2d(4, 4, 1), M.GroupNorm(2, 4), M.Dropout(0.25)]
                       for _ in range(2)]
        self.head = [M.Linear(4, 4) for _ in range(2)]
        self.norm = M.LayerNorm(4)

    def forward(self, x):
        for block in self.blocks:
            for m in block:
                x = m(x)
        x = x.mean(axis=(2, 3))
        for fc in self.head:
            x = fc(x)
        return self.norm(x)


def test_a_load_builds_alike_modules_from_one_constructor_call(monkeypatch, rng):
    net = Pairs().eval()
    x = mt.tensor(rng.standard_normal((2, 4, 6, 6)).astype(np.float32))
    data = save_bytes(mt.trace_module(net, x))
    constructed = []
    real = builtin_modules._construct

    def counting(cls, name, config):
        constructed.append(name)
        return real(cls, name, config)
    monkeypatch.setattr(builtin_modules, "_construct", counting)
    fast = load_bytes(data)
    assert sorted(constructed) == sorted(set(constructed))          # one call per type+config
    assert len(constructed) == 8                 # 7 types twice, LayerNorm once
    monkeypatch.setattr(builtin_modules, "_MAX_BLUEPRINTS", 0)     # the constructor for each
    constructed.clear()
    slow = load_bytes(data)
    assert len(constructed) == 15
    pairs = list(zip(fast.modules(), slow.modules()))
    assert len(pairs) == len(list(slow.modules()))
    for (name, a), (_, b) in zip(fast.named_modules(), slow.named_modules()):
        if M.is_builtin(type(b)):
            _same_structure(b, a, name)
            assert repr(a) == repr(b)
    fast_state, slow_state = fast.state_dict(), slow.state_dict()
    assert list(fast_state) == list(slow_state) == list(net.state_dict())
    for k in slow_state:
        assert fast_state[k].numpy().tobytes() == slow_state[k].numpy().tobytes(), k
    want = net(x).numpy()
    assert fast(x).numpy().tobytes() == slow(x).numpy().tobytes() == want.tobytes()
    # copies are separate modules: a change to one is not seen in its twin
    fast.blocks[0][1].eps = 0.5
    assert fast.blocks[1][1].eps == 1e-5


class _Pos(M.Module):
    def forward(self, x, k=0.0):
        return x * 2 + k


class _Neg(M.Module):
    def forward(self, x, k=-0.0):
        return x * 2 + k


class _ThreeCalls(M.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = _Pos(), _Pos(), _Neg()

    def forward(self, x):
        return self.a(x) + self.b(x) + self.c(x)


def test_a_load_shares_equal_signatures_only():
    """Traced modules with equal stored signatures share one (immutable)
    inspect.Signature; a default of -0.0 is not taken for 0.0."""
    import math
    x = mt.tensor(np.array([1.0, -2.0], np.float32))
    out = load_bytes(save_bytes(mt.trace_module(_ThreeCalls(), x)))
    sa, sb, sc = (m.__dict__["_signature"] for m in (out.a, out.b, out.c))
    assert sa is sb and sc is not sa
    assert math.copysign(1, sa.parameters["k"].default) == 1
    assert math.copysign(1, sc.parameters["k"].default) == -1
    assert out(x).numpy().tolist() == [6.0, -12.0]
