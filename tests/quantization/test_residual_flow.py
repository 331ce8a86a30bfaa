"""A residual network written MegEngine's way (fused ConvBn modules, the
shortcut an ``Elemwise("add")``, stubs at the ends) through quantize_qat,
calibration and quantize: every tensor between the stubs is quantized, the
residual adds run on the integers (qelemwise.c) with qparams their QAT
observers calibrated, each add bitwise its dequantize / add / quantize
passes, and the traced, optimized and reloaded model gives the same bits."""
import io
import warnings

import numpy as np

import mgtrace as mt
import mgtrace.module as M
import mgtrace.module.quantized as MQ
import mgtrace.quantization as Q
from mgtrace.module.quantized import modules as qmodules
from mgtrace.quantization.qtensor import dequantize, is_quantized, quantize
from mgtrace.traced_module import optimize


class Block(M.Module):
    """MobileNetV2's inverted residual, stride 1: expand, depthwise, project, add."""

    def __init__(self, c, hidden):
        super().__init__()
        self.expand = M.ConvBnRelu2d(c, hidden, 1, bias=False)
        self.dw = M.ConvBnRelu2d(hidden, hidden, 3, padding=1, groups=hidden, bias=False)
        self.project = M.ConvBn2d(hidden, c, 1, bias=False)
        self.add = M.Elemwise("add")

    def forward(self, x):
        return self.add(x, self.project(self.dw(self.expand(x))))


class Net(M.Module):
    def __init__(self):
        super().__init__()
        self.quant, self.dequant = M.QuantStub(), M.DequantStub()
        self.stem = M.ConvBnRelu2d(3, 8, 3, padding=1, bias=False)
        self.b1, self.b2 = Block(8, 24), Block(8, 24)

    def forward(self, x):
        return self.dequant(self.b2(self.b1(self.stem(self.quant(x)))))


def _data(seed):
    return np.random.default_rng(seed).standard_normal((2, 3, 10, 10)).astype(np.float32)


def _quantized():
    mt.random.seed(5)
    net = Net()
    net.train()
    for s in (7, 8):                    # BatchNorm statistics of something
        net(mt.tensor(_data(s)))
    qat = Q.quantize_qat(net.eval(), qconfig=Q.calibration_qconfig)
    Q.enable_observer(qat)
    Q.disable_fake_quant(qat)
    for s in (1, 2):
        qat(mt.tensor(_data(s)))
    Q.disable_observer(qat)
    Q.enable_fake_quant(qat)
    return Q.quantize(qat)


def test_residual_adds_run_on_the_integers_with_calibrated_qparams(monkeypatch):
    q = _quantized()
    adds = [q.b1.add, q.b2.add]
    assert all(type(a) is MQ.Elemwise and a.act_qparams is not None for a in adds)
    seen = []
    real = qmodules.Elemwise._add_on_integers

    def spy(self, a, b, relu):
        out = real(self, a, b, relu)
        seen.append((a, b, out, self))
        return out
    monkeypatch.setattr(qmodules.Elemwise, "_add_on_integers", spy)
    y = q(mt.tensor(_data(3)))
    assert len(seen) == 2
    for a, b, out, mod in seen:
        assert is_quantized(a) and is_quantized(b)
        assert out is not None                  # the integer kernel ran
        want = quantize(mod.float_op(dequantize(a), dequantize(b)), mod.act_qparams)
        np.testing.assert_array_equal(np.asarray(out.numpy()), np.asarray(want.numpy()))
    assert y.dtype == np.float32


def test_traced_optimized_and_reloaded_model_gives_the_same_bits():
    q = _quantized()
    x = mt.tensor(_data(4))
    want = q(x).numpy()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tm = mt.trace_module(q, x)
    fused = optimize(tm, "all", flatten=True)
    np.testing.assert_array_equal(fused(x).numpy(), want)
    f = io.BytesIO()
    mt.save(fused, f)
    f.seek(0)
    np.testing.assert_array_equal(mt.load(f)(x).numpy(), want)
