"""The int8 convs' thread teams (kernels/cpu/qconv.c): a dense conv runs
its padding, packing and tiles as worksharing loops of one parallel region
per call (over every image and group), each thread packing its own panels
of pixels where they are enough for the team (else the whole input first,
by the calling thread before the team starts where one image's is small,
tiles split over pixels and channels, or channels outer where the weights
outweigh the input), and the depthwise kernels count a multiply-add as
eight of the grain. Whatever the split, at 1, 2 and 3 threads and on every
path, each output is the NumPy integer reference's: the cases take each
split (the 30x30 and 5x5 ones panels per thread at 1 thread, the 30x30 one
at 3 too, the 5x5 one packed before the team at 2 and 3; the deep ones a
last block of a few pixels by row dots, over 16-channel steps)."""
import numpy as np
import pytest

import mgtrace as mt
from mgtrace.quantization import int8

from tests.quantization.test_int8_kernels import ref_bias, ref_conv, ref_requant


@pytest.fixture
def threads():
    old = mt.get_num_threads()
    yield
    mt.set_num_threads(old)


def _ref(x, x_zp, w, ws, bias, groups, stride, padding, out_dtype):
    acc = ref_conv(x, x_zp, w, groups, stride, padding, (1, 1))
    acc += ref_bias(bias, 0.03, ws)[None, :, None, None]
    if out_dtype == "float32":      # the float epilogue: acc * x_scale * w_scale, ReLU
        mult = np.float64(np.float32(0.03)) * ws.astype(np.float64)
        return np.maximum(acc * mult[None, :, None, None], 0).astype(np.float32)
    mult = np.float64(np.float32(0.03)) * ws.astype(np.float64) / np.float64(np.float32(0.05))
    return ref_requant(acc, mult[None, :, None, None], 128, 128, 255, np.uint8)


# (input shape, out channels, kernel, groups, stride, padding): the dense
# ones past 3 * 2**19 multiply-adds, the depthwise ones past it counting
# eight per multiply-add (so three threads take them)
CONVS = {"batched 3x3 stride 2": ((3, 24, 20, 20), 40, 3, 1, 2, 1),
         "grouped 1x1": ((2, 64, 28, 28), 96, 1, 2, 1, 0),
         "5x5 odd pixels": ((1, 16, 23, 19), 36, 5, 1, 1, 2),
         "3x3 30x30": ((1, 64, 30, 30), 32, 3, 1, 1, 1),
         # a last block of 1 or 4 pixels under deep K: its outputs by row
         # dots (the 14x14 one at 2 and 3 threads; at 1 it packs panels);
         # 40 and 18 channels a group: tiles of 4 and 16-channel steps cut
         "7x7 deep, 1 pixel past 3 blocks": ((1, 128, 7, 7), 40, 3, 1, 1, 1),
         "14x14 grouped, 4 pixels past 12 blocks": ((2, 256, 14, 14), 36, 3, 2, 1, 1),
         "6x6 stride 2, 4 pixels past 2 blocks": ((1, 160, 12, 12), 48, 3, 1, 2, 1),
         "2x2, 4 pixels and no whole block": ((1, 160, 2, 2), 280, 3, 1, 1, 1),
         "depthwise 14x14": ((2, 64, 14, 14), 64, 3, 64, 1, 1),
         "depthwise 7x7": ((4, 160, 7, 7), 160, 3, 160, 1, 1)}


@pytest.mark.parametrize("out_dtype", ["quint8", "float32"])
@pytest.mark.parametrize("path", [0, 1, 2, 3, 4, 5, 6])
@pytest.mark.parametrize("name", sorted(CONVS))
def test_conv_team_splits_give_the_reference_bits(threads, name, path, out_dtype):
    xs, co, k, g, s, p = CONVS[name]
    depthwise = g > 1 and g == xs[1]
    if path in ((4,) if depthwise else (5, 6)):
        pytest.skip("no such path for this conv")
    rng = np.random.default_rng(sorted(CONVS).index(name) + 70)
    x = rng.integers(0, 256, xs).astype(np.uint8)
    w = rng.integers(-127, 128, (co, xs[1] // g, k, k)).astype(np.int8)
    ws = rng.uniform(0.002, 0.02, co).astype(np.float32)
    bias = (rng.standard_normal(co) * 4).astype(np.float32)
    weight = int8.Int8Weight(w, ws, bias, groups=g)
    oh, ow = (xs[2] + 2 * p - k) // s + 1, (xs[3] + 2 * p - k) // s + 1
    macs = xs[0] * co * (xs[1] // g) * k * k * oh * ow * (8 if depthwise else 1)
    assert macs >= 3 * 2 ** 19
    want = _ref(x, 37, w, ws, bias, g, (s, s), (p, p), out_dtype)
    for n in (1, 2, 3):
        mt.set_num_threads(n)
        got = int8.conv2d(x, 0.03, 37, weight, 0.05, 128, out_dtype, True, s, p, 1,
                          path=path)
        np.testing.assert_array_equal(got, want, err_msg=f"{n} threads")


@pytest.mark.parametrize("shape", [(7, 5), (96, 384), (37, 9, 3, 3), (512, 64, 1, 1)])
def test_weights_packed_at_64_byte_boundaries(shape):
    # the AMX tiles load 64-byte rows of them: one cache line each only when
    # aligned (ResNet-18's int8 convs and MiniLM's linears ran 10-26% longer)
    rng = np.random.default_rng(len(shape) * 7 + shape[0])
    w = rng.integers(-127, 128, shape).astype(np.int8)
    weight = int8.Int8Weight(w, rng.uniform(0.01, 0.02, shape[0]).astype(np.float32))
    held = weight.packs[0][0] if len(shape) == 2 else weight.rows
    assert held.ctypes.data % 64 == 0
    if len(shape) == 4:         # the rows as the kernel reads them: k padded to 64
        k = int(np.prod(shape[1:]))
        np.testing.assert_array_equal(weight.rows[:shape[0], :k], w.reshape(shape[0], k))
        assert not weight.rows[shape[0]:].any() and not weight.rows[:, k:].any()
