/* Quantized elementwise add (and add + ReLU) on the integers, in one pass
 * (issue 32): the arithmetic of the quantized Elemwise module's float path
 * (dequantize each input, add, ReLU, quantize) bit for bit, in float32:
 *
 *   v = ((float)a - a_zp) * a_scale + ((float)b - b_zp) * b_scale
 *   v = relu ? max(v, 0) : v
 *   y = clamp(rintf(v / out_scale) + out_zp, lo, hi)
 *
 * each operation rounded to float32 on its own (no fused multiply-add:
 * these functions are compiled with fp-contract off), rintf under the
 * default rounding mode (round half to even). A ReLU of -0.0 and of 0 give
 * the same integer (out_zp), so how it treats signed zeros does not show.
 * kinds: 0 int8, 1 uint8. Paths: AVX-512 where the CPU has it, portable C
 * otherwise or on request (path 1); the same bits.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>
#include "qteam.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(MT_NO_CLONES)
#include <immintrin.h>
#define MT_QE_AVX512 1
#endif

#define NO_CONTRACT __attribute__((optimize("fp-contract=off")))

static inline float load_q(const void *p, int kind, int64_t i)
{
    return kind == 1 ? (float)((const uint8_t *)p)[i] : (float)((const int8_t *)p)[i];
}

NO_CONTRACT
static void add_portable(const void *a, int ak, float as, float az, const void *b, int bk,
                         float bs, float bz, int64_t n, float os, float oz, float lo, float hi,
                         int relu, void *out, int ok)
{
    for (int64_t i = 0; i < n; i++) {
        float da = (load_q(a, ak, i) - az) * as;
        float db = (load_q(b, bk, i) - bz) * bs;
        float v = da + db;
        if (relu && !(v > 0))
            v = 0;
        v = rintf(v / os) + oz;
        if (!(v >= lo)) v = lo;
        if (v > hi) v = hi;
        if (ok == 1)
            ((uint8_t *)out)[i] = (uint8_t)(int32_t)v;
        else
            ((int8_t *)out)[i] = (int8_t)(int32_t)v;
    }
}

#ifdef MT_QE_AVX512
__attribute__((target("avx512f,avx512bw,avx512vl")))
static inline __m512 load16(const void *p, int kind, int64_t i)
{
    __m128i v = _mm_loadu_si128((const __m128i *)((const char *)p + i));
    return _mm512_cvtepi32_ps(kind == 1 ? _mm512_cvtepu8_epi32(v) : _mm512_cvtepi8_epi32(v));
}

NO_CONTRACT __attribute__((target("avx512f,avx512bw,avx512vl")))
static void add_avx512(const void *a, int ak, float as, float az, const void *b, int bk,
                       float bs, float bz, int64_t n, float os, float oz, float lo, float hi,
                       int relu, void *out, int ok)
{
    __m512 vas = _mm512_set1_ps(as), vaz = _mm512_set1_ps(az), vbs = _mm512_set1_ps(bs),
           vbz = _mm512_set1_ps(bz), vos = _mm512_set1_ps(os), voz = _mm512_set1_ps(oz),
           vlo = _mm512_set1_ps(lo), vhi = _mm512_set1_ps(hi), zero = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 da = _mm512_mul_ps(_mm512_sub_ps(load16(a, ak, i), vaz), vas);
        __m512 db = _mm512_mul_ps(_mm512_sub_ps(load16(b, bk, i), vbz), vbs);
        __m512 v = _mm512_add_ps(da, db);
        if (relu)
            v = _mm512_max_ps(v, zero);
        v = _mm512_add_ps(_mm512_roundscale_ps(_mm512_div_ps(v, vos),
                                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC),
                          voz);
        v = _mm512_min_ps(_mm512_max_ps(v, vlo), vhi);
        _mm_storeu_si128((__m128i *)((char *)out + i),
                         _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(v)));
    }
    if (i < n)
        add_portable((const char *)a + i, ak, as, az, (const char *)b + i, bk, bs, bz, n - i,
                     os, oz, lo, hi, relu, (char *)out + i, ok);
}

static int has_avx512(void)
{
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw")
        && __builtin_cpu_supports("avx512vl");
}
#endif

/* share c of chunks of mt_qadd_u8's n elements */
static void add_share(const void *a, int ak, float as, float az, const void *b, int bk, float bs,
                      float bz, int64_t n, float os, float oz, float lo, float hi, int relu,
                      void *out, int ok, int wide, int64_t c, int64_t chunks)
{
    int64_t at, len;
    mt_q_share(n, c, chunks, &at, &len);
    const char *pa = (const char *)a + at, *pb = (const char *)b + at;
    char *po = (char *)out + at;
#ifdef MT_QE_AVX512
    if (wide) {
        add_avx512(pa, ak, as, az, pb, bk, bs, bz, len, os, oz, lo, hi, relu, po, ok);
        return;
    }
#endif
    (void)wide;
    add_portable(pa, ak, as, az, pb, bk, bs, bz, len, os, oz, lo, hi, relu, po, ok);
}

/* out[i] = the quantized sum above of a[i] and b[i], i < n (int8 or uint8
 * each, by kind). Returns the path used: 1 portable, 2 AVX-512. */
int mt_qadd_u8(const void *a, int ak, float as, float az, const void *b, int bk, float bs,
               float bz, int64_t n, float os, float oz, float lo, float hi, int relu, void *out,
               int ok, int path)
{
    int wide = 0;
#ifdef MT_QE_AVX512
    wide = path != 1 && has_avx512();
#endif
    (void)path;
    /* one equal share a thread (MobileNetV2's 56x56 add in 64 k chunks ran
     * 64 k on one thread and 11 k on the other) */
    int64_t chunks = mt_q_team(n * MT_Q_ELEM_COST);
    if (chunks <= 1) {
        /* no region: even one of a single thread costs ~0.5 us where the
         * caller is itself on a team (libgomp builds a nested team), and
         * the block step (qblock.c) adds row ranges a channel at a time */
        add_share(a, ak, as, az, b, bk, bs, bz, n, os, oz, lo, hi, relu, out, ok, wide, 0, 1);
        return wide ? 2 : 1;
    }
#pragma omp parallel for schedule(static) num_threads(chunks)
    for (int64_t c = 0; c < chunks; c++)
        add_share(a, ak, as, az, b, bk, bs, bz, n, os, oz, lo, hi, relu, out, ok, wide, c, chunks);
    return wide ? 2 : 1;
}

/* Quantized concat on the integers (MegEngine's quantized Concat): each
 * input requantized to the output's qparams, the arithmetic of the float
 * path (dequantize, concat, quantize) bit for bit in float32:
 *
 *   y = clamp(rintf((((float)q - zp) * scale) / out_scale) + out_zp, lo, hi)
 *
 * An int8 / uint8 input has 256 values, so each input's map is a table of
 * 256 bytes built with that arithmetic, and the copy is a lookup per byte
 * (a plain memcpy where the table is the identity: equal qparams).
 *
 * Input j is [outer][inner[j]] (its concat axis and the axes after it, C
 * order), of kind kinds[j] (0 int8, 1 uint8); out is [outer][sum inner]
 * of kind ok. tables: the caller's 257 * n_in bytes. Rows run on OpenMP
 * threads when there are many. */
NO_CONTRACT
static int requant_table(int kind, float s, float zp, float os, float oz, float lo, float hi,
                         uint8_t *table)
{
    int identity = 1;
    for (int b = 0; b < 256; b++) {
        float q = kind == 1 ? (float)b : (float)(int8_t)(uint8_t)b;
        float v = rintf(((q - zp) * s) / os) + oz;
        if (!(v >= lo)) v = lo;
        if (v > hi) v = hi;
        table[b] = (uint8_t)(int32_t)v;     /* an int8 result: its two's complement byte */
        identity &= table[b] == b;
    }
    return identity;
}

void mt_qconcat_u8(int n_in, const void *const *xs, const int *kinds, const float *scales,
                   const float *zps, const int64_t *inner, int64_t outer, float os, float oz,
                   float lo, float hi, int ok, uint8_t *tables, void *out)
{
    int64_t total = 0;
    for (int j = 0; j < n_in; j++) {
        total += inner[j];
        /* a table's first byte marks the identity map: 1 copies, else looks up;
         * the map itself follows it */
        uint8_t *t = tables + (size_t)j * 257;
        t[0] = (uint8_t)requant_table(kinds[j], scales[j], zps[j], os, oz, lo, hi, t + 1);
    }
    (void)ok;       /* the tables hold the output's bytes, of either kind */
#pragma omp parallel for schedule(static) if (outer > 1 && outer * total >= (1 << 16))
    for (int64_t o = 0; o < outer; o++) {
        uint8_t *dst = (uint8_t *)out + o * total;
        for (int j = 0; j < n_in; j++) {
            const uint8_t *src = (const uint8_t *)xs[j] + o * inner[j];
            const uint8_t *t = tables + (size_t)j * 257;
            if (t[0])
                memcpy(dst, src, (size_t)inner[j]);
            else
                for (int64_t k = 0; k < inner[j]; k++)
                    dst[k] = t[1 + src[k]];
            dst += inner[j];
        }
    }
}
