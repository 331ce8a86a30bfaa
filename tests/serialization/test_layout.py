"""layout.py: magic, header length and padding, and what a reader says about
files that are not archives or are cut short anywhere."""
import pickle

import numpy as np
import pytest

import mgtrace as mt
from mgtrace.serialization.layout import ALIGN, MAGIC, PREFIX, data_start

from .helpers import load_bytes, save_bytes


def test_prefix_header_padding_data():
    data = save_bytes(mt.tensor(np.arange(5, dtype=np.int16)))
    magic, hlen = PREFIX.unpack(data[:16])
    assert magic == MAGIC and len(MAGIC) == 8
    start = data_start(hlen)
    assert start % ALIGN == 0 and data[16 + hlen:start] == bytes(start - 16 - hlen)
    assert data[start:start + 10] == np.arange(5, dtype=np.int16).tobytes()
    assert len(data) == start + 10


@pytest.mark.parametrize("blob, reason", [
    (b"", "not an mgtrace archive: the file is empty"),
    (MAGIC[:5], "not an mgtrace archive: 5 bytes, shorter than the 16-byte start"),
    (b"hello\n", "not an mgtrace archive: 6 bytes"),
    (MAGIC + b"\x01\x00", "truncated archive: 10 bytes"),      # the magic, then cut
    (b"PK\x03\x04" + bytes(60), "zip file"),
    (pickle.dumps({"a": 1}) + bytes(16), "pickle, which mgtrace never loads"),
    (b"GIF89a" + bytes(30), "not an mgtrace archive"),
    (MAGIC + (1 << 60).to_bytes(8, "little"), "header claims 1152921504606846976 bytes"),
    (MAGIC + (5).to_bytes(8, "little") + b"\x80" * 5, "padding ends at byte 64"),
])
def test_not_an_archive(blob, reason):
    with pytest.raises(mt.ArchiveError, match=reason):
        load_bytes(blob)


def test_truncated_anywhere_is_an_archive_error(rng):
    data = save_bytes({"a": mt.tensor(rng.standard_normal((4, 4)).astype(np.float32)),
                       "b": [1, 2, "x"]})
    for n in list(range(0, 80)) + list(range(80, len(data), 7)):
        with pytest.raises(mt.ArchiveError):
            load_bytes(data[:n])
    with pytest.raises(mt.ArchiveError, match="trailing bytes"):
        load_bytes(data + b"\0")


def test_padding_must_be_zeros():
    data = bytearray(save_bytes(mt.tensor([1.0])))
    _, hlen = PREFIX.unpack(data[:16])
    if data_start(hlen) > 16 + hlen:
        data[16 + hlen] = 1
        with pytest.raises(mt.ArchiveError, match="padding"):
            load_bytes(bytes(data))
