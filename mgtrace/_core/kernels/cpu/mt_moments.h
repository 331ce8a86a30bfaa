/* One row's mean and 1 / sqrt(variance + eps), shared by layer norm's
 * forward (norm.c, which instance/group norm reuse) and its backward
 * (grad.c), so that the gradient always recomputes exactly the statistics
 * the forward normalized with. Two passes, each summing in double over 8
 * fixed lanes (a fixed order: the same bits in every ISA clone). An empty
 * row has mean 0. Internal to cpu/. */
#ifndef MT_MOMENTS_H
#define MT_MOMENTS_H
#include <math.h>
#include <stdint.h>

#define MT_ROW_MOMENTS(T, SFX)                                                                            \
    static inline void mt_row_moments_##SFX(const T *x, int64_t n, double eps, double *mean,              \
                                             double *rstd) {                                              \
        double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};                                                         \
        int64_t i = 0;                                                                                    \
        for (; i + 8 <= n; i += 8)                                                                        \
            for (int l = 0; l < 8; l++) acc[l] += (double)x[i + l];                                       \
        double s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));     \
        for (; i < n; i++) s += (double)x[i];                                                             \
        const double m = n > 0 ? s / (double)n : 0.0;                                                     \
        for (int l = 0; l < 8; l++) acc[l] = 0;                                                           \
        for (i = 0; i + 8 <= n; i += 8)                                                                   \
            for (int l = 0; l < 8; l++) {                                                                 \
                const double d = (double)x[i + l] - m;                                                    \
                acc[l] += d * d;                                                                          \
            }                                                                                             \
        s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));            \
        for (; i < n; i++) {                                                                              \
            const double d = (double)x[i] - m;                                                            \
            s += d * d;                                                                                   \
        }                                                                                                 \
        *mean = m;                                                                                        \
        *rstd = 1.0 / sqrt(s / (double)n + eps);                                                          \
    }
MT_ROW_MOMENTS(float, f32)
MT_ROW_MOMENTS(double, f64)
#undef MT_ROW_MOMENTS

#endif
