"""Fused attention leaves out padded keys (attention.c's attention_kept_keys):
keys at the end of a row whose mask lies 2^100 or more below the row's
largest, for a mask the same for every query. Their probability is exactly
zero, so the output must be the very bits of the same call with the padded
keys kept: a mask of -1e20 there gives the same zero probabilities but is
too close to 0 to be left out, so it takes the full path. And where leaving
keys out could change a bit (a NaN or infinity in a padded key's k or v,
scores too large to be sure), every key is kept."""
import numpy as np
import pytest

import mgtrace as mt
import mgtrace.functional as F

FMIN = float(np.finfo(np.float32).min)


def _ref(q, k, v, mask, scale):
    """float64 softmax attention (NumPy)."""
    s = np.einsum("bhqd,bhkd->bhqk", q.astype(np.float64), k.astype(np.float64)) * scale + mask
    s = s - s.max(-1, keepdims=True)
    p = np.exp(s)
    p /= p.sum(-1, keepdims=True)
    return np.einsum("bhqk,bhkd->bhqd", p, v.astype(np.float64))


def _heads(rng, b, s, h, d):
    """q, k, v as a transformer makes them: [B, H, S, D] views of one
    [B, S, 3, H, D] projection (strided rows, heads inside a row)."""
    x = mt.tensor(rng.standard_normal((b, s, 3, h, d)).astype(np.float32))
    return [F.transpose(x[:, :, i], (0, 2, 1, 3)) for i in range(3)]


def _padding_mask(lengths, s, fill, heads=1):
    m = np.zeros((len(lengths), heads, 1, s), np.float32)
    for i, n in enumerate(lengths):
        m[i, :, :, n:] = fill
    return m


@pytest.fixture(params=[1, 2, 3])
def threads(request):
    before = mt.get_num_threads()
    mt.set_num_threads(request.param)
    yield request.param
    mt.set_num_threads(before)


@pytest.mark.parametrize("s,lengths", [(37, [37, 1, 7, 8, 9, 36]), (128, [128, 120, 64, 2, 17, 100]),
                                       (16, [16, 15, 1, 8, 9, 3])])
@pytest.mark.parametrize("fill", [FMIN, -np.inf, -1e31])
def test_padded_keys_left_out_give_the_bits_of_keeping_them(rng, threads, s, lengths, fill):
    q, k, v = _heads(rng, len(lengths), s, 3, 8)
    skipped = _padding_mask(lengths, s, fill)
    kept = _padding_mask(lengths, s, -1e20)        # zero probabilities, every key computed
    got = F.attention(q, k, v, mt.tensor(skipped), 0.35).numpy()
    full = F.attention(q, k, v, mt.tensor(kept), 0.35).numpy()
    np.testing.assert_array_equal(got, full)
    want = _ref(q.numpy(), k.numpy(), v.numpy(), np.maximum(skipped, FMIN).astype(np.float64), 0.35)
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)


def test_a_per_head_mask_and_a_per_query_mask(rng, threads):
    """A [B, H, 1, S] mask (different lengths per head) is left out per
    pair; a [B, 1, Sq, S] mask (it varies along the queries) keeps every
    key: both the reference's values."""
    q, k, v = _heads(rng, 2, 40, 3, 8)
    per_head = np.zeros((2, 3, 1, 40), np.float32)
    for h, n in enumerate((40, 5, 33)):
        per_head[:, h, :, n:] = FMIN
    per_query = np.zeros((2, 1, 40, 40), np.float32)
    per_query[:, :, :, 30:] = FMIN
    for mask in (per_head, per_query):
        got = F.attention(q, k, v, mt.tensor(mask), 0.35).numpy()
        np.testing.assert_allclose(got, _ref(q.numpy(), k.numpy(), v.numpy(), mask, 0.35),
                                   rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("where,value", [("k", np.nan), ("k", np.inf), ("v", np.nan), ("v", np.inf)])
def test_a_non_finite_padded_key_is_not_left_out(rng, threads, where, value):
    """The unfused sequence gives NaN where a padded key has a NaN or
    infinite k (its score NaN or +-inf: the rows where it is NaN or +inf) or
    v (0 * inf: that column of every query): so does the kernel, which
    keeps every key of that pair; the other pairs are left out as usual."""
    q = rng.standard_normal((2, 2, 6, 8)).astype(np.float32)
    k = rng.standard_normal((2, 2, 20, 8)).astype(np.float32)
    v = rng.standard_normal((2, 2, 20, 8)).astype(np.float32)
    {"k": k, "v": v}[where][0, 1, 15, 3] = value      # a padded key of pair (0, 1)
    mask = _padding_mask([12, 20], 20, FMIN)
    got = F.attention(mt.tensor(q), mt.tensor(k), mt.tensor(v), mt.tensor(mask), 0.35).numpy()
    with np.errstate(invalid="ignore", over="ignore"):
        want = _ref(q, k, v, mask.astype(np.float64), 0.35)
    assert np.isnan(want[0, 1]).any()
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    ok = ~np.isnan(want)
    np.testing.assert_allclose(got[ok], want[ok], rtol=2e-5, atol=2e-6)


def test_scores_too_large_to_be_sure_keep_every_key(rng, threads):
    """q and k near 1e17: scores near 2^100 could reach the masked keys'
    window, so every key is kept; with a mask of finfo.min the reference's
    probabilities (float64) are still those of the valid keys, which the
    output matches."""
    q = (rng.standard_normal((1, 1, 4, 8)) * 1e17).astype(np.float32)
    k = rng.standard_normal((1, 1, 10, 8)).astype(np.float32)
    k[0, 0, 6:] *= 1e17                                    # the padded keys' scores huge
    v = rng.standard_normal((1, 1, 10, 8)).astype(np.float32)
    mask = _padding_mask([6], 10, FMIN)
    got = F.attention(mt.tensor(q), mt.tensor(k), mt.tensor(v), mt.tensor(mask), 1.0).numpy()
    want = _ref(q, k, v, mask.astype(np.float64), 1.0)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_an_all_padded_row_and_a_nan_mask_keep_every_key(rng, threads):
    """Every key masked (no key above the others by 2^100: nothing left out,
    uniform-like probabilities as the sequence gives), and a NaN in the
    mask (NaN outputs, as the sequence)."""
    q, k, v = _heads(rng, 2, 12, 2, 4)
    mask = np.full((2, 1, 1, 12), FMIN, np.float32)
    mask[1, 0, 0, 5] = np.nan
    got = F.attention(q, k, v, mt.tensor(mask), 0.5).numpy()
    # in float32 each score + finfo.min rounds to finfo.min: equal scores,
    # probabilities 1/12, every query the mean of v (as the sequence gives)
    want = np.broadcast_to(v.numpy()[:1].astype(np.float64).mean(2, keepdims=True), got[:1].shape)
    np.testing.assert_allclose(got[:1], want, rtol=2e-5, atol=2e-6)
    assert np.isnan(got[1]).all()
