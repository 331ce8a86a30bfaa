"""Tensors made inside forward are recorded (issue 13, point 1): every call of
the TracedModule builds them afresh from that call's values, shape-derived
data stays symbolic, and a constant is never written by running the graph."""
import io
import warnings

import numpy as np
import pytest

import mgtrace as mt
import mgtrace.functional as F
import mgtrace.module as M
from mgtrace.traced_module import TraceWarning
from mgtrace.traced_module.expr import CallFunction, Constant


def _x(*shape, seed=0):
    return mt.tensor(np.random.default_rng(seed).standard_normal(shape).astype("float32"))


def _functions(tm):
    return [e for e in tm.graph._exprs if isinstance(e, CallFunction)]


class InPlaceOnNew(M.Module):
    """The issue's example: eager gives x + 2 on every call."""

    def forward(self, x):
        y = mt.tensor([1.0, 1.0, 1.0])
        y += 1
        return x + y


def test_a_tensor_made_in_forward_is_fresh_on_every_call():
    x = _x(2, 3)
    net = InPlaceOnNew()
    tm = mt.trace_module(net, x)
    want = x.numpy() + 2.0
    for _ in range(3):
        np.testing.assert_array_equal(tm(x).numpy(), want)
        np.testing.assert_array_equal(net(x).numpy(), want)
    made = [e for e in _functions(tm) if e.func is mt.tensor]
    assert len(made) == 1 and made[0].args == ([1.0, 1.0, 1.0],)
    assert "mgtrace.tensor([1.0, 1.0, 1.0])" in repr(tm.graph)
    assert not any(isinstance(e, Constant) for e in tm.graph._exprs)


class Constructors(M.Module):
    def forward(self, x):
        a = mt.Tensor([[2.0, 2.0, 2.0]])            # the class, as MegEngine users write it
        a *= 3
        c = mt.tensor(x)                             # a copy of the input
        c += 1
        d = mt.tensor(np.array([0.5, 0.25, 0.125], np.float32), dtype="float64")
        d[0] = 9.0
        return x + a + c, d


def test_constructor_copies_and_arrays_each_run_fresh():
    x = _x(2, 3)
    tm = mt.trace_module(Constructors(), x)
    for _ in range(3):
        s, d = tm(x)
        np.testing.assert_allclose(s.numpy(), x.numpy() + 6.0 + x.numpy() + 1.0, rtol=1e-6)
        assert d.dtype == np.float64 and d.tolist() == [9.0, 0.25, 0.125]
    np.testing.assert_array_equal(tm(x)[0].numpy(), Constructors()(x)[0].numpy())
    x2 = _x(2, 3, seed=5)
    before = x2.numpy().copy()
    tm(x2)
    np.testing.assert_array_equal(x2.numpy(), before)          # the copy, not the input, changed
    # the array became a constant the graph copies: running never writes it
    const = next(e for e in tm.graph._exprs if isinstance(e, Constant))
    assert const.value.tolist() == [0.5, 0.25, 0.125]


class FromShape(M.Module):
    def forward(self, x):
        return mt.tensor(x.shape) + 1, mt.Tensor([x.shape[0] * 2, 7])


def test_a_tensor_of_shape_entries_stays_symbolic():
    tm = mt.trace_module(FromShape(), _x(1, 3))
    a, b = tm(_x(2, 3))
    assert a.tolist() == [3, 4] and b.tolist() == [4, 7]
    a, b = tm(_x(5, 4))
    assert a.tolist() == [6, 5] and b.tolist() == [10, 7]


def test_no_warning_for_tensors_made_in_forward():
    with warnings.catch_warnings():
        warnings.simplefilter("error", TraceWarning)
        mt.trace_module(InPlaceOnNew(), _x(2, 3))
        mt.trace_module(FromShape(), _x(1, 3))


_GLOBAL = mt.tensor([1.0, 2.0, 3.0])


class WritesAConstantView(M.Module):
    def forward(self, x):
        y = _GLOBAL.reshape(1, 3)           # made outside forward: a constant
        z = y * 1
        z[0, 0] = 5.0
        return x + z


def test_a_graph_that_writes_runs_on_copies_of_its_constants():
    x = _x(2, 3)
    with pytest.warns(TraceWarning, match="kept as a constant"):
        tm = mt.trace_module(WritesAConstantView(), x)
    want = x.numpy() + np.array([5.0, 2.0, 3.0], np.float32)
    for _ in range(3):
        np.testing.assert_array_equal(tm(x).numpy(), want)
    assert _GLOBAL.tolist() == [1.0, 2.0, 3.0]
    assert ".copy()" in tm.code                  # the constant is copied before use


class InPlaceOnConstant(M.Module):
    def forward(self, x):
        y = _GLOBAL.reshape(1, 3)
        y += 1                                    # eager writes the global itself
        return x + y


def test_in_place_on_a_constant_never_reaches_the_constant():
    x = _x(2, 3)
    _GLOBAL[...] = mt.tensor([1.0, 2.0, 3.0])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TraceWarning)
        from mgtrace.traced_module import disable_default_checker
        was = disable_default_checker()          # eager changes the global: not repeatable
        try:
            tm = mt.trace_module(InPlaceOnConstant(), x)
        finally:
            disable_default_checker(was)
    held = _GLOBAL.numpy().copy()                 # [2, 3, 4] after the eager trace run
    for _ in range(3):
        np.testing.assert_array_equal(tm(x).numpy(), x.numpy() + held + 1)
    np.testing.assert_array_equal(_GLOBAL.numpy(), held)
    _GLOBAL[...] = mt.tensor([1.0, 2.0, 3.0])


def test_retracing_and_saving_keep_the_creation():
    x = _x(1, 3)
    tm = mt.trace_module(FromShape(), x)
    again = mt.trace_module(tm, x)
    assert any(e.func is mt.tensor for e in _functions(again))
    buf = io.BytesIO()
    mt.save(again, buf)
    loaded = mt.load(io.BytesIO(buf.getvalue()))
    assert loaded(_x(4, 3))[0].tolist() == [5, 4]
    with pytest.raises(ValueError, match="function 'mgtrace.tensor' is new since format 1.0"):
        mt.save(tm, io.BytesIO(), target_version=(1, 0))


def test_tensors_made_by_functional_calls_stay_recorded_as_before():
    class Zeros(M.Module):
        def forward(self, x):
            z = F.zeros((x.shape[0], 2))
            z += 1
            return z
    tm = mt.trace_module(Zeros(), _x(1, 3))
    for _ in range(2):
        assert tm(_x(3, 3)).tolist() == [[1.0, 1.0]] * 3
