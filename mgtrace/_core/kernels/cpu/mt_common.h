/* Shared C declarations for mgtrace's CPU kernels: the inner-loop type,
 * the AVX2 clone policy, threading and the N-d elementwise loop. The
 * device-neutral part (dtype codes, float16 conversions) is the contract's
 * mt_types.h, included here.
 *
 * C does bytes: nothing here knows about Python objects. Strides passed to
 * kernels are in BYTES (the Cython layer converts from element strides).
 */
#ifndef MT_COMMON_H
#define MT_COMMON_H

#include "mt_types.h"   /* contract/: dtype codes, limits, float16 conversions */

/* An inner loop over one dimension: args[0] is the output, args[1..] the
 * inputs; steps are byte strides, one per arg; aux carries op parameters. */
typedef void (*mt_loop_fn)(char **args, const int64_t *steps, int64_t n, const void *aux);

/* Hot loops get an AVX2+FMA clone picked at run time on x86-64 (the baseline
 * build must run on any x86-64, as a wheel does): MT_CLONES and the other
 * clone macros, the vector types and the CPU probe are mt_simd.h's. */
#include "mt_simd.h"

/* ---- threading ---- */
int mt_get_num_threads(void);      /* the configured count */
void mt_set_num_threads(int n);
/* What a kernel should use now: the configured count, fewer while other
 * processes keep the cores busy (iter.c) when adaptive threads are on: off
 * unless MGTRACE_ADAPTIVE_THREADS=1 (mgtrace._core sets it at import). */
int mt_run_threads(void);
/* Pin the calling thread's count: mt_run_threads returns n (> 0) in this
 * thread until pinned again with 0 (a plan records its kernels at the
 * count it will replay them at). Returns the previous pin. */
int mt_pin_run_threads(int n);
void mt_set_adaptive_threads(int on);
int mt_get_adaptive_threads(void);

/* Runs an N-d elementwise loop: shape has ndim dims (outermost first);
 * strides[a * MT_MAX_NDIM + d] is arg a's byte stride on dim d. The work
 * is split over threads when n_elements * cost exceeds a grain size. */
void mt_nd_loop(mt_loop_fn fn, int nargs, char **base, int ndim, const int64_t *shape,
                const int64_t *strides, const void *aux, int cost);

#endif
