"""Python source for a graph, and the compiled function that runs it.

Each InternalGraph becomes ``def forward(self, <inputs>)``: one statement
per expr, names from the nodes (made into safe, unique identifiers), and a
``return`` that rebuilds the result structure. Functions, constants and
anything without a safe literal form are passed in through the function's
globals under generated names, never spelled as code, so a graph read from
an archive cannot inject code whatever its names and values are.

The source is compiled with ``compile`` under the file name
``<mgtrace:QUALNAME>`` and registered with ``linecache``, so tracebacks and
``inspect`` show the generated lines.
"""
import builtins
import collections
import keyword
import linecache
import math
import operator
import re

import mgtrace.functional as F
from mgtrace._core import OpDef, apply
from mgtrace.traced_module.expr import (Apply, CallFunction, CallMethod, Constant, GetAttr,
                                        Input)
from mgtrace.traced_module.node import Node
from mgtrace.traced_module.pytree import _Root

__all__ = ["generate", "compile_graph"]

# Python's operator spelling of the tensor dunders the tracer records
_BINARY = {"__add__": "+", "__sub__": "-", "__mul__": "*", "__truediv__": "/",
           "__floordiv__": "//", "__mod__": "%", "__pow__": "**", "__matmul__": "@",
           "__and__": "&", "__or__": "|", "__xor__": "^", "__lshift__": "<<",
           "__rshift__": ">>", "__eq__": "==", "__ne__": "!=", "__lt__": "<",
           "__le__": "<=", "__gt__": ">", "__ge__": ">="}
_REFLECTED = {f"__r{k[2:]}": v for k, v in _BINARY.items() if k not in
              ("__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__")}
_UNARY = {"__neg__": "-", "__pos__": "+", "__invert__": "~"}
_OPERATOR_FUNCS = {operator.add: "+", operator.sub: "-", operator.mul: "*",
                   operator.floordiv: "//", operator.truediv: "/", operator.mod: "%",
                   operator.pow: "**"}

_FIXED_GLOBALS = {"F": F, "apply": apply, "OpDef": OpDef, "operator": operator,
                  "_getattr_path": None}       # filled below
_RESERVED = set(keyword.kwlist) | set(dir(builtins)) | set(_FIXED_GLOBALS) | {"self"}
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _getattr_path(obj, path):
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


_FIXED_GLOBALS["_getattr_path"] = _getattr_path


class _Namer:
    """Node -> a safe, unique local identifier; object -> a global name."""

    def __init__(self):
        self.local = {}
        self.used = set(_RESERVED)
        self.globals = dict(_FIXED_GLOBALS)
        self._gid = {}

    def __call__(self, node):
        name = self.local.get(id(node))
        if name is None:
            name = self.fresh(node.name)
            self.local[id(node)] = name
        return name

    def fresh(self, base):
        base = re.sub(r"\W", "_", base or "v") or "v"
        if base[0].isdigit():
            base = "_" + base
        name, i = base, 1
        while name in self.used or keyword.iskeyword(name):
            name = f"{base}_{i}"
            i += 1
        self.used.add(name)
        return name

    def glob(self, obj, hint):
        key = id(obj)
        if key in self._gid:
            return self._gid[key]
        name = self.fresh("_" + re.sub(r"\W", "_", hint))
        self.globals[name] = obj
        self._gid[key] = name
        return name


def _literal(v, namer):
    """Source for value ``v`` (Nodes by name; unsafe values via globals)."""
    if isinstance(v, Node):
        return namer(v)
    t = type(v)
    if v is None or v is Ellipsis or t in (bool, int, str):
        return "..." if v is Ellipsis else repr(v)
    if t is float and math.isfinite(v):
        return repr(v)
    if t is tuple:
        inner = ", ".join(_literal(x, namer) for x in v)
        return f"({inner}{',' if len(v) == 1 else ''})"
    if t is list:
        return "[" + ", ".join(_literal(x, namer) for x in v) + "]"
    if t is dict:
        return "{" + ", ".join(f"{_literal(k, namer)}: {_literal(x, namer)}" for k, x in v.items()) + "}"
    if t is slice:
        return f"slice({_literal(v.start, namer)}, {_literal(v.stop, namer)}, {_literal(v.step, namer)})"
    return namer.glob(v, "c")


def _index_literal(v, namer):
    if type(v) is tuple and v:
        return ", ".join(_index_literal(x, namer) for x in v) + ("," if len(v) == 1 else "")
    if type(v) is slice:
        parts = ["" if p is None else _literal(p, namer) for p in (v.start, v.stop, v.step)]
        return ":".join(parts[:2] if v.step is None else parts)
    return _literal(v, namer)


def _call_args(args, kwargs, namer):
    parts = [_literal(a, namer) for a in args]
    for k, v in kwargs.items():
        if not _IDENT.match(k) or keyword.iskeyword(k):
            raise ValueError(f"keyword argument name {k!r} is not a Python identifier")
        parts.append(f"{k}={_literal(v, namer)}")
    return ", ".join(parts)


def _attr_source(path, namer):
    parts = path.split(".")
    if all(_IDENT.match(p) and not keyword.iskeyword(p) for p in parts):
        return "self." + path
    return f"_getattr_path(self, {path!r})"


def _rhs(e, namer):
    """The right-hand side for expr ``e``."""
    if isinstance(e, GetAttr):
        return _attr_source(e.name, namer) if e.args[0] is e.graph._inputs[0] \
            else f"_getattr_path({namer(e.args[0])}, {e.name!r})"
    if isinstance(e, Constant):
        v = e.value
        return _literal(v, namer) if type(v) in (bool, int, str, type(None)) \
            else namer.glob(v, e.name or "const")
    if isinstance(e, CallFunction):
        return _function_call(e, namer)
    if isinstance(e, CallMethod):
        return _method_call(e, namer)
    if isinstance(e, Apply):
        params = _literal(dict(e.kwargs), namer)
        args = "".join(", " + _literal(a, namer) for a in e.args)
        return f"apply(OpDef({e.op!r}, {params}){args})"
    raise TypeError(f"cannot generate code for {type(e).__name__}")


def _function_call(e, namer):
    fn = e.func
    sym = _OPERATOR_FUNCS.get(fn)
    if sym is not None and len(e.args) == 2 and not e.kwargs:
        return f"{_literal(e.args[0], namer)} {sym} {_literal(e.args[1], namer)}"
    if fn is operator.neg and len(e.args) == 1:
        return f"-{_literal(e.args[0], namer)}"
    name = getattr(fn, "__name__", "")
    if _IDENT.match(name) and getattr(F, name, None) is fn:
        callee = f"F.{name}"
    else:
        callee = namer.glob(fn, name or "fn")
    return f"{callee}({_call_args(e.args, e.kwargs, namer)})"


def _method_call(e, namer):
    obj, rest, m = e.args[0], e.args[1:], e.method
    src = namer(obj)
    if m == "__call__":
        return f"{src}({_call_args(rest, e.kwargs, namer)})"
    if m in CallMethod.PROPERTIES:
        return f"{src}.{m}"
    if not e.kwargs:
        if m in _BINARY and len(rest) == 1:
            return f"{src} {_BINARY[m]} {_literal(rest[0], namer)}"
        if m in _REFLECTED and len(rest) == 1:
            return f"{_literal(rest[0], namer)} {_REFLECTED[m]} {src}"
        if m in _UNARY and not rest:
            return f"{_UNARY[m]}{src}"
        if m == "__getitem__" and len(rest) == 1:
            return f"{src}[{_index_literal(rest[0], namer)}]"
    if not _IDENT.match(m):
        raise ValueError(f"method name {m!r} is not a Python identifier")
    return f"{src}.{m}({_call_args(rest, e.kwargs, namer)})"


def _leaf_paths(tdef, prefix=""):
    """Accessor suffixes (``[0]['k']``) of each slot of ``tdef``, in order."""
    out = []
    for i, c in enumerate(tdef.children):
        if tdef.type is _Root:
            step = ""
        elif tdef.type in (dict, collections.OrderedDict):
            step = f"[{tdef.aux[i]!r}]"
        elif tdef.type is slice:
            step = "." + ("start", "stop", "step")[i]
        else:
            step = f"[{i}]"
        if hasattr(c, "children"):
            out += _leaf_paths(c, prefix + step)
        elif c.is_slot:
            out.append(prefix + step)
    return out


def _assign(e, rhs, namer, lines):
    outs = e.outputs
    if not outs:
        lines.append(rhs)
        return
    tdef = e.out_def
    if tdef is None or (tdef.type is _Root and len(outs) == 1):
        lines.append(f"{namer(outs[0])} = {rhs}")
        return
    flat = tdef.type in (tuple, list) and all(not hasattr(c, "children") and c.is_slot
                                             for c in tdef.children)
    if flat and outs:
        lhs = ", ".join(namer(o) for o in outs)
        lines.append(f"{lhs}{',' if len(outs) == 1 else ''} = {rhs}")
        return
    tmp = namer.fresh("_r")
    lines.append(f"{tmp} = {rhs}")
    for o, path in zip(outs, _leaf_paths(tdef)):
        lines.append(f"{namer(o)} = {tmp}{path}")


def generate(graph, watch=(), end=()):
    """``(source, globals)`` of ``def forward(self, ...)`` for ``graph``.

    ``watch``: nodes whose values are passed to ``_watch(node_id, value)`` as
    they are computed; ``end``: nodes at which the function stops and returns
    their values as a list (set_watch_points / set_end_points)."""
    namer = _Namer()
    namer.local[id(graph._inputs[0])] = "self"
    params = [namer(n) for n in graph._inputs[1:]]
    lines = []
    watch_ids = {id(n) for n in watch}
    remaining = {id(n) for n in end}
    if watch_ids:
        namer.globals["_watch"] = None     # bound by the caller
    for e in graph._exprs:
        if isinstance(e, Input):
            continue
        _assign(e, _rhs(e, namer), namer, lines)
        for o in e.outputs:
            if id(o) in watch_ids:
                lines.append(f"_watch({o.id}, {namer(o)})")
            remaining.discard(id(o))
        if end and not remaining:
            break
    if end:
        if remaining:
            raise ValueError("set_end_points: some end points are not computed by this graph")
        lines.append("return [" + ", ".join(namer(n) for n in end) + "]")
    else:
        out = graph._out_def.unflatten(graph._outputs) if graph._out_def is not None else None
        lines.append(f"return {_literal(out, namer)}")
    head = f"def forward(self{''.join(', ' + p for p in params)}):"
    source = head + "\n" + "\n".join("    " + ln for ln in lines) + "\n"
    return source, namer.globals


def compile_graph(graph, watch=(), end=(), watch_fn=None):
    """The function ``forward(self, *input_values)`` that runs ``graph``."""
    source, glb = generate(graph, watch, end)
    if watch:
        glb["_watch"] = watch_fn
    filename = f"<mgtrace:{graph.qualname}#{graph._version}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    code = compile(source, filename, "exec")
    ns = {}
    exec(code, glb, ns)      # our own generated source; names and values are never spliced in raw
    return ns["forward"]
