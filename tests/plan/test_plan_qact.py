"""A float32 ReLU6 after an int8 layer's float32 output folds into the
layer's plan step (mgtrace/plan/_qact.py): the plan has no ReLU6 step and
its bits are the module's; it does not fold where the layer's own output is
read elsewhere or is a plan output."""
import numpy as np
import pytest

import mgtrace as mt
import mgtrace.functional as F
import mgtrace.module as M
import mgtrace.quantization as Q


def rand(*shape, seed=0, scale=3.0):
    return mt.tensor((np.random.default_rng(seed).standard_normal(shape) * scale)
                     .astype(np.float32))


class ConvRelu6(M.Module):
    """MobileNetV2's last conv and its ReLU6; ``also``: the conv's output
    returned too, ``also_relu6``: the ReLU6's."""

    def __init__(self, linear=False, depthwise=False, also=False, also_relu6=False):
        super().__init__()
        if linear:
            self.layer = M.Linear(24, 40)
        elif depthwise:
            self.layer = M.Conv2d(24, 24, 3, 1, 1, groups=24)
        else:
            self.layer = M.Conv2d(24, 40, 1)
        w = self.layer.weight
        w[...] = np.random.default_rng(7).standard_normal(w.shape).astype(np.float32)
        self.also, self.also_relu6 = also, also_relu6

    def forward(self, x):
        y = self.layer(x)
        z = F.relu6(y)
        if self.also:
            return z, y
        return (z, z * 2) if self.also_relu6 else z * 1.0


def _quantized(net, x):
    # every conv / linear int8 with a float32 output (the int8 benchmarks' setup)
    qm = Q.quantize_layers(net, lambda m: m(x), float_outputs=True)
    return mt.trace_module(qm, x)


def _steps(plan, x):
    return [w for k, w, _ in plan.profile(x) if k == "kernel"]


@pytest.mark.parametrize("kind", ["conv", "depthwise", "linear"])
@pytest.mark.parametrize("threads", [1, 2])
def test_relu6_folds_into_the_int8_layer_bitwise(kind, threads):
    shape = (2, 9, 24) if kind == "linear" else (2, 24, 9, 11)
    x = rand(*shape, seed=1)
    tm = _quantized(ConvRelu6(linear=kind == "linear", depthwise=kind == "depthwise"), x)
    old = mt.get_num_threads()
    mt.set_num_threads(threads)
    try:
        plan = mt.compile(tm, x)
        steps = _steps(plan, x)
        assert not any("relu6: elementwise" in w for w in steps), steps
        assert any(w.endswith("relu6: int8 " + ("gemm" if kind == "linear" else
                                                  "dwconv" if kind == "depthwise" else "conv"))
                   for w in steps), steps
        for seed in (1, 2, 3):
            x = rand(*shape, seed=seed)
            want = tm(x).numpy()
            got = plan(x).numpy()
            assert got.tobytes() == want.tobytes()
            assert (want == 6).any() and (want == 0).any()     # both ends clamp
    finally:
        mt.set_num_threads(old)


def test_relu6_stays_apart_where_the_layer_output_is_read_elsewhere():
    x = rand(2, 24, 9, 11, seed=1)
    tm = _quantized(ConvRelu6(also=True), x)
    plan = mt.compile(tm, x)
    assert any("relu6: elementwise" in w for w in _steps(plan, x))
    for got, want in zip(plan(x), tm(x)):
        assert got.numpy().tobytes() == want.numpy().tobytes()


def test_a_relu6_whose_output_is_returned_still_folds():
    x = rand(2, 24, 9, 11, seed=1)
    tm = _quantized(ConvRelu6(also_relu6=True), x)
    plan = mt.compile(tm, x)
    assert not any("relu6: elementwise" in w for w in _steps(plan, x))
    for got, want in zip(plan(x), tm(x)):
        assert got.numpy().tobytes() == want.numpy().tobytes()
