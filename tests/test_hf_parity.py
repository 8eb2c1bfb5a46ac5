"""Numerical parity with transformers, both directions, for the backbone and every head.

A tiny random transformers model is built inside the test (no downloads), saved,
loaded by bertforge and compared; then bertforge saves and transformers loads.
"""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

transformers = pytest.importorskip("transformers")

import bertforge  # noqa: E402
from bertforge.models.bert import HF_NAMES  # noqa: E402

from conftest import TINY  # noqa: E402

PAIRS = [  # (bertforge class, transformers class)
    ("BertModel", "BertModel"),
    ("BertForPreTraining", "BertForPreTraining"),
    ("BertForMaskedLM", "BertForMaskedLM"),
    ("BertForNextSentencePrediction", "BertForNextSentencePrediction"),
    ("BertForSequenceClassification", "BertForSequenceClassification"),
    ("BertForTokenClassification", "BertForTokenClassification"),
    ("BertForQuestionAnswering", "BertForQuestionAnswering"),
]


def labels_for(name: str) -> int:
    return 2 if name == "BertForQuestionAnswering" else 3  # QA's output layer is always start/end


def batch(seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, TINY["vocab_size"], (3, 13), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 9:] = 0  # ragged rows: padding must not leak into real tokens
    mask[2, 4:] = 0
    ids = ids.masked_fill(mask == 0, 0)
    types = torch.zeros_like(ids)
    types[:, 6:] = 1
    return ids, types, mask


def outputs(model, ids, types, mask, ours: bool) -> dict[str, torch.Tensor]:
    """The comparable tensors of either library's output, by name."""
    with torch.no_grad():
        if ours:
            out = model(ids, token_type_ids=types, attention_mask=mask, output_hidden_states=True)
        else:
            out = model(input_ids=ids, token_type_ids=types, attention_mask=mask, output_hidden_states=True)
    got = {}
    for name in ("last_hidden_state", "pooler_output", "logits", "prediction_logits", "seq_relationship_logits",
                 "start_logits", "end_logits"):
        value = getattr(out, name, None)
        if isinstance(value, torch.Tensor):
            got[name] = value
    got["hidden_states"] = torch.stack(out.hidden_states)
    return got


def compare(a: dict, b: dict, mask: torch.Tensor) -> None:
    shared_keys = set(a) & set(b)
    assert {"hidden_states"} < shared_keys, (sorted(a), sorted(b))
    for key in shared_keys:
        x, y = a[key], b[key]
        if x.dim() >= 2 and x.shape[:2] == mask.shape:  # per-token tensors: compare real tokens
            x, y = x[mask.bool()], y[mask.bool()]
        elif key == "hidden_states":
            x, y = x[:, mask.bool()], y[:, mask.bool()]
        torch.testing.assert_close(x, y, atol=1e-5, rtol=0, msg=lambda m: f"{key}: {m}")


@pytest.mark.parametrize("ours_name, hf_name", PAIRS)
def test_transformers_to_bertforge(tmp_path, ours_name, hf_name):
    config = transformers.BertConfig(**TINY, num_labels=labels_for(hf_name))
    hf_model = getattr(transformers, hf_name)(config).eval()
    hf_model.save_pretrained(tmp_path)
    ours = getattr(bertforge, ours_name).from_pretrained(tmp_path)
    assert ours.load_report.missing_keys == [], ours.load_report
    assert ours.load_report.unexpected_keys == []
    ids, types, mask = batch()
    compare(outputs(ours, ids, types, mask, True), outputs(hf_model, ids, types, mask, False), mask)


@pytest.mark.parametrize("ours_name, hf_name", PAIRS)
def test_bertforge_to_transformers(tmp_path, ours_name, hf_name):
    ours = getattr(bertforge, ours_name)(bertforge.BertConfig(**TINY, num_labels=labels_for(hf_name))).eval()
    ours.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["model_type"] == "bert" and saved["architectures"] == [hf_name]
    hf_model, info = getattr(transformers, hf_name).from_pretrained(tmp_path, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    ids, types, mask = batch(2)
    compare(outputs(ours, ids, types, mask, True), outputs(hf_model.eval(), ids, types, mask, False), mask)


def test_losses_match_transformers(tmp_path):
    """Same loss for the same labels: MLM (masked positions only) + NSP."""
    config = transformers.BertConfig(**TINY)
    hf_model = transformers.BertForPreTraining(config).eval()
    hf_model.save_pretrained(tmp_path)
    ours = bertforge.BertForPreTraining.from_pretrained(tmp_path)
    ids, types, mask = batch()
    labels = torch.full_like(ids, -100)
    labels[0, 2], labels[1, 5], labels[2, 1] = 7, 11, 42
    nsp = torch.tensor([0, 1, 0])
    with torch.no_grad():
        a = hf_model(input_ids=ids, token_type_ids=types, attention_mask=mask, labels=labels, next_sentence_label=nsp)
        b = ours(ids, types, mask, labels=labels, next_sentence_label=nsp)
    torch.testing.assert_close(b.loss, a.loss, atol=1e-6, rtol=0)
    assert b.logits.shape == (3, TINY["vocab_size"])  # only the 3 labelled positions were projected


def test_qa_loss_matches_transformers_and_leaves_padding_out(tmp_path):
    """Without padding the span loss is transformers'; with padding it is transformers' logits
    scored over real tokens only, and a window's loss no longer depends on its batch-mates' length."""
    config = transformers.BertConfig(**TINY)
    hf_model = transformers.BertForQuestionAnswering(config).eval()
    hf_model.save_pretrained(tmp_path)
    ours = bertforge.BertForQuestionAnswering.from_pretrained(tmp_path).eval()
    ids, types, mask = batch()
    start, end = torch.tensor([3, 0, 2]), torch.tensor([5, 0, 40])  # row 0 answers, row 1 has none, row 2's end is out
    with torch.no_grad():
        a = hf_model(input_ids=ids[0:1], token_type_ids=types[0:1], attention_mask=mask[0:1],
                     start_positions=start[0:1], end_positions=end[0:1])
        b = ours(ids[0:1], types[0:1], mask[0:1], start_positions=start[0:1], end_positions=end[0:1])
        torch.testing.assert_close(b.loss, a.loss, atol=1e-6, rtol=0)  # row 0 has no padding

        theirs = hf_model(input_ids=ids, token_type_ids=types, attention_mask=mask)
        pad = mask == 0
        s = theirs.start_logits.masked_fill(pad, float("-inf"))
        e = theirs.end_logits.masked_fill(pad, float("-inf"))
        T = ids.shape[1]
        expected = (F.cross_entropy(s, start.clamp(0, T), ignore_index=T)
                    + F.cross_entropy(e, end.clamp(0, T), ignore_index=T)) / 2
        got = ours(ids, types, mask, start_positions=start, end_positions=end).loss
        torch.testing.assert_close(got, expected, atol=1e-6, rtol=0)
        alone = ours(ids[1:2, :9], types[1:2, :9], mask[1:2, :9], start_positions=start[1:2], end_positions=end[1:2])
        in_batch = ours(ids[:2], types[:2], mask[:2], start_positions=torch.tensor([0, 0]),
                        end_positions=torch.tensor([0, 0]))
        row0 = ours(ids[0:1], types[0:1], mask[0:1], start_positions=torch.tensor([0]), end_positions=torch.tensor([0]))
        torch.testing.assert_close(in_batch.loss, (row0.loss + alone.loss) / 2, atol=1e-6, rtol=0)


def test_backbone_only_checkpoint_into_head_model(tmp_path, caplog):
    """A bare BertModel checkpoint (no `bert.` prefix) loads into a head model; the new head is reported."""
    hf_model = transformers.BertModel(transformers.BertConfig(**TINY)).eval()
    hf_model.save_pretrained(tmp_path)
    with caplog.at_level("WARNING", logger="bertforge"):
        ours = bertforge.BertForSequenceClassification.from_pretrained(tmp_path, num_labels=4)
    assert sorted(ours.load_report.missing_keys) == ["classifier.bias", "classifier.weight"]
    assert "classifier.weight" in caplog.text and "initialised randomly" in caplog.text
    ids, types, mask = batch()
    compare(outputs(ours.bert, ids, types, mask, True), outputs(hf_model, ids, types, mask, False), mask)


def test_full_checkpoint_into_backbone_reports_unused_heads(tmp_path):
    transformers.BertForPreTraining(transformers.BertConfig(**TINY)).save_pretrained(tmp_path)
    ours = bertforge.BertModel.from_pretrained(tmp_path)
    assert ours.load_report.missing_keys == []
    assert "cls.seq_relationship.weight" in ours.load_report.unexpected_keys


def test_pytorch_model_bin_and_tf_layer_norm_names(tmp_path):
    """An old-style pytorch_model.bin with gamma/beta LayerNorm names, read with weights_only=True."""
    hf_model = transformers.BertForMaskedLM(transformers.BertConfig(**TINY)).eval()
    state = {k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta"): v
             for k, v in hf_model.state_dict().items()}
    torch.save(state, tmp_path / "pytorch_model.bin")
    transformers.BertConfig(**TINY).save_pretrained(tmp_path)
    ours = bertforge.BertForMaskedLM.from_pretrained(tmp_path)
    assert ours.load_report.missing_keys == [] and ours.load_report.unexpected_keys == []
    ids, types, mask = batch()
    compare(outputs(ours, ids, types, mask, True), outputs(hf_model, ids, types, mask, False), mask)


def test_name_table_covers_every_parameter():
    """Every parameter of every head maps to a transformers name and back to itself."""
    from bertforge.interop.hf import _rename, _rules

    for name, _ in PAIRS:
        model = getattr(bertforge, name)(bertforge.BertConfig(**TINY))
        prefixed = hasattr(model, "bert")
        for key in model.state_dict():
            theirs = _rename(key, _rules(HF_NAMES, prefixed, reverse=False))
            assert theirs is not None, key
            assert _rename(theirs, _rules(HF_NAMES, prefixed, reverse=True)) == key
    table = HF_NAMES.backbone + HF_NAMES.heads
    assert len({o for o, _ in table}) == len(table)


def dropout_noise(model, ids, types, mask, draws: int) -> float:
    """Mean squared distance of train-mode hidden states from eval-mode ones, over real tokens and draws."""
    real = mask.bool()
    with torch.no_grad():
        model.eval()
        clean = model(input_ids=ids, token_type_ids=types, attention_mask=mask).last_hidden_state[real]
        model.train()
        total = sum(((model(input_ids=ids, token_type_ids=types, attention_mask=mask).last_hidden_state[real]
                      - clean) ** 2).mean().item() for _ in range(draws))
    return total / draws


def test_dropout_matches_transformers_in_distribution(minilm_dir):
    # Dropout masks cannot be matched draw for draw across libraries, and the step trace turns
    # dropout off, so this checks the next best thing: the noise dropout adds to the hidden
    # states has the same size. With 200 draws the ratio varies by about 1% with the torch
    # seed (0.984 to 1.004 over four seeds). On MiniLM every dropout counts: turning off
    # bertforge's embedding dropout moves the ratio to 0.70, its attention dropout to 0.85, and
    # the FFN-output dropout of the last layer alone to 0.92.
    ours = bertforge.BertModel.from_pretrained(minilm_dir)
    theirs = transformers.BertModel.from_pretrained(minilm_dir)
    assert ours.config.hidden_dropout_prob == ours.config.attention_probs_dropout_prob == 0.1
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1000, 20000, (4, 32), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 20:] = 0  # padded rows, so bertforge's unpadded path is the one measured
    mask[2, 9:] = 0
    ids, types = ids.masked_fill(mask == 0, 0), torch.zeros_like(ids)
    ratio = dropout_noise(ours, ids, types, mask, 200) / dropout_noise(theirs, ids, types, mask, 200)
    assert abs(ratio - 1) < 0.04, ratio



def test_dropout_gives_the_same_mean_gradient_and_gradient_noise(tmp_path):
    # What training feels of dropout is the gradient: its mean over the draws, and its spread.
    # From one start and one padded batch, each library's gradient of every parameter is
    # averaged over 300 draws (tests/dropout_moments.py; docs/results.md has the same check on
    # MiniLM and on bertforge's own mini with SQuAD windows). z = |mean gap|^2 / its expected Monte Carlo
    # size is about 1 when the two agree, and the noise ratio compares the spread. A small
    # random model keeps this fast; without bertforge's embedding dropout both move far.
    from dropout_moments import compare, gradient_moments, ours_loss, theirs_loss
    from bertforge.interop.hf import hf_names

    ours = bertforge.BertForQuestionAnswering(bertforge.BertConfig(**{**TINY, "hidden_size": 64}))
    assert ours.config.hidden_dropout_prob == ours.config.attention_probs_dropout_prob == 0.1
    ours.save_pretrained(tmp_path)
    theirs = transformers.BertForQuestionAnswering.from_pretrained(tmp_path)
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(5, TINY["vocab_size"], (4, 24), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 15:] = 0  # padding, so bertforge's unpadded path is the one measured
    mask[3, 8:] = 0
    batch = {"input_ids": ids.masked_fill(mask == 0, 0), "token_type_ids": torch.zeros_like(ids),
             "attention_mask": mask, "start_positions": torch.tensor([3, 7, 20, 2]),
             "end_positions": torch.tensor([5, 9, 22, 6])}
    draws = 300
    reference = gradient_moments(theirs, batch, theirs_loss, draws, {n: n for n, _ in theirs.named_parameters()})
    same = compare(gradient_moments(ours, batch, ours_loss, draws, hf_names(ours)), reference, draws)
    assert same["z"] < 1.5 and abs(same["noise_ratio"] - 1) < 0.1, same
    ours.bert.embeddings.dropout.p = 0.0
    off = compare(gradient_moments(ours, batch, ours_loss, draws, hf_names(ours)), reference, draws)
    assert off["z"] > 3 and off["noise_ratio"] < 0.8, off
