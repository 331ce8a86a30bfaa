"""Timing of one callable, shared by the small kernel benchmarks."""
import time


def best_and_median_ms(f, n):
    """(best, median) milliseconds of ``n`` calls of ``f()`` after one
    untimed warm-up call. Wall clock: quote it beside a peer timed the
    same way in the same run."""
    import numpy as np
    f()
    ts = []
    for _ in range(n):
        t0 = time.perf_counter()
        f()
        ts.append((time.perf_counter() - t0) * 1e3)
    return min(ts), float(np.median(ts))
