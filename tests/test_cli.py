"""The `bertforge` command: help for every subcommand, inspect, tokenizer training, and the demo main job."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from bertforge import BertConfig, BertForSequenceClassification, Tokenizer
from bertforge.cli import build_command, main

from conftest import TINY


def subcommand_paths(command, prefix=()):
    """Every runnable command path, e.g. ("inspect",), ("tokenizer", "train")."""
    children = getattr(command, "commands", None)
    if not children:
        yield prefix, command
        return
    for name, sub in children.items():
        yield from subcommand_paths(sub, prefix + (name,))


def test_help_lists_every_subcommand_and_each_flag_has_help(capsys):
    paths = dict(subcommand_paths(build_command()))
    assert {("inspect",), ("tokenizer", "train"), ("demo",), ("pretrain",), ("finetune", "classify"),
            ("finetune", "embed")} <= set(paths)
    top = subprocess.run([sys.executable, "-m", "bertforge", "--help"], capture_output=True, text=True)
    assert top.returncode == 0
    for path, command in paths.items():
        assert path[0] in top.stdout
        assert main([*path, "--help"]) == 0
        assert "Usage: bertforge " + " ".join(path) in capsys.readouterr().out
        assert command.help, path
        for param in command.params:  # every flag and argument says what it is for
            assert getattr(param, "help", None), (path, param.name)


def test_help_defaults_are_the_settings_defaults():
    """Each default --help shows for pretrain/finetune is the dataclass field's default."""
    from dataclasses import MISSING

    from bertforge.settings import FinetuneConfig, PretrainConfig, cli_fields

    paths = dict(subcommand_paths(build_command()))
    from bertforge.settings import EmbedConfig

    for name, cls in ((("pretrain",), PretrainConfig), (("finetune", "classify"), FinetuneConfig),
                      (("finetune", "embed"), EmbedConfig)):
        shown = {p.name: p.default for p in paths[name].params}
        for f in cli_fields(cls):
            assert f.name in shown, (name, f.name)
            if f.default is not MISSING:
                assert shown[f.name] == f.default, (name, f.name)


def test_same_flag_same_meaning():
    """--out, --overwrite, --json, --seed and --seq-len carry one meaning in every subcommand."""
    paths = dict(subcommand_paths(build_command()))
    for flag in ("overwrite", "json", "seed", "seq_len", "eval_every", "resume", "verbose"):
        kinds = {(type(p.default).__name__ if p.default is not None else "None")
                 for c in paths.values() for p in c.params if p.name == flag}
        assert len(kinds) <= 2, (flag, kinds)  # e.g. int and None (an optional int)
    for flag in ("eval_every", "resume", "seq_len", "seed", "overwrite"):
        assert all(any(p.name == flag for p in paths[c].params)
                   for c in (("pretrain",), ("finetune", "classify"), ("finetune", "embed"))), flag


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
    cmd = [sys.executable, "-m", "bertforge", "tokenizer", "train", str(corpus), "--out", str(out), "--vocab-size", "60",
           "--json"]
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
    """`bertforge --help` and every subcommand's help build without loading torch."""
    code = ("import sys; from bertforge.cli import main; main(['--help']); main(['pretrain', '--help']); "
            "main(['finetune', '--help']); sys.exit(1 if 'torch' in sys.modules else 0)")
    assert subprocess.run([sys.executable, "-c", code], timeout=60, capture_output=True).returncode == 0
