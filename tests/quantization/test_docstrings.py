"""The examples in mgtrace.quantization's docstrings run and print what
they say."""
import doctest
import importlib

import numpy as np
import pytest

import mgtrace as mt
import mgtrace.quantization as Q

MODULES = ["mgtrace.quantization", "mgtrace.quantization.qconfig"]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    result = doctest.testmod(importlib.import_module(name))
    assert result.attempted > 0 and result.failed == 0


def test_histogram_refuses_non_finite_input():
    obs = Q.HistogramObserver(bins=8)
    with pytest.raises(Q.QuantizationError, match="non-finite"):
        obs(mt.tensor(np.array([1.0, np.nan], np.float32)))
