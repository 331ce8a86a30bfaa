"""NCHW16c layers, two ways.

Default: MobileNetV2's expansion + depthwise layers in NCHW16c: the two
``F.conv2d_nchwc`` calls against one ``F.conv2d_nchwc_pw_dw`` (what the
FusePointwiseDepthwise pass makes of them), each with its data in the caches
("hot": the same call repeated) and out of them ("cold": 64 MiB written
between calls, as a model's other layers do to the caches). Prints the
median of the calls, in us.

    python benchmarks/bench_nchwc_layers.py                 # 1 and 2 threads
    python benchmarks/bench_nchwc_layers.py --threads 2 --full

``--vs-ort``: a model's layers in mgtrace's plan beside ONNX Runtime's, per
layer, inside the whole forward. mgtrace: ``optimize(trace_module(net),
"all", flatten=True)`` compiled (``mgtrace.compile``), each step timed from
C by ``Plan.profile``. ONNX Runtime: the same traced module exported by
``mgtrace.onnx.export`` (the same random weights and shapes; ORT folds the
BatchNorms and runs its NCHWc transformer itself), all graph optimizations,
``enable_profiling`` for each node's kernel time. Each library runs in a
child process of its own (no thread pool of one spinning beside the
other's), ``--calls`` whole forwards after warm-up; each layer's best and
median over them, in us. A row is one mgtrace step; the ORT time beside it
is the sum of the ORT nodes holding the same convolutions (matched by weight
shape, channels padded to 16, and order: ORT's fused Conv+Add+Relu is one node, mgtrace's
pointwise-depthwise-projection blocks are one step for three ORT nodes);
steps without a convolution (pooling, the classifier) are matched by kind.
At 1 thread the best of many calls is the steadiest figure on a shared
machine; the ratio column is mgtrace / ORT of the best. Below the layers:
the sum of the steps in each call (its best and median call), and the sum
of the layers' bests (the steadier total where other processes interrupt
some calls).

    python benchmarks/bench_nchwc_layers.py --vs-ort resnet18 --threads 1
    python benchmarks/bench_nchwc_layers.py --vs-ort mobilenet_v2 --threads 1 --threads 2
    python benchmarks/bench_nchwc_layers.py --vs-ort resnet18 --batch 8 --calls 20

Not a test: nothing is asserted.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
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


# ------------------------------------------------------------- --vs-ort

# an ORT node's op for each mgtrace step without a convolution
_TAIL_OPS = {"max_pool2d_nchwc": ("MaxPool",), "mean": ("GlobalAveragePool", "ReduceMean"),
             "from_nchwc": ("ReorderOutput", "Flatten", "Reshape"), "matmul": ("Gemm", "MatMul"),
             "add": ("Add",), "to_nchwc": ("ReorderInput",), "adaptive_avg_pool2d": ("GlobalAveragePool",)}


def _conv_weights(expr):
    """The 4-d weight shapes a conv CallFunction reads (after its input)."""
    return [tuple(i.shape) for i in expr.inputs[1:] if i.shape is not None and len(i.shape) == 4]


def _steps_mgtrace(model, batch, threads, calls):
    """Each plan step: (label, kind, weight shapes, [seconds per call])."""
    import mgtrace.models as models
    from mgtrace.traced_module import optimize
    mt.set_num_threads(threads)
    x = mt.tensor(np.random.default_rng(0).standard_normal((batch, 3, 224, 224), dtype=np.float32))
    opt = optimize(mt.trace_module(getattr(models, model)().eval(), x), "all", flatten=True)
    plan = mt.compile(opt, x)
    for _ in range(3):
        plan(x)
    runs = [plan.profile(x) for _ in range(calls)]
    calls_fn = [e for e in opt.graph.exprs() if type(e).__name__ == "CallFunction"]
    out = []
    for i, (kind, what, _) in enumerate(runs[0]):
        fn = what.split(": ")[1] if ": " in what else what
        weights, label = [], fn
        # the graph's next call of the same function names the step
        for j, e in enumerate(calls_fn):
            if e.func.__name__ == fn or (fn in ("matmul", "add") and e.func.__name__ == "linear"):
                weights = _conv_weights(e) if fn.startswith("conv2d") else []
                if weights:
                    label = e.inputs[1].name.replace("_weight", "")
                    if len(weights) > 1:
                        label += f"+{len(weights) - 1}"
                if fn not in ("matmul",):       # (a linear is two steps: matmul, add)
                    calls_fn.pop(j)
                break
        out.append((label, fn, weights, [r[i][2] for r in runs]))
    return out


def _nodes_ort(model, batch, threads, calls):
    """Each ORT node in execution order: (name, op, weight shape or None, [seconds per call])."""
    import onnxruntime as ort
    import mgtrace.models as models
    import mgtrace.onnx as mo
    x = mt.tensor(np.random.default_rng(0).standard_normal((batch, 3, 224, 224), dtype=np.float32))
    folder = tempfile.mkdtemp(prefix="bench_nchwc_layers_")
    path = os.path.join(folder, "model.onnx")
    mo.export(mt.trace_module(getattr(models, model)().eval(), x), path, dynamic=False)
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    sess = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
    feed = {sess.get_inputs()[0].name: x.numpy()}
    for _ in range(3):
        sess.run(None, feed)
    opts.enable_profiling = True
    opts.profile_file_prefix = os.path.join(folder, "prof")
    sess = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
    for _ in range(3):
        sess.run(None, feed)
    for _ in range(calls):
        sess.run(None, feed)
    with open(sess.end_profiling()) as f:
        events = json.load(f)
    nodes, order = {}, []
    for ev in events:
        if ev.get("cat") != "Node" or not ev["name"].endswith("_kernel_time"):
            continue
        a = ev.get("args", {})
        if ev["name"] not in nodes:
            shapes = [list(d.values())[0] for d in a.get("input_type_shape", [])]
            w = tuple(shapes[1]) if a.get("op_name") in ("Conv", "FusedConv") and len(shapes) > 1 else None
            nodes[ev["name"]] = (ev["name"], a.get("op_name"), w, [])
            order.append(ev["name"])
        nodes[ev["name"]][3].append(ev["dur"] * 1e-6)
    # (the first 3 runs were warm-up)
    return [(n, op, w, ts[3:]) for n, op, w, ts in (nodes[k] for k in order)]


def _child(what, model, batch, threads, calls):
    rows = (_steps_mgtrace if what == "mgtrace" else _nodes_ort)(model, batch, threads, calls)
    print(json.dumps(rows))


def _run_child(what, model, batch, threads, calls):
    cmd = [sys.executable, os.path.abspath(__file__), "--child", what, "--vs-ort", model, "--batch", str(batch),
           "--threads", str(threads), "--calls", str(calls)]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=_checkout.CHILD_CWD)
    if proc.returncode != 0:
        raise RuntimeError(f"{what} child failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _wkey(w):
    """A weight shape as both sides see it: ORT's NCHWc convs report their
    channels padded to the block (24 -> 32) where a block is read."""
    o, c = w[0], w[1]
    return (-(-o // 16) * 16, -(-c // 16) * 16 if c > 4 else c) + tuple(w[2:])


def _stats(ts):
    return min(ts) * 1e6, float(np.median(ts)) * 1e6


def vs_ort(model, batch, threads, calls):
    steps = _run_child("mgtrace", model, batch, threads, calls)
    nodes = _run_child("ort", model, batch, threads, calls)
    by_weight = {}
    for n in nodes:
        if n[2] is not None:
            by_weight.setdefault(_wkey(n[2]), []).append(n)
    used = set()
    print(f"\n{model} batch {batch}, {threads} thread(s), {calls} calls; us, best / median")
    print(f"{'mgtrace step':>34} {'weights':>20} | {'mgtrace':>15} | {'ORT':>15} {'nodes':>5} | {'best':>5}")
    tot_m, tot_o = np.zeros(calls), np.zeros(calls)
    best_m = best_o = 0.0
    for label, fn, weights, ts in steps:
        mine = []
        for w in weights:
            cand = by_weight.get(_wkey(w), [])
            if cand:
                mine.append(cand.pop(0))
        if not weights:
            ops = _TAIL_OPS.get(fn, ())
            for n in nodes:
                if n[0] not in used and n[2] is None and n[1] in ops:
                    mine.append(n)
                    break
        used.update(n[0] for n in mine)
        ts = np.array(ts)
        tot_m += ts
        bm, mm = _stats(ts)
        best_m += bm
        wtxt = "x".join(map(str, weights[0])) if weights else ""
        if mine:
            to = np.sum([n[3] for n in mine], axis=0)
            tot_o += to
            bo, mo = _stats(to)
            best_o += bo
            print(f"{label[:34]:>34} {wtxt:>20} | {bm:7.0f} {mm:7.0f} | {bo:7.0f} {mo:7.0f} {len(mine):>5} | "
                  f"{bm / bo:5.2f}")
        else:
            print(f"{label[:34]:>34} {wtxt:>20} | {bm:7.0f} {mm:7.0f} | {'':>15} {'':>5} |")
    for n in nodes:
        if n[0] not in used:
            to = np.array(n[3])
            tot_o += to
            bo, mo = _stats(to)
            best_o += bo
            wtxt = "x".join(map(str, n[2] or ()))
            print(f"{'(ORT only) ' + n[1]:>34} {wtxt:>20} | {'':>15} | {bo:7.0f} {mo:7.0f} {1:>5} |")
    bm, mm = _stats(tot_m)
    bo, mo = _stats(tot_o)
    print(f"{'steps a call':>34} {'':>20} | {bm:7.0f} {mm:7.0f} | {bo:7.0f} {mo:7.0f} {'':>5} | {bm / bo:5.2f}")
    print(f"{'sum of the bests':>34} {'':>20} | {best_m:7.0f} {'':>7} | {best_o:7.0f} {'':>7} {'':>5} | "
          f"{best_m / best_o:5.2f}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, action="append")
    ap.add_argument("--full", action="store_true", help="200 calls a cell instead of 40")
    ap.add_argument("--vs-ort", metavar="MODEL", help="resnet18 or mobilenet_v2: per layer beside ONNX Runtime")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--calls", type=int, default=50, help="--vs-ort: timed forwards a library")
    ap.add_argument("--child", choices=("mgtrace", "ort"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return _child(args.child, args.vs_ort, args.batch, args.threads[0], args.calls)
    if args.vs_ort:
        for threads in args.threads or [1, 2]:
            vs_ort(args.vs_ort, args.batch, threads, args.calls)
        return
    layers_pair_fused(args)


def layers_pair_fused(args):
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
