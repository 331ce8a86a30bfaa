"""The int8 arithmetic of :mod:`mgtrace.quantization.int8` for layers that have
no int8 kernel (transposed convolution, batched matmul): the integer
accumulator is computed exactly by another path, then requantized by the
same rule as the kernels' epilogue::

    acc = sum (x_q - x_zp) * w_q + bias_q          bias_q = rint(bias / (x_s * w_s))
    y_q = clip(rint(acc * (x_s * w_s / y_s)) + y_zp, qmin, qmax)

in float64 (scales rounded to float32 first, rint half to even), ReLU as
``qmin = max(qmin, y_zp)``; float32 output: ``acc * x_s * w_s`` rounded once
to float32. The result is bitwise what an integer implementation gives.
"""
import numpy as np

from mgtrace.quantization.int8 import _Float32, _out_range

__all__ = ["bias_int32", "requantize"]


def bias_int32(bias, x_scale, w_scale):
    """``rint(bias / (x_scale * w_scale))`` saturated to int32, in float64
    (``w_scale`` broadcast against ``bias``)."""
    scale = np.float64(np.float32(x_scale)) * np.asarray(w_scale, np.float32).astype(np.float64)
    b = np.rint(np.asarray(bias, np.float32).astype(np.float64) / scale)
    return np.clip(b, -(2 ** 31), 2 ** 31 - 1).astype(np.int32)


def requantize(acc, x_scale, w_scale, out_scale, out_zp, out_dtype, relu, alloc=np.empty):
    """``acc`` (integers held exactly in float64 or int64; ``w_scale``
    broadcast against it) requantized to ``out_dtype``, written into
    ``alloc(acc.shape, storage dtype)`` (as the int8 kernels' ``alloc``),
    which is returned."""
    meta, lo, hi = _out_range(out_dtype, out_zp, relu)
    out = alloc(np.shape(acc), meta.np_dtype_str)
    ws = np.asarray(w_scale, np.float32).astype(np.float64)
    acc = np.asarray(acc, np.float64)
    if meta is _Float32:
        y = acc * (np.float64(np.float32(x_scale)) * ws)
        if relu:
            y = np.maximum(y, 0.0)
        out[...] = y.astype(np.float32)
        return out
    mult = (np.float64(np.float32(x_scale)) * ws) / np.float64(np.float32(out_scale))
    y = np.clip(np.rint(acc * mult) + int(out_zp), lo, hi)
    out[...] = y.astype(out.dtype)
    return out
