"""The one sliding-window geometry rule (mt_window_out in contract/geometry.h,
exposed as mgtrace._core.nn.window_output_size) and its one error text.

What is proved:

* the output sizes equal PyTorch's pooling_output_shape written out in
  Python integers (floor and ceil mode, the ceil-mode rule that the last
  window starts inside the input or the left padding), over a grid of small
  geometries and at the 2**31 bounds where int64 products would wrap;
* every conv and pool path (conv2d, conv2d_act, conv2d_nchwc,
  conv2d_algorithm, max_pool2d, avg_pool2d, conv3d, sliding_window) refuses
  a window larger than the padded input with the same words, naming its op.
"""
import itertools

import numpy as np
import pytest

import mgtrace.functional as F
from mgtrace._core import nn
from mgtrace._core.tensor import tensor


def _reference(size, k, s, p, d, ceil_mode):
    """PyTorch's pooling_output_shape (aten/src/ATen/native/Pool.h), in
    Python ints; conv is its floor mode."""
    num = size + 2 * p - d * (k - 1) - 1 + (s - 1 if ceil_mode else 0)
    out = num // s + 1
    if ceil_mode and (out - 1) * s >= size + p:
        out -= 1
    return out


@pytest.mark.parametrize("ceil_mode", [False, True])
def test_matches_pytorchs_rule_on_a_grid(ceil_mode):
    checked = 0
    for size, k, s, p, d in itertools.product(range(0, 9), range(1, 5), range(1, 4), range(0, 3), range(1, 3)):
        want = _reference(size, k, s, p, d, ceil_mode)
        if want < 1:
            with pytest.raises(ValueError, match="larger than the padded input"):
                nn.window_output_size("op", (size,), (k,), (s,), (p,), (d,), ceil_mode)
        else:
            assert nn.window_output_size("op", (size,), (k,), (s,), (p,), (d,), ceil_mode) == (want,)
            checked += 1
    assert checked > 500


def test_no_wrap_at_the_bounds():
    big = 2 ** 31 - 1
    # a dilated span of about 2**62 against a padded input of 2**62 + 2**32
    size = 2 ** 62
    for ceil_mode in (False, True):
        got = nn.window_output_size("op", (size,), (big,), (big,), (big,), (big,), ceil_mode)
        assert got == (_reference(size, big, big, big, big, ceil_mode),)
    with pytest.raises(ValueError, match=r"op: kernel \(2147483647,\) with dilation \(2147483647,\) is larger"):
        nn.window_output_size("op", (5,), (big,), (1,), (0,), (big,))


def test_several_axes_and_the_message():
    assert nn.window_output_size("conv3d", (5, 7, 9), (3, 3, 3), (1, 2, 3), (0, 1, 1), (1, 1, 2)) == (3, 4, 3)
    with pytest.raises(ValueError) as e:
        nn.window_output_size("conv3d", (5, 2, 9), (3, 5, 3), (1, 1, 1), (0, 1, 0), (1, 1, 1))
    assert str(e.value) == "conv3d: kernel (3, 5, 3) with dilation (1, 1, 1) is larger than the padded input (5, 4, 9)"


def _f32(*shape):
    return tensor(np.ones(shape, np.float32))


@pytest.mark.parametrize("op, call", [
    ("conv2d", lambda: F.conv2d(_f32(1, 2, 3, 3), _f32(4, 2, 5, 5))),
    ("conv2d", lambda: F.conv2d_act(_f32(1, 2, 3, 3), _f32(4, 2, 5, 5), act="relu")),   # its kernel's name
    ("conv2d", lambda: nn.conv2d_algorithm((1, 2, 3, 3), (4, 2, 5, 5))),
    ("max_pool2d", lambda: F.max_pool2d(_f32(1, 2, 3, 3), 5, 1, 2, dilation=2)),
    ("conv3d", lambda: F.conv3d(_f32(1, 2, 3, 3, 3), _f32(4, 2, 5, 1, 1))),
    ("sliding_window", lambda: F.sliding_window(_f32(1, 2, 3, 3), 5)),
])
def test_every_path_says_the_same(op, call):
    with pytest.raises(ValueError, match=rf"^{op}: kernel \(\d+(, \d+)*\) with dilation \(\d+(, \d+)*\) is "
                                         r"larger than the padded input \(\d+(, \d+)*\)$"):
        call()


def test_conv2d_nchwc_says_the_same():
    with pytest.raises(ValueError, match=r"^conv2d_nchwc: kernel \(5, 5\) with dilation \(1, 1\) is larger than "
                                         r"the padded input \(3, 3\)$"):
        F.conv2d_nchwc(F.to_nchwc(_f32(1, 16, 3, 3)), _f32(16, 16, 5, 5))
