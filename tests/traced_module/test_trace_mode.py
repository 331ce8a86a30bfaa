"""The mode a module is traced in (issue 13, point 3): trace_module keeps it,
leaves the caller's module exactly as it was, a training-mode BatchNorm
keeps updating its statistics in the TracedModule, and graph.compile()
never drops a call whose effect is on its arguments or buffers (declared
once, in mgtrace.functional._trace)."""
import copy
import warnings

import numpy as np
import pytest

import mgtrace as mt
import mgtrace.functional as F
import mgtrace.module as M
from mgtrace.functional._trace import mutated_arguments


def _x(*shape, seed=0):
    return mt.tensor(np.random.default_rng(seed).standard_normal(shape).astype("float32"))


class ConvBN(M.Module):
    def __init__(self):
        super().__init__()
        self.conv = M.Conv2d(3, 4, 3, padding=1)
        self.bn = M.BatchNorm2d(4)
        self.register_buffer("calls", mt.tensor(0, dtype="int64"))

    def forward(self, x):
        self.calls += 1                          # a buffer written in place by forward
        return F.relu(self.bn(self.conv(x)))


def _state(m):
    return {k: v.numpy().copy() for k, v in m.state_dict().items()}


def test_trace_leaves_the_module_exactly_as_it_was():
    net = ConvBN().train()
    before = _state(net)
    attrs = dict(net.__dict__)
    tm = mt.trace_module(net, _x(2, 3, 5, 5))
    assert net.training and net.bn.training and tm.training and tm.bn.training
    after = _state(net)
    assert list(after) == list(before)
    for k in before:
        np.testing.assert_array_equal(after[k], before[k], err_msg=k)
    assert net.__dict__.keys() == attrs.keys()
    assert net.bn.num_batches_tracked.item() == 0 and net.calls.item() == 0
    # eval mode is kept too, and the caller's choice is not changed
    net.eval()
    tm = mt.trace_module(net, _x(2, 3, 5, 5))
    assert not net.training and not tm.training and not tm.bn.training


def test_training_batch_norm_updates_its_statistics_on_every_call():
    net = ConvBN().train()
    ref = copy.deepcopy(net)                     # eager twin
    tm = mt.trace_module(net, _x(2, 3, 5, 5))
    for i in range(3):
        x = _x(2, 3, 5, 5, seed=10 + i)
        np.testing.assert_allclose(tm(x).numpy(), ref(x).numpy(), rtol=1e-5, atol=1e-6)
        for k in ("running_mean", "running_var", "num_batches_tracked"):
            np.testing.assert_allclose(getattr(tm.bn, k).numpy(), getattr(ref.bn, k).numpy(),
                                       rtol=1e-6, atol=1e-7)
    assert tm.bn.num_batches_tracked.item() == 3
    # a hand check of the first statistic against NumPy (PyTorch's momentum 0.1)
    net2 = ConvBN().train()
    tm2 = mt.trace_module(net2, _x(2, 3, 5, 5))
    x = _x(2, 3, 5, 5, seed=99)
    y = net2.conv(x).numpy()
    tm2(x)
    mean = y.mean(axis=(0, 2, 3))
    var = y.var(axis=(0, 2, 3), ddof=1)
    np.testing.assert_allclose(tm2.bn.running_mean.numpy(), 0.1 * mean, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(tm2.bn.running_var.numpy(), 0.9 + 0.1 * var, rtol=1e-5)


class FunctionalBN(M.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("rm", mt.tensor(np.zeros(3, np.float32)))
        self.register_buffer("rv", mt.tensor(np.ones(3, np.float32)))

    def forward(self, x):
        F.batch_norm(x, self.rm, self.rv, training=True, momentum=0.5)     # result unused
        return x * 2


def test_compile_keeps_calls_that_write_their_arguments():
    net = FunctionalBN()
    tm = mt.trace_module(net, _x(4, 3))
    g = tm.graph
    n = len(g._exprs)
    g.compile()
    g.lint()
    assert len(g._exprs) == n
    assert g.get_function_by_type(F.batch_norm).as_count() == 1
    x = _x(4, 3, seed=1)
    tm(x)
    np.testing.assert_allclose(tm.rm.numpy(), 0.5 * x.numpy().mean(axis=0), rtol=1e-5)
    assert mutated_arguments(F.batch_norm, (x, tm.rm, tm.rv), {"training": True}) == \
        ("running_mean", "running_var")
    assert mutated_arguments(F.batch_norm, (x, tm.rm, tm.rv), {}) == ()        # inference
    assert mutated_arguments(F.relu, (x,), {}) == ()


def test_compile_keeps_a_training_batch_norm_call_whose_result_is_unused():
    class Probe(M.Module):
        def __init__(self):
            super().__init__()
            self.bn = M.BatchNorm1d(3)

        def forward(self, x):
            self.bn(x)                           # only its statistics matter
            return x + 1
    net = Probe().train()
    tm = mt.trace_module(net, _x(4, 3))
    tm.graph.compile()
    assert tm.graph.get_module_by_type(M.BatchNorm1d).as_count() == 1
    tm(_x(4, 3))
    assert tm.bn.num_batches_tracked.item() == 1
    # in eval mode the call has no effect and compile drops it
    tm.eval()
    tm.graph.compile()
    assert tm.graph.get_module_by_type(M.BatchNorm1d).as_count() == 0
    np.testing.assert_allclose(tm(_x(4, 3)).numpy(), _x(4, 3).numpy() + 1, rtol=1e-6)


def test_a_failing_trace_also_restores_the_module():
    class Fails(M.Module):
        def __init__(self):
            super().__init__()
            self.bn = M.BatchNorm1d(3)

        def forward(self, x):
            y = self.bn(x)
            raise RuntimeError("boom")
    net = Fails().train()
    with pytest.raises(Exception, match="boom"):
        mt.trace_module(net, _x(4, 3))
    assert net.bn.num_batches_tracked.item() == 0
    assert float(np.abs(net.bn.running_mean.numpy()).max()) == 0.0


class _WritesParameters(M.Module):
    def __init__(self):
        super().__init__()
        self.g = M.Parameter(F.ones((3,)))
        self.w = M.Parameter(F.ones((3,)))

    def forward(self, x):
        self.g *= 0.5                   # an in-place operator on a parameter
        self.w[0] = x.sum()             # and an indexed write
        return x * self.g + self.w


def test_a_forward_that_writes_parameters_traces_and_leaves_them_as_they_were():
    net = _WritesParameters()
    x = mt.tensor(np.arange(3, dtype=np.float32))
    tm = mt.trace_module(net, x)        # the default checker re-runs from the state before
    np.testing.assert_array_equal(net.g.numpy(), np.ones(3))
    np.testing.assert_array_equal(net.w.numpy(), np.ones(3))
    g, w, xs = np.ones(3), np.ones(3), np.arange(3.0)
    for _ in range(3):                  # NumPy's run of the same forward, three calls
        g = g * 0.5
        w[0] = xs.sum()
        np.testing.assert_allclose(tm(x).numpy(), xs * g + w, rtol=1e-6)


class _WritesThroughAView(M.Module):
    def __init__(self):
        super().__init__()
        self.w = M.Parameter(np.zeros(2, np.float32))

    def forward(self, x):
        self.w.view(-1)[0] += 1.0       # the write goes to a view, not to the parameter
        return x + self.w


def test_a_write_through_a_view_of_a_parameter_is_put_back_too():
    net = _WritesThroughAView()
    x = mt.tensor(np.ones(2, np.float32))
    tm = mt.trace_module(net, x)
    np.testing.assert_array_equal(net.w.numpy(), [0.0, 0.0])
    for k in range(1, 4):               # eager: w[0] grows by one a call
        np.testing.assert_array_equal(tm(x).numpy(), [1.0 + k, 1.0])


class _Reader(M.Module):
    def __init__(self):
        super().__init__()
        self.buf = mt.tensor(np.ones(2, np.float32))

    def forward(self, x):
        return x * self.buf


class _Writer(M.Module):
    def __init__(self, v):
        super().__init__()
        self.v = v                      # the reader's buffer, held here too

    def forward(self, x):
        self.v += 1.0
        return x


class _SharedBuffer(M.Module):
    def __init__(self):
        super().__init__()
        self.b = _Reader()
        self.a = _Writer(self.b.buf)

    def forward(self, x):
        y = self.b(x)
        self.a(x)
        return y


def test_a_tensor_two_submodules_hold_is_one_tensor_in_both_graphs():
    x = mt.tensor(np.ones(2, np.float32))
    with warnings.catch_warnings():
        warnings.simplefilter("error", mt.TraceWarning)     # no "kept as a constant"
        tm = mt.trace_module(_SharedBuffer(), x)
    for k in range(3):                  # eager: the buffer grows by one after each call
        np.testing.assert_array_equal(tm(x).numpy(), [1.0 + k] * 2)
    np.testing.assert_array_equal(tm.b.buf.numpy(), [4.0, 4.0])
    assert tm.a.v is tm.b.buf
