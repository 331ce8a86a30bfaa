"""A model written the MegEngine way (issue 13): blocks in a plain list, tensor
attributes, a tensor built in forward and changed in place, BatchNorm in
training mode. Traced, run three times, saved, loaded and run again, it
equals an eager twin every time (outputs and running statistics)."""
import copy
import io

import numpy as np

import mgtrace as mt
import mgtrace.functional as F
import mgtrace.module as M


class Block(M.Module):
    def __init__(self, c, name=None):
        super().__init__(name=name)
        self.conv = M.Conv2d(c, c, 3, padding=1)
        self.bn = M.BatchNorm2d(c)
        self.gain = mt.tensor(np.full((1, c, 1, 1), 0.5, np.float32))     # a buffer

    def forward(self, x):
        return F.relu(self.bn(self.conv(x))) * self.gain + x


class MegEngineStyle(M.Module):
    def __init__(self):
        super().__init__()
        self.stem = M.Conv2d(3, 4, 3, padding=1)
        self.blocks = [Block(4), Block(4, name="second")]      # a plain list
        self.heads = {"cls": M.Linear(4, 5), "aux": M.Linear(4, 2)}
        self.bias = mt.tensor(np.linspace(-1, 1, 5).astype(np.float32))

    def forward(self, x):
        offset = mt.tensor([1.0, 1.0, 1.0, 1.0]).reshape(1, 4, 1, 1)
        offset *= 0.25                                           # in place, every call
        offset[0, 0] = -1.0
        h = self.stem(x) + offset
        for b in self.blocks:
            h = b(h)
        n = mt.tensor(h.shape)                                   # symbolic sizes
        pooled = h.mean(axis=(2, 3)) * (n[2] * n[3]).astype("float32") / (h.shape[2] * h.shape[3])
        return {"cls": self.heads["cls"](pooled) + self.bias, "aux": self.heads["aux"](pooled)}


def _x(batch, seed):
    return mt.tensor(np.random.default_rng(seed).standard_normal((batch, 3, 6, 6)).astype("float32"))


def _assert_same(tm, ref, x):
    got, want = tm(x), ref(x)
    assert list(got) == list(want)
    for k in want:
        np.testing.assert_allclose(got[k].numpy(), want[k].numpy(), rtol=1e-5, atol=1e-5,
                                   err_msg=k)
    for (k, a), (k2, b) in zip(tm.state_dict().items(), ref.state_dict().items()):
        assert k == k2
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-6, err_msg=k)


def test_megengine_style_model_traces_runs_saves_and_loads_like_eager():
    net = MegEngineStyle().train()
    assert list(net.state_dict())[:4] == ["bias", "stem.weight", "stem.bias",
                                          "blocks.0.gain"]
    ref = copy.deepcopy(net)
    before = {k: v.numpy().copy() for k, v in net.state_dict().items()}
    tm = mt.trace_module(net, _x(2, 0))
    for k, v in net.state_dict().items():               # tracing changed nothing
        np.testing.assert_array_equal(v.numpy(), before[k], err_msg=k)
    assert list(tm.state_dict()) == list(net.state_dict())
    assert tm.training and tm.blocks[1].bn.training and net.blocks[1].name == "second"
    for i in range(3):
        _assert_same(tm, ref, _x(2 + i, 10 + i))       # other batch sizes too
    assert tm.blocks[0].bn.num_batches_tracked.item() == 3
    buf = io.BytesIO()
    mt.save(tm, buf)
    loaded = mt.load(io.BytesIO(buf.getvalue()))
    assert loaded.training and list(loaded.state_dict()) == list(ref.state_dict())
    _assert_same(loaded, ref, _x(3, 20))
    assert loaded.blocks[0].bn.num_batches_tracked.item() == 4
    # eval mode after loading, as after tracing
    loaded.eval()
    ref.eval()
    _assert_same(loaded, ref, _x(1, 30))
    _assert_same(loaded.flatten(), ref, _x(2, 31))
