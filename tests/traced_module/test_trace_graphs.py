"""Graphs per call signature, shared submodules, and flatten().

One graph per distinct call structure of a module (argdef_graph_map); a
submodule called twice the same way is one module node, two call exprs and
one graph; flatten() inlines every traced call into one graph with the same
outputs, consistent users, unique names, shared modules read once.
"""
import numpy as np
import pytest

import mgtrace as mt
import mgtrace.functional as F
import mgtrace.module as M
from mgtrace.traced_module import GraphError, TracedModule


def _rand(*shape, seed=0):
    return mt.tensor(np.random.default_rng(seed).standard_normal(shape).astype("float32"))


def _exprs(graph):
    return [e for e in graph.exprs(recursive=False) if e.kind != "input"]


def _calls(graph):
    return [e for e in _exprs(graph) if e.kind == "call_method" and e.method == "__call__"]


class Sub(M.Module):
    def __init__(self):
        super().__init__()
        self.fc = M.Linear(3, 3)

    def forward(self, x, y=None):
        h = self.fc(x)
        return h if y is None else h + y


class Shared(M.Module):
    def __init__(self):
        super().__init__()
        self.sub = Sub()

    def forward(self, x):
        a = self.sub(x)
        b = self.sub(a)              # same structure: same graph
        return self.sub(a, b)        # another structure: a second graph


def test_a_shared_submodule_is_one_node_and_one_graph_per_structure():
    net, x = Shared(), _rand(2, 3)
    tm = mt.trace_module(net, x)
    calls = _calls(tm.graph)
    assert len(calls) == 3
    assert calls[0].args[0] is calls[1].args[0] is calls[2].args[0]       # one module node
    assert sum(e.kind == "getattr" for e in _exprs(tm.graph)) == 1
    graphs = tm.sub.argdef_graph_map
    assert len(graphs) == 2
    assert calls[0].arg_def == calls[1].arg_def != calls[2].arg_def
    assert set(graphs) == {calls[0].arg_def, calls[2].arg_def}
    with pytest.raises(GraphError, match="2 graphs"):
        tm.sub.graph
    # each graph runs when called directly with its structure
    h = net.sub.fc(x)
    np.testing.assert_array_equal(tm.sub(x).numpy(), h.numpy())
    np.testing.assert_array_equal(tm.sub(x, h).numpy(), (h + h).numpy())
    x2 = _rand(5, 3, seed=1)
    np.testing.assert_array_equal(tm(x2).numpy(), net(x2).numpy())


class TwoSignatures(M.Module):
    def forward(self, x, mode="add"):
        return x + 1 if mode == "add" else x * 2


def test_one_graph_per_signature_of_the_root():
    net = TwoSignatures()
    tm = mt.trace_module(net, _rand(2))
    assert len(tm.argdef_graph_map) == 1
    x = _rand(3, seed=1)
    np.testing.assert_allclose(tm(x).numpy(), x.numpy() + 1)
    with pytest.raises(TypeError, match="mode: the module was traced with 'add', got 'mul'"):
        tm(x, mode="mul")
    assert tm.argdef_outdef_map[tm.graph.in_def] == tm.graph.out_def


class Identity2(M.Module):
    def forward(self, x, y):
        return x, y


class Double(M.Module):
    def forward(self, x):
        return x + x


class Tree(M.Module):
    def __init__(self):
        super().__init__()
        self.ident = Identity2()
        self.d1 = Double()
        self.d2 = Double()
        self.seq = M.Sequential(M.ReLU(), Sub())
        self.shared = Sub()

    def forward(self, x):
        a, b = self.ident(x, x * 3)             # returns its inputs unchanged
        c = self.d1(a)
        e = self.d2(c)
        s = self.shared(self.shared(e))
        return self.ident(self.seq(s) + b, c)


def test_flatten_equal_outputs_and_a_sound_graph():
    net, x = Tree(), _rand(2, 3)
    tm = mt.trace_module(net, x)
    flat = tm.flatten()
    assert flat is not tm and isinstance(flat, TracedModule)
    x2 = _rand(4, 3, seed=1)
    for got, want in zip(flat(x2), net(x2)):
        np.testing.assert_array_equal(got.numpy(), want.numpy())
    g = flat.graph
    g.lint()
    assert g.check() == []
    # no call of a traced module is left
    assert not any(isinstance(e.args[0].owner, TracedModule) for e in _calls(g))
    # users: each node lists exactly the exprs that read it (x + x lists one user once)
    for n in g.nodes(recursive=False):
        readers = [e for e in g.exprs(recursive=False) if any(i is n for i in e.inputs)]
        assert n.users == readers, n
    add_self = [e for e in _exprs(g) if e.kind == "call_method" and e.method == "__add__"
                and e.inputs[0] is e.inputs[1]]
    assert len(add_self) == 2
    # names are unique
    names = [n.name for n in g.nodes(recursive=False)]
    assert len(names) == len(set(names))
    # the shared Linear is read once, called twice
    fc_reads = [e for e in _exprs(g) if e.kind == "getattr" and e.name == "shared.fc"]
    assert len(fc_reads) == 1
    assert sum(e.args[0] is fc_reads[0].outputs[0] for e in _calls(g)) == 2
    # the original is untouched
    assert isinstance(tm.d1, TracedModule) and len(_calls(tm.graph)) == 7


def test_flatten_returns_inputs_and_keeps_state():
    net = Identity2()
    x, y = _rand(2), _rand(2, seed=1)
    flat = mt.trace_module(net, x, y).flatten()
    a, b = flat(y, x)
    np.testing.assert_array_equal(a.numpy(), y.numpy())
    np.testing.assert_array_equal(b.numpy(), x.numpy())
    tree = Tree()
    flat = mt.trace_module(tree, _rand(1, 3)).flatten()
    assert list(flat.state_dict()) == list(tree.state_dict())
    for k, v in tree.state_dict().items():
        np.testing.assert_array_equal(flat.state_dict()[k].numpy(), v.numpy())


def test_flatten_of_a_functional_only_model():
    class Fn(M.Module):
        def forward(self, x):
            return F.softmax(x * 2, axis=-1)
    x = _rand(2, 5)
    tm = mt.trace_module(Fn(), x)
    flat = tm.flatten()
    np.testing.assert_array_equal(flat(x).numpy(), tm(x).numpy())
    assert [e.kind for e in _exprs(flat.graph)] == ["call_method", "call_function"]


class Holder(M.Module):
    def __init__(self, inner):
        super().__init__()
        self.inner = inner
        self.act = M.ReLU()

    def forward(self, x):
        return self.act(self.inner(x) - x.shape[0])


def test_tracing_a_model_that_holds_a_traced_module_and_retracing():
    x = _rand(2, 3)
    inner = mt.trace_module(Sub(), x)
    net = Holder(inner)
    tm = mt.trace_module(net, x)
    assert isinstance(tm.inner, TracedModule) and tm.inner is not inner
    assert tm.inner.graph.qualname == "Holder.inner"
    again = mt.trace_module(tm, x)                 # a TracedModule traces like its source
    assert again.graph.qualname == "Holder" and again.inner.graph.qualname == "Holder.inner"
    x4 = _rand(4, 3, seed=1)
    want = net(x4).numpy()
    np.testing.assert_allclose(want, np.maximum(inner(x4).numpy() - 4, 0))
    for m in (tm, again, again.flatten()):
        np.testing.assert_array_equal(m(x4).numpy(), want)
    assert list(again.state_dict()) == list(net.state_dict())


class _Containers(M.Module):
    def __init__(self):
        super().__init__()
        self.layers = M.Sequential(M.Linear(4, 4), M.ReLU())
        self.ml = M.ModuleList([M.Linear(4, 4), M.Linear(4, 3)])
        self.md = M.ModuleDict({"a": M.Linear(3, 2)})

    def forward(self, x):
        x = self.layers(x)
        for m in self.ml:
            x = m(x)
        return self.md["a"](x)


def test_retracing_keeps_container_behaviour():
    from mgtrace.traced_module.traced_module import TracedDict, TracedSequence
    net = _Containers()
    x = mt.tensor(np.random.default_rng(0).standard_normal((2, 4)).astype("float32"))
    tm = mt.trace_module(mt.trace_module(net, x), x)          # what `mgtrace retrace` does
    assert type(tm.layers) is TracedSequence and type(tm.ml) is TracedSequence
    assert type(tm.md) is TracedDict
    assert type(tm.layers[0]).__name__ == "Linear" and len(tm.layers) == 2 and len(tm.ml) == 2
    assert [type(m).__name__ for m in tm.ml] == ["Linear", "Linear"]
    assert tm.md["a"].weight.shape == (2, 3) and list(tm.md) == ["a"]
    np.testing.assert_array_equal(tm(x).numpy(), net(x).numpy())
