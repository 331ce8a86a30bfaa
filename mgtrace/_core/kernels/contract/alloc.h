/* Reference-counted storage and the host allocator. */
#ifndef MT_ALLOC_H
#define MT_ALLOC_H
#include <stddef.h>
#include <stdint.h>

enum mt_device_type { MT_DEV_CPU = 0, MT_DEV_CUDA = 1 };

typedef struct mt_storage {
    int64_t refcount;          /* touched only under the GIL */
    char *ptr;
    size_t nbytes;
    int device_type;
    int device_index;
    int readonly;
    /* NULL: memory from mt_host_alloc. Otherwise called once to give the
     * memory back to its owner (an ndarray, a DLPack producer, an mmap). */
    void (*release)(struct mt_storage *);
    void *ctx;
    /* For caches of values derived from the contents (conv2d's transformed
     * Winograd weights): uid is unique over the process's lifetime (a new
     * storage at a freed one's address gets a new uid), version counts the
     * in-place writes mgtrace made (dispatch's check_writable bumps it), and
     * shared is set once the memory was exported writable (DLPack), or for
     * memory imported from others, who may write it unseen. */
    uint64_t uid;
    uint64_t version;
    int shared;
    /* the bytes of the block mt_host_alloc gave (at least nbytes: a cached
     * block may be larger); what mt_host_free takes back. Host memory only. */
    size_t capacity;
} mt_storage;

/* Whether every write to the storage's memory bumps its version: memory
 * mgtrace allocated and never exported writable, or read-only memory whose
 * owner vouched that nothing writes it (imported memory is marked shared:
 * see tensor.pyx's from_dlpack and mark_immutable). */
static inline int mt_storage_tracked(const mt_storage *st) {
    return !st->shared && (st->readonly || st->release == NULL);
}

mt_storage *mt_storage_new_host(size_t nbytes);
mt_storage *mt_storage_wrap(void *ptr, size_t nbytes, int device_type, int device_index,
                            void (*release)(mt_storage *), void *ctx);
void mt_storage_decref(mt_storage *st);

/* A block of at least nbytes, its size in *capacity; give it back with
 * mt_host_free(ptr, *capacity). */
void *mt_host_alloc(size_t nbytes, size_t *capacity);
void mt_host_free(void *ptr, size_t capacity);
/* Bytes held in the cache of freed large blocks, and a way to return them. */
size_t mt_host_cached_bytes(void);
void mt_host_cache_clear(void);
void mt_host_cache_set_limit(size_t bytes);

#endif
