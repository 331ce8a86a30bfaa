"""FuseConvBn and BackwardFoldScale on the graphs MegEngine users give them
(flatten, then optimize): user subclasses of Conv2d / BatchNorm2d, which
trace as F.conv2d then F.batch_norm calls, and scales that travel back
through ReLUs, reshapes and adds, read from a literal or from an indexed
tensor attribute. Each test: the outputs equal the unoptimized graph's
(float rounding), the folds are counted, the graph lints, and the result
saves and loads."""
import io

import numpy as np
import pytest

import mgtrace as mt
import mgtrace.functional as F
import mgtrace.module as M
from mgtrace.traced_module import TracedModule, optimize
from mgtrace.traced_module.passes.util import graphs_of

RNG = np.random.default_rng(360)


def _t(*shape, lo=None, hi=None):
    a = RNG.uniform(lo, hi, shape) if lo is not None else RNG.standard_normal(shape)
    return mt.tensor(a.astype(np.float32))


class MyConv(M.Conv2d):
    """A user subclass: not a builtin, so the tracer goes into its forward."""

    def forward(self, x):
        return F.conv2d(x, self.weight, self.bias, self.stride, self.padding)


class MyBN(M.BatchNorm2d):
    def forward(self, x):
        return F.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias,
                            training=False, eps=self.eps)


def _bn_stats(bn, c):
    bn.running_mean = _t(c, lo=-0.5, hi=0.5)
    bn.running_var = _t(c, lo=0.5, hi=1.5)
    if bn.affine:
        bn.weight = M.Parameter(_t(c, lo=0.5, hi=1.5))
        bn.bias = M.Parameter(_t(c, lo=-0.5, hi=0.5))
    return bn


class SubclassNet(M.Module):
    def __init__(self, conv_cls=MyConv, bn_cls=MyBN, bias=True, affine=True):
        super().__init__()
        self.conv = conv_cls(3, 6, 3, padding=1, bias=bias)
        self.bn = _bn_stats(bn_cls(6, affine=affine), 6)

    def forward(self, x):
        return F.relu(self.bn(self.conv(x)))


def _exprs(tm):
    """The exprs a call of tm runs (not those of submodules flatten() left)."""
    return [e for g in graphs_of(tm) for e in g._exprs]


def _count(tm, fn):
    return sum(1 for e in _exprs(tm) if e.kind == "call_function"
               and getattr(e.func, "__name__", None) == fn.__name__)


def _check(tm, passes, *xs):
    """Optimize tm, return (new module, report); outputs equal, graphs lint,
    a save/load round trip gives the same outputs."""
    want = tm(*xs).numpy()
    new, report = optimize(tm, passes, return_report=True)
    got = new(*xs).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * float(np.abs(want).max()))
    for m in new.modules():
        if isinstance(m, TracedModule):
            for g in m._graphs:
                g.lint()
    buf = io.BytesIO()
    mt.save(new, buf)
    np.testing.assert_allclose(mt.load(io.BytesIO(buf.getvalue()))(*xs).numpy(), got,
                               rtol=1e-6, atol=1e-7)
    return new, report


@pytest.mark.parametrize("bias,affine", [(True, True), (False, True), (True, False)])
def test_fuse_conv_bn_on_a_flattened_graph_of_user_subclasses(bias, affine):
    x = _t(2, 3, 7, 7)
    tm = mt.trace_module(SubclassNet(bias=bias, affine=affine).eval(), x).flatten()
    assert _count(tm, F.conv2d) == 1 and _count(tm, F.batch_norm) == 1
    new, report = _check(tm, ["FuseConvBn"], x)
    assert report["FuseConvBn"].counts == {"folds": 1}
    assert _count(new, F.batch_norm) == 0 and _count(new, F.conv2d) == 1


@pytest.mark.parametrize("conv_cls,bn_cls", [(M.Conv2d, MyBN), (MyConv, M.BatchNorm2d)],
                         ids=["module-conv", "module-bn"])
def test_fuse_conv_bn_mixing_module_and_functional_forms(conv_cls, bn_cls):
    x = _t(2, 3, 6, 6)
    tm = mt.trace_module(SubclassNet(conv_cls, bn_cls).eval(), x).flatten()
    new, report = _check(tm, ["FuseConvBn"], x)
    assert report["FuseConvBn"].counts == {"folds": 1}
    assert _count(new, F.batch_norm) == 0
    bn_calls = [e for e in _exprs(new) if e.kind == "call_method" and e.method == "__call__"
                and type(e.args[0].owner) is M.BatchNorm2d]
    assert bn_calls == []


def test_fuse_conv_bn_leaves_a_conv_with_a_second_reader():
    class TwoReaders(SubclassNet):
        def forward(self, x):
            y = self.conv(x)
            return self.bn(y) + y
    x = _t(1, 3, 5, 5)
    tm = mt.trace_module(TwoReaders().eval(), x).flatten()
    new, report = _check(tm, ["FuseConvBn"], x)
    assert report["FuseConvBn"].counts == {"folds": 0}
    assert _count(new, F.batch_norm) == 1


def test_fuse_conv_bn_leaves_training_batch_norm():
    class TrainBN(M.BatchNorm2d):
        def forward(self, x):
            return F.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias,
                                training=True, inplace=False)[0]
    x = _t(2, 3, 5, 5)
    tm = mt.trace_module(SubclassNet(MyConv, TrainBN).eval(), x).flatten()
    new, report = _check(tm, ["FuseConvBn"], x)
    assert report["FuseConvBn"].counts == {"folds": 0}


# ------------------------------------------------------------- BackwardFoldScale

class Branches(M.Module):
    """MegEngine's docstring example, and then some: two convs, ReLU,
    constants added on each branch, a reshape, then one scale."""

    def __init__(self, scale_from="literal", scale=3.0):
        super().__init__()
        self.a = M.Conv2d(3, 4, 3, padding=1)
        self.b = MyConv(3, 4, 1)
        self.scale_from = scale_from
        self.scales = mt.tensor(np.array([0.5, scale, -1.0], np.float32))
        self.scale = scale

    def forward(self, x):
        h = F.relu(self.a(x))
        x1 = h + 3.0
        x2 = self.b(x) + 4.0
        y = (x1 + x2).reshape(x.shape[0], -1)
        s = self.scales[1] if self.scale_from == "attribute" else self.scale
        return y * s


@pytest.mark.parametrize("scale_from", ["literal", "attribute"])
def test_backward_fold_scale_through_relu_adds_and_reshape(scale_from):
    x = _t(2, 3, 5, 5)
    tm = mt.trace_module(Branches(scale_from).eval(), x).flatten()
    new, report = _check(tm, ["FuseConvBn", "BackwardFoldScale"], x)
    assert report["BackwardFoldScale"].counts["folds"] == 1
    # no product left: the scale is in both convs and the two constants
    muls = [e for e in _exprs(new) if e.kind == "call_method" and e.method in ("__mul__", "__rmul__")]
    assert muls == []
    np.testing.assert_allclose(new.a.weight.numpy(), tm.a.weight.numpy() * 3.0, rtol=1e-6)
    np.testing.assert_allclose(new.a.bias.numpy(), tm.a.bias.numpy() * 3.0, rtol=1e-6)
    # the original module keeps its weights
    assert tm.a.weight is not new.a.weight


def test_backward_fold_scale_stops_at_relu_for_a_negative_scale():
    x = _t(2, 3, 5, 5)
    tm = mt.trace_module(Branches("literal", scale=-2.0).eval(), x).flatten()
    new, report = _check(tm, ["FuseConvBn", "BackwardFoldScale"], x)
    assert report["BackwardFoldScale"].counts["folds"] == 0


def test_backward_fold_scale_needs_every_branch_to_reach_a_layer():
    class OneBranchFromInput(M.Module):
        def __init__(self):
            super().__init__()
            self.a = M.Conv2d(3, 3, 3, padding=1)

        def forward(self, x):
            return (self.a(x) + x) * 2.0       # x itself cannot take the scale

    x = _t(1, 3, 4, 4)
    tm = mt.trace_module(OneBranchFromInput().eval(), x)
    new, report = _check(tm, ["FuseConvBn", "BackwardFoldScale"], x)
    assert report["BackwardFoldScale"].counts["folds"] == 0


def test_backward_fold_scale_with_a_shared_intermediate_is_left_alone():
    class Shared(M.Module):
        def __init__(self):
            super().__init__()
            self.a = M.Conv2d(3, 3, 1)

        def forward(self, x):
            h = F.relu(self.a(x))
            return h * 2.0 + h                 # h has two readers

    x = _t(1, 3, 4, 4)
    tm = mt.trace_module(Shared().eval(), x)
    new, report = _check(tm, ["FuseConvBn", "BackwardFoldScale"], x)
    assert report["BackwardFoldScale"].counts["folds"] == 0


class Pooled(M.Module):
    """conv -> max pool (module) -> avg pool (function) -> [:, :2] -> * s."""

    def __init__(self, scale):
        super().__init__()
        self.conv = M.Conv2d(3, 4, 3, padding=1)
        self.pool = M.MaxPool2d(2)
        self.scale = scale

    def forward(self, x):
        y = F.avg_pool2d(self.pool(self.conv(x)), 2)
        return y[:, :2] * self.scale


@pytest.mark.parametrize("scale,folds", [(2.5, 1), (-2.0, 0)])
def test_backward_fold_scale_through_pools_and_indexing(scale, folds):
    x = _t(2, 3, 8, 8)
    tm = mt.trace_module(Pooled(scale).eval(), x)
    new, report = _check(tm, ["FuseConvBn", "BackwardFoldScale"], x)
    assert report["BackwardFoldScale"].counts["folds"] == folds      # max pool: positive only
    if folds:
        np.testing.assert_allclose(new.conv.weight.numpy(), tm.conv.weight.numpy() * scale,
                                   rtol=1e-6)


# ------------------------- BackwardFoldScale: several readers, concat, min/max, neg

class DocExample(M.Module):
    """MegEngine's BackwardFoldScale docstring: relu(conv) read twice, both
    readers carrying the one scale that follows."""

    def __init__(self, second=3.0):
        super().__init__()
        self.conv = M.Conv2d(3, 4, 3, padding=1)
        self.second = second

    def forward(self, x):
        x = F.relu(self.conv(x))
        x1 = x + 3
        x2 = x + 4
        if self.second == 3.0:
            return (x1 + x2) * 3
        return x1 * 3 + x2 * self.second


def _muls(tm):
    return [e for e in _exprs(tm) if e.kind == "call_method" and e.method in ("__mul__", "__rmul__")]


def test_backward_fold_scale_where_every_reader_carries_the_same_scale():
    x = _t(2, 3, 5, 5)
    tm = mt.trace_module(DocExample().eval(), x)
    new, report = _check(tm, ["FuseConvBn", "BackwardFoldScale"], x)
    assert report["BackwardFoldScale"].counts["folds"] == 1 and _muls(new) == []
    np.testing.assert_allclose(new.conv.weight.numpy(), tm.conv.weight.numpy() * 3, rtol=1e-6)
    # the constants became 9 and 12, as in MegEngine's docstring
    adds = sorted(float(e.args[1]) for e in _exprs(new) if e.kind == "call_method"
                  and e.method == "__add__" and isinstance(e.args[1], (int, float)))
    assert adds == [9.0, 12.0]


def test_backward_fold_scale_leaves_readers_with_different_scales():
    x = _t(2, 3, 5, 5)
    tm = mt.trace_module(DocExample(second=2.0).eval(), x)
    new, report = _check(tm, ["FuseConvBn", "BackwardFoldScale"], x)
    assert report["BackwardFoldScale"].counts["folds"] == 0 and len(_muls(new)) == 2


class Concat(M.Module):
    def __init__(self, scale):
        super().__init__()
        self.a = M.Conv2d(3, 4, 3, padding=1)
        self.b = MyConv(3, 2, 1)
        self.scale = scale

    def forward(self, x):
        return F.concat([F.relu(self.a(x)), self.b(x)], axis=1) * self.scale


@pytest.mark.parametrize("scale,folds", [(1.5, 1), (-1.5, 0)])
def test_backward_fold_scale_into_every_input_of_a_concat(scale, folds):
    x = _t(2, 3, 5, 5)
    tm = mt.trace_module(Concat(scale).eval(), x).flatten()
    new, report = _check(tm, ["FuseConvBn", "BackwardFoldScale"], x)
    assert report["BackwardFoldScale"].counts["folds"] == folds      # relu on one input
    if folds:
        np.testing.assert_allclose(new.a.weight.numpy(), tm.a.weight.numpy() * scale, rtol=1e-6)
        assert _muls(new) == []


class Reduced(M.Module):
    def __init__(self, scale, how):
        super().__init__()
        self.conv = M.Conv2d(3, 4, 3, padding=1)
        self.scale, self.how = scale, how

    def forward(self, x):
        y = self.conv(x)
        y = F.max(y, axis=1) if self.how == "F.max" else y.min(axis=(2, 3), keepdims=True)
        return y * self.scale


@pytest.mark.parametrize("how", ["F.max", "min"])
@pytest.mark.parametrize("scale,folds", [(2.0, 1), (-2.0, 0)])
def test_backward_fold_scale_through_min_and_max_for_a_positive_scale(how, scale, folds):
    x = _t(2, 3, 5, 5)
    tm = mt.trace_module(Reduced(scale, how).eval(), x)
    new, report = _check(tm, ["FuseConvBn", "BackwardFoldScale"], x)
    assert report["BackwardFoldScale"].counts["folds"] == folds     # a negative one swaps them


class Negated(M.Module):
    def __init__(self, through_relu, then=None):
        super().__init__()
        self.conv = M.Conv2d(3, 4, 3, padding=1)
        self.through_relu, self.then = through_relu, then

    def forward(self, x):
        y = self.conv(x)
        y = -F.relu(y) if self.through_relu else F.neg(y)
        return y if self.then is None else y * self.then


@pytest.mark.parametrize("through_relu,then,folds,factor", [
    (False, None, 1, -1.0),          # F.neg(conv): the weights negated
    (True, None, 0, None),           # -relu(conv): -1 cannot pass the ReLU
    (True, -2.5, 1, 2.5),            # (-relu(conv)) * -2.5: the product of both, 2.5, can
])
def test_backward_fold_scale_counts_neg_as_a_product(through_relu, then, folds, factor):
    x = _t(2, 3, 5, 5)
    tm = mt.trace_module(Negated(through_relu, then).eval(), x)
    new, report = _check(tm, ["FuseConvBn", "BackwardFoldScale"], x)
    assert report["BackwardFoldScale"].counts["folds"] == folds
    if folds:
        np.testing.assert_allclose(new.conv.weight.numpy(), tm.conv.weight.numpy() * factor, rtol=1e-6)
        assert _muls(new) == [] and not any(e.kind == "call_method" and e.method == "__neg__"
                                            for e in _exprs(new))
