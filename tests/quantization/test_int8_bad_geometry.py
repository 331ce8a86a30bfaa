"""Int8 convs refuse geometry the kernels cannot index (the breaker's
cases): a negative padding into a depthwise quantized Conv2d freed a
corrupted heap ('double free or corruption', the process aborted), a zero
stride raised ZeroDivisionError, a zero dilation or kernel and a negative
dense padding an internal ValueError; now each is a QuantizationError
before any kernel runs. Valid odd geometry (kernel larger than the padded
input's reach, padding over the kernel, stride over the kernel, 1x1 images)
gives the dequantize / float conv / quantize reference within one quantum."""
import numpy as np
import pytest

import mgtrace as mt
import mgtrace.functional as F
import mgtrace.module.quantized as QM
from mgtrace.quantization import QuantMode, QuantizationError
from mgtrace.quantization.qtensor import create_qparams, dequantize, quantize

F32 = np.float32


def _conv(ci, co, k, stride=1, padding=0, dilation=1, groups=1):
    out = create_qparams(QuantMode.ASYMMERTIC, "quint8", mt.tensor(F32(0.05)),
                         mt.tensor(F32(128)))
    m = QM.Conv2d(ci, co, k, stride, padding, dilation, groups, act_qparams=out)
    rng = np.random.default_rng(0)
    m.weight = mt.tensor(rng.integers(-127, 128, m.weight.shape).astype(np.int8))
    m.weight_scale = mt.tensor(F32(0.01))
    m.bias = mt.tensor(rng.standard_normal(co).astype(F32))
    return m


def _qin(shape):
    x = np.random.default_rng(1).standard_normal(shape).astype(F32)
    return quantize(mt.tensor(x), dtype="quint8", scale=0.02, zero_point=128)


@pytest.mark.parametrize("groups", [1, 4])
@pytest.mark.parametrize("kw", [dict(padding=-1), dict(padding=(1, -2)), dict(stride=0),
                                dict(stride=(1, 0)), dict(dilation=0), dict(kernel=0)])
def test_bad_geometry_refused(groups, kw):
    kw = dict(kw)
    m = _conv(4, 4, kw.pop("kernel", 3), groups=groups, **kw)
    with pytest.raises(QuantizationError, match="must be >= 1 and padding"):
        m(_qin((1, 4, 6, 6)))


@pytest.mark.parametrize("case", [
    ((3, 4, 5), dict(padding=1), (1, 3, 3, 3)),
    ((3, 4, 3), dict(padding=5), (2, 3, 4, 4)),
    ((3, 4, 1), dict(stride=7, padding=3), (2, 3, 9, 9)),
    ((8, 8, 3), dict(padding=1, groups=8), (1, 8, 1, 1)),
    ((8, 8, 3), dict(padding=6, groups=8), (1, 8, 2, 2)),
    ((8, 8, 3), dict(stride=3, padding=1, groups=8), (2, 8, 10, 10)),
])
def test_odd_geometry_values(case):
    (ci, co, k), kw, shape = case
    m = _conv(ci, co, k, **kw)
    xq = _qin(shape)
    y = dequantize(m(xq)).numpy()
    w = m.weight.numpy().astype(F32) * m.weight_scale.numpy()
    r = F.conv2d(dequantize(xq), mt.tensor(w), m.bias.reshape(1, -1, 1, 1), m.stride, m.padding,
                 m.dilation, m.groups)
    rq = dequantize(quantize(r, m.act_qparams)).numpy()
    assert y.shape == rq.shape
    assert np.abs(y - rq).max() <= 0.05 * 1.001


@pytest.mark.parametrize("shape", [(2, 0), (0, 0), (5, 3, 0)])
@pytest.mark.parametrize("path", [0, 1])
def test_linear_no_input_features(shape, path):
    """K = 0 (reshape(-1, 0) raised NumPy's ValueError): the output is the
    bias alone, requantized: rint(b / 0.05) + 128."""
    from mgtrace.quantization import int8
    w = int8.Int8Weight(np.zeros((3, 0), np.int8), 0.5, np.array([1, 2, -3], F32))
    y = int8.linear(np.zeros(shape, np.uint8), 0.1, 128, w, 0.05, 128, "quint8", path=path)
    np.testing.assert_array_equal(y, np.broadcast_to(np.array([148, 168, 68], np.uint8),
                                                     shape[:-1] + (3,)))


@pytest.mark.parametrize("k", [0, 5])
def test_batch_matmul_bias_axis_refused(k):
    """The quantized BatchMatMulActivation adds its bias along K (the float
    module's rule): another K raised NumPy's broadcast ValueError."""
    m = QM.BatchMatMulActivation(2, 4, 3, act_qparams=create_qparams(
        QuantMode.ASYMMERTIC, "quint8", mt.tensor(F32(0.05)), mt.tensor(F32(128))))
    with pytest.raises(QuantizationError, match="K must be 3 or 1"):
        m(_qin((2, 4, k)))


def test_batch_matmul_bias_along_k():
    """K == out_features: the bias along the last axis, bitwise the integer
    reference."""
    m = QM.BatchMatMulActivation(2, 4, 3, act_qparams=None)
    rng = np.random.default_rng(0)
    m.weight = mt.tensor(rng.integers(-127, 128, (2, 3, 4)).astype(np.int8))
    m.weight_scale = mt.tensor(F32(0.01))
    m.bias = mt.tensor(np.array([1.0, -2.0, 0.5], F32))
    xq = _qin((2, 4, 3))
    acc = np.matmul(m.weight.numpy().astype(np.int64), xq.numpy().astype(np.int64) - 128)
    s = np.float64(F32(0.02)) * np.float64(F32(0.01))
    acc = acc + np.rint(m.bias.numpy().astype(np.float64) / s)
    np.testing.assert_allclose(m(xq).numpy(), acc * s, rtol=1e-6)
