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


@pytest.mark.parametrize("kind", ["LSTM", "RNN"])
def test_torch_recurrent_export_imports_as_modules_and_matches_torch(tmp_path, kind):
    """torch.onnx.export of a 2-layer bidirectional batch_first LSTM / RNN
    with initial states: imported as mgtrace's module, torch's outputs."""
    torch.manual_seed(0)
    rnn = getattr(torch.nn, kind)(5, 7, num_layers=2, bidirectional=True, batch_first=True)

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.rnn = rnn

        def forward(self, x, h0, c0=None):
            return self.rnn(x, (h0, c0) if c0 is not None else h0)
    net = Net().eval()
    lstm = kind == "LSTM"
    rng = np.random.default_rng(1)

    def inputs(n, t):
        return [rng.standard_normal((n, t, 5)).astype(np.float32)] + [
            rng.standard_normal((4, n, 7)).astype(np.float32) for _ in range(2 if lstm else 1)]
    names = ["x", "h0", "c0"][:3 if lstm else 2]
    path = tmp_path / "rnn.onnx"
    torch.onnx.export(net, tuple(torch.from_numpy(a) for a in inputs(2, 3)), str(path),
                      input_names=names, dynamic_axes={
                          n: {0: "n", 1: "t"} if n == "x" else {1: "n"} for n in names},
                      opset_version=14, dynamo=False)
    tm = mo.load(path)
    assert kind in {type(m).__name__ for _, m in tm.named_modules()}
    xs = inputs(3, 6)
    with torch.no_grad():
        want = net(*[torch.from_numpy(a) for a in xs])
    want = [want[0]] + (list(want[1]) if lstm else [want[1]])
    got = tm(*[mt.tensor(a) for a in xs])
    got = [got] if isinstance(got, mt.Tensor) else list(got)
    assert len(got) >= 1
    np.testing.assert_allclose(got[0].numpy(), want[0].numpy(), rtol=1e-5, atol=1e-5)
    for g, w in zip(got[1:], want[1:]):
        np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=1e-5, atol=1e-5)
