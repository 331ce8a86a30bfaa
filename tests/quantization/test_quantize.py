"""quantize(): calibrated QAT models -> mgtrace.module.quantized modules on
int8 kernels (issue 32, items 1-3). References: the NumPy integer pipeline
written out, and the QAT model's own fake-quantized outputs."""
import numpy as np
import pytest

import mgtrace as mt
import mgtrace.functional as F
import mgtrace.module as M
import mgtrace.module.qat as QM
import mgtrace.module.quantized as MQ
import mgtrace.quantization as Q
from _quant_models import PER_CHANNEL_QUINT8, calibrated_quant_net

F32 = np.float32


@pytest.mark.parametrize("qconfig", ["min_max", "per_channel_quint8"])
def test_quantized_model_follows_the_qat_model(qconfig):
    cfg = Q.min_max_fakequant_qconfig if qconfig == "min_max" else PER_CHANNEL_QUINT8
    qat, rng = calibrated_quant_net(cfg)
    x = mt.tensor(rng.standard_normal((5, 3, 8, 8)).astype(F32))
    want = qat(x).numpy()
    qnet = Q.quantize(qat, inplace=False)
    assert type(qnet.conv) is MQ.ConvBnRelu2d and type(qnet.fc) is MQ.Linear
    assert type(qnet.quant) is MQ.QuantStub and type(qnet.cat) is MQ.Concat
    got = qnet(x)
    assert got.dtype == np.float32
    s = float(qat.fc.get_activation_qparams().scale.numpy())
    # the int8 model differs from fake quantization only by its int32 bias and
    # by rounding once instead of twice: at most a few output quanta
    assert np.abs(got.numpy() - want).max() <= 4 * s
    assert (np.abs(got.numpy() - want) <= s * 1.01).mean() > 0.9


def test_quantized_linear_is_the_integer_pipeline():
    rng = np.random.default_rng(1)
    fc = QM.Linear.from_float_module(M.Linear(6, 4))
    fc.set_qconfig(Q.min_max_fakequant_qconfig)
    fc.eval()
    Q.enable_observer(fc)
    Q.disable_fake_quant(fc)
    fc(mt.tensor(rng.standard_normal((8, 6)).astype(F32)))
    q = MQ.Linear.from_qat_module(fc)
    xq = Q.quantize_tensor(rng.standard_normal((3, 6)).astype(F32), dtype="qint8", scale=0.02)
    y = q(xq)
    assert isinstance(y, Q.QuantizedTensor) and y.qparams.dtype_meta.name == "qint8"
    w = fc.weight.numpy()
    ws = F32(fc.get_weight_qparams().scale.numpy())
    wq = np.clip(np.rint(w / ws), -127, 127).astype(np.int64)
    np.testing.assert_array_equal(q.weight.numpy(), wq)
    b = np.rint(fc.bias.numpy().astype(np.float64) / (np.float64(F32(0.02)) * np.float64(ws)))
    acc = xq.numpy().astype(np.int64) @ wq.T + b.astype(np.int64)
    os_ = F32(fc.get_activation_qparams().scale.numpy())
    want = np.clip(np.rint(acc * (np.float64(F32(0.02)) * np.float64(ws) / np.float64(os_))),
                   -128, 127)
    np.testing.assert_array_equal(y.numpy(), want.astype(np.int8))


def test_quantized_tensors_refuse_arithmetic_and_need_qparams():
    qt = Q.quantize_tensor(np.ones(3, F32), dtype="quint8", scale=0.5, zero_point=10)
    assert qt.numpy().tolist() == [12, 12, 12] and qt.dtype == np.uint8
    np.testing.assert_array_equal(Q.dequantize_tensor(qt).numpy(), np.ones(3, F32))
    with pytest.raises(Q.QuantizationError, match=r"quint8\(scale=0.5, zero_point=10\) and float32"):
        qt + mt.tensor(np.ones(3, F32))
    with pytest.raises(ValueError, match="qint8"):      # QuantizationError is a ValueError
        _ = 2 * Q.quantize_tensor(np.ones(3, F32), dtype="qint8", scale=0.5)
    with pytest.raises(Q.QuantizationError, match="QuantizedTensor"):
        Q.dequantize_tensor(mt.tensor(np.ones(3, F32)))
    # layout methods keep the quantized dtype, so its qparams
    r = qt.reshape(1, 3)
    from mgtrace.quantization.qtensor import is_quantized, qparams_of
    assert qparams_of(r) == qt.qparams and r.numpy().tolist() == [[12, 12, 12]]
    assert is_quantized(r) and not is_quantized(mt.tensor(np.ones(2, F32)))
    lin = QM.Linear.from_float_module(M.Linear(3, 2))
    lin.set_qconfig(Q.min_max_fakequant_qconfig)
    with pytest.raises(Q.QuantizationError, match="QuantStub"):
        MQ.Linear.from_qat_module(lin)(mt.tensor(np.ones((1, 3), F32)))


def test_a_layer_without_activation_qparams_outputs_float():
    rng = np.random.default_rng(2)
    fc = QM.Linear.from_float_module(M.Linear(6, 4))
    fc.set_qconfig(Q.min_max_fakequant_qconfig)
    fc.act_observer = fc.act_fake_quant = None
    fc.eval()
    Q.enable_observer(fc)
    x = rng.standard_normal((3, 6)).astype(F32)
    fc(mt.tensor(x))
    q = MQ.Linear.from_qat_module(fc)
    assert q.act_qparams is None
    xq = Q.quantize_tensor(x, dtype="qint8", scale=0.02)
    y = q(xq)
    assert not isinstance(y, Q.QuantizedTensor) and y.dtype == np.float32
    ws = np.float64(F32(fc.get_weight_qparams().scale.numpy()))
    wq = q.weight.numpy().astype(np.int64)
    b = np.rint(fc.bias.numpy().astype(np.float64) / (np.float64(F32(0.02)) * ws))
    acc = xq.numpy().astype(np.int64) @ wq.T + b.astype(np.int64)
    np.testing.assert_array_equal(y.numpy(), (acc * (np.float64(F32(0.02)) * ws)).astype(F32))


def test_a_quantized_model_traces_saves_and_loads(tmp_path):
    qat, rng = calibrated_quant_net(Q.min_max_fakequant_qconfig, seed=3)
    qnet = Q.quantize(qat)
    for name, m in qnet.named_modules():
        if type(m).__module__.startswith("mgtrace.module.quantized"):
            assert M.is_builtin(m) and type(m)(**m.config()).config() == m.config(), name
    x = mt.tensor(rng.standard_normal((2, 3, 8, 8)).astype(F32))
    want = qnet(x).numpy()
    tm = mt.trace_module(qnet, x)
    assert type(tm.fc) is MQ.Linear
    mt.save(tm, tmp_path / "q.tmod")
    back = mt.load(tmp_path / "q.tmod")
    np.testing.assert_array_equal(back(x).numpy(), want)
    np.testing.assert_array_equal(back.conv.weight.numpy(), qnet.conv.weight.numpy())
    assert back.conv.weight.dtype == np.int8
    with pytest.raises(ValueError, match="mgtrace.module.quantized"):
        mt.save(tm, tmp_path / "old.tmod", target_version=(1, 1))


@pytest.mark.parametrize("float_outputs", [False, True])
def test_quantize_layers_is_the_stubbed_pipeline_written_out(float_outputs):
    """quantize_layers (what scripts/quant_accuracy.py and the int8 benchmarks
    run) equals wrapping each layer in stubs, quantize_qat with the
    per-channel quint8 preset, calibrating and quantize, bitwise."""
    def build():
        mt.random.seed(4)
        return M.Sequential(M.Conv2d(3, 4, 3, padding=1), M.ReLU(), M.Flatten(),
                            M.Linear(4 * 5 * 5, 6), M.Tanh())
    rng = np.random.default_rng(4)
    calib = mt.tensor(rng.standard_normal((8, 3, 5, 5)).astype(F32))
    x = mt.tensor(rng.standard_normal((3, 3, 5, 5)).astype(F32))
    got = Q.quantize_layers(build(), lambda m: m(calib), float_outputs=float_outputs)
    assert [type(m) for m in got[0]] == [MQ.QuantStub, MQ.Conv2d, MQ.DequantStub]
    assert type(got[3][1]) is MQ.Linear and type(got[1]) is M.ReLU
    assert (got[3][1].act_qparams is None) == float_outputs

    net = build()
    for i in (0, 3):
        net[i] = M.Sequential(M.QuantStub(), net[i], M.DequantStub())
    qat = Q.quantize_qat(net, qconfig=Q.per_channel_quint8_qconfig)
    if float_outputs:
        qat[0][1].act_observer = qat[0][1].act_fake_quant = None
        qat[3][1].act_observer = qat[3][1].act_fake_quant = None
    qat.eval()
    Q.enable_observer(qat)
    Q.disable_fake_quant(qat)
    qat(calib)
    Q.disable_observer(qat)
    Q.enable_fake_quant(qat)
    want = Q.quantize(qat)(x).numpy()
    np.testing.assert_array_equal(got(x).numpy(), want)
    assert Q.quantize_layers(M.Linear(4, 2), lambda m: m(mt.tensor(np.ones((1, 4), F32))),
                             types=(M.Linear,))[0].__class__ is MQ.QuantStub


def test_quantize_layers_leaves_the_other_layer_types_float():
    """types=(Conv2d,) made the Linear int8 too (quantize_qat converts every
    type it maps), with no QuantStub before it: the model then refused its
    own float input ('Linear takes a QuantizedTensor')."""
    mt.random.seed(5)
    net = M.Sequential(M.Conv2d(3, 4, 3), M.Flatten(), M.Linear(4 * 4 * 4, 2)).eval()
    w = net[2].weight.numpy().copy()
    x = mt.tensor(np.random.default_rng(5).standard_normal((2, 3, 6, 6)).astype(F32))
    q = Q.quantize_layers(net, lambda m: m(x), types=(M.Conv2d,))
    assert type(q[0][1]) is MQ.Conv2d and type(q[2]) is M.Linear
    assert not hasattr(q[2], "quantize_disabled")
    np.testing.assert_array_equal(q[2].weight.numpy(), w)
    # the float Linear reads the int8 conv's dequantized output, bitwise
    h = q[1](q[0](x)).numpy()
    want = h @ w.T + net[2].bias.numpy()
    np.testing.assert_allclose(q(x).numpy(), want, rtol=1e-6, atol=1e-6)
