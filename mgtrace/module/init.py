"""Initialisers: fill a tensor in place from a distribution (torch.nn.init's set).

Each function takes a Tensor (usually a Parameter), overwrites its values
and returns it. Formulas and defaults follow ``torch.nn.init`` so that a
module built here has the same weight distributions as its PyTorch
counterpart (not the same values: the random streams differ).

Random source: :mod:`mgtrace.random`'s global generator (Philox, values
drawn as float32 and cast to the tensor's dtype), so
``mgtrace.random.seed(n)`` before building a model makes its initial values
reproducible across runs and platforms.

>>> import mgtrace as mt, mgtrace.random as R
>>> from mgtrace.module import init
>>> t = mt.tensor([[0.0] * 3] * 2)
>>> R.seed(0); a = init.kaiming_uniform_(t, a=5 ** 0.5).tolist()
>>> R.seed(0); a == init.kaiming_uniform_(t, a=5 ** 0.5).tolist()
True
"""
import math

import numpy as np

from mgtrace import random as _random

__all__ = ["calculate_gain", "calculate_fan_in_and_fan_out", "uniform_", "normal_",
           "trunc_normal_", "constant_", "zeros_", "ones_", "kaiming_uniform_",
           "kaiming_normal_", "xavier_uniform_", "xavier_normal_"]


def _fill(t, values):
    """t[...] = values (a float32 Tensor from mgtrace.random), cast to t's dtype."""
    t[...] = values
    return t


def calculate_gain(nonlinearity, param=None):
    """The recommended gain for a nonlinearity (torch.nn.init.calculate_gain).

    >>> round(calculate_gain("relu"), 4)
    1.4142
    """
    linear = ("linear", "conv1d", "conv2d", "conv3d", "conv_transpose1d",
              "conv_transpose2d", "conv_transpose3d", "sigmoid")
    if nonlinearity in linear:
        return 1.0
    if nonlinearity == "tanh":
        return 5.0 / 3
    if nonlinearity == "relu":
        return math.sqrt(2.0)
    if nonlinearity == "leaky_relu":
        if param is None:
            slope = 0.01
        elif isinstance(param, (int, float)) and not isinstance(param, bool):
            slope = param
        else:
            raise ValueError(f"negative_slope {param!r} is not a valid number")
        return math.sqrt(2.0 / (1 + slope ** 2))
    if nonlinearity == "selu":
        return 3.0 / 4
    raise ValueError(f"unsupported nonlinearity {nonlinearity!r}; known: "
                     f"{', '.join(linear + ('tanh', 'relu', 'leaky_relu', 'selu'))}")


def calculate_fan_in_and_fan_out(t):
    """(fan_in, fan_out) of a weight of shape [out, in, *kernel] (PyTorch's rule:
    fan_in = shape[1] * prod(kernel), fan_out = shape[0] * prod(kernel)).

    Raises ValueError for fewer than 2 dimensions."""
    shape = tuple(t.shape)
    if len(shape) < 2:
        raise ValueError(f"fan in and fan out need a tensor with at least 2 dimensions, "
                         f"got shape {shape}")
    receptive = int(np.prod(shape[2:])) if len(shape) > 2 else 1
    return shape[1] * receptive, shape[0] * receptive


def _fan(t, mode):
    if mode not in ("fan_in", "fan_out"):
        raise ValueError(f"mode must be 'fan_in' or 'fan_out', got {mode!r}")
    fan_in, fan_out = calculate_fan_in_and_fan_out(t)
    return fan_in if mode == "fan_in" else fan_out


def uniform_(t, a=0.0, b=1.0):
    """Fill ``t`` with U(a, b)."""
    return _fill(t, _random.uniform(a, b, size=t.shape))


def normal_(t, mean=0.0, std=1.0):
    """Fill ``t`` with N(mean, std^2)."""
    return _fill(t, _random.normal(mean, std, size=t.shape))


def trunc_normal_(t, mean=0.0, std=1.0, a=-2.0, b=2.0):
    """Fill ``t`` with N(mean, std^2) truncated to [a, b] (values outside are
    redrawn until none is left).

    Raises ValueError when a >= b."""
    if not a < b:
        raise ValueError(f"trunc_normal_: need a < b, got a={a}, b={b}")
    out = _random.normal(mean, std, size=t.shape).numpy()
    bad = (out < a) | (out > b)
    while bad.any():
        out[bad] = _random.normal(mean, std, size=int(bad.sum())).numpy()
        bad = (out < a) | (out > b)
    return _fill(t, out)


def constant_(t, value):
    """Fill ``t`` with ``value``."""
    t[...] = value
    return t


def zeros_(t):
    return constant_(t, 0)


def ones_(t):
    return constant_(t, 1)


def kaiming_uniform_(t, a=0.0, mode="fan_in", nonlinearity="leaky_relu"):
    """He initialisation, uniform: U(-bound, bound) with
    bound = gain * sqrt(3 / fan), gain = calculate_gain(nonlinearity, a).

    With a = sqrt(5) (PyTorch's Linear/Conv default) bound = 1 / sqrt(fan_in)."""
    fan = _fan(t, mode)
    if fan == 0:
        return t
    bound = calculate_gain(nonlinearity, a) * math.sqrt(3.0 / fan)
    return uniform_(t, -bound, bound)


def kaiming_normal_(t, a=0.0, mode="fan_in", nonlinearity="leaky_relu"):
    """He initialisation, normal: N(0, std^2) with std = gain / sqrt(fan)."""
    fan = _fan(t, mode)
    if fan == 0:
        return t
    return normal_(t, 0.0, calculate_gain(nonlinearity, a) / math.sqrt(fan))


def xavier_uniform_(t, gain=1.0):
    """Glorot initialisation, uniform: bound = gain * sqrt(6 / (fan_in + fan_out))."""
    fan_in, fan_out = calculate_fan_in_and_fan_out(t)
    bound = gain * math.sqrt(6.0 / (fan_in + fan_out))
    return uniform_(t, -bound, bound)


def xavier_normal_(t, gain=1.0):
    """Glorot initialisation, normal: std = gain * sqrt(2 / (fan_in + fan_out))."""
    fan_in, fan_out = calculate_fan_in_and_fan_out(t)
    return normal_(t, 0.0, gain * math.sqrt(2.0 / (fan_in + fan_out)))
