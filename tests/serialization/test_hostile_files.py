"""Files that are not what their name says, and files changed under a load:
a verified mmap load reads no tensor byte before the header passed its
checks (gigabytes of zeros named .tmod are refused at once, and so is a
prefix that claims a gigabyte of header that cannot be one), and a lazy
load whose file was truncated or rewritten before first use says so with an
ArchiveError at first use instead of dying of SIGBUS."""
import io
import os

import numpy as np
import pytest

import mgtrace as mt
from mgtrace.errors import ArchiveError
from mgtrace.serialization import source
from mgtrace.serialization.layout import MAGIC

from .helpers import save_bytes
from .traced_nets import assert_identical, every_expr_inputs, every_expr_net, trace_quiet


@pytest.fixture
def populated(monkeypatch):
    """The offsets each mapped source was asked to read in at once."""
    calls = []
    real = source._BufferSource.populate

    def spy(self, offset):
        calls.append(offset)
        return real(self, offset)
    monkeypatch.setattr(source._BufferSource, "populate", spy)
    return calls


def _tensors(n=3):
    rng = np.random.RandomState(0)
    return {f"w{i}": mt.tensor(rng.randn(64, 64).astype("float32")) for i in range(n)}


def test_a_verified_mmap_load_reads_the_data_in_after_the_header(tmp_path, populated):
    obj = _tensors()
    path = tmp_path / "a.tmod"
    path.write_bytes(b"junk" + save_bytes(obj))     # an archive inside a bigger file
    with open(path, "rb") as f:
        f.seek(4)
        got = mt.load(f, mmap=True)
    for k, t in obj.items():
        np.testing.assert_array_equal(got[k].numpy(), t.numpy())
    assert len(populated) == 1 and populated[0] % 64 == 0 and populated[0] > 16
    for kwargs in ({"mmap": True, "verify": False}, {}):  # trusted: nothing read ahead; copy:
        with open(path, "rb") as f:                       # nothing mapped
            f.seek(4)
            mt.load(f, **kwargs)
    assert len(populated) == 1


def test_zeros_named_tmod_are_refused_without_reading_them(tmp_path, populated):
    # 1 GiB of sparse zeros (no disk used): before the fix the verified mmap load mapped
    # every page first (MAP_POPULATE), seconds and a GiB of page cache per file
    path = tmp_path / "zeros.tmod"
    with open(path, "wb") as f:
        f.truncate(1 << 30)
    for mmap in (True, False):
        with pytest.raises(ArchiveError, match="not an mgtrace archive"):
            mt.load(path, mmap=mmap)
    assert populated == []


def test_a_corrupted_header_is_refused_before_the_data_is_read(tmp_path, populated):
    data = bytearray(save_bytes(_tensors()))
    data[40] ^= 0xFF                                # a byte of the header, under its seal
    path = tmp_path / "bad.tmod"
    path.write_bytes(bytes(data))
    with pytest.raises(ArchiveError, match="checksum"):
        mt.load(path, mmap=True)
    assert populated == []


@pytest.fixture(scope="module")
def traced():
    tm = trace_quiet(every_expr_net(), *every_expr_inputs(2))
    return tm, save_bytes(tm)


def test_a_lazy_load_survives_its_file_deleted_or_replaced_by_rename(traced, tmp_path):
    tm, data = traced
    x = every_expr_inputs(3, seed=1)
    for how in ("delete", "rename"):
        path = tmp_path / f"{how}.tmod"
        path.write_bytes(data)
        lazy = mt.load(path, mmap=True, verify=False)
        os.unlink(path)
        if how == "rename":        # what mt.save and mgtrace upgrade --in-place do
            (tmp_path / "new.tmod").write_bytes(save_bytes(_tensors()))
            os.replace(tmp_path / "new.tmod", path)
        assert_identical(lazy(*x), tm(*x))        # the mapping keeps the bytes it mapped


@pytest.mark.parametrize("how", ["truncated", "emptied", "rewritten"])
def test_a_lazy_load_whose_file_changed_under_it_fails_at_first_use(traced, tmp_path, how):
    # the graphs' first use read the new bytes: a truncated file killed the process with
    # SIGBUS at the first call (mapped pages past the end), a rewritten one ran another
    # archive's weights under this one's graphs
    _, data = traced
    path = tmp_path / "a.tmod"
    path.write_bytes(data)
    lazy = mt.load(path, mmap=True, verify=False)
    if how == "rewritten":                          # cp other.tmod a.tmod: the same inode
        with open(path, "r+b") as f:
            f.write(save_bytes(_tensors(8)))
    else:
        os.truncate(path, 0 if how == "emptied" else len(data) // 2)
    what = "rewritten in place" if how == "rewritten" else "truncated to"
    for _ in range(2):                              # and again on each later use
        with pytest.raises(ArchiveError, match=f"changed after the lazy load.*{what}"):
            lazy.code
    with pytest.raises(ArchiveError, match="changed after the lazy load"):
        lazy(*every_expr_inputs(2))


@pytest.fixture
def reads(monkeypatch):
    """The sizes of every read a source was asked for."""
    sizes = []
    for cls in (source._FileSource, source._BufferSource):
        def spy(self, offset, n, _real=cls.read):
            sizes.append(n)
            return _real(self, offset, n)
        monkeypatch.setattr(cls, "read", spy)
    return sizes


def test_a_prefix_claiming_a_gigabyte_header_of_zeros_is_refused_unread(tmp_path, reads):
    # a valid magic, then "1 GiB of header" that is sparse zeros: the whole header was read
    # (copied, then parsed as msgpack) to be refused: a 2 GiB one took 30 s and 6 GB of memory
    path = tmp_path / "claims.tmod"
    with open(path, "wb") as f:
        f.write(MAGIC + (1 << 30).to_bytes(8, "little"))
        f.truncate(16 + (1 << 30) + 64)
    for kwargs in ({}, {"mmap": True}, {"mmap": True, "verify": False}):
        with pytest.raises(ArchiveError, match="not valid msgpack: the prefix says 1073741824 "
                                               "bytes of header.*start with byte 0x00"):
            mt.load(path, **kwargs)
    assert reads and max(reads) < 1 << 10


def test_a_big_sealed_header_with_its_first_byte_corrupted_is_still_a_checksum_mismatch(tmp_path):
    # the look at the first byte leaves a sealed header to its seal: corrupted, not malformed
    data = bytearray(save_bytes(_tensors(1), metadata={"blob": "x" * (2 << 20)}))
    data[16] = 0x00
    with pytest.raises(ArchiveError, match="header checksum mismatch"):
        mt.load(io.BytesIO(bytes(data)))
