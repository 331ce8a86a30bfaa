"""Shape-derived numbers: arithmetic stays live (ints and floats), and every
use the trace cannot follow warns at the user's line."""
import builtins
import io
import math
import warnings

import numpy as np
import pytest

import mgtrace as mt
import mgtrace.functional as F
import mgtrace.module as M
from mgtrace.traced_module import TraceWarning


def x_of(*shape, seed=0):
    return mt.tensor(np.random.default_rng(seed).random(shape, np.float32))


class Scaled(M.Module):
    def forward(self, x):
        b, c, h, w = x.shape
        y = x / (h * w) ** 0.5 + h / w - abs(h - 20) + 2 ** (w // 3)
        return y.reshape(b, -1)


def test_float_and_power_arithmetic_on_shapes_stays_live():
    with warnings.catch_warnings():
        warnings.simplefilter("error", TraceWarning)        # nothing here is fixed
        tm = mt.trace_module(Scaled(), x_of(1, 1, 4, 4))
    for shape in [(1, 1, 4, 4), (2, 1, 9, 7), (3, 2, 5, 11)]:
        x = x_of(*shape, seed=1)
        np.testing.assert_allclose(tm(x).numpy(), Scaled()(x).numpy(), rtol=1e-6)
    buf = io.BytesIO()
    mt.save(tm, buf)
    x = x_of(2, 1, 9, 7, seed=2)
    np.testing.assert_allclose(mt.load(io.BytesIO(buf.getvalue()))(x).numpy(),
                               Scaled()(x).numpy(), rtol=1e-6)
    assert "** 0.5" in tm.code and "abs(" in tm.code


@pytest.mark.parametrize("body,what", [
    ("if h > 5: x = x + 1", "comparing (>)"),
    ("x = x[:, :, : int(h / 2)]", "int()"),
    ("x = x * math.sqrt(h)", "float()"),
    ("x = x - x.mean().item()", "item()"),
    ("x = x * len(x)", "len(t)"),
    ("x = F.stack([r * 2 for r in x])", "iterating"),
    ("x = x * x.numpy()[0, 0, 0, 0]", "numpy()"),
    ("x = F.concat([x[i:i + 1] for i in range(b)], 0)", "range()"),
    ("x = x[:, :, :, :1] * mt.tensor([2.0] * w)", "repeating a list"),
    ("x = x * 0 + x.nbytes", "t.nbytes"),
    ("x = x * 0 + x.strides[0]", "t.strides"),
])
def test_uses_the_trace_cannot_follow_warn_at_the_user_line(body, what):
    ns = {"math": math, "F": F, "mt": mt}
    src = "def forward(self, x):\n    b, c, h, w = x.shape\n    " + body + "\n    return x\n"
    exec(compile(src, "user_model.py", "exec"), ns)
    Net = type("Net", (M.Module,), {"forward": ns["forward"]})
    with pytest.warns(TraceWarning) as rec:
        mt.trace_module(Net(), x_of(1, 1, 4, 4))
    msgs = [str(w.message) for w in rec if issubclass(w.category, TraceWarning)]
    assert any(what in m and "user_model.py:3" in m for m in msgs), msgs
    assert len(msgs) == 1, msgs                          # once per line


def test_mgtrace_models_trace_without_warnings():
    from mgtrace.models import minilm_inputs, minilm_l6_v2, resnet18
    with warnings.catch_warnings():
        warnings.simplefilter("error", TraceWarning)
        mt.trace_module(resnet18(num_classes=10).eval(), x_of(1, 3, 32, 32))
        mt.trace_module(minilm_l6_v2(), *minilm_inputs(["a short sentence", "another"]))


def test_a_numpy_array_argument_is_refused_with_the_fix():
    class N(M.Module):
        def forward(self, x):
            return x * 2
    with pytest.raises(TypeError, match=r"argument 'x' holds a numpy.ndarray \(2, 2\).*mgtrace.tensor"):
        mt.trace_module(N(), np.ones((2, 2), np.float32))


@pytest.mark.parametrize("bad", [lambda: mt.tensor([1.0]), lambda: 3, lambda: []])
def test_reset_outputs_refuses_what_is_not_a_node(bad):
    from mgtrace.traced_module import GraphError

    class N(M.Module):
        def forward(self, x):
            return x * 2
    tm = mt.trace_module(N(), mt.tensor([1.0]))
    with pytest.raises(GraphError, match="reset_outputs takes Nodes"):
        tm.graph.reset_outputs(bad())
    tm.graph.lint()
    np.testing.assert_array_equal(tm(mt.tensor([3.0])).numpy(), [6.0])   # unchanged


class _Scale(M.Module):
    def forward(self, x):
        return x.shape[-1] ** -0.5


class _Inner(M.Module):
    def forward(self, x, k):
        return x * k


class _Outer(M.Module):
    def __init__(self):
        super().__init__()
        self.sc, self.inner = _Scale(), _Inner()

    def forward(self, x):
        h = x.shape[-1]
        pad = ((h + 3) & ~3) - h                        # bitwise: pad to a multiple of 4
        y = F.pad(x, ((0, 0), (0, pad))) * (h * np.float32(0.5))
        return self.inner(y * self.sc(x), h ** -0.5), h / 2


def test_floats_cross_module_boundaries_and_bitwise_numpy_operands_stay_live():
    with warnings.catch_warnings():
        warnings.simplefilter("error", TraceWarning)
        tm = mt.trace_module(_Outer(), x_of(1, 4))
    buf = io.BytesIO()
    mt.save(tm, buf)
    loaded = mt.load(io.BytesIO(buf.getvalue()))
    for m in (tm, loaded):
        x = x_of(2, 9, seed=4)
        got, want = m(x), _Outer()(x)
        np.testing.assert_allclose(got[0].numpy(), want[0].numpy(), rtol=1e-6)
        assert got[1] == 4.5 and type(got[1]) is float


def test_floor_and_ceil_warn_and_str_is_the_plain_number():
    class C(M.Module):
        def forward(self, x):
            h = x.shape[-1]
            assert f"{h}" == "4" and str(h / 2) == "2.0"
            return x[..., :math.ceil(h / 2)]
    with pytest.warns(TraceWarning, match=r"math.ceil\(\)"):
        mt.trace_module(C(), x_of(1, 4))


def test_warnings_from_inside_numpy_point_at_the_user_line():
    class P(M.Module):
        def forward(self, x):
            return x.reshape(x.shape[0], int(np.prod(x.shape[1:])))
    with pytest.warns(TraceWarning) as rec:
        mt.trace_module(P(), x_of(1, 2, 3))
    assert all("test_trace_symbolic_numbers.py" in str(w.message) for w in rec
               if issubclass(w.category, TraceWarning))


class PerSample(M.Module):
    """A per-sample loop: ``range`` of the batch size fixes it."""
    def forward(self, x):
        return F.stack([x[i] * (i + 1) for i in range(x.shape[0])])


def test_a_per_sample_loop_traced_at_batch_1_warns_at_the_range_line():
    with pytest.warns(TraceWarning, match=r"range\(\) of a shape-derived number \(1\) at "
                                          r".*test_trace_symbolic_numbers.py:\d+") as rec:
        tm = mt.trace_module(PerSample(), x_of(1, 3))
    assert rec[0].filename == __file__           # attributed to the user's line, not mgtrace's
    # the fixed count shows as batch-1 outputs at batch 5: what the warning says
    assert tm(x_of(5, 3)).shape == (1, 3)
    assert isinstance(range(2), range) and issubclass(type(range(2)), range)


def test_range_outside_a_trace_and_on_plain_ints_does_not_warn():
    class Loop(M.Module):
        def forward(self, x):
            return F.stack([x * i for i in range(3)]) + len(range(x.ndim))

    with warnings.catch_warnings():
        warnings.simplefilter("error", TraceWarning)
        tm = mt.trace_module(Loop(), x_of(2, 2))
    x = x_of(4, 2, seed=3)
    np.testing.assert_allclose(tm(x).numpy(), np.stack([x.numpy() * i for i in range(3)]) + 2)
    assert type(builtins.range) is type          # the trace put the real range back


def test_a_shape_number_on_the_left_of_a_tensor_stays_live():
    class AddBatch(M.Module):
        def forward(self, x):
            return x.shape[0] + x * x.shape[1]

    with warnings.catch_warnings():
        warnings.simplefilter("error", TraceWarning)
        tm = mt.trace_module(AddBatch(), x_of(1, 2))
    x = x_of(5, 3, seed=4)
    np.testing.assert_allclose(tm(x).numpy(), 5 + x.numpy() * 3, rtol=1e-6)
