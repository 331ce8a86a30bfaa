/* GEMM through cuBLAS, loaded at run time.
 *
 * The build needs no cuBLAS (only nvcc and the CUDA runtime): the few
 * functions and enums used are declared here (cuBLAS's stable v2 ABI,
 * cublas_api.h of CUDA 12/13), and the library is dlopen'ed on the first
 * product, from the candidates _cuda.pyx passes (libcublas.so.13, .so.12,
 * .so, the nvidia-cublas wheel, CUDA_HOME). Without it matmul and conv2d on
 * CUDA raise with the reason; everything else works.
 *
 * Row-major C[M,N] = A[M,K] @ B[K,N] is column-major C^T = B^T A^T: cuBLAS
 * gets (B, A) with m = N, n = M, and each operand transposed or not by which
 * of its strides is 1. float32 computes in float32 (no TF32 unless
 * mgtrace.cuda.set_tf32(True)); float16/bfloat16 in float32 on tensor cores,
 * stored in their own dtype; float64 in float64.
 */
#include <dlfcn.h>
#include <library_types.h>
#include <mutex>
#include <string>
#include "common.h"
#include "api.h"

namespace {

typedef void *cublasHandle_t;
typedef int cublasStatus_t;
enum { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1 };
enum { CUBLAS_COMPUTE_32F = 68, CUBLAS_COMPUTE_32F_FAST_TF32 = 77, CUBLAS_COMPUTE_64F = 70 };
enum { CUBLAS_GEMM_DEFAULT = -1 };
enum { CUBLAS_DEFAULT_MATH = 0 };

typedef cublasStatus_t (*create_t)(cublasHandle_t *);
typedef cublasStatus_t (*set_stream_t)(cublasHandle_t, cudaStream_t);
typedef cublasStatus_t (*set_math_t)(cublasHandle_t, int);
typedef const char *(*status_string_t)(cublasStatus_t);
typedef cublasStatus_t (*gemm_t)(cublasHandle_t, int, int, int, int, int, const void *, const void *,
                                 int, int, long long, const void *, int, int, long long, const void *,
                                 void *, int, int, long long, int, int, int);

struct Lib {
    void *so = nullptr;
    create_t create = nullptr;
    set_stream_t set_stream = nullptr;
    set_math_t set_math = nullptr;
    status_string_t status_string = nullptr;
    gemm_t gemm = nullptr;
    std::string path, error = "cuBLAS has not been loaded (mgtrace._core._cuda loads it on import)";
} g_lib;

std::mutex g_lock;
cublasHandle_t g_handles[64];
int g_tf32 = 0;

int fail_status(const char *where, cublasStatus_t s) {
    std::string m = std::string(where) + " failed: cuBLAS status " + std::to_string(s);
    if (g_lib.status_string) m += std::string(" (") + g_lib.status_string(s) + ")";
    return mtc_fail_msg(s == 3 /* CUBLAS_STATUS_ALLOC_FAILED */ ? MT_BK_ENOMEM : MT_BK_EDEVICE, m.c_str());
}

cublasHandle_t handle(int *rc) {
    int dev = mtc_device();
    std::lock_guard<std::mutex> g(g_lock);
    if (!g_lib.gemm) { *rc = mtc_fail_msg(MT_BK_ENOKERNEL, g_lib.error.c_str()); return nullptr; }
    if (!g_handles[dev]) {
        cublasStatus_t s = g_lib.create(&g_handles[dev]);
        if (s != 0) { *rc = fail_status("cublasCreate", s); return nullptr; }
        g_lib.set_math(g_handles[dev], CUBLAS_DEFAULT_MATH);
    }
    cublasStatus_t s = g_lib.set_stream(g_handles[dev], mtc_stream());
    if (s != 0) { *rc = fail_status("cublasSetStream", s); return nullptr; }
    *rc = 0;
    return g_handles[dev];
}

/* one operand in column-major terms: op and leading dimension */
bool col_major(int64_t rows, int64_t cols, int64_t rs, int64_t cs, int *op, int64_t *ld) {
    /* row-major [rows, cols] with unit column stride = column-major [cols, rows], op N */
    if (cs == 1 || cols == 1) { *op = CUBLAS_OP_N; *ld = rs > cols ? rs : (cols > 1 ? cols : 1); return true; }
    if (rs == 1 || rows == 1) { *op = CUBLAS_OP_T; *ld = cs > rows ? cs : (rows > 1 ? rows : 1); return true; }
    return false;
}

}  // namespace

extern "C" {

int mtc_blas_open(const char *const *candidates, int n) {
    std::lock_guard<std::mutex> g(g_lock);
    if (g_lib.gemm) return 0;
    std::string tried;
    for (int i = 0; i < n; i++) {
        void *so = dlopen(candidates[i], RTLD_NOW | RTLD_LOCAL);
        if (!so) { tried += std::string("\n  ") + candidates[i] + ": " + dlerror(); continue; }
        Lib l;
        l.so = so;
        l.create = (create_t)dlsym(so, "cublasCreate_v2");
        l.set_stream = (set_stream_t)dlsym(so, "cublasSetStream_v2");
        l.set_math = (set_math_t)dlsym(so, "cublasSetMathMode");
        l.status_string = (status_string_t)dlsym(so, "cublasGetStatusString");
        l.gemm = (gemm_t)dlsym(so, "cublasGemmStridedBatchedEx");
        if (!l.create || !l.set_stream || !l.set_math || !l.gemm) {
            tried += std::string("\n  ") + candidates[i] + ": lacks the cuBLAS v2 functions";
            dlclose(so);
            continue;
        }
        l.path = candidates[i];
        l.error.clear();
        g_lib = l;
        return 0;
    }
    g_lib.error = "cuBLAS could not be loaded (needed by matmul and conv2d on CUDA); tried:" + tried;
    return -1;
}

const char *mtc_blas_status(int *loaded) {
    *loaded = g_lib.gemm != nullptr;
    return g_lib.gemm ? g_lib.path.c_str() : g_lib.error.c_str();
}

void mtc_set_tf32(int on) { g_tf32 = on; }
int mtc_get_tf32(void) { return g_tf32; }

int mtc_gemm(int dtype, const mt_gemm_shape *s, const char *a, const char *b, char *c,
             int64_t batch, int64_t stride_a, int64_t stride_b, int64_t stride_c) {
    int dt, compute, rc;
    switch (dtype) {
    case MT_FLOAT32: dt = CUDA_R_32F; compute = g_tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F; break;
    case MT_FLOAT16: dt = CUDA_R_16F; compute = CUBLAS_COMPUTE_32F; break;
    case MT_BFLOAT16: dt = CUDA_R_16BF; compute = CUBLAS_COMPUTE_32F; break;
    case MT_FLOAT64: dt = CUDA_R_64F; compute = CUBLAS_COMPUTE_64F; break;
    default: return mtc_fail_msg(MT_BK_ENOKERNEL, "cuBLAS GEMM takes float16, bfloat16, float32 or float64");
    }
    if (s->scn != 1 || s->scm < (s->N > 1 ? s->N : 1))
        return mtc_fail_msg(MT_BK_EDEVICE, "matmul: the output must be row-major");
    int opa, opb;
    int64_t lda, ldb;
    /* C^T [N, M] = B^T [N, K] @ A^T [K, M]: cuBLAS's first operand is B */
    if (!col_major(s->K, s->N, s->sbk, s->sbn, &opb, &ldb) || !col_major(s->M, s->K, s->sam, s->sak, &opa, &lda))
        return mtc_fail_msg(MT_BK_EDEVICE, "matmul: an operand has no unit stride (internal error)");
    if (s->M > INT32_MAX || s->N > INT32_MAX || s->K > INT32_MAX || lda > INT32_MAX || ldb > INT32_MAX ||
        s->scm > INT32_MAX || batch > INT32_MAX)
        return mtc_fail_msg(MT_BK_EDEVICE, "matmul: a dimension exceeds cuBLAS's 32-bit limit");
    cublasHandle_t h = handle(&rc);
    if (!h) return rc;
    float one32 = 1, zero32 = 0;
    double one64 = 1, zero64 = 0;
    const void *alpha = dtype == MT_FLOAT64 ? (const void *)&one64 : (const void *)&one32;
    const void *beta = dtype == MT_FLOAT64 ? (const void *)&zero64 : (const void *)&zero32;
    cublasStatus_t st = g_lib.gemm(h, opb, opa, (int)s->N, (int)s->M, (int)s->K, alpha,
                                   b, dt, (int)ldb, (long long)stride_b,
                                   a, dt, (int)lda, (long long)stride_a, beta,
                                   c, dt, (int)s->scm, (long long)stride_c, (int)batch, compute,
                                   CUBLAS_GEMM_DEFAULT);
    if (st != 0) return fail_status("cublasGemmStridedBatchedEx", st);
    return 0;
}

const mt_linalg_kernels mtc_linalg_kernels = {mtc_gemm, 1};

}  // extern "C"
