/* BLOCKED: multiply-adds in registers vectorised over two vectors of
 * output channels times up to 12 pixels of an output row. */

#if MT_CONV_PART == MT_CONV_PLANS   /* constants, plans */

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

#elif MT_CONV_PART == MT_CONV_KERNELS   /* per dtype: T, SFX */

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

#elif MT_CONV_PART == MT_CONV_RUN   /* entry points */

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

/* ---- the algorithm table's members (choice.c) */

static int64_t blk_workspace(int dt, const mt_conv2d_geom *g, int nt) {
    blk_plan pl;
    plan_blk(g, dt == MT_FLOAT32 ? 4 : 8, nt, blk_layout(), 1, &pl);
    return ws_report(pl.bytes);
}

static int blk_run(int dt, const void *x, const void *w, const void *bias, void *y, const mt_conv2d_geom *g,
                   int nt, void *ws) {
    if (dt == MT_FLOAT32) blocked_f32(x, w, NULL, blk_layout(), bias, y, g, nt, ws);
    else blocked_f64(x, w, NULL, blk_layout(), bias, y, g, nt, ws);
    return 0;
}

static int64_t blk_packed_bytes(int dt, const mt_conv2d_geom *g, int layout) {
    blk_plan pl;
    plan_blk(g, dt == MT_FLOAT32 ? 4 : 8, 1, layout, 1, &pl);
    return ws_report(pl.wpk_bytes);
}

/* (block rows: BLOCKED's layout is its vector bytes, two vectors a block) */
static void blk_pack(int dt, const void *w, void *packed, const mt_conv2d_geom *g, int layout, int nt) {
    const int64_t obk = 2 * layout / (dt == MT_FLOAT32 ? 4 : 8);
    if (dt == MT_FLOAT32) pack_blocks_f32(w, packed, g, obk, nt);
    else pack_blocks_f64(w, packed, g, obk, nt);
}

static int64_t blk_packed_workspace(int dt, const mt_conv2d_geom *g, int layout, int nt) {
    blk_plan pl;
    plan_blk(g, dt == MT_FLOAT32 ? 4 : 8, nt, layout, 0, &pl);
    return ws_report(pl.bytes);
}

static int blk_run_packed(int dt, const void *x, const void *packed, const void *bias, void *y,
                          const mt_conv2d_geom *g, int layout, int nt, void *ws) {
    if (dt == MT_FLOAT32) blocked_f32(x, NULL, packed, layout, bias, y, g, nt, ws);
    else blocked_f64(x, NULL, packed, layout, bias, y, g, nt, ws);
    return 0;
}

#endif
