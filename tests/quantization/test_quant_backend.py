"""The int8 kernels go through the backend table (issue 32 item 5): the
CPU backend's ``quant`` member (contract/quant_kernels.h) is installed by
mgtrace._core.qint8, every kernel call looks up its data's device's table,
and a device without one (CUDA's backend leaves it NULL; here a stand-in
device type with the CPU's other tables) refuses a quantized op with the
one missing-kernel text naming the op and the device. The same stand-in
given the CPU's quant table pools the same integers as the CPU."""
import importlib
import threading

import numpy as np
import pytest

import mgtrace as mt
from mgtrace._core import qint8
from mgtrace.errors import DeviceUnavailable, NoKernelError
from mgtrace.quantization import int8
from mgtrace.quantization.qtensor import quantize
from mgtrace.quantization.utils import create_qparams, QuantMode, quant_dtype

core_tensor = importlib.import_module("mgtrace._core.tensor")
OTHER_AREAS = ("elementwise", "reduce", "linalg", "nn", "index")


@pytest.fixture
def stand_in():
    """``install(with_quant)``: cuda:0 a host-memory stand-in with the CPU's
    tables, its quant table only when asked; removed after the test."""
    def install(with_quant):
        areas = OTHER_AREAS + (("quant",) if with_quant else ())
        core_tensor._install_test_backend("cuda", areas, True)
        return mt.Device("cuda:0")
    yield install
    core_tensor._remove_test_backend("cuda")


def _quint8_input():
    xf = np.random.default_rng(32).uniform(-1, 3, (2, 3, 7, 6)).astype(np.float32)
    q = create_qparams(QuantMode.ASYMMERTIC, quant_dtype("quint8"), np.float32(0.02),
                       np.float32(40))
    return quantize(mt.tensor(xf), q)


def test_the_cpu_has_the_table_and_the_stand_in_only_when_given(stand_in):
    assert qint8.has_table() and qint8.has_table("cpu")
    stand_in(False)
    assert not qint8.has_table("cuda:0")
    stand_in(True)
    assert qint8.has_table("cuda:0")


@pytest.mark.parametrize("op, call", [
    ("linear", lambda d: qint8.pack_weight(np.ones((4, 8), np.int8), device=d)),
    ("linear", lambda d: qint8.gemm(np.ones((2, 8), np.uint8), 0, np.zeros(1, np.int8),
                                    np.zeros(4, np.int32), None, np.ones(4), 0, -128, 127,
                                    np.empty((2, 4), np.int8), 4, 1, device=d)),
    ("conv2d", lambda d: qint8.im2col(np.ones((1, 3, 3), np.uint8), 1, 1, 1, 1, 0, 0, 1, 1,
                                      3, 3, 0, device=d)),
    ("max_pool2d", lambda d: qint8.maxpool(np.ones((1, 1, 2, 2), np.uint8), 2, 2, 1, 1, 0, 0,
                                           1, 1, np.empty((1, 1, 1, 1), np.uint8), device=d)),
])
def test_a_kernel_on_a_device_without_the_table_names_op_and_device(stand_in, op, call):
    stand_in(False)
    with pytest.raises(NoKernelError,
                       match=rf"^no kernel for op '{op}' on device cuda:0 with dtype q?u?int8$"):
        call("cuda:0")


def test_tensor_kernels_look_up_their_tensors_device(stand_in):
    dev = stand_in(False)
    a = mt.tensor(np.arange(6, dtype=np.uint8), device=dev)
    out = mt.tensor(np.zeros(6, np.uint8), device=dev)
    with pytest.raises(NoKernelError, match=r"^no kernel for op 'add' on device cuda:0 "):
        qint8.add_into(a, a, out, 0.5, 0.0, 0.5, 0.0, 1.0, 0.0, 0.0, 255.0, False)
    with pytest.raises(NoKernelError, match=r"^no kernel for op 'concat' on device cuda:0 "):
        qint8.concat_into([a, a], [0.5, 0.5], [0.0, 0.0], 1, mt.tensor(np.zeros(12, np.uint8),
                          device=dev), 1.0, 0.0, 0.0, 255.0)
    # the same call on the CPU: (a * 0.5 + a * 0.5) / 1, rounded half to even
    a, out = mt.tensor(np.arange(6, dtype=np.uint8)), mt.tensor(np.zeros(6, np.uint8))
    qint8.add_into(a, a, out, 0.5, 0.0, 0.5, 0.0, 1.0, 0.0, 0.0, 255.0, False)
    np.testing.assert_array_equal(out.numpy(), np.arange(6))


def test_quantized_pools_refuse_a_device_without_the_table(stand_in):
    x = _quint8_input()
    dev = stand_in(False)
    xd = x.to(dev)
    with pytest.raises(NoKernelError,
                       match=r"^no kernel for op 'max_pool2d' on device cuda:0 with dtype quint8$"):
        int8.max_pool2d_tensor(xd, 2)
    with pytest.raises(NoKernelError, match=r"^no kernel for op 'avg_pool2d' on device cuda:0 "):
        int8.avg_pool2d_tensor(xd, 2)


@pytest.mark.parametrize("pool", [lambda x: int8.max_pool2d_tensor(x, 3, 2, 1),
                                  lambda x: int8.avg_pool2d_tensor(x, 2),
                                  lambda x: int8.adaptive_avg_pool2d_tensor(x, (2, 3))])
def test_a_device_with_the_table_pools_the_cpus_integers(stand_in, pool):
    x = _quint8_input()
    want = pool(x)
    dev = stand_in(True)
    got = pool(x.to(dev))
    assert got.device == dev and got.dtype == want.dtype
    np.testing.assert_array_equal(got.numpy(), want.numpy())


def test_the_cuda_backend_has_no_quant_table():
    try:
        has = qint8.has_table("cuda:0")
    except DeviceUnavailable as e:
        pytest.skip(f"no CUDA device: {e}")
    assert not has


def test_recording_notes_this_threads_calls_and_concat_up_to_a_steps_inputs():
    a = mt.tensor(np.arange(6, dtype=np.uint8))
    out = mt.tensor(np.zeros(6, np.uint8))

    def add():
        qint8.add_into(a, a, out, 0.5, 0.0, 0.5, 0.0, 1.0, 0.0, 0.0, 255.0, False)
    qint8.record_begin()
    add()
    other = threading.Thread(target=add)        # another thread's call is not noted
    other.start()
    other.join()
    calls = qint8.record_end()
    assert len(calls) == 1
    name, ptrs, ints, floats, nt = calls[0]
    assert name == "add" and [p[2] for p in ptrs] == ["r", "r", "w"]
    assert ints[2] == 6 and floats == (0.5, 0.0, 0.5, 0.0, 1.0, 0.0, 0.0, 255.0) and nt >= 1
    assert qint8.record_end() is None          # off again
    qint8.record_begin()
    cat = mt.tensor(np.zeros(12, np.uint8))
    qint8.concat_into([a, a], [0.5, 0.5], [0.0, 0.0], 1, cat, 1.0, 0.0, 0.0, 255.0)
    (name, ptrs, ints, floats, nt), = qint8.record_end()
    # out, kinds, scales, zero points, inner sizes, the requantizing tables, the inputs
    assert name == "concat" and [p[2] for p in ptrs] == ["w", "c", "c", "c", "c", "w", "r", "r"]
    assert [p[1] for p in ptrs] == [12, 8, 8, 8, 16, 2 * 257, 6, 6]     # bytes
    assert ints == (2, 1, 1) and floats == (1.0, 0.0, 0.0, 255.0)
    half = np.rint(np.arange(6, dtype=np.float32) * np.float32(0.5)).astype(np.uint8)
    np.testing.assert_array_equal(cat.numpy(), np.concatenate([half, half]))
    qint8.record_begin()                       # more inputs than a plan's step takes
    qint8.concat_into([a] * 11, [0.5] * 11, [0.0] * 11, 1, mt.tensor(np.zeros(66, np.uint8)),
                      1.0, 0.0, 0.0, 255.0)
    assert qint8.record_end() is None


def test_flip_moves_int8_integers_to_the_kernels_uint8_bytes():
    x = np.arange(-128, 128, dtype=np.int8)
    out = np.empty(256, np.uint8)
    qint8.flip_into(x, out)
    np.testing.assert_array_equal(out.astype(np.int64), x.astype(np.int64) + 128)
    qint8.flip_into(np.empty(0, np.int8), np.empty(0, np.uint8))       # nothing to do
    with pytest.raises(ValueError, match="flip_into takes"):
        qint8.flip_into(x, np.empty(255, np.uint8))
