"""Graph surgery recipes as MegEngine users write them, on ResNet-18 (small
input) and a hand-written net: each edited TracedModule is compared with an
eager mgtrace model built independently (a deep copy with the same change
made to its modules), and every edit is followed by lint()."""
import copy

import numpy as np
import pytest

import mgtrace as mt
import mgtrace.functional as F
import mgtrace.module as M
from mgtrace.models import resnet18
from mgtrace.traced_module import CallMethod, GraphError, TracedModule


def close(a, b, tol=1e-5):
    a = a.numpy() if isinstance(a, mt.Tensor) else np.asarray(a)
    b = b.numpy() if isinstance(b, mt.Tensor) else np.asarray(b)
    assert a.shape == b.shape, (a.shape, b.shape)
    np.testing.assert_allclose(a, b, rtol=tol, atol=tol)


def _randomize_bns(net, rng):
    for m in net.modules():
        if isinstance(m, M.BatchNorm2d):
            c = m.num_features
            m.weight = M.Parameter(rng.uniform(0.5, 1.5, c).astype("float32"))
            m.bias = M.Parameter(rng.normal(0, 0.1, c).astype("float32"))
            m.running_mean = mt.tensor(rng.normal(0, 0.1, c).astype("float32"))
            m.running_var = mt.tensor(rng.uniform(0.5, 2.0, c).astype("float32"))


@pytest.fixture(scope="module")
def resnet():
    rng = np.random.default_rng(7)
    net = resnet18(num_classes=10)
    _randomize_bns(net, rng)
    return net.eval()


@pytest.fixture(scope="module")
def img():
    return mt.tensor(np.random.default_rng(8).normal(size=(2, 3, 32, 32)).astype("float32"))


def _set_path(root, path, module):
    *head, last = path.split(".")
    parent = root
    for p in head:
        parent = getattr(parent, p)
    setattr(parent, last, module)


def _module_calls(graph, cls):
    """Module-call exprs (in any graph under ``graph``) whose module is a ``cls``."""
    return [e for e in graph.get_method_by_type("__call__")
            if isinstance(e.args[0].owner, cls)]


class Scale(M.Module):
    def __init__(self, k):
        super().__init__()
        self.k = k

    def forward(self, x):
        return x * self.k


# ----------------------------------------------------------------- recipes
def test_insert_relu_after_every_conv(resnet, img):
    tm = mt.trace_module(resnet, img)
    before = tm(img).numpy()
    convs = tm.graph.get_module_by_type(M.Conv2d).as_list()
    assert len(convs) == 20             # stem, 16 in the blocks, 3 downsample
    n_calls = 0
    for mnode in convs:
        g = mnode.graph
        for call in [u for u in mnode.users if isinstance(u, CallMethod) and u.method == "__call__"]:
            out = call.outputs[0]
            with g.insert_exprs(call):
                act = F.relu(out)
            g.replace_node({out: act})
            g.compile()
            g.lint()
            n_calls += 1
    assert n_calls == 20
    tm.graph.lint()
    assert tm.graph.get_function_by_type(F.relu).as_count() == 20

    ref = copy.deepcopy(resnet)
    for path, m in list(ref.named_modules()):
        if isinstance(m, M.Conv2d):
            _set_path(ref, path, M.Sequential(m, M.ReLU()))
    want = ref(img)
    close(tm(img), want, 1e-4)
    assert np.abs(before - want.numpy()).max() > 1e-3        # the edit changed the result
    block = getattr(tm.layer1, "0")
    assert "F.relu(conv1_out)" in block.code
    flat = tm.flatten()
    close(flat(img), want, 1e-4)


@pytest.mark.parametrize("fn, module", [(F.gelu, M.GELU), (F.relu6, M.ReLU6)])
def test_replace_every_relu_module_call_with_a_function(resnet, img, fn, module):
    tm = mt.trace_module(resnet, img)
    calls = _module_calls(tm.graph, M.ReLU)
    assert len(calls) == 1 + 8 * 2       # the stem, and each block calls its relu twice
    for call in calls:
        g = call.top_graph
        out = call.outputs[0]
        new = g.insert_function(fn, call.args[1])
        g.replace_node({out: new})
        g.compile()
        g.lint()
    assert not _module_calls(tm.graph, M.ReLU)
    assert tm.graph.get_function_by_type(fn).as_count() == 17
    # the relu module nodes went with their calls
    assert tm.graph.get_module_by_type(M.ReLU).as_count() == 0
    ref = copy.deepcopy(resnet)
    for path, m in list(ref.named_modules()):
        if isinstance(m, M.ReLU):
            _set_path(ref, path, module())
    close(tm(img), ref(img), 1e-4)


def test_fuse_conv_and_batchnorm(resnet, img):
    tm = mt.trace_module(resnet, img)
    want = resnet(img)
    fused = 0
    for bn_call in _module_calls(tm.graph, M.BatchNorm2d):
        g = bn_call.top_graph
        conv_out = bn_call.args[1]
        conv_call = conv_out.expr
        if not (isinstance(conv_call, CallMethod) and isinstance(conv_call.args[0].owner, M.Conv2d)
                and conv_out.users == [bn_call]):
            continue
        conv, bn = conv_call.args[0].owner, bn_call.args[0].owner
        w = conv.weight.numpy().astype(np.float64)
        b = np.zeros(w.shape[0]) if conv.bias is None else conv.bias.numpy().astype(np.float64)
        std = np.sqrt(bn.running_var.numpy().astype(np.float64) + bn.eps)
        k = bn.weight.numpy() / std
        new = M.Conv2d(conv.in_channels, conv.out_channels, conv.kernel_size, conv.stride,
                       conv.padding, conv.dilation, conv.groups, bias=True)
        new.weight = M.Parameter((w * k[:, None, None, None]).astype("float32"))
        new.bias = M.Parameter(((b - bn.running_mean.numpy()) * k + bn.bias.numpy()).astype("float32"))
        owner = g.owner
        name = f"{conv_call.args[0].expr.name.replace('.', '_')}_fused"
        setattr(owner, name, new)
        with g.insert_exprs(bn_call):
            y = getattr(owner, name)(conv_call.args[1])
        g.replace_node({bn_call.outputs[0]: y})
        g.compile()
        g.lint()
        fused += 1
    assert fused == 20
    tm.graph.lint()
    assert tm.graph.get_module_by_type(M.BatchNorm2d).as_count() == 0
    assert "conv1_fused" in getattr(tm.layer1, "0").code
    close(tm(img), want, 1e-4)
    # batch size other than the traced one
    img4 = mt.tensor(np.random.default_rng(9).normal(size=(4, 3, 32, 32)).astype("float32"))
    close(tm(img4), resnet(img4), 1e-4)
    # the new modules are part of the tree: flatten reaches them by path
    flat = tm.flatten()
    assert flat.graph.get_module_by_type(M.Conv2d).as_count() == 20
    assert flat.graph.get_node_by_name("ResNet.layer1.0.conv1_fused").as_count() == 1
    close(flat(img), want, 1e-4)
    assert "layer1.0.conv1_fused.weight" in tm.state_dict()


def test_cut_the_graph_at_a_node(resnet, img):
    tm = mt.trace_module(resnet, img)
    g = tm.graph
    layer2_out = g.get_node_by_name("ResNet.layer2.[[]out]", recursive=False).as_unique()
    g.reset_outputs(layer2_out)
    g.compile()
    g.lint()
    assert "layer3" not in tm.code and "fc" not in tm.code
    r = resnet
    want = r.layer2(r.layer1(r.maxpool(r.relu(r.bn1(r.conv1(img))))))
    close(tm(img), want, 1e-5)

    # inside a block: cut the flattened graph after layer3.0's first conv
    flat = mt.trace_module(resnet, img).flatten()
    fg = flat.graph
    node = fg.get_node_by_name("ResNet.layer3.0.conv1.[[]out]").as_unique()
    fg.reset_outputs(node)
    fg.compile()
    fg.lint()
    h = r.layer2(r.layer1(r.maxpool(r.relu(r.bn1(r.conv1(img))))))
    close(flat(img), getattr(r.layer3, "0").conv1(h), 1e-5)


def test_add_an_input_and_use_it(resnet, img, rng):
    tm = mt.trace_module(resnet, img)
    g = tm.graph
    offset = g.add_input_node((2, 10), name="offset")
    out = g.outputs[0]
    with g.insert_exprs():
        shifted = out + offset * 2
    g.replace_node({out: shifted})
    g.lint()
    ov = mt.tensor(rng.normal(size=(2, 10)).astype("float32"))
    close(tm(img, ov), resnet(img) + ov * 2, 1e-5)
    assert "def forward(self, x, offset)" in tm.code


def test_replace_module_call_with_function_small_net(rng):
    class Small(M.Module):
        def __init__(self):
            super().__init__()
            self.fc = M.Linear(5, 5)
            self.act = M.ReLU()

        def forward(self, x):
            return self.act(self.fc(x)) - self.act(x)

    net = Small().eval()
    x = mt.tensor(rng.normal(size=(3, 5)).astype("float32") * 4)
    tm = mt.trace_module(net, x)
    g = tm.graph
    for call in g.get_method_by_type("__call__").as_list():
        if isinstance(call.args[0].owner, M.ReLU):
            with g.insert_exprs(call):
                r6 = F.relu6(call.args[1])
            g.replace_node({call.outputs[0]: r6})
    g.compile()
    g.lint()
    assert "relu6" in tm.code and "act" not in tm.code
    close(tm(x), F.relu6(net.fc(x)) - F.relu6(x))


# ------------------------------------------------------------ nested edits
def test_edit_a_block_graph_reached_by_attribute(resnet, img):
    tm = mt.trace_module(resnet, img)
    block = getattr(tm.layer1, "0")
    assert isinstance(block, TracedModule) and block.graph is not tm.graph
    g = block.graph
    bn2_call = [e for e in _module_calls(g, M.BatchNorm2d) if e.args[0].expr.name == "bn2"][0]
    out = bn2_call.outputs[0]
    v0 = g._version
    with g.insert_exprs(bn2_call):
        half = out * 0.5
    g.replace_node({out: half})
    g.lint()
    tm.graph.lint()
    assert g._version > v0 and "bn2_out * 0.5" in block.code
    ref = copy.deepcopy(resnet)
    b = getattr(ref.layer1, "0")
    b.bn2 = M.Sequential(b.bn2, Scale(0.5))
    want = ref(img)
    close(tm(img), want, 1e-4)
    close(tm.flatten()(img), want, 1e-4)
    # only layer1.0 changed: layer1.1's graph is its own
    assert "0.5" not in getattr(tm.layer1, "1").code


def test_edit_a_nested_graph_found_by_traversal(resnet, img):
    tm = mt.trace_module(resnet, img)
    node = tm.graph.get_node_by_name("ResNet.layer2.1.conv2.[[]out]").as_unique()
    g = node.graph
    assert g.qualname == "ResNet.layer2.1"
    with g.insert_exprs(node.expr):
        y = F.tanh(node)
    g.replace_node({node: y})
    g.compile()
    g.lint()
    ref = copy.deepcopy(resnet)
    b = getattr(ref.layer2, "1")
    b.conv2 = M.Sequential(b.conv2, M.Tanh())
    close(tm(img), ref(img), 1e-4)
    # x feeds conv1 and the residual add: replace_node rewires only the users
    # after the new value (the add), conv1 keeps reading x (MegEngine's rule)
    add = g.get_method_by_type("__add__", recursive=False).as_unique()
    ident = add.args[1]
    assert ident is g.inputs[1]
    conv1_call = next(u for u in ident.users if u is not add)
    with g.insert_exprs_before(add):
        ident2 = ident * 0
    g.replace_node({ident: ident2})
    g.lint()
    assert add.args[1] is ident2 and conv1_call.args[1] is ident
    b.forward = lambda x, b=b: b.relu(b.bn2(b.conv2(b.relu(b.bn1(b.conv1(x))))))
    close(tm(img), ref(img), 1e-4)


def test_top_only_edits_on_a_block_raise(resnet, img):
    tm = mt.trace_module(resnet, img)
    g = getattr(tm.layer1, "0").graph
    with pytest.raises(GraphError, match="top graph.*ResNet.layer1.0"):
        g.reset_outputs(g.inputs[1])
    with pytest.raises(GraphError, match="top graph"):
        g.add_input_node((1,))
    with pytest.raises(GraphError, match="top graph"):
        g.add_output_node(g.inputs[1])
    with pytest.raises(GraphError, match="top graph"):
        g.reset_inputs(img)
    g.lint()
    close(tm(img), resnet(img), 1e-5)
