"""Calling a TracedModule with arguments unlike the traced ones: a keyword
no parameter takes is named, NumPy arrays are taken where the eager module
takes them, and other non-tensors are refused with the fix."""
import numpy as np
import pytest

import mgtrace as mt
import mgtrace.functional as F
import mgtrace.module as M


class Scale(M.Module):
    def __init__(self):
        super().__init__()
        self.fc = M.Linear(3, 2)

    def forward(self, x, k=None):
        return F.relu(self.fc(x)) * 2


def _x(seed, dtype=np.float32):
    return np.random.default_rng(seed).normal(size=(4, 3)).astype(dtype)


def _ref(net, x):
    """NumPy: relu(x @ W.T + b) * 2."""
    w, b = net.fc.weight.numpy(), net.fc.bias.numpy()
    return np.maximum(x @ w.T + b, 0) * 2


@pytest.fixture
def traced():
    net = Scale()
    return net, mt.trace_module(net, mt.tensor(_x(0)))


def test_an_unknown_keyword_is_named(traced):
    _, tm = traced
    x = mt.tensor(_x(1))
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'y'; forward's parameters "
                                        r"are x, k"):
        tm(y=x)
    with pytest.raises(TypeError, match=r"unexpected keyword arguments 'y', 'z'"):
        tm(x, y=x, z=1)
    with pytest.raises(TypeError, match="missing a required argument: 'x'"):
        tm(k=None)                  # a known keyword: the missing one is still named


def test_an_unknown_keyword_is_named_at_trace_time():
    with pytest.raises(TypeError, match=r"Scale.forward\(x, k=None\): unexpected keyword "
                                        r"argument 'y'"):
        mt.trace_module(Scale(), y=mt.tensor(_x(0)))


def test_a_numpy_array_is_taken_where_the_eager_module_takes_one(traced):
    net, tm = traced
    x = _x(2)
    eager = net(x)                  # the eager module takes an array
    got = tm(x)
    np.testing.assert_allclose(got.numpy(), _ref(net, x), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got.numpy(), eager.numpy(), rtol=1e-6)
    np.testing.assert_allclose(tm(x=x).numpy(), _ref(net, x), rtol=1e-5, atol=1e-6)


def test_a_numpy_array_in_a_container_is_taken():
    class Pair(M.Module):
        def forward(self, pair):
            return pair[0] - pair[1]

    a, b = _x(3), _x(4)
    tm = mt.trace_module(Pair(), (mt.tensor(a), mt.tensor(b)))
    np.testing.assert_array_equal(tm((a, mt.tensor(b))).numpy(), a - b)


def test_a_list_where_a_tensor_was_traced_is_refused_with_the_fix(traced):
    _, tm = traced
    with pytest.raises(TypeError, match=r"x: expected a tensor, got \[1.0, 2.0, 3.0\]; "
                                        r"pass mgtrace.tensor\(value\)"):
        tm([1.0, 2.0, 3.0])
