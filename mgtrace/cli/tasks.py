"""What the ``mgtrace`` command does to one archive: inspect, verify, diff,
upgrade, retrace.

Each function takes a path and returns a plain dict (JSON-ready), so the
batch engine (:mod:`mgtrace.cli.batch`) can run it in a process pool or on a
Dask worker and ship the result back. ``verify``, ``upgrade`` and
``retrace`` return ``{"status": "ok" | "failed", "reason": ..., ...}`` for
an archive they could read, and raise (``ArchiveError`` for a malformed,
corrupted, too new or unregistered-name archive) when they could not; the
batch engine records either as the file's result. Outputs are written
atomically and checked before anything is replaced.
"""
import collections
import importlib
import importlib.util
import os
import sys

import numpy as np

__all__ = ["summarize", "tensor_names", "inspect_file", "verify_file", "diff_files",
           "upgrade_file", "retrace_file", "destination", "compare_outputs",
           "load_inputs_provider", "load_user_code"]


# ---------------------------------------------------------------- inspect
def summarize(header):
    """A JSON-ready summary of a validated archive header (no tensor data).

    ``parameters`` / ``tensors`` / ``bytes`` count the model's own tensors
    (parameters and buffers, or the saved tensors of a non-module archive);
    stored example inputs/outputs are counted apart, as ``examples``.
    """
    from mgtrace.cli import value_json
    from mgtrace.errors import ArchiveError
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
    model = sorted({i for i in tensor_names(header).values()
                    if isinstance(i, int) and 0 <= i < len(tensors)})
    ex = header.get("examples")
    ex_idx = sorted({i for _, i in _tagged_tensors(ex, "") if 0 <= i < len(tensors)})
    out = {
        "format_version": ".".join(map(str, header["format_version"])),
        "min_reader_version": ".".join(map(str, header["min_reader_version"])),
        "producer": f"{header['producer'].get('library')} {header['producer'].get('version')}",
        "root": _root_kind(header),
        "modules": _module_tree(header),
        "module_types": dict(sorted(module_types.items())),
        "ops": dict(sorted(ops.items(), key=lambda kv: (-kv[1], kv[0]))),
        "op_versions": {o["name"]: o["version"] for o in header["ops"]},
        "tensors": len(model),
        "parameters": int(sum(_numel(tensors[i]) for i in model)),
        "bytes": int(sum(tensors[i]["nbytes"] for i in _stored(tensors, model))),
        "signature": _signature(header),
        "has_examples": ex is not None,
        "examples": None if ex is None else {
            "inputs": _example_shapes(ex.get("inputs"), tensors),
            "outputs": _example_shapes(ex.get("outputs"), tensors),
            "tensors": len(ex_idx),
            "bytes": int(sum(tensors[i]["nbytes"] for i in _stored(tensors, ex_idx)))},
    }
    meta = header.get("metadata")
    if meta is not None:      # every entry, keys kept apart by type (see value_json)
        try:
            out["metadata"] = value_json.to_json(value_json.decode_header_value(meta, header))
        except ArchiveError as e:         # the rest of the summary is still worth showing
            out["metadata_error"] = str(e)
    return out


def _numel(entry):
    return int(np.prod(entry["shape"], dtype=np.int64))


def _tagged_tensors(v, path):
    """``(path, tensor index)`` of every ``{"tensor": i}`` inside tagged value ``v``."""
    if isinstance(v, dict):
        if len(v) == 1 and isinstance(v.get("tensor"), int):
            yield path, v["tensor"]
            return
        if len(v) == 1 and isinstance(v.get("dict"), list):
            for kv in v["dict"]:
                if isinstance(kv, list) and len(kv) == 2:
                    k = kv[0] if isinstance(kv[0], (str, int)) else _short(kv[0])
                    yield from _tagged_tensors(kv[1], f"{path}.{k}" if path else str(k))
            return
        for k, x in v.items():
            yield from _tagged_tensors(x, path)
    elif isinstance(v, list):
        for i, x in enumerate(v):
            yield from _tagged_tensors(x, f"{path}[{i}]")


def _stored(entries, indices):
    """The entries holding the data of tensors ``indices``: a format 1.2 view
    holds none, its base does (counted once)."""
    return sorted({entries[i]["view"]["base"] if "view" in entries[i] else i for i in indices})


def tensor_names(header):
    """``{name: tensor index}`` of the model's own tensors: state-dict style
    names (``"fc1.weight"``) for modules, value paths for other archives;
    example inputs/outputs and metadata are not included."""
    mods, names = header["modules"], {}
    root = header["root"]

    def walk(i, prefix, seen):
        m = mods[i]
        for field in ("tensors", "parameters", "buffers"):
            for k, t in sorted((m.get(field) or {}).items()):
                names.setdefault(prefix + k, t)
        for path, t in _tagged_tensors(m.get("attrs"), ""):
            names.setdefault(prefix + path, t)
        for child, j in m.get("children", []):
            if j not in seen:
                walk(j, f"{prefix}{child}.", seen | {j})
    if isinstance(root, dict) and isinstance(root.get("module"), int):
        walk(root["module"], "", frozenset([root["module"]]))
    else:
        for path, t in _tagged_tensors(root, ""):
            names.setdefault(path or "<root>", t)
    return names


def _example_shapes(v, tensors):
    """``[{"dtype", "shape"}]`` of the tensors in a stored example value, in order."""
    return [{"dtype": tensors[i]["dtype"], "shape": tensors[i]["shape"]}
            for _, i in _tagged_tensors(v, "") if 0 <= i < len(tensors)]


def _root_kind(header):
    r = header["root"]
    if isinstance(r, dict) and "module" in r:
        m = header["modules"][r["module"]]
        return f"{m.get('kind')} module {m.get('name') or m.get('type')}"
    if isinstance(r, dict) and "tensor" in r:
        return "tensor"
    if isinstance(r, dict) and len(r) == 1 and next(iter(r)) in ("dict", "list", "tuple"):
        tag, items = next(iter(r.items()))
        return f"{tag} of {len(items)}" if isinstance(items, list) else tag
    return "value"


def _walk_modules(header):
    """``(depth, name, index)`` of every module from the root, depth first
    (a module met again is listed, not entered again)."""
    mods, r = header["modules"], header["root"]
    if not (isinstance(r, dict) and "module" in r):
        return

    def walk(i, name, depth, seen):
        yield depth, name, i
        if i not in seen:
            for child, j in mods[i].get("children", []):
                yield from walk(j, child, depth + 1, seen | {i})
    yield from walk(r["module"], "", 0, frozenset())


def _describe(m, full=False):
    """A module's name or type, with a builtin's config (values cut short
    for people unless ``full``: diff compares them whole)."""
    desc = m.get("name") if m.get("kind") == "traced" else m.get("type", "").rsplit(".", 1)[-1]
    if m.get("kind") == "builtin":
        shown = _compact if full else _short
        desc += "(" + ", ".join(f"{k}={shown(v)}" for k, v in m.get("config", {}).items()) + ")"
    return desc


def _compact(v):
    """A header value as compact JSON text (NaN as "NaN": equal to itself)."""
    import json
    return json.dumps(v, separators=(",", ":"), default=repr)


def _module_tree(header):
    """``[[depth, name, description], ...]`` of the module tree from the root."""
    mods = header["modules"]
    return [[depth, name, _describe(mods[i])] for depth, name, i in _walk_modules(header)]


def _module_kinds(header):
    """``{"layer1.0.conv1": "builtin Conv2d(...)"}``: each module's full path
    with its kind (builtin, container, traced), type or name, and for traced
    modules what they read like (a sequence or dict: TracedSequence,
    TracedDict), so diff sees a container that became a plain module."""
    mods, out, stack = header["modules"], {}, []
    for depth, name, i in _walk_modules(header):
        del stack[depth:]
        stack.append(name)
        m = mods[i]
        reads = m.get("reads_as")
        out[".".join(p for p in stack if p)] = (
            f"{m.get('kind')} {_describe(m, full=True)}" + (f" (reads as a {reads})" if reads else ""))
    return out


def _module_attrs(header):
    """``{path: attributes as compact text}`` of the traced modules (plain
    values a forward may read: ``self.k``), tensors by dtype and shape (their
    values are the model's tensors, compared by name)."""
    mods, out, stack = header["modules"], {}, []
    for depth, name, i in _walk_modules(header):
        del stack[depth:]
        stack.append(name)
        attrs = mods[i].get("attrs")
        if mods[i].get("kind") == "traced" and attrs:
            out[".".join(p for p in stack if p)] = _compact(_by_shape(attrs, header))
    return out


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
        outs = [desc(i) for i in g.get("outputs", [])]
        for d, where in zip(outs, _slot_paths(g.get("out_def"))):
            if where:
                d["where"] = where            # e.g. "['logits']" for a dict output
        out.append({"inputs": [desc(i) for i in g.get("inputs", [])[1:]], "outputs": outs})
    return out


def _slot_paths(tdef, prefix=""):
    """Accessors (``[0]``, ``['k']``) of the slots of a stored treedef, in
    order; '' for a single tensor. Malformed entries give no paths."""
    if not isinstance(tdef, dict) or not isinstance(tdef.get("children"), list):
        return []
    kind, aux = tdef.get("type"), tdef.get("aux")
    keys = aux.get("tuple") if isinstance(aux, dict) and isinstance(aux.get("tuple"), list) else None
    paths = []
    for i, c in enumerate(tdef["children"]):
        if kind == "root":
            step = ""
        elif kind in ("dict", "odict") and keys is not None and i < len(keys):
            step = f"[{keys[i]!r}]"
        else:
            step = f"[{i}]"
        if isinstance(c, dict) and c.get("slot") is True:
            paths.append(prefix + step)
        elif isinstance(c, dict) and "children" in c:
            paths += _slot_paths(c, prefix + step)
    return paths


def inspect_file(path, graph=False):
    """The summary of ``path`` (header only); with ``graph`` also the
    generated code (this loads the archive; when loading fails the summary
    still comes back, with ``code_error`` saying why).

    Raises:
        ArchiveError: the header is malformed or too new.
        OSError: the file cannot be read.
    """
    from mgtrace.errors import ArchiveError
    from mgtrace.serialization import read_header
    header = read_header(path)
    try:
        summary = summarize(header)
    except (KeyError, IndexError, TypeError, ValueError) as e:   # odd but schema-valid header
        raise ArchiveError(f"cannot summarize the header ({type(e).__name__}: {e})") from e
    out = {"path": path, "file_bytes": os.path.getsize(path), **summary}
    if graph:
        import io
        from mgtrace.serialization import load
        from mgtrace.traced_module import TracedModule
        try:
            obj = load(path)
        except ArchiveError as e:
            out["code_error"] = f"{type(e).__name__}: {e}"
        else:
            if isinstance(obj, TracedModule):
                buf = io.StringIO()
                obj.print_readable(file=buf)
                out["code"] = buf.getvalue()
            else:
                out["code_error"] = f"the archive holds a {type(obj).__name__}, not a traced module"
    return out


# ----------------------------------------------------------------- verify
def _leaves(v):
    from mgtrace._core import Tensor
    from mgtrace.traced_module.pytree import tree_flatten
    return tree_flatten(v, lambda x: isinstance(x, Tensor))


def compare_outputs(got, want, rtol=1e-5, atol=1e-6):
    """``(ok, max_abs_error, reason)`` comparing two output pytrees.

    An integer or bool output matches when it is equal. A float output
    matches when NaN and infinities sit at the same places and ``max |got -
    want| <= atol + rtol * max |want|`` over its finite values: a tolerance
    relative to the output's scale, not to each
    element's (NumPy's ``allclose``). Float32 rounding in a network's sums
    grows with the magnitudes summed, so a release that sums in another
    order (another conv algorithm) moves a near-zero element of an output
    whose values reach 1e5 by about 1e-6 of 1e5, which an elementwise rule
    would call a mismatch."""
    (ga, gdef), (wa, wdef) = _leaves(got), _leaves(want)
    if gdef != wdef and repr(gdef) != repr(wdef):     # (a float('nan') leaf is not == itself)
        return False, None, f"output structure differs: {gdef} vs {wdef}"
    worst = 0.0
    for i, (g, w) in enumerate(zip(ga, wa)):
        g, w = g.numpy(), w.numpy()
        if g.shape != w.shape or g.dtype != w.dtype:
            return False, None, f"output {i}: {g.shape} {g.dtype} vs {w.shape} {w.dtype}"
        if not g.size:
            continue
        if g.dtype.kind in "biu":       # integers and bools have no rounding: equal or not
            if not np.array_equal(g, w):
                return False, None, f"output {i} differs: {int(np.sum(g != w))} of {g.size} elements"
            continue
        gf, wf = g.astype(np.float64), w.astype(np.float64)
        fin = np.isfinite(wf)
        if not np.array_equal(np.isfinite(gf), fin) or not np.array_equal(gf[~fin], wf[~fin], equal_nan=True):
            return False, None, f"output {i}: NaN or infinities at other places than the stored output's"
        err = float(np.abs(gf[fin] - wf[fin]).max()) if fin.any() else 0.0
        scale = float(np.abs(wf[fin]).max()) if fin.any() else 0.0
        worst = max(worst, err)
        if not err <= atol + (rtol * scale if scale else 0.0):      # (rtol may be inf)
            return False, worst, (f"output {i} differs: max abs error {err:.3g} > atol {atol} + rtol {rtol} "
                                  f"x max |output| {scale:.3g}")
    return True, worst, ""


def _on(v, device):
    """The tensors of pytree ``v`` moved to ``device`` (None: left where they are)."""
    from mgtrace._core import Tensor
    if device is None:
        return v
    if isinstance(v, Tensor):
        return v.to(device)
    if isinstance(v, tuple) and hasattr(v, "_fields"):
        return type(v)(*(_on(x, device) for x in v))
    if isinstance(v, (tuple, list)):
        return type(v)(_on(x, device) for x in v)
    if isinstance(v, dict):
        return {k: _on(x, device) for k, x in v.items()}
    return v


def _run_examples(obj, inputs, kwargs=None, device=None):
    """obj(*inputs, **kwargs), the inputs on ``device`` (None: where they
    are); obj is already there (load(device=...) placed it)."""
    args = _on(inputs if isinstance(inputs, tuple) else (inputs,), device)
    return obj(*args, **_on(kwargs or {}, device))


def verify_file(path, rtol=1e-5, atol=1e-6, device=None):
    """Checksums, schema, load, and stored examples re-run (on ``device``,
    default the CPU) and compared.

    The archive is loaded memory-mapped, every checksum verified: the
    tensors are the file's pages, with no copy of the weights to allocate
    and fill, and not offered to conv2d's cache of packed weights (run
    once, the convolutions that need no packing are several times faster:
    reader._load_archive). A module whose call writes its own tensors (a
    BatchNorm in training mode updates its running statistics) cannot run
    on read-only ones: it is loaded again, copied, and run on that (so is
    one whose call fails writing to a read-only tensor)."""
    from mgtrace.serialization import load_archive
    from mgtrace.serialization.reader import _load_archive
    from mgtrace.module import Module
    arc = _load_archive(path, mmap=True, verify=True, device=device, run_once=True)
    out = {"status": "ok", "reason": "", "format_version": ".".join(map(str, arc.format_version))}
    if arc.example_inputs is None:
        out["examples"] = "none stored"     # loaded and checksummed; nothing to run
        return out
    if not isinstance(arc.obj, Module):
        return {"status": "failed", "reason": "examples stored for an object that is not a module"}
    if any(m.training for m in arc.obj.modules()):
        arc = load_archive(path, verify=True, device=device)
    try:
        got = _run_examples(arc.obj, arc.example_inputs, arc.example_kwargs, device)
    except ValueError as e:       # a module that writes a buffer in place, even in eval mode
        if "read-only" not in str(e):
            raise
        arc = load_archive(path, verify=True, device=device)
        got = _run_examples(arc.obj, arc.example_inputs, arc.example_kwargs, device)
    ok, err, reason = compare_outputs(got, arc.example_outputs, rtol, atol)
    out.update(examples="checked", max_abs_error=err)
    if not ok:
        out.update(status="failed", reason=reason)
    return out


# ------------------------------------------------------------------- diff
def diff_files(a, b):
    """What differs between archives ``a`` and ``b``.

    Compares the header summaries (format, producer, parameters, inputs and
    outputs), the module tree (builtin configs whole, traced modules'
    attributes), each traced graph's exprs with their arguments (constant
    tensors by value), op versions and call counts, metadata (with the
    values of tensors in it), the stored
    example inputs, kwargs and outputs (structure, then each tensor's
    values), and the model's tensors by name (shape, dtype, and the largest
    absolute difference). NaN and inf at the same places are equal. Reads
    the tensors straight from the files (checksums checked), so archives
    that name unregistered functions can be compared too.

    Returns:
        ``{"a", "b", "same": bool, "changes": [{"what", "a", "b"}, ...]}``;
        a tensor whose values differ also has ``"max_abs_diff"`` (over the
        places finite in both) and, when NaN or inf sit at other places,
        ``"nonfinite_mismatches"`` (how many).

    Raises:
        ArchiveError: either archive is malformed, corrupted or too new.
        OSError: a file cannot be read.
    """
    ha, hb = _header_of(a), _header_of(b)
    sa, sb = summarize(ha), summarize(hb)
    changes = []

    def change(what, va, vb, **extra):
        changes.append({"what": what, "a": va, "b": vb, **extra})
    for key in ("format_version", "min_reader_version", "producer", "root", "parameters", "bytes"):
        if sa[key] != sb[key]:
            change(key, sa[key], sb[key])
    if sa["signature"] != sb["signature"]:
        change("inputs/outputs", _sig_text(sa["signature"]), _sig_text(sb["signature"]))
    ra, rb = _module_kinds(ha), _module_kinds(hb)
    for k in sorted(set(ra) | set(rb), key=lambda p: (p.count("."), p)):
        if ra.get(k) != rb.get(k):
            change(f"module {k or '<root>'}", ra.get(k), rb.get(k))
    aa, ab = _module_attrs(ha), _module_attrs(hb)
    for k in sorted(set(aa) | set(ab), key=lambda p: (p.count("."), p)):
        if ra.get(k) == rb.get(k) and aa.get(k) != ab.get(k):     # (a changed module is shown above)
            change(f"module {k or '<root>'} attributes", aa.get(k), ab.get(k))
    ga, gb = _graph_exprs(ha), _graph_exprs(hb)
    for k in sorted(set(ga) | set(gb)):
        ea, eb = ga.get(k), gb.get(k)
        if ea is None or eb is None:
            change(f"graph {k}", None if ea is None else f"{len(ea)} exprs",
                   None if eb is None else f"{len(eb)} exprs")
        elif ea != eb:
            i = next((i for i, (x, y) in enumerate(zip(ea, eb)) if x != y), min(len(ea), len(eb)))
            at = lambda e: e[i] if i < len(e) else "(end)"       # noqa: E731
            change(f"graph {k}", f"{len(ea)} exprs", f"{len(eb)} exprs",
                   first_difference=f"expr {i}: {at(ea)} -> {at(eb)}")
    for name in sorted(set(sa["op_versions"]) | set(sb["op_versions"])):
        va, vb = sa["op_versions"].get(name), sb["op_versions"].get(name)
        if va != vb:
            change(f"op {name} version", va, vb)
    for name in sorted(set(sa["ops"]) | set(sb["ops"])):
        ca, cb = sa["ops"].get(name, 0), sb["ops"].get(name, 0)
        if ca != cb:
            change(f"calls of {name}", ca, cb)
    _value_changes("metadata", (a, ha, ha.get("metadata")), (b, hb, hb.get("metadata")), change)
    ea, eb = ha.get("examples"), hb.get("examples")
    if (ea is None) != (eb is None):
        change("examples", _ex_text(sa["examples"]), _ex_text(sb["examples"]))
    elif ea is not None:
        for part in sorted(set(ea) | set(eb)):          # inputs, kwargs, outputs
            _value_changes(f"example {part}", (a, ha, ea.get(part)), (b, hb, eb.get(part)), change)
    ca, cb = _graph_constants(ha), _graph_constants(hb)
    if [w for w, _ in ca] == [w for w, _ in cb]:          # else the graphs differ, shown above
        for (what, _), x, y in zip(ca, _read_raw(a, ha, ca), _read_raw(b, hb, cb)):
            _array_change(f"{what} tensor", x, y, change)
    ta, tb = _raw_tensors(a, ha), _raw_tensors(b, hb)
    for k in sorted(set(ta) | set(tb)):
        _array_change(f"tensor {k}", ta.get(k), tb.get(k), change)
    return {"a": a, "b": b, "same": not changes, "changes": changes}


def _value_changes(what, side_a, side_b, change):
    """Changes between two stored values (metadata, an example's inputs):
    first their structure with each tensor's dtype and shape (value_json's
    encoding, NaN equal to NaN), then, where that is the same, each tensor's
    values in order."""
    from mgtrace.cli import value_json
    from mgtrace import _json
    (pa, ha, va), (pb, hb, vb) = side_a, side_b
    ja, jb = (None if v is None else _json.plain(value_json.to_json(value_json.decode_header_value(v, h)))
              for v, h in ((va, ha), (vb, hb)))
    typed_diffs = [] if va is None or vb is None else value_json.differences(
        value_json.decode_header_value(va, ha), value_json.decode_header_value(vb, hb))
    if ja != jb or typed_diffs:                # (typed: "nan" and nan, 1 and True show alike)
        shown = [f"{p or '<root>'}: {x} -> {y}" for p, x, y in typed_diffs]
        change(what, ja, jb, **({"differences": shown} if shown else {}))
        return
    ra, rb = list(_tagged_tensors(va, "")), list(_tagged_tensors(vb, ""))
    xa = _read_raw(pa, ha, ra)
    xb = _read_raw(pb, hb, rb)
    for (where, _), x, y in zip(ra, xa, xb):
        _array_change(f"{what} {where or '<root>'}", x, y, change)


def _array_change(what, x, y, change):
    """Records a change when arrays ``x`` and ``y`` (either None: absent)
    differ. NaN and infinities at the same places are equal; values that
    differ report ``max_abs_diff`` over the places finite in both, and
    ``nonfinite_mismatches``, the places where NaN or inf differ."""
    if x is None or y is None or x.shape != y.shape or x.dtype != y.dtype:
        change(what, _desc(x), _desc(y))
        return
    if x.dtype.kind in "biu":                               # exactly: float64 would round int64
        _int_change(what, x, y, change)
        return
    xf, yf = x.astype(np.float64), y.astype(np.float64)  # bfloat16 too
    same = (xf == yf) | (np.isnan(xf) & np.isnan(yf))
    if same.all():
        return
    fin = np.isfinite(xf) & np.isfinite(yf)
    extra = {"max_abs_diff": float(np.max(np.abs(xf[fin] - yf[fin]))) if fin.any() else 0.0}
    n = int(np.count_nonzero(~fin & ~same))
    if n:
        extra["nonfinite_mismatches"] = n
    change(what, _desc(x), _desc(y), **extra)


def _int_change(what, x, y, change):
    """_array_change for bool and integer arrays: equal only when every
    element is; ``max_abs_diff`` in Python ints over the differing places
    (int64 - int64 can overflow, and float64 rounds above 2**53)."""
    differ = x != y
    if not differ.any():
        return
    p, q = x[differ], y[differ]
    if x.dtype.itemsize < 8:                 # int64 holds every difference of narrower ints
        d = int(np.max(np.abs(p.astype(np.int64) - q.astype(np.int64))))
    else:
        d = max(abs(a - b) for a, b in zip(p.tolist(), q.tolist()))
    change(what, _desc(x), _desc(y), max_abs_diff=d)


def _header_of(path):
    from mgtrace.errors import ArchiveError
    from mgtrace.serialization import read_header
    try:
        return read_header(path)
    except ArchiveError as e:
        raise type(e)(f"{path}: {e}") from e


def _sig_text(sig):
    if not sig:
        return None
    port = lambda p: f"{p.get('dtype')}{p.get('shape')}" if "shape" in p else str(p.get("kind"))  # noqa: E731
    return "; ".join(f"({', '.join(map(port, g['inputs']))}) -> ({', '.join(map(port, g['outputs']))})"
                     for g in sig)


def _ex_text(ex):
    if ex is None:
        return None
    shapes = lambda v: ", ".join(f"{t['dtype']}{t['shape']}" for t in v)  # noqa: E731
    return f"({shapes(ex['inputs'])}) -> ({shapes(ex['outputs'])})"


def _graphs(header):
    """``(key, graph)`` of every traced graph, key "Qualname" or "Qualname#k"."""
    for m in header["modules"]:
        if m.get("kind") != "traced":
            continue
        for k, g in enumerate(m.get("graphs", [])):
            key = m.get("qualname") or m.get("name") or "?"
            yield (key if k == 0 else f"{key}#{k + 1}"), g


def _graph_constants(header):
    """``[(what, tensor index), ...]`` of the tensors the graphs' exprs hold
    (constants, tensor arguments), in graph and expr order."""
    return [(f"graph {key} expr {i}{' ' + where if where else ''}", t)
            for key, g in _graphs(header) for i, e in enumerate(g.get("exprs", []))
            for where, t in _tagged_tensors({k: e.get(k) for k in ("value", "args", "kwargs", "params")}, "")]


def _graph_exprs(header):
    """``{"Qualname" or "Qualname#k": [expr description, ...]}`` of every traced graph."""
    return {key: [_expr_text(e, header) for e in g.get("exprs", [])] for key, g in _graphs(header)}


def _expr_text(e, header):
    """One expr as diff compares it: its kind, what it calls, its arguments."""
    kind, ops = e.get("kind"), header["ops"]
    if kind == "call_function":
        op = e.get("op")
        name = ops[op]["name"] if isinstance(op, int) and 0 <= op < len(ops) else op
        return f"call {name}{_expr_args(e, header)}"
    if kind == "call_method":
        return f"method {e.get('method')} of %{e.get('self')}{_expr_args(e, header)}"
    if kind == "apply":
        return f"apply {e.get('op')}{_expr_args(e, header)}"
    if kind in ("getattr", "input"):
        return f"{kind} {e.get('name')}"
    if kind == "constant":
        return f"constant {_compact(_by_shape(e.get('value'), header))}"
    return f"{kind}{_expr_args(e, header)}"


def _expr_args(e, header):
    """An expr's arguments as compact text, constants included (x * 2 and
    x * 3 differ), nodes by their id in the graph, tensors by dtype and
    shape (diff compares their values apart)."""
    args = e.get("args")
    text = "" if args is None else " " + _compact(_by_shape(args, header))
    for k in ("kwargs", "params"):
        text += " " + _compact(_by_shape(e[k], header)) if e.get(k) else ""
    return text


def _by_shape(v, header):
    """Tagged value ``v`` with each ``{"tensor": i}`` as ``{"tensor": "float32[2, 3]"}``:
    the same whatever the tensor's place in the table."""
    if isinstance(v, dict):
        if len(v) == 1 and isinstance(v.get("tensor"), int):
            rows = header["tensors"]
            t = rows[v["tensor"]] if 0 <= v["tensor"] < len(rows) else {}
            return {"tensor": f"{t.get('dtype')}{t.get('shape')}"}
        return {k: _by_shape(x, header) for k, x in v.items()}
    if isinstance(v, list):
        return [_by_shape(x, header) for x in v]
    return v


def _np_dtype(name):
    if name == "bfloat16":
        import ml_dtypes
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def _raw_tensors(path, header):
    """``{name: read-only array}`` of the model's tensors (see
    :func:`tensor_names`), read straight from the file with checksums
    checked; no name in the archive is resolved, nothing is constructed."""
    entries = header["tensors"]
    named = [(n, i) for n, i in tensor_names(header).items()
             if isinstance(i, int) and 0 <= i < len(entries)]
    return dict(zip((n for n, _ in named), _read_raw(path, header, named)))


def _read_raw(path, header, named):
    """The arrays of ``named`` (``[(name, tensor index), ...]``, names for
    error messages) read from ``path``, checksums checked; None for an index
    outside the tensor table."""
    from mgtrace.serialization import tensors as T
    from mgtrace.serialization.layout import PREFIX, data_start
    entries, out = header["tensors"], []
    with open(path, "rb") as f:
        _, hlen = PREFIX.unpack(f.read(PREFIX.size))
        start = data_start(hlen)
        for name, i in named:
            if not (isinstance(i, int) and 0 <= i < len(entries)):
                out.append(None)
                continue
            e = entries[i]
            view = e.get("view")          # format 1.2: a view of its base's elements
            base = entries[view["base"]] if view else e
            f.seek(start + base["offset"])
            buf = f.read(base["nbytes"])
            T.verify(buf, base, f"{path}: header.tensors[{view['base'] if view else i}] ({name})")
            arr = np.frombuffer(buf, dtype=_np_dtype(e["dtype"]))
            if view:
                arr = np.lib.stride_tricks.as_strided(
                    arr[view["offset"]:], e["shape"], [s * arr.itemsize for s in view["strides"]],
                    writeable=False)
            out.append(arr.reshape(e["shape"]))
    return out


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


class _Rejected(Exception):
    """The new archive failed its check: the temporary file goes, nothing is replaced."""

    def __init__(self, err, reason):
        super().__init__(reason)
        self.err, self.reason = err, reason


def _file_state(path):
    """What says that file ``path`` was rewritten: (device, inode, size, mtime)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:       # removed
        return None
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def _write_checked(obj, dest, metadata, inputs, want, rtol, atol, kwargs=None, device=None,
                   read_as=None):
    """Save to a temporary file beside ``dest`` (see
    :func:`mgtrace.serialization.atomic.replacing`), reload it, check its
    examples against ``want`` (or, without examples, its tensors against
    ``obj``'s), then rename it over ``dest`` (through a symbolic link, which
    stays); returns ``(max error, reason)``, reason empty on success. The
    new file gets the permissions of the file it replaces (else the
    umask's); the temporary file is removed on any failure, Ctrl-C included.
    ``read_as``: ``dest``'s :func:`_file_state` when the job read it (in
    place); a ``dest`` another process rewrote since is left as that process
    wrote it (renaming over it would put the old model back)."""
    from mgtrace.serialization import save
    from mgtrace.serialization.atomic import replacing
    os.makedirs(os.path.dirname(os.path.abspath(dest)), exist_ok=True)
    try:
        with replacing(dest) as (out, tmp):
            try:
                save(obj, out, metadata=metadata, example_inputs=inputs,
                     example_kwargs=kwargs or None)
                out.flush()
                err = _check_written(tmp, obj, inputs, want, rtol, atol, device)
                if read_as is not None and _file_state(dest) != read_as:
                    raise _Rejected(None, "the archive was rewritten by another process while "
                                          "this job rewrote it: it is left as that process wrote "
                                          "it; run the job again to rewrite the new one")
                return err, ""
            except Exception as e:  # say the file asked for, not the temporary one beside it
                raise _naming(e, tmp, dest) from None
    except _Rejected as r:
        return r.err, r.reason
    except OSError as e:            # the rename, or the temporary file itself
        raise _naming(e, None, dest) from None


def _check_written(tmp, obj, inputs, want, rtol, atol, device=None):
    """The max error of the archive at ``tmp`` (run on ``device``) against
    ``want``; raises :class:`_Rejected` when it does not reproduce it."""
    from mgtrace.serialization import load_archive
    arc = load_archive(tmp, device=device)
    if inputs is None:       # nothing to run: the tensors must come back unchanged
        a, b = _state(obj), _state(arc.obj)
        if a.keys() != b.keys() or any(not np.array_equal(a[k], b[k], equal_nan=True) for k in a):
            raise _Rejected(None, "the new archive does not hold the same tensors")
        return None
    got = _run_examples(arc.obj, arc.example_inputs, arc.example_kwargs, device)
    ok, err, reason = compare_outputs(got, want, rtol, atol)
    if not ok:
        raise _Rejected(err, f"the new archive does not reproduce the stored outputs: {reason}")
    return err


def _newer_than_us(arc):
    """A "skipped" result when archive ``arc`` is of a newer format than this
    mgtrace writes, else None: rewriting it would drop what this reader does
    not know (optional fields of the newer minor), so it is left as it is."""
    from mgtrace.serialization import FORMAT_VERSION
    if arc.format_version <= tuple(FORMAT_VERSION):
        return None
    v, ours = ".".join(map(str, arc.format_version)), ".".join(map(str, FORMAT_VERSION))
    by = f"{arc.producer.get('library')} {arc.producer.get('version')}"
    return {"status": "skipped", "from": v,
            "reason": f"newer than this mgtrace, left as it is: format {v} (written by {by}) may "
                      f"hold fields that a format {ours} writer would drop; use that mgtrace or a "
                      "newer one"}


def _naming(e, tmp, dest):
    """Exception ``e`` raised while writing ``tmp`` for ``dest``, saying ``dest``."""
    said = f"cannot write {dest}: "
    if isinstance(e, OSError):
        if (e.strerror or "").startswith(said):
            return e
        text = said + str(e.strerror or e)
        return OSError(e.errno, text) if e.errno is not None else OSError(text)
    text = str(e)
    if tmp and tmp in text and e.args == (text,):
        e.args = (text.replace(tmp, dest),)
    return e


def upgrade_file(path, out=None, in_place=False, roots=(), rtol=1e-5, atol=1e-6, device=None):
    """Rewrite ``path`` in the current format (see :func:`destination`);
    the new file must reproduce the stored example outputs first (run on
    ``device``, default the CPU). An
    archive of a newer format than this mgtrace writes is never rewritten:
    its result is ``"skipped"``, naming the versions."""
    from mgtrace.serialization import load_archive
    from mgtrace.serialization.version import is_current
    dest = destination(path, out, in_place, roots)
    read_as = _file_state(path) if in_place else None
    arc = load_archive(path, device=device)
    newer = _newer_than_us(arc)
    if newer:
        return newer
    old = ".".join(map(str, arc.format_version))
    if in_place and is_current(arc.format_version):       # save would write it as it is
        return {"status": "ok", "reason": "", "from": old, "output": dest, "note": "already current"}
    err, reason = _write_checked(arc.obj, dest, arc.metadata, arc.example_inputs,
                                 arc.example_outputs, rtol, atol, kwargs=arc.example_kwargs,
                                 device=device, read_as=read_as)
    if reason:
        return {"status": "failed", "reason": reason, "from": old}
    return {"status": "ok", "reason": "", "from": old, "output": dest, "max_abs_error": err}


_USER_CODE = {}      # spec -> module: a worker imports or runs each once


def load_user_code(spec, what="--import"):
    """The module named by ``spec``: ``"package.module"`` (imported) or
    ``"path/to/file.py"`` (run as a module from its source, once per process;
    no bytecode cache is read or written). This is how the command runs the
    user's own code: the script that registers their functions and module
    types (``--import``), or the one that makes example inputs (``--inputs``).

    Raises:
        ValueError: no such file or module, or it fails to import (the
            message names ``what`` and the error).
    """
    if spec in _USER_CODE:
        return _USER_CODE[spec]
    if not isinstance(spec, str) or not spec:
        raise ValueError(f"{what} takes a module name or a FILE.py, got {spec!r}")
    try:
        if spec.endswith(".py"):
            if not os.path.isfile(spec):
                raise ValueError(f"{what} {spec}: no such file")
            mod = _run_script(spec)
        else:
            if os.getcwd() not in sys.path and "" not in sys.path:
                sys.path.insert(0, os.getcwd())   # as `python -c` would: a module in this folder
            mod = importlib.import_module(spec)
    except ValueError:
        raise
    except Exception as e:
        raise ValueError(f"{what} {spec}: importing it failed: {type(e).__name__}: {e}") from e
    _USER_CODE[spec] = mod
    return mod


def _run_script(path):
    """Run the user's script ``path`` as a new module and return it.

    Compiled from its source text every time: an import through the file
    loader would read a ``__pycache__`` .pyc that is checked only against the
    source's mtime (whole seconds) and size, so a script rewritten within the
    same second at the same size would run its old code; it would also write
    ``__pycache__`` into the user's folder.
    """
    name = "_mgtrace_user_" + os.path.splitext(os.path.basename(path))[0]
    with open(path, "rb") as f:
        source = f.read()
    code = compile(source, path, "exec", dont_inherit=True)
    mod = importlib.util.module_from_spec(importlib.util.spec_from_loader(name, None, origin=path))
    mod.__file__ = path
    sys.modules[name] = mod          # as an import does: dataclasses and pickling look it up
    try:
        exec(code, mod.__dict__)     # the user's own script, named on the command line
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return mod


def load_inputs_provider(spec):
    """The function named by ``spec``: ``"path/to/file.py:fn"`` or
    ``"package.module:fn"``; it is called as ``fn(path, module)`` (the
    archive's path and the loaded module) and returns the example inputs for
    that archive: a tuple of positional arguments, or one tensor. A script is
    run once per process.

    Raises:
        ValueError: ``spec`` has no ``:FUNCTION`` part, the file or module
            does not exist or fails to import, or it has no such function.
    """
    where, sep, fn_name = spec.rpartition(":") if isinstance(spec, str) else ("", "", "")
    if not sep or not where or not fn_name:
        raise ValueError(f"--inputs takes FILE.py:FUNCTION or MODULE:FUNCTION, got {spec!r}")
    mod = load_user_code(where, f"--inputs {spec}:")
    fn = getattr(mod, fn_name, None)
    if not callable(fn):
        raise ValueError(f"--inputs {spec}: {where} has no function {fn_name!r}")
    return fn


def _what_is(obj):
    """``obj`` in a few words: "a dict of 2 tensors (a state dict)", "a tensor"."""
    from mgtrace._core import Tensor
    if isinstance(obj, Tensor):
        return f"a tensor {obj.dtype}{list(obj.shape)}"
    if isinstance(obj, dict) and obj and all(isinstance(v, Tensor) for v in obj.values()):
        return f"a dict of {len(obj)} tensor{'' if len(obj) == 1 else 's'} (a state dict)"
    return f"a {type(obj).__name__}"


def retrace_file(path, out=None, in_place=False, roots=(), inputs=None, rtol=1e-5, atol=1e-6,
                 device=None):
    """Load ``path``, trace it again with this library on its stored example
    inputs, check the new module against the old one (and the old one
    against its stored outputs), and save it with those inputs as its
    examples (see :func:`destination` for where). An archive of a newer
    format than this mgtrace writes, and one that holds no module (a state
    dict, tensors), is left as it is ("skipped").

    ``inputs`` (a spec for :func:`load_inputs_provider`) gives example inputs
    for archives that have none stored; archives with stored examples use
    theirs. ``device``: where the module is loaded, traced and run (default
    the CPU).
    """
    import mgtrace
    from mgtrace.serialization import load_archive
    from mgtrace.module import Module
    dest = destination(path, out, in_place, roots)
    read_as = _file_state(path) if in_place else None
    arc = load_archive(path, device=device)
    newer = _newer_than_us(arc)
    if newer:
        return newer
    if not isinstance(arc.obj, Module):      # a state dict or tensors: nothing is wrong with it
        return {"status": "skipped", "reason": f"holds {_what_is(arc.obj)}, not a module: nothing "
                                               "to retrace, left as it is"}
    args, source = arc.example_inputs, "stored"
    if args is None and inputs is not None:
        args, source = load_inputs_provider(inputs)(path, arc.obj), inputs
        if args is None:
            return {"status": "failed", "reason": f"--inputs {inputs} returned None for this archive"}
    if args is None:
        return {"status": "failed",
                "reason": "no example inputs stored; give --inputs FILE.py:FUNCTION to make some"}
    args = _on(args if isinstance(args, tuple) else (args,), device)
    kwargs = _on(arc.example_kwargs if source == "stored" else {}, device)
    want = arc.obj(*args, **kwargs)
    if arc.example_outputs is not None and source == "stored":
        ok, _, reason = compare_outputs(want, arc.example_outputs, rtol, atol)
        if not ok:
            return {"status": "failed",
                    "reason": f"the loaded module no longer gives the stored outputs: {reason}"}
    new = mgtrace.trace_module(arc.obj, *args, **kwargs)
    ok, err, reason = compare_outputs(new(*args, **kwargs), want, rtol, atol)
    if not ok:
        return {"status": "failed", "reason": f"the re-traced module differs: {reason}"}
    err, reason = _write_checked(new, dest, arc.metadata, args, want, rtol, atol, kwargs=kwargs,
                                 device=device, read_as=read_as)
    if reason:
        return {"status": "failed", "reason": reason}
    return {"status": "ok", "reason": "", "output": dest, "inputs": source, "max_abs_error": err}
