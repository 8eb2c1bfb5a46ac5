"""Invariants of the model itself: the NumPy oracle, padding invariance, SDPA vs explicit
attention, masked-only MLM logits, initialisation, presets and configs."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bertforge import (PRESETS, BertConfig, BertForMaskedLM, BertForPreTraining, BertForSequenceClassification,
                       BertModel, ConfigError)
from bertforge.interop.hf import to_hf_state_dict
from numpy_ref import bert_forward

from conftest import TINY


def ragged_batch(vocab: int = TINY["vocab_size"], lengths=(13, 9, 4, 1)):
    T = max(lengths)
    ids = torch.randint(5, vocab, (len(lengths), T))
    mask = (torch.arange(T)[None] < torch.tensor(lengths)[:, None]).long()
    types = (torch.arange(T)[None] >= torch.tensor(lengths)[:, None] // 2).long() * mask
    return ids.masked_fill(mask == 0, 0), types, mask


def test_numpy_oracle_equals_torch():
    model = BertModel(BertConfig(**TINY)).eval()
    ids, types, mask = ragged_batch()
    with torch.no_grad():
        out = model(ids, types, mask)
    weights = {k: v.numpy() for k, v in to_hf_state_dict(model).items()}
    hidden, pooled = bert_forward(weights, model.config, ids.numpy(), types.numpy(), mask.numpy())
    real = mask.bool().numpy()
    np.testing.assert_allclose(out.last_hidden_state.numpy()[real], hidden[real], atol=1e-5, rtol=0)
    np.testing.assert_allclose(out.pooler_output.numpy(), pooled, atol=1e-5, rtol=0)


def test_padding_invariance():
    """A sentence alone and inside a padded batch gives the same hidden states on its real tokens."""
    model = BertModel(BertConfig(**TINY)).eval()
    ids, types, mask = ragged_batch()
    with torch.no_grad():
        batched = model(ids, types, mask).last_hidden_state
        for row, n in enumerate(mask.sum(1).tolist()):
            alone = model(ids[row:row + 1, :n], types[row:row + 1, :n]).last_hidden_state[0]
            torch.testing.assert_close(batched[row, :n], alone, atol=1e-5, rtol=0)


@pytest.mark.parametrize("padded", [True, False])
def test_sdpa_equals_explicit_attention(padded):
    model = BertModel(BertConfig(**TINY)).eval()
    ids, types, mask = ragged_batch() if padded else ragged_batch(lengths=(7, 7))
    with torch.no_grad():
        fast = model(ids, types, mask)
        slow = model(ids, types, mask, output_attentions=True)
    real = mask.bool()  # padding positions hold no meaning (zeros on the unpadded path)
    torch.testing.assert_close(fast.last_hidden_state[real], slow.last_hidden_state[real], atol=1e-5, rtol=0)
    probs = torch.stack(slow.attentions)  # (L, B, nh, T, T)
    assert probs.shape == (TINY["num_hidden_layers"], ids.shape[0], TINY["num_attention_heads"], ids.shape[1], ids.shape[1])
    torch.testing.assert_close(probs.sum(-1), torch.ones(probs.shape[:-1]))
    if padded:  # no query may attend to a padding key
        key_is_pad = (mask == 0)[None, :, None, None, :].expand_as(probs)
        assert probs[key_is_pad].abs().max() == 0


def test_masked_only_mlm_equals_full_logits_gathered():
    model = BertForMaskedLM(BertConfig(**TINY)).eval()
    ids, types, mask = ragged_batch()
    labels = torch.full_like(ids, -100)
    chosen = (torch.rand(ids.shape) < 0.3) & mask.bool()
    chosen[0, 3] = True
    labels[chosen] = ids[chosen]
    with torch.no_grad():
        full = model(ids, types, mask).logits  # (B, T, V)
        masked = model(ids, types, mask, labels=labels)
    assert masked.logits.shape == (int(chosen.sum()), TINY["vocab_size"])
    torch.testing.assert_close(masked.logits, full[chosen], atol=1e-5, rtol=0)
    expected = torch.nn.functional.cross_entropy(full[chosen], ids[chosen])
    torch.testing.assert_close(masked.loss, expected, atol=1e-6, rtol=0)


def test_mlm_with_no_masked_position_gives_zero_loss_with_grad():
    model = BertForPreTraining(BertConfig(**TINY))
    ids, types, mask = ragged_batch()
    out = model(ids, types, mask, labels=torch.full_like(ids, -100), next_sentence_label=torch.zeros(4, dtype=torch.long))
    assert out.mlm_loss.item() == 0.0 and torch.isfinite(out.loss)
    out.loss.backward()
    assert model.nsp.weight.grad is not None


def test_decoder_is_tied_to_word_embeddings():
    model = BertForPreTraining(BertConfig(**TINY))
    ids, types, mask = ragged_batch()
    labels = ids.masked_fill(mask == 0, -100)
    model(ids, types, mask, labels=labels).loss.backward()
    grad = model.bert.embeddings.word.weight.grad
    # Tokens that never appear as inputs still get gradient, through the tied decoder.
    unseen = torch.ones(TINY["vocab_size"], dtype=torch.bool)
    unseen[ids.unique()] = False
    assert grad[unseen].abs().sum() > 0


def test_initialisation_follows_bert():
    config = BertConfig.from_preset("mini", vocab_size=3000)
    model = BertForPreTraining(config)
    w = model.bert.layers[0].ffn.up.weight
    assert abs(w.std().item() - config.initializer_range) < 0.002 and abs(w.mean().item()) < 0.002
    assert model.bert.layers[0].ffn.up.bias.abs().max() == 0
    assert (model.bert.layers[0].attention_norm.weight == 1).all() and (model.bert.embeddings.norm.bias == 0).all()
    assert (model.bert.embeddings.word.weight[config.pad_token_id] == 0).all()
    assert (model.mlm.bias == 0).all()


@pytest.mark.parametrize("name", list(PRESETS))
def test_presets(name):
    layers, hidden = PRESETS[name]
    c = BertConfig.from_preset(name)
    assert (c.num_hidden_layers, c.hidden_size, c.num_attention_heads, c.intermediate_size) == (
        layers, hidden, hidden // 64, 4 * hidden)


def test_base_preset_has_bert_base_parameter_count():
    # bert-base-uncased: 109,482,240 parameters in BertModel (with pooler).
    with torch.device("meta"):
        model = BertModel(BertConfig.from_preset("base"))
    assert model.num_parameters() == 109_482_240


def test_any_layers_by_hidden_combination():
    c = BertConfig.from_preset("L3-H192")
    assert (c.num_hidden_layers, c.hidden_size, c.num_attention_heads) == (3, 192, 3)
    with pytest.raises(ConfigError, match=r"huge: no such checkpoint directory, and not a model preset \(tiny"):
        BertConfig.from_preset("huge")


def test_config_json_round_trip(tmp_path):
    c = BertConfig(**TINY, id2label={0: "neg", 1: "pos"}, extra={"gradient_checkpointing": False})
    c.save(tmp_path / "config.json", architectures=["BertForSequenceClassification"])
    back = BertConfig.from_json(tmp_path / "config.json")
    assert back == c and back.num_labels == 2 and back.label2id == {"neg": 0, "pos": 1}


def test_config_errors():
    with pytest.raises(ConfigError, match="divisible"):
        BertConfig(hidden_size=100, num_attention_heads=3)
    with pytest.raises(ConfigError, match="hidden_act"):
        BertConfig(hidden_act="swishy")
    with pytest.raises(ConfigError, match="position_embedding_type"):
        BertConfig.from_dict({"position_embedding_type": "relative_key"})


def test_sequence_classification_losses():
    ids, types, mask = ragged_batch()
    reg = BertForSequenceClassification(BertConfig(**TINY, num_labels=1))
    target = torch.tensor([0.5, 1.0, 2.0, 3.0])
    out = reg(ids, types, mask, labels=target)
    torch.testing.assert_close(out.loss, torch.nn.functional.mse_loss(out.logits.squeeze(-1), target))
    multi = BertForSequenceClassification(BertConfig(**TINY, num_labels=3, problem_type="multi_label_classification"))
    y = torch.tensor([[1.0, 0, 1], [0, 0, 0], [1, 1, 1], [0, 1, 0]])
    out = multi(ids, types, mask, labels=y)
    torch.testing.assert_close(out.loss, torch.nn.functional.binary_cross_entropy_with_logits(out.logits, y))


def test_training_step_reduces_loss():
    """A few AdamW steps on one batch must lower the loss: gradients reach every parameter."""
    model = BertForPreTraining(BertConfig(**TINY, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0))
    ids, types, mask = ragged_batch()
    labels = ids.masked_fill(mask == 0, -100)
    nsp = torch.tensor([0, 1, 0, 1])
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    first = None
    for _ in range(30):
        loss = model(ids, types, mask, labels=labels, next_sentence_label=nsp).loss
        first = first if first is not None else loss.item()
        opt.zero_grad()
        loss.backward()
        if _ == 0:
            no_grad = [n for n, p in model.named_parameters() if p.grad is None]
            assert no_grad == [], no_grad
        opt.step()
    assert loss.item() < first * 0.5


def test_unpadded_equals_padded_forward_and_backward():
    """The default unpadded path (real tokens only) gives the padded path's outputs and gradients."""
    config = BertConfig(**TINY, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    fast = BertForPreTraining(config)
    slow = BertForPreTraining(config)
    slow.load_state_dict(fast.state_dict())
    slow.bert.unpad = False
    ids, types, mask = ragged_batch()
    labels = ids.masked_fill(mask == 0, -100)
    nsp = torch.tensor([0, 1, 1, 0])
    outs = []
    for model in (fast, slow):
        out = model(ids, types, mask, labels=labels, next_sentence_label=nsp, output_hidden_states=True)
        out.loss.backward()
        outs.append(out)
    real = mask.bool()
    for a, b in zip(outs[0].hidden_states, outs[1].hidden_states):
        torch.testing.assert_close(a[real], b[real], atol=1e-5, rtol=0)
    assert (outs[0].hidden_states[-1][~real] == 0).all()  # padding restored as zeros
    torch.testing.assert_close(outs[0].loss, outs[1].loss, atol=1e-6, rtol=0)
    torch.testing.assert_close(outs[0].nsp_logits, outs[1].nsp_logits, atol=1e-5, rtol=0)
    for (name, p), q in zip(fast.named_parameters(), slow.parameters()):
        torch.testing.assert_close(p.grad, q.grad, atol=1e-5, rtol=0, msg=lambda m: f"{name}: {m}")


def test_packing_helpers_round_trip():
    from bertforge.models.padding import pad, packing, unpad

    _, _, mask = ragged_batch()
    x = torch.randn(*mask.shape, 5)
    p = packing(mask)
    assert p.cu_seqlens.tolist() == [0, 13, 22, 26, 27]
    packed = unpad(x, p)
    assert packed.shape == (27, 5)
    restored = pad(packed, p)
    torch.testing.assert_close(restored[mask.bool()], x[mask.bool()])
    assert (restored[~mask.bool()] == 0).all()
    torch.testing.assert_close(packed[p.first_tokens], x[:, 0])


def test_head_registry_describes_every_head():
    """Each registry entry names a transformers class and outputs its model really returns."""
    transformers = pytest.importorskip("transformers")
    from bertforge.inference.predict import TASKS as PREDICT_TASKS
    from bertforge.models.registry import HEADS, TASK_ARCHITECTURES, family

    ids = torch.randint(5, TINY["vocab_size"], (2, 7))
    for name, info in HEADS.items():
        assert info.cls.hf_architecture == name and hasattr(transformers, name)
        pad = 1 if info.cls.model_type == "mpnet" else 0  # MPNet honours only its padding id 1
        out = info.cls(family(info.cls.model_type).config(**TINY, pad_token_id=pad)).eval()(ids)
        for output in info.outputs:
            assert getattr(out, output, None) is not None, (name, output)
    assert set(TASK_ARCHITECTURES) - {"regress"} <= set(PREDICT_TASKS)
    assert TASK_ARCHITECTURES["fill-mask"] == ("BertForMaskedLM", "BertForPreTraining", "RobertaForMaskedLM",
                                               "XLMRobertaForMaskedLM", "DistilBertForMaskedLM", "AlbertForMaskedLM",
                                               "AlbertForPreTraining", "ElectraForMaskedLM", "DebertaV2ForMaskedLM",
                                               "ModernBertForMaskedLM", "MPNetForMaskedLM",
                                               "CamembertForMaskedLM", "GteForMaskedLM", "NomicBertForMaskedLM")
