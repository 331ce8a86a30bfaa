/* The elementwise op set, declared once. Everything else (each backend's
 * kernel table: the CPU's in cpu/elementwise.h, CUDA's in cuda/elementwise.cu;
 * the Python op table, docs) is generated from these lists. The names and
 * rules below are defined by the CPU's elementwise.c.
 *
 * Result-dtype rules (applied by dispatch after promotion):
 *   SAME   result has the promoted dtype
 *   FLOAT  integer/bool inputs are computed in float32 (MegEngine rule;
 *          pow too, as MegEngine's POW: 2 ** -1 is 0.5, never an integer 0)
 *   BOOL   result is bool
 *   INT    integer/bool inputs only (bitwise ops)
 */
#ifndef MT_OPS_H
#define MT_OPS_H
#include "mt_types.h"

enum mt_rule { MT_RULE_SAME = 0, MT_RULE_FLOAT, MT_RULE_BOOL, MT_RULE_INT };

#define MT_UNARY_OPS(X)                                                      \
    /* arithmetic */                                                         \
    X(neg, SAME) X(abs, SAME) X(sign, SAME) X(square, SAME)                  \
    X(round, SAME) X(floor, SAME) X(ceil, SAME) X(trunc, SAME)               \
    /* transcendental */                                                     \
    X(exp, FLOAT) X(expm1, FLOAT) X(log, FLOAT) X(log1p, FLOAT)              \
    X(log2, FLOAT) X(sqrt, FLOAT) X(rsqrt, FLOAT) X(sin, FLOAT)              \
    X(cos, FLOAT) X(tan, FLOAT) X(tanh, FLOAT) X(erf, FLOAT)                 \
    X(asin, FLOAT) X(acos, FLOAT) X(atan, FLOAT)                             \
    /* activations */                                                        \
    X(relu, SAME) X(relu6, SAME) X(sigmoid, FLOAT) X(gelu, FLOAT)            \
    X(gelu_tanh, FLOAT) X(silu, FLOAT) X(hardswish, FLOAT)                   \
    X(hardsigmoid, FLOAT) X(softplus, FLOAT)                                 \
    /* predicates and logic */                                               \
    X(isnan, BOOL) X(isinf, BOOL) X(isfinite, BOOL) X(logical_not, BOOL)     \
    X(bitwise_not, INT)

#define MT_BINARY_OPS(X)                                                     \
    /* arithmetic */                                                         \
    X(add, SAME) X(sub, SAME) X(mul, SAME) X(truediv, FLOAT)                 \
    X(floordiv, SAME) X(mod, SAME) X(pow, FLOAT)                             \
    X(maximum, SAME) X(minimum, SAME) X(atan2, FLOAT)                        \
    /* comparison */                                                         \
    X(eq, BOOL) X(ne, BOOL) X(lt, BOOL) X(le, BOOL) X(gt, BOOL) X(ge, BOOL)  \
    /* logic and bits */                                                     \
    X(logical_and, BOOL) X(logical_or, BOOL) X(logical_xor, BOOL)            \
    X(bitwise_and, INT) X(bitwise_or, INT) X(bitwise_xor, INT)               \
    X(left_shift, INT) X(right_shift, INT)

#define MT_TERNARY_OPS(X) X(where, SAME) X(clip, SAME)

#define MT_ENUM_U(name, rule) MT_U_##name,
#define MT_ENUM_B(name, rule) MT_B_##name,
#define MT_ENUM_T(name, rule) MT_T_##name,
enum mt_unary_op { MT_UNARY_OPS(MT_ENUM_U) MT_NUNARY };
enum mt_binary_op { MT_BINARY_OPS(MT_ENUM_B) MT_NBINARY };
enum mt_ternary_op { MT_TERNARY_OPS(MT_ENUM_T) MT_NTERNARY };

extern const char *const mt_unary_names[MT_NUNARY];
extern const char *const mt_binary_names[MT_NBINARY];
extern const char *const mt_ternary_names[MT_NTERNARY];
extern const int mt_unary_rules[MT_NUNARY];
extern const int mt_binary_rules[MT_NBINARY];
extern const int mt_ternary_rules[MT_NTERNARY];

#endif
