"""Every Tensor method and operator of the op table, traced: the tracer
records the table's form (method, reflected, in-place), generated code
spells it the table's way, and the archive stores and runs it again."""
import io
import operator

import numpy as np
import pytest

import mgtrace as mt
import mgtrace.module as M
from mgtrace._core import op_table
from mgtrace._core.op_table import OPS
from mgtrace.traced_module.expr import CallMethod

FX = np.array([[1.5, -2.0], [3.0, 4.0]], np.float32)
IX = np.array([[6, 3], [5, 12]], np.int32)


def module_of(fn):
    """A module whose forward is ``fn`` (a class member: archives keep no functions)."""
    return type("Fn", (M.Module,), {"forward": lambda self, x: fn(x)})()


def _inplace(method):
    def fn(x):
        t = x + 0
        getattr(t, method)(x)
        return t
    return fn


def _setitem(x):
    t = x + 0
    t[0] = 7
    return t


def cases():
    """(id, input, fn, method the graph should call)."""
    views = {"reshape": lambda x: x.reshape(4), "transpose": lambda x: x.transpose(1, 0),
             "expand_dims": lambda x: x.expand_dims(0),
             "squeeze": lambda x: x.expand_dims(0).squeeze(0),
             "broadcast_to": lambda x: x.broadcast_to((3, 2, 2)),
             "astype": lambda x: x.astype("int32"), "getitem": lambda x: x[0],
             "setitem": _setitem}
    for op in OPS.values():
        if op.method is None:
            continue
        data = IX if op.group == "bitwise" else FX
        if op.name in views:
            yield op.name, data, views[op.name], op.method
        elif op.group == "reduce":
            yield op.name, data, lambda x, m=op.method: getattr(x, m)(axis=0), op.method
        elif op.arity == 1:
            yield op.name, data, lambda x, m=op.method: getattr(x, m)(), op.method
        else:
            yield op.name, data, lambda x, m=op.method: getattr(x, m)(x * 2), op.method
            # 2 <op> x: Python asks x for the reflected form (x.__radd__, x.__gt__ for <)
            other = [[2, 1], [1, 2]] if op.name == "matmul" else 2
            yield f"{op.name}-reflected", data, \
                lambda x, f=getattr(operator, op.pyop), o=other: f(o, x), op.reflected
            if op.inplace:
                yield f"{op.name}-inplace", data, _inplace(op.inplace), op.inplace


CASES = list(cases())


@pytest.mark.parametrize("data, fn, method", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_traced_form_runs_prints_and_round_trips(data, fn, method):
    x = mt.tensor(data)
    eager = fn(mt.tensor(data))
    tm = mt.trace_module(module_of(fn), x)
    called = [e.method for e in tm.graph.exprs() if isinstance(e, CallMethod)]
    assert method in called
    assert method in op_table.tensor_methods()
    np.testing.assert_array_equal(tm(mt.tensor(data)).numpy(), eager.numpy())
    op, role = op_table.by_method()[method]
    if op.symbol and op.group != "index" and role != "inplace":
        assert op.symbol.strip("()") in tm.code and method not in tm.code  # x + y, not x.__add__(y)
    buf = io.BytesIO()
    mt.save(tm, buf)
    loaded = mt.load(io.BytesIO(buf.getvalue()))
    np.testing.assert_array_equal(loaded(mt.tensor(data)).numpy(), eager.numpy())


def test_operator_functions_print_by_their_public_name():
    class Pad8(M.Module):
        def forward(self, x):
            n = x.shape[0]
            return x.reshape(((n + 7) & ~7) >> 3, -1)

    tm = mt.trace_module(Pad8(), mt.tensor(np.zeros((8, 2), np.float32)))
    text = str(tm.graph)
    assert "operator.and_(" in text and "operator.rshift(" in text and "_operator" not in text
    assert " & " in tm.code and " >> " in tm.code and "~" not in tm.code   # ~7 folded: a constant
    out = tm(mt.tensor(np.zeros((16, 2), np.float32)))
    assert out.shape == (2, 16)      # ((16 + 7) & -8) >> 3 == 2 rows at batch 16
