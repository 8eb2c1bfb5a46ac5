"""What an operator does by mistake never loses what they made (issue: operator faults).

An --out that is, holds or lies inside an input; --resume on a run that already finished; a second
run into a directory another run is writing; a bad model setting found only after --out was written.
Each case runs the real CLI and checks the exit code, the one line it prints and that every file the
user had is byte for byte what it was.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bertforge import BertConfig, BertForSequenceClassification, Tokenizer
from cli_utils import cli, pretrain_args, slice_file, snapshot


@pytest.fixture()
def model_dir(tmp_path, run_inputs) -> Path:
    """A user's classifier, with its tokenizer: what a fine-tuning run reads."""
    tokenizer_dir = run_inputs[1]
    path = tmp_path / "my-model"
    model = BertForSequenceClassification(BertConfig.from_preset("L2-H64", vocab_size=300))
    model.save_pretrained(path, tokenizer=Tokenizer.from_pretrained(tokenizer_dir))
    return path


@pytest.mark.parametrize("where, relation", [(".", "is"), ("..", "contains"), ("sub", "lies inside")])
def test_an_out_that_touches_the_model_is_refused_and_the_model_kept(tmp_path, model_dir, where, relation):
    from conftest import shared

    train = slice_file(shared("glue", "SST-2", "train.tsv"), tmp_path / "train", 20)
    before = snapshot(model_dir)
    out = (model_dir / where) if where != "sub" else model_dir / "finetuned"
    result = cli("finetune", "classify", "--model", str(model_dir), "--train", str(train), "--dev", str(train),
                 "--out", str(out), "--overwrite", "--epochs", "1")
    assert result.returncode == 2, result.stderr
    assert f"{relation} the --model input {model_dir}" in result.stderr and "Traceback" not in result.stderr
    assert snapshot(model_dir) == before and not (model_dir / "finetuned").exists()


def test_an_out_that_holds_the_tokenizer_is_refused(tmp_path, run_inputs):
    corpus, tokenizer_dir = run_inputs
    before = snapshot(tokenizer_dir)
    result = cli(*pretrain_args(corpus, tokenizer_dir, tokenizer_dir.parent, "--overwrite", "--max-steps", "1"))
    assert result.returncode == 2 and "contains the --tokenizer input" in result.stderr, result.stderr
    assert snapshot(tokenizer_dir) == before


def test_resume_on_a_finished_run_changes_nothing(tmp_path, run_inputs):
    """It used to train one more step at learning rate 0 each time and, with --keep-last, delete the run's final
    checkpoints."""
    corpus, tokenizer_dir = run_inputs
    out = tmp_path / "run"
    args = pretrain_args(corpus, tokenizer_dir, out, "--max-steps", "4", "--save-every", "2", "--keep-last", "2")
    assert cli(*args).returncode == 0
    before = snapshot(out)
    for _ in range(2):
        result = cli(*args, "--resume")
        assert result.returncode == 0, result.stderr
        assert f"bertforge: {out}: the run already finished at step 4 (max_steps); nothing to do" in result.stderr
        assert f"--model {out} --out NEW" in result.stderr and "error" not in result.stderr
    assert snapshot(out) == before
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-00000002", "step-00000004"]


def test_a_run_killed_after_its_last_checkpoint_finishes_on_resume(tmp_path, run_inputs):
    """Results missing but the final checkpoint there: --resume writes the results without another step."""
    corpus, tokenizer_dir = run_inputs
    out = tmp_path / "run"
    args = pretrain_args(corpus, tokenizer_dir, out, "--max-steps", "4", "--save-every", "2")
    assert cli(*args).returncode == 0
    final = snapshot(out / "checkpoints")
    (out / "pretrain_results.json").unlink()
    (out / "model.safetensors").unlink()
    result = cli(*args, "--resume", "--json")
    assert result.returncode == 0, result.stderr
    assert (out / "pretrain_results.json").is_file() and (out / "model.safetensors").is_file()
    assert snapshot(out / "checkpoints") == final  # no step 5, nothing pruned


def test_one_run_per_directory(tmp_path, run_inputs):
    """A second run into a directory another run is writing is refused naming it; the first finishes intact."""
    corpus, tokenizer_dir = run_inputs
    out = tmp_path / "run"
    env = dict(os.environ, PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1")
    first = subprocess.Popen([sys.executable, "-m", "bertforge",
                              *pretrain_args(corpus, tokenizer_dir, out, "--time-budget", "15", "--save-every", "5")],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        lock = out / ".bertforge.lock"
        deadline = time.time() + 60
        while not (lock.is_file() and lock.read_text()) and time.time() < deadline:
            time.sleep(0.2)
        assert lock.read_text().startswith(f"pid {first.pid} on ")
        for flag in ("--overwrite", "--resume"):
            second = cli(*pretrain_args(corpus, tokenizer_dir, out, flag, "--max-steps", "2"))
            assert second.returncode == 2, second.stderr
            assert f"in use by another bertforge run (pid {first.pid} on " in second.stderr, second.stderr
    finally:
        _, err = first.communicate(timeout=300)
    assert first.returncode == 0, err
    assert (out / "model.safetensors").is_file() and not lock.exists()  # released and removed at the end


def test_a_dead_runs_lock_is_taken_over_with_a_warning(tmp_path, run_inputs):
    corpus, tokenizer_dir = run_inputs
    out = tmp_path / "run"
    out.mkdir()
    (out / ".bertforge.lock").write_text("pid 999999 on elsewhere, since 2026-01-01 00:00:00")
    result = cli(*pretrain_args(corpus, tokenizer_dir, out, "--max-steps", "2"))
    assert result.returncode == 0, result.stderr
    assert "taking over the lock of a run that is no longer running (pid 999999 on elsewhere" in result.stderr


@pytest.mark.parametrize("args, message", [
    (["--model", "L2-H65"], "must be a multiple of 64"),
    (["--model", "runs/clff"], "runs/clff: no such checkpoint directory, and not a model preset"),
    (["--model", "L2-H64", "--seq-len", "600"], "--seq-len 600 exceeds the 512 positions"),
])
def test_bad_model_settings_are_refused_before_out_is_written(tmp_path, run_inputs, args, message):
    """The corrected re-run must not then be refused as "directory exists"."""
    corpus, tokenizer_dir = run_inputs
    out = tmp_path / "run"
    result = cli("pretrain", str(corpus), "--tokenizer", str(tokenizer_dir), *args, "--max-steps", "2", "--out", str(out))
    assert result.returncode == 2 and message in result.stderr and "Traceback" not in result.stderr, result.stderr
    assert not out.exists()


def test_a_mistyped_model_path_is_called_missing(tmp_path):
    result = cli("finetune", "classify", "--model", str(tmp_path / "runs" / "clff"), "--train", "x.tsv",
                 "--dev", "x.tsv", "--out", str(tmp_path / "out"))
    assert result.returncode == 2, result.stderr
    assert "clff: no such checkpoint directory, and not a model preset" in result.stderr
    assert not (tmp_path / "out").exists()
