"""`bertforge pretrain`'s and `bertforge distill mlm`'s settings: the loop's (`loop.TrainConfig`) with how raw text is
read (`CorpusSettings`), google-research/bert's masking (`MaskingSettings`), and the model and vocabulary."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConfigError
from .fields import Settings, defaults, flag, setting
from .loop import TrainConfig


@dataclass
class CorpusSettings(Settings):
    """How raw text is read into documents."""

    corpus: list[str] = setting(help="files, dirs, globs, hf:NAME, or a `bertforge prepare` dir; "
                                     "none = the embedded corpus", factory=list)
    doc_per_file: bool = setting(False, "a whole file is one document (default: blank lines separate documents)")
    text_field: str = setting("text", "JSONL / datasets field that holds the text")
    encoding_errors: str = setting("strict", "on invalid UTF-8: strict (stop) or replace (U+FFFD)")
    workers: int | None = setting(None, "tokenising processes (default: all cores)")

    def fill(self) -> None:
        if isinstance(self.corpus, str):
            self.corpus = [self.corpus]

    def check(self) -> None:
        if self.encoding_errors not in ("strict", "replace"):
            raise ConfigError(f"{flag('encoding_errors')} must be strict or replace, not {self.encoding_errors!r}")
        if self.workers is not None and self.workers < 1:
            raise ConfigError(f"{flag('workers')} must be at least 1, not {self.workers} (leave it out for all cores)")


@dataclass
class MaskingSettings(Settings):
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

    def check(self) -> None:
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


EMBEDDED_DEFAULTS = {"vocab_size": 8000, "lr": 1e-3, "eval_every": 100, "save_every": 200}
"""What `bertforge pretrain` with no corpus uses where the user set nothing: a tiny model trains
fast at a higher learning rate, and a small corpus needs a small vocabulary."""


@dataclass
@defaults(out="bertforge-pretrain")
class PretrainConfig(TrainConfig, CorpusSettings, MaskingSettings):
    """Everything `bertforge pretrain` takes."""

    model: str | None = setting(None, "a preset (tiny ... large, L<n>-H<n>) or a checkpoint dir "
                                      "(default: tiny for the embedded corpus, else base)")
    arch: str | None = setting(None, "the architecture of a new model: bert, roberta, xlm-roberta, distilbert, albert, "
                                     "electra, deberta-v2, modernbert, mpnet, camembert, gte or nomic_bert (default bert; a --model checkpoint brings its "
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
    # Defaults that depend on the corpus (the embedded one, or the user's): None here, their help says the rule, and
    # `fill` applies it.
    lr: float | None = setting(None, "peak learning rate (default 1e-4; 1e-3 for the embedded corpus)")
    eval_every: int | None = setting(None, "steps between evaluations (default: at the end only; 100 for the "
                                           "embedded corpus)")
    save_every: int | None = setting(None, "steps between checkpoints (default 500; 200 for the embedded corpus)")
    time_budget: float | None = setting(None, "stop after this long, in seconds or as 30m, 2h (default for the "
                                              "embedded corpus with no other stopping rule: 3m)")

    def fill(self) -> None:
        embedded = not self.corpus
        for name, value in EMBEDDED_DEFAULTS.items():
            if getattr(self, name) is None:
                setattr(self, name, value if embedded else {"vocab_size": 30522, "lr": 1e-4, "save_every": 500,
                                                            "eval_every": None}[name])
        if embedded and self.max_steps is None and self.epochs is None and self.time_budget is None:
            self.time_budget = 180.0
        if self.demo is None:
            self.demo = embedded

    def check(self) -> None:
        if not 0 < self.generator_size <= 1 or not self.rtd_weight > 0:
            raise ConfigError(f"{flag('generator_size')} must lie in (0, 1] and {flag('rtd_weight')} be positive")
        if self.objective in ("plm", "mpnet"):
            raise ConfigError(f"{flag('objective')} {self.objective}: MPNet's permuted language modelling is not "
                              "built; bertforge pretrains MPNet with masked-LM (--objective mlm, its default here)")
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
@defaults(out="bertforge-distill-mlm")
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

    def check(self) -> None:
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
