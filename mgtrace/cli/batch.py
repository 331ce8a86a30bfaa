"""Batch jobs over many archives: the engine behind ``mgtrace verify|upgrade|retrace``.

A job is a *task* (a top-level function ``task(path, **options) -> dict``)
mapped over files. The engine collects the files (folders recurse, with a
glob filter), skips those a previous report already lists as done, runs the
rest in this process, in a process pool (``jobs > 1``) or on a Dask cluster
(``dask="local"`` or a scheduler address; tasks carry file paths, never
objects), shows progress on a terminal, keeps going past failures, and
returns one :class:`Record` per file (in the order collected, each with the
seconds its task took). Pools and Dask get the files biggest first (by
:func:`work_size`, from each archive's first 16 bytes), so that a few large
archives among many small ones start early instead of running alone at the
end while the other workers idle.

Each task returns ``{"status": "ok" | "failed", "reason": str, ...details}``;
an exception inside a task becomes a failed record with the exception as
reason. Tasks that write files write them atomically (temporary file, then
rename), so an interrupted job never leaves a partial output.

The report
----------
``report="r.json"`` keeps ``{"report_version", "command", "options",
"cwd", "finished", "summary", "records": [...]}`` with one record per file
(``path``, ``status``, ``reason``, ``seconds``, ``details``). It is
rewritten atomically as files finish (at most twice a second, and at the
end, Ctrl-C included), so a rerun with the same report skips the files it
lists as ``ok`` (their records are kept as they were) and redoes the rest.
A report is only resumed by the same command with the same output
(``out``/``in_place``). Each record keeps fingerprints (size, mtime, inode,
SHA-256) of its input as the job left it and of its output; a file is
skipped only when both are unchanged (same size, mtime and inode, or else
the same SHA-256) and the options that shape the output (tolerances,
``inputs``, ``imports``) are the same, so a replaced input, or an output
changed or gone, is redone.

Interrupts and crashes
----------------------
Ctrl-C (SIGINT) goes to this process only: pool workers ignore it. On it (or
on SIGTERM while a pool runs) the engine cancels the files not started, stops
the running workers (SIGTERM, which they turn into an exception so temporary
files are removed), writes the report and re-raises KeyboardInterrupt. A worker that dies (a crash, or
killed for memory) breaks the pool: the files its workers had started are
retried one process per file (one bad archive cannot fail its neighbours),
those still queued go on in a fresh pool.

Python API (what the command runs), public as :mod:`mgtrace.batch`::

    from mgtrace import batch
    records = batch.retrace(["models/"], out="new/", jobs=2,
                            callback=lambda rec, done, total: print(done, total, rec.status))
"""
import concurrent.futures as cf
import contextlib
import dataclasses
import errno
import fnmatch
import gc
import hashlib
import json
import logging
import multiprocessing
import multiprocessing.connection
import os
import signal
import stat
import sys
import tempfile
import threading
import time
import traceback

from mgtrace import _json
from mgtrace.errors import Error

__all__ = ["Record", "ReportError", "collect", "leftovers", "fingerprint", "unchanged", "run", "read_report", "summary", "REPORT_VERSION",
           "verify", "upgrade", "retrace"]

RESUMED = "ok in an earlier run"     # the reason of a record skipped on resume
REPORT_VERSION = 2             # 2: records carry fingerprints (1: none, so nothing is skipped)
_REPORT_EVERY_S = 0.5       # rewrite the report at most this often (and at the end)
_STOP_GRACE_S = 10.0        # how long stopped workers get to remove their temporary files
_POLL_S = 0.1               # how often a pool's results loop looks for a Ctrl-C


class ReportError(Error, OSError):
    """The report could not be written while the job ran (a full disk, a
    folder removed); the message names the report and its absolute path.
    The job stops; the report file keeps its last complete version."""


@dataclasses.dataclass
class Record:
    """What happened to one file.

    Attributes:
        path: the input file, as collected.
        status: "ok", "failed" or "skipped" (ok in an earlier run of the report).
        reason: why it failed, or why it was skipped (empty when ok).
        seconds: wall time of the task, in seconds.
        details: task-specific results (e.g. max error, output path).
        fingerprints: ``{"input": fp, "output": fp}`` of the input as the
            job left it and of the output written (see :func:`fingerprint`;
            None where there is none), what a resumed run compares; ``{}``
            when the job keeps no report (nothing would compare them, and
            each takes a SHA-256 of the file).
    """
    path: str
    status: str
    reason: str = ""
    seconds: float = 0.0
    details: dict = dataclasses.field(default_factory=dict)
    fingerprints: dict = dataclasses.field(default_factory=dict)

    def to_json(self):
        return {"path": self.path, "status": self.status, "reason": self.reason,
                "seconds": round(self.seconds, 6), "details": self.details,
                "fingerprints": self.fingerprints}


# ----------------------------------------------------------- fingerprints
def _sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


_SPECIAL = ((stat.S_ISFIFO, "a named pipe"), (stat.S_ISSOCK, "a socket"),
            (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))


def _special_file(path):
    """What ``path`` is when it is neither a regular file nor a folder (``"a
    named pipe"``, ``"a socket"``, ``"a character device"``, ``"a block
    device"``), else None (None too when it cannot be looked at). A batch
    job never opens such a file: opening a named pipe waits for a writer,
    for ever (a FIFO named x.tmod in a folder hung ``mgtrace verify``)."""
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return None
    return next((what for test, what in _SPECIAL if test(mode)), None)


def _not_a_file(path, what):
    return f"{path} is {what}, not a file: archives are read from files"


def fingerprint(path):
    """``{"size", "mtime_ns", "inode", "sha256"}`` of file ``path``, or None
    when it cannot be read (or is not a file: see :func:`_special_file`)."""
    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode):
            return None
        return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "inode": st.st_ino,
                "sha256": _sha256(path)}
    except OSError:
        return None


def unchanged(path, fp):
    """Whether file ``path`` still has the content of fingerprint ``fp``: a
    different size answers at once (the fast check), else the SHA-256 of its
    bytes decides (a copy that kept size, mtime and inode is still seen)."""
    if not isinstance(fp, dict):
        return False
    try:
        st = os.stat(path)
        if st.st_size != fp.get("size") or not stat.S_ISREG(st.st_mode):
            return False
        return _sha256(path) == fp.get("sha256")
    except OSError:
        return False


# ------------------------------------------------------------- collecting
def collect(paths, pattern="*.tmod", exclude=None):
    """Files named by ``paths``: files as given, folders searched recursively
    for names matching ``pattern`` (a glob), skipping hidden files and
    folders (``.name``, e.g. temporary files) and anything under the folder
    ``exclude`` (an output folder inside an input folder); sorted,
    duplicates dropped.

    Raises:
        FileNotFoundError: a path does not exist.
        PermissionError, OSError: a folder cannot be listed (os.walk's
            default skips it without a word, and a job over the rest would
            report everything good).
    """
    out, seen = [], set()
    skip = os.path.realpath(exclude) if exclude else None
    for p in paths:
        p = os.fspath(p)
        if os.path.isdir(p):
            found = []
            for root, dirs, files in os.walk(p, onerror=_unlistable):
                dirs[:] = sorted(d for d in dirs if not d.startswith(".")
                                 and os.path.realpath(os.path.join(root, d)) != skip)
                found += [os.path.join(root, f) for f in files
                          if not f.startswith(".") and fnmatch.fnmatch(f, pattern)]
            items = sorted(found)
        elif os.path.exists(p):
            items = [p]
        else:
            raise FileNotFoundError(f"no such file or folder: {p}")
        for f in items:
            f = os.path.normpath(f)
            key = os.path.abspath(f)
            if key not in seen:
                seen.add(key)
                out.append(f)
    return out


def _unlistable(e):
    raise type(e)(e.errno, f"cannot search the folder {e.filename} for archives: "
                           f"{e.strerror or e}; give this user access to it, or leave it "
                           "out of the paths") from e


HEADER_WEIGHT = 256    # a header byte costs about this many tensor bytes of work (see work_size)


def work_size(path):
    """The work a task on archive ``path`` is likely to take, in tensor-byte
    units, from its first 16 bytes and its size: the tensor bytes (read and
    checksummed) plus :data:`HEADER_WEIGHT` x the header's length (decoding
    it and building the modules and graphs it describes costs a few hundred
    times more per byte; measured on ResNet-18, MobileNetV2 and MiniLM
    archives). A file that is not an archive, or cannot be read, counts its
    size. Parallel jobs start with the biggest, so that no large file is
    left to run alone while the other workers idle."""
    from mgtrace.serialization.layout import MAGIC, PREFIX
    if _special_file(path) is not None:
        return 0
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            prefix = f.read(PREFIX.size)
    except OSError:
        return 0
    if len(prefix) < PREFIX.size:
        return size
    magic, header_len = PREFIX.unpack(prefix)
    if magic != MAGIC or header_len > size:
        return size
    return size - header_len + HEADER_WEIGHT * header_len


def leftovers(paths):
    """``[(path, bytes)]`` of the temporary files that interrupted saves left
    in the folders of ``paths`` (searched as :func:`collect` does; files
    given by name are not searched around), and that no live writer holds
    (see :func:`mgtrace.serialization.atomic.leftovers`)."""
    from mgtrace.serialization.atomic import leftovers as in_folder
    out = []
    for p in paths:
        p = os.fspath(p)
        if os.path.isdir(p):
            for root, dirs, _ in os.walk(p):
                dirs[:] = sorted(d for d in dirs if not d.startswith("."))
                out += in_folder(root)
    return out


# ----------------------------------------------------------------- report
def _load_report(path):
    if not path or not os.path.exists(path):
        return None
    try:
        with open(path) as f:
            data = json.load(f)
        recs = data["records"]
        if not isinstance(recs, list):
            raise TypeError("records is not a list")
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{path} is not an mgtrace batch report ({type(e).__name__}: {e}); "
                         "give another --report file, or delete this one") from None
    return data


def _abs(path, cwd):
    return os.path.normpath(os.path.join(cwd or os.getcwd(), path))


def read_report(path):
    """``{abs path: record dict}`` of a report written by :func:`run`
    (empty when the file does not exist). Relative paths are resolved
    against the folder the report's job ran in.

    Raises:
        ValueError: the file is not a report of this format.
    """
    data = _load_report(path)
    if data is None:
        return {}
    cwd = data.get("cwd") if isinstance(data.get("cwd"), str) else None
    return {_abs(r["path"], cwd): r for r in data["records"]
            if isinstance(r, dict) and isinstance(r.get("path"), str)}


def _job_text(command, options):
    options = options or {}
    if options.get("in_place"):
        return f"{command} --in-place"
    return f"{command} -o {options['out']}" if options.get("out") else str(command)


def _check_resumable(path, data, command, options):
    """Refuse to resume a report written by another command or output."""
    def key(cmd, opts, cwd=None):
        opts = opts if isinstance(opts, dict) else {}
        out = opts.get("out")
        return cmd, bool(opts.get("in_place")), _abs(out, cwd) if isinstance(out, str) else None
    cwd = data.get("cwd") if isinstance(data.get("cwd"), str) else None
    if "options" not in data:       # a report from before options were kept: the command only
        options = {}
    if key(data.get("command"), data.get("options"), cwd) != key(command, options):
        raise ValueError(f"--report {path} is the report of `{_job_text(data.get('command'), data.get('options'))}`, "
                         f"not of `{_job_text(command, options)}`: give another --report file, "
                         "or --no-resume to start it afresh")


_SHAPING = ("out", "in_place", "inputs", "rtol", "atol", "imports", "scripts")   # kept in a report


def _stored_options(options):
    out = {k: list(v) if isinstance(v, tuple) else v
           for k, v in options.items() if k in _SHAPING}
    scripts = _scripts(options)
    if scripts:       # the user's code shapes outputs too: its bytes are part of the job
        out["scripts"] = {p: (fingerprint(p) or {}).get("sha256") for p in scripts}
    return out


def _scripts(options):
    """The user's script files an option names (``--inputs FILE.py:FN``,
    ``--import FILE.py``)."""
    paths = []
    for spec in [options.get("inputs"), *(options.get("imports") or ())]:
        if isinstance(spec, str):
            path = spec.rpartition(":")[0] if ".py:" in spec else spec
            if path.endswith(".py"):
                paths.append(path)
    return paths


def _same_shaping(data, options):
    """Whether a report's job had the options that shape outputs (``out`` and
    ``in_place`` are checked by :func:`_check_resumable`)."""
    old = data.get("options") if isinstance(data.get("options"), dict) else {}
    new = _stored_options(options)
    return data.get("report_version") == REPORT_VERSION and all(
        old.get(k) == new.get(k) for k in _SHAPING if k not in ("out", "in_place"))


def _resumable(f, rec, cwd):
    """Whether file ``f``, ok in an earlier run (in folder ``cwd``) as
    ``rec``, needs no redo."""
    if rec.get("status") != "ok":      # a task's own "skipped" (say, a newer format) is redone
        return False
    fps = rec.get("fingerprints")
    if not isinstance(fps, dict) or not unchanged(f, fps.get("input")):
        return False
    out = (rec.get("details") or {}).get("output")
    return not isinstance(out, str) or unchanged(_abs(out, cwd), fps.get("output"))


def _write_report(path, command, options, records, finished, started):
    recs = [r if isinstance(r, dict) else r.to_json() for r in records]
    counts = {"ok": 0, "failed": 0}
    for r in recs:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    data = {"report_version": REPORT_VERSION, "command": command,
            "options": _stored_options(options),
            "cwd": os.getcwd(), "finished": finished,
            "seconds": round(time.perf_counter() - started, 3),
            "summary": {**counts, "total": len(recs)}, "records": recs}
    from mgtrace.serialization.atomic import replacing
    with replacing(path) as (out, _):
        out.write(_json.dumps(data, indent=1).encode())


# ------------------------------------------------------------------ tasks
_TASK_LOCK = threading.Lock()     # tracing hooks are process-wide: one task at a time per process
_IN_TASK = False                  # a pool worker is inside a task (see _stop_worker)


class _Stopped(BaseException):
    """Raised in a pool worker's task when the parent stops the pool."""


def _call(task, path, options, imports=(), fingerprints=True):
    """Run one task (after importing the user's ``imports`` in this
    process), turning any exception into a failed result. ``fingerprints``:
    take the input's and output's (a SHA-256 of each: what a report keeps
    to resume; a job without a report skips reading every file once more)."""
    global _IN_TASK
    what = _special_file(path)
    if what is not None:
        return _failed(_not_a_file(path, what))
    t0 = time.perf_counter()
    # before the task: a file changed meanwhile is redone next time
    before = fingerprint(path) if fingerprints else None
    try:
        with _TASK_LOCK:
            _IN_TASK = True
            try:
                if imports:
                    from mgtrace.cli.tasks import load_user_code
                    for spec in imports:
                        load_user_code(spec)
                res = dict(task(path, **options))
            finally:
                _IN_TASK = False
    except _Stopped:                # the task unwound (temporary files removed): now go
        os._exit(128 + signal.SIGTERM)
    except Exception as e:          # a bad archive must not stop the batch
        from mgtrace.errors import ArchiveError
        res = {"status": "failed", "reason": f"{type(e).__name__}: {e}"}
        if not isinstance(e, (ArchiveError, OSError)):   # unexpected: keep where it came from
            res["traceback"] = "".join(traceback.format_exception(type(e), e, e.__traceback__)[-6:])
    res["seconds"] = time.perf_counter() - t0
    if fingerprints:
        res["fingerprints"] = _fingerprints(path, before, res)
    return res


def _fingerprints(path, before, res):
    out = res.get("output") if res.get("status") == "ok" else None
    after = fingerprint(out) if isinstance(out, str) else None
    same = isinstance(out, str) and os.path.abspath(out) == os.path.abspath(path)
    return {"input": after if same else before, "output": after}      # in place: what we left


def _to_record(path, res):
    res = dict(res)
    fps = res.pop("fingerprints", None)
    return Record(path=path, status=res.pop("status", "failed"), reason=res.pop("reason", ""),
                  seconds=res.pop("seconds", 0.0), details=res,
                  fingerprints=fps if isinstance(fps, dict) else {})


def _failed(reason):
    return {"status": "failed", "reason": reason, "seconds": 0.0}


# ------------------------------------------------------------ local pool
_IN_HOOK = False       # inside _unraisable_in_worker: a stop raised there is lost
_REDELIVER_S = 0.01


def _stop_worker(signum, frame):
    """SIGTERM in a pool worker: an idle worker exits at once; a busy one
    unwinds its task first (its ``finally`` blocks remove temporary files),
    deaf to further SIGTERMs (a pool that breaks sends more), then exits."""
    if not _IN_TASK:
        os._exit(128 + signum)
    if _IN_HOOK:    # raised here it would be swallowed (and printed): try again after the hook
        signal.setitimer(signal.ITIMER_REAL, _REDELIVER_S)
        return
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise _Stopped()


def _unraisable_in_worker(info, _default=sys.unraisablehook):
    """A stop (SIGTERM -> _Stopped) that landed inside a finalizer or
    ``__del__`` is swallowed there ("Exception ignored in ..."): deliver it
    again once this hook has returned (SIGALRM after a moment), so the task
    still unwinds and its temporary files go."""
    global _IN_HOOK
    if isinstance(info.exc_value, _Stopped):
        _IN_HOOK = True
        try:
            signal.signal(signal.SIGTERM, _stop_worker)
            signal.setitimer(signal.ITIMER_REAL, _REDELIVER_S)
        finally:
            _IN_HOOK = False        # no call follows: Python runs no handler before the return
        return
    _default(info)


def _worker_init(parent_pid=None, marks=None):
    global _MARKS
    _MARKS = marks
    signal.signal(signal.SIGINT, signal.SIG_IGN)     # Ctrl-C is the parent's business
    signal.signal(signal.SIGTERM, _stop_worker)      # how the parent stops a running task
    signal.signal(signal.SIGALRM, _stop_worker)      # a stop delivered again (see the hook)
    _die_with_parent(parent_pid)
    sys.unraisablehook = _unraisable_in_worker
    from mgtrace import set_num_threads
    set_num_threads(1)              # one kernel thread per worker: the pool already uses the cores
    import mgtrace.cli.tasks        # noqa: F401  (the commands' tasks: imported once, then...)
    gc.freeze()     # ...what import made is left out of every later collection, which files'
    #                 graphs (cycles of nodes and exprs) trigger again and again


def _die_with_parent(parent_pid):
    """Ask Linux for a SIGTERM when the parent dies, so a parent killed with
    SIGKILL (which it cannot clean up after) leaves no worker behind: the
    worker stops as the parent would have stopped it (its task's ``finally``
    blocks remove temporary files). Elsewhere nothing is asked: the workers
    then end when their task queue closes."""
    if not sys.platform.startswith("linux") or parent_pid is None:
        return
    import ctypes
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM, 0, 0, 0)      # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent_pid:                  # it died before the request: stop now
        os._exit(128 + signal.SIGTERM)


@contextlib.contextmanager
def _sigint_ignored():
    """Ignore SIGINT while workers start, so they inherit SIG_IGN and a
    Ctrl-C cannot hit one before its initializer ran."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)


class _Interrupted:
    """Ctrl-C while a pool runs: SIGINT only sets a flag, and the engine
    raises KeyboardInterrupt itself at its next check, so it never lands
    inside the standard library's locks and queues (where it can come out as
    "RuntimeError: release unlocked lock" instead, CPython bpo-29988)."""

    def __init__(self):
        self.flag = threading.Event()

    def check(self):
        if self.flag.is_set():
            raise KeyboardInterrupt


@contextlib.contextmanager
def _deferred_sigint(in_process=False):
    """Install the job's SIGINT (and SIGTERM) handler; yield its
    :class:`_Interrupted`. ``in_process``: the files run in this process, so
    the handler also raises KeyboardInterrupt at once (a long file stops
    promptly), SIGTERM keeps its default, and the flag stays set for the
    caller's next check: a KeyboardInterrupt that lands in a finalizer or a
    ``__del__`` is printed ("Exception ignored in ...") and swallowed by
    CPython, and the job would otherwise run on to exit 0."""
    stop = _Interrupted()
    if threading.current_thread() is not threading.main_thread():
        yield stop                    # no handlers off the main thread: plain behaviour
        return

    def handler(signum, frame):
        stop.flag.set()
        if in_process:
            raise KeyboardInterrupt
    # started with SIGINT ignored (nohup, a script's background job): keep it
    # so, as a one-process run does, whatever the number of workers. SIGTERM
    # (kill, a CI job's timeout) stops the pool as Ctrl-C does: by default it
    # ended this process alone, and its workers, blocked on their queue, lived on
    old = {sig: signal.getsignal(sig)
           for sig in ((signal.SIGINT,) if in_process else (signal.SIGINT, signal.SIGTERM))}
    mine = [sig for sig, h in old.items()
            if h is not signal.SIG_IGN and (sig == signal.SIGINT or h is signal.SIG_DFL)]
    for sig in mine:
        signal.signal(sig, handler)
    try:
        yield stop
    finally:
        for sig in mine:
            signal.signal(sig, old[sig])


class _WorkerProcess(multiprocessing.context.SpawnProcess):
    """A pool worker started with SIGINT ignored, so it inherits SIG_IGN and a
    Ctrl-C cannot hit it before its initializer ran. Only the start itself is
    covered: a Ctrl-C meant for the parent while it submits files (the pool
    starts workers inside ``submit``, at any point of a long job) is kept."""

    def start(self):
        with _sigint_ignored():
            super().start()


class _WorkerContext(multiprocessing.context.SpawnContext):
    Process = _WorkerProcess


def _new_pool(jobs, marks=None):
    # spawn: no fork after BLAS threads started
    return cf.ProcessPoolExecutor(max_workers=jobs, mp_context=_WorkerContext(),
                                  initializer=_worker_init, initargs=(os.getpid(), marks))


# a pool's files, by their place in the job: what a worker did with each (a byte per file in
# memory the workers share, written without a lock: one writer per byte), so a worker's death
# fails only the files that were running, not those still queued
_QUEUED, _STARTED, _ENDED = 0, 1, 2
_MARKS = None           # in a pool worker: the job's marks
_IDLE_DEATHS = 2        # pools in a row that broke before any file started or returned


def _marked_call(i, task, path, options, imports, fps):
    """:func:`_call` in a pool worker, marking file ``i`` started, then ended."""
    _MARKS[i] = _STARTED
    try:
        return _call(task, path, options, imports, fps)
    finally:
        _MARKS[i] = _ENDED


def _stop_pool(pool):
    """Cancel what has not started, stop running workers (SIGTERM: they
    clean up and exit), kill those that do not exit in time, and wait for
    the pool's manager thread to end.

    That last wait matters: ``shutdown(wait=False)`` forgets the manager
    thread, and a manager still closing its wake-up pipe at interpreter exit
    races concurrent.futures' exit hook, which writes to that pipe
    (``OSError: [Errno 9] Bad file descriptor``, CPython 3.11)."""
    procs = list((getattr(pool, "_processes", None) or {}).values())
    manager = getattr(pool, "_executor_manager_thread", None)
    pool.shutdown(wait=False, cancel_futures=True)
    live = {}
    for p in procs:
        with contextlib.suppress(Exception):        # a process already reaped and closed
            p.terminate()
            live[p.sentinel] = p
    deadline = time.monotonic() + _STOP_GRACE_S
    while live and time.monotonic() < deadline:
        for s in multiprocessing.connection.wait(list(live), timeout=deadline - time.monotonic()):
            live.pop(s, None)
    for p in live.values():
        with contextlib.suppress(Exception):
            p.kill()
    with contextlib.suppress(Exception):
        pool.shutdown(wait=True)
    if manager is not None:
        manager.join(timeout=_STOP_GRACE_S)


_DIED = ("the worker process died while running this file (a crash, or killed for memory); "
         "it was run alone and died again")


def _pool_results(task, files, options, jobs, imports, fps):
    """``(file, result)`` as files finish in a pool of ``jobs`` processes.

    A worker that dies breaks the pool, and every file not yet returned
    with it: those a worker had started (the dead one's, and the others'
    the pool stopped) are retried one process each, at the end; those still
    queued, or done but not yet returned, go to a fresh pool. A pool that
    broke before any file started or returned (a worker killed as it
    started up) is started again, all of it; a second time, its files run
    alone. (Retrying every unreturned file alone made one crash early in a
    job of thousands of files start a process per file, 100 times slower.)"""
    order = {f: i for i, f in enumerate(files)}
    marks = multiprocessing.get_context("spawn").RawArray("b", len(files))
    todo, alone, idle_deaths = list(files), [], 0
    while todo:
        lost = []
        for f in todo:
            marks[order[f]] = _QUEUED
        for f, res in _pool_round(task, todo, options, jobs, imports, fps, marks, order):
            if res is None:
                lost.append(f)
            else:
                yield f, res
        started = [f for f in lost if marks[order[f]] == _STARTED]
        # a pool that broke with no file started and none returned (a worker killed while
        # it started up) is tried again once; twice, its files run alone
        idle_deaths = idle_deaths + 1 if lost and not started and len(lost) == len(todo) else 0
        if started or idle_deaths >= _IDLE_DEATHS:
            moved = set(started or lost)
            alone += [f for f in lost if f in moved]
            lost = [f for f in lost if f not in moved]
        todo = lost
    if alone:
        yield from _isolated_results(task, sorted(alone, key=order.get), options, jobs, imports,
                                     fps)


def _pool_round(task, files, options, jobs, imports, fps, marks, order):
    """``(file, result)`` as files finish in one pool; result None for a
    file the pool broke before it returned (see ``marks`` for how far it
    got)."""
    pool = _new_pool(min(jobs, len(files)), marks)
    broken = False
    with _deferred_sigint() as stop:
        try:
            futs = {}
            for f in files:     # a worker that dies meanwhile breaks submit too: it raises
                try:            # BrokenProcessPool, or, starting a worker while the pool is
                    #             torn down, OSError or ValueError (closed handles)
                    futs[pool.submit(_marked_call, order[f], task, f, options, imports, fps)] = f
                except (cf.process.BrokenProcessPool, OSError, ValueError):
                    broken = True
                    break
            pending = set(futs)
            while pending:
                stop.check()
                done, pending = cf.wait(pending, timeout=_POLL_S,
                                        return_when=cf.FIRST_COMPLETED)
                for fut in sorted(done, key=lambda x: futs[x]):
                    f = futs[fut]
                    try:
                        res = fut.result()
                    except cf.process.BrokenProcessPool:
                        res, broken = None, True
                    except Exception as e:      # e.g. a result that cannot be pickled
                        res = _failed(f"the worker could not return a result: "
                                      f"{type(e).__name__}: {e}")
                    yield f, res
                    stop.check()
            for f in files[len(futs):]:     # never submitted: the pool broke first
                yield f, None
        except BaseException:               # Ctrl-C, or the caller stopped listening
            _stop_pool(pool)
            raise
        if broken:
            # not shutdown(wait=True): a worker that submit started while the pool's manager
            # thread was already tearing the broken pool down (a death early in the job) was
            # never sent SIGTERM, and the manager waits for it to exit for ever, which an
            # idle worker never does (CPython 3.11's concurrent.futures); stop them all here
            _stop_pool(pool)
        else:
            pool.shutdown(wait=True)


def _isolated_results(task, files, options, jobs, imports, fps):
    """Each file in its own one-process pool, ``jobs`` at a time."""
    todo, active = list(files), {}
    with _deferred_sigint() as stop:
        yield from _isolated_loop(task, todo, active, options, jobs, imports, fps, stop)


def _isolated_loop(task, todo, active, options, jobs, imports, fps, stop):
    try:
        while todo or active:
            stop.check()
            while todo and len(active) < jobs:
                f = todo.pop(0)
                pool = _new_pool(1)
                active[pool.submit(_call, task, f, options, imports, fps)] = (f, pool)
            done, _ = cf.wait(list(active), timeout=_POLL_S,
                              return_when=cf.FIRST_COMPLETED)
            for fut in done:
                f, pool = active.pop(fut)
                try:
                    res = fut.result()
                except cf.process.BrokenProcessPool:
                    res = _failed(_DIED)
                except Exception as e:
                    res = _failed(f"the worker could not return a result: {type(e).__name__}: {e}")
                pool.shutdown(wait=True)
                yield f, res
    except BaseException:
        for f, pool in active.values():
            _stop_pool(pool)
        raise


def _local_results(task, files, options, jobs, imports, fps):
    if jobs <= 1 or len(files) <= 1:
        with _deferred_sigint(in_process=True) as stop:
            for f in files:
                stop.check()        # a Ctrl-C a finalizer swallowed during the last file
                yield f, _call(task, f, options, imports, fps)
    else:
        yield from _pool_results(task, files, options, min(jobs, len(files)), imports, fps)


# ------------------------------------------------------------------- Dask
def _dask_results(task, files, options, address, jobs, imports, fps):
    try:
        from distributed import Client, LocalCluster, as_completed
    except ImportError:
        raise RuntimeError("--dask needs dask.distributed: pip install 'mgtrace[distributed]'") from None
    cluster = None
    try:
        if address == "local":
            # loopback only; tasks in one process take turns (_TASK_LOCK), so
            # jobs > 1 means worker processes
            loopback = {"host": "127.0.0.1"} if jobs > 1 else {}     # else in-process: inproc://
            # workers inherit SIGINT ignored: Ctrl-C is the parent's business; and
            # their logs stay quiet (a task's failure comes back as its result, and
            # a worker that outlives the scheduler by a heartbeat on Ctrl-C logs an
            # ERROR that means nothing to the user)
            with _sigint_ignored():
                cluster = LocalCluster(n_workers=jobs, threads_per_worker=1, processes=jobs > 1,
                                       dashboard_address=None, silence_logs=logging.CRITICAL,
                                       **loopback)
            client = Client(cluster)
            if jobs > 1:        # one kernel thread per worker process, as in a local pool
                client.run(_one_kernel_thread)
        else:
            client = Client(address, timeout="20s")
    except (OSError, TimeoutError) as e:
        if cluster is not None:
            cluster.close()
        raise RuntimeError(f"cannot reach the Dask scheduler at {address}: {e}") from None
    sent = files
    if cluster is None:     # remote workers have their own working folder: send absolute paths
        sent, options = [os.path.abspath(f) for f in files], _absolute(options)
        imports = tuple(os.path.abspath(i) if i.endswith(".py") else i for i in imports)
    try:
        n = len(files)
        futs = client.map(_call, [task] * n, sent, [options] * n, [imports] * n, [fps] * n,
                          pure=False)
        where = {f.key: path for f, path in zip(futs, files)}
        for fut in as_completed(futs):
            try:
                res = fut.result()
            except Exception as e:      # the worker died, or the result did not come back
                res = _failed(f"the Dask task failed: {type(e).__name__}: {e}")
            yield where[fut.key], res
    finally:
        client.close()
        if cluster is not None:
            cluster.close()


def _one_kernel_thread():
    from mgtrace import set_num_threads
    set_num_threads(1)


def _absolute(options):
    """``options`` with the paths in them (out, roots, an --inputs script) absolute."""
    o = dict(options)
    if o.get("out"):
        o["out"] = os.path.abspath(o["out"])
    if o.get("roots"):
        o["roots"] = tuple(os.path.abspath(r) for r in o["roots"])
    spec = o.get("inputs")
    if isinstance(spec, str) and ".py:" in spec:
        where, _, fn = spec.rpartition(":")
        o["inputs"] = f"{os.path.abspath(where)}:{fn}"
    return o


# -------------------------------------------------------------------- run
def run(task, paths, *, options=None, jobs=1, dask=None, report=None, resume=True,
        pattern="*.tmod", progress=None, callback=None, command=None, exclude=None, imports=()):
    """Map ``task`` over the files of ``paths``; a Record per file.

    Args:
        task: top-level function ``task(path, **options) -> dict``.
        paths: files and folders (see :func:`collect`).
        options: keyword arguments for every task call (picklable).
        jobs: processes (1 runs in this process); with ``dask="local"``
            the number of Dask workers.
        dask: None, ``"local"`` (a loopback LocalCluster) or a scheduler
            address such as ``"tcp://10.0.0.5:8786"`` (its workers must see
            the same file paths).
        report: path of the JSON report to write (and resume from).
        resume: skip files the report already lists as ``ok``.
        pattern: file name glob inside folders.
        progress: show a progress bar on stderr (default: when stderr is a
            terminal).
        callback: ``callback(record, done, total)`` after each file run.
        command: a label stored in the report (e.g. ``"retrace"``).
        exclude: a folder whose files are never collected (the output).
        imports: modules (``"pkg.mod"``) or scripts (``"file.py"``) to
            import first in this process and in every worker: the code that
            registers the user's functions and module types, so archives
            naming them can be loaded.

    Returns:
        list of Record, in the order of the collected files.

    Raises:
        FileNotFoundError: a path does not exist.
        ValueError: jobs < 1; the report is not a report, or one of
            another command or output folder; an ``imports`` entry fails.
        OSError: the report's folder cannot be written.
        RuntimeError: ``dask`` given without dask.distributed installed, or
            the scheduler cannot be reached.
        ReportError: the report could not be written while the job ran.
        BlockingIOError: another job is using the report (POSIX).
        KeyboardInterrupt: Ctrl-C; the report holds the files finished.

    With ``jobs > 1`` workers are started with ``spawn``: a script calling
    this must guard its top level with ``if __name__ == "__main__":``.
    """
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ValueError(f"jobs must be an int >= 1, got {jobs!r}")
    options = dict(options or {})
    command = command or getattr(task, "__name__", "batch")
    if report and not os.path.isdir(os.path.dirname(os.path.abspath(report))):
        raise FileNotFoundError(f"--report {report}: its folder does not exist")
    if report:
        _check_writable(os.path.dirname(os.path.abspath(report)), f"--report {report}: its folder")
        what = _special_file(report)     # a named pipe would be waited on for ever
        if what is not None:
            raise ValueError(f"--report {report} is {what}, not a file: give a file's path "
                             "(it is written, then read to resume)")
    with _report_lock(report):
        return _run(task, paths, options, jobs, dask, report, resume, pattern, progress,
                    callback, command, exclude, imports)


@contextlib.contextmanager
def _report_lock(report):
    """Hold ``report``'s lock (an flock on ``.NAME.lock`` beside it, removed
    after) for a job, so a second job given the same report refuses to
    start: each rewrote the report with its own records, and the one that
    finished last erased the other's (a cron job overlapping the one
    before it). POSIX only; elsewhere nothing is locked.

    Raises:
        BlockingIOError: another live job holds the lock (its pid named).
    """
    try:
        import fcntl
    except ImportError:
        fcntl = None
    if not report or fcntl is None:
        yield
        return
    folder, name = os.path.split(os.path.abspath(report))
    path = os.path.join(folder, f".{name}.lock")
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise BlockingIOError(errno.EWOULDBLOCK, f"the report {report} is in use by another "
                                  f"mgtrace job (pid {pid}): wait for it to end, or give this "
                                  "job another --report") from None
        try:             # the lock file a job that just ended removed: lock the new one
            same = os.path.samestat(os.fstat(fd), os.stat(path))
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)      # while still locked: a job waiting on this file retries
        os.close(fd)


def _run(task, paths, options, jobs, dask, report, resume, pattern, progress, callback, command,
         exclude, imports):
    files = collect(paths, pattern, exclude)
    imports = tuple(os.fspath(i) for i in (imports or ()))
    from mgtrace.cli.tasks import load_user_code
    for spec in imports:            # here first: a bad one is an error before any file runs
        load_user_code(spec)
    started = time.perf_counter()
    old = _load_report(report) if report else None
    if old is not None and resume:
        _check_resumable(report, old, command, options)
    prev = read_report(report) if (old is not None and resume) else {}
    same_job = old is not None and _same_shaping(old, dict(options, imports=imports))
    records, kept = {}, {}
    for f in files:
        p = prev.get(os.path.abspath(f))
        if p is not None and same_job and _resumable(f, p, old.get("cwd")):
            kept[f] = dict(p, path=f)
            records[f] = Record(f, "skipped", f"{RESUMED} (see {report})",
                                seconds=0.0, details=dict(p.get("details") or {}))
    here = {os.path.abspath(f) for f in files}
    others = [dict(r, path=k) for k, r in prev.items() if k not in here]   # earlier files, kept
    todo = [f for f in files if f not in records]

    def save_report(finished):
        if report:
            done = [kept.get(f) or records[f] for f in files if f in records]
            try:
                _write_report(report, command, dict(options, imports=imports), others + done,
                              finished, started)
            except OSError as e:
                where = "" if os.path.isabs(report) else f" ({os.path.abspath(report)})"
                raise ReportError(e.errno, f"cannot write the report {report}{where}: "
                                           f"{e.strerror or e}") from e
    show = sys.stderr.isatty() if progress is None else progress
    bar = _Progress(len(todo), command, show)
    if dask or jobs > 1:        # the biggest files first: none is left to run alone at the end
        todo = sorted(todo, key=work_size, reverse=True)
    fps = bool(report)
    if dask:
        results = _dask_results(task, todo, options, dask, jobs, imports, fps)
    else:
        results = _local_results(task, todo, options, jobs, imports, fps)
    last_write = 0.0
    finished = False
    try:
        for i, (f, res) in enumerate(results, 1):
            rec = _to_record(f, res)
            records[f] = rec
            bar.advance(rec)
            if callback is not None:        # first: a report that cannot be written stops the job
                callback(rec, i, len(todo))
            if report and time.monotonic() - last_write >= _REPORT_EVERY_S:
                save_report(False)
                last_write = time.monotonic()
        finished = True
    finally:
        results.close()
        bar.close()
        save_report(finished)
    return [records[f] for f in files if f in records]


class _Progress:
    """A progress bar on stderr when it is a terminal (rich); nothing otherwise."""

    def __init__(self, total, label, show):
        self._p = None
        self._failed = 0
        if not (show and total):
            return
        try:
            from rich.console import Console
            from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                                       TimeElapsedColumn, TimeRemainingColumn)
        except ImportError:
            return
        self._p = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                           TextColumn("{task.fields[failed]}"), TimeElapsedColumn(),
                           TextColumn("eta"), TimeRemainingColumn(),
                           console=Console(stderr=True), transient=True)
        self._p.start()
        self._task = self._p.add_task(label, total=total, failed="")

    def advance(self, rec):
        if self._p is not None:
            self._failed += rec.status == "failed"
            self._p.update(self._task, advance=1,
                           failed=f"[red]{self._failed} failed[/]" if self._failed else "")

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


def _check_writes(paths, out, in_place, pattern, inputs=None):
    """The options of a writing job, checked before any file is touched.

    Raises:
        ValueError: neither or both of out / in_place; two inputs would be
            written to one output; an output would overwrite its input
            without in_place; a bad ``inputs`` spec.
        FileNotFoundError: a path does not exist.
        OSError: the output folder cannot be made or written.
    """
    from mgtrace.cli import tasks
    if bool(out) == bool(in_place):
        raise ValueError("give an output folder (-o OUT / out=...) or --in-place (in_place=True), "
                         "not both" if out else
                         "give an output folder (-o OUT / out=...) or --in-place (in_place=True)")
    if out and os.path.exists(out) and not os.path.isdir(out):
        raise ValueError(f"-o {out}: exists and is not a folder")
    roots = _roots(paths)
    if inputs is not None:
        tasks.load_inputs_provider(inputs)
    if in_place:
        return {"out": None, "in_place": True, "roots": roots}
    seen = {}
    for f in collect(paths, pattern, exclude=out):
        # compared through symbolic links: saves write through them
        dest = os.path.realpath(tasks.destination(f, out, False, roots))
        if dest == os.path.realpath(f):
            raise ValueError(f"-o {out} would overwrite the original {f}: choose another output "
                             "folder, or replace the originals with --in-place")
        if dest in seen:
            raise ValueError(f"{seen[dest]} and {f} would both be written to {dest}: give their "
                             "folders as inputs (the layout below each input folder is kept) or "
                             "run them separately")
        seen[dest] = f
    _check_writable(out, f"-o {out}")
    return {"out": os.fspath(out), "in_place": False, "roots": roots}


def _check_writable(folder, what):
    """Make ``folder`` and write a file in it, so that one that cannot be
    written is one error before the job starts, not one per file.

    Raises:
        OSError: its message starts with ``what`` (e.g. ``-o new/``); a
            PermissionError, or NotADirectoryError when a parent is a file.
    """
    try:
        os.makedirs(folder, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".mgtrace-probe-", suffix=".tmp", dir=folder)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise type(e)(e.errno, f"{what}: cannot write files there: {e.strerror or e}") from None


def _device_option(device):
    """{"device": name} for a device other than the default CPU, else {} (so
    reports of CPU runs keep their options); ValueError for a bad name,
    DeviceUnavailable for a device this process cannot use."""
    if device is None:
        return {}
    from mgtrace._core.tensor import require_device
    from mgtrace.errors import DeviceUnavailable
    try:
        return {"device": str(require_device(device))}
    except DeviceUnavailable as e:
        raise DeviceUnavailable(f"--device {device}: {e}") from None


def verify(paths, *, rtol=1e-5, atol=1e-6, device=None, **run_options):
    """Verify every archive of ``paths`` (see :func:`mgtrace.cli.tasks.verify_file`),
    running the stored examples on ``device`` (default: the CPU);
    ``run_options`` are those of :func:`run` (jobs, dask, report, callback...)."""
    from mgtrace.cli import tasks
    return run(tasks.verify_file, paths,
               options={"rtol": rtol, "atol": atol, **_device_option(device)},
               command="verify", **run_options)


def upgrade(paths, *, out=None, in_place=False, rtol=1e-5, atol=1e-6, device=None, **run_options):
    """Rewrite every archive of ``paths`` in the current format into folder
    ``out`` (same relative layout below each input folder) or, with
    ``in_place``, over the originals, each only after the new file
    reproduced the stored example outputs (or, without examples, the same
    tensors), run on ``device`` (default: the CPU). ``run_options`` are
    those of :func:`run`.

    Raises:
        ValueError: see :func:`_check_writes`, and :func:`run`.
    """
    from mgtrace.cli import tasks
    opts = _check_writes(paths, out, in_place, run_options.get("pattern", "*.tmod"))
    return run(tasks.upgrade_file, paths,
               options={**opts, "rtol": rtol, "atol": atol, **_device_option(device)},
               command="upgrade", exclude=opts["out"], **run_options)


def retrace(paths, *, out=None, in_place=False, inputs=None, rtol=1e-5, atol=1e-6, device=None,
            **run_options):
    """Load each archive of ``paths``, trace it again with this library,
    check the new module against the old one, and save it into ``out`` (or
    over the original with ``in_place``). ``inputs``: ``"file.py:fn"`` or
    ``"module:fn"`` giving example inputs for archives without stored ones
    (called as ``fn(path, module)``). ``device``: where the modules are
    traced and run (default: the CPU). ``run_options`` are those of
    :func:`run`; ``callback(record, done, total)`` reports progress.

    >>> # batch.retrace(["models/"], out="new/", jobs=2,
    >>> #               callback=lambda rec, done, total: print(f"{done}/{total}", rec.path, rec.status))

    Raises:
        ValueError: see :func:`_check_writes`, and :func:`run`.
    """
    from mgtrace.cli import tasks
    opts = _check_writes(paths, out, in_place, run_options.get("pattern", "*.tmod"), inputs)
    return run(tasks.retrace_file, paths,
               options={**opts, "inputs": inputs, "rtol": rtol, "atol": atol,
                        **_device_option(device)},
               command="retrace", exclude=opts["out"], **run_options)
