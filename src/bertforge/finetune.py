"""`bertforge finetune` and `bertforge evaluate`: classification, regression and NER on the one loop.

Each run reads the data, builds label maps from the training file, loads the model with a
matching head (or a new head on a pretrained backbone), trains with evaluation every
epoch, keeps the best model by the task's main metric (early stopping with `--patience`),
and exports it in the Hugging Face layout with `id2label` / `label2id`. `--seeds 1,2,3`
repeats the run per seed and reports mean ± std.
"""

from __future__ import annotations

import json
import shutil
import statistics
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

import torch

from .config import BertConfig
from .data.classification import (Columns, check_labels, label_set, read_examples, regression_targets,
                                  truncate_ids)
from .data.ner import align_labels, read_sentences
from .errors import BertforgeError, InputError
from .heads import (TASK_ARCHITECTURES, BertForQuestionAnswering, BertForSequenceClassification,
                    BertForTokenClassification)
from .hf import load_for_task
from .tasks import ClassificationTask, QuestionAnsweringTask, TokenClassificationTask
from .tokenizer import Tokenizer
from .runconfig import TASKS, FinetuneConfig, TrainConfig  # noqa: F401  (TASKS re-exported)
from .train import Trainer

def _load_tokenizer(cfg: FinetuneConfig) -> Tokenizer:
    if Path(cfg.model).is_dir() and not cfg.tokenizer:
        return Tokenizer.from_pretrained(cfg.model)
    if not cfg.tokenizer:
        raise BertforgeError(f"--model {cfg.model} is a preset: give --tokenizer DIR with its vocabulary")
    return Tokenizer.from_pretrained(cfg.tokenizer)


def _model(cfg: FinetuneConfig, cls: type, labels: list[str] | None, tokenizer: Tokenizer):
    """The model with a head for `labels`; a checkpoint's own label set must match the data's."""
    id2label = {i: name for i, name in enumerate(labels)} if labels else None
    num_labels = len(labels) if labels else (2 if cfg.task == "qa" else 1)
    problem = "regression" if cfg.task == "regress" else None
    if Path(cfg.model).is_dir():
        existing = BertConfig.from_json(Path(cfg.model) / "config.json")
        named = existing.id2label and not all(v.startswith("LABEL_") for v in existing.id2label.values())
        archs = json.loads((Path(cfg.model) / "config.json").read_text(encoding="utf-8")).get("architectures") or []
        if named and cls.hf_architecture in archs and labels:
            if set(existing.id2label.values()) != set(labels):
                raise InputError(f"{cfg.model}: the model's labels ({', '.join(existing.id2label.values())}) differ "
                                 f"from the data's ({', '.join(labels)}); start from a backbone checkpoint instead")
            id2label = existing.id2label  # keep the checkpoint's label order
        return cls.from_pretrained(cfg.model, num_labels=num_labels, id2label=id2label,
                                   label2id={v: k for k, v in id2label.items()} if id2label else None,
                                   problem_type=problem)
    config = BertConfig.from_preset(cfg.model, vocab_size=tokenizer.vocab_size, num_labels=num_labels,
                                    id2label=id2label, problem_type=problem)
    return cls(config)


def classification_features(examples, tokenizer: Tokenizer, seq_len: int, truncation: str,
                            targets: list) -> list[dict]:
    """[CLS] text [SEP] (pair [SEP]) features; pairs are trimmed longest-first, single texts by `truncation`."""
    if examples[0].pair is not None:
        enc = tokenizer([e.text for e in examples], [e.pair or "" for e in examples], truncation=True,
                        max_length=seq_len)
        return [{"input_ids": ids, "token_type_ids": types, "labels": y}
                for ids, types, y in zip(enc["input_ids"], enc["token_type_ids"], targets)]
    enc = tokenizer([e.text for e in examples], add_special_tokens=False)
    cls, sep = tokenizer.cls_token_id, tokenizer.sep_token_id
    features = []
    for ids, y in zip(enc["input_ids"], targets):
        ids = [cls, *truncate_ids(ids, seq_len - 2, truncation), sep]
        features.append({"input_ids": ids, "token_type_ids": [0] * len(ids), "labels": y})
    return features


def ner_features(sentences, tokenizer: Tokenizer, seq_len: int, label2id: dict[str, int]) -> list[dict]:
    enc = tokenizer([s.tokens for s in sentences], is_split_into_words=True, truncation=True, max_length=seq_len,
                    return_word_ids=True)
    features = []
    for s, ids, types, word_ids in zip(sentences, enc["input_ids"], enc["token_type_ids"], enc["word_ids"]):
        features.append({"input_ids": ids, "token_type_ids": types, "tags": s.tags, "num_words": len(s.tokens),
                         "labels": align_labels(word_ids, [label2id[t] for t in s.tags])})
    return features


def build(cfg: FinetuneConfig, tokenizer: Tokenizer, train_path: str, dev_path: str, model=None):
    """(model, task) for a config; `model` given means evaluate with it (labels from its config)."""
    pack_to = cfg.seq_len if cfg.pack else None
    if cfg.task == "qa":
        from .data.qa import qa_features, read_squad

        if cfg.pack:
            raise BertforgeError("--pack is not supported for qa: its windows already fill --seq-len")

        train = read_squad(train_path)[0] if train_path else []
        dev, raw = read_squad(dev_path)
        if model is None:
            model = _model(cfg, BertForQuestionAnswering, None, tokenizer)
        train_features = qa_features(train, tokenizer, cfg.seq_len, cfg.doc_stride, training=True) if train else []
        task = QuestionAnsweringTask(train_features, qa_features(dev, tokenizer, cfg.seq_len, cfg.doc_stride),
                                     cfg.batch_size, cfg.seed, tokenizer.pad_token_id, examples=dev, raw=raw["data"],
                                     n_best=cfg.n_best, max_answer_len=cfg.max_answer_len,
                                     null_threshold=cfg.null_threshold, tune_null_threshold=cfg.tune_null_threshold)
        return model, task
    if cfg.task == "ner":
        train = read_sentences(train_path) if train_path else None
        dev = read_sentences(dev_path)
        if model is not None:
            labels = [model.config.id2label[i] for i in range(model.config.num_labels)]
        else:
            # Every entity type seen in training gets both B- and I-, so a dev file may use either.
            types = sorted({t[2:] for s in train for t in s.tags if t != "O"})
            labels = ["O"] + [f"{p}-{kind}" for kind in types for p in ("B", "I")]
            model = _model(cfg, BertForTokenClassification, labels, tokenizer)
            labels = [model.config.id2label[i] for i in range(model.config.num_labels)]
        label2id = {name: i for i, name in enumerate(labels)}
        for path, sentences in ((train_path, train or []), (dev_path, dev)):
            for s in sentences:
                unknown = [t for t in s.tags if t not in label2id]
                if unknown:
                    raise InputError(f"{path}:{s.line}: tag '{unknown[0]}' has an entity type not seen in training")
        make = lambda sentences: ner_features(sentences, tokenizer, cfg.seq_len, label2id)  # noqa: E731
        task = TokenClassificationTask(make(train) if train else [], make(dev), cfg.batch_size, cfg.seed,
                                       tokenizer.pad_token_id, pack_to, id2label=dict(enumerate(labels)))
        return model, task

    columns = Columns(cfg.text_column, cfg.pair_column, cfg.label_column)
    train = read_examples(train_path, columns) if train_path else None
    dev = read_examples(dev_path, columns)
    if cfg.task == "regress":
        if model is None:
            model = _model(cfg, BertForSequenceClassification, None, tokenizer)
        targets = lambda ex, path: regression_targets(ex, path)  # noqa: E731
        id2label = None
    else:
        if model is None:
            model = _model(cfg, BertForSequenceClassification, label_set(train), tokenizer)
        id2label = model.config.id2label
        label2id = {v: k for k, v in id2label.items()}
        for path, examples in ((train_path, train or []), (dev_path, dev)):
            check_labels(examples, label2id, path)
        targets = lambda ex, path: [label2id[str(e.label)] for e in ex]  # noqa: E731
    make = lambda ex, path: classification_features(ex, tokenizer, cfg.seq_len, cfg.truncation,  # noqa: E731
                                                    targets(ex, path))
    task = ClassificationTask(make(train, train_path) if train else [], make(dev, dev_path), cfg.batch_size, cfg.seed,
                              tokenizer.pad_token_id, pack_to, id2label=id2label, regression=cfg.task == "regress")
    return model, task


def _run_one(cfg: FinetuneConfig, out: Path) -> dict[str, Any]:
    if out.exists() and any(out.iterdir()) and not cfg.overwrite:
        raise BertforgeError(f"{out}: directory exists and is not empty; pass --overwrite or choose another --out")
    if cfg.overwrite:
        for name in ("checkpoints", "best", "metrics.jsonl", "curves.png"):
            target = out / name
            if target.is_dir():
                shutil.rmtree(target)
            elif target.exists():
                target.unlink()
    torch.manual_seed(cfg.seed)
    tokenizer = _load_tokenizer(cfg)
    model, task = build(cfg, tokenizer, cfg.train, cfg.dev)
    train_cfg = TrainConfig(**{f.name: getattr(cfg, f.name) for f in fields(TrainConfig)})
    train_cfg.out, train_cfg.eval_each_epoch = str(out), True
    train_cfg.select_metric, train_cfg.greater_is_better = task.main_metric, task.greater_is_better
    run_info = {"task": cfg.task, "model": cfg.model, "train": cfg.train, "seq_len": cfg.seq_len, "lr": cfg.lr,
                "batch_size": cfg.batch_size, "seed": cfg.seed}
    summary = Trainer(model, task, train_cfg, run_info).fit()
    best = out / "best"
    if best.is_dir():  # export the selected model, not the last one
        from .hf import from_hf_state_dict, read_weights

        from_hf_state_dict(model, read_weights(best / "model.safetensors"), source=str(best))
        shutil.rmtree(best)
    model.save_pretrained(out, tokenizer=tokenizer)
    # The loop's last checkpoint (model + optimizer state) served the run; the export above is the result.
    shutil.rmtree(out / "checkpoints", ignore_errors=True)
    from .viz import plot_curves

    plot_curves(out / "metrics.jsonl", out / "curves.png", title=f"fine-tuning ({cfg.task})")
    results = {"task": cfg.task, "metric": task.main_metric, "selected_step": summary["best_step"],
               **(summary["best_metrics"] or summary["eval"]), "seconds": round(summary["elapsed"], 1)}
    (out / "eval_results.json").write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    return results


def run_finetune(cfg: FinetuneConfig) -> dict[str, Any]:
    """One run, or one per seed with mean and std; results also in OUT/eval_results.json."""
    out = Path(cfg.out)
    if not cfg.seeds:
        result = _run_one(cfg, out)
        print(json.dumps(result), flush=True)
        return result
    seeds = [int(s) for s in cfg.seeds.split(",") if s.strip()]
    runs = []
    for seed in seeds:
        one = FinetuneConfig(**{**asdict(cfg), "seed": seed, "seeds": None})
        runs.append(_run_one(one, out / f"seed-{seed}"))
        print(json.dumps({"seed": seed, **runs[-1]}), flush=True)
    keys = [k for k, v in runs[0].items() if isinstance(v, float)]
    summary = {"task": cfg.task, "seeds": seeds,
               **{k: {"mean": statistics.mean(r[k] for r in runs),
                      "std": statistics.stdev(r[k] for r in runs) if len(runs) > 1 else 0.0} for k in keys}}
    (out / "eval_results.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(summary), flush=True)
    return summary


def run_evaluate(task: str, model_dir: str, data: str, seq_len: int | None = None, batch_size: int = 32,
                 columns: Columns | None = None, predictions: str | None = None) -> dict[str, Any]:
    """Metrics of a fine-tuned checkpoint on a labelled file (and its predictions, one JSON per line)."""
    model = load_for_task(task, model_dir, TASK_ARCHITECTURES[task])
    tokenizer = Tokenizer.from_pretrained(model_dir)
    columns = columns or Columns()
    seq_len = 384 if task == "qa" and seq_len is None else (seq_len or 512)
    cfg = FinetuneConfig(task=task, model=model_dir, train="-", dev=data, seq_len=min(seq_len, model.config.max_position_embeddings),
                         batch_size=batch_size, text_column=columns.text, pair_column=columns.pair,
                         label_column=columns.label, progress=False)
    if task == "classify" and model.config.num_labels == 1:
        raise InputError(f"{model_dir}: a regression model (num_labels = 1); use `evaluate regress`")
    model, scorer = build(cfg, tokenizer, "", data, model=model)
    model.eval()
    metrics = scorer.evaluate(model)
    if predictions and task == "qa":  # the official format: question id -> answer text
        Path(predictions).write_text(json.dumps(scorer.answers(model)[0]) + "\n", encoding="utf-8")
    elif predictions:
        if task == "ner":
            rows = [{"tags": t} for t in scorer.word_tags(model, scorer.dev)]
        else:
            values = scorer.predictions(model, scorer.dev)
            rows = [{"value": v} if task == "regress" else {"label": model.config.id2label[v]} for v in values]
        Path(predictions).write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return metrics
