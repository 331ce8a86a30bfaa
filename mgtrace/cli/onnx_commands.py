"""``mgtrace export`` (archives to ONNX, a batch job) and ``mgtrace import``
(an ONNX model to an archive).

export runs on the batch engine (:mod:`mgtrace.cli.batch`): a report,
resume by content, keep going past bad files, ``-j``/``--dask``. Each ONNX
file is checked before it is written (``onnx.checker`` full check, strict
shape inference, and, with onnxruntime installed and examples stored in
the archive, one ONNX Runtime run against the stored example outputs); a
file that fails is not written and an existing output is left as it was.
"""
import os

__all__ = ["add_parsers", "export_file", "export", "import_file", "cmd_import"]


def _onnx_dest(path, out, in_place, roots):
    from mgtrace.cli import tasks
    dest = tasks.destination(path, out, in_place, roots)
    return os.path.splitext(dest)[0] + ".onnx"


def export_file(path, out=None, in_place=False, roots=(), opset=None, rtol=1e-5, atol=1e-6,
                contrib_ops=False, quant_format="qdq"):
    """Export the TracedModule archived at ``path`` to ONNX (see the module
    docstring for the checks); a JSON-ready result dict."""
    from mgtrace.cli import tasks
    from mgtrace.onnx import ExportError
    from mgtrace.onnx.exporter import build_model, run_ort
    from mgtrace.serialization import load_archive
    from mgtrace.serialization.atomic import replacing
    from mgtrace.traced_module import TracedModule
    dest = _onnx_dest(path, out, in_place, roots)
    arc = load_archive(path)
    if not isinstance(arc.obj, TracedModule):
        return {"status": "skipped", "reason": f"holds {type(arc.obj).__name__}, not a traced "
                                               "module: nothing to export"}
    if arc.example_kwargs:
        return {"status": "failed", "reason": "its examples pass keyword arguments; ONNX inputs "
                                              "are positional"}
    try:
        model = build_model(arc.obj, opset=opset, contrib_ops=bool(contrib_ops),
                            quant_format=quant_format)
    except ExportError as e:
        return {"status": "failed", "reason": f"ExportError: {e}"}
    err = None
    if arc.example_inputs is not None and arc.example_outputs is not None:
        try:
            import onnxruntime  # noqa: F401
        except ImportError:
            onnxruntime = None
        if onnxruntime is not None:
            import numpy as np
            xs = arc.example_inputs if isinstance(arc.example_inputs, tuple) else \
                (arc.example_inputs,)
            try:
                got = run_ort(model, [np.asarray(x.numpy()) for x in xs])
            except Exception as e:        # onnxruntime's own error classes
                return {"status": "failed", "reason": f"ONNX Runtime cannot run it: {e}"}
            from mgtrace import tensor
            from mgtrace.onnx.exporter import output_quantum
            got = [tensor(g) for g in got]
            # a dequantized output: ORT may round one value a quantum apart
            quantum = output_quantum(model)
            ok, err, reason = tasks.compare_outputs(
                tuple(got) if len(got) > 1 else got[0], arc.example_outputs, rtol,
                max(atol, quantum * (1 + 1e-5)))
            if not ok:
                return {"status": "failed", "reason": "ONNX Runtime does not reproduce the "
                                                      f"stored outputs: {reason}"}
    os.makedirs(os.path.dirname(os.path.abspath(dest)), exist_ok=True)
    with replacing(dest) as (f, _):
        f.write(model.SerializeToString())
    return {"status": "ok", "reason": "", "output": dest, "opset": model.opset_import[0].version,
            "max_abs_error": err}


def export(paths, *, out=None, in_place=False, opset=None, rtol=1e-5, atol=1e-6,
           contrib_ops=False, quant_format="qdq", **run_options):
    """Export every archive of ``paths`` to ONNX into folder ``out`` (the
    layout below each input folder kept, ``.tmod`` -> ``.onnx``) or, with
    ``in_place``, beside each archive; ``contrib_ops`` and ``quant_format`` as
    :func:`mgtrace.onnx.export`'s. ``run_options`` are those of
    :func:`mgtrace.cli.batch.run`.

    Raises:
        ValueError: neither or both of out / in_place, two archives that
            would be written to one file, an opset outside the supported
            range; see also :func:`mgtrace.cli.batch.run`.
        ImportError: the onnx package is missing.
    """
    from mgtrace.cli import batch
    from mgtrace.onnx.exporter import _pick_opset
    if opset is not None:
        _pick_opset(opset)
    if bool(out) == bool(in_place):
        raise ValueError("give an output folder (-o OUT) or --in-place (beside each archive)")
    roots = batch._roots(paths)
    seen = {}
    for f in batch.collect(paths, run_options.get("pattern", "*.tmod"), exclude=out):
        dest = os.path.realpath(_onnx_dest(f, out, in_place, roots))
        if dest in seen:
            raise ValueError(f"{seen[dest]} and {f} would both be written to {dest}")
        seen[dest] = f
    if out:
        batch._check_writable(out, f"-o {out}")
    options = {"out": os.fspath(out) if out else None, "in_place": bool(in_place),
               "roots": roots, "opset": opset, "rtol": rtol, "atol": atol}
    if contrib_ops:         # (absent otherwise: earlier reports resume as before)
        options["contrib_ops"] = True
    if quant_format != "qdq":
        options["quant_format"] = quant_format
    return batch.run(export_file, paths, options=options, command="export",
                     exclude=options["out"], **run_options)


def import_file(src, dest, rtol=1e-5, atol=1e-6):
    """Import ONNX model ``src`` and save it as archive ``dest`` with the
    inputs it was traced at and its outputs as examples; the archive is
    reloaded and must reproduce them before it replaces ``dest``."""
    from mgtrace.cli import tasks
    from mgtrace.onnx.importer import load_traced
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tm, examples = load_traced(src)
    want = tm(*examples)
    err, reason = tasks._write_checked(tm, dest, {"source": os.path.basename(src)},
                                       tuple(examples), want, rtol, atol)
    if reason:
        return {"status": "failed", "reason": reason}
    return {"status": "ok", "reason": "", "output": dest, "max_abs_error": err}


def cmd_import(args, out):
    """``mgtrace import MODEL.onnx -o MODEL.tmod``."""
    if os.path.isdir(args.out):
        args.out = os.path.join(args.out, os.path.splitext(os.path.basename(args.model))[0]
                                + ".tmod")
    if not os.path.isfile(args.model):
        raise FileNotFoundError(f"{args.model}: no such file")
    res = import_file(args.model, args.out, args.rtol, args.atol)
    if res["status"] != "ok":
        out.write(f"FAILED  {args.model}: {res['reason']}\n")
        return 1
    out.write(f"ok  {args.model} -> {res['output']}\n")
    return 0


def add_parsers(sub, batch_options, formatter, wrap, exit_text):
    """Add the ``export`` and ``import`` commands to the parser ``sub``."""
    s = sub.add_parser(
        "export", help="export archived traced modules to ONNX", formatter_class=formatter,
        epilog="examples:\n  mgtrace export models/ -o onnx/ --format onnx -j 4\n"
               "  mgtrace export m.tmod -o out/ --format onnx --opset 13 --report r.json\n\n"
               + exit_text,
        description=wrap("Load each archive, export its traced module to ONNX, check the model "
                         "(onnx.checker full check, shape inference, and one ONNX Runtime run "
                         "against the archive's stored example outputs when onnxruntime is "
                         "installed) and only then write it (.tmod -> .onnx). Needs "
                         "pip install 'mgtrace[onnx]'."))
    batch_options(s, "export")
    s.add_argument("--format", required=True, choices=["onnx"], help="the output format")
    s.add_argument("--opset", type=int, metavar="N",
                   help="the ONNX opset (default: the newest the installed onnx and "
                        "onnxruntime both support; 13 at least)")
    s.add_argument("--contrib-ops", action="store_true",
                   help="use ONNX Runtime's com.microsoft fused ops where it has them "
                        "(FusedConv, SkipLayerNormalization, Gelu): faster in ONNX Runtime, "
                        "refused by other runtimes")
    s.add_argument("--quant-format", choices=["qdq", "qoperator"], default="qdq",
                   help="quantized models: QuantizeLinear/DequantizeLinear around float ops "
                        "(qdq, the default) or QLinearConv on the integers (qoperator)")
    s = sub.add_parser(
        "import", help="import an ONNX model as an archive", formatter_class=formatter,
        description=wrap("Read an ONNX model (mgtrace.onnx.load), trace it into a TracedModule "
                         "and save it as a .tmod archive with its example inputs and outputs; "
                         "the archive is reloaded and checked before it is written."))
    s.add_argument("model", metavar="MODEL.onnx", help="the ONNX model file")
    s.add_argument("-o", "--out", required=True, metavar="FILE.tmod",
                   help="the archive to write (a folder: MODEL.tmod inside it)")
    s.add_argument("--rtol", type=float, default=1e-5, metavar="R",
                   help="tolerance of the reload check (default: 1e-5)")
    s.add_argument("--atol", type=float, default=1e-6, metavar="A",
                   help="absolute tolerance of the reload check (default: 1e-6)")
