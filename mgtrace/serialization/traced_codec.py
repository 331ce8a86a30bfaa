"""The "traced" module codec: TracedModules and their graphs in an archive.

A TracedModule is stored as::

    {kind: "traced", training, name: "Net", qualname: "Net.layer1", is_top,
     reads_as?: "sequence" | "dict",                    # TracedSequence / TracedDict
     signature: [{name, kind, default?}, ...],          # forward's parameters
     children: [[name, module index], ...], parameters: {name: tensor index},
     buffers: {name: tensor index}, non_persistent: [name, ...],
     attrs: {name: value},                              # plain attributes an archive can hold
     graphs: [graph, ...]}

    graph: {name, qualname, inputs: [node id], outputs: [node id],
            in_def: treedef, out_def: treedef, nodes: [node], exprs: [expr],
            ids?: {nodes: [int], exprs: [int]}}     # 1.1: the graph's own ids, after edits
    node:  {id, name, kind: "tensor" | "module" | "value", shape?, dtype?, value?}
    expr:  {kind, outputs: [node id], out_def?: treedef, ...} with, by kind,
           input: {name}; getattr: {module: node id, name: "a.b.c"};
           call_method: {self: node id, method, args: {param: value}} for a module
             call, {self, method, args: [value], kwargs: {name: value}} for a tensor method;
           call_function: {op: op index, args: {param: value}};
           constant: {value}; apply: {op: core op name, args: [value], params: {name: value}}
    treedef: {type: "tuple"|"list"|"dict"|"odict"|"slice"|"root"|"namedtuple",
              aux: value, children: [treedef | {slot: true} | {const: value}]}
             a namedtuple's aux is (module, qualname, fields); a dict's, its keys
             (str, int, float, bool, None, bytes, or tuples of those)

Function and module-call arguments are stored by parameter name, so an
upgrader can rebind them.

Loading never resolves a name outside the registry, and checks every
reference before the module is built, so a hostile archive fails with
ArchiveError before anything runs:

* functions come from the op table (registry), tensor methods from
  :data:`TENSOR_METHODS` (called on tensor nodes only), core ops from the
  core's op table;
* attribute paths go through submodules only, ending at a submodule, a
  parameter, a buffer or a plain tensor attribute; no name of a child,
  parameter, buffer or attribute may shadow a member of the module's class
  (``forward``, ``__class__``...) or its bookkeeping (``_modules``...);
* nodes are defined once, before use, with valid kinds, shapes and dtypes,
  and distinct names in NFKC form (node names become Python identifiers,
  which Python reads normalized, so they are normalized on load); keywords
  are identifiers; namedtuple names and fields are identifiers;
* code is generated for a graph on its first call (and kept), from what
  these checks passed: a load that only reads weights, or inspects the
  graph, pays nothing for it;
* a lazy load (``mmap=True, verify=False``: trusted bytes) builds modules
  and maps weights, and reads the graphs, with their part of these checks,
  on first use (:class:`LazyGraphs`): still before any of their code runs.

A namedtuple in a graph's arguments or results cannot be imported by name,
so loading makes a look-alike class (same name and fields, ``__module__``
and ``__qualname__`` as stored). A loaded module accepts any namedtuple with
that name and those fields where the traced one took the original class, and
returns look-alikes.
"""
import collections
import inspect
import keyword
import threading
import warnings
import weakref

import numpy as np

from mgtrace._core import Tensor, op_table
from mgtrace.errors import ArchiveError
from mgtrace.module.blueprint import plain_value
from mgtrace.module.module import Module
from mgtrace.serialization import values
from mgtrace.serialization.codecs import register_module_codec
from mgtrace.serialization.header import V1, Field
from mgtrace.serialization import limits
from mgtrace.serialization.limits import MAX_NDIM
from mgtrace.serialization.tensors import DTYPES_BY_NAME, require_dtype
from mgtrace.traced_module import tracer as _tracer
from mgtrace.traced_module.expr import (Apply, CallFunction, CallMethod, Constant, GetAttr, Input,
                                        user_frame)
from mgtrace.traced_module.graph import IdSource, InternalGraph, reset_ids
from mgtrace.traced_module.node import ModuleNode, Node, TensorNode, ValueNode
from mgtrace.traced_module.pytree import SLOT, LeafDef, TreeDef, _Root
from mgtrace.traced_module.traced_module import (PENDING_GRAPHS, TracedDict, TracedModule,
                                                 TracedSequence, read_pending_graphs)

__all__ = ["TRACED_FIELDS", "TENSOR_METHODS"]

TRACED_FIELDS = (
    Field("name", "str", True, V1, "class name of the traced module"),
    Field("qualname", "str", True, V1, 'path from the root, e.g. "Net.layer1.0"'),
    Field("is_top", "bool", True, V1, "the root of the traced tree"),
    Field("reads_as", "str", False, V1, '"sequence" (a traced Sequential/ModuleList) or "dict" '
                                        "(a traced ModuleDict): it also reads like one"),
    Field("signature", "value", True, V1, "forward's parameters [{name, kind, default?}]"),
    Field("children", "named indices", True, V1, "[submodule name, module index] in order"),
    Field("parameters", "indices by name", True, V1, "parameter name -> tensor index"),
    Field("buffers", "indices by name", True, V1, "buffer name -> tensor index"),
    Field("non_persistent", "value", True, V1, "names of buffers left out of state_dict"),
    Field("attrs", "values by name", True, V1, "plain attributes (ints, strings, tensors...)"),
    Field("graphs", "value", True, V1, "the graphs, one per call signature (see traced_codec.py)"),
)


# Tensor methods a stored graph may call (the op table's; schema/ops.json)
TENSOR_METHODS = op_table.tensor_methods()
EXPR_KINDS = ("input", "getattr", "call_method", "call_function", "constant", "apply")
# core ops whose Apply exprs only readers of this format run, and why: release
# 0.2.0's apply() (format 1.1) gave gather's and scatter's kernels, which take
# axis second, the op table's order (x, index[, src], axis=...) and failed;
# conv3d, conv_transpose3d, lstm_cell and rnn_cell are core ops since 1.2
_AXIS_SECOND = "readers before it pass its index where its kernel takes axis"
_NEW_OP = "readers before it have no such core op"
APPLY_SINCE = {"gather": ((1, 2), _AXIS_SECOND), "scatter": ((1, 2), _AXIS_SECOND),
               **{op: ((1, 2), _NEW_OP) for op in ("conv3d", "conv_transpose3d", "lstm_cell", "rnn_cell")}}
_PARAM_KINDS = {k.name: k for k in (inspect.Parameter.POSITIONAL_ONLY,
                                    inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                    inspect.Parameter.VAR_POSITIONAL,
                                    inspect.Parameter.KEYWORD_ONLY,
                                    inspect.Parameter.VAR_KEYWORD)}
_TREE_TYPES = {tuple: "tuple", list: "list", dict: "dict", collections.OrderedDict: "odict",
               slice: "slice", _Root: "root"}
_TREE_BY_NAME = {v: k for k, v in _TREE_TYPES.items()}
_READS_AS = {"sequence": TracedSequence, "dict": TracedDict}
# a TracedModule's own bookkeeping (training, watch points...): never stored as attrs
# (and the cache of the call fast path, made on the first call: TracedModule._plain_table)
_BOOKKEEPING = frozenset(TracedModule._shell(Module(), "Module").__dict__) | {"_plain",
                                                                            PENDING_GRAPHS}
_KEY_TYPES = (str, int, float, bool, type(None), bytes)


# ---------------------------------------------------------------- encode
def _encode(tm, ctx):
    cls = type(tm)
    read_pending_graphs(tm)     # a lazy load's: read now (and its bookkeeping entry gone)
    d = tm.__dict__
    for table in ("_modules", "_parameters", "_buffers"):
        for k in d[table]:
            if k.startswith("__"):
                raise TypeError(f"cannot save {tm._qualname}: its {table[1:-1]} is named {k!r}; "
                                "rename the attribute (dunder names are refused) and trace again")
    attrs = {}
    for k, v in d.items():
        if k in _BOOKKEEPING or k.startswith("__") or isinstance(v, Module) \
                or _shadows_method(cls, k):
            continue          # bookkeeping, or an attribute that would hide a method on load
        try:
            attrs[k] = ctx.value(v, where=f"attribute {k!r}")
        except TypeError as e:      # a function, an open file...: saved without it, said so
            what = e.what if isinstance(e, values.UnstorableError) else str(e)
            name = tm._qualname if tm._qualname == tm._orig_name else \
                f"{tm._qualname} ({tm._orig_name})"
            _, level = user_frame()
            warnings.warn(f"{name}: attribute {k!r} is not saved: {what}. The loaded module will "
                          "not have it: delete the attribute before saving, or keep it as a "
                          "value an archive can store", UserWarning, stacklevel=level)
    _check_getattr_targets(tm)
    out = {"name": tm._orig_name, "qualname": tm._qualname, "is_top": bool(tm._is_top)}
    for reads_as, shell in _READS_AS.items():
        if isinstance(tm, shell):
            out["reads_as"] = reads_as
    out.update({
        "signature": ctx.value(_encode_signature(tm._signature)),
        "children": [[k, ctx.module(m, k)] for k, m in tm._modules.items() if m is not None],
        "parameters": {k: ctx.tensor(t) for k, t in tm._parameters.items() if t is not None},
        "buffers": {k: ctx.tensor(t) for k, t in tm._buffers.items() if t is not None},
        "non_persistent": ctx.value(sorted(tm._non_persistent_buffers)),
        "attrs": attrs,
        "graphs": [_encode_graph(g, ctx) for g in tm._graphs],
    })
    check_limits(out, f"cannot save {tm._qualname}", ValueError)
    return out


def _check_getattr_targets(tm):
    """Every ``self.a.b`` a graph reads must be stored: a submodule,
    parameter or buffer, or a plain attribute the archive keeps. Raises
    TypeError naming the path otherwise (e.g. a submodule deleted after
    tracing), so that save never writes what load would refuse."""
    for g in tm._graphs:
        for e in g._exprs:
            if isinstance(e, GetAttr) and e.args[0] is g._inputs[0] and not _reachable(tm, e.name):
                if e.name in tm.__dict__ and _shadows_method(type(tm), e.name):
                    raise TypeError(f"cannot save {tm._qualname}: its attribute {e.name!r} hides "
                                    f"the method {type(tm).__name__}.{e.name}; rename it (or "
                                    "make it a buffer with register_buffer) and trace again")
                raise TypeError(f"cannot save {tm._qualname}: its graph reads self.{e.name}, which is "
                                "not a submodule, parameter, buffer or storable attribute (deleted "
                                "after tracing?); put it back or edit the graph first")


def _reachable(tm, path):
    """Whether the loader will find ``tm.<path>``: the load-side walk
    (:func:`_safe_getattr_path`) succeeds, and a plain attribute at the end
    is one the archive stores (it hides no method of its owner's class)."""
    try:
        _safe_getattr_path(tm, path, path)
    except ArchiveError:
        return False
    *head, last = path.split(".")
    owner = _safe_getattr_path(tm, ".".join(head), path) if head else tm
    d = owner.__dict__
    return any(last in d.get(t, {}) for t in ("_modules", "_parameters", "_buffers")) \
        or not _shadows_method(type(owner), last)


def _shadows_method(cls, name):
    """True when ``name`` is a method (or other non-data attribute) of
    ``cls``, which an instance attribute of that name would hide. Properties
    are data descriptors: an attribute stored beside one hides nothing."""
    attr = inspect.getattr_static(cls, name, None)
    return attr is not None and not hasattr(type(attr), "__set__")


def _encode_signature(sig):
    if sig is None:
        return None
    out = []
    for p in sig.parameters.values():
        e = {"name": p.name, "kind": p.kind.name}
        if p.default is not inspect.Parameter.empty:
            e["default"] = p.default
        out.append(e)
    return out


def _encode_graph(g, ctx):
    g.lint()                              # never write a broken graph
    ids, names = {}, set()
    nodes = []
    for n in list(g._inputs) + [o for e in g._exprs if not isinstance(e, Input) for o in e.outputs]:
        if id(n) in ids:
            continue
        ids[id(n)] = len(nodes)
        names.add(limits.node_name(n.name, names, f"cannot save {g._qualname}: node {_short(n.name)}",
                                   ValueError))
        nodes.append(_encode_node(n, ids[id(n)], ctx))
    node_id = lambda v: ids[id(v)] if isinstance(v, Node) else None   # noqa: E731
    out = {"name": g._name, "qualname": g._qualname,
           "inputs": [ids[id(n)] for n in g._inputs], "outputs": [ids[id(n)] for n in g._outputs],
           "in_def": _encode_tree(g._in_def, ctx), "out_def": _encode_tree(g._out_def, ctx),
           "nodes": nodes, "exprs": [_encode_expr(e, ctx, ids, node_id) for e in g._exprs]}
    # the graph's own node and expr ids, when a load could not renumber them the same
    # way (the graphs were edited): format 1.1, optional (a 1.0 reader renumbers)
    if g._ids is not None and g._ids.dirty and ctx.allows((1, 1)):
        order = list(g._inputs) + [o for e in g._exprs if not isinstance(e, Input)
                                   for o in e.outputs]
        seen, node_ids = set(), []
        for n in order:
            if id(n) not in seen:
                seen.add(id(n))
                node_ids.append(int(n._id))
        out["ids"] = {"nodes": node_ids, "exprs": [int(e._id) for e in g._exprs]}
    return out


def _encode_node(n, i, ctx):
    e = {"id": i, "name": n.name, "kind": n.kind}
    if isinstance(n, TensorNode):
        if n.shape is not None:
            e["shape"] = [int(s) for s in n.shape]
        if n.dtype is not None:
            e["dtype"] = np.dtype(n.dtype).name
            require_dtype(ctx, e["dtype"], f"graph node {n.name!r}")
    elif isinstance(n, ValueNode) and n.value is not None:
        e["value"] = int(n.value)
    return e


def _encode_expr(e, ctx, ids, node_id):
    out = {"kind": e.kind, "outputs": [ids[id(o)] for o in e.outputs]}
    if e.out_def is not None:
        out["out_def"] = _encode_tree(e.out_def, ctx)
    val = lambda v: ctx.value(v, node_id=node_id)       # noqa: E731
    if isinstance(e, Input):
        out["name"] = e.name
    elif isinstance(e, GetAttr):
        out.update(module=ids[id(e.args[0])], name=e.name)
    elif isinstance(e, CallMethod) and e.method == "__call__":
        owner = e.args[0].owner
        by_name = _args_by_name(_call_signature(owner), e.args[1:], e.kwargs, type(owner).__name__)
        out.update(self=ids[id(e.args[0])], method="__call__",
                   args={k: val(v) for k, v in by_name.items()})
        if e.arg_def is not None:
            out["arg_def"] = _encode_tree(e.arg_def, ctx)
    elif isinstance(e, CallMethod):
        out.update(self=ids[id(e.args[0])], method=e.method, args=val(list(e.args[1:])),
                   kwargs={k: val(v) for k, v in e.kwargs.items()})
    elif isinstance(e, CallFunction):
        by_name = _args_by_name(inspect.signature(e.func), e.args, e.kwargs,
                                getattr(e.func, "__name__", "function"))
        out.update(op=ctx.op(e.func), args={k: val(v) for k, v in by_name.items()})
    elif isinstance(e, Constant):
        out["value"] = ctx.value(e.value)
    elif isinstance(e, Apply):
        if e.op in APPLY_SINCE:
            since, why = APPLY_SINCE[e.op]
            ctx.require(since, f"an Apply expr of core op {e.op!r} ({why})")
        out.update(op=e.op, args=val(list(e.args)), params={k: val(v) for k, v in e.kwargs.items()})
    else:
        raise TypeError(f"cannot store expr {e!r}")
    return out


def _call_signature(owner):
    """forward's signature (cached per class by the tracer's signature_of)."""
    return _tracer.signature_of(owner)


def _args_by_name(sig, args, kwargs, what):
    try:
        return dict(sig.bind(*args, **kwargs).arguments)
    except TypeError as err:
        raise TypeError(f"cannot store a call of {what}: {err}") from None


def _encode_tree(t, ctx):
    if t is None:
        return None
    name = _TREE_TYPES.get(t.type)
    aux = t.aux
    if name is None:
        if not hasattr(t.type, "_fields"):
            raise TypeError(f"an archive cannot store the container type {t.type.__name__} "
                            "(only tuple, list, dict, OrderedDict, slice and namedtuples)")
        name = "namedtuple"
        aux = (t.type.__module__, t.type.__qualname__, tuple(t.type._fields))
        limits.check_namedtuple(*aux, f"cannot save: a {t.type.__qualname__} argument or result",
                                ValueError)
    elif t.type in (dict, collections.OrderedDict) and not all(map(_plain_key, aux)):
        bad = next(k for k in aux if not _plain_key(k))
        raise TypeError(f"an archive cannot store a dict argument or result keyed by a "
                        f"{type(bad).__name__} ({bad!r}); use str, int, float, bool, None, "
                        "bytes or tuples of those as keys")
    elif t.type in (dict, collections.OrderedDict):
        values.check_hashes(aux, "cannot save: a dict argument or result", ValueError)
    return {"type": name, "aux": ctx.value(aux),
            "children": [_encode_tree(c, ctx) if isinstance(c, TreeDef)
                         else ({"slot": True} if c.is_slot else {"const": ctx.value(c.const)})
                         for c in t.children]}


def _plain_key(k):
    return type(k) in _KEY_TYPES or (type(k) is tuple and all(map(_plain_key, k)))


# ---------------------------------------------------------------- decode
def _fail(where, msg):
    raise ArchiveError(f"{where}: {msg}")


def _check(entry, ctx, where):
    """Resolve every name the entry's graphs use (before anything is built)."""
    graphs = entry["graphs"]
    if not isinstance(graphs, list):
        _fail(f"{where}.graphs", "not a list")
    if entry.get("reads_as", "sequence") not in _READS_AS:
        _fail(f"{where}.reads_as", f"{entry['reads_as'][:40]!r} is not one of {list(_READS_AS)}")
    if ctx.lazy_graphs is not None:     # a lazy load checks the graphs when it reads them
        check_limits(entry, where, ArchiveError, graphs=False)
        return
    _check_graphs(entry, ctx, where)


def _check_graphs(entry, ctx, where):
    """:func:`_check`'s part for the graphs: maps, limits, expr kinds,
    ops and methods."""
    graphs = entry["graphs"]
    for gi, g in enumerate(graphs):
        if not isinstance(g, dict) or not isinstance(g.get("exprs"), list):
            _fail(f"{where}.graphs[{gi}]", "a graph is a map with a list of exprs")
        for ei, e in enumerate(g["exprs"]):
            if not isinstance(e, dict):
                _fail(f"{where}.graphs[{gi}].exprs[{ei}]", "not a map")
    check_limits(entry, where, ArchiveError)
    for gi, g in enumerate(graphs):
        gw = f"{where}.graphs[{gi}]"
        for ei, e in enumerate(g["exprs"]):
            ew = f"{gw}.exprs[{ei}]"
            kind = e.get("kind")
            if kind not in EXPR_KINDS:
                _fail(ew, f"unknown expr kind {_short(kind)}; known: {', '.join(EXPR_KINDS)}")
            if kind == "call_function":
                ctx.op(e.get("op"))
            elif kind == "call_method" and (not isinstance(e.get("method"), str)
                                            or e["method"] not in TENSOR_METHODS | {"__call__"}):
                _fail(ew, f"method {_short(e.get('method'))} is not one a graph may call (module "
                          "calls and the tensor methods of traced_codec.TENSOR_METHODS)")
            elif kind == "apply" and (not isinstance(e.get("op"), str)
                                      or e["op"] not in op_table.OPS):
                _fail(ew, f"core op {_short(e.get('op'))} is not registered")


def _short(v):
    s = repr(v) if not isinstance(v, str) or len(v) < 200 else repr(v[:60])
    return s if len(s) <= 60 else s[:57] + "..."


def _names_of(entry, graphs=True):
    """``(where, name)`` of every name in a traced entry: its own, its
    children's and members', its graphs', their nodes' and exprs' (names
    become identifiers in generated code and keys of lookups); ``graphs``
    False: not the graphs'."""
    yield "", entry.get("name")
    yield "", entry.get("qualname")
    for pair in entry.get("children") or ():
        yield ".children", pair[0] if isinstance(pair, list) and pair else None
    for table in ("parameters", "buffers", "attrs"):
        if isinstance(entry.get(table), dict):
            for k in entry[table]:
                yield f".{table}", k
    for gi, g in enumerate(entry.get("graphs") or () if graphs else ()):
        if not isinstance(g, dict):
            continue
        yield f".graphs[{gi}]", g.get("name")
        yield f".graphs[{gi}]", g.get("qualname")
        for n in g.get("nodes") or ():
            yield f".graphs[{gi}].nodes", n.get("name") if isinstance(n, dict) else None
        for e in g.get("exprs") or ():
            if isinstance(e, dict):
                for key in ("name", "method"):
                    yield f".graphs[{gi}].exprs", e.get(key)
                if isinstance(e.get("kwargs"), dict):
                    yield from ((f".graphs[{gi}].exprs", k) for k in e["kwargs"])


def _member_names(entry):
    """The names of a traced entry's children, parameters, buffers and attrs."""
    for pair in entry.get("children") or ():
        yield pair[0] if isinstance(pair, list) and pair else None
    for table in ("parameters", "buffers", "attrs"):
        if isinstance(entry.get(table), dict):
            yield from entry[table]


def check_limits(entry, where, error, graphs=True):
    """The bounds of limits.py on a traced entry (graphs and exprs already
    maps): name lengths, graph sizes, arguments of a call. The reader runs
    it before anything is built (error=ArchiveError), the writer on the
    entry it made (error=ValueError), so save never writes what load
    refuses. ``graphs`` False: the entry's own names only (a lazy load
    checks its graphs when it reads them)."""
    for w, name in _names_of(entry, graphs):
        limits.check_name(name, where + w, error)
    limits.member_names(_member_names(entry), where, error)
    for gi, g in enumerate(entry["graphs"] if graphs else ()):
        gw = f"{where}.graphs[{gi}]"
        for key in ("exprs", "nodes"):
            limits.check_graph_size(len(g.get(key) or ()), f"{gw}.{key}", error)
        for ei, e in enumerate(g["exprs"]):
            for key in ("args", "kwargs"):
                if isinstance(e.get(key), (list, dict)):
                    limits.check_call_args(len(e[key]), f"{gw}.exprs[{ei}].{key}", error)


def _decode(entry, ctx):
    try:
        return _build(entry, ctx)
    except ArchiveError as e:
        if str(e).startswith(("header.", "traced module ")):      # already says where
            raise
        raise ArchiveError(f"traced module {_short(entry['qualname'])}: {e}") from e


def _build(entry, ctx):
    shell = _READS_AS.get(entry.get("reads_as"), TracedModule)
    tm = shell._shell(Module(), entry["qualname"])
    d = tm.__dict__
    d["_orig_name"] = entry["name"]
    d["_orig_type"] = None                  # an archive keeps only the class name
    d["_is_top"] = bool(entry["is_top"])
    d["_signature"] = _stored_signature(entry["signature"], ctx)
    for k, i in entry["children"]:
        _check_member(tm, k, "children")
        tm._modules[k] = ctx.module(i)
    for k, i in entry["parameters"].items():
        _check_member(tm, k, "parameters")
        tm._parameters[k] = ctx.parameter(i)
    for k, i in entry["buffers"].items():
        _check_member(tm, k, "buffers")
        tm._buffers[k] = ctx.tensor(i)
    non_persistent = ctx.value(entry["non_persistent"], where="non_persistent")
    if not isinstance(non_persistent, list) or not all(k in tm._buffers for k in non_persistent):
        _fail("non_persistent", "expected a list of buffer names")
    d["_non_persistent_buffers"] = set(non_persistent)
    for k, v in entry["attrs"].items():
        _check_member(tm, k, "attrs")       # bookkeeping names are taken: refused there
        value = ctx.value(v, where=f"attrs.{k}")
        if isinstance(value, Module):
            _fail(f"attrs.{k}", "a module is a child, not a plain attribute")
        d[k] = value
    if ctx.lazy_graphs is None:
        _read_graphs(tm, entry, ctx)
    else:                   # read on first use (LazyGraphs)
        del d["_graphs"]
        ctx.lazy_graphs.append((tm, entry, ctx._building[-1]))
        if ctx.finish_lazy is None:
            ctx.finish_lazy = lambda guard: LazyGraphs(ctx, guard)
    _number(tm, ctx)
    return tm


def _read_graphs(tm, entry, ctx, graphs=None):
    """Read the graphs of ``tm``'s entry into ``graphs`` (default its own
    list) and return it."""
    graphs = tm._graphs if graphs is None else graphs
    for gi, g in enumerate(entry["graphs"]):
        graphs.append(_GraphReader(tm, g, ctx, f"graphs[{gi}]").read())
    return graphs


class LazyGraphs:
    """The graphs of a lazy load (``mmap=True, verify=False``), read on
    first use: the load builds modules and maps weights, and registers its
    traced modules (traced_module.PENDING_GRAPHS); the first ``_graphs``
    lookup on any of them reads every graph of the load, with every check
    an eager load makes, in the same order (so the same graphs, ids and
    names), and numbers them as the load would have. A failure is the
    ArchiveError the load would have raised, raised again on each later
    lookup. The graphs are handed out when all are read: a thread that
    looks meanwhile waits for them, never sees a half-read list."""

    def __init__(self, ctx, guard):
        self._ctx, self._guard = ctx, guard
        self._stamp = ctx._source.stamp()     # what the mapped file holds (see _read)
        self._waiting, ctx.lazy_graphs = ctx.lazy_graphs, None
        self._lock = threading.RLock()
        self._reading = False
        self._error = None
        for tm, _, _ in self._waiting:
            tm.__dict__[PENDING_GRAPHS] = self

    def __call__(self):
        with self._lock:
            if self._error is not None:
                raise self._error
            if self._waiting is None or self._reading:     # read, or being read by this thread
                return
            waiting = self._waiting
            self._reading = True
            try:
                self._guard(lambda: self._read(waiting))
            except Exception as e:
                for tm, _, _ in waiting:
                    tm.__dict__.pop("_graphs", None)
                self._error = e
                raise
            finally:
                self._reading = False
            self._waiting = self._ctx = None      # the header and load state go with it
            for tm, _, _ in waiting:
                tm.__dict__.pop(PENDING_GRAPHS, None)

    def _read(self, waiting):
        ctx = self._ctx
        # the graphs' tensors are views of the mapping: a file truncated since the load would
        # kill the process (SIGBUS) at the first read of a page past its new end
        changed = ctx._source.changed(self._stamp)
        if changed is not None:
            raise ArchiveError(f"the archive changed after the lazy load (mmap=True, verify="
                               f"False) mapped it: {changed}. Load it again; replace an archive "
                               "another process maps by saving to a new file and renaming it "
                               "(mt.save does), never by writing over it")
        read = []
        for tm, entry, i in waiting:
            ctx._building = [i]
            try:
                _check_graphs(entry, ctx, f"header.modules[{i}]")
                read.append(_read_graphs(tm, entry, ctx, []))
            except ArchiveError as e:
                if str(e).startswith(("header.", "traced module ")):
                    raise
                raise ArchiveError(f"traced module {_short(entry['qualname'])}: {e}") from e
            except Exception as e:    # as DecodeContext.module reports a codec's failure
                raise ArchiveError(f"header.modules[{i}]: {type(e).__name__}: {e}") from e
            finally:
                ctx._building = []
        for (tm, _, _), graphs in zip(waiting, read):
            tm.__dict__["_graphs"] = graphs
        for number in ctx.numbering:
            number()


def _number(tm, ctx):
    """Give ``tm``'s tree its ids (:func:`_finish_ids`) once the outermost
    traced module being built is done: numbering a traced child first and
    then its parent's whole tree again (which renumbers the child) made a
    load quadratic in the depth of the tree. Modules built inside another
    traced module wait in ``ctx.traced_built``; those the outermost one's
    tree holds are numbered as part of it, any other in the order built,
    so the ids are those of numbering each module as it is finished."""
    ctx.traced_built.append(tm)
    modules = ctx.header["modules"]
    if any(modules[i]["kind"] == "traced" for i in ctx._building[:-1]):
        return
    built, ctx.traced_built = ctx.traced_built, []
    if ctx.lazy_graphs is None:
        _number_built(tm, built)
    else:                   # once the graphs are read (LazyGraphs)
        ctx.numbering.append(lambda: _number_built(tm, built))


def _number_built(tm, built):
    """Number ``tm``'s tree, and first each module of ``built`` (traced
    modules built while ``tm`` was, ``tm`` last) outside it."""
    modules = list(type(tm).modules(tm))
    inside = {id(m) for m in modules}
    for m in built[:-1]:
        if id(m) not in inside:
            _finish_ids(m)
    _finish_ids(tm, modules)


def _finish_ids(tm, modules=None):
    """One IdSource for the graphs of ``tm``'s tree (``modules``: its
    ``modules()``, when known): the stored ids when every graph kept them
    (counting on from the largest), else a fresh numbering from 0 (what a
    trace gives; 1.0 archives)."""
    graphs = [g for m in (type(tm).modules(tm) if modules is None else modules)
              for g in getattr(m, "_graphs", ())]
    if graphs and all(g.__dict__.get("_stored_ids") for g in graphs):
        exprs = [e for g in graphs for e in g._exprs]
        nodes = [o for e in exprs for o in e.outputs]
        src = IdSource(max((n._id for n in nodes), default=-1) + 1,
                       max((e._id for e in exprs), default=-1) + 1, dirty=True)
        src.root = weakref.ref(tm)
        for g in graphs:
            g._ids = src
    else:
        reset_ids(tm)


def _check_member(tm, name, where):
    """``name`` may name a child, parameter, buffer or attribute of ``tm``:
    a non-empty str without dots that is not already taken (by another
    member, the module's bookkeeping, or a member of its class)."""
    if not isinstance(name, str) or not name or "." in name:
        _fail(where, f"{_short(name)} is not a member name (a non-empty str without '.')")
    # children, parameters and buffers live in the module's tables (generated code reads
    # them with codegen.member), so they may share a class member's name; attrs may not
    hidden = name.startswith("__") or (where == "attrs" and _shadows_method(type(tm), name))
    if name in tm.__dict__ or hidden or name in tm._modules \
            or name in tm._parameters or name in tm._buffers:
        _fail(where, f"{_short(name)} clashes with another member or with "
                     f"{type(tm).__name__}.{name}")


def _stored_signature(raw, ctx):
    """The Signature of a stored (tagged) parameter list: decoded once per
    load for each spelling of plain parameters (modules traced alike store
    the same list; its repr is the key, as msgpack's lists, maps and
    scalars spell their values), else every time."""
    key = repr(raw) if type(raw) is dict else None
    sig = ctx.signatures.get(key) if key is not None else None
    if sig is None:
        params = ctx.value(raw, where="signature")
        sig = _decode_signature(params, ctx.signatures)
        if key is not None and params is not None and _signature_key(params) is not None:
            ctx.signatures[key] = sig
    return sig


def _signature_key(params):
    """A key for a stored parameter list whose defaults are plain values
    (by type and repr: -0.0 is not 0.0, True is not 1); None for any other
    list (a bad one fails in _decode_signature)."""
    try:
        if not all(plain_value(p.get("default")) for p in params):
            return None
        key = tuple((p["name"], p["kind"], "default" in p, type(p.get("default")),
                     repr(p.get("default"))) for p in params)
        hash(key)
        return key
    except (AttributeError, KeyError, TypeError):
        return None


def _decode_signature(params, made=None):
    """The inspect.Signature of a stored parameter list; ``made``: the ones
    this load made, by their lists (a Signature is immutable: modules traced
    alike share one)."""
    if params is None:
        return None
    key = _signature_key(params) if made is not None else None
    if key is not None:
        sig = made.get(key)
        if sig is None:
            sig = made[key] = _decode_signature(params)
        return sig
    try:
        ps = [inspect.Parameter(p["name"], _PARAM_KINDS[p["kind"]],
                                default=p.get("default", inspect.Parameter.empty))
              for p in params]
        return inspect.Signature(ps)
    except (KeyError, TypeError, ValueError) as e:
        _fail("signature", f"not a valid parameter list ({e})")


class _StoredTreeDef(TreeDef):
    """The TreeDef of a graph's arguments as read from an archive, when it
    holds namedtuple look-alikes: a namedtuple of the same name and fields
    as a look-alike is taken for one (the traced class cannot be imported)."""
    __slots__ = ()

    def match(self, obj, is_leaf, path="args"):
        return super().match(_to_lookalikes(self, obj), is_leaf, path)


def _to_lookalikes(t, obj):
    """``obj`` with each namedtuple that stands where ``t`` has a look-alike
    replaced by one; the rest as is (``match`` reports any other mismatch)."""
    if not isinstance(t, TreeDef):
        return obj
    typ = t.type
    if getattr(typ, "_mgtrace_lookalike", False) and type(obj) is not typ \
            and isinstance(obj, tuple) and getattr(type(obj), "_fields", None) == typ._fields \
            and type(obj).__name__ == typ.__name__:
        obj = typ(*obj)
    if typ is _Root:
        return _to_lookalikes(t.children[0], obj)
    if typ in (dict, collections.OrderedDict) and isinstance(obj, dict):
        subs = dict(zip(t.aux, t.children))
        return type(obj)((k, _to_lookalikes(subs[k], v) if k in subs else v)
                         for k, v in obj.items())
    if isinstance(obj, (tuple, list)) and len(obj) == len(t.children) and typ is type(obj):
        items = [_to_lookalikes(c, v) for c, v in zip(t.children, obj)]
        return typ(*items) if hasattr(typ, "_fields") else typ(items)
    return obj


def _has_lookalike(t):
    return isinstance(t, TreeDef) and (getattr(t.type, "_mgtrace_lookalike", False)
                                       or any(map(_has_lookalike, t.children)))


class _GraphReader:
    """Builds one InternalGraph from its entry, checking every reference."""

    def __init__(self, tm, entry, ctx, where):
        self.tm, self.g, self.ctx, self.where = tm, entry, ctx, where
        self.nodes = {}

    def read(self):
        g, w = self.g, self.where
        name, qualname = g.get("name", ""), g.get("qualname", self.tm._qualname)
        if not isinstance(name, str) or not isinstance(qualname, str):
            _fail(w, "a graph's name and qualname are strings")
        graph = InternalGraph(name, qualname, owner=self.tm)
        self.graph = graph
        nodes = g.get("nodes", [])
        if not isinstance(nodes, list):
            _fail(f"{w}.nodes", "not a list")
        for n in nodes:
            self._node(n)
        for i, e in enumerate(g["exprs"]):
            self._expr(e, f"{w}.exprs[{i}]")
        graph._inputs = [self._ref(i, f"{w}.inputs") for i in _list(g.get("inputs"), f"{w}.inputs")]
        graph._outputs = [self._ref(i, f"{w}.outputs")
                          for i in _list(g.get("outputs"), f"{w}.outputs")]
        for key in ("in_def", "out_def"):       # how calls bind inputs and build results
            if g.get(key) is None:
                _fail(f"{w}.{key}", "missing: a graph needs the structure of its arguments "
                                    "(in_def) and of its result (out_def)")
        graph._in_def = self._root_tree(g["in_def"], f"{w}.in_def")
        graph._out_def = self._root_tree(g["out_def"], f"{w}.out_def")
        if not graph._inputs or not isinstance(graph._inputs[0], ModuleNode):
            _fail(w, "the first input of a graph is its self module node")
        if not all(isinstance(n, (TensorNode, ValueNode)) for n in graph._inputs[1:]):
            _fail(w, "a graph's inputs after self are tensor or int nodes")
        graph._inputs[0].owner = self.tm
        self._ids(g.get("ids"), graph, nodes, w)
        problems = graph.check(recursive=False)
        if problems:
            _fail(w, "the graph is broken: " + "; ".join(problems[:5]))
        # its code is generated and compiled on the first call (TracedModule._function),
        # from nodes, names and references all checked above
        return graph

    def _ids(self, stored, graph, entries, w):
        """Give the graph's nodes and exprs the ids the archive kept (1.1);
        without them the module's ids are renumbered (``_finish_ids``)."""
        if stored is None:
            return
        ok = isinstance(stored, dict) and all(
            isinstance(stored.get(k), list) and all(type(i) is int and i >= 0 for i in stored[k])
            for k in ("nodes", "exprs"))
        if not ok or len(stored["nodes"]) != len(entries) or \
                len(stored["exprs"]) != len(graph._exprs):
            _fail(f"{w}.ids", "a map of nodes and exprs: lists of non-negative ints, one per "
                              "node entry and expr")
        for n, i in zip(entries, stored["nodes"]):
            self.nodes[n["id"]]._id = i
        for e, i in zip(graph._exprs, stored["exprs"]):
            e._id = i
        graph.__dict__["_stored_ids"] = True

    def _node(self, n):
        w = f"{self.where}.nodes"
        if not isinstance(n, dict) or type(n.get("id")) is not int or n["id"] in self.nodes:
            _fail(w, f"bad or duplicate node entry {_short(n)}")
        w = f"{w}[id {n['id']}]"
        kind = n.get("kind")
        name = limits.node_name(n.get("name"), self.graph._names, w, ArchiveError)
        if kind == "tensor":
            node = TensorNode(name=name, shape=_node_shape(n.get("shape"), w),
                              dtype=_node_dtype(n.get("dtype"), w))
        elif kind == "module":
            node = ModuleNode(name=name)
        elif kind == "value":
            value = n.get("value")
            if value is not None and type(value) is not int:
                _fail(f"{w}.value", f"an int node's value is an int, got {_short(value)}")
            node = ValueNode(name=name, value=value)
        else:
            _fail(f"{w}.kind", f"unknown node kind {_short(kind)}")
        self.graph._add_node(node, name)
        self.nodes[n["id"]] = node

    def _ref(self, i, where):
        node = self.nodes.get(i) if type(i) is int else None
        if node is None:
            _fail(where, f"node {_short(i)} is not defined")
        return node

    def _value(self, v, where):
        def node(i):
            return self._ref(i, where)
        return self.ctx.value(v, node=node, where=where)

    def _args(self, e, w):
        """An expr's arguments by parameter name, decoded."""
        return {k: self._value(v, f"{w}.args.{k}") for k, v in _map(e.get("args"), w).items()}

    def _root_tree(self, t, where):
        tree = self._tree(t, where)
        if _has_lookalike(tree):
            tree = _StoredTreeDef(tree.type, tree.aux, tree.children)
        return tree

    def _tree(self, t, where):
        if t is None:
            return None
        if not isinstance(t, dict) or not isinstance(t.get("children"), list):
            _fail(where, "a treedef is a map with children")
        name = t.get("type")
        aux = t.get("aux")
        if aux is not None:         # (nil is None: most treedefs have no aux)
            aux = self.ctx.value(aux, where=f"{where}.aux")
        if name == "namedtuple":
            typ = _namedtuple_type(aux, where)
            aux = None
        else:
            typ = _TREE_BY_NAME.get(name) if isinstance(name, str) else None
            if typ is None:
                _fail(where, f"unknown container type {_short(name)}")
        kids = []
        for i, c in enumerate(t["children"]):
            if isinstance(c, dict) and c.get("slot") is True:
                kids.append(LeafDef(SLOT))
            elif isinstance(c, dict) and "const" in c:
                kids.append(LeafDef(self.ctx.value(c["const"], where=f"{where}.children[{i}]")))
            else:
                kids.append(self._tree(c, f"{where}.children[{i}]"))
        if typ in (dict, collections.OrderedDict):
            if not isinstance(aux, tuple) or not all(map(_plain_key, aux)):
                _fail(where, "dict keys are str, int, float, bool, None, bytes or tuples of those")
            values.check_hashes(aux, f"{where}.aux")
            if len(aux) != len(kids) or len(set(aux)) != len(aux):
                _fail(where, "a dict treedef has one distinct key per child")
        elif aux is not None:
            _fail(f"{where}.aux", f"a {name} treedef has no aux")
        elif typ is _Root and len(kids) != 1 or typ is slice and len(kids) != 3:
            _fail(where, f"a {name} treedef has {1 if typ is _Root else 3} children")
        return TreeDef(typ, aux, kids)

    def _expr(self, e, w):
        kind = e["kind"]
        if kind == "input":
            name = e.get("name", "")
            if not isinstance(name, str):
                _fail(f"{w}.name", "not a str")
            expr = Input(name)
        elif kind == "getattr":
            mnode = self._ref(e.get("module"), f"{w}.module")
            path = e.get("name")
            if not isinstance(path, str) or not all(path.split(".")):
                _fail(w, f"attribute path {_short(path)} is not allowed")
            expr = GetAttr(mnode, path)
        elif kind == "call_method":
            expr = self._call_method(e, w)
        elif kind == "call_function":
            op = self.ctx.op(e["op"])
            by_name = op.upgrade(self._args(e, w))
            args, kwargs = _args_from_names(_signature(op.fn, w), by_name, w)
            expr = CallFunction(op.fn, args, kwargs)
        elif kind == "constant":
            expr = Constant(self.ctx.value(e.get("value"), where=f"{w}.value"))
        else:      # apply
            args = self._value(e.get("args", []), f"{w}.args")
            if not isinstance(args, (list, tuple)):
                _fail(f"{w}.args", "not a list")
            params = {k: self._value(v, f"{w}.params.{k}")
                      for k, v in _map(e.get("params"), w, keywords=True).items()}
            expr = Apply(e["op"], tuple(args), params)
        self._finish(expr, e, w)

    def _call_method(self, e, w):
        obj = self._ref(e.get("self"), f"{w}.self")
        method = e.get("method")
        if method == "__call__":
            if not isinstance(obj, ModuleNode):
                _fail(w, "only module nodes can be called")
            by_name = self._args(e, w)
            owner = self._owner(obj, w)
            if owner is self.tm:
                _fail(w, "a graph calls its own module (it would recurse forever)")
            args, kwargs = _args_from_names(_call_signature(owner), by_name, w)
            expr = CallMethod(obj, "__call__", args, kwargs)
            expr.arg_def = self._root_tree(e.get("arg_def"), f"{w}.arg_def")
            return expr
        if not isinstance(obj, TensorNode):
            _fail(w, f"method {method!r} is called on a tensor node, not a {obj.kind} node")
        args = self._value(e.get("args", []), f"{w}.args")
        if not isinstance(args, (list, tuple)):
            _fail(f"{w}.args", "not a list")
        kwargs = {k: self._value(v, f"{w}.kwargs.{k}")
                  for k, v in _map(e.get("kwargs"), w, keywords=True).items()}
        return CallMethod(obj, method, tuple(args), kwargs)

    def _owner(self, mnode, w):
        """The module a module node stands for (found along GetAttr paths)."""
        if mnode.owner is None:
            _fail(w, f"module node {mnode.name!r} is not defined by getattr before use")
        return mnode.owner

    def _finish(self, expr, e, w):
        outs = [self._ref(i, f"{w}.outputs") for i in _list(e.get("outputs", []), f"{w}.outputs")]
        for o in outs:
            if o.expr is not None:
                _fail(w, f"node {o.name!r} is produced twice")
            o.expr = expr
        expr.outputs = outs
        expr.out_def = self._tree(e.get("out_def"), f"{w}.out_def")
        n_out = len(outs) if expr.out_def is None else expr.out_def.num_leaves
        if n_out != len(outs) or (expr.out_def is None and len(outs) > 1):
            _fail(w, f"{len(outs)} outputs for an out_def of {n_out} slots")
        if isinstance(expr, (Input, GetAttr, Constant)) and len(outs) != 1:
            _fail(w, f"a {expr.kind} expr has one output")
        if isinstance(expr, Input):
            if len(outs) == 1 and isinstance(outs[0], ModuleNode) and not self.graph._exprs:
                outs[0].owner = self.tm
        if isinstance(expr, GetAttr):
            base = self._owner(expr.args[0], w) if isinstance(expr.args[0], ModuleNode) else None
            if base is None:
                _fail(w, "getattr reads an attribute of a module node only")
            target = _safe_getattr_path(base, expr.name, w)
            if isinstance(outs[0], ModuleNode) != isinstance(target, Module) or \
                    isinstance(outs[0], ValueNode):
                _fail(w, f"{expr.name!r} is a {type(target).__name__}, not what node "
                         f"{outs[0].name!r} ({outs[0].kind}) stands for")
            if isinstance(outs[0], ModuleNode):
                outs[0].owner = target
        self.graph._append(expr)


def _node_shape(shape, w):
    if shape is None:
        return None
    if not (isinstance(shape, list) and len(shape) <= MAX_NDIM
            and all(type(s) is int and s >= 0 for s in shape)):
        _fail(f"{w}.shape", f"expected at most {MAX_NDIM} non-negative ints, got {_short(shape)}")
    return tuple(shape)


def _node_dtype(name, w):
    if name is None:
        return None
    dt = DTYPES_BY_NAME.get(name) if isinstance(name, str) else None
    if dt is None:
        _fail(f"{w}.dtype", f"unknown dtype {_short(name)}")
    return dt


def _safe_getattr_path(obj, path, w):
    """What ``obj.a.b.c`` reads, following submodules only and ending at a
    submodule, parameter, buffer or plain tensor attribute (tables first,
    as generated code reads them with ``codegen.member``)."""
    parts = path.split(".")
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        if not isinstance(obj, Module) or part.startswith("__"):
            _fail(w, f"{path!r}: {part!r} is not a submodule, parameter or buffer")
        d = obj.__dict__
        if part in d.get("_modules", {}):
            obj = d["_modules"][part]
        elif last and part in d.get("_parameters", {}):
            obj = d["_parameters"][part]
        elif last and part in d.get("_buffers", {}):
            obj = d["_buffers"][part]
        elif last and part not in _BOOKKEEPING and isinstance(d.get(part), Tensor):
            obj = d[part]
        else:
            _fail(w, f"{path!r}: no submodule, parameter, buffer or tensor attribute {part!r}")
        if obj is None:
            _fail(w, f"{path!r}: {part!r} is None")
    return obj


def _list(v, w):
    if not isinstance(v, list):
        _fail(w, "not a list")
    return v


def _map(v, w, keywords=False):
    if v is None:
        return {}
    if not isinstance(v, dict) or not all(isinstance(k, str) for k in v):
        _fail(w, "arguments by name must be a map with string keys")
    if keywords:
        for k in v:
            _check_keyword(k, w)
    return v


def _check_keyword(k, w):
    if not isinstance(k, str) or not k.isidentifier() or keyword.iskeyword(k):
        _fail(w, f"keyword {_short(k)} is not a Python identifier")


def _signature(fn, w):
    try:
        return inspect.signature(fn)
    except (TypeError, ValueError):
        _fail(w, f"{fn!r} has no signature to bind stored arguments to")


def _args_from_names(sig, by_name, w):
    """(args, kwargs) for a call with ``by_name`` bound to ``sig``: leading
    positional parameters positionally (those with defaults by keyword, where
    nothing positional follows them), ``*args`` expanded, the rest by keyword."""
    args, kwargs, positional = [], {}, True
    known = set()
    demotable = []          # trailing positional args that may be given by keyword
    for p in sig.parameters.values():
        known.add(p.name)
        if p.name not in by_name:
            if p.kind is p.POSITIONAL_ONLY and p.default is p.empty:
                _fail(w, f"missing argument {p.name!r}")
            positional = False
            continue
        v = by_name[p.name]
        if p.kind is p.VAR_POSITIONAL:
            if not isinstance(v, tuple) or not positional:
                _fail(w, f"*{p.name} must follow the positional arguments")
            args.extend(v)
            if v:
                demotable = []
        elif p.kind is p.VAR_KEYWORD:
            if not isinstance(v, dict):
                _fail(w, f"**{p.name} must be a dict")
            for k in v:
                _check_keyword(k, w)
                if k in known or k in by_name:
                    _fail(w, f"keyword {k!r} is given twice")
            kwargs.update(v)
        elif p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and positional:
            args.append(v)
            keyword_ok = p.kind is p.POSITIONAL_OR_KEYWORD and p.default is not p.empty
            demotable = demotable + [p.name] if keyword_ok else []
        else:
            if p.kind is p.POSITIONAL_ONLY:
                _fail(w, f"positional-only argument {p.name!r} follows a missing one")
            kwargs[p.name] = v
    for name in reversed(demotable):
        kwargs = {name: args.pop(), **kwargs}
    extra = set(by_name) - known
    if extra:
        _fail(w, f"stored arguments {sorted(extra)} are not parameters of the current "
                 "function (an upgrader should rename them)")
    try:
        sig.bind(*args, **kwargs)
    except TypeError as e:
        _fail(w, f"the stored arguments do not fit {sig} ({e})")
    return tuple(args), kwargs


def _namedtuple_type(aux, where):
    """The look-alike namedtuple class for ``aux = (module, qualname, fields)``."""
    if not (isinstance(aux, tuple) and len(aux) == 3):
        _fail(where, "a namedtuple treedef's aux is (module, qualname, fields)")
    return values.namedtuple_type(*aux, where=where)


register_module_codec("traced", TracedModule, _encode, _decode, check=_check,
                      fields=TRACED_FIELDS, since=(1, 0))
