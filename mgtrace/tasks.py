"""What the ``mgtrace`` command does to one archive: inspect, verify, diff,
upgrade, retrace.

Each function takes a path and returns a plain dict (JSON-ready), so the
batch engine (:mod:`mgtrace.batch`) can run it in a process pool or on a
Dask worker and ship the result back. ``verify``, ``upgrade`` and
``retrace`` return ``{"status": "ok" | "failed", "reason": ..., ...}``;
they never raise for a bad archive. Outputs are written atomically and
checked before anything is replaced.
"""
import collections
import importlib
import importlib.util
import os
import sys
import tempfile

import numpy as np

__all__ = ["summarize", "inspect_file", "verify_file", "diff_files", "upgrade_file",
           "retrace_file", "destination", "compare_outputs"]


# ---------------------------------------------------------------- inspect
def summarize(header):
    """A JSON-ready summary of a validated archive header (no tensor data)."""
    from mgtrace.serialization import values
    tensors = header["tensors"]
    mods = header["modules"]
    ops = collections.Counter()
    module_types = collections.Counter()
    for m in mods:
        if m.get("kind") in ("builtin", "container"):
            module_types[m["type"].rsplit(".", 1)[-1]] += 1
        elif m.get("kind") == "traced":
            module_types[f"{m['name']} (traced)"] += 1
            for g in m.get("graphs", []):
                for e in g.get("exprs", []):
                    k = e.get("kind")
                    if k == "call_function":
                        ops[header["ops"][e["op"]]["name"]] += 1
                    elif k == "call_method" and e.get("method") != "__call__":
                        ops[f"Tensor.{e['method']}"] += 1
                    elif k == "apply":
                        ops[f"apply:{e['op']}"] += 1
    out = {
        "format_version": ".".join(map(str, header["format_version"])),
        "min_reader_version": ".".join(map(str, header["min_reader_version"])),
        "producer": f"{header['producer'].get('library')} {header['producer'].get('version')}",
        "root": _root_kind(header),
        "modules": _module_tree(header),
        "module_types": dict(sorted(module_types.items())),
        "ops": dict(sorted(ops.items(), key=lambda kv: (-kv[1], kv[0]))),
        "op_versions": {o["name"]: o["version"] for o in header["ops"]},
        "tensors": len(tensors),
        "parameters": int(sum(int(np.prod(t["shape"], dtype=np.int64)) for t in tensors)),
        "bytes": int(sum(t["nbytes"] for t in tensors)),
        "signature": _signature(header),
        "has_examples": "examples" in header,
    }
    meta = header.get("metadata")
    if meta is not None:
        try:
            out["metadata"] = _jsonable(values.decode(meta, None))
        except Exception as e:            # metadata holding tensors: show that it exists
            out["metadata"] = f"<not shown: {e}>"
    return out


def _root_kind(header):
    r = header["root"]
    if isinstance(r, dict) and "module" in r:
        m = header["modules"][r["module"]]
        return f"{m.get('kind')} module {m.get('name') or m.get('type')}"
    if isinstance(r, dict) and "tensor" in r:
        return "tensor"
    return "value"


def _module_tree(header):
    """``[[depth, name, description], ...]`` of the module tree from the root."""
    mods, rows = header["modules"], []
    r = header["root"]
    if not (isinstance(r, dict) and "module" in r):
        return rows

    def walk(i, name, depth, seen):
        m = mods[i]
        desc = m.get("name") if m.get("kind") == "traced" else m.get("type", "").rsplit(".", 1)[-1]
        if m.get("kind") == "builtin":
            desc += "(" + ", ".join(f"{k}={_short(v)}" for k, v in m.get("config", {}).items()) + ")"
        rows.append([depth, name, desc])
        if i in seen:
            return
        for child, j in m.get("children", []):
            walk(j, child, depth + 1, seen | {i})
    walk(r["module"], "", 0, frozenset())
    return rows


def _short(v):
    s = repr(v.get("tuple") if isinstance(v, dict) and "tuple" in v else v)
    return s if len(s) < 24 else s[:21] + "..."


def _signature(header):
    """Inputs and outputs of the root traced module's graphs, with shapes."""
    r = header["root"]
    if not (isinstance(r, dict) and "module" in r):
        return None
    m = header["modules"][r["module"]]
    if m.get("kind") != "traced":
        return None
    out = []
    for g in m.get("graphs", []):
        nodes = {n["id"]: n for n in g.get("nodes", [])}

        def desc(i):
            n = nodes.get(i, {})
            if n.get("kind") == "tensor":
                return {"name": n.get("name"), "shape": n.get("shape"), "dtype": n.get("dtype")}
            return {"name": n.get("name"), "kind": n.get("kind")}
        out.append({"inputs": [desc(i) for i in g.get("inputs", [])[1:]],
                     "outputs": [desc(i) for i in g.get("outputs", [])]})
    return out


def _jsonable(v):
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, (str, int, float, bool)) or v is None:
        return v
    return repr(v)


def inspect_file(path, graph=False):
    """The summary of ``path`` (header only); with ``graph`` also the
    generated code (this loads the archive)."""
    from mgtrace.serialization import read_header
    out = {"path": path, "file_bytes": os.path.getsize(path), **summarize(read_header(path))}
    if graph:
        from mgtrace.serialization import load
        from mgtrace.traced_module import TracedModule
        obj = load(path)
        if isinstance(obj, TracedModule):
            import io
            buf = io.StringIO()
            obj.print_readable(file=buf)
            out["code"] = buf.getvalue()
    return out


# ----------------------------------------------------------------- verify
def _leaves(v):
    from mgtrace._core import Tensor
    from mgtrace.traced_module.pytree import tree_flatten
    return tree_flatten(v, lambda x: isinstance(x, Tensor))


def compare_outputs(got, want, rtol=1e-5, atol=1e-6):
    """``(ok, max_abs_error, reason)`` comparing two output pytrees."""
    (ga, gdef), (wa, wdef) = _leaves(got), _leaves(want)
    if gdef != wdef:
        return False, None, f"output structure differs: {gdef} vs {wdef}"
    worst = 0.0
    for i, (g, w) in enumerate(zip(ga, wa)):
        g, w = g.numpy(), w.numpy()
        if g.shape != w.shape or g.dtype != w.dtype:
            return False, None, f"output {i}: {g.shape} {g.dtype} vs {w.shape} {w.dtype}"
        if g.size:
            gf, wf = g.astype(np.float64), w.astype(np.float64)
            err = float(np.nanmax(np.abs(gf - wf))) if np.isfinite(gf).any() else 0.0
            worst = max(worst, err)
            if not np.allclose(gf, wf, rtol=rtol, atol=atol, equal_nan=True):
                return False, worst, f"output {i} differs: max abs error {err:.3g} (rtol={rtol}, atol={atol})"
    return True, worst, ""


def _run_examples(obj, inputs):
    args = inputs if isinstance(inputs, tuple) else (inputs,)
    return obj(*args)


def verify_file(path, rtol=1e-5, atol=1e-6):
    """Checksums, schema, load, and stored examples re-run and compared."""
    from mgtrace.serialization import load_archive
    from mgtrace.module import Module
    arc = load_archive(path, verify=True)
    out = {"status": "ok", "reason": "", "format_version": ".".join(map(str, arc.format_version))}
    if arc.example_inputs is None:
        out["examples"] = "none stored"
        return out
    if not isinstance(arc.obj, Module):
        return {"status": "failed", "reason": "examples stored for an object that is not a module"}
    ok, err, reason = compare_outputs(_run_examples(arc.obj, arc.example_inputs),
                                      arc.example_outputs, rtol, atol)
    out.update(examples="checked", max_abs_error=err)
    if not ok:
        out.update(status="failed", reason=reason)
    return out


# ------------------------------------------------------------------- diff
def diff_files(a, b):
    """What differs between archives ``a`` and ``b``: header summaries,
    module entries, op versions, and tensors (max abs difference)."""
    from mgtrace.serialization import load_archive, read_header
    ha, hb = read_header(a), read_header(b)
    sa, sb = summarize(ha), summarize(hb)
    changes = []
    for key in ("format_version", "min_reader_version", "producer", "root", "parameters", "bytes"):
        if sa[key] != sb[key]:
            changes.append({"what": key, "a": sa[key], "b": sb[key]})
    ra = {tuple(r[:2]): r[2] for r in sa["modules"]}
    rb = {tuple(r[:2]): r[2] for r in sb["modules"]}
    for k in sorted(set(ra) | set(rb), key=str):
        if ra.get(k) != rb.get(k):
            changes.append({"what": f"module {k[1] or '<root>'}", "a": ra.get(k), "b": rb.get(k)})
    for name in sorted(set(sa["op_versions"]) | set(sb["op_versions"])):
        va, vb = sa["op_versions"].get(name), sb["op_versions"].get(name)
        if va != vb:
            changes.append({"what": f"op {name}", "a": va, "b": vb})
    for name in sorted(set(sa["ops"]) | set(sb["ops"])):
        ca, cb = sa["ops"].get(name, 0), sb["ops"].get(name, 0)
        if ca != cb:
            changes.append({"what": f"calls of {name}", "a": ca, "b": cb})
    sda, sdb = _state(load_archive(a).obj), _state(load_archive(b).obj)
    for k in sorted(set(sda) | set(sdb)):
        ta, tb = sda.get(k), sdb.get(k)
        if ta is None or tb is None:
            changes.append({"what": f"tensor {k}", "a": _desc(ta), "b": _desc(tb)})
        elif ta.shape != tb.shape or ta.dtype != tb.dtype:
            changes.append({"what": f"tensor {k}", "a": _desc(ta), "b": _desc(tb)})
        elif ta.size and not np.array_equal(ta, tb, equal_nan=True):
            d = float(np.max(np.abs(ta.astype(np.float64) - tb.astype(np.float64))))
            changes.append({"what": f"tensor {k}", "a": _desc(ta), "b": f"max abs diff {d:.3g}"})
    return {"a": a, "b": b, "same": not changes, "changes": changes}


def _state(obj):
    from mgtrace._core import Tensor
    from mgtrace.module import Module
    if isinstance(obj, Module):
        return {k: v.numpy() for k, v in obj.state_dict().items()}
    if isinstance(obj, Tensor):
        return {"<root>": obj.numpy()}
    if isinstance(obj, dict):
        return {str(k): v.numpy() for k, v in obj.items() if isinstance(v, Tensor)}
    return {}


def _desc(t):
    return None if t is None else f"{t.dtype} {list(t.shape)}"


# ------------------------------------------------------- upgrade / retrace
def destination(path, out=None, in_place=False, roots=()):
    """Where the new archive for ``path`` goes: ``path`` itself when
    ``in_place``, else ``out`` joined with the path relative to the input
    folder it was found under (``roots``), or its base name."""
    if in_place:
        return path
    if not out:
        raise ValueError("give an output folder (-o OUT) or --in-place")
    ap = os.path.abspath(path)
    for r in roots:
        r = os.path.abspath(r)
        if os.path.isdir(r) and ap.startswith(r.rstrip(os.sep) + os.sep):
            return os.path.join(out, os.path.relpath(ap, r))
    return os.path.join(out, os.path.basename(path))


def _write_checked(obj, dest, metadata, inputs, want, rtol, atol):
    """Save to a temp file beside ``dest``, reload it, check its examples
    against ``want``, then rename over ``dest``; returns (max error, reason)."""
    from mgtrace.serialization import load_archive, save
    folder = os.path.dirname(os.path.abspath(dest)) or "."
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".mgtrace-", suffix=".tmod", dir=folder)
    os.close(fd)
    try:
        save(obj, tmp, metadata=metadata, example_inputs=inputs)
        err = None
        arc = load_archive(tmp)
        if inputs is not None:
            got = _run_examples(arc.obj, arc.example_inputs)
            ok, err, reason = compare_outputs(got, want, rtol, atol)
            if not ok:
                return err, f"the new archive does not reproduce the stored outputs: {reason}"
        else:       # nothing to run: the tensors must come back unchanged
            a, b = _state(obj), _state(arc.obj)
            if a.keys() != b.keys() or any(not np.array_equal(a[k], b[k], equal_nan=True) for k in a):
                return None, "the new archive does not hold the same tensors"
        os.replace(tmp, dest)
        return err, ""
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def upgrade_file(path, out=None, in_place=False, roots=(), rtol=1e-5, atol=1e-6):
    """Rewrite ``path`` in the current format (see :func:`destination`);
    the new file must reproduce the stored example outputs first."""
    from mgtrace.serialization import FORMAT_VERSION, load_archive
    dest = destination(path, out, in_place, roots)
    arc = load_archive(path)
    old = ".".join(map(str, arc.format_version))
    if in_place and arc.format_version == tuple(FORMAT_VERSION):
        return {"status": "ok", "reason": "", "from": old, "output": dest, "note": "already current"}
    inputs = arc.example_inputs
    err, reason = _write_checked(arc.obj, dest, arc.metadata, inputs, arc.example_outputs, rtol, atol)
    if reason:
        return {"status": "failed", "reason": reason, "from": old}
    return {"status": "ok", "reason": "", "from": old, "output": dest, "max_abs_error": err}


def load_inputs_provider(spec):
    """The function named by ``spec``: ``"path/to/file.py:fn"`` or
    ``"package.module:fn"``; it is called as ``fn(path, module)`` and returns
    the example inputs (a tuple of positional arguments) for that archive.

    Raises:
        ValueError: ``spec`` has no ``:function`` part or names nothing callable.
    """
    if ":" not in spec:
        raise ValueError(f"--inputs takes FILE.py:FUNCTION or MODULE:FUNCTION, got {spec!r}")
    where, fn_name = spec.rsplit(":", 1)
    if where.endswith(".py"):
        name = "_mgtrace_inputs_" + os.path.splitext(os.path.basename(where))[0]
        s = importlib.util.spec_from_file_location(name, where)
        if s is None:
            raise ValueError(f"cannot load {where}")
        mod = importlib.util.module_from_spec(s)
        sys.modules[name] = mod
        s.loader.exec_module(mod)       # the user's own script, named on the command line
    else:
        mod = importlib.import_module(where)
    fn = getattr(mod, fn_name, None)
    if not callable(fn):
        raise ValueError(f"{spec}: {fn_name!r} is not a function in {where}")
    return fn


def retrace_file(path, out=None, in_place=False, roots=(), inputs=None, rtol=1e-5, atol=1e-6):
    """Load ``path``, trace it again with this library on its stored example
    inputs (or those ``inputs`` -- a spec for :func:`load_inputs_provider`
    -- gives), check the new module against the old one, and save it."""
    import mgtrace
    from mgtrace.serialization import load_archive
    from mgtrace.module import Module
    dest = destination(path, out, in_place, roots)
    arc = load_archive(path)
    if not isinstance(arc.obj, Module):
        return {"status": "failed", "reason": f"the archive holds a {type(arc.obj).__name__}, not a module"}
    args = arc.example_inputs
    if inputs is not None:
        args = load_inputs_provider(inputs)(path, arc.obj)
    if args is None:
        return {"status": "failed", "reason": "no example inputs stored; give --inputs FILE.py:FUNCTION"}
    args = args if isinstance(args, tuple) else (args,)
    want = arc.obj(*args)
    new = mgtrace.trace_module(arc.obj, *args)
    ok, err, reason = compare_outputs(new(*args), want, rtol, atol)
    if not ok:
        return {"status": "failed", "reason": f"the re-traced module differs: {reason}"}
    if arc.example_outputs is not None and inputs is None:
        ok, err2, reason = compare_outputs(want, arc.example_outputs, rtol, atol)
        if not ok:
            return {"status": "failed", "reason": f"the loaded module no longer gives the stored outputs: {reason}"}
    err, reason = _write_checked(new, dest, arc.metadata, args, want, rtol, atol)
    if reason:
        return {"status": "failed", "reason": reason}
    return {"status": "ok", "reason": "", "output": dest, "max_abs_error": err}
