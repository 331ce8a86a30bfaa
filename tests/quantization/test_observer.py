"""Observers' qparams against NumPy float32 formulas (MegEngine's), the
enabled rule (eval() stops observing, the last switch wins, no observer
ignores its flag), per-channel weight scales, the histogram search, and
MegEngine's QConfig presets."""
import numpy as np
import pytest

import mgtrace as mt
import mgtrace.module as M
import mgtrace.quantization as Q
from mgtrace.quantization import QuantMode

F32 = np.float32


def t(a):
    return mt.tensor(np.asarray(a, F32))


def test_minmax_symmetric_and_asymmetric_hand_formulas():
    x = np.array([-1.0, 0.3, 2.55], F32)
    sym = Q.MinMaxObserver(dtype="qint8")
    sym(t(x))
    qp = sym.get_qparams()
    assert qp.mode is QuantMode.SYMMERTIC and qp.zero_point is None
    assert qp.scale.numpy() == F32(2.55) / F32(127.5)
    narrow = Q.MinMaxObserver(dtype="qint8_narrow")
    narrow(t(x))
    assert narrow.get_qparams().scale.numpy() == F32(2.55) / F32(127.0)
    asym = Q.MinMaxObserver(QuantMode.ASYMMERTIC, dtype="quint8")
    asym(t(x))
    qp = asym.get_qparams()
    scale = (F32(2.55) - F32(-1.0)) / F32(255)
    assert qp.scale.numpy() == scale
    assert qp.zero_point.numpy() == F32(0) - np.rint(F32(-1.0) / scale)    # 72
    assert qp.zero_point.numpy() == 72.0


def test_minmax_range_includes_zero_and_eps_floor():
    obs = Q.MinMaxObserver(QuantMode.ASYMMERTIC, dtype="quint8")
    assert obs.get_qparams().scale.numpy() == F32(1e-5)         # nothing observed
    obs(t([2.0, 3.0]))                                           # all positive: min is 0
    qp = obs.get_qparams()
    assert qp.scale.numpy() == F32(3.0) / F32(255) and qp.zero_point.numpy() == 0.0
    neg = Q.MinMaxObserver(QuantMode.ASYMMERTIC, dtype="quint8")
    neg(t([-3.0, -2.0]))                                         # all negative: zp at qmax
    assert neg.get_qparams().zero_point.numpy() == 255.0


def test_minmax_running_over_batches():
    obs = Q.MinMaxObserver()
    for batch in ([0.5, -0.25], [0.1, 0.2], [-4.0, 1.0]):
        obs(t(batch))
    assert obs.min_val.numpy() == -4.0 and obs.max_val.numpy() == 1.0
    assert list(obs.state_dict()) == ["min_val", "max_val"]


def test_per_channel_weight_scales():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((6, 3, 2, 2)).astype(F32)
    obs = Q.MinMaxObserver(dtype="qint8_narrow", axis=0)
    obs(t(w))
    qp = obs.get_qparams()
    bound = np.maximum(-np.minimum(w.min(axis=(1, 2, 3)), 0), np.maximum(w.max(axis=(1, 2, 3)), 0))
    np.testing.assert_array_equal(qp.scale.numpy(), bound / F32(127.0))
    assert qp.axis == 0
    y = Q.FakeQuantize("qint8_narrow")(t(w), qp).numpy()
    s = qp.scale.numpy().reshape(6, 1, 1, 1)
    np.testing.assert_array_equal(y, np.clip(np.rint(w / s), -127, 127) * s)
    # each channel's extreme maps to +-127 exactly
    np.testing.assert_array_equal(np.abs(np.rint(w / s)).max(axis=(1, 2, 3)), np.full(6, 127.0))


def test_per_channel_state_loads_and_sizes_are_checked():
    rng = np.random.default_rng(4)
    w = rng.standard_normal((5, 7)).astype(F32)
    obs = Q.ExponentialMovingAverageObserver(dtype="qint8_narrow", axis=0, channels=5)
    assert obs.min_val.shape == (5,)
    obs(t(w))
    np.testing.assert_array_equal(obs.min_val.numpy(), w.min(axis=1))
    fresh = Q.ExponentialMovingAverageObserver(dtype="qint8_narrow", axis=0, channels=5)
    fresh.load_state_dict(obs.state_dict())
    assert fresh.get_qparams() == obs.get_qparams()
    with pytest.raises(Q.QuantizationError, match="5 channels"):
        obs(t(w.T))
    with pytest.raises(Q.QuantizationError, match="axis=2"):
        Q.MinMaxObserver(axis=2)(t(w))
    with pytest.raises(Q.QuantizationError, match="needs axis"):
        Q.MinMaxObserver(channels=5)


def test_ema_first_batch_as_is_then_momentum():
    obs = Q.ExponentialMovingAverageObserver(momentum=0.9)
    obs(t([-1.0, 2.0]))
    assert obs.min_val.numpy() == -1.0 and obs.max_val.numpy() == 2.0
    obs(t([-3.0, 1.0]))
    m = F32(0.9)
    assert obs.min_val.numpy() == F32(-1.0) * m + (F32(1) - m) * F32(-3.0)
    assert obs.max_val.numpy() == F32(2.0) * m + (F32(1) - m) * F32(1.0)


@pytest.mark.parametrize("make", [Q.MinMaxObserver, Q.SyncMinMaxObserver,
                                  Q.ExponentialMovingAverageObserver,
                                  lambda: Q.HistogramObserver(bins=64)])
def test_observers_honour_enabled_and_eval(make):
    # MegEngine's SyncMinMaxObserver and HistogramObserver always observe; here none does
    net = M.Sequential(M.Identity(), make())
    obs = net[1]
    obs(t([1.0]))
    net.eval()                          # eval() stops observing
    assert not obs.enabled
    obs(t([5.0]))
    assert obs.max_val.numpy() == 1.0
    Q.enable_observer(net)              # ... until enabled again: calibrate in eval mode
    obs(t([2.0, -1.0]))
    seen = obs.max_val.numpy()
    assert seen > 1.0                   # 2.0, or 1.1 for the moving average
    net.train()
    Q.disable_observer(net)             # the last switch wins
    obs(t([9.0]))
    assert obs.max_val.numpy() == seen
    net.eval()
    net.train()                         # back to the mode it was disabled in: still off
    assert not obs.enabled


def test_histogram_counts_and_clips_outliers():
    rng = np.random.default_rng(1)
    a = rng.standard_normal(4000).astype(F32)
    obs = Q.HistogramObserver(bins=256)
    obs(t(a))
    np.testing.assert_array_equal(obs.histogram.numpy(),
                                  np.histogram(a.astype(np.float64), 256, (a.min(), a.max()))[0])
    b = np.concatenate([rng.standard_normal(3999).astype(F32) * 2, [60.0]]).astype(F32)
    obs(t(b))                           # wider range: the old counts are resampled
    assert obs.histogram.numpy().sum() == 8000
    assert obs.max_val.numpy() >= 60.0 and obs.min_val.numpy() <= min(a.min(), b.min())


def test_histogram_search_beats_minmax_on_heavy_tails():
    # the search minimises an L2 estimate of the quantization error: on the
    # data itself, its qparams must do at least as well as the full range
    rng = np.random.default_rng(2)
    batches = [rng.laplace(size=10000).astype(F32), rng.laplace(size=10000).astype(F32) * 1.5]
    data = np.concatenate(batches)
    hist, plain = Q.HistogramObserver(bins=512, dtype="qint4"), Q.MinMaxObserver(dtype="qint4")
    for b in batches:
        hist(t(b))
        plain(t(b))
    fq = Q.FakeQuantize("qint4")

    def mse(obs):
        return float(np.mean((fq(t(data), obs.get_qparams()).numpy() - data) ** 2))
    assert float(hist.get_qparams().scale.numpy()) < float(plain.get_qparams().scale.numpy())
    assert mse(hist) < 0.9 * mse(plain)


def test_passive_observer_takes_qparams():
    src = Q.MinMaxObserver(dtype="qint8")
    src(t([-2.0, 1.0]))
    obs = Q.PassiveObserver("qint8")
    obs.set_qparams(src.get_qparams())
    assert obs.get_qparams() == src.get_qparams()
    assert obs.orig_scale == F32(2.0) / F32(127.5)
    obs.scale = 0.5
    assert obs.get_qparams().scale.numpy() == 0.5 and obs.orig_scale != 0.5
    with pytest.raises(Q.QuantizationError, match="positive"):
        obs.scale = 0.0
    with pytest.raises(Q.QuantizationError, match="quint8"):
        Q.PassiveObserver("quint8").set_qparams(src.get_qparams())


def test_qconfig_presets_are_megengines():
    def dt(f):
        return f and f.keywords["dtype"]
    for q, kinds in [(Q.ema_fakequant_qconfig, (Q.MinMaxObserver,
                                                Q.ExponentialMovingAverageObserver)),
                     (Q.min_max_fakequant_qconfig, (Q.MinMaxObserver, Q.MinMaxObserver)),
                     (Q.calibration_qconfig, (Q.MinMaxObserver, Q.HistogramObserver)),
                     (Q.passive_qconfig, (Q.PassiveObserver, Q.PassiveObserver))]:
        assert (q.weight_observer.func, q.act_observer.func) == kinds
        assert (dt(q.weight_observer), dt(q.act_observer)) == ("qint8_narrow", "qint8")
    assert Q.calibration_qconfig.weight_fake_quant is None
    assert Q.tqt_qconfig.weight_observer is None and Q.tqt_qconfig.act_fake_quant.func is Q.TQT
    assert Q.easyquant_qconfig is Q.passive_qconfig
    low = Q.ema_lowbit_fakequant_qconfig
    assert {dt(f) for f in low} == {"qint4"}
    assert low.act_observer().qmin == -8
    with pytest.raises(Q.QuantizationError, match="factory"):
        Q.QConfig(Q.MinMaxObserver(), None, None, None)


def test_histogram_refuses_non_finite_input():
    obs = Q.HistogramObserver(bins=8)
    with pytest.raises(Q.QuantizationError, match="non-finite"):
        obs(mt.tensor(np.array([1.0, np.nan], np.float32)))


def test_histogram_is_per_tensor_only():
    with pytest.raises(Q.QuantizationError, match="per tensor only"):
        Q.HistogramObserver(axis=0)


def test_histogram_takes_a_range_grown_by_orders_of_magnitude():
    """[-0.5, 0.5] then [-3e38, 3e38]: resampling the old counts laid out a
    fine grid of 2048 * 2**128 bins (NumPy's 'Maximum allowed dimension
    exceeded'); the old counts now go to the new bins they overlap."""
    obs = Q.HistogramObserver(bins=8)
    obs(t(np.array([0.5, -0.5, 0.25], F32)))
    obs(t(np.array([3e38, -3e38], F32)))
    h = obs.histogram.numpy().astype(np.float64)
    # 8 bins over [-3e38, 3e38]: the old three values near 0 fall on the
    # edge between bins 3 and 4 (split by their overlap); the new ones in 0 and 7
    assert h.sum() == 5 and h[0] == 1 and h[7] == 1 and h[3] + h[4] == 3
    assert h[1] == h[2] == h[5] == h[6] == 0
    s = float(obs.get_qparams().scale.numpy())
    assert np.isfinite(s) and s > 0


def test_histogram_resampling_by_overlap_matches_the_fine_grid(monkeypatch):
    # the overlap spread (used past the fine grid's memory bound) and the
    # fine grid give the same counts within the grid's rounding
    from mgtrace.quantization import observer
    rng = np.random.default_rng(4)
    a, b = rng.standard_normal(3000).astype(F32), rng.standard_normal(3000).astype(F32) * 5
    grid, spread = Q.HistogramObserver(bins=64), Q.HistogramObserver(bins=64)
    for x in (a, b):
        grid(t(x))
    monkeypatch.setattr(observer, "_FINE_MAX", 0)
    for x in (a, b):
        spread(t(x))
    g, s = grid.histogram.numpy().astype(np.float64), spread.histogram.numpy().astype(np.float64)
    assert g.sum() == 6000 and abs(s.sum() - 6000) < 1e-3     # fractional counts in float32
    # the grid rounds the old range's place to its fine bins (an old bin's
    # count / upsample_rate each): at any edge, the two differ by less than
    # the largest fine bin
    first = np.histogram(a.astype(np.float64), 64, (a.min(), a.max()))[0]
    assert np.abs(np.cumsum(g) - np.cumsum(s)).max() < first.max() / grid.upsample_rate
