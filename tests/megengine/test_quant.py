"""MegEngine's quantization files (data/make_quant.py, MegEngine 1.13): a
QAT model (default ema_fakequant_qconfig, and min-max with quint8
activations), the int8 model ``quantize`` made of it, and their state
dicts, read by mgtrace.megengine: the right mgtrace classes with
MegEngine's state, MegEngine's recorded outputs, .tmod round trips."""
import pickle

import numpy as np
import pytest

import mgtrace as mt
import mgtrace.functional as F
import mgtrace.megengine as mge
import mgtrace.module as M
import mgtrace.module.qat as QAT
import mgtrace.module.quantized as QM
import mgtrace.quantization as Q
from mgtrace._core.dtype import qdtype_name
from mgtrace.serialization.reader import read_header
from .cases import path

QAT_CASES = ["qat_ema", "qat_minmax", "qat_tqt", "qat_lsq"]
# each file's last quantized layer (before its DequantStub)
LAST = {"qat_ema": "fc2", "qat_minmax": "fc2", "qat_tqt": "fc2", "qat_lsq": "fc2",
        "qat_passive": "fc2", "quantized_calibrated": "fc2", "qat_lowbit": "fc2",
        "qat_user_observer": "fc2",
        "quantized": "fc2", "qat_more": "bmm", "quantized_more": "bmm",
        "qat_transposed": "fc"}
FLOAT = ["calibrated", "float_more", "float_transposed"]      # no fake quantization
ALL = sorted(LAST) + FLOAT


def stored(name):
    return np.load(path(name, ".npz"))


def out_scale(tm, last="fc2"):
    """The scale of the model's last quantized activation: one quantum of
    the output."""
    m = getattr(tm, last)
    q = m.act_qparams if isinstance(m, QM.QuantizedModule) else m.get_activation_qparams()
    return float(np.asarray(q.scale.numpy()))


def assert_within_one_quantum(got, want, scale):
    # MegEngine's fake quant and int8 kernels round ties half away from zero, mgtrace's
    # half to even: an output may differ by one quantum (none does in these files)
    assert got.shape == want.shape
    assert np.abs(got - want).max() <= scale * 1.0001, (np.abs(got - want).max(), scale)


@pytest.mark.parametrize("name", ALL)
def test_outputs_match_megengine_at_two_batches(name):
    tm = mge.load(path(name, ".tm"))
    d = stored(name)
    for b in (2, 5):        # traced at batch 2; x.shape[0] stayed symbolic
        got = tm(mt.tensor(d[f"x{b}"])).numpy()
        if name in FLOAT:
            np.testing.assert_allclose(got, d[f"y{b}"], rtol=1e-5, atol=1e-6)
        else:
            assert_within_one_quantum(got, d[f"y{b}"], out_scale(tm, LAST[name]))


@pytest.mark.parametrize("qat,quantized", [("qat_ema", "quantized"),
                                           ("calibrated", "quantized_calibrated"),
                                           ("qat_more", "quantized_more")])
def test_mgtrace_quantize_of_a_megengine_qat_model_gives_megengine_s_int8_model(qat, quantized):
    """mgtrace.quantization.quantize of the loaded QAT / calibrated model
    (MegEngine's PTQ and QAT paths) computes what MegEngine's own quantize
    made of it, within one quantum (equal here)."""
    q = Q.quantize(mge.load(path(qat, ".tm")), inplace=False)
    d = stored(quantized)
    for b in (2, 5):
        assert_within_one_quantum(q(mt.tensor(d[f"x{b}"])).numpy(), d[f"y{b}"],
                                  out_scale(q, LAST[quantized]))


def test_histogram_observer_state_gives_megengine_s_calibrated_scales():
    """calibration_qconfig's HistogramObservers as MegEngine left them: their
    qparams (mgtrace's non-linear search over MegEngine's histogram) are the
    scales MegEngine's quantize wrote into the int8 model's output dtypes."""
    calib, q = mge.load(path("calibrated", ".tm")), mge.load(path("quantized_calibrated", ".tm"))
    sd = {k: v.numpy() for k, v in mge.load(path("calibrated", ".pkl")).items()}
    for name in ("quant", "block", "conv", "add", "fc1", "fc2"):
        obs = getattr(calib, name).act_observer
        assert type(obs) is Q.HistogramObserver and obs.bins == 2048
        np.testing.assert_array_equal(obs.histogram.numpy(), sd[f"{name}.act_observer.histogram"])
        assert getattr(calib, name).act_fake_quant is None
        np.testing.assert_allclose(obs.get_qparams().scale.numpy(),
                                   getattr(q, name).act_qparams.scale.numpy(), rtol=1e-6)


@pytest.mark.parametrize("name,classes", [
    ("qat_more", {"up": QAT.ConvTranspose2d, "conv": QAT.ConvRelu2d, "cat": QAT.Concat,
                  "fc": QAT.LinearBnRelu1d, "bmm": QAT.BatchMatMulActivation}),
    ("quantized_more", {"up": QM.ConvTranspose2d, "conv": QM.ConvRelu2d, "cat": QM.Concat,
                        "fc": QM.LinearBnRelu1d, "bmm": QM.BatchMatMulActivation}),
    ("qat_transposed", {"up": QAT.ConvTransposeBn2d, "up2": QAT.ConvTransposeBnRelu2d,
                        "up3": QAT.ConvTransposeRelu2d, "fc": QAT.LinearBn1d})])
def test_the_other_qat_and_quantized_modules_are_mgtrace_s(name, classes):
    tm = mge.load(path(name, ".tm"))
    for attr, cls in classes.items():
        assert type(getattr(tm, attr)) is cls, attr
    sd = {k: v.numpy() for k, v in mge.load(path(name, ".pkl")).items()}
    if name == "quantized_more":
        # grouped / transposed / batched int8 weights: MegEngine's integers, its layout
        # flattened in order; the batched matmul's (batch, out, in, 1, 1) weight
        for attr in ("up", "conv", "fc", "bmm"):
            w = getattr(tm, attr).weight.numpy()
            assert np.array_equal(w.reshape(-1), sd[f"{attr}.weight"].view(np.int8).reshape(-1))
        assert tm.bmm.bias is None and not np.any(sd["bmm.bias"])
    elif name == "qat_transposed":
        assert tm.up3.groups == 2
        np.testing.assert_array_equal(tm.up3.weight.numpy().reshape(-1),
                                      sd["up3.weight"].reshape(-1))
        np.testing.assert_array_equal(tm.up.conv_transpose2d.weight.numpy(),
                                      sd["up.conv_transpose2d.weight"])
        np.testing.assert_array_equal(tm.fc.bn.running_var.numpy(), sd["fc.bn.running_var"])
    else:
        np.testing.assert_array_equal(tm.bmm.weight.numpy(), sd["bmm.weight"])
        # MegEngine keeps a weight observer on its Concat that it never uses: so does this
        assert tm.cat.weight_observer is not None


@pytest.mark.parametrize("name,classes", [
    ("float_more", {"up": M.ConvTranspose2d, "conv": M.ConvRelu2d, "cat": M.Concat,
                    "fc": M.LinearBnRelu1d, "bmm": M.BatchMatMulActivation}),
    ("float_transposed", {"up": M.ConvTransposeBn2d, "up2": M.ConvTransposeBnRelu2d,
                          "up3": M.ConvTransposeRelu2d, "fc": M.LinearBn1d})])
def test_the_fused_float_modules_quantization_starts_from(name, classes):
    """MegEngine's fused float modules (the ones quantize_qat maps) load as
    mgtrace's, with MegEngine's BatchNorm statistics; mgtrace's quantize_qat
    then makes each the QAT module MegEngine's would."""
    tm = mge.load(path(name, ".tm"))
    for attr, cls in classes.items():
        assert type(getattr(tm, attr)) is cls, attr
    sd = {k: v.numpy() for k, v in mge.load(path(name, ".pkl")).items()}
    np.testing.assert_array_equal(tm.fc.bn.running_mean.numpy(), sd["fc.bn.running_mean"])
    qat = Q.quantize_qat(tm, qconfig=Q.ema_fakequant_qconfig, inplace=False)
    qat_classes = {"float_more": {"fc": QAT.LinearBnRelu1d, "bmm": QAT.BatchMatMulActivation},
                   "float_transposed": {"up": QAT.ConvTransposeBn2d, "fc": QAT.LinearBn1d}}
    for attr, cls in qat_classes[name].items():
        assert type(getattr(qat, attr)) is cls, attr


def test_a_nonzero_quantized_batch_matmul_bias_is_refused():
    """MegEngine's quantized BatchMatMulActivation adds its bias along axis
    1, the float and QAT ones (and mgtrace's) along the last axis."""
    from mgtrace.megengine import table as T
    rule = T.MODULES["megengine.module.quantized.batch_matmul_activation."
                     "BatchMatMulActivation"]
    tm = mge.load(path("quantized_more", ".tm"))
    from mgtrace.megengine.reader import ALLOWED
    P = ALLOWED[("megengine.tensor", "Parameter")]
    w = np.zeros((2, 4, 3, 1, 1), dtype=Q.qint8(0.5))
    state = {"batch": 2, "in_features": 3, "out_features": 4, "nonlinear_mode": "identity",
             "weight": P(w), "bias": P(np.ones((1, 4, 1, 1), np.float32)),
             "output_dtype": None}
    with pytest.raises(mge.UnsupportedError, match="along axis 1"):
        rule.make(state, "bmm")
    state["bias"] = P(np.zeros((1, 4, 1, 1), np.float32))
    assert rule.make(state, "bmm").bias is None
    assert tm.bmm.nonlinear_mode == "identity"


def test_qat_modules_observers_and_fake_quants_are_mgtrace_s():
    tm = mge.load(path("qat_ema", ".tm"))
    want = {"quant": QAT.QuantStub, "block": QAT.ConvBnRelu2d, "conv": QAT.Conv2d,
            "add": QAT.Elemwise, "fc1": QAT.LinearRelu, "fc2": QAT.Linear,
            "dequant": QAT.DequantStub}
    for name, cls in want.items():
        assert type(getattr(tm, name)) is cls, name
    # ema_fakequant_qconfig: MinMax qint8_narrow weights, EMA qint8 activations
    assert type(tm.block.weight_observer) is Q.MinMaxObserver
    assert tm.block.weight_observer.dtype_name == "qint8_narrow"
    assert type(tm.block.act_observer) is Q.ExponentialMovingAverageObserver
    assert tm.block.act_observer.momentum == pytest.approx(0.9)
    assert type(tm.block.act_fake_quant) is Q.FakeQuantize
    assert tm.dequant.act_observer is None and tm.quant.weight_observer is None
    # eval mode as saved: observers off, fake quantization on; train() observes again
    assert not tm.block.act_observer.enabled and tm.block.act_fake_quant.enabled
    assert tm.block.act_observer.train().enabled


@pytest.mark.parametrize("name", ["qat_ema", "qat_minmax"])
def test_observer_state_is_megengine_s(name):
    """Each observer's min/max is the value of MegEngine's own state dict
    (the .pkl), and its qparams follow from it by MegEngine's formulas."""
    tm = mge.load(path(name, ".tm"))
    sd = {k: v.numpy() for k, v in mge.load(path(name, ".pkl")).items()}
    checked = 0
    for prefix in ("quant", "block", "conv", "add", "fc1", "fc2"):
        m = getattr(tm, prefix)
        for kind in ("weight", "act"):
            obs = getattr(m, f"{kind}_observer")
            if obs is None:
                continue
            lo = sd[f"{prefix}.{kind}_observer.min_val"]
            hi = sd[f"{prefix}.{kind}_observer.max_val"]
            assert obs.min_val.numpy() == lo and obs.max_val.numpy() == hi
            q = obs.get_qparams()
            lo32, hi32 = np.float32(min(lo, 0)), np.float32(max(hi, 0))
            if obs.mode == Q.QuantMode.SYMMERTIC:
                scale = max(max(-lo32, hi32) / np.float32((obs.qmax - obs.qmin) / 2), 1e-5)
                assert q.zero_point is None
            else:
                scale = max((hi32 - lo32) / np.float32(obs.qmax - obs.qmin), 1e-5)
                assert q.zero_point.numpy() == obs.qmin - np.rint(lo32 / np.float32(scale))
            np.testing.assert_allclose(q.scale.numpy(), scale, rtol=1e-6)
            checked += 1
    assert checked == 10


@pytest.mark.parametrize("name,cls,tensors", [
    ("qat_tqt", Q.TQT, ("scale",)),
    ("qat_lsq", Q.LSQ, ("step_size", "zero_point", "eps", "grad_scale"))])
def test_learned_scale_fake_quants_are_megengine_s(name, cls, tensors):
    """After MegEngine's reset_qconfig to TQT / LSQ (no observers), each
    fake quantizer is mgtrace's, with MegEngine's learned tensors, and
    gives the qparams the EMA model's observers gave (its initial scale)."""
    tm, ema = mge.load(path(name, ".tm")), mge.load(path("qat_ema", ".tm"))
    sd = {k: v.numpy() for k, v in mge.load(path(name, ".pkl")).items()}
    for prefix in ("quant", "block", "conv", "add", "fc1", "fc2"):
        m = getattr(tm, prefix)
        for kind in ("weight", "act"):
            fq = getattr(m, f"{kind}_fake_quant")
            if fq is None:
                continue
            assert type(fq) is cls and getattr(m, f"{kind}_observer") is None
            for t in tensors:
                assert np.array_equal(getattr(fq, t).numpy(),
                                      sd[f"{prefix}.{kind}_fake_quant.{t}"]), (prefix, t)
            source = getattr(ema, prefix)
            want = source.get_weight_qparams() if kind == "weight" else \
                source.get_activation_qparams()
            np.testing.assert_allclose(fq.get_qparams().scale.numpy(), want.scale.numpy(),
                                       rtol=1e-5)
    assert isinstance(tm.fc2.act_fake_quant.scale if cls is Q.TQT else
                      tm.fc2.act_fake_quant.step_size, M.Parameter)


def test_passive_observers_come_over_as_the_fake_quantizers_a_trace_makes():
    """EasyQuant's PassiveObserver holds qparams, not state mgtrace stores:
    as when mgtrace traces one, each pair becomes a FakeQuantize carrying
    them (here the ema model's, and one scale set by hand to 1.25 times)."""
    tm, ema = mge.load(path("qat_passive", ".tm")), mge.load(path("qat_ema", ".tm"))
    for prefix in ("quant", "block", "conv", "add", "fc1", "fc2"):
        m, e = getattr(tm, prefix), getattr(ema, prefix)
        assert m.act_observer is None and type(m.act_fake_quant) is Q.FakeQuantize
        want = np.float32(e.get_activation_qparams().scale.numpy())
        if prefix == "conv":
            want = np.float32(want * np.float32(1.25))
        np.testing.assert_allclose(m.get_activation_qparams().scale.numpy(), want, rtol=1e-6)
    # the rule itself builds mgtrace's PassiveObserver with those qparams
    from mgtrace.megengine import table as T
    from mgtrace.megengine.reader import read_pickle
    root = read_pickle(open(path("qat_passive", ".tm"), "rb").read())
    _, state = T.module_record(root.state["conv"], "conv")
    obs = T.module_rule(state["act_observer"].kind).make(state["act_observer"].state, "obs")
    assert type(obs) is Q.PassiveObserver
    np.testing.assert_allclose(obs.scale.numpy(), obs.orig_scale * np.float32(1.25), rtol=1e-6)


def test_a_user_observer_traced_by_megengine_comes_over_as_a_carrying_fake_quantize():
    """MegEngine's trace replaces a user's observer by its traced-module
    FakeQuantize carrying the qparams (as mgtrace's trace does): it loads as
    mgtrace's FakeQuantize with those qparams, the user's observers' scales
    as make_quant.py recorded them before the trace."""
    tm = mge.load(path("qat_user_observer", ".tm"))
    d = stored("qat_user_observer")
    for prefix in ("quant", "block", "conv", "add", "fc1", "fc2"):
        m = getattr(tm, prefix)
        assert m.act_observer is None and type(m.act_fake_quant) is Q.FakeQuantize
        assert m.act_fake_quant.enabled
        assert m.get_activation_qparams().scale.numpy() == d[f"scale.{prefix}"]
    assert type(tm.block.weight_observer) is Q.MinMaxObserver        # a builtin: kept


def test_lowbit_file_is_qint4_throughout():
    tm = mge.load(path("qat_lowbit", ".tm"))
    for name in ("block", "conv", "fc1", "fc2"):
        m = getattr(tm, name)
        for child in (m.weight_observer, m.weight_fake_quant, m.act_observer,
                      m.act_fake_quant):
            assert child.dtype_name == "qint4" and (child.qmin, child.qmax) == (-8, 7)
    # the output takes at most 16 values per tensor: it went through qint4 fake quants
    y = tm(mt.tensor(stored("qat_lowbit")["x5"])).numpy()
    assert len(np.unique(y)) <= 16


def test_minmax_file_has_asymmetric_quint8_activations():
    tm = mge.load(path("qat_minmax", ".tm"))
    obs = tm.quant.act_observer
    assert type(obs) is Q.MinMaxObserver and obs.dtype_name == "quint8"
    assert obs.mode == Q.QuantMode.ASYMMERTIC
    zp = float(obs.get_qparams().zero_point.numpy())
    assert 0 < zp < 255 and zp == int(zp)        # the input spans both signs


def test_quantized_modules_hold_megengine_s_integers():
    tm = mge.load(path("quantized", ".tm"))
    want = {"quant": QM.QuantStub, "block": QM.ConvBnRelu2d, "conv": QM.Conv2d,
            "add": QM.Elemwise, "fc1": QM.LinearRelu, "fc2": QM.Linear,
            "dequant": QM.DequantStub}
    for name, cls in want.items():
        assert type(getattr(tm, name)) is cls, name
    sd = mge.load(path("quantized", ".pkl"))
    for name in ("block", "conv", "fc1", "fc2"):
        m, w = getattr(tm, name), sd[f"{name}.weight"]
        assert qdtype_name(w.dtype) == "qint8"
        assert np.array_equal(m.weight.numpy(), np.asarray(w.numpy()).view(np.int8))
        assert m.weight_scale.numpy() == np.float32(w.dtype.metadata["mgb_dtype"]["scale"])
        assert np.array_equal(m.bias.numpy(), sd[f"{name}.bias"].numpy().reshape(-1))
    assert tm.add.method == "add"      # MegEngine's "qadd"
    # the output dtypes are the QAT model's activation qparams
    qat = mge.load(path("qat_ema", ".tm"))
    for name in ("quant", "block", "conv", "add", "fc1", "fc2"):
        a = getattr(qat, name).get_activation_qparams()
        assert getattr(tm, name).act_qparams.scale.numpy() == np.float32(a.scale.numpy()), name


def test_quantized_model_runs_on_integers():
    tm = mge.load(path("quantized", ".tm"))
    x = mt.tensor(stored("quantized")["x2"])
    h = tm.quant(x)
    assert qdtype_name(h.dtype) == "qint8"
    assert qdtype_name(tm.block(h).dtype) == "qint8"
    # and gives what the QAT model it came from gives, within one quantum
    qat = mge.load(path("qat_ema", ".tm"))
    assert_within_one_quantum(tm(x).numpy(), qat(x).numpy(), out_scale(tm))


@pytest.mark.parametrize("name", ALL)
def test_tmod_round_trip(name, tmp_path):
    tm = mge.load(path(name, ".tm"))
    p = tmp_path / f"{name}.tmod"
    mt.save(tm, p)
    with open(p, "rb") as f:
        header = read_header(f)
    assert header["format_version"] == [1, 2]      # quantized dtypes, qparams, QAT modules
    back = mt.load(p)
    for b in (2, 5):
        x = mt.tensor(stored(name)[f"x{b}"])
        assert np.array_equal(back(x).numpy(), tm(x).numpy())
    assert [type(m) for m in back.modules()] == [type(m) for m in tm.modules()]


class Net(M.Module):
    """The float model of make_quant.py, mgtrace's modules (mgtrace has no
    float LinearRelu: fc1 becomes QAT.LinearRelu after quantize_qat)."""

    def __init__(self):
        super().__init__()
        self.quant = M.QuantStub()
        self.block = M.ConvBnRelu2d(3, 8, 3, padding=1)
        self.conv = M.Conv2d(8, 8, 3, padding=1)
        self.add = M.Elemwise("add")
        self.fc1 = M.Linear(8 * 4 * 4, 16)
        self.fc2 = M.Linear(16, 5)
        self.dequant = M.DequantStub()

    def forward(self, x):
        x = self.block(self.quant(x))
        x = self.add(x, self.conv(x))
        x = x.reshape(x.shape[0], -1)
        return self.dequant(self.fc2(self.fc1(x)))


def _qat_net(qconfig):
    net = Q.quantize_qat(Net(), qconfig=qconfig)
    net.fc1 = QAT.LinearRelu(8 * 4 * 4, 16)
    net.fc1.set_qconfig(qconfig)
    return net


def test_qat_state_dict_loads_strictly_into_mgtrace_s_qat_model():
    sd = mge.load(path("qat_ema", ".pkl"))
    net = _qat_net(Q.ema_fakequant_qconfig)
    net.load_state_dict(sd, layout="megengine")       # strict: every key, momentum too
    net.eval()
    d = stored("qat_ema")
    assert_within_one_quantum(net(mt.tensor(d["x5"])).numpy(), d["y5"], out_scale(net))
    # and back: MegEngine's keys, the EMA momentum as its tensor
    back = net.state_dict(layout="megengine")
    assert set(back) == set(sd)
    assert back["quant.act_observer.momentum"].numpy() == np.float32(0.9)


def test_qat_state_dict_momentum_other_than_the_observer_s_is_refused():
    sd = dict(mge.load(path("qat_ema", ".pkl")))
    sd["add.act_observer.momentum"] = mt.tensor(np.float32(0.5))
    net = _qat_net(Q.ema_fakequant_qconfig)
    with pytest.raises(ValueError, match="set_momentum"):
        net.load_state_dict(sd, layout="megengine")


def test_quantized_state_dict_gives_quantized_tensors():
    sd = mge.load(path("quantized", ".pkl"))
    w = sd["fc2.weight"]
    assert qdtype_name(w.dtype) == "qint8" and tuple(w.shape) == (5, 16)
    real = F.dequantize(w).numpy()
    np.testing.assert_array_equal(real, np.asarray(w.numpy(), np.float32)
                                  * np.float32(Q.get_scale(w.dtype)))
    assert sd["fc2.bias"].dtype == np.float32


def _array_pickle(dtype, values=(1, 2, 3)):
    return pickle.dumps({"w": np.array(values, dtype=dtype)}, protocol=4)


def _qdtype(base, **mgb):
    return np.dtype(base, metadata={"mgb_dtype": mgb})


@pytest.mark.parametrize("dtype,zp", [(Q.qint8(0.25), 0), (Q.quint8(0.5, 7), 7),
                                      (Q.qint32(1e-3), 0)])
def test_quantized_arrays_of_every_dtype_read(dtype, zp):
    sd = mge.loads(pickle.dumps({"w": np.array([1, 2, 3], dtype=dtype)}, protocol=4))
    w = sd["w"]
    assert qdtype_name(w.dtype) == qdtype_name(dtype)
    assert Q.get_scale(w.dtype) == Q.get_scale(dtype) and Q.get_zero_point(w.dtype) == zp
    np.testing.assert_array_equal(F.dequantize(w).numpy(),
                                  (np.array([1, 2, 3], np.float32) - zp)
                                  * np.float32(Q.get_scale(dtype)))


@pytest.mark.parametrize("dtype,match", [
    (_qdtype("int8", name="QuantizedS8", scale=float("nan")), "finite positive"),
    (_qdtype("int8", name="QuantizedS8", scale=float("inf")), "finite positive"),
    (_qdtype("int8", name="QuantizedS8", scale=-0.5), "finite positive"),
    (_qdtype("int8", name="QuantizedS8", scale="0.5"), "finite positive"),
    (_qdtype("int8", name="QuantizedS8", scale=True), "finite positive"),
    (_qdtype("int8", name="QuantizedS16", scale=0.5), "QuantizedS16"),
    (_qdtype("int8", name=["QuantizedS8"], scale=0.5), "not one of"),
    (_qdtype("uint8", name="QuantizedS8", scale=0.5), "stored as uint8"),
    (_qdtype("uint8", name="Quantized8Asymm", scale=0.5), "fields"),
    (_qdtype("uint8", name="Quantized8Asymm", scale=0.5, zero_point=300), "zero point"),
    (_qdtype("uint8", name="Quantized8Asymm", scale=0.5, zero_point=1.5), "zero point"),
    (_qdtype("int8", name="QuantizedS8", scale=0.5, zero_point=0), "fields"),
    (np.dtype("int8", metadata={"mgb_dtype": {"name": "QuantizedS8", "scale": 0.5},
                                "x": 1}), "metadata"),
    (np.dtype("int8", metadata={"other": 1}), "metadata"),
])
def test_bad_quantized_dtype_metadata_is_refused(dtype, match):
    with pytest.raises(mge.MegEngineFileError, match=match):
        mge.loads(_array_pickle(dtype))


def test_qint4_values_out_of_range_are_refused():
    dtype = _qdtype("int8", name="QuantizedS4", scale=0.5)
    with pytest.raises(mge.MegEngineFileError, match="outside the range of QuantizedS4"):
        mge.loads(_array_pickle(dtype, (1, 9)))


def test_a_tensor_whose_qparams_are_no_qparams_is_refused():
    # MegEngine pickles a fake-quantized float tensor's qparams in its state
    # ({'qparams': QParams}); anything else there is refused
    from mgtrace.megengine.reader import ALLOWED
    import mgtrace.megengine.table as T
    tensor_cls = ALLOWED[("megengine.tensor", "Tensor")]
    stub = tensor_cls(np.zeros(2, np.float32))
    stub.state = {"qparams": "x"}
    with pytest.raises(mge.MegEngineFileError, match="qparams are a str"):
        T.tensor_array(stub, "w")
    stub.state = {"qparams": None, "data": 1}
    with pytest.raises(mge.MegEngineFileError, match="state"):
        T.tensor_array(stub, "w")
    stub.state = {"qparams": ALLOWED[("megengine.quantization.utils", "QParams")]()}
    assert T.tensor_array(stub, "w").tolist() == [0.0, 0.0]


def _replace_once(data, old, new):
    assert data.count(old) >= 1, old
    return data.replace(old, new, 1)


def test_bad_quantization_records_in_a_traced_module_are_refused():
    qat = open(path("qat_ema", ".tm"), "rb").read()
    q = open(path("quantized", ".tm"), "rb").read()
    cases = [
        # a dtype name outside the closed set, in the metadata of a weight and an output
        (q, b"\x8c\x0bQuantizedS8", b"\x8c\x0bQuantizedX8", mge.MegEngineFileError,
         "QuantizedX8"),
        # an observer class MegEngine has and mgtrace maps nowhere (same length name)
        (qat, b"\x8c\x0eMinMaxObserver", b"\x8c\x0ePassivObserver", mge.ForbiddenGlobalError,
         "PassivObserver"),
        # QuantDtypeMeta of a name mgtrace lacks
        (qat, b"\x8c\x0cqint8_narrow", b"\x8c\x0cqint9_narrow", mge.UnsupportedError,
         "qint9_narrow"),
        # the quantized Elemwise's method without MegEngine's "q"
        (q, b"\x8c\x04qadd", b"\x8c\x04xadd", mge.MegEngineFileError, "xadd"),
    ]
    for data, old, new, err, match in cases:
        with pytest.raises(err, match=match):
            mge.loads(_replace_once(data, old, new))


def test_nan_scale_in_a_traced_module_is_refused():
    q = open(path("quantized", ".tm"), "rb").read()
    at = q.index(b"\x8c\x05scale")
    g = q.index(b"G", at)
    assert g - at <= 9
    bad = q[:g + 1] + np.array([np.nan], ">f8").tobytes() + q[g + 9:]
    with pytest.raises(mge.MegEngineFileError, match="finite positive"):
        mge.loads(bad)


@pytest.mark.parametrize("name", ALL)
def test_truncated_and_bit_flipped_files_fail_cleanly(name):
    data = open(path(name, ".tm"), "rb").read()
    rng = np.random.RandomState(0)
    for cut in sorted(rng.choice(len(data) - 1, 12, replace=False)):
        with pytest.raises(mge.MegEngineFileError):
            mge.loads(data[:cut])
    for _ in range(12):
        b = bytearray(data)
        b[rng.randint(len(b))] ^= 1 << rng.randint(8)
        try:
            mge.loads(bytes(b))
        except mt.Error:
            pass                # refused with mgtrace's errors only; or still a valid file


def test_import_megengine_command_converts_them(tmp_path):
    import shutil
    from .test_cli import cli
    src, out = tmp_path / "src", tmp_path / "out"
    src.mkdir()
    for name in QAT_CASES + ["quantized"]:
        shutil.copy(path(name, ".tm"), src)
    shutil.copy(path("quantized", ".pkl"), src / "int8_weights.pkl")
    p = cli("import-megengine", src, "-o", out, "--pattern", "*")
    assert p.returncode == 0, p.stdout + p.stderr
    for name in QAT_CASES + ["quantized"]:
        tm = mt.load(str(out / f"{name}.tmod"))
        d = stored(name)
        assert_within_one_quantum(tm(mt.tensor(d["x5"])).numpy(), d["y5"], out_scale(tm))
    sd = mt.load(str(out / "int8_weights.tmod"))
    want = mge.load(path("quantized", ".pkl"))
    assert sorted(sd) == sorted(want)
    for k in want:
        assert qdtype_name(sd[k].dtype) == qdtype_name(want[k].dtype)
        np.testing.assert_array_equal(sd[k].numpy(), want[k].numpy())
    assert Q.get_scale(sd["fc1.weight"].dtype) == Q.get_scale(want["fc1.weight"].dtype)


def test_quantized_dtypes_as_graph_constants(tmp_path):
    """qconst.tm (make_qconst.py): astype to qint8 / quint8 dtypes given as
    call arguments, and a qint8 tensor made in forward (a graph Constant);
    inputs away from rounding ties, so the outputs are MegEngine's exactly."""
    tm = mge.load(path("qconst", ".tm"))
    consts = [e for e in tm.graph.exprs() if type(e).__name__ == "Constant"]
    assert len(consts) == 1
    c = consts[0].value
    assert qdtype_name(c.dtype) == "qint8" and Q.get_scale(c.dtype) == 0.25
    assert c.numpy().tolist() == [3, -7, 12, 0]
    d = stored("qconst")
    mt.save(tm, tmp_path / "q.tmod")
    back = mt.load(tmp_path / "q.tmod")
    for b in (2, 5):
        x = mt.tensor(d[f"x{b}"])
        np.testing.assert_array_equal(tm(x).numpy(), d[f"y{b}"])
        np.testing.assert_array_equal(back(x).numpy(), d[f"y{b}"])


def test_a_loaded_qat_model_fine_tunes():
    """MegEngine's QAT model, loaded, trains on in mgtrace: train() turns its
    observers back on (MegEngine's rule), gradients reach the float weights
    through the fake quantizers (straight through), and SGD lowers a loss."""
    from mgtrace.autodiff import GradManager
    from mgtrace.optimizer import SGD
    tm = mge.load(path("qat_ema", ".tm"))
    tm.train()
    rng = np.random.RandomState(0)
    x = mt.tensor(rng.uniform(-1, 1, (8, 3, 4, 4)).astype("float32"))
    target = mt.tensor(rng.uniform(-0.5, 0.5, (8, 5)).astype("float32"))
    params = list(tm.parameters())
    gm, opt = GradManager().attach(params), SGD(params, lr=0.1)
    seen = tm.block.act_observer.max_val.numpy().copy()
    w0 = tm.block.conv.weight.numpy().copy()
    losses = []
    for _ in range(5):
        with gm:
            loss = ((tm(x) - target) ** 2).mean()
            gm.backward(loss)
        opt.step()
        opt.clear_grad()
        losses.append(float(loss.numpy()))
    assert losses[-1] < losses[0] / 2, losses
    assert not np.array_equal(tm.block.conv.weight.numpy(), w0)
    assert tm.block.act_observer.max_val.numpy() != seen        # observing again


def _dtype_record(code, mgb=None):
    from mgtrace.megengine.reader import ALLOWED
    d = ALLOWED[("numpy", "dtype")](code, False, True)
    state = (3, "<", None, None, None, -1, -1, 0)
    d.__setstate__(state if mgb is None else (4, "<", None, None, None, -1, -1, 0,
                                               {"mgb_dtype": mgb}))
    return d


def _tensor_record(array, kind="Parameter"):
    from mgtrace.megengine.reader import ALLOWED
    t = ALLOWED[("megengine.tensor", kind)](array)
    t.state = {}
    return t


def _set(module, key, value):
    def edit(root):
        root.state[module].get("state")[key] = value(root) if callable(value) else value
    return edit


def _set_child(module, child, key, value):
    def edit(root):
        rec = root.state[module].get("state")[child]
        rec.state[key] = value(rec) if callable(value) else value
    return edit


def _mode_3(rec):
    rec.state["mode"].args = (3,)
    return rec.state["mode"]


def _meta_other_range(rec):
    rec.state["dtype"].args = ("qint8", "QuantizedS8", "int8", -100, 127, False)
    return rec.state["dtype"]


BAD_STATES = [
    ("qat_ema", _set_child("block", "act_observer", "enabled", "yes"), mge.MegEngineFileError,
     "enabled is a str"),
    ("qat_ema", _set_child("block", "act_observer", "momentum", "0.9"),
     mge.MegEngineFileError, "expected one finite float"),
    ("qat_ema", _set_child("block", "act_observer", "momentum",
                           _tensor_record(np.ones(3, np.float32), "Tensor")),
     mge.MegEngineFileError, "expected one finite float"),
    ("qat_ema", _set_child("block", "act_observer", "momentum",
                           _tensor_record(np.float32(np.nan), "Tensor")),
     mge.MegEngineFileError, "expected one finite float"),
    ("qat_lsq", _set_child("block", "act_fake_quant", "eps", float("inf")),
     mge.MegEngineFileError, "expected one finite float"),
    ("qat_ema", _set_child("block", "act_observer", "mode", _mode_3), mge.MegEngineFileError,
     "QuantMode"),
    ("qat_ema", _set_child("block", "act_observer", "dtype", _meta_other_range),
     mge.UnsupportedError, "is not one of mgtrace's"),
    ("qat_ema", _set_child("block", "act_observer", "scale_limit", float("nan")),
     mge.MegEngineFileError, "scale_limit"),
    ("qat_ema", _set_child("block", "act_observer", "min_val",
                           _tensor_record(np.zeros(3, np.float32), "Tensor")),
     mge.MegEngineFileError, "tensors do not fit"),
    ("qat_ema", _set("block", "act_observer", lambda root: root.state["block"].get(
        "state")["conv"]), mge.MegEngineFileError, "not an observer or fake quantizer"),
    ("calibrated", _set_child("block", "act_observer", "bins", 10 ** 9),
     mge.MegEngineFileError, "bins"),
    ("quantized", _set("fc2", "output_dtype", _dtype_record("f4")), mge.UnsupportedError,
     "not a quantized dtype"),
    ("quantized", _set("fc2", "output_dtype", _dtype_record("i4", {"name": "QuantizedS32",
                                                                   "scale": 0.5})),
     mge.UnsupportedError, "qint8 or quint8"),
    ("quantized", _set("fc2", "weight", _tensor_record(np.zeros((5, 16), np.float32))),
     mge.UnsupportedError, "qint8 weights"),
    ("quantized", _set("fc2", "bias", _tensor_record(np.zeros(4, np.float32))),
     mge.MegEngineFileError, "expected 5 floats"),
    ("quantized", _set("fc2", "bias", _tensor_record(np.zeros(5, Q.qint8(0.5)))),
     mge.UnsupportedError, "not qint32 or float"),
    ("quantized", _set("block", "padding_mode", "reflect"), mge.UnsupportedError,
     "padding_mode"),
    ("quantized", _set("add", "method", 7), mge.MegEngineFileError, "method"),
]


@pytest.mark.parametrize("name,edit,err,match", BAD_STATES,
                         ids=[f"{c[0]}-{c[3]}" for c in BAD_STATES])
def test_bad_quantization_state_is_refused_with_the_reason(name, edit, err, match):
    from mgtrace.megengine import convert
    from mgtrace.megengine.reader import read_pickle
    root = read_pickle(open(path(name, ".tm"), "rb").read())
    edit(root)
    with pytest.raises(err, match=match):
        convert._traced_module(root, name, None, None)


def test_qint32_bias_is_dequantized():
    from mgtrace.megengine import convert
    from mgtrace.megengine.reader import read_pickle
    root = read_pickle(open(path("quantized", ".tm"), "rb").read())
    bias = np.array([3, -1, 0, 7, 2], dtype=Q.qint32(0.125))
    _set("fc2", "bias", _tensor_record(bias))(root)
    tm = convert._traced_module(root, "q", None, None)[0]
    assert tm.fc2.bias.numpy().tolist() == [0.375, -0.125, 0.0, 0.875, 0.25]


@pytest.mark.parametrize("name", ALL + ["qconst"])
def test_files_read_into_inert_records_and_import_nothing(name):
    """The quantization files are read into the reader's records, plain
    values and NumPy arrays only (a quantized dtype is a NumPy dtype with
    metadata), and loading them imports nothing MegEngine's."""
    import sys
    from mgtrace.megengine import reader as U
    obj = U.read_pickle(open(path(name, ".tm"), "rb").read())
    seen, stack, kinds = set(), [obj], set()
    while stack:
        v = stack.pop()
        if id(v) in seen:
            continue
        seen.add(id(v))
        kinds.add(type(v).__module__)
        if isinstance(v, U.Stub):
            stack.extend(v.args)
            state = v.state
            stack.extend(state.values() if isinstance(state, dict) else
                         state if isinstance(state, tuple) else [])
        elif isinstance(v, dict):
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, (list, tuple)):
            stack.extend(v)
    assert kinds <= {"builtins", "mgtrace.megengine.stubs", "mgtrace.megengine.reader",
                     "numpy"}, kinds
    mge.load(path(name, ".tm"))
    # (this test folder is itself imported as the package "megengine")
    assert not {"megengine.core", "megengine.module", "megengine.quantization",
                "megengine.tensor"} & set(sys.modules)


def test_an_int8_model_taking_a_quantized_input_loads_and_runs(tmp_path):
    """int8_body.tm: MegEngine's int8 block, conv and add traced alone on a
    qint8 input (no QuantStub): the example inputs are made in the recorded
    quantized dtype, and the outputs on MegEngine's inputs are its own."""
    tm = mge.load(path("int8_body", ".tm"))
    d = stored("int8_body")
    dt = Q.qint8(d["in_scale"])
    scale = float(np.asarray(tm.add.act_qparams.scale.numpy()))
    mt.save(tm, tmp_path / "b.tmod")
    back = mt.load(tmp_path / "b.tmod")
    for b in (2, 5):
        for model in (tm, back):
            y = model(mt.tensor(d[f"x{b}"]).astype(dt))
            assert qdtype_name(y.dtype) == "qint8"
            assert_within_one_quantum(F.dequantize(y).numpy(), d[f"y{b}"], scale)


@pytest.mark.parametrize("suffix", [".p2.tm", ".p5.tm"])
def test_int8_model_at_protocols_2_and_5(suffix):
    tm = mge.load(path("quantized", suffix))
    d = stored("quantized")
    np.testing.assert_array_equal(tm(mt.tensor(d["x5"])).numpy(),
                                  mge.load(path("quantized", ".tm"))(mt.tensor(d["x5"])).numpy())


def test_int8_state_dict_at_protocol_5_equals_protocol_4():
    # protocol 5 pickles each array through numpy's _frombuffer, the quantized dtype with
    # its metadata as an argument
    want, got = mge.load(path("quantized", ".pkl")), mge.load(path("quantized", ".p5.pkl"))
    assert list(got) == list(want)
    for k in want:
        assert qdtype_name(got[k].dtype) == qdtype_name(want[k].dtype)
        if qdtype_name(want[k].dtype):
            assert Q.get_scale(got[k].dtype) == Q.get_scale(want[k].dtype)
        np.testing.assert_array_equal(got[k].numpy(), want[k].numpy())


def test_a_user_subclass_of_a_qat_module_loads(tmp_path):
    """user_qat.tm (make_user_qat.py): MegEngine traced into a user's
    subclass of its QAT Linear, recording its QATModule's
    _apply_fakequant_with_observer calls and the bias's fake quantization
    as a raw FakeQuant op (qint32's range, constant scale and zero point).
    It loads as a TracedModule whose observer pairs carry their qparams (as
    mgtrace's trace makes of such a module), with MegEngine's output."""
    tm = mge.load(path("user_qat", ".tm"))
    d = stored("user_qat")
    fc = tm.fc
    assert fc.weight_observer is None and type(fc.act_fake_quant) is Q.FakeQuantize
    assert fc.act_fake_quant.get_qparams() is not None
    scale = float(np.asarray(fc.act_fake_quant.get_qparams().scale.numpy())) * 2   # (x 2)
    assert_within_one_quantum(tm(mt.tensor(d["x"])).numpy(), d["y"], scale)
    mt.save(tm, tmp_path / "u.tmod")
    np.testing.assert_array_equal(mt.load(tmp_path / "u.tmod")(mt.tensor(d["x"])).numpy(),
                                  tm(mt.tensor(d["x"])).numpy())


def test_megengine_fake_quant_op_ranges():
    from mgtrace.megengine import table as T
    assert T.fake_quant_range({"qmin": -2 ** 31, "qmax": 2 ** 31 - 1}, "w") == "qint32"
    assert T.fake_quant_range({"qmin": 0, "qmax": 255}, "w") == "quint8"
    with pytest.raises(mge.UnsupportedError, match="-3..3"):
        T.fake_quant_range({"qmin": -3, "qmax": 3}, "w")
    with pytest.raises(mge.MegEngineFileError, match="qmin"):
        T.fake_quant_range({"qmin": "0", "qmax": 255}, "w")
    x = mt.tensor(np.float32([0.26, -1.0, 3.0]))
    y = T.fake_quant_op(x, mt.tensor(np.float32(0.5)), mt.tensor(np.float32(0)), "qint8", "w")
    assert y.numpy().tolist() == [0.5, -1.0, 3.0]
    y = T.fake_quant_op(x, mt.tensor(np.float32(0.5)), mt.tensor(np.float32(250)), "quint8",
                        "w")
    assert y.numpy().tolist() == [0.5, -1.0, 2.5]          # 250 + 6 saturates at 255


def test_linear_bn_state_dict_loads_strictly_and_back():
    """MegEngine's LinearBn1d keeps an unused zero ``bias`` of its own beside
    linear.bias: layout="megengine" takes it (zeros only) and gives it back."""
    sd = mge.load(path("qat_transposed", ".pkl"))
    sub = {k[3:]: v for k, v in sd.items() if k.startswith("fc.")}
    assert not np.any(sub["bias"].numpy())
    m = QAT.LinearBn1d(128, 5)
    m.set_qconfig(Q.ema_fakequant_qconfig)
    m.load_state_dict(sub, layout="megengine")                     # strict
    assert set(m.state_dict(layout="megengine")) == set(sub)
    np.testing.assert_array_equal(m.linear.weight.numpy(), sub["linear.weight"].numpy())
    bad = dict(sub, bias=mt.tensor(np.ones(5, np.float32)))
    with pytest.raises(ValueError, match="unused LinearBn1d bias"):
        m.load_state_dict(bad, layout="megengine")
    float_m = M.LinearBn1d(3, 2, bias=False)
    assert "bias" not in float_m.state_dict(layout="megengine")


@pytest.mark.parametrize("name,module", [("cnn", "fc1"), ("qat_ema", "conv"),
                                         ("qat_ema", "fc1"), ("quantized", "conv"),
                                         ("quantized_more", "bmm")])
@pytest.mark.parametrize("size", [20000, 10 ** 6])
def test_sizes_that_do_not_fit_the_file_s_tensors_are_refused_at_once(name, module, size):
    """A module's channel / feature counts raised far past its tensors' (14
    GB of weight at 20000, terabytes at 10**6): refused as a bad file, the
    module never filled (its parameters are made uninitialised and the
    file's tensors checked against them; a quantized module's weight size
    is checked first) nor an allocation's MemoryError leaked."""
    from mgtrace.megengine import convert
    from mgtrace.megengine.reader import read_pickle
    root = read_pickle(open(path(name, ".tm"), "rb").read())
    state = root.state[module]
    state = state.get("state") if isinstance(state.get("state"), dict) else state.state
    for key in ("in_channels", "out_channels", "in_features", "out_features", "batch"):
        if key in state:
            state[key] = size
    with pytest.raises(mge.MegEngineFileError):
        convert._traced_module(root, name, None, None)
