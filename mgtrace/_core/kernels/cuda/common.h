/* Shared by the CUDA backend's .cu files: dtype traits, launch helpers,
 * errors, the per-device stream and scratch memory (memory.cu).
 *
 * One default stream per device: every kernel, copy and cuBLAS call of the
 * backend goes to the current device's stream, so work is ordered without
 * host synchronisation and a freed block can be reused at once (the next use
 * is queued after the last one). The host waits only where results are read
 * (device-to-host copies, synchronize()).
 */
#ifndef MTC_COMMON_H
#define MTC_COMMON_H
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stdint.h>
#include <type_traits>

/* the contract (kernels/contract/, the only folder on nvcc's include path) */
#include "backend.h"
#include "mt_ops.h"
#include "reduce_kernels.h"
#include "linalg_kernels.h"
#include "nn_kernels.h"
#include "index_kernels.h"

extern "C" {
/* memory.cu */
cudaStream_t mtc_stream(void);                 /* the current device's stream */
int mtc_device(void);                          /* the current device index */
int mtc_fail(const char *where, cudaError_t e);  /* records the error, returns an MT_BK_* code */
int mtc_fail_msg(int code, const char *msg);   /* records a message of our own */
int mtc_check_launch(const char *where);       /* after a launch: 0 or the error */
void *mtc_scratch(size_t nbytes);              /* device memory for one call, stream-ordered */
void mtc_scratch_free(void *ptr, size_t nbytes);
/* blas.cu */
int mtc_gemm(int dtype, const mt_gemm_shape *s, const char *a, const char *b, char *c,
             int64_t batch, int64_t stride_a, int64_t stride_b, int64_t stride_c);
int mtc_elementwise(const mt_ew_call *c);
int mtc_has_elementwise(int kind, int op, int dtype, int dtype2);
extern const mt_backend mtc_backend;        /* memory.cu: what _cuda.pyx installs */
extern const mt_reduce_kernels mtc_reduce_kernels;
extern const mt_linalg_kernels mtc_linalg_kernels;
extern const mt_nn_kernels mtc_nn_kernels;
extern const mt_index_kernels mtc_index_kernels;
}

/* ---- launch geometry: grid-stride loops over n items ---- */
#define MTC_THREADS 256
static inline unsigned mtc_blocks(int64_t n) {
    int64_t b = (n + MTC_THREADS - 1) / MTC_THREADS;
    if (b < 1) b = 1;
    return (unsigned)(b > 65536 * 8 ? 65536 * 8 : b);
}
#define MTC_LOOP(i, n) \
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n); \
         i += (int64_t)gridDim.x * blockDim.x)

/* ---- dtype traits: storage type S, compute type C (as the CPU kernels:
 * half types compute in float), load and store ---- */
template <int D> struct DT;
#define MTC_PLAIN(code, stype, ctype)                                          \
    template <> struct DT<code> {                                              \
        typedef stype S; typedef ctype C;                                      \
        static __device__ __forceinline__ C load(S v) { return (C)v; }          \
        template <class X> static __device__ __forceinline__ S store(X x) { return (S)x; } \
    };
MTC_PLAIN(MT_INT8, int8_t, int8_t)
MTC_PLAIN(MT_UINT8, uint8_t, uint8_t)
MTC_PLAIN(MT_INT16, int16_t, int16_t)
MTC_PLAIN(MT_UINT16, uint16_t, uint16_t)
MTC_PLAIN(MT_INT32, int32_t, int32_t)
MTC_PLAIN(MT_INT64, int64_t, int64_t)
MTC_PLAIN(MT_FLOAT32, float, float)
MTC_PLAIN(MT_FLOAT64, double, double)
template <> struct DT<MT_BOOL> {
    typedef uint8_t S; typedef bool C;    /* bool + bool is or, * is and, as on the CPU */
    static __device__ __forceinline__ C load(S v) { return v != 0; }
    template <class X> static __device__ __forceinline__ S store(X x) { return (S)(x != 0); }
};
template <> struct DT<MT_FLOAT16> {
    typedef __half S; typedef float C;
    static __device__ __forceinline__ C load(S v) { return __half2float(v); }
    template <class X> static __device__ __forceinline__ S store(X x) { return __float2half_rn((float)x); }
};
template <> struct DT<MT_BFLOAT16> {
    typedef __nv_bfloat16 S; typedef float C;
    static __device__ __forceinline__ C load(S v) { return __bfloat162float(v); }
    template <class X> static __device__ __forceinline__ S store(X x) { return __float2bfloat16_rn((float)x); }
};

/* Host-side conversion of one value in storage form to the compute type
 * (Python scalars arrive as bytes in the operation's dtype). */
template <int D> static inline typename DT<D>::C mtc_host_load(const void *p) {
    if constexpr (D == MT_FLOAT16) {
        return mt_h2f(*(const uint16_t *)p);
    } else if constexpr (D == MT_BFLOAT16) {
        return mt_bf2f(*(const uint16_t *)p);
    } else if constexpr (D == MT_BOOL) {
        return *(const uint8_t *)p != 0;
    } else {
        return *(const typename DT<D>::S *)p;
    }
}

template <int D> constexpr bool mtc_is_float() {
    return D == MT_FLOAT16 || D == MT_BFLOAT16 || D == MT_FLOAT32 || D == MT_FLOAT64;
}
template <int D> constexpr bool mtc_is_int() { return D == MT_INT32 || D == MT_INT64; }

/* Element offset of flat index j (row-major over shape[0..ndim)) under
 * strides: the unravel every strided CUDA kernel here needs. */
__device__ __forceinline__ int64_t mtc_strided_offset(int ndim, const int64_t *shape,
                                                      const int64_t *strides, int64_t j) {
    int64_t a = 0;
    for (int d = ndim - 1; d >= 0; d--) {
        int64_t i = d ? j % shape[d] : j;
        j = d ? j / shape[d] : 0;
        a += i * strides[d];
    }
    return a;
}

#endif
