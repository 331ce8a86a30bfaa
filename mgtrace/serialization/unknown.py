"""Fields this reader does not know, carried from a loaded archive to its re-save.

A newer minor format may add optional fields, which an older reader ignores
(version.py). The rule for keeping them (schema/CHANGELOG.md, 1.2):

* ``load_archive`` keeps the unknown fields of the header itself, of each
  module entry and of each tensor entry (a field is unknown where the
  header's, the module kind's or the tensor entry's declaration in header.py
  and the codecs lacks its name), as ``Archive.unknown_fields``.
* ``save(archive, f, target_version=archive.format_version)`` transcribes
  the archive at its own version, a newer minor of this major included: the
  fields come back unchanged, after this writer's own fields of the same map
  (the header's before its seal), for the header, for each module entry of
  a module the load built (the same object, met again), and for each tensor
  entry of a tensor it read (the same memory, shape and dtype). The archive
  keeps its ``format_version``, its producer, and at least its
  ``min_reader_version``. Fields are written back only where the object
  they came with is still in the saved object; what the object became
  between load and save is the caller's to keep true (edit and save
  ``archive.obj`` to write a new archive instead).
* A save at any other version (this writer's own format, an older one)
  cannot claim the newer minor's rules: the fields are left out, with a
  :class:`UserWarning` naming them.

Unknown fields deeper down (inside a traced module's graphs, in a value)
are ignored on load and not kept.
"""
import warnings

from mgtrace._core.dtype import qdtype_str
from mgtrace.serialization import header as H
from mgtrace.serialization.codecs import codec_for_kind

__all__ = ["Carried", "find", "apply", "tensor_key", "warn_dropped"]

_HEADER = frozenset(f.name for f in H.HEADER)
_TENSOR = frozenset(f.name for f in H.ENTRIES["tensor"])
_MODULE = frozenset(f.name for f in H.ENTRIES["module"])


def tensor_key(t):
    """What identifies a tensor-table entry (EncodeContext.tensor's key):
    the same memory, shape, strides, dtype and device."""
    return (t._storage_id(), t.data_ptr, t.shape, t.strides, t.dtype.name, str(t.device),
            None if t._qdtype is None else qdtype_str(t._qdtype))


class Carried:
    """The unknown fields of one loaded archive.

    Attributes:
        by_place: ``{"header": {name: value}, "modules": {index: {name:
            value}}, "tensors": {index: {name: value}}}`` as stored (what
            ``Archive.unknown_fields`` shows).
        modules: ``{id(module): (module, fields)}`` for the writer.
        tensors: ``{tensor_key: fields}`` for the writer.

    Made from ``{index: (module, fields)}`` and ``{index: (tensor, fields)}``.
    """

    def __init__(self, header, modules, tensors):
        self.header = header
        self.by_place = {"header": header,
                         "modules": {i: f for i, (_, f) in sorted(modules.items())},
                         "tensors": {i: f for i, (_, f) in sorted(tensors.items())}}
        self.modules = {id(m): (m, f) for m, f in modules.values()}
        self.tensors = {tensor_key(t): f for t, f in tensors.values()}

    def __bool__(self):
        return bool(self.header or self.modules or self.tensors)

    def names(self):
        """``["header.x", "header.modules[3].y", ...]``: where each field was."""
        out = [f"header.{k}" for k in self.header]
        for place in ("modules", "tensors"):
            out += [f"header.{place}[{i}].{k}" for i, f in self.by_place[place].items() for k in f]
        return out


def _extra(entry, known):
    return {k: v for k, v in entry.items() if k not in known}


def find(header, built_modules, placed_tensors):
    """The unknown fields of ``header`` (validated), tied to the modules and
    tensors the load made from their entries.

    Args:
        built_modules: ``{module index: Module}`` (DecodeContext's).
        placed_tensors: ``{tensor index: Tensor}`` (DecodeContext's).
    """
    top = _extra(header, _HEADER)
    modules, tensors = {}, {}
    for i, e in enumerate(header["modules"]):
        known = _MODULE | {f.name for f in codec_for_kind(e["kind"], f"header.modules[{i}]").fields}
        extra = _extra(e, known)
        if extra and i in built_modules:
            modules[i] = (built_modules[i], extra)
    for i, e in enumerate(header["tensors"]):
        extra = _extra(e, _TENSOR)
        if extra and i in placed_tensors:
            tensors[i] = (placed_tensors[i], extra)
    return Carried(top, modules, tensors)


def apply(header, ctx, carried):
    """Add ``carried``'s fields to the encoded ``header`` (before its seal)
    and to the module entries of ``ctx`` whose modules they came with;
    returns ``{tensor index: fields}`` for the tensor table (written after
    encoding). A field never replaces one this writer wrote."""
    seal = header.pop(H.SEAL, ...)
    for k, v in carried.header.items():
        header.setdefault(k, v)
    if seal is not ...:
        header[H.SEAL] = seal
    for key, i in ctx._module_index.items():
        hit = carried.modules.get(key)
        if hit is not None and ctx.modules[i] is not None:
            for k, v in hit[1].items():
                ctx.modules[i].setdefault(k, v)
    out = {}
    for j, t in enumerate(ctx.tensors):
        t = getattr(t, "tensor", t)         # an aliases.View: the view it stands for
        fields = carried.tensors.get(tensor_key(t))
        if fields:
            out[j] = fields
    return out


def warn_dropped(carried, fv, target, stacklevel=4):
    """Warn that ``carried``'s fields are left out of a save at ``target``
    (``stacklevel`` 4: this, writer._encode_archive, save, save's caller)."""
    names = carried.names()
    shown = ", ".join(names[:8]) + (f" and {len(names) - 8} more" if len(names) > 8 else "")
    warnings.warn(f"this archive (format {'.'.join(map(str, fv))}) holds fields this mgtrace "
                  f"does not know ({shown}); saved for format {'.'.join(map(str, target))} "
                  "they are left out: save it with target_version=archive.format_version to keep them",
                  UserWarning, stacklevel=stacklevel)
