"""The `bertforge` command: subcommands mapped onto plain functions.

A `BertforgeError` (the user's mistake) becomes one line on stderr and exit code 2,
with no traceback; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import json
import logging
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
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
    args = parser.parse_args(argv)
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
