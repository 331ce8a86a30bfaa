"""CUDA devices: whether there are any, their memory, and waiting for them.

Tensors live on a GPU when created or moved there (``mt.tensor(x,
device="cuda:0")``, ``t.to("cuda:0")``, ``module.to("cuda:0")``,
``mt.load(path, device="cuda:0")``); their ops then run CUDA kernels. The
backend is the optional extension ``mgtrace._core._cuda``, built when
``pip install`` finds nvcc (``MGTRACE_CUDA=auto``, the default; ``=1`` makes
a missing toolkit an error). ``mgtrace doctor`` says whether it was built and,
if it does not load, why.

Work is queued on one stream per device and runs while Python goes on;
reading a result (``numpy()``, ``item()``, printing) waits for it, and so does
:func:`synchronize`. Freed device memory is kept by a caching allocator for
reuse (:func:`memory_stats`, :func:`empty_cache`).

>>> import mgtrace.cuda
>>> isinstance(mgtrace.cuda.is_available(), bool)
True
"""
__all__ = ["is_available", "device_count", "load_error", "get_device_name", "synchronize",
           "memory_stats", "reset_peak_memory_stats", "empty_cache", "set_tf32", "blas_status"]


def _ext():
    """The loaded CUDA extension; RuntimeError saying why when it is missing."""
    from mgtrace._core.tensor import backend_status
    loaded, why = backend_status("cuda")
    if not loaded:
        raise RuntimeError(f"mgtrace's CUDA backend is not available: {why} (build with "
                           "MGTRACE_CUDA=1 pip install ...; see `mgtrace doctor`)")
    from mgtrace._core import _cuda
    return _cuda


def load_error():
    """Why the CUDA backend is not usable ('' when it is): the extension's
    import error, or the CUDA runtime's reason for seeing no GPU."""
    from mgtrace._core.tensor import backend_status
    loaded, why = backend_status("cuda")
    if not loaded:
        return why
    from mgtrace._core import _cuda
    return _cuda.device_count_error()


def is_available():
    """True when the CUDA backend is built and at least one GPU is visible."""
    return device_count() > 0


def device_count():
    """GPUs visible to the CUDA backend (0 without the backend, a driver or a GPU)."""
    try:
        return _ext().device_count()
    except RuntimeError:
        return 0


def _index(device):
    from mgtrace._core import as_device, get_default_device
    d = as_device(device) if device is not None else get_default_device()
    if d.type != "cuda":
        if device is not None:
            raise ValueError(f"{d} is not a CUDA device")
        d = as_device("cuda:0")
    return d


def get_device_name(device=None):
    """The GPU's name, e.g. 'NVIDIA H200' (device: 'cuda:N', default the
    default device when it is a GPU, else cuda:0)."""
    return _ext().device_properties(_index(device).index)[0]


def synchronize(device=None):
    """Wait for every kernel and copy queued on the GPU to finish."""
    _ext()
    from mgtrace._core.tensor import synchronize as sync
    sync(_index(device))


def memory_stats(device=None):
    """The caching allocator's counters of one GPU: allocated_bytes (held by
    tensors), cached_bytes (freed, kept for reuse), reserved_bytes (both),
    peak_allocated_bytes, num_device_mallocs, num_cache_hits, num_device_frees."""
    return _ext().memory_stats(_index(device).index)


def reset_peak_memory_stats(device=None):
    """Start peak_allocated_bytes again from what is allocated now."""
    _ext().reset_peak_memory_stats(_index(device).index)


def empty_cache():
    """Return the cached free blocks of every GPU to the driver (tensors in
    use keep their memory)."""
    _ext().empty_cache()


def set_tf32(enabled):
    """Let float32 matmul and conv2d use TF32 tensor cores (faster, about 10
    bits of mantissa). Off by default, so float32 results match the CPU's to
    float32 rounding. Returns the previous setting."""
    return _ext().set_tf32(bool(enabled))


def blas_status():
    """(loaded, detail): whether cuBLAS was found (detail: its path), or why
    not (detail: the libraries tried). matmul and conv2d on CUDA need it."""
    return _ext().blas_status()
