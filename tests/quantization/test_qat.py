"""QAT modules and quantize_qat: weight and activation qparams equal
MinMax over the float tensors (NumPy), outputs lie on the activation's
quantization grid within half a step of the float output, switched-off
fake quantization gives the float model bitwise, and conv+BN folding
matches the float ConvBn2d in eval and training."""
import warnings
from functools import partial

import numpy as np
import pytest

import mgtrace as mt
import mgtrace.module as M
import mgtrace.module.qat as QM
import mgtrace.quantization as Q

F32 = np.float32


def t(a):
    return mt.tensor(np.asarray(a, F32))


def ref_fq(x, s, qmin, qmax):
    return np.clip(np.rint(x / s), qmin, qmax).astype(F32) * s


def test_qat_linear_minmax_qparams_and_grid():
    rng = np.random.default_rng(0)
    fc = M.Linear(6, 4)
    x = rng.standard_normal((5, 6)).astype(F32)
    q = QM.Linear.from_float_module(fc)
    assert q.weight is fc.weight and q.bias is fc.bias
    q.set_qconfig(Q.min_max_fakequant_qconfig)
    y = q(t(x)).numpy()
    w = fc.weight.numpy()
    s_w = np.abs(w).max() / F32(127)                        # qint8_narrow
    assert q.get_weight_qparams().scale.numpy() == s_w
    y_float = x @ ref_fq(w, s_w, -127, 127).T + fc.bias.numpy()
    s_a = q.get_activation_qparams().scale.numpy()
    np.testing.assert_allclose(s_a, np.abs(y_float).max() / 127.5, rtol=1e-6)
    k = y / s_a
    np.testing.assert_allclose(k, np.rint(k), atol=1e-3)     # on the grid
    assert np.all(np.abs(y - y_float) <= s_a / 2 + 1e-5)


def test_qat_conv_relu_and_per_channel_weight_observer():
    rng = np.random.default_rng(1)
    conv = M.ConvRelu2d(2, 3, 3, padding=1)
    q = QM.ConvRelu2d.from_float_module(conv)
    qconfig = Q.QConfig(partial(Q.MinMaxObserver, dtype="qint8_narrow", axis=0, channels=3),
                        partial(Q.MinMaxObserver, dtype="qint8"),
                        partial(Q.FakeQuantize, dtype="qint8_narrow"),
                        partial(Q.FakeQuantize, dtype="qint8"))
    q.set_qconfig(qconfig)
    x = t(rng.standard_normal((1, 2, 4, 4)))
    y = q(x).numpy()
    assert y.min() >= 0
    w = conv.weight.numpy()
    np.testing.assert_array_equal(q.get_weight_qparams().scale.numpy(),
                                  np.abs(w).reshape(3, -1).max(axis=1) / F32(127))
    Q.disable_fake_quant(q)
    np.testing.assert_array_equal(q(x).numpy(), conv(x).numpy())


def test_quantize_qat_swaps_types_shares_weights_and_loads_float_state():
    mt.random.seed(3)
    net = M.Sequential(M.Conv2d(3, 4, 3), M.ReLU(), M.Flatten(), M.Linear(16, 2))
    float_state = {k: v.numpy().copy() for k, v in net.state_dict().items()}
    qat = Q.quantize_qat(net, inplace=False)
    assert [type(m) for m in qat] == [QM.Conv2d, M.ReLU, M.Flatten, QM.Linear]
    assert type(net[0]) is M.Conv2d                          # not inplace: untouched
    assert isinstance(qat[3].act_observer, Q.ExponentialMovingAverageObserver)   # default
    assert "3.act_observer.runtime_momentum" in qat.state_dict()
    fresh = Q.quantize_qat(M.Sequential(M.Conv2d(3, 4, 3), M.ReLU(), M.Flatten(),
                                        M.Linear(16, 2)))
    result = fresh.load_state_dict({k: t(v) for k, v in float_state.items()}, strict=False)
    assert result.unexpected_keys == [] and all("observer" in k for k in result.missing_keys)
    np.testing.assert_array_equal(fresh[3].weight.numpy(), float_state["3.weight"])
    x = t(np.random.default_rng(4).standard_normal((2, 3, 4, 4)))
    Q.disable_fake_quant(fresh)
    np.testing.assert_array_equal(fresh(x).numpy(), net(x).numpy())
    with pytest.raises(Q.QuantizationError, match="QConfig"):
        Q.quantize_qat(net, qconfig="ema")


def test_quantize_disabled_and_calibration_keep_float_outputs():
    mt.random.seed(5)
    net = M.Sequential(M.Linear(4, 4), M.Linear(4, 2))
    net[1].quantize_disabled = True
    x = t(np.random.default_rng(6).standard_normal((3, 4)))
    want = net(x).numpy()
    Q.quantize_qat(net, qconfig=Q.calibration_qconfig)
    assert type(net[0]) is QM.Linear and type(net[1]) is M.Linear
    net.eval()
    Q.enable_observer(net)                  # calibrate in eval mode, MegEngine's way
    np.testing.assert_array_equal(net(x).numpy(), want)      # no fake quant in calibration
    assert net[0].act_observer.histogram.numpy().sum() == 12
    hist_scale = net[0].get_activation_qparams().scale.numpy()
    w_scale = net[0].get_weight_qparams().scale.numpy()
    Q.reset_qconfig(net, Q.tqt_qconfig)          # TQT starts from the observed qparams
    assert isinstance(net[0].weight_fake_quant, Q.TQT) and net[0].weight_observer is None
    np.testing.assert_allclose(net[0].get_weight_qparams().scale.numpy(), w_scale, rtol=1e-6)
    np.testing.assert_allclose(net[0].get_activation_qparams().scale.numpy(), hist_scale,
                               rtol=1e-6)
    assert type(net[1]) is M.Linear


def test_user_mapping_extends_the_default_and_lsq_reset():
    class MyConvBnRelu2d(M.ConvBnRelu2d):
        pass

    class MyQATConvBnRelu2d(QM.ConvBnRelu2d):
        pass
    mt.random.seed(10)
    net = M.Sequential(MyConvBnRelu2d(3, 3, 3, padding=1), M.ConvBn2d(3, 3, 1))
    qconfig = Q.QConfig(partial(Q.MinMaxObserver, dtype="qint8_narrow"),
                        partial(Q.MinMaxObserver, dtype="qint8"), None, None)
    Q.quantize_qat(net, qconfig=qconfig, mapping={MyConvBnRelu2d: MyQATConvBnRelu2d})
    assert [type(m) for m in net] == [MyQATConvBnRelu2d, QM.ConvBn2d]
    net.eval()
    Q.enable_observer(net)
    net(t(np.random.default_rng(10).random((2, 3, 6, 6))))
    before = [(m.get_weight_qparams(), m.get_activation_qparams()) for m in net]
    lsq = Q.QConfig(None, None, partial(Q.LSQ, dtype="qint8_narrow"), partial(Q.LSQ, dtype="qint8"))
    Q.reset_qconfig(net, lsq)
    for m, (w, a) in zip(net, before):
        assert isinstance(m.weight_fake_quant, Q.LSQ) and m.act_observer is None
        # LSQ's step is |scale - eps| + eps: the observed scale back, to float32 rounding
        np.testing.assert_allclose(m.get_weight_qparams().scale.numpy(), w.scale.numpy(),
                                   rtol=1e-6)
        np.testing.assert_allclose(m.get_activation_qparams().scale.numpy(), a.scale.numpy(),
                                   rtol=1e-6)


@pytest.mark.parametrize("relu", [False, True])
def test_qat_conv_bn_folding_matches_float_without_fake_quant(relu):
    mt.random.seed(7)
    rng = np.random.default_rng(7)
    make = M.ConvBnRelu2d if relu else M.ConvBn2d
    ref = make(3, 4, 3, padding=1, groups=1)
    ref.bn.running_mean = t(rng.standard_normal(4) * 0.1)
    ref.bn.running_var = t(rng.uniform(0.5, 2.0, 4))
    ref.bn.weight = M.Parameter(t(rng.uniform(0.5, 1.5, 4)))
    mirror = make(3, 4, 3, padding=1)
    mirror.load_state_dict(ref.state_dict())
    q = Q.quantize_qat(mirror, qconfig=Q.min_max_fakequant_qconfig)
    assert type(q) is (QM.ConvBnRelu2d if relu else QM.ConvBn2d)
    Q.disable_fake_quant(q)
    x = t(rng.standard_normal((2, 3, 5, 5)))
    for mode in ("eval", "train"):
        getattr(ref, mode)()
        getattr(q, mode)()
        np.testing.assert_allclose(q(x).numpy(), ref(x).numpy(), rtol=1e-4, atol=1e-5)
    # training updated both BatchNorms' running statistics the same way
    np.testing.assert_allclose(q.bn.running_mean.numpy(), ref.bn.running_mean.numpy(),
                               rtol=1e-5, atol=1e-6)


def test_qat_conv_bn_fake_quantizes_the_folded_weight():
    mt.random.seed(8)
    rng = np.random.default_rng(8)
    f = M.ConvBn2d(2, 3, 1, bias=False).eval()
    f.bn.running_var = t(rng.uniform(0.5, 2.0, 3))
    q = QM.ConvBn2d.from_float_module(f)
    q.set_qconfig(Q.min_max_fakequant_qconfig)
    q(t(rng.standard_normal((1, 2, 2, 2))))
    k = f.bn.weight.numpy() / np.sqrt(f.bn.running_var.numpy() + F32(1e-5))
    w_fold = f.conv.weight.numpy() * k.reshape(-1, 1, 1, 1)
    np.testing.assert_allclose(q.get_weight_qparams().scale.numpy(),
                               np.abs(w_fold).max() / 127, rtol=1e-6)


def test_traced_qat_model_with_frozen_qparams_equals_eager():
    mt.random.seed(9)
    rng = np.random.default_rng(9)
    net = Q.quantize_qat(M.Sequential(M.ConvBn2d(2, 3, 3), M.ReLU(), M.Flatten(),
                                      M.Linear(12, 2)), qconfig=Q.min_max_fakequant_qconfig)
    net(t(rng.standard_normal((2, 2, 4, 4))))
    Q.disable_observer(net)
    net.eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", mt.TraceWarning)     # qparams kept as constants
        traced = mt.trace_module(net, t(rng.standard_normal((2, 2, 4, 4))))
    x = t(rng.standard_normal((3, 2, 4, 4)) * 2)
    np.testing.assert_array_equal(traced(x).numpy(), net(x).numpy())


def test_easy_quant_picks_the_best_scale_on_its_grid():
    mt.random.seed(11)
    rng = np.random.default_rng(11)
    net = M.Sequential(M.Linear(8, 6), M.ReLU(), M.Linear(6, 3))
    data = t(rng.standard_normal((16, 8)))
    Q.quantize_qat(net, qconfig=Q.min_max_fakequant_qconfig)
    Q.disable_fake_quant(net)
    net(data)                                           # calibrate
    Q.enable_fake_quant(net)
    with pytest.raises(Q.QuantizationError, match="easyquant_qconfig"):
        Q.apply_easy_quant(net, data)
    Q.reset_qconfig(net, Q.easyquant_qconfig)
    first = net[0]
    w_orig = first.weight_observer.orig_scale
    a_orig = first.act_observer.get_qparams().scale.numpy()
    Q.apply_easy_quant(net, data, start=0.5, stop=1.5, num=21)
    grid = np.linspace(0.5 * w_orig, 1.5 * w_orig, 21)
    chosen = first.weight_observer.scale.numpy()
    assert np.isclose(grid, chosen, rtol=0, atol=1e-9).any()
    # NumPy: the cosine of layer 0's output at each grid scale (act at its original scale)
    x, w, b = data.numpy(), first.weight.numpy(), first.bias.numpy()
    ref = x @ w.T + b

    def cos(s):
        y = ref_fq(x @ ref_fq(w, F32(s), -127, 127).T + b, a_orig, -128, 127)
        return np.mean(np.sum(ref * y, 1) / (np.linalg.norm(ref, axis=1) * np.linalg.norm(y, axis=1)))
    assert cos(chosen) >= max(cos(s) for s in grid) - 1e-6
    assert cos(chosen) >= cos(w_orig) - 1e-6
    for m in (net[0], net[2]):
        for ob in (m.weight_observer, m.act_observer):
            assert 0.5 * ob.orig_scale - 1e-9 <= ob.scale.numpy() <= 1.5 * ob.orig_scale + 1e-9


def test_qat_elemwise_fake_quantizes_its_output():
    rng = np.random.default_rng(12)
    net = Q.quantize_qat(M.Sequential(M.Elemwise("FUSE_ADD_RELU")),
                         qconfig=Q.min_max_fakequant_qconfig)
    e = net[0]
    assert type(e) is QM.Elemwise and e.weight_observer is None
    a, b = rng.standard_normal((2, 3, 4)).astype(F32)
    y = e(t(a), t(b)).numpy()
    r = np.maximum(a + b, 0)
    s = r.max() / F32(127.5)
    assert e.get_activation_qparams().scale.numpy() == s
    np.testing.assert_array_equal(y, ref_fq(r, s, -128, 127))


def test_qat_conv_bn_without_running_stats_uses_batch_statistics_in_eval():
    mt.random.seed(13)
    ref = M.ConvBn2d(2, 3, 3, track_running_stats=False).eval()
    mirror = M.ConvBn2d(2, 3, 3, track_running_stats=False)
    mirror.load_state_dict(ref.state_dict())
    q = Q.quantize_qat(mirror, qconfig=Q.min_max_fakequant_qconfig).eval()
    Q.disable_fake_quant(q)
    x = t(np.random.default_rng(13).standard_normal((2, 2, 5, 5)) * 3 + 1)
    np.testing.assert_allclose(q(x).numpy(), ref(x).numpy(), rtol=1e-4, atol=1e-5)


def test_quant_stub_fake_quantizes_the_input_dequant_stub_passes():
    mt.random.seed(14)
    net = M.Sequential(M.QuantStub(), M.Linear(4, 2), M.DequantStub())
    x = np.random.default_rng(14).standard_normal((3, 4)).astype(F32)
    np.testing.assert_array_equal(net(t(x)).numpy(), net[1](t(x)).numpy())   # float: identity
    Q.quantize_qat(net, qconfig=Q.min_max_fakequant_qconfig)
    assert [type(m) for m in net] == [QM.QuantStub, QM.Linear, QM.DequantStub]
    assert net[2].act_observer is None and net[0].weight_observer is None
    s = np.abs(x).max() / F32(127.5)
    np.testing.assert_array_equal(net[0](t(x)).numpy(), ref_fq(x, s, -128, 127))
