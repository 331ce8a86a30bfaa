"""Writes megengine_conv_transpose.npz with MegEngine 1.13 itself (run it with
a Python that has megengine==1.13, e.g. /work/venvs/mge310/bin/python):

    python tests/quantization/data/make_megengine_conv_transpose.py

Each case sets a MegEngine module's weights from a seeded generator, runs it
and records the weights, the input and MegEngine's output (and, for the
BatchNorm forms in training, the running statistics after the step).
tests/quantization/test_conv_transpose.py loads the same weights into
mgtrace's modules and compares.

* ``qat_*``: a QAT module called on its own (a plain input: MegEngine then
  fake-quantizes no bias), with ``min_max_fakequant_qconfig``, observed once
  on the input, then fake quantization on, in eval mode (and, for ``_train``,
  once more in training mode: approximate BN folding with batch statistics).
* ``quantized_*``: QuantStub -> ConvTranspose2d / LinearBn1d -> DequantStub
  converted by ``quantize_qat`` (min-max), calibrated on the input and
  converted by ``quantize``; the output and its scale. MegEngine's quantized
  transposed convolution takes no bias, so that case has none.
* ``quantized_bmm``: the same for BatchMatMulActivation (no bias; identity:
  MegEngine's from_float_module drops nonlinear_mode).
* ``qat_bias``: QAT QuantStub -> QAT Linear (min-max, observed once): the
  qint32 fake-quantized bias MegEngine's ``fake_quant_bias`` gives for the
  stub's output and the fake-quantized weight, and the model's output.
"""
import os

import numpy as np
import megengine as mge
import megengine.module as M
from megengine.quantization import (disable_fake_quant, disable_observer, enable_fake_quant,
                                    enable_observer, min_max_fakequant_qconfig, quantize,
                                    quantize_qat)


def _ct_weight(rng, cin, cout, k, groups):
    """A weight in mgtrace's layout [C_in, C_out/groups, K, K] and MegEngine's."""
    w = (0.3 * rng.standard_normal((cin, cout // groups, k, k))).astype(np.float32)
    if groups == 1:
        return w, w
    return w, w.reshape(groups, cin // groups, cout // groups, k, k)


def _set(param, value):
    param._reset(mge.tensor(value))


def _calibrate(m, x):
    enable_observer(m)
    disable_fake_quant(m)
    m(x)
    disable_observer(m)
    enable_fake_quant(m)


# (groups=1 only: MegEngine 1.13's grouped ConvTranspose2d fails a megdnn
# channel assertion on the CPU)
QAT_CASES = {    # name -> (float class, groups)
    "qat_ct": (M.ConvTranspose2d, 1),
    "qat_ct_relu": (M.ConvTransposeRelu2d, 1),
    "qat_ct_bn": (M.ConvTransposeBn2d, 1),
    "qat_ct_bn_relu": (M.ConvTransposeBnRelu2d, 1),
}


def main():
    rng = np.random.default_rng(320)
    out = {}
    for name, (cls, groups) in QAT_CASES.items():
        cin, cout = 4, 6
        m = cls(cin, cout, 3, stride=2, padding=1, output_padding=1, groups=groups)
        ct = getattr(m, "conv_transpose2d", m)
        w, w_mge = _ct_weight(rng, cin, cout, 3, groups)
        b = (0.1 * rng.standard_normal(cout)).astype(np.float32)
        _set(ct.weight, w_mge)
        _set(ct.bias, b.reshape(1, cout, 1, 1))
        out[f"{name}/weight"], out[f"{name}/bias"] = w, b
        if hasattr(m, "bn"):
            stats = {"weight": 1 + 0.2 * rng.standard_normal(cout),
                     "bias": 0.1 * rng.standard_normal(cout),
                     "running_mean": 0.2 * rng.standard_normal(cout),
                     "running_var": 0.5 + rng.random(cout)}
            for key, v in stats.items():
                v = v.astype(np.float32)
                _set(getattr(m.bn, key), v.reshape(1, cout, 1, 1))
                out[f"{name}/bn_{key}"] = v
        x = rng.standard_normal((2, cin, 5, 5)).astype(np.float32)
        out[f"{name}/x"] = x
        holder = M.Sequential(m)             # quantize_qat converts children only
        holder.eval()
        qat = quantize_qat(holder, qconfig=min_max_fakequant_qconfig)
        assert type(qat[0]).__module__.startswith("megengine.module.qat")
        _calibrate(qat, mge.tensor(x))
        out[f"{name}/y_eval"] = qat(mge.tensor(x)).numpy()
        if hasattr(m, "bn"):
            qat.train()
            disable_observer(qat)
            out[f"{name}/y_train"] = qat(mge.tensor(x)).numpy()
            out[f"{name}/running_mean"] = qat[0].bn.running_mean.numpy().ravel()
            out[f"{name}/running_var"] = qat[0].bn.running_var.numpy().ravel()

    # quantized ConvTranspose2d (no bias) and LinearBn1d
    class Wrap(M.Module):
        def __init__(self, body):
            super().__init__()
            self.quant, self.body, self.dequant = M.QuantStub(), body, M.DequantStub()

        def forward(self, x):
            return self.dequant(self.body(self.quant(x)))

    ct = M.ConvTranspose2d(4, 6, 3, stride=2, padding=1, output_padding=1, bias=False)
    w, _ = _ct_weight(rng, 4, 6, 3, 1)
    _set(ct.weight, w)
    lbn = M.LinearBn1d(8, 5)
    lw = (0.3 * rng.standard_normal((5, 8))).astype(np.float32)
    lb = (0.1 * rng.standard_normal(5)).astype(np.float32)
    _set(lbn.linear.weight, lw)
    _set(lbn.linear.bias, lb)
    out["quantized_lbn/weight"], out["quantized_lbn/bias"] = lw, lb
    for key in ("weight", "bias", "running_mean", "running_var"):
        v = ((0.5 + rng.random(5)) if key in ("weight", "running_var")
             else 0.2 * rng.standard_normal(5)).astype(np.float32)
        _set(getattr(lbn.bn, key), v.reshape(getattr(lbn.bn, key).shape))
        out[f"quantized_lbn/bn_{key}"] = v
    out["quantized_ct/weight"] = w
    for name, body, shape in (("quantized_ct", ct, (2, 4, 5, 5)),
                              ("quantized_lbn", lbn, (6, 8))):
        net = Wrap(body)
        net.eval()
        x = rng.standard_normal(shape).astype(np.float32)
        qat = quantize_qat(net, qconfig=min_max_fakequant_qconfig)
        _calibrate(qat, mge.tensor(x))
        y_scale = np.float32(qat.body.act_observer.get_qparams().scale.numpy())
        qnet = quantize(qat)
        qnet.eval()
        out[f"{name}/x"] = x
        out[f"{name}/y"] = qnet(mge.tensor(x)).numpy()
        out[f"{name}/y_scale"] = y_scale
    # the qint32 bias of a QAT Linear fed by a QAT QuantStub (fake_quant_bias)
    from megengine.quantization.utils import fake_quant_bias
    stub, lin = M.QuantStub(), M.Linear(8, 5)
    lw = (0.5 * rng.standard_normal((5, 8))).astype(np.float32)
    lb = (0.05 * rng.standard_normal(5)).astype(np.float32)
    _set(lin.weight, lw)
    _set(lin.bias, lb)
    net = M.Sequential(stub, lin)
    net.eval()
    qat = quantize_qat(net, qconfig=min_max_fakequant_qconfig)
    x = (2 * rng.standard_normal((6, 8))).astype(np.float32)
    enable_observer(qat)
    qat(mge.tensor(x))
    disable_observer(qat)
    inp = qat[0](mge.tensor(x))
    w_qat = qat[1].apply_quant_weight(qat[1].weight)
    out.update({"qat_bias/x": x, "qat_bias/weight": lw, "qat_bias/bias": lb,
                "qat_bias/b_qat": fake_quant_bias(qat[1].bias, inp, w_qat).numpy(),
                "qat_bias/y": qat(mge.tensor(x)).numpy()})
    # quantized BatchMatMulActivation (no bias: MegEngine's quantized version adds
    # it per output feature, its float one along the last axis)
    bmm = M.BatchMatMulActivation(2, 5, 3, bias=False)   # (its QAT version drops ReLU)
    bw = (0.5 * rng.standard_normal((2, 3, 5))).astype(np.float32)
    _set(bmm.weight, bw)
    net = Wrap(bmm)
    net.eval()
    x = rng.standard_normal((2, 5, 4)).astype(np.float32)
    qat = quantize_qat(net, qconfig=min_max_fakequant_qconfig)
    _calibrate(qat, mge.tensor(x))
    y_scale = np.float32(qat.body.act_observer.get_qparams().scale.numpy())
    qnet = quantize(qat)
    qnet.eval()
    out.update({"quantized_bmm/weight": bw, "quantized_bmm/x": x,
                "quantized_bmm/y": qnet(mge.tensor(x)).numpy(), "quantized_bmm/y_scale": y_scale})
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                        "megengine_conv_transpose.npz")
    np.savez_compressed(path, **out)
    print(f"wrote {path}: {len(out)} arrays")


if __name__ == "__main__":
    main()
