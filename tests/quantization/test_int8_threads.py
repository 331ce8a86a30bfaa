"""The int8 kernels' thread teams (qgemm.c's mt_q_team): layers above the
grain (2**19 multiply-adds or packed bytes a thread) split over the threads
mgtrace.set_num_threads gives, on every path, with the bits of one thread
and of the NumPy integer reference; below it they run on one."""
import numpy as np
import pytest

import mgtrace as mt
from mgtrace.quantization import int8

from tests.quantization.test_int8_kernels import ref_bias, ref_conv, ref_linear, ref_requant


@pytest.fixture
def threads():
    old = mt.get_num_threads()
    yield
    mt.set_num_threads(old)


def _conv_ref(x, x_zp, w, ws, bias, groups, stride, padding, relu):
    acc = ref_conv(x, x_zp, w, groups, stride, padding, (1, 1))
    acc += ref_bias(bias, 0.03, ws)[None, :, None, None]
    mult = np.float64(np.float32(0.03)) * ws.astype(np.float64) / np.float64(np.float32(0.05))
    return ref_requant(acc, mult[None, :, None, None], 128, 128 if relu else 0, 255, np.uint8)


# (input shape, out channels, kernel, groups, stride, padding): each one's
# multiply-adds past the grain for three threads (1.8 M to 12.8 M)
CONVS = {"1x1": ((1, 64, 56, 56), 64, 1, 1, 1, 0),
         "3x3": ((1, 32, 28, 28), 48, 3, 1, 1, 1),
         "depthwise": ((2, 64, 56, 56), 64, 3, 64, 1, 1)}


@pytest.mark.parametrize("path", [0, 1, 2, 3, 4])
@pytest.mark.parametrize("name", sorted(CONVS))
def test_convs_split_over_threads_give_the_bits_of_one(threads, name, path):
    xs, co, k, g, s, p = CONVS[name]
    if g > 1 and path == 4:
        pytest.skip("depthwise has no path 4")
    rng = np.random.default_rng(sorted(CONVS).index(name) + 40)
    x = rng.integers(0, 256, xs).astype(np.uint8)
    w = rng.integers(-127, 128, (co, xs[1] // g, k, k)).astype(np.int8)
    ws = rng.uniform(0.002, 0.02, co).astype(np.float32)
    bias = (rng.standard_normal(co) * 4).astype(np.float32)
    weight = int8.Int8Weight(w, ws, bias, groups=g)
    macs = x.shape[0] * co * (xs[1] // g) * k * k * (xs[2] // s) * (xs[3] // s)
    assert macs >= 3 * 2 ** 19
    outs = []
    for n in (1, 3):
        mt.set_num_threads(n)
        outs.append(int8.conv2d(x, 0.03, 37, weight, 0.05, 128, "quint8", True, s, p, 1,
                                path=path))
    np.testing.assert_array_equal(outs[1], outs[0])
    np.testing.assert_array_equal(outs[1], _conv_ref(x, 37, w, ws, bias, g, (s, s), (p, p), True))


@pytest.mark.parametrize("path", [0, 1])
def test_linear_split_over_threads_gives_the_bits_of_one(threads, path):
    rng = np.random.default_rng(44)
    x = rng.integers(0, 256, (64, 384)).astype(np.uint8)
    w = rng.integers(-127, 128, (96, 384)).astype(np.int8)
    ws = rng.uniform(0.001, 0.01, 96).astype(np.float32)
    bias = (rng.standard_normal(96) * 3).astype(np.float32)
    weight = int8.Int8Weight(w, ws, bias)
    outs = []
    for n in (1, 3):
        mt.set_num_threads(n)
        outs.append(int8.linear(x, 0.03, 111, weight, 0.05, 90, "quint8", False,
                                x_dtype="quint8", path=path))
    np.testing.assert_array_equal(outs[1], outs[0])
    np.testing.assert_array_equal(outs[1], ref_linear(x, 111, w, ws, bias, 0.03, 0.05, 90,
                                                      np.uint8, False))
