# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
#
# mgtrace._core MUST import this module (mgtrace/_core/__init__.py:
# ``from mgtrace._core import reduce``): importing it installs the Tensor
# reduction methods (t.sum(), t.max(), ...) and registers every op here for
# apply() and the module tracer (``@core_op``, rows of op_table.py).
"""Reductions over axes, scans, softmax and sorting along one axis.

The Python functions here own the API: they convert and check their
arguments, choose the result dtype (MegEngine's rules, below), allocate the
result on the input's device and hand C kernels (kernels/cpu/reduce.c,
kernels/cpu/sort.c) a geometry in bytes, with the GIL released.

Reductions see the input as (kept dims) x (reduced dims): size-1 dims are
dropped, the dims are ordered by stride (reduced dims keep their order for
argmax/argmin, whose index counts in C order over them) and neighbours that
step as one run are merged, so a transposed or sliced view costs no copy.

Result dtypes (MegEngine; DESIGN.md "Tensor core")::

    sum, prod, cumsum, cumprod   ints keep their dtype (accumulated in int64,
                                 then wrapped), bool -> int32, floats keep
                                 (accumulated in float32 lanes + float64)
    mean, var, std, softmax,     floats keep, ints and bool -> float32
    log_softmax
    max, min, sort, topk values  the input dtype
    argmax, argmin, indices      int32 (MegEngine's index dtype)
    any, all                     bool

Kernels come from the reduce table of the input's device backend
(kernels/contract/backend.h; the CPU's is kernels/cpu/reduce.c, sort.c, CUDA's
kernels/cuda/reduce.cu); an op without a kernel there raises NoKernelError (a
NotImplementedError) "no kernel for op X on device D with dtype T".
"""
import operator

import numpy as np

from libc.stdint cimport int64_t

from mgtrace._core.kernels cimport MT_NDTYPES
from mgtrace._core.tensor cimport (Tensor, empty, view_of, to_tensor, shape_tuple, backend_of,
                                   backend_error, cpu_backend)
from mgtrace._core.kernels cimport MT_BK_ENOMEM
from mgtrace._core.tensor import missing_kernel
from mgtrace._core.dtype cimport ITEMSIZE, CATEGORY, float_result, scalar_code
from mgtrace._core.device cimport Device, DEVICES, default_device_id
from mgtrace._core.dispatch cimport coerce, cast, fill, num_threads
from mgtrace._core.dtype import NAMES as DTYPE_NAMES
from mgtrace._core.dispatch import core_op

cdef extern from "kernels/cpu/reduce.h" nogil:
    enum: MT_NREDUCE, MT_NSCAN, MT_NSOFTMAX
    enum: MT_RR_SUM, MT_RR_FLOAT, MT_RR_SAME, MT_RR_INDEX, MT_RR_BOOL
    ctypedef struct mt_reduce_geom:
        int nkeep
        int64_t kshape[16]
        int64_t kin[16]
        int64_t kout[16]
        int nred
        int64_t rshape[16]
        int64_t rin[16]
        int64_t count
        double ddof
    ctypedef struct mt_line_geom:
        int nouter
        int64_t oshape[16]
        int64_t oin[16]
        int64_t oout[16]
        int64_t oidx[16]
        int64_t len
        int64_t ain
        int64_t aout
        int64_t aidx
    ctypedef int (*mt_reduce_fn)(const char *inp, char *out, const mt_reduce_geom *g, int nt) noexcept nogil
    ctypedef int (*mt_line_fn)(const char *inp, char *out, const mt_line_geom *g, int nt) noexcept nogil
    ctypedef int (*mt_sort_fn)(const char *inp, char *vals, char *idx, const mt_line_geom *g,
                               int64_t k, int descending, int sorted, int nt) noexcept nogil
    mt_reduce_fn mt_reduce_fns[][MT_NDTYPES]
    mt_line_fn mt_scan_fns[][MT_NDTYPES]
    mt_line_fn mt_softmax_fns[][MT_NDTYPES]
    mt_sort_fn mt_sort_fns[]
    const char *mt_reduce_names[]
    const int mt_reduce_rules[]
    const char *mt_scan_names[]
    const char *mt_softmax_names[]
    ctypedef struct mt_reduce_kernels:    # the members are arrays of tables: cast on use
        void *reduce
        void *scan
        void *softmax
        void *sort

# ------------------------------------------------------------------ op codes

REDUCE = {mt_reduce_names[i].decode(): i for i in range(MT_NREDUCE)}
SCAN = {mt_scan_names[i].decode(): i for i in range(MT_NSCAN)}
SOFTMAX = {mt_softmax_names[i].decode(): i for i in range(MT_NSOFTMAX)}

cdef int R_SUM = REDUCE["sum"], R_PROD = REDUCE["prod"], R_MEAN = REDUCE["mean"]
cdef int R_VAR = REDUCE["var"], R_STD = REDUCE["std"], R_MAX = REDUCE["max"], R_MIN = REDUCE["min"]
cdef int R_ARGMAX = REDUCE["argmax"], R_ARGMIN = REDUCE["argmin"]
cdef int R_ANY = REDUCE["any"], R_ALL = REDUCE["all"]
cdef int64_t INDEX_MAX = 2147483647   # int32 indices

# value of a reduction over zero elements (None: an error, as in NumPy)
cdef dict _EMPTY_VALUE = {"sum": 0, "prod": 1, "mean": float("nan"), "var": float("nan"),
                          "std": float("nan"), "any": False, "all": True,
                          "max": None, "min": None, "argmax": None, "argmin": None}

# ------------------------------------------------------------------ helpers

cdef Tensor _input(object x, str op):
    """x as a Tensor on a CPU device (NotImplementedError elsewhere)."""
    cdef Tensor t
    if isinstance(x, Tensor):
        t = <Tensor>x
    elif scalar_code(x) >= 0:
        t = to_tensor(x, None, default_device_id)
    else:
        t = coerce(x, default_device_id)
    return t


cdef object _missing(str op, Tensor t):
    return missing_kernel(op, t._device, t._dtype)


# ------------------------------------------------------------------ kernel tables by device type

cdef mt_reduce_kernels _CPU
_CPU.reduce = <void *>mt_reduce_fns
_CPU.scan = <void *>mt_scan_fns
_CPU.softmax = <void *>mt_softmax_fns
_CPU.sort = <void *>mt_sort_fns
cpu_backend().reduce = &_CPU      # the CPU backend's reduce member


cdef const mt_reduce_kernels *_kernels(Tensor t, str op) except NULL:
    """The reduction tables of t's device type."""
    cdef const mt_reduce_kernels *k = <const mt_reduce_kernels *>backend_of(t._device).reduce
    if k == NULL:
        raise _missing(op, t)
    return k


def _has_kernel(str op, int device, int dtype):
    """Whether ``device``'s reduce table has op's kernel for input dtype code
    ``dtype``; None when op is not one of this area's (see has_kernel)."""
    cdef const mt_reduce_kernels *k = <const mt_reduce_kernels *>backend_of(device).reduce
    cdef const void *table
    cdef int row = 0
    if op not in REDUCE and op not in SCAN and op not in SOFTMAX and op not in ("sort", "argsort", "topk"):
        return None
    if k == NULL:
        return False
    if op in REDUCE:
        table, row = k.reduce, REDUCE[op]
    elif op in SCAN:
        table, row = k.scan, SCAN[op]
    elif op in SOFTMAX:
        table, row = k.softmax, SOFTMAX[op]
    else:
        table = k.sort
    return table != NULL and (<const void **>table)[row * MT_NDTYPES + dtype] != NULL


cdef int _entry(const void *table, int row, Tensor t, str op) except -1:
    """Index of (row, t's dtype) in a [row][dtype] table; -1 (raised) when empty."""
    cdef const void **fns = <const void **>table
    if table == NULL or fns[row * MT_NDTYPES + t._dtype] == NULL:
        raise _missing(op, t)
    return row * MT_NDTYPES + t._dtype


cdef int _check(int rc, Tensor t, str op) except -1:
    if rc == 0:
        return 0
    if rc == MT_BK_ENOMEM:      # the CPU kernels' only failure (-1, their scratch)
        raise MemoryError(f"{op}: cannot allocate scratch memory")
    raise backend_error(t._device, rc, op)


cdef int _out_dtype(int rule, int code) noexcept:
    if rule == MT_RR_SUM:
        return 5 if code == 0 else code       # bool -> int32
    if rule == MT_RR_FLOAT:
        return float_result(code)             # ints, bool -> float32
    if rule == MT_RR_SAME:
        return code
    if rule == MT_RR_INDEX:
        return 5                              # int32
    return 0                                  # bool


cdef object _index(object v, str op, str what):
    """v as a Python int (range checks come before any int64 conversion)."""
    if isinstance(v, bool):
        raise TypeError(f"{op}: {what} must be an int, not bool")
    try:
        return operator.index(v)
    except TypeError:
        raise TypeError(f"{op}: {what} must be an int, got {type(v).__name__}") from None


cdef int _axes_mask(object axis, int nd, bint *mask, str op) except -1:
    """Marks the reduced dims: None = all, an int, or a tuple/list of ints."""
    cdef int i, a
    for i in range(nd):
        mask[i] = axis is None
    if axis is None:
        return 0
    items = axis if isinstance(axis, (tuple, list)) else (axis,)
    for ax in items:
        v = _index(ax, op, "axis")
        if v < -nd or v >= nd:
            raise IndexError(f"{op}: axis {v} is out of bounds for a tensor of dimension {nd}")
        a = <int>(v + nd if v < 0 else v)
        if mask[a]:
            raise ValueError(f"{op}: axis {a} appears more than once in axis={axis!r}")
        mask[a] = True
    return 0


cdef int _one_axis(object axis, int nd, str op) except -1:
    if axis is None:
        raise TypeError(f"{op}: axis must be an int, not None")
    v = _index(axis, op, "axis")
    if v < -nd or v >= nd:
        raise IndexError(f"{op}: axis {v} is out of bounds for a tensor of dimension {nd}")
    return <int>(v + nd if v < 0 else v)


cdef inline int64_t _abs(int64_t v) noexcept nogil:
    return -v if v < 0 else v


cdef int _coalesce(int n, int64_t *shape, int64_t *s1, int64_t *s2, int64_t *s3,
                   bint by_stride) noexcept:
    """Optionally orders dims by |s1| descending (stable), then merges a dim
    into the one before it when every stride array steps through both as
    one run. s2/s3 may be NULL. Returns the new number of dims."""
    cdef int i, j, m = 0
    cdef int64_t t
    if by_stride:
        for i in range(1, n):
            j = i
            while j > 0 and _abs(s1[j - 1]) < _abs(s1[j]):
                t = shape[j]; shape[j] = shape[j - 1]; shape[j - 1] = t
                t = s1[j]; s1[j] = s1[j - 1]; s1[j - 1] = t
                if s2 != NULL:
                    t = s2[j]; s2[j] = s2[j - 1]; s2[j - 1] = t
                if s3 != NULL:
                    t = s3[j]; s3[j] = s3[j - 1]; s3[j - 1] = t
                j -= 1
    for i in range(n):
        if (m > 0 and s1[m - 1] == s1[i] * shape[i]
                and (s2 == NULL or s2[m - 1] == s2[i] * shape[i])
                and (s3 == NULL or s3[m - 1] == s3[i] * shape[i])):
            shape[m - 1] *= shape[i]
            s1[m - 1] = s1[i]
            if s2 != NULL:
                s2[m - 1] = s2[i]
            if s3 != NULL:
                s3[m - 1] = s3[i]
        else:
            shape[m] = shape[i]
            s1[m] = s1[i]
            if s2 != NULL:
                s2[m] = s2[i]
            if s3 != NULL:
                s3[m] = s3[i]
            m += 1
    return m


# ------------------------------------------------------------------ reductions

cdef bint _flag(str name, object keepdims) except -1:
    """keepdims as MegEngine takes it: a bool, NumPy bool or int; TypeError
    for anything else ("yes", None, 1.0), which bool() would let through."""
    if isinstance(keepdims, (bool, np.bool_)) or (isinstance(keepdims, int)):
        return bool(keepdims)
    if isinstance(keepdims, np.integer):
        return keepdims != 0
    raise TypeError(f"{name}: keepdims must be a bool, got {type(keepdims).__name__} {keepdims!r}")


cdef Tensor _reduce(int op, str name, object x, object axis, object keepdims, double ddof):
    cdef bint keep = _flag(name, keepdims)
    cdef Tensor t = _input(x, name)
    cdef bint mask[16]
    cdef int nd = t._ndim, d, j = 0, ond = 0
    cdef int isz = ITEMSIZE[t._dtype]
    cdef int odt = _out_dtype(mt_reduce_rules[op], t._dtype)
    cdef int osz = ITEMSIZE[odt]
    cdef int64_t oshape[16]
    cdef int64_t nr = 1, nout = 1
    cdef mt_reduce_geom g
    cdef mt_reduce_fn fn
    cdef int rc, nt
    _axes_mask(axis, nd, mask, name)
    for d in range(nd):
        if mask[d]:
            nr *= t._shape[d]
            if keep:
                oshape[ond] = 1
                ond += 1
        else:
            nout *= t._shape[d]
            oshape[ond] = t._shape[d]
            ond += 1
    cdef Tensor out = empty(ond, oshape, odt, t._device)
    if nout == 0:
        return out
    if nr == 0:
        value = _EMPTY_VALUE[name]
        if value is None:
            raise ValueError(f"{name}: cannot reduce over an empty axis (axis={axis!r} of a tensor of "
                             f"shape {shape_tuple(t)}) because {name} has no identity, as in NumPy")
        fill(out, value)
        return out
    if (op == R_ARGMAX or op == R_ARGMIN) and nr > INDEX_MAX:
        raise ValueError(f"{name}: {nr} elements per reduction do not fit the int32 index dtype")
    cdef const mt_reduce_kernels *k = _kernels(t, name)
    fn = (<mt_reduce_fn *>k.reduce)[_entry(k.reduce, op, t, name)]
    # geometry in bytes: kept dims with their output strides, reduced dims
    g.nkeep = 0
    g.nred = 0
    for d in range(nd):
        if mask[d]:
            if t._shape[d] != 1:
                g.rshape[g.nred] = t._shape[d]
                g.rin[g.nred] = t._strides[d] * isz
                g.nred += 1
        else:
            if t._shape[d] != 1:
                g.kshape[g.nkeep] = t._shape[d]
                g.kin[g.nkeep] = t._strides[d] * isz
                g.kout[g.nkeep] = out._strides[j] * osz
                g.nkeep += 1
            j += 1
        if keep and mask[d]:
            j += 1
    g.nkeep = _coalesce(g.nkeep, g.kshape, g.kin, g.kout, NULL, True)
    # argmax/argmin count their index in C order over the reduced dims
    g.nred = _coalesce(g.nred, g.rshape, g.rin, NULL, NULL, op != R_ARGMAX and op != R_ARGMIN)
    if g.nred == 0:
        g.nred = 1
        g.rshape[0] = 1
        g.rin[0] = 0
    g.count = nr
    g.ddof = ddof
    nt = num_threads()
    with nogil:
        rc = fn(t._data, out._data, &g, nt)
    _check(rc, t, name)
    return out


cdef object _complex_reduce(int op, str name, Tensor x, axis, keepdims):
    """sum or mean of a complex tensor: its real and imaginary parts (float32
    for complex64, float64 for complex128) reduced apart, then joined."""
    from mgtrace._core.dispatch import complex_part, make_complex
    return make_complex(_reduce(op, name, complex_part(x, "real"), axis, keepdims, 0),
                        _reduce(op, name, complex_part(x, "imag"), axis, keepdims, 0))


@core_op
def sum(x, axis=None, keepdims=False):
    """Sum of the elements over ``axis``.

    Args:
        x: Tensor (or array-like) of any dtype, shape [d0, ..., dn-1].
        axis: None (all axes), an int, or a tuple of ints; negative counts
            from the end.
        keepdims: keep the reduced axes with size 1.

    Returns:
        Tensor: the input's dtype for ints, floats and complex (its real
        and imaginary parts summed apart), int32 for bool (MegEngine). Integers are accumulated in int64 and wrap on the way
        back, as NumPy's ``sum(dtype=int64).astype(dtype)``; float16,
        bfloat16 and float32 are summed in float32 blocks and float64
        (within 1e-7 relative of an exact sum). Sum over no elements is 0.

    Raises:
        IndexError: an axis out of range. ValueError: a repeated axis.
        TypeError: an axis that is not an int. NoKernelError: the
        device has no kernel for the op at this dtype.

    >>> import mgtrace as mt; from mgtrace._core import reduce as R
    >>> R.sum(mt.tensor([[1, 2], [3, 4]]), axis=0).tolist()
    [4, 6]
    """
    if isinstance(x, Tensor) and CATEGORY[(<Tensor>x)._dtype] == 4:
        return _complex_reduce(R_SUM, "sum", <Tensor>x, axis, keepdims)
    return _reduce(R_SUM, "sum", x, axis, keepdims, 0)


@core_op
def prod(x, axis=None, keepdims=False):
    """Product of the elements over ``axis``.

    Args, result dtype and errors as :func:`sum` (ints: int64 product,
    wrapped; floats: float64 accumulator). Product over no elements is 1.

    >>> import mgtrace as mt; from mgtrace._core import reduce as R
    >>> R.prod(mt.tensor([[1, 2], [3, 4]]), axis=1).tolist()
    [2, 12]
    """
    return _reduce(R_PROD, "prod", x, axis, keepdims, 0)


@core_op
def mean(x, axis=None, keepdims=False):
    """Arithmetic mean over ``axis``.

    Returns the input's dtype for floats and float32 for ints and bool
    (MegEngine's rule for mean/var/std). Accumulated in int64 or float64.
    The mean of no elements is NaN (NumPy, without its warning).

    Args and errors as :func:`sum`.

    >>> import mgtrace as mt; from mgtrace._core import reduce as R
    >>> R.mean(mt.tensor([1, 2, 3, 4])).item()
    2.5
    """
    if isinstance(x, Tensor) and CATEGORY[(<Tensor>x)._dtype] == 4:
        return _complex_reduce(R_MEAN, "mean", <Tensor>x, axis, keepdims)
    return _reduce(R_MEAN, "mean", x, axis, keepdims, 0)


@core_op
def var(x, axis=None, keepdims=False, ddof=0):
    """Variance over ``axis``: sum((x - mean)**2) / max(N - ddof, 0).

    Computed in float64 (two-pass blocks merged by Chan's formula). Result
    dtype as :func:`mean`. N - ddof <= 0 gives inf or NaN, as NumPy.

    Args:
        ddof: "delta degrees of freedom" (1 for the unbiased estimate).
        Others and errors as :func:`sum`.

    >>> import mgtrace as mt; from mgtrace._core import reduce as R
    >>> R.var(mt.tensor([1.0, 2.0, 3.0, 4.0])).item()
    1.25
    """
    return _reduce(R_VAR, "var", x, axis, keepdims, float(ddof))


@core_op
def std(x, axis=None, keepdims=False, ddof=0):
    """Standard deviation over ``axis``: sqrt(:func:`var`). Same args, dtype
    and errors as :func:`var`.

    >>> import mgtrace as mt; from mgtrace._core import reduce as R
    >>> R.std(mt.tensor([1.0, 3.0])).item()
    1.0
    """
    return _reduce(R_STD, "std", x, axis, keepdims, float(ddof))


@core_op
def max(x, axis=None, keepdims=False):
    """Largest element over ``axis``, in the input's dtype.

    A NaN anywhere in a reduction makes its result NaN (NumPy's ``max``).

    Raises:
        ValueError: reducing an empty axis (no identity, as NumPy), unless
            the result itself is empty. Others as :func:`sum`.

    >>> import mgtrace as mt; from mgtrace._core import reduce as R
    >>> R.max(mt.tensor([[1, 5], [7, 2]]), axis=1).tolist()
    [5, 7]
    """
    return _reduce(R_MAX, "max", x, axis, keepdims, 0)


@core_op
def min(x, axis=None, keepdims=False):
    """Smallest element over ``axis``; see :func:`max`.

    >>> import mgtrace as mt; from mgtrace._core import reduce as R
    >>> R.min(mt.tensor([[1, 5], [7, 2]]), axis=0).tolist()
    [1, 2]
    """
    return _reduce(R_MIN, "min", x, axis, keepdims, 0)


@core_op
def argmax(x, axis=None, keepdims=False):
    """Index of the largest element over ``axis``, int32 (MegEngine).

    The first occurrence wins; a NaN counts as the largest (the first NaN
    wins), as in NumPy. With axis None or several axes the index is flat,
    in C order over the reduced axes (``np.argmax`` of those axes moved to
    the end and merged).

    Raises:
        ValueError: an empty axis, or more than 2**31 - 1 elements per
            reduction. Others as :func:`sum`.

    >>> import mgtrace as mt; from mgtrace._core import reduce as R
    >>> R.argmax(mt.tensor([[1, 5], [7, 2]]), axis=1).tolist()
    [1, 0]
    """
    return _reduce(R_ARGMAX, "argmax", x, axis, keepdims, 0)


@core_op
def argmin(x, axis=None, keepdims=False):
    """Index of the smallest element over ``axis``; see :func:`argmax`
    (NaN also wins here, as in NumPy).

    >>> import mgtrace as mt; from mgtrace._core import reduce as R
    >>> R.argmin(mt.tensor([3, 1, 1])).item()
    1
    """
    return _reduce(R_ARGMIN, "argmin", x, axis, keepdims, 0)


@core_op
def any(x, axis=None, keepdims=False):
    """True where some element over ``axis`` is nonzero (NaN is nonzero).
    Result bool; False over no elements. Args and errors as :func:`sum`.

    >>> import mgtrace as mt; from mgtrace._core import reduce as R
    >>> R.any(mt.tensor([[0, 0], [0, 3]]), axis=1).tolist()
    [False, True]
    """
    return _reduce(R_ANY, "any", x, axis, keepdims, 0)


@core_op
def all(x, axis=None, keepdims=False):
    """True where every element over ``axis`` is nonzero. Result bool; True
    over no elements. Args and errors as :func:`sum`.

    >>> import mgtrace as mt; from mgtrace._core import reduce as R
    >>> R.all(mt.tensor([[1, 0], [2, 3]]), axis=1).tolist()
    [False, True]
    """
    return _reduce(R_ALL, "all", x, axis, keepdims, 0)


# ------------------------------------------------------------------ along one axis

cdef Tensor _line_input(object x, object axis, str op, int *ax, bint *scalar):
    """The input, with a 0-d tensor seen as a line of one element (axis 0 or -1)."""
    cdef Tensor t = _input(x, op)
    cdef int64_t one = 1, zero = 0
    scalar[0] = t._ndim == 0
    if t._ndim == 0:
        _one_axis(axis, 1, op)
        ax[0] = 0
        return view_of(t, 1, &one, &zero, 0)
    ax[0] = _one_axis(axis, t._ndim, op)
    return t


cdef int _line_geom(Tensor t, int ax, Tensor out, Tensor idx, mt_line_geom *g) noexcept:
    """Outer dims (all but ax) with input/output/index byte strides, ordered
    by input stride and coalesced; the axis with its own strides."""
    cdef int d, isz = ITEMSIZE[t._dtype]
    cdef int osz = ITEMSIZE[out._dtype] if out is not None else 0
    g.nouter = 0
    for d in range(t._ndim):
        if d == ax or t._shape[d] == 1:
            continue
        g.oshape[g.nouter] = t._shape[d]
        g.oin[g.nouter] = t._strides[d] * isz
        g.oout[g.nouter] = out._strides[d] * osz if out is not None else 0
        g.oidx[g.nouter] = idx._strides[d] * 4 if idx is not None else 0
        g.nouter += 1
    g.nouter = _coalesce(g.nouter, g.oshape, g.oin, g.oout, g.oidx, True)
    g.len = t._shape[ax]
    g.ain = t._strides[ax] * isz
    g.aout = out._strides[ax] * osz if out is not None else 0
    g.aidx = idx._strides[ax] * 4 if idx is not None else 0
    return 0


cdef Tensor _like_input(Tensor res, bint scalar):
    """res viewed back as 0-d when the input was 0-d."""
    return view_of(res, 0, NULL, NULL, 0) if scalar else res


cdef Tensor _softmax(int op, str name, object x, object axis):
    cdef int ax, nt
    cdef bint scalar
    cdef Tensor t = _line_input(x, axis, name, &ax, &scalar)
    cdef mt_line_geom g
    cdef mt_line_fn fn
    if CATEGORY[t._dtype] != 3:
        t = cast(t, 9)                     # ints and bool -> float32 (MegEngine)
    cdef const mt_reduce_kernels *k = _kernels(t, name)
    fn = (<mt_line_fn *>k.softmax)[_entry(k.softmax, op, t, name)]
    cdef Tensor out = empty(t._ndim, t._shape, t._dtype, t._device)
    _line_geom(t, ax, out, None, &g)
    nt = num_threads()
    cdef int rc
    with nogil:
        rc = fn(t._data, out._data, &g, nt)
    _check(rc, t, name)
    return _like_input(out, scalar)


@core_op
def softmax(x, axis=-1):
    """exp(x - max) / sum(exp(x - max)) along ``axis`` (numerically stable).

    Args:
        x: Tensor of any dtype, shape [..., n, ...]; a 0-d tensor is a line
            of one element.
        axis: an int (default the last axis).

    Returns:
        Tensor of x's shape: the input's dtype for floats (float16 and
        bfloat16 computed in float32), float32 for ints and bool
        (MegEngine). A NaN makes its whole line NaN; a line of all -inf
        gives NaN (as torch).

    Raises:
        IndexError: axis out of range. TypeError: axis not an int.
        NoKernelError: the device has no kernel for the op at this dtype.

    >>> import mgtrace as mt; from mgtrace._core import reduce as R
    >>> [round(v, 4) for v in R.softmax(mt.tensor([0.0, 0.0, 0.0, 0.0])).tolist()]
    [0.25, 0.25, 0.25, 0.25]
    """
    return _softmax(SOFTMAX["softmax"], "softmax", x, axis)


@core_op
def log_softmax(x, axis=-1):
    """x - max - log(sum(exp(x - max))) along ``axis``; see :func:`softmax`
    for the arguments, dtypes and errors.

    >>> import mgtrace as mt; from mgtrace._core import reduce as R
    >>> round(R.log_softmax(mt.tensor([1.0, 1.0])).tolist()[0], 4)
    -0.6931
    """
    return _softmax(SOFTMAX["log_softmax"], "log_softmax", x, axis)


cdef Tensor _scan(int op, str name, object x, object axis):
    cdef int ax, nt
    cdef bint scalar
    cdef mt_line_geom g
    cdef mt_line_fn fn
    if axis is None:                       # NumPy: over the flattened tensor
        x = _input(x, name).reshape(-1)
        axis = 0
    cdef Tensor t = _line_input(x, axis, name, &ax, &scalar)
    cdef const mt_reduce_kernels *k = _kernels(t, name)
    fn = (<mt_line_fn *>k.scan)[_entry(k.scan, op, t, name)]
    cdef Tensor out = empty(t._ndim, t._shape, _out_dtype(MT_RR_SUM, t._dtype), t._device)
    _line_geom(t, ax, out, None, &g)
    nt = num_threads()
    cdef int rc
    with nogil:
        rc = fn(t._data, out._data, &g, nt)
    _check(rc, t, name)
    return _like_input(out, scalar)


@core_op
def cumsum(x, axis):
    """Running sum along ``axis``.

    Args:
        x: Tensor of any dtype.
        axis: an int, or None for the flattened tensor (NumPy).

    Returns:
        Tensor of x's shape (flat when axis is None). dtype by the sum rule
        (MegEngine): ints keep their dtype (accumulated in int64, each
        prefix wrapped on store), bool -> int32, floats keep (accumulated
        in float64).

    Raises:
        IndexError: axis out of range. TypeError: axis not an int.
        NoKernelError: the device has no kernel for the op at this dtype.

    >>> import mgtrace as mt; from mgtrace._core import reduce as R
    >>> R.cumsum(mt.tensor([[1, 2], [3, 4]]), axis=1).tolist()
    [[1, 3], [3, 7]]
    """
    return _scan(SCAN["cumsum"], "cumsum", x, axis)


@core_op
def cumprod(x, axis):
    """Running product along ``axis``; arguments, dtypes and errors as
    :func:`cumsum`.

    >>> import mgtrace as mt; from mgtrace._core import reduce as R
    >>> R.cumprod(mt.tensor([1, 2, 3, 4]), axis=0).tolist()
    [1, 2, 6, 24]
    """
    return _scan(SCAN["cumprod"], "cumprod", x, axis)


cdef object _sort(str name, object x, object axis, object k, bint descending, bint is_sorted,
                  bint values):
    cdef int ax, rc, nt
    cdef mt_line_geom g
    cdef mt_sort_fn fn
    cdef int64_t kk
    cdef bint scalar
    cdef Tensor t = _line_input(x, axis, name, &ax, &scalar)
    cdef int64_t n = t._shape[ax]
    if n > INDEX_MAX:
        raise ValueError(f"{name}: an axis of {n} elements does not fit the int32 index dtype")
    if k is None:
        kk = n
    else:
        k = _index(k, name, "k")          # (a Python int: checked before it meets int64)
        if k < 0 or k > n:
            raise ValueError(f"{name}: k={k} is out of range for an axis of length {n} "
                             f"(need 0 <= k <= {n})")
        kk = k
    cdef const mt_reduce_kernels *kern = _kernels(t, name)
    fn = (<mt_sort_fn *>kern.sort)[_entry(kern.sort, 0, t, name)]
    cdef int64_t shp[16]
    cdef int d
    for d in range(t._ndim):
        shp[d] = t._shape[d]
    shp[ax] = kk
    cdef Tensor idx = empty(t._ndim, shp, 5, t._device)
    cdef Tensor vals = empty(t._ndim, shp, t._dtype, t._device) if values else None
    _line_geom(t, ax, vals, idx, &g)
    nt = num_threads()
    with nogil:
        rc = fn(t._data, vals._data if vals is not None else NULL, idx._data, &g, kk,
                descending, is_sorted, nt)
    _check(rc, t, name)
    if values:
        return _like_input(vals, scalar), _like_input(idx, scalar)
    return _like_input(idx, scalar)


@core_op
def sort(x, axis=-1, descending=False):
    """Sorted values along ``axis`` and where they came from.

    Stable: equal values keep their order (lower index first). NaN sorts
    last in ascending order (NumPy) and first in descending order (NaN is
    the largest value; as torch).

    Args:
        x: Tensor of any dtype; a 0-d tensor is a line of one element.
        axis: an int (default the last axis).
        descending: largest first.

    Returns:
        (values, indices): values in the input's dtype, indices int32
        (MegEngine's index dtype), both of x's shape.

    Raises:
        IndexError: axis out of range. TypeError: axis not an int.
        ValueError: an axis longer than 2**31 - 1. NoKernelError: the
        device has no kernel for the op at this dtype.

    >>> import mgtrace as mt; from mgtrace._core import reduce as R
    >>> v, i = R.sort(mt.tensor([3, 1, 2]))
    >>> v.tolist(), i.tolist()
    ([1, 2, 3], [1, 2, 0])
    """
    return _sort("sort", x, axis, None, descending, True, True)


@core_op
def argsort(x, axis=-1, descending=False):
    """The int32 indices that sort ``x`` along ``axis``; see :func:`sort`.

    >>> import mgtrace as mt; from mgtrace._core import reduce as R
    >>> R.argsort(mt.tensor([3.0, 1.0, 2.0]), descending=True).tolist()
    [0, 2, 1]
    """
    return _sort("argsort", x, axis, None, descending, True, False)


@core_op
def topk(x, k, axis=-1, descending=True, sorted=True):
    """The k largest (descending=True) or smallest values along ``axis``.

    Selection is partial (introselect, O(n) per line), then only the k
    selected are sorted. Order and ties as :func:`sort`: among equal values
    the lower index comes first and is the one kept; NaN counts as the
    largest value.

    Args:
        x: Tensor of any dtype, shape [..., n, ...].
        k: 0 <= k <= n.
        axis: an int (default the last axis).
        descending: True for the largest k, False for the smallest.
        sorted: False leaves the k in an unspecified (but deterministic)
            order, skipping their sort.

    Returns:
        (values, indices): shape [..., k, ...]; values in the input's dtype,
        indices int32.

    Raises:
        ValueError: k out of range. IndexError: axis out of range.
        TypeError: k or axis not an int. NoKernelError: the device has
        no kernel for the op at this dtype.

    >>> import mgtrace as mt; from mgtrace._core import reduce as R
    >>> v, i = R.topk(mt.tensor([1, 9, 3, 7]), 2)
    >>> v.tolist(), i.tolist()
    ([9, 7], [1, 3])
    """
    if k is None:
        raise TypeError("topk: k must be an int, not None")
    return _sort("topk", x, axis, k, descending, sorted, True)

