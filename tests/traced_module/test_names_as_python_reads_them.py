"""Names that Python reads as one (NFKC form: the ligature "\ufb01" is "fi"):
a rename or a module tree that would make two of them is refused, naming
both, and a graph never computes with the wrong node."""
import io

import numpy as np
import pytest

import mgtrace as mt
import mgtrace.module as M
from mgtrace.traced_module import GraphError, TraceError

LIGATURE = "\ufb01"            # NFKC form: "fi"


def _x():
    return mt.tensor(np.arange(6, dtype=np.float32).reshape(2, 3))


class Diff(M.Module):
    def forward(self, x):
        return (x + 1) - (x * 10)


def _expected(x):
    return (x + 1) - (x * 10)


def test_renaming_a_node_to_a_name_python_reads_as_another_is_refused():
    x = _x()
    tm = mt.trace_module(Diff(), x)
    add, mul = [n for n in tm.graph.nodes(False) if n.name in ("add", "mul")]
    add.name = "fi"
    with pytest.raises(GraphError, match=f"already has a node named 'fi'; '{LIGATURE}' is that "
                                         r"name as Python reads identifiers \(NFKC form\)"):
        mul.name = LIGATURE
    assert mul.name == "mul"               # nothing changed
    tm.graph.lint()
    np.testing.assert_array_equal(tm(x).numpy(), _expected(x.numpy()))


def test_a_node_name_is_kept_as_python_reads_it():
    x = _x()
    tm = mt.trace_module(Diff(), x)
    mul = tm.graph.get_node_by_name("mul").as_unique()
    mul.name = LIGATURE
    assert mul.name == "fi" and tm.graph.get_node_by_name("fi").as_unique() is mul
    buf = io.BytesIO()
    mt.save(tm, buf)
    loaded = mt.load(io.BytesIO(buf.getvalue()))
    np.testing.assert_array_equal(loaded(x).numpy(), _expected(x.numpy()))


def test_tensor_names_that_python_reads_as_one_name_two_nodes_apart():
    class Named(M.Module):
        def forward(self, x):
            a = x + 1
            a.name = "fi"
            b = x * 10
            b.name = LIGATURE             # taken to Python: made unique, as for a repeat
            return a - b

    x = _x()
    tm = mt.trace_module(Named(), x)      # the code named both "fi" (an UnboundLocalError)
    names = [n.name for n in tm.graph.nodes(False)]
    assert "fi" in names and "fi_1" in names
    np.testing.assert_array_equal(tm(x).numpy(), _expected(x.numpy()))
    buf = io.BytesIO()
    mt.save(tm, buf)
    np.testing.assert_array_equal(mt.load(io.BytesIO(buf.getvalue()))(x).numpy(),
                                  _expected(x.numpy()))


class TwoKeys(M.Module):
    def __init__(self, as_dict):
        super().__init__()
        if as_dict:
            self.d = {"fi": M.Linear(3, 2), LIGATURE: M.Linear(3, 2)}
        else:
            setattr(self, "fi", M.Linear(3, 2))
            setattr(self, LIGATURE, M.Linear(3, 2))

    def forward(self, x):         # never runs: the tree is refused first
        return x


@pytest.mark.parametrize("as_dict, first, second", [
    (False, "fi", LIGATURE), (True, "d.fi", f"d.{LIGATURE}")])
def test_module_keys_that_python_reads_as_one_are_refused_at_trace_time(as_dict, first, second):
    with pytest.raises(TraceError, match=f"TwoKeys: the members '{first}' and '{second}' are "
                                         r"one name to Python \(NFKC form"):
        mt.trace_module(TwoKeys(as_dict), _x())


def test_renaming_a_graph_to_a_name_python_reads_as_another_is_refused():
    class Sub(M.Module):
        def forward(self, x):
            return x * 2

    class Top(M.Module):
        def __init__(self):
            super().__init__()
            self.s = Sub()

        def forward(self, x):
            return self.s(x) + 1

    x = _x()
    tm = mt.trace_module(Top(), x)
    tm.s.graph.name = "fi"
    with pytest.raises(GraphError, match=f"the name '{LIGATURE}' is graph Top.s's name 'fi' as "
                                         r"Python reads identifiers \(NFKC form\)"):
        tm.graph.name = LIGATURE
    assert tm.graph.name == "Top"
    with pytest.raises(GraphError, match="the name 'fi' is graph Top.s's name 'fi', so"):
        tm.graph.name = "fi"              # the very same name, on another module's graph
    assert tm.graph.name == "Top"
    np.testing.assert_array_equal(tm(x).numpy(), x.numpy() * 2 + 1)


class _Relu(M.Module):
    def forward(self, x, y=None):
        return mt.functional.relu(x if y is None else x - y)


class _Three(M.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = _Relu(), _Relu(), _Relu()

    def forward(self, x):
        return self.c(self.b(self.a(x))) + self.a(x, x * 0.5)    # a: two call signatures


def test_renaming_a_graph_to_a_sibling_graphs_name_is_refused_naming_both():
    x = _x() - 2.0
    tm = mt.trace_module(_Three(), x)
    assert [g.name for g in tm.a._graphs] == ["_Three_a", "_Three_a"]   # one per signature
    with pytest.raises(GraphError, match="graph _Three.b: the name '_Three_a' is graph "
                                         "_Three.a's name '_Three_a', so"):
        tm.b.graph.name = "_Three_a"
    tm.b.graph.name = f"_Three_{LIGATURE}"
    with pytest.raises(GraphError, match=f"the name '_Three_fi' is graph _Three.b's name "
                                         f"'_Three_{LIGATURE}' as Python reads identifiers"):
        tm.c.graph.name = "_Three_fi"
    assert tm.c.graph.name == "_Three_c"
    # the graphs of one module share its name, renamed together or apart
    g0, g1 = tm.a._graphs
    g0.name = "_Three_first"
    g1.name = "_Three_first"
    assert [g.name for g in tm.a._graphs] == ["_Three_first", "_Three_first"]
    relus = tm.graph.get_node_by_name(f"_Three_{LIGATURE}_relu*").as_list() + \
        tm.graph.get_node_by_name("_Three_c_relu*").as_list()
    assert len(relus) == 2 and len({id(n) for n in relus}) == 2
    v = x.numpy()
    want = np.maximum(np.maximum(np.maximum(v, 0), 0), 0) + np.maximum(v - v * 0.5, 0)
    np.testing.assert_allclose(tm(x).numpy(), want, rtol=1e-6)


def test_renaming_a_graph_sees_the_tree_after_a_load():
    tm = mt.trace_module(_Three(), _x())
    buf = io.BytesIO()
    mt.save(tm, buf)
    got = mt.load(io.BytesIO(buf.getvalue()))
    with pytest.raises(GraphError, match="is graph _Three.a's name '_Three_a'"):
        got.c.graph.name = "_Three_a"


def test_a_member_python_reads_as_another_is_refused_at_setattr():
    class P(M.Module):
        def __init__(self):
            super().__init__()
            self.fi = M.Linear(3, 3)

        def forward(self, x):
            return self.fi(x)

    tm = mt.trace_module(P(), _x())
    for value in (M.Linear(3, 3), mt.tensor(np.zeros(3, "float32")), 3):
        with pytest.raises(ValueError, match=f"member '{LIGATURE}' is member 'fi' as Python "
                                             r"reads identifiers \(NFKC form 'fi'\)"):
            setattr(tm, LIGATURE, value)
    assert list(tm.state_dict()) == ["fi.weight", "fi.bias"]
    tm.fi = M.Linear(3, 3)                 # the same name replaces, as always
    tm.fj = 3
