"""`bertforge pretrain`: raw text (or prepared shards) to a pretrained encoder in the Hugging Face layout.

The flow: pick the architecture (--arch, or --model's) -> read the corpus -> train a vocabulary of its
kind unless one is given -> tokenise
into shards under OUT/data (reused on resume) -> hold out the last documents for
evaluation -> sentence pairs (MLM + NSP) or packed blocks (MLM) -> dynamic masking ->
the one training loop -> OUT/ holds config.json, model.safetensors, vocab.txt,
tokenizer.json, metrics.jsonl, curves.png and checkpoints/.

With no corpus it pretrains a `tiny` model on the docstrings of Python's standard library,
which every machine with Python has, and ends with a fill-mask demo.
"""

from __future__ import annotations

import shutil
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from ..data.corpus import CorpusOptions, iter_documents
from ..data.shards import (
    TokenShards,
    load_tokenizer_for,
    prepare,
    tokenizer_fingerprint,
)
from ..errors import BertforgeError
from ..heartbeat import phase
from ..interop.hf import family_of, save_pretrained
from ..jsonfile import dumps
from ..safefiles import write_text
from ..models.registry import family
from ..settings import PretrainConfig, TrainConfig
from ..tasks.pretraining import build, check_model
from ..tokenization.kinds import load_tokenizer, train_tokenizer
from ..tokenization.base import Tokenizer
from . import distributed as dist
from .engines import check_engine, make_trainer
from .runs import claim_output, report, save_run_config

EMBEDDED = "python-stdlib-docstrings"
DEMO_SENTENCES = [
    "Return a new [MASK] with the items of the iterable.",
    "If the file does not [MASK], an error is raised.",
    "This method is called when the [MASK] is closed.",
    "Raise a ValueError if the [MASK] is negative.",
]


def _documents(cfg: PretrainConfig):
    if cfg.corpus:
        options = CorpusOptions(doc_per_file=cfg.doc_per_file, text_field=cfg.text_field,
                                encoding_errors=cfg.encoding_errors, seed=cfg.seed)
        return iter_documents(cfg.corpus, options)
    from ..data.builtin_corpus import stdlib_docstrings

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
            from ..data.builtin_corpus import stdlib_docstrings
            from ..data.shards import prepare_documents

            prepare_documents(stdlib_docstrings(), sources, cache, tokenizer, workers=1, progress=cfg.progress)
    dist.barrier()
    shards = TokenShards(cache)
    if cfg.corpus and shards.meta["sources"] != [str(s) for s in cfg.corpus]:
        if cfg.overwrite and dist.world_size() == 1:  # the cache is this run's own: make it again from this corpus
            shutil.rmtree(cache)
            return _data(cfg, out)
        raise BertforgeError(f"{cache}: prepared from {shards.meta['sources']}, not from {cfg.corpus}; "
                             "use a new --out, or --overwrite to prepare it again")
    return shards, load_tokenizer_for(shards)


def _tokenizer(cfg: PretrainConfig) -> Tokenizer:
    """--model's tokenizer, --tokenizer, or a new vocabulary of the architecture's kind trained on the corpus."""
    if getattr(cfg, "teacher", None):  # distillation: the student reads the teacher's tokens
        return load_tokenizer(cfg.teacher)
    if cfg.model and Path(cfg.model).is_dir():
        return load_tokenizer(cfg.model)
    if cfg.tokenizer:
        return load_tokenizer(cfg.tokenizer)
    row = family(cfg.arch)
    print(f"tokenizer: training a {cfg.vocab_size:,}-piece {KIND_NAMES[row.tokenizer]} vocabulary on the corpus",
          flush=True)
    with phase("training the vocabulary"):
        return train_tokenizer(row.tokenizer, row.tokenizer_class, texts=lambda: _documents(cfg),
                               vocab_size=cfg.vocab_size, show_progress=cfg.progress)


def _say_foreign_vocabulary(cfg: PretrainConfig) -> None:
    """One line when --tokenizer is of another kind than --arch's own (a WordPiece vocabulary for RoBERTa, say):
    allowed, since any vocabulary can train any encoder, but not what a reader of the config would assume."""
    if not cfg.tokenizer or (cfg.model and Path(cfg.model).is_dir()) or getattr(cfg, "teacher", None):
        return
    from ..tokenization.kinds import kind_of_files

    own, given = family(cfg.arch).tokenizer, kind_of_files(cfg.tokenizer)
    if given != own:
        print(f"bertforge: note: building {cfg.arch} on the {KIND_NAMES[given]} vocabulary of --tokenizer "
              f"{cfg.tokenizer} ({cfg.arch}'s own is {KIND_NAMES[own]}); the model is saved with that tokenizer as "
              "it is", file=sys.stderr, flush=True)


# Each architecture's own pretraining objective where it is not masked-LM alone: BERT's next-sentence prediction,
# ALBERT's sentence-order prediction.
OWN_OBJECTIVE = {"bert": "mlm+nsp", "albert": "mlm+sop", "electra": "rtd"}
# The masked-LM rate of each architecture's published recipe, where it is not BERT's 15%.
MASKING_RATE = {"modernbert": 0.3}
KIND_NAMES = {"wordpiece": "WordPiece", "bpe": "byte-level BPE", "unigram": "SentencePiece Unigram"}


def resolve_architecture(cfg: PretrainConfig) -> None:
    """Fill in `cfg.arch` and `cfg.objective`: a --model checkpoint decides the architecture (--arch may only
    agree with it), else --arch (default bert); the objective defaults to the architecture's own."""
    if getattr(cfg, "teacher", None):  # distillation: the teacher's family and masked-LM blocks
        if not Path(cfg.teacher).is_dir():
            raise BertforgeError(f"--teacher {cfg.teacher}: no such checkpoint directory")
        row = family_of(cfg.teacher)
    elif cfg.model and Path(cfg.model).is_dir():
        row = family_of(cfg.model)
        if cfg.arch is not None and cfg.arch != row.model_type:
            raise BertforgeError(f"--arch {cfg.arch}: {cfg.model} is a '{row.model_type}' checkpoint; "
                                 "drop --arch, or start from a preset")
    else:
        row = family(cfg.arch or "bert", source="--arch")
    cfg.arch = row.model_type
    if cfg.masked_lm_prob is None:  # ModernBERT's recipe masks 30% of tokens; BERT's and the others' 15%
        cfg.masked_lm_prob = MASKING_RATE.get(row.model_type, 0.15)
    if cfg.objective is None:
        cfg.objective = "mlm" if getattr(cfg, "teacher", None) else OWN_OBJECTIVE.get(row.model_type, "mlm")
    allowed = {"mlm", OWN_OBJECTIVE.get(row.model_type, "mlm")}
    if cfg.objective not in allowed:
        owner = {"mlm+nsp": "BERT's", "mlm+sop": "ALBERT's", "rtd": "ELECTRA's"}[cfg.objective]
        raise BertforgeError(f"--objective {cfg.objective} is {owner}; {row.model_type} pretrains with --objective "
                             f"{' or '.join(sorted(allowed))} here")
    if cfg.mask_prob is None:  # ELECTRA masks with [MASK] 85% of the time and keeps the original otherwise
        cfg.mask_prob = 0.85 if cfg.objective == "rtd" else 0.8
    if cfg.random_prob is None:
        cfg.random_prob = 0.0 if cfg.objective == "rtd" else 0.1
    if cfg.mask_prob + cfg.random_prob > 1 + 1e-9:
        raise BertforgeError(f"--mask-prob {cfg.mask_prob} and --random-prob {cfg.random_prob} add up to more than 1")


def run_pretrain(cfg: PretrainConfig, as_json: bool = True) -> dict[str, Any]:
    """Run pretraining end to end; returns a summary (also written to OUT/pretrain_results.json).

    The summary is printed at the end: one JSON object with `as_json`, else a readable block.
    """
    resolve_architecture(cfg)
    check_model(cfg)  # a bad preset, checkpoint config or --seq-len is refused before --out is touched
    check_engine(cfg)
    dist.init()
    if dist.is_main():
        _say_foreign_vocabulary(cfg)
    torch.manual_seed(cfg.seed)
    out = claim_output(cfg)
    # Every rank has checked --out as the user left it; only now may rank 0 write there.
    # Without this, a slower rank sees rank 0's first files and refuses a "non-empty" directory.
    dist.barrier()
    with phase("preparing the data"):
        shards, tokenizer = _data(cfg, out)
    model, task = build(cfg, shards, tokenizer, source=", ".join(cfg.corpus) or EMBEDDED)
    run_info = {"model_config": model.config.to_dict(), "objective": cfg.objective, "seq_len": cfg.seq_len,
                "batch_size": cfg.batch_size, "grad_accum": cfg.grad_accum, "lr": cfg.lr, "warmup": cfg.warmup,
                "weight_decay": cfg.weight_decay, "optimizer": cfg.optimizer, "seed": cfg.seed, "wwm": cfg.wwm,
                "ngram_mask": cfg.ngram_mask,
                "distill": {k: getattr(cfg, k) for k in ("teacher", "student_layers", "temperature", "alpha_ce",
                                                        "alpha_mlm", "alpha_cos") if hasattr(cfg, k)} or None,
                "masking": [cfg.masked_lm_prob, cfg.mask_prob, cfg.random_prob, cfg.max_predictions],
                "world_size": dist.world_size(), "precision": cfg.precision, "pack": cfg.pack,
                "data": tokenizer_fingerprint(tokenizer), "data_tokens": shards.num_tokens}
    if dist.is_main():
        n_train, n_eval = task.documents
        print(f"data: {shards.num_documents:,} documents, {shards.num_tokens:,} tokens; "
              f"{n_train:,} documents for training, {n_eval:,} held out", flush=True)
        print(f"model: {model.num_parameters():,} parameters; objective {cfg.objective}; seq {cfg.seq_len}; "
              f"global batch {cfg.batch_size * cfg.grad_accum * dist.world_size()}", flush=True)
    trainer = make_trainer(model, task, TrainConfig.of(cfg), run_info, cfg.seq_len, tokenizer.pad_token_id)
    trainer.result_file = out / "pretrain_results.json"
    trainer.on_start = lambda: save_run_config(out, cfg) if dist.is_main() else None
    summary = trainer.fit(resume=cfg.resume)
    if summary.get("compile_seconds") is not None:
        print(f"jax: the step compiled in {summary['compile_seconds']:.1f} s", flush=True)
    if dist.is_main():
        if hasattr(model, "checkpoint_parts"):  # ELECTRA's pair (generator in generator/); distillation's student
            model.save_pretrained(out, tokenizer=tokenizer)
        else:
            save_pretrained(model, out, tokenizer=tokenizer)
        from ..viz import plot_curves

        plot_curves(out / "metrics.jsonl", out / "curves.png", title="pretraining")
        result = {"out": str(out), "steps": summary["step"], "stopped_by": summary["stop"],
                  "seconds": round(summary["elapsed"], 1), "eval": summary["eval"]}
        if summary.get("kernel_compile_seconds") is not None:  # a first run on this machine: not in `seconds`
            result["kernel_compile_seconds"] = round(summary["kernel_compile_seconds"], 1)
        if summary["stop"] == "schedule" and cfg.time_budget and summary["elapsed"] < 0.9 * cfg.time_budget:
            # A time budget fixes the schedule's length once, early on, from the speed of the steps since step 10
            # (over 5% of the budget); if the machine was busier then than later, the learning rate reaches zero
            # before the budget is spent.
            result["note"] = (f"the learning-rate schedule ended at step {summary['step']} after "
                              f"{summary['elapsed']:.0f} s of the {cfg.time_budget:.0f} s budget: its length was "
                              "fixed early on from the speed then, and later steps ran faster (the machine was "
                              "busier at the start). --max-steps N fixes the length yourself")
        write_text(out / "pretrain_results.json", dumps({**result, "config": asdict(cfg)}, indent=2) + "\n")
        report(result, as_json, title=f"pretraining done: the model is in {out}/")
        if cfg.demo:
            _fill_mask_demo(model, tokenizer)
    dist.cleanup()
    return summary


def _fill_mask_demo(model, tokenizer: Tokenizer) -> None:
    from ..inference.pipelines import fill_mask

    model = model.cpu().eval()
    print("fill-mask with the model just trained:")
    sentences = [text.replace("[MASK]", tokenizer.specials["mask_token"]) for text in DEMO_SENTENCES]
    for text, per_mask in zip(sentences, fill_mask(model, tokenizer, sentences, top_k=5)):
        guesses = ", ".join(f"{p['token_str']} ({p['score']:.2f})" for p in per_mask[0])
        print(f"  {text}\n    -> {guesses}")
