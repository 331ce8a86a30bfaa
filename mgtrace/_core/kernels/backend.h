/* A device backend: the allocator, copies and kernel tables of one device
 * type, looked up by device type (tensor.pyx keeps one per type). CPU kernels
 * live in the core's own extensions; the CUDA backend is the optional
 * extension mgtrace._core._cuda (the .cu files in cuda/), which installs one of these.
 *
 * The kernel entries take the same geometry as the CPU kernels of the same
 * op (reduce.h, nn.h, gemm.h, index.h), so the Cython layer computes it once
 * and only the function it calls depends on the device. Pointers are device
 * pointers except where a comment says "host". A NULL entry means "no kernel
 * for this op on this device": the caller raises NotImplementedError naming
 * op, device and dtype.
 *
 * Return codes: 0, or one of MT_BK_* below; last_error() then describes it
 * (the CUDA error string, for instance).
 */
#ifndef MT_BACKEND_H
#define MT_BACKEND_H
#include "mt_common.h"
#include "alloc.h"

#ifdef __cplusplus
extern "C" {
#endif

enum { MT_BK_OK = 0, MT_BK_ENOMEM = -1, MT_BK_EDEVICE = -2, MT_BK_ENOKERNEL = -3 };
enum mt_copy_kind { MT_COPY_H2D = 0, MT_COPY_D2H, MT_COPY_D2D };
enum mt_ew_kind { MT_EW_UNARY = 0, MT_EW_BINARY, MT_EW_TERNARY, MT_EW_CAST, MT_EW_FILL };

/* One elementwise call over a coalesced index space (what dispatch.pyx's
 * run_loop builds for the CPU's mt_nd_loop): args[0] is the output, strides
 * in BYTES per arg and dim; an input whose bit (1 << (arg - 1)) is set in
 * scalar_mask is one value in HOST memory at args[arg] (a Python scalar).
 * op: the mt_ops.h op; dtype: the compute dtype (CAST: the source dtype and
 * dtype2 the destination; FILL: aux is the host value in the output dtype). */
typedef struct {
    int kind, op, dtype, dtype2;
    int nargs;
    char *args[4];
    unsigned scalar_mask;
    int ndim;
    int64_t shape[MT_MAX_NDIM];
    int64_t strides[4][MT_MAX_NDIM];
    const void *aux;
} mt_ew_call;

/* per-area kernel tables, each defined in its area's header (reduce.h,
 * gemm.h, nn.h, index.h) beside the CPU kernels whose signatures it shares */
struct mt_reduce_kernels;
struct mt_linalg_kernels;
struct mt_nn_kernels;
struct mt_index_kernels;

typedef struct mt_backend {
    const char *name;
    /* which device of this type the calls below act on (a no-op when it
     * already is the current one); called by the core before each op */
    int (*activate)(int index);
    /* memory: a new storage of nbytes on device ``index`` (NULL on failure);
     * contiguous copies (D2H returns when the bytes are on the host) */
    mt_storage *(*alloc)(int index, size_t nbytes);
    int (*copy)(void *dst, const void *src, size_t nbytes, int kind);
    int (*synchronize)(int index);
    const char *(*last_error)(void);
    /* kernels */
    int (*elementwise)(const mt_ew_call *call);
    const struct mt_reduce_kernels *reduce;
    const struct mt_linalg_kernels *linalg;
    const struct mt_nn_kernels *nn;
    const struct mt_index_kernels *index;
} mt_backend;

#ifdef __cplusplus
}
#endif
#endif
