"""The examples in mgtrace.quantization's docstrings run and print what
they say."""
import doctest
import importlib

import pytest

MODULES = ["mgtrace.quantization", "mgtrace.quantization.qconfig", "mgtrace.quantization.int8"]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    result = doctest.testmod(importlib.import_module(name))
    assert result.attempted > 0 and result.failed == 0

