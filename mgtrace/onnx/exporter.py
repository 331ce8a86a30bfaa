"""TracedModule -> ONNX ModelProto (:func:`export`).

The module is flattened (builtin modules stay calls) and its graph walked
once, expr by expr; each expr goes through its row of
:mod:`mgtrace.onnx.mapping`. Graph values become ONNX values named after
the traced nodes, parameters and buffers initializers named by their
state_dict keys, and shape reads ``Shape``/``Gather`` nodes whose
arithmetic stays in the graph. The finished model passes
``onnx.checker.check_model(full_check=True)`` and strict shape inference
before a byte is written.
"""
import functools
import operator

import numpy as np

from mgtrace.onnx import mapping
from mgtrace.onnx import _convert as C
from mgtrace.onnx import _quant
from mgtrace.onnx._builder import Builder, ExportError, V

__all__ = ["export", "max_opset", "ExportError"]

def _require():
    try:
        import onnx
    except ImportError:
        raise ImportError("mgtrace.onnx needs the onnx package: pip install 'mgtrace[onnx]' "
                          "(or pip install onnx onnxruntime)") from None
    return onnx


@functools.lru_cache(maxsize=1)
def _ort_max_opset(top):
    """The newest opset up to ``top`` whose models the installed onnxruntime
    loads (probed with a one-node model: ORT names no such number), None
    without onnxruntime."""
    try:
        import onnxruntime as ort
    except ImportError:
        return None
    from onnx import TensorProto, helper
    info = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1]) for n in "xy"]
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "probe", info[:1],
                              info[1:])
    opts = ort.SessionOptions()
    opts.log_severity_level = 4
    for opset in range(top, 12, -1):
        ids = [helper.make_opsetid("", opset)]
        model = helper.make_model(graph, opset_imports=ids,
                                  ir_version=helper.find_min_ir_version_for(ids))
        try:
            ort.InferenceSession(model.SerializeToString(), opts,
                                 providers=["CPUExecutionProvider"])
        except Exception:       # onnxruntime raises its own classes: "Unsupported opset"
            continue
        return opset
    return None


@functools.lru_cache(maxsize=None)
def _ort_qdq_opset(top, kind, dtype):
    """The newest opset up to ``top`` at which the installed onnxruntime runs
    ``kind`` "q" (QuantizeLinear -> DequantizeLinear -> Reshape on
    ``dtype``) or "dq" (DequantizeLinear of a ``dtype`` initializer) and gets
    the right values; None without onnxruntime. ORT 1.32 has no kernels for
    them at opset 28, and from opset 21 its QDQ propagation rewrites an int8
    pair before a Reshape into a node it then refuses (output_dtype INT8
    against a UINT8 zero point)."""
    try:
        import onnxruntime as ort
    except ImportError:
        return None
    from onnx import TensorProto, helper, numpy_helper
    dt = np.dtype(dtype)
    init = [numpy_helper.from_array(np.array(0.5, np.float32), "s"),
            numpy_helper.from_array(np.array(0, dt), "z"),
            numpy_helper.from_array(np.array([-1], np.int64), "shape")]
    if kind == "dq":
        init.append(numpy_helper.from_array(np.array([4, 6], dt), "c"))
        nodes = [helper.make_node("DequantizeLinear", ["c", "s", "z"], ["d"]),
                 helper.make_node("Add", ["x", "d"], ["y"])]
        x, want = np.zeros(2, np.float32), np.array([2.0, 3.0], np.float32)
    else:
        nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]),
                 helper.make_node("DequantizeLinear", ["q", "s", "z"], ["d"]),
                 helper.make_node("Reshape", ["d", "shape"], ["r"]),
                 helper.make_node("Neg", ["r"], ["y"])]
        x = np.array([-1.0, 1.0], np.float32)
        want = np.array([1.0 if dt.kind == "i" else 0.0, -1.0], np.float32)
    graph = helper.make_graph(
        nodes, "probe", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], init)
    opts = ort.SessionOptions()
    opts.log_severity_level = 4
    for opset in range(top, 12, -1):
        ids = [helper.make_opsetid("", opset)]
        model = helper.make_model(graph, opset_imports=ids,
                                  ir_version=helper.find_min_ir_version_for(ids))
        try:
            sess = ort.InferenceSession(model.SerializeToString(), opts,
                                        providers=["CPUExecutionProvider"])
            if np.array_equal(sess.run(None, {"x": x})[0], want):
                return opset
        except Exception:       # onnxruntime's own classes: NOT_IMPLEMENTED, FAIL
            continue
    return None


def qdq_max_opset(uses):
    """The newest opset at which the installed onnxruntime runs the QDQ
    nodes ``uses`` (pairs ("q" or "dq", storage dtype name)); None: no
    limit, or no onnxruntime."""
    top = max_opset()
    caps = [c for c in (_ort_qdq_opset(top, k, d) for k, d in uses) if c]
    return min(caps) if caps else None


def max_opset():
    """The newest opset both the installed ``onnx`` and (when installed)
    ``onnxruntime`` support: :func:`export`'s default."""
    onnx = _require()
    top = onnx.defs.onnx_opset_version()
    ort = _ort_max_opset(top)
    return min(top, ort) if ort else top


def _pick_opset(opset):
    top = max_opset()
    if opset is None:
        return top
    if isinstance(opset, bool) or not isinstance(opset, (int, np.integer)):
        raise TypeError(f"export: opset must be an int, got {type(opset).__name__}")
    opset = int(opset)
    if not mapping.MIN_OPSET <= opset <= top:
        raise ExportError(f"export: opset {opset} is not supported: mgtrace exports opsets "
                          f"{mapping.MIN_OPSET} to {top} (the newest the installed onnx and "
                          f"onnxruntime both support)")
    return opset


class _Spec:
    """What the trace recorded for one output: dtype and shape."""
    __slots__ = ("dtype", "shape")

    def __init__(self, node):
        if node.kind == "value":
            self.dtype = np.dtype(np.int64 if isinstance(node.value, (int, np.integer))
                                  else np.float32)
            self.shape = ()
        else:
            self.dtype = None if node.dtype is None else np.dtype(node.dtype)
            self.shape = tuple(node.shape) if node.shape is not None else ()


class _Module:
    """A module reached by GetAttr: the object and its state_dict prefix;
    ``drop``: a leading attribute name that names no state_dict level (the
    wrapper of a decomposed builtin module)."""
    __slots__ = ("obj", "path", "drop")

    def __init__(self, obj, path, drop=None):
        self.obj, self.path, self.drop = obj, path, drop


class _Body:
    """The body of an F function or the forward of a builtin module, traced
    as a module of its own for :meth:`_Exporter.decompose` (built lazily:
    mgtrace.module is imported by the exporter's caller anyway)."""

    @staticmethod
    def make(call, m=None):
        from mgtrace.module import Module

        class Body(Module):
            def forward(self, *xs):
                return call(self, xs)
        body = Body()
        if m is not None:
            body.m = m
        return body


def _pyops():
    from mgtrace._core import op_table
    return {getattr(operator, op.pyop): op.name
            for op in list(op_table.OPS.values()) + [op_table.POS] if op.pyop}


_PYOPS = _pyops()


class _Exporter:
    def __init__(self, tm, opset, dynamic, input_names, output_names, contrib_ops=False,
                 quant_format="qdq"):
        from mgtrace._core import op_table
        self.tm, self.opset, self.dynamic = tm, opset, dynamic
        self.quant_format = quant_format
        self.input_names, self.output_names = input_names, output_names
        self.b = Builder(opset, contrib_ops)
        self.env = {}
        self.params = {}            # id(tensor) -> V
        self.by_method = op_table.by_method()
        self.ops = op_table.OPS
        self.inputs, self.outputs = [], []
        self.prefix = ""            # qualname of the decomposed call being converted
        self.bodies = []            # the traced bodies of decomposed calls

    # ------------------------------------------------------------ values
    def value(self, v):
        if hasattr(v, "kind") and hasattr(v, "users"):        # a graph Node
            try:
                return self.env[id(v)]
            except KeyError:
                raise self.b.error(f"node {v!r} is read before it is defined") from None
        if isinstance(v, tuple):
            return tuple(self.value(x) for x in v)
        if isinstance(v, list):
            return [self.value(x) for x in v]
        if isinstance(v, dict):
            return {k: self.value(x) for k, x in v.items()}
        if isinstance(v, slice):
            return slice(self.value(v.start), self.value(v.stop), self.value(v.step))
        from mgtrace._core import Tensor
        if isinstance(v, Tensor):
            return self.b.const(v.numpy())
        return v

    def param(self, t, name):
        """A parameter or buffer as an initializer named by its state_dict key."""
        key = id(t)
        if key not in self.params:
            arr = t.numpy()
            self.params[key] = self.b.const(arr, name=name)
        return self.params[key]

    # ------------------------------------------------------------- graph
    def run(self):
        from onnx import helper
        tm = self.tm
        graph = tm.graph
        nodes = graph.inputs
        names = list(self.input_names or [])
        for i, n in enumerate(nodes[1:]):
            if n.kind != "tensor":
                raise ExportError(f"export: input {n.name!r} is not a tensor")
            name = self.b.reserve(names[i] if i < len(names) else n.name)
            shape = tuple(n.shape)
            dims = [f"{name}_dim{k}" if self.dynamic else s for k, s in enumerate(shape)]
            self.inputs.append(helper.make_tensor_value_info(
                name, helper.np_dtype_to_tensor_dtype(np.dtype(n.dtype)), dims))
            self.env[id(n)] = V(name, n.dtype, shape)
            self.b.shapes[name] = shape
        self.walk(graph, _Module(tm, ""))
        out_nodes = graph.outputs
        names = list(self.output_names or [])
        for i, n in enumerate(out_nodes):
            v = self.env.get(id(n))
            if not isinstance(v, V):
                raise ExportError(f"export: output {i} ({n!r}) is not a tensor; ONNX outputs "
                                  f"are tensors")
            if v.blocked is not None:
                v = C.unblock(self.b, v)
            name = self.b.reserve(names[i] if i < len(names) else n.name)
            if i < len(names) and name != names[i]:
                # the file's output would be named f"{name}", not what was asked
                raise ExportError(f"export: output_names[{i}] {names[i]!r} is already the "
                                  f"name of an initializer or a value of the graph; choose "
                                  f"another")
            self.b.scope = "output"
            self.b.nodes.append(helper.make_node("Identity", [v.name], [name],
                                                 name=self.b.fresh(f"output/{name}")))
            dims = [None] * len(n.shape) if n.shape is not None else None
            self.outputs.append(helper.make_tensor_value_info(
                name, helper.np_dtype_to_tensor_dtype(v.dtype), dims))
        name = getattr(tm, "_orig_name", None) or "mgtrace"
        return helper.make_graph(self.b.nodes, name, self.inputs,
                                 self.outputs, self.b.initializers)

    def walk(self, graph, module):
        """Convert the exprs of ``graph`` (of ``module``, a _Module), calls of
        traced submodules inlined (as TracedModule.flatten does, without its
        copy)."""
        from mgtrace.traced_module.graph import called_graph
        from mgtrace.traced_module.pytree import tree_flatten
        from mgtrace.traced_module.tracer import bind_arguments
        from mgtrace.traced_module import TracedModule
        self.env[id(graph.inputs[0])] = module
        for e in graph.exprs(recursive=False):
            if e.kind == "input":
                continue
            self.b.scope = self._scope(e)
            self.b.source = e.source
            sub = called_graph(e) if e.kind == "call_method" else None
            callee = self.env.get(id(e.args[0])) if sub is not None else None
            if isinstance(callee, _Module) and isinstance(callee.obj, TracedModule):
                args = self.value(tuple(e.args[1:]))
                kwargs = self.value(e.kwargs)
                canon = bind_arguments(callee.obj._signature, args, kwargs,
                                       callee.obj._orig_name)
                leaves = tree_flatten(canon, lambda v: isinstance(v, V))[0]
                for n, v in zip(sub.inputs[1:], leaves):
                    self.env[id(n)] = v
                self.walk(sub, callee)
                for o, so in zip(e.outputs, sub.outputs):
                    self.env[id(o)] = self.env[id(so)]
                continue
            pooled = _quant.avg_pool_source(e)
            if pooled is not None and getattr(self.value(pooled), "q", None) is not None:
                raise self.b.error("an average pool of a quantized tensor (int8 on its "
                                   "integers, the exact mean rounded half to even) has no "
                                   "exact ONNX form; put the DequantStub before the pool")
            result = self.expr(e)
            if isinstance(result, V) and result.q is None and _quant.keeps_qparams(e):
                src = self.value(_quant.qparams_source(e))
                if isinstance(src, V) and src.q is not None:
                    result = V(result.name, result.dtype, result.shape, result.blocked, src.q)
            if self._writes_in_place(e):
                # x[index] = value: later reads of x's node see the new value
                self.env[id(e.args[0])] = result
                continue
            self.bind(e, e.outputs, result)

    @staticmethod
    def _writes_in_place(e):
        return (e.kind == "call_method" and e.method == "__setitem__" or
                e.kind == "apply" and getattr(e.op, "name", None) == "setitem" and
                not e.outputs)

    def _scope(self, e):
        if e.outputs:
            q = str(e.outputs[0].qualname or e.outputs[0].name)
        else:
            q = f"expr{e.id}"
        return f"{self.prefix}/{q}" if self.prefix else q

    def bind(self, e, outs, result):
        if not outs:
            return
        if len(outs) == 1 and not isinstance(result, (list, tuple)):
            result = [result]
        result = list(result)
        if len(result) != len(outs):
            raise self.b.error(f"{len(result)} ONNX values for {len(outs)} outputs")
        for r_node, r in zip(outs, result):
            n = r_node
            if isinstance(r, V) and r.blocked is None:
                want = _Spec(n).dtype
                if want is not None and r.dtype != want:
                    r = self.b.cast(r, want)
                if n.kind == "tensor" and n.shape is not None:
                    r = V(r.name, r.dtype, tuple(n.shape), q=r.q)
                    self.b.shapes[r.name] = r.shape
            self.env[id(r_node)] = r

    # ------------------------------------------------------------- exprs
    def expr(self, e):
        k = e.kind
        if k == "getattr":
            owner = self.env[id(e.args[0])]
            obj = owner.obj
            for part in e.name.split("."):
                obj = getattr(obj, part)
            name = e.name
            if owner.drop and name.startswith(owner.drop + "."):
                name = name[len(owner.drop) + 1:]
            path = f"{owner.path}.{name}" if owner.path else name
            from mgtrace._core import Tensor
            if isinstance(obj, Tensor):
                return self.param(obj, path)
            return _Module(obj, path)
        if k == "constant":
            return self.value(e.value)
        if k == "apply":
            return self.core(e.op, [self.value(a) for a in e.args], self.value(e.kwargs), e)
        if k == "call_method":
            return self.method(e)
        if k == "call_function":
            return self.function(e)
        raise self.b.error(f"an expr of kind {k!r} has no ONNX form")

    def method(self, e):
        self_v = self.value(e.args[0])
        if isinstance(self_v, _Module):
            if e.method != "__call__":
                raise self.b.error(f"module method {e.method!r} has no ONNX form")
            return self.module(e, self_v)
        if e.method == "shape":
            x = self.plain(self_v)
            shape = self.b.shape_of(x)
            return [self.b.op("Gather", [shape, self.b.const(np.int64(i))], np.int64, (), axis=0)
                    for i in range(len(e.outputs))]
        args = [self.value(a) for a in e.args]
        kwargs = self.value(e.kwargs)
        if e.method in ("copy", "contiguous"):
            return args[0]
        if e.method in ("view",):
            return self.core("reshape", args[:1], {"shape": tuple(args[1:])}, e)
        if e.method == "flatten":
            a = mapping.bind_function(lambda x, start_axis=0, end_axis=-1: None, args, kwargs)
            return self.call_rule(mapping.rule_for("function", "F.flatten"), e, a, "flatten")
        if e.method == "permute":
            return self.core("transpose", args[:1], {"axes": tuple(args[1:])}, e)
        hit = self.by_method.get(e.method)
        if hit is None:
            raise self.unsupported(f"tensor method {e.method!r}", e)
        op, role = hit
        n = op.arity
        if role == "reflected":
            args = [args[1], args[0]] + args[2:]
        inputs, rest = args[:n], args[n:]
        params = dict(kwargs)
        if rest:
            if op.group in ("cast", "view") and len(rest) > 1:
                params[op.params[0]] = tuple(rest)
            else:
                params.update(zip(op.params, rest))
        return self.core(op.name, inputs, params, e)

    def function(self, e):
        from mgtrace._core import tensor as mt_tensor
        fn = e.func
        args = [self.value(a) for a in e.args]
        kwargs = self.value(e.kwargs)
        if fn in _PYOPS:
            return self.core(_PYOPS[fn], args, {}, e)
        if fn is mt_tensor:
            return self.tensor_call(e, args, kwargs)
        mod = getattr(fn, "__module__", "") or ""
        name = getattr(fn, "__name__", "")
        rule = mapping.rule_for("function", f"F.{name}") if mod.startswith(
            "mgtrace.functional") else None
        if rule is None:
            from mgtrace.traced_module.expr import function_name
            raise self.unsupported(f"function {function_name(fn)}", e)
        self.refuse_none(rule, e)
        if getattr(rule.convert, "decompose", False):
            self.check_opset(rule, e)
            inner = getattr(fn, "__wrapped__", fn)
            return self.decompose(e, lambda body, xs: inner(*_substitute(args, xs),
                                                            **_substitute(kwargs, xs)),
                                  (args, kwargs), None)
        a = mapping.bind_function(fn, args, kwargs)
        return self.call_rule(rule, e, a, getattr(rule.convert, "op", name))

    def refuse_none(self, rule, e):
        """ExportError for a row that says it has no ONNX equivalent."""
        reason = getattr(rule.convert, "no_onnx", None)
        if reason:
            at = f" at {e.source}" if e.source else ""
            raise ExportError(f"{rule.kind} {rule.name} has no ONNX equivalent: {reason} "
                              f"(node {self.b.scope}{at})")

    def decompose(self, e, call, structure, root):
        """Convert a call as the graph of its own body: ``call(body, xs)`` is
        traced (mgtrace.trace_module) on example tensors shaped and typed
        like the V leaves of ``structure``, and that graph's exprs are
        converted here, reading the leaves; ``root`` is the _Module its
        GetAttrs start from. Shapes stay symbolic (the body's shape reads
        become Shape nodes of the real values). A body whose trace fixes
        something that may vary (TraceWarning) is an ExportError, never a
        model that is right at the traced size only."""
        import warnings
        import mgtrace as mt
        from mgtrace.traced_module.errors import TraceWarning
        leaves = [self.plain(v) for v in _leaves(structure)]
        rng = np.random.default_rng(0)
        xs = []
        for v in leaves:
            if v.dtype.kind == "f":
                data = rng.uniform(0.25, 0.75, v.shape).astype(v.dtype)
            else:
                data = np.zeros(v.shape, v.dtype)
            xs.append(mt.tensor(data))
        what = f"{e.func.__name__}" if e.kind == "call_function" else self.b.scope
        scope, source = self.b.scope, self.b.source
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", TraceWarning)
            try:
                body = _Body.make(lambda body, ts: call(body, iter(ts)),
                                  None if root is None else root.obj)
                tm = mt.trace_module(body, *xs)
            except Exception as err:        # any failure of the user's call: named below
                raise self.b.error(f"{what}: its composition of core ops could not be traced "
                                   f"for export ({type(err).__name__}: {err})") from None
        for w in caught:
            # a constant the body makes (a grid, a table) is one: every run reuses it rightly
            if issubclass(w.category, TraceWarning) and "kept as a constant" not in str(
                    w.message):
                raise self.b.error(f"{what}: tracing its composition of core ops fixed a value "
                                   f"that may vary between runs ({w.message}), so no ONNX "
                                   f"form is exported")
        sub = tm.graph
        self.bodies.append(tm)      # alive while env holds its nodes' ids
        root = _Module(body, "", None) if root is None else _Module(body, root.path, "m")
        for n, v in zip(sub.inputs[1:], leaves):
            self.env[id(n)] = v
        saved = self.prefix
        self.prefix = scope
        try:
            self.walk(sub, root)
        finally:
            self.prefix = saved
            self.b.scope, self.b.source = scope, source
        return [self.env.get(id(o)) for o in sub.outputs]

    def tensor_call(self, e, args, kwargs):
        data = args[0] if args else kwargs.get("data")
        spec = _Spec(e.outputs[0])

        def flat(x):
            return [y for z in x for y in flat(z)] if isinstance(x, (list, tuple)) else [x]
        items = flat(data)
        if any(isinstance(i, V) for i in items):
            if isinstance(data, (list, tuple)) and all(not isinstance(d, (list, tuple))
                                                       for d in data):
                v = self.b.shape_tensor(items)
                return self.b.cast(v, spec.dtype)
            raise self.b.error("mgtrace.tensor of nested data holding shape values has no "
                               "ONNX form here")
        if isinstance(data, V):
            return data
        return self.b.const(np.asarray(data, spec.dtype))

    def module(self, e, m):
        obj = m.obj
        out = _quant.convert_module(self, e, m, [self.value(a) for a in e.args[1:]],
                                    self.value(e.kwargs), [_Spec(o) for o in e.outputs])
        if out is not None:
            return out
        rule = mapping.rule_for("module", type(obj).__name__)
        from mgtrace.module.builtin import builtin_type
        try:
            known = rule is not None and builtin_type(
                f"mgtrace.module.{type(obj).__name__}") is type(obj)
        except Exception:
            known = False
        if not known:
            raise self.unsupported(f"module {type(obj).__module__}.{type(obj).__qualname__}", e)
        args = [self.value(a) for a in e.args[1:]]
        kwargs = self.value(e.kwargs)
        self.refuse_none(rule, e)
        if getattr(rule.convert, "decompose", False):
            self.check_opset(rule, e)
            return self.decompose(
                e, lambda body, xs: body.m.forward(*_substitute(args, xs),
                                                   **_substitute(kwargs, xs)),
                (args, kwargs), m)
        hx = None
        if getattr(rule.convert, "takes_hx", False) and len(args) + len(kwargs) == 2 and \
                (len(args) == 2 or "hx" in kwargs):
            hx = args[1] if len(args) == 2 else kwargs["hx"]
            args, kwargs = args[:1], {}
        if kwargs or len(args) != 1:
            raise self.b.error(f"{type(obj).__name__} called with arguments other than one "
                               f"tensor")
        x = self.plain(args[0])
        self.check_opset(rule, e)

        def param(name):
            return self.param(getattr(obj, name), f"{m.path}.{name}")
        param.path, param.hx = m.path, hx
        out = [_Spec(o) for o in e.outputs]
        try:
            return rule.convert(self.b, out, obj, x, param)
        except ValueError as err:
            if isinstance(err, ExportError):
                raise
            raise self.b.error(f"{type(obj).__name__} with {err} has no ONNX form") from None

    # ------------------------------------------------------------ rules
    def unsupported(self, what, e):
        at = f" at {e.source}" if e.source else ""
        return ExportError(f"{what} has no ONNX mapping (node {self.b.scope}{at}); "
                           f"mgtrace.onnx.coverage() lists what exports")

    def check_opset(self, rule, e):
        if rule.since > self.opset:
            at = f" at {e.source}" if e.source else ""
            raise ExportError(f"{rule.kind} {rule.name} needs opset {rule.since} or newer "
                              f"(ONNX {', '.join(rule.onnx)}), but the export targets opset "
                              f"{self.opset} (node {self.b.scope}{at}); pass opset="
                              f"{rule.since} or newer")

    def plain(self, v):
        return C.unblock(self.b, v) if isinstance(v, V) and v.blocked is not None else v

    def core(self, name, inputs, params, e):
        rule = mapping.rule_for("op", name)
        if rule is None:
            raise self.unsupported(f"op {name!r}", e)
        self.check_opset(rule, e)
        inputs = self.layout(name, inputs)
        out = [_Spec(o) for o in e.outputs]
        return self.blocked_result(rule.convert(self.b, out, inputs, params), inputs, name)

    def call_rule(self, rule, e, a, op_name):
        self.check_opset(rule, e)
        keys = [k for k, v in a.items() if isinstance(v, V)]
        vals = self.layout(op_name, [a[k] for k in keys])
        a = dict(a, **dict(zip(keys, vals)))
        out = [_Spec(o) for o in e.outputs]
        return self.blocked_result(rule.convert(self.b, out, a), vals, op_name)

    _LAYOUT_OPS = frozenset({"to_nchwc", "from_nchwc", "conv2d_nchwc", "conv2d_nchwc_pw_dw",
                             "conv2d_nchwc_pw_dw_pw", "max_pool2d_nchwc"})

    def layout(self, name, inputs):
        """Inputs for op ``name``: blocked values pass to the layout ops and to
        elementwise ops whose blocked operands agree; others see NCHW16c."""
        vs = [v for v in inputs if isinstance(v, V)]
        if not any(v.blocked is not None for v in vs) or name in self._LAYOUT_OPS:
            return inputs
        blocks = {v.blocked for v in vs}
        if name in mapping.ELEMENTWISE_BLOCKED_OK and len(blocks) == 1:
            return inputs
        return [self.plain(v) if isinstance(v, V) else v for v in inputs]

    @staticmethod
    def blocked_result(res, inputs, name):
        if name in mapping.ELEMENTWISE_BLOCKED_OK and isinstance(res, V):
            bl = {v.blocked for v in inputs if isinstance(v, V)}
            if len(bl) == 1 and None not in bl:
                return V(res.name, res.dtype, res.shape, blocked=bl.pop())
        return res


def _leaves(obj):
    """The V leaves of nested tuples, lists and dicts, in order."""
    if isinstance(obj, V):
        return [obj]
    if isinstance(obj, (tuple, list)):
        return [v for o in obj for v in _leaves(o)]
    if isinstance(obj, dict):
        return [v for o in obj.values() for v in _leaves(o)]
    return []


def _substitute(obj, it):
    """``obj`` with each V leaf replaced by the next item of ``it``."""
    if isinstance(obj, V):
        return next(it)
    if isinstance(obj, tuple):
        return tuple(_substitute(o, it) for o in obj)
    if isinstance(obj, list):
        return [_substitute(o, it) for o in obj]
    if isinstance(obj, dict):
        return {k: _substitute(o, it) for k, o in obj.items()}
    return obj


def _check_names(tm, input_names, output_names):
    """input_names / output_names: strs, at most one per input / output, no
    name twice (else a name would be dropped or silently renamed)."""
    seen = set()
    for arg, names, count in (("input_names", input_names, len(tm.graph.inputs) - 1),
                              ("output_names", output_names, len(tm.graph.outputs))):
        if names is None:
            continue
        if isinstance(names, str) or not isinstance(names, (list, tuple)):
            raise TypeError(f"export: {arg} must be a list of str, got {type(names).__name__}")
        for n in names:
            if not isinstance(n, str) or not n:
                raise TypeError(f"export: {arg} holds names (non-empty str), got {n!r}")
            if n in seen:
                raise ValueError(f"export: the name {n!r} is given twice in input_names / "
                                 f"output_names")
            seen.add(n)
        if len(names) > count:
            raise ValueError(f"export: {arg} has {len(names)} names, but the graph has "
                             f"{count} {arg.split('_')[0]}s")


def build_model(tm, opset=None, input_names=None, output_names=None, dynamic=True,
                contrib_ops=False, quant_format="qdq"):
    """The checked ModelProto :func:`export` writes (nothing is written)."""
    onnx = _require()
    from onnx import helper
    from mgtrace.traced_module import TracedModule
    if not isinstance(tm, TracedModule):
        raise TypeError(f"export takes a TracedModule (mgtrace.trace_module(net, x)), got "
                        f"{type(tm).__name__}")
    asked, opset = opset, _pick_opset(opset)
    _check_names(tm, input_names, output_names)
    if not isinstance(contrib_ops, bool):
        raise TypeError(f"export: contrib_ops must be True or False, got {contrib_ops!r}")
    if not isinstance(dynamic, bool):
        raise TypeError(f"export: dynamic must be True or False, got {dynamic!r}")
    if quant_format not in ("qdq", "qoperator"):
        from mgtrace.errors import did_you_mean
        hint = did_you_mean(str(quant_format).lower(), ("qdq", "qoperator"))
        raise ExportError(f"export: quant_format must be 'qdq' or 'qoperator', got "
                          f"{quant_format!r}.{hint}")
    ex = _Exporter(tm, opset, bool(dynamic), input_names, output_names, contrib_ops,
                   quant_format)
    graph = ex.run()
    cap = qdq_max_opset(ex.b.qdq) if ex.b.qdq else None
    if cap is not None and cap < opset:
        if asked is not None:
            import onnxruntime
            raise ExportError(
                f"export: the quantized graph needs QuantizeLinear/DequantizeLinear on "
                f"{', '.join(sorted({d for _, d in ex.b.qdq}))}, which the installed "
                f"onnxruntime {onnxruntime.__version__} runs up to opset {cap} only (opset "
                f"{opset} asked); pass opset={cap} or leave opset out")
        opset = cap
        ex = _Exporter(tm, opset, bool(dynamic), input_names, output_names, contrib_ops,
                       quant_format)
        graph = ex.run()
    opsets = [helper.make_opsetid("", opset)]
    ir = helper.find_min_ir_version_for(opsets)
    opsets += [helper.make_opsetid(d, 1) for d in sorted(ex.b.domains)]
    model = helper.make_model(graph, opset_imports=opsets, producer_name="mgtrace",
                              ir_version=ir)
    import json
    import mgtrace
    model.producer_version = mgtrace.__version__
    shapes = {i.name: list(n.shape) for i, n in zip(graph.input, tm.graph.inputs[1:])}
    helper.set_model_props(model, {"mgtrace.example_shapes": json.dumps(shapes)})
    try:
        onnx.checker.check_model(model, full_check=True)
        onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as err:
        raise ExportError(f"export: the ONNX model fails onnx's check (a bug in mgtrace's "
                          f"exporter; please report it): {err}") from None
    return model


def export(tm, f, opset=None, input_names=None, output_names=None, dynamic=True,
           example_inputs=None, contrib_ops=False, quant_format="qdq"):
    """Write TracedModule ``tm`` as an ONNX model to ``f``.

    Args:
        tm: a TracedModule (nested or flattened, optimized or not, float,
            QAT or quantized: see ``quant_format``) with one graph; builtin
            modules in eval mode.
        f: a path (written atomically: a temporary file renamed into place)
            or a writable binary file.
        opset: the ONNX opset, from 13 to :func:`max_opset` (the default:
            the newest the installed onnx and onnxruntime both run).
        input_names, output_names: names for the graph's inputs and outputs
            (default: the traced argument names and the output nodes' names).
        dynamic: True: every input axis is a symbolic ONNX dim (a model
            traced at batch 1 runs at batch 7; shape arithmetic becomes
            Shape/Gather nodes); False: the traced shapes, fixed.
        example_inputs: None, or a tuple of arrays/Tensors: the exported
            model is run in ONNX Runtime on them and compared with
            ``tm(*example_inputs)`` (float outputs within 1e-5 of the
            output's scale, others exactly) before anything is written.
        contrib_ops: False (the default): standard ONNX ops only, for any
            runtime. True: where ONNX Runtime has a fused op for what the
            graph computes, its ``com.microsoft`` form (domain declared in
            the model's opset imports), which ORT runs faster and other
            runtimes refuse: FusedConv for a conv with its activation
            (relu, relu6, sigmoid, tanh, hardsigmoid) and residual
            (``optimize``'s conv2d_act and NCHW16c convs), Gelu / FastGelu
            below opset 20 (where standard Gelu exists), and
            SkipLayerNormalization for a residual Add followed by a layer
            norm over the last axis of a 3-d float32 value.
        quant_format: how modules of ``mgtrace.module.quantized`` export:
            "qdq" (the default): QuantizeLinear / DequantizeLinear around
            the float ops, the form ONNX Runtime's quantizer writes; or
            "qoperator": a quantized Conv2d / Linear (and their Relu and
            BatchNorm-folded forms) whose output is quantized is one
            QLinearConv on the integers (a Linear as a 1x1 convolution,
            keeping its int32 bias; fused ReLU as a Max with the output's
            zero point), other layers as in "qdq". QAT models export as
            QDQ either way.

    Returns:
        The onnx.ModelProto written.

    Raises:
        TypeError: opset not an int, dynamic or contrib_ops not a bool,
            example_inputs one array rather than a tuple of them.
        ExportError: quant_format neither "qdq" nor "qoperator"; an op, function or module with no ONNX mapping (named
            with the node's qualname and source line), an opset outside
            13..max_opset() or too old for an op of the graph, a value ONNX
            cannot express, or example outputs that differ (a dequantized
            output may differ by one quantum: ORT requantizes in float32,
            mgtrace in float64). For quantized graphs also: activations
            other than per-tensor qint8 / quint8, or an opset above the
            newest at which the installed onnxruntime runs the graph's
            QuantizeLinear / DequantizeLinear nodes (onnxruntime 1.32: 27;
            20 for int8 activations); left out, the opset is chosen below
            it. Nothing is written.
        ImportError: the onnx package is missing (pip install 'mgtrace[onnx]').

    Mapping: :mod:`mgtrace.onnx.mapping` (``mgtrace.onnx.coverage()``);
    quantized and QAT modules: :mod:`mgtrace.onnx._quant`.
    """
    model = build_model(tm, opset, input_names, output_names, dynamic, contrib_ops,
                        quant_format)
    if example_inputs is not None:
        check_against(model, tm, example_inputs)
    from mgtrace.serialization.atomic import open_for_writing
    data = model.SerializeToString()
    with open_for_writing(f, "model.onnx") as out:
        out.write(data)
    return model


def run_ort(model, inputs):
    """Run ``model`` (ModelProto or bytes) in ONNX Runtime on the CPU."""
    import onnxruntime as ort
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    data = model if isinstance(model, bytes) else model.SerializeToString()
    sess = ort.InferenceSession(data, opts, providers=["CPUExecutionProvider"])
    feeds = {i.name: np.asarray(v) for i, v in zip(sess.get_inputs(), inputs)}
    return sess.run(None, feeds)


def output_quantum(model):
    """The largest quantum (scale) of the graph outputs that are dequantized
    integers (a DequantizeLinear, through Identity nodes, with a per-tensor
    scale initializer); 0.0 for a graph with none. ONNX Runtime requantizes
    in float32 where mgtrace's int8 kernels use float64: such an output may
    differ from mgtrace's by this much."""
    from onnx import numpy_helper
    producer = {o: n for n in model.graph.node for o in n.output}
    inits = {t.name: t for t in model.graph.initializer}
    quantum = 0.0
    for out in model.graph.output:
        n = producer.get(out.name)
        while n is not None and n.op_type == "Identity":
            n = producer.get(n.input[0])
        if n is not None and n.op_type == "DequantizeLinear" and n.input[1] in inits:
            scale = numpy_helper.to_array(inits[n.input[1]])
            if scale.size == 1:
                quantum = max(quantum, float(scale.reshape(())))
    return quantum


def compare(got, want, what="output", quantum=0.0):
    """None if ``got`` matches ``want`` (float within 1e-5 of the largest
    magnitude of want, plus ``quantum``; others exactly), else a sentence
    saying how not."""
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape:
        return f"{what}: shape {got.shape} != {want.shape}"
    if want.dtype.kind == "f":
        finite = np.abs(want[np.isfinite(want)])
        scale = float(finite.max()) if finite.size else 0.0
        scale = scale if scale > 0 else 1.0
        with np.errstate(invalid="ignore"):
            err = np.abs(got.astype(np.float64) - want.astype(np.float64))
        same_nan = np.isnan(got) == np.isnan(want)
        allowed = 1e-5 * scale + quantum * (1 + 1e-5)
        if not same_nan.all() or np.nanmax(err, initial=0.0) > allowed:
            return f"{what}: max abs difference {np.nanmax(err, initial=0.0):.3g} " \
                   f"(allowed {allowed:.3g})"
        return None
    if not np.array_equal(got, want.astype(got.dtype) if want.dtype != got.dtype else want):
        return f"{what}: values differ"
    return None


def _check_examples(tm, xs):
    """ExportError unless ``xs`` has one array per graph input, each of that
    input's dtype and rank (onnxruntime would refuse them with its own
    InvalidArgument)."""
    nodes = tm.graph.inputs[1:]
    if len(xs) != len(nodes):
        raise ExportError(f"export: example_inputs has {len(xs)} arrays, but the graph has "
                          f"{len(nodes)} inputs")
    for i, (x, n) in enumerate(zip(xs, nodes)):
        want = np.dtype(n.dtype) if n.dtype is not None else None
        if want is not None and x.dtype != want:
            raise ExportError(f"export: example input {i} ({n.name!r}) is {x.dtype}, but the "
                              f"graph was traced with {want} there; pass "
                              f"x.astype({want.name!r})")
        if n.shape is not None and x.ndim != len(n.shape):
            raise ExportError(f"export: example input {i} ({n.name!r}) has {x.ndim} axes, "
                              f"but the graph was traced with {len(n.shape)} "
                              f"({tuple(n.shape)})")


def check_against(model, tm, example_inputs):
    """Run model in ORT on ``example_inputs`` and compare with tm's outputs;
    ExportError naming the first difference."""
    import mgtrace as mt
    from mgtrace.traced_module.pytree import tree_flatten
    if isinstance(example_inputs, np.ndarray) or isinstance(example_inputs, mt.Tensor):
        # iterating one array hands out its rows: "has 3 axes, traced with 4" misled
        raise TypeError(f"export: example_inputs is a tuple of arrays, one per graph input; "
                        f"got one {type(example_inputs).__name__}: pass (x,)")
    xs = [np.asarray(x.numpy() if hasattr(x, "numpy") else x) for x in example_inputs]
    _check_examples(tm, xs)
    try:
        out = tm(*[mt.tensor(x) for x in xs])
    except (ValueError, TypeError, IndexError) as err:
        # example inputs the model itself refuses (5 features for a Linear(4, _))
        raise ExportError(f"export: the model does not run on example_inputs "
                          f"({type(err).__name__}: {str(err)[:300]})") from None
    want = tree_flatten(out, lambda v: isinstance(v, mt.Tensor))[0]
    got = run_ort(model, xs)
    quantum = output_quantum(model)
    for i, (g, w) in enumerate(zip(got, want)):
        msg = compare(g, w.numpy(), f"output {i}", quantum)
        if msg:
            raise ExportError(f"export: ONNX Runtime's result differs from mgtrace's: {msg}")
