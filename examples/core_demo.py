"""The tensor core on its own: a small CNN and an attention block written
with the core's ops, each checked against a NumPy reference. Exits non-zero
on a mismatch. (The main job, tracing and archives, is `mgtrace demo`.)
"""
import math
import sys
import time

import numpy as np

import mgtrace as mt
from mgtrace._core import dispatch, nn, reduce

relu = dispatch.unary_ops["relu"]


def np_conv2d(x, w, pad):
    """Direct NumPy reference: sliding windows and einsum."""
    n, c, h, wd = x.shape
    o, _, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    win = np.lib.stride_tricks.sliding_window_view(xp, (kh, kw), axis=(2, 3))
    return np.einsum("nchwij,ocij->nohw", win, w, optimize=True)


def cnn(x, p):
    y = relu(nn.conv2d(x, p["w1"], p["b1"], padding=1))
    y = nn.max_pool2d(y, 2)
    y = relu(nn.conv2d(y, p["w2"], p["b2"], padding=1))
    y = nn.adaptive_avg_pool2d(y, 1).reshape(x.shape[0], -1)
    return reduce.softmax(y @ p["fc"].T, axis=-1)


def np_cnn(x, p):
    y = np.maximum(np_conv2d(x, p["w1"], 1) + p["b1"][:, None, None], 0)
    n, c, h, w = y.shape
    y = y.reshape(n, c, h // 2, 2, w // 2, 2).max(axis=(3, 5))
    y = np.maximum(np_conv2d(y, p["w2"], 1) + p["b2"][:, None, None], 0)
    logits = y.mean(axis=(2, 3)) @ p["fc"].T
    e = np.exp(logits - logits.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def attention(x, p, heads):
    b, s, d = x.shape
    q, k, v = ((x @ p[n]).reshape(b, s, heads, d // heads).transpose(0, 2, 1, 3) for n in ("wq", "wk", "wv"))
    att = reduce.softmax(q @ k.transpose(0, 1, 3, 2) * (1.0 / math.sqrt(d // heads)), axis=-1)
    return (att @ v).transpose(0, 2, 1, 3).reshape(b, s, d)


def np_attention(x, p, heads):
    b, s, d = x.shape
    q, k, v = ((x @ p[n]).reshape(b, s, heads, d // heads).transpose(0, 2, 1, 3) for n in ("wq", "wk", "wv"))
    logits = q @ k.transpose(0, 1, 3, 2) * np.float32(1.0 / math.sqrt(d // heads))
    e = np.exp(logits - logits.max(-1, keepdims=True))
    return ((e / e.sum(-1, keepdims=True)) @ v).transpose(0, 2, 1, 3).reshape(b, s, d)


def check(name, got, want, tol):
    err = float(np.max(np.abs(got.numpy() - want)))
    print(f"{name:<28} max |mgtrace - numpy| = {err:.2e}  (tolerance {tol:g})")
    return err <= tol


def main():
    rng = np.random.default_rng(0)
    params = {"w1": rng.standard_normal((16, 3, 3, 3)) * 0.3, "b1": rng.standard_normal(16) * 0.1,
              "w2": rng.standard_normal((32, 16, 3, 3)) * 0.1, "b2": rng.standard_normal(32) * 0.1,
              "fc": rng.standard_normal((10, 32)) * 0.5}
    params = {k: v.astype(np.float32) for k, v in params.items()}
    x = rng.standard_normal((4, 3, 32, 32)).astype(np.float32)
    tparams = {k: mt.tensor(v) for k, v in params.items()}
    t = time.perf_counter()
    out = cnn(mt.tensor(x), tparams)
    dt = time.perf_counter() - t
    print(f"CNN forward on {x.shape} -> {out.shape} {out.dtype} in {dt * 1e3:.1f} ms")
    ok = check("CNN probabilities", out, np_cnn(x, params), 1e-4)

    heads, d = 4, 64
    aparams = {n: (rng.standard_normal((d, d)) / np.sqrt(d)).astype(np.float32) for n in ("wq", "wk", "wv")}
    h = rng.standard_normal((2, 16, d)).astype(np.float32)
    t = time.perf_counter()
    att = attention(mt.tensor(h), {k: mt.tensor(v) for k, v in aparams.items()}, heads)
    dt = time.perf_counter() - t
    print(f"attention on {h.shape}, {heads} heads -> {att.shape} {att.dtype} in {dt * 1e3:.1f} ms")
    ok &= check("attention output", att, np_attention(h, aparams, heads), 1e-4)
    print("OK" if ok else "MISMATCH")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
