/* The plan executor and the kernel-call capture (plan.h). */
#include <stdlib.h>
#include <string.h>
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

static int run_gemm(const mt_plan_step *s, char *const *bases) {
    const int64_t *o = s->u.gemm.offs;
    int64_t b = s->u.gemm.batch;
    return s->u.gemm.kernel(s->u.gemm.dtype, &s->u.gemm.shape, at(bases, s->u.gemm.a),
                            at(bases, s->u.gemm.b), at(bases, s->u.gemm.c), o, o + b, o + 2 * b,
                            b, s->u.gemm.nt);
}

int mt_plan_run(const mt_plan_step *steps, int64_t n, char *const *bases,
                mt_plan_callback callback, void *ctx, int64_t *failed) {
    for (int64_t i = 0; i < n; i++) {
        const mt_plan_step *s = &steps[i];
        int rc;
        switch (s->kind) {
        case MT_STEP_EW: rc = run_ew(s, bases); break;
        case MT_STEP_GEMM: rc = run_gemm(s, bases); break;
        default: rc = callback(ctx, s->index) ? -1000 : 0; break;
        }
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
