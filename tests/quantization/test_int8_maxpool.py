"""Int8 max pooling on the integers (qpool.c): the C kernel bitwise a NumPy
window max (int8 and uint8 extremes, strides, dilations, padding at both
ends, ceil_mode, a plane split over threads); F.max_pool2d of a quantized
tensor keeps its qparams and is bitwise the float pool of the dequantized
values quantized again; FuseQuantStub moves a max pool between a layer's
ReLU and the next QuantStub onto the integers (ResNet's stem)."""
import io
import warnings

import numpy as np
import pytest

import mgtrace as mt
import mgtrace.functional as F
import mgtrace.module as M
import mgtrace.module.quantized as MQ
import mgtrace.quantization as Q
from mgtrace.quantization import int8
from mgtrace.quantization.qtensor import dequantize, is_quantized, qparams_of, quantize
from mgtrace.quantization.utils import (QuantMode, QuantizationError, create_qparams,
                                        quant_dtype)
from mgtrace.traced_module import optimize

F32 = np.float32


def _numpy_pool(x, k, s, p, d, oh, ow):
    """Each output the max of its window's input elements (padding left out)."""
    n, c, h, w = x.shape
    out = np.empty((n, c, oh, ow), x.dtype)
    for i in range(oh):
        for j in range(ow):
            rows = [i * s[0] - p[0] + a * d[0] for a in range(k[0])]
            cols = [j * s[1] - p[1] + b * d[1] for b in range(k[1])]
            rows = [r for r in rows if 0 <= r < h]
            cols = [q for q in cols if 0 <= q < w]
            out[:, :, i, j] = x[:, :, rows][:, :, :, cols].max(axis=(2, 3))
    return out


CASES = [   # (shape, kernel, stride, padding, dilation, ceil_mode)
    ((2, 3, 9, 11), (3, 3), (2, 2), (1, 1), (1, 1), False),
    ((1, 2, 8, 8), (2, 2), (2, 2), (0, 0), (1, 1), False),
    ((2, 2, 7, 10), (3, 2), (1, 3), (1, 1), (2, 1), True),
    ((1, 3, 5, 1), (1, 3), (1, 3), (0, 1), (1, 1), True),      # one column: taps past it
    ((1, 2, 13, 12), (4, 3), (3, 2), (2, 1), (1, 2), True),
    ((1, 1, 6, 6), (1, 1), (1, 1), (0, 0), (1, 1), False),
    ((1, 64, 56, 56), (3, 3), (2, 2), (1, 1), (1, 1), False),  # split over threads
]


@pytest.mark.parametrize("case", range(len(CASES)))
@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
def test_kernel_is_the_window_max(case, dtype):
    shape, k, s, p, d, ceil = CASES[case]
    rng = np.random.default_rng(case)
    info = np.iinfo(dtype)
    x = rng.integers(info.min, int(info.max) + 1, shape).astype(dtype)
    x.flat[::7] = info.min          # the extremes: padding must not win over them
    x.flat[3::11] = info.max
    got = int8.max_pool2d(x, k, s, p, d, ceil)
    ref = F.max_pool2d(mt.tensor(x.astype(F32)), k, s, p, d, ceil).numpy()   # float's geometry
    assert got.dtype == dtype and got.shape == ref.shape
    np.testing.assert_array_equal(got, ref.astype(dtype))
    np.testing.assert_array_equal(got, _numpy_pool(x, k, s, p, d, *got.shape[2:]))
    np.testing.assert_array_equal(int8.max_pool2d(x, k, s, p, d, ceil, path=1), got)


def _qp(dtype, scale, zp=0):
    meta = quant_dtype(dtype)
    if meta.is_unsigned:
        return create_qparams(QuantMode.ASYMMERTIC, meta, scale, float(zp))
    return create_qparams(QuantMode.SYMMERTIC, meta, scale)


@pytest.mark.parametrize("qp", [("quint8", 0.03, 131), ("qint8", 0.02, 0), ("quint8", 1e-3, 255)])
def test_max_pool_of_a_quantized_tensor_keeps_its_qparams(qp):
    q = _qp(*qp)
    xf = (np.random.default_rng(4).standard_normal((2, 3, 10, 9)) * 3).astype(F32)
    x = quantize(mt.tensor(xf), q)
    y = F.max_pool2d(x, 3, 2, 1, ceil_mode=True)
    assert is_quantized(y) and y.dtype == x.dtype
    qy = qparams_of(y)
    assert float(qy.scale.numpy()) == float(q.scale.numpy())
    want = quantize(F.max_pool2d(dequantize(x), 3, 2, 1, ceil_mode=True), q)
    np.testing.assert_array_equal(np.asarray(y.numpy()), np.asarray(want.numpy()))
    # through the module too
    np.testing.assert_array_equal(np.asarray(M.MaxPool2d(3, 2, 1)(x).numpy()),
                                  np.asarray(quantize(F.max_pool2d(dequantize(x), 3, 2, 1),
                                                      q).numpy()))


def test_quantized_max_pool_refusals():
    x = quantize(mt.tensor(np.ones((1, 1, 4, 4), F32)), _qp("quint8", 0.1, 3))
    with pytest.raises(QuantizationError, match="padding"):
        F.max_pool2d(x, 2, 1, 2)
    with pytest.raises(QuantizationError, match="empty"):
        F.max_pool2d(x, 5)
    with pytest.raises(QuantizationError, match="max_pool2d"):     # no indices of one
        F.max_pool2d(x, 2, return_indices=True)
    with pytest.raises(QuantizationError, match="int8 / uint8"):
        int8.max_pool2d(np.zeros((1, 1, 4, 4), np.int32), 2)


class Stem(M.Module):
    """ResNet's stem and a conv after it; the pool a module or a function."""

    def __init__(self, functional):
        super().__init__()
        self.functional = functional
        self.conv = M.Conv2d(3, 8, 3, stride=2, padding=1)
        self.relu = M.ReLU()
        self.pool = M.MaxPool2d(3, 2, 1)
        self.next = M.Conv2d(8, 4, 3, padding=1)

    def forward(self, x):
        y = self.relu(self.conv(x))
        y = F.max_pool2d(y, 3, 2, 1) if self.functional else self.pool(y)
        return self.next(y)


def _data(seed):
    return (np.random.default_rng(seed).standard_normal((2, 3, 16, 16)) * 2).astype(F32)


@pytest.mark.parametrize("functional", [False, True])
def test_fuse_quant_stub_pools_the_stem_on_the_integers(functional):
    mt.random.seed(3)
    calib = [mt.tensor(_data(s)) for s in (1, 2)]
    q = Q.quantize_layers(Stem(functional).eval(), lambda m: [m(x) for x in calib],
                          float_outputs=True)
    x = mt.tensor(_data(5))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tm = mt.trace_module(q, x)
    flat = optimize(tm, [], flatten=True)
    fused, report = optimize(tm, "FuseQuantStub", flatten=True, return_report=True)
    assert report["FuseQuantStub"].counts == {"fusions": 1}
    fused.graph.lint()
    convs = [e.args[0].owner for e in fused.graph._exprs if e.kind == "call_method"
             and e.method == "__call__" and isinstance(e.args[0].owner, MQ.Conv2d)]
    assert type(convs[0]) is MQ.ConvRelu2d and convs[0].act_qparams is not None
    names = [type(e.args[0].owner).__name__ for e in fused.graph._exprs
             if e.kind == "call_method" and e.method == "__call__"]
    assert "ReLU" not in names and names.count("QuantStub") == 1
    # the pool's input is the stem's integers; the next conv reads the pool's
    seen = {}
    convs[1].register_forward_hook(lambda m, a, out: seen.__setitem__("in", a[0]))
    got = fused(x).numpy()
    assert is_quantized(seen["in"])
    # the fused stem rounds once fewer than the stubbed graph: its pooled
    # integers are within one of the stub's, so the next conv's float output
    # is within its weights' reach of one input step
    step = float(convs[0].act_qparams.scale.numpy())
    w = np.abs(convs[1].weight.numpy().astype(np.float64) *
               convs[1].weight_scale.numpy().reshape(-1, 1, 1, 1)).sum(axis=(1, 2, 3))
    want = flat(x).numpy()
    assert np.all(np.abs(got - want) <= (w * step).reshape(1, -1, 1, 1) + 1e-5)
    f = io.BytesIO()
    mt.save(fused, f)
    f.seek(0)
    np.testing.assert_array_equal(mt.load(f)(x).numpy(), got)


def test_fused_stem_exports_to_onnx():
    ort = pytest.importorskip("onnxruntime")
    from mgtrace.onnx import export
    mt.random.seed(3)
    calib = [mt.tensor(_data(s)) for s in (1, 2)]
    q = Q.quantize_layers(Stem(False).eval(), lambda m: [m(x) for x in calib],
                          float_outputs=True)
    x = mt.tensor(_data(5))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fused = optimize(mt.trace_module(q, x), "all", flatten=True)
    f = io.BytesIO()
    export(fused, f, opset=17)      # the pool's output carries the stem's qparams
    sess = ort.InferenceSession(f.getvalue(), providers=["CPUExecutionProvider"])
    got = sess.run(None, {sess.get_inputs()[0].name: x.numpy()})[0]
    want = fused(x).numpy()
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * np.abs(want).max())


def test_a_strided_quantized_view_pools_its_values():
    q = _qp("quint8", 0.03, 131)
    xf = (np.random.default_rng(8).standard_normal((2, 3, 9, 10)) * 3).astype(F32)
    x = quantize(mt.tensor(xf), q).transpose(0, 1, 3, 2)      # a view, not contiguous
    assert is_quantized(x) and not x.is_contiguous
    got = F.max_pool2d(x, 3, 2, 1)
    want = quantize(F.max_pool2d(dequantize(x), 3, 2, 1), q)
    np.testing.assert_array_equal(np.asarray(got.numpy()), np.asarray(want.numpy()))


@pytest.mark.parametrize("stride", [(2 ** 31 - 1, 2 ** 31 - 1), (1, 2 ** 31 - 1), (2 ** 30, 1)])
def test_a_huge_stride_pools_its_one_window(stride):
    # one window along an axis: qpool.c laid the input out in sh * sw
    # stride-phases, sized from the strides (2**31 - 1: out of memory; 2**32
    # overflowed the count and wrote past the buffer, or looped for ever)
    rng = np.random.default_rng(21)
    x = rng.integers(-128, 128, (2, 3, 5, 6)).astype(np.int8)
    got = int8.max_pool2d(x, (3, 2), stride, (1, 1), ceil_mode=True)
    ref = F.max_pool2d(mt.tensor(x.astype(F32)), (3, 2), stride, (1, 1), ceil_mode=True).numpy()
    assert got.shape == ref.shape
    np.testing.assert_array_equal(got, ref.astype(np.int8))
    np.testing.assert_array_equal(got, _numpy_pool(x, (3, 2), stride, (1, 1), (1, 1),
                                                   *got.shape[2:]))


@pytest.mark.parametrize("pool", ["max", "avg"])
def test_quantized_pools_refuse_the_float_pools_bad_geometry(pool):
    # as a float x: ints at most 2**31 - 1 (a stride of 2**32 crashed the
    # max pool; a kernel of 2**70 leaked the core's OverflowError; 2.5 and
    # True pooled as 2 and 1)
    x = quantize(mt.tensor(np.ones((1, 1, 5, 6), F32)), _qp("qint8", 0.1))
    f = F.max_pool2d if pool == "max" else F.avg_pool2d
    for kwargs in ({"kernel_size": 2, "stride": (2 ** 32, 2 ** 32)},
                   {"kernel_size": 3, "stride": 2 ** 63 - 1},
                   {"kernel_size": 2 ** 70, "padding": 2 ** 69}):
        with pytest.raises(ValueError, match="at most 2147483647"):
            f(mt.tensor(np.ones((1, 1, 5, 6), F32)), **kwargs)
        with pytest.raises(QuantizationError, match="at most 2147483647"):
            f(x, **kwargs)
    for bad in (2.5, True, (2, 2, 2)):
        with pytest.raises(TypeError, match="kernel_size"):
            f(x, bad)


def test_a_kernel_far_wider_than_its_input_pools_only_the_taps_on_it():
    # kernel 2**20 + 1, padding 2**19 over 6 columns (the float pool's legal
    # geometry): qpool.c walked every tap over every output, for minutes;
    # the taps that only ever read padding are left out (int8._taps_on_input)
    rng = np.random.default_rng(22)
    x = rng.integers(-128, 128, (2, 3, 5, 6)).astype(np.int8)
    for k, s, p in (((1, 2 ** 20 + 1), (1, 1), (0, 2 ** 19)),
                    ((2 ** 20, 3), (2 ** 19, 2), (2 ** 19, 1))):
        got = int8.max_pool2d(x, k, s, p)
        ref = F.max_pool2d(mt.tensor(x.astype(F32)), k, s, p).numpy()
        assert got.shape == ref.shape
        np.testing.assert_array_equal(got, ref.astype(np.int8))


@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
def test_trimmed_taps_keep_every_window_max(dtype):
    # kernels, paddings and dilations wide against 1-3 rows, where the taps
    # in the padding of every window are trimmed: the NumPy window max (a
    # window that dilation takes past every input: the dtype's minimum, the
    # float pool's -inf quantized)
    rng = np.random.default_rng(23)
    info = np.iinfo(dtype)
    checked = 0
    for _ in range(600):
        h, w = (int(v) for v in rng.integers(1, 4, 2))
        k = tuple(int(v) for v in rng.integers(1, 10, 2))
        s = tuple(int(v) for v in rng.integers(1, 4, 2))
        d = tuple(int(v) for v in rng.integers(1, 4, 2))
        p = tuple(int(rng.integers(0, v // 2 + 1)) for v in k)
        ceil = bool(rng.integers(2))
        try:
            want = F.max_pool2d(mt.tensor(np.zeros((1, 1, h, w), F32)), k, s, p, d, ceil)
        except ValueError:
            continue                            # an empty output
        x = rng.integers(info.min, int(info.max) + 1, (1, 2, h, w)).astype(dtype)
        got = int8.max_pool2d(x, k, s, p, d, ceil)
        assert got.shape[2:] == want.shape[2:]
        ref = np.full(got.shape, info.min, dtype)
        for i in range(got.shape[2]):
            for j in range(got.shape[3]):
                for a in range(k[0]):
                    for b in range(k[1]):
                        r, c = i * s[0] - p[0] + a * d[0], j * s[1] - p[1] + b * d[1]
                        if 0 <= r < h and 0 <= c < w:
                            ref[:, :, i, j] = np.maximum(ref[:, :, i, j], x[:, :, r, c])
        np.testing.assert_array_equal(got, ref)
        checked += 1
    assert checked > 40


def test_the_kernel_takes_any_stride_along_an_axis_of_one_window():
    # called directly (the functional layer refuses strides past 2**31 - 1 first), a stride
    # of 2**32 made qpool.c's SH * SW overflow and its copy write past the buffer (a crash):
    # one window along an axis never uses its stride
    from mgtrace._core import qint8
    x = np.arange(2 * 3 * 5 * 6, dtype=np.uint8).reshape(2, 3, 5, 6)
    out = np.zeros((2, 3, 1, 1), np.uint8)
    qint8.maxpool(x, 2, 2, 2 ** 32, 2 ** 32, 0, 0, 1, 1, out)
    np.testing.assert_array_equal(out[:, :, 0, 0], x[:, :, :2, :2].max(axis=(2, 3)))
