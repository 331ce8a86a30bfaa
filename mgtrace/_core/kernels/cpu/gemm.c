/* Batched matrix products over OpenBLAS (scipy-openblas32 symbols). */
#include "gemm.h"
#include "backend.h"
#include <cblas.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#ifndef BLAS_SYMBOL_PREFIX
#error "build with -DBLAS_SYMBOL_PREFIX=scipy_ against scipy-openblas32"
#endif
#define MT_CAT2(a, b) a##b
#define MT_CAT(a, b) MT_CAT2(a, b)
#define MT_BLAS(name) MT_CAT(scipy_, name)

void MT_BLAS(openblas_set_num_threads)(int);
int MT_BLAS(openblas_get_num_threads)(void);
char *MT_BLAS(openblas_get_config)(void);

void mt_blas_set_threads(int n) { MT_BLAS(openblas_set_num_threads)(n); }
int mt_blas_get_threads(void) { return MT_BLAS(openblas_get_num_threads)(); }
const char *mt_blas_config(void) { return MT_BLAS(openblas_get_config)(); }

/* Row-major BLAS wants each matrix with one unit stride: pick trans and ld. */
static int blas_layout(int64_t srow, int64_t scol, int64_t rows, int64_t cols,
                       CBLAS_TRANSPOSE *t, int64_t *ld) {
    if (scol == 1 && (rows == 1 || srow >= (cols > 1 ? cols : 1))) {
        *t = CblasNoTrans; *ld = rows == 1 ? (cols > 1 ? cols : 1) : srow; return 1;
    }
    if (srow == 1 && (cols == 1 || scol >= (rows > 1 ? rows : 1))) {
        *t = CblasTrans; *ld = cols == 1 ? (rows > 1 ? rows : 1) : scol; return 1;
    }
    return 0;
}

/* One row times a matrix whose rows are the products' (a Linear layer at
 * batch 1: c[n] = sum_k a[k] w[n][k], w row-major N x K, ldw apart): each
 * row of w a dot product, MT_GEMV_ROWS rows at a time in 16-lane partial
 * sums, then each row's lanes in order and its last K % 16 terms. From
 * memory, which is where a classifier's weights are after the rest of a
 * model has run (5 MB for MobileNetV2's 1280 x 1000), OpenBLAS's sgemv on
 * this layout took 334 us (F.linear's best at one thread, the caches
 * flushed before each call), these eight row streams 237 us; from cache
 * both about 65 us. Each row's sum is computed the same way on any thread. */
#define MT_GEMV_ROWS 8
typedef mt_v16f_u gemv_v16;

static inline __attribute__((always_inline)) void gemv_rows(const float *w, int64_t ldw, const float *x,
                                                            float *y, int64_t K, const int R) {
    gemv_v16 acc[MT_GEMV_ROWS];
    for (int r = 0; r < R; r++) acc[r] = (gemv_v16){0};
    int64_t k = 0;
    for (; k + 16 <= K; k += 16) {
        const gemv_v16 xv = *(const gemv_v16 *)(x + k);
        for (int r = 0; r < R; r++) acc[r] += *(const gemv_v16 *)(w + r * ldw + k) * xv;
    }
    for (int r = 0; r < R; r++) {
        float sum = 0.0f;
        for (int l = 0; l < 16; l++) sum += acc[r][l];
        for (int64_t j = k; j < K; j++) sum += w[r * ldw + j] * x[j];
        y[r] = sum;
    }
}

/* rows [n0, n1) of c = w a (w: N x K, ldw floats a row; a, c unit stride) */
static MT_VCLONES void gemv_dot_f32(const float *w, int64_t ldw, const float *a, float *c, int64_t n0,
                                    int64_t n1, int64_t K) {
    int64_t n = n0;
    for (; n + MT_GEMV_ROWS <= n1; n += MT_GEMV_ROWS) gemv_rows(w + n * ldw, ldw, a, c + n, K, MT_GEMV_ROWS);
    for (; n < n1; n++) gemv_rows(w + n * ldw, ldw, a, c + n, K, 1);
}

/* the float32 one-row products gemv_dot_f32 runs: a row of unit stride
 * times B of unit k stride (op(B) the rows of a row-major N x K matrix),
 * into a row of unit stride; *ldw: that matrix's row stride */
static int gemv_dot_fits(int dtype, const mt_gemm_shape *s, int64_t *ldw) {
    if (dtype != MT_FLOAT32 || s->M != 1 || s->N < 2 || s->K < 1 || s->scn != 1) return 0;
    if (s->K > 1 && s->sak != 1) return 0;
    if (s->sbk != 1 || s->sbn < s->K) return 0;
    *ldw = s->sbn;
    return 1;
}

static void gemm_one(int dtype, const mt_gemm_shape *s, const char *a, const char *b, char *c) {
    int64_t ldw;
    if (gemv_dot_fits(dtype, s, &ldw)) {
        gemv_dot_f32((const float *)b, ldw, (const float *)a, (float *)c, 0, s->N, s->K);
        return;
    }
    CBLAS_TRANSPOSE ta, tb;
    int64_t lda, ldb;
    /* the Cython side guarantees a BLAS-compatible layout and C row-major */
    blas_layout(s->sam, s->sak, s->M, s->K, &ta, &lda);
    blas_layout(s->sbk, s->sbn, s->K, s->N, &tb, &ldb);
    int64_t ldc = s->M == 1 ? (s->N > 1 ? s->N : 1) : s->scm;
    if (s->M == 1 && s->N > 1 && s->K > 0) {
        /* one row (a Linear layer at batch 1): c = op(B)^T a as a GEMV, which
         * streams B once; sgemm would first pack all of B (5 MB for a
         * 1280 x 1000 classifier) to use it for a single row */
        const int64_t inca = ta == CblasNoTrans ? 1 : lda;
        const int64_t incc = s->scn;
        const CBLAS_TRANSPOSE tv = tb == CblasNoTrans ? CblasTrans : CblasNoTrans;
        const int64_t rows = tb == CblasNoTrans ? s->K : s->N, cols = tb == CblasNoTrans ? s->N : s->K;
        if (dtype == MT_FLOAT32)
            MT_BLAS(cblas_sgemv)(CblasRowMajor, tv, (blasint)rows, (blasint)cols, 1.0f, (const float *)b,
                                 (blasint)ldb, (const float *)a, (blasint)inca, 0.0f, (float *)c, (blasint)incc);
        else
            MT_BLAS(cblas_dgemv)(CblasRowMajor, tv, (blasint)rows, (blasint)cols, 1.0, (const double *)b,
                                 (blasint)ldb, (const double *)a, (blasint)inca, 0.0, (double *)c, (blasint)incc);
        return;
    }
    if (dtype == MT_FLOAT32)
        MT_BLAS(cblas_sgemm)(CblasRowMajor, ta, tb, (blasint)s->M, (blasint)s->N, (blasint)s->K,
                             1.0f, (const float *)a, (blasint)lda, (const float *)b, (blasint)ldb,
                             0.0f, (float *)c, (blasint)ldc);
    else
        MT_BLAS(cblas_dgemm)(CblasRowMajor, ta, tb, (blasint)s->M, (blasint)s->N, (blasint)s->K,
                             1.0, (const double *)a, (blasint)lda, (const double *)b, (blasint)ldb,
                             0.0, (double *)c, (blasint)ldc);
}

/* Products at or under this many multiply-adds each run single-threaded
 * inside the batch's OpenMP loop: OpenBLAS would thread a 128 x 128 x 32
 * product (an attention head) over all cores, and each such call then
 * waits at its join for the slowest thread (on a loaded machine, a
 * descheduled one: a 1 ms product took a second). */
#define MT_GEMM_SMALL_MNK ((int64_t)1 << 22)

/* one-row products of at least this many multiply-adds split their rows
 * over the threads (a 512 x 1000 classifier: 2 MB of weights) */
#define MT_GEMV_SPLIT ((int64_t)1 << 16)

/* fewest rows (or columns) of C a thread's block of a split product gets */
#define MT_GEMM_BLOCK_MIN 64

#ifdef _OPENMP
/* One large product as nt blocks of C's rows (or, for a short and wide C,
 * its columns), one single-threaded GEMM a thread: the threads meet once,
 * at the end. OpenBLAS's own threading of one GEMM meets its threads at
 * every K panel, and on a loaded machine each meeting waits for whichever
 * thread was descheduled. Each block packs its share of A and all of B
 * (B once per thread: a small cost next to the product). */
static void gemm_split(int dtype, const mt_gemm_shape *s, const char *a, const char *b, char *c, int64_t isz,
                       int nt) {
    const int by_rows = s->M >= 2 * MT_GEMM_BLOCK_MIN;
    const int64_t extent = by_rows ? s->M : s->N;
    const int team = (int)(extent / MT_GEMM_BLOCK_MIN < nt ? extent / MT_GEMM_BLOCK_MIN : nt);
    const int saved = MT_BLAS(openblas_get_num_threads)();
    if (saved != 1) MT_BLAS(openblas_set_num_threads)(1);
    #pragma omp parallel num_threads(team)
    {
        const int t = omp_get_thread_num(), n = omp_get_num_threads();
        const int64_t lo = extent * t / n, hi = extent * (t + 1) / n;
        if (hi > lo) {
            mt_gemm_shape part = *s;
            if (by_rows) {
                part.M = hi - lo;
                gemm_one(dtype, &part, a + lo * s->sam * isz, b, c + lo * s->scm * isz);
            } else {
                part.N = hi - lo;
                gemm_one(dtype, &part, a, b + lo * s->sbn * isz, c + lo * s->scn * isz);
            }
        }
    }
    if (saved != 1) MT_BLAS(openblas_set_num_threads)(saved);
}
#endif

/* A batch runs one of two ways. Few large products: a loop over them,
 * each split over the threads by gemm_split (one single-threaded GEMM per
 * block of C). Many small ones (attention's heads, a
 * batched matmul's problems): one OpenMP loop over the batch, OpenBLAS
 * switched to one thread around it, so each thread runs whole products and
 * the threads meet once, at the loop's end (dynamic schedule: a thread
 * the machine holds up leaves its share to the others). Each product is computed the
 * same way either way (one single-threaded GEMM), so the two agree except
 * where OpenBLAS's threaded split of one product reorders its sums. */
void mt_gemm_float_batch(int dtype, const mt_gemm_shape *s, const char *a, const char *b, char *c,
                         const int64_t *a_off, const int64_t *b_off, const int64_t *c_off,
                         int64_t batch, int nt) {
    const int64_t isz = dtype == MT_FLOAT32 ? 4 : 8;
    const int64_t mnk = s->M * s->N * s->K;
    const int by_item = nt > 1 && batch > 1 && (mnk <= MT_GEMM_SMALL_MNK || batch >= 4 * (int64_t)nt);
#ifdef _OPENMP
    int64_t ldw;
    if (!by_item && nt > 1 && s->N * s->K >= MT_GEMV_SPLIT && gemv_dot_fits(dtype, s, &ldw)) {
        /* one-row products: each thread a range of whole row blocks of B */
        const int64_t blocks = (s->N + MT_GEMV_ROWS - 1) / MT_GEMV_ROWS;
        const int team = blocks < nt ? (int)blocks : nt;
        for (int64_t i = 0; i < batch; i++) {
            const float *w = (const float *)(b + b_off[i] * isz), *x = (const float *)(a + a_off[i] * isz);
            float *y = (float *)(c + c_off[i] * isz);
            #pragma omp parallel num_threads(team)
            {
                const int t = omp_get_thread_num(), n = omp_get_num_threads();
                const int64_t lo = blocks * t / n * MT_GEMV_ROWS, hi = blocks * (t + 1) / n * MT_GEMV_ROWS;
                gemv_dot_f32(w, ldw, x, y, lo, hi < s->N ? hi : s->N, s->K);
            }
        }
        return;
    }
    if (by_item) {
        const int saved = MT_BLAS(openblas_get_num_threads)();
        if (saved != 1) MT_BLAS(openblas_set_num_threads)(1);
        const int team = batch < nt ? (int)batch : nt;
        #pragma omp parallel for num_threads(team) schedule(dynamic)
        for (int64_t i = 0; i < batch; i++)
            gemm_one(dtype, s, a + a_off[i] * isz, b + b_off[i] * isz, c + c_off[i] * isz);
        if (saved != 1) MT_BLAS(openblas_set_num_threads)(saved);
        return;
    }
    if (nt > 1 && mnk > MT_GEMM_SMALL_MNK && (s->M >= 2 * MT_GEMM_BLOCK_MIN || s->N >= 2 * MT_GEMM_BLOCK_MIN)) {
        for (int64_t i = 0; i < batch; i++)
            gemm_split(dtype, s, a + a_off[i] * isz, b + b_off[i] * isz, c + c_off[i] * isz, isz, nt);
        return;
    }
#else
    (void)by_item;
#endif
    for (int64_t i = 0; i < batch; i++)
        gemm_one(dtype, s, a + a_off[i] * isz, b + b_off[i] * isz, c + c_off[i] * isz);
}

#define MT_GEMM_INT(sfx, T)                                                    \
    static void gemm_int_##sfx(const mt_gemm_shape *s, const T *a, const T *b, T *c) { \
        for (int64_t m = 0; m < s->M; m++)                                     \
            for (int64_t n = 0; n < s->N; n++) {                               \
                int64_t acc = 0;                                               \
                for (int64_t k = 0; k < s->K; k++)                             \
                    acc += (int64_t)a[m * s->sam + k * s->sak] * (int64_t)b[k * s->sbk + n * s->sbn]; \
                c[m * s->scm + n * s->scn] = (T)acc;                           \
            }                                                                  \
    }
MT_GEMM_INT(i8, int8_t) MT_GEMM_INT(u8, uint8_t) MT_GEMM_INT(i16, int16_t)
MT_GEMM_INT(u16, uint16_t) MT_GEMM_INT(i32, int32_t) MT_GEMM_INT(i64, int64_t)

void mt_gemm_int_batch(int dtype, const mt_gemm_shape *s, const char *a, const char *b, char *c,
                       const int64_t *a_off, const int64_t *b_off, const int64_t *c_off,
                       int64_t batch, int nt) {
    (void)nt;
    for (int64_t i = 0; i < batch; i++) {
#define MT_CASE(code, sfx, T) case code: { const int64_t z = sizeof(T);          \
            gemm_int_##sfx(s, (const T *)(a + a_off[i] * z), (const T *)(b + b_off[i] * z), \
                           (T *)(c + c_off[i] * z)); break; }
        switch (dtype) {
            MT_CASE(MT_INT8, i8, int8_t) MT_CASE(MT_UINT8, u8, uint8_t)
            MT_CASE(MT_INT16, i16, int16_t) MT_CASE(MT_UINT16, u16, uint16_t)
            MT_CASE(MT_INT32, i32, int32_t) MT_CASE(MT_INT64, i64, int64_t)
            default: break;
        }
#undef MT_CASE
    }
}

int mt_cpu_gemm_batch(int dtype, const mt_gemm_shape *s, const char *a, const char *b, char *c,
                      const int64_t *a_off, const int64_t *b_off, const int64_t *c_off,
                      int64_t batch, int nt) {
    if (dtype == MT_FLOAT32 || dtype == MT_FLOAT64)
        mt_gemm_float_batch(dtype, s, a, b, c, a_off, b_off, c_off, batch, nt);
    else if (dtype >= MT_INT8 && dtype <= MT_INT64)
        mt_gemm_int_batch(dtype, s, a, b, c, a_off, b_off, c_off, batch, nt);
    else
        return MT_BK_ENOKERNEL;
    return 0;
}
