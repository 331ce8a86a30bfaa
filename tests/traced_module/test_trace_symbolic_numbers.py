"""Shape-derived numbers: arithmetic stays live (ints and floats), and every
use the trace cannot follow warns at the user's line."""
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
])
def test_uses_the_trace_cannot_follow_warn_at_the_user_line(body, what):
    ns = {"math": math, "F": F}
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
        mt.trace_module(resnet18(num_classes=10), x_of(1, 3, 32, 32))
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
