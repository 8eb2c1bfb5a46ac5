"""Every field of a file bertforge reads is honoured exactly as transformers honours it, or refused.

config.json: activations under all their accepted names, untied MLM decoders, the label maps,
and the keys bertforge cannot honour. tokenizer_config.json: lower-casing, accents, CJK splitting
and renamed special tokens, against transformers' AutoTokenizer on the same directory. The
policy tables in `bertforge.models.config` are also checked against docs/config-fields.md, so the page
users read cannot drift from the code.
"""

from __future__ import annotations

import itertools
import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

import bertforge  # noqa: E402
from bertforge.models.config import HIDDEN_ACT, NO_EFFECT, REFUSED_UNLESS, BertConfig  # noqa: E402
from bertforge.errors import ConfigError, TokenizerError  # noqa: E402
from bertforge.models.layers import activation  # noqa: E402
from bertforge import Tokenizer  # noqa: E402

from conftest import REPO, TINY  # noqa: E402


# ----------------------------------------------------------------------------- config.json
@pytest.mark.parametrize("name", sorted(HIDDEN_ACT))
def test_every_accepted_activation_is_transformers_function(name):
    from transformers.activations import ACT2FN

    x = torch.linspace(-12, 12, 4001, dtype=torch.float64)
    torch.testing.assert_close(activation(name)(x), ACT2FN[name](x), atol=1e-7, rtol=1e-7)


def test_activations_transformers_has_and_bertforge_lacks_are_refused():
    from transformers.activations import ACT2CLS

    refused = sorted(set(ACT2CLS) - set(HIDDEN_ACT))
    assert refused  # gelu_10, laplace, prelu, ... compute something else
    for name in refused:
        with pytest.raises(ConfigError, match="hidden_act"):
            BertConfig(**TINY, hidden_act=name)


@pytest.mark.parametrize("key,value", [("is_decoder", True), ("add_cross_attention", True),
                                       ("is_encoder_decoder", True), ("position_embedding_type", "relative_key"),
                                       ("pruned_heads", {"0": [1]})])
def test_keys_bertforge_cannot_honour_are_refused_by_name(key, value):
    with pytest.raises(ConfigError, match=f"'{key}'"):
        BertConfig.from_dict({**TINY, key: value}, source="x/config.json")
    BertConfig.from_dict({**TINY, key: REFUSED_UNLESS[key][0]})  # the default value is fine


def test_label_maps_must_agree():
    with pytest.raises(ConfigError, match="label2id"):
        BertConfig.from_dict({**TINY, "id2label": {"0": "neg", "1": "pos"}, "label2id": {"neg": 1, "pos": 0}})
    with pytest.raises(ConfigError, match="num_labels"):
        BertConfig.from_dict({**TINY, "num_labels": 3, "id2label": {"0": "neg", "1": "pos"}})
    with pytest.raises(ConfigError, match="same name"):
        BertConfig.from_dict({**TINY, "id2label": {"0": "x", "1": "x"}})


def test_unknown_keys_are_named_in_a_warning_and_kept(caplog):
    with caplog.at_level(logging.WARNING, logger="bertforge"):
        config = BertConfig.from_dict({**TINY, "my_note": 1, "use_cache": True})
    assert "my_note" in caplog.text and "use_cache" not in caplog.text
    assert config.to_dict()["my_note"] == 1 and config.to_dict()["use_cache"] is True


@pytest.mark.parametrize("head", ["BertForPreTraining", "BertForMaskedLM"])
def test_untied_decoder_is_kept_both_ways(tmp_path, head):
    """tie_word_embeddings: false — the checkpoint's own decoder is used, and saved again."""
    hf_config = transformers.BertConfig(**TINY, tie_word_embeddings=False)
    torch.manual_seed(3)
    theirs = getattr(transformers, head)(hf_config).eval()
    with torch.no_grad():  # make the decoder clearly different from the word embeddings
        theirs.cls.predictions.decoder.weight.normal_(0, 0.5)
        theirs.cls.predictions.decoder.bias.normal_(0, 0.5)  # the bias transformers 5 uses when untied
    theirs.save_pretrained(tmp_path / "hf")
    ours = getattr(bertforge, head).from_pretrained(tmp_path / "hf")
    assert ours.load_report.missing_keys == [] and ours.load_report.unexpected_keys == []
    ids = torch.randint(5, TINY["vocab_size"], (2, 9))
    with torch.no_grad():
        want = theirs(input_ids=ids).logits if head == "BertForMaskedLM" else theirs(input_ids=ids).prediction_logits
        torch.testing.assert_close(ours(ids).logits, want, atol=1e-5, rtol=1e-5)
    ours.save_pretrained(tmp_path / "ours")
    again, info = getattr(transformers, head).from_pretrained(tmp_path / "ours", output_loading_info=True)
    assert not info["missing_keys"], info
    torch.testing.assert_close(again.cls.predictions.decoder.weight, theirs.cls.predictions.decoder.weight)
    assert json.loads((tmp_path / "ours" / "config.json").read_text())["tie_word_embeddings"] is False


def test_pad_token_id_none_loads_as_transformers(tmp_path):
    theirs = transformers.BertModel(transformers.BertConfig(**{**TINY, "pad_token_id": None})).eval()
    theirs.save_pretrained(tmp_path)
    ours = bertforge.BertModel.from_pretrained(tmp_path)
    ids = torch.randint(0, TINY["vocab_size"], (2, 7))
    with torch.no_grad():
        torch.testing.assert_close(ours(ids).last_hidden_state, theirs(input_ids=ids).last_hidden_state,
                                   atol=1e-5, rtol=1e-5)


def test_docs_table_lists_every_field_with_its_decision():
    """docs/config-fields.md is the users' copy of the policy: every key is there, with the right verdict."""
    page = (REPO / "docs" / "config-fields.md").read_text(encoding="utf-8")
    rows = {}
    for line in page.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 2 and cells[0].startswith("`"):
            for key in cells[0].replace("`", "").split(","):
                rows[key.strip()] = cells[1].lower()
    import dataclasses

    for f in dataclasses.fields(BertConfig):
        if f.name != "extra":
            assert rows.get(f.name, "").startswith("honoured"), f.name
    for key in REFUSED_UNLESS:
        assert rows.get(key, "").startswith("refused"), key
    for key in NO_EFFECT:
        assert rows.get(key, "").startswith(("no effect", "honoured", "checked")), key
    # Each family's own fields (and its names for BERT's) are there too, with theirs.
    from bertforge.models.registry import FAMILIES

    bert_fields = {f.name for f in dataclasses.fields(BertConfig)}
    for family in FAMILIES.values():
        own = {f.name for f in dataclasses.fields(family.config)} - bert_fields
        for key in own | set(getattr(family.config, "renamed", {})):
            assert rows.get(key, "").startswith("honoured"), (family.model_type, key)
        for key in family.config.family_no_effect:
            assert rows.get(key, "").startswith("no effect"), (family.model_type, key)


# ----------------------------------------------------------------------------- tokenizer files
@pytest.fixture(scope="module")
def base_tokenizer(tmp_path_factory) -> Tokenizer:
    """A small cased vocabulary that also holds <unk>, <s> and </s>, for the renamed special tokens."""
    texts = ["Héllo wörld Hello World 中文 测试 token ok", "the quick brown fox jumps over"] * 30
    trained = Tokenizer.train(texts=texts, vocab_size=220, min_frequency=1, lowercase=False)
    vocab = tmp_path_factory.mktemp("vocab") / "vocab.txt"
    tokens = sorted(trained.get_vocab(), key=trained.get_vocab().get) + ["<unk>", "<s>", "</s>"]
    vocab.write_text("".join(t + "\n" for t in tokens), encoding="utf-8")
    return Tokenizer.from_vocab(vocab, lowercase=False)


TEXTS = ["Héllo WÖRLD World 中文测试 [MASK] foo-bar", "naïve CAFÉ 测 x", "[CLS] a [SEP] b"]


def _write(tok: Tokenizer, d: Path, edit, with_json: bool) -> None:
    tok.save(d)
    (d / "config.json").write_text(json.dumps({"model_type": "bert"}))
    if not with_json:
        (d / "tokenizer.json").unlink()
    config = json.loads((d / "tokenizer_config.json").read_text())
    edit(config)
    (d / "tokenizer_config.json").write_text(json.dumps(config))


@pytest.mark.parametrize("with_json", [True, False])
def test_tokenizer_config_flags_match_transformers(tmp_path, base_tokenizer, with_json):
    """Every combination of do_lower_case / strip_accents / tokenize_chinese_chars, set or absent."""
    for i, (lc, sa, cc) in enumerate(itertools.product([True, False, "-"], [True, False, None, "-"],
                                                        [True, False, "-"])):
        def edit(c):
            for key, value in (("do_lower_case", lc), ("strip_accents", sa), ("tokenize_chinese_chars", cc)):
                c.pop(key, None)
                if value != "-":
                    c[key] = value
        d = tmp_path / str(i)
        _write(base_tokenizer, d, edit, with_json)
        theirs = transformers.AutoTokenizer.from_pretrained(d)
        ours = Tokenizer.from_pretrained(d)
        for text in TEXTS:
            assert ours.tokenize(text) == theirs.tokenize(text), (lc, sa, cc, text)
        pair = theirs(TEXTS[0], TEXTS[1])
        assert ours(TEXTS[0], TEXTS[1])["input_ids"] == pair["input_ids"]


def test_renamed_special_tokens_are_used(tmp_path, base_tokenizer):
    """A checkpoint that calls its unknown token <unk> (and so on) gets that token, as in transformers."""
    def edit(c):
        c.update(unk_token="<unk>", cls_token="<s>", sep_token="</s>")
    _write(base_tokenizer, tmp_path, edit, with_json=True)
    (tmp_path / "special_tokens_map.json").unlink()
    theirs = transformers.AutoTokenizer.from_pretrained(tmp_path)
    ours = Tokenizer.from_pretrained(tmp_path)
    for text in TEXTS + ["zzz 😀"]:
        assert ours(text)["input_ids"] == theirs(text)["input_ids"], text
    assert ours.cls_token_id == theirs.cls_token_id and ours.unk_token_id == theirs.unk_token_id
    ours.save(tmp_path / "again")
    assert Tokenizer.from_pretrained(tmp_path / "again").specials == ours.specials


@pytest.mark.parametrize("edit,key", [
    (lambda c: c.update(never_split=["foo"]), "never_split"),
    (lambda c: c.update(do_basic_tokenize=False), "do_basic_tokenize"),
    (lambda c: c.update(tokenizer_class="XLMRobertaTokenizer"), "tokenizer_class"),
    (lambda c: c.update(padding_side="left"), "padding_side"),
    (lambda c: c.update(do_lower_case="yes"), "do_lower_case"),
    (lambda c: c.update(model_max_length=-3), "model_max_length"),
    (lambda c: c.update(unk_token="<nope>"), "<nope>"),
])
def test_tokenizer_keys_that_cannot_be_honoured_are_refused(tmp_path, base_tokenizer, edit, key):
    _write(base_tokenizer, tmp_path, edit, with_json=True)
    with pytest.raises(TokenizerError, match=key):
        Tokenizer.from_pretrained(tmp_path)


def test_special_tokens_map_and_config_must_agree(tmp_path, base_tokenizer):
    _write(base_tokenizer, tmp_path, lambda c: c.update(unk_token="<unk>"), with_json=True)
    with pytest.raises(TokenizerError, match="unk_token"):
        Tokenizer.from_pretrained(tmp_path)  # special_tokens_map.json still says [UNK]


# ----------------------------------------------------------------------------- determinism
TRAIN_SCRIPT = """
import sys
from bertforge import Tokenizer
Tokenizer.train([sys.argv[1]], vocab_size=600, min_frequency=1).save(sys.argv[2])
"""


def test_vocabulary_training_is_byte_identical_across_processes(tmp_path):
    """The same corpus gives the same vocab.txt and tokenizer.json in fresh processes (each has its own
    hash seed, which is what made the `tokenizers` trainer alone differ from run to run)."""
    corpus = tmp_path / "corpus.txt"
    words = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "theta", "kappa", "lambda", "sigma"]
    lines = [" ".join(words[(i * 7 + j * 3) % 10] + words[(i + j) % 10][: 1 + (i * j) % 5] for j in range(12))
             for i in range(300)]
    corpus.write_text("\n".join(lines) + "\n", encoding="utf-8")
    outputs = []
    for run in range(3):
        out = tmp_path / f"tok{run}"
        subprocess.run([sys.executable, "-c", TRAIN_SCRIPT, str(corpus), str(out)], check=True)
        outputs.append(((out / "vocab.txt").read_bytes(), (out / "tokenizer.json").read_bytes()))
    assert outputs[0] == outputs[1] == outputs[2]


def test_a_vocabulary_without_a_mask_token_still_encodes(tmp_path):
    """Only fill-mask needs [MASK]; transformers loads such a vocabulary, and so does bertforge."""
    (tmp_path / "vocab.txt").write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\nhello\nworld\n")
    tok = Tokenizer.from_pretrained(tmp_path)
    assert tok("hello world")["input_ids"] == [2, 4, 5, 3] and tok.mask_token_id is None
    (tmp_path / "vocab.txt").write_text("[PAD]\n[UNK]\n[SEP]\nhello\n")
    with pytest.raises(TokenizerError, match="cls_token"):
        Tokenizer.from_pretrained(tmp_path)
