"""Building, taking apart and comparing archives in tests."""
import io
import struct

import msgpack
import numpy as np

import mgtrace as mt
from mgtrace.serialization import header as H
from mgtrace.serialization.layout import PREFIX, data_start, pack_prefix


def save_bytes(obj, **kwargs):
    buf = io.BytesIO()
    mt.save(obj, buf, **kwargs)
    return buf.getvalue()


def load_bytes(data, **kwargs):
    return mt.load(io.BytesIO(data), **kwargs)


def split(data):
    """(header dict, tensor data bytes) of a valid archive."""
    _, hlen = PREFIX.unpack(data[:PREFIX.size])
    header = msgpack.unpackb(data[PREFIX.size:PREFIX.size + hlen], raw=False)
    return header, data[data_start(hlen):]


def pack(header, payload=b"", fix_nbytes=True):
    """An archive of ``header`` (a dict) and tensor ``payload``; by default
    data_nbytes is set to match the payload. A header that was sealed (has
    a header_checksum) is sealed again, so edits test what they mean to."""
    header = dict(header)
    if fix_nbytes:
        header["data_nbytes"] = len(payload)
    raw = H.pack(header, sealed=H.SEAL in header)
    pad = data_start(len(raw)) - PREFIX.size - len(raw)
    return pack_prefix(len(raw)) + raw + bytes(pad) + payload


def edit(data, fn):
    """The archive ``data`` after ``fn(header)`` changed its header in place."""
    header, payload = split(data)
    fn(header)
    return pack(header, payload, fix_nbytes=False)


def arr(t):
    return t.numpy() if isinstance(t, mt.Tensor) else np.asarray(t)


def assert_same(a, b, path="obj"):
    """a and b are equal with the same types at every level; tensors (or
    arrays on the b side) bit-exact with the same dtype and shape; floats
    compared by their bits (so -0.0 != 0.0 and NaN payloads count)."""
    if isinstance(b, np.ndarray) and isinstance(a, mt.Tensor):
        a_arr = a.numpy()
        assert a_arr.dtype == b.dtype and a_arr.shape == b.shape, path
        assert a_arr.tobytes() == b.tobytes(), path
        return
    assert type(a) is type(b), f"{path}: {type(a).__name__} != {type(b).__name__}"
    if isinstance(a, mt.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape, path
        assert a.numpy().tobytes() == b.numpy().tobytes(), path
    elif isinstance(a, float):
        assert struct.pack("<d", a) == struct.pack("<d", b), f"{path}: {a!r} != {b!r}"
    elif isinstance(a, np.generic):
        assert a.dtype == b.dtype and a.tobytes() == b.tobytes(), f"{path}: {a!r} != {b!r}"
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{path}[{i}]")
    elif isinstance(a, dict):
        assert len(a) == len(b), f"{path}: keys {list(a)} != {list(b)}"
        for (ka, va), (kb, vb) in zip(a.items(), b.items()):
            assert_same(ka, kb, f"{path} key")
            assert_same(va, vb, f"{path}[{ka!r}]")
    elif isinstance(a, slice):
        assert_same((a.start, a.stop, a.step), (b.start, b.stop, b.step), path)
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"
