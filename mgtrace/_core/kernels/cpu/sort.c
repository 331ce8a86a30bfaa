/* sort, argsort and topk along one axis.
 *
 * Each line is copied into an array of (key, index) pairs, keys in a type
 * that orders like the values (int64 for bool and integers, float for the
 * 16/32-bit floats, double for float64). The order is total: NaN is the
 * largest key (NumPy sorts NaN last), and equal keys go by index, so a
 * merge sort and a selection give the same, stable answer. topk selects
 * with an introselect (quickselect, median of three, merge sort when the
 * recursion degenerates) and then sorts only the k selected pairs; for
 * k <= n / 16 it streams the line through a heap of k pairs instead (the
 * elements arrive in index order, so a tie never displaces a kept one and
 * most elements cost one key comparison).
 * Lines run in parallel; each thread owns its scratch arrays.
 */
#include <stdlib.h>
#include "reduce.h"

#define MT_CAT_(a, b) a##b
#define MT_CAT(a, b) MT_CAT_(a, b)

/* x before y in the key order: NaN last, ties by index */
#define MT_KLT(a, b) ((a) < (b) || ((b) != (b) && (a) == (a)))
#define MT_BEFORE_asc(x, y) (MT_KLT((x).k, (y).k) || (!MT_KLT((y).k, (x).k) && (x).i < (y).i))
#define MT_BEFORE_desc(x, y) (MT_KLT((y).k, (x).k) || (!MT_KLT((x).k, (y).k) && (x).i < (y).i))

/* (one level of expansion first, so NAME may be an MT_CAT) */
#define MT_GEN_SORTALG(NAME, P, BEFORE) MT_GEN_SORTALG_(NAME, P, BEFORE)
#define MT_GEN_SORTALG_(NAME, P, BEFORE)                                       \
static void NAME##_isort(P *a, int64_t n) {                                    \
    for (int64_t i = 1; i < n; i++) {                                          \
        P v = a[i];                                                            \
        int64_t j = i;                                                         \
        while (j > 0 && BEFORE(v, a[j - 1])) { a[j] = a[j - 1]; j--; }         \
        a[j] = v;                                                              \
    }                                                                          \
}                                                                              \
/* bottom-up merge sort of a[0..n), tmp holds n pairs */                      \
static void NAME##_msort(P *a, P *tmp, int64_t n) {                            \
    const int64_t run = 32;                                                    \
    for (int64_t lo = 0; lo < n; lo += run) NAME##_isort(a + lo, n - lo < run ? n - lo : run); \
    P *src = a, *dst = tmp;                                                    \
    for (int64_t width = run; width < n; width *= 2) {                         \
        for (int64_t lo = 0; lo < n; lo += 2 * width) {                        \
            int64_t mid = lo + width < n ? lo + width : n;                     \
            int64_t hi = lo + 2 * width < n ? lo + 2 * width : n;              \
            int64_t i = lo, j = mid, k = lo;                                   \
            while (i < mid && j < hi) dst[k++] = BEFORE(src[j], src[i]) ? src[j++] : src[i++]; \
            while (i < mid) dst[k++] = src[i++];                               \
            while (j < hi) dst[k++] = src[j++];                                \
        }                                                                      \
        P *t = src; src = dst; dst = t;                                        \
    }                                                                          \
    if (src != a) memcpy(a, src, sizeof(P) * (size_t)n);                       \
}                                                                              \
/* rearrange a[0..n) so that a[0..k) holds the first k pairs (any order) */   \
static void NAME##_select(P *a, P *tmp, int64_t n, int64_t k) {                \
    int64_t lo = 0, hi = n;                                                    \
    int depth = 2;                                                             \
    for (int64_t m = n; m > 1; m >>= 1) depth += 2;                            \
    while (hi - lo > 32) {                                                     \
        if (depth-- == 0) { NAME##_msort(a + lo, tmp, hi - lo); return; }      \
        int64_t mid = lo + (hi - lo) / 2;                                      \
        P t;                                                                   \
        /* median of three to a[hi - 1] */                                    \
        if (BEFORE(a[mid], a[lo])) { t = a[mid]; a[mid] = a[lo]; a[lo] = t; }  \
        if (BEFORE(a[hi - 1], a[lo])) { t = a[hi - 1]; a[hi - 1] = a[lo]; a[lo] = t; } \
        if (BEFORE(a[mid], a[hi - 1])) { t = a[mid]; a[mid] = a[hi - 1]; a[hi - 1] = t; } \
        const P pv = a[hi - 1];                                                \
        int64_t store = lo;                                                    \
        for (int64_t i = lo; i < hi - 1; i++)                                  \
            if (BEFORE(a[i], pv)) { t = a[i]; a[i] = a[store]; a[store] = t; store++; } \
        a[hi - 1] = a[store]; a[store] = pv;                                   \
        if (store == k || store == k - 1) return;                              \
        if (store > k) hi = store; else lo = store + 1;                        \
    }                                                                          \
    NAME##_isort(a + lo, hi - lo);                                             \
}                                                                              \
/* a heap of k pairs whose root is the latest of them in the order */        \
static void NAME##_siftdown(P *h, int64_t k, int64_t i) {                      \
    P v = h[i];                                                                \
    for (;;) {                                                                 \
        int64_t c = 2 * i + 1;                                                 \
        if (c >= k) break;                                                     \
        if (c + 1 < k && BEFORE(h[c], h[c + 1])) c++;                          \
        if (!BEFORE(v, h[c])) break;                                           \
        h[i] = h[c];                                                           \
        i = c;                                                                 \
    }                                                                          \
    h[i] = v;                                                                  \
}                                                                              \
static void NAME##_heapify(P *h, int64_t k) {                                  \
    for (int64_t i = k / 2 - 1; i >= 0; i--) NAME##_siftdown(h, k, i);         \
}

#define MT_GEN_KEY(KT)                                                         \
typedef struct { KT k; int32_t i; } MT_CAT(mt_pair_, KT);                      \
MT_GEN_SORTALG(MT_CAT(s_asc_, KT), MT_CAT(mt_pair_, KT), MT_BEFORE_asc)         \
MT_GEN_SORTALG(MT_CAT(s_desc_, KT), MT_CAT(mt_pair_, KT), MT_BEFORE_desc)
MT_GEN_KEY(int64_t)
MT_GEN_KEY(float)
MT_GEN_KEY(double)

/* key type by kind: integers and bool as int64, floats in their compute type */
#define MT_SKEY_Kb(CT) int64_t
#define MT_SKEY_Ki(CT) int64_t
#define MT_SKEY_Kf(CT) CT
#define MT_SFN(dir, KT, fn) MT_CAT(MT_CAT(MT_CAT(s_, dir), KT), fn)

/* the rest of a line through the heap a[0..k): v replaces the root when it
 * comes first (ADMIT), inside MT_GEN_SORT_KT */
#define MT_HEAP_SCAN(DIR, ADMIT, KT, ST, LOAD) do {                                        \
        MT_SFN(DIR, KT, _heapify)(a, k);                                       \
        for (int64_t i = k; i < L; i++) {                                      \
            const KT v = (KT)LOAD(*(const ST *)(p + i * g->ain));              \
            if (ADMIT) {                                                       \
                a[0].k = v;                                                    \
                a[0].i = (int32_t)i;                                           \
                MT_SFN(DIR, KT, _siftdown)(a, k, 0);                           \
            }                                                                  \
        }                                                                      \
    } while (0)

#define MT_GEN_SORT(code, sfx, ST, CT, LOAD, FROM, KIND, LO, HI, _)           \
    MT_GEN_SORT_KT(sfx, ST, LOAD, MT_SKEY_##KIND(CT))
#define MT_GEN_SORT_KT(sfx, ST, LOAD, KT)                                     \
static int s_sort_##sfx(const char *in, char *vals, char *idx, const mt_line_geom *g, \
                        int64_t k, int descending, int sorted, int nt) {       \
    typedef MT_CAT(mt_pair_, KT) P;                                            \
    const int64_t L = g->len;                                                  \
    int64_t nlines = 1;                                                        \
    for (int d = 0; d < g->nouter; d++) nlines *= g->oshape[d];                \
    if (nlines == 0 || k <= 0 || L <= 0) return 0;                             \
    if (nt < 1 || nlines < 2 || nlines * L < MT_RGRAIN / 8) nt = 1;            \
    int fail = 0;                                                              \
    _Pragma("omp parallel num_threads(nt) if(nt > 1)")                         \
    {                                                                          \
        P *a = (P *)malloc(sizeof(P) * (size_t)L);                             \
        P *tmp = (P *)malloc(sizeof(P) * (size_t)L);                           \
        if (!a || !tmp) {                                                      \
            _Pragma("omp atomic write")                                        \
            fail = 1;                                                          \
        }                                                                      \
        _Pragma("omp for schedule(static)")                                    \
        for (int64_t l = 0; l < nlines; l++) {                                 \
            if (!a || !tmp) continue;                                          \
            int64_t oa, ob, oc;                                                \
            mt_offsets3(g->nouter, g->oshape, g->oin, g->oout, g->oidx, l, &oa, &ob, &oc); \
            const char *p = in + oa;                                           \
            const int heap = k * 16 <= L;                                      \
            for (int64_t i = 0; i < (heap ? k : L); i++) {                     \
                a[i].k = (KT)LOAD(*(const ST *)(p + i * g->ain));              \
                a[i].i = (int32_t)i;                                           \
            }                                                                  \
            if (descending) {                                                  \
                if (heap) MT_HEAP_SCAN(desc_, MT_KLT(a[0].k, v), KT, ST, LOAD);           \
                else if (k < L) MT_SFN(desc_, KT, _select)(a, tmp, L, k);      \
                if (k == L || sorted) MT_SFN(desc_, KT, _msort)(a, tmp, k);    \
            } else {                                                           \
                if (heap) MT_HEAP_SCAN(asc_, MT_KLT(v, a[0].k), KT, ST, LOAD);           \
                else if (k < L) MT_SFN(asc_, KT, _select)(a, tmp, L, k);       \
                if (k == L || sorted) MT_SFN(asc_, KT, _msort)(a, tmp, k);     \
            }                                                                  \
            for (int64_t i = 0; i < k; i++) {                                  \
                if (vals) *(ST *)(vals + ob + i * g->aout) = *(const ST *)(p + (int64_t)a[i].i * g->ain); \
                *(int32_t *)(idx + oc + i * g->aidx) = a[i].i;                 \
            }                                                                  \
        }                                                                      \
        free(a);                                                               \
        free(tmp);                                                             \
    }                                                                          \
    return fail ? -1 : 0;                                                      \
}
MT_RDT_ALL(MT_GEN_SORT, 0)

#define MT_SORT_ENTRY(code, sfx, ST, CT, LOAD, FROM, KIND, LO, HI, _) [code] = s_sort_##sfx,
mt_sort_fn mt_sort_fns[MT_NDTYPES] = {MT_RDT_ALL(MT_SORT_ENTRY, 0)};
