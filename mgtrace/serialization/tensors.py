"""The tensor table: entries, checksums, and tensors from archive bytes.

An entry is ``{dtype, shape, offset, nbytes, checksum}`` (header.py). Data is
C-contiguous, little-endian, at ``data_start + offset``. The checksum is
``"crc32:%08x"``: zlib's CRC-32, computed by ISA-L (the optional ``isal``
package: the same value, 10-20x faster with carry-less multiplies) when it
is installed, else by zlib (the algorithm is named in each entry so a later
version can switch).

A load with ``mmap`` makes read-only tensors of the file's bytes without
a copy through DLPack (``mgtrace.from_dlpack``); one without reads each
tensor's bytes straight into a new tensor's memory (:func:`fresh_tensor`).
Modules get Parameters that share those tensors' memory
(:func:`as_parameter`), so a module loaded with ``mmap`` holds views of the
file and one loaded without it holds the single copy the load read. Both
are memory whose every write mgtrace sees, so conv2d caches their packed
weights; saving reads tensors through views that keep it so
(:func:`host_array`).
"""
import ctypes
import sys

import numpy as np

try:        # ISA-L's CRC-32: the same checksum as zlib's, computed with carry-less multiplies
    from isal.isal_zlib import crc32
except ImportError:         # (isal is optional: pip install isal)
    from zlib import crc32

from mgtrace._core import DTYPE_NAMES, as_dtype, empty_tensor, from_dlpack, share_as
from mgtrace._core.tensor import mark_immutable, unshared_view
from mgtrace.errors import ArchiveError
from mgtrace.serialization.layout import ALIGN

__all__ = ["CHECKSUM", "DTYPE_SINCE", "require_dtype",
           "checksum", "crc32", "crc_text", "host_array", "entry_for", "check_table",
           "array_bytes", "fresh_tensor", "tensor_from_array", "aligned_empty", "verify", "as_parameter"]

CHECKSUM = "crc32"


class DtypeTable:
    """A read-only map of dtype names to NumPy dtypes (``get``, ``[]``,
    ``in``, iteration over the names), whose bfloat16 entry is made on first
    use: ``import mgtrace`` does not import ml_dtypes (see mgtrace._core.dtype).

    Args:
        names: the dtype names, NumPy's or mgtrace's ("bfloat16").
    """

    def __init__(self, names):
        self._names = tuple(names)
        self._made = {n: np.dtype(n) for n in self._names if n != "bfloat16"}

    def get(self, name, default=None):
        dt = self._made.get(name)
        if dt is None and name == "bfloat16" and name in self._names:
            dt = self._made[name] = as_dtype(name)
        return default if dt is None else dt

    def __getitem__(self, name):
        dt = self.get(name)
        if dt is None:
            raise KeyError(name)
        return dt

    def __contains__(self, name):
        return name in self._names

    def __iter__(self):
        return iter(self._names)

    def __len__(self):
        return len(self._names)


DTYPES_BY_NAME = DtypeTable(DTYPE_NAMES)
# dtypes added after format 1.0, with the format that introduced each: a
# tensor, graph node, dtype value or scalar of one needs a reader of it
DTYPE_SINCE = {"complex64": (1, 2), "complex128": (1, 2)}


def require_dtype(ctx, name, what):
    """Note on EncodeContext ``ctx`` that ``what`` uses dtype ``name``:
    raises ValueError naming both when the target version predates it."""
    since = DTYPE_SINCE.get(name)
    if since is not None and ctx is not None:
        ctx.require(since, f"{what} of dtype {name}")


def array_bytes(arr):
    """A flat byte view of a C-contiguous array (no copy)."""
    return memoryview(arr.reshape(-1).view(np.uint8))


def checksum(buf):
    """``"crc32:%08x"`` of a bytes-like object (zlib's CRC-32; computed by
    ISA-L's when the optional ``isal`` package is installed, several times
    faster for the same value)."""
    return f"{CHECKSUM}:{crc32(buf):08x}"


def crc_text(value):
    """``"crc32:%08x"`` of a CRC-32 ``value`` (an int)."""
    return f"{CHECKSUM}:{value:08x}"


def host_array(t):
    """``t``'s values as a C-contiguous little-endian NumPy array on the host.

    Shares memory with ``t`` when it is a contiguous CPU tensor NumPy can
    import (every dtype but bfloat16), else a copy of just this tensor."""
    arr = None
    if t.is_contiguous and t.device.type == "cpu" and t.dtype.name != "bfloat16":
        try:       # (a view that leaves t's packed-weight caching on, unlike np.from_dlpack(t))
            arr = unshared_view(t)
        except (BufferError, TypeError, RuntimeError, ValueError):
            arr = None
    if arr is None:
        arr = t.numpy()
    if sys.byteorder != "little":
        arr = arr.astype(arr.dtype.newbyteorder("<"))
    return np.ascontiguousarray(arr)


def entry_for(t, offset, arr):
    """The table entry of tensor ``t`` whose data ``arr`` goes at ``offset``."""
    e = {"dtype": t.dtype.name, "shape": list(t.shape), "offset": offset,
         "nbytes": arr.nbytes, "checksum": checksum(array_bytes(arr))}
    q = quant_entry(t)
    if q is not None:
        e["quant"] = q
    return e


def quant_entry(t):
    """The ``quant`` field of quantized tensor ``t``'s entry (format 1.2), or
    None for any other tensor."""
    q = t._qdtype
    if q is None:
        return None
    from mgtrace.quantization import qdtype
    return {"dtype": qdtype.quantized_meta(q).name, "scale": float(qdtype.get_scale(q)),
            "zero_point": qdtype.get_zero_point(q)}


def mark_quantized(t, e, where):
    """``t`` (loaded from entry ``e``) with the quantized dtype its ``quant``
    field names, or none when the entry has none (a view of a quantized
    base may be stored plain). Raises ArchiveError for a bad field."""
    f = e.get("quant")
    if f is None:
        if t._qdtype is not None:
            t = share_as(t, type(t))
            t._qdtype = None
        return t
    from mgtrace.quantization import qdtype
    from mgtrace.quantization.utils import QuantizationError
    try:
        dt = qdtype.create_quantized_dtype(f["dtype"], f["scale"], f["zero_point"])
        return qdtype.tag(t, dt)
    except QuantizationError as err:
        raise ArchiveError(f"{where}.quant: {err}") from None


# ------------------------------------------------------------------ reading

def _check_entry(e, data_nbytes, where):
    dt = DTYPES_BY_NAME.get(e["dtype"])
    if dt is None:
        raise ArchiveError(f"{where}.dtype: unknown dtype {e['dtype']!r}; known: "
                           f"{', '.join(DTYPES_BY_NAME)}")
    if "view" in e:             # no data of its own: checked against its base (aliases.py)
        return
    n = 1
    for d in e["shape"]:
        n *= d
    if e["nbytes"] != n * dt.itemsize:
        raise ArchiveError(f"{where}: nbytes is {e['nbytes']}, but shape {tuple(e['shape'])} "
                           f"of {dt.name} needs {n * dt.itemsize}")
    if e["offset"] % ALIGN:
        raise ArchiveError(f"{where}.offset: {e['offset']} is not a multiple of {ALIGN}")
    if e["offset"] + e["nbytes"] > data_nbytes:
        raise ArchiveError(f"{where}: bytes {e['offset']}..{e['offset'] + e['nbytes']} run past "
                           f"the end of the tensor data ({data_nbytes} bytes)")
    if not e["checksum"].startswith(CHECKSUM + ":"):
        raise ArchiveError(f"{where}.checksum: unknown algorithm in {e['checksum'][:40]!r}; "
                           f"this reader checks {CHECKSUM!r}")


def check_table(entries, data_nbytes):
    """Check every tensor entry against the data region and each other.

    Raises:
        ArchiveError: unknown dtype, nbytes not shape x itemsize, offset not
            aligned or past the end, two tensors overlapping (a duplicate is
            an overlap), unknown checksum algorithm; a view (format 1.2)
            whose base or elements are wrong (aliases.check_view).
    """
    from mgtrace.serialization.aliases import check_view
    for i, e in enumerate(entries):
        _check_entry(e, data_nbytes, f"header.tensors[{i}]")
        if "view" in e:
            check_view(e, entries, f"header.tensors[{i}]")
    spans = sorted((e["offset"], e["offset"] + e["nbytes"], i)
                   for i, e in enumerate(entries) if e["nbytes"])
    for (s0, e0, i0), (s1, e1, i1) in zip(spans, spans[1:]):
        if s1 < e0:
            raise ArchiveError(f"header.tensors[{i0}] and header.tensors[{i1}] overlap "
                               f"(bytes {s0}..{e0} and {s1}..{e1})")


def verify(buf, entry, where):
    """Raise ArchiveError unless ``buf`` (a bytes-like object, or the CRC-32
    of the bytes as an int) matches the entry's checksum."""
    got = crc_text(buf) if isinstance(buf, int) else checksum(buf)
    if got != entry["checksum"]:
        raise ArchiveError(f"{where}: checksum mismatch, the header records "
                           f"{entry['checksum']}, the data gives {got} (the file is corrupted)")


def aligned_empty(nbytes):
    """A writable uint8 array of ``nbytes`` starting on an ALIGN-byte boundary."""
    raw = np.empty(nbytes + ALIGN, np.uint8)
    start = -raw.ctypes.data % ALIGN
    return raw[start:start + nbytes]


class _Bfloat16Export:
    """NumPy's DLPack capsule of a uint16 view, relabelled bfloat16.

    NumPy cannot export ml_dtypes' bfloat16 through DLPack; the bits are the
    same as a uint16 array's, so the versioned capsule NumPy makes for the
    uint16 view has its dtype code set to kDLBfloat (4)."""

    # offsetof(DLManagedTensorVersioned, dl_tensor.dtype) on a 64-bit platform:
    # version 8 + manager_ctx 8 + deleter 8 + flags 8, then data 8 + device 8 + ndim 4
    _DTYPE_OFFSET = 52
    _get = ctypes.pythonapi.PyCapsule_GetPointer
    _get.restype, _get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]

    def __init__(self, arr):
        self._u16 = arr.view(np.uint16)

    def __dlpack__(self, *, max_version=None, **kwargs):
        capsule = self._u16.__dlpack__(max_version=(1, 0))
        dtype = (ctypes.c_uint8 * 2).from_address(
            self._get(capsule, b"dltensor_versioned") + self._DTYPE_OFFSET)
        if ctypes.sizeof(ctypes.c_void_p) != 8 or tuple(dtype) != (1, 16):  # kDLUInt, 16 bits
            raise RuntimeError("unexpected DLPack layout; cannot relabel uint16 as bfloat16")
        dtype[0] = 4
        return capsule

    def __dlpack_device__(self):
        return self._u16.__dlpack_device__()


def fresh_tensor(shape, dtype):
    """``(t, flat)``: a new CPU tensor in memory mgtrace owns and a
    writable flat uint8 NumPy view of its bytes to fill before ``t`` is
    used (``unshared_view``: the storage stays one whose writes mgtrace
    sees). Not for bfloat16, which NumPy cannot import."""
    t = empty_tensor(tuple(shape), dtype)
    return t, unshared_view(t, True).reshape(-1).view(np.uint8)


def tensor_from_array(arr, immutable=False):
    """A CPU Tensor sharing ``arr``'s memory; read-only when ``arr`` is.
    ``immutable``: the caller vouches that nothing writes that memory while
    the tensor lives (the reader's read-only mapping of an archive), so that
    conv2d may cache the weight's packed copy (``mark_immutable``)."""
    bf16 = arr.dtype.itemsize == 2 and arr.dtype.name == "bfloat16"    # (.name is slow: last)
    t = from_dlpack(_Bfloat16Export(arr)) if bf16 else from_dlpack(arr)
    if immutable and t.readonly:
        mark_immutable(t)
    return t



def as_parameter(t):
    """A :class:`~mgtrace.module.Parameter` sharing ``t``'s memory (no copy;
    a read-only ``t``, e.g. mapped from an archive, gives a read-only
    Parameter that raises ValueError when written to).

    Args:
        t: a Tensor (any dtype, shape, strides, device).
    """
    from mgtrace.module import Parameter
    return share_as(t, Parameter)
