"""Gradients of fake quantization (issue 32, item 8): the straight-through
gradient of FakeQuantize and the learned-scale gradients of TQT and LSQ,
against the rules written out in NumPy float64 (MegEngine's kernels'
formulas) and, where the surrogate is the true derivative (saturated
values), against central finite differences."""
import numpy as np
import pytest

import mgtrace as mt
import mgtrace.module as M
import mgtrace.module.qat as QM
import mgtrace.quantization as Q
from mgtrace.autodiff import GradManager

F32 = np.float32


def _x(rng, n=64, spread=3.0):
    x = rng.uniform(-spread, spread, n).astype(F32)
    x[:4] = [0.25, -0.25, 0.75, 100.0]          # .5 ties at scale 0.5, and a saturated value
    return x


def test_fake_quantize_gradient_is_straight_through_inside_the_range():
    rng = np.random.default_rng(0)
    x = _x(rng)
    w = rng.standard_normal(x.shape).astype(F32)
    qp = Q.create_qparams(Q.QuantMode.ASYMMERTIC, "quint8", scale=0.02, zero_point=100.0)
    xt = mt.tensor(x)
    gm = GradManager().attach([xt])
    with gm:
        y = Q.fake_quant_tensor(xt, qp)
        gm.backward((y * mt.tensor(w)).sum())
    q = np.rint(x / F32(0.02)) + 100
    inside = (q >= 0) & (q <= 255)
    assert 0 < inside.sum() < x.size
    np.testing.assert_array_equal(xt.grad.numpy(), np.where(inside, w, F32(0)))
    # the forward is unchanged: quantize then dequantize, bitwise
    np.testing.assert_array_equal(
        y.numpy(), ((np.clip(q, 0, 255) - F32(100)) * F32(0.02)).astype(F32))


def _tqt_reference(x, log2s, dy, qmin, qmax):
    t = 2.0 ** np.float64(log2s)
    v = x.astype(np.float64) / t
    q = np.clip(np.rint(v), qmin, qmax)
    clipped = (v < qmin - 0.5) | (v > qmax + 0.5)
    gx = np.where(clipped, 0.0, dy)
    gs = np.sum(dy * np.where(clipped, q, q - v) * t * np.log(2.0))
    return gx, gs


def test_tqt_gradients_match_megengines_rule():
    rng = np.random.default_rng(1)
    x = _x(rng, spread=40.0)
    dy = rng.standard_normal(x.shape)
    tqt = Q.TQT("qint8")
    tqt.set_qparams(Q.create_qparams(Q.QuantMode.SYMMERTIC, "qint8", scale=0.25))
    xt = mt.tensor(x)
    gm = GradManager().attach([xt, tqt.scale])
    with gm:
        gm.backward((tqt(xt) * mt.tensor(dy.astype(F32))).sum())
    gx, gs = _tqt_reference(x, tqt.scale.numpy(), dy.astype(F32).astype(np.float64), -128, 127)
    np.testing.assert_allclose(xt.grad.numpy(), gx, rtol=0, atol=0)
    np.testing.assert_allclose(tqt.scale.grad.numpy(), gs, rtol=1e-4)


@pytest.mark.parametrize("zp", [0.0, 3.0])
def test_lsq_step_gradient_matches_the_rule_and_finite_differences(zp):
    rng = np.random.default_rng(2)
    x = _x(rng, spread=2.0)
    dy = rng.standard_normal(x.shape).astype(F32)
    lsq = Q.LSQ("quint8" if zp else "qint8")
    mode = Q.QuantMode.ASYMMERTIC if zp else Q.QuantMode.SYMMERTIC
    lsq.set_qparams(Q.create_qparams(mode, lsq.dtype, scale=0.01,
                                     zero_point=zp if zp else None))
    xt = mt.tensor(x)
    gm = GradManager().attach([xt, lsq.step_size])
    with gm:
        gm.backward((lsq(xt) * mt.tensor(dy)).sum())
    step = np.float64(abs(lsq.step_size.numpy()) + lsq.eps.numpy())
    qmin, qmax = lsq.qmin, lsq.qmax
    u = x.astype(np.float64) / step + zp
    small, big = u < qmin, u > qmax
    inside = ~(small | big)
    d = np.where(inside, np.rint(u) - u, np.where(small, qmin - zp, qmax - zp))
    np.testing.assert_array_equal(xt.grad.numpy(), np.where(inside, dy, F32(0)))
    want = np.sum(dy.astype(np.float64) * d) * np.sign(lsq.step_size.numpy())
    np.testing.assert_allclose(lsq.step_size.grad.numpy(), want, rtol=1e-4)

    # saturated values only: y = (qmin - zp) * step exactly, so the surrogate is
    # the true derivative; central differences of the float64 forward agree
    sat = x[np.abs(u - zp) > 300]
    assert sat.size
    def f(s):
        return np.sum((np.clip(np.rint(sat / s) + zp, qmin, qmax) - zp) * s)
    fd = (f(step + 1e-6) - f(step - 1e-6)) / 2e-6
    st = mt.tensor(sat)
    gm = GradManager().attach([lsq.step_size])
    lsq.step_size.grad = None
    with gm:
        gm.backward(lsq(st).sum())
    np.testing.assert_allclose(lsq.step_size.grad.numpy(), fd, rtol=1e-5)


def test_qat_linear_with_learned_scales_trains():
    """A QAT Linear with LSQ weight and activation fake quantizers fits a
    linear map by SGD: the loss falls by more than 10x, the steps move."""
    from mgtrace.optimizer import SGD
    mt.random.seed(3)
    rng = np.random.default_rng(3)
    x = mt.tensor(rng.standard_normal((64, 8)).astype(F32))
    true_w = rng.standard_normal((4, 8)).astype(F32)
    target = mt.tensor(x.numpy() @ true_w.T)
    lin = QM.Linear.from_float_module(M.Linear(8, 4))
    lin.set_qconfig(Q.QConfig(weight_observer=None, act_observer=None,
                              weight_fake_quant=lambda: Q.LSQ("qint8_narrow"),
                              act_fake_quant=lambda: Q.LSQ("qint8")))
    lin.weight_fake_quant.set_qparams(Q.create_qparams(Q.QuantMode.SYMMERTIC, "qint8_narrow", 0.02))
    lin.act_fake_quant.set_qparams(Q.create_qparams(Q.QuantMode.SYMMERTIC, "qint8", 0.1))
    steps0 = float(lin.act_fake_quant.step_size.numpy())
    params = list(lin.parameters())
    opt = SGD(params, lr=0.02)
    gm = GradManager().attach(params)
    losses = []
    for _ in range(150):
        with gm:
            loss = ((lin(x) - target) ** 2).mean()
            gm.backward(loss)
        opt.step()
        opt.clear_grad()
        losses.append(float(loss.numpy()))
    assert losses[-1] < losses[0] / 10
    assert float(lin.act_fake_quant.step_size.numpy()) != steps0
