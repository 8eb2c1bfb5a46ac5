"""What a resumed run reads and says: a checkpoint of another format is refused by key, the stopping rules a resume
changes are said at the start (they count the whole run), the progress line counts to the step the run stops at,
and a head the checkpoint holds is not called random. Each runs the CLI as an operator did."""

from __future__ import annotations

import hashlib
import json
import signal
from pathlib import Path

import pytest

from kill_utils import stoppable_pretrain_args, stop_at

from cli_utils import cli
from cli_utils import sentences_tsv
from cli_utils import one_line_refusal


def _tree_digest(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def stopped_run(tmp_path_factory, run_inputs) -> tuple[Path, list[str]]:
    """A pretraining run stopped by SIGTERM at a step ≥ 5 of 80: a checkpoint to resume from, and its arguments."""
    out = tmp_path_factory.mktemp("resume") / "run"
    args = stoppable_pretrain_args(run_inputs, out)
    stopped = stop_at(args, out, 5, signal.SIGTERM)
    assert stopped.returncode == 128 + signal.SIGTERM, stopped.stderr
    return out, args


def _copy_of(run_dir: Path, tmp_path: Path) -> Path:
    import shutil

    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    return copy


def _state_file(out: Path) -> Path:
    return next((out / "checkpoints").glob("step-*")) / "trainer_state.json"


@pytest.mark.parametrize("edit, words", [
    (lambda s: s.update(format_version=7), ["format_version 7 is not one this bertforge reads (it reads 1)"]),
    (lambda s: s.update(data_position=s.pop("position")), ["key 'position' is missing"]),
    (lambda s: s.update(shuffle_seed=3), ["key 'shuffle_seed' is not one bertforge writes"]),
    (lambda s: s.update(epoch="0"), ["key 'epoch' is '0', not int"]),
])
def test_a_checkpoint_of_another_format_is_refused_by_key(tmp_path, stopped_run, edit, words):
    """A trainer_state.json of an unknown version or with a renamed key used to resume, restarting the epoch's data."""
    src, args = stopped_run
    out = _copy_of(src, tmp_path)
    state_file = _state_file(out)
    state = json.loads(state_file.read_text())
    assert state["format_version"] == 1
    edit(state)
    state_file.write_text(json.dumps(state))
    before = _tree_digest(out)
    result = cli(*[*[a if a != str(src) else str(out) for a in args], "--resume"])
    one_line_refusal(result, str(state_file), *words)
    assert _tree_digest(out) == before  # nothing trained, nothing rewritten


def test_a_resume_says_what_its_changed_stopping_rules_mean(tmp_path, stopped_run):
    """--max-steps lowered on resume: said at the start, and the progress line counts to it (it said `step 30/200`);
    --time-budget counts the whole run, so a budget already spent is said, not silently obeyed."""
    src, args = stopped_run
    out = _copy_of(src, tmp_path)
    step = json.loads(_state_file(out).read_text())["step"]
    here = [a if a != str(src) else str(out) for a in args]
    i = here.index("--max-steps")
    lowered = [*here[:i], "--max-steps", str(step + 2), *here[i + 2:], "--resume"]
    result = cli(*lowered)
    assert result.returncode == 0, result.stderr
    assert (f"resuming at step {step}, after " in result.stderr and f"it stops at step {step + 2} (--max-steps; the "
            "learning-rate schedule keeps its length of 80 steps)" in result.stderr), result.stderr
    assert f"train: step {step + 2}/{step + 2} " in result.stderr, result.stderr
    assert "initialised randomly" not in result.stderr

    out2 = _copy_of(src, tmp_path / "b")
    spent = json.loads(_state_file(out2).read_text())["elapsed"]
    budget = [a if a != str(src) else str(out2) for a in args] + ["--time-budget", f"{spent / 2:.3f}", "--resume"]
    result = cli(*budget)
    assert result.returncode == 0, result.stderr
    assert "counts the whole run, so 0.0 s are left (give more than" in result.stderr, result.stderr
    assert json.loads((out2 / "pretrain_results.json").read_text())["stopped_by"] == "time_budget"


def test_a_resumed_finetune_does_not_call_its_trained_head_random(tmp_path, checkpoints):
    """The head comes from the checkpoint resumed; the warning that it is random was said anyway."""
    data = sentences_tsv(tmp_path / "train.tsv")
    out = tmp_path / "ft"
    args = ["finetune", "classify", "--model", str(checkpoints["masked"]), "--train", str(data), "--dev", str(data),
            "--epochs", "400", "--batch-size", "2", "--log-every", "1", "--save-every", "1", "--out", str(out)]
    first = stop_at(args, out, 3, signal.SIGTERM)
    assert first.returncode == 128 + signal.SIGTERM, first.stderr
    assert "initialised randomly" in first.stderr
    resumed = cli(*[*args[:args.index("--epochs") + 1], "1", *args[args.index("--epochs") + 2:], "--resume"])
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming at step" in resumed.stderr and "initialised randomly" not in resumed.stderr, resumed.stderr
