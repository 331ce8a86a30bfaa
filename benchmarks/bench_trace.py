"""mgtrace.trace_module next to torch.fx: trace time, traced vs eager forward.

    python benchmarks/bench_trace.py              # short: about a minute on 2 idle cores
    python benchmarks/bench_trace.py --full       # more rounds, steadier numbers
    python benchmarks/bench_trace.py --threads 1
    python benchmarks/bench_trace.py --profile    # also cProfile one mgtrace trace per row
    python benchmarks/bench_trace.py --json       # also each child's JSON (medians too)

Rows (CASES below):

* ``resnet18 1x3x224x224``: ``mgtrace.models.resnet18``; the torch side is
  the torch.nn reference in tests/models/torch_reference.py, traced with
  ``torch.fx.symbolic_trace``.
* ``resnet18 1x3x32x32``: the same model traced on a 32x32 image. Shapes
  stay symbolic, so this graph is the one traced at 224x224 and runs at
  any size: tracing on a small example input is how to make tracing cheap.
* ``minilm 8x128``: ``mgtrace.models.minilm_l6_v2`` on 8 sentences through
  ``minilm_inputs``, padded to 128 tokens (input_ids and attention_mask
  8x128). The torch side is Hugging Face's ``BertModel`` of the same size
  traced with ``transformers.utils.fx.symbolic_trace`` when that imports
  (transformers < 5), otherwise ``TorchMiniLM`` below: a torch.nn BERT
  encoder with MiniLM's module tree and sizes (6 layers, hidden 384, 12
  heads, intermediate 1536) and the same mean pooling and L2
  normalisation, traced with ``torch.fx.symbolic_trace``; random weights,
  synthetic token ids with the same padding pattern (timing only).
* ``minilm 1x16``: the same models on one sentence padded to 16 tokens. The
  graph is the same as at 8x128 but the forward costs a few ms, so trace
  time minus one forward measures mgtrace's tracing overhead proper; at
  8x128 that difference is lost in the forward's own run-to-run noise.

mgtrace traces with real values, so its trace time includes one real
forward, while torch.fx traces symbolically and runs nothing: both the raw
trace time and the trace time minus the best eager forward are printed.

Each (library, row) runs in its own subprocess (no two thread pools in one
process); both libraries get the same thread count (default 2). Each timed
round calls the trace, the eager forward and the traced forward once (order
rotating), so that drift and load from elsewhere hit all three alike; every
time printed is the best over the rounds after warm-up (best is robust to
load spikes; medians are in ``--json``).

Columns:

* ``trace ms``: one ``mgtrace.trace_module(model, *inputs)``.
* ``-fwd ms``: trace ms minus the best eager forward (tracing overhead).
* ``fx ms``: one ``torch.fx.symbolic_trace`` (or HF's) of the torch model.
* ``trace/fx``, ``-fwd/fx``: the ratios (target: trace <= 3x torch.fx).
* ``eager ms``, ``traced ms``, ``traced/eager``: forward latency of the
  Module and of the TracedModule (target on resnet18 batch 1: <= 1.05);
  ``GM ms``, ``GM/eager``: the same for torch's fx GraphModule.
* ``max|d|``: max abs difference of the traced output from eager's (a
  sanity check).

Not a test: nothing is asserted here.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import _checkout

ROOT = _checkout.ROOT
_checkout.use()     # this checkout if it is built in place, else the installed mgtrace

# row name -> (model, input shape, (warm-up, timed) rounds quick, the same with --full);
# one round = one trace + one eager forward + one traced forward
CASES = {
    "resnet18 1x3x224x224": ("resnet18", (1, 3, 224, 224), (2, 20), (5, 100)),
    "resnet18 1x3x32x32": ("resnet18", (1, 3, 32, 32), (3, 30), (10, 150)),
    "minilm 8x128": ("minilm", (8, 128), (1, 5), (2, 20)),
    "minilm 1x16": ("minilm", (1, 16), (3, 30), (10, 150)),
}
SENTENCES = [
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The girl is carrying a baby.",
    "A man is riding a horse.",
    "A woman is playing violin.",
    "Two men pushed carts through the woods.",
    "A man is riding a white horse on an enclosed ground.",
    "A monkey is playing drums.",
]

TRACE_TARGET = 3.0
FORWARD_TARGET = 1.05


# ---------------------------------------------------------------- timing

def _rounds(fns, warmup, repeats):
    """{name: [seconds]}: each round calls every function once, the order
    rotating from round to round, so that drift and load spikes from
    elsewhere hit all of them alike."""
    names = list(fns)
    for _ in range(warmup):
        for n in names:
            fns[n]()
    times = {n: [] for n in names}
    for i in range(repeats):
        k = i % len(names)
        for n in names[k:] + names[:k]:
            t0 = time.perf_counter()
            fns[n]()
            times[n].append(time.perf_counter() - t0)
    return times


def _summary(times):
    return {"best_ms": min(times) * 1e3, "median_ms": statistics.median(times) * 1e3}


# ---------------------------------------------------------------- mgtrace side

def _build_mgtrace(model, shape):
    import numpy as np
    import mgtrace as mt
    import mgtrace.models as models
    if model == "resnet18":
        x = mt.tensor(np.random.default_rng(0).standard_normal(shape, dtype=np.float32))
        return models.resnet18().eval(), (x,)
    batch, seq = shape
    net = models.minilm_l6_v2().eval()
    tok = models.minilm_tokenizer()
    tok.enable_truncation(seq)
    tok.enable_padding(length=seq, pad_id=0, pad_token="[PAD]")
    ids, mask = models.minilm_inputs((SENTENCES * batch)[:batch], tok)
    return net, (ids, mask)


def child_mgtrace(model, shape, threads, warmup, repeats, profile):
    import numpy as np
    import mgtrace as mt
    mt.set_num_threads(threads)
    net, inputs = _build_mgtrace(model, shape)
    tm = mt.trace_module(net, *inputs)    # first-call costs (imports, caches) go here
    t = _rounds({"trace": lambda: mt.trace_module(net, *inputs), "eager": lambda: net(*inputs),
                 "traced": lambda: tm(*inputs)}, warmup, repeats)
    diff = float(np.abs(tm(*inputs).numpy() - net(*inputs).numpy()).max())
    res = {k: _summary(v) for k, v in t.items()}
    res.update({"max_abs_diff": diff, "threads": mt.get_num_threads(),
                "nodes": len(list(tm.graph.exprs(recursive=True)))})
    if profile:
        import cProfile
        import io
        import pstats
        prof = cProfile.Profile()
        prof.enable()
        mt.trace_module(net, *inputs)
        prof.disable()
        buf = io.StringIO()
        st = pstats.Stats(prof, stream=buf)
        st.sort_stats("tottime").print_stats(15)
        st.sort_stats("cumulative").print_stats(25)
        res["profile"] = buf.getvalue()
    return res


# ---------------------------------------------------------------- torch side

def _torch_minilm(nn):
    """A torch.nn BERT encoder with MiniLM's module tree and sizes, plus
    sentence-transformers' mean pooling and L2 normalisation (the same ops
    as mgtrace.models.MiniLM.forward). Written with size() calls rather than
    shape unpacking so that torch.fx.symbolic_trace goes through it."""
    import math
    import torch
    import torch.nn.functional as F

    class Embeddings(nn.Module):
        def __init__(self, vocab, hidden, positions, types, eps):
            super().__init__()
            self.word_embeddings = nn.Embedding(vocab, hidden, padding_idx=0)
            self.position_embeddings = nn.Embedding(positions, hidden)
            self.token_type_embeddings = nn.Embedding(types, hidden)
            self.LayerNorm = nn.LayerNorm(hidden, eps=eps)
            self.dropout = nn.Dropout(0.1)
            self.register_buffer("position_ids", torch.arange(positions)[None])

        def forward(self, input_ids):
            # narrow, not [:, :seq]: fx cannot slice a buffer by a Proxy
            positions = self.position_ids.narrow(1, 0, input_ids.size(1))
            token_types = torch.zeros_like(positions)
            h = (self.word_embeddings(input_ids) + self.position_embeddings(positions)
                 + self.token_type_embeddings(token_types))
            return self.dropout(self.LayerNorm(h))

    class SelfAttention(nn.Module):
        def __init__(self, hidden, heads):
            super().__init__()
            self.num_attention_heads = heads
            self.attention_head_size = hidden // heads
            self.query = nn.Linear(hidden, hidden)
            self.key = nn.Linear(hidden, hidden)
            self.value = nn.Linear(hidden, hidden)
            self.dropout = nn.Dropout(0.1)

        def _heads(self, x):
            return x.view(x.size(0), x.size(1), self.num_attention_heads,
                          self.attention_head_size).permute(0, 2, 1, 3)

        def forward(self, h, mask_bias):
            q, k, v = (self._heads(self.query(h)), self._heads(self.key(h)),
                       self._heads(self.value(h)))
            scores = (torch.matmul(q, k.transpose(-1, -2))
                      * (1.0 / math.sqrt(self.attention_head_size)))
            probs = self.dropout(torch.softmax(scores + mask_bias, dim=-1))
            ctx = torch.matmul(probs, v).permute(0, 2, 1, 3)
            return ctx.reshape(ctx.size(0), ctx.size(1),
                               self.num_attention_heads * self.attention_head_size)

    class AddNorm(nn.Module):          # BertSelfOutput / BertOutput
        def __init__(self, d_in, hidden, eps):
            super().__init__()
            self.dense = nn.Linear(d_in, hidden)
            self.LayerNorm = nn.LayerNorm(hidden, eps=eps)
            self.dropout = nn.Dropout(0.1)

        def forward(self, x, residual):
            return self.LayerNorm(self.dropout(self.dense(x)) + residual)

    class Attention(nn.Module):
        def __init__(self, hidden, heads, eps):
            super().__init__()
            self.self = SelfAttention(hidden, heads)
            self.output = AddNorm(hidden, hidden, eps)

        def forward(self, h, mask_bias):
            return self.output(self.self(h, mask_bias), h)

    class Intermediate(nn.Module):
        def __init__(self, hidden, intermediate):
            super().__init__()
            self.dense = nn.Linear(hidden, intermediate)
            self.intermediate_act_fn = nn.GELU()

        def forward(self, h):
            return self.intermediate_act_fn(self.dense(h))

    class Layer(nn.Module):
        def __init__(self, hidden, heads, intermediate, eps):
            super().__init__()
            self.attention = Attention(hidden, heads, eps)
            self.intermediate = Intermediate(hidden, intermediate)
            self.output = AddNorm(intermediate, hidden, eps)

        def forward(self, h, mask_bias):
            a = self.attention(h, mask_bias)
            return self.output(self.intermediate(a), a)

    class Encoder(nn.Module):
        def __init__(self, layers, hidden, heads, intermediate, eps):
            super().__init__()
            self.layer = nn.ModuleList([Layer(hidden, heads, intermediate, eps)
                                        for _ in range(layers)])

        def forward(self, h, mask_bias):
            for layer in self.layer:
                h = layer(h, mask_bias)
            return h

    class TorchMiniLM(nn.Module):
        def __init__(self, vocab=30522, hidden=384, layers=6, heads=12, intermediate=1536,
                     positions=512, types=2, eps=1e-12):
            super().__init__()
            self.embeddings = Embeddings(vocab, hidden, positions, types, eps)
            self.encoder = Encoder(layers, hidden, heads, intermediate, eps)

        def forward(self, input_ids, attention_mask):
            mask = attention_mask.float()
            mask_bias = ((1.0 - mask) * torch.finfo(torch.float32).min).view(
                input_ids.size(0), 1, 1, input_ids.size(1))
            h = self.encoder(self.embeddings(input_ids), mask_bias)
            m = mask.unsqueeze(-1)
            summed = (h * m).sum(1)
            counts = torch.clamp(m.sum(1), min=1e-9)
            return F.normalize(summed / counts, dim=-1)

    return TorchMiniLM()


def _minilm_torch_inputs(torch, shape):
    batch, seq = shape
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1000, 30522, (batch, seq), generator=g)
    mask = torch.zeros((batch, seq), dtype=torch.int64)
    for i in range(batch):                  # sentence lengths 8..15 tokens, then padding
        n = min(8 + i % 8, seq)
        mask[i, :n] = 1
        ids[i, 0], ids[i, n - 1] = 101, 102   # [CLS] ... [SEP]
    return ids * mask, mask


def _build_torch(model, shape):
    """(module, inputs, trace function, label)."""
    import torch
    import torch.fx
    if model == "resnet18":
        sys.path.insert(0, os.path.join(ROOT, "tests", "models"))
        import torch_reference   # torch.nn models with torchvision's names (no mgtrace import)
        net = torch_reference.TORCH_MODELS["resnet18"](torch.nn).eval()
        return net, (torch.randn(shape),), torch.fx.symbolic_trace, "torch.fx, torch_reference"
    ids, mask = _minilm_torch_inputs(torch, shape)
    try:
        from transformers.utils.fx import symbolic_trace as hf_trace
        from transformers import BertConfig, BertModel
    except ImportError:
        net = _torch_minilm(torch.nn).eval()
        return net, (ids, mask), torch.fx.symbolic_trace, "torch.fx, TorchMiniLM"
    net = BertModel(BertConfig(vocab_size=30522, hidden_size=384, num_hidden_layers=6,
                               num_attention_heads=12, intermediate_size=1536),
                    add_pooling_layer=False).eval()

    def trace(m):
        return hf_trace(m, input_names=["input_ids", "attention_mask"])

    return net, (ids, mask), trace, "HF fx, BertModel (no pooling)"


def _first_tensor(out):
    if hasattr(out, "last_hidden_state"):
        return out.last_hidden_state
    if isinstance(out, dict):
        return out["last_hidden_state"]
    if isinstance(out, (tuple, list)):
        return out[0]
    return out


def child_torch(model, shape, threads, warmup, repeats, profile):
    import torch
    torch.set_num_threads(threads)
    torch.set_grad_enabled(False)
    net, inputs, trace, label = _build_torch(model, shape)
    gm = trace(net)
    t = _rounds({"trace": lambda: trace(net), "eager": lambda: net(*inputs),
                 "traced": lambda: gm(*inputs)}, warmup, repeats)
    diff = float((_first_tensor(gm(*inputs)) - _first_tensor(net(*inputs))).abs().max())
    res = {k: _summary(v) for k, v in t.items()}
    res.update({"max_abs_diff": diff, "threads": torch.get_num_threads(), "label": label,
                "nodes": len(gm.graph.nodes)})
    return res


# ---------------------------------------------------------------- driver

def run_child(lib, row, args):
    model, shape, quick, full = CASES[row]
    warmup, repeats = full if args.full else quick
    cmd = [sys.executable, os.path.abspath(__file__), "--child", lib, model,
           "x".join(map(str, shape)), "--threads", str(args.threads), "--warmup", str(warmup),
           "--repeats", str(repeats)] + (["--profile"] if args.profile else [])
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=_checkout.CHILD_CWD)
    if proc.returncode != 0:
        lines = proc.stderr.strip().splitlines()
        return {"error": lines[-1] if lines else "failed"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def torch_available():
    return subprocess.run([sys.executable, "-c", "import torch"],
                          capture_output=True).returncode == 0


def _ok(r):
    return r is not None and "error" not in r


def print_tables(results, libs):
    w = max(map(len, CASES))
    # ---- trace time
    head = f"{'row':{w}s} | {'trace ms':>8s} {'-fwd ms':>8s}"
    if "torch" in libs:
        head += f" | {'fx ms':>7s} {'trace/fx':>8s} {'-fwd/fx':>8s} | torch side"
    print("\ntrace time (mgtrace runs one real forward while tracing: -fwd subtracts the best "
          "eager forward)")
    print(head)
    print("-" * len(head))
    for row in CASES:
        m, t = results[row, "mgtrace"], results.get((row, "torch"))
        line = f"{row:{w}s} | "
        tr = over = None
        if _ok(m):
            tr = m["trace"]["best_ms"]
            over = tr - m["eager"]["best_ms"]
            line += f"{tr:8.1f} {over:8.1f}"
        else:
            line += f"error: {m['error'][:70]}"
        if "torch" in libs:
            if _ok(t):
                fx = t["trace"]["best_ms"]
                line += f" | {fx:7.1f}"
                line += f" {tr / fx:7.2f}x" if tr is not None else f" {'-':>8s}"
                line += f" {over / fx:7.2f}x" if over is not None else f" {'-':>8s}"
                line += f" | {t['label']}"
            else:
                line += f" | error: {t['error'][:70]}"
        print(line)

    # ---- forward latency
    head = (f"{'row':{w}s} | {'eager ms':>8s} {'traced ms':>9s} {'traced/eager':>12s} "
            f"{'max|d|':>7s}")
    if "torch" in libs:
        head += f" | {'eager ms':>8s} {'GM ms':>7s} {'GM/eager':>8s} {'max|d|':>7s}"
    print("\nforward latency: mgtrace Module vs TracedModule"
          + (" | torch nn.Module vs fx GraphModule" if "torch" in libs else ""))
    print(head)
    print("-" * len(head))
    for row in CASES:
        line = f"{row:{w}s}"
        for lib in libs:
            r = results[row, lib]
            if not _ok(r):
                line += f" | error: {r['error'][:70]}"
                continue
            e, tr = r["eager"]["best_ms"], r["traced"]["best_ms"]
            if lib == "mgtrace":
                line += f" | {e:8.1f} {tr:9.1f} {tr / e:11.3f}x {r['max_abs_diff']:7.0e}"
            else:
                line += f" | {e:8.1f} {tr:7.1f} {tr / e:7.3f}x {r['max_abs_diff']:7.0e}"
        print(line)

    # ---- targets (reported, not asserted)
    print()
    row = "resnet18 1x3x224x224"
    m = results[row, "mgtrace"]
    if _ok(m):
        ratio = m["traced"]["best_ms"] / m["eager"]["best_ms"]
        print(f"target traced/eager <= {FORWARD_TARGET} on {row}: {ratio:.3f} "
              f"({'met' if ratio <= FORWARD_TARGET else 'MISSED'})")
    if "torch" not in libs:
        return
    for row in CASES:
        m, t = results[row, "mgtrace"], results[row, "torch"]
        if _ok(m) and _ok(t):
            fx = t["trace"]["best_ms"]
            raw = m["trace"]["best_ms"] / fx
            net = (m["trace"]["best_ms"] - m["eager"]["best_ms"]) / fx
            print(f"target trace <= {TRACE_TARGET:g}x torch.fx on {row}: {raw:.2f}x "
                  f"({'met' if raw <= TRACE_TARGET else 'MISSED'}); less one forward "
                  f"{net:.2f}x ({'met' if net <= TRACE_TARGET else 'MISSED'}); "
                  f"{m['nodes']} mgtrace exprs (recursive) vs {t['nodes']} fx nodes")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--full", action="store_true", help="more warm-up and timed rounds")
    ap.add_argument("--threads", type=int, default=2,
                    help="threads for both libraries (default 2)")
    ap.add_argument("--profile", action="store_true",
                    help="cProfile one mgtrace trace per row and print the top functions")
    ap.add_argument("--json", action="store_true", help="also print each child's JSON")
    ap.add_argument("--child", nargs=3, metavar=("LIB", "MODEL", "SHAPE"), help=argparse.SUPPRESS)
    ap.add_argument("--warmup", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--repeats", type=int, default=5, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        lib, model, shape = args.child
        fn = child_mgtrace if lib == "mgtrace" else child_torch
        print(json.dumps(fn(model, tuple(int(n) for n in shape.split("x")), args.threads,
                            args.warmup, args.repeats, args.profile)))
        return
    libs = ["mgtrace"] + (["torch"] if torch_available() else [])
    print(f"threads {args.threads}; (warm-up, timed) rounds: "
          + ", ".join(f"{row} {c[3] if args.full else c[2]}" for row, c in CASES.items())
          + "; a round = one trace + one eager + one traced forward; best of the rounds; "
          "one subprocess per library and row"
          + ("" if "torch" in libs else "; torch not importable: no torch.fx columns"),
          flush=True)
    results = {(row, lib): run_child(lib, row, args) for row in CASES for lib in libs}
    print_tables(results, libs)
    if args.json:
        for (row, lib), r in results.items():
            print(json.dumps({"row": row, "lib": lib,
                              **{k: v for k, v in r.items() if k != "profile"}}))
    if args.profile:
        for row in CASES:
            r = results[row, "mgtrace"]
            if _ok(r) and "profile" in r:
                print(f"\n==== cProfile of one mgtrace.trace_module, {row} ====")
                print(r["profile"])


if __name__ == "__main__":
    main()
