"""One training step (forward, backward, SGD update) in mgtrace beside PyTorch CPU.

ResNet-18 (images) and a MiniLM-L6 encoder (token ids; mean-pooled output),
seeded random weights, both libraries with the same number of threads.
Each run is its own process, so peak RSS is that library's alone. Prints
seconds per step (best and median of the timed steps) and peak RSS.

    python benchmarks/bench_train.py           # short: ResNet-18 b2 at 64, MiniLM 2 x 32
    python benchmarks/bench_train.py --full    # ResNet-18 b8 at 224, MiniLM 8 x 128
    python benchmarks/bench_train.py --peer-python /path/to/venv/bin/python   # torch there
    python benchmarks/bench_train.py --full --profile --steps 2   # per-op CPU s, 1 thread

PyTorch's column is left empty when torch is not installed. The torch
models are independent torch.nn definitions of the same architectures
(ResNet-18: tests/models/torch_reference.py; MiniLM: nn.TransformerEncoder
with BERT's post-norm layers, GELU and sizes).
"""
import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

import numpy as np

import _checkout

HERE = os.path.dirname(os.path.abspath(__file__))


# Untimed steps before the timed ones, for both libraries: the host cache of
# freed blocks (mgtrace) and malloc's heap (torch) reach the step's pattern
# of allocations. After one step mgtrace's cache still lacked a few blocks
# (ResNet-18 b8: 13 fresh mappings and 0.17 s of page faults in the next
# step, 4 in the one after, none from then on), which the median of three
# timed steps caught.
WARMUP = 2


def _steps(step, n):
    for _ in range(WARMUP):
        step()
    times = []
    for _ in range(n):
        t = time.perf_counter()
        step()
        times.append(time.perf_counter() - t)
    return min(times), statistics.median(times)


def build_mgtrace(model, batch, size):
    """The seeded model and batch: ``(loss_fn, parameters)``."""
    import mgtrace as mt
    import mgtrace.functional as F
    from mgtrace.models import MiniLM, resnet18
    mt.random.seed(0)
    rng = np.random.default_rng(0)
    if model == "resnet18":
        net = resnet18().train()
        x = mt.tensor(rng.standard_normal((batch, 3, size, size), dtype=np.float32))
        label = mt.tensor(rng.integers(0, 1000, batch).astype(np.int32))

        def loss_fn():
            return F.cross_entropy(net(x), label)
    else:
        net = MiniLM(dropout=0.0).train()
        ids = mt.tensor(rng.integers(1, 30522, (batch, size)).astype(np.int32))
        mask = mt.tensor(np.ones((batch, size), np.int32))

        def loss_fn():
            return net.hidden_states(ids, mask).mean()
    return loss_fn, list(net.parameters())


def run_mgtrace(model, batch, size, steps, threads):
    import mgtrace as mt
    from mgtrace.autodiff import GradManager
    from mgtrace.optimizer import SGD
    mt.set_num_threads(threads)
    loss_fn, params = build_mgtrace(model, batch, size)
    gm = GradManager().attach(params)
    opt = SGD(params, lr=1e-3, momentum=0.9)

    def step():
        with gm:
            gm.backward(loss_fn())
        opt.step().clear_grad()
    return _steps(step, steps)


def _torch_minilm(torch, vocab=30522, hidden=384, layers=6, heads=12, ff=1536):
    nn = torch.nn

    class Encoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.word = nn.Embedding(vocab, hidden)
            self.pos = nn.Embedding(512, hidden)
            self.norm = nn.LayerNorm(hidden, eps=1e-12)
            layer = nn.TransformerEncoderLayer(hidden, heads, ff, dropout=0.0, activation="gelu",
                                               batch_first=True, layer_norm_eps=1e-12)
            self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)

        def forward(self, ids):
            pos = torch.arange(ids.shape[1])[None]
            return self.encoder(self.norm(self.word(ids) + self.pos(pos)))
    return Encoder()


def build_torch(model, batch, size):
    import torch
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    if model == "resnet18":
        sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests", "models"))
        from torch_reference import TORCH_MODELS
        net = TORCH_MODELS["resnet18"](torch.nn).train()
        x = torch.from_numpy(rng.standard_normal((batch, 3, size, size), dtype=np.float32))
        label = torch.from_numpy(rng.integers(0, 1000, batch))

        def loss_fn():
            return torch.nn.functional.cross_entropy(net(x), label)
    else:
        net = _torch_minilm(torch).train()
        ids = torch.from_numpy(rng.integers(1, 30522, (batch, size)))

        def loss_fn():
            return net(ids).mean()
    return loss_fn, list(net.parameters())


def run_torch(model, batch, size, steps, threads):
    import torch
    torch.set_num_threads(threads)
    loss_fn, params = build_torch(model, batch, size)
    opt = torch.optim.SGD(params, lr=1e-3, momentum=0.9)

    def step():
        loss_fn().backward()
        opt.step()
        opt.zero_grad()
    return _steps(step, steps)


def child(args):
    if args.profile:
        import _train_profile as tp
        if args.child == "mgtrace":
            r = tp.profile_mgtrace(lambda: build_mgtrace(args.model, args.batch, args.size), args.steps, WARMUP)
        else:
            r = tp.profile_torch(lambda: build_torch(args.model, args.batch, args.size), args.steps, WARMUP)
        print(json.dumps(r))
        return
    fn = run_mgtrace if args.child == "mgtrace" else run_torch
    best, median = fn(args.model, args.batch, args.size, args.steps, args.threads)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024      # KiB -> MiB
    print(json.dumps({"best": best, "median": median, "rss_mib": rss}))


def measure(lib, model, batch, size, steps, threads, peer=sys.executable, profile=False):
    cmd = [peer if lib == "torch" else sys.executable, os.path.abspath(__file__), "--child", lib, "--model", model,
           "--batch", str(batch), "--size", str(size), "--steps", str(steps),
           "--threads", str(threads)] + (["--profile"] if profile else [])
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=_checkout.CHILD_CWD,
                       env=_checkout.child_env())
    if p.returncode != 0:
        if lib == "torch" and "No module named 'torch'" in p.stderr:
            return None
        raise RuntimeError(f"{lib} {model} failed:\n{p.stderr}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def profile(cases, steps, peer):
    """``--profile``: each model's per-category table (CPU s per step, one thread)."""
    import _train_profile as tp
    for model, batch, size in cases:
        what = f"{model} b{batch} " + (f"{size}x{size}" if model == "resnet18" else f"x {size}")
        print(f"{what}: CPU seconds per step at 1 thread (time.process_time), mean of {steps} "
              f"steps after {WARMUP} warm-up steps")
        mg = measure("mgtrace", model, batch, size, steps, 1, peer, profile=True)
        th = measure("torch", model, batch, size, steps, 1, peer, profile=True)
        tp.table(mg, th)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--full", action="store_true", help="ResNet-18 b8 at 224, MiniLM 8 x 128")
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--steps", type=int, default=None, help="timed steps (default 3, --full 5)")
    p.add_argument("--peer-python", default=sys.executable,
                   help="the Python that runs PyTorch's column (a venv with torch; default: this one)")
    p.add_argument("--profile", action="store_true",
                   help="per-op CPU seconds at one thread, mgtrace beside torch (see _train_profile.py)")
    p.add_argument("--models", default="resnet18,minilm", help="which models (comma separated)")
    p.add_argument("--child", choices=["mgtrace", "torch"], help=argparse.SUPPRESS)
    p.add_argument("--model", help=argparse.SUPPRESS)
    p.add_argument("--batch", type=int, help=argparse.SUPPRESS)
    p.add_argument("--size", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        return child(args)
    steps = args.steps or (5 if args.full else 3)
    cases = [("resnet18", 8, 224), ("minilm", 8, 128)] if args.full else \
        [("resnet18", 2, 64), ("minilm", 2, 32)]
    print(f"one training step (forward, backward, SGD), {args.threads} threads, "
          f"{steps} timed steps after {WARMUP} warm-up steps")
    print(f"{'model':<26}{'library':<9}{'best s':>9}{'median s':>10}{'peak RSS MiB':>14}")
    cases = [c for c in cases if c[0] in args.models.split(",")]
    if args.profile:
        return profile(cases, steps, args.peer_python)
    for model, batch, size in cases:
        what = f"{model} b{batch} " + (f"{size}x{size}" if model == "resnet18" else f"x {size}")
        for lib in ("mgtrace", "torch"):
            r = measure(lib, model, batch, size, steps, args.threads, args.peer_python)
            if r is None:
                print(f"{what:<26}{lib:<9}{'(torch not installed)':>33}")
                continue
            print(f"{what:<26}{lib:<9}{r['best']:>9.3f}{r['median']:>10.3f}{r['rss_mib']:>14.0f}")


if __name__ == "__main__":
    _checkout.use()
    main()
