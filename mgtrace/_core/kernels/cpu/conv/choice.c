/* The conv2d algorithms as one table, and the choice among them as one
 * priority list (as oneDNN's implementation lists): mt_conv2d_pick_algo_ex
 * walks conv_rules in order and takes the first rule that applies; the
 * public entry points reach an algorithm only through conv_algos. A new
 * algorithm is a file beside these, a row in conv_algos and its rules in
 * conv_rules. Entry points only (MT_CONV_RUN). */

#if MT_CONV_PART == MT_CONV_RUN

/* ------------------------------------------------------------- the table */

typedef struct {
    const char *name;
    /* the workspace bytes of run (NULL: none) */
    int64_t (*workspace)(int dt, const mt_conv2d_geom *g, int nt);
    int (*run)(int dt, const void *x, const void *w, const void *bias, void *y, const mt_conv2d_geom *g, int nt,
               void *ws);
    /* optional, NULL for an algorithm that reads the weights as they are:
     * the weights packed once (the caller caches them) in a layout of this
     * CPU's kernel (layout: NULL answers 0) */
    int (*layout)(void);
    int64_t (*packed_bytes)(int dt, const mt_conv2d_geom *g, int layout);
    void (*pack)(int dt, const void *w, void *packed, const mt_conv2d_geom *g, int layout, int nt);
    int64_t (*packed_workspace)(int dt, const mt_conv2d_geom *g, int layout, int nt);
    int (*run_packed)(int dt, const void *x, const void *packed, const void *bias, void *y, const mt_conv2d_geom *g,
                      int layout, int nt, void *ws);
} conv_algo;

static const conv_algo conv_algos[MT_CONV_NALGOS] = {
    [MT_CONV_GEMM1X1] = {"gemm1x1", NULL, gemm1x1_run},
    [MT_CONV_SHIFTED] = {"shifted", shifted_workspace, shifted_run},
    [MT_CONV_IM2COL] = {"im2col", im2col_workspace, im2col_run},
    [MT_CONV_DEPTHWISE] = {"depthwise", dw_workspace, dw_run},
    [MT_CONV_WINOGRAD] = {"winograd", wino2_workspace, wino2_run, NULL, wino2_packed_bytes, wino2_pack,
                          wino2_packed_workspace, wino2_run_packed},
    [MT_CONV_WINOGRAD4] = {"winograd4", wino4_workspace, wino4_run, NULL, wino4_packed_bytes, wino4_pack,
                           wino4_packed_workspace, wino4_run_packed},
    [MT_CONV_DIRECT] = {"direct", direct_workspace, direct_run, direct_layout, direct_packed_bytes, direct_pack,
                        direct_packed_workspace, direct_run_packed},
    [MT_CONV_BLOCKED] = {"blocked", blk_workspace, blk_run, blk_layout, blk_packed_bytes, blk_pack,
                         blk_packed_workspace, blk_run_packed},
};

/* An algorithm's row; MT_CONV_AUTO and codes outside the enum are IM2COL's,
 * which takes every geometry. */
static const conv_algo *algo_row(int algo) {
    return algo > MT_CONV_AUTO && algo < MT_CONV_NALGOS ? &conv_algos[algo] : &conv_algos[MT_CONV_IM2COL];
}

/* The row of an algorithm that packs its weights. The packed entry points
 * are for those only (nn.pyx asks mt_conv2d_packs_weights first); another
 * code is taken as WINOGRAD's, as it always was, so that no call reaches
 * a NULL member. */
static const conv_algo *packed_row(int algo) {
    const conv_algo *a = algo_row(algo);
    return a->pack ? a : &conv_algos[MT_CONV_WINOGRAD];
}

/* ------------------------------------------------------------- the rules */

/* (the sizes below in double: they only rank algorithms, and must not wrap
 * for the huge geometries a workspace query then refuses) */
static int64_t conv_cg(const mt_conv2d_geom *g) { return g->c / g->groups; }
static int64_t conv_og(const mt_conv2d_geom *g) { return g->o / g->groups; }
static int is_1x1(const mt_conv2d_geom *g) { return g->kh == 1 && g->kw == 1; }
static double wino_tiles(const mt_conv2d_geom *g) {
    return (double)g->n * (double)((g->oh + 1) / 2) * (double)((g->ow + 1) / 2);
}

/* one input channel per group */
static int rule_depthwise(const mt_conv2d_geom *g, int w_cached) {
    (void)w_cached;
    return conv_cg(g) == 1;
}

/* 1x1 without stride or padding is a GEMM on the input as it is (even on
 * 7x7 planes it measured as fast as IM2COL's copy batching the images) */
static int rule_gemm1x1(const mt_conv2d_geom *g, int w_cached) {
    (void)w_cached;
    return is_1x1(g) && g->sh == 1 && g->sw == 1 && g->ph == 0 && g->pw == 0;
}

/* a strided (or padded) 1x1 is IM2COL's GEMM on its subsampled copy */
static int rule_1x1_im2col(const mt_conv2d_geom *g, int w_cached) {
    (void)w_cached;
    return is_1x1(g);
}

/* DIRECT with its weights packed once (cached by the caller) beats
 * Winograd on few tiles, where Winograd's 16 GEMMs are thin (measured in
 * ResNet-18 at batch 1: 512 channels on 7x7 planes 0.60x, 256 on 14x14
 * 0.84x; at 28x28 and at batch 8 Winograd is as fast or faster) */
static int rule_direct_few_tiles(const mt_conv2d_geom *g, int w_cached) {
    return w_cached && wino_applicable(g) && conv_og(g) >= 16 && wino_tiles(g) < MT_DIRECT_MAX_TILES
        && direct_fits(g);
}

/* Winograd needs 3x3, stride 1, no dilation; its 16 GEMMs need enough
 * channels (K and M), and enough 2x2 tiles over the batch (N) to pay for
 * the weight transform (16 values per 3x3 kernel, every call unless the
 * caller caches U): more when the transformed weights outgrow the cache
 * (512x512: 16 MiB). With U cached by the caller, 32 tiles pay whatever
 * U's size (512 channels on 7x7 planes measured 25% faster than IM2COL at
 * batch 2). */
static double wino_min_tiles(const mt_conv2d_geom *g, int w_cached) {
    return !w_cached && 64.0 * (double)g->o * (double)conv_cg(g) > (double)MT_WINO_BIG_U ? 64 : 32;
}

static int rule_winograd(const mt_conv2d_geom *g, int w_cached) {
    return wino_applicable(g) && conv_cg(g) >= 16 && conv_og(g) >= 16 && wino_tiles(g) >= wino_min_tiles(g, w_cached);
}

/* F(4x4) does 0.56x F(2x2)'s multiply-adds a tile of 2x2 outputs, but its
 * U is 2.25x larger and its tiles 4x fewer: it pays where as many 4x4
 * tiles remain (56x56 and 28x28 planes measured 1.1-1.6x faster than
 * F(2x2), 7x7 from batch 4), unless it computes more outputs that are
 * dropped (14x14 planes: 16x16 outputs for 14x14, against none for F(2x2);
 * measured slower) */
static int rule_winograd4(const mt_conv2d_geom *g, int w_cached) {
    if (!rule_winograd(g, w_cached)) return 0;
    const double th4 = (double)((g->oh + 3) / 4), tw4 = (double)((g->ow + 3) / 4);
    const double th2 = (double)((g->oh + 1) / 2), tw2 = (double)((g->ow + 1) / 2);
    const double tiles4 = (double)g->n * th4 * tw4;
    return tiles4 >= wino_min_tiles(g, w_cached) && 16.0 * th4 * tw4 <= 4.0 * th2 * tw2 * 1.05;
}

/* DIRECT (no GEMM: its micro-kernel runs near the FMA peak, where a
 * single-threaded sgemm reaches about 65% of it) beats IM2COL's copy and
 * GEMM on few input channels (ResNet's and MobileNet's stems: 1.4-1.6x)
 * and on strided layers with 28x28 outputs and up (1.15x). On smaller
 * planes its wide rows waste more and IM2COL's GEMM wins; 1x1 kernels stay
 * GEMMs. With its weights cached, DIRECT wins on the strided layers of
 * every plane size (ResNet-18's 3x3 stride 2 to 14x14 and 7x7: 0.6x IM2COL
 * at batch 1 and 8). */
static int rule_direct(const mt_conv2d_geom *g, int w_cached) {
    const double ohw = (double)g->oh * (double)g->ow;
    const int strided = g->sh > 1 || g->sw > 1;
    return !is_1x1(g) && direct_fits(g)
        && (conv_cg(g) < MT_SHIFTED_MIN_K || (strided && (w_cached || ohw >= 784)));
}

/* SHIFTED computes wide columns that are not outputs: worth it while they
 * are few (large planes); IM2COL copies K values per output instead, which
 * costs more than SHIFTED's GEMMs with K = C/groups lose on large planes
 * (56x56 and up), less on smaller ones (28x28 measured) */
static int rule_shifted(const mt_conv2d_geom *g, int w_cached) {
    (void)w_cached;
    const double one_image = (double)count_slots(g) * (double)g->c * (double)shifted_hq(g)
                           * (double)shifted_wq(g) * 8.0;
    const double wide = shifted_per_image(g) ? (double)shifted_need(g)
                                             : (double)shifted_hq(g) * (double)shifted_wq(g);
    const double ohw = (double)g->oh * (double)g->ow, waste = wide / ohw;
    return conv_cg(g) >= MT_SHIFTED_MIN_K && waste <= 1.2 && one_image <= (double)MT_SHIFTED_MAX_BYTES
        && ohw >= MT_SHIFTED_MIN_PLANE;
}

static int rule_always(const mt_conv2d_geom *g, int w_cached) {
    (void)g;
    (void)w_cached;
    return 1;
}

/* The priority list: the first rule that applies picks its algorithm (a
 * rule may assume that the rules above it did not apply). Features of the
 * CPU enter through the rules (blocked_pays: AVX-512's kernel). */
static const struct {
    int algo;
    int (*applies)(const mt_conv2d_geom *g, int w_cached);
} conv_rules[] = {
    {MT_CONV_DEPTHWISE, rule_depthwise},
    {MT_CONV_BLOCKED, blocked_pays},            /* blocked.c: cached weights, AVX-512 */
    {MT_CONV_GEMM1X1, rule_gemm1x1},
    {MT_CONV_IM2COL, rule_1x1_im2col},
    {MT_CONV_DIRECT, rule_direct_few_tiles},
    {MT_CONV_WINOGRAD4, rule_winograd4},
    {MT_CONV_WINOGRAD, rule_winograd},
    {MT_CONV_DIRECT, rule_direct},
    {MT_CONV_SHIFTED, rule_shifted},
    {MT_CONV_IM2COL, rule_always},
};

int mt_conv2d_pick_algo_ex(const mt_conv2d_geom *g, int w_cached) {
    size_t i = 0;
    while (!conv_rules[i].applies(g, w_cached)) i++;    /* (the last rule always applies) */
    return conv_rules[i].algo;
}

int mt_conv2d_pick_algo(const mt_conv2d_geom *g) { return mt_conv2d_pick_algo_ex(g, 0); }

/* ----------------------------------------------------- the entry points */

int64_t mt_conv2d_workspace(int dtype, const mt_conv2d_geom *g, int algo, int nthreads) {
    if (g->n == 0 || g->o == 0 || g->c == 0) return 0;
    if (algo == MT_CONV_AUTO) algo = mt_conv2d_pick_algo(g);
    const conv_algo *a = algo_row(algo);
    return a->workspace ? a->workspace(dtype, g, nthreads) : 0;
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
    return algo_row(algo)->run(dtype, x, weight, bias, y, g, nthreads, workspace);
}

/* Weights packed once for the algorithms that rearrange them (the caller
 * caches the packed copy): WINOGRAD / WINOGRAD4's U, DIRECT's and BLOCKED's
 * blocks of output channels. */
int mt_conv2d_packs_weights(int algo) { return algo > MT_CONV_AUTO && algo < MT_CONV_NALGOS && conv_algos[algo].pack; }

int mt_conv2d_packed_layout(int algo) {
    const conv_algo *a = algo_row(algo);
    return a->layout ? a->layout() : 0;
}

int64_t mt_conv2d_packed_bytes(int dtype, const mt_conv2d_geom *g, int algo, int layout) {
    return packed_row(algo)->packed_bytes(dtype, g, layout);
}

void mt_conv2d_pack_weights(int dtype, const void *weight, void *packed, const mt_conv2d_geom *g, int algo,
                            int layout, int nthreads) {
    if (g->o == 0 || g->c == 0) return;
    packed_row(algo)->pack(dtype, weight, packed, g, layout, nthreads);
}

int64_t mt_conv2d_packed_workspace(int dtype, const mt_conv2d_geom *g, int algo, int layout, int nthreads) {
    if (g->n == 0 || g->o == 0 || g->c == 0) return 0;
    return packed_row(algo)->packed_workspace(dtype, g, layout, nthreads);
}

int mt_conv2d_packed(int dtype, const void *x, const void *packed, const void *bias, void *y,
                     const mt_conv2d_geom *g, int algo, int layout, int nthreads, void *workspace) {
    if (g->n == 0 || g->o == 0 || g->c == 0) return mt_conv2d(dtype, x, NULL, bias, y, g, algo, nthreads, workspace);
    return packed_row(algo)->run_packed(dtype, x, packed, bias, y, g, layout, nthreads, workspace);
}

#endif
