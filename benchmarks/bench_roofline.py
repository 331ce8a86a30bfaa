"""How fast each bench_optimize.py row could run at all on this machine:
its multiply-adds against the GEMM rate the machine's BLAS reaches.

    python benchmarks/bench_roofline.py                   # 2 threads, every row
    python benchmarks/bench_roofline.py --threads 1 --only minilm
    python benchmarks/bench_roofline.py --ort 136.0       # MiniLM's ORT p50, ms

Per row: the forward's floating-point operations (2 per multiply-add, as
``torch.utils.flop_counter.FlopCounterMode`` counts them on the torch.nn
model bench_optimize.py times: convolutions, matrix products and
attention; elementwise work, normalisation and softmax count zero), and
the floor: those operations at the measured GEMM ceiling, i.e. the time of
the forward if every multiply-add ran inside the best large float32 GEMM
this machine's OpenBLAS does (NumPy's, 2048 x 2048 x 2048, best of a few,
at ``--threads``) and everything else were free. Then the same at the
row's own GEMM shapes where Linear layers hold most of its operations
(MiniLM: M = batch x tokens), timed on one thread and divided by
``--threads`` (a perfect split: NumPy's BLAS threads these shapes badly).
Convolutions can go below the floor (Winograd trades multiplies for
additions: mgtrace's 3x3 convs and ONNX Runtime's do); matrix products
cannot.

``--ort MS`` (one value per row, comma-separated, in the order printed;
e.g. ONNX Runtime's p50 from bench_optimize.py's run) adds the target of
issue 34 for that row, 0.8 x MS, and the share of the GEMM ceiling a
forward would need to reach it: above 100% no fp32 implementation of the
same arithmetic can.

The ceiling is OpenBLAS's, not the silicon's: a hand loop of independent
zmm FMAs runs ~10% above it on Zen 4 (one a cycle), and 42% above it on
the 2-core Intel Xeon of 2026-12-07 (two a cycle: 243 GFLOP/s a core
against OpenBLAS's 171 at 1024^3). Not a test:
nothing is asserted.
"""
import argparse
import os
import time

import bench_optimize as bo


def gemm_rate(threads, m=2048, k=2048, n=2048, repeats=5):
    """Best float32 GEMM rate, GFLOP/s, of NumPy's BLAS at ``threads``."""
    import numpy as np
    from threadpoolctl import threadpool_limits
    rng = np.random.default_rng(0)
    a = rng.standard_normal((m, k), dtype=np.float32)
    b = rng.standard_normal((k, n), dtype=np.float32)
    c = np.empty((m, n), np.float32)
    best = float("inf")
    with threadpool_limits(threads, user_api="blas"):
        np.matmul(a, b, out=c)
        for _ in range(repeats):
            t = time.perf_counter()
            np.matmul(a, b, out=c)
            best = min(best, time.perf_counter() - t)
    return 2.0 * m * k * n / best / 1e9


def row_flops(model, batch, shape):
    """(total FLOPs, {(M, K, N): FLOPs of the Linear GEMMs of that shape})
    of one forward of the row's torch.nn model."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode
    net = bo._torch_net(torch, model).eval()
    xs = [torch.from_numpy(a) for a in bo._inputs(model, batch, shape)]
    shapes = {}

    def hook(mod, args, out):
        x = args[0]
        key = (x.numel() // x.shape[-1], mod.in_features, mod.out_features)
        shapes[key] = shapes.get(key, 0) + 2 * key[0] * key[1] * key[2]
    handles = [m.register_forward_hook(hook) for m in net.modules()
               if isinstance(m, torch.nn.Linear)]
    counter = FlopCounterMode(display=False)
    with torch.inference_mode(), counter:
        net(*xs)
    for h in handles:
        h.remove()
    return counter.get_total_flops(), shapes


def shape_rate(shapes, threads, repeats=5):
    """Time, ms, of ``shapes``' GEMMs at their own sizes (NumPy's BLAS,
    best of ``repeats`` per shape, times how often the forward runs it)."""
    import numpy as np
    from threadpoolctl import threadpool_limits
    rng = np.random.default_rng(0)
    total = 0.0
    with threadpool_limits(threads, user_api="blas"):
        for (m, k, n), flops in shapes.items():
            a = rng.standard_normal((m, k), dtype=np.float32)
            b = rng.standard_normal((k, n), dtype=np.float32)
            c = np.empty((m, n), np.float32)
            np.matmul(a, b, out=c)
            best = float("inf")
            for _ in range(repeats):
                t = time.perf_counter()
                np.matmul(a, b, out=c)
                best = min(best, time.perf_counter() - t)
            total += best * flops / (2.0 * m * k * n)
    return total * 1e3


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--only", default="", help="rows by model or label, comma-separated")
    ap.add_argument("--ort", default="", help="ONNX Runtime p50 ms per printed row, comma-separated")
    a = ap.parse_args()
    if a.threads < 1:
        ap.error("--threads must be at least 1")
    wanted = [w.strip() for w in a.only.split(",") if w.strip()]
    cases = [c for c in bo.CASES if not wanted or c[0] in wanted or c[1] in wanted]
    if not cases:
        ap.error(f"--only {a.only!r} names no row")
    try:
        ort = [float(v) for v in a.ort.split(",") if v.strip()]
    except ValueError:
        ap.error(f"--ort takes milliseconds separated by commas, got {a.ort!r}")
    if ort and len(ort) != len(cases):
        ap.error(f"--ort has {len(ort)} values for {len(cases)} rows")
    rate = gemm_rate(a.threads)
    print(f"# threads {a.threads}; GEMM ceiling (NumPy's BLAS, 2048^3 float32, best of 5) "
          f"{rate:.1f} GFLOP/s; load average {os.getloadavg()[0]:.2f}")
    head = f"{'row':16s} {'GFLOP':>7s} {'floor ms':>9s} {'GEMMs ms':>9s}"
    if ort:
        head += f" {'ORT p50':>8s} {'0.8x':>7s} {'needs':>7s}"
    print(head)
    print("-" * len(head))
    for i, (label, model, batch, shape) in enumerate(cases):
        flops, shapes = row_flops(model, batch, shape)
        floor = flops / rate / 1e6
        line = f"{label:16s} {flops / 1e9:7.2f} {floor:9.1f}"
        mostly_linear = sum(shapes.values()) >= flops / 2     # (a CNN's classifier: no)
        # one thread's rate over the threads: NumPy's BLAS splits a 1024-row
        # product over 2 threads poorly (slower than the whole forward of a plan)
        line += f" {shape_rate(shapes, 1) / a.threads:9.1f}" if mostly_linear else f" {'-':>9s}"
        if ort:
            target = 0.8 * ort[i]
            line += f" {ort[i]:8.1f} {target:7.1f} {100 * floor / target:6.0f}%"
        print(line, flush=True)
    print("# floor: the FLOPs at the GEMM ceiling; GEMMs ms: the row's Linear layers alone at "
          "their own shapes (rows mostly Linear); needs: the share of the ceiling a forward must sustain for 0.8x ORT")


if __name__ == "__main__":
    main()
