/* Inference plans: a recorded sequence of kernel calls replayed without
 * Python (mgtrace/plan builds them; plan.pyx owns their memory).
 *
 * A step is one backend kernel call as the core made it when the plan was
 * recorded: the call's arguments copied by value, and each pointer argument
 * turned into a reference (buffer, byte offset). Buffers are the plan's
 * memory: its inputs, its constants (parameters), the arena that holds the
 * intermediates, the outputs made fresh on each call, and the tensors that
 * Python steps return. ``bases[buf]`` gives each buffer's address for one
 * run, so the same steps serve every call.
 *
 * Kernels are reached through the pointers the backend's tables held when
 * the step was recorded (backend.h), so a plan calls the very kernels the
 * graph calls. A step the recorder could not turn into a kernel call runs
 * through the ``callback`` given to mt_plan_run (a Python step: it takes
 * the GIL back).
 *
 * Capture: while mt_plan_capture_begin() is on in a thread, the wrappers
 * below (installed in the CPU backend's tables by plan.pyx) record each
 * elementwise and GEMM call made in that thread before running it; any
 * other kernel call made through a wrapped member marks the capture
 * unusable. Other threads pass straight through.
 */
#ifndef MT_PLAN_H
#define MT_PLAN_H
#include "backend.h"
#include "gemm.h"
#include "nn.h"
#include "reduce_kernels.h"
#include "quant_kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

enum { MT_STEP_EW = 0, MT_STEP_GEMM = 1, MT_STEP_CALLBACK = 2, MT_STEP_NN = 3, MT_STEP_REDUCE = 4,
       MT_STEP_GATHER = 5, MT_STEP_QUANT = 6 };
/* the quant table calls a plan replays (MT_STEP_QUANT's ``which``); their
 * arguments in mt_plan_quant, in the member's order (plan.c's run_quant) */
enum { MT_Q_GEMM = 0, MT_Q_CONV, MT_Q_DWCONV, MT_Q_QUANTIZE, MT_Q_DEQUANTIZE, MT_Q_ADD,
       MT_Q_MAXPOOL, MT_Q_AVGPOOL, MT_Q_FLIP, MT_Q_CONCAT, MT_Q_BLOCK, MT_Q_NKERNELS };
#define MT_PLAN_Q_PTRS 17          /* MT_Q_BLOCK's with its add */
/* concat's inputs in one step (qint8.pyx spoils the recording of a concat
 * with more) */
#define MT_PLAN_Q_CONCAT_INPUTS 10
#define MT_PLAN_Q_INTS 40          /* MT_Q_BLOCK's with its add */
#define MT_PLAN_Q_FLOATS 8
/* the nn table members a plan replays (MT_STEP_NN's ``which``) */
enum { MT_NN_CONV2D_NCHWC = 0, MT_NN_PW_DW, MT_NN_PW_DW_PW, MT_NN_MAX_POOL_NCHWC, MT_NN_TO_NCHWC,
       MT_NN_FROM_NCHWC, MT_NN_LAYER_NORM, MT_NN_ATTENTION, MT_NN_BIAS_ACT, MT_NN_CONV2D,
       MT_NN_CONV2D_PACKED, MT_NN_MAX_POOL2D, MT_NN_AVG_POOL2D, MT_NN_ADAPTIVE_POOL2D, MT_NN_RESIZE2D,
       MT_NN_CONV_TRANSPOSE2D, MT_NN_CONV3D, MT_NN_LSTM_CELL, MT_NN_RNN_CELL, MT_NN_LRN,
       MT_NN_ADD_LAYER_NORM, MT_NN_PAD_INDEX, MT_NN_NKERNELS };
#define MT_PLAN_NN_PTRS 12
#define MT_PLAN_PAD_DIMS 16           /* axes a recorded pad_index call may have (nn.pyx's pad: 16) */
#define MT_PLAN_MAX_CAPTURE 8

typedef int (*mt_ew_kernel)(const mt_ew_call *call);
typedef int (*mt_gemm_batch_kernel)(int dtype, const mt_gemm_shape *s, const char *a, const char *b,
                                    char *c, const int64_t *a_off, const int64_t *b_off,
                                    const int64_t *c_off, int64_t batch, int nt);

/* a byte address of one run: bases[buf] + off */
typedef struct {
    int32_t buf;      /* -1: none (a scalar held in the step) */
    int64_t off;
} mt_plan_ref;

typedef struct {
    mt_ew_call call;                  /* args[] rewritten from ref[] on each run */
    mt_plan_ref ref[4];
    int64_t scalar[4];                /* host scalars (scalar_mask) and FILL's value */
    mt_ew_kernel kernel;
} mt_plan_ew;

typedef struct {
    int dtype, nt;
    mt_gemm_shape shape;
    mt_plan_ref a, b, c;
    int64_t batch;
    int64_t *offs;                    /* 3 * batch: a, b, c offsets (owned by plan.pyx) */
    mt_gemm_batch_kernel kernel;
} mt_plan_gemm;

/* one nn-table call: its pointer arguments in the kernel's order, the
 * residual of each geometry that has one (g[k].res_delta is rebuilt from
 * it on each run) after them; the workspace is one of the pointers */
typedef struct {
    int which, np, nt;
    void *kernel;
    mt_plan_ref p[MT_PLAN_NN_PTRS];
    mt_conv2d_geom g[3];
    mt_pool2d_geom pool;
    mt_attn_geom attn;
    int64_t i[8];
    double eps;                       /* layer norm's eps; lrn's k */
    double f[2];                      /* resize2d's scales; lrn's alpha, beta */
    mt_conv3d_geom g3;                /* conv3d's */
    int64_t pad[3][MT_PLAN_PAD_DIMS]; /* pad_index's shape, before, after */
} mt_plan_nn;

/* one reduce-table call (sum, mean, max, ... over a geometry in bytes) */
typedef struct {
    int nt;
    mt_reduce_fn kernel;
    mt_plan_ref in, out;
    mt_reduce_geom g;
} mt_plan_reduce;

/* Rows of a source picked by integer indices (an embedding lookup, which
 * the core runs as getitem: offsets computed from the index values on the
 * host, then the index table's take, so no recorded call can replay it).
 * Output row i (row_bytes, rows contiguous) = source row idx[i], the
 * indices n contiguous integers of isz bytes (signed or not), a negative
 * index counting from the end as NumPy's (and getitem's) do. An index
 * outside -rows..rows-1 returns 1: the call then runs the graph, whose
 * getitem raises the IndexError. */
typedef struct {
    mt_plan_ref idx, src, out;
    int isz, is_signed;
    int64_t n, rows, row_bytes;
    int64_t src_stride;               /* bytes from one source row to the next */
} mt_plan_gather;

/* one int8 kernel call through a quant table (quant_kernels.h), recorded
 * by mgtrace._core.qint8: its pointer arguments (buf -1: NULL), integer
 * and float arguments in the member's order, and its thread count */
typedef struct {
    int which, nt;
    const struct mt_quant_kernels *k;
    mt_plan_ref p[MT_PLAN_Q_PTRS];
    int64_t i[MT_PLAN_Q_INTS];
    double f[MT_PLAN_Q_FLOATS];
} mt_plan_quant;

typedef union {
    mt_plan_ew ew;
    mt_plan_gemm gemm;
    mt_plan_nn nn;
    mt_plan_reduce red;
    mt_plan_gather gather;
    mt_plan_quant quant;
} mt_plan_u;

typedef struct mt_plan_step {
    int kind;
    int index;                        /* the Python step's number (callback) */
    mt_plan_u u;
} mt_plan_step;

/* Runs Python step ``index``; 0 or -1 (the error is Python's to hold). */
typedef int (*mt_plan_callback)(void *ctx, int index);

/* Runs steps [0, n) in order; 0, or the failing kernel's code (*failed is
 * then the step's number). Callback failures return -1000. */
int mt_plan_run(const mt_plan_step *steps, int64_t n, char *const *bases,
                mt_plan_callback callback, void *ctx, int64_t *failed);
/* mt_plan_run that also writes each step's wall time (ns) into ns[0, n) */
int mt_plan_run_timed(const mt_plan_step *steps, int64_t n, char *const *bases,
                      mt_plan_callback callback, void *ctx, int64_t *failed, int64_t *ns);

/* ---- capture (the calling thread only) ---- */
typedef struct {
    int kind;                         /* MT_STEP_EW or MT_STEP_GEMM */
    mt_ew_call ew;
    int64_t ew_scalar[4];
    mt_ew_kernel ew_kernel;
    int dtype, nt;
    mt_gemm_shape shape;
    const char *a, *b;
    char *c;
    int64_t batch;
    int64_t *offs;                    /* malloc'd copy, 3 * batch; freed by mt_plan_capture_end */
    mt_gemm_batch_kernel gemm_kernel;
    mt_plan_nn nn;                    /* MT_STEP_NN: refs' off holds the raw address, buf -1 */
    mt_plan_reduce red;               /* MT_STEP_REDUCE: likewise */
} mt_plan_captured;

/* allocations made through the backend while capturing (workspaces and
 * temporaries of the op): address and size */
int mt_plan_capture_allocs(void);
void mt_plan_capture_alloc_get(int i, uintptr_t *ptr, int64_t *nbytes);

void mt_plan_capture_begin(void);
/* number of calls captured since begin, or -1 when one could not be
 * captured (another kernel, too many calls, out of memory) */
int mt_plan_capture_count(void);
const mt_plan_captured *mt_plan_capture_get(int i);
void mt_plan_capture_end(void);

/* the real kernels behind the wrappers (plan.pyx sets them before
 * installing the wrappers; NULL where the backend has none) */
typedef int (*mt_gemm_kernel)(int dtype, const mt_gemm_shape *s, const char *a, const char *b,
                              char *c, int64_t batch, int64_t stride_a, int64_t stride_b,
                              int64_t stride_c);
void mt_plan_set_real_kernels(mt_ew_kernel ew, mt_gemm_batch_kernel gemm_batch, mt_gemm_kernel gemm);
/* the real nn table and allocator; the wrapped copy of the table to install */
void mt_plan_set_real_nn(const struct mt_nn_kernels *real, struct mt_nn_kernels *wrapped);
void mt_plan_set_real_alloc(mt_storage *(*real)(int index, size_t nbytes));
mt_storage *mt_plan_capture_alloc(int index, size_t nbytes);
/* the real reduce table; ``wrapped`` becomes a copy whose reductions
 * record (scans, softmax and sort stay the real ones: the ops that call
 * them are not replayed) */
void mt_plan_set_real_reduce(const struct mt_reduce_kernels *real, struct mt_reduce_kernels *wrapped);
int mt_plan_capture_elementwise(const mt_ew_call *call);
int mt_plan_capture_gemm_batch(int dtype, const mt_gemm_shape *s, const char *a, const char *b,
                               char *c, const int64_t *a_off, const int64_t *b_off,
                               const int64_t *c_off, int64_t batch, int nt);
int mt_plan_capture_gemm(int dtype, const mt_gemm_shape *s, const char *a, const char *b, char *c,
                         int64_t batch, int64_t stride_a, int64_t stride_b, int64_t stride_c);

#ifdef __cplusplus
}
#endif
#endif
