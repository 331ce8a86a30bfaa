from libc.stdint cimport int64_t
from mgtrace._core.kernels cimport mt_storage

cdef class Tensor:
    cdef mt_storage *_st      # shared, reference-counted storage (C struct)
    cdef char *_data          # first element of this view
    cdef int _ndim
    cdef int _dtype           # code, see dtype.pyx
    cdef int _device          # id, see device.pyx
    cdef bint _readonly_view  # a broadcast view: its elements alias each other
    cdef int64_t _shape[16]
    cdef int64_t _strides[16] # in elements
    cdef dict __dict__
    cdef object __weakref__
    cdef public object _qdtype  # a quantized dtype (mgtrace.quantization.qdtype) or None

# Hot-path entry points that dispatch.pyx installs (tensor.pyx cannot
# cimport dispatch: dispatch cimports tensor).
ctypedef object (*binary_fn)(int op, object a, object b, object out)
ctypedef object (*unary_fn)(int op, object a, object out)
ctypedef object (*traced_fn)(str name, tuple args)     # inputs, then params (op table order)
cdef void install_dispatch(binary_fn b, unary_fn u, traced_fn t, unsigned long *tracing) noexcept
# the one trace hook object (see mgtrace._core.trace_hooks); read only while tracing is on
cdef object trace_hook()
cdef void set_trace_hook(object hook) noexcept

# The module-tracing switch is the id of the thread that turned it on (0:
# off): tracing belongs to that thread, and every other thread's ops run
# eagerly, unrecorded. Off, a check is one load and compare, as a flag was.
cdef extern from "pythread.h":
    unsigned long PyThread_get_thread_ident() nogil

cdef inline bint traced_here(unsigned long owner) noexcept:
    return owner != 0 and owner == PyThread_get_thread_ident()

cdef Tensor empty(int ndim, const int64_t *shape, int dtype, int device)
cdef Tensor empty_like_shape(tuple shape, int dtype, int device)
cdef Tensor view_of(Tensor base, int ndim, const int64_t *shape, const int64_t *strides, int64_t offset)
cdef int64_t numel(Tensor t) noexcept
cdef bint is_contiguous(Tensor t) noexcept
cdef int normalize_axis(int64_t axis, int ndim) except -1
cdef Tensor to_tensor(object data, object dtype, int device)
cdef tuple shape_tuple(Tensor t)
cdef int parse_shape(object shape, int64_t *out) except -1

# Device backends, one per device type (kernels/contract/backend.h): CPU kernels are
# the core's own; another type's backend is installed by its extension.
from mgtrace._core.kernels cimport mt_backend
cdef int device_kind(int device) noexcept
cdef const mt_backend *backend_of(int device) except NULL
cdef mt_backend *cpu_backend() noexcept
cdef bint on_host(int device) except -1
cdef object backend_error(int device, int rc, str what)
cdef int install_backend(int kind, const mt_backend *b) except -1
