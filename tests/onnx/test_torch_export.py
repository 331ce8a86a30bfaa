"""What torch.onnx.export writes for the reference models imports with
mgtrace.onnx.load and gives torch's output (skipped without torch)."""
import os
import sys

import numpy as np
import pytest

pytest.importorskip("onnx", reason="needs onnx (pip install 'mgtrace[onnx]')")
torch = pytest.importorskip("torch", reason="needs torch (pip install torch)")

import mgtrace as mt  # noqa: E402
import mgtrace.onnx as mo  # noqa: E402
from mgtrace.models import mobilenet_v2, resnet18  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "models"))
from torch_reference import TORCH_MODELS  # noqa: E402


def _torch_onnx(name, net, path, opset):
    model = TORCH_MODELS[name](torch.nn).eval()
    model.load_state_dict({k: torch.from_numpy(v.numpy().copy())
                           for k, v in net.state_dict().items()})
    x = torch.zeros(1, 3, 32, 32)
    torch.onnx.export(model, (x,), str(path), input_names=["x"], output_names=["y"],
                      dynamic_axes={"x": {0: "batch"}, "y": {0: "batch"}},
                      opset_version=opset, dynamo=False)
    return model


@pytest.mark.parametrize("opset", [13, 17])
@pytest.mark.parametrize("name, make", [("resnet18", resnet18), ("mobilenet_v2", mobilenet_v2)])
def test_torch_export_imports_and_matches_torch(tmp_path, name, make, opset):
    net = make().eval()
    path = tmp_path / f"{name}.onnx"
    model = _torch_onnx(name, net, path, opset)
    tm = mo.load(path)
    x = np.random.default_rng(0).standard_normal((3, 3, 32, 32)).astype(np.float32)
    with torch.no_grad():
        want = model(torch.from_numpy(x)).numpy()
    got = tm(mt.tensor(x)).numpy()
    scale = np.abs(want).max()
    assert np.abs(got - want).max() <= 1e-4 * scale
    mt.save(tm, tmp_path / f"{name}.tmod")
