/* Reductions, scans, softmax and sorting on any device: the op sets, the
 * geometry the Cython layer (reduce.pyx) hands over, the kernel types and
 * the backend table (backend.h's ``reduce``).
 *
 * C does bytes: every stride here is in BYTES and every pointer is to the
 * first element of a view. A kernel sees
 *   reductions: (kept dims) x (reduced dims), both outermost first;
 *   line ops:   (outer dims) x (one axis), e.g. softmax along the axis.
 */
#ifndef MT_REDUCE_KERNELS_H
#define MT_REDUCE_KERNELS_H
#include "mt_types.h"

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

/* ---- kernel types (tables of them are indexed by the input dtype; NULL = unsupported) ---- */
typedef int (*mt_reduce_fn)(const char *in, char *out, const mt_reduce_geom *g, int nt);
typedef int (*mt_line_fn)(const char *in, char *out, const mt_line_geom *g, int nt);
/* sort/topk: the first k elements along the axis in order (k == len: a full
 * sort); vals may be NULL (argsort); sorted == 0 leaves a top-k selection in
 * an unspecified order. Ties keep the lower index first; NaN is the largest. */
typedef int (*mt_sort_fn)(const char *in, char *vals, char *idx, const mt_line_geom *g,
                          int64_t k, int descending, int sorted, int nt);

/* the op names and rules (defined by the CPU's reduce.c and sort.c) */
extern const char *const mt_reduce_names[MT_NREDUCE];
extern const int mt_reduce_rules[MT_NREDUCE];
extern const char *const mt_scan_names[MT_NSCAN];
extern const char *const mt_softmax_names[MT_NSOFTMAX];

/* this area's kernels on a device backend (backend.h) */
typedef struct mt_reduce_kernels {
    mt_reduce_fn (*reduce)[MT_NDTYPES];    /* [MT_NREDUCE][dtype] */
    mt_line_fn (*scan)[MT_NDTYPES];        /* [MT_NSCAN][dtype] */
    mt_line_fn (*softmax)[MT_NDTYPES];     /* [MT_NSOFTMAX][dtype] */
    mt_sort_fn *sort;                      /* [dtype] */
} mt_reduce_kernels;

#endif
