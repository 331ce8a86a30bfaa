"""Tensor creation, views, conversion, DLPack, devices and bad input."""
import gc
import pickle

import numpy as np
import pytest

import mgtrace as mt
from conftest import ALL_DTYPES, assert_close, np_dtype, random_array


def test_default_dtypes():
    assert mt.tensor([1, 2, 3]).dtype == "int32"
    assert mt.tensor([1.0]).dtype == "float32"
    assert mt.tensor([True]).dtype == "bool"
    assert mt.tensor(3).dtype == np.int32 and mt.tensor(3).shape == ()
    assert mt.tensor(np.arange(3, dtype=np.int64)).dtype == "int64"   # NumPy input keeps its dtype
    assert mt.tensor(np.ones(2)).dtype == "float64"


@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_roundtrip_every_dtype(dtype, rng):
    a = random_array((3, 5), dtype, rng)
    t = mt.tensor(a)
    assert t.dtype == np_dtype(dtype) and t.shape == (3, 5) and t.ndim == 2 and t.size == 15
    np.testing.assert_array_equal(t.numpy(), a)
    np.testing.assert_array_equal(np.asarray(t), a)
    assert t.itemsize == a.itemsize and t.nbytes == a.nbytes


def test_dtype_compares_with_names_and_types():
    t = mt.tensor([1.0])
    assert t.dtype == "float32" and t.dtype == np.float32 and t.dtype == np.dtype("float32")


def test_python_int_out_of_int32_needs_explicit_dtype():
    with pytest.raises(OverflowError, match="int64"):
        mt.tensor([2 ** 40])
    assert mt.tensor([2 ** 40], dtype="int64").item() == 2 ** 40


def test_bad_data_and_dtypes():
    with pytest.raises(TypeError):
        mt.tensor(["a", "b"])
    with pytest.raises(TypeError):
        mt.tensor([1, 2], dtype="complex256")
    with pytest.raises(TypeError):
        mt.tensor([1, 2], dtype="nonsense")
    with pytest.raises(TypeError):
        mt.tensor(object())
    with pytest.raises(ValueError):
        mt.tensor([[1, 2], [3]])


def test_item_tolist_scalars():
    assert mt.tensor([[2.5]]).item() == 2.5
    assert mt.tensor([1, 2]).tolist() == [1, 2]
    assert mt.tensor([1.5], "bfloat16").tolist() == [1.5]
    with pytest.raises(ValueError, match="one element"):
        mt.tensor([1, 2]).item()
    assert int(mt.tensor(3)) == 3 and float(mt.tensor(2.5)) == 2.5
    assert [10, 20, 30][mt.tensor(1)] == 20
    with pytest.raises(TypeError):
        [1, 2][mt.tensor(1.0)]
    with pytest.raises(ValueError, match="ambiguous"):
        bool(mt.tensor([1, 2]))
    assert bool(mt.tensor([1])) and not bool(mt.tensor(0.0))


def test_len_iter_repr():
    t = mt.tensor([[1, 2], [3, 4]])
    assert len(t) == 2
    assert [r.tolist() for r in t] == [[1, 2], [3, 4]]
    r = repr(mt.tensor([1.5, 2.0]))
    assert "1.5" in r and "float32" in r and "cpu:0" in r
    with pytest.raises(TypeError):
        len(mt.tensor(1.0))
    assert "bfloat16" in repr(mt.tensor([1.0], "bfloat16"))


def test_views_share_memory():
    t = mt.tensor(np.arange(24, dtype=np.float32).reshape(2, 3, 4))
    v = t.reshape(6, 4)
    v[0, 0] = 100.0
    assert t[0, 0, 0].item() == 100.0
    tt = t.transpose(2, 0, 1)
    assert tt.shape == (4, 2, 3) and tt._storage_id() == t._storage_id()
    assert t[:, 1]._storage_id() == t._storage_id()
    assert t.expand_dims(0).shape == (1, 2, 3, 4)
    assert t.expand_dims((0, -1)).shape == (1, 2, 3, 4, 1)
    assert t.reshape(1, 24, 1).squeeze().shape == (24,)
    assert t.reshape(1, 24, 1).squeeze(0).shape == (24, 1)
    b = mt.tensor([1.0, 2.0]).broadcast_to((3, 2))
    assert b.shape == (3, 2) and b.strides == (0, 1)


@pytest.mark.parametrize("shape,new", [((2, 3, 4), (6, 4)), ((2, 3, 4), (-1,)), ((2, 3, 4), (4, -1)),
                                       ((6,), (1, 6, 1)), ((0, 3), (3, 0)), ((1,), ())])
def test_reshape_matches_numpy(shape, new):
    a = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
    assert_close(mt.tensor(a).reshape(new), a.reshape(new))
    assert_close(mt.tensor(a).T.reshape(new), a.T.reshape(new))  # copies when strides need it


def test_reshape_of_transposed_view_copies_or_views_correctly():
    a = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    t = mt.tensor(a).transpose(1, 0, 2)        # (3, 2, 4): last axis still contiguous
    v = t.reshape(3, 8)
    assert_close(v, a.transpose(1, 0, 2).reshape(3, 8))
    w = t.reshape(6, 4)                        # merges axes 0,1 of the view: not contiguous together
    assert_close(w, a.transpose(1, 0, 2).reshape(6, 4))


def test_reshape_and_view_errors():
    t = mt.tensor(np.zeros((2, 3)))
    with pytest.raises(ValueError, match="cannot reshape"):
        t.reshape(4, 2)
    with pytest.raises(ValueError, match="only one"):
        t.reshape(-1, -1)
    with pytest.raises(TypeError):
        t.reshape(2.0, 3)
    with pytest.raises(ValueError):
        t.transpose(0, 0)
    with pytest.raises(IndexError):
        t.transpose(0, 5)
    with pytest.raises(ValueError, match="size 3"):
        t.squeeze(1)
    with pytest.raises(ValueError, match="broadcast"):
        t.broadcast_to((3, 3))
    with pytest.raises(ValueError, match="at most 16"):
        mt.tensor(np.zeros((1,) * 17))


@pytest.mark.parametrize("size, shape", [
    (0, (2 ** 32, 2 ** 32)),          # the product wraps to 0 = the element count
    (8, (2 ** 61 + 1, 8)),            # wraps to 8
    (0, (-1, 2 ** 32, 2 ** 32)),
    (0, (0, 2 ** 40, 2 ** 40)),       # NumPy refuses this too ("array is too big")
])
def test_reshape_refuses_shapes_whose_product_passes_int64(size, shape):
    t = mt.tensor(np.zeros(size, np.float32))
    with pytest.raises(ValueError, match=r"cannot reshape .* more than 2\*\*62 elements"):
        t.reshape(shape)
    with pytest.raises(ValueError, match=r"more than 2\*\*62 elements"):
        t.view(shape)
    ok = (0, 2 ** 20, 2 ** 30) if size == 0 else (2, 1, 4)    # large but within the limit
    assert t.reshape(ok).shape == ok


def test_flatten():
    a = np.arange(24).reshape(2, 3, 4).astype(np.int32)
    assert mt.tensor(a).flatten().shape == (24,)
    assert mt.tensor(a).flatten(1).shape == (2, 12)
    assert_close(mt.tensor(a).flatten(0, 1), a.reshape(6, 4))


def test_dlpack_shares_memory_both_ways():
    t = mt.tensor(np.arange(6, dtype=np.float32).reshape(2, 3))
    a = np.from_dlpack(t)
    a[0, 0] = 42
    assert t[0, 0].item() == 42.0
    tv = t.T
    av = np.from_dlpack(tv)
    assert av.shape == (3, 2) and av[2, 1] == 5.0
    n = np.arange(5, dtype=np.int16)
    m = mt.from_dlpack(n)
    n[1] = 77
    assert m[1].item() == 77 and m.dtype == "int16"
    del n
    gc.collect()
    assert m.tolist() == [0, 77, 2, 3, 4]   # storage keeps the producer alive
    assert t.__dlpack_device__() == (1, 0)
    with pytest.raises(TypeError):
        mt.from_dlpack([1, 2])


@pytest.mark.parametrize("dtype", ["bool", "int8", "uint16", "int64", "float16", "float64"])
def test_dlpack_dtypes(dtype, rng):
    a = random_array((4,), dtype, rng)
    np.testing.assert_array_equal(np.from_dlpack(mt.tensor(a)), a)
    np.testing.assert_array_equal(mt.from_dlpack(a).numpy(), a)


def test_numpy_array_left_operand_defers_to_tensor():
    out = np.ones(3, np.float32) + mt.tensor([1.0, 2.0, 3.0])
    assert isinstance(out, mt.Tensor) and out.tolist() == [2.0, 3.0, 4.0]


def test_devices_and_ambiguity():
    a = mt.tensor([1.0, 2.0], device="cpu:1")
    assert a.device == mt.Device("cpu:1") and str(a.device) == "cpu:1"
    assert (a + 1).device == "cpu:1"
    assert (a + np.ones(2, np.float32)).device == "cpu:1"   # NumPy operands follow the tensor
    b = mt.tensor([1.0, 2.0])
    with pytest.raises(ValueError, match="ambiguous device: cpu:1 vs cpu:0"):
        a + b
    with pytest.raises(ValueError, match="ambiguous device"):
        mt.get_device(a, b)
    assert mt.get_device(a, 1.0) == "cpu:1"
    assert a.to("cpu").device == "cpu:0" and (a.to("cpu") + b).tolist() == [2.0, 4.0]
    assert mt.Device("cpu") == mt.Device("cpu:0") and mt.Device("gpu0") == mt.Device("cuda:0")
    assert mt.Device("xpux") == ("cuda:0" if mt.cuda_available() else "cpu:0")
    with pytest.raises(ValueError):
        mt.Device("tpu:0")
    with pytest.raises(TypeError):
        mt.Device(3)


def test_default_device():
    try:
        mt.set_default_device("cpu:2")
        assert mt.tensor([1]).device == "cpu:2"
    finally:
        mt.set_default_device("cpu")
    assert mt.tensor([1]).device == "cpu:0"


@pytest.mark.skipif(mt.cuda_available(), reason="checks the no-CUDA error")
def test_cuda_without_build_is_a_clear_error():
    if mt.cuda.is_available():
        pytest.skip("this machine has a usable GPU")
    # not built: NotImplementedError naming the switch; built but no GPU
    # (CI): DeviceError (a RuntimeError) with the CUDA runtime's reason
    with pytest.raises((NotImplementedError, RuntimeError), match="CUDA"):
        mt.tensor([1.0], device="cuda:0")


def test_tensor_does_not_pickle():
    with pytest.raises(TypeError, match="mgtrace.save"):
        pickle.dumps(mt.tensor([1.0]))


def test_hash_is_identity():
    a, b = mt.tensor([1.0]), mt.tensor([1.0])
    assert len({a, b}) == 2


def test_copy_and_contiguous():
    t = mt.tensor(np.arange(6, dtype=np.float32).reshape(2, 3))
    c = t.copy()
    c[0, 0] = 9.0
    assert t[0, 0].item() == 0.0
    assert t.T.contiguous().is_contiguous and t.contiguous() is t


def test_dlpack_read_only_producer_gives_read_only_tensor():
    a = np.arange(4.0)
    a.flags.writeable = False
    t = mt.from_dlpack(a)
    assert t.readonly and t.tolist() == [0.0, 1.0, 2.0, 3.0]
    with pytest.raises(ValueError, match="read-only"):
        t[0] = 5.0
    with pytest.raises(ValueError, match="read-only"):
        t += 1
    assert (t + 1).tolist() == [1.0, 2.0, 3.0, 4.0] and not (t + 1).readonly


def test_dlpack_with_torch_shares_memory():
    torch = pytest.importorskip("torch")
    tt = torch.arange(5.0)
    m = mt.from_dlpack(tt)
    m[0] = 9.0
    assert tt[0].item() == 9.0
    back = torch.from_dlpack(mt.tensor([[1, 2], [3, 4]], dtype="int64").T)
    assert back.tolist() == [[1, 3], [2, 4]]


def test_copy_and_deepcopy_keep_class_and_attributes():
    import copy

    class Sub(mt.Tensor):
        pass

    s = Sub([1.0, 2.0])
    s.note = {"k": [1]}
    d = copy.deepcopy(s)
    assert type(d) is Sub and d.tolist() == [1.0, 2.0] and d.note == {"k": [1]}
    assert d.note is not s.note and d._storage_id() != s._storage_id()
    c = copy.copy(mt.tensor([3, 4]).T)
    assert c.tolist() == [3, 4] and c.is_contiguous
    nested = copy.deepcopy({"w": [mt.tensor([1.0])]})
    assert nested["w"][0].tolist() == [1.0]


@pytest.mark.parametrize("code", [">f4", ">f8", ">i8", ">i2", ">u2", "<f4", "=f4"])
def test_non_native_byte_order_is_converted_on_copy(code):
    # mt.tensor copies, so a big-endian array is read by value into native order (as jax does)
    want = np.array([[1.5, -2.0, 3.0], [2**13, 0.0, 7.0]]).astype(code)
    t = mt.tensor(want)
    assert t.dtype == want.dtype.newbyteorder("=") and t.numpy().dtype.isnative
    np.testing.assert_array_equal(t.numpy(), want)
    assert t.numpy().tolist() == want.tolist()
    np.testing.assert_array_equal(mt.tensor(want[:, ::2]).numpy(), want[:, ::2])   # strided view
    big = np.array([2**40 + 3], ">i8")
    assert mt.tensor(big).numpy()[0] == 2**40 + 3
    # as an operand of an op it is copied too
    got = mt.tensor(np.ones(3, "float32")) + want[0].astype(">f4")
    np.testing.assert_array_equal(got.numpy(), want[0].astype("float32") + 1)


def test_non_native_byte_order_as_a_dtype_names_byte_order_and_fix():
    with pytest.raises(TypeError, match=r"'>f4' \(float32\) is not in native byte order.*"
                                        r"pass 'float32'.*newbyteorder\('='\)"):
        mt.tensor(np.ones(2, "float32")).astype(">f4")


def test_bool_bytes_other_than_one_are_stored_as_true():
    # NumPy reads any nonzero byte of a bool array as True; a view of raw
    # bytes can hold 5: the tensor must store 1, or integer casts and
    # comparisons would see the 5 (hand-computed expectation)
    raw = np.frombuffer(b"\x05\x00\x01\xff", dtype=bool)
    t = mt.tensor(raw)
    np.testing.assert_array_equal(t.astype("int32").numpy(), [1, 0, 1, 1])
    np.testing.assert_array_equal((t == mt.tensor(np.array([True, False, True, True]))).numpy(),
                                  [True] * 4)
    np.testing.assert_array_equal(mt.tensor(raw[::2]).astype("int32").numpy(), [1, 1])
