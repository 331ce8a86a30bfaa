"""Recording one run of a module for a plan: every core op, functional call
and module call it makes, in order, each with the kernel calls the backend
received for it (:mod:`mgtrace._core.plan`'s capture).

A record is a tree: a functional or module call keeps the records made
inside it (``children``), so lowering can replay the inside as kernels, or,
where the inside used memory the recorder never saw (a kernel called
outside the core's ops), replay the call as one Python step.

What a plan cannot hold is refused here, naming where it happened:
training-mode BatchNorm and Dropout, random draws (:mod:`mgtrace.random`,
which ``F.dropout`` uses: a plan would replay one draw), calls that write
into their arguments (MegEngine's BatchNorm running statistics), and
data-dependent values (``bool(t)``, ``t.item()``, ``t.numpy()``: the next
call could branch elsewhere). Shape facts (``len(t)``, ``t.size``) are
fixed by the input signature and pass.

The int8 layers of a quantized model (:mod:`mgtrace.module.quantized`),
and the pooling functionals called on a quantized tensor, are recorded whole, without their inside: they read their qparams and
weights into Python and call the int8 kernels on NumPy views. What the
layer ran is known from the int8 kernel calls it made
(:func:`mgtrace._core.qint8.record_begin`, ``Record.quant``): lowering
replays them as kernel steps where every pointer they were given lies in
the layer's input or output or is a constant of the layer (packed
weights, multipliers), else the layer is a Python step that calls it on
the plan's memory (the same kernels, the same bits). A quantized tensor
keeps its dtype and qparams in its record (:attr:`TensorMeta.quant`), so
the step's arguments and the plan's outputs are quantized as they were.
"""
from mgtrace._core import dispatch as _dispatch
from mgtrace._core import plan as _cplan
from mgtrace._core import trace_hooks as _hooks
from mgtrace._core.tensor import Tensor
from mgtrace.errors import Error
from mgtrace.functional._trace import mutated_arguments
from mgtrace.traced_module.pytree import tree_flatten

__all__ = ["PlanError", "Record", "SharedMemoryError", "TensorMeta", "record", "write_target"]


class PlanError(Error, ValueError):
    """A module cannot be compiled into a plan: the message names the module
    path or function that prevents it and why (training-mode BatchNorm, a
    write into a buffer, a data-dependent value, watch or end points). Run
    the module itself instead, or change what the message names."""


class SharedMemoryError(PlanError):
    """The inputs of a recording share memory with each other or with the
    module's tensors: a property of those tensors, not of their signature
    (a plan called with them runs the module for that call)."""


class TensorMeta:
    """A tensor made during the recording, as lowering reads it: its
    ``tensor_info`` (addresses, storage uid, dtype code, strides), shape,
    dtype, ndim and itemsize. Records hold these instead of the tensors, so
    the forward's intermediates are freed as the recorded run goes, as they
    would be outside it: compiling peaks at one forward's memory, not at all
    of its intermediates at once. A freed storage's addresses may then serve
    a later one; storages are told apart by uid, and an address by the
    newest storage that held it (:meth:`Lowering._known_ref`)."""
    __slots__ = ("info", "shape", "dtype", "ndim", "itemsize", "quant")

    def __init__(self, t, info):
        self.info, self.shape, self.dtype, self.ndim, self.itemsize = (
            info, tuple(t.shape), t.dtype, t.ndim, t.itemsize)
        self.quant = quant_tag(t)

    def __repr__(self):
        return f"TensorMeta({self.shape}, {self.dtype})"


def write_target(op, args):
    """The tensor core op ``op`` writes into (its ``out``, or setitem's
    first argument), else None."""
    target = op.params.get("out")
    if target is None and op.name == "setitem" and args:
        target = args[0]
    return target


def quant_tag(t):
    """(quantized dtype, qparams) of a quantized tensor ``t`` (either may be
    None: per-channel qparams have no dtype), None for any other tensor."""
    qp = t.__dict__.get("qparams")
    return None if t._qdtype is None and qp is None else (t._qdtype, qp)


def retag(t, quant):
    """``t`` (a plan's view) quantized as :func:`quant_tag` recorded it."""
    if quant is not None:
        t._qdtype = quant[0]
        if quant[1] is not None:
            t.__dict__["qparams"] = quant[1]
    return t


def _opaque(module):
    """Whether ``module`` is recorded whole, as one Python step: an int8
    layer (see the module docstring)."""
    from mgtrace.module.quantized import QuantizedModule
    return isinstance(module, QuantizedModule)


# functionals that run int8 kernels on a quantized tensor (int8.py's pools),
# recorded whole as the int8 layers are
_INT8_FUNCTIONS = frozenset({"max_pool2d", "avg_pool2d", "adaptive_avg_pool2d"})


def _int8_call(name, args, kwargs):
    """Whether functional ``name`` called with these arguments runs int8
    kernels: one of _INT8_FUNCTIONS on a quantized tensor."""
    if name not in _INT8_FUNCTIONS:
        return False
    leaves, _ = tree_flatten((args, kwargs), lambda v: isinstance(v, Tensor))
    return any(isinstance(t, Tensor) and quant_tag(t) is not None for t in leaves)


def _run_opaque(rec, call):
    """``call()`` without hooks, ``rec.quant`` the int8 kernel calls it made."""
    from mgtrace._core import qint8
    qint8.record_begin()
    try:
        with _hooks.installed(None):
            return call()
    finally:
        rec.quant = qint8.record_end()


def _strip(obj, start_uid):
    """``obj`` with each tensor whose storage the recording made (uid from
    ``start_uid`` on) replaced by its :class:`TensorMeta`; older storages
    (inputs, parameters, buffers) stay tensors, which the plan holds."""
    leaves, tdef = tree_flatten(obj, lambda v: isinstance(v, Tensor))
    if not leaves:
        return obj
    metas = []
    for t in leaves:
        info = _cplan.tensor_info(t)
        metas.append(TensorMeta(t, info) if info[4] >= start_uid else t)
    return tdef.unflatten(metas)


class Record:
    """One call seen while recording.

    kind: ``"apply"`` (a core op: ``target`` its OpDef), ``"method"`` (a
    Tensor method that applies no core op: ``target`` its name),
    ``"function"`` (``target`` the functional implementation), ``"module"``
    (``target`` the module), ``"create"`` (a tensor made from constant data).
    ``args``/``kwargs`` the call's arguments, ``out`` its result,
    ``captured`` the kernel calls (apply only; None when one could not be
    recorded), ``where`` the module path and call for messages."""
    __slots__ = ("kind", "target", "args", "kwargs", "out", "captured", "allocs", "children", "where",
                 "unaccounted", "quant")

    def __init__(self, kind, target, args, kwargs, where):
        self.kind, self.target, self.args, self.kwargs, self.where = kind, target, args, kwargs, where
        self.out = None
        self.captured = None
        self.allocs = ()
        self.children = []
        self.unaccounted = False    # kernels ran inside it outside any child: not to be opened
        self.quant = None           # an int8 layer's kernel calls (qint8.record_end), if any

    def __repr__(self):
        return f"Record({self.kind}, {self.name}, at {self.where})"

    @property
    def name(self):
        t = self.target
        if self.kind == "apply":
            return t.name
        if self.kind == "module":
            return type(t).__name__
        return getattr(t, "__qualname__", None) or getattr(t, "__name__", None) or str(t)


def _has_tensor(obj, varies):
    """Whether ``obj`` holds a tensor for which ``varies(t)`` is true."""
    if isinstance(obj, Tensor):
        return varies(obj)
    if isinstance(obj, (list, tuple)):
        return any(_has_tensor(v, varies) for v in obj)
    if isinstance(obj, dict):
        return any(_has_tensor(v, varies) for v in obj.values())
    return False


class _Recorder(_hooks.TraceHook):
    def __init__(self, names, start_uid, inputs=()):
        self.names = names           # id(module) -> its path in the compiled module
        self.start_uid = start_uid   # storages from this uid on are the recording's own
        # the inputs' storages: a tensor made from one of them (or from the
        # recording's own) changes with the inputs
        self.input_uids = frozenset(_cplan.tensor_info(t)[4] for t in inputs
                                    if isinstance(t, Tensor))
        # conv2d's packed weights that recorded calls read, by storage uid:
        # held, as the plan holds them, since the cache drops an entry when
        # its weight is freed (a weight computed in the forward is freed
        # during the recording) and another could then take its address
        self.packed = {}
        self.stack = [Record("module", None, (), {}, "")]
        self.path = []
        self.written = []           # (tensor, value before the forward wrote it)

    def _hold_packed(self, captured):
        """After ``captured`` calls ran: hold the packed weights now in
        conv2d's cache when one of them was an nn call (which may read them)."""
        if not captured or all(c.kind != _cplan.STEP_NN for c in captured):
            return
        from mgtrace._core import nn as _nn
        for entry in list(_nn._weight_cache.values()):
            t = entry[1] if isinstance(entry, tuple) and len(entry) > 1 else None
            if isinstance(t, Tensor):
                self.packed.setdefault(_cplan.tensor_info(t)[4], t)

    def where(self, what):
        path = ".".join(p for p in self.path if p) or "<top>"
        return f"{path}: {what}"

    def _push(self, rec):
        self._segment()
        self.stack[-1].children.append(rec)
        self.stack.append(rec)
        _cplan.capture_begin()

    def _pop(self):
        """Ends the innermost record: a record without children keeps its
        kernel calls (a function made of kernels alone); one with children
        keeps those made after its last child as a segment."""
        rec = self.stack[-1]
        if rec.children:
            self._segment()
            self.stack.pop()
        else:
            self.stack.pop()
            rec.allocs, rec.captured = _cplan.take_allocs(), _cplan.take_capture()
            self._hold_packed(rec.captured)
        _cplan.capture_begin()

    def _segment(self):
        """The kernel calls made in the innermost record since its last child
        (linear_act's bias + activation after its matmul): a "segment"
        child, replayed where its memory is the plan's; one that could not
        be recorded marks the records around it (they stay Python steps)."""
        rec = self.stack[-1]
        captured = _cplan.take_capture()
        if captured is None:
            if rec is self.stack[0]:
                raise PlanError(f"{self.where('forward')}: kernels ran outside any call the plan "
                                "records (not through a core op, functional or module call)")
            for r in self.stack[1:]:
                r.unaccounted = True
        elif captured:
            self._hold_packed(captured)
            seg = Record("segment", None, (), {}, self.where("kernels"))
            seg.captured = captured
            rec.children.append(seg)

    def on_apply(self, op, *inputs):
        rec = Record("apply", op, _strip(inputs, self.start_uid), {}, self.where(op.name))
        self._segment()
        self.stack[-1].children.append(rec)
        self._save_before_write(op, inputs)
        _cplan.capture_begin()
        try:
            out = _dispatch.apply(op, *inputs)
        finally:
            rec.allocs = _cplan.take_allocs()
            rec.captured = _cplan.take_capture()
            _cplan.capture_begin()
        self._hold_packed(rec.captured)
        rec.out = _strip(out, self.start_uid)
        return out

    def _save_before_write(self, op, inputs):
        """The value of what ``op`` is about to write, where that is an input
        or a module's tensor (storage older than the recording): lowering
        refuses the write, and :meth:`put_back` undoes it, so that a refused
        compile leaves the module and the inputs as they were. (The copy's
        kernel call is dropped by the capture_begin after it.)"""
        target = write_target(op, inputs)
        if isinstance(target, Tensor) and _cplan.tensor_info(target)[4] < self.start_uid:
            self.written.append((target, target.copy()))

    def put_back(self):
        """Undo the writes into inputs and module tensors (newest first)."""
        while self.written:
            target, value = self.written.pop()
            with _hooks.installed(None):
                target[...] = value

    def on_function(self, wrapper, fn, args, kwargs):
        name = getattr(fn, "__name__", str(fn))
        written = mutated_arguments(fn, args, kwargs)
        if written:
            raise PlanError(f"{self.where(name)} writes into its argument(s) {', '.join(written)} "
                            "(state updated by the forward, as training-mode batch_norm does): a plan "
                            "replays a fixed computation; call module.eval() first or run the module")
        rec = Record("function", fn, _strip(args, self.start_uid), _strip(kwargs, self.start_uid),
                     self.where(name))
        # a function that applies no core op (layer_norm's one C pass) is
        # known by its kernel calls; one that does, by its children's
        self._push(rec)
        try:
            if _int8_call(name, args, kwargs):
                out = _run_opaque(rec, lambda: fn(*args, **kwargs))
            else:
                out = fn(*args, **kwargs)
        finally:
            self._pop()
        rec.out = _strip(out, self.start_uid)
        return out

    def on_module_call(self, module, args, kwargs):
        name = self.names.get(id(module), type(module).__name__)
        self.path.append(name)
        try:
            what = self.where(type(module).__name__)
            if module.training and (hasattr(module, "running_mean") or type(module).__name__ == "Dropout"):
                raise PlanError(f"{what} is in training mode (it updates its running statistics or "
                                "draws random numbers on every call): call .eval() on the module "
                                "before compiling it")
            rec = Record("module", module, _strip(args, self.start_uid),
                         _strip(kwargs, self.start_uid), what)
            self._push(rec)
            try:
                if _opaque(module):
                    out = _run_opaque(rec, lambda: module._call_impl(args, kwargs))
                else:
                    out = module._call_impl(args, kwargs)
            finally:
                self._pop()
            rec.out = _strip(out, self.start_uid)
            return out
        finally:
            self.path.pop()

    def on_method(self, t, method, args):
        rec = Record("method", method, _strip((t,) + tuple(args), self.start_uid), {},
                     self.where(f"Tensor.{method}"))
        self.stack[-1].children.append(rec)
        with _hooks.installed(self, tracing=False):
            out = getattr(t, method)(*args)
        rec.out = _strip(out, self.start_uid)
        return out

    def _varies(self, t):
        uid = _cplan.tensor_info(t)[4]
        return uid >= self.start_uid or uid in self.input_uids

    def on_create(self, target, data, dtype, device):
        # a tensor made from a constant (a traced graph's Constant, a
        # parameter) is fixed as the numbers it is made from are; one made
        # from the inputs or from what the forward computed is not
        if _has_tensor(data, self._varies):
            raise PlanError(f"{self.where('mgtrace.tensor')} builds a tensor from tensor values: "
                            "its contents depend on the inputs, which a plan cannot replay")
        if isinstance(data, Tensor) and data.device.type == "cpu" and data.dtype.kind in "biuf":
            # a traced graph's Constant (mgtrace.tensor(const)): made from its
            # numbers on the host, as from an array (the copy kernel a Tensor
            # source runs would be recorded as a write into the constant)
            self._segment()             # kernels before it stay the forward's
            with _hooks.installed(self, tracing=False):
                data = data.numpy().copy()
            _cplan.take_capture()       # the read of the constant is no step of the plan
            _cplan.capture_begin()
        out = super().on_create(target, data, dtype, device)
        rec = Record("create", None, (), {}, self.where("mgtrace.tensor"))
        rec.out = out
        self.stack[-1].children.append(rec)
        return out

    def on_bool(self, t):
        raise PlanError(f"{self.where('bool(tensor)')}: the forward branches on a tensor's value, so "
                        "another input could take another path; a plan replays one fixed path")

    def on_frozen(self, t, what):
        # a shape fact is fixed by the input signature (the guard checks the
        # inputs' shapes and strides, and a value-dependent shape is refused
        # at its op): MultiHeadAttention's len(q), logsumexp's t.size
        if what in _SHAPE_FACTS:
            return
        raise PlanError(f"{self.where(what)}: the forward reads a tensor's value into Python "
                        "(a data-dependent value); a plan replays one fixed computation")

    def on_random(self, rng):
        calls = [r.name for r in self.stack[1:] if r.kind == "function"]
        what = f"{calls[-1]} draws random numbers" if calls else "a random draw (mgtrace.random)"
        raise PlanError(f"{self.where(what)}: a plan would replay the one draw made while "
                        "compiling on every call; run the module itself, or pass the random "
                        "tensor in as an input")


# what Tensor's _frozen hands out that depends on the shape alone (tensor.pyx)
_SHAPE_FACTS = frozenset({"t.size", "t.strides", "t.nbytes", "len(t)", "iterating over t"})


def record(module, inputs, start_uid):
    """Runs ``module(*inputs)`` once, recording it; returns (top record,
    outputs, the packed conv2d weights recorded calls may read). Tensors whose storage uid is ``start_uid`` or later (made by
    the run) are held as :class:`TensorMeta` in the records."""
    names = {id(m): n for n, m in module.named_modules()}
    names[id(module)] = ""
    rec = _Recorder(names, start_uid, inputs)
    _cplan.capture_install()
    try:
        with _hooks.installed(rec, tracing=True):
            _cplan.capture_begin()
            if _opaque(module):     # an int8 layer compiled alone: recorded whole, as inside a model
                out = rec.on_module_call(module, tuple(inputs), {})
            else:
                out = module._call_impl(tuple(inputs), {})
            rec._segment()
    finally:
        _cplan.capture_uninstall()
        rec.put_back()              # every such write is refused (lowering's _check_write)
    top = rec.stack[0]
    top.out = out
    return top, out, list(rec.packed.values())
