"""The header's fields, declared once, and the check that a header has them.

An archive's header is one msgpack map. Its fields, and those of the entries
in its tables, are declared below as ``Field(name, type, required, since,
doc)``; :func:`check` validates a map against such a declaration and
``schema/generate.py`` writes them to ``schema/schema.json``. Field types
are the names in :data:`TYPES` or ``"list of <entry>"`` / ``<entry>`` for an
entry declared in :data:`ENTRIES`. Module entries add the fields their kind
declares (see :mod:`mgtrace.serialization.codecs`).

Unknown keys are ignored: a newer minor version may add optional fields
(version.py); those of the header, module and tensor entries are kept for a
re-save at the archive's own version (unknown.py). A missing required field or a wrong type raises
:class:`~mgtrace.ArchiveError` naming the path, e.g. ``header.tensors[3].shape``.
"""
import zlib
from collections import namedtuple

import msgpack

from mgtrace.errors import ArchiveError
from mgtrace.serialization.limits import MAX_NDIM

__all__ = ["Field", "TYPES", "HEADER", "ENTRIES", "check", "pack", "check_seal", "check_raw_seal",
           "SEAL"]

Field = namedtuple("Field", "name type required since doc")
Field.__doc__ = """One field of the header or of a table entry: its ``name``, ``type`` (a
key of :data:`TYPES`, an entry name of :data:`ENTRIES`, or ``"list of <entry>"``),
whether it is ``required``, the format version it appeared in (``since``),
and a ``doc`` line for schema.json."""


def _uint(x):
    return type(x) is int and x >= 0


def _str_keys(x, value_ok):
    return type(x) is dict and all(type(k) is str and value_ok(v) for k, v in x.items())


# type name -> (predicate, description for schema.json)
TYPES = {
    "str": (lambda x: type(x) is str, "string"),
    "uint": (_uint, "non-negative integer"),
    "bool": (lambda x: type(x) is bool, "boolean"),
    "version": (lambda x: type(x) is list and len(x) == 2 and all(map(_uint, x)),
                "[major, minor], non-negative integers"),
    "shape": (lambda x: type(x) is list and len(x) <= MAX_NDIM and all(map(_uint, x)),
              f"list of at most {MAX_NDIM} non-negative integers"),
    "strides": (lambda x: type(x) is list and len(x) <= MAX_NDIM and all(
        type(s) is int and -(1 << 63) <= s < (1 << 63) for s in x),
        f"list of at most {MAX_NDIM} integers (64-bit, any sign)"),
    "float": (lambda x: type(x) is float, "floating-point number"),
    "int": (lambda x: type(x) is int and -(1 << 63) <= x < (1 << 63), "integer (64-bit)"),
    "value": (lambda x: True, "a tagged value (see tags)"),
    "values by name": (lambda x: _str_keys(x, lambda v: True),
                       "map from string (a parameter name) to a tagged value"),
    "indices by name": (lambda x: _str_keys(x, _uint),
                        "map from string to an index into a table"),
    "named indices": (lambda x: type(x) is list and all(
        type(p) is list and len(p) == 2 and type(p[0]) is str and _uint(p[1]) for p in x),
        "list of [string, index] pairs, order kept"),
}

V1 = (1, 0)
V1_1 = (1, 1)
V1_2 = (1, 2)
SEAL = "header_checksum"       # the last field of a sealed header (format 1.1)

HEADER = (
    Field("format", "str", True, V1, 'always "mgtrace.tmod"'),
    Field("format_version", "version", True, V1, "format version of the writer"),
    Field("min_reader_version", "version", True, V1,
          "lowest reader version that understands every feature this archive uses"),
    Field("producer", "producer", True, V1, "the program that wrote it (informational)"),
    Field("byteorder", "str", True, V1, 'byte order of tensor data, always "little"'),
    Field("ops", "list of op", True, V1,
          "op table: stable function names with versions, referenced by index"),
    Field("modules", "list of module", True, V1,
          'module table, referenced by {"module": i}'),
    Field("tensors", "list of tensor", True, V1, 'tensor table, referenced by {"tensor": i}'),
    Field("data_nbytes", "uint", True, V1, "bytes of tensor data after the header's padding"),
    Field("root", "value", True, V1, "the saved object"),
    Field("examples", "examples", False, V1,
          "example inputs and the outputs the saved object gave for them"),
    Field("metadata", "value", False, V1, "user metadata (a dict)"),
    Field(SEAL, "str", False, V1_1,
          '"crc32:%08x" of the header\'s msgpack bytes before this value; always the '
          "last field; required from format 1.1 on (see header.pack)"),
)

ENTRIES = {
    "producer": (
        Field("library", "str", True, V1, '"mgtrace"'),
        Field("version", "str", True, V1, "its version, e.g. \"0.1.0\""),
    ),
    "op": (
        Field("name", "str", True, V1, 'stable name, e.g. "mgtrace.functional.conv2d"'),
        Field("version", "uint", True, V1, "the function's version when written"),
    ),
    "tensor": (
        Field("dtype", "str", True, V1, "one of mgtrace.DTYPES"),
        Field("shape", "shape", True, V1, "dimensions"),
        Field("offset", "uint", True, V1, "byte offset from the start of the data, a multiple of 64"),
        Field("nbytes", "uint", True, V1, "product(shape) * itemsize"),
        Field("checksum", "str", True, V1, '"<algorithm>:<hex digest>", e.g. "crc32:0a1b2c3d"'),
        Field("view", "view", False, V1_2,
              "a view of another entry's memory (storage aliasing): the entry holds no data "
              "(offset and nbytes 0); see aliases.py"),
        Field("quant", "quant", False, V1_2,
              "the quantized dtype of a quantized tensor (dtype is its storage: int8, uint8, "
              "int32); an archive with one needs a reader of format 1.2"),
    ),
    "quant": (
        Field("dtype", "str", True, V1_2, 'qint8, qint8_narrow, quint8, qint32, qint4 or quint4'),
        Field("scale", "float", True, V1_2, "the scale, a positive float32 value"),
        Field("zero_point", "int", True, V1_2, "the zero point (0 for the signed dtypes)"),
    ),
    "view": (
        Field("base", "uint", True, V1_2, "index of the stored tensor whose memory it views"),
        Field("offset", "uint", True, V1_2, "elements from the base's first to the view's first"),
        Field("strides", "strides", True, V1_2, "elements between neighbours, per dimension"),
    ),
    "examples": (
        Field("inputs", "value", True, V1, "a tuple of positional arguments"),
        Field("outputs", "value", True, V1, "what the object returned for them"),
        Field("kwargs", "values by name", False, V1, "keyword arguments of that call, if any"),
    ),
    "module": (
        Field("kind", "str", True, V1, "how the module is stored; the kind adds fields"),
        Field("training", "bool", True, V1, "the module's training flag"),
    ),
}


def _path(where):
    """The text of a path made lazily: a str, or ``(parent, ".name")`` /
    ``(parent, index)`` (the text is needed only for a message, and a header
    has thousands of fields)."""
    if type(where) is str:
        return where
    parent, part = where
    return _path(parent) + (part if type(part) is str else f"[{part}]")


def _check_type(x, type_name, where):
    if type_name.startswith("list of "):
        entry = type_name[len("list of "):]
        if type(x) is not list:
            raise ArchiveError(f"{_path(where)}: expected a list, got a {type(x).__name__}")
        fields = ENTRIES[entry]
        for i, item in enumerate(x):
            check(item, fields, (where, i))
    elif type_name in ENTRIES:
        check(x, ENTRIES[type_name], where)
    elif not TYPES[type_name][0](x):
        shown = repr(x) if len(repr(x)) < 60 else f"a {type(x).__name__}"
        raise ArchiveError(f"{_path(where)}: expected {TYPES[type_name][1]}, got {shown}")


def check(obj, fields, where="header"):
    """Check that map ``obj`` has ``fields`` (a tuple of :class:`Field`).

    Raises:
        ArchiveError: ``obj`` is not a map, a required field is missing, or a
            field has the wrong type; the message names the path.
    """
    if type(obj) is not dict:
        raise ArchiveError(f"{_path(where)}: expected a map, got a {type(obj).__name__}")
    for f in fields:
        x = obj.get(f.name, _MISSING)
        if x is _MISSING:
            if f.required:
                raise ArchiveError(f"{_path(where)}: the required field {f.name!r} is missing")
            continue
        ok = _PLAIN_TYPES.get(f.type)
        if ok is None:
            _check_type(x, f.type, (where, "." + f.name))
        elif not ok(x):             # (as _check_type would say it)
            _check_type(x, f.type, (where, "." + f.name))
    return obj


_MISSING = object()
# the predicates of the plain types: checked in place, the rest by _check_type
_PLAIN_TYPES = {k: v[0] for k, v in TYPES.items() if k not in ENTRIES and not k.startswith("list of ")}


# ------------------------------------------------------------------ the seal
# A header is sealed by a CRC-32 over its own msgpack bytes. The checksum is
# the map's last value, so it covers every byte before it -- the map's length,
# every other field and its own key -- and a reader finds it as the header's
# last, fixed-width bytes without re-encoding anything.

def _seal_value(crc):
    return f"crc32:{crc:08x}"


_SEAL_LEN = len(msgpack.packb(_seal_value(0)))
SEAL_LEN = _SEAL_LEN       # bytes of the packed seal value, the last of a sealed header
_SEAL_KEY = msgpack.packb(SEAL)
_HEX = frozenset(b"0123456789abcdef")


def pack(header, sealed):
    """The msgpack bytes of ``header`` (a dict); with ``sealed`` the field
    :data:`SEAL` is added last (format 1.1), and ``header`` keeps it."""
    header.pop(SEAL, None)
    if not sealed:
        return msgpack.packb(header, use_bin_type=True)
    header[SEAL] = _seal_value(0)
    raw = msgpack.packb(header, use_bin_type=True)
    header[SEAL] = _seal_value(zlib.crc32(memoryview(raw)[:-_SEAL_LEN]))
    return raw[:-_SEAL_LEN] + msgpack.packb(header[SEAL])


def _mismatch(value, got):
    return ArchiveError(f"header checksum mismatch: the header records {value}, its bytes give "
                        f"{got} (the header is corrupted)")


SEAL_TAIL = _SEAL_LEN + len(_SEAL_KEY)     # what a sealed header ends in: the seal's key, value


class SealBytes:
    """What the seal checks read of a header's bytes: their last
    :data:`SEAL_TAIL` bytes (``tail``) and the CRC-32 of all but the last
    ``_SEAL_LEN`` (``crc_of()``, computed on first use, then kept), so that
    a large header can be checked piece by piece without being held whole.
    ``SealBytes.of(raw)`` for bytes in memory."""
    __slots__ = ("tail", "_crc_of", "_crc")

    def __init__(self, tail, crc_of):
        self.tail, self._crc_of, self._crc = bytes(tail), crc_of, None

    @classmethod
    def of(cls, raw):
        mv = memoryview(raw)
        return cls(mv[-SEAL_TAIL:], lambda: zlib.crc32(mv[:-_SEAL_LEN]))

    def crc(self):
        if self._crc is None:
            self._crc = self._crc_of()
        return self._crc


def _seal_bytes(raw):
    return raw if isinstance(raw, SealBytes) else SealBytes.of(raw)


def check_raw_seal(raw):
    """Check the seal of header bytes ``raw`` (bytes, a memoryview, or a
    :class:`SealBytes`) before they are parsed, so that a corrupted header
    is reported as such (not as bad msgpack or a missing field). Bytes that
    do not end in a seal's key and value (a 1.0 header, or a corrupted
    seal) pass: :func:`check_seal` judges them once parsed.

    Raises:
        ArchiveError: "header checksum mismatch".
    """
    raw = _seal_bytes(raw)
    value = seal_in(raw.tail)
    if value is None:
        return
    got = _seal_value(raw.crc())
    if got != value:
        raise _mismatch(value, got)


def seal_in(tail):
    """The seal value (``"crc32:..."``) that header bytes ending in ``tail``
    (their last :data:`SEAL_TAIL` bytes) carry, or None when they end in
    none (a 1.0 header, a corrupted seal, not a header)."""
    tail = bytes(tail)
    key, value = tail[:-_SEAL_LEN], tail[-_SEAL_LEN:]
    prefix = msgpack.packb(_seal_value(0))[:-8]           # the str header and "crc32:"
    if len(tail) != SEAL_TAIL or key != _SEAL_KEY or not value.startswith(prefix) or \
            not set(value[len(prefix):]) <= _HEX:
        return None
    return value[1:].decode()


def check_seal(raw, header):
    """Check the header's seal against its bytes ``raw`` (bytes, a
    memoryview, or a :class:`SealBytes`).

    From format 1.1 on a header must be sealed; a 1.0 header may not be.

    Raises:
        ArchiveError: the seal is missing (1.1 and later), not the last
            field, or does not match the bytes (the header is corrupted).
    """
    if SEAL not in header:
        if tuple(header["format_version"]) >= V1_1:
            raise ArchiveError(f"header.{SEAL}: missing, but format {header['format_version'][0]}."
                               f"{header['format_version'][1]} headers are sealed (corrupted header)")
        return
    value = header[SEAL]
    if next(reversed(header)) != SEAL:
        raise ArchiveError(f"header.{SEAL}: not the header's last field (corrupted header)")
    tail = msgpack.packb(value)
    raw = _seal_bytes(raw)
    if len(tail) != _SEAL_LEN or not raw.tail[-_SEAL_LEN:] == tail:
        raise ArchiveError(f"header.{SEAL}: {value[:40]!r} is not \"crc32:\" and 8 hex digits")
    got = _seal_value(raw.crc())
    if got != value:
        raise _mismatch(value, got)
