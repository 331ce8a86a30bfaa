"""Whole models on CUDA: ResNet-18 and the MiniLM encoder give the CPU's
outputs (float32, within 1e-3); an archive saved on the CPU loads and runs
on the GPU; a module moved to the GPU saves and reloads on the CPU with
bit-exact weights; traced modules run on the GPU; the batch commands'
--device."""
import numpy as np
import pytest

import mgtrace as mt
import mgtrace.module as M
from mgtrace.models import MiniLM, resnet18

from conftest import requires_cuda

pytestmark = requires_cuda


def _state(module):
    return {k: v.numpy() for k, v in module.state_dict().items()}


@pytest.fixture(scope="module")
def resnet():
    mt.random.seed(0)
    return resnet18(num_classes=10).eval()


@pytest.fixture(scope="module")
def minilm():
    return MiniLM(num_hidden_layers=2).eval()


def _minilm_inputs(rng, b=3, s=17):
    ids = rng.integers(1, 30000, (b, s)).astype(np.int32)
    mask = np.ones((b, s), np.int32)
    mask[1, 11:] = 0                                    # padding in one row
    return ids, mask


def test_module_to_moves_every_parameter_and_buffer(resnet):
    gpu = resnet18(num_classes=10).eval()
    gpu.load_state_dict(_state(resnet))
    assert gpu.to("cuda:0") is gpu
    for name, t in gpu.state_dict().items():
        assert t.device == mt.Device("cuda:0"), name
    for name, p in gpu.named_parameters():
        assert isinstance(p, M.Parameter), name


def test_resnet18_on_cuda_matches_the_cpu(resnet, rng):
    x = rng.standard_normal((2, 3, 64, 64)).astype(np.float32)
    want = resnet(mt.tensor(x)).numpy()
    gpu = resnet18(num_classes=10).eval()
    gpu.load_state_dict(_state(resnet))
    gpu.to("cuda:0")
    got = gpu(mt.tensor(x, device="cuda:0"))
    assert got.device == mt.Device("cuda:0")
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-3, atol=1e-3)


def test_minilm_on_cuda_matches_the_cpu(minilm, rng):
    ids, mask = _minilm_inputs(rng)
    want = minilm(mt.tensor(ids), mt.tensor(mask)).numpy()
    gpu = MiniLM(num_hidden_layers=2).eval()
    gpu.load_state_dict(_state(minilm))
    gpu.to("cuda:0")
    got = gpu(mt.tensor(ids, device="cuda:0"), mt.tensor(mask, device="cuda:0"))
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-3, atol=1e-3)
    hid = gpu.hidden_states(mt.tensor(ids, device="cuda:0"), mt.tensor(mask, device="cuda:0"))
    np.testing.assert_allclose(hid.numpy(), minilm.hidden_states(mt.tensor(ids), mt.tensor(mask)).numpy(),
                               rtol=1e-3, atol=1e-3)


def test_traced_resnet_runs_on_cuda(resnet, rng):
    x = rng.standard_normal((1, 3, 32, 32)).astype(np.float32)
    tm = mt.trace_module(resnet, mt.tensor(x))
    want = tm(mt.tensor(x)).numpy()
    tm.to("cuda:0")
    np.testing.assert_allclose(tm(mt.tensor(x, device="cuda:0")).numpy(), want, rtol=1e-3, atol=1e-3)


def test_tracing_on_cuda(minilm, rng):
    ids, mask = _minilm_inputs(rng, b=2, s=9)
    gpu = MiniLM(num_hidden_layers=2).eval()
    gpu.load_state_dict(_state(minilm))
    gpu.to("cuda:0")
    args = (mt.tensor(ids, device="cuda:0"), mt.tensor(mask, device="cuda:0"))
    tm = mt.trace_module(gpu, *args)
    np.testing.assert_allclose(tm(*args).numpy(), minilm(mt.tensor(ids), mt.tensor(mask)).numpy(),
                               rtol=1e-3, atol=1e-3)


def test_archive_saved_on_cpu_loads_and_runs_on_cuda(resnet, rng, tmp_path):
    x = rng.standard_normal((1, 3, 32, 32)).astype(np.float32)
    tm = mt.trace_module(resnet, mt.tensor(x))
    path = tmp_path / "r.tmod"
    mt.save(tm, path)
    want = tm(mt.tensor(x)).numpy()
    loaded = mt.load(path, device="cuda:0")
    for name, t in loaded.state_dict().items():
        assert t.device == mt.Device("cuda:0"), name
    np.testing.assert_allclose(loaded(mt.tensor(x, device="cuda:0")).numpy(), want, rtol=1e-3, atol=1e-3)


def test_module_on_cuda_saves_and_reloads_on_cpu_bit_exact(resnet, rng, tmp_path):
    x = rng.standard_normal((1, 3, 32, 32)).astype(np.float32)
    tm = mt.trace_module(resnet, mt.tensor(x))
    weights = _state(tm)
    tm.to("cuda:0")
    path = tmp_path / "g.tmod"
    mt.save(tm, path)
    back = mt.load(path)
    got = _state(back)
    assert got.keys() == weights.keys()
    for k in weights:
        assert got[k].dtype == weights[k].dtype and got[k].tobytes() == weights[k].tobytes(), k
    for t in back.state_dict().values():
        assert t.device == mt.Device("cpu")


def test_verify_command_runs_examples_on_the_gpu(resnet, rng, tmp_path):
    from mgtrace.cli import main
    import io
    x = rng.standard_normal((1, 3, 32, 32)).astype(np.float32)
    tm = mt.trace_module(resnet, mt.tensor(x))
    path = tmp_path / "v.tmod"
    mt.save(tm, path, example_inputs=(mt.tensor(x),))
    out = io.StringIO()
    rc = main(["verify", str(path), "--device", "cuda:0", "--rtol", "1e-3", "--atol", "1e-3", "--json"], out=out)
    assert rc == 0, out.getvalue()
