"""mgtrace.autodiff: reverse-mode gradients, MegEngine's way.

- :class:`GradManager`: attach parameters, record a forward (``with gm:``),
  ``gm.backward(loss)`` accumulates into each ``param.grad``;
- :class:`Function`: an op with a hand-written backward;
- :class:`no_grad`: a block whose ops are never recorded;
- :mod:`~mgtrace.autodiff.rules`: every op's gradient, in one table.
"""
from mgtrace.autodiff._tape import no_grad
from mgtrace.autodiff.function import Function
from mgtrace.autodiff.grad_manager import GradManager

__all__ = ["GradManager", "Function", "no_grad"]
