"""Random corruption of valid archives (hypothesis): every load either
succeeds or raises ArchiveError -- no other exception, no crash, no hang, no
allocation beyond the budget of limits.py."""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import mgtrace as mt
import mgtrace.module as M

from .helpers import load_bytes, save_bytes


def _archives():
    rng = np.random.default_rng(0)
    net = M.Sequential(M.Conv2d(2, 4, 3, padding=1), M.BatchNorm2d(4), M.ReLU(),
                       M.Flatten(), M.Linear(4 * 4 * 4, 3), M.Embedding(5, 2))
    values = {"w": mt.tensor(rng.standard_normal((3, 4)).astype(np.float32)),
              (1, 2): [None, True, -0.0, 2 ** 70, b"xy", slice(1, None)],
              "h": mt.tensor(np.arange(6, dtype=np.float16)), "m": mt.tensor([True, False]),
              "n": np.int8(3), "d": mt.as_dtype("bfloat16"), "e": ...}
    return [save_bytes(net, metadata={"seed": 0}), save_bytes(values),
            save_bytes(net.state_dict())]


ARCHIVES = _archives()


@st.composite
def corrupted(draw):
    data = bytearray(ARCHIVES[draw(st.integers(0, len(ARCHIVES) - 1))])
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["flip", "set", "insert", "delete", "truncate"]))
        pos = draw(st.integers(0, len(data) - 1))
        if kind == "flip":
            data[pos] ^= 1 << draw(st.integers(0, 7))
        elif kind == "set":
            data[pos] = draw(st.sampled_from([0x00, 0xFF, 0x7F, 0x80, 0xC1, 0xCF, 0xD3, 0xDD,
                                              0xDF, 0xC7, draw(st.integers(0, 255))]))
        elif kind == "insert":
            data[pos:pos] = draw(st.binary(min_size=1, max_size=9))
        elif kind == "delete":
            del data[pos:pos + draw(st.integers(1, 16))]
        else:
            del data[pos:]
        if not data:
            break
    return bytes(data)


@pytest.mark.parametrize("mmap", [False, True])
@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=corrupted())
def test_corrupted_archives_load_or_raise_archive_error(data, mmap):
    try:
        load_bytes(data, mmap=mmap)
    except mt.ArchiveError:
        pass


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=200))
def test_random_bytes_raise_archive_error(blob):
    with pytest.raises(mt.ArchiveError):
        load_bytes(blob)
