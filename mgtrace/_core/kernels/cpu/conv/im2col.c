/* IM2COL: columns copied from SHIFTED's padded copy, a GEMM per tile of
 * output pixels (tiles span images on small planes). */

#if MT_CONV_PART == MT_CONV_PLANS   /* constants, plans */

/* IM2COL: column tiles span images below this many output pixels an image */
#define MT_IM2COL_SPAN 256
/* IM2COL: fewest columns a tile where the total allows (the GEMM's N) */
#define MT_IM2COL_MIN_N 96
/* IM2COL: bytes of column buffer a tile when that leaves 512 columns or more */
#define MT_IM2COL_SMALL_TILE ((int64_t)128 << 10)

#elif MT_CONV_PART == MT_CONV_KERNELS   /* per dtype: T, SFX */

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

#elif MT_CONV_PART == MT_CONV_RUN   /* entry points */

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

/* ---- the algorithm table's members (choice.c) */

static int64_t im2col_workspace(int dt, const mt_conv2d_geom *g, int nt) {
    im2col_plan pl;
    plan_im2col(g, dt == MT_FLOAT32 ? 4 : 8, nt, &pl);
    return ws_report(pl.bytes);
}

static int im2col_run(int dt, const void *x, const void *w, const void *bias, void *y, const mt_conv2d_geom *g,
                      int nt, void *ws) {
    return conv_im2col(dt, x, w, bias, y, g, nt, ws);
}

#endif
