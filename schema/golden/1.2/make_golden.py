"""Write the format-1.2 golden archives (1.2 is in development: re-run freely).

    python schema/golden/1.2/make_golden.py

Format 1.2 is the minor every open change shares (storage views now;
quantized dtypes, new functions and module types as they land). Until a
release with format 1.2 is listed in schema/releases.json, this script
rewrites every archive here and manifest.json, so the compendium follows
the code: after adding a function, a builtin module type, a value tag or a
field to 1.2, add a case below (CASES) and run it. Once 0.3.0 (format 1.2)
is released it refuses to run (``--force`` overrides, for the release
commit itself) and the files are frozen like 1.0's and 1.1's:
tests/serialization/test_golden.py checks each file against manifest.json,
loads it, compares with ``expected(name)`` (values built here from NumPy
alone) or runs a model's stored example inputs, and saves it again at 1.2,
which must give the committed bytes.

It refuses to write a compendium that misses a function, module type or
value tag the 1.1 compendium cannot hold (new in 1.2, or at a newer
version), naming what is missing.

* ``aliased_values.tmod``: tensors that share one storage (format 1.2
  ``view`` entries): a base, a strided slice of it, its transpose, its rows
  reversed (negative strides), a row broadcast (a zero stride) and an
  unrelated tensor; ``ALIASES`` lists which pairs share memory;
* ``aliased_model.tmod``: a traced model whose buffer is a slice of a
  builtin Linear's weight and which reads a transposed view of another
  Linear's weight, with example inputs and the outputs they gave;
* ``core_ops_index.tmod``: the core ops gather and scatter as Apply exprs
  (the other core ops are ../1.1/core_ops.tmod's), and the tensor method
  ``to`` (a move to cpu:1 and back), which no other golden archive calls;
* ``core_ops_kernels.tmod``: the core ops conv3d, conv_transpose3d,
  lstm_cell and rnn_cell (issue 36's kernels) as Apply exprs;
* ``quantized_values.tmod``: a tensor of each quantized dtype (``quant``
  fields of the tensor table), a transposed view of one, and a quantized
  dtype as a value (the ``qdtype`` tag);
* ``qat_model.tmod``: a traced, calibrated QAT model (every QAT builtin,
  observer and fake quantizer type; a user's QAT subclass and observer);
* ``quantized_model.tmod``: a traced int8 model (every
  mgtrace.module.quantized type; int8 weights, qparams in configs).
"""
import hashlib
import importlib.util
import json
import pathlib
import sys
import warnings

import numpy as np

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2]))

import mgtrace as mt  # noqa: E402
import mgtrace.functional as F  # noqa: E402
import mgtrace.module as M  # noqa: E402
import mgtrace.traced_module as tmod  # noqa: E402

sys.path.insert(0, str(HERE.parents[2] / "tests"))
from _models import ISSUE36_FUNCTIONS  # noqa: E402

# (key, key) of aliased_values.tmod whose tensors share one storage after a load
ALIASES = [("base", "slice"), ("base", "transposed"), ("base", "reversed"), ("base", "row")]


def _base():
    return np.arange(24, dtype=np.float32).reshape(4, 6) / 8 - 1


def _values():
    b = _base()
    return {"base": b, "slice": b[1:3, ::2], "transposed": b.T, "reversed": b[::-1],
            "row": np.broadcast_to(b[2], (3, 6)), "other": np.array([0.5, -0.25], np.float32)}


def _quantized_expected():
    b = _base()

    def q(name, scale, zp, lo, hi, storage):
        ints = np.clip((np.rint(b / np.float32(scale)) + np.float32(zp)).astype(np.float64),
                       lo, hi).astype(storage)
        text = f"{name}(scale={str(np.float32(scale))}" + (
            f", zero_point={zp})" if name.startswith("qu") else ")")
        return (text, ints)
    s8 = q("qint8", 0.05, 0, -128, 127, "int8")
    u8 = q("quint8", 0.02, 100, 0, 255, "uint8")
    return {"qint8": s8, "qint8_t": (s8[0], s8[1].T), "qint8_narrow": q(
        "qint8_narrow", 0.01, 0, -127, 127, "int8"), "quint8": u8,
        "qint32": q("qint32", 1e-4, 0, -2 ** 31, 2 ** 31 - 1, "int32"),
        "qint4": q("qint4", 0.25, 0, -8, 7, "int8"), "quint4": q("quint4", 0.25, 7, 0, 15, "uint8"),
        "dtype": u8[0]}


def expected(name):
    """The value ``name`` holds, as NumPy arrays where it holds tensors
    (through :func:`describe`)."""
    return {"aliased_values.tmod": _values, "quantized_values.tmod": _quantized_expected}[name]()


def describe(obj):
    """``obj`` with each quantized tensor as ``(dtype text, its integers)``
    and each quantized dtype as its text (NumPy's dtype ``==`` ignores the
    scale); anything else as it is."""
    from mgtrace._core.dtype import qdtype_name, qdtype_str
    if isinstance(obj, dict):
        return {k: describe(v) for k, v in obj.items()}
    if isinstance(obj, mt.Tensor) and qdtype_name(obj.dtype) is not None:
        return (qdtype_str(obj.dtype), _qd().int_repr(obj))
    if isinstance(obj, np.dtype) and qdtype_name(obj) is not None:
        return qdtype_str(obj)
    return obj


def _quantized_values():
    """One tensor of each quantized dtype, a transposed view of one (a
    view entry with its own quant field) and a quantized dtype as a value."""
    Q = _qd()
    b = mt.tensor(_base())
    q = b.astype(Q.qint8(0.05))
    return {"qint8": q, "qint8_t": q.T, "qint8_narrow": b.astype(Q.qint8_narrow(0.01)),
            "quint8": b.astype(Q.quint8(0.02, 100)), "qint32": b.astype(Q.qint32(1e-4)),
            "qint4": b.astype(Q.qint4(0.25)), "quint4": b.astype(Q.quint4(0.25, 7)),
            "dtype": Q.quint8(0.02, 100)}


def _aliased_values():
    base = mt.tensor(_base())
    return {"base": base, "slice": base[1:3, ::2], "transposed": base.T,
            "reversed": base[::-1], "row": base[2].broadcast_to((3, 6)),
            "other": mt.tensor(np.array([0.5, -0.25], np.float32))}


class Aliased(M.Module):
    """A buffer that is row 0 of ``fc``'s weight, and ``proj``'s weight
    read through a transposed view held as a tensor attribute."""

    def __init__(self):
        super().__init__()
        self.fc = M.Linear(4, 3)
        self.proj = M.Linear(3, 4, bias=False)
        self.first_row = self.fc.weight[0]           # a buffer: a view of the parameter
        self.proj_t = self.proj.weight.T              # another view, [3, 4]

    def forward(self, x):
        h = F.relu(self.fc(x)) + (x * self.first_row).sum(axis=1, keepdims=True)
        return self.proj(h) + F.matmul(h, self.proj_t)


def _aliased_model():
    mt.random.seed(120)
    net = Aliased()
    rng = np.random.default_rng(121)
    net.fc.weight[...] = mt.tensor((0.5 * rng.standard_normal((3, 4))).astype(np.float32))
    net.fc.bias[...] = mt.tensor((0.1 * rng.standard_normal(3)).astype(np.float32))
    net.proj.weight[...] = mt.tensor((0.5 * rng.standard_normal((4, 3))).astype(np.float32))
    net.eval()
    x = mt.tensor(rng.standard_normal((2, 4)).astype(np.float32))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tmod.TraceWarning)
        tm = mt.trace_module(net, x)
    return tm, (mt.tensor(rng.standard_normal((5, 4)).astype(np.float32)),)


# --- the functions and builtin module types new in 1.2 (issues 31, 36), each used once

# name: (input shapes after the batch axis, the call on them): issue 36's functions
# as tests/functional/test_megengine_traced.py checks them (tests/_models.py), then
NEW_FUNCTIONS = {
    **ISSUE36_FUNCTIONS,
    # complex numbers (issue 36): complex64 intermediates, real outputs
    "complex": ([(3,), (3,)], lambda x, y: F.abs(F.complex(x, y) * F.complex(y, x))),
    "real": ([(3,), (3,)], lambda x, y: F.real(F.complex(x, y) / F.complex(y, 1.0))),
    "imag": ([(3,), (3,)], lambda x, y: F.imag(F.complex(x, y) - F.complex(y, x) + 1j)),
    "polar": ([(3,), (3,)], lambda x, y: F.real(F.polar(F.abs(x), y))),
    # MegEngine's losses (issue 31); labels derived from the second input
    "cross_entropy": ([(4,), (4,)], lambda x, y: F.cross_entropy(
        x, F.argmax(y, 1).astype("int32"), label_smooth=0.1)),
    "nll_loss": ([(4,), (4,)], lambda x, y: F.nll_loss(
        F.log_softmax(x, 1), F.argmax(y, 1).astype("int32"), reduction="sum")),
    "binary_cross_entropy": ([(3,), (3,)], lambda x, y: F.binary_cross_entropy(x, F.sigmoid(y))),
    "l1_loss": ([(3,), (3,)], lambda x, y: F.l1_loss(x, y.detach(), reduction="none")),
    "square_loss": ([(3,), (3,)], lambda x, y: F.square_loss(x, y)),
    "mse_loss": ([(3,), (3,)], lambda x, y: F.mse_loss(x, y, reduction="sum")),
    "smooth_l1_loss": ([(3,), (3,)], lambda x, y: F.smooth_l1_loss(x, y, beta=0.5)),
    # inference plans (issue 34): a transformer block's tail, its weights from the inputs
    "linear_add_layer_norm": ([(3,), (3,)], lambda x, y: F.linear_add_layer_norm(
        x, F.stack([y[0], x[0], y[1] + x[1]]), y[0] * 0.5, x + y, ln_weight=y[1], ln_bias=x[0], eps=1e-6)),
    # quantized dtypes (issue 32): a quint8 output, and a round trip through qint8
    "quantize": ([(3,)], lambda x: F.quantize(x, _qd().quint8(0.05, 10))),
    "dequantize": ([(3,)], lambda x: F.dequantize(F.quantize(x, _qd().qint8(0.1)))),
}


def _qd():
    from mgtrace.quantization import qdtype
    return qdtype


class NewFunctions(M.Module):
    """Calls each function of NEW_FUNCTIONS on its own inputs (taken in
    order from ``xs``); returns {name: output}."""

    def forward(self, *xs):
        out, i = {}, 0
        for name in sorted(NEW_FUNCTIONS):
            shapes, fn = NEW_FUNCTIONS[name]
            out[name] = fn(*xs[i:i + len(shapes)])
            i += len(shapes)
        return out


def _new_functions():
    rng = np.random.default_rng(122)
    xs = [mt.tensor(rng.standard_normal((2,) + s).astype(np.float32))
          for name in sorted(NEW_FUNCTIONS) for s in NEW_FUNCTIONS[name][0]]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tm = mt.trace_module(NewFunctions(), *xs)
    return tm, tuple(xs)


# name: (make the module, its input shapes; "int" marks region ids, "rois" boxes)
NEW_MODULES = {
    "LeakyReLU": (lambda: M.LeakyReLU(0.2), [(2, 3)]),
    "PReLU": (lambda: M.PReLU(3, 0.1), [(2, 3, 2)]),
    "PixelShuffle": (lambda: M.PixelShuffle(2), [(2, 8, 3, 2)]),
    "AdaptiveMaxPool2d": (lambda: M.AdaptiveMaxPool2d((2, 3)), [(2, 3, 7, 5)]),
    "Conv3d": (lambda: M.Conv3d(3, 4, 3, padding=1), [(2, 3, 4, 5, 4)]),
    "ConvTranspose3d": (lambda: M.ConvTranspose3d(3, 2, 3, 2, 1, 1), [(2, 3, 3, 2, 3)]),
    "RNNCell": (lambda: M.RNNCell(5, 3), [(2, 5)]),
    "LSTMCell": (lambda: M.LSTMCell(5, 3), [(2, 5)]),
    "RNN": (lambda: M.RNN(5, 3, 2), [(6, 2, 5)]),
    "LSTM": (lambda: M.LSTM(5, 4, batch_first=True, bidirectional=True), [(2, 6, 5)]),
    "Pad": (lambda: M.Pad(((0, 0), (0, 0), (1, 2), (2, 1)), "reflect"), [(2, 3, 4, 5)]),
    "InstanceNorm": (lambda: M.InstanceNorm(3), [(2, 3, 4, 5)]),
    "GeneralNorm": (lambda: M.GeneralNorm((3, 5), (1, 3)), [(2, 3, 4, 5)]),
    "LocalResponseNorm": (lambda: M.LocalResponseNorm(3, alpha=0.1), [(2, 6, 3, 3)]),
    "SyncBatchNorm": (lambda: M.SyncBatchNorm(3, eps_mode="max").eval(), [(2, 3, 4, 4)]),
    "LocalConv2d": (lambda: M.LocalConv2d(3, 4, 4, 5, 3, padding=1), [(2, 3, 4, 5)]),
    "SlidingWindow": (lambda: M.SlidingWindow(2, stride=2), [(2, 2, 5, 4)]),
    "SlidingWindowTranspose": (lambda: M.SlidingWindowTranspose((4, 4), 2, stride=2),
                               [(2, 2, 2, 2, 2, 2)]),
    "MultiHeadAttention": (lambda: M.MultiHeadAttention(6, 2).eval(),
                           [(2, 4, 6), (2, 5, 6), (2, 5, 6)]),
    "DeformableConv2d": (lambda: M.DeformableConv2d(2, 3, 3, padding=1),
                         [(2, 2, 4, 4), (2, 18, 4, 4), (2, 9, 4, 4)]),
    "RegionRestrictedConv": (lambda: M.RegionRestrictedConv(2, 4, 3, 2, padding=1),
                             [(2, 2, 4, 4), ("int", 2, 4, 4), ("int", 2, 4, 4)]),
    "DeformablePSROIPooling": (lambda: M.DeformablePSROIPooling(False, 2, 2, 2, 2, 0.5),
                               [(2, 3, 5, 6), ("rois", 3, 5), (3, 2, 2, 2)]),
    # issue 32 (Concat: in qat_model.tmod, it takes a list)
    "LinearBn1d": (lambda: M.LinearBn1d(5, 3).eval(), [(2, 5)]),
    "LinearBnRelu1d": (lambda: M.LinearBnRelu1d(5, 3).eval(), [(2, 5)]),
    "BatchMatMulActivation": (lambda: M.BatchMatMulActivation(2, 5, 3, nonlinear_mode="relu"),
                              [(2, 5, 3)]),
    "ConvTransposeRelu2d": (lambda: M.ConvTransposeRelu2d(3, 4, 3, stride=2, padding=1,
                                                          output_padding=1), [(2, 3, 4, 4)]),
    "ConvTransposeBn2d": (lambda: M.ConvTransposeBn2d(3, 4, 3, groups=1).eval(), [(2, 3, 4, 4)]),
    "ConvTransposeBnRelu2d": (lambda: M.ConvTransposeBnRelu2d(4, 2, 2, stride=2,
                                                              groups=2).eval(), [(2, 4, 3, 3)]),
    "QuantStub": (M.QuantStub, [(2, 3)]),
    "DequantStub": (M.DequantStub, [(2, 3)]),
}


class NewModules(M.Module):
    """Holds one of each NEW_MODULES type (a dict of modules) and calls each
    on its own inputs; returns {name: output}."""

    def __init__(self):
        super().__init__()
        self.layers = {name: make() for name, (make, _) in sorted(NEW_MODULES.items())}

    def forward(self, *xs):
        out, i = {}, 0
        for name in sorted(NEW_MODULES):
            n = len(NEW_MODULES[name][1])
            out[name] = self.layers[name](*xs[i:i + n])
            i += n
        return out


def _module_input(rng, shape):
    if shape[0] == "int":
        return mt.tensor(rng.integers(0, 2, shape[1:]).astype(np.int32))
    if shape[0] == "rois":     # batch index 0, then a box
        n = shape[1]
        return mt.tensor(np.concatenate([np.zeros((n, 1)), rng.uniform(0, 8, (n, 4))],
                                        1).astype(np.float32))
    return mt.tensor(rng.standard_normal(shape).astype(np.float32))


def _new_modules():
    mt.random.seed(123)
    net = NewModules().eval()
    rng = np.random.default_rng(124)
    xs = [_module_input(rng, s) for name in sorted(NEW_MODULES) for s in NEW_MODULES[name][1]]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tm = mt.trace_module(net, *xs)
    return tm, tuple(xs)


class CoreIndexOps(M.Module):
    """The core ops gather and scatter applied raw (``mgtrace.apply(OpDef(name,
    {"axis": 1}), x, index[, src])``, Apply exprs), the two of
    ../1.1/make_golden.py's CoreOps left out: their kernels take axis second,
    and until 1.2 apply() passed the index there (mgtrace/_core/__init__.py
    now gives them the op table's order), so no 1.1 reader runs them. With
    them the tensor method ``to``: a move to another device (cpu:1) and
    back, recorded as two CallMethod ``to`` with the device's name."""

    def forward(self, x, src):
        k = F.argsort(x, axis=1).astype("int32")
        return {"gather": mt.apply(mt.OpDef("gather", {"axis": 1}), x, k),
                "scatter": mt.apply(mt.OpDef("scatter", {"axis": 1}), x, k, src),
                "moved": (src.to("cpu:1") * 2).to("cpu:0")}


def _core_index_ops():
    rng = np.random.default_rng(125)

    def args():
        return tuple(mt.tensor(rng.standard_normal((2, 3, 4)).astype(np.float32))
                     for _ in range(2))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tm = mt.trace_module(CoreIndexOps(), *args())
    return tm, args()


class CoreKernelOps(M.Module):
    """The core ops new in 1.2 (issue 36's dedicated kernels) applied raw,
    Apply exprs: conv3d, conv_transpose3d, lstm_cell (two outputs) and
    rnn_cell, with and without their optional bias."""

    def __init__(self, rng):
        super().__init__()
        self.w3 = mt.tensor(rng.standard_normal((3, 2, 2, 2, 2)).astype(np.float32))
        self.b3 = mt.tensor(rng.standard_normal(3).astype(np.float32))
        self.w_hh = mt.tensor(rng.standard_normal((16, 4)).astype(np.float32) * 0.5)
        self.b_hh = mt.tensor(rng.standard_normal(16).astype(np.float32))

    def forward(self, vol, gx, h):
        def A(name, *inputs, **params):
            return mt.apply(mt.OpDef(name, params), *inputs)
        y = A("conv3d", vol, self.w3, self.b3, stride=1, padding=1, dilation=1, groups=1)
        back = A("conv_transpose3d", y, self.w3, None, stride=(1, 2, 1), padding=0,
                 output_padding=(0, 1, 0), dilation=1, groups=1)
        h2, c2 = A("lstm_cell", gx, h, h * 0.5, self.w_hh, self.b_hh)
        r = A("rnn_cell", gx[:, :4], h, self.w_hh[:4], None, nonlinearity="relu")
        return {"conv3d": y, "conv_transpose3d": back, "lstm_h": h2, "lstm_c": c2, "rnn": r}


def _core_kernel_ops():
    rng = np.random.default_rng(136)
    args = (mt.tensor(rng.standard_normal((1, 2, 3, 4, 3)).astype(np.float32)),
            mt.tensor(rng.standard_normal((2, 16)).astype(np.float32)),
            mt.tensor(rng.standard_normal((2, 4)).astype(np.float32)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tm = mt.trace_module(CoreKernelOps(rng), *args)
    return tm, args


def _qat_model():
    """A traced QAT model (issue 32): every QAT builtin type, each observer
    and fake quantizer type both inside QAT modules (their configs) and
    called on their own (module entries), a user's QAT subclass (traced
    into, is_qat) and a user's observer (traced as a FakeQuantize carrying
    its qparams), calibrated then put in eval mode."""
    import functools
    import mgtrace.module.qat as QM
    import mgtrace.quantization as Q

    class UserQATLinear(QM.Linear):
        pass

    class UserObserver(Q.MinMaxObserver):
        pass

    class QATNet(M.Module):
        def __init__(self):
            super().__init__()
            self.quant = M.QuantStub()
            self.conv = M.ConvBnRelu2d(3, 4, 3, padding=1)
            self.conv_bn = M.ConvBn2d(4, 4, 1)
            self.conv_relu = M.ConvRelu2d(4, 4, 3, padding=1, groups=2)
            self.conv_plain = M.Conv2d(4, 4, 1)
            self.deconv = M.ConvTransposeBnRelu2d(4, 4, 3, padding=1)
            self.deconv_bn = M.ConvTransposeBn2d(4, 4, 3, padding=1, groups=2)
            self.deconv_relu = M.ConvTransposeRelu2d(4, 4, 1)
            self.deconv_plain = M.ConvTranspose2d(4, 4, 3, padding=1)
            self.add = M.Elemwise("FUSE_ADD_RELU")
            self.fc = M.Linear(4 * 5 * 5, 6)
            self.fc_relu = M.Linear(6, 6)
            self.user_fc = M.Linear(6, 3)
            self.fc_bn = M.LinearBn1d(6, 6)
            self.fc_bn_relu = M.LinearBnRelu1d(6, 6)
            self.cat = M.Concat()
            self.float_cat = M.Concat().disable_quantize()
            self.bmm = M.BatchMatMulActivation(2, 2, 3, nonlinear_mode="relu")
            self.dequant = M.DequantStub()
            self.observers = [Q.MinMaxObserver(), Q.ExponentialMovingAverageObserver(),
                              Q.HistogramObserver(bins=64)]
            self.fakes = [Q.TQT("qint8"), Q.LSQ("qint8")]

        def forward(self, x):
            for o in self.observers:
                x = o(x)
            for f in self.fakes:
                x = f(x)
            x = self.quant(x)
            x = self.conv(x)
            x = self.add(self.conv_bn(x), self.conv_relu(x))
            x = self.conv_plain(x)
            x = self.deconv_plain(self.deconv_relu(self.deconv_bn(self.deconv(x))))
            x = self.fc_relu(self.fc(x.reshape(x.shape[0], -1)))
            x = self.cat([self.fc_bn(x), self.fc_bn_relu(x)], 1)
            x = self.float_cat([x, x], 0)
            x = self.user_fc(x[:, :6])
            return self.dequant(self.bmm(x.reshape(2, 2, 3)))

    mt.random.seed(126)
    rng = np.random.default_rng(127)
    net = QATNet()
    net.user_fc = UserQATLinear.from_float_module(net.user_fc)
    net.fc_relu = QM.LinearRelu.from_float_module(net.fc_relu)
    Q.quantize_qat(net)
    net.fc_relu.set_qconfig(Q.tqt_qconfig)
    net.conv_plain.set_qconfig(Q.QConfig(
        weight_observer=functools.partial(UserObserver, dtype="qint8_narrow"),
        act_observer=functools.partial(Q.MinMaxObserver, mode=Q.QuantMode.ASYMMERTIC,
                                       dtype="quint8"),
        weight_fake_quant=functools.partial(Q.FakeQuantize, dtype="qint8_narrow"),
        act_fake_quant=functools.partial(Q.LSQ, dtype="quint8")))
    net.conv_relu.weight_observer = Q.MinMaxObserver(dtype="qint8_narrow", axis=0, channels=4)

    def x():
        return mt.tensor(rng.standard_normal((2, 3, 5, 5)).astype(np.float32))
    Q.disable_fake_quant(net)
    net(x())
    Q.enable_fake_quant(net)
    Q.reset_qconfig(net.fc_relu, Q.tqt_qconfig)
    net.conv_plain.act_fake_quant.set_qparams(net.conv_plain.act_observer.get_qparams())
    for f in net.fakes:
        f.set_qparams(Q.create_qparams(Q.QuantMode.SYMMERTIC, "qint8", 0.05))
    net.eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tm = mt.trace_module(net, x())
    return tm, (x(),)


def _quantized_model():
    """The traced QAT model of _qat_model's kind converted by
    mgtrace.quantization.quantize: every mgtrace.module.quantized type, int8
    weights, qparams in configs (issue 32)."""
    import mgtrace.module.qat as QM  # noqa: F401
    import mgtrace.quantization as Q

    class QuantNet(M.Module):
        def __init__(self):
            super().__init__()
            self.quant = M.QuantStub()
            self.conv = M.ConvBnRelu2d(3, 4, 3, padding=1)
            self.conv_bn = M.ConvBn2d(4, 4, 1)
            self.dw = M.ConvRelu2d(4, 4, 3, stride=2, padding=1, groups=4)
            self.pw = M.Conv2d(4, 4, 1)
            self.add = M.Elemwise("fuse_add_relu")
            self.cat = M.Concat()
            self.fc = M.Linear(8 * 3 * 3, 6)
            self.fc_relu = M.Linear(6, 4)
            self.fc_float_out = M.Linear(4, 3)
            self.deconv = M.ConvTransposeBnRelu2d(4, 4, 3, padding=1)
            self.deconv_bn = M.ConvTransposeBn2d(4, 4, 1, groups=2)
            self.deconv_relu = M.ConvTransposeRelu2d(4, 4, 3, padding=1)
            self.deconv_plain = M.ConvTranspose2d(4, 4, 1, bias=False)
            self.fc_bn = M.LinearBn1d(4, 4)
            self.fc_bn_relu = M.LinearBnRelu1d(4, 4)
            self.bmm = M.BatchMatMulActivation(2, 2, 2, nonlinear_mode="relu")
            self.dequant = M.DequantStub()

        def forward(self, x):
            x = self.conv_bn(self.conv(self.quant(x)))
            x = self.dw(x)
            x = self.deconv_plain(self.deconv_relu(self.deconv_bn(self.deconv(x))))
            x = self.cat([self.add(x, self.pw(x)), x], 1)
            x = self.fc_relu(self.fc(x.reshape(x.shape[0], -1)))
            x = self.fc_bn_relu(self.fc_bn(x))
            x = self.bmm(x.reshape(2, 2, 2)).reshape(2, 4)
            return self.dequant(self.fc_float_out(x))

    mt.random.seed(128)
    rng = np.random.default_rng(129)
    net = QuantNet()
    import mgtrace.module.qat as QMod
    net.fc_relu = QMod.LinearRelu.from_float_module(net.fc_relu)
    qat = Q.quantize_qat(net)
    qat.fc_relu.set_qconfig(Q.min_max_fakequant_qconfig)
    qat.fc_float_out.act_observer = qat.fc_float_out.act_fake_quant = None

    def x():
        return mt.tensor(rng.standard_normal((2, 3, 6, 6)).astype(np.float32))
    Q.disable_fake_quant(qat)
    qat(x())
    qat.eval()
    qnet = Q.quantize(qat)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tm = mt.trace_module(qnet, x())
    return tm, (x(),)


CASES = {    # name -> (make() -> (object, save keyword arguments)); add 1.2's cases here
    "aliased_values.tmod": lambda: (_aliased_values(),
                                    {"metadata": {"what": "views of one storage"}}),
    "quantized_values.tmod": lambda: (_quantized_values(), {
        "metadata": {"what": "quantized tensors of each dtype (tensor quant fields), a "
                             "quantized view, a quantized dtype value (issue 32)"}}),
    "aliased_model.tmod": lambda: _with_examples(
        _aliased_model(), "a buffer and an attribute that are views of Linear weights"),
    "new_functions.tmod": lambda: _with_examples(
        _new_functions(), "each function new in 1.2 (issues 31, 36) called once"),
    "new_modules.tmod": lambda: _with_examples(
        _new_modules(), "each builtin module type new in 1.2 (issue 36) called once"),
    "core_ops_index.tmod": lambda: _with_examples(
        _core_index_ops(), "the core ops gather and scatter as Apply exprs (issue 37), "
        "and Tensor.to"),
    "core_ops_kernels.tmod": lambda: _with_examples(
        _core_kernel_ops(), "the core ops conv3d, conv_transpose3d, lstm_cell and rnn_cell as "
        "Apply exprs (issue 36)"),
    "qat_model.tmod": lambda: _with_examples(
        _qat_model(), "a traced QAT model: QAT modules, observers, fake quantizers (issue 32)"),
    "quantized_model.tmod": lambda: _with_examples(
        _quantized_model(), "a traced int8 model: mgtrace.module.quantized (issue 32)"),
}


def _with_examples(made, what):
    tm, inputs = made
    return tm, {"example_inputs": inputs, "metadata": {"what": what}}


def build():
    """name -> (object, save keyword arguments)."""
    return {name: make() for name, make in CASES.items()}


def released():
    """Whether a listed release writes format 1.2 (then these files are frozen)."""
    releases = json.loads((HERE.parents[1] / "releases.json").read_text())["releases"]
    return any(r["format"] == [1, 2] for r in releases)


def _coverage():
    """schema/golden/coverage.py (by path: PyPI's coverage has that name)."""
    name = "golden_coverage"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, HERE.parent / "coverage.py")
        sys.modules[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules[name])
    return sys.modules[name]


def check(folder=HERE):
    """What the 1.2 compendium must hold and does not, as messages: every
    function and builtin module type 1.1's readers do not know at its
    current version, and every value tag since 1.2; every archive format 1.2."""
    coverage = _coverage()
    from mgtrace.serialization import values
    from mgtrace.serialization.version import released_names
    uses = coverage.folder_uses(folder)
    got = coverage.totals(uses.values())
    ops = json.loads((HERE.parents[1] / "ops.json").read_text())
    old = released_names((1, 1))
    out = []
    for name, u in uses.items():
        if u["versions"][0] != (1, 2):
            out.append(f"{name} is format {'.'.join(map(str, u['versions'][0]))}, not 1.2: a 1.2 "
                       "case must use something of 1.2")
    for k in ("functions", "module_types"):
        new = {(n, e["version"]) for n, e in ops[k].items() if old[k].get(n, 0) < e["version"]}
        missing = sorted(new - got[k])
        if missing:
            out.append(f"the 1.2 golden archives miss {k} {missing}: add a case that uses each "
                       "to CASES in schema/golden/1.2/make_golden.py and run it")
    tags = {t for t, tag in values.TAGS.items() if tuple(tag.since) >= (1, 2)}
    if tags - got["tags"]:
        out.append(f"the 1.2 golden archives miss value tags {sorted(tags - got['tags'])}: add "
                   "a case to CASES in schema/golden/1.2/make_golden.py and run it")
    return out


def main():
    if released() and "--force" not in sys.argv:
        sys.exit("format 1.2 is released (schema/releases.json): its golden archives are frozen")
    manifest = {}
    for old in HERE.glob("*.tmod"):
        old.unlink()
    for name, (obj, kwargs) in build().items():
        path = HERE / name
        mt.save(obj, path, **kwargs)
        manifest[name] = "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()
    (HERE / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    problems = check()
    if problems:
        sys.exit("\n".join(problems))


if __name__ == "__main__":
    main()
