"""The `bertforge` command and its groups (typer apps), and the two helpers every command uses."""

from __future__ import annotations

from typing import Any

import typer

from ...errors import BertforgeError

app = typer.Typer(name="bertforge", add_completion=False, no_args_is_help=True, rich_markup_mode=None,
                  pretty_exceptions_enable=False, context_settings={"help_option_names": ["-h", "--help"]},
                  help="A readable BERT that pretrains, fine-tunes and serves, with Hugging Face checkpoint parity.")
tokenizer_app = typer.Typer(no_args_is_help=True, rich_markup_mode=None, help="Tokenizer tools.")
export_app = typer.Typer(no_args_is_help=True, rich_markup_mode=None, help="Export formats.")
score_app = typer.Typer(no_args_is_help=True, rich_markup_mode=None, help="Score predictions you already have.")
distill_app = typer.Typer(no_args_is_help=True, rich_markup_mode=None,
                          help="Distil a model into a smaller student: a fine-tuned classifier or regressor, or a "
                               "masked-LM model on raw text.")
app.add_typer(tokenizer_app, name="tokenizer", help="train a WordPiece vocabulary")
app.add_typer(export_app, name="export", help="export a model to ONNX (checked against ONNX Runtime)")
app.add_typer(score_app, name="score", help="score prediction files with the official metrics")
kernels_app = typer.Typer(rich_markup_mode=None, invoke_without_command=True,
                          help="The native CPU kernels: what the cache holds (the default), or build them now.")
app.add_typer(kernels_app, name="kernels", help="the native CPU kernels: their cache's state, or build them now")
finetune_app = typer.Typer(no_args_is_help=True, rich_markup_mode=None,
                           help="Fine-tune a checkpoint for a task: classify, regress, ner, qa, or embed and rerank (retrieval).")
app.add_typer(finetune_app, name="finetune", help="fine-tune a checkpoint (classify, regress, ner, qa, embed, rerank, sparse, colbert)")
evaluate_app = typer.Typer(no_args_is_help=True, rich_markup_mode=None,
                           help="Score a model: classify, regress, ner, qa on labelled files; retrieval and rerank on a "
                                "BEIR folder.")
app.add_typer(evaluate_app, name="evaluate", help="score a model on labelled data (classify, regress, ner, qa, "
                                                  "retrieval, rerank)")
app.add_typer(distill_app, name="distill", help="distil a model into a smaller student (classify, regress, ner, qa, mlm)")


def at_least_one(**counts: int) -> None:
    """Refuse a count flag below 1 (--batch-size 0, --top-k 0) before any work, naming the flag."""
    for name, value in counts.items():
        if value < 1:
            raise BertforgeError(f"--{name.replace('_', '-')} {value}: must be at least 1")


def show(result: dict[str, Any], json: bool, title: str) -> None:
    from ...training.runs import report

    report(result, json, title)

