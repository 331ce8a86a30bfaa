"""A header is read without copies of itself: a prefix that claims a large
header (here 64 MB: an empty map, then zeros in a sparse file) used to cost
2x that in memory before the refusal (the read, then msgpack's ExtraData
error carrying a copy of everything after the map), 3x with mmap (the
header copied out of the mapping first). Headers above 1 MB are now read
and parsed piece by piece, their seal summed over the pieces, and what
follows the map is refused without a copy. Measured with tracemalloc (what
Python allocates), never with timing."""
import tracemalloc

import numpy as np
import pytest

import mgtrace as mt
import mgtrace.module as M
from mgtrace.errors import ArchiveError
from mgtrace.serialization.layout import MAGIC, PREFIX, data_start

CLAIM = 64 << 20


def _crafted(path, first, hlen=CLAIM):
    with open(path, "wb") as f:
        f.write(PREFIX.pack(MAGIC, hlen))
        f.write(first)
        f.truncate(data_start(hlen))        # zeros, sparse: no disk used
    return path


def _peak(fn):
    tracemalloc.start()
    try:
        fn()
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return peak


@pytest.mark.parametrize("mmap", [False, True])
@pytest.mark.parametrize("first, words", [
    (b"\x80", f"its map ends after 1 of the {CLAIM} bytes the prefix gives it"),      # {} then zeros
    (b"\xdf\xff\xff\xff\xff", "exceeds max_map_len"),       # a map claiming 2**32 - 1 entries
], ids=["empty-map", "map32-huge"])
def test_a_claimed_large_header_is_refused_in_little_memory(tmp_path, mmap, first, words):
    path = _crafted(str(tmp_path / "claims.tmod"), first)
    errors = []

    def load():
        with pytest.raises(ArchiveError) as e:
            mt.load(path, mmap=mmap)
        errors.append(str(e.value))
    peak = _peak(load)
    assert words in errors[0]
    assert peak < CLAIM // 8, f"{peak / 2**20:.1f} MB to refuse a {CLAIM >> 20} MB header"


def _big_header_archive(path):
    mt.random.seed(0)
    net = M.Linear(4, 3)
    notes = "".join(chr(65 + i % 26) for i in range(3 << 20))     # 3 MB of header
    mt.save(net, path, metadata={"notes": notes})
    return net, notes


@pytest.mark.parametrize("mmap", [False, True])
def test_a_large_header_read_in_pieces_loads_and_keeps_its_seal(tmp_path, mmap):
    path = str(tmp_path / "big.tmod")
    net, notes = _big_header_archive(path)
    hlen = PREFIX.unpack(open(path, "rb").read(PREFIX.size))[1]
    assert hlen > 3 << 20
    a = mt.serialization.load_archive(path, mmap=mmap)
    assert a.metadata == {"notes": notes}
    x = mt.tensor(np.arange(8, dtype=np.float32).reshape(2, 4))
    want = x.numpy() @ net.weight.numpy().T + net.bias.numpy()
    np.testing.assert_allclose(a.obj(x).numpy(), want, rtol=1e-6)
    # one letter of the notes changed: the seal, summed over the pieces, says so
    data = bytearray(open(path, "rb").read())
    at = data.index(b"ABCDEFGHIJ", PREFIX.size + (2 << 20))
    data[at] = ord("Z")
    with open(path, "wb") as f:
        f.write(data)
    with pytest.raises(ArchiveError, match="header checksum mismatch"):
        mt.load(path, mmap=mmap)


def test_bytes_after_a_large_headers_map_are_refused(tmp_path):
    """The prefix made to claim 2 MB more than the header holds (the
    padding's zeros then follow the map inside the claimed header)."""
    path = str(tmp_path / "big.tmod")
    _big_header_archive(path)
    data = bytearray(open(path, "rb").read())
    magic, hlen = PREFIX.unpack(data[:PREFIX.size])
    start = data_start(hlen)
    grown = hlen + (2 << 20)
    out = data[:PREFIX.size] + data[PREFIX.size:PREFIX.size + hlen] + bytes(data_start(grown) - PREFIX.size - hlen) \
        + data[start:]
    out[:PREFIX.size] = PREFIX.pack(magic, grown)
    with open(path, "wb") as f:
        f.write(out)
    with pytest.raises(ArchiveError, match=f"its map ends after {hlen} of the {grown} bytes"):
        mt.load(path, verify=False)
