"""The tape: what a recording GradManager remembers of each op, and the
reverse pass over it.

Recording rides on the core's one hook (:mod:`mgtrace._core.trace_hooks`):
while any :class:`~mgtrace.autodiff.GradManager` records, :class:`Recorder`
is the installed hook, so every core op reaches :meth:`Recorder.on_apply`
(dispatch's tracing switch: the same single flag check per op as module
tracing, and nothing at all when nobody records). The hook is the
thread's that started recording: ops other threads run meanwhile are not
recorded (as a module trace sees only its own thread). An op whose inputs
carry gradients gets a :class:`Node`; its outputs point back at it through
their ``_ad`` attribute (``(node, output index)``).

Ownership: each ``record()`` of a manager makes a fresh session token; an
attached parameter carries the managers it is attached to, a node the
tokens of the recording managers its inputs came from. ``backward`` of one
manager walks only its own token's nodes, so several managers record at
once (MegEngine) and a tensor left over from an earlier record, whose
token has ended, is a constant.

Memory: a node keeps only what its rule declares it needs (inputs,
outputs or neither); it drops them once every manager that owns it has
run backward through it. Each saved tensor's storage version is noted when
it is saved, and a write in place since then makes backward raise
:class:`~mgtrace.errors.AutodiffError` (PyTorch's version counter; the
core's per-storage count of in-place writes).
"""
import threading
import weakref

from mgtrace._core import Tensor
from mgtrace._core import dispatch as _dispatch
from mgtrace._core import op_table as _op_table
from mgtrace._core import trace_hooks as _hooks
from mgtrace.errors import AutodiffError

_recording = set()     # session tokens of the managers now recording
_by_storage = {}       # storage id -> {id: weakref} of the tensors recorded in it (views share one)


class _NoGrad(threading.local):
    depth = 0          # this thread's open no_grad blocks


_no_grad = _NoGrad()   # per thread: another thread's optimizer step (no_grad) left this
                       # thread's recording unrecorded while it ran


class Session:
    """One ``record()`` of one manager (identity, and the thread that
    started it)."""
    __slots__ = ("manager", "thread", "__weakref__")

    def __init__(self, manager):
        self.manager = manager
        self.thread = 0


class Node:
    """One recorded op: its rule, where its inputs came from, what the rule
    saved, and the metadata of its inputs and outputs."""
    __slots__ = ("name", "rule", "params", "edges", "inputs", "outputs", "versions",
                 "in_meta", "out_meta", "owners", "pending")

    def needs(self, i):
        """Whether input ``i`` wants a gradient."""
        return self.edges[i] is not None

    def input_shape(self, i):
        return self.in_meta[i][0]

    def input_dtype(self, i):
        return self.in_meta[i][1]


def is_float(t):
    return t.dtype.kind == "f" or t.dtype.name == "bfloat16"


def edge_of(x):
    """``(node, index)``, ``(None, tensor)`` for an attached parameter, or
    None: where a gradient for ``x`` goes in the current recording."""
    if not isinstance(x, Tensor):
        return None
    d = x.__dict__
    e = d.get("_ad")
    if e is not None and not e[0].owners.isdisjoint(_recording):
        return e
    gms = d.get("_ad_managers")
    if gms:
        for gm in gms:
            if gm._session is not None:
                return (None, x)
    return None


def owners_of(edge):
    node = edge[0]
    if node is not None:
        return node.owners & _recording
    return frozenset(gm._session for gm in edge[1].__dict__["_ad_managers"]
                     if gm._session is not None)


def _alias(t):
    """A tensor sharing t's memory without its history (what a node saves)."""
    return t.detach() if isinstance(t, Tensor) else t


def _clear_history(t, what):
    """``t`` was overwritten by values without history. Writing an attached
    parameter while it is recorded is refused (outside no_grad: an
    optimizer's update runs inside one, and the version count guards
    whatever a pending backward saved of it)."""
    d = t.__dict__
    if not _no_grad.depth and d.get("_ad_managers") and any(
            gm._session is not None for gm in d["_ad_managers"]):
        raise AutodiffError(
            f"{what} writes in place into a parameter attached to a recording GradManager; "
            "update parameters outside the 'with gm:' block (after gm.backward), or under "
            "mgtrace.autodiff.no_grad()")
    d.pop("_ad", None)


_BY_KEYWORD = {}    # op name -> whether its implementation takes the inputs by name


def _run(op, inputs):
    """``dispatch.apply(op, *inputs)``, except for ops whose tensor inputs are
    not the implementation's first parameters (``gather(x, axis, index)``):
    those get them by name."""
    kw = _BY_KEYWORD.get(op.name)
    if kw is None:
        row = _op_table.OPS.get(op.name)
        code = getattr(_dispatch._IMPLS.get(op.name), "__code__", None)
        names = code.co_varnames[:code.co_argcount] if code is not None else ()
        kw = bool(row is not None and row.arity and names[:row.arity] != row.inputs
                  and set(row.inputs) <= set(names))
        _BY_KEYWORD[op.name] = kw
    if kw:
        row = _op_table.OPS[op.name]
        return _dispatch._IMPLS[op.name](**dict(zip(row.inputs, inputs)), **op.params)
    return _dispatch.apply(op, *inputs)


def record(op, inputs):
    """Run ``op`` (an OpDef) on ``inputs`` and, if a gradient can flow
    through it, add its node. Runs with the hook off (dispatch's traced())."""
    from mgtrace.autodiff.rules import RULES, NONDIFF
    name = op.name
    params = op.params
    out = params.get("out") if params else None
    if name == "setitem":
        out = inputs[0]
    edges = [edge_of(x) for x in inputs]
    if _no_grad.depth or not any(edges) or name in NONDIFF:
        res = _run(op, inputs)
        if out is not None:
            _clear_history(out, f"op {name!r}")
        return res
    rule = RULES.get(name)
    if out is not None and isinstance(out, Tensor):
        if out.__dict__.get("_ad_managers"):
            _clear_history(out, f"op {name!r}")
        _check_no_view_peers(out, name)
    saved_in = None
    if rule is not None and rule.saves_inputs:
        saved_in = []
        for x in inputs:
            if isinstance(x, Tensor) and out is not None and x._storage_id() == out._storage_id():
                x = x.copy()          # the op overwrites it: keep the value it read
            saved_in.append(_alias(x))
        saved_in = tuple(saved_in)
    res = _run(op, inputs)
    if out is not None:            # in place: the written tensor is the result
        outs = (out,)
    else:
        outs = tuple(res) if isinstance(res, (tuple, list)) else (res,)
    owners = frozenset().union(*[owners_of(e) for e in edges if e is not None])
    node = Node()
    node.name = name
    node.rule = rule
    node.params = {k: v for k, v in params.items() if k != "out"} if params else {}
    node.edges = tuple(edges)
    node.in_meta = tuple((x.shape, x.dtype) if isinstance(x, Tensor) else None for x in inputs)
    node.out_meta = tuple((o.shape, o.dtype) if isinstance(o, Tensor) else None for o in outs)
    node.inputs = saved_in if saved_in is not None else tuple(
        None if isinstance(x, Tensor) and is_float(x) else x for x in inputs)
    node.outputs = tuple(_alias(o) for o in outs) if rule is not None and rule.saves_outputs \
        else None
    saved = [t for t in (node.inputs or ()) + (node.outputs or ()) if isinstance(t, Tensor)]
    node.versions = tuple((t, t._version) for t in saved)
    node.owners = owners
    node.pending = set(owners)
    for i, o in enumerate(outs):
        if isinstance(o, Tensor) and is_float(o):
            o.__dict__["_ad"] = (node, i)
            _by_storage.setdefault(o._storage_id(), {})[id(o)] = weakref.ref(o)
    return res


def record_computed(name, rule, inputs, outputs, params):
    """Record ``outputs`` (already computed from ``inputs`` by no core op: a
    fused kernel a functional calls directly) as one node ``name`` whose
    rule (a :class:`~mgtrace.autodiff.rules.Rule`) reads the saved inputs
    and ``params``. The saved inputs' versions are noted as record()'s
    are. Returns ``outputs`` (a Tensor or a tuple), unchanged when no
    gradient flows."""
    edges = [edge_of(x) for x in inputs]
    if _no_grad.depth or not any(edges):
        return outputs
    outs = tuple(outputs) if isinstance(outputs, (tuple, list)) else (outputs,)
    node = Node()
    node.name = name
    node.rule = rule
    node.params = dict(params)
    node.edges = tuple(edges)
    node.in_meta = tuple((x.shape, x.dtype) if isinstance(x, Tensor) else None for x in inputs)
    node.out_meta = tuple((o.shape, o.dtype) if isinstance(o, Tensor) else None for o in outs)
    node.inputs = tuple(_alias(x) for x in inputs) if rule.saves_inputs else tuple(
        None if isinstance(x, Tensor) and is_float(x) else x for x in inputs)
    node.outputs = tuple(_alias(o) for o in outs) if rule.saves_outputs else None
    saved = [t for t in (node.inputs or ()) + (node.outputs or ()) if isinstance(t, Tensor)]
    node.versions = tuple((t, t._version) for t in saved)
    node.owners = frozenset().union(*[owners_of(e) for e in edges if e is not None])
    node.pending = set(node.owners)
    for i, o in enumerate(outs):
        if isinstance(o, Tensor) and is_float(o):
            o.__dict__["_ad"] = (node, i)
            _by_storage.setdefault(o._storage_id(), {})[id(o)] = weakref.ref(o)
    return outputs


def _check_no_view_peers(out, name):
    """An in-place write into ``out`` while another recorded tensor shares
    its memory (a view of it, or it a view of that one) would change that
    tensor's values behind its history: refused, never a wrong gradient."""
    peers = _by_storage.get(out._storage_id())
    if not peers:
        return
    for ref in list(peers.values()):
        t = ref()
        if t is not None and t is not out and edge_of(t) is not None:
            raise AutodiffError(
                f"op {name!r} writes in place into a tensor of shape {out.shape} that shares "
                f"memory with another recorded tensor (shape {t.shape}: a view of it, or it a "
                "view of that one); gradients through the other would miss the write. Write "
                "out of place (y = x + 1), or copy the view first")


class Recorder(_hooks.TraceHook):
    """The hook installed while a GradManager records."""

    def on_apply(self, op, *inputs):
        return record(op, inputs)

    def on_function(self, wrapper, fn, args, kwargs):
        from mgtrace.autodiff.rules import FUNCTION_RULES
        rule = FUNCTION_RULES.get(fn.__name__)
        if rule is not None and fn.__module__.startswith("mgtrace.functional"):
            return rule(fn, args, kwargs)
        return fn(*args, **kwargs)

    def on_method(self, t, method, args):
        with _hooks.installed(self, tracing=False):
            if method == "detach":
                return t.detach()
            if method == "view":        # a reshape that never copies
                return _reshape_like(t, t.view(*args))
            if method == "to":          # a move: the gradient moves back
                return _recorded_as(t, t.to(*args), "to", {"device": str(t.device)})
            return getattr(t, method)(*args)


def _reshape_like(x, y):
    """Record ``y`` (already computed, a view of ``x``) as ``reshape(x)``."""
    return _recorded_as(x, y, "reshape", {"shape": y.shape})


def _recorded_as(x, y, name, params):
    """Record ``y`` (already computed from ``x`` by no core op) as the node
    ``name`` of ``x``, whose rule (RULES[name]) reads only ``params``."""
    e = edge_of(x)
    if e is None or _no_grad.depth:
        return y
    from mgtrace.autodiff.rules import RULES
    node = Node()
    node.name = name
    node.rule = RULES[name]
    node.params = params
    node.edges = (e,)
    node.in_meta = ((x.shape, x.dtype),)
    node.out_meta = ((y.shape, y.dtype),)
    node.inputs = (None,)
    node.outputs = None
    node.versions = ()
    node.owners = owners_of(e)
    node.pending = set(node.owners)
    y.__dict__["_ad"] = (node, 0)
    return y


RECORDER = Recorder()


def start(session):
    """A manager begins recording: the recorder becomes the hook (unless a
    module tracer is running: its trace then is not recorded).

    The hook and the core's switch are one thread's at a time
    (:mod:`mgtrace._core.trace_hooks`), so recordings take turns with
    traces and with other threads' recordings as traces do with each other:
    the thread holds ``trace_hooks.one_trace`` from ``record()`` to
    ``release()`` (re-entered by its own nested managers and traces), and
    another thread's ``record()``, ``trace_module`` or plan recording waits
    for it. (Without the turn, a second thread's manager saw the first's
    hook installed and recorded nothing: its parameters got no gradient,
    without a word; and a trace that began inside another thread's
    recording put the recorder back after it had stopped, left installed
    for good.) Eager ops of other threads run meanwhile, unrecorded.
    """
    _hooks.one_trace.acquire()
    try:
        session.thread = _hooks.get_ident()
        _recording.add(session)
        if _hooks.active is None:       # records the ops of the thread that starts it
            _hooks._dispatch._install_hook(RECORDER, True)
            _hooks.owner = _hooks.get_ident()
            _hooks.active = RECORDER
    except BaseException:
        _recording.discard(session)
        _hooks.one_trace.release()
        raise


def check_thread(session, what):
    """Raise RuntimeError unless the calling thread started ``session``."""
    if session.thread != _hooks.get_ident():
        raise RuntimeError(f"GradManager.{what}: the recording was started in another thread "
                           f"(id {session.thread}); call release() or backward() in the thread "
                           "that called record()")


def stop(session):
    """A manager stops recording, in the thread that started it.

    Raises:
        RuntimeError: called from another thread (the recording's turn
            belongs to the thread that started it).
    """
    check_thread(session, "release")
    _recording.discard(session)
    try:
        if not _recording:
            _by_storage.clear()
        if not _recording and _hooks.active is RECORDER:
            _hooks._dispatch._install_hook(None, False)
            _hooks.active = None
            _hooks.owner = 0
    finally:
        _hooks.one_trace.release()


class no_grad:
    """``with no_grad():`` runs ops unrecorded: no manager sees them and
    their results carry no gradient (inference inside a recorded block,
    an optimizer's update)."""

    def __enter__(self):
        _no_grad.depth += 1
        return self

    def __exit__(self, *exc):
        _no_grad.depth -= 1
        return False


# ------------------------------------------------------------------ backward
def _accumulate(a, b):
    return b if a is None else a + b


def backward(session, roots):
    """Reverse pass over ``session``'s nodes from ``roots``: a list of
    ``(tensor, grad)``. Returns ``{id(param): (param, grad)}`` for the
    attached parameters reached."""
    leaves = {}
    grads = {}          # node -> [grad per output]
    deps = {}           # node -> consumers not yet run
    stack = []
    for t, g in roots:
        e = t.__dict__.get("_ad") if isinstance(t, Tensor) else None
        if e is not None and session in e[0].owners:
            node, i = e
            slots = grads.setdefault(node, [None] * len(node.out_meta))
            slots[i] = _accumulate(slots[i], g)
            if node not in deps:
                deps[node] = 0
                stack.append(node)
        elif isinstance(t, Tensor) and session.manager in t.__dict__.get("_ad_managers", ()):
            p, acc = leaves.get(id(t), (t, None))
            leaves[id(t)] = (t, _accumulate(acc, g))
    seen = set(stack)
    while stack:                       # count each node's consumers in this graph
        node = stack.pop()
        for e in node.edges:
            if e is not None and e[0] is not None and session in e[0].owners:
                child = e[0]
                deps[child] = deps.get(child, 0) + 1
                if child not in seen:
                    seen.add(child)
                    stack.append(child)
    ready = [n for n, d in deps.items() if d == 0]
    with _hooks.installed(None):
        while ready:
            node = ready.pop()
            gouts = grads.pop(node, None)
            gins = None
            if gouts is not None and any(g is not None for g in gouts):
                gins = _run_rule(node, gouts)
            for i, e in enumerate(node.edges):
                if e is None:
                    continue
                g = gins[i] if gins is not None else None
                if g is not None:
                    g = _fit(g, node.in_meta[i])
                child = e[0]
                if child is None:
                    if g is not None and session.manager in e[1].__dict__.get("_ad_managers", ()):
                        p, acc = leaves.get(id(e[1]), (e[1], None))
                        leaves[id(e[1])] = (p, _accumulate(acc, g))
                    continue
                if session not in child.owners:
                    continue
                if g is not None:
                    slots = grads.setdefault(child, [None] * len(child.out_meta))
                    slots[e[1]] = _accumulate(slots[e[1]], g)
                deps[child] -= 1
                if deps[child] == 0:
                    ready.append(child)
            node.pending.discard(session)
            if not node.pending:
                node.inputs = node.outputs = node.versions = None
    return leaves


def sum_to(g, shape):
    """``g`` summed over the axes broadcasting added to ``shape`` (NumPy's rules)."""
    shape = tuple(shape)
    if g.shape == shape:
        return g
    lead = g.ndim - len(shape)
    axes = tuple(range(lead)) + tuple(i + lead for i, s in enumerate(shape)
                                      if s == 1 and g.shape[i + lead] != 1)
    if axes:
        g = g.sum(axis=axes, keepdims=True)
    return g.reshape(shape)


def _fit(g, meta):
    """A rule's gradient made to match its input: shape and float dtype."""
    shape, dtype = meta
    if not isinstance(g, Tensor):
        raise AutodiffError(f"a gradient rule returned {type(g).__name__}, not a Tensor")
    if g.shape != shape:
        g = sum_to(g, shape)
    if g.dtype != dtype:
        g = g.astype(dtype)
    return g


def _run_rule(node, gouts):
    if node.rule is None:
        raise AutodiffError(
            f"no gradient is defined for op {node.name!r} (a gradient was asked through it); "
            "see mgtrace.autodiff.rules for the ops that have one, or detach() its inputs")
    if node.versions is None:
        raise AutodiffError(f"op {node.name!r}: its saved tensors were freed by an earlier "
                            "backward")
    for t, v in node.versions:
        if t._version != v:
            raise AutodiffError(
                f"a tensor op {node.name!r} saved for backward was written in place after it was "
                f"used (shape {t.shape}, {t._version - v} write(s) since); compute the in-place "
                "op on a copy, or out of place")
    if len(gouts) == 1:
        gins = node.rule.fn(node, gouts[0])
    else:
        gins = node.rule.fn(node, gouts)
    if type(gins) is not tuple:
        gins = (gins,)
    return gins
