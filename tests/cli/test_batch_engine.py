"""mgtrace.batch as a Python API: collecting files, the report, workers that die."""
import json
import os

import pytest

from mgtrace import batch


def _die_on_crash(path, **options):
    """A task that kills its worker process for files named crash*."""
    if os.path.basename(path).startswith("crash"):
        os._exit(3)
    return {"status": "ok", "reason": "", "size": os.path.getsize(path)}


def _files(tmp_path, names):
    for n in names:
        p = tmp_path / n
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(b"x" * len(n))
    return tmp_path


def test_collect(tmp_path):
    root = _files(tmp_path, ["a.tmod", "b.txt", "sub/c.tmod", ".hidden.tmod", ".git/d.tmod",
                             "out/e.tmod", "sub/.mgtrace-1234.tmp"])
    got = [os.path.relpath(f, root) for f in batch.collect([root], exclude=root / "out")]
    assert got == ["a.tmod", "sub/c.tmod"]
    assert len(batch.collect([root, root / "a.tmod", str(root) + "/./sub/c.tmod"],
                             exclude=root / "out")) == 2                  # duplicates dropped
    assert [os.path.basename(f) for f in batch.collect([root], "*.txt")] == ["b.txt"]
    with pytest.raises(FileNotFoundError, match="no such file or folder"):
        batch.collect([root / "nope"])


def test_a_dying_worker_fails_only_its_file(tmp_path):
    root = _files(tmp_path, [f"f{i}.tmod" for i in range(6)] + ["crash.tmod"])
    seen = []
    recs = batch.run(_die_on_crash, [root], jobs=2, progress=False, report=tmp_path / "r.json",
                     callback=lambda r, done, total: seen.append(done))
    by = {os.path.basename(r.path): r for r in recs}
    assert by["crash.tmod"].status == "failed"
    assert "worker process died" in by["crash.tmod"].reason
    assert all(by[f"f{i}.tmod"].status == "ok" for i in range(6)), by
    assert sorted(seen) == list(range(1, 8))
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["finished"] and data["summary"] == {"ok": 6, "failed": 1, "total": 7}


def test_report_paths_resolve_from_the_jobs_folder(tmp_path, monkeypatch):
    root = _files(tmp_path, ["a.tmod", "b.tmod"])
    monkeypatch.chdir(root)
    batch.run(_die_on_crash, ["."], report=tmp_path / "r.json", progress=False)
    monkeypatch.chdir("/")
    recs = batch.run(_die_on_crash, [root], report=tmp_path / "r.json", progress=False)
    assert [r.status for r in recs] == ["skipped", "skipped"]


def test_exceptions_become_failed_records(tmp_path):
    root = _files(tmp_path, ["a.tmod"])

    def boom(path):
        raise TypeError("a bug")
    [r] = batch.run(boom, [root], progress=False)
    assert r.status == "failed" and r.reason == "TypeError: a bug"
    assert "traceback" in r.details and "boom" in r.details["traceback"]   # where, for a bug
    with pytest.raises(ValueError, match="jobs"):
        batch.run(boom, [root], jobs=0)


def test_api_checks_outputs_before_running(archives, tmp_path):
    with pytest.raises(ValueError, match="output folder"):
        batch.upgrade([archives / "good"])
    with pytest.raises(ValueError, match="not both"):
        batch.retrace([archives / "good"], out=tmp_path, in_place=True)
    with pytest.raises(ValueError, match="overwrite the original"):
        batch.upgrade([archives / "good"], out=archives / "good")
    with pytest.raises(ValueError, match="FILE.py:FUNCTION"):
        batch.retrace([archives / "noex"], out=tmp_path / "o", inputs="nocolon")
    assert not (tmp_path / "o").exists()
