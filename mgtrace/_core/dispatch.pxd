from libc.stdint cimport int64_t
from mgtrace._core.kernels cimport mt_loop_fn
from mgtrace._core.tensor cimport Tensor

# An elementwise operand: a tensor view, or a scalar (strides NULL = stride 0).
cdef struct Operand:
    char *data
    int ndim
    const int64_t *shape
    const int64_t *strides    # in elements
    int itemsize

cdef void operand_of(Tensor t, Operand *o) noexcept
cdef int broadcast_shape(int n, Operand *ops, int64_t *out) except -1
cdef int run_loop(mt_loop_fn fn, Tensor out, int nin, Operand *ins, const void *aux, int cost) except -1
cdef Tensor cast(Tensor t, int code)
cdef Tensor coerce(object x, int device)
cdef int copy_into(Tensor dst, Tensor src) except -1
cdef int fill(Tensor dst, object value) except -1
cdef int check_writable(Tensor t) except -1
cdef int store_scalar(object v, int code, char *buf) except -1
cdef object traced(str name, tuple inputs, dict params)
cpdef bint tracing_active()
cpdef Tensor empty_shape(object shape, int code, int device)
cdef object binary(int op, object a, object b, object out)
cdef object unary(int op, object a, object out)
cdef object ternary(int op, object a, object b, object c)
cdef int num_threads() noexcept nogil
