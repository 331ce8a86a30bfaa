"""MegEngine's further builtin modules (issue 36): RNN, LSTM and their cells
and MultiHeadAttention equal to torch.nn's on copied weights (and to NumPy
loops written here without torch); every new builtin traced at batch 1 runs
at batch 5, and round-trips through save/load."""
import io
import math

import numpy as np
import pytest

import mgtrace as mt
import mgtrace.functional as F
import mgtrace.module as M

RNG = np.random.default_rng(3636)


def t(a):
    return mt.tensor(np.asarray(a))


def randn(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def sigmoid(x):
    return 1 / (1 + np.exp(-x))


# ------------------------------------------------------------------ recurrent, NumPy

def lstm_ref(m, x, bidirectional=False):
    """A float64 loop over time for M.LSTM m (torch.nn's equations), x [T, N, I]."""
    sd = {k: v.numpy().astype(np.float64) for k, v in m.state_dict().items()}
    layer_in = x.astype(np.float64)
    hs, cs = [], []
    for layer in range(m.num_layers):
        outs = []
        for sfx in [f"_l{layer}"] + ([f"_l{layer}_reverse"] if bidirectional else []):
            w_ih, w_hh = sd["weight_ih" + sfx], sd["weight_hh" + sfx]
            b = sd.get("bias_ih" + sfx, 0) + sd.get("bias_hh" + sfx, 0)
            w_hr = sd.get("weight_hr" + sfx)
            n = x.shape[1]
            h = np.zeros((n, w_hh.shape[1]))
            c = np.zeros((n, m.hidden_size))
            ys = [None] * x.shape[0]
            order = range(x.shape[0] - 1, -1, -1) if sfx.endswith("reverse") else range(x.shape[0])
            for i in order:
                g = layer_in[i] @ w_ih.T + h @ w_hh.T + b
                gi, gf, gg, go = np.split(g, 4, axis=1)
                c = sigmoid(gf) * c + sigmoid(gi) * np.tanh(gg)
                h = sigmoid(go) * np.tanh(c)
                if w_hr is not None:
                    h = h @ w_hr.T
                ys[i] = h
            outs.append(np.stack(ys))
            hs.append(h)
            cs.append(c)
        layer_in = np.concatenate(outs, axis=2)
    return layer_in, np.stack(hs), np.stack(cs)


@pytest.mark.parametrize("kwargs", [{}, {"num_layers": 2}, {"bidirectional": True},
                                    {"num_layers": 2, "bidirectional": True, "proj_size": 3},
                                    {"bias": False}])
def test_lstm_against_a_numpy_loop(kwargs):
    m = M.LSTM(5, 4, **kwargs)
    x = randn(6, 3, 5)
    y, (h, c) = m(t(x))
    want_y, want_h, want_c = lstm_ref(m, x, kwargs.get("bidirectional", False))
    np.testing.assert_allclose(y.numpy(), want_y, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(h.numpy(), want_h, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(c.numpy(), want_c, rtol=1e-5, atol=1e-6)


def test_rnn_cell_and_lstm_cell_against_numpy():
    cell = M.RNNCell(3, 4, nonlinearity="relu")
    sd = {k: v.numpy().astype(np.float64) for k, v in cell.state_dict().items()}
    x, h = randn(2, 3), randn(2, 4)
    want = np.maximum(x @ sd["weight_ih"].T + sd["bias_ih"] + h @ sd["weight_hh"].T
                      + sd["bias_hh"], 0)
    np.testing.assert_allclose(cell(t(x), t(h)).numpy(), want, rtol=1e-5, atol=1e-6)
    assert cell(t(x[0])).shape == (4,)                                  # unbatched, zero state
    lc = M.LSTMCell(3, 2)
    sd = {k: v.numpy().astype(np.float64) for k, v in lc.state_dict().items()}
    c = randn(2, 2)
    h2 = randn(2, 2)
    g = x @ sd["weight_ih"].T + sd["bias_ih"] + h2 @ sd["weight_hh"].T + sd["bias_hh"]
    gi, gf, gg, go = np.split(g, 4, axis=1)
    c_new = sigmoid(gf) * c + sigmoid(gi) * np.tanh(gg)
    h_new, c_got = lc(t(x), (t(h2), t(c)))
    np.testing.assert_allclose(c_got.numpy(), c_new, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(h_new.numpy(), sigmoid(go) * np.tanh(c_new), rtol=1e-5, atol=1e-6)


def test_recurrent_errors():
    with pytest.raises(ValueError, match="RNN: nonlinearity must be 'tanh' or 'relu'"):
        M.RNN(3, 4, nonlinearity="gelu")
    with pytest.raises(ValueError, match=r"LSTM: proj_size \(4\) must be smaller"):
        M.LSTM(3, 4, proj_size=4)
    with pytest.raises(ValueError, match=r"RNN: dropout must be in \[0, 1\]"):
        M.RNN(3, 4, dropout=1.5)
    with pytest.raises(ValueError, match=r"LSTM: input must be \[T, N, I\] with I = 3"):
        M.LSTM(3, 4)(t(randn(2, 3, 4)))
    with pytest.raises(ValueError, match=r"RNN: hx must have shape \(2, 3, 4\)"):
        M.RNN(3, 4, 2)(t(randn(5, 3, 3)), t(randn(1, 3, 4)))
    with pytest.raises(ValueError, match="LSTMCell: hx must be a pair"):
        M.LSTMCell(3, 4)(t(randn(2, 3)), t(randn(2, 4)))


# ------------------------------------------------------------------ recurrent, torch

def _copy_from(ours, theirs):
    ours.load_state_dict({k: v.detach().numpy() for k, v in theirs.state_dict().items()})


@pytest.mark.parametrize("cls, kwargs", [
    ("LSTM", {}), ("LSTM", {"num_layers": 2, "batch_first": True}),
    ("LSTM", {"bidirectional": True, "proj_size": 2}), ("LSTM", {"bias": False}),
    ("RNN", {}), ("RNN", {"num_layers": 3, "nonlinearity": "relu"}),
    ("RNN", {"bidirectional": True, "num_layers": 2, "batch_first": True}),
])
def test_recurrent_equal_torch(cls, kwargs):
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    theirs = getattr(torch.nn, cls)(5, 4, **kwargs)
    ours = getattr(M, cls)(5, 4, **kwargs)
    _copy_from(ours, theirs)
    assert list(ours.state_dict()) == list(theirs.state_dict())
    x = randn(3, 7, 5) if kwargs.get("batch_first") else randn(7, 3, 5)
    dirs = 2 if kwargs.get("bidirectional") else 1
    layers = kwargs.get("num_layers", 1)
    h0 = randn(layers * dirs, 3, kwargs.get("proj_size") or 4)
    with torch.no_grad():
        if cls == "LSTM":
            c0 = randn(layers * dirs, 3, 4)
            want, (wh, wc) = theirs(torch.from_numpy(x), (torch.from_numpy(h0), torch.from_numpy(c0)))
            got, (gh, gc) = ours(t(x), (t(h0), t(c0)))
            np.testing.assert_allclose(gc.numpy(), wc.numpy(), rtol=1e-5, atol=1e-6)
        else:
            want, wh = theirs(torch.from_numpy(x), torch.from_numpy(h0))
            got, gh = ours(t(x), t(h0))
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(gh.numpy(), wh.numpy(), rtol=1e-5, atol=1e-6)


def test_multi_head_attention_equals_torch():
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    e, heads = 8, 4
    theirs = torch.nn.MultiheadAttention(e, heads, batch_first=True, kdim=6, vdim=5)
    with torch.no_grad():
        theirs.in_proj_bias.normal_()
        theirs.out_proj.bias.normal_()
    ours = M.MultiHeadAttention(e, heads, kdim=6, vdim=5)
    ws = [theirs.q_proj_weight, theirs.k_proj_weight, theirs.v_proj_weight, theirs.out_proj.weight]
    bs = list(theirs.in_proj_bias.detach().numpy().reshape(3, e)) + [theirs.out_proj.bias]
    flat = np.concatenate([w.detach().numpy().T.ravel() for w in ws]
                          + [np.asarray(b.detach().numpy() if hasattr(b, "detach") else b)
                             for b in bs])
    ours.load_state_dict({"io_weight_bias": flat[None].astype(np.float32)})
    q, k, v = randn(2, 3, e), randn(2, 5, 6), randn(2, 5, 5)
    pad = np.zeros((2, 5), bool)
    pad[1, 3:] = True
    with torch.no_grad():
        want, wts = theirs(torch.from_numpy(q), torch.from_numpy(k), torch.from_numpy(v),
                           key_padding_mask=torch.from_numpy(pad), need_weights=True,
                           average_attn_weights=True)
    got, gw = ours(t(q), t(k), t(v), key_padding_mask=t(pad), need_weights=True,
                   average_attn_weights=True)
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(gw.numpy(), wts.numpy(), rtol=1e-5, atol=1e-6)
    ours.eval()
    got, none = ours(t(q), t(k), t(v))
    with torch.no_grad():
        want = theirs(torch.from_numpy(q), torch.from_numpy(k), torch.from_numpy(v))[0]
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-5)
    assert none is None


def test_multi_head_attention_module():
    m = M.MultiHeadAttention(6, 3)
    assert m.io_weight_bias.shape == (1, 4 * 36 + 24)
    assert np.all(m.io_weight_bias.numpy()[0, 144:] == 0)
    with pytest.raises(ValueError, match=r"embed_dim \(6\) must be divisible by num_heads \(4\)"):
        M.MultiHeadAttention(6, 4)


# ------------------------------------------------------------------ traced, saved, loaded

def _inputs(batch):
    r = np.random.default_rng(batch)
    return {
        "LeakyReLU": ((batch, 3, 4),), "PReLU": ((batch, 3, 4, 2),),
        "PixelShuffle": ((batch, 8, 3, 2),), "AdaptiveMaxPool2d": ((batch, 3, 7, 5),),
        "Conv3d": ((batch, 3, 4, 5, 4),), "ConvTranspose3d": ((batch, 3, 3, 2, 3),),
        "RNNCell": ((batch, 5),), "LSTMCell": ((batch, 5),), "RNN": ((6, batch, 5),),
        "LSTM": ((batch, 6, 5),), "Pad": ((batch, 3, 4, 5),), "InstanceNorm": ((batch, 3, 4, 5),),
        "GeneralNorm": ((batch, 3, 4, 5),), "LocalResponseNorm": ((batch, 6, 3, 3),),
        "SyncBatchNorm": ((batch, 3, 4, 4),), "LocalConv2d": ((batch, 3, 4, 5),),
        "SlidingWindow": ((batch, 2, 5, 4),), "SlidingWindowTranspose": ((batch, 2, 2, 2, 2, 2),),
        "MultiHeadAttention": ((batch, 4, 6), (batch, 5, 6), (batch, 5, 6)),
        "DeformableConv2d": ((batch, 2, 4, 4), (batch, 18, 4, 4), (batch, 9, 4, 4)),
        "RegionRestrictedConv": ((batch, 2, 4, 4), (batch, 4, 4), (batch, 4, 4)),
        "DeformablePSROIPooling": ((batch, 3, 5, 6), (3, 5), (3, 2, 2, 2)),
    }, r


MODULES = {
    "LeakyReLU": lambda: M.LeakyReLU(0.2), "PReLU": lambda: M.PReLU(3, 0.1),
    "PixelShuffle": lambda: M.PixelShuffle(2), "AdaptiveMaxPool2d": lambda: M.AdaptiveMaxPool2d((2, 3)),
    "Conv3d": lambda: M.Conv3d(3, 4, 3, padding=1), "ConvTranspose3d": lambda: M.ConvTranspose3d(3, 2, 3, 2, 1, 1),
    "RNNCell": lambda: M.RNNCell(5, 3), "LSTMCell": lambda: M.LSTMCell(5, 3),
    "RNN": lambda: M.RNN(5, 3, 2), "LSTM": lambda: M.LSTM(5, 4, batch_first=True, bidirectional=True),
    "Pad": lambda: M.Pad(((0, 0), (0, 0), (1, 2), (2, 1)), "reflect"),
    "InstanceNorm": lambda: M.InstanceNorm(3), "GeneralNorm": lambda: M.GeneralNorm((3, 5), (1, 3)),
    "LocalResponseNorm": lambda: M.LocalResponseNorm(3, alpha=0.1),
    "SyncBatchNorm": lambda: M.SyncBatchNorm(3, eps_mode="max").eval(),
    "LocalConv2d": lambda: M.LocalConv2d(3, 4, 4, 5, 3, padding=1),
    "SlidingWindow": lambda: M.SlidingWindow(2, stride=2),
    "SlidingWindowTranspose": lambda: M.SlidingWindowTranspose((4, 4), 2, stride=2),
    "MultiHeadAttention": lambda: M.MultiHeadAttention(6, 2).eval(),
    "DeformableConv2d": lambda: M.DeformableConv2d(2, 3, 3, padding=1),
    "RegionRestrictedConv": lambda: M.RegionRestrictedConv(2, 4, 3, 2, padding=1),
    "DeformablePSROIPooling": lambda: M.DeformablePSROIPooling(False, 2, 2, 2, 2, 0.5),
}


class Holder(M.Module):
    """A user module around one builtin, adding a traced op after it."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, *xs):
        y = self.inner(*xs)
        first = y
        while isinstance(first, tuple):
            first = first[0]
        return y, first * 2


def _flat(v):
    if isinstance(v, (tuple, list)):
        return [a for x in v for a in _flat(x)]
    return [] if v is None else [v.numpy()]


def _make(name, shapes, r):
    if name == "RegionRestrictedConv":       # region ids
        return [t(r.standard_normal(shapes[0]).astype(np.float32))] + \
            [t(r.integers(0, 2, s).astype(np.int32)) for s in shapes[1:]]
    if name == "DeformablePSROIPooling":     # rois: batch index 0, then a box
        rois = np.concatenate([np.zeros((3, 1)), r.uniform(0, 8, (3, 4))], 1).astype(np.float32)
        return [t(r.standard_normal(shapes[0]).astype(np.float32)), t(rois),
                t(r.standard_normal(shapes[2]).astype(np.float32))]
    return [t(r.standard_normal(s).astype(np.float32)) for s in shapes]


@pytest.mark.parametrize("name", sorted(MODULES))
def test_builtin_traces_at_batch_1_runs_at_batch_5_and_round_trips(name):
    mt.random.seed(0)
    net = Holder(MODULES[name]())
    shapes1, r = _inputs(1)
    xs1 = _make(name, shapes1[name], r)
    tm = mt.trace_module(net, *xs1)
    buf = io.BytesIO()
    mt.save(tm, buf)
    loaded = mt.load(io.BytesIO(buf.getvalue()))
    shapes5, r = _inputs(5)
    xs5 = _make(name, shapes5[name], r)
    want = _flat(net(*xs5))
    for m in (tm, loaded):
        got = _flat(m(*xs5))
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert g.shape == w.shape
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
