"""One test per row of the quantized and QAT export tables
(mgtrace.onnx._quant.TABLES, the rows mgtrace.onnx.coverage() lists), at
the lowest opset (13) and the default one: a small model around the row's
module, calibrated, run in ONNX Runtime at a batch size not traced, within
one quantum of the output of mgtrace's own module."""
import functools

import numpy as np
import pytest

pytest.importorskip("onnx", reason="needs onnx (pip install 'mgtrace[onnx]')")
pytest.importorskip("onnxruntime", reason="needs onnxruntime (pip install 'mgtrace[onnx]')")

import mgtrace as mt  # noqa: E402
import mgtrace.module as M  # noqa: E402
import mgtrace.module.qat as QM  # noqa: E402
import mgtrace.quantization as Q  # noqa: E402
from mgtrace.onnx import MIN_OPSET  # noqa: E402
from mgtrace.onnx._quant import TABLES  # noqa: E402
from mgtrace.onnx.exporter import build_model, run_ort  # noqa: E402
from _quant_models import PER_CHANNEL_QUINT8  # noqa: E402

F32 = np.float32
QCONFIG = PER_CHANNEL_QUINT8


class Row(M.Module):
    """QuantStub(s) -> the row's module -> DequantStub."""

    def __init__(self, body, inputs=1, call=None):
        super().__init__()
        self.inputs = inputs
        for i in range(inputs):
            setattr(self, f"quant{i}", M.QuantStub())
        self.body = body
        self.dequant = M.DequantStub()
        self.call = call

    def forward(self, *xs):
        qs = [getattr(self, f"quant{i}")(x) for i, x in enumerate(xs)]
        y = self.call(self.body, qs) if self.call else self.body(*qs)
        return self.dequant(y)


_CONV = dict(in_channels=3, out_channels=4, kernel_size=3, stride=2, padding=1)
_MAKERS = {     # row name -> (float module, input shapes, QAT mapping, call)
    "Linear": (lambda: M.Linear(6, 5), [(2, 3, 6)], None, None),
    "LinearRelu": (lambda: M.Linear(6, 5), [(2, 6)], {M.Linear: QM.LinearRelu}, None),
    "Conv2d": (lambda: M.Conv2d(**_CONV), [(2, 3, 6, 6)], None, None),
    "ConvRelu2d": (lambda: M.ConvRelu2d(**_CONV), [(2, 3, 6, 6)], None, None),
    "ConvBn2d": (lambda: M.ConvBn2d(**_CONV), [(2, 3, 6, 6)], None, None),
    "ConvBnRelu2d": (lambda: M.ConvBnRelu2d(**_CONV), [(2, 3, 6, 6)], None, None),
    "LinearBn1d": (lambda: M.LinearBn1d(6, 5), [(4, 6)], None, None),
    "LinearBnRelu1d": (lambda: M.LinearBnRelu1d(6, 5), [(4, 6)], None, None),
    "Elemwise": (lambda: M.Elemwise("fuse_add_relu"), [(2, 3, 4), (2, 3, 4)], None, None),
    "BatchMatMulActivation": (lambda: M.BatchMatMulActivation(2, 5, 3, nonlinear_mode="relu"),
                              [(2, 5, 3)], None, None),
    "Concat": (lambda: M.Concat(), [(2, 3, 4), (2, 2, 4)], None,
               lambda body, qs: body(qs, 1)),
}
_DECONV = dict(in_channels=3, out_channels=4, kernel_size=3, stride=2, padding=1,
               output_padding=1)
_MAKERS.update({
    "ConvTranspose2d": (lambda: M.ConvTranspose2d(**_DECONV), [(2, 3, 5, 5)], None, None),
    "ConvTransposeRelu2d": (lambda: M.ConvTransposeRelu2d(**_DECONV), [(2, 3, 5, 5)], None,
                            None),
    "ConvTransposeBn2d": (lambda: M.ConvTransposeBn2d(**_DECONV), [(2, 3, 5, 5)], None, None),
    "ConvTransposeBnRelu2d": (lambda: M.ConvTransposeBnRelu2d(4, 6, 3, groups=2),
                              [(2, 4, 4, 4)], None, None),
})
_MAKERS["QuantStub"] = _MAKERS["DequantStub"] = _MAKERS["Linear"]
# a transposed convolution's output channels are its weight's axis 1 (per-channel
# scales need groups=1 in the int8 version: the grouped row is per tensor)
_QCONFIGS = {name: Q.QConfig(
    weight_observer=functools.partial(Q.MinMaxObserver, dtype="qint8_narrow", axis=1),
    act_observer=QCONFIG.act_observer, weight_fake_quant=QCONFIG.weight_fake_quant,
    act_fake_quant=QCONFIG.act_fake_quant)
    for name in ("ConvTranspose2d", "ConvTransposeRelu2d", "ConvTransposeBn2d")}
_QCONFIGS["ConvTransposeBnRelu2d"] = Q.QConfig(
    weight_observer=functools.partial(Q.MinMaxObserver, dtype="qint8_narrow"),
    act_observer=QCONFIG.act_observer, weight_fake_quant=QCONFIG.weight_fake_quant,
    act_fake_quant=QCONFIG.act_fake_quant)
_QCONFIGS["BatchMatMulActivation"] = _QCONFIGS["ConvTransposeBnRelu2d"]

ROWS = [(prefix.rpartition(".")[2], name) for prefix, table in TABLES.items()
        for name in table]


@functools.lru_cache(maxsize=None)
def _model(kind, name):
    make, shapes, mapping, call = _MAKERS[name]
    mt.random.seed(0)
    rng = np.random.default_rng(0)
    net = Row(make(), len(shapes), call)
    net.train()

    def batch(n):               # BatchMatMulActivation's weight fixes the batch
        return lambda s: s if name == "BatchMatMulActivation" else (n,) + s[1:]
    for _ in range(2):          # BatchNorm statistics
        net(*[mt.tensor(rng.standard_normal(batch(8)(s)).astype(F32)) for s in shapes])
    # (QAT BatchMatMulActivation keeps per-channel weights: only its int8 form refuses them)
    cfg = QCONFIG if (kind, name) == ("qat", "BatchMatMulActivation") else \
        _QCONFIGS.get(name, QCONFIG)
    qat = Q.quantize_qat(net, qconfig=cfg, mapping=mapping).eval()
    Q.enable_observer(qat)
    Q.disable_fake_quant(qat)
    qat(*[mt.tensor(rng.standard_normal(batch(16)(s)).astype(F32)) for s in shapes])
    Q.disable_observer(qat)
    Q.enable_fake_quant(qat)
    net = qat if kind == "qat" else Q.quantize(qat, inplace=False)
    assert type(net.body).__module__.startswith(f"mgtrace.module.{kind}") or \
        name in ("QuantStub", "DequantStub")
    xs = [rng.standard_normal(batch(5)(s)).astype(F32) for s in shapes]
    return net, xs, name != "BatchMatMulActivation"


def test_every_row_has_a_model():
    assert {name for _, name in ROWS} <= set(_MAKERS)


@pytest.mark.parametrize("opset", [MIN_OPSET, None])
@pytest.mark.parametrize("kind, name", ROWS)
def test_row_runs_in_ort_within_one_quantum(kind, name, opset):
    net, xs, batched = _model(kind, name)
    tm = mt.trace_module(net, *[mt.tensor(x[:2] if batched else x) for x in xs])
    model = build_model(tm, opset=opset)
    assert "QuantizeLinear" in {n.op_type for n in model.graph.node}
    got = run_ort(model, xs)[0]
    want = net(*[mt.tensor(x) for x in xs]).numpy()
    body = net.body
    q = body.act_qparams if kind == "quantized" else body.get_activation_qparams()
    quantum = float(np.asarray(q.scale.numpy()))
    assert got.shape == want.shape
    assert np.abs(got - want).max() <= quantum * (1 + 1e-4)
