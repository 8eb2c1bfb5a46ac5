"""`bertforge pretrain`: raw text (or prepared shards) to a pretrained BERT in the Hugging Face layout.

The flow: read the corpus -> train a WordPiece vocabulary unless one is given -> tokenise
into shards under OUT/data (reused on resume) -> hold out the last documents for
evaluation -> sentence pairs (MLM + NSP) or packed blocks (MLM) -> dynamic masking ->
the one training loop -> OUT/ holds config.json, model.safetensors, vocab.txt,
tokenizer.json, metrics.jsonl, curves.png and checkpoints/.

With no corpus it pretrains a `tiny` model on the docstrings of Python's standard library,
which every machine with Python has, and ends with a fill-mask demo.
"""

from __future__ import annotations

import json
import math
import shutil
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

import numpy as np
import torch

from . import distributed as dist
from .config import BertConfig
from .data.corpus import CorpusOptions, iter_documents
from .data.pretraining import MaskingCollator, MaskingConfig, PretrainingExamples
from .data.shards import TokenShards, load_tokenizer_for, prepare, tokenizer_fingerprint
from .errors import BertforgeError
from .heads import BertForMaskedLM, BertForPreTraining
from .tokenizer import Tokenizer
from .runconfig import PretrainConfig, TrainConfig
from .train import Trainer

EMBEDDED = "python-stdlib-docstrings"
DEMO_SENTENCES = [
    "Return a new [MASK] with the items of the iterable.",
    "If the file does not [MASK], an error is raised.",
    "This method is called when the [MASK] is closed.",
    "Raise a ValueError if the [MASK] is negative.",
]


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
        if getattr(out, "nsp_loss", None) is not None:
            parts["nsp_loss"] = out.nsp_loss.detach()
        return out.loss, parts

    def evaluate(self, model) -> dict[str, float]:
        """Held-out MLM loss (per predicted token), MLM accuracy, perplexity, and NSP accuracy."""
        if self.held_out is None:
            return {}
        device = next(model.parameters()).device
        instances = self.held_out.instances(0)
        order = np.random.default_rng([self.seed, 13]).permutation(len(instances))
        nll = correct = predicted = nsp_correct = nsp_total = 0.0
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
            if getattr(out, "nsp_logits", None) is not None:
                nsp_correct += (out.nsp_logits.argmax(-1) == batch["next_sentence_label"]).sum().item()
                nsp_total += len(rows)
        result = {"mlm_loss": nll / max(1, predicted), "mlm_acc": correct / max(1, predicted)}
        result["perplexity"] = math.exp(min(result["mlm_loss"], 50))
        if nsp_total:
            result["nsp_acc"] = nsp_correct / nsp_total
        return result


def _prepare_output(cfg: PretrainConfig) -> Path:
    out = Path(cfg.out)
    if cfg.resume:
        if not (out / "checkpoints").is_dir():
            raise BertforgeError(f"{out}: nothing to resume (no checkpoints/ directory)")
        return out
    if out.exists() and not out.is_dir():
        raise BertforgeError(f"{out}: exists and is not a directory")
    if out.exists() and any(out.iterdir()):
        if not cfg.overwrite:
            raise BertforgeError(f"{out}: directory exists and is not empty; pass --overwrite to reuse it "
                                 "or --resume to continue its run")
        # Only what a bertforge run writes is cleared; any other file stays where it is.
        if dist.is_main():
            for name in ("checkpoints", "metrics.jsonl", "curves.png"):
                target = out / name
                if target.is_dir():
                    shutil.rmtree(target)
                elif target.exists():
                    target.unlink()
    return out


def _documents(cfg: PretrainConfig):
    if cfg.corpus:
        options = CorpusOptions(doc_per_file=cfg.doc_per_file, text_field=cfg.text_field,
                                encoding_errors=cfg.encoding_errors, seed=cfg.seed)
        return iter_documents(cfg.corpus, options)
    from .data.builtin_corpus import stdlib_docstrings

    return stdlib_docstrings()


def _data(cfg: PretrainConfig, out: Path) -> tuple[TokenShards, Tokenizer]:
    """Prepared shards and their tokenizer: given, cached under OUT/data, or made now (rank 0)."""
    if len(cfg.corpus) == 1 and (Path(cfg.corpus[0]) / "meta.json").is_file():
        shards = TokenShards(cfg.corpus[0])
        return shards, load_tokenizer_for(shards)
    cache = out / "data"
    if dist.is_main() and not (cache / "meta.json").is_file():
        tokenizer = _tokenizer(cfg)
        sources = cfg.corpus or [EMBEDDED]
        if cfg.corpus:
            options = CorpusOptions(doc_per_file=cfg.doc_per_file, text_field=cfg.text_field,
                                    encoding_errors=cfg.encoding_errors, seed=cfg.seed)
            prepare(cfg.corpus, cache, tokenizer, options, workers=cfg.workers, progress=cfg.progress)
        else:
            from .data.builtin_corpus import stdlib_docstrings
            from .data.shards import prepare_documents

            prepare_documents(stdlib_docstrings(), sources, cache, tokenizer, workers=1, progress=cfg.progress)
    dist.barrier()
    shards = TokenShards(cache)
    if cfg.corpus and shards.meta["sources"] != [str(s) for s in cfg.corpus]:
        raise BertforgeError(f"{cache}: prepared from {shards.meta['sources']}, not from {cfg.corpus}; "
                             "use a new --out (or --overwrite after removing that data directory)")
    return shards, load_tokenizer_for(shards)


def _tokenizer(cfg: PretrainConfig) -> Tokenizer:
    if cfg.model and Path(cfg.model).is_dir():
        return Tokenizer.from_pretrained(cfg.model)
    if cfg.tokenizer:
        return Tokenizer.from_pretrained(cfg.tokenizer)
    print(f"tokenizer: training a {cfg.vocab_size:,}-piece WordPiece vocabulary on the corpus", flush=True)
    return Tokenizer.train(texts=lambda: _documents(cfg), vocab_size=cfg.vocab_size, lowercase=True,
                           show_progress=cfg.progress)


def _model(cfg: PretrainConfig, tokenizer: Tokenizer) -> torch.nn.Module:
    cls = BertForPreTraining if cfg.objective == "mlm+nsp" else BertForMaskedLM
    name = cfg.model or ("base" if cfg.corpus else "tiny")
    if Path(name).is_dir():
        model = cls.from_pretrained(name)
        if model.config.vocab_size < tokenizer.vocab_size:
            raise BertforgeError(f"{name}: vocab_size {model.config.vocab_size} is smaller than the tokenizer's "
                                 f"{tokenizer.vocab_size}")
    else:
        model = cls(BertConfig.from_preset(name, vocab_size=tokenizer.vocab_size))
    if cfg.seq_len > model.config.max_position_embeddings:
        raise BertforgeError(f"--seq-len {cfg.seq_len} exceeds the model's max_position_embeddings "
                             f"({model.config.max_position_embeddings})")
    return model


def _split(shards: TokenShards, cfg: PretrainConfig) -> tuple[np.ndarray, np.ndarray]:
    n = shards.num_documents
    n_eval = 0 if n < 4 else min(1000, max(2, round(cfg.eval_fraction * n)))
    docs = np.arange(n, dtype=np.int64)
    return docs[: n - n_eval], docs[n - n_eval:]


def run_pretrain(cfg: PretrainConfig) -> dict[str, Any]:
    """Run pretraining end to end; returns a summary (also written to OUT/pretrain_results.json)."""
    dist.init()
    torch.manual_seed(cfg.seed)
    if cfg.demo is None:
        cfg.demo = not cfg.corpus
    out = _prepare_output(cfg)
    # Every rank has checked --out as the user left it; only now may rank 0 write there.
    # Without this, a slower rank sees rank 0's first files and refuses a "non-empty" directory.
    dist.barrier()
    out.mkdir(parents=True, exist_ok=True)
    shards, tokenizer = _data(cfg, out)
    if cfg.seq_len > 512 and not (cfg.model and Path(cfg.model).is_dir()):
        raise BertforgeError(f"--seq-len {cfg.seq_len} exceeds max_position_embeddings (512)")
    model = _model(cfg, tokenizer)
    train_docs, eval_docs = _split(shards, cfg)
    if cfg.objective == "mlm+nsp" and len(train_docs) < 2:
        raise BertforgeError(f"{', '.join(cfg.corpus) or EMBEDDED}: {shards.num_documents} document(s), too few to "
                             "build sentence pairs: NSP needs at least two documents (separate them with blank "
                             "lines, or use --objective mlm)")
    make = lambda docs: PretrainingExamples(shards, docs, tokenizer, cfg.seq_len, cfg.objective,  # noqa: E731
                                            cfg.short_seq_prob, cfg.seed)
    collator = MaskingCollator(tokenizer, cfg.seq_len, MaskingConfig(cfg.masked_lm_prob, cfg.mask_prob,
                                                                      cfg.random_prob, cfg.max_predictions, cfg.wwm),
                               pack_to=cfg.seq_len if cfg.pack else None)
    task = PretrainingTask(make(train_docs), make(eval_docs) if len(eval_docs) >= 2 else None, collator,
                           cfg.batch_size, cfg.seed, cfg.eval_batches)
    train_cfg = TrainConfig(**{f.name: getattr(cfg, f.name) for f in fields(TrainConfig)})
    run_info = {"model_config": model.config.to_dict(), "objective": cfg.objective, "seq_len": cfg.seq_len,
                "batch_size": cfg.batch_size, "grad_accum": cfg.grad_accum, "lr": cfg.lr, "warmup": cfg.warmup,
                "weight_decay": cfg.weight_decay, "optimizer": cfg.optimizer, "seed": cfg.seed, "wwm": cfg.wwm,
                "masking": [cfg.masked_lm_prob, cfg.mask_prob, cfg.random_prob, cfg.max_predictions],
                "world_size": dist.world_size(), "precision": cfg.precision, "pack": cfg.pack, "data": tokenizer_fingerprint(tokenizer),
                "data_tokens": shards.num_tokens}
    if dist.is_main():
        print(f"data: {shards.num_documents:,} documents, {shards.num_tokens:,} tokens; "
              f"{len(train_docs):,} documents for training, {len(eval_docs):,} held out", flush=True)
        print(f"model: {model.num_parameters():,} parameters; objective {cfg.objective}; seq {cfg.seq_len}; "
              f"global batch {cfg.batch_size * cfg.grad_accum * dist.world_size()}", flush=True)
    trainer = Trainer(model, task, train_cfg, run_info)
    summary = trainer.fit(resume=cfg.resume)
    if dist.is_main():
        model.save_pretrained(out, tokenizer=tokenizer)
        from .viz import plot_curves

        plot_curves(out / "metrics.jsonl", out / "curves.png", title="pretraining")
        result = {"out": str(out), "steps": summary["step"], "stopped_by": summary["stop"],
                  "seconds": round(summary["elapsed"], 1), "eval": summary["eval"], "config": asdict(cfg)}
        (out / "pretrain_results.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
        print(json.dumps({k: result[k] for k in ("out", "steps", "stopped_by", "seconds", "eval")}), flush=True)
        if cfg.demo:
            _fill_mask_demo(model, tokenizer)
    dist.cleanup()
    return summary


def _fill_mask_demo(model, tokenizer: Tokenizer) -> None:
    from .pipelines import fill_mask

    model = model.cpu().eval()
    print("fill-mask with the model just trained:")
    for text, per_mask in zip(DEMO_SENTENCES, fill_mask(model, tokenizer, DEMO_SENTENCES, top_k=5)):
        guesses = ", ".join(f"{p['token_str']} ({p['score']:.2f})" for p in per_mask[0])
        print(f"  {text}\n    -> {guesses}")
