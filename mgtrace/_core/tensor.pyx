# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The Tensor type: a strided view of reference-counted storage.

Memory: a Tensor points into an ``mt_storage`` (C struct, reference counted
under the GIL). Host storage is 64-byte aligned. Views (reshape of
compatible strides, transpose, basic slicing, expand_dims, squeeze,
broadcast_to) share the storage; strides are counted in elements.
"""
from cpython.ref cimport PyObject, Py_INCREF, Py_DECREF
from cpython.pycapsule cimport PyCapsule_New, PyCapsule_GetPointer, PyCapsule_IsValid, PyCapsule_SetName
from libc.stdint cimport int64_t, uint8_t, uint64_t
from libc.stdlib cimport malloc, free
from cpython.buffer cimport PyObject_GetBuffer, PyBuffer_Release, PyBUF_SIMPLE
from libc.string cimport memcpy, memset

import sys as _sys

import numpy as np
cimport numpy as cnp

from mgtrace._core.kernels cimport (
    mt_storage, mt_storage_new_host, mt_storage_wrap, mt_storage_decref,
    mt_host_cache_set_limit, mt_host_cached_bytes, mt_host_cache_clear,
    MT_DEV_CPU, MT_DEV_CUDA, MT_MAX_NDIM, mt_backend, MT_BK_ENOMEM, MT_BK_ENOKERNEL,
    MT_COPY_H2D, MT_COPY_D2H, MT_COPY_D2D, mt_cpu_backend)
from mgtrace._core.dtype cimport NP_DTYPES, ITEMSIZE, CATEGORY, dtype_code, np_dtype
from mgtrace._core.device cimport Device, DEVICES, default_device_id, device_id, device_of
from mgtrace._core.dtype import NAMES as _DTYPE_NAMES, qdtype_str as _qdtype_str
from mgtrace.errors import DeviceError, DeviceUnavailable, NoKernelError  # a leaf module: no layer above

cnp.import_array()

cdef binary_fn _binary = NULL
cdef unary_fn _unary = NULL
cdef traced_fn _traced = NULL
cdef unsigned long _no_tracing = 0
cdef unsigned long *_tracing = &_no_tracing   # dispatch's module-tracing switch (see traced_here)
cdef object _hook = None            # the trace hook object, set with the switch by dispatch
_OPS = {}   # Python-level ops installed by the other core modules (copy, getitem, reductions...)


cdef object trace_hook():
    return _hook


cdef void set_trace_hook(object hook) noexcept:
    global _hook
    _hook = hook


cdef void install_dispatch(binary_fn b, unary_fn u, traced_fn t, unsigned long *tracing) noexcept:
    global _binary, _unary, _traced, _tracing
    _binary = b
    _unary = u
    _traced = t
    _tracing = tracing


def _install_ops(**ops):
    """Give Tensor its non-elementwise methods (called by mgtrace._core)."""
    _OPS.update(ops)


# op codes, filled from the C name tables by dispatch (see kernels/contract/mt_ops.h)
cdef int B_ADD, B_SUB, B_MUL, B_TRUEDIV, B_FLOORDIV, B_MOD, B_POW
cdef int B_EQ, B_NE, B_LT, B_LE, B_GT, B_GE, B_AND, B_OR, B_XOR, B_LSHIFT, B_RSHIFT
cdef int U_NEG, U_ABS, U_INVERT


def _install_codes(dict binary, dict unary):
    global B_ADD, B_SUB, B_MUL, B_TRUEDIV, B_FLOORDIV, B_MOD, B_POW
    global B_EQ, B_NE, B_LT, B_LE, B_GT, B_GE, B_AND, B_OR, B_XOR, B_LSHIFT, B_RSHIFT
    global U_NEG, U_ABS, U_INVERT
    B_ADD, B_SUB, B_MUL = binary["add"], binary["sub"], binary["mul"]
    B_TRUEDIV, B_FLOORDIV, B_MOD, B_POW = binary["truediv"], binary["floordiv"], binary["mod"], binary["pow"]
    B_EQ, B_NE, B_LT, B_LE = binary["eq"], binary["ne"], binary["lt"], binary["le"]
    B_GT, B_GE = binary["gt"], binary["ge"]
    B_AND, B_OR, B_XOR = binary["bitwise_and"], binary["bitwise_or"], binary["bitwise_xor"]
    B_LSHIFT, B_RSHIFT = binary["left_shift"], binary["right_shift"]
    U_NEG, U_ABS, U_INVERT = unary["neg"], unary["abs"], unary["bitwise_not"]


# ---------------------------------------------------------------- backends

# One backend per device type (kernels/contract/backend.h), every op's one path:
# backend_of(device) -> its area's kernel table -> the kernel. The CPU's,
# mt_cpu_backend (kernels/cpu/cpu_backend.c), is installed here; each core
# extension fills in its area's CPU table at import (cpu_backend()). The
# CUDA backend is installed by mgtrace._core._cuda when it is first needed
# (so `import mgtrace` never touches CUDA).
cdef const mt_backend *_BACKENDS[2]
_BACKEND_MODULES = {MT_DEV_CUDA: "mgtrace._core._cuda"}
_backend_failures = {}   # device kind -> why its backend is missing (for doctor and errors)
_BACKENDS[MT_DEV_CPU] = &mt_cpu_backend

# per device id (ids are positions in device.DEVICES, never reused): its
# kind and index, read on every op without touching the Device object
cdef enum:
    _NCACHED = 2048              # device.pyx: two types, indices 0..1023
cdef signed char _KIND[_NCACHED]
cdef int _INDEX[_NCACHED]
for _i in range(_NCACHED):
    _KIND[_i] = -1


cdef mt_backend *cpu_backend() noexcept:
    """The CPU's backend, for the core extensions to install their tables."""
    return &mt_cpu_backend


cdef int _cache_device(int device) noexcept:
    cdef Device d = <Device>DEVICES[device]
    cdef int kind = MT_DEV_CUDA if d.type == "cuda" else MT_DEV_CPU
    if device < _NCACHED:
        _INDEX[device] = d.index
        _KIND[device] = kind
    return kind


cdef int device_kind(int device) noexcept:
    """The device type (MT_DEV_CPU, MT_DEV_CUDA) of a device id: the index of
    its backend, not a branch for ops to take (they go through the backend)."""
    if device < _NCACHED and _KIND[device] >= 0:
        return _KIND[device]
    return _cache_device(device)


cdef int install_backend(int kind, const mt_backend *b) except -1:
    """Make ``b`` the backend of device type ``kind`` (NULL: none; the CPU's
    stays, as every host tensor's memory is its)."""
    if _BACKENDS[kind] != &mt_cpu_backend:
        _BACKENDS[kind] = b
    return 0


def backend_status(kind="cuda"):
    """(loaded, reason): whether the backend of a device type is installed,
    and why not (the import error of its extension)."""
    cdef int k = MT_DEV_CUDA if kind == "cuda" else MT_DEV_CPU
    if _BACKENDS[k] == NULL and k not in _backend_failures:
        _load_backend(k)
    return _BACKENDS[k] != NULL, _backend_failures.get(k, "")


cdef int _load_backend(int kind) except -1:
    import importlib
    try:
        importlib.import_module(_BACKEND_MODULES[kind])    # installs itself
    except ImportError as e:
        _backend_failures[kind] = f"{type(e).__name__}: {e}"
    return 0


cdef const mt_backend *backend_of(int device) except NULL:
    """The backend of ``device``'s type, made current for ``device``.

    Raises DeviceUnavailable when that backend's extension is not built or
    does not load (the CPU's is always there)."""
    cdef int kind = device_kind(device), rc
    cdef const mt_backend *b = _BACKENDS[kind]
    if b == NULL:
        if kind not in _backend_failures:
            _load_backend(kind)
        b = _BACKENDS[kind]
        if b == NULL:
            raise _unavailable(device)
    rc = b.activate(_INDEX[device] if device < _NCACHED else (<Device>DEVICES[device]).index)
    if rc != 0:
        raise unavailable(DEVICES[device], str(backend_error(device, rc, "selecting the device")))
    return b


cdef extern from "kernels/cpu/nn.h":
    # the members CUDA's nn table has (kernels/cuda/nn.cu's mtc_nn_kernels):
    # a test stand-in for CUDA copies these from the CPU's, the rest NULL
    ctypedef struct mt_nn_kernels:
        void *conv2d_workspace
        void *conv2d
        void *max_pool2d
        void *avg_pool2d
        void *adaptive_pool2d
        void *resize2d
        void *bias_act

cdef mt_backend _TEST_BACKEND
cdef mt_nn_kernels _TEST_NN
cdef const mt_backend *_TEST_SAVED[2]
_TEST_KINDS = {"cuda": MT_DEV_CUDA}


def _install_test_backend(str kind="cuda", areas=(), bint host_memory=False, bint cpu_only_nn=True):
    """Tests only: install as device type ``kind``'s backend a stand-in
    whose memory is host memory (the CPU's allocator and copies) and whose
    kernel tables are the CPU's for ``areas`` (of "elementwise", "reduce",
    "linalg", "nn", "index", "quant") and empty for the rest: a second device type
    without a GPU, to see what every op does where kernels are missing.
    ``host_memory``: whether it says its memory is the host's (False: it is
    treated as a GPU's, every crossing a copy); ``cpu_only_nn`` False gives
    it an nn table of only the members CUDA's has (conv2d, pooling, resize,
    bias_act): no NCHW16c, attention, conv_transpose2d, pad, layer norm,
    packed weights, conv3d, recurrent cells or backward kernels, a CUDA
    stand-in where an op or gradient meets NoKernelError as on CUDA.
    _remove_test_backend puts back what was there."""
    global _TEST_BACKEND, _TEST_NN
    cdef int k = _TEST_KINDS[kind]
    cdef const mt_nn_kernels *cpu_nn
    unknown = set(areas) - {"elementwise", "reduce", "linalg", "nn", "index", "quant"}
    if unknown:
        raise ValueError(f"unknown kernel areas {sorted(unknown)}")
    _TEST_BACKEND = mt_cpu_backend
    _TEST_BACKEND.name = b"test"
    _TEST_BACKEND.elementwise = mt_cpu_backend.elementwise if "elementwise" in areas else NULL
    _TEST_BACKEND.has_elementwise = mt_cpu_backend.has_elementwise if "elementwise" in areas else NULL
    _TEST_BACKEND.reduce = mt_cpu_backend.reduce if "reduce" in areas else NULL
    _TEST_BACKEND.linalg = mt_cpu_backend.linalg if "linalg" in areas else NULL
    _TEST_BACKEND.nn = mt_cpu_backend.nn if "nn" in areas else NULL
    if "nn" in areas and not cpu_only_nn:
        cpu_nn = <const mt_nn_kernels *>mt_cpu_backend.nn
        memset(&_TEST_NN, 0, sizeof(mt_nn_kernels))
        _TEST_NN.conv2d_workspace = cpu_nn.conv2d_workspace
        _TEST_NN.conv2d = cpu_nn.conv2d
        _TEST_NN.max_pool2d = cpu_nn.max_pool2d
        _TEST_NN.avg_pool2d = cpu_nn.avg_pool2d
        _TEST_NN.adaptive_pool2d = cpu_nn.adaptive_pool2d
        _TEST_NN.resize2d = cpu_nn.resize2d
        _TEST_NN.bias_act = cpu_nn.bias_act
        _TEST_BACKEND.nn = &_TEST_NN
    _TEST_BACKEND.index = mt_cpu_backend.index if "index" in areas else NULL
    _TEST_BACKEND.quant = mt_cpu_backend.quant if "quant" in areas else NULL
    _TEST_BACKEND.host_memory = host_memory
    if _BACKENDS[k] != &_TEST_BACKEND:
        _TEST_SAVED[k] = _BACKENDS[k]
    _BACKENDS[k] = &_TEST_BACKEND


def _remove_test_backend(str kind="cuda"):
    """Undo _install_test_backend(kind)."""
    cdef int k = _TEST_KINDS[kind]
    if _BACKENDS[k] == &_TEST_BACKEND:
        _BACKENDS[k] = _TEST_SAVED[k]
        _TEST_SAVED[k] = NULL


cdef object _unavailable(int device):
    why = _backend_failures.get(device_kind(device), "its extension did not install a backend")
    return unavailable(DEVICES[device], f"this build of mgtrace has no {DEVICES[device].type.upper()} "
                                        f"backend ({why}); build with MGTRACE_CUDA=1")


def require_device(device):
    """The Device of ``device`` (a Device or name) once its backend is there
    and the device usable: what placement (``load(device=...)``,
    ``Module.to``, the CLI's ``--device``) checks before moving anything.

    Raises:
        ValueError: an unknown device name.
        DeviceUnavailable: no backend for its type in this build (no CUDA
            extension, or it does not load), or no such device (a GPU
            index past those the driver shows).
    """
    cdef Device d = device_of(device)
    backend_of(d._id)
    return d


def unavailable(device, why):
    """The DeviceUnavailable for ``device`` (its one wording): why it cannot
    be used, then where to look (``mgtrace doctor``)."""
    return DeviceUnavailable(f"device {device} is not available: {why} (see `mgtrace doctor`)")


def missing_kernel(str op, device, dtype):
    """The NoKernelError of op ``op`` on ``device`` (a Device, name or id)
    for ``dtype`` (a name or code): the one text of a missing kernel."""
    if isinstance(device, int):
        device = DEVICES[device]
    if isinstance(dtype, int):
        dtype = _DTYPE_NAMES[dtype]
    return NoKernelError(f"no kernel for op {op!r} on device {device} with dtype {dtype}")


cdef bint on_host(int device) except -1:
    """Whether ``device``'s memory is host memory (a pointer this process may
    read; devices of such a type share one address space)."""
    return backend_of(device).host_memory != 0


cdef object backend_error(int device, int rc, str what):
    """The exception for a failed backend call: MemoryError when out of
    memory, NotImplementedError for a missing kernel, else DeviceError with
    the backend's own message (the CUDA error string)."""
    cdef int kind = device_kind(device)
    cdef const mt_backend *b = _BACKENDS[kind]
    msg = ""
    if b != NULL and b.last_error != NULL:
        msg = (<bytes>b.last_error()).decode("utf-8", "replace")
    where = f"{what} on {DEVICES[device]}"
    if rc == MT_BK_ENOMEM:
        space = "host" if b != NULL and b.host_memory else "device"
        return MemoryError(f"{where}: out of {space} memory{': ' + msg if msg else ''}")
    if rc == MT_BK_ENOKERNEL:
        return NoKernelError(f"{where}: no kernel{': ' + msg if msg else ''}")
    return DeviceError(f"{where} failed: {msg or f'error code {rc}'}")


cdef int _device_copy(int device, void *dst, const void *src, size_t nbytes, int kind) except -1:
    cdef const mt_backend *b = backend_of(device)
    cdef int rc
    if nbytes == 0:
        return 0
    with nogil:
        rc = b.copy(dst, src, nbytes, kind)
    if rc != 0:
        raise backend_error(device, rc, "copy")
    return 0


def synchronize(device=None):
    """Wait until every kernel queued on ``device`` (a CUDA device; None: the
    default device) has finished. A no-op on CPU devices."""
    cdef int d = device_id(device)
    cdef const mt_backend *b = backend_of(d)
    cdef int rc
    cdef int index = (<Device>DEVICES[d]).index
    with nogil:
        rc = b.synchronize(index)
    if rc != 0:
        raise backend_error(d, rc, "synchronize")


# ---------------------------------------------------------------- storage

MAX_NUMEL = 1 << 62
"""The most elements (and bytes) a tensor may have: every size product the
core computes in int64 then has room to spare, and a shape past it raises
ValueError ("tensor too large") before any memory is asked for."""


cdef str _shape_str(int ndim, const int64_t *shape):
    return str(tuple([shape[i] for i in range(ndim)]))


cdef void _release_pyobject(mt_storage *st) noexcept with gil:
    Py_DECREF(<object>st.ctx)


cdef Tensor empty(int ndim, const int64_t *shape, int dtype, int device):
    """A new contiguous tensor with uninitialised memory."""
    cdef Tensor t = Tensor.__new__(Tensor)
    cdef int64_t n = 1, i
    cdef Device dev = <Device>DEVICES[device]
    if ndim > MT_MAX_NDIM:
        raise ValueError(f"tensors have at most {MT_MAX_NDIM} dimensions, got {ndim}")
    for i in range(ndim - 1, -1, -1):
        if shape[i] < 0:
            raise ValueError(f"negative dimension {shape[i]} in shape")
        t._shape[i] = shape[i]
        t._strides[i] = n
        if shape[i] and n > (<int64_t>1 << 62) // shape[i]:
            raise ValueError(f"tensor too large: shape {_shape_str(ndim, shape)} has more than "
                             f"2**62 elements (element count overflows int64)")
        n *= shape[i]
    if n > (<int64_t>1 << 62) // ITEMSIZE[dtype]:
        raise MemoryError(f"tensor too large: shape {_shape_str(ndim, shape)} of {_DTYPE_NAMES[dtype]} "
                          f"needs more than 2**62 bytes")
    cdef const mt_backend *b = backend_of(device)
    t._st = b.alloc(dev.index, <size_t>(n * ITEMSIZE[dtype]))
    if t._st == NULL:
        if b.host_memory:
            raise MemoryError(f"cannot allocate {n * ITEMSIZE[dtype]} bytes")
        raise backend_error(device, MT_BK_ENOMEM, f"allocating {n * ITEMSIZE[dtype]} bytes")
    t._st.device_index = dev.index
    t._data = t._st.ptr
    t._ndim = ndim
    t._dtype = dtype
    t._device = device
    return t


cdef Tensor empty_like_shape(tuple shape, int dtype, int device):
    cdef int64_t buf[16]
    cdef int nd = parse_shape(shape, buf)
    return empty(nd, buf, dtype, device)


cdef Tensor view_of(Tensor base, int ndim, const int64_t *shape, const int64_t *strides, int64_t offset):
    """A view sharing ``base``'s storage; offset is in elements from base's data."""
    cdef Tensor t = Tensor.__new__(Tensor)
    cdef int i
    if ndim > MT_MAX_NDIM:
        raise ValueError(f"tensors have at most {MT_MAX_NDIM} dimensions, got {ndim}")
    t._st = base._st
    t._st.refcount += 1
    t._data = base._data + offset * ITEMSIZE[base._dtype]
    t._ndim = ndim
    t._dtype = base._dtype
    t._device = base._device
    t._readonly_view = base._readonly_view
    for i in range(ndim):
        t._shape[i] = shape[i]
        t._strides[i] = strides[i]
    t._qdtype = base._qdtype
    return t


# ---- quantized dtypes (mgtrace.quantization.qdtype): a quantized tensor is
# one of the storage dtype (int8, uint8, int32) whose ``_qdtype`` is its
# quantized dtype (a NumPy dtype with MegEngine's metadata: scale, zero
# point), None for every other tensor. Every view, copy and move of one
# keeps it, here; elementwise ops refuse it (dispatch).

cdef inline object qdtype_of(Tensor t):
    """t's quantized dtype, or None."""
    return t._qdtype


cdef object keep_qdtype(Tensor src, object out):
    """``out`` (a Tensor made from src's integers), given src's quantized dtype."""
    if src._qdtype is not None and isinstance(out, Tensor) and (<Tensor>out)._dtype == src._dtype:
        (<Tensor>out)._qdtype = src._qdtype
    return out


cdef object _quantized_astype(Tensor t, object dtype):
    from mgtrace.quantization import qdtype
    return qdtype.astype(t, dtype)


cdef bint _is_qdtype(object dtype):
    meta = getattr(dtype, "metadata", None)
    return meta is not None and "mgb_dtype" in meta


cdef int64_t numel(Tensor t) noexcept:
    cdef int64_t n = 1
    cdef int i
    for i in range(t._ndim):
        n *= t._shape[i]
    return n


cdef bint is_contiguous(Tensor t) noexcept:
    cdef int64_t expect = 1
    cdef int i
    for i in range(t._ndim - 1, -1, -1):
        if t._shape[i] != 1 and t._strides[i] != expect:
            return False
        expect *= t._shape[i]
    return True


cdef int normalize_axis(int64_t axis, int ndim) except -1:
    if axis < -ndim or axis >= ndim:
        raise IndexError(f"axis {axis} is out of bounds for a tensor of dimension {ndim}")
    return <int>(axis + ndim if axis < 0 else axis)


cdef int check_numel(const int64_t *shape, int nd) except -1:
    """ValueError for negative dims or an element count past int64."""
    cdef int64_t n = 1
    cdef int i
    for i in range(nd):
        if shape[i] < 0:
            raise ValueError(f"negative dimension {shape[i]} in shape")
        if shape[i] and n > (<int64_t>1 << 62) // shape[i]:
            raise ValueError(f"tensor too large: shape {_shape_str(nd, shape)} has more than "
                             f"2**62 elements (element count overflows int64)")
        n *= shape[i]
    return 0


cdef tuple shape_tuple(Tensor t):
    return tuple([t._shape[i] for i in range(t._ndim)])


cdef int parse_shape(object shape, int64_t *out) except -1:
    """Reads a shape (int or sequence of ints / 0-d integer tensors) into out."""
    if isinstance(shape, (int, np.integer)) or (isinstance(shape, Tensor) and (<Tensor>shape)._ndim == 0):
        shape = (shape,)
    elif isinstance(shape, Tensor):
        shape = shape.tolist()
    cdef int n = 0
    for d in shape:
        if n >= MT_MAX_NDIM:
            raise ValueError(f"tensors have at most {MT_MAX_NDIM} dimensions")
        if isinstance(d, float) or isinstance(d, bool):
            raise TypeError(f"shape entries must be integers, got {d!r}")
        try:
            out[n] = d.__index__() if not isinstance(d, Tensor) else int(d)
        except AttributeError:
            raise TypeError(f"shape entries must be integers, got {type(d).__name__}") from None
        except OverflowError:
            raise ValueError(f"dimension {d} does not fit int64") from None
        n += 1
    return n


# ------------------------------------------------------------- conversion

cdef Tensor _from_host_array(cnp.ndarray arr, int dtype, int device):
    """Copies a C-contiguous array of matching itemsize into a new tensor."""
    cdef int64_t shape[16]
    cdef int i, nd = arr.ndim
    if nd > MT_MAX_NDIM:
        raise ValueError(f"tensors have at most {MT_MAX_NDIM} dimensions, got {nd}")
    for i in range(nd):
        shape[i] = arr.shape[i]
    cdef Tensor t = empty(nd, shape, dtype, device)
    _device_copy(device, t._data, cnp.PyArray_DATA(arr), <size_t>arr.nbytes, MT_COPY_H2D)
    return t


cdef object _default_array(object data):
    """np.asarray with MegEngine's defaults for Python data: float32 for
    floats, int32 for ints (OverflowError when a value does not fit),
    complex64 for complex numbers."""
    arr = np.asarray(data)
    kind = arr.dtype.kind
    if kind == "f" and arr.dtype != np.float32 and not _has_numpy_leaf(data, np.floating):
        return arr.astype(np.float32)
    if kind == "c" and arr.dtype != np.complex64 and not _has_numpy_leaf(data, np.complexfloating):
        return arr.astype(np.complex64)
    if kind in "iu" and arr.dtype != np.int32 and not _has_numpy_leaf(data, np.integer):
        if arr.size and (arr.max() > 2147483647 or arr.min() < -2147483648):
            raise OverflowError(
                "Python integers out of range for the default dtype int32; "
                "pass dtype='int64'")
        return arr.astype(np.int32)
    if kind in "OUSV":
        raise TypeError(f"cannot make a tensor from {type(data).__name__} data "
                        f"(NumPy sees dtype {arr.dtype})")
    return arr


cdef object _checked_array(object data, int code):
    """Python data for an explicit dtype: integers must fit it (OverflowError,
    as for scalars in arithmetic); floats convert by C casts."""
    try:
        arr = np.asarray(data)
    except OverflowError:
        arr = np.asarray(data, dtype=object)
    if arr.dtype.kind == "O" and CATEGORY[code] != 3:
        # ints beyond int64/uint64: NumPy keeps them as Python objects
        vals = [v for v in arr.reshape(-1).tolist() if isinstance(v, int)]
        if len(vals) == arr.size:
            arr = np.asarray(vals if arr.ndim else vals[0], dtype=object).reshape(arr.shape)
            lo, hi = min(vals, default=0), max(vals, default=0)
            raise OverflowError(f"Python integer {hi if hi > 0 else lo} out of bounds for "
                                f"{_DTYPE_NAMES[code]}")
    if arr.dtype.kind in "OUSV" or arr.dtype.kind == "c" and CATEGORY[code] != 4:
        raise TypeError(f"cannot make a {_DTYPE_NAMES[code]} tensor from {type(data).__name__} "
                        f"data (NumPy sees dtype {arr.dtype})" + (
                            "; take F.real / F.imag of a complex tensor"
                            if arr.dtype.kind == "c" else ""))
    if arr.dtype.kind in "iu" and CATEGORY[code] == 2 and arr.size:
        info = np.iinfo(NP_DTYPES[code])
        lo, hi = int(arr.min()), int(arr.max())
        if lo < info.min or hi > info.max:
            bad = lo if lo < info.min else hi
            raise OverflowError(f"Python integer {bad} out of bounds for {_DTYPE_NAMES[code]} "
                                f"(range {info.min}..{info.max})")
    return arr


cdef bint _has_numpy_leaf(object data, object kind):
    # a list of NumPy scalars keeps their dtype, like NumPy
    while isinstance(data, (list, tuple)) and len(data):
        data = data[0]
    return isinstance(data, kind) or isinstance(data, np.ndarray) or isinstance(data, Tensor)


cdef Tensor to_tensor(object data, object dtype, int device):
    """Converts tensors, arrays, scalars and nested lists to a new Tensor."""
    cdef int code
    if isinstance(data, Tensor):
        t = <Tensor>data
        out = t.astype(dtype) if dtype is not None else t.copy()
        if (<Tensor>out)._device != device:
            out = out.to(DEVICES[device])
        return out
    if isinstance(data, np.ndarray) or isinstance(data, np.generic):
        arr = np.asarray(data)
        if arr.dtype.kind in "OUSV" and not (arr.dtype.kind == "V" and arr.dtype == np_dtype(8)):
            raise TypeError(f"cannot make a tensor from a NumPy array of dtype {arr.dtype}")
        if arr.dtype.kind == "c" and dtype is not None and CATEGORY[dtype_code(dtype)] != 4:
            raise TypeError(f"cannot make a {np_dtype(dtype_code(dtype))} tensor from "
                            f"a {arr.dtype} array: it would drop the imaginary part; take "
                            f"arr.real / arr.imag first")
        if not arr.dtype.isnative:     # '>f4' -> float32: the data is copied anyway
            arr = arr.astype(arr.dtype.newbyteorder("="))
        elif arr.dtype.kind == "b":    # a bool byte other than 0/1 (a view of raw bytes) is
            arr = arr.view(np.uint8) != 0    # True, as NumPy reads it: stored as 1
    elif hasattr(data, "__dlpack__") and not isinstance(data, (list, tuple)):
        arr = np.from_dlpack(data)
    elif dtype is not None:
        arr = _checked_array(data, dtype_code(dtype))
    else:
        arr = _default_array(data)
    code = dtype_code(dtype) if dtype is not None else dtype_code(arr.dtype)
    arr = np.asarray(arr, dtype=np_dtype(code), order="C")  # keeps 0-d (ascontiguousarray would not)
    return _from_host_array(arr, code, device)


def tensor(data, dtype=None, device=None):
    """Make a new Tensor from data (always copies).

    Args:
        data: a Tensor, NumPy array or scalar, Python scalar, or nested
            lists/tuples of those.
        dtype: result dtype (name, type or NumPy dtype). Default: the
            array's dtype for NumPy input; for Python data bool, int32 or
            float32 (MegEngine defaults).
        device: ``"cpu"``, ``"cpu:1"``, ``"cuda:0"``, a Device, or None for
            the default device.

    Raises:
        TypeError: unsupported dtype or data (strings, objects, complex).
        OverflowError: Python ints that do not fit int32 with no dtype given.

    >>> tensor([1, 2, 3]).dtype
    dtype('int32')
    >>> tensor([1.0]).dtype
    dtype('float32')
    """
    if traced_here(_tracing[0]):                 # a module is traced: the tracer records the creation
        return _hook.on_create(None, data, dtype, device)
    return to_tensor(data, dtype, device_id(device))


# ---------------------------------------------------------------- DLPack

cdef extern from *:
    """
    #include <stdint.h>
    typedef struct { int32_t device_type; int32_t device_id; } mt_DLDevice;
    typedef struct { uint8_t code; uint8_t bits; uint16_t lanes; } mt_DLDataType;
    typedef struct {
        void *data; mt_DLDevice device; int32_t ndim; mt_DLDataType dtype;
        int64_t *shape; int64_t *strides; uint64_t byte_offset;
    } mt_DLTensor;
    typedef struct mt_DLManagedTensor {
        mt_DLTensor dl_tensor; void *manager_ctx;
        void (*deleter)(struct mt_DLManagedTensor *self);
    } mt_DLManagedTensor;
    typedef struct { uint32_t major; uint32_t minor; } mt_DLPackVersion;
    typedef struct mt_DLManagedTensorVersioned {
        mt_DLPackVersion version; void *manager_ctx;
        void (*deleter)(struct mt_DLManagedTensorVersioned *self);
        uint64_t flags; mt_DLTensor dl_tensor;
    } mt_DLManagedTensorVersioned;
    """
    ctypedef struct mt_DLDevice:
        int device_type
        int device_id
    ctypedef struct mt_DLDataType:
        uint8_t code
        uint8_t bits
        unsigned short lanes
    ctypedef struct mt_DLTensor:
        void *data
        mt_DLDevice device
        int ndim
        mt_DLDataType dtype
        int64_t *shape
        int64_t *strides
        unsigned long long byte_offset
    ctypedef struct mt_DLManagedTensor:
        mt_DLTensor dl_tensor
        void *manager_ctx
        void (*deleter)(mt_DLManagedTensor *) noexcept
    ctypedef struct mt_DLPackVersion:
        unsigned int major
        unsigned int minor
    ctypedef struct mt_DLManagedTensorVersioned:
        mt_DLPackVersion version
        void *manager_ctx
        void (*deleter)(mt_DLManagedTensorVersioned *) noexcept
        unsigned long long flags
        mt_DLTensor dl_tensor

# DLPack dtype codes: 0 int, 1 uint, 2 float, 4 bfloat, 6 bool
cdef int _DL_CODE[13]
_DL_CODE[:] = [6, 0, 1, 0, 1, 0, 0, 2, 4, 2, 2, 5, 5]     # DLPack's kDLComplex is 5
cdef int _DL_CPU = 1, _DL_CUDA = 2


cdef void _dl_deleter(mt_DLManagedTensor *m) noexcept with gil:
    Py_DECREF(<object>m.manager_ctx)
    free(m.dl_tensor.shape)
    free(m)


cdef void _dl_capsule_destructor(object capsule) noexcept:
    # a consumer renames the capsule to "used_dltensor"; only an unused one is ours to free
    if PyCapsule_IsValid(capsule, "dltensor"):
        m = <mt_DLManagedTensor *>PyCapsule_GetPointer(capsule, "dltensor")
        if m.deleter != NULL:
            m.deleter(m)


cdef void _dlv_deleter(mt_DLManagedTensorVersioned *m) noexcept with gil:
    Py_DECREF(<object>m.manager_ctx)
    free(m.dl_tensor.shape)
    free(m)


cdef void _dlv_capsule_destructor(object capsule) noexcept:
    if PyCapsule_IsValid(capsule, "dltensor_versioned"):
        m = <mt_DLManagedTensorVersioned *>PyCapsule_GetPointer(capsule, "dltensor_versioned")
        if m.deleter != NULL:
            m.deleter(m)


cdef int _fill_dltensor(Tensor t, mt_DLTensor *dl) except -1:
    """Describe t in dl (shape and strides in one malloc'd block)."""
    cdef int64_t *dims = <int64_t *>malloc(sizeof(int64_t) * 2 * (t._ndim + 1))
    cdef int i
    if dims == NULL:
        raise MemoryError()
    for i in range(t._ndim):
        dims[i] = t._shape[i]
        dims[t._ndim + 1 + i] = t._strides[i]
    dl.data = t._data
    is_cuda = DEVICES[t._device].type == "cuda"
    dl.device.device_type = _DL_CUDA if is_cuda else _DL_CPU
    dl.device.device_id = (<Device>DEVICES[t._device]).index if is_cuda else 0
    dl.ndim = t._ndim
    dl.dtype.code = _DL_CODE[t._dtype]
    dl.dtype.bits = ITEMSIZE[t._dtype] * 8
    dl.dtype.lanes = 1
    dl.shape = dims
    dl.strides = dims + t._ndim + 1
    dl.byte_offset = 0
    return 0


cdef void _release_dlpack(mt_storage *st) noexcept with gil:
    cdef mt_DLManagedTensor *m = <mt_DLManagedTensor *>st.ctx
    if m.deleter != NULL:
        m.deleter(m)


cdef void _release_dlpack_v(mt_storage *st) noexcept with gil:
    cdef mt_DLManagedTensorVersioned *m = <mt_DLManagedTensorVersioned *>st.ctx
    if m.deleter != NULL:
        m.deleter(m)


cdef object _capsule(Tensor self, max_version, bint readonly):
    """A DLPack capsule of ``self`` (versioned when the consumer asks with
    max_version >= (1, 0)), flagged read-only when ``readonly``."""
    # the consumer's stream may not wait for ours: finish our work first
    synchronize(DEVICES[self._device])
    cdef mt_DLManagedTensor *m
    cdef mt_DLManagedTensorVersioned *mv
    if max_version is not None and max_version[0] >= 1:
        mv = <mt_DLManagedTensorVersioned *>malloc(sizeof(mt_DLManagedTensorVersioned))
        if mv == NULL:
            raise MemoryError()
        try:
            _fill_dltensor(self, &mv.dl_tensor)
        except MemoryError:
            free(mv)
            raise
        mv.version.major = 1
        mv.version.minor = 0
        mv.flags = 1 if readonly else 0   # DLPACK_FLAG_BITMASK_READ_ONLY
        mv.manager_ctx = <void *>self
        mv.deleter = _dlv_deleter
        Py_INCREF(self)
        return PyCapsule_New(mv, "dltensor_versioned", _dlv_capsule_destructor)
    m = <mt_DLManagedTensor *>malloc(sizeof(mt_DLManagedTensor))
    if m == NULL:
        raise MemoryError()
    try:
        _fill_dltensor(self, &m.dl_tensor)
    except MemoryError:
        free(m)
        raise
    m.manager_ctx = <void *>self
    m.deleter = _dl_deleter
    Py_INCREF(self)
    return PyCapsule_New(m, "dltensor", _dl_capsule_destructor)


class _UnsharedExport:
    """The DLPack producer of :func:`unshared_view`."""

    def __init__(self, Tensor t, bint writable):
        self._t, self._writable = t, writable

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        return _capsule(self._t, max_version, self._t.readonly or not self._writable)

    def __dlpack_device__(self):
        return self._t.__dlpack_device__()


def unshared_view(Tensor t, bint writable=False):
    """A NumPy array sharing contiguous CPU tensor ``t``'s memory, for the
    archive writer and reader, without marking the storage shared.

    ``t.__dlpack__`` marks a writable storage shared (others may write it
    unseen), which turns conv2d's packed-weight cache off for it for good;
    saving a module must not do that to its weights. The caller promises
    that every write through a ``writable`` view (the reader filling fresh
    memory) happens before anything computes from ``t``, and that it keeps
    no view past that. Read-only unless ``writable`` (NumPy 2.1 and newer
    honour DLPack's read-only flag).

    Raises:
        ValueError: ``t`` is not a contiguous CPU tensor.
    """
    if DEVICES[t._device].type != "cpu" or not t.is_contiguous:
        raise ValueError("unshared_view needs a contiguous CPU tensor")
    return np.from_dlpack(_UnsharedExport(t, writable))


def from_dlpack(x):
    """Zero-copy import of a DLPack producer (NumPy array, PyTorch tensor...).

    The result shares memory with ``x`` (DLPack 1.0 capsules when the
    producer offers them; a producer's read-only flag makes the tensor
    read-only).

    Raises:
        TypeError: ``x`` has no ``__dlpack__``, or an unsupported dtype.
        ValueError: more than 16 dimensions.
        NotImplementedError: memory on a device this build has no backend for.
    """
    if isinstance(x, Tensor):
        return x
    if not hasattr(x, "__dlpack__"):
        raise TypeError(f"{type(x).__name__} does not support DLPack (__dlpack__)")
    kw = {}
    if hasattr(x, "__dlpack_device__") and x.__dlpack_device__()[0] == _DL_CUDA:
        # stream 1: the legacy default stream, which the CUDA backend's
        # (blocking) streams wait for: the producer orders its work before it
        kw["stream"] = 1
    try:
        capsule = x.__dlpack__(max_version=(1, 0), **kw)
    except TypeError:   # a producer from before DLPack 1.0
        capsule = x.__dlpack__(**kw)
    cdef mt_DLManagedTensor *m = NULL
    cdef mt_DLManagedTensorVersioned *mv = NULL
    cdef mt_DLTensor *dl
    cdef bint readonly = False
    if PyCapsule_IsValid(capsule, "dltensor_versioned"):
        mv = <mt_DLManagedTensorVersioned *>PyCapsule_GetPointer(capsule, "dltensor_versioned")
        if mv.version.major > 1:
            raise TypeError(f"DLPack {mv.version.major}.{mv.version.minor} is newer than this reader (1.x)")
        dl = &mv.dl_tensor
        readonly = (mv.flags & 1) != 0
    elif PyCapsule_IsValid(capsule, "dltensor"):
        m = <mt_DLManagedTensor *>PyCapsule_GetPointer(capsule, "dltensor")
        dl = &m.dl_tensor
    else:
        raise TypeError("__dlpack__() returned neither a 'dltensor' nor a 'dltensor_versioned' capsule")
    cdef int code = _dl_dtype_code(dl)
    cdef int kind = MT_DEV_CPU, device = 0
    if dl.device.device_type == _DL_CUDA:
        kind = MT_DEV_CUDA
        device = device_id(f"cuda:{dl.device.device_id}")
        backend_of(device)          # the CUDA backend must be there to use the memory
    elif dl.device.device_type != _DL_CPU:
        raise NotImplementedError(f"DLPack device type {dl.device.device_type} is not supported "
                                  f"(CPU is 1, CUDA is 2)")
    if dl.ndim > MT_MAX_NDIM:
        raise ValueError(f"tensors have at most {MT_MAX_NDIM} dimensions")
    PyCapsule_SetName(capsule, "used_dltensor_versioned" if mv != NULL else "used_dltensor")
    cdef Tensor t = Tensor.__new__(Tensor)
    cdef int64_t n = 1
    cdef int i
    for i in range(dl.ndim - 1, -1, -1):
        t._shape[i] = dl.shape[i]
        t._strides[i] = dl.strides[i] if dl.strides != NULL else n
        n *= dl.shape[i]
    cdef int index = (<Device>DEVICES[device]).index if kind == MT_DEV_CUDA else 0
    if mv != NULL:
        t._st = mt_storage_wrap(dl.data, <size_t>(n * ITEMSIZE[code]), kind, index,
                                _release_dlpack_v, <void *>mv)
    else:
        t._st = mt_storage_wrap(dl.data, <size_t>(n * ITEMSIZE[code]), kind, index,
                                _release_dlpack, <void *>m)
    if t._st == NULL:
        if mv != NULL:
            mv.deleter(mv)
        else:
            m.deleter(m)
        raise MemoryError()
    t._st.readonly = readonly
    # foreign memory: its owner may write it unseen, read-only flag or not
    # (a read-only NumPy view of a writable array), so no cache may trust
    # its version (see mark_immutable)
    t._st.shared = 1
    t._data = <char *>dl.data + dl.byte_offset
    t._ndim = dl.ndim
    t._dtype = code
    t._device = device
    return t


cdef void _release_buffer(mt_storage *st) noexcept with gil:
    cdef Py_buffer *view = <Py_buffer *>st.ctx
    PyBuffer_Release(view)
    free(view)


def wrap_buffer(buf, Py_ssize_t offset, shape, dtype, bint immutable=False):
    """A read-only CPU tensor over bytes of ``buf`` (an mmap, memoryview or
    bytes: any object with the buffer protocol), without a copy: ``shape``
    and ``dtype``, C-contiguous, starting ``offset`` bytes in. One call per
    tensor: the archive reader's path for mmap loads (from_dlpack of a NumPy
    view cost several Python-level steps a tensor). The tensor holds a
    buffer export of ``buf`` while its storage lives, so a mapping cannot be
    closed under it. ``immutable``: the caller vouches that nothing writes
    that memory while the tensor lives (see :func:`mark_immutable`);
    otherwise no cache trusts it.

    Raises:
        TypeError: ``buf`` has no buffer; ``dtype`` is not one of mgtrace's.
        ValueError: a negative dimension, more than 16 dimensions, bytes
            past the end of ``buf``, or a start not aligned to the dtype's
            item size.
    """
    cdef int code = dtype_code(dtype)
    cdef int64_t dims[MT_MAX_NDIM]
    cdef int ndim = parse_shape(shape, dims), i
    cdef Py_buffer *view = <Py_buffer *>malloc(sizeof(Py_buffer))
    if view == NULL:
        raise MemoryError()
    try:
        PyObject_GetBuffer(buf, view, PyBUF_SIMPLE)
    except BaseException:
        free(view)
        raise
    cdef Py_ssize_t n = ITEMSIZE[code]
    cdef str bad = None
    for i in range(ndim):
        if dims[i] < 0:
            bad = f"negative dimension in shape {_shape_str(ndim, dims)}"
        elif dims[i] and n > view.len // dims[i]:
            bad = f"shape {_shape_str(ndim, dims)} needs more bytes than the buffer has"
        if bad is not None:
            break
        n *= dims[i]
    if bad is None and (offset < 0 or offset > view.len or n > view.len - offset):
        bad = f"{n} bytes at offset {offset} run past the buffer's end ({view.len} bytes)"
    cdef char *ptr = <char *>view.buf + (offset if bad is None else 0)
    if bad is None and <size_t>ptr % <size_t>ITEMSIZE[code]:
        bad = f"offset {offset} is not aligned for {_DTYPE_NAMES[code]}"
    cdef mt_storage *st = NULL
    if bad is None:
        st = mt_storage_wrap(ptr, <size_t>n, MT_DEV_CPU, 0, _release_buffer, <void *>view)
    if st == NULL:
        PyBuffer_Release(view)
        free(view)
        if bad is not None:
            raise ValueError(f"wrap_buffer: {bad}")
        raise MemoryError()
    cdef Tensor t = Tensor.__new__(Tensor)
    t._st = st
    st.readonly = 1
    st.shared = 0 if immutable else 1
    t._data = ptr
    t._ndim = ndim
    t._dtype = code
    t._device = 0
    cdef int64_t stride = 1
    for i in range(ndim - 1, -1, -1):
        t._shape[i] = dims[i]
        t._strides[i] = stride
        stride *= dims[i]
    return t


# Storages whose end a cache of values derived from them wants to hear of
# (conv2d's packed weights: see watch_storage), by uid, and the one listener.
cdef set _watched = set()
cdef object _on_storage_end = None


cdef object _is_finalizing = _sys.is_finalizing


cdef void _storage_ended(uint64_t uid) noexcept:
    # (noexcept: an error in the listener is reported as unraisable, as in a
    # __del__; not called while the interpreter shuts down, when the
    # listener's module may be torn down already and no cache matters)
    _watched.discard(uid)
    if _on_storage_end is not None and not _is_finalizing():
        _on_storage_end(uid)


def set_storage_end_listener(listener):
    """Install ``listener(uid)``, called when the last tensor holding a
    watched storage (:func:`watch_storage`) is freed, with that storage's
    uid; None removes it. One listener (conv2d's weight cache); returns
    the previous one. A storage whose last holder is not a Tensor (a DLPack
    capsule handed out) ends unheard: the cache's own bound still holds."""
    global _on_storage_end
    old, _on_storage_end = _on_storage_end, listener
    return old


def watch_storage(Tensor t):
    """Report the end of ``t``'s storage to the storage-end listener, once;
    returns the storage's uid (unique over the process's lifetime)."""
    _watched.add(t._st.uid)
    return t._st.uid


def mark_immutable(Tensor t):
    """Vouch that nothing writes read-only tensor ``t``'s memory while its
    storage lives (the archive reader's read-only mapping of a file it
    opened), so that caches of values derived from it (conv2d's packed
    weights) may keep them. A tensor imported through DLPack is otherwise
    never trusted: the producer's read-only flag does not stop the owner of
    the memory writing it.

    Raises:
        ValueError: ``t`` is writable.
    """
    if not t._st.readonly:
        raise ValueError("mark_immutable takes a read-only tensor")
    t._st.shared = 0


cdef Tensor _copy_across(Tensor t, int dev):
    """A contiguous copy of t on device ``dev`` when one of the two devices is
    not a CPU: made contiguous where it is, then one bulk copy (through the
    host between two GPUs). The copy to the host waits for t's kernels."""
    cdef int src = t._device
    cdef Tensor c = t.contiguous(), out
    cdef bint src_host = on_host(src)
    cdef size_t nbytes = <size_t>(numel(c) * ITEMSIZE[c._dtype])
    if not src_host and not on_host(dev):
        return _copy_across(_copy_across(c, 0), dev)
    out = empty(c._ndim, c._shape, c._dtype, dev)
    if src_host:
        _device_copy(dev, out._data, c._data, nbytes, MT_COPY_H2D)
    else:
        _device_copy(src, out._data, c._data, nbytes, MT_COPY_D2H)
    return out


cdef int _dl_dtype_code(mt_DLTensor *dl) except -1:
    cdef int i, bits = dl.dtype.bits
    for i in range(13):
        # code 2 (float) with 16 bits is float16, never bfloat16 (code 4)
        if _DL_CODE[i] == dl.dtype.code and ITEMSIZE[i] * 8 == bits and dl.dtype.lanes == 1:
            return i
    raise TypeError(f"unsupported DLPack dtype (code {dl.dtype.code}, {bits} bits, "
                    f"{dl.dtype.lanes} lanes)")


# ---------------------------------------------------------------- Tensor

cdef class Tensor:
    """An n-dimensional array on a device, with MegEngine's dtype promotion.

    Build one with :func:`mgtrace.tensor`. Arithmetic, comparison and bitwise
    operators broadcast (NumPy rules) and promote (MegEngine rules, see
    :func:`mgtrace.dtype_promotion`).
    """
    # NumPy defers to our reflected operators: ndarray + Tensor -> Tensor
    __array_ufunc__ = None
    # autodiff (mgtrace.autodiff): the gradient GradManager.backward
    # accumulates; an instance attribute once set (MegEngine's Tensor.grad)
    grad = None

    def __cinit__(self):
        self._st = NULL
        self._data = NULL
        self._ndim = 0
        self._dtype = 9
        self._device = 0
        self._readonly_view = False

    def __init__(self, data=None, dtype=None, device=None):
        if data is None:
            data = []
        if traced_here(_tracing[0]) and self._st == NULL:
            _hook.on_create(self, data, dtype, device)   # records it, then runs this again
            return
        cdef Tensor src = to_tensor(data, dtype, device_id(device))
        # take over src's storage
        self._st = src._st
        self._st.refcount += 1
        self._data = src._data
        self._ndim = src._ndim
        self._dtype = src._dtype
        self._device = src._device
        for i in range(src._ndim):
            self._shape[i] = src._shape[i]
            self._strides[i] = src._strides[i]

    def __dealloc__(self):
        if self._st != NULL:
            if self._st.refcount == 1 and _watched and self._st.uid in _watched:
                _storage_ended(self._st.uid)
            mt_storage_decref(self._st)
            self._st = NULL

    # ---- properties
    @property
    def name(self):
        """A label (str or None, default None). Set while a module is traced,
        it names the graph node of this value (MegEngine's ``Tensor.name``)."""
        return getattr(self, "_name", None)

    @name.setter
    def name(self, value):
        if value is not None and not isinstance(value, str):
            raise TypeError(f"a tensor name is a str or None, not {type(value).__name__}")
        setattr(self, "_name", value)
        if traced_here(_tracing[0]) and value:
            _hook.on_name(self, value)

    @property
    def shape(self):
        """Dimensions, a tuple of ints (while a module is traced, ints that
        remember where they came from, so shape arithmetic is recorded)."""
        if traced_here(_tracing[0]):
            return _hook.on_shape(self)
        return tuple([self._shape[i] for i in range(self._ndim)])

    @property
    def ndim(self):
        return self._ndim

    @property
    def size(self):
        """Number of elements."""
        _frozen(self, "t.size")
        return numel(self)

    @property
    def dtype(self):
        """A NumPy dtype: ``t.dtype == "float32"`` and ``t.dtype == np.float32`` both hold.
        A quantized tensor's is its storage dtype (int8, uint8, int32) carrying
        the scale and zero point as MegEngine's metadata (``dtype.metadata
        ["mgb_dtype"]``, see :mod:`mgtrace.quantization.qdtype`)."""
        if self._qdtype is not None:
            return self._qdtype
        return np_dtype(self._dtype)

    @property
    def device(self):
        return DEVICES[self._device]

    @property
    def strides(self):
        """Strides in elements (not bytes, unlike NumPy)."""
        _frozen(self, "t.strides")
        return tuple([self._strides[i] for i in range(self._ndim)])

    @property
    def itemsize(self):
        return ITEMSIZE[self._dtype]

    @property
    def nbytes(self):
        _frozen(self, "t.nbytes")
        return numel(self) * ITEMSIZE[self._dtype]

    @property
    def data_ptr(self):
        """Address of the first element (for interop and tests)."""
        return <size_t>self._data

    @property
    def is_contiguous(self):
        return is_contiguous(self)

    @property
    def readonly(self):
        """True for memory that must not be written: a read-only producer's
        (DLPack, mmap) or a broadcast view, whose elements alias each other."""
        return bool(self._st.readonly or self._readonly_view)

    @property
    def T(self):
        return self.transpose()

    def _storage_id(self):
        return <size_t>self._st

    @property
    def _version(self):
        """The storage's count of in-place writes (autodiff checks that a
        tensor saved for backward was not written since)."""
        return self._st.version

    def detach(self):
        """A tensor sharing self's memory that no GradManager records
        (MegEngine's ``Tensor.detach``): gradients do not flow through it."""
        if traced_here(_tracing[0]):     # no core op: the hook (tracer or autodiff recorder) decides
            return _hook.on_method(self, "detach", ())
        return view_of(self, self._ndim, self._shape, self._strides, 0)

    # ---- conversion
    def numpy(self):
        """A NumPy array holding a copy of the values (MegEngine semantics).

        For zero-copy exchange use DLPack (``np.from_dlpack(t)``)."""
        _frozen(self, "t.numpy()")
        if not on_host(self._device):
            return self.to("cpu").numpy()
        arr = np.empty(self.shape, dtype=np_dtype(self._dtype))
        if numel(self):
            dst = _wrap_ndarray(arr, self._device)
            _OPS["copy_"](dst, self)
        return arr

    def __array__(self, dtype=None, copy=None):
        if copy is False:
            raise ValueError("a Tensor cannot be viewed by NumPy without a copy through "
                             "__array__; use np.from_dlpack(t) for zero-copy")
        arr = self.numpy()
        return arr if dtype is None else arr.astype(dtype, copy=False)

    def item(self):
        """The value of a one-element tensor as a Python scalar.

        Raises ValueError when the tensor has more than one element."""
        if numel(self) != 1:
            raise ValueError(f"item() needs a tensor with one element, this one has {numel(self)}")
        _frozen(self, "t.item() (or int(t), float(t))")
        v = self.numpy().reshape(()).item()
        return float(v) if self._dtype == 8 else v

    def tolist(self):
        arr = self.numpy()
        if self._dtype == 8:
            arr = arr.astype(np.float32)
        return arr.tolist()

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        """Export for zero-copy exchange (DLPack 1.0 when the consumer asks
        with max_version >= (1, 0), else the unversioned capsule)."""
        if dl_device is not None and tuple(dl_device) != self.__dlpack_device__():
            raise BufferError(f"__dlpack__: tensor is on {DEVICES[self._device]}; "
                              f"cannot export to DLPack device {tuple(dl_device)}")
        if copy:
            return self.copy().__dlpack__(max_version=max_version)
        if not self.readonly:
            self._st.shared = 1    # the consumer may write it: no cache can trust its version now
        return _capsule(self, max_version, self.readonly)

    def __dlpack_device__(self):
        dev = DEVICES[self._device]
        return (_DL_CUDA, dev.index) if dev.type == "cuda" else (_DL_CPU, 0)

    def astype(self, dtype):
        """A copy converted to ``dtype`` (C casts: floats truncate toward zero
        into ints, anything nonzero is True). Returns self's copy if equal.

        A quantized dtype (``mgtrace.quantization.qint8(0.1)``...) as
        ``dtype``, or a quantized self, quantizes, dequantizes or requantizes
        (:func:`mgtrace.quantization.qdtype.astype`)."""
        if self._qdtype is not None or _is_qdtype(dtype):
            return _quantized_astype(self, dtype)
        return _OPS["cast"](self, dtype_code(dtype))

    def copy(self):
        """A contiguous copy with its own storage (a quantized dtype kept)."""
        return keep_qdtype(self, _OPS["cast"](self, self._dtype))

    def contiguous(self):
        """self when already contiguous, else a contiguous copy."""
        return self if is_contiguous(self) else self.copy()

    def to(self, device):
        """A copy on ``device`` (self if it is already there).

        While a module is traced a move is one recorded ``to(device)`` call
        (not the copy it makes, which would lose the device); under a
        GradManager gradients flow back to self's device."""
        cdef int dev = device_id(device)
        if dev == self._device:
            return self
        if traced_here(_tracing[0]):     # no core op: the hook (tracer or autodiff recorder) decides
            return keep_qdtype(self, _hook.on_method(self, "to", (str(DEVICES[dev]),)))
        if on_host(self._device) and on_host(dev):     # one address space: a plain copy
            out = self.copy()
            (<Tensor>out)._device = dev
            (<Tensor>out)._st.device_index = (<Device>DEVICES[dev]).index
            return out
        return keep_qdtype(self, _copy_across(self, dev))

    # ---- views
    def reshape(self, *shape):
        """A tensor with the same elements in a new shape; one entry may be -1.

        Shares memory when the strides allow it (NumPy's rule), else copies.

        Raises ValueError when the element counts differ."""
        if len(shape) == 1 and not isinstance(shape[0], (int, np.integer)) and not (
                isinstance(shape[0], Tensor) and (<Tensor>shape[0])._ndim == 0):
            shape = shape[0]
        if traced_here(_tracing[0]):
            return _traced("reshape", (self, shape))
        cdef int64_t new[16]
        cdef int64_t strides[16]
        cdef int nd = parse_shape(shape, new)
        _infer_shape(new, nd, numel(self), self.shape)
        if _view_strides(self, new, nd, strides):
            return view_of(self, nd, new, strides, 0)
        return view_of(self.copy(), nd, new, _contig_strides(new, nd, strides), 0)

    def view(self, *shape):
        """Like reshape, but never copies: raises ValueError when the strides
        do not allow the new shape (PyTorch's view), so writes through the
        result always reach self."""
        if len(shape) == 1 and not isinstance(shape[0], (int, np.integer)):
            shape = shape[0]
        if traced_here(_tracing[0]):     # no core op: the tracer records the method itself
            return _hook.on_method(self, "view", (shape,))
        cdef int64_t new[16]
        cdef int64_t strides[16]
        cdef int nd = parse_shape(shape, new)
        _infer_shape(new, nd, numel(self), self.shape)
        if not _view_strides(self, new, nd, strides):
            raise ValueError(f"view: a tensor of shape {self.shape} and strides {self.strides} "
                             f"cannot be viewed as {tuple([new[i] for i in range(nd)])} without a "
                             "copy; use reshape()")
        return view_of(self, nd, new, strides, 0)

    def flatten(self, start_axis=0, end_axis=-1):
        """Merge axes start_axis..end_axis into one (MegEngine's flatten)."""
        if self._ndim == 0:
            return self.reshape(1)
        cdef int s = normalize_axis(start_axis, self._ndim)
        cdef int e = normalize_axis(end_axis, self._ndim)
        if s > e:
            raise ValueError(f"flatten: start_axis {start_axis} comes after end_axis {end_axis}")
        shp = self.shape
        return self.reshape(shp[:s] + (-1,) + shp[e + 1:])

    def transpose(self, *axes):
        """Permute the axes (reverse them when none are given). A view."""
        if len(axes) == 1 and isinstance(axes[0], (tuple, list)):
            axes = tuple(axes[0])
        if traced_here(_tracing[0]):
            return _traced("transpose", (self, axes))
        cdef int nd = self._ndim, i, a
        if not axes:
            axes = tuple(range(nd - 1, -1, -1))
        if len(axes) != nd:
            raise ValueError(f"transpose: {len(axes)} axes given for a tensor of dimension {nd}")
        cdef int64_t shp[16]
        cdef int64_t st[16]
        seen = set()
        for i in range(nd):
            a = normalize_axis(axes[i], nd)
            if a in seen:
                raise ValueError(f"transpose: repeated axis in {axes}")
            seen.add(a)
            shp[i] = self._shape[a]
            st[i] = self._strides[a]
        return view_of(self, nd, shp, st, 0)

    def permute(self, *axes):
        return self.transpose(*axes)

    def expand_dims(self, axis):
        """Insert size-1 axes at ``axis`` (int or sequence, positions in the result)."""
        if traced_here(_tracing[0]):
            return _traced("expand_dims", (self, axis))
        axes = (axis,) if isinstance(axis, (int, np.integer)) else tuple(axis)
        cdef int nd = self._ndim + len(axes), i, j = 0
        norm = sorted({normalize_axis(a, nd) for a in axes})
        if len(norm) != len(axes):
            raise ValueError(f"expand_dims: repeated axis in {axes}")
        cdef int64_t shp[16]
        cdef int64_t st[16]
        if nd > MT_MAX_NDIM:
            raise ValueError(f"tensors have at most {MT_MAX_NDIM} dimensions")
        for i in range(nd):
            if i in norm:
                shp[i] = 1
                st[i] = 0
            else:
                shp[i] = self._shape[j]
                st[i] = self._strides[j]
                j += 1
        return view_of(self, nd, shp, st, 0)

    def squeeze(self, axis=None):
        """Remove size-1 axes (all of them, or those named). A view.

        Raises ValueError when a named axis is not of size 1."""
        cdef int i, nd = 0
        if traced_here(_tracing[0]):
            return _traced("squeeze", (self, axis))
        if axis is None:
            drop = {i for i in range(self._ndim) if self._shape[i] == 1}
        else:
            axes = (axis,) if isinstance(axis, (int, np.integer)) else tuple(axis)
            drop = {normalize_axis(a, self._ndim) for a in axes}
            if len(drop) != len(axes):
                raise ValueError(f"squeeze: repeated axis in {axes}")
            for i in drop:
                if self._shape[i] != 1:
                    raise ValueError(f"squeeze: axis {i} has size {self._shape[i]}, not 1")
        cdef int64_t shp[16]
        cdef int64_t st[16]
        for i in range(self._ndim):
            if i not in drop:
                shp[nd] = self._shape[i]
                st[nd] = self._strides[i]
                nd += 1
        return view_of(self, nd, shp, st, 0)

    def broadcast_to(self, shape):
        """A read-only view with ``shape`` (NumPy broadcasting; stride 0 on
        broadcast axes, so writing to it raises ValueError, as in NumPy).

        Raises ValueError when the shapes do not broadcast or the element
        count overflows int64."""
        if traced_here(_tracing[0]):
            return _traced("broadcast_to", (self, shape))
        cdef int64_t shp[16]
        cdef int64_t st[16]
        cdef int nd = parse_shape(shape, shp), i, j
        check_numel(shp, nd)
        if nd < self._ndim:
            raise ValueError(f"cannot broadcast shape {self.shape} to {tuple(shape)}")
        for i in range(nd):
            j = i - (nd - self._ndim)
            if j < 0:
                st[i] = 0
            elif self._shape[j] == shp[i]:
                st[i] = self._strides[j]
            elif self._shape[j] == 1:
                st[i] = 0
            else:
                raise ValueError(f"cannot broadcast shape {self.shape} to {tuple(shape)}")
        cdef Tensor v = view_of(self, nd, shp, st, 0)
        v._readonly_view = True
        return v

    # ---- indexing
    def __getitem__(self, index):
        if self._qdtype is not None:
            return keep_qdtype(self, _OPS["getitem"](self, index))
        return _OPS["getitem"](self, index)

    def __setitem__(self, index, value):
        if traced_here(_tracing[0]):
            _traced("setitem", (self, index, value))
            return
        _OPS["setitem"](self, index, value)

    def __len__(self):
        if self._ndim == 0:
            raise TypeError("len() of a 0-d tensor")
        _frozen(self, "len(t)")
        return self._shape[0]

    def __iter__(self):
        if self._ndim == 0:
            raise TypeError("iteration over a 0-d tensor")
        _frozen(self, "iterating over t")
        for i in range(self._shape[0]):
            yield self[i]

    # ---- Python protocol
    def __getattr__(self, name):
        # only reached for names Tensor does not have: a function of
        # mgtrace.functional (t.exp()) gets a message that names it
        hint = _OPS.get("attribute_hint") if not name.startswith("_") else None
        raise AttributeError(f"'Tensor' object has no attribute {name!r}"
                             + (hint(name) if hint is not None else ""), name=name, obj=self)

    def __repr__(self):
        cdef int64_t n = numel(self)
        if n > 1 << 20:   # NumPy would summarise; do not materialise a huge view
            return (f"Tensor(<{n} elements, first {self._head_values(6).tolist()}>, shape={self.shape}, "
                    f"dtype={_DTYPE_NAMES[self._dtype]}, device={DEVICES[self._device]})")
        arr = self.numpy()
        if self._dtype == 8:
            arr = arr.astype(np.float32)
        body = np.array2string(arr, separator=", ", prefix="Tensor(", threshold=1000)
        q = qdtype_of(self)
        name = _DTYPE_NAMES[self._dtype] if q is None else _qdtype_str(q)
        return f"Tensor({body}, dtype={name}, device={DEVICES[self._device]})"

    def _head_values(self, int k):
        """The first k elements in C order as a NumPy array (no full copy)."""
        idx = np.unravel_index(np.arange(min(k, numel(self))), self.shape)
        return np.array([self[tuple(int(i[j]) for i in idx)].item() for j in range(len(idx[0]))])

    def __hash__(self):
        return id(self)

    def __bool__(self):
        if numel(self) != 1:
            raise ValueError(f"the truth value of a tensor with {numel(self)} elements is "
                             "ambiguous; use .any() or .all()")
        if traced_here(_tracing[0]):
            _hook.on_bool(self)
        return bool(self.item())

    def __int__(self):
        return int(self.item())

    def __float__(self):
        return float(self.item())

    def __index__(self):
        if CATEGORY[self._dtype] != 2:
            raise TypeError(f"only integer tensors can be used as an index, not {_DTYPE_NAMES[self._dtype]}")
        return int(self.item())

    def __reduce__(self):
        raise TypeError("Tensor does not pickle; save it with mgtrace.save or convert with .numpy()")

    def __copy__(self):
        """A new tensor of the same class with its own copy of the data
        (while a module is traced: a recorded ``copy()``, a plain Tensor)."""
        if traced_here(_tracing[0]):
            return _hook.on_method(self, "copy", ())
        return _copy_as(self, type(self))

    def __deepcopy__(self, memo):
        """As __copy__, with attributes (a subclass's __dict__) deep-copied."""
        cdef Tensor out = Tensor.__copy__(self)
        memo[id(self)] = out
        attrs = getattr(self, "__dict__", None)
        if attrs:
            import copy
            for k, v in attrs.items():
                setattr(out, k, copy.deepcopy(v, memo))
        return out

    # ---- arithmetic (binary dispatch in dispatch.pyx)
    def __add__(self, other): return _binary(B_ADD, self, other, None)
    def __radd__(self, other): return _binary(B_ADD, other, self, None)
    def __iadd__(self, other): return _binary(B_ADD, self, other, self)
    def __sub__(self, other): return _binary(B_SUB, self, other, None)
    def __rsub__(self, other): return _binary(B_SUB, other, self, None)
    def __isub__(self, other): return _binary(B_SUB, self, other, self)
    def __mul__(self, other): return _binary(B_MUL, self, other, None)
    def __rmul__(self, other): return _binary(B_MUL, other, self, None)
    def __imul__(self, other): return _binary(B_MUL, self, other, self)
    def __truediv__(self, other): return _binary(B_TRUEDIV, self, other, None)
    def __rtruediv__(self, other): return _binary(B_TRUEDIV, other, self, None)
    def __itruediv__(self, other): return _binary(B_TRUEDIV, self, other, self)
    def __floordiv__(self, other): return _binary(B_FLOORDIV, self, other, None)
    def __rfloordiv__(self, other): return _binary(B_FLOORDIV, other, self, None)
    def __ifloordiv__(self, other): return _binary(B_FLOORDIV, self, other, self)
    def __mod__(self, other): return _binary(B_MOD, self, other, None)
    def __rmod__(self, other): return _binary(B_MOD, other, self, None)
    def __imod__(self, other): return _binary(B_MOD, self, other, self)
    def __pow__(self, other, mod=None): return _binary(B_POW, self, other, None)
    def __rpow__(self, other, mod=None): return _binary(B_POW, other, self, None)
    def __ipow__(self, other): return _binary(B_POW, self, other, self)
    def __matmul__(self, other): return _OPS["matmul"](self, other)
    def __rmatmul__(self, other): return _OPS["matmul"](other, self)
    def __and__(self, other): return _binary(B_AND, self, other, None)
    def __rand__(self, other): return _binary(B_AND, other, self, None)
    def __iand__(self, other): return _binary(B_AND, self, other, self)
    def __or__(self, other): return _binary(B_OR, self, other, None)
    def __ror__(self, other): return _binary(B_OR, other, self, None)
    def __ior__(self, other): return _binary(B_OR, self, other, self)
    def __xor__(self, other): return _binary(B_XOR, self, other, None)
    def __rxor__(self, other): return _binary(B_XOR, other, self, None)
    def __ixor__(self, other): return _binary(B_XOR, self, other, self)
    def __lshift__(self, other): return _binary(B_LSHIFT, self, other, None)
    def __rlshift__(self, other): return _binary(B_LSHIFT, other, self, None)
    def __ilshift__(self, other): return _binary(B_LSHIFT, self, other, self)
    def __rshift__(self, other): return _binary(B_RSHIFT, self, other, None)
    def __rrshift__(self, other): return _binary(B_RSHIFT, other, self, None)
    def __irshift__(self, other): return _binary(B_RSHIFT, self, other, self)
    def __eq__(self, other):
        return False if other is None else _binary(B_EQ, self, other, None)

    def __ne__(self, other):
        return True if other is None else _binary(B_NE, self, other, None)
    def __lt__(self, other): return _binary(B_LT, self, other, None)
    def __le__(self, other): return _binary(B_LE, self, other, None)
    def __gt__(self, other): return _binary(B_GT, self, other, None)
    def __ge__(self, other): return _binary(B_GE, self, other, None)
    def __neg__(self): return _unary(U_NEG, self, None)
    def __pos__(self): return self
    def __abs__(self): return _unary(U_ABS, self, None)
    def __invert__(self): return _unary(U_INVERT, self, None)

    # ---- reductions and friends (installed by the other core modules)
    def sum(self, axis=None, keepdims=False, dtype=None, out=None):
        """See mgtrace._core.reduce.sum (ints keep their dtype, bool -> int32).
        dtype/out are accepted for NumPy's np.sum(t)."""
        return _finish(_OPS["sum"](self, axis, keepdims), dtype, out)

    def mean(self, axis=None, keepdims=False, dtype=None, out=None):
        """See mgtrace._core.reduce.mean (ints and bool -> float32)."""
        return _finish(_OPS["mean"](self, axis, keepdims), dtype, out)

    def prod(self, axis=None, keepdims=False, dtype=None, out=None):
        """See mgtrace._core.reduce.prod."""
        return _finish(_OPS["prod"](self, axis, keepdims), dtype, out)

    def max(self, axis=None, keepdims=False, out=None):
        """See mgtrace._core.reduce.max (NaN propagates)."""
        return _finish(_OPS["max"](self, axis, keepdims), None, out)

    def min(self, axis=None, keepdims=False, out=None):
        """See mgtrace._core.reduce.min (NaN propagates)."""
        return _finish(_OPS["min"](self, axis, keepdims), None, out)

    def any(self, axis=None, keepdims=False, out=None):
        """See mgtrace._core.reduce.any."""
        return _finish(_OPS["any"](self, axis, keepdims), None, out)

    def all(self, axis=None, keepdims=False, out=None):
        """See mgtrace._core.reduce.all."""
        return _finish(_OPS["all"](self, axis, keepdims), None, out)

    def argmax(self, axis=None, keepdims=False, out=None):
        """See mgtrace._core.reduce.argmax (int32 indices)."""
        return _finish(_OPS["argmax"](self, axis, keepdims), None, out)

    def argmin(self, axis=None, keepdims=False, out=None):
        """See mgtrace._core.reduce.argmin (int32 indices)."""
        return _finish(_OPS["argmin"](self, axis, keepdims), None, out)

    def var(self, axis=None, keepdims=False, ddof=0, dtype=None, out=None):
        """See mgtrace._core.reduce.var (ints and bool -> float32)."""
        return _finish(_OPS["var"](self, axis, keepdims, ddof), dtype, out)

    def std(self, axis=None, keepdims=False, ddof=0, dtype=None, out=None):
        """See mgtrace._core.reduce.std (ints and bool -> float32)."""
        return _finish(_OPS["std"](self, axis, keepdims, ddof), dtype, out)


cdef Tensor _copy_as(Tensor t, type cls):
    """A contiguous copy of t as an instance of cls (Tensor or a subclass)."""
    cdef Tensor c = _OPS["cast"](t, t._dtype)
    cdef Tensor out = cls.__new__(cls)
    out._st = c._st
    out._st.refcount += 1
    out._data = c._data
    out._ndim = c._ndim
    out._dtype = c._dtype
    out._device = c._device
    for i in range(c._ndim):
        out._shape[i] = c._shape[i]
        out._strides[i] = c._strides[i]
    keep_qdtype(t, out)
    return out


cdef inline void _frozen(Tensor t, str what) except *:
    """While a module is traced: tell the tracer that a value is leaving the
    graph (item(), numpy(), len()...), so it can warn that the trace fixes it."""
    if traced_here(_tracing[0]):
        _hook.on_frozen(t, what)


cdef Tensor _share_as(Tensor t, type cls):
    """t's storage, shape and strides as an instance of cls (no copy)."""
    cdef Tensor out = cls.__new__(cls)
    out._st = t._st
    out._st.refcount += 1
    out._data = t._data
    out._ndim = t._ndim
    out._dtype = t._dtype
    out._device = t._device
    out._readonly_view = t._readonly_view
    for i in range(t._ndim):
        out._shape[i] = t._shape[i]
        out._strides[i] = t._strides[i]
    keep_qdtype(t, out)
    return out


def share_as(t, cls):
    """``t`` as an instance of ``cls`` (Tensor or a subclass such as
    Parameter) sharing its memory: no copy; read-only stays read-only.

    Raises:
        TypeError: t is not a Tensor or cls not a Tensor class.
    """
    if not isinstance(t, Tensor):
        raise TypeError(f"share_as takes a Tensor, got {type(t).__name__}")
    if not (isinstance(cls, type) and issubclass(cls, Tensor)):
        raise TypeError(f"share_as makes a Tensor or a subclass of it, not {cls!r}")
    return _share_as(<Tensor>t, cls)


def strided_view(Tensor t, shape, strides, int64_t offset):
    """A view of ``t``'s storage with ``shape`` and ``strides`` (in elements,
    any sign), its first element ``offset`` elements from ``t``'s: what
    the archive reader and ``copy.deepcopy`` rebuild aliases with (a
    buffer that is a slice of a parameter stays one), as torch's
    ``as_strided``. A view with a zero stride on a dimension of more than
    one element is read-only, as broadcast views are.

    Raises:
        ValueError: more than 16 dimensions, ``strides`` of another length
            than ``shape``, or an element outside ``t``'s storage.
    """
    cdef int64_t shp[16]
    cdef int64_t st[16]
    cdef int nd = parse_shape(shape, shp), i
    if len(strides) != nd:
        raise ValueError(f"strided_view: {len(strides)} strides for {nd} dimensions")
    cdef int64_t isz = ITEMSIZE[t._dtype]
    cdef int64_t first = (t._data - t._st.ptr) // isz + offset, lo = first, hi = first
    cdef bint overlap = False
    for i in range(nd):
        st[i] = strides[i]
        if shp[i] == 0:
            lo, hi = 0, -1
            break
        if st[i] > 0:
            hi += st[i] * (shp[i] - 1)
        else:
            lo += st[i] * (shp[i] - 1)
        overlap = overlap or (st[i] == 0 and shp[i] > 1)
    if hi >= lo and (lo < 0 or (hi + 1) * isz > <int64_t>t._st.nbytes):
        raise ValueError(f"strided_view: elements {lo}..{hi} of a storage of "
                         f"{t._st.nbytes // isz} elements; the view runs outside it")
    cdef Tensor v = view_of(t, nd, shp, st, offset)
    v._readonly_view = t._readonly_view or overlap
    return v


def storage_spans(tensors):
    """The tensors among ``tensors`` that view one storage, grouped: what
    the archive writer and ``copy.deepcopy`` keep shared (a buffer and a
    slice of it, a parameter and its transpose).

    Args:
        tensors: a sequence of Tensors. Tensors without elements share
            nothing and are left out.

    Returns:
        one ``(span, members)`` per storage that two or more of them view, in
        order of first appearance: ``span`` is a contiguous 1-D view of that
        storage from the lowest element a member reads to the highest, and
        ``members`` is ``[(index into tensors, element offset of its first
        element in span), ...]``; with :func:`strided_view` (span, its shape,
        its strides, that offset) gives the member back.

    Raises:
        ValueError: two tensors of one storage differ in dtype (the offsets
            would not be whole elements).
    """
    cdef dict groups = {}
    cdef Tensor t
    cdef int64_t isz, first, lo, hi
    cdef int i, k
    for i in range(len(tensors)):
        t = tensors[i]
        if numel(t) == 0:
            continue
        isz = ITEMSIZE[t._dtype]
        first = (t._data - t._st.ptr) // isz
        lo = hi = first
        for k in range(t._ndim):
            if t._strides[k] > 0:
                hi += t._strides[k] * (t._shape[k] - 1)
            else:
                lo += t._strides[k] * (t._shape[k] - 1)
        g = groups.setdefault(<size_t>t._st, [])
        if g and (<Tensor>tensors[g[0][0]])._dtype != t._dtype:
            raise ValueError(f"tensors {g[0][0]} and {i} share memory as different dtypes "
                             f"({tensors[g[0][0]].dtype.name}, {t.dtype.name})")
        g.append((i, first, lo, hi))
    out = []
    for g in groups.values():
        if len(g) < 2:
            continue
        lo, hi = min(m[2] for m in g), max(m[3] for m in g)
        t = tensors[g[0][0]]
        span = strided_view(t, (hi - lo + 1,), (1,), lo - g[0][1])
        out.append((span, [(m[0], m[1] - lo) for m in g]))
    return out


def empty_tensor(shape, dtype="float32", device=None, cls=Tensor):
    """An uninitialized tensor of ``shape`` (contents undefined), as an
    instance of ``cls``. Large ones are fresh pages that take no memory until
    written, which is what loading an archive into a new module wants.

    Raises:
        TypeError/ValueError: as for the shape and dtype of :func:`tensor`.
    """
    if not (isinstance(cls, type) and issubclass(cls, Tensor)):
        raise TypeError(f"empty_tensor makes a Tensor or a subclass of it, not {cls!r}")
    cdef int64_t buf[16]
    cdef int nd = parse_shape(shape, buf)
    return _share_as(empty(nd, buf, dtype_code(dtype), device_id(device)), cls)


cdef object _finish(object res, object dtype, object out):
    """NumPy's dtype= and out= on reductions: cast, then write into out."""
    if dtype is not None:
        res = res.astype(dtype)
    if out is not None:
        _OPS["copy_"](out, res)
        return out
    return res


# ------------------------------------------------------------- view math

cdef int64_t *_contig_strides(const int64_t *shape, int nd, int64_t *out) noexcept:
    cdef int64_t n = 1
    cdef int i
    for i in range(nd - 1, -1, -1):
        out[i] = n
        n *= shape[i]
    return out


cdef int _infer_shape(int64_t *shape, int nd, int64_t total, object old) except -1:
    cdef int i, neg = -1
    cdef int64_t known = 1, nonzero = 1
    for i in range(nd):
        if shape[i] == -1:
            if neg >= 0:
                raise ValueError("reshape: only one dimension can be -1")
            neg = i
        elif shape[i] < 0:
            raise ValueError(f"reshape: invalid dimension {shape[i]}")
        elif shape[i]:
            # checked before multiplying: (2**32, 2**32) wrapped to 0 and
            # passed for an empty tensor, whose views then read past it
            if nonzero > (<int64_t>1 << 62) // shape[i]:
                raise ValueError(f"cannot reshape a tensor of shape {old} ({total} elements) into "
                                 f"{tuple([shape[i] for i in range(nd)])}: that shape has more than "
                                 "2**62 elements (its nonzero dimensions' product)")
            nonzero *= shape[i]
            known *= shape[i]
        else:
            known = 0
    if neg >= 0:
        if known == 0 or total % known:
            raise ValueError(f"cannot reshape a tensor of shape {old} ({total} elements) "
                             f"into {tuple([shape[i] for i in range(nd)])}")
        shape[neg] = total // known
    elif known != total:
        raise ValueError(f"cannot reshape a tensor of shape {old} ({total} elements) "
                         f"into {tuple([shape[i] for i in range(nd)])}")
    return 0


cdef bint _view_strides(Tensor t, const int64_t *new, int nd, int64_t *out):
    """Strides for viewing t in shape ``new`` without a copy, if they exist
    (NumPy's rule: a run of old axes may merge or split only when those axes
    are contiguous with each other)."""
    cdef int64_t oshape[16]
    cdef int64_t ostr[16]
    cdef int on = 0, i, oi, oj, ni, nj, k
    cdef int64_t np_, op_, last
    if numel(t) <= 1:
        _contig_strides(new, nd, out)
        return True
    for i in range(t._ndim):  # size-1 axes never constrain a view
        if t._shape[i] != 1:
            oshape[on] = t._shape[i]
            ostr[on] = t._strides[i]
            on += 1
    oi = 0; oj = 1; ni = 0; nj = 1
    while ni < nd and oi < on:
        np_ = new[ni]
        op_ = oshape[oi]
        while np_ != op_:
            if np_ < op_:
                np_ *= new[nj]; nj += 1
            else:
                op_ *= oshape[oj]; oj += 1
        for k in range(oi, oj - 1):
            if ostr[k] != oshape[k + 1] * ostr[k + 1]:
                return False
        out[nj - 1] = ostr[oj - 1]
        for k in range(nj - 1, ni, -1):
            out[k - 1] = out[k] * new[k]
        ni = nj; nj += 1
        oi = oj; oj += 1
    last = out[ni - 1] if ni >= 1 else 1
    for k in range(ni, nd):
        out[k] = last
    return True


cdef Tensor _wrap_ndarray(cnp.ndarray arr, int device):
    """A Tensor viewing a writable, aligned ndarray (keeps it alive)."""
    cdef int code = dtype_code(arr.dtype), i
    cdef Tensor t = Tensor.__new__(Tensor)
    Py_INCREF(arr)
    t._st = mt_storage_wrap(cnp.PyArray_DATA(arr), <size_t>arr.nbytes, MT_DEV_CPU, 0,
                            _release_pyobject, <void *>arr)
    if t._st == NULL:
        Py_DECREF(arr)
        raise MemoryError()
    t._data = <char *>cnp.PyArray_DATA(arr)
    t._ndim = arr.ndim
    t._dtype = code
    t._device = device
    for i in range(arr.ndim):
        t._shape[i] = arr.shape[i]
        t._strides[i] = arr.strides[i] // ITEMSIZE[code]
    return t


def set_host_cache_limit(size_t nbytes):
    """Bytes of freed large host blocks kept for reuse (0 disables the cache)."""
    mt_host_cache_set_limit(nbytes)


def host_cache_info():
    """Bytes now held by the host block cache."""
    return {"cached_bytes": mt_host_cached_bytes()}


def empty_host_cache():
    """Return every cached host block to the OS."""
    mt_host_cache_clear()
