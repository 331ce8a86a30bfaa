"""One argument rule at every layer: the same bad argument raises the same
exception type with the same message from mgtrace.functional, the builtin
modules, mgtrace.random and the core (mgtrace._core.args is their one source).

The rule (NumPy's and MegEngine's): a wrong type is a TypeError, the right
type with a bad value or length a ValueError.
"""
import numpy as np
import pytest

import mgtrace as mt
import mgtrace.functional as F
import mgtrace.module as M
import mgtrace.random as R
from mgtrace._core import args as A
from mgtrace._core import nn

X = mt.tensor(np.ones((1, 3, 8, 8), np.float32))
W = mt.tensor(np.ones((4, 3, 3, 3), np.float32))


def _error(call):
    """(exception type, message without its leading 'function: ')."""
    with pytest.raises((TypeError, ValueError, IndexError)) as e:
        call()
    fn, sep, rest = str(e.value).partition(": ")
    assert sep and fn.isidentifier(), f"the message does not start with the function: {e.value}"
    return e.type, rest


# argument, bad value, the exception and message every layer gives
GEOMETRY = [
    ("stride", (1, 1, 1), ValueError, "stride must be an int or a pair of ints, got (1, 1, 1)"),
    ("stride", [2], ValueError, "stride must be an int or a pair of ints, got [2]"),
    ("stride", 1.5, TypeError, "stride must be an int, got float"),
    ("stride", (1, 2.0), TypeError, "stride must be an int, got float"),
    ("stride", "2", TypeError, "stride must be an int, got str"),
    ("stride", True, TypeError, "stride must be an int, not bool"),
    ("stride", 0, ValueError, "stride must be >= 1, got 0"),
    ("stride", (1, -2), ValueError, "stride must be >= 1, got -2"),
    ("padding", -1, ValueError, "padding must be >= 0, got -1"),
    ("dilation", 2 ** 40, ValueError, "dilation must be at most 2147483647 (2**31 - 1), got 1099511627776"),
    ("groups", 1.5, TypeError, "groups must be an int, got float"),
    ("groups", 0, ValueError, "groups must be >= 1, got 0"),
]


@pytest.mark.parametrize("name, value, etype, message", GEOMETRY)
def test_conv2d_arguments_raise_alike_in_functional_module_and_core(name, value, etype, message):
    got = {
        "F.conv2d": _error(lambda: F.conv2d(X, W, **{name: value})),
        "core nn.conv2d": _error(lambda: nn.conv2d(X, W, **{name: value})),
        "M.Conv2d": _error(lambda: M.Conv2d(4, 4, 3, **{name: value})),
        "core conv2d_algorithm": _error(lambda: nn.conv2d_algorithm((1, 3, 8, 8), (4, 3, 3, 3),
                                                                   **{name: value})),
    }
    assert got == {k: (etype, message) for k in got}


@pytest.mark.parametrize("value, etype, message", [
    ((2, 2, 2), ValueError, "kernel_size must be an int or a pair of ints, got (2, 2, 2)"),
    (2.0, TypeError, "kernel_size must be an int, got float"),
    (0, ValueError, "kernel_size must be >= 1, got 0"),
])
def test_pool_kernel_size_raises_alike(value, etype, message):
    got = {
        "F.max_pool2d": _error(lambda: F.max_pool2d(X, value)),
        "core max_pool2d": _error(lambda: nn.max_pool2d(X, value)),
        "M.MaxPool2d": _error(lambda: M.MaxPool2d(value)),
        "F.avg_pool2d": _error(lambda: F.avg_pool2d(X, value)),
        "core avg_pool2d": _error(lambda: nn.avg_pool2d(X, value)),
        "M.AvgPool2d": _error(lambda: M.AvgPool2d(value)),
    }
    assert got == {k: (etype, message) for k in got}


@pytest.mark.parametrize("value, etype, message", [
    ((1, 2, 3), ValueError, "output_size must be an int or a pair of ints, got (1, 2, 3)"),
    (2.5, TypeError, "output_size must be an int, got float"),
    ((2, 0), ValueError, "output_size must be >= 1, got 0"),
])
def test_adaptive_output_size_raises_alike(value, etype, message):
    got = {"core": _error(lambda: nn.adaptive_avg_pool2d(X, value)),
           "M": _error(lambda: M.AdaptiveAvgPool2d(value)),
           # MegEngine calls it oshp in F
           "F": _error(lambda: F.adaptive_avg_pool2d(X, value))}
    got["F"] = (got["F"][0], got["F"][1].replace("oshp", "output_size", 1))
    assert got == {k: (etype, message) for k in got}


def _suffix(call, name):
    """(type, message after '<name> ') for arguments each layer names its own way."""
    etype, rest = _error(call)
    assert rest.startswith(name + " "), rest
    return etype, rest[len(name) + 1:]


def test_an_int_argument_given_a_float_or_a_bool_raises_alike_everywhere():
    for bad, want in [(1.5, (TypeError, "must be an int, got float")),
                      (True, (TypeError, "must be an int, not bool")),
                      ("1", (TypeError, "must be an int, got str"))]:
        got = {
            "F.flatten": _suffix(lambda: F.flatten(X, bad), "start_axis"),
            "M.Flatten": _suffix(lambda: M.Flatten(bad), "start_dim"),
            "random.randint": _suffix(lambda: R.RNG(0).randint(bad), "low"),
            "core sum": _suffix(lambda: X.sum(axis=bad), "axis"),
            "core topk": _suffix(lambda: F.topk(X.reshape(-1), bad), "k"),
            "args.to_int": _suffix(lambda: A.to_int("f", "v", bad), "v"),
        }
        assert got == {k: want for k in got}, bad


def test_probabilities_and_reals_raise_alike():
    for call, name in [(lambda: F.dropout(X, 1.0), "drop_prob"), (lambda: M.Dropout(1.0), "p")]:
        assert _suffix(call, name) == (ValueError, "must be in [0, 1), got 1.0")
    for call, name in [(lambda: F.dropout(X, "a"), "drop_prob"), (lambda: M.Dropout(True), "p"),
                       (lambda: M.BatchNorm2d(3, eps=None), "eps"),
                       (lambda: R.RNG(0).normal(mean="0"), "mean")]:
        etype, msg = _suffix(call, name)
        assert etype is TypeError and msg.startswith("must be a real number, got "), msg
    q = mt.tensor(np.ones((1, 1, 2, 4), np.float32))
    for call in [lambda: F.attention(q, q, q, scale="0.5"), lambda: nn.attention(q, q, q, scale="0.5")]:
        assert _error(call) == (TypeError, "scale must be a real number, got str")
    assert _suffix(lambda: R.RNG(0).uniform(high=float("inf")), "high") == (
        ValueError, "must be finite, got inf")


def test_bools_dtypes_and_shapes_raise_alike():
    for call in [lambda: F.max_pool2d(X, 2, return_indices=1),
                 lambda: M.MaxPool2d(2, return_indices=1)]:
        assert _error(call) == (TypeError, "return_indices must be a bool, got int")
    for call in [lambda: F.zeros((2,), dtype="uint32"), lambda: F.astype(X, "uint32")]:
        etype, msg = _error(call)
        assert etype is TypeError and msg.startswith("dtype 'uint32' is not supported"), msg
    for call in [lambda: F.zeros((2, -1)), lambda: R.normal(size=(2, -1))]:
        etype, msg = _error(call)
        assert (etype, msg.split(" ", 1)[1]) == (ValueError, "must not have negative entries, got (2, -1)")
