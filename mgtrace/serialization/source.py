"""Where an archive is read from: a path, a file object, or bytes in memory.

A source offers ``size``, ``read(offset, n) -> bytes`` and
``readinto(offset, array, crc=None)`` (given a running CRC-32, it returns
that CRC carried over the bytes it copied, computed piece by piece as they
are copied: the checksum pass and the copy read memory once), and, when it
holds the whole archive as one read-only buffer (an mmap, or bytes),
``view(offset, n) -> memoryview`` and ``wrap(offset, n, shape, dtype,
immutable) -> Tensor`` (a read-only tensor sharing those bytes).
Offsets count from the archive's first byte (a file object's position when
it was handed over). Reads past the end raise ArchiveError ("truncated").
"""
import io
import mmap as _mmap
import os
import sys
from contextlib import contextmanager

import numpy as np

from mgtrace._core.tensor import wrap_buffer
from mgtrace.errors import ArchiveError
from mgtrace.serialization.layout import PREFIX
from mgtrace.serialization.tensors import crc32

__all__ = ["open_source"]

CHUNK = 1 << 18     # bytes copied, then checksummed, at a time (well inside a core's L2)


def _truncated(offset, n, size):
    return ArchiveError(f"truncated archive: bytes {offset}..{offset + n} are needed, the "
                        f"archive has {size}")


class _FileSource:
    """A seekable binary file, read piece by piece (no more memory than asked)."""
    can_view = False

    def __init__(self, f, base, size):
        self._f, self._base, self.size = f, base, size

    def read(self, offset, n):
        if offset + n > self.size:
            raise _truncated(offset, n, self.size)
        self._f.seek(self._base + offset)
        data = self._f.read(n)
        if len(data) != n:
            raise _truncated(offset, n, self.size)
        return data

    def readinto(self, offset, arr, crc=None):
        view = memoryview(arr.reshape(-1).view(np.uint8))
        if offset + len(view) > self.size:
            raise _truncated(offset, len(view), self.size)
        self._f.seek(self._base + offset)
        done = 0
        while done < len(view):
            end = len(view) if crc is None else min(len(view), done + CHUNK)
            got = self._f.readinto(view[done:end])
            if not got:
                raise _truncated(offset, len(view), self.size)
            if crc is not None:     # while the bytes just read are in cache
                crc = crc32(view[done:done + got], crc)
            done += got
        return crc


class _BufferSource:
    """The whole archive as one read-only buffer (mmap or bytes)."""
    can_view = True

    def __init__(self, buf, base=0):
        self._mv = memoryview(buf).toreadonly()[base:]
        self.size = len(self._mv)
        self._map, self._base = (buf, base) if isinstance(buf, _mmap.mmap) else (None, 0)

    def stamp(self):
        """A token of what the mapped file holds now (its size, and the
        prefix and the last bytes of its header: a sealed header ends in its
        checksum), for :meth:`changed`; None for bytes in memory."""
        if self._map is None:
            return None
        try:
            size = self._map.size()
        except (OSError, ValueError):     # closed, or no descriptor to ask (Windows' tagname)
            return None
        if size < len(self._map):
            return size, None
        head = bytes(self._mv[:PREFIX.size])
        end = PREFIX.size + PREFIX.unpack(head)[1]
        return size, head + bytes(self._mv[max(PREFIX.size, end - 64):end])

    def changed(self, stamp):
        """Why the mapped file no longer holds the archive ``stamp``
        (:meth:`stamp`) was taken of, or None. Truncated under the mapping,
        a page past the new end would kill the process (SIGBUS) when read;
        rewritten in place, the mapping shows the new bytes."""
        if stamp is None:
            return None
        now = self.stamp()
        if now is None or now == stamp:
            return None
        if now[0] < len(self._map):
            return (f"the file was truncated to {now[0]} bytes; the archive took "
                    f"{len(self._map) - self._base} of its {len(self._map)}")
        return "the file was rewritten in place (its header is not the one loaded)"

    def populate(self, offset):
        """Read the mapped bytes from ``offset`` to the end in at once and map
        them (Linux's MADV_POPULATE_READ, else a read-ahead hint): for a load
        that reads every byte anyway (verify), one call instead of a page
        fault per 4 KiB page. Called once the header passed its checks, so a
        file that is not an archive (gigabytes of zeros named .tmod) or has
        a corrupted header is refused without reading the rest of it."""
        if self._map is None or offset >= self.size:
            return
        start = (self._base + offset) // _PAGE * _PAGE
        for advice in _POPULATE:
            try:
                self._map.madvise(advice, start, len(self._map) - start)
                return
            except (OSError, ValueError):   # an older kernel: the next advice
                continue

    def view(self, offset, n):
        if offset + n > self.size:
            raise _truncated(offset, n, self.size)
        return self._mv[offset:offset + n]

    def wrap(self, offset, n, shape, dtype, immutable):
        """A read-only tensor of ``shape`` and ``dtype`` over the ``n``
        bytes at ``offset``, sharing them (``wrap_buffer``: one call, no
        NumPy view); None where the bytes are not aligned for ``dtype``."""
        if offset + n > self.size:
            raise _truncated(offset, n, self.size)
        try:
            return wrap_buffer(self._mv, offset, shape, dtype, immutable)
        except ValueError:
            return None

    def read(self, offset, n):
        return self.view(offset, n).tobytes()

    def readinto(self, offset, arr, crc=None):
        flat = arr.reshape(-1).view(np.uint8)
        src = np.frombuffer(self.view(offset, flat.nbytes), np.uint8)
        if crc is None:
            flat[:] = src
            return None
        for i in range(0, len(flat), CHUNK):
            flat[i:i + CHUNK] = src[i:i + CHUNK]
            crc = crc32(flat[i:i + CHUNK], crc)
        return crc


# mapping every page of the tensor data at once, for a load that reads every byte anyway
# (verify): Linux's MADV_POPULATE_READ (22, since 5.14; Python 3.11 does not name it), else
# MADV_WILLNEED (the pages are read ahead, then faulted in one at a time)
_POPULATE = tuple(a for a in ((22 if sys.platform.startswith("linux") else None),
                              getattr(_mmap, "MADV_WILLNEED", None)) if a is not None)
_PAGE = _mmap.PAGESIZE


def _map(fileno, base):
    size = os.fstat(fileno).st_size
    if size == 0:
        return _BufferSource(b"")
    return _BufferSource(_mmap.mmap(fileno, 0, access=_mmap.ACCESS_READ), min(base, size))


@contextmanager
def open_source(f, mmap):
    """A source for ``f`` (a path or a readable binary file object).

    With ``mmap`` a path or a real file is memory-mapped (read-only); a file
    object without a file descriptor, or a pipe, is read into memory once.
    Without it, files are read piece by piece. A path is opened and closed
    here; a file object is left open. A mapped source's ``populate(offset)``
    reads its bytes from ``offset`` in at once (a load that verifies every
    checksum calls it once the header passed its checks).

    Raises:
        TypeError: ``f`` is neither a path nor a readable file object.
        OSError: the file cannot be opened or read.
    """
    if isinstance(f, (bytes, bytearray, memoryview)) and (len(f) > 4096 or b"\0" in bytes(f[:4096])):
        raise TypeError("load takes a path or a binary file object, and these bytes look like an "
                        "archive's contents: pass io.BytesIO(data)")
    if isinstance(f, (str, bytes, os.PathLike)):
        with open(f, "rb") as fh:
            if mmap:
                yield _map(fh.fileno(), 0)
            else:
                yield _FileSource(fh, 0, os.fstat(fh.fileno()).st_size)
        return
    if isinstance(f, io.TextIOBase):
        raise TypeError("load reads binary data: open the file with mode 'rb', not 'r'")
    if not hasattr(f, "read"):
        raise TypeError(f"load takes a path or a binary file object, got {type(f).__name__}")
    yield _source_of_file(f, mmap)


def _source_of_file(f, mmap):
    seekable = getattr(f, "seekable", lambda: False)()
    base = f.tell() if seekable else 0
    if mmap and seekable:
        try:
            return _map(f.fileno(), base)
        except (io.UnsupportedOperation, AttributeError, OSError):
            pass                      # BytesIO and the like: read it into memory below
    if seekable and not mmap:
        return _FileSource(f, base, f.seek(0, os.SEEK_END) - base)
    data = f.read()
    if not isinstance(data, (bytes, bytearray)):
        raise TypeError(f"load needs a binary file object; read() gave {type(data).__name__}")
    return _BufferSource(bytes(data))
