/* The plan executor and the kernel-call capture (plan.h). */
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "plan.h"

static mt_ew_kernel mt_plan_real_elementwise = NULL;
static mt_gemm_batch_kernel mt_plan_real_gemm_batch = NULL;
static mt_gemm_kernel mt_plan_real_gemm = NULL;

void mt_plan_set_real_kernels(mt_ew_kernel ew, mt_gemm_batch_kernel gemm_batch, mt_gemm_kernel gemm) {
    mt_plan_real_elementwise = ew;
    mt_plan_real_gemm_batch = gemm_batch;
    mt_plan_real_gemm = gemm;
}

static inline char *at(char *const *bases, mt_plan_ref r) {
    return bases[r.buf] + r.off;
}

static int run_ew(const mt_plan_step *s, char *const *bases) {
    mt_ew_call c = s->u.ew.call;
    for (int a = 0; a < c.nargs; a++) {
        if (s->u.ew.ref[a].buf < 0)
            c.args[a] = (char *)&s->u.ew.scalar[a];
        else
            c.args[a] = at(bases, s->u.ew.ref[a]);
    }
    if (c.kind == MT_EW_FILL)
        c.aux = &s->u.ew.scalar[0];
    return s->u.ew.kernel(&c);
}

static int run_nn(const mt_plan_step *s, char *const *bases) {
    const mt_plan_nn *k = &s->u.nn;
    void *p[MT_PLAN_NN_PTRS];
    for (int j = 0; j < MT_PLAN_NN_PTRS; j++)
        p[j] = k->p[j].buf < 0 ? NULL : at(bases, k->p[j]);
    mt_conv2d_geom g[3];
    memcpy(g, k->g, sizeof g);
    switch (k->which) {
    case MT_NN_CONV2D_NCHWC: {
        /* x, packed, bias, y, workspace, residual */
        if (g[0].has_res) g[0].res_delta = (char *)p[5] - (char *)p[3];
        int (*f)(const float *, int, const float *, const float *, float *, const mt_conv2d_geom *,
                 int, void *) = k->kernel;
        return f(p[0], (int)k->i[0], p[1], p[2], p[3], &g[0], k->nt, p[4]);
    }
    case MT_NN_PW_DW: {
        /* x, pw_packed, pw_bias, dw_packed, dw_bias, y, workspace, residual (dw) */
        if (g[1].has_res) g[1].res_delta = (char *)p[7] - (char *)p[5];
        int (*f)(const float *, const float *, const float *, const float *, const float *, float *,
                 const mt_conv2d_geom *, const mt_conv2d_geom *, int, void *) = k->kernel;
        return f(p[0], p[1], p[2], p[3], p[4], p[5], &g[0], &g[1], k->nt, p[6]);
    }
    case MT_NN_PW_DW_PW: {
        /* x, pw_packed, pw_bias, dw_packed, dw_bias, pj_packed, pj_bias, y, workspace, residual (pj) */
        if (g[2].has_res) g[2].res_delta = (char *)p[9] - (char *)p[7];
        int (*f)(const float *, const float *, const float *, const float *, const float *,
                 const float *, const float *, float *, const mt_conv2d_geom *,
                 const mt_conv2d_geom *, const mt_conv2d_geom *, int, void *) = k->kernel;
        return f(p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], &g[0], &g[1], &g[2], k->nt, p[8]);
    }
    case MT_NN_MAX_POOL_NCHWC: {
        int (*f)(const float *, float *, const mt_pool2d_geom *, int) = k->kernel;
        return f(p[0], p[1], &k->pool, k->nt);
    }
    case MT_NN_TO_NCHWC:
    case MT_NN_FROM_NCHWC: {
        void (*f)(const float *, float *, int64_t, int64_t, int64_t, int) = k->kernel;
        f(p[0], p[1], k->i[0], k->i[1], k->i[2], k->nt);
        return 0;
    }
    case MT_NN_LAYER_NORM: {
        /* x, w, b, y */
        int (*f)(int, const void *, const void *, const void *, void *, int64_t, int64_t, double,
                 int) = k->kernel;
        return f((int)k->i[0], p[0], p[1], p[2], p[3], k->i[1], k->i[2], k->eps, k->nt);
    }
    case MT_NN_ADD_LAYER_NORM: {
        /* x, x_bias, residual, w, b, y */
        int (*f)(int, const void *, const void *, const void *, const void *, const void *, void *,
                 int64_t, int64_t, double, int) = k->kernel;
        return f((int)k->i[0], p[0], p[1], p[2], p[3], p[4], p[5], k->i[1], k->i[2], k->eps, k->nt);
    }
    case MT_NN_BIAS_ACT: {
        /* y (in place), bias */
        int (*f)(int, void *, int64_t, int64_t, const void *, int, int) = k->kernel;
        return f((int)k->i[0], p[0], k->i[1], k->i[2], p[1], (int)k->i[3], k->nt);
    }
    case MT_NN_CONV2D: {
        /* x, weight, bias, y, workspace, residual */
        if (g[0].has_res) g[0].res_delta = (char *)p[5] - (char *)p[3];
        int (*f)(int, const void *, const void *, const void *, void *, const mt_conv2d_geom *, int,
                 int, void *) = k->kernel;
        return f((int)k->i[0], p[0], p[1], p[2], p[3], &g[0], (int)k->i[1], k->nt, p[4]);
    }
    case MT_NN_CONV2D_PACKED: {
        /* x, packed, bias, y, workspace, residual */
        if (g[0].has_res) g[0].res_delta = (char *)p[5] - (char *)p[3];
        int (*f)(int, const void *, const void *, const void *, void *, const mt_conv2d_geom *, int,
                 int, int, void *) = k->kernel;
        return f((int)k->i[0], p[0], p[1], p[2], p[3], &g[0], (int)k->i[1], (int)k->i[2], k->nt, p[4]);
    }
    case MT_NN_CONV3D: {
        /* x, weight, bias, y */
        int (*f)(int, const void *, const void *, const void *, void *, const mt_conv3d_geom *, int) =
            k->kernel;
        return f((int)k->i[0], p[0], p[1], p[2], p[3], &k->g3, k->nt);
    }
    case MT_NN_LSTM_CELL: {
        /* gx, h, c, w_hh, b_hh, h_out, c_out */
        int (*f)(int, const void *, const void *, const void *, const void *, const void *, void *,
                 void *, int64_t, int64_t, int64_t, int) = k->kernel;
        return f((int)k->i[0], p[0], p[1], p[2], p[3], p[4], p[5], p[6], k->i[1], k->i[2], k->i[3],
                 k->nt);
    }
    case MT_NN_RNN_CELL: {
        /* gx, h, w_hh, b_hh, h_out */
        int (*f)(int, int, const void *, const void *, const void *, const void *, void *, int64_t,
                 int64_t, int) = k->kernel;
        return f((int)k->i[0], (int)k->i[1], p[0], p[1], p[2], p[3], p[4], k->i[2], k->i[3], k->nt);
    }
    case MT_NN_LRN: {
        /* x, y */
        int (*f)(int, const void *, void *, int64_t, int64_t, int64_t, int64_t, double, double,
                 double, int) = k->kernel;
        return f((int)k->i[0], p[0], p[1], k->i[1], k->i[2], k->i[3], k->i[4], k->eps, k->f[0],
                 k->f[1], k->nt);
    }
    case MT_NN_CONV_TRANSPOSE2D: {
        /* x, weight, bias, y, workspace */
        int (*f)(int, const void *, const void *, const void *, void *, const mt_conv2d_geom *, int,
                 void *) = k->kernel;
        return f((int)k->i[0], p[0], p[1], p[2], p[3], &g[0], k->nt, p[4]);
    }
    case MT_NN_MAX_POOL2D:
    case MT_NN_AVG_POOL2D: {
        int (*f)(int, const void *, void *, const mt_pool2d_geom *, int) = k->kernel;
        return f((int)k->i[0], p[0], p[1], &k->pool, k->nt);
    }
    case MT_NN_ADAPTIVE_POOL2D: {
        int (*f)(int, int, const void *, void *, int64_t, int64_t, int64_t, int64_t, int64_t, int) =
            k->kernel;
        return f((int)k->i[0], (int)k->i[1], p[0], p[1], k->i[2], k->i[3], k->i[4], k->i[5], k->i[6],
                 k->nt);
    }
    case MT_NN_RESIZE2D: {
        int (*f)(int, int, const void *, void *, int64_t, int64_t, int64_t, int64_t, int64_t, double,
                 double, int, int) = k->kernel;
        return f((int)k->i[0], (int)k->i[1], p[0], p[1], k->i[2], k->i[3], k->i[4], k->i[5], k->i[6],
                 k->f[0], k->f[1], (int)k->i[7], k->nt);
    }
    case MT_NN_PAD_INDEX: {
        /* x, y */
        int (*f)(const void *, void *, int, const int64_t *, const int64_t *, const int64_t *, int,
                 int64_t, int) = k->kernel;
        return f(p[0], p[1], (int)k->i[0], k->pad[0], k->pad[1], k->pad[2], (int)k->i[1], k->i[2], k->nt);
    }
    case MT_NN_ATTENTION: {
        /* q, k, v, mask, out, workspace */
        int (*f)(const float *, const float *, const float *, const float *, float *,
                 const mt_attn_geom *, int, void *) = k->kernel;
        return f(p[0], p[1], p[2], p[3], p[4], &k->attn, k->nt, p[5]);
    }
    }
    return -1;
}

static int run_gemm(const mt_plan_step *s, char *const *bases) {
    const int64_t *o = s->u.gemm.offs;
    int64_t b = s->u.gemm.batch;
    return s->u.gemm.kernel(s->u.gemm.dtype, &s->u.gemm.shape, at(bases, s->u.gemm.a),
                            at(bases, s->u.gemm.b), at(bases, s->u.gemm.c), o, o + b, o + 2 * b,
                            b, s->u.gemm.nt);
}

static int run_gather(const mt_plan_gather *g, char *const *bases) {
    const char *ix = at(bases, g->idx), *src = at(bases, g->src);
    char *out = at(bases, g->out);
    for (int64_t i = 0; i < g->n; i++) {
        int64_t r;
        switch (g->isz) {
        case 1: r = g->is_signed ? (int64_t)((const int8_t *)ix)[i] : (int64_t)((const uint8_t *)ix)[i]; break;
        case 2: r = g->is_signed ? (int64_t)((const int16_t *)ix)[i] : (int64_t)((const uint16_t *)ix)[i]; break;
        case 4: r = g->is_signed ? (int64_t)((const int32_t *)ix)[i] : (int64_t)((const uint32_t *)ix)[i]; break;
        default: {
            const int64_t v = ((const int64_t *)ix)[i];
            if (!g->is_signed && v < 0) return 1;        /* a uint64 index beyond int64 */
            r = v;
        }
        }
        if (r < 0) r += g->rows;
        if (r < 0 || r >= g->rows) return 1;
        memcpy(out + i * g->row_bytes, src + r * g->src_stride, (size_t)g->row_bytes);
    }
    return 0;
}

/* a conv of an MT_Q_BLOCK step, from its pointers and integers */
static mt_qblock_conv qblock_conv(char *const *p, const int64_t *i, int depthwise) {
    mt_qblock_conv c = {(const int8_t *)p[0], 0, NULL, NULL, NULL, 0, 0, 0, 0, 1, 0};
    if (depthwise) {            /* p: w bias mult; i: out_zp lo hi path */
        c.bias = (const int32_t *)p[1];
        c.mult = (const double *)p[2];
        c.out_zp = (int32_t)i[0], c.lo = (int32_t)i[1], c.hi = (int32_t)i[2];
        c.path = (int)i[3];
        return c;
    }
    /* p: w wsum bias mult; i: lw Co out_zp lo hi out_u8 path */
    c.wsum = (const int32_t *)p[1];
    c.bias = (const int32_t *)p[2];
    c.mult = (const double *)p[3];
    c.lw = i[0], c.Co = i[1];
    c.out_zp = (int32_t)i[2], c.lo = (int32_t)i[3], c.hi = (int32_t)i[4];
    c.out_u8 = (int)i[5], c.path = (int)i[6];
    return c;
}

static int run_qblock(const mt_quant_kernels *k, char *const *p, const int64_t *i,
                      const double *f) {
    mt_qblock_conv e = qblock_conv(p + 1, i + 5, 0);
    mt_qblock_conv d = qblock_conv(p + 6, i + 22, 1);
    mt_qblock_conv w = qblock_conv(p + 10, i + 26, 0);
    d.Co = e.Co;
    mt_qblock_add add = {p[15], p[16], (int)i[33], (int)i[34], (int)i[35], (int)i[36], (int)i[37],
                         (int)i[38], (float)f[0], (float)f[1], (float)f[2], (float)f[3],
                         (float)f[4], (float)f[5], (float)f[6], (float)f[7]};
    return k->block_u8s8((const uint8_t *)p[0], i[0], i[1], i[2], i[3], (int32_t)i[4],
                         p[1] ? &e : NULL, &d, i + 12, &w, (uint8_t *)p[5], (uint8_t *)p[9],
                         p[14], p[16] ? &add : NULL)
           ? 0 : MT_BK_ENOMEM;
}

/* an int8 kernel call (mt_plan_quant); the argument layout is qint8.pyx's
 * record of the call */
static int run_quant(const mt_plan_quant *q, char *const *bases) {
    const mt_quant_kernels *k = q->k;
    const int64_t *i = q->i;
    const double *f = q->f;
    char *p[MT_PLAN_Q_PTRS];
    for (int j = 0; j < MT_PLAN_Q_PTRS; j++)
        p[j] = q->p[j].buf < 0 ? NULL : at(bases, q->p[j]);
    k->set_threads(q->nt);
    switch (q->which) {
    case MT_Q_GEMM:      /* a packed wsum bias mult out; M N K lda a_zp out_zp lo hi out_u8 ldo_m ldo_n path */
        k->gemm_u8s8(i[0], i[1], i[2], (const uint8_t *)p[0], i[3], (int32_t)i[4],
                     (const int8_t *)p[1], (const int32_t *)p[2], (const int32_t *)p[3],
                     (const double *)p[4], (int32_t)i[5], (int32_t)i[6], (int32_t)i[7],
                     (int)i[8], p[5], i[9], i[10], (int)i[11]);
        return 0;
    case MT_Q_CONV:      /* x wrows wsum bias mult out; NB C H W a_zp lw Co G KH KW SH SW PH PW
                          * DH DW OH OW out_zp lo hi out_u8 path */
        return k->conv_u8s8((const uint8_t *)p[0], i[0], i[1], i[2], i[3], (int32_t)i[4],
                            (const int8_t *)p[1], i[5], (const int32_t *)p[2], i[6], i[7], i[8],
                            i[9], i[10], i[11], i[12], i[13], i[14], i[15], i[16], i[17],
                            (const int32_t *)p[3], (const double *)p[4], (int32_t)i[18],
                            (int32_t)i[19], (int32_t)i[20], (int)i[21], p[5], (int)i[22])
               ? 0 : MT_BK_ENOMEM;
    case MT_Q_DWCONV: {  /* x w bias mult out; NB C H W a_zp KH KW SH SW PH PW DH DW OH OW
                          * out_zp lo hi out_u8 path: the vector kernel, else the general one */
        int done = 0;
        if (i[19] != 1)
            done = k->dwconv_vec_u8s8((const uint8_t *)p[0], i[0], i[1], i[2], i[3],
                                      (int32_t)i[4], (const int8_t *)p[1], i[5], i[6], i[7], i[8],
                                      i[9], i[10], i[11], i[12], i[13], i[14],
                                      (const int32_t *)p[2], (const double *)p[3], (int32_t)i[15],
                                      (int32_t)i[16], (int32_t)i[17], (int)i[18], p[4], (int)i[19]);
        if (!done)
            k->dwconv_u8s8((const uint8_t *)p[0], i[0], i[1], i[2], i[3], (int32_t)i[4],
                           (const int8_t *)p[1], i[5], i[6], i[7], i[8], i[9], i[10], i[11],
                           i[12], i[13], i[14], (const int32_t *)p[2], (const double *)p[3],
                           (int32_t)i[15], (int32_t)i[16], (int32_t)i[17], (int)i[18], p[4]);
        return 0;
    }
    case MT_Q_QUANTIZE:  /* x out; n kind path; scale zp lo hi */
        k->quantize_f32((const float *)p[0], i[0], (float)f[0], (float)f[1], (float)f[2],
                        (float)f[3], (int)i[1], p[1], (int)i[2]);
        return 0;
    case MT_Q_DEQUANTIZE:    /* q out; kind n; scale zp */
        k->dequantize_f32(p[0], (int)i[0], i[1], (float)f[0], (float)f[1], (float *)p[1]);
        return 0;
    case MT_Q_ADD:       /* a b out; ak bk n relu ok path; as az bs bz os oz lo hi */
        k->add_u8(p[0], (int)i[0], (float)f[0], (float)f[1], p[1], (int)i[1], (float)f[2],
                  (float)f[3], i[2], (float)f[4], (float)f[5], (float)f[6], (float)f[7],
                  (int)i[3], p[2], (int)i[4], (int)i[5]);
        return 0;
    case MT_Q_MAXPOOL:   /* x out; planes H W KH KW SH SW PH PW DH DW OH OW */
        return k->maxpool2d_u8((const uint8_t *)p[0], i[0], i[1], i[2], i[3], i[4], i[5], i[6],
                               i[7], i[8], i[9], i[10], i[11], i[12], (uint8_t *)p[1])
               ? 0 : MT_BK_ENOMEM;
    case MT_Q_AVGPOOL:   /* x ys ye dy xs xe dx out; is_s8 planes H W OH OW zp lo hi */
        return k->avgpool2d(p[0], (int)i[0], i[1], i[2], i[3], i[4], i[5],
                            (const int64_t *)p[1], (const int64_t *)p[2], (const int64_t *)p[3],
                            (const int64_t *)p[4], (const int64_t *)p[5], (const int64_t *)p[6],
                            (int32_t)i[6], (int32_t)i[7], (int32_t)i[8], p[7])
               ? 0 : MT_BK_ENOMEM;
    case MT_Q_CONCAT: {  /* out kinds scales zps inner tables x0 x1 ...; n_in outer ok; os oz lo hi */
        const void *xs[MT_PLAN_Q_CONCAT_INPUTS];
        int n_in = (int)i[0];
        if (n_in < 1 || n_in > MT_PLAN_Q_CONCAT_INPUTS)
            return MT_BK_ENOKERNEL;
        for (int j = 0; j < n_in; j++)
            xs[j] = p[6 + j];
        k->concat_u8(n_in, xs, (const int *)p[1], (const float *)p[2], (const float *)p[3],
                     (const int64_t *)p[4], i[1], (float)f[0], (float)f[1], (float)f[2],
                     (float)f[3], (int)i[2], (uint8_t *)p[5], p[0]);
        return 0;
    }
    case MT_Q_FLIP:      /* x out; n */
        k->flip_s8((const int8_t *)p[0], i[0], (uint8_t *)p[1]);
        return 0;
    case MT_Q_BLOCK:     /* x ew ewsum ebias emult mid1 dw dbias dmult mid2 pw pwsum pbias pmult
                          * out [other add_out] (no expand: its four NULL); NB C H W a_zp;
                          * expand: lw Co out_zp lo hi out_u8 path; depthwise: KH KW SH SW
                          * PH PW DH DW OH OW out_zp lo hi path; project: lw Co out_zp lo hi
                          * out_u8 path; [add: y_first y_kind other_kind
                          * out_kind relu path; y_scale y_zp other_scale other_zp out_scale
                          * out_zp lo hi] (plan/_qblock.py) */
        return run_qblock(k, p, i, f);
    default: return MT_BK_ENOKERNEL;
    }
}

static inline int run_step(const mt_plan_step *s, char *const *bases, mt_plan_callback callback,
                           void *ctx) {
    switch (s->kind) {
    case MT_STEP_EW: return run_ew(s, bases);
    case MT_STEP_GEMM: return run_gemm(s, bases);
    case MT_STEP_NN: return run_nn(s, bases);
    case MT_STEP_REDUCE:
        return s->u.red.kernel(at(bases, s->u.red.in), at(bases, s->u.red.out), &s->u.red.g,
                               s->u.red.nt);
    case MT_STEP_GATHER: return run_gather(&s->u.gather, bases);
    case MT_STEP_QUANT: return run_quant(&s->u.quant, bases);
    default: return callback(ctx, s->index) ? -1000 : 0;
    }
}

int mt_plan_run(const mt_plan_step *steps, int64_t n, char *const *bases,
                mt_plan_callback callback, void *ctx, int64_t *failed) {
    for (int64_t i = 0; i < n; i++) {
        int rc = run_step(&steps[i], bases, callback, ctx);
        if (rc != 0) {
            *failed = i;
            return rc;
        }
    }
    return 0;
}

static int64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

int mt_plan_run_timed(const mt_plan_step *steps, int64_t n, char *const *bases,
                      mt_plan_callback callback, void *ctx, int64_t *failed, int64_t *ns) {
    int64_t t0 = now_ns();
    for (int64_t i = 0; i < n; i++) {
        int rc = run_step(&steps[i], bases, callback, ctx);
        int64_t t1 = now_ns();
        ns[i] = t1 - t0;
        t0 = t1;
        if (rc != 0) {
            *failed = i;
            return rc;
        }
    }
    return 0;
}

/* ---- capture ---- */
static __thread int cap_on = 0;
static __thread int cap_n = 0;        /* -1: unusable */
static __thread mt_plan_captured cap[MT_PLAN_MAX_CAPTURE];
#define MT_PLAN_MAX_ALLOCS 16
static __thread int alloc_n = 0;
static __thread uintptr_t alloc_ptr[MT_PLAN_MAX_ALLOCS];
static __thread int64_t alloc_bytes[MT_PLAN_MAX_ALLOCS];

/* the capture cannot be replayed: free what it holds, keep it marked */
static void poison(void) {
    mt_plan_capture_end();
    cap_on = 1;
    cap_n = -1;
}

static mt_plan_captured *next_slot(void) {
    if (cap_n < 0)
        return NULL;
    if (cap_n >= MT_PLAN_MAX_CAPTURE) {
        poison();
        return NULL;
    }
    mt_plan_captured *c = &cap[cap_n++];
    memset(c, 0, sizeof *c);
    return c;
}

void mt_plan_capture_begin(void) {
    mt_plan_capture_end();
    cap_on = 1;
    cap_n = 0;
    alloc_n = 0;
}

int mt_plan_capture_count(void) {
    return cap_n;
}

const mt_plan_captured *mt_plan_capture_get(int i) {
    return (i >= 0 && i < cap_n) ? &cap[i] : NULL;
}

void mt_plan_capture_end(void) {
    for (int i = 0; i < cap_n; i++) {
        free(cap[i].offs);
        cap[i].offs = NULL;
    }
    cap_n = 0;
    cap_on = 0;
}

static int64_t itemsize_of(int dtype) {
    static const int64_t sizes[MT_NDTYPES] = {1, 1, 1, 2, 2, 4, 8, 2, 2, 4, 8};
    return (dtype >= 0 && dtype < MT_NDTYPES) ? sizes[dtype] : 8;
}

int mt_plan_capture_elementwise(const mt_ew_call *call) {
    if (cap_on) {
        mt_plan_captured *c = next_slot();
        if (c != NULL) {
            c->kind = MT_STEP_EW;
            c->ew = *call;
            c->ew_kernel = mt_plan_real_elementwise;
            /* host scalars live on the caller's stack: keep their values
             * (the compute dtype's width; CAST reads its source dtype) */
            for (int a = 1; a < call->nargs; a++)
                if (call->scalar_mask & (1u << (a - 1)))
                    memcpy(&c->ew_scalar[a], call->args[a], (size_t)itemsize_of(call->dtype));
            if (call->kind == MT_EW_FILL && call->aux != NULL)
                memcpy(&c->ew_scalar[0], call->aux, (size_t)itemsize_of(call->dtype2));
            else if (call->aux != NULL)
                poison();            /* an op parameter of unknown size: not replayable */
        }
    }
    return mt_plan_real_elementwise(call);
}

int mt_plan_capture_gemm_batch(int dtype, const mt_gemm_shape *s, const char *a, const char *b,
                               char *c, const int64_t *a_off, const int64_t *b_off,
                               const int64_t *c_off, int64_t batch, int nt) {
    if (cap_on) {
        mt_plan_captured *k = next_slot();
        if (k != NULL) {
            k->kind = MT_STEP_GEMM;
            k->dtype = dtype;
            k->nt = nt;
            k->shape = *s;
            k->a = a;
            k->b = b;
            k->c = c;
            k->batch = batch;
            k->gemm_kernel = mt_plan_real_gemm_batch;
            k->offs = malloc(sizeof(int64_t) * 3 * (size_t)(batch > 0 ? batch : 1));
            if (k->offs == NULL) {
                poison();
            } else {
                for (int64_t i = 0; i < batch; i++) {
                    k->offs[i] = a_off[i];
                    k->offs[batch + i] = b_off[i];
                    k->offs[2 * batch + i] = c_off[i];
                }
            }
        }
    }
    return mt_plan_real_gemm_batch(dtype, s, a, b, c, a_off, b_off, c_off, batch, nt);
}

int mt_plan_capture_gemm(int dtype, const mt_gemm_shape *s, const char *a, const char *b, char *c,
                         int64_t batch, int64_t stride_a, int64_t stride_b, int64_t stride_c) {
    if (cap_on && cap_n >= 0)
        poison();                   /* a kernel the plan does not replay */
    return mt_plan_real_gemm(dtype, s, a, b, c, batch, stride_a, stride_b, stride_c);
}

/* ---- nn members and the allocator ---- */
static const mt_nn_kernels *real_nn = NULL;
static mt_storage *(*real_alloc)(int index, size_t nbytes) = NULL;

int mt_plan_capture_allocs(void) {
    return alloc_n;
}

void mt_plan_capture_alloc_get(int i, uintptr_t *ptr, int64_t *nbytes) {
    *ptr = alloc_ptr[i];
    *nbytes = alloc_bytes[i];
}

mt_storage *mt_plan_capture_alloc(int index, size_t nbytes) {
    mt_storage *st = real_alloc(index, nbytes);
    if (cap_on && st != NULL && alloc_n < MT_PLAN_MAX_ALLOCS) {
        alloc_ptr[alloc_n] = (uintptr_t)st->ptr;
        alloc_bytes[alloc_n] = (int64_t)nbytes;
        alloc_n++;
    }
    return st;
}

void mt_plan_set_real_alloc(mt_storage *(*real)(int index, size_t nbytes)) {
    real_alloc = real;
}

static mt_plan_nn *nn_slot(int which, void *kernel, int np, int nt) {
    if (!cap_on)
        return NULL;
    mt_plan_captured *c = next_slot();
    if (c == NULL)
        return NULL;
    c->kind = MT_STEP_NN;
    c->nn.which = which;
    c->nn.kernel = kernel;
    c->nn.np = np;
    c->nn.nt = nt;
    for (int j = 0; j < MT_PLAN_NN_PTRS; j++) {
        c->nn.p[j].buf = -1;
        c->nn.p[j].off = 0;
    }
    return &c->nn;
}

static void put(mt_plan_nn *k, int j, const void *p) {
    k->p[j].off = (int64_t)(uintptr_t)p;
}

static int cap_conv2d_nchwc(const float *x, int blocked, const float *packed, const float *bias, float *y,
                            const mt_conv2d_geom *g, int nt, void *ws) {
    mt_plan_nn *k = nn_slot(MT_NN_CONV2D_NCHWC, (void *)real_nn->conv2d_nchwc, 6, nt);
    if (k) {
        put(k, 0, x); put(k, 1, packed); put(k, 2, bias); put(k, 3, y); put(k, 4, ws);
        if (g->has_res) put(k, 5, (const char *)y + g->res_delta);
        k->g[0] = *g;
        k->i[0] = blocked;
    }
    return real_nn->conv2d_nchwc(x, blocked, packed, bias, y, g, nt, ws);
}

static int cap_pw_dw(const float *x, const float *pwp, const float *pwb, const float *dwp, const float *dwb,
                     float *y, const mt_conv2d_geom *pw, const mt_conv2d_geom *dw, int nt, void *ws) {
    mt_plan_nn *k = nn_slot(MT_NN_PW_DW, (void *)real_nn->conv2d_nchwc_pw_dw, 8, nt);
    if (k) {
        put(k, 0, x); put(k, 1, pwp); put(k, 2, pwb); put(k, 3, dwp); put(k, 4, dwb); put(k, 5, y);
        put(k, 6, ws);
        if (dw->has_res) put(k, 7, (const char *)y + dw->res_delta);
        if (pw->has_res) poison();     /* an inner residual: not replayed */
        k->g[0] = *pw;
        k->g[1] = *dw;
    }
    return real_nn->conv2d_nchwc_pw_dw(x, pwp, pwb, dwp, dwb, y, pw, dw, nt, ws);
}

static int cap_pw_dw_pw(const float *x, const float *pwp, const float *pwb, const float *dwp,
                        const float *dwb, const float *pjp, const float *pjb, float *y,
                        const mt_conv2d_geom *pw, const mt_conv2d_geom *dw, const mt_conv2d_geom *pj,
                        int nt, void *ws) {
    mt_plan_nn *k = nn_slot(MT_NN_PW_DW_PW, (void *)real_nn->conv2d_nchwc_pw_dw_pw, 10, nt);
    if (k) {
        put(k, 0, x); put(k, 1, pwp); put(k, 2, pwb); put(k, 3, dwp); put(k, 4, dwb); put(k, 5, pjp);
        put(k, 6, pjb); put(k, 7, y); put(k, 8, ws);
        if (pj->has_res) put(k, 9, (const char *)y + pj->res_delta);
        if (pw->has_res || dw->has_res) poison();
        k->g[0] = *pw;
        k->g[1] = *dw;
        k->g[2] = *pj;
    }
    return real_nn->conv2d_nchwc_pw_dw_pw(x, pwp, pwb, dwp, dwb, pjp, pjb, y, pw, dw, pj, nt, ws);
}

static int cap_max_pool_nchwc(const float *x, float *y, const mt_pool2d_geom *g, int nt) {
    mt_plan_nn *k = nn_slot(MT_NN_MAX_POOL_NCHWC, (void *)real_nn->max_pool2d_nchwc, 2, nt);
    if (k) {
        put(k, 0, x); put(k, 1, y);
        k->pool = *g;
    }
    return real_nn->max_pool2d_nchwc(x, y, g, nt);
}

static void cap_to_nchwc(const float *x, float *y, int64_t n, int64_t c, int64_t hw, int nt) {
    mt_plan_nn *k = nn_slot(MT_NN_TO_NCHWC, (void *)real_nn->to_nchwc, 2, nt);
    if (k) {
        put(k, 0, x); put(k, 1, y);
        k->i[0] = n; k->i[1] = c; k->i[2] = hw;
    }
    real_nn->to_nchwc(x, y, n, c, hw, nt);
}

static void cap_from_nchwc(const float *x, float *y, int64_t n, int64_t c, int64_t hw, int nt) {
    mt_plan_nn *k = nn_slot(MT_NN_FROM_NCHWC, (void *)real_nn->from_nchwc, 2, nt);
    if (k) {
        put(k, 0, x); put(k, 1, y);
        k->i[0] = n; k->i[1] = c; k->i[2] = hw;
    }
    real_nn->from_nchwc(x, y, n, c, hw, nt);
}

static int cap_layer_norm(int dtype, const void *x, const void *w, const void *b, void *y, int64_t rows,
                          int64_t cols, double eps, int nt) {
    mt_plan_nn *k = nn_slot(MT_NN_LAYER_NORM, (void *)real_nn->layer_norm, 4, nt);
    if (k) {
        put(k, 0, x); put(k, 1, w); put(k, 2, b); put(k, 3, y);
        k->i[0] = dtype; k->i[1] = rows; k->i[2] = cols;
        k->eps = eps;
    }
    return real_nn->layer_norm(dtype, x, w, b, y, rows, cols, eps, nt);
}

static int cap_add_layer_norm(int dtype, const void *x, const void *xb, const void *r, const void *w,
                              const void *b, void *y, int64_t rows, int64_t cols, double eps, int nt) {
    mt_plan_nn *k = nn_slot(MT_NN_ADD_LAYER_NORM, (void *)real_nn->add_layer_norm, 6, nt);
    if (k) {
        put(k, 0, x); put(k, 1, xb); put(k, 2, r); put(k, 3, w); put(k, 4, b); put(k, 5, y);
        k->i[0] = dtype; k->i[1] = rows; k->i[2] = cols;
        k->eps = eps;
    }
    return real_nn->add_layer_norm(dtype, x, xb, r, w, b, y, rows, cols, eps, nt);
}

static int cap_attention(const float *q, const float *kk, const float *v, const float *mask, float *out,
                         const mt_attn_geom *g, int nt, void *ws) {
    mt_plan_nn *k = nn_slot(MT_NN_ATTENTION, (void *)real_nn->attention_f32, 6, nt);
    if (k) {
        put(k, 0, q); put(k, 1, kk); put(k, 2, v); put(k, 3, mask); put(k, 4, out); put(k, 5, ws);
        k->attn = *g;
    }
    return real_nn->attention_f32(q, kk, v, mask, out, g, nt, ws);
}

/* NCHW convolution, pooling and resize; conv2d's workspace size passes
 * through. A member a plan does not replay poisons the capture: an op
 * that calls one stays a Python step */
static int64_t cap_conv2d_workspace(int dtype, const mt_conv2d_geom *g, int algo, int nt) {
    return real_nn->conv2d_workspace(dtype, g, algo, nt);
}
/* a call that failed or asked for another kernel (conv2d's Winograd meeting a
 * non-finite input reruns on a direct kernel outside the table): not replayed */
static int checked(int rc) {
    if (rc != 0 && cap_on) poison();
    return rc;
}
static int cap_conv2d(int dtype, const void *x, const void *w, const void *b, void *y,
                      const mt_conv2d_geom *g, int algo, int nt, void *ws) {
    mt_plan_nn *k = nn_slot(MT_NN_CONV2D, (void *)real_nn->conv2d, 6, nt);
    if (k) {
        put(k, 0, x); put(k, 1, w); put(k, 2, b); put(k, 3, y); put(k, 4, ws);
        if (g->has_res) put(k, 5, (const char *)y + g->res_delta);
        k->g[0] = *g;
        k->i[0] = dtype; k->i[1] = algo;
    }
    return checked(real_nn->conv2d(dtype, x, w, b, y, g, algo, nt, ws));
}
static int cap_max_pool2d(int dtype, const void *x, void *y, const mt_pool2d_geom *g, int nt) {
    mt_plan_nn *k = nn_slot(MT_NN_MAX_POOL2D, (void *)real_nn->max_pool2d, 2, nt);
    if (k) {
        put(k, 0, x); put(k, 1, y);
        k->pool = *g;
        k->i[0] = dtype;
    }
    return checked(real_nn->max_pool2d(dtype, x, y, g, nt));
}
static int cap_avg_pool2d(int dtype, const void *x, void *y, const mt_pool2d_geom *g, int nt) {
    mt_plan_nn *k = nn_slot(MT_NN_AVG_POOL2D, (void *)real_nn->avg_pool2d, 2, nt);
    if (k) {
        put(k, 0, x); put(k, 1, y);
        k->pool = *g;
        k->i[0] = dtype;
    }
    return checked(real_nn->avg_pool2d(dtype, x, y, g, nt));
}
static int cap_adaptive(int dtype, int op, const void *x, void *y, int64_t planes, int64_t h, int64_t w,
                        int64_t oh, int64_t ow, int nt) {
    mt_plan_nn *k = nn_slot(MT_NN_ADAPTIVE_POOL2D, (void *)real_nn->adaptive_pool2d, 2, nt);
    if (k) {
        put(k, 0, x); put(k, 1, y);
        k->i[0] = dtype; k->i[1] = op; k->i[2] = planes; k->i[3] = h; k->i[4] = w; k->i[5] = oh;
        k->i[6] = ow;
    }
    return checked(real_nn->adaptive_pool2d(dtype, op, x, y, planes, h, w, oh, ow, nt));
}
static int cap_resize(int dtype, int mode, const void *x, void *y, int64_t planes, int64_t h, int64_t w,
                      int64_t oh, int64_t ow, double sh, double sw, int ac, int nt) {
    mt_plan_nn *k = nn_slot(MT_NN_RESIZE2D, (void *)real_nn->resize2d, 2, nt);
    if (k) {
        put(k, 0, x); put(k, 1, y);
        k->i[0] = dtype; k->i[1] = mode; k->i[2] = planes; k->i[3] = h; k->i[4] = w; k->i[5] = oh;
        k->i[6] = ow; k->i[7] = ac;
        k->f[0] = sh; k->f[1] = sw;
    }
    return checked(real_nn->resize2d(dtype, mode, x, y, planes, h, w, oh, ow, sh, sw, ac, nt));
}
static int cap_bias_act(int dtype, void *y, int64_t rows, int64_t cols, const void *bias, int act, int nt) {
    mt_plan_nn *k = nn_slot(MT_NN_BIAS_ACT, (void *)real_nn->bias_act, 2, nt);
    if (k) {
        put(k, 0, y); put(k, 1, bias);
        k->i[0] = dtype; k->i[1] = rows; k->i[2] = cols; k->i[3] = act;
    }
    return real_nn->bias_act(dtype, y, rows, cols, bias, act, nt);
}
static int cap_conv_t(int dtype, const void *x, const void *w, const void *b, void *y,
                      const mt_conv2d_geom *g, int nt, void *ws) {
    mt_plan_nn *k = nn_slot(MT_NN_CONV_TRANSPOSE2D, (void *)real_nn->conv_transpose2d, 5, nt);
    if (k) {
        put(k, 0, x); put(k, 1, w); put(k, 2, b); put(k, 3, y); put(k, 4, ws);
        k->g[0] = *g;
        k->i[0] = dtype;
    }
    return checked(real_nn->conv_transpose2d(dtype, x, w, b, y, g, nt, ws));
}
static int cap_pad_index(const void *x, void *y, int ndim, const int64_t *shape, const int64_t *before,
                         const int64_t *after, int mode, int64_t itemsize, int nt) {
    if (cap_on && (ndim < 0 || ndim > MT_PLAN_PAD_DIMS)) {
        poison();                   /* more axes than a step holds: a Python step */
    } else {
        mt_plan_nn *k = nn_slot(MT_NN_PAD_INDEX, (void *)real_nn->pad_index, 2, nt);
        if (k) {
            put(k, 0, x); put(k, 1, y);
            k->i[0] = ndim; k->i[1] = mode; k->i[2] = itemsize;
            for (int d = 0; d < ndim; d++) {
                k->pad[0][d] = shape[d]; k->pad[1][d] = before[d]; k->pad[2][d] = after[d];
            }
        }
    }
    return checked(real_nn->pad_index(x, y, ndim, shape, before, after, mode, itemsize, nt));
}
static int cap_conv2d_packed(int dtype, const void *x, const void *packed, const void *bias, void *y,
                             const mt_conv2d_geom *g, int algo, int layout, int nt, void *ws) {
    mt_plan_nn *k = nn_slot(MT_NN_CONV2D_PACKED, (void *)real_nn->conv2d_packed, 6, nt);
    if (k) {
        put(k, 0, x); put(k, 1, packed); put(k, 2, bias); put(k, 3, y); put(k, 4, ws);
        if (g->has_res) put(k, 5, (const char *)y + g->res_delta);
        k->g[0] = *g;
        k->i[0] = dtype; k->i[1] = algo; k->i[2] = layout;
    }
    return checked(real_nn->conv2d_packed(dtype, x, packed, bias, y, g, algo, layout, nt, ws));
}

static int cap_conv3d(int dtype, const void *x, const void *w, const void *b, void *y,
                      const mt_conv3d_geom *g, int nt) {
    mt_plan_nn *k = nn_slot(MT_NN_CONV3D, (void *)real_nn->conv3d, 4, nt);
    if (k) {
        put(k, 0, x); put(k, 1, w); put(k, 2, b); put(k, 3, y);
        k->g3 = *g;
        k->i[0] = dtype;
    }
    return checked(real_nn->conv3d(dtype, x, w, b, y, g, nt));
}
static int cap_lstm_cell(int dtype, const void *gx, const void *h, const void *c, const void *w_hh,
                         const void *b_hh, void *h_out, void *c_out, int64_t n, int64_t hidden,
                         int64_t h_width, int nt) {
    mt_plan_nn *k = nn_slot(MT_NN_LSTM_CELL, (void *)real_nn->lstm_cell, 7, nt);
    if (k) {
        put(k, 0, gx); put(k, 1, h); put(k, 2, c); put(k, 3, w_hh); put(k, 4, b_hh);
        put(k, 5, h_out); put(k, 6, c_out);
        k->i[0] = dtype; k->i[1] = n; k->i[2] = hidden; k->i[3] = h_width;
    }
    return checked(real_nn->lstm_cell(dtype, gx, h, c, w_hh, b_hh, h_out, c_out, n, hidden, h_width, nt));
}
static int cap_rnn_cell(int dtype, int relu, const void *gx, const void *h, const void *w_hh,
                        const void *b_hh, void *h_out, int64_t n, int64_t hidden, int nt) {
    mt_plan_nn *k = nn_slot(MT_NN_RNN_CELL, (void *)real_nn->rnn_cell, 5, nt);
    if (k) {
        put(k, 0, gx); put(k, 1, h); put(k, 2, w_hh); put(k, 3, b_hh); put(k, 4, h_out);
        k->i[0] = dtype; k->i[1] = relu; k->i[2] = n; k->i[3] = hidden;
    }
    return checked(real_nn->rnn_cell(dtype, relu, gx, h, w_hh, b_hh, h_out, n, hidden, nt));
}
static int cap_lrn(int dtype, const void *x, void *y, int64_t outer, int64_t c, int64_t inner,
                   int64_t n, double kk, double alpha, double beta, int nt) {
    mt_plan_nn *k = nn_slot(MT_NN_LRN, (void *)real_nn->lrn, 2, nt);
    if (k) {
        put(k, 0, x); put(k, 1, y);
        k->i[0] = dtype; k->i[1] = outer; k->i[2] = c; k->i[3] = inner; k->i[4] = n;
        k->eps = kk; k->f[0] = alpha; k->f[1] = beta;
    }
    return checked(real_nn->lrn(dtype, x, y, outer, c, inner, n, kk, alpha, beta, nt));
}

/* plan.pyx keeps the wrapped copy in a 4096-byte buffer */
_Static_assert(sizeof(mt_nn_kernels) <= 4096, "plan.pyx's _wrapped_nn is too small for mt_nn_kernels");

void mt_plan_set_real_nn(const mt_nn_kernels *real, mt_nn_kernels *w) {
    real_nn = real;
    *w = *real;
#define WRAP(member, fn) if (real->member != NULL) w->member = fn
    WRAP(conv2d_nchwc, cap_conv2d_nchwc);
    WRAP(conv2d_nchwc_pw_dw, cap_pw_dw);
    WRAP(conv2d_nchwc_pw_dw_pw, cap_pw_dw_pw);
    WRAP(max_pool2d_nchwc, cap_max_pool_nchwc);
    WRAP(to_nchwc, cap_to_nchwc);
    WRAP(from_nchwc, cap_from_nchwc);
    WRAP(layer_norm, cap_layer_norm);
    WRAP(attention_f32, cap_attention);
    WRAP(conv2d_workspace, cap_conv2d_workspace);
    WRAP(conv2d, cap_conv2d);
    WRAP(max_pool2d, cap_max_pool2d);
    WRAP(avg_pool2d, cap_avg_pool2d);
    WRAP(adaptive_pool2d, cap_adaptive);
    WRAP(resize2d, cap_resize);
    WRAP(bias_act, cap_bias_act);
    WRAP(conv_transpose2d, cap_conv_t);
    WRAP(pad_index, cap_pad_index);
    WRAP(conv2d_packed, cap_conv2d_packed);
    WRAP(conv3d, cap_conv3d);
    WRAP(lstm_cell, cap_lstm_cell);
    WRAP(rnn_cell, cap_rnn_cell);
    WRAP(lrn, cap_lrn);
    WRAP(add_layer_norm, cap_add_layer_norm);
#undef WRAP
}

/* ---- the reduce table ----
 * A reduce-table entry is called without its (op, dtype): one wrapper per
 * entry, each knowing its own, records the call and runs the real one. */
static mt_reduce_fn real_reduce[MT_NREDUCE][MT_NDTYPES];
static mt_reduce_fn wrapped_reduce[MT_NREDUCE][MT_NDTYPES];

static int cap_reduce(int op, int dt, const char *in, char *out, const mt_reduce_geom *g, int nt) {
    if (cap_on) {
        mt_plan_captured *c = next_slot();
        if (c != NULL) {
            c->kind = MT_STEP_REDUCE;
            c->red.nt = nt;
            c->red.kernel = real_reduce[op][dt];
            c->red.in.buf = c->red.out.buf = -1;
            c->red.in.off = (int64_t)(uintptr_t)in;
            c->red.out.off = (int64_t)(uintptr_t)out;
            c->red.g = *g;
        }
    }
    return real_reduce[op][dt](in, out, g, nt);
}

_Static_assert(MT_NDTYPES == 13, "plan.c's reduce wrappers cover 13 dtype codes");
#define MT_PLAN_RW(op, dt)                                                                    \
    static int cap_reduce_##op##_##dt(const char *in, char *out, const mt_reduce_geom *g, int nt) { \
        return cap_reduce(op, dt, in, out, g, nt);                                          \
    }
#define MT_PLAN_RW_OP(op)                                                                     \
    MT_PLAN_RW(op, 0) MT_PLAN_RW(op, 1) MT_PLAN_RW(op, 2) MT_PLAN_RW(op, 3) MT_PLAN_RW(op, 4) \
    MT_PLAN_RW(op, 5) MT_PLAN_RW(op, 6) MT_PLAN_RW(op, 7) MT_PLAN_RW(op, 8) MT_PLAN_RW(op, 9) \
    MT_PLAN_RW(op, 10) MT_PLAN_RW(op, 11) MT_PLAN_RW(op, 12)
#define MT_PLAN_RROW(op)                                                                      \
    {cap_reduce_##op##_0, cap_reduce_##op##_1, cap_reduce_##op##_2, cap_reduce_##op##_3,     \
     cap_reduce_##op##_4, cap_reduce_##op##_5, cap_reduce_##op##_6, cap_reduce_##op##_7,     \
     cap_reduce_##op##_8, cap_reduce_##op##_9, cap_reduce_##op##_10, cap_reduce_##op##_11,   \
     cap_reduce_##op##_12},
#define MT_PLAN_RW_NAMED(name, rule) MT_PLAN_RW_OP(MT_R_##name)
MT_REDUCE_OPS(MT_PLAN_RW_NAMED)
#define MT_PLAN_RROW_NAMED(name, rule) MT_PLAN_RROW(MT_R_##name)
static mt_reduce_fn const cap_reduce_fns[MT_NREDUCE][MT_NDTYPES] = {MT_REDUCE_OPS(MT_PLAN_RROW_NAMED)};

void mt_plan_set_real_reduce(const mt_reduce_kernels *real, mt_reduce_kernels *w) {
    *w = *real;
    if (real->reduce == NULL)
        return;
    for (int op = 0; op < MT_NREDUCE; op++)
        for (int dt = 0; dt < MT_NDTYPES; dt++) {
            real_reduce[op][dt] = real->reduce[op][dt];
            wrapped_reduce[op][dt] = real->reduce[op][dt] != NULL ? cap_reduce_fns[op][dt] : NULL;
        }
    w->reduce = wrapped_reduce;
}

/* plan.pyx keeps the wrapped reduce table in a 256-byte buffer */
_Static_assert(sizeof(mt_reduce_kernels) <= 256, "plan.pyx's _wrapped_reduce is too small");
