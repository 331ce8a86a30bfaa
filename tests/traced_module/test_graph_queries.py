"""Queries on traced graphs: the filters and their read-outs, names with
wildcards and qualnames, ids, and recursive traversal; counts are checked
against the ResNet-18 architecture (what torchvision's model contains)."""
import numpy as np
import pytest

import mgtrace as mt
import mgtrace.functional as F
import mgtrace.module as M
from mgtrace.models import resnet18
from mgtrace.traced_module import (CallFunction, CallMethod, ExprFilter, GetAttr, Input,
                                   ModuleNode, NodeFilter, TensorNode)


@pytest.fixture(scope="module")
def tm():
    net = resnet18(num_classes=10).eval()
    x = mt.tensor(np.random.default_rng(3).normal(size=(1, 3, 32, 32)).astype("float32"))
    return mt.trace_module(net, x)


def test_get_module_by_type_and_qualnames(tm):
    convs = tm.graph.get_module_by_type(M.Conv2d)
    assert isinstance(convs, NodeFilter)
    names = [n.qualname for n in convs]
    assert len(names) == 20 and len(set(names)) == 20
    assert names[:3] == ["ResNet.conv1", "ResNet.layer1.0.conv1", "ResNet.layer1.0.conv2"]
    assert "ResNet.layer2.0.downsample.0" in names
    assert all(isinstance(n, ModuleNode) and isinstance(n.owner, M.Conv2d) for n in convs)
    # the module objects are the TracedModule's own
    assert convs.as_list()[1].owner is getattr(tm.layer1, "0").conv1
    assert tm.graph.get_module_by_type(M.Conv2d, recursive=False).as_count() == 1
    assert tm.graph.get_module_by_type(M.BatchNorm2d).as_count() == 20
    assert tm.graph.get_module_by_type(M.Linear).as_unique().qualname == "ResNet.fc"


def test_get_node_by_name_wildcards_and_qualnames(tm):
    g = tm.graph
    hit = g.get_node_by_name("ResNet.layer1.0.conv1").as_unique()
    assert isinstance(hit, ModuleNode) and hit.owner is getattr(tm.layer1, "0").conv1
    # case is ignored by default
    assert g.get_node_by_name("resnet.LAYER1.0.CONV1").as_unique() is hit
    assert g.get_node_by_name("resnet.LAYER1.0.CONV1", ignorecase=False).as_count() == 0
    conv1s = g.get_node_by_name("*conv1").as_list()
    # the stem conv1 and each block's conv1 (module nodes only: outputs end in .[out])
    assert [n.qualname for n in conv1s] == ["ResNet.conv1"] + [
        f"ResNet.layer{i}.{j}.conv1" for i in range(1, 5) for j in range(2)]
    outs = g.get_node_by_name("*conv1*[[]out]").as_list()
    assert len(outs) == 9 and all(isinstance(n, TensorNode) for n in outs)
    assert outs[1].qualname == "ResNet.layer1.0.conv1.[out]"
    assert outs[1].expr.args[0] is conv1s[1]
    # brackets also match literally: no escaping needed for call results
    assert g.get_node_by_name("*conv1.[out]").as_list() == outs
    assert g.get_node_by_name("ResNet.layer1.0.conv1.[out]").as_unique() is outs[1]
    # plain names match too, and ? / [...] work
    assert g.get_node_by_name("conv?_out", recursive=False).as_count() == 1
    assert g.get_node_by_name("layer[12]", recursive=False).as_count() == 2
    # every node of a parameter GetAttr in a flattened graph has its dotted qualname
    flat = tm.flatten()
    fl = flat.graph.get_node_by_name("ResNet.layer4.1.bn2").as_unique()
    assert fl.owner is getattr(flat.layer4, "1").bn2
    assert flat.graph.get_node_by_name("*layer4.1.bn2.[[]out]").as_count() == 1


def test_function_and_method_filters(tm):
    g = tm.graph
    fl = g.get_function_by_type(F.flatten)
    assert isinstance(fl, ExprFilter)
    e = fl.as_unique()
    assert isinstance(e, CallFunction) and e.func is F.flatten and e.top_graph is g
    assert g.get_function_by_type().as_count() == 1
    calls = g.get_method_by_type("__call__")
    # top: conv1 bn1 relu maxpool layer1-4 avgpool fc (10); each layer: its
    # two blocks; each block: conv1 bn1 relu conv2 bn2 relu (6), plus the
    # downsample call in 3 blocks; each downsample: its conv and bn
    want = 10 + 4 * 2 + 8 * 6 + 3 + 3 * 2
    assert calls.as_count() == want
    adds = g.get_method_by_type("__add__")
    assert adds.as_count() == 8                    # one residual add per block
    assert g.get_method_by_type("__add__", recursive=False).as_count() == 0
    assert all(isinstance(x, CallMethod) for x in g.get_method_by_type())
    # filters chain
    relu_calls = g.exprs().call_method("__call__").filter(
        lambda x: isinstance(x.args[0].owner, M.ReLU))
    assert relu_calls.as_count() == 17


def test_read_outs(tm):
    g = tm.graph
    convs = g.get_module_by_type(M.Conv2d)
    d = convs.as_dict()
    assert list(d) == [n.id for n in convs] and all(d[n.id] is n for n in convs)
    assert convs.as_count() == len(convs.as_list()) == len(list(convs))
    with pytest.raises(ValueError, match="exactly one.*found 20"):
        convs.as_unique()
    with pytest.raises(ValueError, match="found 0"):
        g.get_node_by_name("nothing*").as_unique()


def test_ids(tm):
    g = tm.graph
    e = g.get_function_by_type(F.flatten).as_unique()
    assert g.get_expr_by_id(e.id).as_unique() is e
    n = g.get_node_by_name("ResNet.layer3.1.bn1").as_unique()
    assert g.get_node_by_id(n.id).as_unique() is n
    two = g.get_node_by_id([n.id, e.outputs[0].id]).as_list()
    assert set(map(id, two)) == {id(n), id(e.outputs[0])}
    assert g.get_node_by_id(n.id, recursive=False).as_count() == 0
    assert g.get_expr_by_id(-1).as_count() == 0


def test_exprs_and_nodes_recursive(tm):
    g = tm.graph
    top = g.exprs(recursive=False).as_list()
    assert top == g._exprs
    everything = g.exprs().as_list()
    graphs = {id(e.top_graph) for e in everything}
    # the top graph, layer1-4, 8 blocks, 3 downsample sequences
    assert len(graphs) == 1 + 4 + 8 + 3
    # each callee's exprs follow its call expr
    call = next(e for e in everything if isinstance(e, CallMethod) and e.args[0].name == "layer1")
    i = everything.index(call)
    assert everything[i + 1].top_graph is tm.layer1.graph and call.graph is tm.layer1.graph
    assert isinstance(everything[i + 1], Input)
    nodes = g.nodes().as_list()
    assert len({id(n) for n in nodes}) == len(nodes)
    assert {id(n) for e in everything for n in e.outputs} == {id(n) for n in nodes}
    assert g.nodes(recursive=False).as_count() == sum(len(e.outputs) for e in top)
    # GetAttr of a parameter has a dotted qualname
    flat = tm.flatten()
    w = [e for e in flat.graph._exprs if isinstance(e, GetAttr) and e.name == "fc"]
    assert w and w[0].outputs[0].qualname == "ResNet.fc"
    assert flat.graph.exprs().as_count() == len(flat.graph._exprs)


def test_qualnames_of_inputs_self_and_values(rng):
    class Net(M.Module):
        def __init__(self):
            super().__init__()
            self.scale = M.Parameter(np.ones(3, np.float32))

        def forward(self, x):
            return F.relu(x) * self.scale

    x = mt.tensor(rng.normal(size=(2, 3)).astype("float32"))
    tm = mt.trace_module(Net(), x)
    g = tm.graph
    assert g.inputs[0].qualname == "Net"
    assert g.inputs[1].qualname == "Net.[x]"
    scale = g.get_node_by_name("Net.scale").as_unique()
    assert isinstance(scale.expr, GetAttr)
    assert g.get_function_by_type(F.relu).as_unique().outputs[0].qualname == "Net.[relu]"
    np.testing.assert_allclose(tm(x).numpy(), np.maximum(x.numpy(), 0), rtol=1e-6)
