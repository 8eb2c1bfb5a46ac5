"""The README.md model card of a trained embedder or reranker: what it was trained on, how, and how it scored.

sentence-transformers writes such a card beside every model it saves, and the Hugging Face Hub shows it;
this one carries the facts a reader needs to reuse or reproduce the model, from the run's own settings
and results (nothing in it is typed by hand).

A card says it is bertforge's (`MARKER`, after the front matter the Hub reads), so that a later run with
`--overwrite` replaces its own card and never a README.md the user wrote (`is_bertforge_card`).
"""

from __future__ import annotations

from dataclasses import dataclass
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

@dataclass(frozen=True)
class Card:
    """What a kind of retrieval model's card says of its kind: the library that loads it, the Hub's tags, the title
    and the one-line description, how to use it (`{path}`, and `{query_prompt}` / `{document_prompt}` for the
    prompt arguments) and how bertforge serves or scores it. Each retrieval task class declares its own (`card`)."""

    library: str
    tags: str
    pipeline: str
    title: str
    what: str
    usage: str
    serving: str


def _evaluation(cfg: Any, results: dict[str, Any], metrics: dict[str, float]) -> list[str]:
    """The card's lines on the --dev evaluation of the selected step."""
    return [f"On `{cfg.dev}`" + (f" (its `{cfg.dev_split}` qrels)" if Path(cfg.dev).is_dir() else "")
            + f", the selected step ({results.get('selected_step')}) scored, as trec_eval computes the measures:", "",
            "| measure | value |", "|---|---:|", *[f"| {k} | {v:.4f} |" for k, v in metrics.items()], ""]


def write_model_card(out: Path, cfg: Any, task: Any, results: dict[str, Any]) -> None:
    """OUT/README.md for `finetune embed` or `finetune rerank` (`cfg` the run's config, `task` its task)."""
    card = task.card
    data = task.data
    settings = {"loss": task.loss_name, "batch size": cfg.batch_size, "learning rate": cfg.lr,
                "epochs": cfg.epochs, "max steps": cfg.max_steps, "warmup": cfg.warmup,
                "weight decay": cfg.weight_decay, "max sequence length": task.seq_len, "seed": cfg.seed,
                "precision": cfg.precision, **task.card_settings(cfg)}
    metrics = {k: v for k, v in results.items() if isinstance(v, float) and k != "seconds"}
    prompts = task.card_prompts()
    lines = [
        "---", f"library_name: {card.library}", f"pipeline_tag: {card.pipeline}", f"tags: [{card.tags}, bertforge]",
        f"base_model: {cfg.model}", "---", MARKER, "",
        f"# {card.title} trained with bertforge", "",
        f"Fine-tuned from `{cfg.model}` with `bertforge finetune {cfg.task}` ({card.what}).", "",
        "## Training data", "",
        f"- `{data.source}`: {len(data.rows):,} rows of {data.shape} (columns: {', '.join(data.columns)})", "",
        "## Training settings", "",
        *[f"- {name}: {value}" for name, value in settings.items() if value is not None], "",
        "## Evaluation", "",
        *(_evaluation(cfg, results, metrics) if cfg.dev else
          ["Trained without an evaluation set (no `--dev`): this is the final step's model, not a selected one.", ""]),
        "## Usage", "",
        card.usage.format(path=out.name, query_prompt=', prompt_name="query"' if "query" in prompts else "",
                          document_prompt=', prompt_name="document"' if "document" in prompts else ""), "",
        card.serving.format(path=out.name),
        "", "## The run's settings", "", "```json", dumps({k: v for k, v in vars(cfg).items()
                                                          if not k.startswith("_")}, indent=2), "```", "",
    ]
    write_text(out / "README.md", "\n".join(lines))
