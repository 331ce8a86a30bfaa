/* conv.c's parts in the order each part's pieces are defined (no include
 * guard: conv.c includes this once per MT_CONV_PART). The shared pieces
 * first, then one file per algorithm, then the choice among them. */
#include "common.c"
#include "depthwise.c"
#include "direct.c"
#include "blocked.c"
#include "gemm1x1.c"
#include "shifted.c"
#include "im2col.c"
#include "winograd.c"
#include "transpose.c"
#include "choice.c"
