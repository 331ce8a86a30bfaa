"""Huge, negative and zero sizes given to mgtrace.functional (issue 11):
each raises a clean exception naming the argument and the value, never
crashes the process (F.conv1d with stride 2**62 + 1 once did: SIGSEGV), and
never wraps into a wrong result (F.arange(2**63) once came out empty)."""
import os
import re
import subprocess
import sys

import numpy as np
import pytest

import mgtrace as mt
import mgtrace.functional as F

HUGE = 2 ** 62 + 1
# (call, exception, message); run in-process and, all together, in a subprocess
CASES = [
    ("F.conv1d(X3, W3, stride=HUGE)", ValueError,
     r"conv1d: stride must be at most 2147483647 \(2\*\*31 - 1\), got 4611686018427387905"),
    ("F.conv2d(X4, W4, stride=HUGE)", ValueError, r"conv2d: stride must be at most 2147483647 \(2\*\*31 - 1\), got 4611686018427387905"),
    ("F.conv2d(X4, W4, padding=(0, 2 ** 63))", ValueError, r"conv2d: padding must be at most 2147483647 \(2\*\*31 - 1\)"),
    ("F.conv2d(X4, W4, dilation=-1)", ValueError, r"conv2d: dilation must be >= 1, got -1"),
    ("F.conv2d(X4, W4, groups=2 ** 64)", ValueError, r"conv2d: groups must be at most 2147483647 \(2\*\*31 - 1\)"),
    ("F.conv1d(X3, W3, padding=10 ** 12)", ValueError, r"conv1d: padding must be at most 2147483647 \(2\*\*31 - 1\), got 1000000000000"),
    ("F.conv_transpose2d(X4, WT, stride=HUGE)", ValueError, r"conv_transpose2d: stride must be at most 2147483647 \(2\*\*31 - 1\)"),
    ("F.conv_transpose2d(X4, WT, stride=2 ** 31 - 1, dilation=2 ** 31 - 1)", ValueError,
     r"conv_transpose2d: stride .* give an output of shape .* more elements than a tensor can hold"),
    ("F.max_pool2d(X4, 2 ** 63 - 1)", ValueError, r"max_pool2d: kernel_size must be at most 2147483647 \(2\*\*31 - 1\)"),
    ("F.max_pool2d(X4, 2, stride=HUGE, return_indices=True)", ValueError, r"max_pool2d: stride must be at most "),
    ("F.avg_pool2d(X4, 3, padding=-1)", ValueError, r"avg_pool2d: padding must be >= 0, got -1"),
    ("F.adaptive_avg_pool2d(X4, 2 ** 40)", ValueError, r"adaptive_avg_pool2d: oshp must be at most 2147483647 \(2\*\*31 - 1\)"),
    ("F.interpolate(X4, size=(1, HUGE))", ValueError, r"interpolate: size must be at most 2147483647 \(2\*\*31 - 1\)"),
    ("F.interpolate(X4, scale_factor=2.0 ** 40)", ValueError, r"interpolate: scale_factor .* above 2147483647"),
    ("F.pad(X4, HUGE)", ValueError, r"pad: pad_width 4611686018427387905 give an output of shape"),
    ("F.zeros((HUGE, HUGE))", ValueError, r"zeros: shape gives a result of shape \(4611686018427387905, 4611686018427387905\)"),
    ("F.full((2 ** 40, 2 ** 40), 1.0)", ValueError, r"full: shape gives a result of shape"),
    ("F.tile(X3, (2 ** 40, 2 ** 40))", ValueError, r"tile: reps=\(1, 1099511627776, 1099511627776\) gives a result"),
    ("F.repeat(X3, HUGE)", ValueError, r"repeat: repeats=4611686018427387905 gives a result of shape \(110680464442257309720,\)"),
    ("F.arange(2 ** 63)", ValueError, r"arange: arange\(0, 9223372036854775808, 1\) gives a result of shape \(9223372036854775808,\)"),
    ("F.arange(0, 2 ** 40, dtype='int32')", OverflowError, r"arange: values from 0 to 1099511627775 do not fit int32"),
    ("F.arange(0, 1.0, float('nan'))", ValueError, r"arange: .* has no finite length"),
    ("F.linspace(0, 1, 2 ** 63)", ValueError, r"linspace: num gives a result of shape \(9223372036854775808,\)"),
    ("F.eye(2 ** 63)", ValueError, r"eye: N, M gives a result of shape \(9223372036854775808, 9223372036854775808\)"),
    ("F.one_hot(mt.tensor([0, 1]), 2 ** 63)", ValueError, r"one_hot: num_classes must be at most 2147483647 \(2\*\*31 - 1\)"),
    ("F.topk(mt.tensor([1.0, 2.0]), 2 ** 63)", ValueError, r"topk: k=9223372036854775808 is larger than the 2 elements"),
    ("F.split(mt.tensor([1.0, 2.0]), 2 ** 63)", ValueError, r"split: .* does not divide into nsplits_or_sections=9223372036854775808"),
    ("mt.random.normal(size=(HUGE, HUGE))", ValueError, r"normal: size gives a result of shape \(4611686018427387905, 4611686018427387905\)"),
]
CRASHED = {"F.conv1d(X3, W3, stride=HUGE)"}   # before the fix: only in the subprocess


def _namespace():
    return {"F": F, "mt": mt, "HUGE": HUGE,
            "X4": mt.tensor(np.ones((1, 3, 8, 8), np.float32)),
            "W4": mt.tensor(np.ones((4, 3, 3, 3), np.float32)),
            "WT": mt.tensor(np.ones((3, 4, 3, 3), np.float32)),
            "X3": mt.tensor(np.ones((1, 3, 8), np.float32)),
            "W3": mt.tensor(np.ones((4, 3, 3), np.float32))}


@pytest.mark.parametrize("call, exc, match", [c for c in CASES if c[0] not in CRASHED],
                         ids=[c for c, _, _ in CASES if c not in CRASHED])
def test_bad_sizes_raise_naming_the_argument(call, exc, match):
    with pytest.raises(exc, match=match):
        eval(call, _namespace())                           # noqa: S307  (our own table)


def test_bad_sizes_never_crash_the_process(run_isolated):
    src = ["HUGE = 2 ** 62 + 1",
           "X4 = mt.tensor(np.ones((1, 3, 8, 8), np.float32))",
           "W4 = mt.tensor(np.ones((4, 3, 3, 3), np.float32))",
           "WT = mt.tensor(np.ones((3, 4, 3, 3), np.float32))",
           "X3 = mt.tensor(np.ones((1, 3, 8), np.float32))",
           "W3 = mt.tensor(np.ones((4, 3, 3), np.float32))"]
    src += [f"case({call!r}, lambda: {call})" for call, _, _ in CASES]
    rc, got, err = run_isolated("\n".join(src))
    assert rc == 0, err[-2000:]
    for call, exc, match in CASES:
        kind, msg = got[call]
        assert kind == exc.__name__ and re.search(match, msg), (call, kind, msg)


def test_randomized_hostile_sizes_raise_only_clean_exceptions():
    """fuzz_sizes.py (hypothesis, fixed seed) in a subprocess: conv2d, conv1d,
    conv_transpose2d, the pools, interpolate and pad with huge, negative and
    zero sizes return or raise ValueError/TypeError/OverflowError/MemoryError."""
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(os.path.dirname(os.path.abspath(mt.__file__)))
    env = dict(os.environ, PYTHONPATH=root)
    p = subprocess.run([sys.executable, os.path.join(here, "fuzz_sizes.py"), "150"], env=env,
                       cwd=root, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    counts = dict(zip(*[iter(p.stdout.split())] * 2))
    assert int(counts["examples"]) >= 150 and int(counts["clean"]) > 0 and int(counts["returned"]) > 0


def test_values_that_fit_keep_working():
    """The bounds do not cut legal calls: the largest geometry runs, counts
    are exact where NumPy's int64 arithmetic would wrap, and one_hot builds
    its classes in int64 (an int8 x with 300 classes once matched class
    k + 256 as well as k)."""
    x = mt.tensor(np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4))
    assert F.max_pool2d(x, 2, stride=2 ** 31 - 1).tolist() == [[[[5.0]]]]
    assert F.avg_pool2d(x, 2, stride=(1, 2 ** 31 - 1)).tolist() == [[[[2.5], [6.5], [10.5]]]]
    assert F.conv1d(mt.tensor([[[1.0, 2.0, 3.0, 4.0]]]), mt.tensor([[[1.0, 1.0]]]),
                    stride=2 ** 31 - 1).tolist() == [[[3.0]]]
    assert F.arange(2 ** 62, 2 ** 62 + 3, dtype="int64").tolist() == [2 ** 62, 2 ** 62 + 1, 2 ** 62 + 2]
    assert F.arange(10, 0, -3).tolist() == np.arange(10, 0, -3).tolist()
    assert F.arange(250, 256, dtype="uint8").tolist() == list(range(250, 256))
    hot = F.one_hot(mt.tensor([1, 0], dtype="int8"), 300).numpy()
    assert hot.dtype == np.int8 and hot.shape == (2, 300)
    np.testing.assert_array_equal(hot, np.eye(300, dtype=np.int8)[[1, 0]])
    assert F.pad(mt.tensor([1, 2]), np.array([[np.uint64(1), np.uint64(2)]])).tolist() == [0, 1, 2, 0, 0]
