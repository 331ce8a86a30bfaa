"""mgtrace's CUDA backend next to its CPU kernels and PyTorch CUDA (when installed).

Rows (issue 15's targets in brackets, as mgtrace / PyTorch):
  add, copy      float32, N elements (default 256M): GB/s counting bytes read
                 and written                                  [>= 0.85]
  sum            float32 over N elements: GB/s read           [>= 0.85]
  sgemm, bf16    8192^3 GEMM: TFLOP/s (float32 without TF32)  [>= 0.90]
  resnet18       batch 64 x 3 x 224 x 224 forward: ms         [<= 1.5x]
  minilm         batch 64 x 128 tokens forward (6 layers): ms [<= 1.5x]

Times are medians of timed repeats, each ending with a device
synchronisation. The CPU column (mgtrace on cpu:0) is skipped for the
GEMMs and with --no-cpu; --quick shrinks every size (a smoke test).

    python benchmarks/bench_cuda.py                  # on a GPU machine
    python benchmarks/bench_cuda.py --quick --json out.json
"""
import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import time

import numpy as np

import _checkout

_checkout.use()     # this checkout if it is built in place, else the installed mgtrace


def timed(fn, sync, repeats, min_time=0.2):
    """Median seconds per call (calls batched to last about min_time/5)."""
    fn()
    sync()
    n = 1
    while True:
        t = time.perf_counter()
        for _ in range(n):
            fn()
        sync()
        dt = time.perf_counter() - t
        if dt >= min_time / 5 or n >= 1024:
            break
        n *= 4
    samples = []
    for _ in range(repeats):
        t = time.perf_counter()
        for _ in range(n):
            fn()
        sync()
        samples.append((time.perf_counter() - t) / n)
    return statistics.median(samples)


class Mgtrace:
    name = "mgtrace"

    def __init__(self, device):
        import mgtrace as mt
        import mgtrace.functional as F
        self.mt, self.F, self.device = mt, F, device

    def sync(self):
        if self.device.startswith("cuda"):
            self.mt.cuda.synchronize(self.device)

    def array(self, a):
        return self.mt.tensor(a, device=self.device)

    def rows(self, args, rng):
        mt, F = self.mt, self.F
        n = args.n
        x = self.array(np.ones(n, np.float32))
        y = self.array(np.full(n, 2.0, np.float32))
        out = {}
        t = timed(lambda: x + y, self.sync, args.repeats)
        out["add"] = 3 * 4 * n / t / 1e9
        t = timed(lambda: x.copy(), self.sync, args.repeats)
        out["copy"] = 2 * 4 * n / t / 1e9
        t = timed(lambda: x.sum(), self.sync, args.repeats)
        out["sum"] = 4 * n / t / 1e9
        del x, y
        if self.device.startswith("cuda") or args.cpu_gemm:
            k = args.gemm
            a = self.array(rng.standard_normal((k, k)).astype(np.float32))
            b = self.array(rng.standard_normal((k, k)).astype(np.float32))
            t = timed(lambda: F.matmul(a, b), self.sync, args.repeats)
            out["sgemm"] = 2 * k ** 3 / t / 1e12
            a, b = a.astype("bfloat16"), b.astype("bfloat16")
            t = timed(lambda: F.matmul(a, b), self.sync, args.repeats)
            out["bf16 gemm"] = 2 * k ** 3 / t / 1e12
            del a, b
        from mgtrace.models import MiniLM, resnet18
        net = resnet18().eval().to(self.device)
        img = self.array(rng.standard_normal((args.batch, 3, args.image, args.image)).astype(np.float32))
        out["resnet18"] = timed(lambda: net(img), self.sync, max(3, args.repeats // 2)) * 1e3
        del net, img
        enc = MiniLM().eval().to(self.device)
        ids = self.array(rng.integers(1, 30000, (args.batch, args.seq)).astype(np.int32))
        mask = self.array(np.ones((args.batch, args.seq), np.int32))
        out["minilm"] = timed(lambda: enc(ids, mask), self.sync, max(3, args.repeats // 2)) * 1e3
        return out


class Torch:
    name = "torch"

    def __init__(self, torch):
        self.torch = torch

    def sync(self):
        self.torch.cuda.synchronize()

    def rows(self, args, rng):
        torch = self.torch
        n, dev = args.n, "cuda"
        out = {}
        with torch.inference_mode():
            x = torch.ones(n, device=dev)
            y = torch.full((n,), 2.0, device=dev)
            out["add"] = 3 * 4 * n / timed(lambda: x + y, self.sync, args.repeats) / 1e9
            out["copy"] = 2 * 4 * n / timed(lambda: x.clone(), self.sync, args.repeats) / 1e9
            out["sum"] = 4 * n / timed(lambda: x.sum(), self.sync, args.repeats) / 1e9
            del x, y
            torch.backends.cuda.matmul.allow_tf32 = False
            k = args.gemm
            a = torch.randn(k, k, device=dev)
            b = torch.randn(k, k, device=dev)
            out["sgemm"] = 2 * k ** 3 / timed(lambda: a @ b, self.sync, args.repeats) / 1e12
            a, b = a.bfloat16(), b.bfloat16()
            out["bf16 gemm"] = 2 * k ** 3 / timed(lambda: a @ b, self.sync, args.repeats) / 1e12
            del a, b
            net = _torch_resnet18(torch)
            if net is not None:
                net = net.eval().to(dev)
                img = torch.randn(args.batch, 3, args.image, args.image, device=dev)
                out["resnet18"] = timed(lambda: net(img), self.sync, max(3, args.repeats // 2)) * 1e3
                del net, img
            enc = _torch_minilm(torch)
            if enc is not None:
                enc = enc.eval().to(dev)
                ids = torch.randint(1, 30000, (args.batch, args.seq), device=dev)
                mask = torch.ones(args.batch, args.seq, dtype=torch.long, device=dev)
                out["minilm"] = timed(lambda: enc(input_ids=ids, attention_mask=mask),
                                      self.sync, max(3, args.repeats // 2)) * 1e3
        return out


def _torch_resnet18(torch):
    try:
        import torchvision
        return torchvision.models.resnet18()
    except ImportError:
        sys.path.insert(0, os.path.join(_checkout.ROOT, "tests", "models"))
        try:
            from torch_reference import TORCH_MODELS      # torchvision's layout, in plain torch
            return TORCH_MODELS["resnet18"](torch.nn)
        except Exception:
            return None


def _torch_minilm(torch):
    try:
        from transformers import BertConfig, BertModel
    except ImportError:
        return None
    return BertModel(BertConfig(vocab_size=30522, hidden_size=384, num_hidden_layers=6,
                                num_attention_heads=12, intermediate_size=1536))


UNITS = {"add": "GB/s", "copy": "GB/s", "sum": "GB/s", "sgemm": "TFLOP/s", "bf16 gemm": "TFLOP/s",
         "resnet18": "ms", "minilm": "ms"}
LOWER_IS_BETTER = {"resnet18", "minilm"}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="small sizes: a smoke test of the script")
    p.add_argument("--no-cpu", action="store_true", help="skip mgtrace on the CPU")
    p.add_argument("--no-torch", action="store_true", help="skip PyTorch")
    p.add_argument("--cpu-gemm", action="store_true", help="also time the 8192^3 GEMMs on the CPU")
    p.add_argument("--device", default="cuda:0")
    p.add_argument("--json", metavar="FILE", help="also write the results here")
    args = p.parse_args(argv)
    args.n = (1 << 20) if args.quick else (256 << 20)
    args.gemm = 256 if args.quick else 8192
    args.batch, args.image, args.seq = (2, 64, 16) if args.quick else (64, 224, 128)
    args.repeats = 3 if args.quick else 7
    import mgtrace as mt
    rng = np.random.default_rng(0)
    results, notes = {}, []
    if mt.cuda.is_available():
        notes.append(f"device: {args.device} {mt.cuda.get_device_name(args.device)}")
        results["mgtrace cuda"] = Mgtrace(args.device).rows(args, rng)
    else:
        notes.append(f"no CUDA device: {mt.cuda.load_error()}")
    if not args.no_cpu:
        results["mgtrace cpu"] = Mgtrace("cpu").rows(args, rng)
    if not args.no_torch:
        try:
            import torch
            if torch.cuda.is_available():
                notes.append(f"torch {torch.__version__} on {torch.cuda.get_device_name()} (eager; "
                             f"matmul without TF32, cudnn.allow_tf32={torch.backends.cudnn.allow_tf32} "
                             "as PyTorch defaults it)")
                results["torch cuda"] = Torch(torch).rows(args, rng)
            else:
                notes.append(f"torch {torch.__version__} sees no CUDA device")
        except ImportError:
            notes.append("torch not installed")
    cols = list(results)
    print(f"# bench_cuda {datetime.datetime.now().isoformat(timespec='seconds')} "
          f"{platform.node()} mgtrace {mt.__version__}")
    for n in notes:
        print(f"# {n}")
    head = f"{'row':<10} {'unit':<8}" + "".join(f"{c:>14}" for c in cols)
    if "mgtrace cuda" in results and "torch cuda" in results:
        head += f"{'cuda/torch':>12}"
    print(head)
    for row, unit in UNITS.items():
        line = f"{row:<10} {unit:<8}"
        for c in cols:
            v = results[c].get(row)
            line += f"{v:>14.3f}" if v is not None else f"{'-':>14}"
        g, t = results.get("mgtrace cuda", {}).get(row), results.get("torch cuda", {}).get(row)
        if g and t:
            line += f"{(t / g if row in LOWER_IS_BETTER else g / t):>12.2f}"
        print(line)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"date": datetime.datetime.now().isoformat(timespec="seconds"), "notes": notes,
                       "units": UNITS, "results": results, "quick": args.quick}, f, indent=1)


if __name__ == "__main__":
    main()
