"""QAT LinearBn1d / LinearBnRelu1d (approx BatchNorm folding), Concat and
BatchMatMulActivation (issue 32, item 3), against NumPy float32 references
written from MegEngine's formulas and against the float modules."""
import numpy as np
import pytest

import mgtrace as mt
import mgtrace.module as M
import mgtrace.module.qat as QM
import mgtrace.quantization as Q

F32 = np.float32


def ref_fq(x, s, qmin, qmax):
    s = F32(s)
    return (np.clip(np.rint(x / s), qmin, qmax) * s).astype(F32)


def _trained_linear_bn(relu, seed):
    mt.random.seed(seed)
    rng = np.random.default_rng(seed)
    float_m = (M.LinearBnRelu1d if relu else M.LinearBn1d)(6, 4)
    for _ in range(3):                  # running statistics that are not 0 and 1
        float_m(mt.tensor(rng.standard_normal((16, 6)).astype(F32) * 2 + 1))
    float_m.bn.weight = M.Parameter(mt.tensor(rng.uniform(0.5, 1.5, 4).astype(F32)))
    float_m.bn.bias = M.Parameter(mt.tensor(rng.standard_normal(4).astype(F32)))
    return float_m, rng


@pytest.mark.parametrize("relu", [False, True])
def test_linear_bn_folding_matches_float_without_fake_quant(relu):
    float_m, rng = _trained_linear_bn(relu, 1)
    qat = Q.quantize_qat(M.Sequential(float_m), qconfig=Q.min_max_fakequant_qconfig)[0]
    assert type(qat) is (QM.LinearBnRelu1d if relu else QM.LinearBn1d)
    Q.disable_fake_quant(qat)
    x = mt.tensor(rng.standard_normal((8, 6)).astype(F32))
    qat.eval()
    float_m.eval()
    np.testing.assert_allclose(qat(x).numpy(), float_m(x).numpy(), rtol=1e-5, atol=1e-5)
    # training: batch statistics, and the running ones updated as the float module's
    float_m.train()
    qat.train()
    twin, _ = _trained_linear_bn(relu, 1)
    twin.train()
    np.testing.assert_allclose(qat(x).numpy(), twin(x).numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(qat.bn.running_mean.numpy(), twin.bn.running_mean.numpy(),
                               rtol=1e-5, atol=1e-6)


def test_linear_bn_fake_quantizes_the_folded_weight_in_eval():
    float_m, rng = _trained_linear_bn(False, 2)
    qat = QM.LinearBn1d.from_float_module(float_m)
    qat.set_qconfig(Q.min_max_fakequant_qconfig)
    qat.eval()
    Q.enable_observer(qat)
    x = rng.standard_normal((8, 6)).astype(F32)
    got = qat(mt.tensor(x)).numpy()
    bn = qat.bn
    k = (bn.weight.numpy() / np.sqrt(bn.running_var.numpy() + F32(bn.eps))).astype(F32)
    w = (qat.linear.weight.numpy() * k[:, None]).astype(F32)
    sw = max(F32(np.abs(w).max()), F32(1e-5)) / F32(127)       # qint8_narrow: (127 + 127) / 2
    wq = ref_fq(w, sw, -127, 127)
    b = bn.bias.numpy() + k * (qat.linear.bias.numpy() - bn.running_mean.numpy())
    y = x @ wq.T + b
    sa = max(F32(max(-y.min(), y.max())), F32(1e-5)) / F32(127.5)
    np.testing.assert_allclose(got, ref_fq(y, sa, -128, 127), rtol=0, atol=float(sa) * 1.01)
    np.testing.assert_allclose(qat.get_weight_qparams().scale.numpy(), sw, rtol=1e-6)


@pytest.mark.parametrize("mode", ["identity", "relu"])
def test_batch_matmul_activation(mode):
    mt.random.seed(3)
    rng = np.random.default_rng(3)
    float_m = M.BatchMatMulActivation(2, 5, 3, nonlinear_mode=mode.upper())
    float_m.bias = M.Parameter(mt.tensor(rng.standard_normal(3).astype(F32)))
    x = rng.standard_normal((2, 5, 3)).astype(F32)
    want = np.matmul(float_m.weight.numpy(), x) + float_m.bias.numpy()
    if mode == "relu":
        want = np.maximum(want, 0)
    np.testing.assert_allclose(float_m(mt.tensor(x)).numpy(), want, rtol=1e-5, atol=1e-6)
    qat = QM.BatchMatMulActivation.from_float_module(float_m)
    assert qat.weight is float_m.weight and qat.nonlinear_mode == mode
    qat.set_qconfig(Q.min_max_fakequant_qconfig)
    Q.disable_fake_quant(qat)
    np.testing.assert_allclose(qat(mt.tensor(x)).numpy(), want, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="nonlinear_mode"):
        M.BatchMatMulActivation(2, 5, 3, nonlinear_mode="sigmoid")


def test_concat_gets_one_set_of_qparams():
    rng = np.random.default_rng(4)
    a, b = (rng.standard_normal((2, 3)).astype(F32) for _ in range(2))
    b *= 4
    qat = QM.Concat.from_float_module(M.Concat())
    qat.set_qconfig(Q.min_max_fakequant_qconfig)
    assert qat.weight_observer is None and qat.act_observer is not None
    got = qat([mt.tensor(a), mt.tensor(b)], 1).numpy()
    cat = np.concatenate([a, b], 1)
    s = F32(max(-cat.min(), cat.max())) / F32(127.5)
    np.testing.assert_array_equal(got, ref_fq(cat, s, -128, 127))
    np.testing.assert_array_equal(M.Concat()([mt.tensor(a), mt.tensor(b)], 0).numpy(),
                                  np.concatenate([a, b], 0))
