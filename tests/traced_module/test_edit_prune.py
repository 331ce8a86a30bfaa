"""delete_unused_submodules: after a cut or a replacement, the modules no
graph reads go, with their weights; what is still used stays and runs."""
import numpy as np

import mgtrace as mt
from mgtrace.models import resnet18


def _setup():
    net = resnet18(num_classes=10).eval()
    x = mt.tensor(np.random.default_rng(3).random((1, 3, 32, 32), np.float32))
    return net, x


def test_cut_then_prune_keeps_only_what_runs():
    net, x = _setup()
    tm = mt.trace_module(net, x)
    g = tm.graph
    g.reset_outputs(g.get_node_by_name("*layer2.[out]", recursive=False).as_unique())
    g.compile()
    assert tm.delete_unused_submodules() == ["layer3", "layer4", "avgpool", "fc"]
    assert not any(k.startswith(("layer3", "layer4", "fc")) for k in tm.state_dict())
    want = net.layer2(net.layer1(net.maxpool(net.relu(net.bn1(net.conv1(x))))))
    np.testing.assert_array_equal(tm(x).numpy(), want.numpy())
    assert mt.trace_module(net, x).delete_unused_submodules() == []       # nothing unused


def test_prune_a_flat_graph_by_attribute_paths():
    net, x = _setup()
    flat = mt.trace_module(net, x).flatten()
    g = flat.graph
    g.reset_outputs(g.get_node_by_name("*layer3.0.conv1.[out]").as_unique())
    g.compile()
    gone = flat.delete_unused_submodules()
    assert "layer3.0.bn1" in gone and "layer3.1" in gone and "layer3.0.conv1" not in gone
    h = net.layer2(net.layer1(net.maxpool(net.relu(net.bn1(net.conv1(x))))))
    np.testing.assert_array_equal(flat(x).numpy(), getattr(net.layer3, "0").conv1(h).numpy())
