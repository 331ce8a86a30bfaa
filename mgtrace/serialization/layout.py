"""The bytes of a ``.tmod`` file (DESIGN.md, "Archive format")::

    offset 0    8 bytes   MAGIC  b"\\x89TMOD\\r\\n\\x1a"
    offset 8    8 bytes   header length H, unsigned little-endian
    offset 16   H bytes   header: one msgpack map (see header.py)
    ...         zeros     padding up to a multiple of ALIGN (64)
    data_start  ...       tensor data; each tensor at data_start + its offset,
                          offsets multiples of ALIGN, so an mmap of the file
                          hands out aligned tensors without copying

The magic borrows PNG's trick: a high first byte catches 7-bit transfers and
``\\r\\n`` / ``\\x1a`` catch newline translation and DOS text-mode reads.
"""
import struct

from mgtrace.errors import ArchiveError

MAGIC = b"\x89TMOD\r\n\x1a"
PREFIX = struct.Struct("<8sQ")      # magic, header length
ALIGN = 64


def align(n):
    """``n`` rounded up to a multiple of :data:`ALIGN`."""
    return -(-n // ALIGN) * ALIGN


def data_start(header_len):
    """File offset where tensor data begins for a header of ``header_len`` bytes."""
    return align(PREFIX.size + header_len)


def pack_prefix(header_len):
    """The 16 bytes before the header."""
    return PREFIX.pack(MAGIC, header_len)


def _guess(head):
    if head[:1] == b"\x80":
        return " (it looks like a pickle, which mgtrace never loads)"
    if head[:2] == b"PK":
        return " (it looks like a zip file, e.g. a torch.save checkpoint)"
    if len(head) >= 2 and head[0] == 0x08 and 1 <= head[1] <= 15:
        # ModelProto's field 1, ir_version, is first in what onnx writes
        return (" (it looks like an ONNX model: mgtrace.onnx.load or `mgtrace import "
                "model.onnx -o model.tmod` read those)")
    return ""


def parse_prefix(prefix, file_size):
    """Check the first 16 bytes of a file of ``file_size`` bytes.

    Returns:
        ``(header_len, data_start)``.

    Raises:
        ArchiveError: the file is shorter than the prefix ("not an mgtrace
        archive", or "truncated" when it starts with the magic), the magic
        is wrong, or the header (with its padding) runs past the end.
    """
    if file_size < PREFIX.size or len(prefix) < PREFIX.size:
        head = prefix[:len(MAGIC)]
        if head == MAGIC:       # the magic is there: an archive cut short
            raise ArchiveError(f"truncated archive: {file_size} bytes, but the magic and header "
                               f"length alone take {PREFIX.size}")
        size = "the file is empty" if not file_size else f"{file_size} bytes"
        raise ArchiveError(f"not an mgtrace archive: {size}, shorter than the {PREFIX.size}-byte "
                           f"start of every archive (the magic {MAGIC!r} and the header "
                           f"length){_guess(head)}")
    magic, header_len = PREFIX.unpack(prefix[:PREFIX.size])
    if magic != MAGIC:
        raise ArchiveError(f"not an mgtrace archive: it starts with {magic!r}, not the magic "
                           f"{MAGIC!r}{_guess(magic)}")
    if header_len > file_size - PREFIX.size:
        raise ArchiveError(f"truncated archive or corrupted header length: the header claims "
                           f"{header_len} bytes, but only {file_size - PREFIX.size} follow "
                           "the prefix")
    start = data_start(header_len)
    if start > file_size:
        raise ArchiveError(f"truncated archive: the header's padding ends at byte {start}, "
                           f"the file has {file_size}")
    return header_len, start
