/* Neural-network kernels on the GPU with the CPU kernels' geometry (nn.h)
 * and semantics (pool.c, resize.c, act.c, conv.c's epilogue), plus the
 * gather/scatter of advanced indexing (index.h).
 *
 * conv2d is im2col + one strided-batched cuBLAS GEMM per chunk of images
 * (per group): col [C/g*KH*KW, OH*OW] per image, Y_n = W @ col_n, then one
 * epilogue kernel adds the bias and the residual and applies the activation.
 * A 1x1, stride-1, unpadded convolution needs no im2col (x_n is col_n). The
 * workspace holds the columns of as many images as fit MTC_CONV_WS bytes.
 * Work dtypes: float32 and float64 (nn.pyx computes half types in float32).
 */
#include "common.h"

#define MTC_CONV_WS ((int64_t)512 << 20)

namespace {

template <class T> __device__ __forceinline__ T act(T x, int a) {
    switch (a) {
    case MT_ACT_RELU: return x < 0 ? (T)0 : x;
    case MT_ACT_RELU6: return x < 0 ? (T)0 : (x > 6 ? (T)6 : x);
    case MT_ACT_SILU: return x / ((T)1 + exp(-x));
    case MT_ACT_HARDSWISH: return x * (x <= -3 ? (T)0 : (x >= 3 ? (T)1 : (x + 3) / 6));
    case MT_ACT_SIGMOID: return (T)1 / ((T)1 + exp(-x));
    case MT_ACT_GELU: return x * (T)0.5 * ((T)1 + erf(x * (T)0.70710678118654752440));
    default: return x;
    }
}

/* ---- conv2d ---- */
template <class T>
__global__ void im2col_kernel(const T *x, T *col, int64_t nimg, int64_t c, int64_t h, int64_t w,
                              int64_t kh, int64_t kw, int64_t oh, int64_t ow, int64_t sh, int64_t sw,
                              int64_t ph, int64_t pw, int64_t dh, int64_t dw, int64_t img_stride) {
    /* col [nimg][c*kh*kw][oh*ow]; x points at the first image's first channel of the group */
    const int64_t p = oh * ow, rows = c * kh * kw;
    MTC_LOOP(t, nimg * rows * p) {
        int64_t q = t % p, r = (t / p) % rows, n = t / (p * rows);
        int64_t kx = r % kw, ky = (r / kw) % kh, ci = r / (kw * kh);
        int64_t oy = q / ow, ox = q % ow;
        int64_t iy = oy * sh - ph + ky * dh, ix = ox * sw - pw + kx * dw;
        T v = 0;
        if (iy >= 0 && iy < h && ix >= 0 && ix < w) v = x[n * img_stride + (ci * h + iy) * w + ix];
        col[t] = v;
    }
}

template <class T>
__global__ void epilogue_kernel(T *y, int64_t total, int64_t o, int64_t p, const T *bias,
                                const T *res, int a) {
    MTC_LOOP(i, total) {
        T v = y[i];
        if (bias) v += bias[(i / p) % o];
        if (res) v += res[i];
        y[i] = act(v, a);
    }
}

int64_t conv_chunk(int dtype, const mt_conv2d_geom *g) {
    int64_t isz = dtype == MT_FLOAT64 ? 8 : 4;
    int64_t per = (g->c / g->groups) * g->kh * g->kw * g->oh * g->ow * isz;
    int64_t n = per > 0 ? MTC_CONV_WS / per : g->n;
    if (n < 1) n = 1;
    return n < g->n ? n : g->n;
}

bool direct_1x1(const mt_conv2d_geom *g) {
    return g->kh == 1 && g->kw == 1 && g->sh == 1 && g->sw == 1 && g->ph == 0 && g->pw == 0;
}

int64_t conv2d_workspace(int dtype, const mt_conv2d_geom *g, int, int) {
    if (dtype != MT_FLOAT32 && dtype != MT_FLOAT64) return 0;
    if (direct_1x1(g)) return 0;
    int64_t isz = dtype == MT_FLOAT64 ? 8 : 4;
    return conv_chunk(dtype, g) * (g->c / g->groups) * g->kh * g->kw * g->oh * g->ow * isz;
}

template <class T>
int conv2d_t(int dtype, const T *x, const T *wt, const T *bias, T *y, const mt_conv2d_geom *g, T *ws) {
    const int64_t G = g->groups, cg = g->c / G, og = g->o / G, p = g->oh * g->ow;
    const int64_t k = cg * g->kh * g->kw, hw = g->h * g->w;
    const bool direct = direct_1x1(g);
    const int64_t chunk = direct ? g->n : conv_chunk(dtype, g);
    cudaStream_t st = mtc_stream();
    for (int64_t n0 = 0; n0 < g->n; n0 += chunk) {
        int64_t nn = g->n - n0 < chunk ? g->n - n0 : chunk;
        for (int64_t gi = 0; gi < G; gi++) {
            const T *xg = x + (n0 * g->c + gi * cg) * hw;
            const T *col = xg;
            int64_t col_stride = g->c * hw;
            if (!direct) {
                im2col_kernel<T><<<mtc_blocks(nn * k * p), MTC_THREADS, 0, st>>>(
                    xg, ws, nn, cg, g->h, g->w, g->kh, g->kw, g->oh, g->ow, g->sh, g->sw, g->ph, g->pw,
                    g->dh, g->dw, g->c * hw);
                int rc = mtc_check_launch("im2col kernel launch");
                if (rc) return rc;
                col = ws;
                col_stride = k * p;
            }
            /* Y_n[og, p] = W_g[og, k] @ col_n[k, p] for each image of the chunk */
            mt_gemm_shape s;
            s.M = og; s.N = p; s.K = k;
            s.sam = k; s.sak = 1; s.sbk = p; s.sbn = 1; s.scm = p; s.scn = 1;
            int rc = mtc_gemm(dtype, &s, (const char *)(wt + gi * og * k), (const char *)col,
                              (char *)(y + (n0 * g->o + gi * og) * p), nn, 0, col_stride, g->o * p);
            if (rc) return rc;
        }
    }
    if (bias || g->has_res || g->act) {
        int64_t total = g->n * g->o * p;
        const T *res = g->has_res ? (const T *)((const char *)y + g->res_delta) : nullptr;
        epilogue_kernel<T><<<mtc_blocks(total), MTC_THREADS, 0, st>>>(y, total, g->o, p, bias, res, g->act);
        return mtc_check_launch("conv2d epilogue launch");
    }
    return 0;
}

int conv2d(int dtype, const void *x, const void *w, const void *bias, void *y, const mt_conv2d_geom *g,
           int, int, void *ws) {
    if (dtype == MT_FLOAT32)
        return conv2d_t<float>(dtype, (const float *)x, (const float *)w, (const float *)bias, (float *)y, g, (float *)ws);
    if (dtype == MT_FLOAT64)
        return conv2d_t<double>(dtype, (const double *)x, (const double *)w, (const double *)bias, (double *)y, g, (double *)ws);
    return MT_BK_ENOKERNEL;
}

/* ---- pooling: planes of [h, w] -> [oh, ow] ---- */
template <class T> __global__ void max_pool_kernel(const T *x, T *y, mt_pool2d_geom g) {
    MTC_LOOP(t, g.planes * g.oh * g.ow) {
        int64_t ox = t % g.ow, oy = (t / g.ow) % g.oh, pl = t / (g.ow * g.oh);
        const T *xp = x + pl * g.h * g.w;
        T m = -INFINITY;
        bool nan = false;
        for (int64_t ky = 0; ky < g.kh; ky++) {
            int64_t iy = oy * g.sh - g.ph + ky * g.dh;
            if (iy < 0 || iy >= g.h) continue;
            for (int64_t kx = 0; kx < g.kw; kx++) {
                int64_t ix = ox * g.sw - g.pw + kx * g.dw;
                if (ix < 0 || ix >= g.w) continue;
                T v = xp[iy * g.w + ix];
                if (v != v) nan = true;
                else if (v > m) m = v;
            }
        }
        y[t] = nan ? (T)NAN : m;
    }
}

template <class T> __global__ void avg_pool_kernel(const T *x, T *y, mt_pool2d_geom g) {
    MTC_LOOP(t, g.planes * g.oh * g.ow) {
        int64_t ox = t % g.ow, oy = (t / g.ow) % g.oh, pl = t / (g.ow * g.oh);
        const T *xp = x + pl * g.h * g.w;
        int64_t ys = oy * g.sh - g.ph, ye = ys + g.kh < g.h + g.ph ? ys + g.kh : g.h + g.ph;
        int64_t xs = ox * g.sw - g.pw, xe = xs + g.kw < g.w + g.pw ? xs + g.kw : g.w + g.pw;
        const int64_t padded = (ye - ys) * (xe - xs);
        ys = ys > 0 ? ys : 0; ye = ye < g.h ? ye : g.h;
        xs = xs > 0 ? xs : 0; xe = xe < g.w ? xe : g.w;
        T sum = 0;
        for (int64_t iy = ys; iy < ye; iy++)
            for (int64_t ix = xs; ix < xe; ix++) sum += xp[iy * g.w + ix];
        int64_t inside = (ye > ys ? ye - ys : 0) * (xe > xs ? xe - xs : 0);
        int64_t count = g.count_include_pad ? padded : inside;
        y[t] = count > 0 ? sum / (T)count : (T)0;
    }
}

template <class T>
__global__ void adaptive_kernel(int op, const T *x, T *y, int64_t planes, int64_t h, int64_t w,
                                int64_t oh, int64_t ow) {
    MTC_LOOP(t, planes * oh * ow) {
        int64_t ox = t % ow, oy = (t / ow) % oh, pl = t / (ow * oh);
        const T *xp = x + pl * h * w;
        int64_t ys = oy * h / oh, ye = ((oy + 1) * h + oh - 1) / oh;
        int64_t xs = ox * w / ow, xe = ((ox + 1) * w + ow - 1) / ow;
        T acc = op == MT_ADAPTIVE_MAX ? (T)-INFINITY : (T)0;
        for (int64_t iy = ys; iy < ye; iy++)
            for (int64_t ix = xs; ix < xe; ix++) {
                T v = xp[iy * w + ix];
                if (op == MT_ADAPTIVE_MAX) { if (v > acc || v != v) acc = v; }
                else acc += v;
            }
        y[t] = op == MT_ADAPTIVE_MAX ? acc : acc / (T)((ye - ys) * (xe - xs));
    }
}

#define MTC_FLOAT_DISPATCH(dtype, CALL)                                         \
    do {                                                                        \
        if ((dtype) == MT_FLOAT32) { typedef float T; CALL; }                   \
        else if ((dtype) == MT_FLOAT64) { typedef double T; CALL; }             \
        else return MT_BK_ENOKERNEL;                                            \
    } while (0)

int max_pool2d(int dtype, const void *x, void *y, const mt_pool2d_geom *g, int) {
    int64_t n = g->planes * g->oh * g->ow;
    if (n == 0) return 0;
    MTC_FLOAT_DISPATCH(dtype, (max_pool_kernel<T><<<mtc_blocks(n), MTC_THREADS, 0, mtc_stream()>>>((const T *)x, (T *)y, *g)));
    return mtc_check_launch("max_pool2d kernel launch");
}

int avg_pool2d(int dtype, const void *x, void *y, const mt_pool2d_geom *g, int) {
    int64_t n = g->planes * g->oh * g->ow;
    if (n == 0) return 0;
    MTC_FLOAT_DISPATCH(dtype, (avg_pool_kernel<T><<<mtc_blocks(n), MTC_THREADS, 0, mtc_stream()>>>((const T *)x, (T *)y, *g)));
    return mtc_check_launch("avg_pool2d kernel launch");
}

int adaptive_pool2d(int dtype, int op, const void *x, void *y, int64_t planes, int64_t h, int64_t w,
                    int64_t oh, int64_t ow, int) {
    int64_t n = planes * oh * ow;
    if (n == 0) return 0;
    MTC_FLOAT_DISPATCH(dtype, (adaptive_kernel<T><<<mtc_blocks(n), MTC_THREADS, 0, mtc_stream()>>>(op, (const T *)x, (T *)y, planes, h, w, oh, ow)));
    return mtc_check_launch("adaptive pooling kernel launch");
}

/* ---- resize (resize.c's source coordinates) ---- */
__device__ int64_t nearest_src(int64_t dst, int64_t n, int64_t m, double user_scale) {
    const float scale = user_scale > 0 ? (float)(1.0 / user_scale) : (float)n / (float)m;
    const int64_t src = (int64_t)floorf((float)dst * scale);
    return src < n - 1 ? src : n - 1;
}
template <class T>
__device__ void linear_src(int64_t i, int64_t n, int64_t m, double user_scale, int align, int64_t *i0,
                           int64_t *i1, T *f1) {
    T scale;
    if (align) scale = m > 1 ? (T)(n - 1) / (T)(m - 1) : (T)0;
    else scale = user_scale > 0 ? (T)(1.0 / user_scale) : (T)n / (T)m;
    T src = align ? scale * (T)i : scale * ((T)i + (T)0.5) - (T)0.5;
    if (src < 0) src = 0;
    const int64_t a = (int64_t)src;
    *i0 = a;
    *i1 = a + (a < n - 1 ? 1 : 0);
    T f = src - (T)a;
    *f1 = f < 0 ? (T)0 : (f > 1 ? (T)1 : f);
}
template <class T>
__global__ void resize_kernel(int mode, const T *x, T *y, int64_t planes, int64_t h, int64_t w,
                              int64_t oh, int64_t ow, double sh, double sw, int align) {
    MTC_LOOP(t, planes * oh * ow) {
        int64_t ox = t % ow, oy = (t / ow) % oh, pl = t / (ow * oh);
        const T *xp = x + pl * h * w;
        if (mode == MT_RESIZE_NEAREST) {
            y[t] = xp[nearest_src(oy, h, oh, sh) * w + nearest_src(ox, w, ow, sw)];
        } else {
            int64_t y0, y1, x0, x1;
            T fy, fx;
            linear_src<T>(oy, h, oh, sh, align, &y0, &y1, &fy);
            linear_src<T>(ox, w, ow, sw, align, &x0, &x1, &fx);
            const T *ra = xp + y0 * w, *rb = xp + y1 * w;
            T b0 = (T)1 - fy, a0 = (T)1 - fx;
            y[t] = b0 * (a0 * ra[x0] + fx * ra[x1]) + fy * (a0 * rb[x0] + fx * rb[x1]);
        }
    }
}
int resize2d(int dtype, int mode, const void *x, void *y, int64_t planes, int64_t h, int64_t w, int64_t oh,
             int64_t ow, double sh, double sw, int align, int) {
    int64_t n = planes * oh * ow;
    if (n == 0) return 0;
    MTC_FLOAT_DISPATCH(dtype, (resize_kernel<T><<<mtc_blocks(n), MTC_THREADS, 0, mtc_stream()>>>(mode, (const T *)x, (T *)y, planes, h, w, oh, ow, sh, sw, align)));
    return mtc_check_launch("resize kernel launch");
}

/* ---- y[r][c] = act(y[r][c] + bias[c]) ---- */
template <class T> __global__ void bias_act_kernel(T *y, int64_t rows, int64_t cols, const T *bias, int a) {
    MTC_LOOP(i, rows * cols) {
        T v = y[i];
        if (bias) v += bias[i % cols];
        y[i] = act(v, a);
    }
}
int bias_act(int dtype, void *y, int64_t rows, int64_t cols, const void *bias, int a, int) {
    int64_t n = rows * cols;
    if (n == 0) return 0;
    MTC_FLOAT_DISPATCH(dtype, (bias_act_kernel<T><<<mtc_blocks(n), MTC_THREADS, 0, mtc_stream()>>>((T *)y, rows, cols, (const T *)bias, a)));
    return mtc_check_launch("bias_act kernel launch");
}

/* ---- take / put: n blocks of an inner strided shape at element offsets ---- */
struct Inner { int ndim; int64_t shape[MT_MAX_NDIM], strides[MT_MAX_NDIM], count; };
Inner inner_of(int ndim, const int64_t *shape, const int64_t *strides) {
    Inner in;
    in.ndim = ndim; in.count = 1;
    for (int d = 0; d < ndim; d++) { in.shape[d] = shape[d]; in.strides[d] = strides[d]; in.count *= shape[d]; }
    return in;
}
__device__ int64_t inner_offset(const Inner &in, int64_t j) {
    return mtc_strided_offset(in.ndim, in.shape, in.strides, j);
}
template <class W, bool PUT>
__global__ void take_put_kernel(char *dst, const char *src, const int64_t *off, int64_t n, Inner in,
                                int64_t isz) {
    MTC_LOOP(t, n * in.count) {
        int64_t b = t / in.count, j = t % in.count;
        int64_t strided = off[b] * isz + inner_offset(in, j);
        if (PUT) *(W *)(dst + strided) = *(const W *)(src + t * isz);
        else *(W *)(dst + t * isz) = *(const W *)(src + strided);
    }
}
template <bool PUT>
int take_put(char *dst, const char *src, const int64_t *off_host, int64_t n, int ndim, const int64_t *shape,
             const int64_t *strides, int64_t isz) {
    Inner in = inner_of(ndim, shape, strides);
    if (n == 0 || in.count == 0) return 0;
    size_t bytes = sizeof(int64_t) * (size_t)n;
    int64_t *off = (int64_t *)mtc_scratch(bytes);
    if (!off) return MT_BK_ENOMEM;
    cudaStream_t st = mtc_stream();
    cudaError_t e = cudaMemcpyAsync(off, off_host, bytes, cudaMemcpyHostToDevice, st);
    if (e == cudaSuccess) e = cudaStreamSynchronize(st);     /* the host array is freed after the call */
    int rc = e == cudaSuccess ? 0 : mtc_fail("copying index offsets", e);
    if (!rc) {
        unsigned blocks = mtc_blocks(n * in.count);
        switch (isz) {
        case 1: take_put_kernel<uint8_t, PUT><<<blocks, MTC_THREADS, 0, st>>>(dst, src, off, n, in, 1); break;
        case 2: take_put_kernel<uint16_t, PUT><<<blocks, MTC_THREADS, 0, st>>>(dst, src, off, n, in, 2); break;
        case 4: take_put_kernel<uint32_t, PUT><<<blocks, MTC_THREADS, 0, st>>>(dst, src, off, n, in, 4); break;
        case 8: take_put_kernel<uint64_t, PUT><<<blocks, MTC_THREADS, 0, st>>>(dst, src, off, n, in, 8); break;
        default: rc = MT_BK_ENOKERNEL;
        }
        if (!rc) rc = mtc_check_launch(PUT ? "put kernel launch" : "take kernel launch");
    }
    mtc_scratch_free(off, bytes);
    return rc;
}
int take(char *out, const char *src, const int64_t *off, int64_t n, int ndim, const int64_t *shape,
         const int64_t *strides, int64_t isz) {
    return take_put<false>(out, src, off, n, ndim, shape, strides, isz);
}
int put(char *dst, const char *val, const int64_t *off, int64_t n, int ndim, const int64_t *shape,
        const int64_t *strides, int64_t isz) {
    return take_put<true>(dst, val, off, n, ndim, shape, strides, isz);
}

}  // namespace

extern "C" {
const mt_nn_kernels mtc_nn_kernels = {conv2d_workspace, conv2d, max_pool2d, avg_pool2d, adaptive_pool2d,
                                      resize2d, bias_act};
const mt_index_kernels mtc_index_kernels = {take, put};
}
