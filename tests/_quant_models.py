"""The small quantized test model shared by tests/quantization and tests/onnx
(issue 32), defined once: the float model, the per-channel quint8 QConfig,
calibration, and the calibrated QAT model both test folders start from.
Importable as ``_quant_models`` (pytest puts tests/ on the path)."""
import functools

import numpy as np

import mgtrace as mt
import mgtrace.module as M
import mgtrace.quantization as Q

F32 = np.float32

#: per-channel qint8_narrow weights (axis 0), asymmetric quint8 activations
PER_CHANNEL_QUINT8 = Q.QConfig(
    weight_observer=functools.partial(Q.MinMaxObserver, dtype="qint8_narrow", axis=0),
    act_observer=functools.partial(Q.MinMaxObserver, mode=Q.QuantMode.ASYMMERTIC,
                                   dtype="quint8"),
    weight_fake_quant=functools.partial(Q.FakeQuantize, dtype="qint8_narrow"),
    act_fake_quant=functools.partial(Q.FakeQuantize, dtype="quint8"))


class QuantNet(M.Module):
    """Every quantized module type: fused conv+bn+relu, depthwise, 1x1,
    add+relu, concat, a reshape of a quantized tensor, linear. x float32
    [N, 3, 8, 8] -> [N, 10]."""

    def __init__(self):
        super().__init__()
        self.quant = M.QuantStub()
        self.conv = M.ConvBnRelu2d(3, 8, 3, padding=1)
        self.dw = M.ConvRelu2d(8, 8, 3, stride=2, padding=1, groups=8)
        self.pw = M.Conv2d(8, 8, 1)
        self.add = M.Elemwise("fuse_add_relu")
        self.cat = M.Concat()
        self.fc = M.Linear(16 * 4 * 4, 10)
        self.dequant = M.DequantStub()

    def forward(self, x):
        x = self.quant(x)
        y = self.dw(self.conv(x))
        y = self.add(y, self.pw(y))
        y = self.cat([y, y], 1)
        return self.dequant(self.fc(y.reshape(y.shape[0], -1)))


def calibrate(qat, x):
    """Observe ``x`` (a NumPy array or Tensor) once in eval mode with fake
    quantization off, then stop observing and fake-quantize; returns qat."""
    qat.eval()
    Q.enable_observer(qat)
    Q.disable_fake_quant(qat)
    qat(x if isinstance(x, mt.Tensor) else mt.tensor(x))
    Q.disable_observer(qat)
    Q.enable_fake_quant(qat)
    return qat


def calibrated_quant_net(qconfig, seed=0):
    """``(qat, rng)``: a seeded QuantNet with two training steps of
    BatchNorm statistics, converted by ``quantize_qat(qconfig)`` and
    calibrated on 16 random images; ``rng`` goes on from there."""
    mt.random.seed(seed)
    rng = np.random.default_rng(seed)
    net = QuantNet()
    net.train()
    for _ in range(2):      # BatchNorm statistics
        net(mt.tensor(rng.standard_normal((4, 3, 8, 8)).astype(F32)))
    qat = calibrate(Q.quantize_qat(net, qconfig=qconfig),
                    rng.standard_normal((16, 3, 8, 8)).astype(F32))
    return qat, rng
