"""Complex tensors (complex64, complex128) and MegEngine's complex helpers
F.complex / real / imag / polar, against NumPy's complex arithmetic."""
import subprocess
import sys

import numpy as np
import pytest

import mgtrace as mt
import mgtrace.functional as F
import mgtrace.module as M
from mgtrace.errors import NoKernelError

RNG = np.random.default_rng(36)


def cplx(shape, dtype=np.complex64):
    return (RNG.standard_normal(shape) + 1j * RNG.standard_normal(shape)).astype(dtype)


# ---------------------------------------------------------------- storage

@pytest.mark.parametrize("dtype", [np.complex64, np.complex128])
def test_numpy_round_trip_keeps_values_and_dtype(dtype):
    a = cplx((3, 4), dtype)
    t = mt.tensor(a)
    assert t.dtype == dtype and t.shape == (3, 4) and t.itemsize == np.dtype(dtype).itemsize
    np.testing.assert_array_equal(t.numpy(), a)
    np.testing.assert_array_equal(np.from_dlpack(t), a)        # DLPack: kDLComplex
    np.testing.assert_array_equal(mt.from_dlpack(a).numpy(), a)
    assert t[1, 2].item() == complex(a[1, 2])


def test_python_complex_data_defaults_to_complex64():
    t = mt.tensor([1 + 2j, 3.5])
    assert t.dtype == np.complex64
    assert t.tolist() == [1 + 2j, 3.5 + 0j]
    assert mt.tensor([1 + 2j], dtype="complex128").dtype == np.complex128
    assert mt.tensor([1, 2], dtype="complex64").numpy().tolist() == [1 + 0j, 2 + 0j]


def test_complex_data_into_a_real_dtype_is_refused():
    with pytest.raises(TypeError, match="imaginary"):
        mt.tensor(np.array([1 + 1j]), dtype="float32")
    with pytest.raises(TypeError, match="float32"):
        mt.tensor([1 + 1j], dtype="float32")


def test_views_and_layout_ops_move_whole_elements():
    a = cplx((2, 3, 4))
    t = mt.tensor(a)
    np.testing.assert_array_equal(t.transpose(2, 0, 1).copy().numpy(), a.transpose(2, 0, 1))
    np.testing.assert_array_equal(t[:, 1::2, ::-1].numpy(), a[:, 1::2, ::-1])
    np.testing.assert_array_equal(t.reshape(6, 4).numpy(), a.reshape(6, 4))
    np.testing.assert_array_equal(t[mt.tensor([1, 0])].numpy(), a[[1, 0]])
    np.testing.assert_array_equal(F.zeros((2,), dtype="complex64").numpy(), np.zeros(2, np.complex64))


# ---------------------------------------------------------------- F.complex / real / imag / polar

def test_complex_real_imag_against_numpy():
    re = RNG.standard_normal((2, 3)).astype(np.float32)
    im = RNG.standard_normal((2, 3)).astype(np.float32)
    z = F.complex(mt.tensor(re), mt.tensor(im))
    assert z.dtype == np.complex64
    np.testing.assert_array_equal(z.numpy(), re + 1j * im)
    np.testing.assert_array_equal(F.real(z).numpy(), re)
    np.testing.assert_array_equal(F.imag(z).numpy(), im)
    assert F.real(z).dtype == np.float32
    # strided input: a transposed complex view
    zt = mt.tensor(cplx((3, 2))).transpose(1, 0)
    np.testing.assert_array_equal(F.imag(zt).numpy(), zt.numpy().imag)


def test_complex_dtypes_and_broadcasting():
    z = F.complex(mt.tensor([[1.0], [2.0]], dtype="float64"), mt.tensor([3.0, 4.0, 5.0]))
    assert z.dtype == np.complex128 and z.shape == (2, 3)
    np.testing.assert_array_equal(z.numpy(), np.array([[1.0], [2.0]]) + 1j * np.array([3.0, 4.0, 5.0]))
    assert F.complex(mt.tensor([1, 2]), 0.5).dtype == np.complex64          # ints -> complex64
    assert F.complex(mt.tensor([1.0], dtype="float16"), 1.0).dtype == np.complex64


def test_polar_against_numpy():
    r = RNG.uniform(0.1, 3, (5,)).astype(np.float32)
    th = RNG.uniform(-np.pi, np.pi, (5,)).astype(np.float32)
    z = F.polar(mt.tensor(r), mt.tensor(th))
    np.testing.assert_allclose(z.numpy(), r * np.exp(1j * th), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(F.abs(z).numpy(), r, rtol=1e-6)
    # MegEngine 1.13's own output for polar([1, 2], [3, 4])
    got = F.polar(mt.tensor([1.0, 2.0]), mt.tensor([3.0, 4.0])).numpy()
    np.testing.assert_allclose(got, [-0.98999244 + 0.14112j, -1.3072872 - 1.513605j], rtol=1e-6)


def test_helpers_refuse_what_megengine_refuses():
    z = F.complex(mt.tensor([1.0]), mt.tensor([2.0]))
    with pytest.raises(TypeError, match="real: expected a complex tensor, got float32"):
        F.real(mt.tensor([1.0]))
    with pytest.raises(TypeError, match="imag: expected a complex tensor"):
        F.imag(mt.tensor([1]))
    with pytest.raises(TypeError, match="complex: real must be real, got complex64"):
        F.complex(z, mt.tensor([1.0]))
    with pytest.raises(ValueError, match="do not broadcast"):
        F.complex(mt.tensor([1.0, 2.0]), mt.tensor([1.0, 2.0, 3.0]))
    with pytest.raises(TypeError):
        F.complex(None, mt.tensor([1.0]))


# ---------------------------------------------------------------- arithmetic

OPS = [("+", np.add), ("-", np.subtract), ("*", np.multiply), ("/", np.divide)]


@pytest.mark.parametrize("dtype", [np.complex64, np.complex128])
@pytest.mark.parametrize("sym,ref", OPS, ids=[s for s, _ in OPS])
def test_binary_arithmetic_against_numpy(dtype, sym, ref):
    a, b = cplx((3, 4), dtype), cplx((4,), dtype)
    fn = {"+": lambda x, y: x + y, "-": lambda x, y: x - y, "*": lambda x, y: x * y,
          "/": lambda x, y: x / y}[sym]
    got = fn(mt.tensor(a), mt.tensor(b))                       # broadcast
    assert got.dtype == dtype
    tol = 1e-6 if dtype == np.complex64 else 1e-14
    np.testing.assert_allclose(got.numpy(), ref(a, b), rtol=tol, atol=tol)
    got = fn(mt.tensor(a).transpose(1, 0), 2 - 0.5j)          # strided, Python complex
    np.testing.assert_allclose(got.numpy(), ref(a.T, dtype(2 - 0.5j)), rtol=tol, atol=tol)


def test_mixed_real_and_complex_operands_promote_to_complex():
    z = cplx((4,))
    x = RNG.standard_normal(4).astype(np.float32)
    i = np.array([1, -2, 3, 0], np.int32)
    np.testing.assert_allclose((mt.tensor(z) * mt.tensor(x)).numpy(), z * x, rtol=1e-6)
    got = mt.tensor(i) + mt.tensor(z)
    assert got.dtype == np.complex64
    np.testing.assert_allclose(got.numpy(), i + z, rtol=1e-6)
    assert (mt.tensor(x) + 1j).dtype == np.complex64
    np.testing.assert_allclose((mt.tensor(x) - 1j).numpy(), x - 1j, rtol=1e-6)
    # MegEngine's rule: the complex operand's dtype wins over a float64 tensor
    assert (mt.tensor(x.astype(np.float64)) + mt.tensor(z)).dtype == np.complex64


def test_division_by_zero_and_neg_abs_eq_as_numpy():
    a = np.array([1 + 1j, 0, 3 - 4j], np.complex128)
    with np.errstate(all="ignore"):
        want = a / np.array([0, 0, 1], np.complex128)
    got = (mt.tensor(a) / mt.tensor(np.array([0, 0, 1], np.complex128))).numpy()
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(np.isinf(got), np.isinf(want))
    np.testing.assert_array_equal((-mt.tensor(a)).numpy(), -a)
    assert F.abs(mt.tensor(a)).dtype == np.float64
    np.testing.assert_allclose(F.abs(mt.tensor(a)).numpy(), [np.sqrt(2), 0, 5], rtol=1e-15)
    big = mt.tensor(np.array([3e30 + 4e30j], np.complex64))   # |z| computed without overflow
    np.testing.assert_allclose(abs(big).numpy(), [5e30], rtol=1e-6)
    np.testing.assert_array_equal((mt.tensor(a) == mt.tensor(a[::-1].copy())).numpy(), a == a[::-1])
    np.testing.assert_array_equal((mt.tensor(a) != 0).numpy(), a != 0)


def test_everything_else_refuses_complex_clearly():
    z = mt.tensor(cplx((2, 2)))
    with pytest.raises(NoKernelError, match="sin.*complex64"):
        F.sin(z)
    with pytest.raises(NoKernelError, match="complex64"):
        F.prod(z)
    with pytest.raises(NoKernelError, match="complex64"):
        z < z
    with pytest.raises(TypeError, match="imaginary part"):
        z.astype("float32")
    with pytest.raises(NoKernelError, match="sigmoid.*complex64"):
        F.sigmoid(z)
    with pytest.raises(TypeError):
        F.conv2d(z.reshape(1, 1, 2, 2), z.reshape(1, 1, 2, 2))
    out = mt.tensor([1.0, 2.0])
    with pytest.raises(TypeError):
        out[...] = mt.tensor([1j, 2j])                    # would drop the imaginary part
    with pytest.raises(IndexError):
        mt.tensor([1.0, 2.0])[mt.tensor([0j])]


# ---------------------------------------------------------------- exp, log, sqrt, sum, mean, matmul

def _with_branch_cuts(dtype):
    """random values plus the negative real axis (sqrt's and log's branch
    cut, +0 and -0 imaginary parts), zero and pure imaginary ones"""
    special = np.array([-4 + 0j, complex(-4, -0.0), 0j, 2j, -3j, 1 + 0j], dtype)
    return np.concatenate([cplx((3, 6), dtype).ravel(), special]).reshape(4, 6)


@pytest.mark.parametrize("dtype", [np.complex64, np.complex128])
@pytest.mark.parametrize("name", ["exp", "log", "sqrt"])
def test_exp_log_sqrt_against_numpy(name, dtype):
    a = _with_branch_cuts(dtype)
    a[a == 0] = 1 + 1j if name == "log" else 0           # log(0) is -inf + nan i in C99
    got = getattr(F, name)(mt.tensor(a))
    want = getattr(np, name)(a)
    assert got.dtype == dtype
    tol = 2e-6 if dtype == np.complex64 else 1e-14
    np.testing.assert_allclose(got.numpy(), want, rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", [np.complex64, np.complex128])
@pytest.mark.parametrize("axis, keepdims", [(None, False), (0, False), ((0, 2), True), (-1, False)])
def test_sum_and_mean_against_numpy(axis, keepdims, dtype):
    a = cplx((3, 4, 5), dtype)
    for name in ("sum", "mean"):
        got = getattr(F, name)(mt.tensor(a), axis=axis, keepdims=keepdims)
        want = getattr(np, name)(a.astype(np.complex128), axis=axis, keepdims=keepdims)
        assert got.dtype == dtype and got.shape == want.shape
        tol = 1e-5 if dtype == np.complex64 else 1e-13
        np.testing.assert_allclose(got.numpy(), want, rtol=tol, atol=tol)
    assert mt.tensor(a).sum().dtype == dtype          # the tensor method too


@pytest.mark.parametrize("dtype", [np.complex64, np.complex128])
def test_matmul_against_numpy(dtype):
    a, b = cplx((2, 3, 4), dtype), cplx((4, 5), dtype)
    tol = 1e-5 if dtype == np.complex64 else 1e-13
    got = F.matmul(mt.tensor(a), mt.tensor(b))
    assert got.dtype == dtype
    np.testing.assert_allclose(got.numpy(), a.astype(np.complex128) @ b, rtol=tol, atol=tol)
    np.testing.assert_allclose((mt.tensor(a) @ mt.tensor(b)).numpy(), a @ b, rtol=tol, atol=tol)
    v = cplx((4,), dtype)                               # vector operands
    np.testing.assert_allclose(F.matmul(mt.tensor(a), mt.tensor(v)).numpy(), a @ v, rtol=tol, atol=tol)


def test_matmul_of_complex_and_real_promotes_to_complex():
    a, r = cplx((3, 4)), RNG.standard_normal((4, 2))
    got = mt.tensor(a) @ mt.tensor(r)       # the complex operand's dtype (complex above float)
    assert got.dtype == np.complex64 == (mt.tensor(a) + mt.tensor(r[:, :1].T)).dtype
    np.testing.assert_allclose(got.numpy(), a @ r, rtol=1e-5, atol=1e-5)
    got = mt.tensor(r.T.astype(np.float32)) @ mt.tensor(a.T)
    assert got.dtype == np.complex64
    np.testing.assert_allclose(got.numpy(), r.T @ a.T, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------- traced, saved, loaded

class Spectral(M.Module):
    """A MegEngine-style model with a complex intermediate: z = x + i*y,
    scaled by a complex constant, back to reals through abs and real."""

    def __init__(self):
        super().__init__()
        self.lin = M.Linear(4, 4)

    def forward(self, x, y):
        z = F.complex(self.lin(x), y) * F.polar(mt.tensor(2.0), mt.tensor(0.5))
        return F.abs(z) + F.real(z) - F.imag(-z)


def _header(data):
    import msgpack
    from mgtrace.serialization.layout import PREFIX
    _, hlen = PREFIX.unpack(data[:PREFIX.size])
    return msgpack.unpackb(data[PREFIX.size:PREFIX.size + hlen], raw=False)


def test_traced_saved_and_loaded_in_a_fresh_process(tmp_path):
    net = Spectral().eval()
    x = mt.tensor(RNG.standard_normal((3, 4)).astype(np.float32))
    y = mt.tensor(RNG.standard_normal((3, 4)).astype(np.float32))
    tm = mt.trace_module(net, x, y)
    names = {getattr(e.func, "__name__", "") for e in tm.graph.exprs()
             if type(e).__name__ == "CallFunction"}
    assert {"complex", "polar", "real", "imag"} <= names
    want = net(x, y).numpy()
    zx = net.lin(x).numpy() + 1j * y.numpy()
    zx = zx * (2 * np.exp(0.5j))
    np.testing.assert_allclose(want, np.abs(zx) + zx.real + zx.imag, rtol=1e-5, atol=1e-5)
    path = tmp_path / "spectral.tmod"
    mt.save(tm, str(path))
    assert _header(path.read_bytes())["min_reader_version"] == [1, 2]
    np.save(tmp_path / "x.npy", x.numpy())
    np.save(tmp_path / "y.npy", y.numpy())
    code = (f"import numpy as np, mgtrace as mt\n"
            f"m = mt.load({str(path)!r})\n"
            f"x, y = (mt.tensor(np.load({str(tmp_path)!r} + f'/{{n}}.npy')) for n in 'xy')\n"
            f"np.save({str(tmp_path)!r} + '/out.npy', m(x, y).numpy())\n")
    subprocess.run([sys.executable, "-c", code], check=True)
    np.testing.assert_allclose(np.load(tmp_path / "out.npy"), want, rtol=1e-6, atol=1e-6)


def test_complex_tensors_need_a_1_2_reader(tmp_path):
    import io
    z = mt.tensor(cplx((2,)))
    buf = io.BytesIO()
    mt.save({"z": z}, buf)
    head = _header(buf.getvalue())
    assert head["min_reader_version"] == [1, 2]
    assert [e["dtype"] for e in head["tensors"]] == ["complex64"]
    np.testing.assert_array_equal(mt.load(io.BytesIO(buf.getvalue()))["z"].numpy(), z.numpy())
    with pytest.raises(ValueError, match="tensor of dtype complex64 needs archive format 1.2"):
        mt.save({"z": z}, io.BytesIO(), target_version=(1, 1))
    with pytest.raises(ValueError, match="dtype value of dtype complex128 needs archive format 1.2"):
        mt.save({"d": np.dtype("complex128")}, io.BytesIO(), target_version=(1, 1))
    # a real archive is still written as the oldest version that holds it
    buf = io.BytesIO()
    mt.save({"x": mt.tensor([1.0])}, buf)
    assert _header(buf.getvalue())["min_reader_version"] < [1, 2]


def test_casts_into_complex_and_between_complex_dtypes():
    a = cplx((3,), np.complex128)
    t = mt.tensor(a)
    np.testing.assert_array_equal(t.astype("complex64").numpy(), a.astype(np.complex64))
    np.testing.assert_array_equal(t.astype("complex64").astype("complex128").numpy(),
                                  a.astype(np.complex64).astype(np.complex128))
    x = np.array([1.5, -2, 0], np.float16)
    np.testing.assert_array_equal(mt.tensor(x).astype("complex64").numpy(), x.astype(np.complex64))
    b = np.array([True, False])
    np.testing.assert_array_equal(mt.tensor(b).astype("complex128").numpy(), b.astype(np.complex128))
