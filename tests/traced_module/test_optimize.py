"""optimize() and its passes, register_pass, replace_pattern.

What is proved, for every pass: the optimized module gives the unoptimized
graph's outputs (max abs error <= 1e-5 of the output's scale), the pattern
it targets is rewritten (the graph's exprs and state_dict say so), the
non-patterns are left alone (a BatchNorm in training mode, a conv whose
output has a second user, a module called twice, a scale of the wrong
sign or shape), the argument is never changed, every graph lints, and the
result saves, loads, flattens, retraces and reproduces.
"""
import warnings

import numpy as np
import pytest

import mgtrace as mt
import mgtrace.functional as F
import mgtrace.models as models
import mgtrace.module as M
from mgtrace._core import nn as _nn
from mgtrace.traced_module import (TracedModule, optimize, register_pass, registered_passes,
                                   replace_pattern)
from mgtrace.traced_module.passes import manager

RTOL = 1e-5



@pytest.fixture(autouse=True)
def _traced_for_inference(monkeypatch):
    """These tests optimize for inference: modules are traced in eval mode
    (trace_module keeps the mode it finds, as MegEngine does); the tests of
    training mode switch the traced module to train() themselves."""
    real = mt.trace_module
    monkeypatch.setattr(mt, "trace_module", lambda m, *a, **k: real(m.eval(), *a, **k))


def close(got, want):
    """max |got - want| <= 1e-5 * max |want| (the issue's criterion)."""
    got, want = np.asarray(got.numpy(), np.float64), np.asarray(want.numpy(), np.float64)
    assert got.shape == want.shape
    scale = max(float(np.abs(want).max()), 1e-30)
    err = float(np.abs(got - want).max())
    assert err <= RTOL * scale, f"max abs error {err} > {RTOL} * {scale}"


def randomise_bn(net, rng):
    for m in net.modules():
        if isinstance(m, M.BatchNorm2d):
            c = m.num_features
            m.running_mean = mt.tensor(rng.uniform(-0.5, 0.5, c).astype("float32"))
            m.running_var = mt.tensor(rng.uniform(0.5, 1.5, c).astype("float32"))
            if m.affine:
                m.weight = M.Parameter(mt.tensor(rng.uniform(0.5, 1.5, c).astype("float32")))
                m.bias = M.Parameter(mt.tensor(rng.uniform(-0.5, 0.5, c).astype("float32")))
    return net


def image(rng, shape=(2, 3, 12, 12)):
    return mt.tensor(rng.standard_normal(shape).astype("float32"))


def calls(tm, cls):
    """Number of calls of modules of class cls over all graphs."""
    return sum(1 for m in tm.modules() if isinstance(m, TracedModule)
               for g in m._graphs for e in g._exprs
               if e.kind == "call_method" and e.method == "__call__"
               and type(e.args[0].owner) is cls)


def functions(tm, fn):
    return tm.graph.get_function_by_type(fn).as_count()


def optimized(tm, passes, *args):
    """optimize, checking that tm is untouched and the outputs agree."""
    before, code = [v.numpy().copy() for v in tm.state_dict().values()], tm.code
    want = tm(*args)
    new = optimize(tm, passes)
    assert tm.code == code
    assert all(np.array_equal(a, v.numpy()) for a, v in zip(before, tm.state_dict().values()))
    close(new(*args), want)
    for m in new.modules():
        if isinstance(m, TracedModule):
            for g in m._graphs:
                g.lint()
    return new


class ConvBnRelu(M.Module):
    def __init__(self, bias=False, affine=True):
        super().__init__()
        self.conv = M.Conv2d(3, 8, 3, padding=1, bias=bias)
        self.bn = M.BatchNorm2d(8, affine=affine)
        self.act = M.ReLU()

    def forward(self, x):
        return self.act(self.bn(self.conv(x)))


# ------------------------------------------------------------------ FuseConvBn

@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("affine", [True, False])
def test_fuse_conv_bn_folds_and_drops_the_batch_norm(rng, bias, affine):
    net = randomise_bn(ConvBnRelu(bias, affine), rng)
    x = image(rng)
    tm = mt.trace_module(net, x)
    new = optimized(tm, "FuseConvBn", x)
    assert calls(new, M.BatchNorm2d) == 0 and calls(new, M.Conv2d) == 1
    assert not any(k.startswith("bn.") for k in new.state_dict())
    assert new.conv.bias is not None and calls(tm, M.BatchNorm2d) == 1
    # the folded weights are the BatchNorm's affine map applied to the conv's
    s = net.bn.running_var.numpy() + net.bn.eps
    s = (net.bn.weight.numpy() if affine else 1.0) / np.sqrt(s)
    np.testing.assert_allclose(new.conv.weight.numpy(), net.conv.weight.numpy() * s[:, None, None, None],
                               rtol=1e-6)


def test_default_pass_list_is_megengines(rng):
    net = randomise_bn(ConvBnRelu(), rng)
    x = image(rng)
    new = optimized(mt.trace_module(net, x), None, x)
    assert manager.DEFAULT_PASSES == ("FuseConvBn",)
    assert calls(new, M.BatchNorm2d) == 0 and calls(new, M.ReLU) == 1   # no FuseConvAct


def test_training_mode_batch_norm_is_kept(rng):
    net = randomise_bn(ConvBnRelu(), rng)
    x = image(rng)
    tm = mt.trace_module(net, x)
    tm.train()
    new = optimize(tm, "FuseConvBn")
    assert calls(new, M.BatchNorm2d) == 1
    # "all" in training mode runs only the passes that keep training behaviour
    new = optimize(tm, "all")
    assert calls(new, M.BatchNorm2d) == 1 and new.training


def test_conv_with_a_second_user_is_not_fused(rng):
    class TwoUsers(M.Module):
        def __init__(self):
            super().__init__()
            self.conv = M.Conv2d(3, 4, 3, padding=1)
            self.bn = M.BatchNorm2d(4)

        def forward(self, x):
            y = self.conv(x)
            return F.relu(self.bn(y)) + y

    net = randomise_bn(TwoUsers(), rng)
    x = image(rng)
    new = optimized(mt.trace_module(net, x), "all", x)
    assert calls(new, M.BatchNorm2d) == 1 and calls(new, M.Conv2d) == 1
    assert functions(new, F.conv2d_act) == 0


def test_shared_conv_is_not_folded(rng):
    class Shared(M.Module):
        def __init__(self):
            super().__init__()
            self.conv = M.Conv2d(3, 3, 1)
            self.bn1, self.bn2 = M.BatchNorm2d(3), M.BatchNorm2d(3)

        def forward(self, x):
            return self.bn1(self.conv(x)) + self.bn2(self.conv(x))

    net = randomise_bn(Shared(), rng)
    x = image(rng)
    new = optimized(mt.trace_module(net, x), "FuseConvBn", x)
    assert calls(new, M.BatchNorm2d) == 2


# ------------------------------------------------------------------ FuseAddMul

class Affine(M.Module):
    def forward(self, x):
        y = (x * 2.0) * 3.0 + 1.0
        y = (y + 2.0) * 0.5 - 4.0
        return y / 4.0


def test_fuse_add_mul_merges_constant_chains(rng):
    x = image(rng)
    tm = mt.trace_module(Affine(), x)
    new = optimized(tm, "FuseAddMul", x)
    assert len(new.graph._exprs) == 4          # self, x, then x * a + b
    assert len(tm.graph._exprs) == 9


def test_fuse_add_mul_leaves_ints_and_shared_values(rng):
    class Mixed(M.Module):
        def forward(self, x, i):
            y = x * 2.0
            return y * 3.0 + y, (i * 2) * 3

    x = image(rng)
    i = mt.tensor(np.arange(4, dtype=np.int32))
    tm = mt.trace_module(Mixed(), x, i)
    new = optimize(tm, "FuseAddMul")
    assert len(new.graph._exprs) == len(tm.graph._exprs)
    for a, b in zip(new(x, i), tm(x, i)):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


# ---------------------------------------------------------- BackwardFoldScale

class Scaled(M.Module):
    def __init__(self, scale, relu=False):
        super().__init__()
        self.conv = M.Conv2d(3, 4, 3)
        self.scale = scale
        self.relu = relu

    def forward(self, x):
        y = self.conv(x)
        if self.relu:
            y = F.relu(y)
        return y * self.scale


@pytest.mark.parametrize("scale", [0.5, "channel"])
def test_backward_fold_scale_folds_into_the_conv(rng, scale):
    if scale == "channel":
        scale = mt.tensor(rng.uniform(0.5, 2.0, (1, 4, 1, 1)).astype("float32"))
    x = image(rng)
    tm = mt.trace_module(Scaled(scale), x)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        new = optimized(tm, ["FuseConvBn", "BackwardFoldScale"], x)
    assert [e.kind for e in new.graph._exprs[2:]] == ["getattr", "call_method"]


def test_backward_fold_scale_through_relu_needs_a_positive_scale(rng):
    x = image(rng)
    pos = optimized(mt.trace_module(Scaled(2.0, relu=True), x), ["FuseConvBn", "BackwardFoldScale"], x)
    assert functions(pos, F.mul) == 0 and pos.graph.get_method_by_type("__mul__").as_count() == 0
    neg = optimized(mt.trace_module(Scaled(-2.0, relu=True), x), ["FuseConvBn", "BackwardFoldScale"], x)
    assert neg.graph.get_method_by_type("__mul__").as_count() == 1


def test_backward_fold_scale_brings_fuse_conv_bn_with_a_warning(rng):
    x = image(rng)
    tm = mt.trace_module(randomise_bn(ConvBnRelu(), rng), x)
    with pytest.warns(UserWarning, match="BackwardFoldScale needs FuseConvBn"):
        new = optimize(tm, "BackwardFoldScale")
    assert calls(new, M.BatchNorm2d) == 0


def test_backward_fold_scale_into_linear(rng):
    class Lin(M.Module):
        def __init__(self):
            super().__init__()
            self.fc = M.Linear(6, 5)
            self.scale = mt.tensor(np.linspace(0.5, 1.5, 5).astype("float32"))   # a buffer

        def forward(self, x):
            return self.fc(x) * self.scale

    x = mt.tensor(rng.standard_normal((3, 6)).astype("float32"))
    new = optimized(mt.trace_module(Lin(), x), ["FuseConvBn", "BackwardFoldScale"], x)
    assert new.graph.get_method_by_type("__mul__").as_count() == 0


# ---------------------------------------------------------------- FoldConstant

def test_fold_constant_computes_constant_exprs_once(rng):
    class Net(M.Module):
        def __init__(self):
            super().__init__()
            self.table = mt.tensor(rng.standard_normal((4, 4)).astype("float32"))

        def forward(self, x):
            w = F.exp(self.table.transpose(1, 0) * 0.5)
            return x @ w

    x = mt.tensor(rng.standard_normal((2, 4)).astype("float32"))
    tm = mt.trace_module(Net(), x)
    new = optimized(tm, "FoldConstant", x)
    kinds = [e.kind for e in new.graph._exprs]
    assert kinds.count("constant") == 1 and functions(new, F.exp) == 0
    assert new.graph.get_function_by_type(F.matmul).as_count() + \
        new.graph.get_method_by_type("__matmul__").as_count() == 1


def test_fold_constant_keeps_input_dependent_and_random_exprs(rng):
    class Net(M.Module):
        def forward(self, x):
            return F.dropout(x, 0.5, training=True) + F.exp(x)

    x = image(rng)
    tm = mt.trace_module(Net(), x)
    new = optimize(tm, "FoldConstant")
    assert [e.kind for e in new.graph._exprs] == [e.kind for e in tm.graph._exprs]


# ---------------------------------------------------------- EliminateIdentity

def test_eliminate_identity_drops_eval_dropout_and_identity(rng):
    net = M.Sequential(M.Linear(4, 4), M.Dropout(0.3), M.Identity(), M.ReLU())
    x = mt.tensor(rng.standard_normal((2, 4)).astype("float32"))
    tm = mt.trace_module(net, x)
    new = optimized(tm, "EliminateIdentity", x)
    assert calls(new, M.Dropout) == 0 and calls(new, M.Identity) == 0
    tm.train()
    assert calls(optimize(tm, "all"), M.Dropout) == 1      # dropout works in training


# ---------------------------------------------------------------- FuseConvAct

@pytest.mark.parametrize("act,fn", [(M.ReLU, None), (M.ReLU6, None), (M.SiLU, None),
                                    (M.Hardswish, None), (M.Sigmoid, None), (M.GELU, None),
                                    (None, F.relu), (None, F.silu)])
def test_fuse_conv_act(rng, act, fn):
    class Net(M.Module):
        def __init__(self):
            super().__init__()
            self.conv = M.Conv2d(3, 16, 3, padding=1)
            self.act = act() if act else None

        def forward(self, x):
            y = self.conv(x)
            return self.act(y) if self.act else fn(y)

    x = image(rng, (2, 3, 10, 10))
    tm = mt.trace_module(Net(), x)
    new = optimized(tm, "FuseConvAct", x)
    assert functions(new, F.conv2d_act) == 1 and calls(new, M.Conv2d) == 0
    assert sorted(new.state_dict()) == sorted(tm.state_dict())      # weights read in place


def test_fuse_conv_act_takes_the_residual_add(rng):
    class Block(M.Module):
        def __init__(self):
            super().__init__()
            self.conv = M.Conv2d(4, 4, 3, padding=1)
            self.act = M.ReLU()

        def forward(self, x, wide):
            y = self.act(self.conv(x) + x)           # fused: same shape
            z = self.act(self.conv(y) + wide)        # not: the add broadcasts
            return z

    x = image(rng, (2, 4, 6, 6))
    wide = image(rng, (2, 4, 1, 6))
    tm = mt.trace_module(Block(), x, wide)
    new = optimized(tm, "FuseConvAct", x, wide)
    fused = new.graph.get_function_by_type(F.conv2d_act).as_list()
    assert len(fused) == 1 and fused[0].kwargs.get("residual") is new.graph.inputs[1]
    assert calls(new, M.Conv2d) == 1


def test_fuse_conv_act_takes_a_residual_add_without_activation(rng):
    """MobileNetV2's linear bottleneck: ``conv(x) + x`` with no activation
    becomes one conv2d_act(act="none", residual=x); a ReLU after the add is
    fused once (with the add), and a conv whose output is also read
    elsewhere keeps its add."""
    class Block(M.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b, self.c = (M.Conv2d(4, 4, 3, padding=1) for _ in range(3))

        def forward(self, x):
            y = self.a(x) + x                   # fused, act "none"
            z = F.relu(self.b(y) + y)           # fused, act "relu"
            w = self.c(z)
            return (w + z) * w                  # not: w has a second user

    x = image(rng, (2, 4, 6, 6))
    new = optimized(mt.trace_module(Block(), x), "FuseConvAct", x)
    fused = new.graph.get_function_by_type(F.conv2d_act).as_list()
    assert sorted(e.kwargs.get("act") for e in fused) == ["none", "relu"]
    assert all(e.kwargs.get("residual") is not None for e in fused)
    assert calls(new, M.Conv2d) == 1 and functions(new, F.relu) == 0
    assert new.graph.get_method_by_type("__add__").as_count() == 1


@pytest.mark.parametrize("write", ["imul", "setitem"])
@pytest.mark.parametrize("tail", ["add", "relu_add", "relu"])
def test_fusions_do_not_move_a_layer_past_an_in_place_write(rng, write, tail):
    """The fused call runs where the activation or add was: with an
    in-place write to the conv's input in between, fusing would convolve
    the written values. Such a conv stays unfused (found by fuzzing)."""
    class Net(M.Module):
        def __init__(self):
            super().__init__()
            self.c = M.Conv2d(4, 4, 3, padding=1)

        def forward(self, x):
            x2 = x * 1.0
            c = self.c(x2)
            if write == "imul":
                x2 *= -1.0
            else:
                x2[:, 0] = 0.0
            if tail == "add":
                return c + x
            return F.relu(c + x) if tail == "relu_add" else F.relu(c)

    x = image(rng, (2, 4, 6, 6))
    new = optimized(mt.trace_module(Net(), x), "FuseConvAct", x)
    assert functions(new, F.conv2d_act) == 0 and calls(new, M.Conv2d) == 1


def test_attention_is_not_fused_past_an_in_place_write(rng):
    class Net(M.Module):
        def forward(self, q, k, v):
            s = F.matmul(q, k, transpose_b=True) * 0.5
            q *= 2.0                          # written after its use in the scores
            return F.matmul(F.softmax(s, axis=-1), v) + q

    q, k, v, _ = _qkvm(rng)
    tm = mt.trace_module(Net(), q.copy(), k, v)
    new = optimize(tm, "FuseAttention")
    assert functions(new, F.attention) == 0
    close(new(q.copy(), k, v), tm(q.copy(), k, v))


def test_fused_residual_keeps_the_adds_broadcasting_and_promotion(rng):
    """Traced with a shortcut of the conv's output shape, the fused graph
    called with one that broadcasts, or of an integer dtype, computes what
    the add did."""
    class Net(M.Module):
        def __init__(self):
            super().__init__()
            self.c = M.Conv2d(4, 4, 3, padding=1)

        def forward(self, x, y):
            return F.relu(self.c(x) + y)

    x = image(rng, (2, 4, 6, 6))
    tm = mt.trace_module(Net(), x, image(rng, (2, 4, 6, 6)))
    new = optimize(tm, "FuseConvAct")
    assert functions(new, F.conv2d_act) == 1
    for y in (image(rng, (1, 4, 1, 1)), mt.tensor(rng.integers(-2, 2, (2, 4, 6, 6)).astype("int32"))):
        close(new(x, y), tm(x, y))


def test_mobilenet_residual_adds_fuse_when_flattened(rng, tmp_path):
    """MobileNetV2's shortcut adds sit one module above their conv (``x +
    self.conv(x)``): optimize(flatten=True) sees across and fuses all ten.
    The result saves and loads (the traced submodules flatten() leaves
    behind lose their graphs, which still called the folded BatchNorms)."""
    net, args = _zoo("mobilenet_v2", rng)
    tm = mt.trace_module(net, *args)
    flat = optimize(tm, "all", flatten=True)
    close(flat(*args), tm(*args))
    assert all(not m._graphs for m in flat.modules() if isinstance(m, TracedModule) and m is not flat)
    mt.save(flat, tmp_path / "m.tmod")
    np.testing.assert_array_equal(mt.load(tmp_path / "m.tmod")(*args).numpy(), flat(*args).numpy())
    # (conv2d_nchwc where "all" runs the NCHWc pass: on a CPU with AVX-512)
    res = [e for f in (F.conv2d_act, F.conv2d_nchwc, F.conv2d_nchwc_pw_dw_pw)
           for e in flat.graph.get_function_by_type(f).as_list() if e.kwargs.get("residual") is not None]
    assert len(res) == 10
    assert all(e.kwargs["proj_act" if "proj_act" in e.kwargs else "act"] == "none" for e in res)


def test_fuse_conv_act_on_functional_conv_and_not_tanh_gelu(rng):
    class Net(M.Module):
        def __init__(self):
            super().__init__()
            self.w = M.Parameter(rng.standard_normal((4, 3, 3, 3)).astype("float32"))

        def forward(self, x):
            a = F.relu6(F.conv2d(x, self.w, stride=2))
            b = F.gelu(F.conv2d(x, self.w, stride=2), approximate="tanh")
            return a + b

    x = image(rng)
    new = optimized(mt.trace_module(Net(), x), "FuseConvAct", x)
    assert functions(new, F.conv2d_act) == 1 and functions(new, F.conv2d) == 1


# -------------------------------------------------------------- FuseLinearAct

def test_fuse_linear_act(rng):
    net = M.Sequential(M.Linear(8, 16), M.GELU(), M.Linear(16, 4), M.ReLU())
    x = mt.tensor(rng.standard_normal((2, 5, 8)).astype("float32"))
    new = optimized(mt.trace_module(net, x), "FuseLinearAct", x)
    assert functions(new, F.linear_act) == 2 and calls(new, M.Linear) == 0


# ---------------------------------------------------------- FuseLinearAddNorm

class PostNorm(M.Module):
    """BERT's residual tail, twice: ``LayerNorm(dropout(dense(x)) + x)`` with
    modules, then ``F.layer_norm(F.linear(h) + h)`` with functions."""

    def __init__(self, d=8, eps=1e-12):
        super().__init__()
        self.dense, self.drop, self.norm = M.Linear(d, d), M.Dropout(0.1), M.LayerNorm(d, eps=eps)
        self.w2 = M.Parameter(np.random.default_rng(5).standard_normal((d, d)).astype("float32"))
        self.b2 = M.Parameter(np.linspace(-1, 1, d).astype("float32"))
        self.g2 = M.Parameter(np.linspace(0.5, 1.5, d).astype("float32"))

    def forward(self, x):
        h = self.norm(self.drop(self.dense(x)) + x)
        return F.layer_norm(h + F.linear(h, self.w2, self.b2), 8, self.g2, None, eps=1e-5)


def test_fuse_linear_add_norm_bitwise_the_unfused_graph(rng):
    net = PostNorm().eval()
    x = mt.tensor(rng.standard_normal((2, 5, 8)).astype("float32"))
    tm = mt.trace_module(net, x)
    new, report = optimize(tm, ["EliminateIdentity", "FuseLinearAddNorm"], return_report=True)
    assert report["FuseLinearAddNorm"].counts == {"fusions": 2}
    assert functions(new, F.linear_add_layer_norm) == 2 and calls(new, M.LayerNorm) == 0
    for seed in range(2):
        x = mt.tensor(np.random.default_rng(seed).standard_normal((2, 5, 8)).astype("float32"))
        assert new(x).numpy().tobytes() == tm(x).numpy().tobytes()
    new.graph.lint()
    # FuseLinearAct first (its act="none" form of the dense layers), then this pass
    first = optimize(tm, ["EliminateIdentity", "FuseLinearAct"])
    assert functions(first, F.linear_act) == 2
    again = optimize(first, "FuseLinearAddNorm")
    assert functions(again, F.linear_add_layer_norm) == 2 and functions(again, F.linear_act) == 0
    assert again(x).numpy().tobytes() == tm(x).numpy().tobytes()


def test_fuse_linear_act_adds_a_plain_linears_bias_in_place_with_the_same_bits(rng):
    net = M.Sequential(M.Linear(8, 16), M.Linear(16, 4, bias=False)).eval()
    x = mt.tensor(rng.standard_normal((2, 5, 8)).astype("float32"))
    tm = mt.trace_module(net, x)
    new = optimized(tm, "FuseLinearAct", x)
    assert functions(new, F.linear_act) == 1 and calls(new, M.Linear) == 1     # no bias: left
    assert new(x).numpy().tobytes() == tm(x).numpy().tobytes()


def test_fuse_linear_add_norm_leaves_a_sum_read_elsewhere_or_a_norm_over_two_axes(rng):
    class Kept(M.Module):
        def __init__(self):
            super().__init__()
            self.fc, self.norm, self.norm2 = M.Linear(4, 4), M.LayerNorm(4), M.LayerNorm((3, 4))

        def forward(self, x):
            s = self.fc(x) + x
            t = self.fc(x) + x
            return self.norm(s) + s + self.norm2(t)     # s read twice; t normalized over 2 axes

    x = mt.tensor(rng.standard_normal((2, 3, 4)).astype("float32"))
    new = optimized(mt.trace_module(Kept().eval(), x), "FuseLinearAddNorm", x)
    assert functions(new, F.linear_add_layer_norm) == 0


# -------------------------------------------------------------- FuseAttention

class Attention(M.Module):
    def __init__(self, scale=0.5, masked=True, drop=True):
        super().__init__()
        self.scale, self.masked = scale, masked
        self.drop = M.Dropout(0.1) if drop else None

    def forward(self, q, k, v, mask):
        s = F.matmul(q, k, transpose_b=True) * self.scale
        if self.masked:
            s = s + mask
        p = F.softmax(s, axis=-1)
        if self.drop is not None:
            p = self.drop(p)
        return F.matmul(p, v)


def _qkvm(rng):
    q, k, v = (mt.tensor(rng.standard_normal((2, 3, 6, 4)).astype("float32")) for _ in range(3))
    mask = mt.tensor(np.where(rng.random((2, 1, 1, 6)) < 0.3, -1e9, 0).astype("float32"))
    return q, k, v, mask


@pytest.mark.parametrize("masked", [True, False])
def test_fuse_attention(rng, masked):
    args = _qkvm(rng)
    tm = mt.trace_module(Attention(masked=masked), *args)
    new = optimized(tm, ["EliminateIdentity", "FuseAttention"], *args)
    assert functions(new, F.attention) == 1 and functions(new, F.softmax) == 0
    # without EliminateIdentity the dropout call hides the pattern
    assert functions(optimize(tm, "FuseAttention"), F.attention) == 0


def test_fuse_attention_leaves_scores_with_another_user(rng):
    class Net(Attention):
        def forward(self, q, k, v, mask):
            s = F.matmul(q, k, transpose_b=True) * self.scale + mask
            return F.matmul(F.softmax(s, axis=-1), v), s

    args = _qkvm(rng)
    new = optimize(mt.trace_module(Net(drop=False), *args), "all")
    assert functions(new, F.attention) == 0


# ------------------------------------------------------------------ the API

def test_optimize_checks_its_arguments(rng):
    tm = mt.trace_module(ConvBnRelu(), image(rng))
    with pytest.raises(TypeError, match="optimize takes a TracedModule"):
        optimize(ConvBnRelu())
    with pytest.raises(KeyError, match="no pass is registered as 'FuseEverything'"):
        optimize(tm, ["FuseEverything"])
    with pytest.raises(TypeError, match="pass names"):
        optimize(tm, [3])


def test_register_pass_runs_user_passes_by_name(rng):
    seen = []

    @register_pass("TestRecordModule", training_safe=True)
    def record(tm):
        """Records the module it got."""
        seen.append(tm)

    tm = mt.trace_module(ConvBnRelu(), image(rng))
    new = optimize(tm, ["TestRecordModule"])
    assert seen == [new] and new is not tm
    assert registered_passes()["TestRecordModule"].doc == "Records the module it got."
    optimize(tm, "all")
    assert len(seen) == 1                       # "all" is mgtrace's own passes
    with pytest.raises(ValueError, match="one of mgtrace's own passes"):
        register_pass("FuseConvBn", record)


def test_register_pass_with_a_pattern(rng):
    @register_pass("TestDoubleRelu")
    def double_relu(tm):
        return replace_pattern(tm, lambda x: F.relu(F.relu(x)), lambda x: F.relu(x))

    class Net(M.Module):
        def forward(self, x):
            return F.relu(F.relu(x)) * 2

    x = image(rng)
    new = optimized(mt.trace_module(Net(), x), ["TestDoubleRelu"], x)
    assert functions(new, F.relu) == 1


# ------------------------------------------------------------ replace_pattern

def test_replace_pattern_across_the_hierarchy(rng):
    class Block(M.Module):
        def forward(self, x, y):
            return F.sigmoid(x) * x + y

    class Net(M.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = Block(), Block()

        def forward(self, x):
            return self.b(self.a(x, x + 1.0), x)

    x = image(rng)
    tm = mt.trace_module(Net(), x)
    want = tm(x)
    found = replace_pattern(tm, lambda v: F.sigmoid(v) * v, lambda v: F.silu(v))
    assert len(found) == 2 and set(found[0].inputs) == {"v"}
    assert tm.a.graph.get_function_by_type(F.silu).as_count() == 1
    assert tm.b.graph.get_function_by_type(F.sigmoid).as_count() == 0
    close(tm(x), want)


def test_replace_pattern_skips_matches_whose_inner_values_are_used(rng):
    class Net(M.Module):
        def forward(self, x):
            s = F.sigmoid(x)
            return s * x + s

    x = image(rng)
    tm = mt.trace_module(Net(), x)
    assert replace_pattern(tm, lambda v: F.sigmoid(v) * v, lambda v: F.silu(v)) == []


def test_replace_pattern_binds_repeated_parameters_consistently(rng):
    class Net(M.Module):
        def forward(self, x, y):
            return x * x + x * y

    x, y = image(rng), image(rng)
    tm = mt.trace_module(Net(), x, y)
    want = tm(x, y)
    found = replace_pattern(tm, lambda a: a * a, lambda a: F.square(a) if hasattr(F, "square")
                            else a ** 2)
    assert len(found) == 1 and found[0].inputs["a"] is tm.graph.inputs[1]
    close(tm(x, y), want)


def test_replace_pattern_rejects_bad_patterns(rng):
    tm = mt.trace_module(ConvBnRelu(), image(rng))
    with pytest.raises(TypeError, match="must return one tensor"):
        replace_pattern(tm, lambda x: (F.relu(x), x), lambda x: x)
    with pytest.raises(TypeError, match="parameter"):
        replace_pattern(tm, lambda x: F.relu(x), lambda x, y: x)
    with pytest.raises(TypeError, match="positional"):
        replace_pattern(tm, lambda *x: F.relu(x[0]), lambda x: x)


# ---------------------------------------------------------------------- NCHWc

class NchwcNet(M.Module):
    """A MobileNet-like chain (a 3-channel first conv, depthwise, pointwise
    with a residual) whose values are also read outside the chain, then a
    grouped conv and a conv after it that the NCHW16c kernels do not take."""

    def __init__(self):
        super().__init__()
        self.stem, self.act = M.Conv2d(3, 24, 3, stride=2, padding=1), M.ReLU6()
        self.dw = M.Conv2d(24, 24, 3, padding=1, groups=24)
        self.pw, self.pw2 = M.Conv2d(24, 24, 1), M.Conv2d(24, 40, 1)
        self.grouped, self.lone = M.Conv2d(40, 40, 3, padding=1, groups=2), M.Conv2d(40, 8, 1)

    def forward(self, x):
        y = self.act(self.stem(x))
        z = self.pw(F.relu(self.dw(y))) + y
        w = self.pw2(z)
        return self.lone(self.grouped(w)), F.max_pool2d(z, 2, padding=1), F.avg_pool2d(z, 2)


def test_nchwc_converts_conv_chains_and_converts_back_for_other_readers(rng):
    x = image(rng, (2, 3, 15, 15))
    tm = mt.trace_module(NchwcNet(), x)
    new = optimize(tm, ["FuseConvAct", "NCHWc"])
    for got, want in zip(new(x), tm(x)):
        close(got, want)
    assert functions(new, F.conv2d_nchwc) == 4          # stem, dw, pw (+ residual), pw2
    assert functions(new, F.max_pool2d_nchwc) == 1      # the max pool of z joins the chain
    assert functions(new, F.to_nchwc) == 0              # the residual y is a converted conv's
    assert functions(new, F.from_nchwc) == 3            # z for avg_pool2d, the max pool, w for grouped
    assert calls(new, M.Conv2d) == 2                    # grouped (groups 2) and lone stay NCHW
    res = new.graph.get_function_by_type(F.conv2d_nchwc).as_list()[2]
    assert res.kwargs["residual"] is not None and res.kwargs["act"] == "none"


def test_nchwc_leaves_lone_convs_depthwise_without_producer_and_winograd_layers(rng):
    class Net(M.Module):
        def __init__(self):
            super().__init__()
            self.dw, self.pw = M.Conv2d(16, 16, 3, padding=1, groups=16), M.Conv2d(16, 8, 1)
            self.c3 = M.Conv2d(32, 32, 3, padding=1)      # conv2d runs it with Winograd
            self.c1 = M.Conv2d(32, 32, 1)

        def forward(self, x, y):
            return self.pw(self.dw(x)), self.c1(self.c3(y))

    args = image(rng, (1, 16, 9, 9)), image(rng, (1, 32, 64, 64))
    tm = mt.trace_module(Net(), *args)
    # a layer conv2d runs with Winograd stays NCHW where conv2d_nchwc would not
    before = _nn._set_nchwc_winograd(False)
    try:
        new = optimize(tm, ["NCHWc"])
    finally:
        _nn._set_nchwc_winograd(before)
    assert functions(new, F.conv2d_nchwc) == 0 and calls(new, M.Conv2d) == 4
    for got, want in zip(new(*args), tm(*args)):
        close(got, want)
    # and goes NCHW16c where conv2d_nchwc runs it as F(4x4) too
    assert _nn.conv2d_algorithm((1, 32, 64, 64), (32, 32, 3, 3), padding=1, cached=True) == "winograd4"
    new = optimize(tm, ["NCHWc"])
    assert functions(new, F.conv2d_nchwc) == 2 and calls(new, M.Conv2d) == 2
    for got, want in zip(new(*args), tm(*args)):
        close(got, want)


def test_nchwc_takes_megengine_biases_and_broadcast_residuals(rng):
    """A bias of shape [1, O, 1, 1] (MegEngine's), and a residual that is a
    parameter of batch 1: traced at batch 1, run at batch 3 it broadcasts,
    as the add did."""
    class Net(M.Module):
        def __init__(self):
            super().__init__()
            self.w = M.Parameter(rng.standard_normal((16, 16, 1, 1)).astype("float32"))
            self.b = M.Parameter(rng.standard_normal((1, 16, 1, 1)).astype("float32"))
            self.pos = M.Parameter(rng.standard_normal((1, 16, 6, 6)).astype("float32"))
            self.c2 = M.Conv2d(16, 16, 3, padding=1)

        def forward(self, x):
            return self.c2(F.conv2d(x, self.w, self.b) + self.pos)

    tm = mt.trace_module(Net(), image(rng, (1, 16, 6, 6)))
    new = optimize(tm, ["FuseConvAct", "NCHWc"])
    assert functions(new, F.conv2d_nchwc) == 2
    for batch in (1, 3):
        x = image(rng, (batch, 16, 6, 6))
        close(new(x), tm(x))


class PooledHead(M.Module):
    """Convs, then a global average pool as a module or a function, or a
    pool to 2 x 2 or one whose input something else reads (left alone)."""

    def __init__(self, kind):
        super().__init__()
        self.c1, self.c2 = M.Conv2d(3, 20, 3, stride=2, padding=1), M.Conv2d(20, 24, 1)
        self.pool, self.kind = M.AdaptiveAvgPool2d((1, 1)), kind

    def forward(self, x):
        y = self.c2(F.relu(self.c1(x)))
        if self.kind == "module":
            return F.flatten(self.pool(y), 1)
        if self.kind == "function":
            return F.flatten(F.adaptive_avg_pool2d(y, 1), 1)
        if self.kind == "two":
            return F.adaptive_avg_pool2d(y, 2)
        return F.adaptive_avg_pool2d(y, 1) + y.max()


@pytest.mark.parametrize("kind, means", [("module", 1), ("function", 1), ("two", 0), ("read", 0)])
def test_nchwc_pools_globally_in_the_blocked_layout(rng, kind, means):
    x = image(rng, (2, 3, 9, 7))
    tm = mt.trace_module(PooledHead(kind), x)
    new = optimized(tm, ["FuseConvAct", "NCHWc"], x)
    assert functions(new, F.conv2d_nchwc) == 2
    assert functions(new, F.mean) == means
    assert functions(new, F.adaptive_avg_pool2d) + calls(new, M.AdaptiveAvgPool2d) == 1 - means


def test_nchwc_leaves_dilated_pools(rng):
    """A dilated pool's window can hold no input: -inf in all 16 lanes,
    which the next conv's zero weights for the unused ones make NaN."""
    class Net(M.Module):
        def __init__(self):
            super().__init__()
            self.c1, self.pool, self.c2 = M.Conv2d(3, 3, 1), M.MaxPool2d(2, 1, 1, 2), M.Conv2d(3, 4, 1)

        def forward(self, x):
            return F.relu(self.c2(self.pool(F.relu(self.c1(x)))))

    x = image(rng, (1, 3, 1, 6))
    tm = mt.trace_module(Net(), x)
    new = optimize(tm, ["FuseConvAct", "NCHWc"])
    assert functions(new, F.max_pool2d_nchwc) == 0
    np.testing.assert_array_equal(np.isnan(new(x).numpy()), np.isnan(tm(x).numpy()))


def test_nchwc_leaves_graphs_with_in_place_writes(rng):
    class Net(M.Module):
        def __init__(self):
            super().__init__()
            self.c1, self.c2 = M.Conv2d(16, 16, 1), M.Conv2d(16, 16, 1)

        def forward(self, x):
            y = self.c1(x)
            y[:, 0] = 100.0
            return self.c2(y)

    x = image(rng, (1, 16, 5, 5))
    tm = mt.trace_module(Net(), x)
    new = optimized(tm, ["NCHWc"], x)
    assert functions(new, F.conv2d_nchwc) == 0


@pytest.mark.parametrize("point", ["relu6", "c2_out", "c3_out"])
@pytest.mark.parametrize("kind", ["end", "watch"])
def test_watch_and_end_points_follow_fused_and_converted_values(rng, point, kind):
    class Net(M.Module):
        def __init__(self):
            super().__init__()
            self.c1 = M.Conv2d(3, 16, 3, padding=1)
            self.c2, self.c3 = M.Conv2d(16, 16, 3, padding=1, groups=16), M.Conv2d(16, 8, 1)

        def forward(self, x):
            return self.c3(F.relu6(self.c2(F.relu(self.c1(x)))))

    x = image(rng, (1, 3, 8, 8))
    tm = mt.trace_module(Net(), x)
    node = tm.graph.get_node_by_name(point, recursive=False).as_unique()
    (tm.set_end_points if kind == "end" else tm.set_watch_points)([node])
    want = tm(x)
    want = want[0] if kind == "end" else tm.watch_node_value[node][0]
    new = optimize(tm, ["FuseConvAct", "NCHWc"])
    got = new(x)
    if kind == "watch":
        got = new.watch_node_value[new.watch_points[0]][-1]
    else:
        got = got[0]
    close(got, want)


def test_nchwc_in_all_only_where_the_cpu_has_avx512(monkeypatch):
    monkeypatch.setattr(manager, "_nchwc_pays", lambda device=None: False)
    assert "NCHWc" not in manager._schedule("all", False)
    monkeypatch.setattr(manager, "_nchwc_pays", lambda device=None: True)
    assert "NCHWc" in manager._schedule("all", False)
    assert "NCHWc" not in manager._schedule("all", True)      # not for a module in training mode
    assert "FusePointwiseDepthwise" in manager._schedule("all", False)
    assert "FusePointwiseDepthwise" not in manager._schedule("all", True)
    monkeypatch.setattr(manager, "_nchwc_pays", lambda device=None: False)
    assert "FusePointwiseDepthwise" not in manager._schedule("all", False)


@pytest.fixture
def cuda_stand_in():
    """cuda:0 as a stand-in device: the CPU's kernel tables less the entries
    CUDA's backend has not (the NCHW16c ones among them), host memory."""
    import importlib
    core_tensor = importlib.import_module("mgtrace._core.tensor")
    core_tensor._install_test_backend("cuda", ("elementwise", "reduce", "linalg", "nn", "index"),
                                      False, False)
    yield mt.Device("cuda:0")
    core_tensor._remove_test_backend("cuda")


def test_all_on_a_device_without_nchwc_kernels_keeps_to_its_kernels(rng, monkeypatch,
                                                                     cuda_stand_in):
    # the NCHWc decision is the module's device's (has_kernel), not the
    # host's: a module on a device without the NCHW16c kernels gets none of
    # them, even where the host's CPU would (AVX-512 said present here)
    from mgtrace._core import nn as core_nn
    monkeypatch.setattr(core_nn, "_wide_conv_kernels", lambda: True)
    import copy
    x, net = image(rng, (2, 3, 15, 15)), NchwcNet()
    tm = mt.trace_module(copy.deepcopy(net), x)
    assert functions(optimize(tm, "all"), F.conv2d_nchwc) > 0      # the CPU module: converted
    xd = x.to(cuda_stand_in)
    on_dev = mt.trace_module(net.to(cuda_stand_in), xd)
    assert not mt.has_kernel("conv2d_nchwc", cuda_stand_in)
    # the default device stays the CPU: the editing placeholders follow the
    # module's device, so the fusions run on it
    new = optimize(on_dev, "all")
    for f in (F.conv2d_nchwc, F.to_nchwc, F.from_nchwc, F.max_pool2d_nchwc,
              F.conv2d_nchwc_pw_dw, F.conv2d_nchwc_pw_dw_pw):
        assert functions(new, f) == 0
    assert functions(new, F.conv2d_act) > 0        # the fusions its device has still run
    for got, want in zip(new(xd), tm(x)):
        assert got.device == cuda_stand_in
        close(got.to("cpu"), want)


class Expansion(M.Module):
    """MobileNetV2's inverted residual: a pointwise expansion, a depthwise
    conv (stride 2, or dilated, or a second reader of the expansion: the
    non-patterns) and a pointwise projection."""

    def __init__(self, stride=2, dilation=1, also_read=False, pw_stride=1):
        super().__init__()
        self.stem = M.Conv2d(3, 16, 3, padding=1)
        self.expand = M.Conv2d(16, 40, 1, stride=pw_stride)
        self.dw = M.Conv2d(40, 40, 3, stride=stride, padding=dilation, dilation=dilation, groups=40)
        self.project = M.Conv2d(40, 16, 1)
        self.also_read = also_read

    def forward(self, x):
        e = F.relu6(self.expand(F.relu(self.stem(x))))
        y = self.project(F.relu6(self.dw(e)))
        return y + e.mean() if self.also_read else y


FUSE_PW_DW = ["FuseConvAct", "NCHWc", "FusePointwiseDepthwise"]


def test_fuse_pointwise_depthwise_fuses_the_expansion_its_depthwise_conv_and_projection(rng, tmp_path):
    x = image(rng, (2, 3, 15, 13))
    tm = mt.trace_module(Expansion(), x)
    new = optimized(tm, FUSE_PW_DW, x)
    assert functions(new, F.conv2d_nchwc_pw_dw_pw) == 1 and functions(new, F.conv2d_nchwc_pw_dw) == 0
    assert functions(new, F.conv2d_nchwc) == 1              # the stem
    (e,) = new.graph.get_function_by_type(F.conv2d_nchwc_pw_dw_pw).as_list()
    assert (e.kwargs["act"], e.kwargs["dw_act"], e.kwargs["proj_act"]) == ("relu6", "relu6", "none")
    mt.save(new, tmp_path / "m.tmod")
    np.testing.assert_array_equal(mt.load(tmp_path / "m.tmod")(x).numpy(), new(x).numpy())


@pytest.mark.parametrize("kw", [dict(dilation=2), dict(also_read=True), dict(pw_stride=2)])
def test_fuse_pointwise_depthwise_leaves_non_patterns(rng, kw):
    x = image(rng, (1, 3, 12, 12))
    tm = mt.trace_module(Expansion(**kw), x)
    new = optimized(tm, FUSE_PW_DW, x)
    assert functions(new, F.conv2d_nchwc_pw_dw) == 0 and functions(new, F.conv2d_nchwc_pw_dw_pw) == 0
    assert optimize(tm, ["FusePointwiseDepthwise"]).code == optimize(tm, []).code   # needs NCHWc first


class Block(M.Module):
    """A stem, then an inverted-residual block whose projection is
    ``project`` (with the residual add when its shape allows), its
    depthwise output also read when ``also``."""
    def __init__(self, project, also=False):
        super().__init__()
        self.stem = M.Conv2d(3, 16, 3, padding=1)
        self.expand, self.dw = M.Conv2d(16, 48, 1), M.Conv2d(48, 48, 3, padding=1, groups=48)
        self.project, self.also = project, also
        self.add = project.out_channels == 16 and project.stride == (1, 1)

    def forward(self, x):
        h = F.relu(self.stem(x))
        d = F.relu6(self.dw(F.relu6(self.expand(h))))
        y = self.project(d)
        if self.add:
            y = y + h
        return y + d.mean() if self.also else y


@pytest.mark.parametrize("project, also, fused", [
    (M.Conv2d(48, 16, 1), False, 1),                   # with the residual add
    (M.Conv2d(48, 24, 1), False, 1),                   # no residual
    (M.Conv2d(48, 16, 1), True, 0),                    # the depthwise output has another reader
    (M.Conv2d(48, 16, 1, stride=2), False, 0),         # not a plain pointwise conv
    (M.Conv2d(48, 16, 3, padding=1), False, 0),
])
def test_fuse_pointwise_depthwise_projection_patterns(rng, project, also, fused):
    x = image(rng, (2, 3, 9, 9))
    tm = mt.trace_module(Block(project, also), x)
    new = optimized(tm, FUSE_PW_DW, x)
    assert functions(new, F.conv2d_nchwc_pw_dw_pw) == fused
    assert functions(new, F.conv2d_nchwc_pw_dw) == 1 - fused


def test_optimize_starts_without_the_watched_values_of_its_argument(rng):
    x = image(rng, (1, 3, 10, 10))
    tm = mt.trace_module(Expansion(), x)
    tm.set_watch_points([tm.graph.get_node_by_name("relu6", recursive=False).as_list()[0]])
    tm(x)
    for flatten in (False, True):
        new = optimize(tm, FUSE_PW_DW, flatten=flatten)
        assert new.watch_node_value == {}
        new(x)
        assert [len(v) for v in new.watch_node_value.values()] == [1]


@pytest.mark.parametrize("flatten", [False, True])
@pytest.mark.parametrize("kind", ["end", "watch"])
@pytest.mark.parametrize("name, pw_dw, pw_dw_pw", [
    ("relu6", 0, 0),        # the expansion's output: nothing fuses
    ("relu6_1", 1, 0),      # the depthwise output: the projection stays apart
])
def test_fuse_pointwise_depthwise_keeps_watched_values(rng, kind, flatten, name, pw_dw, pw_dw_pw):
    x = image(rng, (1, 3, 10, 10))
    tm = mt.trace_module(Expansion(), x)
    node = tm.graph.get_node_by_name(name, recursive=False).as_list()[0]
    (tm.set_end_points if kind == "end" else tm.set_watch_points)([node])
    want = tm(x)
    want = want[0] if kind == "end" else tm.watch_node_value[node][0]
    new = optimize(tm, FUSE_PW_DW, flatten=flatten)     # flatten() keeps the points
    assert functions(new, F.conv2d_nchwc_pw_dw) == pw_dw and functions(new, F.conv2d_nchwc_pw_dw_pw) == pw_dw_pw
    got = new(x)
    got = new.watch_node_value[new.watch_points[0]][-1] if kind == "watch" else got[0]
    close(got, want)


def test_mobilenet_in_nchwc_saves_loads_and_needs_format_1_1(rng, tmp_path):
    net, args = _zoo("mobilenet_v2", rng)
    tm = mt.trace_module(net, *args)
    new = optimize(tm, list(manager._ORDER), flatten=True)
    close(new(*args), tm(*args))
    # every conv of the 224x224 model's 52: the 16 expansions with their depthwise and projection convs fused
    assert functions(new, F.conv2d_nchwc) == 52 - 3 * 16 and functions(new, F.conv2d_nchwc_pw_dw_pw) == 16
    # ResNet-18's stem and its max pool stay blocked
    rnet, rargs = _zoo("resnet18", rng)
    rtm = mt.trace_module(rnet, *rargs)
    rnew = optimize(rtm, list(manager._ORDER), flatten=True)
    close(rnew(*rargs), rtm(*rargs))
    assert functions(rnew, F.max_pool2d_nchwc) == 1
    mt.save(new, tmp_path / "m.tmod")
    back = mt.load(tmp_path / "m.tmod")
    np.testing.assert_array_equal(back(*args).numpy(), new(*args).numpy())
    assert mt.serialization.load_archive(tmp_path / "m.tmod").min_reader_version == (1, 1)
    with pytest.raises(ValueError, match=r"functional.(conv2d_act|conv2d_nchwc|from_nchwc).* is new since"):
        mt.save(new, tmp_path / "old.tmod", target_version=(1, 0))
    close(mt.trace_module(back, *args)(*args), new(*args))


# ---------------------------------------------------------------- the models

def _zoo(name, rng):
    if name == "minilm":
        net = models.MiniLM(vocab_size=64, hidden_size=32, num_hidden_layers=2,
                            num_attention_heads=4, intermediate_size=64,
                            max_position_embeddings=16).eval()
        ids = mt.tensor(rng.integers(1, 64, (2, 9)).astype("int32"))
        mask = mt.tensor((np.arange(9)[None] < np.array([[9], [6]])).astype("int32"))
        return net, (ids, mask)
    net = randomise_bn(getattr(models, name)(num_classes=10), rng)
    net.eval()
    # logits dominated by fc's bias would hide errors in the features
    head = net.fc if name == "resnet18" else net.classifier[1]
    head.bias = M.Parameter(np.zeros(10, np.float32))
    return net, (image(rng, (2, 3, 32, 32)),)


@pytest.fixture(scope="module", params=["resnet18", "mobilenet_v2", "minilm"])
def zoo(request):
    rng = np.random.default_rng(7)
    net, args = _zoo(request.param, rng)
    return request.param, mt.trace_module(net, *args), args


@pytest.mark.parametrize("passes", [None, "all", ["FuseConvBn", "BackwardFoldScale", "FuseAddMul"]])
def test_models_optimized_equal_traced(zoo, passes):
    name, tm, args = zoo
    new = optimized(tm, passes, *args)
    if name != "minilm":
        assert calls(new, M.BatchNorm2d) == 0
    if passes == "all":
        fused = sum(m.graph.get_function_by_type(f, recursive=False).as_count()
                    for m in new.modules() if isinstance(m, TracedModule) and m._graphs
                    for f in (F.conv2d_act, F.linear_act, F.conv2d_nchwc))
        assert fused >= {"resnet18": 17, "mobilenet_v2": 30, "minilm": 2}[name]
        if name == "minilm":
            assert sum(m.graph.get_function_by_type(F.attention, recursive=False).as_count()
                       for m in new.modules() if isinstance(m, TracedModule) and m._graphs) == 2


def test_models_optimized_save_load_flatten_retrace(zoo, tmp_path):
    name, tm, args = zoo
    new = optimize(tm, "all")
    want = new(*args)
    path = tmp_path / f"{name}.tmod"
    mt.save(new, path)
    back = mt.load(path)
    np.testing.assert_array_equal(back(*args).numpy(), want.numpy())
    archive = mt.serialization.load_archive(path)
    ops = {o["name"] for o in archive.header["ops"]}
    assert ops & {"mgtrace.functional.conv2d_act", "mgtrace.functional.linear_act",
                  "mgtrace.functional.conv2d_nchwc"}
    # the fused calls are format 1.1 ops: a 1.0 reader would not know them;
    # MiniLM's linear_add_layer_norm (its residual tails) is a 1.2 one
    assert archive.min_reader_version == ((1, 2) if name == "minilm" else (1, 1))
    with pytest.raises(ValueError, match=r"functional.(conv2d_act|linear_act|attention|conv2d_nchwc)"
                                         r".* is new since"):
        mt.save(new, tmp_path / "old.tmod", target_version=(1, 0))
    close(new.flatten()(*args), want)
    close(mt.trace_module(new, *args)(*args), want)
    # an optimized module optimizes again to the same thing
    close(optimize(back, "all")(*args), want)


def test_optimized_graphs_edit_like_any_other(rng):
    net = randomise_bn(ConvBnRelu(bias=True), rng)
    x = image(rng)
    new = optimize(mt.trace_module(net, x), "all")
    call = new.graph.get_function_by_type(F.conv2d_act).as_unique()
    out = call.outputs[0]
    with new.graph.insert_exprs(call):
        doubled = out * 2.0
    new.graph.replace_node({out: doubled})
    new.graph.compile().lint()
    close(new(x), net(x) * 2.0)


def test_flatten_first_finds_patterns_across_module_boundaries(rng):
    class Conv(M.Module):
        def __init__(self):
            super().__init__()
            self.conv = M.Conv2d(3, 4, 3)

        def forward(self, x):
            return self.conv(x)

    class Net(M.Module):
        def __init__(self):
            super().__init__()
            self.body, self.bn = Conv(), M.BatchNorm2d(4)

        def forward(self, x):
            return F.relu(self.bn(self.body(x)))

    net = randomise_bn(Net(), rng)
    x = image(rng)
    tm = mt.trace_module(net, x)
    assert calls(optimize(tm, "all"), M.BatchNorm2d) == 1        # conv and BN in two graphs
    flat = optimize(tm, "all", flatten=True)
    assert calls(flat, M.BatchNorm2d) == 0 and functions(flat, F.conv2d_act) == 1
    close(flat(x), tm(x))
