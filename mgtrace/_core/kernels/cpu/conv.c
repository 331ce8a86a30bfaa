/* Convolution kernels: conv2d and conv_transpose2d over BLAS GEMM (no GEMM
 * is written here), and direct kernels where a GEMM's packing or its shape
 * loses: depthwise, DIRECT and BLOCKED.
 *
 * conv2d algorithms (enum mt_conv_algo in nn.h; mt_conv2d_pick_algo chooses):
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
 *
 * Typed helpers are written once below the MT_NN_TEMPLATE line and compiled
 * per dtype by including this file again with T and SFX defined.
 */
#ifndef MT_NN_TEMPLATE

#include <pthread.h>
#include <stdlib.h>
#include <cblas.h>
#include "nn.h"
#include "mt_vmath.h"   /* MT_VCLONES */
#ifdef _OPENMP
#include <omp.h>
#endif

/* SHIFTED: bytes of padded copy per batch of images (at least one image) */
#define MT_SHIFTED_BATCH_BYTES ((int64_t)32 << 20)
/* AUTO uses SHIFTED only while one image's padded copy stays below this */
#define MT_SHIFTED_MAX_BYTES ((int64_t)512 << 20)
/* SHIFTED/IM2COL/col2im: target bytes of the per-tile GEMM output / column buffer */
#define MT_TILE_BYTES ((int64_t)1 << 20)
/* AUTO: fewest input channels per group for SHIFTED (GEMM K below this is slow) */
#define MT_SHIFTED_MIN_K 16
/* AUTO: fewest output pixels an image for SHIFTED (below, IM2COL measured faster) */
#define MT_SHIFTED_MIN_PLANE 1024
/* IM2COL: column tiles span images below this many output pixels an image */
#define MT_IM2COL_SPAN 256
/* IM2COL: fewest columns a tile where the total allows (the GEMM's N) */
#define MT_IM2COL_MIN_N 96
/* IM2COL: bytes of column buffer a tile when that leaves 512 columns or more */
#define MT_IM2COL_SMALL_TILE ((int64_t)128 << 10)
/* WINOGRAD: bytes of transformed input and output (V and M) a chunk of tiles */
#define MT_WINO_CHUNK_BYTES ((int64_t)8 << 20)
/* AUTO: transformed Winograd weights above this many bytes need more tiles to pay */
#define MT_WINO_BIG_U ((int64_t)4 << 20)
/* WINOGRAD: elements between the 16 planes of U, V and M beyond their size, so
 * that the transforms' 16 streams do not share cache sets (C * tiles * 4
 * bytes is often a multiple of 4 KiB: 64 channels x 1008 tiles) */
#define MT_WINO_SKEW 16
/* WINOGRAD: input channels a block of the weight transform */
#define MT_WINO_CBLK 64

static inline int64_t mt_clamp64(int64_t v, int64_t lo, int64_t hi) { return v < lo ? lo : (v > hi ? hi : v); }
/* floor and ceiling division for b > 0 and any a */

/* Scratch memory comes from the caller (mt_conv2d_workspace says how much):
 * the core's allocator caches large blocks, so no call pays fresh page faults.
 * Pieces are carved off 64-byte aligned.
 *
 * Workspace sizes come from the caller's geometry, and a valid call can ask
 * for more than int64 counts (padding of 2^30 on a thousand channels), so
 * the plans compute them with saturating arithmetic: a size that does not
 * fit is WS_TOO_LARGE, which the workspace queries report as
 * MT_NN_EOVERFLOW instead of a wrapped, too small buffer. */
#define WS_TOO_LARGE INT64_MAX
static inline int64_t ws_mul(int64_t a, int64_t b) {
    int64_t r;
    return __builtin_mul_overflow(a, b, &r) ? WS_TOO_LARGE : r;
}
static inline int64_t ws_mul4(int64_t a, int64_t b, int64_t c, int64_t d) {
    return ws_mul(ws_mul(a, b), ws_mul(c, d));
}
static inline int64_t ws_add(int64_t a, int64_t b) {
    int64_t r;
    return __builtin_add_overflow(a, b, &r) ? WS_TOO_LARGE : r;
}
static inline int64_t ws_round(int64_t nbytes) {
    return nbytes > WS_TOO_LARGE - 63 ? WS_TOO_LARGE : (nbytes + 63) & ~(int64_t)63;
}
static inline int64_t ws_report(int64_t nbytes) { return nbytes == WS_TOO_LARGE ? MT_NN_EOVERFLOW : nbytes; }
static inline char *ws_take(char **ws, int64_t nbytes) {
    char *p = *ws;
    *ws += ws_round(nbytes);
    return p;
}

/* Tile width: columns of an m-row buffer that fit MT_TILE_BYTES, within [lo, total]. */
static int64_t tile_cols(int64_t m, int64_t isz, int64_t lo, int64_t hi, int64_t total) {
    int64_t t = MT_TILE_BYTES / mt_max64(1, m * isz);
    t = mt_clamp64(t, lo, hi) & ~(int64_t)15;
    return mt_clamp64(t, 1, mt_max64(1, total));
}

/* C[m x n] (+)= op(A) * B, row-major; op(A) = A^T when trans_a (A stored [k][m]). */
static void gemm(int dt, int trans_a, int64_t m, int64_t n, int64_t k, const void *a, int64_t lda,
                 const void *b, int64_t ldb, int accumulate, void *c, int64_t ldc) {
    const enum CBLAS_TRANSPOSE ta = trans_a ? CblasTrans : CblasNoTrans;
    if (dt == MT_FLOAT32)
        scipy_cblas_sgemm(CblasRowMajor, ta, CblasNoTrans, (blasint)m, (blasint)n, (blasint)k, 1.0f,
                          (const float *)a, (blasint)lda, (const float *)b, (blasint)ldb,
                          accumulate ? 1.0f : 0.0f, (float *)c, (blasint)ldc);
    else
        scipy_cblas_dgemm(CblasRowMajor, ta, CblasNoTrans, (blasint)m, (blasint)n, (blasint)k, 1.0,
                          (const double *)a, (blasint)lda, (const double *)b, (blasint)ldb,
                          accumulate ? 1.0 : 0.0, (double *)c, (blasint)ldc);
}

/* dst[i] = src[i * step] for n elements of isz bytes (step in elements). */
static inline void copy_strided(char *dst, const char *src, int64_t n, int64_t step, int64_t isz) {
    if (step == 1) { memcpy(dst, src, (size_t)(n * isz)); return; }
    if (isz == 4) {
        uint32_t *d = (uint32_t *)dst; const uint32_t *s = (const uint32_t *)src;
        for (int64_t i = 0; i < n; i++) d[i] = s[i * step];
    } else {
        uint64_t *d = (uint64_t *)dst; const uint64_t *s = (const uint64_t *)src;
        for (int64_t i = 0; i < n; i++) d[i] = s[i * step];
    }
}

/* Fills dst[0..n) from one input row: element i reads row[i * step + first]
 * where that lies in [0, w), else 0. */
static inline void gather_row(char *dst, const char *row, int64_t n, int64_t first, int64_t step,
                              int64_t w, int64_t isz) {
    int64_t lo = mt_clamp64(mt_ceildiv(-first, step), 0, n);
    int64_t hi = mt_clamp64(mt_floordiv(w - 1 - first, step) + 1, lo, n);
    memset(dst, 0, (size_t)(lo * isz));
    if (hi > lo) copy_strided(dst + lo * isz, row + (lo * step + first) * isz, hi - lo, step, isz);
    memset(dst + hi * isz, 0, (size_t)((n - hi) * isz));
}

static inline int thread_id(void) {
#ifdef _OPENMP
    return omp_get_thread_num();
#else
    return 0;
#endif
}

/* DEPTHWISE's packed plane: the zero-padded input plane split into the
 * stride's sh * sw phases (phase (a, b) holds padded rows a, a + sh, ... and
 * columns b, b + sw, ...), each hq x wq. In it, tap (kh, kw) of output
 * (oy, ox) is element (oy * wq + ox) + off[tap] (off: the tap's phase plane
 * and shift), so a whole plane of outputs is one 1-D convolution over
 * "wide" rows of wq elements (of which ow are outputs). Used while a
 * plane's copy and wide output fit MT_DW_MAX_BYTES. */
#define MT_DW_MAX_BYTES ((int64_t)4 << 20)
/* DEPTHWISE's wide loop: lanes a vector (16 floats: one AVX-512 register) */
#define MT_DW_LANES 16
/* DEPTHWISE: input planes of at most this many elements, strided or under
 * 16 columns wide, are packed through an index map (FN(dw_scatter))
 * instead of row by row (576 planes of 14x14 at stride 2: 1.4x faster on
 * one thread, 1.9x on two; 960 of 7x7: 1.2x, 1.4x) */
#define MT_DW_MAP_MAX 1024
typedef struct {
    int64_t hq, wq, plane, wide, bytes_one;   /* bytes_one: a thread's scratch */
    int64_t map_bytes;                        /* the index map, shared (0: none) */
    int64_t off_bytes;                        /* the taps' offsets (the workspace's last part) */
    int packed;
} dw_plan;

/* the workspace bytes of a table of one int64 a kernel tap (DEPTHWISE's,
 * DIRECT's and BLOCKED's tap offsets: a kernel as large as the input has a
 * million taps, too many for the stack) */
static int64_t tap_offset_bytes(const mt_conv2d_geom *g) {
    return ws_round(ws_mul4(g->kh, g->kw, (int64_t)sizeof(int64_t), 1));
}

static void plan_dw(const mt_conv2d_geom *g, int64_t isz, dw_plan *pl) {
    const int64_t hp = ws_add(ws_mul(g->oh - 1, g->sh), ws_add(ws_mul(g->kh - 1, g->dh), 1));
    const int64_t wp = ws_add(ws_mul(g->ow - 1, g->sw), ws_add(ws_mul(g->kw - 1, g->dw), 1));
    pl->hq = hp == WS_TOO_LARGE ? WS_TOO_LARGE : (hp + g->sh - 1) / g->sh;
    pl->wq = wp == WS_TOO_LARGE ? WS_TOO_LARGE : (wp + g->sw - 1) / g->sw;
    pl->plane = ws_mul(pl->hq, pl->wq);
    pl->wide = ws_mul(g->oh, pl->wq);
    /* each + MT_DW_LANES: the wide loop runs in whole vectors past the last
     * output; + 1 more: the packed plane's bin for the map's unused inputs */
    pl->bytes_one = ws_add(ws_round(ws_mul(ws_add(ws_mul(ws_mul(g->sh, g->sw), pl->plane), MT_DW_LANES + 1), isz)),
                           ws_round(ws_mul(ws_add(pl->wide, MT_DW_LANES), isz)));
    pl->packed = pl->bytes_one <= MT_DW_MAX_BYTES;
    /* (rows of 16 or more unit-stride columns copy as fast row by row: 28x28 measured) */
    pl->map_bytes = pl->packed && g->h * g->w <= MT_DW_MAP_MAX && (g->sw > 1 || g->w < 16)
                    ? ws_round(g->h * g->w * (int64_t)sizeof(int32_t)) : 0;
    pl->off_bytes = tap_offset_bytes(g);
}

/* off[k] for each kernel tap k = kh * kw_count + kw: where the tap's input
 * for wide output 0 lies in the packed plane (its phase plane, then its
 * shift); for wide output j it is off[k] + j */
static void dw_tap_offsets(const mt_conv2d_geom *g, const dw_plan *pl, int64_t *off) {
    for (int64_t k = 0; k < g->kh * g->kw; k++) {
        const int64_t r = k / g->kw * g->dh, c = k % g->kw * g->dw;
        off[k] = ((r % g->sh) * g->sw + c % g->sw) * pl->plane + (r / g->sh) * pl->wq + c / g->sw;
    }
}

/* DEPTHWISE's index map for small planes: map[iy * w + ix] is where input
 * (iy, ix) goes in the packed plane (phase (a, b), row i, column t of
 * dw_plan's layout), or the bin past the slack for an input no output
 * reads (the last row or column of an even plane under stride 2). Each
 * input has exactly one place, so packing a plane is one loop over its
 * elements in order; the row-by-row copy spent more on loop set-up than on
 * copying for 14x14 planes (two phases, seven rows, five loops a row under
 * stride 2). Offsets fit int32: the packed plane is under MT_DW_MAX_BYTES. */
static void dw_fill_map(const mt_conv2d_geom *g, const dw_plan *pl, int32_t *map) {
    const int64_t bin = g->sh * g->sw * pl->plane + MT_DW_LANES;
    for (int64_t iy = 0; iy < g->h; iy++) {
        const int64_t a = (iy + g->ph) % g->sh, i = (iy + g->ph) / g->sh;
        for (int64_t ix = 0; ix < g->w; ix++) {
            const int64_t b = (ix + g->pw) % g->sw, t = (ix + g->pw) / g->sw;
            map[iy * g->w + ix] = (int32_t)(i < pl->hq && t < pl->wq
                                            ? (a * g->sw + b) * pl->plane + i * pl->wq + t : bin);
        }
    }
}

/* ------------------------------------------------------------------ DIRECT */

/* DIRECT's register blocks: output channels a micro-kernel call keeps (see
 * FN(direct_wide)); the wide kernel (AVX-512, picked at run time) holds
 * 8 x 2 vectors of 64 bytes, the narrow one (AVX2 or baseline) 6 x 2 of 32 */
#define MT_DIRECT_OB_WIDE 8
#define MT_DIRECT_OB_NARROW 6
#define MT_DIRECT_WIDE_ATTR MT_V4ONLY    /* mt_simd.h; called where mt_cpu_avx512() */
/* tests: 1 runs DIRECT's narrow kernel even where the CPU has AVX-512 */
static int direct_narrow_forced = 0;
void mt_conv2d_direct_force_narrow(int on) { direct_narrow_forced = on != 0; }
/* DIRECT: bytes of packed input rows a range of wide outputs reads */
#define MT_DIRECT_CHUNK_BYTES ((int64_t)512 << 10)
/* DIRECT with cached weights instead of WINOGRAD below this many F(2x2) tiles (see mt_conv2d_pick_algo_ex) */
#define MT_DIRECT_MAX_TILES 128
/* DIRECT: packed input channels above this many bytes an image go to the other algorithms */
#define MT_DIRECT_MAX_BYTES ((int64_t)16 << 20)

typedef struct {
    dw_plan dw;                 /* one channel's packed phases (as DEPTHWISE's plane) */
    int64_t cs;                 /* elements between packed channels */
    int64_t cnt, chunk, nchunk; /* wide outputs, and the ranges tasks split them in */
    int64_t ys;                 /* elements between a thread's wide output rows */
    int64_t pk_bytes, wpk_bytes, yw_bytes, bytes;
    int wide;
} direct_plan;

/* DIRECT's packed-weight layout on this CPU: the micro-kernel's block of
 * output channels (MT_DIRECT_OB_WIDE or MT_DIRECT_OB_NARROW) */
static int direct_layout(void) {
    return !direct_narrow_forced && mt_cpu_avx512() ? MT_DIRECT_OB_WIDE : MT_DIRECT_OB_NARROW;
}

/* The kernel (wide or narrow: layout, as direct_layout says) is picked
 * here, but every size below is the wide kernel's, which bounds the narrow
 * one's: a workspace sized by one plan serves either (the test switch may
 * flip between the two calls). own_w: the workspace holds the packed
 * weights (at its end; 0: the caller passes them packed already). */
static void plan_direct(const mt_conv2d_geom *g, int64_t isz, int nt, int layout, int own_w, direct_plan *pl) {
    plan_dw(g, isz, &pl->dw);
    pl->wide = layout == MT_DIRECT_OB_WIDE;
    const int64_t pair = 2 * 64 / isz;          /* wide outputs a kernel step (the narrow: half) */
    const int64_t obk = MT_DIRECT_OB_WIDE;      /* (the narrow: fewer) */
    const int64_t cg = g->c / g->groups, og = g->o / g->groups;
    const int64_t phases = ws_mul(ws_mul(g->sh, g->sw), pl->dw.plane);
    /* a kernel step reads up to pair - 1 elements past the last wide output */
    pl->cs = ws_mul((ws_add(phases, pair) + 15) / 16, 16);
    pl->cnt = ws_add(ws_mul(g->oh - 1, pl->dw.wq), g->ow);
    const int64_t steps = (pl->cnt + pair - 1) / pair;
    /* ranges of wide outputs whose input rows (all of a group's channels
     * and phases) fit MT_DIRECT_CHUNK_BYTES, so that the output-channel
     * blocks after the first find them in cache; more ranges while the
     * tasks are fewer than 4 a thread */
    const int64_t blocks = ws_mul(g->groups, (og + obk - 1) / obk);
    const int64_t row_bytes = ws_mul4(cg, ws_mul(g->sh, g->sw), pl->dw.wq, isz);
    const int64_t rows = mt_max64(1, MT_DIRECT_CHUNK_BYTES / mt_max64(1, row_bytes));
    const int64_t fit = (ws_mul(rows, pl->dw.wq) + pair - 1) / pair;     /* steps a range */
    const int64_t want = nt > 1 && blocks < 4 * (int64_t)nt ? (4 * (int64_t)nt + blocks - 1) / blocks : 1;
    pl->nchunk = mt_clamp64(mt_max64(want, (steps + fit - 1) / fit), 1, steps);
    pl->chunk = ws_mul((steps + pl->nchunk - 1) / pl->nchunk, pair);
    pl->nchunk = (pl->cnt + pl->chunk - 1) / pl->chunk;
    pl->ys = ws_add(ws_mul(steps, pair), 16);
    pl->pk_bytes = ws_round(ws_mul4(g->c, pl->cs, isz, 1));
    /* packed weights: each group's og rows rounded up to a block of either kernel */
    pl->wpk_bytes = ws_round(ws_mul4(ws_mul(g->groups, og + obk), cg, ws_mul(g->kh, g->kw), isz));
    pl->yw_bytes = ws_round(ws_mul4(obk, pl->ys, isz, 1));
    pl->bytes = ws_add(ws_add(ws_add(pl->pk_bytes, own_w ? pl->wpk_bytes : 0), ws_mul(nt, pl->yw_bytes)),
                       tap_offset_bytes(g));
}

/* ----------------------------------------------------------------- BLOCKED */

/* BLOCKED's register tile: up to R output pixels of one row times two
 * vectors of output channels (a block of OCB = 2 vectors: 32 float32 or
 * 16 float64 with AVX-512, half that with AVX2 or baseline), 2R
 * accumulators of the 32 zmm (or 16 ymm) registers beside two weight
 * vectors and a broadcast. */
#define MT_BLK_R_WIDE 12
#define MT_BLK_R_NARROW 6

typedef struct {
    int64_t hp, wp, cs;        /* the padded input: rows, row length, elements between channels */
    int64_t ocb, nob;          /* output channels a block, blocks a group */
    int64_t nseg, seg, extra;  /* a row's segments: seg + 1 pixels for the first extra, then seg */
    int64_t xp_bytes, wpk_bytes, row_bytes, bytes;
    int wide, rows_outer;
} blk_plan;

/* BLOCKED's packed-weight layout on this CPU: the vector's bytes (64 for
 * the AVX-512 kernel, 32 for the AVX2/baseline one; the test switch of
 * DIRECT forces the latter too) */
static int blk_layout(void) { return direct_layout() == MT_DIRECT_OB_WIDE ? 64 : 32; }

/* layout: blk_layout()'s when the weights were packed; own_w: the
 * workspace holds the packed weights (at its end) */
static void plan_blk(const mt_conv2d_geom *g, int64_t isz, int nt, int layout, int own_w, blk_plan *pl) {
    const int64_t cg = g->c / g->groups, og = g->o / g->groups, kk = ws_mul(g->kh, g->kw);
    pl->wide = layout == 64;
    pl->ocb = 2 * layout / isz;
    pl->nob = (og + pl->ocb - 1) / pl->ocb;
    pl->hp = ws_add(g->h, 2 * g->ph);
    pl->wp = ws_add(g->w, 2 * g->pw);
    pl->cs = ws_mul(pl->hp, pl->wp);
    const int64_t rmax = pl->wide ? MT_BLK_R_WIDE : MT_BLK_R_NARROW;
    pl->nseg = (g->ow + rmax - 1) / rmax;
    pl->seg = g->ow / pl->nseg;
    pl->extra = g->ow % pl->nseg;
    /* (without padding the kernel reads the input as it is: no copy) */
    pl->xp_bytes = g->ph || g->pw ? ws_round(ws_mul4(g->c, pl->cs, isz, 1)) : 0;
    pl->wpk_bytes = ws_round(ws_mul4(ws_mul(g->groups, pl->nob), ws_mul(pl->ocb, cg), kk, isz));
    pl->row_bytes = ws_round(ws_mul4(g->ow, pl->ocb, isz, 1));
    pl->bytes = ws_add(ws_add(ws_add(pl->xp_bytes, ws_mul(nt, pl->row_bytes)), own_w ? pl->wpk_bytes : 0),
                       tap_offset_bytes(g));
    /* a thread's tasks: rows of every block when all the weights take less
     * than the input (each thread keeps the weights in cache and reads half
     * the rows), else blocks of every row (each reads its own weights once) */
    pl->rows_outer = pl->wpk_bytes / mt_max64(1, g->groups) <= ws_mul4(cg, pl->cs, isz, 1);
}

#define MT_NN_TEMPLATE
#define T float
#define SFX f32
#include "conv.c"
#undef T
#undef SFX
#define T double
#define SFX f64
#include "conv.c"
#undef T
#undef SFX
#undef MT_NN_TEMPLATE

/* ------------------------------------------------------------ threading */
/* (OpenBLAS on OpenMP's threads, and single-threaded inside a conv's
 * region: blas_threads.c) */

/* Columns per work item: the cache budget, but small enough for about four
 * items a thread (total * others columns in all), and never below lo. */
static int64_t split_cols(int64_t budget, int64_t lo, int64_t total, int64_t others, int nt) {
    const int64_t want = (total * others + 4 * nt - 1) / (4 * nt);
    const int64_t t = mt_min64(mt_min64(budget, mt_max64(lo, want)), total);
    return mt_max64(1, t);
}

/* Output-channel blocks per group: 1, or more when the column tiles alone
 * leave threads idle (blocks keep at least 32 rows, a GEMM-friendly M). */
static int64_t o_blocks(int64_t og, int64_t items, int nt) {
    int64_t nob = 1;
    while (nt > 1 && items * nob < 3 * (int64_t)nt && og / (2 * nob) >= 32) nob *= 2;
    return nob;
}

/* Column tiles for `others` independent sets of `total` columns: at most hi
 * columns a tile, and more tiles (while they keep lo columns) until the
 * items (tiles * others) share evenly over nt threads or number 4 a thread. */
static int64_t even_tiles(int64_t total, int64_t lo, int64_t hi, int64_t others, int nt) {
    const int64_t first = (total + hi - 1) / hi;
    for (int64_t t = first; nt > 1 && (total + t - 1) / t >= lo; t++)
        if ((t * others) % nt == 0 || t * others >= 4 * (int64_t)nt) return t;
    return first;
}

/* Output-channel blocks per group: 1, or more while the items leave threads
 * idle or share unevenly (blocks keep at least 32 rows, a GEMM-friendly M). */
static int64_t o_split(int64_t og, int64_t items, int nt) {
    int64_t nob = 1;
    while (nt > 1 && items * nob < 4 * (int64_t)nt && (items * nob) % nt != 0 && og / (2 * nob) >= 32) nob *= 2;
    return nob;
}

/* y[r][0..cnt) = bias[r] for rows r < rows, ld elements apart (a GEMM then adds onto it) */
static inline void fill_rows(int dt, char *y, int64_t ld, int64_t rows, int64_t cnt, const char *bias) {
    if (dt == MT_FLOAT32) fill_rows_f32((float *)y, ld, rows, cnt, (const float *)bias);
    else fill_rows_f64((double *)y, ld, rows, cnt, (const double *)bias);
}

static inline void add_bias_rows(int dt, char *y, int64_t ld, int64_t rows, int64_t cnt, const char *bias,
                                 const mt_conv2d_geom *g) {
    if (bias) {
        if (dt == MT_FLOAT32) bias_rows_f32((float *)y, ld, rows, cnt, (const float *)bias);
        else bias_rows_f64((double *)y, ld, rows, cnt, (const double *)bias);
    }
    if (g->act || g->has_res) {   /* a fused conv2d's epilogue, on the rows GEMM just wrote */
        if (dt == MT_FLOAT32) for (int64_t r = 0; r < rows; r++) epilogue_f32((float *)y + r * ld, cnt, g);
        else for (int64_t r = 0; r < rows; r++) epilogue_f64((double *)y + r * ld, cnt, g);
    }
}

/* ------------------------------------------------------------------ choice */

/* The stride's phases the taps read. Tap (i, j) reads the padded input's
 * rows a, a + sh, ... and columns b, b + sw, ... with a = i*dh % sh and
 * b = j*dw % sw. Along an axis these repeat with period sh / gcd(dh, sh)
 * (i and i + period read the same phase), so the distinct (a, b) pairs, the
 * "slots" of the padded copy, are min(kh, row period) x min(kw, column
 * period): tap (i, j) reads slot (i % row period, j % column period). All
 * of it is O(KH*KW) whatever the stride: the phases are never enumerated
 * (a stride of 2^31 has 2^62 of them). */
static int64_t mt_gcd64(int64_t a, int64_t b) {
    while (b) { const int64_t t = a % b; a = b; b = t; }
    return a;
}

static int64_t phase_period(int64_t d, int64_t s) { return s / mt_gcd64(d % s, s); }

static int64_t count_slots(const mt_conv2d_geom *g) {
    return mt_min64(g->kh, phase_period(g->dh, g->sh)) * mt_min64(g->kw, phase_period(g->dw, g->sw));
}

static int64_t shifted_hq(const mt_conv2d_geom *g) { return ws_add(g->oh, ws_mul(g->kh - 1, g->dh) / g->sh); }
static int64_t shifted_wq(const mt_conv2d_geom *g) { return ws_add(g->ow, ws_mul(g->kw - 1, g->dw) / g->sw); }
/* SHIFTED: wide columns an image needs (its last output is at (oh-1)*wq + ow - 1) */
static int64_t shifted_need(const mt_conv2d_geom *g) { return ws_add(ws_mul(g->oh - 1, shifted_wq(g)), g->ow); }
/* SHIFTED tiles stay within an image (skipping the rows between images) when
 * an image has enough columns, else span images */
static int shifted_per_image(const mt_conv2d_geom *g) { return shifted_need(g) >= 512; }

static int wino_applicable(const mt_conv2d_geom *g) {
    return g->kh == 3 && g->kw == 3 && g->sh == 1 && g->sw == 1 && g->dh == 1 && g->dw == 1;
}

/* DIRECT's packed image stays within MT_DIRECT_MAX_BYTES (float64) */
static int direct_fits(const mt_conv2d_geom *g) {
    direct_plan pl;
    plan_direct(g, 8, 1, MT_DIRECT_OB_WIDE, 1, &pl);
    return pl.pk_bytes <= MT_DIRECT_MAX_BYTES;
}

/* BLOCKED (its AVX-512 kernel: the AVX2 one is unmeasured) with the
 * weights packed once (cached by the caller: packing 512x512x3x3 weights
 * costs about as much as that layer at batch 1), where it measured faster
 * inside ResNet-18 and MobileNetV2 on 2 cores of an AVX-512 EPYC (its time
 * over the algorithm picked before):
 * - strided layers with 256 and more multiply-adds an output (3x3 stride 2:
 *   0.7-0.8 at batch 1 and 8), or 64 and more for 1x1 ones (0.6-0.8); not
 *   the stems (3 input channels, 7x7: 1.04-1.26 of DIRECT's time);
 * - 3x3 stride 1 with fewer than MT_BLK_MAX_TILES F(2x2) tiles, where
 *   Winograd's 16 GEMMs are thin (512 channels on 7x7: 0.75; 14x14 and
 *   28x28 at batch 1: 0.84-0.91; at batch 8 F(4x4) is faster on 28x28 and
 *   56x56, and as fast on 14x14);
 * - 1x1 stride 1 with 512 and more input channels on planes up to 14x14
 *   (0.74-0.86; with fewer channels an output has too few multiply-adds to
 *   pay for its transposition into NCHW: up to 2.4x the GEMM's time). */
#define MT_BLK_MAX_TILES 400
static int blocked_pays(const mt_conv2d_geom *g, int w_cached) {
    if (!w_cached || blk_layout() != 64) return 0;
    const int64_t cg = g->c / g->groups, og = g->o / g->groups;
    const double macs = (double)cg * (double)g->kh * (double)g->kw, ohw = (double)g->oh * (double)g->ow;
    const int is1x1 = g->kh == 1 && g->kw == 1;
    if (og < 16 || macs < (is1x1 ? 64 : 256)) return 0;
    blk_plan pl;
    plan_blk(g, 8, 1, 64, 1, &pl);
    if (pl.xp_bytes > MT_DIRECT_MAX_BYTES) return 0;
    if (g->sh > 1 || g->sw > 1) return 1;
    if (wino_applicable(g))
        return (double)g->n * (double)((g->oh + 1) / 2) * (double)((g->ow + 1) / 2) < MT_BLK_MAX_TILES;
    return is1x1 && g->ph == 0 && g->pw == 0 && cg >= 512 && ohw <= 196;
}

int mt_conv2d_pick_algo(const mt_conv2d_geom *g) { return mt_conv2d_pick_algo_ex(g, 0); }

int mt_conv2d_direct_algo(const mt_conv2d_geom *g) { return direct_fits(g) ? MT_CONV_DIRECT : MT_CONV_IM2COL; }

/* |v| < 2^k exactly when v's biased exponent field is below bias + k (NaN
 * and inf have the field all ones, so k = 128 / 1024 is the finiteness
 * test). On the bits, so that the loop vectorizes (an OR of integer
 * compares; a float test would be a reduction the compiler may not
 * reorder). */
MT_VCLONES int mt_all_below(int dtype, const void *p, int64_t n, int k) {
    const char *c = (const char *)p;
    unsigned bad = 0;
    if (dtype == MT_FLOAT32) {
        const uint32_t lim = (uint32_t)mt_clamp64(127 + k, 0, 255) << 23;
        for (int64_t i = 0; i < n; i++) {
            uint32_t b;
            memcpy(&b, c + 4 * i, 4);       /* (memcpy: no aliasing of the floats) */
            bad |= (b & 0x7f800000u) >= lim;
        }
    } else {
        const uint64_t lim = (uint64_t)mt_clamp64(1023 + k, 0, 2047) << 52;
        for (int64_t i = 0; i < n; i++) {
            uint64_t b;
            memcpy(&b, c + 8 * i, 8);
            bad |= (b & 0x7ff0000000000000ull) >= lim;
        }
    }
    return !bad;
}

/* Winograd's headroom. Through F(4x4)'s transforms a value grows at most by
 * the product of each 1-D transform's largest absolute row sum, squared
 * (the partial sums of a row stay within it too): B^T d B by 10^2, G g G^T
 * by 1 (its partial sums by 3), A^T m A by 19^2; F(2x2)'s are 2^2, 1.5^2
 * (partial sums 4.5) and 3^2. The point GEMMs add C/groups products, so
 * every intermediate is below 36100 C X W < 2^(16 + L) X W, L =
 * ceil(log2(C/groups)), for |x| < X and |w| < W. With X = W = 2^k and
 * 2k <= E - 16 - L, E = 127 (float32) or 1023 (float64), nothing reaches
 * 2^E, so the transforms overflow only where the direct sum's own values
 * would (its bound, 9 C X W, is smaller). Past the bound, or on NaN or
 * inf, a call runs on the direct kernel (MT_NN_NONFINITE). */
int mt_wino_bound(int dtype, const mt_conv2d_geom *g) {
    const int64_t cg = g->c / g->groups;
    int lg = 0;
    while (lg < 63 && ((int64_t)1 << lg) < cg) lg++;
    return ((dtype == MT_FLOAT32 ? 127 : 1023) - 16 - lg) / 2;
}

int mt_conv2d_pick_algo_ex(const mt_conv2d_geom *g, int w_cached) {
    const int64_t cg = g->c / g->groups;
    if (cg == 1) return MT_CONV_DEPTHWISE;
    if (blocked_pays(g, w_cached)) return MT_CONV_BLOCKED;
    const int is1x1 = g->kh == 1 && g->kw == 1;
    /* 1x1 without stride or padding is a GEMM on the input as it is (even on
     * 7x7 planes it measured as fast as IM2COL's copy batching the images);
     * a strided 1x1 is IM2COL's GEMM on its subsampled copy */
    if (is1x1 && g->sh == 1 && g->sw == 1 && g->ph == 0 && g->pw == 0)
        return MT_CONV_GEMM1X1;
    if (is1x1) return MT_CONV_IM2COL;
    /* Winograd needs 3x3, stride 1, no dilation; its 16 GEMMs need enough
     * channels (K and M), and enough 2x2 tiles over the batch (N) to pay for
     * the weight transform (16 values per 3x3 kernel, every call unless the
     * caller caches U): more when the transformed weights outgrow the cache
     * (512x512: 16 MiB) */
    /* (the sizes below in double: they only rank algorithms, and must not
     * wrap for the huge geometries a workspace query then refuses) */
    const int64_t og = g->o / g->groups;
    const double tiles = (double)g->n * (double)((g->oh + 1) / 2) * (double)((g->ow + 1) / 2);
    /* (with U cached by the caller, 32 tiles pay whatever U's size: 512
     * channels on 7x7 planes measured 25% faster than IM2COL at batch 2) */
    const int64_t min_tiles = !w_cached && 64.0 * (double)g->o * (double)cg > (double)MT_WINO_BIG_U ? 64 : 32;
    /* DIRECT with its weights packed once (cached by the caller) beats
     * Winograd on few tiles, where Winograd's 16 GEMMs are thin (measured
     * in ResNet-18 at batch 1: 512 channels on 7x7 planes 0.60x, 256 on
     * 14x14 0.84x; at 28x28 and at batch 8 Winograd is as fast or faster) */
    if (w_cached && wino_applicable(g) && og >= 16 && tiles < MT_DIRECT_MAX_TILES && direct_fits(g))
        return MT_CONV_DIRECT;
    if (wino_applicable(g) && cg >= 16 && og >= 16 && tiles >= min_tiles) {
        /* F(4x4) does 0.56x F(2x2)'s multiply-adds a tile of 2x2 outputs,
         * but its U is 2.25x larger and its tiles 4x fewer: it pays where
         * as many 4x4 tiles remain (56x56 and 28x28 planes measured 1.1-1.6x
         * faster than F(2x2), 7x7 from batch 4), unless it computes more
         * outputs that are dropped (14x14 planes: 16x16 outputs for 14x14,
         * against none for F(2x2); measured slower) */
        const double th4 = (double)((g->oh + 3) / 4), tw4 = (double)((g->ow + 3) / 4);
        const double th2 = (double)((g->oh + 1) / 2), tw2 = (double)((g->ow + 1) / 2);
        const double tiles4 = (double)g->n * th4 * tw4;
        if (tiles4 >= min_tiles && 16.0 * th4 * tw4 <= 4.0 * th2 * tw2 * 1.05) return MT_CONV_WINOGRAD4;
        return MT_CONV_WINOGRAD;
    }
    /* DIRECT (no GEMM: its micro-kernel runs near the FMA peak, where a
     * single-threaded sgemm reaches about 65% of it) beats IM2COL's copy
     * and GEMM on few input channels (ResNet's and MobileNet's stems:
     * 1.4-1.6x) and on strided layers with 28x28 outputs and up (1.15x). On
     * smaller planes its wide rows waste more and IM2COL's GEMM wins; 1x1
     * kernels stay GEMMs. */
    /* With its weights cached, DIRECT wins on the strided layers of every
     * plane size (ResNet-18's 3x3 stride 2 to 14x14 and 7x7: 0.6x IM2COL at
     * batch 1 and 8). */
    const double ohw_all = (double)g->oh * (double)g->ow;
    const int strided = g->sh > 1 || g->sw > 1;
    if (!is1x1 && direct_fits(g) && (cg < MT_SHIFTED_MIN_K || (strided && (w_cached || ohw_all >= 784))))
        return MT_CONV_DIRECT;
    const double one_image = (double)count_slots(g) * (double)g->c * (double)shifted_hq(g)
                           * (double)shifted_wq(g) * 8.0;
    /* SHIFTED computes wide columns that are not outputs: worth it while they
     * are few (large planes); IM2COL copies K values per output instead,
     * which costs more than SHIFTED's GEMMs with K = C/groups lose on large
     * planes (56x56 and up), less on smaller ones (28x28 measured) */
    const double wide = shifted_per_image(g) ? (double)shifted_need(g)
                                             : (double)shifted_hq(g) * (double)shifted_wq(g);
    const double ohw = (double)g->oh * (double)g->ow, waste = wide / ohw;
    if (cg >= MT_SHIFTED_MIN_K && waste <= 1.2 && one_image <= (double)MT_SHIFTED_MAX_BYTES
        && ohw >= MT_SHIFTED_MIN_PLANE)
        return MT_CONV_SHIFTED;
    return MT_CONV_IM2COL;
}

/* ---------------------------------------------------------------- GEMM1X1 */

/* Each (image, group) is one GEMM y [og x hw] = W [og x cg] * x [cg x hw].
 * Threads take contiguous pieces of the output (static schedule): whole
 * (image, group) slabs when they share evenly over the threads, else each
 * slab cut into as many pieces as that needs, along the output channels
 * (rows: a thread's piece is then one contiguous block of y) when that
 * leaves at least MT_1X1_MIN_ROWS rows a piece, else along the pixels in
 * 16-aligned ranges. Measured on 2 cores with MobileNetV2's 144 x 3136 x 24,
 * interleaving many small tiles over the threads (dynamic schedule, tiles
 * not cache-line aligned) ran 2x slower than one contiguous piece a thread:
 * the threads' writes meet at every tile edge, and each tile's rows are
 * short strided runs for the prefetchers.
 * Inside a piece the columns go in sub-tiles of about MT_1X1_TILE_BYTES of
 * output: each is filled with the bias, the GEMM accumulates onto it (beta
 * 1; without a bias beta 0), and the epilogue runs while it is in cache, so
 * the output is written once from memory's point of view instead of three
 * times (BLAS's beta = 0 zeroing, the bias pass, the activation pass), which
 * for a small K (24 input channels: 48 flops an output) costs as much as
 * the GEMM. 64 KiB sub-tiles measured 5-10% faster than 128 KiB with the
 * output not in cache (as in a network), 96 x 12544 x 16 most. */
#define MT_1X1_TILE_BYTES ((int64_t)64 << 10)
#define MT_1X1_MIN_ROWS 32
#define MT_1X1_MIN_SUB 256

static int conv_gemm1x1(int dt, const char *x, const char *w, const char *bias, char *y,
                        const mt_conv2d_geom *g, int nt) {
    const int64_t isz = dt == MT_FLOAT32 ? 4 : 8, hw = g->h * g->w;
    const int64_t cg = g->c / g->groups, og = g->o / g->groups, slabs = g->n * g->groups;
    /* pieces a slab: enough for every thread to get the same number */
    const int64_t parts = nt > 1 ? nt / mt_gcd64(slabs % nt, nt) : 1;
    const int by_rows = parts > 1 && (og / parts >= MT_1X1_MIN_ROWS || hw < parts * 16);
    const int64_t prow = by_rows ? (og + parts - 1) / parts : og;
    const int64_t pcol = by_rows ? hw : ((hw + parts - 1) / parts + 15) & ~(int64_t)15;
    const int64_t items = slabs * parts;
    const int par = nt > 1 && items > 1;
    if (par) mt_nn_blas_single_begin();
    #pragma omp parallel for num_threads(nt) schedule(static) if (par)
    for (int64_t it = 0; it < items; it++) {
        const int64_t piece = it % parts, gi = (it / parts) % g->groups, n = it / (parts * g->groups);
        const int64_t r0 = by_rows ? piece * prow : 0, c0 = by_rows ? 0 : piece * pcol;
        const int64_t rows = mt_min64(prow, og - r0), cols = mt_min64(pcol, hw - c0);
        if (rows <= 0 || cols <= 0) continue;
        const int64_t o0 = gi * og + r0;
        int64_t sub = (MT_1X1_TILE_BYTES / (rows * isz)) & ~(int64_t)15;
        sub = mt_min64(mt_max64(sub, MT_1X1_MIN_SUB), cols);
        const char *xs = x + (n * g->c + gi * cg) * hw * isz;
        for (int64_t p0 = c0; p0 < c0 + cols; p0 += sub) {
            const int64_t cnt = mt_min64(sub, c0 + cols - p0);
            char *yt = y + ((n * g->o + o0) * hw + p0) * isz;
            if (bias) fill_rows(dt, yt, hw, rows, cnt, bias + o0 * isz);
            gemm(dt, 0, rows, cnt, cg, w + o0 * cg * isz, cg, xs + p0 * isz, hw, bias != NULL, yt, hw);
            add_bias_rows(dt, yt, hw, rows, cnt, NULL, g);
        }
    }
    if (par) mt_nn_blas_single_end();
    return 0;
}

/* ---------------------------------------------------------------- SHIFTED */

/* One plane of the padded copy: channel c of one image, a zero-padded
 * hq x wq plane holding padded-input rows a, a + sh, ... and columns b,
 * b + sw, ... where (a, b) is the phase. */
static void pack_plane(const char *x, char *dst, int64_t isz, const mt_conv2d_geom *g, int64_t image,
                       int64_t c, int64_t phase, int64_t hq, int64_t wq) {
    const int64_t a = phase / g->sw, b = phase % g->sw;
    const char *src = x + (image * g->c + c) * g->h * g->w * isz;
    for (int64_t i = 0; i < hq; i++) {
        const int64_t row = i * g->sh + a - g->ph;
        char *d = dst + i * wq * isz;
        if (row < 0 || row >= g->h) memset(d, 0, (size_t)(wq * isz));
        else gather_row(d, src + row * g->w * isz, wq, b - g->pw, g->sw, g->w, isz);
    }
}

/* Tap k reads slot tap_slot[k] of the padded copy (planes of rows wq
 * elements), shifted by tap_shift[k] elements; slot_phase[s] is the phase
 * a * sw + b slot s holds. Returns the number of slots (count_slots). */
static int64_t fill_taps(const mt_conv2d_geom *g, int64_t wq, int64_t *tap_slot, int64_t *tap_shift,
                         int64_t *slot_phase) {
    const int64_t prow = phase_period(g->dh, g->sh), pcol = phase_period(g->dw, g->sw);
    const int64_t nrow = mt_min64(g->kh, prow), ncol = mt_min64(g->kw, pcol);
    for (int64_t r = 0; r < nrow; r++)
        for (int64_t c = 0; c < ncol; c++)
            slot_phase[r * ncol + c] = (r * g->dh % g->sh) * g->sw + c * g->dw % g->sw;
    for (int64_t k = 0; k < g->kh * g->kw; k++) {
        const int64_t i = k / g->kw, j = k % g->kw;
        tap_slot[k] = (i % prow) * ncol + j % pcol;
        tap_shift[k] = (i * g->dh / g->sh) * wq + j * g->dw / g->sw;
    }
    return nrow * ncol;
}

/* SHIFTED's tiling, computed the same way for the workspace query and the run. */
typedef struct {
    int64_t hq, wq, plane, nslots, nb, need_img, cols;
    int per_image_tiles;
    int64_t bytes;   /* workspace */
} shifted_plan;

static void plan_shifted(const mt_conv2d_geom *g, int64_t isz, int nt, shifted_plan *pl) {
    const int64_t kk = g->kh * g->kw, cg = g->c / g->groups, og = g->o / g->groups;
    pl->hq = shifted_hq(g);
    pl->wq = shifted_wq(g);
    pl->plane = ws_mul(pl->hq, pl->wq);
    pl->nslots = count_slots(g);
    const int64_t per_image = ws_mul4(pl->nslots, g->c, pl->plane, isz);
    pl->nb = mt_clamp64(MT_SHIFTED_BATCH_BYTES / mt_max64(1, per_image), 1, g->n);
    pl->need_img = shifted_need(g);
    pl->per_image_tiles = shifted_per_image(g);
    const int64_t budget = MT_TILE_BYTES / (g->o * isz);
    pl->cols = pl->per_image_tiles ? split_cols(budget, 512, pl->need_img, pl->nb, nt)
                                   : split_cols(budget, 512, ws_mul(pl->nb, pl->plane), 1, nt);
    pl->bytes = ws_add(ws_add(ws_round(ws_mul(sizeof(int64_t), 2 * kk + pl->nslots)),
                              ws_round(ws_mul(pl->nb, per_image))),
                       ws_add(ws_round(ws_mul4(nt, og, pl->cols, isz)),
                              ws_round(ws_mul4(kk, g->o, cg, isz))));
}

static int conv_shifted(int dt, const char *x, const char *w, const char *bias, char *y,
                        const mt_conv2d_geom *g, int nt, char *ws) {
    const int64_t isz = dt == MT_FLOAT32 ? 4 : 8;
    const int64_t cg = g->c / g->groups, og = g->o / g->groups, kk = g->kh * g->kw;
    shifted_plan pl;
    plan_shifted(g, isz, nt, &pl);
    const int64_t hq = pl.hq, wq = pl.wq, plane = pl.plane, nb = pl.nb, cols = pl.cols;
    const int64_t need_img = pl.need_img;
    const int per_image_tiles = pl.per_image_tiles;
    int64_t *tap_slot = (int64_t *)ws_take(&ws, sizeof(int64_t) * (2 * kk + pl.nslots));
    char *p = ws_take(&ws, nb * pl.nslots * g->c * plane * isz);
    char *ybuf = ws_take(&ws, (int64_t)nt * og * cols * isz);
    char *wt = ws_take(&ws, kk * g->o * cg * isz);
    /* the phases the taps use, each a "slot" of the padded copy */
    int64_t *tap_shift = tap_slot + kk, *slot_phase = tap_shift + kk;
    const int64_t nslots = fill_taps(g, wq, tap_slot, tap_shift, slot_phase);
    /* weights as [tap][o][c]: each tap's [O x C/groups] block is a GEMM operand */
    for (int64_t o = 0; o < g->o; o++)
        for (int64_t c = 0; c < cg; c++)
            for (int64_t k = 0; k < kk; k++)
                memcpy(wt + ((k * g->o + o) * cg + c) * isz, w + ((o * cg + c) * kk + k) * isz, (size_t)isz);
    const int par = nt > 1;
    if (par) mt_nn_blas_single_begin();
    #pragma omp parallel num_threads(nt) if (par)
    {
        char *yb = ybuf + thread_id() * og * cols * isz;
        for (int64_t n0 = 0; n0 < g->n; n0 += nb) {
            /* the padded copy P of images n0 .. n0 + b - 1 is [slot][channel][image][hq][wq]:
             * a row of the tap-(kh, kw) GEMM operand is one channel's run of P, shifted */
            const int64_t b = mt_min64(nb, g->n - n0), ld = b * plane;
            const int64_t span = per_image_tiles ? need_img : (b - 1) * plane + need_img;
            const int64_t per = (span + cols - 1) / cols, ntile = per_image_tiles ? b * per : per;
            const int64_t nob = o_blocks(og, ntile * g->groups, nt), obs = (og + nob - 1) / nob;
            #pragma omp for schedule(static)
            for (int64_t r = 0; r < nslots * g->c * b; r++)
                pack_plane(x, p + r * plane * isz, isz, g, n0 + r % b, (r / b) % g->c,
                           slot_phase[r / (b * g->c)], hq, wq);
            #pragma omp for schedule(dynamic, 1)
            for (int64_t it = 0; it < ntile * g->groups * nob; it++) {
                const int64_t ob = it % nob, gi = (it / nob) % g->groups, t = it / (nob * g->groups);
                const int64_t o0 = gi * og + ob * obs, rows = mt_min64(obs, og - ob * obs);
                const int64_t j = (t % per) * cols, cnt = mt_min64(cols, span - j);
                const int64_t j0 = (t / per) * plane + j;  /* t / per is 0 when tiles span images */
                for (int64_t k = 0; k < kk; k++)
                    gemm(dt, 0, rows, cnt, cg, wt + (k * g->o + o0) * cg * isz, cg,
                         p + ((tap_slot[k] * g->c + gi * cg) * ld + tap_shift[k] + j0) * isz, ld,
                         k > 0, yb, cols);
                if (dt == MT_FLOAT32)
                    scatter_wide_f32((const float *)yb, cols, j0, cnt, (float *)y, (const float *)bias,
                                     g, n0, o0, rows, hq, wq);
                else
                    scatter_wide_f64((const double *)yb, cols, j0, cnt, (double *)y, (const double *)bias,
                                     g, n0, o0, rows, hq, wq);
            }
        }
    }
    if (par) mt_nn_blas_single_end();
    return 0;
}

/* ----------------------------------------------------------------- IM2COL */

/* IM2COL packs the input first, as SHIFTED does (zero-padded, split into the
 * stride's phases, [slot][channel][image][hq][wq] for a batch of images), so
 * that a row of the column matrix is a run of plain copies with no bounds
 * checks: tap k of output pixel (oy, ox) is element (oy, ox) of its slot's
 * plane shifted by tap_shift[k]. Small planes: column tiles span the batch's
 * images, so that the GEMM's N is large even on 7x7 planes (one GEMM per 7x7
 * image would have N = 49), and the GEMM goes to a buffer that is scattered
 * to NCHW; large planes: tiles within an image, GEMM straight into y. A 1x1
 * kernel needs no columns: the packed copy of a group's channels is itself
 * the GEMM operand [C/groups x b*OH*OW]. Work items are (column tile,
 * output-channel block) pairs, as many as share evenly over the threads. */
typedef struct {
    int64_t hq, wq, plane, nslots, nb;        /* the packed copy, as SHIFTED's */
    int64_t k, cols;                          /* GEMM K = C/groups*KH*KW; columns a tile */
    int span, direct;
    int64_t bytes;                            /* workspace */
} im2col_plan;

static void plan_im2col(const mt_conv2d_geom *g, int64_t isz, int nt, im2col_plan *pl) {
    const int64_t kk = g->kh * g->kw, og = g->o / g->groups, ohw = g->oh * g->ow;
    pl->hq = shifted_hq(g);
    pl->wq = shifted_wq(g);
    pl->plane = ws_mul(pl->hq, pl->wq);
    pl->nslots = count_slots(g);
    pl->k = (g->c / g->groups) * kk;
    pl->direct = kk == 1;
    pl->span = ohw < MT_IM2COL_SPAN;
    const int64_t per_image = ws_mul4(pl->nslots, g->c, pl->plane, isz);
    pl->nb = mt_clamp64(MT_SHIFTED_BATCH_BYTES / mt_max64(1, per_image), 1, g->n);
    /* the column buffer (or, for 1x1, the GEMM output) within the cache
     * budget, but never below MT_IM2COL_MIN_N columns: a narrower GEMM
     * repacks its A (the weights) too often */
    const int64_t rows = pl->direct ? og : pl->k;
    int64_t hi = mt_max64(MT_TILE_BYTES / (rows * isz), MT_IM2COL_MIN_N);
    /* few rows (a first layer's K = 27): tiles of MT_IM2COL_SMALL_TILE bytes,
     * at least 512 columns, so that the columns, the GEMM's output and its
     * epilogue stay in L2 (MobileNetV2's stem, 12544 columns an image:
     * 1213-column tiles ran 1.3x faster on one thread than 6272) */
    hi = mt_max64(mt_min64(hi, mt_max64(MT_IM2COL_SMALL_TILE / (rows * isz), 512)), MT_IM2COL_MIN_N);
    const int64_t total = pl->span ? pl->nb * ohw : ohw, others = pl->span ? g->groups : pl->nb * g->groups;
    const int64_t ntile = even_tiles(total, MT_IM2COL_MIN_N, hi, others, nt);
    pl->cols = (total + ntile - 1) / ntile;
    pl->bytes = ws_add(ws_add(ws_round(ws_mul(sizeof(int64_t), 2 * kk + pl->nslots)),
                              ws_round(ws_mul(pl->nb, per_image))),
                       ws_add(pl->direct ? 0 : ws_round(ws_mul4(nt, pl->k, pl->cols, isz)),
                              pl->span ? ws_round(ws_mul4(nt, og, pl->cols, isz)) : 0));
}

static int conv_im2col(int dt, const char *x, const char *w, const char *bias, char *y,
                       const mt_conv2d_geom *g, int nt, char *ws) {
    const int64_t isz = dt == MT_FLOAT32 ? 4 : 8, ohw = g->oh * g->ow, kk = g->kh * g->kw;
    const int64_t cg = g->c / g->groups, og = g->o / g->groups;
    im2col_plan pl;
    plan_im2col(g, isz, nt, &pl);
    const int64_t k = pl.k, cols = pl.cols, plane = pl.plane, nb = pl.nb;
    const int span = pl.span, direct = pl.direct;
    int64_t *tap_slot = (int64_t *)ws_take(&ws, sizeof(int64_t) * (2 * kk + pl.nslots));
    int64_t *tap_shift = tap_slot + kk, *slot_phase = tap_shift + kk;
    const int64_t nslots = fill_taps(g, pl.wq, tap_slot, tap_shift, slot_phase);
    char *p = ws_take(&ws, nb * nslots * g->c * plane * isz);
    char *colbuf = direct ? NULL : ws_take(&ws, (int64_t)nt * k * cols * isz);
    char *ybuf = span ? ws_take(&ws, (int64_t)nt * og * cols * isz) : NULL;
    const int par = nt > 1;
    if (par) mt_nn_blas_single_begin();
    #pragma omp parallel num_threads(nt) if (par)
    {
        char *col = direct ? NULL : colbuf + thread_id() * k * cols * isz;
        char *yb = span ? ybuf + thread_id() * og * cols * isz : NULL;
        for (int64_t n0 = 0; n0 < g->n; n0 += nb) {
            const int64_t b = mt_min64(nb, g->n - n0), ld = b * plane;
            const int64_t per = span ? (b * ohw + cols - 1) / cols : (ohw + cols - 1) / cols;
            const int64_t ntile = span ? per : b * per;
            const int64_t nob = o_split(og, ntile * g->groups, nt), obs = (og + nob - 1) / nob;
            #pragma omp for schedule(static)
            for (int64_t r = 0; r < nslots * g->c * b; r++)
                pack_plane(x, p + r * plane * isz, isz, g, n0 + r % b, (r / b) % g->c,
                           slot_phase[r / (b * g->c)], pl.hq, pl.wq);
            /* contiguous runs of tiles a thread, as GEMM1X1's pieces (tiles
             * interleaved over the threads ran slower there); even_tiles and
             * o_split make the items share evenly */
            #pragma omp for schedule(static)
            for (int64_t it = 0; it < ntile * g->groups * nob; it++) {
                const int64_t ob = it % nob, gi = (it / nob) % g->groups, t = it / (nob * g->groups);
                const int64_t o0 = gi * og + ob * obs, rows = mt_min64(obs, og - ob * obs);
                /* q0: the tile's first output pixel, counted over the batch's images */
                const int64_t q0 = span ? t * cols : (t / per) * ohw + (t % per) * cols;
                const int64_t cnt = span ? mt_min64(cols, b * ohw - q0) : mt_min64(cols, ohw - (t % per) * cols);
                const char *bop = col;
                int64_t ldb = cols;
                if (direct) {   /* 1x1: plane == oh*ow, so pixel q of channel c is P[c][q] */
                    bop = p + (gi * cg * ld + q0) * isz;
                    ldb = ld;
                } else if (dt == MT_FLOAT32) {
                    im2col_packed_f32((const float *)p, (float *)col, cols, g, tap_slot, tap_shift, gi, b,
                                      plane, pl.wq, q0, cnt);
                } else {
                    im2col_packed_f64((const double *)p, (double *)col, cols, g, tap_slot, tap_shift, gi, b,
                                      plane, pl.wq, q0, cnt);
                }
                if (span) {
                    gemm(dt, 0, rows, cnt, k, w + o0 * k * isz, k, bop, ldb, 0, yb, cols);
                    char *yn = y + n0 * g->o * ohw * isz;
                    if (dt == MT_FLOAT32)
                        scatter_cols_f32((const float *)yb, cols, q0, cnt, (float *)yn, (const float *)bias, g,
                                         o0, rows);
                    else
                        scatter_cols_f64((const double *)yb, cols, q0, cnt, (double *)yn, (const double *)bias, g,
                                         o0, rows);
                } else {
                    char *yt = y + (((n0 + q0 / ohw) * g->o + o0) * ohw + q0 % ohw) * isz;
                    if (bias) fill_rows(dt, yt, ohw, rows, cnt, bias + o0 * isz);   /* the GEMM adds onto it */
                    gemm(dt, 0, rows, cnt, k, w + o0 * k * isz, k, bop, ldb, bias != NULL, yt, ohw);
                    add_bias_rows(dt, yt, ohw, rows, cnt, NULL, g);
                }
            }
        }
    }
    if (par) mt_nn_blas_single_end();
    return 0;
}

/* --------------------------------------------------------------- WINOGRAD */

/* Winograd F(e x e, 3x3) (Lavin & Gray), e = 2 (MT_CONV_WINOGRAD) or 4
 * (MT_CONV_WINOGRAD4): each e x e output tile is A^T [(G g G^T) .* (B^T d B)] A
 * for the a x a input patch d (a = e + 2) at (e ty, e tx) of the zero-padded
 * input and the 3x3 kernel g. Over a chunk of tiles the elementwise
 * product, summed over input channels, is a * a GEMMs
 * M[xi] = U[xi] [O x C] * V[xi] [C x tiles], one per point xi of the a x a
 * transform domain: 16 * C * O multiply-adds per 2x2 tile (4 an output)
 * or 36 * C * O per 4x4 tile (2.25 an output) where a direct convolution
 * needs 9 an output. F(4x4) rounds more (its transforms scale by up to 8
 * and 1/24): up to 1.5e-5 of the output's scale in float32 with 128-256
 * channels of random values, against 7e-7 for F(2x2) and 2e-6 for a
 * direct sum (the worst of 6 seeds of 2x16x16 planes; nchwc.c's Winograd,
 * the same arithmetic, measured).
 * The input is copied zero-padded first (as SHIFTED does), so the
 * transforms need no bounds checks. Then, per chunk of tile rows (counted
 * over the batch's images, so a chunk spans images on small planes), three
 * parallel phases: the input transform into V (a task per channel and tile
 * row), the GEMMs (a task per xi, group and block of output channels:
 * each GEMM is as wide as the chunk, so U[xi] is packed once per chunk even
 * for 7x7 planes), and the output transform (a task per output channel and
 * tile row). */
typedef struct {
    int64_t e, np;          /* output tile edge, transform points (e + 2)^2 */
    int64_t th, tw, hp, wp, plane, nb, rows, tmax, scratch, bytes;
} wino_plan;

static int wino_edge(int algo) { return algo == MT_CONV_WINOGRAD4 ? 4 : 2; }

/* U's size: np planes of [O][C/groups], MT_WINO_SKEW apart */
static int64_t wino_u_bytes(const mt_conv2d_geom *g, int64_t isz, int64_t np) {
    return ws_round(ws_mul4(np, ws_add(ws_mul(g->o, g->c / g->groups), MT_WINO_SKEW), isz, 1));
}

/* own_u: the workspace holds U (0: the caller passes U transformed already) */
static void plan_wino(const mt_conv2d_geom *g, int64_t isz, int e, int nt, int own_u, wino_plan *pl) {
    pl->e = e;
    pl->np = (e + 2) * (e + 2);
    pl->th = (g->oh + e - 1) / e;
    pl->tw = (g->ow + e - 1) / e;
    pl->hp = e * pl->th + 2;
    pl->wp = e * pl->tw + 2;
    pl->plane = ws_mul(pl->hp, pl->wp);
    const int64_t per_image = ws_mul4(g->c, pl->plane, isz, 1);
    pl->nb = mt_clamp64(MT_SHIFTED_BATCH_BYTES / mt_max64(1, per_image), 1, g->n);
    /* tile rows a chunk: V and M (np * (C + O) values a tile) within the
     * chunk budget, in chunks of about equal size */
    const int64_t total = ws_mul(pl->nb, pl->th);
    const int64_t fit = mt_max64(1, MT_WINO_CHUNK_BYTES / ws_mul4(pl->np, g->c + g->o, isz, pl->tw));
    const int64_t nchunk = (total + fit - 1) / fit;
    pl->rows = (total + nchunk - 1) / nchunk;
    pl->tmax = ws_mul(pl->rows, pl->tw);
    /* a thread's scratch: F(4x4)'s row transform (e + 2 rows of wp), and
     * e output rows past the plane's last (dropped) */
    pl->scratch = ws_round(ws_mul(ws_add(ws_mul(e + 2, pl->wp), ws_mul(e, e * pl->tw + e)), isz));
    pl->bytes = ws_add(ws_add(ws_round(ws_mul(pl->nb, per_image)), own_u ? wino_u_bytes(g, isz, pl->np) : 0),
                       ws_add(ws_add(ws_round(ws_mul4(pl->np, ws_add(ws_mul(g->c, pl->tmax), MT_WINO_SKEW), isz, 1)),
                                     ws_round(ws_mul4(pl->np, ws_add(ws_mul(g->o, pl->tmax), MT_WINO_SKEW), isz, 1))),
                              ws_mul(nt, pl->scratch)));
}

/* The transforms of one variant and dtype (written per variant below the
 * MT_NN_TEMPLATE line). */
static void wino_weights_any(int dt, int e, const char *w, char *u, int64_t ux, int64_t cg, int64_t o) {
    if (e == 4) {
        if (dt == MT_FLOAT32) wino4_weights_f32((const float *)w, (float *)u, ux, cg, o);
        else wino4_weights_f64((const double *)w, (double *)u, ux, cg, o);
    } else {
        if (dt == MT_FLOAT32) wino_weights_f32((const float *)w, (float *)u, ux, cg, o);
        else wino_weights_f64((const double *)w, (double *)u, ux, cg, o);
    }
}

static void wino_input_any(int dt, int e, const char *pc, char *vc, int64_t vx, int64_t ty, int64_t tw,
                           int64_t wp, char *scratch) {
    if (e == 4) {
        if (dt == MT_FLOAT32) wino4_input_f32((const float *)pc, (float *)vc, vx, ty, tw, wp, (float *)scratch);
        else wino4_input_f64((const double *)pc, (double *)vc, vx, ty, tw, wp, (double *)scratch);
    } else {
        if (dt == MT_FLOAT32) wino_input_f32((const float *)pc, (float *)vc, vx, ty, tw, wp);
        else wino_input_f64((const double *)pc, (double *)vc, vx, ty, tw, wp);
    }
}

/* rows e ty .. e ty + e - 1 of output plane yo from M (mc: the row's first
 * tile), plus bias[o] and the epilogue */
static void wino_output_any(int dt, int e, const char *mc, int64_t mx, char *yo, const char *bias, int64_t o,
                            int64_t ty, int64_t tw, char *scratch, const mt_conv2d_geom *g) {
    if (dt == MT_FLOAT32) {
        const float bv = bias ? ((const float *)bias)[o] : 0.0f;
        if (e == 4) wino4_output_f32((const float *)mc, mx, (float *)yo, bv, ty, tw, (float *)scratch, g);
        else wino_output_f32((const float *)mc, mx, (float *)yo, bv, ty, tw, g->oh, g->ow, (float *)scratch, g);
    } else {
        const double bv = bias ? ((const double *)bias)[o] : 0.0;
        if (e == 4) wino4_output_f64((const double *)mc, mx, (double *)yo, bv, ty, tw, (double *)scratch, g);
        else wino_output_f64((const double *)mc, mx, (double *)yo, bv, ty, tw, g->oh, g->ow, (double *)scratch, g);
    }
}

/* U from the weights: the np planes of the transformed 3x3 kernels, a
 * task per output channel. */
static void wino_transform(int dt, int e, const char *w, char *u, const mt_conv2d_geom *g, int nt) {
    const int64_t cg = g->c / g->groups, ux = g->o * cg + MT_WINO_SKEW;
    #pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
    for (int64_t o = 0; o < g->o; o++) wino_weights_any(dt, e, w, u, ux, cg, o);
}

/* u_given: U transformed already (mt_conv2d_pack_weights), else NULL and
 * the weights w are transformed into the workspace first. */
static int conv_winograd(int dt, int e, const char *x, const char *w, const char *u_given, const char *bias,
                         char *y, const mt_conv2d_geom *g, int nt, char *ws) {
    const int64_t isz = dt == MT_FLOAT32 ? 4 : 8, ohw = g->oh * g->ow;
    const int64_t cg = g->c / g->groups, og = g->o / g->groups;
    wino_plan pl;
    plan_wino(g, isz, e, nt, u_given == NULL, &pl);
    const int64_t np = pl.np, th = pl.th, tw = pl.tw, plane = pl.plane, nb = pl.nb, rows = pl.rows;
    char *p = ws_take(&ws, nb * g->c * plane * isz);
    /* U[xi]: [O][C/groups], ux apart */
    const char *u = u_given ? u_given : ws_take(&ws, wino_u_bytes(g, isz, np));
    const int64_t ux = g->o * cg + MT_WINO_SKEW;
    char *v = ws_take(&ws, np * (g->c * pl.tmax + MT_WINO_SKEW) * isz);
    char *m = ws_take(&ws, np * (g->o * pl.tmax + MT_WINO_SKEW) * isz);
    char *scratch_all = ws;
    /* GEMM tasks: np per group, times output-channel blocks when fewer */
    const int64_t nob = o_split(og, np * g->groups, nt), obs = (og + nob - 1) / nob;
    const int par = nt > 1;
    /* a packed plane (or a weight) holds NaN, inf or a magnitude past
     * Winograd's bound: MT_NN_NONFINITE */
    int nonfinite = 0;
    const int bound = mt_wino_bound(dt, g);
    if (par) mt_nn_blas_single_begin();
    #pragma omp parallel num_threads(nt) if (par)
    {
        char *scratch = scratch_all + thread_id() * pl.scratch;
        if (!u_given) {
            #pragma omp for schedule(static) nowait
            for (int64_t o = 0; o < g->o; o++) {
                wino_weights_any(dt, (int)e, w, (char *)u, ux, cg, o);
                if (!mt_all_below(dt, w + o * cg * 9 * isz, cg * 9, bound)) {   /* (in cache) */
                    #pragma omp atomic write
                    nonfinite = 1;
                }
            }
        }
        for (int64_t n0 = 0; n0 < g->n; n0 += nb) {
            const int64_t b = mt_min64(nb, g->n - n0), nrows = b * th;
            /* P is [channel][image][hp][wp] for the batch: the phase-0,
             * stride-1 view of pack_plane pads by (ph, pw) into hp x wp */
            #pragma omp for schedule(static)
            for (int64_t r = 0; r < g->c * b; r++) {
                pack_plane(x, p + r * plane * isz, isz, g, n0 + r % b, r / b, 0, pl.hp, pl.wp);
                /* (the plane is in cache: the check costs no extra pass) */
                if (!mt_all_below(dt, p + r * plane * isz, plane, bound)) {
                    #pragma omp atomic write
                    nonfinite = 1;
                }
            }
            /* (every thread reads it after the loop's barrier, before the
             * next write can happen: they all stop at the same batch) */
            int stop;
            #pragma omp atomic read
            stop = nonfinite;
            if (stop) break;
            for (int64_t r0 = 0; r0 < nrows; r0 += rows) {
                /* the chunk: tile rows r0 .. r1 - 1; row r is row r % th of image r / th.
                 * V[xi] is [C][cnt] and M[xi] [O][cnt], vx and mx elements apart */
                const int64_t nr = mt_min64(rows, nrows - r0), cnt = nr * tw;
                const int64_t vx = g->c * cnt + MT_WINO_SKEW, mx = g->o * cnt + MT_WINO_SKEW;
                #pragma omp for schedule(static)
                for (int64_t task = 0; task < g->c * nr; task++) {
                    const int64_t c = task / nr, r = r0 + task % nr, img = r / th;
                    wino_input_any(dt, (int)e, p + (c * b + img) * plane * isz,
                                   v + (c * cnt + (r - r0) * tw) * isz, vx, r % th, tw, pl.wp, scratch);
                }
                #pragma omp for schedule(dynamic, 1)
                for (int64_t task = 0; task < np * g->groups * nob; task++) {
                    const int64_t ob = task % nob, gi = (task / nob) % g->groups, xi = task / (nob * g->groups);
                    const int64_t o0 = gi * og + ob * obs, orows = mt_min64(obs, og - ob * obs);
                    gemm(dt, 0, orows, cnt, cg, u + (xi * ux + o0 * cg) * isz, cg,
                         v + (xi * vx + gi * cg * cnt) * isz, cnt, 0, m + (xi * mx + o0 * cnt) * isz, cnt);
                }
                #pragma omp for schedule(static)
                for (int64_t task = 0; task < g->o * nr; task++) {
                    const int64_t o = task / nr, r = r0 + task % nr, img = r / th;
                    wino_output_any(dt, (int)e, m + (o * cnt + (r - r0) * tw) * isz, mx,
                                    y + ((n0 + img) * g->o + o) * ohw * isz, bias, o, r % th, tw, scratch, g);
                }
            }
        }
    }
    if (par) mt_nn_blas_single_end();
    return nonfinite ? MT_NN_NONFINITE : 0;
}

/* ----------------------------------------------------------------- public */

int64_t mt_conv2d_workspace(int dtype, const mt_conv2d_geom *g, int algo, int nthreads) {
    const int64_t isz = dtype == MT_FLOAT32 ? 4 : 8;
    if (g->n == 0 || g->o == 0 || g->c == 0) return 0;
    if (algo == MT_CONV_AUTO) algo = mt_conv2d_pick_algo(g);
    if (algo == MT_CONV_SHIFTED) {
        shifted_plan pl;
        plan_shifted(g, isz, nthreads, &pl);
        return ws_report(pl.bytes);
    }
    if (algo == MT_CONV_IM2COL) {
        im2col_plan pl;
        plan_im2col(g, isz, nthreads, &pl);
        return ws_report(pl.bytes);
    }
    if (algo == MT_CONV_WINOGRAD || algo == MT_CONV_WINOGRAD4) {
        wino_plan pl;
        plan_wino(g, isz, wino_edge(algo), nthreads, 1, &pl);
        return ws_report(pl.bytes);
    }
    if (algo == MT_CONV_DIRECT) {
        direct_plan pl;
        plan_direct(g, isz, nthreads, direct_layout(), 1, &pl);
        return ws_report(pl.bytes);
    }
    if (algo == MT_CONV_BLOCKED) {
        blk_plan pl;
        plan_blk(g, isz, nthreads, blk_layout(), 1, &pl);
        return ws_report(pl.bytes);
    }
    if (algo == MT_CONV_DEPTHWISE) {
        dw_plan pl;
        plan_dw(g, isz, &pl);
        return pl.packed ? ws_report(ws_add(ws_add(ws_mul(nthreads, pl.bytes_one), pl.map_bytes), pl.off_bytes)) : 0;
    }
    return 0;
}

int mt_conv2d(int dtype, const void *x, const void *weight, const void *bias, void *y,
              const mt_conv2d_geom *g, int algo, int nthreads, void *workspace) {
    if (g->n == 0 || g->o == 0) return 0;
    if (g->c == 0) {  /* no input channels: the output is the bias */
        if (dtype == MT_FLOAT32) fill_bias_f32((float *)y, (const float *)bias, g->n, g->o, g->oh * g->ow, nthreads);
        else fill_bias_f64((double *)y, (const double *)bias, g->n, g->o, g->oh * g->ow, nthreads);
        if (dtype == MT_FLOAT32) epilogue_f32((float *)y, g->n * g->o * g->oh * g->ow, g);
        else epilogue_f64((double *)y, g->n * g->o * g->oh * g->ow, g);
        return 0;
    }
    if (algo == MT_CONV_AUTO) algo = mt_conv2d_pick_algo(g);
    switch (algo) {
    case MT_CONV_GEMM1X1: return conv_gemm1x1(dtype, x, weight, bias, y, g, nthreads);
    case MT_CONV_SHIFTED: return conv_shifted(dtype, x, weight, bias, y, g, nthreads, workspace);
    case MT_CONV_WINOGRAD:
    case MT_CONV_WINOGRAD4:
        return conv_winograd(dtype, wino_edge(algo), x, weight, NULL, bias, y, g, nthreads, workspace);
    case MT_CONV_DIRECT:
        if (dtype == MT_FLOAT32) direct_f32(x, weight, NULL, direct_layout(), bias, y, g, nthreads, workspace);
        else direct_f64(x, weight, NULL, direct_layout(), bias, y, g, nthreads, workspace);
        return 0;
    case MT_CONV_BLOCKED:
        if (dtype == MT_FLOAT32) blocked_f32(x, weight, NULL, blk_layout(), bias, y, g, nthreads, workspace);
        else blocked_f64(x, weight, NULL, blk_layout(), bias, y, g, nthreads, workspace);
        return 0;
    case MT_CONV_DEPTHWISE:
        if (dtype == MT_FLOAT32) depthwise_f32(x, weight, bias, y, g, nthreads, workspace);
        else depthwise_f64(x, weight, bias, y, g, nthreads, workspace);
        return 0;
    default: return conv_im2col(dtype, x, weight, bias, y, g, nthreads, workspace);
    }
}

/* Weights packed once for the algorithms that rearrange them (the caller
 * caches the packed copy): WINOGRAD / WINOGRAD4's U, DIRECT's and BLOCKED's
 * blocks of output channels. */
int mt_conv2d_packs_weights(int algo) {
    return algo == MT_CONV_WINOGRAD || algo == MT_CONV_WINOGRAD4 || algo == MT_CONV_DIRECT
        || algo == MT_CONV_BLOCKED;
}

int mt_conv2d_packed_layout(int algo) {
    return algo == MT_CONV_DIRECT ? direct_layout() : algo == MT_CONV_BLOCKED ? blk_layout() : 0;
}

int64_t mt_conv2d_packed_bytes(int dtype, const mt_conv2d_geom *g, int algo, int layout) {
    const int64_t isz = dtype == MT_FLOAT32 ? 4 : 8;
    if (algo == MT_CONV_DIRECT) {
        direct_plan pl;
        plan_direct(g, isz, 1, layout, 1, &pl);
        return ws_report(pl.wpk_bytes);
    }
    if (algo == MT_CONV_BLOCKED) {
        blk_plan pl;
        plan_blk(g, isz, 1, layout, 1, &pl);
        return ws_report(pl.wpk_bytes);
    }
    const int e = wino_edge(algo);
    return ws_report(wino_u_bytes(g, isz, (e + 2) * (e + 2)));
}

void mt_conv2d_pack_weights(int dtype, const void *weight, void *packed, const mt_conv2d_geom *g, int algo,
                            int layout, int nthreads) {
    if (g->o == 0 || g->c == 0) return;
    if (algo != MT_CONV_DIRECT && algo != MT_CONV_BLOCKED) {
        wino_transform(dtype, wino_edge(algo), weight, packed, g, nthreads);
        return;
    }
    /* block rows: DIRECT's layout is them; BLOCKED's is its vector bytes, two vectors a block */
    const int64_t obk = algo == MT_CONV_DIRECT ? layout : 2 * layout / (dtype == MT_FLOAT32 ? 4 : 8);
    if (dtype == MT_FLOAT32) pack_blocks_f32(weight, packed, g, obk, nthreads);
    else pack_blocks_f64(weight, packed, g, obk, nthreads);
}

int64_t mt_conv2d_packed_workspace(int dtype, const mt_conv2d_geom *g, int algo, int layout, int nthreads) {
    if (g->n == 0 || g->o == 0 || g->c == 0) return 0;
    const int64_t isz = dtype == MT_FLOAT32 ? 4 : 8;
    if (algo == MT_CONV_DIRECT) {
        direct_plan pl;
        plan_direct(g, isz, nthreads, layout, 0, &pl);
        return ws_report(pl.bytes);
    }
    if (algo == MT_CONV_BLOCKED) {
        blk_plan pl;
        plan_blk(g, isz, nthreads, layout, 0, &pl);
        return ws_report(pl.bytes);
    }
    wino_plan pl;
    plan_wino(g, isz, wino_edge(algo), nthreads, 0, &pl);
    return ws_report(pl.bytes);
}

int mt_conv2d_packed(int dtype, const void *x, const void *packed, const void *bias, void *y,
                     const mt_conv2d_geom *g, int algo, int layout, int nthreads, void *workspace) {
    if (g->n == 0 || g->o == 0 || g->c == 0) return mt_conv2d(dtype, x, NULL, bias, y, g, algo, nthreads, workspace);
    if (algo == MT_CONV_BLOCKED) {
        if (dtype == MT_FLOAT32) blocked_f32(x, NULL, packed, layout, bias, y, g, nthreads, workspace);
        else blocked_f64(x, NULL, packed, layout, bias, y, g, nthreads, workspace);
        return 0;
    }
    if (algo != MT_CONV_DIRECT)
        return conv_winograd(dtype, wino_edge(algo), x, NULL, packed, bias, y, g, nthreads, workspace);
    if (dtype == MT_FLOAT32) direct_f32(x, NULL, packed, layout, bias, y, g, nthreads, workspace);
    else direct_f64(x, NULL, packed, layout, bias, y, g, nthreads, workspace);
    return 0;
}

/* One (image, group) of conv_transpose2d: bias, then for each tile of input
 * pixels col = W_g^T x_g (GEMM) and col2im into the group's output planes. */
static void transpose_item(int dt, const char *x, const char *w, const char *bias, char *y,
                           const mt_conv2d_geom *g, int64_t n, int64_t gi, char *col, int64_t cols) {
    const int64_t isz = dt == MT_FLOAT32 ? 4 : 8, hw = g->h * g->w, ohw = g->oh * g->ow;
    const int64_t cg = g->c / g->groups, og = g->o / g->groups, m = og * g->kh * g->kw;
    char *yg = y + (n * g->o + gi * og) * ohw * isz;
    const char *bg = bias ? bias + gi * og * isz : NULL;
    if (dt == MT_FLOAT32) fill_bias_f32((float *)yg, (const float *)bg, 1, og, ohw, 1);
    else fill_bias_f64((double *)yg, (const double *)bg, 1, og, ohw, 1);
    for (int64_t p0 = 0; p0 < hw; p0 += cols) {
        const int64_t cnt = mt_min64(cols, hw - p0);
        gemm(dt, 1, m, cnt, cg, w + gi * cg * m * isz, m, x + ((n * g->c + gi * cg) * hw + p0) * isz, hw,
             0, col, cols);
        if (dt == MT_FLOAT32) col2im_f32((const float *)col, cols, p0, cnt, (float *)yg, og, g);
        else col2im_f64((const double *)col, cols, p0, cnt, (double *)yg, og, g);
    }
}

/* conv_transpose2d's work items: (image, group) pairs, since the tiles of one
 * pair add into overlapping outputs; in parallel when there are enough. */
static int transpose_threads(const mt_conv2d_geom *g, int nthreads) {
    return nthreads > 1 && g->n * g->groups >= nthreads ? nthreads : 1;
}

static int64_t transpose_cols(const mt_conv2d_geom *g, int64_t isz) {
    const int64_t m = (g->o / g->groups) * g->kh * g->kw;
    return tile_cols(m, isz, 64, 1 << 20, g->h * g->w);
}

int64_t mt_conv_transpose2d_workspace(int dtype, const mt_conv2d_geom *g, int nthreads) {
    const int64_t isz = dtype == MT_FLOAT32 ? 4 : 8, m = (g->o / g->groups) * g->kh * g->kw;
    if (g->n == 0 || g->o == 0) return 0;
    return ws_report(ws_round(ws_mul4(transpose_threads(g, nthreads), m, transpose_cols(g, isz), isz)));
}

int mt_conv_transpose2d(int dtype, const void *x, const void *weight, const void *bias, void *y,
                        const mt_conv2d_geom *g, int nthreads, void *workspace) {
    const int64_t isz = dtype == MT_FLOAT32 ? 4 : 8;
    const int64_t m = (g->o / g->groups) * g->kh * g->kw, items = g->n * g->groups;
    if (g->n == 0 || g->o == 0) return 0;
    const int64_t cols = transpose_cols(g, isz);
    const int nt = transpose_threads(g, nthreads), par = nt > 1;
    char *colbuf = workspace;
    if (par) mt_nn_blas_single_begin();
    #pragma omp parallel for num_threads(nt) schedule(dynamic, 1) if (par)
    for (int64_t it = 0; it < items; it++)
        transpose_item(dtype, x, weight, bias, y, g, it / g->groups, it % g->groups,
                       colbuf + thread_id() * m * cols * isz, cols);
    if (par) mt_nn_blas_single_end();
    return 0;
}

#else /* ------------------------------------------- MT_NN_TEMPLATE: T, SFX */

#define FN(name) MT_CAT(name, SFX)

/* a fused conv2d's epilogue on n outputs just written (with the bias):
 * the residual added, then the activation (act.c) */
static inline void FN(epilogue)(T *d, int64_t n, const mt_conv2d_geom *g) {
    if (g->has_res) {
        const T *r = (const T *)((const char *)d + g->res_delta);
        for (int64_t i = 0; i < n; i++) d[i] += r[i];
    }
    if (g->act) MT_CAT(mt_act, SFX)(d, n, g->act);
}

/* y[n][o][:] = bias[o] (0 without bias) */
static void FN(fill_bias)(T *y, const T *bias, int64_t n, int64_t o, int64_t count, int nt) {
    #pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1 && n * o * count >= MT_NN_GRAIN)
    for (int64_t r = 0; r < n * o; r++) {
        const T v = bias ? bias[r % o] : (T)0;
        T *d = y + r * count;
        for (int64_t i = 0; i < count; i++) d[i] = v;
    }
}

/* y[r][0..cnt) += bias[r] for rows r < rows, ld elements apart */
static void FN(bias_rows)(T *y, int64_t ld, int64_t rows, int64_t cnt, const T *bias) {
    for (int64_t r = 0; r < rows; r++) {
        const T v = bias[r];
        T *d = y + r * ld;
        for (int64_t i = 0; i < cnt; i++) d[i] += v;
    }
}

/* y[r][0..cnt) = bias[r] for rows r < rows, ld elements apart */
static void FN(fill_rows)(T *y, int64_t ld, int64_t rows, int64_t cnt, const T *bias) {
    for (int64_t r = 0; r < rows; r++) {
        const T v = bias[r];
        T *d = y + r * ld;
        for (int64_t i = 0; i < cnt; i++) d[i] = v;
    }
}

/* SHIFTED: wide columns j0 .. j0 + cols - 1 of ybuf (rows = output channels
 * o0 .. o0 + rows - 1, ldy columns a row; wide column j is image n0 + j /
 * (hq*wq), row (j % (hq*wq)) / wq, column j % wq) go to y with the bias;
 * columns past the output's width or height are dropped. */
static void FN(scatter_wide)(const T *ybuf, int64_t ldy, int64_t j0, int64_t cols, T *y, const T *bias,
                             const mt_conv2d_geom *g, int64_t n0, int64_t o0, int64_t rows, int64_t hq,
                             int64_t wq) {
    const int64_t plane = hq * wq, ohw = g->oh * g->ow;
    for (int64_t r = 0; r < rows; r++) {
        const int64_t o = o0 + r;
        const T bv = bias ? bias[o] : (T)0;
        const T *src = ybuf + r * ldy;
        for (int64_t j = j0, end = j0 + cols; j < end;) {
            const int64_t img = j / plane, rem = j - img * plane, yy = rem / wq, xx = rem - yy * wq;
            const int64_t run = mt_min64(wq - xx, end - j);
            if (yy < g->oh && xx < g->ow) {
                const int64_t len = mt_min64(run, g->ow - xx);
                T *d = y + ((n0 + img) * g->o + o) * ohw + yy * g->ow + xx;
                const T *s = src + (j - j0);
                for (int64_t i = 0; i < len; i++) d[i] = s[i] + bv;
                FN(epilogue)(d, len, g);
            }
            j += run;
        }
    }
}

/* IM2COL columns from the packed copy p ([slot][channel][image][plane],
 * b images, planes of rows wq elements): col[r][t] for r = (c, tap) over
 * group gi's channels (the weights' order) and t over output pixels q0 ..
 * q0 + cnt - 1 of the batch (pixel q is (oy, ox) of image q / (oh*ow)). */
static void FN(im2col_packed)(const T *p, T *col, int64_t ldc, const mt_conv2d_geom *g, const int64_t *tap_slot,
                              const int64_t *tap_shift, int64_t gi, int64_t b, int64_t plane, int64_t wq,
                              int64_t q0, int64_t cnt) {
    const int64_t cg = g->c / g->groups, kk = g->kh * g->kw, ohw = g->oh * g->ow, ow = g->ow;
    const int64_t img0 = q0 / ohw, oy0 = (q0 % ohw) / ow, ox0 = q0 % ow;
    for (int64_t r = 0; r < cg * kk; r++) {
        const int64_t c = gi * cg + r / kk, k = r % kk;
        const T *src = p + (tap_slot[k] * g->c + c) * b * plane + tap_shift[k];
        T *restrict dst = col + r * ldc;
        int64_t img = img0, oy = oy0, ox = ox0;
        for (int64_t t = 0; t < cnt;) {
            const int64_t run = mt_min64(ow - ox, cnt - t);
            const T *restrict s = src + img * plane + oy * wq + ox;
            for (int64_t i = 0; i < run; i++) dst[t + i] = s[i];
            t += run;
            ox = 0;
            if (++oy == g->oh) { oy = 0; img++; }
        }
    }
}

/* IM2COL across images: columns = output pixels q0 .. q0 + cols - 1 over all
 * images, rows = output channels o0 .. o0 + rows - 1; to y with the bias. */
static void FN(scatter_cols)(const T *ybuf, int64_t ldy, int64_t q0, int64_t cols, T *y, const T *bias,
                             const mt_conv2d_geom *g, int64_t o0, int64_t rows) {
    const int64_t ohw = g->oh * g->ow;
    for (int64_t r = 0; r < rows; r++) {
        const int64_t o = o0 + r;
        const T bv = bias ? bias[o] : (T)0;
        for (int64_t q = q0, end = q0 + cols; q < end;) {
            const int64_t n = q / ohw, pix = q % ohw, len = mt_min64(ohw - pix, end - q);
            T *d = y + (n * g->o + o) * ohw + pix;
            const T *s = ybuf + r * ldy + (q - q0);
            for (int64_t i = 0; i < len; i++) d[i] = s[i] + bv;
            FN(epilogue)(d, len, g);
            q += len;
        }
    }
}

/* DEPTHWISE, one output plane: yp = bias + sum over taps of w * shifted xp,
 * one output row at a time (it stays in L1 while the taps accumulate). The
 * general path, for planes too large for DEPTHWISE's packed copy. */
static MT_CLONES void FN(depthwise_plane)(const T *restrict xp, const T *restrict wp, T bv, T *restrict yp,
                                          const mt_conv2d_geom *g) {
    for (int64_t oy = 0; oy < g->oh; oy++) {
        T *restrict yr = yp + oy * g->ow;
        for (int64_t ox = 0; ox < g->ow; ox++) yr[ox] = bv;
        for (int64_t kh = 0; kh < g->kh; kh++) {
            const int64_t iy = oy * g->sh - g->ph + kh * g->dh;
            if (iy < 0 || iy >= g->h) continue;
            const T *restrict xr = xp + iy * g->w;
            for (int64_t kw = 0; kw < g->kw; kw++) {
                const T wv = wp[kh * g->kw + kw];
                const int64_t first = kw * g->dw - g->pw;  /* input column of output column 0 */
                const int64_t lo = mt_clamp64(mt_ceildiv(-first, g->sw), 0, g->ow);
                const int64_t hi = mt_clamp64(mt_floordiv(g->w - 1 - first, g->sw) + 1, lo, g->ow);
                if (g->sw == 1) {
                    for (int64_t ox = lo; ox < hi; ox++) yr[ox] += wv * xr[ox + first];
                } else {
                    const int64_t sw = g->sw;
                    for (int64_t ox = lo; ox < hi; ox++) yr[ox] += wv * xr[ox * sw + first];
                }
            }
        }
        FN(epilogue)(yr, g->ow, g);
    }
}

/* DEPTHWISE over the packed plane pk (dw_plan): the wide outputs
 * yw[j] = bias + sum over taps of w[tap] * pk[j + off[tap]] for j < cnt,
 * then clamped to [0, top] when clamp (ReLU: top = inf; ReLU6: 6). The loop
 * runs in whole vectors of MT_DW_LANES (GCC vector extensions: one AVX-512
 * register, two AVX2 ones), past cnt up to a multiple of the lanes (pk and
 * yw have the slack): a 7x7 plane's 61 wide outputs are 4 vectors where the
 * compiler's own AVX2 loop left a scalar tail of 5 (and of 13 had it used
 * AVX-512). 3x3 kernels
 * (MobileNet's) keep an output's nine products in registers; other sizes
 * accumulate tap by tap. */
typedef T FN(dwv) __attribute__((vector_size(MT_DW_LANES * sizeof(T))));
typedef __typeof__((FN(dwv)){0} < (FN(dwv)){0}) FN(dwm);   /* its lane masks */

static inline FN(dwv) FN(dw_load)(const T *p) {
    FN(dwv) v;
    memcpy(&v, p, sizeof v);
    return v;
}

static MT_VCLONES void FN(dw_wide)(const T *restrict pk, const int64_t *off, const T *restrict wp, T bv,
                                   T *restrict yw, int64_t cnt, int64_t kk, int clamp, T top) {
    const int64_t L = MT_DW_LANES;
    const FN(dwv) zero = {0}, vtop = zero + top;
    if (kk == 9) {
        const T w0 = wp[0], w1 = wp[1], w2 = wp[2], w3 = wp[3], w4 = wp[4], w5 = wp[5];
        const T w6 = wp[6], w7 = wp[7], w8 = wp[8];
        const T *p0 = pk + off[0], *p1 = pk + off[1], *p2 = pk + off[2], *p3 = pk + off[3];
        const T *p4 = pk + off[4], *p5 = pk + off[5], *p6 = pk + off[6], *p7 = pk + off[7];
        const T *p8 = pk + off[8];
        for (int64_t j = 0; j < cnt; j += L) {
            FN(dwv) v = bv + w0 * FN(dw_load)(p0 + j) + w1 * FN(dw_load)(p1 + j) + w2 * FN(dw_load)(p2 + j)
                      + w3 * FN(dw_load)(p3 + j) + w4 * FN(dw_load)(p4 + j) + w5 * FN(dw_load)(p5 + j)
                      + w6 * FN(dw_load)(p6 + j) + w7 * FN(dw_load)(p7 + j) + w8 * FN(dw_load)(p8 + j);
            if (clamp) {   /* as act.c: NaN stays NaN (both comparisons false) */
                v = (FN(dwv))((FN(dwm))v & ~(v < zero));
                const FN(dwm) hi = v > vtop;
                v = (FN(dwv))(((FN(dwm))v & ~hi) | ((FN(dwm))vtop & hi));
            }
            memcpy(yw + j, &v, sizeof v);
        }
        return;
    }
    for (int64_t j = 0; j < cnt; j += L) {
        FN(dwv) v = zero + bv;
        for (int64_t k = 0; k < kk; k++) v += wp[k] * FN(dw_load)(pk + off[k] + j);
        if (clamp) {
            v = (FN(dwv))((FN(dwm))v & ~(v < zero));
            const FN(dwm) hi = v > vtop;
            v = (FN(dwv))(((FN(dwm))v & ~hi) | ((FN(dwm))vtop & hi));
        }
        memcpy(yw + j, &v, sizeof v);
    }
}

/* DEPTHWISE: copies plane xp's inputs into the packed plane pk, whose
 * zero padding was written once (it is the same for every plane). */
static MT_CLONES void FN(dw_pack)(const T *restrict xp, T *restrict pk, const mt_conv2d_geom *g,
                                  const dw_plan *pl) {
    for (int64_t a = 0; a < g->sh; a++) {
        /* rows i of phase a read input row i * sh + a - ph: those in [0, h) */
        const int64_t ilo = mt_clamp64(mt_ceildiv(g->ph - a, g->sh), 0, pl->hq);
        const int64_t ihi = mt_clamp64(mt_floordiv(g->h - 1 + g->ph - a, g->sh) + 1, ilo, pl->hq);
        if (g->sw == 2) {   /* both column phases in one pass over the row (a deinterleave) */
            const int64_t lo0 = mt_clamp64(mt_ceildiv(g->pw, 2), 0, pl->wq);
            const int64_t hi0 = mt_clamp64(mt_floordiv(g->w - 1 + g->pw, 2) + 1, lo0, pl->wq);
            const int64_t lo1 = mt_clamp64(mt_ceildiv(g->pw - 1, 2), 0, pl->wq);
            const int64_t hi1 = mt_clamp64(mt_floordiv(g->w - 2 + g->pw, 2) + 1, lo1, pl->wq);
            const int64_t mlo = mt_max64(lo0, lo1), mhi = mt_max64(mlo, mt_min64(hi0, hi1));
            for (int64_t i = ilo; i < ihi; i++) {
                const T *restrict sp = xp + (i * g->sh + a - g->ph) * g->w - g->pw;   /* sp[c]: padded column c */
                T *restrict d0 = pk + (a * 2) * pl->plane + i * pl->wq, *restrict d1 = d0 + pl->plane;
                for (int64_t t = lo0; t < mlo; t++) d0[t] = sp[2 * t];
                for (int64_t t = lo1; t < mlo; t++) d1[t] = sp[2 * t + 1];
                for (int64_t t = mlo; t < mhi; t++) { d0[t] = sp[2 * t]; d1[t] = sp[2 * t + 1]; }
                for (int64_t t = mhi; t < hi0; t++) d0[t] = sp[2 * t];
                for (int64_t t = mhi; t < hi1; t++) d1[t] = sp[2 * t + 1];
            }
            continue;
        }
        for (int64_t b = 0; b < g->sw; b++) {
            const int64_t first = b - g->pw;   /* input column of phase column 0 */
            const int64_t lo = mt_clamp64(mt_ceildiv(-first, g->sw), 0, pl->wq);
            const int64_t hi = mt_clamp64(mt_floordiv(g->w - 1 - first, g->sw) + 1, lo, pl->wq);
            T *restrict d = pk + (a * g->sw + b) * pl->plane;
            const int64_t sw = g->sw;
            for (int64_t i = ilo; i < ihi; i++) {
                const T *restrict src = xp + (i * g->sh + a - g->ph) * g->w + first;
                T *restrict dr = d + i * pl->wq;
                if (sw == 1) for (int64_t t = lo; t < hi; t++) dr[t] = src[t];
                else for (int64_t t = lo; t < hi; t++) dr[t] = src[t * sw];
            }
        }
    }
}

/* DEPTHWISE: plane xp into the packed plane pk through dw_fill_map's map */
static MT_VCLONES void FN(dw_scatter)(const T *restrict xp, T *restrict pk, const int32_t *restrict map, int64_t hw) {
    for (int64_t k = 0; k < hw; k++) pk[map[k]] = xp[k];
}

/* DEPTHWISE: the wide rows yw (wq apart) to the output plane yp, then the
 * epilogue unless dw_wide already clamped (ReLU and ReLU6 without a
 * residual: MobileNet's). Rows go in whole vectors while the overshoot
 * stays inside the plane (it lands on the next rows, written after), so a
 * 7-wide row is one vector copy, not a call of memcpy or a scalar loop. */
static MT_VCLONES void FN(dw_store)(const T *restrict yw, int64_t wq, T *restrict yp, const mt_conv2d_geom *g,
                                    int clamped) {
    const int64_t ow = g->ow, L = MT_DW_LANES, ohw = g->oh * ow;
    const int64_t span = (ow + L - 1) / L * L;
    for (int64_t oy = 0; oy < g->oh; oy++) {
        const T *s = yw + oy * wq;
        T *d = yp + oy * ow;
        if (oy * ow + span <= ohw) {
            for (int64_t i = 0; i < span; i += L) {
                const FN(dwv) v = FN(dw_load)(s + i);
                memcpy(d + i, &v, sizeof v);
            }
        } else {
            for (int64_t i = 0; i < ow; i++) d[i] = s[i];
        }
    }
    if (!clamped) FN(epilogue)(yp, ohw, g);
}

/* DEPTHWISE: one input channel per group; output channel o reads input
 * channel o / (O / groups). One output plane per task: packed into the
 * thread's scratch (ws, dw_plan) when it fits, else the general path. */
static void FN(depthwise)(const T *x, const T *w, const T *bias, T *y, const mt_conv2d_geom *g, int nt,
                          char *ws) {
    const int64_t planes = g->n * g->o, og = g->o / g->groups, kk = g->kh * g->kw;
    const int64_t hw = g->h * g->w, ohw = g->oh * g->ow;
    dw_plan pl;
    plan_dw(g, sizeof(T), &pl);
    const int par = nt > 1 && planes > 1 && planes * ohw * kk >= MT_NN_GRAIN;
    const int clamp = !g->has_res && (g->act == MT_ACT_RELU || g->act == MT_ACT_RELU6);
    const T top = g->act == MT_ACT_RELU6 ? (T)6 : (T)INFINITY;
    if (!pl.packed) {
        #pragma omp parallel for num_threads(nt) schedule(static) if (par)
        for (int64_t p = 0; p < planes; p++) {
            const int64_t n = p / g->o, o = p % g->o;
            FN(depthwise_plane)(x + (n * g->c + o / og) * hw, w + o * kk, bias ? bias[o] : (T)0, y + p * ohw, g);
        }
        return;
    }
    int64_t *off = (int64_t *)(ws + nt * pl.bytes_one + pl.map_bytes);
    dw_tap_offsets(g, &pl, off);
    const int64_t cnt = (g->oh - 1) * pl.wq + g->ow;   /* wide outputs up to the last real one */
    int32_t *map = pl.map_bytes ? (int32_t *)(ws + nt * pl.bytes_one) : NULL;
    if (map) dw_fill_map(g, &pl, map);
    #pragma omp parallel num_threads(nt) if (par)
    {
        char *mine = ws + thread_id() * pl.bytes_one;
        const int64_t npk = g->sh * g->sw * pl.plane + MT_DW_LANES;   /* with dw_wide's slack */
        T *pk = (T *)mine, *yw = (T *)(mine + ws_round((npk + 1) * (int64_t)sizeof(T)));
        memset(pk, 0, (size_t)npk * sizeof(T));   /* the slack too: no stale NaNs or subnormals */
        #pragma omp for schedule(static)
        for (int64_t p = 0; p < planes; p++) {
            const int64_t n = p / g->o, o = p % g->o;
            if (map) FN(dw_scatter)(x + (n * g->c + o / og) * hw, pk, map, hw);
            else FN(dw_pack)(x + (n * g->c + o / og) * hw, pk, g, &pl);
            FN(dw_wide)(pk, off, w + o * kk, bias ? bias[o] : (T)0, yw, cnt, kk, clamp, top);
            FN(dw_store)(yw, pl.wq, y + p * ohw, g, clamp);
        }
    }
}

/* DIRECT: an image's input channels packed as DEPTHWISE packs a plane
 * (zero-padded, split into the stride's phases, cs elements apart), so
 * that tap t of wide output j of every channel is element j + off[t] of
 * that channel's block. The micro-kernel keeps ob output channels times
 * two vectors of consecutive wide outputs in registers (16 AVX-512 or 12
 * AVX2 accumulators) and, for each input channel and tap, loads two input
 * vectors and multiply-adds them with ob broadcast weights: 2 loads and ob
 * broadcasts per 2 * ob vector FMAs, with no im2col copy. It writes the
 * wide outputs [p0, p1) (rounded up to whole vector pairs) of output
 * channel o at yw + o * ys; wb is the block's weights packed
 * [cg][kk][ob] (FN(direct_weights)), so the broadcasts of a tap share a
 * cache line. */
#define MT_DIRECT_KERNEL(NAME, VB, OBK, ATTR)                                  \
static ATTR void NAME(const T *restrict pk, int64_t cs, const int64_t *restrict off, int64_t kk, \
                      int64_t cg, const T *restrict wb, T *restrict yw, int64_t ys, int64_t p0, int64_t p1) { \
    typedef T vec __attribute__((vector_size(VB), aligned(sizeof(T))));      \
    const int64_t vl = VB / (int64_t)sizeof(T);                                \
    for (int64_t p = p0; p < p1; p += 2 * vl) {                                \
        vec a0[OBK], a1[OBK];                                                  \
        for (int o = 0; o < OBK; o++) { a0[o] = (vec){0}; a1[o] = (vec){0}; }  \
        const T *w = wb;                                                       \
        for (int64_t c = 0; c < cg; c++) {                                     \
            const T *b = pk + c * cs + p;                                      \
            for (int64_t t = 0; t < kk; t++, w += OBK) {                       \
                const vec x0 = *(const vec *)(b + off[t]), x1 = *(const vec *)(b + off[t] + vl); \
                for (int o = 0; o < OBK; o++) {                                \
                    const T s = w[o];                                          \
                    a0[o] += s * x0;                                           \
                    a1[o] += s * x1;                                           \
                }                                                              \
            }                                                                  \
        }                                                                      \
        for (int o = 0; o < OBK; o++) {                                        \
            *(vec *)(yw + o * ys + p) = a0[o];                                 \
            *(vec *)(yw + o * ys + p + vl) = a1[o];                            \
        }                                                                      \
    }                                                                          \
}
MT_DIRECT_KERNEL(FN(direct_wide), 64, MT_DIRECT_OB_WIDE, MT_DIRECT_WIDE_ATTR)
MT_DIRECT_KERNEL(FN(direct_narrow), 32, MT_DIRECT_OB_NARROW, MT_CLONES)
#undef MT_DIRECT_KERNEL

/* DIRECT: the weights of output channels o0 .. o0 + rows - 1 (w: [O][cg][kk])
 * packed [cg][kk][obk] for the micro-kernel, zero past the last row. */
static void FN(direct_weights)(const T *restrict w, T *restrict wb, int64_t o0, int64_t rows, int64_t obk,
                               int64_t cgkk) {
    for (int64_t i = 0; i < cgkk; i++)
        for (int64_t o = 0; o < obk; o++) wb[i * obk + o] = o < rows ? w[(o0 + o) * cgkk + i] : (T)0;
}

/* DIRECT and BLOCKED: all the weights packed [group][block][cg][kk][obk]
 * for a micro-kernel of obk output channels, a block after another (each
 * group's last one zero-padded), a task per block. */
static void FN(pack_blocks)(const T *w, T *wpk, const mt_conv2d_geom *g, int64_t obk, int nt) {
    const int64_t cg = g->c / g->groups, og = g->o / g->groups, kk = g->kh * g->kw;
    const int64_t nob = (og + obk - 1) / obk;
    #pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
    for (int64_t blk = 0; blk < g->groups * nob; blk++) {
        const int64_t gi = blk / nob, ob = blk % nob;
        FN(direct_weights)(w, wpk + blk * obk * cg * kk, gi * og + ob * obk, mt_min64(obk, og - ob * obk),
                           obk, cg * kk);
    }
}

/* DIRECT: the real outputs among wide outputs [p0, p1) of one output
 * channel (yw, rows of wq) into its plane yp, plus the bias bv and the
 * epilogue. */
static void FN(direct_store)(const T *restrict yw, int64_t p0, int64_t p1, int64_t wq, T *restrict yp, T bv,
                             const mt_conv2d_geom *g) {
    for (int64_t oy = p0 / wq; oy < g->oh && oy * wq < p1; oy++) {
        const int64_t lo = mt_max64(p0 - oy * wq, 0), hi = mt_min64(p1 - oy * wq, g->ow);
        if (lo >= hi) continue;
        T *restrict d = yp + oy * g->ow;
        const T *restrict s = yw + oy * wq;
        for (int64_t j = lo; j < hi; j++) d[j] = s[j] + bv;
        FN(epilogue)(d + lo, hi - lo, g);
    }
}

/* DIRECT over the batch: per image, the channels packed (a task per
 * channel), then tasks of (group, block of output channels, range of wide
 * outputs), the ranges split only as far as the threads need work. The
 * weights come packed for the kernel of block layout (wpk_given), or are
 * packed from w into the workspace first. */
static void FN(direct)(const T *x, const T *w, const T *wpk_given, int layout, const T *bias, T *y,
                       const mt_conv2d_geom *g, int nt, char *ws) {
    const int64_t cg = g->c / g->groups, og = g->o / g->groups, kk = g->kh * g->kw;
    const int64_t hw = g->h * g->w, ohw = g->oh * g->ow;
    direct_plan pl;
    plan_direct(g, sizeof(T), nt, layout, wpk_given == NULL, &pl);
    /* the workspace: packed input, the threads' rows, own weights, tap offsets */
    int64_t *off = (int64_t *)(ws + pl.bytes - tap_offset_bytes(g));
    dw_tap_offsets(g, &pl.dw, off);
    const int wide = pl.wide;
    const int64_t obk = layout;
    const int64_t nob = (og + obk - 1) / obk, tasks = g->groups * nob * pl.nchunk;
    T *pk = (T *)ws;
    const T *wpk = wpk_given;
    if (!wpk) {
        T *own = (T *)(ws + pl.pk_bytes + nt * pl.yw_bytes);
        FN(pack_blocks)(w, own, g, obk, nt);
        wpk = own;
    }
    memset(pk, 0, (size_t)(g->c * pl.cs) * sizeof(T));   /* the padding, once: packs write the rest */
    const int par = nt > 1;
    #pragma omp parallel num_threads(nt) if (par)
    {
        T *yw = (T *)(ws + pl.pk_bytes + thread_id() * pl.yw_bytes);
        for (int64_t n = 0; n < g->n; n++) {
            #pragma omp for schedule(static)
            for (int64_t c = 0; c < g->c; c++) FN(dw_pack)(x + (n * g->c + c) * hw, pk + c * pl.cs, g, &pl.dw);
            #pragma omp for schedule(dynamic, 1)
            for (int64_t task = 0; task < tasks; task++) {
                /* output-channel blocks vary fastest: a range's input stays in cache */
                const int64_t ob = task % nob, ch = (task / nob) % pl.nchunk, gi = task / (pl.nchunk * nob);
                const int64_t o0 = gi * og + ob * obk, orows = mt_min64(obk, og - ob * obk);
                const int64_t p0 = ch * pl.chunk, p1 = mt_min64(pl.cnt, p0 + pl.chunk);
                const T *wb = wpk + (gi * nob + ob) * obk * cg * kk;
                if (wide) FN(direct_wide)(pk + gi * cg * pl.cs, pl.cs, off, kk, cg, wb, yw, pl.ys, p0, p1);
                else FN(direct_narrow)(pk + gi * cg * pl.cs, pl.cs, off, kk, cg, wb, yw, pl.ys, p0, p1);
                for (int64_t o = 0; o < orows; o++)
                    FN(direct_store)(yw + o * pl.ys, p0, p1, pl.dw.wq, y + (n * g->o + o0 + o) * ohw,
                                     bias ? bias[o0 + o] : (T)0, g);
            }
        }
    }
}

/* BLOCKED: direct multiply-adds vectorised over output channels. The input
 * image is copied zero-padded ([C][hp][wp], pl.cs apart); the weights are
 * packed [group][block][cg][kk][OCB] (FN(pack_blocks)). A micro-kernel call
 * keeps R consecutive output pixels of one row times the block's two
 * vectors of output channels in registers and, for each input channel and
 * tap, loads the two weight vectors and broadcasts R input values (R
 * loads, 2R FMAs): no pixel is computed that is not an output, and the
 * only copies are the padded input and the transposition of the finished
 * row into NCHW. x: the input under pixel 0 of the segment at tap (0, 0);
 * toff[t]: tap t's offset; pixels s apart (SW: a compile-time stride, 0
 * for s); tile: [R][OCB] out. */
/* (the accumulators are named variables, not arrays: GCC 12 shuffles
 * arrays of vectors between registers on every pass of the nested loops,
 * 13 moves for 14 FMAs measured in the assembly) */
#define MT_BLK_ACC(r, R) vec a0_##r = (vec){0}, a1_##r = (vec){0};
#define MT_BLK_STEP(r, R) if (R > r) { const T b = xt[r * st]; a0_##r += b * w0; a1_##r += b * w1; }
#define MT_BLK_OUT(r, R)                                                      \
    if (R > r) { *(vec *)(tile + r * 2 * vl) = a0_##r; *(vec *)(tile + r * 2 * vl + vl) = a1_##r; }
#define MT_BLK_ALL(M, R) M(0, R) M(1, R) M(2, R) M(3, R) M(4, R) M(5, R) M(6, R) M(7, R) M(8, R) \
    M(9, R) M(10, R) M(11, R)
#define MT_BLK_KERNEL(NAME, VB, R, SW, ATTR)                                   \
static ATTR void NAME(const T *restrict x, int64_t cs, const int64_t *restrict toff, int64_t kk, \
                      int64_t cg, const T *restrict wb, T *restrict tile, int64_t s) { \
    typedef T vec __attribute__((vector_size(VB), aligned(sizeof(T))));      \
    const int64_t vl = VB / (int64_t)sizeof(T), st = SW ? SW : s;             \
    MT_BLK_ALL(MT_BLK_ACC, R)                                                 \
    for (int64_t c = 0; c < cg; c++) {                                        \
        const T *xc = x + c * cs;                                             \
        for (int64_t t = 0; t < kk; t++, wb += 2 * vl) {                      \
            const vec w0 = *(const vec *)wb, w1 = *(const vec *)(wb + vl);   \
            const T *xt = xc + toff[t];                                       \
            MT_BLK_ALL(MT_BLK_STEP, R)                                        \
        }                                                                     \
    }                                                                         \
    MT_BLK_ALL(MT_BLK_OUT, R)                                                 \
}
#define MT_BLK_SET6(TAG, VB, SW, ATTR)                                        \
    MT_BLK_KERNEL(FN(TAG##_1), VB, 1, SW, ATTR) MT_BLK_KERNEL(FN(TAG##_2), VB, 2, SW, ATTR) \
    MT_BLK_KERNEL(FN(TAG##_3), VB, 3, SW, ATTR) MT_BLK_KERNEL(FN(TAG##_4), VB, 4, SW, ATTR) \
    MT_BLK_KERNEL(FN(TAG##_5), VB, 5, SW, ATTR) MT_BLK_KERNEL(FN(TAG##_6), VB, 6, SW, ATTR)
#define MT_BLK_SET12(TAG, VB, SW, ATTR) MT_BLK_SET6(TAG, VB, SW, ATTR)        \
    MT_BLK_KERNEL(FN(TAG##_7), VB, 7, SW, ATTR) MT_BLK_KERNEL(FN(TAG##_8), VB, 8, SW, ATTR) \
    MT_BLK_KERNEL(FN(TAG##_9), VB, 9, SW, ATTR) MT_BLK_KERNEL(FN(TAG##_10), VB, 10, SW, ATTR) \
    MT_BLK_KERNEL(FN(TAG##_11), VB, 11, SW, ATTR) MT_BLK_KERNEL(FN(TAG##_12), VB, 12, SW, ATTR)
MT_BLK_SET12(blk_w1, 64, 1, MT_DIRECT_WIDE_ATTR)
MT_BLK_SET12(blk_w2, 64, 2, MT_DIRECT_WIDE_ATTR)
MT_BLK_SET12(blk_ws, 64, 0, MT_DIRECT_WIDE_ATTR)
MT_BLK_SET6(blk_n1, 32, 1, MT_CLONES)
MT_BLK_SET6(blk_n2, 32, 2, MT_CLONES)
MT_BLK_SET6(blk_ns, 32, 0, MT_CLONES)
#undef MT_BLK_SET12
#undef MT_BLK_SET6
#undef MT_BLK_KERNEL
#undef MT_BLK_ALL
#undef MT_BLK_OUT
#undef MT_BLK_STEP
#undef MT_BLK_ACC

typedef void (*FN(blk_fn))(const T *restrict, int64_t, const int64_t *restrict, int64_t, int64_t,
                           const T *restrict, T *restrict, int64_t);
#define MT_BLK_TABLE6(TAG) FN(TAG##_1), FN(TAG##_2), FN(TAG##_3), FN(TAG##_4), FN(TAG##_5), FN(TAG##_6)
#define MT_BLK_TABLE12(TAG) MT_BLK_TABLE6(TAG), FN(TAG##_7), FN(TAG##_8), FN(TAG##_9), FN(TAG##_10), \
    FN(TAG##_11), FN(TAG##_12)
/* [wide][stride 1, 2, other][R - 1] */
static const FN(blk_fn) FN(blk_kernels)[2][3][MT_BLK_R_WIDE] = {
    {{MT_BLK_TABLE6(blk_n1)}, {MT_BLK_TABLE6(blk_n2)}, {MT_BLK_TABLE6(blk_ns)}},
    {{MT_BLK_TABLE12(blk_w1)}, {MT_BLK_TABLE12(blk_w2)}, {MT_BLK_TABLE12(blk_ws)}},
};
#undef MT_BLK_TABLE12
#undef MT_BLK_TABLE6

/* BLOCKED: channel c of one image into its padded plane (the padding is
 * zero already) */
static void FN(blk_pad)(const T *restrict x, T *restrict xp, const mt_conv2d_geom *g, int64_t wp) {
    for (int64_t r = 0; r < g->h; r++)
        memcpy(xp + (r + g->ph) * wp + g->pw, x + r * g->w, (size_t)g->w * sizeof(T));
}

/* BLOCKED: one output row of one block (the row's segments through the
 * micro-kernel into the thread's row tile [ow][ocb]), then the row into
 * each of the block's output planes, plus the bias and the epilogue. */
static void FN(blk_row)(const T *xg, const T *wb, const T *bias, T *y, int64_t oy, int64_t o0, int64_t rows,
                        const int64_t *toff, T *tile, const mt_conv2d_geom *g, const blk_plan *pl) {
    const int64_t cg = g->c / g->groups, kk = g->kh * g->kw;
    const int si = g->sw == 1 ? 0 : g->sw == 2 ? 1 : 2;
    const T *xrow = xg + oy * g->sh * pl->wp;
    int64_t ox = 0;
    for (int64_t sg = 0; sg < pl->nseg; sg++) {
        const int64_t r = pl->seg + (sg < pl->extra);
        FN(blk_kernels)[pl->wide][si][r - 1](xrow + ox * g->sw, pl->cs, toff, kk, cg, wb, tile + ox * pl->ocb,
                                             g->sw);
        ox += r;
    }
    const int64_t ohw = g->oh * g->ow;
    for (int64_t j = 0; j < rows; j++) {
        T *restrict d = y + (o0 + j) * ohw + oy * g->ow;
        const T bv = bias ? bias[o0 + j] : (T)0;
        for (int64_t p = 0; p < g->ow; p++) d[p] = tile[p * pl->ocb + j] + bv;
        FN(epilogue)(d, g->ow, g);
    }
}

/* BLOCKED over the batch: per image, the channels padded (a task per
 * channel; without padding the image is read in place), then tasks of
 * (group, block, output row), in the order of plan_blk's rows_outer. The
 * weights come packed for layout (wpk_given), or are packed from w into the
 * workspace first. */
static void FN(blocked)(const T *x, const T *w, const T *wpk_given, int layout, const T *bias, T *y,
                        const mt_conv2d_geom *g, int nt, char *ws) {
    const int64_t cg = g->c / g->groups, kk = g->kh * g->kw, hw = g->h * g->w;
    blk_plan pl;
    plan_blk(g, sizeof(T), nt, layout, wpk_given == NULL, &pl);
    /* the workspace: padded input, the threads' row tiles, own weights, tap offsets */
    int64_t *toff = (int64_t *)(ws + pl.bytes - tap_offset_bytes(g));
    for (int64_t t = 0; t < kk; t++) toff[t] = (t / g->kw) * g->dh * pl.wp + (t % g->kw) * g->dw;
    T *xp = (T *)ws;
    const T *wpk = wpk_given;
    if (!wpk) {
        T *own = (T *)(ws + pl.xp_bytes + nt * pl.row_bytes);
        FN(pack_blocks)(w, own, g, pl.ocb, nt);
        wpk = own;
    }
    const int padded = g->ph || g->pw;
    if (padded) memset(xp, 0, (size_t)(g->c * pl.cs) * sizeof(T));   /* the padding, once */
    const int64_t nob = pl.nob, blocks = g->groups * nob, tasks = blocks * g->oh;
    const int par = nt > 1;
    #pragma omp parallel num_threads(nt) if (par)
    {
        T *tile = (T *)(ws + pl.xp_bytes + thread_id() * pl.row_bytes);
        for (int64_t n = 0; n < g->n; n++) {
            if (padded) {
                #pragma omp for schedule(static)
                for (int64_t c = 0; c < g->c; c++) FN(blk_pad)(x + (n * g->c + c) * hw, xp + c * pl.cs, g, pl.wp);
            }
            const T *img = padded ? xp : x + n * g->c * hw;
            #pragma omp for schedule(static)
            for (int64_t task = 0; task < tasks; task++) {
                const int64_t blk = pl.rows_outer ? task % blocks : task / g->oh;
                const int64_t oy = pl.rows_outer ? task / blocks : task % g->oh;
                const int64_t gi = blk / nob, ob = blk % nob;
                FN(blk_row)(img + gi * cg * pl.cs, wpk + blk * cg * kk * pl.ocb, bias, y + n * g->o * g->oh * g->ow,
                            oy, gi * (g->o / g->groups) + ob * pl.ocb,
                            mt_min64(pl.ocb, g->o / g->groups - ob * pl.ocb), toff, tile, g, &pl);
            }
        }
    }
}

/* WINOGRAD weights of output channel o: u[xi * ux + o * cg + c] =
 * (G g G^T)[xi] for each 3x3 kernel g = w[o][c],
 * G = [1 0 0; 1/2 1/2 1/2; 1/2 -1/2 1/2; 0 0 1]. Blocks of channels at a
 * time, transposed first (kt[j][c] = g[j]), so that every loop runs over
 * contiguous c and each of the 16 planes of u gets whole cache lines (16
 * scattered stores a kernel thrash the cache sets). */
static MT_CLONES void FN(wino_weights)(const T *w, T *u, int64_t ux, int64_t cg, int64_t o) {
    T kt[9][MT_WINO_CBLK], gg[3][MT_WINO_CBLK];
    for (int64_t c0 = 0; c0 < cg; c0 += MT_WINO_CBLK) {
        const int64_t nc = mt_min64(MT_WINO_CBLK, cg - c0);
        const T *k = w + (o * cg + c0) * 9;
        for (int64_t c = 0; c < nc; c++)
            for (int j = 0; j < 9; j++) kt[j][c] = k[c * 9 + j];
        for (int i = 0; i < 4; i++) {   /* row i of G g: gg[j] = (G g)[i][j] */
            for (int j = 0; j < 3; j++) {
                const T *restrict k0 = kt[j], *restrict k1 = kt[3 + j], *restrict k2 = kt[6 + j];
                T *restrict d = gg[j];
                if (i == 0) for (int64_t c = 0; c < nc; c++) d[c] = k0[c];
                else if (i == 1) for (int64_t c = 0; c < nc; c++) d[c] = (k0[c] + k1[c] + k2[c]) * (T)0.5;
                else if (i == 2) for (int64_t c = 0; c < nc; c++) d[c] = (k0[c] - k1[c] + k2[c]) * (T)0.5;
                else for (int64_t c = 0; c < nc; c++) d[c] = k2[c];
            }
            T *restrict d0 = u + (i * 4) * ux + o * cg + c0, *restrict d1 = d0 + ux;
            T *restrict d2 = d1 + ux, *restrict d3 = d2 + ux;
            for (int64_t c = 0; c < nc; c++) {   /* (G g) G^T, row i */
                const T a0 = gg[0][c], a1 = gg[1][c], a2 = gg[2][c];
                d0[c] = a0;
                d1[c] = (a0 + a1 + a2) * (T)0.5;
                d2[c] = (a0 - a1 + a2) * (T)0.5;
                d3[c] = a2;
            }
        }
    }
}

/* WINOGRAD input, one row of tiles: v[xi * ldx + tx] = (B^T d B)[xi] for the
 * 4x4 patch d at columns 2tx .. 2tx + 3 of rows r0..r3;
 * B^T = [1 0 -1 0; 0 1 1 0; 0 -1 1 0; 0 1 0 -1]. */
static MT_CLONES void FN(wino_input_row)(const T *restrict r0, const T *restrict r1, const T *restrict r2,
                                         const T *restrict r3, T *restrict v, int64_t ldx, int64_t tw) {
    MT_IVDEP
    for (int64_t tx = 0; tx < tw; tx++) {
        const T *a = r0 + 2 * tx, *b = r1 + 2 * tx, *c = r2 + 2 * tx, *d = r3 + 2 * tx;
        T t0[4], t1[4], t2[4], t3[4];  /* B^T d: rows combined */
        for (int j = 0; j < 4; j++) {
            t0[j] = a[j] - c[j];
            t1[j] = b[j] + c[j];
            t2[j] = c[j] - b[j];
            t3[j] = b[j] - d[j];
        }
        /* (B^T d) B: columns combined */
        v[0 * ldx + tx] = t0[0] - t0[2]; v[1 * ldx + tx] = t0[1] + t0[2];
        v[2 * ldx + tx] = t0[2] - t0[1]; v[3 * ldx + tx] = t0[1] - t0[3];
        v[4 * ldx + tx] = t1[0] - t1[2]; v[5 * ldx + tx] = t1[1] + t1[2];
        v[6 * ldx + tx] = t1[2] - t1[1]; v[7 * ldx + tx] = t1[1] - t1[3];
        v[8 * ldx + tx] = t2[0] - t2[2]; v[9 * ldx + tx] = t2[1] + t2[2];
        v[10 * ldx + tx] = t2[2] - t2[1]; v[11 * ldx + tx] = t2[1] - t2[3];
        v[12 * ldx + tx] = t3[0] - t3[2]; v[13 * ldx + tx] = t3[1] + t3[2];
        v[14 * ldx + tx] = t3[2] - t3[1]; v[15 * ldx + tx] = t3[1] - t3[3];
    }
}

/* WINOGRAD input, one channel and one row of tiles: v[xi * ldx + tx] for
 * the tiles of row ty (v points at the row's first tile). The channel's
 * padded plane is at p, its rows wp apart. */
static void FN(wino_input)(const T *p, T *v, int64_t ldx, int64_t ty, int64_t tw, int64_t wp) {
    const T *r0 = p + 2 * ty * wp;
    FN(wino_input_row)(r0, r0 + wp, r0 + 2 * wp, r0 + 3 * wp, v, ldx, tw);
}

/* WINOGRAD output, one row of tiles: the 2x2 outputs A^T m A + bias of the
 * first n tiles, m[xi] = m[xi * ldx + tx], A^T = [1 1 1 0; 0 1 -1 -1];
 * rows y0 and y1, columns 2tx and 2tx + 1. */
static MT_CLONES void FN(wino_output_row)(const T *restrict m, int64_t ldx, T *restrict y0, T *restrict y1,
                                          T bv, int64_t n) {
    MT_IVDEP
    for (int64_t tx = 0; tx < n; tx++) {
        T s0[4], s1[4];  /* A^T m: rows combined */
        for (int j = 0; j < 4; j++) {
            const T a = m[j * ldx + tx], b = m[(4 + j) * ldx + tx];
            const T c = m[(8 + j) * ldx + tx], d = m[(12 + j) * ldx + tx];
            s0[j] = a + b + c;
            s1[j] = b - c - d;
        }
        y0[2 * tx] = s0[0] + s0[1] + s0[2] + bv;
        y0[2 * tx + 1] = s0[1] - s0[2] - s0[3] + bv;
        y1[2 * tx] = s1[0] + s1[1] + s1[2] + bv;
        y1[2 * tx + 1] = s1[1] - s1[2] - s1[3] + bv;
    }
}

/* WINOGRAD output, one output channel and one row of tiles: rows 2ty and
 * 2ty + 1 of the plane y from m[xi * ldx + tx] (m points at the row's first
 * tile), plus the bias bv; outputs past an odd oh or ow are dropped
 * (computed into the scratch row, of 2 * tw + 2 elements). */
static void FN(wino_output)(const T *m, int64_t ldx, T *y, T bv, int64_t ty, int64_t tw, int64_t oh, int64_t ow,
                            T *scratch, const mt_conv2d_geom *g) {
    const int64_t full = ow / 2;
    T *y0 = y + 2 * ty * ow;
    T *y1 = 2 * ty + 1 < oh ? y0 + ow : scratch;
    FN(wino_output_row)(m, ldx, y0, y1, bv, full);
    if (ow % 2) {  /* the last tile has one column */
        T row[2][2];
        FN(wino_output_row)(m + full, ldx, row[0], row[1], bv, 1);
        y0[ow - 1] = row[0][0];
        if (2 * ty + 1 < oh) y1[ow - 1] = row[1][0];
    }
    FN(epilogue)(y0, ow, g);
    if (2 * ty + 1 < oh) FN(epilogue)(y1, ow, g);
}

/* WINOGRAD4, F(4x4, 3x3), with the interpolation points 0, 1, -1, 2, -2 and
 * infinity:
 *   B^T = [4  0 -5  0 1 0;  0 -4 -4  1 1 0;  0  4 -4 -1 1 0;
 *          0 -2 -1  2 1 0;  0  2 -1 -2 1 0;  0  4  0 -5 0 1]
 *   G   = [1/4 0 0;  -1/6 -1/6 -1/6;  -1/6 1/6 -1/6;
 *          1/24 1/12 1/6;  1/24 -1/12 1/6;  0 0 1]
 *   A^T = [1 1 1 1 1 0;  0 1 -1 2 -2 0;  0 1 1 4 4 0;  0 1 -1 8 -8 1]
 * The three apply along rows, then along columns, each as the 1-D
 * transforms below (shared terms first). */

/* the 1-D G: six values from the kernel's three */
#define MT_WINO4_G(k0, k1, k2, d)                                              \
    do {                                                                       \
        const T s02 = (k0) + (k2), q = (k0) * (T)(1.0 / 24) + (k2) * (T)(1.0 / 6); \
        (d)[0] = (k0) * (T)0.25;                                               \
        (d)[1] = -(s02 + (k1)) * (T)(1.0 / 6);                                 \
        (d)[2] = -(s02 - (k1)) * (T)(1.0 / 6);                                 \
        (d)[3] = q + (k1) * (T)(1.0 / 12);                                     \
        (d)[4] = q - (k1) * (T)(1.0 / 12);                                     \
        (d)[5] = (k2);                                                         \
    } while (0)

/* WINOGRAD4 weights of output channel o: u[xi * ux + o * cg + c] =
 * (G g G^T)[xi] for each 3x3 kernel g = w[o][c], a block of channels at a
 * time, transposed first (as wino_weights, for whole cache lines). */
static MT_CLONES void FN(wino4_weights)(const T *w, T *u, int64_t ux, int64_t cg, int64_t o) {
    T kt[9][MT_WINO_CBLK], gg[6][3][MT_WINO_CBLK];
    for (int64_t c0 = 0; c0 < cg; c0 += MT_WINO_CBLK) {
        const int64_t nc = mt_min64(MT_WINO_CBLK, cg - c0);
        const T *k = w + (o * cg + c0) * 9;
        for (int64_t c = 0; c < nc; c++)
            for (int j = 0; j < 9; j++) kt[j][c] = k[c * 9 + j];
        for (int j = 0; j < 3; j++)          /* G g: column j of the kernel */
            for (int64_t c = 0; c < nc; c++) {
                T d[6];
                MT_WINO4_G(kt[j][c], kt[3 + j][c], kt[6 + j][c], d);
                for (int i = 0; i < 6; i++) gg[i][j][c] = d[i];
            }
        for (int i = 0; i < 6; i++)          /* (G g) G^T, row i */
            for (int64_t c = 0; c < nc; c++) {
                T d[6];
                MT_WINO4_G(gg[i][0][c], gg[i][1][c], gg[i][2][c], d);
                for (int j = 0; j < 6; j++) u[(i * 6 + j) * ux + o * cg + c0 + c] = d[j];
            }
    }
}

/* the 1-D B^T: six values d from six inputs s[0], s[st], ..., s[5 st] */
#define MT_WINO4_BT(s, st, d)                                                  \
    do {                                                                       \
        const T x0 = (s)[0], x1 = (s)[st], x2 = (s)[2 * (st)], x3 = (s)[3 * (st)]; \
        const T x4 = (s)[4 * (st)], x5 = (s)[5 * (st)];                        \
        const T p = x4 - 4 * x2, q = 4 * x1 - x3, r = x4 - x2, t = 2 * (x1 - x3); \
        (d)[0] = 4 * x0 - 5 * x2 + x4;                                         \
        (d)[1] = p - q;                                                        \
        (d)[2] = p + q;                                                        \
        (d)[3] = r - t;                                                        \
        (d)[4] = r + t;                                                        \
        (d)[5] = 4 * x1 - 5 * x3 + x5;                                         \
    } while (0)

/* WINOGRAD4 input, one channel and one row of tiles: v[xi * ldx + tx] =
 * (B^T d B)[xi] for the 6x6 patch d at rows 4ty .. 4ty + 5, columns
 * 4tx .. 4tx + 5 of the padded plane p (rows wp apart; v points at the
 * row's first tile). B^T d runs over whole rows first, into the scratch
 * (six rows of wp), where it vectorises; then the columns per tile. */
static MT_CLONES void FN(wino4_input)(const T *p, T *v, int64_t ldx, int64_t ty, int64_t tw, int64_t wp,
                                      T *restrict t) {
    const T *r = p + 4 * ty * wp;
    MT_IVDEP
    for (int64_t j = 0; j < wp; j++) {
        T d[6];
        MT_WINO4_BT(r + j, wp, d);
        for (int i = 0; i < 6; i++) t[i * wp + j] = d[i];
    }
    for (int i = 0; i < 6; i++) {
        const T *restrict ti = t + i * wp;
        T *restrict vi = v + 6 * i * ldx;
        MT_IVDEP
        for (int64_t tx = 0; tx < tw; tx++) {
            T d[6];
            MT_WINO4_BT(ti + 4 * tx, 1, d);
            for (int j = 0; j < 6; j++) vi[j * ldx + tx] = d[j];
        }
    }
}

/* the 1-D A^T: four values d from six inputs s[0], s[st], ..., s[5 st] */
#define MT_WINO4_AT(s, st, d)                                                  \
    do {                                                                       \
        const T a12 = (s)[st] + (s)[2 * (st)], s12 = (s)[st] - (s)[2 * (st)];  \
        const T a34 = (s)[3 * (st)] + (s)[4 * (st)], s34 = (s)[3 * (st)] - (s)[4 * (st)]; \
        (d)[0] = (s)[0] + a12 + a34;                                           \
        (d)[1] = s12 + 2 * s34;                                                \
        (d)[2] = a12 + 4 * a34;                                                \
        (d)[3] = s12 + 8 * s34 + (s)[5 * (st)];                                \
    } while (0)

/* WINOGRAD4 output, one row of tiles: the 4x4 outputs A^T m A + bv of the
 * first n tiles (m[xi] = m[xi * ldx + tx]) into rows y[0..3], columns
 * 4tx .. 4tx + 3. */
static MT_CLONES void FN(wino4_output_row)(const T *restrict m, int64_t ldx, T *const *y, T bv, int64_t n) {
    T *restrict y0 = y[0], *restrict y1 = y[1], *restrict y2 = y[2], *restrict y3 = y[3];
    MT_IVDEP
    for (int64_t tx = 0; tx < n; tx++) {
        T s[4][6];   /* A^T m: rows combined, per column j */
        for (int j = 0; j < 6; j++) {
            T d[4];
            MT_WINO4_AT(m + j * ldx + tx, 6 * ldx, d);
            for (int i = 0; i < 4; i++) s[i][j] = d[i];
        }
        T d[4];
        MT_WINO4_AT(s[0], 1, d);
        for (int j = 0; j < 4; j++) y0[4 * tx + j] = d[j] + bv;
        MT_WINO4_AT(s[1], 1, d);
        for (int j = 0; j < 4; j++) y1[4 * tx + j] = d[j] + bv;
        MT_WINO4_AT(s[2], 1, d);
        for (int j = 0; j < 4; j++) y2[4 * tx + j] = d[j] + bv;
        MT_WINO4_AT(s[3], 1, d);
        for (int j = 0; j < 4; j++) y3[4 * tx + j] = d[j] + bv;
    }
}

/* WINOGRAD4 output, one output channel and one row of tiles: rows
 * 4ty .. 4ty + 3 of the plane y from m (the row's first tile), plus the bias
 * bv and the epilogue. Rows past oh go to the scratch (4 rows of
 * 4 tw + 4); the columns of a last, partial tile are computed into a block
 * and copied. */
static void FN(wino4_output)(const T *m, int64_t ldx, T *y, T bv, int64_t ty, int64_t tw, T *scratch,
                             const mt_conv2d_geom *g) {
    const int64_t oh = g->oh, ow = g->ow, full = ow / 4, rest = ow % 4;
    T *rows[4];
    for (int i = 0; i < 4; i++)
        rows[i] = 4 * ty + i < oh ? y + (4 * ty + i) * ow : scratch + i * (4 * tw + 4);
    FN(wino4_output_row)(m, ldx, rows, bv, full);
    if (rest) {
        T blk[4][4];
        T *b[4] = {blk[0], blk[1], blk[2], blk[3]};
        FN(wino4_output_row)(m + full, ldx, b, bv, 1);
        for (int i = 0; i < 4; i++)
            for (int64_t j = 0; j < rest; j++) rows[i][4 * full + j] = blk[i][j];
    }
    for (int i = 0; i < 4 && 4 * ty + i < oh; i++) FN(epilogue)(rows[i], ow, g);
}

#undef MT_WINO4_G
#undef MT_WINO4_BT
#undef MT_WINO4_AT

/* conv_transpose2d: adds col [og * kh * kw][ldc] (columns = input pixels
 * p0 .. p0 + cnt - 1) into the group's output planes y [og][oh][ow]. */
static void FN(col2im)(const T *col, int64_t ldc, int64_t p0, int64_t cnt, T *y, int64_t og,
                       const mt_conv2d_geom *g) {
    const int64_t kk = g->kh * g->kw, ohw = g->oh * g->ow;
    for (int64_t o = 0; o < og; o++) {
        T *yp = y + o * ohw;
        for (int64_t k = 0; k < kk; k++) {
            const int64_t kh = k / g->kw, kw = k % g->kw;
            const T *src = col + (o * kk + k) * ldc;
            const int64_t first = kw * g->dw - g->pw;  /* output column of input column 0 */
            const int64_t lo_all = mt_max64(0, mt_ceildiv(-first, g->sw));
            const int64_t hi_all = mt_floordiv(g->ow - 1 - first, g->sw) + 1;
            for (int64_t t = 0; t < cnt;) {
                const int64_t pix = p0 + t, ih = pix / g->w, iw = pix % g->w;
                const int64_t run = mt_min64(g->w - iw, cnt - t);
                const int64_t oy = ih * g->sh - g->ph + kh * g->dh;
                if (oy >= 0 && oy < g->oh) {
                    const int64_t lo = mt_max64(iw, lo_all), hi = mt_min64(iw + run, hi_all);
                    T *yr = yp + oy * g->ow;
                    const T *s = src + t;  /* s[i - iw] is input column i */
                    if (g->sw == 1) for (int64_t i = lo; i < hi; i++) yr[i + first] += s[i - iw];
                    else for (int64_t i = lo; i < hi; i++) yr[i * g->sw + first] += s[i - iw];
                }
                t += run;
            }
        }
    }
}

#undef FN
#endif
