"""Pattern rewriting: find a small subgraph, put another in its place
(torch.fx's ``subgraph_rewriter`` in mgtrace's graph IR).

The pattern and its replacement are plain functions of tensors, written as
in a forward::

    def pattern(x, w):
        return F.relu(F.matmul(x, w))

    def replacement(x, w):
        return F.linear_act(x, w.transpose(1, 0), act="relu")

    matches = replace_pattern(tm, pattern, replacement)

``pattern`` is recorded (not run) on placeholder nodes, one per parameter,
into a small graph; each of ``tm``'s graphs (those of traced submodules
too, each once) is searched for places that compute the same thing: the
same functions, methods and operators, with the same non-tensor arguments
(literals must be equal), wired the same way. A pattern parameter matches
any node; one used twice must match the same node twice. A match is
replaced only when its inner values (all but the parameters and the
result) have no users outside the match, so nothing else loses a value;
matches do not overlap (later exprs are matched first). The replacement is
called on the matched nodes inside ``graph.insert_exprs``, right after the
matched result, whose users then read the replacement's result; dead
exprs are removed and every changed graph is linted.

Only CallFunction and CallMethod exprs (functions, tensor methods,
operators) can appear in a pattern: module calls and attribute reads are
matched by other means (see ``fuse.py``).
"""
import collections
import inspect

from mgtrace.module.module import Module
from mgtrace.traced_module.expr import CallFunction, CallMethod, Input, is_node
from mgtrace.traced_module.graph import InternalGraph
from mgtrace.traced_module.node import ModuleNode, Node, TensorNode
from mgtrace.traced_module.passes.match import bound_args, unwrap
from mgtrace.traced_module.passes.util import graphs_of
from mgtrace.traced_module.pytree import tree_flatten
from mgtrace.traced_module.traced_module import TracedModule

__all__ = ["replace_pattern", "Match"]

Match = collections.namedtuple("Match", "graph anchor inputs")
"""One replaced match: its graph, the expr that computed the matched result,
and ``{pattern parameter name: the graph node it matched}``."""


class _PatternHost(Module):
    """The owner of a pattern's scratch graph (insert_exprs needs one)."""

    def forward(self, *args):
        raise RuntimeError("a pattern graph is not run")


def pattern_graph(fn, what="pattern"):
    """``(graph, input nodes, output node)``: ``fn`` recorded on placeholders."""
    if not callable(fn):
        raise TypeError(f"replace_pattern: the {what} must be a function, got {fn!r}")
    params = list(inspect.signature(fn).parameters.values())
    if any(p.kind not in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params):
        raise TypeError(f"replace_pattern: the {what} {fn.__name__} must take plain positional "
                        "parameters (one per input tensor)")
    host = TracedModule._shell(_PatternHost(), what)
    g = InternalGraph(what, what, owner=host)
    host._graphs.append(g)
    g._add_input(g._add_node(ModuleNode(name="self", owner=host), "self"))
    inputs = [g._add_input(g._add_node(TensorNode(name=p.name), p.name)) for p in params]
    with g.insert_exprs():
        out = fn(*inputs)
    if not isinstance(out, Node) or out.graph is not g:
        raise TypeError(f"replace_pattern: the {what} must return one tensor computed from its "
                        f"parameters, got {out!r}")
    if any(o is out for o in inputs):
        raise TypeError(f"replace_pattern: the {what} returns its input unchanged")
    for e in g._exprs:
        if not isinstance(e, (Input, CallFunction, CallMethod)) or (
                isinstance(e, CallMethod) and e.method == "__call__"):
            raise TypeError(f"replace_pattern: the {what} may only call functions, tensor methods "
                            f"and operators; it recorded {e!r}")
    return g, inputs, out


def _arguments(e):
    """An expr's arguments as (TreeDef, node leaves): by parameter name for
    functions (so positional and keyword spellings match)."""
    if isinstance(e, CallFunction):
        b = bound_args(e)
        if b is not None:
            leaves, tdef = tree_flatten(b, is_node)
            return tdef, leaves
    leaves, tdef = tree_flatten((e.args[1:] if isinstance(e, CallMethod) else e.args, e.kwargs),
                                is_node)
    if isinstance(e, CallMethod):
        leaves = [e.args[0]] + leaves
    return tdef, leaves


def _same_op(pe, ge):
    if type(pe) is not type(ge) or len(pe.outputs) != len(ge.outputs):
        return False
    if isinstance(pe, CallFunction):
        return unwrap(pe.func) is unwrap(ge.func)
    return pe.method == ge.method and pe.method != "__call__"


class _Matcher:
    def __init__(self, inputs):
        self.inputs = {id(n) for n in inputs}
        self.env = {}          # id(pattern node) -> graph node
        self.exprs = {}        # id(pattern expr) -> graph expr

    def node(self, pn, gn):
        seen = self.env.get(id(pn))
        if seen is not None:
            return seen is gn
        if id(pn) in self.inputs:
            if not isinstance(gn, Node) or isinstance(gn, ModuleNode):
                return False
            self.env[id(pn)] = gn
            return True
        pe, ge = pn.expr, gn.expr
        if ge is None or not _same_op(pe, ge) or pe.outputs.index(pn) != _index(ge.outputs, gn):
            return False
        if self.exprs.get(id(pe), ge) is not ge:
            return False
        pdef, pleaves = _arguments(pe)
        gdef, gleaves = _arguments(ge)
        if pdef != gdef or len(pleaves) != len(gleaves):
            return False
        self.env[id(pn)] = gn
        self.exprs[id(pe)] = ge
        return all(self.node(p, q) for p, q in zip(pleaves, gleaves))


def _index(nodes, n):
    for i, m in enumerate(nodes):
        if m is n:
            return i
    return -1


def _closed(m, out, graph):
    """Whether the match's inner nodes (all but its inputs and its result
    ``out``) are read only inside the match."""
    inside = {id(e) for e in m.exprs.values()}
    for pid, gn in m.env.items():
        if pid in m.inputs or gn is out:
            continue
        if any(o is gn for o in graph._outputs) or any(id(u) not in inside for u in gn.users):
            return False
    return True


def replace_pattern(tm, pattern, replacement):
    """Replace every match of ``pattern`` in ``tm``'s graphs by
    ``replacement`` (see the module docstring), in place.

    Args:
        tm: a TracedModule; all its graphs and those of its traced
            submodules are searched.
        pattern: a function of tensors returning one tensor, using
            mgtrace.functional functions, tensor methods and operators.
        replacement: a function with the same parameters returning one
            tensor (what it computes is recorded after each match).

    Returns:
        list of :class:`Match`, one per replacement made.

    Raises:
        TypeError: a pattern or replacement that is not a function of
            positional tensor parameters returning one tensor, or a pattern
            that calls modules; parameter counts that differ.
        GraphError: the replacement uses a node it may not (as
            ``insert_exprs``).

    >>> import numpy as np, mgtrace as mt, mgtrace.functional as F, mgtrace.module as M
    >>> from mgtrace.traced_module import replace_pattern
    >>> class Net(M.Module):
    ...     def forward(self, x):
    ...         return F.relu(x * 2.0) + 1.0
    >>> x = mt.tensor(np.array([-1.0, 3.0], np.float32))
    >>> tm = mt.trace_module(Net(), x)
    >>> found = replace_pattern(tm, lambda a: F.relu(a * 2.0), lambda a: F.relu(a) * 2.0)
    >>> len(found), tm(x).tolist()
    (1, [1.0, 7.0])
    """
    _, p_inputs, p_out = pattern_graph(pattern, "pattern")
    n_repl = len(inspect.signature(replacement).parameters) if callable(replacement) else None
    if n_repl != len(p_inputs):
        raise TypeError(f"replace_pattern: the replacement must take the pattern's "
                        f"{len(p_inputs)} parameter(s), got {replacement!r}")
    names = [n.name for n in p_inputs]
    matches = []
    for g in list(graphs_of(tm)):
        consumed = set()
        found = []
        for ge in reversed(g._exprs):
            if id(ge) in consumed or not _same_op(p_out.expr, ge):
                continue
            gn = ge.outputs[_index(p_out.expr.outputs, p_out)]
            m = _Matcher(p_inputs)
            if not m.node(p_out, gn) or not _closed(m, gn, g):
                continue
            ids = {id(e) for e in m.exprs.values()}
            if ids & consumed:
                continue
            consumed |= ids
            found.append((ge, gn, [m.env[id(p)] for p in p_inputs]))
        for ge, gn, args in found:
            with g.insert_exprs(ge):
                new = replacement(*args)
            if not isinstance(new, Node) or new.graph is not g:
                raise TypeError(f"replace_pattern: the replacement must return one node of the "
                                f"graph, got {new!r}")
            g.replace_node({gn: new})
            matches.append(Match(g, ge, dict(zip(names, args))))
        if found:
            g.compile()
            g.lint()
    return matches

