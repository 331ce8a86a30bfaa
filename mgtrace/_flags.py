"""Every environment switch mgtrace reads, declared and documented once.

Run time (read when mgtrace is imported):
  MGTRACE_NUM_THREADS    threads for kernels and BLAS together (default: OpenMP's
                         default, usually the number of cores)
  MGTRACE_ADAPTIVE_THREADS  1: use fewer threads while other processes keep the
                         cores busy (faster under contention, but results then
                         depend on the load: a conv may pick another algorithm
                         or split, so two runs can differ in the last bit);
                         0 (default): always MGTRACE_NUM_THREADS, reproducible
  MGTRACE_HOST_CACHE_MB  bytes of freed large host blocks kept for reuse (default 1024;
                         a request takes the most recently freed one that holds it
                         with at most twice its size: see kernels/cpu/alloc.c)

OpenMP's own (libgomp reads them when it loads, i.e. at mgtrace's first import
of a compiled module): unless OMP_WAIT_POLICY or GOMP_SPINCOUNT is set,
mgtrace sets GOMP_SPINCOUNT=SPINCOUNT (below) before that import: idle kernel
threads spin that many rounds (tens of microseconds, enough for the next
kernel of a forward) and then sleep, instead of libgomp's default of about a
millisecond of spinning, which steals the cores from other processes on a
busy machine (a 1x64x112x112 relu took 8-20 ms instead of 0.3 ms beside two
busy processes). Set either variable yourself to choose otherwise.

Build time (read by setup.py):
  MGTRACE_NATIVE=1       compile with -march=native (off by default: wheels must
                         run on any CPU of the architecture)
  MGTRACE_DEBUG=1        -O0 -g
  MGTRACE_SANITIZE=address   AddressSanitizer build (run with LD_PRELOAD of libasan)
  MGTRACE_EXTENSIONS=a,b build only these extensions (local rebuilds)
  MGTRACE_BUILD_JOBS=N   files compiled at a time (default: the number of CPUs)

  MGTRACE_CUDA=auto|0|1  the CUDA backend (mgtrace._core._cuda, see setup_cuda.py):
                         auto builds it when nvcc and the CUDA runtime headers
                         are found and warns with the cause when not; 1 fails
                         the build instead; 0 never builds it; unset is auto
                         on a machine with an NVIDIA driver, else 0
  MGTRACE_CUDA_ARCHS     its GPU architectures, default "80,90" (sm_80, sm_90)
  CUDA_HOME, CUDA_PATH   the CUDA toolkit (else the nvcc on PATH)
"""
import os


def _int(name, default, maximum=None):
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"environment variable {name} must be an integer, got {raw!r}") from None
    if value < 0:
        raise ValueError(f"environment variable {name} must be >= 0, got {value}")
    if maximum is not None and value > maximum:
        raise ValueError(f"environment variable {name} must be <= {maximum}, got {value}")
    return value


NUM_THREADS = _int("MGTRACE_NUM_THREADS", 0)        # 0: leave the default
ADAPTIVE_THREADS = _int("MGTRACE_ADAPTIVE_THREADS", 0) != 0    # off: outputs must not depend on load
SPINCOUNT = "10000"        # GOMP_SPINCOUNT mgtrace sets when neither OpenMP variable is set


def set_openmp_defaults(environ=os.environ):
    """Set GOMP_SPINCOUNT (see the module docstring) unless the user chose a
    wait policy; must run before libgomp loads. Returns what it set."""
    if "OMP_WAIT_POLICY" in environ or "GOMP_SPINCOUNT" in environ:
        return {}
    environ["GOMP_SPINCOUNT"] = SPINCOUNT
    return {"GOMP_SPINCOUNT": SPINCOUNT}
HOST_CACHE_MB_MAX = (1 << 44) - 1      # its bytes fit 64 bits
HOST_CACHE_MB = _int("MGTRACE_HOST_CACHE_MB", 1024, HOST_CACHE_MB_MAX)
