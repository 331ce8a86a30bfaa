"""mgtrace.functional's losses against NumPy written from MegEngine's
definitions, their gradients through a GradManager, and their errors."""
import numpy as np
import pytest

import mgtrace as mt
import mgtrace.functional as F
from mgtrace.autodiff import GradManager


def _logsoftmax(x, axis):
    m = x.max(axis=axis, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=axis, keepdims=True))


@pytest.mark.parametrize("ls", [0.0, 0.1])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy(ls, reduction):
    rng = np.random.default_rng(3)
    x = rng.normal(size=(4, 5, 3))
    y = rng.integers(0, 5, size=(4, 3))
    lp = _logsoftmax(x, 1)
    onehot = np.eye(5)[y].transpose(0, 2, 1)
    target = onehot * (1 - ls) + ls / 5
    want = -(target * lp).sum(1)
    want = {"mean": want.mean(), "sum": want.sum(), "none": want}[reduction]
    got = F.cross_entropy(mt.tensor(x), mt.tensor(y), label_smooth=ls, reduction=reduction)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-12)


def test_cross_entropy_probabilities_and_nll():
    rng = np.random.default_rng(4)
    x = rng.normal(size=(6, 4))
    y = rng.integers(0, 4, size=6)
    p = np.exp(_logsoftmax(x, 1))
    want = -np.log(p[np.arange(6), y]).mean()
    np.testing.assert_allclose(
        F.cross_entropy(mt.tensor(p), mt.tensor(y), with_logits=False).item(), want, rtol=1e-12)
    np.testing.assert_allclose(F.nll_loss(mt.tensor(np.log(p)), mt.tensor(y)).item(), want,
                               rtol=1e-12)


def test_regression_losses():
    rng = np.random.default_rng(5)
    a, b = rng.normal(size=(3, 4)), rng.normal(size=(3, 4))
    d = a - b
    np.testing.assert_allclose(F.l1_loss(mt.tensor(a), mt.tensor(b)).item(), np.abs(d).mean())
    np.testing.assert_allclose(F.square_loss(mt.tensor(a), mt.tensor(b), "sum").item(),
                               (d * d).sum())
    np.testing.assert_allclose(F.mse_loss(mt.tensor(a), mt.tensor(b)).item(), (d * d).mean())
    hub = np.where(np.abs(d) < 0.5, 0.5 * d * d / 0.5, np.abs(d) - 0.25)
    np.testing.assert_allclose(
        F.smooth_l1_loss(mt.tensor(a), mt.tensor(b), "none", beta=0.5).numpy(), hub)


def test_binary_cross_entropy():
    rng = np.random.default_rng(6)
    z, t = rng.normal(size=8) * 3, rng.uniform(size=8)
    p = 1 / (1 + np.exp(-z))
    want = -(t * np.log(p) + (1 - t) * np.log(1 - p)).mean()
    np.testing.assert_allclose(F.binary_cross_entropy(mt.tensor(z), mt.tensor(t)).item(), want,
                               rtol=1e-10)
    np.testing.assert_allclose(
        F.binary_cross_entropy(mt.tensor(p), mt.tensor(t), with_logits=False).item(), want,
        rtol=1e-10)


def test_cross_entropy_gradient_is_softmax_minus_target():
    rng = np.random.default_rng(7)
    x = rng.normal(size=(5, 3))
    y = rng.integers(0, 3, size=5)
    w = mt.tensor(x)
    gm = GradManager().attach(w)
    with gm:
        gm.backward(F.cross_entropy(w, mt.tensor(y), label_smooth=0.2))
    target = np.eye(3)[y] * 0.8 + 0.2 / 3
    np.testing.assert_allclose(w.grad.numpy(), (np.exp(_logsoftmax(x, 1)) - target) / 5,
                               rtol=1e-10, atol=1e-12)


def test_errors():
    x = mt.tensor(np.zeros((2, 3)))
    with pytest.raises(ValueError, match=r"label values must be class indices in \[0, 3\)"):
        F.cross_entropy(x, mt.tensor([0, 3]))
    with pytest.raises(ValueError, match="label must have shape"):
        F.cross_entropy(x, mt.tensor([0, 1, 2]))
    with pytest.raises(TypeError, match="integer class indices"):
        F.cross_entropy(x, mt.tensor([0.0, 1.0]))
    with pytest.raises(ValueError, match="reduction"):
        F.l1_loss(x, x, reduction="avg")
    with pytest.raises(ValueError, match="same shape|must be equal"):
        F.square_loss(x, mt.tensor(np.zeros(3)))
