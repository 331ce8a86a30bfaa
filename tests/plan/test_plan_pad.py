"""F.pad in a plan: kernel steps (reflect and replicate one pad_index call,
constant a fill and a copy; circular's edge copies on three axes are more
calls than a capture holds, so that one stays a Python step), the values
of the module bit for bit on each call's new inputs, and NumPy's np.pad."""
import numpy as np
import pytest

import mgtrace as mt
import mgtrace.functional as F
import mgtrace.module as M

WIDTHS = ((0, 0), (1, 0), (1, 2), (2, 1))
NP_MODES = {"constant": "constant", "reflect": "reflect", "replicate": "edge", "circular": "wrap"}


class Pads(M.Module):
    def forward(self, x, i):
        xt = F.transpose(x, (0, 1, 3, 2))              # a strided view: pad copies it first
        outs = [F.pad(xt, WIDTHS, mode=m) for m in NP_MODES]
        return outs + [F.pad(i, ((1, 1), (0, 2)), mode="reflect")]


def _inputs(seed):
    rng = np.random.default_rng(seed)
    return (mt.tensor(rng.standard_normal((2, 3, 5, 6)).astype(np.float32)),
            mt.tensor(rng.integers(-50, 50, (4, 3)).astype(np.int32)))


def test_pads_are_kernel_steps_with_the_modules_bits():
    net = Pads()
    tm = mt.trace_module(net, *_inputs(0))
    plan = mt.compile(tm, *_inputs(0))
    steps = plan.profile(*_inputs(0), repeats=1)
    assert [k for k, w, _ in steps if w.endswith("pad: pad")] == ["kernel"] * 3   # reflect, replicate, int
    assert [w for k, w, _ in steps if k == "python"] == ["<top>: pad"]             # circular
    assert plan.stats()["python_steps"] == 1
    for seed in (1, 2):
        x, i = _inputs(seed)
        got, want = plan(x, i), net(x, i)
        for g, w in zip(got, want):
            assert g.dtype == w.dtype and g.numpy().tobytes() == w.numpy().tobytes()
        xt = x.numpy().transpose(0, 1, 3, 2)
        for g, m in zip(got, NP_MODES.values()):
            np.testing.assert_array_equal(g.numpy(), np.pad(xt, WIDTHS, mode=m))
        np.testing.assert_array_equal(got[-1].numpy(), np.pad(i.numpy(), ((1, 1), (0, 2)), mode="reflect"))
    assert plan.misses == 0


@pytest.mark.parametrize("threads", [1, 2])
def test_a_pad_plan_runs_on_threads_at_once(threads):
    import threading
    net = Pads()
    plan = mt.compile(mt.trace_module(net, *_inputs(0)), *_inputs(0))
    results = {}

    def work(seed):
        x, i = _inputs(seed)
        results[seed] = [o.numpy().tobytes() for o in plan(x, i)] == \
            [o.numpy().tobytes() for o in net(x, i)]

    ts = [threading.Thread(target=work, args=(s,)) for s in range(3, 3 + 2 * threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert all(results.values()) and len(results) == 2 * threads
