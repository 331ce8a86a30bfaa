"""mgtrace.models against independent torch.nn references.

What is proved:

* the state_dict of resnet18 / mobilenet_v2 has torchvision's keys, shapes,
  dtypes and order (the torch.nn references below copy torchvision's module
  names; torchvision itself does not import beside this torch);
* with the same weights (batch-norm running statistics randomised, so eval
  mode does real work) both libraries give the same logits on a fixed
  2x3x224x224 input, max abs error <= 1e-4;
* without torch: each model runs, honours num_classes and gives finite values;
  the docstring examples run.
"""
import doctest
import importlib

import numpy as np
import pytest

import mgtrace as mt
import mgtrace.models as models
from torch_reference import TORCH_MODELS   # torch.nn models with torchvision's names

ATOL = 1e-4
MODELS = {"resnet18": models.resnet18, "mobilenet_v2": models.mobilenet_v2}


def _randomised_torch(torch, name, seed=0):
    """A torch reference whose every float tensor is random, including the
    batch norms' affine parameters and running statistics (fresh ones are
    mean 0 / var 1 / weight 1 / bias 0, which would hide a wrong formula)."""
    torch.manual_seed(seed)
    net = TORCH_MODELS[name](torch.nn)
    with torch.no_grad():
        for mod in net.modules():
            if isinstance(mod, torch.nn.BatchNorm2d):
                c = mod.num_features
                mod.weight.uniform_(0.5, 1.5)
                mod.bias.uniform_(-0.2, 0.2)
                mod.running_mean.uniform_(-0.2, 0.2)
                mod.running_var.uniform_(0.5, 2.0)
                mod.num_batches_tracked.fill_(7)
                assert mod.weight.shape == (c,)
    return net.eval()


# ------------------------------------------------------------------------ tests

@pytest.mark.parametrize("name", sorted(MODELS))
def test_state_dict_matches_torchvision_layout(name):
    torch = pytest.importorskip("torch")
    ref = [(k, tuple(v.shape), str(v.dtype).replace("torch.", ""))
           for k, v in TORCH_MODELS[name](torch.nn).state_dict().items()]
    ours = [(k, tuple(v.shape), v.dtype.name) for k, v in MODELS[name]().state_dict().items()]
    assert ours == ref   # keys, shapes, dtypes and order


@pytest.mark.parametrize("name", sorted(MODELS))
def test_eval_output_matches_torch(name):
    torch = pytest.importorskip("torch")
    ref = _randomised_torch(torch, name)
    net = MODELS[name]()
    net.load_state_dict({k: v.numpy() for k, v in ref.state_dict().items()})
    net.eval()
    x = np.random.default_rng(42).standard_normal((2, 3, 224, 224), dtype=np.float32)
    with torch.no_grad():
        expected = ref(torch.from_numpy(x)).numpy()
    actual = net(mt.tensor(x)).numpy()
    assert actual.shape == expected.shape == (2, 1000)
    assert actual.dtype == np.float32
    err = float(np.abs(actual - expected).max())
    assert err <= ATOL, f"{name}: max abs error {err:.3g} > {ATOL} (logit scale " \
                        f"{float(np.abs(expected).max()):.3g})"


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("num_classes", [1000, 7])
def test_forward_small_input_without_torch(name, num_classes):
    net = MODELS[name](num_classes=num_classes).eval()
    x = np.random.default_rng(0).standard_normal((1, 3, 64, 64), dtype=np.float32)
    y = net(mt.tensor(x))
    assert y.shape == (1, num_classes)
    assert y.dtype.name == "float32"
    out = y.numpy()
    assert np.isfinite(out).all()
    assert np.abs(out).max() > 0   # not a dead network


def test_state_dict_round_trip_between_instances():
    a, b = models.resnet18(num_classes=5).eval(), models.resnet18(num_classes=5).eval()
    b.load_state_dict({k: v.numpy() for k, v in a.state_dict().items()})
    x = mt.tensor(np.random.default_rng(1).standard_normal((1, 3, 64, 64), dtype=np.float32))
    np.testing.assert_array_equal(a(x).numpy(), b(x).numpy())


def test_mobilenet_v2_structure():
    net = models.mobilenet_v2()
    dw = net.features[2].conv[1][0]    # first expanded block's depthwise conv
    assert (dw.in_channels, dw.out_channels, dw.groups) == (96, 96, 96)
    assert type(net.features[0][2]).__name__ == "ReLU6"
    assert net.classifier[0].p == 0.2
    assert len(net.features) == 19


@pytest.mark.parametrize("mod", ["mgtrace.models.resnet", "mgtrace.models.mobilenet"])
def test_docstring_examples(mod):
    result = doctest.testmod(importlib.import_module(mod),
                             optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0 and result.failed == 0
