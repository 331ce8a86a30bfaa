/* WINOGRAD and WINOGRAD4: F(2x2, 3x3) and F(4x4, 3x3) over chunks of
 * tiles counted over the batch, a GEMM per transform point. */

#if MT_CONV_PART == MT_CONV_PLANS   /* constants, plans */

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

static int wino_applicable(const mt_conv2d_geom *g) {
    return g->kh == 3 && g->kw == 3 && g->sh == 1 && g->sw == 1 && g->dh == 1 && g->dw == 1;
}

#elif MT_CONV_PART == MT_CONV_KERNELS   /* per dtype: T, SFX */

/* WINOGRAD weights of output channel o: u[xi * ux + o * cg + c] =
 * (G g G^T)[xi] for each 3x3 kernel g = w[o][c] (G: winograd.h). Blocks
 * of channels at a time, transposed first (kt[j][c] = g[j]), so that every
 * loop runs over contiguous c and each of the 16 planes of u gets whole
 * cache lines (16 scattered stores a kernel thrash the cache sets). */
static MT_CLONES void FN(wino_weights)(const T *w, T *u, int64_t ux, int64_t cg, int64_t o) {
    T kt[9][MT_WINO_CBLK], gg[4][3][MT_WINO_CBLK];
    for (int64_t c0 = 0; c0 < cg; c0 += MT_WINO_CBLK) {
        const int64_t nc = mt_min64(MT_WINO_CBLK, cg - c0);
        const T *k = w + (o * cg + c0) * 9;
        for (int64_t c = 0; c < nc; c++)
            for (int j = 0; j < 9; j++) kt[j][c] = k[c * 9 + j];
        for (int j = 0; j < 3; j++) {       /* G g: column j of the kernel */
            const T *restrict k0 = kt[j], *restrict k1 = kt[3 + j], *restrict k2 = kt[6 + j];
            T *restrict g0 = gg[0][j], *restrict g1 = gg[1][j], *restrict g2 = gg[2][j], *restrict g3 = gg[3][j];
            for (int64_t c = 0; c < nc; c++) {
                T d[4];
                MT_WINO2_G(k0[c], k1[c], k2[c], d);
                g0[c] = d[0], g1[c] = d[1], g2[c] = d[2], g3[c] = d[3];
            }
        }
        for (int i = 0; i < 4; i++) {        /* (G g) G^T, row i */
            const T *restrict a0 = gg[i][0], *restrict a1 = gg[i][1], *restrict a2 = gg[i][2];
            T *restrict d0 = u + (i * 4) * ux + o * cg + c0, *restrict d1 = d0 + ux;
            T *restrict d2 = d1 + ux, *restrict d3 = d2 + ux;
            for (int64_t c = 0; c < nc; c++) {
                T d[4];
                MT_WINO2_G(a0[c], a1[c], a2[c], d);
                d0[c] = d[0], d1[c] = d[1], d2[c] = d[2], d3[c] = d[3];
            }
        }
    }
}

/* WINOGRAD input, one row of tiles: v[xi * ldx + tx] = (B^T d B)[xi] for the
 * 4x4 patch d at columns 2tx .. 2tx + 3 of rows r0..r3 (B^T: winograd.h). */
static MT_CLONES void FN(wino_input_row)(const T *restrict r0, const T *restrict r1, const T *restrict r2,
                                         const T *restrict r3, T *restrict v, int64_t ldx, int64_t tw) {
    MT_IVDEP
    for (int64_t tx = 0; tx < tw; tx++) {
        const T *a = r0 + 2 * tx, *b = r1 + 2 * tx, *c = r2 + 2 * tx, *d = r3 + 2 * tx;
        T t[4][4];   /* B^T d: rows combined, per column j */
        for (int j = 0; j < 4; j++) {
            T e[4];
            MT_WINO2_BT(a[j], b[j], c[j], d[j], e);
            for (int i = 0; i < 4; i++) t[i][j] = e[i];
        }
        for (int i = 0; i < 4; i++) {   /* (B^T d) B: columns combined */
            T e[4];
            MT_WINO2_BT(t[i][0], t[i][1], t[i][2], t[i][3], e);
            for (int j = 0; j < 4; j++) v[(4 * i + j) * ldx + tx] = e[j];
        }
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
 * first n tiles, m[xi] = m[xi * ldx + tx] (A^T: winograd.h); rows y0 and
 * y1, columns 2tx and 2tx + 1. */
static MT_CLONES void FN(wino_output_row)(const T *restrict m, int64_t ldx, T *restrict y0, T *restrict y1,
                                          T bv, int64_t n) {
    MT_IVDEP
    for (int64_t tx = 0; tx < n; tx++) {
        T s[2][4];   /* A^T m: rows combined, per column j */
        for (int j = 0; j < 4; j++) {
            T d[2];
            MT_WINO2_AT(m[j * ldx + tx], m[(4 + j) * ldx + tx], m[(8 + j) * ldx + tx], m[(12 + j) * ldx + tx], d);
            s[0][j] = d[0];
            s[1][j] = d[1];
        }
        T d[2];
        MT_WINO2_AT(s[0][0], s[0][1], s[0][2], s[0][3], d);
        y0[2 * tx] = d[0] + bv;
        y0[2 * tx + 1] = d[1] + bv;
        MT_WINO2_AT(s[1][0], s[1][1], s[1][2], s[1][3], d);
        y1[2 * tx] = d[0] + bv;
        y1[2 * tx + 1] = d[1] + bv;
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

/* WINOGRAD4, F(4x4, 3x3): winograd.h's B^T, G and A^T, each along rows,
 * then along columns. */

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

#elif MT_CONV_PART == MT_CONV_RUN   /* entry points */

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

/* ---- the algorithm table's members (choice.c): F(2x2) and F(4x4) share
 * them, the edge e a parameter; packed: U (the layout argument unused) */

static int64_t wino_workspace(int dt, int e, const mt_conv2d_geom *g, int nt) {
    wino_plan pl;
    plan_wino(g, dt == MT_FLOAT32 ? 4 : 8, e, nt, 1, &pl);
    return ws_report(pl.bytes);
}

static int64_t wino_packed_bytes(int dt, int e, const mt_conv2d_geom *g) {
    return ws_report(wino_u_bytes(g, dt == MT_FLOAT32 ? 4 : 8, (e + 2) * (e + 2)));
}

static int64_t wino_packed_workspace(int dt, int e, const mt_conv2d_geom *g, int nt) {
    wino_plan pl;
    plan_wino(g, dt == MT_FLOAT32 ? 4 : 8, e, nt, 0, &pl);
    return ws_report(pl.bytes);
}

#define MT_WINO_MEMBERS(E)                                                                          \
static int64_t wino##E##_workspace(int dt, const mt_conv2d_geom *g, int nt) {                        \
    return wino_workspace(dt, E, g, nt);                                                            \
}                                                                                                   \
static int wino##E##_run(int dt, const void *x, const void *w, const void *bias, void *y,           \
                         const mt_conv2d_geom *g, int nt, void *ws) {                               \
    return conv_winograd(dt, E, x, w, NULL, bias, y, g, nt, ws);                                    \
}                                                                                                   \
static int64_t wino##E##_packed_bytes(int dt, const mt_conv2d_geom *g, int layout) {                \
    (void)layout;                                                                                   \
    return wino_packed_bytes(dt, E, g);                                                             \
}                                                                                                   \
static void wino##E##_pack(int dt, const void *w, void *packed, const mt_conv2d_geom *g, int layout, \
                           int nt) {                                                                \
    (void)layout;                                                                                   \
    wino_transform(dt, E, w, packed, g, nt);                                                        \
}                                                                                                   \
static int64_t wino##E##_packed_workspace(int dt, const mt_conv2d_geom *g, int layout, int nt) {     \
    (void)layout;                                                                                   \
    return wino_packed_workspace(dt, E, g, nt);                                                     \
}                                                                                                   \
static int wino##E##_run_packed(int dt, const void *x, const void *packed, const void *bias, void *y, \
                                const mt_conv2d_geom *g, int layout, int nt, void *ws) {            \
    (void)layout;                                                                                   \
    return conv_winograd(dt, E, x, NULL, packed, bias, y, g, nt, ws);                               \
}
MT_WINO_MEMBERS(2)
MT_WINO_MEMBERS(4)
#undef MT_WINO_MEMBERS

#endif
