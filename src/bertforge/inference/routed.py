"""`--backend auto`, the default: the fastest path this machine has at the shapes it serves, chosen by measurement.

No one engine wins everywhere. On the project's hosts, ONNX Runtime's small-matrix kernels run a one-text forward
of all-MiniLM-L6-v2 in ~3 ms where oneDNN's fused path takes ~7 (the 24 linear layers alone, at 12 rows: 1.9 ms
against 2.7-6.8; docs/results.md), while at batches of 4 and more the fused path, which unpads and runs attention in
its own kernel, is 1.6-3x faster than ONNX Runtime; and on one AVX2 host eager PyTorch beat the fused path at
batches of 32. So `auto` measures, once per machine and model shape:

- **Batches** (the path for every batch of two or more rows, and for long single rows): `fused` against `torch`
  (eager) on a [16, 64] batch; `fused` unless eager is faster by more than the 10% this VM's noise spans.
- **One row** (a query arriving at an idle server): ONNX Runtime, on the model exported and checked within 1e-4 of
  PyTorch (`export.py`), against the batch path on single rows of 8, 16, 32, 64 and 128 tokens. Rows up to the
  longest length where ONNX Runtime was faster by more than 10% at that length and every shorter one go to it;
  longer ones and every batch of two or more rows stay on the batch path. Only where it serves (`serve`: one-text
  requests); `predict` runs batches and measures the batch path alone. Skipped, with the reason said, where
  onnxruntime is not installed, the model does not export, or it is smaller than `MIN_PARAMS` (a test's toy
  model: there the request's time is the server's, not the forward's).

The choice is kept per machine (CPU model, torch version, threads), architecture and shape in
`$BERTFORGE_CACHE_DIR/backends.json` (`machine_cache`), so every later start makes the same one (the same
request gives the same bits from run to run), and the export is kept under `$BERTFORGE_CACHE_DIR/onnx/`, named by
a hash of the weights, so later starts skip it (still checked against PyTorch each time). A text answered alone
and the same text inside a batch run on different kernels: they agree to float rounding (within the 1e-4 the
export is checked to; ~1e-6 measured), not bit for bit.

    model = load_auto(model, small_batches=True, single_engine=lambda m: OnnxModel(m, int8=False, cached=True))
    model.route.describe()
    # 'auto: fused for batches (16x64 tokens: fused 148 ms, torch 158 ms); onnx for one row of up to 128 tokens
    #  (1x128: onnx 35.1 ms, fused 56.1 ms) [measured now]'
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from .. import machine_cache
from ..errors import MissingDependency

log = logging.getLogger("bertforge")

LENGTHS = (8, 16, 32, 64, 128)
BULK = (16, 64)
MARGIN = 0.9  # a challenger must take at most 90% of the incumbent's time: this VM's timings drift ±10-15%
MIN_PARAMS = 4_000_000  # encoder parameters below which the one-row path is not measured (see the docstring)
REPEATS = 7


@dataclasses.dataclass
class Route:
    """What `auto` chose and why: the batch path, the one-row engine (or None) and its longest row, the
    timings behind them (median ms by shape), and whether they were measured now or read from the cache."""

    batch: str
    single: str | None
    limit: int
    timings: dict[str, dict[str, float]]
    source: str
    note: str = ""

    def describe(self) -> str:
        bulk = self.timings.get(f"{BULK[0]}x{BULK[1]}", {})
        said = ", ".join(f"{k} {v:.1f} ms" for k, v in bulk.items())
        text = f"auto: {self.batch} for batches ({BULK[0]}x{BULK[1]} tokens: {said})" if said else \
            f"auto: {self.batch} for batches"
        if self.single:
            row = self.timings.get(f"1x{self.limit}", {})
            text += (f"; {self.single} for one row of up to {self.limit} tokens (1x{self.limit}: "
                     + ", ".join(f"{k} {v:.1f} ms" for k, v in row.items()) + ")")
        elif self.note:
            text += f"; no one-row path ({self.note})"
        return f"{text} [{self.source}]"


class RoutedModel:
    """A model whose one-row calls up to `route.limit` tokens run on `single`, every other call on `batch`.
    Called as the model is (see `backends.load`); every other attribute (`config`, `.backbone`, the device) is
    the batch path's."""

    def __init__(self, batch: Any, single: Any, route: Route) -> None:
        self._batch, self._single, self.route = batch, single, route

    def __call__(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None,
                 attention_mask: torch.Tensor | None = None, **rest: Any) -> Any:
        """input_ids, token_type_ids, attention_mask: long [B, T] -> the head's outputs by name."""
        if (input_ids.shape[0] == 1 and input_ids.shape[1] <= self.route.limit and not rest.get("output_attentions")
                and rest.get("position_ids") is None and rest.get("packed") is None):
            return self._single(input_ids, token_type_ids=token_type_ids, attention_mask=attention_mask)
        return self._batch(input_ids=input_ids, token_type_ids=token_type_ids, attention_mask=attention_mask, **rest)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._batch, name)

    def eval(self) -> "RoutedModel":
        return self


def _inputs(config, rows: int, length: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(rows * 1000 + length)
    ids = torch.randint(5, config.vocab_size, (rows, length), generator=g)
    return {"input_ids": ids, "token_type_ids": torch.zeros_like(ids), "attention_mask": torch.ones_like(ids)}


def timings(runners: dict[str, Callable], inputs: dict[str, torch.Tensor], repeats: int = REPEATS) -> dict[str, float]:
    """Median milliseconds of each runner on `inputs`, interleaved call by call (after two unmeasured calls each),
    so that every runner shares the machine's drift."""
    with torch.inference_mode():
        for run in runners.values():
            for _ in range(2):
                run(**inputs)
        times: dict[str, list[float]] = {name: [] for name in runners}
        for _ in range(repeats):
            for name, run in runners.items():
                start = time.perf_counter()
                run(**inputs)
                times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) * 1e3 for name, t in times.items()}


def choose_batch_path(fused: Any, eager: torch.nn.Module) -> tuple[str, dict]:
    """('fused' or 'torch', timings): eager wins only by more than the margin. `fused` and `eager` are two copies
    of one model (fusing works in place)."""
    shape = f"{BULK[0]}x{BULK[1]}"
    measured = timings({"fused": fused, "torch": eager}, _inputs(eager.config, *BULK))
    return ("torch" if measured["torch"] < MARGIN * measured["fused"] else "fused"), {shape: measured}


def single_row_limit(single: Any, batch: Any, config, batch_name: str) -> tuple[int, dict]:
    """(the longest one-row length in LENGTHS where `single` beats `batch` by the margin there and at every
    shorter length, or 0; the timings by shape)."""
    limit, table = 0, {}
    for length in (n for n in LENGTHS if n <= config.max_sequence_length):
        measured = timings({"onnx": single, batch_name: batch}, _inputs(config, 1, length))
        table[f"1x{length}"] = measured
        if measured["onnx"] > MARGIN * measured[batch_name]:
            break
        limit = length
    return limit, table


def _shape_key(model: torch.nn.Module, small_batches: bool) -> str:
    c = model.config
    shape = {k: getattr(c, k, None) for k in ("hidden_size", "num_hidden_layers", "num_attention_heads",
                                              "intermediate_size", "vocab_size", "max_sequence_length")}
    return (f"{machine_cache.machine_key()} | {model.hf_architecture} | "
            f"{','.join(f'{k}={v}' for k, v in shape.items())} | {'serve' if small_batches else 'batches'}")


def _encoder_params(model: torch.nn.Module) -> int:
    """Parameters outside the embedding tables: what a forward's matmuls read."""
    return sum(p.numel() for name, p in model.named_parameters() if "embeddings" not in name)


def _single_row_engine(model: torch.nn.Module, make: Callable[[torch.nn.Module], Any]) -> tuple[Any, str]:
    """(`make(model)`: ONNX Runtime on the cached, checked export, '') or (None, why not)."""
    if _encoder_params(model) < MIN_PARAMS:
        return None, f"under {MIN_PARAMS / 1e6:g}M encoder parameters, not measured"
    try:
        return make(model), ""
    except MissingDependency as exc:
        return None, str(exc)
    except ImportError as exc:
        return None, f"{exc.name or 'onnxruntime'} is not installed: pip install \"bertforge[export]\""
    except Exception as exc:  # noqa: BLE001  a family or head the exporter does not take: the batch path alone
        return None, f"the ONNX export failed: {str(exc).splitlines()[0][:120] if str(exc) else type(exc).__name__}"


def _measure(model: torch.nn.Module, single: Any, note: str) -> dict:
    """The choice for `model` on this machine, measured now: {'batch', 'limit', 'timings', 'note'}."""
    from . import fused as fused_path

    if not fused_path.available():  # nothing to choose between for batches: eager PyTorch
        batch_name, batch, table = "torch", model, {}
    else:
        fused = fused_path.fuse_for_inference(copy.deepcopy(model))  # fusing is in place: the model stays eager
        batch_name, table = choose_batch_path(fused, model)
        batch = fused if batch_name == "fused" else model
    limit = 0
    if single is not None:
        limit, rows = single_row_limit(single, batch, model.config, batch_name)
        table.update(rows)
        if not limit:
            note = "ONNX Runtime was not faster at one row of 8 tokens"
    return {"batch": batch_name, "limit": limit, "timings": table, "note": note}


def load_auto(model: torch.nn.Module, small_batches: bool, single_engine: Callable[[torch.nn.Module], Any]) -> RoutedModel:
    """`model` on the path `auto` chooses (see the module docstring), its `.route` saying which and why.
    `small_batches`: also measure (and use) the one-row engine, `single_engine(model)`, as `serve` does."""
    from . import fused as fused_path

    model = model.eval()
    key = _shape_key(model, small_batches)
    try:
        with machine_cache.locked_json("backends.json") as entries:
            choice = entries.get(key)
    except OSError:
        choice = None
    single, note = None, "" if small_batches else "batches only"
    if small_batches and (choice is None or choice["limit"] > 0):
        single, note = _single_row_engine(model, single_engine)
    source = "cached choice"
    if choice is None:
        source, choice = "measured now", _measure(model, single, note)
        try:  # the first writer wins, so processes started together make one choice
            with machine_cache.locked_json("backends.json") as entries:
                choice = entries.setdefault(key, choice)
        except OSError as exc:
            choice["note"] = f"{choice['note']}; not cached ({exc.strerror or exc})".lstrip("; ")
    batch = (fused_path.fuse_for_inference(model) if choice["batch"] == "fused" and fused_path.available()
             else model)
    limit = choice["limit"] if single is not None else 0
    route = Route(choice["batch"] if fused_path.available() else "torch", "onnx" if limit else None, limit,
                  choice["timings"],
                  source, note or choice.get("note", ""))
    log.info("backend %s", route.describe())
    return RoutedModel(batch, single if limit else None, route)
