"""SGD, Adam and AdamW (MegEngine's update rules, which are PyTorch's)."""
import math
import numbers

import numpy as np

from mgtrace import functional as _F
from mgtrace._core import nn as _nn
from mgtrace.optimizer.optimizer import _REQUIRED, Optimizer, write

__all__ = ["SGD", "Adam", "AdamW"]


def _plain(v):
    """A 0-d NumPy array of numbers as its Python number (torch takes one as
    a hyperparameter, and ``float(v)`` would: refusing it was a false
    positive); anything else as it is."""
    if isinstance(v, np.ndarray) and v.ndim == 0 and v.dtype.kind in "iuf":
        return v.item()
    return v


def _check(name, group, *keys):
    """Check ``group[k]`` for each of ``keys``; a 0-d array is stored as its
    Python number."""
    for k in keys:
        v = _plain(group[k])
        if v is _REQUIRED:
            continue
        if isinstance(v, bool) or not isinstance(v, numbers.Real):
            raise TypeError(f"{name}: {k} must be a real number, got {v!r}")
        if not v >= 0:         # NaN too (MegEngine asserts lr >= 0.0)
            raise ValueError(f"{name}: {k} must be >= 0, got {v}")
        if v == math.inf:      # one step makes every parameter inf or NaN
            raise ValueError(f"{name}: {k} must be finite, got {v}")
        group[k] = v


def _check_betas(name, group):
    """``group["betas"]``: two numbers in [0, 1) (a tuple, a list or a NumPy
    array of two, as torch takes), stored as a tuple."""
    betas = group["betas"]
    if isinstance(betas, np.ndarray) and betas.shape == (2,) and betas.dtype.kind in "iuf":
        betas = tuple(betas.tolist())
    elif isinstance(betas, (tuple, list)):
        betas = tuple(_plain(b) for b in betas)
    ok = isinstance(betas, tuple) and len(betas) == 2 and all(
        isinstance(b, numbers.Real) and not isinstance(b, bool) and 0.0 <= b < 1.0 for b in betas)
    if not ok:
        raise ValueError(f"{name}: betas must be a pair of numbers in [0, 1), got {group['betas']!r}")
    group["betas"] = betas


class SGD(Optimizer):
    """Stochastic gradient descent with momentum (MegEngine's ``SGD``)::

        g = grad + weight_decay * p
        buf = momentum * buf + g                 (buf = g at the first step)
        p -= lr * (g + momentum * buf if nesterov else buf)

    Args:
        params: tensors or parameter groups (see :class:`Optimizer`).
        lr: learning rate (> 0... 0 allowed).
        momentum, weight_decay: >= 0.
        nesterov: Nesterov momentum (needs momentum > 0).

    Raises (for the arguments and for each parameter group's own values):
        TypeError: a hyperparameter that is no real number (a string,
            None, a bool).
        ValueError: a negative, NaN or infinite hyperparameter, or nesterov
            without momentum.
    """

    def __init__(self, params, lr=_REQUIRED, momentum=0.0, nesterov=False, weight_decay=0.0):
        defaults = dict(lr=lr, momentum=momentum, nesterov=nesterov, weight_decay=weight_decay)
        self._check_group(defaults)         # checked and normalised before any group
        super().__init__(params, defaults)

    def _check_group(self, group):
        _check("SGD", group, "lr", "momentum", "weight_decay")
        if group["nesterov"] and group["momentum"] <= 0:
            raise ValueError("SGD: nesterov needs momentum > 0")

    def _update(self, p, g, st, group):
        m, wd = group["momentum"], group["weight_decay"]
        buf = st.get("momentum_buffer") if m else None
        first = bool(m) and buf is None
        if first:
            buf = _F.zeros_like(p)
        # one C pass over p, g and the buffer (kernels/cpu/train.c), where it applies
        if _nn.sgd_step(p, g, buf, float(group["lr"]), float(m), float(wd), bool(group["nesterov"]), first):
            if m:
                st["momentum_buffer"] = buf
            return
        if first:
            buf = None
        if wd:
            g = g + p * wd
        if m:
            buf = g.copy() if buf is None else buf * m + g
            st["momentum_buffer"] = buf
            g = g + buf * m if group["nesterov"] else buf
        write(p, p - g * group["lr"])


class Adam(Optimizer):
    """Adam (Kingma and Ba 2015; MegEngine's ``Adam``)::

        g = grad + weight_decay * p                       (L2, in the gradient)
        m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
        p -= lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)

    Raises (for the arguments and for each parameter group's own values):
        TypeError: a hyperparameter that is no real number (a string,
            None, a bool).
        ValueError: a negative, NaN or infinite hyperparameter; betas not a
            pair of numbers in [0, 1).
    """
    _decoupled = False

    def __init__(self, params, lr=_REQUIRED, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0):
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
        self._check_group(defaults)         # betas stored as a tuple
        super().__init__(params, defaults)

    def _check_group(self, group):
        name = type(self).__name__
        _check(name, group, "lr", "eps", "weight_decay")
        _check_betas(name, group)

    def _update(self, p, g, st, group):
        b1, b2 = group["betas"]
        lr, wd = group["lr"], group["weight_decay"]
        if wd and not self._decoupled:
            g = g + p * wd
        step = st.get("step", 0) + 1
        st["step"] = step
        m = st.get("exp_avg")
        v = st.get("exp_avg_sq")
        m = g * (1 - b1) if m is None else m * b1 + g * (1 - b1)
        v = g * g * (1 - b2) if v is None else v * b2 + g * g * (1 - b2)
        st["exp_avg"], st["exp_avg_sq"] = m, v
        from mgtrace import functional as F
        upd = (m * (1 / (1 - b1 ** step))) / (F.sqrt(v * (1 / (1 - b2 ** step))) + group["eps"])
        new = p * (1 - lr * wd) if wd and self._decoupled else p
        write(p, new - upd * lr)


class AdamW(Adam):
    """Adam with decoupled weight decay (Loshchilov and Hutter 2019;
    MegEngine's ``AdamW``): ``p -= lr * weight_decay * p`` beside the Adam
    step, not through the gradient. Default weight_decay 0.01."""
    _decoupled = True

    def __init__(self, params, lr=_REQUIRED, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2):
        super().__init__(params, lr, betas, eps, weight_decay)
