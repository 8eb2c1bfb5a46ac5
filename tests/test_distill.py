"""`bertforge distill`: the student's layers, the loss and its temperature, the teacher's outputs cache, and a
run end to end (tiny models, a slice of SST-2; offline)."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F
from conftest import GPU_DETERMINISTIC, perturbed, shared
from cli_utils import cli as run, slice_file

from bertforge.errors import BertforgeError, ConfigError
from bertforge.models.config import BertConfig
from bertforge.models.heads import BertForSequenceClassification
from bertforge.settings import DistillConfig
from bertforge.tasks.classification import ClassificationTask
from bertforge.models.distillation import cut_down, student_layers
from bertforge.training.distill import DistillationTask, cache_mib, soft_loss, teacher_outputs


@pytest.mark.parametrize("spec, layers, expected", [
    (None, 6, [0, 2, 4]), (None, 12, [0, 2, 4, 6, 8, 10]), ("3", 6, [0, 2, 4]), ("2", 6, [0, 3]),
    ("4", 12, [0, 3, 6, 9]), ("0,5", 6, [0, 5]), ("1", 2, [0]),
])
def test_student_layers(spec, layers, expected):
    assert student_layers(spec, layers) == expected


@pytest.mark.parametrize("spec, message", [("6", "keep between 1 and 5"), ("2,1", "increasing indices"),
                                           ("0,6", "increasing indices"), ("x", "a count or comma-separated")])
def test_student_layers_refused(spec, message):
    with pytest.raises(ConfigError, match=message):
        student_layers(spec, 6)


def classifier(layers: int = 4) -> BertForSequenceClassification:
    torch.manual_seed(0)
    config = BertConfig(vocab_size=60, hidden_size=32, num_hidden_layers=layers, num_attention_heads=2,
                        intermediate_size=40, max_position_embeddings=32, id2label={0: "neg", 1: "pos"},
                        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    return perturbed(BertForSequenceClassification(config))


def test_the_cut_down_student_is_the_teacher_s_chosen_layers():
    """Kept layers carry the teacher's weights, renumbered; everything else (embeddings, pooler, classifier) is
    the teacher's. Keeping every layer gives the teacher's outputs."""
    teacher = classifier()
    student = cut_down(teacher, [0, 3])
    assert student.config.num_hidden_layers == 2 and teacher.config.num_hidden_layers == 4
    ours, theirs = student.state_dict(), teacher.state_dict()
    assert torch.equal(ours["bert.layers.1.ffn.up.weight"], theirs["bert.layers.3.ffn.up.weight"])
    assert torch.equal(ours["classifier.weight"], theirs["classifier.weight"])
    assert torch.equal(ours["bert.embeddings.word.weight"], theirs["bert.embeddings.word.weight"])
    assert ours["bert.layers.0.ffn.up.weight"].data_ptr() != theirs["bert.layers.0.ffn.up.weight"].data_ptr()
    ids = torch.randint(3, 60, (2, 9))
    with torch.no_grad():
        torch.testing.assert_close(cut_down(teacher, [0, 1, 2, 3]).eval()(ids).logits, teacher(ids).logits)


def test_albert_cannot_be_cut_down():
    from bertforge.models.albert import AlbertConfig, AlbertForSequenceClassification

    model = AlbertForSequenceClassification(AlbertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=4,
                                                         num_attention_heads=2, intermediate_size=40,
                                                         embedding_size=16))
    with pytest.raises(BertforgeError, match="ALBERT shares one block"):
        cut_down(model, [0, 2])


def small_task(features, regression: bool = False) -> ClassificationTask:
    return ClassificationTask(features, features[:4], 4, 0, 0, id2label={0: "neg", 1: "pos"}, regression=regression)


def features(n: int = 10, regression: bool = False) -> list[dict]:
    g = torch.Generator().manual_seed(1)
    out = []
    for i in range(n):
        ids = [1, *torch.randint(3, 60, (3 + i % 5,), generator=g).tolist(), 2]
        out.append({"input_ids": ids, "token_type_ids": [0] * len(ids), "labels": float(i % 3) if regression else i % 2})
    return out


def test_teacher_outputs_are_cached_in_feature_order():
    teacher = classifier().eval()
    task = small_task(features())
    cached = teacher_outputs(teacher, task, "classify")
    assert len(cached) == 10 and cached[0].shape == (2,)
    for i in (0, 3, 9):
        ids = torch.tensor([task.train[i]["input_ids"]])
        with torch.no_grad():
            torch.testing.assert_close(cached[i], teacher(ids).logits[0], atol=1e-5, rtol=0)


def test_loss_mixes_temperature_scaled_soft_targets_and_gold_labels():
    """alpha 0 is fine-tuning's loss; alpha 1 is T^2 KL between the softened distributions; a student equal to
    its teacher has no soft loss; the batch carries each row's own teacher outputs."""
    teacher, student = classifier().eval(), classifier(2).train()
    task = small_task(features())
    cached = teacher_outputs(teacher, task, "classify")
    for alpha, T in ((0.0, 2.0), (1.0, 2.0), (1.0, 4.0), (0.3, 1.0)):
        distilled = DistillationTask(task, "classify", T, alpha, cached=cached)
        batch = distilled.micro_batch(0, 1)
        rows = distilled.epoch_order(0)[4:8]
        assert torch.equal(batch["teacher_logits"], torch.stack([cached[int(r)] for r in rows]))
        t = batch["teacher_logits"].clone()
        torch.manual_seed(0)
        loss, parts = distilled.loss(student, dict(batch))
        inputs = {k: v for k, v in batch.items() if k != "teacher_logits"}
        torch.manual_seed(0)
        out = student(**inputs)
        p, log_q = F.softmax(t / T, -1), F.log_softmax(out.logits / T, -1)
        kl = (p * (p.log() - log_q)).sum(-1).mean() * T * T
        torch.testing.assert_close(parts["soft_loss"], kl.detach(), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(loss, alpha * kl + (1 - alpha) * out.loss, atol=1e-5, rtol=1e-5)
    same = DistillationTask(task, "classify", 2.0, 1.0, cached=cached)
    loss, _ = same.loss(teacher, dict(same.micro_batch(0, 0)))
    assert abs(float(loss.detach())) < 1e-5


def test_regression_distils_with_mean_squared_error():
    teacher, student = classifier().eval(), classifier(2).train()
    for m in (teacher, student):
        m.config.num_labels = 1
        m.classifier = torch.nn.Linear(32, 1)
    task = small_task(features(regression=True), regression=True)
    distilled = DistillationTask(task, "regress", 2.0, 1.0, cached=teacher_outputs(teacher, task, "regress"))
    batch = distilled.micro_batch(0, 0)
    t = batch["teacher_logits"].clone()
    loss, _ = distilled.loss(student, dict(batch))
    with torch.no_grad():
        out = student.eval()(**{k: v for k, v in batch.items() if k not in ("teacher_logits", "labels")})
    assert math.isclose(float(loss.detach()), float(F.mse_loss(out.logits, t)), rel_tol=1e-4)


# ----------------------------------------------------------------------------- per-token tasks: ner and qa
def token_model(kind: str, layers: int = 4):
    from bertforge.models.heads import BertForQuestionAnswering, BertForTokenClassification

    torch.manual_seed(0)
    labels = {0: "O", 1: "B-X", 2: "I-X"} if kind == "ner" else None
    config = BertConfig(vocab_size=60, hidden_size=32, num_hidden_layers=layers, num_attention_heads=2,
                        intermediate_size=40, max_position_embeddings=32, hidden_dropout_prob=0.0,
                        attention_probs_dropout_prob=0.0, id2label=labels, num_labels=3 if labels else 2)
    cls = BertForTokenClassification if kind == "ner" else BertForQuestionAnswering
    return perturbed(cls(config))


def token_task(kind: str):
    """Features of varied lengths: ner labels at some tokens (-100 at the rest), qa start/end positions."""
    from bertforge.tasks.base import FeatureTask

    g = torch.Generator().manual_seed(2)
    rows = []
    for i in range(10):
        n = 4 + i % 6
        ids = [1, *torch.randint(3, 60, (n - 2,), generator=g).tolist(), 2]
        row = {"input_ids": ids, "token_type_ids": [0] * n}
        if kind == "ner":
            row["labels"] = [-100 if j in (0, n - 1) or j % 3 == 2 else (i + j) % 3 for j in range(n)]
        else:
            row.update(start_positions=1 + i % (n - 2), end_positions=n - 2)
        rows.append(row)
    return FeatureTask(rows, rows[:4], 4, 0, 0)


@pytest.mark.parametrize("kind", ["ner", "qa"])
def test_per_token_soft_targets_cached_and_on_the_fly_agree(kind):
    """The cache keeps one row per real token of each feature; a batch built from it gives the loss the teacher
    gives when it runs on the batch; a student equal to its teacher has no soft loss."""
    teacher, student = token_model(kind).eval(), token_model(kind, 2).train()
    task = token_task(kind)
    cached = teacher_outputs(teacher, task, kind)
    assert [c.shape[0] for c in cached] == [len(f["input_ids"]) for f in task.train]
    assert cached[0].shape[1] == (3 if kind == "ner" else 2)
    assert cache_mib(task.train, kind, 3) == pytest.approx(sum(c.numel() for c in cached) * 4 / 2**20)
    for alpha in (1.0, 0.4):
        a = DistillationTask(task, kind, 2.0, alpha, cached=cached)
        b = DistillationTask(task, kind, 2.0, alpha, teacher=token_model(kind).eval())
        for index in range(a.micro_batches_per_epoch(0)):
            with_cache, on_the_fly = a.micro_batch(0, index), b.micro_batch(0, index)
            assert "teacher_logits" in with_cache and "teacher_logits" not in on_the_fly
            torch.testing.assert_close(a.loss(student, with_cache)[0], b.loss(student, on_the_fly)[0],
                                       atol=1e-5, rtol=1e-5)
    same = DistillationTask(task, kind, 2.0, 1.0, cached=cached)
    assert abs(float(same.loss(token_model(kind).eval(), same.micro_batch(0, 1))[0].detach())) < 1e-5


def test_ner_soft_loss_reads_only_the_scored_tokens():
    """T^2 KL averaged over the tokens whose labels are not -100; what the teacher says elsewhere is not read."""
    T = 3.0
    student, teacher = torch.randn(2, 5, 3), torch.randn(2, 5, 3)
    labels = torch.tensor([[-100, 1, -100, 0, -100], [-100, 2, 2, -100, -100]])
    batch = {"labels": labels, "attention_mask": torch.ones(2, 5, dtype=torch.long)}
    scored = labels != -100
    p, log_q = F.softmax(teacher[scored] / T, -1), F.log_softmax(student[scored] / T, -1)
    expected = (p * (p.log() - log_q)).sum(-1).mean() * T * T
    torch.testing.assert_close(soft_loss("ner", student, teacher, batch, T), expected)
    elsewhere = teacher.clone()
    elsewhere[~scored] = 100.0
    torch.testing.assert_close(soft_loss("ner", student, elsewhere, batch, T), expected)


def test_qa_soft_loss_is_over_each_window_s_real_tokens():
    """The start and the end distributions, each a softmax over the row's real tokens, T^2 KL averaged; padding
    takes no probability in either model."""
    T = 2.0
    student, teacher = torch.randn(2, 6, 2), torch.randn(2, 6, 2)
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]])
    terms = []
    for i, n in enumerate((6, 4)):
        for end in (0, 1):
            p, log_q = F.softmax(teacher[i, :n, end] / T, -1), F.log_softmax(student[i, :n, end] / T, -1)
            terms.append((p * (p.log() - log_q)).sum() * T * T)
    got = soft_loss("qa", student, teacher, {"attention_mask": mask}, T)
    torch.testing.assert_close(got, torch.stack(terms).mean())
    teacher[1, 4:] = 50.0
    torch.testing.assert_close(soft_loss("qa", student, teacher, {"attention_mask": mask}, T), got)


@pytest.mark.parametrize("args, message", [
    ({"student_layers": "2", "model": "tiny"}, "give one of the two"),
    ({"teacher_cache_mb": -1.0}, "0 or more"),
    ({"pack": True}, "not supported by distill"),
    ({"temperature": 0.0}, "must be positive"),
    ({"alpha": 1.5}, "within \\[0, 1\\]"),
])
def test_settings_are_checked(args, message):
    with pytest.raises(ConfigError, match=message):
        DistillConfig(**{"task": "classify", "teacher": "t", "train": "a", "dev": "b", **args})


def test_distill_classify_end_to_end(tmp_path, minilm_dir):
    """A 4-layer teacher fine-tuned on a slice of SST-2, distilled into its layers 0 and 2: the student's directory
    loads in transformers, and the results name both models' scores, sizes and speeds."""
    from bertforge import BertModel, Tokenizer

    tok = Tokenizer.from_pretrained(minilm_dir)
    base = tmp_path / "base"
    BertModel(BertConfig.from_preset("L4-H64", vocab_size=tok.vocab_size)).save_pretrained(base, tokenizer=tok)
    train = slice_file(shared("glue", "SST-2", "train.tsv"), tmp_path / "train.tsv", 129)
    dev = slice_file(shared("glue", "SST-2", "dev.tsv"), tmp_path / "dev.tsv", 41)
    teacher = tmp_path / "teacher"
    done = run("finetune", "classify", "--model", str(base), "--train", str(train), "--dev", str(dev), "--out",
               str(teacher), "--epochs", "1", "--batch-size", "16", "--lr", "1e-3")
    assert done.returncode == 0, done.stderr
    out = tmp_path / "student"
    result = run("distill", "classify", "--teacher", str(teacher), "--train", str(train), "--dev", str(dev), "--out",
                 str(out), "--epochs", "1", "--batch-size", "16", "--lr", "1e-3", "--json")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["student_layers"] == 2 and summary["teacher"]["layers"] == 4
    assert summary["student_parameters"] < summary["teacher"]["parameters"]
    assert summary["student_of_teacher"] == pytest.approx(summary["accuracy"] / summary["teacher"]["accuracy"], abs=1e-3)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert any("soft_loss" in r and "gold_loss" in r for r in rows)
    transformers = pytest.importorskip("transformers")
    model, info = transformers.BertForSequenceClassification.from_pretrained(out, output_loading_info=True)
    assert not info["missing_keys"] and model.config.num_hidden_layers == 2
    refused = run("distill", "classify", "--teacher", str(base), "--train", str(train), "--dev", str(dev),
                  "--out", str(tmp_path / "x"))
    assert refused.returncode != 0 and "Traceback" not in refused.stderr and str(base) in refused.stderr


# ----------------------------------------------------------------------------- task-agnostic: distill mlm
def bert_mlm(layers: int = 4):
    from bertforge.models.heads import BertForMaskedLM

    torch.manual_seed(0)
    config = BertConfig(vocab_size=60, hidden_size=32, num_hidden_layers=layers, num_attention_heads=2,
                        intermediate_size=40, max_position_embeddings=32, hidden_dropout_prob=0.0,
                        attention_probs_dropout_prob=0.0)
    return perturbed(BertForMaskedLM(config))


def test_a_cut_down_bert_becomes_a_distilbert_computing_the_same(tmp_path):
    """The segment embedding's first row folds into the positions: on one-segment input the DistilBERT gives the
    BERT's numbers, and transformers reads it as DistilBertForMaskedLM with the same logits."""
    from bertforge.models.distillation import as_distilbert

    student = cut_down(bert_mlm(), [0, 2])
    distil = as_distilbert(student).eval()
    ids = torch.randint(3, 60, (2, 11))
    with torch.no_grad():
        torch.testing.assert_close(distil(ids).logits, student(ids).logits, atol=1e-5, rtol=0)
    distil.save_pretrained(tmp_path)
    transformers = pytest.importorskip("transformers")
    theirs, info = transformers.DistilBertForMaskedLM.from_pretrained(tmp_path, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    with torch.no_grad():
        torch.testing.assert_close(theirs.eval()(input_ids=ids).logits, student(ids).logits, atol=1e-5, rtol=0)


def test_masked_lm_distillation_loss_and_frozen_teacher():
    from bertforge.models.distillation import MaskedLMDistillation

    teacher = bert_mlm()
    ids = torch.randint(3, 60, (3, 12))
    labels = torch.full_like(ids, -100)
    labels[:, 2:10:3] = ids[:, 2:10:3]
    same = MaskedLMDistillation(cut_down(teacher, [0, 1, 2, 3]), teacher, 2.0, (5.0, 2.0, 1.0)).train()
    out = same(ids, labels=labels)
    assert abs(float(out.soft_loss.detach())) < 1e-5 and abs(float(out.cos_loss.detach())) < 1e-5
    assert not teacher.training and all(not p.requires_grad for p in teacher.parameters())
    pair = MaskedLMDistillation(cut_down(teacher, [0, 2]), teacher, 2.0, (5.0, 2.0, 1.0)).train()
    out = pair(ids, labels=labels)
    out.loss.backward()
    assert all(p.grad is None for p in teacher.parameters())
    assert all(p.grad is not None for p in pair.student.parameters() if p.requires_grad)
    torch.testing.assert_close(out.loss, 5 * out.soft_loss + 2 * out.mlm_loss + out.cos_loss)
    assert set(pair.checkpoint_parts()) == {""} and pair.num_parameters() < teacher.num_parameters()


def test_distill_mlm_end_to_end_with_exact_resume(tmp_path):
    """`distill mlm` on a small corpus: a DistilBERT student that transformers loads, every loss part logged, a
    SIGKILLed run resumed bitwise equal to an uninterrupted one, and the student fine-tunes."""
    import subprocess
    import sys

    from corpus_utils import write_corpus
    from kill_utils import kill_after_checkpoint
    from safetensors.torch import load_file

    from bertforge import BertForMaskedLM, Tokenizer

    corpus = write_corpus(tmp_path / "corpus.txt", n_docs=80, seed=3)
    tok = Tokenizer.train([corpus], vocab_size=300, min_frequency=1)
    teacher = tmp_path / "teacher"
    torch.manual_seed(0)
    BertForMaskedLM(BertConfig.from_preset("L4-H64", vocab_size=tok.vocab_size)).save_pretrained(teacher, tokenizer=tok)
    args = ["distill", "mlm", str(corpus), "--teacher", str(teacher), "--seq-len", "32", "--batch-size", "8",
            "--max-steps", "8", "--save-every", "2", "--eval-every", "8", "--precision", "fp32", "--workers", "1",
            *GPU_DETERMINISTIC]
    env = {"PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1"}
    whole = tmp_path / "whole"
    done = subprocess.run([sys.executable, "-m", "bertforge", *args, "--out", str(whole), "--json"],
                          capture_output=True, text=True, env={**__import__("os").environ, **env}, timeout=600)
    assert done.returncode == 0, done.stderr
    config = json.loads((whole / "config.json").read_text())
    assert config["architectures"] == ["DistilBertForMaskedLM"] and config["n_layers"] == 2
    rows = [json.loads(line) for line in (whole / "metrics.jsonl").read_text().splitlines()]
    assert {"soft_loss", "cos_loss", "mlm_loss"} <= set(rows[0]) and "eval_mlm_acc" in rows[-1]
    transformers = pytest.importorskip("transformers")
    _, info = transformers.DistilBertForMaskedLM.from_pretrained(whole, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    killed = tmp_path / "killed"
    kill_after_checkpoint([*args, "--out", str(killed)], killed / "checkpoints", "step-*", seed=2, max_delay=0.5,
                          OMP_NUM_THREADS="1")
    resumed = subprocess.run([sys.executable, "-m", "bertforge", *args, "--out", str(killed), "--resume"],
                             capture_output=True, text=True, env={**__import__("os").environ, **env}, timeout=600)
    assert resumed.returncode == 0, resumed.stderr
    a, b = load_file(whole / "model.safetensors"), load_file(killed / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    (tmp_path / "train.tsv").write_text("sentence\tlabel\n" + "".join(f"doc{i} alpha\t{i % 2}\n" for i in range(32)))
    tuned = run("finetune", "classify", "--model", str(whole), "--train", str(tmp_path / "train.tsv"), "--dev",
                str(tmp_path / "train.tsv"), "--out", str(tmp_path / "tuned"), "--epochs", "1", "--batch-size", "8")
    assert tuned.returncode == 0, tuned.stderr
    assert json.loads((tmp_path / "tuned" / "config.json").read_text())["architectures"] == \
        ["DistilBertForSequenceClassification"]


@pytest.mark.parametrize("kind", ["ner", "qa"])
def test_distill_ner_and_qa_end_to_end(tmp_path, minilm_dir, kind):
    """A 2-layer NER or QA teacher distilled into its first layer: ner with the teacher running on each batch
    (--teacher-cache-mb 0), qa from the cache; the student's directory loads in transformers with its head,
    and the results give both models' scores and speeds."""
    from family_checks import small_squad
    from cli_utils import slice_file

    from bertforge import Tokenizer
    from bertforge.models.heads import BertForQuestionAnswering, BertForTokenClassification
    from bertforge.training.distill import run_distill

    tok = Tokenizer.from_pretrained(minilm_dir)
    if kind == "ner":
        train = slice_file(shared("conll2003", "train.txt"), tmp_path / "train.txt", 300)
        dev = slice_file(shared("conll2003", "valid.txt"), tmp_path / "dev.txt", 120)
        tags = ["O"] + [f"{p}-{t}" for t in ("LOC", "MISC", "ORG", "PER") for p in "BI"]
        config = BertConfig.from_preset("L2-H64", vocab_size=tok.vocab_size, id2label=dict(enumerate(tags)))
        model, arch, metric = BertForTokenClassification(config), "BertForTokenClassification", "f1"
    else:
        train, dev = small_squad(tmp_path)
        config = BertConfig.from_preset("L2-H64", vocab_size=tok.vocab_size, num_labels=2)
        model, arch, metric = BertForQuestionAnswering(config), "BertForQuestionAnswering", "f1"
    torch.manual_seed(0)
    perturbed(model).save_pretrained(tmp_path / "teacher", tokenizer=tok)
    cfg = DistillConfig(task=kind, teacher=str(tmp_path / "teacher"), train=str(train), dev=str(dev),
                        out=str(tmp_path / "student"), epochs=1, batch_size=16, seq_len=128,
                        **({"doc_stride": 48} if kind == "qa" else {}),  # ner has no windows: it would be refused
                        progress=False, teacher_cache_mb=0.0 if kind == "ner" else 1024.0)
    result = run_distill(cfg, as_json=True)
    assert result["student_layers"] == 1 and result["teacher"]["layers"] == 2 and metric in result["teacher"]
    assert result["student_dev_rows_per_s"] > 0 and result["student_parameters"] < result["teacher"]["parameters"]
    rows = [json.loads(line) for line in (tmp_path / "student" / "metrics.jsonl").read_text().splitlines()]
    assert any("soft_loss" in r and "gold_loss" in r for r in rows)
    transformers = pytest.importorskip("transformers")
    theirs, info = getattr(transformers, arch).from_pretrained(tmp_path / "student", output_loading_info=True)
    assert not info["missing_keys"] and theirs.config.num_hidden_layers == 1
