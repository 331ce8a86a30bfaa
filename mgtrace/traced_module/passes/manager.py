"""The pass registry, the order passes run in, and :func:`optimize`.

A pass is a function ``fn(tm)`` that edits the TracedModule ``tm`` in
place (optimize hands it a copy) through the graph editing API and returns
a :class:`PassResult` ``(tm, changed, counts)``: the module (``tm``, or a
new one to continue with), whether it changed anything, and what it did as
``{what: how many}`` (``{"folds": 52}``). ``optimize`` keeps the results
(``return_report=True``, ``verbose=True``; :class:`OptimizeReport`).

Each pass declares what it **requires** (passes that must run before it;
asking for it brings them along, with a warning) and what it runs
**after** when both run. ``optimize`` runs the passes asked for in the
topological order of those declarations, ties broken by registration
order (mgtrace's own first, in the table below; then users' passes in the
order ``enabled_pass`` lists them). A requirement that is not registered,
or declarations that form a cycle, raise :class:`PassOrderError` naming
the passes; an exception inside a pass is re-raised as :class:`PassError`
naming the pass, the pass's own exception as ``__cause__``.

mgtrace's own, in the order they run (``registered_passes()`` has each
one's ``requires`` and ``after``):

======================  ========================================================
FoldConstant            compute exprs of constants once (ours)
EliminateIdentity       drop Identity and inference-mode Dropout (ours)
FuseConvBn              fold inference-mode BatchNorm2d into the Conv2d before it
FuseAddMul              merge chains of constant additions and multiplications
BackwardFoldScale       fold a constant scale into the Conv2d/Linear before it,
                        then merge the constant chains that exposes (requires
                        FuseConvBn)
FuseConvAct             conv2d + ReLU/ReLU6/SiLU/Hardswish/Sigmoid/GELU in one
                        kernel (ours)
FuseLinearAddNorm       layer_norm(linear(x) + residual): the bias, the add and
                        the layer norm in one pass (ours)
FuseLinearAct           linear + activation in one kernel, a linear's bias added
                        in place (ours)
FuseSiblingLinear       linear layers reading one input as one GEMM over their
                        stacked weights, a column slice each (BERT's query, key
                        and value; ours)
FuseAttention           softmax(q k^T * scale + mask) v in one kernel (ours)
NCHWc                   chains of float32 convs in the NCHW16c layout (ours;
                        ``"all"`` runs it on CPUs with AVX-512, where its
                        kernels are vectorised)
FusePointwiseDepthwise  a pointwise conv2d_nchwc and the depthwise one reading
                        its output in one kernel, and the 1x1 projection after
                        them (ours; in ``"all"`` with NCHWc)
FuseQuantStub           a quantized conv / linear with float output, the ReLU
                        or ReLU6 and the QuantStub after it in one int8 layer
                        writing the stub's quantized output (ours; ``int8.py``)
EliminateRequantize     QuantStub(DequantStub(z)) with z's own qparams is z: int8
                        flows through quantized adds (ours; ``int8.py``)
EliminateDeadCode       drop unused exprs and submodules (ours)
======================  ========================================================

The first three of MegEngine's are its names and meanings
(``megengine.traced_module.optimize``); the others are mgtrace's own.
"""
import collections
import copy
import heapq
import sys
import time
import warnings

from mgtrace.errors import did_you_mean
from mgtrace.traced_module.errors import PassError, PassOrderError
import mgtrace.functional as F
from mgtrace.module.builtin import Dropout, _BatchNorm
from mgtrace.traced_module.expr import CallMethod
from mgtrace.traced_module.node import ModuleNode
from mgtrace.traced_module.passes import fold, fuse, int8, layout, sibling
from mgtrace.traced_module.passes.match import is_function
from mgtrace.traced_module.passes.util import graphs_of
from mgtrace.traced_module.traced_module import TracedModule

__all__ = ["optimize", "register_pass", "get_pass", "registered_passes", "DEFAULT_PASSES",
           "PassInfo", "PassResult", "PassRecord", "OptimizeReport"]

PassInfo = collections.namedtuple("PassInfo",
                                  "name fn training_safe builtin doc requires after")
"""A registered pass: ``training_safe`` is whether it keeps a module in
training mode computing the same thing (``"all"`` runs only those then);
``requires`` and ``after`` are tuples of pass names (see the module
docstring)."""

PassResult = collections.namedtuple("PassResult", "tm changed counts")
"""What a pass returns: ``tm`` the TracedModule to go on with (usually the
one it was given), ``changed`` a bool, ``counts`` a dict ``{str: int}`` of
what it did (``{"folds": 52}``)."""

PassRecord = collections.namedtuple("PassRecord", "name changed counts seconds")
"""One pass's row of an :class:`OptimizeReport`: ``changed`` is None for a
user pass that returned no PassResult (it did not say)."""


class OptimizeReport(dict):
    """``{pass name: PassRecord}`` in the order the passes ran, as
    ``optimize(..., return_report=True)`` returns and ``verbose=True``
    prints (``str(report)``: one line per pass)."""

    def __str__(self):
        lines = [f"{'pass':<24}{'changed':<9}{'ms':>8}  counts"]
        for r in self.values():
            changed = "?" if r.changed is None else "yes" if r.changed else "no"
            counts = ", ".join(f"{k}={v}" for k, v in r.counts.items())
            lines.append(f"{r.name:<24}{changed:<9}{r.seconds * 1e3:>8.1f}  {counts}")
        return "\n".join(lines)


_PASSES = {}

DEFAULT_PASSES = ("FuseConvBn",)
"""What ``optimize(tm)`` runs without ``enabled_pass`` (MegEngine's default)."""


def _names(value, what):
    """``value`` (one pass name or several) as a tuple of str."""
    names = (value,) if isinstance(value, str) else tuple(value)
    for n in names:
        if not isinstance(n, str) or not n:
            raise TypeError(f"register_pass: {what} holds pass names (non-empty str), got {n!r}")
    return names


def register_pass(name, fn=None, *, training_safe=False, doc=None, requires=(), after=()):
    """Register ``fn(tm)`` as the pass ``name``, so that
    ``optimize(tm, enabled_pass=[name])`` runs it; usable as a decorator
    (``@register_pass("MyFuse")``). User passes run after mgtrace's own
    (unless their declarations say otherwise), in the order ``enabled_pass``
    lists them, and only when named (``"all"`` means mgtrace's own).

    Args:
        name: a non-empty str; mgtrace's own names are taken.
        fn: callable taking the TracedModule to edit in place; it should
            return a :class:`PassResult` ``(tm, changed, counts)`` (kept in
            optimize's report). A TracedModule returned instead replaces
            ``tm``; anything else is recorded as "did not say".
        training_safe: True when the pass keeps a training-mode module's
            results (no folding of BatchNorm, Dropout or weights): then
            ``enabled_pass="all"`` also runs it on a module in training mode.
        doc: one line for listings (default: the first line of fn's docstring).
        requires: pass names (or one name) that must run before this one;
            optimize brings them along (with a UserWarning).
        after: pass names (or one name) this one runs after, when they run.

    Returns:
        fn (so it works as a decorator).

    Raises:
        TypeError: name not a str, fn not callable, requires/after not names.
        ValueError: an empty name, or one of mgtrace's own.

    >>> from mgtrace.traced_module import PassResult, register_pass, registered_passes
    >>> @register_pass("DocNoOp", training_safe=True, after="FuseConvBn")
    ... def no_op(tm):
    ...     "Leaves the module as it is."
    ...     return PassResult(tm, False, {})
    >>> info = registered_passes()["DocNoOp"]
    >>> info.doc, info.after
    ('Leaves the module as it is.', ('FuseConvBn',))
    """
    if fn is None:
        return lambda f: register_pass(name, f, training_safe=training_safe, doc=doc,
                                       requires=requires, after=after)
    if not isinstance(name, str) or not name:
        raise (TypeError if not isinstance(name, str) else ValueError)(
            f"a pass name must be a non-empty str, got {name!r}")
    if not callable(fn):
        raise TypeError(f"register_pass: {name!r} must be a callable fn(tm), got {fn!r}")
    requires, after = _names(requires, "requires"), _names(after, "after")
    old = _PASSES.get(name)
    if old is not None and old.builtin:
        raise ValueError(f"{name!r} is one of mgtrace's own passes; choose another name")
    _PASSES[name] = PassInfo(name, fn, bool(training_safe), False, doc or _first_line(fn),
                             requires, after)
    return fn


def _first_line(fn):
    return ((fn.__doc__ or "").strip().splitlines() or [""])[0]


def _counted(fn, what):
    """The pass running ``fn(tm)`` (mgtrace's pass functions return how many
    rewrites they made), its count recorded as ``what``."""
    def run(tm):
        n = fn(tm)
        return PassResult(tm, n > 0, {what: n})
    run.__name__, run.__doc__, run.__wrapped__ = fn.__name__, fn.__doc__, fn
    return run


def _backward_fold_scale(tm):
    """Fold constant scales into the Conv2d or Linear that produces the
    scaled value, then merge the constant chains that exposes (MegEngine
    reruns FuseAddMul after it)."""
    folds = fuse.backward_fold_scale(tm)
    merges = fold.fuse_add_mul(tm)
    return PassResult(tm, folds + merges > 0, {"folds": folds, "merges": merges})


def _builtin(name, fn, training_safe, requires=(), after=()):
    _PASSES[name] = PassInfo(name, fn, training_safe, True, _first_line(fn), requires, after)


# mgtrace's own, declared; the table's order breaks ties, so it reads as they run
_builtin("FoldConstant", _counted(fold.fold_constants, "folded"), True)
_builtin("EliminateIdentity", _counted(fold.eliminate_identity, "dropped"), False,
         after=("FoldConstant",))
# an Identity or Dropout between a conv and its BatchNorm hides the pair
_builtin("FuseConvBn", _counted(fuse.fuse_conv_bn, "folds"), False,
         after=("FoldConstant", "EliminateIdentity"))
_builtin("FuseAddMul", _counted(fold.fuse_add_mul, "merges"), True,
         after=("FoldConstant", "FuseConvBn"))
# MegEngine's rule: the scale folds into convs whose BatchNorm is folded first
_builtin("BackwardFoldScale", _backward_fold_scale, False,
         requires=("FuseConvBn",), after=("FuseAddMul",))
# the fusions read the layers' final weights: BatchNorms and scales folded first
_builtin("FuseConvAct", _counted(fuse.fuse_conv_act, "fusions"), True,
         after=("EliminateIdentity", "FuseConvBn", "BackwardFoldScale"))
# after EliminateIdentity: an inference Dropout sits between BERT's dense and its add
_builtin("FuseLinearAddNorm", _counted(fuse.fuse_linear_add_norm, "fusions"), True,
         after=("EliminateIdentity", "BackwardFoldScale"))
# after FuseLinearAddNorm, which takes the linear layers of the residual tails
_builtin("FuseLinearAct", _counted(fuse.fuse_linear_act, "fusions"), True,
         after=("EliminateIdentity", "BackwardFoldScale", "FuseLinearAddNorm"))
# after the linear fusions, whose act="none" form of BERT's query, key and
# value it stacks; inference only (the stacked weight is a new constant)
_builtin("FuseSiblingLinear", _counted(sibling.fuse_sibling_linear, "fusions"), False,
         after=("EliminateIdentity", "BackwardFoldScale", "FuseLinearAddNorm", "FuseLinearAct"))
_builtin("FuseAttention", _counted(fuse.fuse_attention, "fusions"), True,
         after=("EliminateIdentity", "FuseAddMul"))
# NCHWc converts the fused conv2d_act calls too; the pointwise/depthwise fusion
# works on what it made
_builtin("NCHWc", _counted(layout.convert_to_nchwc, "convs"), False,
         after=("FuseConvBn", "BackwardFoldScale", "FuseConvAct"))
_builtin("FusePointwiseDepthwise", _counted(layout.fuse_pointwise_depthwise, "fusions"), False,
         after=("NCHWc",))
# a quantized graph's own: its layers, stubs and ReLUs are no float pass's
_builtin("FuseQuantStub", _counted(int8.fuse_quant_stub, "fusions"), False,
         after=("EliminateIdentity",))
_builtin("EliminateRequantize", _counted(int8.eliminate_requantize, "dropped"), False,
         after=("FuseQuantStub",))
_builtin("EliminateDeadCode", _counted(fold.eliminate_dead_code, "exprs removed"), True,
         after=tuple(_PASSES))


def get_pass(name):
    """The PassInfo registered as ``name``; KeyError naming the known ones."""
    try:
        return _PASSES[name]
    except (KeyError, TypeError):
        raise KeyError(f"no pass is registered as {name!r}; known passes: "
                       f"{', '.join(_PASSES)} (register yours with register_pass)") from None


def registered_passes():
    """``{name: PassInfo}``: mgtrace's own in the order they run, then users'."""
    return dict(_PASSES)


_NCHWC_PASSES = ("NCHWc", "FusePointwiseDepthwise")


def _nchwc_pays(device=None):
    """Whether ``device`` (the module's; None: the default device) has the
    NCHW16c kernels (``has_kernel``: CUDA has none) and runs them vectorised
    (the CPU's need AVX-512): the NCHWc pass and the fusion after it are in
    ``"all"`` only then."""
    from mgtrace._core import has_kernel, nn
    return all(has_kernel(op, device, "float32") for op in _NCHWC_KERNELS) \
        and nn._wide_conv_kernels()


# the kernels the NCHWc pass and FusePointwiseDepthwise put in a graph
_NCHWC_KERNELS = ("to_nchwc", "from_nchwc", "conv2d_nchwc", "max_pool2d_nchwc",
                  "conv2d_nchwc_pw_dw", "conv2d_nchwc_pw_dw_pw")


def _module_device(tm):
    """The device of a module's first parameter or buffer (None: it has
    none; ops then run on the default device)."""
    for t in type(tm).parameters(tm):
        return t.device
    for t in type(tm).buffers(tm):
        return t.device
    return None


def _schedule(enabled, training, device=None):
    """The passes to run, in order, for the ``enabled_pass`` argument."""
    if enabled is None:
        enabled = list(DEFAULT_PASSES)
    elif enabled == "all":
        enabled = [n for n in _ORDER if (not training or _PASSES[n].training_safe)
                   and (n not in _NCHWC_PASSES or _nchwc_pays(device))]
    elif isinstance(enabled, str):
        enabled = [enabled]
    else:
        try:
            enabled = list(enabled)
        except TypeError:
            raise TypeError(f"optimize: enabled_pass must be None, 'all', a pass name or a "
                            f"list of them, got {type(enabled).__name__}") from None
    for n in enabled:
        if not isinstance(n, str):
            raise TypeError(f"enabled_pass holds pass names (str), got {n!r}")
        get_pass(n)
    return _topological(_with_requirements(enabled))


def _with_requirements(enabled):
    """``enabled`` (names), each once, with the passes they require added."""
    out = list(dict.fromkeys(enabled))
    for name in out:                    # grows while it is read: requirements of requirements
        for req in _PASSES[name].requires:
            if req not in _PASSES:
                raise PassOrderError(f"the pass {name!r} requires {req!r}, which is not "
                                     f"registered (register it with register_pass)."
                                     + did_you_mean(req, _PASSES))
            if req not in out:
                warnings.warn(f"{name} needs {req} to run first; enabling {req}",
                              UserWarning, stacklevel=4)
                out.append(req)
    return out


def _topological(names):
    """``names`` ordered so that each runs after what it requires or is
    declared to run after (among ``names``); ties go to the registration
    order, users' passes in the order of ``names``."""
    rank = {n: i for i, n in enumerate(_BUILTIN_ORDER)}
    for n in names:
        rank.setdefault(n, len(rank))
    before = {}
    for n in names:
        info = _PASSES[n]
        for a in info.after:
            if a not in _PASSES:
                raise PassOrderError(f"the pass {n!r} is declared to run after {a!r}, which is "
                                     "not registered." + did_you_mean(a, _PASSES))
        before[n] = {a for a in info.requires + info.after if a in names and a != n}
    waiting = {n: len(b) for n, b in before.items()}
    followers = collections.defaultdict(list)
    for n, b in before.items():
        for a in b:
            followers[a].append(n)
    ready = [(rank[n], n) for n, k in waiting.items() if k == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        _, n = heapq.heappop(ready)
        order.append(n)
        for f in followers[n]:
            waiting[f] -= 1
            if waiting[f] == 0:
                heapq.heappush(ready, (rank[f], f))
    if len(order) < len(names):
        cycle = _cycle({n: b for n, b in before.items() if n not in order})
        raise PassOrderError("the passes' requires/after declarations form a cycle: "
                             + " -> ".join(cycle) + " (each must run after the next); "
                             "drop one of these declarations")
    return order


def _cycle(before):
    """One cycle ``[a, b, ..., a]`` of the graph ``{pass: passes it runs after}``,
    every node of which is on or leads to a cycle."""
    path, seen = [], {}
    n = min(before)
    while n not in seen:
        seen[n] = len(path)
        path.append(n)
        n = min(b for b in before[n] if b in before)
    return path[seen[n]:] + [n]


_BUILTIN_ORDER = tuple(_PASSES)
_ORDER = tuple(_topological(_BUILTIN_ORDER))      # checks the table has no cycle, too


def optimize(tm, enabled_pass=None, *, flatten=False, verbose=False, return_report=False):
    """An optimized copy of a TracedModule for inference (MegEngine's
    ``megengine.traced_module.optimize``, with mgtrace's own passes added).

    The passes run in the topological order of their ``requires`` and
    ``after`` declarations (ties in registration order); a pass asked for
    brings the passes it requires along, with a UserWarning.

    Args:
        tm: a TracedModule (from :func:`trace_module` or :func:`mgtrace.load`).
            It is never changed.
        enabled_pass: pass names to run (a list, or one name): MegEngine's
            ``"FuseConvBn"``, ``"FuseAddMul"``, ``"BackwardFoldScale"``;
            mgtrace's ``"FoldConstant"``, ``"EliminateIdentity"``,
            ``"FuseConvAct"``, ``"FuseLinearAct"``, ``"FuseLinearAddNorm"``,
            ``"FuseAttention"``, ``"NCHWc"``, ``"FusePointwiseDepthwise"``,
            ``"FuseQuantStub"``, ``"EliminateRequantize"``, ``"EliminateDeadCode"``;
            or any name given to :func:`register_pass`. ``None`` (the
            default) runs MegEngine's default, ``["FuseConvBn"]``.
            ``"all"`` runs every mgtrace pass that is safe for ``tm``'s mode:
            on a module in training mode (``tm.training``) only those that
            keep training behaviour (BatchNorms, Dropout and weights stay);
            ``"NCHWc"`` and ``"FusePointwiseDepthwise"`` only where the
            module's device (that of its parameters) has their kernels
            (``mgtrace.has_kernel``), vectorised: a CPU with AVX-512.
            Passes run in the registry's fixed order (see
            :mod:`mgtrace.traced_module.passes.manager`), whatever the order
            of the list; ``BackwardFoldScale`` brings ``FuseConvBn`` along.
        flatten: inline every traced submodule first (``tm.flatten()``), so
            that patterns spanning module boundaries are found too (the
            result then has one flat graph; its traced submodules hold
            their modules and tensors, without graphs of their own).
        verbose: print the report (one line per pass: changed or not, time,
            counts such as ``folds=52``) to stdout.
        return_report: return ``(module, report)``, the report an
            :class:`OptimizeReport` ``{pass name: PassRecord(name, changed,
            counts, seconds)}`` in run order (as NumPy's ``return_counts``).

    Returns:
        A new TracedModule computing the same outputs (to float rounding:
        folding reorders multiplications and additions, so an intermediate
        that overflows or cancels in eager's order, ``x * 300 * 300`` in
        float16, may not in the folded one) that traces, edits, flattens,
        saves and loads like any other. It takes the inputs ``tm`` takes
        and returns their dtypes: MegEngine's promotion, as eager (a
        float64 input to float32 weights computes in float64; a fused
        kernel runs its unfused sequence for a dtype it does not take),
        and refuses what ``tm`` refuses (an integer image: TypeError). Fused layers are calls of
        registered functions (``F.conv2d_act``, ``F.linear_act``,
        ``F.attention``, ``F.conv2d_nchwc``, ``F.conv2d_nchwc_pw_dw``,
        ``F.conv2d_nchwc_pw_dw_pw``); folded
        BatchNorms and other submodules no graph reads any more are deleted
        (``state_dict`` drops their tensors). Every graph passes ``lint()``.

    Raises:
        TypeError: tm is not a TracedModule, or enabled_pass holds a non-str.
        KeyError: an unknown pass name.
        PassOrderError: a pass requires one that is not registered, or the
            passes' declarations form a cycle (the message names them).
        PassError: a pass raised; the message and ``pass_name`` name it, its
            exception is ``__cause__``.

    >>> import numpy as np, mgtrace as mt, mgtrace.module as M
    >>> from mgtrace.traced_module import optimize
    >>> net = M.Sequential(M.Conv2d(3, 4, 3, padding=1), M.BatchNorm2d(4), M.ReLU()).eval()
    >>> x = mt.tensor(np.random.rand(1, 3, 8, 8).astype(np.float32))
    >>> tm = mt.trace_module(net, x)
    >>> fast = optimize(tm, "all")
    >>> print(fast.code.splitlines()[-1].strip())
    return conv2d_act
    >>> bool(np.allclose(fast(x).numpy(), tm(x).numpy(), atol=1e-5))
    True
    >>> fast, report = optimize(tm, return_report=True)
    >>> report["FuseConvBn"].counts
    {'folds': 1}
    """
    if not isinstance(tm, TracedModule):
        raise TypeError(f"optimize takes a TracedModule, not {type(tm).__name__}")
    order = _schedule(enabled_pass, tm.training, _module_device(tm))
    new = tm.flatten() if flatten else copy.deepcopy(tm)
    new.watch_node_value = {}      # values recorded by tm's runs are not the new module's
    report = OptimizeReport()
    removed = copy.deepcopy(tm.__dict__.get("_inference_only", {}))
    calls = _training_calls(new)
    for name in order:
        start = time.perf_counter()
        try:
            result = _PASSES[name].fn(new)
        except Exception as e:
            raise PassError(f"optimize: the pass {name!r} raised {type(e).__name__}: {e}",
                            name) from e
        new, changed, counts = _as_result(name, result, new)
        report[name] = PassRecord(name, changed, counts, time.perf_counter() - start)
        before, calls = calls, _training_calls(new)
        for what, n in before.items():
            if n > calls.get(what, 0):
                gone = removed.setdefault(name, {})
                gone[what] = gone.get(what, 0) + n - calls.get(what, 0)
    if order:
        # what the passes made unused: folded BatchNorms, replaced calls
        fold.eliminate_dead_code(new)
    _drop_unreachable_graphs(new, {id(g) for g in graphs_of(new)})
    for g in graphs_of(new):
        g.lint()
    if removed and not new.training:
        for m in new.modules():     # what train() and a training-mode call refuse
            if isinstance(m, TracedModule):
                m.__dict__["_inference_only"] = removed
    if verbose:
        print(report, file=sys.stdout)
    return (new, report) if return_report else new


def _training_calls(tm):
    """``{what: count}`` of the calls in ``tm``'s graphs whose result depends
    on training mode: of modules that are or hold a BatchNorm or Dropout
    (``"BatchNorm2d call"``), and of ``F.batch_norm`` / ``F.dropout``."""
    out = {}
    for g in graphs_of(tm):
        for e in g._exprs:
            what = None
            if isinstance(e, CallMethod) and e.method == "__call__" and e.args \
                    and isinstance(e.args[0], ModuleNode):
                m = e.args[0].owner
                if not isinstance(m, TracedModule) and any(
                        isinstance(x, (_BatchNorm, Dropout)) for x in m.modules()):
                    what = f"{type(m).__name__} call"
            elif is_function(e, F.batch_norm) or is_function(e, F.dropout):
                what = f"F.{'batch_norm' if is_function(e, F.batch_norm) else 'dropout'} call"
            if what is not None:
                out[what] = out.get(what, 0) + 1
    return out


def _as_result(name, result, tm):
    """A pass's return value as a PassResult (see :func:`register_pass`)."""
    if isinstance(result, tuple) and len(result) == 3 and isinstance(result[0], TracedModule):
        new, changed, counts = result
        try:
            counts = dict(counts or {})
        except (TypeError, ValueError):
            raise PassError(f"optimize: the pass {name!r} returned counts {counts!r}; "
                            "give a dict {str: int}", name) from None
        return PassResult(new, None if changed is None else bool(changed), counts)
    if isinstance(result, TracedModule):
        return PassResult(result, None, {})
    return PassResult(tm, None, {})


def _drop_unreachable_graphs(tm, reachable):
    """Traced submodules that no call of ``tm`` runs (those flatten() leaves
    behind, or an edit) keep their modules and tensors but lose their
    graphs, as a submodule the trace never called has none: the passes
    neither visit nor keep those graphs right (a BatchNorm they call may be
    folded and deleted), and the result must save and load."""
    for m in type(tm).modules(tm):
        if m is not tm and isinstance(m, TracedModule) and m._graphs \
                and not any(id(g) in reachable for g in m._graphs):
            m._graphs = []
