"""Property tests on generated input, with hypothesis (fixed seeds: `derandomize=True`).

1. The tokenizer equals transformers' BertTokenizerFast on generated unicode text, pairs,
   every truncation strategy, max_length, stride and padding.
2. Every reader (TSV, CSV, JSONL, CoNLL, SQuAD, corpora, prediction inputs) given generated or
   mutated files either parses them or raises one `BertforgeError`, never another exception.
3. Loading a checkpoint whose config.json or weights were corrupted, truncated or mismatched
   raises a `BertforgeError`, never another exception.

BERTFORGE_FUZZ_EXAMPLES raises the number of examples for a long run
(`BERTFORGE_FUZZ_EXAMPLES=5000 pytest tests/test_fuzz.py`); the suite uses the small default.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bertforge import BertConfig, BertForSequenceClassification, BertModel, Tokenizer
from bertforge.data.classification import read_examples
from bertforge.data.corpus import CorpusOptions, iter_documents
from bertforge.data.ner import read_sentences
from bertforge.data.qa import read_squad
from bertforge.errors import BertforgeError
from bertforge.inference.pipelines import read_inputs
from bertforge.score import score_classification, score_ner, score_squad

EXAMPLES = int(os.environ.get("BERTFORGE_FUZZ_EXAMPLES", "60"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

# Text that stresses BERT's basic tokenizer: accents, CJK, combining marks, control and format characters,
# odd whitespace, punctuation, emoji, and the special tokens written out.
SPECIAL = st.sampled_from(["[MASK]", "[CLS]", "[SEP]", "[UNK]", "[PAD]", "##", "\u00a0", "\u200b", "\t", "\r\n",
                           "\x00", "\ufffd", "e\u0301", "ﬁ", "中文", "😀", "Ünïcödé", "don't", "U.S.A.", "—"])
TEXT = st.lists(st.one_of(st.text(min_size=0, max_size=12), SPECIAL), max_size=8).map(" ".join)


# ----------------------------------------------------------------------------- 1. tokenizer parity
@pytest.fixture(scope="module")
def tokenizers_pair(minilm_dir):
    transformers = pytest.importorskip("transformers")
    return Tokenizer.from_pretrained(minilm_dir), transformers.BertTokenizerFast.from_pretrained(minilm_dir)


KEYS = ("input_ids", "token_type_ids", "attention_mask")


@FUZZ
@given(texts=st.lists(TEXT, min_size=1, max_size=3), pairs=st.one_of(st.none(), st.just(True)),
       truncation=st.sampled_from([False, True, "only_first", "only_second", "longest_first"]),
       max_length=st.integers(5, 24), padding=st.sampled_from([False, True, "max_length"]),
       stride=st.integers(0, 3), overflow=st.booleans())
def test_tokenizer_matches_bert_tokenizer_fast(tokenizers_pair, texts, pairs, truncation, max_length, padding,
                                               stride, overflow):
    ours, theirs = tokenizers_pair
    second = [t[::-1] + " x" for t in texts] if pairs else None
    kwargs = dict(truncation=truncation, max_length=max_length, padding=padding)
    if overflow and truncation:
        kwargs.update(stride=stride, return_overflowing_tokens=True)
    try:
        want = theirs(texts, second, **kwargs)
    except BaseException:  # transformers refuses some combinations (its Rust side may even panic)
        with pytest.raises(ValueError):
            ours(texts, second, **kwargs)
        return
    got = ours(texts, second, **kwargs)
    for key in KEYS:
        assert got[key] == want[key], (key, texts, second, kwargs)
    if overflow and truncation:
        assert got["overflow_to_sample_mapping"] == want["overflow_to_sample_mapping"]
    for text in texts:
        assert ours.tokenize(text) == theirs.tokenize(text), text
        assert ours.decode(ours.encode(text)) == theirs.decode(theirs.encode(text)), text
        assert ours.decode(ours.encode(text), skip_special_tokens=True) == \
            theirs.decode(theirs.encode(text), skip_special_tokens=True), text


def test_a_max_length_with_no_room_for_text_is_refused(tokenizers_pair):
    """A pair cut to max_length=4 has room for one text token: transformers drops the first text
    entirely ([CLS] [SEP] d [SEP]) without a word, or returns rows longer than max_length. bertforge refuses."""
    ours, theirs = tokenizers_pair
    rows = theirs(["a b c"], ["d e f"], truncation=True, max_length=4)["input_ids"]
    assert rows[0][:2] == [theirs.cls_token_id, theirs.sep_token_id]  # nothing left of "a b c"
    with pytest.raises(ValueError, match="too short"):
        ours(["a b c"], ["d e f"], truncation=True, max_length=4)


# ----------------------------------------------------------------------------- 2. readers
LINES = st.lists(st.one_of(TEXT, st.sampled_from(["", "\t", "label", "text\tlabel", "{", "{}", '{"text": 1}',
                                                   '{"text": "a", "label": "x"}', "-DOCSTART- -X- O O",
                                                   "word B-PER", "word", "a\tb\tc", '"quoted, text",1'])),
                 max_size=8)


def _write(path: Path, lines: list[str], raw: bytes | None) -> Path:
    path.write_bytes(raw if raw is not None else "\n".join(lines).encode("utf-8", "surrogatepass"))
    return path


READERS = {
    "examples.tsv": lambda p: read_examples(p),
    "examples.csv": lambda p: read_examples(p),
    "examples.jsonl": lambda p: read_examples(p),
    "ner.conll": lambda p: read_sentences(p),
    "ner.jsonl": lambda p: read_sentences(p),
    "squad.json": lambda p: read_squad(p),
    "corpus.txt": lambda p: list(iter_documents([str(p)])),
    "corpus.jsonl": lambda p: list(iter_documents([str(p)], CorpusOptions())),
    "inputs.txt": lambda p: read_inputs([], str(p)),
}


@FUZZ
@given(name=st.sampled_from(sorted(READERS)), lines=LINES,
       raw=st.one_of(st.none(), st.binary(max_size=64), st.just(b"\xff\xfe\x00a"), st.just(b"\xef\xbb\xbfa\tb\n1\t2")))
def test_readers_parse_or_refuse_in_one_error(tmp_path, name, lines, raw):
    path = _write(tmp_path / name, lines, raw)
    try:
        READERS[name](path)
    except BertforgeError as exc:
        assert str(exc) and "\n" not in str(exc).strip(), str(exc)  # one line, naming the problem


SQUAD = st.fixed_dictionaries({
    "version": st.sampled_from(["1.1", "v2.0", 3, None]),
    "data": st.lists(st.fixed_dictionaries({"paragraphs": st.lists(st.fixed_dictionaries({
        "context": st.one_of(TEXT, st.integers()),
        "qas": st.lists(st.fixed_dictionaries({
            "id": st.sampled_from(["a", "b", "c"]),
            "question": TEXT,
            "answers": st.lists(st.fixed_dictionaries({"text": st.one_of(TEXT, st.none()),
                                                       "answer_start": st.integers(-2, 40)}), max_size=2),
        }), max_size=3)}), max_size=2)}), max_size=2),
})


@FUZZ
@given(data=SQUAD, predictions=st.dictionaries(st.sampled_from(["a", "b", "c", "d"]), st.one_of(TEXT, st.integers())),
       drop=st.sampled_from([None, "data", "paragraphs", "qas", "answers", "id"]))
def test_squad_files_parse_or_refuse(tmp_path, data, predictions, drop):
    if drop == "data":
        data.pop("data")
    elif drop:  # remove a key somewhere deeper, as a hand-edited file might
        for article in data.get("data", []):
            for paragraph in article["paragraphs"]:
                if drop == "paragraphs":
                    article.pop("paragraphs", None)
                    break
                paragraph.pop(drop, None) if drop == "qas" else [q.pop(drop, None) for q in paragraph.get("qas", [])]
    (tmp_path / "d.json").write_text(json.dumps(data))
    (tmp_path / "p.json").write_text(json.dumps(predictions))
    for call in (lambda: read_squad(tmp_path / "d.json"), lambda: score_squad(tmp_path / "d.json", tmp_path / "p.json")):
        try:
            call()
        except BertforgeError:
            pass


@FUZZ
@given(gold=LINES, pred=LINES)
def test_score_files_parse_or_refuse(tmp_path, gold, pred):
    for scorer, suffix in ((score_classification, ".tsv"), (score_ner, ".conll")):
        g = _write(tmp_path / f"gold{suffix}", gold, None)
        p = _write(tmp_path / "pred.jsonl", pred, None)
        try:
            scorer(g, p)
        except BertforgeError:
            pass


# ----------------------------------------------------------------------------- 3. checkpoints
@pytest.fixture(scope="module")
def saved_model(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("ckpt")
    torch.manual_seed(0)
    BertForSequenceClassification(BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                             intermediate_size=20, max_position_embeddings=16)).save_pretrained(path)
    return path


CONFIG_EDITS = st.dictionaries(
    st.sampled_from(["vocab_size", "hidden_size", "num_attention_heads", "hidden_act", "layer_norm_eps",
                     "id2label", "label2id", "model_type", "architectures", "pad_token_id", "is_decoder",
                     "max_position_embeddings", "tie_word_embeddings", "problem_type", "classifier_dropout",
                     "position_embedding_type", "type_vocab_size", "num_hidden_layers"]),
    st.one_of(st.none(), st.booleans(), st.integers(-3, 70), st.floats(allow_nan=True), st.text(max_size=5),
              st.lists(st.integers(0, 3), max_size=2), st.dictionaries(st.text(max_size=2), st.integers(0, 2), max_size=2)),
    max_size=3)


@FUZZ
@given(edits=CONFIG_EDITS, cut=st.one_of(st.none(), st.integers(0, 4000)), flip=st.one_of(st.none(), st.integers(0, 4000)),
       config_bytes=st.one_of(st.none(), st.binary(max_size=20)))
def test_corrupted_checkpoints_load_or_refuse(tmp_path, saved_model, edits, cut, flip, config_bytes):
    path = tmp_path / "m"
    shutil.copytree(saved_model, path, dirs_exist_ok=True)
    if config_bytes is not None:
        (path / "config.json").write_bytes(config_bytes)
    else:
        config = json.loads((path / "config.json").read_text())
        config.update(edits)
        (path / "config.json").write_text(json.dumps(config))
    weights = (path / "model.safetensors").read_bytes()
    if flip is not None and flip < len(weights):
        weights = weights[:flip] + bytes([weights[flip] ^ 0xFF]) + weights[flip + 1:]
    if cut is not None:
        weights = weights[:cut]
    (path / "model.safetensors").write_bytes(weights)
    for cls in (BertForSequenceClassification, BertModel):
        try:
            model = cls.from_pretrained(path)
        except BertforgeError:
            continue
        with torch.no_grad():
            model(torch.ones(1, 4, dtype=torch.long))  # what loads also runs
