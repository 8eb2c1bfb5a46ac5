"""Unusual but real family configurations, both ways against transformers: the corners an outside round of
68 configurations tried that the two shapes of tests/test_family_parity.py do not reach. Each is a small
perturbed random model (every parameter, LayerNorms and biases included), loaded here without a missing or
unused tensor, compared at real tokens, saved, and loaded back by transformers without a missing key."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

from family_utils import MODERNBERT_IDS, SHAPES, assert_both_ways  # noqa: E402

EDGES = {
    # ELECTRA's embeddings wider than its hidden size: the projection narrows (48 -> 32).
    "electra-wide-embeddings": ("electra", "AutoModelForMaskedLM", dict(SHAPES["base"], embedding_size=48)),
    # RoBERTa's positions count from pad_token_id + 1, whatever the padding id is.
    "roberta-pad-0": ("roberta", "AutoModel", dict(SHAPES["base"], pad_token_id=0)),
    "roberta-pad-3": ("roberta", "AutoModelForMaskedLM", dict(SHAPES["base"], pad_token_id=3,
                                                             max_position_embeddings=20)),
    # DeBERTa without buckets, distances clamped at 6 on 16-token rows, the position-to-content term alone.
    "deberta-p2c-no-buckets-short": ("deberta-v2", "AutoModel", dict(
        SHAPES["base"], relative_attention=True, position_buckets=-1, max_relative_positions=6, pos_att_type=["p2c"],
        norm_rel_ebd="layer_norm")),
    # DeBERTa with both terms, separate position projections and the convolution, no buckets.
    "deberta-conv-no-buckets": ("deberta-v2", "AutoModelForSequenceClassification", dict(
        SHAPES["base"], relative_attention=True, position_buckets=0, max_relative_positions=10,
        pos_att_type=["c2p", "p2c"], conv_kernel_size=3, conv_act="tanh")),
    # DeBERTa whose config names the distance table's LayerNorm but turns relative attention off: the tensor is
    # unused, yet transformers builds it, so a save must write it (it was dropped: two missing keys there).
    "deberta-norm-without-relative": ("deberta-v2", "AutoModelForMaskedLM", dict(
        SHAPES["base"], relative_attention=False, norm_rel_ebd="layer_norm")),
    # ModernBERT: rows of 16 past a window of 1 token either side, local and global rotary bases that differ,
    # and every bias on.
    "modernbert-window-bases-biases": ("modernbert", "AutoModelForMaskedLM", dict(
        vocab_size=120, hidden_size=32, num_hidden_layers=3, num_attention_heads=4, intermediate_size=37,
        max_position_embeddings=18, local_attention=2, global_attn_every_n_layers=3, global_rope_theta=5000.0,
        local_rope_theta=300.0, norm_bias=True, attention_bias=True, mlp_bias=True, classifier_bias=True,
        decoder_bias=True, **MODERNBERT_IDS)),
}


@pytest.mark.parametrize("name", sorted(EDGES))
def test_edge_configuration_both_ways(tmp_path, name):
    family, auto, fields = EDGES[name]
    assert_both_ways(tmp_path, family, auto, fields, **({"num_labels": 3} if "Classification" in auto else {}))
