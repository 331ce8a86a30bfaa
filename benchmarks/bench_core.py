"""mgtrace's tensor core next to NumPy (and PyTorch when installed).

Prints one table: per-op overhead (µs per call, lower is better), memory
bandwidth of elementwise ops and sum on 16M float32 (GB/s counting bytes read
and written, higher is better), sgemm and conv2d (GFLOP/s), the threads each
library used, and mgtrace's ratio to each reference (>1 means mgtrace is
better). Medians of several timed batches. Each library runs in its own
process: three thread pools in one process (mgtrace's OpenMP and OpenBLAS,
NumPy's OpenBLAS, PyTorch's OpenMP) spin against each other on few cores and
would make every column slower than it is on its own.

    python benchmarks/bench_core.py          # short run (about a minute)
    python benchmarks/bench_core.py --full   # more repeats, steadier medians
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np

import _checkout

_checkout.use()     # this checkout if it is built in place, else the installed mgtrace

N_BIG = 16 * 1024 * 1024
CONV_FLOPS = 2 * 8 * 64 * 56 * 56 * 64 * 9


def timeit(fn, min_time, repeats):
    """Median seconds per call over ``repeats`` batches of about min_time/5."""
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


def ops_for(lib):
    """The benchmarked operations of one library, as zero-argument callables
    built on identical data: {name: (unit, work, fn)}; result = work / time
    (or time in µs for overhead rows, work None)."""
    rng = np.random.default_rng(0)
    a1, a100 = np.ones(1, np.float32), np.ones(100, np.float32)
    i100 = np.ones(100, np.int32)
    a = rng.standard_normal(N_BIG).astype(np.float32)
    b = rng.standard_normal(N_BIG).astype(np.float32)
    small = np.clip(a, -5, 5)
    m256 = rng.standard_normal((256, 256)).astype(np.float32)
    m1024 = rng.standard_normal((1024, 1024)).astype(np.float32)
    cx = rng.standard_normal((8, 64, 56, 56)).astype(np.float32)
    cw = rng.standard_normal((64, 64, 3, 3)).astype(np.float32)
    # a conv with next to no arithmetic: what a call costs beside its kernel
    # (an optimized MobileNetV2 makes some 40 such calls a forward)
    qx = rng.standard_normal((1, 16, 2, 2)).astype(np.float32)
    qw = rng.standard_normal((16, 16, 1, 1)).astype(np.float32)
    qb = rng.standard_normal(16).astype(np.float32)
    if lib == "mgtrace":
        import mgtrace as mt
        from mgtrace._core import dispatch, nn
        T = mt.tensor
        relu, exp = dispatch.unary_ops["relu"], dispatch.unary_ops["exp"]
        t1, t100, ti, ta, tb, ts = T(a1), T(a100), T(i100), T(a), T(b), T(small)
        t256, t1024, tx, tw = T(m256), T(m1024), T(cx), T(cw)
        f = dict(add1=lambda: t1 + t1, add100=lambda: t100 + t100, scal=lambda: t100 + 1.0,
                 mixed=lambda: ti + t100, add=lambda: ta + tb, iadd=lambda: ta.__iadd__(tb),
                 relu=lambda: relu(ta), irelu=lambda: relu(ta, out=ta), exp=lambda: exp(ts),
                 iexp=lambda: exp(ts, out=ts), sum=lambda: ta.sum(), mm256=lambda: t256 @ t256,
                 mm1024=lambda: t1024 @ t1024, conv=lambda: nn.conv2d(tx, tw, padding=1))
        import mgtrace.functional as MF
        qxc, qwt, qbt = MF.to_nchwc(T(qx)), T(qw), T(qb)
        f["conv_call"] = lambda: MF.conv2d_nchwc(qxc, qwt, qbt, act="relu", residual=qxc)
    elif lib == "numpy":
        f = dict(add1=lambda: a1 + a1, add100=lambda: a100 + a100, scal=lambda: a100 + 1.0,
                 mixed=lambda: i100 + a100, add=lambda: a + b, iadd=lambda: np.add(a, b, out=a),
                 relu=lambda: np.maximum(a, 0), irelu=lambda: np.maximum(a, 0, out=a),
                 exp=lambda: np.exp(small), iexp=lambda: np.exp(small, out=small),
                 sum=lambda: a.sum(), mm256=lambda: m256 @ m256, mm1024=lambda: m1024 @ m1024)
    else:
        import torch
        F = torch.from_numpy
        t1, t100, ti, ta, tb, ts = F(a1), F(a100), F(i100), F(a), F(b), F(small)
        t256, t1024, tx, tw = F(m256), F(m1024), F(cx), F(cw)
        f = dict(add1=lambda: t1 + t1, add100=lambda: t100 + t100, scal=lambda: t100 + 1.0,
                 mixed=lambda: ti + t100, add=lambda: ta + tb, iadd=lambda: ta.add_(tb),
                 relu=lambda: torch.relu(ta), irelu=lambda: torch.relu_(ta), exp=lambda: torch.exp(ts),
                 iexp=lambda: ts.exp_(), sum=lambda: ta.sum(), mm256=lambda: t256 @ t256,
                 mm1024=lambda: t1024 @ t1024,
                 conv=lambda: torch.nn.functional.conv2d(tx, tw, padding=1))
        qxt, qwt, qbt = F(qx), F(qw), F(qb)
        f["conv_call"] = lambda: torch.relu(torch.nn.functional.conv2d(qxt, qwt, qbt) + qxt)
    return f


# name, key, unit, work (None: µs per call, lower is better)
ROWS = [
    ("a+b, 1 float32", "add1", "us", None),
    ("a+b, 100 float32", "add100", "us", None),
    ("a+1.0, 100 float32", "scal", "us", None),
    ("int32+float32, 100", "mixed", "us", None),
    ("add 16M (out-of-place)", "add", "GB/s", 12 * N_BIG),
    ("add 16M (in-place)", "iadd", "GB/s", 12 * N_BIG),
    ("relu 16M (out-of-place)", "relu", "GB/s", 8 * N_BIG),
    ("relu 16M (in-place)", "irelu", "GB/s", 8 * N_BIG),
    ("exp 16M (out-of-place)", "exp", "GB/s", 8 * N_BIG),
    # repeated in place, values run to inf for every library alike
    ("exp 16M (in-place)", "iexp", "GB/s", 8 * N_BIG),
    ("sum 16M", "sum", "GB/s", 4 * N_BIG),
    ("sgemm 256", "mm256", "GFLOP/s", 2 * 256 ** 3),
    ("sgemm 1024", "mm1024", "GFLOP/s", 2 * 1024 ** 3),
    ("conv2d 8x64x56x56 3x3 p1", "conv", "GFLOP/s", CONV_FLOPS),
    # mgtrace: one F.conv2d_nchwc (bias, residual, relu in the kernel); torch: conv2d, +, relu
    ("conv 1x1+res+relu, 16ch 2x2", "conv_call", "us", None),
]


def threads(lib):
    if lib == "mgtrace":
        import mgtrace as mt
        from mgtrace._core import linalg
        return f"{mt.get_num_threads()} kernel / {linalg.get_blas_threads()} BLAS"
    if lib == "torch":
        import torch
        return f"{torch.get_num_threads()} intra-op"
    try:
        from threadpoolctl import threadpool_info
        blas = [p for p in threadpool_info() if p.get("user_api") == "blas"]
        return f"{blas[0]['num_threads']} BLAS" if blas else "1"
    except ImportError:
        return "? (pip install threadpoolctl)"


def worker(lib, min_time, repeats, nthreads):
    if nthreads:
        if lib == "mgtrace":
            import mgtrace as mt
            mt.set_num_threads(nthreads)
        elif lib == "torch":
            import torch
            torch.set_num_threads(nthreads)
    fns = ops_for(lib)
    out = {"threads": threads(lib)}
    for _, key, unit, work in ROWS:
        if key in fns:
            sec = timeit(fns[key], min_time, repeats)
            out[key] = sec * 1e6 if work is None else work / sec / 1e9
    print(json.dumps(out))


def run_worker(lib, args):
    cmd = [sys.executable, __file__, "--worker", lib, "--threads", str(args.threads)]
    if args.full:
        cmd.append("--full")
    proc = subprocess.run(cmd, capture_output=True, text=True, env=os.environ.copy())
    if proc.returncode:
        print(f"{lib}: failed\n{proc.stderr[-2000:]}", file=sys.stderr)
        return None
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--full", action="store_true", help="more repeats (steadier, slower)")
    p.add_argument("--threads", type=int, default=0, help="threads for every library (default: theirs)")
    p.add_argument("--worker", choices=["mgtrace", "numpy", "torch"], help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    min_time, repeats = (1.0, 9) if args.full else (0.3, 5)
    if args.worker:
        worker(args.worker, min_time, repeats, args.threads)
        return
    try:
        import torch  # noqa: F401
        libs = ["mgtrace", "numpy", "torch"]
    except ImportError:
        libs = ["mgtrace", "numpy"]
        print("torch: not installed (pip install torch for the third column)")
    res = {lib: run_worker(lib, args) for lib in libs}
    for lib in libs:
        if res[lib]:
            print(f"{lib:>8} threads: {res[lib]['threads']}")
    head = f"{'benchmark':<28}{'unit':>8}{'mgtrace':>10}{'numpy':>10}{'torch':>10}{'vs numpy':>10}{'vs torch':>10}"
    print()
    print(head)
    print("-" * len(head))
    fmt = lambda v: "-" if v is None else (f"{v:.3g}" if v < 1000 else f"{v:.0f}")
    for name, key, unit, work in ROWS:
        vals = {lib: (res.get(lib) or {}).get(key) for lib in ("mgtrace", "numpy", "torch")}
        m = vals["mgtrace"]

        def ratio(ref):
            if ref is None or m is None:
                return "-"
            return f"{(ref / m if work is None else m / ref):.2f}x"
        print(f"{name:<28}{unit:>8}{fmt(m):>10}{fmt(vals['numpy']):>10}{fmt(vals['torch']):>10}"
              f"{ratio(vals['numpy']):>10}{ratio(vals['torch']):>10}")
    print("\nratios: >1 means mgtrace is better (faster, or more GB/s / GFLOP/s)")


if __name__ == "__main__":
    main()
