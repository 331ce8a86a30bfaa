"""The release rules, as functions that return what is wrong (empty: all good).

Each rule takes its inputs as arguments, so a test can show it failing on a
made-up history as well as passing on the real one (schema/releases.json,
mgtrace.__version__, schema/hashes.json, schema/golden/).
"""
import json
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCHEMA = ROOT / "schema"

def version_key(text):
    """mgtrace.serialization.version.version_key, refusing other forms.

    Raises:
        ValueError: not X.Y.Z, X.Y.Z.devN or X.Y.Z(a|b|rc)N.
    """
    from mgtrace.serialization.version import version_key as key
    k = key(text)
    if k is None:
        raise ValueError(f"version {text!r} is not X.Y.Z, X.Y.Z.devN or X.Y.Z(a|b|rc)N")
    return k


def fmt(version):
    return ".".join(map(str, version))


def load_releases():
    return json.loads((SCHEMA / "releases.json").read_text())["releases"]


def load_hashes():
    return json.loads((SCHEMA / "hashes.json").read_text())


def history_problems(releases):
    """The listed releases are oldest first: versions rising, formats never
    falling, each a full commit hash."""
    out = []
    for r in releases:
        if not re.fullmatch(r"[0-9a-f]{40}", r.get("commit", "")):
            out.append(f"release {r.get('version')}: commit {r.get('commit')!r} is not a full "
                       "40-digit commit hash")
    for a, b in zip(releases, releases[1:]):
        if version_key(b["version"]) <= version_key(a["version"]):
            out.append(f"releases.json lists {b['version']} after {a['version']}: list releases "
                       "oldest first, each with a higher version")
        if tuple(b["format"]) < tuple(a["format"]):
            out.append(f"release {b['version']} has format {fmt(b['format'])}, older than "
                       f"{a['version']}'s {fmt(a['format'])}")
    return out


def version_problems(releases, version, format_version, hashes_now, recorded):
    """``version`` (mgtrace.__version__) is a new number when the format or
    the op table changed since the last listed release.

    Args:
        releases: schema/releases.json's list.
        version: the package version now.
        format_version: FORMAT_VERSION now.
        hashes_now: ``{"schema.json": sha, "ops.json": sha}`` of the files now.
        recorded: schema/hashes.json (format -> hashes).
    """
    last = releases[-1]
    out = []
    if version_key(version) < version_key(last["version"]):
        out.append(f"mgtrace.__version__ is {version}, older than the last listed release "
                   f"{last['version']} (schema/releases.json)")
        return out
    changed = []
    if tuple(format_version) != tuple(last["format"]):
        changed.append(f"the format ({fmt(last['format'])} -> {fmt(format_version)})")
    released = recorded.get(fmt(last["format"]), {})
    for name in ("schema.json", "ops.json"):
        if tuple(format_version) == tuple(last["format"]) and released.get(name) != hashes_now[name]:
            changed.append(f"schema/{name}")
    if changed and version_key(version) <= version_key(last["version"]):
        out.append(
            f"{' and '.join(changed)} changed since release {last['version']} (the last in "
            f"schema/releases.json), but mgtrace.__version__ is still {version}: an archive "
            f"\"written by mgtrace {version}\" would not say which writer made it. Give this "
            f"code a new version: raise `version` in pyproject.toml and `__version__` in "
            f"mgtrace/__init__.py past {last['version']} (X.Y.Z.dev0 while in development), and "
            "when it is released list it in schema/releases.json")
    return out


def golden_problems(releases, golden=SCHEMA / "golden"):
    """Every listed release's format keeps its golden folder, with its
    maker, its manifest and every archive the manifest names."""
    out = []
    for r in releases:
        folder = golden / fmt(r["format"])
        if not (folder / "manifest.json").exists() or not (folder / "make_golden.py").exists():
            out.append(f"release {r['version']} (format {fmt(r['format'])}): schema/golden/"
                       f"{folder.name}/ with make_golden.py and manifest.json is gone; golden "
                       "archives of a released format stay in the tree forever")
            continue
        for name in json.loads((folder / "manifest.json").read_text()):
            if not (folder / name).exists():
                out.append(f"release {r['version']}: schema/golden/{folder.name}/{name} is "
                           "gone; golden archives of a released format stay in the tree forever")
    return out
