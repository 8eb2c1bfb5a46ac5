"""The family's tokenizers against transformers' fast tokenizers, both ways, on adversarial text.

RoBERTa's byte-level BPE and XLM-RoBERTa's SentencePiece Unigram are trained in the test on a little
text (no downloads); transformers builds its tokenizer from the same vocabulary and saves it;
bertforge reads that directory, and transformers reads what bertforge saves. Ids, offsets,
special-token masks, pairs, padding and truncation must agree.
"""

from __future__ import annotations

import json

import pytest

transformers = pytest.importorskip("transformers")

import bertforge  # noqa: E402
from bertforge.errors import TokenizerError  # noqa: E402
from bertforge.tokenization.bpe import ByteLevelBPETokenizer  # noqa: E402
from bertforge.tokenization.unigram import UnigramTokenizer  # noqa: E402

from conftest import corpus  # noqa: E402, F401  (unigram_dirs, modern_dirs: conftest fixtures)

ADVERSARIAL = ["Hello <mask> world", "Héllo wörld, 東京 🙂!", "zero\u200bwidth\u200d joiner", "ctrl\x00\x07chars\ttab",
               "a" * 300, "  leading and trailing  ", "", "naïve café", "ﬁ ligature Ａ full-width", "ÅÄÖ åäö",
               "tab\tand\nnewline", "<s> typed specials </s>"]
PAIRS = [None, "the pair text", "東京 🙂"]


def agree(ours, theirs) -> int:
    """How many (text, pair) cases were compared; fails on the first disagreement."""
    n = 0
    for text in ADVERSARIAL:
        for pair in PAIRS:
            a = ours(text, pair, return_offsets_mapping=True, return_special_tokens_mask=True)
            b = theirs(text, pair, return_offsets_mapping=True, return_special_tokens_mask=True)
            assert set(a) == set(b), (set(a), set(b))
            for key in a:
                x = [tuple(v) for v in a[key]] if key == "offset_mapping" else a[key]
                y = [tuple(v) for v in b[key]] if key == "offset_mapping" else b[key]
                assert x == y, (key, text, pair)
            n += 1
    a = ours(ADVERSARIAL[:6], ADVERSARIAL[6:], padding=True, truncation=True, max_length=24, return_tensors="pt")
    b = theirs(ADVERSARIAL[:6], ADVERSARIAL[6:], padding=True, truncation=True, max_length=24, return_tensors="pt")
    assert set(a) == set(b) and all(a[k].tolist() == b[k].tolist() for k in a)
    for skip in (False, True):  # transformers' default keeps the special tokens, and so does bertforge's
        assert ours.decode(a["input_ids"][1].tolist(), skip_special_tokens=skip) == \
            theirs.decode(b["input_ids"][1].tolist(), skip_special_tokens=skip)
    assert ours.decode(a["input_ids"][1]) == theirs.decode(b["input_ids"][1])  # a tensor too
    return n + 1


@pytest.fixture(scope="module")
def bpe_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("bpe")
    ours = ByteLevelBPETokenizer.train(texts=corpus(), vocab_size=700)
    ours.save(root / "ours")
    model = json.loads(ours.backend.to_str())["model"]
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    transformers.RobertaTokenizer(vocab=model["vocab"], merges=merges).save_pretrained(root / "hf")
    return root


@pytest.mark.parametrize("side", ["hf", "ours"])
def test_bpe_agrees_with_transformers(bpe_dirs, side):
    ours = bertforge.AutoTokenizer.from_pretrained(bpe_dirs / side)
    assert isinstance(ours, ByteLevelBPETokenizer)
    assert agree(ours, transformers.AutoTokenizer.from_pretrained(bpe_dirs / side)) == len(ADVERSARIAL) * len(PAIRS) + 1


@pytest.mark.parametrize("side", ["hf", "ours"])
def test_unigram_agrees_with_transformers(unigram_dirs, side):
    ours = bertforge.AutoTokenizer.from_pretrained(unigram_dirs / side)
    assert isinstance(ours, UnigramTokenizer)
    assert agree(ours, transformers.AutoTokenizer.from_pretrained(unigram_dirs / side)) == len(ADVERSARIAL) * len(PAIRS) + 1


@pytest.mark.parametrize("side", ["hf", "ours"])
@pytest.mark.parametrize("family, cls, cls_id, unk_id, asked", [
    # ALBERT sends segments only when asked, as transformers' AlbertTokenizer; DeBERTa's sends them by default.
    ("albert", "AlbertTokenizer", 2, 1, {"return_token_type_ids": True}),
    ("deberta", "DebertaV2Tokenizer", 1, 3, {}),
    ("camembert", "CamembertTokenizer", 5, 3, {}),  # fairseq's numbering: <s> at 5, <unk> at 3
])
def test_bracketed_unigram_tokenizers_agree_with_transformers(request, side, family, cls, cls_id, unk_id, asked):
    path = request.getfixturevalue(f"{family}_dirs") / side
    ours = bertforge.AutoTokenizer.from_pretrained(path)
    assert type(ours).__name__ == cls and ours.cls_token_id == cls_id and ours.unk_token_id == unk_id
    theirs = transformers.AutoTokenizer.from_pretrained(path)
    assert agree(ours, theirs) == len(ADVERSARIAL) * len(PAIRS) + 1
    # BERT's segments: the second text and its [SEP] are typed 1.
    if family == "camembert":  # RoBERTa's pairs, no segments; the NOTUSED pieces typed in text stay whole
        text = "<s>NOTUSED a <unk>NOTUSED film"
        assert dict(ours(text)) == dict(theirs(text)) and "token_type_ids" not in ours("a", "b")
        return
    a = ours("a good film", "東京 🙂", **asked)
    assert a["token_type_ids"] == theirs("a good film", "東京 🙂", **asked)["token_type_ids"]
    assert a["token_type_ids"][-1] == 1 and a["token_type_ids"][0] == 0


@pytest.mark.parametrize("family, cls, settings", [
    ("albert", "AlbertTokenizer", {"do_lower_case": False}), ("albert", "AlbertTokenizer", {"keep_accents": True}),
    ("albert", "AlbertTokenizer", {"do_lower_case": False, "keep_accents": True}),
    ("deberta", "DebertaV2Tokenizer", {"do_lower_case": True}), ("deberta", "DebertaV2Tokenizer", {"split_by_punct": True}),
    ("deberta", "DebertaV2Tokenizer", {"add_prefix_space": False}),
])
def test_unigram_pipeline_settings_are_honoured(request, tmp_path, family, cls, settings):
    source = request.getfixturevalue(f"{family}_dirs") / "hf"
    config = json.loads((source / "tokenizer_config.json").read_text())
    for name in ("tokenizer.json", "special_tokens_map.json"):
        if (source / name).is_file():
            (tmp_path / name).write_bytes((source / name).read_bytes())
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config | settings))
    ours = bertforge.AutoTokenizer.from_pretrained(tmp_path)
    assert agree(ours, transformers.AutoTokenizer.from_pretrained(tmp_path)) == len(ADVERSARIAL) * len(PAIRS) + 1
    ours.save(tmp_path / "again")
    saved = json.loads((tmp_path / "again" / "tokenizer_config.json").read_text())
    assert {k: saved[k] for k in settings} == settings and saved["tokenizer_class"] == cls


def test_bpe_reads_vocab_json_and_merges_alone(bpe_dirs, tmp_path):
    for name in ("vocab.json", "merges.txt", "tokenizer_config.json"):
        (tmp_path / name).write_bytes((bpe_dirs / "ours" / name).read_bytes())
    ours = bertforge.AutoTokenizer.from_pretrained(tmp_path)
    assert agree(ours, transformers.AutoTokenizer.from_pretrained(bpe_dirs / "hf")) > 0


@pytest.mark.parametrize("key, value, words", [
    ("tokenizer_class", "BertTokenizer", "tokenizer_class"),
    ("errors", "strict", "errors"),
    ("add_prefix_space", "yes", "add_prefix_space"),
    ("padding_side", "left", "padding_side"),
])
def test_settings_are_honoured_or_refused_by_name(bpe_dirs, tmp_path, key, value, words):
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (tmp_path / name).write_bytes((bpe_dirs / "ours" / name).read_bytes())
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    config[key] = value
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(TokenizerError, match=words):
        bertforge.AutoTokenizer.from_pretrained(tmp_path)


def test_add_prefix_space_is_honoured(bpe_dirs, tmp_path):
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (tmp_path / name).write_bytes((bpe_dirs / "ours" / name).read_bytes())
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    config["add_prefix_space"] = True
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    ours = bertforge.AutoTokenizer.from_pretrained(tmp_path)
    theirs = transformers.AutoTokenizer.from_pretrained(tmp_path)
    assert ours("Hello world")["input_ids"] == theirs("Hello world")["input_ids"]
    assert ours("Hello world")["input_ids"] != bertforge.AutoTokenizer.from_pretrained(bpe_dirs / "ours")("Hello world")["input_ids"]


def test_pre_split_words_need_the_prefix_space_as_in_transformers(bpe_dirs):
    words = [["EU", "rejects", "German", "call"], ["Héllo", "東京", "🙂"]]
    ours = bertforge.AutoTokenizer.from_pretrained(bpe_dirs / "hf")
    with pytest.raises(TokenizerError, match="add_prefix_space"):
        ours(words, is_split_into_words=True)
    theirs = transformers.AutoTokenizer.from_pretrained(bpe_dirs / "hf", add_prefix_space=True)
    a = ours.for_words()(words, is_split_into_words=True, return_offsets_mapping=True)
    b = theirs(words, is_split_into_words=True, return_offsets_mapping=True)
    assert a["input_ids"] == b["input_ids"]
    assert [[tuple(o) for o in row] for row in a["offset_mapping"]] == [[tuple(o) for o in row] for row in b["offset_mapping"]]
    assert [a.word_ids(i) for i in range(2)] == [b.word_ids(i) for i in range(2)]


@pytest.mark.parametrize("side", ["ours", "hf"])
def test_tokenizer_json_pipeline_agrees_with_transformers(modern_dirs, side):
    from bertforge.tokenization.verbatim import VerbatimTokenizer

    ours = bertforge.AutoTokenizer.from_pretrained(modern_dirs / side)
    assert isinstance(ours, VerbatimTokenizer) and ours.mask_token_id == 4
    theirs = transformers.AutoTokenizer.from_pretrained(modern_dirs / side)
    assert agree(ours, theirs) == len(ADVERSARIAL) * len(PAIRS) + 1
    assert "token_type_ids" not in ours("a b")  # model_input_names, as ModernBERT's tokenizer_config says
    # Pre-split words: as transformers encodes them; and for_words() gives each the space pretraining saw before
    # it (ByteLevel's add_prefix_space), as for RoBERTa.
    words = [["Héllo", "wörld"], ["a", "tokenizer", "test"]]
    plain = ours(words, is_split_into_words=True)
    assert plain["input_ids"] == theirs(words, is_split_into_words=True)["input_ids"]
    spaced = ours.for_words()(words, is_split_into_words=True)
    assert spaced["input_ids"] == [theirs(" " + " ".join(w))["input_ids"] for w in words] != plain["input_ids"]
    inner = spaced.word_ids(1)[1:-1]  # [CLS] and [SEP] belong to no word; each word's pieces follow in order
    assert inner == sorted(inner) and set(inner) == {0, 1, 2} and spaced.word_ids(1)[0] is None


@pytest.mark.parametrize("change, message", [
    ({"model_input_names": ["input_ids", "position_ids"]}, "model_input_names"),
    ({"add_bos_token": True}, "add_bos_token"),
    ({"tokenizer_class": "RobertaTokenizer"}, None),
])
def test_tokenizer_json_settings_honoured_or_refused(modern_dirs, tmp_path, change, message):
    config = json.loads((modern_dirs / "ours" / "tokenizer_config.json").read_text())
    (tmp_path / "tokenizer.json").write_bytes((modern_dirs / "ours" / "tokenizer.json").read_bytes())
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config | change))
    if message is None:  # RoBERTa's class: its pipeline is rebuilt around the vocabulary, as transformers does
        ours = bertforge.AutoTokenizer.from_pretrained(tmp_path)
        assert type(ours).__name__ == "ByteLevelBPETokenizer"
        return
    with pytest.raises(TokenizerError, match=message):
        bertforge.AutoTokenizer.from_pretrained(tmp_path)
    for inputs in (None, ["input_ids", "token_type_ids", "attention_mask"]):  # transformers' default, and segments
        config.pop("model_input_names", None)
        (tmp_path / "tokenizer_config.json").write_text(json.dumps(config | ({"model_input_names": inputs} if inputs else {})))
        both = (bertforge.AutoTokenizer.from_pretrained(tmp_path), transformers.AutoTokenizer.from_pretrained(tmp_path))
        assert [sorted(t("a", "b")) for t in both] == [sorted(inputs or ["input_ids", "attention_mask"])] * 2
        assert both[0]("a", "b") == both[1]("a", "b")


SPECIALS = {"RobertaTokenizer": ("<s>", "<pad>", "</s>", "<unk>", "<mask>"),
            "XLMRobertaTokenizer": ("<s>", "<pad>", "</s>", "<unk>", "<mask>"),
            "AlbertTokenizer": ("<pad>", "<unk>", "[CLS]", "[SEP]", "[MASK]"),
            "DebertaV2Tokenizer": ("[PAD]", "[CLS]", "[SEP]", "[UNK]", "[MASK]")}


@pytest.mark.parametrize("args, cls", [(["--kind", "bpe"], "RobertaTokenizer"), (["--kind", "unigram"], "XLMRobertaTokenizer"),
                                       (["--arch", "albert"], "AlbertTokenizer"),
                                       (["--arch", "deberta-v2"], "DebertaV2Tokenizer")])
def test_cli_trains_each_kind_reproducibly_and_transformers_reads_it(tmp_path, args, cls):
    """Two separate processes (the test's own and a fresh one, each with its own hash seed) give the same
    tokenizer.json, byte for byte; transformers reads it as its own class and tokenizes as bertforge does."""
    from cli_utils import cli

    if cls != "RobertaTokenizer":
        pytest.importorskip("sentencepiece")
    text = tmp_path / "corpus.txt"
    text.write_text("\n".join(corpus()[:1500]) + "\n", encoding="utf-8")
    runs = []
    for name, fresh in (("a", False), ("b", True)):
        result = cli("tokenizer", "train", str(text), *args, "--vocab-size", "500", "--out", str(tmp_path / name),
                     "--json", fresh=fresh)
        assert result.returncode == 0, result.stderr
        runs.append((tmp_path / name / "tokenizer.json").read_bytes())
    assert runs[0] == runs[1]  # the same files give the same vocabulary, byte for byte
    theirs = transformers.AutoTokenizer.from_pretrained(tmp_path / "a")
    assert type(theirs).__name__ == cls
    ours = bertforge.AutoTokenizer.from_pretrained(tmp_path / "a")
    assert [ours.token_to_id(t) for t in SPECIALS[cls]] == [0, 1, 2, 3, 4]
    assert 400 < ours.vocab_size <= 500
    assert agree(ours, theirs) > 0


def test_cli_refuses_settings_the_kind_does_not_have(tmp_path):
    from cli_utils import cli

    text = tmp_path / "corpus.txt"
    text.write_text("a few words\n", encoding="utf-8")
    for args, words in ((["--kind", "unigram", "--min-frequency", "3"], "--min-frequency is a WordPiece and BPE setting"),
                        (["--kind", "bpe", "--arch", "albert"], "--kind bpe: --arch albert reads a unigram vocabulary"),
                        (["--arch", "gpt2"], "model_type 'gpt2' is not an architecture")):
        result = cli("tokenizer", "train", str(text), *args, "--out", str(tmp_path / "u"))
        assert result.returncode == 2 and words in result.stderr and "Traceback" not in result.stderr, result.stderr
        assert not (tmp_path / "u").exists()


@pytest.mark.parametrize("name, hf_class, options", [
    ("sentencepiece.bpe.model", "XLMRobertaTokenizer", {}),
    ("sentencepiece.bpe.model", "CamembertTokenizer", {}),  # config.json's model_type says which numbering
    ("spiece.model", "AlbertTokenizer", dict(pad_id=0, unk_id=1, bos_id=-1, eos_id=-1,
                                             control_symbols=["[CLS]", "[SEP]", "[MASK]"])),
    # DeBERTa-v3's layout: [PAD]=0 [CLS]=1 [SEP]=2 [UNK]=3 as SentencePiece's own pieces, [MASK] user-defined.
    ("spm.model", "DebertaV2Tokenizer", dict(pad_id=0, pad_piece="[PAD]", bos_id=1, bos_piece="[CLS]", eos_id=2,
                                             eos_piece="[SEP]", unk_id=3, unk_piece="[UNK]",
                                             user_defined_symbols=["[MASK]"])),
])
def test_a_sentencepiece_model_file_alone_reads_as_transformers_reads_it(tmp_path, name, hf_class, options):
    """A directory with only SentencePiece's .model (as XLM-R and ALBERT were published) gives transformers' ids."""
    spm = pytest.importorskip("sentencepiece")
    spm.SentencePieceTrainer.train(sentence_iterator=iter(corpus()), model_prefix=str(tmp_path / "m"), vocab_size=500,
                                   model_type="unigram", num_threads=1, minloglevel=2, **options)
    (tmp_path / "m.model").rename(tmp_path / name)
    (tmp_path / "m.vocab").unlink()
    if hf_class == "CamembertTokenizer":  # the same file name as XLM-R's: the checkpoint's model_type tells them apart
        (tmp_path / "config.json").write_text(json.dumps({"model_type": "camembert"}))
    ours = bertforge.AutoTokenizer.from_pretrained(tmp_path)
    theirs = getattr(transformers, hf_class).from_pretrained(tmp_path)
    assert type(ours).__name__ == (hf_class if hf_class != "XLMRobertaTokenizer" else "UnigramTokenizer")
    assert agree(ours, theirs) == len(ADVERSARIAL) * len(PAIRS) + 1
    ours.save(tmp_path / "saved")  # and what bertforge writes from it, transformers reads the same way
    assert agree(ours, transformers.AutoTokenizer.from_pretrained(tmp_path / "saved")) > 0


def test_a_corrupt_sentencepiece_model_is_refused_by_name(tmp_path):
    pytest.importorskip("sentencepiece")
    (tmp_path / "spiece.model").write_bytes(b"not a model at all")
    with pytest.raises(TokenizerError, match="spiece.model: not a SentencePiece model"):
        bertforge.AutoTokenizer.from_pretrained(tmp_path)
