"""insert_exprs / insert_function: ordinary Python on graph nodes becomes
exprs at the requested position; every test checks the numbers against
eager mgtrace (or NumPy) and lints the graph after each edit."""
import numpy as np
import pytest

import mgtrace as mt
import mgtrace.functional as F
import mgtrace.module as M
from mgtrace.traced_module import (CallFunction, CallMethod, GraphError, TensorNode,
                                   ValueNode, wrap)
from mgtrace.traced_module.node import NodeValueError


class Net(M.Module):
    def __init__(self):
        super().__init__()
        self.conv = M.Conv2d(3, 4, 3, padding=1)
        self.bn = M.BatchNorm2d(4)
        self.relu = M.ReLU()
        self.fc = M.Linear(4 * 4 * 4, 5)

    def forward(self, x):
        y = self.relu(self.bn(self.conv(x)))
        return self.fc(F.flatten(y, 1))


def _randomize_bn(bn, rng):
    c = bn.weight.shape[0]
    bn.weight = M.Parameter(rng.uniform(0.5, 1.5, c).astype("float32"))
    bn.bias = M.Parameter(rng.normal(size=c).astype("float32"))
    bn.running_mean = mt.tensor(rng.normal(size=c).astype("float32"))
    bn.running_var = mt.tensor(rng.uniform(0.5, 2.0, c).astype("float32"))


@pytest.fixture
def net(rng):
    n = Net()
    _randomize_bn(n.bn, rng)
    return n.eval()


@pytest.fixture
def x(rng):
    return mt.tensor(rng.normal(size=(2, 3, 4, 4)).astype("float32"))


def _call(graph, module_name):
    """The call expr of the submodule attribute ``module_name``."""
    mnode = graph.get_node_by_name(f"*.{module_name}", recursive=False).as_unique()
    return [u for u in mnode.users if isinstance(u, CallMethod) and u.method == "__call__"][0]


def close(a, b, tol=1e-5):
    a = a.numpy() if isinstance(a, mt.Tensor) else np.asarray(a)
    b = b.numpy() if isinstance(b, mt.Tensor) else np.asarray(b)
    assert a.shape == b.shape, (a.shape, b.shape)
    np.testing.assert_allclose(a, b, rtol=tol, atol=tol)


def test_tensor_operators_and_methods_are_recorded(net, x):
    tm = mt.trace_module(net, x)
    g = tm.graph
    conv_call = _call(g, "conv")
    c = conv_call.outputs[0]
    other = _call(g, "bn")        # defined later: only c (and x) may be used here
    xin = g.inputs[1]
    with g.insert_exprs(conv_call):
        outs = {
            "add": c + 1,
            "radd": 2.5 + c,
            "rsub": 1 - c,
            "mul_node": c * c,
            "div": c / 4,
            "pow": c ** 2,
            "neg": -c,
            "abs": abs(c),
            "gt": c > 0,
            "getitem": c[0],
            "getitem_slice": c[:, 1:3, ::2],
            "reshape": c.reshape(2, -1),
            "mean": c.mean(axis=1),
            "sum_keep": c.sum(axis=(2, 3), keepdims=True),
            "transpose": c.transpose(0, 2, 3, 1),
            "flatten": c.flatten(1),
            "max": c.max(axis=-1),
            "astype": c.astype("float16"),
            "matmul": c @ c.transpose(0, 1, 3, 2),
            "with_input": c + xin.mean(axis=1, keepdims=True),
            "T": c[0, 0].T,
        }
    assert other.outputs[0].graph is g
    for n in outs.values():
        assert isinstance(n, TensorNode) and n.graph is g
    g.lint()
    g.reset_outputs(outs)
    g.compile()
    g.lint()
    got = tm(x)
    cv = net.conv(x).numpy()
    xv = x.numpy()
    want = {
        "add": cv + 1, "radd": 2.5 + cv, "rsub": 1 - cv, "mul_node": cv * cv, "div": cv / 4,
        "pow": cv ** 2, "neg": -cv, "abs": np.abs(cv), "gt": cv > 0, "getitem": cv[0],
        "getitem_slice": cv[:, 1:3, ::2], "reshape": cv.reshape(2, -1), "mean": cv.mean(axis=1),
        "sum_keep": cv.sum(axis=(2, 3), keepdims=True), "transpose": cv.transpose(0, 2, 3, 1),
        "flatten": cv.reshape(2, -1), "max": cv.max(axis=-1), "astype": cv.astype("float16"),
        "matmul": cv @ cv.transpose(0, 1, 3, 2),
        "with_input": cv + xv.mean(axis=1, keepdims=True), "T": cv[0, 0].T,
    }
    assert list(got) == list(want)
    for k in want:
        close(got[k], want[k], 1e-3 if k == "astype" else 1e-5)
        assert got[k].dtype == want[k].dtype, k
    # the generated code spells them as Python
    code = tm.code
    assert "conv_out + 1" in code and "2.5 + conv_out" in code and ".mean(axis=1)" in code


def test_inserted_exprs_land_after_the_given_expr_in_order(net, x):
    tm = mt.trace_module(net, x)
    g = tm.graph
    conv_call = _call(g, "conv")
    c = conv_call.outputs[0]
    before = list(g._exprs)
    with g.insert_exprs(conv_call):
        a = c * 2
        b = F.relu(a)
        d = b + c
    g.lint()
    i = before.index(conv_call)
    assert g._exprs[:i + 1] == before[:i + 1]
    assert g._exprs[i + 1:i + 4] == [a.expr, b.expr, d.expr]
    assert g._exprs[i + 4:] == before[i + 1:]
    assert isinstance(b.expr, CallFunction) and b.expr.func is F.relu
    g.replace_node({c: d})
    g.lint()
    cv = net.conv(x)
    want = net.fc(F.flatten(net.relu(net.bn(F.relu(cv * 2) + cv)), 1))
    close(tm(x), want)


def test_insert_at_end_and_before(net, x):
    tm = mt.trace_module(net, x)
    g = tm.graph
    out = g.outputs[0]
    with g.insert_exprs():                  # default: after the last expr
        y = out * 3
    assert g._exprs[-1] is y.expr
    g.replace_node({out: y})
    g.lint()
    close(tm(x), net(x) * 3)

    xin = g.inputs[1]
    first = next(e for e in g._exprs if not e.kind == "input")
    with g.insert_exprs_before(first):
        x2 = xin - 1
    assert g._exprs[g._exprs.index(first) - 1] is x2.expr
    g.replace_node({xin: x2})
    g.lint()
    close(tm(x), net(x - 1) * 3)
    with pytest.raises(GraphError, match="graph input"):
        g.insert_exprs_before(g.inputs[1].expr)


def test_functional_calls_with_node_lists_and_kwargs(net, x):
    tm = mt.trace_module(net, x)
    g = tm.graph
    conv_call = _call(g, "conv")
    c = conv_call.outputs[0]
    with g.insert_exprs(conv_call):
        cat = F.concat([c, F.sigmoid(c)], axis=1)
        parts = F.split(cat, 2, axis=1)
        s = F.clip(parts[1], lower=0.25, upper=0.75)
    assert isinstance(parts, (list, tuple)) and len(parts) == 2
    g.reset_outputs((cat, s))
    g.compile()
    g.lint()
    cat_v, s_v = tm(x)
    cv = net.conv(x).numpy()
    sig = 1 / (1 + np.exp(-cv))
    close(cat_v, np.concatenate([cv, sig], axis=1))
    close(s_v, np.clip(sig, 0.25, 0.75))


def test_call_existing_and_new_submodules(net, x):
    tm = mt.trace_module(net, x)
    g = tm.graph
    conv_call = _call(g, "conv")
    c = conv_call.outputs[0]
    tm.act = M.Sigmoid()            # a module set on the TracedModule after tracing
    with g.insert_exprs(conv_call):
        a = tm.act(c)
        b = tm.relu(a - 0.5)        # an existing submodule, called once more
    g.lint()
    calls = [e for e in g._exprs if isinstance(e, CallMethod) and e.method == "__call__"]
    assert any(e.args[0].owner is tm.act for e in calls)
    assert a.expr.args[0].expr.name == "act"  # reached by GetAttr(self, 'act')
    g.replace_node({c: b})
    g.compile()
    g.lint()
    assert "self.act" in tm.code
    want = net.fc(F.flatten(net.relu(net.bn(F.relu(F.sigmoid(net.conv(x)) - 0.5))), 1))
    close(tm(x), want)
    # the module is part of the state and the tree
    assert dict(tm.named_modules())["act"] is tm.act


def test_module_that_is_not_a_submodule_is_refused(net, x):
    tm = mt.trace_module(net, x)
    g = tm.graph
    c = _call(g, "conv").outputs[0]
    stray = M.ReLU()
    with pytest.raises(GraphError, match="not one of its submodules"):
        with g.insert_exprs(c.expr):
            stray(c)
    g.lint()


def test_failed_block_leaves_graph_unchanged(net, x):
    tm = mt.trace_module(net, x)
    g = tm.graph
    c = _call(g, "conv").outputs[0]
    code, exprs, users = tm.code, list(g._exprs), list(c.users)
    with pytest.raises(ZeroDivisionError):
        with g.insert_exprs(c.expr):
            F.relu(c) + c
            1 / 0
    assert g._exprs == exprs and c.users == users and tm.code == code
    g.lint()
    close(tm(x), net(x))


def test_nodes_must_be_defined_before_the_insertion_point(net, x):
    tm = mt.trace_module(net, x)
    g = tm.graph
    conv_call, bn_call = _call(g, "conv"), _call(g, "bn")
    with pytest.raises(GraphError, match="defined after the insertion point"):
        with g.insert_exprs(conv_call):
            bn_call.outputs[0] + 1
    g.lint()
    tm2 = mt.trace_module(Net(), x)
    with pytest.raises(GraphError, match="belongs to"):
        with g.insert_exprs(conv_call):
            F.relu(tm2.graph.inputs[1])
    with pytest.raises(GraphError, match="not in graph"):
        with g.insert_exprs(tm2.graph._exprs[-1]):
            pass
    g.lint()
    close(tm(x), net(x))


def test_node_values_outside_insert_exprs_raise_a_clear_error(net, x):
    tm = mt.trace_module(net, x)
    c = _call(tm.graph, "conv").outputs[0]
    for op in (lambda: c + 1, lambda: 1 - c, lambda: c * c, lambda: c[0], lambda: -c,
               lambda: c.reshape(2, -1), lambda: c.mean(axis=1), lambda: c < 1):
        with pytest.raises(NodeValueError, match="insert_exprs"):
            op()
    assert issubclass(NodeValueError, TypeError)
    with pytest.raises(NodeValueError):
        c[0] = 1
    with pytest.raises(AttributeError, match="numpy"):
        c.numpy()
    # identity semantics stay: nodes are dict keys and compare by identity
    assert c == c and c != tm.graph.inputs[1]
    assert {c: 1}[c] == 1
    with pytest.raises(NodeValueError, match="insert_exprs"):
        c.sum()


def test_insert_function(net, x):
    tm = mt.trace_module(net, x)
    g = tm.graph
    conv_call = _call(g, "conv")
    c = conv_call.outputs[0]
    r = g.insert_function(F.relu6, c)            # one CallFunction right after the conv call
    assert isinstance(r, TensorNode)
    assert g._exprs[g._exprs.index(conv_call) + 1] is r.expr
    assert r.expr.func is F.relu6
    g.lint()
    n_before = len(g._exprs)
    y = g.insert_function(lambda t: F.sigmoid(t) * 2, r)   # body traced: two exprs
    assert len(g._exprs) == n_before + 2
    g.lint()

    @wrap
    def shift(t, k):
        return t - k
    z = g.insert_function(shift, y, k=0.5)                 # a wrapped function: one expr
    assert isinstance(z.expr, CallFunction) and z.expr.kwargs == {"k": 0.5}
    g.replace_node({c: z})
    g.compile()
    g.lint()
    cv = net.conv(x)
    want = net.fc(F.flatten(net.relu(net.bn(F.sigmoid(F.relu6(cv)) * 2 - 0.5)), 1))
    close(tm(x), want)
    # no node arguments: inserted after the inputs
    k = g.insert_function(F.ones, (2, 5))
    assert g._exprs[g._n_leading_inputs()] is k.expr
    g.reset_outputs((g.outputs[0], k))
    g.lint()
    out, ones = tm(x)
    close(ones, np.ones((2, 5), "float32"))
    with pytest.raises(GraphError, match="not in graph"):
        g.insert_function(F.relu, mt.trace_module(Net(), x).graph.inputs[1])


def test_value_node_arithmetic_stays_symbolic(rng):
    class Flat(M.Module):
        def __init__(self):
            super().__init__()
            self.fc = M.Linear(12, 2)

        def forward(self, x):
            return self.fc(x.reshape(x.shape[0], -1))

    net = Flat().eval()
    x1 = mt.tensor(rng.normal(size=(1, 3, 4)).astype("float32"))
    tm = mt.trace_module(net, x1)
    g = tm.graph
    n0 = g.nodes(False).type(ValueNode).as_list()[0]      # x.shape[0]
    out = g.outputs[0]
    with g.insert_exprs():
        twice = n0 * 2
        back = twice // 2 + 0
        y = out.reshape(back, 1, -1) + n0 - 1
    assert isinstance(twice, ValueNode) and isinstance(back, ValueNode)
    g.reset_outputs(y)
    g.lint()
    for b in (1, 4):
        xb = mt.tensor(rng.normal(size=(b, 3, 4)).astype("float32"))
        want = net(xb).numpy().reshape(b, 1, -1) + b - 1
        close(tm(xb), want)


def test_calling_a_traced_submodule_records_its_graph(rng):
    class Block(M.Module):
        def __init__(self):
            super().__init__()
            self.fc = M.Linear(4, 4)

        def forward(self, x):
            return F.relu(self.fc(x))

    class Top(M.Module):
        def __init__(self):
            super().__init__()
            self.block = Block()

        def forward(self, x):
            return self.block(x) * 2

    net = Top().eval()
    x = mt.tensor(rng.normal(size=(3, 4)).astype("float32"))
    tm = mt.trace_module(net, x)
    g = tm.graph
    out = g.outputs[0]
    with g.insert_exprs():
        again = tm.block(out)             # the traced Block once more, on the result
    e = again.expr
    assert e.arg_def == tm.block.graph.in_def
    # recursive traversal sees the callee's graph once
    assert g.exprs(True).as_count() == g.exprs(False).as_count() + len(tm.block.graph._exprs)
    g.replace_node({out: again})
    g.lint()
    close(tm(x), net.block(net(x)))
    flat = tm.flatten()
    flat.graph.lint()
    close(flat(x), net.block(net(x)))
    with pytest.raises(GraphError, match="traced for arguments"):
        with g.insert_exprs():
            tm.block([out])              # traced with a tensor, not a list
    with pytest.raises(GraphError, match="own module"):
        with tm.block.graph.insert_exprs():
            tm.block(tm.block.graph.inputs[1])
    g.lint()


def test_module_nodes_are_callable_inside_insert_exprs(net, x):
    tm = mt.trace_module(net, x)
    g = tm.graph
    conv_call = _call(g, "conv")
    conv_node, c = conv_call.args[0], conv_call.outputs[0]
    relu_node = g.get_node_by_name("*.relu", recursive=False).as_unique()
    with pytest.raises(NodeValueError, match="insert_exprs"):
        relu_node(c)
    with g.insert_exprs(conv_call):
        twice = conv_node(x_node := g.inputs[1]) + c     # the conv module once more
    assert isinstance(twice, TensorNode)
    g.replace_node({c: twice})
    g.compile()
    g.lint()
    cv = net.conv(x)
    close(tm(x), net.fc(F.flatten(net.relu(net.bn(cv + cv)), 1)))
    assert x_node is g.inputs[1]


def test_insert_blocks_do_not_nest(net, x):
    tm = mt.trace_module(net, x)
    g = tm.graph
    with pytest.raises(GraphError, match="another insert_exprs block"):
        with g.insert_exprs():
            with g.insert_exprs():
                pass
    g.lint()
    close(tm(x), net(x))


def test_automatic_position_follows_the_nodes_read(net, x):
    """MegEngine's recipe: insert_exprs() without an expr, then replace_node."""
    tm = mt.trace_module(net, x)
    g = tm.graph
    conv_call = _call(g, "conv")
    c = conv_call.outputs[0]
    with g.insert_exprs():
        k = F.ones((1, 4, 1, 1))             # reads no node
        r = F.relu(c) * k
    i = g._exprs.index(conv_call)           # the block stays together, in order
    assert g._exprs[i + 1:i + 4] == [k.expr, r.expr.args[0].expr, r.expr]
    with g.insert_exprs():
        k2 = F.zeros((2,))                   # a block that reads nothing: after the inputs
    assert g._exprs[g._n_leading_inputs()] is k2.expr
    g.replace_node({c: r})
    g.compile()
    g.lint()
    close(tm(x), net.fc(F.flatten(net.relu(net.bn(F.relu(net.conv(x)))), 1)))
