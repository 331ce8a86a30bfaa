"""The backend seam: every op goes backend_of(device) -> kernel table ->
kernel, the CPU included. A stand-in second device type (host memory, the
CPU's tables for the areas asked for, the others empty) shows what each op
of the op table does on a device without its kernel: it raises the one
missing-kernel text, runs its declared fallback, or needs no kernel."""
import importlib
import re
from pathlib import Path

import numpy as np
import pytest

import mgtrace as mt
import mgtrace.functional as F
from mgtrace._core import op_table
from mgtrace.errors import DeviceUnavailable, NoKernelError

core_tensor = importlib.import_module("mgtrace._core.tensor")    # the module, not mt.tensor
ALL_AREAS = ("elementwise", "reduce", "linalg", "nn", "index")
MISSING = re.compile(r"^no kernel for op '(\w+)' on device (\S+) with dtype (\w+)$")
ELEMENTWISE_GROUPS = ("unary", "activation", "predicate", "bitwise", "binary", "compare", "ternary")


@pytest.fixture
def fake_device():
    """``install(areas)`` makes cuda:0 a stand-in device with the CPU's
    kernel tables for ``areas`` only; removed after the test."""
    def install(areas=(), host_memory=False):
        core_tensor._install_test_backend("cuda", tuple(areas), host_memory)
        return mt.Device("cuda:0")
    yield install
    core_tensor._remove_test_backend("cuda")


def _rng():
    return np.random.default_rng(30)


def _f32(*shape):
    return _rng().standard_normal(shape).astype(np.float32)


def _example(name):
    """(inputs as NumPy values or plain Python, params) of one call of op
    ``name`` that runs on the CPU."""
    row = op_table.OPS[name]
    x = _f32(2, 3)
    if row.group in ("bitwise",) or name in ("left_shift", "right_shift"):
        v = np.array([[1, 2, 3], [4, 5, 6]], np.int32)
        return [v] * (row.arity or 1), {}
    if row.group in ELEMENTWISE_GROUPS:
        if name == "where":
            return [x > 0, x, -x], {}
        pos = np.abs(x) + 0.5 if name in ("log", "log2", "log1p", "sqrt", "rsqrt", "pow") else x
        if name in ("asin", "acos"):
            pos = np.clip(x, -0.9, 0.9)
        if name in ("logical_not", "logical_and", "logical_or", "logical_xor"):
            pos = x > 0
        return [pos] * row.arity, {}
    nchw, w = _f32(1, 3, 6, 6), _f32(4, 3, 3, 3)
    examples = {
        "astype": ([x], {"dtype": "float64"}),
        "reshape": ([x], {"shape": (3, 2)}),
        "transpose": ([x], {"axes": (1, 0)}),
        "expand_dims": ([x], {"axis": 0}),
        "squeeze": ([x[None]], {"axis": 0}),
        "broadcast_to": ([x], {"shape": (4, 2, 3)}),
        "var": ([x], {"axis": 1}), "std": ([x], {"axis": 1}),
        "softmax": ([x], {"axis": 1}), "log_softmax": ([x], {"axis": 1}),
        "cumsum": ([x], {"axis": 1}), "cumprod": ([x], {"axis": 1}),
        "sort": ([x], {"axis": 1}), "argsort": ([x], {"axis": 1}),
        "topk": ([x], {"k": 2, "axis": 1}),
        "getitem": ([x, np.array([1, 0], np.int32)], {}),
        "setitem": ([x.copy(), (0, 1), 5.0], {}),
        "nonzero": ([x > 0], {}),
        "gather": ([x, np.array([[0, 2, 1], [1, 1, 0]], np.int32)], {"axis": 1}),
        "scatter": ([x, np.array([[0, 2, 1], [1, 1, 0]], np.int32), _f32(2, 3)], {"axis": 1}),
        "embedding": ([x, np.array([1, 0, 1], np.int32)], {}),
        "concat": ([x, x], {"axis": 0}),
        "stack": ([x, x], {"axis": 0}),
        "split": ([x], {"nsplits_or_sections": 3, "axis": 1}),
        "matmul": ([x, _f32(3, 4)], {}),
        "conv2d": ([nchw, w, None], {"padding": 1}),
        "conv2d_act": ([nchw, w, _f32(4), None], {"padding": 1, "act": "relu"}),
        "conv_transpose2d": ([nchw, _f32(3, 2, 3, 3), None], {"stride": 2}),
        "attention": ([_f32(1, 2, 3, 4), _f32(1, 2, 5, 4), _f32(1, 2, 5, 4), None], {"scale": 0.5}),
        "max_pool2d": ([nchw], {"kernel_size": 2}),
        "avg_pool2d": ([nchw], {"kernel_size": 2}),
        "adaptive_avg_pool2d": ([nchw], {"output_size": 2}),
        "adaptive_max_pool2d": ([nchw], {"output_size": 2}),
        "interpolate": ([nchw], {"scale_factor": 2, "mode": "bilinear"}),
        "pad": ([nchw], {"pad_width": ((0, 0), (0, 0), (1, 1), (2, 0)), "mode": "reflect"}),
        "to_nchwc": ([nchw], {}),
        "from_nchwc": ([_f32(1, 1, 6, 6, 16)], {"channels": 3}),
        "max_pool2d_nchwc": ([_f32(1, 1, 6, 6, 16)], {"kernel_size": 2}),
        "conv3d": ([_f32(1, 8, 4, 5, 5), _f32(4, 8, 3, 3, 3), None], {"padding": 1}),
        "conv_transpose3d": ([_f32(1, 3, 3, 3, 3), _f32(3, 2, 2, 2, 2), None], {"stride": 2}),
        "lstm_cell": ([_f32(2, 12), _f32(2, 3), _f32(2, 3), _f32(12, 3), _f32(12)], {}),
        "rnn_cell": ([_f32(2, 4), _f32(2, 4), _f32(4, 4), None], {"nonlinearity": "tanh"}),
    }
    if row.group == "reduce" and name not in examples:
        return [x], {"axis": 1}
    if name.startswith("conv2d_nchwc"):
        return _nchwc_example(name)
    return examples[name]


def _nchwc_example(name):
    x = _f32(1, 1, 6, 6, 16)
    pw, dw, pj = _f32(16, 16, 1, 1), _f32(16, 1, 3, 3), _f32(16, 16, 1, 1)
    if name == "conv2d_nchwc":
        return [x, _f32(16, 16, 3, 3), _f32(16), None], {"padding": 1}
    if name == "conv2d_nchwc_pw_dw":
        return [x, pw, _f32(16), dw, _f32(16)], {"padding": 1}
    return [x, pw, _f32(16), dw, _f32(16), pj, _f32(16), None], {"padding": 1}


def _on(v, device):
    if isinstance(v, np.ndarray):
        return mt.tensor(v, device=device)
    return v


def _run(name, device):
    inputs, params = _example(name)
    inputs = [_on(v, device) for v in inputs]
    if name in ("gather", "scatter"):       # their functions take axis second
        from mgtrace._core import index
        return getattr(index, name)(inputs[0], params["axis"], *inputs[1:])
    out = mt.apply(mt.OpDef(name, params), *inputs)
    return inputs[0] if name == "setitem" else out      # in place: the written tensor


def _values(out):
    if isinstance(out, (tuple, list)):
        return [_values(o) for o in out]
    return out.numpy() if isinstance(out, mt.Tensor) else out


def _assert_same(got, want):
    if isinstance(want, list):
        assert len(got) == len(want)
        for g, w in zip(got, want):
            _assert_same(g, w)
    else:
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_every_op_has_an_example():
    # the op table is the list: a new op needs an example here too
    for name in op_table.OPS:
        inputs, params = _example(name)
        _run(name, "cpu")       # and it runs on the CPU


@pytest.mark.parametrize("name", sorted(op_table.OPS))
def test_op_on_a_device_without_kernels_raises_the_one_text_or_runs(name, fake_device):
    """No kernel tables at all: the op raises NoKernelError with the one
    text (naming the device and a dtype), or runs its fallback / needs no
    kernel, giving the CPU's values."""
    want = _values(_run(name, "cpu"))
    dev = fake_device(())
    try:
        got = _run(name, dev)
    except NoKernelError as e:
        m = MISSING.match(str(e))
        assert m, str(e)
        assert m.group(2) == "cuda:0"
        assert m.group(3) in mt.DTYPES
        return
    # it ran: a view (or an op found on the host), or one with a fallback
    assert op_table.OPS[name].fallback or mt.has_kernel(name, dev), \
        f"{name} ran on a device without kernels"
    fake_device(ALL_AREAS)      # reading a view back copies it: kernels for that
    _assert_same(_values(got), want)


# fallbacks written over other nn ops (CUDA has those: conv3d runs conv2d per depth tap there)
FALLBACK_NEEDS_NN = {"conv3d": "conv2d", "conv_transpose3d": "conv_transpose2d"}


@pytest.mark.parametrize("name", sorted(n for n, r in op_table.OPS.items() if r.group == "nn"))
def test_nn_op_without_its_kernel_raises_naming_itself_or_runs_its_fallback(name, fake_device):
    """The other areas present, nn empty (a device like CUDA, without the
    CPU-only kernels): each nn op names itself, or runs its fallback."""
    want = _values(_run(name, "cpu"))
    dev = fake_device(("elementwise", "reduce", "linalg", "index"))
    if name in FALLBACK_NEEDS_NN:       # its composition needs an nn kernel this device lacks too
        with pytest.raises(NoKernelError, match=f"^no kernel for op '{FALLBACK_NEEDS_NN[name]}' on device "
                                                "cuda:0 with dtype float32$"):
            _run(name, dev)
        assert not mt.has_kernel(name, dev, "float32")
        return
    if op_table.OPS[name].fallback:
        _assert_same(_values(_run(name, dev)), want)
        assert not mt.has_kernel(name, dev, "float32")
        return
    with pytest.raises(NoKernelError, match=f"^no kernel for op '{name}' on device cuda:0 with dtype float32$"):
        _run(name, dev)
    assert not mt.has_kernel(name, dev, "float32")


@pytest.mark.parametrize("name", sorted(op_table.OPS))
def test_every_op_runs_through_a_second_backend_with_the_cpus_tables(name, fake_device):
    """With every CPU table installed on cuda:0 (device memory: every
    crossing a copy), each op gives the CPU's values: the ops reach kernels
    only through the device's backend."""
    want = _values(_run(name, "cpu"))
    dev = fake_device(ALL_AREAS)
    _assert_same(_values(_run(name, dev)), want)


def test_has_kernel_on_the_cpu_answers_per_dtype():
    assert mt.has_kernel("add", "cpu", "float32")
    assert mt.has_kernel("conv2d_nchwc", "cpu", "float32")
    assert not mt.has_kernel("conv2d_nchwc", "cpu", "float64")
    assert mt.has_kernel("conv2d", "cpu:1", "float64")
    assert not mt.has_kernel("conv2d", "cpu", "int32")
    assert mt.has_kernel("matmul", "cpu", "int64")
    assert not mt.has_kernel("matmul", "cpu", "bool")
    assert mt.has_kernel("reshape", "cpu", "bool")          # views run no kernel
    assert mt.has_kernel("sum", "cpu", "int8")
    with pytest.raises(KeyError, match="no core op"):
        mt.has_kernel("conv4d", "cpu")


def test_has_kernel_follows_the_device_backend(fake_device):
    dev = fake_device(("elementwise",))
    assert mt.has_kernel("add", dev, "float32")
    assert not mt.has_kernel("sum", dev, "float32")
    assert not mt.has_kernel("matmul", dev, "float32")
    assert not mt.has_kernel("conv2d", dev, "float32")


ELEMENTWISE_OPS = sorted(n for n, r in op_table.OPS.items() if r.group in ELEMENTWISE_GROUPS) + ["astype"]
DTYPE_NAMES = [str(d) for d in mt.DTYPES]


def test_has_kernel_answers_elementwise_per_dtype_from_the_devices_table(fake_device):
    """A second backend's elementwise ops answer per dtype from its
    has_elementwise member (CUDA's reads its per (op, dtype) table): the
    stand-in has the CPU's loops, so every (op, dtype) answer is the
    CPU's, missing dtypes included."""
    dev = fake_device(("elementwise",))
    answers = {(op, dt): mt.has_kernel(op, dev, dt) for op in ELEMENTWISE_OPS for dt in DTYPE_NAMES}
    assert answers == {(op, dt): mt.has_kernel(op, "cpu", dt) for op in ELEMENTWISE_OPS for dt in DTYPE_NAMES}
    assert answers["add", "float32"] and answers["exp", "float64"] and answers["bitwise_and", "int32"]
    assert not answers["exp", "int32"]           # exp computes in a float dtype: no integer loop
    assert not answers["bitwise_and", "float32"]
    assert not answers["sin", "bool"]
    fake_device(())                              # no elementwise member: no dtype
    assert not any(mt.has_kernel(op, dev, "float32") for op in ELEMENTWISE_OPS)


def test_a_device_type_without_its_backend_is_unavailable():
    # no CUDA extension here (or no GPU): placement raises DeviceUnavailable,
    # a DeviceError and a NotImplementedError, with one wording
    if mt.cuda_available():
        pytest.skip("a GPU is present")
    x = mt.tensor([1.0])
    with pytest.raises(DeviceUnavailable, match=r"^device cuda:0 is not available: .*mgtrace doctor"):
        x.to("cuda:0")
    with pytest.raises(NotImplementedError):
        mt.tensor([1.0], device="cuda:0")


NN_HEADER = Path(mt.__file__).parent / "_core" / "kernels" / "contract" / "nn_kernels.h"


def _backward_members():
    """The nn table's backward members, read from its contract header: the
    members named *_backward, and index_add (the gradient of gathers)."""
    text = NN_HEADER.read_text()
    body = text[text.rindex("typedef struct", 0, text.index("} mt_nn_kernels;")):text.index("} mt_nn_kernels;")]
    members = re.findall(r"\(\*(\w+)\)\(", body)
    return sorted(m for m in members if "backward" in m or m == "index_add")


# one call per backward member of the nn table (example name: (the members
# its gradient uses, the call, input shapes)); on a CUDA stand-in (the nn
# table CUDA has, no backward member), the gradient raises the one
# missing-kernel text, or its forward ran a fallback whose gradient needs
# none and gives the CPU's
BACKWARD = {
    "max_pool2d": (("max_pool2d_backward",), lambda x: F.max_pool2d(x, 2), [(1, 2, 4, 4)]),
    "avg_pool2d": (("avg_pool2d_backward",), lambda x: F.avg_pool2d(x, 2), [(1, 2, 4, 4)]),
    "adaptive_avg_pool2d": (("adaptive_pool2d_backward",), lambda x: F.adaptive_avg_pool2d(x, (2, 2)),
                            [(1, 2, 5, 5)]),
    "adaptive_max_pool2d": (("adaptive_pool2d_backward",), lambda x: F.adaptive_max_pool2d(x, (2, 2)),
                            [(1, 2, 5, 5)]),
    "interpolate": (("resize2d_backward",), lambda x: F.interpolate(x, scale_factor=2, mode="bilinear"),
                    [(1, 2, 3, 3)]),
    "conv2d": (("conv2d_backward_weight",), lambda x, w: F.conv2d(x, w), [(1, 2, 5, 5), (3, 2, 3, 3)]),
    "gelu": (("act_backward",), lambda x: F.gelu(x), [(2, 3)]),
    "embedding": (("index_add",), lambda w: F.embedding(mt.tensor([[0, 2, 2], [4, 1, 0]], device=w.device), w),
                  [(5, 3)]),
    "layer_norm": (("layer_norm_backward",), lambda x, w, b: F.layer_norm(x, (4,), w, b), [(3, 4), (4,), (4,)]),
    "batch_norm": (("batch_norm_backward",), lambda x, w, b: F.batch_norm(x, None, None, w, b, training=True),
                   [(2, 3, 4, 4), (3,), (3,)]),
    "conv3d": (("conv3d_backward_data", "conv3d_backward_weight"), lambda x, w: F.conv3d(x, w),
               [(1, 2, 3, 4, 4), (3, 2, 2, 2, 2)]),
    "softmax": (("softmax_backward",), lambda x: F.softmax(x, axis=-1), [(3, 5)]),
    "log_softmax": (("softmax_backward",), lambda x: F.log_softmax(x, axis=-1), [(3, 5)]),
    "attention": (("attention_backward_f32", "attention_backward_workspace"),
                  lambda q, k, v: F.attention(q, k, v, scale=0.5), [(1, 2, 3, 4), (1, 2, 5, 4), (1, 2, 5, 4)]),
}
# what each raises on the stand-in: the first kernel it lacks (None: it ran
# a fallback and its gradient needs no backward kernel)
MISSING_FIRST = {
    "max_pool2d": "max_pool2d backward", "avg_pool2d": "avg_pool2d backward",
    "adaptive_avg_pool2d": "adaptive_avg_pool2d backward", "adaptive_max_pool2d": "adaptive_max_pool2d backward",
    "interpolate": "interpolate backward", "gelu": "gelu backward", "embedding": "index_add",
    "conv2d": "conv2d backward",            # its input gradient (stride 1) is a forward conv2d: the weight's
    "conv3d": "conv_transpose2d",           # its fallback (conv2d per depth tap) has conv2d's gradient
    "layer_norm": None,                     # its fallback composes reductions and elementwise ops
    "batch_norm": None,                     # so does batch norm's
    "softmax": None,                        # its rule composes core ops without the kernel
    "log_softmax": None,
    "attention": None,                      # its rule composes core ops (F.attention's node is the core op's)
}
MISSING_BACKWARD = re.compile(r"^no kernel for op '([\w ]+)' on device cuda:0 with dtype float32$")


def test_every_backward_member_of_the_nn_table_has_an_example():
    members = _backward_members()
    assert "act_backward" in members and "index_add" in members      # the header was read
    assert sorted({m for used, _, _ in BACKWARD.values() for m in used}) == members


def test_attention_grad_kernels_missing_raise_the_one_text(fake_device):
    # CUDA's nn table leaves the training forward and the backward NULL:
    # called directly, each raises the one missing-kernel text (the rule
    # and F.attention under a GradManager then compose core ops, above)
    from mgtrace._core import nn as core_nn
    core_tensor._install_test_backend("cuda", ALL_AREAS, False, False)
    q, k = (mt.tensor(_f32(1, 2, 3, 4), device="cuda:0") for _ in range(2))
    with pytest.raises(NoKernelError, match=re.escape(
            "no kernel for op 'attention (training forward)' on device cuda:0 with dtype float32")):
        core_nn.attention_train(q, k, k, None, 0.5)
    with pytest.raises(NoKernelError, match=re.escape(
            "no kernel for op 'attention backward' on device cuda:0 with dtype float32")):
        core_nn.attention_backward(q, k, k, None, q, 0.5)


def _gradients(name, device):
    from mgtrace.autodiff import GradManager
    _, fn, shapes = BACKWARD[name]
    ts = [mt.tensor(np.random.default_rng(30 + i).standard_normal(s).astype(np.float32), device=device)
          for i, s in enumerate(shapes)]
    gm = GradManager().attach(ts)
    with gm:
        y = fn(*ts)
        assert str(y.device) == str(mt.Device(device))
        gm.backward((y * y).sum())
    return [t.grad for t in ts]


@pytest.mark.parametrize("name", sorted(BACKWARD))
def test_a_gradient_without_its_backward_kernel_raises_the_one_text(name, fake_device):
    want = [g.numpy() for g in _gradients(name, "cpu")]
    core_tensor._install_test_backend("cuda", ALL_AREAS, False, False)    # CUDA's nn table: no backward members
    if MISSING_FIRST.get(name) is None:
        got = _gradients(name, "cuda:0")
        for g, w in zip(got, want):
            np.testing.assert_allclose(g.to("cpu").numpy(), w, rtol=1e-4, atol=1e-5)
        return
    with pytest.raises(NoKernelError) as e:
        _gradients(name, "cuda:0")
    m = MISSING_BACKWARD.match(str(e.value))
    assert m and m.group(1) == MISSING_FIRST[name], str(e.value)
