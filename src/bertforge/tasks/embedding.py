"""Bi-encoder training: (anchor, positive[, negatives]) rows or scored pairs -> a sentence-transformers model.

Every text of a row is embedded by the one `SentenceEncoder` in a single forward (all columns of the
batch, padded once and unpadded inside the model: short queries cost what they are, not a passage's
length), then the loss (`losses/`, its row in `losses/registry.py`) compares the columns. Batches
never hold two copies of one text: with in-batch negatives a duplicate would be scored as its own
negative. Evaluation is retrieval on a BEIR folder (or pairs), nDCG@10 selecting the model.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np
import torch

from ..data.batching import collate
from ..data.retrieval import TupleData, read_tuples
from ..errors import InputError
from ..inference.loop import device_of, run_sorted
from ..losses import check_negatives, losses_of, resolve
from ..models.sentence_encoder import MAX_LEARNED_SCALE, SentenceEncoder
from ..retrieval.beir import RetrievalSet
from ..retrieval.evaluate import read_dev_set
from ..retrieval.metrics import evaluate_run
from ..retrieval.search import as_run, dense_top_k
from ..tokenization.base import Tokenizer
from ..training.distributed import world_size
from ..training.gradcache import cached
from ..training.model_card import Card
from .base import CardTask, length

log = logging.getLogger("bertforge")

# The losses whose scale `--learn-scale` trains: a softmax over the batch, as CLIP's. CoSENT's would only grow.
LEARNABLE_SCALE = ("MultipleNegativesRankingLoss", "MultipleNegativesSymmetricRankingLoss")


@dataclass
class Prompts:
    """What is put before queries (a row's first column) and documents (every other column), and the named prompts
    the trained directory keeps: each side under the name the model came with ("passage", "search_query", ...; else
    "query" and "document"), every other prompt of the model as it was, and its default prompt's name."""

    query: str = ""
    document: str = ""
    names: tuple[str, str] = ("query", "document")
    others: dict[str, str] = field(default_factory=dict)
    default_name: str | None = None

    def named(self) -> dict[str, str]:
        """sentence-transformers' `prompts` of a directory: the names `encode(prompt_name=...)` takes."""
        sides = {name: text for name, text in zip(self.names, (self.query, self.document)) if text}
        return {**self.others, **sides}


def resolve_prompts(query: str | None, document: str | None, own: dict[str, str],
                    default_name: str | None = None) -> Prompts:
    """The prompts a run trains and saves with: the model directory's own (`own`, its named prompts; a side's prompt
    found by the names that side goes by, as `evaluate retrieval` finds them), each replaced by its flag when one is
    given (None: not given). A flag that changes the directory's prompt says so in a warning."""
    from ..interop.sentence_dir import side_name

    texts, names = [], []
    for side, given in (("query", query), ("document", document)):
        name = side_name(own, side) or side
        kept = own.get(name, "")
        if given is not None and given != kept and kept:
            log.warning("--%s-prompt %r replaces the model's prompt %r (%r)", side, given, name, kept)
        texts.append(kept if given is None else given)
        names.append(name)
    others = {k: v for k, v in own.items() if k not in names}
    if default_name in names and not texts[names.index(default_name)]:
        default_name = None  # its prompt was removed (--query-prompt ""): no default is left to name
    return Prompts(texts[0], texts[1], (names[0], names[1]), others, default_name)


def resolve_similarity(given: str | None, own: str | None) -> str:
    """The run's similarity: --similarity when given (said when it changes the directory's `similarity_fn_name`),
    else the directory's, else cosine (sentence-transformers' default)."""
    if given is not None and own is not None and given != own:
        log.warning("--similarity %s replaces the model's similarity_fn_name %s", given, own)
    return given or own or "cosine"


def loss_name(name: str | None, data: TupleData) -> str:
    """The sentence-transformers class name of `--loss` (a short alias is accepted), checked against the data's
    shape; None picks in-batch negatives for rows, CoSENT for scored pairs, MarginMSE for a teacher's scores."""
    return resolve("embed", name, data).name


def unique_batches(rows: list[tuple[str, ...]], batch_size: int, seed: int, epoch: int) -> list[list[int]]:
    """The epoch's batches of row indices: shuffled by (seed, epoch), and no text twice in a batch (a row whose
    texts are already in the batch waits for a later one, as sentence-transformers' NoDuplicatesBatchSampler)."""
    remaining = list(np.random.default_rng([seed, 29, epoch]).permutation(len(rows)))
    batches = []
    while remaining:
        batch, seen, later = [], set(), []
        for i in remaining:
            texts = set(rows[i])
            if len(batch) < batch_size and not texts & seen:
                batch.append(int(i))
                seen |= texts
            else:
                later.append(i)
        batches.append(batch)  # never empty: a row's own texts are distinct (EmbeddingTask checks)
        remaining = later
    return batches


def global_batches(rows: list[tuple[str, ...]], batch_size: int, seed: int, epoch: int) -> list[list[int]]:
    """The epoch's global batches: `batch_size` rows per process, no text twice. In a torchrun job the processes
    split each global batch (`rank_rows`), so that they train exactly as one process on the global batch; a global
    batch too small to split evenly (the sampler's last ones) is left out there."""
    world = world_size()
    batches = unique_batches(rows, batch_size * world, seed, epoch)
    return [b for b in batches if len(b) == batch_size * world] if world > 1 else batches


def rank_rows(batches: list[list[int]], index: int, batch_size: int) -> tuple[int, slice]:
    """(which global batch, this process's slice of it) for micro-batch `index` (the loop gives process r the
    indices r, r + world, ...)."""
    world = world_size()
    part = index % world
    return index // world, slice(part * batch_size, (part + 1) * batch_size) if world > 1 else slice(None)


class EmbeddingTask(CardTask):
    """The Trainer's task for a `SentenceEncoder` (see `trainer.Task` and `base.Task`)."""

    card = Card("sentence-transformers", "sentence-transformers, sentence-similarity, feature-extraction",
                "sentence-similarity", "An embedder", "a bi-encoder: one vector per text", '''```python
from sentence_transformers import SentenceTransformer

model = SentenceTransformer("{path}")
queries = model.encode(["how do tides work?"]{query_prompt})
documents = model.encode(["Tides are caused by the moon's gravity."]{document_prompt})
print(model.similarity(queries, documents))
```''',
                "bertforge serves it as well: `bertforge serve --model {path}` (OpenAI `/v1/embeddings`, TEI `/embed` "
                "with `prompt_name`).")

    main_metric = "ndcg@10"
    greater_is_better = True
    kind = "embed"  # its losses' rows in `losses/registry.py`

    def __init__(self, data: TupleData, dev: RetrievalSet, tokenizer: Tokenizer, seq_len: int, batch_size: int,
                 seed: int, loss: str, scale: float | None, similarity: str, prompts: Prompts,
                 eval_batch_size: int = 64, mini_batch_size: int | None = None,
                 dims: tuple[int, ...] = (), lowercase: bool = False) -> None:
        self.data, self.dev, self.tokenizer = data, dev, tokenizer
        self.seq_len, self.batch_size, self.seed = seq_len, batch_size, seed
        self.loss_name = loss
        row = losses_of(self.kind)[loss]
        self.loss_fn = row.fn
        self.scale = row.scale if scale is None else scale
        self.similarity, self.prompts, self.eval_batch_size = similarity, prompts, eval_batch_size
        self.mini_batch_size, self.dims = mini_batch_size, dims
        self.lowercase = lowercase  # the directory's do_lower_case: `tokenizer` is a lower-casing copy then
        for line, row in zip(data.lines, data.rows):
            if len(set(row)) != len(row):
                raise InputError(f"{data.source}:{line}: one text in two columns (a positive equal to its anchor or "
                                 "a negative): it would be trained as both")
        # Every distinct (text, side) is tokenised once: a passage that is the positive of ten queries is one feature.
        self._ids: dict[tuple[str, bool], list[int]] = {}
        queries = {r[0] for r in data.rows}
        documents = {t for r in data.rows for t in r[1:]}
        self._encode(sorted(queries), True)
        self._encode(sorted(documents), False)
        self._epoch_batches: tuple[int, list[list[int]]] | None = None

    def _encode(self, texts: list[str], query: bool) -> None:
        prompt = self.prompts.query if query else self.prompts.document
        if not texts:
            return
        enc = self.tokenizer([prompt + t for t in texts], truncation=True, max_length=self.seq_len)
        for text, ids in zip(texts, enc["input_ids"]):
            self._ids[(text, query)] = ids

    def features(self, texts: list[str], query: bool) -> list[dict]:
        missing = [t for t in dict.fromkeys(texts) if (t, query) not in self._ids]
        self._encode(missing, query)
        return [{"input_ids": self._ids[(t, query)], "token_type_ids": [0] * len(self._ids[(t, query)])} for t in texts]

    def _batches(self, epoch: int) -> list[list[int]]:
        """The epoch's global batches: split between torchrun's processes, whose gathered negatives are then exactly
        one process's on the global batch."""
        if self._epoch_batches is None or self._epoch_batches[0] != epoch:
            self._epoch_batches = (epoch, global_batches(self.data.rows, self.batch_size, self.seed, epoch))
        return self._epoch_batches[1]

    def micro_batches_per_epoch(self, epoch: int) -> int:
        return len(self._batches(epoch)) * world_size()

    def activation_rows(self, batch_size: int) -> int:
        """Texts one forward with gradients holds (the loop's memory check): every column of the batch's rows, or
        one GradCache mini-batch, however large the batch."""
        texts = batch_size * len(self.data.columns)
        return min(self.mini_batch_size, texts) if self.mini_batch_size else texts

    def _rows_of(self, epoch: int, index: int) -> list[int]:
        """The rows of micro-batch `index`: this process's part of a global batch."""
        which, part = rank_rows(self._batches(epoch), index, self.batch_size)
        return self._batches(epoch)[which][part]

    def micro_batch(self, epoch: int, index: int) -> dict[str, torch.Tensor]:
        """Every text of the batch's rows, column by column (anchors, then positives, ...): one padded [C*B, T]
        batch; `scores` float [B] for scored pairs."""
        chosen = self._rows_of(epoch, index)
        rows = [self.data.rows[i] for i in chosen]
        features = []
        for c in range(len(self.data.columns)):
            features += self.features([r[c] for r in rows], query=c == 0)
        batch = collate(features, self.tokenizer.pad_token_id)
        if self.data.scores is not None:
            batch["scores"] = torch.tensor([self.data.scores[i] for i in chosen], dtype=torch.float32)
        return batch

    def loss(self, model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict]:
        # is_query: an inference-free SPLADE batch's query rows (see `SparseTask`).
        inputs = {k: batch[k] for k in ("input_ids", "attention_mask", "token_type_ids", "is_query") if k in batch}
        scores = batch.get("scores")
        encoder = getattr(model, "module", model)  # under DDP, the wrapped SentenceEncoder
        learned = encoder.log_scale is not None
        scale = encoder.scale() if learned else self.scale
        parts = {"scale": scale.detach()} if learned else {}
        if self.mini_batch_size:
            return cached(model, inputs, self.mini_batch_size, lambda v: self.vectors_loss(v, scores, scale),
                          (encoder.log_scale,) if learned else ()), parts
        return self.vectors_loss(model(**inputs), scores, scale), parts

    def vectors_loss(self, vectors: torch.Tensor, scores: torch.Tensor | None,
                     scale: float | torch.Tensor) -> torch.Tensor:
        """The loss of the batch's vectors float [C * B, D] (column by column); with Matryoshka dimensions, the sum
        of the loss on each leading slice of the vectors (sentence-transformers' MatryoshkaLoss, weights 1)."""
        columns = list(vectors.float().chunk(len(self.data.columns)))
        if not self.dims:
            return self.loss_fn(columns, scores, scale, self.similarity)
        return sum(self.loss_fn([c[..., :d] for c in columns], scores, scale, self.similarity) for d in self.dims)

    @torch.no_grad()
    def embed(self, model: SentenceEncoder, texts: list[str], query: bool) -> np.ndarray:
        """Sentence vectors float32 [len(texts), D] (with the query or document prompt), in input order."""
        def step(batch: dict, rows: list[int]) -> list:
            out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                        token_type_ids=batch["token_type_ids"])
            return list(out.float().cpu().numpy())

        vectors = run_sorted(self.features(texts, query), self.tokenizer.pad_token_id, self.eval_batch_size, step,
                             device=device_of(model))
        return np.stack(vectors)

    def card_settings(self, cfg) -> dict:
        learned = getattr(self, "learned_scale", None)
        scale = (f"learned (--learn-scale, rate {cfg.scale_lr:g}): {self.scale:g} at the start, {learned:.4g} at the "
                 "end" if learned is not None else self.scale)
        return {"similarity": self.similarity, "scale": scale, "GradCache mini-batch": self.mini_batch_size,
                "Matryoshka dimensions": list(self.dims) or None, "query prompt": self.prompts.query or None,
                "document prompt": self.prompts.document or None}

    def card_prompts(self) -> dict[str, str]:
        return self.prompts.named()

    def evaluate(self, model: SentenceEncoder) -> dict[str, float]:
        return evaluate_encoder(self, model, self.dev, self.similarity)[0]

    def save(self, model: SentenceEncoder, out, tokenizer: Tokenizer) -> None:
        """The trained encoder as a sentence-transformers directory, prompts and similarity included."""
        from ..interop.sentence_dir import save_sentence_dir

        save_sentence_dir(model, out, tokenizer, self.seq_len, self.prompts.named(), self.similarity,
                          self.prompts.default_name, lowercase=self.lowercase)
        if model.log_scale is not None:  # for the model card: where the learned scale ended
            self.learned_scale = float(model.scale())


def evaluate_encoder(task: EmbeddingTask, model: SentenceEncoder, data: RetrievalSet, similarity: str,
                     k: int = 100) -> tuple[dict[str, float], dict[str, dict[str, float]]]:
    """(metrics, run): the judged queries of `data` searched over its whole corpus, exactly."""
    queries = data.judged_queries()
    doc_ids = list(data.corpus)
    q = task.embed(model, list(queries.values()), query=True)
    d = task.embed(model, [data.corpus[i] for i in doc_ids], query=False)
    scores, indices = dense_top_k(q, d, k, similarity)
    run = as_run(list(queries), doc_ids, scores, indices)
    return evaluate_run(run, data.qrels)[0], run


def build(cfg, tokenizer: Tokenizer, train_path: str, dev_path: str, model: SentenceEncoder | None = None):
    """(encoder, task) for `finetune embed` (`cfg`: an `EmbedConfig`)."""
    from ..interop.hf import family_of, load_pretrained
    from ..interop.sentence_dir import read_sentence_dir, sentence_encoder

    data = read_tuples(train_path, cfg.train_split)
    row = resolve("embed", cfg.loss, data)
    loss = row.name
    check_negatives(row, data, cfg.batch_size, world_size())
    # The directory's pipeline is read once (None for a plain checkpoint: then only the flags decide).
    if model is None:
        backbone = load_pretrained(family_of(cfg.model).backbone, cfg.model)
        sentence = read_sentence_dir(cfg.model, backbone.config.hidden_size)
        model = sentence_encoder(backbone, sentence, cfg.model, cfg.pooling, True if cfg.normalize else None)
    else:
        sentence = read_sentence_dir(cfg.model)
    # Without --seq-len, a sentence-transformers directory trains at its own max_seq_length (sentence-transformers 6
    # keeps it as the tokenizer's model_max_length; older versions in sentence_bert_config).
    own = sentence and (sentence.max_length or min(tokenizer.model_max_length, 1 << 30))
    seq_len = length(cfg, model.config, own or None)
    # Every setting the directory carries is kept unless a flag changes it: its prompts (and default), similarity
    # and lower-casing, as its pooling, Dense layers and normalisation are by `load_sentence_encoder`.
    prompts = resolve_prompts(cfg.query_prompt, cfg.document_prompt, sentence.prompts if sentence else {},
                              sentence.default_prompt_name if sentence else None)
    similarity = resolve_similarity(cfg.similarity, sentence.similarity if sentence else None)
    if sentence is not None and cfg.pooling and (cfg.pooling,) != sentence.pooling:
        log.warning("--pooling %s replaces the model's pooling %s", cfg.pooling, "+".join(sentence.pooling))
    if sentence is not None and cfg.normalize and not sentence.normalize:
        log.warning("--normalize adds a Normalize module the model's directory does not have")
    lowercase = bool(sentence and sentence.lowercase)
    if cfg.learn_scale:
        if loss not in LEARNABLE_SCALE:
            raise InputError(f"--learn-scale: {loss}'s scale is fixed; it is learned for "
                             f"{' and '.join(LEARNABLE_SCALE)} only")
        initial = cfg.scale if cfg.scale is not None else row.scale
        if initial > MAX_LEARNED_SCALE:
            raise InputError(f"--scale {initial:g}: a learned scale starts at most at {MAX_LEARNED_SCALE:g}")
        model.learn_scale(initial, cfg.scale_lr / cfg.lr)
    dims = cfg.dimensions()
    if dims and dims[0] > model.dimension:
        raise InputError(f"--matryoshka-dims {cfg.matryoshka_dims}: {dims[0]} is more than the model's "
                         f"{model.dimension} dimensions")
    task = EmbeddingTask(data, read_dev_set(dev_path, cfg.dev_split),
                         tokenizer.lowercased() if lowercase else tokenizer, seq_len, cfg.batch_size,
                         cfg.seed, loss, cfg.scale, similarity, prompts, mini_batch_size=cfg.mini_batch_size, dims=dims,
                         lowercase=lowercase)
    return model, task
