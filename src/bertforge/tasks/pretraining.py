"""Pretraining as a task: masked-LM (+ next-sentence prediction) over prepared token shards.

Reader -> features -> task -> head -> metric, as for the fine-tuning tasks: the corpus is read
into `TokenShards` by `data/`, documents become sentence pairs (MLM + NSP, as google-research/bert)
or packed blocks (MLM only), the collator masks them afresh each epoch, the head is
`BertForPreTraining` or `BertForMaskedLM`, and the metric is held-out MLM loss, accuracy and
perplexity (plus NSP accuracy).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch

from ..data.pretraining import MaskingCollator, PretrainingExamples
from ..data.shards import TokenShards
from ..errors import BertforgeError
from ..interop.hf import family_of, load_pretrained, read_config
from ..models.distillation import MaskedLMDistillation, as_distilbert, cut_down, student_layers
from ..models.electra import (
    ElectraForMaskedLM,
    ElectraForPreTraining,
    ElectraReplacedTokenDetection,
)
from ..models.registry import family
from ..settings import PretrainConfig, check_seq_len
from ..tokenization.base import Tokenizer


class PretrainingTask:
    """MLM (+ NSP) on prepared shards, for the training loop."""

    def __init__(self, train: PretrainingExamples, held_out: PretrainingExamples | None, collator: MaskingCollator,
                 batch_size: int, seed: int, eval_batches: int) -> None:
        self.train, self.held_out, self.collator = train, held_out, collator
        self.batch_size, self.seed, self.eval_batches = batch_size, seed, eval_batches
        self._order: tuple[int, np.ndarray] | None = None

    def _permutation(self, epoch: int) -> np.ndarray:
        if self._order is None or self._order[0] != epoch:
            n = len(self.train.instances(epoch))
            self._order = (epoch, np.random.default_rng([self.seed, 7, epoch]).permutation(n))
        return self._order[1]

    def micro_batches_per_epoch(self, epoch: int) -> int:
        return len(self.train.instances(epoch)) // self.batch_size

    def micro_batch(self, epoch: int, index: int) -> dict[str, torch.Tensor]:
        rows = self._permutation(epoch)[index * self.batch_size:(index + 1) * self.batch_size]
        examples = [self.train.example(epoch, int(r)) for r in rows]
        return self.collator(examples, np.random.default_rng([self.seed, 11, epoch, index]))

    def loss(self, model, batch):
        out = model(**batch)
        parts = {"mlm_loss": out.mlm_loss.detach()} if hasattr(out, "mlm_loss") else {"mlm_loss": out.loss.detach()}
        for name in ("rtd_loss", "soft_loss", "cos_loss"):  # ELECTRA's discriminator; distillation's other two
            if hasattr(out, name):
                parts[name] = getattr(out, name).detach()
        if getattr(out, "nsp_loss", None) is not None:  # ALBERT's sentence-order loss, under its own name
            parts["sop_loss" if "sentence_order_label" in batch else "nsp_loss"] = out.nsp_loss.detach()
        return out.loss, parts

    def evaluate(self, model) -> dict[str, float]:
        """Held-out MLM loss (per predicted token), MLM accuracy, perplexity, and NSP accuracy."""
        if self.held_out is None:
            return {}
        device = next(model.parameters()).device
        instances = self.held_out.instances(0)
        order = np.random.default_rng([self.seed, 13]).permutation(len(instances))
        nll = correct = predicted = nsp_correct = nsp_total = rtd_correct = rtd_total = rtd_loss = 0.0
        for b in range(self.eval_batches):
            rows = order[b * self.batch_size:(b + 1) * self.batch_size]
            if len(rows) == 0:
                break
            batch = self.collator([self.held_out.example(0, int(r)) for r in rows], np.random.default_rng([self.seed, 17, b]))
            batch = {k: v.to(device) for k, v in batch.items()}
            out = model(**batch)
            targets = batch["labels"][batch["labels"] != -100]
            nll += torch.nn.functional.cross_entropy(out.logits.float(), targets, reduction="sum").item()
            correct += (out.logits.argmax(-1) == targets).sum().item()
            predicted += targets.numel()
            if hasattr(out, "rtd_logits"):  # every real token, original or replaced
                real = batch["attention_mask"].bool()
                rtd_correct += ((out.rtd_logits[real] > 0).long() == out.rtd_labels[real]).sum().item()
                rtd_total += real.sum().item()
                rtd_loss += out.rtd_loss.item() * real.sum().item()
            pair_label = "sentence_order_label" if "sentence_order_label" in batch else "next_sentence_label"
            if getattr(out, "nsp_logits", None) is not None:
                nsp_correct += (out.nsp_logits.argmax(-1) == batch[pair_label]).sum().item()
                nsp_total += len(rows)
        result = {"mlm_loss": nll / max(1, predicted), "mlm_acc": correct / max(1, predicted)}
        result["perplexity"] = math.exp(min(result["mlm_loss"], 50))
        if rtd_total:
            result["rtd_loss"], result["rtd_acc"] = rtd_loss / rtd_total, rtd_correct / rtd_total
        if nsp_total:
            result["sop_acc" if self.train.objective == "mlm+sop" else "nsp_acc"] = nsp_correct / nsp_total
        return result


def _model(cfg: PretrainConfig, tokenizer: Tokenizer) -> torch.nn.Module:
    """The model to pretrain: --model's checkpoint, or a new --arch model of a preset size (both resolved by
    `training.pretrain.resolve_architecture`), with its pretraining heads (MLM + NSP) or masked-LM alone."""
    kind = "pretraining" if cfg.objective in ("mlm+nsp", "mlm+sop") else "masked-lm"
    if getattr(cfg, "teacher", None):
        return _distillation(cfg, tokenizer)
    name = cfg.model or ("base" if cfg.corpus else "tiny")
    if cfg.objective == "rtd":
        return _replaced_token_detection(cfg, name, tokenizer)
    if Path(name).is_dir():
        model = load_pretrained(family_of(name).head(kind), name)
        if model.config.vocab_size < len(tokenizer):
            raise BertforgeError(f"{name}: vocab_size {model.config.vocab_size} is smaller than the tokenizer's "
                                 f"{len(tokenizer)}")
    else:
        row = family(cfg.arch or "bert")
        config = row.config.from_preset(name, vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id)
        model = row.head(kind)(config)
    _check_seq_len(cfg, model.config)
    return model


def _replaced_token_detection(cfg: PretrainConfig, name: str, tokenizer: Tokenizer) -> ElectraReplacedTokenDetection:
    """ELECTRA's generator and discriminator: a new pair of a preset size (the generator --generator-size of it), or
    a pretrained discriminator directory with its generator in generator/ (a new one when that is absent)."""
    if Path(name).is_dir():
        discriminator = load_pretrained(ElectraForPreTraining, name)
        generator_dir = Path(name) / "generator"
        generator = (load_pretrained(ElectraForMaskedLM, generator_dir) if generator_dir.is_dir() else
                     ElectraForMaskedLM(ElectraReplacedTokenDetection.generator_config(discriminator.config,
                                                                                       cfg.generator_size)))
    else:
        config = family("electra").config.from_preset(name, vocab_size=len(tokenizer),
                                                      pad_token_id=tokenizer.pad_token_id)
        discriminator = ElectraForPreTraining(config)
        generator = ElectraForMaskedLM(ElectraReplacedTokenDetection.generator_config(config, cfg.generator_size))
    if discriminator.config.vocab_size < len(tokenizer):
        raise BertforgeError(f"{name}: vocab_size {discriminator.config.vocab_size} is smaller than the tokenizer's "
                             f"{len(tokenizer)}")
    _check_seq_len(cfg, discriminator.config)
    return ElectraReplacedTokenDetection(discriminator, generator, cfg.rtd_weight)


def _distillation(cfg, tokenizer: Tokenizer) -> MaskedLMDistillation:
    """`distill mlm`: the teacher's masked-LM model, frozen, and the student: --model, or the teacher cut down to
    --student-layers, written as a DistilBERT when the teacher is a BERT (DistilBERT's own layout)."""
    row = family_of(cfg.teacher)
    teacher = load_pretrained(row.head("masked-lm"), cfg.teacher)
    if cfg.model and Path(cfg.model).is_dir():
        student = load_pretrained(family_of(cfg.model).head("masked-lm"), cfg.model)
    elif cfg.model:
        config = row.config.from_preset(cfg.model, vocab_size=teacher.config.vocab_size,
                                        pad_token_id=teacher.config.pad_token_id)
        student = row.head("masked-lm")(config)
    else:
        student = cut_down(teacher, student_layers(cfg.student_layers, teacher.config.num_hidden_layers))
        if row.model_type == "bert" and teacher.config.layer_norm_eps == 1e-12:
            student = as_distilbert(student)
    if student.config.vocab_size < len(tokenizer):
        raise BertforgeError(f"the student embeds {student.config.vocab_size:,} tokens, fewer than the teacher's "
                             f"tokenizer's {len(tokenizer):,}")
    _check_seq_len(cfg, student.config)
    return MaskedLMDistillation(student, teacher, cfg.temperature, (cfg.alpha_ce, cfg.alpha_mlm, cfg.alpha_cos))


def check_model(cfg: PretrainConfig) -> None:
    """Refuse a --model that is neither a checkpoint nor a preset, a checkpoint whose config.json is bad, or a
    --seq-len the model's positions cannot hold: called before the run writes anything."""
    if getattr(cfg, "teacher", None) and not cfg.model:  # distillation: the student is cut from the teacher
        _check_seq_len(cfg, read_config(cfg.teacher))
        return
    name = cfg.model or ("base" if cfg.corpus else "tiny")
    config = read_config(name) if Path(name).is_dir() else family(cfg.arch or "bert").config.from_preset(name)
    _check_seq_len(cfg, config)


def _check_seq_len(cfg: PretrainConfig, config) -> None:
    check_seq_len(cfg.seq_len, config)


def _split(shards: TokenShards, cfg: PretrainConfig) -> tuple[np.ndarray, np.ndarray]:
    n = shards.num_documents
    n_eval = 0 if n < 4 else min(1000, max(2, round(cfg.eval_fraction * n)))
    docs = np.arange(n, dtype=np.int64)
    return docs[: n - n_eval], docs[n - n_eval:]


def build(cfg: PretrainConfig, shards: TokenShards, tokenizer: Tokenizer, source: str) -> tuple[torch.nn.Module, PretrainingTask]:
    """(model, task) for pretraining on `shards`; `source` names the corpus in error messages."""
    model = _model(cfg, tokenizer)
    train_docs, eval_docs = _split(shards, cfg)
    if cfg.objective != "mlm" and len(train_docs) < 2:
        raise BertforgeError(f"{source}: {shards.num_documents} document(s), too few to build sentence pairs: NSP "
                             "needs at least two documents (separate them with blank lines, or use --objective mlm)")

    def examples(docs: np.ndarray) -> PretrainingExamples:
        # Replaced-token detection reads the masked-LM blocks: its data is masked-LM's, its model is not.
        data = "mlm" if cfg.objective == "rtd" else cfg.objective
        return PretrainingExamples(shards, docs, tokenizer, cfg.seq_len, data, cfg.short_seq_prob, cfg.seed)

    collator = MaskingCollator(tokenizer, cfg.seq_len, cfg, pack_to=cfg.seq_len if cfg.pack else None)
    task = PretrainingTask(examples(train_docs), examples(eval_docs) if len(eval_docs) >= 2 else None, collator,
                           cfg.batch_size, cfg.seed, cfg.eval_batches)
    task.documents = (len(train_docs), len(eval_docs))
    return model, task
