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
 *     are outer (sum over axis 0 of [N, C]) whole rows are accumulated into a
 *     tile of states;
 *   - anything else walks the reduced dims with byte strides.
 * Work is split over OpenMP threads by outputs, or, when there are few
 * outputs, by chunks of the reduction with an ordered final combine (so
 * arg-reductions keep the first occurrence).
 */
#include <stdlib.h>
#include <tgmath.h>
#include "reduce.h"

#define MT_RBLOCK 2048   /* a contiguous block summed in lanes, then added to the total */
#define MT_RLANES 32     /* independent accumulators in a contiguous sum */
#define MT_RTILE 256     /* columns per tile in the rows and tiled line paths */

/* ---- per-kind types and stores (kind: B bool, I integer, F float) ---- */
#define MT_ACC_B int64_t          /* sum/prod accumulator */
#define MT_ACC_I int64_t
#define MT_ACC_F double
#define MT_LANE_B(CT) int64_t     /* lanes of a contiguous sum */
#define MT_LANE_I(CT) int64_t
#define MT_LANE_F(CT) CT          /* float16/bfloat16/float32 lanes in float32 */
#define MT_ISNAN_B(x) 0
#define MT_ISNAN_I(x) 0
#define MT_ISNAN_F(x) ((x) != (x))
/* SUM rule: ints keep their dtype, bool -> int32, floats keep */
#define MT_SUMT_B(ST) int32_t
#define MT_SUMT_I(ST) ST
#define MT_SUMT_F(ST) ST
#define MT_SUMV_B(ST, FROM, a) ((int32_t)(a))
#define MT_SUMV_I(ST, FROM, a) ((ST)(a))
#define MT_SUMV_F(ST, FROM, a) FROM(a)
/* FLOAT rule: floats keep, ints and bool -> float32 */
#define MT_FLTT_B(ST) float
#define MT_FLTT_I(ST) float
#define MT_FLTT_F(ST) ST
#define MT_FLTV_B(ST, FROM, v) ((float)(v))
#define MT_FLTV_I(ST, FROM, v) ((float)(v))
#define MT_FLTV_F(ST, FROM, v) FROM(v)

static inline int64_t mt_min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* =================================================================== drivers */

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
    int64_t idx[MT_MAX_NDIM], rem = start;                                     \
    const char *p = base;                                                      \
    for (int d = last; d >= 0; d--) {                                          \
        idx[d] = rem % g->rshape[d]; rem /= g->rshape[d]; p += idx[d] * g->rin[d]; \
    }                                                                          \
    int64_t pos = start;                                                       \
    while (pos < end) {                                                        \
        int64_t run = mt_min64(inner - idx[last], end - pos);                  \
        if (st == isz) NAME##_runc(s, (const ST *)p, run, pos);                \
        else for (int64_t i = 0; i < run; i++) NAME##_step(s, LOAD(*(const ST *)(p + i * st)), pos + i); \
        pos += run;                                                            \
        if (pos >= end) break;                                                 \
        p -= idx[last] * st; idx[last] = 0;                                    \
        for (int d = last - 1; d >= 0; d--) {                                  \
            idx[d]++; p += g->rin[d];                                          \
            if (idx[d] < g->rshape[d]) break;                                  \
            p -= g->rshape[d] * g->rin[d]; idx[d] = 0;                         \
        }                                                                      \
    }                                                                          \
}                                                                              \
/* fold rows [start, end) of the reduced dims into w column states */         \
static MT_RCLONES void NAME##_rows_range(NAME##_t *s, const char *base, const mt_reduce_geom *g, \
                                         int64_t w, int64_t start, int64_t end) { \
    const int last = g->nred - 1;                                              \
    int64_t idx[MT_MAX_NDIM], rem = start;                                     \
    const char *p = base;                                                      \
    for (int d = last; d >= 0; d--) {                                          \
        idx[d] = rem % g->rshape[d]; rem /= g->rshape[d]; p += idx[d] * g->rin[d]; \
    }                                                                          \
    for (int64_t k = start; k < end; k++) {                                    \
        const ST *row = (const ST *)p;                                         \
        for (int64_t j = 0; j < w; j++) NAME##_step(&s[j], LOAD(row[j]), k);   \
        for (int d = last; d >= 0; d--) {                                      \
            idx[d]++; p += g->rin[d];                                          \
            if (idx[d] < g->rshape[d]) break;                                  \
            p -= g->rshape[d] * g->rin[d]; idx[d] = 0;                         \
        }                                                                      \
    }                                                                          \
}                                                                              \
static int NAME##_rows(const char *in, char *out, const mt_reduce_geom *g, int nt, \
                       int64_t nout, int64_t nr) {                             \
    const int kl = g->nkeep - 1;                                               \
    const int64_t W = g->kshape[kl], ko = g->kout[kl], isz = (int64_t)sizeof(ST); \
    const int64_t ntiles = (W + MT_RTILE - 1) / MT_RTILE, units = nout / W * ntiles; \
    if (nt > 1 && units < 4 * nt && nr >= 8 * nt) {                            \
        /* few tiles, many rows: split the rows, combine in order */          \
        NAME##_t *parts = (NAME##_t *)malloc(sizeof(NAME##_t) * MT_RTILE * (size_t)nt); \
        if (!parts) return -1;                                                 \
        for (int64_t u = 0; u < units; u++) {                                  \
            const int64_t j0 = (u % ntiles) * MT_RTILE, w = mt_min64(MT_RTILE, W - j0); \
            int64_t a, b;                                                      \
            mt_offsets3(kl, g->kshape, g->kin, g->kout, NULL, u / ntiles, &a, &b, NULL); \
            _Pragma("omp parallel for num_threads(nt) schedule(static)")      \
            for (int c = 0; c < nt; c++) {                                     \
                NAME##_t *ps = parts + (int64_t)c * MT_RTILE;                  \
                const int64_t s0 = nr * c / nt, s1 = nr * (c + 1) / nt;        \
                for (int64_t j = 0; j < w; j++) NAME##_init(&ps[j], s0);       \
                NAME##_rows_range(ps, in + a + j0 * isz, g, w, s0, s1);        \
            }                                                                  \
            for (int c = 1; c < nt; c++)                                       \
                for (int64_t j = 0; j < w; j++) NAME##_comb(&parts[j], &parts[(int64_t)c * MT_RTILE + j]); \
            for (int64_t j = 0; j < w; j++) NAME##_store(out + b + (j0 + j) * ko, &parts[j], g); \
        }                                                                      \
        free(parts);                                                           \
        return 0;                                                              \
    }                                                                          \
    _Pragma("omp parallel for num_threads(nt) schedule(static) if(nt > 1)")   \
    for (int64_t u = 0; u < units; u++) {                                      \
        const int64_t j0 = (u % ntiles) * MT_RTILE, w = mt_min64(MT_RTILE, W - j0); \
        int64_t a, b;                                                          \
        NAME##_t s[MT_RTILE];                                                  \
        mt_offsets3(kl, g->kshape, g->kin, g->kout, NULL, u / ntiles, &a, &b, NULL); \
        for (int64_t j = 0; j < w; j++) NAME##_init(&s[j], 0);                 \
        NAME##_rows_range(s, in + a + j0 * isz, g, w, 0, nr);                  \
        for (int64_t j = 0; j < w; j++) NAME##_store(out + b + (j0 + j) * ko, &s[j], g); \
    }                                                                          \
    return 0;                                                                  \
}                                                                              \
static int NAME(const char *in, char *out, const mt_reduce_geom *g, int nt) {  \
    int64_t nout = 1, nr = 1;                                                  \
    const int64_t isz = (int64_t)sizeof(ST);                                   \
    for (int d = 0; d < g->nkeep; d++) nout *= g->kshape[d];                   \
    for (int d = 0; d < g->nred; d++) nr *= g->rshape[d];                      \
    if (nout == 0 || nr == 0) return 0;                                        \
    if (nt < 1 || nout * nr < MT_RGRAIN) nt = 1;                               \
    if (g->nkeep > 0 && g->kin[g->nkeep - 1] == isz && g->rin[g->nred - 1] != isz) \
        return NAME##_rows(in, out, g, nt, nout, nr);                          \
    if (nt > 1 && nout < 8 * nt && nr >= 64 * nt) {                            \
        /* few outputs, long reductions: chunks of each, combined in order */ \
        const int64_t nj = nout * nt;                                          \
        NAME##_t *parts = (NAME##_t *)malloc(sizeof(NAME##_t) * (size_t)nj);  \
        if (!parts) return -1;                                                 \
        _Pragma("omp parallel for num_threads(nt) schedule(static)")          \
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
    _Pragma("omp parallel for num_threads(nt) schedule(static) if(nt > 1)")   \
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

/* sum and mean: int64 or double accumulator; contiguous runs in blocks of
 * MT_RBLOCK summed in MT_RLANES lanes (float32 lanes for the 16/32-bit
 * floats), each block total added to the double accumulator: accurate to
 * about 1e-7 relative, and vectorised. */
#define MT_STORE_SUM(o, v, g, ST, FROM, KIND) (*(MT_SUMT_##KIND(ST) *)(o) = MT_SUMV_##KIND(ST, FROM, v))
#define MT_STORE_MEAN(o, v, g, ST, FROM, KIND) \
    (*(MT_FLTT_##KIND(ST) *)(o) = MT_FLTV_##KIND(ST, FROM, (double)(v) / (double)(g)->count))
#define MT_GEN_SUMLIKE(NAME, ST, CT, LOAD, FROM, KIND, STORE)                  \
typedef struct { MT_ACC_##KIND acc; } NAME##_t;                                \
static inline void NAME##_init(NAME##_t *s, int64_t i0) { (void)i0; s->acc = 0; } \
static inline void NAME##_step(NAME##_t *s, CT x, int64_t i) { (void)i; s->acc += x; } \
static inline void NAME##_comb(NAME##_t *a, const NAME##_t *b) { a->acc += b->acc; } \
static MT_RCLONES void NAME##_runc(NAME##_t *s, const ST *p, int64_t n, int64_t i0) { \
    (void)i0;                                                                  \
    MT_ACC_##KIND total = 0;                                                   \
    while (n > 0) {                                                            \
        const int64_t m = mt_min64(n, MT_RBLOCK);                              \
        MT_LANE_##KIND(CT) acc[MT_RLANES] = {0};                               \
        int64_t i = 0;                                                         \
        for (; i + MT_RLANES <= m; i += MT_RLANES)                             \
            for (int k = 0; k < MT_RLANES; k++) acc[k] += LOAD(p[i + k]);      \
        MT_ACC_##KIND t = 0;                                                   \
        for (; i < m; i++) t += LOAD(p[i]);                                    \
        for (int k = 0; k < MT_RLANES; k++) t += acc[k];                       \
        total += t; p += m; n -= m;                                            \
    }                                                                          \
    s->acc += total;                                                           \
}                                                                              \
static inline void NAME##_store(char *o, const NAME##_t *s, const mt_reduce_geom *g) { \
    (void)g; STORE(o, s->acc, g, ST, FROM, KIND);                              \
}                                                                              \
MT_REDUCE_DRIVER(NAME, ST, LOAD)
#define MT_GEN_SUM(code, sfx, ST, CT, LOAD, FROM, KIND, LO, HI, _) \
    MT_GEN_SUMLIKE(r_sum_##sfx, ST, CT, LOAD, FROM, KIND, MT_STORE_SUM)
#define MT_GEN_MEAN(code, sfx, ST, CT, LOAD, FROM, KIND, LO, HI, _) \
    MT_GEN_SUMLIKE(r_mean_##sfx, ST, CT, LOAD, FROM, KIND, MT_STORE_MEAN)

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
MT_REDUCE_DRIVER(r_prod_##sfx, ST, LOAD)

/* max and min: NaN propagates (once the state is NaN it stays NaN), as in
 * NumPy. The block extreme is shared with argmax/argmin. */
#define MT_GEN_EXTREME(code, sfx, ST, CT, LOAD, FROM, KIND, LO, HI, OPN, CMP, ID) \
static MT_RCLONES CT r_ext_##OPN##_##sfx(const ST *p, int64_t n) {             \
    CT m[16];                                                                  \
    for (int k = 0; k < 16; k++) m[k] = ID;                                    \
    int64_t i = 0;                                                             \
    for (; i + 16 <= n; i += 16)                                               \
        for (int k = 0; k < 16; k++) {                                         \
            CT x = LOAD(p[i + k]);                                             \
            m[k] = (x CMP m[k] || MT_ISNAN_##KIND(x)) ? x : m[k];              \
        }                                                                      \
    CT r = ID;                                                                 \
    for (; i < n; i++) { CT x = LOAD(p[i]); if (x CMP r || MT_ISNAN_##KIND(x)) r = x; } \
    for (int k = 0; k < 16; k++) if (m[k] CMP r || MT_ISNAN_##KIND(m[k])) r = m[k]; \
    return r;                                                                  \
}                                                                              \
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
    const int tiled = g->nouter > 0 && g->oin[g->nouter - 1] == isz && g->ain != isz; \
    const int nd = tiled ? g->nouter - 1 : g->nouter;                          \
    const int64_t W = tiled ? g->oshape[nd] : 1;                               \
    const int64_t cin = tiled ? g->oin[nd] : 0, cout = tiled ? g->oout[nd] : 0; \
    const int64_t ntiles = (W + MT_RTILE - 1) / MT_RTILE, units = nlines / W * ntiles; \
    _Pragma("omp parallel for num_threads(nt) schedule(static) if(nt > 1)")   \
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
 * subtract the max, exp in the compute type (float32 for the 16-bit
 * floats), sum in double. A NaN in a line makes the whole line NaN. */
#define MT_GEN_SOFTMAX(code, sfx, ST, CT, LOAD, FROM, KIND, LO, HI, _)         \
static void l_smax_pass_##sfx(const char *p, const mt_line_geom *g, int64_t w, int64_t cin, \
                              CT *m, double *s) {                              \
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
}                                                                              \
static void l_softmax_##sfx##_block(const char *p, char *q, const mt_line_geom *g, \
                                    int64_t w, int64_t cin, int64_t cout) {    \
    CT m[MT_RTILE], inv[MT_RTILE];                                             \
    double s[MT_RTILE];                                                        \
    l_smax_pass_##sfx(p, g, w, cin, m, s);                                     \
    for (int64_t j = 0; j < w; j++) inv[j] = (CT)(1.0 / s[j]);                 \
    for (int64_t l = 0; l < g->len; l++) {                                     \
        const char *r = p + l * g->ain;                                        \
        char *o = q + l * g->aout;                                             \
        for (int64_t j = 0; j < w; j++)                                        \
            *(ST *)(o + j * cout) = FROM(exp(LOAD(*(const ST *)(r + j * cin)) - m[j]) * inv[j]); \
    }                                                                          \
}                                                                              \
static void l_log_softmax_##sfx##_block(const char *p, char *q, const mt_line_geom *g, \
                                        int64_t w, int64_t cin, int64_t cout) { \
    CT m[MT_RTILE], lse[MT_RTILE];                                             \
    double s[MT_RTILE];                                                        \
    l_smax_pass_##sfx(p, g, w, cin, m, s);                                     \
    for (int64_t j = 0; j < w; j++) lse[j] = (CT)log(s[j]);                    \
    for (int64_t l = 0; l < g->len; l++) {                                     \
        const char *r = p + l * g->ain;                                        \
        char *o = q + l * g->aout;                                             \
        for (int64_t j = 0; j < w; j++)                                        \
            *(ST *)(o + j * cout) = FROM(LOAD(*(const ST *)(r + j * cin)) - m[j] - lse[j]); \
    }                                                                          \
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
