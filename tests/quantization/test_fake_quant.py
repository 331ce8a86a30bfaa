"""Fake quantization equals quantize-then-dequantize against a NumPy integer
reference, bitwise: round half to even, saturation, zero points at both
ends of the range, tiny scales, per-channel scales; TQT and LSQ forwards."""
import numpy as np
import pytest

import mgtrace as mt
import mgtrace.quantization as Q
from mgtrace.quantization import QuantMode

F32 = np.float32
SMALL = ["qint8", "qint8_narrow", "quint8", "qint4", "quint4"]


def ref_fake_quant(x, scale, zero_point, qmin, qmax, axis=None):
    """Integer quantize (ONNX QuantizeLinear: rint(x / s) + zp, saturated),
    then dequantize, in NumPy."""
    scale = np.asarray(scale, F32)
    zero_point = np.asarray(zero_point, np.int64)
    if axis is not None:
        shape = [1] * x.ndim
        shape[axis] = -1
        scale, zero_point = scale.reshape(shape), zero_point.reshape(shape)
    with np.errstate(over="ignore"):
        r = np.rint(x / scale)                               # float32, half to even
    q = np.clip(r.astype(np.float64) + zero_point, qmin, qmax).astype(np.int64)
    return (q - zero_point).astype(F32) * scale


def fq(x, mode, dtype, scale, zero_point=None, axis=None):
    qp = Q.create_qparams(mode, dtype, scale=np.asarray(scale, F32),
                          zero_point=None if zero_point is None
                          else np.asarray(zero_point, F32), axis=axis)
    return Q.fake_quant_tensor(mt.tensor(x), qp).numpy()


def test_ties_round_half_to_even_hand_computed():
    # x / 0.5 = 0.5, 1.5, 2.5, -0.5, -1.5, -2.5 exactly
    x = np.array([0.25, 0.75, 1.25, -0.25, -0.75, -1.25], F32)
    y = fq(x, QuantMode.SYMMERTIC, "qint8", 0.5)
    np.testing.assert_array_equal(y, np.array([0.0, 1.0, 1.0, 0.0, -1.0, -1.0], F32))
    # with zero point 3 the tie is broken on x / s, before the zero point is added
    y = fq(x, QuantMode.ASYMMERTIC, "quint8", 0.5, 3)
    np.testing.assert_array_equal(y, np.array([0.0, 1.0, 1.0, 0.0, -1.0, -1.0], F32))


def test_saturates_at_qmin_qmax_hand_computed():
    x = np.array([-1000.0, -128.0, -127.6, 126.6, 127.0, 1000.0], F32)
    np.testing.assert_array_equal(fq(x, QuantMode.SYMMERTIC, "qint8", 1.0),
                                  np.array([-128, -128, -128, 127, 127, 127], F32))
    np.testing.assert_array_equal(fq(x, QuantMode.SYMMERTIC, "qint8_narrow", 1.0),
                                  np.array([-127, -127, -127, 127, 127, 127], F32))
    np.testing.assert_array_equal(fq(x, QuantMode.SYMMERTIC, "qint4", 1.0),
                                  np.array([-8, -8, -8, 7, 7, 7], F32))


@pytest.mark.parametrize("dtype", SMALL)
@pytest.mark.parametrize("scale", [0.0173, 1e-30, 3.0e-8, 2.0 ** -20, 7.5])
def test_random_bitwise_equal_to_integer_reference(dtype, scale):
    meta = Q.QUANT_DTYPES[dtype]
    rng = np.random.default_rng(hash((dtype, scale)) % 2 ** 32)
    s = F32(scale)
    # values around the whole range, exact ties, and far outside it
    k = rng.integers(meta.qmin - 20, meta.qmax + 20, size=300)
    x = np.concatenate([rng.uniform(-1.3, 1.3, 500).astype(F32) * s * max(-meta.qmin, meta.qmax),
                        (k + F32(0.5)).astype(F32) * s,
                        np.array([0.0, -0.0, 1e30, -1e30], F32)])
    zps = [0] if not meta.is_unsigned else [meta.qmin, meta.qmax, (meta.qmin + meta.qmax) // 2]
    for zp in zps:
        mode = QuantMode.ASYMMERTIC if meta.is_unsigned else QuantMode.SYMMERTIC
        got = fq(x, mode, dtype, s, zp if meta.is_unsigned else None)
        want = ref_fake_quant(x, s, zp, meta.qmin, meta.qmax)
        np.testing.assert_array_equal(got.view(np.int32), want.view(np.int32))


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_per_channel_bitwise(axis):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((4, 5, 3)).astype(F32)
    c = x.shape[axis]
    scale = rng.uniform(0.001, 0.05, c).astype(F32)
    zp = rng.integers(0, 256, c)
    got = fq(x, QuantMode.ASYMMERTIC, "quint8", scale, zp, axis=axis)
    np.testing.assert_array_equal(got, ref_fake_quant(x, scale, zp, 0, 255, axis=axis % 3))


def test_fake_quantize_module_checks_dtype_and_switches():
    obs = Q.MinMaxObserver(dtype="qint8")
    x = mt.tensor(np.linspace(-3, 2, 37).astype(F32))
    obs(x)
    qp = obs.get_qparams()
    f = Q.FakeQuantize("qint8")
    want = ref_fake_quant(x.numpy(), qp.scale.numpy(), 0, -128, 127)
    np.testing.assert_array_equal(f(x, qp).numpy(), want)
    with pytest.raises(Q.QuantizationError, match="qint8_narrow"):
        Q.FakeQuantize("qint8_narrow")(x, qp)
    with pytest.raises(Q.QuantizationError, match="needs qparams"):
        f(x)
    Q.disable_fake_quant(f)
    assert f(x, qp) is x
    Q.enable_fake_quant(f)
    np.testing.assert_array_equal(f(x, qp).numpy(), want)


def test_unknown_dtype_names_the_known_ones():
    with pytest.raises(Q.QuantizationError, match="Did you mean 'qint8'"):
        Q.FakeQuantize("qint9")
    with pytest.raises(ValueError):
        Q.MinMaxObserver(dtype="int8")


def test_tqt_power_of_two_step_from_observer():
    x = np.array([-0.9, 0.1, 0.5, 0.77, 0.3], F32)
    obs = Q.MinMaxObserver(dtype="qint8_narrow")
    obs(mt.tensor(x))
    tqt = Q.TQT("qint8_narrow")
    assert float(tqt.get_qparams().scale.numpy()) == 1.0        # log2 step 0
    tqt.set_qparams(obs.get_qparams())
    step = tqt.get_qparams().scale.numpy()
    np.testing.assert_allclose(step, np.float32(0.9) / np.float32(127), rtol=1e-6)
    np.testing.assert_array_equal(tqt(mt.tensor(x)).numpy(),
                                  ref_fake_quant(x, step, 0, -127, 127))
    with pytest.raises(Q.QuantizationError, match="symmetric"):
        tqt.set_qparams(Q.create_qparams(QuantMode.ASYMMERTIC, "qint8_narrow", 0.1, 3))


def test_lsq_step_and_zero_point_from_qparams():
    x = np.array([-0.4, 0.0, 0.5, 1.7, 3.1], F32)
    lsq = Q.LSQ("quint8")
    scale = F32(0.0125)
    lsq.set_qparams(Q.create_qparams(QuantMode.ASYMMERTIC, "quint8", scale, 40.0))
    step = (scale - F32(1e-5)) + F32(1e-5)          # |step_size| + eps
    assert lsq.step_size.numpy() == scale - F32(1e-5)
    np.testing.assert_array_equal(lsq(mt.tensor(x)).numpy(),
                                  ref_fake_quant(x, step, 40, 0, 255))
    qp = lsq.get_qparams()
    assert isinstance(qp, Q.LSQParams) and qp.mode is QuantMode.ASYMMERTIC
    assert float(qp.zero_point.numpy()) == 40.0


def test_quant_dtype_table_is_megengines():
    got = {n: (m.qmin, m.qmax, m.is_unsigned) for n, m in Q.QUANT_DTYPES.items()}
    assert got == {"qint8": (-128, 127, False), "qint8_narrow": (-127, 127, False),
                   "quint8": (0, 255, True), "qint4": (-8, 7, False),
                   "quint4": (0, 15, True), "qint32": (-2 ** 31, 2 ** 31 - 1, False)}
    assert QuantMode.SYMMETRIC is QuantMode.SYMMERTIC


def test_tqt_and_lsq_refuse_per_channel_qparams():
    qp = Q.create_qparams(QuantMode.SYMMERTIC, "qint8_narrow", np.array([0.1, 0.2], F32), axis=0)
    for make in (Q.TQT, Q.LSQ):
        with pytest.raises(Q.QuantizationError, match="per tensor"):
            make("qint8_narrow").set_qparams(qp)
