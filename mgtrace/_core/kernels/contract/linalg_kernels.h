/* Matrix products on any device: one problem's shape and the backend
 * table (backend.h's ``linalg``); the CPU's kernels are cpu/gemm.h. */
#ifndef MT_LINALG_KERNELS_H
#define MT_LINALG_KERNELS_H
#include "mt_types.h"

/* One problem of a batch: C[M,N] = A[M,K] @ B[K,N]; element strides, any layout. */
typedef struct {
    int64_t M, N, K;
    int64_t sam, sak, sbk, sbn, scm, scn;   /* element strides */
} mt_gemm_shape;

/* this area's kernels on a device backend (backend.h) */
typedef struct mt_linalg_kernels {
    /* C = A @ B for a batch of problems at a uniform element stride (the
     * strides of s as in mt_gemm_float_batch); dtypes: what the device has
     * (native float16/bfloat16 too) */
    int (*gemm)(int dtype, const mt_gemm_shape *s, const char *a, const char *b, char *c,
                int64_t batch, int64_t stride_a, int64_t stride_b, int64_t stride_c);
    int native_half;       /* 1: float16/bfloat16 GEMM in their own dtype */
    /* optional: a batch at any offsets (element offsets per problem, as
     * mt_gemm_float_batch; nt: thread budget), used instead of gemm when
     * present (the CPU's: OpenBLAS, or the integer loops; 0 or MT_BK_*) */
    int (*gemm_batch)(int dtype, const mt_gemm_shape *s, const char *a, const char *b, char *c,
                      const int64_t *a_off, const int64_t *b_off, const int64_t *c_off,
                      int64_t batch, int nt);
} mt_linalg_kernels;

#endif
