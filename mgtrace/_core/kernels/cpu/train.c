/* Training kernels: batch normalization in training mode (forward and
 * backward) and the SGD step.
 *
 * Batch norm's composed form (mean, var, rsqrt, add, mul, neg, mul, add,
 * then the same chain's gradient rules plus the broadcast sums of weight
 * and bias) makes about twenty passes over an [N, C, H, W] tensor per
 * step; ResNet-18's twenty batch norms were a seventh of a training step
 * that way. Here x is read as [outer, c, inner] (outer = N, inner the
 * spatial size) and each channel is one job: its mean and biased variance
 * in double (two passes, 8 fixed lanes, so one order in every ISA clone),
 * then y = x * scale + shift in one pass. The backward recomputes the same
 * statistics (as layer norm's does), sums gy and gy * (x - mean) in one
 * pass and writes gx in another:
 *
 *     gx = w rstd (gy - mean(gy) - xhat mean(gy xhat)),  xhat = (x - mean) rstd
 *     gw = sum(gy xhat),  gb = sum(gy)                   (PyTorch's formula)
 *
 * The SGD step updates a parameter, its gradient and its momentum buffer in
 * one pass, in the parameter's dtype, in the order of mgtrace.optimizer.SGD's
 * tensor formula (g' = g + wd p; buf = m buf + g'; p = p - lr step).
 * Channels (and SGD's elements) are shared over threads when there is
 * enough work.
 *
 * Softmax's and log_softmax's input gradients, one pass over each row of
 * the softmax axis (the composed rule made four: a product, a sum, a
 * difference and another product, each writing a fresh tensor):
 *
 *     softmax:      gx = y (gy - sum(gy y))       (y the softmax's output)
 *     log_softmax:  gx = gy - exp(y) sum(gy)      (y the log_softmax's output)
 *
 * The row's sum in double (8 fixed lanes, one order in every ISA clone);
 * float32's exp is mt_vmath.h's (1 ulp), float64's libm's.
 */
#include "nn.h"
#include "mt_simd.h"
#include "mt_vmath.h"
#include <math.h>
#include <string.h>

#ifndef MT_TRAIN_TEMPLATE

/* gx = gy - exp(y) s over n float32s (log_softmax's row) */
static MT_VCLONES void log_softmax_tail_f32(const float *y, const float *gy, float *gx, float s, int64_t n) {
    const mt_vf sv = mt_vsplat(s);
    int64_t i = 0;
    for (; i + MT_VL <= n; i += MT_VL) {
        mt_vf a, g;
        memcpy(&a, y + i, sizeof a);
        memcpy(&g, gy + i, sizeof g);
        const mt_vf v = g - mt_vexp(a) * sv;
        memcpy(gx + i, &v, sizeof v);
    }
    if (i < n) {
        float ab[MT_VL] = {0}, gb[MT_VL] = {0};
        memcpy(ab, y + i, (size_t)(n - i) * 4);
        memcpy(gb, gy + i, (size_t)(n - i) * 4);
        mt_vf a, g;
        memcpy(&a, ab, sizeof a);
        memcpy(&g, gb, sizeof g);
        const mt_vf v = g - mt_vexp(a) * sv;
        memcpy(ab, &v, sizeof v);
        memcpy(gx + i, ab, (size_t)(n - i) * 4);
    }
}

static void log_softmax_tail_f64(const double *y, const double *gy, double *gx, double s, int64_t n) {
    for (int64_t i = 0; i < n; i++) gx[i] = gy[i] - exp(y[i]) * s;
}

#define MT_TRAIN_TEMPLATE
#define T float
#define SFX f32
#include "train.c"
#undef T
#undef SFX
#define T double
#define SFX f64
#include "train.c"
#undef T
#undef SFX
#undef MT_TRAIN_TEMPLATE

int mt_batch_norm_train(int dtype, const void *x, const void *w, const void *b, void *y, void *mean, void *var,
                        int64_t outer, int64_t c, int64_t inner, double eps, int nthreads) {
    if (dtype != MT_FLOAT32 && dtype != MT_FLOAT64)
        return MT_NN_EINDEX;                      /* the wrapper passes float32/float64 only */
    const int par = nthreads > 1 && c > 1 && outer * c * inner >= MT_NN_GRAIN;
    #pragma omp parallel for num_threads(nthreads) schedule(dynamic, 1) if (par)
    for (int64_t ch = 0; ch < c; ch++) {
        if (dtype == MT_FLOAT32)
            bn_channel_f32(x, w, b, y, mean, var, outer, c, inner, ch, eps);
        else
            bn_channel_f64(x, w, b, y, mean, var, outer, c, inner, ch, eps);
    }
    return 0;
}

int mt_batch_norm_backward(int dtype, const void *x, const void *w, const void *gy, void *gx, void *gw,
                           void *gb, int64_t outer, int64_t c, int64_t inner, double eps, int nthreads) {
    if (dtype != MT_FLOAT32 && dtype != MT_FLOAT64)
        return MT_NN_EINDEX;                      /* the wrapper passes float32/float64 only */
    const int par = nthreads > 1 && c > 1 && outer * c * inner >= MT_NN_GRAIN;
    #pragma omp parallel for num_threads(nthreads) schedule(dynamic, 1) if (par)
    for (int64_t ch = 0; ch < c; ch++) {
        if (dtype == MT_FLOAT32)
            bn_channel_backward_f32(x, w, gy, gx, gw, gb, outer, c, inner, ch, eps);
        else
            bn_channel_backward_f64(x, w, gy, gx, gw, gb, outer, c, inner, ch, eps);
    }
    return 0;
}

/* elements per SGD job: a few L2-sized chunks of the three arrays */
#define MT_SGD_CHUNK 16384

int mt_sgd_step(int dtype, void *p, const void *g, void *buf, int64_t n, double lr, double momentum,
                double weight_decay, int nesterov, int first, int nthreads) {
    if (dtype != MT_FLOAT32 && dtype != MT_FLOAT64)
        return MT_NN_EINDEX;                      /* the wrapper passes float32/float64 only */
    const int64_t chunks = (n + MT_SGD_CHUNK - 1) / MT_SGD_CHUNK;
    const int par = nthreads > 1 && chunks > 1 && n >= MT_NN_GRAIN;
    #pragma omp parallel for num_threads(nthreads) schedule(static) if (par)
    for (int64_t k = 0; k < chunks; k++) {
        const int64_t lo = k * MT_SGD_CHUNK, len = n - lo < MT_SGD_CHUNK ? n - lo : MT_SGD_CHUNK;
        if (dtype == MT_FLOAT32)
            sgd_f32((float *)p + lo, (const float *)g + lo, buf ? (float *)buf + lo : NULL, len, lr, momentum,
                    weight_decay, nesterov, first);
        else
            sgd_f64((double *)p + lo, (const double *)g + lo, buf ? (double *)buf + lo : NULL, len, lr,
                    momentum, weight_decay, nesterov, first);
    }
    return 0;
}

/* rows per softmax-backward job: enough rows that a job is a few L2-sized
 * chunks of y, gy and gx */
static int64_t smax_rows_per_job(int64_t cols) {
    const int64_t r = MT_SGD_CHUNK / (cols > 0 ? cols : 1);
    return r > 0 ? r : 1;
}

int mt_softmax_backward(int dtype, int log_softmax, const void *y, const void *gy, void *gx, int64_t rows,
                        int64_t cols, int nthreads) {
    if (dtype != MT_FLOAT32 && dtype != MT_FLOAT64)
        return MT_NN_EINDEX;                      /* the wrapper passes float32/float64 only */
    if (rows <= 0 || cols <= 0)
        return 0;
    const int64_t per = smax_rows_per_job(cols), jobs = (rows + per - 1) / per;
    const int par = nthreads > 1 && jobs > 1 && rows * cols >= MT_NN_GRAIN;
    #pragma omp parallel for num_threads(nthreads) schedule(static) if (par)
    for (int64_t j = 0; j < jobs; j++) {
        const int64_t r0 = j * per, r1 = r0 + per < rows ? r0 + per : rows;
        if (dtype == MT_FLOAT32)
            softmax_rows_backward_f32((const float *)y, (const float *)gy, (float *)gx, r0, r1, cols,
                                      log_softmax);
        else
            softmax_rows_backward_f64((const double *)y, (const double *)gy, (double *)gx, r0, r1, cols,
                                      log_softmax);
    }
    return 0;
}

#else /* ------------------------------------------- MT_TRAIN_TEMPLATE: T, SFX */

#define FN(name) MT_CAT(name, SFX)

/* channel ch's mean and 1 / sqrt(biased var + eps) over [outer, ., inner], in double */
static MT_CLONES void FN(bn_moments)(const T *x, int64_t outer, int64_t c, int64_t inner, int64_t ch,
                                     double eps, double *mean, double *var, double *rstd) {
    double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0}, s = 0.0;
    const double m_count = (double)(outer * inner);
    for (int64_t o = 0; o < outer; o++) {
        const T *restrict r = x + (o * c + ch) * inner;
        int64_t i = 0;
        for (; i + 8 <= inner; i += 8)
            for (int l = 0; l < 8; l++) acc[l] += (double)r[i + l];
        for (; i < inner; i++) s += (double)r[i];
    }
    s += ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    const double m = s / m_count;
    for (int l = 0; l < 8; l++) acc[l] = 0;
    s = 0.0;
    for (int64_t o = 0; o < outer; o++) {
        const T *restrict r = x + (o * c + ch) * inner;
        int64_t i = 0;
        for (; i + 8 <= inner; i += 8)
            for (int l = 0; l < 8; l++) {
                const double d = (double)r[i + l] - m;
                acc[l] += d * d;
            }
        for (; i < inner; i++) {
            const double d = (double)r[i] - m;
            s += d * d;
        }
    }
    s += ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    *mean = m;
    *var = s / m_count;
    *rstd = 1.0 / sqrt(*var + eps);
}

static MT_CLONES void FN(bn_channel)(const void *xv, const void *wv, const void *bv, void *yv, void *meanv,
                                     void *varv, int64_t outer, int64_t c, int64_t inner, int64_t ch,
                                     double eps) {
    const T *x = xv, *w = wv, *b = bv;
    T *y = yv;
    double m, v, rs;
    FN(bn_moments)(x, outer, c, inner, ch, eps, &m, &v, &rs);
    if (meanv) ((T *)meanv)[ch] = (T)m;
    if (varv) ((T *)varv)[ch] = (T)v;
    const double sc = w ? rs * (double)w[ch] : rs;
    const T scale = (T)sc, shift = (T)((b ? (double)b[ch] : 0.0) - m * sc);
    for (int64_t o = 0; o < outer; o++) {
        const T *restrict r = x + (o * c + ch) * inner;
        T *restrict out = y + (o * c + ch) * inner;
        for (int64_t i = 0; i < inner; i++) out[i] = r[i] * scale + shift;
    }
}

static MT_CLONES void FN(bn_channel_backward)(const void *xv, const void *wv, const void *gyv, void *gxv,
                                              void *gwv, void *gbv, int64_t outer, int64_t c, int64_t inner,
                                              int64_t ch, double eps) {
    const T *x = xv, *w = wv, *gy = gyv;
    T *gx = gxv;
    double m, v, rs;
    FN(bn_moments)(x, outer, c, inner, ch, eps, &m, &v, &rs);
    double ag[8] = {0, 0, 0, 0, 0, 0, 0, 0}, ad[8] = {0, 0, 0, 0, 0, 0, 0, 0}, sg = 0.0, sd = 0.0;
    for (int64_t o = 0; o < outer; o++) {
        const T *restrict r = x + (o * c + ch) * inner, *restrict gr = gy + (o * c + ch) * inner;
        int64_t i = 0;
        for (; i + 8 <= inner; i += 8)
            for (int l = 0; l < 8; l++) {
                const double gv = (double)gr[i + l];
                ag[l] += gv;
                ad[l] += gv * ((double)r[i + l] - m);
            }
        for (; i < inner; i++) {
            sg += (double)gr[i];
            sd += (double)gr[i] * ((double)r[i] - m);
        }
    }
    sg += ((ag[0] + ag[4]) + (ag[1] + ag[5])) + ((ag[2] + ag[6]) + (ag[3] + ag[7]));
    sd += ((ad[0] + ad[4]) + (ad[1] + ad[5])) + ((ad[2] + ad[6]) + (ad[3] + ad[7]));
    if (gwv) ((T *)gwv)[ch] = (T)(sd * rs);               /* sum(gy xhat) */
    if (gbv) ((T *)gbv)[ch] = (T)sg;
    if (!gx)
        return;
    /* gx = k (gy - sg / M - (x - m) rs^2 sd / M), k = w rs: gx = k gy + c1 x + c0 */
    const double count = (double)(outer * inner), k = w ? (double)w[ch] * rs : rs;
    const double q = rs * rs * sd / count;
    const T kt = (T)k, c1 = (T)(-k * q), c0 = (T)(k * (q * m - sg / count));
    for (int64_t o = 0; o < outer; o++) {
        const T *restrict r = x + (o * c + ch) * inner, *restrict gr = gy + (o * c + ch) * inner;
        T *restrict out = gx + (o * c + ch) * inner;
        for (int64_t i = 0; i < inner; i++) out[i] = gr[i] * kt + r[i] * c1 + c0;
    }
}

/* no fused multiply-adds: each step rounds as mgtrace.optimizer.SGD's tensor ops do, so the
 * C path and the composed one give the same bits */
#pragma GCC push_options
#pragma GCC optimize("fp-contract=off")
static MT_CLONES void FN(sgd)(T *restrict p, const T *restrict g, T *restrict buf, int64_t n, double lr,
                              double momentum, double weight_decay, int nesterov, int first) {
    const T lr_t = (T)lr, m_t = (T)momentum, wd_t = (T)weight_decay;
    const int decay = weight_decay != 0.0;
    if (!buf) {                               /* no momentum: p -= lr g' */
        for (int64_t i = 0; i < n; i++) {
            const T gi = decay ? g[i] + p[i] * wd_t : g[i];
            p[i] = p[i] - gi * lr_t;
        }
        return;
    }
    for (int64_t i = 0; i < n; i++) {
        const T gi = decay ? g[i] + p[i] * wd_t : g[i];
        const T bi = first ? gi : buf[i] * m_t + gi;
        buf[i] = bi;
        const T step = nesterov ? gi + bi * m_t : bi;
        p[i] = p[i] - step * lr_t;
    }
}
#pragma GCC pop_options

/* rows [r0, r1) of softmax's (or log_softmax's) input gradient, [rows, cols] contiguous */
static MT_CLONES void FN(softmax_rows_backward)(const T *y, const T *gy, T *gx, int64_t r0, int64_t r1,
                                               int64_t cols, int log_softmax) {
    for (int64_t r = r0; r < r1; r++) {
        const T *restrict yr = y + r * cols, *restrict gr = gy + r * cols;
        T *restrict out = gx + r * cols;
        double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0}, s = 0.0;
        int64_t i = 0;
        if (log_softmax) {                                    /* sum(gy) */
            for (; i + 8 <= cols; i += 8)
                for (int l = 0; l < 8; l++) acc[l] += (double)gr[i + l];
            for (; i < cols; i++) s += (double)gr[i];
        } else {                                              /* sum(gy y) */
            for (; i + 8 <= cols; i += 8)
                for (int l = 0; l < 8; l++) acc[l] += (double)gr[i + l] * (double)yr[i + l];
            for (; i < cols; i++) s += (double)gr[i] * (double)yr[i];
        }
        s += ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
        const T st = (T)s;
        if (log_softmax)
            FN(log_softmax_tail)(yr, gr, out, st, cols);
        else
            for (int64_t k = 0; k < cols; k++) out[k] = yr[k] * (gr[k] - st);
    }
}

#undef FN
#endif
