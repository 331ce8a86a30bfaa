"""The batch commands' --device: the modules load and run where it says
(a logical CPU device here; tests/cuda runs it on a GPU), and a CUDA device
this machine cannot use is a usage error naming the reason, before any file
is touched."""
import io

import numpy as np
import pytest

import mgtrace as mt
import mgtrace.functional as F
import mgtrace.module as M
from mgtrace.cli import EXIT_OK, EXIT_USAGE, main
from mgtrace.cli import tasks


class _Net(M.Module):
    def __init__(self):
        super().__init__()
        self.fc = M.Linear(4, 3)

    def forward(self, x):
        return F.relu(self.fc(x))


@pytest.fixture
def archive(tmp_path):
    x = mt.tensor(np.arange(8, dtype=np.float32).reshape(2, 4))
    tm = mt.trace_module(_Net(), x)
    path = tmp_path / "n.tmod"
    mt.save(tm, path, example_inputs=(x,))
    return path


def test_verify_runs_the_examples_on_the_device_asked(archive, monkeypatch):
    seen = []
    real = tasks._run_examples

    def spy(obj, inputs, kwargs=None, device=None):
        out = real(obj, inputs, kwargs, device)
        seen.append((str(device), str(out.device)))
        return out
    monkeypatch.setattr(tasks, "_run_examples", spy)
    assert main(["verify", str(archive), "--device", "cpu:1", "-q"], out=io.StringIO()) == EXIT_OK
    assert seen == [("cpu:1", "cpu:1")]


def test_upgrade_on_a_device_writes_the_same_archive(archive, tmp_path):
    out = tmp_path / "out"
    assert main(["upgrade", str(archive), "-o", str(out), "--device", "cpu:1", "-q"],
                out=io.StringIO()) == EXIT_OK
    a, b = mt.load(archive), mt.load(out / "n.tmod")
    for k, v in a.state_dict().items():
        assert v.numpy().tobytes() == b.state_dict()[k].numpy().tobytes()
        assert b.state_dict()[k].device == mt.Device("cpu")


def test_an_unusable_cuda_device_is_a_usage_error(archive, capsys):
    if mt.cuda.is_available():
        pytest.skip("this machine has a GPU")
    assert main(["verify", str(archive), "--device", "cuda:0"], out=io.StringIO()) == EXIT_USAGE
    assert "--device cuda:0: device cuda:0 is not available: " in capsys.readouterr().err


def test_a_bad_device_name_is_a_usage_error(archive, capsys):
    assert main(["verify", str(archive), "--device", "tpu"], out=io.StringIO()) == EXIT_USAGE
    assert "unknown device 'tpu'" in capsys.readouterr().err
