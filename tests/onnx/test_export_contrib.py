"""export(contrib_ops=True): ONNX Runtime's com.microsoft fused ops where
ORT has them, declared in the model's opset imports, passing onnx.checker,
and giving ORT the same outputs as mgtrace; contrib_ops=False keeps to the
standard domain."""
import io

import numpy as np
import pytest

pytest.importorskip("onnx", reason="needs onnx (pip install 'mgtrace[onnx]')")
pytest.importorskip("onnxruntime", reason="needs onnxruntime (pip install 'mgtrace[onnx]')")

import onnx  # noqa: E402

import mgtrace as mt  # noqa: E402
import mgtrace.functional as F  # noqa: E402
import mgtrace.module as M  # noqa: E402
import mgtrace.onnx as mo  # noqa: E402
from mgtrace.models import MiniLM, resnet18  # noqa: E402
from mgtrace.onnx.exporter import compare, run_ort  # noqa: E402
from mgtrace.traced_module.passes import optimize  # noqa: E402


def _ops(model):
    return {(n.domain or "", n.op_type) for n in model.graph.node}


def _export(tm, **kw):
    model = mo.export(tm, io.BytesIO(), **kw)
    onnx.checker.check_model(model, full_check=True)
    return model


def _same(model, tm, xs):
    got = run_ort(model, xs)
    want = tm(*[mt.tensor(x) for x in xs])
    want = want if isinstance(want, (tuple, list)) else [want]
    for g, w in zip(got, want):
        msg = compare(g, w.numpy())
        assert msg is None, msg


def test_fused_conv_for_an_optimized_resnet():
    rng = np.random.default_rng(21)
    tm = mt.trace_module(resnet18(num_classes=10).eval(),
                         mt.tensor(rng.standard_normal((1, 3, 32, 32)).astype(np.float32)))
    opt = optimize(tm, "all", flatten=True)
    x = rng.standard_normal((3, 3, 32, 32)).astype(np.float32)
    plain = _export(opt)
    fused = _export(opt, contrib_ops=True)
    assert not any(d for d, _ in _ops(plain))
    assert ("com.microsoft", "FusedConv") in _ops(fused)
    assert {o.domain: o.version for o in fused.opset_import} == {"": mo.max_opset(),
                                                                 "com.microsoft": 1}
    n_plain = sum(n.op_type in ("Conv", "Relu", "Add") for n in plain.graph.node)
    n_fused = sum(n.op_type in ("Conv", "Relu", "Add", "FusedConv") for n in fused.graph.node)
    assert n_fused < n_plain
    _same(fused, opt, [x])


@pytest.mark.parametrize("approximate,op", [("none", "Gelu"), ("tanh", "FastGelu")])
def test_gelu_below_opset_20(approximate, op):
    class Net(M.Module):
        def forward(self, x):
            return F.gelu(x, approximate)
    rng = np.random.default_rng(22)
    tm = mt.trace_module(Net(), mt.tensor(rng.standard_normal((2, 5)).astype(np.float32)))
    model = _export(tm, opset=13, contrib_ops=True)
    assert _ops(model) >= {("com.microsoft", op)}
    _same(model, tm, [rng.standard_normal((4, 5)).astype(np.float32) * 3])
    assert ("com.microsoft", op) not in _ops(_export(tm, opset=13))
    assert ("", "Gelu") in _ops(_export(tm, opset=20, contrib_ops=True))    # standard from 20


def test_skip_layer_norm_for_minilm_at_another_batch_and_length():
    net = MiniLM(vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                 intermediate_size=32, max_position_embeddings=20).eval()
    rng = np.random.default_rng(23)
    tm = mt.trace_module(net, mt.tensor(rng.integers(0, 50, (1, 4)).astype(np.int32)),
                         mt.tensor(np.ones((1, 4), np.int32)))
    model = _export(tm, contrib_ops=True)
    n = sum(op == ("com.microsoft", "SkipLayerNormalization") for op in
            [(d.domain, d.op_type) for d in model.graph.node])
    # the embeddings' sum, then after attention and after the feed-forward in each layer
    assert n == 1 + 2 * 2
    ids = rng.integers(0, 50, (3, 7)).astype(np.int32)
    mask = (rng.random((3, 7)) > 0.3).astype(np.int32)
    _same(model, tm, [ids, mask])


def test_contrib_ops_must_be_a_bool():
    tm = mt.trace_module(M.Sequential(M.ReLU()), mt.tensor(np.ones((2, 2), np.float32)))
    with pytest.raises(TypeError, match="contrib_ops must be True or False"):
        mo.export(tm, io.BytesIO(), contrib_ops="yes")
