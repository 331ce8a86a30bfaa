"""MiniLM's GEMM shapes at two threads: mgtrace's split beside OpenBLAS's own threading.

    OPENBLAS_NUM_THREADS=2 python benchmarks/bench_gemm_threads.py [--calls 40]

mgtrace runs a large product as one single-threaded OpenBLAS GEMM per thread
over a block of C's rows (kernels/cpu/gemm.c, gemm_split: the threads meet
once, at the end); NumPy's matmul lets its OpenBLAS thread the one product
(its threads meet at every K panel). The shapes are MiniLM 8 x 128's linear
layers (M = 1024 tokens; K, N = 384 / 1536). Calls of the two alternate, so
both see the same load; printed per shape: wall ms best / p50 / p90, and the
load average. NumPy's OpenBLAS is its own build (version and kernels
printed by ``numpy.show_config()``), so compare medians and tails, not
the best call's kernel speed.
"""
import argparse
import os
import time

import _checkout

_checkout.use()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=40)
    args = ap.parse_args()
    import numpy as np
    import mgtrace as mt
    import mgtrace.functional as F
    mt.set_num_threads(2)
    rng = np.random.default_rng(0)
    print(f"# load average before: {os.getloadavg()[0]:.2f}")
    for m, k, n in ((1024, 384, 384), (1024, 384, 1536), (1024, 1536, 384)):
        a = rng.standard_normal((m, k)).astype(np.float32)
        b = rng.standard_normal((n, k)).astype(np.float32)
        ta, tb, bt = mt.tensor(a), mt.tensor(b).transpose(1, 0), b.T
        runs = {"mgtrace split": lambda: F.matmul(ta, tb), "numpy (OpenBLAS threads)": lambda: a @ bt}
        times = {name: [] for name in runs}
        for _ in range(3):
            for f in runs.values():
                f()
        for _ in range(args.calls):
            for name, f in runs.items():
                t = time.perf_counter()
                f()
                times[name].append((time.perf_counter() - t) * 1e3)
        for name, v in times.items():
            v.sort()
            print(f"M={m} K={k} N={n}  {name:26s} {v[0]:7.2f} / {v[len(v) // 2]:7.2f} / "
                  f"{v[min(len(v) - 1, int(len(v) * 0.9))]:7.2f} ms")
    print(f"# load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
