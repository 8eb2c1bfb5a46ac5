"""Rerankers: `finetune rerank` trains what sentence-transformers' CrossEncoder loads and scores the same, with its
losses' values; `serve` reads CrossEncoder directories' activation; bad data is refused in one line."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch

st = pytest.importorskip("sentence_transformers")
from sentence_transformers import CrossEncoder  # noqa: E402

from bertforge.cli import main  # noqa: E402

TOPICS = ["rivers", "violins", "castles", "physics", "markets", "bicycles", "the moon", "tea", "football", "poetry",
          "volcanoes", "chess"]


def _relevance(path) -> list[float]:
    from bertforge.server.service import Limits, Service

    grad = torch.is_grad_enabled()
    try:
        return [s for s, _ in Service(str(path), Limits()).relevance(PAIRS)]
    finally:
        torch.set_grad_enabled(grad)


PAIRS = [("what flows to the sea?", "Rivers flow to the sea."), ("who plays strings?", "A violinist plays."),
         ("tea", "Green tea is brewed cool.")]


@pytest.mark.parametrize("activation", ["Sigmoid", "Identity"])
def test_cross_encoder_directories_are_served_with_their_activation(tmp_path, cross_encoder, activation):
    model = CrossEncoder(str(cross_encoder), device="cpu", activation_fn=getattr(torch.nn, activation)())
    model.save(str(tmp_path / "ce"))
    expected = model.predict(PAIRS)
    assert np.abs(np.array(_relevance(tmp_path / "ce")) - expected).max() < 1e-5


@pytest.fixture(scope="module")
def rerank_data(tmp_path_factory):
    """Train rows (query, positive, negative), a dev BEIR folder and a first-stage run of its queries."""
    root = tmp_path_factory.mktemp("rerank")
    rows = [{"query": f"tell me about {t}", "positive": f"A page all about {t} and their history.",
             "negative": f"A page about {TOPICS[(i + 3) % len(TOPICS)]} instead."} for i, t in enumerate(TOPICS[:8])]
    (root / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    beir = root / "beir"
    (beir / "qrels").mkdir(parents=True)
    (beir / "corpus.jsonl").write_text("".join(json.dumps({"_id": f"d{i}", "text": f"Everything on {t}."}) + "\n"
                                               for i, t in enumerate(TOPICS)))
    (beir / "queries.jsonl").write_text("".join(json.dumps({"_id": f"q{i}", "text": f"what about {t}?"}) + "\n"
                                                for i, t in enumerate(TOPICS[8:], 8)))
    (beir / "qrels" / "dev.tsv").write_text("query-id\tcorpus-id\tscore\n" + "".join(f"q{i}\td{i}\t1\n"
                                                                                    for i in range(8, 12)))
    run = "".join(f"q{q} Q0 d{d} {r + 1} {1.0 - r / 10} first\n" for q in range(8, 12)
                  for r, d in enumerate([(q + k) % 12 for k in range(1, 6)] + [q]))
    (root / "candidates.trec").write_text(run)
    return root


def _train(model, data, out, *flags):
    return main(["finetune", "rerank", "--model", str(model), "--train", str(data / "train.jsonl"), "--dev",
                 str(data / "beir"), "--candidates", str(data / "candidates.trec"), "--batch-size", "4",
                 "--seq-len", "40", "--precision", "fp32", "--matmul", "torch", "--out", str(out), "--json", *flags])


def test_a_trained_reranker_loads_in_cross_encoder_with_equal_scores(tmp_path, cross_encoder, rerank_data, capsys):
    out = tmp_path / "out"
    assert _train(cross_encoder, rerank_data, out, "--lr", "1e-3", "--epochs", "2") == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["metric"] == "ndcg@10" and 0 <= result["ndcg@10"] <= 1
    card = (out / "README.md").read_text()
    assert "8 rows of triplets" in card and f"| ndcg@10 | {result['ndcg@10']:.4f} |" in card
    model = CrossEncoder(str(out), device="cpu")
    assert model.max_length == 40 and isinstance(model.activation_fn, torch.nn.Sigmoid)
    assert np.abs(np.array(_relevance(out)) - model.predict(PAIRS)).max() < 1e-5
    # Scored with bertforge evaluate rerank, the selected model's nDCG@10 is the one the run reported.
    assert main(["evaluate", "rerank", "--model", str(out), "--data", str(rerank_data / "beir"), "--split", "dev",
                 "--candidates", str(rerank_data / "candidates.trec"), "--json"]) == 0
    scored = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert scored["ndcg@10"] == pytest.approx(result["ndcg@10"], abs=1e-6)


def test_ranking_loss_equals_sentence_transformers(tmp_path, cross_encoder, rerank_data):
    """With every other passage of the batch as a negative, the loss is sentence-transformers' on the same rows."""
    from sentence_transformers.cross_encoder.losses import MultipleNegativesRankingLoss

    from bertforge.data.retrieval import read_tuples
    from bertforge.interop.hf import load_pretrained
    from bertforge import BertForSequenceClassification
    from bertforge.retrieval.beir import read_beir
    from bertforge.tasks.reranking import RerankTask
    from bertforge.tokenization.kinds import load_tokenizer

    data = read_tuples(str(rerank_data / "train.jsonl"))
    tok = load_tokenizer(cross_encoder)
    task = RerankTask(data, read_beir(rerank_data / "beir", "dev"), {}, tok, 40, 4, 0, "MultipleNegativesRankingLoss",
                      100, 10.0, None, 10)
    ours = load_pretrained(BertForSequenceClassification, cross_encoder).eval()
    batch = task.micro_batch(0, 0)
    loss, _ = task.loss(ours, batch)
    rows = [data.rows[i] for i in task._epoch_batches(0)[0]]
    theirs = CrossEncoder(str(cross_encoder), device="cpu", max_length=40)
    theirs.eval()
    expected = MultipleNegativesRankingLoss(theirs, num_negatives=None)(
        [[r[c] for r in rows] for c in range(3)], torch.zeros(len(rows)))
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)


def test_two_processes_equal_one_with_the_global_batch(tmp_path, cross_encoder, rerank_data):
    """torchrun with 2 CPU processes of --batch-size 2 ends with the weights of 1 process of --batch-size 4: each
    global batch is split between them, and each query's in-batch negatives are drawn from the whole global batch
    (a cross-encoder's negatives are texts: no gathering, the same draw)."""
    from ddp_utils import one_and_two_processes, without_dropout

    from bertforge import BertForSequenceClassification
    from bertforge.interop.hf import load_pretrained

    rows = [{"query": f"tell me about {t} {k}", "positive": f"A page all about {t} {k} and their history.",
             "negative": f"A page about {TOPICS[(i + 3) % len(TOPICS)]} {k} instead."}
            for k in range(2) for i, t in enumerate(TOPICS[:8])]  # 16 rows, no text twice: every batch is full
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    model = without_dropout(cross_encoder, tmp_path / "model")
    one_and_two_processes(["finetune", "rerank", "--model", str(model), "--train", str(tmp_path / "train.jsonl"),
                           "--dev", str(rerank_data / "beir"), "--candidates", str(rerank_data / "candidates.trec"),
                           "--seq-len", "40", "--precision", "fp32", "--matmul", "torch", "--max-steps", "3", "--lr",
                           "1e-3", "--eval-every", "100", "--num-negatives", "3"], 4, tmp_path)
    a, b, start = (load_pretrained(BertForSequenceClassification, p).state_dict()
                   for p in (tmp_path / "one", tmp_path / "two", model))
    # Float rounding (sums in another order, amplified by Adam) leaves ~4e-6 over 3 steps that moved the weights by up
    # to 1.5e-3; negatives drawn per process instead (the code before this test) left 2e-3. The classifier's bias is
    # left out: it adds one constant to every score of a query's softmax, so its true gradient is 0 and what Adam
    # steps on is rounding alone (2.7e-5 apart on an AMD EPYC host, where it moved 1.6e-4 in all).
    for name in (n for n in a if n != "classifier.bias"):
        torch.testing.assert_close(b[name], a[name], atol=2e-5, rtol=0, msg=lambda m: f"{name}: {m}")
    assert any(not torch.equal(a[n], start[n]) for n in a)


@pytest.mark.parametrize("rows, flags, message", [
    ([{"q": "a", "p": "b", "label": 2}], (), r"train.jsonl:1: label 2.0 lies outside \[0, 1\]"),
    ([{"q": "a", "p": "b"}], ("--loss", "bce"), r"--loss BinaryCrossEntropyLoss trains on scored pairs; .* holds pairs"),
    ([{"q": "a", "p": "b", "label": 1}], ("--loss", "mnrl"), r"trains on \(anchor, positive\[, negatives...\]\) rows"),
    ([{"q": "a", "p": "b", "n": "c", "label": 0.5}], ("--loss", "listnet"), r"ListNetLoss needs the teacher's "
                                                                                  r"score of every passage"),
])
def test_bad_data_is_refused_in_one_line(tmp_path, cross_encoder, rerank_data, capsys, rows, flags, message):
    (tmp_path / "beir").symlink_to(rerank_data / "beir")
    (tmp_path / "candidates.trec").symlink_to(rerank_data / "candidates.trec")
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert _train(cross_encoder, tmp_path, tmp_path / "out", *flags) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and re.search(message, err[0]), err


def test_candidates_are_required(tmp_path, cross_encoder, rerank_data, capsys):
    code = main(["finetune", "rerank", "--model", str(cross_encoder), "--train", str(rerank_data / "train.jsonl"),
                 "--dev", str(rerank_data / "beir"), "--out", str(tmp_path / "out")])
    assert code == 2 and "--candidates is required" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["MarginMSELoss", "ListNetLoss"])
def test_distillation_losses_equal_sentence_transformers(cross_encoder, rerank_data, tmp_path, name):
    """Rows with a teacher's scores (positive first, as `mine --scores` writes them): MarginMSE on the logits'
    margins and ListNet on the scores' distribution give sentence-transformers' values."""
    from sentence_transformers.cross_encoder import losses

    from bertforge import BertForSequenceClassification
    from bertforge.data.retrieval import read_tuples
    from bertforge.interop.hf import load_pretrained
    from bertforge.retrieval.beir import read_beir
    from bertforge.tasks.reranking import RerankTask, rerank_loss_name
    from bertforge.tokenization.kinds import load_tokenizer

    rng = np.random.default_rng(0)
    rows = [{"query": f"about {t}?", "positive": f"All on {t}.", "negative_1": f"Some {TOPICS[i - 1]}.",
             "negative_2": f"Not {TOPICS[i - 2]}.", "label": [float(x) for x in rng.normal(size=3)]}
            for i, t in enumerate(TOPICS[:6])]
    (tmp_path / "scored.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    data = read_tuples(str(tmp_path / "scored.jsonl"))
    assert rerank_loss_name(None, data) == "MarginMSELoss" and rerank_loss_name(name, data) == name
    task = RerankTask(data, read_beir(rerank_data / "beir", "dev"), {}, load_tokenizer(cross_encoder), 40, 6, 0, name,
                      0, 10.0, None, 10)
    ours, _ = task.loss(load_pretrained(BertForSequenceClassification, cross_encoder).eval(), task.micro_batch(0, 0))
    order = [data.rows[i] for i in task._epoch_batches(0)[0]]
    labels = [data.scores[i] for i in task._epoch_batches(0)[0]]
    model = CrossEncoder(str(cross_encoder), device="cpu", max_length=40)
    model.eval()
    if name == "ListNetLoss":
        expected = losses.ListNetLoss(model)([[r[0] for r in order], [list(r[1:]) for r in order]],
                                             [torch.tensor(y) for y in labels])
    else:
        expected = losses.MarginMSELoss(model)([[r[c] for r in order] for c in range(4)], torch.tensor(labels))
    assert ours.item() == pytest.approx(expected.item(), rel=1e-5)


def test_training_takes_cross_encoder_trainers_steps(tmp_path, cross_encoder, rerank_data):
    """The whole recipe, not only the loss: from the same weights, with dropout off, one batch of every row per
    epoch and every other passage as a negative (so neither sampler's draw matters), `finetune rerank` and
    sentence-transformers' CrossEncoderTrainer log the same loss at every step (schedule, warmup, AdamW's decay
    groups, clipping) and end with the same scores."""
    import datasets
    import safetensors.torch
    from sentence_transformers.cross_encoder import CrossEncoderTrainer, CrossEncoderTrainingArguments
    from sentence_transformers.cross_encoder.losses import MultipleNegativesRankingLoss

    from st_trainer_utils import reference_losses, without_dropout

    start = without_dropout(cross_encoder, tmp_path / "start")
    steps, lr = 4, 5e-3
    out = tmp_path / "ours"
    assert _train(start, rerank_data, out, "--batch-size", "8", "--num-negatives", "14", "--lr", str(lr),
                  "--epochs", str(steps), "--eval-every", "100", "--log-every", "1", "--weight-decay", "0.3") == 0
    ours = [json.loads(line)["loss"] for line in (out / "metrics.jsonl").read_text().splitlines()]

    rows = [json.loads(line) for line in (rerank_data / "train.jsonl").read_text().splitlines()]
    data = datasets.Dataset.from_dict({c: [r[c] for r in rows] for c in ("query", "positive", "negative")})
    model = CrossEncoder(str(start), num_labels=1, max_length=40, device="cpu")
    theirs = reference_losses(CrossEncoderTrainer, CrossEncoderTrainingArguments, model,
                              MultipleNegativesRankingLoss(model, num_negatives=14), data, tmp_path / "st", 8, lr,
                              steps, 0.3)
    assert len(ours) == len(theirs) == steps
    assert ours[-1] < ours[0] - 1e-3  # the weights moved: the comparison below is not of an idle model
    assert ours == pytest.approx(theirs, abs=1e-4)
    model.save_pretrained(str(tmp_path / "st"))
    a = safetensors.torch.load_file(str(out / "model.safetensors"))
    b = safetensors.torch.load_file(str(tmp_path / "st" / "model.safetensors"))
    s0 = safetensors.torch.load_file(str(start / "model.safetensors"))
    # Adam divides each gradient by its own running size, so float rounding in near-zero gradients moves single
    # weights by a fraction of a step (measured: 0.1% of each tensor's move). A different decay group or schedule
    # moves whole tensors by far more: the strong weight decay above makes a LayerNorm decayed by one trainer
    # and not the other differ by ~20% of its move.
    for k in b:
        assert (a[k] - b[k]).norm() <= 0.01 * (b[k] - s0[k]).norm() + 1e-6, k  # + the key biases: no gradient
    model.eval()
    ours_scores, start_scores = np.array(_relevance(out)), np.array(_relevance(start))
    assert np.abs(ours_scores - start_scores).min() > 1e-3
    assert np.abs(ours_scores - model.predict(PAIRS, activation_fn=torch.nn.Sigmoid())).max() < 5e-5
