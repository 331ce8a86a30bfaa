"""The 1.1 header checksum: every single-byte change in a sealed header is
caught by load(verify=True), read_header and load_archive; 1.0 headers
(no seal) still load; the seal must be present from 1.1 on and last."""
import io
import zlib

import msgpack
import pytest

import mgtrace as mt
import mgtrace.module as M
from mgtrace.serialization import header as H
from mgtrace.serialization.layout import PREFIX

from .helpers import edit, load_bytes, save_bytes, split


def _model_bytes(**kw):
    net = M.Sequential(M.Linear(4, 3), M.ReLU())
    x = mt.tensor([[1.0, -2.0, 3.0, 0.5]])
    return save_bytes(mt.trace_module(net, x), example_inputs=(x,), **kw)


def _header_span(data):
    _, hlen = PREFIX.unpack(data[:PREFIX.size])
    return PREFIX.size, PREFIX.size + hlen


def test_the_seal_is_a_crc32_of_the_bytes_before_it():
    data = _model_bytes()
    a, b = _header_span(data)
    raw = data[a:b]
    header = msgpack.unpackb(raw, raw=False)
    value = header["header_checksum"]
    tail = msgpack.packb(value)
    assert raw.endswith(tail)
    assert value == f"crc32:{zlib.crc32(raw[:-len(tail)]):08x}"


def test_every_flipped_header_byte_is_caught():
    data = _model_bytes()
    a, b = _header_span(data)
    for pos in range(a, b):
        bad = bytearray(data)
        bad[pos] ^= 0x01
        with pytest.raises(mt.ArchiveError):
            load_bytes(bytes(bad))
        with pytest.raises(mt.ArchiveError):
            mt.serialization.read_header(io.BytesIO(bytes(bad)))


def test_a_changed_value_names_the_checksum():
    data = bytearray(_model_bytes())
    a, b = _header_span(data)
    i = data.index(b"in_features", a, b) + len(b"in_features")
    data[i] ^= 0x01            # the positive fixint after the key: 4 -> 5
    with pytest.raises(mt.ArchiveError, match="header checksum mismatch"):
        load_bytes(bytes(data))


def test_verify_false_skips_the_seal():
    data = bytearray(_model_bytes())
    a, b = _header_span(data)
    i = data.index(b"library", a, b) + len(b"library") + 1
    data[i] ^= 0x20            # "mgtrace" -> "Mgtrace": harmless, but not what was sealed
    with pytest.raises(mt.ArchiveError, match="header checksum mismatch"):
        load_bytes(bytes(data))
    assert isinstance(load_bytes(bytes(data), verify=False), M.Module)


def test_a_1_1_header_without_its_seal_is_refused():
    data = edit(_model_bytes(), lambda h: h.pop("header_checksum"))
    header, _ = split(data)
    assert header["format_version"] == [1, 1] and "header_checksum" not in header
    with pytest.raises(mt.ArchiveError, match="header_checksum: missing"):
        load_bytes(data)


def test_a_seal_that_is_not_last_is_refused():
    def move(h):
        seal = h.pop("header_checksum")
        items = list(h.items())
        h.clear()
        h.update([("header_checksum", seal)] + items)
    header, payload = split(_model_bytes())
    move(header)
    raw = msgpack.packb(header, use_bin_type=True)
    from mgtrace.serialization.layout import data_start, pack_prefix
    data = pack_prefix(len(raw)) + raw + bytes(data_start(len(raw)) - PREFIX.size - len(raw)) + payload
    with pytest.raises(mt.ArchiveError, match="not the header's last field"):
        load_bytes(data)


def test_1_0_archives_need_no_seal_and_load():
    data = _model_bytes(target_version=(1, 0))
    header, _ = split(data)
    assert header["format_version"] == [1, 0] and "header_checksum" not in header
    x = mt.tensor([[1.0, -2.0, 3.0, 0.5]])
    net = load_bytes(data)
    assert net(x).shape == (1, 3)


def test_pack_is_deterministic_and_keeps_the_seal_in_the_dict():
    h = {"format": "mgtrace.tmod", "x": [1, 2]}
    a = H.pack(h, sealed=True)
    assert list(h)[-1] == "header_checksum"
    assert H.pack(dict(h), sealed=True) == a
    H.check_seal(a, {"format_version": [1, 1], **msgpack.unpackb(a, raw=False)})


def test_a_corrupted_header_reports_the_checksum_before_parsing():
    # The seal is checked on the raw bytes first, so a flipped byte anywhere
    # before the seal's key reports the mismatch, never a msgpack or field error
    # (which is what parsing a corrupted header gives).
    data = _model_bytes()
    a, b = _header_span(data)
    seal_start = b - len(msgpack.packb("crc32:00000000")) - len(msgpack.packb(H.SEAL))
    for pos in range(a, seal_start):
        bad = bytearray(data)
        bad[pos] ^= 0x10
        with pytest.raises(mt.ArchiveError, match="header checksum mismatch"):
            load_bytes(bytes(bad))
        with pytest.raises(mt.ArchiveError, match="header checksum mismatch"):
            mt.serialization.read_header(io.BytesIO(bytes(bad)))


def test_a_header_cut_inside_a_map_reports_the_checksum():
    data = bytearray(_model_bytes())
    a, b = _header_span(data)
    i = data.index(b"format_version", a, b)
    data[i - 1] = 0xC1          # a byte msgpack never uses, in place of the key's header
    with pytest.raises(mt.ArchiveError, match="header checksum mismatch") as e:
        load_bytes(bytes(data))
    assert "msgpack" not in str(e.value)
