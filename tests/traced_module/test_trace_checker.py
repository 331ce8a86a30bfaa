"""The end-of-trace check (issue 13, point 2): trace_module runs the new
TracedModule on the trace inputs and compares its outputs with eager
(MegEngine's default checker); enable_expr_checker() compares every node."""
import warnings

import numpy as np
import pytest

import mgtrace as mt
import mgtrace.functional as F
import mgtrace.module as M
import mgtrace.traced_module as tmod
from mgtrace.traced_module import TraceCheckError, TraceError, TraceWarning


def _x(*shape, seed=0):
    return mt.tensor(np.random.default_rng(seed).standard_normal(shape).astype("float32"))


@pytest.fixture
def expr_checker():
    was = tmod.enable_expr_checker()
    yield
    tmod.enable_expr_checker(was)


@pytest.fixture
def no_default_checker():
    was = tmod.disable_default_checker()
    yield
    tmod.disable_default_checker(was)


_OUTSIDE = mt.tensor([1.0, 1.0, 1.0])


class ChangesAGlobal(M.Module):
    """Writes a tensor made outside forward: the graph cannot repeat eager."""

    def forward(self, x):
        y = x * 2
        g = _OUTSIDE.reshape(1, 3)
        g += 1
        return {"a": y, "b": [y, x + g]}


def _trace_quiet(net, *args):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TraceWarning)
        return mt.trace_module(net, *args)


def test_default_checker_names_the_first_differing_output():
    _OUTSIDE[...] = 1.0
    with pytest.raises(TraceCheckError, match=r"output out\['b'\]\[1\] differs: 6 of 6 "
                                              r"elements differ.*disable_default_checker") as e:
        _trace_quiet(ChangesAGlobal(), _x(2, 3))
    assert isinstance(e.value, TraceError)                   # catchable as a trace error


def test_disabling_the_default_checker(no_default_checker):
    _OUTSIDE[...] = 1.0
    tm = _trace_quiet(ChangesAGlobal(), _x(2, 3))
    assert set(tm(_x(2, 3))) == {"a", "b"}


def test_expr_checker_names_the_expr_and_keeps_values(expr_checker):
    _OUTSIDE[...] = 1.0
    with pytest.raises(TraceCheckError, match=r"expr %\d+:const = Constant.* in ChangesAGlobal, "
                                              r"traced at .*test_trace_checker.py:\d+ does not "
                                              r"reproduce its traced value"):
        _trace_quiet(ChangesAGlobal(), _x(2, 3))

    class Fine(M.Module):
        def forward(self, x):
            return F.relu(x) * 2
    x = _x(2, 3)
    tm = mt.trace_module(Fine(), x)
    relu = tm.graph.get_function_by_type(F.relu).as_unique().outputs[0]
    np.testing.assert_array_equal(relu.value.numpy(), np.maximum(x.numpy(), 0))
    assert tm.graph.inputs[1].value.tolist() == x.tolist()


def test_values_are_not_kept_without_the_expr_checker():
    tm = mt.trace_module(M.Sequential(M.ReLU()), _x(2, 3))
    assert all(n.value is None for n in tm.graph.nodes() if isinstance(n, tmod.TensorNode))


def test_check_passes_for_random_ops_in_training_mode():
    """The check run replays the random stream the trace used (dropout in
    training mode draws the same mask), and the stream then continues."""
    net = M.Sequential(M.Linear(4, 4), M.Dropout(0.5)).train()
    x = _x(8, 4)
    mt.random.seed(3)
    tm = mt.trace_module(net, x)
    after = mt.random.uniform(size=(3,)).tolist()
    mt.random.seed(3)
    net(x)
    assert mt.random.uniform(size=(3,)).tolist() == after    # as if only eager had run
    assert tm.training


def test_the_check_runs_on_copies_of_inputs_a_forward_writes():
    class WritesInput(M.Module):
        def forward(self, x):
            x += 1
            return x * 2
    x = _x(2, 3)
    before = x.numpy().copy()
    tm = mt.trace_module(WritesInput(), x)
    np.testing.assert_array_equal(x.numpy(), before + 1)         # as an eager call does
    np.testing.assert_allclose(tm(mt.tensor(before)).numpy(), (before + 1) * 2, rtol=1e-6)
