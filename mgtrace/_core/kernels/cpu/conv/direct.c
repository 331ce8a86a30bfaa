/* DIRECT: multiply-adds in registers over a padded, phase-split copy,
 * blocks of output channels times vectors of wide outputs; no GEMM. */

#if MT_CONV_PART == MT_CONV_PLANS   /* constants, plans */

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

/* DIRECT's packed image stays within MT_DIRECT_MAX_BYTES (float64) */
static int direct_fits(const mt_conv2d_geom *g) {
    direct_plan pl;
    plan_direct(g, 8, 1, MT_DIRECT_OB_WIDE, 1, &pl);
    return pl.pk_bytes <= MT_DIRECT_MAX_BYTES;
}

#elif MT_CONV_PART == MT_CONV_KERNELS   /* per dtype: T, SFX */

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

#elif MT_CONV_PART == MT_CONV_RUN   /* entry points */

int mt_conv2d_direct_algo(const mt_conv2d_geom *g) { return direct_fits(g) ? MT_CONV_DIRECT : MT_CONV_IM2COL; }

/* ---- the algorithm table's members (choice.c); packed: w is NULL and
 * wpk the weights pack_blocks made in `layout` */

static int64_t direct_workspace(int dt, const mt_conv2d_geom *g, int nt) {
    direct_plan pl;
    plan_direct(g, dt == MT_FLOAT32 ? 4 : 8, nt, direct_layout(), 1, &pl);
    return ws_report(pl.bytes);
}

static int direct_run(int dt, const void *x, const void *w, const void *bias, void *y, const mt_conv2d_geom *g,
                      int nt, void *ws) {
    if (dt == MT_FLOAT32) direct_f32(x, w, NULL, direct_layout(), bias, y, g, nt, ws);
    else direct_f64(x, w, NULL, direct_layout(), bias, y, g, nt, ws);
    return 0;
}

static int64_t direct_packed_bytes(int dt, const mt_conv2d_geom *g, int layout) {
    direct_plan pl;
    plan_direct(g, dt == MT_FLOAT32 ? 4 : 8, 1, layout, 1, &pl);
    return ws_report(pl.wpk_bytes);
}

/* (block rows: DIRECT's layout is them) */
static void direct_pack(int dt, const void *w, void *packed, const mt_conv2d_geom *g, int layout, int nt) {
    if (dt == MT_FLOAT32) pack_blocks_f32(w, packed, g, layout, nt);
    else pack_blocks_f64(w, packed, g, layout, nt);
}

static int64_t direct_packed_workspace(int dt, const mt_conv2d_geom *g, int layout, int nt) {
    direct_plan pl;
    plan_direct(g, dt == MT_FLOAT32 ? 4 : 8, nt, layout, 0, &pl);
    return ws_report(pl.bytes);
}

static int direct_run_packed(int dt, const void *x, const void *packed, const void *bias, void *y,
                             const mt_conv2d_geom *g, int layout, int nt, void *ws) {
    if (dt == MT_FLOAT32) direct_f32(x, NULL, packed, layout, bias, y, g, nt, ws);
    else direct_f64(x, NULL, packed, layout, bias, y, g, nt, ws);
    return 0;
}

#endif
