"""lint()/check(): graphs broken by hand, one fault at a time; each fault
must be reported with a message that names it, and a sound graph (traced,
edited or built by hand) must pass."""
import numpy as np
import pytest

import mgtrace as mt
import mgtrace.functional as F
import mgtrace.module as M
from mgtrace.traced_module import (CallFunction, GraphError, InternalGraph, ModuleNode,
                                   TensorNode)
from mgtrace.traced_module.expr import is_node
from mgtrace.traced_module.pytree import tree_flatten


class Net(M.Module):
    def __init__(self):
        super().__init__()
        self.fc = M.Linear(4, 4)

    def forward(self, x):
        h = F.relu(self.fc(x))
        return h * 2 + h


class Outer(M.Module):
    def __init__(self):
        super().__init__()
        self.inner = Net()

    def forward(self, x):
        return self.inner(x) - 1


@pytest.fixture
def x(rng):
    return mt.tensor(rng.normal(size=(2, 4)).astype("float32"))


@pytest.fixture
def g(x):
    return mt.trace_module(Net(), x).graph


def _exprs(g, kind):
    return [e for e in g._exprs if e.kind == kind]


def _problems(g, recursive=True):
    probs = g.check(recursive)
    assert probs, "the broken graph passed check()"
    with pytest.raises(GraphError) as info:
        g.lint(recursive)
    assert str(info.value).startswith(f"graph {g.qualname} is broken:")
    for p in probs:
        assert p in str(info.value)
    return "\n".join(probs)


def _by_hand():
    """self, x -> y = F.relu(x) -> return y, assembled without the tracer."""
    g = InternalGraph("Hand", "Hand")
    g._add_input(g._add_node(ModuleNode(name="self"), "self"))
    x = g._add_input(g._add_node(TensorNode(name="x", shape=(2,), dtype=np.dtype("float32"))))
    e = CallFunction(F.relu, (x,))
    y = g._add_node(TensorNode(name="y", shape=(2,), dtype=np.dtype("float32")))
    y.expr, e.outputs = e, [y]
    g._append(e)
    g._in_def = tree_flatten((x,), is_node)[1]
    g._outputs = [y]
    g._out_def = tree_flatten(y, is_node)[1]
    return g, x, e, y


def test_sound_graphs_pass(g, x):
    assert g.check() == [] and g.lint() is g
    hand, *_ = _by_hand()
    assert hand.check() == []
    tm = mt.trace_module(Outer(), x)
    assert tm.graph.check() == [] and tm.inner.graph.check() == []


def test_hand_built_graph_faults():
    g, x, e, y = _by_hand()
    y.users.append(e)                              # y does not feed relu
    assert "%s lists %s as a user, but it does not read it" % (y, e) in _problems(g)

    g, x, e, y = _by_hand()
    x.users.clear()                                # relu reads x, x does not know
    assert f"{x!r} is read by {e!r} but does not list it as a user" in _problems(g)

    g, x, e, y = _by_hand()
    ghost = TensorNode(name="ghost")
    g._outputs = [ghost]                           # an output nobody defines
    assert f"output {ghost!r} is not defined in the graph" in _problems(g)

    g, x, e, y = _by_hand()
    g._inputs.append(TensorNode(name="z"))          # an input without an Input expr
    msg = _problems(g)
    assert "has no Input expr" in msg and "in_def has 1 slots for 2 inputs" in msg

    g, x, e, y = _by_hand()
    g._inputs[0] = x                               # self must come first
    assert "the first input must be the self module node" in _problems(g)


def test_dangling_user(g):
    relu = g.get_function_by_type(F.relu).as_unique()
    h = relu.outputs[0]
    stray = CallFunction(F.exp, (h,))               # never put in the graph
    h._add_user(stray)
    msg = _problems(g)
    assert f"{h!r} lists a user that is not in the graph: {stray!r}" in msg


def test_removed_expr_leaves_dangling_users_and_names(g):
    mul = g.get_method_by_type("__mul__").as_unique()
    g._exprs.remove(mul)                           # deleted without unhooking
    msg = _problems(g)
    assert "lists a user that is not in the graph" in msg
    assert "reads %r before it is defined" % mul.outputs[0] in msg
    assert "name table lists nodes that are not in the graph: ['mul']" in msg


def test_undefined_input_use_before_definition(g):
    relu = g.get_function_by_type(F.relu).as_unique()
    i = g._exprs.index(relu)
    g._exprs[i], g._exprs[i + 1] = g._exprs[i + 1], g._exprs[i]   # mul before relu
    assert f"reads {relu.outputs[0]!r} before it is defined" in _problems(g)


def test_node_of_another_graph(g, x):
    other = mt.trace_module(Net(), x).graph
    mul = g.get_method_by_type("__mul__").as_unique()
    foreign = other.inputs[1]
    mul._set_args((foreign, 2), {})
    foreign._add_user(mul)
    msg = _problems(g)
    assert f"reads {foreign!r} before it is defined (or from another graph)" in msg


def test_duplicate_names(g):
    relu = g.get_function_by_type(F.relu).as_unique()
    mul = g.get_method_by_type("__mul__").as_unique()
    mul.outputs[0]._name = relu.outputs[0].name    # bypasses the name setter
    assert "two nodes are named 'relu'" in _problems(g)
    with pytest.raises(GraphError, match="already has a node named"):
        g.inputs[1].name = "relu"                  # the setter refuses


def test_outputs_not_defined_and_out_def(g):
    relu = g.get_function_by_type(F.relu).as_unique()
    g.reset_outputs(relu.outputs[0])
    g.compile()                                    # drops mul and add
    assert g.check() == []
    mul_gone = [n for n in g.nodes(False) if n.name == "mul"]
    assert not mul_gone
    ghost = TensorNode(name="ghost")
    g._outputs = [ghost]
    assert f"output {ghost!r} is not defined in the graph" in _problems(g)
    g._outputs = []
    assert "out_def has 1 slots for 0 outputs" in _problems(g)


def test_expr_and_node_ownership(g):
    relu = g.get_function_by_type(F.relu).as_unique()
    g._exprs.append(relu)
    assert f"expr {relu!r} is listed twice" in _problems(g)
    g._exprs.pop()
    relu._top_graph = None
    assert f"expr {relu!r} says it belongs to another graph" in _problems(g)
    relu._top_graph = g
    relu.outputs[0].expr = None
    assert "is an output of" in _problems(g) and "names another producer" in _problems(g)
    relu.outputs[0].expr = relu
    relu.outputs[0].graph = None
    assert f"node {relu.outputs[0]!r} says it belongs to another graph" in _problems(g)


def test_input_expr_that_is_not_an_input(g):
    xin = g.inputs[1]
    g._inputs.remove(xin)
    msg = _problems(g)
    assert "is an Input expr but its node is not a graph input" in msg
    assert "in_def has 1 slots for 0 inputs" in msg


def test_nested_graph_faults_are_reported_from_the_top(x):
    tm = mt.trace_module(Outer(), x)
    inner = tm.inner.graph
    relu = inner.get_function_by_type(F.relu).as_unique()
    relu.outputs[0].users.clear()
    assert tm.graph.check(recursive=False) == []
    msg = _problems(tm.graph)
    assert msg.startswith("Outer.inner: ")
    assert "does not list it as a user" in msg


def test_edits_keep_graphs_sound(g, x):
    relu = g.get_function_by_type(F.relu).as_unique()
    h = relu.outputs[0]
    with g.insert_exprs(relu):
        h2 = F.sigmoid(h)
    assert g.check() == []
    g.replace_node({h: h2})
    assert g.check() == []
    g.compile()
    assert g.check() == []
    g.reset_outputs(h2)
    g.compile()
    assert g.check() == []
    g.add_output_node(h)
    assert g.check() == []
    assert issubclass(GraphError, ValueError)


class _CountingList(list):
    """A node's users list that counts the passes made over it."""
    passes = 0

    def __iter__(self):
        _CountingList.passes += 1
        return super().__iter__()


class _Fan(M.Module):
    def forward(self, x):
        out = x * 0
        for k in range(1, 200):
            out = out + x * k        # x read by 200 exprs
        return out


def test_check_reads_each_users_list_a_bounded_number_of_times(x):
    """check() on a node with 200 users passes over its users list at most
    twice (it went over it once per user: quadratic in the users), and still
    finds a user missing from it."""
    g = mt.trace_module(_Fan(), x).graph
    node = g.inputs[1]
    assert len(node.users) == 200
    node.users = _CountingList(node.users)
    _CountingList.passes = 0
    assert g.check() == []
    assert _CountingList.passes <= 2
    gone = node.users[57]
    node.users = _CountingList(u for u in node.users if u is not gone)
    _CountingList.passes = 0
    problems = g.check()
    assert _CountingList.passes <= 2
    assert problems == [f"{g.qualname}: {node!r} is read by {gone!r} but does not list it as a user"]
