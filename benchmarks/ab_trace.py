"""A/B of trace time: ``mgtrace.trace_module`` of the same model in two
checkouts (each with its own Python), timed in alternation so that both see
the same machine load.

    python benchmarks/ab_trace.py --a /work/venv/bin/python:/work/main \\
        --b /work/venvs/NAME/bin/python:/work/wt/NAME
    python benchmarks/ab_trace.py ... --model mobilenet_v2 --shape 1x3x64x64 --rounds 40

Each side is one long-lived child process (``PYTHON:CHECKOUT``, the checkout
as its working directory, so that it imports that checkout's mgtrace built
in place); every round asks A and B for one trace each, in alternating
order. Prints the best and the median per side, in ms. Not a test.
"""
import argparse
import statistics
import subprocess
import sys

CHILD = r"""
import sys, time
import numpy as np
import mgtrace as mt, mgtrace.models as models
mt.set_num_threads(int(sys.argv[3]))
net = getattr(models, sys.argv[1])().eval()
shape = tuple(int(s) for s in sys.argv[2].split("x"))
x = mt.tensor(np.random.default_rng(0).standard_normal(shape).astype("float32"))
print(mt.__file__, flush=True)
for line in sys.stdin:
    t0 = time.perf_counter()
    mt.trace_module(net, x)
    print(time.perf_counter() - t0, flush=True)
"""


def start(spec, args):
    python, checkout = spec.split(":", 1)
    p = subprocess.Popen([python, "-c", CHILD, args.model, args.shape, str(args.threads)],
                         cwd=checkout, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    where = p.stdout.readline().strip()
    return p, where


def once(p):
    p.stdin.write("go\n")
    p.stdin.flush()
    return float(p.stdout.readline()) * 1e3


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--a", required=True, help="PYTHON:CHECKOUT of side A")
    ap.add_argument("--b", required=True, help="PYTHON:CHECKOUT of side B")
    ap.add_argument("--model", default="resnet18", choices=["resnet18", "mobilenet_v2"])
    ap.add_argument("--shape", default="1x3x32x32")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    sides = {"A": start(args.a, args), "B": start(args.b, args)}
    for name, (_, where) in sides.items():
        print(f"{name}: {where}")
    times = {k: [] for k in sides}
    for r in range(args.warmup + args.rounds):
        order = ("A", "B") if r % 2 == 0 else ("B", "A")
        for k in order:
            t = once(sides[k][0])
            if r >= args.warmup:
                times[k].append(t)
    for k, (p, _) in sides.items():
        p.stdin.close()
        p.wait()
        print(f"{k}: trace_module({args.model}, {args.shape}) best {min(times[k]):.1f} ms, "
              f"median {statistics.median(times[k]):.1f} ms over {args.rounds} rounds")
    return 0


if __name__ == "__main__":
    sys.exit(main())
