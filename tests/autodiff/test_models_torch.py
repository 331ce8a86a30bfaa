"""ResNet-18 and MobileNetV2 parameter gradients against PyTorch's (same
weights, same input, training mode: batch statistics), within 1e-4 of each
gradient's scale. Skips without torch."""
import os
import sys

import numpy as np
import pytest

import mgtrace as mt
import mgtrace.models as models
from mgtrace.autodiff import GradManager

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "models"))
from torch_reference import TORCH_MODELS   # noqa: E402  (torch.nn models, torchvision's names)

MODELS = {"resnet18": models.resnet18, "mobilenet_v2": models.mobilenet_v2}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_parameter_gradients_match_torch(name):
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    ref = TORCH_MODELS[name](torch.nn).train()
    if name == "mobilenet_v2":
        ref.classifier[0].p = 0.0          # dropout off: the same function on both sides
    net = (MODELS[name](dropout=0.0) if name == "mobilenet_v2" else MODELS[name]()).train()
    net.load_state_dict({k: v.detach().numpy() for k, v in ref.state_dict().items()})
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 3, 64, 64), dtype=np.float32)
    w = rng.standard_normal((2, 1000), dtype=np.float32)

    (ref(torch.from_numpy(x)) * torch.from_numpy(w)).sum().backward()
    params = dict(net.named_parameters())
    gm = GradManager().attach(list(params.values()))
    with gm:
        gm.backward((net(mt.tensor(x)) * mt.tensor(w)).sum())
    for k, p in ref.named_parameters():
        want = p.grad.numpy()
        got = params[k].grad.numpy()
        scale = max(float(np.abs(want).max()), 1e-12)
        err = float(np.abs(got - want).max())
        assert err <= 1e-4 * scale, f"{name}.{k}: max error {err:.3g}, gradient scale {scale:.3g}"
