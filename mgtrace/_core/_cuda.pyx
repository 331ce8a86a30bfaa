# cython: language_level=3
"""The CUDA backend (optional extension, built with MGTRACE_CUDA=auto|1).

Importing it installs the CUDA device backend into the core (tensor.pyx's
backend table: allocator, copies, kernel tables, see kernels/contract/backend.h) and
loads cuBLAS at run time. The core imports it the first time a ``cuda:N``
device needs memory or kernels; ``mgtrace.cuda`` is its public face.
"""
import os
import sys

from libc.stdint cimport int64_t, uint64_t
from mgtrace._core.kernels cimport mt_backend
from mgtrace._core.tensor cimport install_backend

cdef extern from "kernels/cuda/api.h" nogil:
    const mt_backend mtc_backend
    ctypedef struct mtc_stats:
        size_t allocated, cached, peak
        uint64_t n_malloc, n_reused, n_free_calls
    int mtc_device_count(char *err, size_t errlen)
    int mtc_device_name(int index, char *out, size_t len, int *major, int *minor, size_t *total)
    void mtc_memory_stats(int index, mtc_stats *out)
    int mtc_empty_cache()
    void mtc_reset_peak(int index)
    int mtc_blas_open(const char *const *candidates, int n)
    const char *mtc_blas_status(int *loaded)
    void mtc_set_tf32(int on)
    int mtc_get_tf32()

DEV_CUDA = 1      # MT_DEV_CUDA (kernels/contract/alloc.h)


def _cublas_candidates():
    """Where cuBLAS may be: the loader's search path (CUDA 13, then 12), the
    nvidia-cublas wheel (pip), the toolkit (CUDA_HOME, /usr/local/cuda)."""
    names = ["libcublas.so.13", "libcublas.so.12", "libcublas.so"]
    found = list(names)
    dirs = []
    for p in sys.path:
        dirs.append(os.path.join(p, "nvidia", "cublas", "lib"))
        dirs.append(os.path.join(p, "nvidia", "cu13", "lib"))
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if home:
            dirs += [os.path.join(home, "lib64"), os.path.join(home, "targets", "x86_64-linux", "lib")]
    for d in dirs:
        for n in names:
            f = os.path.join(d, n)
            if os.path.isfile(f) and f not in found:
                found.append(f)
    return found


def _open_cublas():
    cands = [c.encode() for c in _cublas_candidates()]
    cdef const char *ptrs[64]
    cdef int n = min(len(cands), 64), i
    for i in range(n):
        ptrs[i] = cands[i]
    mtc_blas_open(ptrs, n)


def device_count():
    """GPUs the CUDA runtime sees (0 without a driver or GPU)."""
    cdef char err[512]
    err[0] = 0
    return mtc_device_count(err, sizeof(err))


def device_count_error():
    """Why device_count() is 0 ('' when it is not): the CUDA runtime's error."""
    cdef char err[512]
    err[0] = 0
    n = mtc_device_count(err, sizeof(err))
    return "" if n else (err.decode("utf-8", "replace") or "no CUDA device")


def device_properties(int index):
    """(name, (major, minor), total memory in bytes) of GPU ``index``."""
    cdef char name[256]
    cdef int major = 0, minor = 0
    cdef size_t total = 0
    if index < 0 or index >= device_count():
        raise ValueError(f"no CUDA device {index} (this machine has {device_count()})")
    if mtc_device_name(index, name, sizeof(name), &major, &minor, &total) != 0:
        raise RuntimeError(f"cannot read the properties of cuda:{index}")
    return name.decode(), (major, minor), total


def memory_stats(int index=0):
    """The caching allocator's counters for GPU ``index`` (bytes and counts)."""
    cdef mtc_stats s
    if index < 0 or index >= 64:
        raise ValueError(f"device index {index} out of range")
    mtc_memory_stats(index, &s)
    return {"allocated_bytes": s.allocated, "cached_bytes": s.cached,
            "reserved_bytes": s.allocated + s.cached, "peak_allocated_bytes": s.peak,
            "num_device_mallocs": s.n_malloc, "num_cache_hits": s.n_reused,
            "num_device_frees": s.n_free_calls}


def reset_peak_memory_stats(int index=0):
    mtc_reset_peak(index)


def empty_cache():
    """Give the cached free blocks of every GPU back to the driver."""
    if mtc_empty_cache() != 0:
        raise RuntimeError((<bytes>mtc_backend.last_error()).decode("utf-8", "replace"))


def blas_status():
    """(loaded, path or the reason cuBLAS is missing)."""
    cdef int loaded = 0
    cdef const char *msg = mtc_blas_status(&loaded)
    return bool(loaded), (<bytes>msg).decode("utf-8", "replace")


def set_tf32(bint on):
    """Allow TF32 tensor cores in float32 matmul/conv (off by default: float32
    products then match the CPU to float32 rounding). Returns the old value."""
    old = bool(mtc_get_tf32())
    mtc_set_tf32(1 if on else 0)
    return old


_open_cublas()
install_backend(DEV_CUDA, &mtc_backend)
