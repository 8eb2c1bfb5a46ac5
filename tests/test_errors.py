"""Bad input gets a clear bertforge exception naming the problem, and the CLI one line and a non-zero exit."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
import torch

from bertforge import (BertConfig, BertForPreTraining, BertModel, CheckpointError, ConfigError, InputError,
                       TokenizerError)

from conftest import TINY
from cli_utils import cli


def assert_one_line_error(result: subprocess.CompletedProcess, *fragments: str) -> None:
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    assert lines[0].startswith("bertforge: error: ")
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


@pytest.fixture
def saved(tmp_path):
    path = tmp_path / "ckpt"
    BertForPreTraining(BertConfig(**TINY)).save_pretrained(path)
    return path


def test_directory_without_config(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(CheckpointError, match="no config.json"):
        BertModel.from_pretrained(tmp_path)
    assert_one_line_error(cli("inspect", str(tmp_path)), str(tmp_path), "no config.json")


def test_directory_without_weights(tmp_path):
    BertConfig(**TINY).save(tmp_path / "config.json")
    with pytest.raises(CheckpointError, match="no model.safetensors or pytorch_model.bin"):
        BertModel.from_pretrained(tmp_path)


@pytest.mark.parametrize("keep", [0.5, 0.999, 10])
def test_truncated_safetensors(saved, keep):
    file = saved / "model.safetensors"
    data = file.read_bytes()
    file.write_bytes(data[: int(len(data) * keep)] if keep < 1 else data[:keep])
    with pytest.raises(CheckpointError, match="model.safetensors: cannot read safetensors"):
        BertForPreTraining.from_pretrained(saved)
    assert_one_line_error(cli("inspect", str(saved)), "model.safetensors")


def test_config_that_does_not_match_weights(saved):
    config = json.loads((saved / "config.json").read_text())
    config["intermediate_size"] = 40
    (saved / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=r"key 'bert.encoder.layer.0.intermediate.dense.(weight|bias)' has shape \(37"):
        BertForPreTraining.from_pretrained(saved)
    assert_one_line_error(cli("inspect", str(saved)), "layer.0.intermediate.dense", "does not match")


def test_bin_with_code_is_refused(tmp_path):
    class Evil:
        def __reduce__(self):
            return (os.system, ("echo pwned",))

    BertConfig(**TINY).save(tmp_path / "config.json")
    torch.save({"x": Evil()}, tmp_path / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match="refused to load"):
        BertModel.from_pretrained(tmp_path)


def test_invalid_config_json(tmp_path):
    (tmp_path / "config.json").write_text('{"hidden_size": 30, "num_attention_heads": 4}')
    with pytest.raises(ConfigError, match="config.json.*divisible"):
        BertModel.from_pretrained(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        BertModel.from_pretrained(tmp_path)


def test_token_ids_out_of_range():
    model = BertModel(BertConfig(**TINY)).eval()
    with pytest.raises(InputError, match=r"input_ids contains 99, outside \[0, 99\)"):
        model(torch.tensor([[2, 99, 3]]))
    with pytest.raises(InputError, match="input_ids contains -1"):
        model(torch.tensor([[2, -1, 3]]))
    with pytest.raises(InputError, match="token_type_ids contains 2"):
        model(torch.tensor([[2, 5, 3]]), token_type_ids=torch.tensor([[0, 1, 2]]))


def test_sequence_longer_than_positions():
    model = BertModel(BertConfig(**TINY)).eval()
    with pytest.raises(InputError, match="sequence length 65 exceeds max_position_embeddings \\(64\\)"):
        model(torch.ones(1, 65, dtype=torch.long))


def test_mismatched_shapes():
    model = BertModel(BertConfig(**TINY)).eval()
    with pytest.raises(InputError, match="attention_mask has shape"):
        model(torch.ones(2, 5, dtype=torch.long), attention_mask=torch.ones(2, 4))
    with pytest.raises(InputError, match=r"shape \[batch, seq_len\]"):
        model(torch.ones(5, dtype=torch.long))


def test_cli_vocab_not_utf8(tmp_path):
    bad = tmp_path / "corpus.txt"
    bad.write_bytes(b"fine text\n\xff\xfe broken\n")
    assert_one_line_error(cli("tokenizer", "train", str(bad), "--out", str(tmp_path / "tok")),
                          "corpus.txt", "not UTF-8 at byte 10")
    with pytest.raises(TokenizerError):
        from bertforge import Tokenizer

        (tmp_path / "v").mkdir()
        (tmp_path / "v" / "vocab.txt").write_bytes(b"\xff")
        Tokenizer.from_pretrained(tmp_path / "v")
