"""Elementwise math, comparisons, logic, reductions, sorting, matrix products.

Thin wrappers over the core: the elementwise functions are the ops of the
core's table (``mgtrace._core.dispatch.unary_ops`` / ``binary_ops`` /
``ternary_ops``, declared in ``kernels/contract/mt_ops.h``), the rest call
``mgtrace._core.reduce`` and ``linalg``. ``norm`` and ``dot`` are
compositions of core ops.

Rules (DESIGN.md, "Tensor core"):

- Operands are Tensors, NumPy arrays/scalars, nested lists, or Python
  bool/int/float. Shapes broadcast by NumPy's rule.
- Result dtypes follow MegEngine's promotion: int8 tensor + 3 -> int8,
  int8 tensor + 3.0 -> float32, int32 tensor + float16 tensor -> float16,
  uint8 + int8 -> int16. True division and the transcendental functions
  of integer or bool inputs give float32; comparisons and predicates give
  bool; mean/var/std of integers give float32; arg-reductions and indices
  are int32.
- Errors name the function and the argument.

The elementwise functions are generated from the table below (one row per
function: the core op, what it computes, and its doctest example), so the
set, its docs and its examples stay in one place.
"""
import builtins as _builtins
import math as _pymath

import numpy as np

from mgtrace._core import Tensor
from mgtrace._core import tensor as _to_tensor
from mgtrace._core import dispatch as _dispatch
from mgtrace._core import index as _index
from mgtrace._core import linalg as _linalg
from mgtrace._core import reduce as _reduce
from mgtrace._core import args as A

_U, _B, _T = _dispatch.unary_ops, _dispatch.binary_ops, _dispatch.ternary_ops
_RULES = _dispatch.RULES

_EXAMPLE_IMPORT = ">>> import mgtrace as mt, mgtrace.functional as F\n"

_UNARY_DTYPE = {
    "same": "x's dtype",
    "float": "float dtypes keep theirs; integer and bool inputs give float32 (MegEngine)",
    "bool": "bool",
    "int": "x's dtype; integer or bool x only (TypeError for floats)",
}
_BINARY_DTYPE = {
    "same": "MegEngine promotion of x and y (e.g. int8 tensor + 3 -> int8, "
            "int8 tensor + 3.0 -> float32)",
    "float": "MegEngine promotion of x and y, then integer and bool give float32",
    "bool": "bool (x and y compared in their promoted dtype)",
    "int": "MegEngine promotion of x and y; integer or bool only (TypeError for floats)",
}

# name: (core op, what it computes, example input, example output)
_UNARY_TABLE = {
    # arithmetic
    "neg": ("neg", "-x", "[1, -2]", "[-1, 2]"),
    "abs": ("abs", "|x|", "[-1.5, 2.0]", "[1.5, 2.0]"),
    "sign": ("sign", "-1, 0 or 1 by the sign of x", "[-3, 0, 5]", "[-1, 0, 1]"),
    "square": ("square", "x * x", "[3, -2]", "[9, 4]"),
    "round": ("round", "x rounded to the nearest integer, halves to even (NumPy's round)",
              "[0.5, 1.5, -2.5]", "[0.0, 2.0, -2.0]"),
    "floor": ("floor", "the largest integer <= x", "[1.5, -1.5]", "[1.0, -2.0]"),
    "ceil": ("ceil", "the smallest integer >= x", "[1.5, -1.5]", "[2.0, -1.0]"),
    "trunc": ("trunc", "x rounded toward zero", "[1.5, -1.5]", "[1.0, -1.0]"),
    # transcendental
    "exp": ("exp", "e ** x", "[0.0]", "[1.0]"),
    "expm1": ("expm1", "e ** x - 1, accurate near 0", "[0.0]", "[0.0]"),
    "log": ("log", "the natural logarithm (nan below 0, -inf at 0)", "[1.0]", "[0.0]"),
    "log1p": ("log1p", "log(1 + x), accurate near 0", "[0.0]", "[0.0]"),
    "log2": ("log2", "the base-2 logarithm", "[8.0]", "[3.0]"),
    "sqrt": ("sqrt", "the square root (nan below 0)", "[4, 9]", "[2.0, 3.0]"),
    "rsqrt": ("rsqrt", "1 / sqrt(x)", "[4.0]", "[0.5]"),
    "sin": ("sin", "the sine (radians)", "[0.0]", "[0.0]"),
    "cos": ("cos", "the cosine (radians)", "[0.0]", "[1.0]"),
    "tan": ("tan", "the tangent (radians)", "[0.0]", "[0.0]"),
    "asin": ("asin", "the arcsine", "[0.0]", "[0.0]"),
    "acos": ("acos", "the arccosine", "[1.0]", "[0.0]"),
    "atan": ("atan", "the arctangent", "[0.0]", "[0.0]"),
    "tanh": ("tanh", "the hyperbolic tangent", "[0.0]", "[0.0]"),
    "sigmoid": ("sigmoid", "1 / (1 + exp(-x))", "[0.0]", "[0.5]"),
    "erf": ("erf", "the error function", "[0.0]", "[0.0]"),
    # predicates and logic
    "isnan": ("isnan", "whether x is NaN (never for integers)", "[1.0, float('nan')]",
              "[False, True]"),
    "isinf": ("isinf", "whether x is +-inf (never for integers)", "[1.0, float('inf')]",
              "[False, True]"),
    "isfinite": ("isfinite", "whether x is neither NaN nor +-inf", "[1.0, float('inf')]",
                 "[True, False]"),
    "logical_not": ("logical_not", "not x (nonzero is True)", "[True, False]", "[False, True]"),
}

# name: (core op, what it computes, example x, example y, example output)
_BINARY_TABLE = {
    # arithmetic
    "add": ("add", "x + y", "[1, 2]", "3", "[4, 5]"),
    "sub": ("sub", "x - y", "[1, 2]", "3", "[-2, -1]"),
    "mul": ("mul", "x * y", "[1, 2]", "1.5", "[1.5, 3.0]"),
    "div": ("truediv", "x / y (true division)", "[1, 3]", "2", "[0.5, 1.5]"),
    "floor_div": ("floordiv", "floor(x / y) (Python's //)", "[7, -7]", "2", "[3, -4]"),
    "mod": ("mod", "x - floor(x / y) * y: the sign of y, as Python's %", "[7, -7]", "3",
            "[1, 2]"),
    "pow": ("pow", "x ** y (integer operands computed in float32, as MegEngine's POW: "
                   "2 ** -1 is 0.5, never an integer 0)", "[2, 3]", "-1", "[0.5, 0.3333333432674408]"),
    "maximum": ("maximum", "the larger of x and y (NaN wins)", "[1, 5]", "3", "[3, 5]"),
    "minimum": ("minimum", "the smaller of x and y (NaN wins)", "[1, 5]", "3", "[1, 3]"),
    "atan2": ("atan2", "the angle of the point (y=x, x=y), i.e. atan(x / y) by quadrant",
              "[0.0]", "1.0", "[0.0]"),
    # comparison
    "equal": ("eq", "x == y", "[1, 2]", "2", "[False, True]"),
    "not_equal": ("ne", "x != y", "[1, 2]", "2", "[True, False]"),
    "less": ("lt", "x < y", "[1, 2]", "2", "[True, False]"),
    "less_equal": ("le", "x <= y", "[1, 2]", "2", "[True, True]"),
    "greater": ("gt", "x > y", "[1, 2]", "1", "[False, True]"),
    "greater_equal": ("ge", "x >= y", "[1, 2]", "2", "[False, True]"),
    # logic
    "logical_and": ("logical_and", "x and y (nonzero is True)", "[True, False]", "True",
                    "[True, False]"),
    "logical_or": ("logical_or", "x or y (nonzero is True)", "[True, False]", "False",
                   "[True, False]"),
    "logical_xor": ("logical_xor", "x xor y (nonzero is True)", "[True, False]", "True",
                    "[False, True]"),
}


def _unary_fn(name, op, what, ex_in, ex_out):
    core = _U[op]

    def f(x):
        return core(A.check_operand(name, "x", x))

    f.__name__ = f.__qualname__ = name
    f.__module__ = __name__
    f.__doc__ = (
        f"Elementwise {what}; core op ``{op}``.\n\n"
        f"Args:\n    x: Tensor, NumPy array, list or Python scalar, any shape.\n\n"
        f"Returns:\n    Tensor of x's shape; dtype: {_UNARY_DTYPE[_RULES[op]]}.\n\n"
        f"Raises:\n    TypeError: x is not a tensor, array or number"
        f"{'; or x is a float tensor' if _RULES[op] == 'int' else ''}.\n\n"
        f"{_EXAMPLE_IMPORT}>>> F.{name}(mt.tensor({ex_in})).tolist()\n{ex_out}\n")
    return f


def _binary_fn(name, op, what, ex_x, ex_y, ex_out):
    core = _B[op]

    def f(x, y):
        A.check_operand(name, "x", x)
        A.check_operand(name, "y", y)
        A.check_broadcast(name, x=x, y=y)
        return core(x, y)

    f.__name__ = f.__qualname__ = name
    f.__module__ = __name__
    f.__doc__ = (
        f"Elementwise {what}; core op ``{op}``.\n\n"
        f"Args:\n    x, y: Tensors, NumPy arrays, lists or Python scalars; shapes broadcast "
        f"(NumPy rule).\n\n"
        f"Returns:\n    Tensor of the broadcast shape; dtype: {_BINARY_DTYPE[_RULES[op]]}.\n\n"
        f"Raises:\n    ValueError: x and y do not broadcast, or are Tensors on different "
        f"devices.\n    TypeError: an operand that is not a tensor, array or number.\n"
        f"    OverflowError: a Python int that does not fit the promoted integer dtype.\n\n"
        f"{_EXAMPLE_IMPORT}>>> F.{name}(mt.tensor({ex_x}), {ex_y}).tolist()\n{ex_out}\n")
    return f


for _name, _row in _UNARY_TABLE.items():
    globals()[_name] = _unary_fn(_name, *_row)
for _name, _row in _BINARY_TABLE.items():
    globals()[_name] = _binary_fn(_name, *_row)
del _name, _row


def clip(x, lower=None, upper=None):
    """Elementwise ``min(max(x, lower), upper)`` (MegEngine's ``clip``).

    Args:
        x: Tensor, array or number.
        lower, upper: bounds (numbers, Tensors or arrays broadcasting with x);
            either may be None (no bound on that side), not both.

    Returns:
        Tensor of the broadcast shape; dtype by MegEngine promotion of x and
        the bounds (int tensor clipped by 0.5 -> float32).

    Raises:
        ValueError: both bounds None; number bounds with lower > upper;
            shapes that do not broadcast.
        TypeError: an operand that is not a tensor, array or number.

    >>> import mgtrace as mt, mgtrace.functional as F
    >>> F.clip(mt.tensor([-2, 0, 9]), 0, 5).tolist()
    [0, 0, 5]
    >>> F.clip(mt.tensor([-2.0, 3.0]), upper=1.0).tolist()
    [-2.0, 1.0]
    """
    fn = "clip"
    A.check_operand(fn, "x", x)
    if lower is None and upper is None:
        raise ValueError(f"{fn}: give lower, upper or both; both are None")
    ops = {"x": x}
    if lower is not None:
        ops["lower"] = A.check_operand(fn, "lower", lower)
    if upper is not None:
        ops["upper"] = A.check_operand(fn, "upper", upper)
    if A.is_scalar(lower) and A.is_scalar(upper) and lower > upper:
        raise ValueError(f"{fn}: lower={lower} is greater than upper={upper}")
    A.check_broadcast(fn, **ops)
    if lower is None:
        return _B["minimum"](x, upper)
    if upper is None:
        return _B["maximum"](x, lower)
    return _T["clip"](x, lower, upper)


def where(mask, x, y):
    """Elementwise ``x if mask else y`` (MegEngine's ``where``).

    Args:
        mask: bool Tensor or array (or a Python bool).
        x, y: Tensors, arrays or numbers; all three shapes broadcast.

    Returns:
        Tensor of the broadcast shape; dtype by MegEngine promotion of x and y.

    Raises:
        TypeError: mask not of dtype bool; operands that are not tensors.
        ValueError: shapes that do not broadcast.

    >>> import mgtrace as mt, mgtrace.functional as F
    >>> F.where(mt.tensor([True, False]), mt.tensor([1, 2]), 0.5).tolist()
    [1.0, 0.5]
    """
    fn = "where"
    A.check_operand(fn, "mask", mask)
    A.check_operand(fn, "x", x)
    A.check_operand(fn, "y", y)
    if not isinstance(mask, bool):
        dt = mask.dtype if isinstance(mask, Tensor) else getattr(mask, "dtype", None)
        if dt is None:
            dt = A.as_tensor(fn, "mask", mask).dtype
        if dt.kind != "b":
            raise TypeError(f"{fn}: mask must be a bool tensor, got {dt.name}; "
                            f"compare it first (e.g. F.not_equal(mask, 0))")
    A.check_broadcast(fn, mask=mask, x=x, y=y)
    return _T["where"](mask, x, y)


# ------------------------------------------------------------------ reductions

def _reduce_args(fn, x):
    (x,) = A.tensors(fn, x=x)
    return x


def sum(x, axis=None, keepdims=False):
    """Sum over ``axis`` (MegEngine's ``sum``).

    Args:
        x: Tensor (or array) of any dtype.
        axis: None (every axis), an int or a tuple of ints.
        keepdims: keep reduced axes with size 1.

    Returns:
        ints and floats keep their dtype, bool gives int32 (MegEngine);
        integers wrap as NumPy's int64 sum cast back. 0 over no elements.

    Raises:
        IndexError: axis out of range. ValueError: repeated axis.
        TypeError: axis not an int.

    >>> import mgtrace as mt, mgtrace.functional as F
    >>> F.sum(mt.tensor([[1, 2], [3, 4]]), axis=0).tolist()
    [4, 6]
    """
    return _reduce.sum(_reduce_args("sum", x), axis, keepdims)


def mean(x, axis=None, keepdims=False):
    """Arithmetic mean over ``axis``; floats keep their dtype, integers and
    bool give float32 (MegEngine). NaN over no elements. Args and errors as
    :func:`sum`.

    >>> import mgtrace as mt, mgtrace.functional as F
    >>> F.mean(mt.tensor([1, 2, 3, 4])).item()
    2.5
    """
    return _reduce.mean(_reduce_args("mean", x), axis, keepdims)


def prod(x, axis=None, keepdims=False):
    """Product over ``axis``; dtypes as :func:`sum`; 1 over no elements.

    >>> import mgtrace as mt, mgtrace.functional as F
    >>> F.prod(mt.tensor([[1, 2], [3, 4]]), axis=1).tolist()
    [2, 12]
    """
    return _reduce.prod(_reduce_args("prod", x), axis, keepdims)


def max(x, axis=None, keepdims=False):
    """Largest element over ``axis``, in x's dtype; NaN propagates (NumPy).

    Raises ValueError over an empty axis (no identity); others as :func:`sum`.

    >>> import mgtrace as mt, mgtrace.functional as F
    >>> F.max(mt.tensor([[1, 5], [7, 2]]), axis=1).tolist()
    [5, 7]
    """
    return _reduce.max(_reduce_args("max", x), axis, keepdims)


def min(x, axis=None, keepdims=False):
    """Smallest element over ``axis``; see :func:`max`.

    >>> import mgtrace as mt, mgtrace.functional as F
    >>> F.min(mt.tensor([[1, 5], [7, 2]]), axis=0).tolist()
    [1, 2]
    """
    return _reduce.min(_reduce_args("min", x), axis, keepdims)


def argmax(x, axis=None, keepdims=False):
    """Index of the largest element over ``axis``, int32 (MegEngine); the
    first occurrence wins, NaN counts as largest. With axis None the index
    is into the flattened tensor (NumPy).

    >>> import mgtrace as mt, mgtrace.functional as F
    >>> F.argmax(mt.tensor([[1, 5], [7, 2]]), axis=1).tolist()
    [1, 0]
    """
    return _reduce.argmax(_reduce_args("argmax", x), axis, keepdims)


def argmin(x, axis=None, keepdims=False):
    """Index of the smallest element over ``axis``; see :func:`argmax`.

    >>> import mgtrace as mt, mgtrace.functional as F
    >>> F.argmin(mt.tensor([3, 1, 1])).item()
    1
    """
    return _reduce.argmin(_reduce_args("argmin", x), axis, keepdims)


def var(x, axis=None, keepdims=False, ddof=0):
    """Variance ``sum((x - mean)**2) / (N - ddof)`` over ``axis`` (MegEngine's
    ``var`` is ddof=0; ddof=1 gives the unbiased estimate). Floats keep their
    dtype, integers give float32. Args and errors as :func:`sum`.

    >>> import mgtrace as mt, mgtrace.functional as F
    >>> F.var(mt.tensor([1.0, 2.0, 3.0, 4.0])).item()
    1.25
    """
    return _reduce.var(_reduce_args("var", x), axis, keepdims, A.to_float("var", "ddof", ddof))


def std(x, axis=None, keepdims=False, ddof=0):
    """Standard deviation: sqrt(:func:`var`); same arguments and dtypes.

    >>> import mgtrace as mt, mgtrace.functional as F
    >>> F.std(mt.tensor([1.0, 3.0])).item()
    1.0
    """
    return _reduce.std(_reduce_args("std", x), axis, keepdims, A.to_float("std", "ddof", ddof))


def _to_float(x):
    return x if x.dtype.kind in "fV" else _dispatch.astype(x, "float32")


def norm(x, ord=2, axis=None, keepdims=False):
    """Vector p-norm over ``axis`` (MegEngine's ``norm``; NumPy's vector norms),
    composed of core ops.

    ord: 2 -> sqrt(sum(x**2)); 1 -> sum(|x|); inf -> max(|x|); -inf ->
    min(|x|); 0 -> number of nonzeros; other p != 0 -> sum(|x|**p)**(1/p).

    Args:
        x: Tensor; integers and bool are computed in float32.
        ord: a number (see above).
        axis: None (all elements, as one flat vector), an int or a tuple.
        keepdims: keep the reduced axes with size 1.

    Returns:
        float Tensor (x's float dtype, else float32).

    Raises:
        TypeError: ord not a number; axis not an int. IndexError: axis out
            of range. ValueError: inf/-inf norms of an empty axis.

    >>> import mgtrace as mt, mgtrace.functional as F
    >>> F.norm(mt.tensor([3, 4])).item()
    5.0
    >>> F.norm(mt.tensor([[1.0, -2.0]]), ord=1, axis=1).tolist()
    [3.0]
    """
    fn = "norm"
    x = _to_float(_reduce_args(fn, x))
    p = A.to_float(fn, "ord", ord)
    if p == 2.0:
        return _U["sqrt"](_reduce.sum(_B["mul"](x, x), axis, keepdims))
    if p == 0.0:
        nz = _dispatch.astype(_B["ne"](x, 0), x.dtype)
        return _reduce.sum(nz, axis, keepdims)
    ax = _U["abs"](x)
    if p == _pymath.inf:
        return _reduce.max(ax, axis, keepdims)
    if p == -_pymath.inf:
        return _reduce.min(ax, axis, keepdims)
    if p == 1.0:
        return _reduce.sum(ax, axis, keepdims)
    return _B["pow"](_reduce.sum(_B["pow"](ax, p), axis, keepdims), 1.0 / p)


def cumsum(x, axis):
    """Running sum along ``axis`` (MegEngine's ``cumsum``).

    Args:
        x: Tensor of any dtype.
        axis: int (None: over the flattened tensor, as NumPy).

    Returns:
        x's shape; dtypes as :func:`sum` (bool gives int32).

    Raises:
        IndexError: axis out of range. TypeError: axis not an int.

    >>> import mgtrace as mt, mgtrace.functional as F
    >>> F.cumsum(mt.tensor([[1, 2], [3, 4]]), axis=1).tolist()
    [[1, 3], [3, 7]]
    """
    return _reduce.cumsum(_reduce_args("cumsum", x), axis)


# ------------------------------------------------------------------ sorting

def sort(x, descending=False, axis=-1):
    """Sorted values and their indices along ``axis`` (MegEngine's ``sort``).

    Stable; NaN sorts last ascending and first descending.

    Args:
        x: Tensor of any dtype.
        descending: largest first.
        axis: int, default the last axis.

    Returns:
        (values, indices): values in x's dtype, indices int32, both x's shape.

    Raises:
        IndexError: axis out of range. TypeError: axis not an int.

    >>> import mgtrace as mt, mgtrace.functional as F
    >>> v, i = F.sort(mt.tensor([3, 1, 2]))
    >>> v.tolist(), i.tolist()
    ([1, 2, 3], [1, 2, 0])
    """
    return _reduce.sort(_reduce_args("sort", x), axis, bool(descending))


def argsort(x, descending=False, axis=-1):
    """The int32 indices that sort x along ``axis``; see :func:`sort`.

    >>> import mgtrace as mt, mgtrace.functional as F
    >>> F.argsort(mt.tensor([3.0, 1.0, 2.0]), descending=True).tolist()
    [0, 2, 1]
    """
    return _reduce.argsort(_reduce_args("argsort", x), axis, bool(descending))


def topk(x, k, descending=False, kth_only=False, no_sort=False, axis=-1):
    """The k smallest (or, with ``descending=True``, largest) elements along
    ``axis`` (MegEngine's ``topk``: note the default is the k *smallest*,
    unlike PyTorch's).

    Args:
        x: Tensor of any dtype, [..., n, ...].
        k: int, 1 <= k <= n (0 is allowed unless kth_only).
        descending: pick the largest instead of the smallest.
        kth_only: return only the k-th value (the axis removed) and None.
        no_sort: leave the k picked in an unspecified, deterministic order.
        axis: int, default the last axis.

    Returns:
        (values, indices): [..., k, ...], values in x's dtype, indices int32;
        ties keep the lower index. With kth_only: (kth values, None).

    Raises:
        TypeError: k or axis not an int. ValueError: k out of range.
        IndexError: axis out of range.

    >>> import mgtrace as mt, mgtrace.functional as F
    >>> v, i = F.topk(mt.tensor([1, 9, 3, 7]), 2, descending=True)
    >>> v.tolist(), i.tolist()
    ([9, 7], [1, 3])
    >>> F.topk(mt.tensor([1, 9, 3, 7]), 2, kth_only=True)[0].item()
    3
    """
    fn = "topk"
    x = _reduce_args(fn, x)
    kk = A.to_int(fn, "k", k, 1 if kth_only else 0)
    ax = A.to_axis(fn, "axis", axis, _builtins.max(x.ndim, 1))
    n = x.shape[ax] if x.ndim else 1
    if kk > n:
        raise ValueError(f"{fn}: k={kk} is larger than the {n} elements along axis {ax}")
    values, indices = _reduce.topk(x, kk, ax, bool(descending), not (no_sort or kth_only))
    if kth_only:
        # the k-th is the extreme of the k selected
        kth = (_reduce.min if descending else _reduce.max)(values, ax) if x.ndim else values
        return kth, None
    return values, indices


# ------------------------------------------------------------------ products

def matmul(a, b, transpose_a=False, transpose_b=False):
    """Matrix product with NumPy's ``matmul`` semantics (MegEngine's ``matmul``).

    Args:
        a: [..., M, K] or [K] (a 1-d operand gets a unit axis, removed after).
        b: [..., K, N] or [K]. Leading (batch) axes broadcast (NumPy rule).
        transpose_a, transpose_b: swap the last two axes of a or b first
            (2-d or more only).

    Returns:
        [..., M, N]; dtype by MegEngine promotion of a and b (float16 and
        bfloat16 computed in float32; integers accumulate in int64 and wrap).

    Raises:
        ValueError: 0-d operands, K mismatch, batch shapes that do not
            broadcast, transposing a 1-d operand, tensors on different devices.
        TypeError: bool operands; non-tensor operands.

    >>> import mgtrace as mt, mgtrace.functional as F
    >>> F.matmul(mt.tensor([[1.0, 2.0], [3.0, 4.0]]), mt.tensor([1.0, 1.0])).tolist()
    [3.0, 7.0]
    """
    fn = "matmul"
    a, b = A.tensors(fn, a=a, b=b)
    for name, t, tr in (("a", a, transpose_a), ("b", b, transpose_b)):
        if t.ndim == 0:
            raise ValueError(f"{fn}: {name} must have at least 1 axis, got a 0-d tensor "
                             f"(use F.mul for scalars)")
        if tr and t.ndim < 2:
            raise ValueError(f"{fn}: transpose_{name} needs {name} with 2 or more axes, got "
                             f"shape {t.shape}")
        if t.dtype.kind == "b":
            raise TypeError(f"{fn}: {name} must not be bool; cast it to an integer or float dtype")
    if transpose_a:
        a = a.transpose(tuple(range(a.ndim - 2)) + (a.ndim - 1, a.ndim - 2))
    if transpose_b:
        b = b.transpose(tuple(range(b.ndim - 2)) + (b.ndim - 1, b.ndim - 2))
    ka = a.shape[-1]
    kb = b.shape[-2] if b.ndim >= 2 else b.shape[0]
    if ka != kb:
        raise ValueError(f"{fn}: a has {ka} columns but b has {kb} rows "
                         f"(a shape {a.shape}, b shape {b.shape})")
    try:
        A.check_broadcast(fn, a_batch=_batch(a.shape), b_batch=_batch(b.shape))
    except ValueError:
        raise ValueError(f"{fn}: the batch axes of a {a.shape[:-2]} and b {b.shape[:-2]} do not "
                         f"broadcast (NumPy rule)") from None
    return _linalg.matmul(a, b)


def _batch(shape):
    """A dummy array with the batch axes of ``shape`` (for broadcast checks)."""
    return np.empty(tuple(shape[:-2]) if len(shape) > 2 else (), dtype=np.bool_)


def dot(x, y):
    """Inner product of two 1-d tensors: ``sum(x * y)`` as a 0-d tensor
    (MegEngine's ``dot``), computed by the core's matmul.

    Args:
        x, y: 1-d [K] tensors (or arrays) of the same length.

    Returns:
        0-d Tensor; dtype by MegEngine promotion of x and y.

    Raises:
        ValueError: an operand not 1-d, or lengths that differ.
        TypeError: bool operands.

    >>> import mgtrace as mt, mgtrace.functional as F
    >>> F.dot(mt.tensor([1.0, 2.0]), mt.tensor([3.0, 4.0])).item()
    11.0
    """
    fn = "dot"
    x, y = A.tensors(fn, x=x, y=y)
    A.check_ndim(fn, "x", x, 1, "[K]")
    A.check_ndim(fn, "y", y, 1, "[K]")
    if x.shape != y.shape:
        raise ValueError(f"{fn}: x has {x.shape[0]} elements but y has {y.shape[0]}")
    for name, t in (("x", x), ("y", y)):
        if t.dtype.kind == "b":
            raise TypeError(f"{fn}: {name} must not be bool; cast it to an integer or float dtype")
    return _linalg.matmul(x, y)


__all__ = (list(_UNARY_TABLE) + list(_BINARY_TABLE) + [
    "clip", "where",
    "sum", "mean", "prod", "max", "min", "argmax", "argmin", "var", "std", "norm", "cumsum",
    "sort", "argsort", "topk",
    "matmul", "dot", "matinv",
])


def matinv(inp):
    """The inverse of each matrix in a batch (MegEngine's ``matinv``):
    Gauss-Jordan elimination with partial pivoting, composed of core ops
    (one elimination step per row; the batch is processed at once).

    Args:
        inp: float [..., n, n] (n >= 1).

    Returns:
        [..., n, n] in inp's dtype (float16/bfloat16 computed in float32).
        A singular matrix gives inf or nan entries (as a division by a zero
        pivot does); no error is raised.

    Raises:
        ValueError: fewer than 2 axes, or the last two axes differ.
        TypeError: integer or bool inp.

    >>> import mgtrace as mt, mgtrace.functional as F
    >>> F.matinv(mt.tensor([[1.0, 0.0], [1.0, 1.0]])).tolist()
    [[1.0, 0.0], [-1.0, 1.0]]
    """
    fn = "matinv"
    (x,) = A.tensors(fn, inp=inp)
    A.check_float(fn, "inp", x)
    if x.ndim < 2 or x.shape[-1] != x.shape[-2]:
        raise ValueError(f"{fn}: inp must be [..., n, n] (square matrices), got shape {x.shape}")
    n = x.shape[-1]
    dt = "float64" if x.dtype == np.float64 else "float32"
    a = _dispatch.astype(x, dt)
    batch = x.shape[:-2]
    rows = _to_tensor(np.arange(n, dtype=np.int32).reshape(n, 1), device=x.device)
    eye = _dispatch.astype(_B["eq"](rows, rows.reshape(1, n)), dt).broadcast_to(batch + (n, n))
    aug = _index.concat([a, eye], -1)                            # [..., n, 2n]
    width = (2 * n,)
    for k in range(n):
        # pivot: the row at or below k with the largest |value| in column k
        p = _B["add"](_reduce.argmax(_U["abs"](aug[..., k:, k]), -1, True), k)    # [..., 1]
        p = _dispatch.astype(p, "int32").expand_dims(-1)                          # [..., 1, 1]
        row_k = aug[..., k:k + 1, :]
        row_p = _index.gather(aug, x.ndim - 2, p.broadcast_to(batch + (1,) + width).copy())
        is_k = _B["eq"](rows, k)
        aug = _T["where"](is_k, row_p, _T["where"](_B["eq"](rows, p), row_k, aug))
        row = _B["truediv"](aug[..., k:k + 1, :], aug[..., k:k + 1, k:k + 1])
        aug = _T["where"](is_k, row, _B["sub"](aug, _B["mul"](aug[..., :, k:k + 1], row)))
    return _dispatch.astype(aug[..., :, n:], x.dtype)


# ------------------------------------------------- composed elementwise (MegEngine 1.13 names)
#
# MegEngine's elemwise.py has these as Elemwise modes (SINH, COSH, ASINH, ACOSH,
# ATANH, LOG_SUM_EXP, SHL, SHR); here they are composed of the core ops above
# (no dedicated kernel yet), with the formulas chosen to stay accurate near 0
# and finite where the result is.

__all__ += ["sinh", "cosh", "asinh", "acosh", "atanh", "logaddexp", "left_shift",
            "right_shift", "cross"]

_LN2 = _pymath.log(2.0)


def _float_operand(fn, x):
    """x as a float Tensor in the dtype the computation runs in, and the
    dtype of the result: float32/float64 keep theirs; float16/bfloat16 are
    computed in float32 and cast back; integers and bool give float32
    (MegEngine's rule for transcendental functions)."""
    (x,) = A.tensors(fn, x=x)
    if x.dtype.kind in "fV":
        out = x.dtype
        return (x if x.dtype in (np.float32, np.float64) else _dispatch.astype(x, "float32")), out
    return _dispatch.astype(x, "float32"), np.dtype("float32")


def _back(y, dtype):
    return y if y.dtype == dtype else _dispatch.astype(y, dtype)


def sinh(x):
    """Elementwise hyperbolic sine (MegEngine's ``sinh``), composed as
    ``(expm1(x) - expm1(-x)) / 2`` (accurate near 0), and as
    ``sign(x) * e * (e / 2)`` with ``e = exp(|x| / 2)`` above |x| = 20 (finite
    up to the dtype's largest value); no dedicated kernel yet.

    Args:
        x: Tensor, array or number, any shape.

    Returns:
        x's shape; float dtypes keep theirs, integers and bool give float32.

    Raises:
        TypeError: x is not a tensor, array or number.

    >>> import mgtrace as mt, mgtrace.functional as F
    >>> print(F.sinh(mt.tensor([0.0, 1.0])).numpy().round(4))
    [0.     1.1752]
    """
    x, dt = _float_operand("sinh", A.check_operand("sinh", "x", x))
    small = _B["mul"](_B["sub"](_U["expm1"](x), _U["expm1"](_U["neg"](x))), 0.5)
    return _back(_T["where"](_B["gt"](_U["abs"](x), 20.0), _B["mul"](_U["sign"](x), _half_exp(x)),
                             small), dt)


def cosh(x):
    """Elementwise hyperbolic cosine (MegEngine's ``cosh``), composed as
    ``(exp(x) + exp(-x)) / 2``, above |x| = 20 as :func:`sinh` (no dedicated
    kernel yet). Dtypes and errors as :func:`sinh`.

    >>> import mgtrace as mt, mgtrace.functional as F
    >>> print(F.cosh(mt.tensor([0.0, 1.0])).numpy().round(4))
    [1.     1.5431]
    """
    x, dt = _float_operand("cosh", A.check_operand("cosh", "x", x))
    small = _B["mul"](_B["add"](_U["exp"](x), _U["exp"](_U["neg"](x))), 0.5)
    return _back(_T["where"](_B["gt"](_U["abs"](x), 20.0), _half_exp(x), small), dt)


def _half_exp(x):
    """exp(|x|) / 2 as exp(|x| / 2) * (exp(|x| / 2) / 2): finite up to the
    dtype's largest value (exp(|x|) alone overflows first)."""
    e = _U["exp"](_B["mul"](_U["abs"](x), 0.5))
    return _B["mul"](e, _B["mul"](e, 0.5))


def asinh(x):
    """Elementwise inverse hyperbolic sine (MegEngine's ``asinh``), composed
    as ``sign(x) * log1p(|x| + x^2 / (1 + sqrt(1 + x^2)))``, and
    ``sign(x) * (log|x| + log 2)`` above |x| = 2**26 where x^2 would lose it
    (no dedicated kernel yet). Dtypes and errors as :func:`sinh`.

    >>> import mgtrace as mt, mgtrace.functional as F
    >>> print(F.asinh(mt.tensor([-1.0, 0.0, 1.0])).numpy().round(4))
    [-0.8814  0.      0.8814]
    """
    x, dt = _float_operand("asinh", A.check_operand("asinh", "x", x))
    a = _U["abs"](x)
    a2 = _B["mul"](a, a)
    small = _U["log1p"](_B["add"](a, _B["truediv"](a2, _B["add"](_U["sqrt"](_B["add"](a2, 1.0)),
                                                                  1.0))))
    big = _B["add"](_U["log"](a), _LN2)
    y = _T["where"](_B["gt"](a, 2.0 ** 26), big, small)
    return _back(_B["mul"](_U["sign"](x), y), dt)


def acosh(x):
    """Elementwise inverse hyperbolic cosine (MegEngine's ``acosh``): NaN
    below 1. Composed as ``log1p(t + sqrt(2t + t^2))`` with ``t = x - 1``,
    and ``log(x) + log 2`` above 2**26 (no dedicated kernel yet). Dtypes and
    errors as :func:`sinh`.

    >>> import mgtrace as mt, mgtrace.functional as F
    >>> print(F.acosh(mt.tensor([1.0, 2.0])).numpy().round(4))
    [0.    1.317]
    """
    x, dt = _float_operand("acosh", A.check_operand("acosh", "x", x))
    t = _B["sub"](x, 1.0)
    small = _U["log1p"](_B["add"](t, _U["sqrt"](_B["add"](_B["mul"](t, 2.0), _B["mul"](t, t)))))
    big = _B["add"](_U["log"](x), _LN2)
    return _back(_T["where"](_B["gt"](x, 2.0 ** 26), big, small), dt)


def atanh(x):
    """Elementwise inverse hyperbolic tangent (MegEngine's ``atanh``):
    +-inf at +-1, NaN outside [-1, 1]. Composed as
    ``sign(x) * log1p(2|x| / (1 - |x|)) / 2`` (no dedicated kernel yet). Dtypes and errors
    as :func:`sinh`.

    >>> import mgtrace as mt, mgtrace.functional as F
    >>> print(F.atanh(mt.tensor([0.0, 0.5])).numpy().round(4))
    [0.     0.5493]
    """
    x, dt = _float_operand("atanh", A.check_operand("atanh", "x", x))
    a = _U["abs"](x)                      # atanh is odd: no cancellation in 1 + 2a / (1 - a)
    y = _U["log1p"](_B["truediv"](_B["mul"](a, 2.0), _B["sub"](1.0, a)))
    return _back(_B["mul"](y, _B["mul"](_U["sign"](x), 0.5)), dt)


def logaddexp(x, y):
    """Elementwise ``log(exp(x) + exp(y))`` without overflow (MegEngine's
    ``logaddexp``, NumPy's): ``max(x, y) + log1p(exp(-|x - y|))``, composed
    of core ops (no dedicated kernel yet). Equal infinities give that
    infinity; a NaN gives NaN.

    Args:
        x, y: Tensors, arrays or numbers; shapes broadcast (NumPy rule).

    Returns:
        The broadcast shape; MegEngine promotion of x and y, then integer and
        bool give float32 (float16/bfloat16 are computed in float32).

    Raises:
        ValueError: shapes that do not broadcast. TypeError: an operand
            that is not a tensor, array or number.

    >>> import mgtrace as mt, mgtrace.functional as F
    >>> print(F.logaddexp(mt.tensor([0.0, 1.0]), 0.0).numpy().round(4))
    [0.6931 1.3133]
    """
    fn = "logaddexp"
    A.check_operand(fn, "x", x)
    A.check_operand(fn, "y", y)
    A.check_broadcast(fn, x=x, y=y)
    m = _B["maximum"](x, y)             # the promoted dtype (MegEngine's rule), NaN wins
    dt = m.dtype if m.dtype.kind in "fV" else np.dtype("float32")
    run = "float64" if dt == np.float64 else "float32"
    x, y = (_dispatch.astype(A.as_tensor(fn, n, v, m.device), run) for n, v in (("x", x), ("y", y)))
    m = _B["maximum"](x, y)
    d = _T["where"](_B["eq"](x, y), 0.0, _U["neg"](_U["abs"](_B["sub"](x, y))))
    return _back(_B["add"](m, _U["log1p"](_U["exp"](d))), dt)


def left_shift(x, y):
    """Elementwise ``x << y`` of integers (MegEngine's ``left_shift``);
    core op ``left_shift``.

    Args:
        x, y: integer Tensors, arrays or Python ints; shapes broadcast.

    Returns:
        The broadcast shape; MegEngine promotion of x and y.

    Raises:
        TypeError: a float operand. ValueError: shapes that do not broadcast.

    >>> import mgtrace as mt, mgtrace.functional as F
    >>> F.left_shift(mt.tensor([1, 2, 3]), 1).tolist()
    [2, 4, 6]
    """
    fn = "left_shift"
    A.check_operand(fn, "x", x)
    A.check_operand(fn, "y", y)
    A.check_broadcast(fn, x=x, y=y)
    return _B["left_shift"](x, y)


def right_shift(x, y):
    """Elementwise ``x >> y`` of integers (MegEngine's ``right_shift``;
    arithmetic for signed integers); core op ``right_shift``. Args, dtypes
    and errors as :func:`left_shift`.

    >>> import mgtrace as mt, mgtrace.functional as F
    >>> F.right_shift(mt.tensor([2, 4, 8]), 1).tolist()
    [1, 2, 4]
    """
    fn = "right_shift"
    A.check_operand(fn, "x", x)
    A.check_operand(fn, "y", y)
    A.check_broadcast(fn, x=x, y=y)
    return _B["right_shift"](x, y)


def _components(fn, name, t, axis):
    """The components of the vectors of t along ``axis`` (2 or 3 of them,
    the third 0 for 2-vectors), each with that axis removed."""
    ax = A.to_axis(fn, name, axis, t.ndim)
    n = t.shape[ax]
    if n not in (2, 3):
        raise ValueError(f"{fn}: the vectors of {name.replace('axis', '') or 'a'} must have 2 or "
                         f"3 components along axis {axis}, got {n}")
    parts = [_index.getitem(t, (slice(None),) * ax + (i,)) for i in range(n)]
    if n == 2:
        parts.append(_B["mul"](parts[0], 0))
    return parts


def cross(a, b, axisa=-1, axisb=-1, axisc=-1, axis=None):
    """Cross product of (arrays of) 3-vectors (MegEngine's ``cross``,
    NumPy's ``np.cross``), composed of core ops (no dedicated kernel yet).

    Vectors with 2 components are taken with a third component 0 (as
    MegEngine does for 2-vectors), so the result always has 3 components.

    Args:
        a, b: Tensors (or arrays) whose axes ``axisa`` / ``axisb`` hold the
            vectors (2 or 3 components); the other axes broadcast.
        axisa, axisb: the vector axis of a and of b (default: the last).
        axisc: the axis of the result that holds the 3 components.
        axis: if given, overrides axisa, axisb and axisc.

    Returns:
        Tensor of the broadcast batch shape with 3 components at ``axisc``;
        dtype by MegEngine promotion of a and b.

    Raises:
        ValueError: a vector axis of another length than 2 or 3; batch
            shapes that do not broadcast. IndexError: an axis out of range.
        TypeError: operands that are not tensors or arrays.

    >>> import mgtrace as mt, mgtrace.functional as F
    >>> F.cross(mt.tensor([1.0, 2.0, 3.0]), mt.tensor([4.0, 5.0, 6.0])).tolist()
    [-3.0, 6.0, -3.0]
    """
    fn = "cross"
    a, b = A.tensors(fn, a=a, b=b)
    if axis is not None:
        axisa = axisb = axisc = axis
    a0, a1, a2 = _components(fn, "axisa", a, axisa)
    b0, b1, b2 = _components(fn, "axisb", b, axisb)
    A.check_broadcast(fn, a=a0, b=b0)
    c = [_B["sub"](_B["mul"](a1, b2), _B["mul"](a2, b1)),
         _B["sub"](_B["mul"](a2, b0), _B["mul"](a0, b2)),
         _B["sub"](_B["mul"](a0, b1), _B["mul"](a1, b0))]
    ndim = c[0].ndim + 1
    return _index.stack(c, A.to_axis(fn, "axisc", axisc, ndim))


__all__ += ["svd"]


def _jacobi_svd(a, sweeps):
    """One-sided Jacobi (Hestenes) on the columns of a [..., m, n], m >= n:
    plane rotations of column pairs until they are orthogonal. Returns
    (U [..., m, n] with orthogonal columns of norms S, V [..., n, n])."""
    n = a.shape[-1]
    batch = a.shape[:-2]
    u = a.copy()
    v = _to_tensor(np.broadcast_to(np.eye(n, dtype=a.dtype), batch + (n, n)).copy(),
                   device=a.device)
    eps = float(np.finfo(a.dtype).eps)
    for _ in range(sweeps):
        worst = 0.0
        for p in range(n - 1):
            for q in range(p + 1, n):
                up, uq = u[..., :, p], u[..., :, q]
                alpha = _reduce.sum(_B["mul"](up, up), -1, True)
                beta = _reduce.sum(_B["mul"](uq, uq), -1, True)
                gamma = _reduce.sum(_B["mul"](up, uq), -1, True)
                scale = _U["sqrt"](_B["mul"](alpha, beta))
                off = _B["truediv"](_U["abs"](gamma), _B["maximum"](scale, np.finfo(a.dtype).tiny))
                worst = _builtins.max(worst, float(_reduce.max(off).item()) if off.size else 0.0)
                zero = _B["eq"](gamma, 0)
                zeta = _B["truediv"](_B["sub"](beta, alpha),
                                     _B["mul"](_T["where"](zero, 1.0, gamma), 2.0))
                t = _B["truediv"](_U["sign"](zeta), _B["add"](
                    _U["abs"](zeta), _U["sqrt"](_B["add"](_B["mul"](zeta, zeta), 1.0))))
                t = _T["where"](zero, 0.0, _T["where"](_B["eq"](zeta, 0), 1.0, t))
                c = _U["rsqrt"](_B["add"](_B["mul"](t, t), 1.0))
                s = _B["mul"](c, t)
                for m in (u, v):
                    mp, mq = m[..., :, p].copy(), m[..., :, q]
                    m[..., :, p] = _B["sub"](_B["mul"](c, mp), _B["mul"](s, mq))
                    m[..., :, q] = _B["add"](_B["mul"](s, mp), _B["mul"](c, mq))
        if worst <= eps * n:
            break
    return u, v



def svd(inp, full_matrices=False, compute_uv=True):
    """Singular value decomposition ``inp = U @ diag(S) @ Vh`` of a matrix or
    a batch of them (MegEngine's ``svd``), singular values in descending
    order. Composed of core ops: one-sided Jacobi rotations of column pairs
    (Hestenes' method) until every pair is orthogonal to machine precision
    (at most 30 sweeps), then a sort; no dedicated kernel, and no NumPy
    call. Meant for the small matrices models hold (the work grows as n^3
    per sweep, in many small ops).

    Args:
        inp: float [..., M, N] (float16/bfloat16 computed in float32).
        full_matrices: False (MegEngine's default) gives U [..., M, K] and
            Vh [..., K, N], K = min(M, N). True is refused unless M == N
            (as MegEngine's CPU kernel refuses full matrices with U and Vh).
        compute_uv: False computes S only.

    Returns:
        ``(U, S, Vh)``, S [..., K] in inp's float dtype; with
        ``compute_uv=False`` the tuple ``(None, S, None)`` (MegEngine's
        three outputs). U's columns and Vh's rows are each determined up to
        sign (and, for repeated singular values, up to a rotation).

    Raises:
        ValueError: fewer than 2 axes; full_matrices=True for a non-square
            matrix. TypeError: integer or bool inp.

    >>> import mgtrace as mt, mgtrace.functional as F
    >>> u, s, vh = F.svd(mt.tensor([[3.0, 0.0], [0.0, -4.0]]))
    >>> s.tolist()
    [4.0, 3.0]
    """
    fn = "svd"
    (x,) = A.tensors(fn, inp=inp)
    A.check_float(fn, "inp", x)
    if x.ndim < 2:
        raise ValueError(f"{fn}: inp must be [..., M, N], got shape {x.shape}")
    m, n = x.shape[-2:]
    if A.to_bool(fn, "full_matrices", full_matrices) and m != n and compute_uv:
        raise ValueError(f"{fn}: full_matrices=True needs square matrices (MegEngine's CPU "
                         f"kernel refuses it with compute_uv too), got {m}x{n}")
    dt = "float64" if x.dtype == np.float64 else "float32"
    a = _dispatch.astype(x, dt)
    tall = m >= n
    perm = tuple(range(x.ndim - 2)) + (x.ndim - 1, x.ndim - 2)
    if not tall:
        a = a.transpose(*perm)
    k = _builtins.min(m, n)
    if k == 0:
        s = _B["mul"](_reduce.sum(a, (-1, -2), False).expand_dims(-1)[..., :0], 1)
        u = _to_tensor(np.zeros(x.shape[:-2] + (m, 0), dt), device=x.device)
        vh = _to_tensor(np.zeros(x.shape[:-2] + (0, n), dt), device=x.device)
        return (u, s, vh) if compute_uv else (None, s, None)
    u, v = _jacobi_svd(a.copy(), 30)
    s = _U["sqrt"](_reduce.sum(_B["mul"](u, u), -2, False))                 # [..., k]
    order = _reduce.argsort(s, -1, True)                                     # descending
    s = _index.gather(s, s.ndim - 1, order)
    if not compute_uv:
        return None, _dispatch.astype(s, x.dtype), None
    cols = order.expand_dims(-2)
    u = _index.gather(u, u.ndim - 1, cols.broadcast_to(u.shape).copy())
    v = _index.gather(v, v.ndim - 1, cols.broadcast_to(v.shape).copy())
    u = _B["truediv"](u, _T["where"](_B["eq"](s, 0), 1.0, s).expand_dims(-2))
    if tall:
        uu, vh = u, v.transpose(*perm)
    else:
        uu, vh = v, u.transpose(*perm)
    out = (uu.copy(), s, vh.copy())
    return tuple(_dispatch.astype(t, x.dtype) for t in out)


# ------------------------------------------------- complex numbers (MegEngine 1.13's math.py)
#
# The core holds complex64 and complex128 (interleaved re, im pairs; NumPy's
# layout). Elementwise add, sub, mul, truediv, neg, eq, ne and abs take
# complex operands, with MegEngine's promotion rule (complex is the category
# above float: a complex operand wins, a Python complex stands for complex64);
# every other op refuses complex with an error naming op and dtype, and a
# cast from complex to a real dtype is a TypeError (it would drop the
# imaginary part).

__all__ += ["complex", "real", "imag", "polar"]


def _complex_parts(fn, a_name, a, b_name, b):
    """a and b as Tensors of one float dtype the core makes complex from:
    float64 stays (complex128), float32/float16/bfloat16, integers and bool
    become float32 (complex64: MegEngine's one complex dtype)."""
    A.check_operand(fn, a_name, a)
    A.check_operand(fn, b_name, b)
    A.check_broadcast(fn, **{a_name: a, b_name: b})
    a, b = A.tensors(fn, **{a_name: a, b_name: b})
    for name, t in ((a_name, a), (b_name, b)):
        if t.dtype.kind == "c":
            raise TypeError(f"{fn}: {name} must be real, got {t.dtype.name}")
    wide = a.dtype == np.float64 or b.dtype == np.float64
    dt = "float64" if wide else "float32"
    return (t if t.dtype == dt else _dispatch.astype(t, dt) for t in (a, b))


def complex(real, imag):
    """The complex tensor ``real + 1j * imag`` (MegEngine's ``complex``).

    Args:
        real, imag: real Tensors, arrays or numbers; shapes broadcast (NumPy
            rule; MegEngine 1.13 needs equal shapes).

    Returns:
        complex64 (MegEngine's dtype) for float32, float16, bfloat16,
        integer and bool parts; complex128 when either part is float64.

    Raises:
        TypeError: a part that is complex, or not a tensor, array or number.
        ValueError: shapes that do not broadcast.

    >>> import mgtrace as mt, mgtrace.functional as F
    >>> z = F.complex(mt.tensor([1.0, 2.0]), mt.tensor([3.0, -4.0]))
    >>> z.dtype, z.numpy().tolist()
    (dtype('complex64'), [(1+3j), (2-4j)])
    """
    re, im = _complex_parts("complex", "real", real, "imag", imag)
    return _dispatch.make_complex(re, im)


def _complex_part(fn, x, part):
    A.check_operand(fn, "complex", x)
    (x,) = A.tensors(fn, complex=x)
    if x.dtype.kind != "c":
        raise TypeError(f"{fn}: expected a complex tensor, got {x.dtype.name} (MegEngine "
                        f"1.13 refuses a real one too)")
    return _dispatch.complex_part(x, part)


def real(complex):
    """The real part of a complex tensor (MegEngine's ``real``).

    Args:
        complex: complex64 or complex128 Tensor, any shape.

    Returns:
        A new Tensor of its shape: float32 for complex64, float64 for
        complex128.

    Raises:
        TypeError: a real tensor (MegEngine refuses it as well), or not a
            tensor.

    >>> import mgtrace as mt, mgtrace.functional as F
    >>> F.real(F.complex(mt.tensor([1.0, 2.0]), mt.tensor([3.0, 4.0]))).tolist()
    [1.0, 2.0]
    """
    return _complex_part("real", complex, "real")


def imag(complex):
    """The imaginary part of a complex tensor (MegEngine's ``imag``); shapes,
    dtypes and errors as :func:`real`.

    >>> import mgtrace as mt, mgtrace.functional as F
    >>> F.imag(F.complex(mt.tensor([1.0, 2.0]), mt.tensor([3.0, 4.0]))).tolist()
    [3.0, 4.0]
    """
    return _complex_part("imag", complex, "imag")


def polar(abs, angle):
    """The complex tensor ``abs * (cos(angle) + 1j * sin(angle))``
    (MegEngine's ``polar``, composed as MegEngine composes it: ``complex(abs
    * cos(angle), abs * sin(angle))``). ``F.abs`` of the result gives
    ``|abs|`` back.

    Args:
        abs, angle: real Tensors, arrays or numbers; shapes broadcast.

    Returns:
        complex64, or complex128 when either is float64 (as :func:`complex`).

    Raises:
        TypeError: a complex operand, or one that is not a tensor, array or
            number. ValueError: shapes that do not broadcast.

    >>> import mgtrace as mt, mgtrace.functional as F
    >>> z = F.polar(mt.tensor([2.0]), mt.tensor([0.0]))
    >>> z.numpy().tolist()
    [(2+0j)]
    """
    r, a = _complex_parts("polar", "abs", abs, "angle", angle)
    return _dispatch.make_complex(_B["mul"](r, _U["cos"](a)), _B["mul"](r, _U["sin"](a)))
