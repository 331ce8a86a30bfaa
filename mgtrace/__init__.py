"""mgtrace: trace neural-network modules into graphs, edit them, keep them on disk.

The public API lives here and only here.
"""
__version__ = "0.3.0.dev0"

from mgtrace._core import (Device, OpDef, Tensor, apply, as_device, as_dtype,
                           cuda_available, dtype_promotion, from_dlpack, get_default_device,
                           get_device, get_num_threads, has_kernel, set_default_device,
                           set_num_threads, tensor)
from mgtrace import functional, module, random  # noqa: E402,F401  (mgtrace.functional as F, mgtrace.module as M)
from mgtrace.traced_module import TraceError, TracedModule, TraceWarning, trace_module  # noqa: E402
from mgtrace.errors import ArchiveError, Error  # noqa: E402
from mgtrace.serialization import FORMAT_VERSION, load, save  # noqa: E402
from mgtrace import serialization  # noqa: E402,F401  (mt.serialization.load_archive, register_function)
from mgtrace import cuda  # noqa: E402,F401  (mt.cuda.is_available, memory_stats...; loads no CUDA itself)
from mgtrace import autodiff, optimizer  # noqa: E402,F401  (GradManager; SGD, Adam...)
from mgtrace import plan  # noqa: E402,F401  (mt.plan.Plan, PlanError)
from mgtrace.plan import compile  # noqa: E402  (inference plans: mt.compile(tm, *example_inputs))

__all__ = ["__version__", "Device", "DTYPES", "OpDef", "Tensor", "apply", "as_device", "as_dtype",
           "cuda_available", "dtype_promotion", "from_dlpack", "get_default_device",
           "get_device", "get_num_threads", "has_kernel", "set_default_device", "set_num_threads",
           "tensor",
           "functional", "module", "random", "serialization", "cuda", "autodiff", "optimizer",
           "plan", "compile",
           "TraceError", "TracedModule", "TraceWarning", "trace_module",
           "Error", "ArchiveError", "FORMAT_VERSION", "load", "save"]


def __getattr__(name):
    # mt.DTYPES is made on first use, so that `import mgtrace` does not import
    # ml_dtypes (bfloat16's NumPy dtype; see mgtrace._core.dtype)
    if name == "DTYPES":
        from mgtrace._core import dtype
        return dtype.DTYPES
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
