"""Tracing belongs to the thread that started it. While thread A traces, an
eager op run by thread B (a data-loader thread, a server's other request)
used to be recorded into A's graph, or B's tensors were handed to A's tracer:
the hook and the core's tracing switch were the process's. Now B's ops,
functions and module calls run eagerly, untouched, unrecorded. Two threads
tracing at once take turns (the second waits for the first, then traces on
its own: tests/plan/test_plan_threads_record.py).

The overlap is made by events, not timing: A's forward stops inside the
trace until B has run all its ops. References: NumPy for B's results, the
eager module for A's graph."""
import threading

import numpy as np

import mgtrace as mt
import mgtrace.functional as F
import mgtrace.module as M
from mgtrace._core import trace_hooks


class Waits(M.Module):
    """relu(fc(x)) * 2 + 1; the traced run stops until ``resume`` is set."""

    def __init__(self, inside, resume):
        super().__init__()
        self.fc = M.Linear(4, 3)
        self.inside, self.resume = inside, resume

    def forward(self, x):
        y = F.relu(self.fc(x))
        if trace_hooks.active is not None and not self.inside.is_set():
            self.inside.set()                   # A is tracing: let B run now
            assert self.resume.wait(20), "thread B never finished"
        return y * 2.0 + 1.0


def _exprs(graph):
    return [(e.kind, getattr(e, "method", None) or getattr(getattr(e, "func", None), "__name__", None))
            for e in graph.exprs(recursive=False) if e.kind != "input"]


def test_another_threads_eager_ops_stay_out_of_a_trace():
    inside, resume = threading.Event(), threading.Event()
    mt.random.seed(0)
    net = Waits(inside, resume).eval()
    x = mt.tensor(np.random.default_rng(0).standard_normal((2, 4)).astype(np.float32))
    want_a = net(x).numpy()                    # eager: not tracing, no wait

    rng = np.random.default_rng(1)
    arrs = [rng.standard_normal(12).astype(np.float32) for _ in range(20)]
    bias = rng.standard_normal(12).astype(np.float32)
    lin = M.Linear(12, 5)
    w, bw = lin.weight.numpy(), lin.bias.numpy()
    got_b, errors = [], []

    def eager():
        try:
            assert inside.wait(20), "thread A never started tracing"
            b = mt.tensor(bias)
            for arr in arrs:                   # every kind of event the tracer hooks
                a = mt.tensor(arr)             # creation
                s = a + b                      # elementwise core op
                r = F.relu(s)                  # a public functional function
                m = a.reshape(3, 4).sum(axis=1)    # tensor methods
                o = lin(a.reshape(1, 12))      # a module call
                got_b.append((s, r, m, o, a.shape, float(m[0]), bool(s[0] > 0)))
        except BaseException as e:             # noqa: BLE001 (reported below)
            errors.append(e)
        finally:
            resume.set()

    tb = threading.Thread(target=eager)
    tb.start()
    tm = mt.trace_module(net, x)               # thread A
    tb.join()

    assert errors == []
    assert inside.is_set() and len(got_b) == len(arrs)
    for arr, (s, r, m, o, shape, m0, pos) in zip(arrs, got_b):
        assert all(type(t) is mt.Tensor for t in (s, r, m, o))     # plain tensors, not wrapped
        np.testing.assert_array_equal(s.numpy(), arr + bias)
        np.testing.assert_array_equal(r.numpy(), np.maximum(arr + bias, 0))
        np.testing.assert_allclose(m.numpy(), arr.reshape(3, 4).sum(axis=1), rtol=1e-6)
        np.testing.assert_allclose(o.numpy(), arr.reshape(1, 12) @ w.T + bw, rtol=1e-5, atol=1e-6)
        assert shape == (12,) and m0 == np.float32(m.numpy()[0]) and pos == (arr[0] + bias[0] > 0)

    # A's graph holds its own forward and nothing of B's
    assert _exprs(tm.graph) == [("getattr", None), ("call_method", "__call__"),
                                ("call_function", "relu"), ("call_method", "__mul__"),
                                ("call_method", "__add__")]
    x2 = mt.tensor(np.random.default_rng(2).standard_normal((5, 4)).astype(np.float32))
    np.testing.assert_array_equal(tm(x).numpy(), want_a)
    np.testing.assert_array_equal(tm(x2).numpy(), net(x2).numpy())
    tm.graph.lint()


def test_hooks_are_the_installing_threads():
    """installed() in one thread: the hook is current there and None in
    another; installed(None) in a thread with no hook takes no lock (it
    runs while the first thread still holds its hook)."""
    hook = trace_hooks.TraceHook()
    seen = {}
    with trace_hooks.installed(hook):
        def other():
            seen["current"] = trace_hooks.current()
            seen["tracing"] = mt._core.dispatch.is_tracing_module()
            with trace_hooks.installed(None):           # would block on the lock before
                seen["inner"] = (mt.tensor(np.arange(3, dtype=np.float32)) * 2).numpy()
        t = threading.Thread(target=other)
        t.start()
        t.join(20)
        assert not t.is_alive()
        assert trace_hooks.current() is hook and mt._core.dispatch.is_tracing_module()
    assert seen["current"] is None and seen["tracing"] is False
    np.testing.assert_array_equal(seen["inner"], [0.0, 2.0, 4.0])
    assert trace_hooks.current() is None and trace_hooks.owner == 0
