/* conv.c's shared pieces: workspace arithmetic that saturates, the GEMM
 * call, strided copies, the stride's phases ("slots"), work splitting over
 * threads, and the bias/epilogue writers every algorithm ends with. */

#if MT_CONV_PART == MT_CONV_PLANS   /* constants, plans */

/* SHIFTED/IM2COL/col2im: target bytes of the per-tile GEMM output / column buffer */
#define MT_TILE_BYTES ((int64_t)1 << 20)

static inline int64_t mt_clamp64(int64_t v, int64_t lo, int64_t hi) { return v < lo ? lo : (v > hi ? hi : v); }

/* Scratch memory comes from the caller (mt_conv2d_workspace says how much):
 * the core's allocator caches large blocks, so no call pays fresh page faults.
 * Pieces are carved off 64-byte aligned.
 *
 * Workspace sizes come from the caller's geometry, and a valid call can ask
 * for more than int64 counts (padding of 2^30 on a thousand channels), so
 * the plans compute them with saturating arithmetic: a size that does not
 * fit is WS_TOO_LARGE, which the workspace queries report as
 * MT_NN_EOVERFLOW instead of a wrapped, too small buffer. */
#define WS_TOO_LARGE INT64_MAX
static inline int64_t ws_mul(int64_t a, int64_t b) {
    int64_t r;
    return __builtin_mul_overflow(a, b, &r) ? WS_TOO_LARGE : r;
}
static inline int64_t ws_mul4(int64_t a, int64_t b, int64_t c, int64_t d) {
    return ws_mul(ws_mul(a, b), ws_mul(c, d));
}
static inline int64_t ws_add(int64_t a, int64_t b) {
    int64_t r;
    return __builtin_add_overflow(a, b, &r) ? WS_TOO_LARGE : r;
}
static inline int64_t ws_round(int64_t nbytes) {
    return nbytes > WS_TOO_LARGE - 63 ? WS_TOO_LARGE : (nbytes + 63) & ~(int64_t)63;
}
static inline int64_t ws_report(int64_t nbytes) { return nbytes == WS_TOO_LARGE ? MT_NN_EOVERFLOW : nbytes; }
static inline char *ws_take(char **ws, int64_t nbytes) {
    char *p = *ws;
    *ws += ws_round(nbytes);
    return p;
}

/* Tile width: columns of an m-row buffer that fit MT_TILE_BYTES, within [lo, total]. */
static int64_t tile_cols(int64_t m, int64_t isz, int64_t lo, int64_t hi, int64_t total) {
    int64_t t = MT_TILE_BYTES / mt_max64(1, m * isz);
    t = mt_clamp64(t, lo, hi) & ~(int64_t)15;
    return mt_clamp64(t, 1, mt_max64(1, total));
}

/* C[m x n] (+)= op(A) * B, row-major; op(A) = A^T when trans_a (A stored [k][m]). */
static void gemm(int dt, int trans_a, int64_t m, int64_t n, int64_t k, const void *a, int64_t lda,
                 const void *b, int64_t ldb, int accumulate, void *c, int64_t ldc) {
    const enum CBLAS_TRANSPOSE ta = trans_a ? CblasTrans : CblasNoTrans;
    if (dt == MT_FLOAT32)
        scipy_cblas_sgemm(CblasRowMajor, ta, CblasNoTrans, (blasint)m, (blasint)n, (blasint)k, 1.0f,
                          (const float *)a, (blasint)lda, (const float *)b, (blasint)ldb,
                          accumulate ? 1.0f : 0.0f, (float *)c, (blasint)ldc);
    else
        scipy_cblas_dgemm(CblasRowMajor, ta, CblasNoTrans, (blasint)m, (blasint)n, (blasint)k, 1.0,
                          (const double *)a, (blasint)lda, (const double *)b, (blasint)ldb,
                          accumulate ? 1.0 : 0.0, (double *)c, (blasint)ldc);
}

/* dst[i] = src[i * step] for n elements of isz bytes (step in elements). */
static inline void copy_strided(char *dst, const char *src, int64_t n, int64_t step, int64_t isz) {
    if (step == 1) { memcpy(dst, src, (size_t)(n * isz)); return; }
    if (isz == 4) {
        uint32_t *d = (uint32_t *)dst; const uint32_t *s = (const uint32_t *)src;
        for (int64_t i = 0; i < n; i++) d[i] = s[i * step];
    } else {
        uint64_t *d = (uint64_t *)dst; const uint64_t *s = (const uint64_t *)src;
        for (int64_t i = 0; i < n; i++) d[i] = s[i * step];
    }
}

/* Fills dst[0..n) from one input row: element i reads row[i * step + first]
 * where that lies in [0, w), else 0. */
static inline void gather_row(char *dst, const char *row, int64_t n, int64_t first, int64_t step,
                              int64_t w, int64_t isz) {
    int64_t lo = mt_clamp64(mt_ceildiv(-first, step), 0, n);
    int64_t hi = mt_clamp64(mt_floordiv(w - 1 - first, step) + 1, lo, n);
    memset(dst, 0, (size_t)(lo * isz));
    if (hi > lo) copy_strided(dst + lo * isz, row + (lo * step + first) * isz, hi - lo, step, isz);
    memset(dst + hi * isz, 0, (size_t)((n - hi) * isz));
}

static inline int thread_id(void) {
#ifdef _OPENMP
    return omp_get_thread_num();
#else
    return 0;
#endif
}

/* The stride's phases the taps read. Tap (i, j) reads the padded input's
 * rows a, a + sh, ... and columns b, b + sw, ... with a = i*dh % sh and
 * b = j*dw % sw. Along an axis these repeat with period sh / gcd(dh, sh)
 * (i and i + period read the same phase), so the distinct (a, b) pairs, the
 * "slots" of the padded copy, are min(kh, row period) x min(kw, column
 * period): tap (i, j) reads slot (i % row period, j % column period). All
 * of it is O(KH*KW) whatever the stride: the phases are never enumerated
 * (a stride of 2^31 has 2^62 of them). */
static int64_t mt_gcd64(int64_t a, int64_t b) {
    while (b) { const int64_t t = a % b; a = b; b = t; }
    return a;
}

static int64_t phase_period(int64_t d, int64_t s) { return s / mt_gcd64(d % s, s); }

static int64_t count_slots(const mt_conv2d_geom *g) {
    return mt_min64(g->kh, phase_period(g->dh, g->sh)) * mt_min64(g->kw, phase_period(g->dw, g->sw));
}

#elif MT_CONV_PART == MT_CONV_KERNELS   /* per dtype: T, SFX */

/* a fused conv2d's epilogue on n outputs just written (with the bias):
 * the residual added, then the activation (act.c) */
static inline void FN(epilogue)(T *d, int64_t n, const mt_conv2d_geom *g) {
    if (g->has_res) {
        const T *r = (const T *)((const char *)d + g->res_delta);
        for (int64_t i = 0; i < n; i++) d[i] += r[i];
    }
    if (g->act) MT_CAT(mt_act, SFX)(d, n, g->act);
}

/* y[n][o][:] = bias[o] (0 without bias) */
static void FN(fill_bias)(T *y, const T *bias, int64_t n, int64_t o, int64_t count, int nt) {
    #pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1 && n * o * count >= MT_NN_GRAIN)
    for (int64_t r = 0; r < n * o; r++) {
        const T v = bias ? bias[r % o] : (T)0;
        T *d = y + r * count;
        for (int64_t i = 0; i < count; i++) d[i] = v;
    }
}

/* y[r][0..cnt) += bias[r] for rows r < rows, ld elements apart */
static void FN(bias_rows)(T *y, int64_t ld, int64_t rows, int64_t cnt, const T *bias) {
    for (int64_t r = 0; r < rows; r++) {
        const T v = bias[r];
        T *d = y + r * ld;
        for (int64_t i = 0; i < cnt; i++) d[i] += v;
    }
}

/* y[r][0..cnt) = bias[r] for rows r < rows, ld elements apart */
static void FN(fill_rows)(T *y, int64_t ld, int64_t rows, int64_t cnt, const T *bias) {
    for (int64_t r = 0; r < rows; r++) {
        const T v = bias[r];
        T *d = y + r * ld;
        for (int64_t i = 0; i < cnt; i++) d[i] = v;
    }
}

#elif MT_CONV_PART == MT_CONV_RUN   /* entry points */

/* ------------------------------------------------------------ threading */
/* (OpenBLAS on OpenMP's threads, and single-threaded inside a conv's
 * region: blas_threads.c) */

/* Columns per work item: the cache budget, but small enough for about four
 * items a thread (total * others columns in all), and never below lo. */
static int64_t split_cols(int64_t budget, int64_t lo, int64_t total, int64_t others, int nt) {
    const int64_t want = (total * others + 4 * nt - 1) / (4 * nt);
    const int64_t t = mt_min64(mt_min64(budget, mt_max64(lo, want)), total);
    return mt_max64(1, t);
}

/* Output-channel blocks per group: 1, or more when the column tiles alone
 * leave threads idle (blocks keep at least 32 rows, a GEMM-friendly M). */
static int64_t o_blocks(int64_t og, int64_t items, int nt) {
    int64_t nob = 1;
    while (nt > 1 && items * nob < 3 * (int64_t)nt && og / (2 * nob) >= 32) nob *= 2;
    return nob;
}

/* Column tiles for `others` independent sets of `total` columns: at most hi
 * columns a tile, and more tiles (while they keep lo columns) until the
 * items (tiles * others) share evenly over nt threads or number 4 a thread. */
static int64_t even_tiles(int64_t total, int64_t lo, int64_t hi, int64_t others, int nt) {
    const int64_t first = (total + hi - 1) / hi;
    for (int64_t t = first; nt > 1 && (total + t - 1) / t >= lo; t++)
        if ((t * others) % nt == 0 || t * others >= 4 * (int64_t)nt) return t;
    return first;
}

/* Output-channel blocks per group: 1, or more while the items leave threads
 * idle or share unevenly (blocks keep at least 32 rows, a GEMM-friendly M). */
static int64_t o_split(int64_t og, int64_t items, int nt) {
    int64_t nob = 1;
    while (nt > 1 && items * nob < 4 * (int64_t)nt && (items * nob) % nt != 0 && og / (2 * nob) >= 32) nob *= 2;
    return nob;
}

/* y[r][0..cnt) = bias[r] for rows r < rows, ld elements apart (a GEMM then adds onto it) */
static inline void fill_rows(int dt, char *y, int64_t ld, int64_t rows, int64_t cnt, const char *bias) {
    if (dt == MT_FLOAT32) fill_rows_f32((float *)y, ld, rows, cnt, (const float *)bias);
    else fill_rows_f64((double *)y, ld, rows, cnt, (const double *)bias);
}

static inline void add_bias_rows(int dt, char *y, int64_t ld, int64_t rows, int64_t cnt, const char *bias,
                                 const mt_conv2d_geom *g) {
    if (bias) {
        if (dt == MT_FLOAT32) bias_rows_f32((float *)y, ld, rows, cnt, (const float *)bias);
        else bias_rows_f64((double *)y, ld, rows, cnt, (const double *)bias);
    }
    if (g->act || g->has_res) {   /* a fused conv2d's epilogue, on the rows GEMM just wrote */
        if (dt == MT_FLOAT32) for (int64_t r = 0; r < rows; r++) epilogue_f32((float *)y + r * ld, cnt, g);
        else for (int64_t r = 0; r < rows; r++) epilogue_f64((double *)y + r * ld, cnt, g);
    }
}

#endif
