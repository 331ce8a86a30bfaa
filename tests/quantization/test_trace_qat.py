"""Tracing QAT models (issue 32, item 6): MegEngine's three
``traced_module/test_qat_module.py`` behaviours, and archives of traced QAT
models that load without the user's classes.

The reference values are the original (eager) modules' own: traced qparams
must equal them bitwise, and a traced model must give the eager outputs.
"""
import functools
from itertools import chain

import numpy as np
import pytest

import mgtrace as mt
import mgtrace.module as M
import mgtrace.module.qat as QM
import mgtrace.quantization as Q
from mgtrace.module.qat import QATModule
from mgtrace.traced_module import TracedModule


class MyConvBnRelu2d(M.ConvBnRelu2d):
    pass


class MyQATConvBnRelu2d(QM.ConvBnRelu2d):
    pass


class Block(M.Module):
    def __init__(self):
        super().__init__()
        self.conv0 = MyConvBnRelu2d(3, 3, 3, 1, 1)
        self.conv1 = M.ConvBn2d(3, 3, 1, 1, 0)
        self.conv2 = M.ConvBn2d(3, 3, 1, 1, 0)
        self.add = M.Elemwise("FUSE_ADD_RELU")

    def forward(self, x):
        x = self.conv0(x)
        return self.add(self.conv1(x), self.conv2(x))


class Net(M.Module):
    def __init__(self):
        super().__init__()
        self.block0 = Block()
        self.block1 = Block()

    def forward(self, x):
        return self.block1(self.block0(x))


class MyMinMaxObserver(Q.MinMaxObserver):
    pass


class MyTQT(Q.TQT):
    pass


def _subattr(module, path):
    for part in filter(None, path.split(".")):
        module = getattr(module, part)
    return module


def _input(seed=0):
    return mt.tensor(np.random.default_rng(seed).random((5, 3, 32, 32)).astype(np.float32))


def _observer_qconfig(cls):
    return Q.QConfig(weight_observer=functools.partial(cls, dtype="qint8_narrow"),
                     act_observer=functools.partial(cls, dtype="qint8"),
                     weight_fake_quant=None, act_fake_quant=None)


def _fake_quant_qconfig(cls):
    return Q.QConfig(weight_observer=None, act_observer=None,
                     weight_fake_quant=functools.partial(cls, dtype="qint8_narrow"),
                     act_fake_quant=functools.partial(cls, dtype="qint8"))


def _observed(observer_cls, seed=1):
    mt.random.seed(seed)
    qat = Q.quantize_qat(Net(), qconfig=_observer_qconfig(observer_cls),
                         mapping={MyConvBnRelu2d: MyQATConvBnRelu2d})
    Q.enable_observer(qat)
    qat.eval()
    qat(_input(seed))
    Q.disable_observer(qat)
    return qat


def _fake_quanted(fake_quant_cls):
    qat = Q.reset_qconfig(_observed(Q.MinMaxObserver), _fake_quant_qconfig(fake_quant_cls))
    return qat.eval()


def _qparams(mod):
    w = a = None
    if mod.act_observer is not None:
        a = mod.act_observer.get_qparams()
    if mod.act_fake_quant is not None:
        a = mod.act_fake_quant.get_qparams()
    if mod.weight_observer is not None:
        w = mod.weight_observer.get_qparams()
    if mod.weight_fake_quant is not None:
        w = mod.weight_fake_quant.get_qparams()
    return w, a


def _same_qparams(a, b):
    assert a.dtype_meta == b.dtype_meta
    assert a.mode == b.mode
    np.testing.assert_equal(a.scale.numpy(), b.scale.numpy())
    if a.zero_point is not None:
        np.testing.assert_equal(a.zero_point.numpy(), b.zero_point.numpy())


BUILDS = {
    "minmax": lambda: _observed(Q.MinMaxObserver),
    "user_observer": lambda: _observed(MyMinMaxObserver),
    "tqt": lambda: _fake_quanted(Q.TQT),
    "user_tqt": lambda: _fake_quanted(MyTQT),
    "lsq": lambda: _fake_quanted(Q.LSQ),
}


@pytest.mark.parametrize("build", sorted(BUILDS))
def test_traced_qparams_equal_the_originals(build):
    qat = BUILDS[build]()
    x = _input(2)
    want = qat(x).numpy()
    tm = mt.trace_module(qat, x)
    checked = 0
    for name, mod in qat.named_modules():
        if not isinstance(mod, QATModule):
            continue
        w, a = _qparams(mod)
        tw, ta = _qparams(_subattr(tm, name))
        for q, tq in ((w, tw), (a, ta)):
            if q is not None:
                _same_qparams(q, tq)
                checked += 1
    # 6 ConvBn2d / ConvBnRelu2d (weight and activation) and 2 Elemwise (activation)
    assert checked == 14
    np.testing.assert_array_equal(tm(x).numpy(), want)
    # flatten keeps the user's QAT subclass as one traced module, called as such
    flat = tm.flatten()
    conv0 = flat.graph.get_node_by_name("block0_conv0").as_unique()
    out = flat.graph.get_node_by_name("block0_conv0_out").as_unique()
    assert isinstance(conv0.owner, TracedModule) and conv0.owner.is_qat
    assert out.expr.inputs[0] is conv0
    assert not tm.block0.is_qat and tm.block0.conv0.is_qat
    np.testing.assert_array_equal(flat(x).numpy(), want)


@pytest.mark.parametrize("build", ["user_observer", "user_tqt"])
def test_user_classes_are_traced_as_builtins_and_the_original_is_untouched(build):
    qat = BUILDS[build]()
    user = MyMinMaxObserver if build == "user_observer" else MyTQT
    before = {n: type(m) for n, m in qat.named_modules()}
    tm = mt.trace_module(qat, _input(2))
    assert {n: type(m) for n, m in qat.named_modules()} == before
    assert any(t is user for t in before.values())
    assert not any(type(m) is user for m in tm.modules())
    # a builtin QAT module with a user child is replaced in the traced model by
    # a copy whose fake quantizer carries the child's qparams
    conv1 = tm.block0.conv1
    assert conv1 is not qat.block0.conv1 and type(conv1) is QM.ConvBn2d
    assert conv1.weight is qat.block0.conv1.conv.weight if hasattr(conv1, "weight") else \
        conv1.conv.weight is qat.block0.conv1.conv.weight
    assert conv1.act_observer is None and type(conv1.act_fake_quant) is Q.FakeQuantize


@pytest.mark.parametrize("build", ["float", "minmax"])
def test_float_state_dict_loads_into_traced_qat_model(build):
    make = (lambda: (mt.random.seed(3), Net())[1]) if build == "float" else \
        (lambda: _observed(Q.MinMaxObserver, seed=3))
    net = make().eval()
    state = {k: v.numpy().copy() for k, v in net.state_dict().items()}
    x = _input(4)
    mt.random.seed(99)           # other initial weights: the load must replace them
    other = Net() if build == "float" else _observed(Q.MinMaxObserver, seed=5)
    for traced in (mt.trace_module(other, x), mt.trace_module(other, x).flatten()):
        traced.load_state_dict({k: mt.tensor(v) for k, v in state.items()})
        for name, t in chain(net.named_parameters(), net.named_buffers()):
            np.testing.assert_array_equal(_subattr(traced, name).numpy(), t.numpy())


@pytest.mark.parametrize("build", ["float", "minmax"])
def test_qualnames_map_to_attribute_paths(build):
    net = Net() if build == "float" else _observed(Q.MinMaxObserver)
    net.eval()
    tm = mt.trace_module(net, _input())
    base = tm.graph.qualname
    for node in tm.graph.nodes():
        q = node.qualname[len(base) + 1:]
        if q.endswith("]"):
            q = q.rsplit(".", 1)[0]
        if q.startswith("["):
            q = ""
        assert _subattr(tm, q) is not None
        assert _subattr(net, q) is not None


@pytest.mark.parametrize("build", sorted(BUILDS))
def test_traced_qat_model_round_trips_through_an_archive(build, tmp_path):
    qat = BUILDS[build]()
    x = _input(6)
    tm = mt.trace_module(qat, x)
    want = tm(x).numpy()
    path = tmp_path / "qat.tmod"
    mt.save(tm, path)
    back = mt.load(path)
    np.testing.assert_array_equal(back(x).numpy(), want)
    for name, mod in tm.named_modules():
        if isinstance(mod, QATModule):
            got = _subattr(back, name)
            assert type(got) is type(mod)
            for q, bq in zip(_qparams(mod), _qparams(got)):
                if q is not None:
                    _same_qparams(q, bq)
            for child in ("act_observer", "weight_observer"):
                m, b = getattr(mod, child), getattr(got, child)
                if m is not None:
                    assert b.enabled == m.enabled
    assert back.block0.conv0.is_qat


def test_observer_enabled_state_survives_an_archive(tmp_path):
    """Calibration in eval mode (enable_observer after eval): the loaded
    observers still observe, and stop after disable_observer."""
    mt.random.seed(7)
    qat = Q.quantize_qat(Net(), qconfig=_observer_qconfig(Q.MinMaxObserver),
                         mapping={MyConvBnRelu2d: MyQATConvBnRelu2d})
    qat.eval()
    Q.enable_observer(qat)
    tm = mt.trace_module(qat, _input(8))
    mt.save(tm, tmp_path / "c.tmod")
    back = mt.load(tmp_path / "c.tmod")
    obs = back.block0.conv1.act_observer
    assert type(obs) is Q.MinMaxObserver and not obs.training and obs.enabled
    before = obs.max_val.numpy().copy()
    back(_input(9) * 4.0)
    assert obs.max_val.numpy() > before
    Q.disable_observer(back)
    assert not obs.enabled


def test_qat_module_config_rebuilds_it():
    lin = QM.LinearRelu.from_float_module(M.Linear(4, 3))
    lin.set_qconfig(Q.tqt_qconfig)
    cfg = lin.config()
    assert cfg["in_features"] == 4 and cfg["quant"]["act_observer"] is None
    assert cfg["quant"]["act_fake_quant"]["type"] == "mgtrace.quantization.TQT"
    again = QM.LinearRelu(**cfg)
    assert again.config() == cfg
    assert M.is_builtin(again) and not M.is_builtin(MyQATConvBnRelu2d(3, 3, 1))
    with pytest.raises(TypeError, match="not a builtin observer"):
        lin.act_fake_quant = MyTQT("qint8")
        lin.config()


QAT_EXAMPLES = {
    "Linear": lambda: QM.Linear.from_float_module(M.Linear(4, 3)),
    "LinearRelu": lambda: QM.LinearRelu.from_float_module(M.Linear(4, 3)),
    "Conv2d": lambda: QM.Conv2d.from_float_module(M.Conv2d(2, 4, 3)),
    "ConvRelu2d": lambda: QM.ConvRelu2d.from_float_module(M.ConvRelu2d(2, 4, 3)),
    "ConvBn2d": lambda: QM.ConvBn2d.from_float_module(M.ConvBn2d(2, 4, 3)),
    "ConvBnRelu2d": lambda: QM.ConvBnRelu2d.from_float_module(M.ConvBnRelu2d(2, 4, 3)),
    "Elemwise": lambda: QM.Elemwise.from_float_module(M.Elemwise("fuse_add_relu")),
    "QuantStub": lambda: QM.QuantStub.from_float_module(M.QuantStub()),
    "DequantStub": lambda: QM.DequantStub.from_float_module(M.DequantStub()),
    "LinearBn1d": lambda: QM.LinearBn1d.from_float_module(M.LinearBn1d(4, 3)),
    "LinearBnRelu1d": lambda: QM.LinearBnRelu1d.from_float_module(M.LinearBnRelu1d(4, 3)),
    "Concat": lambda: QM.Concat.from_float_module(M.Concat()),
    "BatchMatMulActivation": lambda: QM.BatchMatMulActivation.from_float_module(
        M.BatchMatMulActivation(2, 4, 3)),
    "ConvTranspose2d": lambda: QM.ConvTranspose2d.from_float_module(
        M.ConvTranspose2d(2, 4, 3, stride=2)),
    "ConvTransposeRelu2d": lambda: QM.ConvTransposeRelu2d.from_float_module(
        M.ConvTransposeRelu2d(2, 4, 3)),
    "ConvTransposeBn2d": lambda: QM.ConvTransposeBn2d.from_float_module(
        M.ConvTransposeBn2d(2, 4, 3, groups=2)),
    "ConvTransposeBnRelu2d": lambda: QM.ConvTransposeBnRelu2d.from_float_module(
        M.ConvTransposeBnRelu2d(2, 4, 3, padding=1)),
}


def test_every_qat_builtin_has_an_example():
    own = {n.rsplit(".", 1)[1] for n in M.builtin_types() if n.startswith("mgtrace.module.qat.")}
    assert own == set(QAT_EXAMPLES)


@pytest.mark.parametrize("name", sorted(QAT_EXAMPLES))
def test_each_qat_builtin_round_trips_with_its_quantizers(name, tmp_path):
    mt.random.seed(5)
    m = QAT_EXAMPLES[name]()
    m.set_qconfig(Q.ema_fakequant_qconfig)
    if m.with_weight:
        m.weight_observer = Q.MinMaxObserver(dtype="qint8_narrow", axis=0)
    rng = np.random.default_rng(5)
    shape = (2, 4) if "Linear" in name else (2, 2, 5, 5) if "Conv" in name else \
        (2, 4, 3) if name == "BatchMatMulActivation" else (2, 3)
    x = mt.tensor(rng.standard_normal(shape).astype(np.float32))
    args = (x, x) if name == "Elemwise" else ([x, x], 1) if name == "Concat" else (x,)
    m(*args)                                   # observe once (training mode)
    m.eval()
    mt.save(m, tmp_path / "m.tmod")
    back = mt.load(tmp_path / "m.tmod")
    assert type(back) is type(m) and back.config() == m.config()
    assert list(back.state_dict()) == list(m.state_dict())
    for k, v in m.state_dict().items():
        np.testing.assert_array_equal(back.state_dict()[k].numpy(), v.numpy())
    np.testing.assert_array_equal(back(*args).numpy(), m(*args).numpy())
    with pytest.raises(ValueError, match="mgtrace.module.qat"):
        mt.save(m, tmp_path / "old.tmod", target_version=(1, 1))


def test_disable_quantize_keeps_a_subtree_float():
    net = M.Sequential(M.Linear(4, 4), M.Sequential(M.Linear(4, 2), M.ReLU()))
    assert net[1].disable_quantize() is net[1]
    assert net[1][0].quantize_disabled and not getattr(net, "quantize_disabled", False)
    Q.quantize_qat(net)
    assert type(net[0]) is QM.Linear and type(net[1][0]) is M.Linear
    net[1].disable_quantize(False)
    Q.quantize_qat(net)
    assert type(net[1][0]) is QM.Linear
