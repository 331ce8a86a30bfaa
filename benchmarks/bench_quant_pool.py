"""Int8 average pooling and concat on the integers (issue 32): mgtrace's
quantized F.avg_pool2d / F.adaptive_avg_pool2d (qpool.c) beside mgtrace's
float32 pools of the same shapes, and the quantized Concat's C pass
(qelemwise.c) beside the dequantize / concat / quantize passes it replaced,
one process, the same threads.

    python benchmarks/bench_quant_pool.py [--threads 1]

Rows: ResNet-18's global pool (8 x 512 x 7 x 7 -> 1 x 1), MobileNetV2's
(8 x 1280 x 7 x 7), a 3x3 stride-2 padded average pool of 8 x 64 x 56 x 56,
and a concat of two quint8 8 x 64 x 28 x 28 tensors of different qparams
along the channels. Prints the best and median of 25 calls (ms) after one
warm-up call.
"""
import argparse
import os
import sys

from _timing import best_and_median_ms

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    import numpy as np
    import mgtrace as mt
    import mgtrace.functional as F
    import mgtrace.module.quantized as MQ
    from mgtrace.quantization.qtensor import dequantize, quantize
    from mgtrace.quantization.utils import QuantMode, create_qparams, quant_dtype
    mt.set_num_threads(args.threads)

    def qp(scale, zp):
        return create_qparams(QuantMode.ASYMMERTIC, quant_dtype("quint8"),
                              mt.tensor(np.float32(scale)), mt.tensor(np.float32(zp)))
    rng = np.random.default_rng(0)

    def pair(shape):
        x = mt.tensor(np.abs(rng.standard_normal(shape)).astype(np.float32))
        return x, quantize(x, qp(0.02, 3))
    rows = []
    for name, shape, call in [
        ("global pool 8x512x7x7", (8, 512, 7, 7), lambda t: F.adaptive_avg_pool2d(t, 1)),
        ("global pool 8x1280x7x7", (8, 1280, 7, 7), lambda t: F.adaptive_avg_pool2d(t, 1)),
        ("avg_pool2d 3x3 s2 p1 8x64x56x56", (8, 64, 56, 56),
         lambda t: F.avg_pool2d(t, 3, 2, 1)),
    ]:
        x, q = pair(shape)
        rows.append((name, "float32", best_and_median_ms(lambda: call(x), 25)))
        rows.append((name, "int8", best_and_median_ms(lambda: call(q), 25)))
    a = quantize(mt.tensor(rng.standard_normal((8, 64, 28, 28)).astype(np.float32)),
                 qp(0.03, 120))
    b = quantize(mt.tensor(rng.standard_normal((8, 64, 28, 28)).astype(np.float32)),
                 qp(0.05, 128))
    m = MQ.Concat(qp(0.04, 125))
    name = "Concat 2 x 8x64x28x28 quint8"
    rows.append((name, "float passes", best_and_median_ms(lambda: quantize(
        F.concat([dequantize(a), dequantize(b)], 1), m.act_qparams), 25)))
    rows.append((name, "int8 C pass", best_and_median_ms(lambda: m([a, b], 1), 25)))
    print(f"threads {args.threads}; ms, best / median of 25")
    for name, what, (best, med) in rows:
        print(f"{name:34s} {what:13s} {best:8.3f} {med:8.3f}")


if __name__ == "__main__":
    main()
