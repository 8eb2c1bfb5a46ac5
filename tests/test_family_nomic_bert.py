"""NomicBERT against transformers and sentence-transformers, past test_family_parity's both-ways check: the layout
transformers writes (fused Wqkv, fc11/fc12/fc2, emb_ln) written back key for key, the rotary base's default and its
older form, `head_dim`, and embed, fill-mask and the fused and ONNX paths on a small random model with a trained
WordPiece tokenizer."""

from __future__ import annotations

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")

import bertforge  # noqa: E402
from bertforge.errors import ConfigError  # noqa: E402

from conftest import corpus, perturbed  # noqa: E402
from family_checks import (assert_backends_agree_with_torch, assert_embeds_as_sentence_transformers,  # noqa: E402
                           assert_fill_mask_as_transformers)

SIZES = dict(vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
             max_position_embeddings=130)
TEXTS = ["a good film", "a bad film , truly", "Héllo wörld 東京", "not good at all [MASK] here"]


def hf_model(path, cls: str = "NomicBertModel", **fields):
    torch.manual_seed(0)
    model = perturbed(getattr(transformers, cls)(transformers.NomicBertConfig(**{**SIZES, **fields})))
    model.save_pretrained(path)
    return model


@pytest.mark.parametrize("cls, auto", [("NomicBertForMaskedLM", "AutoModelForMaskedLM"),
                                       ("NomicBertForSequenceClassification", "AutoModelForSequenceClassification")])
def test_the_written_layout_round_trips_key_for_key(tmp_path, cls, auto):
    from safetensors.torch import load_file

    theirs = hf_model(tmp_path / "hf", cls).eval()
    written = load_file(tmp_path / "hf" / "model.safetensors")
    assert any(".attn.Wqkv." in k for k in written) and any(".mlp.fc12." in k for k in written)
    ours = getattr(bertforge, auto).from_pretrained(tmp_path / "hf")
    assert ours.load_report.missing_keys == [] and ours.load_report.unexpected_keys == []
    ids = torch.randint(3, 120, (2, 100), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        torch.testing.assert_close(ours(ids).logits, theirs(ids).logits, atol=1e-5, rtol=0)
    ours.save_pretrained(tmp_path / "ours")
    again = load_file(tmp_path / "ours" / "model.safetensors")
    assert set(again) == set(written) and all(torch.equal(again[k], written[k]) for k in written)


def test_rotary_base_head_dim_and_defaults(tmp_path):
    from bertforge.models.nomic_bert import NomicBertConfig, NomicBertModel

    hf_model(tmp_path)
    raw = json.loads((tmp_path / "config.json").read_text())
    config = bertforge.AutoConfig.from_pretrained(tmp_path)
    assert type(config).__name__ == "NomicBertConfig" and config.rope_parameters["rope_theta"] == 1000.0
    assert config.hidden_act == "silu" and config.to_dict()["head_dim"] == 8
    older = {k: v for k, v in raw.items() if k != "rope_parameters"}
    assert NomicBertConfig.from_dict({**older, "rope_theta": 50.0}).rope_parameters["rope_theta"] == 50.0
    with pytest.raises(ConfigError, match="'head_dim' is 16; bertforge computes heads of hidden_size / num_attention"):
        NomicBertConfig.from_dict({**raw, "head_dim": 16})
    model = NomicBertModel(config)
    linear = [m for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and ".layers." in f".{n}"]
    assert len(linear) == 2 * 7 and all(m.bias is None for m in linear)


@pytest.fixture(scope="module")
def nomic_dirs(tmp_path_factory):
    from bertforge.tokenization.kinds import train_tokenizer

    root = tmp_path_factory.mktemp("nomic")
    tok = train_tokenizer("wordpiece", "BertTokenizer", texts=lambda: iter(corpus()), vocab_size=400, min_frequency=2)
    out = {}
    for name, cls in (("masked", "NomicBertForMaskedLM"), ("classifier", "NomicBertForSequenceClassification")):
        hf_model(root / name, cls, vocab_size=tok.vocab_size)
        tok.save(root / name)
        out[name] = root / name
    return out


def test_fill_mask_and_embed_as_the_references(nomic_dirs):
    assert_fill_mask_as_transformers(nomic_dirs["masked"], "a good [MASK] .")
    assert_embeds_as_sentence_transformers(nomic_dirs["classifier"], TEXTS)


@pytest.mark.parametrize("backend", ["fused", "onnx"])
def test_backends_agree_with_torch(nomic_dirs, backend):
    assert_backends_agree_with_torch(nomic_dirs["classifier"], TEXTS, backend)
