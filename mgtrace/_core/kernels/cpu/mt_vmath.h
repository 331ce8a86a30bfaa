/* Vectorised float32 math for the kernels: exp, erf and the activations
 * built on them, on 16 lanes at a time.
 *
 * libm's expf and erff are a call per element, and GCC 12 does not turn a
 * scalar exp's selects into vector code, so these are written with GCC
 * vector extensions. A 16-lane vector is four SSE registers in the baseline
 * build, two AVX2 registers in the x86-64-v3 clone and one AVX-512 register
 * in the x86-64-v4 clone: loops that call these carry MT_VCLONES, so the
 * CPU picks its widest variant at run time (as MT_CLONES does for AVX2).
 *
 * Accuracy (float32, checked against double-precision libm in
 * tests/core/test_fused_kernels.py): exp within 1 ulp (subnormal results included);
 * erf within 4e-7 absolute (libm erff: 6e-8), so GELU is within 1e-6
 * absolute of the exact erf GELU.
 */
#ifndef MT_VMATH_H
#define MT_VMATH_H
#include "mt_common.h"

/* MT_VL, mt_vf, mt_vi and MT_VCLONES: mt_simd.h's */
#define MT_VINLINE static inline __attribute__((always_inline))

MT_VINLINE mt_vf mt_vsplat(float v) { return (mt_vf){0.f} + v; }

/* m ? a : b, lane by lane (m from a vector comparison: all ones or zero) */
MT_VINLINE mt_vf mt_vsel(mt_vi m, mt_vf a, mt_vf b) {
    return (mt_vf)((m & (mt_vi)a) | (~m & (mt_vi)b));
}

/* exp: range reduction x = n ln2 + r with a two-part ln2, a degree-7 Taylor
 * polynomial on |r| <= ln2/2, and 2^n from exponent bits in two halves so
 * that subnormal results stay right. Inf above 88.72, 0 below -103.97, NaN
 * stays NaN. */
MT_VINLINE mt_vf mt_vexp(mt_vf x) {
    const mt_vf hi = mt_vsplat(88.72283935546875f), lo = mt_vsplat(-103.97208404541016f);
    mt_vf c = mt_vsel(x > hi, hi, x);
    /* below lo the result is 0 (selected at the end): computed from 0, not
     * from lo, whose 2^n product is subnormal, and a subnormal product costs
     * a microcode assist per lane on Intel cores (a softmax over masked
     * keys, all of them below lo, ran 1.5x slower) */
    c = mt_vsel(c < lo, mt_vsplat(0.f), c);
    mt_vf y = c * 1.44269504088896341f + 0.5f;
    mt_vf t = __builtin_convertvector(__builtin_convertvector(y, mt_vi), mt_vf);
    mt_vf n = mt_vsel(t > y, t - 1.0f, t);                   /* floor(y) */
    mt_vf r = c - n * 0.693145751953125f - n * 1.428606765330187e-06f;
    mt_vf p = 1.0f + r * (1.0f + r * (0.5f + r * (1.6666667e-1f + r * (4.1666668e-2f +
              r * (8.3333338e-3f + r * (1.3888889e-3f + r * 1.9841270e-4f))))));
    mt_vi ni = __builtin_convertvector(n, mt_vi), n1 = ni >> 1, n2 = ni - n1;
    mt_vf res = p * (mt_vf)((n1 + 127) << 23) * (mt_vf)((n2 + 127) << 23);
    res = mt_vsel(x > hi, mt_vsplat(INFINITY), res);
    res = mt_vsel(x < lo, mt_vsplat(0.f), res);
    return mt_vsel(x != x, x, res);
}

/* erf: an odd rational function x P(x^2) / Q(x^2) on [-4, 4] (the
 * approximation Eigen and XLA use for float32; beyond +-4, erf is +-1 in
 * float32). NaN stays NaN. */
MT_VINLINE mt_vf mt_verf(mt_vf x) {
    const mt_vf four = mt_vsplat(4.0f);
    mt_vf c = mt_vsel(x > four, four, x);
    c = mt_vsel(c < -four, -four, c);
    const mt_vf x2 = c * c;
    mt_vf p = x2 * -2.72614225801306e-10f + 2.77068142495902e-08f;
    p = p * x2 - 2.10102402082508e-06f;
    p = p * x2 - 5.69250639462346e-05f;
    p = p * x2 - 7.34990630326855e-04f;
    p = p * x2 - 2.95459980854025e-03f;
    p = p * x2 - 1.60960333262415e-02f;
    mt_vf q = x2 * -1.45660718464996e-05f - 2.13374055278905e-04f;
    q = q * x2 - 1.68282697438203e-03f;
    q = q * x2 - 7.37332916720468e-03f;
    q = q * x2 - 1.42647390514189e-02f;
    return mt_vsel(x != x, x, c * p / q);
}

MT_VINLINE mt_vf mt_vsigmoid(mt_vf x) { return 1.0f / (1.0f + mt_vexp(-x)); }
MT_VINLINE mt_vf mt_vsilu(mt_vf x) { return x / (1.0f + mt_vexp(-x)); }
MT_VINLINE mt_vf mt_vgelu(mt_vf x) {
    return x * 0.5f * (1.0f + mt_verf(x * 0.70710678118654752440f));
}

/* A contiguous float32 loop o[i] = F(a[i]) over MT_VL lanes at a time, the
 * tail through a zero-padded buffer (o may equal a). */
#define MT_VMAP_LOOP(NAME, VEXPR)                                              \
    static MT_VCLONES void NAME(float *o, const float *a, int64_t n) {         \
        int64_t i = 0;                                                         \
        for (; i + MT_VL <= n; i += MT_VL) {                                   \
            mt_vf x; memcpy(&x, a + i, sizeof x);                              \
            mt_vf v = VEXPR; memcpy(o + i, &v, sizeof v);                      \
        }                                                                      \
        if (i < n) {                                                           \
            float buf[MT_VL] = {0}; memcpy(buf, a + i, (size_t)(n - i) * 4);   \
            mt_vf x; memcpy(&x, buf, sizeof x);                                \
            mt_vf v = VEXPR; memcpy(buf, &v, sizeof v);                        \
            memcpy(o + i, buf, (size_t)(n - i) * 4);                           \
        }                                                                      \
    }

#endif
