"""Family members against transformers, both ways, without downloads (litgpt's `test_against_hf_*`).

For each architecture, head and shape: a small random transformers model with every parameter
perturbed (LayerNorm and biases too, so a swapped or missing name cannot pass) is saved, read by
bertforge's Auto classes and compared at real tokens; then bertforge saves it and transformers
reads it back with no missing or unexpected keys and the same outputs.
"""

from __future__ import annotations

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")

import bertforge  # noqa: E402

from conftest import perturbed  # noqa: E402

# (model_type, transformers config class, {our Auto class: transformers class})
FAMILIES = {
    "roberta": ("RobertaConfig", {
        "AutoModel": "RobertaModel", "AutoModelForMaskedLM": "RobertaForMaskedLM",
        "AutoModelForSequenceClassification": "RobertaForSequenceClassification",
        "AutoModelForTokenClassification": "RobertaForTokenClassification",
        "AutoModelForQuestionAnswering": "RobertaForQuestionAnswering"}),
    "xlm-roberta": ("XLMRobertaConfig", {
        "AutoModel": "XLMRobertaModel", "AutoModelForMaskedLM": "XLMRobertaForMaskedLM",
        "AutoModelForSequenceClassification": "XLMRobertaForSequenceClassification",
        "AutoModelForTokenClassification": "XLMRobertaForTokenClassification",
        "AutoModelForQuestionAnswering": "XLMRobertaForQuestionAnswering"}),
    "distilbert": ("DistilBertConfig", {
        "AutoModel": "DistilBertModel", "AutoModelForMaskedLM": "DistilBertForMaskedLM",
        "AutoModelForSequenceClassification": "DistilBertForSequenceClassification",
        "AutoModelForTokenClassification": "DistilBertForTokenClassification",
        "AutoModelForQuestionAnswering": "DistilBertForQuestionAnswering"}),
    "albert": ("AlbertConfig", {
        "AutoModel": "AlbertModel", "AutoModelForMaskedLM": "AlbertForMaskedLM",
        "AutoModelForPreTraining": "AlbertForPreTraining",
        "AutoModelForSequenceClassification": "AlbertForSequenceClassification",
        "AutoModelForTokenClassification": "AlbertForTokenClassification",
        "AutoModelForQuestionAnswering": "AlbertForQuestionAnswering"}),
    "electra": ("ElectraConfig", {
        "AutoModel": "ElectraModel", "AutoModelForMaskedLM": "ElectraForMaskedLM",
        "AutoModelForPreTraining": "ElectraForPreTraining",
        "AutoModelForSequenceClassification": "ElectraForSequenceClassification",
        "AutoModelForTokenClassification": "ElectraForTokenClassification",
        "AutoModelForQuestionAnswering": "ElectraForQuestionAnswering"}),
    "deberta-v2": ("DebertaV2Config", {
        "AutoModel": "DebertaV2Model", "AutoModelForMaskedLM": "DebertaV2ForMaskedLM",
        "AutoModelForSequenceClassification": "DebertaV2ForSequenceClassification",
        "AutoModelForTokenClassification": "DebertaV2ForTokenClassification",
        "AutoModelForQuestionAnswering": "DebertaV2ForQuestionAnswering"}),
    "modernbert": ("ModernBertConfig", {
        "AutoModel": "ModernBertModel", "AutoModelForMaskedLM": "ModernBertForMaskedLM",
        "AutoModelForSequenceClassification": "ModernBertForSequenceClassification",
        "AutoModelForTokenClassification": "ModernBertForTokenClassification",
        "AutoModelForQuestionAnswering": "ModernBertForQuestionAnswering"}),
}
# Shapes that exercise what the family adds: the position offset (max_position_embeddings = T + 2), an
# untied decoder, a non-GELU hidden_act (the LM head stays exact GELU), RoBERTa's layer_norm_eps, a
# second segment embedding, the classifier's own dropout setting.
SHAPES = {
    "base": dict(vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
                 max_position_embeddings=18, type_vocab_size=1, layer_norm_eps=1e-5),
    "untied-relu": dict(vocab_size=90, hidden_size=24, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=40, max_position_embeddings=34, type_vocab_size=2, hidden_act="relu",
                        tie_word_embeddings=False, classifier_dropout=0.3, pad_token_id=1),
}
# DistilBERT's own names for its shapes: learned positions with GELU, and fixed sinusoidal ones with ReLU.
DISTILBERT_SHAPES = {
    "base": dict(vocab_size=120, dim=32, n_layers=2, n_heads=4, hidden_dim=37, max_position_embeddings=18),
    "untied-relu": dict(vocab_size=90, dim=24, n_layers=1, n_heads=2, hidden_dim=40, max_position_embeddings=34,
                        activation="relu", tie_word_embeddings=False, sinusoidal_pos_embds=True,
                        seq_classif_dropout=0.3, qa_dropout=0.2, pad_token_id=1),
}
# ALBERT: embeddings narrower than the hidden size, then equal (its projection is there either way); two groups
# of two blocks shared by five layers (layer i runs group int(i / 2.5)), then one block run three times.
ALBERT_SHAPES = {
    "base": dict(SHAPES["base"], embedding_size=16, num_hidden_layers=5, num_hidden_groups=2, inner_group_num=2,
                 classifier_dropout_prob=0.2),
    "untied-relu": dict(SHAPES["untied-relu"], embedding_size=24, num_hidden_layers=3, hidden_act="gelu_new",
                        classifier_dropout_prob=0.3),
}
# ELECTRA: the embeddings projection (16 -> 32), then none (24 = 24).
ELECTRA_SHAPES = {
    "base": dict(SHAPES["base"], embedding_size=16),
    "untied-relu": dict(SHAPES["untied-relu"], embedding_size=24),
}
# DeBERTa: DeBERTa-v3's settings with 4 position buckets, so the 16-token rows reach the log-spaced ones
# (shared keys, both terms as v3's "p2c|c2p" string, normalised distance table, no absolute positions, no
# segments); then 64 buckets (every distance exact), separate position projections for c2p alone,
# absolute positions, two segments, embeddings projected 16 -> 24 with the legacy head's dense to 16,
# and the convolution after the first layer.
DEBERTA_SHAPES = {
    "base": dict(SHAPES["base"], type_vocab_size=0, relative_attention=True, position_buckets=4,
                 max_relative_positions=12, pos_att_type="p2c|c2p", share_att_key=True, norm_rel_ebd="layer_norm",
                 position_biased_input=False, layer_norm_eps=1e-7),
    "untied-relu": dict(SHAPES["untied-relu"], relative_attention=True, position_buckets=64, pos_att_type=["c2p"],
                        embedding_size=16, conv_kernel_size=3, conv_act="gelu", cls_dropout=0.3, pooler_dropout=0.1,
                        pooler_hidden_act="tanh"),
}
# ModernBERT: three layers, global then two local ones that see 1 token either side (the 16-token rows run
# on the windowed path), first-token pooling, no biases; then every layer global, every bias on, an untied
# decoder without its bias, ReLU in the feed-forward and SiLU in the heads, mean pooling, other rotary bases.
MODERNBERT_IDS = dict(pad_token_id=0, bos_token_id=1, cls_token_id=1, eos_token_id=2, sep_token_id=2)
MODERNBERT_SHAPES = {
    "base": dict(vocab_size=120, hidden_size=32, num_hidden_layers=3, num_attention_heads=4, intermediate_size=37,
                 max_position_embeddings=18, local_attention=2, global_attn_every_n_layers=3, **MODERNBERT_IDS),
    "untied-relu": dict(vocab_size=90, hidden_size=24, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=40, max_position_embeddings=34, hidden_activation="relu",
                        tie_word_embeddings=False, classifier_dropout=0.3, global_attn_every_n_layers=1,
                        norm_bias=True, attention_bias=True, mlp_bias=True, classifier_bias=True, decoder_bias=False,
                        classifier_pooling="mean", classifier_activation="silu", global_rope_theta=5000.0,
                        local_rope_theta=300.0, norm_eps=1e-6, **MODERNBERT_IDS),
}
SHAPES_OF = {"distilbert": DISTILBERT_SHAPES, "albert": ALBERT_SHAPES, "electra": ELECTRA_SHAPES,
             "deberta-v2": DEBERTA_SHAPES, "modernbert": MODERNBERT_SHAPES}
T = 16  # the longest row: max_position_embeddings - 2 for the "base" shape


def batch(config, seed: int = 1):
    """Right-padded rows of real ids (never the padding id) with `pad_token_id` at padding."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, config.vocab_size, (3, T), generator=g)
    ids = ids.masked_fill(ids == config.pad_token_id, config.pad_token_id + 1)  # a padding id of 3 or more
    mask = torch.ones_like(ids)
    mask[1, 11:] = 0
    mask[2, 5:] = 0
    ids = ids.masked_fill(mask == 0, config.pad_token_id)
    if not hasattr(config, "type_vocab_size"):  # DistilBERT takes no token_type_ids
        return {"input_ids": ids, "attention_mask": mask}
    types = torch.zeros_like(ids)
    if config.type_vocab_size > 1:
        types[:, 7:] = 1
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}


def comparable(out) -> dict[str, torch.Tensor]:
    got = {name: getattr(out, name, None) for name in ("last_hidden_state", "pooler_output", "logits", "start_logits",
                                                        "end_logits", "prediction_logits", "sop_logits") if isinstance(getattr(out, name, None), torch.Tensor)}
    got["hidden_states"] = torch.stack(out.hidden_states)
    return got


def assert_same(ours, theirs, mask: torch.Tensor) -> None:
    a, b = comparable(ours), comparable(theirs)
    shared = set(a) & set(b)
    assert len(shared) >= 2 and "hidden_states" in shared and set(b) <= set(a), (sorted(a), sorted(b))
    real = mask.bool()
    for key in shared:
        x, y = a[key], b[key]
        if key == "hidden_states":
            x, y = x[:, real], y[:, real]
        elif x.dim() >= 2 and x.shape[:2] == real.shape:
            x, y = x[real], y[real]
        torch.testing.assert_close(x, y, atol=1e-5, rtol=0, msg=lambda m: f"{key}: {m}")


CASES = [(family, auto, shape) for family, (_, heads) in FAMILIES.items() for auto in heads for shape in SHAPES]


@pytest.mark.parametrize("family, auto, shape", CASES)
def test_both_ways(tmp_path, family, auto, shape):
    labels = 2 if auto == "AutoModelForQuestionAnswering" else 3
    sizes = SHAPES_OF.get(family, SHAPES)[shape]
    assert_both_ways(tmp_path, family, auto, {k: v for k, v in sizes.items()
                                              if k != "classifier_dropout" or family != "deberta-v2"}, num_labels=labels)


def assert_both_ways(tmp_path, family: str, auto: str, fields: dict, **extra) -> None:
    """A perturbed random transformers model of `fields` loads into bertforge's `auto` class without a missing
    or unused tensor and gives its numbers at real tokens; bertforge's save loads back into transformers the same."""
    config_name, heads = FAMILIES[family]
    config = getattr(transformers, config_name)(**fields, **extra)
    torch.manual_seed(0)
    hf_model = perturbed(getattr(transformers, heads[auto])(config))
    hf_model.save_pretrained(tmp_path / "hf")
    inputs = batch(config)

    ours = getattr(bertforge, auto).from_pretrained(tmp_path / "hf")
    assert type(ours).__name__ == heads[auto] and ours.config.model_type == family
    assert ours.load_report.missing_keys == [] and ours.load_report.unexpected_keys == []
    with torch.no_grad():
        mine = ours(**inputs, output_hidden_states=True)
        theirs = hf_model(**inputs, output_hidden_states=True)
    assert_same(mine, theirs, inputs["attention_mask"])

    ours.save_pretrained(tmp_path / "ours")
    back, info = getattr(transformers, heads[auto]).from_pretrained(tmp_path / "ours", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    with torch.no_grad():
        again = back.eval()(**inputs, output_hidden_states=True)
    assert_same(mine, again, inputs["attention_mask"])


def test_padding_changes_no_real_token():
    """A row's outputs do not depend on the padding after it, on the unpadded path or the masked one."""
    from bertforge.models.roberta import RobertaConfig, RobertaModel

    torch.manual_seed(0)
    model = perturbed(RobertaModel(RobertaConfig(**SHAPES["base"])))
    row = torch.randint(3, 120, (1, 6))
    alone = model(row).last_hidden_state
    padded = torch.cat([row, torch.full((1, 5), 1)], dim=1)
    mask = (padded != 1).long()
    for unpad in (True, False):
        model.unpad = unpad
        out = model(padded, attention_mask=mask).last_hidden_state[:, :6]
        torch.testing.assert_close(out, alone, atol=1e-6, rtol=0)


def test_a_longer_row_than_the_positions_allow_is_refused():
    from bertforge.errors import InputError
    from bertforge.models.roberta import RobertaConfig, RobertaModel

    model = RobertaModel(RobertaConfig(**SHAPES["base"]))
    with pytest.raises(InputError, match=r"exceeds max_position_embeddings \(18\) less the 2 .*max_length=16"):
        model(torch.full((1, T + 1), 5))


def test_distilbert_builds_and_freezes_sinusoidal_positions():
    """A new DistilBERT with `sinusoidal_pos_embds` has transformers' fixed table, which training leaves alone."""
    from bertforge.models.distilbert import DistilBertConfig, DistilBertForMaskedLM

    ours = DistilBertForMaskedLM(DistilBertConfig(vocab_size=50, hidden_size=24, num_hidden_layers=1,
                                                  num_attention_heads=2, intermediate_size=30,
                                                  max_position_embeddings=40, sinusoidal_pos_embds=True))
    theirs = transformers.DistilBertForMaskedLM(transformers.DistilBertConfig(
        vocab_size=50, dim=24, n_layers=1, n_heads=2, hidden_dim=30, max_position_embeddings=40,
        sinusoidal_pos_embds=True))
    table = ours.distilbert.embeddings.position.weight
    torch.testing.assert_close(table, theirs.distilbert.embeddings.position_embeddings.weight, atol=1e-6, rtol=0)
    assert not table.requires_grad and table[3].abs().sum() > 0


def test_distilbert_config_round_trips_with_transformers_names(tmp_path):
    config = transformers.DistilBertConfig(vocab_size=77, dim=48, n_layers=3, n_heads=6, hidden_dim=50,
                                           activation="relu", dropout=0.05, attention_dropout=0.15, qa_dropout=0.3,
                                           seq_classif_dropout=0.25, sinusoidal_pos_embds=True)
    config.save_pretrained(tmp_path)
    ours = bertforge.AutoConfig.from_pretrained(tmp_path)
    assert (ours.hidden_size, ours.num_hidden_layers, ours.num_attention_heads, ours.intermediate_size) == (48, 3, 6, 50)
    assert (ours.hidden_act, ours.hidden_dropout_prob, ours.attention_probs_dropout_prob) == ("relu", 0.05, 0.15)
    written = ours.to_dict()
    for key in ("dim", "n_layers", "n_heads", "hidden_dim", "activation", "dropout", "attention_dropout",
                "qa_dropout", "seq_classif_dropout", "sinusoidal_pos_embds"):
        assert written[key] == getattr(config, key), key
    assert not {"hidden_size", "type_vocab_size", "layer_norm_eps", "hidden_act"} & set(written)


def test_distilbert_tokenizer_sends_no_segments(tmp_path):
    tok = bertforge.Tokenizer.train(texts=["a good film", "a bad film"] * 20, vocab_size=60, min_frequency=1)
    tok.save(tmp_path)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config | {"tokenizer_class": "DistilBertTokenizer"}))
    ours = bertforge.AutoTokenizer.from_pretrained(tmp_path)
    theirs = transformers.AutoTokenizer.from_pretrained(tmp_path)
    assert dict(ours("a good film", "a bad film")) == dict(theirs("a good film", "a bad film"))
    ours.save(tmp_path / "again")
    assert json.loads((tmp_path / "again" / "tokenizer_config.json").read_text())["tokenizer_class"] == "DistilBertTokenizer"


def test_albert_config_round_trips_with_transformers_names(tmp_path):
    config = transformers.AlbertConfig(vocab_size=77, embedding_size=20, hidden_size=48, num_hidden_layers=4,
                                       num_attention_heads=6, intermediate_size=50, num_hidden_groups=2,
                                       inner_group_num=3, classifier_dropout_prob=0.25)
    config.save_pretrained(tmp_path)
    ours = bertforge.AutoConfig.from_pretrained(tmp_path)
    assert type(ours).__name__ == "AlbertConfig" and ours.classifier_dropout == 0.25
    assert (ours.embedding_size, ours.num_hidden_groups, ours.inner_group_num, ours.hidden_act) == (20, 2, 3, "gelu_new")
    written = ours.to_dict()
    assert written["classifier_dropout_prob"] == 0.25 and "classifier_dropout" not in written
    ours.save(tmp_path / "config.json")
    again = transformers.AutoConfig.from_pretrained(tmp_path)
    for key in ("embedding_size", "num_hidden_groups", "inner_group_num", "classifier_dropout_prob", "hidden_act"):
        assert getattr(again, key) == getattr(config, key), key
    with pytest.raises(bertforge.ConfigError, match="'num_hidden_groups' must be a positive integer"):
        bertforge.AlbertConfig(num_hidden_groups=0)


def test_electra_summary_keys_change_nothing_and_stay_quiet(tmp_path, caplog):
    import logging

    transformers.ElectraConfig(vocab_size=50, summary_type="mean", summary_use_proj=False).save_pretrained(tmp_path)
    with caplog.at_level(logging.WARNING, logger="bertforge"):
        ours = bertforge.AutoConfig.from_pretrained(tmp_path)
    assert "summary" not in caplog.text and ours.to_dict()["summary_type"] == "mean"
