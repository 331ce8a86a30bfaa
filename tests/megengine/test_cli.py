"""``mgtrace import-megengine`` through the real command: converted archives
reproduce MegEngine's outputs, bad and hostile files fail alone, reports
resume by content, -j, --inputs, --dask."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import mgtrace as mt
import mgtrace.megengine as mge
from .cases import CASES, assert_matches, path, stored

REPO = Path(__file__).resolve().parents[2]


def cli(*args, timeout=300):
    env = dict(os.environ, PYTHONPATH=str(REPO), NO_COLOR="1")
    p = subprocess.run([sys.executable, "-m", "mgtrace", *map(str, args)], env=env,
                       capture_output=True, text=True, timeout=timeout)
    assert "Traceback" not in p.stderr, p.stderr
    return p


def recs(report):
    data = json.loads(Path(report).read_text())
    return {Path(r["path"]).name: r for r in data["records"]}


@pytest.fixture
def zoo(tmp_path):
    """zoo/ with the three .tm files (one a folder down), their .pkl state
    dicts, a hostile .tm (os.system) and a truncated one."""
    z = tmp_path / "zoo"
    (z / "sub").mkdir(parents=True)
    for name in CASES:
        shutil.copy(path(name, ".tm"), z / ("sub" if name == "dict_io" else "") / f"{name}.tm")
        shutil.copy(path(name, ".pkl"), z / f"{name}.pkl")
    canary = tmp_path / "CANARY"
    (z / "evil.tm").write_bytes(b"\x80\x04\x8c\x05posix\x8c\x06system\x93\x8c"
                                + bytes([len(f"touch {canary}")]) + f"touch {canary}".encode()
                                + b"\x85R.")
    (z / "cut.tm").write_bytes(Path(path("cnn", ".tm")).read_bytes()[:3000])
    yield z
    assert not canary.exists()


def test_converts_a_folder_keeps_going_and_resumes(zoo, tmp_path):
    out, rep = tmp_path / "out", tmp_path / "r.json"
    p = cli("import-megengine", zoo, "-o", out, "--report", rep, "-j", "2")
    assert p.returncode == 1, p.stderr              # two files failed, the rest went on
    r = recs(rep)
    assert sorted(r) == sorted([f"{n}.tm" for n in CASES] + ["cut.tm", "evil.tm"])
    assert r["evil.tm"]["status"] == "failed"
    assert r["evil.tm"]["reason"].startswith("ForbiddenGlobalError: ")
    assert "posix.system" in r["evil.tm"]["reason"]
    assert r["cut.tm"]["status"] == "failed"
    assert r["cut.tm"]["reason"].startswith("MegEngineFileError: ")
    for name in CASES:
        rec = r[f"{name}.tm"]
        assert rec["status"] == "ok", rec
        assert rec["details"]["kind"] == "traced module"
        assert rec["details"]["inputs"] == "recorded shapes"
    assert (out / "sub" / "dict_io.tmod").exists() and not (out / "evil.tmod").exists()
    for name in CASES:
        arc = out / ("sub" if name == "dict_io" else "") / f"{name}.tmod"
        tm = mt.load(str(arc))
        for batch, (args, kwargs, want) in stored(name).items():
            assert_matches(tm(*args, **kwargs), want)
    # a rerun with the report redoes nothing that is done ...
    p = cli("import-megengine", zoo, "-o", out, "--report", rep, "--json")
    data = json.loads(p.stdout)
    by = {Path(x["path"]).name: x for x in data["records"]}
    assert by["cnn.tm"]["status"] == "skipped" and by["evil.tm"]["status"] == "failed"
    # ... but a file whose content changed is converted again
    shutil.copy(path("cnn", ".tm"), zoo / "containers.tm")
    p = cli("import-megengine", zoo, "-o", out, "--report", rep, "--json")
    by = {Path(x["path"]).name: x for x in json.loads(p.stdout)["records"]}
    assert by["containers.tm"]["status"] == "ok" and by["dict_io.tm"]["status"] == "skipped"


def test_state_dicts_and_inputs_script(zoo, tmp_path):
    out = tmp_path / "out"
    p = cli("import-megengine", zoo, "-o", out, "--pattern", "*.pkl")
    assert p.returncode == 0, p.stdout + p.stderr
    for name in CASES:
        got = mt.load(str(out / f"{name}.tmod"))
        want = mge.load(path(name, ".pkl"))
        assert sorted(got) == sorted(want)
        for k in want:
            np.testing.assert_array_equal(got[k].numpy(), want[k].numpy())
    script = tmp_path / "make_inputs.py"
    script.write_text("import numpy as np, mgtrace as mt\n"
                      "def inputs(path, module):\n"
                      "    assert module is None\n"
                      "    return (mt.tensor(np.ones((5, 3, 8, 8), 'float32')),)\n")
    rep = tmp_path / "r.json"
    p = cli("import-megengine", zoo / "cnn.tm", "-o", out, "--inputs", f"{script}:inputs",
            "--report", rep)
    assert p.returncode == 0, p.stdout + p.stderr
    rec = recs(rep)["cnn.tm"]
    assert rec["details"]["inputs"].endswith("make_inputs.py:inputs")
    arc = mt.serialization.load_archive(str(out / "cnn.tmod"))
    assert arc.example_inputs[0].shape == (5, 3, 8, 8)      # kept as the archive's examples


def test_usage_errors(zoo, tmp_path):
    p = cli("import-megengine", zoo)
    assert p.returncode == 2 and "-o" in p.stderr
    p = cli("import-megengine", tmp_path / "nothing", "-o", tmp_path / "o")
    assert p.returncode == 2 and "no such file or folder" in p.stderr
    p = cli("import-megengine", zoo, "-o", tmp_path / "o", "--inputs", "nope.py")
    assert p.returncode == 2 and "FILE.py:FUNCTION" in p.stderr


def test_dask_local(zoo, tmp_path):
    pytest.importorskip("distributed")
    out = tmp_path / "out"
    p = cli("import-megengine", zoo / "cnn.tm", zoo / "sub", "-o", out, "--dask", "local",
            "-j", "1", "--json")
    assert p.returncode == 0, p.stdout + p.stderr
    data = json.loads(p.stdout)
    assert data["summary"]["ok"] == 2
    assert (out / "cnn.tmod").exists() and (out / "dict_io.tmod").exists()
