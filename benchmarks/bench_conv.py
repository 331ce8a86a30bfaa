"""conv2d speed, side by side: mgtrace against PyTorch (when importable),
else against a NumPy im2col + matmul reference.

    python benchmarks/bench_conv.py            # the headline shape, a few repeats
    python benchmarks/bench_conv.py --full     # more repeats and more shapes
    python benchmarks/bench_conv.py --threads 1
    python benchmarks/bench_conv.py --mobilenet   # MobileNetV2's batch-1 layers instead

GFLOP/s counts 2 * N * O * OH * OW * (C / groups) * KH * KW, the direct
convolution's multiply-adds, whatever algorithm runs. Times are the best of
the repeats (each repeat averages several calls; the two libraries take
turns). Not a test: nothing is asserted here.
"""
import argparse
import time

import numpy as np

import _checkout

_checkout.use()     # this checkout if it is built in place, else the installed mgtrace
import mgtrace._core  # noqa: E402,F401  (loads OpenBLAS first)
from mgtrace._core import nn
from mgtrace._core.dispatch import get_num_threads, set_num_threads
from mgtrace._core.tensor import tensor

try:
    import torch
except ImportError:
    torch = None

HEADLINE = (8, 64, 56, 56, 64, 3, 1, 1, 1)
# (N, C, H, W, O, K, stride, padding, groups): ResNet-18 / MobileNetV2 layers
MORE = [
    (8, 3, 224, 224, 64, 7, 2, 3, 1),      # ResNet stem
    (8, 128, 28, 28, 128, 3, 1, 1, 1),
    (8, 64, 56, 56, 128, 3, 2, 1, 1),      # strided 3x3
    (8, 256, 14, 14, 512, 1, 2, 0, 1),     # 1x1 downsample
    (8, 256, 14, 14, 256, 1, 1, 0, 1),     # 1x1
    (8, 144, 56, 56, 144, 3, 1, 1, 144),   # depthwise
    (8, 256, 14, 14, 256, 3, 1, 1, 1),     # Winograd, tiles spanning images
    (8, 256, 14, 14, 512, 3, 2, 1, 1),     # strided 3x3 on a small plane (IM2COL)
    (8, 512, 7, 7, 512, 3, 1, 1, 1),
    (1, 512, 7, 7, 512, 3, 1, 1, 1),       # batch 1: IM2COL, N = 49
]
# MobileNetV2 at batch 1: the stem, depthwise convs from 112x112 to 7x7 planes,
# 1x1 convs with few input channels on large planes and many on small ones
MOBILENET = [
    (1, 3, 224, 224, 32, 3, 2, 1, 1),        # stem (IM2COL, K = 27)
    (1, 32, 112, 112, 32, 3, 1, 1, 32),
    (1, 32, 112, 112, 16, 1, 1, 0, 1),
    (1, 16, 112, 112, 96, 1, 1, 0, 1),       # 1x1, K = 16
    (1, 96, 112, 112, 96, 3, 2, 1, 96),
    (1, 24, 56, 56, 144, 1, 1, 0, 1),        # 1x1, K = 24
    (1, 144, 56, 56, 144, 3, 1, 1, 144),
    (1, 144, 56, 56, 24, 1, 1, 0, 1),
    (1, 192, 28, 28, 192, 3, 1, 1, 192),
    (1, 384, 14, 14, 384, 3, 1, 1, 384),
    (1, 576, 14, 14, 576, 3, 2, 1, 576),
    (1, 960, 7, 7, 960, 3, 1, 1, 960),       # 7x7 depthwise
    (1, 160, 7, 7, 960, 1, 1, 0, 1),
    (1, 320, 7, 7, 1280, 1, 1, 0, 1),
]


def flops(n, c, h, w, o, k, s, p, g):
    oh = (h + 2 * p - k) // s + 1
    ow = (w + 2 * p - k) // s + 1
    return 2.0 * n * o * oh * ow * (c // g) * k * k


def best_times(fns, repeats, inner):
    """Best per-call time of each fn. The fns take turns, so a burst of load
    from elsewhere on the machine hits them alike; each turn starts after a
    pause (the other library's OpenMP workers spin for milliseconds after
    their last region and would steal a core) and one untimed call."""
    for fn in fns:
        for _ in range(5):  # warm up: allocator caches, JIT-compiled kernels
            fn()
    best = [float("inf")] * len(fns)
    for _ in range(repeats):
        for i, fn in enumerate(fns):
            time.sleep(0.05)
            fn()
            t0 = time.perf_counter()
            for _ in range(inner):
                fn()
            best[i] = min(best[i], (time.perf_counter() - t0) / inner)
    return best


def numpy_conv(x, w, s, p):
    """im2col with stride tricks, then one matmul (groups = 1)."""
    n, c, h, wd = x.shape
    o, _, k, _ = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (p, p), (p, p)))
    oh, ow = (h + 2 * p - k) // s + 1, (wd + 2 * p - k) // s + 1
    st = xp.strides
    cols = np.lib.stride_tricks.as_strided(
        xp, (n, c, k, k, oh, ow), (st[0], st[1], st[2], st[3], st[2] * s, st[3] * s))
    cols = np.ascontiguousarray(cols).reshape(n, c * k * k, oh * ow)
    return (w.reshape(o, -1) @ cols).reshape(n, o, oh, ow)


def run(shape, repeats, inner, threads):
    n, c, h, w, o, k, s, p, g = shape
    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, c, h, w), dtype=np.float32)
    wt = rng.standard_normal((o, c // g, k, k), dtype=np.float32)
    b = rng.standard_normal(o, dtype=np.float32)
    tx, tw, tb = tensor(x), tensor(wt), tensor(b)
    fl = flops(*shape)
    algo = nn.conv2d_algorithm(x.shape, wt.shape, s, p, 1, g)
    fns = [lambda: nn.conv2d(tx, tw, tb, s, p, 1, g)]
    if torch is not None:
        torch.set_num_threads(threads)
        px, pw, pb = torch.from_numpy(x), torch.from_numpy(wt), torch.from_numpy(b)

        def ref():
            with torch.no_grad():
                return torch.nn.functional.conv2d(px, pw, pb, s, p, 1, g)
        fns.append(ref)
        name = "torch"
    elif g == 1:
        fns.append(lambda: numpy_conv(x, wt, s, p))
        name = "numpy"
    times = best_times(fns, repeats, inner)
    t_mt = times[0]
    line = f"{str(shape):40s} {algo:9s} mgtrace {t_mt * 1e3:8.2f} ms {fl / t_mt / 1e9:7.1f} GFLOP/s"
    if len(times) == 1:
        print(line)
        return
    t_ref = times[1]
    print(f"{line} | {name} {t_ref * 1e3:8.2f} ms {fl / t_ref / 1e9:7.1f} GFLOP/s | ratio {t_ref / t_mt:.2f}x")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--full", action="store_true", help="more repeats and the extra shapes")
    ap.add_argument("--threads", type=int, default=0, help="thread budget (default: mgtrace's)")
    ap.add_argument("--mobilenet", action="store_true", help="MobileNetV2's batch-1 layers")
    args = ap.parse_args()
    if args.threads:
        try:
            set_num_threads(args.threads)
        except ImportError:  # the BLAS half lives in mgtrace._core.linalg; kernels are set already
            pass
    threads = get_num_threads()
    print(f"threads {threads}; reference: {'PyTorch ' + torch.__version__ if torch else 'NumPy im2col+matmul'}")
    repeats, inner = (15, 5) if args.full else (5, 3)
    shapes = MOBILENET if args.mobilenet else [HEADLINE] + (MORE if args.full else [])
    for shape in shapes:
        run(shape, repeats, inner, threads)


if __name__ == "__main__":
    main()
