"""The pass manager: passes declare what they require and run after, the
manager orders them topologically (ties by registration order), names the
passes of a cycle or a missing requirement, names the pass an exception
came from, and keeps what each pass returned (``(tm, changed, counts)``)
in optimize's report.

Values are checked against NumPy (a conv + BatchNorm + ReLU computed by
hand) and against hand-counted rewrites."""
import warnings

import numpy as np
import pytest

import mgtrace as mt
import mgtrace.functional as F
import mgtrace.module as M
from mgtrace.traced_module import (GraphError, OptimizeReport, PassError, PassOrderError,
                                   PassResult, TracedModule, optimize, register_pass)
from mgtrace.traced_module.passes import manager


@pytest.fixture(autouse=True)
def _own_registry(monkeypatch):
    """Passes registered by a test are forgotten after it."""
    monkeypatch.setattr(manager, "_PASSES", dict(manager._PASSES))


class ConvBnRelu(M.Module):
    def __init__(self):
        super().__init__()
        self.conv = M.Conv2d(3, 4, 3, padding=1, bias=False)
        self.bn = M.BatchNorm2d(4)
        self.act = M.ReLU()

    def forward(self, x):
        return self.act(self.bn(self.conv(x)))


@pytest.fixture
def traced():
    rng = np.random.default_rng(7)
    net = ConvBnRelu()
    net.bn.running_mean = mt.tensor(rng.uniform(-0.5, 0.5, 4).astype("float32"))
    net.bn.running_var = mt.tensor(rng.uniform(0.5, 1.5, 4).astype("float32"))
    x = mt.tensor(rng.standard_normal((2, 3, 6, 6)).astype("float32"))
    return mt.trace_module(net.eval(), x), net, x


def _numpy_reference(net, x):
    """relu(bn(conv(x))) in float64 NumPy (stride 1, padding 1)."""
    w = net.conv.weight.numpy().astype(np.float64)
    xp = np.pad(x.numpy().astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
    n, _, h, wd = x.shape
    y = np.zeros((n, w.shape[0], h, wd))
    for i in range(3):
        for j in range(3):
            y += np.einsum("nchw,oc->nohw", xp[:, :, i:i + h, j:j + wd], w[:, :, i, j])
    bn = net.bn
    mean, var = bn.running_mean.numpy()[None, :, None, None], bn.running_var.numpy()[None, :, None, None]
    g, b = bn.weight.numpy()[None, :, None, None], bn.bias.numpy()[None, :, None, None]
    return np.maximum((y - mean) / np.sqrt(var + bn.eps) * g + b, 0)


# ------------------------------------------------------------------ ordering

def test_the_builtin_order_satisfies_every_declaration():
    position = {n: i for i, n in enumerate(manager._ORDER)}
    assert set(position) == {n for n, p in manager.registered_passes().items() if p.builtin}
    for name in manager._ORDER:
        info = manager.get_pass(name)
        for before in info.requires + info.after:
            assert position[before] < position[name], (before, name)
    assert manager.get_pass("BackwardFoldScale").requires == ("FuseConvBn",)
    assert manager._ORDER[-1] == "EliminateDeadCode"


def _order(tm, enabled):
    """The passes optimize ran, in order."""
    return list(optimize(tm, enabled, return_report=True)[1])


def test_the_order_of_enabled_pass_does_not_matter(traced):
    tm, _, _ = traced
    asked = ["EliminateDeadCode", "FuseConvAct", "FoldConstant", "FuseConvBn"]
    assert _order(tm, asked) == ["FoldConstant", "FuseConvBn", "FuseConvAct", "EliminateDeadCode"]
    assert _order(tm, list(reversed(asked))) == _order(tm, asked)


def test_user_passes_run_after_ours_in_the_order_given_unless_declared(traced):
    tm, _, _ = traced
    noop = lambda tm: PassResult(tm, False, {})          # noqa: E731
    register_pass("TestA", noop)
    register_pass("TestB", noop)
    register_pass("TestC", noop, after=["TestA"])
    assert _order(tm, ["TestB", "TestA", "FuseConvBn"]) == ["FuseConvBn", "TestB", "TestA"]
    assert _order(tm, ["TestC", "TestA"]) == ["TestA", "TestC"]
    assert _order(tm, ["TestC"]) == ["TestC"]          # after: only when both run


def test_requires_brings_the_pass_along_before_it_with_a_warning(traced):
    tm, _, _ = traced
    seen = []
    register_pass("TestFirst", lambda tm: seen.append("first"))
    register_pass("TestSecond", lambda tm: seen.append("second"), requires="TestFirst")
    with pytest.warns(UserWarning, match="TestSecond needs TestFirst to run first"):
        optimize(tm, ["TestSecond"])
    assert seen == ["first", "second"]


def test_a_cycle_is_an_error_naming_its_passes(traced):
    tm, _, _ = traced
    noop = lambda tm: None                               # noqa: E731
    register_pass("TestX", noop, after="TestZ")
    register_pass("TestY", noop, after="TestX")
    register_pass("TestZ", noop, requires="TestY")
    register_pass("TestFree", noop)
    with pytest.raises(PassOrderError, match="TestX -> TestZ -> TestY -> TestX") as e:
        optimize(tm, ["TestFree", "TestX", "TestY", "TestZ"])
    assert isinstance(e.value, ValueError) and "TestFree" not in str(e.value)


def test_a_missing_requirement_is_an_error_naming_both(traced):
    tm, _, _ = traced
    register_pass("TestNeedy", lambda tm: None, requires="FuseConvBm")
    with pytest.raises(PassOrderError, match="'TestNeedy' requires 'FuseConvBm', which is not "
                                             "registered.*Did you mean 'FuseConvBn'"):
        optimize(tm, "TestNeedy")
    register_pass("TestLate", lambda tm: None, after="NoSuchPass")
    with pytest.raises(PassOrderError, match="'TestLate' is declared to run after 'NoSuchPass'"):
        optimize(tm, "TestLate")


def test_register_pass_checks_the_declarations():
    with pytest.raises(TypeError, match="requires holds pass names"):
        register_pass("TestBad", lambda tm: None, requires=[3])
    with pytest.raises(TypeError, match="after holds pass names"):
        register_pass("TestBad", lambda tm: None, after=[""])


# ------------------------------------------------------------------ errors

def test_an_exception_inside_a_pass_names_the_pass(traced):
    tm, _, _ = traced

    def broken(tm):
        raise ZeroDivisionError("the pass divided by zero")

    register_pass("TestBroken", broken)
    with pytest.raises(PassError, match="the pass 'TestBroken' raised ZeroDivisionError: the "
                                        "pass divided by zero") as e:
        optimize(tm, ["FuseConvBn", "TestBroken"])
    assert e.value.pass_name == "TestBroken" and isinstance(e.value, RuntimeError)
    assert isinstance(e.value.__cause__, ZeroDivisionError)


def test_a_graph_error_inside_a_builtin_pass_names_it(traced, monkeypatch):
    tm, _, _ = traced

    def bad_fold(tm):
        raise GraphError("a broken edit")

    monkeypatch.setitem(manager._PASSES, "FuseConvBn",
                        manager.get_pass("FuseConvBn")._replace(fn=bad_fold))
    with pytest.raises(PassError, match="'FuseConvBn' raised GraphError: a broken edit") as e:
        optimize(tm)
    assert isinstance(e.value.__cause__, GraphError)


def test_counts_that_are_no_dict_are_an_error(traced):
    tm, _, _ = traced
    register_pass("TestBadCounts", lambda tm: (tm, True, 5))
    with pytest.raises(PassError, match="'TestBadCounts' returned counts 5"):
        optimize(tm, "TestBadCounts")


# ------------------------------------------------------------------ results

def test_the_report_keeps_each_pass_result(traced):
    tm, net, x = traced
    register_pass("TestNoSay", lambda tm: None)
    register_pass("TestCounts", lambda tm: PassResult(tm, True, {"looks": 3}))
    new, report = optimize(tm, ["FuseConvBn", "FuseConvAct", "EliminateDeadCode", "TestNoSay",
                                "TestCounts"], return_report=True)
    assert isinstance(report, OptimizeReport)
    assert list(report) == ["FuseConvBn", "FuseConvAct", "EliminateDeadCode", "TestNoSay",
                            "TestCounts"]
    assert report["FuseConvBn"].counts == {"folds": 1} and report["FuseConvBn"].changed is True
    assert report["FuseConvAct"].counts == {"fusions": 1}
    # each pass compiles the graphs it edits, so no dead expr is left for this one
    assert report["EliminateDeadCode"].counts == {"exprs removed": 0}
    assert report["TestNoSay"].changed is None and report["TestNoSay"].counts == {}
    assert report["TestCounts"] == ("TestCounts", True, {"looks": 3}, report["TestCounts"].seconds)
    assert all(r.seconds >= 0 for r in report.values())
    assert functions(new, F.conv2d_act) == 1
    np.testing.assert_allclose(new(x).numpy(), _numpy_reference(net, x), rtol=1e-5, atol=1e-5)


def test_a_pass_that_changes_nothing_says_so(traced):
    tm, _, _ = traced
    _, report = optimize(tm, ["FuseLinearAct", "FuseAttention"], return_report=True)
    assert [(r.changed, r.counts) for r in report.values()] == \
        [(False, {"fusions": 0}), (False, {"fusions": 0})]


def test_backward_fold_scale_reports_its_folds_and_the_merges_after(traced):
    class Scaled(M.Module):
        def __init__(self):
            super().__init__()
            self.conv = M.Conv2d(3, 4, 1)

        def forward(self, x):
            return (self.conv(x) * 2.0) * 3.0

    x = traced[2]
    tm = mt.trace_module(Scaled().eval(), x)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        new, report = optimize(tm, ["FuseConvBn", "FuseAddMul", "BackwardFoldScale"],
                               return_report=True)
    assert report["FuseAddMul"].counts == {"merges": 1}                 # * 2 * 3 -> * 6
    assert report["BackwardFoldScale"].counts == {"folds": 1, "merges": 0}
    np.testing.assert_allclose(new(x).numpy(), tm(x).numpy(), rtol=1e-5, atol=1e-6)


def test_a_pass_may_return_a_new_module(traced):
    tm, _, x = traced
    replacement = []

    def swap(tm):
        other = tm.flatten()
        replacement.append(other)
        return PassResult(other, True, {"swaps": 1})

    register_pass("TestSwap", swap)
    new, report = optimize(tm, ["TestSwap", "FuseConvBn"], return_report=True)
    assert list(report) == ["FuseConvBn", "TestSwap"]
    assert new is replacement[0] and isinstance(new, TracedModule)


def test_verbose_prints_the_report(traced, capsys):
    tm, _, _ = traced
    optimize(tm, "all", verbose=True)
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["pass", "changed", "ms", "counts"]
    rows = {line.split()[0]: line for line in out[1:]}
    assert "folds=1" in rows["FuseConvBn"] and rows["FuseConvBn"].split()[1] == "yes"
    assert rows["FuseLinearAct"].split()[1] == "no"


def functions(tm, fn):
    return tm.graph.get_function_by_type(fn).as_count()


@pytest.mark.parametrize("name", ["manager", "pattern"])
def test_docstring_examples(name):
    import doctest
    import importlib
    mod = importlib.import_module(f"mgtrace.traced_module.passes.{name}")
    result = doctest.testmod(mod, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0 and result.attempted > 0


@pytest.mark.parametrize("bad", [3, 2.5])
def test_a_non_iterable_enabled_pass_names_the_argument(traced, bad):
    tm = traced[0]
    with pytest.raises(TypeError, match="optimize: enabled_pass must be None, 'all', a pass "
                                        "name or a list of them, got"):
        optimize(tm, bad)
