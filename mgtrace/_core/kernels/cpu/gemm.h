/* Matrix products. Float GEMM goes to OpenBLAS; integer GEMM (rare: no BLAS
 * has it) is a plain blocked loop accumulating in int64. */
#ifndef MT_GEMM_H
#define MT_GEMM_H
#include "mt_common.h"

/* One problem of a batch: C[M,N] = A[M,K] @ B[K,N]; element strides, any layout. */
typedef struct {
    int64_t M, N, K;
    int64_t sam, sak, sbk, sbn, scm, scn;   /* element strides */
} mt_gemm_shape;

/* dtype code MT_FLOAT32 or MT_FLOAT64: batch of BLAS calls. a_off/b_off/c_off
 * give each problem's element offset. nt = thread budget. */
void mt_gemm_float_batch(int dtype, const mt_gemm_shape *s, const char *a, const char *b, char *c,
                         const int64_t *a_off, const int64_t *b_off, const int64_t *c_off,
                         int64_t batch, int nt);
/* integer dtypes (int8..int64): naive loops, int64 accumulator, wrapping store */
void mt_gemm_int_batch(int dtype, const mt_gemm_shape *s, const char *a, const char *b, char *c,
                       const int64_t *a_off, const int64_t *b_off, const int64_t *c_off,
                       int64_t batch, int nt);
void mt_blas_set_threads(int n);
int mt_blas_get_threads(void);
const char *mt_blas_config(void);
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

/* the CPU's gemm_batch: float32/float64 through OpenBLAS, integers through
 * the int64-accumulating loops; MT_BK_ENOKERNEL for another dtype */
int mt_cpu_gemm_batch(int dtype, const mt_gemm_shape *s, const char *a, const char *b, char *c,
                      const int64_t *a_off, const int64_t *b_off, const int64_t *c_off,
                      int64_t batch, int nt);

#endif
