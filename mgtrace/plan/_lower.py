"""Lowering a recording (:mod:`._record`) to a plan's steps and buffers, and
the memory plan that places the intermediates in one arena.

Every tensor of the recording lives in a *buffer*: a graph input, a
constant (a storage that existed before the run: parameters, buffers,
tensors the forward made from constant data), or a storage some call
produced. A view is a slot in its base's buffer, so reshapes and
transposes cost nothing at run time.

A core op whose kernel calls were all recorded, each pointer inside a
buffer the op was handed or produced, becomes those kernel calls (kernel
steps, replayed from C). Anything else is a Python step that calls the same
function on views of the plan's buffers: correct, at Python's cost per op.
A functional or module call is opened into its inside when every tensor the
inside touched is one the plan knows; otherwise it is one Python step.

Buffers written by kernel steps go to the arena: each is live from the step
that first writes it to the last step that reads it (or a view of it), and
the arena places them greedily, largest first, at the lowest 64-byte
aligned offset that no buffer live at the same time overlaps (the
"greedy by size" planner of TFLite and ONNX Runtime). Buffers a graph
output lies in are made fresh on each call instead, so the caller owns
what it gets back.
"""
import inspect

import numpy as np

from mgtrace._core import plan as _cplan
from mgtrace._core.tensor import Tensor
from mgtrace._core import op_table
from mgtrace._core.dispatch import OpDef, apply
from mgtrace.plan._record import PlanError, SharedMemoryError, TensorMeta, quant_tag, write_target
from mgtrace.traced_module.pytree import tree_flatten

ARENA, INPUT, CONST, OUTPUT, DYNAMIC = range(5)
ALIGN = 64

# core-op groups whose implementations call no kernel but the backend's
# elementwise and GEMM members (the ones the capture records)
KERNEL_GROUPS = frozenset({"unary", "binary", "activation", "compare", "predicate", "bitwise",
                           "ternary", "cast", "view", "linalg"})
# nn ops whose implementations call only the nn members the capture replays
# (and elementwise copies, packing into conv2d's weight cache)
KERNEL_OPS = frozenset({"conv2d_nchwc", "conv2d_nchwc_pw_dw", "conv2d_nchwc_pw_dw_pw",
                        "max_pool2d_nchwc", "to_nchwc", "from_nchwc", "attention",
                        # NCHW convolution (direct, im2col, Winograd with cached packed
                        # weights), pooling and resize: one nn-table call each
                        "conv2d", "conv2d_act", "max_pool2d", "avg_pool2d", "adaptive_avg_pool2d",
                        "adaptive_max_pool2d", "interpolate", "conv_transpose2d",
                        # one conv3d or recurrent-cell call (conv3d's per-depth-tap
                        # conv2d policy records those conv2d calls instead)
                        "conv3d", "lstm_cell", "rnn_cell",
                        # reflect / replicate: one pad_index call; constant / circular:
                        # a fill and copies into the new tensor
                        "pad",
                        # one copy (a cast where dtypes differ) into the result per part
                        # (more parts than the capture holds: the capture is unusable and
                        # the op a Python step)
                        "concat", "stack",
                        # reductions: one reduce-table call (a fill when nothing is reduced)
                        "sum", "prod", "mean", "var", "std", "max", "min", "argmax", "argmin",
                        "any", "all"})
# functional calls that are a gather of rows by integer indices (a "gather"
# step, plan.h's mt_plan_gather): the core runs them as getitem, whose
# offsets come from the index values, so no recorded kernel call replays them
GATHER_FUNCTIONS = frozenset({("mgtrace.functional.nn", "embedding")})
# index dtypes a gather step reads: (bytes, signed)
_GATHER_INDEX = {"int8": (1, True), "uint8": (1, False), "int16": (2, True), "uint16": (2, False),
                 "int32": (4, True), "uint32": (4, False), "int64": (8, True), "uint64": (8, False)}
# functional calls made of one kernel call and no core op
KERNEL_FUNCTIONS = frozenset({("mgtrace.functional.nn", "layer_norm"),
                              ("mgtrace.functional.nn", "local_response_norm")} |
                             # a new tensor and one fill
                             {("mgtrace.functional.tensor", f) for f in
                              ("zeros", "ones", "full", "zeros_like", "ones_like", "full_like")})


class Buffer:
    __slots__ = ("kind", "nbytes", "where", "const", "first", "last", "start", "lo")

    def __init__(self, kind, nbytes, start, where=0, const=None):
        self.kind, self.nbytes, self.start, self.where, self.const = kind, nbytes, start, where, const
        self.first = self.last = None
        self.lo = start             # the lowest address a slot of it starts at (origin for INPUT)


class Slot:
    """A tensor in a buffer: byte offset from the buffer's base, dtype code,
    shape and strides (elements)."""
    __slots__ = ("buf", "off", "dtype", "shape", "strides", "quant")

    def __init__(self, buf, off, dtype, shape, strides, quant=None):
        self.buf, self.off, self.dtype, self.shape, self.strides = buf, off, dtype, shape, strides
        self.quant = quant          # a quantized tensor's (dtype, qparams): _record.quant_tag


def _is_tensor(v):
    return isinstance(v, (Tensor, TensorMeta))


def _info(t):
    """``tensor_info`` of a Tensor or a recorded :class:`TensorMeta`."""
    return t.info if isinstance(t, TensorMeta) else _cplan.tensor_info(t)


class PyStep:
    """A Python step: ``call(*args, **kwargs)`` with tensor leaves as slots;
    the result's new buffers bound for the steps after it."""
    __slots__ = ("call", "treedef", "leaves", "out_bind", "what")

    def __init__(self, call, treedef, leaves, out_bind, what):
        self.call, self.treedef, self.leaves, self.out_bind, self.what = call, treedef, leaves, out_bind, what


class Lowering:
    def __init__(self, inputs, start_uid, packed=()):
        self.packed = list(packed)  # conv2d's packed weights the recording saw (see _record)
        self.buffers = []
        self.by_uid = {}            # storage uid -> buffer index
        self.origin = {}            # buffer index -> address its offsets count from
        self.start_uid = start_uid
        self.steps = []             # ("kernel", Captured, refs, where), ("gather", args, refs,
        #                             where) or ("py", PyStep)
        self.spans = []             # (lo, hi, buffer): the memory of every buffer
        self.device = None
        self.quant_consts = {}      # id(NumPy array) -> (array, ref): int8 layers' constants
        for i, t in enumerate(inputs):
            data, _, st_ptr, nbytes, uid, dtype, dev, _ = _cplan.tensor_info(t)
            if uid in self.by_uid:
                raise SharedMemoryError("plan inputs share memory (the same tensor, or views "
                                        "of one, passed twice): pass separate tensors")
            self._add(uid, Buffer(INPUT, nbytes, data, where=i), data, st_ptr)
            self.device = dev

    def _add(self, uid, buf, origin, lo=None):
        assert uid not in self.by_uid, "a storage's buffer is added once (see _snapshot)"
        self.buffers.append(buf)
        b = len(self.buffers) - 1
        self.by_uid[uid] = b
        self.origin[b] = origin
        lo = origin if lo is None else lo
        self.spans.append((lo, lo + buf.nbytes, b))
        return b

    # ---- slots
    def slot(self, t, create=False):
        """The slot of tensor ``t``: None when the plan does not know its
        memory (``create``: a new buffer for a storage made by this step)."""
        data, _, st_ptr, nbytes, uid, dtype, dev, strides = _info(t)
        b = self.by_uid.get(uid)
        if b is None:
            if uid < self.start_uid:
                b = self._add(uid, Buffer(CONST, nbytes, st_ptr, const=t), st_ptr)
            elif create:
                b = self._add(uid, Buffer(DYNAMIC, nbytes, st_ptr), st_ptr)
                self.new.append(b)
            else:
                return None
        quant = t.quant if isinstance(t, TensorMeta) else quant_tag(t)
        return Slot(b, data - self.origin[b], dtype, tuple(t.shape), strides, quant)

    def _use(self, b, pos):
        buf = self.buffers[b]
        if buf.first is None:
            buf.first = pos
        buf.last = pos if buf.last is None else max(buf.last, pos)

    # ---- records
    def lower(self, rec):
        """Lowers ``rec``'s children (the top record) into steps."""
        for child in rec.children:
            self._lower(child)

    def _snapshot(self):
        # (counts only: _add is the one writer of by_uid, always of a uid
        # it does not hold, so the buffers added since are the entries to
        # undo; a copy of by_uid per opened call made deep graphs quadratic)
        return (len(self.steps), len(self.buffers))

    def _restore(self, snap):
        n, nb = snap
        del self.steps[n:]
        self.by_uid = {uid: b for uid, b in self.by_uid.items() if b < nb}
        del self.buffers[nb:]
        self.spans = [sp for sp in self.spans if sp[2] < nb]
        for b in list(self.origin):
            if b >= nb:
                del self.origin[b]
        # int8 constants whose buffer went with the steps undone
        self.quant_consts = {k: v for k, v in self.quant_consts.items() if v[1][0] < nb}

    def _lower(self, rec):
        if rec.kind == "create":
            data, _, st_ptr, nbytes, uid, *_ = _cplan.tensor_info(rec.out)
            if uid not in self.by_uid:
                self._add(uid, Buffer(CONST, nbytes, st_ptr, const=rec.out), st_ptr)
            return
        if rec.kind == "segment":
            self._segment_steps(rec)
            return
        if rec.kind == "apply":
            self._check_shape(rec)
            self._check_write(rec)
            if self._kernel_steps(rec):
                return
        if rec.kind == "function" and not rec.children and self._kernel_steps(rec):
            return
        if rec.kind == "function" and _target_name(rec) in GATHER_FUNCTIONS and self._gather_step(rec):
            return
        if rec.quant and self._quant_steps(rec):
            return
        if rec.kind in ("function", "module") and rec.children and not rec.unaccounted:
            snap = self._snapshot()
            try:
                for t in self._inputs_of(rec)[0]:      # its arguments: memory a segment may use
                    if _is_tensor(t):
                        self.slot(t)
                for child in rec.children:
                    self._lower(child)
                leaves, _ = tree_flatten(rec.out, _is_tensor)
                if all(self.slot(t) is not None for t in leaves if _is_tensor(t)):
                    return
            except _Unknown:
                pass
            self._restore(snap)
        self._python_step(rec)

    def _check_shape(self, rec):
        name = rec.target.name
        leaves = tree_flatten(rec.args[1:], _is_tensor)[0] if name in ("getitem", "setitem") else ()
        if name == "nonzero" or any(_is_tensor(v) and v.dtype == "bool" for v in leaves):
            raise PlanError(f"{rec.where}: the result's shape depends on the input's values "
                            "(a boolean mask or nonzero); a plan holds fixed shapes: use "
                            "mgtrace.functional.where, or run the module")

    def _check_write(self, rec):
        op = rec.target
        target = write_target(op, rec.args)
        if not _is_tensor(target):
            return
        s = self.slot(target)
        if s is None:
            raise _Unknown(rec)
        kind = self.buffers[s.buf].kind
        if kind in (CONST, INPUT):
            what = "an input" if kind == INPUT else "a parameter, buffer or constant"
            raise PlanError(f"{rec.where} writes into {what} (an in-place {op.name}); a plan "
                            "replays a computation without state: write into a new tensor instead")

    def _inputs_of(self, rec):
        kwargs = dict(rec.target.params) if rec.kind == "apply" else rec.kwargs
        return tree_flatten((rec.args, kwargs), _is_tensor)

    def _python_step(self, rec):
        leaves, treedef = self._inputs_of(rec)
        slots = []
        for v in leaves:
            if _is_tensor(v):
                s = self.slot(v)
                if s is None:
                    raise _Unknown(rec)
                slots.append(s)
            else:
                slots.append(v)
        self.new = []
        outs, _ = tree_flatten(rec.out, _is_tensor)
        outs = [t for t in outs if _is_tensor(t)]
        out_slots = [self.slot(t, create=True) for t in outs]
        new = set(self.new)
        if not new and rec.kind in ("apply", "method") and self._pure_view(rec):
            return                  # a view: its slot is all a later step needs
        if not new and (rec.kind == "function" or rec.quant is not None) and not rec.children \
                and rec.captured == [] and not rec.allocs:
            return                  # no kernel, no core op, no memory (eval-mode dropout, a
            #                         DequantStub of a float tensor): it returned tensors the
            #                         plan already has
        # per new buffer: the output leaf that lies in it, and where
        bind, seen = [], set()
        for i, s in enumerate(out_slots):
            if s.buf in new and s.buf not in seen:
                seen.add(s.buf)
                bind.append((i, s.buf, s.off, s.dtype, s.shape))
        self.steps.append(("py", PyStep(_caller(rec), treedef, slots, bind, rec.where)))

    def _pure_view(self, rec):
        if rec.kind == "method":
            return rec.target == "view"
        return rec.captured == [] and "out" not in rec.target.params and rec.target.name != "setitem"

    def _kernel_steps(self, rec):
        """Kernel steps for an apply (or kernel-only function) record, or False."""
        caps = rec.captured
        if not caps:
            return False
        if rec.kind == "apply":
            name = rec.target.name
            if op_table.OPS[name].group not in KERNEL_GROUPS and name not in KERNEL_OPS:
                return False
        elif (getattr(rec.target, "__module__", None), getattr(rec.target, "__name__", None)) \
                not in KERNEL_FUNCTIONS:
            return False
        snap = self._snapshot()
        ranges = self._storage_ranges(rec)
        if ranges is None:
            self._restore(snap)
            return False
        scratch = {}                 # alloc index -> buffer: memory the op made for itself
        steps = []
        for c in caps:
            refs = []
            ext = c.extents()
            out_i, ws_i = c.roles()
            for i, p in enumerate(c.pointers()):
                if p is None:
                    refs.append(None)
                    continue
                if i == ws_i:        # a workspace: scratch the op allocated, nothing else
                    ref = self._scratch_ref(p, rec.allocs, scratch, True)
                else:
                    ref = self._known_ref(p, ext[i] if ext else None, ranges, False)
                    if ref is None and i != out_i:
                        # a temporary an earlier call of this op wrote (conv2d's
                        # float32 copy of a float16 input) before the packed
                        # weights: the recording freed it, and a later conv's
                        # packed weights may sit at its address now
                        ref = self._scratch_ref(p, rec.allocs, scratch, False)
                    if ref is None and i != out_i:
                        ref = self._packed_ref(p)
                    if ref is None:
                        ref = self._scratch_ref(p, rec.allocs, scratch, i == out_i)
                if ref is None:
                    self._restore(snap)
                    return False
                refs.append(ref)
            steps.append(("kernel", c, refs, rec.where))
        for b in self.new:
            self.buffers[b].kind = ARENA
        self.steps.extend(steps)
        return True

    def _storage_ranges(self, rec):
        """``(start, end, slot)`` of the storage of each tensor ``rec``
        reads or writes, its outputs given slots here; None when an input
        has no slot (the caller restores its snapshot). Starts the list of
        buffers this step makes (``self.new``)."""
        self.new = []
        known = []
        for t in self._inputs_of(rec)[0]:
            if _is_tensor(t):
                if self.slot(t) is None:
                    return None
                known.append(t)
        for t in tree_flatten(rec.out, _is_tensor)[0]:
            if _is_tensor(t):
                self.slot(t, create=True)
                known.append(t)
        ranges = []
        for t in known:
            _, _, st_ptr, nbytes, uid, *_ = _info(t)
            ranges.append((st_ptr, st_ptr + nbytes, self.by_uid[uid]))
        return ranges

    def _quant_steps(self, rec):
        """Kernel steps for an int8 layer's recorded kernel calls
        (``rec.quant``), or False (then it is a Python step): each data
        pointer inside the layer's inputs or outputs or in a temporary a
        call wrote (a signed input's flipped bytes, a Concat's requantizing
        tables: an arena buffer of its own), each output written whole by the calls, the constants
        (packed weights, multipliers, pooling windows) copied into plan
        constants."""
        snap = self._snapshot()
        ranges = self._storage_ranges(rec)
        if ranges is None:
            self._restore(snap)
            return False
        steps, written = [], {}
        for call, ptrs, ints, floats, nt in rec.quant:
            refs = []
            for p in ptrs:
                if p is None:
                    refs.append(None)
                    continue
                addr, nbytes, role, owner = p
                if role == "c":
                    refs.append(self._const_ref(owner))
                    continue
                ref = self._known_ref(addr, (0, max(nbytes, 1) - 1), ranges, role == "r")
                if ref is None and role == "w" and nbytes > 0:
                    # a temporary of the layer's (NumPy memory): arena, from this call on
                    self.buffers.append(Buffer(ARENA, nbytes, addr))
                    b = len(self.buffers) - 1
                    self.origin[b] = addr
                    self.new.append(b)
                    ranges.append((addr, addr + nbytes, b))
                    ref = (b, 0)
                if ref is None or role == "w" and ref[0] not in self.new:
                    self._restore(snap)
                    return False
                if role == "w":
                    written[ref[0]] = written.get(ref[0], 0) + nbytes
                refs.append(ref)
            steps.append(("quant", (call, nt, ints, floats), refs, rec.where))
        if any(written.get(b, 0) < self.buffers[b].nbytes for b in self.new):
            self._restore(snap)          # an output the calls did not write (whole)
            return False
        for b in self.new:
            self.buffers[b].kind = ARENA
        self.steps.extend(steps)
        return True

    def _const_ref(self, array):
        """A plan constant holding a copy of NumPy ``array`` (an int8 layer's
        packed weight, multipliers...), one per array."""
        held = self.quant_consts.get(id(array))
        if held is None:
            t = Tensor(np.ascontiguousarray(array))
            data, _, st_ptr, nbytes, uid, *_ = _cplan.tensor_info(t)
            b = self._add(uid, Buffer(CONST, nbytes, st_ptr, const=t), st_ptr)
            held = self.quant_consts[id(array)] = (array, (b, data - st_ptr))
        return held[1]

    def _gather_step(self, rec):
        """A gather step for an embedding lookup (``GATHER_FUNCTIONS``), or
        False (then the caller makes it a Python step): the indices a
        contiguous integer tensor the plan knows, the weight 2-d with
        contiguous rows, the result a new contiguous tensor."""
        try:
            bound = inspect.signature(rec.target).bind(*rec.args, **rec.kwargs).arguments
        except (TypeError, ValueError):
            return False
        ids, weight, out = bound.get("input"), bound.get("weight"), rec.out
        if not (_is_tensor(ids) and _is_tensor(weight) and _is_tensor(out)):
            return False
        index = _GATHER_INDEX.get(str(ids.dtype))
        if index is None or weight.ndim != 2 or out.dtype != weight.dtype:
            return False
        rows, dim = weight.shape
        if tuple(out.shape) != tuple(ids.shape) + (dim,):
            return False
        snap = self._snapshot()
        self.new = []
        si, sw = self.slot(ids), self.slot(weight)
        so = self.slot(out, create=True) if si is not None and sw is not None else None
        if so is None or so.buf not in self.new or not _contiguous(si.shape, si.strides) \
                or not _contiguous(so.shape, so.strides) or (dim > 1 and sw.strides[1] != 1):
            self._restore(snap)
            return False
        for b in self.new:
            self.buffers[b].kind = ARENA
        isz = weight.itemsize
        n = 1
        for d in ids.shape:
            n *= d
        args = (index[0], index[1], n, rows, dim * isz, sw.strides[0] * isz)
        self.steps.append(("gather", args, [(si.buf, si.off), (sw.buf, sw.off), (so.buf, so.off)],
                           rec.where))
        return True

    def _segment_steps(self, rec):
        """Kernel steps for kernels a call ran outside its children: every
        pointer must lie in a buffer the plan already has, and none may
        write into an input or a constant."""
        if rec.captured is None:
            raise _Unknown(rec)
        steps = []
        for c in rec.captured:
            ext = c.extents()
            out_i, ws_i = c.roles()
            refs = []
            for i, p in enumerate(c.pointers()):
                if p is None:
                    refs.append(None)
                    continue
                ref = None if i == ws_i else self._known_ref(p, ext[i] if ext else None,
                                                             self.spans, i != out_i)
                if ref is None:
                    raise _Unknown(rec)
                if i == out_i and self.buffers[ref[0]].kind in (CONST, INPUT):
                    raise PlanError(f"{rec.where} write into a parameter, buffer or input; a "
                                    "plan replays a computation without state")
                refs.append(ref)
            steps.append(("kernel", c, refs, rec.where))
        self.steps.extend(steps)

    def _known_ref(self, p, ext, ranges, read_only):
        # newest first: the recording frees its intermediates as it goes
        # (TensorMeta), so an address may have served a storage that was
        # freed before; the newest one holding it is the one alive now
        for lo, hi, b in reversed(ranges):
            if lo <= p < hi:
                if ext is None or (lo <= p + ext[0] and p + ext[1] < hi):
                    return (b, p - self.origin[b])
                break
        return self._packed_ref(p) if read_only else None

    def _packed_ref(self, p):
        """A pointer into conv2d's cached packed weights the recording held:
        a constant of the plan; else None."""
        packed = _packed_weight(p, self.packed)
        if packed is None:
            return None
        data, _, st_ptr, nbytes, uid, *_ = _cplan.tensor_info(packed)
        b = self.by_uid.get(uid)
        if b is None:
            b = self._add(uid, Buffer(CONST, nbytes, st_ptr, const=packed), st_ptr)
        return (b, p - self.origin[b])

    def _scratch_ref(self, p, allocs, scratch, written):
        """A pointer into memory the op allocated for itself (a kernel's
        workspace, a temporary): an arena buffer of its own, when this call
        is the first to use it and writes it, or a later call of the op."""
        for j, (lo, nbytes) in enumerate(allocs):
            if lo <= p < lo + nbytes:
                b = scratch.get(j)
                if b is None:
                    if not written:
                        return None          # read before any replayed call wrote it
                    self.buffers.append(Buffer(ARENA, nbytes, lo))
                    b = len(self.buffers) - 1
                    self.origin[b] = lo
                    scratch[j] = b
                return (b, p - lo)
        return None


def _target_name(rec):
    return getattr(rec.target, "__module__", None), getattr(rec.target, "__name__", None)


def _contiguous(shape, strides):
    """Whether (shape, strides in elements) is C order without gaps."""
    expect = 1
    for d, st in zip(reversed(shape), reversed(strides)):
        if d != 1 and st != expect:
            return False
        expect *= d
    return True


def _packed_weight(p, packed):
    """The Tensor of conv2d's packed weights (``packed``: those the
    recording held) that address ``p`` lies in, or None."""
    for t in packed:
        data, _, st_ptr, nbytes, *_ = _cplan.tensor_info(t)
        if st_ptr <= p < st_ptr + nbytes:
            return t
    return None


class _Unknown(Exception):
    """A record touches memory the plan does not know."""


def _caller(rec):
    if rec.kind == "apply":
        name = rec.target.name
        return lambda *a, **k: apply(OpDef(name, k), *a)
    if rec.kind == "method":
        name = rec.target
        return lambda t, *a: getattr(t, name)(*a)
    if rec.kind == "function":
        return rec.target
    module = rec.target
    return lambda *a, **k: module._call_impl(a, k)


def step_buffers(step):
    """The buffers a lowered step references: a kernel, gather or int8
    step's refs, a Python step's leaves and the buffers it binds."""
    if step[0] in ("kernel", "gather", "quant"):
        return [r[0] for r in step[2] if r is not None]
    ps = step[1]
    return [s.buf for s in ps.leaves if hasattr(s, "buf")] + [b[1] for b in ps.out_bind]


def readers(steps):
    """buffer -> the positions of the steps that reference it (the plan
    passes' test that a tensor is read by no other step)."""
    seen = {}
    for pos, step in enumerate(steps):
        for b in step_buffers(step):
            seen.setdefault(b, set()).add(pos)
    return seen


def place(buffers):
    """Arena offsets for the ARENA buffers (greedy by size, see the module
    docstring); sets each one's ``where`` and returns the arena's size."""
    # the placed buffers by spans of _PLACE_SPAN steps they are live in: a
    # buffer is checked against those live in its own spans, not against all
    # placed so far (20000 steps took 30 s, most of it here)
    spans = {}                  # span index -> [(offset, end, first, last)]
    size = 0
    order = sorted((b for b in buffers if b.kind == ARENA and b.first is not None),
                   key=lambda b: (-b.nbytes, b.first))
    for b in order:
        need = -(-b.nbytes // ALIGN) * ALIGN
        lo, hi = b.first // _PLACE_SPAN, b.last // _PLACE_SPAN
        clash = sorted({(o, e) for k in range(lo, hi + 1) for o, e, f, l in spans.get(k, ())
                        if not (l < b.first or b.last < f)})
        off = 0
        for o, e in clash:
            if off + need <= o:
                break
            off = max(off, -(-e // ALIGN) * ALIGN)
        b.where = off
        for k in range(lo, hi + 1):
            spans.setdefault(k, []).append((off, off + need, b.first, b.last))
        size = max(size, off + need)
    return size


_PLACE_SPAN = 32
