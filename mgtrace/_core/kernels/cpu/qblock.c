/* Int8 inverted residual blocks in one call (issue 32): MobileNetV2's
 * 1x1 expand, depthwise and 1x1 project convs, each MobileNetV2 block's
 * three int8 layers, as one parallel region with one barrier per image.
 *
 * Run as three calls, each conv splits its work its own way over the team
 * (the expand by pixel blocks, the depthwise by planes, the projection by
 * pixels or channels), so each reads most of its input from the other
 * core's cache, and the team meets three times. At MobileNetV2's sizes
 * that cost more than the second thread saved: its 28x28 and smaller
 * projections ran 1.2-1.5x slower on two threads than on one. Here, input
 * planes of at most 28x28 go by channels:
 *
 *   phase 1: each thread takes a range of the E expanded channels (whole
 *            multiples of 16, the AMX tile's half) and runs the expand and
 *            the depthwise conv on it, so the depthwise planes it reads are
 *            the ones it just wrote (the depthwise conv is per channel);
 *   barrier: mid2 is whole;
 *   phase 2: each thread takes a range of the projection's output channels
 *            and runs it on the whole of mid2 (half of it from the other
 *            core: the one exchange).
 *
 * Every thread then packs the whole input of both 1x1 convs, which the
 * unfused layers split over pixels; on larger planes (MobileNetV2's
 * 112x112 and 56x56 blocks lost 13-27% that way) each thread instead takes
 * a share of the output rows, in bands: the input rows a band reads (its
 * depthwise window, padding rows included) copied out, expanded, their
 * padding rows set to the zero point, the depthwise conv unpadded in
 * height, projected and copied to the output's rows. A band's expand
 * recomputes the window's extra rows (2 of 28 a thread at 56x56).
 *
 * Each conv is conv_u8s8's or the depthwise kernels' own call on a channel
 * range or a band, on one thread, so its bits are those of the unfused
 * layer: the epilogue is per output channel, and an output depends only
 * on its window, not on which other outputs the call computes.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "mt_simd.h"
#include "quant_kernels.h"
#include "qteam.h"

/* the kernels, through the CPU's table (qtable.c), which declares them */
extern const mt_quant_kernels mt_cpu_quant_kernels;
#define K (&mt_cpu_quant_kernels)

#define QB_ALIGN 16         /* channels per share's unit: half an AMX tile, two VNNI ones */
#define QB_CHANNEL_SPLIT_PIXELS (28 * 28)   /* larger input planes go by bands of rows */
/* a band's expanded rows, at most (then whole rows); 1 MB: half a core's L2
 * here, one band per thread for MobileNetV2's 112x112 and 56x56 blocks
 * (256 KB bands, three a thread, lost 13% at 112x112). Tests make it small
 * (mt_qblock_set_band_bytes) to run many bands. */
static int64_t band_bytes = 1 << 20;

int64_t mt_qblock_set_band_bytes(int64_t n)
{
    int64_t old = band_bytes;
    band_bytes = n > 0 ? n : 1 << 20;
    return old;
}

/* this thread's number in its team, and the team's size; the kernels it
 * calls from now on run on it alone (mt_q_team's count, per thread), until
 * it restores the count returned */
static int place(int *t, int *n_t)
{
#ifdef _OPENMP
    *t = omp_get_thread_num(), *n_t = omp_get_num_threads();
#else
    *t = 0, *n_t = 1;
#endif
    int had = mt_q_threads();
    mt_q_set_threads(1);
    return had;
}

/* thread t's range [*a, *b) of n channels, in whole units of QB_ALIGN */
static void share(int64_t n, int t, int nt, int64_t *a, int64_t *b)
{
    int64_t units = (n + QB_ALIGN - 1) / QB_ALIGN;
    int64_t lo = units * t / nt * QB_ALIGN, hi = units * (t + 1) / nt * QB_ALIGN;
    *a = lo < n ? lo : n;
    *b = hi < n ? hi : n;
}

static const int32_t *at_or_null(const int32_t *p, int64_t i) { return p ? p + i : NULL; }

/* channels [a, b) of a 1x1 conv of x [C, H, W] into out's planes a.. */
static int pw_range(const uint8_t *x, int64_t C, int64_t H, int64_t W, int32_t a_zp,
                    const mt_qblock_conv *c, int64_t a, int64_t b, void *out)
{
    size_t isz = c->out_u8 == 2 ? 4 : 1;
    return K->conv_u8s8(x, 1, C, H, W, a_zp, c->w + a * c->lw, c->lw, c->wsum + a, b - a, 1,
                         1, 1, 1, 1, 0, 0, 1, 1, H, W, at_or_null(c->bias, a), c->mult + a,
                         c->out_zp, c->lo, c->hi, c->out_u8, (char *)out + a * H * W * isz,
                         c->path) != 0;
}

/* the block's add on n elements from the output's element i on, y there
 * (one byte each: int8 or uint8) */
static void add_range(const mt_qblock_add *a, const uint8_t *y, int64_t i, int64_t n)
{
    const uint8_t *o = (const uint8_t *)a->other + i;
    const void *first = a->y_first ? (const void *)y : (const void *)o;
    const void *second = a->y_first ? (const void *)o : (const void *)y;
    int fk = a->y_first ? a->y_kind : a->other_kind, sk = a->y_first ? a->other_kind : a->y_kind;
    float fs = a->y_first ? a->y_scale : a->other_scale, fz = a->y_first ? a->y_zp : a->other_zp;
    float ss = a->y_first ? a->other_scale : a->y_scale, sz = a->y_first ? a->other_zp : a->y_zp;
    K->add_u8(first, fk, fs, fz, second, sk, ss, sz, n, a->out_scale, a->out_zp, a->lo, a->hi,
               a->relu, (uint8_t *)a->out + i, a->out_kind, a->path);
}

/* channels [a, b) of the depthwise conv, as plan.c's MT_Q_DWCONV step runs
 * it: the vector kernel unless asked for the portable one, else the general */
static void dw_range(const uint8_t *x, int64_t H, int64_t W, int32_t a_zp, const mt_qblock_conv *d,
                     const int64_t *g, int64_t a, int64_t b, uint8_t *out)
{
    int64_t KH = g[0], KW = g[1], OH = g[8], OW = g[9];
    const uint8_t *xa = x + a * H * W;
    uint8_t *oa = out + a * OH * OW;
    int done = 0;
    if (d->path != 1)
        done = K->dwconv_vec_u8s8(xa, 1, b - a, H, W, a_zp, d->w + a * KH * KW, KH, KW, g[2],
                                   g[3], g[4], g[5], g[6], g[7], OH, OW, at_or_null(d->bias, a),
                                   d->mult + a, d->out_zp, d->lo, d->hi, 1, oa, d->path);
    if (!done)
        K->dwconv_u8s8(xa, 1, b - a, H, W, a_zp, d->w + a * KH * KW, KH, KW, g[2], g[3], g[4],
                        g[5], g[6], g[7], OH, OW, at_or_null(d->bias, a), d->mult + a,
                        d->out_zp, d->lo, d->hi, 1, oa);
}

/* the calling thread's band buffers, kept for its next call and freed when
 * the thread ends (band_key's destructor): a team of one runs its bands on
 * the thread that called the plan, and a process running plans from
 * short-lived threads kept every one's (40x40 input, 96 hidden channels:
 * 0.37 MiB a thread, RSS 54 -> 166 MiB over 300 threads; 61 now, 60 for
 * the unfused steps) */
static __thread uint8_t *band_at;
static __thread size_t band_cap;
static pthread_key_t band_key;
static pthread_once_t band_once = PTHREAD_ONCE_INIT;
static int band_key_ok;     /* 0 where no key was left: the buffers then stay */

static void band_key_make(void) { band_key_ok = pthread_key_create(&band_key, free) == 0; }

static uint8_t *band_buffer(size_t n)
{
    if (n > band_cap) {
        free(band_at);
        band_cap = 0;
        if (posix_memalign((void **)&band_at, 64, n))
            band_at = NULL;
        else
            band_cap = n;
        pthread_once(&band_once, band_key_make);
        if (band_key_ok)
            pthread_setspecific(band_key, band_at);
    }
    return band_at;
}

static size_t up64(size_t n) { return (n + 63) & ~(size_t)63; }

/* Co planes of n pixels each, compact in ob ([Co][n], isz bytes an
 * element), to pixels [first, first + n) of out's planes of P pixels; or,
 * with an add, added from ob into those pixels (img: the image's first
 * element in the whole output, where the add's operands start), out, which
 * only the add reads, left unwritten */
static void put_planes(const uint8_t *ob, int64_t Co, int64_t n, int64_t P, int64_t first, size_t isz,
                       void *out, const mt_qblock_add *add, int64_t img)
{
    for (int64_t c = 0; c < Co; c++) {
        int64_t at = c * P + first;
        if (add)
            add_range(add, ob + c * n, img + at, n);
        else
            memcpy((char *)out + at * isz, ob + c * n * isz, (size_t)n * isz);
    }
}

/* output rows [o0, o1) of one image, all on this thread: the input rows
 * they read (the depthwise conv's window, its zero padding included)
 * copied to xb, expanded into m1 (no expand: copied to m1) with the
 * padding rows set to the zero point, the depthwise conv unpadded in height into m2, projected into ob
 * and copied to the output's rows (out: the image's; img: its first
 * element in the whole output, where the add's operands start), or with an
 * add added from ob (out, which only the add reads, left unwritten) */
static int band(const uint8_t *x, int64_t C, int64_t H, int64_t W, int32_t a_zp,
                const mt_qblock_conv *e, const mt_qblock_conv *d, const int64_t *g,
                const mt_qblock_conv *p, int64_t o0, int64_t o1, uint8_t *buf, void *out,
                const mt_qblock_add *add, int64_t img)
{
    int64_t KH = g[0], SH = g[2], PH = g[4], DH = g[6], OH = g[8], OW = g[9];
    int64_t E = e ? e->Co : C, R = o1 - o0, i0 = o0 * SH - PH;
    int64_t rows = (R - 1) * SH + (KH - 1) * DH + 1;
    int32_t zp1 = e ? e->out_zp : a_zp;         /* the depthwise conv's input zero point */
    size_t isz = p->out_u8 == 2 ? 4 : 1;
    uint8_t *m1 = buf, *xb = e ? m1 + up64((size_t)(E * rows * W)) : m1;
    uint8_t *m2 = xb + (e ? up64((size_t)(C * rows * W)) : up64((size_t)(E * rows * W)));
    uint8_t *ob = m2 + up64((size_t)(E * R * OW));
    /* the window's rows inside the image, one run a channel (a memcpy a
     * row, 112 bytes at 112x112, cost 4% of MobileNetV2's forward); rows
     * of padding the zero point (their expanded rows are set to it below) */
    int64_t r0 = -i0 < 0 ? 0 : -i0 > rows ? rows : -i0;       /* [r0, r1): inside */
    int64_t r1 = H - i0 < r0 ? r0 : H - i0 > rows ? rows : H - i0;
    for (int64_t c = 0; c < C; c++) {
        uint8_t *d = xb + c * rows * W;
        memset(d, (uint8_t)a_zp, (size_t)(r0 * W));
        memcpy(d + r0 * W, x + (c * H + i0 + r0) * W, (size_t)((r1 - r0) * W));
        memset(d + r1 * W, (uint8_t)a_zp, (size_t)((rows - r1) * W));
    }
    if (e && !pw_range(xb, C, rows, W, a_zp, e, 0, E, m1))
        return 0;
    for (int64_t r = 0; r < rows; r++)
        if (i0 + r < 0 || i0 + r >= H)
            for (int64_t c = 0; c < E; c++)
                memset(m1 + (c * rows + r) * W, (uint8_t)zp1, (size_t)W);
    int64_t gb[10] = {g[0], g[1], g[2], g[3], 0, g[5], g[6], g[7], R, OW};
    dw_range(m1, rows, W, zp1, d, gb, 0, E, m2);
    if (!pw_range(m2, E, R, OW, d->out_zp, p, 0, p->Co, ob))
        return 0;
    put_planes(ob, p->Co, R * OW, OH * OW, o0 * OW, isz, out, add, img);
    return 1;
}

/* each thread its share of every image's output rows, in bands whose
 * expanded rows fit band_bytes */
static int by_bands(const uint8_t *x, int64_t NB, int64_t C, int64_t H, int64_t W, int32_t a_zp,
                    const mt_qblock_conv *e, const mt_qblock_conv *d, const int64_t *g,
                    const mt_qblock_conv *p, void *out, const mt_qblock_add *add, int nt)
{
    int64_t KH = g[0], SH = g[2], DH = g[6], OH = g[8], OW = g[9], E = e ? e->Co : C;
    size_t isz = p->out_u8 == 2 ? 4 : 1;
    int64_t R = (band_bytes / (E * W) - (KH - 1) * DH - 1) / SH + 1;
    R = R < 1 ? 1 : R;
    int failed = 0;
#pragma omp parallel reduction(|:failed) num_threads(nt) if (nt > 1)
    {
        int t, n_t, had = place(&t, &n_t);
        int64_t a = OH * t / n_t, b = OH * (t + 1) / n_t, Rt = R < b - a ? R : b - a;
        int64_t rows = (Rt - 1) * SH + (KH - 1) * DH + 1;
        uint8_t *buf = band_buffer((e ? up64((size_t)(C * rows * W)) : 0) +
                                   up64((size_t)(E * rows * W)) + up64((size_t)(E * Rt * OW)) +
                                   (size_t)(p->Co * Rt * OW) * isz);
        failed = a < b && !buf;
        for (int64_t n = 0; n < NB && !failed; n++)
            for (int64_t o = a; o < b && !failed; o += Rt)
                failed = !band(x + n * C * H * W, C, H, W, a_zp, e, d, g, p, o,
                               o + Rt < b ? o + Rt : b, buf,
                               (char *)out + n * p->Co * OH * OW * isz, add, n * p->Co * OH * OW);
        mt_q_set_threads(had);
    }
    return !failed;
}

/* bytes [a, a + n) of each of the rows rows of src (row stride ld) into
 * dst, one after the other: an inline loop the compiler vectorizes, where a
 * libc memcpy a row (a few hundred bytes) cost 12 ns a call, 4.7 us of a
 * 14x14 block's 384 planes */
MT_VCLONES static void gather_cols(uint8_t *restrict dst, const uint8_t *restrict src,
                                   int64_t rows, int64_t ld, int64_t a, int64_t n)
{
    for (int64_t r = 0; r < rows; r++)
        for (int64_t i = 0; i < n; i++)
            dst[r * n + i] = src[r * ld + a + i];
}

/* pixels [a, b) of the projection of mid2 ([E][P], one image) into out
 * ([Co][P]) and the add after it (img: the image's first element in the
 * whole output): those pixels of each of the E planes copied together into
 * buf ([E][b - a]), projected there as one row of b - a pixels into
 * buf's [Co][b - a] after them, then copied to out's planes, or with an add
 * added from there (out, which only the add reads, is left unwritten) */
static int project_pixels(const uint8_t *m2, int64_t E, int64_t P, int32_t a_zp,
                          const mt_qblock_conv *p, int64_t a, int64_t b, uint8_t *buf,
                          void *out, const mt_qblock_add *add, int64_t img)
{
    int64_t n = b - a;
    size_t isz = p->out_u8 == 2 ? 4 : 1;
    if (n <= 0)
        return 1;
    uint8_t *ob = buf + up64((size_t)(E * n));
    gather_cols(buf, m2, E, P, a, n);
    if (!pw_range(buf, E, 1, n, a_zp, p, 0, p->Co, ob))
        return 0;
    put_planes(ob, p->Co, n, P, a, isz, out, add, img);
    return 1;
}

int mt_qblock_u8s8(const uint8_t *x, int64_t NB, int64_t C, int64_t H, int64_t W, int32_t a_zp,
                   const mt_qblock_conv *e, const mt_qblock_conv *d, const int64_t *g,
                   const mt_qblock_conv *p, uint8_t *mid1, uint8_t *mid2, void *out,
                   const mt_qblock_add *add)
{
    int64_t E = e ? e->Co : C, Co = p->Co, OH = g[8], OW = g[9];
    size_t isz = p->out_u8 == 2 ? 4 : 1;
    int64_t work = NB * ((e ? E * H * W * C : 0) + E * OH * OW * g[0] * g[1] * MT_Q_DW_COST +
                         Co * OH * OW * E);
    int nt = mt_q_team(work), failed = 0;
    if (H * W > QB_CHANNEL_SPLIT_PIXELS)
        return by_bands(x, NB, C, H, W, a_zp, e, d, g, p, out, add, nt);
    /* the projection by pixels where a thread then reads fewer bytes: its
     * half of mid2 and all the weights (E P / 2 + E Co) against all of mid2
     * and half the weights (E P + E Co / 2), so where Co < P (MobileNetV2's
     * 28x28 and 14x14 blocks; its 7x7 ones' weights are the larger). By
     * output channels, each thread also packed the whole of mid2, and AMX
     * multiplied tiles of 32 channels of which it kept 16: a 28x28 block's
     * projection took 27 us a thread at two threads, 17 us for all of it
     * at one. */
    int by_pixels = nt > 1 && Co < OH * OW;
#pragma omp parallel reduction(|:failed) num_threads(nt) if (nt > 1)
    {
        int t, n_t, had = place(&t, &n_t);
        int64_t ea, eb, pa, pb, qa, qb;
        share(E, t, n_t, &ea, &eb);
        share(Co, t, n_t, &pa, &pb);
        share(OH * OW, t, n_t, &qa, &qb);
        uint8_t *pbuf = NULL;
        if (by_pixels && qa < qb) {
            pbuf = band_buffer(up64((size_t)(E * (qb - qa))) + (size_t)(Co * (qb - qa)) * isz);
            failed = !pbuf;
        }
        for (int64_t n = 0; n < NB; n++) {
            const uint8_t *xn = x + n * C * H * W;
            uint8_t *m1 = mid1 + n * E * H * W, *m2 = mid2 + n * E * OH * OW;
            if (ea < eb && !failed && !e) {
                dw_range(xn, H, W, a_zp, d, g, ea, eb, m2);
            } else if (ea < eb && !failed) {
                failed |= !pw_range(xn, C, H, W, a_zp, e, ea, eb, m1);
                if (!failed)
                    dw_range(m1, H, W, e->out_zp, d, g, ea, eb, m2);
            }
            /* mid2 whole before any projection reads it; the next image's
             * phase 1 writes other planes of mid1 and mid2, so no second
             * barrier */
#pragma omp barrier
            if (by_pixels && !failed) {
                failed |= !project_pixels(m2, E, OH * OW, d->out_zp, p, qa, qb, pbuf,
                                          (char *)out + n * Co * OH * OW * isz, add,
                                          n * Co * OH * OW);
            } else if (!by_pixels && pa < pb && !failed) {
                failed |= !pw_range(m2, E, OH, OW, d->out_zp, p, pa, pb,
                                    (char *)out + n * Co * OH * OW * isz);
                if (add && !failed)
                    add_range(add, (const uint8_t *)out + (n * Co + pa) * OH * OW,
                              (n * Co + pa) * OH * OW, (pb - pa) * OH * OW);
            }
        }
        mt_q_set_threads(had);
    }
    return !failed;
}
