/* SHIFTED: one GEMM per kernel tap over a zero-padded, phase-split copy
 * of the input; the wide output scattered into NCHW. */

#if MT_CONV_PART == MT_CONV_PLANS   /* constants, plans */

/* SHIFTED: bytes of padded copy per batch of images (at least one image) */
#define MT_SHIFTED_BATCH_BYTES ((int64_t)32 << 20)
/* AUTO uses SHIFTED only while one image's padded copy stays below this */
#define MT_SHIFTED_MAX_BYTES ((int64_t)512 << 20)

/* AUTO: fewest input channels per group for SHIFTED (GEMM K below this is slow) */
#define MT_SHIFTED_MIN_K 16
/* AUTO: fewest output pixels an image for SHIFTED (below, IM2COL measured faster) */
#define MT_SHIFTED_MIN_PLANE 1024

static int64_t shifted_hq(const mt_conv2d_geom *g) { return ws_add(g->oh, ws_mul(g->kh - 1, g->dh) / g->sh); }
static int64_t shifted_wq(const mt_conv2d_geom *g) { return ws_add(g->ow, ws_mul(g->kw - 1, g->dw) / g->sw); }
/* SHIFTED: wide columns an image needs (its last output is at (oh-1)*wq + ow - 1) */
static int64_t shifted_need(const mt_conv2d_geom *g) { return ws_add(ws_mul(g->oh - 1, shifted_wq(g)), g->ow); }
/* SHIFTED tiles stay within an image (skipping the rows between images) when
 * an image has enough columns, else span images */
static int shifted_per_image(const mt_conv2d_geom *g) { return shifted_need(g) >= 512; }

#elif MT_CONV_PART == MT_CONV_KERNELS   /* per dtype: T, SFX */

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

#elif MT_CONV_PART == MT_CONV_RUN   /* entry points */

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

/* ---- the algorithm table's members (choice.c) */

static int64_t shifted_workspace(int dt, const mt_conv2d_geom *g, int nt) {
    shifted_plan pl;
    plan_shifted(g, dt == MT_FLOAT32 ? 4 : 8, nt, &pl);
    return ws_report(pl.bytes);
}

static int shifted_run(int dt, const void *x, const void *w, const void *bias, void *y, const mt_conv2d_geom *g,
                       int nt, void *ws) {
    return conv_shifted(dt, x, w, bias, y, g, nt, ws);
}

#endif
