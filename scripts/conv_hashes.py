"""SHA-256 of conv/pool outputs, to prove a kernel refactor bitwise neutral.

Run once on the tree before the change and once after; the two outputs must be
identical line for line:

    PYTHONPATH=/work/main python scripts/conv_hashes.py > before.txt
    PYTHONPATH=.          python scripts/conv_hashes.py > after.txt
    diff before.txt after.txt

Covers every conv2d algorithm (the geometries below reach GEMM1X1, IM2COL,
SHIFTED, WINOGRAD, WINOGRAD4, DIRECT, BLOCKED and DEPTHWISE through the
automatic choice), conv_transpose2d, max/avg pooling, in float32 and float64,
with 1 and 2 threads; then ResNet-18 and MobileNetV2 eager and optimized
("all": the NCHWc passes where the host has AVX-512) at batch 1 and 2.
"""
import hashlib
import sys

import numpy as np

import mgtrace as mt
import mgtrace.functional as F
import mgtrace.models as models
from mgtrace.traced_module import optimize, trace_module

CONV = [  # (n, c, h, w, o, k, stride, pad, dilation, groups)
    (1, 3, 32, 32, 16, 3, 1, 1, 1, 1),
    (2, 16, 28, 28, 32, 3, 1, 1, 1, 1),      # Winograd
    (1, 64, 56, 56, 64, 3, 1, 1, 1, 1),      # Winograd4
    (2, 32, 14, 14, 32, 3, 2, 1, 1, 1),
    (1, 24, 40, 40, 48, 1, 1, 0, 1, 1),      # 1x1
    (1, 24, 20, 20, 48, 1, 2, 0, 1, 1),      # strided 1x1
    (2, 32, 17, 17, 32, 3, 1, 1, 1, 32),     # depthwise
    (1, 16, 19, 19, 16, 3, 2, 1, 1, 16),     # depthwise strided
    (1, 3, 64, 64, 16, 7, 2, 3, 1, 1),       # stem: direct
    (1, 32, 40, 40, 32, 5, 1, 2, 1, 1),      # shifted
    (1, 16, 24, 24, 16, 3, 1, 2, 2, 1),      # dilated
    (1, 32, 9, 9, 64, 3, 1, 1, 1, 4),        # grouped
    (2, 512, 7, 7, 512, 1, 1, 0, 1, 1),      # blocked candidate
    (1, 256, 14, 14, 256, 3, 2, 1, 1, 1),
    (2, 64, 14, 14, 64, 3, 1, 1, 1, 1),      # Winograd F(2x2)
]
TRANSPOSE = [  # (n, c, h, w, o, k, stride, pad, output_padding, dilation, groups)
    (1, 8, 7, 7, 4, 3, 2, 1, 1, 1, 1),
    (2, 6, 5, 6, 6, 4, 2, 1, 0, 1, 2),
    (1, 4, 9, 9, 3, 3, 1, 0, 0, 2, 1),
]
POOL = [(2, 8, 17, 17, 3, 2, 1), (1, 4, 12, 12, 2, 2, 0), (1, 3, 9, 11, 3, 1, 1)]


def digest(t):
    a = np.ascontiguousarray(t.numpy())
    return hashlib.sha256(a.tobytes()).hexdigest()[:16] + f" {a.dtype} {a.shape}"


def out(label, t):
    print(f"{label}: {digest(t)}")


def main():
    from mgtrace._core.nn import conv2d_algorithm
    for (n, c, h, w, o, k, s, p, d, g) in CONV:
        for batch in (n, 8):
            print((batch, c, h, w, o, k, s, p, d, g), [
                conv2d_algorithm((batch, c, h, w), (o, c // g, k, k), s, p, d, g, cached=cached)
                for cached in (False, True)])
    rng = np.random.default_rng(0)
    for threads in (1, 2):
        mt.set_num_threads(threads)
        for dt in ("float32", "float64"):
            for i, (n, c, h, w, o, k, s, p, d, g) in enumerate(CONV):
                x = mt.tensor(rng.standard_normal((n, c, h, w)).astype(dt))
                wt = mt.tensor(rng.standard_normal((o, c // g, k, k)).astype(dt))
                b = mt.tensor(rng.standard_normal(o).astype(dt))
                out(f"t{threads} conv2d {dt} {i}", F.conv2d(x, wt, b, s, p, d, g))
                # a weight in imported memory is never cached: the algorithms' unpacked paths
                shared = mt.from_dlpack(wt.numpy().copy())
                out(f"t{threads} conv2d {dt} {i} uncached", F.conv2d(x, shared, b, s, p, d, g))
            for i, (n, c, h, w, o, k, s, p, op, d, g) in enumerate(TRANSPOSE):
                x = mt.tensor(rng.standard_normal((n, c, h, w)).astype(dt))
                wt = mt.tensor(rng.standard_normal((c, o // g, k, k)).astype(dt))
                b = mt.tensor(rng.standard_normal(o).astype(dt))
                out(f"t{threads} conv_transpose2d {dt} {i}",
                    F.conv_transpose2d(x, wt, b, s, p, op, d, g))
            for i, (n, c, h, w, k, s, p) in enumerate(POOL):
                x = mt.tensor(rng.standard_normal((n, c, h, w)).astype(dt))
                out(f"t{threads} max_pool2d {dt} {i}", F.max_pool2d(x, k, s, p))
                out(f"t{threads} avg_pool2d {dt} {i}", F.avg_pool2d(x, k, s, p))
    mt.set_num_threads(2)
    for name, make in (("resnet18", models.resnet18), ("mobilenet_v2", models.mobilenet_v2)):
        net = make()
        state = {k: rng.standard_normal(v.shape).astype(np.float32) * 0.1
                 for k, v in net.state_dict().items() if v.dtype.name == "float32"}
        for k in state:
            if "running_var" in k:
                state[k] = np.abs(state[k]) + 0.5
        net.load_state_dict({**net.state_dict(), **{k: mt.tensor(v) for k, v in state.items()}})
        net.eval()
        for batch in (1, 2):
            x = mt.tensor(rng.standard_normal((batch, 3, 224, 224)).astype(np.float32))
            out(f"{name} b{batch} eager", net(x))
            tm = trace_module(net, x)
            out(f"{name} b{batch} optimized", optimize(tm, "all")(x))


if __name__ == "__main__":
    sys.exit(main())
