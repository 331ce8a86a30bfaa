/* Reductions, scans, softmax and sorting: the op sets, the geometry the
 * Cython layer hands over, and the kernel tables.
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

/* ---- the op sets, declared once ----
 * Result-dtype rules (reduce.pyx maps them to a dtype; MegEngine's rules):
 *   SUM    ints keep their dtype (accumulated in int64), bool -> int32, floats keep
 *   FLOAT  floats keep, ints and bool -> float32 (mean/var/std)
 *   SAME   the input dtype (max/min)
 *   INDEX  int32, MegEngine's index dtype (argmax/argmin)
 *   BOOL   bool (any/all)                                                   */
#define MT_REDUCE_OPS(X)                                                     \
    /* sums */     X(sum, SUM) X(prod, SUM) X(mean, FLOAT)                   \
    /* moments */  X(var, FLOAT) X(std, FLOAT)                               \
    /* extrema */  X(max, SAME) X(min, SAME) X(argmax, INDEX) X(argmin, INDEX) \
    /* logic */    X(any, BOOL) X(all, BOOL)
/* along one axis: scans keep the SUM rule, softmaxes the FLOAT rule */
#define MT_SCAN_OPS(X) X(cumsum) X(cumprod)
#define MT_SOFTMAX_OPS(X) X(softmax) X(log_softmax)

enum mt_reduce_rule { MT_RR_SUM = 0, MT_RR_FLOAT, MT_RR_SAME, MT_RR_INDEX, MT_RR_BOOL };
#define MT_ENUM_RED(name, rule) MT_R_##name,
#define MT_ENUM_LINE(name) MT_L_##name,
enum mt_reduce_op { MT_REDUCE_OPS(MT_ENUM_RED) MT_NREDUCE };
enum mt_scan_op { MT_SCAN_OPS(MT_ENUM_LINE) MT_NSCAN };
enum mt_softmax_op { MT_SOFTMAX_OPS(MT_ENUM_LINE) MT_NSOFTMAX };

/* ---- geometry ---- */
typedef struct {
    int nkeep;                        /* kept dims (0: one output) */
    int64_t kshape[MT_MAX_NDIM];
    int64_t kin[MT_MAX_NDIM];         /* input byte strides of the kept dims */
    int64_t kout[MT_MAX_NDIM];        /* output byte strides */
    int nred;                         /* reduced dims, >= 1 */
    int64_t rshape[MT_MAX_NDIM];
    int64_t rin[MT_MAX_NDIM];         /* input byte strides of the reduced dims */
    int64_t count;                    /* elements reduced into one output */
    double ddof;                      /* var/std: divisor is max(count - ddof, 0) */
} mt_reduce_geom;

typedef struct {
    int nouter;                       /* dims other than the axis (may be 0) */
    int64_t oshape[MT_MAX_NDIM];
    int64_t oin[MT_MAX_NDIM];         /* input byte strides */
    int64_t oout[MT_MAX_NDIM];        /* output (values) byte strides */
    int64_t oidx[MT_MAX_NDIM];        /* output indices byte strides (sort/topk) */
    int64_t len;                      /* axis length in the input */
    int64_t ain, aout, aidx;          /* axis byte strides: input, values, indices */
} mt_line_geom;

/* ---- kernel tables, indexed by the input dtype; NULL = unsupported ---- */
typedef int (*mt_reduce_fn)(const char *in, char *out, const mt_reduce_geom *g, int nt);
typedef int (*mt_line_fn)(const char *in, char *out, const mt_line_geom *g, int nt);
/* sort/topk: the first k elements along the axis in order (k == len: a full
 * sort); vals may be NULL (argsort); sorted == 0 leaves a top-k selection in
 * an unspecified order. Ties keep the lower index first; NaN is the largest. */
typedef int (*mt_sort_fn)(const char *in, char *vals, char *idx, const mt_line_geom *g,
                          int64_t k, int descending, int sorted, int nt);

extern mt_reduce_fn mt_reduce_fns[MT_NREDUCE][MT_NDTYPES];
extern mt_line_fn mt_scan_fns[MT_NSCAN][MT_NDTYPES];
extern mt_line_fn mt_softmax_fns[MT_NSOFTMAX][MT_NDTYPES];
extern mt_sort_fn mt_sort_fns[MT_NDTYPES];
extern const char *const mt_reduce_names[MT_NREDUCE];
extern const int mt_reduce_rules[MT_NREDUCE];
extern const char *const mt_scan_names[MT_NSCAN];
extern const char *const mt_softmax_names[MT_NSOFTMAX];

/* ---- shared by reduce.c and sort.c ---- */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && !defined(MT_NO_CLONES)
#define MT_RCLONES __attribute__((target_clones("default", "arch=x86-64-v3")))
#else
#define MT_RCLONES
#endif

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

/* Work (elements) below which one thread is faster than an OpenMP team. */
#define MT_RGRAIN 32768

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

/* this area's kernels on a device backend (backend.h) */
typedef struct mt_reduce_kernels {
    mt_reduce_fn (*reduce)[MT_NDTYPES];    /* [MT_NREDUCE][dtype] */
    mt_line_fn (*scan)[MT_NDTYPES];        /* [MT_NSCAN][dtype] */
    mt_line_fn (*softmax)[MT_NDTYPES];     /* [MT_NSOFTMAX][dtype] */
    mt_sort_fn *sort;                      /* [dtype] */
} mt_reduce_kernels;

#endif
