"""Parameter: a Tensor that a Module learns.

A Parameter is an ordinary :class:`mgtrace.Tensor` (same storage, dtype,
device and operators) whose type tells a :class:`~mgtrace.module.Module` to
register it as learnable state when it is assigned to an attribute.
Arithmetic and views of a Parameter give plain Tensors, as in PyTorch.
"""
import numpy as np

from mgtrace._core import Tensor


class Parameter(Tensor):
    """A learnable tensor, registered by ``Module.__setattr__``.

    Args:
        data: anything :func:`mgtrace.tensor` accepts (a Tensor, NumPy array,
            Python scalar or nested lists). Always copied.
        dtype: result dtype; default as for :func:`mgtrace.tensor` (float32
            for Python floats, the array's dtype for NumPy input).
        device: result device; default the default device.

    >>> import mgtrace.module as M
    >>> p = M.Parameter([1.0, 2.0])
    >>> p
    Parameter([1., 2.], dtype=float32, device=cpu:0)
    >>> type(p * 2).__name__
    'Tensor'
    """

    def __init__(self, data=None, dtype=None, device=None):
        super().__init__(data, dtype, device)

    def __repr__(self):
        arr = self.numpy()
        if arr.dtype.name == "bfloat16":
            arr = arr.astype(np.float32)
        body = np.array2string(arr, separator=", ", prefix="Parameter(", threshold=1000)
        return f"Parameter({body}, dtype={self.dtype.name}, device={self.device})"

    def __deepcopy__(self, memo):
        # Tensor refuses pickling, so copy.deepcopy needs this to copy a
        # Module; the copy stays on self's device (a CUDA module's too)
        new = Parameter(self, device=self.device)
        memo[id(self)] = new
        return new
