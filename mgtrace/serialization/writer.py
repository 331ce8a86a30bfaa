"""save(): encode an object into the header's tables, then write the file.

Same object, same bytes: the header is built in a fixed order from the
object's own order (dict insertion, module registration), and holds no
timestamps, paths or ids.
"""
import os

from mgtrace.module import Module
from mgtrace.serialization import header as H
from mgtrace.serialization import aliases, limits, tensors as T, unknown, values
from mgtrace.serialization.atomic import open_for_writing
from mgtrace.serialization.context import EncodeContext
from mgtrace.serialization.reader import Archive
from mgtrace.serialization.layout import PREFIX, align, data_start, pack_prefix
from mgtrace.serialization.version import FORMAT_NAME, FORMAT_VERSION, check_target

__all__ = ["save"]


def save(obj, f, *, metadata=None, example_inputs=None, example_kwargs=None,
         target_version=None):
    """Write ``obj`` to ``f`` as a ``.tmod`` archive (format in schema/, see README).

    Args:
        obj: a TracedModule (from :func:`mgtrace.trace_module`); a Tensor; a
            state dict (OrderedDict of name -> Tensor); a Module made of
            builtin modules and Sequential/ModuleList/ModuleDict; or tuples, lists,
            dicts (any hashable keys) of those and of None, bool, int, float,
            str, bytes, slices, Ellipsis, NumPy scalars, dtypes and devices.
        f: a path (written atomically: temporary file in the same folder,
            fsync, rename) or a writable binary file object.
        metadata: optional dict of user data (values as for ``obj``).
        example_inputs: optional positional arguments (a tuple, or one
            value; a list is taken as the arguments too, as ``trace_module(m,
            *example_inputs)`` would: ``[x]`` is ``(x,)``, and one list
            argument is given as ``([a, b],)``) for a Module ``obj`` (a
            TracedModule included); it is
            called on them as it is (call ``.eval()`` first: a BatchNorm in
            training mode would update, and save, its running statistics),
            and inputs and outputs (any values above, e.g. a dict of
            tensors) are stored; ``load_archive`` returns both, so a reader
            can check the model.
        example_kwargs: optional keyword arguments (a dict with str keys)
            for that call, e.g. ``{"scale": 3}`` for a module traced as
            ``trace_module(m, x, scale=3)``; stored beside the inputs.
        target_version: ``(major, minor)`` of the oldest reader that must
            read the file (default: this writer's FORMAT_VERSION). Optional
            newer fields (the 1.1 header checksum, ...) are left out for an
            older target; a feature the target cannot read raises.

    The header is sealed with a CRC-32 of its bytes (format 1.1), so a
    corrupted header is caught on load like corrupted tensor data.

    Tensors are stored contiguous, little-endian, 64-byte aligned, with a
    CRC-32 each; a tensor met twice (same storage, offset, shape, strides)
    is stored once, and tensors that view one storage (a buffer and a slice
    of it) are stored as views of one copy of it (format 1.2), which load
    gives back as views of one storage again. Parameters in a state dict come back as plain Tensors.
    A save holds no second copy of the weights: each tensor is written from
    its own memory (a non-contiguous or bfloat16 one through a copy of it
    alone); to a path, each is read once (its checksum computed as it is
    written, the header's checksums filled in after).

    Raises:
        TypeError: something in ``obj`` cannot be stored (the message gives
            its path; a Module that is neither builtin, a container nor
            traced gets "trace it first"; a traced module whose child,
            parameter or buffer is hidden by a TracedModule member, e.g. a
            child named ``flatten``, is refused); a function a graph calls
            is not registered (register_function); ``example_inputs`` or
            ``example_kwargs`` without a Module; ``metadata`` or
            ``example_kwargs`` not a dict (with str keys).
        ValueError: anything the reader would refuse, checked before a
            byte is written (the bounds of limits.py: values nested too
            deep, names too long, node names one identifier after NFKC,
            dict keys sharing a hash, tables too large..., with load's
            message); a ``target_version`` this writer does not write, or
            below a feature ``obj`` uses (the message names the feature;
            for tensors that share memory, two of them).
        OSError: the file cannot be written; a path target is then untouched.

    An :class:`~mgtrace.serialization.Archive` (what ``load_archive``
    returns) is written again as it was read: its object, its stored
    example inputs, outputs and keyword arguments (the model is not called)
    and its metadata. Saved at its own format version
    (``target_version=archive.format_version``), the archive is transcribed:
    its producer is kept too, so an unchanged writer gives the same bytes
    (schema/golden's re-save check); saved at another version, it is a new
    archive written by this mgtrace. ``metadata``, ``example_inputs`` and
    ``example_kwargs`` must then be None (TypeError otherwise). The fields
    this reader did not know (``archive.unknown_fields``: a newer minor's
    optional fields in the header, module and tensor entries) are written
    back where the archive is saved at its own version, which may then be a
    newer minor of this major; saved at another version they are left out,
    with a UserWarning naming them (mgtrace/serialization/unknown.py).

    >>> import io, mgtrace as mt
    >>> buf = io.BytesIO()
    >>> mt.save({"w": mt.tensor([1.0, 2.0]), "step": 3}, buf)
    >>> _ = buf.seek(0); mt.load(buf)
    {'w': Tensor([1., 2.], dtype=float32, device=cpu:0), 'step': 3}
    """
    if isinstance(obj, Archive) and _same(target_version, obj.format_version) and \
            obj.format_version[0] == FORMAT_VERSION[0]:
        target = obj.format_version     # a transcription, of a newer minor too (unknown.py)
    else:
        target = None if target_version is None else check_target(target_version)
    if isinstance(obj, Archive):
        header, tensors = _encode_archive(obj, metadata, example_inputs, example_kwargs, target)
    else:
        header, tensors = _encode(obj, metadata, example_inputs, example_kwargs, target)
    with open_for_writing(f) as out:
        if isinstance(f, (str, bytes, os.PathLike)):
            _write_one_pass(out, header, tensors)      # our own temporary file: seekable
        else:
            _write(out, header, tensors)


def _encode(obj, metadata, example_inputs, example_kwargs=None, target=None, kept=None):
    try:
        return _encode_values(obj, metadata, example_inputs, example_kwargs, target, kept)
    except values.UnstorableError as e:    # a TypeError (and mgtrace.Error) saying where
        e.saving = True
        raise


def _encode_archive(archive, metadata, example_inputs, example_kwargs, target):
    """The header and tensors of ``archive`` written again (see save)."""
    if metadata is not None or example_inputs is not None or example_kwargs is not None:
        raise TypeError("save(archive, ...) writes the archive's own metadata and examples; "
                        "metadata, example_inputs and example_kwargs must be None (save "
                        "archive.obj to give new ones)")
    kept = {"producer": archive.producer if target == archive.format_version else None,
            "format_version": list(archive.format_version)}
    if target == archive.format_version and (archive._carried is not None or
                                             target > FORMAT_VERSION):
        kept["carried"] = archive._carried or unknown.Carried({}, {}, {})
        kept["min_reader_version"] = archive.min_reader_version
    elif archive._carried is not None:
        unknown.warn_dropped(archive._carried, archive.format_version, target or FORMAT_VERSION)
    if archive.example_inputs is not None:
        kept["examples"] = (archive.example_inputs, archive.example_outputs,
                            archive.example_kwargs)
    return _encode(archive.obj, archive.metadata, None, None, target, kept)


def _encode_values(obj, metadata, example_inputs, example_kwargs, target, kept=None):
    """``kept``: what save(archive) keeps, ``{"producer": dict or None,
    "format_version": [major, minor], "examples": (inputs, outputs, kwargs),
    "carried": unknown.Carried, "min_reader_version": (major, minor)}``
    (the examples not re-run; the producer, and the unknown fields, only
    where the archive is written in its own format version again)."""
    import mgtrace
    carried = None if kept is None else kept.get("carried")
    ctx = EncodeContext(None if target is None else min(target, FORMAT_VERSION))
    root = ctx.value(obj, where="obj")
    examples = None
    if kept is not None and "examples" in kept:
        inputs, outputs, kwargs = kept["examples"]
        examples = {"inputs": ctx.value(inputs, where="example_inputs"),
                    "outputs": ctx.value(outputs, where="the example outputs")}
        if kwargs:
            examples["kwargs"] = {k: ctx.value(v, where=f"example_kwargs[{k!r}]")
                                  for k, v in kwargs.items()}
    elif example_inputs is not None or example_kwargs is not None:
        if not isinstance(obj, Module):
            raise TypeError(f"example_inputs needs a Module to call, got a {type(obj).__name__}")
        if example_kwargs is not None and not (isinstance(example_kwargs, dict)
                                               and all(isinstance(k, str) for k in example_kwargs)):
            raise TypeError("example_kwargs must be a dict with str keys (keyword arguments)")
        inputs = () if example_inputs is None else example_inputs
        if type(inputs) is list:        # [x]: the arguments, as a tuple (the docstring says so)
            inputs = tuple(inputs)
        inputs = inputs if isinstance(inputs, tuple) else (inputs,)
        kwargs = dict(example_kwargs or {})
        stored = ctx.value(inputs, where="example_inputs")
        examples = {"inputs": stored, "outputs": ctx.value(_example_call(obj, inputs, kwargs),
                                                         where="the example outputs")}
        if kwargs:
            examples["kwargs"] = {k: ctx.value(v, where=f"example_kwargs[{k!r}]")
                                  for k, v in kwargs.items()}
    if metadata is not None and not isinstance(metadata, dict):
        raise TypeError(f"metadata must be a dict, got {type(metadata).__name__}")
    meta = None if metadata is None else ctx.value(metadata, where="metadata")
    ctx._share_views(aliases.tensor_names(obj))      # before the version is read off ctx
    for table in ("ops", "modules", "tensors"):       # the reader's bounds, checked first
        limits.check_table(len(getattr(ctx, table)), table, ValueError)
    ctx._check_build()
    if carried is not None:             # the archive's own format, whatever this writer used
        ctx.allows(min(target, FORMAT_VERSION))
    sealed = ctx.allows(H.V1_1)         # last: every other feature has been noted
    producer = {"library": "mgtrace", "version": mgtrace.__version__}
    if kept is not None and kept["producer"] is not None and \
            kept["format_version"] == list(ctx.format_version):
        producer = kept["producer"]     # the same archive written again
    header = {"format": FORMAT_NAME, "format_version": list(ctx.format_version),
              "min_reader_version": list(ctx.min_reader_version),
              "producer": producer,
              "byteorder": "little", "ops": ctx.ops, "modules": ctx.modules,
              "tensors": None, "data_nbytes": None, "root": root}
    if examples is not None:
        header["examples"] = examples
    if meta is not None:
        header["metadata"] = meta
    if sealed:
        header[H.SEAL] = None       # placeholder; header.pack fills it in, last
    if carried is not None:
        header["format_version"] = list(target)
        header["min_reader_version"] = list(max(ctx.min_reader_version,
                                                tuple(kept["min_reader_version"])))
        header["producer"] = kept["producer"]
        # the tensor entries' fields by index, until the writer makes the table
        header["tensors"] = unknown.apply(header, ctx, carried)
    return header, ctx.tensors


def _example_call(module, inputs, kwargs):
    """``module(*inputs, **kwargs)``; a call without keywords of a module
    traced with some says to give them as ``example_kwargs``."""
    try:
        return module(*inputs, **kwargs)
    except TypeError as e:
        traced = None if kwargs else _traced_keywords(module)
        if not traced:
            raise
        raise TypeError(f"cannot save: the example call module(*example_inputs) failed ({e}); "
                        "the module was traced with keyword arguments: give them as "
                        f"save(..., example_kwargs={traced!r})") from e


def _traced_keywords(module):
    """``{name: value}`` of the arguments after the first that a traced
    module's first graph was traced with as constants other than their
    defaults (what ``trace_module(m, x, scale=3)`` fixes), else None."""
    sig, graphs = getattr(module, "_signature", None), getattr(module, "_graphs", None)
    if sig is None or not graphs or graphs[0]._in_def is None:
        return None
    leaves = graphs[0]._in_def.children
    params = list(sig.parameters.values())
    out = {p.name: c.const for p, c in zip(params[1:], leaves[1:])
           if not hasattr(c, "children") and not c.is_slot and c.const is not p.default
           and c.const != p.default}
    return out or None


def _carry_tensor_fields(table, carried):
    """``table`` with the unknown fields a transcription carries (``{index:
    fields}``, or None) added to its entries, after their own."""
    for j, fields in (carried or {}).items():
        for k, v in fields.items():
            table[j].setdefault(k, v)
    return table


def _same(target, version):
    try:
        return tuple(int(v) for v in target) == tuple(version)
    except (TypeError, ValueError):
        return False


def _pack(header):
    return H.pack(header, sealed=H.SEAL in header)


def _stored(tensors, table):
    """``(tensor, entry)`` of the entries that hold data (not views)."""
    return [(t, e) for t, e in zip(tensors, table) if not isinstance(t, aliases.View)]


def _write_one_pass(out, header, tensors):
    """Write with each tensor read once: the checksums are computed from the
    bytes as they are written, then the header (the same length: checksums
    are fixed-width) is written again over its placeholder. ``out`` must be
    seekable and not in append mode."""
    table, end = [], 0
    for t in tensors:
        if isinstance(t, aliases.View):
            table.append(aliases.view_entry(t))
            continue
        offset = align(end)
        nbytes = T.host_array(t).nbytes
        table.append({"dtype": t.dtype.name, "shape": list(t.shape), "offset": offset,
                      "nbytes": nbytes, "checksum": T.checksum(b"")})
        q = T.quant_entry(t)
        if q is not None:
            table[-1]["quant"] = q
        end = offset + nbytes
    header["tensors"], header["data_nbytes"] = _carry_tensor_fields(table, header["tensors"]), end
    packed = _pack(header)
    start = out.tell()
    out.write(pack_prefix(len(packed)))
    out.write(packed)
    out.write(bytes(data_start(len(packed)) - len(packed) - PREFIX.size))
    pos = 0
    for t, e in _stored(tensors, table):
        out.write(bytes(e["offset"] - pos))
        data = T.array_bytes(T.host_array(t))
        e["checksum"] = T.checksum(data)
        out.write(data)
        pos = e["offset"] + e["nbytes"]
    final = _pack(header)
    if len(final) != len(packed):       # cannot happen: every checksum has the same width
        raise RuntimeError("the header changed length while its checksums were filled in")
    out.seek(start + PREFIX.size)
    out.write(final)
    out.seek(0, os.SEEK_END)


def _write(out, header, tensors):
    table, end = [], 0
    for t in tensors:          # one tensor's host copy at a time, at most
        if isinstance(t, aliases.View):
            table.append(aliases.view_entry(t))
            continue
        offset = align(end)
        table.append(T.entry_for(t, offset, T.host_array(t)))
        end = offset + table[-1]["nbytes"]
    header["tensors"], header["data_nbytes"] = _carry_tensor_fields(table, header["tensors"]), end
    packed = _pack(header)
    out.write(pack_prefix(len(packed)))
    out.write(packed)
    pos = data_start(len(packed))
    out.write(bytes(pos - len(packed) - PREFIX.size))
    pos = 0
    for i, (t, e) in enumerate(_stored(tensors, table)):
        out.write(bytes(e["offset"] - pos))
        data = T.array_bytes(T.host_array(t))
        if T.checksum(data) != e["checksum"]:
            raise RuntimeError(f"tensor {i} {tuple(t.shape)} changed while it was being saved")
        out.write(data)
        pos = e["offset"] + e["nbytes"]
