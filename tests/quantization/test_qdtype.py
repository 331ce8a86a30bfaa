"""Quantized dtypes in the core (issue 32 item 1): MegEngine's dtype
metadata, astype between float and quantized, every layout op keeping the
dtype (applied twice: a view of a view), and arithmetic refused naming
both dtypes. References are NumPy integer arithmetic and hand values."""
import numpy as np
import pytest

import mgtrace as mt
import mgtrace.functional as F
from mgtrace.quantization import QuantizationError
from mgtrace.quantization import qdtype as Q

F32 = np.float32


def _q(values, dtype):
    return mt.tensor(np.asarray(values, F32)).astype(dtype)


def _ref(values, scale, zp, lo, hi, storage):
    v = np.asarray(values, F32)
    q = (np.rint(v / F32(scale)) + F32(zp)).astype(np.float64)    # exact ends for qint32
    return np.clip(q, lo, hi).astype(storage)


def test_dtypes_carry_megengine_metadata():
    d = Q.qint8(0.1)
    assert d == np.int8 and d.metadata == {"mgb_dtype": {"name": "QuantizedS8",
                                                          "scale": float(F32(0.1))}}
    u = Q.quint8(0.5, 128)
    assert u == np.uint8 and u.metadata["mgb_dtype"] == {
        "name": "Quantized8Asymm", "scale": 0.5, "zero_point": 128}
    assert Q.qint32(2.0) == np.int32 and Q.qint4(1.0) == np.int8 and Q.quint4(1.0, 3) == np.uint8
    assert Q.is_quantize(Q.qint8_narrow(1.0)) and not Q.is_quantize(np.dtype("int8"))
    assert Q.quantized_meta(Q.qint8_narrow(1.0)).qmin == -127
    assert Q.get_zero_point(u) == 128 and Q.get_zero_point(d) == 0
    assert Q.same_dtype(Q.qint8(0.1), Q.qint8(0.1))
    assert not Q.same_dtype(Q.qint8(0.1), Q.qint8(0.2))       # NumPy's == says equal
    assert not Q.same_dtype(Q.qint8(0.1), Q.qint8_narrow(0.1))
    assert Q.qdtype_str(u) == "quint8(scale=0.5, zero_point=128)"


@pytest.mark.parametrize("bad", [
    lambda: Q.qint8(0.0), lambda: Q.qint8(-1.0), lambda: Q.qint8(float("nan")),
    lambda: Q.quint8(0.1, None), lambda: Q.quint8(0.1, 256), lambda: Q.quint8(0.1, 1.5),
    lambda: Q.qint8(0.1 * np.ones(2)), lambda: Q.create_quantized_dtype("qint7", 1.0),
    lambda: Q.create_quantized_dtype("qint8", 1.0, 3)])
def test_bad_dtype_arguments_raise(bad):
    with pytest.raises(QuantizationError):
        bad()


@pytest.mark.parametrize("dtype, scale, zp, lo, hi, storage", [
    (Q.qint8(0.1), 0.1, 0, -128, 127, "int8"),
    (Q.qint8_narrow(0.1), 0.1, 0, -127, 127, "int8"),
    (Q.quint8(0.1, 0), 0.1, 0, 0, 255, "uint8"),
    (Q.quint8(0.1, 255), 0.1, 255, 0, 255, "uint8"),
    (Q.quint8(0.05, 128), 0.05, 128, 0, 255, "uint8"),
    (Q.qint4(0.5), 0.5, 0, -8, 7, "int8"),
    (Q.quint4(0.5, 8), 0.5, 8, 0, 15, "uint8"),
    (Q.qint32(1e-3), 1e-3, 0, -2 ** 31, 2 ** 31 - 1, "int32"),
])
def test_astype_quantizes_half_to_even_and_saturates(dtype, scale, zp, lo, hi, storage):
    # exact .5 ties at scale 0.5 (0.25 -> 0.5 -> 0; 0.75 -> 1.5 -> 2), saturation
    vals = np.array([0.0, 0.25, 0.75, -0.25, -0.75, 1.25, -1.25, 100.0, -100.0, 3e6], F32)
    q = _q(vals, dtype)
    assert Q.same_dtype(q.dtype, dtype) and q.numpy().dtype == np.dtype(storage)
    np.testing.assert_array_equal(q.numpy(), _ref(vals, scale, zp, lo, hi, storage))
    back = q.astype("float32")
    assert back.dtype == np.float32 and not Q.is_quantize(back.dtype)
    want = (q.numpy().astype(F32) - F32(zp)) * F32(Q.get_scale(dtype))
    np.testing.assert_array_equal(back.numpy(), want)
    np.testing.assert_array_equal(Q.dequantize(q).numpy(), want)


def test_ties_go_to_even():
    q = _q([0.5, 1.5, 2.5, -0.5, -1.5, -2.5], Q.qint8(1.0))
    assert q.numpy().tolist() == [0, 2, 2, 0, -2, -2]


def test_requantize_and_int_repr():
    q = _q([1.0, -2.0, 3.3], Q.qint8(0.1))
    r = q.astype(Q.quint8(0.2, 100))
    want = np.clip(np.rint(q.astype("float32").numpy() / F32(0.2)) + 100, 0, 255)
    assert Q.same_dtype(r.dtype, Q.quint8(0.2, 100))
    np.testing.assert_array_equal(r.numpy(), want.astype(np.uint8))
    i = Q.int_repr(q)
    assert not Q.is_quantize(i.dtype) and i.numpy().tolist() == [10, -20, 33]
    assert Q.is_quantize(q.dtype)       # int_repr left q alone
    with pytest.raises(QuantizationError, match="qint8.*int32"):
        q.astype("int32")
    with pytest.raises(QuantizationError):
        Q.dequantize(mt.tensor([1.0]))


X = np.arange(24, dtype=F32).reshape(2, 3, 4) * F32(0.1) - F32(1.0)

# (name, op on the quantized tensor, the same op on the NumPy integers)
LAYOUT = [
    ("reshape", lambda t: t.reshape(4, 6), lambda a: a.reshape(4, 6)),
    ("F.reshape", lambda t: F.reshape(t, (6, -1)), lambda a: a.reshape(6, -1)),
    ("flatten", lambda t: t.flatten(), lambda a: a.reshape(-1)),
    ("F.flatten", lambda t: F.flatten(t, 1), lambda a: a.reshape(a.shape[0], -1)),
    ("transpose", lambda t: t.transpose(2, 0, 1), lambda a: a.transpose(2, 0, 1)),
    ("F.transpose", lambda t: F.transpose(t, (1, 0, 2)), lambda a: a.transpose(1, 0, 2)),
    ("T", lambda t: t.T, lambda a: a.T),
    ("expand_dims", lambda t: t.expand_dims(0), lambda a: a[None]),
    ("squeeze", lambda t: t[:1].squeeze(0), lambda a: a[:1].squeeze(0)),
    ("broadcast_to", lambda t: t[:1].broadcast_to((3,) + t.shape[1:]),
     lambda a: np.broadcast_to(a[:1], (3,) + a.shape[1:])),
    ("F.broadcast_to", lambda t: F.broadcast_to(t[:1], (2,) + t.shape[1:]),
     lambda a: np.broadcast_to(a[:1], (2,) + a.shape[1:])),
    ("basic index", lambda t: t[1:, ::2], lambda a: a[1:, ::2]),
    ("integer index", lambda t: t[0], lambda a: a[0]),
    ("advanced index", lambda t: t[[1, 0]], lambda a: a[[1, 0]]),
    ("copy", lambda t: t.copy(), lambda a: a.copy()),
    ("F.copy", lambda t: F.copy(t), lambda a: a.copy()),
    ("to", lambda t: t.to("cpu:1"), lambda a: a),
    ("contiguous", lambda t: t.transpose().contiguous(), lambda a: a.T.copy()),
    ("F.concat", lambda t: F.concat([t, t[:1]], 0), lambda a: np.concatenate([a, a[:1]], 0)),
]


@pytest.mark.parametrize("dtype", [Q.qint8(0.05), Q.quint8(0.02, 70)], ids=["qint8", "quint8"])
@pytest.mark.parametrize("name, op, ref", LAYOUT, ids=[c[0] for c in LAYOUT])
def test_every_layout_op_keeps_the_dtype_twice(name, op, ref, dtype):
    q = mt.tensor(X).astype(dtype)
    ints = q.numpy()
    once = op(q)
    assert Q.same_dtype(once.dtype, dtype), name
    np.testing.assert_array_equal(once.numpy(), ref(ints))
    # and again on the result (the bug was: a second layout op dropped it)
    twice = op(once.reshape(q.shape)) if once.size == q.size else op(once)
    assert Q.same_dtype(twice.dtype, dtype), name
    again = ref(ref(ints).reshape(ints.shape)) if once.size == q.size else ref(ref(ints))
    np.testing.assert_array_equal(twice.numpy(), again)
    np.testing.assert_array_equal(
        twice.astype("float32").numpy(),
        (again.astype(F32) - F32(Q.get_zero_point(dtype))) * F32(Q.get_scale(dtype)))


def test_concat_refuses_mixed_dtypes_naming_both():
    a = mt.tensor(X).astype(Q.qint8(0.05))
    b = mt.tensor(X).astype(Q.qint8(0.1))
    with pytest.raises(QuantizationError, match=r"qint8\(scale=0.05\).*qint8\(scale=0.1\)"):
        F.concat([a, b])
    with pytest.raises(QuantizationError, match=r"qint8\(scale=0.05\).*float32"):
        F.concat([a, mt.tensor(X)])


@pytest.mark.parametrize("op, names", [
    (lambda q, x, q2: q + x, ["qint8(scale=0.05)", "float32"]),
    (lambda q, x, q2: x * q, ["float32", "qint8(scale=0.05)"]),
    (lambda q, x, q2: q - q2, ["qint8(scale=0.05)", "quint8(scale=0.02, zero_point=70)"]),
    (lambda q, x, q2: q + 1, ["qint8(scale=0.05)", "int"]),
    (lambda q, x, q2: -q, ["qint8(scale=0.05)"]),
    (lambda q, x, q2: F.maximum(q, x), ["qint8(scale=0.05)", "float32"]),
    (lambda q, x, q2: F.where(q > 0, q, q), ["qint8(scale=0.05)"]),
])
def test_arithmetic_refuses_naming_the_dtypes(op, names):
    q = mt.tensor(X).astype(Q.qint8(0.05))
    q2 = mt.tensor(X).astype(Q.quint8(0.02, 70))
    with pytest.raises(QuantizationError) as e:
        op(q, mt.tensor(X), q2)
    for n in names:
        assert n in str(e.value)
    assert isinstance(e.value, ValueError)


def test_repr_and_plain_tensors_untouched():
    q = _q([0.1, -0.2], Q.qint8(0.1))
    assert "dtype=qint8(scale=0.1)" in repr(q)
    x = mt.tensor([1, 2], dtype="int8")
    assert (x + x).numpy().tolist() == [2, 4] and not Q.is_quantize(x.reshape(2, 1).dtype)


def test_quantized_tensor_results_keep_the_dtype():
    from mgtrace.quantization import quantize_tensor, QuantizedTensor
    from mgtrace.quantization.qtensor import qparams_of
    qt = quantize_tensor(X, dtype="quint8", scale=0.02, zero_point=70)
    assert isinstance(qt, QuantizedTensor) and Q.same_dtype(qt.dtype, Q.quint8(0.02, 70))
    r = qt.reshape(6, 4).transpose()[1:]
    assert Q.same_dtype(r.dtype, qt.dtype)
    p = qparams_of(r)
    assert p.dtype_meta.name == "quint8" and float(p.zero_point.numpy()) == 70.0


def test_archives_keep_quantized_dtypes(tmp_path):
    b = mt.tensor(X)
    q = b.astype(Q.quint8(0.02, 70))
    obj = {"q": q, "t": q.transpose(2, 0, 1), "n": b.astype(Q.qint8_narrow(0.01)),
           "plain": Q.int_repr(q), "d": Q.qint4(0.5)}
    path = tmp_path / "q.tmod"
    mt.save(obj, path)
    for mmap in (False, True):
        got = mt.load(path, mmap=mmap)
        for k in ("q", "t", "n"):
            assert Q.same_dtype(got[k].dtype, obj[k].dtype), k
            np.testing.assert_array_equal(got[k].numpy(), obj[k].numpy())
        assert not Q.is_quantize(got["plain"].dtype)
        assert Q.same_dtype(got["d"], Q.qint4(0.5))
    from mgtrace.serialization import load_archive
    assert load_archive(path).format_version == (1, 2)
    with pytest.raises(ValueError, match=r"quantized tensor \(quint8\(scale=0.02, "
                                         r"zero_point=70\)\).*1\.2.*1\.1"):
        mt.save({"q": q}, tmp_path / "old.tmod", target_version=(1, 1))
    with pytest.raises(ValueError, match="qdtype"):
        mt.save({"d": Q.qint8(0.1)}, tmp_path / "old.tmod", target_version=(1, 1))
    mt.save({"x": b}, tmp_path / "plain.tmod")       # nothing quantized: still 1.1
    assert load_archive(tmp_path / "plain.tmod").format_version == (1, 1)


def test_functional_quantize_and_dequantize():
    x = mt.tensor(np.array([0.25, -1.0, 9.0, 0.075], F32))
    q = F.quantize(x, Q.quint8(0.5, 10))
    assert q.numpy().tolist() == [10, 8, 28, 10] and Q.same_dtype(q.dtype, Q.quint8(0.5, 10))
    np.testing.assert_array_equal(F.dequantize(q).numpy(), np.float32([0.0, -1.0, 9.0, 0.0]))
    np.testing.assert_array_equal(F.astype(q, "float32").numpy(), F.dequantize(q).numpy())
    assert Q.same_dtype(F.astype(x, Q.qint8(0.5)).dtype, Q.qint8(0.5))
    with pytest.raises(QuantizationError):
        F.quantize(x, "int8")
    with pytest.raises(QuantizationError):
        F.dequantize(x)


def test_a_trace_records_quantize_and_keeps_the_dtype(tmp_path):
    import mgtrace.module as M

    class Net(M.Module):
        def forward(self, x):
            q = x.astype(Q.quint8(0.05, 3))
            r = q.reshape(x.shape[0], -1).transpose(1, 0)
            return F.dequantize(r), r

    x = mt.tensor(X)
    tm = mt.trace_module(Net(), x)
    x2 = mt.tensor(X[::-1].copy() * F32(0.5))
    y, r = tm(x2)
    ints = np.clip(np.rint(X[::-1] * F32(0.5) / F32(0.05)) + 3, 0, 255).astype(np.uint8)
    np.testing.assert_array_equal(r.numpy(), ints.reshape(2, -1).T)
    assert Q.same_dtype(r.dtype, Q.quint8(0.05, 3))
    np.testing.assert_array_equal(y.numpy(), (ints.reshape(2, -1).T.astype(F32) - 3) * F32(0.05))
    mt.save(tm, tmp_path / "t.tmod")
    y2, r2 = mt.load(tmp_path / "t.tmod")(x2)
    assert Q.same_dtype(r2.dtype, r.dtype)
    np.testing.assert_array_equal(y2.numpy(), y.numpy())


@pytest.mark.parametrize("path", [0, 1], ids=["best", "portable"])
@pytest.mark.parametrize("name, scale, zp", [("qint8", 0.037, 0), ("quint8", 0.011, 131),
                                             ("quint8", 1e-3, 0), ("qint32", 1e-3, 0),
                                             ("qint4", 0.3, 0), ("quint4", 0.3, 15)])
def test_the_c_kernels_match_numpy_bit_for_bit(name, scale, zp, path):
    from mgtrace._core import qint8 as K
    meta = Q.QUANT_DTYPES[name]
    rng = np.random.default_rng(7)
    n = 70001                      # two chunks and a tail of 1 past the 16-lane loop
    x = (rng.standard_normal(n) * 3).astype(F32)
    x[:64] = (np.arange(64, dtype=F32) - 32) * F32(0.5) * F32(scale)     # exact .5 ties
    x[64:68] = [1e30, -1e30, 0.0, -0.0]
    out = mt.tensor(np.zeros(n, meta.np_dtype_str))
    K.quantize_into(mt.tensor(x), out, F32(scale), F32(zp), meta.qmin, meta.qmax, path)
    np.testing.assert_array_equal(out.numpy(), _ref(x, scale, zp, meta.qmin, meta.qmax,
                                                    meta.np_dtype_str))
    back = mt.tensor(np.zeros(n, F32))
    K.dequantize_into(out, back, F32(scale), F32(zp))
    np.testing.assert_array_equal(back.numpy(),
                                  (out.numpy().astype(F32) - F32(zp)) * F32(scale))


@pytest.mark.parametrize("scale", [0.011, 0.1, 1 / 3, 3e-3, 7.0, 1e-38, 3e-39, 1e38],
                         ids=lambda s: f"{s:g}")
@pytest.mark.parametrize("name, zp", [("qint8", 0), ("quint8", 131), ("quint8", 0)])
def test_quantize_by_the_reciprocal_rounds_as_the_quotient(name, zp, scale):
    # the AVX-512 path multiplies by float(1 / scale) and takes the quotient
    # only near .5 ties: inputs a float ulp or two either side of each tie,
    # where the product and the quotient can differ, and scales whose
    # reciprocal is subnormal, infinite or huge (the quotient everywhere)
    from mgtrace._core import qint8 as K
    meta = Q.QUANT_DTYPES[name]
    s = F32(scale)
    with np.errstate(over="ignore"):
        ties = (np.arange(-300, 300, dtype=F32) + F32(0.5)) * s
    near = np.concatenate([np.nextafter(ties, F32(np.inf) * k) for k in (1, -1)] +
                          [np.nextafter(np.nextafter(ties, F32(np.inf) * k), F32(np.inf) * k)
                           for k in (1, -1)])
    rng = np.random.default_rng(9)
    with np.errstate(over="ignore", invalid="ignore"):      # the huge scale's products
        x = np.concatenate([ties, near, (rng.standard_normal(4001) * 200 * s).astype(F32),
                            np.array([0, -0.0, np.inf, -np.inf, 3e38, -3e38], F32)])
        want = _ref(x, s, zp, meta.qmin, meta.qmax, meta.np_dtype_str)
    for path in (0, 1):
        out = mt.tensor(np.zeros(x.size, meta.np_dtype_str))
        K.quantize_into(mt.tensor(x), out, s, F32(zp), meta.qmin, meta.qmax, path)
        np.testing.assert_array_equal(out.numpy(), want, err_msg=f"path {path}")
        nan = mt.tensor(np.zeros(17, meta.np_dtype_str))      # NaN saturates to qmin
        K.quantize_into(mt.tensor(np.full(17, np.nan, F32)), nan, s, F32(zp), meta.qmin,
                        meta.qmax, path)
        assert (nan.numpy() == meta.qmin).all()


def test_the_c_kernels_refuse_bad_tensors():
    from mgtrace._core import qint8 as K
    x = mt.tensor(np.zeros((2, 3), F32))
    with pytest.raises(ValueError):
        K.quantize_into(x, mt.tensor(np.zeros(5, np.int8)), 1.0, 0.0, -128, 127)
    with pytest.raises(ValueError):
        K.quantize_into(x, mt.tensor(np.zeros(6, np.int16)), 1.0, 0.0, -128, 127)
    with pytest.raises(ValueError):
        K.quantize_into(x.T, mt.tensor(np.zeros(6, np.int8)), 1.0, 0.0, -128, 127)
