"""`bertforge finetune colbert`: ColBERT trained with PyLate's losses (the same values on the same vectors), written as a
PyLate directory that sentence-transformers 6's MultiVectorEncoder loads with equal token vectors; exact resume and
torchrun parity."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

st = pytest.importorskip("sentence_transformers")
transformers = pytest.importorskip("transformers")
from sentence_transformers import MultiVectorEncoder  # noqa: E402

from bertforge import Tokenizer  # noqa: E402
from bertforge.cli import main  # noqa: E402
from bertforge.inference.multi_vector import multi_vector_embed  # noqa: E402
from bertforge.interop.colbert_dir import load_colbert  # noqa: E402
from bertforge.losses.late_interaction import contrastive, distillation  # noqa: E402
from conftest import perturbed  # noqa: E402
from embed_utils import first_step_gradients  # noqa: E402
from conftest import random_sentences as _sentences  # noqa: E402


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory):
    """A tiny random BERT encoder with a small WordPiece tokenizer (no ColBERT parts yet)."""
    root = tmp_path_factory.mktemp("colbert-base")
    tok = Tokenizer.train(texts=_sentences(400, 0, 3, 12), vocab_size=120, min_frequency=1)
    tok.save(root)
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=2,
                                     num_attention_heads=4, intermediate_size=48, max_position_embeddings=64,
                                     hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    perturbed(transformers.BertModel(config)).save_pretrained(root)
    return root


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """64 training rows (query, positive, negative) without a text twice, 16 dev pairs, and the rows with a second
    negative and a teacher's scores."""
    root = tmp_path_factory.mktemp("colbert-data")
    texts = _sentences(240, 9, 3, 12)
    rows = [{"query": f"{i} {q}", "positive": f"{i} {p}", "negative": f"{i} {n}"}
            for i, (q, p, n) in enumerate(zip(texts[::3], texts[1::3], texts[2::3]))]
    (root / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:64]))
    (root / "dev.jsonl").write_text("".join(json.dumps({"query": r["query"], "positive": r["positive"]}) + "\n"
                                            for r in rows[64:]))
    extra = _sentences(64, 11, 3, 12)  # three passages a row: Distillation refuses two (see the settings test)
    (root / "scored.jsonl").write_text("".join(json.dumps({**r, "negative_2": f"{i} {extra[i]}",
                                                           "score": [2.0 + i % 3, 0.5 * (i % 4), 1.0 + i % 5]}) + "\n"
                                               for i, r in enumerate(rows[:64])))
    return root


def _flags(model: Path, data: Path, out: Path, *extra: str, train: str = "train.jsonl") -> list[str]:
    return ["finetune", "colbert", "--model", str(model), "--train", str(data / train), "--dev",
            str(data / "dev.jsonl"), "--batch-size", "8", "--dim", "16", "--query-length", "12",
            "--document-length", "20", "--precision", "fp32", "--matmul", "torch", "--out", str(out), *extra]


class _Given(torch.nn.Module):
    """A stand-in for PyLate's ColBERT model: each feature dict's token embeddings are given (by its 'which' key)."""

    def __init__(self, vectors: list[torch.Tensor], skiplist: list[int], expansion: bool) -> None:
        super().__init__()
        self.vectors, self.skiplist, self.do_query_expansion = vectors, skiplist, expansion

    def forward(self, features: dict) -> dict:
        return {"token_embeddings": self.vectors[int(features["which"])]}


def _vectors(g: torch.Generator, *shape: int) -> torch.Tensor:
    return torch.nn.functional.normalize(torch.randn(*shape, generator=g), dim=-1)


@pytest.mark.parametrize("expansion", [True, False])
def test_contrastive_equals_pylates(expansion):
    """On the same token vectors, ids and masks (padding and skiplist tokens among the documents'), the task's
    Contrastive loss is PyLate's. (PyLate's losses import with sentence-transformers 6 when pylate is installed with
    --no-deps; where it is not installed, as in CI, the two loss checks skip and the rest of this file runs.)"""
    pylate_losses = pytest.importorskip("pylate.losses")
    g = torch.Generator().manual_seed(0)
    B, N, Tq, Td, D = 3, 2, 6, 9, 8
    q = _vectors(g, B, Tq, D)
    docs = [_vectors(g, B, Td, D) for _ in range(N)]
    q_ids = torch.randint(5, 50, (B, Tq), generator=g)
    q_mask = torch.ones(B, Tq, dtype=torch.long)
    q_mask[1, 4:] = 0
    d_ids = [torch.randint(1, 50, (B, Td), generator=g) for _ in range(N)]
    d_mask = [torch.ones(B, Td, dtype=torch.long) for _ in range(N)]
    d_mask[0][2, 5:] = 0
    d_mask[1][0, 7:] = 0
    skiplist = [1, 2, 3, 4]
    features = [{"input_ids": q_ids, "attention_mask": q_mask, "which": 0}] + [
        {"input_ids": d_ids[n], "attention_mask": d_mask[n], "which": n + 1} for n in range(N)]
    expected = pylate_losses.Contrastive(_Given([q, *docs], skiplist, expansion))(features)
    kept = torch.stack([d_mask[n].bool() & ~torch.isin(d_ids[n], torch.tensor(skiplist)) for n in range(N)], dim=1)
    ours = contrastive(q, None if expansion else q_mask.bool(), torch.stack(docs, dim=1), kept, temperature=1.0)
    assert ours.item() == pytest.approx(expected.item(), rel=1e-6)


def test_distillation_equals_pylates():
    pylate_losses = pytest.importorskip("pylate.losses")
    g = torch.Generator().manual_seed(1)
    B, N, Tq, Td, D = 3, 4, 5, 7, 8
    q = _vectors(g, B, Tq, D)
    docs = _vectors(g, B * N, Td, D)
    d_ids = torch.randint(1, 50, (B * N, Td), generator=g)
    d_mask = torch.ones(B * N, Td, dtype=torch.long)
    d_mask[3, 4:] = 0
    teacher = torch.randn(B, N, generator=g) * 3
    features = [{"input_ids": torch.randint(5, 50, (B, Tq), generator=g), "attention_mask": torch.ones(B, Tq),
                 "which": 0}, {"input_ids": d_ids, "attention_mask": d_mask, "which": 1}]
    expected = pylate_losses.Distillation(_Given([q, docs], [1, 2], True))(features, teacher)
    kept = (d_mask.bool() & ~torch.isin(d_ids, torch.tensor([1, 2]))).view(B, N, Td)
    ours = distillation(q, None, docs.view(B, N, Td, D), kept, teacher)
    assert ours.item() == pytest.approx(expected.item(), rel=1e-5)


def test_trained_directory_loads_in_multi_vector_encoder_with_equal_vectors(tmp_path, base_dir, data, capsys):
    out = tmp_path / "out"
    assert main(_flags(base_dir, data, out, "--epochs", "2", "--lr", "1e-3", "--json")) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["metric"] == "ndcg@10" and 0 <= result["ndcg@10"] <= 1
    trained, spec, tokenizer = load_colbert(out)
    assert (spec.query_length, spec.document_length, trained.dimension) == (12, 20, 16)
    assert tokenizer.token_to_id("[Q] ") is not None and tokenizer.token_to_id("[D] ") is not None
    texts = _sentences(5, 3, 2, 14)
    theirs = MultiVectorEncoder(str(out), device="cpu")
    for got, expected in zip(multi_vector_embed(trained, tokenizer, spec, texts, True)
                             + multi_vector_embed(trained, tokenizer, spec, texts, False),
                             list(theirs.encode_query(texts)) + list(theirs.encode_document(texts))):
        assert got.shape == tuple(expected.shape) and np.abs(got - expected.numpy()).max() < 1e-5
    card = (out / "README.md").read_text()
    for fact in ("library_name: PyLate", "64 rows of triplets", "loss: Contrastive", "vector size: 16",
                 "query length: 12", "models.ColBERT("):
        assert fact in card, fact


def test_distillation_trains_on_a_teachers_scores(tmp_path, base_dir, data, capsys):
    out = tmp_path / "out"
    assert main(_flags(base_dir, data, out, "--max-steps", "3", "--json", train="scored.jsonl")) == 0
    assert "loss: Distillation" in (out / "README.md").read_text()


def test_kill_9_and_resume_give_bitwise_the_same_weights(tmp_path, base_dir, data):
    from kill_utils import whole_and_resumed

    whole, out = whole_and_resumed(lambda out: _flags(base_dir, data, out, "--epochs", "2", "--save-every", "2"),
                                   tmp_path, seed=5, OMP_NUM_THREADS="1")
    a, b = load_colbert(whole)[0].state_dict(), load_colbert(out)[0].state_dict()
    for name in a:
        assert torch.equal(a[name], b[name]), name


def test_two_processes_equal_one_with_the_global_batch(tmp_path, base_dir, data):
    """torchrun's 2 processes gather every document vector of the global batch (with gradients): the weights of 1
    process on the global batch."""
    from ddp_utils import one_and_two_processes

    one, two = one_and_two_processes(_flags(base_dir, data, tmp_path / "unused")[:-2] + [
        "--max-steps", "3", "--lr", "1e-3", "--eval-every", "100"], 8, tmp_path)
    a, b = load_colbert(one)[0].state_dict(), load_colbert(two)[0].state_dict()
    for name in a:
        torch.testing.assert_close(b[name], a[name], atol=2e-6, rtol=0, msg=lambda m: f"{name}: {m}")


def test_colbert_settings_are_checked(tmp_path, base_dir, data, capsys):
    import re

    for flags, message in ((("--scale", "20"), r"takes --temperature"),
                           (("--seq-len", "64"), r"lengths are --query-length and --document-length"),
                           (("--query-length", "1"), r"must be at least 2"),
                           (("--query-length", "100"), r"the model has 64 positions"),
                           (("--loss", "Distillation"), r"--loss Distillation trains on scored tuples"),
                           (("--mini-batch-size", "9"), r"mini_batch_size \(--mini-batch-size\) 9 must lie between 1 "
                                                        r"and --batch-size \(8\)")):
        assert main(_flags(base_dir, data, tmp_path / "out", *flags)) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and re.search(message, err[0]), err
    two = tmp_path / "two.jsonl"  # two passages a row: min-max normalised, their scores are 0 and 1 whatever the model
    two.write_text("".join(json.dumps({**{k: r[k] for k in ("query", "positive", "negative")}, "score": r["score"][:2]})
                           + "\n"
                           for r in map(json.loads, (data / "scored.jsonl").read_text().splitlines())))
    assert main(_flags(base_dir, data, tmp_path / "out", train=str(two))) == 2  # an absolute path: data / it is it
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and re.search(r"two.jsonl: Distillation needs at least 3 passages a row, these rows have 2",
                                       err[0]), err


@pytest.mark.parametrize("train, extra", [("train.jsonl", {}), ("train.jsonl", {"no_query_expansion": True}),
                                          ("scored.jsonl", {})], ids=["contrastive", "no-expansion", "distillation"])
def test_gradcache_gives_the_uncached_gradients(base_dir, data, train, extra):
    """--mini-batch-size: queries and then documents embedded 3 texts a call; the loss and every parameter's gradient
    equal the whole batch's in one call."""
    from bertforge.settings import ColbertConfig
    from bertforge.tasks.colbert import build

    grads, values, start = [], [], None
    for mini in (None, 3):
        cfg = ColbertConfig(model=str(base_dir), train=str(data / train), dev=str(data / "dev.jsonl"), batch_size=8,
                            dim=16, query_length=12, document_length=20, mini_batch_size=mini, **extra)
        model, task = build(cfg, Tokenizer.from_pretrained(base_dir), cfg.train, cfg.dev)
        start = start or {k: v.clone() for k, v in model.state_dict().items()}
        model.load_state_dict(start)  # the same new projection in both
        value, grad = first_step_gradients(task, model)
        values.append(value)
        grads.append(grad)
    assert values[0] == pytest.approx(values[1], rel=1e-6)
    assert grads[0].keys() == grads[1].keys() and len(grads[0]) > 10
    # Every parameter is trained (so the comparison can fail), but the attention keys' biases: softmax ignores what
    # they add to all of a query's scores alike.
    assert all(g.abs().max() > 1e-5 for n, g in grads[0].items() if not n.endswith("key.bias"))
    for name in grads[0]:
        torch.testing.assert_close(grads[1][name], grads[0][name], rtol=1e-4, atol=1e-6, msg=name)


def test_a_gradcache_run_ends_with_the_uncached_runs_weights(tmp_path, base_dir, data, capsys):
    for name, extra in (("whole", ()), ("cached", ("--mini-batch-size", "3"))):
        assert main(_flags(base_dir, data, tmp_path / name, "--max-steps", "3", "--lr", "1e-3", "--eval-every", "100",
                           *extra)) == 0
    assert "- GradCache mini-batch: 3\n" in (tmp_path / "cached" / "README.md").read_text()
    a, b = load_colbert(tmp_path / "whole")[0].state_dict(), load_colbert(tmp_path / "cached")[0].state_dict()
    for name in a:
        torch.testing.assert_close(b[name], a[name], atol=2e-6, rtol=0, msg=lambda m: f"{name}: {m}")


def test_training_maxsim_in_blocks_equals_it_whole():
    """The contrastive loss's MaxSim, past its budget, a block of documents at a time with each block recomputed in
    the backward: the same scores and the same gradients as the whole [Q, N, Tq, Td] at once."""
    from bertforge.models.colbert import maxsim
    from bertforge.losses.late_interaction import training_maxsim

    g = torch.Generator().manual_seed(3)
    q, d = _vectors(g, 5, 6, 8), _vectors(g, 11, 9, 8)
    q_kept, d_kept = torch.rand(5, 6, generator=g) > 0.3, torch.rand(11, 9, generator=g) > 0.3
    out = []
    for budget in (None, 5 * 6 * 9 * 2):  # whole; two documents a block
        qq, dd = q.clone().requires_grad_(), d.clone().requires_grad_()
        scores = maxsim(qq, q_kept, dd, d_kept, dropped_as_zero=True) if budget is None else \
            training_maxsim(qq, q_kept, dd, d_kept, budget=budget)
        (scores * torch.arange(55.0).view(5, 11)).sum().backward()
        out.append((scores.detach(), qq.grad, dd.grad))
    for whole, blocked in zip(*out):
        torch.testing.assert_close(blocked, whole, rtol=1e-6, atol=1e-6)


def test_exact_search_in_length_blocks_equals_maxsim_pair_by_pair():
    """`evaluate retrieval`'s MaxSim scan, documents taken in blocks of similar length (a tiny budget makes many
    blocks), gives every (query, document) the score of MaxSim computed for that pair alone, in the documents'
    own order; a document without vectors scores 0."""
    from bertforge.retrieval.late_interaction import maxsim_scores, maxsim_top_k

    g = torch.Generator().manual_seed(7)
    queries = [_vectors(g, n, 8).numpy() for n in (4, 6, 5)]
    documents = [_vectors(g, n, 8).numpy() for n in (9, 2, 14, 0, 5, 9, 1, 12, 3)]
    scores = maxsim_scores(queries, documents, 8, budget=3 * 6 * 10)
    for i, q in enumerate(queries):
        for j, d in enumerate(documents):
            expected = float((torch.from_numpy(q) @ torch.from_numpy(d).T).amax(1).sum()) if len(d) else 0.0
            assert float(scores[i, j]) == pytest.approx(expected, abs=1e-5), (i, j)
    values, indices = maxsim_top_k(queries, documents, 3, 8)
    assert indices.tolist() == scores.topk(3, dim=1).indices.tolist()
