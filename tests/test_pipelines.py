"""Pipelines and `bertforge predict`: sentence-transformers and transformers parity, order restoration
under length bucketing, NER windows and offsets, QA offsets, and bad input."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from bertforge import (BertConfig, BertForQuestionAnswering, BertForSequenceClassification,
                       BertForTokenClassification, BertModel, Tokenizer)
from bertforge.inference import pipelines
from bertforge.inference.predict import run_predict

from conftest import sst2_sentences
from cli_utils import cli
import functools


def test_embed_equals_sentence_transformers(minilm_dir):
    st = pytest.importorskip("sentence_transformers")
    sentences = sst2_sentences(256)  # file order: lengths are mixed in every batch
    reference = st.SentenceTransformer(str(minilm_dir), device="cpu").encode(sentences, batch_size=32,
                                                                             convert_to_numpy=True)
    rows = list(run_predict("embed", str(minilm_dir), sentences))
    ours = np.array([r["embedding"] for r in rows], dtype=np.float32)
    assert [r["text"] for r in rows] == sentences  # each line says which input it embeds
    assert ours.shape == reference.shape
    assert np.abs(ours - reference).max() <= 1e-5
    np.testing.assert_allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-5)  # the Normalize module was honoured


def test_compiled_encoder_matches_eager(minilm_dir):
    """`--compile` (Inductor, dynamic shapes, frozen weights) gives the eager numbers, for
    batches of every shape after one compilation, and leaves Inductor's freezing off."""
    import torch._inductor.config as inductor_config

    from bertforge import BertModel, Tokenizer

    sentences = sst2_sentences(96)
    tok = Tokenizer.from_pretrained(minilm_dir)
    eager = pipelines.embed(BertModel.from_pretrained(minilm_dir), tok, sentences, batch_size=40)
    compiled_model = pipelines.compile_for_inference(BertModel.from_pretrained(minilm_dir))
    compiled = pipelines.embed(compiled_model, tok, sentences, batch_size=40)  # batches of 40, 40 and 16 rows
    assert np.abs(compiled - eager).max() <= 1e-4
    assert not inductor_config.freezing


def test_fill_mask_equals_transformers_pipeline(tmp_path, minilm_dir):
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(vocab_size=30522, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=128)
    transformers.BertForMaskedLM(config).save_pretrained(tmp_path)
    for name in ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        (tmp_path / name).write_bytes((minilm_dir / name).read_bytes())
    texts = ["Paris is the [MASK] of France.", "A [MASK] day in the [MASK] life of a cat."]
    theirs = transformers.pipeline("fill-mask", model=str(tmp_path), device="cpu", top_k=4)(texts)
    ours = list(run_predict("fill-mask", str(tmp_path), texts, top_k=4))
    theirs_first = theirs[0]
    for a, b in zip(ours[0]["predictions"][0], theirs_first):
        assert a["token"] == b["token"] and a["token_str"] == b["token_str"]
        assert a["score"] == pytest.approx(b["score"], abs=1e-5)
    assert len(ours[1]["predictions"]) == 2  # top-k for each of the two masks
    for got, want in zip(ours[1]["predictions"], theirs[1]):
        assert [p["token"] for p in got] == [p["token"] for p in want]
    targeted = list(run_predict("fill-mask", str(tmp_path), texts[:1], targets=["capital", "city"]))
    assert {p["token_str"] for p in targeted[0]["predictions"][0]} == {"capital", "city"}


@pytest.fixture(scope="module")
def tok(minilm_dir):
    return Tokenizer.from_pretrained(minilm_dir)


def test_classify_restores_input_order(tok):
    model = BertForSequenceClassification(BertConfig.from_preset("L2-H64", vocab_size=tok.vocab_size,
                                                                 id2label={0: "neg", 1: "pos"})).eval()
    texts = sst2_sentences(70)
    results = pipelines.classify(model, tok, texts, batch_size=8)
    for text, result in list(zip(texts, results))[::7]:
        enc = tok(text, return_tensors="pt")
        with torch.no_grad():
            probs = model(enc["input_ids"], enc["token_type_ids"]).logits.softmax(-1)[0]
        assert result["scores"]["pos"] == pytest.approx(float(probs[1]), abs=1e-5)
        assert result["label"] == ("pos" if probs[1] > probs[0] else "neg")


def test_ner_windows_offsets_and_grouping(tok):
    labels = {0: "O", 1: "B-PER", 2: "I-PER", 3: "B-LOC", 4: "I-LOC"}
    model = BertForTokenClassification(BertConfig.from_preset("L2-H64", vocab_size=tok.vocab_size, id2label=labels,
                                                              max_position_embeddings=32)).eval()
    text = " ".join(["Angela Merkel visited the old town of Zürich yesterday ."] * 8)  # far beyond 32 tokens
    for aggregation in ("first", "average", "max"):
        entities = pipelines.ner(model, tok, [text], aggregation=aggregation, stride=8)[0]
        for e in entities:
            assert text[e["start"]:e["end"]] == e["word"] and e["entity_group"] in ("PER", "LOC")
    tagged = [("B-PER", 0.9, 0, 6), ("I-PER", 0.7, 7, 13), ("O", 0.9, 14, 21), ("I-LOC", 0.8, 26, 32)]
    grouped = pipelines._group_entities(tagged, "Angela Merkel visited Zürich")
    assert [(g["entity_group"], g["start"], g["end"]) for g in grouped] == [("PER", 0, 13), ("LOC", 26, 32)]
    assert grouped[0]["score"] == pytest.approx(0.8)


def test_qa_offsets_for_long_contexts(tok):
    model = BertForQuestionAnswering(BertConfig.from_preset("L2-H64", vocab_size=tok.vocab_size)).eval()
    context = " ".join(f"Sentence number {i} talks about the river Rhine and its bridges." for i in range(60))
    results = pipelines.answer(model, tok, [{"question": "Which river?", "context": context}], max_length=64, stride=16)
    r = results[0]
    assert context[r["start"]:r["end"]] == r["answer"] and r["answer"] and 0 <= r["score"] <= 1


predict = functools.partial(cli, "predict")


def test_predict_cli_inputs_and_bad_input(tmp_path, minilm_dir):
    good = predict("similarity", "--model", str(minilm_dir), stdin='{"text": "a dog runs", "text_pair": "a puppy runs"}\n')
    assert good.returncode == 0 and json.loads(good.stdout)["similarity"] > 0.5
    candidates = tmp_path / "c.txt"
    candidates.write_text("the weather is sunny\na puppy is running\nstock prices fell\n")
    top = json.loads(predict("similarity", "--model", str(minilm_dir), "--against", str(candidates), "--top-k", "1",
                             "a dog runs").stdout)
    assert top["matches"][0]["text"] == "a puppy is running"
    for args, stdin, message in [
        (("fill-mask", "--model", str(minilm_dir), "x [MASK]"), None, "has no head for fill-mask"),
        (("embed", "--model", str(minilm_dir), "--input", str(tmp_path / "blank.txt")), None, "blank.txt:2: empty line"),
        (("embed", "--model", str(minilm_dir), "--input", str(tmp_path / "latin1.txt")), None, "latin1.txt: not UTF-8"),
        (("embed", "--model", str(minilm_dir)), "", "<stdin>: no inputs"),
    ]:
        (tmp_path / "blank.txt").write_text("one\n\nthree\n")
        (tmp_path / "latin1.txt").write_bytes("caf\xe9\n".encode("latin-1"))
        result = predict(*args, stdin=stdin)
        assert result.returncode == 2, result.stderr
        assert message in result.stderr and "Traceback" not in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr
