"""MegEngine's remaining quantization pairs (issue 32, item 3): the fused float
ConvTranspose modules, QAT ConvTranspose2d / ConvTransposeRelu2d /
ConvTransposeBn2d / ConvTransposeBnRelu2d (approximate BN folding), and the
quantized ConvTranspose forms, LinearBn1d / LinearBnRelu1d and
BatchMatMulActivation. References: NumPy (a scatter-loop transposed
convolution, the integer pipeline written out: int64 accumulation, float64
requantization, round half to even) and MegEngine 1.13's own outputs
recorded by data/make_megengine_conv_transpose.py."""
import functools
import os

import numpy as np
import pytest

import mgtrace as mt
import mgtrace.module as M
import mgtrace.module.qat as QM
import mgtrace.module.quantized as MQ
import mgtrace.quantization as Q
from mgtrace.quantization.qtensor import QuantizedTensor
from mgtrace.quantization.utils import QuantizationError, QuantMode, create_qparams
from _quant_models import PER_CHANNEL_QUINT8, calibrate

F32 = np.float32
DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data",
                    "megengine_conv_transpose.npz")


def np_conv_transpose(x, w, stride, padding, output_padding=(0, 0), dilation=(1, 1),
                      groups=1):
    """The transposed convolution by scattering each input pixel (x [N, Ci,
    H, W], w [Ci, Co/groups, KH, KW]); in x's dtype (int64 or float64)."""
    n, ci, h, wd = x.shape
    _, per, kh, kw = w.shape
    (sh, sw), (ph, pw), (oph, opw), (dh, dw) = stride, padding, output_padding, dilation
    full_h = (h - 1) * sh + dh * (kh - 1) + 1 + oph
    full_w = (wd - 1) * sw + dw * (kw - 1) + 1 + opw
    out = np.zeros((n, per * groups, full_h, full_w), x.dtype)
    cig = ci // groups
    for c in range(ci):
        g = c // cig
        for i in range(kh):
            for j in range(kw):
                out[:, g * per:(g + 1) * per, i * dh:i * dh + sh * (h - 1) + 1:sh,
                    j * dw:j * dw + sw * (wd - 1) + 1:sw] += (
                        x[:, c, None] * w[c, :, i, j].astype(x.dtype)[None, :, None, None])
    return out[:, :, ph:full_h - ph, pw:full_w - pw]


def requant_ref(acc, x_scale, w_scale, out_scale, out_zp, dtype, relu):
    mult = np.float64(F32(x_scale)) * np.asarray(w_scale, F32).astype(np.float64) / \
        np.float64(F32(out_scale))
    info = np.iinfo(dtype)
    lo = max(info.min, out_zp) if relu else info.min
    return np.clip(np.rint(acc.astype(np.float64) * mult) + out_zp, lo, info.max).astype(dtype)


def bias_ref(bias, x_scale, w_scale):
    return np.rint(bias.astype(np.float64) / (np.float64(F32(x_scale))
                                              * np.asarray(w_scale, F32).astype(np.float64)))


def qtensor(data, dtype, scale, zero_point=0):
    if dtype == "quint8":
        q = create_qparams(QuantMode.ASYMMERTIC, dtype, scale, float(zero_point))
    else:
        q = create_qparams(QuantMode.SYMMERTIC, dtype, scale)
    return QuantizedTensor.wrap(data, q)


def act(dtype, scale, zero_point=0):
    return {"dtype": dtype, "scale": scale, "zero_point": zero_point}


# --------------------------------------------------------------- float fused
@pytest.mark.parametrize("groups", [1, 2])
def test_float_fused_conv_transpose_modules_equal_numpy(groups):
    mt.random.seed(1)
    rng = np.random.default_rng(1)
    kw = dict(stride=2, padding=1, output_padding=1, groups=groups, dilation=1)
    x = rng.standard_normal((2, 4, 3, 3)).astype(F32)
    for cls, bn, relu in ((M.ConvTransposeRelu2d, False, True),
                          (M.ConvTransposeBn2d, True, False),
                          (M.ConvTransposeBnRelu2d, True, True)):
        m = cls(4, 6, 3, **kw).eval()
        ct = m.conv_transpose2d if bn else m
        w, b = ct.weight.numpy().astype(np.float64), ct.bias.numpy().astype(np.float64)
        want = np_conv_transpose(x.astype(np.float64), w, (2, 2), (1, 1), (1, 1),
                                 groups=groups) + b.reshape(-1, 1, 1)
        if bn:
            m.bn.running_mean[...] = rng.standard_normal(6).astype(F32)
            m.bn.running_var[...] = (0.5 + rng.random(6)).astype(F32)
            m.bn.weight[...] = rng.standard_normal(6).astype(F32)
            rm, rv = m.bn.running_mean.numpy(), m.bn.running_var.numpy()
            g, beta = m.bn.weight.numpy(), m.bn.bias.numpy()
            want = (want - rm.reshape(-1, 1, 1)) / np.sqrt(rv.reshape(-1, 1, 1) + 1e-5) * \
                g.reshape(-1, 1, 1) + beta.reshape(-1, 1, 1)
        if relu:
            want = np.maximum(want, 0)
        np.testing.assert_allclose(m(mt.tensor(x)).numpy(), want, rtol=1e-5, atol=1e-5)
    assert sorted(M.ConvTransposeBn2d(4, 6, 3).state_dict())[:2] == [
        "bn.bias", "bn.num_batches_tracked"]
    assert "conv_transpose2d.weight" in M.ConvTransposeBnRelu2d(4, 6, 3).state_dict()


# --------------------------------------------------------------------- QAT
def test_qat_grouped_bn_fold_scales_each_groups_output_channels():
    mt.random.seed(2)
    rng = np.random.default_rng(2)
    f = M.ConvTransposeBn2d(4, 6, 3, groups=2).eval()
    f.bn.running_var[...] = (0.5 + rng.random(6)).astype(F32)
    f.bn.weight[...] = rng.standard_normal(6).astype(F32)
    qat = QM.ConvTransposeBn2d.from_float_module(f)
    k, _, _ = qat._fold()
    w = f.conv_transpose2d.weight.numpy()           # [4, 3, 3, 3]
    want = w.reshape(2, 2, 3, 3, 3) * k.numpy().reshape(2, 1, 3, 1, 1)
    np.testing.assert_array_equal(qat.folded_weight(k).numpy(), want.reshape(4, 3, 3, 3))
    # no fake quantizer: the folded eval form is the float module's output
    x = mt.tensor(rng.standard_normal((2, 4, 4, 4)).astype(F32))
    np.testing.assert_allclose(qat(x).numpy(), f(x).numpy(), rtol=1e-5, atol=1e-5)


def test_qat_training_mode_is_megengines_approximate_folding():
    """train: bn(conv_transpose(x, fq(w * k)) / k + b) with batch statistics;
    with the fake quantizers off it is the float module in training."""
    mt.random.seed(3)
    rng = np.random.default_rng(3)
    f = M.ConvTransposeBnRelu2d(3, 4, 3, stride=2)
    g = M.ConvTransposeBnRelu2d(3, 4, 3, stride=2)
    g.load_state_dict(f.state_dict())
    qat = Q.quantize_qat(M.Sequential(f), qconfig=Q.min_max_fakequant_qconfig)
    Q.disable_fake_quant(qat)
    x = mt.tensor(rng.standard_normal((4, 3, 5, 5)).astype(F32))
    np.testing.assert_allclose(qat(x).numpy(), g(x).numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(qat[0].bn.running_var.numpy(), g.bn.running_var.numpy(),
                               rtol=1e-5)


def _npz():
    if not os.path.exists(DATA):
        pytest.skip("megengine_conv_transpose.npz not generated")
    return np.load(DATA)


_MGE_QAT = {"qat_ct": M.ConvTranspose2d, "qat_ct_relu": M.ConvTransposeRelu2d,
            "qat_ct_bn": M.ConvTransposeBn2d, "qat_ct_bn_relu": M.ConvTransposeBnRelu2d}


@pytest.mark.parametrize("name", sorted(_MGE_QAT))
def test_qat_conv_transpose_matches_megengine(name):
    d = _npz()
    cls = _MGE_QAT[name]
    m = cls(4, 6, 3, stride=2, padding=1, output_padding=1)
    ct = getattr(m, "conv_transpose2d", m)
    ct.weight[...] = d[f"{name}/weight"]
    ct.bias[...] = d[f"{name}/bias"]
    if hasattr(m, "bn"):
        for key in ("weight", "bias", "running_mean", "running_var"):
            getattr(m.bn, key)[...] = d[f"{name}/bn_{key}"]
    qat = Q.quantize_qat(M.Sequential(m).eval(), qconfig=Q.min_max_fakequant_qconfig)
    x = mt.tensor(d[f"{name}/x"])
    Q.enable_observer(qat)
    Q.disable_fake_quant(qat)
    qat(x)
    Q.disable_observer(qat)
    Q.enable_fake_quant(qat)
    quantum = float(qat[0].get_activation_qparams().scale.numpy())
    y = qat(x).numpy()
    want = d[f"{name}/y_eval"]
    # the same fake-quantized grid: equal up to float rounding (a value within
    # rounding of a half may land one quantum away)
    assert np.abs(y - want).max() <= quantum * 1.0001
    assert np.mean(np.abs(y - want) < 1e-5) > 0.99
    if hasattr(m, "bn"):
        qat.train()
        Q.disable_observer(qat)
        y = qat(x).numpy()
        assert np.abs(y - d[f"{name}/y_train"]).max() <= quantum * 1.0001
        assert np.mean(np.abs(y - d[f"{name}/y_train"]) < 1e-4) > 0.99
        np.testing.assert_allclose(qat[0].bn.running_mean.numpy(), d[f"{name}/running_mean"],
                                   rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(qat[0].bn.running_var.numpy(), d[f"{name}/running_var"],
                                   rtol=1e-5, atol=1e-6)


# --------------------------------------------------------------- quantized
CASES = [   # x dtype, x zp, groups, per-channel, relu, out dtype, bias
    ("qint8", 0, 1, False, False, "qint8", True),
    ("quint8", 131, 1, True, True, "quint8", True),
    ("quint8", 0, 2, False, False, "qint8", False),
    ("qint8", 0, 2, False, True, "float32", True),
    ("quint8", 255, 1, True, False, "qint8", True),
]


@pytest.mark.parametrize("case", CASES)
def test_quantized_conv_transpose_bitwise_equals_integer_reference(case):
    x_dt, x_zp, groups, per_channel, relu, out_dt, with_bias = case
    rng = np.random.default_rng(hash(case) % 2 ** 32)
    ci, co = 4, 6
    storage = np.uint8 if x_dt == "quint8" else np.int8
    info = np.iinfo(storage)
    xq = rng.integers(info.min, info.max + 1, (2, ci, 4, 5)).astype(storage)
    w = rng.integers(-127, 128, (ci, co // groups, 3, 3)).astype(np.int8)
    ws = (rng.random(co) * 0.02 + 0.001).astype(F32) if per_channel else F32(0.0123)
    bias = (rng.standard_normal(co) * 2).astype(F32)
    x_scale, out_scale, out_zp = 0.037, 0.91, (17 if out_dt == "quint8" else 0)
    cls = MQ.ConvTransposeRelu2d if relu else MQ.ConvTranspose2d
    m = cls(ci, co, 3, stride=2, padding=1, output_padding=1, groups=groups, bias=with_bias,
            weight_channels=co if per_channel else None,
            act_qparams=None if out_dt == "float32" else act(out_dt, out_scale, out_zp))
    m.weight = mt.tensor(w)
    m.weight_scale = mt.tensor(np.asarray(ws, F32))
    if with_bias:
        m.bias = mt.tensor(bias)
    y = m(qtensor(xq, x_dt, x_scale, x_zp))
    acc = np_conv_transpose(xq.astype(np.int64) - x_zp, w.astype(np.int64), (2, 2), (1, 1),
                            (1, 1), groups=groups)
    wsc = np.broadcast_to(np.asarray(ws, F32), (co,))
    if with_bias:
        acc = acc + bias_ref(bias, x_scale, wsc).astype(np.int64).reshape(-1, 1, 1)
    if out_dt == "float32":
        want = acc * (np.float64(F32(x_scale)) * wsc.astype(np.float64)).reshape(-1, 1, 1)
        want = (np.maximum(want, 0) if relu else want).astype(F32)
        assert type(y) is mt.Tensor
        np.testing.assert_array_equal(y.numpy(), want)
        return
    want = requant_ref(acc, x_scale, wsc.reshape(-1, 1, 1), out_scale, out_zp,
                       np.uint8 if out_dt == "quint8" else np.int8, relu)
    assert isinstance(y, QuantizedTensor) and y.dtype_name.startswith(out_dt)
    np.testing.assert_array_equal(np.asarray(mt.Tensor.numpy(y)), want)


def test_quantized_conv_transpose_ties_round_half_to_even():
    """Scales that make every requantized value k / 2: ties go to even."""
    xq = np.array([[[[1, 3, 5, -1, -3, 7]]]], np.int8)      # [1, 1, 1, 6]
    m = MQ.ConvTranspose2d(1, 1, 1, bias=False, act_qparams=act("qint8", 2.0))
    m.weight = mt.tensor(np.ones((1, 1, 1, 1), np.int8))
    m.weight_scale = mt.tensor(np.asarray(1.0, F32))
    y = m(qtensor(xq, "qint8", 1.0))
    np.testing.assert_array_equal(np.asarray(mt.Tensor.numpy(y)).ravel(),
                                  [0, 2, 2, 0, -2, 4])


def test_quantized_conv_transpose_saturates_at_both_ends():
    xq = np.array([[[[127, -128]]]], np.int8)
    m = MQ.ConvTranspose2d(1, 1, 1, bias=False, act_qparams=act("qint8", 1e-3))
    m.weight = mt.tensor(np.full((1, 1, 1, 1), 127, np.int8))
    m.weight_scale = mt.tensor(np.asarray(1.0, F32))
    y = m(qtensor(xq, "qint8", 1.0))
    np.testing.assert_array_equal(np.asarray(mt.Tensor.numpy(y)).ravel(), [127, -128])


def _calibrated(float_body, shapes, qconfig, seed=0):
    mt.random.seed(seed)
    rng = np.random.default_rng(seed)

    class Wrap(M.Module):
        def __init__(self):
            super().__init__()
            self.quant, self.body, self.dequant = M.QuantStub(), float_body, M.DequantStub()

        def forward(self, x):
            return self.dequant(self.body(self.quant(x)))
    net = Wrap()
    net.train()
    for _ in range(2):
        net(mt.tensor(rng.standard_normal(shapes).astype(F32)))
    qat = calibrate(Q.quantize_qat(net, qconfig=qconfig),
                    rng.standard_normal(shapes).astype(F32))
    return qat, mt.tensor(rng.standard_normal(shapes).astype(F32))


PER_CHANNEL_AXIS1 = Q.QConfig(
    weight_observer=functools.partial(Q.MinMaxObserver, dtype="qint8_narrow", axis=1),
    act_observer=PER_CHANNEL_QUINT8.act_observer,
    weight_fake_quant=PER_CHANNEL_QUINT8.weight_fake_quant,
    act_fake_quant=PER_CHANNEL_QUINT8.act_fake_quant)

PER_CHANNEL_AXIS0 = PER_CHANNEL_QUINT8

_FLOAT = {
    "ConvTranspose2d": (lambda: M.ConvTranspose2d(3, 4, 3, stride=2, padding=1),
                        (2, 3, 5, 5)),
    "ConvTransposeRelu2d": (lambda: M.ConvTransposeRelu2d(3, 4, 3, stride=2), (2, 3, 5, 5)),
    "ConvTransposeBn2d": (lambda: M.ConvTransposeBn2d(3, 4, 2, stride=2), (2, 3, 5, 5)),
    "ConvTransposeBnRelu2d": (lambda: M.ConvTransposeBnRelu2d(4, 4, 3, padding=1, groups=2),
                              (2, 4, 5, 5)),
    "LinearBn1d": (lambda: M.LinearBn1d(6, 5), (8, 6)),
    "LinearBnRelu1d": (lambda: M.LinearBnRelu1d(6, 5), (8, 6)),
    "BatchMatMulActivation": (lambda: M.BatchMatMulActivation(2, 5, 3, nonlinear_mode="relu"),
                              (2, 5, 3)),
}


# per-channel weights: not for the batched matmul and the grouped transposed conv
_CASES = [(name, q) for name in sorted(_FLOAT) for q in ("min_max", "per_channel")
          if q == "min_max" or name not in ("BatchMatMulActivation", "ConvTransposeBnRelu2d")]


@pytest.mark.parametrize("name, qconfig", _CASES)
def test_quantize_converts_and_follows_the_qat_model(name, qconfig, tmp_path):
    make, shape = _FLOAT[name]
    cfg = Q.min_max_fakequant_qconfig
    if qconfig == "per_channel":
        cfg = PER_CHANNEL_AXIS1 if "ConvTranspose" in name else PER_CHANNEL_AXIS0
    qat, x = _calibrated(make(), shape, cfg)
    assert type(qat.body) is getattr(QM, name)
    want = qat(x).numpy()
    qnet = Q.quantize(qat, inplace=False)
    assert type(qnet.body) is getattr(MQ, name)
    got = qnet(x).numpy()
    quantum = float(qat.body.get_activation_qparams().scale.numpy())
    # the int8 pipeline rounds the bias to int32 and the accumulator once:
    # within one output quantum of the fake-quantized QAT model
    assert np.abs(got - want).max() <= quantum * 1.0001
    assert np.mean(got == want) > 0.9
    # tracing keeps it a leaf (traced equals eager, bitwise), archives round trip
    tm = mt.trace_module(qnet, x)
    assert any(type(m) is getattr(MQ, name) for m in tm.modules())
    np.testing.assert_array_equal(tm(x).numpy(), got)
    path = str(tmp_path / "q.tmod")
    mt.save(tm, path)
    np.testing.assert_array_equal(mt.load(path)(x).numpy(), got)
    tq = mt.trace_module(qat, x)
    np.testing.assert_array_equal(tq(x).numpy(), want)
    mt.save(tq, path)
    np.testing.assert_array_equal(mt.load(path)(x).numpy(), want)


def test_quantized_batch_matmul_bitwise_equals_integer_reference():
    rng = np.random.default_rng(7)
    xq = rng.integers(0, 256, (2, 5, 3)).astype(np.uint8)
    w = rng.integers(-127, 128, (2, 3, 5)).astype(np.int8)
    bias = rng.standard_normal(3).astype(F32)
    m = MQ.BatchMatMulActivation(2, 5, 3, nonlinear_mode="relu",
                                 act_qparams=act("quint8", 0.07, 40))
    m.weight, m.bias = mt.tensor(w), mt.tensor(bias)
    m.weight_scale = mt.tensor(np.asarray(0.02, F32))
    y = m(qtensor(xq, "quint8", 0.05, 128))
    acc = np.matmul(w.astype(np.int64), xq.astype(np.int64) - 128) + \
        bias_ref(bias, 0.05, 0.02).astype(np.int64)       # along the last axis
    want = requant_ref(acc, 0.05, 0.02, 0.07, 40, np.uint8, True)
    np.testing.assert_array_equal(np.asarray(mt.Tensor.numpy(y)), want)


def test_quantized_modules_match_megengine():
    d = _npz()
    for name, float_body, shape in (
            ("quantized_ct", M.ConvTranspose2d(4, 6, 3, stride=2, padding=1, output_padding=1,
                                               bias=False), (2, 4, 5, 5)),
            ("quantized_lbn", M.LinearBn1d(8, 5), (6, 8)),
            ("quantized_bmm", M.BatchMatMulActivation(2, 5, 3, bias=False), (2, 5, 4))):
        if name != "quantized_lbn":
            float_body.weight[...] = d[f"{name}/weight"]
        else:
            float_body.linear.weight[...] = d[f"{name}/weight"]
            float_body.linear.bias[...] = d[f"{name}/bias"]
            for key in ("weight", "bias", "running_mean", "running_var"):
                getattr(float_body.bn, key)[...] = d[f"{name}/bn_{key}"]
        net = M.Sequential(M.QuantStub(), float_body, M.DequantStub()).eval()
        qat = Q.quantize_qat(net, qconfig=Q.min_max_fakequant_qconfig)
        x = mt.tensor(d[f"{name}/x"])
        Q.enable_observer(qat)
        Q.disable_fake_quant(qat)
        qat(x)
        Q.disable_observer(qat)
        scale = float(qat[1].get_activation_qparams().scale.numpy())
        assert scale == pytest.approx(float(d[f"{name}/y_scale"]), rel=1e-6)
        got = Q.quantize(qat)(x).numpy()
        want = d[f"{name}/y"]
        # MegEngine's kernels round half away from zero, mgtrace's half to even
        assert np.abs(got - want).max() <= scale * 1.0001
        assert np.mean(np.abs(got - want) < scale / 2) > 0.98


def test_quantize_refuses_unusable_weight_qparams():
    qat, _ = _calibrated(M.ConvTranspose2d(3, 4, 3), (2, 3, 4, 4), PER_CHANNEL_AXIS0)
    with pytest.raises(QuantizationError, match="axis 1"):
        Q.quantize(qat)
    qat, _ = _calibrated(M.BatchMatMulActivation(2, 5, 3), (2, 5, 3), PER_CHANNEL_AXIS1)
    with pytest.raises(QuantizationError, match="per-tensor"):
        Q.quantize(qat)
    with pytest.raises(QuantizationError, match="groups"):
        MQ.ConvTranspose2d(4, 6, 3, groups=2, weight_channels=6)
    with pytest.raises(QuantizationError, match="nonlinear_mode"):
        MQ.BatchMatMulActivation(2, 5, 3, nonlinear_mode="gelu")
    m = MQ.ConvTranspose2d(4, 6, 3)
    with pytest.raises(QuantizationError, match="QuantStub"):
        m(mt.tensor(np.zeros((1, 4, 3, 3), F32)))


# ------------------------------------------------------- qint32 bias (QAT)
def _stub_linear(weight, bias, x, qconfig=Q.min_max_fakequant_qconfig):
    net = M.Sequential(M.QuantStub(), M.Linear(weight.shape[1], weight.shape[0])).eval()
    net[1].weight[...] = weight
    net[1].bias[...] = bias
    qat = Q.quantize_qat(net, qconfig=qconfig)
    Q.enable_observer(qat)
    Q.disable_fake_quant(qat)
    qat(mt.tensor(x))
    Q.disable_observer(qat)
    Q.enable_fake_quant(qat)
    return qat


def test_qat_bias_is_fake_quantized_to_qint32_as_megengines():
    d = _npz()
    qat = _stub_linear(d["qat_bias/weight"], d["qat_bias/bias"], d["qat_bias/x"])
    x = mt.tensor(d["qat_bias/x"])
    lin = qat[1]
    inp = qat[0](x)
    w_qat = lin.apply_quant_weight(lin.weight)
    b_qat = lin.apply_quant_bias(lin.bias, inp, w_qat).numpy()
    np.testing.assert_allclose(b_qat, d["qat_bias/b_qat"], rtol=0, atol=1e-7)
    # NumPy: rint(b / s) * s at s = s_in * s_w, float32
    s = F32(lin.get_weight_qparams().scale.numpy()) * F32(
        qat[0].get_activation_qparams().scale.numpy())
    want = np.rint(d["qat_bias/bias"] / s) * s
    np.testing.assert_array_equal(b_qat, want.astype(F32))
    assert not np.array_equal(b_qat, d["qat_bias/bias"])
    quantum = float(lin.get_activation_qparams().scale.numpy())
    y = qat(x).numpy()
    assert np.abs(y - d["qat_bias/y"]).max() <= quantum * 1.0001
    # traced (the QAT modules are leaves): the same values, bitwise
    np.testing.assert_array_equal(mt.trace_module(qat, x)(x).numpy(), y)


def test_qat_bias_stays_float_without_an_fq_input():
    rng = np.random.default_rng(11)
    w = rng.standard_normal((5, 8)).astype(F32)
    b = (0.05 * rng.standard_normal(5)).astype(F32)
    x = rng.standard_normal((6, 8)).astype(F32)
    qat = _stub_linear(w, b, x)
    lin, bias = qat[1], qat[1].bias
    inp = qat[0](mt.tensor(x))
    w_qat = lin.apply_quant_weight(lin.weight)
    assert not np.array_equal(lin.apply_quant_bias(bias, inp, w_qat).numpy(), b)
    # a float input, a reshaped one (the qparams are dropped, as MegEngine's)
    for other in (mt.tensor(x), inp.reshape(6, 8)):
        np.testing.assert_array_equal(lin.apply_quant_bias(bias, other, w_qat).numpy(), b)
    # the activation fake quantizer off
    Q.disable_fake_quant(qat)
    Q.enable_fake_quant(qat[0])
    np.testing.assert_array_equal(lin.apply_quant_bias(bias, qat[0](mt.tensor(x)), w_qat), b)
    # an asymmetric (quint8) input
    qat = _stub_linear(w, b, x, PER_CHANNEL_AXIS0)
    inp = qat[0](mt.tensor(x))
    np.testing.assert_array_equal(
        qat[1].apply_quant_bias(qat[1].bias, inp, qat[1].apply_quant_weight(qat[1].weight)), b)


def test_qat_bias_per_channel_weight_scales():
    rng = np.random.default_rng(12)
    w = rng.standard_normal((5, 8)).astype(F32) * np.arange(1, 6, dtype=F32)[:, None]
    b = (0.05 * rng.standard_normal(5)).astype(F32)
    x = rng.standard_normal((6, 8)).astype(F32)
    cfg = Q.QConfig(
        weight_observer=functools.partial(Q.MinMaxObserver, dtype="qint8_narrow", axis=0),
        act_observer=Q.min_max_fakequant_qconfig.act_observer,
        weight_fake_quant=functools.partial(Q.FakeQuantize, dtype="qint8_narrow"),
        act_fake_quant=Q.min_max_fakequant_qconfig.act_fake_quant)
    qat = _stub_linear(w, b, x, cfg)
    lin = qat[1]
    inp = qat[0](mt.tensor(x))
    got = lin.apply_quant_bias(lin.bias, inp, lin.apply_quant_weight(lin.weight)).numpy()
    s = np.asarray(lin.get_weight_qparams().scale.numpy(), F32) * F32(
        qat[0].get_activation_qparams().scale.numpy())
    assert s.shape == (5,)
    np.testing.assert_array_equal(got, (np.rint(b / s) * s).astype(F32))


@pytest.mark.parametrize("groups", [1, 2])
@pytest.mark.parametrize("relu", [False, True])
def test_fuse_conv_bn_relu_module_takes_a_conv_transpose(groups, relu):
    """MegEngine's bn_fusion for ConvTranspose2d: eval folds the BatchNorm
    into the weight's output channels (NumPy reference), training keeps it."""
    mt.random.seed(5)
    rng = np.random.default_rng(5)
    ct = M.ConvTranspose2d(4, 6, 3, stride=2, padding=1, output_padding=1, groups=groups)
    bn = M.BatchNorm2d(6)
    bn.running_mean[...] = rng.standard_normal(6).astype(F32)
    bn.running_var[...] = (0.5 + rng.random(6)).astype(F32)
    bn.weight[...] = rng.standard_normal(6).astype(F32)
    bn.bias[...] = rng.standard_normal(6).astype(F32)
    x = rng.standard_normal((2, 4, 3, 3)).astype(F32)
    fused = M.fuse_conv_bn_relu_module(ct.eval(), bn.eval(), M.ReLU() if relu else None)
    assert type(fused) is (M.ConvTransposeRelu2d if relu else M.ConvTranspose2d)
    k = bn.weight.numpy() / np.sqrt(bn.running_var.numpy() + 1e-5)
    w = ct.weight.numpy().astype(np.float64)
    want_w = (w.reshape(groups, 4 // groups, 6 // groups, 3, 3)
              * k.reshape(groups, 1, 6 // groups, 1, 1)).reshape(w.shape)
    np.testing.assert_allclose(fused.weight.numpy(), want_w, rtol=1e-6)
    want = np_conv_transpose(x.astype(np.float64), w, (2, 2), (1, 1), (1, 1), groups=groups)
    want = (want + ct.bias.numpy().reshape(-1, 1, 1) - bn.running_mean.numpy().reshape(-1, 1, 1)) \
        * k.reshape(-1, 1, 1) + bn.bias.numpy().reshape(-1, 1, 1)
    if relu:
        want = np.maximum(want, 0)
    np.testing.assert_allclose(fused(mt.tensor(x)).numpy(), want, rtol=1e-4, atol=1e-5)
    trained = M.fuse_conv_bn_relu_module(ct.train(), bn.train(), M.ReLU() if relu else None)
    assert type(trained) is (M.ConvTransposeBnRelu2d if relu else M.ConvTransposeBn2d)
    assert trained.bn is not bn and trained.training
    np.testing.assert_array_equal(trained.conv_transpose2d.weight.numpy(), ct.weight.numpy())
    with pytest.raises(TypeError, match="Conv2d or ConvTranspose2d"):
        M.fuse_conv_bn_relu_module(M.Linear(2, 2), bn)


def test_new_builtins_need_format_1_2_and_round_trip(tmp_path):
    """The float fused and quantized types added here are format 1.2 builtins:
    saved alone they load back equal; target_version (1, 1) refuses them."""
    mt.random.seed(9)
    x = mt.tensor(np.random.default_rng(9).standard_normal((2, 4, 3, 3)).astype(F32))
    path = str(tmp_path / "m.tmod")
    for m in (M.ConvTransposeRelu2d(4, 3, 2, stride=2), M.ConvTransposeBn2d(4, 3, 3).eval(),
              M.ConvTransposeBnRelu2d(4, 6, 3, groups=2).eval()):
        mt.save(m, path)
        back = mt.load(path)
        assert type(back) is type(m) and back.config() == m.config()
        np.testing.assert_array_equal(back(x).numpy(), m(x).numpy())
        with pytest.raises(ValueError, match=type(m).__name__):
            mt.save(m, str(tmp_path / "old.tmod"), target_version=(1, 1))
    q = MQ.ConvTransposeRelu2d(4, 3, 3, act_qparams=act("quint8", 0.1, 7))
    q.weight = mt.tensor(np.random.default_rng(9).integers(-127, 128, (4, 3, 3, 3))
                         .astype(np.int8))
    xq = qtensor(np.random.default_rng(10).integers(-128, 128, (2, 4, 3, 3)).astype(np.int8),
                 "qint8", 0.05)
    for m in (q, MQ.LinearBnRelu1d(4, 3, act_qparams=act("qint8", 0.2)),
              MQ.BatchMatMulActivation(2, 4, 3, act_qparams=act("qint8", 0.2))):
        mt.save(m, path)
        back = mt.load(path)
        assert type(back) is type(m) and back.config() == m.config()
        with pytest.raises(ValueError, match=type(m).__name__):
            mt.save(m, str(tmp_path / "old.tmod"), target_version=(1, 1))
    np.testing.assert_array_equal(np.asarray(mt.Tensor.numpy(mt.load(path)(
        qtensor(np.ones((2, 4, 3), np.int8), "qint8", 0.1)))), np.zeros((2, 3, 3), np.int8))
    mt.save(q, path)
    np.testing.assert_array_equal(np.asarray(mt.Tensor.numpy(mt.load(path)(xq))),
                                  np.asarray(mt.Tensor.numpy(q(xq))))
