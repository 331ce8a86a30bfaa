"""The ``mgtrace`` command (also ``python -m mgtrace``).

    mgtrace inspect FILE...          what is inside (header only: instant)
    mgtrace verify PATH...           checksums, schema, load, stored examples re-run
    mgtrace diff A B                 what changed between two archives
    mgtrace upgrade PATH... -o OUT   rewrite in the current format (or --in-place)
    mgtrace retrace PATH... -o OUT   trace again with this library (or --in-place)
    mgtrace doctor                   versions, build options, supported formats

Exit status: 0 all good, 1 some file failed, 2 usage error (bad option, no
such path), 130 interrupted.
"""
import argparse
import json
import os
import sys

__all__ = ["main", "main_exit", "doctor_info"]

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130

_EPILOG = """\
examples:
  mgtrace inspect model.tmod                  summary of one archive
  mgtrace inspect --graph model.tmod          ... with the generated code
  mgtrace verify models/ -j 4                 check every *.tmod under models/
  mgtrace upgrade old/ -o new/                rewrite all archives into new/
  mgtrace retrace models/ -o new/ --report r.json   re-trace; rerun resumes from r.json
  mgtrace retrace models/ -o new/ --dask local      same job on a local Dask cluster

exit status: 0 all good, 1 some files failed, 2 usage error, 130 interrupted
"""


def _batch_options(p, writes):
    p.add_argument("paths", nargs="+", metavar="PATH",
                   help="archive files or folders (searched recursively for --pattern)")
    p.add_argument("--pattern", default="*.tmod", help="file name glob inside folders (default: *.tmod)")
    p.add_argument("-j", "--jobs", type=int, default=1, metavar="N",
                   help="worker processes (default: 1)")
    p.add_argument("--dask", metavar="ADDRESS",
                   help="run on a Dask cluster: a scheduler address (tcp://host:8786) or 'local'; "
                        "needs pip install 'mgtrace[distributed]'")
    p.add_argument("--report", metavar="FILE.json",
                   help="write one JSON record per file here; a rerun skips files it lists as ok")
    p.add_argument("--no-resume", action="store_true", help="redo files the report lists as ok")
    p.add_argument("--rtol", type=float, default=1e-5, help="relative tolerance on outputs (default 1e-5)")
    p.add_argument("--atol", type=float, default=1e-6, help="absolute tolerance on outputs (default 1e-6)")
    p.add_argument("--json", action="store_true", help="print the records as JSON")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar, only the summary")
    if writes:
        g = p.add_mutually_exclusive_group(required=True)
        g.add_argument("-o", "--out", metavar="FOLDER",
                       help="write new archives here, keeping the layout below each input folder")
        g.add_argument("--in-place", action="store_true",
                       help="replace each original (only after the new file passed its checks)")


def _parser():
    p = argparse.ArgumentParser(
        prog="mgtrace", description="Inspect, check and migrate mgtrace .tmod archives.",
        epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    s = sub.add_parser("inspect", help="show what is inside archives (reads the header only)",
                       description="Format version, producer, module tree, op counts, parameter "
                                   "count and bytes, inputs/outputs, metadata. Reads only the header.")
    s.add_argument("files", nargs="+", metavar="FILE")
    s.add_argument("--graph", action="store_true", help="also print the generated code (loads the file)")
    s.add_argument("--json", action="store_true", help="print JSON")

    s = sub.add_parser("verify", help="check archives: checksums, schema, load, stored examples",
                       description="Verify checksums and schema, load each archive and re-run its "
                                   "stored example inputs against its stored outputs.")
    _batch_options(s, writes=False)

    s = sub.add_parser("diff", help="what changed between two archives")
    s.add_argument("a", metavar="A")
    s.add_argument("b", metavar="B")
    s.add_argument("--json", action="store_true", help="print JSON")

    s = sub.add_parser("upgrade", help="rewrite archives in the current format",
                       description="Load each archive and write it in the current format. The new "
                                   "file is reloaded and must reproduce the stored example outputs "
                                   "before it is moved into place; originals are never touched "
                                   "unless --in-place.")
    _batch_options(s, writes=True)

    s = sub.add_parser("retrace", help="trace archived modules again with this library",
                       description="Load each archive, trace the module again on its stored example "
                                   "inputs, check the new module against the old one, save it.")
    _batch_options(s, writes=True)
    s.add_argument("--inputs", metavar="FILE.py:FUNCTION",
                   help="for archives without stored examples: a function (path, module) -> tuple "
                        "of example inputs, from a script or an importable module (MODULE:FUNCTION)")

    s = sub.add_parser("doctor", help="versions, build options and supported formats")
    s.add_argument("--json", action="store_true", help="print JSON")
    return p


# ---------------------------------------------------------------- commands
def _cmd_inspect(args, out):
    from mgtrace import tasks
    from mgtrace.errors import ArchiveError
    status, results = EXIT_OK, []
    for f in args.files:
        try:
            results.append(tasks.inspect_file(f, graph=args.graph))
        except (ArchiveError, OSError) as e:
            results.append({"path": f, "error": str(e)})
            status = EXIT_FAILED
    if args.json:
        json.dump(results, out, indent=1)
        out.write("\n")
    else:
        for r in results:
            _print_summary(r, out)
    return status


def _print_summary(r, out):
    w = out.write
    if "error" in r:
        w(f"{r['path']}: ERROR {r['error']}\n\n")
        return
    w(f"{r['path']}  ({_size(r['file_bytes'])})\n")
    w(f"  format {r['format_version']} (readers >= {r['min_reader_version']}), written by {r['producer']}\n")
    w(f"  root: {r['root']}\n")
    w(f"  parameters: {r['parameters']:,} in {r['tensors']} tensors, {_size(r['bytes'])}\n")
    for i, g in enumerate(r.get("signature") or []):
        ins = ", ".join(_port(x) for x in g["inputs"])
        outs = ", ".join(_port(x) for x in g["outputs"])
        w(f"  forward{'' if i == 0 else f' #{i + 1}'}({ins}) -> {outs}\n")
    if r["modules"]:
        w("  modules:\n")
        for depth, name, desc in r["modules"][:60]:
            w(f"    {'  ' * depth}{name or '<root>'}: {desc}\n")
        if len(r["modules"]) > 60:
            w(f"    ... {len(r['modules']) - 60} more\n")
    if r["ops"]:
        w("  ops: " + ", ".join(f"{k} x{v}" for k, v in list(r["ops"].items())[:20]))
        w(" ..." if len(r["ops"]) > 20 else "")
        w("\n")
    w(f"  examples: {'stored' if r['has_examples'] else 'none'}\n")
    if "metadata" in r:
        w(f"  metadata: {json.dumps(r['metadata'])[:400]}\n")
    if "code" in r:
        w("\n" + r["code"] + "\n")
    w("\n")


def _port(x):
    if "shape" in x:
        return f"{x['name']}: {x.get('dtype')}{x['shape']}"
    return f"{x['name']}: {x.get('kind')}"


def _size(n):
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024


def _cmd_diff(args, out):
    from mgtrace import tasks
    res = tasks.diff_files(args.a, args.b)
    if args.json:
        json.dump(res, out, indent=1)
        out.write("\n")
    elif res["same"]:
        out.write("no differences\n")
    else:
        for c in res["changes"]:
            out.write(f"{c['what']}: {c['a']} -> {c['b']}\n")
    return EXIT_OK if res["same"] else EXIT_FAILED


def _cmd_batch(args, out):
    from mgtrace import batch, tasks
    task = {"verify": tasks.verify_file, "upgrade": tasks.upgrade_file,
            "retrace": tasks.retrace_file}[args.command]
    options = {"rtol": args.rtol, "atol": args.atol}
    if args.command != "verify":
        options.update(out=args.out, in_place=args.in_place,
                       roots=tuple(p for p in args.paths if os.path.isdir(p)))
    if args.command == "retrace":
        options["inputs"] = args.inputs
    records = batch.run(task, args.paths, options=options, jobs=args.jobs, dask=args.dask,
                        report=args.report, resume=not args.no_resume, pattern=args.pattern,
                        progress=False if args.quiet else None, command=args.command)
    if args.json:
        json.dump([r.to_json() for r in records], out, indent=1)
        out.write("\n")
    else:
        _print_table(records, out)
    counts = batch.summary(records)
    return EXIT_FAILED if counts["failed"] else EXIT_OK


def _print_table(records, out):
    from mgtrace import batch
    for r in records:
        extra = r.details.get("output") or r.details.get("examples") or ""
        err = r.details.get("max_abs_error")
        err = f" max err {err:.2g}" if isinstance(err, float) else ""
        line = f"{r.status.upper():7} {r.path}"
        line += f"  ({r.seconds:.2f} s{err}) {extra}" if r.status != "skipped" else "  (done before)"
        if r.reason and r.status == "failed":
            line += f"\n        {r.reason}"
        out.write(line.rstrip() + "\n")
    c = batch.summary(records)
    out.write(f"{c['total']} files: {c['ok']} ok, {c['failed']} failed, {c['skipped']} skipped\n")


def _cmd_doctor(args, out):
    info = doctor_info()
    if args.json:
        json.dump(info, out, indent=1)
        out.write("\n")
    else:
        for k, v in info.items():
            out.write(f"{k:24} {v}\n")
    return EXIT_OK


def doctor_info():
    """Versions, build options and supported formats, as a dict."""
    import platform
    import msgpack
    import numpy
    import mgtrace
    from mgtrace._core import linalg
    from mgtrace.serialization import FORMAT_VERSION
    info = {"mgtrace": mgtrace.__version__, "python": platform.python_version(),
            "platform": platform.platform(), "numpy": numpy.__version__,
            "msgpack": ".".join(map(str, msgpack.version))}
    try:
        info["blas"] = linalg.blas_config()
    except Exception as e:          # doctor reports, never fails
        info["blas"] = f"unknown ({e})"
    info["threads"] = mgtrace.get_num_threads()
    info["cuda"] = _cuda_status()
    info["archive format"] = ".".join(map(str, FORMAT_VERSION))
    info["reads formats"] = f"{FORMAT_VERSION[0]}.0 to {FORMAT_VERSION[0]}.x (newer minors: optional fields ignored)"
    try:
        import distributed
        info["dask.distributed"] = distributed.__version__
    except ImportError:
        info["dask.distributed"] = "not installed (pip install 'mgtrace[distributed]' for --dask)"
    return info


def _cuda_status():
    try:
        from mgtrace._core import _cuda  # noqa: F401
    except ImportError:
        return "not built (rebuild with MGTRACE_CUDA=1 and nvcc on PATH)"
    import mgtrace
    return "built, GPU available" if mgtrace.cuda_available() else "built, but no GPU is visible"


# -------------------------------------------------------------------- main
_COMMANDS = {"inspect": _cmd_inspect, "diff": _cmd_diff, "verify": _cmd_batch,
             "upgrade": _cmd_batch, "retrace": _cmd_batch, "doctor": _cmd_doctor}


def main(argv=None, out=None):
    """Run the command line ``argv`` (default sys.argv[1:]); returns the exit status."""
    from mgtrace.errors import ArchiveError
    out = out or sys.stdout
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:
        return EXIT_USAGE if e.code else EXIT_OK
    if getattr(args, "jobs", 1) < 1:
        parser.print_usage(sys.stderr)
        sys.stderr.write("mgtrace: error: -j/--jobs must be at least 1\n")
        return EXIT_USAGE
    try:
        return _COMMANDS[args.command](args, out)
    except FileNotFoundError as e:
        sys.stderr.write(f"mgtrace: error: {e}\n")
        return EXIT_USAGE
    except ArchiveError as e:
        sys.stderr.write(f"mgtrace: {e}\n")
        return EXIT_FAILED
    except KeyboardInterrupt:
        sys.stderr.write("mgtrace: interrupted (finished files are kept; outputs are never partial)\n")
        return EXIT_INTERRUPTED
    except (ValueError, RuntimeError) as e:
        sys.stderr.write(f"mgtrace: error: {e}\n")
        return EXIT_USAGE


def main_exit():
    """Console-script entry point: exit with :func:`main`'s status."""
    try:
        status = main()
        sys.stdout.flush()
    except BrokenPipeError:         # e.g. `mgtrace inspect --json f | head`
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        status = EXIT_OK
    sys.exit(status)


if __name__ == "__main__":
    main_exit()
