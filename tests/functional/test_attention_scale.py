"""F.attention's scale: a Python number, a NumPy scalar, or a 0-d NumPy
array or 0-d Tensor (a scale computed with NumPy or mgtrace), read once as
a float. A 0-d array or Tensor used to be refused ("scale must be a real
number, got ndarray"); an array or Tensor that is not 0-d, an inf or nan
scale, a bool or complex one now get an error naming scale. Reference: the
softmax attention in float64 NumPy."""
import numpy as np
import pytest

import mgtrace as mt
import mgtrace.functional as F
import mgtrace.module as M
from mgtrace.autodiff import GradManager


def _ref(q, k, v, mask, scale):
    s = np.einsum("bhqd,bhkd->bhqk", q.astype(np.float64), k.astype(np.float64)) * scale
    if mask is not None:
        s = s + mask
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return np.einsum("bhqk,bhkd->bhqd", p, v.astype(np.float64))


def _operands(seed=0):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((2, 3, 5, 8)).astype(np.float32)
    k = rng.standard_normal((2, 3, 7, 8)).astype(np.float32)
    v = rng.standard_normal((2, 3, 7, 4)).astype(np.float32)
    mask = np.where(rng.random((2, 1, 1, 7)) < 0.3, -1e4, 0.0).astype(np.float32)
    return q, k, v, mask


SCALES = {
    "float": lambda s: s,
    "numpy float32": lambda s: np.float32(s),
    "0-d array float64": lambda s: np.array(s),
    "0-d array float32": lambda s: np.array(s, np.float32),
    "0-d Tensor float32": lambda s: mt.tensor(np.float32(s)),
    "0-d Tensor float64": lambda s: mt.tensor(np.array(s)),
}


@pytest.mark.parametrize("form", list(SCALES))
@pytest.mark.parametrize("with_mask", [False, True])
def test_each_form_of_scale_gives_the_reference(form, with_mask):
    q, k, v, mask = _operands()
    m = mask if with_mask else None
    s = 1 / np.sqrt(8.0)
    scale = SCALES[form](s)
    want = _ref(q, k, v, m, float(np.float32(s)) if "32" in form else s)
    got = F.attention(mt.tensor(q), mt.tensor(k), mt.tensor(v),
                      None if m is None else mt.tensor(m), scale=scale)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-6)


def test_an_integer_0d_scale_and_an_integer_tensor():
    q, k, v, _ = _operands(1)
    for scale in (np.array(2), mt.tensor(2), np.int64(2), 2):
        got = F.attention(mt.tensor(q), mt.tensor(k), mt.tensor(v), scale=scale)
        np.testing.assert_allclose(got.numpy(), _ref(q, k, v, None, 2.0), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("scale, error, words", [
    (np.array([0.5]), ValueError, "scale must be a number or a 0-d array or Tensor, got a ndarray of shape (1,)"),
    (np.full((2, 2), 0.5), ValueError, "shape (2, 2)"),
    (mt.tensor([0.5, 0.5]), ValueError, "got a Tensor of shape (2,)"),
    (np.array(np.inf), ValueError, "scale must be finite, got inf"),
    (mt.tensor(np.float32(np.nan)), ValueError, "scale must be finite, got nan"),
    (float("-inf"), ValueError, "scale must be finite, got -inf"),
    (np.array(True), TypeError, "dtype bool"),
    (mt.tensor(True), TypeError, "dtype bool"),
    (np.array(0.5 + 1j), TypeError, "dtype complex128"),
    (True, TypeError, "scale must be a real number, got bool"),
    ("0.5", TypeError, "scale must be a real number, got str"),
])
def test_a_bad_scale_is_refused_naming_it(scale, error, words):
    q = mt.tensor(_operands()[0])
    with pytest.raises(error, match="attention: ") as e:
        F.attention(q, q, q, scale=scale)
    assert words in str(e.value)


def test_a_0d_tensor_scale_under_a_grad_manager_is_the_float_path():
    """The recorded path (the training kernel and its saved probabilities)
    reads the scale the same way: gradients equal the float scale's."""
    q, k, v, mask = _operands(2)
    gy = np.random.default_rng(3).standard_normal((2, 3, 5, 4)).astype(np.float32)
    grads = []
    for scale in (0.25, mt.tensor(np.float32(0.25)), np.array(0.25)):
        ts = [mt.tensor(a) for a in (q, k, v)]
        gm = GradManager().attach(ts)
        with gm:
            out = F.attention(*ts, mt.tensor(mask), scale=scale)
            gm.backward((out * mt.tensor(gy)).sum())
        np.testing.assert_allclose(out.numpy(), _ref(q, k, v, mask, 0.25), rtol=1e-5, atol=1e-6)
        grads.append([t.grad.numpy() for t in ts])
    for g in grads[1:]:
        for a, b in zip(g, grads[0]):
            np.testing.assert_array_equal(a, b)


class Attn(M.Module):
    def forward(self, q, k, v):
        return F.attention(q, k, v, scale=np.array(0.5, np.float32))


def test_a_traced_0d_array_scale_runs_from_the_graph():
    q, k, v, _ = _operands(4)
    tm = mt.trace_module(Attn(), mt.tensor(q), mt.tensor(k), mt.tensor(v))
    q2, k2, v2, _ = _operands(5)
    got = tm(mt.tensor(q2), mt.tensor(k2), mt.tensor(v2))
    np.testing.assert_allclose(got.numpy(), _ref(q2, k2, v2, None, 0.5), rtol=1e-5, atol=1e-6)


class BufferScale(M.Module):
    def __init__(self):
        super().__init__()
        self.s = mt.tensor(np.float32(0.5))

    def forward(self, q, k, v):
        return F.attention(q, k, v, scale=self.s)


def test_a_traced_buffer_scale_is_read_on_each_call():
    q, k, v, _ = _operands(6)
    ts = [mt.tensor(a) for a in (q, k, v)]
    tm = mt.trace_module(BufferScale(), *ts)
    np.testing.assert_allclose(tm(*ts).numpy(), _ref(q, k, v, None, 0.5), rtol=1e-5, atol=1e-6)
    tm.s[...] = 0.25
    np.testing.assert_allclose(tm(*ts).numpy(), _ref(q, k, v, None, 0.25), rtol=1e-5, atol=1e-6)


def test_a_scale_tensor_that_wants_a_gradient_is_refused_not_dropped():
    """A learnable temperature: a 0-d Tensor attached to the manager. The
    scale is read as a number, so its gradient was dropped without a word
    (s.grad stayed None while q got one); now AutodiffError says how to
    learn it. Scaling q instead gives s its gradient, which equals the
    finite difference of the loss in s."""
    from mgtrace.errors import AutodiffError
    q, k, v, _ = _operands(7)
    s = mt.tensor(np.float32(0.5))
    tq = mt.tensor(q)
    gm = GradManager().attach([s, tq])
    with pytest.raises(AutodiffError, match="scale q instead"):
        with gm:
            F.attention(tq, mt.tensor(k), mt.tensor(v), scale=s)
    with gm:                        # detached: a constant, as a float
        out = F.attention(tq, mt.tensor(k), mt.tensor(v), scale=s.detach())
        gm.backward(out.sum())
    np.testing.assert_allclose(out.numpy(), _ref(q, k, v, None, 0.5), rtol=1e-5, atol=1e-6)
    assert tq.grad is not None and s.grad is None
    gy = np.random.default_rng(8).standard_normal(out.shape).astype(np.float32)
    with gm:                        # the suggested form: the gradient reaches s
        out = F.attention(tq * s, mt.tensor(k), mt.tensor(v))
        gm.backward((out * mt.tensor(gy)).sum())
    q64, k64, v64 = (a.astype(np.float64) for a in (q, k, v))

    def loss(sc):
        return float((_ref(q64, k64, v64, None, sc) * gy).sum())
    fd = (loss(0.5 + 1e-4) - loss(0.5 - 1e-4)) / 2e-4
    np.testing.assert_allclose(float(s.grad.numpy()), fd, rtol=2e-3, atol=1e-4)
