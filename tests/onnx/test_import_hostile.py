"""mgtrace.onnx.load on hostile files the fuzzer (scripts/fuzz_onnx.py) found
leaking a Python error from inside the importer: each is refused with
OnnxImportError naming the node or field."""
import numpy as np
import pytest

onnx = pytest.importorskip("onnx", reason="needs onnx (pip install 'mgtrace[onnx]')")

import mgtrace.onnx as mo  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402


def _model(nodes, inputs, outputs, inits=(), opset=17):
    g = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    ids = [helper.make_opsetid("", opset)]
    return helper.make_model(g, opset_imports=ids, ir_version=8)


def _f32(name, shape):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def _load(m):
    return mo.load(m.SerializeToString())


@pytest.mark.parametrize("op", ["ConstantOfShape", "Expand", "Tile", "Range", "Resize"])
def test_a_size_checked_op_without_its_inputs_is_an_import_error(op):
    # fuzz_onnx 0:51: the size check before allocation read ins[0] of a node with none
    m = _model([helper.make_node("Relu", ["x"], ["r"]), helper.make_node(op, [], ["y"])],
               [_f32("x", [1, 4])], [_f32("y", None)])
    with pytest.raises(mo.OnnxImportError, match=op):
        _load(m)
