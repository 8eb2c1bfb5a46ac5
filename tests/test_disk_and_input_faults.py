"""Right or refused, part 2: full and read-only disks, damaged files and odd inputs (issue: operator faults).

Each case runs the real CLI and checks the exit code, the one line it prints, and that nothing the user
had was lost or left half-written. The disk cases use a real small filesystem (a tmpfs, mounted as root
where the machine allows it, else skipped).
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from bertforge import BertConfig, BertForMaskedLM, BertForSequenceClassification, Tokenizer
from cli_utils import pretrain_args
from cli_utils import cli, snapshot
from disk_utils import small_disk


def one_line(result: subprocess.CompletedProcess, *words: str) -> str:
    """The single stderr line of a refusal (exit 2, no traceback) that holds every word. A run that fails
    mid-way has said what it was doing first (its precision, progress lines): those are not the refusal."""
    progress = ("precision: ", "train: ")
    lines = [line for line in result.stderr.strip().splitlines()
             if "Warning" not in line and not line.startswith(progress)]
    assert result.returncode == 2, result.stderr
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


# ------------------------------------------------------------------ disks
def test_a_full_disk_mid_run_names_the_intact_checkpoint_and_resumes_exactly(tmp_path, run_inputs):
    """Checkpoints of this model are ~2 MB: on a 5 MB disk the third cannot be written."""
    corpus, tok = run_inputs
    args = ("--max-steps", "40", "--save-every", "10", "--keep-last", "100")
    whole = tmp_path / "whole"
    assert cli(*pretrain_args(corpus, tok, whole, *args)).returncode == 0
    with small_disk(tmp_path, "5m") as disk:
        out = disk / "run"
        result = cli(*pretrain_args(corpus, tok, out, *args))
        line = one_line(result, "cannot write checkpoint step-00000030", "No space left on device",
                        "checkpoint step-00000020 is intact")
        assert line.startswith("bertforge: error: ")
        names = sorted(p.name for p in (out / "checkpoints").iterdir())
        assert names == ["step-00000010", "step-00000020"]  # no half-written or hidden temporary one left
        load_file(str(out / "checkpoints" / "step-00000020" / "model.safetensors"))
        torch.load(out / "checkpoints" / "step-00000020" / "training_state.pt", weights_only=True)
        subprocess.run(["mount", "-o", "remount,size=64m", str(disk)], check=True)  # the operator frees space
        resumed = cli(*pretrain_args(corpus, tok, out, *args, "--resume"))
        assert resumed.returncode == 0, resumed.stderr
        a, b = load_file(str(whole / "model.safetensors")), load_file(str(out / "model.safetensors"))
        assert all(bool((a[k] == b[k]).all()) for k in a)


def test_a_read_only_out_is_one_line(tmp_path, run_inputs):
    corpus, tok = run_inputs
    with small_disk(tmp_path, "1m", read_only=True) as disk:
        result = cli(*pretrain_args(corpus, tok, disk / "run", "--max-steps", "2"))
        one_line(result, str(disk / "run"), "Read-only file system")


def test_export_onto_a_full_disk_keeps_the_previous_export(tmp_path, run_inputs):
    pytest.importorskip("onnxruntime")
    model_dir = tmp_path / "model"
    BertForSequenceClassification(BertConfig.from_preset("L2-H64", vocab_size=300)).save_pretrained(
        model_dir, tokenizer=Tokenizer.from_pretrained(run_inputs[1]))
    with small_disk(tmp_path, "4m") as disk:
        out = disk / "model.onnx"
        assert cli("export", "onnx", "--model", str(model_dir), "--out", str(out)).returncode == 0
        before = snapshot(disk)
        assert {"model.onnx", "model.json", "tokenizer.json", "vocab.txt"} <= set(before)
        stats = os.statvfs(disk)
        room = stats.f_bavail * stats.f_frsize
        (disk / "filler").write_bytes(b"\0" * (room - out.stat().st_size // 3))  # less room than one more graph
        result = cli("export", "onnx", "--model", str(model_dir), "--out", str(out), "--overwrite")
        one_line(result, f"cannot write {out}", "No space left on device", "the previous model.onnx is intact")
        (disk / "filler").unlink()
        assert snapshot(disk) == before and sorted(p.name for p in disk.iterdir()) == sorted(before)


# ------------------------------------------------------------------ inputs
def classification_file(path: Path, rows: list[str], header: str = "sentence\tlabel") -> Path:
    path.write_text("\n".join([header, *rows]) + "\n", encoding="utf-8")
    return path


@pytest.fixture()
def tiny_model(tmp_path, run_inputs) -> Path:
    path = tmp_path / "model"
    BertForSequenceClassification(BertConfig.from_preset("L2-H64", vocab_size=300)).save_pretrained(
        path, tokenizer=Tokenizer.from_pretrained(run_inputs[1]))
    return path


def finetune(task: str, model: Path, train: Path, dev: Path, out: Path) -> subprocess.CompletedProcess:
    return cli("finetune", task, "--model", str(model), "--train", str(train), "--dev", str(dev), "--out", str(out),
               "--epochs", "1", "--batch-size", "4", "--seq-len", "32")


def test_an_empty_label_field_is_refused_by_line(tmp_path, tiny_model):
    """It used to become a third class "" (id2label {"0": "", ...}) without a word."""
    train = classification_file(tmp_path / "train.tsv", ["good film\t1", "bad film\t0", "fine film\t"])
    result = finetune("classify", tiny_model, train, train, tmp_path / "out")
    one_line(result, f"{train}:4: the label field 'label' is empty")
    assert not (tmp_path / "out" / "config.json").exists()


@pytest.mark.parametrize("where, value", [("train", "nan"), ("dev", "inf"), ("dev", "-Infinity")])
def test_non_finite_regression_labels_are_refused_by_line(tmp_path, tiny_model, where, value):
    good = classification_file(tmp_path / "good.tsv", ["a\t0.5", "b\t1.5", "c\t2.0"], "sentence\tscore")
    bad = classification_file(tmp_path / "bad.tsv", ["a\t0.5", f"b\t{value}", "c\t2.0"], "sentence\tscore")
    train, dev = (bad, good) if where == "train" else (good, bad)
    result = finetune("regress", tiny_model, train, dev, tmp_path / "out")
    one_line(result, f"{bad}:3: regression label '{value}' is not a finite number")


def test_squad_answers_that_miss_their_offsets_are_refused(tmp_path, tiny_model):
    """Offsets in bytes (here: every answer shifted) used to train on nothing but null targets, exit 0."""
    qas = [{"id": str(i), "question": "Where is Paris?", "answers": [{"text": "France", "answer_start": 13}]}
           for i in range(20)]
    squad = tmp_path / "train.json"
    squad.write_text(json.dumps({"version": "1.1", "data": [{"title": "t", "paragraphs": [
        {"context": "Paris is in France.", "qas": qas}]}]}))
    result = finetune("qa", tiny_model, squad, squad, tmp_path / "out")
    one_line(result, "20 of 20 answers (100.0%) do not match the context at their answer_start",
             "data[0].paragraphs[0].qas[0].answers[0]")


def test_a_tokenizer_larger_than_the_models_vocabulary_is_refused_before_training(tmp_path, run_inputs):
    """It used to start and fail when the first out-of-range id came up (hours in, on real data)."""
    model = tmp_path / "model"
    BertForSequenceClassification(BertConfig.from_preset("L2-H64", vocab_size=200)).save_pretrained(
        model, tokenizer=Tokenizer.from_pretrained(run_inputs[1]))  # 300 pieces, 200 embeddings
    train = classification_file(tmp_path / "train.tsv", ["good film\t1", "bad film\t0"])
    result = finetune("classify", model, train, train, tmp_path / "out")
    one_line(result, "gives ids up to 299", "embeds only 200 (vocab_size in its config.json)")
    assert not (tmp_path / "out").exists()


def test_a_truncated_gz_corpus_is_named_as_corrupt(tmp_path, run_inputs):
    """It used to end as "bertforge: interrupted", exit 130, as if Ctrl-C had been pressed."""
    corpus, tok = run_inputs
    whole = gzip.compress(corpus.read_bytes())
    cut = tmp_path / "corpus.txt.gz"
    cut.write_bytes(whole[: len(whole) // 2])
    result = cli(*pretrain_args(cut, tok, tmp_path / "run", "--max-steps", "2"))
    one_line(result, f"{cut}: corrupt or truncated gzip file after", "download or compress it again")
    bad_vocab = cli("tokenizer", "train", str(cut), "--out", str(tmp_path / "tok"), "--vocab-size", "200")
    one_line(bad_vocab, f"{cut}: corrupt or truncated gzip file after")


def test_non_finite_weights_are_refused_at_load_and_listed_by_inspect(tmp_path, run_inputs):
    """Bit rot used to give NaN vectors (invalid JSON) with exit 0, and inspect called the checkpoint fine."""
    model = tmp_path / "model"
    BertForMaskedLM(BertConfig.from_preset("L2-H64", vocab_size=300)).save_pretrained(
        model, tokenizer=Tokenizer.from_pretrained(run_inputs[1]))
    weights = load_file(str(model / "model.safetensors"))
    name = "bert.encoder.layer.1.attention.self.query.weight"
    weights[name][3, :5] = float("nan")
    weights[name][4, 0] = float("inf")
    save_file(weights, str(model / "model.safetensors"), metadata={"format": "pt"})
    result = cli("predict", "embed", "--model", str(model), "a sentence")
    one_line(result, "1 tensor(s) hold NaN or infinite values", f"{name} (6 values)")
    assert result.stdout == ""
    report = cli("inspect", str(model))
    assert report.returncode == 1 and f"NON-FINITE    {name} (6 NaN/inf values)" in report.stdout, report.stdout
    as_json = cli("inspect", str(model), "--json")
    assert json.loads(as_json.stdout)["non_finite"] == {name: 6}


def test_a_mask_past_the_models_length_is_refused(tmp_path, run_inputs):
    """It used to answer exit 0 with "predictions": []."""
    model = tmp_path / "model"
    config = BertConfig.from_preset("L2-H64", vocab_size=300, max_position_embeddings=64)
    BertForMaskedLM(config).save_pretrained(model, tokenizer=Tokenizer.from_pretrained(run_inputs[1]))
    text = "alpha " * 80 + "[MASK] ."
    result = cli("predict", "fill-mask", "--model", str(model), text)
    one_line(result, "input 1: a [MASK] is token 82 of 84, past the 64 tokens the model reads")
    assert cli("predict", "fill-mask", "--model", str(model), "alpha [MASK] beta").returncode == 0


def test_results_with_non_finite_metrics_are_valid_json(tmp_path):
    """Pearson of a constant prediction is NaN: it is written as null, never as the bare word NaN."""
    from bertforge.jsonfile import dumps

    text = dumps({"pearson": float("nan"), "rows": [1.0, float("inf")], "name": "x"})
    assert json.loads(text) == {"pearson": None, "rows": [1.0, None], "name": "x"}


@pytest.mark.parametrize("module", ["parity", "family_parity"])
def test_benchmarks_say_which_data_they_need(module):
    """--help answers without touching data; a missing file is one line naming it, not a traceback."""
    import sys

    helped = subprocess.run([sys.executable, "-m", f"benchmarks.{module}", "--help"], capture_output=True, text=True,
                            timeout=300)
    assert helped.returncode == 0 and "reads " in helped.stdout and "shared/data" in helped.stdout, helped.stderr
    missing = subprocess.run([sys.executable, "-m", f"benchmarks.{module}"], capture_output=True, text=True, timeout=300,
                             env={**os.environ, "BERTFORGE_BENCHMARK_DATA": "/nowhere"})
    assert missing.returncode == 1 and "Traceback" not in missing.stderr, missing.stderr
    assert missing.stderr.startswith("benchmark data not found: /nowhere/"), missing.stderr
    assert "this benchmark reads it in place from ../shared/data" in missing.stderr, missing.stderr


def test_a_second_prepare_of_one_out_is_refused_by_name(tmp_path, run_inputs):
    """prepare writes OUT.partial and renames it: two at once would delete each other's partial output."""
    import sys
    import time

    corpus, tok = run_inputs
    out = tmp_path / "prepared"
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from pathlib import Path; "
                               "from bertforge.lockfile import lock_beside; lock_beside(Path(sys.argv[1])); "
                               "print('held', flush=True); time.sleep(60)", str(out)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        result = cli("prepare", str(corpus), "--tokenizer", str(tok), "--out", str(out), "--workers", "1")
        one_line(result, f"{out}: in use by another bertforge run (pid {holder.pid} on ")
        assert not out.exists() and not out.with_name(out.name + ".partial").exists()
    finally:
        holder.kill()
        holder.wait()
    time.sleep(0.1)
    assert cli("prepare", str(corpus), "--tokenizer", str(tok), "--out", str(out), "--workers", "1").returncode == 0
    assert (out / "meta.json").is_file()


def test_a_refusal_deep_inside_a_checkpoint_names_the_intact_checkpoint(tmp_path):
    """The model file of a checkpoint is itself written atomically; its refusal must not hide which checkpoint
    survived (it used to name only the temporary file)."""
    from bertforge.safefiles import WriteRefused
    from bertforge.training.checkpoint import save_checkpoint

    root = tmp_path / "checkpoints"
    save_checkpoint(root, 1, lambda folder: (folder / "model.safetensors").write_bytes(b"ok"), {})

    def full_disk(folder: Path) -> None:
        raise WriteRefused(f"cannot write {folder}/model.safetensors: No space left on device; nothing was written "
                           "there", "No space left on device")

    with pytest.raises(WriteRefused, match=r"cannot write checkpoint step-00000002 in .*: No space left on device; "
                                           r"checkpoint step-00000001 is intact"):
        save_checkpoint(root, 2, full_disk, {})
    assert sorted(p.name for p in root.iterdir()) == ["step-00000001"]
