"""Per-layer time of the int8 convs of bench_quant.py's int8 models, the
kernel alone (the conv's checked plan on its recorded input), at 1 and 2
threads in one process:

    python benchmarks/bench_quant_layers.py --rows resnet18:1,mobilenet_v2:1
    python benchmarks/bench_quant_layers.py --rows resnet18:8 --repeats 5 --top 12

Columns per conv: its geometry, the CPU time of one call at 1 thread (min
of ``--repeats``), the wall clock at 1 and at 2 threads (min), and the
speedup 1 -> 2 threads of the wall clock. CPU time at 1 thread holds on a
loaded machine; the 2-thread wall clock moves with other work (compare rows
of one run). The last lines sum the convs and say the same of the whole
forward (the model's own call: kernels plus the Python between them).
Each row's header gives the load average before and after it.
Not a test: nothing is asserted.

Where other processes keep both cores busy, a team of two waits for its
descheduled member at every barrier and the 2-thread column can show no
speedup or a slowdown for every layer, whatever its shape (on this 2-core
machine beside two other processes' test runs, ResNet-18 b1: 1 -> 2
threads 0.1-0.5x; the same script under ``chrt -f 10``, 1.3-1.9x; and
of two SCHED_FIFO runs of one build, one gave 0.9-1.4x, the other
1.6-1.9x). Read that column from a quiet machine.
"""
import argparse
import os
import statistics
import time
import warnings

import _checkout

_checkout.use()

import bench_quant  # noqa: E402  (the int8 models of the table)


def _int8(name, batch):
    import mgtrace as mt
    from mgtrace.traced_module import optimize
    model = bench_quant._model(name)
    calib = [bench_quant._inputs(name, batch, s) for s in (1, 2)]
    xs = [mt.tensor(x) for x in bench_quant._inputs(name, batch, 0)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        qm = optimize(mt.trace_module(bench_quant._int8_model(model, calib, name != "minilm"),
                                      *xs), "all", flatten=True)
    return qm, xs


def _record(qm, xs):
    """[(label, plan, x, out)] of every quantized conv call of one forward"""
    import numpy as np
    from mgtrace.module.quantized import modules as qmods
    seen = []
    forward = qmods.Conv2d.forward

    def spy(self, x):
        y = forward(self, x)
        plan = self.__dict__["_plan"][3]
        data = np.ascontiguousarray(qmods._input(x, type(self).__name__)[0]).copy()
        kh, kw = self.kernel_size
        kind = "dw" if self.groups > 1 and self.groups == self.in_channels else f"{kh}x{kw}"
        label = (f"{kind} {self.in_channels}->{self.out_channels} s{self.stride[0]} "
                 f"{data.shape[2]}x{data.shape[3]}")
        seen.append((label, plan, data, np.empty(plan.out_shape, plan.out_dtype)))
        return y
    qmods.Conv2d.forward = spy
    try:
        qm(*xs).numpy()
    finally:
        qmods.Conv2d.forward = forward
    return seen


def _times(fn, repeats, clock):
    fn()
    out = []
    for _ in range(repeats):
        t = clock()
        fn()
        out.append((clock() - t) * 1e3)
    return out


def _load():
    try:
        return "%.2f %.2f %.2f" % os.getloadavg()
    except OSError:
        return "unknown"


def run(name, batch, repeats, top, path=None):
    import mgtrace as mt
    load_before = _load()
    qm, xs = _int8(name, batch)
    convs = _record(qm, xs)
    if path is not None:        # every conv forced onto one kernel path (int8.conv2d's)
        for _, plan, _, _ in convs:
            plan.args = plan.args[:-1] + (path,)
    rows = []
    for label, plan, x, out in convs:
        def call(plan=plan, x=x, out=out):
            plan(x, out)
        r = {"label": label}
        for th in (1, 2):
            mt.set_num_threads(th)
            if th == 1:
                r["cpu1"] = min(_times(call, repeats, time.process_time))
            r[f"wall{th}"] = min(_times(call, repeats, time.perf_counter))
        rows.append(r)
    mt.set_num_threads(1)
    whole = {1: _times(lambda: qm(*xs).numpy(), repeats, time.process_time)}
    w1 = _times(lambda: qm(*xs).numpy(), repeats, time.perf_counter)
    mt.set_num_threads(2)
    whole[2] = _times(lambda: qm(*xs).numpy(), repeats, time.perf_counter)
    print(f"{name} b{batch}: {len(rows)} int8 convs, ms (min of {repeats}); "
          f"cpu1 = CPU time at 1 thread, wallN = wall clock at N threads; "
          f"load average {load_before} before, {_load()} after")
    print(f"  {'conv':<30}{'cpu1':>8}{'wall1':>8}{'wall2':>8}{'1->2':>7}")
    shown = sorted(rows, key=lambda r: -r["wall1"])[:top] if top else rows
    for r in shown:
        print(f"  {r['label']:<30}{r['cpu1']:8.3f}{r['wall1']:8.3f}{r['wall2']:8.3f}"
              f"{r['wall1'] / r['wall2']:7.2f}")
    s = {k: sum(r[k] for r in rows) for k in ("cpu1", "wall1", "wall2")}
    print(f"  {'sum of convs':<30}{s['cpu1']:8.2f}{s['wall1']:8.2f}{s['wall2']:8.2f}"
          f"{s['wall1'] / s['wall2']:7.2f}")
    print(f"  {'whole forward (min / p50)':<30}{min(whole[1]):8.2f}{min(w1):8.2f}"
          f"{min(whole[2]):8.2f}{min(w1) / min(whole[2]):7.2f}   "
          f"p50 {statistics.median(whole[1]):.2f} / {statistics.median(w1):.2f} / "
          f"{statistics.median(whole[2]):.2f}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", default="resnet18:1,resnet18:8,mobilenet_v2:1")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--top", type=int, default=0, help="only the N slowest convs (1 thread)")
    ap.add_argument("--path", type=int, default=None,
                    help="force int8.conv2d's kernel path on every conv (e.g. 2 VNNI)")
    a = ap.parse_args()
    for row in a.rows.split(","):
        name, batch = row.split(":")
        run(name, int(batch), a.repeats, a.top, a.path)


if __name__ == "__main__":
    main()
