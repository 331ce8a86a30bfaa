/* Int8 max pooling on the integers (issue 32): a quantized tensor's max
 * pool is its integers' max pool, the qparams kept, because quantizing is
 * monotone (q = clamp(rint(v / s) + zp) never orders two values the other
 * way), so this is bitwise dequantize / float max_pool2d / quantize with
 * the same qparams, at a quarter of the memory traffic and no conversions.
 *
 * uint8 [planes][H][W] -> uint8 [planes][OH][OW] (an int8 tensor is run as
 * uint8 with its sign bit flipped, x ^ 0x80, which keeps the order; the
 * caller flips in and out). Geometry as F.max_pool2d: window rows
 * oy * SH - PH + kh * DH, columns likewise; positions outside the input
 * never win. The caller has checked it (pad at most half the kernel, every
 * window holds an input element), so padding with 0, the smallest uint8,
 * is the same as leaving those positions out.
 *
 * Each plane is copied into a zero-padded buffer split into its SH * SW
 * stride phases (as pool.c does for floats), so every tap (kh, kw) is one
 * unit-stride max over "wide" output rows of wq bytes: the compiler's
 * vectorised loop, 64 bytes per instruction with AVX-512. Planes run on
 * mt_q_team(work) threads (qgemm.c), each with its own buffer, kept for its
 * next call: qconv.c's mt_q_scratch, the one per-thread buffer of the int8 kernels.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "qteam.h"

uint8_t *mt_q_scratch(size_t n);     /* qconv.c: the calling thread's buffer, kept */

/* Returns 1, or 0 when out of memory (out is then not written whole). */
int mt_qmaxpool2d_u8(const uint8_t *x, int64_t planes, int64_t H, int64_t W, int64_t KH,
                     int64_t KW, int64_t SH, int64_t SW, int64_t PH, int64_t PW, int64_t DH,
                     int64_t DW, int64_t OH, int64_t OW, uint8_t *out)
{
    /* one window along an axis never uses its stride, which may then be any
     * size (2**32 made SH * SW overflow and the copy write past the buffer) */
    if (OH == 1)
        SH = 1;
    if (OW == 1)
        SW = 1;
    /* tap (kh, kw) reads phase ((kh*DH) % SH, (kw*DW) % SW) at row oy +
     * (kh*DH) / SH and column ox + (kw*DW) / SW */
    int64_t ry = (KH - 1) * DH / SH, rx = (KW - 1) * DW / SW;
    int64_t hq = OH + ry, wq = OW + rx;
    /* the phases, then the wide rows; the last tap of a wide row reads up to
     * rx bytes past its phase (columns past OW, dropped): wq bytes of slack.
     * Geometry no buffer can hold is refused as out of memory */
    int64_t phase, phases, all, wide_rows, need_;
    if (__builtin_mul_overflow(hq, wq, &phase) || __builtin_mul_overflow(SH, SW, &phases)
            || __builtin_mul_overflow(phases, phase, &all)
            || __builtin_mul_overflow(OH, wq, &wide_rows)
            || __builtin_add_overflow(all, wq + wide_rows, &need_))
        return 0;
    size_t need = (size_t)need_;
    int failed = 0, nt = mt_q_team(planes * OH * OW * KH * KW);
#pragma omp parallel reduction(|:failed) num_threads(nt) if (nt > 1)
    {
        uint8_t *buf = mt_q_scratch(need);
        if (!buf)
            failed = 1;
#pragma omp for schedule(static)
        for (int64_t p = 0; p < planes; p++) {
            if (!buf)
                continue;
            const uint8_t *xs = x + p * H * W;
            uint8_t *wide = buf + (size_t)all + (size_t)wq;
            memset(buf, 0, need);
            /* padded row r = h + PH goes to phase row r / SH of phase r % SH;
             * rows and columns past what a window reads are not copied */
            for (int64_t h = 0; h < H; h++) {
                int64_t r = h + PH, qy = r / SH;
                if (qy >= hq)
                    break;
                uint8_t *prow = buf + (size_t)((r % SH) * SW) * phase + (size_t)(qy * wq);
                const uint8_t *xr = xs + h * W;
                if (SW == 1) {
                    int64_t n = W < wq - PW ? W : wq - PW;
                    if (n > 0)
                        memcpy(prow + PW, xr, (size_t)n);
                    continue;
                }
                /* column phase b holds padded columns qx * SW + b, input
                 * column qx * SW + b - PW: the qx in [lo, hi) inside the row */
                for (int64_t b = 0; b < SW; b++) {
                    int64_t lo = b >= PW ? 0 : (PW - b + SW - 1) / SW;
                    int64_t hi = W - 1 + PW - b < 0 ? 0 : (W - 1 + PW - b) / SW + 1;
                    if (hi > wq)
                        hi = wq;
                    uint8_t *pb = prow + (size_t)b * phase;
                    const uint8_t *xb = xr + b - PW;
                    if (SW == 2)        /* a constant stride: a vectorised deinterleave */
                        for (int64_t qx = lo; qx < hi; qx++)
                            pb[qx] = xb[qx * 2];
                    else
                        for (int64_t qx = lo; qx < hi; qx++)
                            pb[qx] = xb[qx * SW];
                }
            }
            int64_t n = OH * wq;
            for (int64_t kh = 0; kh < KH; kh++)
                for (int64_t kw = 0; kw < KW; kw++) {
                    int64_t a = kh * DH, b = kw * DW;
                    const uint8_t *src = buf + (size_t)((a % SH) * SW + b % SW) * phase
                                         + (size_t)((a / SH) * wq + b / SW);
                    for (int64_t i = 0; i < n; i++)
                        wide[i] = src[i] > wide[i] ? src[i] : wide[i];
                }
            uint8_t *o = out + p * OH * OW;
            for (int64_t oy = 0; oy < OH; oy++)
                memcpy(o + oy * OW, wide + oy * wq, (size_t)OW);
        }
    }
    return !failed;
}

/* Int8 average pooling on the integers (issue 32; MegEngine pools a
 * quantized tensor to the same dtype, scale and zero point). Output
 * (oy, ox) of a plane sums the integers of rows [ys[oy], ye[oy]) and
 * columns [xs[ox], xe[ox]) of the input (the window clipped to it) minus
 * the zero point once per element, which is the sum of the real values
 * over the scale (a padded position holds the real 0: it adds nothing),
 * and divides by dy[oy] * dx[ox] (the caller's divisor: the clipped
 * window's size, or the padded one's for MegEngine's "average" mode),
 * rounding the exact quotient half to even, the project's one rule:
 *
 *     out = clamp(round_half_even((sum(q) - zp * n) / (dy * dx)) + zp, lo, hi)
 *
 * The quotient is rint((double)num / d): both below 2**53, the division
 * is correctly rounded, so a tie k + 1/2 comes out exact and rint (round
 * half to even, the default mode) takes it to even, and a quotient that
 * is no tie lies at least 1 / (2d) from one, far more than the division's
 * error. A zero divisor (a window wholly in the padding) writes zp, the
 * float pool's 0.
 *
 * Each output row sums its window's rows column by column (unit stride,
 * vectorised), then takes each window's columns as a difference of prefix
 * sums; a global pool (one window over the whole plane) sums the plane in
 * one pass. Sums are int32 where a plane's sum fits (H * W < 2**23), int64
 * otherwise. x is int8 (is_s8) or uint8, [planes][H][W]; out the same
 * type [planes][OH][OW]. Planes run on mt_q_team threads, each with a
 * buffer of 2 W + 1 int64. Returns 1, or 0 when out of memory. */
#include <math.h>

static inline int64_t avg_store(int64_t sum, int64_t n, int64_t d, int32_t zp, int32_t lo,
                                int32_t hi)
{
    int64_t v = zp;
    if (d > 0)
        v += (int64_t)rint((double)(sum - (int64_t)zp * n) / (double)d);
    return v < lo ? lo : v > hi ? hi : v;
}

/* one plane; ACC the column sums' type, IN the input's */
#define AVG_PLANE(NAME, IN, ACC)                                                            \
static void NAME(const IN *xs, int64_t H, int64_t W, int64_t OH, int64_t OW,               \
                 const int64_t *ys, const int64_t *ye, const int64_t *dy, const int64_t *xs0, \
                 const int64_t *xe, const int64_t *dx, int32_t zp, int32_t lo, int32_t hi,  \
                 ACC *col, int64_t *pre, IN *o)                                             \
{                                                                                           \
    if (OH == 1 && OW == 1 && ys[0] == 0 && ye[0] == H && xs0[0] == 0 && xe[0] == W) {      \
        ACC sum = 0;                                                                        \
        for (int64_t i = 0; i < H * W; i++)                                                 \
            sum += xs[i];                                                                   \
        o[0] = (IN)avg_store(sum, H * W, dy[0] * dx[0], zp, lo, hi);                        \
        return;                                                                             \
    }                                                                                       \
    for (int64_t oy = 0; oy < OH; oy++) {                                                   \
        for (int64_t w = 0; w < W; w++)                                                     \
            col[w] = 0;                                                                     \
        for (int64_t h = ys[oy]; h < ye[oy]; h++) {                                         \
            const IN *r = xs + h * W;                                                       \
            for (int64_t w = 0; w < W; w++)                                                 \
                col[w] += r[w];                                                             \
        }                                                                                   \
        pre[0] = 0;                                                                         \
        for (int64_t w = 0; w < W; w++)                                                     \
            pre[w + 1] = pre[w] + col[w];                                                   \
        int64_t rows = ye[oy] - ys[oy];                                                     \
        for (int64_t ox = 0; ox < OW; ox++)                                                 \
            o[oy * OW + ox] = (IN)avg_store(pre[xe[ox]] - pre[xs0[ox]],                     \
                                            rows * (xe[ox] - xs0[ox]), dy[oy] * dx[ox], zp, \
                                            lo, hi);                                        \
    }                                                                                       \
}

AVG_PLANE(avg_plane_s8_32, int8_t, int32_t)
AVG_PLANE(avg_plane_u8_32, uint8_t, int32_t)
AVG_PLANE(avg_plane_s8_64, int8_t, int64_t)
AVG_PLANE(avg_plane_u8_64, uint8_t, int64_t)

int mt_qavgpool2d(const void *x, int is_s8, int64_t planes, int64_t H, int64_t W, int64_t OH,
                  int64_t OW, const int64_t *ys, const int64_t *ye, const int64_t *dy,
                  const int64_t *xs, const int64_t *xe, const int64_t *dx, int32_t zp,
                  int32_t lo, int32_t hi, void *out)
{
    int64_t work = 0;
    for (int64_t oy = 0; oy < OH; oy++)
        work += (ye[oy] - ys[oy]) * W + OW;
    int narrow = H * W < ((int64_t)1 << 23);   /* 255 * H * W < 2**31 */
    int failed = 0, nt = mt_q_team(planes * work);
#pragma omp parallel reduction(|:failed) num_threads(nt) if (nt > 1)
    {
        /* W int64 column sums (or 2 W int32), then W + 1 prefix sums */
        int64_t *buf = (int64_t *)mt_q_scratch((size_t)(2 * W + 1) * sizeof(int64_t));
        if (!buf)
            failed = 1;
        int64_t *pre = buf ? buf + W : NULL;
#pragma omp for schedule(static)
        for (int64_t p = 0; p < planes; p++) {
            if (!buf)
                continue;
            size_t in = (size_t)(p * H * W), at = (size_t)(p * OH * OW);
            if (is_s8 && narrow)
                avg_plane_s8_32((const int8_t *)x + in, H, W, OH, OW, ys, ye, dy, xs, xe, dx,
                                zp, lo, hi, (int32_t *)buf, pre, (int8_t *)out + at);
            else if (is_s8)
                avg_plane_s8_64((const int8_t *)x + in, H, W, OH, OW, ys, ye, dy, xs, xe, dx,
                                zp, lo, hi, buf, pre, (int8_t *)out + at);
            else if (narrow)
                avg_plane_u8_32((const uint8_t *)x + in, H, W, OH, OW, ys, ye, dy, xs, xe, dx,
                                zp, lo, hi, (int32_t *)buf, pre, (uint8_t *)out + at);
            else
                avg_plane_u8_64((const uint8_t *)x + in, H, W, OH, OW, ys, ye, dy, xs, xe, dx,
                                zp, lo, hi, buf, pre, (uint8_t *)out + at);
        }
    }
    return !failed;
}
