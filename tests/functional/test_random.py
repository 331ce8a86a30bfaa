"""mgtrace.random: reproducibility from seed, the documented Philox stream
and transforms (checked against values computed here from
np.random.Philox directly), dtypes, ranges, devices, argument errors.
"""
import doctest

import numpy as np
import pytest

import mgtrace as mt
import mgtrace.random as R


def _philox_unit(key, n):
    raw = np.random.Philox(key=key).random_raw(n).astype(np.uint64)
    return (raw >> np.uint64(11)).astype(np.float64) / 2.0 ** 53


def test_seed_makes_draws_reproducible():
    R.seed(42)
    a = [R.normal(size=(3, 4)).numpy(), R.uniform(size=5).numpy(), R.randint(0, 10, size=6).numpy(),
         R.permutation(7).numpy()]
    R.normal(size=100)                                    # anything in between
    R.seed(42)
    b = [R.normal(size=(3, 4)).numpy(), R.uniform(size=5).numpy(), R.randint(0, 10, size=6).numpy(),
         R.permutation(7).numpy()]
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)


def test_uniform_is_the_documented_philox_transform():
    R.seed(7)
    got = R.uniform(-2.0, 3.0, size=(4, 5)).numpy()
    expected = (-2.0 + 5.0 * _philox_unit(7, 20)).astype(np.float32).reshape(4, 5)
    np.testing.assert_array_equal(got, expected)


def test_normal_is_box_muller_on_philox():
    got = R.RNG(11).normal(1.0, 2.0, size=5).numpy()
    u = _philox_unit(11, 6)
    u1, u2 = 1.0 - u[0::2], u[1::2]
    r = np.sqrt(-2 * np.log(u1))
    z = np.empty(6)
    z[0::2], z[1::2] = r * np.cos(2 * np.pi * u2), r * np.sin(2 * np.pi * u2)
    np.testing.assert_array_equal(got, (1.0 + 2.0 * z[:5]).astype(np.float32))


def test_dtypes_shapes_and_ranges():
    g = R.RNG(3)
    n = g.normal(size=(2, 3))
    assert n.dtype == np.float32 and n.shape == (2, 3)
    assert g.normal().shape == ()                         # size=None -> 0-d
    u = g.uniform(5, 6, size=1000).numpy()
    assert u.dtype == np.float32 and u.min() >= 5 and u.max() < 6
    i = g.randint(-3, 4, size=2000).numpy()
    assert i.dtype == np.int32 and i.min() == -3 and i.max() == 3
    assert set(g.randint(2, size=100).numpy().tolist()) == {0, 1}   # [0, low) when high is None
    p = g.permutation(50).numpy()
    assert p.dtype == np.int32 and sorted(p.tolist()) == list(range(50))
    assert g.uniform(2.0, 2.0, size=3).tolist() == [2.0, 2.0, 2.0]


def test_statistics_are_plausible():
    z = R.RNG(0).normal(3.0, 0.5, size=20000).numpy().astype(np.float64)
    assert abs(z.mean() - 3.0) < 0.03 and abs(z.std() - 0.5) < 0.02
    counts = np.bincount(R.RNG(1).randint(0, 5, size=50000).numpy(), minlength=5)
    assert counts.min() > 9500 and counts.max() < 10500


def test_permutation_of_a_tensor_shuffles_rows():
    x = mt.tensor(np.arange(12).reshape(6, 2))
    y = R.RNG(5).permutation(x)
    assert y.shape == (6, 2)
    assert sorted(map(tuple, y.tolist())) == sorted(map(tuple, x.tolist()))
    idx = R.RNG(5).permutation(6).numpy()
    assert y.tolist() == x.numpy()[idx].tolist()


def test_independent_generators_and_device():
    g1, g2 = R.RNG(9), R.RNG(9)
    g1.uniform(size=3)
    assert R.RNG(9).uniform(size=3).tolist() == g2.uniform(size=3).tolist()
    assert g1.initial_seed == 9
    assert R.normal(size=2, device="cpu:1").device == mt.Device("cpu:1")
    assert R.permutation(3, device="cpu:1").device == mt.Device("cpu:1")
    assert R.get_rng() is R.get_rng()


def test_errors_name_the_argument():
    with pytest.raises(ValueError, match="normal: std must be >= 0"):
        R.normal(0, -1)
    with pytest.raises(ValueError, match="uniform: low=2.0 must not exceed high=1.0"):
        R.uniform(2, 1)
    with pytest.raises(ValueError, match=r"randint: the range \[low=3, high=3\) is empty"):
        R.randint(3, 3)
    with pytest.raises(ValueError, match="randint: .* must lie within int32"):
        R.randint(0, 2 ** 40)
    with pytest.raises(TypeError, match="randint: low must be an int"):
        R.randint(1.5)
    with pytest.raises(TypeError, match="uniform: size must be an int or a sequence of ints, got str"):
        R.uniform(size="3")
    with pytest.raises(ValueError, match=r"normal: size must not have negative entries, got \(2, -1\)"):
        R.normal(size=(2, -1))
    with pytest.raises(ValueError, match="permutation: n must be in"):
        R.permutation(-1)
    with pytest.raises(TypeError, match="seed: seed must be an int"):
        R.seed(1.5)
    with pytest.raises(ValueError, match="seed: seed must be in"):
        R.seed(-1)
    with pytest.raises(TypeError, match="normal: mean must be a real number"):
        R.normal("0")


def test_docstring_examples_run():
    result = doctest.testmod(R, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0 and result.attempted >= 10


def test_module_exports_only_its_api():
    # `from mgtrace.random import *` and tab completion see the API, not the
    # modules it is written with (np, math, threading, operator, Tensor)
    public = sorted(n for n in vars(R) if not n.startswith("_"))
    assert public == sorted(R.__all__)
    assert not hasattr(R, "np") and not hasattr(R, "math") and not hasattr(R, "Tensor")
