"""The graph API as MegEngine users write it (issue 13, points 5, 7, 8, 9, 10
and 11): names, qualnames, ids, Expr.graph/top_graph, the self node inside
insert_exprs, user modules inserted, replace_node's rule and the expr
editing helpers."""
import copy
import inspect
import io

import numpy as np
import pytest

import mgtrace as mt
import mgtrace.functional as F
import mgtrace.module as M
from mgtrace.traced_module import CallFunction, CallMethod, GraphError


def _x(*shape, seed=0):
    return mt.tensor(np.random.default_rng(seed).standard_normal(shape).astype("float32"))


class Block(M.Module):
    def __init__(self):
        super().__init__()
        self.conv = M.Linear(3, 3)

    def forward(self, x):
        y = F.relu(self.conv(x))
        y.name = "act"                          # names this node in the graph
        return y


class Net(M.Module):
    def __init__(self):
        super().__init__()
        self.block0 = Block()
        self.scale = mt.tensor([2.0])
        self.unused = Block()                   # never called while tracing

    def forward(self, x, k=1.0):
        r = self.block0(x) * self.scale * k
        r.name = "result"
        return r


@pytest.fixture
def net():
    return Net().eval()


@pytest.fixture
def tm(net):
    return mt.trace_module(net, _x(2, 3))


def test_tensor_names_name_the_nodes(tm):
    g = tm.graph
    assert g.outputs[0].name == "result" and str(g.outputs[0]) == "result"
    assert tm.block0.graph.outputs[0].name == "act"
    assert "result = " in tm.code and "return result" in tm.code
    t = mt.tensor([1.0])
    assert t.name is None
    t.name = "plain"                            # outside a trace: just a label
    assert t.name == "plain"


def test_qualnames_follow_the_bracket_rule(tm):
    g = tm.graph
    assert g.inputs[0].qualname == "Net"
    assert g.inputs[1].qualname == "Net.[x]"
    assert g.get_node_by_name("Net.scale").as_unique().expr.name == "scale"
    assert tm.block0.graph.outputs[0].qualname == "Net.block0.[act]"
    call_out = g.get_method_by_type("__call__", recursive=False).as_unique().outputs[0]
    assert call_out.qualname == "Net.block0.[out]"
    for n in g.nodes():
        q = n.qualname
        path = q.rsplit(".[", 1)[0] if q.endswith("]") else q
        assert not path.endswith("]") and "[" not in path, q      # an attribute path is left


def test_graph_names_and_get_node_by_name_full_form(tm):
    assert tm.graph.name == "Net" and tm.block0.graph.name == "Net_block0"
    g = tm.graph
    assert g.get_node_by_name("Net_result").as_unique() is g.outputs[0]
    assert g.get_node_by_name("Net_block0_act").as_unique() is tm.block0.graph.outputs[0]
    assert g.get_node_by_name("net_block0_*").as_count() >= 3           # ignorecase, wildcards
    tm.block0.graph.name = "Renamed"
    assert g.get_node_by_name("Renamed_act").as_count() == 1
    with pytest.raises(TypeError):
        tm.graph.name = ""


def test_expr_graph_is_the_callee_and_top_graph_the_holder(tm):
    g = tm.graph
    call = g.get_method_by_type("__call__", recursive=False).as_unique()
    assert call.graph is tm.block0.graph and call.top_graph is g
    inner = tm.block0.graph.get_method_by_type("__call__").as_unique()      # a builtin leaf
    assert inner.graph is None and inner.top_graph is tm.block0.graph
    relu = g.get_function_by_type(F.relu).as_unique()                       # recursive query
    assert relu.graph is None and relu.top_graph is tm.block0.graph
    assert relu.outputs[0].top_graph is tm.block0.graph


def test_ids_number_from_zero_and_survive_save_and_load(tm):
    exprs = tm.graph.exprs().as_list()
    nodes = tm.graph.nodes().as_list()
    assert [e.id for e in exprs] == list(range(len(exprs)))
    assert [n.id for n in nodes] == list(range(len(nodes)))
    again = mt.trace_module(Net().eval(), _x(2, 3))
    assert [e.id for e in again.graph.exprs()] == [e.id for e in exprs]   # per traced module
    relu_id = tm.graph.get_function_by_type(F.relu).as_unique().id
    loaded = mt.load(_saved(tm))
    assert loaded.graph.get_expr_by_id(relu_id).as_unique().func is F.relu
    assert [n.id for n in loaded.graph.nodes()] == [n.id for n in nodes]


def _saved(tm, **kw):
    buf = io.BytesIO()
    mt.save(tm, buf, **kw)
    return io.BytesIO(buf.getvalue())


def test_ids_of_an_edited_graph_are_kept_by_an_optional_1_1_field(tm):
    from mgtrace.serialization import load_archive
    g = tm.graph
    assert "ids" not in str(load_archive(_saved(tm)).header["modules"])    # not needed: 1.0 form
    mul = g.get_method_by_type("__mul__").as_list()[0]
    out = mul.outputs[0]
    with g.insert_exprs(mul):
        t = F.tanh(out)
    g.replace_node({out: t})
    g.compile()
    new_id = t.expr.id
    assert new_id == max(e.id for e in g.exprs())        # the next number of this tree
    loaded = mt.load(_saved(tm))
    assert loaded.graph.get_expr_by_id(new_id).as_unique().func is F.tanh
    # a 1.0 archive has no room for them: the load renumbers from 0
    old = mt.load(_saved(tm, target_version=(1, 0)))
    assert [e.id for e in old.graph.exprs()] == list(range(len(old.graph.exprs())))


def test_self_node_reaches_submodules_and_attributes(tm, net):
    g = tm.graph
    self_node = g.inputs[0]
    out = g.outputs[0]
    with g.insert_exprs():
        y = self_node.block0(out) * self_node.scale
    g.replace_node({out: y})
    g.compile()
    g.lint()
    x = _x(2, 3, seed=1)
    want = net.block0(net(x)).numpy() * 2.0
    np.testing.assert_allclose(tm(x).numpy(), want, rtol=1e-5, atol=1e-6)
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        with g.insert_exprs():
            self_node.nope
    with pytest.raises(AttributeError, match="insert_exprs"):
        self_node.scale                          # outside a block: only inside one


class Extra(M.Module):
    def __init__(self):
        super().__init__()
        self.fc = M.Linear(3, 3)
        self.register_buffer("k", mt.tensor([3.0]))

    def forward(self, x):
        return F.sigmoid(self.fc(x)) * self.k


def test_an_inserted_user_module_is_traced_on_first_use(tm, net):
    g = tm.graph
    out = g.outputs[0]
    tm.extra = Extra()
    with g.insert_exprs():
        y = tm.extra(out)
        z = g.inputs[0].unused(y)               # a submodule never called while tracing
    g.replace_node({out: z})
    g.compile()
    g.lint()
    assert isinstance(tm.extra, mt.TracedModule) and tm.extra.graph.qualname == "Net.extra"
    assert isinstance(tm.unused, mt.TracedModule) and tm.unused.graph.qualname == "Net.unused"
    x = _x(2, 3, seed=2)
    want = net.unused(F.sigmoid(tm.extra.fc(net(x))) * 3.0)
    np.testing.assert_allclose(tm(x).numpy(), want.numpy(), rtol=1e-5, atol=1e-6)
    flat = tm.flatten()
    np.testing.assert_allclose(flat(x).numpy(), want.numpy(), rtol=1e-5, atol=1e-6)
    assert not any(isinstance(e, CallMethod) and e.graph is not None for e in flat.graph._exprs)
    loaded = mt.load(_saved(tm))
    np.testing.assert_allclose(loaded(x).numpy(), want.numpy(), rtol=1e-5, atol=1e-6)
    ids = [e.id for e in tm.graph.exprs()]
    assert len(set(ids)) == len(ids)             # the inserted graphs took this tree's ids


def test_replace_node_leaves_earlier_users_and_compile_drops_dead_ones(tm):
    g = tm.block0.graph
    relu = g.get_function_by_type(F.relu).as_unique()
    h = relu.args[0]                             # the Linear's output
    with g.insert_exprs(relu):                   # after the relu, which reads h
        h2 = h * 0.5
    g.replace_node({h: h2})                      # the relu comes before h2: keeps h
    assert relu.args[0] is h and not h2.users
    g.compile()
    assert h2.expr not in g._exprs
    g.lint()


def test_expr_editing_helpers(tm, net):
    g = tm.block0.graph
    relu = g.get_function_by_type(F.relu).as_unique()
    call = g.get_method_by_type("__call__").as_unique()
    assert relu.named_args == {"x": call.outputs[0]}
    assert call.named_args == {"self": call.args[0], "x": g.inputs[1]}
    assert relu.return_val is relu.outputs[0]
    relu.set_arg("x", g.inputs[1])               # relu of the input itself
    g.compile()
    g.lint()
    x = _x(2, 3, seed=3)
    np.testing.assert_allclose(tm(x).numpy(), np.maximum(x.numpy(), 0) * 2.0, rtol=1e-6)
    with pytest.raises(GraphError, match="has no parameter 'y'"):
        relu.set_arg("y", g.inputs[1])
    top = tm.graph
    mul = top.get_method_by_type("__mul__").as_list()[0]
    mul.set_args_kwargs(mul.args[0], 3.0)
    np.testing.assert_allclose(tm(x).numpy(), np.maximum(x.numpy(), 0) * 3.0, rtol=1e-6)
    with pytest.raises(GraphError, match="defined before this expr"):
        mul.set_args_kwargs(top.outputs[0], 1.0)
    with pytest.raises(GraphError, match="set_args_kwargs"):
        mul.set_args_kwargs(mul.args[0], 1.0, 2.0, 3.0)


def test_argspec_is_megengines_full_argspec(tm):
    assert tm.argspec == inspect.FullArgSpec(["self", "x", "k"], None, None, (1.0,), [], None, {})
    assert tm.block0.argspec.args == ["self", "x"]


def test_deepcopy_keeps_ids_and_names(tm):
    c = copy.deepcopy(tm)
    assert [e.id for e in c.graph.exprs()] == [e.id for e in tm.graph.exprs()]
    assert c.graph.outputs[0].name == "result"
    assert isinstance(c.graph.get_method_by_type("__call__", False).as_unique(), CallMethod)
    assert all(not isinstance(e, CallFunction) or e.top_graph is not None
               for e in c.graph.exprs())
