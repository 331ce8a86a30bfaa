"""Builds mgtrace's compiled core: Cython extensions over C kernels.

Environment switches (documented in mgtrace/_flags.py):
  MGTRACE_NATIVE=1   add -march=native (off: wheels must run on any x86-64/aarch64)
  MGTRACE_DEBUG=1    -O0 -g, no OpenMP clones
  MGTRACE_SANITIZE=address   build with AddressSanitizer (tests run under LD_PRELOAD)
  MGTRACE_EXTENSIONS=a,b     build only these extensions (quick local rebuilds)
  MGTRACE_BUILD_JOBS=N       compile N files at a time (default: the number of CPUs)
  MGTRACE_CUDA=auto|0|1      the CUDA extension mgtrace._core._cuda (see setup_cuda.py)
  MGTRACE_CUDA_ARCHS=80,90   its GPU architectures

Every C file of every extension is compiled in one pool of jobs, the longest
first, each printed as it starts (``pip install -v`` shows them; plain pip
shows only its spinner), then each extension is linked.
"""
import concurrent.futures
import glob
import hashlib
import json
import os
import shutil
import sys
import time

import numpy as np
import scipy_openblas32 as openblas
from Cython.Build import cythonize
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import setup_cuda  # noqa: E402  (the CUDA switch logic, unit-tested on its own)

# the kernel tree (see README's layout): contract/ is the device-neutral
# interface every backend implements, cpu/ and cuda/ the two backends' kernels
KERNELS = "mgtrace/_core/kernels/cpu"
CONTRACT = "mgtrace/_core/kernels/contract"


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


# every extension is rebuilt when one of these changes (setuptools looks at sources only)
DEPENDS = sorted(glob.glob(f"{CONTRACT}/*.h") + glob.glob(f"{KERNELS}/*.h") + glob.glob("mgtrace/_core/*.pxd"))
# compiled first: together about 2/3 of the compile time (dtype variants made by
# macros, hot loops with an AVX2 clone); the other files follow, biggest first
SLOW_FIRST = [f"{KERNELS}/reduce.c", f"{KERNELS}/elementwise.c"]


def ext(name, sources, blas=False, parts=()):
    """parts: files a source #includes that DEPENDS does not list (conv.c's conv/*)."""
    cflags, ldflags = flags()
    kw = dict(include_dirs=[np.get_include(), "mgtrace/_core", CONTRACT, KERNELS],
              define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
              extra_compile_args=cflags, extra_link_args=ldflags, depends=DEPENDS + sorted(parts))
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
    ext("tensor", ["mgtrace/_core/tensor.pyx", f"{KERNELS}/alloc.c", f"{KERNELS}/cpu_backend.c"]),
    ext("dispatch", ["mgtrace/_core/dispatch.pyx", f"{KERNELS}/iter.c", f"{KERNELS}/elementwise.c",
                     f"{KERNELS}/complex.c"]),
    ext("index", ["mgtrace/_core/index.pyx", f"{KERNELS}/index.c"]),
    ext("reduce", ["mgtrace/_core/reduce.pyx", f"{KERNELS}/reduce.c", f"{KERNELS}/sort.c"]),
    ext("linalg", ["mgtrace/_core/linalg.pyx", f"{KERNELS}/gemm.c"], blas=True),
    ext("nn", ["mgtrace/_core/nn.pyx", f"{KERNELS}/conv.c", f"{KERNELS}/nchwc.c", f"{KERNELS}/act.c",
               f"{KERNELS}/attention.c", f"{KERNELS}/norm.c", f"{KERNELS}/pool.c",
               f"{KERNELS}/resize.c", f"{KERNELS}/blas_threads.c", f"{KERNELS}/cpu_features.c",
               f"{KERNELS}/grad.c", f"{KERNELS}/conv3d.c",
               f"{KERNELS}/rnn_cell.c", f"{KERNELS}/lrn.c", f"{KERNELS}/train.c",
               f"{KERNELS}/attention_grad.c"],
        blas=True, parts=glob.glob(f"{KERNELS}/conv/*")),
    # inference plans' executor (mgtrace.plan): replays recorded kernel calls
    ext("plan", ["mgtrace/_core/plan.pyx", f"{KERNELS}/plan.c"]),
    ext("qint8", ["mgtrace/_core/qint8.pyx", f"{KERNELS}/qtable.c", f"{KERNELS}/qgemm.c",
                  f"{KERNELS}/qconv.c", f"{KERNELS}/qelemwise.c", f"{KERNELS}/qpool.c",
                  f"{KERNELS}/qblock.c"]),
]
CUDA_DIR = "mgtrace/_core/kernels/cuda"
CUDA_EXT = "mgtrace._core._cuda"
CUDA_SOURCES = {}       # extension name -> its .cu files
# nvcc's slowest (every op x dtype of the elementwise table, per architecture): first of all
CUDA_SLOW_FIRST = [f"{CUDA_DIR}/elementwise.cu", f"{CUDA_DIR}/reduce.cu"]
try:
    CUDA_TOOLKIT, CUDA_NOTE = setup_cuda.plan(os.environ)
except (setup_cuda.CudaConfigError, setup_cuda.CudaNotFound) as _e:
    sys.exit(f"mgtrace build: {_e}")
print(f"mgtrace build: {CUDA_NOTE}", file=sys.stderr, flush=True)
if CUDA_TOOLKIT is not None:
    cuda_ext = ext("_cuda", ["mgtrace/_core/_cuda.pyx"])
    # nvcc compiles these (setuptools knows no .cu); the pool below runs them
    # beside the C files and the link adds their objects. Kept by extension
    # name: cythonize() makes new Extension objects, without extra attributes.
    CUDA_SOURCES[CUDA_EXT] = sorted(glob.glob(f"{CUDA_DIR}/*.cu"))
    cuda_ext.depends = cuda_ext.depends + CUDA_SOURCES[CUDA_EXT] + sorted(glob.glob(f"{CUDA_DIR}/*.h"))
    cuda_ext.include_dirs.append(CUDA_TOOLKIT.include)
    cuda_ext.extra_link_args = cuda_ext.extra_link_args + setup_cuda.link_args(CUDA_TOOLKIT)
    extensions.append(cuda_ext)
# MGTRACE_EXTENSIONS=reduce,nn builds only those (for quick local rebuilds)
_only = os.environ.get("MGTRACE_EXTENSIONS")
if _only:
    extensions = [e for e in extensions if e.name.rsplit(".", 1)[1] in _only.split(",")]



def build_jobs():
    """MGTRACE_BUILD_JOBS, else the CPUs this process may use."""
    raw = os.environ.get("MGTRACE_BUILD_JOBS", "")
    if raw:
        try:
            n = int(raw)
        except ValueError:
            n = 0
        if n < 1:
            sys.exit(f"MGTRACE_BUILD_JOBS must be a whole number >= 1, got {raw!r}")
        return n
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


class ParallelBuildExt(build_ext):
    """build_ext that compiles the C files of all extensions in one pool of
    :func:`build_jobs` jobs, the slowest first (so the longest compile is not
    the one started last), printing each, then links every extension.

    The plain build_ext runs first with compiling and linking recorded
    instead of done, so which extensions are out of date, their flags and
    their outputs stay setuptools' business.

    An editable install (``pip install -e .``) builds in a new temporary
    folder each time, so setuptools alone would rebuild everything on every
    install (the README's second command rebuilt what the first had built).
    An extension whose copy in the source tree is newer than its sources and
    headers, and was built with the same flags, compiler, Python, NumPy and
    Cython (``build/mgtrace-build.json`` keeps a digest of them per
    extension), is reused instead. An extension built with other flags, or
    unknown ones, is built again (setuptools alone would keep it)."""

    STAMP = os.path.join("build", "mgtrace-build.json")

    def build_extensions(self):
        configs = {e.name: self._config(e) for e in self.extensions}
        stamp = self._read_stamp()
        self._reuse_in_tree(configs, stamp)
        compile_calls, link_calls = [], []
        compiler = self.compiler
        real_compile, real_link = compiler.compile, compiler.link_shared_object

        def record_compile(sources, output_dir=None, **kw):
            compile_calls.append((sources, output_dir, kw))
            return compiler.object_filenames(sources, strip_dir=0, output_dir=output_dir)

        def record_link(*args, **kw):
            link_calls.append((args, kw))

        compiler.compile, compiler.link_shared_object = record_compile, record_link
        try:
            super().build_extensions()
        finally:
            compiler.compile, compiler.link_shared_object = real_compile, real_link
        if not link_calls:
            self._say("every extension is up to date")
            return
        by_path = {os.path.abspath(self.get_ext_fullpath(e.name)): e.name for e in self.extensions}
        built = [by_path.get(os.path.abspath(args[1])) for args, _ in link_calls]
        self._write_stamp({k: v for k, v in stamp.items() if k not in built})  # until they are built
        jobs = [(src, output_dir, kw) for sources, output_dir, kw in compile_calls for src in sources]
        jobs += self._cuda_jobs(link_calls, by_path)
        order = {f: i for i, f in enumerate(CUDA_SLOW_FIRST + SLOW_FIRST)}
        # nvcc jobs first (the slowest), then SLOW_FIRST, then the biggest
        jobs.sort(key=lambda j: (not j[0].endswith(".cu"), order.get(j[0], len(order)),
                                 -os.path.getsize(j[0])))
        n, width, t0 = build_jobs(), len(str(len(jobs))), time.perf_counter()
        self._say(f"compiling {len(jobs)} C/CUDA files, {n} at a time (MGTRACE_BUILD_JOBS)")
        failed_cuda = []

        def run(i, job):
            src, output_dir, kw = job
            self._say(f"[{i:>{width}}/{len(jobs)}] {src}")
            t = time.perf_counter()
            if src.endswith(".cu"):
                if not self._nvcc(src, kw["obj"], kw["include_dirs"]):
                    failed_cuda.append(src)
            else:
                real_compile([src], output_dir=output_dir, **kw)
            self._say(f"{' ' * (2 * width + 3)} {src} done in {time.perf_counter() - t:.0f} s")

        with concurrent.futures.ThreadPoolExecutor(n) as pool:     # each job is a gcc process
            for f in [pool.submit(run, i, job) for i, job in enumerate(jobs, 1)]:
                f.result()
        self._say(f"compiled in {time.perf_counter() - t0:.0f} s; linking {len(link_calls)} "
                  "extensions")
        for args, kw in link_calls:
            e = self._ext_of(args[1])
            name = e.name if e is not None else None
            if name == CUDA_EXT:
                if failed_cuda:
                    self._cuda_failed(f"nvcc failed on {', '.join(failed_cuda)}")
                    built[:] = [b for b in built if b != name]
                    continue
                try:
                    real_link(*args, **kw)
                except Exception as err:       # a link error under auto is a warning
                    self._cuda_failed(f"linking failed: {err}")
                    built[:] = [b for b in built if b != name]
                continue
            real_link(*args, **kw)
        stamp.update({name: configs[name] for name in built if name})
        self._write_stamp(stamp)

    def _cuda_jobs(self, link_calls, by_path):
        """nvcc jobs for the CUDA extension's .cu files; their objects join its link."""
        jobs = []
        for args, kw in link_calls:
            e = self._ext_of(args[1])
            if e is None or not CUDA_SOURCES.get(e.name):
                continue
            for src in CUDA_SOURCES[e.name]:
                obj = os.path.join(self.build_temp, src + ".o")
                os.makedirs(os.path.dirname(obj), exist_ok=True)
                # the contract alone: a CPU header in a .cu file does not compile
                jobs.append((src, None, {"obj": obj, "include_dirs": [CONTRACT]}))
                args[0].append(obj)           # the objects list of link_shared_object
        return jobs

    def _ext_of(self, output):
        """The extension a link call's output file belongs to (in place or in build/)."""
        return next((e for e in self.extensions
                     if os.path.abspath(output).endswith(self.get_ext_filename(e.name))), None)

    def _nvcc(self, src, obj, include_dirs):
        """Compiles one .cu file; False (with nvcc's output shown) when it fails."""
        import subprocess
        cmd = setup_cuda.nvcc_command(CUDA_TOOLKIT, setup_cuda.archs(os.environ), src, obj,
                                      include_dirs, debug=os.environ.get("MGTRACE_DEBUG") == "1")
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode != 0:
            self._say(f"nvcc failed on {src}:\n{' '.join(cmd)}\n{p.stdout}{p.stderr}")
            return False
        return True

    def _cuda_failed(self, why):
        if setup_cuda.mode(os.environ) == "1":
            sys.exit(f"mgtrace build: the CUDA extension failed (MGTRACE_CUDA=1): {why}")
        self._say(f"warning: CUDA extension not built: {why} (MGTRACE_CUDA=auto; the CPU "
                  "package is complete without it)")

    def _config(self, e):
        """A digest of what ``e``'s objects depend on besides its sources."""
        import Cython
        c = self.compiler
        if os.environ.get("MGTRACE_DEBUG") != "1":
            # Python's own CFLAGS carry -g: debug info costs build time and
            # nothing at run time (MGTRACE_DEBUG=1 builds with -g)
            c.compiler_so = [a for a in c.compiler_so if a != "-g"]
        # absolute folders (NumPy's headers, OpenBLAS) lie in pip's temporary build
        # environment, a new one each time: their packages' versions stand for them
        local = lambda dirs: [d for d in dirs or () if not os.path.isabs(d)]   # noqa: E731
        parts = [sys.version, np.__version__, Cython.__version__, openblas.__version__,
                 c.compiler_so, c.linker_so, e.extra_compile_args, e.extra_link_args,
                 e.define_macros, local(e.include_dirs), e.libraries, local(e.library_dirs),
                 e.runtime_library_dirs]
        if CUDA_SOURCES.get(e.name):
            parts += [CUDA_SOURCES[e.name], CUDA_TOOLKIT.nvcc, setup_cuda.archs(os.environ)]
        return hashlib.sha256(json.dumps(parts, default=str).encode()).hexdigest()

    def _read_stamp(self):
        try:
            with open(self.STAMP) as f:
                stamp = json.load(f)
            return stamp if isinstance(stamp, dict) else {}
        except (OSError, ValueError):
            return {}

    def _write_stamp(self, stamp):
        os.makedirs(os.path.dirname(self.STAMP), exist_ok=True)
        with open(self.STAMP, "w") as f:
            json.dump(stamp, f, indent=1, sort_keys=True)

    def _reuse_in_tree(self, configs, stamp):
        for e in self.extensions:
            here, dest = self.get_ext_filename(e.name), self.get_ext_fullpath(e.name)
            if stamp.get(e.name) != configs[e.name]:
                if os.path.exists(dest):    # built with other flags, or unknown ones: build again
                    os.unlink(dest)
                continue
            if not os.path.exists(here) or os.path.abspath(here) == os.path.abspath(dest):
                continue
            t = os.path.getmtime(here)
            if all(os.path.getmtime(f) <= t for f in e.sources + e.depends) and not (
                    os.path.exists(dest) and os.path.getmtime(dest) >= t):
                os.makedirs(os.path.dirname(dest), exist_ok=True)
                shutil.copy2(here, dest)        # its time kept: setuptools sees it up to date
                self._say(f"{e.name}: reusing {here} (up to date, same build flags)")

    @staticmethod
    def _say(text):
        print(f"mgtrace build: {text}", file=sys.stderr, flush=True)


def generated_c(pyx):
    """The C file Cython made from ``pyx``, when it is newer than ``pyx`` and
    every .pxd of the project and this Cython made it; else None.

    cythonize's own check also counts the .pxd files bundled with Cython
    (libc/stdint.pxd...), which pip's temporary build environment installs
    anew for every install: an editable reinstall would then regenerate, and
    recompile, every extension."""
    import Cython
    c = pyx[:-len(".pyx")] + ".c"
    try:
        t = os.path.getmtime(c)
        with open(c) as f:
            head = f.readline()
    except OSError:
        return None
    if f"Cython {Cython.__version__} " not in head:
        return None
    if any(os.path.getmtime(f) > t for f in [pyx] + glob.glob("mgtrace/_core/*.pxd")):
        return None
    return c


def cythonized(exts):
    """``exts`` with .pyx sources replaced by their C: up-to-date C as it is
    (see :func:`generated_c`), the rest through cythonize."""
    fresh, stale = [], []
    for e in exts:
        made = [generated_c(s) if s.endswith(".pyx") else s for s in e.sources]
        if all(made):
            e.sources = made
            fresh.append(e)
        else:
            stale.append(e)
    if stale:
        stale = cythonize(stale, compiler_directives={"language_level": 3, "embedsignature": True},
                          nthreads=build_jobs())
    done = {e.name: e for e in fresh + stale}
    return [done[e.name] for e in exts]


setup(
    cmdclass={"build_ext": ParallelBuildExt},
    ext_modules=cythonized(extensions),
)
