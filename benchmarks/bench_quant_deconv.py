"""Quantized transposed convolution (issue 32): mgtrace's int8
ConvTranspose2d, which computes its integer accumulator with the float64
transposed convolution and requantizes (no int8 kernel), beside mgtrace's
float32 ConvTranspose2d and, when a Python with megengine==1.13 is given,
MegEngine's own float and quantized ones (each library in its own process,
the same threads).

    python benchmarks/bench_quant_deconv.py [--megengine PYTHON] [--threads 2]

A 4x4 stride-2 up-sampling layer, 64 -> 32 channels, 1 x 64 x 56 x 56 input,
no bias (MegEngine's quantized transposed convolution takes none),
min-max calibrated qint8; QuantStub and DequantStub included. Prints the
best and median of 15 calls (ms) after one warm-up call.
"""
import argparse
import os
import subprocess
import sys

from _timing import best_and_median_ms

HERE = os.path.dirname(os.path.abspath(__file__))


def _input():
    import numpy as np
    return np.random.default_rng(0).standard_normal((1, 64, 56, 56)).astype(np.float32)


def run_mgtrace():
    import _checkout
    _checkout.use()
    import mgtrace as mt
    import mgtrace.module as M
    import mgtrace.quantization as Q
    mt.random.seed(0)
    x = mt.tensor(_input())
    net = M.Sequential(M.ConvTranspose2d(64, 32, 4, stride=2, padding=1, bias=False)).eval()
    print("mgtrace float32    best %.2f ms, median %.2f ms" % best_and_median_ms(lambda: net(x), 15))
    q = Q.quantize_layers(net, lambda m: m(x), types=(M.ConvTranspose2d,),
                          qconfig=Q.min_max_fakequant_qconfig)
    print("mgtrace int8       best %.2f ms, median %.2f ms" % best_and_median_ms(lambda: q(x), 15))


def run_megengine():
    import megengine as mge
    import megengine.module as M
    from megengine.quantization import (disable_fake_quant, disable_observer,
                                        enable_fake_quant, enable_observer,
                                        min_max_fakequant_qconfig, quantize, quantize_qat)

    class Net(M.Module):
        def __init__(self):
            super().__init__()
            self.quant, self.dequant = M.QuantStub(), M.DequantStub()
            self.ct = M.ConvTranspose2d(64, 32, 4, stride=2, padding=1, bias=False)

        def forward(self, x):
            return self.dequant(self.ct(self.quant(x)))
    net = Net()
    net.eval()
    x = mge.tensor(_input())
    print("megengine float32  best %.2f ms, median %.2f ms" % best_and_median_ms(lambda: net.ct(x).numpy(), 15))
    qat = quantize_qat(net, qconfig=min_max_fakequant_qconfig)
    enable_observer(qat)
    disable_fake_quant(qat)
    qat(x)
    disable_observer(qat)
    enable_fake_quant(qat)
    q = quantize(qat)
    q.eval()
    print("megengine int8     best %.2f ms, median %.2f ms" % best_and_median_ms(lambda: q(x).numpy(), 15))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--megengine", help="a Python with megengine==1.13")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--child", choices=["mgtrace", "megengine"], help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        (run_mgtrace if args.child == "mgtrace" else run_megengine)()
        return
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads),
               MGTRACE_NUM_THREADS=str(args.threads))
    runs = [(sys.executable, "mgtrace")] + ([(args.megengine, "megengine")] if args.megengine
                                            else [])
    for python, lib in runs:
        out = subprocess.run([python, os.path.abspath(__file__), "--child", lib], env=env,
                             cwd=HERE, capture_output=True, text=True)
        lines = [ln for ln in out.stdout.splitlines() if ln.startswith(lib)]
        print("\n".join(lines) if lines else f"{lib}: failed\n{out.stderr[-2000:]}")


if __name__ == "__main__":
    main()
