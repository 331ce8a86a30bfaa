/* Thread teams of the int8 kernels (defined in qgemm.c, which says how a
 * team is sized): each kernel asks mt_q_team how many threads its work
 * pays for, at most the calling thread's count (mt_q_set_threads). */
#ifndef MT_QTEAM_H
#define MT_QTEAM_H
#include <stdint.h>

/* threads for ``work`` units (multiply-adds, or their equivalent) */
int mt_q_team(int64_t work);
/* the calling thread's most threads (0: OpenMP's default), and setting it */
int mt_q_threads(void);
void mt_q_set_threads(int n);
/* an element's quantize, dequantize or add in those units (a division or
 * two conversions, a round and a store: vdivps alone takes some 16 cycles
 * per 16 lanes) */
#define MT_Q_ELEM_COST 16
/* a depthwise multiply-add in those units: these kernels run 8-20 G of
 * them a second, the dense ones' tiles 100-300 G, so a dense grain of
 * depthwise work is about eight times as long (MobileNetV2's 14x14 and 7x7
 * depthwise layers, 0.4-1 M, ran on one thread for 65-105 us) */
#define MT_Q_DW_COST 8
/* [*at, *at + *len) of n elements: share c of nt, equal in whole 16-element vectors */
void mt_q_share(int64_t n, int64_t c, int64_t nt, int64_t *at, int64_t *len);

#endif
