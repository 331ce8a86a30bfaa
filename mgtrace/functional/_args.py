"""Argument checks shared by the functional wrappers.

Every check names the function and the argument in its message
("conv2d: weight must be 4-d [O, C/groups, KH, KW], got shape (3, 3)"), so
an error read in a traceback says what to change. Nothing here computes:
the wrappers hand checked arguments to the core (:mod:`mgtrace._core`).
"""
import numbers
import operator

import numpy as np

from mgtrace._core import Tensor, get_device, tensor as _to_tensor
from mgtrace._core.nn import MAX_GEOMETRY
from mgtrace._core.tensor import MAX_NUMEL

SCALARS = (bool, int, float)
ARRAYS = (np.ndarray, np.generic, list, tuple)


def is_scalar(v):
    """A Python bool, int or float (the core's "scalar" operands)."""
    return isinstance(v, SCALARS)


def check_operand(fn, name, v):
    """v is something the core's elementwise ops take; TypeError otherwise."""
    if isinstance(v, Tensor) or is_scalar(v) or isinstance(v, ARRAYS):
        return v
    if v is not None and (hasattr(v, "__array__") or hasattr(v, "__dlpack__")):
        return v
    raise TypeError(f"{fn}: {name} must be a Tensor, a NumPy array or a Python scalar, "
                    f"got {type(v).__name__}")


def shape_of(v):
    """The shape v has as an operand (() for Python scalars)."""
    if isinstance(v, Tensor):
        return v.shape
    if is_scalar(v):
        return ()
    return np.shape(v)


def check_broadcast(fn, **operands):
    """The NumPy broadcast shape of the named operands; ValueError naming them."""
    shapes = {k: shape_of(v) for k, v in operands.items()}
    try:
        return tuple(np.broadcast_shapes(*shapes.values()))
    except ValueError:
        desc = ", ".join(f"{k} of shape {s}" for k, s in shapes.items())
        raise ValueError(f"{fn}: {desc} do not broadcast together (NumPy broadcasting rule)") from None


def as_tensor(fn, name, v, device=None):
    """v as a Tensor: a Tensor passes; arrays, lists and scalars become one on
    ``device`` (default: the default device). TypeError names the argument."""
    if isinstance(v, Tensor):
        return v
    check_operand(fn, name, v)
    try:
        return _to_tensor(v, device=device)
    except (TypeError, ValueError) as e:
        raise TypeError(f"{fn}: {name} cannot be converted to a tensor: {e}") from None


def tensors(fn, **named):
    """The named arguments as Tensors on one device (None stays None).

    Raises ValueError("ambiguous device: ...") when Tensor arguments sit on
    different devices; arrays go to the Tensors' device."""
    dev = get_device(*[v for v in named.values() if isinstance(v, Tensor)])
    return [None if v is None else as_tensor(fn, k, v, dev) for k, v in named.items()]


def check_ndim(fn, name, t, ndims, layout):
    """t.ndim is one of ``ndims``; ValueError with the layout otherwise."""
    if isinstance(ndims, int):
        ndims = (ndims,)
    if t.ndim not in ndims:
        want = " or ".join(f"{n}-d" for n in ndims)
        raise ValueError(f"{fn}: {name} must be {want} {layout}, got shape {t.shape}")


def check_float(fn, name, t):
    if t.dtype.kind not in "fV":
        raise TypeError(f"{fn}: {name} must be a floating-point tensor, got {t.dtype.name}; "
                        f"convert it with .astype('float32')")


def check_int_dtype(fn, name, t):
    if t.dtype.kind not in "iu":
        raise TypeError(f"{fn}: {name} must be an integer tensor, got {t.dtype.name}")


def to_int(fn, name, v, minimum=None, maximum=None):
    """v as a Python int (bool refused); ValueError below ``minimum`` or
    above ``maximum``."""
    if isinstance(v, (bool, np.bool_)):
        raise TypeError(f"{fn}: {name} must be an int, not bool")
    try:
        i = operator.index(v)
    except TypeError:
        raise TypeError(f"{fn}: {name} must be an int, got {type(v).__name__}") from None
    if minimum is not None and i < minimum:
        raise ValueError(f"{fn}: {name} must be >= {minimum}, got {i}")
    if maximum is not None and i > maximum:
        raise ValueError(f"{fn}: {name} must be <= {maximum}, got {i}")
    return i


def to_size(fn, name, v, minimum=0):
    """A kernel size, stride, padding, dilation, group or output-size count:
    an int in [minimum, MAX_GEOMETRY] (2**31 - 1, BLAS's int, as the core
    checks; MegEngine keeps these in uint32)."""
    return to_int(fn, name, v, minimum, MAX_GEOMETRY)


def check_numel(fn, name, shape):
    """ValueError naming the argument when a result of ``shape`` (ints >= 0)
    would have more elements than a tensor can hold (2**62)."""
    n = 1
    for s in shape:
        n *= s
    if n > MAX_NUMEL:
        raise ValueError(f"{fn}: {name} gives a result of shape {tuple(shape)}, {n} elements, more "
                         f"than a tensor can hold (2**62)")
    return shape


def to_float(fn, name, v):
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, numbers.Real):
        raise TypeError(f"{fn}: {name} must be a real number, got {type(v).__name__}")
    return float(v)


def to_axis(fn, name, axis, ndim):
    """One axis in range(ndim) (negative counts from the end)."""
    a = to_int(fn, name, axis)
    if not -ndim <= a < max(ndim, 1):
        raise IndexError(f"{fn}: {name}={a} is out of range for a tensor of dimension {ndim}")
    return a % ndim if ndim else 0


def to_shape(fn, name, shape):
    """An int or a sequence of ints (or a 1-d integer Tensor) as a tuple."""
    if isinstance(shape, Tensor):
        shape = shape.tolist()
    if isinstance(shape, (int, np.integer)) and not isinstance(shape, bool):
        shape = (shape,)
    if not isinstance(shape, (tuple, list)):
        raise TypeError(f"{fn}: {name} must be an int or a sequence of ints, got {type(shape).__name__}")
    out = tuple(to_int(fn, name, s) for s in shape)
    return out


def pair(fn, name, v, minimum=0):
    """An int or a pair of ints as (a, b), each a size (:func:`to_size`)."""
    if isinstance(v, (tuple, list)):
        if len(v) != 2:
            raise ValueError(f"{fn}: {name} must be an int or a pair of ints, got {v!r}")
        return (to_size(fn, name, v[0], minimum), to_size(fn, name, v[1], minimum))
    i = to_size(fn, name, v, minimum)
    return (i, i)


def single(fn, name, v, minimum=0):
    """An int or a 1-sequence of ints (conv1d geometry) as a size (:func:`to_size`)."""
    if isinstance(v, (tuple, list)):
        if len(v) != 1:
            raise ValueError(f"{fn}: {name} must be an int or a 1-tuple, got {v!r}")
        v = v[0]
    return to_size(fn, name, v, minimum)
