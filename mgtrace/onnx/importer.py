"""ONNX model -> TracedModule (:func:`load`).

The model is checked first (protobuf, sizes, external-data paths), then
run once by a small interpreter inside a module whose ``forward`` calls
``mgtrace.functional``: tracing that module with example inputs of the
model's input shapes gives an ordinary TracedModule (editable, saveable).
Shape computations of the model (``Shape``, ``Gather`` on shapes,
``Concat`` of dims...) run on the shape values the tracer hands out, so
they stay symbolic in the traced graph; small integer constants (axes,
pads) are read as fixed values.

Weights become parameters (float) or buffers of the module, named by the
initializer name with every character that cannot be in a Python name
replaced by ``_`` (``layer1.0.conv1.weight`` -> ``layer1_0_conv1_weight``).
"""
import contextlib
import keyword
import math
import os
import re

import numpy as np

from mgtrace.errors import Error

__all__ = ["load", "OnnxImportError", "IMPORTERS"]

from mgtrace.onnx._ops import IMPORTERS  # noqa: E402  (the table, public here)

MAX_ELEMENTS = 1 << 31          # one initializer or input: at most 2^31 elements
MAX_BYTES = 1 << 33             # all initializers together: at most 8 GiB
EXAMPLE_DIM = 1                 # the size a symbolic input dim is traced at
MAX_NDIM = 16                   # the tensor core's limit on dimensions
MAX_EXAMPLE_ELEMENTS = 1 << 26  # an input made up from its declared shape: at most 2^26


class OnnxImportError(Error, ValueError):
    """An ONNX model cannot be imported: malformed, hostile (absurd sizes,
    external data outside its folder), or using an op mgtrace cannot
    express. The message names the node or field."""


def _onnx():
    try:
        import onnx
    except ImportError:
        raise ImportError("mgtrace.onnx.load needs the onnx package: pip install "
                          "'mgtrace[onnx]'") from None
    return onnx


# ------------------------------------------------------------ reading

def _read(f):
    """``(ModelProto, folder or None)`` from a path, bytes or a binary file."""
    onnx = _onnx()
    folder = None
    if isinstance(f, (str, bytes, os.PathLike)) and not isinstance(f, bytes) or \
            isinstance(f, os.PathLike):
        path = os.fspath(f)
        folder = os.path.dirname(os.path.abspath(path))
        with open(path, "rb") as fh:
            data = fh.read()
    elif isinstance(f, bytes):
        data = f
    elif hasattr(f, "read"):
        data = f.read()
    else:
        raise TypeError(f"load takes a path, bytes or a binary file, got {type(f).__name__}")
    if len(data) >= 2 ** 31:
        raise OnnxImportError("the model file is 2 GiB or larger; ONNX keeps such weights as "
                              "external data")
    try:
        model = onnx.ModelProto()
        model.ParseFromString(data)
    except Exception as err:        # protobuf's DecodeError and kin
        raise OnnxImportError(f"not an ONNX model (the protobuf does not parse: {err})") from None
    if not model.HasField("graph"):
        raise OnnxImportError("not an ONNX model: it has no graph")
    return model, folder


_NP = None


def _np_dtype(elem_type, what):
    from onnx import helper
    import mgtrace as mt
    try:
        dt = np.dtype(helper.tensor_dtype_to_np_dtype(elem_type))
    except Exception:
        raise OnnxImportError(f"{what}: element type {elem_type} has no NumPy dtype") from None
    try:
        mt.tensor(np.zeros(0, dt))          # complex, strings: no mgtrace tensor dtype
    except (TypeError, ValueError):
        raise OnnxImportError(f"{what}: element type {elem_type} ({dt}) has no mgtrace "
                              f"tensor dtype") from None
    return dt


def _external(t, folder, what):
    """The checked path of initializer ``t``'s external data."""
    info = {e.key: e.value for e in t.external_data}
    loc = info.get("location", "")
    if folder is None:
        raise OnnxImportError(f"{what}: external data ({loc!r}) needs the model's folder; "
                              f"load the model from its path")
    if not loc or os.path.isabs(loc) or ".." in re.split(r"[\\/]", loc):
        raise OnnxImportError(f"{what}: external data path {loc!r} is outside the model's "
                              f"folder")
    real = os.path.realpath(os.path.join(folder, loc))
    if os.path.commonpath([real, os.path.realpath(folder)]) != os.path.realpath(folder):
        raise OnnxImportError(f"{what}: external data path {loc!r} leads outside the model's "
                              f"folder (a link)")
    if not os.path.isfile(real):
        raise OnnxImportError(f"{what}: external data file {loc!r} does not exist")
    try:
        offset = int(info.get("offset", 0))
        length = int(info["length"]) if "length" in info else os.path.getsize(real) - offset
    except ValueError:
        raise OnnxImportError(f"{what}: external data offset/length are not integers") from None
    if offset < 0 or length < 0 or offset + length > os.path.getsize(real):
        raise OnnxImportError(f"{what}: external data [{offset}, {offset + length}) lies past "
                              f"the end of {loc!r}")
    return real, offset, length


def _array(t, folder, what):
    """Initializer ``t`` as a NumPy array, sizes checked before any allocation."""
    from onnx import numpy_helper
    dims = list(t.dims)
    if any(d < 0 for d in dims):
        raise OnnxImportError(f"{what}: negative dimension in {dims}")
    if len(dims) > MAX_NDIM:
        raise OnnxImportError(f"{what}: {len(dims)} dimensions, more than the {MAX_NDIM} an "
                              f"mgtrace tensor may have")
    n = math.prod(dims)
    if n > MAX_ELEMENTS:
        raise OnnxImportError(f"{what}: {n} elements (shape {dims}) is more than the "
                              f"{MAX_ELEMENTS} allowed")
    dt = _np_dtype(t.data_type, what)
    from onnx import TensorProto
    if t.data_location == TensorProto.EXTERNAL:
        real, offset, length = _external(t, folder, what)
        if length != n * dt.itemsize:
            raise OnnxImportError(f"{what}: external data holds {length} bytes, shape {dims} "
                                  f"{dt} needs {n * dt.itemsize}")
        with open(real, "rb") as fh:
            fh.seek(offset)
            return np.frombuffer(fh.read(length), dtype=dt.newbyteorder("<")).astype(
                dt).reshape(dims)
    if t.HasField("raw_data"):
        if len(t.raw_data) != n * dt.itemsize:
            raise OnnxImportError(f"{what}: raw data holds {len(t.raw_data)} bytes, shape "
                                  f"{dims} {dt} needs {n * dt.itemsize}")
    else:
        fields = [t.float_data, t.int32_data, t.int64_data, t.double_data, t.uint64_data,
                  t.string_data]
        count = max(len(x) for x in fields)
        if count != n:
            raise OnnxImportError(f"{what}: {count} values for shape {dims}")
    try:
        return numpy_helper.to_array(t).reshape(dims)
    except Exception as err:
        raise OnnxImportError(f"{what}: cannot be read ({err})") from None


def _inputs_of(model, example_inputs):
    """The graph inputs that are not initializers: ``[(name, dtype, shape)]``."""
    import json
    inits = {t.name for t in model.graph.initializer}
    meta = {p.key: p.value for p in model.metadata_props}
    try:
        traced = json.loads(meta.get("mgtrace.example_shapes", "{}"))
    except ValueError:
        traced = {}
    out = []
    graph_inputs = [v for v in model.graph.input if v.name not in inits]
    names = [v.name for v in graph_inputs]
    for name in names:
        if names.count(name) > 1:
            raise OnnxImportError(f"graph input {name!r} is declared twice")
    if example_inputs is not None:
        if isinstance(example_inputs, np.ndarray) or not isinstance(example_inputs,
                                                                    (tuple, list)):
            raise TypeError(f"load: example_inputs is a tuple of arrays, one per graph input "
                            f"({len(names)}); got {type(example_inputs).__name__}")
        if len(example_inputs) != len(names):
            raise OnnxImportError(f"load: example_inputs has {len(example_inputs)} arrays, but "
                                  f"the model has {len(names)} inputs ({', '.join(names)})")
    for i, vi in enumerate(graph_inputs):
        what = f"graph input {vi.name!r}"
        tt = vi.type.tensor_type
        if not vi.type.HasField("tensor_type"):
            raise OnnxImportError(f"{what} is not a tensor")
        dt = _np_dtype(tt.elem_type, what)
        if example_inputs is not None:
            shape = tuple(np.shape(example_inputs[i]))
            declared = [d.dim_value if d.HasField("dim_value") else None
                        for d in tt.shape.dim] if tt.HasField("shape") else None
            if declared is not None and (len(declared) != len(shape) or any(
                    d is not None and d != s for d, s in zip(declared, shape))):
                raise OnnxImportError(f"{what}: example input of shape {shape} does not fit "
                                      f"the declared shape {[d if d is not None else '?' for d in declared]}")
            try:
                np.asarray(example_inputs[i]).astype(dt)
            except (TypeError, ValueError) as err:
                raise OnnxImportError(f"{what}: example input cannot be {dt} ({err})") from None
        else:
            shape = []
            known = traced.get(vi.name)
            for k, d in enumerate(tt.shape.dim):
                if d.HasField("dim_value"):
                    shape.append(d.dim_value)
                elif isinstance(known, list) and k < len(known) and isinstance(known[k], int):
                    shape.append(known[k])
                else:
                    shape.append(EXAMPLE_DIM)
            shape = tuple(shape)
        if len(shape) > MAX_NDIM:
            raise OnnxImportError(f"{what}: {len(shape)} dimensions, more than the {MAX_NDIM} "
                                  f"an mgtrace tensor may have")
        if any(s < 0 for s in shape) or math.prod(shape) > MAX_ELEMENTS:
            raise OnnxImportError(f"{what}: shape {shape} is negative or absurdly large")
        if example_inputs is None and math.prod(shape) > MAX_EXAMPLE_ELEMENTS:
            # the example made up to trace with would be allocated (as float64
            # random numbers first) and run through the whole graph: 2^31
            # elements took minutes and 16 GB
            raise OnnxImportError(f"{what}: declared shape {shape} has {math.prod(shape)} "
                                  f"elements, more than the {MAX_EXAMPLE_ELEMENTS} (2^26) an "
                                  f"example input is made up with; pass example_inputs=")
        out.append((vi.name, dt, shape))
    return out


def _identifier(name, taken):
    if isinstance(name, bytes):     # protobuf hands out a string field of bad UTF-8 as bytes
        name = name.decode("utf-8", "replace")
    base = re.sub(r"\W", "_", name) or "v"
    if base[0].isdigit() or keyword.iskeyword(base):
        base = "v_" + base
    out, i = base, 1
    while out in taken:
        i += 1
        out = f"{base}_{i}"
    taken.add(out)
    return out


# ------------------------------------------------------------ the module

@contextlib.contextmanager
def _naming(node):
    """Errors of an RNN / LSTM node's module (made from mutated attributes or
    weights, run on operands of the wrong shape) as OnnxImportError naming the
    node, as :func:`mgtrace.onnx._ops.run_node` does for the other ops."""
    try:
        yield
    except OnnxImportError:
        raise
    except (KeyError, IndexError, AttributeError, TypeError, ValueError,
            OverflowError, MemoryError) as err:
        raise OnnxImportError(f"node {node.name or node.op_type!r} ({node.op_type}): inputs "
                              f"or attributes this importer cannot read ({err!r})"[:600]) from None


def _build(model, folder, example_inputs):
    import mgtrace as mt
    import mgtrace.module as M
    from mgtrace.onnx import _import_rnn, _ops
    graph = model.graph
    opsets = {o.domain or "": o.version for o in model.opset_import}
    if "" not in opsets and "ai.onnx" not in opsets:
        raise OnnxImportError("the model imports no standard ONNX opset")
    onnx = _onnx()
    newest = onnx.defs.onnx_opset_version()
    for domain in ("", "ai.onnx"):
        v = opsets.get(domain)
        if v is not None and not 1 <= v <= newest:
            raise OnnxImportError(f"the model imports ONNX opset {v}, which does not exist "
                                  f"(the installed onnx knows opsets 1 to {newest})")
    from mgtrace.onnx._import_contrib import CONTRIB
    for n in graph.node:
        if n.domain not in ("", "ai.onnx"):
            if f"{n.domain}.{n.op_type}" in CONTRIB:
                continue
            raise OnnxImportError(f"node {n.name or n.op_type!r}: op {n.domain}.{n.op_type} is "
                                  f"not a standard ONNX op (of ONNX Runtime's contrib ops, "
                                  f"{', '.join(sorted(CONTRIB))} import)")
        if n.op_type not in _ops.IMPORTERS and n.op_type not in _import_rnn.OPS:
            raise OnnxImportError(f"node {n.name or n.op_type!r}: ONNX op {n.op_type} has no "
                                  f"mgtrace form (importable: mgtrace.onnx.importer.IMPORTERS)")
    total = 0
    arrays = {}
    for t in graph.initializer:
        if t.name in arrays:
            raise OnnxImportError(f"initializer {t.name!r} is defined twice")
        a = _array(t, folder, f"initializer {t.name!r}")
        total += a.nbytes
        if total > MAX_BYTES:
            raise OnnxImportError(f"initializers hold more than {MAX_BYTES} bytes")
        arrays[t.name] = a
    inputs = _inputs_of(model, example_inputs)
    defined = {""} | set(arrays) | {n for n, _, _ in inputs}
    for n in graph.node:                # in order: ONNX graphs are topologically sorted
        for i in n.input:
            if i not in defined:
                raise OnnxImportError(f"node {n.name or n.op_type!r} reads {i!r}, which no "
                                      f"earlier node, graph input or initializer defines")
        for o in n.output:
            # ONNX graphs are SSA: a second definition silently replaced the first
            if o and o in defined:
                raise OnnxImportError(f"node {n.name or n.op_type!r} writes {o!r}, which an "
                                      f"earlier node, a graph input or an initializer "
                                      f"already defines (each name is defined once)")
        defined.update(n.output)
    for o in graph.output:
        if o.name not in defined:
            raise OnnxImportError(f"graph output {o.name!r} is never computed")
    taken = {"self", "forward", "training"}
    in_names = [_identifier(n, taken) for n, _, _ in inputs]
    # RNN / LSTM nodes become modules holding their weights
    recurrent = [(i, n) for i, n in enumerate(graph.node) if n.op_type in _import_rnn.OPS]
    moved = {w for _, n in recurrent for w in _import_rnn.weight_inputs(n)}
    moved -= {i for n in graph.node if n.op_type not in _import_rnn.OPS for i in n.input}
    moved -= {o.name for o in graph.output}

    class OnnxModel(M.Module):
        def __init__(self):
            super().__init__()
            self._onnx_attrs = {}
            self._onnx_modules = {}
            for i, n in recurrent:
                attr = _identifier(n.name or n.op_type.lower(), taken)
                with _naming(n):
                    setattr(self, attr, _import_rnn.make_module(n, arrays, _ops._attrs(n)))
                self._onnx_modules[i] = attr
            for name, a in arrays.items():
                if name in moved:
                    continue
                if a.dtype.kind == "f" and a.ndim >= 1 or a.size > 16:
                    attr = _identifier(name, taken)
                    value = M.Parameter(a) if a.dtype.kind == "f" else mt.tensor(a)
                    setattr(self, attr, value)
                    self._onnx_attrs[name] = attr

        def _run(self, *xs):
            env = {n: a for n, a in arrays.items() if n not in self._onnx_attrs}
            for name, attr in self._onnx_attrs.items():
                env[name] = getattr(self, attr)
            for (name, _, _), x in zip(inputs, xs):
                env[name] = x
            env[""] = None
            for k, node in enumerate(graph.node):
                if k in self._onnx_modules:
                    with _naming(node):
                        outs = _import_rnn.run(getattr(self, self._onnx_modules[k]), node,
                                               [env.get(i) if i not in moved else None
                                                for i in node.input])
                    outs = list(outs) + [None] * (len(node.output) - len(outs))
                else:
                    outs = _ops.run_node(node, [env[i] for i in node.input], opsets.get(
                        node.domain or "", opsets.get("ai.onnx")))
                for o, v in zip(node.output, outs):
                    env[o] = v
            res = []
            for o in graph.output:
                v = env[o.name]
                if v is None:
                    raise OnnxImportError(f"graph output {o.name!r} is never computed (an "
                                          f"empty name or an optional output left out)")
                res.append(v if isinstance(v, mt.Tensor) else mt.tensor(np.asarray(v)))
            return res[0] if len(res) == 1 else tuple(res)

    args = ", ".join(in_names)
    src = f"def forward(self, {args}):\n    return self._run({args})\n"
    ns = {}
    exec(compile(src, "mgtrace-generated:onnx", "exec"), ns)     # noqa: S102 (identifiers only)
    OnnxModel.forward = ns["forward"]
    OnnxModel.__name__ = OnnxModel.__qualname__ = _identifier(graph.name or "OnnxModel", set())
    examples = []
    for i, (name, dt, shape) in enumerate(inputs):
        if example_inputs is not None:
            examples.append(mt.tensor(np.asarray(example_inputs[i]).astype(dt)))
        else:
            examples.append(mt.tensor(np.zeros(shape, dt) if dt.kind in "biu" else
                                      np.random.default_rng(i).standard_normal(shape).astype(dt)))
    return OnnxModel().eval(), examples


def load(f, example_inputs=None):
    """An ONNX model as a TracedModule (editable, saveable with mgtrace.save).

    Args:
        f: a path, the model's bytes, or a binary file. External data is
            read from the model's folder (a path is then needed) and only
            from inside it.
        example_inputs: None, or arrays to trace with (one per graph input);
            by default each input is traced at its declared shape, a
            symbolic dim at the size mgtrace's exporter recorded
            (``mgtrace.example_shapes``) or else 1; an input whose declared
            shape holds more than 2^26 elements needs example_inputs.

    Returns:
        A TracedModule whose forward takes the model's inputs in order
        (named after them) and returns its outputs (a tuple for several).

    Raises:
        OnnxImportError: a malformed file, absurd sizes, external data
            outside the model's folder, or an op mgtrace cannot express
            (named with its node); a name defined twice (initializers,
            graph inputs, node outputs: ONNX graphs are SSA); example_inputs
            of another count than the inputs or not fitting their declared
            shapes.
        TypeError: example_inputs not a tuple or list.
        ImportError: the onnx package is missing.
    """
    return load_traced(f, example_inputs)[0]


def load_traced(f, example_inputs=None):
    """``(TracedModule, example inputs it was traced with)``: :func:`load`
    and the Tensors it traced at (what ``mgtrace import`` stores)."""
    import warnings
    import mgtrace as mt
    from mgtrace.traced_module.errors import TraceWarning
    model, folder = _read(f)
    try:
        mod, examples = _build(model, folder, example_inputs)
        with warnings.catch_warnings():
            # the model's own small constants (zero points, axes, int32 biases)
            # become tensors during the run: constants of the graph, rightly
            warnings.filterwarnings("ignore", message=r".*is kept as a constant",
                                    category=TraceWarning)
            tm = mt.trace_module(mod, *examples)
    except RecursionError:
        raise OnnxImportError("the model nests too deeply to import") from None
    return tm, examples
