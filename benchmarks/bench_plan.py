"""A plan's cost per op beyond its kernels, beside the graph's.

    python benchmarks/bench_plan.py              # 200 elementwise ops on a 1 x 16 tensor
    python benchmarks/bench_plan.py --ops 1000 --repeats 2000

The module is a chain of ``--ops`` small elementwise ops (x * 0.5, x + 1,
relu in turn) on a [1, 16] float32 tensor: each kernel touches 16 values, so
a call's time is almost all overhead. Printed per op: the traced graph's
call, the plan's call, and the kernels alone (the same kernel steps
replayed without the guard, the output allocation and the Python call
around them: ``Executor.run``), each the best and the median of
``--repeats`` calls divided by the op count. On a shared machine the wall
clock is noisy: quote the best, with the load average printed beside it.
"""
import argparse
import os
import statistics
import time

import _checkout

_checkout.use()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ops", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=1000)
    args = ap.parse_args()
    import numpy as np
    import mgtrace as mt
    import mgtrace.functional as F
    import mgtrace.module as M

    class Chain(M.Module):
        def forward(self, x):
            for i in range(args.ops):
                x = x * 0.5 if i % 3 == 0 else (x + 1.0 if i % 3 == 1 else F.relu(x))
            return x

    x = mt.tensor(np.random.default_rng(0).standard_normal((1, 16)).astype(np.float32))
    tm = mt.trace_module(Chain().eval(), x)
    plan = mt.compile(tm, x)
    assert plan.stats()["python_steps"] == 0
    ex = next(iter(plan._programs.values())).executor
    rows = [("graph (traced)", lambda: tm(x)), ("plan", lambda: plan(x)),
            ("plan's kernel steps alone", lambda: ex.run((x,), None))]
    print(f"# {args.ops} ops on [1, 16] float32, {args.repeats} calls each, interleaved; "
          f"load average {os.getloadavg()[0]:.2f}")
    times = {name: [] for name, _ in rows}
    for _ in range(args.repeats):
        for name, fn in rows:
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    for name, _ in rows:
        t = times[name]
        print(f"{name:28s} best {min(t) / args.ops * 1e6:7.3f} us/op   "
              f"median {statistics.median(t) / args.ops * 1e6:7.3f} us/op")


if __name__ == "__main__":
    main()
