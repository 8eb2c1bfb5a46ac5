"""Every finetune task: `--seeds 1,2` gives, for each seed, the run `--seed N` gives alone; a finished run's
`run_config.json` read back with `--config` repeats the run bit for bit; and `--dev` may be left out (#73's seq_len defect: a seeded ColBERT run
was refused for a --seq-len nobody gave, its run_config.json was refused by --config, and a seeded embedder trained
at another length than the same run unseeded)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from safetensors.torch import load_file

pytest.importorskip("sentence_transformers")

from bertforge.cli import main  # noqa: E402
from conftest import SENTENCES  # noqa: E402

TASKS = ("classify", "regress", "ner", "qa", "embed", "rerank", "sparse", "colbert")


@pytest.fixture(scope="module")
def labelled(tmp_path_factory) -> Path:
    """Tiny labelled files for the classic tasks, on the conftest checkpoints' vocabulary."""
    root = tmp_path_factory.mktemp("labelled")
    (root / "classify.tsv").write_text("sentence\tlabel\n" + "".join(f"{s}\t{i % 2}\n" for i, s in enumerate(SENTENCES)))
    (root / "regress.tsv").write_text("sentence\tlabel\n" + "".join(f"{s}\t{i / 5:.2f}\n"
                                                                   for i, s in enumerate(SENTENCES)))
    (root / "ner.conll").write_text("john B-PER\nlives O\nin O\nparis B-LOC\n. O\n\n" * 4)
    qas = [{"id": f"q{i}", "question": "who lives in paris ?", "answers": [{"text": "john", "answer_start": 0}]}
           for i in range(4)]
    (root / "qa.json").write_text(json.dumps({"version": "1.1", "data": [
        {"title": "t", "paragraphs": [{"context": "john lives in paris .", "qas": qas}]}]}))
    return root


def _args(task: str, checkpoints, labelled: Path, root: Path) -> list[str]:
    common = ["--max-steps", "2", "--precision", "fp32", "--matmul", "torch", "--json"]
    if task in ("classify", "regress", "ner", "qa"):
        model = checkpoints[{"classify": "classifier", "regress": "classifier", "ner": "tagger", "qa": "reader"}[task]]
        data = labelled / {"classify": "classify.tsv", "regress": "regress.tsv", "ner": "ner.conll",
                           "qa": "qa.json"}[task]
        extra = ["--doc-stride", "16"] if task == "qa" else []  # the tiny reader reads 64 positions
        return ["finetune", task, "--model", str(model), "--train", str(data), "--dev", str(data), "--batch-size",
                "2", *extra, *common]
    model = {"embed": root / "st", "rerank": root / "cross", "sparse": checkpoints["masked"],
             "colbert": root / "bert"}[task]
    extra = {"rerank": ["--candidates", str(root / "run.trec"), "--batch-size", "4"],
             "colbert": ["--dim", "8", "--batch-size", "4", "--query-length", "12", "--document-length", "40"],
             "embed": ["--batch-size", "4"],
             "sparse": ["--batch-size", "4"]}[task]
    return ["finetune", task, "--model", str(model), "--train", str(root / "pairs.jsonl"), "--dev",
            str(root / "beir"), *extra, *common]


def _weights(folder: Path) -> dict:
    return {str(p.relative_to(folder)): load_file(p) for p in sorted(folder.rglob("*.safetensors"))}


def _same(a: Path, b: Path) -> None:
    wa, wb = _weights(a), _weights(b)
    assert wa and wa.keys() == wb.keys()
    for name in wa:
        assert wa[name].keys() == wb[name].keys()
        for key in wa[name]:
            assert (wa[name][key] == wb[name][key]).all(), (name, key)


@pytest.mark.parametrize("task", TASKS)
def test_seeds_equal_single_runs_and_run_config_reads_back(tmp_path, checkpoints, labelled, retrieval_dirs, task,
                                                          capsys, monkeypatch):
    args = _args(task, checkpoints, labelled, retrieval_dirs)
    # Every build of a run (each seed's, each single run's) leaves the settings as they were checked, and the task it
    # builds carries the length it worked out.
    from bertforge.training import finetune

    built, real = [], finetune.build

    def build(cfg, *rest, **kw):
        before = dataclasses.asdict(cfg)
        model, task_object = real(cfg, *rest, **kw)
        built.append((before == dataclasses.asdict(cfg), cfg.seq_len, task_object.seq_len))
        return model, task_object

    monkeypatch.setattr(finetune, "build", build)
    assert main([*args, "--seeds", "1,2", "--out", str(tmp_path / "seeds")]) == 0, capsys.readouterr().err
    assert main([*args, "--seed", "2", "--out", str(tmp_path / "single")]) == 0, capsys.readouterr().err
    _same(tmp_path / "seeds" / "seed-2", tmp_path / "single")
    saved = json.loads((tmp_path / "single" / "run_config.json").read_text())
    assert main(["finetune", task, "--config", str(tmp_path / "single" / "run_config.json"), "--out",
                 str(tmp_path / "again"), "--json"]) == 0, capsys.readouterr().err
    again = json.loads((tmp_path / "again" / "run_config.json").read_text())
    assert {**saved, "out": None} == {**again, "out": None}
    _same(tmp_path / "single", tmp_path / "again")
    assert saved["seq_len"] is None  # a length left to the task is saved as left
    assert len(built) == 4 and all(same and given is None and isinstance(length, int) and length > 0
                                   for same, given, length in built), built
    # Without --dev: the run trains and writes its final model, and says nothing was selected. The run above
    # evaluated only at its last step (2 steps, less than an epoch), so it selected that step: the same weights.
    bare = _without(args, "--dev", "--candidates")
    capsys.readouterr()
    assert main([*bare, "--seed", "2", "--out", str(tmp_path / "nodev")]) == 0, capsys.readouterr().err
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["selected_step"] is None and "no --dev: no model was selected" in summary["note"]
    _same(tmp_path / "single", tmp_path / "nodev")


def _without(args: list[str], *flags: str) -> list[str]:
    """`args` without each of `flags` and its value."""
    out, skip = [], False
    for arg in args:
        if skip:
            skip = False
        elif arg in flags:
            skip = True
        else:
            out.append(arg)
    return out


@pytest.mark.parametrize("flag", [["--eval-every", "1"], ["--patience", "2"]])
def test_what_only_an_evaluation_does_is_refused_without_dev(tmp_path, checkpoints, labelled, retrieval_dirs, flag,
                                                             capsys):
    args = _without(_args("classify", checkpoints, labelled, retrieval_dirs), "--dev")
    capsys.readouterr()
    assert main([*args, *flag, "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "evaluates on --dev" in err and flag[0] in err, err
    assert not (tmp_path / "o").exists()
