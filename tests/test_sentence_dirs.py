"""sentence-transformers directories: every pooling mode (alone and combined), Dense, Normalize,
lower-casing, prompts and similarity functions give sentence-transformers' own vectors and scores.

Each case builds a small model with sentence-transformers itself, saves it, and compares
`bertforge predict embed` (the library call behind it) with `SentenceTransformer.encode`.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

st = pytest.importorskip("sentence_transformers")
import sentence_transformers.models  # noqa: E402,F401  (makes st.models available)
transformers = pytest.importorskip("transformers")

from bertforge import BertModel, Tokenizer  # noqa: E402
from bertforge.errors import ConfigError  # noqa: E402
from bertforge.inference.pipelines import embed  # noqa: E402
from bertforge.inference.predict import run_predict  # noqa: E402
from bertforge.interop.sentence_dir import POOLING_MODES, read_sentence_dir  # noqa: E402

TEXTS = ["A cat sits on the mat.", "Dogs RUN fast", "the quick brown fox jumps over the lazy dog again and again",
         "x", "Café au lait, naïve résumé"]


@pytest.fixture(scope="module")
def encoder_dir(tmp_path_factory):
    """A tiny random BERT with a real WordPiece vocabulary, as a transformers directory."""
    d = tmp_path_factory.mktemp("encoder")
    corpus = TEXTS * 20 + [t.lower() for t in TEXTS] * 20 + ["cafe au lait naive resume a b c d e f g"] * 5
    tok = Tokenizer.train(texts=corpus, vocab_size=150, min_frequency=1, lowercase=False)  # cased
    tok.save(d)
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=2,
                                     num_attention_heads=4, intermediate_size=48, max_position_embeddings=64)
    transformers.BertModel(config).save_pretrained(d)
    return d


def _save(encoder_dir, out, modules, **kwargs):
    model = st.SentenceTransformer(modules=modules, device="cpu", **kwargs)
    model.save(str(out))
    return model


def _transformer(encoder_dir, **kwargs):
    return st.models.Transformer(str(encoder_dir), **kwargs)


def _ours(path, texts=TEXTS):
    model = BertModel.from_pretrained(path)
    return embed(model, Tokenizer.from_pretrained(path), texts,
                 sentence=read_sentence_dir(path, model.config.hidden_size))


CASES = {f"pool-{mode}": [mode] for mode in POOLING_MODES}
CASES["pool-cls+max+mean"] = ["cls", "max", "mean"]
CASES["pool-mean+lasttoken+weightedmean"] = ["mean", "lasttoken", "weightedmean"]


@pytest.mark.parametrize("modes", list(CASES.values()), ids=list(CASES))
def test_pooling_modes_match_sentence_transformers(tmp_path, encoder_dir, modes):
    pooling = st.models.Pooling(32, pooling_mode=modes[0] if len(modes) == 1 else modes)
    model = _save(encoder_dir, tmp_path, [_transformer(encoder_dir), pooling])
    want = model.encode(TEXTS, convert_to_numpy=True, batch_size=2)
    got = _ours(tmp_path)
    assert got.shape == want.shape == (len(TEXTS), 32 * len(modes))
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)


def test_legacy_pooling_flags_concatenate_in_sentence_transformers_order(tmp_path, encoder_dir):
    """Old directories set one boolean per mode; several true ones are concatenated cls, max, mean, ..."""
    model = _save(encoder_dir, tmp_path, [_transformer(encoder_dir), st.models.Pooling(32, pooling_mode=["cls", "max", "mean_sqrt_len_tokens"])])
    legacy = {"word_embedding_dimension": 32, "pooling_mode_cls_token": True, "pooling_mode_max_tokens": True,
              "pooling_mode_mean_tokens": False, "pooling_mode_mean_sqrt_len_tokens": True}
    pool_dir = next(p for p in tmp_path.iterdir() if p.name.endswith("Pooling"))
    (pool_dir / "config.json").write_text(json.dumps(legacy))
    np.testing.assert_allclose(_ours(tmp_path), model.encode(TEXTS), atol=1e-5, rtol=1e-5)


def test_dense_and_normalize(tmp_path, encoder_dir):
    torch.manual_seed(1)
    dense = st.models.Dense(32, 16, activation_function=torch.nn.Tanh())
    model = _save(encoder_dir, tmp_path, [_transformer(encoder_dir), st.models.Pooling(32, pooling_mode="mean"),
                                          dense, st.models.Normalize()])
    np.testing.assert_allclose(_ours(tmp_path), model.encode(TEXTS), atol=1e-5, rtol=1e-5)


def test_legacy_sentence_bert_config_lowercase_and_max_length(tmp_path, encoder_dir):
    """Directories written before sentence-transformers 6 keep do_lower_case and max_seq_length in
    sentence_bert_config.json; a cased vocabulary then sees lower-cased text, cut at 6 tokens."""
    _save(encoder_dir, tmp_path, [_transformer(encoder_dir), st.models.Pooling(32, pooling_mode="mean")])
    (tmp_path / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 6, "do_lower_case": True}))
    model = st.SentenceTransformer(str(tmp_path), device="cpu")
    want = model.encode(TEXTS)
    np.testing.assert_allclose(_ours(tmp_path), want, atol=1e-5, rtol=1e-5)
    (tmp_path / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 6, "do_lower_case": False}))
    assert not np.allclose(_ours(tmp_path), want, atol=1e-3)  # the flag changes the vectors, so it was tested


def test_prompt_max_length_and_similarity(tmp_path, encoder_dir):
    model = _save(encoder_dir, tmp_path, [_transformer(encoder_dir, max_seq_length=7),
                                          st.models.Pooling(32, pooling_mode="mean")],
                  prompts={"query": "query: "}, default_prompt_name="query", similarity_fn_name="euclidean")
    np.testing.assert_allclose(_ours(tmp_path), model.encode(TEXTS), atol=1e-5, rtol=1e-5)
    rows = list(run_predict("similarity", str(tmp_path), [{"text": TEXTS[0], "text_pair": TEXTS[1]}]))
    want = model.similarity(model.encode(TEXTS[:1]), model.encode(TEXTS[1:2]))
    assert abs(rows[0]["similarity"] - float(want[0, 0])) < 1e-4


def test_real_minilm_directory(minilm_dir):
    """all-MiniLM-L6-v2: mean pooling, max length 256, Normalize — the vectors sentence-transformers gives."""
    model = st.SentenceTransformer(str(minilm_dir), device="cpu")
    np.testing.assert_allclose(_ours(minilm_dir), model.encode(TEXTS), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("edit,match", [
    (lambda d: (d / "modules.json").write_text(json.dumps(
        [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
         {"idx": 1, "name": "1", "path": "1_LSTM", "type": "sentence_transformers.models.LSTM"}])), "LSTM"),
    (lambda d: (next(p for p in d.iterdir() if p.name.endswith("Pooling")) / "config.json").write_text(
        json.dumps({"embedding_dimension": 32, "pooling_mode": "median"})), "pooling_mode"),
    (lambda d: (next(p for p in d.iterdir() if p.name.endswith("Pooling")) / "config.json").write_text(
        json.dumps({"embedding_dimension": 64, "pooling_mode": "mean"})), "hidden_size"),
    (lambda d: (d / "config_sentence_transformers.json").write_text(json.dumps({"similarity_fn_name": "jaccard"})),
     "similarity_fn_name"),
])
def test_what_cannot_be_honoured_is_refused(tmp_path, encoder_dir, edit, match):
    _save(encoder_dir, tmp_path, [_transformer(encoder_dir), st.models.Pooling(32)])
    edit(tmp_path)
    with pytest.raises(ConfigError, match=match):
        read_sentence_dir(tmp_path, 32)
