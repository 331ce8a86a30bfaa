"""Every environment switch mgtrace reads, declared and documented once.

Run time (read when mgtrace is imported):
  MGTRACE_NUM_THREADS    threads for kernels and BLAS together (default: OpenMP's
                         default, usually the number of cores)
  MGTRACE_HOST_CACHE_MB  bytes of freed large host blocks kept for reuse (default 1024)

Build time (read by setup.py):
  MGTRACE_CUDA=1         also build the CUDA backend (needs nvcc)
  MGTRACE_NATIVE=1       compile with -march=native (off by default: wheels must
                         run on any CPU of the architecture)
  MGTRACE_DEBUG=1        -O0 -g
  MGTRACE_SANITIZE=address   AddressSanitizer build (run with LD_PRELOAD of libasan)
  MGTRACE_EXTENSIONS=a,b build only these extensions (local rebuilds)
  MGTRACE_BUILD_JOBS=N   parallel Cython jobs (default 2)
"""
import os


def _int(name, default):
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"environment variable {name} must be an integer, got {raw!r}") from None
    if value < 0:
        raise ValueError(f"environment variable {name} must be >= 0, got {value}")
    return value


NUM_THREADS = _int("MGTRACE_NUM_THREADS", 0)        # 0: leave the default
HOST_CACHE_MB = _int("MGTRACE_HOST_CACHE_MB", 1024)
