"""Issue 36's dedicated kernels against what they replace, side by side:
conv3d (kernels/cpu/conv3d.c) against its composition of conv2d per depth
tap (mgtrace._core.fallbacks.conv3d, what F.conv3d ran before), the same
for conv_transpose3d (the op's choice, col2vol forced, conv_transpose2d per
depth tap), and an
LSTM / RNN forward with the fused step (kernels/cpu/rnn_cell.c) against the
same module stepping through the core-op composition
(mgtrace._core.fallbacks.lstm_cell / rnn_cell), and instance_norm on
layer_norm's C rows and local_response_norm's C pass (kernels/cpu/lrn.c)
against the compositions they ran before;
PyTorch beside them where importable.

    python benchmarks/bench_conv3d_rnn.py              # one thread
    python benchmarks/bench_conv3d_rnn.py --threads 2 --repeats 20

Each line: best and median of the repeats (one call each), in ms of the
process's CPU time (time.process_time: all its threads), which a loaded
machine does not inflate as it does wall clock; --wall times wall clock
instead. The three take turns per repeat, so load drifts hit them alike.
Not a test: nothing is asserted here.
"""
import argparse
import statistics
import time

import numpy as np

import _checkout

_checkout.use()     # this checkout if it is built in place, else the installed mgtrace
import mgtrace._core  # noqa: E402,F401  (loads OpenBLAS first)
import mgtrace.module as M  # noqa: E402
from mgtrace._core import fallbacks, nn  # noqa: E402
from mgtrace._core.dispatch import set_num_threads  # noqa: E402
from mgtrace._core.tensor import tensor  # noqa: E402
from mgtrace.module import rnn as _rnn  # noqa: E402

try:
    import torch
except ImportError:
    torch = None

# (N, C, D, H, W, O, K, stride, padding): a C3D-like block and a small 3-d net's layers
CONV3D = [(1, 64, 16, 28, 28, 64, 3, 1, 1), (2, 32, 8, 32, 32, 64, 3, 2, 1),
          (4, 16, 16, 16, 16, 16, 3, 1, 1)]
# (T, N, I, H, layers)
RECURRENT = [(32, 8, 128, 256, 2), (64, 1, 64, 64, 1)]


CLOCK = time.process_time


def _time(fns, repeats):
    """{name: [ms per call]}; the functions take turns."""
    times = {k: [] for k in fns}
    for k, f in fns.items():
        f()                                   # warm up
    for _ in range(repeats):
        for k, f in fns.items():
            t = CLOCK()
            f()
            times[k].append((CLOCK() - t) * 1e3)
    return times


def _report(title, times):
    print(title)
    for k, v in times.items():
        print(f"    {k:<28} best {min(v):9.2f} ms   median {statistics.median(v):9.2f} ms")


def bench_conv3d(repeats):
    rng = np.random.default_rng(0)
    for n, c, d, h, w, o, k, s, p in CONV3D:
        x = rng.standard_normal((n, c, d, h, w)).astype(np.float32)
        wt = rng.standard_normal((o, c, k, k, k)).astype(np.float32)
        tx, tw = tensor(x), tensor(wt)
        fns = {"mgtrace conv3d op": lambda: nn.conv3d(tx, tw, None, s, p),
               "mgtrace conv2d per tap (old)": lambda: fallbacks.conv3d(tx, tw, None, s, p, 1, 1)}
        if torch is not None:
            px, pw = torch.from_numpy(x), torch.from_numpy(wt)
            fns["torch conv3d"] = lambda: torch.nn.functional.conv3d(px, pw, None, s, p)
        _report(f"conv3d x {(n, c, d, h, w)} weight {(o, c, k, k, k)} stride {s} padding {p}",
                _time(fns, repeats))


def bench_conv_transpose3d(repeats):
    rng = np.random.default_rng(3)
    for n, c, d, h, w, o, k, s, p in CONV3D:
        x = rng.standard_normal((n, c, d, h, w)).astype(np.float32)
        wt = rng.standard_normal((c, o, k, k, k)).astype(np.float32)
        tx, tw, op = tensor(x), tensor(wt), s - 1

        def col2vol():
            nn._conv3d_force_kernel(True)
            try:
                nn.conv_transpose3d(tx, tw, None, s, p, op)
            finally:
                nn._conv3d_force_kernel(False)

        fns = {"mgtrace conv_transpose3d op": lambda: nn.conv_transpose3d(tx, tw, None, s, p, op),
               "mgtrace col2vol kernel": col2vol,
               "mgtrace per depth tap": lambda: fallbacks.conv_transpose3d(tx, tw, None, s, p, op, 1, 1)}
        if torch is not None:
            px, pw = torch.from_numpy(x), torch.from_numpy(wt)
            fns["torch conv_transpose3d"] = lambda: torch.nn.functional.conv_transpose3d(
                px, pw, None, s, p, op)
        _report(f"conv_transpose3d x {(n, c, d, h, w)} weight {(c, o, k, k, k)} stride {s} "
                f"padding {p}", _time(fns, repeats))


class _Composed:
    """The module's step helpers switched to the core-op composition."""

    def __enter__(self):
        self.saved = _rnn._nn
        comp = type("composed", (), {"lstm_cell": staticmethod(fallbacks.lstm_cell),
                                     "rnn_cell": staticmethod(fallbacks.rnn_cell)})
        _rnn._nn = comp

    def __exit__(self, *exc):
        _rnn._nn = self.saved


def bench_recurrent(repeats):
    rng = np.random.default_rng(1)
    for kind in ("LSTM", "RNN"):
        for t, n, i, h, layers in RECURRENT:
            m = getattr(M, kind)(i, h, num_layers=layers)
            x = rng.standard_normal((t, n, i)).astype(np.float32)
            tx = tensor(x)

            def composed():
                with _Composed():
                    m(tx)

            fns = {f"mgtrace {kind} fused step": lambda: m(tx), f"mgtrace {kind} composed (old)": composed}
            if torch is not None:
                ref = getattr(torch.nn, kind)(i, h, num_layers=layers)
                px = torch.from_numpy(x)

                def run_torch():
                    with torch.no_grad():
                        ref(px)
                fns[f"torch {kind}"] = run_torch
            _report(f"{kind} T={t} N={n} I={i} H={h} layers={layers}", _time(fns, repeats))


NORMS = [(8, 64, 56, 56), (1, 256, 14, 14)]
LRN = [(1, 96, 55, 55), (1, 256, 27, 27)]          # AlexNet's two


def bench_norms(repeats):
    import mgtrace.functional as F
    from mgtrace._core import reduce as R

    def composed(x):          # what F.instance_norm ran before
        xg = x.reshape(x.shape[0], x.shape[1], -1)
        return ((xg - R.mean(xg, 2, True)) * F.rsqrt(R.var(xg, 2, True) + 1e-5)).reshape(x.shape)

    rng = np.random.default_rng(2)
    for shape in NORMS:
        x = rng.standard_normal(shape).astype(np.float32)
        tx = tensor(x)
        fns = {"mgtrace instance_norm": lambda: F.instance_norm(tx, False),
               "mgtrace composed (old)": lambda: composed(tx)}
        if torch is not None:
            px = torch.from_numpy(x)
            fns["torch instance_norm"] = lambda: torch.nn.functional.instance_norm(px)
        _report(f"instance_norm x {shape} float32", _time(fns, repeats))
    from mgtrace.functional import nn as fnn
    for shape in LRN:
        x = rng.standard_normal(shape).astype(np.float32)
        tx = tensor(x)
        fns = {"mgtrace local_response_norm": lambda: F.local_response_norm(tx, 5, 2.0, 1e-4, 0.75),
               "mgtrace composed (old)": lambda: fnn._lrn_composed(tx, 5, 2.0, 1e-4, 0.75)}
        if torch is not None:
            px = torch.from_numpy(x)       # PyTorch divides alpha by the size
            fns["torch local_response_norm"] = lambda: torch.nn.functional.local_response_norm(
                px, 5, 5e-4, 0.75, 2.0)
        _report(f"local_response_norm x {shape} float32, size 5", _time(fns, repeats))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--wall", action="store_true", help="time wall clock, not CPU time")
    a = ap.parse_args()
    global CLOCK
    CLOCK = time.perf_counter if a.wall else time.process_time
    set_num_threads(a.threads)
    if torch is not None:
        torch.set_num_threads(a.threads)
        print(f"torch {torch.__version__}, {a.threads} thread(s)")
    bench_conv3d(a.repeats)
    bench_conv_transpose3d(a.repeats)
    bench_recurrent(a.repeats)
    bench_norms(a.repeats)


if __name__ == "__main__":
    main()
