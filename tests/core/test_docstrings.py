"""The examples in the core's docstrings run and print what they claim."""
import doctest
import importlib

import pytest

import mgtrace  # noqa: F401  (loads the core in order)

MODULES = ["dtype", "device", "tensor", "dispatch", "index", "reduce", "linalg", "nn"]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    mod = importlib.import_module(f"mgtrace._core.{name}")
    result = doctest.testmod(mod, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0


def test_public_api_has_examples():
    found = sum(doctest.testmod(importlib.import_module(f"mgtrace._core.{m}")).attempted for m in MODULES)
    assert found >= 100
