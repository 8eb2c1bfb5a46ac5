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
from family_utils import FAMILIES, SHAPES, SHAPES_OF, T, assert_both_ways  # noqa: E402


CASES = [(family, auto, shape) for family, (_, heads) in FAMILIES.items() for auto in heads for shape in SHAPES]


@pytest.mark.parametrize("family, auto, shape", CASES)
def test_both_ways(tmp_path, family, auto, shape):
    labels = 2 if auto == "AutoModelForQuestionAnswering" else 3
    sizes = SHAPES_OF.get(family, SHAPES)[shape]
    assert_both_ways(tmp_path, family, auto, {k: v for k, v in sizes.items()
                                              if k != "classifier_dropout" or family != "deberta-v2"}, num_labels=labels)


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
