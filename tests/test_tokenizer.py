"""Tokenizer parity with transformers' BertTokenizerFast on real data and edge cases; training; files."""

from __future__ import annotations

import json
import shutil

import pytest

transformers = pytest.importorskip("transformers")

from bertforge import Tokenizer, TokenizerError  # noqa: E402

from conftest import shared, sst2_sentences  # noqa: E402

EDGE_CASES = [
    "",
    "   \t \n ",
    "Café naïve résumé Ångström façade",
    "北京欢迎你 and 日本語のテキスト mixed",
    "emoji 🤗🎉 and flags 🇫🇷 👩‍👩‍👧",
    "control\x00chars\x07here\u200b and\ttabs\r\n",
    "a" * 101 + " then " + "b" * 100 + " " + "Supercalifragilistic" * 6,
    "[MASK] is a special token, [CLS] too; [mask] is not.",
    "U.S.A. don't won't $3.50 -- 'quoted' \"double\" (parens) 50%",
]


@pytest.fixture(scope="module")
def pair(minilm_dir):
    """(bertforge from tokenizer.json, bertforge from vocab.txt alone, transformers)."""
    vocab_only = Tokenizer.from_vocab(minilm_dir / "vocab.txt", lowercase=True)
    return Tokenizer.from_pretrained(minilm_dir), vocab_only, transformers.BertTokenizerFast.from_pretrained(minilm_dir)


def assert_same(ours, theirs, texts, pairs=None, **kwargs):
    args = (texts,) if pairs is None else (texts, pairs)
    a = ours(*args, return_offsets_mapping=True, **kwargs)
    b = theirs(*args, return_offsets_mapping=True, **kwargs)
    for key in ("input_ids", "token_type_ids", "attention_mask", "offset_mapping"):
        got = [list(map(tuple, r)) if key == "offset_mapping" else list(r) for r in a[key]]
        want = [list(map(tuple, r)) if key == "offset_mapping" else list(r) for r in b[key]]
        assert len(got) == len(want)
        for i, (g, w) in enumerate(zip(got, want)):
            assert g == w, f"{key} differs on row {i}: {texts[i]!r}"


def test_sst2_dev_every_sentence(pair):
    ours_json, ours_vocab, theirs = pair
    sentences = sst2_sentences()
    assert len(sentences) == 872
    assert_same(ours_json, theirs, sentences)
    assert_same(ours_vocab, theirs, sentences)


def test_rte_dev_pairs(pair):
    ours, _, theirs = pair
    rows = [line.split("\t") for line in shared("glue", "RTE", "dev.tsv").read_text(encoding="utf-8").splitlines()[1:]]
    assert len(rows) == 277
    assert_same(ours, theirs, [r[1] for r in rows], [r[2] for r in rows])
    assert_same(ours, theirs, [r[1] for r in rows], [r[2] for r in rows], truncation=True, max_length=64)


def test_squad_questions_and_contexts_truncated_at_384(pair):
    ours, ours_vocab, theirs = pair
    data = json.loads(shared("squad", "dev-v1.1.json").read_text(encoding="utf-8"))["data"]
    questions, contexts, pair_contexts = [], [], []
    for article in data:
        for para in article["paragraphs"]:
            contexts.append(para["context"])
            for qa in para["qas"]:
                questions.append(qa["question"])
                pair_contexts.append(para["context"])
    assert len(questions) == 10570
    assert_same(ours, theirs, contexts, truncation=True, max_length=384)
    assert_same(ours_vocab, theirs, contexts, truncation=True, max_length=384)
    assert_same(ours, theirs, questions, pair_contexts, truncation="only_second", max_length=384)


def test_edge_cases(pair):
    ours, ours_vocab, theirs = pair
    assert_same(ours, theirs, EDGE_CASES)
    assert_same(ours_vocab, theirs, EDGE_CASES)
    assert ours("")["input_ids"] == [ours.cls_token_id, ours.sep_token_id]
    long_word = ours.tokenize("a" * 101)
    assert long_word == ["[UNK]"]
    assert ours.tokenize("[MASK] x")[0] == "[MASK]"


def test_call_shapes_padding_and_word_ids(pair):
    ours, _, _ = pair
    enc = ours(["hello world", "a much longer sentence than the first one"], padding=True, return_tensors="pt",
               return_word_ids=True)
    assert enc["input_ids"].shape == enc["attention_mask"].shape == enc["token_type_ids"].shape
    assert enc["attention_mask"][0].sum() < enc["attention_mask"][1].sum()
    assert enc["word_ids"][0][0] is None and enc["word_ids"][0][1] == 0
    assert enc.word_ids(1)[1] == 0
    assert ours(["a b c d e"], padding="max_length", max_length=16, return_tensors="np")["input_ids"].shape == (1, 16)
    windows = ours("what?", "one two three four five six seven eight nine ten", truncation="only_second",
                   max_length=10, stride=2, return_overflowing_tokens=True)
    assert len(windows["input_ids"]) > 1 and set(windows["overflow_to_sample_mapping"]) == {0}
    assert all(len(r) <= 10 for r in windows["input_ids"])


def test_train_save_and_load_in_transformers(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(f"The quick brown fox {i} jumps over the lazy dog. Résumé {i % 7}." for i in range(300)),
                      encoding="utf-8")
    tok = Tokenizer.train([corpus], vocab_size=200, lowercase=True, min_frequency=1)
    assert [tok.id_to_token(i) for i in range(5)] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    out = tmp_path / "tok"
    tok.save(out)
    assert {"vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"} <= {
        p.name for p in out.iterdir()}
    theirs = transformers.AutoTokenizer.from_pretrained(out)
    texts = ["The quick brown fox jumps.", "RÉSUMÉ of a lazy dog 42", "unseen zebra words"]
    assert_same(Tokenizer.from_pretrained(out), theirs, texts)
    assert_same(tok, theirs, texts)


def test_lowercase_setting_from_tokenizer_config(tmp_path, minilm_dir):
    """A cased tokenizer_config.json overrides the uncased normaliser in tokenizer.json, as transformers does."""
    for name in ("tokenizer.json", "vocab.txt", "special_tokens_map.json"):
        shutil.copy(minilm_dir / name, tmp_path / name)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": False}))
    tok = Tokenizer.from_pretrained(tmp_path)
    assert not tok.lowercase
    assert tok.tokenize("Hello")[0] != "hello"


def test_vocab_not_utf8(tmp_path):
    bad = tmp_path / "vocab.txt"
    bad.write_bytes(b"[PAD]\n[UNK]\n[CLS]\n[SEP]\n\xff\xfebad\n")
    with pytest.raises(TokenizerError, match=r"vocab.txt: not UTF-8 at byte 24 \(line 5\)"):
        Tokenizer.from_vocab(bad)


def test_train_reports_bad_utf8_file(tmp_path):
    bad = tmp_path / "c.txt"
    bad.write_bytes(b"good line\nbad \xc3\x28 line\n")
    with pytest.raises(TokenizerError, match=r"c.txt: not UTF-8 at byte 14"):
        Tokenizer.train([bad], vocab_size=100)
