"""MegEngine's other fused float modules that quantization treats as one
layer (``module/linear_bn.py``, ``module/concat.py``,
``module/batch_matmul_activation.py``): LinearBn1d, LinearBnRelu1d,
BatchMatMulActivation and Concat. :func:`mgtrace.quantization.quantize_qat`
maps each to its :mod:`mgtrace.module.qat` version. Builtins of format 1.2.
"""
import math

import numpy as np

import mgtrace.functional as F
from mgtrace.module import init
from mgtrace.module.builtin import BatchNorm1d, Linear, _builtin, _empty_param
from mgtrace.module.fused import _PartThenBn, _initialized, _uninitialized
from mgtrace.module.module import Module

__all__ = ["LinearBn1d", "LinearBnRelu1d", "BatchMatMulActivation", "Concat"]


class _LinearBnActivation1d(_PartThenBn):
    """``linear`` (Linear) then ``bn`` (BatchNorm1d), MegEngine's layout."""
    _PART = "linear"

    def __init__(self, in_features, out_features, bias=True, eps=1e-5, momentum=0.1,
                 affine=True, track_running_stats=True):
        super().__init__()
        build = _uninitialized if "reset_parameters" in self.__dict__ else _initialized
        self.linear = build(Linear, in_features, out_features, bias)
        self.bn = build(BatchNorm1d, out_features, eps, momentum, affine, track_running_stats)

    def _from_megengine_state(self, state, prefix):
        """MegEngine's LinearBn1d keeps a ``bias`` of its own (zeros, beside
        ``linear.bias``) that its forward never reads: load_state_dict(
        layout="megengine") drops a zero one; another value raises
        StateDictError (a ValueError)."""
        key = prefix + "bias"
        if key not in state:
            return state
        v = state[key]
        v = np.asarray(v.numpy() if hasattr(v, "numpy") else v)
        if v.shape != (self.linear.out_features,) or np.any(v):
            from mgtrace.module.module import StateDictError
            raise StateDictError(f"{key}: MegEngine's unused LinearBn1d bias is zeros of shape "
                                 f"({self.linear.out_features},), got {v.shape} "
                                 f"{v.reshape(-1)[:3].tolist()}", [], [key])
        return {k: x for k, x in state.items() if k != key}

    def _to_megengine_state(self, state, prefix):
        """``state`` with MegEngine's zero ``bias`` (where the Linear has one)."""
        if self.linear.bias is not None:
            state[prefix + "bias"] = F.zeros((self.linear.out_features,))
        return state


@_builtin
class LinearBn1d(_LinearBnActivation1d):
    """``bn(linear(x))`` (MegEngine's ``LinearBn1d``): x float32 [N, in_features]
    -> [N, out_features]. Args: Linear's, then BatchNorm1d's ``eps``,
    ``momentum`` (mgtrace's/PyTorch's convention), ``affine``,
    ``track_running_stats``. state_dict: ``linear.weight``, ``linear.bias``,
    ``bn.*``."""

    def forward(self, x):
        return self.bn(self.linear(x))


@_builtin
class LinearBnRelu1d(_LinearBnActivation1d):
    """``relu(bn(linear(x)))`` (MegEngine's ``LinearBnRelu1d``), as
    :class:`LinearBn1d`."""

    def forward(self, x):
        return F.relu(self.bn(self.linear(x)))


@_builtin
class BatchMatMulActivation(Module):
    """``act(matmul(weight, x) + bias)`` (MegEngine's ``BatchMatMulActivation``,
    no transpose anywhere).

    Args:
        batch, in_features, out_features: weight float32 [batch,
            out_features, in_features], initialised N(0, 1/in_features).
        bias: a float32 [out_features] bias (initially 0), added along the
            result's last axis as MegEngine does.
        nonlinear_mode: "identity" or "relu" (any case).

    x: float32 [batch, in_features, K] -> [batch, out_features, K].
    Raises ValueError for another nonlinear_mode.
    """

    def __init__(self, batch, in_features, out_features, bias=True, nonlinear_mode="identity"):
        super().__init__()
        mode = str(nonlinear_mode).lower()
        if mode not in ("identity", "relu"):
            raise ValueError(f"BatchMatMulActivation: nonlinear_mode must be 'identity' or "
                             f"'relu', got {nonlinear_mode!r}")
        self.batch, self.in_features, self.out_features = int(batch), int(in_features), \
            int(out_features)
        self.nonlinear_mode = mode
        self.weight = _empty_param((self.batch, self.out_features, self.in_features))
        self.bias = _empty_param((self.out_features,)) if bias else None
        self.reset_parameters()

    def reset_parameters(self):
        init.normal_(self.weight, 0.0, math.sqrt(1.0 / self.in_features))
        if self.bias is not None:
            init.zeros_(self.bias)

    def config(self):
        return {"batch": self.batch, "in_features": self.in_features,
                "out_features": self.out_features, "bias": self.bias is not None,
                "nonlinear_mode": self.nonlinear_mode}

    def _calc_linear(self, x, weight, bias):
        y = F.matmul(weight, x)
        if bias is not None:
            y = y + bias
        return F.relu(y) if self.nonlinear_mode == "relu" else y

    def forward(self, x):
        return self._calc_linear(x, self.weight, self.bias)


@_builtin
class Concat(Module):
    """``F.concat(inps, axis)`` as a module (MegEngine's ``Concat``), so
    that quantization can give the result its own qparams."""

    def config(self):
        return {}

    def forward(self, inps, axis=0):
        return F.concat(inps, axis)
