"""Two threads calling plans with input shapes they have no program for
yet: each call records the module once, and a recording installs the trace
hook for the whole process, so two at once saw each other's ops and failed
("'NoneType' object has no attribute 'buf'") on most calls. Recordings now
run one at a time (trace_hooks.one_trace); replays still run at once.
Reference: the module itself, outside the threads. Two threads tracing
modules at once failed the same way ("trace_module is already running
(nested traces are not supported)"): a trace in another thread is waited
for."""
import threading
import warnings

import numpy as np
import pytest

import mgtrace as mt
import mgtrace.functional as F
import mgtrace.module as M
from mgtrace.traced_module.errors import TraceError


class Net(M.Module):
    def __init__(self):
        super().__init__()
        self.conv = M.Conv2d(3, 8, 3, padding=1)
        self.fc = M.Linear(8, 5)

    def forward(self, x):
        y = F.relu(self.conv(F.pad(x, ((0, 0), (0, 0), (1, 2), (2, 1)), mode="reflect")))
        return self.fc(y.mean(axis=(2, 3)))


def _in_threads(n, worker):
    start, errors = threading.Barrier(n), []

    def run(k):
        try:
            start.wait()
            worker(k)
        except Exception as e:          # noqa: BLE001
            errors.append(e)
    threads = [threading.Thread(target=run, args=(k,)) for k in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors


def test_threads_recording_new_shapes_get_the_modules_outputs():
    mt.random.seed(0)
    net = Net().eval()
    x = mt.tensor(np.ones((2, 3, 8, 8), np.float32))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plan = mt.compile(mt.trace_module(net, x), x, cache_size=100)
    rng = np.random.default_rng(0)
    work = [[rng.standard_normal((1 + i % 2, 3, 4 + (i * 7 + k) % 9, 4 + k)).astype(np.float32)
             for i in range(8)] for k in range(4)]        # distinct shapes per thread
    want = [[net(mt.tensor(a)).numpy() for a in w] for w in work]
    got = [[None] * 8 for _ in range(4)]

    def worker(k):
        for i, a in enumerate(work[k]):
            got[k][i] = plan(mt.tensor(a)).numpy()
    assert _in_threads(4, worker) == []
    for k in range(4):
        for g, w in zip(got[k], want[k]):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
    assert plan.misses == 0


def test_threads_tracing_at_once_each_get_their_graph():
    class Steps(M.Module):
        def __init__(self, k):
            super().__init__()
            self.fc, self.k = M.Linear(6, 4), k

        def forward(self, x):
            y = F.relu(self.fc(x))
            for _ in range(self.k):
                y = y + F.sin(y)
            return y
    mt.random.seed(1)
    nets = [Steps(k + 1).eval() for k in range(4)]
    x = mt.tensor(np.random.default_rng(1).standard_normal((3, 6)).astype(np.float32))
    traced = [[None] * 6 for _ in range(4)]

    def worker(k):
        for i in range(6):
            traced[k][i] = mt.trace_module(nets[k], x)
    assert _in_threads(4, worker) == []
    for k in range(4):
        want = nets[k](x).numpy()
        for tm in traced[k]:
            # relu(linear) then k rounds of y + sin(y): 2 + 2k calls
            assert sum(1 for e in tm.graph._exprs if getattr(e, "func", None) is F.sin) == k + 1
            np.testing.assert_array_equal(tm(x).numpy(), want)


def test_a_nested_trace_in_one_thread_is_still_refused():
    class Inner(M.Module):
        def forward(self, x):
            mt.trace_module(M.Sequential(M.ReLU()), x)
            return x
    with pytest.raises(TraceError, match="already running"):
        mt.trace_module(Inner(), mt.tensor(np.ones(2, np.float32)))
