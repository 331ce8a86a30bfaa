"""The compiled core: Tensor, dtypes and promotion, devices, dispatch, kernels.

Knows nothing of modules or graphs. Import order matters: OpenMP's wait
policy is set before the first extension loads libgomp (see mgtrace._flags),
and OpenBLAS is loaded globally (scipy_openblas32) before the extension that
links it.
"""
from mgtrace import _flags

_flags.set_openmp_defaults()
import scipy_openblas32  # noqa: E402,F401  (loads libscipy_openblas with RTLD_GLOBAL)

from mgtrace._core.dtype import NAMES as DTYPE_NAMES, as_dtype, dtype_promotion
from mgtrace._core.device import (Device, as_device, cuda_available, get_default_device,
                                  set_default_device)
from mgtrace._core.tensor import Tensor, empty_tensor, from_dlpack, share_as, tensor
from mgtrace._core import op_table  # noqa: F401  (every op declared once; pure Python)
from mgtrace._core import dispatch, index, linalg, nn, reduce  # noqa: F401  (modules install Tensor methods and register ops)
from mgtrace._core import trace_hooks  # noqa: F401
from mgtrace._core.dispatch import (OpDef, apply, get_device, get_num_threads, has_kernel,
                                    register_op, set_num_threads)


# apply() calls an op's implementation as impl(*inputs, **params), inputs in
# the op table's order; gather's and scatter's kernels take axis second (the
# functional order), so apply(OpDef("gather", {"axis": 1}), x, index) (what a
# trace records, and what an archive's Apply expr runs) raised "multiple
# values for axis". apply gets them in the table's order instead.
def _gather(x, index, axis):
    return _index_gather(x, axis, index)


def _scatter(x, index, src, axis):
    return _index_scatter(x, axis, index, src)


_index_gather, _index_scatter = index.gather, index.scatter
register_op("gather", _gather)
register_op("scatter", _scatter)
del _gather, _scatter

if _flags.NUM_THREADS:
    set_num_threads(_flags.NUM_THREADS)
dispatch.set_adaptive_threads(_flags.ADAPTIVE_THREADS)
from mgtrace._core.tensor import set_host_cache_limit

set_host_cache_limit(_flags.HOST_CACHE_MB << 20)


def __getattr__(name):
    # DTYPES is made on first use: it holds bfloat16, whose NumPy dtype comes
    # from ml_dtypes, an import that costs half of `import mgtrace` (PEP 562)
    if name == "DTYPES":
        from mgtrace._core import dtype
        return dtype.DTYPES
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
