"""The settings of a run, as small dataclasses composed into `pretrain`'s and `finetune`'s configs.

- `LoopSettings`: optimisation, stopping rule, precision and seed (what the training loop does);
- `EvalSettings`: when to evaluate and which model to keep;
- `OutputSettings`: where a run writes, how often it saves, resume and overwrite;
- `TrainConfig` = those three: all the one training loop (`train.Trainer`) reads;
- `CorpusSettings` and `MaskingSettings`: pretraining's data;
- `PretrainConfig` and `FinetuneConfig`: a `TrainConfig` plus the data and model settings.

Each field carries its help text (`setting(default, help)`, the convention of transformers'
`HfArgumentParser`); the CLI builds its flags from these classes and a config file (JSON or
YAML) is read onto the same fields, so a default shown in `--help` is the one a run uses.
A few defaults depend on other settings ("128, or 384 for qa"); they are `None` here, their
help says the rule, and `__post_init__` applies it. This module imports no torch, so
`bertforge --help` starts at once.
"""

from __future__ import annotations

import difflib
import json
import math
import sys
import types
import typing
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any

from .errors import ConfigError
from .losses.registry import help_line


def setting(default: Any = MISSING, help: str = "", *, factory: Any = MISSING, cli: bool = True) -> Any:
    """A dataclass field with its help text; `cli=False` keeps it off the command line (set by code)."""
    if factory is not MISSING:
        return field(default_factory=factory, metadata={"help": help, "cli": cli})
    return field(default=default, metadata={"help": help, "cli": cli})


def fit_seq_len(cfg: Any, config: Any) -> None:
    """A fine-tuning run's --seq-len against the model (`config`): the default (128; 384 for qa) becomes the model's
    length where that is shorter, and the run records it so; a length the user gave is honoured or refused."""
    if not getattr(cfg, "seq_len_given", True):
        cfg.seq_len = min(cfg.seq_len, config.max_sequence_length)
    check_seq_len(cfg.seq_len, config)


def check_seq_len(seq_len: int, config: Any) -> None:
    """Refuse a --seq-len longer than the model's positions hold (rows would be cut there while the run's
    settings say otherwise): `config` is any family's model config."""
    if seq_len > config.max_sequence_length:
        raise ConfigError(f"--seq-len {seq_len} exceeds the {config.max_sequence_length} positions the model's "
                          f"max_position_embeddings ({config.max_position_embeddings}) leaves")


def flag(name: str) -> str:
    """'batch_size' -> 'batch_size (--batch-size)': errors name the setting and its flag."""
    return f"{name} (--{name.replace('_', '-')})"


def _chain(obj: Any, cls: type) -> None:
    """Run the next `__post_init__` in the MRO, so each mixin checks its own fields."""
    nxt = getattr(super(cls, obj), "__post_init__", None)
    if nxt is not None:
        nxt()


def parse_duration(text: str) -> float:
    """'90', '90s', '30m', '1.5h' -> seconds."""
    text = str(text).strip().lower()
    units = {"s": 1, "m": 60, "h": 3600}
    try:
        seconds = float(text[:-1]) * units[text[-1]] if text and text[-1] in units else float(text)
    except ValueError:
        seconds = float("nan")
    if not math.isfinite(seconds) or seconds <= 0:
        raise ConfigError(f"cannot read duration {text!r}; use a positive time such as 90s, 30m or 2h")
    return seconds


@dataclass
class LoopSettings:
    """What the training loop does each step, and when it stops."""

    batch_size: int = setting(32, "examples per micro-batch, per process")
    grad_accum: int = setting(1, "micro-batches per optimizer step, per process")
    lr: float = setting(1e-4, "peak learning rate")
    warmup: float = setting(0.01, "warmup: a fraction of the total steps if < 1, else a number of steps")
    weight_decay: float = setting(0.01, "decoupled weight decay (not on biases and LayerNorm)")
    optimizer: str = setting("adamw", "adamw or lamb")
    max_grad_norm: float = setting(1.0, "clip the global gradient norm (0 = off)")
    max_steps: int | None = setting(None, "stop after this many optimizer steps")
    epochs: float | None = setting(None, "stop after this many passes over the data")
    time_budget: float | None = setting(None, "stop after this long, in seconds or as 30m, 2h")
    precision: str = setting("auto", "fp32, bf16 (autocast, fp32 master weights), or auto: bf16 where the CPU or "
                                     "GPU has native bf16 (AMX, AVX512-BF16, Ampere+), else fp32")
    matmul: str = setting("auto", "fp32 CPU training's linear layers: torch (its BLAS, MKL on x86), onednn, or "
                                  "auto: the faster of the two per layer shape, measured once per machine")
    compile: bool = setting(False, "torch.compile the model")
    deterministic: bool = setting(False, "deterministic GPU kernels (torch.use_deterministic_algorithms), so that a "
                                         "CUDA run and its resume repeat bit for bit; slower. CPU runs always do")
    pack: bool = setting(False, "pack several examples per row (block-diagonal attention): same loss, fewer rows")
    seed: int = setting(0, "seed of every random choice: data order, masking, dropout, new weights")
    backend: str = setting("torch", "torch, or jax (Flax NNX; pip install \"bertforge[jax]\")")

    def __post_init__(self) -> None:
        if isinstance(self.time_budget, str):  # a config file may say "30m"
            self.time_budget = parse_duration(self.time_budget)
        for name in ("batch_size", "grad_accum"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{flag(name)} must be at least 1")
        for name in ("lr", "warmup", "weight_decay", "max_grad_norm"):
            if not math.isfinite(getattr(self, name)):
                raise ConfigError(f"{flag(name)} must be a finite number")
        if self.lr <= 0:
            raise ConfigError(f"{flag('lr')} must be positive")
        if self.warmup < 0:
            raise ConfigError(f"{flag('warmup')} must be >= 0")
        if self.optimizer not in ("adamw", "lamb"):
            raise ConfigError(f"{flag('optimizer')} must be adamw or lamb, not {self.optimizer!r}")
        if self.precision not in ("auto", "fp32", "bf16"):
            raise ConfigError(f"{flag('precision')} must be auto, fp32 or bf16, not {self.precision!r}")
        if self.matmul not in ("auto", "torch", "onednn"):
            raise ConfigError(f"{flag('matmul')} must be auto, torch or onednn, not {self.matmul!r}")
        if self.backend not in ("torch", "jax"):
            raise ConfigError(f"{flag('backend')} must be torch or jax, not {self.backend!r}")
        if self.backend == "jax":  # what the JAX engine does not do (yet): refused, never ignored
            for name, torch_only in (("optimizer", self.optimizer != "adamw"), ("precision", self.precision == "bf16"),
                                     ("matmul", self.matmul != "auto"),
                                     ("compile", self.compile), ("pack", self.pack),
                                     ("deterministic", self.deterministic)):
                if torch_only:
                    raise ConfigError(f"{flag(name)} {getattr(self, name)} is not available with --backend jax")
        if self.pack and self.compile:
            raise ConfigError("pack (--pack) and compile (--compile) cannot be combined: packed rows are found "
                              "from the data, which a compiled graph cannot look at")
        for name in ("max_steps", "epochs", "time_budget"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ConfigError(f"{flag(name)} must be positive")
        _chain(self, LoopSettings)


@dataclass
class EvalSettings:
    """When the loop evaluates, and which model it keeps."""

    eval_every: int | None = setting(None, "steps between evaluations (default: at the end only; "
                                           "finetune: every epoch)")
    patience: int | None = setting(None, "stop after this many evaluations without improvement")
    eval_each_epoch: bool = setting(False, "evaluate at the end of every epoch", cli=False)
    select_metric: str | None = setting(None, "keep the model with the best value of this metric", cli=False)
    greater_is_better: bool = setting(True, "whether a higher select_metric is better", cli=False)

    def __post_init__(self) -> None:
        for name in ("eval_every", "patience"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ConfigError(f"{flag(name)} must be at least 1")
        _chain(self, EvalSettings)


@dataclass
class OutputSettings:
    """Where a run writes, how often it saves and logs, and what it may replace."""

    out: str = setting("run", "output directory")
    overwrite: bool = setting(False, "reuse a non-empty --out, replacing what an earlier run wrote there")
    resume: bool = setting(False, "continue the run in --out from its last checkpoint")
    save_every: int | None = setting(500, "steps between checkpoints (none: at the end only)")
    save_every_minutes: float | None = setting(30.0, "minutes between checkpoints, whatever the step count, so "
                                                     "that a killed run loses at most this much (none: by steps only)")
    keep_last: int = setting(2, "checkpoints kept")
    log_every: int = setting(10, "steps between metrics.jsonl rows")
    progress: bool | None = setting(None, "show a progress bar (default: when stderr is a terminal)")

    def __post_init__(self) -> None:
        if self.resume and self.overwrite:
            raise ConfigError("resume (--resume) and overwrite (--overwrite) contradict each other; pick one")
        for name in ("keep_last", "log_every"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{flag(name)} must be at least 1")
        if self.save_every is not None and self.save_every < 1:
            raise ConfigError(f"{flag('save_every')} must be at least 1")
        if self.save_every_minutes is not None and not self.save_every_minutes > 0:
            raise ConfigError(f"{flag('save_every_minutes')} must be positive")
        if self.progress is None:
            self.progress = sys.stderr.isatty()
        _chain(self, OutputSettings)


@dataclass
class TrainConfig(LoopSettings, EvalSettings, OutputSettings):
    """Everything the one training loop reads; `pretrain` and `finetune` add their data and model."""

    @classmethod
    def of(cls, run: "TrainConfig", **changes: Any) -> "TrainConfig":
        """The loop's settings out of a run's config (a `PretrainConfig`, a `FinetuneConfig`)."""
        return cls(**{**{f.name: getattr(run, f.name) for f in fields(cls)}, **changes})

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.max_steps is None and self.epochs is None and self.time_budget is None:
            raise ConfigError("give a stopping rule: max_steps (--max-steps), epochs (--epochs) or "
                              "time_budget (--time-budget)")


@dataclass
class CorpusSettings:
    """How raw text is read into documents."""

    corpus: list[str] = setting(help="files, dirs, globs, hf:NAME, or a `bertforge prepare` dir; "
                                     "none = the embedded corpus", factory=list)
    doc_per_file: bool = setting(False, "a whole file is one document (default: blank lines separate documents)")
    text_field: str = setting("text", "JSONL / datasets field that holds the text")
    encoding_errors: str = setting("strict", "on invalid UTF-8: strict (stop) or replace (U+FFFD)")
    workers: int | None = setting(None, "tokenising processes (default: all cores)")

    def __post_init__(self) -> None:
        if isinstance(self.corpus, str):
            self.corpus = [self.corpus]
        if self.encoding_errors not in ("strict", "replace"):
            raise ConfigError(f"{flag('encoding_errors')} must be strict or replace, not {self.encoding_errors!r}")
        if self.workers is not None and self.workers < 1:
            raise ConfigError(f"{flag('workers')} must be at least 1, not {self.workers} (leave it out for all cores)")
        _chain(self, CorpusSettings)


@dataclass
class MaskingSettings:
    """google-research/bert's masked-LM recipe."""

    masked_lm_prob: float | None = setting(None, "fraction of tokens chosen for prediction (default: the "
                                                 "architecture's recipe, 0.15; ModernBERT's 0.3)")
    mask_prob: float | None = setting(None, "of those, the fraction replaced by [MASK] (default 0.8; ELECTRA's "
                                            "replaced-token detection 0.85)")
    random_prob: float | None = setting(None, "of those, the fraction replaced by a random token, the rest staying "
                                              "(default 0.1; replaced-token detection 0)")
    max_predictions: int | None = setting(None, "cap on predictions per sequence (default: ceil(seq_len x "
                                                "masked_lm_prob))")
    wwm: bool = setting(False, "whole-word masking")
    ngram_mask: int = setting(1, "mask spans of up to N whole words, span length n drawn with p(n) ~ 1/n (ALBERT's "
                                 "n-gram masking uses 3); 1 masks single tokens (or words with --wwm)")

    def __post_init__(self) -> None:
        if self.masked_lm_prob is not None and not 0 < self.masked_lm_prob < 1:
            raise ConfigError(f"{flag('masked_lm_prob')} must lie in (0, 1)")
        for name in ("mask_prob", "random_prob"):
            if getattr(self, name) is not None and not 0 <= getattr(self, name) <= 1:
                raise ConfigError(f"{flag(name)} must lie in [0, 1]")
        if (self.mask_prob or 0) + (self.random_prob or 0) > 1 + 1e-9:
            raise ConfigError("mask_prob + random_prob (--mask-prob, --random-prob) must not exceed 1")
        if not isinstance(self.ngram_mask, int) or self.ngram_mask < 1:
            raise ConfigError(f"{flag('ngram_mask')} must be a positive integer")
        if self.max_predictions is not None and self.max_predictions < 1:
            raise ConfigError(f"{flag('max_predictions')} must be at least 1")
        _chain(self, MaskingSettings)


EMBEDDED_DEFAULTS = {"vocab_size": 8000, "lr": 1e-3, "eval_every": 100, "save_every": 200}
"""What `bertforge pretrain` with no corpus uses where the user set nothing: a tiny model trains
fast at a higher learning rate, and a small corpus needs a small vocabulary."""


@dataclass
class PretrainConfig(TrainConfig, CorpusSettings, MaskingSettings):
    """Everything `bertforge pretrain` takes."""

    model: str | None = setting(None, "a preset (tiny ... large, L<n>-H<n>) or a checkpoint dir "
                                      "(default: tiny for the embedded corpus, else base)")
    arch: str | None = setting(None, "the architecture of a new model: bert, roberta, xlm-roberta, distilbert, albert, "
                                     "electra, deberta-v2 or modernbert (default bert; a --model checkpoint brings its "
                                     "own)")
    objective: str | None = setting(None, "mlm+nsp (BERT's, its default), mlm+sop (ALBERT's sentence order, its "
                                          "default), rtd (ELECTRA's replaced-token detection, its default) or mlm "
                                          "(RoBERTa's FULL-SENTENCES, the default of every other architecture)")
    generator_size: float = setting(0.25, "rtd: the generator's hidden size, heads and feed-forward as a fraction "
                                          "of the discriminator's")
    rtd_weight: float = setting(50.0, "rtd: lambda, the weight of the discriminator's loss against the generator's")
    seq_len: int = setting(128, "tokens per example, [CLS] and [SEP] included")
    tokenizer: str | None = setting(None, "a directory with vocab.txt / tokenizer.json (default: train one)")
    vocab_size: int | None = setting(None, "size of a newly trained vocabulary (default 30522; 8000 for the "
                                           "embedded corpus)")
    short_seq_prob: float = setting(0.1, "probability of a shorter target length for a document's pairs")
    eval_fraction: float = setting(0.01, "documents held out for evaluation (at least 2, at most 1000)")
    eval_batches: int = setting(20, "held-out batches per evaluation")
    demo: bool | None = setting(None, "end with fill-mask on a few sentences (default: for the embedded corpus)")
    out: str = setting("bertforge-pretrain", "output directory")
    lr: float | None = setting(None, "peak learning rate (default 1e-4; 1e-3 for the embedded corpus)")
    eval_every: int | None = setting(None, "steps between evaluations (default: at the end only; 100 for the "
                                           "embedded corpus)")
    save_every: int | None = setting(None, "steps between checkpoints (default 500; 200 for the embedded corpus)")
    time_budget: float | None = setting(None, "stop after this long, in seconds or as 30m, 2h (default for the "
                                              "embedded corpus with no other stopping rule: 3m)")

    def __post_init__(self) -> None:
        if isinstance(self.corpus, str):
            self.corpus = [self.corpus]
        embedded = not self.corpus
        for name, value in EMBEDDED_DEFAULTS.items():
            if getattr(self, name) is None:
                setattr(self, name, value if embedded else {"vocab_size": 30522, "lr": 1e-4, "save_every": 500,
                                                            "eval_every": None}[name])
        if embedded and self.max_steps is None and self.epochs is None and self.time_budget is None:
            self.time_budget = 180.0
        if self.demo is None:
            self.demo = embedded
        super().__post_init__()
        if not 0 < self.generator_size <= 1 or not self.rtd_weight > 0:
            raise ConfigError(f"{flag('generator_size')} must lie in (0, 1] and {flag('rtd_weight')} be positive")
        if self.objective not in (None, *OBJECTIVES):
            raise ConfigError(f"{flag('objective')} must be {', '.join(OBJECTIVES)}, not {self.objective!r}")
        if self.seq_len < 8:
            raise ConfigError(f"{flag('seq_len')} must be at least 8")
        if self.vocab_size < 10:
            raise ConfigError(f"{flag('vocab_size')} must be at least 10")
        if not 0 <= self.short_seq_prob <= 1:
            raise ConfigError(f"{flag('short_seq_prob')} must lie in [0, 1]")
        if not 0 < self.eval_fraction < 1:
            raise ConfigError(f"{flag('eval_fraction')} must lie in (0, 1)")
        if self.eval_batches < 1:
            raise ConfigError(f"{flag('eval_batches')} must be at least 1")


# Pretraining objectives: masked-LM alone, with a sentence-pair head (BERT's next sentence, ALBERT's order), or
# ELECTRA's replaced-token detection (a generator and a discriminator).
OBJECTIVES = ("mlm+nsp", "mlm+sop", "rtd", "mlm")


@dataclass
class FinetuneConfig(TrainConfig):
    """Everything `bertforge finetune` takes."""

    task: str = setting("classify", "classify, regress, ner or qa", cli=False)  # the CLI's positional argument
    model: str = setting("", "a checkpoint directory, or a preset (then --tokenizer is needed)")
    train: str = setting("", "training file (.tsv, .csv, .jsonl; CoNLL or .jsonl for ner; SQuAD .json for qa)")
    dev: str = setting("", "development file, evaluated every epoch (or every --eval-every steps) to select the "
                           "model (none: train, and write the final model unselected)")
    tokenizer: str | None = setting(None, "tokenizer directory when --model is a preset")
    seq_len: int | None = setting(None, "maximum tokens per example (default 128; 384 for qa)")
    text_column: str | None = setting(None, "TSV/CSV/JSONL column of the text (name or 0-based index)")
    pair_column: str | None = setting(None, "column of the second text, for sentence pairs")
    label_column: str | None = setting(None, "column of the label")
    truncation: str = setting("head", "long single texts keep their head, tail or head+tail")
    seeds: str | None = setting(None, "e.g. 1,2,3: one run per seed, reported as mean and std")
    doc_stride: int = setting(128, "qa: tokens of overlap between windows of a long context")
    n_best: int = setting(20, "qa: start and end candidates per window")
    max_answer_len: int = setting(30, "qa: longest answer, in tokens")
    null_threshold: float | None = setting(None, "qa v2: answer '' when null score - best span score exceeds this")
    tune_null_threshold: bool = setting(False, "qa v2: pick the threshold that maximises dev F1")
    out: str = setting("bertforge-finetune", "output directory")
    epochs: float | None = setting(3.0, "stop after this many passes over the data")
    lr: float = setting(2e-5, "peak learning rate")
    warmup: float = setting(0.1, "warmup: a fraction of the total steps if < 1, else a number of steps")
    save_every: int | None = setting(None, "steps between checkpoints (none: at the end only)")

    required = ("model", "train")  # the settings a run cannot go without

    def __post_init__(self) -> None:
        self.seq_len_given = self.seq_len is not None  # a default may shrink to the model; a given value may not
        if self.seq_len is None:
            self.seq_len = 384 if self.task == "qa" else 128  # SQuAD's usual window
        super().__post_init__()
        if self.backend == "jax" and self.task != "classify":  # JAX has the sequence-classification head only
            raise ConfigError(f"{flag('backend')} jax fine-tunes classify only, not {self.task}")
        for name in self.required:
            if not getattr(self, name):
                raise ConfigError(f"{flag(name)} is required")
        if not self.dev:  # what only an evaluation can do
            for name in ("eval_every", "patience", "tune_null_threshold"):
                if getattr(self, name):
                    raise ConfigError(f"{flag(name)} evaluates on --dev; give --dev, or leave it out")
            if self.backend == "jax":
                raise ConfigError(f"{flag('backend')} jax evaluates on --dev every epoch; give --dev")
        if self.truncation not in ("head", "tail", "head+tail"):
            raise ConfigError(f"{flag('truncation')} must be head, tail or head+tail")
        if self.seq_len < 8:
            raise ConfigError(f"{flag('seq_len')} must be at least 8")
        if self.seeds is not None:
            try:
                seeds = [int(s) for s in str(self.seeds).split(",") if s.strip()]
            except ValueError:
                raise ConfigError(f"{flag('seeds')} must be comma-separated integers, not {self.seeds!r}") from None
            if not seeds:
                raise ConfigError(f"{flag('seeds')} names no seed")


@dataclass
class DistillConfig(FinetuneConfig):
    """Everything `bertforge distill` takes: fine-tuning's settings plus the teacher and the mix of losses."""

    teacher: str = setting("", "a fine-tuned checkpoint directory of the task whose outputs the student learns")
    model: str = setting("", "the student: a checkpoint directory or a preset (default: some of the teacher's "
                             "layers, --student-layers)")
    student_layers: str | None = setting(None, "the teacher's layers the student keeps: a count (evenly spaced from "
                                                "the first: 3 of 6 is 0,2,4) or indices such as 0,2,4; default: every "
                                                "other layer, as DistilBERT")
    temperature: float = setting(2.0, "softmax temperature of the teacher's and student's soft targets (all but "
                                      "regress)")
    alpha: float = setting(0.5, "weight of the loss on the teacher's outputs; 1 - alpha goes to the gold labels")
    teacher_cache_mb: float = setting(1024.0, "keep the teacher's outputs on the training set in memory when they "
                                              "take at most this many MiB, else run the teacher on each batch (0: the "
                                              "latter always)")
    out: str = setting("bertforge-distill", "output directory")
    required = ("teacher", "train", "dev")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.model and self.student_layers:
            raise ConfigError(f"{flag('student_layers')} picks the teacher's layers for the student; with "
                              f"{flag('model')} the student is that model: give one of the two")
        if not self.temperature > 0 or not 0 <= self.alpha <= 1:
            raise ConfigError(f"{flag('temperature')} must be positive and {flag('alpha')} within [0, 1]")
        if not self.teacher_cache_mb >= 0:
            raise ConfigError(f"{flag('teacher_cache_mb')} must be 0 or more")
        if self.pack:
            raise ConfigError(f"{flag('pack')} is not supported by distill: each example is matched with its "
                              "teacher outputs row by row")
        if self.backend == "jax":
            raise ConfigError(f"{flag('backend')} jax does not distill; use torch")


@dataclass
class RetrievalTrainConfig(FinetuneConfig):
    """What `finetune embed` and `finetune rerank` share: rows read by column shape, a BEIR folder's splits, a loss."""

    train: str = setting("", "training rows: .jsonl/.tsv/.csv by column shape ((anchor, positive[, negatives...]) or "
                             "(text1, text2, score)), a BEIR folder, or hf:NAME:SPLIT")
    dev: str = setting("", "evaluation: a BEIR folder (its --dev-split qrels) or a (query, passage) pair file "
                           "(none: train, and write the final model unselected)")
    train_split: str = setting("train", "the qrels split a BEIR folder trains on")
    dev_split: str = setting("dev", "the qrels split a BEIR folder evaluates on")
    scale: float | None = setting(None, "the scores' scale in the loss (default: the loss's own)")
    lr: float = setting(2e-5, "peak learning rate")
    epochs: float | None = setting(1.0, "stop after this many passes over the data")

    def __post_init__(self) -> None:
        given = self.seq_len is not None
        if not given:
            self.seq_len = 256  # sentence-transformers' max_seq_length of MiniLM-style models
        super().__post_init__()
        self.seq_len_given = given
        for name in ("text_column", "pair_column", "label_column"):
            if getattr(self, name) is not None:
                raise ConfigError(f"{flag(name)}: {self.task} reads its columns by shape (anchor, positive, "
                                  "negatives...; a 'label' or 'score' column makes scored pairs)")
        if self.scale is not None and not (math.isfinite(self.scale) and self.scale > 0):
            raise ConfigError(f"{flag('scale')} must be a positive number")
        if self.pack:
            raise ConfigError(f"{flag('pack')}: {self.task} already unpads every text; packing is not supported")
        if self.backend == "jax":
            raise ConfigError(f"{flag('backend')} jax fine-tunes classify only, not {self.task}")


def mini_batch_setting() -> Any:
    """--mini-batch-size, for each trainer that embeds texts (embed, sparse, colbert)."""
    return setting(None, "GradCache (sentence-transformers' Cached* losses, PyLate's CachedContrastive): embed this "
                         "many texts at a time, so memory stays flat in --batch-size while the gradients are the "
                         "whole batch's")


def check_mini_batch(cfg: Any) -> None:
    if cfg.mini_batch_size is not None and not 1 <= cfg.mini_batch_size <= cfg.batch_size:
        raise ConfigError(f"{flag('mini_batch_size')} {cfg.mini_batch_size} must lie between 1 and "
                          f"--batch-size ({cfg.batch_size})")


@dataclass
class BiEncoderConfig(RetrievalTrainConfig):
    """What `finetune embed` and `finetune sparse` share: texts embedded one by one, with prompts, GradCache."""

    query_prompt: str | None = setting(None, "put before every query (a row's first text), saved as the prompt named "
                                             "'query' (default: the model directory's query prompt, if it has one)")
    document_prompt: str | None = setting(None, "put before every other text, saved as the prompt named 'document' "
                                                "(default: the model directory's document prompt, if it has one)")
    mini_batch_size: int | None = mini_batch_setting()

    def __post_init__(self) -> None:
        super().__post_init__()
        check_mini_batch(self)


@dataclass
class EmbedConfig(BiEncoderConfig):
    """Everything `bertforge finetune embed` takes: fine-tuning's loop and model, a bi-encoder's data and loss."""

    task: str = setting("embed", "embed", cli=False)
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
    out: str = setting("bertforge-embed", "output directory")

    def __post_init__(self) -> None:
        super().__post_init__()
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
class SparseConfig(BiEncoderConfig):
    """Everything `bertforge finetune sparse` takes: an embedder's data and loop, SPLADE's head and regularisers."""

    task: str = setting("sparse", "sparse", cli=False)
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
    out: str = setting("bertforge-sparse", "output directory")

    def __post_init__(self) -> None:
        super().__post_init__()
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
class ColbertConfig(RetrievalTrainConfig):
    """Everything `bertforge finetune colbert` takes: an embedder's data and loop, ColBERT's settings and losses."""

    task: str = setting("colbert", "colbert", cli=False)
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
    mini_batch_size: int | None = mini_batch_setting()
    out: str = setting("bertforge-colbert", "output directory")

    def __post_init__(self) -> None:
        super().__post_init__()
        check_mini_batch(self)
        if self.scale is not None:
            raise ConfigError(f"{flag('scale')}: ColBERT's Contrastive loss takes --temperature")
        if self.seq_len_given:
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
class RerankConfig(RetrievalTrainConfig):
    """Everything `bertforge finetune rerank` takes: fine-tuning's loop and model, a cross-encoder's data and loss."""

    task: str = setting("rerank", "rerank", cli=False)
    loss: str | None = setting(None, help_line("rerank"))
    num_negatives: int = setting(4, "MultipleNegativesRankingLoss: other rows' passages drawn as each query's "
                                    "in-batch negatives")
    pos_weight: float | None = setting(None, "BinaryCrossEntropyLoss: weight of the positive label")
    candidates: str | None = setting(None, "the first stage's ranking of the --dev queries: a TREC run file (e.g. "
                                           "from bertforge evaluate retrieval --run)")
    rerank_top_k: int = setting(50, "candidates reranked per --dev query")
    out: str = setting("bertforge-rerank", "output directory")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.num_negatives < 0:
            raise ConfigError(f"{flag('num_negatives')} must be 0 or more")
        if self.rerank_top_k < 1:
            raise ConfigError(f"{flag('rerank_top_k')} must be at least 1")
        if self.pos_weight is not None and not (math.isfinite(self.pos_weight) and self.pos_weight > 0):
            raise ConfigError(f"{flag('pos_weight')} must be a positive number")


@dataclass
class DistillMLMConfig(PretrainConfig):
    """Everything `bertforge distill mlm` takes: pretraining's settings (corpus, masking, the loop) plus the teacher,
    the student and DistilBERT's three losses."""

    teacher: str = setting("", "a masked-LM checkpoint directory (any family) whose outputs the student learns")
    model: str | None = setting(None, "the student: a checkpoint directory or a preset of the teacher's family "
                                      "(default: some of the teacher's layers, --student-layers)")
    student_layers: str | None = setting(None, "the teacher's layers the student keeps: a count (evenly spaced from "
                                                "the first) or indices such as 0,2,4; default: every other layer")
    temperature: float = setting(2.0, "softmax temperature of the soft targets")
    alpha_ce: float = setting(5.0, "weight of the soft-target loss (DistilBERT's 5)")
    alpha_mlm: float = setting(2.0, "weight of the student's own masked-LM loss (DistilBERT's 2)")
    alpha_cos: float = setting(1.0, "weight of the cosine loss between the two last hidden states (DistilBERT's 1)")
    out: str = setting("bertforge-distill-mlm", "output directory")

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.teacher:
            raise ConfigError(f"{flag('teacher')} is required")
        if self.arch is not None:
            raise ConfigError(f"{flag('arch')}: the teacher's directory decides the architecture")
        if self.objective not in (None, "mlm"):
            raise ConfigError(f"{flag('objective')}: distillation trains on masked-LM blocks (mlm)")
        if self.model and self.student_layers:
            raise ConfigError(f"{flag('student_layers')} picks the teacher's layers for the student; with "
                              f"{flag('model')} the student is that model: give one of the two")
        weights = (self.alpha_ce, self.alpha_mlm, self.alpha_cos)
        if not self.temperature > 0 or min(weights) < 0 or not sum(weights) > 0:
            raise ConfigError(f"{flag('temperature')} must be positive, and the alphas non-negative with one above 0")


# ---------------------------------------------------------------------------- config files

def cli_fields(cls: type) -> list:
    """The fields of a config class that are settings a user gives (flags and config-file keys)."""
    return [f for f in fields(cls) if f.metadata.get("cli", True)]


def _check_value(value: Any, annotation: Any, where: str) -> Any:
    """`value` as `annotation` (int, float, bool, str, list[str], X | None), or a ConfigError."""
    hint = typing.get_args(annotation) if isinstance(annotation, types.UnionType) else ()
    if hint:  # X | None
        if value is None:
            return None
        annotation = next(a for a in hint if a is not type(None))
    origin = typing.get_origin(annotation)
    if origin is list:
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ConfigError(f"{where} must be a list of strings")
        return value
    if annotation is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where} must be true or false, not {value!r}")
        return value
    if annotation is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where} must be an integer, not {value!r}")
        return value
    if annotation is float:
        if isinstance(value, str) and where.endswith("time_budget"):
            return parse_duration(value)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{where} must be a number, not {value!r}")
        return float(value)
    if annotation is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where} must be a string, not {value!r}")
        return value
    raise ConfigError(f"{where}: cannot read a value of type {annotation}")  # pragma: no cover (a new field type)


def read_config_file(path: str | Path, cls: type) -> dict[str, Any]:
    """A JSON or YAML file of settings, checked key by key against `cls`'s fields.

    Keys are the field names (`batch_size`; `batch-size` is read as the same key). An unknown key
    or a value of the wrong type is refused, naming the file and the key.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read config ({exc})") from None
    if path.suffix.lower() in (".yaml", ".yml"):
        import yaml

        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ConfigError(f"{path}: not valid YAML ({str(exc).splitlines()[0]})") from None
    else:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a config file holds one mapping of setting: value")
    hints = typing.get_type_hints(cls)
    known = {f.name for f in cli_fields(cls)}
    out: dict[str, Any] = {}
    for key, value in data.items():
        name = str(key).replace("-", "_")
        if name not in known:
            close = difflib.get_close_matches(name, sorted(known), n=1)
            raise ConfigError(f"{path}: unknown key '{key}'" + (f"; did you mean '{close[0]}'?" if close else ""))
        out[name] = _check_value(value, hints[name], f"{path}: {name}")
    return out


def saved_settings(cfg: Any) -> dict[str, Any]:
    """The user-facing settings of a config, as `--config` reads them back to the same run. A fine-tuning length the
    user left to the model is saved as null (not the length it came to), so that a run read back works it out the
    same way and is not taken to have asked for it."""
    out = {f.name: getattr(cfg, f.name) for f in cli_fields(type(cfg)) if f.name not in ("resume", "overwrite")}
    if getattr(cfg, "seq_len_given", True) is False and "seq_len" in out:
        out["seq_len"] = None
    return out
