/* A device backend: the allocator, copies and kernel tables of one device
 * type, looked up by device type (tensor.pyx keeps one per type); every op
 * goes backend_of(device) -> its area's table -> the kernel. The CPU is one
 * of these like any other: tensor.pyx defines mt_cpu_backend's memory
 * members, and each core extension installs its area's CPU table at import
 * (dispatch: elementwise, reduce, linalg, nn, index; qint8: quant). The CUDA backend is
 * the optional extension mgtrace._core._cuda (the .cu files in kernels/cuda/), which
 * installs its own when first needed.
 *
 * The kernel entries take the geometry of their area's contract header
 * (reduce_kernels.h, nn_kernels.h, linalg_kernels.h, index_kernels.h), the
 * CPU kernels' too, so the Cython layer computes it once
 * and only the function it calls depends on the device. Pointers are device
 * pointers except where a comment says "host". A NULL entry means "no kernel
 * for this op on this device": the caller runs the op's declared fallback
 * (op_table.py's ``fallback`` column) or raises NotImplementedError "no kernel
 * for op X on device D with dtype T". Members a device may leave NULL
 * without losing an op (the CPU's packed weights, its offset-list GEMM) are
 * marked "optional" in their area's header.
 *
 * Return codes: 0, or one of MT_BK_* below; last_error() then describes it
 * (the CUDA error string, for instance).
 */
#ifndef MT_BACKEND_H
#define MT_BACKEND_H
#include "mt_types.h"
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
    int cost;      /* relative work per element (1: an add), the CPU's threading hint */
} mt_ew_call;

/* per-area kernel tables, each defined with its geometry in its area's
 * contract header (reduce_kernels.h, linalg_kernels.h, nn_kernels.h,
 * index_kernels.h); the CPU's kernels (kernels/cpu/) share the geometry */
struct mt_reduce_kernels;
struct mt_linalg_kernels;
struct mt_nn_kernels;
struct mt_index_kernels;
struct mt_quant_kernels;      /* quant_kernels.h */

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
    /* 1 when the device's memory is host memory (the CPU's: a pointer the
     * host may read, devices of the type share it); 0 for a GPU's */
    int host_memory;
    /* optional: 1 when ``elementwise`` has the kernel of (kind, op, dtype,
     * dtype2) as an mt_ew_call names them, 0 when it would return
     * MT_BK_ENOKERNEL: what has_kernel(op, device, dtype) answers from.
     * NULL: has_kernel answers True for every dtype of an op the
     * elementwise member exists for */
    int (*has_elementwise)(int kind, int op, int dtype, int dtype2);
    /* the int8 kernels of mgtrace.quantization (quant_kernels.h); NULL on a
     * device without them: its quantized ops raise NoKernelError */
    const struct mt_quant_kernels *quant;
} mt_backend;

/* the CPU's backend (cpu/cpu_backend.c): mutable, as the core's extensions
 * install its kernel tables at import; declared here because the core
 * installs it as the default backend (tensor.pyx) */
extern mt_backend mt_cpu_backend;

/* elementwise on the CPU: the mt_ops.h loop of (kind, op, dtype) run by
 * mt_nd_loop; MT_BK_ENOKERNEL when the table has none (cpu/iter.c) */
int mt_cpu_elementwise(const mt_ew_call *call);
/* its has_elementwise member: whether the loop tables hold the loop */
int mt_cpu_has_elementwise(int kind, int op, int dtype, int dtype2);

#ifdef __cplusplus
}
#endif
#endif
