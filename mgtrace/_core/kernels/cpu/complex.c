/* Complex elementwise loops: see mt_complex.h.
 *
 * Multiplication is the textbook formula, as NumPy computes it (C99's
 * Annex G recovery of infinities from NaN parts is not applied), on whole
 * (re, im) pairs so that a contiguous loop vectorises; division is C99's
 * (scaled: no overflow in between). The modulus of a complex64 is computed
 * in double (no overflow or underflow for float parts, correctly rounded
 * but for rare ties), of a complex128 by hypot. exp, log and sqrt are
 * C99's cexp, clog and csqrt (principal branches, NumPy's results).
 */
#include <complex.h>
#include "elementwise.h"   /* the CPU loop tables it fills */
#include "mt_complex.h"

/* |z| of a complex64 in double: float parts can neither overflow nor underflow */
static inline float mt_cabs_c64(float _Complex z) {
    double a = crealf(z), b = cimagf(z);
    return (float)sqrt(a * a + b * b);
}

/* X(code, sfx, complex type, real type, abs, arg) */
#define MT_DT_CPLX(X, ...)                                                     \
    X(MT_COMPLEX64, c64, float _Complex, float, mt_cabs_c64, cargf, __VA_ARGS__) \
    X(MT_COMPLEX128, c128, double _Complex, double, cabs, carg, __VA_ARGS__)

/* strided loops: args[0] out, args[1..] in; s[] byte strides */
#define MT_C_BINARY(code, sfx, CT, RT, ABS, ARG, name, OT, EXPR)               \
    static void cb_##name##_##sfx(char **args, const int64_t *s, int64_t n, const void *aux) { \
        (void)aux;                                                             \
        for (int64_t i = 0; i < n; i++) {                                      \
            CT x = *(const CT *)(args[1] + i * s[1]);                          \
            CT y = *(const CT *)(args[2] + i * s[2]);                          \
            *(OT *)(args[0] + i * s[0]) = (EXPR);                              \
        }                                                                      \
    }
#define MT_C_UNARY(code, sfx, CT, RT, ABS, ARG, name, OT, EXPR)                \
    static void cu_##name##_##sfx(char **args, const int64_t *s, int64_t n, const void *aux) { \
        (void)aux;                                                             \
        for (int64_t i = 0; i < n; i++) {                                      \
            CT x = *(const CT *)(args[1] + i * s[1]);                          \
            *(OT *)(args[0] + i * s[0]) = (EXPR);                              \
        }                                                                      \
    }

#define MT_C_ARITH(code, sfx, CT, RT, ABS, ARG, _)                             \
    MT_C_BINARY(code, sfx, CT, RT, ABS, ARG, add, CT, x + y)                  \
    MT_C_BINARY(code, sfx, CT, RT, ABS, ARG, sub, CT, x - y)                  \
    MT_C_BINARY(code, sfx, CT, RT, ABS, ARG, truediv, CT, x / y)              \
    MT_C_BINARY(code, sfx, CT, RT, ABS, ARG, eq, uint8_t, (uint8_t)(x == y))  \
    MT_C_BINARY(code, sfx, CT, RT, ABS, ARG, ne, uint8_t, (uint8_t)(x != y))  \
    MT_C_UNARY(code, sfx, CT, RT, ABS, ARG, neg, CT, -x)                      \
    MT_C_UNARY(code, sfx, CT, RT, ABS, ARG, real, RT, __real__ x) \
    MT_C_UNARY(code, sfx, CT, RT, ABS, ARG, imag, RT, __imag__ x)             \
    MT_C_UNARY(code, sfx, CT, RT, ABS, ARG, abs, RT, ABS(x))                  \
    static void cb_mul_##sfx(char **args, const int64_t *s, int64_t n, const void *aux) { \
        (void)aux;                                                             \
        const int64_t w = 2 * (int64_t)sizeof(RT);                             \
        if (s[0] == w && s[1] == w && s[2] == w) {                             \
            RT *o = (RT *)args[0];                                             \
            const RT *x = (const RT *)args[1], *y = (const RT *)args[2];      \
            for (int64_t i = 0; i < n; i++) {                                  \
                RT a = x[2 * i], b = x[2 * i + 1], c = y[2 * i], d = y[2 * i + 1]; \
                o[2 * i] = a * c - b * d;                                      \
                o[2 * i + 1] = a * d + b * c;                                  \
            }                                                                  \
            return;                                                            \
        }                                                                      \
        for (int64_t i = 0; i < n; i++) {                                      \
            const RT *x = (const RT *)(args[1] + i * s[1]);                    \
            const RT *y = (const RT *)(args[2] + i * s[2]);                    \
            RT a = x[0], b = x[1], c = y[0], d = y[1];                         \
            RT *o = (RT *)(args[0] + i * s[0]);                                \
            o[0] = a * c - b * d;                                              \
            o[1] = a * d + b * c;                                              \
        }                                                                      \
    }                                                                          \
    MT_C_UNARY(code, sfx, CT, RT, ABS, ARG, angle, RT, ARG(x))                \
    static void cf_fill_##sfx(char **args, const int64_t *s, int64_t n, const void *aux) { \
        const CT v = *(const CT *)aux;                                         \
        for (int64_t i = 0; i < n; i++) *(CT *)(args[0] + i * s[0]) = v;       \
    }                                                                          \
    static void cm_make_##sfx(char **args, const int64_t *s, int64_t n, const void *aux) { \
        (void)aux;                                                             \
        for (int64_t i = 0; i < n; i++) {                                      \
            RT *o = (RT *)(args[0] + i * s[0]);                                \
            o[0] = *(const RT *)(args[1] + i * s[1]);                          \
            o[1] = *(const RT *)(args[2] + i * s[2]);                          \
        }                                                                      \
    }
MT_DT_CPLX(MT_C_ARITH, 0)

/* casts into complex from every real dtype (the imaginary part is 0) and
 * between the two complex dtypes; none from complex to real (the caller
 * refuses: it would drop the imaginary part) */
#define MT_TOF16C(x) mt_h2f(x)
#define MT_TOBF16C(x) mt_bf2f(x)
#define MT_ID_C(x) (x)
#define MT_DT_REAL_SRC(X, ...)                                                 \
    X(MT_BOOL, b8, uint8_t, MT_ID_C, __VA_ARGS__)                              \
    X(MT_INT8, i8, int8_t, MT_ID_C, __VA_ARGS__)                               \
    X(MT_UINT8, u8, uint8_t, MT_ID_C, __VA_ARGS__)                             \
    X(MT_INT16, i16, int16_t, MT_ID_C, __VA_ARGS__)                            \
    X(MT_UINT16, u16, uint16_t, MT_ID_C, __VA_ARGS__)                          \
    X(MT_INT32, i32, int32_t, MT_ID_C, __VA_ARGS__)                            \
    X(MT_INT64, i64, int64_t, MT_ID_C, __VA_ARGS__)                            \
    X(MT_FLOAT16, f16, uint16_t, MT_TOF16C, __VA_ARGS__)                       \
    X(MT_BFLOAT16, bf16, uint16_t, MT_TOBF16C, __VA_ARGS__)                    \
    X(MT_FLOAT32, f32, float, MT_ID_C, __VA_ARGS__)                            \
    X(MT_FLOAT64, f64, double, MT_ID_C, __VA_ARGS__)
#define MT_C_FROM_REAL(scode, ssfx, ST, LOAD, code, sfx, CT, RT)               \
    static void cc_##ssfx##_##sfx(char **args, const int64_t *s, int64_t n, const void *aux) { \
        (void)aux;                                                             \
        for (int64_t i = 0; i < n; i++) {                                      \
            RT *o = (RT *)(args[0] + i * s[0]);                                \
            o[0] = (RT)LOAD(*(const ST *)(args[1] + i * s[1]));                \
            o[1] = 0;                                                          \
        }                                                                      \
    }
#define MT_C_CASTS(code, sfx, CT, RT, ABS, ARG, _)                             \
    MT_DT_REAL_SRC(MT_C_FROM_REAL, code, sfx, CT, RT)
MT_DT_CPLX(MT_C_CASTS, 0)
MT_C_UNARY(MT_COMPLEX64, c64_c64, float _Complex, float, cabsf, cargf, copy, float _Complex, x)
MT_C_UNARY(MT_COMPLEX64, c64_c128, float _Complex, float, cabsf, cargf, widen, double _Complex,
           (double _Complex)x)
MT_C_UNARY(MT_COMPLEX128, c128_c128, double _Complex, double, cabs, carg, copy, double _Complex, x)
MT_C_UNARY(MT_COMPLEX128, c128_c64, double _Complex, double, cabs, carg, narrow, float _Complex,
           (float _Complex)x)

/* exp, log, sqrt: C99's cexp, clog, csqrt (principal branches, as NumPy) */
#define MT_C_TRANSCENDENTAL(sfx, CT, RT, F)                                    \
    MT_C_UNARY(0, sfx, CT, RT, F, F, exp, CT, cexp##F(x))                      \
    MT_C_UNARY(0, sfx, CT, RT, F, F, log, CT, clog##F(x))                      \
    MT_C_UNARY(0, sfx, CT, RT, F, F, sqrt, CT, csqrt##F(x))
MT_C_TRANSCENDENTAL(c64, float _Complex, float, f)
MT_C_TRANSCENDENTAL(c128, double _Complex, double, )

#define MT_C_REG(code, sfx, CT, RT, ABS, ARG, _)                               \
    mt_binary_loops[MT_B_add][code] = cb_add_##sfx;                            \
    mt_binary_loops[MT_B_sub][code] = cb_sub_##sfx;                            \
    mt_binary_loops[MT_B_mul][code] = cb_mul_##sfx;                            \
    mt_binary_loops[MT_B_truediv][code] = cb_truediv_##sfx;                    \
    mt_binary_loops[MT_B_eq][code] = cb_eq_##sfx;                              \
    mt_binary_loops[MT_B_ne][code] = cb_ne_##sfx;                              \
    mt_unary_loops[MT_U_neg][code] = cu_neg_##sfx;                             \
    mt_unary_loops[MT_U_exp][code] = cu_exp_##sfx;                             \
    mt_unary_loops[MT_U_log][code] = cu_log_##sfx;                             \
    mt_unary_loops[MT_U_sqrt][code] = cu_sqrt_##sfx;                           \
    mt_fill_loops[code] = cf_fill_##sfx;
#define MT_C_REG_CAST(scode, ssfx, ST, LOAD, code, sfx) mt_cast_loops[scode][code] = cc_##ssfx##_##sfx;
#define MT_C_REG_CASTS(code, sfx, CT, RT, ABS, ARG, _) MT_DT_REAL_SRC(MT_C_REG_CAST, code, sfx)

void mt_complex_init(void) {
    MT_DT_CPLX(MT_C_REG, 0)
    MT_DT_CPLX(MT_C_REG_CASTS, 0)
    mt_cast_loops[MT_COMPLEX64][MT_COMPLEX64] = cu_copy_c64_c64;
    mt_cast_loops[MT_COMPLEX64][MT_COMPLEX128] = cu_widen_c64_c128;
    mt_cast_loops[MT_COMPLEX128][MT_COMPLEX128] = cu_copy_c128_c128;
    mt_cast_loops[MT_COMPLEX128][MT_COMPLEX64] = cu_narrow_c128_c64;
}

mt_loop_fn mt_complex_make_loop(int real_dtype) {
    if (real_dtype == MT_FLOAT32) return cm_make_c64;
    if (real_dtype == MT_FLOAT64) return cm_make_c128;
    return NULL;
}

mt_loop_fn mt_complex_part_loop(int part, int complex_dtype) {
    int wide = complex_dtype == MT_COMPLEX128;
    if (complex_dtype != MT_COMPLEX64 && !wide) return NULL;
    switch (part) {
    case MT_CPART_REAL: return wide ? cu_real_c128 : cu_real_c64;
    case MT_CPART_IMAG: return wide ? cu_imag_c128 : cu_imag_c64;
    case MT_CPART_ABS: return wide ? cu_abs_c128 : cu_abs_c64;
    case MT_CPART_ANGLE: return wide ? cu_angle_c128 : cu_angle_c64;
    }
    return NULL;
}
