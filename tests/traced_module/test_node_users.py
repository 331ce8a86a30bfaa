"""Node.users bookkeeping: each user listed once, in the order added, and
adding n users costs O(n) -- counted as the list elements visited, not
timed (a list that counts every element its iterators hand out)."""
import numpy as np
import pytest

import mgtrace as mt
import mgtrace.functional as F
import mgtrace.module as M
from mgtrace.traced_module.errors import GraphError
from mgtrace.traced_module.node import TensorNode, unlink_users


class _CountingList(list):
    visited = 0

    def __iter__(self):
        for x in list.__iter__(self):
            _CountingList.visited += 1
            yield x

    def __reversed__(self):
        for x in list.__reversed__(self):
            _CountingList.visited += 1
            yield x


class _Expr:
    """Stands for an expr: users are compared by identity only."""


def test_ten_thousand_users_cost_linear_work():
    n = 10_000
    node = TensorNode(name="x")
    node.users = _CountingList()
    exprs = [_Expr() for _ in range(n)]
    _CountingList.visited = 0
    for e in exprs:
        node._add_user(e)
        node._add_user(e)           # an expr taking the node twice is listed once
    assert list.__len__(node.users) == n
    assert all(a is b for a, b in zip(list.__iter__(node.users), exprs))
    # a scan per call would visit about n * n / 2 = 50,000,000 elements
    assert _CountingList.visited <= 4 * n, _CountingList.visited


def test_users_stay_distinct_after_the_list_changes():
    node = TensorNode(name="x")
    exprs = [_Expr() for _ in range(40)]
    for e in exprs:
        node._add_user(e)
    node._remove_user(exprs[3])               # a new list: the id set is made again
    node._add_user(exprs[5])
    assert len(node.users) == 39 and exprs[3] not in node.users
    node.users.pop()                          # changed in place: another length, made again
    node._add_user(exprs[-1])
    node._add_user(exprs[-1])
    node._add_user(exprs[3])
    assert [id(u) for u in node.users] == [id(e) for e in exprs if e is not exprs[3]] + [id(exprs[3])]


class _Reader(_Expr):
    """Stands for an expr reading ``node``: what unlink_users looks at."""

    def __init__(self, node):
        self._inputs = [node]


def test_dropping_ten_thousand_users_costs_linear_work():
    n = 10_000
    node = TensorNode(name="x")
    exprs = [_Reader(node) for _ in range(n)]
    node.users = _CountingList(exprs)
    _CountingList.visited = 0
    unlink_users(exprs[::2])            # one at a time: about n * n / 4 visits
    assert _CountingList.visited <= 2 * n, _CountingList.visited
    assert [id(u) for u in node.users] == [id(e) for e in exprs[1::2]]


def test_replace_node_moves_thousands_of_users_in_order():
    class Fan(M.Module):
        def forward(self, x):
            out = x
            for i in range(2000):
                out = out + x * float(i % 7)
            return out

    x = mt.tensor(np.arange(6, dtype=np.float32).reshape(2, 3))
    tm = mt.trace_module(Fan(), x)
    g = tm.graph
    inp = g.inputs[1]
    assert len(inp.users) == 2001
    with pytest.raises(GraphError, match="expected an expr, got the node"):
        with g.insert_exprs(inp):
            pass
    with g.insert_exprs(inp.expr):      # read x through a negation: -x everywhere
        neg = F.neg(inp)
    g.replace_node({inp: neg})
    g.compile()
    assert len(inp.users) == 1 and len(neg.users) == 2001
    expect = -np.arange(6, dtype=np.float32).reshape(2, 3) * (1 + sum(i % 7 for i in range(2000)))
    np.testing.assert_allclose(tm(x).numpy(), expect, rtol=1e-5)
