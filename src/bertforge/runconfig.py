"""The settings of a run, as dataclasses: the training loop's, and on top of them `pretrain`'s and
`finetune`'s. Each field's comment is its help text, and the CLI builds its flags from these
classes, so a default shown in `--help` is the one a run uses. This module imports no torch, so
`bertforge --help` starts at once.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from .errors import BertforgeError


@dataclass
class TrainConfig:
    """Settings of the training loop, shared by `pretrain` and `finetune`."""

    out: str = "run"  # output directory
    batch_size: int = 32  # examples per micro-batch, per process
    grad_accum: int = 1  # micro-batches per optimizer step, per process
    lr: float = 1e-4  # peak learning rate
    warmup: float = 0.01  # warmup: a fraction of the total steps if < 1, else a number of steps
    weight_decay: float = 0.01  # decoupled weight decay (not on biases and LayerNorm)
    optimizer: str = "adamw"  # adamw | lamb
    max_grad_norm: float = 1.0  # clip the global gradient norm (0 = off)
    max_steps: int | None = None  # stop after this many optimizer steps
    epochs: float | None = None  # stop after this many passes over the data
    time_budget: float | None = None  # stop after this many seconds of training
    log_every: int = 10  # steps between metrics.jsonl rows
    eval_every: int | None = None  # steps between evaluations (None: at the end only)
    save_every: int | None = 500  # steps between checkpoints (None: at the end only)
    keep_last: int = 2  # checkpoints kept
    eval_each_epoch: bool = False  # evaluate at the end of every epoch (fine-tuning)
    select_metric: str | None = None  # keep the model with the best value of this eval metric (in OUT/best)
    greater_is_better: bool = True  # whether a higher select_metric is better
    patience: int | None = None  # stop after this many evaluations without improvement
    precision: str = "fp32"  # fp32 | bf16 (autocast; bf16 is the CUDA choice)
    compile: bool = False  # torch.compile the model
    pack: bool = False  # pack several examples per row (block-diagonal attention); same loss, fewer rows
    seed: int = 0
    progress: bool = True  # show a progress bar

    def __post_init__(self) -> None:
        for name in ("batch_size", "grad_accum", "log_every", "keep_last"):
            if getattr(self, name) < 1:
                raise BertforgeError(f"--{name.replace('_', '-')} must be at least 1")
        if self.lr <= 0:
            raise BertforgeError("--lr must be positive")
        if self.warmup < 0:
            raise BertforgeError("--warmup must be >= 0")
        if self.optimizer not in ("adamw", "lamb"):
            raise BertforgeError(f"--optimizer must be adamw or lamb, not {self.optimizer!r}")
        if self.precision not in ("fp32", "bf16"):
            raise BertforgeError(f"--precision must be fp32 or bf16, not {self.precision!r}")
        if self.pack and self.compile:
            raise BertforgeError("--pack and --compile cannot be combined: packed rows are found from the data, "
                                 "which a compiled graph cannot look at")
        if self.max_steps is None and self.epochs is None and self.time_budget is None:
            raise BertforgeError("give a stopping rule: --max-steps, --epochs or --time-budget")
        for name in ("max_steps", "epochs", "time_budget", "eval_every", "save_every"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise BertforgeError(f"--{name.replace('_', '-')} must be positive")


def parse_duration(text: str) -> float:
    """'90', '90s', '30m', '1.5h' -> seconds."""
    text = text.strip().lower()
    units = {"s": 1, "m": 60, "h": 3600}
    try:
        seconds = float(text[:-1]) * units[text[-1]] if text and text[-1] in units else float(text)
    except ValueError:
        seconds = float("nan")
    if not math.isfinite(seconds) or seconds <= 0:
        raise BertforgeError(f"cannot read duration {text!r}; use a positive time such as 90s, 30m or 2h")
    return seconds


@dataclass
class PretrainConfig(TrainConfig):
    """Everything `bertforge pretrain` takes: the data and model settings plus the training loop's."""

    out: str = "bertforge-pretrain"  # output directory
    corpus: list[str] = field(default_factory=list)  # files, dirs, globs, hf:NAME, or a prepared dir; empty = embedded
    model: str | None = None  # a preset (tiny ... large, L<n>-H<n>) or a checkpoint dir; default tiny/base
    objective: str = "mlm+nsp"  # mlm+nsp (BERT) | mlm (RoBERTa FULL-SENTENCES)
    seq_len: int = 128  # tokens per example, [CLS] and [SEP]s included
    vocab_size: int = 30522  # for a newly trained WordPiece vocabulary
    tokenizer: str | None = None  # a directory with vocab.txt / tokenizer.json to use instead of training one
    short_seq_prob: float = 0.1  # probability of a shorter target length for a document's pairs
    masked_lm_prob: float = 0.15
    mask_prob: float = 0.8
    random_prob: float = 0.1
    max_predictions: int | None = None  # cap on predictions per sequence (default ceil(seq_len * 0.15))
    wwm: bool = False  # whole-word masking
    doc_per_file: bool = False  # a whole file is one document (default: blank lines separate documents)
    text_field: str = "text"
    encoding_errors: str = "strict"  # strict | replace
    workers: int | None = None  # tokenising processes (default: all cores)
    eval_fraction: float = 0.01  # documents held out for evaluation (at least 2, at most 1000)
    eval_batches: int = 20  # evaluation batches
    resume: bool = False
    overwrite: bool = False
    demo: bool | None = None  # end with fill-mask on a few sentences (default: for the embedded corpus)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.objective not in ("mlm+nsp", "mlm"):
            raise BertforgeError(f"--objective must be mlm+nsp or mlm, not {self.objective!r}")
        if self.seq_len < 8:
            raise BertforgeError("--seq-len must be at least 8")
        if self.encoding_errors not in ("strict", "replace"):
            raise BertforgeError("--encoding-errors must be strict or replace")
        if self.resume and self.overwrite:
            raise BertforgeError("--resume and --overwrite contradict each other; pick one")
        from .data.pretraining import MaskingConfig  # imported here: --help must not pay for torch

        try:
            MaskingConfig(self.masked_lm_prob, self.mask_prob, self.random_prob, self.max_predictions, self.wwm)
        except ValueError as exc:
            raise BertforgeError(str(exc)) from None

    @classmethod
    def from_json(cls, path: str | Path, **overrides: Any) -> "PretrainConfig":
        """A JSON config file read into the same dataclass (flags given on the command line win)."""
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            raise BertforgeError(f"{path}: cannot read config ({exc})") from None
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise BertforgeError(f"{path}: unknown key '{unknown[0]}'")
        return cls(**{**data, **overrides})


TASKS = ("classify", "regress", "ner", "qa")


@dataclass
class FinetuneConfig(TrainConfig):
    """Everything `bertforge finetune` takes."""

    task: str = "classify"  # classify | regress | ner
    model: str = ""  # a checkpoint directory, or a preset (then --tokenizer is needed)
    train: str = ""  # training file (.tsv, .csv, .jsonl; CoNLL or .jsonl for ner)
    dev: str = ""  # development file, evaluated every epoch
    out: str = "bertforge-finetune"  # output directory
    tokenizer: str | None = None  # tokenizer directory when --model is a preset
    seq_len: int = 128  # maximum tokens per example
    text_column: str | None = None  # TSV/CSV/JSONL column of the text (name or 0-based index)
    pair_column: str | None = None  # column of the second text, for sentence pairs
    label_column: str | None = None  # column of the label
    truncation: str = "head"  # long single texts: head | tail | head+tail
    seeds: str | None = None  # e.g. 1,2,3: one run per seed, reported as mean and std
    doc_stride: int = 128  # qa: tokens of overlap between windows of a long context
    n_best: int = 20  # qa: start and end candidates per window
    max_answer_len: int = 30  # qa: longest answer, in tokens
    null_threshold: float | None = None  # qa v2: answer "" when null score - best span score exceeds this
    tune_null_threshold: bool = False  # qa v2: pick the threshold that maximises dev F1
    overwrite: bool = False
    epochs: float | None = 3.0
    lr: float = 2e-5
    warmup: float = 0.1
    save_every: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.task not in TASKS:
            raise BertforgeError(f"unknown task {self.task!r}; use one of {', '.join(TASKS)}")
        for name in ("model", "train", "dev"):
            if not getattr(self, name):
                raise BertforgeError(f"--{name} is required")
        if self.truncation not in ("head", "tail", "head+tail"):
            raise BertforgeError("--truncation must be head, tail or head+tail")
