"""MegEngine's fused float modules (issue 13, point 6): Elemwise, ConvRelu2d,
ConvBn2d, ConvBnRelu2d and fuse_conv_bn_relu_module, against NumPy."""
import io

import numpy as np
import pytest

import mgtrace as mt
import mgtrace.module as M


def conv2d_reference(x, w, b, stride=1, padding=0):
    """Cross-correlation in NumPy, NCHW, one group."""
    x = np.pad(x, ((0, 0), (0, 0), (padding, padding), (padding, padding)))
    n, _, h, wd = x.shape
    o, _, kh, kw = w.shape
    oh, ow = (h - kh) // stride + 1, (wd - kw) // stride + 1
    out = np.zeros((n, o, oh, ow))
    for i in range(oh):
        for j in range(ow):
            patch = x[:, :, i * stride:i * stride + kh, j * stride:j * stride + kw]
            out[:, :, i, j] = np.einsum("nchw,ochw->no", patch, w)
    return out + (0 if b is None else b.reshape(1, -1, 1, 1))


def bn_eval_reference(y, bn):
    shape = (1, -1, 1, 1)
    return ((y - bn.running_mean.numpy().reshape(shape))
            / np.sqrt(bn.running_var.numpy().reshape(shape) + bn.eps)
            * bn.weight.numpy().reshape(shape) + bn.bias.numpy().reshape(shape))


def _randomised(m, rng):
    """Random parameters and statistics, so that BatchNorm does something."""
    m.load_state_dict({k: (np.abs(rng.standard_normal(v.shape)) + 0.5).astype(v.dtype)
                       if "var" in k else rng.standard_normal(v.shape).astype(v.dtype)
                       for k, v in m.state_dict().items()})
    return m


@pytest.fixture
def x():
    return np.random.default_rng(0).standard_normal((2, 3, 6, 5)).astype(np.float32)


def test_conv_relu2d_is_a_conv2d_with_relu(x):
    m = M.ConvRelu2d(3, 4, 3, stride=2, padding=1)
    assert isinstance(m, M.Conv2d) and list(m.state_dict()) == ["weight", "bias"]
    want = np.maximum(conv2d_reference(x, m.weight.numpy(), m.bias.numpy(), 2, 1), 0)
    np.testing.assert_allclose(m(mt.tensor(x)).numpy(), want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("cls, relu", [(M.ConvBn2d, False), (M.ConvBnRelu2d, True)])
def test_conv_bn_modules_against_numpy(x, cls, relu):
    m = _randomised(cls(3, 4, 3, padding=1, eps=1e-3), np.random.default_rng(1)).eval()
    assert list(m.state_dict()) == ["conv.weight", "conv.bias", "bn.weight", "bn.bias",
                                    "bn.running_mean", "bn.running_var",
                                    "bn.num_batches_tracked"]
    y = conv2d_reference(x, m.conv.weight.numpy(), m.conv.bias.numpy(), 1, 1)
    want = bn_eval_reference(y, m.bn)
    if relu:
        want = np.maximum(want, 0)
    np.testing.assert_allclose(m(mt.tensor(x)).numpy(), want, rtol=1e-4, atol=1e-4)
    # training mode: batch statistics, and the running ones move
    m.train()
    out = m(mt.tensor(x)).numpy()
    mean, var = y.mean(axis=(0, 2, 3)), y.var(axis=(0, 2, 3))
    norm = (y - mean.reshape(1, -1, 1, 1)) / np.sqrt(var.reshape(1, -1, 1, 1) + 1e-3)
    norm = norm * m.bn.weight.numpy().reshape(1, -1, 1, 1) + m.bn.bias.numpy().reshape(1, -1, 1, 1)
    np.testing.assert_allclose(out, np.maximum(norm, 0) if relu else norm, rtol=1e-4, atol=1e-4)
    assert m.bn.num_batches_tracked.item() == 1 and m.mutates_state


@pytest.mark.parametrize("with_bn, with_relu", [(True, True), (True, False), (False, True)])
def test_fuse_in_eval_mode_folds_batch_norm(x, with_bn, with_relu):
    rng = np.random.default_rng(2)
    conv = _randomised(M.Conv2d(3, 4, 3, padding=1, bias=False), rng).eval()
    bn = _randomised(M.BatchNorm2d(4), rng).eval() if with_bn else None
    relu = M.ReLU().eval() if with_relu else None
    fused = M.fuse_conv_bn_relu_module(conv, bn, relu)
    assert type(fused) is (M.ConvRelu2d if with_relu else M.Conv2d)
    assert not fused.training
    want = conv2d_reference(x, conv.weight.numpy(), None, 1, 1)
    if with_bn:
        want = bn_eval_reference(want, bn)
        assert fused.bias is not None
    if with_relu:
        want = np.maximum(want, 0)
    np.testing.assert_allclose(fused(mt.tensor(x)).numpy(), want, rtol=1e-4, atol=1e-4)


def test_fuse_in_training_mode_keeps_batch_norm(x):
    conv, bn = M.Conv2d(3, 4, 3), M.BatchNorm2d(4)
    fused = M.fuse_conv_bn_relu_module(conv, bn, M.ReLU())
    assert type(fused) is M.ConvBnRelu2d and fused.training
    assert fused.bn is not bn
    np.testing.assert_array_equal(fused.conv.weight.numpy(), conv.weight.numpy())
    with pytest.raises(ValueError, match="same mode"):
        M.fuse_conv_bn_relu_module(conv, bn.eval())
    with pytest.raises(ValueError, match="give bn and/or relu"):
        M.fuse_conv_bn_relu_module(conv)
    with pytest.raises(TypeError, match="conv must be"):
        M.fuse_conv_bn_relu_module(M.Linear(2, 2), bn)


ELEMWISE = [
    ("add", 2, np.add), ("SUB", 2, np.subtract), ("mul", 2, np.multiply),
    ("true_div", 2, np.divide), ("max", 2, np.maximum), ("min", 2, np.minimum),
    ("relu", 1, lambda a: np.maximum(a, 0)), ("exp", 1, np.exp), ("tanh", 1, np.tanh),
    ("fuse_add_relu", 2, lambda a, b: np.maximum(a + b, 0)),
    ("fuse_add_sigmoid", 2, lambda a, b: 1 / (1 + np.exp(-(a + b)))),
    ("fuse_mul_add3", 3, lambda a, b, c: a * b + c),
    ("fuse_mul_add4", 4, lambda a, b, c, d: a * b + c * d),
    ("h_swish", 1, lambda a: a * np.clip(a + 3, 0, 6) / 6),
    ("switch_gt0", 2, lambda a, b: np.where(a > 0, b, 0)),
]


@pytest.mark.parametrize("method, n, ref", ELEMWISE, ids=[e[0] for e in ELEMWISE])
def test_elemwise_against_numpy(method, n, ref):
    rng = np.random.default_rng(3)
    args = [rng.standard_normal((2, 3)).astype(np.float32) + (3.0 if method == "true_div" else 0)
            for _ in range(n)]
    got = M.Elemwise(method)(*[mt.tensor(a) for a in args])
    np.testing.assert_allclose(got.numpy(), ref(*args), rtol=1e-5, atol=1e-6)


def test_elemwise_config_and_errors():
    assert M.Elemwise("ADD").config() == {"method": "ADD"} and repr(M.Elemwise("add")) == "Elemwise('add')"
    with pytest.raises(ValueError, match="method must be one of"):
        M.Elemwise("fuse_everything")


def test_fused_modules_trace_and_save_as_format_1_1(x):
    class Net(M.Module):
        def __init__(self):
            super().__init__()
            self.cbr = M.ConvBnRelu2d(3, 4, 3, padding=1)
            self.add = M.Elemwise("fuse_add_relu")

        def forward(self, t):
            y = self.cbr(t)
            return self.add(y, y)
    net = _randomised(Net(), np.random.default_rng(4)).eval()
    tm = mt.trace_module(net, mt.tensor(x))
    assert tm.graph.get_module_by_type(M.ConvBnRelu2d).as_count() == 1      # a leaf
    buf = io.BytesIO()
    mt.save(tm, buf)
    loaded = mt.load(io.BytesIO(buf.getvalue()))
    assert not loaded.cbr.training and not loaded.cbr.bn.training
    np.testing.assert_array_equal(loaded(mt.tensor(x)).numpy(), net(mt.tensor(x)).numpy())
    with pytest.raises(ValueError, match="module type 'mgtrace.module.ConvBnRelu2d' is new since "
                                         "format 1.0"):
        mt.save(tm, io.BytesIO(), target_version=(1, 0))
