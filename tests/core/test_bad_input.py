"""Regressions from breaking the core on purpose: each case once gave a
wrong answer, a wrong exception type or an unclear message."""
import re

import numpy as np
import pytest

import mgtrace as mt
from mgtrace._core import index as I


def test_broadcast_views_are_read_only():
    base = mt.tensor([1.0, 2.0, 3.0])
    b = base.broadcast_to((4, 3))
    assert b.readonly and not base.readonly
    with pytest.raises(ValueError, match="broadcast view"):
        b += 1
    with pytest.raises(ValueError, match="broadcast view"):
        b[...] = 0.0
    with pytest.raises(ValueError, match="broadcast view"):
        b[0][1] = 5.0                       # views of the view stay read-only
    assert base.tolist() == [1.0, 2.0, 3.0]
    c = b.copy()
    c += 1
    assert c.tolist() == [[2.0, 3.0, 4.0]] * 4
    assert not np.from_dlpack(b).flags.writeable


def test_broadcast_to_element_count_overflow():
    with pytest.raises(ValueError, match="overflows int64"):
        mt.tensor([1.0, 2.0]).broadcast_to((2 ** 32, 2 ** 32, 2))
    with pytest.raises(ValueError, match="does not fit int64"):
        mt.tensor([1.0]).reshape(2 ** 63)


@pytest.mark.parametrize("data,dtype", [([-1], "uint8"), ([300], "uint8"), ([2 ** 20], "int8"),
                                        ([2 ** 63], "int64"), (2 ** 70, "int64"), ([[1], [2 ** 40]], "int32")])
def test_explicit_int_dtype_must_hold_python_ints(data, dtype):
    with pytest.raises(OverflowError, match=dtype):
        mt.tensor(data, dtype)


def test_explicit_dtype_still_casts_floats_and_keeps_fitting_ints():
    assert mt.tensor([2.7, -1.5], "int32").tolist() == [2, -1]
    assert mt.tensor([255, 0], "uint8").tolist() == [255, 0]
    assert mt.tensor([2 ** 40], "float32").item() == float(2 ** 40)


def test_zero_dim_bool_index():
    a = np.arange(6.0).reshape(2, 3)
    t = mt.tensor(a)
    for idx in (True, False):
        got = t[mt.tensor(idx)]
        want = a[np.array(idx)]
        assert got.shape == want.shape and np.array_equal(got.numpy(), want)
    assert t[1, mt.tensor(True)].tolist() == a[1, np.array(True)].tolist()
    with pytest.raises(IndexError, match="0-d bool"):
        t[mt.tensor(True), [0]]


def test_float32_sum_of_biased_data_is_accurate():
    a = np.full(10 ** 7, 0.1, np.float32)
    exact = 10 ** 7 * float(np.float32(0.1))
    assert abs(mt.tensor(a).sum().item() - exact) / exact < 2e-7


def test_view_never_copies():
    x = mt.tensor(np.arange(6.0).reshape(2, 3))
    with pytest.raises(ValueError, match="reshape"):
        x.T.view(6)
    v = x.view(3, 2)
    v[0, 0] = 100.0
    assert x[0, 0].item() == 100.0


def test_apply_checks_operand_count():
    t = mt.tensor([1.0, 2.0])
    with pytest.raises(TypeError, match="neg"):
        mt.apply(mt.OpDef("neg"), t, t)
    with pytest.raises(TypeError, match="add"):
        mt.apply(mt.OpDef("add"), t)
    assert t.tolist() == [1.0, 2.0]


def test_dtype_promotion_of_lists_matches_ops():
    a8 = mt.tensor([1], "int8")
    assert mt.dtype_promotion(a8, [1, 2]) == (a8 + [1, 2]).dtype == "int32"
    h = mt.tensor([1.0], "float16")
    assert mt.dtype_promotion(h, [1.5]) == (h + [1.5]).dtype == "float32"


def test_repr_of_huge_views_does_not_materialise():
    r = repr(mt.tensor([1.5]).broadcast_to((2 ** 20, 2 ** 20)))
    assert "1099511627776 elements" in r and "1.5" in r


def test_dlpack_device_request():
    t = mt.tensor([1.0])
    with pytest.raises(BufferError):
        t.__dlpack__(dl_device=(2, 0))
    assert np.from_dlpack(np.broadcast_to(np.arange(3.0), (2, 3))).shape == (2, 3)
    assert mt.from_dlpack(np.broadcast_to(np.arange(3.0), (2, 3))).readonly


def test_misc_messages_and_types():
    t = mt.tensor(np.arange(6.0).reshape(2, 3))
    with pytest.raises(IndexError):
        t[2 ** 70]
    with pytest.raises(TypeError, match="list or tuple"):
        I.concat(t)
    with pytest.raises(TypeError):
        mt.set_num_threads(1.5)
    with pytest.raises(ValueError, match="repeated"):
        t.reshape(1, 6, 1).squeeze((0, 0))
    assert (t == None) is False and (t != None) is True   # noqa: E711
    t[1:, 1:] = mt.tensor([[[7.0, 8.0]]])                  # leading unit axes drop, as in NumPy
    assert t[1].tolist() == [3.0, 7.0, 8.0]
    assert np.sum(t) .item() == float(np.sum(t.numpy()))
    assert np.mean(t).item() == pytest.approx(float(np.mean(t.numpy())))


# ------------------------------------------------------------- sizes (issue 11)
# Every size computed from user (or archive) values is checked before it
# reaches C. Each row: (call, exception, message). The calls run in-process
# below, and all of them once more in a fresh interpreter, where a crash
# (stride 2**62 + 1 once overflowed conv2d's work buffer: SIGSEGV) would end
# that process instead of pytest.
HUGE = 2 ** 62 + 1
SIZE_CASES = [
    ("nn.conv2d(X4, W4, None, (1, HUGE))", ValueError,
     r"conv2d: stride must be at most 2147483647 \(2\*\*31 - 1\), got 4611686018427387905"),
    ("nn.conv2d(X4, W4, None, 1, 2 ** 63)", ValueError, r"conv2d: padding must be at most .*9223372036854775808"),
    ("nn.conv2d(X4, W4, None, 1, 0, -HUGE)", ValueError, r"conv2d: dilation must be >= 1, got -4611686018427387905"),
    ("nn.conv2d(X4, W4, None, 1, 0, 1, HUGE)", ValueError, r"conv2d: groups must be at most 2147483647 \(2\*\*31 - 1\)"),
    ("nn.conv2d(X4, W4, None, 1, 10 ** 6)", ValueError, r"conv2d: a dimension product of \d+ exceeds the 32-bit BLAS"),
    ("nn.conv_transpose2d(X4, WT, None, HUGE)", ValueError, r"conv_transpose2d: stride must be at most"),
    ("nn.conv_transpose2d(X4, WT, None, 1, 0, HUGE)", ValueError, r"conv_transpose2d: output_padding must be at most"),
    ("nn.max_pool2d(X4, 2 ** 63 - 1)", ValueError, r"max_pool2d: kernel_size must be at most"),
    ("nn.avg_pool2d(X4, 2, 2 ** 63)", ValueError, r"avg_pool2d: stride must be at most"),
    ("nn.max_pool2d(X4, 2 ** 31 - 1)", ValueError, r"max_pool2d: kernel \(2147483647, 2147483647\).* larger than the padded input"),
    ("nn.adaptive_avg_pool2d(X4, 2 ** 63)", ValueError, r"adaptive_avg_pool2d: output_size must be at most"),
    ("nn.adaptive_max_pool2d(X4, (2 ** 31 - 1, 2 ** 31 - 1))", ValueError,
     r"adaptive_max_pool2d: output_size \(2147483647, 2147483647\) give an output of shape .* more elements"),
    ("nn.interpolate(X4, size=2 ** 63)", ValueError, r"interpolate: size must be at most"),
    ("nn.interpolate(X4, scale_factor=1e300)", ValueError, r"interpolate: scale_factor 1e\+300 gives an output size above"),
    ("nn.pad(X4, 2 ** 63)", ValueError, r"pad: pad_width 9223372036854775808 give an output of shape \(18446744073709551617,"),
    ("nn.pad(X4, ((0, 0), (0, 0), (0, HUGE), (0, 0)))", ValueError, r"pad: pad_width .* give an output of shape \(1, 3, 4611686018427387913, 8\)"),
    ("nn.pad(X4, 2 ** 70, mode='reflect')", ValueError, r"pad: pad_width 1180591620717411303424 give an output"),
    ("mt.tensor([1.0]).broadcast_to((HUGE, 3))", ValueError, r"tensor too large: shape \(4611686018427387905, 3\) has more than 2\*\*62"),
    ("mt.tensor([1.0]).reshape(HUGE)", ValueError, r"cannot reshape"),
    ("R.topk(mt.tensor([1.0, 2.0]), 2 ** 63)", ValueError, r"topk: k=9223372036854775808 is out of range"),
    ("R.sum(mt.tensor([1.0]), 2 ** 64)", IndexError, r"sum: axis 18446744073709551616 is out of bounds"),
]


def _size_namespace():
    from mgtrace._core import nn, reduce
    return {"mt": mt, "nn": nn, "R": reduce, "np": np, "HUGE": HUGE,
            "X4": mt.tensor(np.ones((1, 3, 8, 8), np.float32)),
            "W4": mt.tensor(np.ones((4, 3, 3, 3), np.float32)),
            "WT": mt.tensor(np.ones((3, 4, 3, 3), np.float32))}


# the calls that crashed the process before the fix run only in the subprocess
CRASHED = {"nn.conv2d(X4, W4, None, (1, HUGE))"}


@pytest.mark.parametrize("call, exc, match", [c for c in SIZE_CASES if c[0] not in CRASHED],
                         ids=[c for c, _, _ in SIZE_CASES if c not in CRASHED])
def test_sizes_from_arguments_are_checked(call, exc, match):
    with pytest.raises(exc, match=match):
        eval(call, _size_namespace())                      # noqa: S307  (our own table)


def test_size_errors_never_crash_the_process(run_isolated):
    src = ["from mgtrace._core import nn, reduce as R", "HUGE = 2 ** 62 + 1",
           "X4 = mt.tensor(np.ones((1, 3, 8, 8), np.float32))",
           "W4 = mt.tensor(np.ones((4, 3, 3, 3), np.float32))",
           "WT = mt.tensor(np.ones((3, 4, 3, 3), np.float32))"]
    src += [f"case({call!r}, lambda: {call})" for call, _, _ in SIZE_CASES]
    rc, got, err = run_isolated("\n".join(src))
    assert rc == 0, err[-2000:]
    for call, exc, match in SIZE_CASES:
        kind, msg = got[call]
        assert kind == exc.__name__ and re.search(match, msg), (call, kind, msg)


def test_huge_strides_that_fit_compute_the_right_values(run_isolated):
    """Strides far past the input are legal (one output along that axis);
    they once sized the conv plan's phase table by stride_h * stride_w
    (2**62 entries: SIGSEGV), so they run in a subprocess, which prints
    each result's largest difference from a NumPy reference."""
    rc, got, err = run_isolated("""
from mgtrace._core import nn
rng = np.random.default_rng(0)
x = rng.standard_normal((1, 16, 8, 9)).astype(np.float32)
w = rng.standard_normal((4, 16, 3, 5)).astype(np.float32)
for sh, sw in ((2 ** 31 - 1, 1), (1, 10 ** 9), (2 ** 31 - 1, 2 ** 31 - 1), (7, 2)):
    for dh, dw in ((1, 1), (2, 1)):
        rows, cols = range(0, 8 - 2 * dh, sh), range(0, 9 - 4 * dw, sw)   # window origins
        want = np.array([[np.einsum("nchw,ochw->no", x[:, :, i:i + 2 * dh + 1:dh, j:j + 4 * dw + 1:dw], w)
                          for j in cols] for i in rows]).transpose(2, 3, 0, 1)
        for algo in ("auto", "shifted", "im2col"):
            case(f"{sh},{sw},{dh},{dw},{algo}", lambda: float(np.abs(
                nn._conv2d(mt.tensor(x), mt.tensor(w), None, (sh, sw), 0, (dh, dw), 1, algo).numpy()
                - want).max()))
""")
    assert rc == 0, err[-2000:]
    assert len(got) == 24
    for name, (kind, diff) in got.items():
        assert kind == "ok" and float(diff) < 1e-4, (name, kind, diff)


def test_kernels_as_large_as_the_input_compute_the_right_values(run_isolated):
    """A 1050x1050 kernel (1.1 million taps) on a 1050x1050 input: DIRECT,
    BLOCKED and DEPTHWISE kept a table of one int64 a tap on the stack (8.8
    MB past the 8 MB stack: SIGSEGV); the table is in the workspace now. The
    one output is the sum of the products (all ones: the tap count)."""
    rc, got, err = run_isolated("""
from mgtrace._core import nn
k = 1050
x = mt.tensor(np.ones((1, 2, k, k), np.float32))
w = mt.tensor(np.ones((2, 1, k, k), np.float32))
for algo, groups in (("direct", 2), ("blocked", 2), ("depthwise", 2), ("auto", 2)):
    case(algo, lambda: nn._conv2d(x, w, None, 1, 0, 1, groups, algo).numpy().ravel().tolist())
nn.clear_weight_cache()
""", timeout=300)
    assert rc == 0, err[-2000:]
    for algo, (kind, values) in got.items():
        assert kind == "ok" and values == str([float(1050 * 1050)] * 2), (algo, kind, values)


def test_slices_with_huge_steps_and_bounds_follow_numpy():
    a = np.arange(6.0)
    t = mt.tensor(a)
    for sl in (slice(2 ** 63, None, 2 ** 63), slice(None, None, 2 ** 63), slice(None, None, -2 ** 64),
               slice(-2 ** 70, 2 ** 70, 2 ** 62 + 1), slice(1, None, 5)):
        assert t[sl].tolist() == a[sl].tolist(), sl


def test_too_large_shapes_name_the_shape():
    with pytest.raises(ValueError, match=r"shape \(4611686018427387905, 4611686018427387905\)"):
        mt.tensor([1.0]).broadcast_to((HUGE, HUGE))
    with pytest.raises(MemoryError, match=r"shape \(2147483648, 2147483648\) of float32 needs more than 2\*\*62 bytes"):
        mt.functional.zeros((2 ** 31, 2 ** 31))
