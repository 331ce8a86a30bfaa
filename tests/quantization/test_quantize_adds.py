"""quantize_adds / quantize_layers(adds=True) on a traced residual network:
which additions become int8 Elemwise adds (``a + b``, ``F.add``,
``relu(a + b)`` as fuse_add_relu; broadcasting and in-place ones stay),
that the rewritten traced model quantizes as the same network written
eagerly with Elemwise modules (same qparams, same bits), and what optimize
then does: FuseQuantStub makes the layers before an add write its int8
operands (a value read by several equal stubs included), EliminateRequantize
drops the DequantStub / QuantStub pairs after it (bitwise), every add runs
on the integers bitwise the NumPy float32 reference, and the result lints,
saves and loads."""
import io
import warnings

import numpy as np
import pytest

import mgtrace as mt
import mgtrace.functional as F
import mgtrace.module as M
import mgtrace.module.quantized as MQ
import mgtrace.quantization as Q
from mgtrace.quantization.qtensor import is_quantized, qparams_of
from mgtrace.quantization.utils import QuantMode, create_qparams, quant_dtype
from mgtrace.traced_module import optimize

from tests.quantization.test_quantized_add import _ref

F32 = np.float32


class Res(M.Module):
    """Three shortcuts (``+``, ``relu(+)``, ``F.add``), a broadcasting add and
    an in-place one that stay float."""

    def __init__(self):
        super().__init__()
        self.stem = M.Conv2d(3, 8, 3, padding=1)
        self.c1 = M.Conv2d(8, 8, 3, padding=1)
        self.c2 = M.Conv2d(8, 8, 1)
        self.c3 = M.Conv2d(8, 8, 3, padding=1, groups=8)
        self.head = M.Conv2d(8, 4, 1)
        self.shift = M.Parameter(np.linspace(-1, 1, 8, dtype=F32).reshape(8, 1, 1))

    def forward(self, x):
        x = F.relu(self.stem(x))
        y = self.c1(x) + x
        z = F.relu(self.c2(y) + y)
        w = F.add(self.c3(z), z)
        h = self.head(w)
        h += 1.0
        return F.flatten(w + self.shift, 1), h


class EagerRes(Res):
    """Res written MegEngine's way: the shortcuts Elemwise modules between stubs."""

    def __init__(self):
        super().__init__()
        self.adds = [M.Elemwise("add"), M.Elemwise("fuse_add_relu"), M.Elemwise("add")]
        self.add0, self.add1, self.add2 = self.adds
        self.q = [[M.QuantStub(), M.QuantStub()] for _ in range(3)]
        self.dq = [M.DequantStub() for _ in range(3)]
        self.q00, self.q01, self.q10, self.q11, self.q20, self.q21 = sum(self.q, [])
        self.dq0, self.dq1, self.dq2 = self.dq

    def _add(self, i, a, b):
        add = getattr(self, f"add{i}")
        return getattr(self, f"dq{i}")(add(getattr(self, f"q{i}0")(a), getattr(self, f"q{i}1")(b)))

    def forward(self, x):
        x = F.relu(self.stem(x))
        y = self._add(0, self.c1(x), x)
        z = self._add(1, self.c2(y), y)
        w = self._add(2, self.c3(z), z)
        h = self.head(w)
        h += 1.0
        return F.flatten(w + self.shift, 1), h


def _data(seed):
    return (np.random.default_rng(seed).standard_normal((2, 3, 8, 8)) * 2).astype(F32)


def _float(cls=Res):
    mt.random.seed(11)
    return cls().eval()


def _traced():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return mt.trace_module(_float(), mt.tensor(_data(0)))


def _calibrate(m):
    for s in (1, 2):
        m(mt.tensor(_data(s)))


def _quantized_traced():
    q = Q.quantize_layers(_traced(), _calibrate, float_outputs=True, adds=True)
    x = mt.tensor(_data(3))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return mt.trace_module(q, x), x


def _calls(tm, cls):
    return [e for e in tm.graph._exprs if e.kind == "call_method" and e.method == "__call__"
            and type(e.args[0].owner) is cls]


def test_rewrites_the_same_shape_adds_and_keeps_the_values():
    tm = _traced()
    x = mt.tensor(_data(4))
    want = [t.numpy() for t in tm(x)]
    assert Q.quantize_adds(tm) == 3
    methods = [tm.qadd0.method, tm.qadd1.method, tm.qadd2.method]
    assert methods == ["add", "fuse_add_relu", "add"]
    assert not hasattr(tm, "qadd3")
    assert all(type(getattr(tm, f"qadd{i}_q{j}")) is M.QuantStub for i in range(3) for j in (0, 1))
    tm.graph.lint()
    # the float stubs are identities: the same values, bit for bit
    for got, w in zip(tm(x), want):
        np.testing.assert_array_equal(got.numpy(), w)
    # the broadcasting add, the in-place one and no relu stay in the graph
    text = str(tm.graph)
    assert "__add__" in text and "__iadd__" in text and "relu" in text  # the stem's relu
    assert text.count("relu(") == 1
    assert Q.quantize_adds(tm) == 0             # an Elemwise call is no add


def test_refuses_a_module_that_is_not_traced():
    with pytest.raises(TypeError, match="TracedModule"):
        Q.quantize_layers(_float(), _calibrate, adds=True)


def test_traced_rewrite_quantizes_as_the_eager_elemwise_model():
    traced = Q.quantize_layers(_traced(), _calibrate, float_outputs=True, adds=True)
    eager = Q.quantize_layers(_float(EagerRes), _calibrate, float_outputs=True)
    for i in range(3):
        a, b = getattr(traced, f"qadd{i}"), getattr(eager, f"add{i}")
        assert type(a) is type(b) is MQ.Elemwise and a.method == b.method
        for qa, qb in ((a.act_qparams, b.act_qparams),
                       (getattr(traced, f"qadd{i}_q1").act_qparams,
                        getattr(eager, f"q{i}1").act_qparams)):
            assert qa.scale.numpy() == qb.scale.numpy()
            assert qa.zero_point.numpy() == qb.zero_point.numpy()
    x = mt.tensor(_data(5))
    for got, want in zip(traced(x), eager(x)):
        np.testing.assert_array_equal(got.numpy(), want.numpy())


def test_optimize_keeps_int8_through_the_adds():
    tm, x = _quantized_traced()
    fused, report = optimize(tm, "all", flatten=True, return_report=True)
    fused.graph.lint()
    # c1, c2, c3 and the stem (read by c1's stub and the first add's: equal
    # qparams) write int8; head writes float32 for the in-place add
    assert report["FuseQuantStub"].counts == {"fusions": 4}
    # the adds' sums reach the next conv's and add's stubs (2 + 2) and head's
    assert report["EliminateRequantize"].counts == {"dropped": 5}
    assert len(_calls(fused, MQ.QuantStub)) == 1        # the input's
    assert len(_calls(fused, MQ.DequantStub)) == 2      # w for the float add and head's
    seen = []
    for e in _calls(fused, MQ.Elemwise):
        e.args[0].owner.register_forward_hook(lambda m, a, out: seen.append((m, a, out)))
    got = fused(x)
    assert len(seen) == 3
    for m, (a, b), out in seen:
        assert is_quantized(a) and is_quantized(b) and is_quantized(out)
        pa, pb, po = qparams_of(a), qparams_of(b), qparams_of(out)
        meta = quant_dtype("quint8")
        want = _ref(np.asarray(a.numpy()), pa.scale.numpy(), pa.zero_point.numpy(),
                    np.asarray(b.numpy()), pb.scale.numpy(), pb.zero_point.numpy(),
                    po.scale.numpy(), po.zero_point.numpy(), meta.qmin, meta.qmax,
                    m.method == "fuse_add_relu")
        np.testing.assert_array_equal(np.asarray(out.numpy()), want)
    # FuseQuantStub's fused layers round once fewer: within a step or two of
    # the stubbed graph's output (the add's scale)
    want = tm(x)
    step = float(fused.qadd2.act_qparams.scale.numpy())
    for g, w in zip(got, want):
        assert np.abs(g.numpy() - w.numpy()).max() <= 2.5 * step + 1e-6


def test_eliminate_requantize_alone_is_bitwise():
    tm, x = _quantized_traced()
    flat = optimize(tm, [], flatten=True)
    dropped, report = optimize(flat, "EliminateRequantize", return_report=True)
    # y and z read by the next conv's and add's stubs, w by head's; and the
    # stem's float output quantized once for c1 and the first add
    assert report["EliminateRequantize"].counts == {"dropped": 6}
    for g, w in zip(dropped(x), flat(x)):
        np.testing.assert_array_equal(g.numpy(), w.numpy())


def test_a_stub_with_other_qparams_stays():
    tm, x = _quantized_traced()
    flat = optimize(tm, [], flatten=True)
    stub = flat.qadd1_q1            # reads the first add's sum
    q = stub.act_qparams
    stub.act_qparams = create_qparams(QuantMode.ASYMMERTIC, quant_dtype("quint8"),
                                      float(q.scale.numpy()) * 2, float(q.zero_point.numpy()))
    want = [t.numpy() for t in flat(x)]
    dropped, report = optimize(flat, "EliminateRequantize", return_report=True)
    assert report["EliminateRequantize"].counts == {"dropped": 5}
    assert any(e.args[0].owner is dropped.qadd1_q1 for e in _calls(dropped, MQ.QuantStub))
    for g, w in zip(dropped(x), want):
        np.testing.assert_array_equal(g.numpy(), w)


def test_optimized_graph_saves_loads_and_runs_the_same_bits():
    tm, x = _quantized_traced()
    fused = optimize(tm, "all", flatten=True)
    want = [t.numpy() for t in fused(x)]
    f = io.BytesIO()
    mt.save(fused, f)
    f.seek(0)
    back = mt.load(f)
    back.graph.lint()
    assert len(_calls(back, MQ.Elemwise)) == 3 and len(_calls(back, MQ.QuantStub)) == 1
    for g, w in zip(back(x), want):
        np.testing.assert_array_equal(g.numpy(), w)


def test_optimized_graph_exports_to_onnx():
    ort = pytest.importorskip("onnxruntime")
    from mgtrace.onnx import export
    tm, x = _quantized_traced()
    fused = optimize(tm, "all", flatten=True)
    f = io.BytesIO()
    export(fused, f, opset=17)
    sess = ort.InferenceSession(f.getvalue(), providers=["CPUExecutionProvider"])
    got = sess.run(None, {sess.get_inputs()[0].name: x.numpy()})
    for g, w in zip(got, fused(x)):
        w = w.numpy()
        np.testing.assert_allclose(g, w, rtol=0, atol=1e-5 * np.abs(w).max())


def test_equal_stubs_of_one_value_quantize_it_once():
    class QKV(M.Module):            # BERT's query, key and value read one hidden state
        def __init__(self):
            super().__init__()
            self.norm = M.LayerNorm(8)
            self.q, self.k, self.v = M.Linear(8, 8), M.Linear(8, 8), M.Linear(8, 8)

        def forward(self, x):
            h = self.norm(x)
            return self.q(h) * self.k(h) + self.v(h)

    mt.random.seed(4)
    x = mt.tensor(np.random.default_rng(6).standard_normal((3, 5, 8)).astype(F32))
    q = Q.quantize_layers(QKV().eval(), lambda m: m(x), float_outputs=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tm = mt.trace_module(q, x)
    flat = optimize(tm, [], flatten=True)
    assert len(_calls(flat, MQ.QuantStub)) == 3
    once, report = optimize(flat, "EliminateRequantize", return_report=True)
    assert report["EliminateRequantize"].counts == {"dropped": 2}
    assert len(_calls(once, MQ.QuantStub)) == 1
    np.testing.assert_array_equal(once(x).numpy(), flat(x).numpy())
    # a stub of other qparams quantizes on its own
    flat.v[0].act_qparams = create_qparams(QuantMode.ASYMMERTIC, quant_dtype("quint8"), 0.5, 7.0)
    want = flat(x).numpy()
    once, report = optimize(flat, "EliminateRequantize", return_report=True)
    assert report["EliminateRequantize"].counts == {"dropped": 1}
    np.testing.assert_array_equal(once(x).numpy(), want)


def test_the_rewritten_float_model_saves_loads_and_runs_as_it_is(tmp_path):
    """The float stubs are builtins (format 1.2): the rewritten model saves
    without tracing again, and loaded it calls the same stubs and gives the
    traced model's values, which are the eager float model's."""
    tm = _traced()
    x = mt.tensor(_data(1))
    eager = [t.numpy() for t in _float()(x)]
    Q.quantize_adds(tm)
    traced = [t.numpy() for t in tm(x)]
    path = str(tmp_path / "adds.tmod")
    mt.save(tm, path)
    back = mt.load(path)
    assert [type(getattr(back, f"qadd0_{s}")) for s in ("q0", "q1", "dq")] == [
        M.QuantStub, M.QuantStub, M.DequantStub]
    assert len(_calls(back, M.QuantStub)) == 6 and len(_calls(back, M.DequantStub)) == 3
    for got, t, e in zip(back(x), traced, eager):
        np.testing.assert_array_equal(t, e)
        np.testing.assert_array_equal(got.numpy(), t)
    with pytest.raises(ValueError, match="QuantStub"):
        mt.save(tm, str(tmp_path / "old.tmod"), target_version=(1, 1))


def test_a_float_model_written_with_stubs_traces_saves_and_quantizes(tmp_path):
    """MegEngine's way: a user's float model with QuantStub / DequantStub
    traces to calls of them, saves and loads (traced == eager == loaded),
    and the loaded model quantizes as the eager one, bit for bit."""
    x = mt.tensor(_data(5))
    eager = _float(EagerRes)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tm = mt.trace_module(eager, x)
    assert len(_calls(tm, M.QuantStub)) == 6 and len(_calls(tm, M.DequantStub)) == 3
    path = str(tmp_path / "stubs.tmod")
    mt.save(tm, path)
    back = mt.load(path)
    for got, t, e in zip(back(x), tm(x), eager(x)):
        np.testing.assert_array_equal(t.numpy(), e.numpy())
        np.testing.assert_array_equal(got.numpy(), t.numpy())
    q_loaded = Q.quantize_layers(back, _calibrate, float_outputs=True)
    q_eager = Q.quantize_layers(_float(EagerRes), _calibrate, float_outputs=True)
    assert type(q_loaded.q00) is MQ.QuantStub and type(q_loaded.add1) is MQ.Elemwise
    assert q_loaded.q10.act_qparams == q_eager.q10.act_qparams
    for got, want in zip(q_loaded(x), q_eager(x)):
        np.testing.assert_array_equal(got.numpy(), want.numpy())


def test_a_model_without_stubs_is_still_written_as_format_1_1():
    from mgtrace.serialization import load_archive
    f = io.BytesIO()
    mt.save(_traced(), f)
    f.seek(0)
    assert tuple(load_archive(f).format_version) <= (1, 1)


@pytest.mark.parametrize("model", [M.Linear(2, 2), None])
def test_quantize_adds_refuses_a_model_that_is_no_traced_module(model):
    # it leaked AttributeError: '... object has no attribute _graphs'
    with pytest.raises(TypeError, match="trace_module"):
        Q.quantize_adds(model)
