"""Ctrl-C during a batch: exit 130, no partial or temporary outputs, a report to resume from."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

import mgtrace as mt

from .conftest import copies, REPO, cli, records

N_FILES = 600           # enough that the job is still running when the signal comes


@pytest.fixture
def many(archives, tmp_path):
    return copies(archives, tmp_path, N_FILES)


def _start(args, group):
    env = dict(os.environ, PYTHONPATH=str(REPO), NO_COLOR="1")
    return subprocess.Popen([sys.executable, "-m", "mgtrace", *map(str, args)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=group)


def _wait_for_outputs(out, n, proc, timeout=60):
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if out.is_dir() and sum(f.endswith(".tmod") for f in os.listdir(out)) >= n:
            return
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.01)
    raise AssertionError("no outputs appeared")


@pytest.mark.parametrize("jobs, group", [(2, False), (2, True), (1, False)],
                         ids=["j2-signal-to-parent", "j2-signal-to-group", "j1"])
def test_ctrl_c_leaves_only_complete_outputs(many, tmp_path, jobs, group):
    out, rep = tmp_path / "out", tmp_path / "r.json"
    proc = _start(["retrace", many, "-o", out, "-j", jobs, "--report", rep], group)
    _wait_for_outputs(out, 3, proc)
    if group:       # a terminal's Ctrl-C: the whole foreground process group
        os.killpg(proc.pid, signal.SIGINT)
    else:
        proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, (stdout, stderr)
    assert "interrupted" in stderr and "Traceback" not in stderr, stderr
    names = sorted(os.listdir(out))
    assert names and all(n.endswith(".tmod") and not n.startswith(".") for n in names), names
    assert len(names) < N_FILES                          # it really was interrupted
    for n in names:                                      # every output is complete and loads
        arc = mt.serialization.load_archive(out / n)
        assert arc.example_inputs is not None
    assert not [n for n in os.listdir(many) if n.startswith(".")]
    data = json.loads(rep.read_text())
    assert data["finished"] is False
    recs = records(data)
    assert recs and all(r["status"] == "ok" for r in recs.values())
    assert {os.path.basename(r["details"]["output"]) for r in recs.values()} <= set(names)
    if group or jobs == 1:
        return
    # a rerun with the same report finishes the job, skipping what was done
    p = cli("retrace", many, "-o", out, "-j", jobs, "--report", rep, "--json")
    assert p.returncode == 0, p.stderr
    statuses = [r["status"] for r in json.loads(p.stdout)["records"]]
    assert statuses.count("skipped") == len(recs) and statuses.count("ok") == N_FILES - len(recs)
    assert len(os.listdir(out)) == N_FILES
