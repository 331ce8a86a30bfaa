"""load(): check an archive from the outside in, then build what it holds.

Order, so that nothing runs before everything is known to be well-formed:

1. prefix: magic, header length within the file (layout.py);
2. header: its seal over the raw bytes, when they end in one (a corrupted
   header is reported as a checksum mismatch, not as whatever parsing it
   gives), msgpack map (msgpack's own limits are bounded by its length),
   fields and types (header.py), format name, versions (version.py), byte
   order, data length equal to what follows the header;
3. tensor table: dtypes, nbytes = shape x itemsize, alignment, bounds,
   no overlaps (tensors.py);
4. names: every op and module type resolved through the registry, every
   module entry checked by its kind's codec (context.py) -- only here may an
   unknown name fail, and it fails before any code runs;
5. values: the root object (then examples and metadata) decoded, tensors
   read and checksummed on first use, modules built.

Every failure is an :class:`~mgtrace.ArchiveError` with the reason.
"""
import contextlib
import gc
import zlib

import msgpack

from mgtrace._core.tensor import require_device
from mgtrace.errors import ArchiveError, VersionError
from mgtrace.serialization import header as H
from mgtrace.serialization import tensors as T
from mgtrace.serialization import unknown
from mgtrace.serialization.context import DecodeContext
from mgtrace.serialization.layout import PREFIX, parse_prefix
from mgtrace.serialization import limits
from mgtrace.serialization.source import open_source
from mgtrace.serialization.version import (FORMAT_NAME, check_readable, fmt,
                                           from_newer_writer, newer_writer_note, upgrade_header)

__all__ = ["load", "load_archive", "read_header", "Archive"]

# what decoding may raise besides ArchiveError, for input no check above caught
_DECODE_ERRORS = (ValueError, TypeError, KeyError, IndexError, OverflowError, RecursionError,
                  MemoryError, UnicodeError, AttributeError)


class Archive:
    """Everything :func:`load_archive` read.

    Attributes:
        obj: the saved object (what :func:`load` returns).
        metadata: the user metadata (None when absent).
        example_inputs, example_outputs: the stored examples (None when absent).
        example_kwargs: keyword arguments of the example call (``{}`` when none).
        format_version, min_reader_version: ``(major, minor)`` tuples.
        producer: ``{"library": ..., "version": ...}`` of the writer.
        header: the validated header, values still tagged.
        unknown_fields: the fields of the header, its module entries and its
            tensor entries that this reader does not know (a newer minor's
            optional fields): ``{"header": {name: value}, "modules": {index:
            {name: value}}, "tensors": {index: {name: value}}}``, values as
            stored; empty maps when there are none (see unknown.py for what
            a re-save keeps).

    ``mt.save(archive, f, target_version=archive.format_version)`` writes
    it again as it was read (examples, metadata, producer and unknown
    fields kept): the same bytes from an unchanged writer (see
    :func:`~mgtrace.serialization.save`).
    """

    def __init__(self, obj, header, metadata, examples):
        self.obj, self.header, self.metadata = obj, header, metadata
        self._carried = None        # unknown.Carried, set by the load where there are any
        self.unknown_fields = {"header": {}, "modules": {}, "tensors": {}}
        self.example_inputs, self.example_outputs, self.example_kwargs = examples
        self.format_version = tuple(header["format_version"])
        self.min_reader_version = tuple(header["min_reader_version"])
        self.producer = header["producer"]

    def __repr__(self):
        return (f"<Archive format {fmt(self.format_version)} by {self.producer['library']} "
                f"{self.producer['version']}: {type(self.obj).__name__}, "
                f"{len(self.header['tensors'])} tensors, {len(self.header['modules'])} modules>")


_PIECE = 1 << 20     # header bytes above which the header is read and parsed piece by piece


def _unpack(raw):
    """The header object: ``raw`` its bytes, or a :class:`_Pieces` of a
    large one."""
    # the header's thousands of maps and lists hold no cycle: no collection while they are
    # made (each would walk the whole heap's young objects again; msgpack's advice)
    collecting = gc.isenabled()
    gc.disable()
    try:
        if not isinstance(raw, _Pieces):
            return msgpack.unpackb(raw, raw=False, strict_map_key=True, use_list=True)
        return _unpack_pieces(raw)
    except ArchiveError:
        raise
    except Exception as e:   # msgpack parses bytes only; any failure means a bad header
        raise ArchiveError(f"header: not valid msgpack ({type(e).__name__}: {e})") from e
    finally:
        if collecting:
            gc.enable()


class _Pieces:
    """The ``n`` header bytes at ``offset`` of ``src``, read :data:`_PIECE`
    bytes at a time (msgpack's Unpacker reads them; the seal's CRC is
    summed over them): a large header is never held whole beside what is
    parsed from it."""
    __slots__ = ("src", "offset", "n", "pos")

    def __init__(self, src, offset, n):
        self.src, self.offset, self.n, self.pos = src, offset, n, 0

    def read(self, k):
        k = max(0, min(k, self.n - self.pos))
        piece = self.src.read(self.offset + self.pos, k) if k else b""
        self.pos += k
        return piece

    def crc(self, n):
        """CRC-32 of the first ``n`` bytes."""
        c = 0
        for at in range(0, n, _PIECE):
            c = zlib.crc32(self.src.read(self.offset + at, min(_PIECE, n - at)), c)
        return c

    def seal_bytes(self):
        k = min(self.n, H.SEAL_TAIL)
        return H.SealBytes(self.src.read(self.offset + self.n - k, k),
                           lambda: self.crc(max(0, self.n - H.SEAL_LEN)))


def _unpack_pieces(pieces):
    """The one msgpack object of a large header, parsed piece by piece;
    bytes after it are refused without a copy. (unpackb of the whole
    header copied everything after the first object into its ExtraData
    error: a prefix claiming 256 MB of header, an empty map and zeros cost
    another 256 MB before the refusal, 3x with mmap, which copied the
    header out of the mapping first.) A container's or string's declared
    length is bounded by the header's, which the prefix check bounded by
    the file's size."""
    u = msgpack.Unpacker(pieces, raw=False, strict_map_key=True, use_list=True,
                         max_buffer_size=pieces.n, read_size=_PIECE)
    obj = u.unpack()
    if u.tell() != pieces.n:
        raise ArchiveError(f"header: not valid msgpack: its map ends after {u.tell()} of the "
                           f"{pieces.n} bytes the prefix gives it")
    return obj


def _check_header(header, data_nbytes, raw=None):
    H.check(header, H.HEADER)
    if raw is not None:
        H.check_seal(raw, header)
    if header["format"] != FORMAT_NAME:
        raise ArchiveError(f"header.format: {header['format'][:80]!r} is not {FORMAT_NAME!r}")
    check_readable(header["format_version"], header["min_reader_version"], header["producer"])
    with _newer_writer_noted(header):
        return _check_readable_header(upgrade_header(header), data_nbytes)


def _check_readable_header(header, data_nbytes):
    if header["byteorder"] != "little":
        raise ArchiveError(f"header.byteorder: {header['byteorder'][:20]!r}; this reader "
                           "reads little-endian data only")
    for table in ("ops", "modules", "tensors"):
        limits.check_table(len(header[table]), table, ArchiveError)
    if header["data_nbytes"] != data_nbytes:
        what = "truncated archive" if header["data_nbytes"] > data_nbytes else "trailing bytes"
        raise ArchiveError(f"{what}: the header records {header['data_nbytes']} bytes of "
                           f"tensor data, the file holds {data_nbytes}")
    T.check_table(header["tensors"], data_nbytes)
    return header


def _parse(src, verify=True):
    """(header, data_start) of the archive in ``src``, checked through step 3
    (with ``verify``, the header's checksum too)."""
    hlen, start = parse_prefix(src.read(0, min(PREFIX.size, src.size)), src.size)
    padding = src.read(PREFIX.size + hlen, start - PREFIX.size - hlen)
    if padding.strip(b"\0"):
        raise ArchiveError("the padding after the header is not zeros (corrupted file)")
    _check_header_start(src, hlen)
    if hlen > _PIECE:
        raw = _Pieces(src, PREFIX.size, hlen)
        seal = raw.seal_bytes()
    else:           # a view of a mapped file, else one read
        raw = src.view(PREFIX.size, hlen) if src.can_view else src.read(PREFIX.size, hlen)
        seal = H.SealBytes.of(raw)
    if verify:              # the seal first: a corrupted header is reported as corrupted
        H.check_raw_seal(seal)
    header = _unpack(raw)
    return _check_header(header, src.size - start, seal if verify else None), start


_MAP_START = frozenset(range(0x80, 0x90)) | {0xDE, 0xDF}     # msgpack's fixmap, map 16, map 32
_LOOK_FIRST = 1 << 20       # header bytes above which the first byte is looked at first


def _check_header_start(src, hlen):
    """Refuse a header of more than :data:`_LOOK_FIRST` bytes that does not
    start as a map (a header is one) and carries no seal (which would judge
    it), before it is read: a prefix that claims gigabytes of header (zeros
    in a sparse file) took 30 s and 6 GB of memory to be refused as bad
    msgpack."""
    if hlen <= _LOOK_FIRST:
        return
    first = src.read(PREFIX.size, 1)[0]
    if first in _MAP_START or H.seal_in(src.read(PREFIX.size + hlen - H.SEAL_TAIL, H.SEAL_TAIL)):
        return
    raise ArchiveError(f"header: not valid msgpack: the prefix says {hlen} bytes of header, which "
                       f"would be a map, and they start with byte 0x{first:02x}")


def read_header(f, *, verify=True):
    """The validated header of archive ``f`` (a path or binary file object),
    values still tagged; reads no tensor data and resolves no names.
    ``verify`` checks the header's checksum (format 1.1 and later).

    Raises:
        ArchiveError: the prefix or header is malformed or corrupted (steps
            1-3 of the module docstring).
        OSError: ``f`` cannot be read.
    """
    with open_source(f, mmap=False) as src:
        return _guarded(_parse, src, verify)[0]


def _guarded(fn, *args):
    try:
        return fn(*args)
    except ArchiveError:
        raise
    except _DECODE_ERRORS as e:
        raise ArchiveError(f"malformed archive ({type(e).__name__}: {e})") from e


def _noted(header, fn):
    with _newer_writer_noted(header):
        return fn()


@contextlib.contextmanager
def _newer_writer_noted(header):
    """A refusal of something this reader does not know (a dtype, a value
    tag, a function version) in an archive of a newer format or mgtrace
    gets the archive's format and writer, this reader's formats and what to
    do appended (the exception itself is re-raised)."""
    try:
        yield
    except (ArchiveError, VersionError) as e:
        if e.args and isinstance(e.args[0], str) and from_newer_writer(header):
            e.args = (e.args[0] + newer_writer_note(header),) + e.args[1:]
        raise


def _decode(src, mmap, device, verify, everything, run_once=False):
    header, start = _parse(src, verify)
    if mmap and verify:     # every checksum will be read: map the data at once, now that
        src.populate(start)  # the header is known good
    with _newer_writer_noted(header):
        return _decode_values(header, start, src, mmap, device, verify, everything, run_once)


def _decode_values(header, start, src, mmap, device, verify, everything, run_once):
    ctx = DecodeContext(header, src, start, mmap=mmap, device=device, verify=verify)
    ctx._run_once = run_once
    obj = ctx.value(header["root"], where="header.root")
    if ctx.finish_lazy is not None:     # graphs read on first use, failing as this load would
        ctx.finish_lazy(lambda fn: _guarded(_noted, header, fn))
    if not everything:
        return Archive(obj, header, None, (None, None, {}))
    ex = header.get("examples")
    examples = (None, None, {}) if ex is None else (
        ctx.value(ex["inputs"], where="header.examples.inputs"),
        ctx.value(ex["outputs"], where="header.examples.outputs"),
        {k: ctx.value(v, where=f"header.examples.kwargs.{k}") for k, v in ex.get("kwargs", {}).items()})
    meta = header.get("metadata")
    meta = None if meta is None else ctx.value(meta, where="header.metadata")
    archive = Archive(obj, header, meta, examples)
    carried = unknown.find(header, ctx._modules, ctx._placed)
    if carried:
        archive._carried, archive.unknown_fields = carried, carried.by_place
    return archive


def _check_device(device):
    """The load's device, refused up front (DeviceUnavailable) when this
    process cannot place tensors there, so a good archive is not reported as
    a bad one."""
    if device is None:
        return None
    return require_device(device)


def load_archive(f, *, mmap=False, device=None, verify=True):
    """Read archive ``f`` with its metadata and examples; see :func:`load`.

    Returns:
        an :class:`Archive`.
    """
    return _load_archive(f, mmap=mmap, device=device, verify=verify)


def _load_archive(f, *, mmap=False, device=None, verify=True, run_once=False):
    """:func:`load_archive`; ``run_once`` (with ``mmap``): the module will
    be called about once (``mgtrace verify``), so its mapped weights are not
    vouched for to conv2d's cache of packed weights -- conv2d then picks
    the algorithms that need no packing, which for one call cost a quarter
    of packing weights that are never used again (ResNet-18: 20 ms against
    75 ms for the first call, on this project's 2-core machine)."""
    device = _check_device(device)
    with open_source(f, mmap) as src:
        return _guarded(_decode, src, mmap, device, verify, True, run_once)


def load(f, *, mmap=False, device=None, verify=True):
    """Read the object saved in archive ``f``.

    Nothing in an archive is pickle, and loading never imports or calls
    anything the archive names: functions and module types are looked up in
    the registry of stable names (registry.py), and only registered builtin
    module constructors run.

    Args:
        f: a path or a readable binary file object (read from its position).
        mmap: memory-map the file and return tensors that are views of it:
            no copy, read-only (writing to one raises ValueError "tensor is
            read-only ... copy it with .copy() before writing"). Modules
            (builtin and traced) get Parameters and buffers that are such
            views too, so e.g. a BatchNorm in training mode raises that
            error when it updates its running statistics; ``copy.deepcopy``
            the module, or load without mmap, to train it. The mapping lives
            as long as a tensor uses it; do not truncate or rewrite the file
            meanwhile (``save`` replaces a file by renaming, which is safe).
            For a file object without a descriptor the archive is read into
            memory once and viewed there. Without mmap every tensor is read
            once into memory of its own (writable), and modules use those.
        device: device for tensors and modules (``"cpu"``, ``"cuda:0"``...);
            default the CPU. Tensors on another device are copies.
        verify: check the header's checksum (format 1.1 on) and each
            tensor's checksum when it is read (on by default; turn off only
            for trusted files, to keep mmap loads lazy). With ``mmap`` and
            verify off the load is lazy: the graphs of TracedModules are
            read when first used (a call, ``.graph``, ``.code``, an edit,
            ``save``, ``copy.deepcopy``; all of the load's at once), with
            every check a load makes, so a broken graph raises its
            ArchiveError there, and again on each later use; so does a
            file truncated or written over since the load (a mapped page
            past a truncated file's end kills the process with SIGBUS
            when read, whatever reads it: this is checked at first use
            only, so do not truncate a mapped file).

    Returns:
        the saved object: Tensors (plain, not Parameters), modules rebuilt
        from type and config (parameters as Parameters), TracedModules with
        their graphs (namedtuples in their arguments and results are
        look-alike classes: see traced_codec.py), containers of the same
        types as saved.

    Raises:
        ArchiveError: anything wrong with the file: not an archive,
            truncated, corrupted (checksum), malformed or hostile header,
            absurd sizes, nesting too deep. Its subclasses RegistryError (an
            unregistered function or module type; the message says how to
            register it) and VersionError (written by a newer mgtrace, or
            no upgrader) say why.
        OSError: ``f`` cannot be opened or read.
        TypeError, ValueError: bad ``f`` or ``device`` arguments.
    """
    device = _check_device(device)
    with open_source(f, mmap) as src:
        return _guarded(_decode, src, mmap, device, verify, False).obj
