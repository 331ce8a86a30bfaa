/* The CPU's reductions, scans, softmax and sorting (reduce.c, sort.c): their
 * kernel tables and what the two files share. The op sets, the geometry the
 * Cython layer hands over and the backend table are the contract's
 * reduce_kernels.h.
 *
 * C does bytes: every stride here is in BYTES and every pointer is to the
 * first element of a view. reduce.pyx permutes and coalesces the dimensions
 * before calling, so a kernel sees
 *   reductions: (kept dims) x (reduced dims), both outermost first;
 *   line ops:   (outer dims) x (one axis), e.g. softmax along the axis.
 * Kernels return 0, or -1 when a scratch allocation failed.
 */
#ifndef MT_REDUCE_H
#define MT_REDUCE_H
#include "mt_common.h"
#include "reduce_kernels.h"   /* contract/: op sets, geometry, the table */

/* the CPU's tables (reduce.c, sort.c), indexed by the input dtype */
extern mt_reduce_fn mt_reduce_fns[MT_NREDUCE][MT_NDTYPES];
extern mt_line_fn mt_scan_fns[MT_NSCAN][MT_NDTYPES];
extern mt_line_fn mt_softmax_fns[MT_NSOFTMAX][MT_NDTYPES];
extern mt_sort_fn mt_sort_fns[MT_NDTYPES];
/* ---- shared by reduce.c and sort.c ---- */
/* MT_RCLONES: mt_simd.h's */

/* dtype descriptors: X(code, sfx, storage type, compute type, load, store,
 * kind, lowest, highest, ...). kind: Kb bool, Ki integer, Kf float; lowest and
 * highest are the identities of max and min in the compute type. */
#define MT_RID(x) (x)
#define MT_RBOOL(x) ((int)((x) != 0))
#define MT_RTOBOOL(x) ((uint8_t)((x) != 0))
#define MT_RTOF16(x) mt_f2h((float)(x))
#define MT_RTOBF16(x) mt_f2bf((float)(x))
#define MT_RDT_BOOL(X, ...) X(MT_BOOL, b8, uint8_t, int, MT_RBOOL, MT_RTOBOOL, Kb, 0, 1, __VA_ARGS__)
#define MT_RDT_INT(X, ...)                                                          \
    X(MT_INT8, i8, int8_t, int8_t, MT_RID, MT_RID, Ki, INT8_MIN, INT8_MAX, __VA_ARGS__)     \
    X(MT_UINT8, u8, uint8_t, uint8_t, MT_RID, MT_RID, Ki, 0, UINT8_MAX, __VA_ARGS__)        \
    X(MT_INT16, i16, int16_t, int16_t, MT_RID, MT_RID, Ki, INT16_MIN, INT16_MAX, __VA_ARGS__) \
    X(MT_UINT16, u16, uint16_t, uint16_t, MT_RID, MT_RID, Ki, 0, UINT16_MAX, __VA_ARGS__)   \
    X(MT_INT32, i32, int32_t, int32_t, MT_RID, MT_RID, Ki, INT32_MIN, INT32_MAX, __VA_ARGS__) \
    X(MT_INT64, i64, int64_t, int64_t, MT_RID, MT_RID, Ki, INT64_MIN, INT64_MAX, __VA_ARGS__)
#define MT_RDT_HALF(X, ...)                                                         \
    X(MT_FLOAT16, f16, uint16_t, float, mt_h2f, MT_RTOF16, Kf, -INFINITY, INFINITY, __VA_ARGS__) \
    X(MT_BFLOAT16, bf16, uint16_t, float, mt_bf2f, MT_RTOBF16, Kf, -INFINITY, INFINITY, __VA_ARGS__)
#define MT_RDT_FULL(X, ...)                                                         \
    X(MT_FLOAT32, f32, float, float, MT_RID, MT_RID, Kf, -INFINITY, INFINITY, __VA_ARGS__)  \
    X(MT_FLOAT64, f64, double, double, MT_RID, MT_RID, Kf, -INFINITY, INFINITY, __VA_ARGS__)
#define MT_RDT_FLOAT(X, ...) MT_RDT_HALF(X, __VA_ARGS__) MT_RDT_FULL(X, __VA_ARGS__)
#define MT_RDT_ALL(X, ...) MT_RDT_BOOL(X, __VA_ARGS__) MT_RDT_INT(X, __VA_ARGS__) MT_RDT_FLOAT(X, __VA_ARGS__)
/* dtypes stored in their compute type (vector-friendly), and the others */
#define MT_RDT_NATIVE(X, ...) MT_RDT_INT(X, __VA_ARGS__) MT_RDT_FULL(X, __VA_ARGS__)
#define MT_RDT_CONVERTED(X, ...) MT_RDT_BOOL(X, __VA_ARGS__) MT_RDT_HALF(X, __VA_ARGS__)

/* Work (elements) below which a reduction splits for one thread: it picks
 * the split (and with it the summation order of a split line), so it stays
 * as it was; whether the split's jobs run on a team is MT_RPAR_GRAIN's. */
#define MT_RGRAIN 32768
/* Work (elements x cost) below which the jobs run on the calling thread, in
 * the same split and order: bitwise the results of a team. 2 cores at load
 * average 14 (1 vs 2 threads, best of 300 calls of x.mean((2, 3)) on
 * [1, C, 7, 7] float32 / x.sum() of as many contiguous values):
 *   62720: 45 / 5 us on one thread, 168 / 126 us on two (each barrier
 *          waits ~120 us for a parked worker);
 *   1M: 685 / 141 vs 891 / 270 us;  2M: 1411 / 284 vs 1643 / 433 us;
 *   4M: 3109 / 619 vs 5748 / 303 us (the sum's first win).
 * So a team only where one thread would take ~0.3 ms or more. */
#define MT_RPAR_GRAIN (1 << 21)

/* Byte offsets of element l of an n-d index space (outermost first) in up to
 * three strided arrays (s3 may be NULL). */
static inline void mt_offsets3(int nd, const int64_t *shape, const int64_t *s1, const int64_t *s2,
                               const int64_t *s3, int64_t l, int64_t *o1, int64_t *o2, int64_t *o3) {
    int64_t a = 0, b = 0, c = 0;
    for (int d = nd - 1; d >= 0; d--) {
        int64_t i = d ? l % shape[d] : l;   /* what is left is the outermost index */
        l = d ? l / shape[d] : 0;
        a += i * s1[d];
        b += i * s2[d];
        if (s3) c += i * s3[d];
    }
    *o1 = a; *o2 = b;
    if (o3) *o3 = c;
}

#endif
