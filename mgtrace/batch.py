"""Batch jobs over many archives, as a Python API: ``mgtrace.batch``.

The public path of the engine behind ``mgtrace verify|upgrade|retrace``; the
engine itself lives with the command line, in :mod:`mgtrace.cli.batch`
(its docstring tells how jobs, reports, resuming and interrupts work)::

    from mgtrace import batch
    records = batch.retrace(["models/"], out="new/", jobs=2,
                            callback=lambda rec, done, total: print(done, total, rec.status))
"""
from mgtrace.cli.batch import (REPORT_VERSION, Record, ReportError, collect, fingerprint,
                               leftovers, read_report, retrace, run, summary, unchanged,
                               upgrade, verify)

__all__ = ["Record", "ReportError", "collect", "leftovers", "fingerprint", "unchanged", "run",
           "read_report", "summary", "REPORT_VERSION", "verify", "upgrade", "retrace"]
