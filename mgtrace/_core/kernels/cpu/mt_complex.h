/* Complex elementwise loops (complex64, complex128) for the CPU backend.
 *
 * A complex element is an interleaved (re, im) pair of float32 / float64,
 * the layout of C99 `float _Complex` and NumPy's complex64 / complex128.
 * mt_complex_init() adds the loops the op tables hold (add, sub, mul,
 * truediv, eq, ne, neg, casts, fills) to the mt_ops.h tables; the loops
 * whose result dtype differs from the computation's (make a complex from
 * two reals; a complex's real part, imaginary part, modulus, argument) are
 * handed out by the two functions below and run by the caller.
 */
#ifndef MT_COMPLEX_H
#define MT_COMPLEX_H
#include "mt_common.h"

enum mt_complex_part { MT_CPART_REAL = 0, MT_CPART_IMAG, MT_CPART_ABS, MT_CPART_ANGLE };

void mt_complex_init(void);
/* out complex <- (re, im), both of real dtype float32 (complex64) or float64
 * (complex128); NULL for another dtype */
mt_loop_fn mt_complex_make_loop(int real_dtype);
/* out real <- part of a complex64 (float32 out) or complex128 (float64 out) */
mt_loop_fn mt_complex_part_loop(int part, int complex_dtype);

#endif
