"""Tensor manipulation (reshape, transpose, concat, gather, repeat, ...) and
creation (zeros, arange, linspace, eye, ...).

Views (reshape of contiguous data, transpose, expand_dims, squeeze,
broadcast_to, flatten, split) share storage with their input, as the core's
Tensor methods do. ``repeat``, ``tile``, ``linspace`` and ``eye`` are
compositions of core ops. Names and signatures follow MegEngine's
``functional`` (``concat``, ``split(nsplits_or_sections)``,
``transpose(pattern)`` with ``"x"`` for a new axis, ``gather(x, axis,
index)``); shapes follow NumPy's rules.

Creation dtypes (MegEngine / DESIGN.md defaults): ``zeros``, ``ones``,
``linspace``, ``eye`` give float32; ``full`` takes the dtype the Python fill
value stands for (bool, int32, float32); ``arange`` gives int32 when start,
stop and step are all ints, else float32. ``device`` (a name like
``"cpu:1"`` or a Device) is honoured; None means the default device.
"""
import math as _pymath
import numbers

import numpy as np

from mgtrace._core import Tensor, as_device, tensor as _tensor
from mgtrace._core import dispatch as _dispatch
from mgtrace._core import index as _index
from mgtrace._core import nn as _nn
from mgtrace._core import args as A

_B = _dispatch.binary_ops

__all__ = [
    # manipulation
    "reshape", "flatten", "transpose", "expand_dims", "squeeze", "broadcast_to", "concat",
    "stack", "split", "gather", "scatter", "repeat", "tile", "copy", "astype",
    # creation
    "zeros", "ones", "full", "arange", "linspace", "eye", "zeros_like", "ones_like", "full_like",
]


def _x(fn, x):
    (x,) = A.tensors(fn, x=x)
    return x


# ------------------------------------------------------------------ views

def reshape(x, target_shape):
    """x's elements in a new shape (MegEngine's ``reshape``); one entry may be -1.

    A view when the strides allow it (NumPy's rule), else a copy.

    Args:
        x: Tensor (or array) of any dtype.
        target_shape: int or sequence of ints with x.size elements in all.

    Raises:
        ValueError: element counts differ, more than one -1.
        TypeError: target_shape not ints.

    >>> import mgtrace as mt, mgtrace.functional as F
    >>> F.reshape(mt.tensor([1, 2, 3, 4]), (2, -1)).tolist()
    [[1, 2], [3, 4]]
    """
    fn = "reshape"
    x = _x(fn, x)
    shape = A.to_shape(fn, "target_shape", target_shape)
    try:
        return x.reshape(shape)
    except ValueError as e:
        raise ValueError(f"{fn}: target_shape {shape}: {e}") from None


def flatten(x, start_axis=0, end_axis=-1):
    """Merge axes start_axis..end_axis into one (MegEngine's ``flatten``).

    Args:
        x: Tensor; a 0-d x gives shape (1,).
        start_axis, end_axis: ints (negative count from the end),
            start_axis <= end_axis.

    Returns:
        x.shape[:start] + (prod(x.shape[start:end+1]),) + x.shape[end+1:];
        a view when possible.

    Raises:
        IndexError: an axis out of range. ValueError: start after end.

    >>> import numpy as np, mgtrace as mt, mgtrace.functional as F
    >>> F.flatten(mt.tensor(np.zeros((2, 3, 4))), 1).shape
    (2, 12)
    """
    fn = "flatten"
    x = _x(fn, x)
    if x.ndim == 0:
        return x.reshape(1)
    s = A.to_axis(fn, "start_axis", start_axis, x.ndim)
    e = A.to_axis(fn, "end_axis", end_axis, x.ndim)
    if s > e:
        raise ValueError(f"{fn}: start_axis={start_axis} comes after end_axis={end_axis} "
                         f"for a tensor of dimension {x.ndim}")
    return x.reshape(x.shape[:s] + (-1,) + x.shape[e + 1:])


def transpose(x, pattern):
    """Permute axes (MegEngine's ``transpose``): result axis i is x's axis
    ``pattern[i]``; an ``"x"`` entry inserts a new axis of size 1. A view.

    Args:
        x: Tensor.
        pattern: sequence naming every axis of x once (ints, negatives
            allowed) plus any number of "x".

    Raises:
        ValueError: pattern does not name each axis exactly once.
        TypeError: entries that are neither ints nor "x".

    >>> import numpy as np, mgtrace as mt, mgtrace.functional as F
    >>> F.transpose(mt.tensor(np.zeros((2, 3))), (1, "x", 0)).shape
    (3, 1, 2)
    """
    fn = "transpose"
    x = _x(fn, x)
    if isinstance(pattern, (int, np.integer, str)):
        pattern = (pattern,)
    if not isinstance(pattern, (tuple, list)):
        raise TypeError(f"{fn}: pattern must be a sequence of axes and 'x', got "
                        f"{type(pattern).__name__}")
    axes, new = [], []
    for i, p in enumerate(pattern):
        if p == "x" and isinstance(p, str):
            new.append(i)
        else:
            axes.append(A.to_axis(fn, "pattern", p, x.ndim))
    if sorted(axes) != list(range(x.ndim)):
        raise ValueError(f"{fn}: pattern {tuple(pattern)} must name each of the {x.ndim} axes of x "
                         f"exactly once (x shape {x.shape})")
    y = x.transpose(tuple(axes)) if x.ndim else x
    return y.expand_dims(tuple(new)) if new else y


def expand_dims(x, axis):
    """Insert size-1 axes at ``axis`` (positions in the result; MegEngine's
    ``expand_dims``). A view.

    Raises:
        IndexError: an axis out of range of the result. ValueError: repeated axes.

    >>> import mgtrace as mt, mgtrace.functional as F
    >>> F.expand_dims(mt.tensor([1, 2]), (0, 2)).shape
    (1, 2, 1)
    """
    fn = "expand_dims"
    x = _x(fn, x)
    axes = (axis,) if not isinstance(axis, (tuple, list)) else tuple(axis)
    nd = x.ndim + len(axes)
    norm = [A.to_axis(fn, "axis", a, nd) for a in axes]
    if len(set(norm)) != len(norm):
        raise ValueError(f"{fn}: axis {axis} repeats an axis")
    return x.expand_dims(tuple(norm))


def squeeze(x, axis=None):
    """Remove size-1 axes: all of them (axis=None) or those named. A view.

    Raises:
        ValueError: a named axis whose size is not 1. IndexError: out of range.

    >>> import numpy as np, mgtrace as mt, mgtrace.functional as F
    >>> F.squeeze(mt.tensor(np.zeros((1, 3, 1))), 0).shape
    (3, 1)
    """
    fn = "squeeze"
    x = _x(fn, x)
    if axis is None:
        return x.squeeze()
    axes = (axis,) if not isinstance(axis, (tuple, list)) else tuple(axis)
    norm = [A.to_axis(fn, "axis", a, x.ndim) for a in axes]
    for a in norm:
        if x.shape[a] != 1:
            raise ValueError(f"{fn}: axis {a} of x has size {x.shape[a]}, not 1 (x shape {x.shape})")
    return x.squeeze(tuple(norm))


def broadcast_to(x, shape):
    """x repeated to ``shape`` by NumPy's broadcasting rule, as a new,
    writable tensor (MegEngine's ``broadcast_to``: writing into the result
    leaves x alone). ``x.broadcast_to(shape)``, the Tensor method, gives the
    cheaper read-only view (stride 0 on broadcast axes) instead.

    Raises:
        ValueError: x's shape does not broadcast to shape.

    >>> import mgtrace as mt, mgtrace.functional as F
    >>> y = F.broadcast_to(mt.tensor([1, 2]), (2, 2))
    >>> y[0, 0] = 5
    >>> y.tolist()
    [[5, 2], [1, 2]]
    """
    fn = "broadcast_to"
    x = _x(fn, x)
    shp = A.to_shape(fn, "shape", shape)
    ok = len(shp) >= x.ndim and all(
        s == d or s == 1 for s, d in zip(x.shape, shp[len(shp) - x.ndim:]))
    if not ok:
        raise ValueError(f"{fn}: x of shape {x.shape} does not broadcast to shape {shp} "
                         f"(NumPy broadcasting rule)")
    return x.broadcast_to(shp).copy()


# ------------------------------------------------------------------ joining and splitting

def _seq(fn, name, inps):
    if isinstance(inps, Tensor) or not isinstance(inps, (list, tuple)):
        raise TypeError(f"{fn}: {name} must be a list or tuple of tensors, got {type(inps).__name__}")
    if not inps:
        raise ValueError(f"{fn}: {name} is empty; give at least one tensor")
    ts = A.tensors(fn, **{f"{name}[{i}]": v for i, v in enumerate(inps)})
    return ts


def concat(inps, axis=0, device=None):
    """Join tensors along an existing axis (MegEngine's ``concat``).

    Args:
        inps: list or tuple of Tensors (or arrays) with equal ndim and shapes
            that agree outside ``axis``.
        axis: int.
        device: move the result there (None: the inputs' device).

    Returns:
        dtype by MegEngine promotion of the inputs; inputs of one quantized
        dtype (same scale and zero point) keep it.

    Raises:
        ValueError: empty inps, shapes that differ outside axis, devices
            that differ. IndexError: axis out of range.
        QuantizationError: quantized inputs of different quantized dtypes,
            or mixed with unquantized ones (requantize them first).

    >>> import mgtrace as mt, mgtrace.functional as F
    >>> F.concat([mt.tensor([1, 2]), mt.tensor([3.5])]).tolist()
    [1.0, 2.0, 3.5]
    """
    fn = "concat"
    ts = _seq(fn, "inps", inps)
    nd = ts[0].ndim
    if nd == 0:
        raise ValueError(f"{fn}: inps[0] is 0-d; concat needs tensors with at least 1 axis")
    ax = A.to_axis(fn, "axis", axis, nd)
    for i, t in enumerate(ts):
        if t.ndim != nd or t.shape[:ax] + t.shape[ax + 1:] != ts[0].shape[:ax] + ts[0].shape[ax + 1:]:
            raise ValueError(f"{fn}: inps[{i}] has shape {t.shape}, which differs from inps[0]'s "
                             f"{ts[0].shape} outside axis {ax}")
    if any(t._qdtype is not None for t in ts):
        from mgtrace.quantization.qdtype import common_dtype
        qdt = common_dtype(fn, ts)      # inputs of one quantized dtype, else QuantizationError
        y = _index.concat(ts, ax)
        y._qdtype = qdt
        return y if device is None else y.to(device)
    y = _index.concat(ts, ax)
    return y if device is None else y.to(device)


def stack(inps, axis=0, device=None):
    """Join same-shape tensors along a new axis (MegEngine's ``stack``).

    Args:
        inps: list or tuple of Tensors of one shape.
        axis: int, the new axis's position in the result.
        device: move the result there (None: the inputs' device).

    Returns:
        one more axis than the inputs; dtype by MegEngine promotion.

    Raises:
        ValueError: empty inps or shapes that differ. IndexError: axis out of range.

    >>> import mgtrace as mt, mgtrace.functional as F
    >>> F.stack([mt.tensor([1, 2]), mt.tensor([3, 4])], axis=1).tolist()
    [[1, 3], [2, 4]]
    """
    fn = "stack"
    ts = _seq(fn, "inps", inps)
    for i, t in enumerate(ts):
        if t.shape != ts[0].shape:
            raise ValueError(f"{fn}: inps[{i}] has shape {t.shape} but inps[0] has {ts[0].shape}; "
                             f"stack needs one shape")
    ax = A.to_axis(fn, "axis", axis, ts[0].ndim + 1)
    if any(t._qdtype is not None for t in ts):     # concat keeps (and checks) the quantized dtype
        return concat([t.expand_dims(ax) for t in ts], ax, device)
    y = _index.concat([t.expand_dims(ax) for t in ts], ax)
    return y if device is None else y.to(device)


def split(x, nsplits_or_sections, axis=0):
    """Split x into views along ``axis`` (MegEngine's ``split``).

    Args:
        x: Tensor.
        nsplits_or_sections: an int n (n equal parts; the axis size must
            divide by n), or a sequence of increasing split points.
        axis: int.

    Returns:
        list of Tensors (views).

    Raises:
        ValueError: n does not divide the axis, n < 1, points not increasing
            or out of range. IndexError: axis out of range.

    >>> import mgtrace as mt, mgtrace.functional as F
    >>> [t.tolist() for t in F.split(mt.tensor([1, 2, 3, 4, 5]), [1, 3])]
    [[1], [2, 3], [4, 5]]
    """
    fn = "split"
    x = _x(fn, x)
    if x.ndim == 0:
        raise ValueError(f"{fn}: x is 0-d; split needs at least 1 axis")
    ax = A.to_axis(fn, "axis", axis, x.ndim)
    size = x.shape[ax]
    if isinstance(nsplits_or_sections, (list, tuple)):
        pts = [A.to_int(fn, "nsplits_or_sections", p) for p in nsplits_or_sections]
        if any(b < a for a, b in zip([0] + pts, pts + [size])):
            raise ValueError(f"{fn}: split points {pts} must increase within 0..{size} "
                             f"(axis {ax} of x has size {size})")
        return _index.split(x, pts, ax)
    n = A.to_int(fn, "nsplits_or_sections", nsplits_or_sections, 1)
    if size % n:
        raise ValueError(f"{fn}: axis {ax} of x has size {size}, which does not divide into "
                         f"nsplits_or_sections={n} equal parts")
    return _index.split(x, n, ax)


# ------------------------------------------------------------------ indexing

def _gather_index(fn, x, axis, index):
    _, index = A.tensors(fn, x=x, index=index)
    A.check_int_dtype(fn, "index", index)
    ax = A.to_axis(fn, "axis", axis, x.ndim)
    if index.ndim != x.ndim:
        raise ValueError(f"{fn}: index has {index.ndim} axes but x has {x.ndim} "
                         f"(index shape {index.shape}, x shape {x.shape})")
    for k in range(x.ndim):
        if k != ax and index.shape[k] > x.shape[k]:
            raise ValueError(f"{fn}: index shape {index.shape} exceeds x shape {x.shape} on axis {k}")
    return ax, index


def gather(x, axis, index):
    """``out[i][j][k] = x[i][index[i][j][k]][k]`` for axis=1, and alike
    (MegEngine's ``gather``; torch.gather; np.take_along_axis).

    Args:
        x: Tensor [d0, ..., dn].
        axis: int.
        index: integer Tensor with x's ndim, index.shape[k] <= x.shape[k]
            for k != axis.

    Returns:
        index's shape, x's dtype.

    Raises:
        ValueError: ndim or shape mismatch. TypeError: a non-integer index.
        IndexError: index values out of range; axis out of range.

    >>> import mgtrace as mt, mgtrace.functional as F
    >>> F.gather(mt.tensor([[1, 2], [3, 4]]), 1, mt.tensor([[1, 0], [0, 0]])).tolist()
    [[2, 1], [3, 3]]
    """
    fn = "gather"
    x = _x(fn, x)
    ax, index = _gather_index(fn, x, axis, index)
    try:
        return _index.gather(x, ax, index)
    except IndexError as e:
        raise IndexError(f"{fn}: index holds a value out of range for axis {ax} of x "
                         f"(size {x.shape[ax]}): {e}") from None


def scatter(x, axis, index, source):
    """A copy of x with ``out[i][index[i][j][k]][k] = source[i][j][k]`` for
    axis=1, and alike (MegEngine's ``scatter``; torch.scatter). When index
    repeats a position the last write wins.

    Args:
        x: Tensor.
        axis: int.
        index: integer Tensor with x's ndim (shape as :func:`gather`).
        source: Tensor broadcasting to index's shape (cast to x's dtype).

    Raises:
        ValueError: ndim/shape mismatch, source not broadcastable to index.
        TypeError: non-integer index. IndexError: index out of range.

    >>> import mgtrace as mt, mgtrace.functional as F
    >>> F.scatter(mt.tensor([0, 0, 0]), 0, mt.tensor([2, 0]), mt.tensor([5, 7])).tolist()
    [7, 0, 5]
    """
    fn = "scatter"
    x = _x(fn, x)
    ax, index = _gather_index(fn, x, axis, index)
    A.check_operand(fn, "source", source)
    src_shape = A.shape_of(source)
    try:
        ok = np.broadcast_shapes(src_shape, index.shape) == index.shape
    except ValueError:
        ok = False
    if not ok:
        raise ValueError(f"{fn}: source of shape {src_shape} does not broadcast to index's shape "
                         f"{index.shape}")
    try:
        return _index.scatter(x, ax, index, source)
    except IndexError as e:
        raise IndexError(f"{fn}: index holds a value out of range for axis {ax} of x "
                         f"(size {x.shape[ax]}): {e}") from None


# ------------------------------------------------------------------ repeat, tile

def repeat(x, repeats, axis=None):
    """Repeat each element ``repeats`` times along ``axis`` (np.repeat;
    MegEngine's ``repeat``), composed as expand_dims + broadcast_to + reshape.

    Args:
        x: Tensor.
        repeats: int >= 0 (the same count for every element).
        axis: int, or None to repeat the flattened x.

    Returns:
        x's dtype; axis ``axis`` (or the flat axis) ``repeats`` times longer.

    Raises:
        TypeError: repeats not an int. ValueError: negative repeats.
        IndexError: axis out of range.

    >>> import mgtrace as mt, mgtrace.functional as F
    >>> F.repeat(mt.tensor([[1, 2], [3, 4]]), 2, axis=1).tolist()
    [[1, 1, 2, 2], [3, 3, 4, 4]]
    """
    fn = "repeat"
    x = _x(fn, x)
    r = A.to_int(fn, "repeats", repeats, 0)
    if axis is None:
        x = x.reshape(-1)
        ax = 0
    else:
        ax = A.to_axis(fn, "axis", axis, max(x.ndim, 1))
        if x.ndim == 0:
            x = x.reshape(1)
    shape = x.shape
    A.check_numel(fn, f"repeats={r}", shape[:ax] + (shape[ax] * r,) + shape[ax + 1:])
    e = x.expand_dims(ax + 1)
    b = e.broadcast_to(shape[:ax + 1] + (r,) + shape[ax + 1:])
    return b.copy().reshape(shape[:ax] + (shape[ax] * r,) + shape[ax + 1:])


def tile(x, reps):
    """Repeat the whole of x ``reps[i]`` times along axis i (np.tile;
    MegEngine's ``tile``), composed as reshape + broadcast_to + reshape.

    Args:
        x: Tensor.
        reps: int or sequence of ints >= 0. Shorter than x.ndim: ones are
            prepended; longer: x gets leading unit axes (NumPy's rule).

    Returns:
        x's dtype, shape x.shape[i] * reps[i].

    Raises:
        TypeError: reps not ints. ValueError: negative reps.

    >>> import mgtrace as mt, mgtrace.functional as F
    >>> F.tile(mt.tensor([1, 2]), (2, 2)).tolist()
    [[1, 2, 1, 2], [1, 2, 1, 2]]
    """
    fn = "tile"
    x = _x(fn, x)
    reps = A.to_shape(fn, "reps", reps)
    for r in reps:
        if r < 0:
            raise ValueError(f"{fn}: reps must be >= 0, got {reps}")
    nd = max(len(reps), x.ndim)
    reps = (1,) * (nd - len(reps)) + reps
    shape = (1,) * (nd - x.ndim) + x.shape
    A.check_numel(fn, f"reps={reps}", tuple(r * s for r, s in zip(reps, shape)))
    inter = tuple(v for s in shape for v in (1, s))
    big = tuple(v for r, s in zip(reps, shape) for v in (r, s))
    y = x.reshape(inter).broadcast_to(big).copy()
    return y.reshape(tuple(r * s for r, s in zip(reps, shape)))


def copy(x, device=None):
    """A new tensor with x's values (own storage), on ``device`` if given
    (MegEngine's ``copy``).

    >>> import mgtrace as mt, mgtrace.functional as F
    >>> x = mt.tensor([1, 2]); y = F.copy(x); y[0] = 5
    >>> x.tolist()
    [1, 2]
    """
    fn = "copy"
    x = _x(fn, x)
    if device is not None and as_device(device) != x.device:
        return x.to(device)
    return x.copy()


def astype(x, dtype):
    """x converted to ``dtype`` (always a new tensor; C casts: floats truncate
    toward zero into ints, nonzero is True).

    Raises:
        TypeError: dtype not one of mgtrace's dtypes.

    >>> import mgtrace as mt, mgtrace.functional as F
    >>> F.astype(mt.tensor([1.7, -1.7]), "int32").tolist()
    [1, -1]
    """
    fn = "astype"
    x = _x(fn, x)
    if x._qdtype is not None or "mgb_dtype" in (getattr(dtype, "metadata", None) or {}):
        return x.astype(dtype)      # quantize, dequantize or requantize (Tensor.astype)
    return _dispatch.astype(x, A.to_dtype(fn, "dtype", dtype))


__all__ += ["quantize", "dequantize"]


def quantize(x, dtype):
    """``x`` quantized to ``dtype``, a quantized dtype made by
    ``mgtrace.quantization.qint8(scale)``, ``quint8(scale, zero_point)``,
    ``qint8_narrow``, ``qint32``, ``qint4`` or ``quint4`` (MegEngine spells
    this ``x.astype(dtype)``, which works too).

    ``q = clip(rint(x / scale) + zero_point, qmin, qmax)`` in float32, round
    half to even (NumPy, ONNX QuantizeLinear; MegEngine's kernels round
    half away from zero). A quantized ``x`` is requantized.

    Args:
        x: Tensor of a real dtype (cast to float32), any shape.
        dtype: a quantized dtype.

    Returns:
        A Tensor of x's shape whose ``dtype`` is ``dtype`` (stored as int8,
        uint8 or int32): layout ops keep it, arithmetic on it raises
        QuantizationError.

    Raises:
        QuantizationError: dtype is not a quantized dtype.

    >>> import mgtrace as mt, mgtrace.functional as F
    >>> from mgtrace.quantization import quint8
    >>> F.quantize(mt.tensor([0.25, -1.0, 9.0]), quint8(0.5, 10)).numpy().tolist()
    [10, 8, 28]
    """
    from mgtrace.quantization import qdtype
    return qdtype.quantize(_x("quantize", x), dtype)


def dequantize(x):
    """The float32 values ``(q - zero_point) * scale`` of quantized ``x``
    (MegEngine's ``x.astype("float32")``).

    Args:
        x: a Tensor of a quantized dtype (:func:`quantize`).

    Returns:
        A float32 Tensor of x's shape.

    Raises:
        QuantizationError: x is not quantized.

    >>> import mgtrace as mt, mgtrace.functional as F
    >>> from mgtrace.quantization import qint8
    >>> F.dequantize(F.quantize(mt.tensor([0.26, -1.0]), qint8(0.1))).numpy().tolist()
    [0.30000001192092896, -1.0]
    """
    from mgtrace.quantization import qdtype
    return qdtype.dequantize(_x("dequantize", x))


# ------------------------------------------------------------------ creation

def _shape_arg(fn, shape):
    return A.check_numel(fn, "shape", A.to_shape(fn, "shape", shape, negative=False))


def _is_number(v):
    return isinstance(v, numbers.Number) and not isinstance(v, complex)


def full(shape, value, dtype=None, device=None):
    """A new tensor of ``shape`` filled with ``value``.

    Args:
        shape: int or sequence of ints >= 0.
        value: Python bool/int/float (or NumPy scalar).
        dtype: default the dtype the value stands for (bool, int32, float32).
        device: None for the default device.

    Raises:
        TypeError: value not a number; unsupported dtype.
        ValueError: negative shape entries.
        OverflowError: an int that does not fit dtype.

    >>> import mgtrace as mt, mgtrace.functional as F
    >>> F.full((2,), 7).tolist(), F.full((2,), 7).dtype
    ([7, 7], dtype('int32'))
    """
    return _full("full", shape, value, dtype, device)


def _full(fn, shape, value, dtype, device):
    shp = _shape_arg(fn, shape)
    if isinstance(value, np.generic):
        value = value.item()
    if not A.is_scalar(value):
        raise TypeError(f"{fn}: value must be a Python bool, int or float, got {type(value).__name__}")
    dt = None if dtype is None else A.to_dtype(fn, "dtype", dtype)
    return _dispatch.full(shp, value, dt, device)


def zeros(shape, dtype="float32", device=None):
    """A new tensor of zeros (float32 unless dtype says otherwise); see :func:`full`.

    >>> import mgtrace as mt, mgtrace.functional as F
    >>> F.zeros((2, 1)).tolist()
    [[0.0], [0.0]]
    """
    return _full("zeros", shape, 0, dtype, device)


def ones(shape, dtype="float32", device=None):
    """A new tensor of ones (float32 unless dtype says otherwise); see :func:`full`.

    >>> import mgtrace as mt, mgtrace.functional as F
    >>> F.ones(2, dtype="int8").tolist()
    [1, 1]
    """
    return _full("ones", shape, 1, dtype, device)


def _like(fn, x, value, dtype):
    x = _x(fn, x)
    return _full(fn, x.shape, value, x.dtype if dtype is None else dtype, x.device)


def zeros_like(x, dtype=None):
    """Zeros with x's shape, dtype (unless given) and device.

    >>> import mgtrace as mt, mgtrace.functional as F
    >>> F.zeros_like(mt.tensor([1, 2])).tolist()
    [0, 0]
    """
    return _like("zeros_like", x, 0, dtype)


def ones_like(x, dtype=None):
    """Ones with x's shape, dtype (unless given) and device.

    >>> import mgtrace as mt, mgtrace.functional as F
    >>> F.ones_like(mt.tensor([1.5])).tolist()
    [1.0]
    """
    return _like("ones_like", x, 1, dtype)


def full_like(x, value, dtype=None):
    """``value`` with x's shape, dtype (unless given) and device.

    >>> import mgtrace as mt, mgtrace.functional as F
    >>> F.full_like(mt.tensor([1, 2]), 3).tolist()
    [3, 3]
    """
    fn = "full_like"
    if isinstance(value, np.generic):
        value = value.item()
    if not A.is_scalar(value):
        raise TypeError(f"{fn}: value must be a Python bool, int or float, got {type(value).__name__}")
    return _like(fn, x, value, dtype)


def arange(start=0, stop=None, step=1, dtype=None, device=None):
    """Evenly spaced values in [start, stop) (NumPy's ``arange``; MegEngine's
    signature). ``arange(n)`` is ``arange(0, n)``.

    Args:
        start, stop, step: numbers; step != 0.
        dtype: default int32 when all three are ints, else float32.
        device: None for the default device.

    Returns:
        1-d tensor of ceil((stop - start) / step) values (0 if negative),
        computed in float64/int64 and converted to dtype.

    Raises:
        TypeError: non-numeric arguments. ValueError: step == 0, or more
        values than a tensor can hold (2**62). OverflowError: integer values
        that do not fit dtype (or int64).

    >>> import mgtrace as mt, mgtrace.functional as F
    >>> F.arange(4).tolist(), F.arange(0, 1, 0.25).tolist()
    ([0, 1, 2, 3], [0.0, 0.25, 0.5, 0.75])
    """
    fn = "arange"
    if stop is None:
        start, stop = 0, start
    for name, v in (("start", start), ("stop", stop), ("step", step)):
        if not _is_number(v) or isinstance(v, (bool, np.bool_)):
            raise TypeError(f"{fn}: {name} must be a number, got {type(v).__name__}")
    if step == 0:
        raise ValueError(f"{fn}: step must not be 0")
    ints = all(isinstance(v, (int, np.integer)) for v in (start, stop, step))
    if dtype is None:
        dt = np.dtype("int32") if ints else np.dtype("float32")
    else:
        dt = A.to_dtype(fn, "dtype", dtype)
    # the count and the last value in Python numbers first: NumPy's int64
    # arithmetic would wrap (arange(2**63) came out empty)
    if ints:
        start, stop, step = int(start), int(stop), int(step)
        n = max(0, -((start - stop) // step))
    else:
        span = (float(stop) - float(start)) / float(step)
        if not _pymath.isfinite(span):
            raise ValueError(f"{fn}: [{start}, {stop}) with step {step} has no finite length")
        n = max(0, _pymath.ceil(span))
    A.check_numel(fn, f"arange({start}, {stop}, {step})", (n,))
    if ints and n:
        last = start + (n - 1) * step
        lo, hi = min(start, last), max(start, last)
        info = np.iinfo(dt) if dt.kind in "iu" else np.iinfo(np.int64)
        if lo < info.min or hi > info.max:
            raise OverflowError(f"{fn}: values from {start} to {last} do not fit "
                                f"{dt.name if dt.kind in 'iu' else 'int64'}")
    # integer values go straight into an integer dtype (they fit: checked)
    work = dt if ints and dt.kind in "iu" else np.int64 if ints else np.float64
    arr = np.arange(start, stop, step, dtype=work)
    return _tensor(arr.astype(dt, copy=False), dtype=dt, device=device)


def linspace(start, stop, num, dtype="float32", device=None):
    """``num`` evenly spaced values from start to stop, both included
    (NumPy's ``linspace``; MegEngine's ``linspace``), composed of core ops:
    ``arange(num) * step + start`` in float64, the last value replaced by
    stop (``where``), then converted to dtype.

    Args:
        start, stop: numbers. num: int >= 0.
        dtype: default float32. device: None for the default device.

    Raises:
        TypeError: non-numeric start/stop, num not an int.
        ValueError: num < 0.

    >>> import mgtrace as mt, mgtrace.functional as F
    >>> F.linspace(0, 1, 5).tolist()
    [0.0, 0.25, 0.5, 0.75, 1.0]
    """
    fn = "linspace"
    start = A.to_float(fn, "start", start)
    stop = A.to_float(fn, "stop", stop)
    n = A.to_int(fn, "num", num, 0)
    A.check_numel(fn, "num", (n,))
    dt = A.to_dtype(fn, "dtype", dtype)
    idx = _dispatch.astype(arange(n, dtype="int64", device=device), "float64")
    step = (stop - start) / (n - 1) if n > 1 else 0.0
    y = _B["add"](_B["mul"](idx, step), start)
    if n > 1:   # the last value is exactly stop (NumPy), by an op rather than a write
        y = _dispatch.ternary_ops["where"](_B["eq"](idx, n - 1), stop, y)
    return _dispatch.astype(y, dt)


def eye(N, M=None, dtype="float32", device=None):
    """A 2-d tensor with ones on the diagonal and zeros elsewhere (MegEngine's
    ``eye``), composed as ``(arange(N)[:, None] == arange(M)).astype(dtype)``.

    Args:
        N: rows, int >= 0. M: columns (default N).
        dtype: default float32. device: None for the default device.

    Raises:
        TypeError: N or M not ints. ValueError: negative sizes.

    >>> import mgtrace as mt, mgtrace.functional as F
    >>> F.eye(2, 3).tolist()
    [[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]]
    """
    fn = "eye"
    n = A.to_int(fn, "N", N, 0)
    m = n if M is None else A.to_int(fn, "M", M, 0)
    A.check_numel(fn, "N, M", (n, m))
    dt = A.to_dtype(fn, "dtype", dtype)
    rows = arange(n, dtype="int64", device=device).expand_dims(1)
    cols = arange(m, dtype="int64", device=device)
    return _dispatch.astype(_B["eq"](rows, cols), dt)


# ------------------------------------------------- more of MegEngine 1.13's tensor functions
#
# Composed of core ops (views, getitem, concat, nonzero); no dedicated kernel.

__all__ += ["diag", "meshgrid", "roll", "swapaxes", "cond_take", "non_zero"]


def diag(inp, k=0):
    """A diagonal of a matrix, or a matrix with a given diagonal
    (MegEngine's ``diag``, NumPy's ``np.diag``), composed of core ops.

    Args:
        inp: a 1-d Tensor [n] (gives a 2-d [n + |k|, n + |k|] with inp on
            diagonal k, zeros elsewhere) or a 2-d Tensor [r, c] (gives the
            1-d diagonal k, empty when it lies outside).
        k: int; 0 the main diagonal, k > 0 above it, k < 0 below.

    Returns:
        inp's dtype.

    Raises:
        ValueError: inp neither 1-d nor 2-d. TypeError: k not an int.

    >>> import mgtrace as mt, mgtrace.functional as F
    >>> F.diag(mt.tensor([1, 2]), k=1).tolist()
    [[0, 1, 0], [0, 0, 2], [0, 0, 0]]
    >>> F.diag(mt.tensor([[0, 1, 2], [3, 4, 5]]), k=-1).tolist()
    [3]
    """
    fn = "diag"
    x = _x(fn, inp)
    k = A.to_int(fn, "k", k)
    if x.ndim == 1:
        n = x.shape[0]
        m = n + abs(k)
        A.check_numel(fn, "inp", (m, m))
        mask = A.as_tensor(fn, "k", np.eye(m, k=k, dtype=np.bool_), x.device)
        vals = _nn.pad(x, ((0, abs(k)),), "constant", 0) if k else x
        vals = vals.reshape(m, 1) if k >= 0 else vals.reshape(1, m)
        return _dispatch.ternary_ops["where"](mask, vals, _dispatch.astype(
            A.as_tensor(fn, "inp", np.zeros((), np.int8), x.device), x.dtype))
    if x.ndim != 2:
        raise ValueError(f"{fn}: inp must be 1-d or 2-d, got shape {x.shape}")
    r, c = x.shape
    start = k if k >= 0 else -k * c
    length = max(0, min(r, c - k) if k >= 0 else min(r + k, c))
    flat = x.reshape(r * c)
    return flat[start:start + length * (c + 1):c + 1] if length else flat[0:0]


def meshgrid(*inputs, indexing="xy"):
    """Coordinate matrices from coordinate vectors (MegEngine's
    ``meshgrid``, NumPy's ``np.meshgrid``): broadcasts, copied.

    Args:
        *inputs: 1-d Tensors of lengths N1, N2, ..., Nn (one dtype each,
            kept).
        indexing: "xy" (Cartesian: outputs [N2, N1, N3, ...]) or "ij"
            (matrix: outputs [N1, N2, N3, ...]); no effect for fewer than 2
            inputs.

    Returns:
        A list of n Tensors, all of the one output shape.

    Raises:
        ValueError: an input not 1-d, indexing not "xy" or "ij".

    >>> import mgtrace as mt, mgtrace.functional as F
    >>> [t.tolist() for t in F.meshgrid(mt.tensor([1, 2]), mt.tensor([3, 4, 5]))]
    [[[1, 2], [1, 2], [1, 2]], [[3, 3], [4, 4], [5, 5]]]
    """
    fn = "meshgrid"
    if indexing not in ("xy", "ij"):
        raise ValueError(f"{fn}: indexing must be 'xy' or 'ij', got {indexing!r}")
    ts = [_x(fn, t) for t in inputs]
    for i, t in enumerate(ts):
        if t.ndim != 1:
            raise ValueError(f"{fn}: every input must be 1-d, input {i} has shape {t.shape}")
    n = len(ts)
    lengths = [t.shape[0] for t in ts]
    if indexing == "xy" and n >= 2:
        lengths[0], lengths[1] = lengths[1], lengths[0]
    out = []
    for i, t in enumerate(ts):
        pos = i
        if indexing == "xy" and n >= 2 and i < 2:
            pos = 1 - i
        shape = [1] * n
        shape[pos] = t.shape[0]
        out.append(t.reshape(tuple(shape)).broadcast_to(tuple(lengths)).copy())
    return out


def roll(inp, shift, axis=None):
    """Elements shifted along axes, those past the end coming back at the
    start (MegEngine's ``roll``, NumPy's ``np.roll``), composed of slices and
    concat.

    Args:
        inp: Tensor of any shape.
        shift: int, or a sequence of ints (one per entry of ``axis``).
        axis: int, a sequence of ints (repeats allowed: their shifts add up),
            or None: the flattened tensor is rolled, then reshaped back.

    Returns:
        inp's shape and dtype.

    Raises:
        ValueError: shift and axis of different lengths. IndexError: an axis
            out of range. TypeError: shift or axis not ints.

    >>> import mgtrace as mt, mgtrace.functional as F
    >>> F.roll(mt.tensor([[1, 2], [3, 4], [5, 6]]), 1, axis=0).tolist()
    [[5, 6], [1, 2], [3, 4]]
    """
    fn = "roll"
    x = _x(fn, inp)
    shape = x.shape
    if axis is None:
        x, axis = x.reshape(x.size), 0
    shifts = list(shift) if isinstance(shift, (tuple, list)) else [shift]
    axes = list(axis) if isinstance(axis, (tuple, list)) else [axis]
    if len(shifts) != len(axes):
        raise ValueError(f"{fn}: shift and axis must have the same length, got {len(shifts)} "
                         f"shifts and {len(axes)} axes")
    total = {}
    for s, a in zip(shifts, axes):
        a = A.to_axis(fn, "axis", a, x.ndim)
        total[a] = total.get(a, 0) + A.to_int(fn, "shift", s)
    for a, s in total.items():
        size = x.shape[a]
        s = s % size if size else 0
        if s:
            head = (slice(None),) * a
            x = _index.concat([x[head + (slice(size - s, None),)],
                               x[head + (slice(0, size - s),)]], a)
    return x.reshape(shape) if axis == 0 and x.shape != shape else x


def swapaxes(inp, axis1, axis2):
    """inp with axes ``axis1`` and ``axis2`` interchanged (MegEngine's
    ``swapaxes``): a view.

    Raises:
        IndexError: an axis out of range. TypeError: an axis not an int.

    >>> import mgtrace as mt, mgtrace.functional as F
    >>> F.swapaxes(mt.tensor([[[0, 1], [2, 3]], [[4, 5], [6, 7]]]), 0, 2).tolist()
    [[[0, 4], [2, 6]], [[1, 5], [3, 7]]]
    """
    fn = "swapaxes"
    x = _x(fn, inp)
    a = A.to_axis(fn, "axis1", axis1, x.ndim)
    b = A.to_axis(fn, "axis2", axis2, x.ndim)
    pattern = list(range(x.ndim))
    pattern[a], pattern[b] = pattern[b], pattern[a]
    return x.transpose(*pattern) if x.ndim else x


def cond_take(mask, x):
    """The elements of x where ``mask`` is True, and their flat indices
    (MegEngine's ``cond_take``), composed of the core's ``nonzero``.

    Args:
        mask: bool Tensor of x's shape.
        x: Tensor.

    Returns:
        ``(values, indices)``: 1-d Tensors in row-major order, values of
        x's dtype, indices int32 (MegEngine) into the flattened x.

    Raises:
        TypeError: mask not bool, or an operand that is not a Tensor.
        ValueError: shapes that differ; tensors on different devices.

    >>> import mgtrace as mt, mgtrace.functional as F
    >>> v, i = F.cond_take(mt.tensor([[True, False], [False, True]]), mt.tensor([[1, 2], [3, 4]]))
    >>> v.tolist(), i.tolist()
    ([1, 4], [0, 3])
    """
    fn = "cond_take"
    for name, t in (("mask", mask), ("x", x)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{fn}: {name} must be a Tensor, got {type(t).__name__}")
    mask, x = A.tensors(fn, mask=mask, x=x)
    if mask.dtype.kind != "b":
        raise TypeError(f"{fn}: mask must be a bool tensor, got {mask.dtype.name}")
    if mask.shape != x.shape:
        raise ValueError(f"{fn}: mask has shape {mask.shape} but x has shape {x.shape}; they "
                         f"must be equal")
    flat = x.reshape(x.size)
    idx = _index.nonzero(mask.reshape(mask.size)).reshape(-1)
    return _index.gather(flat, 0, idx), idx


def non_zero(condition, as_tuple=False):
    """The coordinates of the nonzero elements of ``condition``, row-major
    (MegEngine's ``non_zero``); core op ``nonzero``.

    Args:
        condition: Tensor of any shape and dtype.
        as_tuple: False: one int32 Tensor [n, ndim] (a row per element);
            True: a tuple of ndim int32 Tensors [n] (MegEngine's rows of
            the transposed result).

    A 0-d condition gives [1, 0] when it is nonzero and [0, 0] when not
    (NumPy's ``argwhere``, ``torch.nonzero``); with ``as_tuple``, ().

    Raises:
        TypeError: condition not a Tensor.

    >>> import mgtrace as mt, mgtrace.functional as F
    >>> F.non_zero(mt.tensor([1, 1, 0, 1]), as_tuple=True)[0].tolist()
    [0, 1, 3]
    """
    fn = "non_zero"
    if not isinstance(condition, Tensor):
        raise TypeError(f"{fn}: condition must be a Tensor, got {type(condition).__name__}")
    if condition.ndim == 0:
        # NumPy's argwhere and torch.nonzero: one row of no coordinates for a
        # nonzero 0-d condition, none for a zero one
        coords = _dispatch.full((1 if bool(condition) else 0, 0), 0, dtype="int32",
                                device=condition.device)
    else:
        coords = _index.nonzero(condition)
    if as_tuple:
        return tuple(coords[:, k].copy() for k in range(coords.shape[1]))
    return coords
