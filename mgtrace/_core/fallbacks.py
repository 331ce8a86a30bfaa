"""Composite fallbacks: an op written in other core ops, run when a device
has no kernel of its own for it (op_table.py's ``fallback`` column names
the function here). Each gives the fused kernel's values up to rounding.

Pure Python over the core's public ops, so it runs on any device whose
backend has those ops (matmul, softmax, the elementwise ones).
"""

__all__ = ["attention"]


def attention(q, k, v, mask, scale):
    """``softmax(q @ k^T * scale + mask) @ v`` over the last axis, q [B, H,
    Sq, D], k [B, H, Sk, D], v [B, H, Sk, Dv], mask None or broadcast to [B,
    H, Sq, Sk] (already checked by the caller); [B, H, Sq, Dv] in q's dtype.
    Raises NoKernelError where the device lacks matmul or softmax too."""
    from mgtrace._core import linalg, reduce
    s = linalg.matmul(q, k.transpose((0, 1, 3, 2))) * float(scale)
    if mask is not None:
        s = s + mask
    return linalg.matmul(reduce.softmax(s, -1), v)
