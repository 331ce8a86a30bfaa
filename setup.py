"""Builds mgtrace's compiled core: Cython extensions over C kernels.

Environment switches (documented in mgtrace/_flags.py):
  MGTRACE_NATIVE=1   add -march=native (off: wheels must run on any x86-64/aarch64)
  MGTRACE_DEBUG=1    -O0 -g, no OpenMP clones
  MGTRACE_SANITIZE=address   build with AddressSanitizer (tests run under LD_PRELOAD)
  MGTRACE_CUDA=1     also build the CUDA backend (needs nvcc; a later issue)
"""
import os
import numpy as np
import scipy_openblas32 as openblas
from Cython.Build import cythonize
from setuptools import Extension, setup

KERNELS = "mgtrace/_core/kernels"


def flags():
    cflags = ["-O3", "-fwrapv", "-fno-math-errno", "-fopenmp", "-std=gnu11",
              "-Wno-unused-function", "-Wno-unreachable-code", "-Wno-array-bounds", "-Wno-maybe-uninitialized", "-Wno-psabi"]
    ldflags = ["-fopenmp"]
    if os.environ.get("MGTRACE_DEBUG") == "1":
        cflags = [f for f in cflags if f != "-O3"] + ["-O0", "-g", "-DMT_NO_CLONES"]
    if os.environ.get("MGTRACE_NATIVE") == "1":
        cflags.append("-march=native")
    san = os.environ.get("MGTRACE_SANITIZE")
    if san:
        cflags += [f"-fsanitize={san}", "-fno-omit-frame-pointer", "-g", "-DMT_NO_CLONES"]
        ldflags += [f"-fsanitize={san}"]
    return cflags, ldflags


def ext(name, sources, blas=False):
    cflags, ldflags = flags()
    kw = dict(include_dirs=[np.get_include(), "mgtrace/_core"],
              define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
              extra_compile_args=cflags, extra_link_args=ldflags)
    if blas:
        # Link OpenBLAS from the scipy-openblas32 wheel the way NumPy does: its
        # symbols carry a scipy_ prefix; mgtrace._core imports scipy_openblas32
        # first (which loads the library globally), and the $ORIGIN-relative
        # rpath finds it in an installed tree as well.
        kw["include_dirs"].append(openblas.get_include_dir())
        kw["library_dirs"] = [openblas.get_lib_dir()]
        kw["libraries"] = [openblas.get_library()]
        kw["runtime_library_dirs"] = ["$ORIGIN/../../scipy_openblas32/lib"]
        kw["define_macros"].append(("BLAS_SYMBOL_PREFIX", "scipy_"))
    return Extension(f"mgtrace._core.{name}", sources, **kw)


extensions = [
    ext("dtype", ["mgtrace/_core/dtype.pyx"]),
    ext("device", ["mgtrace/_core/device.pyx"]),
    ext("tensor", ["mgtrace/_core/tensor.pyx", f"{KERNELS}/alloc.c"]),
    ext("dispatch", ["mgtrace/_core/dispatch.pyx", f"{KERNELS}/iter.c", f"{KERNELS}/elementwise.c"]),
    ext("index", ["mgtrace/_core/index.pyx", f"{KERNELS}/index.c"]),
    ext("reduce", ["mgtrace/_core/reduce.pyx", f"{KERNELS}/reduce.c", f"{KERNELS}/sort.c"]),
    ext("linalg", ["mgtrace/_core/linalg.pyx", f"{KERNELS}/gemm.c"], blas=True),
    ext("nn", ["mgtrace/_core/nn.pyx", f"{KERNELS}/conv.c", f"{KERNELS}/act.c",
               f"{KERNELS}/attention.c", f"{KERNELS}/pool.c",
               f"{KERNELS}/resize.c"], blas=True),
]
# MGTRACE_EXTENSIONS=reduce,nn builds only those (for quick local rebuilds)
_only = os.environ.get("MGTRACE_EXTENSIONS")
if _only:
    extensions = [e for e in extensions if e.name.rsplit(".", 1)[1] in _only.split(",")]

setup(
    ext_modules=cythonize(
        extensions,
        compiler_directives={"language_level": 3, "embedsignature": True},
        nthreads=int(os.environ.get("MGTRACE_BUILD_JOBS", "2")),
    ),
)
