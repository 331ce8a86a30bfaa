/* Gather/scatter by precomputed element offsets (advanced indexing,
 * embedding lookup, take_along_axis) and nonzero. */
#ifndef MT_INDEX_H
#define MT_INDEX_H
#include "mt_common.h"
#include "index_kernels.h"   /* contract/: the table */

/* off[j] = sum_k idx_k[j] * strides[k], negative indices wrapped by dims[k].
 * Index arrays are contiguous int64 of length n. Returns -1 when all are in
 * range, else the position j of the first bad index (its axis in *bad_axis). */
int64_t mt_index_offsets(int64_t n, int nidx, const int64_t *const *idx, const int64_t *dims,
                         const int64_t *strides, int64_t *off, int *bad_axis);
/* out (contiguous, [n] + inner shape) = src elements at off[j] + inner position.
 * Inner strides are in bytes. */
void mt_take(char *out, const char *src, const int64_t *off, int64_t n, int ndim,
             const int64_t *shape, const int64_t *strides, int64_t itemsize, int nt);
/* dst at off[j] + inner position = val (contiguous, [n] + inner shape).
 * With duplicate offsets the last write wins (NumPy's rule). */
void mt_put(char *dst, const char *val, const int64_t *off, int64_t n, int ndim,
            const int64_t *shape, const int64_t *strides, int64_t itemsize);
/* coordinates of the true elements of a contiguous bool array, row-major order */
int64_t mt_count_nonzero(const uint8_t *src, int64_t n);
void mt_nonzero(const uint8_t *src, int ndim, const int64_t *shape, int64_t *coords);
#endif
