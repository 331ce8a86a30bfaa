"""The coverage gates (issue 37, item 4) as functions returning what is
missing, each message saying how to fix it. They take their tables as
arguments, so tests/release/test_coverage.py shows each failing on a
made-up op table as well as passing on the real one.

Tables:
    ops: ``{"functions": {(name, version)}, "module_types": {(name, version)}}``
        (schema/ops.json's current versions; with their older versions added
        by :func:`all_versions`).
    covered: ``{folder: {archive: uses}}`` (schema/golden/coverage.py's all_uses).
    released: ``{(major, minor): {"functions": {name: v}, "module_types": {name: v}}}``
        (mgtrace/serialization/released_ops/ of each released format).
"""
import json

from .releases import SCHEMA, fmt, load_releases

KINDS = {"functions": "function", "module_types": "builtin module type"}


def current_ops():
    ops = json.loads((SCHEMA / "ops.json").read_text())
    return {k: {(n, e["version"]) for n, e in ops[k].items()} for k in KINDS}


def all_versions(ops):
    """Every (name, version) a reader of today must load: each name at each
    version from 1 to its current one."""
    return {k: {(n, v) for n, cur in ops[k] for v in range(1, cur + 1)} for k in KINDS}


def maker_command(format_version, releases):
    """How to add a golden case for the format being developed."""
    dev = fmt(format_version)
    if any(tuple(r["format"]) == tuple(format_version) for r in releases):
        return (f"format {dev} is released (frozen): raise FORMAT_VERSION to a new minor, start "
                f"schema/golden/<new version>/make_golden.py from {dev}'s, add the case there "
                "and run it")
    return (f"add a case that uses it to schema/golden/{dev}/make_golden.py and run `python "
            f"schema/golden/{dev}/make_golden.py` (format {dev} is in development: that "
            f"command rewrites its golden archives and manifest.json)")


def golden_case_problems(ops, covered, tags, how):
    """Every (name, version) of ``all_versions(ops)`` and every value tag is
    used by some golden archive."""
    seen = {k: set() for k in ("functions", "module_types", "tags")}
    for archives in covered.values():
        for uses in archives.values():
            for k in seen:
                seen[k] |= uses[k]
    out = []
    for k, what in KINDS.items():
        for name, v in sorted(all_versions(ops)[k] - seen[k]):
            out.append(f"{what} {name} version {v} has no golden case: {how}")
    for tag in sorted(set(tags) - seen["tags"]):
        out.append(f"value tag {tag!r} has no golden case: {how}")
    return out


def upgrader_problems(ops, cases, upgraders):
    """Every (name, version) below a current version has an upgrader and a
    test case (tests/release/upgrader_cases.py) from that version.

    Args:
        cases: ``{(what, name, version): (stored, expected)}``.
        upgraders: ``{"functions": {name: {version: fn}}, "module_types": ...}``.
    """
    out = []
    for k, what in KINDS.items():
        for name, cur in sorted(ops[k]):
            for v in range(1, cur):
                if v not in upgraders[k].get(name, {}):
                    out.append(f"{what} {name} is version {cur} but has no upgrader from version "
                               f"{v}: add one to mgtrace/serialization/upgraders.py")
                if (what, name, v) not in cases:
                    out.append(f"{what} {name} is version {cur} but its upgrader from version "
                               f"{v} has no test: add ({what!r}, {name!r}, {v}): (stored, "
                               "expected) to tests/release/upgrader_cases.py")
    return out


def min_reader(name, version, kind, released, format_version):
    """The oldest format whose readers know ``name`` at ``version`` or
    later: the first released format listing it, else the one in
    development (``format_version``)."""
    for f in sorted(released):
        if released[f][kind].get(name, 0) >= version:
            return f
    return tuple(format_version)


def min_reader_problems(ops, covered, released, releases, format_version):
    """Every (name, version) has a minimum reader version (TFLite's rule: an
    op version without a minimum runtime fails): each released format older
    than ``format_version`` has its table of names, every name the op table
    had at a released format is still there, and every golden archive that
    uses (name, version) says it needs at least that reader."""
    out = []
    for r in releases:
        f = tuple(r["format"])
        if f < tuple(format_version) and f not in released:
            out.append(f"format {fmt(f)} (release {r['version']}) has no table of the functions "
                       f"and module types it knew, so no minimum reader version can be given: "
                       f"add mgtrace/serialization/released_ops/{fmt(f)}.json (schema/ops.json "
                       f"as release {r['version']} had it)")
    for f, table in sorted(released.items()):
        for k, what in KINDS.items():
            now = dict(ops[k])
            for name, v in sorted(table[k].items()):
                if now.get(name, 0) < v:
                    out.append(f"{what} {name} version {v} was in format {fmt(f)} and is gone "
                               "from schema/ops.json: archives of that format call it; keep it "
                               "(a name is never removed, only versioned)")
    for folder, archives in sorted(covered.items()):
        for archive, uses in sorted(archives.items()):
            needs = uses["versions"][1]
            for k, what in KINDS.items():
                for name, v in sorted(uses[k]):
                    if not name.startswith(("mgtrace.", "operator.")):
                        continue            # a user's own function (its own package's promise)
                    least = min_reader(name, v, k, released, format_version)
                    if needs < least:
                        out.append(f"schema/golden/{folder}/{archive} uses {what} {name} "
                                   f"version {v}, which a format {fmt(least)} reader first "
                                   f"knows, but says min_reader_version {fmt(needs)}: the "
                                   "writer must raise min_reader_version for it "
                                   "(registry.py's since, released_ops/)")
    return out


# Tensor methods a stored graph may call (traced_codec.TENSOR_METHODS) that
# neither a trace nor a graph edit ever records, so no archive mgtrace writes
# holds them and they have no golden case (issue 37 decided each): item,
# numpy, tolist take a value out of the graph: a trace fixes what they
# return as a constant (a TraceWarning names the line), and a graph node has
# no such method, so an edit cannot add one. (to(device) left this set: a
# move to another device is recorded as ``to`` with the device, and
# 1.2/core_ops_index.tmod holds one; to() of the tensor's own device records
# nothing.) A stored graph that calls one (made by hand or another writer)
# loads and runs as the eager call does, as in every release since 0.1.0
# (their readers took the same allowlist); test_coverage.py shows both.
NEVER_RECORDED = {"item", "numpy", "tolist"}


def tensor_method_problems(methods, covered, how, never=NEVER_RECORDED):
    """Every tensor method of schema/ops.json but ``never`` is called by some
    golden archive."""
    seen = set()
    for archives in covered.values():
        for uses in archives.values():
            seen |= uses["tensor_methods"]
    return [f"tensor method {m!r} has no golden case: {how}"
            for m in sorted(set(methods) - seen - set(never))]


def core_op_problems(core_ops, covered, how):
    """Every core op of schema/ops.json is an Apply expr of some golden
    archive (a traced forward that calls ``mgtrace.apply(OpDef(name, params),
    *inputs)``)."""
    seen = set()
    for archives in covered.values():
        for uses in archives.values():
            seen |= uses["core_ops"]
    return [f"core op {name!r} has no golden case (an Apply expr: a traced forward that calls "
            f"mgtrace.apply(OpDef({name!r}, params), *inputs)): {how}"
            for name in sorted(set(core_ops) - seen)]
