"""tensors.py: every dtype round-trips bit-exactly (0-d, empty, non-contiguous,
bfloat16), data is 64-byte aligned and checksummed, mmap hands out read-only
views of the file, and the tensor table is checked before any data is read."""
import io
import zlib
from collections import OrderedDict

import numpy as np
import pytest

import mgtrace as mt
from mgtrace.serialization.layout import ALIGN

from conftest import ALL_DTYPES, np_dtype, random_array
from .helpers import edit, load_bytes, save_bytes, split


@pytest.mark.parametrize("dtype", ALL_DTYPES)
@pytest.mark.parametrize("shape", [(), (0,), (3, 0, 2), (5,), (2, 3, 4)])
@pytest.mark.parametrize("mmap", [False, True])
def test_round_trip_bit_exact(dtype, shape, mmap, rng):
    a = random_array(shape, dtype, rng)
    out = load_bytes(save_bytes(mt.tensor(a)), mmap=mmap)
    assert type(out) is mt.Tensor and out.dtype == np_dtype(dtype) and out.shape == shape
    assert out.numpy().tobytes() == a.tobytes()


def test_special_float_bits_survive():
    bits = np.array([0x8000_0000, 0x7FC0_1234, 0xFF80_0000, 0x0000_0001], np.uint32)
    a = bits.view(np.float32)
    out = load_bytes(save_bytes(mt.tensor(a)))
    assert out.numpy().view(np.uint32).tolist() == bits.tolist()


def test_non_contiguous_tensors_are_saved_contiguously(rng):
    # one view of each base: nothing shares memory, so each is stored contiguously
    # (views of one storage stay views: test_aliases.py)
    base = lambda: mt.tensor(rng.standard_normal((4, 6)).astype(np.float32))   # noqa: E731
    views = {"t": base().transpose(), "s": base()[:, ::2],
             "b": mt.tensor([1.0, 2.0]).broadcast_to((3, 2))}
    out = load_bytes(save_bytes(views))
    for k, v in views.items():
        np.testing.assert_array_equal(out[k].numpy(), v.numpy())
        assert out[k].is_contiguous and not out[k].readonly


def test_offsets_are_aligned_and_data_matches_checksums(rng):
    sd = OrderedDict((f"t{i}", mt.tensor(random_array((i + 1, 3), d, rng)))
                     for i, d in enumerate(["int8", "float16", "float64", "bool", "bfloat16"]))
    header, payload = split(save_bytes(sd))
    for e, t in zip(header["tensors"], sd.values()):
        assert e["offset"] % ALIGN == 0
        chunk = payload[e["offset"]:e["offset"] + e["nbytes"]]
        assert chunk == t.numpy().tobytes()
        assert e["checksum"] == f"crc32:{zlib.crc32(chunk):08x}"
        assert e["dtype"] == t.dtype.name and e["shape"] == list(t.shape)


def test_same_tensor_and_equal_views_are_stored_once():
    t = mt.tensor(np.arange(6, dtype=np.float32))
    header, _ = split(save_bytes([t, t, t.reshape(6)]))
    assert len(header["tensors"]) == 1
    out = load_bytes(save_bytes([t, t]))
    assert out[0] is out[1]


def test_mmap_tensors_are_read_only_views_of_the_file(tmp_path):
    path = tmp_path / "w.tmod"
    a = np.arange(1000, dtype=np.float32)
    mt.save({"w": mt.tensor(a)}, path)
    out = mt.load(path, mmap=True)["w"]
    assert out.readonly
    with pytest.raises(ValueError, match="read-only"):
        out[0] = 5.0
    view = np.from_dlpack(out)          # the tensor's memory is the mapped file's
    assert not view.flags.writeable and view.ctypes.data % ALIGN == 0
    np.testing.assert_array_equal(view, a)
    copy = out.copy()
    copy[0] = 5.0
    assert copy.numpy()[0] == 5.0 and out.numpy()[0] == 0.0
    assert np.array_equal((out + 1).numpy(), a + 1)


def test_copying_load_gives_writable_aligned_tensors(tmp_path):
    path = tmp_path / "w.tmod"
    mt.save(mt.tensor(np.ones((3, 5), np.float32)), path)
    out = mt.load(path)
    assert not out.readonly and out.data_ptr % ALIGN == 0
    out[0, 0] = 7.0
    assert out.numpy()[0, 0] == 7.0


@pytest.mark.parametrize("mmap", [False, True])
def test_saved_and_loaded_conv_weights_keep_their_packed_cache(tmp_path, mmap, rng):
    """Saving a module reads its weights without marking them shared, and a
    loaded module's weights live in memory whose writes mgtrace sees (its
    own, or the read-only mapped file), so conv2d caches their packed
    copies for both; the loaded module computes the same values."""
    import mgtrace.module as M
    from mgtrace._core import nn as cnn
    conv = M.Conv2d(16, 24, 3, padding=1).eval()
    x = mt.tensor(rng.standard_normal((1, 16, 7, 7)).astype(np.float32))
    cnn.clear_weight_cache()
    want = conv(x).numpy()
    assert cnn.weight_cache_info()[0] == 1
    mt.save(conv, tmp_path / "c.tmod")
    cnn.clear_weight_cache()
    conv(x)
    assert cnn.weight_cache_info()[0] == 1          # still cacheable after the save
    back = mt.load(tmp_path / "c.tmod", mmap=mmap)
    cnn.clear_weight_cache()
    np.testing.assert_array_equal(back(x).numpy(), want)
    assert cnn.weight_cache_info()[0] == 1
    cnn.clear_weight_cache()


def test_a_load_for_one_call_leaves_conv_weights_out_of_the_packed_cache(tmp_path, rng):
    """What ``mgtrace verify`` loads (mapped, run once) is not packed for
    the cache; the outputs are the same within float32 rounding (another
    convolution algorithm)."""
    import mgtrace.module as M
    from mgtrace._core import nn as cnn
    from mgtrace.serialization.reader import _load_archive
    conv = M.Conv2d(16, 24, 3, padding=1).eval()
    x = mt.tensor(rng.standard_normal((1, 16, 7, 7)).astype(np.float32))
    want = conv(x).numpy()
    mt.save(conv, tmp_path / "c.tmod")
    cnn.clear_weight_cache()
    once = _load_archive(tmp_path / "c.tmod", mmap=True, run_once=True).obj
    assert once.weight.readonly
    np.testing.assert_allclose(once(x).numpy(), want, rtol=1e-5, atol=1e-5)
    assert cnn.weight_cache_info()[0] == 0
    kept = mt.load(tmp_path / "c.tmod", mmap=True)
    np.testing.assert_array_equal(kept(x).numpy(), want)
    assert cnn.weight_cache_info()[0] == 1
    del kept        # the module and its mapped weight go: so does the weight's pack
    assert cnn.weight_cache_info() == (0, 0)
    cnn.clear_weight_cache()


def test_mmap_of_a_file_object_and_of_bytes(tmp_path):
    data = save_bytes(mt.tensor([1.0, 2.0]))
    (tmp_path / "a.tmod").write_bytes(data)
    with open(tmp_path / "a.tmod", "rb") as f:
        t = mt.load(f, mmap=True)
    assert t.readonly and t.tolist() == [1.0, 2.0]
    t2 = mt.load(io.BytesIO(data), mmap=True)
    assert t2.readonly and t2.tolist() == [1.0, 2.0]


def test_device_argument_places_tensors():
    out = load_bytes(save_bytes({"a": mt.tensor([1, 2])}), device="cpu:0")
    assert str(out["a"].device) == "cpu:0"
    with pytest.raises(ValueError, match="unknown device"):
        load_bytes(save_bytes(mt.tensor([1])), device="moon")


def test_corrupted_data_fails_its_checksum_unless_verify_is_off():
    data = bytearray(save_bytes(mt.tensor(np.zeros(16, np.float32))))
    data[-3] ^= 0x40
    for mmap in (False, True):
        with pytest.raises(mt.ArchiveError, match=r"tensors\[0\]: checksum mismatch"):
            load_bytes(bytes(data), mmap=mmap)
    assert load_bytes(bytes(data), verify=False).numpy()[-1] != 0


def _table(**change):
    data = save_bytes([mt.tensor(np.ones((8, 8), np.float32)), mt.tensor(np.ones(2, np.int8))])

    def fn(h):
        h["tensors"][change.pop("index", 0)].update(change)
    return edit(data, fn)


@pytest.mark.parametrize("change, reason", [
    ({"dtype": "object"}, "unknown dtype"),
    ({"dtype": 5}, "expected string"),
    ({"shape": [4, 5]}, "nbytes is 256, but shape"),
    ({"shape": [10 ** 9, 10 ** 9]}, "nbytes is 256, but shape"),
    ({"shape": [1] * 17}, "at most 16"),
    ({"shape": [-4, -4]}, "non-negative"),
    ({"shape": "4x4"}, "list of at most"),
    ({"nbytes": 10 ** 18, "shape": [10 ** 9, 250_000_000]}, "run past the end"),
    ({"offset": 1 << 62}, "run past the end"),
    ({"offset": 3}, "multiple of 64"),
    ({"offset": 64, "index": 1}, "overlap"),
    ({"offset": 0, "index": 1}, "overlap"),
    ({"checksum": "md5:00"}, "unknown algorithm"),
    ({"checksum": None}, "expected string"),
])
def test_bad_tensor_tables_raise_archive_error(change, reason):
    with pytest.raises(mt.ArchiveError, match=reason):
        load_bytes(_table(**change))


def test_duplicate_tensor_entries_are_an_overlap():
    def dup(h):
        h["tensors"].append(dict(h["tensors"][0]))
    with pytest.raises(mt.ArchiveError, match=r"tensors\[0\] and header.tensors\[2\] overlap"):
        load_bytes(edit(save_bytes([mt.tensor([1.0]), mt.tensor([2])]), dup))


class _Stream:
    """A file object that can only be read (a pipe): loaded from memory."""

    def __init__(self, data):
        self._f = io.BytesIO(data)

    def read(self, n=-1):
        return self._f.read(n)


@pytest.mark.parametrize("how", ["path", "file object", "stream", "mmap"])
@pytest.mark.parametrize("n", [0, 1, (1 << 16) - 3, (1 << 16) + 5, 3 << 16])
def test_checksums_are_taken_piece_by_piece_as_tensors_are_read(tmp_path, how, n, rng):
    # a float32 tensor of n elements spans 0 to 3 of the reader's 256 KiB pieces;
    # every byte counts: flipping the last one (in the last piece) fails the load
    from mgtrace.serialization import source, tensors
    a = rng.standard_normal(n).astype(np.float32)
    data = save_bytes([mt.tensor(a), mt.tensor(np.arange(3, dtype=np.int64))])
    header, payload = split(data)
    assert header["tensors"][0]["checksum"] == f"crc32:{zlib.crc32(a.tobytes()):08x}"
    assert tensors.checksum(a.tobytes()) == f"crc32:{zlib.crc32(a.tobytes()):08x}"
    path = tmp_path / "t.tmod"
    path.write_bytes(data)
    if how == "file object":
        got = mt.load(io.BytesIO(data))
    elif how == "stream":
        got = mt.load(_Stream(data))
    else:
        got = mt.load(path, mmap=how == "mmap")
    assert got[0].numpy().tobytes() == a.tobytes() and got[1].numpy().tolist() == [0, 1, 2]
    if n:
        bad = bytearray(data)
        bad[len(data) - len(payload) + header["tensors"][0]["offset"] + 4 * n - 1] ^= 1
        path.write_bytes(bytes(bad))
        for mmap in (False, True):
            with pytest.raises(mt.ArchiveError, match=r"tensors\[0\]: checksum mismatch"):
                mt.load(path, mmap=mmap)
        for f in (io.BytesIO(bytes(bad)), _Stream(bytes(bad))):
            with pytest.raises(mt.ArchiveError, match=r"tensors\[0\]: checksum mismatch"):
                mt.load(f)
    assert source.CHUNK == 1 << 18


def test_crc32_is_zlibs_whichever_library_computes_it(rng):
    from mgtrace.serialization import tensors
    for n in (0, 1, 63, 64, 4097, 1 << 20):
        b = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
        assert tensors.crc32(b) == zlib.crc32(b)
        assert tensors.crc32(b[n // 2:], tensors.crc32(b[:n // 2])) == zlib.crc32(b)
        assert tensors.crc32(memoryview(np.frombuffer(b, np.uint8))) == zlib.crc32(b)


def test_wrap_buffer_shares_the_bytes_holds_the_buffer_and_refuses_bad_requests(tmp_path):
    """The mmap reader's one-call tensor: a read-only view of the bytes at
    an offset (values as NumPy reads them), the buffer kept alive and
    exported while the tensor lives, bad requests refused."""
    import gc
    import mmap
    from mgtrace._core.tensor import wrap_buffer
    want = np.arange(12, dtype=np.float32)
    t = wrap_buffer(want.tobytes(), 16, (2, 4), "float32")   # the bytes object is the tensor's alone
    gc.collect()
    assert t.readonly and t.shape == (2, 4) and t.dtype == np.float32
    np.testing.assert_array_equal(t.numpy(), want[4:].reshape(2, 4))
    assert wrap_buffer(b"", 0, (0, 3), "int64").shape == (0, 3)
    (tmp_path / "f").write_bytes(np.arange(4, dtype=np.int16).tobytes())
    with open(tmp_path / "f", "rb") as f:
        m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    v = wrap_buffer(m, 2, (3,), "int16")
    assert v.tolist() == [1, 2, 3]
    with pytest.raises(BufferError):
        m.close()                       # the tensor's export keeps the mapping open
    del v
    m.close()
    raw = bytes(64)
    for args, err, text in [((raw, 60, (2,), "float32"), ValueError, "past the buffer's end"),
                            ((raw, -4, (1,), "float32"), ValueError, "past the buffer's end"),
                            ((raw, 0, (4, -1), "float32"), ValueError, "negative dimension"),
                            ((raw, 0, (1 << 40, 1 << 40), "int8"), ValueError, "more bytes"),
                            ((raw, 0, (1,) * 17, "int8"), ValueError, "at most 16"),
                            ((raw, 0, (2,), "uint32"), TypeError, "uint32"),
                            (([1, 2], 0, (1,), "int8"), TypeError, "bytes-like")]:
        with pytest.raises(err, match=text):
            wrap_buffer(*args)
    if np.frombuffer(raw, np.uint8).ctypes.data % 4 == 0:
        with pytest.raises(ValueError, match="not aligned"):
            wrap_buffer(raw, 2, (1,), "float32")
