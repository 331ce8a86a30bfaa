"""Every --json output and report is standard JSON: strict parsers (JSON.parse,
jq, Go, Rust) reject Python's Infinity/NaN, so non-finite numbers are strings."""
import json

import pytest

import mgtrace as mt

from .conftest import cli, example, make_net


def _strict(text):
    def refuse(name):
        raise ValueError(f"not standard JSON: {name}")
    return json.loads(text, parse_constant=refuse)


@pytest.fixture
def nonfinite(tmp_path):
    a, b = tmp_path / "a.tmod", tmp_path / "b.tmod"
    x = example(0)
    tm = mt.trace_module(make_net(0), x)
    meta = {"best": float("inf"), "loss": float("nan"), "floor": float("-inf"), "ok": 1.5,
            "hist": [float("nan"), 2.0]}
    mt.save(tm, a, example_inputs=(x,), metadata=meta)
    mt.save(tm, b, example_inputs=(x,), metadata={**meta, "loss": float("inf")})
    return a, b


def test_inspect_json_writes_nonfinite_metadata_as_strings(nonfinite):
    a, _ = nonfinite
    p = cli("inspect", "--json", a)
    assert p.returncode == 0, p.stderr
    meta = _strict(p.stdout)[0]["metadata"]
    assert meta == {"best": "inf", "loss": "nan", "floor": "-inf", "ok": 1.5, "hist": ["nan", 2.0]}
    assert float(meta["floor"]) == float("-inf")        # the strings read back as floats


def test_diff_and_batch_json_and_report_are_strict(nonfinite, tmp_path):
    a, b = nonfinite
    p = cli("diff", "--json", a, b)
    assert p.returncode == 1, p.stderr
    change = [c for c in _strict(p.stdout)["changes"] if c["what"] == "metadata"][0]
    assert change["a"]["loss"] == "nan" and change["b"]["loss"] == "inf"
    rep = tmp_path / "r.json"
    p = cli("verify", "--json", "--report", rep, a, b)
    assert p.returncode == 0, p.stderr
    assert _strict(p.stdout)["summary"]["ok"] == 2
    assert _strict(rep.read_text())["summary"]["ok"] == 2
    assert _strict(cli("doctor", "--json").stdout)["writes format"]


def test_json_help_says_how_nonfinite_numbers_are_written():
    for cmd in ("inspect", "verify", "diff"):
        help_text = " ".join(cli(cmd, "--help").stdout.split())
        assert 'inf and nan are written as the strings "inf", "-inf", "nan"' in help_text, cmd


def test_plain_converts_nested_values():
    from mgtrace import _json
    assert _json.plain({"a": (1.0, float("nan")), 2: [float("-inf")]}) == \
        {"a": [1.0, "nan"], 2: ["-inf"]}
    assert _strict(_json.dumps([float("inf")])) == ["inf"]
