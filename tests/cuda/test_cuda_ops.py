"""The CUDA kernels against NumPy and against the CPU kernels, dtype by dtype
(float32, float16, bfloat16, int32, and bool where it applies): the same
checks as tests/core for elementwise ops with broadcasting and strides,
casts, reductions, softmax, norms, matmul, conv2d, pooling, interpolate,
gather/embedding, indexing, concat/split, where, clip, sort/topk."""
import numpy as np
import pytest

import mgtrace as mt
import mgtrace.functional as F
from mgtrace._core import dispatch, reduce as R, nn as NN

from conftest import np_dtype, random_array, requires_cuda

pytestmark = requires_cuda

GPU_DTYPES = ["float32", "float16", "bfloat16", "int32"]
FLOATS = ["float32", "float16", "bfloat16"]
TOL = {"float32": (1e-5, 1e-5), "float16": (2e-3, 2e-3), "bfloat16": (1.6e-2, 1e-2),
       "float64": (1e-12, 1e-12)}


def cuda(a, dtype=None):
    return mt.tensor(a, dtype=dtype, device="cuda:0")


def same(gpu, cpu, rtol=None, atol=None):
    """gpu (a CUDA result) equals cpu (mgtrace's CPU result or an array):
    exactly for integers and bool, within the dtype's tolerance for floats."""
    assert isinstance(gpu, mt.Tensor) and gpu.device == mt.Device("cuda:0"), gpu
    want = cpu.numpy() if isinstance(cpu, mt.Tensor) else np.asarray(cpu)
    got = gpu.numpy()
    assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, got.dtype, want.shape, want.dtype)
    if got.dtype.kind in "biu":
        np.testing.assert_array_equal(got, want)
    else:
        r, a = TOL.get(str(got.dtype), (1e-5, 1e-5))
        np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64),
                                   rtol=r if rtol is None else rtol, atol=a if atol is None else atol,
                                   equal_nan=True)


# ---------------------------------------------------------------- memory and copies

@pytest.mark.parametrize("dtype", ["bool", "int8", "uint8", "int16", "int32", "int64", "float16",
                                   "bfloat16", "float32", "float64"])
def test_round_trip_keeps_every_bit(dtype, rng):
    a = random_array((3, 5, 7), dtype, rng)
    t = cuda(a)
    assert t.device == mt.Device("cuda:0") and t.dtype == mt.as_dtype(dtype)
    np.testing.assert_array_equal(t.numpy(), a)
    np.testing.assert_array_equal(t.to("cpu").numpy(), a)


def test_views_copy_to_host_in_their_own_order(rng):
    a = rng.standard_normal((4, 6, 8)).astype(np.float32)
    t = cuda(a)
    np.testing.assert_array_equal(t.transpose(2, 0, 1).numpy(), a.transpose(2, 0, 1))
    np.testing.assert_array_equal(t[1:, ::2, 3].numpy(), a[1:, ::2, 3])
    np.testing.assert_array_equal(t.transpose(1, 0, 2).contiguous().numpy(), a.transpose(1, 0, 2))
    np.testing.assert_array_equal(t[:, None, 2].broadcast_to((4, 3, 8)).numpy(),
                                  np.broadcast_to(a[:, None, 2], (4, 3, 8)))


def test_item_tolist_repr_and_setitem(rng):
    t = cuda(np.arange(6, dtype=np.float32).reshape(2, 3))
    assert t[1, 2].item() == 5.0 and t.tolist() == [[0, 1, 2], [3, 4, 5]]
    assert "cuda:0" in repr(t)
    t[0, :] = 7.0
    t[1, 1:] = np.array([8.0, 9.0], np.float32)      # an array goes to the tensor's device
    assert t.tolist() == [[7, 7, 7], [3, 8, 9]]
    with pytest.raises(ValueError, match="ambiguous device"):   # a CPU tensor does not
        t[1, 1:] = mt.tensor([1.0, 2.0])


def test_allocator_reuses_freed_blocks_and_empties_its_cache():
    mt.cuda.synchronize()
    before = mt.cuda.memory_stats()
    t = F.full((1 << 20,), 1.0, device="cuda:0")
    held = mt.cuda.memory_stats()["allocated_bytes"]
    assert held >= before["allocated_bytes"] + (4 << 20)
    del t
    hits = mt.cuda.memory_stats()["num_cache_hits"]
    t = F.full((1 << 20,), 2.0, device="cuda:0")       # same size class: the cached block
    assert mt.cuda.memory_stats()["num_cache_hits"] == hits + 1
    assert t[5].item() == 2.0
    del t
    mt.cuda.empty_cache()
    assert mt.cuda.memory_stats()["cached_bytes"] == 0


def test_devices_must_agree():
    with pytest.raises(ValueError, match="ambiguous device: cuda:0 vs cpu:0"):
        cuda([1.0]) + mt.tensor([1.0])
    with pytest.raises(ValueError, match="ambiguous device"):
        F.matmul(cuda(np.ones((2, 2), np.float32)), mt.tensor(np.ones((2, 2), np.float32)))


def test_python_scalars_and_arrays_follow_the_tensor_to_the_gpu():
    t = cuda([1.0, 2.0])
    same(t + 1, np.array([2, 3], np.float32))
    same(2 * t, np.array([2, 4], np.float32))
    same(t + np.array([10.0, 20.0], np.float32), np.array([11, 22], np.float32))


def test_missing_kernel_names_op_device_and_dtype():
    with pytest.raises(NotImplementedError, match=r"'add'.*cuda:0.*int8"):
        cuda(np.ones(3, np.int8)) + cuda(np.ones(3, np.int8))


def test_has_kernel_answers_per_dtype_from_cudas_elementwise_table():
    # the (op, dtype) entries of kernels/cuda/elementwise.cu's table: int8
    # has no kernels (the CPU's has), exp only floats, bitwise ops no floats
    assert mt.has_kernel("add", "cpu", "int8") and not mt.has_kernel("add", "cuda:0", "int8")
    assert mt.has_kernel("add", "cuda:0", "int32") and mt.has_kernel("add", "cuda:0", "bool")
    assert mt.has_kernel("exp", "cuda:0", "float16") and not mt.has_kernel("exp", "cuda:0", "int32")
    assert not mt.has_kernel("bitwise_and", "cuda:0", "float32")
    assert mt.has_kernel("astype", "cuda:0", "bfloat16") and not mt.has_kernel("astype", "cuda:0", "complex64")


def test_dlpack_exports_cuda_memory_and_imports_it_back():
    t = cuda(np.arange(6, dtype=np.float32).reshape(2, 3))
    assert t.__dlpack_device__() == (2, 0)

    class Producer:                    # a foreign CUDA array: only the protocol
        def __dlpack__(self, **kw):
            return t.__dlpack__(**{k: v for k, v in kw.items() if k != "stream"})

        def __dlpack_device__(self):
            return t.__dlpack_device__()
    u = mt.from_dlpack(Producer())
    assert u.device == mt.Device("cuda:0") and u.data_ptr == t.data_ptr
    assert u.tolist() == [[0, 1, 2], [3, 4, 5]]


def test_dlpack_shares_memory_with_torch():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch without CUDA")
    t = cuda(np.arange(4, dtype=np.float32))
    x = torch.from_dlpack(t)
    assert x.device.type == "cuda" and x.data_ptr() == t.data_ptr
    y = torch.arange(3, dtype=torch.float32, device="cuda") * 2
    u = mt.from_dlpack(y)
    assert u.device == mt.Device("cuda:0") and u.tolist() == [0, 2, 4]


# ---------------------------------------------------------------- elementwise

UNARY_FLOAT = ["neg", "abs", "sign", "square", "round", "floor", "ceil", "trunc", "exp", "expm1",
               "log", "log1p", "log2", "sqrt", "rsqrt", "sin", "cos", "tan", "tanh", "erf", "asin",
               "acos", "atan", "relu", "relu6", "sigmoid", "gelu", "gelu_tanh", "silu", "hardswish",
               "hardsigmoid", "softplus", "isnan", "isinf", "isfinite", "logical_not"]
UNARY_INT = ["neg", "abs", "sign", "square", "round", "relu", "relu6", "logical_not", "bitwise_not"]


def _unary_input(name, dtype, rng):
    if name in ("log", "log1p", "log2", "sqrt", "rsqrt"):
        a = rng.uniform(0.1, 4.0, (5, 6))
    elif name in ("asin", "acos"):
        a = rng.uniform(-0.9, 0.9, (5, 6))
    else:
        a = rng.uniform(-5.0, 5.0, (5, 6))
    if dtype == "int32":
        a = np.round(a * 3)
    return a.astype(np_dtype(dtype))


@pytest.mark.parametrize("dtype", GPU_DTYPES)
@pytest.mark.parametrize("name", sorted(set(UNARY_FLOAT) | set(UNARY_INT)))
def test_unary_matches_the_cpu(name, dtype, rng):
    if dtype == "int32" and name not in UNARY_INT:
        name_ok = name in ("exp", "sqrt", "sigmoid")        # int -> float32 (MegEngine rule)
        if not name_ok:
            pytest.skip("float-only op: covered through the int -> float32 rule below")
    if dtype != "int32" and name == "bitwise_not":
        pytest.skip("integer-only op")
    a = _unary_input(name, dtype, rng)
    fn = dispatch.unary_ops[name]
    same(fn(cuda(a)), fn(mt.tensor(a)))
    # a strided (transposed) input
    same(fn(cuda(a).transpose(1, 0)), fn(mt.tensor(a).transpose(1, 0)))


BINARY = ["add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "maximum", "minimum", "atan2",
          "eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or", "logical_xor"]
BINARY_INT = ["bitwise_and", "bitwise_or", "bitwise_xor", "left_shift", "right_shift"]


@pytest.mark.parametrize("dtype", GPU_DTYPES)
@pytest.mark.parametrize("name", BINARY + BINARY_INT)
def test_binary_with_broadcasting_matches_the_cpu(name, dtype, rng):
    if name in BINARY_INT and dtype != "int32":
        pytest.skip("integer-only op")
    a = random_array((4, 1, 6), dtype, rng)
    b = random_array((5, 1), dtype, rng)
    if name in ("floordiv", "mod", "truediv", "pow", "left_shift", "right_shift"):
        b = np.abs(b) % 5 + 1 if dtype == "int32" else (np.abs(b.astype(np.float32)) + 0.5).astype(b.dtype)
    if name == "pow":
        a = (np.abs(a.astype(np.float32)) % 3 + 0.5).astype(a.dtype)
    fn = dispatch.binary_ops[name]
    same(fn(cuda(a), cuda(b)), fn(mt.tensor(a), mt.tensor(b)))
    same(fn(cuda(a), 3), fn(mt.tensor(a), 3))                     # a Python scalar operand
    same(fn(cuda(a)[::2, :, 1:], cuda(b)), fn(mt.tensor(a)[::2, :, 1:], mt.tensor(b)))


def test_bool_arithmetic_and_logic():
    a = np.array([True, False, True, False])
    b = np.array([True, True, False, False])
    for name in ("add", "mul", "maximum", "minimum", "eq", "logical_xor", "bitwise_and"):
        fn = dispatch.binary_ops[name]
        same(fn(cuda(a), cuda(b)), fn(mt.tensor(a), mt.tensor(b)))
    same(~cuda(a), ~a)


def test_in_place_ops_write_the_gpu_tensor(rng):
    a = rng.standard_normal((3, 4)).astype(np.float32)
    t = cuda(a)
    t += 1
    t *= cuda(a)
    same(t, (a + 1) * a)


@pytest.mark.parametrize("src", ["bool", "int8", "uint8", "int32", "int64", "float16", "bfloat16",
                                 "float32", "float64"])
@pytest.mark.parametrize("dst", ["bool", "int32", "int64", "float16", "bfloat16", "float32"])
def test_casts_match_the_cpu(src, dst, rng):
    a = random_array((4, 5), src, rng)
    same(cuda(a).astype(dst), mt.tensor(a).astype(dst))
    same(cuda(a).transpose(1, 0).astype(dst), mt.tensor(a).transpose(1, 0).astype(dst))


@pytest.mark.parametrize("dtype", GPU_DTYPES)
def test_where_and_clip(dtype, rng):
    c = rng.random((3, 4)) > 0.5
    x, y = random_array((3, 4), dtype, rng), random_array((1, 4), dtype, rng)
    same(F.where(cuda(c), cuda(x), cuda(y)), np.where(c, x, y))
    same(F.where(cuda(c), cuda(x), 0), F.where(mt.tensor(c), mt.tensor(x), 0))
    same(F.clip(cuda(x), -3, 4), F.clip(mt.tensor(x), -3, 4))


def test_full_zeros_ones_arange_on_the_gpu():
    same(F.full((2, 3), 1.5, device="cuda:0"), np.full((2, 3), 1.5, np.float32))
    same(F.zeros((2, 2), dtype="int32", device="cuda:0"), np.zeros((2, 2), np.int32))
    same(F.ones_like(cuda(np.zeros(3, np.float16))), np.ones(3, np.float16))


# ---------------------------------------------------------------- reductions

@pytest.mark.parametrize("dtype", GPU_DTYPES + ["bool"])
@pytest.mark.parametrize("name", ["sum", "prod", "mean", "var", "std", "max", "min", "argmax",
                                  "argmin", "any", "all"])
@pytest.mark.parametrize("axis", [None, 0, 1, (0, 2), -1])
def test_reductions_match_the_cpu(name, dtype, axis, rng):
    if dtype == "bool" and name in ("prod", "var", "std"):
        pytest.skip("not meaningful for bool")
    a = random_array((4, 5, 6), dtype, rng, low=-3, high=4)
    fn = getattr(R, name)
    for keep in (False, True):
        got, want = fn(cuda(a), axis=axis, keepdims=keep), fn(mt.tensor(a), axis=axis, keepdims=keep)
        same(got, want, rtol=2e-2 if dtype == "bfloat16" else None, atol=2e-2 if dtype == "bfloat16" else None)
    # a transposed view: the geometry's strides, no copy
    same(fn(cuda(a).transpose(2, 0, 1), axis=axis), fn(mt.tensor(a).transpose(2, 0, 1), axis=axis),
         rtol=2e-2 if dtype == "bfloat16" else None, atol=2e-2 if dtype == "bfloat16" else None)


def test_large_reductions_split_over_blocks(rng):
    a = rng.standard_normal(3_000_001).astype(np.float32)
    assert abs(R.sum(cuda(a)).item() - float(a.astype(np.float64).sum())) < 1e-2
    assert R.argmax(cuda(a)).item() == int(a.argmax())
    b = a[:3_000_000].reshape(3, -1)[:, :999_999]
    np.testing.assert_allclose(R.mean(cuda(b), axis=1).numpy(), b.astype(np.float64).mean(1), rtol=1e-5)


def test_nan_propagates_through_max_and_wins_argmax():
    a = np.array([[1.0, np.nan, 3.0], [4.0, 5.0, 6.0]], np.float32)
    same(R.max(cuda(a), axis=1), R.max(mt.tensor(a), axis=1))
    same(R.argmax(cuda(a), axis=1), R.argmax(mt.tensor(a), axis=1))


@pytest.mark.parametrize("dtype", FLOATS + ["int32"])
@pytest.mark.parametrize("name", ["softmax", "log_softmax"])
def test_softmax_matches_the_cpu(name, dtype, rng):
    a = random_array((3, 7, 5), dtype, rng, low=-4, high=4)
    fn = getattr(R, name)
    for axis in (-1, 1, 0):
        same(fn(cuda(a), axis), fn(mt.tensor(a), axis))


@pytest.mark.parametrize("dtype", ["float32", "int32"])
@pytest.mark.parametrize("name", ["cumsum", "cumprod"])
def test_scans_match_the_cpu(name, dtype, rng):
    a = random_array((3, 6), dtype, rng, low=-2, high=3)
    fn = getattr(R, name)
    same(fn(cuda(a), 1), fn(mt.tensor(a), 1))
    same(fn(cuda(a), 0), fn(mt.tensor(a), 0))


@pytest.mark.parametrize("dtype", GPU_DTYPES)
def test_sort_argsort_topk_match_the_cpu(dtype, rng):
    a = random_array((4, 9), dtype, rng, low=-3, high=3)        # many ties: the index order counts
    for desc in (False, True):
        gv, gi = R.sort(cuda(a), -1, desc)
        cv, ci = R.sort(mt.tensor(a), -1, desc)
        same(gv, cv)
        same(gi, ci)
    gv, gi = R.topk(cuda(a), 3)
    cv, ci = R.topk(mt.tensor(a), 3)
    same(gv, cv)
    same(gi, ci)


# ---------------------------------------------------------------- nn

@pytest.mark.parametrize("dtype", FLOATS)
def test_norms_match_the_cpu(dtype, rng):
    x = random_array((2, 6, 4, 5), dtype, rng, low=-3, high=3)
    w, b = random_array((6,), dtype, rng, low=1, high=3), random_array((6,), dtype, rng, low=-2, high=2)
    rm, rv = np.zeros(6, np.float32), np.ones(6, np.float32) * 2
    tol = dict(rtol=3e-2, atol=3e-2) if dtype != "float32" else {}
    same(F.batch_norm(cuda(x), cuda(rm), cuda(rv), cuda(w), cuda(b)),
         F.batch_norm(mt.tensor(x), mt.tensor(rm), mt.tensor(rv), mt.tensor(w), mt.tensor(b)), **tol)
    same(F.layer_norm(cuda(x), (4, 5)), F.layer_norm(mt.tensor(x), (4, 5)), **tol)
    same(F.group_norm(cuda(x), 3, cuda(w), cuda(b)), F.group_norm(mt.tensor(x), 3, mt.tensor(w), mt.tensor(b)), **tol)


def test_batch_norm_training_updates_running_statistics_on_the_gpu(rng):
    x = rng.standard_normal((4, 3, 5, 5)).astype(np.float32)
    rm_g, rv_g = cuda(np.zeros(3, np.float32)), cuda(np.ones(3, np.float32))
    rm_c, rv_c = mt.tensor(np.zeros(3, np.float32)), mt.tensor(np.ones(3, np.float32))
    same(F.batch_norm(cuda(x), rm_g, rv_g, training=True), F.batch_norm(mt.tensor(x), rm_c, rv_c, training=True))
    same(rm_g, rm_c)
    same(rv_g, rv_c)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("shapes", [((5, 7), (7, 3)), ((2, 5, 7), (7, 3)), ((2, 3, 5, 7), (2, 3, 7, 4)),
                                    ((3, 5, 7), (1, 7, 2)), ((7,), (7, 4)), ((5, 7), (7,))])
def test_matmul_matches_numpy(shapes, dtype, rng):
    a = random_array(shapes[0], dtype, rng, low=-3, high=3)
    b = random_array(shapes[1], dtype, rng, low=-3, high=3)
    want = np.matmul(a.astype(np.float64), b.astype(np.float64))
    got = F.matmul(cuda(a), cuda(b))
    assert got.dtype == mt.as_dtype(dtype)
    np.testing.assert_allclose(got.numpy().astype(np.float64), want,
                               rtol=TOL[dtype][0] * 4, atol=TOL[dtype][1] * 40)


@pytest.mark.parametrize("dtype", FLOATS)
def test_matmul_of_transposed_and_strided_operands(dtype, rng):
    a = random_array((6, 5), dtype, rng, low=-3, high=3)
    b = random_array((4, 6), dtype, rng, low=-3, high=3)
    want = a.astype(np.float64).T @ b.astype(np.float64).T
    got = F.matmul(cuda(a).transpose(1, 0), cuda(b).transpose(1, 0))
    np.testing.assert_allclose(got.numpy().astype(np.float64), want, rtol=TOL[dtype][0] * 4,
                               atol=TOL[dtype][1] * 40)
    got = F.matmul(cuda(a)[:, ::2], cuda(b)[::2, :].transpose(1, 0)[::2])
    np.testing.assert_allclose(got.numpy().astype(np.float64),
                               a.astype(np.float64)[:, ::2] @ b.astype(np.float64)[::2, :].T[::2],
                               rtol=TOL[dtype][0] * 4, atol=TOL[dtype][1] * 40)


def test_float32_matmul_is_not_tf32_by_default(rng):
    a = rng.standard_normal((64, 256)).astype(np.float32)
    b = rng.standard_normal((256, 64)).astype(np.float32)
    got = F.matmul(cuda(a), cuda(b)).numpy()
    np.testing.assert_allclose(got, a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)


def test_linear_matches_the_cpu(rng):
    x = rng.standard_normal((2, 5, 8)).astype(np.float32)
    w = rng.standard_normal((3, 8)).astype(np.float32)
    b = rng.standard_normal(3).astype(np.float32)
    same(F.linear(cuda(x), cuda(w), cuda(b)), F.linear(mt.tensor(x), mt.tensor(w), mt.tensor(b)), atol=1e-4)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("geom", [dict(), dict(stride=2, padding=1), dict(padding=2, dilation=2),
                                  dict(groups=2, padding=1), dict(groups=4)])
def test_conv2d_matches_the_cpu(geom, dtype, rng):
    x = random_array((3, 4, 9, 8), dtype, rng, low=-2, high=2)
    g = geom.get("groups", 1)
    w = random_array((8, 4 // g, 3, 3), dtype, rng, low=-2, high=2)
    b = random_array((8,), dtype, rng, low=-2, high=2)
    tol = dict(rtol=1e-4, atol=1e-4) if dtype == "float32" else dict(rtol=3e-3, atol=3e-2)
    same(F.conv2d(cuda(x), cuda(w), cuda(b), **geom), F.conv2d(mt.tensor(x), mt.tensor(w), mt.tensor(b), **geom), **tol)


def test_conv2d_1x1_and_fused_epilogue(rng):
    x = rng.standard_normal((2, 6, 5, 5)).astype(np.float32)
    w = rng.standard_normal((4, 6, 1, 1)).astype(np.float32)
    b = rng.standard_normal(4).astype(np.float32)
    r = rng.standard_normal((2, 4, 5, 5)).astype(np.float32)
    same(F.conv2d(cuda(x), cuda(w), cuda(b)), F.conv2d(mt.tensor(x), mt.tensor(w), mt.tensor(b)), atol=1e-4)
    same(NN.conv2d_act(cuda(x), cuda(w), cuda(b), residual=cuda(r), act="relu"),
         NN.conv2d_act(mt.tensor(x), mt.tensor(w), mt.tensor(b), residual=mt.tensor(r), act="relu"), atol=1e-4)


@pytest.mark.parametrize("dtype", FLOATS)
def test_pooling_matches_the_cpu(dtype, rng):
    x = random_array((2, 3, 9, 10), dtype, rng)
    for fn, kw in ((F.max_pool2d, dict(kernel_size=3, stride=2, padding=1)),
                   (F.avg_pool2d, dict(kernel_size=3, stride=2, padding=1)),
                   (F.avg_pool2d, dict(kernel_size=2)),
                   (F.adaptive_avg_pool2d, dict(oshp=(1, 1))),
                   (F.adaptive_avg_pool2d, dict(oshp=(4, 3))),
                   (F.adaptive_max_pool2d, dict(oshp=(2, 5)))):
        same(fn(cuda(x), **kw), fn(mt.tensor(x), **kw))


@pytest.mark.parametrize("mode,ac", [("nearest", None), ("bilinear", False), ("bilinear", True)])
def test_interpolate_matches_the_cpu(mode, ac, rng):
    x = rng.standard_normal((2, 3, 5, 7)).astype(np.float32)
    for kw in (dict(size=(9, 4)), dict(scale_factor=2.0)):
        same(F.interpolate(cuda(x), mode=mode, align_corners=ac, **kw),
             F.interpolate(mt.tensor(x), mode=mode, align_corners=ac, **kw))


@pytest.mark.parametrize("dtype", GPU_DTYPES)
def test_gather_embedding_and_advanced_indexing(dtype, rng):
    a = random_array((5, 6), dtype, rng)
    idx = rng.integers(0, 6, (5, 3))
    same(F.gather(cuda(a), 1, cuda(idx.astype(np.int32))), np.take_along_axis(a, idx, 1))
    w = random_array((10, 4), dtype, rng)
    ids = rng.integers(0, 10, (2, 7))
    same(F.embedding(cuda(ids.astype(np.int32)), cuda(w)), w[ids])
    same(cuda(a)[cuda(np.array([4, 0, 2], np.int32))], a[[4, 0, 2]])
    same(cuda(a)[:, [1, 3]], a[:, [1, 3]])
    mask = a.astype(np.float32) > 0
    same(cuda(a)[cuda(mask)], a[mask])
    t = cuda(a)
    t[[0, 2]] = cuda(a[[1, 3]])
    b = a.copy()
    b[[0, 2]] = a[[1, 3]]
    same(t, b)


def test_embedding_index_out_of_range_is_an_error_not_a_crash():
    with pytest.raises(IndexError):
        F.embedding(cuda(np.array([0, 12], np.int32)), cuda(np.ones((10, 4), np.float32)))


@pytest.mark.parametrize("dtype", GPU_DTYPES)
def test_concat_stack_split(dtype, rng):
    a, b = random_array((2, 3), dtype, rng), random_array((4, 3), dtype, rng)
    same(F.concat([cuda(a), cuda(b)]), np.concatenate([a, b]))
    same(F.stack([cuda(a), cuda(a)], 1), np.stack([a, a], 1))
    parts = F.split(cuda(b), 2)
    for p, q in zip(parts, np.split(b, 2)):
        same(p, q)


def test_pad_constant_on_the_gpu(rng):
    x = rng.standard_normal((2, 3)).astype(np.float32)
    same(F.pad(cuda(x), ((1, 0), (2, 1)), constant_value=5.0), np.pad(x, ((1, 0), (2, 1)), constant_values=5.0))
