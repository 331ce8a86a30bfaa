"""Batch retrace and upgrade of many small archives: local pool (-j 1, -j 2) and Dask.

    python benchmarks/bench_batch.py             # short: 200 archives, one round (~1 min on 2 cores)
    python benchmarks/bench_batch.py --full      # 1000 archives, best of 3 rounds
    python benchmarks/bench_batch.py -n 500 --jobs 1 2 4 --json

What is timed: ``mgtrace.batch.retrace`` / ``mgtrace.batch.upgrade`` (what
``mgtrace retrace|upgrade DIR -o OUT -j N`` runs) over N copies-with-new-
weights of a small traced MLP (Linear 32-64-64-10 with ReLU and softmax;
about 30 KiB each, example inputs stored), into an empty output folder.
Every archive is loaded, checksummed, run, re-traced (retrace), saved to a
temporary file with fsync, reloaded, run again and compared, and renamed into
place, so this measures the whole per-file path, disk syncs included.

Rows:

* ``local -j N``: the process pool; ``-j 1`` runs in this process (no
  workers to start), ``-j N`` starts N spawned workers inside the time.
  ``speed-up`` is the -j 1 time over this row's. The pool's start-up (N
  workers importing mgtrace) is printed apart as well: on a few hundred
  small archives it is a good part of the total.
* ``dask threads``: ``dask=<address>`` of a ``LocalCluster(processes=False,
  n_workers=1, threads_per_worker=1)`` started beforehand (its start-up is
  printed apart); compare with ``local -j 1`` (the same single thread of
  work): ``overhead ms/file`` is the difference per archive, the cost of the
  Dask path itself (scheduling, futures, result transfer).
* ``dask 2 procs``: a ``LocalCluster(processes=True, n_workers=2)`` on the
  loopback, workers warmed up (mgtrace imported, one kernel thread) before
  the clock starts, compared with ``local -j 2`` (whose time includes its
  pool's start-up, so the overhead shown is net of that, and can be < 0).

``cpu s`` is the CPU time of this process and its pool workers (worker
start-up included; not measurable for Dask worker processes): when it stays
flat while ``total s`` does not drop with -j, the CPUs were busy with other
work (the load average is printed before and after).

Kernels run single-threaded everywhere (``set_num_threads(1)``, as in pool
workers) so that rows differ only in how files are spread. Each row's time
is the best over the rounds. Not a test: nothing is asserted here.
"""
import argparse
import json
import os
import shutil
import tempfile
import time

import numpy as np

import _checkout  # noqa: E402

_checkout.use()     # this checkout if it is built in place, else the installed mgtrace

import mgtrace as mt                       # noqa: E402
import mgtrace.functional as F             # noqa: E402
import mgtrace.module as M                 # noqa: E402
from mgtrace import batch                  # noqa: E402


class MLP(M.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2, self.fc3 = M.Linear(32, 64), M.Linear(64, 64), M.Linear(64, 10)
        self.act = M.ReLU()

    def forward(self, x):
        return F.softmax(self.fc3(self.act(self.fc2(self.act(self.fc1(x))))), axis=-1)


def make_archives(folder, n):
    rng = np.random.default_rng(0)
    net = MLP().eval()
    x = mt.tensor(rng.standard_normal((4, 32)).astype("float32"))
    for i in range(n):
        net.load_state_dict({k: mt.tensor(rng.standard_normal(v.shape).astype("float32") * 0.2)
                             for k, v in net.state_dict().items()})
        sub = os.path.join(folder, f"part{i % 4}")
        os.makedirs(sub, exist_ok=True)
        mt.save(mt.trace_module(net, x), os.path.join(sub, f"m{i:04d}.tmod"),
                example_inputs=(x,), metadata={"i": i})
    return sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(folder) for f in fs)


def _noop(path):
    return {"status": "ok", "reason": ""}


def _warm_worker():
    import mgtrace.cli.tasks  # noqa: F401
    mt.set_num_threads(1)


def pool_startup(work, jobs):
    """Seconds for a pool of ``jobs`` workers to start and run one no-op each."""
    d = os.path.join(work, "noop")
    os.makedirs(d, exist_ok=True)
    for i in range(jobs):
        open(os.path.join(d, f"{i}.tmod"), "w").close()
    t0 = time.perf_counter()
    batch.run(_noop, [d], jobs=jobs, progress=False)
    return time.perf_counter() - t0


def timed(fn, src, work, rounds):
    """Best wall time over ``rounds`` and the CPU time (this process and
    reaped workers) of that round."""
    best = (float("inf"), 0.0)
    for _ in range(rounds):
        out = os.path.join(work, "out")
        shutil.rmtree(out, ignore_errors=True)
        c0, t0 = os.times(), time.perf_counter()
        recs = fn([src], out=out, progress=False)
        t, c1 = time.perf_counter() - t0, os.times()
        cpu = (c1.user - c0.user) + (c1.system - c0.system) + \
              (c1.children_user - c0.children_user) + (c1.children_system - c0.children_system)
        best = min(best, (t, cpu))
        bad = [r for r in recs if r.status != "ok"]
        if bad:
            raise SystemExit(f"{len(bad)} files failed, e.g. {bad[0].path}: {bad[0].reason}")
    return best


def _load():
    try:
        return " / ".join(f"{x:.1f}" for x in os.getloadavg())
    except OSError:
        return "?"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--full", action="store_true", help="1000 archives, best of 3 rounds")
    ap.add_argument("-n", type=int, help="number of archives (default 200, --full 1000)")
    ap.add_argument("--rounds", type=int, help="rounds per row (default 1, --full 3)")
    ap.add_argument("--jobs", type=int, nargs="+", default=[1, 2], help="pool sizes (default 1 2)")
    ap.add_argument("--no-dask", action="store_true", help="skip the Dask rows")
    ap.add_argument("--json", action="store_true", help="also print the rows as JSON")
    a = ap.parse_args()
    n = a.n or (1000 if a.full else 200)
    rounds = a.rounds or (3 if a.full else 1)
    mt.set_num_threads(1)
    work = tempfile.mkdtemp(prefix="bench_batch-")
    rows = []
    try:
        src = os.path.join(work, "src")
        t0 = time.perf_counter()
        size = make_archives(src, n)
        print(f"{n} archives, {size / n / 1024:.1f} KiB each, made in {time.perf_counter() - t0:.1f} s; "
              f"{os.cpu_count()} CPUs, load average {_load()}; best of {rounds} round(s)\n")
        for job, fn in (("retrace", batch.retrace), ("upgrade", batch.upgrade)):
            for j in a.jobs:
                t, cpu = timed(lambda p, **kw: fn(p, jobs=j, **kw), src, work, rounds)
                rows.append({"job": job, "how": f"local -j {j}", "seconds": t, "cpu_s": cpu,
                             "jobs": j})
        clusters = []
        if not a.no_dask:
            try:
                from distributed import Client, LocalCluster
            except ImportError:
                print("(dask.distributed is not installed: no Dask rows)\n")
            else:
                import logging
                for label, kw, j in (("dask threads", {"processes": False}, 1),
                                     ("dask 2 procs", {"processes": True, "host": "127.0.0.1"}, 2)):
                    t0 = time.perf_counter()
                    cluster = LocalCluster(n_workers=j, threads_per_worker=1, dashboard_address=None,
                                           silence_logs=logging.ERROR, **kw)
                    with Client(cluster) as c:          # workers up, mgtrace imported
                        c.wait_for_workers(j)
                        if kw["processes"]:
                            c.run(_warm_worker)
                    start = time.perf_counter() - t0
                    clusters.append((label, start))
                    for job, fn in (("retrace", batch.retrace), ("upgrade", batch.upgrade)):
                        t, cpu = timed(lambda p, **kw: fn(p, dask=cluster.scheduler_address, **kw),
                                       src, work, rounds)
                        rows.append({"job": job, "how": label, "seconds": t, "jobs": j,
                                     "cpu_s": None if kw["processes"] else cpu,
                                     "cluster_start_s": start})
                    cluster.close()
        local = {(r["job"], r["jobs"]): r["seconds"] for r in rows if r["how"].startswith("local")}
        print(f"{'job':8} {'how':14} {'total s':>8} {'cpu s':>6} {'ms/file':>8} {'files/s':>8} "
              f"{'speed-up':>9} {'overhead ms/file':>17}")
        for r in rows:
            t = r["seconds"]
            one = local.get((r["job"], 1))
            r["ms_per_file"] = 1000 * t / n
            r["speedup_vs_j1"] = one / t if one else None
            ref = local.get((r["job"], r["jobs"])) if r["how"].startswith("dask") else None
            r["overhead_ms_per_file"] = 1000 * (t - ref) / n if ref else None
            cpu = f"{r['cpu_s']:6.2f}" if r.get("cpu_s") is not None else f"{'-':>6}"
            print(f"{r['job']:8} {r['how']:14} {t:8.2f} {cpu} {r['ms_per_file']:8.2f} {n / t:8.0f} "
                  + (f"{r['speedup_vs_j1']:8.2f}x" if one else f"{'':>9}")
                  + (f" {r['overhead_ms_per_file']:+16.2f}" if ref else ""))
        print()
        for j in a.jobs:
            if j > 1:
                print(f"local -j {j}: pool start-up {pool_startup(work, j):.2f} s (inside the times above)")
        for label, start in clusters:
            print(f"{label}: cluster start-up {start:.2f} s (not in the times above)")
        print(f"load average at the end: {_load()} (others' work on these CPUs slows -j N rows most)")
        if a.json:
            print(json.dumps(rows, indent=1))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
