/* Pieces of the int8 epilogues shared by qconv.c and qgemm.c (their
 * arithmetic: mgtrace.quantization's rule, round half to even). */
#ifndef MT_QROUND_H
#define MT_QROUND_H
#include <stdint.h>

/* How near a .5 tie a float32 value may lie before the fast routes hand
 * its vector to the exact arithmetic: |u - rint(u)| above this. Each
 * route's error is under 2^-12 (put16q's fma, q_div's reciprocal), so
 * beyond 2^-11 from a tie the float32 value rounds as the exact one. */
#define MT_Q_NEAR_TIE (0.5f - 0x1p-11f)

/* The float32 ReLU6 with hi for 6, as the elementwise kernel computes it
 * (x < 0 ? 0 : x > hi ? hi : x, -0 kept): the float output of an int8
 * layer into which the plan folded the ReLU6 after it (plan/_qact.py) */
static inline float mt_q_relu6f(float y, int32_t hi)
{
    return y < 0 ? 0 : y > (float)hi ? (float)hi : y;
}

#endif
