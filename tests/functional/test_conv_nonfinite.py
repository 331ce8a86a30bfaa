"""A NaN or inf in a conv's input stays where a direct sum puts it, whatever
the algorithm: only the outputs whose receptive field holds it are
non-finite, with the direct sum's NaN/+inf/-inf, and the other outputs are
the finite reference. Transform-based kernels (Winograd F(2x2), F(4x4), the
NCHWc Winograd) mix a whole tile into each of its outputs; they find the
non-finite input as they read it and the call runs on a direct kernel.
The reference is a float64 direct sum in NumPy."""
import numpy as np
import pytest

import mgtrace as mt
import mgtrace.functional as F
from mgtrace._core import nn
from mgtrace._core.tensor import tensor

NAN, INF = np.nan, np.inf


def direct_conv(x, w, b, padding):
    """float64 direct sum of a 3x3 stride-1 conv: every output is the sum of
    its 9 x C products, so a non-finite input reaches its receptive field only."""
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (padding, padding), (padding, padding)))
    oh, ow = xp.shape[2] - 2, xp.shape[3] - 2
    y = np.broadcast_to(b.astype(np.float64)[None, :, None, None], (x.shape[0], w.shape[0], oh, ow)).copy()
    with np.errstate(invalid="ignore"):
        for i in range(3):
            for j in range(3):
                patch = xp[:, :, i:i + oh, j:j + ow]
                for o in range(w.shape[0]):        # (einsum's sums would mix +inf and -inf alike)
                    y[:, o] += np.tensordot(w[o, :, i, j].astype(np.float64), patch, axes=([0], [1]))
    return y


def check(y, ref):
    """The NaN, +inf and -inf places equal the reference's exactly; the
    finite values match within float32 rounding of the output's scale."""
    for name, f in (("NaN", np.isnan), ("+inf", np.isposinf), ("-inf", np.isneginf)):
        bad = np.argwhere(f(y) != f(ref))
        assert not len(bad), f"{name} at other places than the direct sum's, e.g. {bad[:4].tolist()}"
    fin = np.isfinite(ref)
    if not fin.any():
        return
    scale = np.abs(ref[fin]).max()
    np.testing.assert_allclose(y[fin], ref[fin], rtol=0, atol=3e-5 * scale)


# (row, col) of the non-finite input pixels: corners, F(2x2) and F(4x4)
# tile borders (even and multiple-of-4 rows and columns, with padding 1 a
# tile's patch starts one pixel up and left), the interior
POSITIONS = [(0, 0), (13, 13), (0, 13), (3, 4), (4, 3), (7, 8), (8, 7), (5, 6)]
KINDS = {
    "nan": [(0, 0, NAN)],
    "+inf": [(0, 0, INF)],
    "-inf beside +inf": [(0, 0, INF), (0, 1, -INF)],      # NaN where both reach an output
}


def inputs(pos, kind, c=20, o=20, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((2, c, 14, 14)).astype(np.float32)
    w = rng.standard_normal((o, c, 3, 3)).astype(np.float32)
    b = rng.standard_normal(o).astype(np.float32)
    r, col = pos
    for dr, dc, v in KINDS[kind]:
        # image 1 only (image 0 stays finite); another channel per position
        x[1, (r + col) % c, min(r + dr, 13), min(col + dc, 12) if dc else col] = v
    return x, w, b


CASES = [(p, k) for p in POSITIONS for k in KINDS]
IDS = [f"{k}@{p[0]},{p[1]}" for p, k in CASES]


@pytest.mark.parametrize("algo", ["winograd", "winograd4", "direct", "im2col", "shifted", "blocked"])
@pytest.mark.parametrize("pos, kind", CASES, ids=IDS)
def test_conv2d_each_algorithm_keeps_nonfinite_inputs_in_their_receptive_field(algo, pos, kind):
    x, w, b = inputs(pos, kind)
    for padding in (1, 0):
        ref = direct_conv(x, w, b, padding)
        y = nn._conv2d(tensor(x), tensor(w), tensor(b), 1, padding, 1, 1, algo).numpy()
        check(y, ref)


@pytest.mark.parametrize("pos, kind", CASES[::3], ids=IDS[::3])
def test_functional_conv2d_where_it_picks_winograd(pos, kind):
    """F.conv2d as a user calls it, on a geometry its automatic choice runs as Winograd."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((1, 16, 28, 28)).astype(np.float32)
    w = rng.standard_normal((16, 16, 3, 3)).astype(np.float32)
    assert nn.conv2d_algorithm(x.shape, w.shape, padding=1).startswith("winograd")
    for dr, dc, v in KINDS[kind]:
        x[0, 5, 2 * pos[0] + dr, 2 * pos[1] + dc] = v
    y = F.conv2d(mt.tensor(x), mt.tensor(w), padding=1).numpy()
    check(y, direct_conv(x, w, np.zeros(16, np.float32), 1))


@pytest.mark.parametrize("winograd", [2, 4, False])
@pytest.mark.parametrize("pos, kind", CASES, ids=IDS)
def test_conv2d_nchwc_winograd_keeps_nonfinite_inputs_in_their_receptive_field(winograd, pos, kind):
    x, w, b = inputs(pos, kind)
    before = nn._set_nchwc_winograd(winograd)
    try:
        for padding in (1, 0):
            y = F.conv2d_nchwc(F.to_nchwc(mt.tensor(x)), mt.tensor(w), mt.tensor(b), padding=padding)
            check(F.from_nchwc(y, 20).numpy(), direct_conv(x, w, b, padding))
    finally:
        nn._set_nchwc_winograd(before)


def test_conv2d_nchwc_winograd_with_residual_and_activation_falls_back_whole():
    """The rerun on the direct kernel keeps the epilogue: act(conv + bias + residual)."""
    x, w, b = inputs((6, 6), "nan")
    res = np.random.default_rng(2).standard_normal((2, 20, 14, 14)).astype(np.float32)
    before = nn._set_nchwc_winograd(4)
    try:
        y = F.conv2d_nchwc(F.to_nchwc(mt.tensor(x)), mt.tensor(w), mt.tensor(b), padding=1, act="relu",
                           residual=F.to_nchwc(mt.tensor(res)))
    finally:
        nn._set_nchwc_winograd(before)
    with np.errstate(invalid="ignore"):
        ref = direct_conv(x, w, b, 1) + res
        ref = np.where(np.isnan(ref), ref, np.maximum(ref, 0))
    check(F.from_nchwc(y, 20).numpy(), ref)


def test_finite_inputs_still_run_winograd():
    """The guard changes nothing for finite inputs: the forced Winograd
    result is unchanged in rounding (F(4x4) rounds differently from a direct
    sum, so equal results would mean the fallback ran)."""
    rng = np.random.default_rng(4)
    x = rng.standard_normal((1, 64, 16, 16)).astype(np.float32)
    w = rng.standard_normal((64, 64, 3, 3)).astype(np.float32)
    y4 = nn._conv2d(tensor(x), tensor(w), None, 1, 1, 1, 1, "winograd4").numpy()
    yd = nn._conv2d(tensor(x), tensor(w), None, 1, 1, 1, 1, "direct").numpy()
    assert not np.array_equal(y4, yd)
    np.testing.assert_allclose(y4, direct_conv(x, w, np.zeros(64), 1), rtol=0, atol=2e-5 * np.abs(yd).max())


# ---- huge finite values and non-finite weights (issue 29 item 4) ----
#
# The rule: Winograd runs only while every |x| and |w| is below 2^k,
# k = (111 - ceil(log2 C)) / 2 in float32 (53 for 16 channels), where its
# transforms cannot overflow; past it, and on a NaN or inf weight, the call
# runs on a direct kernel. The reference is the float64 direct sum cast to
# float32: +-inf where it is past float32's range, as a float32 direct sum
# of same-signed products overflows there too.

F32_MAX = float(np.finfo(np.float32).max)


def ref32(x, w, b, padding):
    """The float64 direct sum, cast to float32 (inf past its range). The
    data is chosen so that no output lies within 1e-4 of float32's max,
    where float32's rounding could go either way."""
    ref = direct_conv(x, w, b, padding)
    near = np.isfinite(ref) & (np.abs(np.abs(ref) / F32_MAX - 1) < 1e-4)
    assert not near.any(), "test data: an output on float32's overflow edge"
    with np.errstate(over="ignore"):
        return ref.astype(np.float32)


def check_exact_places(y, ref, rtol=2e-5):
    """NaN/+inf/-inf exactly where ref has them; the finite values within
    rtol of it each (the data here has same-signed products: no cancellation)."""
    for name, f in (("NaN", np.isnan), ("+inf", np.isposinf), ("-inf", np.isneginf)):
        bad = np.argwhere(f(y) != f(ref))
        assert not len(bad), f"{name} at other places than the direct sum's, e.g. {bad[:4].tolist()}"
    fin = np.isfinite(ref)
    np.testing.assert_allclose(y[fin], ref[fin], rtol=rtol, atol=0)


@pytest.mark.parametrize("hw", [56, 28])
def test_functional_conv2d_huge_finite_input_gives_the_direct_sum(hw):
    """The tester's case: x = 1e37 overflowed in Winograd's input transform
    (every output inf); the direct sum is 144 * 1e33 = 1.44e35 inside."""
    x = np.full((1, 16, hw, hw), 1e37, np.float32)
    w = np.full((16, 16, 3, 3), 1e-4, np.float32)
    assert nn.conv2d_algorithm(x.shape, w.shape, padding=1).startswith("winograd")
    y = F.conv2d(mt.tensor(x), mt.tensor(w), padding=1).numpy()
    np.testing.assert_allclose(y[0, 0, 10, 10], 1.44e35, rtol=1e-5)
    assert np.isfinite(y).all()
    check_exact_places(y, ref32(x, w, np.zeros(16, np.float32), 1))


def huge_inputs(c=16, o=16, seed=5):
    """Positive x with a 10x10 patch of 1e37 and positive weights whose
    output channels scale by 1e-5, 1e-3, 1e-1 and 1e1 in turn: outputs
    finite and small, finite and huge, past float32's range, and
    in between at the patch's edges."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(0.9, 1.1, (2, c, 14, 14)).astype(np.float32)
    x[1, :, 3:13, 2:12] *= np.float32(1e37)
    w = rng.uniform(0.9, 1.1, (o, c, 3, 3)).astype(np.float32)
    w *= (10.0 ** (2 * (np.arange(o) % 4) - 5)).astype(np.float32)[:, None, None, None]
    return x, w, rng.uniform(-1, 1, o).astype(np.float32)


@pytest.mark.parametrize("algo", ["winograd", "winograd4", "direct", "im2col"])
def test_conv2d_huge_finite_inputs_overflow_only_where_a_direct_sum_does(algo):
    x, w, b = huge_inputs()
    for padding in (1, 0):
        ref = ref32(x, w, b, padding)
        assert np.isposinf(ref).any() and (np.isfinite(ref) & (np.abs(ref) > 1e35)).any()
        y = nn._conv2d(tensor(x), tensor(w), tensor(b), 1, padding, 1, 1, algo).numpy()
        check_exact_places(y, ref)


@pytest.mark.parametrize("winograd", [2, 4])
def test_conv2d_nchwc_huge_finite_inputs_overflow_only_where_a_direct_sum_does(winograd):
    x, w, b = huge_inputs()
    before = nn._set_nchwc_winograd(winograd)
    try:
        for padding in (1, 0):
            y = F.conv2d_nchwc(F.to_nchwc(mt.tensor(x)), mt.tensor(w), mt.tensor(b), padding=padding)
            check_exact_places(F.from_nchwc(y, 16).numpy(), ref32(x, w, b, padding))
    finally:
        nn._set_nchwc_winograd(before)


def huge_weight(seed=6):
    """Positive x and weights, one centre tap 3e38: the direct sum of its
    output channel is 3e38 * x + small (at most 3.3e38, finite), where
    Winograd's transforms grew it past float32's range."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(0.9, 1.1, (2, 16, 14, 14)).astype(np.float32)
    w = rng.uniform(0.9, 1.1, (16, 16, 3, 3)).astype(np.float32)
    w[3, 2, 1, 1] = 3e38
    return x, w, np.zeros(16, np.float32)


@pytest.mark.parametrize("value", ["huge", "inf", "-inf", "nan"])
@pytest.mark.parametrize("algo", ["winograd", "winograd4", "auto"])
def test_conv2d_weight_past_the_bound_runs_the_direct_sum(algo, value):
    """A NaN, inf or huge weight: Winograd mixed an infinite centre tap into
    inf - inf = NaN (784 NaN for the tester's 784 inf), and a huge one
    overflowed; now the direct sum's values, NaN and inf places."""
    x, w, b = huge_weight()
    if value != "huge":
        w[3, 2, 1, 1] = float(value)
    ref = ref32(x, w, b, 1)
    y = nn._conv2d(tensor(x), tensor(w), tensor(b), 1, 1, 1, 1, algo).numpy()
    check_exact_places(y, ref)
    if value == "huge":
        assert np.isfinite(y).all() and y[:, 3].min() > 2.5e38


def test_functional_conv2d_infinite_weight_gives_the_direct_sums_infs():
    """The tester's second case, through F.conv2d's automatic choice."""
    rng = np.random.default_rng(7)
    x = (rng.random((1, 16, 28, 28)) + 0.1).astype(np.float32)
    w = rng.standard_normal((16, 16, 3, 3)).astype(np.float32)
    w[3, 2, 1, 1] = np.inf
    assert nn.conv2d_algorithm(x.shape, w.shape, padding=1).startswith("winograd")
    y = F.conv2d(mt.tensor(x), mt.tensor(w), padding=1).numpy()
    assert np.isnan(y[0, 3]).sum() == 0 and np.isposinf(y[0, 3]).sum() == 784
    check(y, direct_conv(x, w, np.zeros(16), 1))


@pytest.mark.parametrize("winograd", [2, 4, None])
@pytest.mark.parametrize("value", ["huge", "inf", "nan"])
def test_conv2d_nchwc_weight_past_the_bound_runs_the_direct_sum(winograd, value):
    x, w, b = huge_weight()
    if value != "huge":
        w[3, 2, 1, 1] = float(value)
    x = np.concatenate([x] * 8)         # (enough tiles for the automatic choice's Winograd)
    before = nn._set_nchwc_winograd(winograd)
    try:
        y = F.conv2d_nchwc(F.to_nchwc(mt.tensor(x)), mt.tensor(w), mt.tensor(b), padding=1)
    finally:
        nn._set_nchwc_winograd(before)
    assert winograd or nn.conv2d_nchwc_algorithm(x.shape, w.shape, padding=1).startswith("winograd")
    check_exact_places(F.from_nchwc(y, 16).numpy(), ref32(x, w, b, 1))


def winograd_ran(y, x, w):
    """F(4x4) rounds differently from a direct sum: unequal bits mean it ran."""
    yd = nn._conv2d(tensor(x), tensor(w), None, 1, 1, 1, 1, "direct").numpy()
    return not np.array_equal(y, yd)


def test_cached_packing_remembers_an_unfit_weight_until_it_is_written():
    """The packed-weight cache keeps "no Winograd" for an infinite weight;
    an in-place write that makes it finite lets Winograd run again, and one
    that makes it infinite again sends it back to the direct kernel."""
    rng = np.random.default_rng(8)
    x = rng.uniform(0.5, 1.5, (1, 64, 16, 16)).astype(np.float32)
    w = rng.standard_normal((64, 64, 3, 3)).astype(np.float32)
    tw = tensor(w.copy())
    tw[3, 2, 1, 1] = np.inf
    w_inf = w.copy()
    w_inf[3, 2, 1, 1] = np.inf
    for _ in range(2):                  # packed, then from the cache
        y = nn._conv2d(tensor(x), tw, None, 1, 1, 1, 1, "winograd4").numpy()
        assert np.isposinf(y[0, 3]).all() and np.isfinite(np.delete(y, 3, axis=1)).all()
    tw[3, 2, 1, 1] = 0.5
    w[3, 2, 1, 1] = 0.5
    y = nn._conv2d(tensor(x), tw, None, 1, 1, 1, 1, "winograd4").numpy()
    ref = direct_conv(x, w, np.zeros(64), 1)
    np.testing.assert_allclose(y, ref, rtol=0, atol=2e-5 * np.abs(ref).max())
    assert winograd_ran(y, x, w)
    tw[3, 2, 1, 1] = np.inf
    y = nn._conv2d(tensor(x), tw, None, 1, 1, 1, 1, "winograd4").numpy()
    check(y, direct_conv(x, w_inf, np.zeros(64), 1))


def test_conv2d_nchwc_cached_packing_remembers_an_unfit_weight_until_it_is_written():
    rng = np.random.default_rng(9)
    x = rng.uniform(0.5, 1.5, (1, 32, 16, 16)).astype(np.float32)
    w = rng.standard_normal((32, 32, 3, 3)).astype(np.float32)
    tw, xb = tensor(w.copy()), F.to_nchwc(mt.tensor(x))
    before = nn._set_nchwc_winograd(4)
    try:
        tw[5, 1, 1, 1] = np.nan
        for _ in range(2):
            y = F.from_nchwc(F.conv2d_nchwc(xb, tw, padding=1), 32).numpy()
            assert np.isnan(y[0, 5]).all() and np.isfinite(np.delete(y, 5, axis=1)).all()
        tw[5, 1, 1, 1] = 0.25
        w[5, 1, 1, 1] = 0.25
        y = F.from_nchwc(F.conv2d_nchwc(xb, tw, padding=1), 32).numpy()
        nn._set_nchwc_winograd(False)
        yd = F.from_nchwc(F.conv2d_nchwc(xb, tw, padding=1), 32).numpy()
    finally:
        nn._set_nchwc_winograd(before)
    ref = direct_conv(x, w, np.zeros(32), 1)
    np.testing.assert_allclose(y, ref, rtol=0, atol=2e-5 * np.abs(ref).max())
    assert not np.array_equal(y, yd)        # Winograd ran again


@pytest.mark.parametrize("algo", ["winograd", "winograd4"])
def test_values_just_under_the_bound_still_run_winograd_and_stay_finite(algo):
    """16 channels: the bound is 2^53. x and w of magnitude up to 2^53 (less
    an ulp) with random signs run on Winograd (its rounding, not the direct
    sum's bits) and stay finite: the headroom holds."""
    rng = np.random.default_rng(10)
    top = np.float32(2.0 ** 53) * np.float32(1 - 2 ** -24)
    x = (rng.choice([-1, 1], (1, 16, 16, 16)) * rng.uniform(0.5, 1, (1, 16, 16, 16)) * top).astype(np.float32)
    w = (rng.choice([-1, 1], (16, 16, 3, 3)) * rng.uniform(0.5, 1, (16, 16, 3, 3)) * top).astype(np.float32)
    x.flat[0] = w.flat[0] = top
    assert np.abs(x).max() < 2.0 ** 53 and np.abs(w).max() < 2.0 ** 53
    y = nn._conv2d(tensor(x), tensor(w), None, 1, 1, 1, 1, algo).numpy()
    yd = nn._conv2d(tensor(x), tensor(w), None, 1, 1, 1, 1, "direct").numpy()
    ref = direct_conv(x, w, np.zeros(16), 1)
    assert np.isfinite(y).all() and not np.array_equal(y, yd)
    np.testing.assert_allclose(y, ref, rtol=0, atol=2e-5 * np.abs(ref).max())
    x.flat[0] = np.float32(2.0 ** 53)     # one value at the bound: the direct kernel's bits
    y = nn._conv2d(tensor(x), tensor(w), None, 1, 1, 1, 1, algo).numpy()
    yd = nn._conv2d(tensor(x), tensor(w), None, 1, 1, 1, 1, "direct").numpy()
    np.testing.assert_array_equal(y, yd)


@pytest.mark.parametrize("case", ["inf weight", "huge input"])
def test_optimized_flattened_model_gives_the_direct_sums_nonfinite_places(case):
    """optimize(tm, "all", flatten=True) runs 1x1, 3x3, 1x1 convs as
    conv2d_nchwc (the 3x3 on a blocked input: F(4x4)): an infinite 3x3
    weight gives the direct sum's +inf in every output (Winograd's NaN
    spread through the last 1x1 conv), and a patch of 5e36 in x finite
    outputs up to 2.8e38 (Winograd's transforms overflowed: 2048 inf)."""
    import mgtrace.module as M
    from mgtrace.traced_module import optimize

    class Net(M.Module):
        def __init__(self):
            super().__init__()
            self.a, self.c3, self.b = M.Conv2d(32, 32, 1), M.Conv2d(32, 32, 3, padding=1), M.Conv2d(32, 32, 1)

        def forward(self, x):
            return self.b(self.c3(self.a(x)))

    rng = np.random.default_rng(11)
    net = Net().eval()
    ws = {}
    for name, k in (("a", 1), ("c3", 3), ("b", 1)):
        ws[name] = rng.uniform(0.01, 0.1, (32, 32, k, k)).astype(np.float32)
    x = rng.uniform(0.5, 1.5, (1, 32, 64, 64)).astype(np.float32)
    if case == "inf weight":
        ws["c3"][3, 2, 1, 1] = np.inf
    else:
        x[:, :, 4:12, 4:12] = 5e36
    for name, w in ws.items():
        getattr(net, name).weight[...] = mt.tensor(w)
    bs = {name: getattr(net, name).bias.numpy().reshape(-1).astype(np.float64) for name in ws}
    tm = mt.trace_module(net, mt.tensor(x))
    flat = optimize(tm, "all", flatten=True)
    if len(flat.graph.get_function_by_type(F.conv2d_nchwc).as_list()) != 3:
        pytest.skip("the NCHWc pass needs a CPU with AVX-512")
    assert nn.conv2d_nchwc_algorithm((1, 32, 64, 64), (32, 32, 3, 3), padding=1).startswith("winograd")

    def pointwise(name, t):
        return np.einsum("oc,nchw->nohw", ws[name][:, :, 0, 0].astype(np.float64), t) + bs[name][None, :, None, None]

    with np.errstate(invalid="ignore"):
        ref = pointwise("b", direct_conv(pointwise("a", x.astype(np.float64)), ws["c3"], bs["c3"], 1))
    assert np.isposinf(ref).all() if case == "inf weight" else np.abs(ref).max() < 0.9 * F32_MAX
    check(flat(mt.tensor(x)).numpy(), ref)
