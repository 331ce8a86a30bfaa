"""TracedModule.to_folder: a package of plain Module classes that gives the
traced module's outputs (torch.fx's GraphModule.to_folder)."""
import importlib
import sys

import numpy as np
import pytest

import mgtrace as mt
import mgtrace.functional as F
import mgtrace.module as M
from mgtrace.models import MiniLM, resnet18
from mgtrace.traced_module import GraphError, TracedModule


def _import(folder, name):
    sys.path.insert(0, str(folder.parent))
    try:
        importlib.invalidate_caches()
        return importlib.import_module(folder.name), name
    finally:
        sys.path.remove(str(folder.parent))


def _fresh(tmp_path, tag):
    return tmp_path / f"pkg_{tag}_{abs(hash(str(tmp_path))) % 10**8}"


def test_resnet18_package_gives_the_same_outputs(tmp_path):
    rng = np.random.default_rng(0)
    tm = mt.trace_module(resnet18().eval(), mt.tensor(rng.standard_normal(
        (1, 3, 32, 32)).astype(np.float32)))
    folder = _fresh(tmp_path, "r18")
    tm.to_folder(folder, "ResNet18")
    pkg, _ = _import(folder, "ResNet18")
    net = pkg.ResNet18()
    assert not isinstance(net, TracedModule) and isinstance(net, M.Module)
    assert list(net.state_dict()) == list(tm.state_dict())
    assert net.training is False
    x = mt.tensor(rng.standard_normal((3, 3, 32, 32)).astype(np.float32))
    np.testing.assert_array_equal(net(x).numpy(), tm(x).numpy())


def test_minilm_package_nested_lists_and_constants(tmp_path):
    net = MiniLM(vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                 intermediate_size=32, max_position_embeddings=20).eval()
    rng = np.random.default_rng(1)
    tm = mt.trace_module(net, mt.tensor(np.ones((1, 4), np.int32)),
                         mt.tensor(np.ones((1, 4), np.int32)))
    folder = _fresh(tmp_path, "minilm")
    tm.to_folder(folder)
    pkg, _ = _import(folder, "Net")
    ids = mt.tensor(rng.integers(0, 50, (2, 7)).astype(np.int32))
    mask = mt.tensor((rng.random((2, 7)) > 0.3).astype(np.int32))
    np.testing.assert_array_equal(pkg.Net()(ids, mask).numpy(), tm(ids, mask).numpy())


class _Twice(M.Module):
    def __init__(self):
        super().__init__()
        self.lin = M.Linear(3, 3)

    def forward(self, x):
        return F.relu(self.lin(x))


class _Outer(M.Module):
    def __init__(self):
        super().__init__()
        self.inner = _Twice()
        self.scale = mt.tensor(np.float32(2.0))

    def forward(self, x, y=None):
        if y is None:
            return self.inner(x) * self.scale
        return self.inner(x) + y


def test_constants_and_module_errors(tmp_path):
    tm = mt.trace_module(_Outer().eval(), mt.tensor(np.ones((2, 3), np.float32)))
    folder = _fresh(tmp_path, "outer")
    tm.to_folder(folder, "Outer")
    pkg, _ = _import(folder, "Outer")
    x = mt.tensor(np.arange(6, dtype=np.float32).reshape(2, 3))
    np.testing.assert_array_equal(pkg.Outer()(x).numpy(), tm(x).numpy())
    with pytest.raises(ValueError, match="module_name must be a Python identifier"):
        tm.to_folder(tmp_path / "bad", "not a name")


def test_a_module_with_two_graphs_is_refused(tmp_path):
    class Net(M.Module):
        def __init__(self):
            super().__init__()
            self.inner = _Twice()

        def forward(self, x):
            return self.inner(x) + self.inner(x[:1])[0]
    tm = mt.trace_module(Net().eval(), mt.tensor(np.ones((2, 3), np.float32)))
    assert len(tm.inner._graphs) == 1      # one signature: one graph, written
    tm.to_folder(_fresh(tmp_path, "ok"))
    tm2 = mt.trace_module(_Outer().eval(), mt.tensor(np.ones((2, 3), np.float32)))
    tm2._graphs.append(tm2._graphs[0])
    with pytest.raises(GraphError, match="has 2 graphs"):
        tm2.to_folder(tmp_path / "two")


@pytest.mark.parametrize("name", ["Runtime", "_Init__"])
def test_a_class_named_like_the_runtime_or_init_file_keeps_both(tmp_path, name):
    # class Runtime lowers to stem _runtime: it must not overwrite _runtime.py
    class Net(M.Module):
        def __init__(self):
            super().__init__()
            self.l = M.Linear(2, 2)

        def forward(self, x):
            return F.relu(self.l(x))

    net = Net().eval()
    x = mt.tensor(np.array([[1.0, -2.0]], np.float32))
    tm = mt.trace_module(net, x)
    folder = _fresh(tmp_path, name.lower())
    tm.to_folder(folder, name)
    pkg, _ = _import(folder, name)
    w, b = net.l.weight.numpy(), net.l.bias.numpy()
    want = np.maximum(np.array([[1.0, -2.0]], np.float32) @ w.T + b, 0)
    np.testing.assert_allclose(getattr(pkg, name)()(x).numpy(), want, rtol=1e-6)
