/* The algorithm choice (mt_conv2d_pick_algo_ex) and the public entry
 * points that dispatch on it. Entry points only (MT_CONV_RUN). */

#if MT_CONV_PART == MT_CONV_RUN

int mt_conv2d_pick_algo(const mt_conv2d_geom *g) { return mt_conv2d_pick_algo_ex(g, 0); }

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

#endif
