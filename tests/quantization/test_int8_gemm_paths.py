"""The int8 linear GEMM (cpu/qgemm.c) on each path forced: portable C, AVX2
(vpmaddwd on widened bytes, for CPUs without VNNI) and the best one here,
bitwise equal to the NumPy integer reference: K not a multiple of 4, N not
of 16, rows past the blocks of four, zero points at both ends, ReLU,
saturation, int8 / uint8 / float32 outputs, and the largest products
(255 * -128) that vpmaddubsw would saturate."""
import numpy as np
import pytest

from mgtrace._core import qint8
from mgtrace.quantization import int8

from tests.quantization.test_int8_kernels import ref_bias, ref_linear


def _has_avx2():
    try:
        with open("/proc/cpuinfo") as f:
            return " avx2" in f.read()
    except OSError:
        return False


# (M, K, N, x zero point, out dtype, relu)
CASES = [(1, 3, 5, 0, "quint8", False), (9, 70, 83, 255, "quint8", True),
         (6, 129, 16, 128, "qint8", False), (5, 64, 33, 7, "float32", False),
         (3, 33, 40, 200, "float32", True),
         # AMX's: whole 16-row blocks of K a multiple of 64, odd blocks of
         # rows and of 16 channels, rows after the blocks on VNNI
         (37, 128, 40, 200, "quint8", True), (48, 64, 33, 0, "float32", False),
         (16, 192, 16, 255, "qint8", False), (80, 384, 100, 131, "float32", True)]


@pytest.mark.parametrize("path", [1, 4, 2, 3, 0])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_each_gemm_path_matches_numpy(case, path):
    M, K, N, x_zp, out, relu = CASES[case]
    rng = np.random.default_rng(60 + case)
    x = rng.integers(0, 256, (M, K)).astype(np.uint8)
    w = rng.integers(-127, 128, (N, K)).astype(np.int8)
    if case == 1:                       # the extreme products, a whole row of them
        x[0], w[0] = 255, -128
    ws = rng.uniform(0.001, 0.01, N).astype(np.float32)
    bias = (rng.standard_normal(N) * 3).astype(np.float32)
    weight = int8.Int8Weight(w, ws, bias)
    out_zp = 0 if out in ("qint8", "float32") else 90
    got = int8.linear(x, 0.03, x_zp, weight, 0.05, out_zp, out, relu, x_dtype="quint8",
                      path=path)
    if out == "float32":
        acc = (x.astype(np.int64) - x_zp) @ w.astype(np.int64).T + ref_bias(bias, 0.03, ws)
        want = acc * (np.float64(np.float32(0.03)) * ws.astype(np.float64))
        want = (np.maximum(want, 0) if relu else want).astype(np.float32)
    else:
        want = ref_linear(x, x_zp, w, ws, bias, 0.03, 0.05, out_zp,
                          np.int8 if out == "qint8" else np.uint8, relu)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("path", [1, 4])
def test_the_gemm_path_used_is_the_one_asked_where_available(path):
    rng = np.random.default_rng(70)
    x = rng.integers(0, 256, (4, 20)).astype(np.uint8)
    weight = int8.Int8Weight(rng.integers(-127, 128, (16, 20)).astype(np.int8),
                             np.full(16, 0.01, np.float32), None)
    packed, wsum = weight.packs[0]
    out = np.empty((4, 16), np.uint8)
    used = qint8.gemm(x, 3, packed, wsum, None, np.full(16, 0.2), 0, 0, 255, out, 16, 1, path)
    assert used == (4 if path == 4 and _has_avx2() else 1)


def test_amx_takes_the_whole_row_blocks_where_the_cpu_has_it():
    rng = np.random.default_rng(71)
    w = rng.integers(-127, 128, (16, 64)).astype(np.int8)
    weight = int8.Int8Weight(w, np.full(16, 0.01, np.float32), None)
    packed, wsum = weight.packs[0]
    for m, want_amx in ((32, True), (15, False)):         # 15 rows: no whole block
        x = rng.integers(0, 256, (m, 64)).astype(np.uint8)
        out = np.empty((m, 16), np.uint8)
        used = qint8.gemm(x, 3, packed, wsum, None, np.full(16, 0.2), 0, 0, 255, out, 16, 1, 3)
        vnni = qint8.has_vnni()
        amx = vnni and want_amx and qint8.has_amx()
        assert used == (3 if amx else 2 if vnni else 1)
        np.testing.assert_array_equal(
            out, np.clip(np.rint(((x.astype(np.int64) - 3) @ w.astype(np.int64).T) * 0.2),
                         0, 255).astype(np.uint8))
