"""Hostile sizes for the nn ops, drawn by hypothesis: conv2d, conv1d,
conv_transpose2d, max_pool2d, avg_pool2d, interpolate and pad called with
huge, negative and zero kernel sizes, strides, padding, dilation, groups,
output sizes and scale factors. Every call must return a tensor or raise a
clean exception (ValueError, TypeError, OverflowError, MemoryError), never
crash the process or raise anything else; messages must name the argument
(never Cython's bare "Python int too large to convert to C long").

Run in a subprocess by tests/functional/test_hostile_sizes.py (a crash there
kills that process, not pytest), under an address-space limit so that a
legal but huge output fails its allocation instead of filling the machine.
Longer runs by hand::

    PYTHONPATH=. python tests/functional/fuzz_sizes.py 5000

prints ``examples N clean C returned R`` and exits 0, or exits 1 naming the
call that raised something else.
"""
import resource
import sys

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import mgtrace as mt
import mgtrace.functional as F

CLEAN = (ValueError, TypeError, OverflowError, MemoryError)
# sizes around every boundary the core has: 0, 1, 2**31 - 1 (MAX_GEOMETRY),
# 2**62 (the element limit), int64 and uint64 edges, and their negatives
EDGES = [0, 1, 2, 3, 7, 2 ** 31 - 1, 2 ** 31, 2 ** 32 + 1, 2 ** 62 + 1, 2 ** 63 - 1, 2 ** 63,
         2 ** 64, 10 ** 30]
ints = st.one_of(st.integers(-3, 9), st.sampled_from(EDGES + [-v for v in EDGES]))
geom = st.one_of(ints, st.tuples(ints, ints), st.just(True), st.just(2.5))
floats = st.sampled_from([0.0, -1.0, 0.5, 1.0, 3.0, 1e-300, 1e300, float("inf"), float("nan"),
                          2.0 ** 31, 2.0 ** 62])

X4 = mt.tensor(np.ones((1, 2, 5, 5), np.float32))
W4 = mt.tensor(np.ones((4, 2, 3, 3), np.float32))
WT = mt.tensor(np.ones((2, 4, 3, 3), np.float32))
X3 = mt.tensor(np.ones((1, 2, 9), np.float32))
W3 = mt.tensor(np.ones((4, 2, 3), np.float32))

OPS = {
    "conv2d": lambda a: F.conv2d(X4, W4, stride=a[0], padding=a[1], dilation=a[2], groups=a[3]),
    "conv1d": lambda a: F.conv1d(X3, W3, stride=a[0], padding=a[1], dilation=a[2], groups=a[3]),
    "conv_transpose2d": lambda a: F.conv_transpose2d(X4, WT, stride=a[0], padding=a[1],
                                                     output_padding=a[2], dilation=a[3]),
    "max_pool2d": lambda a: F.max_pool2d(X4, a[0], stride=a[1], padding=a[2], dilation=a[3]),
    "max_pool2d_ceil": lambda a: F.max_pool2d(X4, a[0], stride=a[1], padding=a[2], ceil_mode=True,
                                              return_indices=True),
    "avg_pool2d": lambda a: F.avg_pool2d(X4, a[0], stride=a[1], padding=a[2], ceil_mode=True),
    "interpolate_size": lambda a: F.interpolate(X4, size=a[0], mode="bilinear"),
    "pad": lambda a: F.pad(X4, a[0], mode=("constant", "reflect", "replicate", "circular")[a[3] % 4]
                           if isinstance(a[3], int) else "constant"),
    "pad_pairs": lambda a: F.pad(X3, ((0, 0), (a[0], a[1]), (a[2], 0))),
}
counts = {"examples": 0, "clean": 0, "returned": 0}


def call(name, args):
    counts["examples"] += 1
    try:
        OPS[name](args)
    except CLEAN as e:
        if "convert to C" in str(e):
            raise AssertionError(f"{name}{args}: unnamed conversion error {e!r}") from e
        counts["clean"] += 1
    except BaseException as e:
        raise AssertionError(f"{name}{args} raised {type(e).__name__}: {e}") from e
    else:
        counts["returned"] += 1


def run(n):
    # a legal but huge output must fail to allocate, not page the machine in
    resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))
    cfg = settings(max_examples=n, derandomize=True, deadline=None, database=None,
                   suppress_health_check=list(HealthCheck))

    @cfg
    @given(st.sampled_from(sorted(OPS)), st.tuples(geom, geom, geom, geom))
    def sizes(name, args):
        call(name, args)

    @cfg
    @given(st.one_of(floats, st.tuples(floats, floats)), st.sampled_from(["nearest", "bilinear"]))
    def scales(factor, mode):
        counts["examples"] += 1
        try:
            F.interpolate(X4, scale_factor=factor, mode=mode)
        except CLEAN:
            counts["clean"] += 1
        else:
            counts["returned"] += 1

    sizes()
    scales()
    print(" ".join(f"{k} {v}" for k, v in counts.items()))


if __name__ == "__main__":
    run(int(sys.argv[1]) if len(sys.argv) > 1 else 300)
