"""Every transformation gives the eager answer (the project's first promise):
trace_module, optimize (default, "all", flattened), save/load (copy and
mmap), copy.deepcopy, flatten() and to_folder, each compared with eager on values,
dtypes, shapes and devices. One test per construct that once broke
silently, each with the smallest model that showed it."""
import collections
import copy
import importlib
import io
import sys

import numpy as np
import pytest

import mgtrace as mt
import mgtrace.functional as F
import mgtrace.module as M
from mgtrace.traced_module import optimize


def _load(tm, **kw):
    buf = io.BytesIO()
    mt.save(tm, buf)
    return mt.load(io.BytesIO(buf.getvalue()), **kw)


def _load_mmap(tm, path):
    mt.save(tm, path)
    return mt.load(path, mmap=True)


def _import_folder(folder):
    sys.path.insert(0, str(folder.parent))
    try:
        importlib.invalidate_caches()
        return importlib.import_module(folder.name)
    finally:
        sys.path.remove(str(folder.parent))


def _to_folder(tm, path):
    folder = path / f"pkg_{abs(hash(str(path))) % 10**8}"
    tm.to_folder(folder, "Net")
    return _import_folder(folder).Net()


def variants(tm, tmp_path):
    """name -> a module derived from the trace ``tm``, each way a user gets one."""
    return {
        "traced": tm,
        "optimize": optimize(tm),
        "optimize_all": optimize(tm, "all"),
        "optimize_all_flat": optimize(tm, "all", flatten=True),
        "load_copy": _load(tm),
        "load_mmap": _load_mmap(tm, tmp_path / "m.tmod"),
        "deepcopy": copy.deepcopy(tm),
        "flatten": tm.flatten(),
        "flatten_loaded": _load(tm.flatten()),
        "optimized_loaded": _load(optimize(tm, "all", flatten=True)),
        "to_folder": _to_folder(tm, tmp_path),
    }


def leaves(out):
    """The tensors and plain values of a nested output, in order."""
    if isinstance(out, dict):
        return [v for k in out for v in leaves(out[k])]
    if isinstance(out, (list, tuple)):
        return [v for o in out for v in leaves(o)]
    return [out]


def assert_same(got, want, where):
    """Bitwise: the same kernels run in every variant."""
    assert type(got) is type(want), where
    g, w = leaves(got), leaves(want)
    assert len(g) == len(w), where
    for i, (a, b) in enumerate(zip(g, w)):
        if isinstance(b, mt.Tensor):
            assert isinstance(a, mt.Tensor), f"{where}[{i}]"
            assert (a.dtype, a.shape, str(a.device)) == (b.dtype, b.shape, str(b.device)), \
                f"{where}[{i}]: {a.dtype} {a.shape} {a.device} != {b.dtype} {b.shape} {b.device}"
            np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=f"{where}[{i}]")
        else:
            assert a == b, f"{where}[{i}]"


def assert_all_agree(make, inputs, tmp_path, run_inputs=None):
    """Every variant of ``trace_module(make(), *inputs)`` gives what
    ``make()`` gives eagerly on ``run_inputs`` (default ``inputs``)."""
    run_inputs = inputs if run_inputs is None else run_inputs
    want = make()(*run_inputs())
    tm = mt.trace_module(make(), *inputs())
    for name, m in variants(tm, tmp_path).items():
        assert_same(m(*run_inputs()), want, name)


# ------------------------------------------------------------ device moves
class _Move(M.Module):
    def forward(self, x):
        return x.to("cpu:1") * 2, x.to(mt.Device("cpu:1")).to("cpu") + 1


def _x():
    return (mt.tensor(np.arange(6, dtype=np.float32).reshape(2, 3)),)


def test_a_move_to_another_device_is_recorded_with_its_device(tmp_path):
    """x.to("cpu:1") was recorded as astype("float32") (the host copy it
    makes), so every transformation answered on cpu:0."""
    tm = mt.trace_module(_Move(), *_x())
    calls = [(e.method, tuple(e.args[1:])) for e in tm.graph.exprs() if getattr(e, "method", None) == "to"]
    assert calls == [("to", ("cpu:1",)), ("to", ("cpu:1",)), ("to", ("cpu:0",))]
    a, b = _Move()(*_x())
    assert str(a.device) == "cpu:1" and str(b.device) == "cpu:0"
    assert_all_agree(_Move, _x, tmp_path)


def test_a_move_to_the_tensors_own_device_records_nothing():
    class Net(M.Module):
        def forward(self, x):
            return x.to("cpu:0") + 1

    tm = mt.trace_module(Net(), *_x())
    assert not [e for e in tm.graph.exprs() if getattr(e, "method", None) in ("to", "astype")]


# ------------------------------------------- structured inputs (to_folder)
NT = collections.namedtuple("NT", "a b")


class _DictIn(M.Module):
    def forward(self, d, p, xs, opts={"mode": "a'b", "n": 2}):      # noqa: B006
        return {"s": d["a"] + d["b"][0], "l": [d["b"][1] * 2, p.a - p.b, xs[1] * xs[0]]}


class _Sub(M.Module):
    def forward(self, d, scale=2):
        return d["a"] * scale + d["b"]


class _Star(M.Module):
    def __init__(self):
        super().__init__()
        self.s = _Sub()

    def forward(self, x, *rest, k=1.5, **kw):
        return self.s({"a": x, "b": rest[0]}) + kw["z"] * k


class _CallsStar(M.Module):
    def __init__(self):
        super().__init__()
        self.p = _Star()

    def forward(self, x, y, z):
        return self.p(x, y, z=z)


def _r(*shape, seed=0):
    return mt.tensor(np.random.default_rng(seed).standard_normal(shape).astype(np.float32))


def test_dict_list_and_namedtuple_inputs_in_every_variant(tmp_path):
    """to_folder wrote forward(self, d_a, d_b_0, ...), one parameter per
    tensor slot, so the package could not be called as the traced module
    was (TypeError: missing d_b_0); it keeps forward's signature now."""
    def inputs():
        return ({"a": _r(2, 3), "b": (_r(3, seed=1), _r(2, 3, seed=2))},
                NT(_r(2, 3, seed=3), _r(3, seed=4)), [_r(3, seed=5), _r(2, 3, seed=6)])
    assert_all_agree(_DictIn, inputs, tmp_path)


class _StructuredOut(M.Module):
    def __init__(self):
        super().__init__()
        self.w = mt.tensor(np.arange(6, dtype=np.float32).reshape(3, 2) / 10)

    def forward(self, x):
        y = F.matmul(x, self.w)
        Local = collections.namedtuple("Local", "u v")        # not importable by its name
        return NT(y, {"k": [y * 2, 3, None], "od": collections.OrderedDict(z=(y - 1,))}), \
            Local(1.5, y + 1)


def test_namedtuple_and_nested_outputs_in_every_variant(tmp_path):
    """to_folder refused a namedtuple output ("_tree = TreeDef NT(*, *), which
    to_folder cannot write"); it now writes the structure (the namedtuple
    class imported where it can be, else one of the same name and fields),
    dicts, OrderedDicts, lists and the constants the trace fixed in them."""
    assert_all_agree(_StructuredOut, lambda: (_r(2, 3),), tmp_path)
    tm = mt.trace_module(_StructuredOut(), _r(2, 3))
    got = _to_folder(tm, tmp_path / "again")(_r(2, 3, seed=1))
    assert type(got[0]) is NT and type(got[1]).__name__ == "Local"
    assert got[1]._fields == ("u", "v") and got[1].u == 1.5


def test_a_submodule_called_with_a_dict_and_star_arguments(tmp_path):
    assert_all_agree(_CallsStar, lambda: (_r(2, 3), _r(3, seed=1), _r(3, seed=2)), tmp_path)
    tm = mt.trace_module(_CallsStar(), _r(2, 3), _r(3, seed=1), _r(3, seed=2))
    folder = tmp_path / f"star_{abs(hash(str(tmp_path))) % 10**8}"
    tm.to_folder(folder)
    src = "".join(f.read_text() for f in sorted(folder.glob("*.py")))
    assert "def forward(self, x, *rest, k=1.5, **kw):" in src
    assert "def forward(self, d, scale=2):" in src
    # the constants the trace fixed are checked, as the traced module does
    pkg = _import_folder(folder)
    x, y, z = _r(2, 3), _r(3, seed=1), _r(3, seed=2)
    np.testing.assert_array_equal(pkg.Net().p(x, y, z=z).numpy(), tm.p(x, y, z=z).numpy())
    for m in (tm, pkg.Net()):
        with pytest.raises(TypeError, match="k"):
            m.p(x, y, k=2.5, z=z)


# ------------------------------------------------- NumPy scalar constants
class _NumpyScalars(M.Module):
    def forward(self, x):
        return (x * np.float32(1.7), x + np.float16(0.1), x.astype("int32") + np.int64(7),
                x > np.float64(0.2), x * float("inf"), x + np.float32("nan"))


def test_numpy_scalar_constants_in_every_variant(tmp_path):
    """to_folder refused a NumPy scalar the forward captured (GraphError:
    cannot write np.float32(1.7)); it writes np.dtype('float32').type(...)."""
    assert_all_agree(_NumpyScalars, lambda: (_r(2, 3),), tmp_path)


# ------------------------------------------------ storage shared in state
class _TiedWritten(M.Module):
    """b's weight is a's (tied), and forward writes into it."""

    def __init__(self):
        super().__init__()
        mt.random.seed(2)
        self.a = M.Linear(3, 3)
        self.b = M.Linear(3, 3)
        self.b.weight = self.a.weight

    def forward(self, x):
        self.a.weight[0, 0] += 1.0
        return self.b(x)


class _SliceOfBuffer(M.Module):
    """fuzz_pipeline seed 5 case 5: a buffer that is a slice of another,
    which forward updates in place."""

    def __init__(self):
        super().__init__()
        self.stat = mt.tensor(np.zeros(4, np.float32))
        self.head = self.stat[:2]

    def forward(self, x):
        self.stat += x.mean(axis=0)
        return x + self.head.sum()


@pytest.mark.parametrize("make", [_TiedWritten, _SliceOfBuffer])
def test_tensors_sharing_storage_stay_shared_in_every_variant(make, tmp_path):
    """to_folder wrote each tensor on its own, so a write through one no
    longer reached the other (a silent wrong answer from the second call)."""
    tm = mt.trace_module(make(), _r(2, 4 if make is _SliceOfBuffer else 3))
    eager = make()
    calls = [_r(2, 4 if make is _SliceOfBuffer else 3, seed=s) for s in (1, 2)]
    want = [eager(x).numpy() for x in calls]
    for name, m in variants(tm, tmp_path).items():
        if name == "load_mmap":
            continue        # writes into a mapped archive's tensors are refused (read-only)
        for x, w in zip(calls, want):
            np.testing.assert_array_equal(m(x).numpy(), w, err_msg=name)
    pkg = _to_folder(tm, tmp_path / "again")
    if make is _TiedWritten:
        assert pkg.a.weight is pkg.b.weight


class _MadeOnDevices(M.Module):
    def forward(self, x):
        return (x + mt.tensor(np.ones(3, np.float32), device="cpu:1").to("cpu:0"),
                mt.tensor([1.0, 2.0, 3.0], device=x.device) * x)


def test_tensors_made_on_a_device_in_every_variant(tmp_path):
    """A Device the forward passes (device=x.device) is a constant of the
    trace: to_folder refused it (cannot write Device('cpu:0'))."""
    assert_all_agree(_MadeOnDevices, lambda: (_r(2, 3),), tmp_path)


# ---------------------------------------------------- train/eval after trace
class _ReadsTraining(M.Module):
    def forward(self, x):
        if self.training:
            x = x * 2
        return F.dropout(x, 0.5, training=self.training)


class _DropoutModule(M.Module):
    def __init__(self):
        super().__init__()
        self.drop = M.Dropout(0.5)

    def forward(self, x):
        return self.drop(x) + 1


def test_a_forward_reading_self_training_warns_that_the_trace_fixes_it():
    """A trace fixes what forward reads of self.training: the traced
    module's eval()/train() then changed nothing, silently. The trace now
    says so (TraceWarning naming the class and the value fixed)."""
    with pytest.warns(mt.TraceWarning, match=r"_ReadsTraining.forward reads self.training .* "
                                             r"fixes it to False"):
        tm = mt.trace_module(_ReadsTraining().eval(), _r(4, 5))
    x = _r(4, 5, seed=1)
    np.testing.assert_array_equal(tm.train()(x).numpy(), x.numpy())     # as the warning says


def test_a_builtin_dropout_follows_the_traced_modules_mode(recwarn):
    """No warning where the flag is read by a builtin module at run time:
    its train()/eval() after the trace changes the answer as eager's does."""
    tm = mt.trace_module(_DropoutModule().eval(), _r(40, 30))
    assert not [w for w in recwarn if issubclass(w.category, mt.TraceWarning)]
    x = _r(40, 30, seed=1)
    np.testing.assert_array_equal(tm(x).numpy(), x.numpy() + 1)
    eager = _DropoutModule().train()
    mt.random.seed(3)
    want = eager(x).numpy()
    mt.random.seed(3)
    np.testing.assert_array_equal(tm.train()(x).numpy(), want)
    assert (want == 1).sum() > 0        # dropped some


# ------------------------------------------------- optimized for inference
class _ConvBnDrop(M.Module):
    def __init__(self):
        super().__init__()
        self.conv = M.Conv2d(3, 4, 3, padding=1)
        self.bn = M.BatchNorm2d(4)
        self.drop = M.Dropout(0.5)

    def forward(self, x):
        return self.drop(F.relu(self.bn(self.conv(x))))


def _img(seed=0):
    return mt.tensor(np.random.default_rng(seed).standard_normal((2, 3, 6, 6), np.float32))


def test_train_on_an_inference_optimized_module_says_what_was_removed(tmp_path):
    """optimize(tm, "all") of an eval-mode trace folds the BatchNorm and
    drops the Dropout; train() on the result kept computing the eval-mode
    function, silently. It now raises, naming each pass and what it removed,
    also after a save/load, and where a parent's train() reached it."""
    tm = mt.trace_module(_ConvBnDrop().eval(), _img())
    fast = optimize(tm, "all")
    expected = (r"EliminateIdentity removed 1 Dropout call; FuseConvBn removed 1 BatchNorm2d "
                r"call\)")
    with pytest.raises(mt.traced_module.InferenceOnlyError, match=expected):
        fast.train()
    assert fast.training is False
    np.testing.assert_allclose(fast.eval()(_img(1)).numpy(), tm(_img(1)).numpy(), atol=1e-5)
    with pytest.raises(mt.traced_module.InferenceOnlyError, match=expected):
        _load(fast).train()
    parent = M.Sequential(fast).train()                 # Module.train sets the flag directly
    with pytest.raises(mt.traced_module.InferenceOnlyError, match="cannot train"):
        parent(_img(1))
    # optimized in training mode: nothing removed, train() and eval() both work
    tm.train()
    kept = optimize(tm, "all")
    assert kept.train().training and not kept.eval().training
    # the default pass list (FuseConvBn only) records just what it folded
    with pytest.raises(mt.traced_module.InferenceOnlyError,
                       match=r"\(FuseConvBn removed 1 BatchNorm2d call\)"):
        optimize(tm.eval()).train()


class _Scaled(M.Module):
    def __init__(self):
        super().__init__()
        self.k = 3
        self.offsets = [1.0, 2.0]
        self.scale = mt.tensor(np.float32(2.0))          # a buffer: read at every call

    def forward(self, x):
        return x * self.k + self.offsets[1] + self.scale


def test_rebinding_a_traced_plain_attribute_warns_that_it_changes_nothing(recwarn):
    """``tm.k = 5`` after the trace was silently ignored (the graph holds the
    3 it read). It still computes with 3, and now says so; a tensor
    attribute is read at every call and changes the answer, silently."""
    x = mt.tensor(np.arange(3, dtype=np.float32))
    tm = mt.trace_module(_Scaled(), x)
    with pytest.warns(mt.TraceWarning, match=r"_Scaled\.k = 5: the traced graphs never read "
                                             r"this attribute; .* \(3\) is a constant"):
        tm.k = 5
    np.testing.assert_array_equal(tm(x).numpy(), np.arange(3) * 3 + 2.0 + 2.0)
    with pytest.warns(mt.TraceWarning, match=r"_Scaled\.offsets = \[0\.0, 0\.0\]"):
        tm.offsets = [0.0, 0.0]
    recwarn.clear()
    tm.scale = mt.tensor(np.float32(10.0))
    tm.eval()
    tm.extra = 1                                        # a new attribute: nothing traced it
    assert not [w for w in recwarn if issubclass(w.category, mt.TraceWarning)]
    np.testing.assert_array_equal(tm(x).numpy(), np.arange(3) * 3 + 2.0 + 10.0)


def test_tracing_a_traced_module_again_does_not_warn_about_training(recwarn):
    """TracedModule.forward's own refusal of an inference-only module in
    training mode must not read ``training`` in forward's code: the tracer
    takes such a read for the user's branch and warns on every retrace."""
    x = _img()
    tm = mt.trace_module(_ConvBnDrop().eval(), x)
    for m in (tm, optimize(tm, "all")):
        again = mt.trace_module(m, x)
        np.testing.assert_array_equal(again(x).numpy(), m(x).numpy())
    assert not [w for w in recwarn if "self.training" in str(w.message)]
