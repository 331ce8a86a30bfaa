"""Quantized Linear / Conv2d repack their weights when the weight changes
(the breaker's case): the packed copy was keyed by the ids of weight,
weight_scale and bias, so a weight assigned after the packed one was freed
could take its id and run with the old packed values, and an in-place write
(``m.weight[...] = v``) was never seen. Outputs against the integer
reference of the current weight."""
import numpy as np
import pytest

import mgtrace as mt
import mgtrace.module.quantized as QM
from mgtrace.quantization import QuantMode
from mgtrace.quantization.qtensor import create_qparams, quantize

F32 = np.float32


def _out():
    return create_qparams(QuantMode.ASYMMERTIC, "quint8", mt.tensor(F32(0.05)), mt.tensor(F32(128)))


def _ref(m, xq, w):
    """rint(acc * x_scale * w_scale / 0.05) + 128 of the 1x1 conv / linear."""
    x = xq.numpy().astype(np.int64) - 128
    wk = w.reshape(w.shape[0], -1).astype(np.int64)
    acc = np.einsum("nk...,ok->no...", x, wk) if x.ndim > 2 else x @ wk.T
    b = np.rint(m.bias.numpy().astype(np.float64) / (np.float64(F32(0.02)) * np.float64(F32(0.01))))
    acc = acc + b.reshape((-1,) + (1,) * (acc.ndim - 2))
    return np.clip(np.rint(acc * (np.float64(F32(0.02)) * np.float64(F32(0.01)) / np.float64(F32(0.05))))
                   + 128, 0, 255)


@pytest.mark.parametrize("kind", ["linear", "conv"])
def test_weight_changes_are_seen(kind):
    rng = np.random.default_rng(0)
    if kind == "linear":
        m, shape, wshape = QM.Linear(4, 3, act_qparams=_out()), (2, 4), (3, 4)
    else:
        m, shape, wshape = QM.Conv2d(4, 3, 1, act_qparams=_out()), (2, 4, 3, 3), (3, 4, 1, 1)
    m.weight_scale = mt.tensor(F32(0.01))
    m.bias = mt.tensor(rng.standard_normal(3).astype(F32))
    x = quantize(mt.tensor(rng.standard_normal(shape).astype(F32)), dtype="quint8", scale=0.02,
                 zero_point=128)
    ws = [rng.integers(-127, 128, wshape).astype(np.int8) for _ in range(3)]
    m.weight = mt.tensor(ws[0])
    np.testing.assert_array_equal(m(x).numpy(), _ref(m, x, ws[0]))
    # two assignments between calls: the second may take the first packed weight's id
    m.weight = mt.tensor(ws[1])
    m.weight = mt.tensor(ws[2])
    np.testing.assert_array_equal(m(x).numpy(), _ref(m, x, ws[2]))
    m.weight[...] = mt.tensor(ws[0])          # in place
    np.testing.assert_array_equal(m(x).numpy(), _ref(m, x, ws[0]))
    m.bias[...] = mt.tensor(np.zeros(3, F32))
    np.testing.assert_array_equal(m(x).numpy(), _ref(m, x, ws[0]))
