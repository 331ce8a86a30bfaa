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
