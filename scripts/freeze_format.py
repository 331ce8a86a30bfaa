"""Freeze the format in development and list the release that writes it.

    python scripts/freeze_format.py 0.3.0            # freeze FORMAT_VERSION (1.2) as 0.3.0
    python scripts/freeze_format.py 0.3.0 --check    # say what stops it, change nothing
    python scripts/freeze_format.py 0.3.0 --commit <40 hex digits>

Run it on a clean checkout of the commit to release, once every change that
adds to the format has landed. It refuses (exit 1, nothing written), naming
each problem and what to do, unless:

* the format in development (``FORMAT_VERSION``) is not listed in
  schema/releases.json yet, and the release number is X.Y.Z above the last
  listed one;
* schema/schema.json and schema/ops.json match the code and the hashes
  recorded for the format (``python schema/generate.py --check``);
* the golden compendium is complete: every (function, version), (builtin
  module type, version), value tag, core op and recorded tensor method of
  ops.json has a golden case (tests/release/gates.py, the CI gates), the
  development format's maker finds nothing missing (its ``check()``: every
  function and module type an older format lacks, every new value tag), and
  each of its archives is the one its manifest.json records (the maker has
  been run on this code);
* the tree holds no uncommitted change (the release is this commit).

Then it writes, for format F and release R at commit C:

* ``mgtrace/serialization/released_ops/F.json``: schema/ops.json as R has
  it (what a writer for F may use, forever: target_version=F checks it);
* ``schema/releases.json``: R, C, F appended (with ``package_version``,
  what C's own mgtrace.__version__ says, where that differs from R);
* R as the package version (pyproject.toml, mgtrace/__init__.py), so the
  release rule of tests/release/test_releases.py holds from here on (the
  next change of the format or op table needs a new number);
* schema/CHANGELOG.md and README.md: the release line under F's entry and
  the release tables' rows for R.

From then on F's golden maker refuses to run and its archives are frozen
like 1.0's and 1.1's; commit the result ("Release R: format F frozen"), and
tests/compat builds R from C. tests/release/test_freeze.py checks the
refusals and a freeze of a copy of the tree.
"""
import argparse
import importlib.util
import json
import pathlib
import re
import shutil
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
# the files a freeze rewrites (relative to the root), for --check and the tests
FILES = ("schema/releases.json", "pyproject.toml", "mgtrace/__init__.py", "schema/CHANGELOG.md",
         "README.md", "mgtrace/serialization/released_ops")


def _load(name, path):
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, path)
        sys.modules[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules[name])
    return sys.modules[name]


def _gates():
    """tests/release/gates.py (the CI gates; it imports its package's releases.py)."""
    import importlib
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    return importlib.import_module("tests.release.gates")


def _fmt(v):
    return ".".join(map(str, v))


def _key(text):
    from mgtrace.serialization.version import version_key
    return version_key(text)


def release_problems(releases, release, fv):
    """The release number and the format are new and in order."""
    out = []
    if any(tuple(r["format"]) == tuple(fv) for r in releases):
        listed = next(r["version"] for r in releases if tuple(r["format"]) == tuple(fv))
        out.append(f"format {_fmt(fv)} is already released (as {listed}, schema/releases.json): "
                   "raise FORMAT_VERSION for a new format first")
    if not re.fullmatch(r"\d+\.\d+\.\d+", release):
        out.append(f"release {release!r} is not X.Y.Z (a release number has no dev or pre-release "
                   "part)")
    elif releases and _key(release) <= _key(releases[-1]["version"]):
        out.append(f"release {release} is not above the last listed release "
                   f"{releases[-1]['version']}")
    return out


def compendium_problems(ops, covered, maker_problems, manifest_problems):
    """The CI gates on the golden compendium, and the development maker's
    own check, on the given tables (tests pass made-up ones)."""
    gates = _gates()
    from mgtrace.serialization import values
    how = "the golden maker of the format in development lacks it: add a case and run the maker"
    current = {k: {(n, e["version"]) for n, e in ops[k].items()} for k in gates.KINDS}
    out = gates.golden_case_problems(current, covered, values.TAGS, how)
    out += gates.core_op_problems(ops["core_ops"], covered, how)
    out += gates.tensor_method_problems(ops["tensor_methods"], covered, how)
    return out + list(maker_problems) + list(manifest_problems)


def _manifest_problems(folder):
    import hashlib
    manifest = json.loads((folder / "manifest.json").read_text())
    out = []
    names = sorted(p.name for p in folder.glob("*.tmod"))
    if sorted(manifest) != names:
        out.append(f"schema/golden/{folder.name}/manifest.json lists {sorted(manifest)}, the "
                   f"folder holds {names}: run python schema/golden/{folder.name}/make_golden.py")
    for name in names:
        digest = "sha256:" + hashlib.sha256((folder / name).read_bytes()).hexdigest()
        if manifest.get(name) != digest:
            out.append(f"schema/golden/{folder.name}/{name} is not the file manifest.json "
                       f"records: run python schema/golden/{folder.name}/make_golden.py")
    return out


def _dirty(root):
    try:
        p = subprocess.run(["git", "-C", str(root), "status", "--porcelain"], capture_output=True,
                           text=True, check=True)
    except (OSError, subprocess.CalledProcessError) as e:
        return [f"cannot read the checkout's state ({e}): run it in a git checkout"]
    if p.stdout.strip():
        return ["the checkout has uncommitted changes: commit them first (the release is a "
                "commit)"]
    return []


def problems(root, release, fv, *, releases=None, covered=None, check_tree=True):
    """Everything that stops a freeze of format ``fv`` as ``release``."""
    releases = json.loads((root / "schema" / "releases.json").read_text())["releases"] \
        if releases is None else releases
    out = release_problems(releases, release, fv)
    generate = _load("schema_generate_freeze", ROOT / "schema" / "generate.py")
    out += generate.problems()
    folder = root / "schema" / "golden" / _fmt(fv)
    if not (folder / "make_golden.py").exists():
        return out + [f"schema/golden/{_fmt(fv)}/make_golden.py is missing: each format has a "
                      "golden compendium and its maker"]
    coverage = _load("golden_coverage", ROOT / "schema" / "golden" / "coverage.py")
    maker = _load(f"golden_{_fmt(fv).replace('.', '_')}", folder / "make_golden.py")
    covered = coverage.all_uses(root / "schema" / "golden") if covered is None else covered
    ops = json.loads((root / "schema" / "ops.json").read_text())
    out += compendium_problems(ops, covered, maker.check(folder), _manifest_problems(folder))
    if check_tree:
        out += _dirty(root)
    return out


def _replace(path, old, new, what, notes):
    text = path.read_text()
    if old in text:
        path.write_text(text.replace(old, new, 1))
    else:
        notes.append(f"{path.name}: {what} not found; edit it by hand")


def freeze(root, release, commit, fv, package_version):
    """Write the freeze (see the module docstring); returns notes for what
    could not be edited mechanically."""
    notes, f = [], _fmt(fv)
    shutil.copyfile(root / "schema" / "ops.json",
                    root / "mgtrace" / "serialization" / "released_ops" / f"{f}.json")
    path = root / "schema" / "releases.json"
    data = json.loads(path.read_text())
    row = {"version": release, "commit": commit, "format": list(fv)}
    if package_version != release:
        row["package_version"] = package_version
    data["releases"].append(row)
    rows = ",\n".join("    " + json.dumps(r) for r in data["releases"])
    path.write_text("{\n  \"doc\": " + json.dumps(data["doc"]) + ",\n  \"releases\": [\n" + rows
                    + "\n  ]\n}\n")
    _replace(root / "pyproject.toml", f'version = "{package_version}"', f'version = "{release}"',
             "the version line", notes)
    _replace(root / "mgtrace" / "__init__.py", f'__version__ = "{package_version}"',
             f'__version__ = "{release}"', "__version__", notes)
    log = root / "schema" / "CHANGELOG.md"
    _replace(log, f"\n## {f}\n\n", f"\n## {f}\n\nReleased as mgtrace {release} (commit "
             f"{commit[:7]}).\n\n", f"the '## {f}' heading", notes)
    _replace(log, f"| {package_version} | main | {f}, in development (frozen, and {release} "
             "released, later) |", f"| {release} | {commit[:7]} | {f} |", "the release row", notes)
    _replace(root / "README.md", f"| {package_version} (main) | {f}, in development |",
             f"| {release} (commit {commit[:7]}) | {f} |", "the release row", notes)
    return notes


def _package_version(root):
    text = (root / "mgtrace" / "__init__.py").read_text()
    m = re.search(r'(?m)^__version__ = "([^"]+)"', text)
    return m.group(1) if m else None


def main(argv=None, root=ROOT):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("release", help="the release number, X.Y.Z (e.g. 0.3.0)")
    p.add_argument("--commit", help="the release commit (default: HEAD)")
    p.add_argument("--check", action="store_true", help="report what stops it; write nothing")
    args = p.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    from mgtrace.serialization.version import FORMAT_VERSION
    found = problems(root, args.release, FORMAT_VERSION)
    commit = args.commit
    if commit is None:
        got = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True,
                             text=True)
        commit = got.stdout.strip()
    if not re.fullmatch(r"[0-9a-f]{40}", commit or ""):
        found.append(f"commit {commit!r} is not a full 40-digit commit hash")
    if found:
        print(f"format {_fmt(FORMAT_VERSION)} cannot be frozen as {args.release}:", file=sys.stderr)
        for msg in found:
            print(f"- {msg}", file=sys.stderr)
        return 1
    if args.check:
        print(f"format {_fmt(FORMAT_VERSION)} can be frozen as {args.release} at {commit}")
        return 0
    notes = freeze(root, args.release, commit, FORMAT_VERSION, _package_version(root))
    for n in notes:
        print(n, file=sys.stderr)
    print(f"format {_fmt(FORMAT_VERSION)} frozen: release {args.release} at {commit[:12]} listed; "
          "run tests/release and tests/serialization/test_golden.py, then commit")
    return 0


if __name__ == "__main__":
    sys.exit(main())
