"""What a quantized Conv2d keeps between calls (its checked kernel call per
input, the output's qparams, the last input's parsed qparams) follows every
change that matters: a new weight, new output qparams, ReLU switched on, an
input of other qparams or shape, a signed input. References: the NumPy
integer pipeline (int64 accumulation, float64 requantization, round half
to even)."""
import numpy as np

import mgtrace as mt
import mgtrace.module.quantized as MQ
from mgtrace.quantization.qtensor import quantize
from mgtrace.quantization.utils import QuantMode, create_qparams, quant_dtype

from .test_int8_kernels import ref_conv, ref_requant


def _qp(dtype, scale, zp=0):
    meta = quant_dtype(dtype)
    if meta.is_unsigned:
        return create_qparams(QuantMode.ASYMMERTIC, meta, scale, float(zp))
    return create_qparams(QuantMode.SYMMERTIC, meta, scale)


def _want(xq, x_zp, x_scale, w, w_scale, out_scale, out_zp, relu, dtype=np.uint8):
    acc = ref_conv(xq.astype(np.int64), x_zp, w, 1, (1, 1), (1, 1), (1, 1))
    mult = np.float64(np.float32(x_scale)) * np.float64(np.float32(w_scale)) / \
        np.float64(np.float32(out_scale))
    info = np.iinfo(dtype)
    return ref_requant(acc, mult, out_zp, max(info.min, out_zp) if relu else info.min,
                       info.max, dtype)


def test_cached_call_follows_weight_qparams_relu_and_input():
    rng = np.random.default_rng(5)
    m = MQ.Conv2d(6, 5, 3, padding=1, bias=False, act_qparams=_qp("quint8", 0.05, 120))
    w = rng.integers(-127, 128, (5, 6, 3, 3)).astype(np.int8)
    m.weight, m.weight_scale = mt.tensor(w), mt.tensor(np.float32(0.01))
    xf = rng.standard_normal((1, 6, 7, 9)).astype(np.float32)
    qa = _qp("quint8", 0.04, 131)
    xa = quantize(mt.tensor(xf), qa)
    xq = np.asarray(xa.numpy())
    got = np.asarray(m(xa).numpy())
    np.testing.assert_array_equal(got, _want(xq, 131, 0.04, w, 0.01, 0.05, 120, False))
    np.testing.assert_array_equal(np.asarray(m(xa).numpy()), got)      # the kept call

    w2 = rng.integers(-127, 128, (5, 6, 3, 3)).astype(np.int8)          # a new weight
    m.weight = mt.tensor(w2)
    np.testing.assert_array_equal(np.asarray(m(xa).numpy()),
                                  _want(xq, 131, 0.04, w2, 0.01, 0.05, 120, False))

    m.act_qparams = _qp("quint8", 0.2, 3)                               # new output qparams
    y = m(xa)
    assert abs(float(np.asarray(y.qparams.scale.numpy())) - 0.2) < 1e-7
    np.testing.assert_array_equal(np.asarray(y.numpy()),
                                  _want(xq, 131, 0.04, w2, 0.01, 0.2, 3, False))

    m.__class__ = MQ.ConvRelu2d                                         # ReLU on
    np.testing.assert_array_equal(np.asarray(m(xa).numpy()),
                                  _want(xq, 131, 0.04, w2, 0.01, 0.2, 3, True))

    # inputs of two qparams in turn, then another shape, then a signed input
    qb = _qp("quint8", 0.1, 7)
    xb = quantize(mt.tensor(xf), qb)
    for x, q, zp, s in [(xb, qb, 7, 0.1), (xa, qa, 131, 0.04), (xb, qb, 7, 0.1)]:
        np.testing.assert_array_equal(np.asarray(m(x).numpy()),
                                      _want(np.asarray(x.numpy()), zp, s, w2, 0.01, 0.2, 3, True))
    xc = quantize(mt.tensor(xf[:, :, :4, :5]), qa)
    np.testing.assert_array_equal(np.asarray(m(xc).numpy()),
                                  _want(np.asarray(xc.numpy()), 131, 0.04, w2, 0.01, 0.2, 3, True))
    qs = _qp("qint8", 0.03)
    xs = quantize(mt.tensor(xf), qs)
    assert np.asarray(xs.numpy()).dtype == np.int8
    np.testing.assert_array_equal(np.asarray(m(xs).numpy()),
                                  _want(np.asarray(xs.numpy()), 0, 0.03, w2, 0.01, 0.2, 3, True))


def test_packed_weight_follows_a_groups_change():
    # the same int8 [4, 2, 3, 3] weight read as 2 groups of a 4-channel
    # input, then as one group of a 2-channel input, then 2 groups again: the
    # packed copy follows m.groups (it was keyed by the tensors alone)
    rng = np.random.default_rng(9)
    m = MQ.Conv2d(4, 4, 3, padding=1, groups=2, bias=False,
                  act_qparams=_qp("quint8", 0.05, 120))
    w = rng.integers(-127, 128, (4, 2, 3, 3)).astype(np.int8)
    m.weight, m.weight_scale = mt.tensor(w), mt.tensor(np.float32(0.01))
    qa = _qp("quint8", 0.04, 131)
    for groups in (2, 1, 2):
        m.groups, m.in_channels = groups, 2 * groups
        xa = quantize(mt.tensor(rng.standard_normal((1, 2 * groups, 6, 5)).astype(np.float32)), qa)
        xq = np.asarray(xa.numpy()).astype(np.int64)
        acc = ref_conv(xq, 131, w, groups, (1, 1), (1, 1), (1, 1))
        mult = np.float64(np.float32(0.04)) * np.float64(np.float32(0.01)) / \
            np.float64(np.float32(0.05))
        want = ref_requant(acc, mult, 120, 0, 255, np.uint8)
        np.testing.assert_array_equal(np.asarray(m(xa).numpy()), want)
