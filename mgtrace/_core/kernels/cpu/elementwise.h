/* The CPU's elementwise kernels: inner loops per op and dtype
 * (elementwise.c), run over an N-d index space by mt_nd_loop (iter.c). The
 * op codes are the contract's mt_ops.h. */
#ifndef MT_ELEMENTWISE_H
#define MT_ELEMENTWISE_H
#include "mt_common.h"
#include "mt_ops.h"

/* Kernel tables, indexed [op][dtype of the computation]; NULL = unsupported. */
extern mt_loop_fn mt_unary_loops[MT_NUNARY][MT_NDTYPES];
extern mt_loop_fn mt_binary_loops[MT_NBINARY][MT_NDTYPES];
extern mt_loop_fn mt_ternary_loops[MT_NTERNARY][MT_NDTYPES];
/* cast loops [from][to] */
extern mt_loop_fn mt_cast_loops[MT_NDTYPES][MT_NDTYPES];
/* fill loops (out only; aux points at one value of the dtype) */
extern mt_loop_fn mt_fill_loops[MT_NDTYPES];

void mt_elementwise_init(void);

#endif
