"""The table of fine-tuning tasks: each task's name, the module that builds it, its settings class, the help of
its `finetune`, `distill` and `evaluate` commands, and what its output holds. The CLI, `finetune`, `distill` and
`evaluate` read this table and nothing else to know which tasks there are.

A task's module (`tasks/<module>.py`) provides `build(cfg, tokenizer, train, dev, model)` -> (model, task); the
task object it builds follows `base.Task`, whose defaults (save in the Hugging Face layout, no model card, ...) a
task overrides only where it differs. What the run needs before the task exists (where the backbone is) is the
row's, with a default a row's class overrides (`SparseSpec`). Adding a task is a module and a row here.

This module imports no torch: the CLI reads it to list the commands.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..settings import ColbertConfig, EmbedConfig, FinetuneConfig, RerankConfig, SparseConfig


@dataclass(frozen=True)
class TaskSpec:
    """One fine-tuning task."""

    name: str
    module: str  # tasks/<module>.py builds it
    settings: type  # the settings class of `finetune NAME` (and of --config files of its runs)
    summary: str  # `finetune NAME --help`
    distill: str | None = None  # `distill NAME --help`, for a task a student can learn from a teacher
    evaluate: str | None = None  # `evaluate NAME --help`, for a task scored on a labelled file
    card: bool = False  # its output carries a README.md model card (sentence-transformers' and PyLate's habit)
    evaluate_seq_len: int = 512  # `evaluate NAME`'s --seq-len default (cut to the model's positions)
    seq_len: int = 128  # `finetune NAME`'s --seq-len default (cut to the model's positions; `run_length`)
    jax: bool = False  # `--backend jax` fine-tunes it (the JAX engine has the sequence-classification head only)

    def build(self, cfg: Any, tokenizer: Any, train: str, dev: str, model: Any = None) -> tuple[Any, Any]:
        """(model, task) for a run of this task; a given `model` is evaluated as it is."""
        return importlib.import_module(f"{__package__}.{self.module}").build(cfg, tokenizer, train, dev, model)

    def model_folder(self, cfg: Any) -> Path:
        """The folder of `cfg.model` that holds the backbone's config and tokenizer: the directory itself."""
        return Path(cfg.model)


class SparseSpec(TaskSpec):
    """`finetune sparse`: an inference-free SparseEncoder directory keeps its masked-LM encoder and tokenizer in
    a subfolder."""

    def model_folder(self, cfg: Any) -> Path:
        from ..interop.sparse_dir import encoder_dir

        return encoder_dir(cfg.model)


TASKS: dict[str, TaskSpec] = {spec.name: spec for spec in (
    TaskSpec("classify", "classification", FinetuneConfig,
             "Fine-tune a sequence classifier (accuracy selects the model).",
             distill="""Distil a fine-tuned classifier into a smaller student.

    The student (by default the teacher's every other layer, or --model) is trained on the
    training file with the teacher's soft targets mixed with the gold labels (--alpha, at
    --temperature), on fine-tuning's loop: evaluation every epoch, the best model kept, exact
    resume. Reports the student's and the teacher's dev scores, sizes and speeds.""",
             evaluate="Score a fine-tuned classifier on a labelled file (accuracy, F1, MCC).", jax=True),
    TaskSpec("regress", "classification", FinetuneConfig,
             "Fine-tune a regressor of one score per text or pair (Pearson selects the model).",
             distill="Distil a fine-tuned regressor into a smaller student (mean-squared error to the teacher and "
                     "the gold score).",
             evaluate="Score a fine-tuned regressor on a labelled file (Pearson, Spearman)."),
    TaskSpec("ner", "token_classification", FinetuneConfig,
             "Fine-tune a token classifier for named entities (entity F1 selects the model).",
             distill="Distil a fine-tuned NER model into a smaller student (the teacher's tag distribution at "
                     "each word).",
             evaluate="Score a fine-tuned NER model on a CoNLL or JSONL file (entity F1, conlleval's rules)."),
    TaskSpec("qa", "question_answering", FinetuneConfig,
             "Fine-tune extractive question answering on SQuAD-format data (F1 selects the model).",
             distill="Distil a fine-tuned question-answering model into a smaller student (the teacher's start "
                     "and end distributions over each window).",
             evaluate="Score a fine-tuned question-answering model on a SQuAD-format file (EM, F1).",
             evaluate_seq_len=384, seq_len=384),  # SQuAD's usual window
    TaskSpec("embed", "embedding", EmbedConfig,
             """Fine-tune an embedder (a bi-encoder) for retrieval or similarity.

    From any family checkpoint (a Pooling module is added) or a sentence-transformers directory
    (its modules kept). Rows are read by column shape: (anchor, positive[, negatives...]) train
    with in-batch negatives, (text1, text2, score) with CoSENT; no batch holds one text twice.
    Retrieval on the --dev BEIR folder (nDCG@10) selects the model, written as a
    sentence-transformers directory with its prompts.""",
             card=True, seq_len=256),  # sentence-transformers' max_seq_length of MiniLM-style models
    TaskSpec("rerank", "reranking", RerankConfig,
             """Fine-tune a reranker (a cross-encoder: one relevance logit per (query, passage) pair).

    From any family checkpoint (a one-logit head is added) or a cross-encoder. (query, passage,
    label) rows train with binary cross-entropy; (query, positive[, negatives...]) rows with
    MultipleNegativesRankingLoss over their own and in-batch negatives. Reranking the --candidates
    run of the --dev queries (nDCG@10) selects the model, which sentence-transformers' CrossEncoder
    loads and `serve` answers /rerank with.""",
             card=True, seq_len=256),
    SparseSpec("sparse", "sparse", SparseConfig,
               """Fine-tune a SPLADE sparse encoder (one weight per vocabulary word) for retrieval.

    From any family checkpoint with a masked-LM head, or a sentence-transformers SparseEncoder
    directory. Rows are read by column shape as for embed; sentence-transformers' sparse losses
    are wrapped in SpladeLoss's FLOPS regularisers (query and document weights, warmed up over
    the first third of the steps). Retrieval on the --dev BEIR folder through an exact inverted
    index (nDCG@10) selects the model, written as a SparseEncoder directory.""",
               card=True, seq_len=256),
    TaskSpec("colbert", "colbert", ColbertConfig,
             """Fine-tune a ColBERT late-interaction model (one small vector per token, scored by MaxSim).

    From any family checkpoint ([Q]/[D] prefix tokens and a --dim projection are added, as PyLate
    adds them) or a PyLate ColBERT directory. Queries are expanded with [MASK] to --query-length;
    documents drop punctuation. (query, positive[, negatives...]) rows train with PyLate's
    Contrastive loss over in-batch and hard negatives; rows with a teacher's score of every
    passage with its Distillation loss. Exact MaxSim retrieval on the --dev BEIR folder (nDCG@10)
    selects the model, written as a PyLate directory.""",
             card=True),
)}
LABELLED = tuple(name for name, spec in TASKS.items() if spec.evaluate)  # scored on a labelled file


def check_backend(cfg: Any) -> None:
    """Refuse `--backend jax` for a task the JAX engine does not fine-tune (its row says)."""
    if cfg.backend == "jax" and not task_spec(cfg.task).jax:
        raise ConfigError(f"backend (--backend) jax fine-tunes {', '.join(n for n, s in TASKS.items() if s.jax)} only, "
                          f"not {cfg.task}")


def task_spec(name: str) -> TaskSpec:
    """The table's row of task `name`, or one line naming the tasks there are."""
    try:
        return TASKS[name]
    except KeyError:
        raise ConfigError(f"unknown task {name!r}; use one of {', '.join(TASKS)}") from None
