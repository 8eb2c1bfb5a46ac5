"""Commands that read or make data and vocabularies: inspect, tokenizer train, prepare, mine, squad-retrieval."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Literal

from ...errors import BertforgeError
from ...heartbeat import phase
from ...jsonfile import dumps
from ...safefiles import check_output_file
from ..build import command
from .apps import app, at_least_one, show, tokenizer_app


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
    from ...interop.inspect import format_report, inspect_checkpoint

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
    from ...models.registry import family
    from ...tokenization.kinds import train_tokenizer

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
    from ...lockfile import lock_directory

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
    from ...data.corpus import CorpusOptions
    from ...data.shards import check_workers
    from ...data.shards import prepare as prepare_shards
    from ...lockfile import lock_beside
    from ...tokenization.kinds import load_tokenizer

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
    from ...retrieval.mine import MineSettings, run_mine

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
    from ...retrieval.squad import squad_retrieval as build

    show(build(squad, out, seed=seed, overwrite=overwrite), json, f"retrieval set written to {out}/")
