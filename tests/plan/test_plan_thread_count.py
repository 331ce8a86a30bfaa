"""A plan follows the thread count of the moment, as the module does. It
used to replay every kernel step with the count recorded at compile time:
a server that compiled and then called set_num_threads(1) still ran teams
of the old count. Now each program is recorded at one count and replayed at
that count only; a call at another count runs (or first records) the
program for that count, from the same bounded cache. Observed through
plan.step_threads (the counts in the executor's steps) and the outputs,
which are the module's bitwise at the same count."""
import threading

import numpy as np
import pytest

import mgtrace as mt
import mgtrace.functional as F
import mgtrace.module as M
from mgtrace._core import dispatch
from tests.plan._bits import same_bits


class Net(M.Module):
    """A conv (nn step), pooling, layer norm, a reduction and a GEMM."""

    def __init__(self):
        super().__init__()
        self.conv = M.Conv2d(3, 8, 3, padding=1)
        self.ln = M.LayerNorm(8)
        self.fc = M.Linear(8, 5)

    def forward(self, x):
        y = F.relu(self.conv(x)).mean(axis=(2, 3))
        return self.fc(self.ln(y)), y.sum(axis=1)


@pytest.fixture
def threads():
    """Sets the count for the test (adaptive threads off: the count is the
    setting), puts the process's setting back after."""
    old, adaptive = mt.get_num_threads(), dispatch.set_adaptive_threads(False)
    yield mt.set_num_threads
    mt.set_num_threads(old)
    dispatch.set_adaptive_threads(adaptive)


def _setup():
    mt.random.seed(0)
    net = Net().eval()
    x = mt.tensor(np.random.default_rng(0).standard_normal((2, 3, 12, 12)).astype(np.float32))
    return mt.trace_module(net, x), x


def _counts(plan, x):
    return {n for n in plan.step_threads(x) if n is not None}


def _check(plan, tm, x):
    got, want = plan(x), tm(x)
    for g, w in zip(got, want):
        assert same_bits(g.numpy(), w.numpy())


def test_set_num_threads_after_compile_reaches_the_plans_kernels(threads):
    tm, x = _setup()
    threads(2)
    plan = mt.compile(tm, x)
    assert _counts(plan, x) == {2}
    assert sum(n is not None for n in plan.step_threads(x)) >= 3     # conv, layer norm, GEMM, ...
    threads(1)                      # a server with one thread per worker process
    _check(plan, tm, x)
    assert _counts(plan, x) == {1}  # was {2}: the compile-time teams
    assert plan.misses == 0 and len(plan.signatures) == 1
    threads(2)                      # back: the program recorded at 2 again, no new recording
    _check(plan, tm, x)
    assert _counts(plan, x) == {2} and len(plan._programs) == 2


def test_a_count_above_the_compile_time_one_records_a_program_at_it(threads):
    tm, x = _setup()
    threads(1)
    plan = mt.compile(tm, x)
    assert _counts(plan, x) == {1}
    threads(2)
    _check(plan, tm, x)
    assert _counts(plan, x) == {2} and plan.misses == 0


def test_a_full_cache_gives_a_stale_counts_program_up_for_the_new_count(threads):
    """A full cache used to turn every call at the new count away (the
    module ran, eagerly, for good); the program of a count no longer set
    now makes room."""
    tm, x = _setup()
    threads(2)
    plan = mt.compile(tm, x, cache_size=1)
    threads(1)
    _check(plan, tm, x)
    assert plan.misses == 0 and [k[1] for k in plan._programs] == [1]
    assert _counts(plan, x) == {1}
    threads(2)                      # and back: the count-1 program is the stale one now
    _check(plan, tm, x)
    assert plan.misses == 0 and [k[1] for k in plan._programs] == [2]


def test_a_pinned_count_is_the_calling_threads_only(threads):
    threads(2)
    seen = []
    old = dispatch._pin_run_threads(1)
    try:
        assert dispatch.run_threads() == 1
        t = threading.Thread(target=lambda: seen.append(dispatch.run_threads()))
        t.start()
        t.join()
    finally:
        dispatch._pin_run_threads(old)
    assert seen == [2] and dispatch.run_threads() == 2
    with pytest.raises(ValueError, match=">= 0"):
        dispatch._pin_run_threads(-1)


def test_stats_at_a_count_with_no_program_names_the_count(threads):
    """stats(x) at a count with no program raised a bare KeyError of the
    cache's internal key ((signature...), 1); it now says what profile and
    step_threads say. Without inputs it still gives the first program's."""
    tm, x = _setup()
    threads(2)
    plan = mt.compile(tm, x)
    first = plan.stats()
    threads(1)
    for method in (plan.stats, plan.step_threads, plan.profile):
        with pytest.raises(KeyError, match="no program for these inputs at 1 thread|at this thread count"):
            method(x)
    assert plan.stats() == first
    _check(plan, tm, x)             # records the program at 1
    assert plan.stats(x)["kernel_steps"] == first["kernel_steps"]


class _Load:
    """Stands in for adaptive threads' count (mgtrace.plan reads it through
    _run_threads): each call of the plan sees the next count of ``counts``,
    as a load moving between them would give."""

    def __init__(self, counts):
        self.counts, self.now = list(counts), None

    def __call__(self):
        return self.now


def test_adaptive_counts_keep_one_lowered_program_and_never_fill_the_cache(threads, monkeypatch):
    """Configured 4 threads, the load moving the count between 1 and 4.
    Every count used to record a program of its own: four counts filled
    cache_size=4, and from then on a call at a fifth count, or with a new
    input shape, ran the module eagerly (misses 3 of these 12 calls). Now a
    signature keeps the configured count's program and one lowered one,
    recorded at the lowest count seen so far: 3 recordings, no miss, and
    each output is the module's at the count its program ran with."""
    import mgtrace.plan as P
    tm, x = _setup()
    threads(4)
    load = _Load([])
    monkeypatch.setattr(P, "_run_threads", load)
    load.now = 4
    plan = mt.compile(tm, x, cache_size=4)
    made = []
    real = P._Program

    def counting(module, inputs, n):
        made.append(n)
        return real(module, inputs, n)
    monkeypatch.setattr(P, "_Program", counting)
    x2 = mt.tensor(np.random.default_rng(1).standard_normal((1, 3, 12, 12)).astype(np.float32))
    ran = []
    for now, inp in [(3, x), (4, x), (2, x), (3, x), (1, x), (2, x), (3, x), (4, x),
                     (3, x2), (4, x2), (2, x2), (3, x)]:
        load.now = now
        got = plan(inp)
        n = _counts(plan, inp)
        assert len(n) == 1
        n = n.pop()
        assert n <= now and (n == now or now < 4)
        pinned = dispatch._pin_run_threads(n)      # the module at the program's count
        try:
            want = tm(inp)
        finally:
            dispatch._pin_run_threads(pinned)
        for g, w in zip(got, want):
            assert same_bits(g.numpy(), w.numpy())
        ran.append(n)
    assert plan.misses == 0
    assert made == [3, 2, 1, 3, 4, 2]      # x: lowered 3 -> 2 -> 1; x2: 3, 4, then 2 in 3's place
    assert ran == [3, 4, 2, 2, 1, 1, 1, 4, 3, 4, 2, 1]
    assert sorted(k[1] for k in plan._programs) == [1, 2, 4, 4]
