"""The bugs found on first use, each now either handled right or refused in one line with exit code 2.

- saved models are readable by others (the umask decides, not mkstemp's 0600);
- a bad flag value is one line and exit 2, never a traceback;
- a model used for a task its head cannot do is refused by its `architectures`, for every task;
- what `evaluate --predictions` writes, `score` reads;
- `/classify` takes pairs, and every endpoint refuses fields it does not know;
- a missing optional library names the extra to install.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bertforge import BertForSequenceClassification, Tokenizer
from bertforge.errors import CheckpointError
from bertforge.inference.predict import run_predict

from conftest import REPO, SENTENCES
from cli_utils import sentences_tsv, cli, one_line_refusal
import functools


# Run from the repo root, as a user in their checkout would.
in_repo = functools.partial(cli, cwd=REPO)


def test_saved_files_follow_the_umask(tmp_path, checkpoints):
    old = os.umask(0o022)
    try:
        BertForSequenceClassification.from_pretrained(checkpoints["classifier"]).save_pretrained(tmp_path / "m")
    finally:
        os.umask(old)
    for name in ("config.json", "model.safetensors"):
        assert stat.S_IMODE((tmp_path / "m" / name).stat().st_mode) == 0o644, name


@pytest.mark.parametrize("command", ["pretrain", "finetune classify"])
def test_bad_duration_is_one_line(command):
    one_line_refusal(in_repo(*command.split(), "--time-budget", "abc"), "--time-budget", "abc")


@pytest.mark.parametrize("args, fragments", [
    (["pretrain", "--lr", "nan"], ["--lr", "not a finite number"]),
    (["finetune", "classify", "--bogus", "3"], ["No such option: --bogus"]),
    (["finetune", "classify", "--epoch", "3"], ["No such option: --epoch", "Possible options: --epochs"]),
    (["inspect"], ["Missing argument 'PATH'"]),
    (["predict", "clasify", "--model", "x"], ["'clasify' is not one of"]),
    (["serve", "--model", "x", "--port", "eighty"], ["--port", "valid integer"]),
])
def test_usage_errors_are_one_line_naming_the_command(args, fragments):
    result = in_repo(*args)
    one_line_refusal(result, *fragments)
    assert result.stderr.startswith("bertforge " + args[0]) and f"(see bertforge {args[0]}" in result.stderr


@pytest.mark.parametrize("model,task", [("classifier", "ner"), ("classifier", "qa"), ("classifier", "fill-mask"),
                                        ("tagger", "classify"), ("reader", "classify"), ("tagger", "qa")])
def test_a_head_the_model_lacks_is_refused(checkpoints, model, task):
    item = {"question": "who?", "context": "a good film"} if task == "qa" else "a good [MASK]"
    with pytest.raises(CheckpointError, match=f"no head for {task}"):
        list(run_predict(task, str(checkpoints[model]), [item]))


def test_predict_and_evaluate_refuse_from_the_cli(tmp_path, checkpoints):
    one_line_refusal(in_repo("predict", "ner", "--model", str(checkpoints["classifier"]), "a good film"),
                     "BertForSequenceClassification", "BertForTokenClassification")
    conll = tmp_path / "dev.conll"
    conll.write_text("john B-PER\nlives O\n\n")
    one_line_refusal(in_repo("evaluate", "ner", "--model", str(checkpoints["classifier"]), "--data", str(conll)),
                     "no head for ner")


def evaluate_then_score(task: str, model: Path, data: Path, predictions: Path, scorer: str, metric: str) -> None:
    """`evaluate --predictions`, then `score` on the file it wrote: the same metric, to the last digit."""
    evaluated = in_repo("evaluate", task, "--model", str(model), "--data", str(data), "--predictions",
                              str(predictions), "--json")
    assert evaluated.returncode == 0, evaluated.stderr
    scored = in_repo("score", scorer, str(data), str(predictions), "--json")
    assert scored.returncode == 0, scored.stderr
    assert json.loads(scored.stdout)[metric] == pytest.approx(json.loads(evaluated.stdout)[metric])


def test_score_reads_what_evaluate_writes(tmp_path, checkpoints):
    dev = tmp_path / "dev.tsv"
    dev.write_text("sentence\tlabel\n" + "".join(f"{s}\t{i % 2}\n" for i, s in enumerate(SENTENCES)))
    evaluate_then_score("classify", checkpoints["classifier"], dev, tmp_path / "pred.jsonl", "classification",
                        "accuracy")
    conll = tmp_path / "dev.conll"
    conll.write_text("john B-PER\nlives O\nin O\nparis B-LOC\n. O\n\nparis B-LOC\nis O\nfine O\n")
    evaluate_then_score("ner", checkpoints["tagger"], conll, tmp_path / "tags.jsonl", "ner", "f1")


def test_score_refuses_files_it_cannot_read_rightly(tmp_path):
    gold = tmp_path / "gold.tsv"
    gold.write_text("#1 String\t#2 String\tQuality\na\tb\t1\nc\td\t0\n")
    unnamed = tmp_path / "unnamed.tsv"
    unnamed.write_text("x\ty\n1\t0\n0\t1\n")
    one_line_refusal(in_repo("score", "classification", str(gold), str(unnamed)), "which column")
    names = tmp_path / "names.txt"
    names.write_text("positive\nnegative\n")
    one_line_refusal(in_repo("score", "classification", str(gold), str(names)), "none of its labels")


def test_missing_optional_dependency_names_the_extra(checkpoints):
    code = ("import sys; sys.modules['fastapi'] = None; from bertforge.cli import main; "
            f"sys.exit(main(['serve', '--model', {str(checkpoints['classifier'])!r}]))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    one_line_refusal(result, 'pip install "bertforge[serve]"', "fastapi")


def test_classify_endpoint_takes_pairs_and_refuses_unknown_fields(checkpoints):
    pytest.importorskip("fastapi")
    from server_utils import call, running_server

    from bertforge.inference.pipelines import classify

    model = BertForSequenceClassification.from_pretrained(checkpoints["classifier"])
    tok = Tokenizer.from_pretrained(checkpoints["classifier"])
    texts, pairs = SENTENCES[:3], SENTENCES[3:]
    want_pairs = classify(model, tok, texts, pairs)
    want_single = classify(model, tok, texts)
    assert want_pairs != want_single  # the pair changes the answer, so dropping it would be seen
    with running_server(checkpoints["classifier"]) as (port, _):
        status, body = call(port, "/classify", {"texts": texts, "text_pairs": pairs})
        assert status == 200
        for got, want in zip(body["results"], want_pairs):
            assert got["label"] == want["label"] and got["score"] == pytest.approx(want["score"], abs=1e-5)
        status, body = call(port, "/classify", {"texts": texts})
        assert status == 200 and [r["label"] for r in body["results"]] == [r["label"] for r in want_single]
        for path, bad in (("/classify", {"texts": texts, "text_pair": pairs}),  # a typo'd field name
                          ("/classify", {"texts": texts, "text_pairs": pairs[:1]}),
                          ("/embed", {"texts": texts, "text_pairs": pairs}),
                          ("/embed", {"texts": texts, "normalize": True})):
            status, body = call(port, path, bad)
            assert status == 422, (path, bad, body)
        assert call(port, "/health")[0] == 200


@pytest.mark.parametrize("model_type", ["roberta", "deberta-v2", "modernbert"])
def test_a_config_naming_another_family_is_refused_not_run_on_random_weights(tmp_path, checkpoints, model_type):
    """A BERT directory whose config.json says another family's model_type: `predict embed` used to print an
    embedding from a random backbone (exit 0, a warning). Now one line says whose weights the file holds."""
    import shutil

    folder = tmp_path / "relabelled"
    shutil.copytree(checkpoints["classifier"], folder)
    config = json.loads((folder / "config.json").read_text())
    config["model_type"] = model_type
    (folder / "config.json").write_text(json.dumps(config))
    result = in_repo("predict", "embed", "--model", str(folder), "a good film")
    assert result.returncode == 2 and result.stdout == "", result.stdout
    one_line_refusal(result, str(folder))
    if model_type == "roberta":  # BERT's config fields are RoBERTa's: the weights are what is refused
        assert "config.json says roberta, but none of the roberta backbone's" in result.stderr
        assert "tensors are in model.safetensors: it holds bert's" in result.stderr


def test_a_seq_len_past_the_positions_is_refused_by_finetune_distill_and_evaluate(tmp_path, checkpoints):
    """A 64-position model: --seq-len 100000 used to train with rows cut at 64 while run_config.json said 100000."""
    data = sentences_tsv(tmp_path / "train.tsv")
    model = str(checkpoints["classifier"])
    for command in (["finetune", "classify", "--model", model, "--out", str(tmp_path / "ft")],
                    ["distill", "classify", "--teacher", model, "--student-layers", "1", "--out", str(tmp_path / "ds")],
                    ["evaluate", "classify", "--model", model, "--data", str(data)]):
        extra = [] if command[0] == "evaluate" else ["--train", str(data), "--dev", str(data), "--epochs", "1"]
        result = in_repo(*command, *extra, "--seq-len", "100000")
        one_line_refusal(result, "--seq-len 100000 exceeds the 64 positions")
    assert not (tmp_path / "ft").exists() and not (tmp_path / "ds").exists()


def test_finetune_refuses_a_tokenizer_whose_vocabulary_is_not_the_checkpoints(tmp_path, checkpoints):
    """Another vocabulary of ids the model embeds: its embeddings would be trained under ids that name other tokens."""
    other = Tokenizer.train(texts=["some other words entirely", "nothing like the first"] * 5, vocab_size=60,
                            min_frequency=1)
    other.save(tmp_path / "other-tok")
    data = sentences_tsv(tmp_path / "train.tsv")
    result = in_repo("finetune", "classify", "--model", str(checkpoints["classifier"]), "--tokenizer",
                           str(tmp_path / "other-tok"), "--train", str(data), "--dev", str(data), "--epochs", "1",
                           "--out", str(tmp_path / "ft"))
    one_line_refusal(result, "its vocabulary is not the checkpoint's")
    assert not (tmp_path / "ft").exists()
