"""Quantized Elemwise add / fuse_add_relu on the integers (qelemwise.c):
bitwise equal to the module's dequantize / add / quantize passes and to a
NumPy float32 reference, on both paths, with exact .5 ties (round half to
even), saturation at both ends, zero points at both ends, int8 and uint8
inputs mixed, sizes across the 16-lane tail and the 65536-element chunks;
broadcasting inputs take the float passes."""
import numpy as np
import pytest

import mgtrace as mt
import mgtrace.module.quantized as MQ
from mgtrace._core import qint8
from mgtrace.quantization.qtensor import dequantize, quantize
from mgtrace.quantization.utils import QuantMode, create_qparams, quant_dtype

F32 = np.float32


def _qp(dtype, scale, zp=0):
    meta = quant_dtype(dtype)
    if meta.is_unsigned:
        return create_qparams(QuantMode.ASYMMERTIC, meta, scale, float(zp))
    return create_qparams(QuantMode.SYMMERTIC, meta, scale)


def _ref(qa, sa, za, qb, sb, zb, so, zo, lo, hi, relu):
    v = (qa.astype(F32) - F32(za)) * F32(sa) + (qb.astype(F32) - F32(zb)) * F32(sb)
    if relu:
        v = np.maximum(v, F32(0))
    return np.clip(np.rint(v / F32(so)) + F32(zo), lo, hi)


CASES = [   # (a dtype, a scale, a zp, b dtype, b scale, b zp, out dtype, out scale, out zp)
    ("quint8", 1.0, 0, "quint8", 1.0, 255, "quint8", 2.0, 128),     # ties, zero points at the ends
    ("qint8", 0.05, 0, "quint8", 0.02, 131, "quint8", 0.03, 0),      # mixed storage, saturation
    ("quint8", 0.1, 7, "qint8", 0.3, 0, "qint8", 1e-3, 0),           # a tiny scale: saturates
]


@pytest.mark.parametrize("case", range(len(CASES)))
@pytest.mark.parametrize("method", ["add", "fuse_add_relu", "ADD"])
@pytest.mark.parametrize("n", [37, 70001])
def test_integer_add_matches_the_float_passes_and_numpy(case, method, n):
    ad, sa, za, bd, sb, zb, od, so, zo = CASES[case]
    rng = np.random.default_rng(case * 10 + n % 7)
    xa = quantize(mt.tensor((rng.standard_normal(n) * 4).astype(F32)), _qp(ad, sa, za))
    xb = quantize(mt.tensor((rng.standard_normal(n) * 4).astype(F32)), _qp(bd, sb, zb))
    m = MQ.Elemwise(method, _qp(od, so, zo))
    got = m(xa, xb)
    assert got.dtype == m(xa, xb).dtype and np.asarray(got.numpy()).dtype == (
        np.uint8 if od == "quint8" else np.int8)
    floats = quantize(m.float_op(dequantize(xa), dequantize(xb)), m.act_qparams)
    np.testing.assert_array_equal(np.asarray(got.numpy()), np.asarray(floats.numpy()))
    meta = quant_dtype(od)
    want = _ref(np.asarray(xa.numpy()), sa, za, np.asarray(xb.numpy()), sb, zb, so, zo,
                meta.qmin, meta.qmax, method == "fuse_add_relu")
    np.testing.assert_array_equal(np.asarray(got.numpy()), want)
    # both paths of the kernel
    for path in (0, 1):
        out = quantize(mt.tensor(np.zeros(n, F32)), m.act_qparams)
        used = qint8.add_into(xa, xb, out, sa, za, sb, zb, so, zo, meta.qmin, meta.qmax,
                              method == "fuse_add_relu", path)
        assert used in ((1,) if path else (1, 2))
        np.testing.assert_array_equal(np.asarray(out.numpy()), want)


def test_ties_round_half_to_even():
    # (a - 0) * 1 + (b - 0) * 1 = 1, 3, 5, 7 over 2: 0.5, 1.5, 2.5, 3.5 -> 0, 2, 2, 4
    xa = quantize(mt.tensor(np.array([1, 2, 3, 4], F32)), _qp("quint8", 1.0, 0))
    xb = quantize(mt.tensor(np.array([0, 1, 2, 3], F32)), _qp("quint8", 1.0, 0))
    y = MQ.Elemwise("add", _qp("quint8", 2.0, 0))(xa, xb)
    assert np.asarray(y.numpy()).tolist() == [0, 2, 2, 4]


def test_broadcasting_inputs_take_the_float_passes():
    xa = quantize(mt.tensor(np.arange(6, dtype=F32).reshape(2, 3)), _qp("quint8", 0.5, 3))
    xb = quantize(mt.tensor(np.array([1.0, -2.0, 0.25], F32)), _qp("qint8", 0.25))
    m = MQ.Elemwise("fuse_add_relu", _qp("quint8", 0.5, 10))
    got = np.asarray(m(xa, xb).numpy())
    want = _ref(np.asarray(xa.numpy()), 0.5, 3, np.asarray(xb.numpy())[None], 0.25, 0, 0.5, 10,
                0, 255, True)
    np.testing.assert_array_equal(got, want)
