/* Host memory: 64-byte aligned blocks. Large blocks come from mmap with
 * transparent huge pages requested, and freed large blocks are kept in a
 * small cache keyed by size, so that allocating a big output costs less
 * than the page faults of fresh memory (which otherwise exceed an add). */
#include "alloc.h"
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <sys/mman.h>

/* Freed blocks from MT_CACHED up are kept for reuse: glibc would mmap them
 * afresh on every malloc (its threshold is 128 KiB), and those page faults
 * cost more than, say, a 256x256 sgemm's arithmetic. Blocks from MT_LARGE up
 * come from mmap with huge pages requested; smaller cached blocks come from
 * posix_memalign, which does not page-align them (page-aligned operands of a
 * small GEMM alias in the L1 cache and run several times slower).
 *
 * A request takes the most recently freed block of its class (below or from
 * MT_LARGE) that holds it with at most MT_REUSE_RATIO times its size, not
 * the exact size only: the most recently freed block is the one the caches
 * still hold. A network's layers free each activation soon after the next
 * layer wrote its own; with exact sizes, an activation's block had last
 * been touched a whole forward earlier, and every layer read its output
 * block from memory before writing it (MobileNetV2 at one thread took 7.9
 * ms a forward that way, 6.1-7.2 ms this way). The cost is memory: a block may
 * be up to MT_REUSE_RATIO times what its tensor needs. */
#define MT_CACHED (64u << 10)
#define MT_LARGE (1u << 20)
/* Enough slots that the byte limit, not the count, bounds the cache: a
 * training step frees more than 64 large blocks between its backward and
 * the next forward, and with 64 slots the next forward mapped the rest
 * afresh (MiniLM-L6 at 8 x 128, one thread: ~50 mmaps and 13k page faults
 * a step, 2k with 512 slots; the attention's scale-by-a-scalar over 6 MB
 * took 2.3 ms a call in the step against 0.45 ms on a reused block) */
#define MT_CACHE_SLOTS 512
#define MT_REUSE_RATIO 2

typedef struct { void *ptr; size_t size; } mt_block;
static mt_block cache[MT_CACHE_SLOTS];
static int cache_n = 0;
static size_t cache_bytes = 0;
static size_t cache_limit = (size_t)1 << 30;
static pthread_mutex_t cache_lock = PTHREAD_MUTEX_INITIALIZER;

static size_t large_size(size_t n) {
    /* round to 4 KiB pages below 1 MiB, to 64 KiB above, so sizes repeat */
    size_t g = n < (1u << 20) ? 4095u : 65535u;
    return (n + g) & ~g;
}

static void *fresh_block(size_t size) {
    if (size < MT_LARGE) {
        void *p = NULL;
        return posix_memalign(&p, 64, size) == 0 ? p : NULL;
    }
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return NULL;
#ifdef MADV_HUGEPAGE
    if (size >= (2u << 20)) madvise(p, size, MADV_HUGEPAGE);
#endif
    return p;
}

static void release_block(void *p, size_t size) {
    if (size < MT_LARGE) free(p); else munmap(p, size);
}

/* The most recently freed cached block that fits a request of `size`
 * (see above), out of the cache; NULL when none does. */
static void *cache_take(size_t size, size_t *capacity) {
    const int large = size >= MT_LARGE;
    void *p = NULL;
    pthread_mutex_lock(&cache_lock);
    for (int i = cache_n - 1; i >= 0; i--) {
        const size_t s = cache[i].size;
        if (s >= size && s / MT_REUSE_RATIO <= size && (s >= MT_LARGE) == large) {
            p = cache[i].ptr;
            *capacity = s;
            cache_bytes -= s;
            /* keep the rest in the order they were freed */
            memmove(cache + i, cache + i + 1, sizeof(mt_block) * (size_t)(cache_n - i - 1));
            cache_n--;
            break;
        }
    }
    pthread_mutex_unlock(&cache_lock);
    return p;
}

void *mt_host_alloc(size_t nbytes, size_t *capacity) {
    if (nbytes == 0) nbytes = 1;
    if (nbytes < MT_CACHED) {
        void *p = NULL;
        size_t rounded = (nbytes + 63u) & ~(size_t)63u;
        if (rounded < nbytes || posix_memalign(&p, 64, rounded) != 0) return NULL;
        *capacity = nbytes;       /* below MT_CACHED: mt_host_free calls free() */
        return p;
    }
    size_t size = large_size(nbytes);
    if (size < nbytes) return NULL;
    void *p = cache_take(size, capacity);
    if (p) return p;
    p = fresh_block(size);
    if (!p) {   /* out of memory: give the cache back and try once more */
        mt_host_cache_clear();
        p = fresh_block(size);
    }
    *capacity = size;
    return p;
}

void mt_host_free(void *ptr, size_t capacity) {
    if (!ptr) return;
    if (capacity < MT_CACHED) { free(ptr); return; }
    const size_t size = capacity;     /* a block's size as mt_host_alloc gave it */
    void *evict = NULL;
    size_t evict_size = 0;
    pthread_mutex_lock(&cache_lock);
    if (size <= cache_limit) {
        if (cache_n == MT_CACHE_SLOTS) {   /* drop the oldest entry */
            evict = cache[0].ptr; evict_size = cache[0].size;
            cache_bytes -= evict_size;
            memmove(cache, cache + 1, sizeof(mt_block) * (MT_CACHE_SLOTS - 1));
            cache_n--;
        }
        cache[cache_n].ptr = ptr; cache[cache_n].size = size; cache_n++;
        cache_bytes += size;
        ptr = NULL;
        while (cache_bytes > cache_limit && cache_n > 0) {
            /* over the limit: release oldest blocks (outside the lock below) */
            if (evict) release_block(evict, evict_size);
            evict = cache[0].ptr; evict_size = cache[0].size;
            cache_bytes -= evict_size;
            memmove(cache, cache + 1, sizeof(mt_block) * (size_t)(cache_n - 1));
            cache_n--;
        }
    }
    pthread_mutex_unlock(&cache_lock);
    if (evict) release_block(evict, evict_size);
    if (ptr) release_block(ptr, size);
}

size_t mt_host_cached_bytes(void) {
    pthread_mutex_lock(&cache_lock);
    size_t b = cache_bytes;
    pthread_mutex_unlock(&cache_lock);
    return b;
}

void mt_host_cache_clear(void) {
    pthread_mutex_lock(&cache_lock);
    for (int i = 0; i < cache_n; i++) release_block(cache[i].ptr, cache[i].size);
    cache_n = 0; cache_bytes = 0;
    pthread_mutex_unlock(&cache_lock);
}

void mt_host_cache_set_limit(size_t bytes) {
    pthread_mutex_lock(&cache_lock);
    cache_limit = bytes;
    pthread_mutex_unlock(&cache_lock);
    if (mt_host_cached_bytes() > bytes) mt_host_cache_clear();
}

static uint64_t next_uid = 0;

static void storage_stamp(mt_storage *st) {
    st->uid = __atomic_add_fetch(&next_uid, 1, __ATOMIC_RELAXED);
    st->version = 0;
    st->shared = 0;
}

mt_storage *mt_storage_new_host(size_t nbytes) {
    mt_storage *st = (mt_storage *)malloc(sizeof(mt_storage));
    if (!st) return NULL;
    st->ptr = (char *)mt_host_alloc(nbytes, &st->capacity);
    if (!st->ptr) { free(st); return NULL; }
    st->refcount = 1; st->nbytes = nbytes;
    st->device_type = MT_DEV_CPU; st->device_index = 0; st->readonly = 0;
    st->release = NULL; st->ctx = NULL;
    storage_stamp(st);
    return st;
}

mt_storage *mt_storage_wrap(void *ptr, size_t nbytes, int device_type, int device_index,
                            void (*release)(mt_storage *), void *ctx) {
    mt_storage *st = (mt_storage *)malloc(sizeof(mt_storage));
    if (!st) return NULL;
    st->refcount = 1; st->ptr = (char *)ptr; st->nbytes = nbytes; st->capacity = nbytes;
    st->device_type = device_type; st->device_index = device_index; st->readonly = 0;
    st->release = release; st->ctx = ctx;
    storage_stamp(st);
    return st;
}

void mt_storage_decref(mt_storage *st) {
    if (!st || --st->refcount > 0) return;
    if (st->release) st->release(st);
    else mt_host_free(st->ptr, st->capacity);
    free(st);
}
