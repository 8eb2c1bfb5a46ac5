"""The `bertforge` command: help for every subcommand, inspect, tokenizer training, and the demo main job."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from bertforge import BertConfig, BertForSequenceClassification, Tokenizer
from bertforge.cli import build_parser

from conftest import TINY


def subcommand_paths(parser, prefix=()):
    """Every runnable command path, e.g. ("inspect",), ("tokenizer", "train")."""
    actions = [a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction"]
    if not actions:
        yield prefix
        return
    for name, sub in actions[0].choices.items():
        yield from subcommand_paths(sub, prefix + (name,))


def test_help_lists_every_subcommand_and_each_has_help(capsys):
    paths = list(subcommand_paths(build_parser()))
    assert {("inspect",), ("tokenizer", "train"), ("demo",)} <= set(paths)
    top = subprocess.run([sys.executable, "-m", "bertforge", "--help"], capture_output=True, text=True)
    assert top.returncode == 0
    for path in paths:
        assert path[0] in top.stdout
        with pytest.raises(SystemExit) as exit_info:
            build_parser().parse_args([*path, "--help"])
        assert exit_info.value.code == 0
        assert "usage: bertforge " + " ".join(path) in capsys.readouterr().out


def test_console_script_is_installed():
    exe = shutil.which("bertforge")
    if exe is None:
        pytest.skip("package not pip-installed in this environment")
    assert subprocess.run([exe, "--version"], capture_output=True, text=True).stdout.startswith("bertforge ")


def test_inspect(tmp_path):
    config = BertConfig(**TINY, id2label={0: "neg", 1: "pos"})
    BertForSequenceClassification(config).save_pretrained(tmp_path)
    out = subprocess.run([sys.executable, "-m", "bertforge", "inspect", str(tmp_path), "--json"],
                         capture_output=True, text=True, check=True).stdout
    info = json.loads(out)
    assert info["architecture"] == "BertForSequenceClassification"
    assert info["heads"] == ["classifier"] and info["missing_keys"] == []
    assert info["parameters"]["total"] == BertForSequenceClassification(config).num_parameters()
    assert info["config"]["id2label"] == {"0": "neg", "1": "pos"}
    table = subprocess.run([sys.executable, "-m", "bertforge", "inspect", str(tmp_path)],
                           capture_output=True, text=True, check=True).stdout
    assert "architecture  BertForSequenceClassification" in table and '"0": "neg"' in table


def test_tokenizer_train_refuses_to_overwrite(tmp_path):
    corpus = tmp_path / "c.txt"
    corpus.write_text("alpha beta gamma delta\n" * 50 + "epsilon zeta eta theta\n" * 50)
    out = tmp_path / "tok"
    cmd = [sys.executable, "-m", "bertforge", "tokenizer", "train", str(corpus), "--out", str(out), "--vocab-size", "60"]
    result = subprocess.run(cmd, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["vocab_size"] <= 60
    tok = Tokenizer.from_pretrained(out)
    assert tok.tokenize("alpha gamma") == ["alpha", "gamma"]
    before = (out / "vocab.txt").read_bytes()
    again = subprocess.run(cmd, capture_output=True, text=True)
    assert again.returncode == 2 and "--overwrite" in again.stderr and "Traceback" not in again.stderr
    assert (out / "vocab.txt").read_bytes() == before


def test_demo_main_job(tmp_path):
    """README's first command: runs offline, end to end, and leaves a checkpoint transformers can load."""
    out = tmp_path / "demo"
    result = subprocess.run([sys.executable, "-m", "bertforge", "demo", "--out", str(out)],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    assert "fill-mask" in result.stdout
    predictions = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    assert len(predictions) == 2 and all(len(p["predictions"][0]) == 3 for p in predictions)
    transformers = pytest.importorskip("transformers")
    _, info = transformers.BertForPreTraining.from_pretrained(out, output_loading_info=True)
    assert not info["missing_keys"]
    # A second run must not overwrite the first.
    again = subprocess.run([sys.executable, "-m", "bertforge", "demo", "--out", str(out)], capture_output=True, text=True)
    assert again.returncode == 2 and "not empty" in again.stderr


def test_help_starts_without_importing_torch():
    """`bertforge --help` and a subcommand's --help build every flag without loading torch."""
    code = ("import sys; from bertforge.cli import build_parser; build_parser(); "
            "sys.exit(1 if 'torch' in sys.modules else 0)")
    assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 0


def test_output_piped_into_head_ends_quietly(tmp_path, minilm_dir):
    """A reader that closes the pipe early (`| head -1`) is not an error: exit 0 and no traceback."""
    inputs = tmp_path / "in.txt"
    inputs.write_text("".join(f"sentence number {i}\n" for i in range(400)))
    script = f"{sys.executable} -m bertforge predict embed --model {minilm_dir} --input {inputs} | head -1 >/dev/null"
    result = subprocess.run(["bash", "-c", f"set -o pipefail; {script}; echo \"${{PIPESTATUS[0]}}\" >&2"],
                            capture_output=True, text=True, timeout=300)
    assert "Traceback" not in result.stderr and "BrokenPipe" not in result.stderr, result.stderr
    assert result.stderr.strip().splitlines()[-1] == "0", result.stderr
