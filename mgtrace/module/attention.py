"""MultiHeadAttention: MegEngine's builtin module over
:func:`mgtrace.functional.multi_head_attention` (the core's fused attention
kernel for the scores)."""
import math

import numpy as np

import mgtrace.functional as F
from mgtrace._core import args as A
from mgtrace.module import init
from mgtrace.module.builtin import _builtin, _empty_param
from mgtrace.module.module import Module

__all__ = ["MultiHeadAttention"]


@_builtin
class MultiHeadAttention(Module):
    """Multi-head attention (MegEngine's MultiHeadAttention), batch first.

    Args (MegEngine's):
        embed_dim: E, the size of the query's features and of the output.
        num_heads: dividing E.
        attn_dropout, out_dropout: dropout on the attention weights and the
            output, in training.
        bias: learn the four projection biases.
        add_bias_kv: learn ``bias_k`` and ``bias_v`` [1, 1, E], appended to
            the projected keys and values.
        add_zero_attn: append a zero key and value.
        kdim, vdim: the key's and value's feature sizes (default E).

    Parameter ``io_weight_bias`` [1, (E + kdim + vdim + E) * E (+ 4E)]:
    MegEngine's packed layout, the query, key, value and output projection
    weights each [in, E] (``Y = X @ W``, PyTorch's ``in_proj_weight``
    blocks and ``out_proj.weight`` transposed), then the four biases.
    Initialised as MegEngine's: xavier-uniform weights, zero biases.

    forward(query [N, L, E], key [N, S, kdim], value [N, S, vdim],
    key_padding_mask=None, attn_mask=None, need_weights=False,
    average_attn_weights=False, is_causal=False) -> (out [N, L, E],
    weights or None), as :func:`mgtrace.functional.multi_head_attention`.

    Raises:
        ValueError: num_heads not dividing embed_dim; in forward, as the
            function.
    """

    def __init__(self, embed_dim, num_heads, attn_dropout=0.0, out_dropout=0.0, bias=True,
                 add_bias_kv=False, add_zero_attn=False, kdim=None, vdim=None):
        super().__init__()
        fn = "MultiHeadAttention"
        self.embed_dim = A.to_size(fn, "embed_dim", embed_dim, 1)
        self.num_heads = A.to_size(fn, "num_heads", num_heads, 1)
        if self.embed_dim % self.num_heads:
            raise ValueError(f"{fn}: embed_dim ({self.embed_dim}) must be divisible by "
                             f"num_heads ({self.num_heads})")
        self.attn_dropout = A.probability(fn, "attn_dropout", attn_dropout)
        self.out_dropout = A.probability(fn, "out_dropout", out_dropout)
        self.bias = A.to_bool(fn, "bias", bias)
        self.add_bias_kv = A.to_bool(fn, "add_bias_kv", add_bias_kv)
        self.add_zero_attn = A.to_bool(fn, "add_zero_attn", add_zero_attn)
        self.kdim = self.embed_dim if kdim is None else A.to_size(fn, "kdim", kdim, 1)
        self.vdim = self.embed_dim if vdim is None else A.to_size(fn, "vdim", vdim, 1)
        e = self.embed_dim
        n = (e + self.kdim + self.vdim + e) * e + (4 * e if self.bias else 0)
        self.io_weight_bias = _empty_param((1, n))
        if self.add_bias_kv:
            self.bias_k = _empty_param((1, 1, e))
            self.bias_v = _empty_param((1, 1, e))
        else:
            self.register_parameter("bias_k", None)
            self.register_parameter("bias_v", None)
        self.reset_parameters()

    def reset_parameters(self):
        e = self.embed_dim
        n_w = (e + self.kdim + self.vdim + e) * e
        # MegEngine's xavier_uniform of the [1, n] packed tensor: fan_in 1, fan_out n
        bound = math.sqrt(6.0 / (1 + self.io_weight_bias.shape[1]))
        init.uniform_(self.io_weight_bias, -bound, bound)
        if self.bias:
            self.io_weight_bias[0, n_w:] = 0
        for t in (self.bias_k, self.bias_v):
            if t is not None:
                init.xavier_uniform_(t)

    def config(self):
        return {"embed_dim": self.embed_dim, "num_heads": self.num_heads,
                "attn_dropout": self.attn_dropout, "out_dropout": self.out_dropout,
                "bias": self.bias, "add_bias_kv": self.add_bias_kv,
                "add_zero_attn": self.add_zero_attn, "kdim": self.kdim, "vdim": self.vdim}

    def extra_repr(self):
        return (f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, kdim={self.kdim}, "
                f"vdim={self.vdim}, bias={self.bias}")

    def forward(self, query, key, value, key_padding_mask=None, attn_mask=None,
                need_weights=False, average_attn_weights=False, is_causal=False):
        return F.multi_head_attention(
            query, key, value, self.embed_dim, self.num_heads, self.attn_dropout,
            self.out_dropout, self.io_weight_bias, qbias=self.bias, kbias=self.bias,
            vbias=self.bias, obias=self.bias, bias_k=self.bias_k, bias_v=self.bias_v,
            add_zero_attn=self.add_zero_attn, key_padding_mask=key_padding_mask,
            attn_mask=attn_mask, need_weights=need_weights,
            average_attn_weights=average_attn_weights, is_causal=is_causal,
            training=self.training)
