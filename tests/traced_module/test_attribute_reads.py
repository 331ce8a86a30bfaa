"""A TracedModule reads the parameters, buffers and children its graph
uses once, and again only after a module's tables change (STATE_EPOCH).

What is proved: every way of changing what an attribute path reaches is
seen by the next call (assignment, a direct table write, deletion and
re-registration, a container's item, load_state_dict), a forward hook
that swaps a weight in the middle of a call is seen by the reads after it
(the plain code runs while any module has hooks), plain attributes and
structure members are read on every call, and a deep copy runs on its own
tensors. References: NumPy products of the weights.
"""
import copy

import numpy as np

import mgtrace as mt
import mgtrace.module as M
from mgtrace.module import module as module_state


class Net(M.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = M.Linear(3, 3, bias=False), M.Linear(3, 3, bias=False)
        self.seq = M.Sequential(M.Linear(3, 3, bias=False))
        self.scale = mt.tensor(np.float32(2.0))          # a buffer (a tensor attribute)

    def forward(self, x):
        return self.seq(self.b(self.a(x))) * self.scale


def weights(rng, n=3):
    return [rng.standard_normal((3, 3)).astype("float32") for _ in range(n)]


def want(x, wa, wb, ws, scale=2.0):
    return x.numpy() @ wa.T @ wb.T @ ws.T * scale


def setup(rng):
    net = Net().eval()
    wa, wb, ws = weights(rng)
    for lin, w in ((net.a, wa), (net.b, wb), (net.seq[0], ws)):
        lin.weight = M.Parameter(w)
    x = mt.tensor(rng.standard_normal((2, 3)).astype("float32"))
    tm = mt.trace_module(net, x)
    return tm, x, (wa, wb, ws)


def test_changes_to_the_tables_are_seen_by_the_next_call(rng):
    tm, x, (wa, wb, ws) = setup(rng)
    np.testing.assert_allclose(tm(x).numpy(), want(x, wa, wb, ws), rtol=1e-5)
    # assignment of a parameter
    wa2 = wa * 3
    tm.a.weight = M.Parameter(wa2)
    np.testing.assert_allclose(tm(x).numpy(), want(x, wa2, wb, ws), rtol=1e-5)
    # a direct write into a table
    wb2 = wb - 1
    tm.b._parameters["weight"] = M.Parameter(wb2)
    np.testing.assert_allclose(tm(x).numpy(), want(x, wa2, wb2, ws), rtol=1e-5)
    # a container's item: a new child module
    new = M.Linear(3, 3, bias=False)
    new.weight = M.Parameter(-ws)
    setattr(tm.seq, "0", new)
    np.testing.assert_allclose(tm(x).numpy(), want(x, wa2, wb2, -ws), rtol=1e-5)
    # a buffer assigned, then load_state_dict
    tm.scale = mt.tensor(np.float32(-1.0))
    np.testing.assert_allclose(tm(x).numpy(), want(x, wa2, wb2, -ws, -1.0), rtol=1e-5)
    state = {k: v.numpy() for k, v in tm.state_dict().items()}
    state["a.weight"] = wa
    tm.load_state_dict(state)
    np.testing.assert_allclose(tm(x).numpy(), want(x, wa, wb2, -ws, -1.0), rtol=1e-5)
    # an in-place write needs nothing: the same tensor
    tm.a.weight[...] = 0.0
    assert not tm(x).numpy().any()


def test_reads_are_reused_until_a_table_changes(rng, monkeypatch):
    from mgtrace.traced_module import traced_module as T
    tm, x, _ = setup(rng)
    monkeypatch.setattr(T, "_module_hooks", {})     # hooks other tests left on live modules
    tm(x)
    resolved = []
    real = T._resolve_paths
    monkeypatch.setattr(T, "_resolve_paths", lambda m, p: resolved.append(p) or real(m, p))
    tm(x), tm(x)
    assert resolved == []
    tm.b.weight = M.Parameter(np.eye(3, dtype="float32"))
    before = module_state.STATE_EPOCH
    tm(x), tm(x)
    # once for each graph (the top one's and seq's), not once a call
    assert sorted(resolved) == [("0",), ("a", "b", "seq", "scale")]
    assert module_state.STATE_EPOCH == before


def test_a_hook_that_swaps_a_weight_mid_call_is_seen(rng):
    tm, x, (wa, wb, ws) = setup(rng)
    tm(x)
    wb2 = wb * 5

    def swap(module, args):
        tm.b.weight = M.Parameter(wb2)

    handle = tm.a.register_forward_pre_hook(swap)
    np.testing.assert_allclose(tm(x).numpy(), want(x, wa, wb2, ws), rtol=1e-5)
    handle.remove()


def test_only_table_paths_are_reused():
    """A path through a plain attribute or a name that a class attribute
    hides is read by the code itself on every call."""
    from mgtrace.traced_module.traced_module import _resolve_paths
    class Shadowed(Net):
        shadow = "a class attribute"

    net = Shadowed()
    object.__setattr__(net, "plain", M.Linear(3, 3))       # in __dict__, no table
    assert _resolve_paths(net, ("a.weight", "seq.0")) == (net.a.weight, net.seq[0])
    assert _resolve_paths(net, ("plain.weight",)) is None
    net._modules["shadow"] = M.ReLU()                      # net.shadow is the class attribute
    assert _resolve_paths(net, ("shadow",)) is None
    assert _resolve_paths(net, ("a.nothing",)) is None


def test_a_table_put_in_place_whole_is_seen(rng):
    import collections
    tm, x, (wa, wb, ws) = setup(rng)
    tm(x)
    tm.a._parameters = collections.OrderedDict(weight=M.Parameter(2 * wa), bias=None)
    np.testing.assert_allclose(tm(x).numpy(), want(x, 2 * wa, wb, ws), rtol=1e-5)
    tm.a._parameters["weight"] = M.Parameter(3 * wa)       # and later writes into it
    np.testing.assert_allclose(tm(x).numpy(), want(x, 3 * wa, wb, ws), rtol=1e-5)


def test_removing_the_last_hook_brings_the_fast_path_back(rng):
    tm, x, _ = setup(rng)
    handle = tm.a.register_forward_hook(lambda m, a, out: None)
    assert tm.a in module_state._HOOKS
    handle.remove()
    assert tm.a not in module_state._HOOKS


def test_a_deep_copy_runs_on_its_own_tensors(rng):
    tm, x, (wa, wb, ws) = setup(rng)
    tm(x)
    twin = copy.deepcopy(tm)
    twin.a.weight[...] = 0.0
    np.testing.assert_allclose(tm(x).numpy(), want(x, wa, wb, ws), rtol=1e-5)
    assert not twin(x).numpy().any()
