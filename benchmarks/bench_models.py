"""Whole-model forward latency and peak memory: mgtrace eager next to PyTorch eager.

    python benchmarks/bench_models.py            # short: a few repeats
    python benchmarks/bench_models.py --full     # more repeats
    python benchmarks/bench_models.py --threads 1

Each (library, model, batch) row runs in its own subprocess, so the peak
resident set (``resource.getrusage(RUSAGE_SELF).ru_maxrss`` in the child) is
that run's alone: "peak MiB" is the whole process (interpreter, library,
weights, activations); "+MiB" is the peak minus the resident set after the
imports, i.e. roughly weights + activations + allocator caches. Latency is
the best of the timed calls after warm-up (the
median is in each child's JSON; best is robust to load from elsewhere) (eval mode, no autograd). Both
libraries get the same thread count. PyTorch rows are skipped when torch is
not importable. Not a test: nothing is asserted here.
"""
import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# (model, batch, input shape without the batch axis)
CASES = [
    ("resnet18", 1, (3, 224, 224)),
    ("resnet18", 8, (3, 224, 224)),
    # ---- MiniLM row goes here (added with mgtrace/models/minilm.py) ----
    # ("minilm_l6_v2", 8, (128,)),   # token ids [batch, seq]; build/run in _build_* below
]


def _rss_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0   # KiB on Linux


def _build_mgtrace(model, batch, shape, threads):
    import numpy as np
    import mgtrace as mt
    import mgtrace.models as models
    if threads:
        mt.set_num_threads(threads)
    base = _rss_mib()
    net = getattr(models, model)().eval()
    x = mt.tensor(np.random.default_rng(0).standard_normal((batch,) + shape, dtype=np.float32))
    return base, (lambda: net(x)), mt.get_num_threads()


def _build_torch(model, batch, shape, threads):
    import torch
    sys.path.insert(0, os.path.join(ROOT, "tests", "models"))
    import torch_reference   # torch.nn models with torchvision's names (no mgtrace import)
    if threads:
        torch.set_num_threads(threads)
    torch.set_grad_enabled(False)
    base = _rss_mib()
    net = torch_reference.TORCH_MODELS[model](torch.nn).eval()
    x = torch.randn((batch,) + shape)
    return base, (lambda: net(x)), torch.get_num_threads()


def child(lib, model, batch, shape, threads, warmup, repeats):
    """Runs in the subprocess: build, warm up, time; prints one JSON line."""
    build = _build_mgtrace if lib == "mgtrace" else _build_torch
    base, fn, nthreads = build(model, batch, tuple(shape), threads)
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    print(json.dumps({"ms": statistics.median(times) * 1e3, "best_ms": min(times) * 1e3,
                      "peak_mib": _rss_mib(), "base_mib": base, "threads": nthreads}))


def run_child(lib, model, batch, shape, threads, warmup, repeats):
    cmd = [sys.executable, os.path.abspath(__file__), "--child", lib, model, str(batch),
           ",".join(map(str, shape)), "--threads", str(threads), "--warmup", str(warmup),
           "--repeats", str(repeats)]
    env = dict(os.environ)   # mgtrace is built in place: make the checkout importable
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [ROOT, env.get("PYTHONPATH")]))
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env)
    if proc.returncode != 0:
        return {"error": proc.stderr.strip().splitlines()[-1] if proc.stderr else "failed"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def torch_available():
    return subprocess.run([sys.executable, "-c", "import torch"], capture_output=True).returncode == 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--full", action="store_true", help="more warm-up calls and repeats")
    ap.add_argument("--threads", type=int, default=0,
                    help="threads for both libraries (default: mgtrace's default)")
    ap.add_argument("--child", nargs=4, metavar=("LIB", "MODEL", "BATCH", "SHAPE"),
                    help=argparse.SUPPRESS)
    ap.add_argument("--warmup", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--repeats", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        lib, model, batch, shape = args.child
        child(lib, model, int(batch), [int(s) for s in shape.split(",")], args.threads,
              args.warmup, args.repeats)
        return
    warmup, repeats = (5, 30) if args.full else (3, 10)
    threads = args.threads
    if not threads:   # give torch the thread count mgtrace picks by default
        out = subprocess.run([sys.executable, "-c", "import mgtrace; print(mgtrace.get_num_threads())"],
                             capture_output=True, text=True, cwd=ROOT)
        threads = int(out.stdout.strip())
    libs = ["mgtrace"] + (["torch"] if torch_available() else [])
    print(f"threads {threads}, warm-up {warmup}, repeats {repeats} (best), "
          f"one subprocess per row" + ("" if "torch" in libs else "; torch not importable"))
    head = f"{'model':14s} {'batch':>5s} | {'mgtrace ms':>10s} {'peak MiB':>8s} {'+MiB':>6s}"
    if "torch" in libs:
        head += f" | {'torch ms':>9s} {'peak MiB':>8s} {'+MiB':>6s} | {'mgtrace/torch':>13s}"
    print(head)
    print("-" * len(head))
    for model, batch, shape in CASES:
        res = {lib: run_child(lib, model, batch, shape, threads, warmup, repeats) for lib in libs}
        cells = []
        for lib in libs:
            r = res[lib]
            if "error" in r:
                cells.append(f"{'error: ' + r['error'][:40]:>27s}")
            else:
                w = 10 if lib == "mgtrace" else 9
                cells.append(f"{r['best_ms']:{w}.1f} {r['peak_mib']:8.0f} "
                             f"{r['peak_mib'] - r['base_mib']:6.0f}")
        line = f"{model:14s} {batch:5d} | " + " | ".join(cells)
        if "torch" in libs and all("error" not in res[lib] for lib in libs):
            line += f" | {res['mgtrace']['best_ms'] / res['torch']['best_ms']:12.2f}x"
        print(line, flush=True)


if __name__ == "__main__":
    main()
