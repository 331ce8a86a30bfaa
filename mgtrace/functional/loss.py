"""Loss functions, as MegEngine defines them (``megengine.functional.loss``):
each takes a prediction and a label and returns their loss reduced by
``reduction``: ``"mean"`` (default, a 0-d tensor), ``"sum"`` or ``"none"``
(the per-element or per-sample losses). Composed of core ops, so a
GradManager differentiates them and a module tracer records them.
"""
from mgtrace._core import Tensor
from mgtrace._core import tensor as _make_tensor
from mgtrace.functional import math as _m
from mgtrace.functional import nn as _nn
from mgtrace.functional import tensor as _t

__all__ = ["l1_loss", "square_loss", "mse_loss", "smooth_l1_loss", "cross_entropy", "nll_loss",
           "binary_cross_entropy"]

_REDUCTIONS = ("mean", "sum", "none")


def _reduce(fn, loss, reduction):
    if reduction == "mean":
        return loss.mean()
    if reduction == "sum":
        return loss.sum()
    return loss


def _args(fn, pred, label, reduction):
    if reduction not in _REDUCTIONS:
        raise ValueError(f"{fn}: reduction must be one of {_REDUCTIONS}, got {reduction!r}")
    pred = pred if isinstance(pred, Tensor) else _make_tensor(pred)
    label = label if isinstance(label, Tensor) else _make_tensor(label)
    return pred, label


def _same_shape(fn, pred, label):
    if tuple(pred.shape) != tuple(label.shape):
        raise ValueError(f"{fn}: pred has shape {tuple(pred.shape)} but label has "
                         f"{tuple(label.shape)}; they must be equal")


def l1_loss(pred, label, reduction="mean"):
    """Mean absolute error ``|pred - label|`` (MegEngine's ``l1_loss``).

    Args:
        pred, label: float tensors of the same shape.
        reduction: "mean", "sum" or "none".

    Returns:
        0-d (mean, sum) or pred's shape (none); pred's dtype.

    Raises:
        ValueError: shapes differ; unknown reduction.

    >>> import mgtrace as mt, mgtrace.functional as F
    >>> F.l1_loss(mt.tensor([1.0, 2.0, 4.0]), mt.tensor([1.0, 3.0, 1.0])).item()
    1.3333333730697632
    """
    pred, label = _args("l1_loss", pred, label, reduction)
    _same_shape("l1_loss", pred, label)
    return _reduce("l1_loss", abs(pred - label), reduction)


def square_loss(pred, label, reduction="mean"):
    """Mean squared error ``(pred - label) ** 2`` (MegEngine's
    ``square_loss``, also named ``mse_loss``). Args and errors as
    :func:`l1_loss`.

    >>> import mgtrace as mt, mgtrace.functional as F
    >>> F.square_loss(mt.tensor([1.0, 2.0, 4.0]), mt.tensor([1.0, 3.0, 1.0])).item()
    3.3333332538604736
    """
    pred, label = _args("square_loss", pred, label, reduction)
    _same_shape("square_loss", pred, label)
    d = pred - label
    return _reduce("square_loss", d * d, reduction)


def mse_loss(pred, label, reduction="mean"):
    """:func:`square_loss` under PyTorch's name (its own function, so that
    archives record the name a model called).

    >>> import mgtrace as mt, mgtrace.functional as F
    >>> F.mse_loss(mt.tensor([1.0, 2.0, 4.0]), mt.tensor([1.0, 3.0, 1.0]), reduction="sum").item()
    10.0
    """
    return square_loss(pred, label, reduction)


def smooth_l1_loss(pred, label, reduction="mean", beta=1.0):
    """Huber-style loss: ``0.5 d**2 / beta`` where ``|d| < beta``, else
    ``|d| - 0.5 beta`` (``d = pred - label``; PyTorch's ``smooth_l1_loss``,
    MegEngine's detection losses). Args and errors as :func:`l1_loss`;
    ``beta`` > 0 (ValueError otherwise).

    >>> import mgtrace as mt, mgtrace.functional as F
    >>> F.smooth_l1_loss(mt.tensor([0.5, 3.0]), mt.tensor([0.0, 0.0]), reduction="none").tolist()
    [0.125, 2.5]
    """
    pred, label = _args("smooth_l1_loss", pred, label, reduction)
    _same_shape("smooth_l1_loss", pred, label)
    if not beta > 0:
        raise ValueError(f"smooth_l1_loss: beta must be > 0, got {beta}")
    d = abs(pred - label)
    loss = _m.where(d < beta, d * d * (0.5 / beta), d - 0.5 * beta)
    return _reduce("smooth_l1_loss", loss, reduction)


def _pick(fn, x, label, axis):
    """x's entries at the class ``label`` along ``axis`` (label has x's
    shape without that axis)."""
    if label.dtype.kind not in "iu":
        raise TypeError(f"{fn}: label must hold integer class indices, got {label.dtype}")
    expected = tuple(x.shape[:axis]) + tuple(x.shape[axis + 1:])
    if tuple(label.shape) != expected:
        raise ValueError(f"{fn}: label must have shape {expected} (pred's shape without the "
                         f"class axis {axis}), got {tuple(label.shape)}")
    n = x.shape[axis]
    if label.size:
        lo, hi = int(label.min().item()), int(label.max().item())
        if lo < 0 or hi >= n:
            raise ValueError(f"{fn}: label values must be class indices in [0, {n}), got "
                             f"values in [{lo}, {hi}]")
    idx = _t.expand_dims(label.astype("int32"), axis)
    return _t.squeeze(_t.gather(x, axis, idx), axis)


def _class_axis(fn, pred, axis):
    if pred.ndim < 1:
        raise ValueError(f"{fn}: pred needs a class axis, got a 0-d tensor")
    if not -pred.ndim <= axis < pred.ndim:
        raise ValueError(f"{fn}: axis {axis} is out of range for pred of {pred.ndim} axes")
    return axis % pred.ndim


def cross_entropy(pred, label, axis=1, with_logits=True, label_smooth=0.0, reduction="mean"):
    """Cross entropy between class scores and integer labels (MegEngine's
    ``cross_entropy``).

    Args:
        pred: float [N, C, ...] (class axis ``axis``): logits when
            ``with_logits`` (the loss applies log_softmax), else
            probabilities.
        label: integer [N, ...] class indices in [0, C).
        axis: the class axis of pred.
        with_logits: whether pred holds logits.
        label_smooth: in [0, 1): the target puts ``1 - label_smooth`` on
            the label and spreads ``label_smooth`` evenly over all C
            classes (MegEngine, Szegedy et al. 2016).
        reduction: "mean", "sum" or "none" (the [N, ...] losses).

    Returns:
        pred's dtype.

    Raises:
        ValueError: label's shape is not pred's without the class axis,
            a label outside [0, C), label_smooth outside [0, 1), unknown
            reduction. TypeError: a label that is not integer.

    >>> import mgtrace as mt, mgtrace.functional as F
    >>> round(F.cross_entropy(mt.tensor([[2.0, 0.0, 0.0]]), mt.tensor([0])).item(), 4)
    0.2395
    """
    pred, label = _args("cross_entropy", pred, label, reduction)
    axis = _class_axis("cross_entropy", pred, axis)
    if not 0 <= label_smooth < 1:
        raise ValueError(f"cross_entropy: label_smooth must be in [0, 1), got {label_smooth}")
    logp = _nn.log_softmax(pred, axis) if with_logits else _m.log(pred)
    loss = -_pick("cross_entropy", logp, label, axis)
    if label_smooth:
        loss = loss * (1 - label_smooth) - logp.mean(axis=axis) * label_smooth
    return _reduce("cross_entropy", loss, reduction)


def nll_loss(pred, label, axis=1, reduction="mean"):
    """Negative log likelihood: ``-pred[label]`` along the class axis, pred
    holding log-probabilities (PyTorch's ``nll_loss``; MegEngine's
    ``cross_entropy(with_logits=False)`` on ``exp(pred)``). Args and errors
    as :func:`cross_entropy`.

    >>> import mgtrace as mt, mgtrace.functional as F
    >>> F.nll_loss(mt.tensor([[-0.5, -1.0], [-2.0, -0.25]]), mt.tensor([0, 1])).item()
    0.375
    """
    pred, label = _args("nll_loss", pred, label, reduction)
    axis = _class_axis("nll_loss", pred, axis)
    return _reduce("nll_loss", -_pick("nll_loss", pred, label, axis), reduction)


def binary_cross_entropy(pred, label, with_logits=True, reduction="mean"):
    """Binary cross entropy (MegEngine's ``binary_cross_entropy``):
    ``-(label * log p + (1 - label) * log(1 - p))`` with ``p = sigmoid(pred)``
    when ``with_logits`` (computed stably as ``softplus(pred) - label *
    pred``), else ``p = pred``.

    Args:
        pred: float logits (or probabilities in [0, 1]).
        label: float targets in [0, 1] of pred's shape.
        with_logits: whether pred holds logits.
        reduction: "mean", "sum" or "none".

    Raises:
        ValueError: shapes differ; unknown reduction.

    >>> import mgtrace as mt, mgtrace.functional as F
    >>> round(F.binary_cross_entropy(mt.tensor([0.0, 2.0]), mt.tensor([1.0, 0.0])).item(), 4)
    1.41
    """
    pred, label = _args("binary_cross_entropy", pred, label, reduction)
    _same_shape("binary_cross_entropy", pred, label)
    if with_logits:
        loss = _nn.softplus(pred) - label * pred
    else:
        loss = -(label * _m.log(pred) + (1 - label) * _m.log(1 - pred))
    return _reduce("binary_cross_entropy", loss, reduction)
