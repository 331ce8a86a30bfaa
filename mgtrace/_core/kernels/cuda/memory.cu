/* The CUDA backend's device state: current device, one stream per device,
 * the caching allocator, copies, errors, and the backend table itself.
 *
 * Caching allocator: a freed block goes to a free list of its size class
 * (512-byte steps up to 1 MiB, 2 MiB steps above) instead of cudaFree, and
 * the next allocation of that class on that device takes it back. Because
 * all work of a device runs on its one stream, a block freed by the host
 * while kernels that use it are still queued can be handed out at once: the
 * new user's kernels are queued after them. When cudaMalloc runs out of
 * memory the cache is emptied and the allocation tried again.
 */
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>
#include <stdlib.h>
#include <string.h>
#include "common.h"
#include "api.h"

#define MTC_MAX_DEVICES 64

namespace {

struct DeviceState {
    bool ready = false;
    cudaStream_t stream = nullptr;
    std::unordered_map<size_t, std::vector<void *>> free_blocks;   /* size class -> blocks */
    size_t allocated = 0, cached = 0, peak = 0;
    uint64_t n_malloc = 0, n_reused = 0, n_free_calls = 0;
};

std::mutex g_lock;                      /* guards the allocator (frees come with the GIL held, */
DeviceState g_dev[MTC_MAX_DEVICES];     /*  kernels may run without it) */
thread_local int t_current = -1;
thread_local std::string t_error;

size_t size_class(size_t n) {
    if (n == 0) n = 1;
    const size_t small = 512, large = (size_t)2 << 20;
    return n <= ((size_t)1 << 20) ? (n + small - 1) / small * small : (n + large - 1) / large * large;
}

int code_of(cudaError_t e) {
    return e == cudaErrorMemoryAllocation ? MT_BK_ENOMEM : MT_BK_EDEVICE;
}

/* must hold g_lock */
void release_cache(int dev) {
    DeviceState &d = g_dev[dev];
    for (auto &kv : d.free_blocks)
        for (void *p : kv.second) { cudaFree(p); d.n_free_calls++; }
    d.free_blocks.clear();
    d.cached = 0;
}

int ensure_ready(int dev) {
    DeviceState &d = g_dev[dev];
    if (d.ready) return 0;
    std::lock_guard<std::mutex> g(g_lock);
    if (d.ready) return 0;
    /* a blocking stream: it waits for the legacy default stream, on which
     * DLPack producers (PyTorch) order their work for us (stream=1) */
    cudaError_t e = cudaStreamCreate(&d.stream);
    if (e != cudaSuccess) return mtc_fail("creating the device's stream", e);
    d.ready = true;
    return 0;
}

void release_storage(mt_storage *st);

}  // namespace

extern "C" {

int mtc_fail(const char *where, cudaError_t e) {
    t_error = std::string(where) + ": " + cudaGetErrorName(e) + ": " + cudaGetErrorString(e);
    cudaGetLastError();     /* clear a non-sticky error so later calls can go on */
    return code_of(e);
}

int mtc_fail_msg(int code, const char *msg) {
    t_error = msg;
    return code;
}

int mtc_check_launch(const char *where) {
    cudaError_t e = cudaGetLastError();
    return e == cudaSuccess ? 0 : mtc_fail(where, e);
}

static const char *last_error(void) { return t_error.c_str(); }

int mtc_device(void) {
    if (t_current < 0) {
        int d = 0;
        cudaGetDevice(&d);
        t_current = d;
    }
    return t_current;
}

cudaStream_t mtc_stream(void) { return g_dev[mtc_device()].stream; }

static int activate(int index) {
    if (index < 0 || index >= MTC_MAX_DEVICES)
        return mtc_fail_msg(MT_BK_EDEVICE, "device index out of range");
    if (index != t_current) {
        cudaError_t e = cudaSetDevice(index);
        if (e != cudaSuccess) return mtc_fail("cudaSetDevice", e);
        t_current = index;
    }
    return ensure_ready(index);
}

static void *block_alloc(int dev, size_t nbytes) {
    size_t sz = size_class(nbytes);
    DeviceState &d = g_dev[dev];
    {
        std::lock_guard<std::mutex> g(g_lock);
        auto it = d.free_blocks.find(sz);
        if (it != d.free_blocks.end() && !it->second.empty()) {
            void *p = it->second.back();
            it->second.pop_back();
            d.cached -= sz;
            d.allocated += sz;
            d.n_reused++;
            if (d.allocated > d.peak) d.peak = d.allocated;
            return p;
        }
    }
    void *p = nullptr;
    cudaError_t e = cudaMalloc(&p, sz);
    if (e == cudaErrorMemoryAllocation) {
        cudaGetLastError();
        cudaStreamSynchronize(d.stream);     /* cached blocks may still be in use */
        std::lock_guard<std::mutex> g(g_lock);
        release_cache(dev);
        e = cudaMalloc(&p, sz);
    }
    if (e != cudaSuccess) {
        mtc_fail("cudaMalloc", e);
        return nullptr;
    }
    std::lock_guard<std::mutex> g(g_lock);
    d.allocated += sz;
    d.n_malloc++;
    if (d.allocated > d.peak) d.peak = d.allocated;
    return p;
}

static void block_free(int dev, void *p, size_t nbytes) {
    size_t sz = size_class(nbytes);
    std::lock_guard<std::mutex> g(g_lock);
    DeviceState &d = g_dev[dev];
    d.free_blocks[sz].push_back(p);
    d.allocated -= sz;
    d.cached += sz;
}

void *mtc_scratch(size_t nbytes) { return block_alloc(mtc_device(), nbytes); }
void mtc_scratch_free(void *ptr, size_t nbytes) { if (ptr) block_free(mtc_device(), ptr, nbytes); }

static mt_storage *alloc(int index, size_t nbytes) {
    if (activate(index) != 0) return nullptr;
    mt_storage *st = (mt_storage *)malloc(sizeof(mt_storage));
    if (!st) { mtc_fail_msg(MT_BK_ENOMEM, "out of host memory for a storage record"); return nullptr; }
    void *p = block_alloc(index, nbytes);
    if (!p) { free(st); return nullptr; }
    st->refcount = 1; st->ptr = (char *)p; st->nbytes = nbytes; st->capacity = nbytes;
    st->device_type = MT_DEV_CUDA; st->device_index = index; st->readonly = 0;
    st->release = release_storage; st->ctx = nullptr;
    /* uid: unique over the process (alloc.c numbers host storages from 1 up;
     * device storages count up from 2**63, so the two never meet) */
    static uint64_t next_uid = 0;
    st->uid = ((uint64_t)1 << 63) | __atomic_add_fetch(&next_uid, 1, __ATOMIC_RELAXED);
    st->version = 0;
    st->shared = 0;
    return st;
}

static int copy(void *dst, const void *src, size_t nbytes, int kind) {
    cudaStream_t s = mtc_stream();
    cudaMemcpyKind k = kind == MT_COPY_H2D ? cudaMemcpyHostToDevice
                     : kind == MT_COPY_D2H ? cudaMemcpyDeviceToHost : cudaMemcpyDeviceToDevice;
    cudaError_t e = cudaMemcpyAsync(dst, src, nbytes, k, s);
    if (e != cudaSuccess) return mtc_fail("cudaMemcpyAsync", e);
    /* to the host: the caller reads the bytes next; from pageable host memory
     * cudaMemcpyAsync returns once the source is staged, but a caller may
     * free it right away, so wait there too (these copies are not the hot path) */
    if (kind != MT_COPY_D2D) {
        e = cudaStreamSynchronize(s);
        if (e != cudaSuccess) return mtc_fail("copying between host and device", e);
    }
    return 0;
}

static int synchronize(int index) {
    int rc = activate(index);
    if (rc) return rc;
    cudaError_t e = cudaStreamSynchronize(mtc_stream());
    return e == cudaSuccess ? 0 : mtc_fail("cudaStreamSynchronize", e);
}

/* ---- what _cuda.pyx shows: device count, names, memory statistics ---- */

int mtc_device_count(char *err, size_t errlen) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        snprintf(err, errlen, "%s: %s", cudaGetErrorName(e), cudaGetErrorString(e));
        cudaGetLastError();
        return 0;
    }
    return n;
}

int mtc_device_name(int index, char *out, size_t len, int *major, int *minor, size_t *total) {
    cudaDeviceProp p;
    cudaError_t e = cudaGetDeviceProperties(&p, index);
    if (e != cudaSuccess) return mtc_fail("cudaGetDeviceProperties", e);
    snprintf(out, len, "%s", p.name);
    *major = p.major; *minor = p.minor; *total = p.totalGlobalMem;
    return 0;
}

void mtc_memory_stats(int index, mtc_stats *out) {
    std::lock_guard<std::mutex> g(g_lock);
    DeviceState &d = g_dev[index];
    out->allocated = d.allocated; out->cached = d.cached; out->peak = d.peak;
    out->n_malloc = d.n_malloc; out->n_reused = d.n_reused; out->n_free_calls = d.n_free_calls;
}

int mtc_empty_cache(void) {
    for (int i = 0; i < MTC_MAX_DEVICES; i++) {
        if (!g_dev[i].ready) continue;
        int rc = activate(i);
        if (rc) return rc;
        cudaStreamSynchronize(g_dev[i].stream);
        std::lock_guard<std::mutex> g(g_lock);
        release_cache(i);
    }
    return 0;
}

void mtc_reset_peak(int index) {
    std::lock_guard<std::mutex> g(g_lock);
    g_dev[index].peak = g_dev[index].allocated;
}

const mt_backend mtc_backend = {
    "cuda", activate, alloc, copy, synchronize, last_error, mtc_elementwise,
    &mtc_reduce_kernels, &mtc_linalg_kernels, &mtc_nn_kernels, &mtc_index_kernels,
    0,                       /* device memory */
    mtc_has_elementwise,
    nullptr,                 /* quant: no int8 kernels on CUDA */
};

}  // extern "C"

namespace {
void release_storage(mt_storage *st) {
    block_free(st->device_index, st->ptr, st->nbytes);
}
}  // namespace
