"""conv2d algorithms inside a model: each layer's time, and an interleaved
A/B of AUTO's pick against forced algorithms.

    python benchmarks/conv_in_model.py resnet18 1                 # per-layer times, AUTO's picks
    python benchmarks/conv_in_model.py resnet18 1 --force '512x7->512k3s1g1=winograd'
    python benchmarks/conv_in_model.py mobilenet_v2 1 --force '...' --rounds 30

The model (``mgtrace.models``, random weights, 224x224 input) is traced and
``optimize(..., "all", flatten=True)``-ed as bench_optimize runs it. A layer
is named ``CxH->OkKsSgG`` (input channels x plane, output channels, kernel,
stride, groups); layers of one name are timed together. With ``--force``
every round runs the model twice, once with AUTO's picks (A) and once with
the forced algorithms (B), so the two see the same machine: a layer's B/A
below 1 means the forced algorithm was faster in the model, with its
neighbours' effect on the caches, which standalone timings miss (DIRECT and
BLOCKED measured 1.2-1.3x faster alone than inside ResNet-18). AUTO's rules
in kernels/conv.c were set this way. Medians of the rounds; not a test.
"""
import argparse
import collections
import time

import numpy as np

import _checkout

_checkout.use()     # this checkout if it is built in place, else the installed mgtrace
import mgtrace as mt  # noqa: E402
import mgtrace.models as models  # noqa: E402
from mgtrace._core import nn  # noqa: E402
from mgtrace.traced_module import optimize  # noqa: E402


def layer_name(x_shape, w_shape, stride, groups):
    s = stride if isinstance(stride, int) else stride[0]
    return f"{x_shape[1]}x{x_shape[2]}->{w_shape[0]}k{w_shape[2]}s{s}g{groups}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", choices=["resnet18", "mobilenet_v2"])
    ap.add_argument("batch", type=int)
    ap.add_argument("--force", default="", help="comma-separated LAYER=ALGO (B's algorithms)")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    force = dict(kv.split("=") for kv in args.force.split(",") if kv)
    bad = {a for a in force.values() if a not in nn.CONV_ALGOS}
    if bad:
        ap.error(f"unknown algorithm(s) {sorted(bad)}; choose from {list(nn.CONV_ALGOS)}")
    mt.set_num_threads(args.threads)
    x = mt.tensor(np.random.default_rng(0).standard_normal((args.batch, 3, 224, 224), dtype=np.float32))
    net = optimize(mt.trace_module(getattr(models, args.model)().eval(), x), "all", flatten=True)

    times = {"A": collections.defaultdict(list), "B": collections.defaultdict(list)}
    algo_of, mode = {}, ["A"]
    real = nn._conv2d

    def timed(x, weight, bias, stride, padding, dilation, groups, algo, act="none", residual=None):
        name = layer_name(x.shape, weight.shape, stride, groups)
        if mode[0] == "B":
            algo = force.get(name, algo)
        algo_of.setdefault(name, nn.conv2d_algorithm(x.shape, weight.shape, stride, padding, dilation,
                                                     groups, cached=True))
        t = time.perf_counter()
        y = real(x, weight, bias, stride, padding, dilation, groups, algo, act, residual)
        times[mode[0]][name].append(time.perf_counter() - t)
        return y

    nn._conv2d = timed      # conv2d and conv2d_act call it through the module's globals
    modes = "AB" if force else "A"
    walls = {m: [] for m in modes}
    for r in range(args.rounds + 3):
        for m in modes:
            mode[0] = m
            t = time.perf_counter()
            net(x)
            if r >= 3:              # warm-up rounds fill the packed-weight cache
                walls[m].append(time.perf_counter() - t)
            else:
                times[m].clear()
    nn._conv2d = real
    print(f"# {args.model} batch {args.batch}, {args.threads} threads, median of {args.rounds} rounds, ms")
    print(f"{'layer':24s} {'calls':>5s} {'AUTO':>10s} {'A':>8s}" + (f" {'forced':>10s} {'B':>8s} {'B/A':>5s}"
                                                                    if force else ""))
    for name, ta in times["A"].items():
        calls = len(ta) // args.rounds
        a = float(np.median(ta)) * calls * 1e3
        line = f"{name:24s} {calls:5d} {algo_of[name]:>10s} {a:8.3f}"
        if force and name in force:
            b = float(np.median(times["B"][name])) * calls * 1e3
            line += f" {force[name]:>10s} {b:8.3f} {b / a:5.2f}"
        print(line)
    print("forward: " + ", ".join(f"{m} median {np.median(w) * 1e3:.2f} ms" for m, w in walls.items()))
    unknown = set(force) - set(times["A"])
    if unknown:
        print(f"# no layer named {sorted(unknown)} in {args.model}")


if __name__ == "__main__":
    main()
