"""Fine-tuning: readers on real GLUE/CoNLL slices (and malformed rows), truncation, sub-token label
alignment, and short end-to-end runs for classify / regress / ner with the HF export and `evaluate`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from bertforge import BertConfig, BertModel, Tokenizer
from bertforge.data.classification import Columns, label_set, read_examples, truncate_ids
from bertforge.data.ner import read_sentences
from bertforge.errors import InputError
from bertforge.tasks.token_classification import ner_features

from conftest import GPU_DETERMINISTIC, shared
from cli_utils import cli, slice_file


def test_glue_readers():
    sst = read_examples(shared("glue", "SST-2", "dev.tsv"))
    assert len(sst) == 872 and sst[0].pair is None and label_set(sst) == ["0", "1"]
    mrpc = read_examples(shared("glue", "MRPC", "dev.tsv"))  # BOM, '#1 String' / '#2 String' / 'Quality'
    assert len(mrpc) == 408 and mrpc[0].pair and {e.label for e in mrpc} == {"0", "1"}
    rte = read_examples(shared("glue", "RTE", "dev.tsv"))
    assert len(rte) == 277 and label_set(rte) == ["entailment", "not_entailment"]
    sts = read_examples(shared("glue", "STS-B", "dev.tsv"))
    assert len(sts) == 1500 and 0.0 <= float(sts[0].label) <= 5.0
    by_index = read_examples(shared("glue", "RTE", "dev.tsv"), Columns(text="1", pair="2", label="3"))
    assert [(e.text, e.pair, e.label) for e in by_index] == [(e.text, e.pair, e.label) for e in rte]


def test_csv_and_jsonl(tmp_path):
    (tmp_path / "a.csv").write_text('text,label\n"Hello, world",pos\nBad day,neg\n', encoding="utf-8")
    assert [(e.text, e.label) for e in read_examples(tmp_path / "a.csv")] == [("Hello, world", "pos"), ("Bad day", "neg")]
    (tmp_path / "a.jsonl").write_text('{"text": "x", "text_pair": "y", "label": 1}\n', encoding="utf-8")
    e = read_examples(tmp_path / "a.jsonl")[0]
    assert (e.text, e.pair, e.label) == ("x", "y", "1")


def test_malformed_rows(tmp_path):
    ragged = tmp_path / "r.tsv"
    ragged.write_text("sentence\tlabel\ngood\t1\nbad row\n", encoding="utf-8")
    with pytest.raises(InputError, match=r"r.tsv:3: 1 fields where the header has 2"):
        read_examples(ragged)
    missing = tmp_path / "m.tsv"
    missing.write_text("sentence\tstars\nok\t5\n", encoding="utf-8")
    with pytest.raises(InputError, match="m.tsv: cannot find the label column"):
        read_examples(missing)
    with pytest.raises(InputError, match="no label column 'rating'"):
        read_examples(missing, Columns(label="rating"))
    empty = tmp_path / "e.tsv"
    empty.write_text("", encoding="utf-8")
    with pytest.raises(InputError, match="e.tsv: empty"):
        read_examples(empty)


def test_truncation_strategies():
    ids = list(range(20))
    assert truncate_ids(ids, 8, "head") == list(range(8))
    assert truncate_ids(ids, 8, "tail") == list(range(12, 20))
    assert truncate_ids(ids, 8, "head+tail") == [0, 1, 14, 15, 16, 17, 18, 19]
    assert truncate_ids(ids[:5], 8, "tail") == ids[:5]


def test_label_alignment_on_words_split_into_many_pieces(minilm_dir):
    tok = Tokenizer.from_pretrained(minilm_dir)
    sentences = read_sentences(shared("conll2003", "valid.txt"))[:400]
    labels = sorted({t for s in sentences for t in s.tags})
    label2id = {t: i for i, t in enumerate(labels)}
    features = ner_features(sentences, tok, 128, label2id)
    multi_piece = 0
    for s, f in zip(sentences, features):
        enc = tok(s.tokens, is_split_into_words=True, truncation=True, max_length=128, return_word_ids=True)
        word_ids = enc["word_ids"]
        firsts = [i for i, w in enumerate(word_ids) if w is not None and (i == 0 or word_ids[i - 1] != w)]
        assert [f["labels"][i] for i in firsts] == [label2id[s.tags[word_ids[i]]] for i in firsts]
        assert all(f["labels"][i] == -100 for i in range(len(word_ids)) if i not in firsts)
        multi_piece += sum(1 for w in set(w for w in word_ids if w is not None) if word_ids.count(w) >= 3)
    assert multi_piece > 50  # many words really are split into 3+ pieces


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory, minilm_dir) -> Path:
    """A small random backbone with the real uncased vocabulary: fast to fine-tune in tests."""
    path = tmp_path_factory.mktemp("tiny")
    tok = Tokenizer.from_pretrained(minilm_dir)
    BertModel(BertConfig.from_preset("L2-H64", vocab_size=tok.vocab_size)).save_pretrained(path, tokenizer=tok)
    return path


def test_finetune_classify_end_to_end(tmp_path, tiny_checkpoint):
    train = slice_file(shared("glue", "RTE", "train.tsv"), tmp_path / "train.tsv", 65)
    dev = slice_file(shared("glue", "RTE", "dev.tsv"), tmp_path / "dev.tsv", 41)
    out = tmp_path / "out"
    result = cli("finetune", "classify", "--model", str(tiny_checkpoint), "--train", str(train), "--dev", str(dev),
                 "--out", str(out), "--epochs", "2", "--batch-size", "16", "--lr", "1e-3")
    assert result.returncode == 0, result.stderr
    results = json.loads((out / "eval_results.json").read_text())
    assert {"accuracy", "macro_f1", "f1", "mcc", "selected_step"} <= set(results)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert sum("eval_accuracy" in r for r in rows) == 2  # evaluated every epoch
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["BertForSequenceClassification"]
    assert config["id2label"] == {"0": "entailment", "1": "not_entailment"}
    transformers = pytest.importorskip("transformers")
    _, info = transformers.BertForSequenceClassification.from_pretrained(out, output_loading_info=True)
    assert not info["missing_keys"]
    again = cli("evaluate", "classify", "--model", str(out), "--data", str(dev), "--predictions", str(tmp_path / "p.jsonl"),
                "--json")
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["accuracy"] == pytest.approx(results["accuracy"])
    assert len((tmp_path / "p.jsonl").read_text().splitlines()) == 40
    # A model whose labels differ from the data's is refused, by name.
    sst = slice_file(shared("glue", "SST-2", "dev.tsv"), tmp_path / "sst.tsv", 30)
    refused = cli("finetune", "classify", "--model", str(out), "--train", str(sst), "--dev", str(sst),
                  "--out", str(tmp_path / "x"))
    assert refused.returncode == 2 and "labels (entailment, not_entailment) differ" in refused.stderr


def test_finetune_eval_every_config_file_and_exact_resume(tmp_path, tiny_checkpoint):
    """--eval-every, settings from a YAML file (flags win), and a SIGKILLed run resumed with --resume
    that exports bitwise the same selected model as an uninterrupted run."""
    from kill_utils import kill_after_checkpoint
    from safetensors.torch import load_file

    train = slice_file(shared("glue", "RTE", "train.tsv"), tmp_path / "train.tsv", 129)
    dev = slice_file(shared("glue", "RTE", "dev.tsv"), tmp_path / "dev.tsv", 41)
    config = tmp_path / "run.yaml"
    config.write_text(f"model: {tiny_checkpoint}\ntrain: {train}\ndev: {dev}\nbatch-size: 8\nlr: 1.0e-3\n"
                      "max_steps: 24\neval_every: 4\nsave_every: 2\nseed: 5\nepochs: 100\n"
                      + ("deterministic: true\n" if GPU_DETERMINISTIC else ""), encoding="utf-8")
    whole = tmp_path / "whole"
    result = cli("finetune", "classify", "--config", str(config), "--seed", "3", "--out", str(whole), "--json")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    saved = json.loads((whole / "run_config.json").read_text())
    assert saved["seed"] == 3 and saved["batch_size"] == 8 and saved["eval_every"] == 4  # the flag beat the file
    rows = [json.loads(line) for line in (whole / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "eval_accuracy" in r] == [4, 8, 12, 16, 20, 24]
    best = max((r for r in rows if "eval_accuracy" in r), key=lambda r: r["eval_accuracy"])  # first of ties
    assert summary["selected_step"] == best["step"] and summary["accuracy"] == best["eval_accuracy"]
    assert not (whole / "checkpoints").exists() and not (whole / "best").exists()

    killed = tmp_path / "killed"
    kill_after_checkpoint(["finetune", "classify", "--config", str(config), "--seed", "3", "--out", str(killed)],
                          killed / "checkpoints", "step-0000001*", seed=2, max_delay=0.3)
    resumed = cli("finetune", "classify", "--config", str(config), "--seed", "3", "--out", str(killed), "--resume",
                  "--json")
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout.strip().splitlines()[-1])["selected_step"] == summary["selected_step"]
    a, b = load_file(whole / "model.safetensors"), load_file(killed / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    # Config files are checked key by key.
    bad = tmp_path / "bad.json"
    bad.write_text('{"batch_size": "eight"}', encoding="utf-8")
    refused = cli("finetune", "classify", "--config", str(bad))
    assert refused.returncode == 2 and "bad.json: batch_size must be an integer" in refused.stderr
    bad.write_text('{"batchsize": 8}', encoding="utf-8")
    refused = cli("finetune", "classify", "--config", str(bad))
    assert refused.returncode == 2 and "bad.json: unknown key 'batchsize'; did you mean 'batch_size'?" in refused.stderr


def test_finetune_unseen_dev_label_and_output_protection(tmp_path, tiny_checkpoint):
    (tmp_path / "train.tsv").write_text("sentence\tlabel\na\tpos\nb\tneg\n", encoding="utf-8")
    (tmp_path / "dev.tsv").write_text("sentence\tlabel\nc\tpos\nd\tneutral\n", encoding="utf-8")
    result = cli("finetune", "classify", "--model", str(tiny_checkpoint), "--train", str(tmp_path / "train.tsv"),
                 "--dev", str(tmp_path / "dev.tsv"), "--out", str(tmp_path / "out"))
    assert result.returncode == 2 and "dev.tsv:3: label 'neutral' is not among the training labels" in result.stderr
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "keep.txt").write_text("mine")
    result = cli("finetune", "classify", "--model", str(tiny_checkpoint), "--train", str(tmp_path / "train.tsv"),
                 "--dev", str(tmp_path / "train.tsv"), "--out", str(tmp_path / "busy"))
    assert result.returncode == 2 and "--overwrite" in result.stderr
    assert [p.name for p in (tmp_path / "busy").iterdir()] == ["keep.txt"]


def test_finetune_regress_with_seeds(tmp_path, tiny_checkpoint):
    train = slice_file(shared("glue", "STS-B", "train.tsv"), tmp_path / "train.tsv", 49)
    dev = slice_file(shared("glue", "STS-B", "dev.tsv"), tmp_path / "dev.tsv", 41)
    out = tmp_path / "out"
    result = cli("finetune", "regress", "--model", str(tiny_checkpoint), "--train", str(train), "--dev", str(dev),
                 "--out", str(out), "--epochs", "1", "--batch-size", "16", "--seeds", "1,2")
    assert result.returncode == 0, result.stderr
    summary = json.loads((out / "eval_results.json").read_text())
    assert summary["seeds"] == [1, 2] and set(summary["pearson"]) == {"mean", "std"}
    assert json.loads((out / "seed-1" / "config.json").read_text())["problem_type"] == "regression"


def test_finetune_ner(tmp_path, tiny_checkpoint):
    train = slice_file(shared("conll2003", "train.txt"), tmp_path / "train.txt", 400)
    dev = slice_file(shared("conll2003", "valid.txt"), tmp_path / "dev.txt", 200)
    out = tmp_path / "out"
    result = cli("finetune", "ner", "--model", str(tiny_checkpoint), "--train", str(train), "--dev", str(dev),
                 "--out", str(out), "--epochs", "1", "--batch-size", "8")
    assert result.returncode == 0, result.stderr
    results = json.loads((out / "eval_results.json").read_text())
    assert {"precision", "recall", "f1"} <= set(results)
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["BertForTokenClassification"] and "B-PER" in config["label2id"]
    bad = tmp_path / "bad.txt"
    bad.write_text("EU B-ORG\nrejects O X\n", encoding="utf-8")
    result = cli("finetune", "ner", "--model", str(tiny_checkpoint), "--train", str(bad), "--dev", str(dev),
                 "--out", str(tmp_path / "x"))
    assert result.returncode == 2 and "bad.txt:2: 3 columns where the file has 2" in result.stderr


def test_every_training_example_is_seen_each_epoch():
    """10 examples in batches of 4: three micro-batches (4, 4, 2), each example exactly once."""
    from bertforge.tasks.base import FeatureTask

    train = [{"input_ids": [2, 10 + i, 3], "token_type_ids": [0, 0, 0], "labels": i % 2} for i in range(10)]
    task = FeatureTask(train, [], batch_size=4, seed=0, pad_id=0)
    assert task.micro_batches_per_epoch(0) == 3
    seen = [int(t) for i in range(3) for t in task.micro_batch(0, i)["input_ids"][:, 1]]
    assert sorted(seen) == list(range(10, 20))


def test_the_task_table_is_what_the_cli_and_finetune_read():
    """One table (tasks/table.py): every row's module builds, its settings class is the command's, and the CLI's
    finetune, distill and evaluate subcommands are exactly the table's rows; reading it imports no torch."""
    import importlib
    import subprocess
    import sys

    from bertforge.cli.commands import distill_app, evaluate_app, finetune_app
    from bertforge.tasks import TASKS

    def names(app):
        return {c.name for c in app.registered_commands}

    assert names(finetune_app) == set(TASKS)
    assert {n for n, spec in TASKS.items() if spec.distill} == names(distill_app) - {"mlm"}
    assert {n for n, spec in TASKS.items() if spec.evaluate} == names(evaluate_app) - {"retrieval", "rerank"}
    for name, spec in TASKS.items():
        assert callable(importlib.import_module(f"bertforge.tasks.{spec.module}").build), name
    done = subprocess.run([sys.executable, "-c", "import sys, bertforge.tasks; print('torch' in sys.modules)"],
                          capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"




def test_a_run_stopped_while_it_writes_its_results_resumes_to_the_same_directory(tmp_path, tiny_checkpoint,
                                                                                   monkeypatch):
    """A run killed after its model is written but before its curves, card and eval_results.json used to have
    removed its checkpoints already: `--resume` refused ("nothing to resume") and the directory stayed half-written.
    The checkpoints now go last, so the resume finishes the run (no step trained) with the uninterrupted run's files."""
    import bertforge.viz
    from safetensors.torch import load_file

    train = slice_file(shared("glue", "RTE", "train.tsv"), tmp_path / "train.tsv", 33)
    dev = slice_file(shared("glue", "RTE", "dev.tsv"), tmp_path / "dev.tsv", 17)

    def run(out: Path, *extra: str):
        return cli("finetune", "classify", "--model", str(tiny_checkpoint), "--train", str(train), "--dev", str(dev),
                   "--batch-size", "8", "--max-steps", "4", "--eval-every", "2", "--save-every", "2", "--seed", "1",
                   "--out", str(out), "--json", *extra)

    whole = run(tmp_path / "whole")
    assert whole.returncode == 0, whole.stderr
    plot = bertforge.viz.plot_curves

    def killed_here(*args, **kwargs):
        raise RuntimeError("the process was killed here")

    monkeypatch.setattr(bertforge.viz, "plot_curves", killed_here)
    stopped = run(tmp_path / "killed")
    assert stopped.returncode == 1 and "killed here" in stopped.stderr
    assert (tmp_path / "killed" / "model.safetensors").is_file()
    assert (tmp_path / "killed" / "checkpoints").is_dir() and not (tmp_path / "killed" / "eval_results.json").exists()
    monkeypatch.setattr(bertforge.viz, "plot_curves", plot)
    resumed = run(tmp_path / "killed", "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming at step 4" in resumed.stderr
    assert not (tmp_path / "killed" / "checkpoints").exists() and (tmp_path / "killed" / "curves.png").is_file()
    assert json.loads(resumed.stdout.strip().splitlines()[-1])["accuracy"] == json.loads(
        whole.stdout.strip().splitlines()[-1])["accuracy"]
    a, b = load_file(tmp_path / "whole" / "model.safetensors"), load_file(tmp_path / "killed" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    # Finished now: a second --resume changes nothing and says why.
    again = run(tmp_path / "killed", "--resume")
    assert again.returncode == 2 and "nothing to resume" in again.stderr
