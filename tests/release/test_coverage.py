"""The coverage gates (issue 37, item 4): CI fails when any (function,
version) or (builtin module type, version) of schema/ops.json lacks a golden
case, an upgrader test from each older version or a minimum reader
version, and when a value tag lacks a golden case. Each gate is shown
failing on a made-up change too, with the message that says how to fix it."""
import importlib.util
import json
import sys

import numpy as np
import pytest

import mgtrace as mt
from mgtrace.serialization import upgraders, values
from mgtrace.serialization.upgraders import run_chain
from mgtrace.serialization.version import _released

from . import gates as G
from . import releases as R
from .upgrader_cases import CASES


def _coverage():
    """schema/golden/coverage.py, imported by path once (as the makers do)."""
    name = "golden_coverage"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, R.SCHEMA / "golden" / "coverage.py")
        sys.modules[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules[name])
    return sys.modules[name]


@pytest.fixture(scope="module")
def covered():
    return _coverage().all_uses()


def _released_tables():
    return {tuple(r["format"]): _released(tuple(r["format"])) for r in R.load_releases()
            if tuple(r["format"]) < mt.FORMAT_VERSION}


UPGRADERS = {"functions": upgraders.FUNCTION_UPGRADERS, "module_types": upgraders.MODULE_UPGRADERS}
HOW = G.maker_command(mt.FORMAT_VERSION, R.load_releases())


def test_every_function_module_type_and_value_tag_has_a_golden_case(covered):
    problems = G.golden_case_problems(G.current_ops(), covered, values.TAGS, HOW)
    assert problems == [], "\n".join(problems)


def test_every_tensor_method_a_graph_records_has_a_golden_case(covered):
    ops = json.loads((R.SCHEMA / "ops.json").read_text())
    problems = G.tensor_method_problems(ops["tensor_methods"], covered, HOW)
    assert problems == [], "\n".join(problems)


def test_every_core_op_has_a_golden_case_as_an_apply_expr(covered):
    """schema/golden/1.1/core_ops.tmod applies every core op but gather and
    scatter raw, 1.2/core_ops_index.tmod those two, 1.2/core_ops_kernels.tmod
    the four new in 1.2 (conv3d, conv_transpose3d, lstm_cell, rnn_cell;
    117 in all)."""
    ops = json.loads((R.SCHEMA / "ops.json").read_text())
    problems = G.core_op_problems(ops["core_ops"], covered, HOW)
    assert problems == [], "\n".join(problems)
    assert len(ops["core_ops"]) == 117


def test_the_methods_without_a_golden_case_are_never_recorded():
    """NEVER_RECORDED stays true: a graph node has none of these methods
    (inside insert_exprs they raise), and a trace of a forward that calls
    each records none of them: item/numpy/tolist become constants (with a
    TraceWarning each); to() of the device the tensor is on records nothing."""
    import numpy as np
    import mgtrace.module as M
    from mgtrace.traced_module.node import TensorNode
    assert not any(hasattr(TensorNode, m) for m in G.NEVER_RECORDED)

    class Net(M.Module):
        def forward(self, x):
            s = x.sum().item()
            n = float(x.numpy()[0, 1]) + x.tolist()[1][0]
            return x.to(x.device) * s + n

    x = mt.tensor(np.arange(6, dtype=np.float32).reshape(2, 3))
    with pytest.warns(mt.TraceWarning) as w:
        tm = mt.trace_module(Net(), x)
    assert sorted({str(r.message).split(" ")[0] for r in w}) == ["t.item()", "t.numpy()"]
    methods = {getattr(e, "method", None) for e in tm.graph.exprs()}
    assert not methods & (G.NEVER_RECORDED | {"to"}), methods
    # constants fixed at the traced values: 15 and 1 + 3, for any input
    y = mt.tensor(np.ones((2, 3), np.float32))
    np.testing.assert_array_equal(tm(y).numpy(), np.full((2, 3), 15.0 + 4.0, np.float32))


@pytest.mark.parametrize("method, args, want", [
    ("item", [], 30.0), ("tolist", [], 30.0), ("numpy", [], np.float32(30.0)),
    ("to", ["cpu"], None)])
def test_a_stored_graph_that_calls_one_runs_as_eager_code(method, args, want):
    """A hand-made archive whose graph calls x.sum().METHOD(...) where a
    trace has x.sum().astype("float32"): it loads and runs as the eager
    call (a value flows on out of the graph; to() keeps the tensor)."""
    import io
    import mgtrace.module as M
    from serialization.helpers import edit

    class Net(M.Module):
        def forward(self, x):
            return x.sum().astype("float32") * 2

    x = mt.tensor(np.arange(6, dtype=np.float32).reshape(2, 3))
    buf = io.BytesIO()
    mt.save(mt.trace_module(Net(), x), buf)

    def call(h):
        [e] = [e for e in h["modules"][0]["graphs"][0]["exprs"] if e.get("method") == "astype"]
        e["method"], e["args"] = method, {"list": args}
    got = mt.load(io.BytesIO(edit(buf.getvalue(), call)))(x)
    if want is None:
        assert isinstance(got, mt.Tensor) and got.numpy() == np.float32(30.0)
    else:
        assert type(got) is type(want) and got == want
    assert G.tensor_method_problems(["__add__", "item", "new_method"], {}, "FIX") == [
        "tensor method '__add__' has no golden case: FIX",
        "tensor method 'new_method' has no golden case: FIX"]


def test_every_older_version_has_an_upgrader_and_its_test():
    problems = G.upgrader_problems(G.current_ops(), CASES, UPGRADERS)
    assert problems == [], "\n".join(problems)


def test_every_version_has_a_minimum_reader_version(covered):
    problems = G.min_reader_problems(G.current_ops(), covered, _released_tables(),
                                     R.load_releases(), mt.FORMAT_VERSION)
    assert problems == [], "\n".join(problems)


@pytest.mark.parametrize("key", sorted(CASES) or [None])
def test_upgrader_case(key):
    """Each case of upgrader_cases.py: what version v stored, upgraded
    through the registered chain, is what the current version takes."""
    if key is None:
        assert all(not chain for chain in upgraders.FUNCTION_UPGRADERS.values())
        return
    what, name, v = key
    stored, expected = CASES[key]
    kind = "functions" if what == "function" else "module_types"
    current = dict(G.current_ops()[kind])[name]
    assert run_chain(what, name, v, current, UPGRADERS[kind][name], stored) == expected


def test_the_1_1_compendium_alone_covers_its_format(covered):
    """schema/golden/1.1 holds every function and builtin module type of
    format 1.1 at its version (152 and 31) and every value tag (14)."""
    released = _released((1, 1))
    got = _coverage().totals(covered["1.1"].values())
    assert set(released["functions"].items()) <= got["functions"]
    assert set(released["module_types"].items()) <= got["module_types"]
    tags = {t for t, decl in values.TAGS.items() if tuple(decl.since) <= (1, 1)}   # not 1.2's
    assert tags <= got["tags"]
    assert (len(released["functions"]), len(released["module_types"]), len(tags)) == \
        (152, 31, 14)


# ------------------------------------------------ the gates, tried on a change

def test_an_op_version_without_a_golden_case_fails(covered):
    ops = G.current_ops()
    ops["functions"] = (ops["functions"] - {("mgtrace.functional.relu", 1)}) | \
        {("mgtrace.functional.relu", 2)}
    dev = ".".join(map(str, mt.FORMAT_VERSION))
    assert G.golden_case_problems(ops, covered, values.TAGS, HOW) == [
        f"function mgtrace.functional.relu version 2 has no golden case: add a case that uses "
        f"it to schema/golden/{dev}/make_golden.py and run `python schema/golden/{dev}/"
        f"make_golden.py` (format {dev} is in development: that command rewrites its golden "
        "archives and manifest.json)"]


def test_a_new_function_type_or_tag_without_a_golden_case_fails(covered):
    ops = G.current_ops()
    ops["functions"] |= {("mgtrace.functional.new_op", 1)}
    ops["module_types"] |= {("mgtrace.module.NewModule", 1)}
    problems = G.golden_case_problems(ops, covered, list(values.TAGS) + ["qparams"], "FIX")
    assert problems == [
        "function mgtrace.functional.new_op version 1 has no golden case: FIX",
        "builtin module type mgtrace.module.NewModule version 1 has no golden case: FIX",
        "value tag 'qparams' has no golden case: FIX"]


def test_a_core_op_without_a_golden_case_fails(covered):
    ops = json.loads((R.SCHEMA / "ops.json").read_text())
    dev = ".".join(map(str, mt.FORMAT_VERSION))
    assert G.core_op_problems(ops["core_ops"] + ["new_op"], covered, HOW) == [
        "core op 'new_op' has no golden case (an Apply expr: a traced forward that calls "
        "mgtrace.apply(OpDef('new_op', params), *inputs)): add a case that uses it to "
        f"schema/golden/{dev}/make_golden.py and run `python schema/golden/{dev}/make_golden.py` "
        f"(format {dev} is in development: that command rewrites its golden archives and "
        "manifest.json)"]
    # an archive gone: its core ops are reported, each by name
    without = {f: {n: u for n, u in a.items() if n != "core_ops.tmod"} for f, a in covered.items()}
    problems = G.core_op_problems(ops["core_ops"], without, "FIX")
    assert len(problems) == 110 and problems[0] == (
        "core op 'abs' has no golden case (an Apply expr: a traced forward that calls "
        "mgtrace.apply(OpDef('abs', params), *inputs)): FIX")


def test_a_released_format_names_the_command_for_a_new_minor():
    rel = [{"version": "0.3.0", "commit": "a" * 40, "format": [1, 2]}]
    assert G.maker_command((1, 2), rel).startswith(
        "format 1.2 is released (frozen): raise FORMAT_VERSION to a new minor")


def test_an_upgrader_without_its_test_fails():
    ops = {"functions": {("mgtrace.functional.relu", 3)}, "module_types": {("mgtrace.module.Linear", 2)}}
    ups = {"functions": {"mgtrace.functional.relu": {1: dict, 2: dict}},
           "module_types": {"mgtrace.module.Linear": {1: dict}}}
    cases = {("function", "mgtrace.functional.relu", 1): ({}, {}),
             ("function", "mgtrace.functional.relu", 2): ({}, {}),
             ("builtin module type", "mgtrace.module.Linear", 1): ({}, {})}
    assert G.upgrader_problems(ops, cases, ups) == []
    del cases[("function", "mgtrace.functional.relu", 2)]          # remove an upgrader test
    del ups["module_types"]["mgtrace.module.Linear"][1]             # and an upgrader
    assert G.upgrader_problems(ops, cases, ups) == [
        "function mgtrace.functional.relu is version 3 but its upgrader from version 2 has no "
        "test: add ('function', 'mgtrace.functional.relu', 2): (stored, expected) to "
        "tests/release/upgrader_cases.py",
        "builtin module type mgtrace.module.Linear is version 2 but has no upgrader from "
        "version 1: add one to mgtrace/serialization/upgraders.py"]


def test_a_missing_minimum_reader_version_fails(covered):
    ops = G.current_ops()
    released = _released_tables()
    releases = R.load_releases()
    # a released format without its table of names
    del released[(1, 1)]
    problems = G.min_reader_problems(ops, covered, released, releases, mt.FORMAT_VERSION)
    assert problems[0] == (
        "format 1.1 (release 0.2.0) has no table of the functions and module types it knew, "
        "so no minimum reader version can be given: add mgtrace/serialization/released_ops/"
        "1.1.json (schema/ops.json as release 0.2.0 had it)")
    # a golden archive that calls a 1.1 function but says a 1.0 reader will do
    released = _released_tables()
    fake = {"1.1": {"x.tmod": {"functions": {("mgtrace.functional.attention", 1)},
                               "module_types": set(), "versions": ((1, 1), (1, 0))}}}
    assert G.min_reader_problems(ops, fake, released, releases, mt.FORMAT_VERSION) == [
        "schema/golden/1.1/x.tmod uses function mgtrace.functional.attention version 1, which "
        "a format 1.1 reader first knows, but says min_reader_version 1.0: the writer must "
        "raise min_reader_version for it (registry.py's since, released_ops/)"]
    # a name a released format had, gone from the op table
    ops["functions"] = {(n, v) for n, v in ops["functions"] if n != "mgtrace.functional.relu"}
    assert ("function mgtrace.functional.relu version 1 was in format 1.0 and is gone from "
            "schema/ops.json: archives of that format call it; keep it (a name is never "
            "removed, only versioned)") in G.min_reader_problems(ops, {}, released, releases,
                                                                  mt.FORMAT_VERSION)


def test_the_golden_folders_hold_what_their_format_knows():
    """Each released format's compendium alone holds every function and
    module type its readers know (1.1's maker checks it; 1.0's is older
    than the rule and covers 1.0's functions through functional.tmod)."""
    spec = importlib.util.spec_from_file_location("golden_1_1", R.SCHEMA / "golden" / "1.1" /
                                                  "make_golden.py")
    maker = sys.modules.get("golden_1_1")
    if maker is None:
        maker = importlib.util.module_from_spec(spec)
        sys.modules["golden_1_1"] = maker
        spec.loader.exec_module(maker)
    assert maker.check() == []
    manifest = json.loads((R.SCHEMA / "golden" / "1.1" / "manifest.json").read_text())
    assert len(manifest) >= 20
