"""Int8 inverted residual blocks as one plan step.

Int8 steps in a row, a 1x1 conv writing uint8 (the expand; optional), a
depthwise conv reading just that and writing uint8, a 1x1 conv reading just
that (the projection, any output storage), and an int8 add of the
projection's output where one follows (a residual block's shortcut),
become one MT_Q_BLOCK step (qblock.c): MobileNetV2's blocks, and
MobileNetV1's depthwise-pointwise pairs. The step runs each op's own kernel
on ranges of channels or bands of rows, so its bits are the steps'; what
changes is which thread computes what (the expand and depthwise conv of one
channel, or of one band, on one core) and that the team meets once per
image instead of once per op.

The two tensors between the convs stay in the plan's arena (the step's
mid1 and mid2); a tensor another step reads, or a plan output, keeps its
steps apart.
"""

from mgtrace.plan._lower import readers as step_readers

__all__ = ["fuse_int8_blocks"]

FUSE = True         # tests set it False to compare with the unfused steps


def _conv_1x1(step):
    """A quant step's conv ints when it is a dense 1x1 stride-1 unpadded conv."""
    if step[0] != "quant" or step[1][0] != "conv":
        return None
    i = step[1][2]
    NB, C, H, W, a_zp, lw, Co, G, KH, KW, SH, SW, PH, PW, DH, DW, OH, OW = i[:18]
    if G != 1 or (KH, KW, SH, SW, PH, PW, DH, DW) != (1, 1, 1, 1, 0, 0, 1, 1):
        return None
    return i


def _dwconv(step):
    if step[0] != "quant" or step[1][0] != "dwconv":
        return None
    return step[1][2]


def _match(steps, pos, readers, kept):
    """``(block step, steps it replaces)`` for the steps from ``pos`` (an
    expand, a depthwise and a project conv, or a depthwise and a project
    conv, then the add where it folds in), else None."""
    hit = _match3(steps, pos, readers, kept)
    return hit if hit is not None else _match2(steps, pos, readers, kept)


def _match3(steps, pos, readers, kept):
    if pos + 3 > len(steps):
        return None
    e, d = steps[pos:pos + 2]
    ei, di = _conv_1x1(e), _dwconv(d)
    if ei is None or di is None:
        return None
    NB, C, H, W, a_zp, elw, E = ei[:7]
    e_zp, e_lo, e_hi, e_u8, e_path = ei[18:23]
    mid1 = e[2][5]
    if e_u8 != 1 or tuple(di[:5]) != (NB, E, H, W, e_zp) or d[2][0] != mid1 or mid1[1] != 0 or \
            mid1[0] in kept or readers.get(mid1[0]) != {pos, pos + 1}:
        return None
    head = (NB, C, H, W, a_zp, elw, E, e_zp, e_lo, e_hi, e_u8, e_path)
    return _tail(steps, pos + 1, readers, kept, head, list(e[2][:6]), e[1][1], e[3])


def _match2(steps, pos, readers, kept):
    if pos + 2 > len(steps):
        return None
    d = steps[pos]
    di = _dwconv(d)
    if di is None:
        return None
    NB, C, H, W, a_zp = di[:5]
    head = (NB, C, H, W, a_zp, 0, C, a_zp, 0, 0, 1, 0)        # no expand
    return _tail(steps, pos, readers, kept, head, [d[2][0]] + [None] * 5, 0, d[3])


def _tail(steps, pos, readers, kept, head, refs, nt, where):
    """The block step whose depthwise conv is step ``pos``, its input
    (and the expand before it) given: ``head`` the step's first ints,
    ``refs`` its first pointers, ``nt`` and ``where`` the first step's."""
    first = pos - (refs[1] is not None)
    d, p = steps[pos:pos + 2]
    di, pi = _dwconv(d), _conv_1x1(p)
    if pi is None:
        return None
    NB, E = head[0], head[6]
    KH, KW, SH, SW, PH, PW, DH, DW, OH, OW, d_zp, d_lo, d_hi, d_u8, d_path = di[5:]
    plw, Co = pi[5:7]
    p_zp, p_lo, p_hi, p_u8, p_path = pi[18:23]
    mid2 = d[2][4]
    if d_u8 != 1 or tuple(pi[:5]) != (NB, E, OH, OW, d_zp) or p[2][0] != mid2 or \
            mid2[1] != 0 or mid2[0] in kept or mid2[0] == refs[0][0] or \
            readers.get(mid2[0]) != {pos, pos + 1}:
        return None
    ints = head + (KH, KW, SH, SW, PH, PW, DH, DW, OH, OW, d_zp, d_lo, d_hi, d_path,
                   plw, Co, p_zp, p_lo, p_hi, p_u8, p_path)
    refs = refs + list(d[2][1:5]) + list(p[2][1:6])
    nt = max(nt, d[1][1], p[1][1])
    add = _add(steps, pos + 2, readers, kept, refs, NB * Co * OH * OW, p_u8)
    if add is None:
        return ("quant", ("block", nt, ints, ()), refs, f"{where} .. {p[3]}"), pos + 2 - first
    a = steps[pos + 2]
    add_ints, floats, add_refs = add
    return ("quant", ("block", max(nt, a[1][1]), ints + add_ints, floats), refs + add_refs,
            f"{where} .. {a[3]}"), pos + 3 - first


def _add(steps, pos, readers, kept, refs, n, y_kind):
    """``(ints, floats, refs)`` that fold the int8 add at ``pos`` into the
    block whose refs are ``refs``, when it adds the block's output (read
    by nothing else) and another int8 or uint8 tensor into a buffer of its
    own; else None."""
    if pos >= len(steps) or steps[pos][0] != "quant" or steps[pos][1][0] != "add":
        return None
    _, (_, _, ints, floats), (a, b, out), _ = steps[pos]
    ak, bk, an, relu, ok, path = ints
    y = refs[14]
    if an != n or y_kind not in (0, 1) or (a == y) == (b == y) or ok not in (0, 1):
        return None
    y_first = a == y
    other, other_kind = (b, bk) if y_first else (a, ak)
    if other is None or other_kind not in (0, 1) or (ak if y_first else bk) != y_kind:
        return None
    if y[0] in kept or readers.get(y[0]) != {pos - 1, pos} or out is None or \
            out[0] in {r[0] for r in refs if r is not None} | {other[0]}:
        return None
    a_s, a_z, b_s, b_z, o_s, o_z, lo, hi = floats
    scales = (a_s, a_z, b_s, b_z) if y_first else (b_s, b_z, a_s, a_z)
    return (int(y_first), y_kind, other_kind, ok, relu, path), scales + (o_s, o_z, lo, hi), \
        [other, out]


def fuse_int8_blocks(steps, kept=()):
    """``steps`` (the lowering's list) with each expand / depthwise /
    project run of int8 steps made one block step; ``kept``: buffers that
    must stay written (the plan's outputs)."""
    if not FUSE:
        return steps
    readers = step_readers(steps)
    out, pos = [], 0
    while pos < len(steps):
        hit = _match(steps, pos, readers, kept)
        if hit is None:
            out.append(steps[pos])
            pos += 1
        else:
            out.append(hit[0])
            pos += hit[1]
    return out
