"""The examples in the graph-editing docstrings (graph.py, node.py) run and
print what they claim."""
import doctest

import pytest

import mgtrace.traced_module.graph as graph_mod
import mgtrace.traced_module.node as node_mod


@pytest.mark.parametrize("mod", [graph_mod, node_mod], ids=lambda m: m.__name__)
def test_docstring_examples(mod):
    result = doctest.testmod(mod, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0


def test_graph_module_has_a_runnable_example():
    assert doctest.testmod(graph_mod).attempted >= 8
