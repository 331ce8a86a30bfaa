/* Int8 convolutions on NCHW planes with the output pixels in the vector
 * lanes (issue 32): an NCHW output row of one channel is contiguous, so the
 * requantize epilogue runs 16 pixels of one channel at once (one mult, one
 * correction) and stores them with one masked store.
 *
 *   dense / grouped: per (image, group) the input is laid out as
 *     rows [K, P] (K = C/groups * KH * KW, P = OH * OW; a 1x1 stride-1
 *     unpadded conv reads the input planes themselves, other shapes an
 *     im2col from planes padded with the zero point), packed [P / 16][K / 4]
 *     [16 pixels][4 k], the u8 operand vpdpbusd reads; each weight row
 *     (int8, K rounded up to 64 with zeros) is broadcast four k at a time.
 *     Tiles of 8 output channels (4 for a group's last four or fewer) x
 *     32 pixels (16 accumulators; 16 pixels for an odd last block), and a
 *     last block of a few pixels under deep K by row dots instead; pixels
 *     outer, each thread packing its own panels of up to 8 pixel blocks
 *     (at most 32 KB, in L1) just before every channel passes over them;
 *     channels outer where the weights are the larger (the input packed
 *     whole first, tiles split over the team). The im2col takes AVX-512
 *     VBMI where the CPU has it (one vpermb per 4 x 16 transpose).
 *   depthwise: 16 output pixels of a row per vector from the plane
 *     copied into a buffer padded with the zero point: x widened to int32
 *     lanes, vpmaddwd against the broadcast tap, or vpermb + vpdpbusd
 *     (VBMI; stride 1 and 2; other strides take qgemm.c's scalar kernel);
 *     3 x 4 taps or fewer: dw_plane_vbmi3, each input row gathered once
 *     for the three output rows that read it, straight from the unpadded
 *     plane; planes whose rows are at most 8 wide: dw_plane_flat, 16
 *     pixels a vector across row ends, gathered from the unpadded plane by
 *     indices built once per geometry.
 *   threads: mt_q_team(work) threads (qgemm.c): one per 2^19 multiply-adds,
 *     at most mgtrace's count for the call; a layer below that runs on the
 *     calling thread. A dense conv opens one parallel region per call
 *     (padding, packing and tiles are worksharing loops of it).
 *
 * The arithmetic is qgemm.c's store(), bit for bit:
 *   acc = dot - (a_zp * wsum[c] - bias[c])              (exact in double)
 *   y   = clamp(rint(acc * mult[c]) + out_zp, lo, hi)   int8 / uint8
 *   y   = (float)(acc * mult[c]), 0 for ReLU (lo == 0)  float32 (out_u8 2),
 *         then where hi > 0 the float's ReLU6 (at most hi; a ReLU6 the plan
 *         folded in)
 * where dot = sum x * w over the padded input (padding is a_zp, whose
 * terms the correction removes). The int8 / uint8 outputs take one float32
 * fma where that provably rounds alike (put16q), the double arithmetic for
 * a vector with a value too near a .5 tie. Paths: AVX-512 VNNI where the CPU has it,
 * AVX2 (the bytes widened to int16, vpmaddwd) where it has only that,
 * portable C otherwise or when asked (path 1); the integers and the double
 * arithmetic are the same on all, so the bits are. Where the CPU has AMX
 * (Sapphire Rapids and later) and Linux grants the tile state, dense convs
 * run on it instead: tdpbsud with the weight rows as the signed A tile
 * (16 channels x 64 k) and the packed input as the unsigned B tile (16 k/4
 * rows x 16 pixels x 4), 32 channels x 32 pixels per step, the same
 * integers into the same epilogue.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "qround.h"
#include "qteam.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(MT_NO_CLONES)
#include <immintrin.h>
#define MT_QC_VNNI 1
#endif
#if defined(__SSE2__)
#include <emmintrin.h>
#endif
#if defined(MT_QC_VNNI) && defined(__linux__)
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#define MT_QC_AMX 1
#endif

int mt_qgemm_has_vnni(void);    /* qgemm.c */

#define QC_P 16                 /* pixels per packed block (one zmm of int32) */
#define QC_R 8                  /* output channels per tile (AMX aside) */

static int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* one output element: qgemm.c's store() */
static inline void put1(void *out, int64_t at, int out_u8, double acc, double mult,
                        int32_t out_zp, int32_t lo, int32_t hi)
{
    if (out_u8 == 2) {
        double f = acc * mult;
        if (lo == 0 && f < 0)
            f = 0;
        ((float *)out)[at] = hi > 0 ? mt_q_relu6f((float)f, hi) : (float)f;
        return;
    }
    double v = rint(acc * mult) + (double)out_zp;
    if (v < lo) v = lo;
    if (v > hi) v = hi;
    if (out_u8)
        ((uint8_t *)out)[at] = (uint8_t)(int32_t)v;
    else
        ((int8_t *)out)[at] = (int8_t)(int32_t)v;
}

/* 1 where put16i's bounds hold for a channel of correction corr and
 * multiplier mult whose dots all lie within dmax of 0 (K 255 128 for K
 * products of a u8 and an s8): dot - corr fits int32, and (dot - corr)
 * mult and the zero point after it stay inside the int32 the conversion
 * and the clamp take (a margin for the bound's own rounding; NaN fails) */
static inline int put16i_ok(double dmax, double corr, double mult, int out_u8, int32_t out_zp)
{
    double span = dmax + fabs(corr);
    return span < 2147483647.0 - 1024 &&
           (out_u8 == 2 || span * fabs(mult) + fabs((double)out_zp) < 2147483647.0 - 1024);
}

/* 1 where put16q may take the float32 route for a channel of multiplier
 * mult (int8 / uint8 outputs, put16i_ok already holding): mult and
 * float(mult) normal and moderate, the zero point and the bounds within
 * 256 of 0 (so that a value past 1024 in magnitude saturates both ways) */
static inline int put16q_ok(double mult, int out_u8, int32_t out_zp, int32_t lo, int32_t hi)
{
    double m = fabs(mult);
    return out_u8 != 2 && m >= 1e-30 && m <= 1e30 && abs(out_zp) <= 256 && abs(lo) <= 256 &&
           abs(hi) <= 256;
}

/* 1 where put16q runs here (AVX-512 DQ's vreduceps; every VNNI CPU has it) */
static int has_dq(void)
{
#ifdef MT_QC_VNNI
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512dq");
#else
    return 0;
#endif
}

#ifdef MT_QC_VNNI
/* mt_q_relu6f on 16 lanes (-0 kept: vmaxps gives its second operand where
 * both are zeros, so 0 first) */
__attribute__((target("avx512f")))
static inline __attribute__((always_inline))
__m512 relu6_ps(__m512 f, int32_t hi)
{
    return _mm512_min_ps(_mm512_max_ps(_mm512_setzero_ps(), f), _mm512_set1_ps((float)hi));
}

/* the float32 outputs (out_u8 2) of put16 and put16i: acc * mult for 16
 * lanes as two halves of doubles, ReLU where lo is 0, then where hi is over
 * 0 relu6_ps of the float, masked store */
__attribute__((target("avx512f,avx512bw,avx512vl")))
static inline __attribute__((always_inline))
void put16_f32(void *out, int64_t at, __mmask16 m, __m512d d0, __m512d d1, int32_t lo,
               int32_t hi)
{
    if (lo == 0) {
        d0 = _mm512_max_pd(d0, _mm512_setzero_pd());
        d1 = _mm512_max_pd(d1, _mm512_setzero_pd());
    }
    __m512 f = _mm512_castpd_ps(_mm512_insertf64x4(
        _mm512_castpd256_pd512(_mm256_castps_pd(_mm512_cvtpd_ps(d0))),
        _mm256_castps_pd(_mm512_cvtpd_ps(d1)), 1));
    if (hi > 0)
        f = relu6_ps(f, hi);
    _mm512_mask_storeu_ps((float *)out + at, m, f);
}

/* n (<= 16) consecutive outputs out[at..] of one channel from the int32
 * dots in `dot`: put1's arithmetic eight lanes of double at a time */
__attribute__((target("avx512f,avx512bw,avx512vl")))
static inline __attribute__((always_inline))
void put16(void *out, int64_t at, int n, __m512i dot, double corr, double mult, int out_u8,
           int32_t out_zp, int32_t lo, int32_t hi)
{
    __mmask16 m = n >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << n) - 1);
    __m512d c = _mm512_set1_pd(corr), k = _mm512_set1_pd(mult);
    __m512d d0 = _mm512_mul_pd(_mm512_sub_pd(
        _mm512_cvtepi32_pd(_mm512_castsi512_si256(dot)), c), k);
    __m512d d1 = _mm512_mul_pd(_mm512_sub_pd(
        _mm512_cvtepi32_pd(_mm512_extracti64x4_epi64(dot, 1)), c), k);
    if (out_u8 == 2) {
        put16_f32(out, at, m, d0, d1, lo, hi);
        return;
    }
    /* clamp(rint(v) + zp, lo, hi) is rint(clamp(v, lo - zp, hi - zp)) + zp:
     * rint is monotone and the bounds are integers. The clamp first lets the
     * conversion round (to nearest even, whatever MXCSR says) and the zero
     * point be one integer add: two operations fewer than rounding, adding
     * and clamping in double, the same integers. */
    __m512d l = _mm512_set1_pd((double)lo - (double)out_zp),
            h = _mm512_set1_pd((double)hi - (double)out_zp);
    d0 = _mm512_min_pd(_mm512_max_pd(d0, l), h);
    d1 = _mm512_min_pd(_mm512_max_pd(d1, l), h);
    __m512i v = _mm512_inserti64x4(
        _mm512_castsi256_si512(_mm512_cvt_roundpd_epi32(d0, _MM_FROUND_TO_NEAREST_INT |
                                                             _MM_FROUND_NO_EXC)),
        _mm512_cvt_roundpd_epi32(d1, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), 1);
    v = _mm512_add_epi32(v, _mm512_set1_epi32(out_zp));
    /* in range after the clamp: the low byte is the int8 or uint8 value */
    _mm512_mask_cvtepi32_storeu_epi8((char *)out + at, m, v);
}

/* put16's outputs where the caller has checked that no int32 overflows
 * (mt_qconv_u8s8: |dot - corr| and |(dot - corr) * mult| + |out_zp| under
 * 2^31 for every dot the layer can reach): dot - corr subtracted once in
 * int32 (16 lanes) instead of twice in double, rint(v) converted first and
 * then clamped with the zero point in int32 (v is in range, so the
 * conversion is rint's integer): clamp(rint(v) + zp, lo, hi) as defined,
 * three operations on 16 lanes where put16 spends six on 8. The same
 * bits; zp, lo, hi broadcast by the caller once per tile. */
__attribute__((target("avx512f,avx512bw,avx512vl")))
static inline __attribute__((always_inline))
void put16i(void *out, int64_t at, __mmask16 m, __m512i dot, int32_t corr, double mult,
            int out_u8, int32_t lo, __m512i zpv, __m512i lov, __m512i hiv)
{
    __m512i a = _mm512_sub_epi32(dot, _mm512_set1_epi32(corr));
    __m512d k = _mm512_set1_pd(mult);
    __m512d d0 = _mm512_mul_pd(_mm512_cvtepi32_pd(_mm512_castsi512_si256(a)), k);
    __m512d d1 = _mm512_mul_pd(_mm512_cvtepi32_pd(_mm512_extracti64x4_epi64(a, 1)), k);
    if (out_u8 == 2) {          /* hi: hiv's lanes */
        put16_f32(out, at, m, d0, d1, lo, _mm_cvtsi128_si32(_mm512_castsi512_si128(hiv)));
        return;
    }
    /* rint by the sum with 1.5 2^52 (rounded to nearest even whatever
     * MXCSR says): its ulp is 1 for |v| < 2^51, so the sum is 1.5 2^52 +
     * rint(v) exactly (the constant's mantissa even: the same ties), and
     * its low 32 bits are rint(v) as int32 for |v| < 2^31; one permute
     * gathers the 16 of them, where two conversions and an insert cost
     * ~13% more of the epilogue (3.31 -> 2.87 ns per 16 outputs) */
    const __m512d magic = _mm512_set1_pd(6755399441055744.0);
    __m512i e0 = _mm512_castpd_si512(_mm512_add_round_pd(d0, magic, _MM_FROUND_TO_NEAREST_INT |
                                                                    _MM_FROUND_NO_EXC));
    __m512i e1 = _mm512_castpd_si512(_mm512_add_round_pd(d1, magic, _MM_FROUND_TO_NEAREST_INT |
                                                                    _MM_FROUND_NO_EXC));
    __m512i v = _mm512_permutex2var_epi32(
        e0, _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30), e1);
    v = _mm512_min_epi32(_mm512_max_epi32(_mm512_add_epi32(v, zpv), lov), hiv);
    _mm512_mask_cvtepi32_storeu_epi8((char *)out + at, m, v);
}

/* put16i's int8 / uint8 outputs through float32 where that is exact: u =
 * fma(float(dot - corr), float(mult), zp) rounded once (multf: float(mult)
 * in every lane, broadcast by the caller from memory: a load, where a
 * conversion and a broadcast per call took a vector port), clamped to [lo, hi]
 * and converted to the nearest integer. Against put16i's double
 * (dot - corr) mult: for |(dot - corr) mult| <= 1024 the two differ by at
 * most 1024 (2 2^-24 + 2^-48) + 1280 2^-24 + 1024 2^-53 < 2.0e-4 (the
 * conversion of dot - corr and of mult, the fma's one rounding, the double
 * product's), so where u lies at least 2^-11 from every half-integer both
 * round to the same integer and clamp alike; beyond 1024 both saturate at
 * the same end (|zp|, |lo|, |hi| <= 256: put16q_ok). A vector with a lane
 * of the clamped u within 2^-11 of a half-integer (clamped lanes are
 * integers: never) is redone by put16i: about one vector in 60 of random
 * values, every one of exact ties. Three to five operations of 512 bits fewer
 * than put16i's (no double halves, no permute, the zero point in the fma). Needs AVX-512 DQ (vreduceps). */
__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq")))
static inline __attribute__((always_inline))
void put16q(void *out, int64_t at, __mmask16 m, __m512i dot, int32_t corr, __m512 multf,
            double mult, int out_u8, int32_t lo, __m512i zpv, __m512i lov, __m512i hiv,
            __m512 zpf, __m512 lof, __m512 hif)
{
    __m512i a = _mm512_sub_epi32(dot, _mm512_set1_epi32(corr));
    __m512 u = _mm512_fmadd_round_ps(
        _mm512_cvt_roundepi32_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC),
        multf, zpf, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    u = _mm512_min_ps(_mm512_max_ps(u, lof), hif);
    /* u - rint(u), within 2^-11 of +-0.5: too near a tie to trust */
    __m512 r = _mm512_abs_ps(_mm512_reduce_ps(u, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    if (__builtin_expect(_mm512_mask_cmp_ps_mask(m, r, _mm512_set1_ps(MT_Q_NEAR_TIE),
                                                 _CMP_GT_OQ) != 0, 0)) {
        put16i(out, at, m, dot, corr, mult, out_u8, lo, zpv, lov, hiv);
        return;
    }
    __m512i v = _mm512_cvt_roundps_epi32(u, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm512_mask_cvtepi32_storeu_epi8((char *)out + at, m, v);
}

/* put16q's u for put16s and its kin: (dot - corr) float(mult) + zps,
 * rounded once */
__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq")))
static inline __attribute__((always_inline))
__m512 s_u(__m512i dot, int32_t corr, __m512 multf, __m512 zps)
{
    return _mm512_fmadd_round_ps(
        _mm512_cvt_roundepi32_ps(_mm512_sub_epi32(dot, _mm512_set1_epi32(corr)),
                                 _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC),
        multf, zps, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}

/* put16q where [lo, hi] is the whole output type (uint8 [0, 255], int8
 * [-128, 127]: a uint8 layer with or without a ReLU, whose lo is its zero
 * point, 0 after a ReLU; an int8 one without): the clamp is the down
 * conversion's signed saturation (vpmovsdb), uint8 shifted by 128 into int8
 * in the fma (zps: zp - 128) and back by flipping each byte's top bit, so
 * no float min / max. The tie check sees the unclamped u: a lane past the
 * type near a half-integer is redone by put16i too (rare; the same bits).
 * The bound of put16q's proof holds: |zps| <= 128 (0 <= zp <= 255), and a
 * value past 1024 in magnitude saturates both ways (put16i_ok keeps |u|
 * under 2^31, where the conversion is exact). flip: 0x80 in every byte
 * for uint8, else 0, broadcast by the caller once (32 bytes: put32s's
 * too). */
__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq")))
static inline __attribute__((always_inline))
void put16s(void *out, int64_t at, __mmask16 m, __m512i dot, int32_t corr, __m512 multf,
            double mult, int out_u8, int32_t lo, __m512i zpv, __m512i lov, __m512i hiv,
            __m512 zps, __m256i flip)
{
    __m512 u = s_u(dot, corr, multf, zps);
    __m512 r = _mm512_abs_ps(_mm512_reduce_ps(u, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    if (__builtin_expect(_mm512_mask_cmp_ps_mask(m, r, _mm512_set1_ps(MT_Q_NEAR_TIE),
                                                 _CMP_GT_OQ) != 0, 0)) {
        put16i(out, at, m, dot, corr, mult, out_u8, lo, zpv, lov, hiv);
        return;
    }
    __m128i b = _mm512_cvtsepi32_epi8(
        _mm512_cvt_roundps_epi32(u, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    _mm_mask_storeu_epi8((char *)out + at, m, _mm_xor_si128(b, _mm256_castsi256_si128(flip)));
}

/* put16s for two vectors of outputs: their u (s_u), one tie check
 * for both (vrangeps takes the larger |u - rint(u)| of each lane pair,
 * where two vpandd and two compares did: 1 where a lane of mask m in
 * either lies too near a tie), and one down conversion of the 32 (vpackssdw
 * and vpacksswb saturate int32 to int8 as vpmovsdb does, the 128-bit
 * lanes' interleave undone by one vpermd; two vpmovsdb took two uops
 * each): bytes 0-15 u0's, 16-31 u1's, top bits flipped by flip */
__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq")))
static inline __attribute__((always_inline))
int s_ties2(__m512 u0, __m512 u1, __mmask16 m)
{
    /* imm 0xB: the larger magnitude, sign cleared */
    __m512 r = _mm512_range_ps(
        _mm512_reduce_ps(u0, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC),
        _mm512_reduce_ps(u1, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), 0xB);
    return _mm512_mask_cmp_ps_mask(m, r, _mm512_set1_ps(MT_Q_NEAR_TIE), _CMP_GT_OQ) != 0;
}

__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq")))
static inline __attribute__((always_inline))
__m256i s_pack2(__m512 u0, __m512 u1, __m256i flip)
{
    __m512i w = _mm512_packs_epi32(
        _mm512_cvt_roundps_epi32(u0, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC),
        _mm512_cvt_roundps_epi32(u1, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    /* 128-bit lane k: dword 0 u0's outputs 4k..4k+3, dword 1 u1's */
    __m512i b = _mm512_packs_epi16(w, w);
    __m256i v = _mm512_castsi512_si256(_mm512_permutexvar_epi32(
        _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 0, 0, 0, 0, 0, 0, 0, 0), b));
    return _mm256_xor_si256(v, flip);
}

/* put16s for two vectors of one channel's outputs, pixels at .. at + 15
 * (mask m0) and at + 16 .. at + 31 (m1), one 32-byte store; a tie in
 * either redoes both by put16i (a lane past m1 can only add a needless
 * redo) */
__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq")))
static inline __attribute__((always_inline))
void put32s(void *out, int64_t at, __mmask16 m0, __mmask16 m1, __m512i d0, __m512i d1,
            int32_t corr, __m512 multf, double mult, int out_u8, int32_t lo, __m512i zpv,
            __m512i lov, __m512i hiv, __m512 zps, __m256i flip)
{
    __m512 u0 = s_u(d0, corr, multf, zps), u1 = s_u(d1, corr, multf, zps);
    if (__builtin_expect(s_ties2(u0, u1, m0), 0)) {
        put16i(out, at, m0, d0, corr, mult, out_u8, lo, zpv, lov, hiv);
        if (m1)
            put16i(out, at + 16, m1, d1, corr, mult, out_u8, lo, zpv, lov, hiv);
        return;
    }
    _mm256_mask_storeu_epi8((char *)out + at, (__mmask32)m0 | ((__mmask32)m1 << 16),
                            s_pack2(u0, u1, flip));
}

/* put16s for two vectors of n (<= 16) outputs each, at out0 and out1 (two
 * rows of a depthwise plane) */
__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq")))
static inline __attribute__((always_inline))
void put2x16s(void *out0, void *out1, __mmask16 m, __m512i d0, __m512i d1, __m512 multf,
              double mult, int out_u8, int32_t lo, __m512i zpv, __m512i lov, __m512i hiv,
              __m512 zps, __m256i flip)
{
    __m512 u0 = s_u(d0, 0, multf, zps), u1 = s_u(d1, 0, multf, zps);
    if (__builtin_expect(s_ties2(u0, u1, m), 0)) {
        put16i(out0, 0, m, d0, 0, mult, out_u8, lo, zpv, lov, hiv);
        put16i(out1, 0, m, d1, 0, mult, out_u8, lo, zpv, lov, hiv);
        return;
    }
    __m256i v = s_pack2(u0, u1, flip);
    _mm_mask_storeu_epi8(out0, m, _mm256_castsi256_si128(v));
    _mm_mask_storeu_epi8(out1, m, _mm256_extracti128_si256(v, 1));
}

/* 1 where put16s serves an int8 / uint8 output of bounds [lo, hi] */
static inline int put16s_ok(int out_u8, int32_t lo, int32_t hi)
{
    return (out_u8 == 1 && lo == 0 && hi == 255) || (out_u8 == 0 && lo == -128 && hi == 127);
}

/* A call's epilogue: its bounds broadcast once (put16i's and put16q's
 * vectors) and which of the three stores its checks allow */
typedef struct {
    int out_u8;
    int32_t out_zp, lo, hi;
    int qf, iep;                /* put16q (put16q_ok and DQ), else put16i (put16i_ok), else put16 */
    int sat;                    /* put16s for put16q (put16s_ok) */
    __m512i zpv, lov, hiv;
    __m512 zpf, lof, hif, zps;
    __m256i flip;               /* put16s's */
} qc_ep;

__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq")))
static inline __attribute__((always_inline))
qc_ep qc_ep_make(int out_u8, int32_t out_zp, int32_t lo, int32_t hi, int qf, int iep)
{
    qc_ep e = {out_u8, out_zp, lo, hi, qf, iep, put16s_ok(out_u8, lo, hi),
               _mm512_set1_epi32(out_zp), _mm512_set1_epi32(lo), _mm512_set1_epi32(hi),
               _mm512_set1_ps((float)out_zp), _mm512_set1_ps((float)lo), _mm512_set1_ps((float)hi),
               _mm512_set1_ps((float)(out_zp - (out_u8 == 1 ? 128 : 0))),
               _mm256_set1_epi8(out_u8 == 1 ? (char)0x80 : 0)};
    return e;
}

/* the first n (1-16) outputs from at by e's store: corr as a double
 * (put16) and as an int32 (put16i, put16q: where e->iep, the caller has
 * checked that it fits), multf float(mult) in every lane (put16q) */
__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq")))
static inline __attribute__((always_inline))
void qc_ep_put(const qc_ep *e, void *out, int64_t at, int n, __m512i dot, double corr,
               int32_t icorr, __m512 multf, double mult)
{
    __mmask16 m = n >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << n) - 1);
    if (e->qf && e->sat)
        put16s(out, at, m, dot, icorr, multf, mult, e->out_u8, e->lo, e->zpv, e->lov, e->hiv,
               e->zps, e->flip);
    else if (e->qf)
        put16q(out, at, m, dot, icorr, multf, mult, e->out_u8, e->lo, e->zpv, e->lov, e->hiv,
               e->zpf, e->lof, e->hif);
    else if (e->iep)
        put16i(out, at, m, dot, icorr, mult, e->out_u8, e->lo, e->zpv, e->lov, e->hiv);
    else
        put16(out, at, n, dot, corr, mult, e->out_u8, e->out_zp, e->lo, e->hi);
}
#endif

/* ---- dense / grouped ---------------------------------------------------- */

#ifdef MT_QC_VNNI
/* the plane xs [H][W] into buf [HP][WP] inside a border of zp: 64-byte
 * fills and masked copies (a small plane's rows are a few bytes: libc's
 * memset / memcpy calls per row cost more than the kernel). The depthwise
 * kernels' and, where the CPU has AVX-512 BW (pad_planes' avx512), the
 * dense convs': three libc calls a row cost ResNet-18's 3x3 layers 10 us
 * each (2-5%), on the calling thread alone where it packs before the team */
__attribute__((target("avx512f,avx512bw")))
static void pad_plane_avx512(uint8_t *buf, const uint8_t *xs, int64_t H, int64_t W, int64_t PH,
                             int64_t PW, int64_t HP, int64_t WP, uint8_t zp)
{
    __m512i z = _mm512_set1_epi8((char)zp);
    for (int64_t r = 0; r < HP; r++) {
        uint8_t *d = buf + r * WP;
        for (int64_t at = 0; at < WP; at += 64) {
            int64_t n = WP - at < 64 ? WP - at : 64;
            _mm512_mask_storeu_epi8(d + at, n == 64 ? ~(__mmask64)0 : (((__mmask64)1 << n) - 1), z);
        }
        int64_t h = r - PH;
        if (h < 0 || h >= H)
            continue;
        for (int64_t at = 0; at < W; at += 64) {
            int64_t n = W - at < 64 ? W - at : 64;
            __mmask64 m = n == 64 ? ~(__mmask64)0 : (((__mmask64)1 << n) - 1);
            _mm512_mask_storeu_epi8(d + PW + at, m, _mm512_maskz_loadu_epi8(m, xs + h * W + at));
        }
    }
}
#endif

/* x: uint8 [C, H, W] (one image, one group's channels) -> xp [C][HP][WP],
 * the image inside a border of the zero point (HP = H + 2 PH, WP = W + 2 PW);
 * avx512: the caller's pack_vbmi_ok() (AVX-512 BW), pad_plane_avx512 per plane */
static void pad_planes(const uint8_t *x, int64_t C, int64_t H, int64_t W, int64_t PH,
                       int64_t PW, uint8_t pad, uint8_t *xp, int avx512)
{
    int64_t HP = H + 2 * PH, WP = W + 2 * PW;
#pragma omp for schedule(static)
    for (int64_t c = 0; c < C; c++) {
        uint8_t *d = xp + c * HP * WP;
#ifdef MT_QC_VNNI
        if (avx512) {           /* the depthwise kernels' padding: no libc call per row */
            pad_plane_avx512(d, x + c * H * W, H, W, PH, PW, HP, WP, pad);
            continue;
        }
#endif
        (void)avx512;
        memset(d, pad, (size_t)(PH * WP));
        for (int64_t h = 0; h < H; h++) {
            uint8_t *r = d + (PH + h) * WP;
            memset(r, pad, (size_t)PW);
            memcpy(r + PW, x + (c * H + h) * W, (size_t)W);
            memset(r + PW + W, pad, (size_t)PW);
        }
        memset(d + (PH + H) * WP, pad, (size_t)(PH * WP));
    }
}

/* the im2col of the padded planes xp straight into packed [PB][KQ][16][4]
 * (zeros past K and P): k = (c, i, j) reads xp at koff[k] = c HP WP + i DH WP
 * + j DW, output pixel (oh, ow) adds oh SH WP + ow SW. Sixteen pixels of
 * one output row are 16 bytes of one row of xp (stride 1) or the even bytes
 * of 32 (stride 2): four such loads and a 4 x 16 transpose per 64 bytes;
 * blocks across two output rows or other strides gather byte by byte. */
static void pack_im2col_sse(const uint8_t *xp, const int64_t *koff, int64_t K, int64_t OW,
                            int64_t SH, int64_t SW, int64_t WP, int64_t P, int64_t KQ,
                            int64_t pb, uint8_t *dst)
{
    int64_t p0 = pb * QC_P, np = P - p0 < QC_P ? P - p0 : QC_P;
    int64_t poff[QC_P];
    for (int64_t t = 0; t < QC_P; t++) {
        int64_t p = p0 + (t < np ? t : 0);
        poff[t] = (p / OW) * SH * WP + (p % OW) * SW;
    }
    /* the block's runs of pixels within one output row: lane t of run u
     * reads soff[u] + t SW (t0[u] <= t < t0[u + 1]); up to 4 runs take the
     * vector path (a 16-pixel block over rows of 7 or more) */
    int64_t soff[4];
    int runs = 0, t0[5];
    if (np == QC_P)
        for (int64_t t = 0; t < QC_P && runs <= 4; t++)
            if (t == 0 || poff[t] != poff[t - 1] + SW) {
                if (runs < 4) {
                    t0[runs] = (int)t;
                    soff[runs] = poff[t] - t * SW;
                }
                runs++;
            }
    int vec = runs >= 1 && runs <= 4 && (SW == 1 || SW == 2);
#if defined(__SSE2__)
    __m128i lanes[4];           /* each run's lanes */
    if (vec && runs > 1) {
        t0[runs] = QC_P;
        __m128i lane = _mm_setr_epi8(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
        for (int u = 0; u < runs; u++)
            lanes[u] = _mm_and_si128(_mm_cmpgt_epi8(lane, _mm_set1_epi8((char)(t0[u] - 1))),
                                     _mm_cmplt_epi8(lane, _mm_set1_epi8((char)t0[u + 1])));
    }
#endif
    for (int64_t kq = 0; kq < KQ; kq++) {
        uint8_t *d = dst + kq * (QC_P * 4);
#if defined(__SSE2__)
        if (vec && kq * 4 + 4 <= K) {
            __m128i r[4], m = _mm_set1_epi16(0xFF);
            for (int q = 0; q < 4; q++) {
                const uint8_t *base = xp + koff[kq * 4 + q];
                if (runs == 1) {
                    const uint8_t *s = base + soff[0];
                    r[q] = SW == 1 ? _mm_loadu_si128((const __m128i *)s)
                        : _mm_packus_epi16(
                            _mm_and_si128(_mm_loadu_si128((const __m128i *)s), m),
                            _mm_and_si128(_mm_loadu_si128((const __m128i *)(s + 16)), m));
                    continue;
                }
                /* reads before a run's first lane land in the row above or
                 * in the packed buffer before xp (inside the scratch) and
                 * are masked away */
                __m128i acc = _mm_setzero_si128();
                for (int u = 0; u < runs; u++) {
                    const uint8_t *s = base + soff[u];
                    __m128i v = SW == 1 ? _mm_loadu_si128((const __m128i *)s)
                        : _mm_packus_epi16(
                            _mm_and_si128(_mm_loadu_si128((const __m128i *)s), m),
                            _mm_and_si128(_mm_loadu_si128((const __m128i *)(s + 16)), m));
                    acc = _mm_or_si128(acc, _mm_and_si128(lanes[u], v));
                }
                r[q] = acc;
            }
            __m128i a = _mm_unpacklo_epi8(r[0], r[1]), b = _mm_unpackhi_epi8(r[0], r[1]);
            __m128i c = _mm_unpacklo_epi8(r[2], r[3]), e = _mm_unpackhi_epi8(r[2], r[3]);
            _mm_storeu_si128((__m128i *)d, _mm_unpacklo_epi16(a, c));
            _mm_storeu_si128((__m128i *)(d + 16), _mm_unpackhi_epi16(a, c));
            _mm_storeu_si128((__m128i *)(d + 32), _mm_unpacklo_epi16(b, e));
            _mm_storeu_si128((__m128i *)(d + 48), _mm_unpackhi_epi16(b, e));
            continue;
        }
#endif
        for (int q = 0; q < 4; q++) {
            int64_t k = kq * 4 + q;
            const uint8_t *s = k < K ? xp + koff[k] : NULL;
            for (int64_t t = 0; t < QC_P; t++)
                d[t * 4 + q] = s && t < np ? s[poff[t]] : 0;
        }
    }
}

#ifdef MT_QC_VNNI
/* pack_im2col_sse's block with AVX-512 VBMI: each k's 16 pixels are one
 * 16-byte load (stride 1) or one 32-byte load where they lie within 32
 * bytes (stride 2 in one row, stride 1 over rows whose padding gaps are
 * small), two such loads where they lie in two runs of 32 bytes each
 * (stride 2 over two rows), other blocks a masked load per run (no
 * bytes read outside the runs), and the 4 x 16 transpose of four k is one vpermb
 * (stride 2: one vpermt2b that also drops the odd bytes) and one 64-byte
 * store, where SSE2 spends up to 32 operations. The same bytes. */
/* 32 bytes from p in the low half, 32 from q in the high half */
__attribute__((target("avx512f")))
static inline __m512i load2x32(const uint8_t *p, const uint8_t *q)
{
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)p)),
                              _mm256_loadu_si256((const __m256i *)q), 1);
}

__attribute__((target("avx512f,avx512bw,avx512vl,avx512vbmi")))
static void pack_im2col_vbmi(const uint8_t *xp, const int64_t *koff, int64_t K, int64_t OW,
                             int64_t SH, int64_t SW, int64_t WP, int64_t P, int64_t KQ,
                             int64_t pb, uint8_t *dst)
{
    int64_t p0 = pb * QC_P, np = P - p0 < QC_P ? P - p0 : QC_P;
    int64_t poff[QC_P], soff[QC_P];
    __mmask32 mk[QC_P];         /* each run's lanes: bit t (stride 1) or 2t (stride 2) */
    int runs = 0;
    /* one division per block, where two per pixel were 20-40% of the stem
     * conv's packing (3 -> 32, stride 2, 112x112 outputs) */
    for (int64_t t = 0, oh = p0 / OW, ow = p0 % OW; t < QC_P; t++) {
        poff[t] = t < np ? oh * SH * WP + ow * SW : poff[0];
        if (++ow == OW) {
            ow = 0;
            oh++;
        }
    }
    for (int64_t t = 0; t < np; t++) {
        if (t == 0 || poff[t] != poff[t - 1] + SW) {
            soff[runs] = poff[t] - t * SW;
            mk[runs++] = 0;
        }
        mk[runs - 1] |= (__mmask32)1 << (t * SW);
    }
    int64_t mk1_t0 = 0;         /* the first lane of the second run */
    if (runs >= 2)
        while (!(mk[1] >> (mk1_t0 * SW) & 1))
            mk1_t0++;
    uint8_t ix[64];
    for (int t = 0; t < QC_P; t++)
        for (int q = 0; q < 4; q++)     /* stride 1: row q at bytes 16q; 2: at 32q */
            ix[t * 4 + q] = (uint8_t)(SW == 1 ? q * 16 + t : q * 32 + 2 * t);
    __m512i idx = _mm512_loadu_si512(ix), idx0 = idx;
    int64_t full = K / 4 < KQ ? K / 4 : KQ;     /* kq with all four k real */
    int64_t kq = 0;
    if (runs == 1 && np == QC_P && SW == 1)     /* one output row: plain loads */
        for (; kq < full; kq++) {
            const uint8_t *s0 = xp + soff[0];
            const int64_t *ko = koff + kq * 4;
            __m512i v = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)(s0 + ko[0])));
            v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(s0 + ko[1])), 1);
            v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(s0 + ko[2])), 2);
            v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(s0 + ko[3])), 3);
            _mm512_storeu_si512(dst + kq * (QC_P * 4), _mm512_permutexvar_epi8(idx, v));
        }
    else if (np == QC_P && poff[QC_P - 1] - poff[0] < 32) {
        /* the block's 16 pixels inside 32 bytes from its first: one
         * 32-byte load per k and one vpermt2b whose index picks each
         * pixel's byte (stride 2 in one row: the even bytes; stride 1 over
         * 2 or 3 output rows: the bytes across each row's gap of padding,
         * where the masked loads below spend 8 or 12 loads per 4 k) */
        uint8_t iw[64];
        for (int t = 0; t < QC_P; t++)
            for (int q = 0; q < 4; q++)
                iw[t * 4 + q] = (uint8_t)(q * 32 + (poff[t] - poff[0]));
        idx = _mm512_loadu_si512(iw);
        for (; kq < full; kq++) {
            const uint8_t *s0 = xp + poff[0];
            const int64_t *ko = koff + kq * 4;
            __m512i a = load2x32(s0 + ko[0], s0 + ko[1]);
            __m512i b = load2x32(s0 + ko[2], s0 + ko[3]);
            _mm512_storeu_si512(dst + kq * (QC_P * 4), _mm512_permutex2var_epi8(a, idx, b));
        }
    } else if (np == QC_P && runs == 2 && poff[QC_P - 1] - poff[mk1_t0] < 32 &&
               poff[mk1_t0 - 1] - poff[0] < 32) {
        /* two runs, each within 32 bytes of its first pixel (stride 2 over
         * two output rows, whose gap is a whole row): per pair of k one
         * 32-byte load per run and k, two vpermt2b (k0 k1, k2 k3) whose
         * index takes each pixel from its run's window, and one blend:
         * plain loads, where the masked ones below (8 per 4 k) cost more
         * on Zen 4 than the loads and two permutes */
        int64_t t1 = mk1_t0, o1 = poff[t1];
        uint8_t iw[64];
        for (int t = 0; t < QC_P; t++)
            for (int q = 0; q < 4; q++)
                iw[t * 4 + q] = (uint8_t)((t < t1 ? poff[t] - poff[0] : 64 + poff[t] - o1) +
                                          (q % 2) * 32);
        idx = _mm512_loadu_si512(iw);
        const __mmask64 hi2 = 0xCCCCCCCCCCCCCCCCull;     /* bytes q = 2, 3 of each pixel */
        for (; kq < full; kq++) {
            const uint8_t *sa = xp + poff[0], *sb = xp + o1;
            const int64_t *ko = koff + kq * 4;
            __m512i a01 = load2x32(sa + ko[0], sa + ko[1]);
            __m512i b01 = load2x32(sb + ko[0], sb + ko[1]);
            __m512i a23 = load2x32(sa + ko[2], sa + ko[3]);
            __m512i b23 = load2x32(sb + ko[2], sb + ko[3]);
            __m512i lo = _mm512_permutex2var_epi8(a01, idx, b01);
            __m512i hi = _mm512_permutex2var_epi8(a23, idx, b23);
            _mm512_storeu_si512(dst + kq * (QC_P * 4), _mm512_mask_mov_epi8(lo, hi2, hi));
        }
    }
    /* other blocks over several output rows: per run one masked 64-byte load per
     * k, placed at row q's bytes (its mask shifted there, the address back
     * by as much: masked-off bytes are never read), into one or two vectors */
    __mmask64 mq[QC_P][4];
    for (int u = 0; u < runs; u++)
        for (int q = 0; q < 4; q++)
            mq[u][q] = (__mmask64)mk[u] << (SW == 1 ? 16 * q : 32 * (q % 2));
    for (; kq < full; kq++) {
        const int64_t *ko = koff + kq * 4;
        __m512i va = _mm512_setzero_si512(), vb = _mm512_setzero_si512();
        for (int u = 0; u < runs; u++) {
            const uint8_t *s0 = xp + soff[u];
            if (SW == 1) {
                va = _mm512_mask_loadu_epi8(va, mq[u][0], s0 + ko[0]);
                va = _mm512_mask_loadu_epi8(va, mq[u][1], s0 + ko[1] - 16);
                va = _mm512_mask_loadu_epi8(va, mq[u][2], s0 + ko[2] - 32);
                va = _mm512_mask_loadu_epi8(va, mq[u][3], s0 + ko[3] - 48);
            } else {
                va = _mm512_mask_loadu_epi8(va, mq[u][0], s0 + ko[0]);
                va = _mm512_mask_loadu_epi8(va, mq[u][1], s0 + ko[1] - 32);
                vb = _mm512_mask_loadu_epi8(vb, mq[u][2], s0 + ko[2]);
                vb = _mm512_mask_loadu_epi8(vb, mq[u][3], s0 + ko[3] - 32);
            }
        }
        _mm512_storeu_si512(dst + kq * (QC_P * 4), SW == 1
                            ? _mm512_permutexvar_epi8(idx0, va)
                            : _mm512_permutex2var_epi8(va, idx0, vb));
    }
    if (kq < KQ && kq * 4 < K) {    /* the last k (fewer than 4) as above, zeros past K */
        const int64_t *ko = koff + kq * 4;
        int64_t nq = K - kq * 4;
        __m512i va = _mm512_setzero_si512(), vb = _mm512_setzero_si512();
        for (int u = 0; u < runs; u++) {
            const uint8_t *s0 = xp + soff[u];
            for (int q = 0; q < nq; q++) {
                int64_t back = SW == 1 ? 16 * q : 32 * (q % 2);
                if (SW == 1 || q < 2)
                    va = _mm512_mask_loadu_epi8(va, mq[u][q], s0 + ko[q] - back);
                else
                    vb = _mm512_mask_loadu_epi8(vb, mq[u][q], s0 + ko[q] - back);
            }
        }
        _mm512_storeu_si512(dst + kq * (QC_P * 4), SW == 1
                            ? _mm512_permutexvar_epi8(idx0, va)
                            : _mm512_permutex2var_epi8(va, idx0, vb));
        kq++;
    }
    for (; kq < KQ; kq++)       /* past K: zeros */
        _mm512_storeu_si512(dst + kq * (QC_P * 4), _mm512_setzero_si512());
}

#endif

/* 1 where pack_im2col_vbmi runs here */
static int pack_vbmi_ok(void)
{
#ifdef MT_QC_VNNI
    static int state = -1;
    int v = __atomic_load_n(&state, __ATOMIC_RELAXED);
    if (v < 0) {
        __builtin_cpu_init();
        v = __builtin_cpu_supports("avx512vbmi") && __builtin_cpu_supports("avx512bw") &&
            __builtin_cpu_supports("avx512vl");
        __atomic_store_n(&state, v, __ATOMIC_RELAXED);
    }
    return v;
#else
    return 0;
#endif
}

/* one pixel block pb of the im2col of the padded planes xp into dst
 * [KQ][16][4]: the VBMI kernel for strides 1 and 2 where vbmi (the
 * caller's pack_vbmi_ok(), 0 on the portable and AVX2 paths), else SSE2 /
 * bytewise */
static void pack_im2col_block(const uint8_t *xp, const int64_t *koff, int64_t K, int64_t OW,
                              int64_t SH, int64_t SW, int64_t WP, int64_t P, int64_t KQ,
                              int64_t pb, uint8_t *dst, int vbmi)
{
#ifdef MT_QC_VNNI
    if (vbmi && (SW == 1 || SW == 2)) {
        pack_im2col_vbmi(xp, koff, K, OW, SH, SW, WP, P, KQ, pb, dst);
        return;
    }
#endif
    (void)vbmi;
    pack_im2col_sse(xp, koff, K, OW, SH, SW, WP, P, KQ, pb, dst);
}

/* the im2col's pixel blocks, as worksharing loop of the caller's region */
static void pack_im2col(const uint8_t *xp, const int64_t *koff, int64_t K, int64_t OW,
                        int64_t SH, int64_t SW, int64_t WP, int64_t P, int64_t KQ, int64_t PB,
                        uint8_t *packed, int vbmi)
{
#pragma omp for schedule(static)
    for (int64_t pb = 0; pb < PB; pb++)
        pack_im2col_block(xp, koff, K, OW, SH, SW, WP, P, KQ, pb,
                          packed + pb * KQ * (QC_P * 4), vbmi);
}

#ifdef MT_QC_VNNI
/* pack_rows_block with AVX-512 VBMI: the four rows' 16 bytes (np of them,
 * masked; rows past K zeros) in the four 128-bit lanes of one vector, one
 * vpermb to [16][4], one store, where the SSE2 transpose spent six unpacks
 * and four stores and a partial block (a 7x7 layer's last pixel under K
 * 960) went byte by byte: the packing was 4% of MobileNetV2's int8
 * forward */
__attribute__((target("avx512f,avx512bw,avx512vl,avx512vbmi")))
static void pack_rows_block_vbmi(const uint8_t *s, int64_t ld, int64_t K, int64_t KQ, int64_t np,
                                 uint8_t *dst)
{
    uint8_t ix[64];
    for (int t = 0; t < 16; t++)
        for (int r = 0; r < 4; r++)
            ix[t * 4 + r] = (uint8_t)(r * 16 + t);
    __m512i idx = _mm512_loadu_si512(ix);
    __mmask16 m = np >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << np) - 1);
    for (int64_t kq = 0; kq < KQ; kq++) {
        const uint8_t *r = s + kq * 4 * ld;
        /* rows left: 4 but in the last group, none past it (KQ runs to the
         * AMX tiles' multiple of 16 groups: no byte of those rows is read) */
        int64_t nr = K - kq * 4;
        __m512i v = _mm512_castsi128_si512(_mm_maskz_loadu_epi8(nr > 0 ? m : 0, r));
        v = _mm512_inserti32x4(v, _mm_maskz_loadu_epi8(nr > 1 ? m : 0, r + ld), 1);
        v = _mm512_inserti32x4(v, _mm_maskz_loadu_epi8(nr > 2 ? m : 0, r + 2 * ld), 2);
        v = _mm512_inserti32x4(v, _mm_maskz_loadu_epi8(nr > 3 ? m : 0, r + 3 * ld), 3);
        _mm512_storeu_si512(dst + kq * (QC_P * 4), _mm512_permutexvar_epi8(idx, v));
    }
}
#endif

/* rows [K, P] (row stride ld) -> pixel block pb: dst [KQ][16][4], zeros past
 * K and P */
static void pack_rows_block(const uint8_t *rows, int64_t ld, int64_t K, int64_t P, int64_t KQ,
                            int64_t pb, uint8_t *dst)
{
    int64_t p0 = pb * QC_P, np = P - p0 < QC_P ? P - p0 : QC_P;
#ifdef MT_QC_VNNI
    if (pack_vbmi_ok()) {
        pack_rows_block_vbmi(rows + p0, ld, K, KQ, np, dst);
        return;
    }
#endif
    for (int64_t kq = 0; kq < KQ; kq++) {
        uint8_t *d = dst + kq * (QC_P * 4);
        const uint8_t *s = rows + kq * 4 * ld + p0;
#if defined(__SSE2__)
        if (np == QC_P && kq * 4 + 4 <= K) {    /* a 4 x 16 byte transpose */
            __m128i r0 = _mm_loadu_si128((const __m128i *)s);
            __m128i r1 = _mm_loadu_si128((const __m128i *)(s + ld));
            __m128i r2 = _mm_loadu_si128((const __m128i *)(s + 2 * ld));
            __m128i r3 = _mm_loadu_si128((const __m128i *)(s + 3 * ld));
            __m128i a = _mm_unpacklo_epi8(r0, r1), b = _mm_unpackhi_epi8(r0, r1);
            __m128i c = _mm_unpacklo_epi8(r2, r3), e = _mm_unpackhi_epi8(r2, r3);
            _mm_storeu_si128((__m128i *)d, _mm_unpacklo_epi16(a, c));
            _mm_storeu_si128((__m128i *)(d + 16), _mm_unpackhi_epi16(a, c));
            _mm_storeu_si128((__m128i *)(d + 32), _mm_unpacklo_epi16(b, e));
            _mm_storeu_si128((__m128i *)(d + 48), _mm_unpackhi_epi16(b, e));
            continue;
        }
#endif
        for (int64_t t = 0; t < QC_P; t++)
            for (int64_t r = 0; r < 4; r++)
                d[t * 4 + r] = (t < np && kq * 4 + r < K) ? s[r * ld + t] : 0;
    }
}

/* rows [K, P] -> packed [PB][KQ][16][4], as worksharing loop of the
 * caller's region */
static void pack_rows(const uint8_t *rows, int64_t ld, int64_t K, int64_t P, int64_t KQ,
                      int64_t PB, uint8_t *packed)
{
#pragma omp for schedule(static)
    for (int64_t pb = 0; pb < PB; pb++)
        pack_rows_block(rows, ld, K, P, KQ, pb, packed + pb * KQ * (QC_P * 4));
}

typedef struct {
    const uint8_t *packed;      /* [PB - pb0][KQ][16][4] */
    int64_t KQ, PB, P;
    const int8_t *const *w;     /* QC_R weight rows ([KQ * 4] each) */
    void *const *out;           /* QC_R output rows (NULL: no such channel) */
    const double *corr, *mult;  /* QC_R each */
    const int32_t *icorr;       /* QC_R: corr as int32 where put16i's bounds hold, else NULL */
    int out_u8;
    int32_t out_zp, lo, hi;
    int64_t pb0;                /* the block packed holds first (0: all of them) */
    int qf;                     /* put16q for every channel (icorr too) */
    const float *fmult;         /* QC_R: float(mult) where qf */
} qc_tile;

/* QC_R channels x pixel blocks pb, pb + 1 (where < PB): portable C */
static void tile_portable(const qc_tile *t, int64_t pb)
{
    for (int64_t b = pb; b < pb + 2 && b < t->PB; b++) {
        const uint8_t *x = t->packed + (b - t->pb0) * t->KQ * (QC_P * 4);
        int64_t p0 = b * QC_P, np = t->P - p0 < QC_P ? t->P - p0 : QC_P;
        for (int r = 0; r < QC_R; r++) {
            if (!t->out[r])
                continue;
            int32_t acc[QC_P] = {0};
            for (int64_t kq = 0; kq < t->KQ; kq++) {
                const uint8_t *xk = x + kq * (QC_P * 4);
                const int8_t *wk = t->w[r] + kq * 4;
                for (int p = 0; p < QC_P; p++)
                    for (int i = 0; i < 4; i++)
                        acc[p] += (int32_t)xk[p * 4 + i] * (int32_t)wk[i];
            }
            for (int64_t p = 0; p < np; p++)
                put1(t->out[r], p0 + p, t->out_u8, (double)acc[p] - t->corr[r], t->mult[r],
                     t->out_zp, t->lo, t->hi);
        }
    }
}

#ifdef MT_QC_VNNI
/* n (<= 8) consecutive outputs out[at..] of one channel from 8 int32 dots:
 * put1's double arithmetic four lanes at a time (AVX2) */
__attribute__((target("avx2")))
static void put8_avx2(void *out, int64_t at, int n, __m256i dot, double corr, double mult,
                      int out_u8, int32_t out_zp, int32_t lo, int32_t hi)
{
    __m256d c = _mm256_set1_pd(corr), k = _mm256_set1_pd(mult);
    __m256d d0 = _mm256_mul_pd(_mm256_sub_pd(
        _mm256_cvtepi32_pd(_mm256_castsi256_si128(dot)), c), k);
    __m256d d1 = _mm256_mul_pd(_mm256_sub_pd(
        _mm256_cvtepi32_pd(_mm256_extracti128_si256(dot, 1)), c), k);
    if (out_u8 == 2) {
        if (lo == 0) {
            d0 = _mm256_max_pd(d0, _mm256_setzero_pd());
            d1 = _mm256_max_pd(d1, _mm256_setzero_pd());
        }
        float f[8];
        _mm_storeu_ps(f, _mm256_cvtpd_ps(d0));
        _mm_storeu_ps(f + 4, _mm256_cvtpd_ps(d1));
        for (int i = 0; hi > 0 && i < 8; i++)
            f[i] = mt_q_relu6f(f[i], hi);
        memcpy((float *)out + at, f, (size_t)n * sizeof(float));
        return;
    }
    __m256d z = _mm256_set1_pd((double)out_zp), l = _mm256_set1_pd((double)lo),
            h = _mm256_set1_pd((double)hi);
    d0 = _mm256_add_pd(_mm256_round_pd(d0, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), z);
    d1 = _mm256_add_pd(_mm256_round_pd(d1, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), z);
    d0 = _mm256_min_pd(_mm256_max_pd(d0, l), h);
    d1 = _mm256_min_pd(_mm256_max_pd(d1, l), h);
    int32_t v[8];
    _mm_storeu_si128((__m128i *)v, _mm256_cvtpd_epi32(d0));
    _mm_storeu_si128((__m128i *)(v + 4), _mm256_cvtpd_epi32(d1));
    for (int i = 0; i < n; i++) {       /* in range after the clamp */
        if (out_u8)
            ((uint8_t *)out)[at + i] = (uint8_t)v[i];
        else
            ((int8_t *)out)[at + i] = (int8_t)v[i];
    }
}

/* QC_R channels x pixel blocks pb, pb + 1 with AVX2 alone (CPUs without
 * AVX-512 VNNI): the packed bytes widened to int16 and vpmaddwd against the
 * channel's four taps as int16 (exact: vpmaddubsw would saturate), each
 * pixel's two partial sums added at the end */
__attribute__((target("avx2")))
static void tile_avx2(const qc_tile *t, int64_t pb)
{
    int64_t KQ = t->KQ;
    for (int64_t b = pb; b < pb + 2 && b < t->PB; b++) {
        const uint8_t *x = t->packed + (b - t->pb0) * KQ * (QC_P * 4);
        int64_t p0 = b * QC_P;
        int n = (int)(t->P - p0 < QC_P ? t->P - p0 : QC_P);
        for (int r = 0; r < QC_R; r++) {
            if (!t->out[r])
                continue;
            __m256i a0 = _mm256_setzero_si256(), a1 = _mm256_setzero_si256(),
                    a2 = _mm256_setzero_si256(), a3 = _mm256_setzero_si256();
            for (int64_t kq = 0; kq < KQ; kq++) {
                const int8_t *wk = t->w[r] + kq * 4;
                __m256i wv = _mm256_setr_epi16(wk[0], wk[1], wk[2], wk[3], wk[0], wk[1], wk[2],
                                               wk[3], wk[0], wk[1], wk[2], wk[3], wk[0], wk[1],
                                               wk[2], wk[3]);
                const uint8_t *xk = x + kq * (QC_P * 4);
                a0 = _mm256_add_epi32(a0, _mm256_madd_epi16(_mm256_cvtepu8_epi16(
                    _mm_loadu_si128((const __m128i *)xk)), wv));
                a1 = _mm256_add_epi32(a1, _mm256_madd_epi16(_mm256_cvtepu8_epi16(
                    _mm_loadu_si128((const __m128i *)(xk + 16))), wv));
                a2 = _mm256_add_epi32(a2, _mm256_madd_epi16(_mm256_cvtepu8_epi16(
                    _mm_loadu_si128((const __m128i *)(xk + 32))), wv));
                a3 = _mm256_add_epi32(a3, _mm256_madd_epi16(_mm256_cvtepu8_epi16(
                    _mm_loadu_si128((const __m128i *)(xk + 48))), wv));
            }
            /* lanes (pixel, half): hadd pairs them, the permute restores the order */
            __m256i lo8 = _mm256_permute4x64_epi64(_mm256_hadd_epi32(a0, a1), 0xD8);
            __m256i hi8 = _mm256_permute4x64_epi64(_mm256_hadd_epi32(a2, a3), 0xD8);
            put8_avx2(t->out[r], p0, n < 8 ? n : 8, lo8, t->corr[r], t->mult[r], t->out_u8,
                      t->out_zp, t->lo, t->hi);
            if (n > 8)
                put8_avx2(t->out[r], p0 + 8, n - 8, hi8, t->corr[r], t->mult[r], t->out_u8,
                          t->out_zp, t->lo, t->hi);
        }
    }
}

static int has_avx2(void)
{
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2");
}

/* R (4 or 8) channels x B (1 or 2) pixel blocks pb, pb + 1: per 4 k B
 * 64-byte loads of packed pixels, R broadcast weights and B R vpdpbusd into
 * B R accumulators. Eight channels halve the pixel loads per vpdpbusd
 * against four; a tile of four serves a group's last channels where four
 * or fewer remain, and a tile of one block the odd last block (a pair
 * there computed the block twice). The accumulators are named variables (an array of them indexed
 * in the epilogue made GCC copy all sixteen through the stack each step). */
#define QC_DOT(r)                                                   \
    do {                                                            \
        int32_t v_;                                                 \
        memcpy(&v_, w##r + kq * 4, 4);                              \
        __m512i b_ = _mm512_set1_epi32(v_);                         \
        c##r##0 = _mm512_dpbusd_epi32(c##r##0, a0, b_);             \
        if (B > 1)                                                  \
            c##r##1 = _mm512_dpbusd_epi32(c##r##1, a1, b_);         \
    } while (0)
/* a tile's R (4 or 8) rows of outputs: QC_DOT or one of the stores below, for each */
#define QC_ROWS(PUT)                                                \
    do {                                                            \
        PUT(0); PUT(1); PUT(2); PUT(3);                             \
        if (R > 4) { PUT(4); PUT(5); PUT(6); PUT(7); }              \
    } while (0)
#define QC_PUT(r)                                                  \
    do {                                                           \
        if (out_[r]) {                                             \
            put16(out_[r], p0, n0, c##r##0, cr_[r], mu_[r], ou8_,  \
                  ozp_, lo_, hi_);                                 \
            if (B > 1)                                             \
                put16(out_[r], p0 + QC_P, n1, c##r##1, cr_[r], mu_[r], \
                      ou8_, ozp_, lo_, hi_);                       \
        }                                                          \
    } while (0)

#define QC_PUTQ(r)                                                 \
    do {                                                           \
        if (out_[r]) {                                             \
            __m512 f_ = _mm512_set1_ps(fm_[r]);                    \
            put16q(out_[r], p0, m0, c##r##0, 0, f_, mu_[r], ou8_, \
                   lo_, zpv, lov, hiv, zpf, lof, hif);             \
            if (B > 1)                                             \
                put16q(out_[r], p0 + QC_P, m1, c##r##1, 0, f_, mu_[r], \
                       ou8_, lo_, zpv, lov, hiv, zpf, lof, hif);   \
        }                                                          \
    } while (0)

#define QC_PUTS(r)                                                 \
    do {                                                           \
        if (out_[r]) {                                             \
            __m512 f_ = _mm512_set1_ps(fm_[r]);                    \
            if (B > 1)                                             \
                put32s(out_[r], p0, m0, m1, c##r##0, c##r##1, 0, f_, mu_[r], \
                       ou8_, lo_, zpv, lov, hiv, zps, flip);      \
            else                                                   \
                put16s(out_[r], p0, m0, c##r##0, 0, f_, mu_[r], ou8_, \
                       lo_, zpv, lov, hiv, zps, flip);             \
        }                                                          \
    } while (0)

#define QC_PUTI(r)                                                 \
    do {                                                           \
        if (out_[r]) {                                             \
            put16i(out_[r], p0, m0, c##r##0, 0, mu_[r], ou8_, \
                   lo_, zpv, lov, hiv);                            \
            if (B > 1)                                             \
                put16i(out_[r], p0 + QC_P, m1, c##r##1, 0, mu_[r], \
                       ou8_, lo_, zpv, lov, hiv);                  \
        }                                                          \
    } while (0)

__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")))
static inline __attribute__((always_inline))
void tile_vnni_rows(const qc_tile *t, int64_t pb, const int R, const int B)
{
    int64_t KQ = t->KQ;
    const uint8_t *x0 = t->packed + (pb - t->pb0) * KQ * (QC_P * 4);
    const uint8_t *x1 = x0 + KQ * (QC_P * 4);     /* read where B is 2 */
    const int8_t *w0 = t->w[0], *w1 = t->w[1], *w2 = t->w[2], *w3 = t->w[3];
    const int8_t *w4 = t->w[R > 4 ? 4 : 0], *w5 = t->w[R > 4 ? 5 : 0],
                 *w6 = t->w[R > 4 ? 6 : 0], *w7 = t->w[R > 4 ? 7 : 0];
    /* where the int32 epilogues run (t->icorr), each row's accumulators
     * start at -corr, so that the dots end as dot - corr (int32 arithmetic
     * wraps: the sum is exact where put16i_ok holds) and the epilogue
     * subtracts nothing: one operation fewer per vector */
    const int32_t *ic = t->icorr;
#define QC_INIT(r) (ic ? _mm512_set1_epi32(-ic[r]) : _mm512_setzero_si512())
    __m512i c00 = QC_INIT(0), c01 = c00, c10 = QC_INIT(1), c11 = c10, c20 = QC_INIT(2),
            c21 = c20, c30 = QC_INIT(3), c31 = c30, c40 = R > 4 ? QC_INIT(4) : c00, c41 = c40,
            c50 = R > 4 ? QC_INIT(5) : c00, c51 = c50, c60 = R > 4 ? QC_INIT(6) : c00,
            c61 = c60, c70 = R > 4 ? QC_INIT(7) : c00, c71 = c70;
#undef QC_INIT
    for (int64_t kq = 0; kq < KQ; kq++) {
        __m512i a0 = _mm512_loadu_si512(x0 + kq * (QC_P * 4));
        __m512i a1 = B > 1 ? _mm512_loadu_si512(x1 + kq * (QC_P * 4)) : a0;
        QC_ROWS(QC_DOT);
    }
    /* the rows' outputs and constants in locals: read through t, each
     * store (which may alias *t for all GCC knows) made it reload t->out
     * and t->out[r] before the next, two dependent loads per vector */
    void *out_[8];
    const int ou8_ = t->out_u8;
    const int32_t ozp_ = t->out_zp, lo_ = t->lo, hi_ = t->hi;
    double cr_[8], mu_[8];
    float fm_[8];
    for (int r = 0; r < R; r++) {
        out_[r] = t->out[r];
        cr_[r] = t->corr[r];
        mu_[r] = t->mult[r];
        fm_[r] = t->qf ? t->fmult[r] : 0.0f;
    }
    int64_t p0 = pb * QC_P;
    int n0 = (int)(t->P - p0 < QC_P ? t->P - p0 : QC_P);
    int n1 = (int)(t->P - p0 - QC_P < QC_P ? t->P - p0 - QC_P : QC_P);
    if (t->icorr) {
        __mmask16 m0 = n0 >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << n0) - 1);
        __mmask16 m1 = n1 >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n1 > 0 ? n1 : 0)) - 1);
        __m512i zpv = _mm512_set1_epi32(t->out_zp), lov = _mm512_set1_epi32(t->lo),
                hiv = _mm512_set1_epi32(t->hi);
        if (t->qf && put16s_ok(t->out_u8, t->lo, t->hi)) {
            __m512 zps = _mm512_set1_ps((float)(ozp_ - (ou8_ == 1 ? 128 : 0)));
            __m256i flip = _mm256_set1_epi8(ou8_ == 1 ? (char)0x80 : 0);
            QC_ROWS(QC_PUTS);
            return;
        }
        if (t->qf) {
            __m512 zpf = _mm512_set1_ps((float)t->out_zp), lof = _mm512_set1_ps((float)t->lo),
                   hif = _mm512_set1_ps((float)t->hi);
            QC_ROWS(QC_PUTQ);
            return;
        }
        QC_ROWS(QC_PUTI);
        return;
    }
    QC_ROWS(QC_PUT);
}
#undef QC_DOT
#undef QC_ROWS
#undef QC_PUT
#undef QC_PUTI
#undef QC_PUTQ
#undef QC_PUTS

__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")))
static void tile_vnni(const qc_tile *t, int64_t pb)
{
    int two = pb + 1 < t->PB;
    if (t->out[4] && two)
        tile_vnni_rows(t, pb, 8, 2);
    else if (t->out[4])
        tile_vnni_rows(t, pb, 8, 1);
    else if (two)
        tile_vnni_rows(t, pb, 4, 2);
    else
        tile_vnni_rows(t, pb, 4, 1);
}
#endif

#ifdef MT_QC_AMX
/* 1 where the CPU has AMX-INT8 and the kernel lets this process use the
 * tile data (arch_prctl ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA, asked once) */
static int amx_state = -1;

static int amx_ok(void)
{
    int s = __atomic_load_n(&amx_state, __ATOMIC_ACQUIRE);
    if (s >= 0)
        return s;
    unsigned a, b, c, d;
    int ok = 0;
    if (mt_qgemm_has_vnni() && __get_cpuid_count(7, 0, &a, &b, &c, &d)
            && (d & (1u << 24)) && (d & (1u << 25)))
        ok = syscall(SYS_arch_prctl, 0x1023, 18) == 0;
    __atomic_store_n(&amx_state, ok, __ATOMIC_RELEASE);
    return ok;
}

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} amx_config;

/* every tile 16 rows x 64 bytes: C 0-3 (int32 16 x 16), A 4-5, B 6-7. A
 * file-scope constant: GCC 12 drops the stores into a local configuration,
 * not seeing that ldtilecfg reads them. */
static const amx_config amx_cfg = {
    .palette = 1,
    .colsb = {64, 64, 64, 64, 64, 64, 64, 64},
    .rows = {16, 16, 16, 16, 16, 16, 16, 16},
};

/* a thread's tiles configured as above (every int8 AMX kernel's: qgemm.c's
 * too), then released when its blocks are done */
__attribute__((target("amx-tile,amx-int8")))
void mt_q_amx_begin(void) { _tile_loadconfig(&amx_cfg); }

__attribute__((target("amx-tile,amx-int8")))
void mt_q_amx_end(void) { _tile_release(); }

/* the tiles for a depth of KQ (1-15) quads of k, under 64: the weights' A
 * tiles 16 rows x 4 KQ bytes, the packed pixels' B tiles KQ rows x 64
 * bytes (the VNNI kernel's packing, no zeros packed or multiplied), C as
 * above. Built once, at file scope for the reason above. */
static amx_config amx_small_cfg[16];

__attribute__((constructor)) static void amx_small_init(void)
{
    for (int kq = 1; kq < 16; kq++) {
        amx_config *c = &amx_small_cfg[kq];
        c->palette = 1;
        for (int t = 0; t < 8; t++) {
            c->colsb[t] = t == 4 || t == 5 ? (uint16_t)(4 * kq) : 64;
            c->rows[t] = t == 6 || t == 7 ? (uint8_t)kq : 16;
        }
    }
}

/* mt_q_amx_begin for tile steps of KQ quads of k (a multiple of 16, or
 * under 16: one step of the whole depth) */
__attribute__((target("amx-tile,amx-int8")))
static void amx_begin_kq(int64_t KQ)
{
    if (KQ >= 16)
        _tile_loadconfig(&amx_cfg);
    else
        _tile_loadconfig(&amx_small_cfg[KQ]);
}

/* 32 channels (weight rows w, row stride lw; rows past the array's
 * channels are zeros) x pixel blocks pb, pb + 1; t->w[0] unused */
__attribute__((target("amx-tile,amx-int8,avx512f,avx512bw,avx512vl,avx512dq")))
static void tile_amx(const qc_tile *t, const int8_t *w, int64_t lw, int64_t pb, int nrows,
                     void *const *out, const double *corr, const double *mult)
{
    int64_t KQ = t->KQ;         /* a multiple of 16, or under 16 (amx_begin_kq) */
    const uint8_t *x0 = t->packed + (pb - t->pb0) * KQ * (QC_P * 4);
    int two = pb + 1 < t->PB;
    const uint8_t *x1 = two ? x0 + KQ * (QC_P * 4) : x0;
    const int8_t *w1 = w + 16 * lw;
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (int64_t kq = 0; kq < KQ; kq += 16) {
        _tile_loadd(4, w + kq * 4, lw);
        _tile_loadd(5, w1 + kq * 4, lw);
        _tile_loadd(6, x0 + kq * (QC_P * 4), QC_P * 4);
        _tile_loadd(7, x1 + kq * (QC_P * 4), QC_P * 4);
        _tile_dpbsud(0, 4, 6);
        _tile_dpbsud(1, 4, 7);
        _tile_dpbsud(2, 5, 6);
        _tile_dpbsud(3, 5, 7);
    }
    int32_t acc[4][256] __attribute__((aligned(64)));
    _tile_stored(0, acc[0], 64);
    _tile_stored(1, acc[1], 64);
    _tile_stored(2, acc[2], 64);
    _tile_stored(3, acc[3], 64);
    qc_ep e = qc_ep_make(t->out_u8, t->out_zp, t->lo, t->hi, t->qf, t->icorr != NULL);
    if (two && e.qf && e.sat) {     /* both blocks of a channel at once: put32s */
        int64_t p0 = pb * QC_P;
        int n1 = (int)(t->P - p0 - QC_P < QC_P ? t->P - p0 - QC_P : QC_P);
        __mmask16 m1 = n1 >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << n1) - 1);
        for (int r = 0; r < nrows; r++)
            put32s(out[r], p0, 0xFFFF, m1, _mm512_load_si512(acc[(r / 16) * 2] + (r % 16) * 16),
                   _mm512_load_si512(acc[(r / 16) * 2 + 1] + (r % 16) * 16), t->icorr[r],
                   _mm512_set1_ps(t->fmult[r]), mult[r], e.out_u8, e.lo, e.zpv, e.lov, e.hiv,
                   e.zps, e.flip);
        return;
    }
    for (int b = 0; b < 1 + two; b++) {
        int64_t p0 = (pb + b) * QC_P;
        int n = (int)(t->P - p0 < QC_P ? t->P - p0 : QC_P);
        for (int r = 0; r < nrows; r++)
            qc_ep_put(&e, out[r], p0, n, _mm512_load_si512(acc[(r / 16) * 2 + b] + (r % 16) * 16),
                      corr[r], t->icorr ? t->icorr[r] : 0,
                      _mm512_set1_ps(t->qf ? t->fmult[r] : 0.0f), mult[r]);
    }
}
#endif

/* 1 where mt_qconv_u8s8's path 0 runs on AMX here */
int mt_qconv_has_amx(void)
{
#ifdef MT_QC_AMX
    return amx_ok();
#else
    return 0;
#endif
}

/* The calling thread's scratch of at least n bytes, kept for its next
 * call: a fresh malloc of a few MB per conv is mmap'd and page-faulted
 * again each time, which cost more than the packing itself. Grows, never
 * shrinks; NULL when out of memory. The one policy of both drivers: the
 * dense conv's packed input (the calling thread's) and the depthwise
 * conv's padded plane (each team thread's own), and qpool.c's pools. */
static __thread uint8_t *scratch_at;
static __thread size_t scratch_cap;

/* n bytes (rounded up to 64) at a 64-byte boundary, for free(): the packed
 * input's 64-byte rows are what the tile loads read, one cache line each
 * only when aligned (malloc's 16 split each in two) */
static uint8_t *q_alloc64(size_t n)
{
    void *p = NULL;
    if (posix_memalign(&p, 64, (n + 63) & ~(size_t)63))
        return NULL;
    return p;
}

/* *at, grown to n bytes (64-byte aligned) where it holds fewer: the old
 * contents are dropped, as each caller rewrites what it reads */
static uint8_t *q_grow(uint8_t **at, size_t *cap, size_t n)
{
    if (n > *cap) {
        free(*at);
        *cap = 0;
        *at = q_alloc64(n);
        if (!*at)
            return NULL;
        *cap = n;
    }
    return *at;
}

uint8_t *mt_q_scratch(size_t n)     /* also qpool.c's (one call at a time per thread) */
{
    return q_grow(&scratch_at, &scratch_cap, n);
}

/* The calling thread's panel of two packed pixel blocks, kept for its
 * next call as mt_q_scratch (a second buffer: the dense driver's packed
 * input and padded planes are the calling thread's scratch) */
static __thread uint8_t *panel_at;
static __thread size_t panel_cap;

static uint8_t *q_panel(size_t n)
{
    return q_grow(&panel_at, &panel_cap, n);
}

/* one dense conv call's constants, as its tiles read them */
typedef struct {
    const int8_t *wrows;
    int64_t lw;
    const int8_t *zero;
    const double *corr, *mult;
    const int32_t *icorr;       /* corr as int32 where put16i's bounds hold, else NULL */
    void *out;
    size_t isz;
    int64_t Co, Cog, P, PB, KQ;
    int out_u8;
    int32_t out_zp, lo, hi;
    int vnni, avx2, amx;
    int qf;                     /* put16q for every channel (icorr too) */
    const float *fmult;         /* [Co] float(mult) where qf */
} qc_call;

#define QC_REM 8                /* the most pixels rem_vnni takes */

#ifdef MT_QC_VNNI
/* The last rem (< 16) pixels of image n, group g, channels [c0, c1), from
 * their packed block blk ([KQ][16][4], pixels p0 + t in lanes t < rem):
 * each pixel's column gathered into cols ([rem][lw], zeros past KQ * 4),
 * then per channel 64 k per vpdpbusd against its weight row and a sum of
 * the lanes, the epilogue put1's. A tile spends KQ vpdpbusd per channel
 * on a block, whatever its pixels: a 7x7 output (3 blocks and 1 pixel)
 * paid a fourth block for its last pixel, which takes KQ / 16 here. */
__attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni")))
static void rem_vnni(const qc_call *cl, const uint8_t *blk, int rem, uint8_t *cols, int gather,
                     int64_t n, int64_t c0, int64_t c1, int64_t p0)
{
    int64_t KQ = cl->KQ, lw = cl->lw;
    if (gather) {
        memset(cols, 0, (size_t)(rem * lw));
        for (int r = 0; r < rem; r++)
            for (int64_t kq = 0; kq < KQ; kq++)
                memcpy(cols + r * lw + kq * 4, blk + kq * (QC_P * 4) + r * 4, 4);
    }
    /* four channels at a time: four independent vpdpbusd chains (one per
     * row; a chain per pixel alone waited on its own latency, ~5 cycles a
     * step, where the last pixel of a 7x7 layer is a single chain), the
     * four rows (4 lw bytes) in L1 across the pixels */
    int64_t c = c0;
    for (; c + 4 <= c1; c += 4) {
        const int8_t *w0 = cl->wrows + c * lw, *w1 = w0 + lw, *w2 = w1 + lw, *w3 = w2 + lw;
        for (int r = 0; r < rem; r++) {
            const uint8_t *x = cols + r * lw;
            __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
            for (int64_t k = 0; k < lw; k += 64) {
                __m512i xv = _mm512_loadu_si512(x + k);
                a0 = _mm512_dpbusd_epi32(a0, xv, _mm512_loadu_si512(w0 + k));
                a1 = _mm512_dpbusd_epi32(a1, xv, _mm512_loadu_si512(w1 + k));
                a2 = _mm512_dpbusd_epi32(a2, xv, _mm512_loadu_si512(w2 + k));
                a3 = _mm512_dpbusd_epi32(a3, xv, _mm512_loadu_si512(w3 + k));
            }
            int32_t d[4] = {_mm512_reduce_add_epi32(a0), _mm512_reduce_add_epi32(a1),
                            _mm512_reduce_add_epi32(a2), _mm512_reduce_add_epi32(a3)};
            for (int j = 0; j < 4; j++) {
                void *o = (char *)cl->out + (size_t)((n * cl->Co + c + j) * cl->P) * cl->isz;
                put1(o, p0 + r, cl->out_u8, (double)d[j] - cl->corr[c + j], cl->mult[c + j],
                     cl->out_zp, cl->lo, cl->hi);
            }
        }
    }
    for (; c < c1; c++) {       /* a group's last channels past a multiple of four */
        const int8_t *w = cl->wrows + c * lw;
        void *o = (char *)cl->out + (size_t)((n * cl->Co + c) * cl->P) * cl->isz;
        for (int r = 0; r < rem; r++) {
            __m512i a = _mm512_setzero_si512();
            for (int64_t k = 0; k < lw; k += 64)
                a = _mm512_dpbusd_epi32(a, _mm512_loadu_si512(cols + r * lw + k),
                                        _mm512_loadu_si512(w + k));
            put1(o, p0 + r, cl->out_u8, (double)_mm512_reduce_add_epi32(a) - cl->corr[c],
                 cl->mult[c], cl->out_zp, cl->lo, cl->hi);
        }
    }
}
#endif

/* a thread's channel tile: its qc_tile and the per-channel arrays that
 * tile points into, built for (n, g, cb) once and kept while consecutive
 * run_tile calls stay on that tile (a panel's pixel blocks, or the
 * weight-major loop's): the build is eight channels of branches and
 * loads, and at K 16 (MobileNetV2's 112x112 expand conv) a tile's dots
 * are four steps, so rebuilding it per call took 15% of that layer */
typedef struct {
    int64_t n, g, cb;           /* the tile held (n -1: none yet) */
    qc_tile t;
    const int8_t *w[QC_R];
    void *o[32];                /* QC_R, or 32 on AMX */
    double cr[QC_R], mu[QC_R];
    float fm[QC_R];
    int32_t ic[QC_R];
    int nrows;                  /* AMX: the tile's channels */
} qc_tset;

/* ts holding image n, group g, channel tile cb */
static void tile_set(const qc_call *cl, qc_tset *ts, int64_t n, int64_t g, int64_t cb)
{
    if (ts->n == n && ts->g == g && ts->cb == cb)
        return;
    ts->n = n;
    ts->g = g;
    ts->cb = cb;
    int64_t Cog = cl->Cog, P = cl->P, end = (g + 1) * Cog;
    if (cl->amx) {
        int64_t c0 = g * Cog + cb * 32;
        ts->nrows = (int)(end - c0 < 32 ? end - c0 : 32);
        for (int r = 0; r < ts->nrows; r++)
            ts->o[r] = (char *)cl->out + (size_t)((n * cl->Co + c0 + r) * P) * cl->isz;
        qc_tile t = {NULL, cl->KQ, cl->PB, P, NULL, NULL, NULL, NULL,
                     cl->icorr ? cl->icorr + c0 : NULL, cl->out_u8, cl->out_zp, cl->lo, cl->hi,
                     0, cl->qf, cl->qf ? cl->fmult + c0 : NULL};
        ts->t = t;
        return;
    }
    int64_t c0 = g * Cog + cb * QC_R;
    for (int r = 0; r < QC_R; r++) {
        int64_t c = c0 + r;
        int in = c < end;
        ts->w[r] = in ? cl->wrows + c * cl->lw : cl->zero;
        ts->o[r] = in ? (char *)cl->out + (size_t)((n * cl->Co + c) * P) * cl->isz : NULL;
        ts->cr[r] = in ? cl->corr[c] : 0;
        ts->mu[r] = in ? cl->mult[c] : 0;
        ts->ic[r] = in && cl->icorr ? cl->icorr[c] : 0;
        ts->fm[r] = in && cl->qf ? cl->fmult[c] : 0;
    }
    qc_tile t = {NULL, cl->KQ, cl->PB, P, ts->w, ts->o, ts->cr, ts->mu,
                 cl->icorr ? ts->ic : NULL, cl->out_u8, cl->out_zp, cl->lo, cl->hi, 0, cl->qf,
                 ts->fm};
    ts->t = t;
}

/* image n, group g: channel tile cb (32 channels on AMX, else QC_R) x pixel
 * blocks pb, pb + 1, from packed (whose first block is pb0); ts: the
 * calling thread's tile, rebuilt where it holds another */
static void run_tile(const qc_call *cl, qc_tset *ts, const uint8_t *packed, int64_t pb0,
                     int64_t pb, int64_t n, int64_t g, int64_t cb)
{
    tile_set(cl, ts, n, g, cb);
    qc_tile *t = &ts->t;
    t->packed = packed;
    t->pb0 = pb0;
#ifdef MT_QC_AMX
    if (cl->amx) {
        int64_t c0 = g * cl->Cog + cb * 32;
        tile_amx(t, cl->wrows + c0 * cl->lw, cl->lw, pb, ts->nrows, ts->o, cl->corr + c0,
                 cl->mult + c0);
        return;
    }
#endif
#ifdef MT_QC_VNNI
    if (cl->vnni) {
        tile_vnni(t, pb);
        return;
    }
    if (cl->avx2) {
        tile_avx2(t, pb);
        return;
    }
#endif
    tile_portable(t, pb);
}

/* Dense or grouped int8 conv2d, NCHW.
 *   x: uint8 [NB, C, H, W]; wrows: int8 [Co + 31][lw] (lw = K = C/G*KH*KW
 *   rounded up to 64; zeros past K and in the 31 rows after the last
 *   channel), wsum[Co] the row sums; bias int32 [Co] or NULL; mult double
 *   [Co]; out [NB, Co, OH, OW] int8 (out_u8 0), uint8 (1) or float32 (2).
 * path: 0 the best here (AMX, VNNI, AVX2, portable C), 1 portable C, 2 VNNI,
 * 3 AMX, 4 AVX2 (each where available, else the next in that order).
 * Returns the path used (1 portable, 2 VNNI, 3 AMX, 4 AVX2), or 0 when out
 * of memory. */
int mt_qconv_u8s8(const uint8_t *x, int64_t NB, int64_t C, int64_t H, int64_t W, int32_t a_zp,
                  const int8_t *wrows, int64_t lw, const int32_t *wsum, int64_t Co, int64_t G,
                  int64_t KH,
                  int64_t KW, int64_t SH, int64_t SW, int64_t PH, int64_t PW, int64_t DH,
                  int64_t DW, int64_t OH, int64_t OW, const int32_t *bias, const double *mult,
                  int32_t out_zp, int32_t lo, int32_t hi, int out_u8, void *out, int path)
{
    int64_t Cg = C / G, Cog = Co / G, K = Cg * KH * KW, KQ = cdiv(K, 4), P = OH * OW;
    int64_t PB = cdiv(P, QC_P), PP = cdiv(PB, 2);
    int direct = KH == 1 && KW == 1 && SH == 1 && SW == 1 && PH == 0 && PW == 0;
    size_t isz = out_u8 == 2 ? 4 : 1;
    int vnni = 0, amx = 0, avx2 = 0;
#ifdef MT_QC_VNNI
    vnni = path != 1 && path != 4 && mt_qgemm_has_vnni();
    avx2 = !vnni && path != 1 && has_avx2();
#endif
#ifdef MT_QC_AMX
    /* under 64 k, one tile step of the whole depth (amx_begin_kq) where a
     * group has 16 channels or more (a tile computes 32): 1 thread,
     * MobileNetV2's 16 -> 96 at 112x112 266 -> 245 us, 24 -> 144 at 56x56
     * 115 -> 93, its 3x3 stem (K 27) 164 -> 133 (tiles of 64 k, mostly
     * zeros, were slower than VNNI there) */
    amx = (path == 3 || (path == 0 && (K >= 64 || Cog >= 16))) && amx_ok();
#endif
    if (amx && K > 64)          /* whole 64-k steps: the packed rows padded with zeros */
        KQ = cdiv(K, 64) * 16;
    int vbmi = path != 1 && path != 4 && pack_vbmi_ok();     /* the packing's kernel */
    int64_t HP = H + 2 * PH, WP = W + 2 * PW;
    /* tiles in the order that reads the larger operand once: pixels outer,
     * or channels outer where the group's weights outweigh its packed input
     * (deep layers of few pixels). Pixels outer, each thread packs up to
     * four pairs of pixel blocks into its own panel (in L1) just before
     * every channel passes over them: the im2col never goes to memory and
     * back (a 56x56 3x3 layer's is 1.8 MB), and no barrier waits between
     * packing and tiles.
     * Channels outer, the whole input is packed first (every channel block
     * reads all of it); so too where the panels are under four a thread
     * (their whole blocks would split the pixels unevenly: the tiles of all
     * the input split channels too). */
    int wmajor = Cog * lw > PB * KQ * QC_P * 4;
    /* pairs of pixel blocks per panel: as many as fit 32 KB, up to 4 (a
     * shallow layer's pair is a few KB: tiles loading a panel just stored
     * wait on the stores, and each channel tile's weights serve them all) */
    int64_t PPC = 32768 / (2 * KQ * QC_P * 4);
    PPC = PPC < 1 ? 1 : PPC > 4 ? 4 : PPC;
    size_t panel_size = (size_t)(PPC * 2 * KQ * QC_P * 4);
    /* one team for the whole call (below): its size follows the call's
     * multiply-adds */
    int failed = 0, nt = mt_q_team(NB * G * Cog * P * K);
    int fused = !wmajor && cdiv(PP, PPC) >= 4 * nt;
    /* a last block of a few pixels by rem_vnni where its row dots (rem
     * KQ / 16 vpdpbusd a channel, and the sums) cost under half the
     * block's tile (KQ): the tiles then cover the first PBT blocks */
    int rem = (int)(P % QC_P);
    int remrows = vnni && !amx && !fused && rem > 0 && rem <= QC_REM &&
        2 * rem * (KQ / 16 + 16) < KQ;
    int64_t PBT = remrows ? PB - 1 : PB, PPT = cdiv(PBT, 2);
    /* the calling thread's scratch: the packed input (channels outer; 64
     * bytes where fused), then the padded planes and 64 bytes of slack for
     * the last 32-byte loads. The packing's masked loads may read up to 30
     * bytes before the planes: the packed input or those 64 bytes hold them. */
    size_t packed_size = fused ? 64 : (size_t)(PB * KQ * QC_P * 4);
    uint8_t *packed = mt_q_scratch(packed_size + (direct ? 0 : (size_t)(Cg * HP * WP + 64)));
    uint8_t *xpad = direct || !packed ? NULL : packed + packed_size;
    int8_t *zero = calloc((size_t)KQ * 4, 1);
    double *corr = malloc((size_t)Co * sizeof(double));
    int32_t *icorr = malloc((size_t)Co * (sizeof(int32_t) + sizeof(float)));
    float *fmult = icorr ? (float *)(icorr + Co) : NULL;    /* put16q's multipliers */
    int64_t *koff = malloc((size_t)K * sizeof(int64_t));
    if (!packed || !zero || !corr || !icorr || !koff) {
        free(zero);
        free(corr);
        free(icorr);
        free(koff);
        return 0;
    }
    /* the im2col's offsets (a direct read has none): nested loops, where three
     * divisions per k were 3% of MobileNetV2's int8 forward (K up to 960) */
    for (int64_t k = 0, c = 0; !direct && c < Cg; c++)
        for (int64_t i = 0; i < KH; i++)
            for (int64_t j = 0; j < KW; j++)
                koff[k++] = c * HP * WP + i * DH * WP + j * DW;
    int icorr_ok = 1;           /* put16i's bounds, for every channel */
    for (int64_t c = 0; c < Co; c++) {
        int64_t cv = (int64_t)a_zp * wsum[c] - (bias ? (int64_t)bias[c] : 0);
        corr[c] = (double)cv;
        if (!put16i_ok((double)K * 255 * 128, corr[c], mult[c], out_u8, out_zp))
            icorr_ok = 0;
        icorr[c] = icorr_ok ? (int32_t)cv : 0;
    }
    int qf = icorr_ok && has_dq();      /* put16q's bounds, for every channel */
    for (int64_t c = 0; c < Co && qf; c++) {
        qf = put16q_ok(mult[c], out_u8, out_zp, lo, hi);
        fmult[c] = (float)mult[c];
    }
    if (!direct)                /* the slack after the planes, read and masked by the packing */
        memset(xpad + Cg * HP * WP, (uint8_t)a_zp, 64);
    /* one image's small input (packed under 2^19 bytes, a few us) is padded
     * and packed by the calling thread before the team starts, so the team
     * meets once, at its end: on a loaded machine each meeting waits out
     * the time slice of a thread another process displaced (MobileNetV2's
     * 28x28 and smaller 1x1 layers took 0.25 ms at two threads for one
     * meeting and 0.47 for two, at load 6). A team of one has no meeting to
     * save: its region packs (inside the block step's team, the early
     * region was a second nested team of one a call, ~0.5 us each) */
    int early = nt > 1 && !fused && NB * G == 1 && PB * KQ * QC_P * 4 < ((int64_t)1 << 19);
    if (early) {
        /* a team of one: its worksharing loops are this thread's alone even
         * where the caller runs inside another parallel region */
#pragma omp parallel num_threads(1)
        {
            if (direct) {
                pack_rows(x, P, K, P, KQ, PB, packed);
            } else {
                pad_planes(x, Cg, H, W, PH, PW, (uint8_t)a_zp, xpad, vbmi);
                pack_im2col(xpad, koff, K, OW, SH, SW, WP, P, KQ, PB, packed, vbmi);
            }
        }
    }
    /* One team for the whole call, each (image, group) in worksharing loops
     * of it (padding; packing; tiles), whose barriers order them. A region
     * per step (as the kernel had) woke the team three times per image and
     * packed on one thread below MT_Q_GRAIN bytes: ResNet-18's 28x28 and
     * smaller layers gained 1.25-1.45x from a second thread. */
#pragma omp parallel reduction(|:failed) num_threads(nt) if (nt > 1)
    {
        uint8_t *panel = fused ? q_panel(panel_size) : NULL;
        if (fused && !panel)
            failed = 1;
#ifdef MT_QC_AMX
        if (amx)
            amx_begin_kq(KQ);
#endif
        qc_call cl = {wrows, lw, zero, corr, mult, icorr_ok ? icorr : NULL, out, isz, Co, Cog, P, PBT, KQ, out_u8, out_zp,
                      lo, hi, vnni, avx2, amx, qf, fmult};
        qc_tset ts;             /* this thread's channel tile */
        ts.n = -1;
        uint8_t *cols = remrows ? q_panel((size_t)(rem * lw)) : NULL;
        int64_t gathered = -1;  /* the (image, group) whose columns cols holds */
        if (remrows && !cols)
            failed = 1;
        int64_t CBT = amx ? cdiv(Cog, 32) : cdiv(Cog, QC_R);  /* channel tiles */
        for (int64_t n = 0; n < NB; n++)
            for (int64_t g = 0; g < G; g++) {
                const uint8_t *src = x + (n * C + g * Cg) * H * W;
                if (!direct && !early)
                    pad_planes(src, Cg, H, W, PH, PW, (uint8_t)a_zp, xpad, vbmi);
                if (fused) {
#pragma omp for schedule(static)
                    for (int64_t ch = 0; ch < cdiv(PP, PPC); ch++) {
                        if (!panel)
                            continue;
                        int64_t lo_b = ch * PPC * 2;
                        int64_t hi_b = lo_b + PPC * 2 < PB ? lo_b + PPC * 2 : PB;
                        for (int64_t b = lo_b; b < hi_b; b++) {
                            uint8_t *d = panel + (b - lo_b) * KQ * (QC_P * 4);
                            if (direct)
                                pack_rows_block(src, P, K, P, KQ, b, d);
                            else
                                pack_im2col_block(xpad, koff, K, OW, SH, SW, WP, P, KQ, b, d,
                                                  vbmi);
                        }
                        for (int64_t cb = 0; cb < CBT; cb++)
                            for (int64_t pb = lo_b; pb < hi_b; pb += 2)
                                run_tile(&cl, &ts, panel, lo_b, pb, n, g, cb);
                    }
                    continue;
                }
                if (!early && direct)
                    pack_rows(src, P, K, P, KQ, PB, packed);
                else if (!early)
                    pack_im2col(xpad, koff, K, OW, SH, SW, WP, P, KQ, PB, packed, vbmi);
                int64_t work = PPT * CBT;
#pragma omp for schedule(static) nowait
                for (int64_t i = 0; i < work; i++)
                    if (wmajor)
                        run_tile(&cl, &ts, packed, 0, (i % PPT) * 2, n, g, i / PPT);
                    else
                        run_tile(&cl, &ts, packed, 0, (i / CBT) * 2, n, g, i % CBT);
#ifdef MT_QC_VNNI
                if (remrows) {
                    /* 16 channels a step: the team's last barrier orders it */
#pragma omp for schedule(static)
                    for (int64_t cs = 0; cs < cdiv(Cog, 16); cs++) {
                        if (!cols)
                            continue;
                        int64_t c0 = g * Cog + cs * 16;
                        int64_t c1 = c0 + 16 < (g + 1) * Cog ? c0 + 16 : (g + 1) * Cog;
                        rem_vnni(&cl, packed + PBT * KQ * (QC_P * 4), rem, cols,
                                 gathered != n * G + g, n, c0, c1, PBT * QC_P);
                        gathered = n * G + g;
                    }
                }
#endif
                if (!remrows) {
#pragma omp barrier
                }
            }
#ifdef MT_QC_AMX
        if (amx)
            mt_q_amx_end();
#endif
    }
    free(icorr);
    if (failed) {
        free(zero);
        free(corr);
        free(koff);
        return 0;
    }
    free(zero);
    free(corr);
    free(koff);
    return amx ? 3 : vnni ? 2 : avx2 ? 4 : 1;
}

/* ---- depthwise ---------------------------------------------------------- */

#ifdef MT_QC_VNNI
/* one plane: xp the plane padded with a_zp ([HP][WP], WP leaves room for
 * the last vector's reads), w its KH * KW taps */
__attribute__((target("avx512f,avx512bw,avx512vl")))
static void dw_plane_avx512(const uint8_t *xp, int64_t WP, const int8_t *w, int64_t KH,
                            int64_t KW, int64_t SH, int64_t SW, int64_t DH, int64_t DW,
                            int64_t OH, int64_t OW, double corr, double mult, int out_u8,
                            int32_t out_zp, int32_t lo, int32_t hi, void *out,
                            int iep)
{
    __m512i taps[64];
    int64_t T = KH * KW;
    int few = T <= 64;
    if (few)
        for (int64_t t = 0; t < T; t++)
            taps[t] = _mm512_set1_epi32((int32_t)(uint16_t)(int16_t)w[t]);
    /* put16i's constants where iep (the caller's put16i_ok for this channel) */
    __m512i zpv = _mm512_set1_epi32(out_zp), lov = _mm512_set1_epi32(lo),
            hiv = _mm512_set1_epi32(hi);
    __m512i lo16 = _mm512_set1_epi32(0xFFFF);
    for (int64_t oh = 0; oh < OH; oh++)
        for (int64_t ow = 0; ow < OW; ow += QC_P) {
            __m512i acc = _mm512_setzero_si512();
            for (int64_t i = 0; i < KH; i++) {
                const uint8_t *row = xp + (oh * SH + i * DH) * WP + ow * SW;
                for (int64_t j = 0; j < KW; j++) {
                    const uint8_t *s = row + j * DW;
                    __m512i xv;
                    if (SW == 1)
                        xv = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)s));
                    else        /* stride 2: the even bytes of 32 */
                        xv = _mm512_and_si512(_mm512_cvtepu8_epi16(
                            _mm256_loadu_si256((const __m256i *)s)), lo16);
                    __m512i tap = few ? taps[i * KW + j]
                                      : _mm512_set1_epi32((int32_t)(uint16_t)(int16_t)w[i * KW + j]);
                    /* lanes x | 0 << 16 and w | 0 << 16: vpmaddwd gives x * w */
                    acc = _mm512_add_epi32(acc, _mm512_madd_epi16(xv, tap));
                }
            }
            int n = (int)(OW - ow < QC_P ? OW - ow : QC_P);
            if (iep)
                put16i(out, oh * OW + ow, n >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << n) - 1),
                       acc, (int32_t)corr, mult, out_u8, lo, zpv, lov, hiv);
            else
                put16(out, oh * OW + ow, n, acc, corr, mult, out_u8, out_zp, lo, hi);
        }
}

/* the vpermb indices of dw_plane_vbmi and dw_plane_vbmi3: lane t's four
 * bytes t SW + q DW, q = 0..3 */
static void dw_vbmi_ix(int64_t SW, int64_t DW, uint8_t ix[64])
{
    for (int t = 0; t < 16; t++)
        for (int q = 0; q < 4; q++)
            ix[t * 4 + q] = (uint8_t)(t * SW + q * DW);
}

/* one plane with VNNI and VBMI: each int32 lane (output pixel t) gathers
 * its four input bytes t SW + q DW (q = 0..3) of a kernel row from one
 * 64-byte load by vpermb, and vpdpbusd adds their products with four taps
 * (zeros past KW): one permute and one dot per 4 taps, where the vpmaddwd
 * kernel spends a load, a multiply and an add per tap. For SW <= 2 and
 * 15 SW + 3 DW < 64; taps: [KH][ceil(KW / 4)] int32, 4 weights each; ix:
 * dw_vbmi_ix(SW, DW), the caller's for all its planes. */
__attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi")))
static void dw_plane_vbmi(const uint8_t *xp, int64_t WP, const int32_t *taps, int64_t KH,
                          int64_t KW, int64_t SH, int64_t SW, int64_t DH, int64_t DW,
                          int64_t OH, int64_t OW, double corr, double mult, int out_u8,
                          int32_t out_zp, int32_t lo, int32_t hi, void *out,
                          int iep, const uint8_t *ix)
{
    int64_t KC = cdiv(KW, 4);
    /* put16i's constants where iep (the caller's put16i_ok for this channel) */
    __m512i zpv = _mm512_set1_epi32(out_zp), lov = _mm512_set1_epi32(lo),
            hiv = _mm512_set1_epi32(hi);
    __m512i idx = _mm512_loadu_si512(ix);
    for (int64_t oh = 0; oh < OH; oh++)
        for (int64_t ow = 0; ow < OW; ow += QC_P) {
            __m512i acc = _mm512_setzero_si512();
            for (int64_t i = 0; i < KH; i++) {
                const uint8_t *row = xp + (oh * SH + i * DH) * WP + ow * SW;
                for (int64_t c = 0; c < KC; c++) {
                    __m512i v = _mm512_loadu_si512(row + c * 4 * DW);
                    acc = _mm512_dpbusd_epi32(acc, _mm512_permutexvar_epi8(idx, v),
                                              _mm512_set1_epi32(taps[i * KC + c]));
                }
            }
            int n = (int)(OW - ow < QC_P ? OW - ow : QC_P);
            if (iep)
                put16i(out, oh * OW + ow, n >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << n) - 1),
                       acc, (int32_t)corr, mult, out_u8, lo, zpv, lov, hiv);
            else
                put16(out, oh * OW + ow, n, acc, corr, mult, out_u8, out_zp, lo, hi);
        }
}

/* dw_plane_vbmi for 3 x KW taps (KW <= 4), vertical stride SH 1 or 2 and
 * no vertical dilation, the kernel rows that MobileNetV2's 112 and 56 wide
 * layers take: down a strip of 16 outputs, each input row loaded and
 * permuted once for the (up to) three output rows that read it, where
 * dw_plane_vbmi gathers each row three times. It reads the unpadded plane
 * xs [H][W]: a strip's 64-byte window masked to the plane's columns
 * (the zero point merged in where it is padding, one mask per strip) and
 * rows above or below the plane the zero point, so no padded copy is
 * written (pad_plane_avx512 was 4% of MobileNetV2's int8 forward). The
 * epilogue put16q's where qf. taps: the three rows' 4 weights each; ix:
 * dw_vbmi_ix(SW, DW), the caller's once for all its planes (built here per
 * plane, its 64 byte stores were a tenth of a 14x14 plane's time). */
__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx512vbmi")))
static void dw_plane_vbmi3(const uint8_t *xs, int64_t H, int64_t W, int64_t PH, int64_t PW,
                           uint8_t a_zp, const int32_t *taps, int64_t SH, int64_t SW,
                           int64_t DW, int64_t OH, int64_t OW, double corr, double mult,
                           int out_u8, int32_t out_zp, int32_t lo, int32_t hi, void *out,
                           int iep, int qf, const uint8_t *ix)
{
    __m512i idx = _mm512_loadu_si512(ix);
    __m512i t0 = _mm512_set1_epi32(taps[0]), t1 = _mm512_set1_epi32(taps[1]),
            t2 = _mm512_set1_epi32(taps[2]);
    qc_ep e = qc_ep_make(out_u8, out_zp, lo, hi, qf, iep);
    __m512i pad = _mm512_set1_epi8((char)a_zp);     /* a row of padding, gathered */
    __m512 multf = _mm512_set1_ps((float)mult);
    /* where iep, the dots start at -corr (as tile_vnni's: the int32
     * epilogues then subtract nothing); put16 subtracts corr in double */
    __m512i acc0 = _mm512_set1_epi32(iep ? -(int32_t)corr : 0);
    for (int64_t ow = 0; ow < OW; ow += QC_P) {
        int64_t w0 = ow * SW - PW;      /* the window's first column */
        /* the window's bytes inside the plane's columns [0, W) */
        int64_t a = w0 < 0 ? -w0 : 0, b = W - w0 < 64 ? W - w0 : 64;
        __mmask64 cm = b <= a ? 0 : (b - a == 64 ? ~(__mmask64)0
                                                 : (((__mmask64)1 << (b - a)) - 1) << a);
        const uint8_t *col = xs + w0;
#define QC_ROW(ih) ((ih) < 0 || (ih) >= H ? pad : _mm512_permutexvar_epi8(                  \
            idx, _mm512_mask_loadu_epi8(pad, cm, col + (ih) * W)))
        int n = (int)(OW - ow < QC_P ? OW - ow : QC_P);
        /* the gathered input rows oh SH - PH and oh SH - PH + 1 */
        __m512i r0 = QC_ROW(-PH), r1 = QC_ROW(1 - PH);
        int64_t oh = 0;
        /* two output rows a step where put2x16s stores them (the same
         * bits as one at a time: its tie check redoes both by put16i) */
        for (; e.qf && e.sat && oh + 1 < OH; oh += 2) {
            int64_t ih = oh * SH - PH;
            __m512i a0, a1;
            if (SH == 1) {
                __m512i r2 = QC_ROW(ih + 2), r3 = QC_ROW(ih + 3);
                a0 = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(
                    _mm512_dpbusd_epi32(acc0, r0, t0), r1, t1), r2, t2);
                a1 = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(
                    _mm512_dpbusd_epi32(acc0, r1, t0), r2, t1), r3, t2);
                r0 = r2;
                r1 = r3;
            } else {
                __m512i q1 = QC_ROW(ih + 1), q2 = QC_ROW(ih + 2), q3 = QC_ROW(ih + 3),
                        q4 = QC_ROW(ih + 4);
                a0 = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(
                    _mm512_dpbusd_epi32(acc0, r0, t0), q1, t1), q2, t2);
                a1 = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(
                    _mm512_dpbusd_epi32(acc0, q2, t0), q3, t1), q4, t2);
                r0 = q4;
            }
            __mmask16 m = n >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << n) - 1);
            put2x16s((char *)out + oh * OW + ow, (char *)out + (oh + 1) * OW + ow, m, a0, a1,
                     multf, mult, out_u8, lo, e.zpv, e.lov, e.hiv, e.zps, e.flip);
        }
        for (; oh < OH; oh++) {
            int64_t ih = oh * SH - PH;
            __m512i r2;
            if (SH == 1) {
                r2 = QC_ROW(ih + 2);
            } else {
                r1 = QC_ROW(ih + 1);
                r2 = QC_ROW(ih + 2);
            }
            __m512i acc = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(
                _mm512_dpbusd_epi32(acc0, r0, t0), r1, t1), r2, t2);
            if (SH == 1) {
                r0 = r1;
                r1 = r2;
            } else {
                r0 = r2;
            }
            qc_ep_put(&e, out, oh * OW + ow, n, acc, corr, 0, multf, mult);
        }
#undef QC_ROW
    }
}

static int has_vbmi(void)
{
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512vbmi");
}

/* one plane with AVX2 alone: 8 output pixels per vector, x widened to
 * int32 lanes (stride 2: the even bytes of 16), vpmaddwd against the
 * broadcast tap as dw_plane_avx512 does */
__attribute__((target("avx2")))
static void dw_plane_avx2(const uint8_t *xp, int64_t WP, const int8_t *w, int64_t KH,
                          int64_t KW, int64_t SH, int64_t SW, int64_t DH, int64_t DW,
                          int64_t OH, int64_t OW, double corr, double mult, int out_u8,
                          int32_t out_zp, int32_t lo, int32_t hi, void *out)
{
    __m256i lo16 = _mm256_set1_epi32(0xFFFF);
    for (int64_t oh = 0; oh < OH; oh++)
        for (int64_t ow = 0; ow < OW; ow += 8) {
            __m256i acc = _mm256_setzero_si256();
            for (int64_t i = 0; i < KH; i++) {
                const uint8_t *row = xp + (oh * SH + i * DH) * WP + ow * SW;
                for (int64_t j = 0; j < KW; j++) {
                    const uint8_t *s = row + j * DW;
                    __m256i xv;
                    if (SW == 1)
                        xv = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)s));
                    else
                        xv = _mm256_and_si256(_mm256_cvtepu8_epi16(
                            _mm_loadu_si128((const __m128i *)s)), lo16);
                    __m256i tap = _mm256_set1_epi32((int32_t)(uint16_t)(int16_t)w[i * KW + j]);
                    acc = _mm256_add_epi32(acc, _mm256_madd_epi16(xv, tap));
                }
            }
            int n = (int)(OW - ow < 8 ? OW - ow : 8);
            put8_avx2(out, oh * OW + ow, n, acc, corr, mult, out_u8, out_zp, lo, hi);
        }
}

/* what a depthwise channel's accumulator lacks before requantizing: the
 * input zero point times the sum of its n taps, less its bias, so that
 * requantize((acc - corr) * mult) is the integer result */
static inline double dw_corr(const int8_t *w, int64_t n, int32_t a_zp, int32_t bias)
{
    int32_t ws = 0;
    for (int64_t t = 0; t < n; t++)
        ws += w[t];
    return (double)((int64_t)a_zp * ws - (int64_t)bias);
}

#endif

#ifdef MT_QC_VNNI
/* Small planes (OW <= 8: a plane's row leaves lanes of the per-plane kernels
 * idle, and their per-plane setup is most of the time) run 16 channels at a
 * time, channels in the lanes: each block's 16 planes are padded with the
 * zero point (pl: [16][HP][WQ], WQ = WP + 3) and rearranged into q[hp][w]
 * = 16 dwords, channel c's the 4 bytes of its padded row hp from column w
 * on; weights wt[kh][kc] = 16 dwords of channel c's taps (kh, 4kc..4kc+3),
 * zeros past KW. Output (oh, ow) of the 16 channels is then one vpdpbusd
 * per (kh, kc): q[oh*SH + kh*DH][ow*SW + 4kc] . wt[kh][kc] (DW 1: a dword's
 * 4 bytes are 4 adjacent taps). The dot is the per-plane kernels' (the
 * padded input times the taps), the epilogue put16's arithmetic per lane
 * (each lane its channel's corr and mult), written to t[pixel][16] and then
 * to the 16 output planes. */
__attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni")))
static void dw_block16(const uint8_t *x, int64_t H, int64_t W, int32_t a_zp, const int8_t *w,
                       int64_t KH, int64_t KW, int64_t SH, int64_t SW, int64_t PH, int64_t PW,
                       int64_t DH, int64_t OH, int64_t OW, const double *corr,
                       const double *mult, int out_u8, int32_t out_zp, int32_t lo, int32_t hi,
                       void *out, uint8_t *buf)
{
    int64_t HP = H + 2 * PH, WP = W + 2 * PW, WQ = WP + 3, KC = cdiv(KW, 4), P = OH * OW;
    uint8_t *pl = buf;                                   /* [16][HP][WQ] */
    uint32_t *q = (uint32_t *)(pl + ((16 * HP * WQ + 63) & ~(int64_t)63));  /* [HP][WP][16] */
    uint8_t *t = (uint8_t *)(q + HP * WP * 16);          /* [P][16] outputs */
    __m512i wt[64];
    memset(pl, (int)(uint8_t)a_zp, (size_t)(16 * HP * WQ));
    for (int c = 0; c < 16; c++)
        for (int64_t h = 0; h < H; h++)
            memcpy(pl + (c * HP + h + PH) * WQ + PW, x + (c * H + h) * W, (size_t)W);
    __m512i lane = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4,
                                                       3, 2, 1, 0),
                                      _mm512_set1_epi32((int)(HP * WQ)));
    for (int64_t hp = 0; hp < HP; hp++)
        for (int64_t wp = 0; wp < WP; wp++)
            _mm512_storeu_si512(q + (hp * WP + wp) * 16,
                                _mm512_i32gather_epi32(lane, pl + hp * WQ + wp, 1));
    for (int64_t kh = 0; kh < KH; kh++)
        for (int64_t kc = 0; kc < KC; kc++) {
            uint32_t v[16];
            for (int c = 0; c < 16; c++) {
                uint8_t b[4] = {0, 0, 0, 0};
                for (int i = 0; i < 4 && kc * 4 + i < KW; i++)
                    b[i] = (uint8_t)w[c * KH * KW + kh * KW + kc * 4 + i];
                memcpy(&v[c], b, 4);
            }
            wt[kh * KC + kc] = _mm512_loadu_si512(v);
        }
    __m512d c0 = _mm512_loadu_pd(corr), c1 = _mm512_loadu_pd(corr + 8);
    __m512d k0 = _mm512_loadu_pd(mult), k1 = _mm512_loadu_pd(mult + 8);
    __m512d l = _mm512_set1_pd((double)lo - (double)out_zp),
            h = _mm512_set1_pd((double)hi - (double)out_zp);
    for (int64_t oh = 0; oh < OH; oh++)
        for (int64_t ow = 0; ow < OW; ow++) {
            __m512i acc = _mm512_setzero_si512();
            for (int64_t kh = 0; kh < KH; kh++) {
                const uint32_t *row = q + ((oh * SH + kh * DH) * WP + ow * SW) * 16;
                for (int64_t kc = 0; kc < KC; kc++)
                    acc = _mm512_dpbusd_epi32(acc, _mm512_loadu_si512(row + kc * 4 * 16),
                                              wt[kh * KC + kc]);
            }
            __m512d d0 = _mm512_mul_pd(_mm512_sub_pd(
                _mm512_cvtepi32_pd(_mm512_castsi512_si256(acc)), c0), k0);
            __m512d d1 = _mm512_mul_pd(_mm512_sub_pd(
                _mm512_cvtepi32_pd(_mm512_extracti64x4_epi64(acc, 1)), c1), k1);
            int64_t p = oh * OW + ow;
            if (out_u8 == 2) {
                if (lo == 0) {
                    d0 = _mm512_max_pd(d0, _mm512_setzero_pd());
                    d1 = _mm512_max_pd(d1, _mm512_setzero_pd());
                }
                __m512 f = _mm512_castpd_ps(_mm512_insertf64x4(
                    _mm512_castpd256_pd512(_mm256_castps_pd(_mm512_cvtpd_ps(d0))),
                    _mm256_castps_pd(_mm512_cvtpd_ps(d1)), 1));
                if (hi > 0)
                    f = relu6_ps(f, hi);
                _mm512_storeu_ps((float *)t + p * 16, f);
                continue;
            }
            d0 = _mm512_min_pd(_mm512_max_pd(d0, l), h);   /* as put16 */
            d1 = _mm512_min_pd(_mm512_max_pd(d1, l), h);
            __m512i v = _mm512_inserti64x4(
                _mm512_castsi256_si512(_mm512_cvt_roundpd_epi32(
                    d0, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)),
                _mm512_cvt_roundpd_epi32(d1, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), 1);
            v = _mm512_add_epi32(v, _mm512_set1_epi32(out_zp));
            _mm_storeu_si128((__m128i *)(t + p * 16), _mm512_cvtepi32_epi8(v));
        }
    for (int c = 0; c < 16; c++) {
        if (out_u8 == 2) {
            float *o = (float *)out + c * P;
            for (int64_t p = 0; p < P; p++)
                o[p] = ((float *)t)[p * 16 + c];
        } else {
            uint8_t *o = (uint8_t *)out + c * P;
            for (int64_t p = 0; p < P; p++)
                o[p] = t[p * 16 + c];
        }
    }
}

/* the scratch dw_block16 needs for one block */
static size_t dw_block16_size(int64_t H, int64_t W, int64_t PH, int64_t PW, int64_t OH,
                              int64_t OW)
{
    int64_t HP = H + 2 * PH, WP = W + 2 * PW, WQ = WP + 3;
    return (size_t)(((16 * HP * WQ + 63) & ~(int64_t)63) + HP * WP * 64 + OH * OW * 64 + 64);
}
#endif

#ifdef MT_QC_VNNI
/* Flat-pixel depthwise (path 6): a plane's OH * OW outputs taken 16 at a
 * time in their NCHW order, across row ends, so a 7x7 plane is 4 vectors
 * (the per-row kernels spend 7 on it, 16 lanes each for 7 pixels) and a
 * 14x14 one 13 (not 14). Each vector's chunk (kh, kc) gathers its lanes'
 * four input bytes t SW + q DW from a window of 127 bytes of the unpadded
 * plane (two loads, masked to the plane) by one vpermt2b, padding read
 * from byte 127 (the zero point), then one vpdpbusd with four taps. The
 * gather indices depend on the geometry alone: built once per geometry
 * (dwf_get) and kept, so a call spends nothing per plane on padding.
 * Windows: one per plane where the plane fits in 127 bytes (7x7: loaded
 * once), else one per vector where its chunks all fit (14x14 s1, 28x28
 * s1), else one per chunk; a geometry where a chunk's bytes span more
 * than 127 takes the per-row kernels. */
/* 1 where path 0 takes the flat kernel for outputs OW wide: rows of at
 * most half a vector, or under a vector where dw_plane_vbmi3 does not
 * apply (three: its geometry). One thread, MobileNetV2: 7x7x960 47 -> 34
 * us, 14 -> 7 stride 2 30 -> 23; at 14 wide dw_plane_vbmi3 is faster
 * (14x14x384 28 against 35 us, 28 -> 14 stride 2 16 against 19) */
static int dwf_pays(int64_t OW, int three) { return OW <= 8 || (!three && OW < 16); }

#define DWF_MAXC 512            /* the most vectors x chunks a geometry keeps */

typedef struct {
    int64_t key[10];            /* H W KH KW SH SW PH PW DH DW; key[0] 0: empty */
    int64_t NV, NC, mode;       /* vectors, chunks per vector; windows: 0 plane, 1 vector, 2 chunk */
    int64_t *base;              /* [windows] the window's first byte in the plane */
    uint64_t *lm;               /* [windows][2] its two loads' masks (byte 127 never loaded) */
    uint8_t *idx;               /* [NV][NC][64] vpermt2b indices, 127 for padding */
} dwf_table;

static __thread dwf_table dwf_cache[4];
static __thread int dwf_next;

/* the vpermt2b indices of vector v's chunk (kh, kc) relative to its
 * window's first byte b (into ix [64]); returns the chunk's lowest and
 * highest plane offsets through lo / hi (hi < 0: all padding) */
static void dwf_chunk(const int64_t *g, int64_t OW, int64_t P, int64_t v, int64_t kh,
                      int64_t kc, int64_t b, uint8_t *ix, int64_t *lo, int64_t *hi)
{
    int64_t H = g[0], W = g[1], KW = g[3], SH = g[4], SW = g[5], PH = g[6], PW = g[7],
            DH = g[8], DW = g[9];
    *lo = INT64_MAX;
    *hi = -1;
    for (int t = 0; t < 16; t++)
        for (int q = 0; q < 4; q++) {
            int64_t p = v * 16 + t, kw = kc * 4 + q, at = -1;
            if (p < P && kw < KW) {
                int64_t ih = (p / OW) * SH + kh * DH - PH, iw = (p % OW) * SW + kw * DW - PW;
                if (ih >= 0 && ih < H && iw >= 0 && iw < W)
                    at = ih * W + iw;
            }
            if (at >= 0) {
                *lo = at < *lo ? at : *lo;
                *hi = at > *hi ? at : *hi;
            }
            if (ix)
                ix[t * 4 + q] = (uint8_t)(at < 0 ? 127 : at - b);
        }
}

/* the two load masks of a window from byte b of a plane of n bytes */
static void dwf_masks(int64_t b, int64_t n, uint64_t *lm)
{
    for (int h = 0; h < 2; h++) {
        int64_t k = n - b - 64 * h;          /* plane bytes from this load's start */
        int64_t lim = h ? 63 : 64;           /* byte 127 stays the zero point */
        k = k < 0 ? 0 : k > lim ? lim : k;
        lm[h] = k == 64 ? ~(uint64_t)0 : (((uint64_t)1 << k) - 1);
    }
}

/* the table of geometry g (outputs OH x OW), built where absent; NULL
 * where a chunk spans more than 127 bytes, there are more than DWF_MAXC
 * chunks or memory ran out */
static const dwf_table *dwf_get(const int64_t *g, int64_t OH, int64_t OW)
{
    for (int i = 0; i < 4; i++)
        if (dwf_cache[i].key[0] && !memcmp(dwf_cache[i].key, g, sizeof dwf_cache[i].key))
            return dwf_cache[i].idx ? &dwf_cache[i] : NULL;
    int64_t P = OH * OW, NV = cdiv(P, 16), KC = cdiv(g[3], 4), NC = g[2] * KC, HW = g[0] * g[1];
    dwf_table *t = &dwf_cache[dwf_next];
    dwf_next = (dwf_next + 1) % 4;
    free(t->base);
    free(t->lm);
    free(t->idx);
    memset(t, 0, sizeof *t);
    memcpy(t->key, g, sizeof t->key);   /* remembered also where it fails: NULL at once */
    if (NV * NC > DWF_MAXC)
        return NULL;
    /* the widest span decides the windows */
    int64_t mode = HW <= 127 ? 0 : 1;
    for (int64_t v = 0; v < NV && mode < 3; v++) {
        int64_t vlo = INT64_MAX, vhi = -1;
        for (int64_t c = 0; c < NC; c++) {
            int64_t lo, hi;
            dwf_chunk(g, OW, P, v, c / KC, c % KC, 0, NULL, &lo, &hi);
            if (hi >= 0 && hi - lo >= 127)
                mode = 3;
            if (hi >= 0) {
                vlo = lo < vlo ? lo : vlo;
                vhi = hi > vhi ? hi : vhi;
            }
        }
        if (mode == 1 && vhi >= 0 && vhi - vlo >= 127)
            mode = 2;
    }
    if (mode == 3)
        return NULL;
    int64_t nw = mode == 0 ? 1 : mode == 1 ? NV : NV * NC;
    t->base = malloc((size_t)nw * sizeof *t->base);
    t->lm = malloc((size_t)nw * 2 * sizeof *t->lm);
    t->idx = q_alloc64((size_t)(NV * NC * 64));
    if (!t->base || !t->lm || !t->idx) {
        free(t->base);
        free(t->lm);
        free(t->idx);
        t->base = NULL;
        t->lm = NULL;
        t->idx = NULL;
        return NULL;
    }
    for (int64_t v = 0; v < NV; v++) {
        int64_t vlo = INT64_MAX;
        for (int64_t c = 0; c < NC; c++) {
            int64_t lo, hi;
            dwf_chunk(g, OW, P, v, c / KC, c % KC, 0, NULL, &lo, &hi);
            if (hi >= 0 && lo < vlo)
                vlo = lo;
            if (mode == 2)
                t->base[v * NC + c] = hi >= 0 ? lo : 0;
        }
        if (mode == 1)
            t->base[v] = vlo == INT64_MAX ? 0 : vlo;
    }
    if (mode == 0)
        t->base[0] = 0;
    for (int64_t v = 0; v < NV; v++)
        for (int64_t c = 0; c < NC; c++) {
            int64_t lo, hi, w = mode == 0 ? 0 : mode == 1 ? v : v * NC + c;
            dwf_chunk(g, OW, P, v, c / KC, c % KC, t->base[w], t->idx + (v * NC + c) * 64, &lo,
                      &hi);
        }
    for (int64_t w = 0; w < nw; w++)
        dwf_masks(t->base[w], HW, t->lm + 2 * w);
    t->NV = NV;
    t->NC = NC;
    t->mode = mode;
    return t;
}

/* one plane xs [H][W] (unpadded) by table t: taps [NC] int32 (4 weights
 * each, zeros past KW), outputs out [OH * OW]; qdq: the caller's has_dq() */
/* the dot of dw_plane_flat's vector v (16 outputs from v * 16 on): its
 * windows loaded (mode 1: one a vector, 2: one a chunk; mode 0's, the
 * plane's, the caller's wl and wh), gathered and multiplied by the taps */
__attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi")))
static inline __attribute__((always_inline))
__m512i dwf_dot(const uint8_t *xs, const dwf_table *t, const int32_t *taps, int64_t v,
                __m512i wl, __m512i wh, __m512i top, __m512i acc)
{
    int64_t NC = t->NC, mode = t->mode;
    if (mode == 1) {
        const uint8_t *b = xs + t->base[v];
        wl = _mm512_maskz_loadu_epi8(t->lm[2 * v], b);
        wh = _mm512_or_si512(_mm512_maskz_loadu_epi8(t->lm[2 * v + 1], b + 64), top);
    }
    const uint8_t *ix = t->idx + v * NC * 64;
    for (int64_t c = 0; c < NC; c++) {
        if (mode == 2) {
            int64_t w = v * NC + c;
            const uint8_t *b = xs + t->base[w];
            wl = _mm512_maskz_loadu_epi8(t->lm[2 * w], b);
            wh = _mm512_or_si512(_mm512_maskz_loadu_epi8(t->lm[2 * w + 1], b + 64), top);
        }
        __m512i g = _mm512_permutex2var_epi8(wl, _mm512_load_si512(ix + c * 64), wh);
        acc = _mm512_dpbusd_epi32(acc, g, _mm512_set1_epi32(taps[c]));
    }
    return acc;
}

__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx512vbmi")))
static void dw_plane_flat(const uint8_t *xs, const dwf_table *t, const int32_t *taps, int64_t P,
                          uint8_t a_zp, double corr, double mult, int out_u8, int32_t out_zp,
                          int32_t lo, int32_t hi, void *out, int iep, int qdq)
{
    qc_ep e = qc_ep_make(out_u8, out_zp, lo, hi, iep && qdq && put16q_ok(mult, out_u8, out_zp, lo, hi),
                         iep);
    __m512 multf = _mm512_set1_ps((float)mult);
    /* byte 63 of the high load: the zero point the padding indices read */
    __m512i top = _mm512_maskz_set1_epi8((__mmask64)1 << 63, (char)a_zp);
    __m512i wl = _mm512_setzero_si512(), wh = wl;
    if (t->mode == 0) {
        wl = _mm512_maskz_loadu_epi8(t->lm[0], xs);
        wh = _mm512_or_si512(_mm512_maskz_loadu_epi8(t->lm[1], xs + 64), top);
    }
    /* where iep, the dots start at -corr (as dw_plane_vbmi3's) */
    __m512i acc0 = _mm512_set1_epi32(iep ? -(int32_t)corr : 0);
    int64_t v = 0;
    if (e.qf && e.sat) {            /* two vectors a step: put32s */
        for (; v + 1 < t->NV; v += 2) {
            int64_t at = v * 16, n1 = P - at - 16 < 16 ? P - at - 16 : 16;
            put32s(out, at, 0xFFFF, (__mmask16)((1u << n1) - 1),
                   dwf_dot(xs, t, taps, v, wl, wh, top, acc0),
                   dwf_dot(xs, t, taps, v + 1, wl, wh, top, acc0), 0, multf, mult, out_u8, lo,
                   e.zpv, e.lov, e.hiv, e.zps, e.flip);
        }
    }
    for (; v < t->NV; v++) {
        int64_t at = v * 16;
        qc_ep_put(&e, out, at, (int)(P - at < 16 ? P - at : 16),
                  dwf_dot(xs, t, taps, v, wl, wh, top, acc0), corr, 0, multf, mult);
    }
}
#endif

/* Depthwise int8 conv2d (one input channel and one filter per group), NCHW,
 * with the vector kernels: strides 1 and 2 across, any other geometry.
 * Arguments as qgemm.c's mt_qdwconv_u8s8 (w int8 [C][KH * KW]); path 2
 * keeps to the AVX-512 vpmaddwd kernel, 4 to the AVX2 one (which CPUs
 * without AVX-512 VNNI run), other paths take the VBMI one where it
 * applies. Returns the kernel used (2 vpmaddwd, 3 VBMI, 4 AVX2), 0 when
 * none applies (no AVX2, another horizontal stride, out of memory): the
 * caller runs the scalar one. */
int mt_qdwconv_vec_u8s8(const uint8_t *x, int64_t NB, int64_t C, int64_t H, int64_t W,
                        int32_t a_zp, const int8_t *w, int64_t KH, int64_t KW, int64_t SH,
                        int64_t SW, int64_t PH, int64_t PW, int64_t DH, int64_t DW, int64_t OH,
                        int64_t OW, const int32_t *bias, const double *mult, int32_t out_zp,
                        int32_t lo, int32_t hi, int out_u8, void *out, int path)
{
#ifdef MT_QC_VNNI
    /* flat pixels (path 6 asks for it) */
    /* dw_plane_vbmi3's geometry (kind 3, three rows of at most 4 taps) */
    int three = KH == 3 && KW <= 4 && DH == 1 && (SH == 1 || SH == 2) && (SW == 1 || SW == 2) &&
                15 * SW + 3 * DW < 64;
    if ((path == 6 || (path == 0 && dwf_pays(OW, three))) && mt_qgemm_has_vnni() && has_vbmi()) {
        int64_t g[10] = {H, W, KH, KW, SH, SW, PH, PW, DH, DW};
        const dwf_table *t = dwf_get(g, OH, OW);
        if (t) {
            int64_t planes = NB * C, KC = cdiv(KW, 4), P = OH * OW;
            size_t isz = out_u8 == 2 ? 4 : 1;
            int nt = mt_q_team(planes * P * KH * KW * MT_Q_DW_COST), qdq = has_dq();
#pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1)
            for (int64_t p = 0; p < planes; p++) {
                int64_t c = p % C;
                const int8_t *wc = w + c * KH * KW;
                int32_t taps[DWF_MAXC];
                /* the chunks' taps by nested loops (no division per chunk) */
                for (int64_t i = 0, k = 0; i < KH; i++)
                    for (int64_t kc = 0; kc < KC; kc++, k++) {
                        uint8_t b[4] = {0, 0, 0, 0};
                        for (int q = 0; q < 4 && kc * 4 + q < KW; q++)
                            b[q] = (uint8_t)wc[i * KW + kc * 4 + q];
                        memcpy(&taps[k], b, 4);
                    }
                double corr = dw_corr(wc, KH * KW, a_zp, bias ? bias[c] : 0);
                int iep = put16i_ok((double)(KH * KW) * 255 * 128, corr, mult[c], out_u8, out_zp);
                dw_plane_flat(x + p * H * W, t, taps, P, (uint8_t)a_zp, corr, mult[c], out_u8,
                              out_zp, lo, hi, (char *)out + (size_t)(p * P) * isz, iep, qdq);
            }
            return 6;
        }
    }
    /* 16 channels at a time where a plane's rows are short (path 5 asks for it):
     * MobileNetV2's 7-wide layers, 960 x 7 x 7: 123 -> 72 us on one thread; at
     * 14 wide the per-plane kernels are as fast */
    if ((path == 5 || (path == 0 && OW <= 8)) && C % 16 == 0 && DW == 1 && KW <= 16 &&
            KH * cdiv(KW, 4) <= 64 && mt_qgemm_has_vnni()) {
        int64_t blocks = NB * (C / 16);
        size_t need = dw_block16_size(H, W, PH, PW, OH, OW);
        size_t isz = out_u8 == 2 ? 4 : 1;
        int failed = 0, nt = mt_q_team(NB * C * OH * OW * KH * KW * MT_Q_DW_COST);
#pragma omp parallel reduction(|:failed) num_threads(nt) if (nt > 1 && blocks > 1)
        {
            uint8_t *buf = mt_q_scratch(need);
            double cr[16], mu[16];
            if (!buf)
                failed = 1;
#pragma omp for schedule(static)
            for (int64_t b = 0; b < blocks; b++) {
                if (!buf)
                    continue;
                int64_t c0 = (b % (C / 16)) * 16, n = b / (C / 16);
                for (int i = 0; i < 16; i++) {
                    cr[i] = dw_corr(w + (c0 + i) * KH * KW, KH * KW, a_zp,
                                    bias ? bias[c0 + i] : 0);
                    mu[i] = mult[c0 + i];
                }
                dw_block16(x + (n * C + c0) * H * W, H, W, a_zp, w + c0 * KH * KW, KH, KW,
                           SH, SW, PH, PW, DH, OH, OW, cr, mu, out_u8, out_zp, lo, hi,
                           (char *)out + (size_t)((n * C + c0) * OH * OW) * isz, buf);
            }
        }
        if (!failed)
            return 5;
        return 0;
    }
    if (SW != 1 && SW != 2)
        return 0;
    int64_t HP = H + 2 * PH, KC = cdiv(KW, 4), WP = W + 2 * PW, need;
    int kind;                   /* the kernel: 2 vpmaddwd, 3 VBMI, 4 AVX2 */
    if (path == 4 || !mt_qgemm_has_vnni()) {
        if (!has_avx2())
            return 0;
        kind = 4;               /* planes padded with memset / memcpy (no AVX-512 here) */
        need = cdiv(OW, 8) * 8 * SW + (KW - 1) * DW + 16;
    } else {
        kind = path != 2 && has_vbmi() && 15 * SW + 3 * DW < 64 && KH * KC <= 256 ? 3 : 2;
        /* the last vector reads up to (ceil(OW/16)*16 - 1) * SW + (KW - 1) * DW,
         * 32 bytes at a time for stride 2, or 64 from each 4-tap chunk (vbmi) */
        need = cdiv(OW, QC_P) * QC_P * SW + KC * 4 * DW + 64;
    }
    if (WP < need)
        WP = need;
    if (kind != 4)              /* each padded row from a cache line's start */
        WP = cdiv(WP, 64) * 64;
    int64_t planes = NB * C;
    size_t isz = out_u8 == 2 ? 4 : 1;
    int qdq = has_dq();         /* put16q where the CPU has AVX-512 DQ */
    uint8_t ix[64];             /* dw_plane_vbmi's and dw_plane_vbmi3's indices */
    dw_vbmi_ix(SW, DW, ix);
    int failed = 0, nt = mt_q_team(planes * OH * OW * KH * KW * MT_Q_DW_COST);
#pragma omp parallel reduction(|:failed) num_threads(nt) if (nt > 1)
    {
        uint8_t *buf = mt_q_scratch((size_t)(HP * WP));     /* this thread's, kept */
        if (!buf)
            failed = 1;
#pragma omp for schedule(static)
        for (int64_t p = 0; p < planes; p++) {
            if (!buf)
                continue;
            int64_t c = p % C;
            const uint8_t *xs = x + p * H * W;
            const int8_t *wc = w + c * KH * KW;
            void *op = (char *)out + (size_t)(p * OH * OW) * isz;
            double corr = dw_corr(wc, KH * KW, a_zp, bias ? bias[c] : 0);
            int iep = put16i_ok((double)(KH * KW) * 255 * 128, corr, mult[c], out_u8, out_zp);
            if (kind == 4) {
                memset(buf, (int)(uint8_t)a_zp, (size_t)(HP * WP));
                for (int64_t h = 0; h < H; h++)
                    memcpy(buf + (h + PH) * WP + PW, xs + h * W, (size_t)W);
                dw_plane_avx2(buf, WP, wc, KH, KW, SH, SW, DH, DW, OH, OW, corr, mult[c], out_u8,
                              out_zp, lo, hi, op);
                continue;
            }
            if (kind == 3) {
                int32_t taps[256];
                for (int64_t i = 0; i < KH; i++)
                    for (int64_t k = 0; k < KC; k++) {
                        uint8_t b[4] = {0, 0, 0, 0};
                        for (int q = 0; q < 4 && k * 4 + q < KW; q++)
                            b[q] = (uint8_t)wc[i * KW + k * 4 + q];
                        memcpy(&taps[i * KC + k], b, 4);
                    }
                if (three) {    /* reads the plane itself: no padded copy */
                    dw_plane_vbmi3(xs, H, W, PH, PW, (uint8_t)a_zp, taps, SH, SW, DW, OH, OW,
                                   corr, mult[c], out_u8, out_zp, lo, hi, op, iep,
                                   iep && qdq && put16q_ok(mult[c], out_u8, out_zp, lo, hi),
                                   ix);
                    continue;
                }
                pad_plane_avx512(buf, xs, H, W, PH, PW, HP, WP, (uint8_t)a_zp);
                dw_plane_vbmi(buf, WP, taps, KH, KW, SH, SW, DH, DW, OH, OW, corr, mult[c],
                              out_u8, out_zp, lo, hi, op, iep, ix);
                continue;
            }
            pad_plane_avx512(buf, xs, H, W, PH, PW, HP, WP, (uint8_t)a_zp);
            dw_plane_avx512(buf, WP, wc, KH, KW, SH, SW, DH, DW, OH, OW, corr, mult[c], out_u8,
                            out_zp, lo, hi, op, iep);
        }
    }
    return failed ? 0 : kind;
#else
    (void)x; (void)NB; (void)C; (void)H; (void)W; (void)a_zp; (void)w; (void)KH; (void)KW;
    (void)SH; (void)SW; (void)PH; (void)PW; (void)DH; (void)DW; (void)OH; (void)OW;
    (void)bias; (void)mult; (void)out_zp; (void)lo; (void)hi; (void)out_u8; (void)out;
    (void)path;
    return 0;
#endif
}
