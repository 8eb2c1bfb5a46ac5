"""`bertforge finetune embed`: sentence-transformers' losses, batches without duplicate texts, a directory that
`SentenceTransformer` loads and encodes to the same vectors, exact resume, and one-line refusals."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

st = pytest.importorskip("sentence_transformers")
import sentence_transformers.models  # noqa: E402,F401
transformers = pytest.importorskip("transformers")

from bertforge import Tokenizer  # noqa: E402
from bertforge.cli import main  # noqa: E402
from bertforge.data.retrieval import read_tuples  # noqa: E402
from bertforge.inference.pipelines import embed  # noqa: E402
from bertforge.interop.sentence_dir import load_sentence_encoder, read_sentence_dir  # noqa: E402
from bertforge.tasks.embedding import unique_batches  # noqa: E402
from bertforge.losses import SCORED_PAIRS, SCORED_TUPLES, losses_of  # noqa: E402
from bertforge.tokenization.kinds import load_tokenizer  # noqa: E402
from conftest import random_sentences  # noqa: E402
from embed_utils import first_step_gradients  # noqa: E402

_sentences = random_sentences


@pytest.fixture(scope="module")
def st_dir(tmp_path_factory):
    """A tiny random BERT saved by sentence-transformers with Pooling (mean), Dense and Normalize."""
    root = tmp_path_factory.mktemp("embed")
    tok = Tokenizer.train(texts=_sentences(400, 0, 3, 12), vocab_size=120, min_frequency=1)
    tok.save(root / "bert")
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=2,
                                     num_attention_heads=4, intermediate_size=48, max_position_embeddings=96)
    transformers.BertModel(config).save_pretrained(root / "bert")
    modules = [st.models.Transformer(str(root / "bert"), max_seq_length=48), st.models.Pooling(32, "mean"),
               st.models.Dense(32, 24), st.models.Normalize()]
    st.SentenceTransformer(modules=modules, device="cpu").save(str(root / "st"))
    return root / "st"


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """(train pairs with some passages shared by several queries, dev pairs) as JSONL files."""
    root = tmp_path_factory.mktemp("embed-data")
    passages = _sentences(30, 1, 8, 20)
    queries = _sentences(90, 2, 2, 5)
    rows = [{"query": q, "positive": passages[i % 30]} for i, q in enumerate(queries)]
    (root / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:70]))
    (root / "dev.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[70:]))
    return root


def _train(st_dir: Path, data: Path, out: Path, *extra: str) -> int:
    return main(["finetune", "embed", "--model", str(st_dir), "--train", str(data / "train.jsonl"),
                 "--dev", str(data / "dev.jsonl"), "--batch-size", "8", "--epochs", "1", "--precision", "fp32",
                 "--matmul", "torch", "--out", str(out), "--json", *extra])


def test_losses_equal_sentence_transformers():
    """Each loss on the same vectors gives sentence-transformers' value (its compute_loss_from_embeddings)."""
    from sentence_transformers.sentence_transformer import losses

    torch.manual_seed(0)
    columns = [torch.randn(6, 8, dtype=torch.float64) for _ in range(3)]
    scores = torch.rand(6, dtype=torch.float64)
    model = st.SentenceTransformer(modules=[st.models.Normalize()], device="cpu")
    margins = torch.randn(6, 2, dtype=torch.float64)
    teacher = torch.randn(6, 3, dtype=torch.float64)
    cases = []
    for name, row in losses_of("embed").items():
        fn, rows, scale = row.fn, row.rows, row.scale
        if rows == SCORED_PAIRS:
            cases.append((name, fn, scale, columns[:2], scores))
        elif rows == SCORED_TUPLES and name == "DistillKLDivLoss":  # listwise: the teacher's score of every passage
            cases += [(name, fn, scale, columns + [torch.randn(6, 8, dtype=torch.float64)], teacher),
                      (name, fn, 0.5, columns, teacher[:, :2])]
        elif rows == SCORED_TUPLES:  # one margin per negative, or the teacher's scores (positive first)
            four = columns + [torch.randn(6, 8, dtype=torch.float64)]
            cases += [(name, fn, scale, four, margins), (name, fn, scale, four, teacher),
                      (name, fn, scale, columns, scores)]
        else:
            cases.append((name, fn, scale, columns, None))
    for name, fn, scale, used, labels in cases:
        theirs = (getattr(losses, name)(model, temperature=scale) if name == "DistillKLDivLoss"
                  else getattr(losses, name)(model))
        expected = theirs.compute_loss_from_embeddings(used, labels)
        ours = fn(used, labels, scale, "cosine").item()
        assert ours == pytest.approx(expected.item(), rel=1e-6), name  # CosineSimilarityLoss casts scores to float32


def test_batches_never_hold_one_text_twice():
    rows = [(f"q{i}", f"p{i % 7}") for i in range(60)] + [("q0", "p99")]  # passages shared by many queries
    for epoch in range(3):
        batches = unique_batches(rows, 16, seed=0, epoch=epoch)
        assert sorted(i for b in batches for i in b) == list(range(len(rows)))  # every row, once
        for b in batches:
            texts = [t for i in b for t in rows[i]]
            assert len(texts) == len(set(texts)) and len(b) <= 16
    assert unique_batches(rows, 16, 0, 0) == unique_batches(rows, 16, 0, 0)  # a function of (seed, epoch)
    assert unique_batches(rows, 16, 0, 0) != unique_batches(rows, 16, 0, 1)


def test_trained_directory_loads_in_sentence_transformers_with_equal_vectors(tmp_path, st_dir, data, capsys):
    out = tmp_path / "out"
    assert _train(st_dir, data, out, "--query-prompt", "query: ", "--document-prompt", "passage: ") == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["metric"] == "ndcg@10" and 0 <= result["ndcg@10"] <= 1
    texts = _sentences(6, 5, 1, 30) + ["x"]
    theirs = st.SentenceTransformer(str(out), device="cpu")
    assert theirs.prompts["query"] == "query: " and theirs.prompts["document"] == "passage: "
    assert [type(m).__name__ for m in theirs] == ["Transformer", "Pooling", "Dense", "Normalize"]
    assert theirs.max_seq_length == 48  # the directory's own length, kept when --seq-len is not given
    tok = load_tokenizer(out)
    sentence = read_sentence_dir(out, 32)
    encoder = load_sentence_encoder(out).eval()
    for name in ("query", "document"):
        expected = theirs.encode(texts, prompt_name=name, convert_to_numpy=True)
        ours = embed(encoder.backbone, tok, texts, sentence=sentence, prompt=sentence.prompts[name])
        cosine = (expected * ours).sum(1) / np.linalg.norm(expected, axis=1) / np.linalg.norm(ours, axis=1)
        assert cosine.min() >= 0.99999, name
    # The server reads it too (its Dense layer sets the width), and /embed's vectors with prompt_name are these.
    from bertforge.server.service import Limits, Service

    grad = torch.is_grad_enabled()
    try:
        service = Service(str(out), Limits())  # a server process turns autograd off for good
        assert service.dimension == 24
        served = np.stack(service.embed_vectors(texts, prompt=service.sentence.prompts["query"]))
    finally:
        torch.set_grad_enabled(grad)
    expected = theirs.encode(texts, prompt_name="query", convert_to_numpy=True)
    served /= np.linalg.norm(served, axis=1, keepdims=True)  # the route applies the final Normalize itself
    assert np.abs(served - expected).max() < 1e-5
    card = (out / "README.md").read_text()  # the model card: data, loss, settings and results of the run
    for fact in ("70 rows of pairs", "loss: MultipleNegativesRankingLoss", "query prompt: query: ",
                 f"| ndcg@10 | {result['ndcg@10']:.4f} |", 'prompt_name="query"'):
        assert fact in card, fact
    # The Dense layer trained: its weights moved from the starting directory's.
    start = load_sentence_encoder(st_dir)
    assert not torch.equal(start.dense[0].linear.weight, encoder.dense[0].linear.weight)


def test_kill_9_and_resume_give_bitwise_the_same_weights(tmp_path, st_dir, data):
    """Killed (SIGKILL) after a checkpoint and resumed, the run ends with the same weights as one that never
    stopped: the batches' order, the Dense layer, the learned scale and the optimizer all come back from the
    checkpoint."""
    from kill_utils import whole_and_resumed

    def args(out: Path) -> list[str]:
        return ["finetune", "embed", "--model", str(st_dir), "--train", str(data / "train.jsonl"), "--dev",
                str(data / "dev.jsonl"), "--batch-size", "8", "--epochs", "3", "--precision", "fp32", "--matmul",
                "torch", "--save-every", "2", "--learn-scale", "--out", str(out)]

    whole, out = whole_and_resumed(args, tmp_path, seed=3, OMP_NUM_THREADS="1")
    a, b = load_sentence_encoder(whole), load_sentence_encoder(out)
    for (name, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items()):
        assert torch.equal(x, y), name
    # The learned scale moved from 20, and ended the same in both runs (the model card records it).
    import re

    ends = [re.search(r"20 at the start, ([0-9.]+) at the end", (d / "README.md").read_text()).group(1)
            for d in (tmp_path / "whole", out)]
    assert ends[0] == ends[1] and float(ends[0]) != 20.0


@pytest.mark.parametrize("rows, flags, message", [
    ([{"query": "a"}], (), r"train.jsonl: 1 text column \(query\)"),
    ([{"query": "a", "positive": " "}], (), r"train.jsonl:1: column 'positive' is empty"),
    ([{"a": "x", "b": "y", "c": "z", "d": "w", "score": 1}], (), r"train.jsonl:1: column 'score' is 1; with 2 "
                                                                  r"negatives give a list of 2 margins or 3 scores"),
    ([{"a": "x", "b": "y", "c": "z", "score": [1, 2, 3]}], (), r"column 'score' holds 3 numbers; with 1 negatives"),
    ([{"a": "x", "b": "y", "c": "z", "score": 1}, {"a": "u", "b": "v", "c": "w", "score": [1, 2]}], (),
     r"train.jsonl:2: column 'score' holds \[1.0, 2.0\], unlike the first row's 1.0"),
    ([{"a": "x", "b": "y", "c": "z", "score": 1}], ("--loss", "cosent"), r"--loss CoSENTLoss trains on scored pairs; "
                                                                         r".* holds scored triplets: use MarginMSELoss"),
    ([{"a": "x", "b": "y", "score": "high"}], (), r"train.jsonl:1: column 'score' is 'high', not a number"),
    ([{"a": "x", "b": "y"}, {"a": "x", "c": "y"}], (), r"train.jsonl:2: columns a, c differ"),
    ([{"a": "x", "b": "x"}], (), r"train.jsonl:1: one text in two columns"),
    ([{"a": "x", "b": "y"}], ("--loss", "CoSENTLoss"), r"--loss CoSENTLoss trains on scored pairs"),
    ([{"a": "x", "b": "y", "label": 0.5}], ("--loss", "mnrl"), r"holds scored pairs"),
    ([{"a": "x", "b": "y"}], ("--loss", "TripletLoss"), r"--loss TripletLoss: use one of"),
    ([{"a": "x", "b": "y"}], ("--text-column", "a"),
     r"text_column \(--text-column\): embed does not read it \(.*retrieval tasks read their rows by column shape\)"),
    ([{"a": "x", "b": "y", "label": 0.5}], ("--learn-scale",), r"--learn-scale: CoSENTLoss's scale is fixed"),
    ([{"a": "x", "b": "y"}], ("--learn-scale", "--scale", "200"), r"a learned scale starts at most at 100"),
    ([{"a": "x", "b": "y"}], ("--learn-scale", "--scale-lr", "0"), r"scale_lr \(--scale-lr\) must be a positive"),
    ([{"a": "x", "b": "y", "c": "z", "score": 1}], ("--loss", "kl"), r"--loss DistillKLDivLoss needs the teacher's "
                                                                     r"score of every passage \(the positive's, then"),
])
def test_bad_training_data_is_refused_in_one_line(tmp_path, st_dir, data, capsys, rows, flags, message):
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "dev.jsonl").write_text((data / "dev.jsonl").read_text())
    assert _train(st_dir, tmp_path, tmp_path / "out", *flags) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("bertforge: error:"), err
    import re

    assert re.search(message, err[0]), err[0]


def test_a_hugging_face_dataset_is_read_by_its_columns(tmp_path):
    """hf:NAME:SPLIT reads a dataset as `datasets.load_dataset` does (here a local dataset folder, as a Hub
    dataset's files lie once downloaded): its columns in order, the score column making scored pairs."""
    pytest.importorskip("datasets")
    folder = tmp_path / "my-pairs"
    (folder / "data").mkdir(parents=True)
    rows = [{"sentence1": f"text {i}", "sentence2": f"other {i}", "score": i / 4} for i in range(5)]
    (folder / "data" / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    data = read_tuples(f"hf:{folder}:train")
    assert data.columns == ["sentence1", "sentence2"] and data.shape == "scored pairs"
    assert data.rows[3] == ("text 3", "other 3") and list(data.scores) == [0.0, 0.25, 0.5, 0.75, 1.0]
    from bertforge.errors import InputError

    with pytest.raises(InputError, match=r"hf:.*my-pairs:test: cannot load"):
        read_tuples(f"hf:{folder}:test")
    with pytest.raises(InputError, match=r"expected hf:NAME:SPLIT"):
        read_tuples("hf:only-a-name")


def test_a_beir_query_without_a_positive_is_refused(tmp_path):
    folder = tmp_path / "beir"
    (folder / "qrels").mkdir(parents=True)
    (folder / "corpus.jsonl").write_text('{"_id": "d1", "text": "a"}\n{"_id": "d2", "text": "b"}\n')
    (folder / "queries.jsonl").write_text('{"_id": "q1", "text": "x"}\n{"_id": "q2", "text": "y"}\n')
    (folder / "qrels" / "train.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\nq2\td2\t0\n")
    from bertforge.errors import InputError

    with pytest.raises(InputError, match=r"qrels/train.tsv: query 'q2' has no relevant document"):
        read_tuples(str(folder), "train")


def test_gradcache_gives_the_uncached_gradients(st_dir, data):
    """--mini-batch-size: the loss and every parameter's gradient equal the whole batch's, embedded 3 texts at a time
    (with Matryoshka dimensions on top, as they compose)."""
    from bertforge.retrieval.beir import from_pairs
    from bertforge.tasks.embedding import EmbeddingTask, Prompts

    rows = read_tuples(str(data / "train.jsonl"))
    tok = load_tokenizer(st_dir)
    for dims, learned in (((), False), ((24, 8), False), ((), True)):
        grads, values = [], []
        for mini in (None, 3):
            model = load_sentence_encoder(st_dir).eval()  # no dropout: the two paths draw their masks differently
            if learned:  # a learned scale's gradient is cached too
                model.learn_scale(20.0)
            task = EmbeddingTask(rows, from_pairs([("a", "b")], "-"), tok, 48, 8, 0, "MultipleNegativesRankingLoss",
                                 None, "cosine", Prompts("query: "), mini_batch_size=mini, dims=dims)
            value, grad = first_step_gradients(task, model)
            values.append(value)
            grads.append(grad)
        assert values[0] == pytest.approx(values[1], rel=1e-6)
        assert grads[0].keys() == grads[1].keys() and len(grads[0]) > 10
        assert ("log_scale" in grads[0]) == learned
        for name in grads[0]:
            torch.testing.assert_close(grads[1][name], grads[0][name], rtol=1e-4, atol=1e-6, msg=name)


def test_matryoshka_and_gradcache_settings_are_checked(tmp_path, st_dir, data, capsys):
    for flags, message in ((("--matryoshka-dims", "64,8"), "64 is more than the model's 24 dimensions"),
                           (("--matryoshka-dims", "8,8"), "must be distinct positive integers"),
                           (("--mini-batch-size", "9"), r"mini_batch_size \(--mini-batch-size\) 9 must lie between 1 "
                                                        r"and --batch-size \(8\)")):
        assert _train(st_dir, data, tmp_path / "out", *flags) == 2
        err = capsys.readouterr().err.strip().splitlines()
        import re

        assert len(err) == 1 and re.search(message, err[0]), err


def test_two_processes_equal_one_with_the_global_batch(tmp_path, st_dir, data):
    """torchrun with 2 CPU processes of --batch-size 4 ends with the weights of 1 process of --batch-size 8: each
    global batch is split between them and the in-batch negatives are gathered from both (with gradients); the
    learned scale's gradient is reduced like the weights'."""
    from ddp_utils import one_and_two_processes, without_dropout

    # 64 rows, no text twice: every global batch of 8 is full, so both runs have the same batches and schedule.
    texts = _sentences(128, 9, 3, 12)
    rows = [{"query": f"{i} {q}", "positive": f"{i} {p}"} for i, (q, p) in enumerate(zip(texts[::2], texts[1::2]))]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    model = without_dropout(st_dir, tmp_path / "model")
    one_and_two_processes(["finetune", "embed", "--model", str(model), "--train", str(tmp_path / "train.jsonl"),
                           "--dev", str(data / "dev.jsonl"), "--precision", "fp32", "--matmul", "torch", "--max-steps",
                           "3", "--lr", "1e-3", "--eval-every", "100", "--learn-scale"], 8, tmp_path)
    a, b = load_sentence_encoder(tmp_path / "one"), load_sentence_encoder(tmp_path / "two")
    start = load_sentence_encoder(st_dir)
    for (name, x), (_, y), (_, z) in zip(a.state_dict().items(), b.state_dict().items(), start.state_dict().items()):
        torch.testing.assert_close(y, x, atol=2e-6, rtol=0, msg=lambda m: f"{name}: {m}")
    assert any(not torch.equal(x, z) for x, z in zip(a.state_dict().values(), start.state_dict().values()))


def test_the_memory_check_counts_texts_per_forward(st_dir, data):
    """The loop's pre-flight memory check sizes a step by the texts one forward holds: every column of an
    embedder's rows, but one GradCache mini-batch however large the batch (a batch of 1,024 with mini-batches of
    32 was refused as needing 60 GB)."""
    from bertforge.retrieval.beir import from_pairs
    from bertforge.tasks.embedding import EmbeddingTask, Prompts
    from bertforge.training.memory import step_bytes

    rows = read_tuples(str(data / "train.jsonl"))
    tok = load_tokenizer(st_dir)
    plain = EmbeddingTask(rows, from_pairs([("a", "b")], "-"), tok, 48, 8, 0, "MultipleNegativesRankingLoss", None,
                          "cosine", Prompts())
    cached = EmbeddingTask(rows, from_pairs([("a", "b")], "-"), tok, 48, 8, 0, "MultipleNegativesRankingLoss", None,
                           "cosine", Prompts(), mini_batch_size=32)
    assert plain.activation_rows(1024) == 2048 and cached.activation_rows(1024) == 32
    model = load_sentence_encoder(st_dir)
    assert step_bytes(model, cached.activation_rows(1024), 256) < step_bytes(model, plain.activation_rows(32), 256)


def test_training_takes_sentence_transformer_trainers_steps(tmp_path, st_dir, data):
    """The whole recipe, not only the loss: from the same directory with dropout off, one batch of every row per
    epoch (so neither sampler's order matters), `finetune embed` and SentenceTransformerTrainer log the same
    MultipleNegativesRankingLoss at every step (schedule, warmup, AdamW's decay groups, clipping, the Dense
    layer's training) and end with the same vectors."""
    import datasets
    from sentence_transformers import SentenceTransformerTrainer, SentenceTransformerTrainingArguments
    from sentence_transformers.losses import MultipleNegativesRankingLoss

    from st_trainer_utils import reference_losses, without_dropout

    start = without_dropout(st_dir, tmp_path / "start")
    rows = [json.loads(line) for line in (data / "train.jsonl").read_text().splitlines()][:8]
    assert len({r["positive"] for r in rows}) == len({r["query"] for r in rows}) == 8
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    steps, lr = 4, 5e-3
    out = tmp_path / "ours"
    assert main(["finetune", "embed", "--model", str(start), "--train", str(tmp_path / "train.jsonl"), "--dev",
                 str(data / "dev.jsonl"), "--batch-size", "8", "--epochs", str(steps), "--lr", str(lr),
                 "--weight-decay", "0.3", "--eval-every", "100", "--log-every", "1", "--precision", "fp32",
                 "--matmul", "torch", "--out", str(out), "--json"]) == 0
    ours = [json.loads(line)["loss"] for line in (out / "metrics.jsonl").read_text().splitlines()]

    model = st.SentenceTransformer(str(start), device="cpu")
    train = datasets.Dataset.from_dict({c: [r[c] for r in rows] for c in ("query", "positive")})
    theirs = reference_losses(SentenceTransformerTrainer, SentenceTransformerTrainingArguments, model,
                              MultipleNegativesRankingLoss(model), train, tmp_path / "st", 8, lr, steps, 0.3)
    assert len(ours) == len(theirs) == steps
    assert ours[-1] < ours[0] - 1e-3  # the weights moved: the comparison below is not of an idle model
    assert ours == pytest.approx(theirs, abs=1e-4)
    model.eval()
    texts = _sentences(6, 7, 2, 20)
    before = st.SentenceTransformer(str(start), device="cpu").encode(texts, convert_to_numpy=True)
    expected = model.encode(texts, convert_to_numpy=True)
    got = st.SentenceTransformer(str(out), device="cpu").encode(texts, convert_to_numpy=True)
    # Adam turns float rounding in near-zero gradients into a fraction of a step (see test_rerank's twin): the
    # vectors agree to a small part of how far training moved them.
    assert np.abs(got - expected).max() <= 0.01 * np.abs(expected - before).max()
    assert np.abs(expected - before).max() > 1e-2


def test_gradcache_replays_each_devices_random_state(monkeypatch):
    """GradCache's second run of a call draws the masks of its first on the CPU and on each CUDA device the model is
    on, and leaves the caller's states as they were (a CUDA run used to replay the CPU state alone, so its dropout
    drew other masks). No GPU here: device 0's generator is a stand-in, read and set through torch.cuda's calls."""
    from bertforge.training.gradcache import RandomState

    device = {0: torch.tensor([1, 2, 3], dtype=torch.uint8)}
    monkeypatch.setattr(torch.cuda, "get_rng_state", lambda d=0: device[int(d)].clone())
    monkeypatch.setattr(torch.cuda, "set_rng_state", lambda state, d=0: device.__setitem__(int(d), state.clone()))
    captured = RandomState([0])
    torch.rand(3)  # the first run draws: both generators move on
    device[0] = torch.tensor([7, 7, 7], dtype=torch.uint8)
    cpu_after, device_after = torch.get_rng_state(), device[0].clone()
    with captured.replayed():
        assert torch.equal(torch.get_rng_state(), captured.cpu)
        assert torch.equal(device[0], torch.tensor([1, 2, 3], dtype=torch.uint8))
        torch.rand(3)
    assert torch.equal(torch.get_rng_state(), cpu_after) and torch.equal(device[0], device_after)
    assert RandomState.devices_of(torch.nn.Linear(2, 2)) == []  # a CPU model replays the CPU state alone

