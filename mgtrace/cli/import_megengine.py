"""``mgtrace import-megengine IN... -o OUT/``: MegEngine's files to archives.

Each ``.tm`` (a MegEngine TracedModule) or ``.pkl`` (a state dict), as
``megengine.save`` wrote it, is read without running it
(:func:`mgtrace.megengine.load`) and written as ``OUT/<same path>.tmod``,
by the batch engine's rules (:mod:`mgtrace.cli.batch`): a report, resume by
content, keep going past bad files, ``-j``, ``--dask``. Each archive is
checked before it is moved into place: a traced module's archive is
reloaded and must reproduce the converted module's outputs on example
inputs (made from the input shapes MegEngine recorded, or by ``--inputs``),
which it keeps as its examples; a state dict's must hold the same tensors.
"""
import os

__all__ = ["import_file", "import_megengine", "add_parser"]

_EPILOG = """\
examples:
  mgtrace import-megengine model.tm -o converted/
  mgtrace import-megengine checkpoints/ -o converted/ --pattern '*.pkl'
  mgtrace import-megengine zoo/ -o converted/ -j 4 --report import.json   (rerun to resume)
  mgtrace import-megengine zoo/ -o converted/ --inputs make_inputs.py:inputs
      where make_inputs.py has
          def inputs(path, module):            # module is None: called before converting
              return (mgtrace.tensor(numpy.zeros((1, 3, 224, 224), "float32")),)
"""


def _dest(path, out, roots):
    from mgtrace.cli.tasks import destination
    base, ext = os.path.splitext(destination(path, out, False, roots))
    return base + ".tmod"


def import_file(path, out=None, roots=(), inputs=None, rtol=1e-5, atol=1e-6):
    """Convert one MegEngine file into ``out`` (see the module docstring);
    returns the batch engine's result dict. Raises MegEngineFileError (an
    mgtrace error: the batch records it) for a file that cannot be read or
    converted."""
    from mgtrace.cli import tasks
    from mgtrace.megengine.convert import convert
    dest = _dest(path, out, roots)
    with open(path, "rb") as f:
        data = f.read()
    args, source = None, "recorded shapes"
    if inputs is not None:
        args, source = tasks.load_inputs_provider(inputs)(path, None), inputs
        if args is None:
            return {"status": "failed", "reason": f"--inputs {inputs} returned None for {path}"}
        args = args if isinstance(args, tuple) else (args,)
    obj, args, kwargs = convert(data, path, args)
    metadata = {"converted_from": "megengine", "source": os.path.basename(path)}
    if args is None:            # a state dict: the archive must hold the same tensors
        err, reason = tasks._write_checked(obj, dest, metadata, None, None, rtol, atol)
        kind = "state dict"
    else:
        want = obj(*args, **kwargs)
        err, reason = tasks._write_checked(obj, dest, metadata, args, want, rtol, atol,
                                           kwargs=kwargs)
        kind = "traced module"
    if reason:
        return {"status": "failed", "reason": reason}
    return {"status": "ok", "reason": "", "output": dest, "kind": kind,
            "inputs": source if args is not None else None, "max_abs_error": err}


def import_megengine(paths, *, out, inputs=None, rtol=1e-5, atol=1e-6, **run_options):
    """Convert every MegEngine file of ``paths`` (files, and folders searched
    for ``pattern``, default ``*.tm``) into folder ``out``;
    ``run_options`` are those of :func:`mgtrace.cli.batch.run` (jobs, dask,
    report, resume, callback...). Returns the list of Records.

    Raises:
        ValueError: no ``out``; two inputs would be written to one output;
            a bad ``inputs`` spec; and as :func:`mgtrace.cli.batch.run`.
        FileNotFoundError: a path does not exist.
        OSError: ``out`` cannot be made or written.
    """
    from mgtrace.cli import batch, tasks
    if not out:
        raise ValueError("give an output folder (-o OUT / out=...)")
    if os.path.exists(out) and not os.path.isdir(out):
        raise ValueError(f"-o {out}: exists and is not a folder")
    if inputs is not None:
        tasks.load_inputs_provider(inputs)
    run_options.setdefault("pattern", "*.tm")
    roots = batch._roots(paths)
    seen = {}
    for f in batch.collect(paths, run_options["pattern"], exclude=out):
        dest = os.path.realpath(_dest(f, out, roots))
        if dest in seen:
            raise ValueError(f"{seen[dest]} and {f} would both be written to {dest}: give their "
                             "folders as inputs or run them separately")
        seen[dest] = f
    batch._check_writable(out, f"-o {out}")
    options = {"out": os.fspath(out), "roots": roots, "inputs": inputs, "rtol": rtol,
               "atol": atol}
    return batch.run(import_file, paths, options=options, command="import-megengine",
                     exclude=out, **run_options)


def add_parser(sub, formatter, jobs, tolerance, import_option):
    """The ``import-megengine`` subcommand (its options are the batch
    commands')."""
    import textwrap
    s = sub.add_parser(
        "import-megengine", help="convert MegEngine .tm / .pkl files to .tmod archives",
        formatter_class=formatter,
        epilog=_EPILOG + "\nexit status: 0 all good, 1 some files failed, 2 usage error, "
                         "130 interrupted",
        description=textwrap.fill(
            "Read each TracedModule (.tm) or state dict (.pkl) that megengine.save wrote, "
            "without running it (mgtrace's own reader of the file's opcodes, which loads nothing "
            "the file names), "
            "convert it to mgtrace's modules and functions, and write OUT/<same path>.tmod, "
            "checked first: a traced module's archive must reproduce its outputs on example "
            "inputs (from the input shapes MegEngine recorded, or --inputs), a state dict's "
            "must hold the same tensors.", 78))
    s.add_argument("paths", nargs="+", metavar="PATH",
                   help="MegEngine files, or folders searched recursively for --pattern")
    s.add_argument("-o", "--out", metavar="FOLDER", required=True,
                   help="write the archives here, with the layout below each input folder")
    s.add_argument("--inputs", metavar="FILE.py:FUNCTION",
                   help="example inputs for every traced module: FUNCTION(path, None) returns a "
                        "tuple of inputs (default: made from the input shapes MegEngine recorded)")
    import_option(s)
    g = s.add_argument_group("checks")
    g.add_argument("--rtol", type=tolerance, default=1e-5, metavar="R",
                   help="tolerance relative to each output's largest magnitude (default: 1e-5)")
    g.add_argument("--atol", type=tolerance, default=1e-6, metavar="A",
                   help="absolute tolerance when comparing outputs (default: 1e-6)")
    g = s.add_argument_group("running")
    g.add_argument("--pattern", default="*.tm", metavar="GLOB",
                   help="file names to take inside folders (default: *.tm; '*.pkl' for state "
                        "dicts)")
    g.add_argument("-j", "--jobs", type=jobs, default=1, metavar="N",
                   help="worker processes (default: 1); with --dask local, Dask workers")
    g.add_argument("--dask", metavar="ADDRESS",
                   help="run on a Dask cluster: a scheduler address, or 'local'")
    g.add_argument("--report", metavar="FILE.json",
                   help="one JSON record per file; a rerun with the same report skips the files "
                        "it lists as ok")
    g.add_argument("--no-resume", action="store_true",
                   help="with --report: redo every file, starting the report afresh")
    g = s.add_argument_group("printing")
    g.add_argument("--json", action="store_true", help="print the records as JSON")
    g.add_argument("-q", "--quiet", action="store_true",
                   help="no progress bar; list only the failed files, then the summary")
    return s
