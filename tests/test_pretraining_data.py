"""Corpus readers, prepared shards, the NSP pair builder (against a token-level reading of
create_pretraining_data.py), FULL-SENTENCES packing, and dynamic masking rates."""

from __future__ import annotations

import gzip
import json
import random

import numpy as np
import pytest

from bertforge import Tokenizer
from bertforge.data.corpus import CorpusOptions, iter_documents, split_sentences
from bertforge.data.pretraining import (A_END, A_START, B_END, B_START, IS_RANDOM, MaskingCollator, MaskingConfig,
                                        PretrainingExamples, build_nsp_instances)
from bertforge.data.shards import TokenShards, prepare, tokenize_documents
from bertforge.errors import InputError

from corpus_utils import make_documents, write_corpus


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    path = write_corpus(tmp_path_factory.mktemp("tok") / "c.txt")
    return Tokenizer.train([path], vocab_size=300, min_frequency=1)


@pytest.fixture(scope="module")
def shards(tmp_path_factory, tokenizer):
    root = tmp_path_factory.mktemp("shards")
    corpus = write_corpus(root / "corpus.txt", n_docs=150, seed=1)
    prepare([str(corpus)], root / "prepared", tokenizer, workers=1)
    return TokenShards(root / "prepared")


# ----------------------------------------------------------------------------- corpus
def test_readers(tmp_path):
    (tmp_path / "a.txt").write_text("First doc line one.\nLine two.\n\n\nSecond doc.\n", encoding="utf-8")
    with gzip.open(tmp_path / "b.jsonl.gz", "wt", encoding="utf-8") as f:
        f.write(json.dumps({"text": "Third doc."}) + "\n\n" + json.dumps({"text": "Fourth doc.", "x": 1}) + "\n")
    sub = tmp_path / "dir"
    sub.mkdir()
    (sub / "c.txt").write_text("Fifth.\n\nSixth.", encoding="utf-8")
    docs = list(iter_documents([str(tmp_path / "a.txt"), str(tmp_path / "*.gz"), str(sub)]))
    assert docs == ["First doc line one.\nLine two.", "Second doc.", "Third doc.", "Fourth doc.", "Fifth.", "Sixth."]
    per_file = list(iter_documents([str(tmp_path / "a.txt")], CorpusOptions(doc_per_file=True)))
    assert len(per_file) == 1 and "Second doc." in per_file[0]


def test_sentence_splitting():
    assert split_sentences("Dr. Smith arrived. He sat down!\nA new paragraph") == [
        "Dr. Smith arrived.", "He sat down!", "A new paragraph"]


def test_corpus_bad_input(tmp_path):
    binary = tmp_path / "x.bin"
    binary.write_bytes(b"\x7fELF\x00\x01\x02" * 10)
    with pytest.raises(InputError, match="x.bin: looks like a binary file"):
        list(iter_documents([str(binary)]))
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"ok line\nbroken \xff here\n")
    with pytest.raises(InputError, match=r"bad.txt: invalid UTF-8 at byte 15 \(line 2\)"):
        list(iter_documents([str(bad)]))
    assert list(iter_documents([str(bad)], CorpusOptions(encoding_errors="replace"))) == ["ok line\nbroken \ufffd here"]
    jsonl = tmp_path / "d.jsonl"
    jsonl.write_text('{"text": "fine"}\n{"text": oops}\n', encoding="utf-8")
    with pytest.raises(InputError, match="d.jsonl:2: not valid JSON"):
        list(iter_documents([str(jsonl)]))
    with pytest.raises(InputError, match="no such file"):
        list(iter_documents([str(tmp_path / "missing*.txt")]))


def test_datasets_directory(tmp_path):
    datasets = pytest.importorskip("datasets")
    datasets.Dataset.from_dict({"body": ["First document.", "", "Second one."]}).save_to_disk(tmp_path / "single")
    assert list(iter_documents([str(tmp_path / "single")], CorpusOptions(text_field="body"))) == [
        "First document.", "Second one."]
    splits = datasets.DatasetDict({"train": datasets.Dataset.from_dict({"text": ["a b c."]}),
                                   "test": datasets.Dataset.from_dict({"text": ["x."]})})
    splits.save_to_disk(tmp_path / "dict")
    assert list(iter_documents([str(tmp_path / "dict")])) == ["a b c."]
    with pytest.raises(InputError, match="no split 'validation'"):
        list(iter_documents([str(tmp_path / "dict")], CorpusOptions(hf_split="validation")))


def test_hub_dataset_offline_is_a_clear_error(tmp_path, tokenizer):
    import os
    import subprocess
    import sys

    tokenizer.save(tmp_path / "tok")
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONWARNINGS="ignore")
    result = subprocess.run([sys.executable, "-m", "bertforge", "prepare", "hf:some/dataset", "--tokenizer",
                             str(tmp_path / "tok"), "--out", str(tmp_path / "out")], capture_output=True, text=True,
                            env=env, timeout=300)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "hf:some/dataset" in result.stderr and ("network" in result.stderr or "pip install datasets" in result.stderr)
    assert len(result.stderr.strip().splitlines()) == 1


def test_empty_corpus(tmp_path, tokenizer):
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n   \n", encoding="utf-8")
    with pytest.raises(InputError, match="empty.txt: the corpus is empty"):
        prepare([str(empty)], tmp_path / "out", tokenizer, workers=1)
    assert not (tmp_path / "out").exists()


# ----------------------------------------------------------------------------- shards
def test_shards_round_trip_and_parallel_equals_serial(tmp_path, tokenizer):
    corpus = write_corpus(tmp_path / "c.txt", n_docs=60, seed=3)
    serial = prepare([str(corpus)], tmp_path / "serial", tokenizer, workers=1, shard_tokens=500)
    parallel = prepare([str(corpus)], tmp_path / "parallel", tokenizer, workers=2, shard_tokens=500)
    assert len(serial["shards"]) > 2  # documents really were spread over several shards
    assert {k: serial[k] for k in ("documents", "sentences", "tokens")} == {
        k: parallel[k] for k in ("documents", "sentences", "tokens")}
    for name in ("serial", "parallel"):
        shards = TokenShards(tmp_path / name)
        docs = list(iter_documents([str(corpus)]))
        assert shards.num_documents == len(docs) == 60
        for d in (0, 17, 59):
            expected, _, _ = tokenize_documents([docs[d]], tokenizer)
            first, last = shards.document_sentences(d)
            np.testing.assert_array_equal(shards.sentence_tokens(first, last), expected)
        lengths = shards.sentence_lengths()
        assert lengths.sum() == shards.num_tokens and (lengths > 0).all()


# ----------------------------------------------------------------------------- NSP pairs
def reference_pairs(documents: list[list[list[int]]], max_seq_len: int, short_seq_prob: float, rng: random.Random):
    """A token-level reading of google-research/bert's create_instances_from_document, for every document."""
    out = []
    for index, document in enumerate(documents):
        max_num_tokens = max_seq_len - 3
        target = max_num_tokens
        if rng.random() < short_seq_prob:
            target = rng.randint(2, max_num_tokens)
        chunk, length, i = [], 0, 0
        while i < len(document):
            chunk.append(document[i])
            length += len(document[i])
            if i == len(document) - 1 or length >= target:
                a_end = rng.randint(1, len(chunk) - 1) if len(chunk) >= 2 else 1
                a = [t for s in chunk[:a_end] for t in s]
                b = []
                if len(chunk) == 1 or rng.random() < 0.5:
                    is_random = 1
                    for _ in range(10):
                        other = rng.randint(0, len(documents) - 1)
                        if other != index:
                            break
                    start = rng.randint(0, len(documents[other]) - 1)
                    for j in range(start, len(documents[other])):
                        b.extend(documents[other][j])
                        if len(b) >= target - len(a):
                            break
                    i -= len(chunk) - a_end
                else:
                    is_random = 0
                    b = [t for s in chunk[a_end:] for t in s]
                while len(a) + len(b) > max_num_tokens:
                    longer = a if len(a) > len(b) else b
                    if rng.random() < 0.5:
                        del longer[0]
                    else:
                        longer.pop()
                out.append((a, b, is_random))
                chunk, length = [], 0
            i += 1
    return out


@pytest.mark.parametrize("max_seq_len, short_seq_prob", [(32, 0.1), (64, 0.5), (16, 0.0)])
def test_pairs_equal_token_level_reference(shards, tokenizer, max_seq_len, short_seq_prob):
    docs = np.arange(shards.num_documents)
    examples = PretrainingExamples(shards, docs, tokenizer, max_seq_len, "mlm+nsp", short_seq_prob, seed=5)
    ours = build_nsp_instances(shards.sentence_lengths(), np.concatenate([[0], shards.document_boundaries()]), docs,
                               max_seq_len, short_seq_prob, random.Random(42))
    examples._instances, examples._epoch = ours, 0
    documents = []
    for d in docs:
        first, last = shards.document_sentences(int(d))
        documents.append([shards.sentence_tokens(s, s + 1).tolist() for s in range(first, last)])
    expected = reference_pairs(documents, max_seq_len, short_seq_prob, random.Random(42))
    assert len(ours) == len(expected) > 100
    cls, sep = tokenizer.cls_token_id, tokenizer.sep_token_id
    for k, (a, b, is_random) in enumerate(expected):
        ex = examples.example(0, k)
        assert ex["input_ids"].tolist() == [cls, *a, sep, *b, sep]
        assert ex["token_type_ids"].tolist() == [0] * (len(a) + 2) + [1] * (len(b) + 1)
        assert ex["next_sentence_label"] == is_random
        assert len(ex["input_ids"]) <= max_seq_len


def test_pair_statistics(shards, tokenizer):
    docs = np.arange(shards.num_documents)
    bounds = np.concatenate([[0], shards.document_boundaries()])
    rows = build_nsp_instances(shards.sentence_lengths(), bounds, docs, 64, 0.1, random.Random(0))
    doc_of = np.searchsorted(bounds, rows[:, A_START], side="right") - 1
    b_doc = np.searchsorted(bounds, rows[:, B_START], side="right") - 1
    nxt = rows[:, IS_RANDOM] == 0
    assert (rows[nxt, B_START] == rows[nxt, A_END]).all() and (b_doc[nxt] == doc_of[nxt]).all()
    assert (b_doc[~nxt] != doc_of[~nxt]).all()
    assert 0.45 < (~nxt).mean() < 0.75  # 0.5, plus single-sentence chunks, which are always random
    assert (rows[:, A_END] > rows[:, A_START]).all() and (rows[:, B_END] > rows[:, B_START]).all()


def test_full_sentences_blocks_cover_the_stream(shards, tokenizer):
    docs = np.arange(shards.num_documents)
    examples = PretrainingExamples(shards, docs, tokenizer, 40, "mlm")
    blocks = [examples.example(0, k)["input_ids"] for k in range(len(examples.instances(0)))]
    assert all(b[0] == tokenizer.cls_token_id and b[-1] == tokenizer.sep_token_id and len(b) <= 40 for b in blocks)
    assert all(len(b) == 40 for b in blocks[:-1])  # packed to full length
    stream = np.concatenate([b[1:-1] for b in blocks])
    expected = []
    for d in docs:
        first, last = shards.document_sentences(int(d))
        expected.extend(shards.sentence_tokens(first, last).tolist() + [tokenizer.sep_token_id])
    assert stream.tolist() == expected


# ----------------------------------------------------------------------------- masking
def sequences(tokenizer, n=400, seed=0):
    rng = random.Random(seed)
    docs = make_documents(n, seed)
    out = []
    for d in docs:
        a, b = d[0], d[-1]
        enc = tokenizer(a, b, truncation=True, max_length=rng.randint(12, 64))
        out.append({"input_ids": np.array(enc["input_ids"]), "token_type_ids": np.array(enc["token_type_ids"])})
    return out


def test_masking_counts_and_specials(tokenizer):
    examples = sequences(tokenizer)
    collator = MaskingCollator(tokenizer, 64)
    batch = collator(examples, np.random.default_rng(0))
    labels, inputs, mask = batch["labels"], batch["input_ids"], batch["attention_mask"]
    for row, ex in enumerate(examples):
        n = len(ex["input_ids"])
        assert int((labels[row] != -100).sum()) == min(collator.cap, max(1, round(n * 0.15)))
    specials = np.isin(np.stack([np.pad(e["input_ids"], (0, inputs.shape[1] - len(e["input_ids"])))
                                 for e in examples]), [tokenizer.cls_token_id, tokenizer.sep_token_id, 0])
    assert (labels.numpy()[specials] == -100).all()
    assert (labels[mask == 0] == -100).all()


def test_masking_80_10_10(tokenizer):
    examples = sequences(tokenizer, n=1500, seed=1)
    batch = MaskingCollator(tokenizer, 64)(examples, np.random.default_rng(1))
    chosen = batch["labels"] != -100
    seen, original = batch["input_ids"][chosen], batch["labels"][chosen]
    total = chosen.sum().item()
    as_mask = (seen == tokenizer.mask_token_id).sum().item() / total
    unchanged = (seen == original).sum().item() / total
    assert total > 5000
    assert abs(as_mask - 0.8) < 0.02 and abs(unchanged - 0.1) < 0.015 and abs(1 - as_mask - unchanged - 0.1) < 0.015


def test_masking_is_keyed_and_fresh(tokenizer):
    examples = sequences(tokenizer, n=50)
    collator = MaskingCollator(tokenizer, 64)
    a = collator(examples, np.random.default_rng([0, 1]))
    b = collator(examples, np.random.default_rng([0, 1]))
    c = collator(examples, np.random.default_rng([0, 2]))
    assert (a["labels"] == b["labels"]).all() and (a["input_ids"] == b["input_ids"]).all()
    assert not (a["labels"] == c["labels"]).all()


def test_whole_word_masking_takes_whole_words(tokenizer):
    examples = sequences(tokenizer, n=300, seed=2)
    collator = MaskingCollator(tokenizer, 64, MaskingConfig(wwm=True))
    batch = collator(examples, np.random.default_rng(3))
    split_words = 0
    for row, ex in enumerate(examples):
        ids = ex["input_ids"]
        chosen = (batch["labels"][row, :len(ids)] != -100).numpy()
        cont = collator.is_continuation[ids]
        for i in range(1, len(ids)):
            if cont[i]:  # a "##" piece is chosen exactly when the piece before it is
                split_words += 1
                assert chosen[i] == chosen[i - 1]
        assert chosen.sum() <= min(collator.cap, max(1, round(len(ids) * 0.15)))
    assert split_words > 50  # the vocabulary really splits words into pieces


# ----------------------------------------------------------------------------- ALBERT: sentence order, n-grams
def test_sentence_order_pairs(shards, tokenizer):
    """ALBERT's pairs: B is the rest of A's chunk, swapped half of the time (label 1, A after B in the document);
    only one-sentence chunks take a random B from another document, as google-research/albert does."""
    docs = np.arange(shards.num_documents)
    bounds = np.concatenate([[0], shards.document_boundaries()])
    rows = build_nsp_instances(shards.sentence_lengths(), bounds, docs, 64, 0.1, random.Random(0), sentence_order=True)
    doc_of = np.searchsorted(bounds, rows[:, A_START], side="right") - 1
    b_doc = np.searchsorted(bounds, rows[:, B_START], side="right") - 1
    kept = rows[:, IS_RANDOM] == 0
    swapped = (rows[:, IS_RANDOM] == 1) & (b_doc == doc_of)
    assert (rows[kept, B_START] == rows[kept, A_END]).all() and (b_doc[kept] == doc_of[kept]).all()
    assert (rows[swapped, A_START] == rows[swapped, B_END]).all()  # B's sentences come first in the document
    random_b = (rows[:, IS_RANDOM] == 1) & (b_doc != doc_of)
    assert (rows[random_b, A_END] - rows[random_b, A_START] == 1).all()  # only one-sentence chunks
    assert 0.4 < swapped.sum() / (swapped.sum() + kept.sum()) < 0.6 and random_b.mean() < 0.2
    examples = PretrainingExamples(shards, docs, tokenizer, 64, "mlm+sop", 0.1, seed=5)
    ex = examples.example(0, 0)
    assert "sentence_order_label" in ex and "next_sentence_label" not in ex
    batch = MaskingCollator(tokenizer, 64)([examples.example(0, k) for k in range(8)], np.random.default_rng(0))
    assert batch["sentence_order_label"].tolist() == [examples.example(0, k)["sentence_order_label"] for k in range(8)]


def test_ngram_masking_takes_spans_of_whole_words(tokenizer):
    """Spans of 1..3 whole words, lengths drawn with p(n) ~ 1/n, never overlapping, within the prediction budget."""
    from bertforge.data.pretraining import ngram_positions

    rng = np.random.default_rng(0)
    words = [np.arange(i * 2, i * 2 + 1 + i % 2) for i in range(40)]  # words of one or two pieces, gaps between
    lengths = []
    for _ in range(300):
        chosen = ngram_positions(words, 12, 3, rng)
        assert len(chosen) <= 12 and len(set(chosen.tolist())) == len(chosen)
        picked = [w for w in range(len(words)) if np.isin(words[w], chosen).any()]
        for w in picked:
            assert np.isin(words[w], chosen).all()  # a word is taken whole or not at all
        runs, run = [], 1
        for a, b in zip(picked, picked[1:]):
            run = run + 1 if b == a + 1 else (runs.append(run) or 1)
        runs.append(run)
        lengths.extend(runs)
    counts = np.bincount(lengths)
    assert counts[1] > counts[2] > 0 and counts[3] > 0  # short spans most often (adjacent spans merge into longer runs)
    collator = MaskingCollator(tokenizer, 64, MaskingConfig(ngram_mask=3))
    batch = collator(sequences(tokenizer, n=100, seed=4), np.random.default_rng(5))
    assert (batch["labels"] != -100).sum() > 0


def test_word_starts_of_each_tokenizer_kind():
    from bertforge.data.pretraining import word_continuations

    pieces = {"▁the": 0, "▁cat": 1, "s": 2, "[CLS]": 3, **{f"▁w{i}": 4 + i for i in range(20)}}
    assert word_continuations(pieces, len(pieces))[[0, 1, 2]].tolist() == [False, False, True]
    wordpiece = {"the": 0, "cat": 1, "##s": 2}
    assert word_continuations(wordpiece, 3).tolist() == [False, False, True]
