"""`bertforge finetune sparse`: SPLADE trained with sentence-transformers' sparse losses and SpladeLoss's FLOPS
regularisers (the same values, the same warm-up), written as a SparseEncoder directory that sentence-transformers
loads with equal vectors; exact resume and torchrun parity."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

st = pytest.importorskip("sentence_transformers")
transformers = pytest.importorskip("transformers")
from sentence_transformers import SparseEncoder  # noqa: E402
from sentence_transformers.sparse_encoder import losses as sparse_losses  # noqa: E402
from sentence_transformers.sparse_encoder.modules import SpladePooling  # noqa: E402

from bertforge import Tokenizer  # noqa: E402
from bertforge.cli import main  # noqa: E402
from bertforge.data.retrieval import TupleData  # noqa: E402
from bertforge.inference.sparse import sparse_embed  # noqa: E402
from bertforge.interop.sparse_dir import load_splade  # noqa: E402
from bertforge.retrieval.beir import from_pairs  # noqa: E402
from bertforge.tasks.embedding import Prompts  # noqa: E402
from bertforge.tasks.sparse import SparseTask  # noqa: E402
from bertforge.tokenization.kinds import load_tokenizer  # noqa: E402
from conftest import random_sentences as _sentences  # noqa: E402
from sparse_utils import _flags, data, splade_dir  # noqa: E402,F401  (fixtures)


@pytest.mark.parametrize("name, columns, scores", [
    ("SparseMultipleNegativesRankingLoss", 3, None),
    ("SparseCoSENTLoss", 2, torch.tensor([0.1, 0.9, 0.4, 0.7])),
    ("SparseMarginMSELoss", 3, torch.tensor([0.5, -0.2, 1.0, 0.3])),
    ("SparseDistillKLDivLoss", 4, torch.tensor([[3.0, 1.0, 0.5], [2.0, 2.5, 0.1], [0.2, 0.1, 0.0], [5.0, 1.0, 4.0]])),
])
def test_losses_equal_splade_loss(name, columns, scores):
    """On the same non-negative vectors, the task's loss is SpladeLoss(base loss) at full regulariser weights: the
    base loss plus query and document FLOPS, as sentence-transformers computes each."""
    g = torch.Generator().manual_seed(0)
    vectors = torch.relu(torch.randn(columns * 4, 50, generator=g))
    rows = [tuple(f"{c} text {r}" for c in range(columns)) for r in range(4)]
    data = TupleData([f"c{c}" for c in range(columns)], rows, None if scores is None else scores.tolist(),
                     list(range(1, 5)), "-")
    tok = Tokenizer.train(texts=["text a b"], vocab_size=30, min_frequency=1)
    task = SparseTask(data, from_pairs([("a", "b")], "-"), tok, 16, 4, 0, name, None,
                      {"SparseCoSENTLoss": "cosine"}.get(name, "dot"), Prompts(), query_weight=5e-5,
                      document_weight=3e-5)
    task.begin_step(10, 12)  # past the warm-up: full weights
    ours = task.vectors_loss(vectors, scores, task.scale)
    model = SparseEncoder(modules=[SpladePooling("max")], device="cpu")
    base = getattr(sparse_losses, name)(model)
    splade = sparse_losses.SpladeLoss(model, base, document_regularizer_weight=3e-5, query_regularizer_weight=5e-5)
    embeddings = list(vectors.chunk(columns))
    expected = base.compute_loss_from_embeddings(embeddings, scores)
    expected = expected + 3e-5 * splade.document_regularizer.compute_loss_from_embeddings(torch.cat(embeddings[1:]))
    expected = expected + 5e-5 * splade.query_regularizer.compute_loss_from_embeddings(embeddings[0])
    assert ours.item() == pytest.approx(expected.item(), rel=1e-6)


def test_regulariser_weights_warm_up_as_sentence_transformers_does():
    from sentence_transformers.sparse_encoder.callbacks.splade_callbacks import (
        SpladeRegularizerWeightSchedulerCallback)

    model = SparseEncoder(modules=[SpladePooling("max")], device="cpu")
    loss = sparse_losses.SpladeLoss(model, sparse_losses.SparseMultipleNegativesRankingLoss(model),
                                    document_regularizer_weight=1.0, query_regularizer_weight=1.0)
    callback = SpladeRegularizerWeightSchedulerCallback(loss)
    callback.total_steps, callback.warmup_steps = 40, int(40 / 3)
    task = SparseTask.__new__(SparseTask)
    task.warmup_ratio = 1 / 3
    for step in (0, 1, 5, 12, 13, 39):
        task.begin_step(step, 40)
        assert task.factor == pytest.approx(callback._calculate_weight_value(step, 1.0)), step


def test_trained_directory_loads_in_sparse_encoder_with_equal_vectors(tmp_path, splade_dir, data, capsys):
    out = tmp_path / "out"
    assert main(_flags(splade_dir, data, out, "--epochs", "2", "--lr", "1e-3", "--query-prompt", "query: ",
                       "--json")) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["metric"] == "ndcg@10" and result["nonzero_per_document"] > 0
    start = load_splade(splade_dir)
    trained = load_splade(out)
    assert any(not torch.equal(a, b) for a, b in zip(start.state_dict().values(), trained.state_dict().values()))
    texts = _sentences(6, 3, 2, 14)
    theirs = SparseEncoder(str(out), device="cpu")
    expected = theirs.encode_query(texts, convert_to_tensor=True).to_dense().numpy()
    got = sparse_embed(trained, load_tokenizer(out), texts, prompt="query: ").toarray()
    assert np.array_equal(got > 0, expected > 0) and np.abs(got - expected).max() < 1e-5
    card = (out / "README.md").read_text()
    for fact in ("64 rows of pairs", "loss: SparseMultipleNegativesRankingLoss", "query FLOPS weight: 5e-05",
                 "document FLOPS weight: 3e-05", "SparseEncoder(", "nonzero_per_document"):
        assert fact in card, fact


def test_kill_9_and_resume_give_bitwise_the_same_weights(tmp_path, splade_dir, data):
    from kill_utils import whole_and_resumed

    whole, out = whole_and_resumed(lambda out: _flags(splade_dir, data, out, "--epochs", "2", "--save-every", "2"),
                                   tmp_path, seed=5, OMP_NUM_THREADS="1")
    a, b = load_splade(whole).state_dict(), load_splade(out).state_dict()
    for name in a:
        assert torch.equal(a[name], b[name]), name


def test_two_processes_equal_one_with_the_global_batch(tmp_path, splade_dir, data):
    """torchrun's 2 processes gather the in-batch negatives and the vectors the FLOPS terms average over (with their
    gradients): the weights of 1 process on the global batch. The regularisers' weights are raised so that they
    move the weights (at the defaults they are too small for this test to see them)."""
    from ddp_utils import one_and_two_processes

    one, two = one_and_two_processes(_flags(splade_dir, data, tmp_path / "unused")[:-2] + [
        "--max-steps", "3", "--lr", "1e-3", "--eval-every", "100", "--query-regularizer-weight", "0.05",
        "--document-regularizer-weight", "0.03"], 8, tmp_path)
    a, b = load_splade(one).state_dict(), load_splade(two).state_dict()
    for name in a:
        torch.testing.assert_close(b[name], a[name], atol=2e-6, rtol=0, msg=lambda m: f"{name}: {m}")


def test_sparse_settings_are_checked(tmp_path, splade_dir, data, capsys):
    import re

    for flags, message in ((("--pooling", "mean"), r"pooling \(--pooling\) must be max or sum"),
                           (("--document-regularizer-weight", "-1"), r"must be 0 or more"),
                           (("--loss", "MultipleNegativesRankingLoss"), r"--loss MultipleNegativesRankingLoss: use one "
                                                                        r"of SparseMultipleNegativesRankingLoss")):
        assert main(_flags(splade_dir, data, tmp_path / "out", *flags)) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and re.search(message, err[0]), err
