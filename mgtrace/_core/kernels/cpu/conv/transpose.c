/* conv_transpose2d: col = W^T x (GEMM), then col2im adds the columns
 * into the output, in tiles of input pixels. */

#if MT_CONV_PART == MT_CONV_KERNELS   /* per dtype: T, SFX */

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

#elif MT_CONV_PART == MT_CONV_RUN   /* entry points */

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

#endif
