"""Builtin module configs by format (issue 37): a builtin type's config keys
change only with its type version, except the four keys format 1.0's
golden archives predate (builtin_modules.ADDED_KEYS), which a writer for
1.0 leaves out where they hold their default. Audited against what every
golden archive stores, and gated against the constructors each released
format's op table recorded."""
import io
import json

import numpy as np
import pytest

import mgtrace as mt
import mgtrace.module as M
from mgtrace.module import is_builtin
from mgtrace.serialization import builtin_modules as B
from mgtrace.serialization import load_archive, read_header

from . import releases as R

GOLDEN = R.SCHEMA / "golden"


def _stored_keys(header):
    """{type: {tuple of config keys}} of the builtin entries of ``header``."""
    out = {}
    for m in header["modules"]:
        if m["kind"] == "builtin":
            out.setdefault(m["type"], set()).add(tuple(m["config"]))
    return out


def _written_keys(obj, target):
    """The same, as this writer writes each builtin module of ``obj`` for ``target``."""
    out = {}
    for m in _own_entries(obj):
        keys = tuple(B.config_for(m.builtin_name, m.config(), target))
        out.setdefault(m.builtin_name, set()).add(keys)
    return out


def _own_entries(obj):
    """The builtin modules of ``obj`` that get an entry of their own: a
    builtin's own children (a fused LinearBn1d's linear and bn) are part of
    its entry, not entries."""
    inside = []                     # paths of the builtins met so far
    for path, m in obj.named_modules():
        if any(path.startswith(p + ".") for p in inside):
            continue
        if is_builtin(m):
            inside.append(path)
            yield m


@pytest.fixture(scope="module")
def makers():
    """Each folder's make_golden.py imported (their archives call the user
    functions it registers)."""
    from serialization.test_golden import _script
    # (a format's folder is one with a make_golden.py: a __pycache__ left by
    # an earlier run of the suite in the same checkout is none)
    for folder in sorted(p.parent for p in GOLDEN.glob("*/make_golden.py")):
        _script(folder)


@pytest.mark.parametrize("path", sorted(GOLDEN.glob("*/*.tmod")),
                         ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_golden_config_is_what_the_writer_writes_for_its_format(path, makers):
    """The audit: for each builtin type of each golden archive, the config
    keys (names and order) today's writer gives for the archive's format are
    the ones stored. 1.0's differ from 1.1's by ADDED_KEYS alone."""
    archive = load_archive(path)
    if not isinstance(archive.obj, M.Module):
        return
    assert _written_keys(archive.obj, archive.format_version) == _stored_keys(archive.header)


def _params(table):
    return {n: [p[0] for p in e["config"]] for n, e in table["module_types"].items()
            if isinstance(e, dict) and "config" in e}


def constructor_problems(released, now):
    """Every builtin type a released format recorded with its constructor
    parameters (released_ops/<format>.json) has those parameters today,
    unless its type version went up.

    Args:
        released: ``{format: that format's released_ops table}``.
        now: schema/ops.json.
    """
    out = []
    for f, table in sorted(released.items()):
        for name, keys in sorted(_params(table).items()):
            entry = now["module_types"].get(name)
            if entry is None or entry["version"] != table["module_types"][name]["version"]:
                continue            # gone (another gate says so) or versioned: upgraders' gate
            current = [p[0] for p in entry["config"]]
            if current != keys:
                out.append(f"builtin module type {name} version {entry['version']} takes "
                           f"({', '.join(current)}) but format {R.fmt(f)} recorded "
                           f"({', '.join(keys)}): a config change is a type-version bump; "
                           "raise its builtin_version, register an upgrader from the old "
                           "version (mgtrace/serialization/upgraders.py) and its test "
                           "(tests/release/upgrader_cases.py)")
    return out


def _released_ops():
    folder = R.ROOT / "mgtrace" / "serialization" / "released_ops"
    return {tuple(map(int, p.stem.split("."))): json.loads(p.read_text())
            for p in folder.glob("*.json")}


def test_no_released_builtin_config_changed_without_a_version_bump():
    now = json.loads((R.SCHEMA / "ops.json").read_text())
    assert constructor_problems(_released_ops(), now) == []


def test_the_config_gate_fails_on_a_silent_addition():
    now = json.loads((R.SCHEMA / "ops.json").read_text())
    entry = now["module_types"]["mgtrace.module.Linear"]
    entry["config"] = entry["config"] + [["dtype", "KEYWORD_ONLY", "None"]]
    assert constructor_problems(_released_ops(), now) == [
        "builtin module type mgtrace.module.Linear version 1 takes (in_features, out_features, "
        "bias, dtype) but format 1.1 recorded (in_features, out_features, bias): a config "
        "change is a type-version bump; raise its builtin_version, register an upgrader from "
        "the old version (mgtrace/serialization/upgraders.py) and its test "
        "(tests/release/upgrader_cases.py)"]
    entry["version"] = 2                    # bumped: the upgrader gates take over
    assert constructor_problems(_released_ops(), now) == []


def _entries(data, type_name):
    return [m for m in read_header(io.BytesIO(data))["modules"] if m.get("type") == type_name]


def _save(obj, **kw):
    buf = io.BytesIO()
    mt.save(obj, buf, **kw)
    return buf.getvalue()


def test_a_1_0_target_leaves_default_added_keys_out_and_keeps_others():
    """padding_mode="zeros" is left out at 1.0 (as 1.0's golden archives
    store Conv2d) and written from 1.1 on; "reflect" is written at 1.0 too
    (release 0.1.0 reads it), and the loaded module pads by reflection."""
    mt.random.seed(3)
    x = mt.tensor(np.random.default_rng(3).standard_normal((1, 2, 5, 5)).astype(np.float32))
    for mode in ("zeros", "reflect"):
        net = M.Sequential(M.Conv2d(2, 3, 3, padding=1, padding_mode=mode),
                           M.MaxPool2d(2)).eval()
        for target, has in (((1, 0), mode != "zeros"), ((1, 1), True), (None, True)):
            data = _save(net, target_version=target)
            [conv] = _entries(data, "mgtrace.module.Conv2d")
            [pool] = _entries(data, "mgtrace.module.MaxPool2d")
            assert ("padding_mode" in conv["config"]) == has, (mode, target)
            assert ("return_indices" in pool["config"]) == (target != (1, 0)), target
            back = mt.load(io.BytesIO(data))
            assert back[0].padding_mode == mode and back[1].return_indices is False
            np.testing.assert_array_equal(back(x).numpy(), net(x).numpy())
    # reflect really differs from zeros here (the check above could not pass by accident)
    zeros = M.Conv2d(2, 3, 3, padding=1).eval()
    refl = M.Conv2d(2, 3, 3, padding=1, padding_mode="reflect").eval()
    refl.load_state_dict(zeros.state_dict())
    assert not np.allclose(zeros(x).numpy(), refl(x).numpy())


def test_a_stored_config_without_an_added_key_loads_with_its_default():
    """What a 1.0 golden stores (no padding_mode, no return_indices) loads
    as the defaults; the filled config is what the constructor takes."""
    assert B._fill_added("mgtrace.module.Conv2d", {"in_channels": 1}) == \
        {"in_channels": 1, "padding_mode": "zeros"}
    assert B._fill_added("mgtrace.module.MaxPool2d", {"return_indices": True}) == \
        {"return_indices": True}
    assert B._fill_added("mgtrace.module.Linear", {"bias": True}) == {"bias": True}
    arc = load_archive(GOLDEN / "1.0" / "every_builtin.tmod")
    header_types = _stored_keys(arc.header)
    assert all("padding_mode" not in k for k in header_types["mgtrace.module.Conv2d"])
    convs = [m for _, m in arc.obj.named_modules() if type(m) is M.Conv2d]
    pools = [m for _, m in arc.obj.named_modules() if type(m) is M.MaxPool2d]
    assert convs and pools
    assert {m.padding_mode for m in convs} == {"zeros"}
    assert {m.return_indices for m in pools} == {False}


def test_a_value_the_target_cannot_read_is_refused_naming_module_key_and_versions(monkeypatch):
    """The refusal, on a made-up key history: MaxPool2d's return_indices as
    if format 1.1's releases could not read it."""
    monkeypatch.setitem(B.ADDED_KEYS, "mgtrace.module.MaxPool2d",
                        {"return_indices": B.AddedKey(False, (1, 2), (1, 2))})
    net = M.Sequential(M.Identity(), M.MaxPool2d(2, return_indices=True))
    with pytest.raises(ValueError) as e:
        _save(net, target_version=(1, 1))
    assert str(e.value) == (
        "cannot save module '1' (mgtrace.module.MaxPool2d) for format 1.1: its config key "
        "'return_indices' is True, which format 1.1's readers cannot read (they know the type "
        "without it, as return_indices=False); it needs format 1.2: raise target_version")
    with pytest.raises(ValueError, match=r"^cannot save mgtrace.module.MaxPool2d for format"):
        _save(M.MaxPool2d(2, return_indices=True), target_version=(1, 1))
    _save(M.Sequential(M.MaxPool2d(2)), target_version=(1, 1))     # the default: left out
    assert "return_indices" in _entries(_save(net), "mgtrace.module.MaxPool2d")[0]["config"]
