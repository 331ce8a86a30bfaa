/* Reductions over axes, scans and softmax along one axis.
 *
 * Every op is described by a small set of functions on an accumulator
 * state (init, step, run over a contiguous run, combine, store); the
 * drivers below are generated once per (op, dtype) from those, and walk the
 * geometry that reduce.pyx prepares:
 *   - contiguous runs of the innermost reduced dim go to the op's vectorised
 *     run function (several accumulators; float32 sums are blocked so they
 *     stay accurate, with an AVX2 clone picked at run time on x86-64);
 *   - "rows": when the innermost kept dim is contiguous and the reduced dims
 *     are outer (sum over axis 0 of [N, C]) rows are folded, eight at a
 *     time, into a tile of about 1024 column states;
 *   - anything else walks the reduced dims with byte strides.
 * Work is split over OpenMP threads (num_threads(nt), nt from the caller) by
 * outputs or tiles, or, when there are few of those, by chunks of the
 * reduction with an ordered final combine (so arg-reductions keep the first
 * occurrence), always in one parallel region per call.
 */
#include <stdlib.h>
#include <tgmath.h>
#include "reduce.h"

/* a contiguous block summed in float32 lanes, then added to a double total:
 * each lane adds at most MT_RBLOCK / MT_RLANES = 16 values, which keeps a
 * float32 sum within about 1e-7 relative even for biased data (0.1 repeated) */
#define MT_RBLOCK 512
#define MT_RLANES 32     /* independent accumulators in a contiguous sum */
#define MT_RTILE 256     /* columns per tile in the tiled line paths; the least in the rows path */

/* ---- per-kind types and stores (kind: Kb bool, Ki integer, Kf float; not B/I/F: <complex.h> defines I) ---- */
#define MT_ACC_Kb int64_t          /* sum/prod accumulator */
#define MT_ACC_Ki int64_t
#define MT_ACC_Kf double
#define MT_LANE_Kb(CT) int64_t     /* lanes of a contiguous sum */
#define MT_LANE_Ki(CT) int64_t
#define MT_LANE_Kf(CT) CT          /* float16/bfloat16/float32 lanes in float32 */
#define MT_ISNAN_Kb(x) 0
#define MT_ISNAN_Ki(x) 0
#define MT_ISNAN_Kf(x) ((x) != (x))
/* SUM rule: ints keep their dtype, bool -> int32, floats keep */
#define MT_SUMT_Kb(ST) int32_t
#define MT_SUMT_Ki(ST) ST
#define MT_SUMT_Kf(ST) ST
#define MT_SUMV_Kb(ST, FROM, a) ((int32_t)(a))
#define MT_SUMV_Ki(ST, FROM, a) ((ST)(a))
#define MT_SUMV_Kf(ST, FROM, a) FROM(a)
/* FLOAT rule: floats keep, ints and bool -> float32 */
#define MT_FLTT_Kb(ST) float
#define MT_FLTT_Ki(ST) float
#define MT_FLTT_Kf(ST) ST
#define MT_FLTV_Kb(ST, FROM, v) ((float)(v))
#define MT_FLTV_Ki(ST, FROM, v) ((float)(v))
#define MT_FLTV_Kf(ST, FROM, v) FROM(v)


/* =================================================================== drivers */

/* The reduced dims are walked as an odometer over flat index k: idx[] the
 * digits, p the byte address. mt_red_seek places them at flat index start;
 * mt_red_carry moves them from the end of one innermost run to the start of
 * the next. Shared by every driver's range folds. */
static inline const char *mt_red_seek(const mt_reduce_geom *g, const char *base, int64_t start,
                                      int64_t *idx) {
    const char *p = base;
    for (int d = g->nred - 1; d >= 0; d--) {
        idx[d] = start % g->rshape[d]; start /= g->rshape[d]; p += idx[d] * g->rin[d];
    }
    return p;
}

static inline const char *mt_red_carry(const mt_reduce_geom *g, const char *p, int64_t *idx) {
    const int last = g->nred - 1;
    p -= idx[last] * g->rin[last]; idx[last] = 0;
    for (int d = last - 1; d >= 0; d--) {
        idx[d]++; p += g->rin[d];
        if (idx[d] < g->rshape[d]) break;
        p -= g->rshape[d] * g->rin[d]; idx[d] = 0;
    }
    return p;
}

/* Given NAME_t, NAME_init/step/runc/comb/store, generates NAME(): the
 * mt_reduce_fn for one (op, dtype). */
#define MT_REDUCE_DRIVER(NAME, ST, LOAD)                                       \
/* fold flat indices [start, end) of the reduced dims, run by run */          \
static void NAME##_range(NAME##_t *s, const char *base, const mt_reduce_geom *g, \
                         int64_t start, int64_t end) {                          \
    const int last = g->nred - 1;                                              \
    const int64_t inner = g->rshape[last], st = g->rin[last];                  \
    const int64_t isz = (int64_t)sizeof(ST);                                   \
    if (last == 0) {                                                           \
        const char *p = base + start * st;                                     \
        if (st == isz) NAME##_runc(s, (const ST *)p, end - start, start);      \
        else for (int64_t i = start; i < end; i++, p += st) NAME##_step(s, LOAD(*(const ST *)p), i); \
        return;                                                                \
    }                                                                          \
    int64_t idx[MT_MAX_NDIM];                                                  \
    const char *p = mt_red_seek(g, base, start, idx);                          \
    int64_t pos = start;                                                       \
    while (pos < end) {                                                        \
        int64_t run = mt_min64(inner - idx[last], end - pos);                  \
        if (st == isz) NAME##_runc(s, (const ST *)p, run, pos);                \
        else for (int64_t i = 0; i < run; i++) NAME##_step(s, LOAD(*(const ST *)(p + i * st)), pos + i); \
        pos += run;                                                            \
        if (pos >= end) break;                                                 \
        p = mt_red_carry(g, p, idx);                                           \
    }                                                                          \
}                                                                              \
/* fold rows [start, end) of the reduced dims into w column states, eight */ \
/* rows at a time along the innermost reduced dim (NAME_rows8)            */ \
static MT_RCLONES void NAME##_rows_range(NAME##_t *s, const char *base, const mt_reduce_geom *g, \
                                         int64_t w, int64_t start, int64_t end) { \
    const int last = g->nred - 1;                                              \
    const int64_t inner = g->rshape[last], st = g->rin[last];                  \
    int64_t idx[MT_MAX_NDIM];                                                  \
    const char *p = mt_red_seek(g, base, start, idx);                          \
    int64_t k = start;                                                         \
    while (k < end) {                                                          \
        const int64_t run = mt_min64(inner - idx[last], end - k);              \
        int64_t r = 0;                                                         \
        for (; r + 8 <= run; r += 8) NAME##_rows8(s, p + r * st, st, w, k + r); \
        for (; r < run; r++) {                                                 \
            const ST *row = (const ST *)(p + r * st);                          \
            for (int64_t j = 0; j < w; j++) NAME##_step(&s[j], LOAD(row[j]), k + r); \
        }                                                                      \
        k += run;                                                              \
        if (k >= end) break;                                                   \
        p = mt_red_carry(g, p, idx);                                           \
    }                                                                          \
}                                                                              \
/* columns of a tile: states for about 8 KiB, so they and the eight rows  */ \
/* being folded stay in L1 (4 KiB row pieces: whole pages for the         */ \
/* prefetchers); at least MT_RTILE                                        */ \
static int NAME##_rows(const char *in, char *out, const mt_reduce_geom *g, int nt, \
                       int par, int64_t nout, int64_t nr) {                    \
    const int kl = g->nkeep - 1;                                               \
    const int64_t W = g->kshape[kl], ko = g->kout[kl], isz = (int64_t)sizeof(ST); \
    int64_t tw = (8192 / (int64_t)sizeof(NAME##_t)) & ~(int64_t)15;            \
    if (tw < MT_RTILE) tw = MT_RTILE;                                          \
    if (tw > W) tw = W;                                                        \
    const int64_t ntiles = (W + tw - 1) / tw, units = nout / W * ntiles;       \
    int fail = 0;                                                              \
    if (nt > 1 && units < nt && nr >= 16) {                                    \
        /* fewer tiles than threads: split each tile's rows into nc chunks  */ \
        /* (about nt jobs in all, one parallel region), combine in order    */ \
        int64_t nc = (nt + units - 1) / units;                                 \
        if (nc > nr / 8) nc = nr / 8;                                          \
        const int64_t njobs = units * nc;                                      \
        NAME##_t *parts = (NAME##_t *)malloc(sizeof(NAME##_t) * (size_t)(tw * njobs)); \
        if (!parts) return -1;                                                 \
        _Pragma("omp parallel for num_threads(nt) schedule(static) if(par)")   \
        for (int64_t jb = 0; jb < njobs; jb++) {                               \
            const int64_t u = jb / nc, c = jb % nc;                            \
            const int64_t j0 = (u % ntiles) * tw, w = mt_min64(tw, W - j0);    \
            const int64_t s0 = nr * c / nc, s1 = nr * (c + 1) / nc;            \
            NAME##_t *ps = parts + jb * tw;                                    \
            int64_t a, b;                                                      \
            mt_offsets3(kl, g->kshape, g->kin, g->kout, NULL, u / ntiles, &a, &b, NULL); \
            for (int64_t j = 0; j < w; j++) NAME##_init(&ps[j], s0);           \
            NAME##_rows_range(ps, in + a + j0 * isz, g, w, s0, s1);            \
        }                                                                      \
        for (int64_t u = 0; u < units; u++) {                                  \
            const int64_t j0 = (u % ntiles) * tw, w = mt_min64(tw, W - j0);    \
            NAME##_t *p0 = parts + u * nc * tw;                                \
            int64_t a, b;                                                      \
            for (int64_t c = 1; c < nc; c++)                                   \
                for (int64_t j = 0; j < w; j++) NAME##_comb(&p0[j], &p0[c * tw + j]); \
            mt_offsets3(kl, g->kshape, g->kin, g->kout, NULL, u / ntiles, &a, &b, NULL); \
            for (int64_t j = 0; j < w; j++) NAME##_store(out + b + (j0 + j) * ko, &p0[j], g); \
        }                                                                      \
        free(parts);                                                           \
        return 0;                                                              \
    }                                                                          \
    _Pragma("omp parallel num_threads(nt) if(par)")                            \
    {                                                                          \
        NAME##_t *s = (NAME##_t *)malloc(sizeof(NAME##_t) * (size_t)tw);       \
        if (!s) {                                                              \
            _Pragma("omp atomic write")                                        \
            fail = 1;                                                          \
        }                                                                      \
        _Pragma("omp for schedule(static)")                                    \
        for (int64_t u = 0; u < units; u++) {                                  \
            if (!s) continue;                                                  \
            const int64_t j0 = (u % ntiles) * tw, w = mt_min64(tw, W - j0);    \
            int64_t a, b;                                                      \
            mt_offsets3(kl, g->kshape, g->kin, g->kout, NULL, u / ntiles, &a, &b, NULL); \
            for (int64_t j = 0; j < w; j++) NAME##_init(&s[j], 0);             \
            NAME##_rows_range(s, in + a + j0 * isz, g, w, 0, nr);              \
            for (int64_t j = 0; j < w; j++) NAME##_store(out + b + (j0 + j) * ko, &s[j], g); \
        }                                                                      \
        free(s);                                                               \
    }                                                                          \
    return fail ? -1 : 0;                                                      \
}                                                                              \
static int NAME(const char *in, char *out, const mt_reduce_geom *g, int nt) {  \
    int64_t nout = 1, nr = 1;                                                  \
    const int64_t isz = (int64_t)sizeof(ST);                                   \
    for (int d = 0; d < g->nkeep; d++) nout *= g->kshape[d];                   \
    for (int d = 0; d < g->nred; d++) nr *= g->rshape[d];                      \
    if (nout == 0 || nr == 0) return 0;                                        \
    if (nt < 1 || nout * nr < MT_RGRAIN) nt = 1;                               \
    /* nt picks the split (and order), par whether a team runs it */           \
    const int par = nt > 1 && nout * nr >= MT_RPAR_GRAIN;                      \
    if (g->nkeep > 0 && g->kin[g->nkeep - 1] == isz && g->rin[g->nred - 1] != isz) \
        return NAME##_rows(in, out, g, nt, par, nout, nr);                     \
    if (nt > 1 && nout < 8 * nt && nr >= 64 * nt) {                            \
        /* few outputs, long reductions: chunks of each, combined in order */ \
        const int64_t nj = nout * nt;                                          \
        NAME##_t *parts = (NAME##_t *)malloc(sizeof(NAME##_t) * (size_t)nj);  \
        if (!parts) return -1;                                                 \
        _Pragma("omp parallel for num_threads(nt) schedule(static) if(par)")   \
        for (int64_t j = 0; j < nj; j++) {                                     \
            const int64_t o = j / nt, c = j % nt;                              \
            /* chunk bounds on 16-element boundaries: whole cache lines */    \
            const int64_t s0 = (nr * c / nt) & ~(int64_t)15;                   \
            const int64_t s1 = c == nt - 1 ? nr : (nr * (c + 1) / nt) & ~(int64_t)15; \
            int64_t a, b;                                                      \
            mt_offsets3(g->nkeep, g->kshape, g->kin, g->kout, NULL, o, &a, &b, NULL); \
            NAME##_init(&parts[j], s0);                                        \
            NAME##_range(&parts[j], in + a, g, s0, s1);                        \
        }                                                                      \
        for (int64_t o = 0; o < nout; o++) {                                   \
            int64_t a, b;                                                      \
            for (int c = 1; c < nt; c++) NAME##_comb(&parts[o * nt], &parts[o * nt + c]); \
            mt_offsets3(g->nkeep, g->kshape, g->kin, g->kout, NULL, o, &a, &b, NULL); \
            NAME##_store(out + b, &parts[o * nt], g);                          \
        }                                                                      \
        free(parts);                                                           \
        return 0;                                                              \
    }                                                                          \
    _Pragma("omp parallel for num_threads(nt) schedule(static) if(par)")       \
    for (int64_t o = 0; o < nout; o++) {                                       \
        int64_t a, b;                                                          \
        NAME##_t s;                                                            \
        mt_offsets3(g->nkeep, g->kshape, g->kin, g->kout, NULL, o, &a, &b, NULL); \
        NAME##_init(&s, 0);                                                    \
        NAME##_range(&s, in + a, g, 0, nr);                                    \
        NAME##_store(out + b, &s, g);                                          \
    }                                                                          \
    return 0;                                                                  \
}

/* =================================================================== ops */

/* NAME_rows8(s, row0, row stride, w, k): fold rows k..k+7 into w states.
 * The default is eight sequential steps; sums add the eight pairwise in
 * their accumulator type first (a quarter of the state traffic). */
#define MT_ROWS8_SEQ(NAME, ST, LOAD)                                           \
static inline void NAME##_rows8(NAME##_t *s, const char *r0, int64_t st, int64_t w, int64_t k) { \
    for (int r = 0; r < 8; r++) {                                              \
        const ST *row = (const ST *)(r0 + r * st);                             \
        for (int64_t j = 0; j < w; j++) NAME##_step(&s[j], LOAD(row[j]), k + r); \
    }                                                                          \
}

/* sum and mean: contiguous runs in blocks of MT_RBLOCK summed in MT_RLANES
 * lanes (float32 lanes for the 16/32-bit floats), each block total added to
 * the accumulator (double for floats): accurate to about 1e-7 relative, and
 * vectorised. sum of ints accumulates in int64 (exact, wraps like NumPy's
 * int64 sum); mean always in double (its result is a float, and an int64
 * accumulator could overflow). */
#define MT_STORE_SUM(o, v, g, ST, FROM, KIND) (*(MT_SUMT_##KIND(ST) *)(o) = MT_SUMV_##KIND(ST, FROM, v))
#define MT_STORE_MEAN(o, v, g, ST, FROM, KIND) \
    (*(MT_FLTT_##KIND(ST) *)(o) = MT_FLTV_##KIND(ST, FROM, (double)(v) / (double)(g)->count))
#define MT_GEN_SUMLIKE(NAME, ST, CT, LOAD, FROM, KIND, STORE, ACC, LANE)       \
typedef struct { ACC acc; } NAME##_t;                                \
static inline void NAME##_init(NAME##_t *s, int64_t i0) { (void)i0; s->acc = 0; } \
static inline void NAME##_step(NAME##_t *s, CT x, int64_t i) { (void)i; s->acc += x; } \
static inline void NAME##_comb(NAME##_t *a, const NAME##_t *b) { a->acc += b->acc; } \
static MT_RCLONES void NAME##_runc(NAME##_t *s, const ST *p, int64_t n, int64_t i0) { \
    (void)i0;                                                                  \
    ACC total = 0;                                                             \
    while (n > 0) {                                                            \
        const int64_t m = mt_min64(n, MT_RBLOCK);                              \
        LANE acc[MT_RLANES] = {0};                                             \
        int64_t i = 0;                                                         \
        for (; i + MT_RLANES <= m; i += MT_RLANES)                             \
            for (int k = 0; k < MT_RLANES; k++) acc[k] += LOAD(p[i + k]);      \
        ACC t = 0;                                                             \
        for (; i < m; i++) t += LOAD(p[i]);                                    \
        for (int k = 0; k < MT_RLANES; k++) t += acc[k];                       \
        total += t; p += m; n -= m;                                            \
    }                                                                          \
    s->acc += total;                                                           \
}                                                                              \
static inline void NAME##_store(char *o, const NAME##_t *s, const mt_reduce_geom *g) { \
    (void)g; STORE(o, s->acc, g, ST, FROM, KIND);                              \
}                                                                              \
static inline void NAME##_rows8(NAME##_t *restrict s, const char *r0, int64_t st, int64_t w, \
                                int64_t k) {                                   \
    (void)k;                                                                   \
    const ST *restrict q0 = (const ST *)r0, *restrict q1 = (const ST *)(r0 + st); \
    const ST *restrict q2 = (const ST *)(r0 + 2 * st), *restrict q3 = (const ST *)(r0 + 3 * st); \
    const ST *restrict q4 = (const ST *)(r0 + 4 * st), *restrict q5 = (const ST *)(r0 + 5 * st); \
    const ST *restrict q6 = (const ST *)(r0 + 6 * st), *restrict q7 = (const ST *)(r0 + 7 * st); \
    for (int64_t j = 0; j < w; j++) {                                          \
        ACC a = ((ACC)LOAD(q0[j]) + (ACC)LOAD(q1[j])) + ((ACC)LOAD(q2[j]) + (ACC)LOAD(q3[j])); \
        ACC b = ((ACC)LOAD(q4[j]) + (ACC)LOAD(q5[j])) + ((ACC)LOAD(q6[j]) + (ACC)LOAD(q7[j])); \
        s[j].acc += a + b;                                                     \
    }                                                                          \
}                                                                              \
MT_REDUCE_DRIVER(NAME, ST, LOAD)
#define MT_MLANE_Kb(CT) double
#define MT_MLANE_Ki(CT) double
#define MT_MLANE_Kf(CT) CT
#define MT_GEN_SUM(code, sfx, ST, CT, LOAD, FROM, KIND, LO, HI, _) \
    MT_GEN_SUMLIKE(r_sum_##sfx, ST, CT, LOAD, FROM, KIND, MT_STORE_SUM, MT_ACC_##KIND, MT_LANE_##KIND(CT))
#define MT_GEN_MEAN(code, sfx, ST, CT, LOAD, FROM, KIND, LO, HI, _) \
    MT_GEN_SUMLIKE(r_mean_##sfx, ST, CT, LOAD, FROM, KIND, MT_STORE_MEAN, double, MT_MLANE_##KIND(CT))

/* prod: int64 (wrapping, as NumPy's int64 product) or double accumulator */
#define MT_GEN_PROD(code, sfx, ST, CT, LOAD, FROM, KIND, LO, HI, _)            \
typedef struct { MT_ACC_##KIND acc; } r_prod_##sfx##_t;                         \
static inline void r_prod_##sfx##_init(r_prod_##sfx##_t *s, int64_t i0) { (void)i0; s->acc = 1; } \
static inline void r_prod_##sfx##_step(r_prod_##sfx##_t *s, CT x, int64_t i) { (void)i; s->acc *= x; } \
static inline void r_prod_##sfx##_comb(r_prod_##sfx##_t *a, const r_prod_##sfx##_t *b) { a->acc *= b->acc; } \
static MT_RCLONES void r_prod_##sfx##_runc(r_prod_##sfx##_t *s, const ST *p, int64_t n, int64_t i0) { \
    (void)i0;                                                                  \
    MT_ACC_##KIND acc[8] = {1, 1, 1, 1, 1, 1, 1, 1};                           \
    int64_t i = 0;                                                             \
    for (; i + 8 <= n; i += 8)                                                 \
        for (int k = 0; k < 8; k++) acc[k] *= LOAD(p[i + k]);                  \
    for (; i < n; i++) acc[0] *= LOAD(p[i]);                                   \
    for (int k = 0; k < 8; k++) s->acc *= acc[k];                              \
}                                                                              \
static inline void r_prod_##sfx##_store(char *o, const r_prod_##sfx##_t *s, const mt_reduce_geom *g) { \
    (void)g; MT_STORE_SUM(o, s->acc, g, ST, FROM, KIND);                       \
}                                                                              \
MT_ROWS8_SEQ(r_prod_##sfx, ST, LOAD)                                          \
MT_REDUCE_DRIVER(r_prod_##sfx, ST, LOAD)

/* max and min: NaN propagates (once the state is NaN it stays NaN), as in
 * NumPy. The extreme of a contiguous block (shared with argmax/argmin) uses
 * GCC/Clang vector extensions on the dtypes stored in their compute type:
 * 16-byte vectors, four accumulators, a NaN mask on the side; bool and the
 * 16-bit floats go through scalar lanes (they need a conversion per load). */
#define MT_VNAN_Kb(T) ((T)0)
#define MT_VNAN_Ki(T) ((T)0)
#define MT_VNAN_Kf(T) ((T)NAN)
#define MT_PICK_LO(lo, hi) lo
#define MT_PICK_HI(lo, hi) hi
#define MT_GEN_EXT_VEC(code, sfx, ST, CT, LOAD, FROM, KIND, LO, HI, OPN, CMP, PICK) \
static MT_RCLONES CT r_ext_##OPN##_##sfx(const ST *p, int64_t n) {             \
    typedef CT V __attribute__((vector_size(16)));                             \
    enum { L = 16 / sizeof(CT) };                                              \
    V m0, m1, m2, m3, x0, x1, x2, x3;                                          \
    for (int k = 0; k < L; k++) m0[k] = PICK(LO, HI);                          \
    m1 = m2 = m3 = m0;                                                         \
    __typeof__(m0 != m0) nan = m0 != m0;                                       \
    typedef __typeof__(nan) M;                                                 \
    int64_t i = 0;                                                             \
    for (; i + 4 * L <= n; i += 4 * L) {                                       \
        memcpy(&x0, p + i, 16); memcpy(&x1, p + i + L, 16);                    \
        memcpy(&x2, p + i + 2 * L, 16); memcpy(&x3, p + i + 3 * L, 16);        \
        M g0 = x0 CMP m0, g1 = x1 CMP m1, g2 = x2 CMP m2, g3 = x3 CMP m3;      \
        m0 = (V)((g0 & (M)x0) | (~g0 & (M)m0));                                \
        m1 = (V)((g1 & (M)x1) | (~g1 & (M)m1));                                \
        m2 = (V)((g2 & (M)x2) | (~g2 & (M)m2));                                \
        m3 = (V)((g3 & (M)x3) | (~g3 & (M)m3));                                \
        nan |= (x0 != x0) | (x1 != x1) | (x2 != x2) | (x3 != x3);              \
    }                                                                          \
    CT r = PICK(LO, HI);                                                       \
    int any = 0;                                                               \
    for (int k = 0; k < L; k++) {                                              \
        if (m0[k] CMP r) r = m0[k];                                            \
        if (m1[k] CMP r) r = m1[k];                                            \
        if (m2[k] CMP r) r = m2[k];                                            \
        if (m3[k] CMP r) r = m3[k];                                            \
        any |= nan[k] != 0;                                                    \
    }                                                                          \
    if (any) return MT_VNAN_##KIND(CT);                                        \
    for (; i < n; i++) { CT x = p[i]; if (x CMP r || MT_ISNAN_##KIND(x)) r = x; } \
    return r;                                                                  \
}
#define MT_GEN_EXT_SCALAR(code, sfx, ST, CT, LOAD, FROM, KIND, LO, HI, OPN, CMP, PICK) \
static MT_RCLONES CT r_ext_##OPN##_##sfx(const ST *p, int64_t n) {             \
    CT m[16];                                                                  \
    for (int k = 0; k < 16; k++) m[k] = PICK(LO, HI);                          \
    int64_t i = 0;                                                             \
    for (; i + 16 <= n; i += 16)                                               \
        for (int k = 0; k < 16; k++) {                                         \
            CT x = LOAD(p[i + k]);                                             \
            m[k] = (x CMP m[k] || MT_ISNAN_##KIND(x)) ? x : m[k];              \
        }                                                                      \
    CT r = PICK(LO, HI);                                                       \
    for (; i < n; i++) { CT x = LOAD(p[i]); if (x CMP r || MT_ISNAN_##KIND(x)) r = x; } \
    for (int k = 0; k < 16; k++) if (m[k] CMP r || MT_ISNAN_##KIND(m[k])) r = m[k]; \
    return r;                                                                  \
}
MT_RDT_NATIVE(MT_GEN_EXT_VEC, max, >, MT_PICK_LO)
MT_RDT_NATIVE(MT_GEN_EXT_VEC, min, <, MT_PICK_HI)
MT_RDT_CONVERTED(MT_GEN_EXT_SCALAR, max, >, MT_PICK_LO)
MT_RDT_CONVERTED(MT_GEN_EXT_SCALAR, min, <, MT_PICK_HI)

#define MT_GEN_EXTREME(code, sfx, ST, CT, LOAD, FROM, KIND, LO, HI, OPN, CMP, ID) \
typedef struct { CT v; } r_##OPN##_##sfx##_t;                                  \
static inline void r_##OPN##_##sfx##_init(r_##OPN##_##sfx##_t *s, int64_t i0) { (void)i0; s->v = ID; } \
static inline void r_##OPN##_##sfx##_step(r_##OPN##_##sfx##_t *s, CT x, int64_t i) { \
    (void)i; if (x CMP s->v || MT_ISNAN_##KIND(x)) s->v = x;                   \
}                                                                              \
static inline void r_##OPN##_##sfx##_comb(r_##OPN##_##sfx##_t *a, const r_##OPN##_##sfx##_t *b) { \
    r_##OPN##_##sfx##_step(a, b->v, 0);                                        \
}                                                                              \
static inline void r_##OPN##_##sfx##_runc(r_##OPN##_##sfx##_t *s, const ST *p, int64_t n, int64_t i0) { \
    (void)i0; r_##OPN##_##sfx##_step(s, r_ext_##OPN##_##sfx(p, n), 0);         \
}                                                                              \
static inline void r_##OPN##_##sfx##_store(char *o, const r_##OPN##_##sfx##_t *s, const mt_reduce_geom *g) { \
    (void)g; *(ST *)o = FROM(s->v);                                            \
}                                                                              \
MT_ROWS8_SEQ(r_##OPN##_##sfx, ST, LOAD)                                       \
MT_REDUCE_DRIVER(r_##OPN##_##sfx, ST, LOAD)

/* argmax and argmin: first occurrence; a NaN beats any number and the first
 * NaN wins (NumPy). Contiguous runs: the block extreme first (vectorised),
 * then a scan for its first position only when it improves the state. */
#define MT_ARG_BETTER(KIND, CMP, x, v) ((x) CMP (v) || (MT_ISNAN_##KIND(x) && !MT_ISNAN_##KIND(v)))
#define MT_GEN_ARG(code, sfx, ST, CT, LOAD, FROM, KIND, LO, HI, OPN, EXT, CMP, ID) \
typedef struct { CT v; int64_t i; } r_##OPN##_##sfx##_t;                       \
static inline void r_##OPN##_##sfx##_init(r_##OPN##_##sfx##_t *s, int64_t i0) { s->v = ID; s->i = i0; } \
static inline void r_##OPN##_##sfx##_step(r_##OPN##_##sfx##_t *s, CT x, int64_t i) { \
    if (MT_ARG_BETTER(KIND, CMP, x, s->v)) { s->v = x; s->i = i; }            \
}                                                                              \
static inline void r_##OPN##_##sfx##_comb(r_##OPN##_##sfx##_t *a, const r_##OPN##_##sfx##_t *b) { \
    if (MT_ARG_BETTER(KIND, CMP, b->v, a->v)) *a = *b;                         \
}                                                                              \
static void r_##OPN##_##sfx##_runc(r_##OPN##_##sfx##_t *s, const ST *p, int64_t n, int64_t i0) { \
    for (int64_t b0 = 0; b0 < n; b0 += 1024) {                                 \
        const int64_t m = mt_min64(n - b0, 1024);                              \
        const CT e = r_ext_##EXT##_##sfx(p + b0, m);                           \
        if (!MT_ARG_BETTER(KIND, CMP, e, s->v)) continue;                      \
        for (int64_t j = 0; j < m; j++) {                                      \
            CT x = LOAD(p[b0 + j]);                                            \
            if (x == e || (MT_ISNAN_##KIND(e) && MT_ISNAN_##KIND(x))) { s->v = x; s->i = i0 + b0 + j; break; } \
        }                                                                      \
    }                                                                          \
}                                                                              \
static inline void r_##OPN##_##sfx##_store(char *o, const r_##OPN##_##sfx##_t *s, const mt_reduce_geom *g) { \
    (void)g; *(int32_t *)o = (int32_t)s->i;                                    \
}                                                                              \
MT_ROWS8_SEQ(r_##OPN##_##sfx, ST, LOAD)                                       \
MT_REDUCE_DRIVER(r_##OPN##_##sfx, ST, LOAD)

/* any and all: nonzero test (NaN is nonzero); contiguous runs stop early */
#define MT_GEN_LOGIC(code, sfx, ST, CT, LOAD, FROM, KIND, LO, HI, OPN, OP, INIT, STOP) \
typedef struct { int v; } r_##OPN##_##sfx##_t;                                 \
static inline void r_##OPN##_##sfx##_init(r_##OPN##_##sfx##_t *s, int64_t i0) { (void)i0; s->v = INIT; } \
static inline void r_##OPN##_##sfx##_step(r_##OPN##_##sfx##_t *s, CT x, int64_t i) { \
    (void)i; s->v OP (x != 0);                                                 \
}                                                                              \
static inline void r_##OPN##_##sfx##_comb(r_##OPN##_##sfx##_t *a, const r_##OPN##_##sfx##_t *b) { a->v OP b->v; } \
static MT_RCLONES void r_##OPN##_##sfx##_runc(r_##OPN##_##sfx##_t *s, const ST *p, int64_t n, int64_t i0) { \
    (void)i0;                                                                  \
    for (int64_t b0 = 0; b0 < n && s->v != STOP; b0 += 512) {                  \
        const int64_t m = mt_min64(n - b0, 512);                               \
        int t = INIT;                                                          \
        for (int64_t j = 0; j < m; j++) t OP (LOAD(p[b0 + j]) != 0);           \
        s->v OP t;                                                             \
    }                                                                          \
}                                                                              \
static inline void r_##OPN##_##sfx##_store(char *o, const r_##OPN##_##sfx##_t *s, const mt_reduce_geom *g) { \
    (void)g; *(uint8_t *)o = (uint8_t)(s->v != 0);                             \
}                                                                              \
MT_ROWS8_SEQ(r_##OPN##_##sfx, ST, LOAD)                                       \
MT_REDUCE_DRIVER(r_##OPN##_##sfx, ST, LOAD)

/* var and std: (count, mean, M2) in double. Elements one at a time update
 * by Welford; contiguous blocks take two passes (block mean, then squared
 * deviations) and states merge by Chan et al.'s formula, so a chunked or
 * tiled reduction gives the same accuracy as a serial two-pass one. */
typedef struct { double n, mean, m2; } mt_moments;
static inline void mt_mom_step(mt_moments *s, double x) {
    s->n += 1;
    double d = x - s->mean;
    s->mean += d / s->n;
    s->m2 += d * (x - s->mean);
}
static inline void mt_mom_comb(mt_moments *a, const mt_moments *b) {
    if (b->n == 0) return;
    if (a->n == 0) { *a = *b; return; }
    double n = a->n + b->n, d = b->mean - a->mean;
    a->mean += d * (b->n / n);
    a->m2 += b->m2 + d * d * (a->n * (b->n / n));
    a->n = n;
}
static inline double mt_mom_var(const mt_moments *s, const mt_reduce_geom *g) {
    double div = (double)g->count - g->ddof;
    double v = s->m2 / (div > 0 ? div : 0);  /* NumPy: max(count - ddof, 0) */
    return v < 0 ? 0 : v;                    /* (NaN passes through) */
}
#define MT_GEN_MOMENT(code, sfx, ST, CT, LOAD, FROM, KIND, LO, HI, OPN, FIN)    \
typedef mt_moments r_##OPN##_##sfx##_t;                                        \
static inline void r_##OPN##_##sfx##_init(mt_moments *s, int64_t i0) { (void)i0; s->n = s->mean = s->m2 = 0; } \
static inline void r_##OPN##_##sfx##_step(mt_moments *s, CT x, int64_t i) { (void)i; mt_mom_step(s, (double)x); } \
static inline void r_##OPN##_##sfx##_comb(mt_moments *a, const mt_moments *b) { mt_mom_comb(a, b); } \
static MT_RCLONES void r_##OPN##_##sfx##_runc(mt_moments *s, const ST *p, int64_t n, int64_t i0) { \
    (void)i0;                                                                  \
    for (int64_t b0 = 0; b0 < n; b0 += 1024) {                                 \
        const int64_t m = mt_min64(n - b0, 1024);                              \
        double acc[8] = {0}, t = 0;                                            \
        int64_t j = 0;                                                         \
        for (; j + 8 <= m; j += 8) for (int k = 0; k < 8; k++) acc[k] += (double)LOAD(p[b0 + j + k]); \
        for (; j < m; j++) t += (double)LOAD(p[b0 + j]);                       \
        for (int k = 0; k < 8; k++) t += acc[k];                               \
        mt_moments blk = {(double)m, t / (double)m, 0};                        \
        double q[8] = {0}, r = 0;                                              \
        for (j = 0; j + 8 <= m; j += 8)                                        \
            for (int k = 0; k < 8; k++) { double d = (double)LOAD(p[b0 + j + k]) - blk.mean; q[k] += d * d; } \
        for (; j < m; j++) { double d = (double)LOAD(p[b0 + j]) - blk.mean; r += d * d; } \
        for (int k = 0; k < 8; k++) r += q[k];                                 \
        blk.m2 = r;                                                            \
        mt_mom_comb(s, &blk);                                                  \
    }                                                                          \
}                                                                              \
static inline void r_##OPN##_##sfx##_store(char *o, const mt_moments *s, const mt_reduce_geom *g) { \
    *(MT_FLTT_##KIND(ST) *)o = MT_FLTV_##KIND(ST, FROM, FIN(mt_mom_var(s, g)));  \
}                                                                              \
MT_ROWS8_SEQ(r_##OPN##_##sfx, ST, LOAD)                                       \
MT_REDUCE_DRIVER(r_##OPN##_##sfx, ST, LOAD)
#define MT_VAR_FIN(v) (v)
#define MT_STD_FIN(v) sqrt(v)

/* ---- instantiation, every dtype ---- */
#define MT_GEN_MAX(code, sfx, ST, CT, LOAD, FROM, KIND, LO, HI, _) \
    MT_GEN_EXTREME(code, sfx, ST, CT, LOAD, FROM, KIND, LO, HI, max, >, LO)
#define MT_GEN_MIN(code, sfx, ST, CT, LOAD, FROM, KIND, LO, HI, _) \
    MT_GEN_EXTREME(code, sfx, ST, CT, LOAD, FROM, KIND, LO, HI, min, <, HI)
#define MT_GEN_ARGMAX(code, sfx, ST, CT, LOAD, FROM, KIND, LO, HI, _) \
    MT_GEN_ARG(code, sfx, ST, CT, LOAD, FROM, KIND, LO, HI, argmax, max, >, LO)
#define MT_GEN_ARGMIN(code, sfx, ST, CT, LOAD, FROM, KIND, LO, HI, _) \
    MT_GEN_ARG(code, sfx, ST, CT, LOAD, FROM, KIND, LO, HI, argmin, min, <, HI)
#define MT_GEN_ANY(code, sfx, ST, CT, LOAD, FROM, KIND, LO, HI, _) \
    MT_GEN_LOGIC(code, sfx, ST, CT, LOAD, FROM, KIND, LO, HI, any, |=, 0, 1)
#define MT_GEN_ALL(code, sfx, ST, CT, LOAD, FROM, KIND, LO, HI, _) \
    MT_GEN_LOGIC(code, sfx, ST, CT, LOAD, FROM, KIND, LO, HI, all, &=, 1, 0)
#define MT_GEN_VAR(code, sfx, ST, CT, LOAD, FROM, KIND, LO, HI, _) \
    MT_GEN_MOMENT(code, sfx, ST, CT, LOAD, FROM, KIND, LO, HI, var, MT_VAR_FIN)
#define MT_GEN_STD(code, sfx, ST, CT, LOAD, FROM, KIND, LO, HI, _) \
    MT_GEN_MOMENT(code, sfx, ST, CT, LOAD, FROM, KIND, LO, HI, std, MT_STD_FIN)

MT_RDT_ALL(MT_GEN_SUM, 0)
MT_RDT_ALL(MT_GEN_PROD, 0)
MT_RDT_ALL(MT_GEN_MEAN, 0)
MT_RDT_ALL(MT_GEN_VAR, 0)
MT_RDT_ALL(MT_GEN_STD, 0)
MT_RDT_ALL(MT_GEN_MAX, 0)
MT_RDT_ALL(MT_GEN_MIN, 0)
MT_RDT_ALL(MT_GEN_ARGMAX, 0)
MT_RDT_ALL(MT_GEN_ARGMIN, 0)
MT_RDT_ALL(MT_GEN_ANY, 0)
MT_RDT_ALL(MT_GEN_ALL, 0)

/* =================================================================== line ops */

/* Given NAME_block (w columns of the axis at once), generates NAME(): the
 * mt_line_fn. When the innermost outer dim is contiguous in the input and
 * the axis is not, it becomes the column tile (softmax over axis 1 of NCHW
 * reads whole rows); otherwise every line is a tile of one. */
#define MT_LINE_DRIVER(NAME, ST, COST)                                         \
static int NAME(const char *in, char *out, const mt_line_geom *g, int nt) {    \
    int64_t nlines = 1;                                                        \
    const int64_t isz = (int64_t)sizeof(ST);                                   \
    for (int d = 0; d < g->nouter; d++) nlines *= g->oshape[d];                \
    if (nlines == 0 || g->len == 0) return 0;                                  \
    if (nt < 1 || nlines * g->len * (COST) < MT_RGRAIN) nt = 1;                \
    const int par = nt > 1 && nlines * g->len * (COST) >= MT_RPAR_GRAIN;       \
    const int tiled = g->nouter > 0 && g->oin[g->nouter - 1] == isz && g->ain != isz; \
    const int nd = tiled ? g->nouter - 1 : g->nouter;                          \
    const int64_t W = tiled ? g->oshape[nd] : 1;                               \
    const int64_t cin = tiled ? g->oin[nd] : 0, cout = tiled ? g->oout[nd] : 0; \
    const int64_t ntiles = (W + MT_RTILE - 1) / MT_RTILE, units = nlines / W * ntiles; \
    _Pragma("omp parallel for num_threads(nt) schedule(static) if(par)")       \
    for (int64_t u = 0; u < units; u++) {                                      \
        const int64_t j0 = (u % ntiles) * MT_RTILE, w = mt_min64(MT_RTILE, W - j0); \
        int64_t a, b;                                                          \
        mt_offsets3(nd, g->oshape, g->oin, g->oout, NULL, u / ntiles, &a, &b, NULL); \
        NAME##_block(in + a + j0 * cin, out + b + j0 * cout, g, w, cin, cout); \
    }                                                                          \
    return 0;                                                                  \
}

/* cumsum and cumprod: SUM rule, int64 or double running accumulator */
#define MT_GEN_SCAN(code, sfx, ST, CT, LOAD, FROM, KIND, LO, HI, OPN, OP, INIT) \
static void l_##OPN##_##sfx##_block(const char *p, char *q, const mt_line_geom *g, \
                                    int64_t w, int64_t cin, int64_t cout) {    \
    MT_ACC_##KIND acc[MT_RTILE];                                               \
    for (int64_t j = 0; j < w; j++) acc[j] = INIT;                             \
    for (int64_t l = 0; l < g->len; l++) {                                     \
        const char *r = p + l * g->ain;                                        \
        char *o = q + l * g->aout;                                             \
        for (int64_t j = 0; j < w; j++) {                                      \
            acc[j] OP LOAD(*(const ST *)(r + j * cin));                        \
            *(MT_SUMT_##KIND(ST) *)(o + j * cout) = MT_SUMV_##KIND(ST, FROM, acc[j]); \
        }                                                                      \
    }                                                                          \
}                                                                              \
MT_LINE_DRIVER(l_##OPN##_##sfx, ST, 1)
#define MT_GEN_CUMSUM(code, sfx, ST, CT, LOAD, FROM, KIND, LO, HI, _) \
    MT_GEN_SCAN(code, sfx, ST, CT, LOAD, FROM, KIND, LO, HI, cumsum, +=, 0)
#define MT_GEN_CUMPROD(code, sfx, ST, CT, LOAD, FROM, KIND, LO, HI, _) \
    MT_GEN_SCAN(code, sfx, ST, CT, LOAD, FROM, KIND, LO, HI, cumprod, *=, 1)
MT_RDT_ALL(MT_GEN_CUMSUM, 0)
MT_RDT_ALL(MT_GEN_CUMPROD, 0)

/* softmax and log_softmax (float dtypes; reduce.pyx casts ints to float32):
 * subtract the max, exp in the compute type, sum in double. A NaN in a line
 * makes the whole line NaN.
 *
 * float16, bfloat16 and float32 take a vectorised path: pieces of a line
 * (or of MT_RTILE columns) are converted to float32, the max and exp run on
 * 16-byte vectors (mt_expf4 below), the sums in double. float64 uses libm. */
/* mt_v4f, mt_v4i, mt_v4u: mt_simd.h's */
#define MT_BLEND4(m, a, b) ((mt_v4f)(((m) & (mt_v4i)(a)) | (~(m) & (mt_v4i)(b))))
/* exp of four floats: Cody-Waite reduction by ln 2, Cephes' degree-6
 * polynomial, 2^n through the exponent bits. Relative error < 1 ulp for
 * x <= 88 (softmax only feeds x - max <= 0); x > 88 gives inf, x below
 * -87.34 gives 0 (no subnormal results), NaN stays NaN. Written with vector
 * extensions because GCC will not if-convert float compares by itself
 * under the default -ftrapping-math. */
static inline mt_v4f mt_expf4(mt_v4f x) {
    const mt_v4f lo = {-87.33654f, -87.33654f, -87.33654f, -87.33654f};
    const mt_v4f hi = {88.0f, 88.0f, 88.0f, 88.0f};
    const mt_v4f zero = {0, 0, 0, 0}, inf = {INFINITY, INFINITY, INFINITY, INFINITY};
    const mt_v4i small = x < lo, big = x > hi, nan = x != x;
    mt_v4f xc = MT_BLEND4(small, lo, x);
    xc = MT_BLEND4(big, hi, xc);
    xc = MT_BLEND4(nan, zero, xc);
    const mt_v4f t = xc * 1.44269504088896341f + 12582912.0f;   /* 1.5 * 2^23: round to nearest */
    const mt_v4f n = t - 12582912.0f;
    const mt_v4f r = xc - n * 0.693359375f - n * -2.12194440e-4f;
    mt_v4f y = r * 1.9875691500e-4f + 1.3981999507e-3f;
    y = y * r + 8.3334519073e-3f;
    y = y * r + 4.1665795894e-2f;
    y = y * r + 1.6666665459e-1f;
    y = y * r + 5.0000001201e-1f;
    y = y * r * r + r + 1.0f;
    const mt_v4u e = ((mt_v4u)t - 0x4B400000u + 127u) << 23;     /* 2^n, n in [-126, 127] */
    y = y * (mt_v4f)e;
    y = MT_BLEND4(small, zero, y);
    y = MT_BLEND4(big, inf, y);
    return MT_BLEND4(nan, x, y);
}
/* dst[i] = exp(src[i] - m[i]), or exp(src[i] - m0) when m is NULL */
static MT_RCLONES void mt_exp_sub(float *dst, const float *src, const float *m, float m0, int64_t n) {
    mt_v4f mv = {m0, m0, m0, m0}, v;
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
        memcpy(&v, src + i, 16);
        if (m) memcpy(&mv, m + i, 16);
        v = mt_expf4(v - mv);
        memcpy(dst + i, &v, 16);
    }
    if (i < n) {
        mt_v4f z = {0, 0, 0, 0};
        v = z;
        memcpy(&v, src + i, (size_t)(n - i) * 4);
        if (m) { mv = z; memcpy(&mv, m + i, (size_t)(n - i) * 4); }
        v = mt_expf4(v - mv);
        memcpy(dst + i, &v, (size_t)(n - i) * 4);
    }
}
static MT_RCLONES double mt_sum_f32_f64(const float *e, int64_t n) {
    double acc[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) for (int k = 0; k < 8; k++) acc[k] += e[i + k];
    for (; i < n; i++) acc[0] += e[i];
    double s = 0;
    for (int k = 0; k < 8; k++) s += acc[k];
    return s;
}
#define MT_SBUF 1024   /* floats converted at a time */

#define MT_GEN_SOFTMAX(code, sfx, ST, CT, LOAD, FROM, KIND, LO, HI, _)         \
/* n elements at p (byte stride) as float32: in place for contiguous float32 */ \
static inline const float *l_load_##sfx(float *buf, const char *p, int64_t stride, int64_t n) { \
    if (code == MT_FLOAT32 && stride == 4) return (const float *)p;            \
    for (int64_t i = 0; i < n; i++) buf[i] = (float)LOAD(*(const ST *)(p + i * stride)); \
    return buf;                                                                \
}                                                                              \
static inline void l_store_##sfx(char *q, int64_t stride, const float *v, int64_t n) { \
    if (stride == (int64_t)sizeof(ST)) { ST *o = (ST *)q; for (int64_t i = 0; i < n; i++) o[i] = FROM(v[i]); } \
    else for (int64_t i = 0; i < n; i++) *(ST *)(q + i * stride) = FROM(v[i]); \
}                                                                              \
/* float32-compute path: one line (w == 1) or w <= MT_RTILE columns */        \
static void l_smaxf_##sfx(const char *p, char *q, const mt_line_geom *g, int64_t w, \
                          int64_t cin, int64_t cout, int logsm) {              \
    const int64_t L = g->len, ain = g->ain, aout = g->aout;                    \
    float buf[MT_SBUF], e[MT_SBUF];                                            \
    if (w == 1) {                                                              \
        float m = -INFINITY;                                                   \
        double s = 0;                                                          \
        for (int64_t b0 = 0; b0 < L; b0 += MT_SBUF) {                          \
            const int64_t n = mt_min64(MT_SBUF, L - b0);                       \
            const float c = r_ext_max_f32(l_load_##sfx(buf, p + b0 * ain, ain, n), n); \
            if (c > m || c != c) m = c;                                        \
        }                                                                      \
        /* float32 softmax into a contiguous line keeps exp(x - m) there and  \
         * scales it in place (the same values as computing it twice) */      \
        const int keep = !logsm && code == MT_FLOAT32 && aout == 4;           \
        for (int64_t b0 = 0; b0 < L; b0 += MT_SBUF) {                          \
            const int64_t n = mt_min64(MT_SBUF, L - b0);                       \
            float *dst = keep ? (float *)(q + b0 * aout) : e;                  \
            mt_exp_sub(dst, l_load_##sfx(buf, p + b0 * ain, ain, n), NULL, m, n); \
            s += mt_sum_f32_f64(dst, n);                                       \
        }                                                                      \
        const float fin = logsm ? (float)log(s) : (float)(1.0 / s);            \
        if (keep) {                                                            \
            float *o = (float *)q;                                             \
            for (int64_t i = 0; i < L; i++) o[i] *= fin;                       \
            return;                                                            \
        }                                                                      \
        for (int64_t b0 = 0; b0 < L; b0 += MT_SBUF) {                          \
            const int64_t n = mt_min64(MT_SBUF, L - b0);                       \
            const float *x = l_load_##sfx(buf, p + b0 * ain, ain, n);          \
            if (logsm) for (int64_t i = 0; i < n; i++) e[i] = (x[i] - m) - fin; \
            else {                                                             \
                mt_exp_sub(e, x, NULL, m, n);                                  \
                for (int64_t i = 0; i < n; i++) e[i] *= fin;                   \
            }                                                                  \
            l_store_##sfx(q + b0 * aout, aout, e, n);                          \
        }                                                                      \
        return;                                                                \
    }                                                                          \
    float m[MT_RTILE], fin[MT_RTILE];                                          \
    double s[MT_RTILE];                                                        \
    for (int64_t j = 0; j < w; j++) { m[j] = -INFINITY; s[j] = 0; }            \
    for (int64_t l = 0; l < L; l++) {                                          \
        const float *x = l_load_##sfx(buf, p + l * ain, cin, w);               \
        for (int64_t j = 0; j < w; j++) if (x[j] > m[j] || x[j] != x[j]) m[j] = x[j]; \
    }                                                                          \
    for (int64_t l = 0; l < L; l++) {                                          \
        mt_exp_sub(e, l_load_##sfx(buf, p + l * ain, cin, w), m, 0, w);        \
        for (int64_t j = 0; j < w; j++) s[j] += e[j];                          \
    }                                                                          \
    for (int64_t j = 0; j < w; j++) fin[j] = logsm ? (float)log(s[j]) : (float)(1.0 / s[j]); \
    for (int64_t l = 0; l < L; l++) {                                          \
        const float *x = l_load_##sfx(buf, p + l * ain, cin, w);               \
        if (logsm) for (int64_t j = 0; j < w; j++) e[j] = (x[j] - m[j]) - fin[j]; \
        else {                                                                 \
            mt_exp_sub(e, x, m, 0, w);                                         \
            for (int64_t j = 0; j < w; j++) e[j] *= fin[j];                    \
        }                                                                      \
        l_store_##sfx(q + l * aout, cout, e, w);                               \
    }                                                                          \
}                                                                              \
/* compute-type path (float64): libm exp */                                   \
static void l_smaxd_##sfx(const char *p, char *q, const mt_line_geom *g, int64_t w, \
                          int64_t cin, int64_t cout, int logsm) {              \
    CT m[MT_RTILE], fin[MT_RTILE];                                             \
    double s[MT_RTILE];                                                        \
    for (int64_t j = 0; j < w; j++) { m[j] = -INFINITY; s[j] = 0; }            \
    for (int64_t l = 0; l < g->len; l++) {                                     \
        const char *r = p + l * g->ain;                                        \
        for (int64_t j = 0; j < w; j++) {                                      \
            CT x = LOAD(*(const ST *)(r + j * cin));                           \
            if (x > m[j] || x != x) m[j] = x;                                  \
        }                                                                      \
    }                                                                          \
    for (int64_t l = 0; l < g->len; l++) {                                     \
        const char *r = p + l * g->ain;                                        \
        for (int64_t j = 0; j < w; j++) s[j] += (double)exp(LOAD(*(const ST *)(r + j * cin)) - m[j]); \
    }                                                                          \
    for (int64_t j = 0; j < w; j++) fin[j] = logsm ? (CT)log(s[j]) : (CT)(1.0 / s[j]); \
    for (int64_t l = 0; l < g->len; l++) {                                     \
        const char *r = p + l * g->ain;                                        \
        char *o = q + l * g->aout;                                             \
        for (int64_t j = 0; j < w; j++) {                                      \
            CT x = LOAD(*(const ST *)(r + j * cin));                           \
            *(ST *)(o + j * cout) = FROM(logsm ? (x - m[j]) - fin[j] : exp(x - m[j]) * fin[j]); \
        }                                                                      \
    }                                                                          \
}                                                                              \
static void l_softmax_##sfx##_block(const char *p, char *q, const mt_line_geom *g, \
                                    int64_t w, int64_t cin, int64_t cout) {    \
    if (sizeof(CT) == sizeof(float)) l_smaxf_##sfx(p, q, g, w, cin, cout, 0);  \
    else l_smaxd_##sfx(p, q, g, w, cin, cout, 0);                              \
}                                                                              \
static void l_log_softmax_##sfx##_block(const char *p, char *q, const mt_line_geom *g, \
                                        int64_t w, int64_t cin, int64_t cout) { \
    if (sizeof(CT) == sizeof(float)) l_smaxf_##sfx(p, q, g, w, cin, cout, 1);  \
    else l_smaxd_##sfx(p, q, g, w, cin, cout, 1);                              \
}                                                                              \
MT_LINE_DRIVER(l_softmax_##sfx, ST, 8)                                         \
MT_LINE_DRIVER(l_log_softmax_##sfx, ST, 8)
MT_RDT_FLOAT(MT_GEN_SOFTMAX, 0)

/* =================================================================== tables */

/* designated initialisers: one row per op, one entry per dtype it has */
#define MT_RED_ENTRY(code, sfx, ST, CT, LOAD, FROM, KIND, LO, HI, op) [code] = r_##op##_##sfx,
#define MT_RED_ROW(name, rule) [MT_R_##name] = {MT_RDT_ALL(MT_RED_ENTRY, name)},
#define MT_LINE_ENTRY(code, sfx, ST, CT, LOAD, FROM, KIND, LO, HI, op) [code] = l_##op##_##sfx,
#define MT_SCAN_ROW(name) [MT_L_##name] = {MT_RDT_ALL(MT_LINE_ENTRY, name)},
#define MT_SMAX_ROW(name) [MT_L_##name] = {MT_RDT_FLOAT(MT_LINE_ENTRY, name)},
mt_reduce_fn mt_reduce_fns[MT_NREDUCE][MT_NDTYPES] = {MT_REDUCE_OPS(MT_RED_ROW)};
mt_line_fn mt_scan_fns[MT_NSCAN][MT_NDTYPES] = {MT_SCAN_OPS(MT_SCAN_ROW)};
mt_line_fn mt_softmax_fns[MT_NSOFTMAX][MT_NDTYPES] = {MT_SOFTMAX_OPS(MT_SMAX_ROW)};

#define MT_RNAME(name, rule) #name,
#define MT_RRULE(name, rule) MT_RR_##rule,
#define MT_LNAME(name) #name,
const char *const mt_reduce_names[MT_NREDUCE] = {MT_REDUCE_OPS(MT_RNAME)};
const int mt_reduce_rules[MT_NREDUCE] = {MT_REDUCE_OPS(MT_RRULE)};
const char *const mt_scan_names[MT_NSCAN] = {MT_SCAN_OPS(MT_LNAME)};
const char *const mt_softmax_names[MT_NSOFTMAX] = {MT_SOFTMAX_OPS(MT_LNAME)};
