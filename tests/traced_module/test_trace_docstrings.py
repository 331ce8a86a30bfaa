"""The examples in the docstrings of the tracing side of mgtrace.traced_module
(pytree, tracer and what it uses, codegen, traced_module, the package's wrap) run and print
what they claim."""
import doctest
import importlib

import pytest

import mgtrace  # noqa: F401

MODULES = ["mgtrace.traced_module", "mgtrace.traced_module.pytree",
           "mgtrace.traced_module.tracer", "mgtrace.traced_module.codegen",
           "mgtrace.traced_module.traced_module", "mgtrace.traced_module.expr",
           "mgtrace.traced_module.symbolic", "mgtrace.traced_module.signature",
           "mgtrace.traced_module.edit", "mgtrace.traced_module.errors"]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    result = doctest.testmod(importlib.import_module(name),
                             optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0


def test_the_public_entry_points_have_examples():
    finder = doctest.DocTestFinder()
    import mgtrace.traced_module as tmod
    for obj in (tmod.trace_module, tmod.wrap, tmod.register_supported_type):
        assert any(t.examples for t in finder.find(obj)), obj.__name__
