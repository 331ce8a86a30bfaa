"""The "builtin" and "container" module codecs.

A builtin module (a leaf of a registered builtin type) is stored as::

    {kind: "builtin", training, type: "mgtrace.module.Conv2d", type_version: 1,
     config: {name: value}, tensors: {state_dict key: tensor index}}

and rebuilt as ``cls(**upgraded config)``, whose parameters and buffers
are then replaced by the archive's tensors (:func:`install_state`): no
pickle, no second copy. With ``load(..., mmap=True)`` a module's tensors are
read-only views of the file (writing to one, e.g. a BatchNorm's running
statistics in training mode, raises ValueError "tensor is read-only ...
copy it with .copy() before writing"); without it they are the one copy the
load read. mgtrace's own types are built without running
``reset_parameters`` (random initial values the archive's replace at once),
which also leaves :mod:`mgtrace.random`'s stream untouched. A Sequential,
ModuleList or ModuleDict (exact types) is stored as::

    {kind: "container", training, type: "mgtrace.module.Sequential",
     children: [[name, module index], ...]}

Constructors run with configs read from the file, so before one runs its
allocation is estimated from the config (:data:`STATE_ELEMENTS`, mgtrace's
own types) and charged to the load's budget (``DecodeContext.reserve_elements``).
"""
import math
import operator
from collections import namedtuple

from mgtrace.errors import ArchiveError
from mgtrace.module import Module, is_builtin
from mgtrace.module.blueprint import Blueprint, plain_value
from mgtrace.serialization import registry
from mgtrace.serialization.codecs import register_module_codec
from mgtrace.serialization.header import V1, V1_1, Field
from mgtrace.serialization.version import fmt

__all__ = ["STATE_ELEMENTS", "BUILTIN_FIELDS", "CONTAINER_FIELDS", "ADDED_KEYS", "AddedKey",
           "config_for", "install_state"]

BUILTIN_FIELDS = (
    Field("type", "str", True, V1, 'stable type name, e.g. "mgtrace.module.Conv2d"'),
    Field("type_version", "uint", True, V1, "the type's version when written"),
    Field("config", "values by name", True, V1, "constructor arguments"),
    Field("tensors", "indices by name", True, V1, "state_dict key -> tensor index"),
)
CONTAINER_FIELDS = (
    Field("type", "str", True, V1, '"mgtrace.module.Sequential", "...ModuleList" or "...ModuleDict"'),
    Field("children", "named indices", True, V1, "[child name, module index] in order"),
)


def _size(v, ndim=1):
    """|v| for an int, |v|**ndim for an int standing for an n-d size, the
    product for a sequence; 1 for anything else (the constructor rejects it)."""
    try:
        return abs(operator.index(v)) ** ndim
    except TypeError:
        pass
    if isinstance(v, (tuple, list)):
        return math.prod(_size(x) for x in v)
    return 1


def _conv(ndim):
    def elements(c):
        i, o = _size(c.get("in_channels")), _size(c.get("out_channels"))
        g = max(1, _size(c.get("groups")))
        return max(o * (i // g), i * (o // g)) * _size(c.get("kernel_size"), ndim) + o
    return elements


# Elements the constructors of mgtrace's builtin types allocate, from their config
# (an upper bound; types not listed allocate nothing, or are the registrant's concern).
STATE_ELEMENTS = {
    "mgtrace.module.Linear": lambda c: (_size(c.get("in_features")) + 1) * _size(c.get("out_features")),
    "mgtrace.module.Conv1d": _conv(1),
    "mgtrace.module.Conv2d": _conv(2),
    "mgtrace.module.ConvTranspose2d": _conv(2),
    "mgtrace.module.Embedding": lambda c: _size(c.get("num_embeddings")) * _size(c.get("embedding_dim")),
    "mgtrace.module.BatchNorm1d": lambda c: 4 * _size(c.get("num_features")) + 1,
    "mgtrace.module.BatchNorm2d": lambda c: 4 * _size(c.get("num_features")) + 1,
    "mgtrace.module.LayerNorm": lambda c: 2 * _size(c.get("normalized_shape")),
    "mgtrace.module.GroupNorm": lambda c: 2 * _size(c.get("num_channels")),
    "mgtrace.module.ConvRelu2d": _conv(2),
    "mgtrace.module.ConvBn2d": lambda c: _conv(2)(c) + 4 * _size(c.get("out_channels")) + 1,
    "mgtrace.module.ConvBnRelu2d": lambda c: _conv(2)(c) + 4 * _size(c.get("out_channels")) + 1,
    # format 1.2 (issue 36: MegEngine's further modules)
    "mgtrace.module.Conv3d": _conv(3),
    "mgtrace.module.ConvTranspose3d": _conv(3),
    "mgtrace.module.PReLU": lambda c: _size(c.get("num_parameters")),
    "mgtrace.module.InstanceNorm": lambda c: 2 * _size(c.get("num_channels")),
    "mgtrace.module.GeneralNorm": lambda c: 2 * _size(c.get("normalized_shape")),
    "mgtrace.module.SyncBatchNorm": lambda c: 4 * _size(c.get("num_features")) + 1,
    "mgtrace.module.LocalConv2d": lambda c: _local_conv(c),
    "mgtrace.module.DeformableConv2d": _conv(2),
    "mgtrace.module.RegionRestrictedConv": _conv(2),
    "mgtrace.module.RNNCell": lambda c: _recurrent(c, 1),
    "mgtrace.module.LSTMCell": lambda c: _recurrent(c, 4),
    "mgtrace.module.RNN": lambda c: _recurrent(c, 1),
    "mgtrace.module.LSTM": lambda c: _recurrent(c, 4),
    # format 1.2 (issue 32: quantization's fused modules, and the QAT ones)
    "mgtrace.module.LinearBn1d": lambda c: _linear_bn(c),
    "mgtrace.module.LinearBnRelu1d": lambda c: _linear_bn(c),
    "mgtrace.module.BatchMatMulActivation": lambda c: _size(c.get("batch")) * (
        _size(c.get("in_features")) + 1) * _size(c.get("out_features")),
    "mgtrace.module.MultiHeadAttention": lambda c: (
        (2 * _size(c.get("embed_dim")) + _size(c.get("kdim")) + _size(c.get("vdim")) + 6)
        * _size(c.get("embed_dim"))),
}


def _linear_bn(c):
    return (_size(c.get("in_features")) + 5) * _size(c.get("out_features")) + 1


# a QAT module allocates what its float module does (its observers' few
# scalars, or a [channels] pair, aside)
for _name in ("Linear", "Conv2d", "ConvRelu2d", "ConvBn2d", "ConvBnRelu2d", "LinearBn1d",
              "BatchMatMulActivation"):
    STATE_ELEMENTS[f"mgtrace.module.qat.{_name}"] = STATE_ELEMENTS[f"mgtrace.module.{_name}"]
STATE_ELEMENTS["mgtrace.module.qat.LinearRelu"] = STATE_ELEMENTS["mgtrace.module.Linear"]
# the int8 modules: an int8 weight, a float32 bias and scales (counted as elements)
for _name in ("Linear", "LinearRelu"):
    STATE_ELEMENTS[f"mgtrace.module.quantized.{_name}"] = \
        lambda c: (_size(c.get("in_features")) + 2) * _size(c.get("out_features"))
for _name in ("Conv2d", "ConvRelu2d", "ConvBn2d", "ConvBnRelu2d"):
    STATE_ELEMENTS[f"mgtrace.module.quantized.{_name}"] = lambda c: _conv(2)(c) + _size(
        c.get("out_channels"))
STATE_ELEMENTS["mgtrace.module.qat.LinearBnRelu1d"] = STATE_ELEMENTS["mgtrace.module.LinearBn1d"]
# transposed convolutions (and their fused forms), Linear-BN and batched matmul
for _name in ("ConvTransposeRelu2d", "ConvTransposeBn2d", "ConvTransposeBnRelu2d"):
    STATE_ELEMENTS[f"mgtrace.module.{_name}"] = STATE_ELEMENTS["mgtrace.module.ConvBn2d"]
for _name in ("ConvTranspose2d", "ConvTransposeRelu2d", "ConvTransposeBn2d",
              "ConvTransposeBnRelu2d"):
    STATE_ELEMENTS[f"mgtrace.module.qat.{_name}"] = STATE_ELEMENTS["mgtrace.module.ConvBn2d"]
    STATE_ELEMENTS[f"mgtrace.module.quantized.{_name}"] = lambda c: _conv(2)(c) + _size(
        c.get("out_channels"))
for _name in ("LinearBn1d", "LinearBnRelu1d"):
    STATE_ELEMENTS[f"mgtrace.module.quantized.{_name}"] = \
        STATE_ELEMENTS["mgtrace.module.quantized.Linear"]
STATE_ELEMENTS["mgtrace.module.quantized.BatchMatMulActivation"] = \
    STATE_ELEMENTS["mgtrace.module.BatchMatMulActivation"]
del _name


def _recurrent(c, gates):
    """RNN/LSTM (and their cells): per layer and direction, [G*H, I + H] and
    [G*H, H] weights, two [G*H] biases and a [P, H] projection, with I at
    most max(input_size, 2 * hidden_size)."""
    h, i = _size(c.get("hidden_size")), _size(c.get("input_size"))
    per = gates * h * (max(i, 2 * h) + h + 2) + _size(c.get("proj_size", 0)) * h
    return per * max(1, _size(c.get("num_layers", 1))) * 2


def _local_conv(c):
    """LocalConv2d: C_in * C_out * KH * KW weights per output position, at
    most (H + 2 ph) * (W + 2 pw) positions."""
    pad = c.get("padding")
    ph, pw = (pad if isinstance(pad, (tuple, list)) and len(pad) == 2 else (pad, pad))
    return (_size(c.get("in_channels")) * _size(c.get("out_channels"))
            * _size(c.get("kernel_size"), 2) * (_size(c.get("input_height")) + 2 * _size(ph))
            * (_size(c.get("input_width")) + 2 * _size(pw)))


# ------------------------------------------------------------------ config keys by format

AddedKey = namedtuple("AddedKey", "default written_from read_from")
AddedKey.__doc__ = """A config key a builtin type's ``config()`` gained at the same type
version: its ``default`` (what the constructor assumes without it), the
format whose writers always write it (``written_from``) and the oldest
format all of whose listed releases read it (``read_from``)."""

# Config keys mgtrace's builtin types gained after a format's golden archives
# were written, at the same type version. Conv1d/Conv2d/ConvTranspose2d's
# padding_mode and MaxPool2d's return_indices came in after schema/golden/1.0
# was written (by a commit before release 0.1.0) and before 0.1.0 was tagged:
# 0.1.0's constructors take them and its config() writes them, so every
# release reads them, but format 1.0's golden archives lack them, and format
# 1.1's (release 0.2.0) always hold them. Both are Conv2d version 1 (a type
# version is frozen with each released format), so the key set is a matter
# of the format: a writer for a format before ``written_from`` leaves the key
# out where it holds its default, writes it where it does not and every
# release of that format reads it, and refuses it below ``read_from``; the
# reader fills a missing key with its default. This table records history:
# a key added from now on is a type-version bump with an upgrader
# (upgraders.py), and tests/release/test_builtin_configs.py fails when a
# released type's constructor changes without one.
ADDED_KEYS = {
    "mgtrace.module.Conv1d": {"padding_mode": AddedKey("zeros", V1_1, V1)},
    "mgtrace.module.Conv2d": {"padding_mode": AddedKey("zeros", V1_1, V1)},
    "mgtrace.module.ConvTranspose2d": {"padding_mode": AddedKey("zeros", V1_1, V1)},
    "mgtrace.module.MaxPool2d": {"return_indices": AddedKey(False, V1_1, V1)},
}


def _is_default(value, default):
    return type(value) is type(default) and value == default


def config_for(name, config, target, path=""):
    """``config`` (what ``config()`` of builtin type ``name`` returns) as a
    writer for format ``target`` stores it: each key of :data:`ADDED_KEYS`
    that the format's writers did not write yet is left out where it holds
    its default (order kept otherwise).

    Raises:
        ValueError: a non-default value the target's readers cannot read
            (the message names the module by its ``path`` and type, the
            key, the value and both format versions).
    """
    added = ADDED_KEYS.get(name)
    if not added:
        return config
    out = {}
    for key, value in config.items():
        a = added.get(key)
        if a is not None and tuple(target) < a.written_from:
            if _is_default(value, a.default):
                continue
            if tuple(target) < a.read_from:
                module = f"module {path!r} ({name})" if path else name
                raise ValueError(
                    f"cannot save {module} for format {fmt(target)}: its config key {key!r} "
                    f"is {value!r}, which format {fmt(target)}'s readers cannot read (they know "
                    f"the type without it, as {key}={a.default!r}); it needs format "
                    f"{fmt(a.read_from)}: raise target_version")
        out[key] = value
    return out


def _fill_added(name, config):
    """A stored ``config`` with the :data:`ADDED_KEYS` an older writer left
    out given their defaults (the key order of ``config()`` is not kept:
    the constructor takes keywords)."""
    for key, a in ADDED_KEYS.get(name, {}).items():
        config.setdefault(key, a.default)
    return config


# ------------------------------------------------------------------ builtin

def _encode_builtin(m, ctx):
    config = m.config()
    bad = [k for k in config if not isinstance(k, str)]
    if bad:
        raise TypeError(f"{type(m).__qualname__}.config() has non-string keys {bad!r}")
    ctx.builtin_type(m.builtin_name, m.builtin_version)
    ctx.build_elements += STATE_ELEMENTS.get(m.builtin_name, lambda c: 0)(config)  # as load counts
    config = config_for(m.builtin_name, config, ctx.target_version, ".".join(ctx._stack[1:]))
    return {"type": m.builtin_name, "type_version": m.builtin_version,
            "config": {k: ctx.value(v, where=f"config()[{k!r}]") for k, v in config.items()},
            "tensors": {k: ctx.tensor(t) for k, t in type(m).state_dict(m, keep_vars=True).items()}}


def _resolve(ctx, name, version):
    """registry.resolve_module_type, once per type and version in a load."""
    key = (name, version)
    found = ctx.module_types.get(key)
    if found is None:
        found = ctx.module_types[key] = registry.resolve_module_type(name, version)
    return found


def _check_builtin(entry, ctx, where):
    cls, _ = _resolve(ctx, entry["type"], entry["type_version"])
    if not is_builtin(cls):
        raise ArchiveError(f"{where}.type: {entry['type']!r} is not a builtin module type")
    for key, i in entry["tensors"].items():
        ctx.check_index(i, len(ctx.header["tensors"]), f"{where}.tensors[{key!r}]")


def _no_reset():
    pass


def _construct(cls, name, config):
    """``cls(**config)``; for mgtrace's own types without ``reset_parameters``
    (it only fills values, which the archive's replace)."""
    if not name.startswith("mgtrace.module.") or not hasattr(cls, "reset_parameters"):
        return cls(**config)
    m = cls.__new__(cls)
    m.__dict__["reset_parameters"] = _no_reset      # shadows the method while __init__ runs
    try:
        cls.__init__(m, **config)
    finally:
        m.__dict__.pop("reset_parameters", None)
    return m


def _make(cls, name, config, ctx):
    """``(module, own)``: a module of ``cls`` made with ``config``, and
    ``{key: shape}`` of its state when it was built from a blueprint (None
    when constructed). The first module of a type and config in a load is
    constructed; the others with that type and config are built from its
    :class:`~mgtrace.module.blueprint.Blueprint`, no initialiser run
    (mgtrace's own types with plain state only: a user's type may count
    or register its instances in ``__init__``)."""
    if not name.startswith("mgtrace.module.") or not all(map(plain_value, config.values())):
        return _construct(cls, name, config), None
    key = (cls, repr(config))
    bp = ctx.blueprints.get(key, False)
    if bp:
        return bp.build(), bp.state_shapes
    m = _construct(cls, name, config)
    if bp is False and len(ctx.blueprints) < _MAX_BLUEPRINTS:
        ctx.blueprints[key] = Blueprint.of(m)          # (None: not plain; constructed each time)
    return m, None


_MAX_BLUEPRINTS = 4096       # per load: distinct builtin configs remembered


def install_state(m, indices, ctx, where, own=None):
    """Make the archive's tensors (``indices``: state_dict key -> tensor
    index) the tensors of module ``m``: parameters become Parameters sharing
    the tensors' memory (``ctx.parameter``), buffers are the tensors
    themselves. A stored dtype that differs from the module's is kept (e.g.
    halved weights). ``own``: ``{key: shape}`` of ``m``'s state when ``m``
    was built from a blueprint (its tensors not there yet), else read
    from ``m``.

    Raises:
        ArchiveError: keys missing or unexpected, or a shape that differs
            from the module's (every problem listed).
    """
    if own is None:
        own = {k: t.shape for k, t in type(m).state_dict(m, keep_vars=True).items()}
    state = {k: ctx.tensor(i) for k, i in indices.items()}
    problems = [f"{k}: shape mismatch, the module has {own[k]}, the archive "
                f"{state[k].shape}" for k in own if k in state and own[k] != state[k].shape]
    missing = [k for k in own if k not in state]
    unexpected = [k for k in state if k not in own]
    if missing:
        problems.append("missing keys: " + ", ".join(missing))
    if unexpected:
        problems.append("unexpected keys: " + ", ".join(map(repr, unexpected)))
    if problems:
        raise ArchiveError(f"{where}: the stored tensors do not fit {type(m).__name__}: "
                           + "; ".join(problems))
    for key, i in indices.items():
        *path, name = key.split(".")
        owner = m
        for p in path:
            owner = owner._modules[p]
        if name in owner._parameters:
            owner._parameters[name] = ctx.parameter(i)
        else:
            owner._buffers[name] = state[key]


def _decode_builtin(entry, ctx):
    name = entry["type"]
    cls, upgrade = _resolve(ctx, name, entry["type_version"])
    config = {k: ctx.value(v, where=f"config.{k}") for k, v in entry["config"].items()}
    config = upgrade(_fill_added(name, config))
    ctx.reserve_elements(STATE_ELEMENTS.get(name, lambda c: 0)(config), f"{name}(**config)")
    m, own = _make(cls, name, config, ctx)
    if m._modules:                # parts of a builtin (ConvBn2d's conv and bn) share its mode
        type(m).train(m, bool(entry["training"]))
    install_state(m, entry["tensors"], ctx, f"{name}(**config)", own)
    if ctx.device is not None:
        m.to(ctx.device)          # tensors outside the state dict (those there are: kept)
    return m


# ------------------------------------------------------------------ container

def _is_container(m):
    return type(m) in registry.CONTAINERS.values()


def _encode_container(m, ctx):
    own = [n for n, _ in type(m).named_parameters(m, recurse=False)] + \
          [n for n, _ in type(m).named_buffers(m, recurse=False)]
    if own:
        raise TypeError(f"a {type(m).__name__} with tensors of its own ({', '.join(own)}) "
                        "cannot be stored as a container; trace it with mgtrace.trace_module")
    children = list(m._modules.items())    # named_children() would drop repeated children
    empty = [n for n, c in children if c is None]
    if empty:
        raise TypeError(f"a {type(m).__name__} with None children ({', '.join(empty)}) cannot "
                        "be stored")
    return {"type": f"mgtrace.module.{type(m).__name__}",
            "children": [[n, ctx.module(c, n)] for n, c in children]}


def _check_container(entry, ctx, where):
    cls = registry.module_type(entry["type"])
    if not issubclass(cls, Module) or cls not in registry.CONTAINERS.values():
        raise ArchiveError(f"{where}.type: {entry['type']!r} is not a container type "
                           f"({', '.join(registry.CONTAINERS)})")
    for name, i in entry["children"]:
        ctx.check_index(i, len(ctx.header["modules"]), f"{where}.children[{name!r}]")


def _decode_container(entry, ctx):
    m = registry.module_type(entry["type"])()
    for name, i in entry["children"]:
        m.add_module(name, ctx.module(i))
    return m


register_module_codec("builtin", is_builtin, _encode_builtin, _decode_builtin,
                      check=_check_builtin, fields=BUILTIN_FIELDS)
register_module_codec("container", _is_container, _encode_container, _decode_container,
                      check=_check_container, fields=CONTAINER_FIELDS)
