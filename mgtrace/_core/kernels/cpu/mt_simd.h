/* The CPU kernels' instruction sets, in one place: the clone policy, the
 * vector types and the CPU probe.
 *
 * One build runs on any x86-64, as a wheel must; hot loops also carry
 * clones built for x86-64-v3 (AVX2 + FMA) and x86-64-v4 (AVX-512 F, DQ,
 * BW, VL), one of which the loader picks by CPU (GCC's target_clones: an
 * ifunc per function). Debug and sanitizer builds (MT_NO_CLONES, setup.py)
 * and other compilers build the baseline alone.
 *
 *   MT_CLONES     baseline + x86-64-v3: the elementwise, reduction and
 *                 convolution loops (MT_RCLONES: the same, reduce.c/sort.c's name)
 *   MT_VCLONES    baseline + v3 + v4: loops over mt_vmath.h's 16-lane math
 *   MT_V4CLONES   baseline + v4: the NCHW16c kernels (nchwc.c), whose 64-byte
 *                 vectors are one AVX-512 register
 *   MT_V4ONLY     v4 alone: kernels called only where mt_cpu_avx512() is 1
 *                 (conv.c's wide DIRECT/BLOCKED micro-kernels)
 *
 * Vector types are GCC vector extensions, so one source gives every clone
 * its width: a 64-byte vector is four SSE registers in the baseline, two
 * AVX2 registers in the v3 clone, one AVX-512 register in v4.
 */
#ifndef MT_SIMD_H
#define MT_SIMD_H
#include <stdint.h>

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && !defined(MT_NO_CLONES)
#define MT_ISA_CLONES 1
#define MT_CLONES __attribute__((target_clones("default", "arch=x86-64-v3")))
#define MT_VCLONES __attribute__((target_clones("default", "arch=x86-64-v3", "arch=x86-64-v4")))
#define MT_V4CLONES __attribute__((target_clones("default", "arch=x86-64-v4")))
#define MT_V4ONLY __attribute__((target("arch=x86-64-v4")))
#else
#define MT_ISA_CLONES 0
#define MT_CLONES
#define MT_VCLONES
#define MT_V4CLONES
#define MT_V4ONLY
#endif
#define MT_RCLONES MT_CLONES
#define MT_IVDEP _Pragma("GCC ivdep")

/* 16 float32 lanes (mt_vmath.h's math) */
#define MT_VL 16
typedef float mt_vf __attribute__((vector_size(4 * MT_VL)));
typedef int32_t mt_vi __attribute__((vector_size(4 * MT_VL)));
/* the same, loaded and stored at any float's alignment (nchwc.c) */
typedef float mt_v16f_u __attribute__((vector_size(64), aligned(4)));
typedef int32_t mt_v16i_u __attribute__((vector_size(64), aligned(4)));
/* their low half: 8 lanes (nchwc.c's half-block tiles) */
typedef float mt_v8f_u __attribute__((vector_size(32), aligned(4)));
typedef int32_t mt_v8i_u __attribute__((vector_size(32), aligned(4)));
/* 4 lanes of 16 bytes (reduce.c's softmax) */
typedef float mt_v4f __attribute__((vector_size(16)));
typedef int32_t mt_v4i __attribute__((vector_size(16)));
typedef uint32_t mt_v4u __attribute__((vector_size(16)));

/* 1 when this CPU has the AVX-512 subsets (F, DQ, BW, VL) of x86-64-v4,
 * which the kernels' v4 clones are built for; 0 where there are no clones
 * (cpu_features.c) */
int mt_cpu_avx512(void);
/* 1 on an Intel CPU (for the few choices measured to differ from AMD's
 * Zen 4, where the kernels were tuned: nchwc.c's row bands), 0 elsewhere
 * and where there are no clones */
int mt_cpu_intel(void);

#endif
