/* Elementwise kernels: unary, binary, ternary, casts and fills, on the
 * coalesced strided index space dispatch.pyx builds (mt_ew_call), with the
 * same expressions and dtype rules as the CPU loops (kernels/elementwise.c).
 *
 * One kernel template covers every op: a grid-stride loop that computes the
 * byte offset of each operand (a plain multiply when the space is one
 * dimension, i.e. contiguous or uniformly strided operands; an unravel over
 * the dims otherwise), loads in the compute type, applies the op functor and
 * stores. Python scalars come by value. Compute dtypes on the GPU: bool,
 * int32, int64, float16, bfloat16, float32, float64 (casts: every dtype);
 * others report "no kernel".
 */
#include "common.h"

namespace {

struct EwParams {
    int ndim;
    int64_t n;
    int64_t shape[MT_MAX_NDIM];
    int64_t st[4][MT_MAX_NDIM];
    char *args[4];
};

template <int NIN> __device__ __forceinline__ void offsets(const EwParams &p, int64_t i, int64_t *o) {
    if (p.ndim == 1) {
#pragma unroll
        for (int a = 0; a <= NIN; a++) o[a] = i * p.st[a][0];
        return;
    }
#pragma unroll
    for (int a = 0; a <= NIN; a++) o[a] = 0;
    for (int d = p.ndim - 1; d >= 0; d--) {
        int64_t idx = d ? i % p.shape[d] : i;
        i = d ? i / p.shape[d] : 0;
#pragma unroll
        for (int a = 0; a <= NIN; a++) o[a] += idx * p.st[a][d];
    }
}

template <class T> __device__ __forceinline__ typename T::C ld(const char *base, int64_t off) {
    return T::load(*(const typename T::S *)(base + off));
}

/* out = f(a[, b[, c]]); T1..T3 the inputs' traits, TO the output's.
 * One dimension (contiguous or uniformly strided operands, the common case):
 * each thread loads UNROLL elements a grid-stride apart before it stores any,
 * so several loads are in flight per thread (an element's own load always
 * precedes its store, so in-place ops stay right). Otherwise: an unravel of
 * the index over the dims, one element at a time. */
#define MTC_UNROLL 4
template <class TO, class T1, class T2, class T3, int NIN, class F>
__global__ void ew_kernel(EwParams p, F f, unsigned smask, typename T1::C s1, typename T2::C s2,
                          typename T3::C s3) {
    typedef typename T1::C C1;
    typedef typename T2::C C2;
    typedef typename T3::C C3;
    if (p.ndim == 1) {
        const int64_t step = (int64_t)gridDim.x * blockDim.x;
        int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
        for (; i + (MTC_UNROLL - 1) * step < p.n; i += MTC_UNROLL * step) {
            C1 a[MTC_UNROLL];
            C2 b[MTC_UNROLL];
            C3 c[MTC_UNROLL];
#pragma unroll
            for (int u = 0; u < MTC_UNROLL; u++) {
                int64_t k = i + u * step;
                a[u] = (smask & 1u) ? s1 : ld<T1>(p.args[1], k * p.st[1][0]);
                if constexpr (NIN >= 2) b[u] = (smask & 2u) ? s2 : ld<T2>(p.args[2], k * p.st[2][0]);
                if constexpr (NIN >= 3) c[u] = (smask & 4u) ? s3 : ld<T3>(p.args[3], k * p.st[3][0]);
            }
#pragma unroll
            for (int u = 0; u < MTC_UNROLL; u++) {
                typename TO::S *out = (typename TO::S *)(p.args[0] + (i + u * step) * p.st[0][0]);
                if constexpr (NIN == 1) *out = TO::store(f(a[u]));
                else if constexpr (NIN == 2) *out = TO::store(f(a[u], b[u]));
                else *out = TO::store(f(a[u], b[u], c[u]));
            }
        }
        for (; i < p.n; i += step) {
            C1 a = (smask & 1u) ? s1 : ld<T1>(p.args[1], i * p.st[1][0]);
            typename TO::S *out = (typename TO::S *)(p.args[0] + i * p.st[0][0]);
            if constexpr (NIN == 1) {
                *out = TO::store(f(a));
            } else if constexpr (NIN == 2) {
                *out = TO::store(f(a, (smask & 2u) ? s2 : ld<T2>(p.args[2], i * p.st[2][0])));
            } else {
                *out = TO::store(f(a, (smask & 2u) ? s2 : ld<T2>(p.args[2], i * p.st[2][0]),
                                   (smask & 4u) ? s3 : ld<T3>(p.args[3], i * p.st[3][0])));
            }
        }
        return;
    }
    int64_t o[4];
    MTC_LOOP(i, p.n) {
        offsets<NIN>(p, i, o);
        C1 a = (smask & 1u) ? s1 : ld<T1>(p.args[1], o[1]);
        if constexpr (NIN == 1) {
            *(typename TO::S *)(p.args[0] + o[0]) = TO::store(f(a));
        } else if constexpr (NIN == 2) {
            C2 b = (smask & 2u) ? s2 : ld<T2>(p.args[2], o[2]);
            *(typename TO::S *)(p.args[0] + o[0]) = TO::store(f(a, b));
        } else {
            C2 b = (smask & 2u) ? s2 : ld<T2>(p.args[2], o[2]);
            C3 c = (smask & 4u) ? s3 : ld<T3>(p.args[3], o[3]);
            *(typename TO::S *)(p.args[0] + o[0]) = TO::store(f(a, b, c));
        }
    }
}

/* blocks for n elements: one-dimensional calls take MTC_UNROLL per thread */
static inline unsigned ew_blocks(const EwParams &p) {
    if (p.ndim != 1) return mtc_blocks(p.n);
    int64_t b = (p.n + (int64_t)MTC_THREADS * MTC_UNROLL - 1) / ((int64_t)MTC_THREADS * MTC_UNROLL);
    if (b < 1) b = 1;
    return (unsigned)(b > 65536 ? 65536 : b);
}

template <class TO> __global__ void fill_kernel(EwParams p, typename TO::S v) {
    int64_t o[4];
    MTC_LOOP(i, p.n) {
        offsets<0>(p, i, o);
        *(typename TO::S *)(p.args[0] + o[0]) = v;
    }
}

EwParams params_of(const mt_ew_call *c) {
    EwParams p;
    p.ndim = c->ndim;
    p.n = 1;
    for (int d = 0; d < c->ndim; d++) {
        p.shape[d] = c->shape[d];
        p.n *= c->shape[d];
        for (int a = 0; a < c->nargs; a++) p.st[a][d] = c->strides[a][d];
    }
    for (int a = 0; a < 4; a++) p.args[a] = a < c->nargs ? c->args[a] : nullptr;
    return p;
}

template <class TO, class T1, class T2, class T3, int NIN, class F>
int launch(const mt_ew_call *c, F f, typename T1::C s1, typename T2::C s2, typename T3::C s3) {
    EwParams p = params_of(c);
    if (p.n == 0) return 0;
    ew_kernel<TO, T1, T2, T3, NIN, F><<<ew_blocks(p), MTC_THREADS, 0, mtc_stream()>>>(
        p, f, c->scalar_mask, s1, s2, s3);
    return mtc_check_launch("elementwise kernel launch");
}

/* the scalar operand k (0-based input) as a compute value, or a zero */
template <int D> typename DT<D>::C scalar(const mt_ew_call *c, int k) {
    if (c->scalar_mask & (1u << k)) return mtc_host_load<D>(c->args[k + 1]);
    return typename DT<D>::C();
}

/* ---- op functors: the expressions of kernels/elementwise.c ---- */
#define FLOATING(x) std::is_floating_point<decltype(x)>::value

template <int OP> struct U;
/* K: which compute dtypes have the op. F: floats, I: int32/int64, B: bool */
enum { KF = 1, KI = 2, KB = 4 };
#define UOP(name, kinds, expr)                                                 \
    template <> struct U<MT_U_##name> {                                        \
        static constexpr int kinds_ = kinds;                                   \
        template <class X> __device__ __forceinline__ auto operator()(X x) const { return expr; } \
    };
#define FI(fexpr, iexpr) [&]() { if constexpr (FLOATING(x)) return (decltype(x))(fexpr); else return (decltype(x))(iexpr); }()

__device__ __forceinline__ float mtc_erf(float x) { return erff(x); }
__device__ __forceinline__ double mtc_erf(double x) { return erf(x); }

UOP(neg, KF | KI, FI(-x, 0 - x))
UOP(abs, KF | KI, FI(fabs(x), x < 0 ? 0 - x : x))
UOP(sign, KF | KI, FI(isnan(x) ? x : (decltype(x))((x > 0) - (x < 0)), (x > 0) - (x < 0)))
UOP(square, KF | KI, (decltype(x))(x * x))
UOP(round, KF | KI, FI(rint(x), x))
UOP(floor, KF | KI, FI(floor(x), x))
UOP(ceil, KF | KI, FI(ceil(x), x))
UOP(trunc, KF | KI, FI(trunc(x), x))
UOP(exp, KF, exp(x))
UOP(expm1, KF, expm1(x))
UOP(log, KF, log(x))
UOP(log1p, KF, log1p(x))
UOP(log2, KF, log2(x))
UOP(sqrt, KF, sqrt(x))
UOP(rsqrt, KF, (decltype(x))1 / sqrt(x))
UOP(sin, KF, sin(x))
UOP(cos, KF, cos(x))
UOP(tan, KF, tan(x))
UOP(tanh, KF, tanh(x))
UOP(erf, KF, mtc_erf(x))
UOP(asin, KF, asin(x))
UOP(acos, KF, acos(x))
UOP(atan, KF, atan(x))
UOP(relu, KF | KI, (decltype(x))(x < 0 ? 0 : x))
UOP(relu6, KF | KI, (decltype(x))(x < 0 ? 0 : (x > 6 ? 6 : x)))
UOP(sigmoid, KF, (decltype(x))1 / ((decltype(x))1 + exp(-x)))
UOP(gelu, KF, x * (decltype(x))0.5 * ((decltype(x))1 + mtc_erf(x * (decltype(x))0.70710678118654752440)))
UOP(gelu_tanh, KF, x * (decltype(x))0.5 * ((decltype(x))1 + tanh((decltype(x))0.79788456080286535588 * (x + (decltype(x))0.044715 * x * x * x))))
UOP(silu, KF, x / ((decltype(x))1 + exp(-x)))
UOP(hardswish, KF, x * (x <= -3 ? (decltype(x))0 : (x >= 3 ? (decltype(x))1 : (x + 3) / 6)))
UOP(hardsigmoid, KF, (x <= -3 ? (decltype(x))0 : (x >= 3 ? (decltype(x))1 : (x + 3) / 6)))
UOP(softplus, KF, (x > 20 ? x : log1p(exp(x))))
UOP(isnan, KF, (bool)isnan(x))
UOP(isinf, KF, (bool)isinf(x))
UOP(isfinite, KF, (bool)isfinite(x))
UOP(logical_not, KF | KI | KB, (bool)(x == 0))
template <class X> __device__ __forceinline__ X bit_not(X x) {
    if constexpr (std::is_same<X, bool>::value) return !x; else return (X)~x;
}
UOP(bitwise_not, KI | KB, bit_not(x))

template <int OP> struct B;
#define BOP(name, kinds, expr)                                                 \
    template <> struct B<MT_B_##name> {                                        \
        static constexpr int kinds_ = kinds;                                   \
        template <class X> __device__ __forceinline__ auto operator()(X x, X y) const { return expr; } \
    };

template <class T> __device__ __forceinline__ T fmod_py(T x, T y) {
    T m = fmod(x, y);
    if (m != 0) { if ((y < 0) != (m < 0)) m += y; } else m = copysign((T)0, y);
    return m;
}
template <class T> __device__ __forceinline__ T fdiv_py(T x, T y) {
    if (y == 0) return x / y;
    T m = fmod(x, y), d = (x - m) / y;
    if (m != 0 && ((y < 0) != (m < 0))) d -= 1;
    if (d == 0) return copysign((T)0, x / y);
    T f = floor(d);
    if (d - f > (T)0.5) f += 1;
    return f;
}
template <class T> __device__ __forceinline__ T idiv_py(T x, T y) {
    if (y == 0) return 0;
    if (y == (T)-1) return (T)(0 - x);
    T q = (T)(x / y);
    if ((T)(x % y) != 0 && ((x < 0) != (y < 0))) q--;
    return q;
}
template <class T> __device__ __forceinline__ T imod_py(T x, T y) {
    if (y == 0 || y == (T)-1) return 0;
    T r = (T)(x % y);
    if (r != 0 && ((r < 0) != (y < 0))) r = (T)(r + y);
    return r;
}
template <class T> __device__ __forceinline__ T shl(T x, T y) {
    return (y < 0 || y >= (T)(8 * sizeof(T))) ? 0 : (T)((typename std::make_unsigned<T>::type)x << y);
}
template <class T> __device__ __forceinline__ T shr(T x, T y) {
    if (y < 0 || y >= (T)(8 * sizeof(T))) return (T)(x < 0 ? -1 : 0);
    return (T)(x >> y);
}
BOP(add, KF | KI | KB, (decltype(x))(x + y))
BOP(sub, KF | KI, (decltype(x))(x - y))
BOP(mul, KF | KI | KB, (decltype(x))(x * y))
BOP(truediv, KF, x / y)
BOP(floordiv, KF | KI, FI(fdiv_py((double)x, (double)y), idiv_py(x, y)))
BOP(mod, KF | KI, FI(fmod_py((double)x, (double)y), imod_py(x, y)))
BOP(pow, KF, pow(x, y))
BOP(maximum, KF | KI | KB, FI((x > y || isnan(x)) ? x : y, x > y ? x : y))
BOP(minimum, KF | KI | KB, FI((x < y || isnan(x)) ? x : y, x < y ? x : y))
BOP(atan2, KF, atan2(x, y))
BOP(eq, KF | KI | KB, (bool)(x == y))
BOP(ne, KF | KI | KB, (bool)(x != y))
BOP(lt, KF | KI | KB, (bool)(x < y))
BOP(le, KF | KI | KB, (bool)(x <= y))
BOP(gt, KF | KI | KB, (bool)(x > y))
BOP(ge, KF | KI | KB, (bool)(x >= y))
BOP(logical_and, KF | KI | KB, (bool)((x != 0) & (y != 0)))
BOP(logical_or, KF | KI | KB, (bool)((x != 0) | (y != 0)))
BOP(logical_xor, KF | KI | KB, (bool)((x != 0) ^ (y != 0)))
BOP(bitwise_and, KI | KB, FI(0, (decltype(x))(x & y)))
BOP(bitwise_or, KI | KB, FI(0, (decltype(x))(x | y)))
BOP(bitwise_xor, KI | KB, FI(0, (decltype(x))(x ^ y)))
BOP(left_shift, KI, FI(0, shl(x, y)))
BOP(right_shift, KI, FI(0, shr(x, y)))

struct WhereF {
    template <class X> __device__ __forceinline__ X operator()(bool c, X x, X y) const { return c ? x : y; }
};
struct ClipF {
    template <class X> __device__ __forceinline__ X operator()(X x, X lo, X hi) const {
        if constexpr (std::is_floating_point<X>::value) {
            x = (x > lo || isnan(x)) ? x : lo;
            return (x < hi || isnan(x)) ? x : hi;
        } else {
            x = x > lo ? x : lo;
            return x < hi ? x : hi;
        }
    }
};
struct Ident {
    template <class X> __device__ __forceinline__ X operator()(X x) const { return x; }
};

template <int D> constexpr int kind_of() {
    return mtc_is_float<D>() ? KF : mtc_is_int<D>() ? KI : D == MT_BOOL ? KB : 0;
}

/* ---- per (op, dtype) entry points, and their tables ---- */
typedef int (*EwFn)(const mt_ew_call *);

template <int OP, int D> int unary_entry(const mt_ew_call *c) {
    if constexpr ((U<OP>::kinds_ & kind_of<D>()) != 0) {
        typedef DT<D> T;
        typedef decltype(U<OP>()(typename T::C())) R;
        if constexpr (std::is_same<R, bool>::value)
            return launch<DT<MT_BOOL>, T, T, T, 1>(c, U<OP>(), scalar<D>(c, 0), 0, 0);
        else
            return launch<T, T, T, T, 1>(c, U<OP>(), scalar<D>(c, 0), 0, 0);
    } else {
        (void)c;
        return MT_BK_ENOKERNEL;
    }
}

template <int OP, int D> int binary_entry(const mt_ew_call *c) {
    if constexpr ((B<OP>::kinds_ & kind_of<D>()) != 0) {
        typedef DT<D> T;
        typedef decltype(B<OP>()(typename T::C(), typename T::C())) R;
        if constexpr (std::is_same<R, bool>::value)
            return launch<DT<MT_BOOL>, T, T, T, 2>(c, B<OP>(), scalar<D>(c, 0), scalar<D>(c, 1), 0);
        else
            return launch<T, T, T, T, 2>(c, B<OP>(), scalar<D>(c, 0), scalar<D>(c, 1), 0);
    } else {
        (void)c;
        return MT_BK_ENOKERNEL;
    }
}

template <int OP, int D> int ternary_entry(const mt_ew_call *c) {
    typedef DT<D> T;
    if constexpr (OP == MT_T_where && kind_of<D>() != 0) {
        return launch<T, DT<MT_BOOL>, T, T, 3>(c, WhereF(), scalar<MT_BOOL>(c, 0), scalar<D>(c, 1),
                                                scalar<D>(c, 2));
    } else if constexpr (OP == MT_T_clip && (kind_of<D>() & (KF | KI)) != 0) {
        return launch<T, T, T, T, 3>(c, ClipF(), scalar<D>(c, 0), scalar<D>(c, 1), scalar<D>(c, 2));
    } else {
        (void)c;
        return MT_BK_ENOKERNEL;
    }
}

template <int S, int D> int cast_entry(const mt_ew_call *c) {
    return launch<DT<D>, DT<S>, DT<S>, DT<S>, 1>(c, Ident(), scalar<S>(c, 0), 0, 0);
}

template <int D> int fill_entry(const mt_ew_call *c) {
    EwParams p = params_of(c);
    if (p.n == 0) return 0;
    typename DT<D>::S v;
    memcpy(&v, c->aux, sizeof(v));
    fill_kernel<DT<D>><<<mtc_blocks(p.n), MTC_THREADS, 0, mtc_stream()>>>(p, v);
    return mtc_check_launch("fill kernel launch");
}

/* has: whether the entry runs a kernel (the conditions of the entries
 * above); the tables hold NULL where it does not, so has_elementwise reads
 * the same table the calls go through */
template <int OP, int D> struct UE {
    static constexpr bool has = (U<OP>::kinds_ & kind_of<D>()) != 0;
    static int run(const mt_ew_call *c) { return unary_entry<OP, D>(c); }
};
template <int OP, int D> struct BE {
    static constexpr bool has = (B<OP>::kinds_ & kind_of<D>()) != 0;
    static int run(const mt_ew_call *c) { return binary_entry<OP, D>(c); }
};
template <int OP, int D> struct TE {
    static constexpr bool has = (OP == MT_T_where && kind_of<D>() != 0) ||
                                (OP == MT_T_clip && (kind_of<D>() & (KF | KI)) != 0);
    static int run(const mt_ew_call *c) { return ternary_entry<OP, D>(c); }
};
template <int S, int D> struct CE {
    static constexpr bool has = true;
    static int run(const mt_ew_call *c) { return cast_entry<S, D>(c); }
};
template <int OP, int D> struct FE {
    static constexpr bool has = true;
    static int run(const mt_ew_call *c) { return fill_entry<D>(c); }
};

/* tables [op][dtype], filled at load time by compile-time recursion */
/* real dtypes only: complex ones have no CUDA kernels yet (NoKernelError) */
template <template <int, int> class E, int OP, int D = 0> void fill_row(EwFn *row) {
    if constexpr (D < MT_NREAL_DTYPES) {
        row[D] = E<OP, D>::has ? &E<OP, D>::run : nullptr;
        fill_row<E, OP, D + 1>(row);
    }
}
template <template <int, int> class E, int NOPS, int OP = 0> void fill_table(EwFn (*t)[MT_NDTYPES]) {
    if constexpr (OP < NOPS) {
        fill_row<E, OP>(t[OP]);
        fill_table<E, NOPS, OP + 1>(t);
    }
}

EwFn g_unary[MT_NUNARY][MT_NDTYPES];
EwFn g_binary[MT_NBINARY][MT_NDTYPES];
EwFn g_ternary[MT_NTERNARY][MT_NDTYPES];
EwFn g_cast[MT_NDTYPES][MT_NDTYPES];
EwFn g_fill[1][MT_NDTYPES];

struct Init {
    Init() {
        fill_table<UE, MT_NUNARY>(g_unary);
        fill_table<BE, MT_NBINARY>(g_binary);
        fill_table<TE, MT_NTERNARY>(g_ternary);
        fill_table<CE, MT_NREAL_DTYPES>(g_cast);
        fill_table<FE, 1>(g_fill);
    }
} g_init;

/* the table entry of (kind, op, dtype, dtype2); NULL when there is none */
EwFn entry_of(int kind, int op, int dtype, int dtype2) {
    if (dtype < 0 || dtype >= MT_NREAL_DTYPES || dtype2 < 0 || dtype2 >= MT_NREAL_DTYPES || op < 0)
        return nullptr;
    switch (kind) {
    case MT_EW_UNARY: return op < MT_NUNARY ? g_unary[op][dtype] : nullptr;
    case MT_EW_BINARY: return op < MT_NBINARY ? g_binary[op][dtype] : nullptr;
    case MT_EW_TERNARY: return op < MT_NTERNARY ? g_ternary[op][dtype] : nullptr;
    case MT_EW_CAST: return g_cast[dtype][dtype2];
    case MT_EW_FILL: return g_fill[0][dtype];
    }
    return nullptr;
}

}  // namespace

extern "C" int mtc_has_elementwise(int kind, int op, int dtype, int dtype2) {
    return entry_of(kind, op, dtype, dtype2) != nullptr;
}

extern "C" int mtc_elementwise(const mt_ew_call *c) {
    EwFn fn = entry_of(c->kind, c->op, c->dtype, c->dtype2);
    return fn ? fn(c) : MT_BK_ENOKERNEL;
}
