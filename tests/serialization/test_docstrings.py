"""The examples in mgtrace.serialization's docstrings run and print what they claim."""
import doctest
import importlib
import pkgutil

import pytest

import mgtrace.serialization

MODULES = ["mgtrace.serialization"] + [
    f"mgtrace.serialization.{m.name}" for m in pkgutil.iter_modules(mgtrace.serialization.__path__)]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    result = doctest.testmod(importlib.import_module(name),
                             optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0


def test_public_functions_are_documented():
    for name in mgtrace.serialization.__all__:
        obj = getattr(mgtrace.serialization, name)
        assert obj.__doc__ and len(obj.__doc__) > 40, name
