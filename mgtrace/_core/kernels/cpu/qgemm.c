/* Int8 GEMM with int32 accumulation and a fused requantize epilogue, and
 * the im2col that turns an int8 convolution into it (issue 32).
 *
 *   acc[m, n] = sum_k (a[m, k] - a_zp) * w[n, k] + bias[n]        (int64)
 *   y[m, n]   = clamp(rint(acc[m, n] * mult[n]) + out_zp, lo, hi)  (double)
 *
 * a is uint8 (a signed activation is passed with its bytes xor 0x80 and
 * a_zp + 128: the same integers), w int8, packed by mt_qgemm_pack_s8 into
 * blocks of 16 output channels x 4 k (zeros past N and K), the layout
 * vpdpbusd reads. rint is IEEE round half to even (the default rounding
 * mode), the rule of mgtrace.quantization. ReLU is folded into lo (the
 * caller passes lo = max(qmin, out_zp)). The accumulation is exact while
 * K * 255 * 128 < 2**31 (K < 65793); callers check it. out_u8 2 writes
 * float32 instead: (float)(acc * mult[n]), ReLU when lo is 0 (mult then
 * x_scale * w_scale), then where hi > 0 the float's ReLU6 (a ReLU6 the
 * plan folded in), for a layer whose output stays float.
 *
 * Three paths with one result, chosen at run time: AVX-512 VNNI
 * (vpdpbusd, u8 x s8 -> s32) where the CPU has it, else AVX2 (vpmaddwd on
 * the bytes widened to int16), else portable C. No Python here;
 * the Cython wrapper (qint8.pyx) owns the arrays and the checks.
 */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "qround.h"
#include "qteam.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(MT_NO_CLONES)
#include <immintrin.h>
#define MT_Q_VNNI 1
#endif

#ifdef _OPENMP
#include <omp.h>
#endif

/* Thread teams of the int8 kernels (qgemm.c, qconv.c). A parallel region
 * pays where each thread gets at least MT_Q_GRAIN units (multiply-adds, or
 * bytes packed): about 5-10 us of VNNI work, against a fork and a barrier
 * that cost a few us on an idle machine and a time slice where another
 * process holds a core (MobileNetV2 runs ~100 int8 layers per forward,
 * many of them far below that: a 7x7 depthwise layer is 0.4 M). The most
 * threads is mgtrace's count for the next kernel (mgtrace._core.qint8 sets
 * it before each call from dispatch's num_threads(): set_num_threads, and
 * fewer under load where adaptive threads are on), else OpenMP's default.
 * The count is the calling thread's own: qblock.c sets its team's threads
 * to 1 for the convs each runs, which must not reach a plan that another
 * thread runs meanwhile. */
#define MT_Q_GRAIN (1 << 19)
static __thread int q_threads = 0;

void mt_q_set_threads(int n) { q_threads = n; }
int mt_q_threads(void) { return q_threads; }

int mt_q_team(int64_t work)
{
#ifdef _OPENMP
    int64_t n = q_threads > 0 ? q_threads : omp_get_max_threads();
#else
    int64_t n = 1;
#endif
    int64_t most = work / MT_Q_GRAIN;
    return (int)(most < 1 ? 1 : most < n ? most : n);
}

#define QB_N 16     /* output channels per packed block */
#define QB_K 4      /* k per packed group (one int32 lane of vpdpbusd) */

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

int64_t mt_qgemm_packed_size(int64_t N, int64_t K)
{
    return ceil_div(N, QB_N) * QB_N * ceil_div(K, QB_K) * QB_K;
}

/* w: int8 [N, K] row-major -> packed; wsum[n] = sum_k w[n, k]. */
void mt_qgemm_pack_s8(int64_t N, int64_t K, const int8_t *w, int8_t *packed, int32_t *wsum)
{
    int64_t KB = ceil_div(K, QB_K);
    memset(packed, 0, (size_t)mt_qgemm_packed_size(N, K));
    for (int64_t n = 0; n < N; n++) {
        int32_t s = 0;
        for (int64_t k = 0; k < K; k++) {
            int8_t v = w[n * K + k];
            packed[((n / QB_N) * KB + k / QB_K) * (QB_N * QB_K) + (n % QB_N) * QB_K + k % QB_K] = v;
            s += v;
        }
        wsum[n] = s;
    }
}

typedef struct {
    int64_t M, N, K;
    const uint8_t *a; int64_t lda; int32_t a_zp;
    const int8_t *packed; const int32_t *wsum; const int32_t *bias; const double *mult;
    int32_t out_zp, lo, hi; int out_u8;
    void *out; int64_t ldo_m, ldo_n;
    const double *corr;     /* a_zp * wsum[n] - bias[n], exact in double (VNNI epilogue) */
} qgemm_args;

static inline void store(const qgemm_args *g, int64_t m, int64_t n, int32_t dot)
{
    /* int64: a zero-point correction and a bias near the int32 ends stay exact */
    int64_t acc = (int64_t)dot;
    if (g->wsum)                    /* NULL: dot already counts the zero point (dwconv) */
        acc -= (int64_t)g->a_zp * g->wsum[n];
    if (g->bias)
        acc += g->bias[n];
    int64_t at = m * g->ldo_m + n * g->ldo_n;
    if (g->out_u8 == 2) {           /* float32 out: the dequantized accumulator */
        double f = (double)acc * g->mult[n];
        if (g->lo == 0 && f < 0)    /* ReLU */
            f = 0;
        ((float *)g->out)[at] = g->hi > 0 ? mt_q_relu6f((float)f, g->hi) : (float)f;
        return;
    }
    double v = rint((double)acc * g->mult[n]) + (double)g->out_zp;
    if (v < g->lo) v = g->lo;
    if (v > g->hi) v = g->hi;
    if (g->out_u8)
        ((uint8_t *)g->out)[at] = (uint8_t)(int32_t)v;
    else
        ((int8_t *)g->out)[at] = (int8_t)(int32_t)v;
}

/* one packed block of 16 channels for row m: portable C */
static void block_portable(const qgemm_args *g, int64_t m, int64_t nb)
{
    int64_t KB = ceil_div(g->K, QB_K);
    int32_t acc[QB_N] = {0};
    const uint8_t *a = g->a + m * g->lda;
    const int8_t *w = g->packed + nb * KB * QB_N * QB_K;
    for (int64_t kb = 0; kb < KB; kb++) {
        uint8_t av[QB_K] = {0};
        int64_t left = g->K - kb * QB_K;
        memcpy(av, a + kb * QB_K, (size_t)(left < QB_K ? left : QB_K));
        const int8_t *wk = w + kb * QB_N * QB_K;
        for (int j = 0; j < QB_N; j++)
            for (int i = 0; i < QB_K; i++)
                acc[j] += (int32_t)av[i] * (int32_t)wk[j * QB_K + i];
    }
    int64_t n0 = nb * QB_N;
    for (int j = 0; j < QB_N && n0 + j < g->N; j++)
        store(g, m, n0 + j, acc[j]);
}

#ifdef MT_Q_VNNI
__attribute__((target("avx512f,avx512bw,avx512vnni")))
static void block_vnni(const qgemm_args *g, int64_t m, int64_t nb)
{
    int64_t KB = ceil_div(g->K, QB_K), KF = g->K / QB_K;
    const uint8_t *a = g->a + m * g->lda;
    const int8_t *w = g->packed + nb * KB * QB_N * QB_K;
    __m512i acc = _mm512_setzero_si512(), acc2 = _mm512_setzero_si512();
    int64_t kb = 0;
    for (; kb + 1 < KF; kb += 2) {
        int32_t a0, a1;
        memcpy(&a0, a + kb * QB_K, 4);
        memcpy(&a1, a + (kb + 1) * QB_K, 4);
        acc = _mm512_dpbusd_epi32(acc, _mm512_set1_epi32(a0),
                                  _mm512_loadu_si512(w + kb * QB_N * QB_K));
        acc2 = _mm512_dpbusd_epi32(acc2, _mm512_set1_epi32(a1),
                                   _mm512_loadu_si512(w + (kb + 1) * QB_N * QB_K));
    }
    for (; kb < KB; kb++) {
        int32_t a0 = 0;
        int64_t left = g->K - kb * QB_K;
        memcpy(&a0, a + kb * QB_K, (size_t)(left < QB_K ? left : QB_K));
        acc = _mm512_dpbusd_epi32(acc, _mm512_set1_epi32(a0),
                                  _mm512_loadu_si512(w + kb * QB_N * QB_K));
    }
    int32_t out[QB_N];
    _mm512_storeu_si512(out, _mm512_add_epi32(acc, acc2));
    int64_t n0 = nb * QB_N;
    for (int j = 0; j < QB_N && n0 + j < g->N; j++)
        store(g, m, n0 + j, out[j]);
}

/* the epilogue of 16 channels n0.. of row m at once, where they are all
 * there and the output row is contiguous: the same double arithmetic as
 * store() (acc = dot - corr[n] is exact in double: |acc| < 2**53), so the
 * same bits. */
__attribute__((target("avx512f,avx512bw,avx512vnni,avx512vl")))
static void store16(const qgemm_args *g, int64_t m, int64_t n0, __m512i dot)
{
    if (n0 + QB_N > g->N || !g->corr) {
        int32_t v[QB_N];
        _mm512_storeu_si512(v, dot);
        for (int j = 0; j < QB_N && n0 + j < g->N; j++)
            store(g, m, n0 + j, v[j]);
        return;
    }
    __m512d d[2];
    d[0] = _mm512_cvtepi32_pd(_mm512_castsi512_si256(dot));
    d[1] = _mm512_cvtepi32_pd(_mm512_extracti64x4_epi64(dot, 1));
    int64_t at = m * g->ldo_m + n0 * g->ldo_n;
    int strided = g->ldo_n != 1;    /* conv2d's [C_out, pixels] output: lane by lane */
    for (int h = 0; h < 2; h++) {
        __m512d acc = _mm512_sub_pd(d[h], _mm512_loadu_pd(g->corr + n0 + 8 * h));
        __m512d v = _mm512_mul_pd(acc, _mm512_loadu_pd(g->mult + n0 + 8 * h));
        int64_t o = at + 8 * h * g->ldo_n;
        if (g->out_u8 == 2) {
            if (g->lo == 0)
                v = _mm512_max_pd(v, _mm512_setzero_pd());
            __m256 f = _mm512_cvtpd_ps(v);
            if (g->hi > 0)          /* mt_q_relu6f, -0 kept (vmaxps: 0 first) */
                f = _mm256_min_ps(_mm256_max_ps(_mm256_setzero_ps(), f),
                                  _mm256_set1_ps((float)g->hi));
            if (strided) {
                float t[8];
                _mm256_storeu_ps(t, f);
                for (int j = 0; j < 8; j++)
                    ((float *)g->out)[o + j * g->ldo_n] = t[j];
            } else {
                _mm256_storeu_ps((float *)g->out + o, f);
            }
            continue;
        }
        v = _mm512_add_pd(_mm512_roundscale_pd(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC),
                          _mm512_set1_pd((double)g->out_zp));
        v = _mm512_min_pd(_mm512_max_pd(v, _mm512_set1_pd((double)g->lo)),
                          _mm512_set1_pd((double)g->hi));
        __m128i b = _mm256_cvtepi32_epi8(_mm512_cvtpd_epi32(v));
        if (strided) {
            char t[16];
            _mm_storeu_si128((__m128i *)t, b);
            for (int j = 0; j < 8; j++)
                ((char *)g->out)[o + j * g->ldo_n] = t[j];
        } else {
            _mm_storel_epi64((__m128i *)((char *)g->out + o), b);
        }
    }
}

/* four rows of two packed blocks (32 channels): eight accumulators, each
 * weight vector loaded once for four vpdpbusd */
__attribute__((target("avx512f,avx512bw,avx512vnni,avx512vl")))
static void block4x2_vnni(const qgemm_args *g, int64_t m, int64_t nb)
{
    int64_t KB = ceil_div(g->K, QB_K), KF = g->K / QB_K;
    const uint8_t *a0 = g->a + m * g->lda, *a1 = a0 + g->lda, *a2 = a1 + g->lda,
                  *a3 = a2 + g->lda;
    const int8_t *w = g->packed + nb * KB * QB_N * QB_K;
    const int8_t *w2 = w + KB * QB_N * QB_K;
    __m512i c0 = _mm512_setzero_si512(), c1 = _mm512_setzero_si512(),
            c2 = _mm512_setzero_si512(), c3 = _mm512_setzero_si512();
    __m512i e0 = _mm512_setzero_si512(), e1 = _mm512_setzero_si512(),
            e2 = _mm512_setzero_si512(), e3 = _mm512_setzero_si512();
    for (int64_t kb = 0; kb < KB; kb++) {
        __m512i wv = _mm512_loadu_si512(w + kb * QB_N * QB_K);
        __m512i wv2 = _mm512_loadu_si512(w2 + kb * QB_N * QB_K);
        int32_t v0 = 0, v1 = 0, v2 = 0, v3 = 0;
        size_t take = kb < KF ? 4 : (size_t)(g->K - kb * QB_K);
        memcpy(&v0, a0 + kb * QB_K, take);
        memcpy(&v1, a1 + kb * QB_K, take);
        memcpy(&v2, a2 + kb * QB_K, take);
        memcpy(&v3, a3 + kb * QB_K, take);
        __m512i b0 = _mm512_set1_epi32(v0), b1 = _mm512_set1_epi32(v1),
                b2 = _mm512_set1_epi32(v2), b3 = _mm512_set1_epi32(v3);
        c0 = _mm512_dpbusd_epi32(c0, b0, wv);
        c1 = _mm512_dpbusd_epi32(c1, b1, wv);
        c2 = _mm512_dpbusd_epi32(c2, b2, wv);
        c3 = _mm512_dpbusd_epi32(c3, b3, wv);
        e0 = _mm512_dpbusd_epi32(e0, b0, wv2);
        e1 = _mm512_dpbusd_epi32(e1, b1, wv2);
        e2 = _mm512_dpbusd_epi32(e2, b2, wv2);
        e3 = _mm512_dpbusd_epi32(e3, b3, wv2);
    }
    int64_t n0 = nb * QB_N, n1 = n0 + QB_N;
    store16(g, m, n0, c0);
    store16(g, m + 1, n0, c1);
    store16(g, m + 2, n0, c2);
    store16(g, m + 3, n0, c3);
    store16(g, m, n1, e0);
    store16(g, m + 1, n1, e1);
    store16(g, m + 2, n1, e2);
    store16(g, m + 3, n1, e3);
}

/* four rows of one packed block: each weight vector loaded once for four
 * vpdpbusd (the one-row kernel above reloads it per row) */
__attribute__((target("avx512f,avx512bw,avx512vnni,avx512vl")))
static void block4_vnni(const qgemm_args *g, int64_t m, int64_t nb)
{
    int64_t KB = ceil_div(g->K, QB_K), KF = g->K / QB_K;
    const uint8_t *a0 = g->a + m * g->lda, *a1 = a0 + g->lda, *a2 = a1 + g->lda,
                  *a3 = a2 + g->lda;
    const int8_t *w = g->packed + nb * KB * QB_N * QB_K;
    __m512i c0 = _mm512_setzero_si512(), c1 = _mm512_setzero_si512(),
            c2 = _mm512_setzero_si512(), c3 = _mm512_setzero_si512();
    int64_t kb = 0;
    for (; kb < KF; kb++) {
        __m512i wv = _mm512_loadu_si512(w + kb * QB_N * QB_K);
        int32_t v0, v1, v2, v3;
        memcpy(&v0, a0 + kb * QB_K, 4);
        memcpy(&v1, a1 + kb * QB_K, 4);
        memcpy(&v2, a2 + kb * QB_K, 4);
        memcpy(&v3, a3 + kb * QB_K, 4);
        c0 = _mm512_dpbusd_epi32(c0, _mm512_set1_epi32(v0), wv);
        c1 = _mm512_dpbusd_epi32(c1, _mm512_set1_epi32(v1), wv);
        c2 = _mm512_dpbusd_epi32(c2, _mm512_set1_epi32(v2), wv);
        c3 = _mm512_dpbusd_epi32(c3, _mm512_set1_epi32(v3), wv);
    }
    if (kb < KB) {              /* the last, partial group of k */
        __m512i wv = _mm512_loadu_si512(w + kb * QB_N * QB_K);
        size_t left = (size_t)(g->K - kb * QB_K);
        int32_t v0 = 0, v1 = 0, v2 = 0, v3 = 0;
        memcpy(&v0, a0 + kb * QB_K, left);
        memcpy(&v1, a1 + kb * QB_K, left);
        memcpy(&v2, a2 + kb * QB_K, left);
        memcpy(&v3, a3 + kb * QB_K, left);
        c0 = _mm512_dpbusd_epi32(c0, _mm512_set1_epi32(v0), wv);
        c1 = _mm512_dpbusd_epi32(c1, _mm512_set1_epi32(v1), wv);
        c2 = _mm512_dpbusd_epi32(c2, _mm512_set1_epi32(v2), wv);
        c3 = _mm512_dpbusd_epi32(c3, _mm512_set1_epi32(v3), wv);
    }
    int64_t n0 = nb * QB_N;
    store16(g, m, n0, c0);
    store16(g, m + 1, n0, c1);
    store16(g, m + 2, n0, c2);
    store16(g, m + 3, n0, c3);
}

/* one packed block of 16 channels for row m on AVX2 without VNNI: the four
 * bytes of a and each channel's four taps widened to int16 and multiplied
 * by vpmaddwd (exact: |a w| <= 255 * 128, where vpmaddubsw's int16 pair
 * sums would saturate), lane l of accumulator q holding half of channel
 * 4 q + l / 2's dot product; the halves summed and stored as the portable
 * path does (the same integers, the same epilogue) */
__attribute__((target("avx2")))
static void block_avx2(const qgemm_args *g, int64_t m, int64_t nb)
{
    int64_t KB = ceil_div(g->K, QB_K);
    const uint8_t *a = g->a + m * g->lda;
    const int8_t *w = g->packed + nb * KB * QB_N * QB_K;
    __m256i c0 = _mm256_setzero_si256(), c1 = c0, c2 = c0, c3 = c0;
    for (int64_t kb = 0; kb < KB; kb++) {
        int32_t v = 0;
        int64_t left = g->K - kb * QB_K;
        memcpy(&v, a + kb * QB_K, (size_t)(left < QB_K ? left : QB_K));
        __m256i av = _mm256_cvtepu8_epi16(_mm_set1_epi32(v));   /* a0..a3, four times */
        const int8_t *wk = w + kb * QB_N * QB_K;
        c0 = _mm256_add_epi32(c0, _mm256_madd_epi16(av, _mm256_cvtepi8_epi16(
                 _mm_loadu_si128((const __m128i *)wk))));
        c1 = _mm256_add_epi32(c1, _mm256_madd_epi16(av, _mm256_cvtepi8_epi16(
                 _mm_loadu_si128((const __m128i *)(wk + 16)))));
        c2 = _mm256_add_epi32(c2, _mm256_madd_epi16(av, _mm256_cvtepi8_epi16(
                 _mm_loadu_si128((const __m128i *)(wk + 32)))));
        c3 = _mm256_add_epi32(c3, _mm256_madd_epi16(av, _mm256_cvtepi8_epi16(
                 _mm_loadu_si128((const __m128i *)(wk + 48)))));
    }
    int32_t half[2 * QB_N];
    _mm256_storeu_si256((__m256i *)half, c0);
    _mm256_storeu_si256((__m256i *)(half + 8), c1);
    _mm256_storeu_si256((__m256i *)(half + 16), c2);
    _mm256_storeu_si256((__m256i *)(half + 24), c3);
    int64_t n0 = nb * QB_N;
    for (int j = 0; j < QB_N && n0 + j < g->N; j++)
        store(g, m, n0 + j, half[2 * j] + half[2 * j + 1]);
}

static int has_avx2(void)
{
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2");
}

static int has_vnni(void)
{
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw")
        && __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vl");
}
#else
static int has_vnni(void) { return 0; }
static int has_avx2(void) { return 0; }
#endif

#if defined(MT_Q_VNNI) && defined(__linux__)
#define MT_Q_AMX 1
int mt_qconv_has_amx(void);     /* qconv.c: AMX-INT8 here and the tile state granted */

/* the tiles as qconv.c configures them: C 0-3 (int32 16 x 16), A 4-5, B 6-7,
 * every one 16 rows x 64 bytes */
void mt_q_amx_begin(void);      /* qconv.c */
void mt_q_amx_end(void);

/* rows m0.. and m0 + 16.. (where two) x packed blocks nb, nb + 1 (where
 * two) on AMX: tdpbusd with 16 rows of a (u8, 64 k each, read in place at
 * stride lda) as the A tile and 16 k/4 rows of a packed block (its layout is
 * the B tile's: 16 channels x 4 k per 64-byte row) as B. The int32 dots are
 * the VNNI kernels' (exact sums), then the same store16 epilogue: the same
 * bits. K is a multiple of 64 here. */
__attribute__((target("amx-tile,amx-int8,avx512f,avx512bw,avx512vnni,avx512vl")))
static void block_amx(const qgemm_args *g, int64_t m0, int two_rows, int64_t nb, int two_cols)
{
    int64_t KB = g->K / QB_K;
    const uint8_t *a0 = g->a + m0 * g->lda, *a1 = two_rows ? a0 + 16 * g->lda : a0;
    const int8_t *w0 = g->packed + nb * KB * QB_N * QB_K;
    const int8_t *w1 = two_cols ? w0 + KB * QB_N * QB_K : w0;
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (int64_t k = 0; k < g->K; k += 64) {
        _tile_loadd(4, a0 + k, g->lda);
        _tile_loadd(5, a1 + k, g->lda);
        _tile_loadd(6, w0 + (k / 4) * 64, 64);
        _tile_loadd(7, w1 + (k / 4) * 64, 64);
        _tile_dpbusd(0, 4, 6);
        _tile_dpbusd(1, 4, 7);
        _tile_dpbusd(2, 5, 6);
        _tile_dpbusd(3, 5, 7);
    }
    int32_t acc[4][256] __attribute__((aligned(64)));
    _tile_stored(0, acc[0], 64);
    _tile_stored(1, acc[1], 64);
    _tile_stored(2, acc[2], 64);
    _tile_stored(3, acc[3], 64);
    for (int r = 0; r < 1 + two_rows; r++)
        for (int c = 0; c < 1 + two_cols; c++)
            for (int i = 0; i < 16; i++)
                store16(g, m0 + 16 * r + i, (nb + c) * QB_N,
                        _mm512_load_si512(acc[r * 2 + c] + i * 16));
}

#endif

/* 1 when the VNNI path is available on this CPU (and built). */
int mt_qgemm_has_vnni(void) { return has_vnni(); }

/* path: 0 = best available, 1 = portable C, 2 = VNNI, 3 = AMX, 4 = AVX2
 * (where the CPU has it, else the next best: AMX, VNNI, AVX2, portable).
 * AMX takes the whole blocks of 16 rows when K is a multiple of 64 (the
 * rows after them run on VNNI). Returns the path used (1 portable, 2 VNNI,
 * 3 AMX, 4 AVX2). */
int mt_qgemm_u8s8(int64_t M, int64_t N, int64_t K, const uint8_t *a, int64_t lda, int32_t a_zp,
                  const int8_t *packed, const int32_t *wsum, const int32_t *bias,
                  const double *mult, int32_t out_zp, int32_t lo, int32_t hi, int out_u8,
                  void *out, int64_t ldo_m, int64_t ldo_n, int path)
{
    qgemm_args g = {M, N, K, a, lda, a_zp, packed, wsum, bias, mult, out_zp, lo, hi, out_u8,
                    out, ldo_m, ldo_n, NULL};
    int64_t NB = ceil_div(N, QB_N);
    int vnni = (path == 0 || path == 2 || path == 3) && has_vnni();
    int avx2 = !vnni && (path == 0 || path == 4) && has_avx2();
    int amx = 0;
#ifdef MT_Q_AMX
    /* 64 k per tile step, 16 rows per tile: smaller layers stay on VNNI */
    amx = vnni && (path == 0 || path == 3) && K % 64 == 0 && M >= 16 && mt_qconv_has_amx();
#endif
    double *corr = NULL;
    if (vnni && N > 0 && (corr = malloc((size_t)N * sizeof(double))) != NULL) {
        for (int64_t n = 0; n < N; n++)
            corr[n] = (double)((int64_t)a_zp * wsum[n] - (bias ? (int64_t)bias[n] : 0));
        g.corr = corr;
    }
    int nt = mt_q_team(M * N * K);
    int64_t m_amx = 0;              /* the rows AMX takes: whole blocks of 16 */
#ifdef MT_Q_AMX
    if (amx) {
        int64_t MB16 = M / 16, MP = ceil_div(MB16, 2), NP2 = ceil_div(NB, 2);
        int64_t units = MP * NP2;
        m_amx = MB16 * 16;
#pragma omp parallel num_threads(nt) if (nt > 1 && units > 1)
        {
            mt_q_amx_begin();
#pragma omp for schedule(static)
            for (int64_t i = 0; i < units; i++) {
                int64_t mp = i / NP2, nb = (i % NP2) * 2;
                block_amx(&g, mp * 32, mp * 2 + 1 < MB16, nb, nb + 1 < NB);
            }
            mt_q_amx_end();
        }
    }
#endif
    int64_t MB = ceil_div(M - m_amx, 4);    /* units of four rows x two packed blocks */
    int64_t NP = ceil_div(NB, 2);
    int64_t work = MB * NP;
#pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1 && work > 1)
    for (int64_t i = 0; i < work; i++) {
        int64_t m = m_amx + (i / NP) * 4, nb0 = (i % NP) * 2;
        int64_t rows = M - m < 4 ? M - m : 4;
        for (int64_t nb = nb0; nb < nb0 + 2 && nb < NB; nb++) {
#ifdef MT_Q_VNNI
            if (vnni) {
                if (rows == 4 && nb == nb0 && nb + 1 < NB) {
                    block4x2_vnni(&g, m, nb);
                    break;
                }
                if (rows == 4)
                    block4_vnni(&g, m, nb);
                else
                    for (int64_t r = 0; r < rows; r++)
                        block_vnni(&g, m + r, nb);
                continue;
            }
            if (avx2) {
                for (int64_t r = 0; r < rows; r++)
                    block_avx2(&g, m + r, nb);
                continue;
            }
#endif
            for (int64_t r = 0; r < rows; r++)
                block_portable(&g, m + r, nb);
        }
    }
    free(corr);
    return amx ? 3 : vnni ? 2 : avx2 ? 4 : 1;
}

/* x: uint8 [C, H, W] (one image, the channels of one group) -> cols
 * [OH * OW, C * KH * KW], outside the image the input's zero point. */
void mt_qim2col_u8(const uint8_t *x, int64_t C, int64_t H, int64_t W, int64_t KH, int64_t KW,
                   int64_t SH, int64_t SW, int64_t PH, int64_t PW, int64_t DH, int64_t DW,
                   int64_t OH, int64_t OW, uint8_t pad, uint8_t *cols)
{
    int64_t KC = C * KH * KW;
    int nt = mt_q_team(OH * OW * KC);
#pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1)
    for (int64_t oh = 0; oh < OH; oh++)
        for (int64_t ow = 0; ow < OW; ow++) {
            uint8_t *row = cols + (oh * OW + ow) * KC;
            for (int64_t c = 0; c < C; c++)
                for (int64_t i = 0; i < KH; i++) {
                    int64_t h = oh * SH - PH + i * DH;
                    for (int64_t j = 0; j < KW; j++) {
                        int64_t w = ow * SW - PW + j * DW;
                        *row++ = (h >= 0 && h < H && w >= 0 && w < W)
                            ? x[(c * H + h) * W + w] : pad;
                    }
                }
        }
}

/* ---- quantize / dequantize (mgtrace.quantization.qdtype): the package's
 * one rule, in float32 as NumPy computes it,
 *   q = clamp(rint(x / scale) + zp, lo, hi)     y = (q - zp) * scale
 * rint under the default rounding mode (round half to even). A NaN
 * saturates to lo. kind: 0 int8, 1 uint8, 2 int32 (clamped in double: the
 * int32 ends are no float32). */
static inline float q_clamp(float v, float lo, float hi)
{
    if (!(v >= lo)) v = lo;         /* NaN too */
    if (v > hi) v = hi;
    return v;
}

static void quantize_portable(const float *x, int64_t n, float scale, float zp, float lo,
                              float hi, int kind, void *out)
{
    if (kind == 2) {
        for (int64_t i = 0; i < n; i++) {
            double v = (double)(rintf(x[i] / scale) + zp);
            if (!(v >= -2147483648.0)) v = -2147483648.0;
            if (v > 2147483647.0) v = 2147483647.0;
            ((int32_t *)out)[i] = (int32_t)v;
        }
    } else if (kind == 1) {
        for (int64_t i = 0; i < n; i++)
            ((uint8_t *)out)[i] = (uint8_t)(int32_t)q_clamp(rintf(x[i] / scale) + zp, lo, hi);
    } else {
        for (int64_t i = 0; i < n; i++)
            ((int8_t *)out)[i] = (int8_t)(int32_t)q_clamp(rintf(x[i] / scale) + zp, lo, hi);
    }
}

#ifdef MT_Q_VNNI
/* x / scale for 16 lanes, correctly rounded as vdivps gives it, by the
 * product with inv (float(1 / scale), normal and finite) where that rounds
 * to the same integer: the product lies within |x / scale| 2^-23 of the
 * quotient, under 2^-12 for quotients below 1000, so where it is at least
 * 2^-11 from every half-integer both round alike; the quotient itself is
 * taken for a vector with a lane nearer (about one vector in 60 of random
 * values), and a quotient of 1000 or more in magnitude saturates both ways
 * (|zp| <= 255). vdivps alone took 16 cycles per 16 lanes:
 * MobileNetV2 input (150,528 values) 36 -> 30 us on one thread. NaN,
 * infinities and overflow give what the quotient gives (the clamp
 * after). */
__attribute__((target("avx512f,avx512dq")))
static inline __attribute__((always_inline))
__m512 q_div(__m512 x, __m512 s, __m512 inv)
{
    __m512 v = _mm512_mul_ps(x, inv);
    __m512 r = _mm512_abs_ps(_mm512_reduce_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    if (__builtin_expect(_mm512_cmp_ps_mask(r, _mm512_set1_ps(MT_Q_NEAR_TIE), _CMP_GT_OQ) != 0,
                         0))
        return _mm512_div_ps(x, s);
    return v;
}

__attribute__((target("avx512f,avx512dq")))
static void quantize_avx512(const float *x, int64_t n, float scale, float zp, float lo,
                            float hi, int kind, void *out)
{
    __m512 s = _mm512_set1_ps(scale), z = _mm512_set1_ps(zp);
    __m512 l = _mm512_set1_ps(lo), h = _mm512_set1_ps(hi);
    float invs = 1.0f / scale;
    /* the product route where 1 / scale is a normal float and the zero
     * point and bounds within 255 of 0 (q_div's conditions) */
    int fast = isfinite(invs) && fabsf(invs) >= FLT_MIN && fabsf(zp) <= 255.0f &&
               fabsf(lo) <= 255.0f && fabsf(hi) <= 255.0f;
    __m512 inv = _mm512_set1_ps(invs);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 xv = _mm512_loadu_ps(x + i);
        __m512 v = fast ? q_div(xv, s, inv) : _mm512_div_ps(xv, s);
        v = _mm512_add_ps(_mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT |
                                               _MM_FROUND_NO_EXC), z);
        v = _mm512_min_ps(_mm512_max_ps(v, l), h);      /* max(NaN, l) is l */
        __m512i q = _mm512_cvtps_epi32(v);              /* exact: integers in range */
        if (kind == 1)
            _mm_storeu_si128((__m128i *)((uint8_t *)out + i), _mm512_cvtepi32_epi8(q));
        else
            _mm_storeu_si128((__m128i *)((int8_t *)out + i), _mm512_cvtepi32_epi8(q));
    }
    if (i < n)
        quantize_portable(x + i, n - i, scale, zp, lo, hi, kind,
                          (kind == 1 ? (void *)((uint8_t *)out + i) : (void *)((int8_t *)out + i)));
}

static int has_avx512f(void)
{
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq");
}
#endif

/* [*at, *at + *len) of n elements: thread c of nt's equal share, whole vectors
 * (as many chunks as threads: MobileNetV2's 150,528-element input in 64 k
 * chunks ran two of three chunks on one thread) */
void mt_q_share(int64_t n, int64_t c, int64_t nt, int64_t *at, int64_t *len)
{
    int64_t vecs = (n + 15) / 16, a = vecs * c / nt * 16, b = vecs * (c + 1) / nt * 16;
    *at = a < n ? a : n;
    *len = (b < n ? b : n) - *at;
}

/* path: 0 best, 1 portable. */
void mt_quantize_f32(const float *x, int64_t n, float scale, float zp, float lo, float hi,
                     int kind, void *out, int path)
{
    int wide = 0;
#ifdef MT_Q_VNNI
    wide = path == 0 && kind != 2 && has_avx512f();
#endif
    size_t isz = kind == 2 ? 4 : 1;
    int64_t chunks = mt_q_team(n * MT_Q_ELEM_COST);
#pragma omp parallel for schedule(static) num_threads(chunks) if (chunks > 1)
    for (int64_t c = 0; c < chunks; c++) {
        int64_t at, len;
        mt_q_share(n, c, chunks, &at, &len);
        void *o = (char *)out + at * isz;
#ifdef MT_Q_VNNI
        if (wide) {
            quantize_avx512(x + at, len, scale, zp, lo, hi, kind, o);
            continue;
        }
#endif
        quantize_portable(x + at, len, scale, zp, lo, hi, kind, o);
    }
    (void)wide;
}

void mt_dequantize_f32(const void *q, int kind, int64_t n, float scale, float zp, float *out)
{
    int64_t chunks = mt_q_team(n * MT_Q_ELEM_COST);
#pragma omp parallel for schedule(static) num_threads(chunks) if (chunks > 1)
    for (int64_t c = 0; c < chunks; c++) {
        int64_t at, len;
        mt_q_share(n, c, chunks, &at, &len);
        int64_t end = at + len;
        if (kind == 2)
            for (int64_t i = at; i < end; i++)
                out[i] = ((float)((const int32_t *)q)[i] - zp) * scale;
        else if (kind == 1)
            for (int64_t i = at; i < end; i++)
                out[i] = ((float)((const uint8_t *)q)[i] - zp) * scale;
        else
            for (int64_t i = at; i < end; i++)
                out[i] = ((float)((const int8_t *)q)[i] - zp) * scale;
    }
}

/* ---- depthwise int8 convolution (groups == channels, one filter each):
 * direct, no im2col, the GEMM's arithmetic per output element:
 *   acc = sum_{i,j} (x[c, h, w] - a_zp) * w[c, i, j] + bias[c]   (outside
 *   the image x is a_zp, so the term is 0), then store()'s requantization.
 * x: uint8 [N, C, H, W]; out [N, C, OH, OW] of out_u8's kind. */
void mt_qdwconv_u8s8(const uint8_t *x, int64_t NB, int64_t C, int64_t H, int64_t W,
                     int32_t a_zp, const int8_t *w, int64_t KH, int64_t KW, int64_t SH,
                     int64_t SW, int64_t PH, int64_t PW, int64_t DH, int64_t DW, int64_t OH,
                     int64_t OW, const int32_t *bias, const double *mult, int32_t out_zp,
                     int32_t lo, int32_t hi, int out_u8, void *out)
{
    int64_t planes = NB * C;
    int nt = mt_q_team(planes * OH * OW * KH * KW);
#pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1)
    for (int64_t p = 0; p < planes; p++) {
        int64_t c = p % C;
        const uint8_t *xp = x + p * H * W;
        const int8_t *wc = w + c * KH * KW;
        /* one output row at a time through a qgemm_args view of the plane:
         * store() indexes out[m * ldo_m + n * ldo_n] with m the pixel, n = c */
        qgemm_args g = {0};
        g.a_zp = a_zp;
        g.wsum = NULL;
        g.bias = bias;
        g.mult = mult;
        g.out_zp = out_zp;
        g.lo = lo;
        g.hi = hi;
        g.out_u8 = out_u8;
        g.N = C;
        size_t isz = out_u8 == 2 ? 4 : 1;
        g.out = (char *)out + (size_t)((p - c) * OH * OW) * isz;   /* image p / C */
        g.ldo_m = 1;
        g.ldo_n = OH * OW;
        for (int64_t oh = 0; oh < OH; oh++)
            for (int64_t ow = 0; ow < OW; ow++) {
                int32_t acc = 0;
                for (int64_t i = 0; i < KH; i++) {
                    int64_t h = oh * SH - PH + i * DH;
                    if (h < 0 || h >= H)
                        continue;
                    for (int64_t j = 0; j < KW; j++) {
                        int64_t ww = ow * SW - PW + j * DW;
                        if (ww >= 0 && ww < W)
                            acc += ((int32_t)xp[h * W + ww] - a_zp) * (int32_t)wc[i * KW + j];
                    }
                }
                store(&g, oh * OW + ow, c, acc);
            }
    }
}
