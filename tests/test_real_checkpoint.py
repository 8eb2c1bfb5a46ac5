"""Parity with transformers on a real checkpoint: all-MiniLM-L6-v2 (6 layers, 384 wide, HF layout)."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from bertforge import BertModel, Tokenizer  # noqa: E402
from bertforge.interop.inspect import inspect_checkpoint  # noqa: E402

from conftest import sst2_sentences  # noqa: E402


def test_hidden_states_match_transformers_on_sst2(minilm_dir):
    """128 real SST-2 dev sentences in padded batches of 32: every real token within 1e-5 (fp32)."""
    sentences = sst2_sentences(128)
    ours = BertModel.from_pretrained(minilm_dir)
    assert ours.load_report.missing_keys == []
    theirs = transformers.BertModel.from_pretrained(minilm_dir).eval()
    tokenizer = Tokenizer.from_pretrained(minilm_dir)
    worst = 0.0
    for start in range(0, len(sentences), 32):
        enc = tokenizer(sentences[start:start + 32], padding=True, truncation=True, return_tensors="pt")
        assert (enc["attention_mask"] == 0).any()  # the batch really is padded
        with torch.no_grad():
            a = ours(enc["input_ids"], enc["token_type_ids"], enc["attention_mask"])
            b = theirs(**{k: enc[k] for k in ("input_ids", "token_type_ids", "attention_mask")})
        real = enc["attention_mask"].bool()
        worst = max(worst, (a.last_hidden_state[real] - b.last_hidden_state[real]).abs().max().item())
        torch.testing.assert_close(a.pooler_output, b.pooler_output, atol=1e-5, rtol=0)
    assert worst <= 1e-5, worst


def test_inspect_reads_headers(minilm_dir):
    info = inspect_checkpoint(minilm_dir)
    assert info["architecture"] == "BertModel" and info["heads"] == []
    assert info["config"]["num_hidden_layers"] == 6 and info["config"]["hidden_size"] == 384
    model = BertModel.from_pretrained(minilm_dir)
    assert info["parameters"]["total"] == model.num_parameters()
