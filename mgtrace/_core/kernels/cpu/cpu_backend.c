/* mt_cpu_backend: the CPU as a backend like any other (backend.h). Its
 * memory members are host memory (alloc.c's allocator, memcpy); its kernel
 * tables are filled at import by the extensions that hold the CPU kernels:
 * dispatch (elementwise: mt_cpu_elementwise), reduce, linalg, nn, index,
 * qint8 (quant: qtable.c's mt_cpu_quant_kernels). */
#include <string.h>
#include "backend.h"

static int cpu_activate(int index) {
    (void)index;
    return MT_BK_OK;
}

static mt_storage *cpu_alloc(int index, size_t nbytes) {
    (void)index;
    return mt_storage_new_host(nbytes);
}

static int cpu_copy(void *dst, const void *src, size_t nbytes, int kind) {
    (void)kind;
    if (nbytes) memcpy(dst, src, nbytes);
    return MT_BK_OK;
}

static int cpu_synchronize(int index) {
    (void)index;
    return MT_BK_OK;      /* every CPU kernel has returned when its op has */
}

static const char *cpu_last_error(void) {
    return "";
}

mt_backend mt_cpu_backend = {
    "cpu", cpu_activate, cpu_alloc, cpu_copy, cpu_synchronize, cpu_last_error,
    NULL, NULL, NULL, NULL, NULL,     /* the kernel tables: installed at import */
    1,                                /* host memory */
    NULL,                             /* has_elementwise: installed with elementwise */
    NULL,                             /* quant: installed by qint8 at import */
};
