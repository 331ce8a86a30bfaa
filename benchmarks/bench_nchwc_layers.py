"""MobileNetV2's expansion + depthwise layers in NCHW16c: the two
``F.conv2d_nchwc`` calls against one ``F.conv2d_nchwc_pw_dw`` (what the
FusePointwiseDepthwise pass makes of them), each with its data in the caches
("hot": the same call repeated) and out of them ("cold": 64 MiB written
between calls, as a model's other layers do to the caches).

    python benchmarks/bench_nchwc_layers.py                 # 1 and 2 threads
    python benchmarks/bench_nchwc_layers.py --threads 2 --full

Prints the median of the calls, in us. Not a test.
"""
import argparse
import time

import numpy as np

import _checkout

_checkout.use()     # this checkout if it is built in place, else the installed mgtrace
import mgtrace as mt  # noqa: E402
import mgtrace.functional as F  # noqa: E402

LAYERS = [  # (C, E, H = W, depthwise stride): MobileNetV2's blocks at 224x224
    (16, 96, 112, 2), (24, 144, 56, 1), (24, 144, 56, 2), (32, 192, 28, 1), (64, 384, 14, 1),
    (96, 576, 14, 1), (160, 960, 7, 1)]


def median_us(fn, calls, cold):
    junk = np.ones(16 << 20, np.float32)
    for _ in range(3):
        fn()
    times = []
    for _ in range(calls):
        if cold:
            junk += 1.0
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return np.median(times) * 1e6


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, action="append")
    ap.add_argument("--full", action="store_true", help="200 calls a cell instead of 40")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    calls = 200 if args.full else 40
    print(f"{'threads':>7} {'layer':>18} | {'pair hot':>9} {'fused hot':>9} | "
          f"{'pair cold':>9} {'fused cold':>10}")
    for threads in args.threads or [1, 2]:
        mt.set_num_threads(threads)
        for c, e, hw, s in LAYERS:
            x = F.to_nchwc(mt.tensor(rng.standard_normal((1, c, hw, hw), dtype=np.float32)))
            w1, b1, w2, b2 = (mt.tensor(rng.standard_normal(shape, dtype=np.float32))
                              for shape in ((e, c, 1, 1), (e,), (e, 1, 3, 3), (e,)))

            def pair():
                return F.conv2d_nchwc(F.conv2d_nchwc(x, w1, b1, act="relu6"), w2, b2, s, 1, 1, e, act="relu6")

            def fused():
                return F.conv2d_nchwc_pw_dw(x, w1, b1, w2, b2, s, 1, act="relu6", dw_act="relu6")

            cells = [median_us(f, calls, cold) for cold in (False, True) for f in (pair, fused)]
            print(f"{threads:>7} {f'{c}->{e}@{hw} s{s}':>18} | {cells[0]:9.0f} {cells[1]:9.0f} | "
                  f"{cells[2]:9.0f} {cells[3]:10.0f}")


if __name__ == "__main__":
    main()
