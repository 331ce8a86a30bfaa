/* Matrix products. Float GEMM goes to OpenBLAS; integer GEMM (rare: no BLAS
 * has it) is a plain blocked loop accumulating in int64. */
#ifndef MT_GEMM_H
#define MT_GEMM_H
#include "mt_common.h"
#include "linalg_kernels.h"   /* contract/: mt_gemm_shape, the table */

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
/* the CPU's gemm_batch: float32/float64 through OpenBLAS, integers through
 * the int64-accumulating loops; MT_BK_ENOKERNEL for another dtype */
int mt_cpu_gemm_batch(int dtype, const mt_gemm_shape *s, const char *a, const char *b, char *c,
                      const int64_t *a_off, const int64_t *b_off, const int64_t *c_off,
                      int64_t batch, int nt);

#endif
