/* Local response normalization across channels (MegEngine's LRN,
 * F.local_response_norm): for x [outer, c, inner] contiguous,
 *     y[o][ci][j] = x[o][ci][j] * (k + alpha * s)^-beta,
 *     s = sum of x[o][c'][j]^2 over the n channels c' centred on ci
 * (those inside 0..c-1). The composed form (square, pad, n - 1 slice adds,
 * mul, add, pow, div) makes about n + 5 passes over the tensor and calls
 * pow per element. Here a block of up to LRN_BLOCK positions j of one o is
 * one task: per channel the window's squares are summed in double from the
 * rows in cache (n reads each, no running difference, so no cancellation
 * when large values leave the window), and beta = 0.75 (MegEngine's and
 * PyTorch's default) takes 1 / (sqrt(t) * sqrt(sqrt(t))) instead of pow.
 */
#include <math.h>

#include "nn.h"

#define LRN_BLOCK 256

#ifndef MT_NN_TEMPLATE

#define MT_NN_TEMPLATE
#define T float
#define SFX f32
#include "lrn.c"
#undef T
#undef SFX
#define T double
#define SFX f64
#include "lrn.c"
#undef T
#undef SFX
#undef MT_NN_TEMPLATE

int mt_lrn(int dtype, const void *x, void *y, int64_t outer, int64_t c, int64_t inner, int64_t n,
           double k, double alpha, double beta, int nthreads) {
    /* the caller passes float32 or float64, n >= 1 */
    const int64_t blocks = (inner + LRN_BLOCK - 1) / LRN_BLOCK, tasks = outer * blocks;
    const int par = nthreads > 1 && tasks > 1 && outer * c * inner >= MT_NN_GRAIN;
    #pragma omp parallel for num_threads(nthreads) schedule(static) if (par)
    for (int64_t t = 0; t < tasks; t++) {
        const int64_t o = t / blocks, j0 = (t % blocks) * LRN_BLOCK;
        const int64_t m = inner - j0 < LRN_BLOCK ? inner - j0 : LRN_BLOCK;
        const int64_t off = o * c * inner + j0;
        if (dtype == MT_FLOAT32)
            lrn_block_f32((const float *)x + off, (float *)y + off, c, inner, m, n, k, alpha, beta);
        else
            lrn_block_f64((const double *)x + off, (double *)y + off, c, inner, m, n, k, alpha, beta);
    }
    return 0;
}

#else /* MT_NN_TEMPLATE: one dtype's block loop */

#define CAT_(a, b) a##_##b
#define CAT(a, b) CAT_(a, b)

/* m positions (stride 1) of every channel (stride inner) of one outer index */
static void CAT(lrn_block, SFX)(const T *x, T *y, int64_t c, int64_t inner, int64_t m, int64_t n,
                                double k, double alpha, double beta) {
    double s[LRN_BLOCK];
    const int64_t half = n / 2;
    const int b075 = beta == 0.75;
    for (int64_t ci = 0; ci < c; ci++) {
        const int64_t lo = ci - half < 0 ? 0 : ci - half, hi = ci + half >= c ? c - 1 : ci + half;
        for (int64_t j = 0; j < m; j++)
            s[j] = 0.0;
        for (int64_t cc = lo; cc <= hi; cc++) {
            const T *xr = x + cc * inner;
            for (int64_t j = 0; j < m; j++)
                s[j] += (double)xr[j] * (double)xr[j];
        }
        const T *xr = x + ci * inner;
        T *yr = y + ci * inner;
        for (int64_t j = 0; j < m; j++) {
            const double t = k + alpha * s[j];
            const double scale = b075 ? 1.0 / (sqrt(t) * sqrt(sqrt(t))) : pow(t, -beta);
            yr[j] = (T)((double)xr[j] * scale);
        }
    }
}

#undef CAT
#undef CAT_

#endif
