"""A/B of one optimize() pass: a model optimized with every pass ("all"
without the CPU condition) against the same without PASS, timed in
alternation in one process, so that both see the same machine (this one's
timings move 20-50% between runs, more than most passes change).

    python benchmarks/ab_passes.py                          # NCHWc on MobileNetV2 and ResNet-18, batch 1
    python benchmarks/ab_passes.py --pass NCHWc --model resnet18 --batch 8
    python benchmarks/ab_passes.py --full                   # more rounds

Prints the median and best of the rounds, in ms. Not a test.
"""
import argparse
import time

import numpy as np

import _checkout

_checkout.use()     # this checkout if it is built in place, else the installed mgtrace
import mgtrace as mt  # noqa: E402
import mgtrace.models as models  # noqa: E402
from mgtrace.traced_module import optimize  # noqa: E402
from mgtrace.traced_module.passes import manager  # noqa: E402


def run(model, batch, name, rounds, threads):
    mt.set_num_threads(threads)
    x = mt.tensor(np.random.default_rng(0).standard_normal((batch, 3, 224, 224), dtype=np.float32))
    tm = mt.trace_module(getattr(models, model)().eval(), x)
    every = list(manager._ORDER)
    nets = {"with": optimize(tm, every, flatten=True),
            "without": optimize(tm, [p for p in every if p != name], flatten=True)}
    times = {k: [] for k in nets}
    for net in nets.values():
        for _ in range(3):
            net(x)
    for _ in range(rounds):
        for k, net in nets.items():
            t0 = time.perf_counter()
            net(x)
            times[k].append(time.perf_counter() - t0)
    w, wo = (np.array(times[k]) * 1e3 for k in ("with", "without"))
    print(f"{model} batch {batch}: with {name} {np.median(w):.2f} (best {w.min():.2f}), "
          f"without {np.median(wo):.2f} (best {wo.min():.2f}); ratio {np.median(w) / np.median(wo):.2f}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pass", dest="name", default="NCHWc", choices=list(manager._ORDER))
    ap.add_argument("--model", choices=["mobilenet_v2", "resnet18"], action="append")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--full", action="store_true", help="40 rounds instead of 10")
    args = ap.parse_args()
    for model in args.model or ["mobilenet_v2", "resnet18"]:
        run(model, args.batch, args.name, 40 if args.full else 10, args.threads)


if __name__ == "__main__":
    main()
