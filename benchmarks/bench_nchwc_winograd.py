"""ResNet-18's 3x3 stride-1 layers in NCHW16c: ``F.conv2d_nchwc``'s
direct kernel against its Winograd F(2x2, 3x3) and F(4x4, 3x3), with NCHW
``F.conv2d_act`` (what an eager or unconverted conv runs) beside, hot and
cold (see bench_nchwc_layers), and the first call with a weight never
seen before (packing it: Winograd's U, DIRECT's or BLOCKED's blocks); then
ResNet-18 optimized, timed in alternation with the NCHWc Winograd off and
on (as the shapes pick).

    python benchmarks/bench_nchwc_winograd.py               # batch 1 and 8
    python benchmarks/bench_nchwc_winograd.py --batch 1 --full

Prints medians of the calls (layers, us; first calls: the median of 3
weights, ms) and the best of the rounds (model, ms). Not a test.
"""
import argparse
import time

import numpy as np

import _checkout

_checkout.use()     # this checkout if it is built in place, else the installed mgtrace
import mgtrace as mt  # noqa: E402
import mgtrace.functional as F  # noqa: E402
import mgtrace.models as models  # noqa: E402
from bench_nchwc_layers import median_us  # noqa: E402
from mgtrace._core import nn as _nn  # noqa: E402
from mgtrace.traced_module import optimize  # noqa: E402

LAYERS = [(64, 56), (128, 28), (256, 14), (512, 7)]   # (channels, H = W)


def first_call_ms(call, weights):
    """The median over ``weights`` (fresh tensors) of call(w)'s time, ms:
    each call packs its weight, as a model's first forward does."""
    times = []
    for w in weights:
        t0 = time.perf_counter()
        call(w)
        times.append(time.perf_counter() - t0)
    return float(np.median(times)) * 1e3


def layers(batch, calls, rng):
    heads = ("direct", "F2", "F4", "NCHW")
    print(f"{'batch':>5} {'layer':>8} | " + " ".join(f"{h + ' hot':>9}" for h in heads) + " | "
          + " ".join(f"{h + ' cold':>10}" for h in heads) + " | "
          + " ".join(f"{h + ' 1st':>9}" for h in heads) + " | picks")
    for c, hw in LAYERS:
        x = mt.tensor(rng.standard_normal((batch, c, hw, hw), dtype=np.float32))
        xb = F.to_nchwc(x)
        w = mt.tensor(rng.standard_normal((c, c, 3, 3), dtype=np.float32) * 0.05)
        b = mt.tensor(rng.standard_normal(c, dtype=np.float32))

        def blocked(winograd):
            def call(weight=w):
                before = _nn._set_nchwc_winograd(winograd)
                try:
                    return F.conv2d_nchwc(xb, weight, b, padding=1, act="relu")
                finally:
                    _nn._set_nchwc_winograd(before)
            return call

        fns = (blocked(False), blocked(2), blocked(4),
               lambda weight=w: F.conv2d_act(x, weight, b, padding=1, act="relu"))
        hot, cold = ([median_us(f, calls, c) for f in fns] for c in (False, True))
        fresh = [mt.tensor(rng.standard_normal((c, c, 3, 3), dtype=np.float32) * 0.05) for _ in range(3 * len(fns))]
        first = [first_call_ms(f, fresh[3 * i:3 * i + 3]) for i, f in enumerate(fns)]
        picks = _nn.conv2d_nchwc_algorithm((batch, c, hw, hw), (c, c, 3, 3), padding=1)
        print(f"{batch:>5} {f'{c}@{hw}':>8} | " + " ".join(f"{t:9.0f}" for t in hot) + " | "
              + " ".join(f"{t:10.0f}" for t in cold) + " | " + " ".join(f"{t:9.1f}" for t in first)
              + f" | {picks}")


def model(batch, rounds):
    x = mt.tensor(np.random.default_rng(0).standard_normal((batch, 3, 224, 224), dtype=np.float32))
    tm = mt.trace_module(models.resnet18().eval(), x)
    nets = {}
    for label, winograd in (("off", False), ("on", None)):
        before = _nn._set_nchwc_winograd(winograd)      # the layout pass asks conv2d_nchwc_algorithm
        try:
            nets[label] = (optimize(tm, "all"), winograd)
        finally:
            _nn._set_nchwc_winograd(before)
    times = {k: [] for k in nets}
    for _ in range(rounds):
        for label, (net, winograd) in nets.items():
            before = _nn._set_nchwc_winograd(winograd)
            try:
                net(x)
                t0 = time.perf_counter()
                net(x)
                times[label].append(time.perf_counter() - t0)
            finally:
                _nn._set_nchwc_winograd(before)
    off, on = (min(times[k]) * 1e3 for k in ("off", "on"))
    print(f"ResNet-18 batch {batch} optimized, best of {rounds}: NCHWc Winograd off {off:.2f} ms, "
          f"on {on:.2f} ms ({on / off:.2f})")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, action="append")
    ap.add_argument("--full", action="store_true", help="200 calls a cell and 40 model rounds")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    for batch in args.batch or [1, 8]:
        layers(batch, 200 if args.full else 20, rng)
        model(batch, (40 if args.full else 10) if batch == 1 else (12 if args.full else 4))


if __name__ == "__main__":
    main()
