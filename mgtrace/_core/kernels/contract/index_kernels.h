/* Gather/scatter by precomputed element offsets on any device: the
 * backend table (backend.h's ``index``); the CPU's kernels are cpu/index.h,
 * whose mt_take / mt_put these entries mirror. */
#ifndef MT_INDEX_KERNELS_H
#define MT_INDEX_KERNELS_H
#include "mt_types.h"

/* this area's kernels on a device backend (backend.h) */
typedef struct mt_index_kernels {
    /* as mt_take / mt_put, but ``off`` (n element offsets) is in HOST memory */
    int (*take)(char *out, const char *src, const int64_t *off, int64_t n, int ndim,
                const int64_t *shape, const int64_t *strides, int64_t itemsize);
    int (*put)(char *dst, const char *val, const int64_t *off, int64_t n, int ndim,
               const int64_t *shape, const int64_t *strides, int64_t itemsize);
} mt_index_kernels;

#endif
