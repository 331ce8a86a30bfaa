"""One MiniLM layer's attention under a GradManager, the six-op sequence
(matmul, scale, mask add, softmax, dropout p=0, matmul) beside the core op
nn.attention (what multi_head_attention calls: its node keeps no
probabilities, the C backward recomputes them) and F.attention (its
training forward also writes the probabilities, which the C backward
reads): forward and backward CPU ms at one thread (time.process_time),
best / median of 20 after 2 untimed, the three timed in turn in one
process.

    python benchmarks/bench_attention_grad.py [--batch 8 --heads 12 --seq 128 --dim 32]
"""
import argparse
import time

import numpy as np

import _checkout


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--dim", type=int, default=32)
    p.add_argument("--repeats", type=int, default=20)
    a = p.parse_args()
    import mgtrace as mt
    import mgtrace.functional as F
    from mgtrace._core import nn as _nn
    from mgtrace.autodiff import GradManager
    mt.set_num_threads(1)
    rng = np.random.default_rng(0)
    shape = (a.batch, a.heads, a.seq, a.dim)
    q, k, v, g = (mt.tensor(rng.standard_normal(shape).astype(np.float32)) for _ in range(4))
    mask = mt.tensor(np.zeros((a.batch, 1, 1, a.seq), np.float32))
    scale = 1 / a.dim ** 0.5       # a Python float: a NumPy float64 would promote the sequence to float64

    def sequence(q, k, v, m, s):
        return F.matmul(F.dropout(F.softmax(F.matmul(q, k, transpose_b=True) * s + m, axis=-1), 0.0), v)

    gm = GradManager().attach([q, k, v])
    paths = (("six-op sequence", sequence), ("nn.attention", _nn.attention), ("F.attention", F.attention))
    times = {name: ([], []) for name, _ in paths}
    for i in range(a.repeats + 2):
        for name, f in paths:
            gm.record()
            t0 = time.process_time()
            y = f(q, k, v, mask, scale)
            t1 = time.process_time()
            gm.backward(y, g)
            t2 = time.process_time()
            q.grad = k.grad = v.grad = None
            if i >= 2:
                times[name][0].append(t1 - t0)
                times[name][1].append(t2 - t1)
    print(f"attention {shape}, mask [{a.batch}, 1, 1, {a.seq}], 1 thread, CPU ms best / median "
          f"of {a.repeats}")
    for name, (fw, bw) in times.items():
        print(f"{name:16s} forward {min(fw) * 1e3:6.2f} / {np.median(fw) * 1e3:6.2f}"
              f"   backward {min(bw) * 1e3:6.2f} / {np.median(bw) * 1e3:6.2f}")


if __name__ == "__main__":
    _checkout.use()
    main()
