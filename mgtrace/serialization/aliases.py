"""Tensors that share memory, kept shared through an archive (format 1.2).

A model may hold several views of one storage: a buffer and a slice of it,
a parameter and its transpose, a parameter and a buffer that is one row of
it. Eager code sees a write through one in the others, and so does
``torch.save``/``torch.load``; an archive that stored each view's values
apart would split them silently. So the writer groups the tensor table's
views by storage (``storage_spans``): each group's elements, from the
lowest any view reads to the highest, are stored once as a 1-D *base*
entry, and each view becomes an entry without data of its own::

    {dtype, shape, offset: 0, nbytes: 0, checksum: "crc32:00000000",
     view: {base: <tensor index>, offset: <elements>, strides: [<elements>, ...]}}

whose element ``(i0, i1, ...)`` is the base's element ``offset + i0 *
strides[0] + i1 * strides[1] + ...``. The reader makes the base tensor
(copied or mapped) and every view of it with ``strided_view``, so a
loaded view has the same offset and strides in the same storage as the
saved one. A format 1.1 reader cannot do that, so an archive with views
has ``min_reader_version`` 1.2, and ``save(..., target_version=(1, 1))``
refuses it naming two of the tensors. An archive without shared memory
has no view entries and is written as before.
"""
from collections import namedtuple

from mgtrace._core import Tensor
from mgtrace._core.tensor import storage_spans, strided_view
from mgtrace.errors import ArchiveError
from mgtrace.module import Module

__all__ = ["View", "VIEWS_SINCE", "share_views", "view_entry", "check_view", "make_view",
           "tensor_names"]

VIEWS_SINCE = (1, 2)

View = namedtuple("View", "tensor base offset")
View.__doc__ = """A tensor-table slot that is a view of entry ``base``: ``tensor`` (the
saved view: its dtype, shape and strides) whose first element is ``offset``
elements into the base."""


def share_views(tensors, require, names=None):
    """Turn the views of one storage in ``tensors`` (the writer's table,
    changed in place) into :class:`View` slots of a base appended to it.

    Args:
        tensors: list of Tensors, each a distinct view (the table so far).
        require: ``f(version, feature)``, the context's ``require``: raises
            ValueError when the target format cannot keep the views.
        names: optional ``f(tensor) -> str | None`` naming a tensor in messages.

    Raises:
        ValueError: the target format is older than 1.2 (the message names
            two tensors that share memory), or views of one storage differ
            in dtype.
    """
    for span, members in storage_spans(tensors):
        a, b = (_name(tensors[i], i, names) for i, _ in members[:2])
        require(VIEWS_SINCE, f"keeping the memory that tensors {a} and {b} share (one is a "
                             "view of the other; .copy() one to store them apart)")
        base = len(tensors)
        tensors.append(span.contiguous())
        for i, offset in members:
            tensors[i] = View(tensors[i], base, offset)


def _name(t, i, names):
    name = names(t) if names is not None else None
    return name or f"#{i} ({t.dtype.name} {list(t.shape)})"


def view_entry(v):
    """The tensor-table entry of :class:`View` ``v`` (no data of its own)."""
    from mgtrace.serialization.tensors import checksum
    t = v.tensor
    from mgtrace.serialization.tensors import quant_entry
    e = {"dtype": t.dtype.name, "shape": list(t.shape), "offset": 0, "nbytes": 0,
         "checksum": checksum(b""),
         "view": {"base": v.base, "offset": v.offset, "strides": list(t.strides)}}
    q = quant_entry(t)
    if q is not None:
        e["quant"] = q
    return e


def check_view(e, entries, where):
    """Check the view entry ``e`` (its fields' types already checked)
    against the table: its base a data entry of the same dtype, one stride a
    dimension, every element inside the base.

    Raises:
        ArchiveError: naming the entry and the problem.
    """
    v, w = e["view"], f"{where}.view"
    if e["nbytes"] or e["offset"]:
        raise ArchiveError(f"{where}: a view holds no data (offset and nbytes 0)")
    if v["base"] >= len(entries):
        raise ArchiveError(f"{w}.base: index {v['base']} is out of range for header.tensors "
                           f"({len(entries)} entries)")
    base = entries[v["base"]]
    if "view" in base or base["dtype"] != e["dtype"]:
        raise ArchiveError(f"{w}.base: tensor {v['base']} is a view or of another dtype; a "
                           f"view's base is a stored {e['dtype']} tensor")
    if len(v["strides"]) != len(e["shape"]):
        raise ArchiveError(f"{w}.strides: {len(v['strides'])} strides for "
                           f"{len(e['shape'])} dimensions")
    n = 1
    for d in base["shape"]:
        n *= d
    lo = hi = v["offset"]
    for size, stride in zip(e["shape"], v["strides"]):
        if size == 0:
            return
        lo, hi = lo + min(0, stride * (size - 1)), hi + max(0, stride * (size - 1))
    if lo < 0 or hi >= n:
        raise ArchiveError(f"{w}: elements {lo}..{hi} of a base of {n} elements; the view "
                           "runs outside it")


def make_view(base, e):
    """The tensor of view entry ``e`` (checked by :func:`check_view`) in
    tensor ``base``'s storage."""
    v = e["view"]
    return strided_view(base, tuple(e["shape"]), tuple(v["strides"]), v["offset"])


def tensor_names(obj):
    """``f(tensor) -> str | None``: the first path under ``obj`` (a module,
    or containers of modules and tensors) at which a tensor is found, e.g.
    ``"layer1.0.bn.running_mean"`` or ``"obj['w']"``; for messages."""
    found = {}

    def walk(x, path, depth=0):
        if depth > 100:
            return
        if isinstance(x, Tensor):
            found.setdefault(id(x), path)
        elif isinstance(x, Module):
            for k, t in type(x).state_dict(x, keep_vars=True).items():
                found.setdefault(id(t), f"{path}.{k}" if path else k)
            for m_path, m in type(x).named_modules(x):
                for k, t in m.__dict__.items():
                    if isinstance(t, Tensor):
                        found.setdefault(id(t), ".".join(p for p in (path, m_path, k) if p))
        elif isinstance(x, dict):
            for k, v in x.items():
                walk(v, f"{path}[{k!r}]", depth + 1)
        elif isinstance(x, (list, tuple)):
            for i, v in enumerate(x):
                walk(v, f"{path}[{i}]", depth + 1)

    def name(t):
        if not found:            # walked on first use: only a save with views asks
            walk(obj, "" if isinstance(obj, Module) else "obj")
        return found.get(id(t))
    return name
