"""schema/: schema.json and ops.json are what the code declares, and they
change only together with FORMAT_VERSION and a recorded hash."""
import importlib.util
import json
import pathlib

import mgtrace as mt
from mgtrace.serialization import header, values

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _generate():
    spec = importlib.util.spec_from_file_location("schema_generate", ROOT / "schema" / "generate.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_schema_and_op_table_match_the_code_and_the_recorded_hashes():
    problems = _generate().problems()
    assert not problems, "\n".join(problems)


def test_schema_lists_every_header_field_tag_and_kind():
    schema = json.loads((ROOT / "schema" / "schema.json").read_text())
    assert schema["format_version"] == list(mt.FORMAT_VERSION)
    assert [f["name"] for f in schema["header"]] == [f.name for f in header.HEADER]
    assert list(schema["values"]["tags"]) == list(values.TAGS)
    assert {"builtin", "container"} <= set(schema["module_kinds"])


def test_op_table_lists_mgtrace_functions_and_module_types():
    ops = json.loads((ROOT / "schema" / "ops.json").read_text())
    assert ops["functions"]["mgtrace.functional.conv2d"] == 1
    assert ops["functions"]["operator.getitem"] == 1
    assert ops["module_types"]["mgtrace.module.Linear"] == 1
    assert not any(n.startswith(("tests.", "acme.")) for n in ops["functions"])


def test_changelog_describes_the_current_version():
    text = (ROOT / "schema" / "CHANGELOG.md").read_text()
    assert f"## {'.'.join(map(str, mt.FORMAT_VERSION))}" in text


def test_a_changed_schema_is_reported_with_what_to_do(tmp_path, monkeypatch):
    gen = _generate()
    for name in ("schema.json", "ops.json", "hashes.json"):
        (tmp_path / name).write_text((ROOT / "schema" / name).read_text())
    monkeypatch.setattr(gen, "HERE", tmp_path)
    assert gen.problems() == []
    monkeypatch.setattr(gen, "build_ops", lambda: {"functions": {"mgtrace.functional.new": 1}})
    assert "does not match the code; run `python schema/generate.py`" in gen.problems()[0]
    gen.main([])                        # regenerate: now the hash no longer matches
    msg = gen.problems()[0]
    assert "ops.json changed, but FORMAT_VERSION is still 1.1" in msg
    assert "raise FORMAT_VERSION" in msg and "--record" in msg
