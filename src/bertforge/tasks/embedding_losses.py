"""The losses an embedder trains with, named and defaulted as sentence-transformers names them.

Each takes the batch's vectors one column at a time (`columns[c]`: float [B, D], the c-th text of
every row: anchor, positive, negatives...) and, for scored pairs, the scores float [B]. In a
torchrun job the in-batch candidates are gathered from every process with their gradients
(`gather`), so N processes train exactly as one process with the global batch.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable

import torch
import torch.nn.functional as F

from ..models.pooling import similarity


def process_group() -> tuple[int, int]:
    """(world size, rank) of the torchrun job this process is in; (1, 0) alone."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size(), dist.get_rank()
    return 1, 0


def gather(x: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Every process's rows of `x` [B, D], concatenated in rank order with the gradient flowing back to each
    process's own rows, and where this process's rows start. Without a process group: (x, 0)."""
    world, rank = process_group()
    if world == 1:
        return x, 0
    from torch.distributed.nn.functional import all_gather

    parts = [_ContiguousGrad.apply(part) for part in all_gather(x.contiguous())]
    return torch.cat(parts), rank * x.shape[0]


class _ContiguousGrad(torch.autograd.Function):
    """The identity, whose gradient is made contiguous. all_gather's backward reduce-scatters the gradients of its
    outputs, and on gloo a strided one (an einsum's gradient, sliced by cat's backward) comes back scrambled:
    measured on ColBERT's MaxSim, whose 2-process gradients were wrong until this."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        return grad.contiguous()


def multiple_negatives_ranking(columns: list[torch.Tensor], scores: torch.Tensor | None, scale: float = 20.0,
                               kind: str = "cosine", symmetric: bool = False) -> torch.Tensor:
    """MultipleNegativesRankingLoss: each anchor must pick its own positive among every positive and negative
    of the (global) batch: cross-entropy over `scale` x similarity. `symmetric` (MultipleNegativesSymmetric-
    RankingLoss) averages it with the positives picking their anchor among the batch's anchors."""
    anchors = columns[0]
    gathered = [gather(c) for c in columns[1:]]
    candidates = torch.cat([g for g, _ in gathered])  # [world * B * (columns - 1), D]
    offset = gathered[0][1]
    labels = torch.arange(anchors.shape[0], device=anchors.device) + offset
    forward = F.cross_entropy(scale * similarity(anchors, candidates, kind), labels)
    if not symmetric:
        return forward
    all_anchors, _ = gather(anchors)
    backward = F.cross_entropy(scale * similarity(columns[1], all_anchors, kind), labels)
    return (forward + backward) / 2


def cosent(columns: list[torch.Tensor], scores: torch.Tensor, scale: float = 20.0, kind: str = "cosine") -> torch.Tensor:
    """CoSENTLoss: every pair (i, j) with score_i > score_j should have similarity_i > similarity_j:
    log(1 + sum over such pairs of exp(scale (sim_j - sim_i)))."""
    a, b = gather(columns[0])[0], gather(columns[1])[0]
    y = gather(scores.unsqueeze(-1))[0].squeeze(-1)
    sims = scale * _paired(a, b, kind)
    diff = sims[None, :] - sims[:, None]  # [i, j] = sim_j - sim_i
    wanted = y[:, None] > y[None, :]  # score_i > score_j
    terms = diff[wanted]
    return torch.logsumexp(torch.cat([terms.new_zeros(1), terms]), dim=0)


def cosine_similarity(columns: list[torch.Tensor], scores: torch.Tensor, scale: float = 1.0,
                      kind: str = "cosine") -> torch.Tensor:
    """CosineSimilarityLoss: mean squared error between each pair's cosine similarity and its score."""
    return F.mse_loss(_paired(columns[0], columns[1], "cosine"), scores.to(columns[0].dtype))


def margin_mse(columns: list[torch.Tensor], scores: torch.Tensor, scale: float = 1.0, kind: str = "dot") -> torch.Tensor:
    """MarginMSELoss (distillation from a cross-encoder): the squared error between the student's margins
    dot(q, positive) - dot(q, negative_i) and the teacher's. `scores` float [B] (one negative), [B, n] (the
    teacher's margins) or [B, n + 1] (its scores: the positive's, then the negatives'). Dot product, as
    sentence-transformers computes it whatever the model's similarity."""
    query, positive, negatives = columns[0], columns[1], columns[2:]
    positive_score = (query * positive).sum(-1)
    margins = torch.stack([positive_score - (query * n).sum(-1) for n in negatives], dim=1)
    return F.mse_loss(margins, margin_targets(scores, len(negatives)).to(margins.dtype))


def distill_kl_div(columns: list[torch.Tensor], scores: torch.Tensor, scale: float = 1.0,
                   kind: str = "dot") -> torch.Tensor:
    """DistillKLDivLoss (listwise distillation): KL(teacher || student) between the softmax over each row's passages
    of the teacher's scores (float [B, passages], the positive's first) and of the student's dot products, both at
    temperature `scale`, times scale^2, averaged over rows. Dot product, as sentence-transformers computes it."""
    query = columns[0]
    student = torch.stack([(query * passage).sum(-1) for passage in columns[1:]], dim=1) / scale
    teacher = scores.detach().to(student.dtype) / scale
    return F.kl_div(student.log_softmax(dim=1), teacher.softmax(dim=1), reduction="batchmean") * scale ** 2


def margin_targets(scores: torch.Tensor, negatives: int) -> torch.Tensor:
    """A teacher's margins float [B, negatives] from what a row gives: one margin [B], the margins [B, n], or the
    scores [B, n + 1] (the positive's first), as sentence-transformers' MarginMSE losses read them."""
    labels = scores.detach()
    labels = labels.unsqueeze(1) if labels.dim() == 1 else labels
    return labels[:, :1] - labels[:, 1:] if labels.shape[1] == negatives + 1 else labels


def _paired(a: torch.Tensor, b: torch.Tensor, kind: str) -> torch.Tensor:
    """Row i of a against row i of b: float [B]."""
    if kind == "cosine":
        return F.cosine_similarity(a, b, dim=-1)
    if kind == "dot":
        return (a * b).sum(-1)
    return similarity(a, b, kind).diagonal()


# The rows each loss trains on (`data_kind`).
ROWS, SCORED_PAIRS, SCORED_TUPLES = "(anchor, positive[, negatives...]) rows", "scored pairs", "scored tuples"

# name -> (function(columns, scores, scale, similarity kind), the rows it trains on, default scale).
# sentence-transformers' class names, and short aliases.
LOSSES: dict[str, tuple[Callable[..., torch.Tensor], str, float]] = {
    "MultipleNegativesRankingLoss": (multiple_negatives_ranking, ROWS, 20.0),
    "MultipleNegativesSymmetricRankingLoss": (
        lambda columns, scores, scale, kind: multiple_negatives_ranking(columns, scores, scale, kind, True), ROWS, 20.0),
    "CoSENTLoss": (cosent, SCORED_PAIRS, 20.0),
    "CosineSimilarityLoss": (cosine_similarity, SCORED_PAIRS, 1.0),
    "MarginMSELoss": (margin_mse, SCORED_TUPLES, 1.0),
    "DistillKLDivLoss": (distill_kl_div, SCORED_TUPLES, 1.0),  # its "scale" is the temperature
}
ALIASES = {"mnrl": "MultipleNegativesRankingLoss", "in-batch": "MultipleNegativesRankingLoss",
           "mnrl-symmetric": "MultipleNegativesSymmetricRankingLoss", "cosent": "CoSENTLoss",
           "cosine": "CosineSimilarityLoss", "margin-mse": "MarginMSELoss", "kl": "DistillKLDivLoss"}
DEFAULT_LOSS = {ROWS: "MultipleNegativesRankingLoss", SCORED_PAIRS: "CoSENTLoss", SCORED_TUPLES: "MarginMSELoss"}


def data_kind(columns: int, scored: bool) -> str:
    """Which rows a file holds: plain rows, scored pairs, or tuples with a teacher's scores."""
    return ROWS if not scored else SCORED_PAIRS if columns == 2 else SCORED_TUPLES


# Listwise losses: they need the teacher's score of every passage of a row, not margins.
EVERY_SCORE = ("ListNetLoss", "DistillKLDivLoss", "SparseDistillKLDivLoss")


def resolve_loss(name: str | None, data, rows_of: dict[str, str], aliases: dict[str, str],
                 defaults: dict[str, str]) -> str:
    """`--loss` (a sentence-transformers class name or a short alias) as a class name, checked against the rows
    `data` (a `TupleData`) holds; None picks `defaults[kind of rows]`. `rows_of`: each loss's kind of rows. A
    listwise loss (`EVERY_SCORE`) is refused on rows whose teacher gives margins."""
    from ..errors import InputError

    kind = data_kind(len(data.columns), data.scores is not None)
    if name is None:
        return defaults[kind]
    full = aliases.get(name, name)
    if full not in rows_of:
        raise InputError(f"--loss {name}: use one of {', '.join(rows_of)} (or {', '.join(aliases)})")
    if rows_of[full] != kind:
        fitting = [n for n, rows in rows_of.items() if rows == kind]
        raise InputError(f"--loss {full} trains on {rows_of[full]}; {data.source} holds {data.shape}: use "
                         f"{' or '.join(fitting)}")
    given = len(data.scores[0]) if full in EVERY_SCORE and isinstance(data.scores[0], (list, tuple)) else 1
    if full in EVERY_SCORE and given != len(data.columns) - 1:
        raise InputError(f"--loss {full} needs the teacher's score of every passage (the positive's, then each "
                         f"negative's: {len(data.columns) - 1} per row); {data.source} gives margins")
    return full


def check_negatives(loss: str, rows_of: dict[str, str], data, batch_size: int, drawn: int | None = None) -> None:
    """Refuse a run whose in-batch loss has nothing to contrast: `loss` trains on (anchor, positive[, negatives])
    rows by the other rows of its batch, so pairs (no negative column) in a global batch of one row (`batch_size`
    per process, times the processes of a torchrun job) give loss 0 and gradient 0 at every step. `drawn`: for a
    reranker, how many of the other rows' passages each query draws (0 draws none, whatever the batch)."""
    from ..errors import InputError

    if rows_of.get(loss) != ROWS or len(data.columns) > 2:
        return
    world = process_group()[0]
    if drawn == 0:
        raise InputError(f"--num-negatives 0: {loss} on {data.source}'s pairs (no negative column) would have no "
                         "negative for any query, so loss 0 and gradient 0 at every step; draw in-batch negatives "
                         "(--num-negatives 1 or more) or add negative columns")
    if batch_size * world < 2:
        raise InputError(f"--batch-size {batch_size}: {loss} contrasts each query's positive with the other rows of "
                         f"its batch, and {data.source} holds pairs (no negative column): with one row a batch there "
                         "is no negative, so loss 0 and gradient 0 at every step. Use --batch-size 2 or more, or add "
                         "negative columns (mine them with bertforge mine)")


def cached(model: torch.nn.Module, inputs: dict[str, torch.Tensor], mini_batch_size: int,
           loss_of: Callable[[torch.Tensor], torch.Tensor], loss_params: tuple[torch.Tensor, ...] = ()) -> torch.Tensor:
    """GradCache (Gao et al., 2021; sentence-transformers' Cached* losses): the loss of a batch far larger than
    memory allows, with the gradients of the uncached loss.

    The batch's texts (`inputs`: long [N, T] each) are embedded `mini_batch_size` at a time, and `loss_of(vectors
    [N, D])` sees them all: see `cached_calls`, which this is for one call per mini-batch of one model input."""
    rows = inputs["input_ids"].shape[0]
    calls = [functools.partial(embed_rows, model, inputs, slice(start, start + mini_batch_size))
             for start in range(0, rows, mini_batch_size)]
    return cached_calls(model, calls, lambda pieces: loss_of(torch.cat(pieces)), loss_params)


def embed_rows(model: Callable[..., torch.Tensor], inputs: dict[str, torch.Tensor], rows: slice) -> torch.Tensor:
    """One GradCache call: `model`'s float vectors for `rows` of the batch's `inputs`."""
    return model(**{k: v[rows] for k, v in inputs.items()}).float()


class RandomState:
    """The random state a GradCache call ran under, on the CPU and on each CUDA device the model runs on, replayed
    (as sentence-transformers' RandContext does) so that the call's second run draws the same dropout masks on
    every device. Replaying restores the caller's states afterwards (`torch.random.fork_rng`)."""

    def __init__(self, devices: list[int]) -> None:
        self.devices = devices
        self.cpu = torch.get_rng_state()
        self.cuda = [torch.cuda.get_rng_state(d) for d in devices]

    @staticmethod
    def devices_of(model: torch.nn.Module) -> list[int]:
        """The CUDA devices of `model`'s parameters (none on the CPU)."""
        return sorted({p.device.index or 0 for p in model.parameters() if p.device.type == "cuda"})

    @contextlib.contextmanager
    def replayed(self):
        with torch.random.fork_rng(devices=self.devices):
            torch.set_rng_state(self.cpu)
            for device, state in zip(self.devices, self.cuda):
                torch.cuda.set_rng_state(state, device)
            yield


def cached_calls(model: torch.nn.Module, calls: list[Callable[[], torch.Tensor]],
                 loss_of: Callable[[list[torch.Tensor]], torch.Tensor],
                 loss_params: tuple[torch.Tensor, ...] = ()) -> torch.Tensor:
    """GradCache over any split of a batch into model calls, each of which embeds a part of it (a mini-batch of
    texts; for ColBERT, of queries or of documents).

    Every call runs once without gradients; `loss_of(pieces)` (the calls' outputs, in order) and its gradients with
    respect to every piece are computed once; then, when the returned value is backpropagated, each call runs again
    with gradients (its random state replayed, so dropout draws the same masks) and is backpropagated with its
    piece's cached gradient. Activation memory is one call's, whatever the batch size; the cost is one more forward
    per step. `loss_params`: parameters of the loss itself (a learned scale), whose gradients join the last call's
    backward, the one that DDP (`model`, when wrapped) reduces."""
    states, pieces = [], []
    devices = RandomState.devices_of(model)
    with torch.no_grad():
        for call in calls:
            states.append(RandomState(devices))
            pieces.append(call().requires_grad_())
    with torch.enable_grad():
        loss = loss_of(pieces)
        found = torch.autograd.grad(loss, [*pieces, *loss_params])
    grads, param_grads = found[:len(pieces)], found[len(pieces):]
    value = loss.detach().requires_grad_()

    def replay(grad_output: torch.Tensor) -> None:
        no_sync = getattr(model, "no_sync", None)  # DDP: reduce the gradients once, after the last call
        for n, call in enumerate(calls):
            sync = no_sync() if no_sync is not None and n < len(calls) - 1 else contextlib.nullcontext()
            with states[n].replayed(), sync, torch.enable_grad():  # a backward hook runs with gradients off
                total = (call() * grads[n]).sum()
                if n == len(calls) - 1:
                    total = total + sum((p * g).sum() for p, g in zip(loss_params, param_grads))
                total.mul(grad_output).backward()

    value.register_hook(replay)
    return value
