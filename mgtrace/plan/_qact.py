"""A ReLU6 after an int8 layer's float32 output, in that layer's epilogue.

An int8 conv, depthwise conv or GEMM step writing float32 (a layer whose
output stays float: MobileNetV2's last 1x1 conv, then its ReLU6), followed
by an elementwise float32 ReLU6 over exactly that output, which nothing
else reads, becomes the int8 step alone with ``hi`` 6 writing the ReLU6's
output: where ``hi`` > 0 the kernels apply to the float32 they computed
(after their own ReLU where ``lo`` is 0) the elementwise kernel's ReLU6,
``x < 0 ? 0 : x > hi ? hi : x`` (a -0 kept), so the bits are the two
steps'. The ReLU6's own pass read the layer's output from both cores'
caches, 19 us of the int8 MobileNetV2 plan at two threads.
"""
from mgtrace._core import plan as _cplan
from mgtrace.plan._lower import readers as step_readers

__all__ = ["fold_float_relu6"]

# per int8 call: (index of lo in its ints, of out_u8, index of its output in
# its refs, the output's element count from its ints); lo, hi, out_u8 in a row
_LAYOUT = {
    "conv": (19, 21, 5, lambda i: i[0] * i[6] * i[16] * i[17]),       # NB Co OH OW
    "dwconv": (16, 18, 4, lambda i: i[0] * i[1] * i[13] * i[14]),     # NB C OH OW
    "gemm": (6, 8, 5, lambda i: i[0] * i[1] if (i[9], i[10]) == (i[1], 1) else None),
}


def _float_out(step):
    """``(lo index, output ref, elements)`` of an int8 step that writes a
    whole float32 buffer with no upper clamp, else None."""
    if step[0] != "quant" or step[1][0] not in _LAYOUT:
        return None
    lo_at, u8_at, out_at, count = _LAYOUT[step[1][0]]
    ints = step[1][2]
    if ints[u8_at] != 2 or ints[lo_at + 1] > 0 or ints[lo_at] not in (-1, 0):
        return None
    return lo_at, step[2][out_at], count(ints)


def _relu6_of(step, ref, n):
    """The output ref of ``step`` where it is a float32 ReLU6 reading the n
    elements at ``ref`` contiguously (and writing n contiguous), else None."""
    if step[0] != "kernel" or step[2][1] != ref:
        return None
    info = step[1].ew_info()
    if info is None:
        return None
    kind, op, dtype, nargs, shape, strides = info
    if (kind, op, dtype, nargs) != (_cplan.EW_UNARY, _cplan.U_RELU6, _cplan.FLOAT32, 2):
        return None
    count, want = 1, []
    for d in reversed(shape):       # C-contiguous byte strides, innermost first
        want.append(4 * count if d > 1 else None)
        count *= d
    want.reverse()
    for st in strides:
        if any(w is not None and s != w for s, w in zip(st, want)):
            return None
    return step[2][0] if count == n else None


def fold_float_relu6(steps, buffers, kept=()):
    """``steps`` (the lowering's list) with each float32 ReLU6 that follows
    an int8 step's float32 output folded into that step (see the module
    docstring); ``buffers``: the lowering's (their sizes), ``kept``: buffers
    that must stay written (the plan's outputs)."""
    readers = step_readers(steps)
    out, pos = [], 0
    while pos < len(steps):
        step, hit = steps[pos], None
        got = _float_out(step) if pos + 1 < len(steps) else None
        if got is not None and got[1] is not None:
            lo_at, ref, n = got
            y = _relu6_of(steps[pos + 1], ref, n) if n is not None else None
            if y is not None and ref[0] not in kept and readers.get(ref[0]) == {pos, pos + 1} \
                    and ref[1] == 0 and buffers[ref[0]].nbytes == 4 * n:
                kind, nt, ints, floats = step[1]
                ints = tuple(ints[:lo_at + 1]) + (6,) + tuple(ints[lo_at + 2:])
                refs = list(step[2])
                refs[_LAYOUT[kind][2]] = y
                hit = ("quant", (kind, nt, ints, floats), refs, f"{step[3]} .. {steps[pos + 1][3]}")
        if hit is None:
            out.append(step)
            pos += 1
        else:
            out.append(hit)
            pos += 2
    return out
