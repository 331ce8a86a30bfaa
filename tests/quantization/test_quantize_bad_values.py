"""NaN / inf scales and zero points, and non-finite weights, are refused
with a QuantizationError naming what is wrong, wherever they enter: a
quantized dtype, quantize_tensor (per tensor and per channel), a quantized
module's act_qparams, and quantize() of a calibrated QAT model. They leaked
"cannot convert float NaN to integer", or quantized NaN weights to
arbitrary integers without a word."""
import numpy as np
import pytest

import mgtrace as mt
import mgtrace.module.quantized as MQ
import mgtrace.quantization as Q
from _quant_models import PER_CHANNEL_QUINT8, calibrated_quant_net

F32 = np.float32
NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize("zp", [NAN, INF, -INF])
def test_a_non_finite_zero_point_is_refused(zp):
    with pytest.raises(Q.QuantizationError, match=r"quint8: zero_point must be an integer"):
        Q.quantize_tensor(np.ones(3, F32), dtype="quint8", scale=0.5, zero_point=zp)
    with pytest.raises(ValueError, match=r"zero_point must be an integer in 0\.\.255"):
        Q.create_quantized_dtype("quint8", 0.5, zp)
    with pytest.raises(Q.QuantizationError, match="zero_point"):
        MQ.QuantStub(act_qparams={"dtype": "quint8", "scale": 0.1, "zero_point": zp})


@pytest.mark.parametrize("bad", [NAN, INF, 0.0, -1.0])
def test_a_per_channel_scale_must_be_positive_and_finite(bad):
    q = Q.create_qparams(Q.QuantMode.SYMMERTIC, "qint8", scale=np.array([0.1, bad], F32),
                         axis=0)
    with pytest.raises(Q.QuantizationError, match=r"qint8: scale must be positive and finite"):
        Q.quantize_tensor(np.ones((2, 3), F32), q)
    # the good channel alone still quantizes: 1 / 0.1 = 10
    good = Q.create_qparams(Q.QuantMode.SYMMERTIC, "qint8", scale=np.array([0.1, 0.5], F32),
                            axis=0)
    assert Q.quantize_tensor(np.ones((2, 3), F32), good).numpy().tolist() == \
        [[10, 10, 10], [2, 2, 2]]


def test_a_per_channel_zero_point_must_be_a_finite_integer_in_range():
    for zp in ([3.0, NAN], [3.0, 2.5], [3.0, 300.0]):
        q = Q.create_qparams(Q.QuantMode.ASYMMERTIC, "quint8", scale=np.array([0.1, 0.5], F32),
                             zero_point=np.array(zp, F32), axis=0)
        with pytest.raises(Q.QuantizationError, match="zero_point must be an integer in 0..255"):
            Q.quantize_tensor(np.ones((2, 3), F32), q)


@pytest.mark.parametrize("cfg", ["min_max", "per_channel_quint8"])
@pytest.mark.parametrize("bad", [NAN, INF])
def test_quantize_refuses_a_non_finite_activation_range(cfg, bad):
    qat, _ = calibrated_quant_net(Q.min_max_fakequant_qconfig if cfg == "min_max"
                                  else PER_CHANNEL_QUINT8)
    ob = qat.fc.act_observer
    ob.max_val = mt.tensor(np.full(ob.max_val.shape, bad, F32))
    # refused when converting, naming the layer, not at the first forward
    with pytest.raises(Q.QuantizationError, match=r"Linear's activation qparams: .*scale must be "
                                                  r"positive and finite"):
        Q.quantize(qat, inplace=False)


@pytest.mark.parametrize("bad", [NAN, INF])
def test_quantize_refuses_non_finite_weights(bad):
    qat, _ = calibrated_quant_net(PER_CHANNEL_QUINT8)
    w = qat.fc.weight.numpy().copy()
    w[1, 2] = bad
    qat.fc.weight[...] = w
    with pytest.raises(Q.QuantizationError, match=r"Linear: the weight has 1 non-finite value"):
        Q.quantize(qat, inplace=False)


@pytest.mark.parametrize("cfg, match", [
    ({"dtype": "quint8", "scale": [0.1, 0.2], "zero_point": 3},
     r"act_qparams: the scale is one number \(per tensor\), got shape \(2,\)"),
    ({"dtype": "quint8", "scale": 0.1, "zero_point": [3, 4]},
     r"act_qparams: the zero_point is one number \(per tensor\), got shape \(2,\)"),
    ({"dtype": "qint8", "scale": 0.1, "zero_point": 5},
     r"act_qparams: qint8 is symmetric: zero_point 0, got 5"),
    ({"dtype": "quint8", "scale": "0.1", "zero_point": 3},
     r"act_qparams: the scale is one number \(per tensor\), got '0.1'")])
def test_a_quantized_modules_act_qparams_dict_is_one_scale_and_zero_point(cfg, match):
    """A list scale failed at the first forward with NumPy's broadcast error
    and at save with "only 0-dimensional arrays can be converted"; a signed
    dtype's zero point 5 was dropped without a word (the stub quantized
    with 0)."""
    with pytest.raises(Q.QuantizationError, match=match):
        MQ.QuantStub(cfg)
    # the valid ones quantize as given: quint8 at 0.1 with zero point 3
    y = MQ.QuantStub({"dtype": "quint8", "scale": 0.1, "zero_point": 3})(
        mt.tensor(np.float32([-0.3, 0.0, 1.0])))
    assert y.numpy().tolist() == [0, 3, 13]


@pytest.mark.parametrize("scale, axis, match", [
    ([0.1, 0.2, 0.3], 0, r"per-channel scale of shape \(3,\) along axis 0 of x \(2, 3\): want \(2,\)"),
    ([0.1, 0.2], 5, r"need an int axis of x \(ndim 2\), got axis 5"),
    ([0.1, 0.2], -3, r"got axis -3"),
    ([0.1, 0.2], None, r"got axis None"),
    ([0.1, 0.2], 1.0, r"got axis 1.0"),
    ([[0.1, 0.2]], 0, r"per-channel scale of shape \(1, 2\)"),
    ([], 0, r"per-channel scale of shape \(0,\)")])
def test_per_channel_scales_must_fit_their_axis(scale, axis, match):
    """A wrong count leaked NumPy's broadcast error, a float axis a list
    TypeError, and axis 5 of a 2-d x was read as axis 1 (5 % 2) without a
    word."""
    q = Q.create_qparams(Q.QuantMode.SYMMERTIC, "qint8", scale=np.array(scale, F32), axis=axis)
    with pytest.raises(Q.QuantizationError, match=match):
        Q.quantize_tensor(np.ones((2, 3), F32), q)
    # the same scales along a fitting axis: 1 / 0.1 = 10, 1 / 0.2 = 5
    ok = Q.create_qparams(Q.QuantMode.SYMMERTIC, "qint8", scale=np.array([0.1, 0.2], F32), axis=-2)
    assert Q.quantize_tensor(np.ones((2, 3), F32), ok).numpy().tolist() == [[10] * 3, [5] * 3]


@pytest.mark.parametrize("kw", [{"scale": True}, {"scale": np.bool_(True)},
                                {"scale": 0.1, "zero_point": True}])
def test_a_bool_is_not_a_scale_or_zero_point(kw):
    """float32(True) is 1.0: quantize(x, scale=True) quantized at scale 1
    without a word. Refused in quantize and in create_quantized_dtype; the
    number itself still works (2.0 at scale 1 is 2)."""
    with pytest.raises(Q.QuantizationError, match="must be a number|is a number"):
        Q.quantize_tensor(np.float32([2.0]), dtype="quint8", **{"zero_point": 0, **kw})
    with pytest.raises(Q.QuantizationError, match="is a number"):
        Q.create_quantized_dtype("quint8", kw["scale"], kw.get("zero_point", 0))
    assert Q.quantize_tensor(np.float32([2.0]), dtype="quint8", scale=1.0,
                             zero_point=0).numpy().tolist() == [2]
