/* Fused attention's backward (the gradient rule of F.attention in
 * training), one (batch, head) pair at a time, as the forward in
 * attention.c.
 *
 * The probabilities come from the training forward here
 * (mt_attention_train_f32, the forward that also writes them: MiniLM
 * 8 x 128 keeps 6 MiB a layer until its backward) or, given none, are
 * recomputed from q, k and the mask (one more GEMM per pair, the q k^T of
 * [Sq, Sk] from K = d, the slowest of the six at MiniLM's head size 32).
 * With s = scale q k^T + mask and p = softmax(s) per row:
 *     gv = p^T gy,  gp = gy v^T,  gs = p (gp - sum_j(gp p)),
 *     gq = scale gs k,  gk = scale gs^T q,  gmask = gs
 * (PyTorch's softmax backward; the row sum in double). Per pair the
 * [Sq, Sk] buffers stay in the thread's cache between the five GEMMs, and
 * the pairs are shared over OpenMP threads running single-threaded BLAS.
 * The softmax is the forward's own function (attention.c's
 * mt_attention_softmax_row), so the recomputed probabilities are its bits.
 */
#include <cblas.h>
#include "nn.h"
#include "mt_vmath.h"
#ifdef _OPENMP
#include <omp.h>
#endif

int64_t mt_attention_backward_workspace(const mt_attn_geom *g, int nthreads) {
    return (int64_t)(nthreads < 1 ? 1 : nthreads) * 2 * g->sq * g->sk * 4;
}

/* The softmax backward's double row sum over 8 double lanes (GCC vector
 * extensions): written as a scalar loop GCC keeps it scalar (a double sum
 * it may not reorder), as the forward's softmax sum in attention.c. */
typedef double ag_v8d __attribute__((vector_size(64)));
typedef float ag_v8f __attribute__((vector_size(32)));

static inline double ag_hsum(ag_v8d a) {
    return ((a[0] + a[4]) + (a[1] + a[5])) + ((a[2] + a[6]) + (a[3] + a[7]));
}

/* gs = p (gp - sum(gp p)) in place over gp, one row of n */
static MT_VCLONES void grad_softmax_back_row(const float *restrict p, float *restrict gp, int64_t n) {
    ag_v8d acc = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t j = 0;
    for (; j + 8 <= n; j += 8) {
        ag_v8f x, y; memcpy(&x, gp + j, sizeof x); memcpy(&y, p + j, sizeof y);
        acc += __builtin_convertvector(x, ag_v8d) * __builtin_convertvector(y, ag_v8d);
    }
    double d = ag_hsum(acc);
    for (; j < n; j++) d += (double)gp[j] * p[j];
    const float df = (float)d;
    for (j = 0; j < n; j++) gp[j] = p[j] * (gp[j] - df);
}

/* the training forward of one pair: probs [sq, sk] dense, out heads-inner ([b, sq, h, dv] memory) */
static void attention_train_pair(const float *q, const float *k, const float *v, const float *mask, float *out,
                                 float *probs, const mt_attn_geom *g, int64_t p) {
    const int64_t bi = p / g->h, hi = p % g->h, sq = g->sq, sk = g->sk, dv = g->dv;
    const float *qp = q + bi * g->qs[0] + hi * g->qs[1];
    const float *kp = k + bi * g->ks[0] + hi * g->ks[1];
    const float *vp = v + bi * g->vs[0] + hi * g->vs[1];
    float *pb = probs + p * sq * sk;
    scipy_cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (blasint)sq, (blasint)sk, (blasint)g->d,
                      g->scale, qp, (blasint)g->qs[2], kp, (blasint)g->ks[2], 0.0f, pb, (blasint)sk);
    const float *mp = mask ? mask + bi * g->ms[0] + hi * g->ms[1] : NULL;
    for (int64_t i = 0; i < sq; i++)
        mt_attention_softmax_row(pb + i * sk, mp ? mp + i * g->ms[2] : NULL, g->ms[3], sk);
    scipy_cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (blasint)sq, (blasint)dv, (blasint)sk,
                      1.0f, pb, (blasint)sk, vp, (blasint)g->vs[2], 0.0f,
                      out + bi * sq * g->h * dv + hi * dv, (blasint)(g->h * dv));
}

int mt_attention_train_f32(const float *q, const float *k, const float *v, const float *mask, float *out,
                           float *probs, const mt_attn_geom *g, int nthreads) {
    const int64_t pairs = g->b * g->h;
    if (pairs == 0 || g->sq == 0) return 0;
    if (g->sk == 0) {           /* no keys: out = (an empty softmax) @ v, zero, as the sequence's matmul */
        memset(out, 0, (size_t)(g->b * g->sq * g->h * g->dv) * sizeof(float));
        return 0;
    }
    const int nt = nthreads > 1 && pairs > 1 ? (int)mt_min64(nthreads, pairs) : 1;
    if (nt > 1) mt_nn_blas_single_begin();
    #pragma omp parallel for num_threads(nt) schedule(dynamic, 1) if (nt > 1)
    for (int64_t p = 0; p < pairs; p++) attention_train_pair(q, k, v, mask, out, probs, g, p);
    if (nt > 1) mt_nn_blas_single_end();
    return 0;
}

static void attention_backward_pair(const float *q, const float *k, const float *v, const float *mask,
                                    const float *probs, const float *gy, float *gq, float *gk, float *gv,
                                    float *gs, const mt_attn_geom *g, int64_t p, float *pb, float *gb) {
    const int64_t bi = p / g->h, hi = p % g->h, sq = g->sq, sk = g->sk, d = g->d, dv = g->dv, h = g->h;
    const float *qp = q + bi * g->qs[0] + hi * g->qs[1];
    const float *kp = k + bi * g->ks[0] + hi * g->ks[1];
    const float *vp = v + bi * g->vs[0] + hi * g->vs[1];
    const int dense = g->os[0] == 0 && g->os[1] == 0 && g->os[2] == 0;
    const float *gyp = dense ? gy + p * sq * dv : gy + bi * g->os[0] + hi * g->os[1];
    const blasint gys = (blasint)(dense ? dv : g->os[2]);
    /* the gradients heads-inner: [b, s, h, d] memory */
    float *gqp = gq + bi * sq * h * d + hi * d;
    float *gkp = gk + bi * sk * h * d + hi * d;
    float *gvp = gv + bi * sk * h * dv + hi * dv;
    float *gsp = gs ? gs + p * sq * sk : gb;
    if (probs) {
        pb = (float *)(probs + p * sq * sk);       /* read only below */
    } else {
        scipy_cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (blasint)sq, (blasint)sk, (blasint)d,
                          g->scale, qp, (blasint)g->qs[2], kp, (blasint)g->ks[2], 0.0f, pb, (blasint)sk);
        const float *mp = mask ? mask + bi * g->ms[0] + hi * g->ms[1] : NULL;
        for (int64_t i = 0; i < sq; i++)
            mt_attention_softmax_row(pb + i * sk, mp ? mp + i * g->ms[2] : NULL, g->ms[3], sk);
    }
    /* gv = p^T gy */
    scipy_cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (blasint)sk, (blasint)dv, (blasint)sq,
                      1.0f, pb, (blasint)sk, gyp, gys, 0.0f, gvp, (blasint)(h * dv));
    /* gp = gy v^T, then gs over it */
    scipy_cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (blasint)sq, (blasint)sk, (blasint)dv,
                      1.0f, gyp, gys, vp, (blasint)g->vs[2], 0.0f, gsp, (blasint)sk);
    for (int64_t i = 0; i < sq; i++) grad_softmax_back_row(pb + i * sk, gsp + i * sk, sk);
    /* gq = scale gs k, gk = scale gs^T q */
    scipy_cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (blasint)sq, (blasint)d, (blasint)sk,
                      g->scale, gsp, (blasint)sk, kp, (blasint)g->ks[2], 0.0f, gqp, (blasint)(h * d));
    scipy_cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (blasint)sk, (blasint)d, (blasint)sq,
                      g->scale, gsp, (blasint)sk, qp, (blasint)g->qs[2], 0.0f, gkp, (blasint)(h * d));
}

int mt_attention_backward_f32(const float *q, const float *k, const float *v, const float *mask,
                              const float *probs, const float *gy, float *gq, float *gk, float *gv, float *gs,
                              const mt_attn_geom *g, int nthreads, void *workspace) {
    const int64_t pairs = g->b * g->h;
    if (pairs == 0) return 0;
    if (g->sq == 0 || g->sk == 0) {
        /* no scores: every gradient is zero (gq's rows sum over no keys, gk's and gv's over no
         * queries) */
        memset(gq, 0, (size_t)(g->b * g->sq * g->h * g->d) * sizeof(float));
        memset(gk, 0, (size_t)(g->b * g->sk * g->h * g->d) * sizeof(float));
        memset(gv, 0, (size_t)(g->b * g->sk * g->h * g->dv) * sizeof(float));
        return 0;
    }
    float *ws = workspace;
    const int nt = nthreads > 1 && pairs > 1 ? (int)mt_min64(nthreads, pairs) : 1;
    if (nt > 1) mt_nn_blas_single_begin();
    #pragma omp parallel for num_threads(nt) schedule(dynamic, 1) if (nt > 1)
    for (int64_t p = 0; p < pairs; p++) {
#ifdef _OPENMP
        float *pb = ws + (int64_t)omp_get_thread_num() * 2 * g->sq * g->sk;
#else
        float *pb = ws;
#endif
        attention_backward_pair(q, k, v, mask, probs, gy, gq, gk, gv, gs, g, p, pb, pb + g->sq * g->sk);
    }
    if (nt > 1) mt_nn_blas_single_end();
    return 0;
}
