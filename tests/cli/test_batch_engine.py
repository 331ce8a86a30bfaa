"""mgtrace.batch as a Python API: collecting files, the report, workers that die."""
import json
import os
import signal
import sys
import threading
import time
import weakref

import pytest

from mgtrace import batch
from mgtrace.cli import batch as engine


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


def test_a_worker_killed_as_it_starts_fails_no_file_and_isolates_none(tmp_path, monkeypatch):
    # killed before it ran anything (its parent kills it the moment it is started, long
    # before a new interpreter could run a task): no file was started, none returned, so
    # the pool is tried again, all of it; this ran every file in a process of its own
    root = _files(tmp_path, [f"f{i}.tmod" for i in range(30)])
    pools, killed = [], []
    real_pool, real_start = engine._new_pool, engine._WorkerProcess.start
    monkeypatch.setattr(engine, "_new_pool", lambda jobs, *a: pools.append(jobs) or real_pool(jobs, *a))

    def start(self):
        real_start(self)
        if not killed:
            killed.append(self.pid)
            os.kill(self.pid, signal.SIGKILL)
    monkeypatch.setattr(engine._WorkerProcess, "start", start)
    recs = batch.run(_die_on_crash, [root], jobs=2, progress=False)
    assert killed and [r.status for r in recs] == ["ok"] * 30
    assert pools == [2, 2], pools


def test_a_worker_started_while_a_broken_pool_is_torn_down_is_stopped(tmp_path, monkeypatch):
    # the race CI hit: the first worker dies while submit is still starting the second;
    # the pool's manager thread marks the pool broken, SIGTERMs the workers it knows, and
    # waits for all of them to exit, the second among them once submit has added it: that
    # one never got the SIGTERM, idles on its queue for ever, and the job hung in shutdown
    # (CPython 3.11's concurrent.futures). Forced here: the second worker, started, is
    # added only once the pool is marked broken and its manager is past the SIGTERMs
    root = _files(tmp_path, [f"f{i}.tmod" for i in range(8)])
    pools, started = [], []
    real_pool, real_start = engine._new_pool, engine._WorkerProcess.start

    def new_pool(jobs, *a):
        pools.append(real_pool(jobs, *a))
        return pools[-1]

    def start(self):
        real_start(self)
        started.append(self.pid)
        if len(started) == 1:
            os.kill(self.pid, signal.SIGKILL)
        elif len(started) == 2 and len(pools) == 1:     # the first pool's second worker
            deadline = time.monotonic() + 5             # (a Python whose manager marks the
            while not pools[0]._broken and time.monotonic() < deadline:   # pool broken under
                time.sleep(0.01)                        # submit's lock has no such race)
            time.sleep(0.2)
    monkeypatch.setattr(engine, "_new_pool", new_pool)
    monkeypatch.setattr(engine._WorkerProcess, "start", start)
    done = []
    job = threading.Thread(target=lambda: done.append(batch.run(_die_on_crash, [root], jobs=2,
                                                                progress=False)), daemon=True)
    job.start()
    job.join(120)                       # a hang detector, not a speed limit (seconds here)
    assert done, "the job hung after its first pool broke"
    assert [r.status for r in done[0]] == ["ok"] * 8


def test_a_folder_that_cannot_be_listed_stops_the_job(tmp_path, monkeypatch, capsys):
    # os.walk skips a folder it cannot list without a word: verify then checked the rest and
    # said all was good (exit 0) while it never looked inside (chmod 000 folders; faked here,
    # as tests may run as root, whom permissions do not stop)
    root = _files(tmp_path, ["a.tmod", "locked/b.tmod"])
    real = os.scandir

    def scandir(path="."):
        if os.path.basename(os.fspath(path)) == "locked":
            raise PermissionError(13, "Permission denied", os.fspath(path))
        return real(path)
    monkeypatch.setattr(os, "scandir", scandir)
    with pytest.raises(PermissionError, match="cannot search the folder .*locked for archives"):
        batch.collect([root])
    from mgtrace.cli import EXIT_USAGE, main
    assert main(["verify", str(root)]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert "locked for archives: Permission denied" in err and "Traceback" not in err


def _read_all(path, **options):
    with open(path, "rb") as f:
        return {"status": "ok", "reason": "", "size": len(f.read())}


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="named pipes are POSIX")
def test_a_named_pipe_among_archives_fails_without_being_opened(tmp_path, capsys):
    # opening a FIFO for reading waits for a writer: a FIFO named p.tmod in a folder hung
    # mgtrace verify (-j 1 in the task, -j 2 already in work_size) and inspect for ever.
    # Here a watchdog plays the writer whenever someone waits on the pipe, so a regression
    # ends (a record that is not the refusal) instead of hanging
    root = _files(tmp_path, ["a.tmod"])
    fifo = root / "p.tmod"
    os.mkfifo(fifo)
    stop = threading.Event()

    def writer():
        while not stop.is_set():
            try:
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))     # a reader waits: EOF
            except OSError:
                stop.wait(0.01)
    t = threading.Thread(target=writer, daemon=True)
    t.start()
    try:
        assert engine.work_size(str(fifo)) == 0 and batch.fingerprint(fifo) is None
        recs = batch.run(_read_all, [root], report=tmp_path / "r.json", progress=False)
        from mgtrace.cli import EXIT_FAILED, main
        assert main(["inspect", str(fifo)]) == EXIT_FAILED
        with pytest.raises(ValueError, match="--report .*p.tmod is a named pipe, not a file"):
            batch.run(_read_all, [root / "a.tmod"], report=fifo, progress=False)
    finally:
        stop.set()
        t.join()
    by = {os.path.basename(r.path): r for r in recs}
    assert by["a.tmod"].status == "ok" and by["a.tmod"].details["size"] == 6
    assert by["p.tmod"].status == "failed"
    assert by["p.tmod"].reason == f"{fifo} is a named pipe, not a file: archives are read from files"
    assert "p.tmod is a named pipe" in capsys.readouterr().out


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


def test_a_dying_worker_sends_only_started_files_to_run_alone(tmp_path, monkeypatch):
    # the crash is the biggest file, so it starts first: before, every file not yet returned
    # when its worker died (all 30 here) was retried in a process of its own, one spawn each
    root = _files(tmp_path, [f"f{i}.tmod" for i in range(30)] + ["crash_first_biggest.tmod"])
    pools = []
    real = engine._new_pool
    monkeypatch.setattr(engine, "_new_pool", lambda jobs, *a: pools.append(jobs) or real(jobs, *a))
    recs = batch.run(_die_on_crash, [root], jobs=2, progress=False)
    by = {os.path.basename(r.path): r for r in recs}
    assert "worker process died" in by["crash_first_biggest.tmod"].reason
    assert all(by[f"f{i}.tmod"].status == "ok" for i in range(30)), by
    assert len(recs) == 31
    # the crash's pool, a fresh pool for the files still queued (min(2, how many): the other
    # worker may have run all but one, or all, meanwhile), and at most the two files the
    # broken pool had started, each alone: a handful of pools, not one per file
    assert pools[0] == 2 and all(p in (1, 2) for p in pools[1:]) and 2 <= len(pools) <= 4, pools


def test_a_report_in_use_by_another_job_is_refused(tmp_path, capsys):
    # two jobs given one report each rewrote it with their own records: the one that ended
    # last erased the other's (an upgrade's "from format 1.0" became "left as it is")
    root = _files(tmp_path, ["a.tmod", "b.tmod"])
    report = tmp_path / "r.json"
    second = []

    def during_the_first(rec, done, total):
        if done == 1:
            with pytest.raises(BlockingIOError, match=f"in use by another mgtrace job "
                                                      f"\\(pid {os.getpid()}\\)"):
                batch.run(_die_on_crash, [root], report=report, progress=False)
            from mgtrace.cli import main
            second.append(main(["verify", str(root), "--report", str(report)]))
    recs = batch.run(_die_on_crash, [root], report=report, progress=False,
                     callback=during_the_first)
    from mgtrace.cli import EXIT_USAGE
    assert second == [EXIT_USAGE] and "in use by another mgtrace job" in capsys.readouterr().err
    assert [r.status for r in recs] == ["ok", "ok"]
    assert [n for n in os.listdir(tmp_path) if n.startswith(".")] == []     # the lock is gone
    data = json.loads(report.read_text())
    assert data["finished"] and data["summary"] == {"ok": 2, "failed": 0, "total": 2}
    recs = batch.run(_die_on_crash, [root], report=report, progress=False)  # free again
    assert [r.status for r in recs] == ["skipped", "skipped"]


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


def test_work_size_counts_header_bytes_heavier_than_tensor_bytes(tmp_path):
    import io
    import numpy as np
    import mgtrace as mt
    from mgtrace.serialization.layout import PREFIX
    buf = io.BytesIO()
    mt.save({"w": mt.tensor(np.ones(1000, np.float32))}, buf)
    data = buf.getvalue()
    (tmp_path / "a.tmod").write_bytes(data)
    header_len = PREFIX.unpack(data[:PREFIX.size])[1]
    assert engine.HEADER_WEIGHT == 256
    assert engine.work_size(tmp_path / "a.tmod") == len(data) + 255 * header_len
    (tmp_path / "b.tmod").write_bytes(b"not an archive, just bytes")
    assert engine.work_size(tmp_path / "b.tmod") == 26
    (tmp_path / "c.tmod").write_bytes(data[:8] + (10 ** 9).to_bytes(8, "little"))
    assert engine.work_size(tmp_path / "c.tmod") == 16                 # a header past the end
    assert engine.work_size(tmp_path / "gone.tmod") == 0


@pytest.mark.parametrize("jobs, report", [(1, False), (2, False), (2, True)])
def test_parallel_jobs_take_the_biggest_files_first(tmp_path, monkeypatch, jobs, report):
    root = _files(tmp_path / "in", ["bb.tmod", "a.tmod", "dddd.tmod", "ccc.tmod"])
    order = []

    def local(task, files, options, jobs, imports, fps):
        order.extend(os.path.basename(f) for f in files)
        for f in files:
            yield f, engine._call(task, f, options, imports, fps)
    monkeypatch.setattr(engine, "_local_results", local)
    recs = batch.run(_die_on_crash, [root], jobs=jobs, progress=False,
                     report=tmp_path / "r.json" if report else None)
    names = ["a.tmod", "bb.tmod", "ccc.tmod", "dddd.tmod"]
    assert order == (names if jobs == 1 else names[::-1])
    # records come back in the order collected, each with its time; fingerprints
    # (a SHA-256 of each file) only when a report keeps them
    assert [os.path.basename(r.path) for r in recs] == names
    assert all(r.status == "ok" and r.seconds >= 0 for r in recs)
    for r in recs:
        if report:
            assert r.fingerprints["input"]["size"] == os.path.getsize(r.path)
            assert len(r.fingerprints["input"]["sha256"]) == 64
        else:
            assert r.fingerprints == {}


def _ctrl_c_in_a_finalizer(path, **options):
    """A task during which Ctrl-C lands inside a weakref finalizer: CPython
    prints it as "Exception ignored" and swallows the KeyboardInterrupt."""
    class Held:
        pass

    def on_collect():
        os.kill(os.getpid(), signal.SIGINT)     # delivered to this thread before kill returns
        sum(range(10))                          # the handler runs here, inside the finalizer
    obj = Held()
    weakref.finalize(obj, on_collect)
    del obj
    return {"status": "ok", "reason": ""}


def test_ctrl_c_swallowed_by_a_finalizer_still_stops_a_one_process_job(tmp_path, monkeypatch):
    root = _files(tmp_path, [f"f{i}.tmod" for i in range(5)])
    seen, swallowed = [], []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: swallowed.append(u.exc_type))
    with pytest.raises(KeyboardInterrupt):
        batch.run(_ctrl_c_in_a_finalizer, [root], jobs=1, progress=False,
                  callback=lambda rec, done, total: seen.append(rec.status))
    # the first file finished (its task returned); the job stopped before the second
    assert seen == ["ok"]
    assert swallowed == [KeyboardInterrupt]             # it was indeed swallowed
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler     # handler restored
