"""Every gradient rule against PyTorch's autograd: the finite-difference
cases of test_rules_fd.py (same functions, shapes and seeded values) with
each one's PyTorch counterpart written out below, in float64; the gradient
of sum(y * w) for a random w must agree to 1e-10 of its scale. Skips
without torch. An op with no PyTorch counterpart is listed in NO_TORCH with
the reason (the finite differences still check it)."""
import numpy as np
import pytest

from mgtrace.autodiff import GradManager
from mgtrace.autodiff.rules import RULES
import mgtrace as mt

from .test_rules_fd import CASES, EXTRA, FLOAT32_ONLY, _values

torch = pytest.importorskip("torch")
tF = torch.nn.functional


def _cumprod_flat(x):
    return torch.cumprod(x.reshape(-1), 0)


def _pad(x, pw, mode):
    """np.pad's (before, after) pairs, first axis first, in torch's F.pad:
    the padded trailing axes after a batch and a channel axis (the unpadded
    leading axes folded into the channels), pads listed last axis first."""
    first = next(i for i, p in enumerate(pw) if p != (0, 0))
    spatial = tuple(x.shape[first:])
    y = x.reshape((1, int(np.prod(x.shape[:first], dtype=int))) + spatial)
    y = tF.pad(y, [v for pair in reversed(pw[first:]) for v in pair], mode=mode)
    return y.reshape(tuple(x.shape[:first]) + tuple(y.shape[2:]))


def _setitem(x, v):
    y = x * 1.0
    y[1, 1:3] = v * 2.0
    return y


# op name -> the case's function in PyTorch (same argument order)
TORCH = {
    "neg": lambda x: -x, "abs": torch.abs, "square": torch.square, "exp": torch.exp,
    "expm1": torch.expm1, "log": torch.log, "log1p": torch.log1p, "log2": torch.log2,
    "sqrt": torch.sqrt, "rsqrt": torch.rsqrt, "sin": torch.sin, "cos": torch.cos, "tan": torch.tan,
    "tanh": torch.tanh, "erf": torch.erf, "asin": torch.asin, "acos": torch.acos, "atan": torch.atan,
    "relu": torch.relu, "relu6": tF.relu6, "sigmoid": torch.sigmoid, "softplus": tF.softplus,
    "silu": tF.silu, "gelu": tF.gelu, "gelu_tanh": lambda x: tF.gelu(x, approximate="tanh"),
    "hardswish": tF.hardswish, "hardsigmoid": tF.hardsigmoid, "sign": torch.sign,
    "round": torch.round, "floor": torch.floor, "ceil": torch.ceil, "trunc": torch.trunc,
    "add": lambda x, y: x + y, "sub": lambda x, y: x - y, "mul": lambda x, y: x * y,
    "truediv": lambda x, y: x / y, "pow": lambda x, y: x ** y, "maximum": torch.maximum,
    "minimum": torch.minimum, "atan2": torch.atan2,
    "floordiv": lambda x, y: torch.floor(x / y),       # torch has no floor_divide derivative
    "mod": lambda x, y: torch.remainder(x, y),
    "where": lambda x, y: torch.where(x > y, x, y),
    "clip": lambda x, lo, hi: torch.clamp(x, lo, hi),
    "astype": lambda x: x.float().double() * 1.0,
    "reshape": lambda x: x.reshape(4, 3) * torch.arange(12.0, dtype=torch.float64).reshape(4, 3),
    "transpose": lambda x: x.permute(2, 0, 1), "expand_dims": lambda x: x[None, :, None],
    "squeeze": lambda x: x.squeeze(1), "broadcast_to": lambda x: x.expand(2, 3, 4),
    # mgtrace's case moves to a second CPU device and back; PyTorch has one CPU
    "to": lambda x: x.to("cpu") * 2,
    "sum": lambda x: x.sum(1), "mean": lambda x: x.mean((0, 2), keepdim=True),
    "prod": lambda x: x.prod(1), "max": lambda x: x.amax(0), "min": lambda x: x.amin(),
    "var": lambda x: x.var(1, correction=1), "std": lambda x: x.std((0, 1), correction=0),
    "softmax": lambda x: torch.softmax(x, 1), "log_softmax": lambda x: torch.log_softmax(x, -1),
    "cumsum": lambda x: torch.cumsum(x, 1), "cumprod": lambda x: torch.cumprod(x, 1),
    "sort": lambda x: torch.sort(x, descending=True)[0],
    "topk": lambda x: torch.topk(x, 2)[0],
    "getitem": lambda x: x[1:][:, [0, 2, 0]], "setitem": _setitem,
    "gather": lambda x: torch.gather(x, 1, torch.tensor([[0, 0, 2], [1, 3, 3], [2, 1, 0]])),
    "scatter": lambda x, s: x.scatter(1, torch.tensor([[0, 2], [1, 3], [3, 0]]), s),
    "embedding": lambda w: tF.embedding(torch.tensor([[0, 2, 2], [4, 1, 0]]), w),
    "concat": lambda x, y: torch.cat([x, y, x], 1), "stack": lambda x, y: torch.stack([x, y], 1),
    "split": lambda x: x[:, :1] * 2 + x[:, 3:].sum(),
    "matmul": torch.matmul,
    "conv2d": lambda x, w, b: tF.conv2d(x, w, b, stride=2, padding=(1, 0), dilation=(1, 2)),
    "conv_transpose2d": lambda x, w, b: tF.conv_transpose2d(x, w, b, stride=2, padding=1, output_padding=1),
    "max_pool2d": lambda x: tF.max_pool2d(x, 3, 2, 1),
    # MegEngine's default mode: padding not counted
    "avg_pool2d": lambda x: tF.avg_pool2d(x, 3, 2, 1, count_include_pad=False),
    "adaptive_avg_pool2d": lambda x: tF.adaptive_avg_pool2d(x, (3, 2)),
    "adaptive_max_pool2d": lambda x: tF.adaptive_max_pool2d(x, (3, 2)),
    "interpolate": lambda x: tF.interpolate(x, size=(5, 7), mode="bilinear", align_corners=False),
    "pad": lambda x: _pad(x, ((0, 0), (1, 2), (2, 0)), "constant"),
    "attention": lambda q, k, v, m: tF.scaled_dot_product_attention(q, k, v, m, scale=0.5),
    "conv2d_act": lambda x, w, b, r: tF.silu(tF.conv2d(x, w, b, padding=1) + r),
    "conv3d": lambda x, w, b: tF.conv3d(x, w, b, stride=(1, 2, 1), padding=(1, 0, 1), dilation=(2, 1, 1)),
    "conv_transpose3d": lambda x, w, b: tF.conv_transpose3d(x, w, b, stride=2, padding=1, output_padding=1),
    # torch's own cells, their input weights the identity (gx is the input's share)
    "lstm_cell": lambda gx, h, c, w, b: torch.cat(torch.lstm_cell(
        gx, (h, c), torch.eye(12, dtype=gx.dtype), w, None, b), 1),
    "rnn_cell": lambda gx, h, w, b: torch.rnn_tanh_cell(gx, h, torch.eye(4, dtype=gx.dtype), w, None, b),
    # EXTRA
    "matmul_vec": torch.matmul, "matmul_vec2": torch.matmul,
    "getitem_basic": lambda x: x[::2, 1], "sum_all": lambda x: x.sum(),
    "conv2d_groups": lambda x, w: tF.conv2d(x, w, None, padding=1, groups=2),
    "conv2d_depthwise": lambda x, w, b: tF.conv2d(x, w, b, stride=2, padding=1, groups=3),
    "conv_transpose2d_groups": lambda x, w: tF.conv_transpose2d(x, w, None, stride=2, groups=2, dilation=2),
    "max_pool2d_ceil": lambda x: tF.max_pool2d(x, 2, 2, ceil_mode=True),
    "avg_pool2d_exclude": lambda x: tF.avg_pool2d(x, 3, 2, 1, count_include_pad=False),
    "avg_pool2d_include": lambda x: tF.avg_pool2d(x, 2, 2, 1),
    "interpolate_nearest": lambda x: tF.interpolate(x, scale_factor=2, mode="nearest"),
    "interpolate_corners": lambda x: tF.interpolate(x, size=(4, 3), mode="bilinear", align_corners=True),
    "layer_norm": lambda x, w, b: tF.layer_norm(x, (3, 4), w, b),
    "batch_norm_train": lambda x, w, b: tF.batch_norm(x, None, None, w, b, training=True),
    "group_norm": lambda x, w, b: tF.group_norm(x, 2, w, b),
    "linear_act": lambda x, w, b: tF.gelu(tF.linear(x, w, b)),
    "linear_add_layer_norm": lambda x, w, b, r, g: tF.layer_norm(tF.linear(x, w, b) + r, (5,), g, b * 0.5),
    "dropout_eval": lambda x: x,
    "cross_entropy": lambda x: tF.cross_entropy(x, torch.tensor([0, 2, 1]), label_smoothing=0.1),
    "smooth_l1_loss": lambda x: tF.smooth_l1_loss(x, torch.zeros(3, 4, dtype=torch.float64), reduction="sum"),
    "cumprod_zeros": lambda x: torch.cumprod(x * torch.tensor([1.0, 0.0, 1.0, 0.0, 1.0], dtype=x.dtype), 1),
    "cumprod_flat": _cumprod_flat,
    "prod_zeros": lambda x: (x * torch.tensor([[1.0, 0.0, 1.0], [0.0, 0.0, 1.0]], dtype=x.dtype)).prod(1),
    "sort_axis0": lambda x: torch.sort(x, 0)[0],
    "topk_smallest": lambda x: torch.topk(x, 3, 0, largest=False)[0],
    "conv2d_act_relu": lambda x, w: torch.relu(tF.conv2d(x, w, None, stride=2)),
    "conv2d_act_gelu_groups": lambda x, w, b: tF.gelu(tF.conv2d(x, w, b, padding=1, groups=2)),
    "pad_reflect": lambda x: _pad(x, ((0, 0), (2, 1), (1, 3)), "reflect"),
    "pad_replicate": lambda x: _pad(x, ((1, 0), (2, 3)), "replicate"),
    "pad_circular": lambda x: _pad(x, ((0, 0), (3, 2)), "circular"),
    "getitem_mask": lambda x: x[torch.tensor([[True, False, True], [False, True, True]])] * 2.0,
    "getitem_rows": lambda x: x[torch.tensor([[2, 0], [2, -1]])],
    "getitem_repeat": lambda x: x[[2, 0, 2, 2], 1:],
    "embedding_repeat": lambda w: tF.embedding(torch.tensor([3, 3, 1, 0, 3]), w),
    "max_pool2d_dilated": lambda x: tF.max_pool2d(x, (2, 3), (1, 2), (1, 1), (2, 1)),
    "adaptive_max_uneven": lambda x: tF.adaptive_max_pool2d(x, (4, 3)),
    "interpolate_nearest_odd": lambda x: tF.interpolate(x, size=(5, 3), mode="nearest"),
}

# cases whose function has no one-call PyTorch counterpart (finite
# differences check them): in-place ops on a view chain, a loss written on
# two tensors with MegEngine's clamped log
NO_TORCH = {"inplace_add", "inplace_mul", "binary_cross_entropy"}
# PyTorch's own rounding: its hardsigmoid backward multiplies by 1/6 in
# float32 (``1.0f / 6.0f``) even for float64, 3e-8 relative
TOL = {"hardsigmoid": 1e-7}


def test_every_rule_has_a_torch_case():
    assert sorted(set(RULES) - set(TORCH) - FLOAT32_ONLY) == []
    assert sorted(set(CASES) | set(EXTRA)) == sorted(set(TORCH) | NO_TORCH)


@pytest.mark.parametrize("name", sorted(TORCH))
def test_gradient_matches_pytorch(name):
    fn, specs = CASES[name] if name in CASES else EXTRA[name]
    rng = np.random.default_rng(sum(map(ord, name)))
    arrays = [_values(shape, spec, rng) for shape, spec in specs]
    ts = [mt.tensor(a) for a in arrays]
    gm = GradManager().attach(ts)
    with gm:
        y = fn(*ts)
        w = rng.uniform(-1, 1, y.shape)
        gm.backward((y * mt.tensor(w)).sum())
    tt = [torch.tensor(a, requires_grad=True) for a in arrays]
    yt = TORCH[name](*tt)
    np.testing.assert_allclose(y.numpy(), yt.detach().numpy(), rtol=1e-10, atol=1e-12, err_msg="forward")
    (yt * torch.tensor(w)).sum().backward()
    for k, (t, r) in enumerate(zip(ts, tt)):
        want = r.grad.numpy() if r.grad is not None else np.zeros(arrays[k].shape)
        scale = max(np.abs(want).max(), 1e-12)
        np.testing.assert_allclose(t.grad.numpy(), want, rtol=0, atol=TOL.get(name, 1e-10) * scale, err_msg=f"input {k}")
