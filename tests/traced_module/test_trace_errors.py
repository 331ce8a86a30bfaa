"""Errors and warnings while tracing, and watch/end points when running.

An exception inside a traced submodule names the module path and the
user's line that raised it (a note on Python 3.11+, a TraceError on older
versions); a branch on a tensor's value warns and follows the path taken;
set_watch_points / set_end_points on top-graph nodes give the right values.
"""
import inspect
import warnings

import numpy as np
import pytest

import mgtrace as mt
import mgtrace.functional as F
import mgtrace.module as M
from mgtrace.traced_module import GraphError, TraceError, TraceWarning, tracer


def _rand(*shape, seed=0):
    return mt.tensor(np.random.default_rng(seed).standard_normal(shape).astype("float32"))


def _line_of(fn, text):
    src, start = inspect.getsourcelines(fn)
    return start + next(i for i, ln in enumerate(src) if text in ln)


class Bad(M.Module):
    def forward(self, x):
        y = x + 1
        return y.reshape(7, 5)                   # the failing line


class Net(M.Module):
    def __init__(self):
        super().__init__()
        self.layer1 = M.Sequential(Bad())

    def forward(self, x):
        return self.layer1(x)


def test_an_error_names_the_module_path_and_the_raising_line():
    with pytest.raises(ValueError, match="cannot reshape") as info:
        mt.trace_module(Net(), _rand(2, 3))
    notes = info.value.__notes__
    assert len(notes) == 1                       # the innermost module only
    line = _line_of(Bad.forward, "the failing line")
    assert notes[0] == f"while tracing Net.layer1.0 (Bad.forward), raised at {__file__}:{line}"


def test_an_error_in_a_builtin_names_the_caller():
    class Caller(M.Module):
        def __init__(self):
            super().__init__()
            self.fc = M.Linear(4, 2)

        def forward(self, x):
            return self.fc(x)                    # wrong width
    with pytest.raises(Exception) as info:
        mt.trace_module(Caller(), _rand(2, 3))
    line = _line_of(Caller.forward, "wrong width")
    assert info.value.__notes__ == [f"while tracing Caller (Caller.forward), raised at "
                                    f"{__file__}:{line}"]


def test_without_add_note_the_error_is_a_trace_error(monkeypatch):
    monkeypatch.setattr(tracer, "_HAS_NOTES", False)        # what Python 3.10 does
    with pytest.raises(TraceError) as info:
        mt.trace_module(Net(), _rand(2, 3))
    err = info.value
    msg = str(err)
    line = _line_of(Bad.forward, "the failing line")
    assert msg.startswith("ValueError: cannot reshape")
    assert msg.endswith(f"while tracing Net.layer1.0 (Bad.forward), raised at {__file__}:{line}")
    assert isinstance(err.__cause__, ValueError)
    assert not getattr(err.__cause__, "__notes__", None)
    assert issubclass(TraceError, RuntimeError)


def test_tracing_leaves_no_hooks_behind_after_an_error():
    with pytest.raises(ValueError):
        mt.trace_module(Net(), _rand(2, 3))
    x = _rand(2, 3)
    assert type(x.shape[0]) is int               # shape hook is off
    tm = mt.trace_module(M.Sequential(M.ReLU()), x)       # and a new trace starts fine
    np.testing.assert_array_equal(tm(x).numpy(), np.maximum(x.numpy(), 0))


class Branchy(M.Module):
    def forward(self, x):
        if x.sum() > 0:                          # the branch
            return x + 1
        return x - 1


def test_a_branch_on_a_tensor_warns_and_follows_the_path_taken():
    pos = mt.tensor(np.ones((2, 2), "float32"))
    with pytest.warns(TraceWarning, match="converted to a Python bool") as rec:
        tm = mt.trace_module(Branchy(), pos)
    w = [r for r in rec if issubclass(r.category, TraceWarning)][0]
    assert w.filename == __file__ and w.lineno == _line_of(Branchy.forward, "the branch")
    assert "follows the branch taken" in str(w.message)
    neg = -pos
    np.testing.assert_array_equal(tm(neg).numpy(), neg.numpy() + 1)      # the traced path
    np.testing.assert_array_equal(Branchy()(neg).numpy(), neg.numpy() - 1)


def test_no_warning_for_a_clean_trace():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        mt.trace_module(M.Sequential(M.Linear(2, 2), M.ReLU()), _rand(1, 2))


def test_calling_a_module_that_is_not_a_submodule_is_a_clear_error():
    stranger = M.Linear(2, 2)

    class Outside(M.Module):
        def forward(self, x):
            return stranger(x)
    with pytest.raises(TraceError, match="not one of its submodules") as info:
        mt.trace_module(Outside(), _rand(1, 2))
    assert "while tracing Outside" in info.value.__notes__[0]


# ------------------------------------------------------ watch / end points
class Pipe(M.Module):
    def __init__(self):
        super().__init__()
        self.fc = M.Linear(3, 3)

    def forward(self, x):
        a = self.fc(x)
        b = F.relu(a)
        return b * 2


def _traced_pipe():
    """(eager Pipe, its TracedModule, the fc output node, the relu node)."""
    net = Pipe()
    tm = mt.trace_module(net, _rand(2, 3))
    g = tm.graph
    return net, tm, g.get_node_by_name("fc_out").as_unique(), g.get_node_by_name("relu").as_unique()


def test_watch_points_record_every_run():
    net, tm, a, b = _traced_pipe()
    tm.set_watch_points([a, b])
    x1, x2 = _rand(2, 3, seed=1), _rand(4, 3, seed=2)
    out1, out2 = tm(x1), tm(x2)
    for x, out, i in ((x1, out1, 0), (x2, out2, 1)):
        fc = net.fc(x).numpy()
        np.testing.assert_array_equal(tm.watch_node_value[a][i].numpy(), fc)
        np.testing.assert_array_equal(tm.watch_node_value[b][i].numpy(), np.maximum(fc, 0))
        np.testing.assert_array_equal(out.numpy(), np.maximum(fc, 0) * 2)
    tm.clear_watch_points()
    tm(x1)
    assert tm.watch_node_value == {}


def test_end_points_stop_the_run_early():
    net, tm, a, b = _traced_pipe()
    x = _rand(5, 3, seed=3)
    tm.set_end_points([a])
    (got,) = tm(x)
    np.testing.assert_array_equal(got.numpy(), net.fc(x).numpy())
    tm.set_end_points([b, a])
    rb, ra = tm(x)
    np.testing.assert_array_equal(rb.numpy(), np.maximum(ra.numpy(), 0))
    tm.clear_end_points()
    np.testing.assert_array_equal(tm(x).numpy(), net(x).numpy())


def test_a_graph_input_can_be_watched_and_be_an_end_point():
    net, tm, a, _ = _traced_pipe()
    x_node = tm.graph.inputs[1]
    tm.set_watch_points([x_node, a])
    x = _rand(2, 3, seed=5)
    tm(x)
    np.testing.assert_array_equal(tm.watch_node_value[x_node][0].numpy(), x.numpy())
    np.testing.assert_array_equal(tm.watch_node_value[a][0].numpy(), net.fc(x).numpy())
    tm.set_end_points([x_node])
    (got,) = tm(x)
    np.testing.assert_array_equal(got.numpy(), x.numpy())
    tm.set_end_points([a, x_node])
    fa, fx = tm(x)
    np.testing.assert_array_equal(fa.numpy(), net.fc(x).numpy())
    np.testing.assert_array_equal(fx.numpy(), x.numpy())


def test_flatten_moves_watch_and_end_points_to_the_flat_graph():
    net, tm, a, b = _traced_pipe()
    x = _rand(3, 3, seed=4)
    tm.set_watch_points([b])
    tm.set_end_points([a])
    flat = tm.flatten()
    assert all(n.graph is flat.graph for n in flat.watch_points + flat.end_points)
    (got,) = flat(x)
    np.testing.assert_array_equal(got.numpy(), net.fc(x).numpy())
    tm.clear_end_points()
    flat = tm.flatten()
    out = flat(x)
    (w,) = flat.watch_node_value[flat.watch_points[0]]
    np.testing.assert_array_equal(w.numpy(), np.maximum(net.fc(x).numpy(), 0))
    np.testing.assert_array_equal(out.numpy(), net(x).numpy())


def test_flatten_records_a_value_once_when_two_points_become_one_node():
    class Ident(M.Module):
        def forward(self, x):
            return x

    class Net(M.Module):
        def __init__(self):
            super().__init__()
            self.fc, self.ident = M.Linear(3, 3), Ident()

        def forward(self, x):
            return self.ident(self.fc(x)) * 2

    net = Net()
    tm = mt.trace_module(net, _rand(2, 3))
    g = tm.graph
    tm.set_watch_points([g.get_node_by_name("fc_out").as_unique(), g.get_node_by_name("ident_out").as_unique()])
    flat = tm.flatten()
    x = _rand(2, 3, seed=5)
    flat(x)
    (node,) = flat.watch_points
    (v,) = flat.watch_node_value[node]
    np.testing.assert_array_equal(v.numpy(), net.fc(x).numpy())


def test_points_must_be_top_graph_nodes():
    class Outer(M.Module):
        def __init__(self):
            super().__init__()
            self.pipe = Pipe()

        def forward(self, x):
            return self.pipe(x)
    tm = mt.trace_module(Outer(), _rand(2, 3))
    inner = tm.pipe.graph.get_node_by_name("relu").as_unique()
    with pytest.raises(GraphError, match="flatten"):
        tm.set_watch_points([inner])
    with pytest.raises(GraphError, match="top TracedModule"):
        tm.pipe.set_end_points([inner])
    with pytest.raises(TypeError, match="expected graph Nodes"):
        tm.set_end_points(["relu"])
    # after flatten the same value is a top-graph node
    flat = tm.flatten()
    node = flat.graph.get_node_by_name("pipe_relu").as_unique()
    flat.set_end_points([node])
    x = _rand(3, 3, seed=4)
    np.testing.assert_array_equal(flat(x)[0].numpy(), np.maximum(tm.pipe.fc(x).numpy(), 0))


class _Embed(M.Module):
    def __init__(self):
        super().__init__()
        self.emb = M.Embedding(10, 4)
        self.inner = _Pool()

    def forward(self, idx, scale):
        return self.inner(self.emb(idx)) * scale


class _Pool(M.Module):
    def forward(self, h):
        return h.sum(axis=1)


def test_a_failing_call_says_what_the_model_was_traced_with(tmp_path):
    idx = mt.tensor(np.array([[1, 2, 3, 4, 5, 6, 7, 8]], "int32"))
    scale = mt.tensor(np.float32(2.0))
    mt.save(mt.trace_module(_Embed(), idx, scale), tmp_path / "m.tmod")
    tm = mt.load(tmp_path / "m.tmod")
    np.testing.assert_array_equal(tm(idx, scale).numpy(), _Embed.forward(tm, idx, scale).numpy())
    bad = mt.tensor(np.zeros((1, 8), "float32"))
    with pytest.raises(TypeError) as e:
        tm(bad, scale)
    assert str(e.value) == ("embedding: input must be an integer tensor, got float32 (_Embed was "
                            "traced with idx: int32[1, 8], scale: float32[]; this call passed "
                            "idx: float32[1, 8], scale: float32[])")
    # raised inside a traced submodule: said once, about the module that was called
    with pytest.raises(Exception) as e:
        tm(idx, mt.tensor(np.ones((3, 5), "float32")))
    assert str(e.value).count("was traced with") == 1 and "_Embed was traced" in str(e.value)
    assert "scale: float32[3, 5]" in str(e.value)
    tm.inner(tm.emb(idx))                       # a good call after a failed one: no leftovers
    with pytest.raises(Exception) as e:
        tm.inner(mt.tensor(np.ones(3, "float32")))
    assert "_Pool was traced with h: float32[1, 8, 4]; this call passed h: float32[3]" in str(e.value)
