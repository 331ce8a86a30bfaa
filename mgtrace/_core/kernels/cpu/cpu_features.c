/* The CPU probe the kernels ask before calling a v4-only kernel (see
 * mt_simd.h); the clones' own dispatch is the loader's. */
#include "mt_simd.h"

#if MT_ISA_CLONES
int mt_cpu_avx512(void) {
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq")
        && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
}
int mt_cpu_intel(void) { return __builtin_cpu_is("intel"); }
#else
int mt_cpu_avx512(void) { return 0; }
int mt_cpu_intel(void) { return 0; }
#endif
