"""Batch jobs over many archives: the engine behind ``mgtrace verify|upgrade|retrace``.

A job is a *task* (a top-level function ``task(path, **options) -> dict``)
mapped over files. The engine collects the files (folders recurse, with a
glob filter), skips those a previous report already lists as done, runs the
rest in this process, in a process pool (``jobs > 1``) or on a Dask cluster
(``dask="local"`` or a scheduler address; tasks carry file paths, never
objects), shows progress on a terminal, keeps going past failures, and
returns one :class:`Record` per file. The report file (JSON) is rewritten
atomically after every record, so an interrupted job resumes where it
stopped.

Each task returns ``{"status": "ok" | "failed", "reason": str, ...details}``;
an exception inside a task becomes a failed record with the exception as
reason. Tasks that write files write them atomically (temporary file, then
rename), so Ctrl-C never leaves a partial output.

Python API (what the command runs)::

    from mgtrace import batch
    records = batch.retrace(["models/"], out="new/", jobs=2,
                            callback=lambda rec, done, total: print(done, total, rec.status))
"""
import concurrent.futures as cf
import dataclasses
import fnmatch
import json
import multiprocessing
import os
import sys
import tempfile
import time

__all__ = ["Record", "collect", "run", "read_report", "summary", "REPORT_VERSION",
           "verify", "upgrade", "retrace"]

REPORT_VERSION = 1


@dataclasses.dataclass
class Record:
    """What happened to one file.

    Attributes:
        path: the input file.
        status: "ok", "failed" or "skipped" (done in an earlier run).
        reason: why it failed (empty when ok).
        seconds: wall time of the task, in seconds.
        details: task-specific results (e.g. max error, output path).
    """
    path: str
    status: str
    reason: str = ""
    seconds: float = 0.0
    details: dict = dataclasses.field(default_factory=dict)

    def to_json(self):
        return {"path": self.path, "status": self.status, "reason": self.reason,
                "seconds": round(self.seconds, 6), **{"details": self.details}}


def collect(paths, pattern="*.tmod"):
    """Files named by ``paths``: files as given, folders searched recursively
    for names matching ``pattern`` (a glob); sorted, duplicates dropped.

    Raises:
        FileNotFoundError: a path does not exist.
    """
    out, seen = [], set()
    for p in paths:
        p = os.fspath(p)
        if os.path.isdir(p):
            found = []
            for root, dirs, files in os.walk(p):
                dirs.sort()
                found += [os.path.join(root, f) for f in files if fnmatch.fnmatch(f, pattern)]
            items = sorted(found)
        elif os.path.exists(p):
            items = [p]
        else:
            raise FileNotFoundError(f"no such file or folder: {p}")
        for f in items:
            key = os.path.abspath(f)
            if key not in seen:
                seen.add(key)
                out.append(f)
    return out


def read_report(path):
    """``{abs path: record dict}`` of a report written by :func:`run`
    (empty when the file does not exist).

    Raises:
        ValueError: the file is not a report of this format.
    """
    if not path or not os.path.exists(path):
        return {}
    try:
        with open(path) as f:
            data = json.load(f)
        recs = data["records"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{path} is not an mgtrace batch report ({e})") from None
    return {os.path.abspath(r["path"]): r for r in recs if isinstance(r, dict) and "path" in r}


def _write_report(path, command, records):
    data = {"report_version": REPORT_VERSION, "command": command,
            "records": [r.to_json() for r in records]}
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".report-", dir=folder)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _call(task, path, options):
    """Run one task, turning any exception into a failed result."""
    t0 = time.perf_counter()
    try:
        res = dict(task(path, **options))
    except Exception as e:          # a bad archive must not stop the batch
        res = {"status": "failed", "reason": f"{type(e).__name__}: {e}"}
    res["seconds"] = time.perf_counter() - t0
    return res


def _to_record(path, res):
    res = dict(res)
    return Record(path=path, status=res.pop("status", "failed"), reason=res.pop("reason", ""),
                  seconds=res.pop("seconds", 0.0), details=res)


def _worker_init():
    # one kernel thread per worker: the pool already uses the cores
    from mgtrace import set_num_threads
    set_num_threads(1)


def _local_results(task, files, options, jobs):
    if jobs <= 1:
        for f in files:
            yield f, _call(task, f, options)
        return
    ctx = multiprocessing.get_context("spawn")      # no fork after BLAS threads started
    with cf.ProcessPoolExecutor(max_workers=jobs, mp_context=ctx, initializer=_worker_init) as pool:
        futs = {pool.submit(_call, task, f, options): f for f in files}
        try:
            for fut in cf.as_completed(futs):
                yield futs[fut], fut.result()
        except BaseException:
            for fut in futs:
                fut.cancel()
            raise


def _dask_results(task, files, options, address):
    try:
        from distributed import Client, LocalCluster, as_completed
    except ImportError:
        raise RuntimeError("--dask needs dask.distributed: pip install 'mgtrace[distributed]'") from None
    cluster = None
    if address == "local":
        # one thread: tracing hooks are process-wide, so two traces must not overlap
        cluster = LocalCluster(processes=False, dashboard_address=None, n_workers=1,
                               threads_per_worker=1)
        client = Client(cluster)
    else:
        client = Client(address)
    try:
        futs = client.map(_call, [task] * len(files), files, [options] * len(files), pure=False)
        where = {f.key: path for f, path in zip(futs, files)}
        for fut in as_completed(futs):
            yield where[fut.key], fut.result()
    finally:
        client.close()
        if cluster is not None:
            cluster.close()


def run(task, paths, *, options=None, jobs=1, dask=None, report=None, resume=True,
        pattern="*.tmod", progress=None, callback=None, command=None):
    """Map ``task`` over the files of ``paths``; a Record per file.

    Args:
        task: top-level function ``task(path, **options) -> dict``.
        paths: files and folders (see :func:`collect`).
        options: keyword arguments for every task call (picklable).
        jobs: processes (1 runs in this process).
        dask: None, ``"local"`` (a loopback LocalCluster) or a scheduler
            address such as ``"tcp://10.0.0.5:8786"``.
        report: path of the JSON report to write (and resume from).
        resume: skip files the report already lists as ``ok``.
        progress: show a progress bar (default: when stderr is a terminal).
        callback: ``callback(record, done, total)`` after each file.
        command: a label stored in the report (e.g. ``"retrace"``).

    Returns:
        list of Record, in the order of the collected files.

    Raises:
        FileNotFoundError: a path does not exist.
        ValueError: jobs < 1, or the report file is not a report.
    """
    if not isinstance(jobs, int) or jobs < 1:
        raise ValueError(f"jobs must be an int >= 1, got {jobs!r}")
    options = dict(options or {})
    files = collect(paths, pattern)
    done = read_report(report) if (report and resume) else {}
    records = {}
    for f in files:
        prev = done.get(os.path.abspath(f))
        if prev is not None and prev.get("status") == "ok":
            records[f] = Record(f, "skipped", "done in an earlier run",
                                details=prev.get("details", {}))
    todo = [f for f in files if f not in records]
    show = sys.stderr.isatty() if progress is None else progress
    bar = _Progress(len(todo), command or getattr(task, "__name__", "batch"), show)
    results = _dask_results(task, todo, options, dask) if dask else \
        _local_results(task, todo, options, jobs)
    try:
        for i, (f, res) in enumerate(results, 1):
            rec = _to_record(f, res)
            records[f] = rec
            bar.advance(rec)
            if report:
                _write_report(report, command, [records[x] for x in files if x in records])
            if callback is not None:
                callback(rec, i, len(todo))
    finally:
        bar.close()
    return [records[f] for f in files if f in records]


class _Progress:
    """A rich progress bar on a terminal; nothing otherwise."""

    def __init__(self, total, label, show):
        self._p = None
        if show and total:
            try:
                from rich.progress import Progress
            except ImportError:
                return
            self._p = Progress(transient=True)
            self._p.start()
            self._task = self._p.add_task(label, total=total)

    def advance(self, rec):
        if self._p is not None:
            self._p.advance(self._task)

    def close(self):
        if self._p is not None:
            self._p.stop()


def summary(records):
    """``{"ok": n, "failed": n, "skipped": n, "total": n}``."""
    out = {"ok": 0, "failed": 0, "skipped": 0}
    for r in records:
        out[r.status] = out.get(r.status, 0) + 1
    out["total"] = len(records)
    return out


# ------------------------------------------------------------ Python API
def _roots(paths):
    return tuple(os.fspath(p) for p in paths if os.path.isdir(p))


def verify(paths, *, rtol=1e-5, atol=1e-6, **run_options):
    """Verify every archive of ``paths`` (see :func:`mgtrace.tasks.verify_file`);
    ``run_options`` are those of :func:`run` (jobs, dask, report, callback...)."""
    from mgtrace import tasks
    return run(tasks.verify_file, paths, options={"rtol": rtol, "atol": atol},
               command="verify", **run_options)


def upgrade(paths, *, out=None, in_place=False, rtol=1e-5, atol=1e-6, **run_options):
    """Rewrite every archive of ``paths`` in the current format into folder
    ``out`` (same relative layout) or, with ``in_place``, over the originals,
    each only after the new file reproduced the stored example outputs.

    Raises:
        ValueError: neither ``out`` nor ``in_place`` given.
    """
    from mgtrace import tasks
    if not out and not in_place:
        raise ValueError("give an output folder (out=...) or in_place=True")
    opts = {"out": out, "in_place": in_place, "roots": _roots(paths), "rtol": rtol, "atol": atol}
    return run(tasks.upgrade_file, paths, options=opts, command="upgrade", **run_options)


def retrace(paths, *, out=None, in_place=False, inputs=None, rtol=1e-5, atol=1e-6, **run_options):
    """Load each archive of ``paths``, trace it again with this library,
    check the new module against the old one, and save it into ``out`` (or
    over the original with ``in_place``). ``inputs``: ``"file.py:fn"`` or
    ``"module:fn"`` giving example inputs for archives without stored ones
    (called as ``fn(path, module)``).

    >>> # batch.retrace(["models/"], out="new/", jobs=2,
    >>> #               callback=lambda rec, done, total: print(f"{done}/{total}", rec.path, rec.status))
    """
    from mgtrace import tasks
    if not out and not in_place:
        raise ValueError("give an output folder (out=...) or in_place=True")
    opts = {"out": out, "in_place": in_place, "roots": _roots(paths), "inputs": inputs,
            "rtol": rtol, "atol": atol}
    return run(tasks.retrace_file, paths, options=opts, command="retrace", **run_options)
