"""Gradient clipping (MegEngine's ``clip_grad_norm`` / ``clip_grad_value``)."""
import math

from mgtrace._core import Tensor
from mgtrace.autodiff import no_grad

__all__ = ["clip_grad_norm", "clip_grad_value"]


def _with_grad(tensors):
    tensors = [tensors] if isinstance(tensors, Tensor) else list(tensors)
    return [t for t in tensors if t.grad is not None]


def clip_grad_norm(tensors, max_norm, ord=2.0):
    """Scale the gradients of ``tensors`` together so that their joint
    ``ord``-norm (all gradients as one vector; ``ord`` a float or inf) is at
    most ``max_norm``. Returns the norm before clipping (a float).

    Raises:
        ValueError: max_norm < 0 or ord <= 0.
    """
    if max_norm < 0:
        raise ValueError(f"clip_grad_norm: max_norm must be >= 0, got {max_norm}")
    if not ord > 0:
        raise ValueError(f"clip_grad_norm: ord must be > 0, got {ord}")
    ts = _with_grad(tensors)
    if not ts:
        return 0.0
    with no_grad():
        if math.isinf(ord):
            total = max(float(abs(t.grad).max().item()) for t in ts)
        else:
            total = sum(float((abs(t.grad.astype("float64")) ** ord).sum().item())
                        for t in ts) ** (1.0 / ord)
        scale = max_norm / (total + 1e-6)
        if scale < 1:
            for t in ts:
                t.grad = t.grad * scale
    return total


def clip_grad_value(tensors, lower, upper):
    """Clamp each gradient of ``tensors`` to ``[lower, upper]``.

    Raises:
        ValueError: lower > upper.
    """
    if lower > upper:
        raise ValueError(f"clip_grad_value: lower {lower} > upper {upper}")
    from mgtrace import functional as F
    with no_grad():
        for t in _with_grad(tensors):
            t.grad = F.clip(t.grad, lower, upper)
