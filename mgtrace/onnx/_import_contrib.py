"""ONNX Runtime's ``com.microsoft`` ops that :func:`mgtrace.onnx.load`
imports: :data:`CONTRIB` (``"com.microsoft.<op>"`` -> importer, the
signature of :data:`mgtrace.onnx._ops.IMPORTERS`).

``Attention`` (what ORT's transformer optimizer fuses BERT's self-attention
into): ``qkv = x @ weights + bias`` split into Q, K, V (``qkv_hidden_sizes``
or three equal parts), heads of ``hidden / num_heads``, ``softmax(Q K^T *
scale + mask) V`` with ORT's masks: none, ``mask_index`` as right-padding
lengths [B] or a raw 0/1 mask [B, S] (masked positions get
``mask_filter_value``, -10000 by default), and ``unidirectional`` (causal).
``past`` / ``present``, ``attention_bias``, rotary embeddings and the other
mask layouts are refused, naming the node.
"""
import math

import numpy as np

import mgtrace as mt
import mgtrace.functional as F

__all__ = ["CONTRIB"]


def _err(node, msg):
    from mgtrace.onnx._ops import _err as err
    return err(node, msg)


def _t(v):
    return v if isinstance(v, mt.Tensor) else mt.tensor(np.asarray(v))


def _attention(node, ins, a, opset):
    ins = list(ins) + [None] * (7 - len(ins))
    x, w, bias, mask = ins[0], ins[1], ins[2], ins[3]
    if any(v is not None for v in ins[4:]) or len(node.output) > 1 and any(node.output[1:]):
        raise _err(node, "past / present state and attention_bias have no mgtrace form here")
    for key in ("do_rotary", "past_present_share_buffer"):
        if a.get(key, 0):
            raise _err(node, f"{key}=1 has no mgtrace form here")
    heads = int(a["num_heads"])
    x, w = _t(x), _t(w)
    if x.ndim != 3 or w.ndim != 2:
        raise _err(node, f"input [B, S, H] and weights [H, 3H'] expected, got {x.shape} and "
                         f"{w.shape}")
    sizes = [int(s) for s in a.get("qkv_hidden_sizes", [])] or [int(w.shape[1]) // 3] * 3
    if sum(sizes) != int(w.shape[1]) or sizes[0] != sizes[1] or \
            any(s % heads for s in sizes):
        raise _err(node, f"qkv_hidden_sizes {sizes} do not split weights {tuple(w.shape)} "
                         f"into {heads} heads")
    qkv = F.matmul(x, w)
    if bias is not None:
        qkv = qkv + _t(bias)
    b, s = x.shape[0], x.shape[1]
    q, k, v = (qkv[:, :, lo:lo + n] for lo, n in zip((0, sizes[0], sizes[0] + sizes[1]),
                                                      sizes))

    def split_heads(t, n):
        return t.reshape(b, s, heads, n // heads).transpose(0, 2, 1, 3)
    q, k, v = split_heads(q, sizes[0]), split_heads(k, sizes[1]), split_heads(v, sizes[2])
    scale = a.get("scale") or 1.0 / math.sqrt(sizes[0] // heads)
    scores = F.matmul(q, k, transpose_b=True) * float(scale)         # [B, heads, S, S]
    fill = float(a.get("mask_filter_value", -10000.0))
    if mask is not None:
        mask = _t(mask)
        if mask.ndim == 2:                  # raw 0/1 mask [B, S]
            keep = mask.astype("float32").reshape(b, 1, 1, s)
        elif mask.ndim == 1:                # right-padding lengths [B]
            pos = F.arange(0, s, dtype="int32").reshape(1, s)
            keep = (pos < mask.astype("int32").reshape(b, 1)).astype("float32")
            keep = keep.reshape(b, 1, 1, s)
        else:
            raise _err(node, f"a {mask.ndim}-d mask_index has no mgtrace form here (lengths "
                             f"[B] and raw masks [B, S] import)")
        scores = scores + (1.0 - keep) * fill
    if a.get("unidirectional", 0):
        row = F.arange(0, s, dtype="int32").reshape(s, 1)
        col = F.arange(0, s, dtype="int32").reshape(1, s)
        scores = F.where(col > row, F.full_like(scores, fill), scores)
    out = F.matmul(F.softmax(scores, axis=-1), v)                   # [B, heads, S, Hv/heads]
    return [out.transpose(0, 2, 1, 3).reshape(b, s, sizes[2])]


CONTRIB = {"com.microsoft.Attention": _attention}
