"""DeBERTa-v2/v3 beyond the both-ways parity of tests/test_family_parity.py: the current (non-legacy)
masked-LM head, the padded and attention-map paths with relative positions and the convolution,
the relative-position buckets, and every config field honoured or refused."""

from __future__ import annotations

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")

import bertforge  # noqa: E402
from bertforge.errors import ConfigError  # noqa: E402
from bertforge.models.deberta_v2 import DebertaV2Config, log_buckets  # noqa: E402

from conftest import perturbed  # noqa: E402
from family_utils import DEBERTA_SHAPES, batch  # noqa: E402


def saved(tmp_path, cls: str, **config):
    torch.manual_seed(0)
    model = perturbed(getattr(transformers, cls)(transformers.DebertaV2Config(**config))).eval()
    model.save_pretrained(tmp_path / "hf")
    return model


def test_current_masked_lm_head_both_ways(tmp_path):
    """`legacy: false`: transformers' `lm_predictions.lm_head` names, the decoder the word embeddings."""
    theirs = saved(tmp_path, "DebertaV2ForMaskedLM", **DEBERTA_SHAPES["base"], legacy=False)
    ours = bertforge.AutoModelForMaskedLM.from_pretrained(tmp_path / "hf")
    assert ours.load_report.missing_keys == [] and ours.load_report.unexpected_keys == []
    inputs = batch(theirs.config)
    real = inputs["attention_mask"].bool()
    with torch.no_grad():
        torch.testing.assert_close(ours(**inputs).logits[real], theirs(**inputs).logits[real], atol=1e-5, rtol=0)
    ours.save_pretrained(tmp_path / "ours")
    back, info = transformers.DebertaV2ForMaskedLM.from_pretrained(tmp_path / "ours", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    assert back.config.legacy is False
    with torch.no_grad():
        torch.testing.assert_close(back.eval()(**inputs).logits[real], theirs(**inputs).logits[real], atol=1e-5, rtol=0)


@pytest.mark.parametrize("shape", ["base", "untied-relu"])
def test_padded_path_and_attention_maps_equal_transformers(tmp_path, shape):
    """The masked (padded) path and `output_attentions` give transformers' numbers at real tokens too,
    relative positions and the convolution included, and the same as the unpadded path."""
    theirs = saved(tmp_path, "DebertaV2Model", **DEBERTA_SHAPES[shape])
    ours = bertforge.AutoModel.from_pretrained(tmp_path / "hf")
    inputs = batch(theirs.config)
    real = inputs["attention_mask"].bool()
    with torch.no_grad():
        reference = theirs(**inputs, output_attentions=True)
        unpadded = ours(**inputs).last_hidden_state
        maps = ours(**inputs, output_attentions=True)
        ours.unpad = False
        padded = ours(**inputs).last_hidden_state
    for got in (unpadded, maps.last_hidden_state, padded):
        torch.testing.assert_close(got[real], reference.last_hidden_state[real], atol=1e-5, rtol=0)
    for a, b in zip(maps.attentions, reference.attentions):
        rows = real[:, None, :, None] & real[:, None, None, :]  # real queries against real keys
        torch.testing.assert_close(a.masked_fill(~rows, 0), b.masked_fill(~rows, 0), atol=1e-5, rtol=0)


def test_buckets_are_transformers_own():
    from transformers.models.deberta_v2.modeling_deberta_v2 import make_log_bucket_position

    distance = torch.arange(-600, 601)
    for buckets, furthest in ((4, 12), (256, 512), (32, 100), (255, 1024)):
        expected = make_log_bucket_position(distance, buckets, furthest).long()
        assert torch.equal(log_buckets(distance, buckets, furthest), expected), (buckets, furthest)


def test_a_published_v3_config_reads_and_writes_what_transformers_reads(tmp_path):
    """DeBERTa-v3-base's config.json as published (pos_att_type a string, keys transformers reads with getattr)."""
    published = {"model_type": "deberta-v2", "attention_probs_dropout_prob": 0.1, "hidden_act": "gelu",
                 "hidden_dropout_prob": 0.1, "hidden_size": 768, "initializer_range": 0.02, "intermediate_size": 3072,
                 "max_position_embeddings": 512, "relative_attention": True, "position_buckets": 256,
                 "norm_rel_ebd": "layer_norm", "share_att_key": True, "pos_att_type": "p2c|c2p",
                 "layer_norm_eps": 1e-7, "max_relative_positions": -1, "position_biased_input": False,
                 "num_attention_heads": 12, "num_hidden_layers": 12, "type_vocab_size": 0, "vocab_size": 128100}
    (tmp_path / "config.json").write_text(json.dumps(published))
    ours = bertforge.AutoConfig.from_pretrained(tmp_path)
    assert isinstance(ours, DebertaV2Config) and ours.pos_att_type == ["p2c", "c2p"]
    assert (ours.relative_span, ours.max_distance, ours.embedding_size) == (256, 512, 768)
    ours.save(tmp_path / "again.json")
    (tmp_path / "back").mkdir()
    (tmp_path / "again.json").rename(tmp_path / "back" / "config.json")
    theirs = transformers.AutoConfig.from_pretrained(tmp_path / "back")
    for key, value in published.items():
        expected = ["p2c", "c2p"] if key == "pos_att_type" else value
        assert getattr(theirs, key) == expected, key


@pytest.mark.parametrize("change, message", [
    ({"pos_att_type": "c2p|p2p"}, "pos_att_type' holds \\['p2p'\\]"),
    ({"conv_kernel_size": 4}, "'conv_kernel_size' must be 0 or odd"),
    ({"conv_kernel_size": 3, "conv_groups": 5}, "'conv_groups' \\(5\\) must divide"),
    ({"norm_rel_ebd": "rms_norm"}, "'norm_rel_ebd' is 'rms_norm'"),
    ({"pooler_hidden_size": 64}, "'pooler_hidden_size' \\(64\\) must equal 'hidden_size'"),
    ({"attention_head_size": 16}, "'attention_head_size' is 16"),
    ({"legacy": False, "embedding_size": 16}, "'embedding_size' must then equal 'hidden_size'"),
    ({"conv_act": "swiglu"}, "'conv_act' is 'swiglu'"),
    ({"share_att_key": "yes"}, "'share_att_key' must be true or false"),
])
def test_settings_it_cannot_honour_are_refused(tmp_path, change, message):
    config = {"model_type": "deberta-v2", "hidden_size": 32, "num_attention_heads": 4, "intermediate_size": 40,
              "num_hidden_layers": 1, "vocab_size": 50, **change}
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match=message):
        bertforge.AutoConfig.from_pretrained(tmp_path)


def test_preset_is_shaped_as_v3_and_transformers_builds_it(tmp_path):
    config = DebertaV2Config.from_preset("tiny", vocab_size=100)
    assert (config.relative_attention, config.position_buckets, config.share_att_key, config.type_vocab_size) == \
        (True, 256, True, 0)
    model = bertforge.DebertaV2ForMaskedLM(config)
    model.save_pretrained(tmp_path)
    theirs, info = transformers.AutoModelForMaskedLM.from_pretrained(tmp_path, output_loading_info=True)
    assert type(theirs).__name__ == "DebertaV2ForMaskedLM" and not info["missing_keys"] and not info["unexpected_keys"]


def test_the_bare_backbone_exports_to_onnx(tmp_path):
    """A backbone that never has a pooler (DeBERTa's, ELECTRA's) exports with its one output, and ONNX Runtime
    gives eager PyTorch's numbers on shapes other than the export's."""
    pytest.importorskip("onnxruntime")
    from bertforge.inference.backends import load

    torch.manual_seed(0)
    shape = DEBERTA_SHAPES["base"] | {"pos_att_type": ["p2c", "c2p"], "max_position_embeddings": 64}
    model = perturbed(bertforge.DebertaV2Model(DebertaV2Config(**shape)))
    onnx = load(model, "onnx")
    inputs = batch(model.config, seed=3)
    with torch.no_grad():
        expected = model(**inputs).last_hidden_state
    got = onnx(**inputs).last_hidden_state
    real = inputs["attention_mask"].bool()
    torch.testing.assert_close(got[real], expected[real], atol=1e-4, rtol=0)
