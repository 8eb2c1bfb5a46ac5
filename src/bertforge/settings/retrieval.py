"""The retrieval trainers' settings (`finetune embed`, `sparse`, `colbert`, `rerank`): fine-tuning's
(`finetune.FinetuneConfig`) with the groups they share (`RetrievalData`: rows read by column shape and a BEIR
folder's splits; `PromptSettings`; `GradCacheSettings`) and each trainer's own model and loss settings."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..errors import ConfigError
from ..losses.registry import help_line
from .fields import Settings, defaults, flag, setting
from .finetune import FinetuneConfig


@dataclass
class RetrievalData(Settings):
    """What every retrieval trainer reads: rows by column shape, a BEIR folder's splits, the scores' scale."""

    train: str = setting("", "training rows: .jsonl/.tsv/.csv by column shape ((anchor, positive[, negatives...]) or "
                             "(text1, text2, score)), a BEIR folder, or hf:NAME:SPLIT")
    dev: str = setting("", "evaluation: a BEIR folder (its --dev-split qrels) or a (query, passage) pair file "
                           "(none: train, and write the final model unselected)")
    train_split: str = setting("train", "the qrels split a BEIR folder trains on")
    dev_split: str = setting("dev", "the qrels split a BEIR folder evaluates on")
    scale: float | None = setting(None, "the scores' scale in the loss (default: the loss's own)")

    def check(self) -> None:
        if self.scale is not None and not (math.isfinite(self.scale) and self.scale > 0):
            raise ConfigError(f"{flag('scale')} must be a positive number")
        if self.pack:
            raise ConfigError(f"{flag('pack')}: {self.task} already unpads every text; packing is not supported")


@dataclass
class GradCacheSettings(Settings):
    """What each trainer that embeds texts (embed, sparse, colbert) takes for GradCache."""

    mini_batch_size: int | None = setting(None, "GradCache (sentence-transformers' Cached* losses, PyLate's "
                                                "CachedContrastive): embed this many texts at a time, so memory stays "
                                                "flat in --batch-size while the gradients are the whole batch's")

    def check(self) -> None:
        if self.mini_batch_size is not None and not 1 <= self.mini_batch_size <= self.batch_size:
            raise ConfigError(f"{flag('mini_batch_size')} {self.mini_batch_size} must lie between 1 and "
                              f"--batch-size ({self.batch_size})")


@dataclass
class PromptSettings(Settings):
    """What `finetune embed` and `finetune sparse` share: a prompt before each query and each document."""

    query_prompt: str | None = setting(None, "put before every query (a row's first text), saved as the prompt named "
                                             "'query' (default: the model directory's query prompt, if it has one)")
    document_prompt: str | None = setting(None, "put before every other text, saved as the prompt named 'document' "
                                                "(default: the model directory's document prompt, if it has one)")


@dataclass
@defaults(task="embed", out="bertforge-embed", epochs=1.0)
class EmbedConfig(RetrievalData, PromptSettings, GradCacheSettings, FinetuneConfig):
    """Everything `bertforge finetune embed` takes: fine-tuning's loop and model, a bi-encoder's data and loss."""

    loss: str | None = setting(None, help_line("embed"))
    similarity: str | None = setting(None, "similarity function: cosine or dot, saved as the model's "
                                           "similarity_fn_name (default: the directory's, else cosine)")
    pooling: str | None = setting(None, "pooling of a checkpoint without one: mean (default), cls, max, ...; replaces a "
                                        "sentence-transformers directory's")
    normalize: bool = setting(False, "add a Normalize module (a sentence-transformers directory keeps its own)")
    matryoshka_dims: str | None = setting(None, "e.g. 384,256,128,64: train every leading slice of the vectors to "
                                                "work alone (MatryoshkaLoss: the loss summed over the slices)")
    learn_scale: bool = setting(False, "train the in-batch loss's scale (starting at --scale, default 20) with the "
                                       "model, as CLIP learns its temperature (at most 100)")
    scale_lr: float = setting(1e-3, "peak learning rate of a learned scale (--learn-scale): the model's rate would "
                                    "leave it where it starts")

    def check(self) -> None:
        if self.similarity not in (None, "cosine", "dot"):
            raise ConfigError(f"{flag('similarity')} must be cosine or dot, not {self.similarity!r}")
        if not (math.isfinite(self.scale_lr) and self.scale_lr > 0):
            raise ConfigError(f"{flag('scale_lr')} must be a positive number")
        self.dimensions()

    def dimensions(self) -> tuple[int, ...]:
        """--matryoshka-dims as distinct positive integers, largest first (none: ())."""
        if not self.matryoshka_dims:
            return ()
        try:
            dims = [int(d) for d in str(self.matryoshka_dims).split(",") if d.strip()]
        except ValueError:
            dims = []
        if not dims or min(dims) < 1 or len(set(dims)) != len(dims):
            raise ConfigError(f"{flag('matryoshka_dims')} must be distinct positive integers such as 384,256,128, "
                              f"not {self.matryoshka_dims!r}")
        return tuple(sorted(dims, reverse=True))


@dataclass
@defaults(task="sparse", out="bertforge-sparse", epochs=1.0)
class SparseConfig(RetrievalData, PromptSettings, GradCacheSettings, FinetuneConfig):
    """Everything `bertforge finetune sparse` takes: an embedder's data and loop, SPLADE's head and regularisers."""

    loss: str | None = setting(None, help_line("sparse"))
    pooling: str | None = setting(None, "SPLADE pooling over the tokens: max (default) or sum; replaces a SparseEncoder "
                                        "directory's")
    activation: str | None = setting(None, "relu (log(1 + relu), the default) or log1p_relu")
    query_regularizer_weight: float | None = setting(5e-5, "FLOPS weight on the queries (sentence-transformers' "
                                                           "documented 5e-5)")
    document_regularizer_weight: float = setting(3e-5, "FLOPS weight on the documents (sentence-transformers' "
                                                       "documented 3e-5)")
    max_active_dims: int | None = setting(None, "keep only this many largest weights per text at inference, saved "
                                                "with the model (SparseEncoder's max_active_dims)")
    inference_free: bool = setting(False, "inference-free SPLADE: queries get no encoder, only a learned weight per "
                                          "vocabulary word (SparseStaticEmbedding, starting at 1.0, behind a Router); "
                                          "an inference-free directory is one already")
    query_lr: float | None = setting(None, "peak learning rate of an inference-free model's query weights (default: "
                                           "--lr; sentence-transformers' recipe maps them to 1e-3)")

    def check(self) -> None:
        for name in ("query_regularizer_weight", "document_regularizer_weight"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value >= 0):
                raise ConfigError(f"{flag(name)} must be 0 or more")
        if self.pooling is not None and self.pooling not in ("max", "sum"):
            raise ConfigError(f"{flag('pooling')} must be max or sum, not {self.pooling!r}")
        if self.activation is not None and self.activation not in ("relu", "log1p_relu"):
            raise ConfigError(f"{flag('activation')} must be relu or log1p_relu, not {self.activation!r}")
        if self.max_active_dims is not None and self.max_active_dims < 1:
            raise ConfigError(f"{flag('max_active_dims')} must be a positive integer")
        if self.query_lr is not None and not (math.isfinite(self.query_lr) and self.query_lr > 0):
            raise ConfigError(f"{flag('query_lr')} must be a positive number")


@dataclass
@defaults(task="colbert", out="bertforge-colbert", epochs=1.0)
class ColbertConfig(RetrievalData, GradCacheSettings, FinetuneConfig):
    """Everything `bertforge finetune colbert` takes: an embedder's data and loop, ColBERT's settings and losses."""

    loss: str | None = setting(None, help_line("colbert"))
    dim: int = setting(128, "the token vectors' size (a new projection's; a ColBERT directory keeps its own)")
    query_length: int | None = setting(None, "tokens per query, its prefix and [MASK] expansion included "
                                             "(default: the directory's, else 32)")
    document_length: int | None = setting(None, "tokens per document at most, its prefix included (default: the "
                                                "directory's, else 180)")
    attend_to_expansion_tokens: bool | None = setting(None, "let the encoder attend to a query's [MASK] expansion "
                                                            "(default: the directory's, else no)")
    no_query_expansion: bool = setting(False, "no [MASK] expansion: queries keep their own tokens only")
    temperature: float = setting(1.0, "Contrastive: the MaxSim scores are divided by it (PyLate's default 1)")

    def check(self) -> None:
        if self.scale is not None:
            raise ConfigError(f"{flag('scale')}: ColBERT's Contrastive loss takes --temperature")
        if self.seq_len is not None:
            raise ConfigError(f"{flag('seq_len')}: a ColBERT model's lengths are --query-length and --document-length")
        if self.dim < 1:
            raise ConfigError(f"{flag('dim')} must be a positive integer")
        for name in ("query_length", "document_length"):
            value = getattr(self, name)
            if value is not None and value < 2:
                raise ConfigError(f"{flag(name)} must be at least 2 (the prefix and one token)")
        if not (math.isfinite(self.temperature) and self.temperature > 0):
            raise ConfigError(f"{flag('temperature')} must be a positive number")


@dataclass
@defaults(task="rerank", out="bertforge-rerank", epochs=1.0)
class RerankConfig(RetrievalData, FinetuneConfig):
    """Everything `bertforge finetune rerank` takes: fine-tuning's loop and model, a cross-encoder's data and loss."""

    loss: str | None = setting(None, help_line("rerank"))
    num_negatives: int = setting(4, "MultipleNegativesRankingLoss: other rows' passages drawn as each query's "
                                    "in-batch negatives")
    pos_weight: float | None = setting(None, "BinaryCrossEntropyLoss: weight of the positive label")
    candidates: str | None = setting(None, "the first stage's ranking of the --dev queries: a TREC run file (e.g. "
                                           "from bertforge evaluate retrieval --run)")
    rerank_top_k: int = setting(50, "candidates reranked per --dev query")

    def check(self) -> None:
        if self.num_negatives < 0:
            raise ConfigError(f"{flag('num_negatives')} must be 0 or more")
        if self.rerank_top_k < 1:
            raise ConfigError(f"{flag('rerank_top_k')} must be at least 1")
        if self.pos_weight is not None and not (math.isfinite(self.pos_weight) and self.pos_weight > 0):
            raise ConfigError(f"{flag('pos_weight')} must be a positive number")
