"""Fused attention's backward kernel (nn.attention_backward, cpu/
attention_grad.c) and its use: F.attention's gradient rule and MiniLM in
training mode without dropout.

The reference is the composed sequence's gradient written in NumPy float64
(s = scale q k^T + mask, p = softmax(s), out = p v; PyTorch's formulas),
itself checked against central finite differences; the float32 kernel
agrees within float32 rounding of the gradients' scale."""
import numpy as np
import pytest

import mgtrace as mt
import mgtrace.functional as F
from mgtrace._core import nn as _nn
from mgtrace.autodiff import GradManager
from mgtrace.models import MiniLM


def _forward64(q, k, v, mask, scale):
    s = scale * q @ np.swapaxes(k, -1, -2)
    if mask is not None:
        s = s + mask
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return p @ v, p


def _backward64(q, k, v, mask, gy, scale):
    _, p = _forward64(q, k, v, mask, scale)
    gv = np.swapaxes(p, -1, -2) @ gy
    gp = gy @ np.swapaxes(v, -1, -2)
    gs = p * (gp - (gp * p).sum(-1, keepdims=True))
    return scale * gs @ k, scale * np.swapaxes(gs, -1, -2) @ q, gv, gs


def _operands(rng, b=2, h=3, sq=5, sk=7, d=4, dv=6, dtype=np.float32):
    q = rng.standard_normal((b, h, sq, d)).astype(dtype)
    k = rng.standard_normal((b, h, sk, d)).astype(dtype)
    v = rng.standard_normal((b, h, sk, dv)).astype(dtype)
    mask = np.where(rng.random((b, 1, 1, sk)) < 0.3, -1e4, 0.0).astype(dtype)
    mask[..., 0] = 0                          # every row keeps a key
    gy = rng.standard_normal((b, h, sq, dv)).astype(dtype)
    return q, k, v, mask, gy


def _close(got, want):
    np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=0,
                               atol=2e-5 * max(np.abs(want).max(), 1.0))


def test_reference_matches_finite_differences():
    rng = np.random.default_rng(0)
    q, k, v, mask, gy = (a.astype(np.float64) for a in _operands(rng, 1, 2, 3, 4, 3, 2))
    mask = rng.standard_normal(mask.shape)           # a smooth mask, so its gradient is checked too
    grads = _backward64(q, k, v, mask, gy, 0.7)
    gmask = grads[3].sum(axis=(1, 2), keepdims=True)
    eps = 1e-6
    for x, g in ((q, grads[0]), (k, grads[1]), (v, grads[2]), (mask, gmask)):
        fd = np.zeros_like(x)
        for i in np.ndindex(x.shape):
            old = x[i]
            x[i] = old + eps
            up = (_forward64(q, k, v, mask, 0.7)[0] * gy).sum()
            x[i] = old - eps
            down = (_forward64(q, k, v, mask, 0.7)[0] * gy).sum()
            x[i] = old
            fd[i] = (up - down) / (2 * eps)
        np.testing.assert_allclose(g, fd, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("with_mask", [False, True])
def test_kernel_against_float64_reference(with_mask):
    rng = np.random.default_rng(1)
    q, k, v, mask, gy = _operands(rng)
    m = mask if with_mask else None
    gq, gk, gv, gs = _nn.attention_backward(mt.tensor(q), mt.tensor(k), mt.tensor(v),
                                            None if m is None else mt.tensor(m), mt.tensor(gy), 0.5,
                                            need_mask=with_mask)
    want = _backward64(*(None if a is None else a.astype(np.float64) for a in (q, k, v, m, gy)), 0.5)
    for got, w in zip((gq, gk, gv), want):
        assert got.shape == w.shape
        _close(got.numpy(), w)
    if with_mask:
        _close(gs.numpy(), want[3])
    else:
        assert gs is None


def test_kernel_strided_operands():
    # q, k, v and gy as a transformer has them: [B, S, H, D] memory seen as
    # [B, H, S, D] (and gy a transposed view of a contiguous [B, S, H, Dv])
    rng = np.random.default_rng(2)
    q, k, v, mask, gy = _operands(rng, 2, 4, 6, 6, 8, 8)
    t = lambda a: mt.tensor(np.ascontiguousarray(a.transpose(0, 2, 1, 3))).transpose(0, 2, 1, 3)
    got = _nn.attention_backward(t(q), t(k), t(v), mt.tensor(mask), t(gy), 0.25)
    want = _backward64(*(a.astype(np.float64) for a in (q, k, v, mask, gy)), 0.25)
    for g, w in zip(got[:3], want):
        _close(g.numpy(), w)


def test_kernel_refusals():
    q = mt.tensor(np.ones((1, 1, 2, 3), np.float32))
    with pytest.raises(TypeError, match="float32"):
        _nn.attention_backward(q.astype("float64"), q, q, None, q, 1.0)
    with pytest.raises(TypeError, match="float32"):
        _nn.attention_train(q.astype("float64"), q, q, None, 1.0)
    with pytest.raises(ValueError, match="gy of shape"):
        _nn.attention_backward(q, q, q, None, mt.tensor(np.ones((1, 1, 2, 4), np.float32)), 1.0)
    with pytest.raises(ValueError, match="does not broadcast"):
        _nn.attention_backward(q, q, q, mt.tensor(np.ones((3,), np.float32)), q, 1.0)


def test_training_forward_and_saved_probabilities():
    rng = np.random.default_rng(11)
    q, k, v, mask, gy = _operands(rng)
    args64 = [a.astype(np.float64) for a in (q, k, v, mask)]
    out, probs = _nn.attention_train(mt.tensor(q), mt.tensor(k), mt.tensor(v), mt.tensor(mask), 0.5)
    want_out, want_p = _forward64(*args64, 0.5)
    _close(out.numpy(), want_out)
    _close(probs.numpy(), want_p)
    assert probs.shape == (2, 3, 5, 7)
    # the backward reading them equals the one recomputing them
    ops = [mt.tensor(a) for a in (q, k, v, mask, gy)]
    saved = _nn.attention_backward(*ops, 0.5, need_mask=True, probs=probs)
    again = _nn.attention_backward(*ops, 0.5, need_mask=True)
    want = _backward64(*args64, gy.astype(np.float64), 0.5)
    for a, b, w in zip(saved, again, want):
        _close(a.numpy(), w)
        _close(b.numpy(), w)
    with pytest.raises(ValueError, match="probs must be"):
        _nn.attention_backward(*ops, 0.5, probs=probs[:, :, :4])


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_training_forward_and_saved_backward_on_any_thread_count(threads):
    # one pair per thread or several, and more threads than pairs (b * h = 2)
    rng = np.random.default_rng(15)
    q, k, v, mask, gy = _operands(rng, b=2, h=1, sq=9, sk=11)
    args64 = [a.astype(np.float64) for a in (q, k, v, mask)]
    before = mt.get_num_threads()
    mt.set_num_threads(threads)
    try:
        out, probs = _nn.attention_train(mt.tensor(q), mt.tensor(k), mt.tensor(v), mt.tensor(mask), 0.25)
        grads = _nn.attention_backward(*(mt.tensor(a) for a in (q, k, v, mask, gy)), 0.25, need_mask=True,
                                       probs=probs)
    finally:
        mt.set_num_threads(before)
    want_out, want_p = _forward64(*args64, 0.25)
    _close(out.numpy(), want_out)
    _close(probs.numpy(), want_p)
    for a, w in zip(grads, _backward64(*args64, gy.astype(np.float64), 0.25)):
        _close(a.numpy(), w)


def test_core_op_under_grad_manager_recomputes():
    # the core op (multi_head_attention's call) records no probabilities:
    # its backward recomputes them, the same gradients
    rng = np.random.default_rng(12)
    q, k, v, mask, gy = _operands(rng)
    ts = [mt.tensor(a) for a in (q, k, v)]
    gm = GradManager().attach(ts)
    with gm:
        out = _nn.attention(*ts, mt.tensor(mask), 0.5)
        node = out.__dict__["_ad"][0]
        assert "probs" not in node.params
        gm.backward(out, mt.tensor(gy))
    want = _backward64(*(a.astype(np.float64) for a in (q, k, v, mask, gy)), 0.5)
    for t, w in zip(ts, want):
        _close(t.grad.numpy(), w)


def test_functional_keeps_probabilities_until_backward():
    rng = np.random.default_rng(13)
    q, k, v, mask, gy = _operands(rng)
    ts = [mt.tensor(a) for a in (q, k, v)]
    gm = GradManager().attach(ts)
    with gm:
        out = F.attention(*ts, mt.tensor(mask), scale=0.5)
        node = out.__dict__["_ad"][0]
        assert node.params["probs"].shape == (2, 3, 5, 7)
        gm.backward(out, mt.tensor(gy))
    assert "probs" not in node.params          # freed once used
    want = _backward64(*(a.astype(np.float64) for a in (q, k, v, mask, gy)), 0.5)
    for t, w in zip(ts, want):
        _close(t.grad.numpy(), w)


def test_functional_without_gradient_records_nothing():
    # operands no gradient flows through: F.attention's own forward, no
    # node and no probabilities kept
    rng = np.random.default_rng(14)
    q, k, v, mask, _ = _operands(rng)
    w = mt.tensor(np.ones(1, np.float32))
    gm = GradManager().attach([w])
    with gm:
        out = F.attention(mt.tensor(q), mt.tensor(k), mt.tensor(v), mt.tensor(mask), scale=0.5)
    assert "_ad" not in out.__dict__
    want, _ = _forward64(*(a.astype(np.float64) for a in (q, k, v, mask)), 0.5)
    _close(out.numpy(), want)


def test_no_keys_gives_zero_gradients():
    q = mt.tensor(np.ones((1, 2, 3, 4), np.float32))
    kv = mt.tensor(np.ones((1, 2, 0, 4), np.float32))
    gq, gk, gv, _ = _nn.attention_backward(q, kv, kv, None, mt.tensor(np.ones((1, 2, 3, 4), np.float32)), 1.0)
    np.testing.assert_array_equal(gq.numpy(), np.zeros((1, 2, 3, 4), np.float32))
    assert gk.shape == (1, 2, 0, 4) and gv.shape == (1, 2, 0, 4)


def test_grad_manager_uses_kernel_and_matches_float64():
    # F.attention under a GradManager, float32 (the kernel) against the same
    # graph in float64 (the rule's composed path), mask gradient included
    rng = np.random.default_rng(3)
    q, k, v, mask, gy = _operands(rng)
    mask = rng.standard_normal(mask.shape).astype(np.float32)
    grads = {}
    for dt in ("float32", "float64"):
        ts = [mt.tensor(a.astype(dt)) for a in (q, k, v, mask)]
        gm = GradManager().attach(ts)
        with gm:
            out = F.attention(*ts, scale=0.5)
            gm.backward((out * mt.tensor(gy.astype(dt))).sum())
        grads[dt] = [t.grad.numpy() for t in ts]
    want = _backward64(*(a.astype(np.float64) for a in (q, k, v, mask, gy)), 0.5)
    for g32, g64, w in zip(grads["float32"], grads["float64"], want[:3]):
        np.testing.assert_allclose(g64, w, rtol=1e-10, atol=1e-12)
        _close(g32, w)
    _close(grads["float32"][3], want[3].sum(axis=(1, 2), keepdims=True))


def _composed_attention(q, k, v, mask=None, scale=1.0):
    s = F.matmul(q, k, transpose_b=True) * scale
    return F.matmul(F.softmax(s if mask is None else s + mask, axis=-1), v)


def _minilm_grads(net, ids, am, w, pooled=False):
    params = dict(net.named_parameters())
    for p in params.values():
        p.grad = None
    gm = GradManager().attach(list(params.values()))
    with gm:
        h = net(ids, am) if pooled else net.hidden_states(ids, am)
        gm.backward((h * w).sum())
    return {n: p.grad.numpy().copy() for n, p in params.items()}


def _small_minilm(rng):
    mt.random.seed(0)
    net = MiniLM(vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                 intermediate_size=64, max_position_embeddings=16, dropout=0.0).train()
    ids = mt.tensor(rng.integers(1, 50, (2, 9)).astype(np.int32))
    am = np.ones((2, 9), np.int32)
    am[0, 6:] = 0
    w = mt.tensor(rng.uniform(-1, 1, (2, 9, 32)).astype(np.float32))
    return net, ids, mt.tensor(am), w


def test_minilm_without_dropout_gradients_equal_composed(monkeypatch):
    # MiniLM without attention dropout runs F.attention (its C backward);
    # the reference is the same model with F.attention replaced by the
    # composed sequence: the same parameter gradients within float32 rounding
    net, ids, am, w = _small_minilm(np.random.default_rng(5))
    got = _minilm_grads(net, ids, am, w)
    monkeypatch.setattr(F, "attention", _composed_attention)
    want = _minilm_grads(net, ids, am, w)
    top = max(np.abs(g).max() for g in want.values())
    for n in want:
        np.testing.assert_allclose(got[n], want[n], rtol=0,
                                   atol=1e-5 * max(np.abs(want[n]).max(), 1e-3 * top), err_msg=n)


def test_traced_minilm_trains_with_fused_attention():
    # traced without dropout: the attention nodes in the graph, and the
    # traced module's gradients equal the eager module's
    net, ids, am, _ = _small_minilm(np.random.default_rng(8))
    w = mt.tensor(np.random.default_rng(9).uniform(-1, 1, (2, 32)).astype(np.float32))
    want = _minilm_grads(net, ids, am, w, pooled=True)     # the sentence embeddings (forward)
    tm = mt.trace_module(net, ids, am)
    assert tm.graph.get_function_by_type(F.attention).as_count() == 2
    got = _minilm_grads(tm, ids, am, w, pooled=True)
    for n in want:
        np.testing.assert_allclose(got[n], want[n], rtol=0, atol=1e-6 * max(np.abs(want[n]).max(), 1e-6),
                                   err_msg=n)


def test_minilm_uses_fused_attention_only_without_dropout(monkeypatch):
    from mgtrace.models.minilm import BertSelfAttention
    calls = []
    real = F.attention
    monkeypatch.setattr(F, "attention", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    x = mt.tensor(np.random.default_rng(6).standard_normal((1, 4, 8)).astype(np.float32))
    bias = mt.tensor(np.zeros((1, 1, 1, 4), np.float32))
    BertSelfAttention(8, 2, 0.0).train()(x, bias)
    BertSelfAttention(8, 2, 0.0).eval()(x, bias)
    assert len(calls) == 2
    BertSelfAttention(8, 2, 0.1).train()(x, bias)
    BertSelfAttention(8, 2, 0.1).eval()(x, bias)
    assert len(calls) == 2


def test_torch_gradients():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(7)
    q, k, v, mask, gy = _operands(rng)
    ts = [mt.tensor(a) for a in (q, k, v)]
    gm = GradManager().attach(ts)
    with gm:
        gm.backward((F.attention(*ts, mt.tensor(mask), scale=0.5) * mt.tensor(gy)).sum())
    tt = [torch.tensor(a, requires_grad=True) for a in (q, k, v)]
    out = torch.nn.functional.scaled_dot_product_attention(*tt, torch.tensor(mask), scale=0.5)
    (out * torch.tensor(gy)).sum().backward()
    for a, b in zip(ts, tt):
        want = b.grad.numpy().astype(np.float64)
        _close(a.grad.numpy(), want)
