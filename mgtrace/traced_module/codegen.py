"""Python source for a graph, and the compiled function that runs it.

Each InternalGraph becomes ``def forward(self, <inputs>)``: one statement
per expr, names from the nodes (made into safe, unique identifiers), and a
``return`` that rebuilds the result structure. Functions, constants and
anything without a safe literal form are passed in through the function's
globals under generated names, never spelled as code, so a graph read from
an archive cannot inject code whatever its names and values are.

The source is compiled under the file name ``mgtrace-generated:QUALNAME#N``
(no angle brackets: linecache skips such names) and given to ``linecache`` as
a lazy entry, so tracebacks (the traceback module, pytest, logging) and
``inspect.getsource`` show the generated lines; the entry holds the source
text only and goes when the compiled function does, so loading models does
not grow ``linecache``.
"""
GENERATED = "mgtrace-generated:"        # prefix of generated code's file names
import builtins
import functools
import collections
import itertools
import keyword
import linecache
import math
import operator
import re
import types
import weakref

import numpy as np

import mgtrace.functional as F
from mgtrace._core import OpDef, Tensor, apply, op_table
from mgtrace._core.dtype import qdtype_name, qdtype_str
from mgtrace.traced_module.expr import (Apply, CallFunction, CallMethod, Constant, GetAttr,
                                        Input)
from mgtrace.traced_module.graph import has_side_effect
from mgtrace.traced_module.node import Node, TensorNode, python_name
from mgtrace.traced_module.pytree import LeafDef, TreeDef, _Root, tree_flatten

__all__ = ["generate", "compile_graph"]

# Python's operator spelling of the tensor dunders and operator functions
# the op table declares: binary ``a + b``, reflected ``b + a``, prefix ``-a``
_INFIX = [op for op in op_table.OPS.values()
          if op.arity == 2 and op.symbol and op.pyop and op.group != "index"]
_PREFIX = [op for op in list(op_table.OPS.values()) + [op_table.POS]
           if op.arity == 1 and op.symbol and len(op.symbol) == 1]
_BINARY = {op.method: op.symbol for op in _INFIX}
_REFLECTED = {op.reflected: op.symbol for op in _INFIX if op.group != "compare"}
_UNARY = {op.method: op.symbol for op in _PREFIX}
_OPERATOR_FUNCS = {getattr(operator, op.pyop): op.symbol for op in _INFIX}
_PREFIX_FUNCS = {getattr(operator, op.pyop): op.symbol for op in _PREFIX}
_ABS, _GETITEM, _SETITEM = (op_table.OPS[n].method for n in ("abs", "getitem", "setitem"))
_ABS_FN = getattr(operator, op_table.OPS["abs"].pyop)

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_files = itertools.count()       # makes each compiled graph's file name unique


# every generated function sees these; no local or global name shadows them
def member(obj, name):
    """``obj.<name>`` looked up in the module's own tables first, so a child
    called ``flatten`` or ``code`` is found even though TracedModule has a
    method or property of that name."""
    d = getattr(obj, "__dict__", {})
    for table in ("_modules", "_parameters", "_buffers"):
        t = d.get(table)
        if t is not None and name in t:
            return t[name]
    if name in d and not name.startswith("_"):    # a plain attribute (e.g. a tensor)
        return d[name]
    return getattr(obj, name)


_FIXED_GLOBALS = {"F": F, "apply": apply, "OpDef": OpDef, "operator": operator, "member": member}
_RESERVED = set(keyword.kwlist) | set(dir(builtins)) | set(_FIXED_GLOBALS) | {"self"}


class _Namer:
    """Node -> a safe, unique local identifier; object -> a global name."""

    def __init__(self):
        self.local = {}
        self.used = set(_RESERVED)
        self.globals = dict(_FIXED_GLOBALS)
        self._gid = {}
        self._next = {}      # base -> the first suffix not yet tried: naming stays linear

    def __call__(self, node):
        name = self.local.get(id(node))
        if name is None:
            name = self.fresh(node.name)
            self.local[id(node)] = name
        return name

    def fresh(self, base):
        # in the form Python reads identifiers in, so that distinct names stay distinct
        base = re.sub(r"\W", "_", python_name(base or "v")) or "v"
        if base[0].isdigit():
            base = "_" + base
        name, i = base, 1
        taken = lambda n: n in self.used or keyword.iskeyword(n)     # noqa: E731
        if taken(name):
            m = re.match(r"^(.*\D)_(\d{1,9})$", base)   # pow_1 taken: try pow_2, not pow_1_1
            if m:
                base, i = m.group(1), int(m.group(2)) + 1
            i = max(i, self._next.get(base, 1))
            while taken(f"{base}_{i}"):
                i += 1
            name = f"{base}_{i}"
            self._next[base] = i + 1
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
    if t is float:      # inf and nan have no literal: float('-inf') says what it is
        return repr(v) if math.isfinite(v) else f"float({str(v)!r})"
    if t is tuple:
        inner = ", ".join(_literal(x, namer) for x in v)
        return f"({inner}{',' if len(v) == 1 else ''})"
    if t is list:
        return "[" + ", ".join(_literal(x, namer) for x in v) + "]"
    if t is dict:
        items = (f"{_literal(k, namer)}: {_literal(x, namer)}" for k, x in v.items())
        return "{" + ", ".join(items) + "}"
    if t is slice:
        return "slice(" + ", ".join(_literal(p, namer) for p in (v.start, v.stop, v.step)) + ")"
    leaves, tdef = tree_flatten(v, _is_node)
    if leaves:      # a namedtuple or registered container holding nodes: rebuilt by its TreeDef
        return f"{namer.glob(tdef, 'tree')}.unflatten([{', '.join(map(namer, leaves))}])"
    return namer.glob(v, "c")


def _is_node(v):
    return isinstance(v, Node)


def _operand(v, namer):
    """``v`` as an operand of a binary operator: a negative number is
    parenthesised (``(-2.0) ** x``, not ``-2.0 ** x``, which is ``-(2.0 ** x)``)."""
    s = _literal(v, namer)
    return f"({s})" if s.startswith("-") else s


def _index_literal(v, namer):
    if type(v) is tuple and v:
        return ", ".join(_index_literal(x, namer) for x in v) + ("," if len(v) == 1 else "")
    if type(v) is slice:
        parts = ["" if p is None else _literal(p, namer) for p in (v.start, v.stop, v.step)]
        return ":".join(parts[:2] if v.step is None else parts)
    return _literal(v, namer)


def _call_args(args, kwargs, namer):
    parts = [_literal(a, namer) for a in args]
    odd = {}                  # keywords that are not identifiers go in a ** dict
    for k, v in kwargs.items():
        if isinstance(k, str) and _IDENT.match(k) and not keyword.iskeyword(k):
            parts.append(f"{k}={_literal(v, namer)}")
        else:
            odd[k] = v
    if odd:
        parts.append("**" + _literal(odd, namer))
    return ", ".join(parts)


def _attr_source(path, base="self"):
    """``base.a.b`` for the dotted ``path``; a part that is not an identifier
    (``0``, ``class``, ``it's``) is read with ``getattr(obj, '0')``, one that a
    class member would hide (``flatten``) with ``member(obj, 'flatten')``."""
    src = base
    for part in path.split("."):
        if _IDENT.match(part) and not keyword.iskeyword(part) and not _class_member(part):
            src = f"{src}.{part}"
        elif _IDENT.match(part) and not keyword.iskeyword(part):
            src = f"member({src}, {part!r})"      # e.g. a child named flatten
        else:
            src = f"getattr({src}, {part!r})"
    return src


@functools.lru_cache(maxsize=None)
def _class_member(name):
    """Whether ``name`` is an attribute of the module classes themselves (a
    method or property), which plain ``obj.name`` would find first."""
    # a real cycle: traced_module.py generates each module's forward with this module
    from mgtrace.traced_module.traced_module import TracedDict, TracedSequence
    return any(hasattr(c, name) for c in (TracedSequence, TracedDict))


def _rhs(e, namer):
    """The right-hand side for expr ``e``."""
    if isinstance(e, GetAttr):
        return _attr_source(e.name, namer(e.args[0]))
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
        return f"{_operand(e.args[0], namer)} {sym} {_operand(e.args[1], namer)}"
    if fn is _ABS_FN and len(e.args) == 1 and not e.kwargs:
        return f"abs({_literal(e.args[0], namer)})"
    sym = _PREFIX_FUNCS.get(fn)
    if sym is not None and len(e.args) == 1 and not e.kwargs:
        return f"{sym}{_operand(e.args[0], namer)}"
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
            return f"{src} {_BINARY[m]} {_operand(rest[0], namer)}"
        if m in _REFLECTED and len(rest) == 1:
            return f"{_operand(rest[0], namer)} {_REFLECTED[m]} {src}"
        if m in _UNARY and not rest:
            return f"{_UNARY[m]}{src}"
        if m == _ABS and not rest:
            return f"abs({src})"
        if m == _GETITEM and len(rest) == 1:
            return f"{src}[{_index_literal(rest[0], namer)}]"
    if not _IDENT.match(m):
        raise ValueError(f"method name {m!r} is not a Python identifier")
    return f"{src}.{m}({_call_args(rest, e.kwargs, namer)})"


_INDEXABLE = (tuple, list, dict, collections.OrderedDict, slice, _Root)


def _leaf_paths(tdef, prefix=""):
    """Accessor suffixes (``[0]['k']``) of each slot of ``tdef``, in order;
    None when a container in it cannot be read by indexing (a type added
    with register_supported_type)."""
    out = []
    if tdef.type not in _INDEXABLE and not hasattr(tdef.type, "_fields"):
        return None
    for i, c in enumerate(tdef.children):
        if tdef.type is _Root:
            step = ""
        elif tdef.type in (dict, collections.OrderedDict):
            step = f"[{tdef.aux[i]!r}]"
        elif tdef.type is slice:
            step = "." + ("start", "stop", "step")[i]
        else:
            step = f"[{i}]"
        if isinstance(c, TreeDef):
            sub = _leaf_paths(c, prefix + step)
            if sub is None:
                return None
            out += sub
        elif c.is_slot:
            out.append(prefix + step)
    return out


def _assign(e, rhs, namer, lines):
    """``lhs = rhs`` for expr ``e``, unpacking its result into its outputs."""
    outs = e.outputs
    if not outs:
        lines.append(rhs)
        return
    tdef = e.out_def
    if tdef is None or (tdef.type is _Root and len(outs) == 1):
        lines.append(f"{namer(outs[0])} = {rhs}")
        return
    if tdef.type in (tuple, list) and all(isinstance(c, LeafDef) and c.is_slot
                                          for c in tdef.children):
        lhs = ", ".join(namer(o) for o in outs)
        lines.append(f"{lhs}{',' if len(outs) == 1 else ''} = {rhs}")
        return
    tmp = namer.fresh("_r")
    lines.append(f"{tmp} = {rhs}")
    paths = _leaf_paths(tdef)
    if paths is None:
        lhs = ", ".join(namer(o) for o in outs)
        lines.append(f"{lhs}{',' if len(outs) == 1 else ''} = "
                     f"{namer.glob(tdef, 'tree')}.slot_values({tmp})")
    else:
        for o, path in zip(outs, paths):
            lines.append(f"{namer(o)} = {tmp}{path}")
    lines.append(f"del {tmp}")


def _last_uses(graph, keep):
    """``{expr index: [tensor nodes last read there]}``: generated code drops
    its reference to a tensor after its last use, so memory is freed as
    early as in eager code (a flat graph would otherwise hold every
    activation until it returns). Inputs and the nodes in ``keep`` stay."""
    last = {}
    for i, e in enumerate(graph._exprs):
        if isinstance(e, Input):
            continue
        for n in e._inputs:
            last[id(n)] = (i, n)
        for o in e.outputs:
            last.setdefault(id(o), (i, o))      # never read: dropped at once
    drops = {}
    for i, n in last.values():
        if isinstance(n, TensorNode) and not isinstance(n.expr, Input) and id(n) not in keep:
            drops.setdefault(i, []).append(n)
    return drops


def generate(graph, watch=(), end=()):
    """``(source, globals)`` of ``def forward(self, ...)`` for ``graph``.

    ``watch``: nodes whose values are passed to ``_watch(node_id, value)`` as
    they are computed; ``end``: nodes at which the function stops and returns
    their values as a list (set_watch_points / set_end_points).

    Raises:
        ValueError: an end point that this graph does not compute.
    """
    source, glb, _ = _generate(graph, watch, end, False)
    return source, glb


def _generate(graph, watch, end, hoist):
    """generate's ``(source, globals, paths)``; with ``hoist`` the function
    is ``forward(self, _attrs, ...)`` and reads each attribute path of self
    (a GetAttr expr's, listed in ``paths``) from ``_attrs[i]``, values the
    caller resolved beforehand, the original spelling in a comment."""
    namer = _Namer()
    namer.used.add("_attrs")
    paths = []
    namer.local[id(graph._inputs[0])] = "self"
    params = [namer(n) for n in graph._inputs[1:]]
    lines = []
    watch_ids = {id(n) for n in watch}
    remaining = {id(n) for n in end}
    keep = {id(n) for n in (end if end else graph._outputs)}
    drops = _last_uses(graph, keep)
    if watch_ids:
        namer.globals["_watch"] = None     # bound by compile_graph
    # a graph that writes into tensors runs on copies of its constant tensors, so
    # that no run changes what the next one starts from
    copy_constants = any(has_side_effect(e) for e in graph._exprs)
    for i, e in enumerate(graph._exprs):
        # (an Input's outputs are the parameters: no statement, but a watched
        # input is recorded as the run starts, and an input can be an end point)
        if isinstance(e, Input):
            pass
        elif copy_constants and isinstance(e, Constant) and isinstance(e.value, Tensor):
            _assign(e, f"{_rhs(e, namer)}.copy()", namer, lines)
        elif hoist and isinstance(e, GetAttr) and e.args[0] is graph._inputs[0] and len(e.outputs) == 1:
            lines.append(f"{namer(e.outputs[0])} = _attrs[{len(paths)}]  # {_rhs(e, namer)}")
            paths.append(e.name)
        else:
            _statement(e, namer, lines)
        for o in e.outputs:
            if id(o) in watch_ids:
                lines.append(f"_watch({o.id}, {namer(o)})")
            remaining.discard(id(o))
        if end and not remaining:
            break
        if i in drops:
            lines.append("del " + ", ".join(namer(n) for n in drops[i]))
    if end:
        if remaining:
            raise ValueError("set_end_points: some end points are not computed by this graph")
        lines.append("return [" + ", ".join(namer(n) for n in end) + "]")
    elif graph._out_def is None:
        lines.append("return None")
    else:
        lines.append("return " + _build_source(graph._out_def, iter(map(namer, graph._outputs)),
                                               namer))
    head = f"def forward(self{', _attrs' if hoist else ''}{''.join(', ' + p for p in params)}):"
    source = head + "\n" + "\n".join("    " + ln for ln in lines) + "\n"
    return _bound_names(namer.globals) + source, namer.globals, paths


def _bound_names(glb):
    """Comment lines saying what each name the code reads from outside is
    (a function, a recorded constant...), so the printed code explains every
    name it uses; F, apply, OpDef, operator and member are always there."""
    out = []
    for name, v in glb.items():
        if name in _FIXED_GLOBALS or name == "_watch":
            continue
        text = _describe(v)
        text = "".join(c if c.isprintable() else "?" for c in text)   # one comment line, always
        out.append(f"# {name} = {text if len(text) <= 90 else text[:87] + '...'}\n")
    return "".join(out)


def _describe(v):
    if isinstance(v, Tensor):
        return f"Tensor {qdtype_str(v.dtype)}{list(v.shape)} (a constant recorded by the trace)"
    if isinstance(v, TreeDef):
        return f"rebuilds a {getattr(v.type, '__qualname__', v.type)} from its leaves"
    if callable(v) and isinstance(getattr(v, "__qualname__", None), str):
        return f"{getattr(v, '__module__', None) or '?'}.{v.__qualname__}"
    if isinstance(v, np.dtype) and qdtype_name(v) is not None:      # repr() shows a quantized dtype as its storage dtype
        return qdtype_str(v)
    return repr(v)


def _statement(e, namer, lines):
    if isinstance(e, CallMethod) and e.method == _SETITEM and not e.outputs \
            and not e.kwargs and len(e.args) == 3:
        obj, idx, val = e.args
        lines.append(f"{namer(obj)}[{_index_literal(idx, namer)}] = {_literal(val, namer)}")
        return
    _assign(e, _rhs(e, namer), namer, lines)


def _build_source(tdef, names, namer):
    """Source for a value of structure ``tdef``, slots filled from the
    iterator ``names`` (source text), constants spelled by :func:`_literal`.
    Tuples, lists and dicts are spelled out; other containers (namedtuples,
    registered types) are rebuilt by their TreeDef's ``unflatten``."""
    t = tdef.type
    if t not in (_Root, tuple, list, dict):
        slots = [next(names) for _ in range(tdef.num_leaves)]
        return f"{namer.glob(tdef, 'tree')}.unflatten([{', '.join(slots)}])"
    parts = [_build_source(c, names, namer) if isinstance(c, TreeDef)
             else next(names) if c.is_slot else _literal(c.const, namer)
             for c in tdef.children]
    if t is _Root:
        return parts[0]
    if t is tuple:
        return f"({', '.join(parts)}{',' if len(parts) == 1 else ''})"
    if t is list:
        return f"[{', '.join(parts)}]"
    return "{" + ", ".join(f"{_literal(k, namer)}: {p}" for k, p in zip(tdef.aux, parts)) + "}"


def compile_graph(graph, watch=(), end=(), watch_fn=None):
    """The function ``forward(self, *input_values)`` that runs ``graph``."""
    return _compile_source(graph, *generate(graph, watch, end), watch, watch_fn)


def compile_hoisted(graph):
    """``(forward(self, _attrs, *input_values), paths)`` for ``graph``: the
    function reads the values of self's attribute ``paths`` from ``_attrs``
    (see _generate) instead of looking each up on every call."""
    source, glb, paths = _generate(graph, (), (), True)
    return _compile_source(graph, source, glb, (), None), tuple(paths)


# forward's code object by generated source, most recently used last: graphs
# of one structure (MiniLM's six layers; a model loaded again) compile once,
# each then gets a copy under its own file name (code.replace: no compile)
_CODE_CACHE_SIZE = 256
_code_cache = collections.OrderedDict()


def _forward_code(source):
    code = _code_cache.get(source)
    if code is None:
        ns = {}
        exec(compile(source, GENERATED, "exec"), {"__builtins__": builtins}, ns)
        code = _code_cache[source] = ns["forward"].__code__     # (defines, runs nothing)
        if len(_code_cache) > _CODE_CACHE_SIZE:
            _code_cache.popitem(last=False)
    else:
        _code_cache.move_to_end(source)
    return code


def _compile_source(graph, source, glb, watch, watch_fn):
    if watch:
        glb["_watch"] = watch_fn
    filename = f"{GENERATED}{graph.qualname}#{next(_files)}"
    # a loader in the globals lets linecache find the source again after
    # linecache.clearcache() (traceback asks it through lazycache)
    glb["__name__"], glb["__loader__"] = "mgtrace.generated", _Source(source)
    glb.setdefault("__builtins__", builtins)
    # our own generated source; names and values are never spliced in raw
    fn = types.FunctionType(_forward_code(source).replace(co_filename=filename), glb, "forward")
    _prune_linecache()
    linecache.cache[filename] = (functools.partial(str, source),)   # lazy: lines made on demand
    weakref.finalize(fn, _dead_files.append, filename)
    return fn


# File names of collected generated functions, whose linecache entries go at
# the next compile. Not at collection: a collection can run inside linecache's
# own loop over its keys (checkcache lists them, then reads each), which then
# fails with KeyError on the name removed under it (doctest and pdb hit it).
_dead_files = collections.deque()


def _prune_linecache():
    while _dead_files:
        linecache.cache.pop(_dead_files.popleft(), None)


class _Source:
    """What linecache asks for a generated function's source (``get_source``)."""

    def __init__(self, source):
        self._source = source

    def get_source(self, name):
        return self._source
