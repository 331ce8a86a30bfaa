#include "index.h"
#ifdef _OPENMP
#include <omp.h>
#endif

int64_t mt_index_offsets(int64_t n, int nidx, const int64_t *const *idx, const int64_t *dims,
                         const int64_t *strides, int64_t *off, int *bad_axis) {
    for (int64_t j = 0; j < n; j++) {
        int64_t o = 0;
        for (int k = 0; k < nidx; k++) {
            int64_t v = idx[k][j];
            if (v < 0) v += dims[k];
            if (v < 0 || v >= dims[k]) { *bad_axis = k; return j; }
            o += v * strides[k];
        }
        off[j] = o;
    }
    return -1;
}

/* copies one element of `size` bytes; fixed sizes let the compiler use moves */
static inline void copy_elem(char *d, const char *s, int64_t size) {
    switch (size) {
        case 1: *d = *s; break;
        case 2: memcpy(d, s, 2); break;
        case 4: memcpy(d, s, 4); break;
        case 8: memcpy(d, s, 8); break;
        default: memcpy(d, s, (size_t)size);
    }
}

/* Copies the inner block: dims [0, ndim) with `strides` on the strided side
 * and contiguous on the packed side. to_packed selects the direction. */
static char *inner_copy(char *packed, char *strided, int ndim, const int64_t *shape,
                        const int64_t *strides, int64_t isz, int to_packed) {
    if (ndim == 0) {
        if (to_packed) copy_elem(packed, strided, isz); else copy_elem(strided, packed, isz);
        return packed + isz;
    }
    if (ndim == 1 && strides[0] == isz) {
        size_t bytes = (size_t)(shape[0] * isz);
        if (to_packed) memcpy(packed, strided, bytes); else memcpy(strided, packed, bytes);
        return packed + bytes;
    }
    for (int64_t i = 0; i < shape[0]; i++)
        packed = inner_copy(packed, strided + i * strides[0], ndim - 1, shape + 1, strides + 1, isz, to_packed);
    return packed;
}

void mt_take(char *out, const char *src, const int64_t *off, int64_t n, int ndim,
             const int64_t *shape, const int64_t *strides, int64_t itemsize, int nt) {
    int64_t inner = 1;
    for (int d = 0; d < ndim; d++) inner *= shape[d];
    const int64_t block = inner * itemsize;
    if (nt < 1 || n * block < (1 << 18)) nt = 1;
#ifdef _OPENMP
    #pragma omp parallel for num_threads(nt) schedule(static)
#endif
    for (int64_t j = 0; j < n; j++)
        inner_copy(out + j * block, (char *)src + off[j] * itemsize, ndim, shape, strides, itemsize, 1);
}

void mt_put(char *dst, const char *val, const int64_t *off, int64_t n, int ndim,
            const int64_t *shape, const int64_t *strides, int64_t itemsize) {
    int64_t inner = 1;
    for (int d = 0; d < ndim; d++) inner *= shape[d];
    const int64_t block = inner * itemsize;
    /* sequential: duplicate offsets must resolve to the last write */
    for (int64_t j = 0; j < n; j++)
        inner_copy((char *)val + j * block, dst + off[j] * itemsize, ndim, shape, strides, itemsize, 0);
}

int64_t mt_count_nonzero(const uint8_t *src, int64_t n) {
    int64_t c = 0;
    for (int64_t i = 0; i < n; i++) c += src[i] != 0;
    return c;
}

void mt_nonzero(const uint8_t *src, int ndim, const int64_t *shape, int64_t *coords) {
    int64_t n = 1, idx[MT_MAX_NDIM] = {0};
    for (int d = 0; d < ndim; d++) n *= shape[d];
    int64_t w = 0;
    for (int64_t i = 0; i < n; i++) {
        if (src[i]) {
            for (int d = 0; d < ndim; d++) coords[w * ndim + d] = idx[d];
            w++;
        }
        for (int d = ndim - 1; d >= 0; d--) {
            if (++idx[d] < shape[d]) break;
            idx[d] = 0;
        }
    }
}
