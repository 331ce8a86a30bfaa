"""mgtrace.functional (imported as F): MegEngine-style functions over the core.

    import mgtrace.functional as F
    y = F.relu(F.conv2d(x, w, b, padding=1))

Five modules, one concept each:

- :mod:`~mgtrace.functional.math`: elementwise math, comparison and logic,
  reductions, norm, sorting, matmul/dot.
- :mod:`~mgtrace.functional.nn`: linear/conv layers, pooling,
  normalization, activations, softmax, dropout, embedding, pad, interpolate.
- :mod:`~mgtrace.functional.tensor`: reshaping, joining, indexing, repeat/tile,
  and creation (zeros, ones, full, arange, linspace, eye, ..._like).
- :mod:`~mgtrace.functional.einstein`: ``einsum``, contracted through the GEMM.
- :mod:`~mgtrace.functional.loss`: MegEngine's losses (cross_entropy,
  binary_cross_entropy, nll_loss, l1_loss, square_loss/mse_loss, smooth_l1_loss).
- :mod:`~mgtrace.functional.fused`: a layer and its activation in one kernel
  call (conv2d_act, linear_act), attention, and convolutions in the
  NCHW16c layout (conv2d_nchwc, conv2d_nchwc_pw_dw, conv2d_nchwc_pw_dw_pw,
  max_pool2d_nchwc, to_nchwc, from_nchwc);
  what ``optimize()`` emits.

All are thin wrappers over :mod:`mgtrace._core` (no kernels of their own):
they check arguments (errors name the function and the argument), then call
core ops, so a module tracer sees core ops. dtypes follow MegEngine's
promotion and shapes NumPy's broadcasting (DESIGN.md, "Tensor core").
Every public name is listed in ``__all__``.
"""
import importlib as _importlib

from mgtrace.functional import einstein, fused, loss, math, nn, tensor  # noqa: F401  (submodules)
from mgtrace.functional import _trace

for _m in (math, nn, tensor, fused, einstein, loss):   # the tracer records calls of these (_trace)
    _trace.wrap_public(_m)
from mgtrace.functional.math import *  # noqa: F401,F403
from mgtrace.functional.math import __all__ as _math_all
from mgtrace.functional.nn import *  # noqa: F401,F403
from mgtrace.functional.nn import __all__ as _nn_all
from mgtrace.functional.tensor import *  # noqa: F401,F403
from mgtrace.functional.tensor import __all__ as _tensor_all
from mgtrace.functional.einstein import einsum  # noqa: F401
from mgtrace.functional.loss import *  # noqa: F401,F403
from mgtrace.functional.loss import __all__ as _loss_all
from mgtrace.functional.fused import (attention, conv2d_act, conv2d_nchwc, conv2d_nchwc_pw_dw,  # noqa: F401
                                      conv2d_nchwc_pw_dw_pw, from_nchwc, linear_act, linear_add_layer_norm,
                                      max_pool2d_nchwc, to_nchwc)

__all__ = sorted(set(_math_all) | set(_nn_all) | set(_tensor_all) | set(_loss_all) | {"einsum"}
                 | {"attention", "conv2d_act", "linear_act", "linear_add_layer_norm", "conv2d_nchwc", "conv2d_nchwc_pw_dw",
                    "conv2d_nchwc_pw_dw_pw", "max_pool2d_nchwc", "to_nchwc", "from_nchwc"})


def _method_hint(name):
    """What a missing Tensor attribute's AttributeError adds: the function
    to call instead (MegEngine's Tensor, like this one, has the array
    methods only -- reshape, transpose, flatten, astype, sum, mean, max...;
    exp, abs, sqrt, clip and the rest are functions)."""
    if name in __all__:
        return (f"; Tensor has the array methods only (as MegEngine's): call "
                f"F.{name}(t), i.e. mgtrace.functional.{name}")
    return ""


# (the module, not mgtrace._core.tensor the function)
_importlib.import_module("mgtrace._core.tensor")._install_ops(attribute_hint=_method_hint)
