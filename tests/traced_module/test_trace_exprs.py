"""What each kind of Python operation in forward becomes in the graph.

Functional calls -> CallFunction; tensor methods and operators and builtin
module calls -> CallMethod; parameters, buffers and submodules -> GetAttr;
tensors from mgtrace.functional creation functions -> recorded calls (fresh
on every run); tensors made from NumPy inside forward -> Constant (with a
TraceWarning); raw core ops without a method form -> Apply. Non-builtin
submodules become nested TracedModules; Sequential is traced into;
register_as_builtin makes a user class a leaf; wrap records a user function
as one CallFunction. Every test also checks the values against eager.
"""
import warnings

import numpy as np
import pytest

import mgtrace as mt
import mgtrace.functional as F
import mgtrace.module as M
import mgtrace.traced_module as tmod
from mgtrace import OpDef, apply
from mgtrace.traced_module import TracedModule, TraceWarning


def _t(a):
    return mt.tensor(np.asarray(a, dtype="float32"))


def _rand(*shape, seed=0):
    return _t(np.random.default_rng(seed).standard_normal(shape))


def _exprs(graph):
    return [e for e in graph.exprs(recursive=False) if e.kind != "input"]


def _trace_quiet(mod, *args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TraceWarning)
        return mt.trace_module(mod, *args, **kwargs)


# ---------------------------------------------------------------- functions
@tmod.wrap
def scaled_tanh(x, k):
    return F.tanh(x) * k


def shift(x, by):          # made traceable at the top level, below
    return x - by


tmod.wrap(shift)


class Funcs(M.Module):
    def forward(self, x):
        return shift(scaled_tanh(F.relu(x), 2.0), 0.5)


def test_functional_and_wrapped_calls_are_call_function():
    net, x = Funcs(), _rand(2, 3)
    tm = mt.trace_module(net, x)
    es = _exprs(tm.graph)
    assert [e.kind for e in es] == ["call_function"] * 3
    assert es[0].func is F.relu
    assert es[1].func.__wrapped__ is scaled_tanh.__wrapped__ and es[1].args[1] == 2.0
    assert es[2].func.__wrapped__.__name__ == "shift" and es[2].args[1] == 0.5
    # wrapped bodies are not traced: no tanh / mul exprs anywhere
    assert all(getattr(e, "func", None) is not F.tanh for e in tm.graph.exprs())
    x2 = _rand(4, 3, seed=1)
    want = np.tanh(np.maximum(x2.numpy(), 0)) * 2.0 - 0.5
    np.testing.assert_allclose(tm(x2).numpy(), want, rtol=1e-6, atol=1e-6)


def test_wrap_rejects_non_callables():
    with pytest.raises(TypeError, match="wrap takes a function"):
        tmod.wrap(3)


# ------------------------------------------------------------ tensor methods
class Methods(M.Module):
    def forward(self, x, y):
        a = (x + y) * 2 - x / (y * y + 1)
        b = (x @ y.transpose(1, 0)).sum(axis=1, keepdims=True)
        c = -x.reshape(x.shape[0], -1)[:, 1:]
        d = abs(x) ** 2 + x.max(axis=0)
        return a, b, c, d, x > y


def test_tensor_methods_and_operators_are_call_method():
    net, x, y = Methods(), _rand(3, 4), _rand(3, 4, seed=1)
    tm = mt.trace_module(net, x, y)
    es = _exprs(tm.graph)
    assert {e.kind for e in es} == {"call_method"}
    methods = [e.method for e in es]
    for m in ("__add__", "__mul__", "__sub__", "__truediv__", "transpose", "__matmul__", "sum",
              "reshape", "__getitem__", "__neg__", "__abs__", "__pow__", "max", "__gt__", "shape"):
        assert m in methods, m
    sum_expr = next(e for e in es if e.method == "sum")
    assert sum_expr.kwargs["axis"] == 1 and sum_expr.kwargs["keepdims"] is True
    x2, y2 = _rand(5, 4, seed=2), _rand(5, 4, seed=3)
    for got, want in zip(tm(x2, y2), net(x2, y2)):
        assert got.shape == want.shape and got.dtype == want.dtype
        np.testing.assert_array_equal(got.numpy(), want.numpy())


class InPlace(M.Module):
    def forward(self, x, y):
        z = x * 1.0
        z += y
        z *= 3.0
        z[0] = 0.0
        z[:, 1] = y[:, 0]
        return z


def test_in_place_ops_and_setitem_are_recorded():
    net = InPlace()
    tm = mt.trace_module(net, _rand(3, 2), _rand(3, 2, seed=1))
    methods = [e.method for e in _exprs(tm.graph) if e.kind == "call_method"]
    assert methods.count("__setitem__") == 2
    assert "__iadd__" in methods and "__imul__" in methods
    x, y = _rand(4, 2, seed=5), _rand(4, 2, seed=6)
    want = (x.numpy() + y.numpy()) * 3.0
    want[0] = 0.0
    want[:, 1] = y.numpy()[:, 0]
    np.testing.assert_allclose(tm(x, y).numpy(), want, rtol=1e-6)
    assert "z[0] = 0.0" not in tm.code          # names are the graph's, but the form is
    assert "] = 0.0" in tm.code                  # a subscript assignment, not __setitem__


# ------------------------------------------------------ parameters, modules
class WithParams(M.Module):
    def __init__(self):
        super().__init__()
        self.fc = M.Linear(3, 2)
        self.scale = M.Parameter(_t([2.0, -1.0]))
        self.register_buffer("offset", _t([0.5, 0.25]))

    def forward(self, x):
        return self.fc(x) * self.scale + self.offset


def test_parameters_buffers_and_submodules_are_getattr():
    net, x = WithParams(), _rand(4, 3)
    tm = mt.trace_module(net, x)
    es = _exprs(tm.graph)
    getattrs = {e.name: e for e in es if e.kind == "getattr"}
    assert set(getattrs) == {"fc", "scale", "offset"}
    call = next(e for e in es if e.kind == "call_method" and e.method == "__call__")
    assert call.args[0] is getattrs["fc"].outputs[0]
    assert call.args[0].owner is net.fc                   # the builtin is shared
    # GetAttr reads the current value: changing the parameter changes the output
    tm.scale = M.Parameter(_t([1.0, 1.0]))
    want = net.fc(x).numpy() + np.array([0.5, 0.25], "float32")
    np.testing.assert_allclose(tm(x).numpy(), want, rtol=1e-6, atol=1e-6)


# ------------------------------------------------------- tensors made inside
class Creates(M.Module):
    def forward(self, x):
        z = F.zeros((x.shape[0], 3)) + F.arange(3)
        ones = F.ones_like(x)
        return z, ones, x + F.full((1, 3), 2.0)


def test_creation_functions_are_recorded_and_fresh_every_run():
    net = Creates()
    tm = mt.trace_module(net, _rand(2, 3))
    fns = [e.func for e in _exprs(tm.graph) if e.kind == "call_function"]
    assert fns == [F.zeros, F.arange, F.ones_like, F.full]
    assert not any(e.kind == "constant" for e in _exprs(tm.graph))
    x = _rand(4, 3, seed=1)
    z, ones, _ = tm(x)
    assert z.shape == (4, 3)
    np.testing.assert_array_equal(z.numpy(), np.tile(np.arange(3, dtype="float32"), (4, 1)))
    z[:] = 99.0                         # mutate this run's results...
    ones[:] = -1.0
    z2, ones2, s = tm(x)                # ...the next run makes fresh ones
    np.testing.assert_array_equal(z2.numpy(), np.tile(np.arange(3, dtype="float32"), (4, 1)))
    np.testing.assert_array_equal(ones2.numpy(), np.ones((4, 3), "float32"))
    np.testing.assert_allclose(s.numpy(), x.numpy() + 2.0)


_OUTSIDE = mt.tensor(np.array([1.0, 2.0, 3.0], "float32"))


class CapturesOutside(M.Module):
    def forward(self, x):
        return x + _OUTSIDE


def test_tensor_made_outside_forward_is_a_constant_with_a_warning():
    net = CapturesOutside()
    with pytest.warns(TraceWarning, match="kept as a constant") as rec:
        tm = mt.trace_module(net, _rand(2, 3))
    assert rec[0].filename == __file__                   # points at the user's code
    consts = [e for e in _exprs(tm.graph) if e.kind == "constant"]
    assert len(consts) == 1
    np.testing.assert_array_equal(consts[0].value.numpy(), [1.0, 2.0, 3.0])
    x = _rand(5, 3, seed=2)
    np.testing.assert_allclose(tm(x).numpy(), x.numpy() + [1.0, 2.0, 3.0], rtol=1e-6)


class RawOps(M.Module):
    def forward(self, x):
        s = apply(OpDef("sin"), x)                       # no method form: Apply
        a = apply(OpDef("add"), s, x)                    # has one: x.__add__
        return a


def test_raw_core_ops_are_apply_or_call_method():
    net = RawOps()
    tm = mt.trace_module(net, _rand(2, 2))
    es = _exprs(tm.graph)
    assert [e.kind for e in es] == ["apply", "call_method"]
    assert es[0].op == "sin" and es[1].method == "__add__"
    x = _rand(3, 2, seed=4)
    np.testing.assert_allclose(tm(x).numpy(), np.sin(x.numpy()) + x.numpy(), rtol=1e-6, atol=1e-6)


# ---------------------------------------------------------------- hierarchy
class Block(M.Module):
    def __init__(self, n):
        super().__init__()
        self.fc = M.Linear(n, n)

    def forward(self, x):
        return F.relu(self.fc(x)) + x


class Scale(M.Module):
    """A user module made a leaf with register_as_builtin."""

    def __init__(self, k=3.0):
        super().__init__()
        self.k = k

    def forward(self, x):
        return x * self.k


M.register_as_builtin(Scale, name="tests.traced_module.Scale")


class Tower(M.Module):
    def __init__(self):
        super().__init__()
        self.body = M.Sequential(Block(4), M.ReLU(), Block(4))
        self.scale = Scale(2.5)

    def forward(self, x):
        return self.scale(self.body(x))


def test_submodules_nest_sequential_is_traced_builtin_is_a_leaf():
    net, x = Tower(), _rand(2, 4)
    tm = mt.trace_module(net, x)
    assert isinstance(tm.body, TracedModule) and isinstance(tm.body[0], TracedModule)
    assert tm.body[1] is net.body[1] and tm.scale is net.scale
    assert not isinstance(tm.scale, TracedModule)
    assert [e.kind for e in _exprs(tm.graph)] == ["getattr", "call_method", "getattr",
                                                   "call_method"]
    # Sequential's own graph calls its three children
    assert [e.method for e in _exprs(tm.body.graph) if e.kind == "call_method"] == ["__call__"] * 3
    # Block's graph holds the linear call, relu and add
    kinds = [(e.kind, getattr(e, "method", getattr(e, "func", None)))
             for e in _exprs(tm.body[0].graph)]
    assert kinds == [("getattr", None), ("call_method", "__call__"), ("call_function", F.relu),
                     ("call_method", "__add__")]
    # the leaf's body (x * k) is nowhere in the graphs
    assert not any(getattr(e, "method", "") == "__mul__" for e in tm.graph.exprs(recursive=True))
    x2 = _rand(6, 4, seed=3)
    np.testing.assert_array_equal(tm(x2).numpy(), net(x2).numpy())
    assert tm.body[0].graph.qualname == "Tower.body.0"


def test_trace_module_rejects_builtins_and_non_modules():
    with pytest.raises(TypeError, match="builtin module"):
        mt.trace_module(M.Linear(2, 2), _rand(1, 2))
    with pytest.raises(TypeError, match="takes an mgtrace.module.Module"):
        mt.trace_module(lambda x: x, _rand(1, 2))


def test_trace_keeps_the_mode_the_model_is_in():
    net = M.Sequential(M.Linear(3, 3), M.Dropout(0.9))
    x = _rand(50, 3)
    tm = mt.trace_module(net.eval(), x)
    assert not net.training and not tm.training
    np.testing.assert_array_equal(tm(x).numpy(), net[0](x).numpy())   # dropout is off
    tm = mt.trace_module(net.train(), x)
    assert net.training and tm.training and tm[1].training
    dropped = tm(x).numpy() == 0
    assert 0.7 < dropped.mean() < 1.0                                  # dropout is on
