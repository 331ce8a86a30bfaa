"""Int8 inverted residual blocks as one plan step (mgtrace/plan/_qblock.py,
kernels/cpu/qblock.c): an expand 1x1 conv, a depthwise conv and a project
1x1 conv, int8 from one to the next, run as one MT_Q_BLOCK step. Its bits
are the three steps' (and the module's), whichever way it splits the work:
by expanded channels on small planes, by bands of rows on planes over 28x28
(tests make the bands a few rows, so bands start and end inside the image
and at its zero-padded edges)."""
import os
import threading

import numpy as np
import pytest

import mgtrace as mt
import mgtrace.module as M
import mgtrace.quantization as Q
from mgtrace._core import qint8
from mgtrace.plan import _qblock
from tests.plan.test_plan_quantized import _quantized as quantized_model, quantize_net, \
    run_concurrently


def rand(*shape, seed=0):
    return mt.tensor(np.random.default_rng(seed).standard_normal(shape).astype(np.float32))


class Block(M.Module):
    """MobileNetV2's inverted residual, MegEngine's way, between stubs."""

    def __init__(self, c, hidden, cout, stride, kernel=3, also_mid=False, padding=None,
                 dilation=1, relu_out=False, dequant=True):
        super().__init__()
        self.quant, self.dequant = M.QuantStub(), M.DequantStub()
        self.expand = M.ConvBnRelu2d(c, hidden, 1, bias=False)
        padding = kernel // 2 if padding is None else padding
        self.dw = M.ConvBnRelu2d(hidden, hidden, kernel, stride, padding, dilation,
                                 groups=hidden, bias=False)
        self.project = (M.ConvBnRelu2d if relu_out else M.ConvBn2d)(hidden, cout, 1, bias=True)
        self.also_mid, self.out_float = also_mid, dequant

    def forward(self, x):
        mid = self.expand(self.quant(x))
        y = self.project(self.dw(mid))
        y = self.dequant(y) if self.out_float else y
        if self.also_mid:           # the expanded tensor read by another step too
            return y, self.dequant(mid)
        return y


def _quantized(net, shape):
    mt.random.seed(25)
    return quantize_net(net, shape, Q.per_channel_quint8_qconfig)


def _block_steps(plan, x):
    return [w for k, w, _ in plan.profile(x) if w.endswith("int8 block")]


@pytest.fixture
def small_bands():
    old = qint8._set_block_band_bytes(1)        # one output row a band
    yield
    qint8._set_block_band_bytes(old)


GEOMETRIES = [  # (batch, C, hidden, C_out, H, W, stride, kernel)
    (1, 8, 24, 8, 7, 7, 1, 3),          # channel split: fewer channels than a 16 share
    (2, 8, 40, 16, 14, 9, 2, 3),        # 40: shares of 16 + 24 (uneven)
    (1, 16, 48, 24, 30, 30, 1, 3),      # 900 pixels: bands of rows
    (3, 8, 24, 8, 33, 31, 2, 3),        # odd sizes, stride 2, bands
    (1, 8, 32, 16, 29, 29, 1, 5),       # a 5x5 depthwise conv (two padded rows a side)
]


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("geom", GEOMETRIES, ids=lambda g: "x".join(map(str, g)))
@pytest.mark.parametrize("bands", ["default", "one_row"])
def test_block_step_equals_the_module_and_the_unfused_steps_bitwise(geom, threads, bands,
                                                                      request):
    if bands == "one_row":
        request.getfixturevalue("small_bands")
    nb, c, hidden, cout, h, w, stride, kernel = geom
    shape = (nb, c, h, w)
    qm = _quantized(Block(c, hidden, cout, stride, kernel), shape)
    old = mt.get_num_threads()
    mt.set_num_threads(threads)
    try:
        x = rand(*shape, seed=3)
        fused = mt.compile(qm, x)
        _qblock.FUSE = False
        try:
            unfused = mt.compile(qm, x)
        finally:
            _qblock.FUSE = True
        assert len(_block_steps(fused, x)) == 1
        assert _block_steps(unfused, x) == []
        for seed in (3, 4, 5):
            x = rand(*shape, seed=seed)
            want = qm(x).numpy()
            got, ref = fused(x).numpy(), unfused(x).numpy()
            assert got.tobytes() == want.tobytes(), (geom, seed)
            assert ref.tobytes() == want.tobytes(), (geom, seed)
    finally:
        mt.set_num_threads(old)


# corners a fuzz drew (issue 32's fuzz, fuzz_qblock.py on branch qfuzz: 29k
# blocks, none differed): kernels, strides and paddings unequal in height and
# width, dilation, padding past kernel // 2 (edge rows of padding only), thin
# planes on both sides of 28x28, hidden channels not a multiple of 16 and more
# than 64 input channels (the expand on AMX where the CPU has it), the
# projection with ReLU and a uint8 output (no DequantStub)
EDGES = [   # (batch, C, hidden, C_out, H, W, stride, kernel, padding, dilation, relu, float)
    (2, 5, 17, 3, 2, 70, (1, 3), (1, 5), (0, 2), 1, False, True),      # 140 pixels
    (1, 5, 33, 7, 70, 12, (3, 1), (5, 1), (2, 0), 1, True, False),     # 840: bands
    (1, 6, 40, 9, 29, 31, 2, 3, 3, 1, False, True),                    # padding 3 > 1
    (3, 4, 24, 5, 23, 37, 1, 3, 2, 2, True, True),                     # dilation 2, bands
    (1, 40, 96, 16, 12, 70, 3, 7, 0, 1, False, False),                 # 2 output rows, 3 threads
    (1, 70, 200, 40, 28, 28, 1, 3, 1, 1, False, True),                 # 200: 16 * 12 + 8
    (2, 3, 1, 2, 1, 1, 1, 7, 3, 1, True, True),                        # one pixel, hidden 1
]


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("geom", EDGES, ids=lambda g: "x".join(map(str, g[:6])))
@pytest.mark.parametrize("bands", ["default", "one_row"])
def test_block_step_at_edge_geometries_equals_the_module_bitwise(geom, threads, bands, request):
    if bands == "one_row":
        request.getfixturevalue("small_bands")
    nb, c, hidden, cout, h, w, stride, kernel, padding, dilation, relu, out_float = geom
    shape = (nb, c, h, w)
    qm = _quantized(Block(c, hidden, cout, stride, kernel, padding=padding, dilation=dilation,
                          relu_out=relu, dequant=out_float), shape)
    _one_block_step_bitwise(qm, shape, threads, (3, 4))


def _one_block_step_bitwise(qm, shape, threads, seeds):
    """qm's plan at ``threads`` has one block step and the module's bits on
    inputs of ``seeds``."""
    old = mt.get_num_threads()
    mt.set_num_threads(threads)
    try:
        x = rand(*shape, seed=3)
        plan = mt.compile(qm, x)
        assert len(_block_steps(plan, x)) == 1
        for seed in seeds:
            x = rand(*shape, seed=seed)
            assert plan(x).numpy().tobytes() == qm(x).numpy().tobytes(), (shape, seed)
    finally:
        mt.set_num_threads(old)


@pytest.mark.parametrize("hw", [14, 30], ids=["channels", "bands"])
def test_two_threads_run_one_block_plan_concurrently(hw):
    shape = (2, 16, hw, hw)
    qm = _quantized(Block(16, 96, 16, 1), shape)
    old = mt.get_num_threads()
    mt.set_num_threads(2)
    try:
        plan = mt.compile(qm, rand(*shape))
        xs = [rand(*shape, seed=10 + k) for k in range(4)]
        want = [qm(x).numpy().tobytes() for x in xs]
        got = run_concurrently(plan, xs, rounds=10)
    finally:
        mt.set_num_threads(old)
    for i, outs in got.items():
        assert len(outs) == 10 and all(o.tobytes() == want[i] for o in outs), i


def test_a_block_whose_expanded_tensor_is_read_elsewhere_keeps_its_expand_apart():
    # the expand's output is a second output: the expand stays a step of its
    # own, and the depthwise and project convs make the block (reading it)
    shape = (1, 8, 9, 9)
    qm = _quantized(Block(8, 24, 8, 1, also_mid=True), shape)
    x = rand(*shape, seed=3)
    plan = mt.compile(qm, x)
    steps = [w for k, w, _ in plan.profile(x) if k == "kernel"]
    assert "expand: ConvBnRelu2d: int8 conv" in steps
    assert _block_steps(plan, x) == ["dw: ConvBnRelu2d .. project: ConvBn2d: int8 block"]
    for got, want in zip(plan(x), qm(x)):
        assert got.numpy().tobytes() == want.numpy().tobytes()


def test_mobilenet_v2_like_model_runs_its_blocks_as_block_steps():
    # the plan tests' model: two blocks, the first with its shortcut add
    qm, shape = quantized_model("mobilenet_v2_like", True)
    x = rand(*shape, seed=3)
    plan = mt.compile(qm, x)
    assert len(_block_steps(plan, x)) == 2
    assert plan(x).numpy().tobytes() == qm(x).numpy().tobytes()


class ResidualBlock(M.Module):
    """The block with MobileNetV2's shortcut: an int8 Elemwise add of its
    input and its output (in either order; ``fuse_add_relu`` too)."""

    def __init__(self, c, hidden, stride, mode, y_first):
        super().__init__()
        self.quant, self.dequant = M.QuantStub(), M.DequantStub()
        self.expand = M.ConvBnRelu2d(c, hidden, 1, bias=False)
        self.dw = M.ConvBnRelu2d(hidden, hidden, 3, stride, 1, groups=hidden, bias=False)
        self.project = M.ConvBn2d(hidden, c, 1, bias=False)
        self.add = M.Elemwise(mode)
        self.y_first = y_first

    def forward(self, x):
        x = self.quant(x)
        y = self.project(self.dw(self.expand(x)))
        return self.dequant(self.add(y, x) if self.y_first else self.add(x, y))


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("size", [(1, 9, 7), (2, 31, 30)], ids=["channels", "bands"])
@pytest.mark.parametrize("mode,y_first", [("add", False), ("add", True),
                                          ("fuse_add_relu", False)])
@pytest.mark.parametrize("bands", ["default", "one_row"])
def test_the_shortcut_add_folds_into_the_block_step_bitwise(size, mode, y_first, threads, bands,
                                                            request):
    if bands == "one_row":
        request.getfixturevalue("small_bands")
    nb, h, w = size
    shape = (nb, 8, h, w)
    qm = _quantized(ResidualBlock(8, 40, 1, mode, y_first), shape)
    old = mt.get_num_threads()
    mt.set_num_threads(threads)
    try:
        x = rand(*shape, seed=3)
        plan = mt.compile(qm, x)
        steps = [w for k, w, _ in plan.profile(x) if k == "kernel"]
        assert [w for w in steps if w.endswith("int8 block")] == \
            ["expand: ConvBnRelu2d .. add: Elemwise: int8 block"], steps
        assert not any(w.endswith("int8 add") for w in steps)
        for seed in (3, 4):
            x = rand(*shape, seed=seed)
            assert plan(x).numpy().tobytes() == qm(x).numpy().tobytes()
    finally:
        mt.set_num_threads(old)


# planes of at most 28x28 whose projection has fewer output channels than
# pixels project by pixels (each thread its 16-aligned share of every plane,
# all channels, then the add on it); more channels than pixels, by channels.
# Sizes with work enough for a team of two or three (mt_q_team: 2^19
# multiply-adds a thread), shares that end inside a row and a last share of a
# few pixels (13x13 = 169: 16 * 10 + 9)
PROJECTIONS = [  # (batch, C, hidden, H, W, stride, residual)
    (1, 32, 192, 28, 28, 1, True),      # MobileNetV2's features.5 (by pixels)
    (2, 24, 144, 13, 13, 1, True),      # 169 pixels: shares end mid-row
    (1, 40, 240, 14, 14, 2, False),     # 7x7 outputs, 40 < 49 channels: by pixels
    (1, 96, 384, 7, 7, 1, True),        # 96 > 49 output channels: by channels
]


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("geom", PROJECTIONS, ids=lambda g: "x".join(map(str, g[:6])))
def test_the_projection_split_by_pixels_or_channels_is_bitwise(geom, threads):
    nb, c, hidden, h, w, stride, residual = geom
    shape = (nb, c, h, w)
    net = ResidualBlock(c, hidden, 1, "add", True) if residual else Block(c, hidden, c, stride)
    _one_block_step_bitwise(_quantized(net, shape), shape, threads, (3, 4, 5))


class DwPw(M.Module):
    """MobileNetV1's depthwise-pointwise pair: a block with no expand."""

    def __init__(self, c, cout, stride, kernel=3):
        super().__init__()
        self.quant, self.dequant = M.QuantStub(), M.DequantStub()
        self.dw = M.ConvBnRelu2d(c, c, kernel, stride, kernel // 2, groups=c, bias=False)
        self.pw = M.ConvBnRelu2d(c, cout, 1, bias=False)

    def forward(self, x):
        return self.dequant(self.pw(self.dw(self.quant(x))))


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("geom", [(1, 24, 16, 9, 9, 1, 3), (2, 40, 24, 14, 13, 2, 3),
                                  (1, 32, 16, 31, 30, 1, 3), (2, 17, 8, 33, 35, 2, 5)],
                         ids=lambda g: "x".join(map(str, g)))
@pytest.mark.parametrize("bands", ["default", "one_row"])
def test_a_depthwise_pointwise_pair_is_a_block_step_bitwise(geom, threads, bands, request):
    if bands == "one_row":
        request.getfixturevalue("small_bands")
    nb, c, cout, h, w, stride, kernel = geom
    shape = (nb, c, h, w)
    qm = _quantized(DwPw(c, cout, stride, kernel), shape)
    old = mt.get_num_threads()
    mt.set_num_threads(threads)
    try:
        x = rand(*shape, seed=3)
        plan = mt.compile(qm, x)
        assert _block_steps(plan, x) == ["dw: ConvBnRelu2d .. pw: ConvBnRelu2d: int8 block"]
        for seed in (3, 4):
            x = rand(*shape, seed=seed)
            assert plan(x).numpy().tobytes() == qm(x).numpy().tobytes(), (geom, seed)
    finally:
        mt.set_num_threads(old)


def _rss_mib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2 ** 20


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="Linux /proc")
def test_threads_that_ran_a_block_plan_free_its_bands_when_they_end():
    # a team of one runs the bands on the calling thread, in a buffer kept
    # for its next call (~1 MiB here): each short-lived thread kept one
    shape = (1, 24, 56, 56)
    qm = _quantized(Block(24, 144, 24, 1), shape)
    old = mt.get_num_threads()
    mt.set_num_threads(1)
    try:
        x = rand(*shape, seed=3)
        plan = mt.compile(qm, x)
        assert len(_block_steps(plan, x)) == 1
        for _ in range(3):
            plan(x)
        before = _rss_mib()
        for _ in range(100):
            t = threading.Thread(target=plan, args=(x,))
            t.start()
            t.join()
        grew = _rss_mib() - before
    finally:
        mt.set_num_threads(old)
    assert grew < 30, f"{grew:.0f} MiB more after 100 threads"
