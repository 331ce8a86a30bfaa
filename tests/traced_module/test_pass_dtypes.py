"""The same inputs, the same answer, at every stage (issue 29 item 10, the
dtype half): eager, traced, optimized and loaded modules given a float64
or float16 input return the dtype MegEngine's promotion gives (float32
weights: float64 in, float64 out; float16 in, float32 out) and the same
values; the fused kernels that take float32 only (NCHW16c, attention's
float path) run their unfused sequence for other dtypes. Expected values
are NumPy's."""
import numpy as np
import pytest

import mgtrace as mt
import mgtrace.functional as F
import mgtrace.module as M
from mgtrace.traced_module import optimize

NCHWC_RUN = ["FuseConvBn", "FuseConvAct", "NCHWc", "FusePointwiseDepthwise", "EliminateDeadCode"]


def _conv(x, w, b=None, padding=0, groups=1):
    """NumPy conv2d, stride 1: x [N, C, H, W], w [O, C/groups, KH, KW]."""
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (padding, padding), (padding, padding)))
    oh, ow = h + 2 * padding - kh + 1, wd + 2 * padding - kw + 1
    y = np.zeros((n, o, oh, ow))
    og = o // groups
    for g in range(groups):
        xs = xp[:, g * cg:(g + 1) * cg]
        for i in range(kh):
            for j in range(kw):
                y[:, g * og:(g + 1) * og] += np.einsum(
                    "nchw,oc->nohw", xs[:, :, i:i + oh, j:j + ow], w[g * og:(g + 1) * og, :, i, j])
    return y if b is None else y + b.reshape(1, -1, 1, 1)


def _w(m):
    return m.weight.numpy().astype(np.float64), m.bias.numpy().astype(np.float64)


class Net(M.Module):
    """A stem, a residual conv, an inverted-residual block (expansion,
    depthwise, projection with its shortcut), a max pooling and a global
    average pooling: every NCHW16c kernel the passes use."""

    def __init__(self):
        super().__init__()
        self.stem = M.Conv2d(3, 20, 1)
        self.res = M.Conv2d(20, 20, 3, padding=1)
        self.expand = M.Conv2d(20, 32, 1)
        self.dw = M.Conv2d(32, 32, 3, padding=1, groups=32)
        self.project = M.Conv2d(32, 20, 1)
        self.pool = M.MaxPool2d(2)
        self.gap = M.AdaptiveAvgPool2d(1)

    def forward(self, x):
        y = F.relu(self.stem(x))
        y = F.relu(self.res(y) + y)
        y = self.project(F.relu6(self.dw(F.relu6(self.expand(y))))) + y
        y = self.pool(y)
        return self.gap(y).reshape(y.shape[0], -1)

    def expected(self, x):
        y = np.maximum(_conv(x, *_w(self.stem)), 0)
        y = np.maximum(_conv(y, *_w(self.res), padding=1) + y, 0)
        e = np.clip(_conv(y, *_w(self.expand)), 0, 6)
        d = np.clip(_conv(e, *_w(self.dw), padding=1, groups=32), 0, 6)
        y = _conv(d, *_w(self.project)) + y
        n, c, h, w = y.shape
        y = y.reshape(n, c, h // 2, 2, w // 2, 2).max(axis=(3, 5))
        return y.mean(axis=(2, 3))


@pytest.fixture(scope="module")
def stages(tmp_path_factory):
    """The eager net, its trace, its NCHWc-optimized copy and that copy saved and loaded."""
    rng = np.random.default_rng(10)
    net = Net().eval()
    x = mt.tensor(rng.standard_normal((1, 3, 6, 6)).astype(np.float32))
    tm = mt.trace_module(net, x)
    fast = optimize(tm, NCHWC_RUN)
    kinds = {getattr(e, "func", None).__name__ for e in fast.graph._exprs if hasattr(e, "func")}
    assert {"conv2d_nchwc", "conv2d_nchwc_pw_dw_pw", "max_pool2d_nchwc"} <= kinds, kinds
    path = tmp_path_factory.mktemp("dtypes") / "net.tmod"
    mt.save(fast, str(path))
    return net, {"eager": net, "traced": tm, "optimized": fast, "loaded": mt.load(str(path))}


@pytest.mark.parametrize("dtype, result", [("float32", "float32"), ("float64", "float64"),
                                           ("float16", "float32")])
@pytest.mark.parametrize("stage", ["eager", "traced", "optimized", "loaded"])
def test_every_stage_gives_the_promoted_dtype_and_values(stages, stage, dtype, result):
    net, mods = stages
    rng = np.random.default_rng(11)
    x = rng.standard_normal((2, 3, 6, 6)).astype(dtype)
    y = mods[stage](mt.tensor(x))
    assert y.dtype == result
    want = net.expected(x.astype(np.float64))
    np.testing.assert_allclose(y.numpy().astype(np.float64), want, rtol=0,
                               atol=1e-5 * max(1.0, np.abs(want).max()))


@pytest.mark.parametrize("stage", ["eager", "traced", "optimized", "loaded"])
def test_an_integer_input_is_refused_at_every_stage(stages, stage):
    _, mods = stages
    with pytest.raises(TypeError, match=r"x must be a floating-point tensor, got int32; convert it"):
        mods[stage](mt.tensor(np.ones((1, 3, 6, 6), np.int32)))


def test_the_layout_conversions_take_any_dtype():
    x = np.arange(2 * 20 * 2 * 3).reshape(2, 20, 2, 3)
    for dtype in ("float64", "float16", "int32"):
        b = F.to_nchwc(mt.tensor(x.astype(dtype)))
        want = np.zeros((2, 2, 2, 3, 16), dtype)
        for c in range(20):
            want[:, c // 16, :, :, c % 16] = x[:, c]
        assert b.dtype == dtype and b.shape == (2, 2, 2, 3, 16)
        np.testing.assert_array_equal(b.numpy(), want)
        np.testing.assert_array_equal(F.from_nchwc(b, 20).numpy(), x.astype(dtype))
    with pytest.raises(ValueError, match=r"channels must be in \(16, 32\]"):
        F.from_nchwc(mt.tensor(want), 33)


def test_nchwc_kernels_with_float64_operands_give_conv2d_act_in_float64():
    rng = np.random.default_rng(12)
    x = rng.standard_normal((1, 20, 5, 5))
    w = rng.standard_normal((18, 20, 3, 3)).astype(np.float32)
    r = rng.standard_normal((1, 18, 5, 5))
    y = F.conv2d_nchwc(F.to_nchwc(mt.tensor(x)), mt.tensor(w), padding=1, act="sigmoid",
                       residual=F.to_nchwc(mt.tensor(r)))
    assert y.dtype == np.float64
    want = 1 / (1 + np.exp(-(_conv(x, w.astype(np.float64), padding=1) + r)))
    np.testing.assert_allclose(F.from_nchwc(y, 18).numpy(), want, rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(y.numpy()[:, 1, ..., 2:], 0.5)     # act(0) past the 18 channels
    p = F.max_pool2d_nchwc(y, 2)
    assert p.dtype == np.float64
    np.testing.assert_allclose(F.from_nchwc(p, 18).numpy(),
                               want[:, :, :4, :4].reshape(1, 18, 2, 2, 2, 2).max(axis=(3, 5)),
                               rtol=1e-12)


def test_attention_with_integer_operands_runs_the_sequence():
    q = np.arange(24, dtype=np.int32).reshape(1, 2, 3, 4) % 5
    got = F.attention(mt.tensor(q), mt.tensor(q), mt.tensor(q), scale=0.25)
    s = (q @ q.transpose(0, 1, 3, 2)) * 0.25
    p = np.exp(s - s.max(-1, keepdims=True))
    assert got.dtype == np.float32
    np.testing.assert_allclose(got.numpy(), (p / p.sum(-1, keepdims=True)) @ q, rtol=1e-5, atol=1e-5)
