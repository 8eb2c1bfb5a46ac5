"""Memory exhaustion said in one line, before the first step or at the step that failed; and four small
frictions an operator met: a non-positive --workers, a refused run's lock left behind, serve's character
limit below the model's length, and a vocabulary of another kind than --arch's. Each runs the CLI as
the operator did."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from conftest import TINY, FixedBatches
from cli_utils import cli

GB = 1024 ** 3


def pretrain_args(run_inputs, out: Path, *extra: str) -> list[str]:
    corpus, tokenizer_dir = run_inputs
    return ["pretrain", str(corpus), "--tokenizer", str(tokenizer_dir), "--workers", "1", "--out", str(out), *extra]


# ------------------------------------------------------------------------------------------------- memory
def test_a_step_too_large_for_the_address_space_is_refused_before_it_starts(tmp_path, run_inputs):
    """`--model large --batch-size 512` under an 8 GB address-space limit: one line naming the need, the limit and
    a batch size that fits, exit 2, before any step (it used to train 333 s and die in a traceback)."""
    available = next((int(line.split()[1]) * 1024 for line in open("/proc/meminfo") if line.startswith("MemAvailable")),
                     None)
    # The refusal names whichever bound leaves less: the 8 GB limit (less what the process has mapped), or, on a
    # machine busy with other jobs, the memory available. With 10 GB free the limit is always the tighter one.
    bounds = ["the address-space limit (ulimit -v, 8.0 GB)"]
    if available is not None and available < 10 * GB:
        bounds.append("the memory available on this machine")
    out = tmp_path / "run"
    run = cli(*pretrain_args(run_inputs, out, "--model", "large", "--batch-size", "512", "--seq-len", "128",
                             "--max-steps", "5", "--precision", "fp32"), limit_as=8 * GB)
    assert run.returncode == 2, run.stderr
    lines = [line for line in run.stderr.splitlines() if line.startswith("bertforge: error")]
    assert len(lines) == 1 and "Traceback" not in run.stderr, run.stderr
    assert "--batch-size 512 at --seq-len 128 needs about" in lines[0]
    assert any(f"{bound} leaves" in lines[0] for bound in bounds), lines[0]
    fits = int(lines[0].split("--batch-size ")[2].split(" ")[0])
    assert 1 <= fits < 512 and f"--grad-accum {-(-512 // fits)} keeps the global batch of 512" in lines[0]
    assert not (out / "checkpoints").exists() and not (out / "metrics.jsonl").exists()


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_the_estimate_leans_low_but_close_to_a_measured_step(precision):
    """The estimate stays at or under what a real step adds (a refusal must never turn away a run that fits),
    and not far under: measured on a small BERT in a fresh process (tests/memory_step.py)."""
    from memory_step import measure

    row = measure("L4-H256", 8, 512, precision, native=True)
    assert 0.5 <= row["estimate"] / row["measured"] <= 1.05, row


def test_an_allocation_that_fails_anyway_ends_in_one_line_with_the_checkpoint_intact(tmp_path):
    from bertforge import BertConfig, BertForPreTraining
    from bertforge.training.checkpoint import latest_checkpoint
    from bertforge.training.memory import OutOfMemory
    from bertforge.training.trainer import TrainConfig, Trainer

    torch.manual_seed(0)
    model = BertForPreTraining(BertConfig(**TINY))
    ids = torch.randint(5, 99, (2, 8))
    batch = {"input_ids": ids, "token_type_ids": torch.zeros_like(ids), "attention_mask": torch.ones_like(ids),
             "labels": ids.masked_fill(torch.rand(2, 8) > 0.3, -100), "next_sentence_label": torch.zeros(2).long()}

    class Starved(FixedBatches):
        calls = 0

        def loss(self, model, batch):
            Starved.calls += 1
            if Starved.calls == 3:
                raise RuntimeError("[enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: can't allocate "
                                   "memory: you tried to allocate 4294967296 bytes. Error code 12")
            return super().loss(model, batch)

    config = TrainConfig(out=str(tmp_path), max_steps=5, batch_size=2, save_every=2, progress=False)
    trainer = Trainer(model, Starved([batch] * 8), config)
    with pytest.raises(OutOfMemory) as caught:
        trainer.fit()
    message = str(caught.value)
    assert message.startswith("out of memory in step 3 (") and "you tried to allocate 4294967296 bytes" in message
    saved = latest_checkpoint(tmp_path / "checkpoints")
    assert saved is not None and saved.name == "step-00000002" and f"Last checkpoint: {saved}, intact" in message


# ----------------------------------------------------------------------------------------------- frictions
@pytest.mark.parametrize("command", ["pretrain", "prepare"])
def test_a_non_positive_worker_count_is_refused(tmp_path, run_inputs, command):
    """It used to become 1 without a word."""
    corpus, tokenizer_dir = run_inputs
    out = tmp_path / "out"
    run = cli(command, str(corpus), "--tokenizer", str(tokenizer_dir), "--out", str(out), "--workers", "-3",
              *(["--max-steps", "2"] if command == "pretrain" else []))
    assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr
    assert "at least 1" in run.stderr and "-3" in run.stderr
    assert not out.exists() and not list(tmp_path.glob(".*lock"))


def test_a_refused_run_leaves_no_lock_and_no_directory_it_made(tmp_path, run_inputs):
    """Refused after its lock was taken (a corpus that is not UTF-8): the lock file is gone, and so is the
    directory the run created, since it wrote nothing else there."""
    _, tokenizer_dir = run_inputs
    corpus = tmp_path / "latin1.txt"
    corpus.write_bytes("caf\xe9 au lait\n\nun th\xe9\n".encode("latin-1"))
    out = tmp_path / "new" / "run"
    run = cli("pretrain", str(corpus), "--tokenizer", str(tokenizer_dir), "--workers", "1", "--out", str(out),
              "--max-steps", "2")
    assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr
    assert not (tmp_path / "new").exists(), sorted(p.name for p in tmp_path.rglob("*"))


def test_tokenizer_train_leaves_its_vocabulary_and_no_lock(tmp_path, run_inputs):
    corpus, _ = run_inputs
    out = tmp_path / "vocab"
    run = cli("tokenizer", "train", str(corpus), "--vocab-size", "200", "--out", str(out))
    assert run.returncode == 0, run.stderr
    assert not (out / ".bertforge.lock").exists() and (out / "vocab.txt").is_file()
    refused = cli("tokenizer", "train", str(tmp_path / "missing.txt"), "--out", str(tmp_path / "other"))
    assert refused.returncode == 2 and not (tmp_path / "other").exists()


def test_serve_derives_its_character_limit_from_the_model_length(tmp_path, modern_dirs):
    """A ModernBERT of 8,192 positions reads an 8,190-token input whole: the default --max-chars follows the model
    (20 a position, at least 10,000), and /info says both limits."""
    pytest.importorskip("fastapi")
    pytest.importorskip("transformers")

    from conftest import tiny_modernbert

    tiny_modernbert(tmp_path, modern_dirs, 8192)
    # (A --max-chars given on the command line is kept: the server tests serve with --max-chars 200.)
    from server_utils import call, running_server

    long_text = "a good film and a fine plot . " * 400  # 12,000 characters: over the old 10,000; ~5,600 tokens
    with running_server(tmp_path) as (port, _):
        status, info = call(port, "/info")
        assert status == 200 and info["max_chars_per_input"] == 163_840
        status, body = call(port, "/embed", {"inputs": long_text, "truncate": False})
        assert status == 200, body  # TEI's /embed: read whole, not refused for its characters


def test_a_vocabulary_of_another_kind_than_the_architecture_is_said_in_one_line(tmp_path, run_inputs):
    run = cli(*pretrain_args(run_inputs, tmp_path / "run", "--arch", "roberta", "--model", "L2-H64", "--seq-len",
                             "32", "--batch-size", "8", "--objective", "mlm", "--max-steps", "2"))
    assert run.returncode == 0, run.stderr
    notes = [line for line in run.stderr.splitlines() if "building roberta on the WordPiece vocabulary" in line]
    assert len(notes) == 1 and "roberta's own is byte-level BPE" in notes[0], run.stderr
