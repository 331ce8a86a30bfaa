"""scripts/fuzz_pipeline.py at a size CI affords (a long run is 20,000
modules; see its docstring): a fixed seed's few hundred random modules give
eager's outputs, state and inputs through every variant (traced, optimized,
saved and loaded, deep-copied, format 1.0), and the fuzzer's own parts
(its comparison rule, its shrinker, --without, the regression files it
writes) do what they say."""
import importlib.util
from pathlib import Path

import numpy as np
import pytest

import mgtrace.module as M

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "fuzz_pipeline.py"

# Feature families left out of the CI run while a defect they find is open
# (each with a comment naming it and its issue); none now: issue 29's fixes
# (view traced, range warns, written and storage-sharing state never folded,
# parameters written in forward put back, aliases kept by deepcopy and the
# archive, Winograd keeping NaN/inf in place) cover every family.
KNOWN_OPEN = frozenset()
CI_CASES, CI_SEED = 300, 29


def _fuzz():
    spec = importlib.util.spec_from_file_location("fuzz_pipeline", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def fuzz():
    return _fuzz()


def test_a_fixed_seed_run_finds_nothing_outside_the_known_open_families(fuzz):
    summary = fuzz.run(CI_CASES, 1, seed=CI_SEED, without=KNOWN_OPEN, quiet=True)
    assert summary["cases"] == CI_CASES
    assert summary["checked"] >= CI_CASES * 0.97           # the generator seldom dead-ends
    assert summary["failing"] == 0, "\n".join(
        f"{sig}: {b['count']} cases, e.g. {b['cases'][:3]}: {b['example']['detail']}\n"
        + fuzz.forward_source(b["example"]["spec"]) for sig, b in summary["by_signature"].items())


def test_the_ci_run_covers_every_family_not_left_out(fuzz):
    used = set()
    for i in range(CI_CASES):
        used.update(fuzz.families(fuzz.make_spec(CI_SEED, i, KNOWN_OPEN)))
    assert used == set(fuzz.FAMILIES) - KNOWN_OPEN


def test_cases_are_reproducible_and_without_leaves_families_out(fuzz):
    assert fuzz.make_spec(3, 17) == fuzz.make_spec(3, 17)
    assert fuzz.source(fuzz.make_spec(3, 17)) == fuzz.source(fuzz.make_spec(3, 17))
    assert fuzz.make_spec(3, 17) != fuzz.make_spec(3, 18)
    off = {"tied", "nan", "batch", "inplace"}
    for i in range(200):
        spec = fuzz.make_spec(3, i, off)
        assert not set(fuzz.families(spec)) & off
        assert spec["batch"][0] == spec["batch"][1] and not spec["nan"]


@pytest.mark.parametrize("want, got, kind", [
    ([100.0, 1.0], [100.0, 1.0009], None),          # error 9e-4 <= 1e-5 * 100
    ([100.0, 1.0], [100.0, 1.0011], "value"),       # 1.1e-3 > 1e-3
    ([0.0, -0.0], [-0.0, 0.0], None),               # the sign of zero is not compared
    ([np.nan, 1.0], [1.0, np.nan], "nan"),          # NaN at other places
    ([np.inf, 1.0], [-np.inf, 1.0], "inf"),
    ([np.inf, np.nan, 2.0], [np.inf, np.nan, 2.00001], None),   # scale from finite values
])
def test_floats_are_compared_by_the_issues_rule(fuzz, want, got, kind):
    want, got = np.array(want, np.float32), np.array(got, np.float32)
    if kind is None:
        fuzz.compare_array(want, got, "x")
    else:
        with pytest.raises(fuzz.Mismatch) as e:
            fuzz.compare_array(want, got, "x")
        assert e.value.kind == kind


def test_integers_dtypes_shapes_and_structure_are_compared_exactly(fuzz):
    for want, got, kind in [(np.array([1, 2], np.int32), np.array([1, 3], np.int32), "int"),
                            (np.array([1, 2], np.int32), np.array([1, 2], np.int64), "dtype"),
                            (np.zeros((2, 3), np.float32), np.zeros((3, 2), np.float32), "shape")]:
        with pytest.raises(fuzz.Mismatch) as e:
            fuzz.compare_array(want, got, "x")
        assert e.value.kind == kind
    with pytest.raises(fuzz.Mismatch) as e:
        fuzz.compare(("(T,T)", [np.zeros(1), np.zeros(1)]), ("[T,T]", [np.zeros(1), np.zeros(1)]))
    assert e.value.kind == "structure"


class _Off(M.Module):
    """A planted bug: the module's output off by 1e-3 of its scale whenever
    its graph calls tanh."""

    def __init__(self, tm):
        super().__init__()
        self.tm = tm

    def forward(self, x):
        y = self.tm(x)
        return y * 1.001 if "tanh" in self.tm.code else y


def _spec(steps, **kw):
    spec = {"seed": 0, "case": 0, "in": [4, 6, 6], "batch": [2, 2], "odd": False, "nan": False,
            "f64": False, "train": False, "outputs": "plain", "data_seed": 5, "steps": steps}
    spec.update(kw)
    return spec


def test_a_planted_bug_is_found_shrunk_and_named(fuzz, monkeypatch):
    monkeypatch.setitem(fuzz.VARIANTS, "planted", _Off)
    tanh = ["unary", [5] * 7]                   # _UNARY[5] is F.tanh(h)
    assert fuzz._UNARY[5] == "F.tanh(h)"
    spec = _spec([["conv", [1] * 7], ["pool", [0] * 7], tanh, ["bn", [0] * 7], ["act", [0] * 7]],
                 nan=True, batch=[2, 3])
    failures, _ = fuzz.run_spec(spec, ["traced", "planted"])
    assert [(v, k) for v, k, _ in failures] == [("planted", "value")]
    small = fuzz.shrink(spec, lambda c: fuzz.fails_like(c, "planted", "value"))
    assert small["steps"] == [tanh] and not small["nan"] and small["batch"][0] == small["batch"][1]
    assert fuzz.signature(small, "planted", "value") == "planted/value/unary"


def test_state_and_written_inputs_are_compared(fuzz, monkeypatch):
    """A variant whose buffer does not move, or that leaves the caller's
    input alone where eager writes into it, fails."""
    class Frozen(M.Module):
        def __init__(self, tm):
            super().__init__()
            self.inner = tm

        def forward(self, x):
            return self.inner(x.copy())         # eager writes into x; this does not

        def state_dict(self, *a, **k):
            return self.inner.state_dict(*a, **k)

        def named_buffers(self, *a, **k):
            return self.inner.named_buffers(*a, **k)

    monkeypatch.setitem(fuzz.VARIANTS, "frozen", Frozen)
    spec = _spec([["inplace", [4, 2] + [0] * 5]])      # x += 1.0
    assert "x += 1.0" in fuzz.source(spec)
    failures, _ = fuzz.run_spec(spec, ["traced", "frozen"])
    assert [(v, k) for v, k, _ in failures] == [("frozen", "input-value")]


def test_a_regression_file_runs_the_shrunk_module_through_its_variant(fuzz, tmp_path):
    spec = _spec([["convblock", [1] * 7], ["to_vec", [0] * 7]])
    fail = {"signature": "optimize/value/convblock+to_vec", "variant": "optimize",
            "kind": "value", "seed": 0, "case": 0, "detail": "planted", "spec": spec}
    path = tmp_path / "test_regression.py"
    path.write_text(fuzz.regression_source(fail))
    src = path.read_text()
    assert "xfail(strict=True" in src and "class Net(M.Module)" in src
    ns = {"__file__": str(SCRIPT.parent / "x.py"), "__name__": "regression"}
    exec(compile(src, str(path), "exec"), ns)           # noqa: S102  the file just written
    ns["test_optimize_value_convblock_to_vec"]()        # this module has no bug: it passes


def test_an_error_rounding_explains_is_told_from_a_real_one(fuzz):
    """(x * 1000) % 1: a 2-ulp nudge of x moves eager's output by about
    1000 * 2.4e-7 * |x| (~1e-4 here), so an error of 1e-4 is rounding's,
    one of 0.1 is not."""
    src = ("import numpy as np\nimport mgtrace as mt\nimport mgtrace.module as M\n"
           "class Net(M.Module):\n    def forward(self, x):\n        return (x * 1000.0) % 1.0\n"
           "def build():\n    return Net()\n"
           "def inputs(call):\n    rng = np.random.default_rng(call)\n"
           "    return (mt.tensor(rng.uniform(1.0, 2.0, (2, 64)).astype('float32')),)\n")
    ns = fuzz.load_source(src)
    inputs_np, want = fuzz.reference(ns)
    sens = fuzz._sensitivity(ns, inputs_np, want)
    assert 1e-5 < sens < 1.0                 # a nudge crosses an integer somewhere: up to ~1
    memo = []
    assert fuzz._ill_conditioned(sens, ns, inputs_np, want, memo)
    assert not fuzz._ill_conditioned(fuzz.ILL_FACTOR * sens * 2, ns, inputs_np, want, memo)
