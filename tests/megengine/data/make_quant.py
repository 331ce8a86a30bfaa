"""Writes the quantization files with MegEngine 1.13 (see make_files.py for
the venv): a small CNN written MegEngine's way for quantization (QuantStub,
ConvBnRelu2d, Conv2d, an Elemwise add, a symbolic reshape, LinearRelu,
Linear, DequantStub), made QAT with ``quantize_qat``, calibrated on three
seeded batches in train mode, then traced at batch 2 in eval mode:

* ``qat_ema.tm/.pkl/.npz``: the default ``ema_fakequant_qconfig``;
* ``qat_minmax.tm/.pkl/.npz``: a per-tensor min-max QConfig with
  asymmetric quint8 activations (zero points) and qint8_narrow weights;
* ``quantized.tm/.pkl/.npz``: ``quantize`` of the ema model (int8 weights
  with their scale in the dtype, float biases, quantized output dtypes);
* ``int8_body.tm/.npz``: the int8 model's block, conv and add traced
  alone, taking a qint8 tensor (no QuantStub): ``x2``/``x5`` are the float
  inputs quantized to ``in_dtype``'s scale (``in_scale``), ``y2``/``y5`` the
  dequantized outputs;
* ``qat_tqt.tm/.pkl/.npz`` and ``qat_lsq.tm/.pkl/.npz``: the ema model after
  ``reset_qconfig`` to ``tqt_qconfig`` / an LSQ QConfig (learned scales set
  from the calibrated qparams, no observers);
* ``qat_lowbit``: ``ema_lowbit_fakequant_qconfig`` (qint4 weights and
  activations);
* ``calibrated`` / ``quantized_calibrated``: post-training calibration,
  ``calibration_qconfig`` (MinMax weights, HistogramObserver activations,
  no fake quantization), then ``quantize``;
* ``quantized.p2.tm``, ``quantized.p5.tm``, ``quantized.p5.pkl``: the int8
  model and its state dict saved again with ``pickle_protocol`` 2 and 5
  (protocol 5 pickles the quantized arrays through NumPy's ``_frombuffer``);
* ``qat_user_observer``: activations observed by a user's MinMaxObserver
  subclass: MegEngine's trace replaces each such pair by its traced-module
  FakeQuantize carrying the qparams (``megengine.traced_module.fake_quant``);
* ``qat_passive``: the ema model after ``reset_qconfig`` to
  ``passive_qconfig`` (EasyQuant's PassiveObservers holding its qparams),
  then one scale changed by hand as EasyQuant's search would;
* ``qat_more`` / ``quantized_more``: the other modules MegEngine 1.13 can
  quantize (Net2: ConvTranspose2d without bias, ConvRelu2d, Concat,
  LinearBnRelu1d, BatchMatMulActivation), ema QConfig;
* ``float_more`` / ``float_transposed``: Net2 / Net3 as float models (their
  BatchNorms' statistics from three batches in train mode), the fused float
  modules quantization starts from;
* ``qat_transposed``: the QAT forms MegEngine 1.13 cannot quantize
  (Net3: ConvTransposeBn2d, ConvTransposeBnRelu2d, ConvTransposeRelu2d with
  biases: its quantized transposed conv refuses a bias; LinearBn1d).

Each ``.npz`` holds ``x2``/``x5`` (inputs at batch 2 and 5) and MegEngine's
outputs ``y2``/``y5``; the ``.pkl`` is ``megengine.save(model.state_dict())``.
"""
import os
from functools import partial

import numpy as np

import megengine as mge
import megengine.module as M
import megengine.traced_module as tm
from megengine.quantization import (LSQ, FakeQuantize, MinMaxObserver, QConfig, QuantMode,
                                    ema_fakequant_qconfig, quantize, quantize_qat,
                                    calibration_qconfig, ema_lowbit_fakequant_qconfig,
                                    passive_qconfig, reset_qconfig, tqt_qconfig)

HERE = os.path.dirname(os.path.abspath(__file__))


class Net(M.Module):
    def __init__(self):
        super().__init__()
        self.quant = M.QuantStub()
        self.block = M.ConvBnRelu2d(3, 8, 3, padding=1)
        self.conv = M.Conv2d(8, 8, 3, padding=1)
        self.add = M.Elemwise("add")
        self.fc1 = M.LinearRelu(8 * 4 * 4, 16)
        self.fc2 = M.Linear(16, 5)
        self.dequant = M.DequantStub()

    def forward(self, x):
        x = self.block(self.quant(x))
        x = self.add(x, self.conv(x))
        x = x.reshape(x.shape[0], -1)
        return self.dequant(self.fc2(self.fc1(x)))


class Net2(M.Module):
    def __init__(self):
        super().__init__()
        self.quant = M.QuantStub()
        self.up = M.ConvTranspose2d(3, 4, 2, stride=2, bias=False)
        self.conv = M.ConvRelu2d(4, 4, 3, padding=1)
        self.cat = M.Concat()
        self.fc = M.LinearBnRelu1d(8 * 8 * 8, 6)
        self.bmm = M.BatchMatMulActivation(2, 3, 4, bias=False)
        self.dequant = M.DequantStub()

    def forward(self, x):
        x = self.up(self.quant(x))
        x = self.cat([x, self.conv(x)], 1)
        x = self.fc(x.reshape(x.shape[0], -1))
        y = self.bmm(x.transpose(1, 0).reshape(2, 3, -1))
        return self.dequant(y.reshape(8, -1).transpose(1, 0))


class Net3(M.Module):
    def __init__(self):
        super().__init__()
        self.quant = M.QuantStub()
        self.up = M.ConvTransposeBn2d(3, 4, 2, stride=2)
        self.up2 = M.ConvTransposeBnRelu2d(4, 4, 3, padding=1)
        self.up3 = M.ConvTransposeRelu2d(4, 2, 3, padding=1, groups=2)
        self.fc = M.LinearBn1d(2 * 8 * 8, 5)
        self.dequant = M.DequantStub()

    def forward(self, x):
        x = self.up3(self.up2(self.up(self.quant(x))))
        return self.dequant(self.fc(x.reshape(x.shape[0], -1)))


minmax_quint8_qconfig = QConfig(
    weight_observer=partial(MinMaxObserver, dtype="qint8_narrow"),
    act_observer=partial(MinMaxObserver, dtype="quint8", mode=QuantMode.ASYMMERTIC),
    weight_fake_quant=partial(FakeQuantize, dtype="qint8_narrow"),
    act_fake_quant=partial(FakeQuantize, dtype="quint8"))

class UserObserver(MinMaxObserver):
    """A user's observer: not a MegEngine builtin."""


user_observer_qconfig = QConfig(
    weight_observer=partial(MinMaxObserver, dtype="qint8_narrow"),
    act_observer=partial(UserObserver, dtype="qint8"),
    weight_fake_quant=partial(FakeQuantize, dtype="qint8_narrow"),
    act_fake_quant=partial(FakeQuantize, dtype="qint8"))

lsq_qconfig = QConfig(weight_observer=None, act_observer=None,
                      weight_fake_quant=partial(LSQ, dtype="qint8_narrow"),
                      act_fake_quant=partial(LSQ, dtype="qint8"))


class Int8Body(M.Module):
    def __init__(self, q):
        super().__init__()
        self.block, self.conv, self.add = q.block, q.conv, q.add

    def forward(self, x):
        x = self.block(x)
        return self.add(x, self.conv(x))


def _save_int8_body(q, x2, x5):
    body = Int8Body(q)
    body.eval()
    dt = q.quant.output_dtype
    traced = tm.trace_module(body, mge.Tensor(x2).astype(dt))
    traced.eval()
    ys = [traced(mge.Tensor(x).astype(dt)).astype("float32").numpy() for x in (x2, x5)]
    mge.save(traced, os.path.join(HERE, "int8_body.tm"))
    np.savez(os.path.join(HERE, "int8_body.npz"), x2=x2, x5=x5, y2=ys[0], y5=ys[1],
             in_scale=np.float32(dt.metadata["mgb_dtype"]["scale"]))
    print("int8_body", ys[0].shape)


def _save(name, model, x2, x5, **extra):
    traced = tm.trace_module(model, mge.Tensor(x2))
    traced.eval()
    y2, y5 = model(mge.Tensor(x2)).numpy(), model(mge.Tensor(x5)).numpy()
    assert np.array_equal(traced(mge.Tensor(x2)).numpy(), y2), name
    mge.save(traced, os.path.join(HERE, name + ".tm"))
    mge.save(model.state_dict(), os.path.join(HERE, name + ".pkl"))
    np.savez(os.path.join(HERE, name + ".npz"), x2=x2, x5=x5, y2=y2, y5=y5, **extra)
    print(name, y2.shape)


def make_float(name, cls, seed):
    np.random.seed(seed)
    mge.random.seed(seed)
    rng = np.random.RandomState(seed)
    net = cls()
    net.train()
    for _ in range(3):
        net(mge.Tensor(rng.uniform(-1, 1, (4, 3, 4, 4)).astype("float32")))
    net.eval()
    x2 = rng.uniform(-1, 1, (2, 3, 4, 4)).astype("float32")
    x5 = rng.uniform(-1, 1, (5, 3, 4, 4)).astype("float32")
    _save(name, net, x2, x5)


def make(name, qconfig, seed, cls=Net):
    np.random.seed(seed)
    mge.random.seed(seed)          # the modules initialise from MegEngine's generator
    rng = np.random.RandomState(seed)
    net = cls()
    qat = quantize_qat(net, qconfig=qconfig)
    qat.train()
    for _ in range(3):
        qat(mge.Tensor(rng.uniform(-1, 1, (4, 3, 4, 4)).astype("float32")))
    qat.eval()
    x2 = rng.uniform(-1, 1, (2, 3, 4, 4)).astype("float32")
    x5 = rng.uniform(-1, 1, (5, 3, 4, 4)).astype("float32")
    extra = {}
    if qconfig is user_observer_qconfig:
        # the user observers' scales (the trace takes them out of the model)
        extra = {f"scale.{n}": m.act_observer.get_qparams().scale.numpy()
                 for n, m in qat.named_children() if getattr(m, "act_observer", None)}
    _save(name, qat, x2, x5, **extra)
    return qat, x2, x5


if __name__ == "__main__":
    make("qat_minmax", minmax_quint8_qconfig, 1)
    qat, x2, x5 = make("qat_ema", ema_fakequant_qconfig, 0)
    q = quantize(qat, inplace=False)
    q.eval()
    _save("quantized", q, x2, x5)
    _save_int8_body(q, x2, x5)
    for name, qconfig in (("qat_tqt", tqt_qconfig), ("qat_lsq", lsq_qconfig),
                          ("qat_passive", passive_qconfig)):
        learned = reset_qconfig(qat, qconfig, inplace=False)
        learned.eval()
        if name == "qat_passive":
            learned.conv.act_observer.scale = learned.conv.act_observer.scale.numpy() * 1.25
        _save(name, learned, x2, x5)
    qat, x2, x5 = make("qat_more", ema_fakequant_qconfig, 2, Net2)
    q = quantize(qat, inplace=False)
    q.eval()
    _save("quantized_more", q, x2, x5)
    make("qat_transposed", ema_fakequant_qconfig, 3, Net3)
    traced = mge.load(os.path.join(HERE, "quantized.tm"))
    for protocol in (2, 5):
        mge.save(traced, os.path.join(HERE, f"quantized.p{protocol}.tm"),
                 pickle_protocol=protocol)
    mge.save(mge.load(os.path.join(HERE, "quantized.pkl")),
             os.path.join(HERE, "quantized.p5.pkl"), pickle_protocol=5)
    make_float("float_more", Net2, 7)
    make_float("float_transposed", Net3, 8)
    make("qat_lowbit", ema_lowbit_fakequant_qconfig, 5)
    make("qat_user_observer", user_observer_qconfig, 6)
    calib, x2, x5 = make("calibrated", calibration_qconfig, 4)
    q = quantize(calib, inplace=False)
    q.eval()
    _save("quantized_calibrated", q, x2, x5)
