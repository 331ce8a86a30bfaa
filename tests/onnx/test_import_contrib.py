"""ONNX Runtime's com.microsoft Attention imports (mgtrace.onnx.load) and
gives ORT's own output: no mask, right-padding lengths, a raw 0/1 mask,
causal, unequal V size; forms with no mgtrace form are refused."""
import numpy as np
import pytest

pytest.importorskip("onnx", reason="needs onnx (pip install 'mgtrace[onnx]')")
pytest.importorskip("onnxruntime", reason="needs onnxruntime (pip install 'mgtrace[onnx]')")

import mgtrace as mt  # noqa: E402
import mgtrace.onnx as mo  # noqa: E402
from mgtrace.onnx.exporter import compare, run_ort  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

B, S, H = 3, 5, 8


def _model(mask=None, sizes=None, **attrs):
    rng = np.random.default_rng(0)
    sizes = sizes or [H, H, H]
    inits = [numpy_helper.from_array(rng.standard_normal((H, sum(sizes))).astype(np.float32)
                                     * 0.3, "w"),
             numpy_helper.from_array(rng.standard_normal(sum(sizes)).astype(np.float32), "b")]
    ins = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", H])]
    names = ["x", "w", "b"]
    if mask is not None:
        ins.append(helper.make_tensor_value_info("mask", TensorProto.INT32, mask))
        names.append("mask")
    if sizes != [H, H, H]:
        attrs["qkv_hidden_sizes"] = sizes
    node = helper.make_node("Attention", names, ["y"], domain="com.microsoft", num_heads=2,
                            **attrs)
    graph = helper.make_graph([node], "attn", ins, [helper.make_tensor_value_info(
        "y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                   helper.make_opsetid("com.microsoft", 1)])


def _inputs(mask):
    rng = np.random.default_rng(1)
    xs = [rng.standard_normal((B, S, H)).astype(np.float32)]
    if mask == "lengths":
        xs.append(np.array([5, 3, 1], np.int32))
    elif mask == "raw":
        m = np.ones((B, S), np.int32)
        m[1, 3:] = 0
        m[2, 1:] = 0
        xs.append(m)
    return xs


@pytest.mark.parametrize("mask, attrs", [
    (None, {}), ("lengths", {}), ("raw", {}), (None, dict(unidirectional=1)),
    ("raw", dict(sizes=[8, 8, 4])),
])
def test_attention_imports_and_matches_ort(mask, attrs):
    shape = {"lengths": ["batch"], "raw": ["batch", "seq"]}.get(mask)
    model = _model(shape, **attrs)
    xs = _inputs(mask)
    want = run_ort(model, xs)[0]
    tm = mo.load(model.SerializeToString(), example_inputs=[x[:2] for x in xs])
    got = tm(*[mt.tensor(x) for x in xs]).numpy()            # another batch than traced
    assert compare(got, want) is None, compare(got, want)


def test_attention_with_past_state_is_refused():
    model = _model()
    node = model.graph.node[0]
    node.input.extend(["", "past"])
    model.graph.input.append(helper.make_tensor_value_info("past", TensorProto.FLOAT,
                                                           [2, B, 2, 0, 4]))
    with pytest.raises(mo.OnnxImportError, match="past"):
        mo.load(model.SerializeToString())


def test_other_contrib_ops_are_named():
    model = _model()
    model.graph.node[0].op_type = "QAttention"
    with pytest.raises(mo.OnnxImportError, match="com.microsoft.QAttention is not a standard "
                                                 "ONNX op .*Attention import"):
        mo.load(model.SerializeToString())
