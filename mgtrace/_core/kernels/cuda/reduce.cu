/* Reductions, softmax, scans and sort/top-k on the GPU, taking the geometry
 * reduce.pyx builds for the CPU kernels (reduce.h: byte strides, kept and
 * reduced dims) and following their dtype rules (reduce.pyx's docstring):
 * sums and means accumulate in float64 (floats) or int64 (integers),
 * var/std by Welford's method in float64, NaN propagates through max/min and
 * wins argmax/argmin, argmax/argmin count in C order over the reduced dims.
 *
 * A reduction runs one block per output; when there are few outputs and
 * many elements each, the elements are split over several blocks whose
 * partial results a second kernel merges.
 */
#include <cfloat>
#include "common.h"

namespace {

/* ---- accumulators: init, add one element, merge, finish ---- */
template <class C> struct SumAcc {
    typedef typename std::conditional<std::is_floating_point<C>::value, double, int64_t>::type A;
    static __device__ A init() { return 0; }
    static __device__ A add(A a, C x, int64_t) { return a + (A)x; }
    static __device__ A merge(A a, A b) { return a + b; }
    template <class O> static __device__ O finish(A a, int64_t, double) { return (O)a; }
};
template <class C> struct ProdAcc {
    typedef typename std::conditional<std::is_floating_point<C>::value, double, int64_t>::type A;
    static __device__ A init() { return 1; }
    static __device__ A add(A a, C x, int64_t) { return a * (A)x; }
    static __device__ A merge(A a, A b) { return a * b; }
    template <class O> static __device__ O finish(A a, int64_t, double) { return (O)a; }
};
template <class C> struct MeanAcc {
    typedef double A;
    static __device__ A init() { return 0; }
    static __device__ A add(A a, C x, int64_t) { return a + (double)x; }
    static __device__ A merge(A a, A b) { return a + b; }
    template <class O> static __device__ O finish(A a, int64_t n, double) { return (O)(a / (double)n); }
};
struct Welford { double n, mean, m2; };
template <class C, bool STD> struct VarAcc {
    typedef Welford A;
    static __device__ A init() { return {0, 0, 0}; }
    static __device__ A add(A a, C x, int64_t) {
        double v = (double)x;
        a.n += 1;
        double d = v - a.mean;
        a.mean += d / a.n;
        a.m2 += d * (v - a.mean);
        return a;
    }
    static __device__ A merge(A a, A b) {
        if (a.n == 0) return b;
        if (b.n == 0) return a;
        double n = a.n + b.n, d = b.mean - a.mean;
        return {n, a.mean + d * b.n / n, a.m2 + b.m2 + d * d * a.n * b.n / n};
    }
    template <class O> static __device__ O finish(A a, int64_t n, double ddof) {
        double div = (double)n - ddof;
        double v = a.m2 / (div > 0 ? div : 0.0);
        return (O)(STD ? sqrt(v) : v);
    }
};
template <class C> __device__ __forceinline__ bool is_nan(C x) {
    if constexpr (std::is_floating_point<C>::value) return isnan(x); else return false;
}
template <class C, bool MAX> struct ExtAcc {
    struct A { C v; bool any; };
    static __device__ A init() { return {C(), false}; }
    static __device__ bool better(C x, C v) { return MAX ? x > v : x < v; }
    static __device__ A add(A a, C x, int64_t) {
        if (!a.any || is_nan(x) || (!is_nan(a.v) && better(x, a.v))) { a.v = x; a.any = true; }
        return a;
    }
    static __device__ A merge(A a, A b) { return b.any ? add(a, b.v, 0) : a; }
    template <class O> static __device__ O finish(A a, int64_t, double) { return (O)a.v; }
};
template <class C, bool MAX> struct ArgAcc {
    struct A { C v; int64_t i; };
    static __device__ A init() { return {C(), -1}; }
    /* b comes first: a NaN, or a better value, or equal with a lower index */
    static __device__ bool first(A b, A a) {
        if (a.i < 0) return true;
        if (b.i < 0) return false;
        bool bn = is_nan(b.v), an = is_nan(a.v);
        if (bn || an) return bn && (!an || b.i < a.i);
        if (b.v == a.v) return b.i < a.i;
        return MAX ? b.v > a.v : b.v < a.v;
    }
    static __device__ A add(A a, C x, int64_t i) { A b = {x, i}; return first(b, a) ? b : a; }
    static __device__ A merge(A a, A b) { return first(b, a) ? b : a; }
    template <class O> static __device__ O finish(A a, int64_t, double) { return (O)a.i; }
};
template <class C, bool ANY> struct LogicAcc {
    typedef int A;
    static __device__ A init() { return ANY ? 0 : 1; }
    static __device__ A add(A a, C x, int64_t) { return ANY ? (a | (x != 0)) : (a & (x != 0)); }
    static __device__ A merge(A a, A b) { return ANY ? (a | b) : (a & b); }
    template <class O> static __device__ O finish(A a, int64_t, double) { return (O)(a != 0); }
};

struct Geom {      /* mt_reduce_geom, passed by value */
    int nkeep, nred;
    int64_t kshape[MT_MAX_NDIM], kin[MT_MAX_NDIM], kout[MT_MAX_NDIM];
    int64_t rshape[MT_MAX_NDIM], rin[MT_MAX_NDIM];
    int64_t count;
    double ddof;
};

__device__ __forceinline__ void kept_offsets(const Geom &g, int64_t o, int64_t *in, int64_t *out) {
    int64_t a = 0, b = 0;
    for (int d = g.nkeep - 1; d >= 0; d--) {
        int64_t i = d ? o % g.kshape[d] : o;
        o = d ? o / g.kshape[d] : 0;
        a += i * g.kin[d];
        b += i * g.kout[d];
    }
    *in = a; *out = b;
}

__device__ __forceinline__ int64_t red_offset(const Geom &g, int64_t j) {
    if (g.nred == 1) return j * g.rin[0];
    return mtc_strided_offset(g.nred, g.rshape, g.rin, j);
}

/* block-wide merge through shared memory; thread 0 gets the result */
template <class Acc> __device__ typename Acc::A block_merge(typename Acc::A a) {
    __shared__ typename Acc::A sh[MTC_THREADS];
    sh[threadIdx.x] = a;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) sh[threadIdx.x] = Acc::merge(sh[threadIdx.x], sh[threadIdx.x + s]);
        __syncthreads();
    }
    return sh[0];
}

/* grid (outputs, splits): block (o, s) reduces elements [s*chunk, ...) of output o */
template <class TI, class TO, class Acc>
__global__ void reduce_kernel(const char *in, char *out, Geom g, int64_t nout, int64_t chunk,
                              typename Acc::A *partial) {
    for (int64_t o = blockIdx.x; o < nout; o += gridDim.x) {
        int64_t ib, ob;
        kept_offsets(g, o, &ib, &ob);
        int64_t lo = (int64_t)blockIdx.y * chunk, hi = lo + chunk < g.count ? lo + chunk : g.count;
        typename Acc::A a = Acc::init();
#pragma unroll 4
        for (int64_t j = lo + threadIdx.x; j < hi; j += blockDim.x)
            a = Acc::add(a, TI::load(*(const typename TI::S *)(in + ib + red_offset(g, j))), j);
        a = block_merge<Acc>(a);
        if (threadIdx.x == 0) {
            if (partial) partial[o * gridDim.y + blockIdx.y] = a;
            else *(typename TO::S *)(out + ob) = TO::store(Acc::template finish<typename TO::C>(a, g.count, g.ddof));
        }
        __syncthreads();
    }
}

template <class TO, class Acc>
__global__ void merge_kernel(char *out, Geom g, int64_t nout, int nsplit, const typename Acc::A *partial) {
    for (int64_t o = blockIdx.x; o < nout; o += gridDim.x) {
        int64_t ib, ob;
        kept_offsets(g, o, &ib, &ob);
        typename Acc::A a = Acc::init();
        for (int s = threadIdx.x; s < nsplit; s += blockDim.x) a = Acc::merge(a, partial[o * nsplit + s]);
        a = block_merge<Acc>(a);
        if (threadIdx.x == 0)
            *(typename TO::S *)(out + ob) = TO::store(Acc::template finish<typename TO::C>(a, g.count, g.ddof));
        __syncthreads();
    }
}

template <int DI, int DO, class Acc> int run_reduce(const char *in, char *out, const mt_reduce_geom *mg, int) {
    Geom g;
    g.nkeep = mg->nkeep; g.nred = mg->nred; g.count = mg->count; g.ddof = mg->ddof;
    int64_t nout = 1;
    for (int d = 0; d < g.nkeep; d++) {
        g.kshape[d] = mg->kshape[d]; g.kin[d] = mg->kin[d]; g.kout[d] = mg->kout[d];
        nout *= g.kshape[d];
    }
    for (int d = 0; d < g.nred; d++) { g.rshape[d] = mg->rshape[d]; g.rin[d] = mg->rin[d]; }
    if (nout == 0) return 0;
    /* enough blocks to fill the GPU: split long reductions of few outputs */
    int64_t nsplit = 1;
    if (nout < 1024 && g.count >= 8192) {
        nsplit = (2048 + nout - 1) / nout;
        int64_t most = g.count / 4096;
        if (nsplit > most) nsplit = most;
        if (nsplit > 1024) nsplit = 1024;
        if (nsplit < 1) nsplit = 1;
    }
    int64_t chunk = (g.count + nsplit - 1) / nsplit;
    unsigned gx = (unsigned)(nout < 65536 * 8 ? nout : 65536 * 8);
    cudaStream_t st = mtc_stream();
    typedef typename Acc::A A;
    if (nsplit == 1) {
        reduce_kernel<DT<DI>, DT<DO>, Acc><<<dim3(gx, 1), MTC_THREADS, 0, st>>>(in, out, g, nout, chunk, nullptr);
        return mtc_check_launch("reduction kernel launch");
    }
    size_t bytes = sizeof(A) * (size_t)(nout * nsplit);
    A *partial = (A *)mtc_scratch(bytes);
    if (!partial) return MT_BK_ENOMEM;
    reduce_kernel<DT<DI>, DT<DO>, Acc><<<dim3(gx, (unsigned)nsplit), MTC_THREADS, 0, st>>>(in, out, g, nout, chunk, partial);
    int rc = mtc_check_launch("reduction kernel launch");
    if (!rc) {
        merge_kernel<DT<DO>, Acc><<<gx, MTC_THREADS, 0, st>>>(out, g, nout, (int)nsplit, partial);
        rc = mtc_check_launch("reduction merge launch");
    }
    mtc_scratch_free(partial, bytes);
    return rc;
}

/* result dtypes (reduce.pyx's _out_dtype) */
template <int D> constexpr int sum_out() { return D == MT_BOOL ? MT_INT32 : D; }
template <int D> constexpr int float_out() { return mtc_is_float<D>() ? D : MT_FLOAT32; }

template <int D> struct ReduceRow {
    typedef typename DT<D>::C C;
    static int sum(const char *i, char *o, const mt_reduce_geom *g, int nt) { return run_reduce<D, sum_out<D>(), SumAcc<C>>(i, o, g, nt); }
    static int prod(const char *i, char *o, const mt_reduce_geom *g, int nt) { return run_reduce<D, sum_out<D>(), ProdAcc<C>>(i, o, g, nt); }
    static int mean(const char *i, char *o, const mt_reduce_geom *g, int nt) { return run_reduce<D, float_out<D>(), MeanAcc<C>>(i, o, g, nt); }
    static int var(const char *i, char *o, const mt_reduce_geom *g, int nt) { return run_reduce<D, float_out<D>(), VarAcc<C, false>>(i, o, g, nt); }
    static int std_(const char *i, char *o, const mt_reduce_geom *g, int nt) { return run_reduce<D, float_out<D>(), VarAcc<C, true>>(i, o, g, nt); }
    static int max(const char *i, char *o, const mt_reduce_geom *g, int nt) { return run_reduce<D, D, ExtAcc<C, true>>(i, o, g, nt); }
    static int min(const char *i, char *o, const mt_reduce_geom *g, int nt) { return run_reduce<D, D, ExtAcc<C, false>>(i, o, g, nt); }
    static int argmax(const char *i, char *o, const mt_reduce_geom *g, int nt) { return run_reduce<D, MT_INT32, ArgAcc<C, true>>(i, o, g, nt); }
    static int argmin(const char *i, char *o, const mt_reduce_geom *g, int nt) { return run_reduce<D, MT_INT32, ArgAcc<C, false>>(i, o, g, nt); }
    static int any(const char *i, char *o, const mt_reduce_geom *g, int nt) { return run_reduce<D, MT_BOOL, LogicAcc<C, true>>(i, o, g, nt); }
    static int all(const char *i, char *o, const mt_reduce_geom *g, int nt) { return run_reduce<D, MT_BOOL, LogicAcc<C, false>>(i, o, g, nt); }
};

/* ---- along one axis: softmax, scans, sort ---- */
struct Line {     /* mt_line_geom by value */
    int nouter;
    int64_t oshape[MT_MAX_NDIM], oin[MT_MAX_NDIM], oout[MT_MAX_NDIM], oidx[MT_MAX_NDIM];
    int64_t len, ain, aout, aidx;
};
Line line_of(const mt_line_geom *g, int64_t *nlines) {
    Line l;
    l.nouter = g->nouter; l.len = g->len; l.ain = g->ain; l.aout = g->aout; l.aidx = g->aidx;
    *nlines = 1;
    for (int d = 0; d < g->nouter; d++) {
        l.oshape[d] = g->oshape[d]; l.oin[d] = g->oin[d]; l.oout[d] = g->oout[d]; l.oidx[d] = g->oidx[d];
        *nlines *= g->oshape[d];
    }
    return l;
}
__device__ void line_offsets(const Line &l, int64_t o, int64_t *in, int64_t *out, int64_t *idx) {
    int64_t a = 0, b = 0, c = 0;
    for (int d = l.nouter - 1; d >= 0; d--) {
        int64_t i = d ? o % l.oshape[d] : o;
        o = d ? o / l.oshape[d] : 0;
        a += i * l.oin[d]; b += i * l.oout[d]; c += i * l.oidx[d];
    }
    *in = a; *out = b; *idx = c;
}

/* one block per line: max, sum of exp, then the outputs */
template <class T, bool LOG>
__global__ void softmax_kernel(const char *in, char *out, Line l, int64_t nlines) {
    typedef typename std::conditional<std::is_same<typename T::C, double>::value, double, float>::type W;
    __shared__ W sh[MTC_THREADS];
    for (int64_t o = blockIdx.x; o < nlines; o += gridDim.x) {
        int64_t ib, ob, xb;
        line_offsets(l, o, &ib, &ob, &xb);
        W m = -INFINITY;
        for (int64_t j = threadIdx.x; j < l.len; j += blockDim.x) {
            W v = (W)T::load(*(const typename T::S *)(in + ib + j * l.ain));
            m = (v > m || isnan(v)) ? v : m;
        }
        sh[threadIdx.x] = m;
        __syncthreads();
        for (int s = blockDim.x / 2; s > 0; s >>= 1) {
            if (threadIdx.x < s) {
                W a = sh[threadIdx.x], b = sh[threadIdx.x + s];
                sh[threadIdx.x] = (b > a || isnan(b)) ? b : a;
            }
            __syncthreads();
        }
        m = sh[0];
        __syncthreads();
        W s = 0;
        for (int64_t j = threadIdx.x; j < l.len; j += blockDim.x)
            s += exp((W)T::load(*(const typename T::S *)(in + ib + j * l.ain)) - m);
        sh[threadIdx.x] = s;
        __syncthreads();
        for (int k = blockDim.x / 2; k > 0; k >>= 1) {
            if (threadIdx.x < k) sh[threadIdx.x] += sh[threadIdx.x + k];
            __syncthreads();
        }
        s = sh[0];
        __syncthreads();
        W ls = log(s);
        for (int64_t j = threadIdx.x; j < l.len; j += blockDim.x) {
            W v = (W)T::load(*(const typename T::S *)(in + ib + j * l.ain)) - m;
            *(typename T::S *)(out + ob + j * l.aout) = T::store(LOG ? v - ls : exp(v) / s);
        }
    }
}

template <int D, bool LOG> int run_softmax(const char *in, char *out, const mt_line_geom *g, int) {
    int64_t n;
    Line l = line_of(g, &n);
    if (n == 0 || l.len == 0) return 0;
    int threads = 32;
    while (threads < l.len && threads < MTC_THREADS) threads *= 2;
    unsigned gx = (unsigned)(n < 65536 * 8 ? n : 65536 * 8);
    softmax_kernel<DT<D>, LOG><<<gx, threads, 0, mtc_stream()>>>(in, out, l, n);
    return mtc_check_launch("softmax kernel launch");
}

/* scans: one thread per line, in order (int64 / float64 accumulator) */
template <class TI, class TO, bool PROD>
__global__ void scan_kernel(const char *in, char *out, Line l, int64_t nlines) {
    typedef typename std::conditional<std::is_floating_point<typename TI::C>::value, double, int64_t>::type A;
    MTC_LOOP(o, nlines) {
        int64_t ib, ob, xb;
        line_offsets(l, o, &ib, &ob, &xb);
        A a = PROD ? 1 : 0;
        for (int64_t j = 0; j < l.len; j++) {
            A x = (A)TI::load(*(const typename TI::S *)(in + ib + j * l.ain));
            a = PROD ? a * x : a + x;
            *(typename TO::S *)(out + ob + j * l.aout) = TO::store((typename TO::C)a);
        }
    }
}
template <int D, bool PROD> int run_scan(const char *in, char *out, const mt_line_geom *g, int) {
    int64_t n;
    Line l = line_of(g, &n);
    if (n == 0 || l.len == 0) return 0;
    scan_kernel<DT<D>, DT<sum_out<D>()>, PROD><<<mtc_blocks(n), MTC_THREADS, 0, mtc_stream()>>>(in, out, l, n);
    return mtc_check_launch("scan kernel launch");
}

/* sort / top-k by rank: element j of a line lands at the number of elements
 * that come before it (better value, or equal value and lower index; NaN is
 * the largest), when that rank is below k. O(len^2) per line, in parallel. */
template <class T>
__global__ void rank_kernel(const char *in, char *vals, char *idx, Line l, int64_t nlines, int64_t k,
                            int descending) {
    typedef typename T::C C;
    MTC_LOOP(t, nlines * l.len) {
        int64_t o = t / l.len, j = t % l.len;
        int64_t ib, ob, xb;
        line_offsets(l, o, &ib, &ob, &xb);
        C v = T::load(*(const typename T::S *)(in + ib + j * l.ain));
        bool vn = is_nan(v);
        int64_t r = 0;
        for (int64_t q = 0; q < l.len && r < k; q++) {
            if (q == j) continue;
            C u = T::load(*(const typename T::S *)(in + ib + q * l.ain));
            bool un = is_nan(u);
            bool before;
            if (un || vn) before = un && vn ? q < j : (descending ? un : vn);
            else if (u == v) before = q < j;
            else before = descending ? u > v : u < v;
            r += before;
        }
        if (r < k) {
            if (vals) *(typename T::S *)(vals + ob + r * l.aout) = T::store(v);
            *(int32_t *)(idx + xb + r * l.aidx) = (int32_t)j;
        }
    }
}
template <int D> int run_sort(const char *in, char *vals, char *idx, const mt_line_geom *g, int64_t k,
                              int descending, int, int) {
    int64_t n;
    Line l = line_of(g, &n);
    if (n == 0 || l.len == 0 || k == 0) return 0;
    rank_kernel<DT<D>><<<mtc_blocks(n * l.len), MTC_THREADS, 0, mtc_stream()>>>(in, vals, idx, l, n, k, descending);
    return mtc_check_launch("sort kernel launch");
}

/* ---- tables: the dtypes the GPU reduces (others: no kernel) ---- */
mt_reduce_fn g_reduce[MT_NREDUCE][MT_NDTYPES];
mt_line_fn g_scan[MT_NSCAN][MT_NDTYPES];
mt_line_fn g_softmax[MT_NSOFTMAX][MT_NDTYPES];
mt_sort_fn g_sort[MT_NDTYPES];

template <int D> void add_dtype() {
    typedef ReduceRow<D> R;
    g_reduce[MT_R_sum][D] = R::sum; g_reduce[MT_R_prod][D] = R::prod;
    g_reduce[MT_R_mean][D] = R::mean; g_reduce[MT_R_var][D] = R::var; g_reduce[MT_R_std][D] = R::std_;
    g_reduce[MT_R_max][D] = R::max; g_reduce[MT_R_min][D] = R::min;
    g_reduce[MT_R_argmax][D] = R::argmax; g_reduce[MT_R_argmin][D] = R::argmin;
    g_reduce[MT_R_any][D] = R::any; g_reduce[MT_R_all][D] = R::all;
    g_scan[MT_L_cumsum][D] = run_scan<D, false>;
    g_scan[MT_L_cumprod][D] = run_scan<D, true>;
    g_sort[D] = run_sort<D>;
    if constexpr (mtc_is_float<D>()) {
        g_softmax[MT_L_softmax][D] = run_softmax<D, false>;
        g_softmax[MT_L_log_softmax][D] = run_softmax<D, true>;
    }
}

struct Init {
    Init() {
        add_dtype<MT_BOOL>(); add_dtype<MT_INT32>(); add_dtype<MT_INT64>();
        add_dtype<MT_FLOAT16>(); add_dtype<MT_BFLOAT16>(); add_dtype<MT_FLOAT32>(); add_dtype<MT_FLOAT64>();
    }
} g_init;

}  // namespace

extern "C" const mt_reduce_kernels mtc_reduce_kernels = {g_reduce, g_scan, g_softmax, g_sort};
