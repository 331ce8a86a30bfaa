"""Argument checks: the one place that says what an argument must be.

Used by ``mgtrace.functional``, ``mgtrace.module``, ``mgtrace.random`` and
the core's own entry points (``mgtrace._core.nn``: a fast path in Cython for
the common case, these functions for everything else, so the exception and
its message are the same whichever layer a bad argument reaches first).

The rule (NumPy's and MegEngine's):

- the wrong *type* raises ``TypeError``: a float or a str where an int is
  wanted, a bool where an int is wanted (``True`` is not a size), a list
  where a tensor is wanted, a value that is no dtype;
- the right type with a bad *value* raises ``ValueError``: a size below its
  minimum or above ``MAX_GEOMETRY``, a tuple of the wrong length
  (``kernel_size=(3, 3, 3)`` for a 2-d op), a probability outside [0, 1),
  a non-finite number where a finite one is wanted, shapes that do not
  broadcast;
- an axis outside ``range(-ndim, ndim)`` raises ``IndexError`` (as
  ``operator.index``-style indexing does; NumPy's AxisError is an
  IndexError too).

Every message starts with the function and names the argument
("conv2d: stride must be an int or a pair of ints, got (1, 1, 1)"), so an
error read in a traceback says what to change. Nothing here computes.
"""
import math
import numbers
import operator

import numpy as np

from mgtrace._core.dispatch import get_device
from mgtrace._core.dtype import as_dtype
from mgtrace._core.tensor import MAX_NUMEL, Tensor, tensor as _to_tensor

MAX_GEOMETRY = 2147483647   # sizes, strides, channels, groups: BLAS's int (MegEngine keeps uint32)
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


def tensors(fn, optional=(), **named):
    """The named arguments as Tensors on one device.

    ``optional`` names the arguments that may be None (an absent bias); they
    stay None. Any other None raises ``TypeError("fn: x must be a tensor,
    got None")``, as every other non-tensor does.

    Raises ValueError("ambiguous device: ...") when Tensor arguments sit on
    different devices; arrays go to the Tensors' device."""
    vals = list(named.values())
    dev = None
    for v in vals:     # the common case first: Tensors (parameters too) on one device
        if isinstance(v, Tensor):
            if dev is None:
                dev = v.device
            elif v.device != dev:
                break
        elif v is not None:
            break
    else:
        if None not in vals:
            return vals
    for k, v in named.items():
        if v is None and k not in optional:
            raise TypeError(f"{fn}: {k} must be a tensor, got None")
    dev = get_device(*[v for v in vals if isinstance(v, Tensor)])
    return [None if v is None else as_tensor(fn, k, v, dev) for k, v in named.items()]


def check_ndim(fn, name, t, ndims, layout):
    """t.ndim is one of ``ndims``; ValueError with the layout otherwise
    (TypeError for a missing tensor: None)."""
    if t is None:
        raise TypeError(f"{fn}: {name} must be a tensor, got None")
    if isinstance(ndims, int):
        ndims = (ndims,)
    if t.ndim not in ndims:
        want = " or ".join(f"{n}-d" for n in ndims)
        raise ValueError(f"{fn}: {name} must be {want} {layout}, got shape {t.shape}")


def refuse_quantized(fn, *ts):
    """QuantizationError naming ``fn`` and the tensors' dtypes (dispatch's
    message for core ops, here for the Python checks that run before them)."""
    from mgtrace.quantization.utils import QuantizationError
    from mgtrace._core.dtype import qdtype_str
    raise QuantizationError(
        f"{fn}: cannot compute on {' and '.join(qdtype_str(t.dtype) for t in ts)}: quantized "
        "tensors take part in no arithmetic; dequantize first (F.dequantize(x), "
        "x.astype('float32')) or use the modules of mgtrace.module.quantized")


def check_float(fn, name, t):
    if t.dtype.kind not in "fV":
        if getattr(t, "_qdtype", None) is not None:     # the error path only
            refuse_quantized(fn, t)
        raise TypeError(f"{fn}: {name} must be a floating-point tensor, got {t.dtype.name}; "
                        f"convert it with .astype('float32')")


def check_int_dtype(fn, name, t):
    if t.dtype.kind not in "iu":
        raise TypeError(f"{fn}: {name} must be an integer tensor, got {t.dtype.name}")


def to_int(fn, name, v, minimum=None, maximum=None):
    """v as a Python int: an int, a NumPy integer or anything with
    ``__index__``; bool refused (TypeError). ValueError below ``minimum`` or
    above ``maximum``."""
    if type(v) is int and (minimum is None or v >= minimum) and (maximum is None or v <= maximum):
        return v    # the common case, first: these checks run on every layer call
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
    """A kernel size, stride, padding, dilation, group, channel or
    output-size count: an int in [minimum, MAX_GEOMETRY] (2**31 - 1, BLAS's
    int; MegEngine keeps these in uint32)."""
    if type(v) is int and minimum <= v <= MAX_GEOMETRY:      # the common case, checked fast
        return v
    i = to_int(fn, name, v, minimum)
    if i > MAX_GEOMETRY:
        raise ValueError(f"{fn}: {name} must be at most {MAX_GEOMETRY} (2**31 - 1), got {i}")
    return i


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


def to_float(fn, name, v, finite=False):
    """v as a Python float: any real number (int, float, NumPy scalar), bool
    refused (TypeError). ``finite=True``: ValueError for inf and nan."""
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, numbers.Real):
        raise TypeError(f"{fn}: {name} must be a real number, got {type(v).__name__}")
    f = float(v)
    if finite and not math.isfinite(f):
        raise ValueError(f"{fn}: {name} must be finite, got {f}")
    return f


def to_float_scalar(fn, name, v, finite=False):
    """v as a Python float, read once: a real number (as :func:`to_float`),
    or a 0-d NumPy array or 0-d Tensor of an integer or float dtype (a scale
    computed with NumPy or mgtrace). The bool dtype, complex and other
    dtypes raise TypeError; an array or Tensor that is not 0-d, ValueError
    naming its shape; ``finite=True``: ValueError for inf and nan."""
    if isinstance(v, (np.ndarray, Tensor)):
        if v.ndim != 0:
            raise ValueError(f"{fn}: {name} must be a number or a 0-d array or Tensor, got "
                             f"a {type(v).__name__} of shape {tuple(v.shape)}")
        dt = v.dtype
        if not (dt.kind in "iuf" or dt.name == "bfloat16") or getattr(v, "_qdtype", None) is not None:
            raise TypeError(f"{fn}: {name} must be a real number, got a 0-d {type(v).__name__} "
                            f"of dtype {dt.name}")
        v = float(v.item())
    return to_float(fn, name, v, finite)


def to_bool(fn, name, v):
    """v as a Python bool: a bool or a NumPy bool only (1 and "yes" are refused:
    TypeError)."""
    if not isinstance(v, (bool, np.bool_)):
        raise TypeError(f"{fn}: {name} must be a bool, got {type(v).__name__}")
    return bool(v)


def to_flag(fn, name, v):
    """v as a Python bool where MegEngine takes a flag: a bool, a NumPy bool
    or an int (``keepdims=1`` runs in MegEngine 1.13); anything else
    (``"yes"``, None, 1.0) raises TypeError."""
    if isinstance(v, (bool, np.bool_)):
        return bool(v)
    if isinstance(v, numbers.Integral):
        return v != 0
    raise TypeError(f"{fn}: {name} must be a bool, got {type(v).__name__} {v!r}")


def probability(fn, name, v):
    """A drop probability: a real number in [0, 1) (1 would drop everything and
    divide by zero); ValueError outside."""
    p = to_float(fn, name, v)
    if not 0.0 <= p < 1.0:
        raise ValueError(f"{fn}: {name} must be in [0, 1), got {p}")
    return p


def to_dtype(fn, name, v):
    """v as a NumPy dtype mgtrace supports (a name, a NumPy dtype or type);
    TypeError naming it otherwise."""
    try:
        return as_dtype(v)
    except TypeError as e:
        raise TypeError(f"{fn}: {name} {v!r} is not supported: {e}") from None


def to_axis(fn, name, axis, ndim):
    """One axis in range(ndim) (negative counts from the end)."""
    a = to_int(fn, name, axis)
    if not -ndim <= a < max(ndim, 1):
        raise IndexError(f"{fn}: {name} {a} is out of bounds for a tensor of dimension {ndim}")
    return a % ndim if ndim else 0


def to_shape(fn, name, shape, negative=True):
    """An int or a sequence of ints (or a 1-d integer Tensor) as a tuple;
    ``negative=False`` refuses negative entries (a result's shape; ``reshape``
    takes -1)."""
    if isinstance(shape, Tensor):
        shape = shape.tolist()
    if isinstance(shape, (int, np.integer)) and not isinstance(shape, bool):
        shape = (shape,)
    if not isinstance(shape, (tuple, list)):
        raise TypeError(f"{fn}: {name} must be an int or a sequence of ints, got {type(shape).__name__}")
    out = tuple(to_int(fn, name, s) for s in shape)
    if not negative and any(s < 0 for s in out):
        raise ValueError(f"{fn}: {name} must not have negative entries, got {out}")
    return out


_N_INTS = {1: "a 1-tuple", 2: "a pair of ints"}     # how messages say "n ints"


def ntuple(fn, name, v, n, minimum=0, allow_none=False):
    """An int or a length-n tuple or list of ints as an n-tuple, each a size
    (:func:`to_size`); ``allow_none``: a None entry stays None (an adaptive
    pool's "keep this axis"). A sequence of another length is a ValueError
    (the right type, a bad length); anything else a TypeError."""
    if isinstance(v, (tuple, list)):
        if len(v) != n:
            raise ValueError(f"{fn}: {name} must be an int or {_N_INTS.get(n, f'{n} ints')}, "
                             f"got {v!r}")
        return tuple([None if e is None and allow_none else to_size(fn, name, e, minimum)
                      for e in v])
    return (to_size(fn, name, v, minimum),) * n


def pair(fn, name, v, minimum=0, allow_none=False):
    """An int or a pair of ints as (a, b), each a size (:func:`to_size`)."""
    if type(v) is int and minimum <= v <= MAX_GEOMETRY:      # the common case, checked fast
        return (v, v)
    if type(v) is tuple and len(v) == 2:     # as a traced graph passes it (every conv call)
        a, b = v
        if type(a) is int and type(b) is int and minimum <= a <= MAX_GEOMETRY and minimum <= b <= MAX_GEOMETRY:
            return v
    return ntuple(fn, name, v, 2, minimum, allow_none)


def single(fn, name, v, minimum=0):
    """An int or a 1-sequence of ints (conv1d geometry) as a size (:func:`to_size`)."""
    return ntuple(fn, name, v, 1, minimum)[0]
