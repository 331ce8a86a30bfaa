"""Write schema.json and ops.json from the code, and check them against hashes.json.

    python schema/generate.py            # regenerate schema.json and ops.json
    python schema/generate.py --check    # exit 1 when they differ from the code or
                                         # from the hashes recorded for FORMAT_VERSION
    python schema/generate.py --record   # record their hashes for FORMAT_VERSION
                                         # (refused if recorded; --force only before release)

schema.json describes the file layout, the header's fields (header.py), the
module kinds and their fields (codecs) and the value tags (values.py). ops.json is the table of mgtrace's own stable names --
functions and module types -- with their versions (registry.py). Both are
part of the format: tests/serialization/test_schema.py fails when either
changes while FORMAT_VERSION and its recorded hash stay the same.
"""
import argparse
import hashlib
import inspect
import json
import pathlib
import sys

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from mgtrace.serialization import codecs, header, layout, registry, tensors, values  # noqa: E402
from mgtrace.serialization.version import FORMAT_NAME, FORMAT_VERSION, fmt  # noqa: E402

FILES = ("schema.json", "ops.json")


def _fields(fields):
    return [{"name": f.name, "type": f.type, "required": f.required, "since": list(f.since),
             "doc": f.doc} for f in fields]


def build_schema():
    """The schema as a JSON-able dict (mgtrace's own module kinds only)."""
    kinds = {k: {"since": list(c.since), "fields": _fields(c.fields)}
             for k, c in codecs.codecs().items() if c.encode.__module__.startswith("mgtrace.")}
    return {
        "format": FORMAT_NAME,
        "format_version": list(FORMAT_VERSION),
        "layout": {"magic": layout.MAGIC.hex(),
                   "prefix": "8-byte magic, then the header length as a little-endian u64",
                   "header": "one msgpack map (str keys), right after the prefix",
                   "alignment": layout.ALIGN,
                   "data": "zero padding to the alignment, then each tensor at data_start + "
                           "offset, C-contiguous, little-endian"},
        "checksum": f"{tensors.CHECKSUM} (zlib) of each tensor's bytes, as \"crc32:%08x\"",
        "types": {name: desc for name, (_, desc) in header.TYPES.items()},
        "header": _fields(header.HEADER),
        "entries": {name: _fields(fs) for name, fs in header.ENTRIES.items()},
        "module_kinds": kinds,
        "values": {"untagged": values.UNTAGGED,
                   "tags": {t: {"payload": v.payload, "since": list(v.since)}
                            for t, v in values.TAGS.items()},
                   "scalar_dtypes": list(values.SCALAR_DTYPES)},
    }


def _default(v):
    """A parameter default as schema text: stable across runs (no addresses)."""
    if v is inspect.Parameter.empty:
        return None
    if isinstance(v, (type(None), bool, int, float, str)) or \
            (isinstance(v, tuple) and all(isinstance(x, (int, float, str, bool)) for x in v)):
        return repr(v)
    return f"<{type(v).__name__}>"


def _params(fn, skip_self=False):
    """``[[name, kind, default], ...]`` of ``fn``'s signature: what archives bind
    arguments by (functions) or store as config keys (module constructors)."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):          # a builtin without a text signature
        return None
    ps = list(sig.parameters.values())[1 if skip_self else 0:]
    return [[p.name, p.kind.name, _default(p.default)] for p in ps]


def build_ops():
    """mgtrace's own stable names as a JSON-able dict: every function with its
    version and parameters, every module type with its version and
    constructor parameters (its config keys), the tensor methods a stored
    graph may call and the core ops an Apply may name. Renaming a parameter,
    a config key, a method or an op changes this file, so its hash test
    fails until the format version is raised (see CHANGELOG.md)."""
    from mgtrace._core import op_table
    from mgtrace.serialization import traced_codec
    functions = {n: {"version": v, "params": _params(registry._FUNCTIONS[n].get())}
                 for n, v in registry.own_functions().items()}
    modules = {n: {"version": v, "config": _params(registry.module_type(n).__init__,
                                                   skip_self=True)}
               for n, v in registry.own_module_types().items()}
    return {"format_version": list(FORMAT_VERSION),
            "functions": functions,
            "module_types": modules,
            "tensor_methods": sorted(traced_codec.TENSOR_METHODS),
            "core_ops": sorted(op_table.OPS)}


def _render(obj, indent):
    if isinstance(obj, (dict, list)) and obj and any(isinstance(v, (dict, list)) for v in
                                                       (obj.values() if isinstance(obj, dict) else obj)):
        pad = "  " * (indent + 1)
        if isinstance(obj, dict):
            items = [f"{pad}{json.dumps(k)}: {_render(v, indent + 1)}" for k, v in obj.items()]
            return "{\n" + ",\n".join(items) + "\n" + "  " * indent + "}"
        items = [pad + _render(v, indent + 1) for v in obj]
        return "[\n" + ",\n".join(items) + "\n" + "  " * indent + "]"
    if isinstance(obj, dict) and len(obj) > 4:       # long flat maps: one entry a line
        pad = "  " * (indent + 1)
        items = [f"{pad}{json.dumps(k)}: {json.dumps(v, ensure_ascii=False)}" for k, v in obj.items()]
        return "{\n" + ",\n".join(items) + "\n" + "  " * indent + "}"
    return json.dumps(obj, ensure_ascii=False)


def render(obj):
    """JSON with one entry a line and short lists inline (stable, diff-friendly)."""
    return _render(obj, 0) + "\n"


def sha256(text):
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def generated():
    return {"schema.json": render(build_schema()), "ops.json": render(build_ops())}


def recorded_hashes():
    path = HERE / "hashes.json"
    return json.loads(path.read_text()) if path.exists() else {}


def problems():
    """What is out of step, as messages that say what to do (empty: all good)."""
    out, version = [], fmt(FORMAT_VERSION)
    want = recorded_hashes().get(version)
    for name, text in generated().items():
        path = HERE / name
        if not path.exists() or path.read_text() != text:
            out.append(f"schema/{name} does not match the code; run `python schema/generate.py` "
                       "to regenerate it, then run this check again")
            continue
        if want is None:
            out.append(f"schema/hashes.json records nothing for format {version}; describe the "
                       "version in schema/CHANGELOG.md and run `python schema/generate.py --record`")
        elif want.get(name) != sha256(text):
            out.append(
                f"schema/{name} changed, but FORMAT_VERSION is still {version}, whose recorded "
                f"hash is {want.get(name)} (now {sha256(text)}). Changing the archive schema or "
                "the op table needs a format version bump: raise FORMAT_VERSION in "
                "mgtrace/serialization/version.py (minor for optional additions that older "
                "readers may ignore, major otherwise, with an upgrader), add an entry to "
                "schema/CHANGELOG.md and a schema/golden/<version>/ folder, then run "
                "`python schema/generate.py && python schema/generate.py --record`")
    return out


def record(force=False):
    version, hashes = fmt(FORMAT_VERSION), recorded_hashes()
    if version in hashes and not force:
        sys.exit(f"hashes for format {version} are already recorded; a released version's "
                 "schema never changes (bump FORMAT_VERSION). Before its release, --force "
                 "re-records them.")
    hashes[version] = {name: sha256((HERE / name).read_text()) for name in FILES}
    (HERE / "hashes.json").write_text(render(dict(sorted(hashes.items()))))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--check", action="store_true", help="check only, write nothing")
    p.add_argument("--record", action="store_true", help="record hashes for FORMAT_VERSION")
    p.add_argument("--force", action="store_true", help="with --record: overwrite (pre-release)")
    args = p.parse_args(argv)
    if args.record:
        record(args.force)
    elif not args.check:
        for name, text in generated().items():
            (HERE / name).write_text(text)
    found = problems()
    for msg in found:
        print(msg, file=sys.stderr)
    return 1 if found and (args.check or args.record) else 0


if __name__ == "__main__":
    sys.exit(main())
