"""Every loss bertforge trains with, one row each: its trainer, its name, where it lives, the rows it trains on, its
default scale, its aliases and its help line. The CLI's `--loss` help, `--loss` itself and each trainer read this
table; a new loss is a function in one of this package's files and a row here.

The table imports no torch (the settings module reads it for `--help`): a row names its function by module, and
`Loss.fn` imports it when a run needs it.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# The rows a loss trains on, as `data/retrieval.read_tuples` reads them by column shape.
ROWS, SCORED_PAIRS, SCORED_TUPLES = "(anchor, positive[, negatives...]) rows", "scored pairs", "scored tuples"


@dataclass(frozen=True)
class Loss:
    """One loss of one trainer (`task`: embed, sparse, colbert, rerank), by the class name sentence-transformers or
    PyLate give it. The function's arguments are its trainer's (see the module the row names)."""

    task: str
    name: str
    module: str  # this package's file that holds it
    function: str
    rows: str  # ROWS, SCORED_PAIRS or SCORED_TUPLES
    help: str
    scale: float = 1.0  # the default --scale (a temperature for the KL losses)
    aliases: tuple[str, ...] = ()
    default: bool = False  # the default for its rows
    listwise: bool = False  # needs the teacher's score of every passage, not margins
    similarity: str | None = None  # the similarity it always compares with (None: the run's --similarity)

    @property
    def fn(self) -> Callable[..., Any]:
        return getattr(importlib.import_module(f"{__package__}.{self.module}"), self.function)


LOSSES: tuple[Loss, ...] = (
    # Bi-encoders (`finetune embed`): fn(columns [B, D] each, scores, scale, similarity kind).
    Loss("embed", "MultipleNegativesRankingLoss", "in_batch", "multiple_negatives_ranking", ROWS, "in-batch negatives",
         20.0, ("mnrl", "in-batch"), default=True),
    Loss("embed", "MultipleNegativesSymmetricRankingLoss", "in_batch", "multiple_negatives_symmetric_ranking", ROWS,
         "in-batch negatives both ways", 20.0, ("mnrl-symmetric",)),
    Loss("embed", "CoSENTLoss", "scored_pairs", "cosent", SCORED_PAIRS, "the pairs' order by score", 20.0,
         ("cosent",), default=True),
    Loss("embed", "CosineSimilarityLoss", "scored_pairs", "cosine_similarity", SCORED_PAIRS,
         "squared error of cosine against score", 1.0, ("cosine",)),
    Loss("embed", "MarginMSELoss", "distillation", "margin_mse", SCORED_TUPLES, "a teacher's margins", 1.0,
         ("margin-mse",), default=True),
    Loss("embed", "DistillKLDivLoss", "distillation", "distill_kl_div", SCORED_TUPLES,
         "KL from a teacher's score of every passage; --scale is the temperature", 1.0, ("kl",), listwise=True),
    # SPLADE (`finetune sparse`): the bi-encoder's functions, each with the similarity sentence-transformers fixes.
    Loss("sparse", "SparseMultipleNegativesRankingLoss", "in_batch", "multiple_negatives_ranking", ROWS,
         "in-batch negatives", 1.0, ("mnrl", "in-batch"), default=True, similarity="dot"),
    Loss("sparse", "SparseCoSENTLoss", "scored_pairs", "cosent", SCORED_PAIRS, "the pairs' order by score", 20.0,
         ("cosent",), default=True, similarity="cosine"),
    Loss("sparse", "SparseMarginMSELoss", "distillation", "margin_mse", SCORED_TUPLES, "a teacher's margins", 1.0,
         ("margin-mse",), default=True, similarity="dot"),
    Loss("sparse", "SparseDistillKLDivLoss", "distillation", "distill_kl_div", SCORED_TUPLES,
         "KL from a teacher's score of every passage; --scale is the temperature", 2.0, ("kl",), listwise=True,
         similarity="dot"),
    # ColBERT (`finetune colbert`): fn(queries, query_kept, documents, document_kept, scores, temperature).
    Loss("colbert", "Contrastive", "late_interaction", "contrastive", ROWS, "PyLate's: in-batch and hard negatives",
         1.0, ("contrastive", "in-batch", "mnrl"), default=True),
    Loss("colbert", "Distillation", "late_interaction", "distillation", SCORED_TUPLES,
         "PyLate's: KL from a teacher's score of every passage", 1.0, ("distillation", "kl"), default=True),
    # Cross-encoders (`finetune rerank`): fn(logits [pairs], batch, scale, pos_weight).
    Loss("rerank", "BinaryCrossEntropyLoss", "cross_encoder", "binary_cross_entropy", SCORED_PAIRS,
         "each pair's logit against its label in [0, 1]", 1.0, ("bce",), default=True),
    Loss("rerank", "MultipleNegativesRankingLoss", "cross_encoder", "multiple_negatives_ranking", ROWS,
         "each query's positive against its negatives and --num-negatives other rows' passages", 10.0,
         ("mnrl",), default=True),
    Loss("rerank", "MarginMSELoss", "cross_encoder", "margin_mse", SCORED_TUPLES, "a teacher's margins", 1.0,
         ("margin-mse",), default=True),
    Loss("rerank", "ListNetLoss", "cross_encoder", "listnet", SCORED_TUPLES,
         "a teacher's distribution over every passage of a row", 1.0, ("listnet",), listwise=True),
)

# What a trainer adds to every one of its losses, said once in its help.
_TASK_NOTES = {"sparse": "each wrapped in SpladeLoss's FLOPS regularisers"}


def losses_of(task: str) -> dict[str, Loss]:
    """The losses of one trainer, by name, in the table's order."""
    return {loss.name: loss for loss in LOSSES if loss.task == task}


def aliases_of(task: str) -> dict[str, str]:
    return {alias: loss.name for loss in losses_of(task).values() for alias in loss.aliases}


def default_of(task: str, rows: str) -> Loss | None:
    return next((loss for loss in losses_of(task).values() if loss.default and loss.rows == rows), None)


def help_line(task: str) -> str:
    """`--loss`'s help for one trainer, generated from the table."""
    parts = []
    for loss in losses_of(task).values():
        said = f"{loss.help}; the default for {loss.rows}" if loss.default else loss.help
        parts.append(f"{loss.name} ({said})")
    line = ", ".join(parts[:-1]) + " or " + parts[-1] if len(parts) > 1 else parts[0]
    note = _TASK_NOTES.get(task)
    return f"{line}, {note}" if note else line


def data_kind(columns: int, scored: bool) -> str:
    """Which rows a file holds: plain rows, scored pairs, or tuples with a teacher's scores."""
    return ROWS if not scored else SCORED_PAIRS if columns == 2 else SCORED_TUPLES


def resolve(task: str, name: str | None, data) -> Loss:
    """`--loss` (a class name or a short alias) of trainer `task`, checked against the rows `data` (a `TupleData`)
    holds; None picks the default for those rows. A listwise loss is refused on rows whose teacher gives margins."""
    from ..errors import InputError

    losses, aliases = losses_of(task), aliases_of(task)
    kind = data_kind(len(data.columns), data.scores is not None)
    if name is None:
        found = default_of(task, kind)
        if found is None:
            fitting = sorted({loss.rows for loss in losses.values()})
            raise InputError(f"{data.source} holds {data.shape}; finetune {task} trains on {' or '.join(fitting)}")
        return found
    full = aliases.get(name, name)
    if full not in losses:
        raise InputError(f"--loss {name}: use one of {', '.join(losses)} (or {', '.join(aliases)})")
    loss = losses[full]
    if loss.rows != kind:
        fitting = [n for n, other in losses.items() if other.rows == kind]
        raise InputError(f"--loss {full} trains on {loss.rows}; {data.source} holds {data.shape}: use "
                         f"{' or '.join(fitting)}")
    given = len(data.scores[0]) if loss.listwise and isinstance(data.scores[0], (list, tuple)) else 1
    if loss.listwise and given != len(data.columns) - 1:
        raise InputError(f"--loss {full} needs the teacher's score of every passage (the positive's, then each "
                         f"negative's: {len(data.columns) - 1} per row); {data.source} gives margins")
    return loss


def check_negatives(loss: Loss, data, batch_size: int, world: int, drawn: int | None = None) -> None:
    """Refuse a run whose in-batch loss has nothing to contrast: `loss` trains on (anchor, positive[, negatives])
    rows by the other rows of its batch, so pairs (no negative column) in a global batch of one row (`batch_size`
    per process, times the `world` processes of a torchrun job) give loss 0 and gradient 0 at every step. `drawn`:
    for a reranker, how many of the other rows' passages each query draws (0 draws none, whatever the batch)."""
    from ..errors import InputError

    if loss.rows != ROWS or len(data.columns) > 2:
        return
    if drawn == 0:
        raise InputError(f"--num-negatives 0: {loss.name} on {data.source}'s pairs (no negative column) would have "
                         "no negative for any query, so loss 0 and gradient 0 at every step; draw in-batch negatives "
                         "(--num-negatives 1 or more) or add negative columns")
    if batch_size * world < 2:
        raise InputError(f"--batch-size {batch_size}: {loss.name} contrasts each query's positive with the other rows "
                         f"of its batch, and {data.source} holds pairs (no negative column): with one row a batch "
                         "there is no negative, so loss 0 and gradient 0 at every step. Use --batch-size 2 or more, "
                         "or add negative columns (mine them with bertforge mine)")
