/* Fused attention for inference: out = softmax(q k^T * scale + mask) v,
 * one (batch, head) pair at a time.
 *
 * The unfused sequence writes the [Sq, Sk] scores of every pair to memory
 * and reads them back four times (scale, mask, softmax, second product).
 * Here the pairs are shared over OpenMP threads, and each pair runs in
 * blocks of AT_R query rows: their scores, their softmax, their share of
 * the second product, all in the thread's L1 (MiniLM's 128 keys of head
 * size 32: 36 KB a thread with k^T and v packed). The two products are
 * register tiles of AT_R rows by 32 columns over packed operands (k^T
 * with its keys along the vectors, v's rows padded to 16 floats), not
 * BLAS calls: at MiniLM's 96 pairs of 128 x 128 x 32 each single-threaded
 * sgemm call packed its operands again and wrote scores for the softmax
 * to read back (MiniLM 8 x 128's six attention steps at 2 threads: 10.6
 * ms with BLAS, 9.6 ms here; the softmax's exp is now the larger half).
 * Each score is sum_d q[i, d] k[j, d] (one FMA a term, in d order) times
 * the scale, each output sum_j p[i, j] v[j, c] in j order. The softmax
 * is that of reduce.c: the row's max subtracted, exp in float32
 * (mt_vmath.h), the sum in double; a row that is all -inf gives NaN, as
 * there.
 */
#include <float.h>
#include <math.h>
#include "nn.h"
#include "mt_vmath.h"
#ifdef _OPENMP
#include <omp.h>
#endif

#define AT_R 8      /* query rows a block (and a register tile) */
#define AT_C 2      /* 16-float vectors a tile row: 32 keys of scores, or 32 output columns */

static int64_t at_pad16(int64_t n) { return 16 * mt_ceildiv(n, 16); }

/* floats of a thread's buffers: AT_R rows of scores, k^T, the packed v */
static int64_t at_thread_floats(const mt_attn_geom *g) {
    const int64_t lds = at_pad16(g->sk);
    return AT_R * lds + g->d * lds + g->sk * at_pad16(g->dv);
}

int64_t mt_attention_workspace(const mt_attn_geom *g, int nthreads) {
    return (int64_t)(nthreads < 1 ? 1 : nthreads) * at_thread_floats(g) * 4;
}

/* One row of scores: += mask row (may be NULL, its step ms3 may be 0), then
 * softmax in place, in three passes over the row (mask and max; exp and
 * sum; scale). The max and the NaN check run over MT_VL-lane vectors
 * and the double sum over 16 double lanes, written as GCC vector
 * extensions: written as scalar lanes, GCC kept the max loop scalar
 * (vmaxss, a quarter of the attention kernel's time in MiniLM). The max is
 * exact whatever the lane order (NaN lanes never win a > compare; +0 and
 * -0 give the same x - m and exp), a NaN in the row makes the lanes' x * 0
 * sums NaN and then m = NaN, and lane l of the sum adds row[l],
 * row[l + 16], row[l + 32], ... in that order, the last chunk padded with
 * zeros. So a row whose last entries are exact zeros after the exp sums
 * to the same double as the row cut before them (lanes gain only + 0.0):
 * what lets attention_kept_keys leave masked keys out.
 * MT_VCLONES (with the AVX-512 clone): the 16-lane exp inlined into the
 * AVX2 clone is several times slower. */
typedef double attn_v8d __attribute__((vector_size(64)));
typedef float attn_v8f __attribute__((vector_size(32)));

typedef int32_t attn_v8i __attribute__((vector_size(32)));

/* a 16-lane vector's halves, and the lane-wise max of two halves */
MT_VINLINE attn_v8f at_lo8(mt_vf v) { return __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7); }
MT_VINLINE attn_v8f at_hi8(mt_vf v) { return __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15); }
MT_VINLINE attn_v8f at_max8(attn_v8f a, attn_v8f b) {
    const attn_v8i gt = a > b;
    return (attn_v8f)(((attn_v8i)a & gt) | ((attn_v8i)b & ~gt));
}

MT_VCLONES void mt_attention_softmax_row(float *restrict row, const float *restrict mrow, int64_t ms3,
                                         int64_t n) {
    /* pass 1: the mask added, then the max (with the NaN poison) */
    if (mrow) {
        if (ms3 == 1) for (int64_t i = 0; i < n; i++) row[i] += mrow[i];
        else for (int64_t i = 0; i < n; i++) row[i] += mrow[i * ms3];
    }
    mt_vf mx = mt_vsplat(-INFINITY), poison = mt_vsplat(0.f);
    int64_t j = 0;
    for (; j + MT_VL <= n; j += MT_VL) {
        mt_vf x; memcpy(&x, row + j, sizeof x);
        mx = mt_vsel(x > mx, x, mx);
        poison += x * 0.0f;        /* NaN for a NaN (or an infinity: then the exact check below) */
    }
    /* the lanes folded in halves (max is exact in any order; the poison
     * only has to stay NaN): log2(16) steps where a lane-by-lane chain cost
     * ~60 cycles a row, the row's critical path */
    attn_v8f m8 = at_max8(at_lo8(mx), at_hi8(mx)), p8 = at_lo8(poison) + at_hi8(poison);
    float m = -INFINITY, pz = 0;
    for (int l = 0; l < 4; l++) {
        const float a = m8[l] > m8[l + 4] ? m8[l] : m8[l + 4];
        m = a > m ? a : m;
        pz += p8[l] + p8[l + 4];
    }
    for (; j < n; j++) { m = row[j] > m ? row[j] : m; pz += row[j] * 0.0f; }
    if (pz != pz)
        for (int64_t i = 0; i < n; i++) if (row[i] != row[i]) { m = NAN; break; }
    /* pass 2: exp(x - m) stored and summed in double over 16 lanes, two
     * accumulators of 8: element 16k + l into lo's lane l, 16k + 8 + l into
     * hi's (two independent chains; one was 8 cycles of vaddpd latency a
     * vector). The tail is one vector whose lanes past n are zeros after
     * the exp. */
    attn_v8d lo = {0, 0, 0, 0, 0, 0, 0, 0}, hi = lo;
    for (j = 0; j + MT_VL <= n; j += MT_VL) {
        mt_vf x; memcpy(&x, row + j, sizeof x);
        const mt_vf e = mt_vexp(x - m);
        memcpy(row + j, &e, sizeof e);
        lo += __builtin_convertvector(at_lo8(e), attn_v8d);
        hi += __builtin_convertvector(at_hi8(e), attn_v8d);
    }
    if (j < n) {
        mt_vf x = mt_vsplat(0.f);
        memcpy(&x, row + j, (size_t)(n - j) * sizeof(float));
        mt_vf e = mt_vexp(x - m);
        for (int64_t l = n - j; l < MT_VL; l++) e[l] = 0.f;
        memcpy(row + j, &e, (size_t)(n - j) * sizeof(float));
        lo += __builtin_convertvector(at_lo8(e), attn_v8d);
        hi += __builtin_convertvector(at_hi8(e), attn_v8d);
    }
    const attn_v8d acc = lo + hi;
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

typedef mt_v16f_u at_v16;

/* k^T of a pair's first n keys: kt[dd * ldk + j] = k[j][dd], zeros for j in [n, pad16(n)) */
static void at_pack_kt(const float *kp, int64_t ks, int64_t n, int64_t d, float *kt, int64_t ldk) {
    for (int64_t j = 0; j < n; j++)           /* (k's rows read along: the writes stay in L1) */
        for (int64_t dd = 0; dd < d; dd++) kt[dd * ldk + j] = kp[j * ks + dd];
    for (int64_t dd = 0; dd < d; dd++)
        for (int64_t j = n; j < at_pad16(n); j++) kt[dd * ldk + j] = 0.0f;
}

/* v's first n rows, each dv floats and zeros to ldv */
static void at_pack_v(const float *vp, int64_t vs, int64_t n, int64_t dv, float *vk, int64_t ldv) {
    for (int64_t j = 0; j < n; j++) {
        memcpy(vk + j * ldv, vp + j * vs, (size_t)dv * sizeof(float));
        memset(vk + j * ldv + dv, 0, (size_t)(ldv - dv) * sizeof(float));
    }
}

/* acc[r][c] = sum_k a[r * lda + k] b[k * ldb + 16 c ...] over k < K, in k
 * order (one FMA a term): R rows of a by C vectors of b's rows, the
 * register tile of both products (a: q and b: k^T; a: the probabilities
 * and b: the packed v) */
static inline __attribute__((always_inline)) void at_tile(const float *a, int64_t lda, const float *b, int64_t ldb,
                                                       int64_t K, at_v16 acc[AT_R][AT_C], const int R,
                                                       const int C) {
    #pragma GCC unroll 8
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) acc[r][c] = (at_v16){0};
    for (int64_t k = 0; k < K; k++) {
        at_v16 bv[AT_C];
        for (int c = 0; c < C; c++) bv[c] = *(const at_v16 *)(b + k * ldb + 16 * c);
        #pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            const float av = a[r * lda + k];
            for (int c = 0; c < C; c++) acc[r][c] += av * bv[c];
        }
    }
}

/* scores of R query rows (q rows qs apart) by C * 16 keys of kt, times scale, into s (rows lds apart) */
static inline __attribute__((always_inline)) void at_scores_tile(const float *q, int64_t qs, const float *kt,
                                                              int64_t ldk, int64_t d, float scale, float *s,
                                                              int64_t lds, const int R, const int C) {
    at_v16 acc[AT_R][AT_C];
    at_tile(q, qs, kt, ldk, d, acc, R, C);
    #pragma GCC unroll 8
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) *(at_v16 *)(s + r * lds + 16 * c) = acc[r][c] * scale;
}

/* o[r][c] = sum_j p[r][j] vk[j][c] over j < n, for R rows of
 * probabilities (lds apart) and C * 16 columns of vk (rows ldv apart), of
 * which the first `cols` are stored (output rows ldo apart) */
static inline __attribute__((always_inline)) void at_pv_tile(const float *p, int64_t lds, const float *vk,
                                                          int64_t ldv, int64_t n, float *o, int64_t ldo,
                                                          int64_t cols, const int R, const int C) {
    at_v16 acc[AT_R][AT_C];
    at_tile(p, lds, vk, ldv, n, acc, R, C);
    if (cols == 16 * C) {
        #pragma GCC unroll 8
        for (int r = 0; r < R; r++)
            for (int c = 0; c < C; c++) *(at_v16 *)(o + r * ldo + 16 * c) = acc[r][c];
    } else {
        for (int r = 0; r < R; r++) {
            float t[16 * AT_C];
            for (int c = 0; c < C; c++) *(at_v16 *)(t + 16 * c) = acc[r][c];
            memcpy(o + r * ldo, t, (size_t)cols * sizeof(float));
        }
    }
}

/* R (compile-time) query rows of a pair: their scores over the first n
 * keys, softmax, and their output rows */
static inline __attribute__((always_inline)) void at_rows(const float *q, int64_t qs, const float *kt, const float *vk,
                                                       const float *mp, const mt_attn_geom *g, int64_t n, float *s,
                                                       float *o, int64_t ldo, const int R) {
    const int64_t lds = at_pad16(g->sk), ldv = at_pad16(g->dv), n16 = at_pad16(n);
    for (int64_t j = 0; j < n16; j += 16 * AT_C) {
        if (n16 - j >= 16 * AT_C) at_scores_tile(q, qs, kt + j, lds, g->d, g->scale, s + j, lds, R, AT_C);
        else at_scores_tile(q, qs, kt + j, lds, g->d, g->scale, s + j, lds, R, 1);
    }
    for (int r = 0; r < R; r++)
        mt_attention_softmax_row(s + r * lds, mp ? mp + r * g->ms[2] : NULL, g->ms[3], n);
    for (int64_t c = 0; c < g->dv; c += 16 * AT_C) {
        const int64_t cols = mt_min64(16 * AT_C, g->dv - c);
        if (cols > 16) at_pv_tile(s, lds, vk + c, ldv, n, o + c, ldo, cols, R, AT_C);
        else at_pv_tile(s, lds, vk + c, ldv, n, o + c, ldo, cols, R, 1);
    }
}

static MT_VCLONES void attention_pair(const float *q, const float *k, const float *v, const float *mask,
                                      float *out, const mt_attn_geom *g, int64_t p, float *ws) {
    const int64_t bi = p / g->h, hi = p % g->h;
    const float *qp = q + bi * g->qs[0] + hi * g->qs[1];
    const float *kp = k + bi * g->ks[0] + hi * g->ks[1];
    const float *vp = v + bi * g->vs[0] + hi * g->vs[1];
    const int dense = g->os[0] == 0 && g->os[1] == 0 && g->os[2] == 0;
    float *op = dense ? out + p * g->sq * g->dv : out + bi * g->os[0] + hi * g->os[1];
    const int64_t ldo = dense ? g->dv : g->os[2];
    const float *mp = mask ? mask + bi * g->ms[0] + hi * g->ms[1] : NULL;
    const int64_t lds = at_pad16(g->sk), n = attention_kept_keys(qp, kp, vp, mp, g);
    float *s = ws, *kt = s + AT_R * lds, *vk = kt + g->d * lds;
    at_pack_kt(kp, g->ks[2], n, g->d, kt, lds);
    at_pack_v(vp, g->vs[2], n, g->dv, vk, at_pad16(g->dv));
    for (int64_t i = 0; i < g->sq; i += AT_R) {
        const float *qi = qp + i * g->qs[2], *mi = mp ? mp + i * g->ms[2] : NULL;
        float *oi = op + i * ldo;
        switch (mt_min64(AT_R, g->sq - i)) {
        case 8: at_rows(qi, g->qs[2], kt, vk, mi, g, n, s, oi, ldo, 8); break;
        case 7: at_rows(qi, g->qs[2], kt, vk, mi, g, n, s, oi, ldo, 7); break;
        case 6: at_rows(qi, g->qs[2], kt, vk, mi, g, n, s, oi, ldo, 6); break;
        case 5: at_rows(qi, g->qs[2], kt, vk, mi, g, n, s, oi, ldo, 5); break;
        case 4: at_rows(qi, g->qs[2], kt, vk, mi, g, n, s, oi, ldo, 4); break;
        case 3: at_rows(qi, g->qs[2], kt, vk, mi, g, n, s, oi, ldo, 3); break;
        case 2: at_rows(qi, g->qs[2], kt, vk, mi, g, n, s, oi, ldo, 2); break;
        default: at_rows(qi, g->qs[2], kt, vk, mi, g, n, s, oi, ldo, 1); break;
        }
    }
}

int mt_attention_f32(const float *q, const float *k, const float *v, const float *mask, float *out,
                     const mt_attn_geom *g, int nthreads, void *workspace) {
    const int64_t pairs = g->b * g->h;
    if (pairs == 0 || g->sq == 0 || g->dv == 0) return 0;
    float *ws = workspace;
    const int nt = nthreads > 1 && pairs > 1 ? (int)mt_min64(nthreads, pairs) : 1;
    #pragma omp parallel for num_threads(nt) schedule(dynamic, 1) if (nt > 1)
    for (int64_t p = 0; p < pairs; p++) {
#ifdef _OPENMP
        float *mine = ws + (int64_t)omp_get_thread_num() * at_thread_floats(g);
#else
        float *mine = ws;
#endif
        attention_pair(q, k, v, mask, out, g, p, mine);
    }
    return 0;
}
