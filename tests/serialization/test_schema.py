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
    conv = ops["functions"]["mgtrace.functional.conv2d"]
    assert conv["version"] == 1
    assert [p[0] for p in conv["params"][:4]] == ["x", "weight", "bias", "stride"]
    assert ops["functions"]["operator.getitem"] == {
        "version": 1, "params": [["a", "POSITIONAL_ONLY", None], ["b", "POSITIONAL_ONLY", None]]}
    linear = ops["module_types"]["mgtrace.module.Linear"]
    assert linear["version"] == 1
    assert [p[0] for p in linear["config"]] == ["in_features", "out_features", "bias"]
    assert "reshape" in ops["tensor_methods"] and "__add__" in ops["tensor_methods"]
    assert {"add", "conv2d", "astype"} <= set(ops["core_ops"])
    assert not any(n.startswith(("tests.", "acme.")) for n in ops["functions"])


def _changed_op_table_fails(monkeypatch, tmp_path, change):
    """``change(monkeypatch)`` alters the code an archive depends on; the
    regenerated ops.json must then fail the recorded hash."""
    gen = _generate()
    for name in ("schema.json", "ops.json", "hashes.json"):
        (tmp_path / name).write_text((ROOT / "schema" / name).read_text())
    monkeypatch.setattr(gen, "HERE", tmp_path)
    assert gen.problems() == []
    change(monkeypatch)
    gen.main([])                     # regenerate from the changed code
    [msg] = gen.problems()
    assert "ops.json changed, but FORMAT_VERSION is still" in msg


def test_renaming_a_function_parameter_without_a_version_bump_fails(monkeypatch, tmp_path):
    import mgtrace.functional as F

    def change(mp):
        def relu(inp):               # was relu(x): archives store arguments by name
            return F.maximum(inp, 0)
        mp.setattr(F, "relu", relu)
    _changed_op_table_fails(monkeypatch, tmp_path, change)


def test_renaming_a_builtin_config_key_without_a_version_bump_fails(monkeypatch, tmp_path):
    import mgtrace.module as M
    original = M.Linear.__init__

    def change(mp):
        def __init__(self, in_features, out_features, use_bias=True):
            original(self, in_features, out_features, use_bias)
        mp.setattr(M.Linear, "__init__", __init__)
    _changed_op_table_fails(monkeypatch, tmp_path, change)


def test_renaming_a_core_op_without_a_version_bump_fails(monkeypatch, tmp_path):
    from mgtrace._core import op_table

    def change(mp):
        ops = dict(op_table.OPS)
        name = sorted(ops)[0]
        ops[name + "_renamed"] = ops.pop(name)._replace(name=name + "_renamed")
        mp.setattr(op_table, "OPS", ops)
    _changed_op_table_fails(monkeypatch, tmp_path, change)


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
    assert f"ops.json changed, but FORMAT_VERSION is still {mt.serialization.version.fmt(mt.FORMAT_VERSION)}" in msg
    assert "raise FORMAT_VERSION" in msg and "--record" in msg
