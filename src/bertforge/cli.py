"""The `bertforge` command: subcommands mapped onto plain functions.

A `BertforgeError` (the user's mistake) becomes one line on stderr and exit code 2,
with no traceback; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import json
import logging
import math
import re
import sys
from pathlib import Path

from . import __version__
from .errors import BertforgeError


def cmd_inspect(args: argparse.Namespace) -> int:
    from .inspect_ckpt import format_report, inspect_checkpoint

    info = inspect_checkpoint(args.path)
    print(json.dumps(info) if args.json else format_report(info))
    return 0


def cmd_tokenizer_train(args: argparse.Namespace) -> int:
    from .tokenizer import Tokenizer

    out = Path(args.out)
    if (out / "vocab.txt").exists() and not args.overwrite:
        raise BertforgeError(f"{out}: already holds a vocab.txt; pass --overwrite to replace it")
    for f in args.files:
        if not Path(f).is_file():
            raise BertforgeError(f"{f}: no such file")
    tok = Tokenizer.train(args.files, vocab_size=args.vocab_size, lowercase=not args.cased,
                          min_frequency=args.min_frequency, show_progress=sys.stderr.isatty())
    tok.save(out)
    print(json.dumps({"out": str(out), "vocab_size": tok.vocab_size, "lowercase": not args.cased}))
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    run_demo(Path(args.out), preset=args.model, seed=args.seed, overwrite=args.overwrite)
    return 0


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a bad flag or value is one line on stderr (naming the command) and exit code 2."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def checked(convert):
    """An argparse `type` that reports bertforge's own errors (and non-finite numbers) as bad values."""
    def parse(text: str):
        try:
            value = convert(text)
        except BertforgeError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        except (TypeError, ValueError):
            raise argparse.ArgumentTypeError(f"invalid {convert.__name__} value: {text!r}") from None
        if isinstance(value, float) and not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
        return value

    parse.__name__ = convert.__name__
    return parse


def field_help(cls: type) -> dict[str, str]:
    """The `# comment` after each dataclass field, used as that flag's help (one source of truth)."""
    out: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if dataclasses.is_dataclass(klass):
            for line in inspect.getsource(klass).splitlines():
                m = re.match(r"\s+(\w+): [^=]+=.*?#\s*(.+)$", line)
                if m:
                    out[m.group(1)] = m.group(2)
    return out


def add_dataclass_flags(parser: argparse.ArgumentParser, cls: type, skip: set[str] = frozenset()) -> None:
    """One --flag per dataclass field, typed from its annotation, with its comment as help."""
    helps = field_help(cls)
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        flag = "--" + f.name.replace("_", "-")
        kind = str(f.type)
        default = None if f.default is dataclasses.MISSING else f.default
        help_text = helps.get(f.name, "")
        if kind.startswith("bool"):
            parser.add_argument(flag, action="store_true", default=None, help=help_text)
        elif kind.startswith("int"):
            parser.add_argument(flag, type=int, default=None, help=f"{help_text} (default {default})")
        elif f.name == "time_budget":
            from .runconfig import parse_duration

            parser.add_argument(flag, type=checked(parse_duration), default=None, help=f"{help_text}, e.g. 30m, 2h")
        elif kind.startswith("float"):
            parser.add_argument(flag, type=checked(float), default=None, help=f"{help_text} (default {default})")
        else:
            parser.add_argument(flag, default=None, help=f"{help_text} (default {default})")


def cmd_prepare(args: argparse.Namespace) -> int:
    from .data.corpus import CorpusOptions
    from .data.shards import prepare
    from .tokenizer import Tokenizer

    if not args.tokenizer:
        raise BertforgeError("prepare needs --tokenizer DIR (a vocab.txt / tokenizer.json directory or checkpoint)")
    options = CorpusOptions(doc_per_file=args.doc_per_file, text_field=args.text_field,
                            encoding_errors=args.encoding_errors)
    meta = prepare(args.corpus, args.out, Tokenizer.from_pretrained(args.tokenizer), options, workers=args.workers,
                   shard_tokens=args.shard_tokens, progress=sys.stderr.isatty())
    print(json.dumps({k: meta[k] for k in ("documents", "sentences", "tokens", "seconds")} | {"out": args.out}))
    return 0


def cmd_pretrain(args: argparse.Namespace) -> int:
    from .pretrain import run_pretrain
    from .runconfig import PretrainConfig

    given = {k: v for k, v in vars(args).items() if k in {f.name for f in dataclasses.fields(PretrainConfig)}
             and v is not None and k != "corpus"}
    given["corpus"] = list(args.corpus)
    if not args.corpus:  # the embedded default: a tiny model, a small vocabulary, a few minutes
        given.setdefault("vocab_size", 8000)
        given.setdefault("lr", 1e-3)
        given.setdefault("eval_every", 100)
        given.setdefault("save_every", 200)
        if not any(k in given for k in ("max_steps", "epochs", "time_budget")):
            given["time_budget"] = 180.0
    given.setdefault("out", "bertforge-pretrain")
    if "progress" not in given:
        given["progress"] = sys.stderr.isatty() or bool(args.progress_bar)
    given.pop("progress_bar", None)
    cfg = PretrainConfig.from_json(args.config, **given) if args.config else PretrainConfig(**given)
    run_pretrain(cfg)
    return 0


def cmd_score(args: argparse.Namespace) -> int:
    from . import score

    if args.score_command == "squad":
        result = score.score_squad(args.data, args.predictions, args.na_probs, args.threshold)
    elif args.score_command == "ner":
        result = score.score_ner(args.gold, args.pred)
    else:
        result = score.score_classification(args.gold, args.pred)
    print(json.dumps(result))
    return 0


def cmd_finetune(args: argparse.Namespace) -> int:
    from .finetune import run_finetune
    from .runconfig import FinetuneConfig

    given = {k: v for k, v in vars(args).items() if k in {f.name for f in dataclasses.fields(FinetuneConfig)}
             and v is not None}
    given["task"] = args.task
    given.setdefault("progress", sys.stderr.isatty())
    if args.task == "qa":
        given.setdefault("seq_len", 384)  # SQuAD's usual window
    run_finetune(FinetuneConfig(**given))
    return 0


def cmd_evaluate(args: argparse.Namespace) -> int:
    from .data.classification import Columns
    from .finetune import run_evaluate

    metrics = run_evaluate(args.task, args.model, args.data, seq_len=args.seq_len, batch_size=args.batch_size,
                           columns=Columns(args.text_column, args.pair_column, args.label_column),
                           predictions=args.predictions)
    print(json.dumps(metrics))
    return 0


def cmd_predict(args: argparse.Namespace) -> int:
    from .pipelines import read_inputs
    from .predict import run_predict

    stdin = None if args.texts or args.input else sys.stdin.read().splitlines()
    inputs = read_inputs(args.texts, args.input, stdin)
    against = read_inputs([], args.against) if args.against else None
    for row in run_predict(args.task, args.model, inputs, top_k=args.top_k,
                           targets=args.targets.split(",") if args.targets else None, joint=args.joint,
                           aggregation=args.aggregation, pooling=args.pooling,
                           normalize=True if args.normalize else None, against=against,
                           batch_size=args.batch_size, null_threshold=args.null_threshold,
                           progress=bool(args.input) and sys.stderr.isatty(), compile=args.compile):
        print(json.dumps(row, ensure_ascii=False), flush=True)
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    from .errors import require

    require("serve", "fastapi", "uvicorn", "pydantic", what="bertforge serve")
    from .server import Limits, serve

    serve(args.model, args.host, args.port, Limits(max_body_bytes=args.max_body_bytes, max_texts=args.max_texts,
                                                   max_chars=args.max_chars, batch_wait_ms=args.batch_wait_ms))
    return 0


def cmd_attention(args: argparse.Namespace) -> int:
    from .model import BertModel
    from .tokenizer import Tokenizer
    from .viz import attention_maps, plot_attention, write_attention_html

    model = BertModel.from_pretrained(args.model)
    tokens, attn = attention_maps(model, Tokenizer.from_pretrained(args.model), args.text, args.pair)
    L, H = attn.shape[:2]
    for name, value, limit in (("--layer", args.layer, L), ("--head", args.head, H)):
        if value is not None and not 1 <= value <= limit:
            raise BertforgeError(f"{name} {value} is out of range: the model has {limit}")
    layer = args.layer - 1 if args.layer else None
    head = args.head - 1 if args.head else None
    written = [str(plot_attention(tokens, attn, Path(args.out), layer, head))]
    if args.html:
        written.append(str(write_attention_html(tokens, attn, Path(args.html))))
    print(json.dumps({"tokens": len(tokens), "layers": L, "heads": H, "written": written}))
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from .export import export_onnx

    print(json.dumps(export_onnx(args.model, args.out, int8=args.int8, opset=args.opset)))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="bertforge",
        description="A readable BERT that pretrains, fine-tunes and serves, with Hugging Face checkpoint parity.",
    )
    parser.add_argument("--version", action="version", version=f"bertforge {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log loading details (unused checkpoint keys)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("inspect", help="print a checkpoint's config, parameter counts and heads",
                       description="Read a Hugging Face style checkpoint directory (config.json plus "
                                   "model.safetensors or pytorch_model.bin) and report what it holds.")
    p.add_argument("path", help="checkpoint directory")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    p.set_defaults(func=cmd_inspect)

    tok = sub.add_parser("tokenizer", help="train a WordPiece vocabulary",
                         description="Tokenizer tools.").add_subparsers(dest="tokenizer_command", metavar="ACTION")
    p = tok.add_parser("train", help="train a WordPiece vocabulary on text files",
                       description="Train a BERT WordPiece vocabulary ([PAD]=0, [UNK], [CLS], [SEP], [MASK]) "
                                   "and write vocab.txt, tokenizer.json and tokenizer_config.json.")
    p.add_argument("files", nargs="+", help="UTF-8 text files (.gz allowed)")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--vocab-size", type=int, default=30522, help="vocabulary size (default 30522, as bert-base)")
    p.add_argument("--min-frequency", type=int, default=2, help="ignore pieces seen fewer times (default 2)")
    p.add_argument("--cased", action="store_true", help="keep case and accents (default: uncased)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing vocabulary in --out")
    p.set_defaults(func=cmd_tokenizer_train)

    p = sub.add_parser("prepare", help="tokenise a corpus once into shards on disk",
                       description="Read a corpus (text, JSONL, .gz, directories, globs, HF datasets), split it "
                                   "into sentences, tokenise it in parallel processes and write memory-mapped "
                                   "shards that `bertforge pretrain` reads with O(1) random access.")
    p.add_argument("corpus", nargs="+", help="files, directories, globs, a save_to_disk dir, or hf:NAME[:CONFIG]")
    p.add_argument("--out", required=True, help="output directory (must not exist)")
    p.add_argument("--tokenizer", help="directory with vocab.txt or tokenizer.json (e.g. a checkpoint)")
    p.add_argument("--workers", type=int, default=None, help="tokenising processes (default: all cores)")
    p.add_argument("--shard-tokens", type=int, default=100_000_000, help="tokens per shard (default 1e8)")
    p.add_argument("--doc-per-file", action="store_true", help="a whole file is one document")
    p.add_argument("--text-field", default="text", help="JSONL / datasets text field (default text)")
    p.add_argument("--encoding-errors", default="strict", choices=["strict", "replace"],
                   help="on invalid UTF-8: stop (strict) or substitute U+FFFD (replace)")
    p.set_defaults(func=cmd_prepare)

    from .runconfig import PretrainConfig

    p = sub.add_parser("pretrain", help="pretrain BERT (MLM + NSP) on raw text; no corpus = the embedded default",
                       description="Pretrain BERT with masked-LM and next-sentence prediction as google-research/bert "
                                   "does, or MLM-only on packed full sentences. With no CORPUS, pretrain a tiny model "
                                   "for three minutes on the Python standard library's docstrings.")
    p.add_argument("corpus", nargs="*", help="files, dirs, globs, hf:NAME, or a `bertforge prepare` directory")
    p.add_argument("--config", help="a JSON file with any of these settings (flags override it)")
    p.add_argument("--progress-bar", action="store_true", help="show the progress bar even when not on a terminal")
    add_dataclass_flags(p, PretrainConfig, skip={"corpus", "progress"})
    p.set_defaults(func=cmd_pretrain)

    from .runconfig import TASKS, FinetuneConfig

    p = sub.add_parser("finetune", help="fine-tune for classification, regression or NER",
                       description="Fine-tune a checkpoint (or a preset with --tokenizer) on a task, evaluating "
                                   "every epoch and keeping the best model by the task's main metric "
                                   "(accuracy, Pearson, entity F1). The result is a Hugging Face model directory.")
    p.add_argument("task", choices=TASKS)
    add_dataclass_flags(p, FinetuneConfig, skip={"task", "progress", "eval_every", "eval_each_epoch",
                                                 "select_metric", "greater_is_better"})
    p.set_defaults(func=cmd_finetune)

    p = sub.add_parser("evaluate", help="score a fine-tuned model on a labelled file",
                       description="Run a fine-tuned checkpoint on a labelled file and print the task's metrics.")
    p.add_argument("task", choices=TASKS)
    p.add_argument("--model", required=True, help="fine-tuned checkpoint directory")
    p.add_argument("--data", required=True, help="labelled file in the task's format")
    p.add_argument("--predictions", help="also write one JSON prediction per example to this file")
    p.add_argument("--seq-len", type=int, default=None, help="maximum tokens per example (default 512; qa 384)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--text-column")
    p.add_argument("--pair-column")
    p.add_argument("--label-column")
    p.set_defaults(func=cmd_evaluate)

    from .predict import TASKS as PREDICT_TASKS

    p = sub.add_parser("predict", help="run a model on texts: fill-mask, classify, ner, qa, embed, similarity",
                       description="Run a model on texts given as arguments, a file (--input; one per line, or JSONL "
                                   "objects such as {\"text\": ..., \"text_pair\": ...} or {\"question\": ..., "
                                   "\"context\": ...}) or stdin, and print one JSON object per input.")
    p.add_argument("task", choices=PREDICT_TASKS)
    p.add_argument("texts", nargs="*", help="input texts (else --input or stdin)")
    p.add_argument("--model", required=True, help="checkpoint directory")
    p.add_argument("--input", help="file of inputs, one per line or JSONL")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--top-k", type=int, default=5, help="fill-mask predictions per mask; similarity matches")
    p.add_argument("--targets", help="fill-mask: comma-separated words to score instead of the top-k")
    p.add_argument("--joint", action="store_true", help="fill-mask: fill all masks, most confident first")
    p.add_argument("--aggregation", default="first", choices=["first", "average", "max"],
                   help="ner: how sub-token scores become word labels")
    p.add_argument("--pooling", choices=["mean", "cls", "max", "mean_sqrt_len_tokens", "weightedmean", "lasttoken",
                                         "pooler"],
                   help="embed/similarity pooling (default: the sentence-transformers setting, else mean)")
    p.add_argument("--normalize", action="store_true", help="embed: L2-normalise the vectors")
    p.add_argument("--against", help="similarity: file of candidates; print the --top-k matches of each input")
    p.add_argument("--null-threshold", type=checked(float), help="qa (SQuAD v2 models): answer '' above this null margin")
    p.add_argument("--compile", action="store_true",
                   help="torch.compile the encoder first (a one-off ~20 s; ~1.2x faster after, for large inputs)")
    p.set_defaults(func=cmd_predict)

    p = sub.add_parser("serve", help="serve a model over HTTP (FastAPI): /embed /fill-mask /classify /ner /qa",
                       description="Serve a checkpoint over HTTP. Endpoints the model has no head for answer 404. "
                                   "Binds to 127.0.0.1 unless --host says otherwise; OpenAPI docs at /docs.")
    p.add_argument("--model", required=True, help="checkpoint directory")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--max-body-bytes", type=int, default=1_000_000, help="larger bodies get 413")
    p.add_argument("--max-texts", type=int, default=64, help="texts per request (else 422)")
    p.add_argument("--max-chars", type=int, default=10_000, help="characters per text (else 422)")
    p.add_argument("--batch-wait-ms", type=checked(float), default=5.0, help="how long a request waits to batch with others")
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser("attention", help="draw attention heatmaps (PNG grid, or an interactive HTML page)",
                       description="Draw a model's attention for one input: a PNG grid of every layer x head, or "
                                   "one layer/head with the WordPiece tokens on both axes; --html writes a static "
                                   "page with layer and head pickers that opens in any browser without a server.")
    p.add_argument("--model", required=True, help="checkpoint directory")
    p.add_argument("--text", required=True)
    p.add_argument("--pair", help="second segment (sentence B)")
    p.add_argument("--out", required=True, help="PNG file to write")
    p.add_argument("--layer", type=int, help="1-based layer to draw alone (default: the whole grid)")
    p.add_argument("--head", type=int, help="1-based head (with --layer; default: the mean of the heads)")
    p.add_argument("--html", help="also write an interactive HTML page here")
    p.set_defaults(func=cmd_attention)

    exporting = sub.add_parser("export", help="export a model to ONNX (checked against ONNX Runtime)",
                               description="Export formats.").add_subparsers(dest="export_command", metavar="FORMAT")
    p = exporting.add_parser("onnx", help="ONNX with dynamic batch and sequence axes",
                             description="Export a checkpoint to ONNX with dynamic batch and sequence axes, then run it "
                                         "in ONNX Runtime on a new padded shape and require a match with PyTorch "
                                         "within 1e-4. --int8 adds a dynamically quantised copy for CPU inference.")
    p.add_argument("--model", required=True, help="checkpoint directory")
    p.add_argument("--out", required=True, help="the .onnx file to write (must not exist)")
    p.add_argument("--int8", action="store_true", help="also write OUT.int8.onnx with int8 weights")
    p.add_argument("--opset", type=int, default=18)
    p.set_defaults(func=cmd_export)

    scoring = sub.add_parser("score", help="score prediction files with the official metrics",
                             description="Score predictions you already have.").add_subparsers(
        dest="score_command", metavar="TASK")
    p = scoring.add_parser("squad", help="SQuAD v1.1/v2.0 exact match and F1, as the official scripts",
                           description="DATA.json is the SQuAD file; PREDICTIONS.json maps question ids to answer "
                                       "text. Prints {exact_match, f1} in percent (v2: HasAns/NoAns splits too).")
    p.add_argument("data")
    p.add_argument("predictions")
    p.add_argument("--na-probs", help="v2: JSON of question id -> no-answer probability")
    p.add_argument("--threshold", type=checked(float), default=1.0, help="v2: no-answer probability threshold")
    p.set_defaults(func=cmd_score)
    p = scoring.add_parser("ner", help="entity-level precision/recall/F1 of two CoNLL files",
                           description="GOLD and PRED are CoNLL column files with aligned tokens and the tag in "
                                       "the last column (IOB1, IOB2 or BIOES). conlleval-compatible counting.")
    p.add_argument("gold")
    p.add_argument("pred")
    p.set_defaults(func=cmd_score)
    p = scoring.add_parser("classification", help="accuracy, macro-F1, binary F1 and MCC of two label files",
                           description="GOLD and PRED hold one label per line (or as the last tab-separated column).")
    p.add_argument("gold")
    p.add_argument("pred")
    p.set_defaults(func=cmd_score)

    p = sub.add_parser("demo", help="offline end-to-end tour: tokenizer, tiny model, save, reload, fill-mask",
                       description="Train a vocabulary on the standard library's docstrings, build a tiny BERT, "
                                   "run MLM+NSP forward, save in the Hugging Face layout, reload and fill masks.")
    p.add_argument("--out", default="bertforge-demo", help="output directory (default ./bertforge-demo)")
    p.add_argument("--model", default="tiny", help="size preset (default tiny)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--overwrite", action="store_true", help="allow writing into a non-empty --out")
    p.set_defaults(func=cmd_demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra and getattr(args, "command", None) == "predict" and not any(e.startswith("-") for e in extra):
        args.texts = [*args.texts, *extra]  # texts may come after the options: predict TASK --model M TEXT...
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="bertforge: %(levelname)s: %(message)s")
    func = getattr(args, "func", None)
    if func is None:
        # `bertforge` or `bertforge tokenizer` alone: show what there is to run.
        target = parser if args.command is None else parser._subparsers._group_actions[0].choices[args.command]
        target.print_help()
        return 0 if args.command is None else 2
    try:
        return func(args)
    except BertforgeError as exc:
        print(f"bertforge: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("bertforge: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader went away (`bertforge predict ... | head`): that is how pipes end, not an error.
        # Point stdout at /dev/null so Python's own flush at exit does not complain again.
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
