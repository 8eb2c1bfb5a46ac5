"""ALBERT's sentence-order prediction on WikiText-2: does a `pretrain --arch albert` run learn sentence order?

A `mini` ALBERT (4 layers sharing one block, 256 wide, 128-wide embeddings) pretrained from scratch with
MLM + sentence-order prediction (its default objective) on WikiText-2 (valid + test articles, a new
8,000-piece SentencePiece vocabulary), batch 32 x 128 tokens, evaluated every 250 steps on held-out
articles (20 batches: 640 pairs, half of them swapped). Then its directory is read by transformers'
`AlbertForPreTraining`, whose `prediction_logits` and `sop_logits` are compared with bertforge's on
held-out text.

The rule, set before measuring: it "learns sentence order" when the held-out SOP accuracy at the end is
at least 0.6 (chance is 0.5; 640 pairs put one standard error at ~0.02).

    python -m benchmarks.albert_sop [--steps 2000] [--eval-every 250] [--time-budget S] [--out DIR]
    python -m benchmarks.albert_sop --synthetic [--steps 300]

On a GPU (the run takes the first CUDA device, bf16 autocast) the result is saved as albert_sop_STEPS_cuda;
--out DIR writes it there instead of benchmarks/results/ (the device machine's $OUT).

--synthetic checks the pipeline where sentence order is plain to see: 800 documents of ten sentences
"one <word> .", "two <word> .", ... "ten <word> .", a 200-piece vocabulary, a 2-layer 64-wide ALBERT, seq
64 (whole documents fit: nothing is truncated), no short targets. Held-out SOP accuracy well above 0.5
there says the pairs, labels and head are right, whatever WikiText-2 needs to learn the same.
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
from pathlib import Path

import torch
import transformers

import bertforge
from bertforge.training.pretrain import PretrainConfig, run_pretrain

from .common import machine, save, wikitext_articles


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--synthetic", action="store_true", help="ordered synthetic documents instead of WikiText-2")
    parser.add_argument("--eval-every", type=int, default=None)
    parser.add_argument("--time-budget", type=float, default=None, help="stop after this many seconds")
    parser.add_argument("--out", type=Path, default=None, help="write the JSON here, not benchmarks/results/")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bf-albert-sop-"))
    if args.synthetic:
        rng = random.Random(0)
        ordinals = ["one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten"]
        nouns = ["apple", "pear", "stone", "river", "cloud", "green"]
        articles = ["\n".join(f"{o} {rng.choice(nouns)} ." for o in ordinals) for _ in range(800)]
        sizes = dict(model="L2-H64", vocab_size=200, seq_len=64, short_seq_prob=0.0, eval_every=100)
    else:
        articles = wikitext_articles()
        sizes = dict(model="mini", vocab_size=8000, seq_len=128, eval_every=250)
    corpus = work / "articles.jsonl"
    corpus.write_text("".join(json.dumps({"text": a}) + "\n" for a in articles), encoding="utf-8")
    summary = run_pretrain(PretrainConfig(
        corpus=[str(corpus)], arch="albert", out=str(work / "run"), batch_size=32, lr=1e-3, warmup=0.06,
        max_steps=args.steps, eval_fraction=0.05, eval_batches=20, save_every=100_000, log_every=50, progress=False,
        seed=0, time_budget=args.time_budget, **{**sizes, **({"eval_every": args.eval_every} if args.eval_every else {})}),
        as_json=True)
    rows = [json.loads(line) for line in (work / "run" / "metrics.jsonl").read_text().splitlines()]
    curve = [(r["step"], round(r["eval_sop_acc"], 4), round(r["eval_mlm_acc"], 4)) for r in rows if "eval_sop_acc" in r]
    # transformers reads the directory as AlbertForPreTraining and computes the same two outputs.
    ours = bertforge.AutoModelForPreTraining.from_pretrained(work / "run").eval()
    theirs = transformers.AlbertForPreTraining.from_pretrained(work / "run").eval()
    tok = bertforge.AutoTokenizer.from_pretrained(work / "run")
    text = articles[-1].split("\n")
    cuda = torch.cuda.is_available()
    batch = tok(text[:4], text[1:5], padding=True, truncation=True, max_length=128, return_tensors="pt",
                return_token_type_ids=True)
    with torch.no_grad():
        a, b = ours(**batch), theirs(**batch)
    real = batch["attention_mask"].bool()
    where = machine() + (f", on {torch.cuda.get_device_name(0)}" if cuda else "")
    result = {"machine": where, "corpus": "synthetic ordered documents" if args.synthetic else "WikiText-2",
              "command": f"python -m benchmarks.albert_sop --steps {args.steps}" + (" --synthetic" * args.synthetic)
              + (f" --eval-every {args.eval_every}" if args.eval_every else "")
              + (f" --time-budget {args.time_budget:g}" if args.time_budget else ""),
              "steps_run": summary["step"], "seconds": round(summary["elapsed"], 1),
              "rule": "learns sentence order: held-out SOP accuracy >= 0.6 at the end",
              "curve_step_sop_mlm": curve, "final": summary["eval"],
              "learns_sentence_order": summary["eval"]["sop_acc"] >= 0.6,
              "transformers_max_abs_diff": {
                  "prediction_logits": float((a.prediction_logits - b.prediction_logits)[real].abs().max()),
                  "sop_logits": float((a.sop_logits - b.sop_logits).abs().max())}}
    print(json.dumps(result, indent=2))
    name = "albert_sop" + ("_synthetic" if args.synthetic else "") + (f"_{args.steps}_cuda" if cuda else "")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"{name}.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
        print("saved", args.out / f"{name}.json")
    else:
        print("saved", save(name, result))


if __name__ == "__main__":
    main()
