"""Small models of each kind a MegEngine user ports (issue 36), built from
the new functional names and builtin modules: a 2-layer LSTM tagger, a
transformer block through M.MultiHeadAttention, a 3-d conv net and a
super-resolution net with PixelShuffle. Each is traced at batch 1,
optimized (every pass that applies), saved, loaded in a fresh Python
process (no model code there) and run at batch 3: equal to eager."""
import subprocess
import sys

import numpy as np
import pytest

import mgtrace as mt
import mgtrace.functional as F
import mgtrace.module as M


class Tagger(M.Module):
    """Embedding -> 2-layer bidirectional LSTM -> per-token tag log-probabilities."""

    def __init__(self, vocab=20, dim=8, hidden=6, tags=5):
        super().__init__()
        self.embed = M.Embedding(vocab, dim)
        self.lstm = M.LSTM(dim, hidden, num_layers=2, batch_first=True, bidirectional=True)
        self.head = M.Linear(2 * hidden, tags)

    def forward(self, tokens):
        y, _ = self.lstm(self.embed(tokens))
        return F.logsoftmax(self.head(y), axis=-1)


class TransformerBlock(M.Module):
    """Pre-norm attention and MLP with residuals."""

    def __init__(self, dim=8, heads=2):
        super().__init__()
        self.norm1 = M.LayerNorm(dim)
        self.attn = M.MultiHeadAttention(dim, heads)
        self.norm2 = M.LayerNorm(dim)
        self.fc1 = M.Linear(dim, 2 * dim)
        self.act = M.LeakyReLU(0.1)
        self.fc2 = M.Linear(2 * dim, dim)

    def forward(self, x):
        h = self.norm1(x)
        x = x + self.attn(h, h, h, is_causal=True)[0]
        return x + self.fc2(self.act(self.fc1(self.norm2(x))))


class Conv3dNet(M.Module):
    def __init__(self):
        super().__init__()
        self.c1 = M.Conv3d(2, 4, 3, padding=1)
        self.norm = M.InstanceNorm(4)
        self.act = M.PReLU(4)
        self.c2 = M.Conv3d(4, 4, (1, 3, 3), stride=(1, 2, 2))
        self.up = M.ConvTranspose3d(4, 2, 2, stride=2)

    def forward(self, x):
        y = self.act(self.norm(self.c1(x)))
        y = self.up(self.c2(y))
        return F.logsumexp(F.flatten(y, 2), 2)


class SuperResolution(M.Module):
    """ESPCN-style: convs at low resolution, then PixelShuffle."""

    def __init__(self, r=2):
        super().__init__()
        self.pad = M.Pad(((0, 0), (0, 0), (2, 2), (2, 2)), mode="reflect")
        self.c1 = M.Conv2d(1, 8, 5)
        self.act = M.ReLU()
        self.c2 = M.Conv2d(8, 8, 3, padding=1)
        self.c3 = M.Conv2d(8, r * r, 3, padding=1)
        self.shuffle = M.PixelShuffle(r)

    def forward(self, x):
        y = self.act(self.c1(self.pad(x)))
        y = self.act(self.c2(y))
        return F.hsigmoid(self.shuffle(self.c3(y)))


def _input(name, batch, rng):
    if name == "Tagger":
        return mt.tensor(rng.integers(0, 20, size=(batch, 7)).astype(np.int32))
    shape = {"TransformerBlock": (batch, 5, 8), "Conv3dNet": (batch, 2, 4, 6, 6),
             "SuperResolution": (batch, 1, 6, 7)}[name]
    return mt.tensor(rng.standard_normal(shape).astype(np.float32))


LOADER = """
import sys, numpy as np, mgtrace as mt
m = mt.load(sys.argv[1])
x = np.load(sys.argv[2])
np.save(sys.argv[3], m(mt.tensor(x)).numpy())
"""


@pytest.mark.parametrize("cls", [Tagger, TransformerBlock, Conv3dNet, SuperResolution],
                         ids=lambda c: c.__name__)
def test_small_model_traced_optimized_saved_loaded_elsewhere(cls, tmp_path):
    mt.random.seed(1)
    net = cls().eval()
    rng = np.random.default_rng(2)
    tm = mt.trace_module(net, _input(cls.__name__, 1, rng))
    opt = mt.traced_module.optimize(tm, "all")
    x = _input(cls.__name__, 3, rng)
    want = net(x).numpy()
    for m in (tm, opt):
        np.testing.assert_allclose(m(x).numpy(), want, rtol=1e-5, atol=1e-5)
    path = tmp_path / "m.tmod"
    mt.save(opt, path)
    np.save(tmp_path / "x.npy", x.numpy())
    subprocess.run([sys.executable, "-c", LOADER, str(path), str(tmp_path / "x.npy"),
                    str(tmp_path / "y.npy")], check=True, timeout=300)
    np.testing.assert_allclose(np.load(tmp_path / "y.npy"), want, rtol=1e-5, atol=1e-5)
