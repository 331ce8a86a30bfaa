"""The "traced" module codec: TracedModules and their graphs in an archive.

A TracedModule is stored as::

    {kind: "traced", training, name: "Net", qualname: "Net.layer1", is_top,
     signature: [{name, kind, default?}, ...],          # forward's parameters
     children: [[name, module index], ...], parameters: {name: tensor index},
     buffers: {name: tensor index}, non_persistent: [name, ...],
     attrs: {name: value},                              # plain attributes an archive can hold
     graphs: [graph, ...]}

    graph: {name, qualname, inputs: [node id], outputs: [node id],
            in_def: treedef, out_def: treedef, nodes: [node], exprs: [expr]}
    node:  {id, name, kind: "tensor" | "module" | "value", shape?, dtype?, value?}
    expr:  {kind, outputs: [node id], out_def?: treedef, ...} with, by kind,
           input: {name}; getattr: {module: node id, name: "a.b.c"};
           call_method: {self: node id, method, args: {param: value}} for a module
             call, {self, method, args: [value], kwargs: {name: value}} for a tensor method;
           call_function: {op: op index, args: {param: value}};
           constant: {value}; apply: {op: core op name, args: [value], params: {name: value}}
    treedef: {type: "tuple"|"list"|"dict"|"odict"|"slice"|"root"|"namedtuple",
              aux: value, children: [treedef | {slot: true} | {const: value}]}

Function and module-call arguments are stored by parameter name, so an
upgrader can rebind them. Loading never resolves a name outside the
registry: functions come from the op table, tensor methods from a fixed
allowlist, core ops from the core's op registry, attributes only along
submodule/parameter/buffer names; anything else is an ArchiveError before
the module is built.
"""
import collections
import inspect
import keyword

import numpy as np

from mgtrace._core import Tensor
from mgtrace._core import dispatch as _dispatch
from mgtrace.errors import ArchiveError
from mgtrace.module.module import Module
from mgtrace.module.parameter import Parameter
from mgtrace.serialization.codecs import register_module_codec
from mgtrace.serialization.header import V1, Field
from mgtrace.traced_module import tracer as _tracer
from mgtrace.traced_module.expr import (Apply, CallFunction, CallMethod, Constant, GetAttr, Input,
                                        is_node)
from mgtrace.traced_module.graph import InternalGraph
from mgtrace.traced_module.node import ModuleNode, Node, TensorNode, ValueNode
from mgtrace.traced_module.pytree import SLOT, LeafDef, TreeDef, _Root
from mgtrace.traced_module.traced_module import TracedModule

__all__ = ["TRACED_FIELDS", "TENSOR_METHODS"]

TRACED_FIELDS = (
    Field("name", "str", True, V1, "class name of the traced module"),
    Field("qualname", "str", True, V1, 'path from the root, e.g. "Net.layer1.0"'),
    Field("is_top", "bool", True, V1, "the root of the traced tree"),
    Field("signature", "value", True, V1, "forward's parameters [{name, kind, default?}]"),
    Field("children", "named indices", True, V1, "[submodule name, module index] in order"),
    Field("parameters", "indices by name", True, V1, "parameter name -> tensor index"),
    Field("buffers", "indices by name", True, V1, "buffer name -> tensor index"),
    Field("non_persistent", "value", True, V1, "names of buffers left out of state_dict"),
    Field("attrs", "values by name", True, V1, "plain attributes (ints, strings, ...)"),
    Field("graphs", "value", True, V1, "the graphs, one per call signature (see traced_codec.py)"),
)


def _tensor_methods():
    """Tensor methods a stored graph may call: what the tracer records."""
    names = {"shape", "__getitem__", "__setitem__", "__matmul__", "__rmatmul__"}
    names |= set(_tracer._VIEW_METHODS) | set(_tracer._REDUCE_METHODS)
    names |= set(_tracer._UNARY_METHOD.values())
    for fwd, refl in _tracer._COMPARE.values():
        names |= {fwd, refl}
    for base in _tracer._BINARY_METHOD.values():
        names |= {f"__{base}__", f"__r{base}__", f"__i{base}__"}
    names |= {n for n in dir(Tensor) if not n.startswith("_") and callable(getattr(Tensor, n, None))}
    return frozenset(names)


TENSOR_METHODS = _tensor_methods()
_PARAM_KINDS = {k.name: k for k in (inspect.Parameter.POSITIONAL_ONLY,
                                    inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                    inspect.Parameter.VAR_POSITIONAL,
                                    inspect.Parameter.KEYWORD_ONLY,
                                    inspect.Parameter.VAR_KEYWORD)}
_TREE_TYPES = {tuple: "tuple", list: "list", dict: "dict", collections.OrderedDict: "odict",
               slice: "slice", _Root: "root"}
_TREE_BY_NAME = {v: k for k, v in _TREE_TYPES.items()}


# ---------------------------------------------------------------- encode
def _encode(tm, ctx):
    d = tm.__dict__
    attrs = {}
    for k, v in d.items():
        if k.startswith("_") or k in ("training", "watch_points", "end_points", "watch_node_value"):
            continue
        try:
            attrs[k] = ctx.value(v)
        except TypeError:
            continue          # not an archive value (a function, an open file...): not kept
    return {
        "name": tm._orig_name, "qualname": tm._qualname, "is_top": bool(tm._is_top),
        "signature": ctx.value(_encode_signature(tm._signature)),
        "children": [[k, ctx.module(m, k)] for k, m in tm._modules.items() if m is not None],
        "parameters": {k: ctx.tensor(t) for k, t in tm._parameters.items() if t is not None},
        "buffers": {k: ctx.tensor(t) for k, t in tm._buffers.items() if t is not None},
        "non_persistent": ctx.value(sorted(tm._non_persistent_buffers)),
        "attrs": attrs,
        "graphs": [_encode_graph(g, ctx) for g in tm._graphs],
    }


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
    ids = {}
    nodes = []
    for n in list(g._inputs) + [o for e in g._exprs if not isinstance(e, Input) for o in e.outputs]:
        if id(n) in ids:
            continue
        ids[id(n)] = len(nodes)
        nodes.append(_encode_node(n, ids[id(n)], ctx))
    node_id = lambda v: ids[id(v)] if isinstance(v, Node) else None   # noqa: E731
    return {"name": g._name, "qualname": g._qualname,
            "inputs": [ids[id(n)] for n in g._inputs], "outputs": [ids[id(n)] for n in g._outputs],
            "in_def": _encode_tree(g._in_def, ctx), "out_def": _encode_tree(g._out_def, ctx),
            "nodes": nodes, "exprs": [_encode_expr(e, ctx, ids, node_id) for e in g._exprs]}


def _encode_node(n, i, ctx):
    e = {"id": i, "name": n.name, "kind": n.kind}
    if isinstance(n, TensorNode):
        if n.shape is not None:
            e["shape"] = [int(s) for s in n.shape]
        if n.dtype is not None:
            e["dtype"] = np.dtype(n.dtype).name
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
        out.update(op=e.op, args=val(list(e.args)), params={k: val(v) for k, v in e.kwargs.items()})
    else:
        raise TypeError(f"cannot store expr {e!r}")
    return out


def _call_signature(owner):
    sig = getattr(owner, "_signature", None)
    return sig if sig is not None else inspect.signature(owner.forward)


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
        name, aux = "namedtuple", (t.type.__name__, tuple(t.type._fields))
    return {"type": name, "aux": ctx.value(aux),
            "children": [_encode_tree(c, ctx) if isinstance(c, TreeDef)
                         else ({"slot": True} if c.is_slot else {"const": ctx.value(c.const)})
                         for c in t.children]}


# ---------------------------------------------------------------- decode
def _fail(where, msg):
    raise ArchiveError(f"{where}: {msg}")


def _check(entry, ctx, where):
    graphs = entry["graphs"]
    if not isinstance(graphs, list):
        _fail(f"{where}.graphs", "not a list")
    for gi, g in enumerate(graphs):
        gw = f"{where}.graphs[{gi}]"
        if not isinstance(g, dict) or not isinstance(g.get("exprs"), list):
            _fail(gw, "a graph is a map with a list of exprs")
        for ei, e in enumerate(g["exprs"]):
            ew = f"{gw}.exprs[{ei}]"
            if not isinstance(e, dict):
                _fail(ew, "not a map")
            kind = e.get("kind")
            if kind == "call_function":
                ctx.op(e.get("op"))
            elif kind == "call_method" and (not isinstance(e.get("method"), str)
                                            or e["method"] not in TENSOR_METHODS | {"__call__"}):
                _fail(ew, f"method {e.get('method')!r} is not one a graph may call")
            elif kind == "apply" and (not isinstance(e.get("op"), str) or e["op"] not in _dispatch._IMPLS):
                _fail(ew, f"core op {e.get('op')!r} is not registered")
            elif kind not in ("input", "getattr", "call_method", "call_function", "constant", "apply"):
                _fail(ew, f"unknown expr kind {kind!r}")


def _decode(entry, ctx):
    tm = TracedModule._shell(Module(), entry["qualname"])
    d = tm.__dict__
    d["_orig_name"] = entry["name"]
    d["_is_top"] = bool(entry["is_top"])
    d["_signature"] = _decode_signature(ctx.value(entry["signature"], where="signature"))
    for k, i in entry["children"]:
        _check_attr_name(k, "children")
        tm._modules[k] = ctx.module(i)
    for k, i in entry["parameters"].items():
        _check_attr_name(k, "parameters")
        tm._parameters[k] = Parameter(ctx.tensor(i))
    for k, i in entry["buffers"].items():
        _check_attr_name(k, "buffers")
        tm._buffers[k] = ctx.tensor(i)
    d["_non_persistent_buffers"] = set(ctx.value(entry["non_persistent"], where="non_persistent"))
    for k, v in entry["attrs"].items():
        _check_attr_name(k, "attrs")
        if k in d or k in tm._modules or k in tm._parameters or k in tm._buffers:
            _fail("attrs", f"attribute {k!r} clashes with another member")
        d[k] = ctx.value(v, where=f"attrs.{k}")
    for gi, g in enumerate(entry["graphs"]):
        tm._graphs.append(_GraphReader(tm, g, ctx, f"graphs[{gi}]").read())
    return tm


def _check_attr_name(name, where):
    # what Module accepts (any non-empty name without "."), minus dunders; members
    # are only ever reached through the module's own tables, never as code
    if not isinstance(name, str) or not name or "." in name or name.startswith("__"):
        _fail(where, f"{name!r} is not an attribute name an archive may use")


def _decode_signature(params):
    if params is None:
        return None
    try:
        ps = [inspect.Parameter(p["name"], _PARAM_KINDS[p["kind"]],
                                default=p.get("default", inspect.Parameter.empty))
              for p in params]
        return inspect.Signature(ps)
    except (KeyError, TypeError, ValueError) as e:
        _fail("signature", f"not a valid parameter list ({e})")


class _GraphReader:
    """Builds one InternalGraph from its entry, checking every reference."""

    def __init__(self, tm, entry, ctx, where):
        self.tm, self.g, self.ctx, self.where = tm, entry, ctx, where
        self.nodes = {}

    def read(self):
        g, w = self.g, self.where
        graph = InternalGraph(g.get("name", ""), g.get("qualname", self.tm._qualname), owner=self.tm)
        self.graph = graph
        for n in g.get("nodes", []):
            self._node(n)
        for i, e in enumerate(g["exprs"]):
            self._expr(e, f"{w}.exprs[{i}]")
        graph._inputs = [self._ref(i, f"{w}.inputs") for i in g.get("inputs", [])]
        graph._outputs = [self._ref(i, f"{w}.outputs") for i in g.get("outputs", [])]
        graph._in_def = self._tree(g.get("in_def"), f"{w}.in_def")
        graph._out_def = self._tree(g.get("out_def"), f"{w}.out_def")
        if not graph._inputs or not isinstance(graph._inputs[0], ModuleNode):
            _fail(w, "the first input of a graph is its self module node")
        graph._inputs[0].owner = self.tm
        problems = graph.check(recursive=False)
        if problems:
            _fail(w, "the graph is broken: " + "; ".join(problems[:5]))
        return graph

    def _node(self, n):
        w = f"{self.where}.nodes"
        if not isinstance(n, dict) or type(n.get("id")) is not int or n["id"] in self.nodes:
            _fail(w, f"bad or duplicate node entry {str(n)[:80]}")
        kind, name = n.get("kind"), n.get("name")
        if not isinstance(name, str) or not name:
            _fail(w, f"node {n['id']} has no name")
        if kind == "tensor":
            dtype = np.dtype(n["dtype"]) if isinstance(n.get("dtype"), str) and n["dtype"] in _DTYPE_NAMES else None
            shape = tuple(n["shape"]) if isinstance(n.get("shape"), list) else None
            node = TensorNode(name=name, shape=shape, dtype=dtype)
        elif kind == "module":
            node = ModuleNode(name=name)
        elif kind == "value":
            node = ValueNode(name=name, value=n.get("value"))
        else:
            _fail(w, f"unknown node kind {kind!r}")
        self.graph._add_node(node, name)
        self.nodes[n["id"]] = node

    def _ref(self, i, where):
        node = self.nodes.get(i) if type(i) is int else None
        if node is None:
            _fail(where, f"node {i!r} is not defined")
        return node

    def _value(self, v, where):
        def node(i):
            return self._ref(i, where)
        return self.ctx.value(v, node=node, where=where)

    def _tree(self, t, where):
        if t is None:
            return None
        if not isinstance(t, dict) or not isinstance(t.get("children"), list):
            _fail(where, "a treedef is a map with children")
        name = t.get("type")
        aux = self.ctx.value(t.get("aux"), where=f"{where}.aux")
        if name == "namedtuple":
            typ = _namedtuple_type(aux, where)
            aux = None
        else:
            typ = _TREE_BY_NAME.get(name)
            if typ is None:
                _fail(where, f"unknown container type {name!r}")
        kids = []
        for i, c in enumerate(t["children"]):
            if isinstance(c, dict) and c.get("slot") is True:
                kids.append(LeafDef(SLOT))
            elif isinstance(c, dict) and "const" in c:
                kids.append(LeafDef(self.ctx.value(c["const"], where=f"{where}.children[{i}]")))
            else:
                kids.append(self._tree(c, f"{where}.children[{i}]"))
        if typ in (dict, collections.OrderedDict) and (not isinstance(aux, tuple) or len(aux) != len(kids)):
            _fail(where, "dict treedef keys do not match its children")
        return TreeDef(typ, aux, kids)

    def _expr(self, e, w):
        kind = e["kind"]
        if kind == "input":
            expr = Input(str(e.get("name", "")))
        elif kind == "getattr":
            mnode = self._ref(e.get("module"), f"{w}.module")
            path = e.get("name")
            if not isinstance(path, str) or not all(p and not p.startswith("__") for p in path.split(".")):
                _fail(w, f"attribute path {path!r} is not allowed")
            expr = GetAttr(mnode, path)
        elif kind == "call_method":
            expr = self._call_method(e, w)
        elif kind == "call_function":
            op = self.ctx.op(e["op"])
            by_name = {k: self._value(v, f"{w}.args.{k}") for k, v in _map(e.get("args"), w).items()}
            by_name = op.upgrade(by_name)
            args, kwargs = _args_from_names(_signature(op.fn, w), by_name, w)
            expr = CallFunction(op.fn, args, kwargs)
        elif kind == "constant":
            expr = Constant(self.ctx.value(e.get("value"), where=f"{w}.value"))
        else:      # apply
            args = self._value(e.get("args", []), f"{w}.args")
            params = {k: self._value(v, f"{w}.params.{k}") for k, v in _map(e.get("params"), w).items()}
            expr = Apply(e["op"], tuple(args), params)
        self._finish(expr, e, w)

    def _call_method(self, e, w):
        obj = self._ref(e.get("self"), f"{w}.self")
        method = e.get("method")
        if method == "__call__":
            if not isinstance(obj, ModuleNode):
                _fail(w, "only module nodes can be called")
            by_name = {k: self._value(v, f"{w}.args.{k}") for k, v in _map(e.get("args"), w).items()}
            owner = self._owner(obj, w)
            args, kwargs = _args_from_names(_call_signature(owner), by_name, w)
            expr = CallMethod(obj, "__call__", args, kwargs)
            expr.arg_def = self._tree(e.get("arg_def"), f"{w}.arg_def")
            return expr
        args = self._value(e.get("args", []), f"{w}.args")
        kwargs = {k: self._value(v, f"{w}.kwargs.{k}") for k, v in _map(e.get("kwargs"), w).items()}
        return CallMethod(obj, method, tuple(args), kwargs)

    def _owner(self, mnode, w):
        """The module a module node stands for (found along GetAttr paths)."""
        if mnode.owner is None:
            _fail(w, f"module node {mnode.name!r} is not defined by getattr before use")
        return mnode.owner

    def _finish(self, expr, e, w):
        outs = [self._ref(i, f"{w}.outputs") for i in e.get("outputs", [])]
        for o in outs:
            if o.expr is not None:
                _fail(w, f"node {o.name!r} is produced twice")
            o.expr = expr
        expr.outputs = outs
        expr.out_def = self._tree(e.get("out_def"), f"{w}.out_def")
        if isinstance(expr, Input):
            if len(outs) == 1 and isinstance(outs[0], ModuleNode) and not self.graph._exprs:
                outs[0].owner = self.tm
        if isinstance(expr, GetAttr):
            base = self._owner(expr.args[0], w) if isinstance(expr.args[0], ModuleNode) else None
            if base is None:
                _fail(w, "getattr reads an attribute of a module node only")
            target = _safe_getattr_path(base, expr.name, w)
            if len(outs) != 1:
                _fail(w, "getattr has one output")
            if isinstance(outs[0], ModuleNode):
                if not isinstance(target, Module):
                    _fail(w, f"{expr.name!r} is not a submodule")
                outs[0].owner = target
        self.graph._append(expr)


def _safe_getattr_path(obj, path, w):
    """Follow ``a.b.c`` through submodules, parameters, buffers and plain
    attributes only (never class attributes or methods)."""
    for part in path.split("."):
        if not isinstance(obj, Module):
            _fail(w, f"{path!r}: {part!r} is not reachable from a module")
        d = obj.__dict__
        for table in ("_modules", "_parameters", "_buffers"):
            if part in d.get(table, {}):
                obj = d[table][part]
                break
        else:
            if part in d and not part.startswith("_"):
                obj = d[part]
            else:
                _fail(w, f"{path!r}: no submodule, parameter or buffer {part!r}")
    return obj


def _map(v, w):
    if v is None:
        return {}
    if not isinstance(v, dict) or not all(isinstance(k, str) for k in v):
        _fail(w, "arguments by name must be a map with string keys")
    return v


def _signature(fn, w):
    try:
        return inspect.signature(fn)
    except (TypeError, ValueError):
        _fail(w, f"{fn!r} has no signature to bind stored arguments to")


def _args_from_names(sig, by_name, w):
    """(args, kwargs) for a call with ``by_name`` bound to ``sig``: leading
    positional parameters positionally, ``*args`` expanded, the rest by keyword."""
    args, kwargs, positional = [], {}, True
    known = set()
    # with a non-empty *args, everything before it must be positional too
    star = any(p.kind is p.VAR_POSITIONAL and by_name.get(p.name) for p in sig.parameters.values())
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
        elif p.kind is p.VAR_KEYWORD:
            positional = False
            if not isinstance(v, dict):
                _fail(w, f"**{p.name} must be a dict")
            kwargs.update(v)
        elif positional and (p.kind is p.POSITIONAL_ONLY or (p.kind is p.POSITIONAL_OR_KEYWORD and
                                                             (p.default is p.empty or star))):
            args.append(v)          # required parameters by position, the rest by keyword
        else:
            if p.kind is p.POSITIONAL_ONLY:
                _fail(w, f"positional-only argument {p.name!r} follows a missing one")
            kwargs[p.name] = v
    extra = set(by_name) - known
    if extra and not any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values()):
        _fail(w, f"stored arguments {sorted(extra)} are not parameters of the current "
                 "function (an upgrader should rename them)")
    for k in kwargs:
        if not isinstance(k, str) or not k.isidentifier() or keyword.iskeyword(k):
            _fail(w, f"keyword {k!r} is not a Python identifier")
    return tuple(args), kwargs


_NAMEDTUPLES = {}
_DTYPE_NAMES = {"bool", "int8", "uint8", "int16", "uint16", "int32", "int64", "float16",
                "bfloat16", "float32", "float64", "uint32", "uint64"}


def _namedtuple_type(aux, where):
    """A namedtuple class with the stored name and fields (made here, never
    imported, so it is a look-alike of the original class)."""
    if not (isinstance(aux, tuple) and len(aux) == 2 and isinstance(aux[0], str)
            and isinstance(aux[1], tuple) and all(isinstance(f, str) for f in aux[1])):
        _fail(where, "a namedtuple treedef needs (name, fields)")
    t = _NAMEDTUPLES.get(aux)
    if t is None:
        try:
            t = collections.namedtuple(aux[0], aux[1])
        except ValueError as e:
            _fail(where, f"bad namedtuple ({e})")
        _NAMEDTUPLES[aux] = t
    return t


register_module_codec("traced", TracedModule, _encode, _decode, check=_check,
                      fields=TRACED_FIELDS, since=(1, 0))
