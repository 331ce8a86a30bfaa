"""ONNX quantization ops on import: QuantizeLinear / DequantizeLinear
(per-tensor and per-axis, int8 and uint8, rounding half to even) as core
ops over plain int8/uint8 tensors, checked exactly against NumPy and ONNX
Runtime; and a static QDQ ResNet-18 made by onnxruntime.quantization from
mgtrace's own export, imported and run against ONNX Runtime."""
import io

import numpy as np
import pytest

pytest.importorskip("onnx", reason="needs onnx (pip install 'mgtrace[onnx]')")
pytest.importorskip("onnxruntime", reason="needs onnxruntime (pip install 'mgtrace[onnx]')")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import mgtrace as mt  # noqa: E402
import mgtrace.onnx as mo  # noqa: E402
from mgtrace.models import resnet18  # noqa: E402
from mgtrace.onnx.exporter import build_model  # noqa: E402


def _ort(model, xs, optimize=False):
    import onnxruntime as ort
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    opts.intra_op_num_threads = 1
    if not optimize:        # the graph as written (no QLinear fusion): ONNX's reference
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    data = model if isinstance(model, bytes) else model.SerializeToString()
    sess = ort.InferenceSession(data, opts, providers=["CPUExecutionProvider"])
    return sess.run(None, {i.name: x for i, x in zip(sess.get_inputs(), xs)})


def _qdq_model(scale, zp, axis, opset):
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], axis=axis),
             helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"], axis=axis)]
    g = helper.make_graph(
        nodes, "qdq", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4])],
        [helper.make_tensor_value_info("q", helper.np_dtype_to_tensor_dtype(zp.dtype),
                                       [2, 3, 4]),
         helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3, 4])],
        [numpy_helper.from_array(scale, "s"), numpy_helper.from_array(zp, "z")])
    ids = [helper.make_opsetid("", opset)]
    return helper.make_model(g, opset_imports=ids, ir_version=helper.find_min_ir_version_for(ids))


def _numpy_quantize(x, scale, zp, axis):
    shape = [1] * x.ndim
    if scale.ndim:
        shape[axis] = -1
    s, z = scale.reshape(shape), zp.astype(np.float32).reshape(shape)
    info = np.iinfo(zp.dtype)
    q = np.clip(np.rint(x / s) + z, info.min, info.max).astype(zp.dtype)     # rint: half to even
    return q, ((q.astype(np.int32) - zp.astype(np.int32).reshape(shape)) * s).astype(np.float32)


# 21: the newest QuantizeLinear onnxruntime 1.2x has a kernel for
@pytest.mark.parametrize("opset", [13, 21])
@pytest.mark.parametrize("dtype", [np.int8, np.uint8])
@pytest.mark.parametrize("per_axis", [False, True])
def test_quantize_dequantize_exact(dtype, per_axis, opset):
    rng = np.random.default_rng(11)
    if per_axis:
        scale = np.array([0.5, 0.25, 0.1], np.float32)
        zp = np.array([3, 0, 7] if dtype == np.uint8 else [-3, 0, 5], dtype)
    else:
        scale, zp = np.array(0.5, np.float32), np.array(9 if dtype == np.uint8 else -2, dtype)
    x = (rng.integers(-600, 600, (2, 3, 4)) / 4).astype(np.float32)    # halves and saturation
    x[0, 0, :2] = [0.25, 0.75]          # exact halves of the 0.5 scale's steps: to even
    model = _qdq_model(scale, zp, 1, opset)
    tm = mo.load(model.SerializeToString())
    got_q, got_y = (t.numpy() for t in tm(mt.tensor(x)))
    want_q, want_y = _numpy_quantize(x, scale, zp, 1)
    assert got_q.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(got_q, want_q)
    np.testing.assert_array_equal(got_y, want_y)
    ort_q, ort_y = _ort(model, [x])
    np.testing.assert_array_equal(got_q, ort_q)
    np.testing.assert_array_equal(got_y, ort_y)


def test_quantize_to_int16_is_refused():
    model = _qdq_model(np.array(0.5, np.float32), np.array(0, np.int16), 1, 21)
    with pytest.raises(mo.OnnxImportError, match="quantization to int16 has no mgtrace form"):
        mo.load(model.SerializeToString())


def test_static_qdq_resnet18_from_onnxruntime_quantization(tmp_path):
    q = pytest.importorskip("onnxruntime.quantization",
                            reason="needs onnxruntime.quantization")
    if not hasattr(q, "quantize_static") or not hasattr(q, "CalibrationDataReader"):
        pytest.skip("onnxruntime.quantization has no quantize_static")
    rng = np.random.default_rng(12)
    net = resnet18(num_classes=10).eval()
    tm = mt.trace_module(net, mt.tensor(rng.standard_normal((1, 3, 32, 32)).astype(np.float32)))
    (tmp_path / "f.onnx").write_bytes(build_model(tm, opset=13).SerializeToString())
    batches = [rng.standard_normal((1, 3, 32, 32)).astype(np.float32) for _ in range(4)]

    class Reader(q.CalibrationDataReader):
        def __init__(self):
            self.it = iter([{"x": b} for b in batches])

        def get_next(self):
            return next(self.it, None)

    q.quantize_static(str(tmp_path / "f.onnx"), str(tmp_path / "q.onnx"), Reader(),
                      quant_format=q.QuantFormat.QDQ, activation_type=q.QuantType.QUInt8,
                      weight_type=q.QuantType.QInt8, per_channel=True)
    data = (tmp_path / "q.onnx").read_bytes()
    kinds = {n.op_type for n in mo.importer._read(io.BytesIO(data))[0].graph.node}
    assert {"QuantizeLinear", "DequantizeLinear"} <= kinds
    back = mo.load(data)
    x = rng.standard_normal((3, 3, 32, 32)).astype(np.float32)          # another batch
    got = back(mt.tensor(x)).numpy()
    (want,) = _ort(data, [x])
    # the same QDQ graph computed by two float engines: a conv's sum in another
    # order (threads, kernels) may round an activation to the next quantum,
    # and the flip travels on through later layers; so the outputs may differ
    # by a step of the output's scale at some places (which, varies between
    # runs with the threads' split of the sums), a few at most
    graph = mo.importer._read(io.BytesIO(data))[0].graph
    last = [n for n in graph.node if n.op_type == "DequantizeLinear"][-1]
    step = float([numpy_helper.to_array(t) for t in graph.initializer
                  if t.name == last.input[1]][0].max())
    diff = np.abs(got - want) / step
    assert diff.max() <= 6, diff.max()          # seen: 0 to 1 step, runs apart
    assert np.abs(want).max() > 100 * step      # steps small beside the logits


def _model(nodes, inputs, outputs, inits, opset=13):
    g = helper.make_graph(nodes, "q", inputs, outputs, inits)
    ids = [helper.make_opsetid("", opset)]
    return helper.make_model(g, opset_imports=ids, ir_version=helper.find_min_ir_version_for(ids))


def _vi(name, dtype, shape):
    return helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(np.dtype(dtype)),
                                         shape)


@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("xdt", [np.uint8, np.int8])
def test_integer_and_qlinear_ops_exactly_as_onnxruntime(xdt, per_channel):
    rng = np.random.default_rng(13)
    info = np.iinfo(xdt)
    x = rng.integers(info.min, info.max + 1, (2, 4, 6, 6)).astype(xdt)
    xm = rng.integers(info.min, info.max + 1, (3, 5, 8)).astype(xdt)
    w = rng.integers(-128, 128, (6, 4, 3, 3)).astype(np.int8)
    wm = rng.integers(-128, 128, (8, 7)).astype(np.int8)
    xz = np.array(7 if xdt == np.uint8 else -3, xdt)
    wz, wmz = np.array(0, np.int8), np.array(0, np.int8)
    ws = np.array([0.02, 0.01, 0.03, 0.015, 0.025, 0.005] if per_channel else 0.02, np.float32)
    wms = np.array(np.linspace(0.01, 0.03, 7) if per_channel else 0.02, np.float32)
    if per_channel:
        wz = np.zeros(6, np.int8)
        wmz = np.zeros(7, np.int8)
    bias = rng.integers(-500, 500, 6).astype(np.int32)
    c = numpy_helper.from_array
    inits = [c(w, "w"), c(wm, "wm"), c(xz, "xz"), c(wz, "wz"), c(wmz, "wmz"),
             c(np.array(0.05, np.float32), "xs"), c(ws, "ws"), c(wms, "wms"),
             c(np.array(0.3, np.float32), "ys"),
             c(np.array(100 if xdt == np.uint8 else 10, xdt), "yz"),
             c(bias, "b"), c(np.array(0, np.int8), "wz0")]
    nodes = [
        helper.make_node("QLinearConv", ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz", "b"],
                         ["qc"], pads=[1, 1, 1, 1], strides=[2, 1]),
        helper.make_node("QLinearMatMul", ["xm", "xs", "xz", "wm", "wms", "wmz", "ys", "yz"],
                         ["qm"]),
        helper.make_node("ConvInteger", ["x", "w", "xz", "wz0"], ["ci"], pads=[0, 1, 0, 1]),
        helper.make_node("MatMulInteger", ["xm", "wm", "xz", "wz0"], ["mi"]),
    ]
    model = _model(nodes, [_vi("x", xdt, [2, 4, 6, 6]), _vi("xm", xdt, [3, 5, 8])],
                   [_vi("qc", xdt, None), _vi("qm", xdt, None),
                    _vi("ci", np.int32, None), _vi("mi", np.int32, None)], inits)
    try:
        want = _ort(model, [x, xm])
    except Exception as err:        # onnxruntime's own classes: a kernel it lacks
        pytest.skip(f"onnxruntime cannot run this combination: {str(err)[:120]}")
    got = [t.numpy() for t in mo.load(model.SerializeToString())(mt.tensor(x), mt.tensor(xm))]
    for g, w_ in zip(got, want):
        assert g.dtype == w_.dtype
        np.testing.assert_array_equal(g, w_)
    # the integer sums themselves against NumPy
    ref = np.einsum("bik,kj->bij", xm.astype(np.int64) - int(xz), wm.astype(np.int64))
    np.testing.assert_array_equal(got[3], ref)
