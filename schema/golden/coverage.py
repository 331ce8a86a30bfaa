"""What the golden archives cover, read from their headers alone.

    python schema/golden/coverage.py          # counts per format folder, and what is missing

Used by each folder's make_golden.py (to refuse a compendium that misses
something) and by tests/release/test_coverage.py (the CI gates). Nothing is
run or imported from an archive: the header says which functions (with
versions), builtin module types (with versions), module kinds, value tags,
tensor methods, core ops and dtypes it uses.
"""
import json
import pathlib
import sys

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))

KINDS = ("functions", "module_types", "tags", "kinds", "dtypes", "tensor_methods", "core_ops",
         "features")


def _walk(value, found, tags):
    """Collect the value tags of a header value (a map with one key, a tag)."""
    if isinstance(value, dict):
        if len(value) == 1:
            (key, payload), = value.items()
            if key in tags:
                found["tags"].add(key)
                if key == "scalar" and isinstance(payload, list) and payload:
                    found["dtypes"].add(payload[0])
        for v in value.values():
            _walk(v, found, tags)
    elif isinstance(value, list):
        for v in value:
            _walk(v, found, tags)


def header_uses(header):
    """``{kind: set}`` of what one archive header uses (kinds: :data:`KINDS`;
    functions and module types as ``(name, version)``)."""
    from mgtrace.serialization import registry, values
    found = {k: set() for k in KINDS}
    found["functions"] = {(o["name"], o["version"]) for o in header["ops"]}
    for m in header["modules"]:
        found["kinds"].add(m["kind"])
        if m["kind"] == "builtin":
            found["module_types"].add((m["type"], m["type_version"]))
        elif m["kind"] == "container" and m["type"] in registry.CONTAINERS:
            found["module_types"].add((m["type"], registry.own_module_types()[m["type"]]))
        for g in m.get("graphs", ()):
            if "ids" in g:
                found["features"].add("graph ids")
            for e in g["exprs"]:
                found["features"].add(f"expr {e['kind']}")
                if e["kind"] == "apply":
                    found["core_ops"].add(e["op"])
                elif e["kind"] == "call_method" and "kwargs" in e:     # a tensor method
                    found["tensor_methods"].add(e["method"])
        if len(m.get("graphs", ())) > 1:
            found["features"].add("several graphs a module")
        if m.get("reads_as"):
            found["features"].add(f"traced {m['reads_as']}")
        if m["kind"] == "traced" and not m.get("is_top") and m.get("graphs"):
            found["features"].add("hierarchy")
    for t in header["tensors"]:
        found["dtypes"].add(t["dtype"])
        if "view" in t:
            found["features"].add("tensor views")
    if "examples" in header:
        found["features"].add("examples")
        if header["examples"].get("kwargs"):
            found["features"].add("example kwargs")
    if "metadata" in header:
        found["features"].add("metadata")
    _walk(header, found, values.TAGS)
    return found


def folder_uses(folder):
    """``{archive name: header_uses(...)}`` of one golden folder, with each
    archive's ``(format_version, min_reader_version)`` under ``"versions"``."""
    from mgtrace.serialization import read_header
    out = {}
    for path in sorted(pathlib.Path(folder).glob("*.tmod")):
        header = read_header(path)
        uses = header_uses(header)
        uses["versions"] = (tuple(header["format_version"]), tuple(header["min_reader_version"]))
        out[path.name] = uses
    return out


def all_uses(golden=HERE):
    """``{folder name: folder_uses(folder)}`` of every format folder."""
    return {p.name: folder_uses(p) for p in sorted(golden.iterdir())
            if p.is_dir() and (p / "manifest.json").exists()}


def totals(uses_by_archive):
    """The union of several archives' uses."""
    out = {k: set() for k in KINDS}
    for uses in uses_by_archive:
        for k in KINDS:
            out[k] |= uses[k]
    return out


def main():
    from mgtrace.serialization import registry, values
    every = all_uses()
    ops = json.loads((HERE.parent / "ops.json").read_text())
    want = {"functions": {(n, e["version"]) for n, e in ops["functions"].items()},
            "module_types": {(n, e["version"]) for n, e in ops["module_types"].items()},
            "tags": set(values.TAGS), "tensor_methods": set(ops["tensor_methods"]),
            "core_ops": set(ops["core_ops"])}
    del registry
    for folder, archives in every.items():
        t = totals(archives.values())
        print(f"{folder}: {len(archives)} archives; " + ", ".join(
            f"{k} {len(t[k] & want[k])}/{len(want[k])}" for k in want))
    t = totals(u for archives in every.values() for u in archives.values())
    for k in want:
        missing = sorted(want[k] - t[k])
        if missing:
            print(f"not covered by any golden archive, {k}: {missing}")


if __name__ == "__main__":
    main()
