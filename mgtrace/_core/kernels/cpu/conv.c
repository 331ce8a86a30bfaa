/* Convolution kernels: conv2d and conv_transpose2d over BLAS GEMM (no GEMM
 * is written here), and direct kernels where a GEMM's packing or its shape
 * loses: depthwise, DIRECT and BLOCKED.
 *
 * conv2d algorithms (enum mt_conv_algo in the contract's nn_kernels.h), one
 * file each under conv/; conv/choice.c holds their table (conv_algos) and
 * the choice among them as one priority list of rules (conv_rules):
 *
 *   GEMM1X1    1x1, stride 1, no padding: y[n] = W [O x C] *
 *              x[n] [C x H*W], GEMMs straight on the input, no copies;
 *              one contiguous piece of y a thread, in column sub-tiles
 *              that start as the bias and get the epilogue in cache.
 *   WINOGRAD   3x3, stride 1, no dilation, >= 16 channels (most of ResNet and
 *              VGG): F(2x2, 3x3) over chunks of 2x2 output tiles counted over
 *              the batch (so 7x7 planes still make wide GEMMs). The input and
 *              output transforms are additions; the multiply-adds are 16
 *              GEMMs [O x C] * [C x tiles], 16 * C * O per tile where a direct
 *              convolution needs 36 * C * O.
 *   SHIFTED    y = sum over kernel taps (kh, kw) of W[:, :, kh, kw] times the
 *              input shifted by the tap. The input is copied once into a
 *              zero-padded buffer laid out [channel][image][row][col]; in it
 *              the input shifted by a tap is the same buffer at an offset, so
 *              each tap is one GEMM with K = C/groups, with no im2col. The
 *              GEMM output is "wide" (rows of wq columns, a few of which are
 *              not outputs) and is scattered into NCHW with the bias. A stride
 *              s splits the padded input into s*s phases (every s-th row and
 *              column, starting at each offset); a strided conv is then again
 *              a sum of shifted GEMMs, each over one phase. Used for large
 *              planes that WINOGRAD does not take (strided, dilated, 5x5...).
 *   IM2COL     im2col over SHIFTED's padded, phase-split copy (so columns
 *              are plain copies), one tile of output pixels at a time, then
 *              one GEMM per tile with K = C/groups * KH * KW; tiles span
 *              images on small planes (N = batch * OH * OW, not OH * OW); a
 *              1x1 kernel uses the copy itself as the GEMM operand. For few
 *              input channels (a first layer, where SHIFTED's K would be
 *              tiny), planes below 32x32 (where SHIFTED's wide columns waste
 *              most) and strided 1x1.
 *   WINOGRAD4  F(4x4, 3x3) as WINOGRAD: 36 GEMMs, 0.56x F(2x2)'s
 *              multiply-adds, where planes have many 4x4 tiles.
 *   DIRECT     multiply-adds in registers over a padded, phase-split copy:
 *              blocks of output channels times vectors of consecutive
 *              ("wide") outputs, the weights broadcast. Stems and strided
 *              layers on large planes.
 *   BLOCKED    multiply-adds in registers vectorised the other way: two
 *              vectors of output channels (weights packed [block][C][tap]
 *              [32]) times up to 12 pixels of an output row, the input
 *              broadcast; no output is computed that is not used, which
 *              small planes (7x7, 14x14) need. With the packed weights
 *              cached (AVX-512 only): strided layers, 3x3 layers with few
 *              Winograd tiles, 1x1 layers with many input channels.
 *   DEPTHWISE  one input channel per group (MobileNet's depthwise convs):
 *              direct loops, one output plane per OpenMP task. The plane is
 *              first copied zero-padded and split into the stride's phases,
 *              so that the plane's outputs are one long unit-stride loop
 *              with no bounds checks (3x3: nine multiply-adds an output in
 *              registers), in whole 16-lane vectors even on 7x7 planes.
 *
 * conv_transpose2d: col = W^T * x (GEMM), then col2im adds the columns into
 * the output, in tiles of input pixels.
 *
 * Threads: each call is one OpenMP region (nthreads from the caller) whose
 * threads take work items (tiles of output, images, output-channel blocks)
 * and run single-threaded GEMMs on them, with OpenBLAS switched to one thread
 * for the duration (blas_single_begin/end). Measured on 2 cores, the other
 * arrangements lose: calling a threaded OpenBLAS from inside an OpenMP region
 * oversubscribes (OpenBLAS warns it may hang), and alternating OpenMP copies
 * with threaded GEMMs lets each pool's spin-waiting workers steal the core
 * the other needs (libgomp spins ~ms after a region; 5x slower here).
 * For the same reason OpenBLAS's own thread pool is kept idle altogether:
 * mt_nn_blas_threads_init (blas_threads.c; called once when mgtrace._core.nn is imported)
 * hands every threaded OpenBLAS call, matmul's included, to a callback that
 * runs its jobs on OpenMP threads, so the process has one pool. Without it,
 * OpenBLAS's workers spin for 2^28 cycles (~70 ms) after each threaded call
 * (one Linear layer, say) and slowed the convolutions that followed 2.4x.
 * Scratch memory is the caller's workspace (mt_conv2d_workspace).
 */

#include <pthread.h>
#include <stdlib.h>
#include <cblas.h>
#include "nn.h"
#include "mt_vmath.h"   /* MT_VCLONES */
#include "winograd.h"   /* the transforms, shared with nchwc.c */
#ifdef _OPENMP
#include <omp.h>
#endif

/* One translation unit: each file under conv/ holds one algorithm (or the
 * shared pieces, or the choice) in up to three parts, and conv/parts.h
 * includes them all once per part: MT_CONV_PLANS (constants, plans and
 * workspace sizes, untyped), MT_CONV_KERNELS (the typed kernels, once per
 * dtype with T and SFX defined) and MT_CONV_RUN (the untyped drivers and
 * the public functions, which call the typed kernels). */
#define MT_CONV_PLANS 1
#define MT_CONV_KERNELS 2
#define MT_CONV_RUN 3

#define MT_CONV_PART MT_CONV_PLANS
#include "conv/parts.h"
#undef MT_CONV_PART

#define MT_CONV_PART MT_CONV_KERNELS
#define FN(name) MT_CAT(name, SFX)
#define T float
#define SFX f32
#include "conv/parts.h"
#undef T
#undef SFX
#define T double
#define SFX f64
#include "conv/parts.h"
#undef T
#undef SFX
#undef FN
#undef MT_CONV_PART

#define MT_CONV_PART MT_CONV_RUN
#include "conv/parts.h"
#undef MT_CONV_PART
