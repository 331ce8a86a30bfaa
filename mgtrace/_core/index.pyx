# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Indexing (NumPy semantics), gather/scatter, concat/stack/split, nonzero.

Basic indexing (ints, slices with steps, None, Ellipsis) gives a view.
Advanced indexing (integer or bool tensors/arrays/lists) gives a copy: the
index arrays broadcast together (NumPy rules), each position becomes an
element offset (C kernel, bounds-checked), and the kernel copies the
addressed blocks. When the advanced indices are adjacent their broadcast
shape replaces them in place, otherwise it comes first (NumPy's rule).
"""
from libc.stdint cimport int64_t, uint8_t
from libc.stdlib cimport malloc, free

import numpy as np

from mgtrace._core.kernels cimport MT_MAX_NDIM
from mgtrace._core.tensor cimport (Tensor, empty, view_of, numel, is_contiguous, normalize_axis,
                                    shape_tuple, to_tensor, backend_of, backend_error, cpu_backend,
                                    on_host)
from mgtrace._core.tensor import missing_kernel
from mgtrace._core.dtype cimport CATEGORY, ITEMSIZE, promote_operands
from mgtrace._core.dispatch cimport cast, coerce, copy_into, fill, check_writable, num_threads
from mgtrace._core.device cimport DEVICES, default_device_id
from mgtrace._core.dispatch import core_op, copy_

cdef extern from "kernels/cpu/index.h" nogil:
    int64_t mt_index_offsets(int64_t n, int nidx, const int64_t *const *idx, const int64_t *dims,
                             const int64_t *strides, int64_t *off, int *bad_axis)
    void mt_take(char *out, const char *src, const int64_t *off, int64_t n, int ndim,
                 const int64_t *shape, const int64_t *strides, int64_t itemsize, int nt)
    void mt_put(char *dst, const char *val, const int64_t *off, int64_t n, int ndim,
                const int64_t *shape, const int64_t *strides, int64_t itemsize)
    int64_t mt_count_nonzero(const uint8_t *src, int64_t n)
    void mt_nonzero(const uint8_t *src, int ndim, const int64_t *shape, int64_t *coords)
    ctypedef struct mt_index_kernels:
        int (*take)(char *out, const char *src, const int64_t *off, int64_t n, int ndim,
                    const int64_t *shape, const int64_t *strides, int64_t itemsize) noexcept nogil
        int (*put)(char *dst, const char *val, const int64_t *off, int64_t n, int ndim,
                   const int64_t *shape, const int64_t *strides, int64_t itemsize) noexcept nogil


# ------------------------------------------------------------------ devices
# Offsets are computed (and bounds-checked) on the host from the index
# values; a device backend's take/put then moves the addressed blocks.

cdef Tensor _host(Tensor t):
    """t itself in host memory, else a copy on cpu:0 (index values are read on the host)."""
    return t if on_host(t._device) else <Tensor>t.to("cpu")


cdef int _cpu_take(char *out, const char *src, const int64_t *off, int64_t n, int ndim,
                   const int64_t *shape, const int64_t *strides, int64_t itemsize) noexcept nogil:
    mt_take(out, src, off, n, ndim, shape, strides, itemsize, num_threads())
    return 0


cdef int _cpu_put(char *dst, const char *val, const int64_t *off, int64_t n, int ndim,
                  const int64_t *shape, const int64_t *strides, int64_t itemsize) noexcept nogil:
    mt_put(dst, val, off, n, ndim, shape, strides, itemsize)
    return 0


# the CPU backend's index member
cdef mt_index_kernels _CPU
_CPU.take = _cpu_take
_CPU.put = _cpu_put
cpu_backend().index = &_CPU


def _has_kernel(str op, int device, int dtype):
    """Whether ``device``'s index table has the take/put kernels the
    advanced-indexing ops move their blocks with (any dtype); None for an op
    of another area (see has_kernel)."""
    if op not in ("getitem", "setitem", "gather", "scatter", "embedding"):   # (nonzero: on the host)
        return None
    cdef const mt_index_kernels *k = <const mt_index_kernels *>backend_of(device).index
    return k != NULL and k.take != NULL and k.put != NULL


cdef const mt_index_kernels *_kernels(str op, Tensor t) except NULL:
    cdef const mt_index_kernels *k = <const mt_index_kernels *>backend_of(t._device).index
    if k == NULL or k.take == NULL or k.put == NULL:
        raise missing_kernel(op, t._device, t._dtype)
    return k


# ------------------------------------------------------------------ parsing

cdef class _Indexed:
    """The result of applying an index: a view plus the advanced part."""
    cdef Tensor view            # basic indexing applied; advanced axes kept whole
    cdef list adv_pos           # positions (axes of view) of the advanced indices
    cdef list adv_idx           # int64 index tensors, one per advanced axis


cdef class _BoolScalar:
    """A 0-d bool index, parsed."""
    cdef bint value

    def __cinit__(self, bint value):
        self.value = value


cdef bint _is_advanced(object x):
    return isinstance(x, (Tensor, np.ndarray, list)) or (
        isinstance(x, tuple) and False)


cdef Tensor _index_tensor(object x, int device):
    cdef Tensor t = x if isinstance(x, Tensor) else to_tensor(np.asarray(x), None, device)
    if isinstance(x, list) and len(x) == 0:
        t = to_tensor(np.zeros(0, np.int64), None, device)
    if CATEGORY[t._dtype] >= 3:
        raise IndexError(f"tensors used as indices must be of integer or bool type, not {t.dtype}")
    return t


cdef _Indexed parse(Tensor t, object index):
    if not isinstance(index, tuple):
        index = (index,)
    # how many axes of t the index consumes, to size the Ellipsis
    cdef int consumed = 0, n_ell = 0
    items = []
    for it in index:
        if it is None:
            items.append(it)
        elif it is Ellipsis:
            n_ell += 1
            items.append(it)
        elif isinstance(it, (bool, np.bool_)):
            raise IndexError("a Python bool as an index is not supported; use a bool tensor")
        elif isinstance(it, slice):
            consumed += 1
            items.append(it)
        elif isinstance(it, Tensor) and (<Tensor>it)._ndim == 0 and CATEGORY[(<Tensor>it)._dtype] == 2:
            consumed += 1
            items.append(int(it))
        elif _is_advanced(it) or isinstance(it, np.generic) and not isinstance(it, np.integer):
            idx = _index_tensor(it, t._device)
            if (<Tensor>idx)._dtype == 0 and (<Tensor>idx)._ndim == 0:
                # NumPy: a 0-d bool adds an axis of length 1 (True) or 0 (False)
                items.append(_BoolScalar(bool(idx.item())))
                continue
            consumed += (<Tensor>idx)._ndim if (<Tensor>idx)._dtype == 0 else 1
            items.append(idx)
        else:
            try:
                v = it.__index__()
                if not -(1 << 62) < v < (1 << 62):
                    raise IndexError(f"index {v} is out of bounds for axis {consumed} "
                                     f"with size {t._shape[consumed] if consumed < t._ndim else 0}")
                items.append(v)
            except (AttributeError, TypeError):
                raise IndexError(f"only integers, slices, None, Ellipsis and integer or bool "
                                 f"tensors are valid indices, not {type(it).__name__}") from None
            consumed += 1
    if n_ell > 1:
        raise IndexError("an index can only have a single ellipsis ('...')")
    if consumed > t._ndim:
        raise IndexError(f"too many indices for tensor: tensor is {t._ndim}-dimensional, "
                         f"but {consumed} were indexed")
    if any(isinstance(it, _BoolScalar) for it in items) and any(isinstance(it, Tensor) for it in items):
        raise IndexError("a 0-d bool index together with index arrays is not supported; "
                         "use a 1-d mask or split the indexing")
    if any(isinstance(it, Tensor) for it in items):
        # next to an index array, an int is an advanced (0-d) index too: this
        # decides where the broadcast block goes (NumPy's rule)
        items = [to_tensor(it, "int64", t._device) if type(it) is int else it for it in items]
    cdef int64_t shape[16]
    cdef int64_t strides[16]
    cdef int64_t offset = 0, dim, i, start, stop, step, length
    cdef int src = 0, nd = 0
    cdef _Indexed res = _Indexed()
    res.adv_pos = []
    res.adv_idx = []
    for it in items:
        if nd >= MT_MAX_NDIM:
            raise IndexError(f"indexing would give more than {MT_MAX_NDIM} dimensions")
        if it is None or isinstance(it, _BoolScalar):
            shape[nd] = 0 if isinstance(it, _BoolScalar) and not (<_BoolScalar>it).value else 1
            strides[nd] = 0
            nd += 1
        elif it is Ellipsis:
            for _ in range(t._ndim - consumed):
                shape[nd] = t._shape[src]
                strides[nd] = t._strides[src]
                nd += 1
                src += 1
        elif isinstance(it, slice):
            dim = t._shape[src]
            if it.step is not None and it.step == 0:
                raise ValueError("slice step cannot be zero")
            start_, stop_, step_ = it.indices(dim)
            # a step longer than the axis takes at most one element: clamped,
            # so that the view's stride (stride * step) stays within int64
            if step_ > dim or step_ < -dim:
                step_ = max(dim, 1) if step_ > 0 else -max(dim, 1)
            start, stop, step = start_, stop_, step_
            length = len(range(start, stop, step))
            if length > 0:
                offset += start * t._strides[src]
            shape[nd] = length
            strides[nd] = t._strides[src] * step
            nd += 1
            src += 1
        elif isinstance(it, Tensor):
            idx = <Tensor>it
            if idx._dtype == 0:  # bool mask over idx.ndim axes -> one int index per axis
                for k in range(idx._ndim):
                    if idx._shape[k] != t._shape[src + k]:
                        raise IndexError(f"boolean index did not match indexed tensor along axis "
                                         f"{src + k}; axis is {t._shape[src + k]} but index is {idx._shape[k]}")
                for col in nonzero(idx, as_tuple=True):
                    res.adv_pos.append(nd)
                    res.adv_idx.append(col)
                    shape[nd] = t._shape[src]
                    strides[nd] = t._strides[src]
                    nd += 1
                    src += 1
            else:
                res.adv_pos.append(nd)
                res.adv_idx.append(idx)
                shape[nd] = t._shape[src]
                strides[nd] = t._strides[src]
                nd += 1
                src += 1
        else:
            i = it
            dim = t._shape[src]
            if i < -dim or i >= dim:
                raise IndexError(f"index {i} is out of bounds for axis {src} with size {dim}")
            if i < 0:
                i += dim
            offset += i * t._strides[src]
            src += 1
    while src < t._ndim:  # trailing axes not indexed
        shape[nd] = t._shape[src]
        strides[nd] = t._strides[src]
        nd += 1
        src += 1
    res.view = view_of(t, nd, shape, strides, offset)
    return res


cdef class _Plan:
    """Offsets of an advanced index and the shapes around them."""
    cdef int64_t *off
    cdef int64_t n
    cdef tuple bshape        # broadcast shape of the index arrays
    cdef list rest           # axes of the view not advanced-indexed
    cdef int insert_at       # where the broadcast block goes in the result

    def __dealloc__(self):
        free(self.off)


cdef _Plan plan(_Indexed ix):
    cdef Tensor v = ix.view, idx
    cdef _Plan p = _Plan()
    cdef int k, m = len(ix.adv_pos)
    shapes = [shape_tuple(<Tensor>x) for x in ix.adv_idx]
    try:
        p.bshape = tuple(np.broadcast_shapes(*shapes))
    except ValueError:
        raise IndexError("shape mismatch: indexing arrays could not be broadcast together "
                         "with shapes " + " ".join(str(s) for s in shapes)) from None
    p.n = 1
    for d in p.bshape:
        p.n *= d
    cols = []
    for x in ix.adv_idx:
        idx = (<Tensor>x).broadcast_to(p.bshape)
        cols.append(_host(cast(idx, 6)))   # contiguous int64, on the host
    cdef const int64_t **ptrs = <const int64_t **>malloc(sizeof(int64_t *) * m)
    cdef int64_t dims[16]
    cdef int64_t strides[16]
    p.off = <int64_t *>malloc(sizeof(int64_t) * max(p.n, 1))
    if ptrs == NULL or p.off == NULL:
        free(ptrs)
        raise MemoryError()
    cdef int bad_axis = 0
    cdef int64_t bad
    try:
        for k in range(m):
            ptrs[k] = <const int64_t *>(<Tensor>cols[k])._data
            dims[k] = v._shape[ix.adv_pos[k]]
            strides[k] = v._strides[ix.adv_pos[k]]
        with nogil:
            bad = mt_index_offsets(p.n, m, ptrs, dims, strides, p.off, &bad_axis)
    finally:
        free(ptrs)
    if bad >= 0:
        value = (<Tensor>cols[bad_axis]).reshape(-1)[bad].item()
        raise IndexError(f"index {value} is out of bounds for axis {ix.adv_pos[bad_axis]} "
                         f"with size {dims[bad_axis]}")
    pos = ix.adv_pos
    p.rest = [d for d in range(v._ndim) if d not in pos]
    adjacent = pos == list(range(pos[0], pos[0] + m))
    p.insert_at = pos[0] if adjacent else 0
    return p


# ------------------------------------------------------------------ get/set

@core_op
def getitem(x, index):
    """``x[index]`` with NumPy semantics (see the module docstring).

    Raises:
        IndexError: out-of-range ints or index values, too many indices,
            float index tensors, mask shape mismatch, unbroadcastable arrays.
        ValueError: a slice step of 0.
    """
    cdef Tensor t = x
    cdef _Indexed ix = parse(t, index)
    if not ix.adv_pos:
        return ix.view
    cdef Tensor v = ix.view
    cdef _Plan p = plan(ix)
    cdef int64_t rshape[16]
    cdef int64_t rstrides[16]
    cdef int nr = len(p.rest), k
    for k in range(nr):
        rshape[k] = v._shape[p.rest[k]]
        rstrides[k] = v._strides[p.rest[k]] * ITEMSIZE[v._dtype]
    out_shape = p.bshape + tuple([rshape[k] for k in range(nr)])
    cdef Tensor out = empty_of(out_shape, v._dtype, v._device)
    cdef int rc
    cdef const mt_index_kernels *kern = _kernels("getitem", v)
    with nogil:
        rc = kern.take(out._data, v._data, p.off, p.n, nr, rshape, rstrides, ITEMSIZE[v._dtype])
    if rc != 0:
        raise backend_error(v._device, rc, "getitem")
    return _move_block(out, len(p.bshape), p.insert_at)


cdef Tensor empty_of(tuple shape, int code, int device):
    cdef int64_t buf[16]
    cdef int i
    if len(shape) > MT_MAX_NDIM:
        raise IndexError(f"indexing would give more than {MT_MAX_NDIM} dimensions")
    for i in range(len(shape)):
        buf[i] = shape[i]
    return empty(len(shape), buf, code, device)


cdef Tensor _move_block(Tensor out, int nb, int at):
    """out is [block(nb), rest...]; move the block to sit at axis ``at``."""
    if at == 0:
        return out
    cdef int nd = out._ndim
    perm = list(range(nb, nb + at)) + list(range(nb)) + list(range(nb + at, nd))
    return out.transpose(perm)


@core_op
def setitem(x, index, value):
    """``x[index] = value``: value broadcasts to the indexed shape and is cast
    to x's dtype (C casts: 2.7 into an int32 tensor stores 2). With repeated
    advanced indices the last write wins.

    Raises the IndexError/ValueError of getitem, ValueError for a value that
    does not broadcast or a read-only tensor."""
    cdef Tensor t = x
    check_writable(t)
    cdef _Indexed ix = parse(t, index)
    if not ix.adv_pos:
        copy_(ix.view, value)
        return
    cdef Tensor v = ix.view
    cdef _Plan p = plan(ix)
    cdef int nr = len(p.rest), k, nb = len(p.bshape)
    cdef int64_t rshape[16]
    cdef int64_t rstrides[16]
    for k in range(nr):
        rshape[k] = v._shape[p.rest[k]]
        rstrides[k] = v._strides[p.rest[k]] * ITEMSIZE[v._dtype]
    rest_shape = tuple([rshape[k] for k in range(nr)])
    # the value, laid out [block, rest] contiguous in t's dtype
    block_first = p.bshape + rest_shape
    result_shape = rest_shape[:p.insert_at] + p.bshape + rest_shape[p.insert_at:]
    cdef Tensor val = empty_of(block_first, t._dtype, t._device)
    dst = _move_block(val, nb, p.insert_at)
    copy_(dst, value)
    cdef const mt_index_kernels *kern = _kernels("setitem", v)
    cdef int rc
    with nogil:
        rc = kern.put(v._data, val._data, p.off, p.n, nr, rshape, rstrides, ITEMSIZE[v._dtype])
    if rc != 0:
        raise backend_error(v._device, rc, "setitem")
    v._st.version += 1      # written (see dispatch.check_writable)


# ------------------------------------------------------------------ gather etc.

@core_op
def nonzero(x, as_tuple=False):
    """Coordinates of nonzero elements, row-major order.

    Returns int32 [n, ndim] (MegEngine's index dtype), or with as_tuple a
    tuple of ndim int64 [n] tensors (NumPy's layout)."""
    cdef Tensor t = x if isinstance(x, Tensor) else coerce(x, default_device_id)
    if not on_host(t._device):     # found on the host, as the count sizes the result
        res = nonzero(t.to("cpu"), as_tuple)
        return tuple(c.to(t.device) for c in res) if as_tuple else res.to(t.device)
    cdef Tensor b = cast(t, 0)   # bool, contiguous
    cdef int64_t n = numel(b), cnt
    with nogil:
        cnt = mt_count_nonzero(<uint8_t *>b._data, n)
    cdef int nd = max(b._ndim, 1)
    cdef Tensor coords = empty_of((cnt, nd), 6, t._device)
    cdef int64_t one = 1
    with nogil:
        if b._ndim == 0:
            mt_nonzero(<uint8_t *>b._data, 1, &one, <int64_t *>coords._data)
        else:
            mt_nonzero(<uint8_t *>b._data, b._ndim, b._shape, <int64_t *>coords._data)
    if as_tuple:
        return tuple(coords[:, k].contiguous() for k in range(nd))
    return cast(coords, 5)


@core_op
def gather(x, axis, index):
    """out[..., i, ...] = x[..., index[..., i, ...], ...] along ``axis``
    (MegEngine F.gather, torch.gather, np.take_along_axis).

    Args:
        x: Tensor [d0, ..., dn].
        axis: int.
        index: integer tensor with x's ndim and index.shape[k] <= x.shape[k]
            for k != axis.

    Returns: Tensor with index's shape and x's dtype.

    Raises: ValueError for ndim/shape mismatch, IndexError for out-of-range
        indices.

    >>> import mgtrace as mt
    >>> gather(mt.tensor([[1, 2], [3, 4]]), 1, mt.tensor([[1, 0], [0, 0]])).tolist()
    [[2, 1], [3, 3]]
    """
    cdef Tensor t = x
    cdef Tensor idx = _index_tensor(index, t._device)
    cdef int ax = normalize_axis(axis, t._ndim)
    if idx._ndim != t._ndim:
        raise ValueError(f"gather: index has {idx._ndim} dims, x has {t._ndim}")
    for k in range(t._ndim):
        if k != ax and idx._shape[k] > t._shape[k]:
            raise ValueError(f"gather: index shape {shape_tuple(idx)} exceeds x shape "
                             f"{shape_tuple(t)} on axis {k}")
    return getitem(t, _along_axis(idx, ax))


cdef tuple _along_axis(Tensor idx, int ax):
    cdef int nd = idx._ndim
    items = []
    for k in range(nd):
        if k == ax:
            items.append(idx)
        else:
            shp = [1] * nd
            shp[k] = idx._shape[k]
            items.append(to_tensor(np.arange(idx._shape[k], dtype=np.int64).reshape(shp), None, idx._device))
    return tuple(items)


@core_op
def scatter(x, axis, index, src):
    """A copy of x with x[..., index[..., i, ...], ...] = src[..., i, ...]
    along ``axis`` (torch.scatter, MegEngine F.scatter); last write wins."""
    cdef Tensor t = x
    cdef Tensor idx = _index_tensor(index, t._device)
    cdef int ax = normalize_axis(axis, t._ndim)
    if idx._ndim != t._ndim:
        raise ValueError(f"scatter: index has {idx._ndim} dims, x has {t._ndim}")
    out = t.copy()
    setitem(out, _along_axis(idx, ax), src)
    return out


@core_op
def concat(tensors, axis=0):
    """Join tensors along an existing axis (dtype by MegEngine promotion).

    Raises: ValueError for an empty list, ndim or shape mismatch, devices
        that differ.

    >>> import mgtrace as mt
    >>> concat([mt.tensor([1, 2]), mt.tensor([3.5])]).tolist()
    [1.0, 2.0, 3.5]
    """
    if not isinstance(tensors, (list, tuple)):
        raise TypeError(f"concat takes a list or tuple of tensors, not {type(tensors).__name__}")
    ts = [x if isinstance(x, Tensor) else None for x in tensors]
    if not tensors:
        raise ValueError("concat needs at least one tensor")
    dev = next(((<Tensor>x)._device for x in ts if x is not None), default_device_id)
    ts = [x if isinstance(x, Tensor) else coerce(x, dev) for x in tensors]
    code = promote_operands(tuple(ts))
    cdef Tensor first = ts[0]
    cdef int ax = normalize_axis(axis, first._ndim)
    cdef int64_t total = 0
    for x in ts:
        t = <Tensor>x
        if t._device != first._device:
            raise ValueError(f"ambiguous device: {DEVICES[first._device]} vs {DEVICES[t._device]}")
        if t._ndim != first._ndim or [t._shape[k] for k in range(t._ndim) if k != ax] != [
                first._shape[k] for k in range(t._ndim) if k != ax]:
            raise ValueError(f"concat: shapes {shape_tuple(first)} and {shape_tuple(t)} differ "
                             f"outside axis {ax}")
        total += t._shape[ax]
    shp = list(shape_tuple(first))
    shp[ax] = total
    cdef Tensor out = empty_of(tuple(shp), code, first._device)
    cdef int64_t pos = 0
    sl = [slice(None)] * first._ndim
    for x in ts:
        t = <Tensor>x
        sl[ax] = slice(pos, pos + t._shape[ax])
        copy_into(getitem(out, tuple(sl)), t)
        pos += t._shape[ax]
    return out


@core_op
def stack(tensors, axis=0):
    """Join same-shape tensors along a new axis."""
    if not isinstance(tensors, (list, tuple)):
        raise TypeError(f"stack takes a list or tuple of tensors, not {type(tensors).__name__}")
    if not tensors:
        raise ValueError("stack needs at least one tensor")
    dev = next(((<Tensor>x)._device for x in tensors if isinstance(x, Tensor)), default_device_id)
    ts = [x if isinstance(x, Tensor) else coerce(x, dev) for x in tensors]
    shp = shape_tuple(ts[0])
    for t in ts:
        if shape_tuple(t) != shp:
            raise ValueError(f"stack: all tensors need one shape, got {shp} and {shape_tuple(t)}")
    ax = normalize_axis(axis, len(shp) + 1)
    return concat([t.expand_dims(ax) for t in ts], ax)


@core_op
def split(x, nsplits_or_sections, axis=0):
    """Split into views along ``axis``: an int gives that many equal parts
    (ValueError if the size does not divide), a list gives split points
    (MegEngine F.split)."""
    cdef Tensor t = x
    cdef int ax = normalize_axis(axis, t._ndim)
    cdef int64_t size = t._shape[ax]
    if isinstance(nsplits_or_sections, int):
        n = nsplits_or_sections
        if n <= 0 or size % n:
            raise ValueError(f"split: {size} elements on axis {ax} do not divide into {n} equal parts")
        points = [size // n * i for i in range(1, n)]
    else:
        points = [int(p) for p in nsplits_or_sections]
    bounds = [0] + points + [size]
    for i in range(len(bounds) - 1):
        if bounds[i + 1] < bounds[i]:
            raise ValueError(f"split: points {points} must be increasing within 0..{size}")
    sl = [slice(None)] * t._ndim
    out = []
    for i in range(len(bounds) - 1):
        sl[ax] = slice(bounds[i], bounds[i + 1])
        out.append(getitem(t, tuple(sl)))
    return out


@core_op
def embedding(weight, indices):
    """Rows of ``weight`` [num, dim] picked by integer ``indices`` [...]:
    result [..., dim]. IndexError for an index outside 0..num-1."""
    cdef Tensor w = weight
    if w._ndim != 2:
        raise ValueError(f"embedding weight must be 2-d [num, dim], got shape {shape_tuple(w)}")
    cdef Tensor idx = _index_tensor(indices, w._device)
    if idx._dtype == 0:
        raise IndexError("embedding indices must be integers, not bool")
    return getitem(w, idx)

