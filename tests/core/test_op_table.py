"""The op table is the one op vocabulary: the C kernels, the registered core
ops and Tensor's methods all agree with it, and it loads without the
compiled core (a backend registers against it)."""
import importlib.util
import inspect
import operator
import pathlib
import re
import sys

import pytest

import mgtrace as mt
from mgtrace._core import Tensor, dispatch, op_table
from mgtrace._core.op_table import OPS

CORE = pathlib.Path(op_table.__file__).parent

# Python protocol members of Tensor that are not ops a graph records
# (conversions, containers, copying, NumPy/DLPack exchange, object basics)
PROTOCOL = {
    "__array__", "__array_ufunc__", "__bool__", "__copy__", "__deepcopy__", "__dlpack__",
    "__dlpack_device__", "__float__", "__index__", "__int__", "__iter__", "__len__",
    "__reduce__", "__repr__", "__hash__", "__getattr__", "__init__", "__new__", "__dict__",
    "__doc__", "__module__", "__weakref__", "__pyx_vtable__", "__setstate__",
    "__reduce_cython__", "__setstate_cython__", "__delitem__",
}


def _header_ops():
    """``{arity: {name: rule}}`` from kernels/mt_ops.h's X-macro lists."""
    text = (CORE / "kernels" / "contract" / "mt_ops.h").read_text()
    out = {}
    for arity, macro in ((1, "MT_UNARY_OPS"), (2, "MT_BINARY_OPS"), (3, "MT_TERNARY_OPS")):
        m = re.search(rf"#define {macro}\(X\)(.*?)(?:\n\s*\n|\n#)", text, re.S)
        assert m, f"{macro} not found in mt_ops.h"
        body = re.sub(r"/\*.*?\*/", "", m.group(1), flags=re.S)
        out[arity] = dict(re.findall(r"X\((\w+),\s*(\w+)\)", body))
    return out


def test_mt_ops_h_and_the_table_name_the_same_elementwise_ops():
    header = _header_ops()
    assert len(header[1]) > 30 and len(header[2]) > 20       # the parse found the lists
    for arity in (1, 2, 3):
        assert set(header[arity]) == set(op_table.ELEMENTWISE[arity]), arity
    # and the compiled kernel tables are the header's, in its order
    assert list(dispatch.UNARY) == list(header[1])
    assert list(dispatch.BINARY) == list(header[2])
    assert list(dispatch.TERNARY) == list(header[3])
    assert {n: r.lower() for a in header.values() for n, r in a.items()} == dispatch.RULES


def test_every_registered_core_op_is_a_row_and_every_row_is_registered():
    assert set(dispatch._IMPLS) == set(OPS)
    for name, op in OPS.items():
        assert dispatch._ARITY.get(name) == op.arity, name


def test_rows_match_the_implementations_signatures():
    for name, op in OPS.items():
        params = [p for p in inspect.signature(dispatch._IMPLS[name]).parameters if p != "out"]
        declared = (["tensors"] if op.arity is None else list(op.inputs)) + list(op.params)
        assert sorted(params) == sorted(declared), name
        assert op.version >= 1 and isinstance(op.group, str)


def test_every_public_tensor_method_and_operator_is_in_the_table():
    allowed = op_table.tensor_methods()
    public = {n for n in dir(Tensor) if not n.startswith("_") and callable(getattr(Tensor, n))}
    assert public - allowed == set(), "public Tensor methods the op table does not list"
    dunders = {n for n in dir(Tensor) if n.startswith("__") and n not in dir(object)}
    listed = set(op_table.by_method()) | PROTOCOL
    assert dunders - listed == set(), "Tensor operators the op table does not list"


def test_table_members_exist_where_it_says():
    for m, (op, role) in op_table.by_method().items():
        assert callable(getattr(Tensor, m)), m
    for name in op_table.operator_functions():
        assert callable(getattr(operator, name))
    for name in op_table.TENSOR_ONLY_METHODS:
        assert hasattr(Tensor, name), name
    # comparisons reflect to their mirror, arithmetic to __r<op>__
    assert OPS["lt"].reflected == "__gt__" and OPS["add"].reflected == "__radd__"
    assert op_table.by_method()["__gt__"][0].name == "gt"


def test_the_forms_behave_as_the_table_says():
    x, y = mt.tensor([6, 3]), mt.tensor([4, 2])
    for op in OPS.values():
        if op.pyop and op.arity == 2 and op.group != "index":
            want = dispatch._IMPLS[op.name](x, y).tolist()
            assert getattr(operator, op.pyop)(x, y).tolist() == want, op.name
            assert getattr(x, op.method)(y).tolist() == want, op.name
            assert getattr(y, op.reflected)(x).tolist() == want, op.name


def test_table_loads_without_the_compiled_core():
    spec = importlib.util.spec_from_file_location("_standalone_op_table", CORE / "op_table.py")
    mod = importlib.util.module_from_spec(spec)
    before = set(sys.modules)
    spec.loader.exec_module(mod)
    assert not {m for m in set(sys.modules) - before if m.startswith("mgtrace")}
    assert mod.OPS.keys() == OPS.keys() and mod.tensor_methods() == op_table.tensor_methods()


def test_core_op_refuses_an_undeclared_op():
    def frobnicate(x):
        return x
    with pytest.raises(KeyError, match="op_table.py"):
        dispatch.core_op(frobnicate)


def test_core_op_functions_keep_name_docs_and_signature():
    from mgtrace._core import index, nn, reduce
    assert reduce.sum.__name__ == "sum" and "Sum of the elements" in reduce.sum.__doc__
    assert str(inspect.signature(nn.conv2d)) == \
        "(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1)"
    for name in OPS:
        fn = getattr(dispatch, "_tensor_mod")._OPS.get(name)
        if hasattr(fn, "__self__") and isinstance(fn.__self__, dispatch.CoreOp):
            assert str(inspect.signature(fn)) == str(inspect.signature(fn.__self__.impl)), name
    assert index.concat([mt.tensor([1]), mt.tensor([2])], axis=0).tolist() == [1, 2]
    with pytest.raises(TypeError):
        reduce.sum(mt.tensor([1]), nonsense=1)


def test_traced_params_are_bound_by_the_table():
    seen = []
    from mgtrace._core import index, nn, reduce, trace_hooks

    class Hook(trace_hooks.TraceHook):
        def on_apply(self, op, *inputs):
            seen.append((op.name, op.params, len(inputs)))
            return super().on_apply(op, *inputs)

    x = mt.tensor([[3.0, 1.0], [2.0, 5.0]])
    with trace_hooks.installed(Hook()):
        a = reduce.topk(x, 1, descending=False)
        b = index.concat([x, x], 1)
        c = nn.pad(x, [[1, 0], [0, 1]])
    assert seen == [("topk", {"k": 1, "axis": -1, "descending": False, "sorted": True}, 1),
                    ("concat", {"axis": 1}, 2),
                    ("pad", {"pad_width": ((1, 0), (0, 1)), "mode": "constant", "value": 0.0}, 1)]
    assert a[0].tolist() == [[1.0], [2.0]] and b.shape == (2, 4) and c.shape == (3, 3)
    with pytest.raises(TypeError, match="list or tuple"):
        with trace_hooks.installed(Hook()):
            index.concat(x)
