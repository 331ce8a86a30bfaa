/* Fused attention for inference: out = softmax(q k^T * scale + mask) v,
 * one (batch, head) pair at a time.
 *
 * The unfused sequence writes the [Sq, Sk] scores of every pair to memory
 * and reads them back four times (scale, mask, softmax, second product),
 * and each of its GEMMs is small (MiniLM: 96 pairs of 128x128x32), so
 * OpenBLAS pays its threading cost for each. Here the pairs are shared
 * over OpenMP threads, each running single-threaded GEMMs on its own
 * scores buffer, which stays in cache between the two products (64 KiB for
 * 128 x 128). The softmax is that of reduce.c: the row's max subtracted,
 * exp in float32 (mt_vmath.h), the sum in double; a row that is all -inf
 * gives NaN, as there.
 */
#include <cblas.h>
#include <float.h>
#include <math.h>
#include "nn.h"
#include "mt_vmath.h"
#ifdef _OPENMP
#include <omp.h>
#endif

MT_VMAP_LOOP(attn_exp_f32, mt_vexp(x))

int64_t mt_attention_workspace(const mt_attn_geom *g, int nthreads) {
    return (int64_t)(nthreads < 1 ? 1 : nthreads) * g->sq * g->sk * 4;
}

/* One row of scores: += mask row (may be NULL, its step ms3 may be 0), then
 * softmax in place. The max and the NaN check run over MT_VL-lane vectors
 * and the double sum over 8 double lanes, written as GCC vector extensions:
 * written as 8 scalar lanes, GCC kept the max loop scalar (vmaxss, a
 * quarter of the attention kernel's time in MiniLM). The arithmetic is the
 * scalar loop's: the max is exact whatever the lane order (NaN lanes never
 * win a > compare; +0 and -0 give the same x - m and exp), a NaN in the row
 * makes the lanes' x * 0 sums NaN and then m = NaN, and lane l of the sum
 * adds row[l], row[l + 8], row[l + 16], ... in that order, the last chunk
 * padded with zeros. So a row whose last entries are exact zeros after the
 * exp sums to the same double as the row cut before them (lanes gain only
 * + 0.0): what lets attention_kept_keys leave masked keys out.
 * MT_VCLONES (with the AVX-512 clone), as attn_exp_f32: a clone calls its
 * callee's clone of the same target, and the AVX2 one of the 16-lane exp is
 * several times slower. */
typedef double attn_v8d __attribute__((vector_size(64)));
typedef float attn_v8f __attribute__((vector_size(32)));

MT_VCLONES void mt_attention_softmax_row(float *restrict row, const float *restrict mrow, int64_t ms3,
                                         int64_t n) {
    if (mrow) {
        if (ms3 == 1) for (int64_t j = 0; j < n; j++) row[j] += mrow[j];
        else for (int64_t j = 0; j < n; j++) row[j] += mrow[j * ms3];
    }
    mt_vf mx = mt_vsplat(-INFINITY), poison = mt_vsplat(0.f);
    int64_t j = 0;
    for (; j + MT_VL <= n; j += MT_VL) {
        mt_vf x; memcpy(&x, row + j, sizeof x);
        mx = mt_vsel(x > mx, x, mx);
        poison += x * 0.0f;        /* NaN for a NaN (or an infinity: then the exact check below) */
    }
    float m = -INFINITY, pz = 0;
    for (int l = 0; l < MT_VL; l++) { m = mx[l] > m ? mx[l] : m; pz += poison[l]; }
    for (; j < n; j++) { m = row[j] > m ? row[j] : m; pz += row[j] * 0.0f; }
    if (pz != pz)
        for (int64_t i = 0; i < n; i++) if (row[i] != row[i]) { m = NAN; break; }
    for (int64_t i = 0; i < n; i++) row[i] -= m;
    attn_exp_f32(row, row, n);
    attn_v8d acc = {0, 0, 0, 0, 0, 0, 0, 0};
    j = 0;
    for (; j + 8 <= n; j += 8) {
        attn_v8f x; memcpy(&x, row + j, sizeof x);
        acc += __builtin_convertvector(x, attn_v8d);
    }
    if (j < n) {        /* the tail as a chunk padded with zeros: see above */
        attn_v8f x = {0, 0, 0, 0, 0, 0, 0, 0};
        memcpy(&x, row + j, (size_t)(n - j) * sizeof(float));
        acc += __builtin_convertvector(x, attn_v8d);
    }
    double s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    const float inv = (float)(1.0 / s);
    for (int64_t i = 0; i < n; i++) row[i] *= inv;
}

/* The largest |x| over `rows` rows of `n` floats `ld` apart, NaN when one is
 * NaN or infinite (the comparisons below then fail, as they must); MT_VL lanes at a
 * time (a scalar loop with a NaN exit cost as much as the products it was
 * to save). */
static MT_VCLONES float attn_max_abs(const float *x, int64_t rows, int64_t n, int64_t ld) {
    mt_vf mx = mt_vsplat(0.f), nan = mt_vsplat(0.f);
    float m = 0.f, tail_nan = 0.f;
    for (int64_t r = 0; r < rows; r++) {
        const float *row = x + r * ld;
        int64_t j = 0;
        for (; j + MT_VL <= n; j += MT_VL) {
            mt_vf v; memcpy(&v, row + j, sizeof v);
            v = mt_vsel(v < 0.f, -v, v);
            mx = mt_vsel(v > mx, v, mx);
            nan += v * 0.f;            /* NaN for a NaN or an infinity */
        }
        for (; j < n; j++) {
            const float a = fabsf(row[j]);
            m = a > m ? a : m;
            tail_nan += a * 0.f;
        }
    }
    for (int l = 0; l < MT_VL; l++) { m = mx[l] > m ? mx[l] : m; tail_nan += nan[l]; }
    return tail_nan != tail_nan ? NAN : m;
}

/* Keys a (batch, head) pair can leave out, as the count it keeps: keys
 * [kept, sk) whose mask is below the row's largest mask by 2^100 or more (a
 * padding mask: finfo.min or -inf on padded keys, 0 elsewhere). Only for a
 * mask the same for every query (ms[2] == 0: [B, 1, 1, Sk] or [B, H, 1, Sk]),
 * and only when leaving them out changes no bit of the output:
 *  - every score is below 2^96 in magnitude (|scale| * d * max|q| * max|k|,
 *    all finite), so a left-out key's score + mask lies over 2^99 below the
 *    row's max (at least the score + mask of the key holding the largest
 *    mask, which is kept): its exp is exactly 0 (below -103.97);
 *  - the left-out rows of v are finite, so 0 * v adds +0.0 to each output;
 *  - mt_attention_softmax_row sums a row cut after `kept` to the same double
 *    as the whole row (its lanes see only the zeros less), and the second
 *    product's dot over keys loses only 0 * v terms.
 * Anything else (a NaN or infinite mask, scores that large, a non-finite v)
 * keeps every key, as before. The checks read q, k and the left-out v once:
 * 1/(2 Sq) of the products they save. */
static int64_t attention_kept_keys(const float *qp, const float *kp, const float *vp, const float *mp,
                                   const mt_attn_geom *g) {
    const int64_t sk = g->sk;
    if (!mp || g->ms[2] != 0 || sk < 2) return sk;
    const int64_t m3 = g->ms[3];
    float mmax = -INFINITY;
    for (int64_t j = 0; j < sk; j++) {
        const float m = mp[j * m3];
        if (m != m) return sk;
        mmax = m > mmax ? m : mmax;
    }
    if (!isfinite(mmax)) return sk;
    const double below = (double)mmax - 0x1p100;
    int64_t kept = sk;
    while (kept > 1 && (double)mp[(kept - 1) * m3] <= below) kept--;
    if (kept == sk) return sk;
    const double qa = attn_max_abs(qp, g->sq, g->d, g->qs[2]);
    const double ka = attn_max_abs(kp, sk, g->d, g->ks[2]);
    const double bound = fabs((double)g->scale) * (double)g->d * qa * ka;
    if (!(bound < 0x1p96)) return sk;
    if (!(attn_max_abs(vp + kept * g->vs[2], sk - kept, g->dv, g->vs[2]) <= FLT_MAX)) return sk;
    return kept;
}

static void attention_pair(const float *q, const float *k, const float *v, const float *mask, float *out,
                           const mt_attn_geom *g, int64_t p, float *s) {
    const int64_t bi = p / g->h, hi = p % g->h;
    const float *qp = q + bi * g->qs[0] + hi * g->qs[1];
    const float *kp = k + bi * g->ks[0] + hi * g->ks[1];
    const float *vp = v + bi * g->vs[0] + hi * g->vs[1];
    const int dense = g->os[0] == 0 && g->os[1] == 0 && g->os[2] == 0;
    float *op = dense ? out + p * g->sq * g->dv : out + bi * g->os[0] + hi * g->os[1];
    const float *mp = mask ? mask + bi * g->ms[0] + hi * g->ms[1] : NULL;
    const int64_t sk = g->sk, kept = attention_kept_keys(qp, kp, vp, mp, g);
    scipy_cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (blasint)g->sq, (blasint)kept, (blasint)g->d,
                      g->scale, qp, (blasint)g->qs[2], kp, (blasint)g->ks[2], 0.0f, s, (blasint)sk);
    for (int64_t i = 0; i < g->sq; i++) {
        mt_attention_softmax_row(s + i * sk, mp ? mp + i * g->ms[2] : NULL, g->ms[3], kept);
        memset(s + i * sk + kept, 0, (size_t)(sk - kept) * sizeof(float));
    }
    scipy_cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (blasint)g->sq, (blasint)g->dv, (blasint)sk,
                      1.0f, s, (blasint)sk, vp, (blasint)g->vs[2], 0.0f, op,
                      (blasint)(dense ? g->dv : g->os[2]));
}

int mt_attention_f32(const float *q, const float *k, const float *v, const float *mask, float *out,
                     const mt_attn_geom *g, int nthreads, void *workspace) {
    const int64_t pairs = g->b * g->h;
    if (pairs == 0 || g->sq == 0 || g->dv == 0) return 0;
    float *ws = workspace;
    const int nt = nthreads > 1 && pairs > 1 ? (int)mt_min64(nthreads, pairs) : 1;
    if (nt > 1) mt_nn_blas_single_begin();
    #pragma omp parallel for num_threads(nt) schedule(dynamic, 1) if (nt > 1)
    for (int64_t p = 0; p < pairs; p++) {
#ifdef _OPENMP
        float *s = ws + (int64_t)omp_get_thread_num() * g->sq * g->sk;
#else
        float *s = ws;
#endif
        attention_pair(q, k, v, mask, out, g, p, s);
    }
    if (nt > 1) mt_nn_blas_single_end();
    return 0;
}
