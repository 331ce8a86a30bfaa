"""Passes keep the eager answer when a parameter has other readers (tied
weights, a module under two names) and when the forward writes into its
own state (``+=`` on a buffer, ``buf[...] = v``, a step counter, a write
through a view, a BatchNorm or ``F.batch_norm`` updating its statistics):
issue 29, items 1 and 2. Each model's expected values are computed here
with NumPy, call after call (state carried across calls included)."""
import copy

import numpy as np
import pytest

import mgtrace as mt
import mgtrace.functional as F
import mgtrace.module as M
from mgtrace.functional._trace import mutates
from mgtrace.traced_module import optimize, wrap

RUNS = [{}, {"enabled_pass": "all"}, {"enabled_pass": "all", "flatten": True}]
RUN_IDS = ["default", "all", "all-flat"]


def _np(t):
    return t.numpy().astype(np.float64)


def _close(got, want):
    scale = max(1.0, float(np.abs(want).max()))
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * scale)


def _conv1x1(x, w, b=None):
    """NumPy 1x1 conv2d: x [N, C, H, W], w [O, C, 1, 1], b [O]."""
    y = np.einsum("nchw,oc->nohw", x, w[:, :, 0, 0])
    return y if b is None else y + b.reshape(1, -1, 1, 1)


def _bn(y, bn):
    s = _np(bn.weight) / np.sqrt(_np(bn.running_var) + bn.eps)
    return (y - _np(bn.running_mean).reshape(1, -1, 1, 1)) * s.reshape(1, -1, 1, 1) \
        + _np(bn.bias).reshape(1, -1, 1, 1)


def _random_bn(bn, rng):
    n = bn.num_features
    bn.running_mean = mt.tensor(rng.standard_normal(n).astype(np.float32))
    bn.running_var = mt.tensor((rng.random(n) + 0.5).astype(np.float32))
    bn.weight = M.Parameter(mt.tensor((rng.random(n) + 0.5).astype(np.float32)))
    bn.bias = M.Parameter(mt.tensor(rng.standard_normal(n).astype(np.float32)))
    return bn


def _optimized(net, x, run):
    tm = mt.trace_module(copy.deepcopy(net), x)
    fast = optimize(tm, **run)
    fast.graph.lint()
    return fast


# ------------------------------------------------ item 1: other readers

class TiedConv(M.Module):
    """A conv folded with its BatchNorm whose weight F.conv2d reads too."""

    def __init__(self, rng):
        super().__init__()
        self.conv = M.Conv2d(3, 4, 1)
        self.bn = _random_bn(M.BatchNorm2d(4), rng)

    def forward(self, x):
        return self.bn(self.conv(x)) + F.conv2d(x, self.conv.weight)

    def expected(self, x):
        w, b = _np(self.conv.weight), _np(self.conv.bias)
        return _bn(_conv1x1(x, w, b), self.bn) + _conv1x1(x, w)


class TwoNames(M.Module):
    """The conv held as ``conv`` and as ``alias``; the alias's weight and
    bias read by a function call."""

    def __init__(self, rng):
        super().__init__()
        self.conv = M.Conv2d(3, 4, 1)
        self.alias = self.conv
        self.bn = _random_bn(M.BatchNorm2d(4), rng)

    def forward(self, x):
        return self.bn(self.conv(x)) + F.conv2d(x, self.alias.weight, self.alias.bias)

    def expected(self, x):
        w, b = _np(self.conv.weight), _np(self.conv.bias)
        return _bn(_conv1x1(x, w, b), self.bn) + _conv1x1(x, w, b)


class TiedScale(M.Module):
    """A constant scale after conv + ReLU (BackwardFoldScale) and the conv's
    weight read by F.conv2d."""

    def __init__(self, rng):
        super().__init__()
        self.conv = M.Conv2d(3, 4, 1)

    def forward(self, x):
        return F.relu(self.conv(x)) * 3.0 + F.conv2d(x, self.conv.weight)

    def expected(self, x):
        w, b = _np(self.conv.weight), _np(self.conv.bias)
        return np.maximum(_conv1x1(x, w, b), 0) * 3.0 + _conv1x1(x, w)


class SharedParameter(M.Module):
    """Two convs holding one Parameter; the first is folded with a
    BatchNorm, the second must keep computing with the unfolded weight."""

    def __init__(self, rng):
        super().__init__()
        self.c1 = M.Conv2d(3, 3, 1)
        self.c2 = M.Conv2d(3, 3, 1)
        self.c2.weight = self.c1.weight
        self.bn = _random_bn(M.BatchNorm2d(3), rng)

    def forward(self, x):
        return self.c2(self.bn(self.c1(x)))

    def expected(self, x):
        w = _np(self.c1.weight)
        y = _bn(_conv1x1(x, w, _np(self.c1.bias)), self.bn)
        return _conv1x1(y, w, _np(self.c2.bias))


class ConvBn(M.Module):
    def __init__(self, rng):
        super().__init__()
        self.conv = M.Conv2d(3, 3, 1)
        self.bn = _random_bn(M.BatchNorm2d(3), rng)

    def forward(self, x):
        return self.bn(self.conv(x))

    def expected(self, x):
        return _bn(_conv1x1(x, _np(self.conv.weight), _np(self.conv.bias)), self.bn)


class CalledTwice(M.Module):
    """One conv (and BatchNorm) called twice in one graph, and a traced
    submodule held under two names and called through both."""

    def __init__(self, rng):
        super().__init__()
        self.conv = M.Conv2d(3, 3, 1)
        self.bn = _random_bn(M.BatchNorm2d(3), rng)
        self.block = ConvBn(rng)
        self.again = self.block

    def forward(self, x):
        y = self.bn(self.conv(self.bn(self.conv(x))))
        return self.again(self.block(y))

    def expected(self, x):
        one = lambda v: _bn(_conv1x1(v, _np(self.conv.weight), _np(self.conv.bias)), self.bn)
        return self.block.expected(self.block.expected(one(one(x))))


class TiedLinear(M.Module):
    """A Linear whose weight is an Embedding's (and F.linear reads it):
    BackwardFoldScale must not scale what the Embedding looks up."""

    def __init__(self, rng):
        super().__init__()
        self.emb = M.Embedding(5, 3)
        self.lin = M.Linear(3, 5)
        self.lin.weight = self.emb.weight

    def forward(self, x):
        idx = mt.tensor(np.array([0, 3], np.int32))
        return (self.lin(x) * 2.0).sum() + self.emb(idx).sum() + F.linear(x, self.lin.weight).sum()

    def expected(self, x):
        w = _np(self.emb.weight)
        return ((x @ w.T + _np(self.lin.bias)) * 2.0).sum() + w[[0, 3]].sum() + (x @ w.T).sum()


@pytest.mark.parametrize("run", RUNS, ids=RUN_IDS)
@pytest.mark.parametrize("cls", [TiedConv, TwoNames, TiedScale, SharedParameter, CalledTwice,
                                 TiedLinear])
def test_other_readers_of_a_parameter_see_it_unchanged(cls, run):
    rng = np.random.default_rng(29)
    net = cls(rng).eval()
    shape = (2, 3) if cls is TiedLinear else (2, 3, 5, 5)
    x = rng.standard_normal(shape).astype(np.float32)
    fast = _optimized(net, mt.tensor(x), run)
    want = net.expected(x.astype(np.float64))
    for _ in range(2):
        _close(_np(fast(mt.tensor(x))), want)


def test_a_fold_gives_the_layer_new_parameters_and_leaves_the_shared_one():
    """FuseConvBn folds c1 (its call is the only reader of c1) into new
    Parameters; c2 still holds the original, unchanged."""
    rng = np.random.default_rng(1)
    net = SharedParameter(rng).eval()
    x = mt.tensor(rng.standard_normal((1, 3, 4, 4)).astype(np.float32))
    fast = optimize(mt.trace_module(net, x))
    assert fast.graph.get_module_by_type(M.BatchNorm2d).as_count() == 0
    assert fast.c1.weight is not fast.c2.weight
    np.testing.assert_array_equal(fast.c2.weight.numpy(), net.c1.weight.numpy())


def test_a_layer_read_elsewhere_is_not_folded():
    """The conv whose weight F.conv2d reads keeps its weight and its BatchNorm."""
    rng = np.random.default_rng(2)
    net = TiedConv(rng).eval()
    x = mt.tensor(rng.standard_normal((1, 3, 4, 4)).astype(np.float32))
    from mgtrace.traced_module.passes.util import StateUses
    fast = optimize(mt.trace_module(net, x), "all")
    np.testing.assert_array_equal(fast.conv.weight.numpy(), net.conv.weight.numpy())
    assert StateUses(mt.trace_module(net, x)).may_rewrite(net.conv) is False


# ------------------------------------------------ item 2: mutable state

class StepCounter(M.Module):
    """A step counter bumped after it is read."""

    def __init__(self):
        super().__init__()
        self.step = mt.tensor(np.zeros((), np.float32))
        self.w = mt.tensor(np.ones(4, np.float32))

    def forward(self, x):
        y = x * (self.w + self.step)
        self.step += 1
        return y

    @staticmethod
    def expected(x, calls):
        return [x * (1.0 + k) for k in range(calls)]


class SetItem(M.Module):
    """A buffer overwritten with ``buf[...] = v`` after it is read."""

    def __init__(self):
        super().__init__()
        self.buf = mt.tensor(np.ones(4, np.float32))

    def forward(self, x):
        y = (x + self.buf) * 2.0 + self.buf
        self.buf[...] = self.buf * 3.0
        return y

    @staticmethod
    def expected(x, calls):
        return [(x + 3.0 ** k) * 2.0 + 3.0 ** k for k in range(calls)]


class WriteBetween(M.Module):
    """``+=`` between two steps FuseAddMul would merge."""

    def __init__(self):
        super().__init__()
        self.buf = mt.tensor(np.ones(4, np.float32))

    def forward(self, x):
        y = x * self.buf
        self.buf += 1.0
        return y * 2.0

    @staticmethod
    def expected(x, calls):
        return [x * (1.0 + k) * 2.0 for k in range(calls)]


class ViewWrite(M.Module):
    """A write into a view of the buffer (reshape shares storage)."""

    def __init__(self):
        super().__init__()
        self.buf = mt.tensor(np.ones((2, 2), np.float32))

    def forward(self, x):
        y = x * (self.buf.reshape(-1) * 2.0)
        v = self.buf.reshape(-1)
        v[...] = v + 1.0
        return y

    @staticmethod
    def expected(x, calls):
        return [x * (1.0 + k) * 2.0 for k in range(calls)]


class _Doubler(M.Module):
    def __init__(self):
        super().__init__()
        self.buf = mt.tensor(np.ones(4, np.float32))

    def forward(self, x):
        self.buf *= 2.0
        return x


class NestedWrite(M.Module):
    """A traced submodule writes the buffer its parent reads."""

    def __init__(self):
        super().__init__()
        self.sub = _Doubler()

    def forward(self, x):
        y = x + self.sub.buf * 1.0
        return self.sub(y) + (self.sub.buf + 0.0)

    @staticmethod
    def expected(x, calls):
        return [x + 2.0 ** k + 2.0 ** (k + 1) for k in range(calls)]


@wrap
@mutates("acc")
def accumulate(acc, x):
    """A user function declared to write into ``acc``."""
    acc[...] = acc + x.sum()
    return x


class UserMutates(M.Module):
    """A wrapped user function declared with ``mutates`` updates a buffer
    that is read after it."""

    def __init__(self):
        super().__init__()
        self.acc = mt.tensor(np.zeros(4, np.float32))

    def forward(self, x):
        x = accumulate(self.acc, x)
        return x + self.acc * 1.0

    @staticmethod
    def expected(x, calls):
        return [x + x.sum() * (k + 1) for k in range(calls)]


class SharedStorage(M.Module):
    """A buffer that is a slice of another, which forward writes: the slice
    is another tensor object, but its storage is written (found by the
    pipeline fuzzer, seed 3 case 95)."""

    def __init__(self):
        super().__init__()
        self.stat = mt.tensor(np.zeros(6, np.float32))
        self.head = self.stat[:4]

    def forward(self, x):
        self.stat += 1.0
        return x + self.head.sum()

    @staticmethod
    def expected(x, calls):
        return [x + 4.0 * (k + 1) for k in range(calls)]


@pytest.mark.parametrize("run", RUNS + [{"enabled_pass": ["FoldConstant"]},
                                        {"enabled_pass": ["FuseAddMul"]}],
                         ids=RUN_IDS + ["FoldConstant", "FuseAddMul"])
@pytest.mark.parametrize("cls", [StepCounter, SetItem, WriteBetween, ViewWrite, NestedWrite,
                                 UserMutates, SharedStorage])
def test_state_the_forward_writes_is_not_folded(cls, run):
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    fast = _optimized(cls().eval(), mt.tensor(x), run)
    for got, want in zip([_np(fast(mt.tensor(x))) for _ in range(3)],
                         cls.expected(x.astype(np.float64), 3)):
        _close(got, want)


class StatsReader(M.Module):
    """Reads a BatchNorm's running mean after the BatchNorm (training mode)
    or F.batch_norm (``training=True``, declared with ``mutates``) updated it."""

    def __init__(self, functional):
        super().__init__()
        self.functional = functional
        self.bn = M.BatchNorm2d(4, affine=False)

    def forward(self, x):
        if self.functional:
            y = F.batch_norm(x, self.bn.running_mean, self.bn.running_var, training=True)
        else:
            y = self.bn(x)
        return y + (self.bn.running_mean * 2.0).reshape(1, 4, 1, 1)


@pytest.mark.parametrize("functional", [False, True], ids=["module", "F.batch_norm"])
def test_running_statistics_updated_in_forward_are_not_folded(functional):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 4, 3, 3)).astype(np.float32)
    net = StatsReader(functional)
    net.train(not functional)
    fast = _optimized(net, mt.tensor(x), {"enabled_pass": "all"})
    mean, xs = np.zeros(4), x.astype(np.float64)
    batch_mean, batch_var = xs.mean(axis=(0, 2, 3)), xs.var(axis=(0, 2, 3))
    normed = (xs - batch_mean.reshape(1, 4, 1, 1)) / np.sqrt(batch_var.reshape(1, 4, 1, 1) + 1e-5)
    for _ in range(3):
        mean = 0.9 * mean + 0.1 * batch_mean        # MegEngine's momentum 0.9
        _close(_np(fast(mt.tensor(x))), normed + (mean * 2.0).reshape(1, 4, 1, 1))


def test_state_uses_names_the_written_tensors():
    from mgtrace.traced_module.passes.util import StateUses
    tm = mt.trace_module(StepCounter().eval(), mt.tensor(np.ones((1, 4), np.float32)))
    uses = StateUses(tm)
    assert uses.is_written(tm.step) and not uses.is_written(tm.w)
    reads = {e.name: e.outputs[0] for e in tm.graph._exprs if e.kind == "getattr"}
    assert uses.constant(reads["w"]) is tm.w and uses.constant(reads["step"]) is None
