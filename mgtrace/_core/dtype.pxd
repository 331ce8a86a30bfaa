cdef int NDTYPES
cdef int ITEMSIZE[13]
cdef int CATEGORY[13]
cdef int PROMOTE[13][13]
cdef list NP_DTYPES
cdef object np_dtype(int code)
cdef int dtype_code(object dtype) except -1
cdef int scalar_code(object value) noexcept
cdef int promote_operands(tuple operands) except -1
cdef int float_result(int code) noexcept
cdef void check_scalar_fits(object value, int code) except *
