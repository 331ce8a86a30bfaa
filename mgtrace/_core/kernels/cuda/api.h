/* What the CUDA backend's .cu files export to _cuda.pyx (plain C: the
 * Cython side is compiled by the C compiler, without CUDA's headers). */
#ifndef MTC_API_H
#define MTC_API_H
#include <stddef.h>
#include <stdint.h>
#include "backend.h"

#ifdef __cplusplus
extern "C" {
#endif

extern const mt_backend mtc_backend;            /* memory.cu */

typedef struct {
    size_t allocated, cached, peak;                  /* bytes in use, cached free, peak in use */
    uint64_t n_malloc, n_reused, n_free_calls;       /* cudaMalloc calls, cache hits, cudaFree calls */
} mtc_stats;

int mtc_device_count(char *err, size_t errlen);
int mtc_device_name(int index, char *out, size_t len, int *major, int *minor, size_t *total);
void mtc_memory_stats(int index, mtc_stats *out);
int mtc_empty_cache(void);
void mtc_reset_peak(int index);

int mtc_blas_open(const char *const *candidates, int n);    /* blas.cu */
const char *mtc_blas_status(int *loaded);
void mtc_set_tf32(int on);
int mtc_get_tf32(void);

#ifdef __cplusplus
}
#endif
#endif
