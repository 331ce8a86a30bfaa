"""How setup.py decides whether and how to build the CUDA extension
(``mgtrace._core._cuda``). Pure Python, no build-time imports, so that the
switch logic is unit-tested on machines without CUDA (tests/test_build.py).

Switches (documented with the others in mgtrace/_flags.py):
  MGTRACE_CUDA=auto|0|1   auto: build when nvcc and the CUDA runtime headers are
                          found, else warn with the cause and build the CPU
                          package; 1: the same, but a missing toolkit or a
                          failed compile stops the build; 0: never build it.
                          Unset: auto on a machine with an NVIDIA driver, else 0
                          (a toolkit without a GPU is common, and its kernels
                          would add minutes to every install for nothing)
  MGTRACE_CUDA_ARCHS      GPU architectures, e.g. "80,90" (default) or "sm_90";
                          each gets SASS, the highest also PTX for newer GPUs
  CUDA_HOME / CUDA_PATH   the toolkit; else the nvcc on PATH (a wrapper script
                          is followed by asking nvcc where its toolkit is)

cuBLAS is not needed to build: the extension loads it at run time (see
mgtrace/_core/cuda/blas.cu), so nvcc and the CUDA runtime are all it takes.
"""
import os
import re
import shutil
import subprocess
from dataclasses import dataclass

DEFAULT_ARCHS = (80, 90)
MODES = ("auto", "0", "1")


class CudaConfigError(ValueError):
    """A switch has a value setup.py cannot use (always fatal)."""


class CudaNotFound(RuntimeError):
    """No usable toolkit; the message names what is missing."""


@dataclass(frozen=True)
class Toolkit:
    home: str
    nvcc: str
    include: str
    libdir: str


def mode(environ):
    """MGTRACE_CUDA as one of "auto", "0", "1" (unset or empty: "auto")."""
    raw = environ.get("MGTRACE_CUDA", "").strip().lower()
    if raw in ("", "auto"):
        return "auto"
    if raw in ("0", "1"):
        return raw
    raise CudaConfigError(f"MGTRACE_CUDA must be auto, 0 or 1, got {raw!r}")


def archs(environ):
    """MGTRACE_CUDA_ARCHS as a sorted tuple of compute capabilities (80, 90).

    Accepts "80,90", "80;90", "sm_80 sm_90", "8.0,9.0"; default (80, 90)."""
    raw = environ.get("MGTRACE_CUDA_ARCHS", "").strip()
    if not raw:
        return DEFAULT_ARCHS
    out = set()
    for item in re.split(r"[,;\s]+", raw):
        if not item:
            continue
        m = re.fullmatch(r"(?:sm_|compute_)?(\d)\.?(\d)", item.lower())
        if not m:
            raise CudaConfigError(f"MGTRACE_CUDA_ARCHS: {item!r} is not an architecture such as "
                                  f"80, sm_90 or 9.0 (got {raw!r})")
        out.add(int(m.group(1) + m.group(2)))
    if not out:
        raise CudaConfigError(f"MGTRACE_CUDA_ARCHS names no architecture: {raw!r}")
    return tuple(sorted(out))


def _toolkit_at(home, nvcc):
    for inc, lib in (("include", "lib64"), ("targets/x86_64-linux/include", "targets/x86_64-linux/lib"),
                     ("targets/sbsa-linux/include", "targets/sbsa-linux/lib")):
        inc, lib = os.path.join(home, inc), os.path.join(home, lib)
        if os.path.isfile(os.path.join(inc, "cuda_runtime.h")):
            return Toolkit(os.path.normpath(home), nvcc, os.path.normpath(inc), os.path.normpath(lib))
    return None


def _home_from_nvcc(nvcc, run):
    """The toolkit nvcc uses (its TOP), for an nvcc that is a wrapper script."""
    try:
        text = run([nvcc, "--dryrun", "-x", "cu", "-c", os.devnull, "-o", os.devnull])
    except (OSError, subprocess.SubprocessError):
        return None
    m = re.search(r"^#\$ TOP=(.+)$", text, re.M)
    return os.path.normpath(m.group(1).strip()) if m else None


def _run(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    return p.stdout + p.stderr


def find_toolkit(environ, which=shutil.which, run=_run):
    """The CUDA toolkit: CUDA_HOME (or CUDA_PATH), else the nvcc on PATH.

    Raises CudaNotFound naming what is missing."""
    for var in ("CUDA_HOME", "CUDA_PATH"):
        home = environ.get(var)
        if home:
            nvcc = os.path.join(home, "bin", "nvcc")
            if not os.path.isfile(nvcc):
                raise CudaNotFound(f"{var}={home} has no bin/nvcc")
            tk = _toolkit_at(home, nvcc)
            if tk is None:
                raise CudaNotFound(f"{var}={home} has no CUDA runtime headers (include/cuda_runtime.h)")
            return tk
    nvcc = which("nvcc", path=environ.get("PATH"))
    if not nvcc:
        raise CudaNotFound("nvcc is not on PATH and CUDA_HOME is not set")
    real = os.path.realpath(nvcc)
    tk = _toolkit_at(os.path.dirname(os.path.dirname(real)), real)
    if tk is None:
        top = _home_from_nvcc(nvcc, run)
        tk = _toolkit_at(top, os.path.join(top, "bin", "nvcc")) if top else None
    if tk is None:
        raise CudaNotFound(f"found {nvcc} but no CUDA runtime headers (cuda_runtime.h) beside it; "
                           "set CUDA_HOME")
    return tk


def nvidia_driver_present(exists=os.path.exists):
    """True when this machine has an NVIDIA kernel driver (a GPU to run on)."""
    return exists("/proc/driver/nvidia/version") or exists("/dev/nvidiactl")


def plan(environ, which=shutil.which, run=_run, driver=nvidia_driver_present):
    """(toolkit or None, note): what setup.py does about CUDA.

    MGTRACE_CUDA=0, or unset on a machine without an NVIDIA driver, gives
    (None, note); a toolkit that cannot be found gives (None, warning) under
    auto and raises CudaNotFound under 1."""
    m = mode(environ)
    archs(environ)                    # a bad arch list is an error in every mode
    if m == "0":
        return None, "CUDA extension not built (MGTRACE_CUDA=0)"
    if not environ.get("MGTRACE_CUDA", "").strip() and not driver():
        return None, ("CUDA extension not built: no NVIDIA driver on this machine "
                      "(MGTRACE_CUDA unset; MGTRACE_CUDA=auto or 1 builds it anyway)")
    try:
        tk = find_toolkit(environ, which, run)
    except CudaNotFound as e:
        if m == "1":
            raise CudaNotFound(f"MGTRACE_CUDA=1 but no usable CUDA toolkit: {e}") from None
        return None, (f"warning: CUDA extension not built: {e} (MGTRACE_CUDA=auto; set "
                      "MGTRACE_CUDA=0 to silence this, or CUDA_HOME to point at a toolkit)")
    return tk, f"building the CUDA extension with {tk.nvcc} for sm_{', sm_'.join(map(str, archs(environ)))}"


def nvcc_command(tk, arch_list, src, obj, include_dirs, debug=False):
    """The nvcc command line that compiles ``src`` to a relocatable ``obj``."""
    cmd = [tk.nvcc, "-c", src, "-o", obj, "-std=c++17", "-Xcompiler", "-fPIC",
           "-O0" if debug else "-O3", "--expt-relaxed-constexpr", "-Wno-deprecated-gpu-targets"]
    if debug:
        cmd += ["-g", "-lineinfo"]
    for a in arch_list:
        cmd += ["-gencode", f"arch=compute_{a},code=sm_{a}"]
    hi = max(arch_list)
    cmd += ["-gencode", f"arch=compute_{hi},code=compute_{hi}"]     # PTX: runs on newer GPUs
    for d in include_dirs:
        cmd += ["-I", d]
    return cmd


def link_args(tk):
    """Static cudart (no libcudart.so needed at run time; libcuda.so comes with
    the driver), plus what cudart_static needs."""
    return [f"-L{tk.libdir}", "-Wl,--exclude-libs,ALL", "-lcudart_static", "-ldl", "-lrt",
            "-lpthread", "-lstdc++"]
