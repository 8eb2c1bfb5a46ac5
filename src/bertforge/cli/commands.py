"""The subcommands of `bertforge`: each a plain function whose signature and docstring are its
flags and help (see `build.command`). They parse nothing themselves: they call the library and
print its result. Heavy imports (torch) happen inside, so `--help` stays fast.

Flags mean the same everywhere: `--out` is where a command writes, `--overwrite` lets it replace
what is there (without it nothing is replaced), `--json` prints one JSON object for machines
instead of a readable summary, `--seed`, `--seq-len` and `--batch-size` are what they say.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Literal

import typer

from ..constants import INFERENCE_BACKENDS
from ..errors import BertforgeError
from ..heartbeat import phase
from ..inference.predict import TASKS as PREDICT_TASKS
from ..jsonfile import dumps
from ..safefiles import check_output_file
from ..settings import DistillConfig, DistillMLMConfig, PretrainConfig
from ..tasks import TASKS
from .build import command, settings_from

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
    from ..training.runs import report

    report(result, json, title)


@command(app, "inspect")
def inspect(path: str, json: bool = False) -> int:
    """Print a checkpoint's config, parameter counts and heads, and check every weight is finite.

    Reads a Hugging Face style checkpoint directory (config.json plus model.safetensors or
    pytorch_model.bin) and reports what it holds. Exits 1 when a weight is NaN or infinite (each such
    tensor is named) or a weight the config needs is missing.

    Args:
        path: checkpoint directory
        json: print one JSON object instead of a table
    """
    from ..interop.inspect import format_report, inspect_checkpoint

    info = inspect_checkpoint(path)
    print(dumps(info) if json else format_report(info))
    return 1 if info["non_finite"] or info["missing_keys"] else 0


@command(tokenizer_app, "train")
def tokenizer_train(files: list[str], *, out: str, kind: Literal["wordpiece", "bpe", "unigram"] | None = None,
                    arch: str | None = None, vocab_size: int = 30522, min_frequency: int | None = None,
                    cased: bool = False, overwrite: bool = False, json: bool = False) -> None:
    """Train a vocabulary on text files: WordPiece, byte-level BPE or SentencePiece Unigram.

    WordPiece writes [PAD]=0, [UNK], [CLS], [SEP], [MASK] as vocab.txt, tokenizer.json and
    tokenizer_config.json; BPE writes <s>=0, <pad>, </s>, <unk>, <mask> as tokenizer.json,
    tokenizer_config.json, vocab.json and merges.txt (RoBERTa's); Unigram, trained by SentencePiece,
    writes tokenizer.json and tokenizer_config.json with XLM-R's specials (<s>=0, <pad>, </s>, <unk>,
    <mask>) or, with --arch albert, ALBERT's (<pad>=0, <unk>, [CLS], [SEP], [MASK]). The same files give
    the same vocabulary, byte for byte.

    Args:
        files: UTF-8 text files (.gz allowed)
        out: output directory
        kind: wordpiece (BERT, DistilBERT, ELECTRA), bpe (RoBERTa) or unigram (XLM-RoBERTa, ALBERT, DeBERTa);
            default: --arch's
        arch: the architecture the vocabulary is for (bert, distilbert, electra, roberta, xlm-roberta, albert,
            deberta-v2): its
            kind and the transformers tokenizer class it is saved as (default bert)
        vocab_size: vocabulary size (30522 is bert-base's, 50265 roberta-base's, 30000 albert's)
        min_frequency: ignore pieces seen fewer times (WordPiece and BPE; default 2)
        cased: keep case and accents (WordPiece; BPE and XLM-R's Unigram always keep them)
        overwrite: replace a vocabulary already in --out
        json: print one JSON object instead of a summary
    """
    from ..models.registry import family
    from ..tokenization.kinds import train_tokenizer

    row = family(arch or {"bpe": "roberta", "unigram": "xlm-roberta"}.get(kind or "", "bert"), source="--arch")
    if kind is not None and kind != row.tokenizer:
        raise BertforgeError(f"--kind {kind}: --arch {row.model_type} reads a {row.tokenizer} vocabulary")
    kind = row.tokenizer
    target = Path(out)
    if not files:
        raise BertforgeError("tokenizer train needs at least one text file")
    if any((target / name).exists() for name in ("vocab.txt", "tokenizer.json")) and not overwrite:
        raise BertforgeError(f"{target}: already holds a tokenizer; pass --overwrite to replace it")
    for f in files:
        if not Path(f).is_file():
            raise BertforgeError(f"{f}: no such file")
    if kind != "wordpiece" and cased:
        raise BertforgeError(f"--cased is a WordPiece setting; a {kind} vocabulary always keeps case and accents"
                             + (" (ALBERT's lower-cases and strips accents as it reads, by do_lower_case and "
                                "keep_accents in tokenizer_config.json)" if row.model_type == "albert" else ""))
    if kind == "unigram" and min_frequency is not None:
        raise BertforgeError("--min-frequency is a WordPiece and BPE setting; SentencePiece's Unigram trainer "
                             "has no frequency cut")
    from ..lockfile import lock_directory

    lock_directory(target)  # one writer: a second `tokenizer train` into the same --out is refused by name
    with phase("training the vocabulary"):
        tok = train_tokenizer(kind, row.tokenizer_class, files=files, vocab_size=vocab_size,
                              min_frequency=2 if min_frequency is None else min_frequency, lowercase=not cased,
                              show_progress=sys.stderr.isatty())
    tok.save(target)
    lowercase = kind == "wordpiece" and not cased
    result = {"out": str(target), "kind": kind, "arch": row.model_type, "tokenizer_class": row.tokenizer_class,
              "vocab_size": len(tok), "lowercase": lowercase}
    if len(tok) < vocab_size:
        # --vocab-size is a ceiling: a trainer stops when no piece is left that passes its cuts.
        cut = (f"every piece seen at least {2 if min_frequency is None else min_frequency} times"
               if kind != "unigram" else "every piece SentencePiece keeps")
        result["note"] = (f"{len(tok):,} pieces, not {vocab_size:,}: the text yields no more ({cut} is in); "
                          "--vocab-size is an upper bound. Train on more text"
                          + (" or lower --min-frequency" if kind != "unigram" else ""))
    show(result, json, "vocabulary written")


@command(app, "prepare")
def prepare(corpus: list[str], *, out: str, tokenizer: str, workers: int | None = None,
            shard_tokens: int = 100_000_000, doc_per_file: bool = False, text_field: str = "text",
            encoding_errors: Literal["strict", "replace"] = "strict", json: bool = False) -> None:
    """Tokenise a corpus once into shards on disk.

    Reads a corpus (text, JSONL, .gz, directories, globs, HF datasets), splits it into sentences,
    tokenises it in parallel processes and writes memory-mapped shards that `bertforge pretrain`
    reads with O(1) random access.

    Args:
        corpus: files, directories, globs, a save_to_disk dir, or hf:NAME[:CONFIG]
        out: output directory (must not exist)
        tokenizer: directory with vocab.txt or tokenizer.json (e.g. a checkpoint)
        workers: tokenising processes (default: all cores)
        shard_tokens: tokens per shard
        doc_per_file: a whole file is one document (default: blank lines separate documents)
        text_field: JSONL / datasets field that holds the text
        encoding_errors: on invalid UTF-8, stop (strict) or substitute U+FFFD (replace)
        json: print one JSON object instead of a summary
    """
    from ..data.corpus import CorpusOptions
    from ..data.shards import check_workers
    from ..data.shards import prepare as prepare_shards
    from ..lockfile import lock_beside
    from ..tokenization.kinds import load_tokenizer

    if not corpus:
        raise BertforgeError("prepare needs a corpus: files, directories, globs or hf:NAME")
    check_workers(workers)  # before the lock: a refused run leaves nothing behind
    # The output appears by a rename of OUT.partial, so the lock sits beside it: a second prepare of the same
    # --out would otherwise delete the first one's partial output.
    tok = load_tokenizer(tokenizer)
    lock_beside(Path(out))
    options = CorpusOptions(doc_per_file=doc_per_file, text_field=text_field, encoding_errors=encoding_errors)
    with phase("preparing the data"):
        meta = prepare_shards(corpus, out, tok, options, workers=workers,
                              shard_tokens=shard_tokens, progress=sys.stderr.isatty())
    show({k: meta[k] for k in ("documents", "sentences", "tokens", "seconds")} | {"out": out}, json,
         "corpus prepared")


@command(app, "pretrain", settings=PretrainConfig, settings_skip=frozenset({"corpus"}))
def pretrain(corpus: list[str], *, config: str | None = None, json: bool = False, ctx: typer.Context | None = None,
             **settings: Any) -> None:
    """Pretrain BERT (MLM + NSP) on raw text; no corpus = the embedded default.

    Masked-LM and next-sentence prediction as google-research/bert does it, or MLM only on packed
    full sentences (--objective mlm). With no CORPUS it pretrains a tiny model for three minutes
    on the docstrings of Python's standard library. A run writes OUT/run_config.json, which
    --config reads back.

    Args:
        corpus: files, dirs, globs, hf:NAME, or a `bertforge prepare` directory (none: the embedded corpus)
        config: a JSON or YAML file of these settings (flags given here override it)
        json: print the final summary as one JSON object
    """
    from ..training.pretrain import run_pretrain

    cfg = settings_from(PretrainConfig, {**settings, "corpus": list(corpus or [])}, config, ctx)
    run_pretrain(cfg, as_json=json)


_FINETUNE_ARGS = """

    Args:
        config: a JSON or YAML file of these settings (flags given here override it)
        json: print the final summary as one JSON object
    """
_FINETUNE_COMMON = """

    Each run evaluates every epoch (or every --eval-every steps), keeps the best model, and writes
    a Hugging Face model directory and OUT/run_config.json, which --config reads back."""


def _finetune_command(task: str) -> None:
    """`bertforge finetune TASK`: one subcommand per task, each its config class's flags with its task set."""
    settings_class = TASKS[task].settings

    def finetune(*, config: str | None = None, json: bool = False, ctx: typer.Context | None = None,
                 **settings: Any) -> None:
        from ..training.finetune import run_finetune

        run_finetune(settings_from(settings_class, settings, config, ctx, task=task), as_json=json)

    finetune.__name__ = finetune.__qualname__ = f"finetune_{task}"
    finetune.__doc__ = TASKS[task].summary + _FINETUNE_COMMON + _FINETUNE_ARGS
    command(finetune_app, task, settings=settings_class)(finetune)


for _task in TASKS:
    _finetune_command(_task)


_DISTILL_ARGS = """

    Args:
        config: a JSON or YAML file of these settings (flags given here override it)
        json: print the final summary as one JSON object
    """
def _distill_command(task: str) -> None:
    """`bertforge distill TASK`: one subcommand per task, each `DistillConfig`'s flags with its task set."""

    def distill(*, config: str | None = None, json: bool = False, ctx: typer.Context | None = None,
                **settings: Any) -> None:
        from ..training.distill import run_distill

        run_distill(settings_from(DistillConfig, settings, config, ctx, task=task), as_json=json)

    distill.__name__ = distill.__qualname__ = f"distill_{task}"
    distill.__doc__ = TASKS[task].distill + _DISTILL_ARGS
    command(distill_app, task, settings=DistillConfig)(distill)


for _task in (name for name, spec in TASKS.items() if spec.distill):
    _distill_command(_task)


@command(distill_app, "mlm", settings=DistillMLMConfig, settings_skip=frozenset({"corpus"}))
def distill_mlm(corpus: list[str], *, config: str | None = None, json: bool = False,
                ctx: typer.Context | None = None, **settings: Any) -> None:
    """Task-agnostic distillation: a smaller masked-LM student of a teacher, on raw text.

    DistilBERT's recipe on pretraining's corpus readers, prepared shards, loop, checkpoints,
    exact resume and torchrun: the student (the teacher's every other layer by default, written
    as a DistilBERT when the teacher is a BERT) learns the teacher's soft targets at masked
    positions, its own masked-LM loss and the direction of the teacher's hidden states
    (--alpha-ce, --alpha-mlm, --alpha-cos).

    Args:
        corpus: files, dirs, globs, hf:NAME, or a `bertforge prepare` directory (none: the embedded corpus)
        config: a JSON or YAML file of these settings (flags given here override it)
        json: print the final summary as one JSON object
    """
    from ..training.pretrain import run_pretrain

    run_pretrain(settings_from(DistillMLMConfig, {**settings, "corpus": list(corpus or [])}, config, ctx),
                 as_json=json)


def _evaluate_command(task: str) -> None:
    def evaluate(*, model: str, data: str, predictions: str | None = None, seq_len: int | None = None,
                 batch_size: int = 32, text_column: str | None = None, pair_column: str | None = None,
                 label_column: str | None = None, overwrite: bool = False, json: bool = False) -> None:
        from ..data.classification import Columns
        from ..training.finetune import run_evaluate

        at_least_one(batch_size=batch_size)
        if predictions:
            check_output_file(predictions, "--predictions", overwrite, {"--model": model, "--data": data})
        metrics = run_evaluate(task, model, data, seq_len=seq_len, batch_size=batch_size,
                               columns=Columns(text_column, pair_column, label_column), predictions=predictions)
        show(metrics, json, f"{task} on {data}")

    evaluate.__name__ = evaluate.__qualname__ = f"evaluate_{task}"
    evaluate.__doc__ = TASKS[task].evaluate + """

    Args:
        model: fine-tuned checkpoint directory
        data: labelled file in the task's format
        predictions: also write one JSON prediction per example to this file
        seq_len: maximum tokens per example (default 512; 384 for qa)
        batch_size: examples per forward pass
        text_column: column of the text (name or 0-based index)
        pair_column: column of the second text
        label_column: column of the label
        overwrite: replace an existing --predictions file
        json: print the metrics as one JSON object
    """
    command(evaluate_app, task)(evaluate)


for _task in (name for name, spec in TASKS.items() if spec.evaluate):
    _evaluate_command(_task)


@command(evaluate_app, "retrieval")
def evaluate_retrieval(*, model: str, data: str, split: str = "test", top_k: int = 100, batch_size: int = 64,
                       seq_len: int | None = None, query_prompt: str | None = None,
                       document_prompt: str | None = None, measures: str | None = None, run: str | None = None,
                       overwrite: bool = False, json: bool = False) -> None:
    """Search a corpus with an embedder and score the ranking as trec_eval does.

    Embeds every document of --data (a BEIR folder: corpus.jsonl, queries.jsonl, qrels/SPLIT.tsv; or
    a file of (query, passage) pairs) and every judged query, retrieves each query's --top-k by
    exact search with the model's similarity function, and reports nDCG@10, MRR@10, MAP@100,
    Recall@1/10/100 and P@10 as trec_eval computes them. The model's prompts named for queries and
    documents (query/document, passage, search_query/search_document...) are applied.

    Args:
        model: a sentence-transformers directory, or any family checkpoint (mean pooling)
        data: a BEIR folder or a (query, passage) pair file (.jsonl, .tsv, .csv)
        split: the qrels split of a BEIR folder
        top_k: documents retrieved per query
        batch_size: texts per forward pass
        seq_len: maximum tokens per text (default: the model's max_seq_length)
        query_prompt: put before every query (default: the model's query prompt, if it has one)
        document_prompt: put before every document (default: the model's document prompt, if any)
        measures: comma-separated, e.g. ndcg@10,recall@100 (default: the list above)
        run: also write the ranking as a TREC run file here
        overwrite: replace an existing --run file
        json: print the metrics as one JSON object
    """
    from ..retrieval.evaluate import run_retrieval_evaluation

    at_least_one(batch_size=batch_size, top_k=top_k)
    if run:
        check_output_file(run, "--run", overwrite, {"--model": model, "--data": data})
    metrics = run_retrieval_evaluation(model, data, split=split, top_k=top_k, batch_size=batch_size, seq_len=seq_len,
                                       query_prompt=query_prompt, document_prompt=document_prompt,
                                       measures=measures, run_file=run)
    show(metrics, json, f"retrieval on {data}")


@command(evaluate_app, "rerank")
def evaluate_rerank(*, model: str, data: str, candidates: str, split: str = "test", top_k: int = 50,
                    batch_size: int = 32, measures: str | None = None, run: str | None = None,
                    overwrite: bool = False, json: bool = False) -> None:
    """Rerank a first stage's candidates with a cross-encoder and score both rankings as trec_eval does.

    Takes each judged query's first --top-k documents of --candidates (a TREC run file, e.g. from
    `evaluate retrieval --run`), scores every (query, document) pair with the cross-encoder, and
    reports the reranked ranking's measures beside the first stage's (`first_stage`).

    Args:
        model: a cross-encoder directory (one relevance logit; sentence-transformers' CrossEncoder layout too)
        data: a BEIR folder or a (query, passage) pair file
        candidates: the first stage's TREC run file
        split: the qrels split of a BEIR folder
        top_k: candidates reranked per query
        batch_size: pairs per forward pass
        measures: comma-separated, e.g. ndcg@10,recall@10 (default: nDCG@10, MRR@10, MAP@100, recall, P@10)
        run: also write the reranked ranking as a TREC run file here
        overwrite: replace an existing --run file
        json: print the metrics as one JSON object
    """
    from ..retrieval.rerank import run_rerank_evaluation

    at_least_one(batch_size=batch_size, top_k=top_k)
    if run:
        check_output_file(run, "--run", overwrite, {"--model": model, "--data": data, "--candidates": candidates})
    show(run_rerank_evaluation(model, data, candidates, split=split, top_k=top_k, batch_size=batch_size,
                               measures=measures, run_file=run), json, f"reranking on {data}")


@command(app, "mine")
def mine(*, model: str, data: str, out: str, split: str = "train", num_negatives: int = 3, range_min: int = 0,
         range_max: int = 100, absolute_margin: float | None = None, relative_margin: float | None = None,
         max_score: float | None = None, sampling: Literal["top", "random"] = "top",
         cross_encoder: str | None = None, scores: bool = False, batch_size: int = 64, seed: int = 0,
         overwrite: bool = False, json: bool = False) -> None:
    """Mine hard negatives: the n-tuples (query, positive, negative_1..n) that `finetune embed` trains on.

    Embeds --data's corpus and judged queries with --model, retrieves each query's closest documents
    exactly, drops its relevant ones, and keeps candidates ranked --range-min to --range-max that
    score below the positive by --absolute-margin or --relative-margin (the guard against unjudged
    positives) and under --max-score. --cross-encoder rescores candidates and positives first. One
    row per (query, positive) that keeps --num-negatives; the others are counted as skipped.

    Args:
        model: the embedder that retrieves (a sentence-transformers directory or any family checkpoint)
        data: a BEIR folder (its --split qrels) or a (query, positive) pair file
        out: the JSONL file to write
        split: the qrels split of a BEIR folder
        num_negatives: negatives per row
        range_min: skip this many of the closest non-relevant documents
        range_max: consider non-relevant documents up to this rank
        absolute_margin: keep a candidate only if it scores at most the positive's score minus this
        relative_margin: keep a candidate only if it scores at most the positive's score times (1 - this)
        max_score: keep a candidate only if it scores at most this
        sampling: top (the closest that pass) or random (a seeded sample of them)
        cross_encoder: a cross-encoder directory whose scores replace the embedder's
        scores: also write each row's scores as a `label` list (positive first): a teacher for MarginMSELoss
        batch_size: texts per forward pass
        seed: seed of --sampling random
        overwrite: replace an existing --out file
        json: print the counts as one JSON object
    """
    from ..retrieval.mine import MineSettings, run_mine

    at_least_one(batch_size=batch_size)
    check_output_file(out, "--out", overwrite, {"--model": model, "--data": data, "--cross-encoder": cross_encoder})
    settings = MineSettings(num_negatives, range_min, range_max, absolute_margin, relative_margin, max_score, sampling)
    show(run_mine(model, data, out, settings, split=split, cross_encoder=cross_encoder, batch_size=batch_size,
                  seed=seed, with_scores=scores), json, f"hard negatives written to {out}")


@command(app, "squad-retrieval")
def squad_retrieval(squad: str, *, out: str, seed: int = 0, overwrite: bool = False, json: bool = False) -> None:
    """Build a passage-retrieval set (BEIR layout) from a SQuAD file: each question retrieves its paragraph.

    The articles are dealt into train / dev / test (32 / 4 / 12 of SQuAD v1.1 dev's 48) by a seeded
    shuffle, so no paragraph is relevant in two splits; the corpus is every paragraph. OUT gets
    corpus.jsonl, queries.jsonl and qrels/{train,dev,test}.tsv, for `finetune embed` and
    `evaluate retrieval`.

    Args:
        squad: a SQuAD v1.1-format JSON file (e.g. dev-v1.1.json)
        out: the folder to write
        seed: seed of the article shuffle
        overwrite: replace the files of an existing set in OUT
        json: print the split sizes as one JSON object
    """
    from ..retrieval.squad import squad_retrieval as build

    show(build(squad, out, seed=seed, overwrite=overwrite), json, f"retrieval set written to {out}/")


@command(app, "predict")
def predict(task: Literal[PREDICT_TASKS], texts: list[str] | None = None, *, model: str, input: str | None = None,
            batch_size: int = 32, top_k: int = 5, targets: str | None = None, joint: bool = False,
            aggregation: Literal["first", "average", "max"] = "first",
            pooling: Literal["mean", "cls", "max", "mean_sqrt_len_tokens", "weightedmean", "lasttoken",
                             "pooler"] | None = None,
            normalize: bool = False, against: str | None = None, null_threshold: float | None = None,
            backend: Literal[INFERENCE_BACKENDS] = INFERENCE_BACKENDS[0], sparse: bool = False,
            multi_vector: bool = False, is_query: bool = False) -> None:
    """Run a model on texts: fill-mask, classify, ner, qa, embed, similarity.

    Inputs are the TEXTS given, a file (--input: one per line, or JSONL objects such as
    {"text": ..., "text_pair": ...} or {"question": ..., "context": ...}), or stdin. Prints one
    JSON object per input.

    Args:
        task: what to run
        texts: input texts (else --input or stdin)
        model: checkpoint directory
        input: file of inputs, one per line or JSONL
        batch_size: inputs per forward pass
        top_k: fill-mask predictions per mask; similarity matches
        targets: fill-mask: comma-separated words to score instead of the top-k
        joint: fill-mask: fill all masks, most confident first
        aggregation: ner: how sub-token scores become word labels
        pooling: embed/similarity pooling (default: the sentence-transformers setting, else mean)
        normalize: embed: L2-normalise the vectors
        against: similarity: file of candidates; print the --top-k matches of each input
        null_threshold: qa (SQuAD v2 models): answer '' above this null margin
        sparse: embed: the model is a SparseEncoder (SPLADE) directory (found by itself; the flag checks it): each
            text's non-zero words and weights, {token: weight} and TEI's [{index, value}]
        multi_vector: embed: the model is a ColBERT (PyLate) directory: each text's token vectors ("embeddings"),
            encoded as a document (punctuation dropped) unless --is-query
        is_query: embed --multi-vector: encode the texts as queries (prefix, [MASK] expansion to query_length);
            embed --sparse: as SparseEncoder.encode_query (an inference-free model's query weights)
        backend: auto (the faster of fused and torch for batches, measured once per machine and model
            shape; serve adds ONNX Runtime for one-text requests where it is faster there; -v says which),
            fused (oneDNN kernels, eager PyTorch's numbers), torch (eager, as models/bert.py reads), fused-bf16 (the fused path with bf16 matmuls, for
            CPUs with AMX or AVX512-BF16; close to, not equal to, the fp32 numbers), compiled
            (TorchInductor, a one-off ~20 s), onnx or onnx-int8 (ONNX Runtime, exported and checked
            against PyTorch at start-up), or jax (Flax NNX)
    """
    from ..inference.pipelines import read_inputs
    from ..inference.predict import run_predict

    stdin = None if texts or input else sys.stdin.read().splitlines()
    inputs = read_inputs(list(texts or []), input, stdin)
    candidates = read_inputs([], against) if against else None
    for row in run_predict(task, model, inputs, top_k=top_k, targets=targets.split(",") if targets else None,
                           joint=joint, aggregation=aggregation, pooling=pooling, normalize=True if normalize else None,
                           against=candidates, batch_size=batch_size, null_threshold=null_threshold,
                           progress=bool(input) and sys.stderr.isatty(), backend=backend, sparse=sparse,
                           multi_vector=multi_vector, is_query=is_query):
        print(dumps(row, ensure_ascii=False), flush=True)


@command(app, "serve")
def serve(*, model: str, host: str = "127.0.0.1", port: int = 8000, max_body_bytes: int = 2_000_000,
          max_texts: int = 2048, max_chars: int | None = None, auto_truncate: bool = False, batch_wait_ms: float = 0.0,
          max_batch_tokens: int = 16_384,
          max_concurrent_requests: int = 512, api_key: str | None = None,
          served_model_name: str | None = None, shutdown_grace_s: float = 25.0, request_timeout_s: float = 300.0,
          backend: Literal[INFERENCE_BACKENDS] = INFERENCE_BACKENDS[0]) -> None:
    """Serve a model over HTTP, in the APIs its clients already speak: bertforge's, TEI's, the Hugging Face
    Inference API's, OpenAI's, Cohere's and Jina's; metrics; offline API docs.

    Routes: /embed, /fill-mask, /classify, /ner, /qa (bertforge's {"texts"}); TEI's /embed, /embed_all,
    /predict, /rerank, /similarity, /tokenize, /decode, /info and POST / (the model's own task, also for
    huggingface_hub's InferenceClient) and /invocations; /v1/embeddings as OpenAI; /v1/rerank, /v2/rerank,
    /v1/embed, /v2/embed as Cohere (and Jina); /metrics for Prometheus; /docs (offline). docs/serving.md
    lists them all. Routes the model has no head for answer 404. Binds to 127.0.0.1 unless --host says
    otherwise. The API key may also come from the BERTFORGE_API_KEY environment variable, which other
    users cannot read from the process list.

    Args:
        model: checkpoint directory
        host: address to bind (127.0.0.1: this machine only)
        port: TCP port
        max_body_bytes: larger request bodies get 413 (TEI's default, 2 MB)
        max_texts: inputs per request (else 413); 2048, OpenAI's own limit, takes LangChain's (1000) and
            LlamaIndex's (100) default batches
        max_chars: characters per input that is not to be truncated (else 413); default: 20 per position the
            model reads, at least 10,000 (10,240 for 512 positions, 163,840 for 8,192); /info says it
        auto_truncate: cut long inputs when a TEI request leaves `truncate` unset (null), as TEI's flag does
        batch_wait_ms: how long a batch waits for more requests (0: it takes those that queued while the last
            batch ran)
        max_batch_tokens: tokens per batch: concurrent requests are grouped under this budget
        max_concurrent_requests: requests in flight; one more gets 429 at once
        api_key: require 'Authorization: Bearer KEY' on every endpoint but /health and the API docs
        served_model_name: the name /v1/embeddings and /info use (default: the directory's name)
        shutdown_grace_s: on SIGTERM or Ctrl-C, new requests get 503 and those in flight get this many seconds
            to finish before the server exits (0, the default exit status); a second signal stops at once
        request_timeout_s: a request still unanswered after this many seconds is answered 503 and stopped (its
            tokenising, its wait for a batch); the server and the other requests go on
        backend: auto (the faster of fused and torch for batches, and ONNX Runtime for one-text requests
            where it is faster there, measured once per machine and model shape and said at start-up),
            fused (oneDNN kernels, eager PyTorch's numbers), torch (eager, as models/bert.py reads), fused-bf16 (the fused path with bf16 matmuls, for
            CPUs with AMX or AVX512-BF16; close to, not equal to, the fp32 numbers), compiled
            (TorchInductor, a one-off ~20 s), onnx or onnx-int8 (ONNX Runtime, exported and checked
            against PyTorch at start-up), or jax (Flax NNX)
    """
    import os

    from ..errors import require

    require("serve", "fastapi", "uvicorn", "pydantic", "prometheus_client", "swagger_ui", what="bertforge serve")
    from ..server import Limits
    from ..server import serve as run_server

    run_server(model, host, port, Limits(max_body_bytes=max_body_bytes, max_texts=max_texts, max_chars=max_chars,
                                         auto_truncate=auto_truncate,
                                         batch_wait_ms=batch_wait_ms, max_batch_tokens=max_batch_tokens,
                                         max_concurrent_requests=max_concurrent_requests,
                                         api_key=api_key or os.environ.get("BERTFORGE_API_KEY") or None,
                                         served_model_name=served_model_name, backend=backend,
                                         request_timeout_s=request_timeout_s),
               shutdown_grace_s=shutdown_grace_s)


@command(app, "attention")
def attention(*, model: str, text: str, out: str, pair: str | None = None, layer: int | None = None,
              head: int | None = None, html: str | None = None, overwrite: bool = False, json: bool = False) -> None:
    """Draw attention heatmaps (a PNG grid, or an interactive HTML page).

    Draws a model's attention for one input: a PNG grid of every layer x head, or one layer/head
    with the WordPiece tokens on both axes; --html writes a static page with layer and head
    pickers that opens in any browser without a server.

    Args:
        model: checkpoint directory
        text: the input text
        out: PNG file to write
        pair: second segment (sentence B)
        layer: 1-based layer to draw alone (default: the whole grid)
        head: 1-based head (with --layer; default: the mean of the heads)
        html: also write an interactive HTML page here
        overwrite: replace existing --out / --html files
        json: print one JSON object instead of a summary
    """
    from ..interop.auto import AutoModel
    from ..tokenization.kinds import load_tokenizer
    from ..viz import attention_maps, plot_attention, write_attention_html

    for target in (out, html):
        if target and Path(target).exists() and not overwrite:
            raise BertforgeError(f"{target}: exists; pass --overwrite to replace it")
    encoder = AutoModel.from_pretrained(model)
    tokens, attn = attention_maps(encoder, load_tokenizer(model), text, pair)
    n_layers, n_heads = attn.shape[:2]
    for name, value, limit in (("--layer", layer, n_layers), ("--head", head, n_heads)):
        if value is not None and not 1 <= value <= limit:
            raise BertforgeError(f"{name} {value} is out of range: the model has {limit}")
    written = [str(plot_attention(tokens, attn, Path(out), layer - 1 if layer else None,
                                  head - 1 if head else None))]
    if html:
        written.append(str(write_attention_html(tokens, attn, Path(html))))
    show({"tokens": len(tokens), "layers": n_layers, "heads": n_heads, "written": written}, json, "attention drawn")


@command(export_app, "onnx")
def export_onnx(*, model: str, out: str, int8: bool = False, opset: int = 18, overwrite: bool = False,
                json: bool = False) -> None:
    """ONNX with dynamic batch and sequence axes, checked against ONNX Runtime.

    Exports a checkpoint to ONNX, runs it in ONNX Runtime on a new padded shape and requires a
    match with PyTorch within 1e-4. --int8 adds a dynamically quantised copy for CPU inference.

    Args:
        model: checkpoint directory
        out: the .onnx file to write
        int8: also write OUT.int8.onnx with int8 weights
        opset: ONNX opset version
        overwrite: replace an existing --out
        json: print one JSON object instead of a summary
    """
    from ..inference.export import export_onnx as run_export

    show(run_export(model, out, int8=int8, opset=opset, overwrite=overwrite), json, "exported")


@command(score_app, "squad")
def score_squad(data: str, predictions: str, *, na_probs: str | None = None, threshold: float = 1.0,
                json: bool = False) -> None:
    """SQuAD v1.1/v2.0 exact match and F1, as the official scripts compute them.

    DATA is the SQuAD file; PREDICTIONS maps question ids to answer text. Prints exact_match and
    f1 in percent (v2: the HasAns/NoAns splits too).

    Args:
        data: the SQuAD JSON file
        predictions: JSON of question id -> answer text
        na_probs: v2: JSON of question id -> no-answer probability
        threshold: v2: no-answer probability threshold
        json: print one JSON object instead of a summary
    """
    from .. import score

    show(score.score_squad(data, predictions, na_probs, threshold), json, f"SQuAD scores of {predictions}")


@command(score_app, "ner")
def score_ner(gold: str, pred: str, *, json: bool = False) -> None:
    """Entity-level precision, recall and F1 of two CoNLL files (conlleval's counting).

    GOLD and PRED are CoNLL column files with aligned tokens and the tag in the last column
    (IOB1, IOB2 or BIOES), or `evaluate --predictions` JSONL for PRED.

    Args:
        gold: CoNLL file with the gold tags
        pred: CoNLL file (or predictions JSONL) with the predicted tags
        json: print one JSON object instead of a summary
    """
    from .. import score

    show(score.score_ner(gold, pred), json, f"entity scores of {pred}")


@command(score_app, "classification")
def score_classification(gold: str, pred: str, *, json: bool = False) -> None:
    """Accuracy, macro-F1, binary F1 and MCC of two label files.

    GOLD and PRED hold one label per line (or as the last tab-separated column), or
    `evaluate --predictions` JSONL for PRED.

    Args:
        gold: file with the gold labels
        pred: file with the predicted labels
        json: print one JSON object instead of a summary
    """
    from .. import score

    show(score.score_classification(gold, pred), json, f"classification scores of {pred}")


@command(app, "demo")
def demo(*, out: str = "bertforge-demo", model: str = "tiny", seed: int = 0, overwrite: bool = False) -> None:
    """Offline end-to-end tour: tokenizer, tiny model, save, reload, fill-mask.

    Trains a vocabulary on the standard library's docstrings, builds a tiny BERT, runs MLM+NSP
    forward, saves in the Hugging Face layout, reloads and fills masks.

    Args:
        out: output directory
        model: size preset
        seed: seed of the new weights
        overwrite: allow writing into a non-empty --out
    """
    from .demo import run_demo

    run_demo(Path(out), preset=model, seed=seed, overwrite=overwrite)


@kernels_app.callback()
def _kernels(ctx: typer.Context) -> None:
    if ctx.invoked_subcommand is None:  # `bertforge kernels` alone: the cache's state
        kernels_status(json=False)


@command(kernels_app, "status")
def kernels_status(*, json: bool = False) -> None:
    """Say whether this machine's native kernels are built, being built (and by whom), or not yet.

    The build for this install, torch, compiler and CPU lives in one folder of PyTorch's extension cache
    (TORCH_EXTENSIONS_DIR, by default ~/.cache/torch_extensions); the report names it, and the other
    bertforge builds there (other versions, torches or compilers).

    Args:
        json: print one JSON object instead of a summary
    """
    from .. import kernels

    info = kernels_report(kernels)
    show(info, json, f"native kernels: {info['state']}")


def kernels_report(kernels: Any) -> dict[str, Any]:
    """The state of this install's kernel build, as `bertforge kernels` prints it."""
    if not kernels.enabled():
        return {"state": "off", "why": f"{kernels.SWITCH}=0 is set: the PyTorch paths run instead"}
    try:
        build = kernels.build.current()
    except kernels.build.SourcesMissing as exc:
        return {"state": "unavailable", "why": str(exc)}
    info = kernels.build.describe(build)
    others = sorted(p.name for p in kernels.build.cache_root().glob("bertforge_kernels_*")
                    if p.is_dir() and p.name != build.name)
    return {"state": info.pop("state"), **info, "other_builds": others}


@command(kernels_app, "build")
def kernels_build(*, json: bool = False) -> int:
    """Compile the native kernels now (for images and CI), or load them if they are built already.

    Waits for another process that is building them, takes over a build that was killed midway, and exits
    1 with one line when they cannot be built (no compiler, an incomplete install): bertforge then runs
    the PyTorch paths, with the same numbers, slower.

    Args:
        json: print one JSON object instead of a summary
    """
    from .. import kernels

    if not kernels.enabled():
        raise BertforgeError(f"{kernels.SWITCH}=0 is set: nothing to build; unset it to build the native kernels")
    if not kernels.library():  # the warning line above says why
        print("bertforge: the native kernels were not built", file=sys.stderr)
        return 1
    info = kernels_report(kernels)
    info["compile_seconds"] = (None if kernels.status["compile_seconds"] is None
                               else round(kernels.status["compile_seconds"], 1))
    show(info, json, "native kernels: " + ("compiled" if kernels.status["state"] == "compiled" else "already built"))
    return 0

