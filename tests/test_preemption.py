"""Preemption-safe runs: SIGTERM, SIGINT and SIGUSR1 save a checkpoint and say how to resume; the resumed run
ends bitwise equal to an uninterrupted twin; checkpoints also come by the clock (--save-every-minutes).

Real processes, real signals: each run is started with the CLI, stopped at a step it has reached (read
from its metrics.jsonl), resumed with the command it printed, and compared with a run nobody stopped.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from safetensors.torch import load_file

from bertforge import BertConfig, BertModel, Tokenizer
from conftest import GPU_DETERMINISTIC
from kill_utils import stop_at, stoppable_pretrain_args
from cli_utils import cli, slice_file


ENV = dict(os.environ, PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1")


def resume_command(stderr: str) -> list[str]:
    """The command the stopped run printed, as arguments for `python -m bertforge`."""
    line = next(line for line in stderr.splitlines() if "resume with: " in line)
    words = shlex.split(line.split("resume with: ", 1)[1])
    assert words[0] == "bertforge" and words[-1] == "--resume"
    return words[1:]


@pytest.fixture(scope="module")
def whole(run_inputs, tmp_path_factory) -> Path:
    """The pretraining run nobody stopped, trained once for every test here that compares with it."""
    out = tmp_path_factory.mktemp("whole") / "run"
    result = cli(*stoppable_pretrain_args(run_inputs, out))
    assert result.returncode == 0, result.stderr
    return out


@pytest.mark.parametrize("sig, after", [(signal.SIGTERM, 7), (signal.SIGUSR1, 23)])
def test_pretrain_stopped_by_a_signal_resumes_bit_for_bit(tmp_path, run_inputs, whole, sig, after):
    out = tmp_path / "stopped"
    stopped = stop_at(stoppable_pretrain_args(run_inputs, out), out, after, sig)
    name = signal.Signals(sig).name
    assert stopped.returncode == 128 + sig, stopped.stderr
    line = next(line for line in stopped.stderr.splitlines() if line.startswith("bertforge: stopped by"))
    step = int(line.split(" at step ")[1].split(";")[0])
    assert line.startswith(f"bertforge: stopped by {name} at step {step}; checkpoint ")
    assert (out / "checkpoints" / f"step-{step:08d}").is_dir() and "Traceback" not in stopped.stderr
    assert step < 80 and not (out / "model.safetensors").exists()
    resumed = cli(*resume_command(stopped.stderr))
    assert resumed.returncode == 0, resumed.stderr
    a, b = load_file(str(whole / "model.safetensors")), load_file(str(out / "model.safetensors"))
    assert a.keys() == b.keys() and all(bool((a[k] == b[k]).all()) for k in a)


def test_finetune_stopped_by_ctrl_c_resumes_bit_for_bit(tmp_path, run_inputs):
    from conftest import shared

    tok = Tokenizer.from_pretrained(run_inputs[1])
    model = tmp_path / "base"
    BertModel(BertConfig.from_preset("L2-H64", vocab_size=tok.vocab_size)).save_pretrained(model, tokenizer=tok)
    train = slice_file(shared("glue", "SST-2", "train.tsv"), tmp_path / "train", 400)
    dev = slice_file(shared("glue", "SST-2", "dev.tsv"), tmp_path / "dev", 60)

    def args(out: Path) -> list[str]:
        return ["finetune", "classify", "--model", str(model), "--train", str(train), "--dev", str(dev),
                "--out", str(out), "--epochs", "3", "--batch-size", "8", "--seq-len", "48", "--save-every", "1000",
                "--log-every", "1", "--seed", "4", *GPU_DETERMINISTIC]

    whole = tmp_path / "whole"
    assert cli(*args(whole)).returncode == 0
    out = tmp_path / "stopped"
    stopped = stop_at(args(out), out, 30, signal.SIGINT)
    assert stopped.returncode == 130 and "bertforge: stopped by SIGINT at step" in stopped.stderr, stopped.stderr
    assert "interrupted" not in stopped.stderr and "Traceback" not in stopped.stderr
    resumed = cli(*resume_command(stopped.stderr))
    assert resumed.returncode == 0, resumed.stderr
    a, b = load_file(str(whole / "model.safetensors")), load_file(str(out / "model.safetensors"))
    assert all(bool((a[k] == b[k]).all()) for k in a)
    assert json.loads((whole / "eval_results.json").read_text())["accuracy"] == \
        json.loads((out / "eval_results.json").read_text())["accuracy"]


def test_checkpoints_by_the_clock(tmp_path, run_inputs, whole):
    """--save-every-minutes saves however few steps have passed (here about every 60 ms), and saving changes
    nothing the run trains: its weights are the run's that saved at the end only."""
    out = tmp_path / "run"
    result = cli(*stoppable_pretrain_args(run_inputs, out, "--save-every-minutes", "0.001", "--keep-last", "1000"))
    assert result.returncode == 0, result.stderr
    steps = sorted(int(p.name.split("-")[1]) for p in (out / "checkpoints").iterdir())
    assert len(steps) > 2 and steps[-1] == 80  # saved along the way, though --save-every is 1000
    assert same_weights(whole, out)


def test_save_every_minutes_must_be_positive(tmp_path, run_inputs):
    result = cli(*stoppable_pretrain_args(run_inputs, tmp_path / "run", "--save-every-minutes", "0"))
    assert result.returncode == 2 and "save_every_minutes (--save-every-minutes) must be positive" in result.stderr


def test_a_torchrun_job_stops_at_one_step_and_resumes_bit_for_bit(tmp_path, run_inputs):
    """SIGTERM to torchrun reaches both processes; rank 0's decides the step, so both stop at it and one
    checkpoint is written; the job launched again with --resume ends as the job nobody stopped."""
    corpus, tok = run_inputs

    def torchrun(out: Path, *extra: str) -> list[str]:
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m",
                "bertforge", "pretrain", str(corpus), "--tokenizer", str(tok), "--model", "L2-H64", "--seq-len", "32",
                "--batch-size", "4", "--max-steps", "60", "--save-every", "1000", "--log-every", "1", "--workers",
                "1", "--out", str(out), *extra]

    whole = tmp_path / "whole"
    assert subprocess.run(torchrun(whole), capture_output=True, text=True, env=ENV, timeout=600).returncode == 0
    out = tmp_path / "stopped"
    proc = subprocess.Popen(torchrun(out), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    metrics = out / "metrics.jsonl"
    while proc.poll() is None and not (metrics.is_file() and len(metrics.read_text().splitlines()) >= 20):
        time.sleep(0.02)
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=120)
    lines = [line for line in stderr.splitlines() if line.startswith("bertforge: stopped by SIGTERM at step ")]
    assert len(lines) == 1, stderr  # rank 0 says it once
    step = int(lines[0].split(" at step ")[1].split(";")[0])
    assert [p.name for p in (out / "checkpoints").iterdir()] == [f"step-{step:08d}"] and step < 60
    assert "torchrun ... -m bertforge pretrain" in lines[0]
    resumed = subprocess.run(torchrun(out, "--resume"), capture_output=True, text=True, env=ENV, timeout=600)
    assert resumed.returncode == 0, resumed.stderr
    a, b = load_file(str(whole / "model.safetensors")), load_file(str(out / "model.safetensors"))
    assert all(bool((a[k] == b[k]).all()) for k in a)


def eval_rows(out: Path) -> list[dict]:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k.startswith("eval_") or k == "step"} for r in rows
            if any(k.startswith("eval_") for k in r)]


def same_weights(a: Path, b: Path) -> bool:
    x, y = load_file(str(a / "model.safetensors")), load_file(str(b / "model.safetensors"))
    return x.keys() == y.keys() and all(bool((x[k] == y[k]).all()) for k in x)


def test_a_signal_during_evaluation_or_a_checkpoint_write(tmp_path, run_inputs, monkeypatch, capsys):
    """In one process, so the signal lands at an exact place: inside the held-out evaluation's first forward
    pass, and between the two files of a checkpoint (with a second signal on top). Either way the run finishes
    what it is doing, saves, names --resume, and the resumed run is bitwise the uninterrupted one, evaluations
    included."""
    from bertforge.cli import main
    from bertforge.tasks.pretraining import PretrainingTask
    from bertforge.training import trainer as trainer_module
    from bertforge.training.checkpoint import read_trainer_state

    def args(out: Path) -> list[str]:
        return stoppable_pretrain_args(run_inputs, out, "--max-steps", "50", "--eval-every", "20", "--save-every", "15")

    whole = tmp_path / "whole"
    assert main(args(whole)) == 0

    # 1. SIGTERM inside the evaluation at step 20: it finishes, the checkpoint follows, the run stops at 20.
    evaluate = PretrainingTask.evaluate

    def evaluate_with_a_signal(self, model):
        def hook(module, inputs):
            handle.remove()
            os.kill(os.getpid(), signal.SIGTERM)
        handle = model.register_forward_pre_hook(hook)
        return evaluate(self, model)

    monkeypatch.setattr(PretrainingTask, "evaluate", evaluate_with_a_signal)
    during_eval = tmp_path / "during-eval"
    capsys.readouterr()
    assert main(args(during_eval)) == 128 + signal.SIGTERM
    stderr = capsys.readouterr().err
    assert "bertforge: stopped by SIGTERM at step 20; checkpoint " in stderr, stderr
    monkeypatch.setattr(PretrainingTask, "evaluate", evaluate)
    assert main(resume_command(stderr)) == 0
    assert same_weights(whole, during_eval) and eval_rows(whole) == eval_rows(during_eval)

    # 2. SIGTERM, then SIGINT, between the model file and the optimizer state of the checkpoint at step 15.
    torch_files = trainer_module.torch_files

    def files_with_signals(model, optimizer):
        write = torch_files(model, optimizer)

        def interrupted(folder: Path) -> None:
            model.save_pretrained(folder)
            os.kill(os.getpid(), signal.SIGTERM)
            os.kill(os.getpid(), signal.SIGINT)  # a second signal must not cut the save short
            write(folder)
        return interrupted

    monkeypatch.setattr(trainer_module, "torch_files", files_with_signals)
    during_save = tmp_path / "during-save"
    assert main(args(during_save)) == 128 + signal.SIGTERM
    stderr = capsys.readouterr().err
    assert "bertforge: stopped by SIGTERM at step 16; checkpoint " in stderr, stderr
    saved = sorted(p.name for p in (during_save / "checkpoints").iterdir())
    assert saved == ["step-00000015", "step-00000016"]  # both whole; no temporary directory left
    assert read_trainer_state(during_save / "checkpoints" / "step-00000015")["step"] == 15
    monkeypatch.setattr(trainer_module, "torch_files", torch_files)
    assert main(resume_command(stderr)) == 0
    assert same_weights(whole, during_save) and eval_rows(whole) == eval_rows(during_save)


def test_each_rank_resumes_its_own_device_generator(tmp_path, monkeypatch):
    """A multi-GPU checkpoint keeps every rank's generators, the CPU's and its own device's, and a resumed rank sets
    its own (the checkpoint once held rank 0's device states alone, restored on every rank, so a multi-GPU resume
    drew other dropout masks). No GPU here: two ranks' device generators are stand-ins behind torch.cuda's calls."""
    import torch

    from bertforge.training import checkpoint

    first = torch.get_rng_state()
    torch.rand(5)
    cpu = [first, torch.get_rng_state()]  # two valid generator states, as two ranks' would be
    cuda = [torch.tensor([1, 2, 3], dtype=torch.uint8), torch.tensor([4, 5, 6], dtype=torch.uint8)]
    gathered = iter([cpu, cuda])  # gather_cpu's answer: the CPU states, then the device states, in rank order
    monkeypatch.setattr(checkpoint.dist, "gather_cpu", lambda t: next(gathered))
    monkeypatch.setattr(checkpoint.dist, "device", lambda: torch.device("cuda", 1))
    asked = []
    monkeypatch.setattr(torch.cuda, "get_rng_state", lambda d: asked.append(d) or cuda[1])
    states = checkpoint.rank_rng_states()
    assert asked == [torch.device("cuda", 1)]  # the device this rank trains on, not every visible one
    assert set(states) == {"torch_rng", "cuda_rng"}

    saved = checkpoint.save_checkpoint(tmp_path, 3, lambda folder: None, {}, rank_rng=states)
    set_on = {}
    monkeypatch.setattr(torch.cuda, "set_rng_state", lambda state, d: set_on.__setitem__(d, state.clone()))
    torch.rand(5)  # this process has drawn on since: the load must take it back to rank 1's state
    before = torch.get_rng_state()
    try:
        assert not torch.equal(before, cpu[1])
        checkpoint.load_rank_rng(saved, rank=1, world=2)
        assert torch.equal(torch.get_rng_state(), cpu[1])
        assert list(set_on) == [torch.device("cuda", 1)] and torch.equal(set_on[torch.device("cuda", 1)], cuda[1])
        set_on.clear()
        checkpoint.load_rank_rng(saved, rank=0, world=3)  # another world: the states are not this run's to take
        assert not set_on
    finally:
        torch.set_rng_state(before)
