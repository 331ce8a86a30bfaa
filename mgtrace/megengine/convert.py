"""MegEngine's files as mgtrace objects: a state dict as a dict of Tensors,
a TracedModule (``.tm``) as an mgtrace TracedModule.

A ``.tm`` holds MegEngine's graphs (:mod:`mgtrace.megengine.reader`
reads them into inert records). Each MegEngine TracedModule becomes a
:class:`Replay` module: its builtin modules become mgtrace's (through
:mod:`mgtrace.megengine.table`), its tensors Parameters and buffers, its
graphs a forward that runs the graph's exprs with mgtrace's functions.
``mgtrace.trace_module`` then traces that forward at example inputs made
from the input shapes MegEngine recorded: shape reads stay symbolic, as
they were in MegEngine's graph, so the result runs at other batch sizes;
each MegEngine submodule with a graph becomes a TracedModule of its own,
with MegEngine's name.
"""
import inspect
import keyword
import warnings
from collections import OrderedDict

import numpy as np

import mgtrace
import mgtrace.module as M
from mgtrace._core import Tensor
from mgtrace.megengine import table as T
from mgtrace._core.dtype import qdtype_name
from mgtrace.megengine.reader import Global, MegEngineFileError, Stub, read_pickle
from mgtrace.quantization import QuantizationError, create_quantized_dtype, quant_dtype
from mgtrace.quantization.qdtype import tag
from mgtrace.traced_module.tracer import TraceWarning

__all__ = ["load", "loads", "convert", "Replay", "MAX_DEPTH", "MAX_EXPRS"]

MAX_DEPTH = 64              # modules in modules, and containers in containers, of one file
MAX_EXPRS = 1 << 16         # exprs of one graph (mgtrace's own limit)
MAX_STEPS = 1 << 20         # exprs run while one file is converted (graphs calling graphs
                            # twice at each of 40 levels would otherwise run 2**40 of them)

_TM = "megengine.traced_module."
_TRACED = _TM + "traced_module.TracedModule"
_STATE = _TM + "serialization._ModuleState"
_TENSORS = ("megengine.tensor.Tensor", "megengine.tensor.Parameter")

# what a MegEngine TracedModule's __dict__ holds besides the model itself
_INTERNAL = frozenset("""_modules name training quantize_disabled _forward_pre_hooks
    _forward_hooks _name _short_name argdef_graph_map argdef_outdef_map _is_top watch_points
    watch_node_value end_points is_qat argspec dump_info _m_dump_modulestate""".split())


def _kind(v):
    return v.kind if isinstance(v, Stub) else None


def _is(v, *kinds):
    return isinstance(v, Stub) and v.kind in kinds


def _expect(v, kind, where):
    if not _is(v, kind):
        got = v.kind if isinstance(v, Stub) else type(v).__name__
        raise MegEngineFileError(f"{where}: expected a {kind.rsplit('.', 1)[1]}, got {got}")
    return v


def _field(stub, key, types, where):
    v = stub.get(key)
    if not isinstance(v, types):
        raise MegEngineFileError(f"{where}: {key} is a {type(v).__name__}")
    return v


# ----------------------------------------------------------- tensors, data

def _array(stub, where):
    """The array of a MegEngine Tensor/Parameter record (its first argument)."""
    return T.tensor_array(stub, where)


# the NumPy dtypes the reader gives out that mgtrace's tensors have no counterpart for
_NO_TENSOR_DTYPES = frozenset(["uint32", "uint64"])
_QUANTIZED_NAMES = {"QuantizedS8": "qint8", "Quantized8Asymm": "quint8",
                    "QuantizedS32": "qint32", "QuantizedS4": "qint4",
                    "Quantized4Asymm": "quint4"}


def _quantized_dtype(mgb, where):
    """mgtrace's quantized dtype of MegEngine's ``mgb_dtype`` metadata (the
    reader checked its fields)."""
    try:
        return create_quantized_dtype(_QUANTIZED_NAMES[mgb["name"]], mgb["scale"],
                                      mgb.get("zero_point"))
    except QuantizationError as e:
        raise MegEngineFileError(f"{where}: {e}") from None


def _tensor_of(stub, where, parameter):
    """An mgtrace Tensor (or Parameter) of a MegEngine Tensor record or array;
    a quantized one (MegEngine's dtype metadata: qint8, quint8, qint32,
    qint4, quint4, with its scale and zero point) has mgtrace's quantized
    dtype of the same name, scale and zero point (QuantizedS8 reads as
    qint8: MegEngine's dtype does not say qint8_narrow)."""
    a = np.asarray(_array(stub, where), order="C")
    if a.dtype.name in _NO_TENSOR_DTYPES:
        raise T.UnsupportedError(f"{where}: an array of dtype {a.dtype.name}, which mgtrace's "
                                 "tensors do not have")
    mgb = (a.dtype.metadata or {}).get("mgb_dtype")
    if mgb is None:
        return M.Parameter(a) if parameter else mgtrace.tensor(a)
    dtype = _quantized_dtype(mgb, where)
    values = a.view(np.dtype(a.dtype.str))          # the integers, without the metadata
    if values.size and (values.min() < quant_dtype(qdtype_name(dtype)).qmin
                        or values.max() > quant_dtype(qdtype_name(dtype)).qmax):
        raise MegEngineFileError(f"{where}: values outside the range of {mgb['name']}")
    return tag(mgtrace.tensor(values), dtype)


_PLAIN = (type(None), bool, int, float, str, bytes)


def _const(v, where, depth=0):
    """A constant argument of a MegEngine expr as a plain value."""
    if depth > MAX_DEPTH:
        raise MegEngineFileError(f"{where}: constants nest deeper than {MAX_DEPTH}")
    if isinstance(v, _PLAIN):
        return v
    if isinstance(v, (tuple, list)):
        return type(v)(_const(x, where, depth + 1) for x in v)
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, Global) and v.qualname == "builtins.ellipsis":
        return Ellipsis
    if _kind(v) == "numpy.dtype":
        return v.dtype
    if _kind(v) in _TENSORS:
        return _tensor_of(v, where, False)
    raise T.UnsupportedError(f"{where}: a constant of type "
                             f"{v.kind if isinstance(v, Stub) else type(v).__name__}")


# ------------------------------------------------------------------ pytrees

class _Def:
    """MegEngine's TreeDef / LeafDef, checked: ``kind`` "leaf" (``leaf``:
    "tensor", "module" or "const" with ``const``) or a container type name
    ("tuple", "list", "dict", "OrderedDict", "slice") with ``keys`` and
    ``children``."""

    __slots__ = ("kind", "leaf", "const", "keys", "children", "count")

    @classmethod
    def of(cls, stub, where, depth=0):
        if depth > MAX_DEPTH:
            raise MegEngineFileError(f"{where}: a pytree deeper than {MAX_DEPTH}")
        d = cls()
        d.keys, d.children, d.const, d.leaf = None, [], None, None
        if _is(stub, _TM + "pytree.LeafDef"):
            d.kind, d.count = "leaf", 1
            types = stub.get("type")
            types = types if isinstance(types, tuple) else (types,)
            names = {getattr(t, "kind", None) or getattr(t, "qualname", None) for t in types}
            if names & set(_TENSORS):
                d.leaf = "tensor"
            elif "megengine.module.module.Module" in names:
                d.leaf = "module"
            else:
                d.leaf, d.const = "const", _const(stub.get("const_val"), where)
            return d
        _expect(stub, _TM + "pytree.TreeDef", where)
        t = stub.get("type")
        name = t.qualname if isinstance(t, Global) else None
        kinds = {"builtins.tuple": "tuple", "builtins.list": "list", "builtins.dict": "dict",
                 "collections.OrderedDict": "OrderedDict", "collections.defaultdict": "dict",
                 "builtins.slice": "slice"}
        if name not in kinds:
            raise T.UnsupportedError(f"{where}: a pytree node of type {name or t!r}")
        d.kind = kinds[name]
        children = stub.get("children_defs")
        if not isinstance(children, list):
            raise MegEngineFileError(f"{where}: a TreeDef without children_defs")
        d.children = [cls.of(c, where, depth + 1) for c in children]
        if d.kind in ("dict", "OrderedDict"):
            keys = stub.get("aux_data")
            if not (isinstance(keys, (tuple, list)) and len(keys) == len(d.children)):
                raise MegEngineFileError(f"{where}: dict keys do not match the children")
            d.keys = [_const(k, where) for k in keys]
        if d.kind == "slice" and len(d.children) != 3:
            raise MegEngineFileError(f"{where}: a slice pytree without 3 children")
        d.count = sum(c.count for c in d.children)
        return d

    def unflatten(self, leaves):
        """The value this tree describes, its leaves taken from the iterator
        ``leaves`` (constants come from the tree)."""
        if self.kind == "leaf":
            return next(leaves)
        vals = [c.unflatten(leaves) for c in self.children]
        if self.kind == "tuple":
            return tuple(vals)
        if self.kind == "list":
            return vals
        if self.kind == "slice":
            return slice(*vals)
        pairs = list(zip(self.keys, vals))
        return OrderedDict(pairs) if self.kind == "OrderedDict" else dict(pairs)

    def match(self, value, out):
        """Whether ``value`` has this structure (MegEngine's flattening:
        dict items by sorted key); appends its tensor and module leaves to
        ``out``."""
        if self.kind == "leaf":
            if self.leaf == "tensor":
                ok = isinstance(value, Tensor)
            elif self.leaf == "module":
                ok = isinstance(value, M.Module)
            else:
                return not isinstance(value, Tensor) and _same(value, self.const)
            if ok:
                out.append(value)
            return ok
        if self.kind in ("tuple", "list"):
            if not isinstance(value, (tuple, list)) or len(value) != len(self.children):
                return False
            items = value
        elif self.kind == "slice":
            if not isinstance(value, slice):
                return False
            items = (value.start, value.stop, value.step)
        else:
            if not isinstance(value, dict) or len(value) != len(self.keys):
                return False
            if any(k not in value for k in self.keys):
                return False
            items = [value[k] for k in self.keys]
        return all(c.match(v, out) for c, v in zip(self.children, items))

    def __repr__(self):
        if self.kind == "leaf":
            return "Tensor" if self.leaf == "tensor" else (
                "self" if self.leaf == "module" else repr(self.const))
        inner = ", ".join(map(repr, self.children))
        if self.keys is not None:
            inner = ", ".join(f"{k!r}: {c!r}" for k, c in zip(self.keys, self.children))
            return "{" + inner + "}"
        return f"[{inner}]" if self.kind == "list" else f"({inner})"


def _same(a, b):
    try:
        return type(a) is type(b) and bool(a == b) or (a is None and b is None)
    except Exception:
        return False


def _flatten_result(value, depth=0):
    """The leaves of a function's result in MegEngine's order."""
    if depth > MAX_DEPTH:
        raise MegEngineFileError(f"a result nested deeper than {MAX_DEPTH}")
    if type(value) in (tuple, list):
        return [x for v in value for x in _flatten_result(v, depth + 1)]
    if isinstance(value, dict):
        keys = list(value) if isinstance(value, OrderedDict) else sorted(value)
        return [x for k in keys for x in _flatten_result(value[k], depth + 1)]
    return [value]


# ------------------------------------------------------------------- graphs

class _Graph:
    """One MegEngine InternalGraph, checked and ready to run: ``in_def`` /
    ``out_def`` (the call's and the result's trees), inputs and outputs
    (node records) and exprs."""

    def __init__(self, in_stub, graph, out_stub, where, budget):
        self.budget = budget        # shared by every graph of one file: [steps left]
        self.where = where = f"{where} graph {graph.get('_qualname')!r}"
        self.in_def = _Def.of(in_stub, where)
        self.out_def = _Def.of(out_stub, where)
        self.inputs = _nodes(_field(graph, "_inputs", list, where), where)
        self.outputs = _nodes(_field(graph, "_outputs", list, where), where)
        self.exprs = _field(graph, "_exprs", list, where)
        if len(self.exprs) > MAX_EXPRS:
            raise MegEngineFileError(f"{where}: more than {MAX_EXPRS} exprs")
        n_in = sum(1 for _ in _tensor_module_leaves(self.in_def))
        if n_in != len(self.inputs):
            raise MegEngineFileError(f"{where}: {len(self.inputs)} input nodes for {n_in} "
                                     "inputs")
        if self.out_def.count != len(self.outputs):
            raise MegEngineFileError(f"{where}: {len(self.outputs)} output nodes for "
                                     f"{self.out_def.count} outputs")
        self.steps = [self._step(e, i) for i, e in enumerate(self.exprs)]

    def _step(self, e, i):
        where = f"{self.where} expr {i}"
        kind = _kind(e) or type(e).__name__
        if not isinstance(e, Stub):
            raise MegEngineFileError(f"{where}: an expr that is a {kind}")
        inputs = _nodes(_field(e, "inputs", list, where), where)
        outputs = _nodes(_field(e, "outputs", list, where), where)
        name = kind.rsplit(".", 1)[-1]
        if name == "Input":
            return None
        if name in ("CallMethod", "CallFunction"):
            arg_def = _Def.of(e.get("arg_def"), where)
            consts = e.get("const_val") or []
            if not isinstance(consts, list) or not all(
                    isinstance(c, tuple) and len(c) == 2 and type(c[0]) is int for c in consts):
                raise MegEngineFileError(f"{where}: malformed const_val")
            consts = [(idx, _const(v, where)) for idx, v in consts]
            if arg_def.count != len(inputs) + len(consts):
                raise MegEngineFileError(f"{where}: arguments do not match their tree")
            if name == "CallMethod":
                method = e.get("method")
                if not isinstance(method, str):
                    raise MegEngineFileError(f"{where}: a method name that is not a str")
                return ("method", e, where, inputs, outputs, arg_def, consts, method)
            func = e.get("func")
            if not (isinstance(func, tuple) and len(func) == 2
                    and all(isinstance(x, str) for x in func)):
                raise MegEngineFileError(f"{where}: a function that is not (module, name)")
            qualname = ".".join(func)
            return ("function", e, where, inputs, outputs, arg_def, consts,
                    (qualname, T.function_rule(qualname)))
        if name == "GetAttr":
            path = e.get("name")
            if not isinstance(path, str) or len(inputs) != 1 or len(outputs) != 1:
                raise MegEngineFileError(f"{where}: malformed GetAttr")
            return ("getattr", e, where, inputs, outputs, path)
        if name == "Constant":
            value = e.get("value")
            if _kind(value) not in _TENSORS or len(outputs) != 1:
                raise T.UnsupportedError(f"{where}: a Constant of "
                                         f"{_kind(value) or type(value).__name__} (only "
                                         "tensor constants are supported)")
            return ("constant", e, where, inputs, outputs, _tensor_of(value, where, False))
        if name == "Apply":
            state = e.get("opdef_state")
            op = state.get("opdef_type") if isinstance(state, dict) else None
            opname = op.qualname if isinstance(op, Global) else repr(op)
            if opname == "megengine.core._imperative_rt.ops.FakeQuant" and \
                    len(inputs) == 3 and len(outputs) == 1:
                return ("fake_quant", e, where, inputs, outputs,
                        T.fake_quant_range(state, where))
            if opname != "megengine.core._imperative_rt.ops.GetVarShape" \
                    or len(inputs) != 1 or len(outputs) != 1:
                raise T.UnsupportedError(f"{where}: MegEngine op {opname} has no mgtrace "
                                         "counterpart (only GetVarShape, a shape read, and "
                                         "FakeQuant)")
            axis = state.get("axis", 7)
            if type(axis) is not int:
                raise MegEngineFileError(f"{where}: GetVarShape axis {axis!r}")
            return ("shape", e, where, inputs, outputs, axis)
        raise T.UnsupportedError(f"{where}: a MegEngine expr of kind {kind}")

    def run(self, leaves):
        """The graph's output values, from the call's tensor and module leaves."""
        env = {id(n): v for n, v in zip(self.inputs, leaves)}

        def get(node, where):
            try:
                return env[id(node)]
            except KeyError:
                raise MegEngineFileError(f"{where}: uses a node no earlier expr made") from None

        for step in self.steps:
            if step is None:
                continue
            self.budget[0] -= 1
            if self.budget[0] < 0:
                raise MegEngineFileError(f"{_where_of(step)}: more than {MAX_STEPS} exprs run "
                                         "while converting this file")
            op, e, where, inputs, outputs = step[:5]
            values = [get(n, where) for n in inputs]
            if op == "getattr":
                results = [_get_path(values[0], step[5], where)]
            elif op == "constant":
                results = [step[5]]
            elif op == "shape":
                shape = tuple(values[0].shape)
                results = [shape if step[5] >= len(shape) or step[5] >= 7 else shape[step[5]]]
            elif op == "fake_quant":
                results = [T.fake_quant_op(*values, step[5], where)]
            else:
                arg_def, consts, target = step[5:]
                for idx, v in consts:
                    values.insert(idx, v)
                try:
                    args, kwargs = arg_def.unflatten(iter(values))
                except (TypeError, ValueError, StopIteration):
                    raise MegEngineFileError(f"{where}: arguments are not (args, kwargs)") \
                        from None
                if op == "function":
                    result = target[1].call(target[0], args, kwargs)
                else:
                    result = _call_method(target, args, kwargs, where)
                results = [] if result is None else _flatten_result(result)
            if len(results) != len(outputs):
                raise MegEngineFileError(f"{where}: {len(results)} results for "
                                         f"{len(outputs)} output nodes")
            for n, v in zip(outputs, results):
                env[id(n)] = v
        return [get(n, self.where + " outputs") for n in self.outputs]


def _where_of(step):
    return step[2]


_NODES = (_TM + "node.TensorNode", _TM + "node.ModuleNode")


def _nodes(values, where):
    """``values``, checked to be MegEngine node records."""
    for v in values:
        if not _is(v, *_NODES):
            raise MegEngineFileError(f"{where}: a graph node that is a "
                                     f"{_kind(v) or type(v).__name__}")
    return values


def _tensor_module_leaves(d):
    if d.kind == "leaf":
        if d.leaf != "const":
            yield d
    else:
        for c in d.children:
            yield from _tensor_module_leaves(c)


def _get_path(obj, path, where):
    """MegEngine's GetAttr: ``path`` ("blocks.0", "heads.a", "bn.weight")
    from module ``obj``, through its members only. A builtin module's
    tensor comes in MegEngine's shape (a conv bias (1, C, 1, 1), BatchNorm's
    statistics (1, C, 1, 1)), as MegEngine's forward would see it."""
    for part in path.split("."):
        if isinstance(obj, (list, tuple)) and part.isdigit() and int(part) < len(obj):
            obj = obj[int(part)]
        elif isinstance(obj, dict) and part in obj:
            obj = obj[part]
        elif isinstance(obj, Replay) and part in obj.__dict__["_megengine_members"]:
            obj = getattr(obj, part)
        elif isinstance(obj, M.Module) and (part in obj._parameters or part in obj._buffers) \
                and getattr(obj, part) is not None:
            owner, obj = obj, getattr(obj, part)
            shapes = owner._megengine_layout().get(part) if hasattr(
                owner, "_megengine_layout") else None
            if shapes and tuple(shapes[-1]) != tuple(obj.shape):
                obj = obj.reshape(shapes[-1])      # the last accepted shape is the module's own
        else:
            raise MegEngineFileError(f"{where}: no attribute {path!r}")
    return obj


def _call_method(method, args, kwargs, where):
    if not args:
        raise MegEngineFileError(f"{where}: a method call without its object")
    obj, rest = args[0], args[1:]
    if isinstance(obj, M.Module):
        if method != "__call__":
            raise T.UnsupportedError(f"{where}: a call of module method {method!r} (only "
                                     "module calls are supported)")
        return obj(*rest, **kwargs)
    if method not in T.TENSOR_METHODS:
        raise T.UnsupportedError(f"{where}: Tensor method {method!r} has no mgtrace "
                                 "counterpart in mgtrace.megengine.table.TENSOR_METHODS")
    if method == "__getitem__" and isinstance(obj, tuple):       # a shape read
        return obj[rest[0]] if len(rest) == 1 and not kwargs else obj.__getitem__(*rest)
    if not isinstance(obj, Tensor):
        raise MegEngineFileError(f"{where}: Tensor method {method} called on a "
                                 f"{type(obj).__name__}")
    return getattr(obj, method)(*rest, **kwargs)


# ------------------------------------------------------------------ modules

class Replay(M.Module):
    """A MegEngine TracedModule, rebuilt with mgtrace modules: its forward
    runs MegEngine's graph (the one whose call signature matches the
    arguments) with mgtrace's functions. :func:`load` traces it into an
    mgtrace TracedModule; it is not meant to be kept."""

    def forward(self, *args, **kwargs):
        spec = self.__dict__["_argspec"]
        if spec is not None:
            args, kwargs = _kwargs_to_args(spec, args, kwargs)
        for g in self.__dict__["_mge_graphs"]:
            leaves = []
            if g.in_def.match(((self,) + tuple(args), kwargs), leaves):
                return g.out_def.unflatten(iter(g.run(leaves)))
        forms = "; ".join(repr(g.in_def) for g in self.__dict__["_mge_graphs"])
        raise TypeError(f"{self.__dict__['_orig_name']}: MegEngine traced this module for "
                        f"the calls ((self, *args), kwargs) = {forms or 'none'}, not for "
                        "these arguments")


def _kwargs_to_args(spec, args, kwargs):
    """MegEngine's rule: keywords that name positional parameters become
    positional (defaults filled in), as its TracedModule.forward does."""
    names, defaults = spec
    args, kwargs = list(args), dict(kwargs)
    for i in range(len(args), len(names)):
        if names[i] in kwargs:
            args.append(kwargs.pop(names[i]))
        elif i >= len(names) - len(defaults):
            args.append(defaults[i - len(names) + len(defaults)])
        else:
            break
    return tuple(args), kwargs


def _signature(spec_stub, where):
    """(inspect.Signature of forward without self, (positional names,
    defaults)) from MegEngine's FullArgSpec record, or (None, None)."""
    if not _is(spec_stub, "inspect.FullArgSpec") or len(spec_stub.args) != 7:
        return None, None
    args, varargs, varkw, defaults, kwonly, kwdefaults, _ = spec_stub.args
    if not (isinstance(args or [], list) and isinstance(kwonly or [], list)
            and isinstance(defaults or (), tuple) and isinstance(kwdefaults or {}, dict)):
        return None, None       # (a bool there was iterated: a bare TypeError)
    names = [a for a in (args or [])[1:]]
    everything = names + list(kwonly or []) + [v for v in (varargs, varkw) if v]
    if not all(isinstance(n, str) and n.isidentifier() and not keyword.iskeyword(n)
               for n in everything) or len(set(everything)) != len(everything):
        return None, None
    defaults = tuple(_const(d, where) for d in (defaults or ()))
    kwdefaults = {k: _const(v, where) for k, v in dict(kwdefaults or {}).items()}
    P = inspect.Parameter
    params = []
    for i, n in enumerate(names):
        j = i - (len(names) - len(defaults))
        params.append(P(n, P.POSITIONAL_OR_KEYWORD,
                        default=defaults[j] if j >= 0 else P.empty))
    if varargs:
        params.append(P(varargs, P.VAR_POSITIONAL))
    for n in kwonly or []:
        params.append(P(n, P.KEYWORD_ONLY, default=kwdefaults.get(n, P.empty)))
    if varkw:
        params.append(P(varkw, P.VAR_KEYWORD))
    try:
        return inspect.Signature(params), (names, defaults)
    except ValueError:
        return None, None


def _tensors(rule, state, prefix, where, out):
    """The arrays of a builtin module's saved state (and of its parts'),
    by state_dict key."""
    if callable(rule.tensors):
        for name, a in rule.tensors(state, where).items():
            out[prefix + name] = a
    else:
        for name in rule.tensors:
            v = state.get(name)
            if v is not None:
                out[prefix + name] = _array(v, f"{where}.{name}")
    for child in rule.children:
        if state.get(child) is None:
            continue        # a QAT module without that observer or fake quantizer
        qualname, cstate = T.module_record(state.get(child), f"{where}.{child}")
        _tensors(T.module_rule(qualname), cstate, f"{prefix}{child}.", f"{where}.{child}", out)


class _Builder:
    """Turns the records of one file into mgtrace modules, each record once
    (a module shared by two attributes stays shared)."""

    def __init__(self, path):
        self.path = path
        self.done = {}
        self.budget = [MAX_STEPS]

    def module(self, stub, where, depth=0):
        if depth > MAX_DEPTH:
            raise MegEngineFileError(f"{where}: modules nest deeper than {MAX_DEPTH}")
        if id(stub) in self.done:
            return self.done[id(stub)]
        if _is(stub, _STATE) or _kind(stub) in T.MODULES:
            m = self._builtin(stub, where)
        else:
            m = self._traced(_expect(stub, _TRACED, where), where, depth)
        self.done[id(stub)] = m
        return m

    def _builtin(self, stub, where):
        qualname, state = T.module_record(stub, where)
        rule = T.module_rule(qualname)
        where = f"{where} ({qualname})"
        try:
            m = rule.make(state, where)
        except MegEngineFileError:
            raise
        except (TypeError, ValueError) as e:
            raise MegEngineFileError(f"{where}: its settings do not make an mgtrace "
                                     f"{rule.cls.__name__}: {e}") from None
        except MemoryError:
            raise MegEngineFileError(f"{where}: its settings make an mgtrace "
                                     f"{rule.cls.__name__} larger than this machine's memory "
                                     "(sizes that do not fit the file's tensors?)") from None
        tensors = {}
        if not rule.own_tensors:
            _tensors(rule, state, "", where, tensors)
            try:
                m.load_state_dict(tensors, strict=True, layout="megengine")
            except Exception as e:
                raise MegEngineFileError(f"{where}: its tensors do not fit mgtrace's "
                                         f"{rule.cls.__name__}: {e}") from None
        m.train(state.get("training") is True)
        return m

    def _traced(self, stub, where, depth):
        graphs = stub.get("argdef_graph_map")
        outs = stub.get("argdef_outdef_map")
        if not isinstance(graphs, dict) or not isinstance(outs, dict):
            raise MegEngineFileError(f"{where}: a TracedModule without its graph maps")
        m = Replay()
        members = {}
        for key, value in (stub.state or {}).items():
            if not isinstance(key, str) or key in _INTERNAL:
                continue
            converted = self._member(value, f"{where}.{key}", depth)
            if converted is not None:
                if not key.isidentifier() and not key.isdigit() or hasattr(M.Module, key):
                    raise MegEngineFileError(f"{where}: member name {key[:40]!r} (not a name, "
                                             "or one of Module's own)")
                members[key] = converted
        if not graphs and members and all(k.isdigit() for k in members) and sorted(
                map(int, members)) == list(range(len(members))):
            return [members[str(i)] for i in range(len(members))]   # a list container
        if not graphs and members and (any(k.isdigit() for k in members) or all(
                isinstance(v, M.Module) for v in members.values())):
            return members            # a dict container (MegEngine keeps no graph for one)
        if stub.get("is_qat") is True:
            _carry_qparams(members)
        for key, value in members.items():
            setattr(m, key, value)
        m.__dict__["_megengine_members"] = frozenset(members)
        mge_graphs = []
        for in_stub, g in graphs.items():
            if in_stub not in outs:
                raise MegEngineFileError(f"{where}: a graph without its output tree")
            mge_graphs.append(_Graph(in_stub, _expect(g, _TM + "traced_module.InternalGraph",
                                                       where), outs[in_stub], where,
                                     self.budget))
        first = next(iter(graphs.values()), None)
        orig = first.get("_name") if isinstance(first, Stub) else None
        orig = orig if isinstance(orig, str) and orig.isidentifier() else "MegEngineModule"
        object.__setattr__(m, "_orig_name", orig)
        object.__setattr__(m, "_mge_graphs", mge_graphs)
        sig, spec = _signature(stub.get("argspec"), where)
        object.__setattr__(m, "_argspec", spec)
        if sig is not None:
            object.__setattr__(m, "_signature", sig)
        # its own flag only: MegEngine keeps one per module, and trace_module gives the
        # top TracedModule training=True even where every submodule was put in eval mode
        m.__dict__["training"] = stub.get("training") is True
        return m

    def _member(self, value, where, depth):
        """A member of a TracedModule as mgtrace holds it: modules, tensors
        and plain containers of them; None for anything else."""
        if _is(value, _TRACED, _STATE) or _kind(value) in T.MODULES:
            return self.module(value, where, depth + 1)
        if _kind(value) in _TENSORS:
            return _tensor_of(value, where, _kind(value) == "megengine.tensor.Parameter")
        if isinstance(value, (list, tuple)) and depth < MAX_DEPTH:
            items = [self._member(v, f"{where}.{i}", depth + 1) for i, v in enumerate(value)]
            return type(value)(items) if items and all(i is not None for i in items) else None
        return None


def _carry_qparams(members):
    """A user's QAT module (MegEngine traced into it: ``is_qat``): each
    (observer, fake quantizer) pair becomes observer None and a
    FakeQuantize carrying the pair's qparams, what mgtrace's trace does to
    such a module (:func:`mgtrace.module.qat.module.plain_quant_children`):
    the qparams an observer hands its fake quantizer are no graph value."""
    from mgtrace.module.qat.module import _carrier, _learns
    for kind in ("weight", "act"):
        obs, fq = members.get(f"{kind}_observer"), members.get(f"{kind}_fake_quant")
        if isinstance(obs, M.Module) and isinstance(fq, M.Module) and not _learns(fq):
            members[f"{kind}_observer"] = None
            members[f"{kind}_fake_quant"] = _carrier(obs, fq)


def _example_inputs(graph, rng):
    """Arguments for ``graph``'s call made from the shapes and dtypes
    MegEngine recorded on its input nodes (uniform in [-1, 1))."""
    values = []
    for node in graph.inputs[1:]:
        shape, dtype = node.get("_shape"), node.get("_dtype")
        if not (isinstance(shape, tuple) and all(type(n) is int and 0 <= n < 1 << 20
                                                 for n in shape)):
            raise MegEngineFileError(f"{graph.where}: an input node without a usable recorded "
                                     "shape: give example inputs (load(path, example_inputs=...)"
                                     ", or mgtrace import-megengine --inputs FILE.py:FUNCTION)")
        dt = dtype.dtype if _kind(dtype) == "numpy.dtype" else np.dtype("float32")
        mgb = (dt.metadata or {}).get("mgb_dtype")
        if mgb is not None:     # a quantized input (an int8 model without a QuantStub)
            real = mgtrace.tensor(rng.uniform(-1, 1, shape).astype(np.float32))
            values.append(real.astype(_quantized_dtype(mgb, graph.where)))
        else:
            values.append(mgtrace.tensor(rng.uniform(-1, 1, shape).astype(dt)))
    leaves = iter([None] + values)      # the module leaf (self) comes first
    (args, kwargs) = graph.in_def.unflatten(leaves)
    return tuple(args[1:]), dict(kwargs)


# -------------------------------------------------------------------- entry

def loads(data, *, where="<bytes>", example_inputs=None, example_kwargs=None):
    """:func:`load` for the bytes of a file."""
    return convert(data, where, example_inputs, example_kwargs)[0]


def convert(data, where="<bytes>", example_inputs=None, example_kwargs=None):
    """``(obj, args, kwargs)``: what :func:`load` returns for the bytes
    ``data``, and for a TracedModule the arguments it was traced with (both
    None for a state dict)."""
    obj = read_pickle(data, where)
    if isinstance(obj, dict):
        return _state_dict(obj, where), None, None
    if _is(obj, _TRACED):
        return _traced_module(obj, where, example_inputs, example_kwargs)
    raise MegEngineFileError(f"{where}: neither a state dict nor a TracedModule (a "
                             f"{_kind(obj) or type(obj).__name__})")


def load(path, *, example_inputs=None, example_kwargs=None):
    """Read a file MegEngine wrote with ``megengine.save``, running none of
    its code.

    Args:
        path: a state dict (``.pkl``, ``megengine.save(model.state_dict())``)
            or a TracedModule (``.tm``, ``megengine.save(traced_module)``).
        example_inputs, example_kwargs: for a ``.tm``, the arguments to
            trace the converted module with; by default arguments of the
            shapes and dtypes MegEngine recorded for the graph's inputs
            (seeded random values). Symbolic shape reads stay symbolic, so
            the result runs at other batch sizes either way.

    Returns:
        For a state dict, an OrderedDict of name -> Tensor in MegEngine's
        shapes (load it with ``module.load_state_dict(sd,
        layout="megengine")``); a quantized array (an int8 weight of
        MegEngine's quantized model) is a Tensor of mgtrace's quantized
        dtype of the same name, scale and zero point (QuantizedS8 reads as
        qint8: MegEngine's dtype does not say qint8_narrow). For a
        ``.tm``, an eval-mode (or train-mode, as saved)
        :class:`mgtrace.TracedModule` whose submodules, names and
        state_dict keys are MegEngine's.

    Raises:
        ForbiddenGlobalError: the pickle names a global outside the
            reader's allowlist (see :mod:`mgtrace.megengine.reader`).
        UnsupportedError: a MegEngine module, function, method or op with no
            mgtrace counterpart (:mod:`mgtrace.megengine.table`), named.
        MegEngineFileError: anything else wrong with the file (a quantized
            dtype's metadata outside MegEngine's closed set, a scale that is
            not finite and positive, integers outside the dtype's range...).
        OSError: the file cannot be read.
    """
    with open(path, "rb") as f:
        data = f.read()
    return loads(data, where=str(path), example_inputs=example_inputs,
                 example_kwargs=example_kwargs)


def _state_dict(obj, where):
    out = OrderedDict()
    for k, v in obj.items():
        if not isinstance(k, str):
            raise MegEngineFileError(f"{where}: a state dict key of type {type(k).__name__}")
        out[k] = _tensor_of(v, f"{where}[{k!r}]", False)
    return out


def _traced_module(stub, where, example_inputs, example_kwargs):
    root = _Builder(where).module(stub, where)
    if not isinstance(root, Replay) or not root.__dict__["_mge_graphs"]:
        raise MegEngineFileError(f"{where}: the TracedModule has no graph")
    if example_inputs is None:
        rng = np.random.RandomState(0)
        example_inputs, kw = _example_inputs(root.__dict__["_mge_graphs"][0], rng)
        example_kwargs = kw if example_kwargs is None else example_kwargs
    elif not isinstance(example_inputs, tuple):
        example_inputs = (example_inputs,)
    example_kwargs = dict(example_kwargs or {})
    with warnings.catch_warnings():
        # MegEngine's tensor constants are kept as constants: that is right here
        warnings.filterwarnings("ignore", ".*a tensor made outside the traced calls",
                                TraceWarning)
        try:
            tm = mgtrace.trace_module(root, *example_inputs, **example_kwargs)
        except MegEngineFileError:
            raise
        except Exception as e:
            # the graph ran mgtrace's functions on the constants the file gave them: a
            # TypeError or ValueError there is a bad file, said as such
            raise MegEngineFileError(f"{where}: the converted module does not run on its "
                                     f"example inputs: {type(e).__name__}: {e}") from None
    for m in tm.modules():           # what only the Replay needed
        for name in ("_megengine_members", "_mge_graphs", "_argspec"):
            m.__dict__.pop(name, None)
    return tm, example_inputs, example_kwargs
