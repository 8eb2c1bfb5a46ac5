"""The README.md model card of a trained embedder or reranker: what it was trained on, how, and how it scored.

sentence-transformers writes such a card beside every model it saves, and the Hugging Face Hub shows it;
this one carries the facts a reader needs to reuse or reproduce the model, from the run's own settings
and results (nothing in it is typed by hand).

A card says it is bertforge's (`MARKER`, after the front matter the Hub reads), so that a later run with
`--overwrite` replaces its own card and never a README.md the user wrote (`is_bertforge_card`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..jsonfile import dumps
from ..safefiles import write_text

MARKER = "<!-- This model card was written by bertforge; a run with --overwrite replaces it. -->"


def is_bertforge_card(path: Path) -> bool:
    """Whether `path` (an existing README.md) is a card bertforge wrote: its marker, or the shape of the cards
    written before the marker was (a front matter tagged bertforge and the "trained with bertforge" title)."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return False
    if MARKER in text:
        return True
    head = text.split("\n---", 1)[0]
    return text.startswith("---") and "bertforge]" in head and " trained with bertforge\n" in text

_USAGE = {
    "embed": '''```python
from sentence_transformers import SentenceTransformer

model = SentenceTransformer("{path}")
queries = model.encode(["how do tides work?"]{query_prompt})
documents = model.encode(["Tides are caused by the moon's gravity."]{document_prompt})
print(model.similarity(queries, documents))
```''',
    "sparse": '''```python
from sentence_transformers import SparseEncoder

model = SparseEncoder("{path}")
queries = model.encode_query(["how do tides work?"])
documents = model.encode_document(["Tides are caused by the moon's gravity."])
print(model.similarity(queries, documents))
```''',
    "colbert": '''```python
from pylate import models

model = models.ColBERT("{path}")
queries = model.encode(["how do tides work?"], is_query=True)
documents = model.encode(["Tides are caused by the moon's gravity."], is_query=False)
```''',
    "rerank": '''```python
from sentence_transformers import CrossEncoder

model = CrossEncoder("{path}")
print(model.predict([("how do tides work?", "Tides are caused by the moon's gravity.")]))
```''',
}


# kind -> (Hub tags, pipeline tag, (title, what it is))
_KINDS = {
    "embed": ("sentence-transformers, sentence-similarity, feature-extraction", "sentence-similarity",
              ("An embedder", "a bi-encoder: one vector per text")),
    "sparse": ("sentence-transformers, sparse-encoder, splade, feature-extraction", "feature-extraction",
               ("A SPLADE sparse encoder", "one weight per vocabulary word, searched with an inverted index")),
    "colbert": ("PyLate, ColBERT, sentence-transformers, feature-extraction", "sentence-similarity",
                ("A ColBERT model", "late interaction: one vector per token, scored by MaxSim")),
    "rerank": ("sentence-transformers, cross-encoder, text-ranking", "text-ranking",
               ("A reranker", "a cross-encoder: one relevance score per (query, passage) pair")),
}


_SERVING = {
    "embed": "bertforge serves it as well: `bertforge serve --model {path}` (OpenAI `/v1/embeddings`, TEI `/embed` "
             "with `prompt_name`).",
    "rerank": "bertforge serves it as well: `bertforge serve --model {path}` (TEI `/rerank`).",
    "sparse": "`bertforge evaluate retrieval --model {path}` scores it through an exact inverted index.",
    "colbert": "`bertforge evaluate retrieval --model {path}` scores it by exact MaxSim; `bertforge predict embed "
               "--multi-vector` gives its token vectors.",
}


def _evaluation(cfg: Any, results: dict[str, Any], metrics: dict[str, float]) -> list[str]:
    """The card's lines on the --dev evaluation of the selected step."""
    return [f"On `{cfg.dev}`" + (f" (its `{cfg.dev_split}` qrels)" if Path(cfg.dev).is_dir() else "")
            + f", the selected step ({results.get('selected_step')}) scored, as trec_eval computes the measures:", "",
            "| measure | value |", "|---|---:|", *[f"| {k} | {v:.4f} |" for k, v in metrics.items()], ""]


def write_model_card(out: Path, cfg: Any, task: Any, results: dict[str, Any]) -> None:
    """OUT/README.md for `finetune embed` or `finetune rerank` (`cfg` the run's config, `task` its task)."""
    kind = cfg.task
    data = task.data
    settings = {"loss": task.loss_name, "batch size": cfg.batch_size, "learning rate": cfg.lr,
                "epochs": cfg.epochs, "max steps": cfg.max_steps, "warmup": cfg.warmup,
                "weight decay": cfg.weight_decay, "max sequence length": task.seq_len, "seed": cfg.seed,
                "precision": cfg.precision}
    if kind == "sparse":
        settings.update({"similarity": "dot (sparse vectors over the vocabulary)",
                         "SPLADE head": task.head,
                         "query FLOPS weight": cfg.query_regularizer_weight,
                         "document FLOPS weight": cfg.document_regularizer_weight,
                         "regulariser warm-up": "quadratic over the first third of the steps",
                         "max active dims": cfg.max_active_dims, "GradCache mini-batch": task.mini_batch_size,
                         "query prompt": task.prompts.query or None, "document prompt": task.prompts.document or None})
    elif kind == "colbert":
        spec = task.spec
        settings.update({"similarity": "MaxSim", "vector size": cfg.dim, "query prefix": repr(spec.query_prefix),
                         "document prefix": repr(spec.document_prefix), "query length": spec.query_length,
                         "document length": spec.document_length, "query expansion": spec.do_query_expansion,
                         "attend to expansion tokens": spec.attend_to_expansion_tokens,
                         "temperature": cfg.temperature if task.loss_name == "Contrastive" else None,
                         "GradCache mini-batch": task.mini_batch_size})
    elif kind == "embed":
        learned = getattr(task, "learned_scale", None)
        scale = (f"learned (--learn-scale, rate {cfg.scale_lr:g}): {task.scale:g} at the start, {learned:.4g} at the "
                 "end" if learned is not None else task.scale)
        settings.update({"similarity": task.similarity, "scale": scale,
                         "GradCache mini-batch": task.mini_batch_size, "Matryoshka dimensions": list(task.dims) or None,
                         "query prompt": task.prompts.query or None, "document prompt": task.prompts.document or None})
    else:
        settings.update({"in-batch negatives per query": cfg.num_negatives if task.loss_name ==
                         "MultipleNegativesRankingLoss" else None, "positive weight": cfg.pos_weight,
                         "candidates reranked": cfg.rerank_top_k})
    metrics = {k: v for k, v in results.items() if isinstance(v, float) and k != "seconds"}
    tags, pipeline, what = _KINDS[kind]
    prompts = task.prompts.named() if kind not in ("rerank", "colbert") else {}
    lines = [
        "---", f"library_name: {'PyLate' if kind == 'colbert' else 'sentence-transformers'}", f"pipeline_tag: {pipeline}", f"tags: [{tags}, bertforge]",
        f"base_model: {cfg.model}", "---", MARKER, "",
        f"# {what[0]} trained with bertforge", "",
        f"Fine-tuned from `{cfg.model}` with `bertforge finetune {kind}` ({what[1]}).", "",
        "## Training data", "",
        f"- `{data.source}`: {len(data.rows):,} rows of {data.shape} (columns: {', '.join(data.columns)})", "",
        "## Training settings", "",
        *[f"- {name}: {value}" for name, value in settings.items() if value is not None], "",
        "## Evaluation", "",
        *(_evaluation(cfg, results, metrics) if cfg.dev else
          ["Trained without an evaluation set (no `--dev`): this is the final step's model, not a selected one.", ""]),
        "## Usage", "",
        _USAGE[kind].format(path=out.name, query_prompt=', prompt_name="query"' if "query" in prompts else "",
                            document_prompt=', prompt_name="document"' if "document" in prompts else ""), "",
        _SERVING[kind].format(path=out.name),
        "", "## The run's settings", "", "```json", dumps({k: v for k, v in vars(cfg).items()
                                                          if not k.startswith("_")}, indent=2), "```", "",
    ]
    write_text(out / "README.md", "\n".join(lines))
