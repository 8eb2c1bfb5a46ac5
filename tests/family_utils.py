"""The family's tiny test models: each architecture's transformers classes, heads and shapes, a batch for a config,
and the both-ways check (transformers -> bertforge -> transformers) every family test shares."""

from __future__ import annotations

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
    "camembert": ("CamembertConfig", {
        "AutoModel": "CamembertModel", "AutoModelForMaskedLM": "CamembertForMaskedLM",
        "AutoModelForSequenceClassification": "CamembertForSequenceClassification",
        "AutoModelForTokenClassification": "CamembertForTokenClassification",
        "AutoModelForQuestionAnswering": "CamembertForQuestionAnswering"}),
    "mpnet": ("MPNetConfig", {
        "AutoModel": "MPNetModel", "AutoModelForMaskedLM": "MPNetForMaskedLM",
        "AutoModelForSequenceClassification": "MPNetForSequenceClassification",
        "AutoModelForTokenClassification": "MPNetForTokenClassification",
        "AutoModelForQuestionAnswering": "MPNetForQuestionAnswering"}),
    "gte": ("GteConfig", {
        "AutoModel": "GteModel", "AutoModelForMaskedLM": "GteForMaskedLM",
        "AutoModelForSequenceClassification": "GteForSequenceClassification",
        "AutoModelForTokenClassification": "GteForTokenClassification"}),
    "nomic_bert": ("NomicBertConfig", {
        "AutoModel": "NomicBertModel", "AutoModelForMaskedLM": "NomicBertForMaskedLM",
        "AutoModelForSequenceClassification": "NomicBertForSequenceClassification",
        "AutoModelForTokenClassification": "NomicBertForTokenClassification"}),
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


# MPNet: no segments; the 16-token rows reach the log-spaced buckets (the exact ones end at 8; test_family_mpnet.py
# runs rows past the 128 the buckets reach); then an untied decoder, ReLU, and a 40-row bias table of which
# transformers uses the first 32.
MPNET_SHAPES = {
    "base": {k: v for k, v in SHAPES["base"].items() if k != "type_vocab_size"},
    "untied-relu": {**{k: v for k, v in SHAPES["untied-relu"].items() if k not in ("type_vocab_size", "classifier_dropout")},
                    "relative_attention_num_buckets": 40},
}


# GTE: gte-base-en-v1.5's shape (no segments, rotary base 160,000 by default) with padding id 0; then one segment
# row as the multilingual checkpoints, an untied decoder, ReLU in the gated feed-forward (the LM head stays exact
# GELU) and another rotary base in the older top-level form.
GTE_SHAPES = {
    "base": {**SHAPES["base"], "type_vocab_size": 0, "pad_token_id": 0},
    "untied-relu": {**SHAPES["untied-relu"], "type_vocab_size": 1, "rope_theta": 500.0},
}


# NomicBERT: its default SwiGLU and base 1,000 with two segments; then ReLU, an untied decoder and a base in the older
# top-level form.
NOMIC_SHAPES = {
    "base": {**SHAPES["base"], "type_vocab_size": 2, "hidden_act": "silu", "pad_token_id": 0},
    "untied-relu": {**SHAPES["untied-relu"], "rope_theta": 500.0},
}


SHAPES_OF = {"gte": GTE_SHAPES, "nomic_bert": NOMIC_SHAPES, "mpnet": MPNET_SHAPES, "distilbert": DISTILBERT_SHAPES, "albert": ALBERT_SHAPES, "electra": ELECTRA_SHAPES,
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
