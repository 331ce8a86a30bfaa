/* Winograd's F(2x2, 3x3) and F(4x4, 3x3) transforms (Lavin & Gray), written
 * once for both convolution paths: conv/winograd.c (NCHW, scalars of the
 * working dtype) and nchwc.c (NCHW16c, 16-lane vectors). An e x e output
 * tile (e = 2 or 4) is A^T [(G g G^T) .* (B^T d B)] A for the (e + 2)^2
 * input patch d and the 3x3 kernel g; each 2-D transform is its 1-D one
 * along the columns, then along the rows.
 *
 *   F(2x2): B^T = [1 0 -1 0;  0 1 1 0;  0 -1 1 0;  0 1 0 -1]
 *           G   = [1 0 0;  1/2 1/2 1/2;  1/2 -1/2 1/2;  0 0 1]
 *           A^T = [1 1 1 0;  0 1 -1 -1]
 *   F(4x4), the interpolation points 0, 1, -1, 2, -2 and infinity:
 *           B^T = [4  0 -5  0 1 0;  0 -4 -4  1 1 0;  0  4 -4 -1 1 0;
 *                  0 -2 -1  2 1 0;  0  2 -1 -2 1 0;  0  4  0 -5 0 1]
 *           G   = [1/4 0 0;  -1/6 -1/6 -1/6;  -1/6 1/6 -1/6;
 *                  1/24 1/12 1/6;  1/24 -1/12 1/6;  0 0 1]
 *           A^T = [1 1 1 1 1 0;  0 1 -1 2 -2 0;  0 1 1 4 4 0;  0 1 -1 8 -8 1]
 *
 * The 1-D transforms below are macros, generic over the element type (a
 * float, a double or a GCC vector of them: the temporaries take the type
 * of the inputs), so both paths compute the same expressions, shared terms
 * first, in the same order. F(2x2)'s take their four inputs as values,
 * F(4x4)'s six as s[0], s[st], ..., s[5 st].
 *
 * G is applied two ways: in the working dtype by MT_WINO2_G / MT_WINO4_G
 * (conv/winograd.c, U packed on every call or cached), or in double from
 * the coefficient rows MT_WINO_G2 / MT_WINO_G4 (nchwc.c's packing, made once
 * a weight, which leaves out the terms whose coefficient is 0 so that an
 * infinite weight stays out of the points it has no part in). */
#ifndef MT_WINOGRAD_H
#define MT_WINOGRAD_H

/* F(2x2) B^T: d[0..3] from x0..x3 */
#define MT_WINO2_BT(x0, x1, x2, x3, d)                                         \
    do {                                                                       \
        const __typeof__(x0) b0_ = (x0), b1_ = (x1), b2_ = (x2), b3_ = (x3);   \
        (d)[0] = b0_ - b2_;                                                    \
        (d)[1] = b1_ + b2_;                                                    \
        (d)[2] = b2_ - b1_;                                                    \
        (d)[3] = b1_ - b3_;                                                    \
    } while (0)

/* F(2x2) A^T: d[0..1] from m0..m3 */
#define MT_WINO2_AT(m0, m1, m2, m3, d)                                         \
    do {                                                                       \
        const __typeof__(m0) a0_ = (m0), a1_ = (m1), a2_ = (m2), a3_ = (m3);   \
        (d)[0] = a0_ + a1_ + a2_;                                              \
        (d)[1] = a1_ - a2_ - a3_;                                              \
    } while (0)

/* F(2x2) G: d[0..3] from the kernel's k0..k2, in their type */
#define MT_WINO2_G(k0, k1, k2, d)                                              \
    do {                                                                       \
        const __typeof__(k0) g0_ = (k0), g1_ = (k1), g2_ = (k2);               \
        (d)[0] = g0_;                                                          \
        (d)[1] = (g0_ + g1_ + g2_) * (__typeof__(k0))0.5;                      \
        (d)[2] = (g0_ - g1_ + g2_) * (__typeof__(k0))0.5;                      \
        (d)[3] = g2_;                                                          \
    } while (0)

/* F(4x4) B^T: d[0..5] from s[0], s[st], ..., s[5 st] */
#define MT_WINO4_BT(s, st, d)                                                  \
    do {                                                                       \
        const __typeof__((s)[0]) x0_ = (s)[0], x1_ = (s)[st], x2_ = (s)[2 * (st)]; \
        const __typeof__((s)[0]) x3_ = (s)[3 * (st)], x4_ = (s)[4 * (st)], x5_ = (s)[5 * (st)]; \
        const __typeof__(x0_) p_ = x4_ - 4 * x2_, q_ = 4 * x1_ - x3_, r_ = x4_ - x2_, t_ = 2 * (x1_ - x3_); \
        (d)[0] = 4 * x0_ - 5 * x2_ + x4_;                                      \
        (d)[1] = p_ - q_;                                                      \
        (d)[2] = p_ + q_;                                                      \
        (d)[3] = r_ - t_;                                                      \
        (d)[4] = r_ + t_;                                                      \
        (d)[5] = 4 * x1_ - 5 * x3_ + x5_;                                      \
    } while (0)

/* F(4x4) A^T: d[0..3] from s[0], s[st], ..., s[5 st] */
#define MT_WINO4_AT(s, st, d)                                                  \
    do {                                                                       \
        const __typeof__((s)[0]) a12_ = (s)[st] + (s)[2 * (st)], s12_ = (s)[st] - (s)[2 * (st)]; \
        const __typeof__((s)[0]) a34_ = (s)[3 * (st)] + (s)[4 * (st)], s34_ = (s)[3 * (st)] - (s)[4 * (st)]; \
        (d)[0] = (s)[0] + a12_ + a34_;                                         \
        (d)[1] = s12_ + 2 * s34_;                                              \
        (d)[2] = a12_ + 4 * a34_;                                              \
        (d)[3] = s12_ + 8 * s34_ + (s)[5 * (st)];                              \
    } while (0)

/* F(4x4) G: d[0..5] from the kernel's k0..k2, in their type */
#define MT_WINO4_G(k0, k1, k2, d)                                              \
    do {                                                                       \
        typedef __typeof__(k0) wt_;                                            \
        const wt_ s02_ = (k0) + (k2), q_ = (k0) * (wt_)(1.0 / 24) + (k2) * (wt_)(1.0 / 6); \
        (d)[0] = (k0) * (wt_)0.25;                                             \
        (d)[1] = -(s02_ + (k1)) * (wt_)(1.0 / 6);                              \
        (d)[2] = -(s02_ - (k1)) * (wt_)(1.0 / 6);                              \
        (d)[3] = q_ + (k1) * (wt_)(1.0 / 12);                                  \
        (d)[4] = q_ - (k1) * (wt_)(1.0 / 12);                                  \
        (d)[5] = (k2);                                                         \
    } while (0)

/* G's rows as coefficients, for packing in double (nchwc.c) */
static const double MT_WINO_G2[4][3] = {{1, 0, 0}, {0.5, 0.5, 0.5}, {0.5, -0.5, 0.5}, {0, 0, 1}};
static const double MT_WINO_G4[6][3] = {
    {0.25, 0, 0}, {-1.0 / 6, -1.0 / 6, -1.0 / 6}, {-1.0 / 6, 1.0 / 6, -1.0 / 6},
    {1.0 / 24, 1.0 / 12, 1.0 / 6}, {1.0 / 24, -1.0 / 12, 1.0 / 6}, {0, 0, 1}};

#endif
