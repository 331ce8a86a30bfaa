/* Elementwise inner loops: unary, binary, ternary, casts and fills.
 *
 * Every loop is generated from one expression by the MT_*_LOOP macros, once
 * per dtype; the tables at the bottom index them by [op][dtype]. Each loop
 * has a contiguous fast path (vectorised, with an AVX2 clone picked at run
 * time on x86-64), scalar-operand paths (stride 0) and a generic strided
 * path. Integer arithmetic wraps (built with -fwrapv, as NumPy wraps).
 */
#include <tgmath.h>
#include "elementwise.h"
#include "mt_vmath.h"


/* ---- dtype descriptors: X(code, sfx, storage type, compute type, load, store) ---- */
#define MT_ID(x) (x)
#define MT_TOBOOL(x) ((uint8_t)((x) != 0))
#define MT_TOF16(x) mt_f2h((float)(x))
#define MT_TOBF16(x) mt_f2bf((float)(x))

#define MT_DT_BOOL(X, ...) X(MT_BOOL, b8, uint8_t, int, MT_ID, MT_TOBOOL, __VA_ARGS__)
#define MT_DT_SINT(X, ...)                                                   \
    X(MT_INT8, i8, int8_t, int8_t, MT_ID, MT_ID, __VA_ARGS__)               \
    X(MT_INT16, i16, int16_t, int16_t, MT_ID, MT_ID, __VA_ARGS__)           \
    X(MT_INT32, i32, int32_t, int32_t, MT_ID, MT_ID, __VA_ARGS__)           \
    X(MT_INT64, i64, int64_t, int64_t, MT_ID, MT_ID, __VA_ARGS__)
#define MT_DT_UINT(X, ...)                                                   \
    X(MT_UINT8, u8, uint8_t, uint8_t, MT_ID, MT_ID, __VA_ARGS__)            \
    X(MT_UINT16, u16, uint16_t, uint16_t, MT_ID, MT_ID, __VA_ARGS__)
#define MT_DT_FLOAT(X, ...)                                                  \
    X(MT_FLOAT16, f16, uint16_t, float, mt_h2f, MT_TOF16, __VA_ARGS__)      \
    X(MT_BFLOAT16, bf16, uint16_t, float, mt_bf2f, MT_TOBF16, __VA_ARGS__)  \
    X(MT_FLOAT32, f32, float, float, MT_ID, MT_ID, __VA_ARGS__)             \
    X(MT_FLOAT64, f64, double, double, MT_ID, MT_ID, __VA_ARGS__)
#define MT_DT_INT(X, ...) MT_DT_SINT(X, __VA_ARGS__) MT_DT_UINT(X, __VA_ARGS__)
#define MT_DT_NUM(X, ...) MT_DT_INT(X, __VA_ARGS__) MT_DT_FLOAT(X, __VA_ARGS__)
#define MT_DT_ALL(X, ...) MT_DT_BOOL(X, __VA_ARGS__) MT_DT_NUM(X, __VA_ARGS__)
/* A second spelling of the full list, for the inner level of the cast table
 * (the preprocessor does not expand a macro inside its own expansion). */
#define MT_DT_ALL2(X, ...)                                                   \
    X(MT_BOOL, b8, uint8_t, int, MT_ID, MT_TOBOOL, __VA_ARGS__)             \
    X(MT_INT8, i8, int8_t, int8_t, MT_ID, MT_ID, __VA_ARGS__)               \
    X(MT_INT16, i16, int16_t, int16_t, MT_ID, MT_ID, __VA_ARGS__)           \
    X(MT_INT32, i32, int32_t, int32_t, MT_ID, MT_ID, __VA_ARGS__)           \
    X(MT_INT64, i64, int64_t, int64_t, MT_ID, MT_ID, __VA_ARGS__)           \
    X(MT_UINT8, u8, uint8_t, uint8_t, MT_ID, MT_ID, __VA_ARGS__)            \
    X(MT_UINT16, u16, uint16_t, uint16_t, MT_ID, MT_ID, __VA_ARGS__)        \
    X(MT_FLOAT16, f16, uint16_t, float, mt_h2f, MT_TOF16, __VA_ARGS__)      \
    X(MT_BFLOAT16, bf16, uint16_t, float, mt_bf2f, MT_TOBF16, __VA_ARGS__)  \
    X(MT_FLOAT32, f32, float, float, MT_ID, MT_ID, __VA_ARGS__)             \
    X(MT_FLOAT64, f64, double, double, MT_ID, MT_ID, __VA_ARGS__)

/* ---- loop templates ---- */
#define MT_UNARY_LOOP(NAME, ST, CT, TO, OT, FROM, EXPR)                        \
    static MT_CLONES void NAME##_contig(OT *o, const ST *a, int64_t n) {      \
        MT_IVDEP for (int64_t i = 0; i < n; i++) { CT x = TO(a[i]); o[i] = FROM(EXPR); } \
    }                                                                          \
    static void NAME(char **args, const int64_t *s, int64_t n, const void *aux) { \
        (void)aux;                                                             \
        char *po = args[0]; const char *pa = args[1];                          \
        if (s[0] == (int64_t)sizeof(OT) && s[1] == (int64_t)sizeof(ST)) {     \
            NAME##_contig((OT *)po, (const ST *)pa, n); return;                \
        }                                                                      \
        for (int64_t i = 0; i < n; i++) {                                      \
            CT x = TO(*(const ST *)(pa + i * s[1]));                           \
            *(OT *)(po + i * s[0]) = FROM(EXPR);                               \
        }                                                                      \
    }

#define MT_BINARY_LOOP(NAME, ST, CT, TO, OT, FROM, EXPR)                       \
    static MT_CLONES void NAME##_cc(OT *o, const ST *a, const ST *b, int64_t n) { \
        MT_IVDEP for (int64_t i = 0; i < n; i++) { CT x = TO(a[i]), y = TO(b[i]); o[i] = FROM(EXPR); } \
    }                                                                          \
    static MT_CLONES void NAME##_cs(OT *o, const ST *a, CT y, int64_t n) {     \
        MT_IVDEP for (int64_t i = 0; i < n; i++) { CT x = TO(a[i]); o[i] = FROM(EXPR); } \
    }                                                                          \
    static MT_CLONES void NAME##_sc(OT *o, CT x, const ST *b, int64_t n) {     \
        MT_IVDEP for (int64_t i = 0; i < n; i++) { CT y = TO(b[i]); o[i] = FROM(EXPR); } \
    }                                                                          \
    static void NAME(char **args, const int64_t *s, int64_t n, const void *aux) { \
        (void)aux;                                                             \
        char *po = args[0]; const char *pa = args[1], *pb = args[2];           \
        const int64_t so = (int64_t)sizeof(OT), si = (int64_t)sizeof(ST);      \
        if (s[0] == so) {                                                      \
            if (s[1] == si && s[2] == si) { NAME##_cc((OT *)po, (const ST *)pa, (const ST *)pb, n); return; } \
            if (s[1] == si && s[2] == 0) { NAME##_cs((OT *)po, (const ST *)pa, TO(*(const ST *)pb), n); return; } \
            if (s[1] == 0 && s[2] == si) { NAME##_sc((OT *)po, TO(*(const ST *)pa), (const ST *)pb, n); return; } \
        }                                                                      \
        for (int64_t i = 0; i < n; i++) {                                      \
            CT x = TO(*(const ST *)(pa + i * s[1])), y = TO(*(const ST *)(pb + i * s[2])); \
            *(OT *)(po + i * s[0]) = FROM(EXPR);                               \
        }                                                                      \
    }

/* where(c, x, y) and clip(x, lo, hi): generic strided loop plus the common
 * contiguous-x, scalar-bounds case. */
#define MT_TERNARY_LOOP(NAME, ST, CT, TO, FROM, CTYPE, EXPR)                   \
    static void NAME(char **args, const int64_t *s, int64_t n, const void *aux) { \
        (void)aux;                                                             \
        char *po = args[0]; const char *p1 = args[1], *p2 = args[2], *p3 = args[3]; \
        for (int64_t i = 0; i < n; i++) {                                      \
            CTYPE c = *(const CTYPE *)(p1 + i * s[1]);                         \
            CT x = TO(*(const ST *)(p2 + i * s[2])), y = TO(*(const ST *)(p3 + i * s[3])); \
            *(ST *)(po + i * s[0]) = FROM(EXPR);                               \
        }                                                                      \
    }

/* ---- vectorised float32 exp and erf (mt_vmath.h) ----
 * Contiguous float32 inputs of these ops take a 16-lane loop with an
 * AVX2 and an AVX-512 clone; other layouts and dtypes the generic loop. */
MT_VMAP_LOOP(exp_f32_v, mt_vexp(x))
MT_VMAP_LOOP(sigmoid_f32_v, mt_vsigmoid(x))
MT_VMAP_LOOP(silu_f32_v, mt_vsilu(x))
MT_VMAP_LOOP(erf_f32_v, mt_verf(x))
MT_VMAP_LOOP(gelu_f32_v, mt_vgelu(x))

/* ---- expressions: x, y are the compute-type operands ---- */
/* float */
#define F_neg (-x)
#define F_abs fabs(x)
#define F_sign (isnan(x) ? x : (__typeof__(x))((x > 0) - (x < 0)))
#define F_square (x * x)
#define F_round nearbyint(x)
#define F_floor floor(x)
#define F_ceil ceil(x)
#define F_trunc trunc(x)
#define F_exp exp(x)
#define F_expm1 expm1(x)
#define F_log log(x)
#define F_log1p log1p(x)
#define F_log2 log2(x)
#define F_sqrt sqrt(x)
#define F_rsqrt (1 / sqrt(x))
#define F_sin sin(x)
#define F_cos cos(x)
#define F_tan tan(x)
#define F_tanh tanh(x)
#define F_erf erf(x)
#define F_asin asin(x)
#define F_acos acos(x)
#define F_atan atan(x)
#define F_relu (x < 0 ? 0 : x)
#define F_relu6 (x < 0 ? 0 : (x > 6 ? 6 : x))
#define F_sigmoid (1 / (1 + exp(-x)))
#define F_gelu (x * (__typeof__(x))0.5 * (1 + erf(x * (__typeof__(x))0.70710678118654752440)))
#define F_gelu_tanh (x * (__typeof__(x))0.5 * (1 + tanh((__typeof__(x))0.79788456080286535588 * (x + (__typeof__(x))0.044715 * x * x * x))))
#define F_silu (x / (1 + exp(-x)))
#define F_hardswish (x * (x <= -3 ? 0 : (x >= 3 ? 1 : (x + 3) / 6)))
#define F_hardsigmoid (x <= -3 ? 0 : (x >= 3 ? 1 : (x + 3) / 6))
#define F_softplus (x > 20 ? x : log1p(exp(x)))
#define F_isnan isnan(x)
#define F_isinf isinf(x)
#define F_isfinite isfinite(x)
#define X_logical_not (x == 0)
/* integer */
#define I_neg ((__typeof__(x))(0 - x))
#define I_abs ((__typeof__(x))(x < 0 ? 0 - x : x))
#define I_sign ((__typeof__(x))((x > 0) - (x < 0)))
#define I_ident (x)
#define I_relu ((__typeof__(x))(x < 0 ? 0 : x))
#define I_relu6 ((__typeof__(x))(x < 0 ? 0 : (x > 6 ? 6 : x)))
#define I_bitwise_not ((__typeof__(x))(~x))

#define F_add (x + y)
#define F_sub (x - y)
#define F_mul (x * y)
#define F_truediv (x / y)
#define F_pow pow(x, y)
#define F_maximum ((x > y || isnan(x)) ? x : y)
#define F_minimum ((x < y || isnan(x)) ? x : y)
#define F_atan2 atan2(x, y)
#define X_eq (x == y)
#define X_ne (x != y)
#define X_lt (x < y)
#define X_le (x <= y)
#define X_gt (x > y)
#define X_ge (x >= y)
#define X_logical_and ((x != 0) & (y != 0))
#define X_logical_or ((x != 0) | (y != 0))
#define X_logical_xor ((x != 0) ^ (y != 0))
#define I_maximum (x > y ? x : y)
#define I_minimum (x < y ? x : y)
#define I_bitwise_and (x & y)
#define I_bitwise_or (x | y)
#define I_bitwise_xor (x ^ y)
#define B_add (x | y)
#define B_mul (x & y)

/* Python/NumPy floor division and modulo for floats (sign of the divisor). */
static inline double mt_fmod_py(double x, double y) {
    double m = fmod(x, y);
    if (m != 0) { if ((y < 0) != (m < 0)) m += y; } else m = copysign(0.0, y);
    return m;
}
static inline double mt_fdiv_py(double x, double y) {
    if (y == 0) return x / y;
    double m = fmod(x, y), d = (x - m) / y;
    if (m != 0 && ((y < 0) != (m < 0))) d -= 1;
    if (d == 0) return copysign(0.0, x / y);
    double f = floor(d);
    if (d - f > 0.5) f += 1;
    return f;
}
#define F_floordiv_dbl ((__typeof__(x))mt_fdiv_py((double)x, (double)y))
#define F_mod_dbl ((__typeof__(x))mt_fmod_py((double)x, (double)y))

/* Integer division never traps: /0 gives 0 and MIN/-1 wraps, as NumPy does. */
#define MT_INT_DIVMOD(sfx, T)                                                  \
    static inline T mt_floordiv_##sfx(T x, T y) {                             \
        if (y == 0) return 0;                                                  \
        if ((T)-1 < 0 && y == (T)-1) return (T)(0 - x);                        \
        T q = (T)(x / y);                                                      \
        if ((T)(x % y) != 0 && ((x < 0) != (y < 0))) q--;                      \
        return q;                                                              \
    }                                                                          \
    static inline T mt_mod_##sfx(T x, T y) {                                  \
        if (y == 0 || ((T)-1 < 0 && y == (T)-1)) return 0;                     \
        T r = (T)(x % y);                                                      \
        if (r != 0 && ((r < 0) != (y < 0))) r = (T)(r + y);                    \
        return r;                                                              \
    }                                                                          \
    static inline T mt_shl_##sfx(T x, T y) {                                  \
        return (y < 0 || y >= (T)(8 * sizeof(T))) ? 0 : (T)(x << y);          \
    }                                                                          \
    static inline T mt_shr_##sfx(T x, T y) {                                  \
        if (y < 0 || y >= (T)(8 * sizeof(T))) return (T)(x < 0 ? -1 : 0);     \
        return (T)(x >> y);                                                    \
    }
MT_INT_DIVMOD(i8, int8_t) MT_INT_DIVMOD(i16, int16_t) MT_INT_DIVMOD(i32, int32_t)
MT_INT_DIVMOD(i64, int64_t) MT_INT_DIVMOD(u8, uint8_t) MT_INT_DIVMOD(u16, uint16_t)

/* ---- instantiation ---- */
#define MT_GEN_U(code, sfx, ST, CT, TO, FROM, op, expr) \
    MT_UNARY_LOOP(u_##op##_##sfx, ST, CT, TO, ST, FROM, expr)
#define MT_GEN_U_BOOL(code, sfx, ST, CT, TO, FROM, op, expr) \
    MT_UNARY_LOOP(u_##op##_##sfx, ST, CT, TO, uint8_t, MT_TOBOOL, expr)
#define MT_GEN_B(code, sfx, ST, CT, TO, FROM, op, expr) \
    MT_BINARY_LOOP(b_##op##_##sfx, ST, CT, TO, ST, FROM, expr)
#define MT_GEN_B_BOOL(code, sfx, ST, CT, TO, FROM, op, expr) \
    MT_BINARY_LOOP(b_##op##_##sfx, ST, CT, TO, uint8_t, MT_TOBOOL, expr)
#define MT_GEN_B_SFX(code, sfx, ST, CT, TO, FROM, op, fn) \
    MT_BINARY_LOOP(b_##op##_##sfx, ST, CT, TO, ST, FROM, fn##_##sfx(x, y))

/* unary */
#define MT_U_FLOAT(op) MT_DT_FLOAT(MT_GEN_U, op, F_##op)
#define MT_U_INT(op, e) MT_DT_INT(MT_GEN_U, op, e)
MT_U_FLOAT(neg) MT_U_INT(neg, I_neg)
MT_U_FLOAT(abs) MT_U_INT(abs, I_abs)
MT_U_FLOAT(sign) MT_U_INT(sign, I_sign)
MT_U_FLOAT(square) MT_U_INT(square, F_square)
MT_U_FLOAT(round) MT_U_INT(round, I_ident)
MT_U_FLOAT(floor) MT_U_INT(floor, I_ident)
MT_U_FLOAT(ceil) MT_U_INT(ceil, I_ident)
MT_U_FLOAT(trunc) MT_U_INT(trunc, I_ident)
MT_U_FLOAT(exp) MT_U_FLOAT(expm1) MT_U_FLOAT(log) MT_U_FLOAT(log1p) MT_U_FLOAT(log2)
MT_U_FLOAT(sqrt) MT_U_FLOAT(rsqrt) MT_U_FLOAT(sin) MT_U_FLOAT(cos) MT_U_FLOAT(tan)
MT_U_FLOAT(tanh) MT_U_FLOAT(erf) MT_U_FLOAT(asin) MT_U_FLOAT(acos) MT_U_FLOAT(atan)
MT_U_FLOAT(relu) MT_U_INT(relu, I_relu)
MT_U_FLOAT(relu6) MT_U_INT(relu6, I_relu6)
MT_U_FLOAT(sigmoid) MT_U_FLOAT(gelu) MT_U_FLOAT(gelu_tanh) MT_U_FLOAT(silu)
MT_U_FLOAT(hardswish) MT_U_FLOAT(hardsigmoid) MT_U_FLOAT(softplus)
MT_DT_FLOAT(MT_GEN_U_BOOL, isnan, F_isnan)
MT_DT_FLOAT(MT_GEN_U_BOOL, isinf, F_isinf)
MT_DT_FLOAT(MT_GEN_U_BOOL, isfinite, F_isfinite)
MT_DT_ALL(MT_GEN_U_BOOL, logical_not, X_logical_not)
MT_DT_INT(MT_GEN_U, bitwise_not, I_bitwise_not)
MT_UNARY_LOOP(u_bitwise_not_b8, uint8_t, int, MT_ID, uint8_t, MT_TOBOOL, !x)

/* binary */
#define MT_B_NUM(op, e) MT_DT_NUM(MT_GEN_B, op, e)
MT_B_NUM(add, F_add) MT_DT_BOOL(MT_GEN_B, add, B_add)
MT_B_NUM(sub, F_sub)
MT_B_NUM(mul, F_mul) MT_DT_BOOL(MT_GEN_B, mul, B_mul)
MT_DT_FLOAT(MT_GEN_B, truediv, F_truediv)
MT_DT_FLOAT(MT_GEN_B, floordiv, F_floordiv_dbl) MT_DT_INT(MT_GEN_B_SFX, floordiv, mt_floordiv)
MT_DT_FLOAT(MT_GEN_B, mod, F_mod_dbl) MT_DT_INT(MT_GEN_B_SFX, mod, mt_mod)
MT_DT_FLOAT(MT_GEN_B, pow, F_pow)
MT_DT_FLOAT(MT_GEN_B, maximum, F_maximum) MT_DT_INT(MT_GEN_B, maximum, I_maximum)
MT_DT_BOOL(MT_GEN_B, maximum, B_add)
MT_DT_FLOAT(MT_GEN_B, minimum, F_minimum) MT_DT_INT(MT_GEN_B, minimum, I_minimum)
MT_DT_BOOL(MT_GEN_B, minimum, B_mul)
MT_DT_FLOAT(MT_GEN_B, atan2, F_atan2)
#define MT_B_CMP(op) MT_DT_ALL(MT_GEN_B_BOOL, op, X_##op)
MT_B_CMP(eq) MT_B_CMP(ne) MT_B_CMP(lt) MT_B_CMP(le) MT_B_CMP(gt) MT_B_CMP(ge)
MT_B_CMP(logical_and) MT_B_CMP(logical_or) MT_B_CMP(logical_xor)
#define MT_B_BITS(op) MT_DT_INT(MT_GEN_B, op, I_##op) MT_DT_BOOL(MT_GEN_B, op, I_##op)
MT_B_BITS(bitwise_and) MT_B_BITS(bitwise_or) MT_B_BITS(bitwise_xor)
MT_DT_INT(MT_GEN_B_SFX, left_shift, mt_shl)
MT_DT_INT(MT_GEN_B_SFX, right_shift, mt_shr)

/* ternary: where(cond, x, y) with a bool condition; clip(x, lo, hi) */
#define MT_GEN_WHERE(code, sfx, ST, CT, TO, FROM, _) \
    MT_TERNARY_LOOP(t_where_##sfx, ST, CT, TO, FROM, uint8_t, (c ? x : y))
MT_DT_ALL(MT_GEN_WHERE, 0)
#define MT_GEN_CLIP(code, sfx, ST, CT, TO, FROM, MAXE, MINE)                   \
    static void t_clip_##sfx(char **args, const int64_t *s, int64_t n, const void *aux) { \
        (void)aux;                                                             \
        char *po = args[0]; const char *p1 = args[1], *p2 = args[2], *p3 = args[3]; \
        for (int64_t i = 0; i < n; i++) {                                      \
            CT x = TO(*(const ST *)(p1 + i * s[1]));                           \
            CT y = TO(*(const ST *)(p2 + i * s[2]));                           \
            x = MAXE;                                                          \
            y = TO(*(const ST *)(p3 + i * s[3]));                              \
            *(ST *)(po + i * s[0]) = FROM(MINE);                               \
        }                                                                      \
    }
MT_DT_FLOAT(MT_GEN_CLIP, F_maximum, F_minimum)
MT_DT_INT(MT_GEN_CLIP, I_maximum, I_minimum)

/* casts: load in the source's compute type, convert, store */
#define MT_CAST_INNER(code2, sfx2, ST2, CT2, TO2, FROM2, code1, sfx1, ST1, CT1, TO1, FROM1) \
    MT_UNARY_LOOP(c_##sfx1##_##sfx2, ST1, CT1, TO1, ST2, FROM2, x)
#define MT_CAST_OUTER(code1, sfx1, ST1, CT1, TO1, FROM1, _) \
    MT_DT_ALL2(MT_CAST_INNER, code1, sfx1, ST1, CT1, TO1, FROM1)
MT_DT_ALL(MT_CAST_OUTER, 0)

/* fill: aux points at one value already in the output dtype */
#define MT_GEN_FILL(code, sfx, ST, CT, TO, FROM, _)                            \
    static void f_fill_##sfx(char **args, const int64_t *s, int64_t n, const void *aux) { \
        const ST v = *(const ST *)aux; char *po = args[0];                     \
        if (s[0] == (int64_t)sizeof(ST)) { ST *o = (ST *)po; for (int64_t i = 0; i < n; i++) o[i] = v; } \
        else for (int64_t i = 0; i < n; i++) *(ST *)(po + i * s[0]) = v;       \
    }
MT_DT_ALL(MT_GEN_FILL, 0)

/* the vector loop for contiguous float32, the generic loop otherwise */
#define MT_VMATH_ENTRY(op)                                                     \
    static void u_##op##_f32_fast(char **args, const int64_t *s, int64_t n, const void *aux) { \
        if (s[0] == 4 && s[1] == 4) op##_f32_v((float *)args[0], (const float *)args[1], n); \
        else u_##op##_f32(args, s, n, aux);                                   \
    }
MT_VMATH_ENTRY(exp) MT_VMATH_ENTRY(sigmoid) MT_VMATH_ENTRY(silu) MT_VMATH_ENTRY(erf)
MT_VMATH_ENTRY(gelu)

/* ---- tables ---- */
mt_loop_fn mt_unary_loops[MT_NUNARY][MT_NDTYPES];
mt_loop_fn mt_binary_loops[MT_NBINARY][MT_NDTYPES];
mt_loop_fn mt_ternary_loops[MT_NTERNARY][MT_NDTYPES];
mt_loop_fn mt_cast_loops[MT_NDTYPES][MT_NDTYPES];
mt_loop_fn mt_fill_loops[MT_NDTYPES];

#define MT_NAME(name, rule) #name,
#define MT_RULE(name, rule) MT_RULE_##rule,
const char *const mt_unary_names[MT_NUNARY] = {MT_UNARY_OPS(MT_NAME)};
const char *const mt_binary_names[MT_NBINARY] = {MT_BINARY_OPS(MT_NAME)};
const char *const mt_ternary_names[MT_NTERNARY] = {MT_TERNARY_OPS(MT_NAME)};
const int mt_unary_rules[MT_NUNARY] = {MT_UNARY_OPS(MT_RULE)};
const int mt_binary_rules[MT_NBINARY] = {MT_BINARY_OPS(MT_RULE)};
const int mt_ternary_rules[MT_NTERNARY] = {MT_TERNARY_OPS(MT_RULE)};

#define MT_REG_U(code, sfx, ST, CT, TO, FROM, op) mt_unary_loops[MT_U_##op][code] = u_##op##_##sfx;
#define MT_REG_B(code, sfx, ST, CT, TO, FROM, op) mt_binary_loops[MT_B_##op][code] = b_##op##_##sfx;
#define MT_REG_T(code, sfx, ST, CT, TO, FROM, op) mt_ternary_loops[MT_T_##op][code] = t_##op##_##sfx;
#define MT_REG_FILL(code, sfx, ST, CT, TO, FROM, _) mt_fill_loops[code] = f_fill_##sfx;
#define MT_REG_CAST_INNER(code2, sfx2, ST2, CT2, TO2, FROM2, code1, sfx1) \
    mt_cast_loops[code1][code2] = c_##sfx1##_##sfx2;
#define MT_REG_CAST(code1, sfx1, ST1, CT1, TO1, FROM1, _) MT_DT_ALL2(MT_REG_CAST_INNER, code1, sfx1)

void mt_elementwise_init(void) {
    static int done = 0;
    if (done) return;
    done = 1;
    /* unary: float-only ops, then those with integer variants */
#define U_F(op) MT_DT_FLOAT(MT_REG_U, op)
#define U_FI(op) MT_DT_NUM(MT_REG_U, op)
    U_FI(neg) U_FI(abs) U_FI(sign) U_FI(square) U_FI(round) U_FI(floor) U_FI(ceil) U_FI(trunc)
    U_F(exp) U_F(expm1) U_F(log) U_F(log1p) U_F(log2) U_F(sqrt) U_F(rsqrt) U_F(sin) U_F(cos)
    U_F(tan) U_F(tanh) U_F(erf) U_F(asin) U_F(acos) U_F(atan)
    U_FI(relu) U_FI(relu6) U_F(sigmoid) U_F(gelu) U_F(gelu_tanh) U_F(silu) U_F(hardswish)
    U_F(hardsigmoid) U_F(softplus) U_F(isnan) U_F(isinf) U_F(isfinite)
    MT_DT_ALL(MT_REG_U, logical_not)
    MT_DT_INT(MT_REG_U, bitwise_not) MT_DT_BOOL(MT_REG_U, bitwise_not)
    /* binary */
    MT_DT_ALL(MT_REG_B, add) MT_DT_NUM(MT_REG_B, sub) MT_DT_ALL(MT_REG_B, mul)
    MT_DT_FLOAT(MT_REG_B, truediv) MT_DT_NUM(MT_REG_B, floordiv) MT_DT_NUM(MT_REG_B, mod)
    MT_DT_FLOAT(MT_REG_B, pow) MT_DT_ALL(MT_REG_B, maximum) MT_DT_ALL(MT_REG_B, minimum)
    MT_DT_FLOAT(MT_REG_B, atan2)
    MT_DT_ALL(MT_REG_B, eq) MT_DT_ALL(MT_REG_B, ne) MT_DT_ALL(MT_REG_B, lt)
    MT_DT_ALL(MT_REG_B, le) MT_DT_ALL(MT_REG_B, gt) MT_DT_ALL(MT_REG_B, ge)
    MT_DT_ALL(MT_REG_B, logical_and) MT_DT_ALL(MT_REG_B, logical_or) MT_DT_ALL(MT_REG_B, logical_xor)
    MT_DT_INT(MT_REG_B, bitwise_and) MT_DT_BOOL(MT_REG_B, bitwise_and)
    MT_DT_INT(MT_REG_B, bitwise_or) MT_DT_BOOL(MT_REG_B, bitwise_or)
    MT_DT_INT(MT_REG_B, bitwise_xor) MT_DT_BOOL(MT_REG_B, bitwise_xor)
    MT_DT_INT(MT_REG_B, left_shift) MT_DT_INT(MT_REG_B, right_shift)
    /* ternary, casts, fills */
    MT_DT_ALL(MT_REG_T, where) MT_DT_NUM(MT_REG_T, clip)
    MT_DT_ALL(MT_REG_CAST, 0)
    MT_DT_ALL(MT_REG_FILL, 0)
    mt_unary_loops[MT_U_exp][MT_FLOAT32] = u_exp_f32_fast;
    mt_unary_loops[MT_U_sigmoid][MT_FLOAT32] = u_sigmoid_f32_fast;
    mt_unary_loops[MT_U_silu][MT_FLOAT32] = u_silu_f32_fast;
    mt_unary_loops[MT_U_erf][MT_FLOAT32] = u_erf_f32_fast;
    mt_unary_loops[MT_U_gelu][MT_FLOAT32] = u_gelu_f32_fast;
}
