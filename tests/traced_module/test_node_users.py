"""Node.users bookkeeping: each user listed once, in the order added, and
adding n users costs O(n) -- counted as the list elements visited, not
timed (a list that counts every element its iterators hand out)."""
from mgtrace.traced_module.node import TensorNode


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
