"""What the server serves: one checkpoint, its tokenizer, and a runner per endpoint.

Every runner goes through `pipelines` (the one inference path), so a server answer equals
`bertforge predict` on the same input. Token counts, for batching budgets, usage reports and
`/tokenize`, come from a second tokenizer instance: the pipelines' tokenizer runs in worker
threads, and a `tokenizers` backend keeps truncation settings as state.
"""

from __future__ import annotations

import threading
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

    max_body_bytes: int = 1_000_000
    max_texts: int = 64
    max_chars: int = 10_000
    batch_wait_ms: float = 0.0
    max_batch_tokens: int = 16_384
    max_concurrent_requests: int = 512
    api_key: str | None = None
    served_model_name: str | None = None
    backend: str = INFERENCE_BACKENDS[0]

    def __post_init__(self) -> None:
        if self.max_batch_tokens < 512:
            raise InputError("--max-batch-tokens must be at least 512: one full-length input must fit a batch")
        for name in ("max_body_bytes", "max_texts", "max_chars", "max_concurrent_requests"):
            if getattr(self, name) < 1:
                raise InputError(f"--{name.replace('_', '-')} must be at least 1")
        if self.batch_wait_ms < 0:
            raise InputError("--batch-wait-ms must be >= 0")


class Service:
    """The model behind the endpoints. `runners[name](items) -> results`, one per item."""

    def __init__(self, model_dir: str, limits: Limits) -> None:
        import torch

        from ..interop.hf import architecture_of, head_of
        from ..interop.sentence_dir import sentence_pipeline
        from ..tokenization.kinds import load_tokenizer

        self.model_dir, self.limits = model_dir, limits
        self.architecture = architecture_of(model_dir)
        from ..inference.backends import load

        head = head_of(model_dir)
        self.model = load(head.cls.from_pretrained(model_dir), limits.backend)
        self.config = self.model.config
        self.tokenizer = load_tokenizer(model_dir)
        self.counter = load_tokenizer(model_dir)
        self.counter_lock = threading.Lock()
        self.sentence = sentence_pipeline(model_dir, self.config.hidden_size)
        # The vectors are computed without a final Normalize step, which each endpoint applies
        # itself: the model's own setting for bertforge's /embed and OpenAI's, the request's
        # `normalize` for TEI's.
        steps = self.sentence.steps
        self.normalizes = bool(steps) and steps[-1][0] == "normalize"
        self.raw_sentence = replace(self.sentence, steps=steps[:-1]) if self.normalizes else self.sentence
        dense = [arg for kind, arg in steps if kind == "dense"]
        pooled = self.config.hidden_size * len(self.sentence.pooling)  # pooling modes are concatenated
        self.dimension = dense[-1].out_features if dense else pooled
        self.backbone = getattr(self.model, "backbone", self.model)
        self.name = limits.served_model_name or Path(model_dir).resolve().name
        torch.set_grad_enabled(False)
        self.tasks = {"embed", *head.tasks}
        # Reranking reads a cross-encoder: a sequence classifier with one relevance logit (or two
        # classes, "not relevant" and "relevant", whose second probability is the score).
        if "classify" in self.tasks and self.config.num_labels in (1, 2):
            self.tasks.add("rerank")
        self.runners = {
            "embed": self.embed_vectors,
            "fill-mask": lambda texts: pipelines.fill_mask(self.model, self.tokenizer, texts),
            "classify": self.classify_items,
            "rerank": self.relevance,
            "ner": lambda texts: pipelines.ner(self.model, self.tokenizer, texts),
            "qa": lambda items: pipelines.answer(self.model, self.tokenizer, items),
        }
        self.tasks &= set(self.runners)  # e.g. `regress` is /classify's answer for a one-logit model

    # ------------------------------------------------------------------ lengths
    @property
    def embed_max_tokens(self) -> int:
        """The longest input /embed reads: the sentence-transformers max_seq_length, else the positions."""
        return min(self.sentence.max_length or self.tokenizer.model_max_length, self.config.max_sequence_length)

    def token_counts(self, texts: list[str], pairs: list[str] | None = None) -> list[int]:
        """Tokens per input, special tokens included and nothing truncated."""
        with self.counter_lock:
            encoded = self.counter(texts, pairs)
        return [len(ids) for ids in encoded["input_ids"]]

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
    def embed_vectors(self, texts: list[str]) -> list[np.ndarray]:
        """Sentence vectors before any final normalisation, float32 [D] each."""
        return list(pipelines.embed(self.backbone, self.tokenizer, texts, sentence=self.raw_sentence))

    def classify_items(self, items: list[tuple[str, str | None]]) -> list[dict]:
        """(text, pair or None) items from any mix of requests: singles and pairs run as two batches."""
        results: list = [None] * len(items)
        for with_pair in (False, True):
            rows = [i for i, (_, pair) in enumerate(items) if (pair is not None) == with_pair]
            if rows:
                pairs = [items[i][1] for i in rows] if with_pair else None
                for i, r in zip(rows, pipelines.classify(self.model, self.tokenizer, [items[i][0] for i in rows],
                                                         pairs)):
                    results[i] = r
        return results

    def relevance(self, pairs: list[tuple[str, str]]) -> list[tuple[float, float]]:
        """(score, raw score) of each (query, text): sigmoid of a single logit, as TEI and
        sentence-transformers' CrossEncoder give it; for two classes, the second's probability."""
        scored = pipelines.classify(self.model, self.tokenizer, [q for q, _ in pairs], [t for _, t in pairs])
        out = []
        for row in scored:
            if "value" in row:  # one logit
                raw = row["value"]
                out.append((float(1 / (1 + np.exp(-raw))), raw))
            else:
                probability = list(row["scores"].values())[1]
                out.append((probability, probability))
        return out

    # ------------------------------------------------------------------ description
    def info(self) -> dict[str, Any]:
        """TEI's /info shape: what is served and under which limits."""
        if "rerank" in self.tasks and self.config.num_labels == 1:  # TEI's rule: one logit is a reranker
            kind = {"reranker": {"id2label": {str(k): v for k, v in (self.config.id2label or {}).items()}}}
        elif "classify" in self.tasks:
            kind = {"classifier": {"id2label": {str(k): v for k, v in (self.config.id2label or {}).items()}}}
        else:
            kind = {"embedding": {"pooling": "+".join(self.sentence.pooling)}}
        return {"model_id": self.name, "model_sha": None, "model_dtype": "float32", "model_type": kind,
                "architecture": self.architecture, "max_concurrent_requests": self.limits.max_concurrent_requests,
                "max_input_length": self.config.max_sequence_length,
                "max_batch_tokens": self.limits.max_batch_tokens, "max_client_batch_size": self.limits.max_texts,
                "tokenization_workers": 1, "version": __version__, "backend": self.limits.backend,
                "endpoints": sorted(f"/{n}" for n in self.tasks)}
