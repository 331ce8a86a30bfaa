/* The device-neutral vocabulary every backend shares: dtype codes, the
 * index-space limits, float16/bfloat16 <-> float32 (round to nearest even;
 * a backend's host side reads Python scalars through them) and small
 * integer helpers.
 *
 * This folder, kernels/contract/, is what the core's Cython layer and the
 * device backends agree on: the op codes (mt_ops.h), the backend interface
 * (backend.h), storage (alloc.h) and, per area, the geometry structs and
 * the kernel table a backend fills (reduce_kernels.h, linalg_kernels.h,
 * nn_kernels.h, index_kernels.h). Its headers include only each other and
 * the C library. kernels/cpu/ and kernels/cuda/ both build on it and never
 * on each other: nvcc compiles the CUDA sources with this folder alone on
 * the include path (setup.py), so a CPU header there does not compile.
 *
 * C does bytes: nothing here knows about Python objects. Strides passed to
 * kernels are in BYTES (the Cython layer converts from element strides).
 */
#ifndef MT_TYPES_H
#define MT_TYPES_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <math.h>

#define MT_MAX_NDIM 16
#define MT_ALIGN 64

/* dtype codes: the order is part of every kernel table, append only. */
enum mt_dtype {
    MT_BOOL = 0, MT_INT8, MT_UINT8, MT_INT16, MT_UINT16, MT_INT32, MT_INT64,
    MT_FLOAT16, MT_BFLOAT16, MT_FLOAT32, MT_FLOAT64,
    MT_COMPLEX64, MT_COMPLEX128,     /* interleaved (re, im) pairs of float32 / float64 */
    MT_NDTYPES
};
/* The real dtypes come first: tables generated for "every dtype" by
 * templates (the CUDA backend's) cover codes below this one; complex
 * kernels are registered by name (kernels/mt_complex.h). */
#define MT_NREAL_DTYPES MT_COMPLEX64

/* ---- float16 / bfloat16 <-> float32, round to nearest even ---- */
static inline float mt_bits_to_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static inline uint32_t mt_f32_to_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

static inline float mt_h2f(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ff;
    if (exp == 0x1f) return mt_bits_to_f32(sign | 0x7f800000u | (man << 13));
    if (exp == 0) {
        /* zero or subnormal: value = man * 2^-24 */
        float v = (float)man * 5.9604644775390625e-08f;
        return sign ? -v : v;
    }
    return mt_bits_to_f32(sign | ((exp + 112) << 23) | (man << 13));
}

static inline uint16_t mt_f2h(float f) {
    uint32_t x = mt_f32_to_bits(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
    uint32_t ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u)  /* inf or nan: keep nan quiet */
        return sign | 0x7c00 | (ax > 0x7f800000u ? 0x200 | ((ax >> 13) & 0x3ff) : 0);
    if (ax >= 0x477ff000u) return sign | 0x7c00;     /* rounds past 65504 */
    if (ax < 0x38800000u) {                           /* result subnormal or zero */
        float v = mt_bits_to_f32(ax) * 16777216.0f;   /* scale by 2^24; exact */
        /* nearbyint rounds half to even in the default rounding mode */
        return sign | (uint16_t)nearbyintf(v);
    }
    uint32_t r = ax + 0xfffu + ((ax >> 13) & 1u);     /* round to nearest even */
    return sign | (uint16_t)((r - 0x38000000u) >> 13);
}

static inline float mt_bf2f(uint16_t b) { return mt_bits_to_f32((uint32_t)b << 16); }

static inline uint16_t mt_f2bf(float f) {
    uint32_t x = mt_f32_to_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40);
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

/* ---- shared helpers ---- */
#define MT_CAT_(a, b) a##_##b
#define MT_CAT(a, b) MT_CAT_(a, b)
static inline int64_t mt_min64(int64_t a, int64_t b) { return a < b ? a : b; }
static inline int64_t mt_max64(int64_t a, int64_t b) { return a > b ? a : b; }
/* integer division rounding toward -inf / +inf (b > 0) */
static inline int64_t mt_floordiv(int64_t a, int64_t b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }
static inline int64_t mt_ceildiv(int64_t a, int64_t b) { return -mt_floordiv(-a, b); }

#endif
