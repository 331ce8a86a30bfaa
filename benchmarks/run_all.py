"""Run every benchmark in its short mode and print all their tables.

    python benchmarks/run_all.py            # short mode (a few minutes on 2 cores)
    python benchmarks/run_all.py --full     # each script's --full mode
    python benchmarks/run_all.py --only core,trace

Each script runs in its own process, one after the other (they time things,
so they must not overlap). A script that fails is reported and the rest
still run; the exit status is 1 if any failed. Not a test: nothing here is
asserted.
"""
import argparse
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
# name -> script, in the order of the layers (core, models, optimize, tracing, archive, batch)
SCRIPTS = {
    "core": "bench_core.py",
    "conv": "bench_conv.py",
    "models": "bench_models.py",
    "optimize": "bench_optimize.py",
    "trace": "bench_trace.py",
    "archive": "bench_archive.py",
    "batch": "bench_batch.py",
}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--full", action="store_true", help="pass --full to every script")
    ap.add_argument("--only", default="", help="comma-separated subset of: " + ", ".join(SCRIPTS))
    args = ap.parse_args()
    names = [n for n in args.only.split(",") if n] or list(SCRIPTS)
    unknown = [n for n in names if n not in SCRIPTS]
    if unknown:
        ap.error(f"unknown benchmark(s) {unknown}; choose from {list(SCRIPTS)}")
    failed = []
    for name in names:
        script = os.path.join(HERE, SCRIPTS[name])
        if not os.path.exists(script):
            print(f"== {name}: {SCRIPTS[name]} is missing, skipped\n")
            continue
        cmd = [sys.executable, script] + (["--full"] if args.full else [])
        print(f"== {name}: {' '.join(['python', 'benchmarks/' + SCRIPTS[name]] + cmd[2:])}", flush=True)
        t0 = time.perf_counter()
        rc = subprocess.call(cmd)
        print(f"== {name}: {'ok' if rc == 0 else f'FAILED (exit {rc})'} in {time.perf_counter() - t0:.0f} s\n",
              flush=True)
        if rc:
            failed.append(name)
    if failed:
        print("failed: " + ", ".join(failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
