"""An empty batch (a zero-sized axis) has no min or max: MinMaxObserver and
the EMA observer skip it, as HistogramObserver does, and keep their state."""
import numpy as np
import pytest

import mgtrace as mt
import mgtrace.quantization as Q


@pytest.mark.parametrize("make", [lambda: Q.MinMaxObserver(dtype="qint8"),
                                  lambda: Q.ExponentialMovingAverageObserver(dtype="qint8"),
                                  lambda: Q.MinMaxObserver(dtype="qint8", axis=0, channels=2)])
def test_an_empty_batch_is_skipped(make):
    obs = make()
    obs(mt.tensor(np.array([[-1.0, 0.5], [2.55, 0.0]], np.float32)))
    obs(mt.tensor(np.zeros((2, 0), np.float32)))
    scale = obs.get_qparams().scale.numpy()
    # max |x| / 127.5 per tensor, or per row: rows [-1, 0.5] and [2.55, 0]
    want = np.float32(2.55) / np.float32(127.5) if obs.axis is None else \
        np.array([1.0, 2.55], np.float32) / np.float32(127.5)
    np.testing.assert_allclose(scale, want, rtol=1e-6)
    fresh = make()
    fresh(mt.tensor(np.zeros((0,), np.float32)) if obs.axis is None else
          mt.tensor(np.zeros((2, 0), np.float32)))
    np.testing.assert_array_equal(fresh.get_qparams().scale.numpy(), np.float32(1e-5))
