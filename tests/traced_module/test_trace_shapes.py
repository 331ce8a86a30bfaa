"""Shapes read while tracing stay symbolic.

Each model is traced at batch 1 and must give eager's results (checked
against NumPy) at batch 4: the shape reads and the arithmetic on them are
recorded as exprs, not baked in as the traced numbers.
"""
import numpy as np
import pytest

import mgtrace as mt
import mgtrace.functional as F
import mgtrace.module as M
from mgtrace.traced_module import SymInt


def _rand(*shape, seed=0):
    return mt.tensor(np.random.default_rng(seed).standard_normal(shape).astype("float32"))


def _traced_at_1_run_at_4(net, *rest):
    x1, x4 = _rand(1, 3, 4, 6, seed=1), _rand(4, 3, 4, 6, seed=2)
    tm = mt.trace_module(net, x1)
    return tm, x4, tm(x4), net(x4)


class Reshape(M.Module):
    def forward(self, x):
        return x.reshape(x.shape[0], -1), F.flatten(x, 1)


class Unpack(M.Module):
    def forward(self, x):
        b, c, h, w = x.shape
        y = x.reshape(b, c * h * w // 2, 2)
        z = F.reshape(x, (b * c, h, w))[: b * c - 1]
        return y, z, (b * 2 - 1) % 3


class Slices(M.Module):
    def forward(self, x):
        _, _, h, w = x.shape
        return x[:, :, : h // 2, w - 2:], x[x.shape[0] - 1]


class Creates(M.Module):
    def forward(self, x):
        n = x.shape[0]
        return F.zeros((n, 4)) + 1.0, F.ones((2 * n + 1, -(-x.shape[1])))


@pytest.mark.parametrize("cls", [Reshape, Unpack, Slices, Creates])
def test_traced_at_batch_1_runs_at_batch_4(cls):
    tm, x, got, want = _traced_at_1_run_at_4(cls())
    for g, w in zip(got, want):
        if isinstance(w, int):
            assert g == w and type(g) is int
            continue
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_array_equal(g.numpy(), w.numpy())


def test_the_values_against_numpy():
    x = _rand(4, 3, 4, 6, seed=2)
    a = x.numpy()
    tm = mt.trace_module(Unpack(), _rand(1, 3, 4, 6))
    y, z, k = tm(x)
    np.testing.assert_array_equal(y.numpy(), a.reshape(4, 36, 2))
    np.testing.assert_array_equal(z.numpy(), a.reshape(12, 4, 6)[:11])
    assert k == (4 * 2 - 1) % 3
    tm = mt.trace_module(Slices(), _rand(1, 3, 4, 6))
    s, last = tm(x)
    np.testing.assert_array_equal(s.numpy(), a[:, :, :2, 4:])
    np.testing.assert_array_equal(last.numpy(), a[3])
    tm = mt.trace_module(Creates(), _rand(1, 3, 4, 6))
    zeros, ones = tm(x)
    np.testing.assert_array_equal(zeros.numpy(), np.ones((4, 4), "float32"))
    assert ones.shape == (9, 3)


def test_shape_reads_are_exprs_and_unused_ones_are_dropped():
    tm = mt.trace_module(Unpack(), _rand(1, 3, 4, 6))
    shape_reads = [e for e in tm.graph.exprs(False)
                   if e.kind == "call_method" and e.method == "shape"]
    assert len(shape_reads) == 1 and len(shape_reads[0].outputs) == 4
    arith = [e for e in tm.graph.exprs(False) if e.kind == "call_function"
             and e.func.__module__ == "_operator"]
    assert len(arith) >= 6                       # c*h, *w, //2, b*c (twice), -1, ...

    class Unused(M.Module):
        def forward(self, x):
            x.shape                              # read, never used
            return x + 1
    tm = mt.trace_module(Unused(), _rand(2, 2))
    assert not any(e.kind == "call_method" and e.method == "shape" for e in tm.graph.exprs(False))


def test_symint_arithmetic_outside_a_trace_is_plain_int():
    s = SymInt(6)
    assert s + 1 == 7 and type(s + 1) is int
    assert 2 * s == 12 and s // 4 == 1 and -s == -6 and 13 % s == 1
    assert repr(s) == "SymInt(6)"


class Sub(M.Module):
    def forward(self, x, n):
        return x.reshape(n, -1)


class PassesShape(M.Module):
    def __init__(self):
        super().__init__()
        self.sub = Sub()

    def forward(self, x):
        return self.sub(x, x.shape[0] * 2)


def test_a_shape_passed_to_a_submodule_stays_symbolic():
    net = PassesShape()
    tm = mt.trace_module(net, _rand(1, 4, 2))
    x = _rand(3, 4, 2, seed=1)
    want = x.numpy().reshape(6, -1)
    np.testing.assert_array_equal(tm(x).numpy(), want)
    np.testing.assert_array_equal(tm.flatten()(x).numpy(), want)
    assert tm.sub.graph.inputs[2].kind == "value"
