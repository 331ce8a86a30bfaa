"""The pass registry and :func:`optimize`.

A pass is a function ``fn(tm)`` that edits the TracedModule ``tm`` in
place (optimize hands it a copy) through the graph editing API, and returns
anything (the builtin passes return how many rewrites they made). Passes
are registered by name with :func:`register_pass`; ``optimize`` runs them
by name, in one fixed order:

======================  ========================================================
FoldConstant            compute exprs of constants once (ours)
EliminateIdentity       drop Identity and inference-mode Dropout (ours)
FuseConvBn              fold inference-mode BatchNorm2d into the Conv2d before it
FuseAddMul              merge chains of constant additions and multiplications
BackwardFoldScale       fold a constant scale into the Conv2d/Linear before it
                        (then FuseConvBn's and FuseAddMul's work is redone)
FuseConvAct             conv2d + ReLU/ReLU6/SiLU/Hardswish/Sigmoid/GELU in one
                        kernel (ours)
FuseLinearAct           linear + activation in one kernel (ours)
FuseAttention           softmax(q k^T * scale + mask) v in one kernel (ours)
NCHWc                   chains of float32 convs in the NCHW16c layout (ours;
                        ``"all"`` runs it on CPUs with AVX-512, where its
                        kernels are vectorised)
FusePointwiseDepthwise  a pointwise conv2d_nchwc and the depthwise one reading
                        its output in one kernel, and the 1x1 projection after
                        them (ours; in ``"all"`` with NCHWc)
EliminateDeadCode       drop unused exprs and submodules (ours)
user passes             in the order given in ``enabled_pass``
======================  ========================================================

The first three of MegEngine's are its names and meanings
(``megengine.traced_module.optimize``); the others are mgtrace's own.
"""
import collections
import copy
import warnings

from mgtrace.traced_module.passes import fold, fuse, layout

__all__ = ["optimize", "register_pass", "get_pass", "registered_passes", "DEFAULT_PASSES",
           "PassInfo"]

PassInfo = collections.namedtuple("PassInfo", "name fn training_safe builtin doc")
"""A registered pass: ``training_safe`` is whether it keeps a module in
training mode computing the same thing (``"all"`` runs only those then)."""

_PASSES = {}

DEFAULT_PASSES = ("FuseConvBn",)
"""What ``optimize(tm)`` runs without ``enabled_pass`` (MegEngine's default)."""


def register_pass(name, fn=None, *, training_safe=False, doc=None):
    """Register ``fn(tm)`` as the pass ``name``, so that
    ``optimize(tm, enabled_pass=[name])`` runs it; usable as a decorator
    (``@register_pass("MyFuse")``). User passes run after mgtrace's own, in
    the order ``enabled_pass`` lists them, and only when named (``"all"``
    means mgtrace's own).

    Args:
        name: a non-empty str; mgtrace's own names are taken.
        fn: callable taking the TracedModule to edit in place.
        training_safe: True when the pass keeps a training-mode module's
            results (no folding of BatchNorm, Dropout or weights): then
            ``enabled_pass="all"`` also runs it on a module in training mode.
        doc: one line for listings (default: the first line of fn's docstring).

    Returns:
        fn (so it works as a decorator).

    Raises:
        TypeError: name not a str, fn not callable.
        ValueError: an empty name, or one of mgtrace's own.

    >>> from mgtrace.traced_module import register_pass, registered_passes
    >>> @register_pass("DocNoOp", training_safe=True)
    ... def no_op(tm):
    ...     "Leaves the module as it is."
    >>> registered_passes()["DocNoOp"].doc
    'Leaves the module as it is.'
    """
    if fn is None:
        return lambda f: register_pass(name, f, training_safe=training_safe, doc=doc)
    if not isinstance(name, str) or not name:
        raise (TypeError if not isinstance(name, str) else ValueError)(
            f"a pass name must be a non-empty str, got {name!r}")
    if not callable(fn):
        raise TypeError(f"register_pass: {name!r} must be a callable fn(tm), got {fn!r}")
    old = _PASSES.get(name)
    if old is not None and old.builtin:
        raise ValueError(f"{name!r} is one of mgtrace's own passes; choose another name")
    _PASSES[name] = PassInfo(name, fn, bool(training_safe), False, doc or _first_line(fn))
    return fn


def _first_line(fn):
    return ((fn.__doc__ or "").strip().splitlines() or [""])[0]


def _builtin(name, fn, training_safe):
    _PASSES[name] = PassInfo(name, fn, training_safe, True, _first_line(fn))


# mgtrace's own, in the order optimize runs them
_builtin("FoldConstant", fold.fold_constants, True)
_builtin("EliminateIdentity", fold.eliminate_identity, False)
_builtin("FuseConvBn", fuse.fuse_conv_bn, False)
_builtin("FuseAddMul", fold.fuse_add_mul, True)
_builtin("BackwardFoldScale", fuse.backward_fold_scale, False)
_builtin("FuseConvAct", fuse.fuse_conv_act, True)
_builtin("FuseLinearAct", fuse.fuse_linear_act, True)
_builtin("FuseAttention", fuse.fuse_attention, True)
_builtin("NCHWc", layout.convert_to_nchwc, False)
_builtin("FusePointwiseDepthwise", layout.fuse_pointwise_depthwise, False)
_builtin("EliminateDeadCode", fold.eliminate_dead_code, True)
_ORDER = tuple(_PASSES)


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
    for t in tm.parameters():
        return t.device
    for t in tm.buffers():
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
        enabled = list(enabled)
    for n in enabled:
        if not isinstance(n, str):
            raise TypeError(f"enabled_pass holds pass names (str), got {n!r}")
        get_pass(n)
    if "BackwardFoldScale" in enabled and "FuseConvBn" not in enabled:
        # MegEngine's rule: the scale folds into convs whose BatchNorm is folded first
        warnings.warn("BackwardFoldScale needs FuseConvBn to run first; enabling FuseConvBn",
                      UserWarning, stacklevel=3)
        enabled.append("FuseConvBn")
    want = set(enabled)
    order = [n for n in _ORDER if n in want]
    if "BackwardFoldScale" in want:
        # a scale folded into a conv may expose more to merge (MegEngine reruns these)
        order.insert(order.index("BackwardFoldScale") + 1, "FuseAddMul")
    seen = set(order)
    order += [n for n in enabled if n not in seen and not seen.add(n)]
    return order


def optimize(tm, enabled_pass=None, *, flatten=False):
    """An optimized copy of a TracedModule for inference (MegEngine's
    ``megengine.traced_module.optimize``, with mgtrace's own passes added).

    Args:
        tm: a TracedModule (from :func:`trace_module` or :func:`mgtrace.load`).
            It is never changed.
        enabled_pass: pass names to run (a list, or one name): MegEngine's
            ``"FuseConvBn"``, ``"FuseAddMul"``, ``"BackwardFoldScale"``;
            mgtrace's ``"FoldConstant"``, ``"EliminateIdentity"``,
            ``"FuseConvAct"``, ``"FuseLinearAct"``, ``"FuseAttention"``,
            ``"NCHWc"``, ``"FusePointwiseDepthwise"``, ``"EliminateDeadCode"``;
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

    Returns:
        A new TracedModule computing the same outputs (to float rounding:
        folding reorders multiplications) that traces, edits, flattens,
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
    """
    from mgtrace.traced_module.traced_module import TracedModule
    if not isinstance(tm, TracedModule):
        raise TypeError(f"optimize takes a TracedModule, not {type(tm).__name__}")
    order = _schedule(enabled_pass, tm.training, _module_device(tm))
    new = tm.flatten() if flatten else copy.deepcopy(tm)
    new.watch_node_value = {}      # values recorded by tm's runs are not the new module's
    for name in order:
        result = _PASSES[name].fn(new)
        if isinstance(result, TracedModule):
            new = result
    if order:
        # what the passes made unused: folded BatchNorms, replaced calls
        fold.eliminate_dead_code(new)
    from mgtrace.traced_module.passes.util import graphs_of
    _drop_unreachable_graphs(new, {id(g) for g in graphs_of(new)})
    for g in graphs_of(new):
        g.lint()
    return new


def _drop_unreachable_graphs(tm, reachable):
    """Traced submodules that no call of ``tm`` runs (those flatten() leaves
    behind, or an edit) keep their modules and tensors but lose their
    graphs, as a submodule the trace never called has none: the passes
    neither visit nor keep those graphs right (a BatchNorm they call may be
    folded and deleted), and the result must save and load."""
    from mgtrace.traced_module.traced_module import TracedModule
    for m in tm.modules():
        if m is not tm and isinstance(m, TracedModule) and m._graphs \
                and not any(id(g) in reachable for g in m._graphs):
            m._graphs = []
