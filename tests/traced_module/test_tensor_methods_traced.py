"""Every Tensor method that returns a tensor computed from its input is
recorded by the tracer: called on a traced input, the traced module run on
a second input gives what the method gives eagerly on it, and no tensor is
frozen into the graph as a Constant.

The methods are enumerated from ``dir(Tensor)`` (public names, and the
dunders Tensor defines) and the op table: op-table methods get arguments
from their row's group, the others from RECIPES; SKIP lists, with the
reason, the members that return no tensor computed from the input. A
member that is in none of them fails :func:`test_every_member_is_covered`,
so a method added later is covered or fails."""
import copy
import warnings

import numpy as np
import pytest

import mgtrace as mt
import mgtrace.module as M
from mgtrace._core import op_table
from mgtrace.traced_module.expr import Constant
from mgtrace.traced_module.node import TensorNode
from mgtrace.traced_module.tracer import TraceWarning

RNG = np.random.default_rng(29)
# two inputs of one shape and different values: the trace runs on the first,
# the traced module on the second (a frozen value would show)
FLOATS = [RNG.uniform(0.5, 2.0, (3, 3)).astype(np.float32) for _ in range(2)]
INTS = [RNG.integers(1, 9, (3, 3)).astype(np.int32) for _ in range(2)]

# Members with no tensor computed from the input as their result.
SKIP = {
    # values that leave the graph (the tracer warns that it fixes them)
    "item", "tolist", "numpy", "__array__", "__bool__", "__int__", "__float__", "__index__",
    "__len__",
    # metadata, no values (``shape`` is recorded as a shape read: test_trace_shapes.py)
    "shape", "ndim", "size", "dtype", "device", "strides", "itemsize", "nbytes",
    "is_contiguous", "readonly", "data_ptr", "name", "grad",
    # device movers: a graph is traced on one device
    "to",
    # zero-copy exchange: memory, not a computation
    "__dlpack__", "__dlpack_device__", "__array_ufunc__",
    # the Python object protocol
    "__init__", "__new__", "__repr__", "__hash__", "__reduce__", "__getattr__",
    "__getattribute__", "__dict__", "__doc__",
    # ``del t[i]`` is refused (a tensor's shape is fixed)
    "__delitem__",
}


def _setitem(x):
    t = x + 0
    t[0] = 7
    return t


# Members that are no op-table method (each returns tensors of its input).
RECIPES = {
    "view": lambda x: x.view(-1),
    "flatten": lambda x: x.flatten(),
    "permute": lambda x: x.permute(1, 0),
    "copy": lambda x: x.copy(),
    "detach": lambda x: x.detach(),
    "contiguous": lambda x: x.T.contiguous(),      # a strided input: a real copy
    "T": lambda x: x.T,
    "__copy__": lambda x: copy.copy(x),
    "__deepcopy__": lambda x: copy.deepcopy(x),
    "__iter__": lambda x: list(x),
}

# Op-table methods whose params need values (the others: by group below).
PARAM_ARGS = {
    "reshape": ((-1,),), "transpose": ((1, 0),), "expand_dims": (0,),
    "squeeze": (None,), "broadcast_to": ((2, 3, 3),), "astype": ("int32",),
}


def _op_recipe(op, role):
    """How to call the member of op-table row ``op`` in ``role``."""
    m = getattr(op, role)
    if op.name == "getitem":
        return lambda x: x[1:, 0]
    if op.name == "setitem":
        return _setitem
    if op.group in op_table.POSITIONAL_PARAMS:
        return lambda x: getattr(x, m)(*PARAM_ARGS[op.name])
    if op.group == "reduce":
        return lambda x: getattr(x, m)(axis=0)
    if op.arity == 1:
        return lambda x: getattr(x, m)()
    if role == "inplace":
        def inplace(x):
            t = x + 0
            getattr(t, m)(x)
            return t
        return inplace
    if role == "reflected":                         # other <op> x with a non-tensor other
        other = [[2, 1, 0], [1, 2, 1], [0, 1, 2]] if op.name == "matmul" else 2
        return lambda x: getattr(x, m)(other)
    return lambda x: getattr(x, m)(x * 2)


def _op_members():
    """``{member: (recipe, int data?)}`` for every op-table method of Tensor."""
    out = {}
    for m, (op, role) in op_table.by_method().items():
        out[m] = (_op_recipe(op, role), op.group == "bitwise")
    return out


def _members():
    """Public names of Tensor and the dunders Tensor itself defines."""
    return {n for n in dir(mt.Tensor) if not n.startswith("_")} | \
        {n for n in vars(mt.Tensor) if n.startswith("__")}


OP_MEMBERS = _op_members()
CASES = sorted({**{m: (r, False) for m, r in RECIPES.items()}, **OP_MEMBERS}.items())


def test_every_member_is_covered():
    covered = set(RECIPES) | set(OP_MEMBERS)
    missing = sorted(_members() - covered - SKIP)
    assert not missing, f"Tensor members neither traced by this test nor in SKIP: {missing}"
    assert not SKIP & covered, f"in SKIP and covered: {sorted(SKIP & covered)}"
    stale = sorted((SKIP | covered) - _members())
    assert not stale, f"no such Tensor members (remove them here): {stale}"


def module_of(fn):
    return type("Fn", (M.Module,), {"forward": lambda self, x: fn(x)})()


def _arrays(out):
    leaves = out if isinstance(out, list) else [out]
    return [t.numpy() for t in leaves]


@pytest.mark.parametrize("member", [c[0] for c in CASES])
def test_member_is_recorded_and_runs_on_a_new_input(member):
    fn, ints = dict(CASES)[member]
    first, second = INTS if ints else FLOATS
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", TraceWarning)
        tm = mt.trace_module(module_of(fn), mt.tensor(first))
    frozen = [str(w.message) for w in caught if "constant" in str(w.message)]
    assert not frozen, frozen
    consts = [e for e in tm.graph.exprs() if isinstance(e, Constant)
              and isinstance(e.outputs[0], TensorNode)]
    assert not consts, consts
    got = _arrays(tm(mt.tensor(second)))
    want = _arrays(fn(mt.tensor(second)))
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_array_equal(g, w)
