"""The host allocator's cache of freed large blocks (kernels/cpu/alloc.c): a
request takes the most recently freed block of its class that holds it with
at most twice its size, and gives the whole block back when freed."""
import numpy as np
import pytest

import mgtrace.functional as F
from mgtrace._core.tensor import empty_host_cache, host_cache_info

MB = 1 << 20


def block(nbytes, value=0.0):
    return F.full((nbytes // 4,), value, dtype="float32")


def cached():
    return host_cache_info()["cached_bytes"]


@pytest.fixture(autouse=True)
def fresh_cache():
    empty_host_cache()
    yield
    empty_host_cache()


def test_a_freed_block_serves_a_smaller_request_within_twice_its_size():
    a = block(4 * MB)
    p = a.data_ptr
    del a
    assert cached() == 4 * MB
    b = block(3 * MB, 2.5)
    assert b.data_ptr == p
    assert cached() == 0
    np.testing.assert_array_equal(b.numpy(), np.full(3 * MB // 4, 2.5, np.float32))
    del b
    assert cached() == 4 * MB        # the whole block came back, not 3 MB of it


def test_a_block_more_than_twice_the_request_stays_cached():
    a = block(4 * MB)
    p = a.data_ptr
    del a
    b = block(MB + 4096)
    assert b.data_ptr != p
    assert cached() == 4 * MB


def test_the_most_recently_freed_block_is_taken_first():
    a, b = block(4 * MB), block(4 * MB)
    pb = b.data_ptr
    del a
    del b
    c = block(3 * MB)
    assert c.data_ptr == pb
    assert cached() == 4 * MB


def test_blocks_below_one_mib_and_mapped_blocks_are_not_mixed():
    # a mapped (page-aligned) block would make a small GEMM operand alias in L1
    a = block(MB + 64 * 1024)
    p = a.data_ptr
    del a
    b = block(MB - 4096)
    assert b.data_ptr != p
    assert cached() == MB + 64 * 1024


def test_zeros_in_a_reused_block_are_zeros():
    # a reused block holds the old tensor's bytes, unlike fresh mapped memory
    a = block(4 * MB, 7.0)
    p = a.data_ptr
    del a
    b = F.zeros((3 * MB // 4,), dtype="float32")
    assert b.data_ptr == p
    np.testing.assert_array_equal(b.numpy(), np.zeros(3 * MB // 4, np.float32))


def test_a_cache_limit_past_64_bits_of_bytes_names_the_variable(monkeypatch):
    from mgtrace import _flags
    assert (_flags.HOST_CACHE_MB_MAX + 1) << 20 == 1 << 64
    monkeypatch.setenv("MGTRACE_HOST_CACHE_MB", str(1 << 44))
    with pytest.raises(ValueError, match="MGTRACE_HOST_CACHE_MB must be <="):
        _flags._int("MGTRACE_HOST_CACHE_MB", 1024, _flags.HOST_CACHE_MB_MAX)


def test_more_than_64_freed_blocks_are_all_kept():
    # a training step frees ~120 large blocks before the next forward wants
    # them back: the byte limit, not a count of slots, bounds the cache
    blocks = [block(MB + 64 * 1024, float(i)) for i in range(200)]
    ptrs = {b.data_ptr for b in blocks}
    del blocks
    assert cached() == 200 * (MB + 64 * 1024)
    again = [block(MB + 64 * 1024) for _ in range(200)]
    assert {b.data_ptr for b in again} == ptrs
    assert cached() == 0
