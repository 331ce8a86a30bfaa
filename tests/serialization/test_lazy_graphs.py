"""A lazy load (``mmap=True, verify=False``: trusted bytes that stay
mapped) builds modules and maps weights but reads no graph until one is
first used; the first use reads every graph of the load with every check an
eager load makes. Proved against an eager load of the same bytes: the same
code, node and expr ids and names, outputs; a hostile graph fails at first
use with the eager load's ArchiveError (tests/serialization/
test_traced_hostile.py runs every hostile edit both ways)."""
import copy
import gc
import threading
import weakref

import numpy as np
import pytest

import mgtrace as mt
from mgtrace.errors import ArchiveError
from mgtrace.traced_module import TracedModule
from mgtrace.traced_module.traced_module import PENDING_GRAPHS

from .helpers import edit, load_bytes, save_bytes
from .traced_nets import assert_identical, every_expr_inputs, every_expr_net, trace_quiet


@pytest.fixture(scope="module")
def archive():
    tm = trace_quiet(every_expr_net(), *every_expr_inputs(2))
    return tm, save_bytes(tm)


def _traced(m):
    return [x for x in m.modules() if isinstance(x, TracedModule)]


def _unread(m):
    return [x for x in _traced(m) if "_graphs" not in x.__dict__]


def _ids(m):
    return [(g.qualname, [(e._id, e.kind, [(o._id, o.name) for o in e.outputs]) for e in g._exprs])
            for x in _traced(m) for g in x._graphs]


def test_a_lazy_load_reads_no_graph_until_one_is_used(archive):
    tm, data = archive
    lazy = load_bytes(data, mmap=True, verify=False)
    traced = _traced(lazy)
    assert len(traced) > 3 and _unread(lazy) == traced
    lazy.eval()                                  # setting training reads nothing
    lazy.state_dict()                            # neither do the weights
    assert _unread(lazy) == traced and all(PENDING_GRAPHS in x.__dict__ for x in traced)
    x = every_expr_inputs(3, seed=1)
    assert_identical(lazy(*x), tm(*x))           # the first call reads every graph of the load
    assert _unread(lazy) == [] and not any(PENDING_GRAPHS in t.__dict__ for t in traced)


def test_lazy_graphs_equal_eager_ones(archive):
    _, data = archive
    eager = load_bytes(data)
    lazy = load_bytes(data, mmap=True, verify=False)
    assert lazy.code == eager.code
    assert _ids(lazy) == _ids(eager)
    for g in (g for x in _traced(lazy) for g in x._graphs):
        g.lint()
    # nodes added by an edit take the ids after the load's, as after an eager load
    n_eager = eager.graph._ids.next_node
    assert lazy.graph._ids.next_node == n_eager > 0


@pytest.mark.parametrize("first_use", ["deepcopy", "copy", "save", "setattr", "graph",
                                       "submodule_call"])
def test_every_first_use_reads_the_graphs(archive, first_use):
    tm, data = archive
    lazy = load_bytes(data, mmap=True, verify=False)
    x = every_expr_inputs(2, seed=2)
    if first_use == "deepcopy":
        out = copy.deepcopy(lazy)
    elif first_use == "copy":                     # a shallow copy before first use: its
        out = copy.copy(lazy)                     # call failed, "no attribute '_graphs'"
        assert out is not lazy and out._graphs is lazy._graphs
    elif first_use == "save":
        out = load_bytes(save_bytes(lazy))
        assert save_bytes(lazy) == save_bytes(load_bytes(data))
    elif first_use == "setattr":
        lazy.extra = 3                            # an edit sees the graphs as loaded
        out = lazy
    elif first_use == "graph":
        assert len(lazy.graph._exprs) == len(tm.graph._exprs)
        out = lazy
    else:
        child = next(x for x in _traced(lazy) if x is not lazy)
        child._graphs                             # a submodule's graphs: the whole load's
        out = lazy
    assert _unread(lazy) == []
    assert_identical(out(*x), tm(*x))


def _break_first_graph(h):
    top = next(m for m in h["modules"] if m["kind"] == "traced" and m["is_top"])
    expr = next(e for e in top["graphs"][0]["exprs"] if e["kind"] == "getattr")
    expr["module"] = 10 ** 6                      # a node no graph defines


def test_a_broken_graph_fails_at_first_use_as_an_eager_load_fails(archive):
    tm, data = archive
    bad = edit(data, _break_first_graph)
    with pytest.raises(ArchiveError) as eager:
        load_bytes(bad)
    lazy = load_bytes(bad, mmap=True, verify=False)        # trusted: nothing read yet
    x = every_expr_inputs(2)
    for _ in range(2):                                     # and every later use again
        with pytest.raises(ArchiveError) as first:
            lazy(*x)
        assert str(first.value) == str(eager.value)
        assert "is not defined" in str(first.value)
    assert _unread(lazy) == _traced(lazy)                  # no module left half-read
    with pytest.raises(ArchiveError):
        copy.deepcopy(lazy)


def test_copy_and_verified_loads_stay_eager(archive):
    _, data = archive
    for kwargs in ({}, {"mmap": True}, {"verify": False}):
        assert _unread(load_bytes(data, **kwargs)) == []


def test_threads_calling_a_lazy_module_read_it_once(archive):
    tm, data = archive
    lazy = load_bytes(data, mmap=True, verify=False)
    x = every_expr_inputs(2, seed=3)
    want = tm(*x)
    outs, errors = [], []

    def run():
        try:
            outs.append(lazy(*x))
        except Exception as e:        # noqa: BLE001  reported below
            errors.append(e)
    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and len(outs) == 4
    for out in outs:
        assert_identical(out, want)
    graphs = [id(g) for x_ in _traced(lazy) for g in x_._graphs]
    assert len(graphs) == len(set(graphs))


def test_a_lazy_module_dropped_unread_is_freed(archive, tmp_path):
    _, data = archive
    path = tmp_path / "net.tmod"
    path.write_bytes(data)
    lazy = mt.load(path, mmap=True, verify=False)
    refs = [weakref.ref(x) for x in _traced(lazy)]
    del lazy
    gc.collect()
    assert [r() for r in refs] == [None] * len(refs)      # and with them the reader and its map
