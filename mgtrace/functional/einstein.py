"""``einsum``: Einstein summation (MegEngine's ``functional.einsum``, NumPy's
``np.einsum``), contracted through the core's GEMM.

An equation names each operand's axes by letters (``"bij,bjk->bik"``);
letters missing from the output are summed over. The operands are
contracted pairwise, left to right: each pair becomes one batched
``matmul`` (transposes and reshapes put the shared, kept letters first,
the summed ones in the middle), so the work is the GEMM's. A letter that
appears in only one operand and not in the output is summed before its
operand takes part; a letter repeated within one operand takes its
diagonal (``"ii->i"``). ``...`` stands for the same leading axes in every
operand (broadcast by NumPy's rule). Composed of core ops (matmul, sum,
transpose, reshape); no dedicated kernel.
"""
import math
import string

import numpy as np

from mgtrace._core import dispatch as _dispatch
from mgtrace._core import linalg as _linalg
from mgtrace._core import reduce as _reduce
from mgtrace._core import args as A

__all__ = ["einsum"]

_LETTERS = set(string.ascii_letters)
_ELLIPSIS_LABELS = [chr(c) for c in range(0x3b1, 0x3b1 + 24)]   # Greek: never user letters


def _parse(fn, equation, ndims):
    """``(input label lists, output label list)`` with ``...`` replaced by
    Greek labels, one per broadcast axis (the most any operand has)."""
    if not isinstance(equation, str):
        raise TypeError(f"{fn}: equation must be a str, got {type(equation).__name__}")
    eq = equation.replace(" ", "")
    if eq.count("->") > 1:
        raise ValueError(f"{fn}: equation {equation!r} has more than one '->'")
    lhs, arrow, rhs = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(ndims):
        raise ValueError(f"{fn}: equation {equation!r} names {len(terms)} operands, "
                         f"{len(ndims)} given")
    for term in terms + ([rhs] if arrow else []):
        bad = set(term.replace("...", "")) - _LETTERS
        if bad or term.count("...") > 1:
            raise ValueError(f"{fn}: equation {equation!r}: each term is letters and at most "
                             f"one '...', got {term!r}")
    n_ell = 0
    for term, nd in zip(terms, ndims):
        letters = len(term.replace("...", ""))
        if "..." in term:
            if letters > nd:
                raise ValueError(f"{fn}: term {term!r} names {letters} axes of an operand with "
                                 f"{nd}")
            n_ell = max(n_ell, nd - letters)
        elif letters != nd:
            raise ValueError(f"{fn}: term {term!r} names {letters} axes of an operand with {nd}")
    ins = []
    for term, nd in zip(terms, ndims):
        before, _, after = term.partition("...")
        k = nd - len(before) - len(after) if "..." in term else 0
        ins.append(list(before) + _ELLIPSIS_LABELS[n_ell - k:n_ell] + list(after))
    if arrow:
        if "..." not in rhs and n_ell and any("..." in term for term in terms):
            raise ValueError(f"{fn}: equation {equation!r}: the output must keep '...'")
        before, _, after = rhs.partition("...")
        out = list(before) + (_ELLIPSIS_LABELS[:n_ell] if "..." in rhs else []) + list(after)
        seen = set()
        for c in out:
            if c in seen:
                raise ValueError(f"{fn}: output label {c!r} repeats in {equation!r}")
            seen.add(c)
        known = set().union(*map(set, ins))
        missing = [c for c in out if c not in known]
        if missing:
            raise ValueError(f"{fn}: output label {missing[0]!r} of {equation!r} is in no operand")
    else:   # NumPy's implicit output: broadcast axes, then letters used once, sorted
        counts = {}
        for labels in ins:
            for c in labels:
                counts[c] = counts.get(c, 0) + 1
        out = _ELLIPSIS_LABELS[:n_ell] + sorted(c for c, k in counts.items()
                                                if k == 1 and c in _LETTERS)
    return ins, out


def _diagonal(x, labels):
    """x with each repeated label reduced to its diagonal (the label kept once)."""
    while True:
        dup = next((c for i, c in enumerate(labels) if c in labels[:i]), None)
        if dup is None:
            return x, labels
        i, j = labels.index(dup), len(labels) - 1 - labels[::-1].index(dup)
        n = x.shape[i]
        if x.shape[j] != n:
            raise ValueError(f"einsum: label {dup!r} stands for axes of sizes {n} and "
                             f"{x.shape[j]}")
        rest = [k for k in range(x.ndim) if k not in (i, j)]
        y = x.transpose(*(rest + [i, j])).reshape(tuple(x.shape[k] for k in rest) + (n * n,))
        x = y[..., ::n + 1] if n else y[..., :0]
        labels = [labels[k] for k in rest] + [dup]


def _sum_out(x, labels, keep):
    """Sum over the labels of x not in ``keep``."""
    axes = tuple(i for i, c in enumerate(labels) if c not in keep)
    if not axes:
        return x, labels
    return _reduce.sum(x, axes, False), [c for c in labels if c in keep]


def _contract(a, la, b, lb, keep, sizes):
    """a (labels la) times b (labels lb), summing the shared labels not in
    ``keep``: one batched matmul. Returns (result, its labels)."""
    shared = [c for c in la if c in lb]
    batch = [c for c in shared if c in keep]
    summed = [c for c in shared if c not in keep]
    a_only = [c for c in la if c not in lb]
    b_only = [c for c in lb if c not in la]
    size = sizes.get

    def prep(x, labels, order):
        x = x.transpose(*[labels.index(c) for c in order]) if order != labels else x
        want = tuple(size(c) for c in order)
        if x.shape != want:          # a size-1 batch axis broadcast against the other operand
            x = x.broadcast_to(want)
        return x

    a = prep(a, la, batch + a_only + summed)
    b = prep(b, lb, batch + summed + b_only)
    nb = tuple(size(c) for c in batch)
    m = math.prod(size(c) for c in a_only)
    k = math.prod(size(c) for c in summed)
    n = math.prod(size(c) for c in b_only)
    y = _linalg.matmul(a.reshape(nb + (m, k)), b.reshape(nb + (k, n)))
    return y.reshape(nb + tuple(size(c) for c in a_only + b_only)), batch + a_only + b_only


def einsum(equation, *args):
    """Einstein summation over ``args`` as ``equation`` says (MegEngine's
    ``einsum``, NumPy's ``np.einsum`` without ``optimize``).

    Args:
        equation: e.g. ``"ij,jk->ik"`` (matmul), ``"bhqd,bhkd->bhqk"``,
            ``"ii->i"`` (diagonal), ``"ij->"`` (sum), ``"...ij,...jk"``;
            without ``->`` the output is NumPy's implicit one (the
            ``...`` axes, then the letters used once, sorted).
        *args: Tensors (or arrays), one per term.

    Returns:
        Tensor with the output's axes; dtype by MegEngine promotion of the
        operands (bool operands are summed as int32, as ``sum`` does).

    Raises:
        ValueError: a malformed equation, a term that does not match its
            operand's ndim, a label standing for different sizes (sizes 1
            broadcast, as NumPy).
        TypeError: equation not a str; operands that are not tensors.

    Composed of core ops: the pairwise contractions are batched matmuls
    (the GEMM path); no dedicated kernel.

    >>> import numpy as np, mgtrace as mt, mgtrace.functional as F
    >>> a = mt.tensor(np.arange(6.0).reshape(2, 3))
    >>> F.einsum("ij,kj->ik", a, a).tolist()
    [[5.0, 14.0], [14.0, 50.0]]
    >>> F.einsum("ii", mt.tensor([[1, 2], [3, 4]])).item()
    5
    """
    fn = "einsum"
    if not args:
        raise ValueError(f"{fn}: give at least one operand")
    ts = A.tensors(fn, **{f"operand{i}": v for i, v in enumerate(args)})
    ins, out = _parse(fn, equation, [t.ndim for t in ts])
    sizes = {}
    for t, labels in zip(ts, ins):
        for c, s in zip(labels, t.shape):
            old = sizes.get(c)
            if old is None or old == 1:
                sizes[c] = s
            elif s != old and s != 1:
                raise ValueError(f"{fn}: label {c!r} stands for sizes {old} and {s} in "
                                 f"{equation!r}")
    ops = []
    for t, labels in zip(ts, ins):
        t, labels = _diagonal(t, labels)
        if t.dtype.kind == "b":
            t = _dispatch.astype(t, "int32")
        ops.append((t, labels))
    # sum each operand's private labels first (they are needed nowhere else)
    for i, (t, labels) in enumerate(ops):
        elsewhere = set(out).union(*[set(lb) for j, (_, lb) in enumerate(ops) if j != i])
        ops[i] = _sum_out(t, labels, elsewhere)
    x, lx = ops[0]
    for j in range(1, len(ops)):
        y, ly = ops[j]
        keep = set(out).union(*[set(lb) for _, lb in ops[j + 1:]])
        x, lx = _contract(x, lx, y, ly, keep, sizes)
    x, lx = _sum_out(x, lx, set(out))
    if lx != out:
        x = x.transpose(*[lx.index(c) for c in out])
    want = tuple(sizes[c] for c in out)
    if x.shape != want:
        x = x.broadcast_to(want)
    return x.copy() if not x.is_contiguous else x
