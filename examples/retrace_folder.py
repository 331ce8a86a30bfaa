"""Re-trace a folder of archives with the installed mgtrace (after an upgrade).

    python examples/retrace_folder.py models/ --out retraced/ [-j 2]

The Python form of `mgtrace retrace models/ -o retraced/`: each archive is
loaded, traced again on its stored example inputs, checked against the old
module and saved; a callback reports progress. Bad archives are reported
and skipped, originals are never changed.
"""
import argparse
import sys

from mgtrace import batch


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("folder")
    p.add_argument("--out", required=True)
    p.add_argument("-j", "--jobs", type=int, default=1)
    args = p.parse_args()

    def progress(rec, done, total):
        print(f"[{done}/{total}] {rec.status:6} {rec.path} {rec.reason}")

    records = batch.retrace([args.folder], out=args.out, jobs=args.jobs, callback=progress,
                            report=None, progress=False)
    counts = batch.summary(records)
    print(f"{counts['ok']} re-traced, {counts['failed']} failed")
    return 1 if counts["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
