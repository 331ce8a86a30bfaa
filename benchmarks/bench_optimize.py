"""Inference latency: mgtrace eager, traced, traced + optimize() next to
PyTorch eager and ONNX Runtime, plus a row under contention.

    python benchmarks/bench_optimize.py                 # short: a few repeats
    python benchmarks/bench_optimize.py --full          # more repeats
    python benchmarks/bench_optimize.py --peer-python /path/to/venv/bin/python
    # the speed proof (plan beside ONNX Runtime and PyTorch, RSS, contention):
    python benchmarks/bench_optimize.py --kinds plan,onnxruntime,torch --rss \
        --peer-python /path/to/venv/bin/python

Rows: ResNet-18 224x224 at batch 1 and 8, MobileNetV2 224x224 at batch 1,
the MiniLM-L6 encoder (6 layers, hidden 384, 12 heads) at 8 x 128 tokens,
all with random weights (speed does not depend on them) and the same inputs
for every library. Columns, each run in its own subprocess with the same
thread count:

- mgtrace eager: the mgtrace.models module called directly;
- mgtrace traced: ``trace_module`` of it;
- mgtrace optimized: ``optimize(traced, "all", flatten=True)``, saved as a
  .tmod by a process of its own and loaded by the timed child (BatchNorms
  folded into the convs, conv/linear + activation fused, Dropout dropped;
  flattened so that MobileNetV2's shortcut adds, one module above their
  conv, fuse into it too);
- mgtrace plan: ``mgtrace.compile`` of the optimized module at the inputs'
  shapes (its kernel steps replayed from C, see README "Inference plans");
- PyTorch eager: the same architecture in torch.nn (ResNet-18 and
  MobileNetV2 from tests/models/torch_reference.py; MiniLM as an
  equivalent BERT encoder written here), under ``torch.inference_mode``;
- ONNX Runtime: that torch module exported with ``torch.onnx.export`` (once
  per row, by a process of its own: the timed child imports onnxruntime
  and not torch, as mgtrace's optimized and plan children load their
  .tmod) and run by an InferenceSession (all graph optimizations, intra-op threads =
  the thread count, one inter-op thread).

PyTorch and ONNX Runtime run in ``--peer-python`` (default: this
interpreter); a column whose library does not import there says so.

The contention row runs ResNet-18 batch 1 while two other processes spin
on the cores (pure Python busy loops), for mgtrace optimized and PyTorch.

Each cell is ``best/p50/p90`` in ms: the best, median and 90th-percentile
call of the timed calls after warm-up (the best is robust to noise from
elsewhere on the machine; p50 is the call a user typically waits for), from
the round with the best median, over ``--rounds`` rounds: each round starts every
column's subprocess once, in turn, so that a slow minute on a shared machine
falls on every library rather than on whichever ran then (one round per
column moved a ratio by 20-30% between runs here). The machine's load
average is printed with the table: on a shared machine the numbers are only
comparable within one run. ``--rss`` adds each column's peak resident
memory, MB, as ``peak/forward``: the child's ru_maxrss after its calls
(building the model included: for mgtrace's plan, compile's recording of
one forward; for ONNX Runtime, session creation without torch, which only
the exporting process loads), then the forward's own peak (VmHWM reset
after building, read after the calls: the peak RSS of serving), or
``peak+growth`` where VmHWM cannot be reset (the growth over the RSS
before the first call). ``--kinds`` picks columns. Not a test: nothing is asserted here.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings

import _checkout

ROOT = _checkout.ROOT
_checkout.use()     # this checkout if it is built in place, else the installed mgtrace

# (row label, model, batch, input shape without the batch axis)
CASES = [
    ("ResNet-18 b1", "resnet18", 1, (3, 224, 224)),
    ("ResNet-18 b8", "resnet18", 8, (3, 224, 224)),
    ("MobileNetV2 b1", "mobilenet_v2", 1, (3, 224, 224)),
    ("MiniLM 8x128", "minilm", 8, (128,)),
]
MGTRACE_KINDS = ("eager", "traced", "optimized", "plan")
PEER_KINDS = ("torch", "onnxruntime")


def _inputs(model, batch, shape):
    """The model's inputs as NumPy arrays, the same for every library."""
    import numpy as np
    rng = np.random.default_rng(0)
    if model != "minilm":
        return (rng.standard_normal((batch,) + tuple(shape), dtype=np.float32),)
    seq = shape[0]
    ids = rng.integers(1000, 30522, (batch, seq)).astype(np.int32)
    mask = np.zeros((batch, seq), np.int32)
    for i in range(batch):
        mask[i, :max(2, seq - 8 * i)] = 1
    return ids, mask


# ------------------------------------------------------------------ builders

def save_optimized(model, batch, shape, path):
    """Writes the optimized module (see the docstring) to ``path`` as a
    .tmod, in a process of its own: the timed child loads it, as a
    deployment would (and as the ONNX Runtime child loads its .onnx)."""
    import mgtrace as mt
    import mgtrace.models as models
    from mgtrace.traced_module import optimize
    net = models.MiniLM().eval() if model == "minilm" else getattr(models, model)().eval()
    xs = [mt.tensor(a) for a in _inputs(model, batch, shape)]
    mt.save(optimize(mt.trace_module(net, *xs), "all", flatten=True), path)


def _made_once(what, model, batch, shape, suffix):
    """The row's file that ``--{what}`` writes, made once per run of the
    benchmark (in BENCH_OPTIMIZE_DIR) by a process of its own."""
    folder = os.environ.get("BENCH_OPTIMIZE_DIR") or tempfile.mkdtemp(prefix="bench_optimize_")
    path = os.path.join(folder, f"{model}_b{batch}_{'x'.join(map(str, shape))}.{suffix}")
    if not os.path.exists(path):
        proc = subprocess.run([sys.executable, os.path.abspath(__file__), f"--{what}", model, str(batch),
                               ",".join(map(str, shape)), path], capture_output=True, text=True,
                              cwd=_checkout.CHILD_CWD)
        if proc.returncode != 0:
            lines = (proc.stderr or f"{what} failed").strip().splitlines()
            raise RuntimeError(lines[-1] if lines else f"{what} failed")
    return path


def _build_mgtrace(kind, model, inputs, threads, batch, shape):
    import mgtrace as mt
    import mgtrace.models as models
    if threads:
        mt.set_num_threads(threads)
    xs = [mt.tensor(a) for a in inputs]
    if kind in ("optimized", "plan"):
        net = mt.load(_made_once("save-optimized", model, batch, shape, "tmod"))
        if kind == "plan":
            net = mt.compile(net, *xs)
        return lambda: net(*xs)
    net = models.MiniLM().eval() if model == "minilm" else getattr(models, model)().eval()
    if kind == "traced":
        net = mt.trace_module(net, *xs)
    return lambda: net(*xs)


def _torch_minilm(torch, layers=6, hidden=384, heads=12, inter=1536, vocab=30522, max_pos=512):
    """BERT encoder + mean pooling + L2 normalisation in torch.nn: the
    computation of mgtrace.models.MiniLM (and of sentence-transformers'
    all-MiniLM-L6-v2), eager attention."""
    import math
    nn, fn = torch.nn, torch.nn.functional
    d = hidden // heads

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.q, self.k, self.v = (nn.Linear(hidden, hidden) for _ in range(3))
            self.o, self.ln1 = nn.Linear(hidden, hidden), nn.LayerNorm(hidden, eps=1e-12)
            self.i, self.out = nn.Linear(hidden, inter), nn.Linear(inter, hidden)
            self.ln2 = nn.LayerNorm(hidden, eps=1e-12)

        def forward(self, h, bias):
            b, n, _ = h.shape

            def split(x):
                return x.view(b, n, heads, d).transpose(1, 2)
            q, k, v = split(self.q(h)), split(self.k(h)), split(self.v(h))
            p = torch.softmax(q @ k.transpose(-1, -2) * (1.0 / math.sqrt(d)) + bias, dim=-1)
            a = (p @ v).transpose(1, 2).reshape(b, n, hidden)
            a = self.ln1(self.o(a) + h)
            return self.ln2(self.out(fn.gelu(self.i(a))) + a)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.word, self.pos = nn.Embedding(vocab, hidden), nn.Embedding(max_pos, hidden)
            self.token_type, self.ln = nn.Embedding(2, hidden), nn.LayerNorm(hidden, eps=1e-12)
            self.layers = nn.ModuleList(Layer() for _ in range(layers))

        def forward(self, ids, mask):
            b, n = ids.shape
            pos = torch.arange(n, device=ids.device).unsqueeze(0)
            h = self.ln(self.word(ids) + self.pos(pos) + self.token_type(torch.zeros_like(pos)))
            m = mask.to(torch.float32)
            bias = ((1.0 - m) * torch.finfo(torch.float32).min).view(b, 1, 1, n)
            for layer in self.layers:
                h = layer(h, bias)
            me = m.unsqueeze(-1)
            pooled = (h * me).sum(1) / me.sum(1).clamp(min=1e-9)
            return fn.normalize(pooled, dim=-1)

    return Net()


def _torch_net(torch, model):
    if model == "minilm":
        return _torch_minilm(torch)
    sys.path.insert(0, os.path.join(ROOT, "tests", "models"))
    import torch_reference   # torch.nn models with torchvision's names (no mgtrace import)
    return torch_reference.TORCH_MODELS[model](torch.nn)


def _onnx_names(model):
    return ["input_ids", "attention_mask"] if model == "minilm" else ["x"]


def export_onnx(model, batch, shape, path):
    """Writes the torch model exported to ONNX at ``path`` (run in its own
    process, so that the ONNX Runtime child never imports torch and its
    peak RSS is ONNX Runtime's own)."""
    import torch
    torch.manual_seed(0)
    net = _torch_net(torch, model).eval()
    xs = [torch.from_numpy(a) for a in _inputs(model, batch, shape)]
    names = _onnx_names(model)
    kw = dict(input_names=names, output_names=["y"], opset_version=17)
    import inspect
    if "dynamo" in inspect.signature(torch.onnx.export).parameters:
        kw["dynamo"] = False         # the TorchScript exporter: no onnxscript needed
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(net, tuple(xs), path, **kw)


def _build_torch(kind, model, inputs, threads, batch=None, shape=None):
    if kind == "onnxruntime":
        import onnxruntime as ort
        path = _made_once("export", model, batch, shape, "onnx")
        opts = ort.SessionOptions()
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        if threads:
            opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
        sess = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
        feed = dict(zip(_onnx_names(model), inputs))
        return lambda: sess.run(None, feed)
    import torch
    if threads:
        torch.set_num_threads(threads)
        torch.set_num_interop_threads(1)
    torch.manual_seed(0)
    net = _torch_net(torch, model).eval()
    xs = [torch.from_numpy(a) for a in inputs]

    def run():
        with torch.inference_mode():
            return net(*xs)
    return run


# ------------------------------------------------------------------ children

def child(kind, model, batch, shape, threads, warmup, repeats):
    """Runs in the subprocess: build, warm up, time; prints one JSON line."""
    inputs = _inputs(model, batch, shape)
    if kind in MGTRACE_KINDS:
        fn = _build_mgtrace(kind, model, inputs, threads, batch, shape)
    else:
        fn = _build_torch(kind, model, inputs, threads, batch, shape)
    import resource
    rss_before = _rss_mb()
    build_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    hwm_reset = _reset_peak()       # (ru_maxrss is reset with it)
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    peak = max(build_peak, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    times.sort()
    print(json.dumps({"ms": statistics.median(times) * 1e3, "best_ms": times[0] * 1e3,
                      "p90_ms": times[min(len(times) - 1, int(0.9 * len(times)))] * 1e3,
                      "peak_mb": peak, "forward_mb": max(0.0, peak - rss_before),
                      "forward_peak_mb": _hwm_mb() if hwm_reset else None}))


def _reset_peak():
    """Resets this process's peak RSS (VmHWM) to its RSS now (Linux:
    ``clear_refs`` 5), so that VmHWM after the calls is the forward's own
    peak, building the model excluded; False where that is not possible."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return _hwm_mb() is not None
    except OSError:
        return False


def _hwm_mb():
    """VmHWM (the peak RSS since the last reset), MB, or None."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _rss_mb():
    """The resident set now, MB (Linux /proc; 0 elsewhere)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError, IndexError):
        return 0.0


def run_child(python, kind, model, batch, shape, threads, warmup, repeats):
    cmd = [python, os.path.abspath(__file__), "--child", kind, model, str(batch),
           ",".join(map(str, shape)), "--threads", str(threads), "--warmup", str(warmup),
           "--repeats", str(repeats)]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=_checkout.CHILD_CWD)
    if proc.returncode != 0:
        lines = (proc.stderr or "failed").strip().splitlines()
        return {"error": lines[-1] if lines else "failed"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def interleaved(kinds, run, rounds):
    """{kind: result}: ``run(kind)`` for each kind in turn, ``rounds`` times
    over; a kind's result is its round with the lowest median call (its
    best, median and p90 calls from that round), or its error when every
    round failed."""
    out = {}
    for _ in range(rounds):
        for k in kinds:
            r = run(k)
            if k not in out or "error" in out[k] or ("error" not in r and r["ms"] < out[k]["ms"]):
                out[k] = r
    return out


def importable(python, module):
    """None when ``module`` imports in ``python``, else why not."""
    r = subprocess.run([python, "-c", f"import {module}"], capture_output=True, text=True)
    if r.returncode == 0:
        return None
    lines = r.stderr.strip().splitlines()
    return lines[-1] if lines else f"{module} does not import"


class Busy:
    """Two (or n) processes spinning in Python, for the contention row."""

    def __init__(self, n=2):
        self.n, self.procs = n, []

    def __enter__(self):
        self.procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
                      for _ in range(self.n)]
        time.sleep(1.0)
        return self

    def __exit__(self, *exc):
        for p in self.procs:
            p.kill()
            p.wait()


CELL = 18


def _cell(r, rss=False):
    width = CELL + (14 if rss else 0)
    if r is None:
        return f"{'-':>{width}s}"
    if "error" in r:
        return f"{'n/a':>{width}s}"
    text = f"{r['best_ms']:.1f}/{r['ms']:.1f}/{r['p90_ms']:.1f}"
    if rss:
        fwd = r.get("forward_peak_mb")
        text += f" {r['peak_mb']:.0f}/{fwd:.0f}MB" if fwd is not None else \
            f" {r['peak_mb']:.0f}+{r['forward_mb']:.0f}MB"
    return f"{text:>{width}s}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--full", action="store_true", help="more warm-up calls and repeats")
    ap.add_argument("--threads", type=int, default=2, help="threads for every library (default 2)")
    ap.add_argument("--peer-python", default=sys.executable,
                    help="interpreter with torch and onnxruntime (default: this one)")
    ap.add_argument("--no-contention", action="store_true", help="skip the contention row")
    ap.add_argument("--rss", action="store_true", help="add peak RSS and the forward's growth of it")
    ap.add_argument("--rounds", type=int, default=None,
                    help="subprocesses a cell, interleaved across the columns (default 2; 3 with --full)")
    ap.add_argument("--only", default="",
                    help="comma-separated rows to run, by model (resnet18, mobilenet_v2, minilm) or label "
                         "(\"ResNet-18 b8\"); default all")
    ap.add_argument("--kinds", default="",
                    help="comma-separated columns to run (eager, traced, optimized, plan, torch, "
                         "onnxruntime); default all. The speed proof needs plan,onnxruntime,torch")
    ap.add_argument("--child", nargs=4, metavar=("KIND", "MODEL", "BATCH", "SHAPE"),
                    help=argparse.SUPPRESS)
    ap.add_argument("--export", nargs=4, metavar=("MODEL", "BATCH", "SHAPE", "PATH"),
                    help=argparse.SUPPRESS)
    ap.add_argument("--save-optimized", nargs=4, metavar=("MODEL", "BATCH", "SHAPE", "PATH"),
                    help=argparse.SUPPRESS)
    ap.add_argument("--warmup", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--repeats", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    for made, fn in ((args.export, export_onnx), (args.save_optimized, save_optimized)):
        if made:
            model, batch, shape, path = made
            fn(model, int(batch), [int(s) for s in shape.split(",")], path)
            return
    if args.child:
        kind, model, batch, shape = args.child
        child(kind, model, int(batch), [int(s) for s in shape.split(",")], args.threads,
              args.warmup, args.repeats)
        return
    wanted = [w.strip() for w in args.only.split(",") if w.strip()]
    cases = [c for c in CASES if not wanted or c[0] in wanted or c[1] in wanted]
    if not cases:
        ap.error(f"--only {args.only!r} names no row; rows: " + ", ".join(f"{c[0]} ({c[1]})" for c in CASES))
    warmup, repeats = (5, 30) if args.full else (2, 7)
    rounds = args.rounds if args.rounds is not None else (3 if args.full else 2)
    if rounds < 1:
        ap.error("--rounds must be at least 1")
    peer = args.peer_python
    missing = {"torch": importable(peer, "torch"),
               "onnxruntime": importable(peer, "torch") or importable(peer, "onnxruntime")}
    for k, why in missing.items():
        if why:
            print(f"# {k}: skipped ({why} in {peer})")
    print(f"# threads {args.threads}, warm-up {warmup}, {repeats} timed calls x {rounds} rounds "
          f"(a subprocess a round, columns interleaved; cells best/p50/p90 ms of the round with the "
          f"lowest p50); load average before: {os.getloadavg()[0]:.2f}")
    from mgtrace._core import linalg
    # (an OPENBLAS_CORETYPE in the environment picks mgtrace's GEMM kernels,
    # not the peers': Haswell's AVX2 ones ran sgemm at half the AVX-512 ones'
    # speed on a Zen 5 machine that set it)
    print(f"# mgtrace's BLAS: {linalg.blas_config()}; OPENBLAS_CORETYPE="
          f"{os.environ.get('OPENBLAS_CORETYPE', '(unset)')}")
    kinds = list(MGTRACE_KINDS) + [k for k in PEER_KINDS if not missing[k]]
    chosen = [k.strip() for k in args.kinds.split(",") if k.strip()]
    unknown = [k for k in chosen if k not in MGTRACE_KINDS + PEER_KINDS]
    if unknown:
        ap.error(f"--kinds: unknown column(s) {', '.join(unknown)}; columns: "
                 + ", ".join(MGTRACE_KINDS + PEER_KINDS))
    if chosen:
        kinds = [k for k in kinds if k in chosen]
    # each row's .onnx and optimized .tmod are made once, each by a process of its own
    os.environ.setdefault("BENCH_OPTIMIZE_DIR", tempfile.mkdtemp(prefix="bench_optimize_"))
    labels = {"eager": "mt eager", "traced": "mt traced", "optimized": "mt optim", "plan": "mt plan",
              "torch": "torch", "onnxruntime": "onnxrt"}
    width = CELL + (14 if args.rss else 0)
    head = f"{'model':16s} |" + "".join(f"{labels[k]:>{width}s}" for k in kinds) + \
        f" | {'optim/ort':>9s} {'plan/ort p50':>12s} {'p90':>5s}"
    print(head)
    print("-" * len(head))
    for label, model, batch, shape in cases:
        res = interleaved(kinds, lambda k: run_child(sys.executable if k in MGTRACE_KINDS else peer, k,
                                                    model, batch, shape, args.threads, warmup, repeats),
                          rounds)
        line = f"{label:16s} |" + "".join(_cell(res[k], args.rss) for k in kinds)
        o, p, x = res.get("optimized"), res.get("plan"), res.get("onnxruntime")
        ratio = lambda a, b, key: f"{a[key] / b[key]:.2f}" if a and b and "error" not in a \
            and "error" not in b else "-"                              # noqa: E731
        line += f" | {ratio(o, x, 'best_ms'):>9s} {ratio(p, x, 'ms'):>12s} {ratio(p, x, 'p90_ms'):>5s}"
        print(line, flush=True)
        for k in kinds:
            if "error" in res[k]:
                print(f"#   {labels[k]}: {res[k]['error'][:160]}")
    if not args.no_contention and CASES[0] in cases:       # (the contention row is ResNet-18 b1's)
        with Busy(2):
            label, model, batch, shape = CASES[0]
            cont = interleaved([k for k in ("eager", "optimized", "plan", "torch") if k in kinds],
                               lambda k: run_child(sys.executable if k in MGTRACE_KINDS else peer, k,
                                                   model, batch, shape, args.threads, warmup, repeats),
                               rounds)
            load = os.getloadavg()[0]
        line = f"{'R18 b1, 2 busy':16s} |" + "".join(
            _cell(cont.get(k), args.rss) for k in kinds)
        print(line + f"   (2 busy processes; load average {load:.2f})", flush=True)
    print(f"# load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
