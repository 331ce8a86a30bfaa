/* The N-d elementwise driver and the thread count shared by all kernels. */
#define _GNU_SOURCE
#include "mt_common.h"
#include "backend.h"
#include "elementwise.h"
#include <fcntl.h>
#include <sched.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
#ifdef _OPENMP
#include <omp.h>
#endif

static int mt_threads = 0; /* 0: not set yet, use the OpenMP default */
static int mt_adaptive = 1; /* follow the machine's load (mt_run_threads); mgtrace._core
                             * sets it at import, off unless MGTRACE_ADAPTIVE_THREADS=1 */

int mt_get_num_threads(void) {
#ifdef _OPENMP
    return mt_threads > 0 ? mt_threads : omp_get_max_threads();
#else
    return 1;
#endif
}

void mt_set_num_threads(int n) {
    mt_threads = n > 0 ? n : 1;
#ifdef _OPENMP
    omp_set_num_threads(mt_threads);
#endif
}

void mt_set_adaptive_threads(int on) { mt_adaptive = on != 0; }

static __thread int mt_pinned = 0; /* mt_pin_run_threads: this thread's count, 0 for none */

int mt_pin_run_threads(int n) {
    const int old = mt_pinned;
    mt_pinned = n > 0 ? n : 0;
    return old;
}
int mt_get_adaptive_threads(void) { return mt_adaptive; }

/* Runnable threads on the machine right now: the numerator of the fourth
 * field of /proc/loadavg ("0.52 0.58 0.59 3/361 1234"); -1 if unreadable. */
static int runnable_now(void) {
    char buf[128];
    int fd = open("/proc/loadavg", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return -1;
    buf[n] = 0;
    char *p = buf;
    for (int field = 0; field < 3 && p; field++) { p = strchr(p, ' '); if (p) p++; }
    return p ? atoi(p) : -1;
}

static int cpus_allowed(void) {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) return CPU_COUNT(&set);
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

/* Threads for the next kernel: the configured count, less the cores other
 * processes keep busy. Under contention a team of OpenMP threads runs at
 * the pace of its most-descheduled member (each region ends in a barrier):
 * on 2 cores beside two busy processes, 2 threads made ResNet-18 3-5x
 * slower than 1. Other processes' runnable threads are estimated as the
 * machine's runnable count less this team's n (the caller and, while they
 * spin, its workers), which never takes a thread away on a quiet machine.
 * Read at most every 50 ms (a read of /proc/loadavg costs a few us). */
int mt_run_threads(void) {
    static int ncpu = 0, cached = 0;
    static int64_t next_ns = 0;
    if (mt_pinned > 0) return mt_pinned;
    const int n = mt_get_num_threads();
    if (n <= 1 || !mt_adaptive) return n;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    const int64_t now = (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
    if (now >= next_ns || cached <= 0) {   /* races here only repeat the read */
        if (ncpu == 0) ncpu = cpus_allowed();
        const int running = runnable_now();
        int avail = running < 0 ? n : ncpu - (running - n);
        cached = avail < 1 ? 1 : avail;
        next_ns = now + 50000000;
    }
    return cached < n ? cached : n;
}

/* Elements of "cost 1" work (an add) below which one thread is faster:
 * an OpenMP fork/join costs a few microseconds. */
#define MT_GRAIN 65536

/* Walks the linear index range [start, end) of the iteration space,
 * calling fn on runs along the innermost dimension. */
static void nd_range(mt_loop_fn fn, int nargs, char **base, int ndim, const int64_t *shape,
                     const int64_t *strides, const void *aux, int64_t start, int64_t end) {
    int64_t idx[MT_MAX_NDIM];
    int64_t steps[8];
    char *ptr[8];
    const int last = ndim - 1;
    const int64_t inner = shape[last];
    int64_t rem = start;
    for (int d = last; d >= 0; d--) { idx[d] = rem % shape[d]; rem /= shape[d]; }
    for (int a = 0; a < nargs; a++) {
        steps[a] = strides[a * MT_MAX_NDIM + last];
        ptr[a] = base[a];
        for (int d = 0; d < ndim; d++) ptr[a] += idx[d] * strides[a * MT_MAX_NDIM + d];
    }
    int64_t pos = start;
    while (pos < end) {
        int64_t run = inner - idx[last];
        if (run > end - pos) run = end - pos;
        fn(ptr, steps, run, aux);
        pos += run;
        if (pos >= end) break;
        /* back to the start of this row, then carry into the outer dims */
        for (int a = 0; a < nargs; a++) ptr[a] -= idx[last] * steps[a];
        idx[last] = 0;
        int d = last - 1;
        for (; d >= 0; d--) {
            idx[d]++;
            for (int a = 0; a < nargs; a++) ptr[a] += strides[a * MT_MAX_NDIM + d];
            if (idx[d] < shape[d]) break;
            for (int a = 0; a < nargs; a++) ptr[a] -= shape[d] * strides[a * MT_MAX_NDIM + d];
            idx[d] = 0;
        }
    }
}

void mt_nd_loop(mt_loop_fn fn, int nargs, char **base, int ndim, const int64_t *shape,
                const int64_t *strides, const void *aux, int cost) {
    int64_t one_shape = 1, zero_strides[8 * MT_MAX_NDIM];
    if (ndim == 0) {  /* a 0-d iteration is one element */
        memset(zero_strides, 0, sizeof(zero_strides));
        shape = &one_shape; strides = zero_strides; ndim = 1;
    }
    int64_t total = 1;
    for (int d = 0; d < ndim; d++) total *= shape[d];
    if (total == 0) return;
    int nthreads = mt_run_threads();
    int64_t work = total * (cost > 0 ? cost : 1);
    if (nthreads <= 1 || work < MT_GRAIN) {
        nd_range(fn, nargs, base, ndim, shape, strides, aux, 0, total);
        return;
    }
    int64_t max_chunks = work / MT_GRAIN;
    int nchunks = (int)(max_chunks < nthreads ? max_chunks : nthreads);
#ifdef _OPENMP
    #pragma omp parallel for num_threads(nchunks) schedule(static)
#endif
    for (int c = 0; c < nchunks; c++) {
        /* chunk boundaries rounded to 16 elements so each thread writes whole cache lines */
        int64_t s = (total * c / nchunks) & ~(int64_t)15;
        int64_t e = c == nchunks - 1 ? total : (total * (c + 1) / nchunks) & ~(int64_t)15;
        if (s < e) nd_range(fn, nargs, base, ndim, shape, strides, aux, s, e);
    }
}


/* the loop of (kind, op, dtype, dtype2); NULL when the tables have none */
static mt_loop_fn cpu_loop(int kind, int op, int dtype, int dtype2) {
    if (dtype < 0 || dtype >= MT_NDTYPES || dtype2 < 0 || dtype2 >= MT_NDTYPES || op < 0) return NULL;
    switch (kind) {
    case MT_EW_UNARY: return op < MT_NUNARY ? mt_unary_loops[op][dtype] : NULL;
    case MT_EW_BINARY: return op < MT_NBINARY ? mt_binary_loops[op][dtype] : NULL;
    case MT_EW_TERNARY: return op < MT_NTERNARY ? mt_ternary_loops[op][dtype] : NULL;
    case MT_EW_CAST: return mt_cast_loops[dtype][dtype2];
    case MT_EW_FILL: return mt_fill_loops[dtype];
    }
    return NULL;
}

int mt_cpu_has_elementwise(int kind, int op, int dtype, int dtype2) {
    return cpu_loop(kind, op, dtype, dtype2) != NULL;
}

int mt_cpu_elementwise(const mt_ew_call *c) {
    mt_loop_fn fn = cpu_loop(c->kind, c->op, c->dtype, c->dtype2);
    if (fn == NULL) return MT_BK_ENOKERNEL;
    mt_nd_loop(fn, c->nargs, (char **)c->args, c->ndim, c->shape, &c->strides[0][0], c->aux, c->cost);
    return MT_BK_OK;
}
