/* DEPTHWISE: one input channel per group (MobileNet's depthwise convs).
 * Its packed plane (dw_plan) is DIRECT's per-channel layout too. */

#if MT_CONV_PART == MT_CONV_PLANS   /* constants, plans */

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

#elif MT_CONV_PART == MT_CONV_KERNELS   /* per dtype: T, SFX */

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

#elif MT_CONV_PART == MT_CONV_RUN   /* entry points */

/* ---- the algorithm table's members (choice.c) */

static int64_t dw_workspace(int dt, const mt_conv2d_geom *g, int nt) {
    dw_plan pl;
    plan_dw(g, dt == MT_FLOAT32 ? 4 : 8, &pl);
    return pl.packed ? ws_report(ws_add(ws_add(ws_mul(nt, pl.bytes_one), pl.map_bytes), pl.off_bytes)) : 0;
}

static int dw_run(int dt, const void *x, const void *w, const void *bias, void *y, const mt_conv2d_geom *g,
                  int nt, void *ws) {
    if (dt == MT_FLOAT32) depthwise_f32(x, w, bias, y, g, nt, ws);
    else depthwise_f64(x, w, bias, y, g, nt, ws);
    return 0;
}

#endif
