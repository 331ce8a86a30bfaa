"""ResNet-18 and MobileNetV2 parameter gradients against PyTorch's (same
weights, same input, training mode: batch statistics). Skips without torch.

In float64 on both sides the gradients agree to 1e-9 of each parameter's
scale (its largest magnitude, floored at 1e-6 of the model's largest: a
BatchNorm bias followed by another batch-statistics BatchNorm has a
gradient that is 0 up to rounding). float32 is not compared: through
training-mode BatchNorms float32 rounding alone moves the first layers'
gradients by 1e-4 to 2e-3 of their scale (PyTorch float32 against PyTorch
float64 on MobileNetV2: 1.6e-3), so such a test would measure rounding,
not the rules."""
import copy
import os
import sys

import numpy as np
import pytest

import mgtrace as mt
import mgtrace.models as models
import mgtrace.module as M
from mgtrace.autodiff import GradManager

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "models"))
from torch_reference import TORCH_MODELS   # noqa: E402  (torch.nn models, torchvision's names)

MODELS = {"resnet18": models.resnet18, "mobilenet_v2": models.mobilenet_v2}


def _to_float64(net):
    for _, mod in net.named_modules():
        for n, p in list(mod.named_parameters(recurse=False)):
            setattr(mod, n, M.Parameter(p.numpy().astype(np.float64)))
        for n, b in list(mod.named_buffers(recurse=False)):
            if b.dtype.kind == "f":
                setattr(mod, n, mt.tensor(b.numpy().astype(np.float64)))
    return net


def _compare(torch, name, dtype, rtol):
    torch.manual_seed(0)
    ref = TORCH_MODELS[name](torch.nn).train()
    if name == "mobilenet_v2":
        ref.classifier[0].p = 0.0          # dropout off: the same function on both sides
    net = (MODELS[name](dropout=0.0) if name == "mobilenet_v2" else MODELS[name]()).train()
    net.load_state_dict({k: v.detach().numpy() for k, v in ref.state_dict().items()})
    if dtype == "float64":
        ref = copy.deepcopy(ref).double()
        net = _to_float64(net)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 3, 64, 64)).astype(dtype)
    w = rng.standard_normal((2, 1000)).astype(dtype)
    (ref(torch.from_numpy(x)) * torch.from_numpy(w)).sum().backward()
    want = {k: p.grad.numpy() for k, p in ref.named_parameters()}
    params = dict(net.named_parameters())
    gm = GradManager().attach(list(params.values()))
    with gm:
        gm.backward((net(mt.tensor(x)) * mt.tensor(w)).sum())
    top = max(float(np.abs(g).max()) for g in want.values())
    for k, g in want.items():
        got = params[k].grad.numpy()
        assert got.dtype == dtype
        scale = max(float(np.abs(g).max()), 1e-6 * top)
        err = float(np.abs(got - g).max())
        assert err <= rtol * scale, f"{name}.{k} ({dtype}): max error {err:.3g}, scale {scale:.3g}"


@pytest.mark.parametrize("name", sorted(MODELS))
def test_parameter_gradients_match_torch_float64(name):
    _compare(pytest.importorskip("torch"), name, "float64", 1e-9)

