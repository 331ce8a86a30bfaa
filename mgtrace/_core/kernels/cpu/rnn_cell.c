/* One time step of an LSTM or a simple RNN, fused (nn_kernels.h's lstm_cell
 * and rnn_cell; mgtrace.module.rnn runs one per step).
 *
 * The input's share of the gates, gx = x_t @ W_ih^T + b_ih, arrives
 * precomputed (one GEMM over the whole sequence). h may be narrower than
 * the cell (h_width: an LSTM with a projection feeds back P < hidden
 * columns; the projection itself is the caller's). A step is then
 *   gates = gx + b_hh + h @ W_hh^T      (one BLAS GEMM into a work buffer)
 * followed by one pass over the gates:
 *   LSTM (torch.nn's gate order i, f, g, o)
 *     c' = sigmoid(f) * c + sigmoid(i) * tanh(g),  h' = sigmoid(o) * tanh(c')
 *   RNN  h' = tanh(gates) or relu(gates)
 * Rows are split between OpenMP threads for the pass; the GEMM is
 * OpenBLAS's. float32 and float64 (the caller computes half types in
 * float32); every buffer contiguous, row-major.
 */
#ifndef MT_RNN_CELL_TEMPLATE

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <cblas.h>
#include "nn.h"
#ifdef _OPENMP
#include <omp.h>
#endif

#define MT_RNN_CELL_TEMPLATE
#define T float
#define SFX f32
#define EXP expf
#define TANH tanhf
#include "rnn_cell.c"
#undef T
#undef SFX
#undef EXP
#undef TANH
#define T double
#define SFX f64
#define EXP exp
#define TANH tanh
#include "rnn_cell.c"
#undef T
#undef SFX
#undef EXP
#undef TANH
#undef MT_RNN_CELL_TEMPLATE

int mt_lstm_cell(int dtype, const void *gx, const void *h, const void *c, const void *w_hh, const void *b_hh,
                 void *h_out, void *c_out, int64_t n, int64_t hidden, int64_t h_width, int nthreads) {
    if (dtype == MT_FLOAT32) return lstm_cell_f32(gx, h, c, w_hh, b_hh, h_out, c_out, n, hidden, h_width, nthreads);
    return lstm_cell_f64(gx, h, c, w_hh, b_hh, h_out, c_out, n, hidden, h_width, nthreads);
}

int mt_rnn_cell(int dtype, int relu, const void *gx, const void *h, const void *w_hh, const void *b_hh,
                void *h_out, int64_t n, int64_t hidden, int nthreads) {
    if (dtype == MT_FLOAT32) return rnn_cell_f32(relu, gx, h, w_hh, b_hh, h_out, n, hidden, nthreads);
    return rnn_cell_f64(relu, gx, h, w_hh, b_hh, h_out, n, hidden, nthreads);
}

#else /* ------------------------------------------- MT_RNN_CELL_TEMPLATE: T, SFX */

#define FN(name) MT_CAT(name, SFX)

/* gates [n, cols] = gx + b_hh + h [n, width] @ w_hh [cols, width]^T */
static void FN(rnn_gates)(const T *gx, const T *h, const T *w_hh, const T *b_hh, T *gates, int64_t n,
                          int64_t width, int64_t cols) {
    for (int64_t r = 0; r < n; r++) {
        T *gr = gates + r * cols;
        const T *xr = gx + r * cols;
        if (b_hh)
            for (int64_t j = 0; j < cols; j++) gr[j] = xr[j] + b_hh[j];
        else
            memcpy(gr, xr, (size_t)cols * sizeof(T));
    }
    if (sizeof(T) == 4)
        scipy_cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (blasint)n, (blasint)cols, (blasint)width,
                          1.0f, (const float *)h, (blasint)width, (const float *)w_hh, (blasint)width, 1.0f,
                          (float *)gates, (blasint)cols);
    else
        scipy_cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (blasint)n, (blasint)cols, (blasint)width,
                          1.0, (const double *)h, (blasint)width, (const double *)w_hh, (blasint)width, 1.0,
                          (double *)gates, (blasint)cols);
}

static inline T FN(sigm)(T v) { return (T)1 / ((T)1 + EXP(-v)); }

static int FN(lstm_cell)(const T *gx, const T *h, const T *c, const T *w_hh, const T *b_hh, T *h_out, T *c_out,
                         int64_t n, int64_t hidden, int64_t width, int nt) {
    const int64_t cols = 4 * hidden;
    if (n == 0 || hidden == 0) return 0;
    T *gates = malloc(sizeof(T) * (size_t)(n * cols));
    if (!gates) return MT_NN_ENOMEM;
    FN(rnn_gates)(gx, h, w_hh, b_hh, gates, n, width, cols);
    #pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1 && n * cols >= MT_NN_GRAIN)
    for (int64_t r = 0; r < n; r++) {
        const T *g = gates + r * cols, *cr = c + r * hidden;
        T *hr = h_out + r * hidden, *co = c_out + r * hidden;
        for (int64_t j = 0; j < hidden; j++) {
            const T i = FN(sigm)(g[j]), f = FN(sigm)(g[hidden + j]), gg = TANH(g[2 * hidden + j]),
                    o = FN(sigm)(g[3 * hidden + j]);
            const T cn = f * cr[j] + i * gg;
            co[j] = cn;
            hr[j] = o * TANH(cn);
        }
    }
    free(gates);
    return 0;
}

static int FN(rnn_cell)(int relu, const T *gx, const T *h, const T *w_hh, const T *b_hh, T *h_out, int64_t n,
                        int64_t hidden, int nt) {
    if (n == 0 || hidden == 0) return 0;
    /* h_out is the work buffer: the pass reads each gate once, in place */
    FN(rnn_gates)(gx, h, w_hh, b_hh, h_out, n, hidden, hidden);
    const int64_t total = n * hidden;
    #pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1 && total >= MT_NN_GRAIN)
    for (int64_t k = 0; k < total; k++) {
        const T v = h_out[k];
        h_out[k] = relu ? (v > 0 ? v : (v != v ? v : (T)0)) : TANH(v);
    }
    return 0;
}

#undef FN
#endif
