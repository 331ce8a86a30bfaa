"""replace_node, compile, reset_outputs / add_output_node, add_input_node /
reset_inputs, and regenerated code: each edit is linted and the edited
module's numbers are checked against eager mgtrace / NumPy."""
import numpy as np
import pytest

import mgtrace as mt
import mgtrace.functional as F
import mgtrace.module as M
from mgtrace.traced_module import CallMethod, GraphError, TensorNode


class Net(M.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = M.Linear(6, 8)
        self.fc2 = M.Linear(8, 3)

    def forward(self, x):
        h = F.relu(self.fc1(x))
        return self.fc2(h) + h.mean(axis=1, keepdims=True)


class Pair(M.Module):
    def forward(self, a, b):
        return a * 2, a + b


@pytest.fixture
def net():
    return Net().eval()


@pytest.fixture
def x(rng):
    return mt.tensor(rng.normal(size=(4, 6)).astype("float32"))


def close(a, b, tol=1e-5):
    a = a.numpy() if isinstance(a, mt.Tensor) else np.asarray(a)
    b = b.numpy() if isinstance(b, mt.Tensor) else np.asarray(b)
    assert a.shape == b.shape, (a.shape, b.shape)
    np.testing.assert_allclose(a, b, rtol=tol, atol=tol)


def _fn(graph, fn):
    return graph.get_function_by_type(fn, recursive=False).as_unique()


def test_replace_node_rewires_users_and_outputs(net, x):
    tm = mt.trace_module(net, x)
    g = tm.graph
    relu = _fn(g, F.relu)
    h = relu.outputs[0]
    assert len(h.users) == 2                 # fc2 call and mean
    with g.insert_exprs(relu):
        h2 = F.sigmoid(h) * 3
    g.replace_node({h: h2})
    g.lint()
    assert h.users == [h2.expr.args[0].expr]  # only the sigmoid (h2 is computed from h)
    assert len(h2.users) == 2
    hv = F.sigmoid(F.relu(net.fc1(x))) * 3
    close(tm(x), net.fc2(hv) + hv.mean(axis=1, keepdims=True))
    # replacing a graph output
    out = g.outputs[0]
    with g.insert_exprs():
        neg = -out
    g.replace_node({out: neg})
    g.lint()
    assert g.outputs == [neg]
    close(tm(x), -(net.fc2(hv) + hv.mean(axis=1, keepdims=True)))
    assert "neg = -" in tm.code or "= -add" in tm.code


def test_replace_node_refuses_what_would_break_the_graph(net, x):
    tm = mt.trace_module(net, x)
    g = tm.graph
    relu = _fn(g, F.relu)
    h = relu.outputs[0]
    fc1_out = relu.args[0]
    users = list(h.users)
    with g.insert_exprs(g._exprs[-1]):     # at the end: after h's users
        late = h + 1
    g.replace_node({h: late})              # users before `late` keep h (MegEngine's rule)
    g.lint()
    assert h.users == users + [late.expr] and not late.users
    with pytest.raises(GraphError, match="self node"):
        g.replace_node({g.inputs[0]: g.inputs[0]})
    mnode = g.get_node_by_name("*fc1", recursive=False).as_unique()
    with pytest.raises(GraphError, match="module node"):
        g.replace_node({fc1_out: mnode})
    other = mt.trace_module(Net(), x).graph
    with pytest.raises(GraphError, match="not Net|is in"):
        g.replace_node({h: other.outputs[0]})
    with pytest.raises(TypeError):
        g.replace_node([(h, late)])
    g.lint()
    g.compile()
    g.lint()
    close(tm(x), net(x))


def test_replace_graph_input(net, x):
    tm = mt.trace_module(net, x)
    g = tm.graph
    xin = g.inputs[1]
    with g.insert_exprs_before():
        xs = xin * 0.5 + 1
    g.replace_node({xin: xs})
    g.lint()
    close(tm(x), net(x * 0.5 + 1))


def test_compile_removes_dead_code_and_keeps_side_effects(net, x):
    tm = mt.trace_module(net, x)
    g = tm.graph
    n_before = len(g._exprs)
    relu = _fn(g, F.relu)
    h = relu.outputs[0]
    with g.insert_exprs(relu):
        dead1 = h * 5
        dead2 = F.exp(dead1)            # a chain nobody reads
        tm.extra = M.Linear(8, 8)
        dead3 = tm.extra(h)             # a dead module call and its GetAttr
    assert len(g._exprs) == n_before + 4      # mul, exp, getattr extra, its call
    g.compile()
    g.lint()
    assert len(g._exprs) == n_before
    for n in (dead1, dead2, dead3):
        assert n.expr not in g._exprs and n.name not in g._names
    assert not any(isinstance(e, CallMethod) and e.args[0].name == "extra" for e in g._exprs)
    assert "extra" not in tm.code
    close(tm(x), net(x))

    # a write into a tensor is kept even though its result is not read
    class Writes(M.Module):
        def forward(self, x):
            y = x * 1
            y[0] = 7.0
            z = x + 1              # dead
            return y

    w = Writes()
    tw = mt.trace_module(w, x)
    gw = tw.graph
    n = len(gw._exprs)
    gw.compile()
    gw.lint()
    assert len(gw._exprs) == n - 1
    assert any(isinstance(e, CallMethod) and e.method == "__setitem__" for e in gw._exprs)
    close(tw(x), w(x))


def test_compile_keeps_calls_of_traced_submodules_that_write(x):
    class Writer(M.Module):
        def __init__(self):
            super().__init__()
            self.fc = M.Linear(6, 6)

        def forward(self, t):
            t[0] = 0.0                   # writes into its argument
            return self.fc(t)

    class Top(M.Module):
        def __init__(self):
            super().__init__()
            self.w = Writer()

        def forward(self, x):
            y = x * 1
            self.w(y)                    # result unused, side effect used
            return y + 1

    net = Top().eval()
    tm = mt.trace_module(net, x)
    n = len(tm.graph._exprs)
    tm.graph.compile()
    tm.graph.lint()
    assert len(tm.graph._exprs) == n
    want = x.numpy().copy()
    want[0] = 0.0
    close(tm(x), want + 1)


def test_reset_outputs_cuts_the_graph(net, x):
    tm = mt.trace_module(net, x)
    g = tm.graph
    h = _fn(g, F.relu).outputs[0]
    v0 = g._version
    g.reset_outputs(h)
    g.compile()
    g.lint()
    assert g._version > v0
    assert "fc2" not in tm.code and tm.code.rstrip().endswith("return relu")
    close(tm(x), F.relu(net.fc1(x)))
    fc1_out = g.get_node_by_name("*fc1.[[]out]", recursive=False).as_unique()
    g.reset_outputs({"pre": fc1_out, "post": [h, h]})
    g.lint()
    out = tm(x)
    assert list(out) == ["pre", "post"] and len(out["post"]) == 2
    close(out["pre"], net.fc1(x))
    close(out["post"][1], F.relu(net.fc1(x)))
    with pytest.raises(GraphError, match="module, not a value"):
        g.reset_outputs(g.get_node_by_name("*fc1", recursive=False).as_unique())
    g.lint()


def test_add_output_node_nests_like_megengine(net, x):
    tm = mt.trace_module(net, x)
    g = tm.graph
    h = _fn(g, F.relu).outputs[0]
    g.add_output_node(h)
    g.lint()
    out, hv = tm(x)
    close(out, net(x))
    close(hv, F.relu(net.fc1(x)))

    p = Pair()
    a, b = x, x * 3
    tp = mt.trace_module(p, a, b)
    gp = tp.graph
    gp.add_output_node(gp.inputs[2])
    gp.lint()
    (two_a, a_plus_b), b_again = tp(a, b)
    close(two_a, a.numpy() * 2)
    close(a_plus_b, a.numpy() + b.numpy())
    close(b_again, b)


def test_add_input_node(net, x, rng):
    tm = mt.trace_module(net, x)
    g = tm.graph
    bias = g.add_input_node((4, 3), name="bias")
    assert isinstance(bias, TensorNode) and bias.name == "bias" and g.inputs[-1] is bias
    g.lint()
    out = g.outputs[0]
    with g.insert_exprs():
        y = out + bias
    g.replace_node({out: y})
    g.lint()
    assert "def forward(self, x, bias)" in tm.code
    bv = mt.tensor(rng.normal(size=(4, 3)).astype("float32"))
    close(tm(x, bv), net(x) + bv)
    close(tm(x, bias=bv), net(x) + bv)
    with pytest.raises(TypeError):
        tm(x)
    # a second one gets a unique name
    extra = g.add_input_node((1,), dtype="int32", name="bias")
    assert extra.name == "bias_1" and extra.dtype == np.dtype("int32")
    g.lint()


def test_add_input_node_refuses_defaults_and_inner_graphs(x):
    class WithDefault(M.Module):
        def forward(self, x, k=2):
            return x * k

    tm = mt.trace_module(WithDefault(), x)
    with pytest.raises(GraphError, match="defaults"):
        tm.graph.add_input_node((1,))
    tm.graph.lint()
    close(tm(x), x.numpy() * 2)


def test_reset_inputs(x, rng):
    p = Pair()
    a, b = x, x * 3
    tp = mt.trace_module(p, a, b)
    g = tp.graph
    a_node, b_node = g.inputs[1:]
    # make b unused, then drop it: forward(a, b) where b is now a new input
    with g.insert_exprs_before():
        a2 = a_node + 0
    g.replace_node({b_node: a2})
    g.compile()
    g.lint()
    assert not b_node.users
    c = mt.tensor(rng.normal(size=(4, 6)).astype("float32"))
    nodes = g.reset_inputs(a_node, c)
    g.lint()
    assert nodes[0] is a_node and nodes[1] is not b_node and nodes[1].name == "b"
    assert g.inputs[1:] == nodes
    two_a, a_plus_a = tp(a, c)
    close(two_a, a.numpy() * 2)
    close(a_plus_a, a.numpy() * 2)
    # a dropped input that is still used is refused
    with pytest.raises(GraphError, match="still used"):
        g.reset_inputs(c, nodes[1])
    with pytest.raises(GraphError, match="add_input_node"):
        g.reset_inputs(a_node, c, c)
    g.lint()


def test_top_only_edits_refuse_inner_graphs(rng):
    class Inner(M.Module):
        def forward(self, x):
            return x + 1

    class Outer(M.Module):
        def __init__(self):
            super().__init__()
            self.inner = Inner()

        def forward(self, x):
            return self.inner(x) * 2

    x = mt.tensor(rng.normal(size=(2, 2)).astype("float32"))
    tm = mt.trace_module(Outer(), x)
    ig = tm.inner.graph
    for call in (lambda: ig.reset_outputs(ig.inputs[1]),
                 lambda: ig.add_output_node(ig.inputs[1]),
                 lambda: ig.add_input_node((2, 2)),
                 lambda: ig.reset_inputs(x)):
        with pytest.raises(GraphError, match="top graph"):
            call()
    ig.lint()
    tm.graph.lint()
    close(tm(x), (x.numpy() + 1) * 2)


def test_code_is_regenerated_after_each_edit(net, x):
    tm = mt.trace_module(net, x)
    g = tm.graph
    code0 = tm.code
    close(tm(x), net(x))                  # compiled once before the edit
    v0 = g._version
    relu = _fn(g, F.relu)
    with g.insert_exprs(relu):
        s = F.tanh(relu.outputs[0])
    g.replace_node({relu.outputs[0]: s})
    g.compile()
    assert g._version > v0
    assert "F.tanh(relu)" in tm.code and "F.tanh" not in code0
    hv = F.tanh(F.relu(net.fc1(x)))
    close(tm(x), net.fc2(hv) + hv.mean(axis=1, keepdims=True))
