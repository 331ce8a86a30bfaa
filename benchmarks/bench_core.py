"""mgtrace's tensor core next to NumPy (and PyTorch when installed).

Prints one table: per-op overhead (µs per call, lower is better), memory
bandwidth of elementwise ops and sum on 16M float32 (GB/s counting bytes read
and written, higher is better), sgemm and conv2d (GFLOP/s), the threads each
library used, and mgtrace's ratio to each reference (>1 means mgtrace is
better). Medians of several timed batches.

    python benchmarks/bench_core.py          # short run (about a minute)
    python benchmarks/bench_core.py --full   # more repeats, steadier medians
"""
import argparse
import statistics
import sys
import time

import numpy as np

import mgtrace as mt
from mgtrace._core import dispatch, linalg

try:
    import torch
except ImportError:
    torch = None

try:
    from threadpoolctl import threadpool_info
except ImportError:
    threadpool_info = None


def timeit(fn, min_time, repeats):
    """Median seconds per call over ``repeats`` batches of at least min_time."""
    fn()
    n = 1
    while True:
        t = time.perf_counter()
        for _ in range(n):
            fn()
        dt = time.perf_counter() - t
        if dt >= min_time / 5:
            break
        n *= 4
    n = max(1, int(n * (min_time / 5) / max(dt, 1e-9)))
    samples = []
    for _ in range(repeats):
        t = time.perf_counter()
        for _ in range(n):
            fn()
        samples.append((time.perf_counter() - t) / n)
    return statistics.median(samples)


def numpy_threads():
    if threadpool_info is None:
        return "?"
    blas = [p for p in threadpool_info() if p.get("user_api") == "blas"]
    return blas[0]["num_threads"] if blas else 1


class Table:
    def __init__(self):
        self.rows = []

    def add(self, name, unit, higher_better, mgt, ref_np, ref_torch):
        self.rows.append((name, unit, higher_better, mgt, ref_np, ref_torch))

    def show(self):
        head = f"{'benchmark':<34}{'unit':>8}{'mgtrace':>11}{'numpy':>11}{'torch':>11}{'vs np':>8}{'vs torch':>9}"
        print(head)
        print("-" * len(head))
        for name, unit, hb, m, n, t in self.rows:
            def ratio(ref):
                if ref is None or m is None:
                    return "-"
                return f"{(m / ref if hb else ref / m):.2f}x"
            fmt = lambda v: "-" if v is None else (f"{v:.3g}" if v < 1000 else f"{v:.0f}")
            print(f"{name:<34}{unit:>8}{fmt(m):>11}{fmt(n):>11}{fmt(t):>11}{ratio(n):>8}{ratio(t):>9}")


def overhead(table, args):
    for n in (1, 100):
        a = np.ones(n, np.float32)
        ta = mt.tensor(a)
        tt = torch.from_numpy(a.copy()) if torch else None
        us = lambda f: timeit(f, args.min_time, args.repeats) * 1e6
        table.add(f"a+b, {n} float32", "us", False, us(lambda: ta + ta), us(lambda: a + a),
                  us(lambda: tt + tt) if torch else None)
        if n == 100:
            table.add(f"a+1.0, {n} float32", "us", False, us(lambda: ta + 1.0), us(lambda: a + 1.0),
                      us(lambda: tt + 1.0) if torch else None)
            ai = np.ones(n, np.int32)
            tai = mt.tensor(ai)
            ti = torch.from_numpy(ai.copy()) if torch else None
            table.add(f"int32+float32, {n}", "us", False, us(lambda: tai + ta), us(lambda: ai + a),
                      us(lambda: ti + tt) if torch else None)


def bandwidth(table, args):
    n = 16 * 1024 * 1024
    rng = np.random.default_rng(0)
    a = rng.standard_normal(n).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    ta, tb = mt.tensor(a), mt.tensor(b)
    tt, tt2 = (torch.from_numpy(a.copy()), torch.from_numpy(b.copy())) if torch else (None, None)
    gbs = lambda f, nbytes: nbytes / timeit(f, args.min_time, args.repeats) / 1e9
    relu, exp = dispatch.unary_ops["relu"], dispatch.unary_ops["exp"]
    small = np.clip(a, -5, 5)
    ts = mt.tensor(small)
    ttsmall = torch.from_numpy(small.copy()) if torch else None
    cases = [
        ("add 16M (out-of-place)", 12 * n, lambda: ta + tb, lambda: a + b, (lambda: tt + tt2) if torch else None),
        ("add 16M (in-place)", 12 * n, lambda: ta.__iadd__(tb), lambda: np.add(a, b, out=a),
         (lambda: tt.add_(tt2)) if torch else None),
        ("relu 16M (out-of-place)", 8 * n, lambda: relu(ta), lambda: np.maximum(a, 0),
         (lambda: torch.relu(tt)) if torch else None),
        ("relu 16M (in-place)", 8 * n, lambda: relu(ta, out=ta), lambda: np.maximum(a, 0, out=a),
         (lambda: torch.relu_(tt)) if torch else None),
        ("exp 16M (out-of-place)", 8 * n, lambda: exp(ts), lambda: np.exp(small),
         (lambda: torch.exp(ttsmall)) if torch else None),
        # repeated in place, values run to inf for every library alike
        ("exp 16M (in-place)", 8 * n, lambda: exp(ts, out=ts), lambda: np.exp(small, out=small),
         (lambda: ttsmall.exp_()) if torch else None),
        ("sum 16M", 4 * n, lambda: ta.sum(), lambda: a.sum(), (lambda: tt.sum()) if torch else None),
    ]
    for name, nbytes, fm, fn, ft in cases:
        try:
            m = gbs(fm, nbytes)
        except (KeyError, AttributeError, NotImplementedError) as e:
            print(f"  ({name}: mgtrace op missing: {e})", file=sys.stderr)
            m = None
        table.add(name, "GB/s", True, m, gbs(fn, nbytes), gbs(ft, nbytes) if ft else None)


def compute(table, args):
    rng = np.random.default_rng(0)
    for n in (256, 1024):
        a = rng.standard_normal((n, n)).astype(np.float32)
        ta = mt.tensor(a)
        tt = torch.from_numpy(a.copy()) if torch else None
        gf = lambda f: 2 * n ** 3 / timeit(f, args.min_time, args.repeats) / 1e9
        table.add(f"sgemm {n}", "GFLOP/s", True, gf(lambda: ta @ ta), gf(lambda: a @ a),
                  gf(lambda: tt @ tt) if torch else None)
    x = rng.standard_normal((8, 64, 56, 56)).astype(np.float32)
    w = rng.standard_normal((64, 64, 3, 3)).astype(np.float32)
    flops = 2 * 8 * 64 * 56 * 56 * 64 * 9
    gf = lambda f: flops / timeit(f, args.min_time, args.repeats) / 1e9
    try:
        from mgtrace._core import nn
        tx, tw = mt.tensor(x), mt.tensor(w)
        m = gf(lambda: nn.conv2d(tx, tw, padding=1))
    except ImportError:
        m = None
    t = None
    if torch:
        xx, ww = torch.from_numpy(x), torch.from_numpy(w)
        t = gf(lambda: torch.nn.functional.conv2d(xx, ww, padding=1))
    table.add("conv2d 8x64x56x56 3x3 p1", "GFLOP/s", True, m, None, t)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--full", action="store_true", help="more repeats (steadier, slower)")
    p.add_argument("--threads", type=int, default=0, help="threads for every library (default: theirs)")
    args = p.parse_args(argv)
    args.min_time, args.repeats = (1.0, 9) if args.full else (0.25, 5)
    if args.threads:
        mt.set_num_threads(args.threads)
        if torch:
            torch.set_num_threads(args.threads)
    print(f"mgtrace {mt.__version__}: {mt.get_num_threads()} kernel threads, "
          f"{linalg.get_blas_threads()} BLAS threads ({linalg.blas_config()})")
    print(f"numpy {np.__version__}: {numpy_threads()} BLAS threads")
    if torch:
        print(f"torch {torch.__version__}: {torch.get_num_threads()} threads")
    else:
        print("torch: not installed (pip install torch for the third column)")
    table = Table()
    overhead(table, args)
    bandwidth(table, args)
    compute(table, args)
    print()
    table.show()


if __name__ == "__main__":
    main()
