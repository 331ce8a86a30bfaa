"""Ctrl-C during a batch: exit 130, no partial or temporary outputs, a report to resume from."""
import json
import os
import signal
import sys
import time

import pytest

import mgtrace as mt

from .conftest import copies, cli, records, start_cli

N_FILES = 600           # enough that the job is still running when the signal comes


@pytest.fixture
def many(archives, tmp_path):
    return copies(archives, tmp_path, N_FILES)


def _start(args, group):
    return start_cli(*args, start_new_session=group)


def _assert_group_ends(proc, seconds, why):
    """Wait until nothing is left of ``proc``'s process group (its workers)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < seconds:
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    raise AssertionError(why)


def _kill_group(proc):
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


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


@pytest.mark.parametrize("jobs", [1, 2])
def test_sigint_ignored_at_start_stays_ignored(archives, tmp_path, jobs):
    # nohup or a script's `cmd &` starts mgtrace with SIGINT ignored: a stray
    # SIGINT must then leave the job running, with any number of workers
    many = copies(archives, tmp_path, 12)
    out = tmp_path / "out"
    ignore = lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)     # noqa: E731
    proc = start_cli("retrace", many, "-o", out, "-j", jobs, preexec_fn=ignore)
    _wait_for_outputs(out, 1, proc)
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0, stderr
    assert len(os.listdir(out)) == 12 and stdout.count("ok ") == 12, stdout


def test_ctrl_c_while_files_are_submitted_is_kept(archives, tmp_path, monkeypatch):
    # the pool starts workers inside submit(), at any point of a long job; a
    # Ctrl-C that arrives while the parent submits files must still stop it
    from mgtrace import batch
    import concurrent.futures as cf
    many = copies(archives, tmp_path, 40)
    submit, calls = cf.ProcessPoolExecutor.submit, []

    def submit_then_ctrl_c(self, *a, **kw):
        calls.append(1)
        if len(calls) == 5:
            signal.raise_signal(signal.SIGINT)
        return submit(self, *a, **kw)

    monkeypatch.setattr(cf.ProcessPoolExecutor, "submit", submit_then_ctrl_c)
    # Python's own Ctrl-C handler, whatever this run inherited: a run started
    # in the background (bash's `cmd &`) ignores SIGINT, which the engine keeps
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            batch.verify([many], jobs=2, report=tmp_path / "r.json")
    finally:
        signal.signal(signal.SIGINT, old)
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["finished"] is False


def test_a_stop_swallowed_by_a_finalizer_is_delivered_after_the_hook(monkeypatch):
    # a pool worker's SIGTERM that lands in a __del__ is swallowed there; the
    # unraisable hook must hand it back to the task, not raise inside itself
    # (that prints "Exception ignored in sys.unraisablehook" and loses it)
    import types
    from mgtrace.cli import batch as engine
    monkeypatch.setattr(engine, "_IN_TASK", True)
    old = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGALRM)}
    signal.signal(signal.SIGALRM, engine._stop_worker)
    try:
        engine._unraisable_in_worker(types.SimpleNamespace(exc_value=engine._Stopped()))
        with pytest.raises(engine._Stopped):        # the task sees the stop, shortly
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                time.sleep(0.001)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        for s, h in old.items():
            signal.signal(s, h)


def test_sigterm_to_the_parent_stops_its_workers(many, tmp_path):
    # kill PID (a CI job's timeout) ended the parent alone: its -j 2 workers, blocked on
    # their queue, lived on for ever; now SIGTERM stops the pool as Ctrl-C does
    out, rep = tmp_path / "out", tmp_path / "r.json"
    proc = _start(["retrace", many, "-o", out, "-j", 2, "--report", rep], True)
    try:
        _wait_for_outputs(out, 3, proc)
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=60)
        assert proc.returncode == 130, (stdout, stderr)
        assert "Traceback" not in stderr, stderr
        _assert_group_ends(proc, 10, "worker processes outlived the parent")
        assert json.loads(rep.read_text())["finished"] is False
        assert all(n.endswith(".tmod") and not n.startswith(".") for n in os.listdir(out))
    finally:
        _kill_group(proc)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_sigkill_of_the_parent_leaves_no_worker(many, tmp_path):
    # SIGKILL cannot be caught, so the parent cannot stop its -j 2 workers:
    # they ask the kernel for a SIGTERM at its death and stop as on Ctrl-C,
    # removing their temporary files
    out = tmp_path / "out"
    proc = _start(["retrace", many, "-o", out, "-j", 2], True)
    try:
        _wait_for_outputs(out, 3, proc)
        proc.kill()
        proc.wait(timeout=60)
        _assert_group_ends(proc, 30, "worker processes outlived a killed parent")
        assert all(n.endswith(".tmod") and not n.startswith(".") for n in os.listdir(out))
    finally:
        _kill_group(proc)
