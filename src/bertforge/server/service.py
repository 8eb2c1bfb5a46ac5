"""What the server serves: one checkpoint, its tokenizer, and a runner per endpoint.

Every runner goes through `pipelines` (the one inference path), so a server answer equals
`bertforge predict` on the same input. Token counts, for batching budgets, usage reports and
`/tokenize`, come from a second tokenizer instance: the pipelines' tokenizer runs in worker
threads, and a `tokenizers` backend keeps truncation settings as state.
"""

from __future__ import annotations

import asyncio
import functools
import threading
from concurrent.futures import ThreadPoolExecutor
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from .. import __version__
from ..constants import INFERENCE_BACKENDS
from ..errors import InputError
from ..inference import pipelines


@dataclass
class Limits:
    """What the server accepts and how it batches (the `bertforge serve` flags)."""

    max_body_bytes: int = 2_000_000
    max_texts: int = 2048
    max_chars: int | None = None  # None: from the model's length (`default_max_chars`), once it is loaded
    auto_truncate: bool = False
    batch_wait_ms: float = 0.0
    max_batch_tokens: int = 16_384
    max_concurrent_requests: int = 512
    api_key: str | None = None
    served_model_name: str | None = None
    backend: str = INFERENCE_BACKENDS[0]
    request_timeout_s: float = 300.0

    def __post_init__(self) -> None:
        if self.max_batch_tokens < 512:
            raise InputError("--max-batch-tokens must be at least 512: one full-length input must fit a batch")
        for name in ("max_body_bytes", "max_texts", "max_chars", "max_concurrent_requests"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise InputError(f"--{name.replace('_', '-')} must be at least 1")
        if self.batch_wait_ms < 0:
            raise InputError("--batch-wait-ms must be >= 0")
        if not self.request_timeout_s > 0:
            raise InputError("--request-timeout-s must be positive")


CHARS_PER_POSITION = 20  # well above any tokenizer's characters per token: the limit is for abuse, not for text


def default_max_chars(positions: int) -> int:
    """--max-chars when not given: 20 characters per position the model reads, at least the 10,000 it was
    before it followed the model (10,240 for a 512-position BERT, 163,840 for ModernBERT's 8,192), so that
    no input the model can read whole is turned away for its characters."""
    return max(10_000, CHARS_PER_POSITION * positions)


def grouped(run: Callable[..., list]) -> Callable[[list[tuple[Any, tuple]]], list]:
    """A runner of `(input, options)` items made from `run(inputs, *options) -> one result per input`:
    the items that share options run together, and the results come back in the items' order."""
    def runner(items: list[tuple[Any, tuple]]) -> list:
        results: list = [None] * len(items)
        groups: dict[tuple, list[int]] = {}
        for i, (_, options) in enumerate(items):
            groups.setdefault(tuple(options), []).append(i)
        for options, rows in groups.items():
            for i, result in zip(rows, run([items[i][0] for i in rows], *options)):
                results[i] = result
        return results

    return runner


# The task names whose route is named otherwise.
_ROUTE_OF = {"splade": "/embed_sparse", "multi_vector": "/embed_multi_vector"}


class Service:
    """The model behind the endpoints. `runners[name](items) -> results`, one per item."""

    def __init__(self, model_dir: str, limits: Limits) -> None:
        import torch

        from ..interop.hf import architecture_of, head_of
        from ..interop.sentence_dir import cross_encoder_activation, sentence_pipeline
        from ..tokenization.kinds import load_tokenizer

        from ..interop.sparse_dir import encoder_dir, is_sparse_dir

        self.model_dir, self.limits = model_dir, limits
        # The model's own weights and tokenizer: the directory, or an inference-free SPLADE model's document encoder.
        weights_dir = encoder_dir(model_dir)
        self.architecture = architecture_of(weights_dir)
        from ..inference.backends import load

        from ..interop.colbert_dir import is_colbert_dir

        head = head_of(weights_dir)
        backend = limits.backend
        if backend == "auto" and (is_sparse_dir(model_dir) or is_colbert_dir(model_dir)):
            backend = "fused"  # their encoders run as eager copies of their own (`_sparse`, `_colbert`)
        self.model = load(head.cls.from_pretrained(weights_dir), backend, small_batches=True)
        self.route = getattr(self.model, "route", None)  # what --backend auto chose, and why
        self.config = self.model.config
        if limits.max_chars is None:  # set in place: the request schemas are built from these limits next
            limits.max_chars = default_max_chars(self.config.max_sequence_length)
        self.tokenizer = load_tokenizer(weights_dir)
        self.counter = load_tokenizer(weights_dir)
        self.counter_lock = threading.Lock()
        # Token counting, /tokenize and /decode run here, never on the event loop: a slow tokenizer (a backtracking
        # regular expression in a hostile tokenizer.json takes seconds per text) would stall every request and
        # /health. The tokenizers library releases the GIL while it encodes a batch, so the loop runs on meanwhile.
        self.tokenizing = ThreadPoolExecutor(max_workers=1, thread_name_prefix="bertforge-tokenize")

        self.splade = self.colbert = None
        if is_sparse_dir(model_dir):  # a SPLADE model: sparse vectors (/embed_sparse), never dense ones
            self.splade, self.sentence = self._sparse(model_dir, head, self.model)
        elif is_colbert_dir(model_dir):  # a ColBERT model: token vectors (/embed_multi_vector), MaxSim for /rerank
            self.colbert, self.sentence = self._colbert(model_dir)
        else:
            self.sentence = sentence_pipeline(model_dir, self.config.hidden_size)
        self.activation = cross_encoder_activation(weights_dir)  # a reranker's score: its CrossEncoder settings
        # The vectors are computed without a final Normalize step, which each endpoint applies
        # itself: the model's own setting for bertforge's /embed and OpenAI's, the request's
        # `normalize` for TEI's.
        steps = self.sentence.steps
        self.normalizes = bool(steps) and steps[-1][0] == "normalize"
        self.raw_sentence = replace(self.sentence, steps=steps[:-1]) if self.normalizes else self.sentence
        dense = [arg for kind, arg in steps if kind == "dense"]
        pooled = self.config.hidden_size * len(self.sentence.pooling)  # pooling modes are concatenated
        self.dimension = dense[-1].out_features if dense else pooled
        if self.splade is not None:
            self.dimension = self.config.vocab_size
        self.backbone = getattr(self.model, "backbone", self.model)
        self.name = limits.served_model_name or Path(model_dir).resolve().name
        torch.set_grad_enabled(False)
        self.tasks = ({"splade", *head.tasks} if self.splade is not None
                      else {"multi_vector", "rerank", *head.tasks} if self.colbert is not None
                      else {"embed", *head.tasks})
        # Reranking reads a cross-encoder: a sequence classifier with one relevance logit (or two
        # classes, "not relevant" and "relevant", whose second probability is the score).
        if "classify" in self.tasks and self.config.num_labels in (1, 2):
            self.tasks.add("rerank")
        self.tasks.add("embed_all")
        # Each runner takes (input, options) items from any mix of requests; items that share options
        # run together (`grouped`), so one request's settings never leak into another's.
        model, tok = self.model, self.tokenizer
        self.runners = {
            "embed": grouped(self.embed_vectors),
            "embed_all": grouped(lambda inputs, side: pipelines.token_vectors(
                self.backbone, tok, inputs, self.embed_max_tokens, side)),
            "fill-mask": grouped(lambda texts, top_k, targets: pipelines.fill_mask(
                model, tok, texts, top_k=top_k, targets=list(targets) if targets else None)),
            "classify": grouped(self.classify_items),
            "rerank": grouped(self.relevance if self.colbert is None else self.maxsim_relevance),
            "multi_vector": grouped(self.multi_vectors),
            "splade": grouped(self.sparse_vectors),
            "ner": grouped(lambda texts, aggregation, stride: pipelines.ner(model, tok, texts, aggregation, stride)),
            "qa": grouped(lambda items, max_length, stride, max_answer_len: pipelines.answer(
                model, tok, items, max_length=max_length, stride=stride, max_answer_len=max_answer_len)),
        }
        self.tasks &= set(self.runners)  # e.g. `regress` is /classify's answer for a one-logit model

    # ------------------------------------------------------------------ lengths
    @property
    def embed_max_tokens(self) -> int:
        """The longest input /embed reads: the sentence-transformers max_seq_length, else the positions."""
        return min(self.sentence.max_length or self.tokenizer.model_max_length, self.config.max_sequence_length)

    @property
    def max_input_length(self) -> int:
        """The longest input the model's own task reads (TEI's /info `max_input_length`)."""
        return self.embed_max_tokens if self.kind == "embedding" else self.config.max_sequence_length

    @property
    def kind(self) -> str:
        """TEI's model type: "reranker" (one logit), "classifier", or "embedding"."""
        if "rerank" in self.tasks and self.config.num_labels == 1:  # TEI's rule: one logit is a reranker
            return "reranker"
        return "classifier" if "classify" in self.tasks else "embedding"

    async def off_loop(self, work: Callable[..., Any], *args: Any) -> Any:
        """`work(*args)` (tokenizer work) in the tokenizing thread, awaited: the event loop stays free."""
        return await asyncio.get_running_loop().run_in_executor(self.tokenizing, functools.partial(work, *args))

    async def tokens(self, texts: list[str | list[int]], pairs: list[str] | None = None) -> list[int]:
        """`token_counts`, off the event loop."""
        return await self.off_loop(self.token_counts, texts, pairs)

    def token_counts(self, texts: list[str | list[int]], pairs: list[str] | None = None) -> list[int]:
        """Tokens per input, special tokens included and nothing truncated; a token-id input counts its ids."""
        words = [i for i, t in enumerate(texts) if isinstance(t, str)]
        counts = [len(t) if not isinstance(t, str) else 0 for t in texts]
        if words:
            with self.counter_lock:
                encoded = self.counter([texts[i] for i in words], None if pairs is None else [pairs[i] for i in words])
            for i, ids in zip(words, encoded["input_ids"]):
                counts[i] = len(ids)
        return counts

    def encode(self, text: str) -> list[int]:
        """The ids the head pipelines read for `text`: special tokens included, cut to the model's length."""
        with self.counter_lock:
            return self.counter(text, truncation=True, max_length=self.config.max_sequence_length)["input_ids"]

    def decode(self, ids: list[list[int]], skip_special_tokens: bool) -> list[str]:
        """TEI's /decode: each list of ids back to text."""
        with self.counter_lock:
            return [self.counter.decode(row, skip_special_tokens=skip_special_tokens) for row in ids]

    def tokenize(self, texts: list[str], add_special_tokens: bool) -> list[list[dict[str, Any]]]:
        """TEI's /tokenize: per input, each token's id, text, whether special, and character span."""
        with self.counter_lock:
            encoded = self.counter(texts, add_special_tokens=add_special_tokens, return_offsets_mapping=True,
                                   return_special_tokens_mask=True)
        out = []
        for text, ids, offsets, special in zip(texts, encoded["input_ids"], encoded["offset_mapping"],
                                               encoded["special_tokens_mask"]):
            tokens = self.counter.convert_ids_to_tokens(ids)
            out.append([{"id": i, "text": tok if s else text[a:b], "special": bool(s),
                         "start": None if s else a, "stop": None if s else b}
                        for i, tok, (a, b), s in zip(ids, tokens, offsets, special)])
        return out

    # ------------------------------------------------------------------ runners
    def embed_vectors(self, inputs: list[str | list[int]], side: str = "right",
                      prompt: str | None = None) -> list[np.ndarray]:
        """Sentence vectors before any final normalisation, float32 [D] each; a long input is cut on `side`;
        `prompt` replaces the default prompt (None: the directory's default)."""
        return list(pipelines.embed(self.backbone, self.tokenizer, inputs, sentence=self.raw_sentence,
                                    truncation_side=side, prompt=prompt))

    def sparse_vectors(self, inputs: list[str | list[int]], side: str = "right", prompt: str | None = None,
                       is_query: bool = False) -> list:
        """A SPLADE model's sparse vectors, one scipy CSR row [1, V] per input; `prompt` as in `embed_vectors`.
        `is_query`: encode as queries (an inference-free model's query weights); else by the model's default route."""
        sparse = self.splade
        rows = sparse.encode(inputs, True if is_query else None, self.sentence.prompt if prompt is None else prompt,
                             max_length=None if is_query and sparse.model.inference_free else self.embed_max_tokens,
                             truncation_side=side)
        return [rows.getrow(n) for n in range(rows.shape[0])]

    def multi_vectors(self, inputs: list[str], is_query: bool) -> list[np.ndarray]:
        """A ColBERT model's token vectors, float32 [n_i, D] per input, as queries or documents (PyLate's encode)."""
        from ..inference.multi_vector import multi_vector_embed

        model, spec, tokenizer = self.colbert
        return multi_vector_embed(model, tokenizer, spec, list(inputs), is_query)

    def maxsim_relevance(self, pairs: list[tuple[str, str]], side: str = "right") -> list[tuple[float, float]]:
        """(MaxSim, MaxSim) of each (query, text) on a ColBERT model: the query's vectors' best matches in the text's,
        summed (a score, not a probability: both fields hold it)."""
        import torch

        from ..models.colbert import maxsim

        queries = list(dict.fromkeys(q for q, _ in pairs))
        q_vectors = dict(zip(queries, self.multi_vectors(queries, True)))
        d_vectors = self.multi_vectors([t for _, t in pairs], False)
        out = []
        for (query, _), d in zip(pairs, d_vectors):
            q = torch.from_numpy(q_vectors[query])
            score = float(maxsim(q[None], torch.ones(1, len(q), dtype=torch.bool), torch.from_numpy(d)[None],
                                 torch.ones(1, len(d), dtype=torch.bool))[0, 0])
            out.append((score, score))
        return out

    @staticmethod
    def _colbert(model_dir: str) -> tuple:
        """((ColbertEncoder, its settings, its tokenizer), a SentencePipeline giving the longest text it reads). The
        encoder is its own eager copy: the served backbone of another --backend does not take a query's unattended
        [MASK] expansion."""
        from ..interop.colbert_dir import load_colbert
        from ..interop.sentence_dir import SentencePipeline

        model, spec, tokenizer = load_colbert(model_dir)
        sentence = SentencePipeline(max_length=max(spec.query_length, spec.document_length), similarity="cosine")
        return (model.eval(), spec, tokenizer), sentence

    def _sparse(self, model_dir: str, head, served) -> tuple:
        """(SparseModel: a SpladeEncoder on the eager masked-LM model with the tokenizers, the directory's settings as a SentencePipeline: its prompts,
        maximum length and lower-casing; its pooling is never used, since no dense vector is served). `served` is the
        model as --backend loaded it: the same module under `torch` and `fused` (fused in place), used as it is;
        another backend's wrapper (bf16, ONNX, JAX) does not expose the masked-LM head's parts, so SPLADE gets its own
        eager copy."""
        from ..inference.sparse import SparseModel
        from ..interop.sentence_dir import SentencePipeline
        from ..interop.sparse_dir import check_vocabulary, read_query_weights, read_sparse_dir
        from ..models.splade import SpladeEncoder

        spec = read_sparse_dir(model_dir)
        mlm = served if isinstance(served, head.cls) else head.cls.from_pretrained(spec.encoder).eval()
        check_vocabulary(spec, mlm.config.vocab_size)
        sentence = SentencePipeline(max_length=spec.max_length, lowercase=spec.lowercase, prompt=spec.prompt,
                                    similarity=spec.similarity, prompts=spec.prompts)
        weights = read_query_weights(spec, mlm.config.vocab_size) if spec.query_dir is not None else None
        model = SpladeEncoder(mlm, spec.pooling, spec.activation, spec.max_active_dims, weights).eval()
        return SparseModel.of(model, spec, self.tokenizer), sentence

    def classify_items(self, items: list[tuple[str, str | None]], side: str = "right") -> list[dict]:
        """(text, pair or None) items from any mix of requests: singles and pairs run as two batches.
        Each row carries its `logits` beside the pipeline's label and scores."""
        def run(group: list[tuple[str, str | None]], with_pair: bool) -> list[dict]:
            return pipelines.classify(self.model, self.tokenizer, [text for text, _ in group],
                                      [pair for _, pair in group] if with_pair else None, logits=True,
                                      truncation_side=side)

        return grouped(run)([(item, (item[1] is not None,)) for item in items])

    def relevance(self, pairs: list[tuple[str, str]], side: str = "right") -> list[tuple[float, float]]:
        """(score, raw score) of each (query, text): sigmoid of a single logit, as TEI and
        sentence-transformers' CrossEncoder give it; for two classes, the second's probability."""
        return pipelines.relevance(self.model, self.tokenizer, pairs, truncation_side=side, activation=self.activation)

    # ------------------------------------------------------------------ description
    def info(self) -> dict[str, Any]:
        """TEI's /info shape: what is served and under which limits."""
        labels = {str(k): v for k, v in (self.config.id2label or {}).items()}
        kind = ({self.kind: {"pooling": "+".join(self.sentence.pooling)}} if self.kind == "embedding"
                else {self.kind: {"id2label": labels, "label2id": {v: int(k) for k, v in labels.items()}}})
        return {"model_id": self.name, "model_sha": None, "model_dtype": "float32", "model_type": kind,
                "served_model_name": self.name, "architecture": self.architecture,
                "max_concurrent_requests": self.limits.max_concurrent_requests,
                "max_input_length": self.max_input_length, "max_batch_tokens": self.limits.max_batch_tokens,
                "max_batch_requests": None, "max_client_batch_size": self.limits.max_texts,
                "max_chars_per_input": self.limits.max_chars,
                "auto_truncate": self.limits.auto_truncate, "tokenization_workers": 1, "version": __version__,
                "sha": None, "docker_label": None, "backend": self.route.describe() if self.route is not None else self.limits.backend,
                "endpoints": sorted(_ROUTE_OF.get(n, f"/{n}") for n in self.tasks)}
