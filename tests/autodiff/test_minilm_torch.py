"""MiniLM (mgtrace.models.MiniLM, BERT's encoder) parameter gradients
against PyTorch's: a BERT written here in torch.nn with the same parameter
names, loaded with the same seeded random weights, the same token ids and
attention mask (padding included), the gradient of the same weighted sum
of the last hidden states. Skips without torch.

float64 (a small configuration): every gradient within 1e-9 of its scale
(the largest magnitude). float32 (MiniLM-L6's own sizes): within 1e-4 of
the scale, the issue's bound; float32 rounding through six post-norm
layers is what is left. The scale is floored at 1e-6 (float64) or 1e-3
(float32) of the model's largest gradient: the key projections' bias
gradient is exactly 0 (softmax ignores a shift shared by a row's scores),
so on both sides it is rounding alone."""
import math

import numpy as np
import pytest

import mgtrace as mt
import mgtrace.module as M
from mgtrace.autodiff import GradManager
from mgtrace.models import MiniLM

torch = pytest.importorskip("torch")
nn = torch.nn


class _Embeddings(nn.Module):
    def __init__(self, vocab, hidden, positions, eps):
        super().__init__()
        self.word_embeddings = nn.Embedding(vocab, hidden)
        self.position_embeddings = nn.Embedding(positions, hidden)
        self.token_type_embeddings = nn.Embedding(2, hidden)
        self.LayerNorm = nn.LayerNorm(hidden, eps=eps)


class _Named(nn.Module):
    def __init__(*args, **children):
        me = args[0]                  # (a child is named "self": BERT's attention.self)
        super(_Named, me).__init__()
        for k, v in children.items():
            setattr(me, k, v)


def _layer(hidden, inter, eps):
    return _Named(
        attention=_Named(self=_Named(query=nn.Linear(hidden, hidden), key=nn.Linear(hidden, hidden),
                                     value=nn.Linear(hidden, hidden)),
                         output=_Named(dense=nn.Linear(hidden, hidden), LayerNorm=nn.LayerNorm(hidden, eps=eps))),
        intermediate=_Named(dense=nn.Linear(hidden, inter)),
        output=_Named(dense=nn.Linear(inter, hidden), LayerNorm=nn.LayerNorm(hidden, eps=eps)))


class TorchBert(nn.Module):
    """Hugging Face's BertModel computation (post-norm layers, exact GELU,
    the float32 minimum added to padded keys' scores), its parameter names."""

    def __init__(self, vocab, hidden, layers, heads, inter, positions, eps=1e-12):
        super().__init__()
        self.heads = heads
        self.embeddings = _Embeddings(vocab, hidden, positions, eps)
        self.encoder = _Named(layer=nn.ModuleList([_layer(hidden, inter, eps) for _ in range(layers)]))

    def forward(self, ids, mask):
        e = self.embeddings
        b, s = ids.shape
        h = e.LayerNorm(e.word_embeddings(ids) + e.position_embeddings(torch.arange(s))[None]
                        + e.token_type_embeddings(torch.zeros_like(ids)))
        bias = ((1.0 - mask.to(h.dtype)) * float(np.finfo(np.float32).min)).reshape(b, 1, 1, s)
        d = h.shape[-1] // self.heads
        for lay in self.encoder.layer:
            a = lay.attention

            def split(t):
                return t.reshape(b, s, self.heads, d).transpose(1, 2)
            q, k, v = split(a.self.query(h)), split(a.self.key(h)), split(a.self.value(h))
            p = torch.softmax(q @ k.transpose(-1, -2) * (1.0 / math.sqrt(d)) + bias, -1)
            ctx = (p @ v).transpose(1, 2).reshape(b, s, -1)
            h = a.output.LayerNorm(a.output.dense(ctx) + h)
            h = lay.output.LayerNorm(lay.output.dense(torch.nn.functional.gelu(lay.intermediate.dense(h))) + h)
        return h


def _to_float64(net):
    for _, mod in net.named_modules():
        for n, p in list(mod.named_parameters(recurse=False)):
            setattr(mod, n, M.Parameter(p.numpy().astype(np.float64)))
    return net


def _compare(cfg, dtype, batch, seq, rtol, floor):
    mt.random.seed(3)
    net = MiniLM(dropout=0.0, **cfg).train()
    if dtype == np.float64:
        net = _to_float64(net)
    ref = TorchBert(cfg["vocab_size"], cfg["hidden_size"], cfg["num_hidden_layers"],
                    cfg["num_attention_heads"], cfg["intermediate_size"], cfg["max_position_embeddings"])
    ref = ref.to(torch.float64 if dtype == np.float64 else torch.float32)
    params = dict(net.named_parameters())
    tparams = dict(ref.named_parameters())
    assert sorted(params) == sorted(tparams)
    with torch.no_grad():
        for k, p in params.items():
            tparams[k].copy_(torch.from_numpy(p.numpy()))
    rng = np.random.default_rng(4)
    ids = rng.integers(1, cfg["vocab_size"], (batch, seq)).astype(np.int32)
    mask = np.ones((batch, seq), np.int32)
    mask[0, seq - 3:] = 0                       # padded keys in the first row
    w = rng.uniform(-1, 1, (batch, seq, cfg["hidden_size"])).astype(dtype)
    gm = GradManager().attach(list(params.values()))
    with gm:
        h = net.hidden_states(mt.tensor(ids), mt.tensor(mask))
        gm.backward((h * mt.tensor(w)).sum())
    th = ref(torch.from_numpy(ids.astype(np.int64)), torch.from_numpy(mask))
    (th * torch.from_numpy(w)).sum().backward()
    np.testing.assert_allclose(h.numpy(), th.detach().numpy(), rtol=0, atol=rtol * 10, err_msg="hidden states")
    top = max(np.abs(t.grad.numpy()).max() for t in tparams.values())
    for k, p in params.items():
        want = tparams[k].grad.numpy()
        scale = max(np.abs(want).max(), floor * top)
        np.testing.assert_allclose(p.grad.numpy(), want, rtol=0, atol=rtol * scale, err_msg=k)


def test_minilm_gradients_float64():
    cfg = dict(vocab_size=97, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
               intermediate_size=64, max_position_embeddings=16)
    _compare(cfg, np.float64, 3, 9, 1e-9, 1e-6)


def test_minilm_l6_gradients_float32():
    cfg = dict(vocab_size=30522, hidden_size=384, num_hidden_layers=6, num_attention_heads=12,
               intermediate_size=1536, max_position_embeddings=512)
    _compare(cfg, np.float32, 2, 16, 1e-4, 1e-3)
