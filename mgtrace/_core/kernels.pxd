# Declarations of the C kernels (mirrors kernels/contract/*.h and the CPU's
# kernels/cpu/mt_common.h, elementwise.h). C knows bytes only.
from libc.stdint cimport int64_t, uint64_t

cdef extern from "kernels/contract/mt_types.h" nogil:
    enum: MT_MAX_NDIM
    enum:
        MT_BOOL, MT_INT8, MT_UINT8, MT_INT16, MT_UINT16, MT_INT32, MT_INT64,
        MT_FLOAT16, MT_BFLOAT16, MT_FLOAT32, MT_FLOAT64, MT_COMPLEX64, MT_COMPLEX128,
        MT_NDTYPES
    enum: MT_NREAL_DTYPES
    float mt_h2f(unsigned short) noexcept
    unsigned short mt_f2h(float) noexcept
    float mt_bf2f(unsigned short) noexcept
    unsigned short mt_f2bf(float) noexcept

cdef extern from "kernels/cpu/mt_common.h" nogil:
    ctypedef void (*mt_loop_fn)(char **args, const int64_t *steps, int64_t n, const void *aux) noexcept nogil
    int mt_get_num_threads() noexcept
    void mt_set_num_threads(int n) noexcept
    int mt_run_threads() noexcept
    int mt_pin_run_threads(int n) noexcept
    void mt_set_adaptive_threads(int on) noexcept
    int mt_get_adaptive_threads() noexcept
    void mt_nd_loop(mt_loop_fn fn, int nargs, char **base, int ndim, const int64_t *shape,
                    const int64_t *strides, const void *aux, int cost) noexcept

cdef extern from "kernels/contract/mt_ops.h" nogil:
    enum: MT_RULE_SAME, MT_RULE_FLOAT, MT_RULE_BOOL, MT_RULE_INT
    enum: MT_NUNARY, MT_NBINARY, MT_NTERNARY
    const char *mt_unary_names[]
    const char *mt_binary_names[]
    const char *mt_ternary_names[]
    const int mt_unary_rules[]
    const int mt_binary_rules[]
    const int mt_ternary_rules[]

cdef extern from "kernels/cpu/elementwise.h" nogil:
    mt_loop_fn mt_unary_loops[][MT_NDTYPES]
    mt_loop_fn mt_binary_loops[][MT_NDTYPES]
    mt_loop_fn mt_ternary_loops[][MT_NDTYPES]
    mt_loop_fn mt_cast_loops[][MT_NDTYPES]
    mt_loop_fn mt_fill_loops[]
    void mt_elementwise_init() noexcept

cdef extern from "kernels/cpu/mt_complex.h" nogil:
    enum: MT_CPART_REAL, MT_CPART_IMAG, MT_CPART_ABS, MT_CPART_ANGLE
    void mt_complex_init() noexcept
    mt_loop_fn mt_complex_make_loop(int real_dtype) noexcept
    mt_loop_fn mt_complex_part_loop(int part, int complex_dtype) noexcept

cdef extern from "kernels/contract/alloc.h" nogil:
    enum: MT_DEV_CPU, MT_DEV_CUDA
    ctypedef struct mt_storage:
        int64_t refcount
        char *ptr
        size_t nbytes
        int device_type
        int device_index
        int readonly
        void *ctx
        uint64_t uid
        uint64_t version
        int shared
    int mt_storage_tracked(const mt_storage *st) noexcept
    mt_storage *mt_storage_new_host(size_t nbytes) noexcept
    mt_storage *mt_storage_wrap(void *ptr, size_t nbytes, int device_type, int device_index,
                                void (*release)(mt_storage *) noexcept, void *ctx) noexcept
    void mt_storage_decref(mt_storage *st) noexcept
    size_t mt_host_cached_bytes() noexcept
    void mt_host_cache_clear() noexcept
    void mt_host_cache_set_limit(size_t bytes) noexcept

cdef extern from "kernels/contract/backend.h" nogil:
    enum: MT_BK_OK, MT_BK_ENOMEM, MT_BK_EDEVICE, MT_BK_ENOKERNEL
    enum: MT_COPY_H2D, MT_COPY_D2H, MT_COPY_D2D
    enum: MT_EW_UNARY, MT_EW_BINARY, MT_EW_TERNARY, MT_EW_CAST, MT_EW_FILL
    ctypedef struct mt_ew_call:
        int kind, op, dtype, dtype2
        int nargs
        char *args[4]
        unsigned scalar_mask
        int ndim
        int64_t shape[16]
        int64_t strides[4][16]
        const void *aux
        int cost
    # the area tables (reduce, linalg, nn, index, quant) are declared by the module
    # that uses them, from their area's header; here they are opaque
    ctypedef struct mt_backend:
        const char *name
        int (*activate)(int index) noexcept nogil
        mt_storage *(*alloc)(int index, size_t nbytes) noexcept nogil
        int (*copy)(void *dst, const void *src, size_t nbytes, int kind) noexcept nogil
        int (*synchronize)(int index) noexcept nogil
        const char *(*last_error)() noexcept nogil
        int (*elementwise)(const mt_ew_call *call) noexcept nogil
        const void *reduce
        const void *linalg
        const void *nn
        const void *index
        int host_memory
        int (*has_elementwise)(int kind, int op, int dtype, int dtype2) noexcept nogil
        const void *quant
    mt_backend mt_cpu_backend
    int mt_cpu_elementwise(const mt_ew_call *call) noexcept
    int mt_cpu_has_elementwise(int kind, int op, int dtype, int dtype2) noexcept nogil
