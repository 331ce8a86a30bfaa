/* GEMM1X1: 1x1, stride 1, no padding: one GEMM per (image, group) on
 * the input as it is. */

#if MT_CONV_PART == MT_CONV_RUN   /* entry points */

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

/* ---- the algorithm table's member (choice.c; no workspace) */

static int gemm1x1_run(int dt, const void *x, const void *w, const void *bias, void *y, const mt_conv2d_geom *g,
                       int nt, void *ws) {
    (void)ws;
    return conv_gemm1x1(dt, x, w, bias, y, g, nt);
}

#endif
