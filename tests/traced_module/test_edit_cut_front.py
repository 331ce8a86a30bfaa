"""reset_inputs with a node of the graph cuts the model at the front: the
node becomes an input, what only computed it goes, and the original inputs
it no longer needs are dropped."""
import io

import numpy as np
import pytest

import mgtrace as mt
import mgtrace.functional as F
import mgtrace.module as M
from mgtrace.traced_module import GraphError


class Head(M.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = M.Linear(3, 4)
        self.fc2 = M.Linear(4, 2)

    def forward(self, x, scale):
        return self.fc2(F.relu(self.fc1(x))) * scale


def _rand(*shape, seed=0):
    return np.random.default_rng(seed).normal(size=shape).astype(np.float32)


def _fc2(net, f):
    """NumPy: the second layer on features f [N, 4]."""
    return f @ net.fc2.weight.numpy().T + net.fc2.bias.numpy()


@pytest.fixture
def traced():
    net = Head()
    return net, mt.trace_module(net, mt.tensor(_rand(2, 3)), mt.tensor(_rand(2, 1, seed=1)))


def test_cutting_at_a_node_drops_the_input_before_it(traced):
    net, tm = traced
    g = tm.graph
    x, scale = g.inputs[1:]
    relu = g.get_node_by_name("relu").as_unique()
    nodes = g.reset_inputs(relu, scale)
    g.lint()
    assert nodes[1] is scale and nodes[0].name == "x" and nodes[0].shape == (2, 4)
    assert g.inputs[1:] == nodes and x not in g.nodes(False)
    assert not [e for e in g.exprs(False) if "fc1" in str(e)]       # what fed relu is gone
    f, s = _rand(5, 4, seed=2), _rand(5, 1, seed=3)
    want = _fc2(net, f) * s
    np.testing.assert_allclose(tm(mt.tensor(f), mt.tensor(s)).numpy(), want, rtol=1e-5, atol=1e-6)
    buf = io.BytesIO()
    mt.save(tm, buf)
    loaded = mt.load(io.BytesIO(buf.getvalue()))
    np.testing.assert_allclose(loaded(mt.tensor(f), mt.tensor(s)).numpy(), want, rtol=1e-5,
                               atol=1e-6)


def test_an_input_the_outputs_still_need_is_refused_and_nothing_changes():
    class Skip(M.Module):
        def __init__(self):
            super().__init__()
            self.fc = M.Linear(3, 3)

        def forward(self, x):
            return F.relu(self.fc(x)) + x         # x is read past the cut as well

    net = Skip()
    x = _rand(2, 3)
    tm = mt.trace_module(net, mt.tensor(x))
    g = tm.graph
    before = str(g)
    relu = g.get_node_by_name("relu").as_unique()
    with pytest.raises(GraphError, match=r"input 'x' is still used by .*__add__.*; replace_node "
                                         "it first, or cut the graph after it"):
        g.reset_inputs(relu)
    assert str(g) == before
    g.lint()
    np.testing.assert_allclose(tm(mt.tensor(x)).numpy(), net(mt.tensor(x)).numpy(), rtol=1e-6)


def test_a_cut_must_be_a_tensor_node_of_this_graph(traced):
    _, tm = traced
    g = tm.graph
    fc1 = g.get_node_by_name("fc1").as_unique()                 # a module node
    with pytest.raises(GraphError, match="cut only at a tensor node"):
        g.reset_inputs(fc1, g.inputs[2])
    other = mt.trace_module(Head(), mt.tensor(_rand(2, 3)), mt.tensor(_rand(2, 1)))
    relu = other.graph.get_node_by_name("relu").as_unique()
    with pytest.raises(GraphError, match="not"):
        g.reset_inputs(relu, g.inputs[2])
    with pytest.raises(GraphError, match="given twice"):
        g.reset_inputs(g.inputs[2], g.inputs[2])
    g.lint()


def test_an_input_that_is_an_output_is_named_as_such():
    class Both(M.Module):
        def forward(self, x):
            return F.relu(x * 2), x

    tm = mt.trace_module(Both(), mt.tensor(_rand(2, 3)))
    g = tm.graph
    mul = g.get_node_by_name("mul").as_unique()
    with pytest.raises(GraphError, match=r"input 'x' is still used by the graph's outputs"):
        g.reset_inputs(mul)
    g.lint()
