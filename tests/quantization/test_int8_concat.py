"""Int8 concat on the integers (qelemwise.c, MegEngine's quantized Concat):
each input requantized to the output's qparams, bitwise a NumPy float32
reference of dequantize / quantize (exact .5 ties of both signs,
saturation, zero points at both ends of uint8, mixed int8 / uint8 inputs,
inputs that already have the output's qparams, any axis, views, rows
split over threads), and the same bits as the dequantize / concat /
quantize passes it replaces."""
import numpy as np
import pytest

import mgtrace as mt
import mgtrace.functional as F
import mgtrace.module.quantized as MQ
from mgtrace.quantization.qtensor import dequantize, is_quantized, qparams_of, quantize
from mgtrace.quantization.utils import QuantMode, create_qparams, quant_dtype

F32 = np.float32


def _qp(dtype, scale, zp=0):
    signed = dtype == "qint8"
    return create_qparams(QuantMode.SYMMERTIC if signed else QuantMode.ASYMMERTIC,
                          quant_dtype(dtype), mt.tensor(F32(scale)),
                          None if signed else mt.tensor(F32(zp)))


def _ref(q, s, z, so, zo, lo, hi):
    """Dequantize then quantize, each step in float32, round half to even."""
    v = (q.astype(F32) - F32(z)) * F32(s)
    return np.clip(np.rint(v / F32(so)) + F32(zo), lo, hi)


def _ints(t):
    return np.asarray(t.numpy())


CASES = [   # inputs (dtype, scale, zp, size along axis), output (dtype, scale, zp)
    ([("qint8", 0.05, 0, 3), ("quint8", 0.03, 100, 5)], ("quint8", 0.04, 120)),
    ([("quint8", 0.1, 0, 2), ("quint8", 0.1, 255, 4), ("qint8", 0.2, 0, 1)],
     ("qint8", 0.07, 0)),                                    # zero points at both ends
    ([("quint8", 0.1, 7, 4), ("quint8", 0.1, 7, 2)], ("quint8", 0.1, 7)),   # the identity
    ([("qint8", 0.3, 0, 2), ("quint8", 0.5, 9, 3)], ("qint8", 1e-3, 0)),    # saturates
]


@pytest.mark.parametrize("case", range(len(CASES)))
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_concat_is_the_requantized_inputs_side_by_side(case, axis):
    ins, (od, so, zo) = CASES[case]
    rng = np.random.default_rng(case * 3 + axis + 1)
    xs = []
    for dt, s, z, k in ins:
        shape = [2, 3, 4]
        shape[axis] = k
        xs.append(quantize(mt.tensor((rng.standard_normal(shape) * 4).astype(F32)),
                           _qp(dt, s, z)))
    m = MQ.Concat(_qp(od, so, zo))
    got = m._concat_on_integers(xs, axis)
    assert got is not None                      # the integer path ran
    assert is_quantized(got) and qparams_of(got) == m.act_qparams
    meta = quant_dtype(od)
    want = np.concatenate([_ref(_ints(x), s, z, so, zo, meta.qmin, meta.qmax)
                           for x, (_, s, z, _) in zip(xs, ins)], axis)
    np.testing.assert_array_equal(_ints(got), want)
    np.testing.assert_array_equal(_ints(m(xs, axis)), want)
    floats = quantize(F.concat([dequantize(x) for x in xs], axis), m.act_qparams)
    np.testing.assert_array_equal(_ints(got), _ints(floats))


def test_ties_round_half_to_even_on_both_signs():
    # scale 1 -> 2: q / 2 with q = 1, 3, -1, -3, 5 gives 0, 2, 0, -2, 2
    x = quantize(mt.tensor(np.array([1, 3, -1, -3, 5], F32)), _qp("qint8", 1.0))
    got = MQ.Concat(_qp("qint8", 2.0))([x, x], 0)
    np.testing.assert_array_equal(_ints(got), [0, 2, 0, -2, 2] * 2)
    # into uint8 with zero point 128: the same shifted
    got = MQ.Concat(_qp("quint8", 2.0, 128))([x], 0)
    np.testing.assert_array_equal(_ints(got).astype(int), np.array([0, 2, 0, -2, 2]) + 128)


def test_views_and_rows_over_threads():
    rng = np.random.default_rng(7)
    a = quantize(mt.tensor(rng.standard_normal((64, 40, 33)).astype(F32)), _qp("qint8", 0.04))
    b = quantize(mt.tensor(rng.standard_normal((64, 33, 40)).astype(F32)),
                 _qp("quint8", 0.02, 131))
    bt = b.transpose(0, 2, 1)                   # a view, not contiguous
    m = MQ.Concat(_qp("quint8", 0.03, 128))
    got = m([a, bt], 1)
    meta = quant_dtype("quint8")
    want = np.concatenate([_ref(_ints(a), 0.04, 0, 0.03, 128, meta.qmin, meta.qmax),
                           _ref(_ints(bt), 0.02, 131, 0.03, 128, meta.qmin, meta.qmax)], 1)
    np.testing.assert_array_equal(_ints(got), want)


def test_other_inputs_take_the_float_passes():
    rng = np.random.default_rng(8)
    q = quantize(mt.tensor(rng.standard_normal((2, 3)).astype(F32)), _qp("qint8", 0.05))
    f = mt.tensor(rng.standard_normal((2, 3)).astype(F32))
    m = MQ.Concat(_qp("qint8", 0.05))
    assert m._concat_on_integers([q, f], 0) is None
    want = _ref(np.concatenate([_ints(q), np.rint(_ints(f) / F32(0.05))]), 1.0, 0, 1.0, 0,
                -128, 127)
    np.testing.assert_array_equal(_ints(m([q, f], 0)), want)
    with pytest.raises(ValueError):
        m([q, quantize(mt.tensor(np.zeros((2, 4), F32)), _qp("qint8", 0.05))], 0)
