"""Regressions from breaking the core on purpose: each case once gave a
wrong answer, a wrong exception type or an unclear message."""
import numpy as np
import pytest

import mgtrace as mt
from mgtrace._core import index as I


def test_broadcast_views_are_read_only():
    base = mt.tensor([1.0, 2.0, 3.0])
    b = base.broadcast_to((4, 3))
    assert b.readonly and not base.readonly
    with pytest.raises(ValueError, match="broadcast view"):
        b += 1
    with pytest.raises(ValueError, match="broadcast view"):
        b[...] = 0.0
    with pytest.raises(ValueError, match="broadcast view"):
        b[0][1] = 5.0                       # views of the view stay read-only
    assert base.tolist() == [1.0, 2.0, 3.0]
    c = b.copy()
    c += 1
    assert c.tolist() == [[2.0, 3.0, 4.0]] * 4
    assert not np.from_dlpack(b).flags.writeable


def test_broadcast_to_element_count_overflow():
    with pytest.raises(ValueError, match="overflows int64"):
        mt.tensor([1.0, 2.0]).broadcast_to((2 ** 32, 2 ** 32, 2))
    with pytest.raises(ValueError, match="does not fit int64"):
        mt.tensor([1.0]).reshape(2 ** 63)


@pytest.mark.parametrize("data,dtype", [([-1], "uint8"), ([300], "uint8"), ([2 ** 20], "int8"),
                                        ([2 ** 63], "int64"), (2 ** 70, "int64"), ([[1], [2 ** 40]], "int32")])
def test_explicit_int_dtype_must_hold_python_ints(data, dtype):
    with pytest.raises(OverflowError, match=dtype):
        mt.tensor(data, dtype)


def test_explicit_dtype_still_casts_floats_and_keeps_fitting_ints():
    assert mt.tensor([2.7, -1.5], "int32").tolist() == [2, -1]
    assert mt.tensor([255, 0], "uint8").tolist() == [255, 0]
    assert mt.tensor([2 ** 40], "float32").item() == float(2 ** 40)


def test_zero_dim_bool_index():
    a = np.arange(6.0).reshape(2, 3)
    t = mt.tensor(a)
    for idx in (True, False):
        got = t[mt.tensor(idx)]
        want = a[np.array(idx)]
        assert got.shape == want.shape and np.array_equal(got.numpy(), want)
    assert t[1, mt.tensor(True)].tolist() == a[1, np.array(True)].tolist()
    with pytest.raises(IndexError, match="0-d bool"):
        t[mt.tensor(True), [0]]


def test_float32_sum_of_biased_data_is_accurate():
    a = np.full(10 ** 7, 0.1, np.float32)
    exact = 10 ** 7 * float(np.float32(0.1))
    assert abs(mt.tensor(a).sum().item() - exact) / exact < 2e-7


def test_view_never_copies():
    x = mt.tensor(np.arange(6.0).reshape(2, 3))
    with pytest.raises(ValueError, match="reshape"):
        x.T.view(6)
    v = x.view(3, 2)
    v[0, 0] = 100.0
    assert x[0, 0].item() == 100.0


def test_apply_checks_operand_count():
    t = mt.tensor([1.0, 2.0])
    with pytest.raises(TypeError, match="neg"):
        mt.apply(mt.OpDef("neg"), t, t)
    with pytest.raises(TypeError, match="add"):
        mt.apply(mt.OpDef("add"), t)
    assert t.tolist() == [1.0, 2.0]


def test_dtype_promotion_of_lists_matches_ops():
    a8 = mt.tensor([1], "int8")
    assert mt.dtype_promotion(a8, [1, 2]) == (a8 + [1, 2]).dtype == "int32"
    h = mt.tensor([1.0], "float16")
    assert mt.dtype_promotion(h, [1.5]) == (h + [1.5]).dtype == "float32"


def test_repr_of_huge_views_does_not_materialise():
    r = repr(mt.tensor([1.5]).broadcast_to((2 ** 20, 2 ** 20)))
    assert "1099511627776 elements" in r and "1.5" in r


def test_dlpack_device_request():
    t = mt.tensor([1.0])
    with pytest.raises(BufferError):
        t.__dlpack__(dl_device=(2, 0))
    assert np.from_dlpack(np.broadcast_to(np.arange(3.0), (2, 3))).shape == (2, 3)
    assert mt.from_dlpack(np.broadcast_to(np.arange(3.0), (2, 3))).readonly


def test_misc_messages_and_types():
    t = mt.tensor(np.arange(6.0).reshape(2, 3))
    with pytest.raises(IndexError):
        t[2 ** 70]
    with pytest.raises(TypeError, match="list or tuple"):
        I.concat(t)
    with pytest.raises(TypeError):
        mt.set_num_threads(1.5)
    with pytest.raises(ValueError, match="repeated"):
        t.reshape(1, 6, 1).squeeze((0, 0))
    assert (t == None) is False and (t != None) is True   # noqa: E711
    t[1:, 1:] = mt.tensor([[[7.0, 8.0]]])                  # leading unit axes drop, as in NumPy
    assert t[1].tolist() == [3.0, 7.0, 8.0]
    assert np.sum(t) .item() == float(np.sum(t.numpy()))
    assert np.mean(t).item() == pytest.approx(float(np.mean(t.numpy())))
