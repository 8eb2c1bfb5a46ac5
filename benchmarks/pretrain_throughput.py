"""Pretraining throughput, side by side: bertforge vs transformers.BertForPreTraining.

Both train on the same WikiText-2 sentence pairs (built by bertforge's NSP pair builder,
so lengths are ragged as in real pretraining), with the bert-base-uncased vocabulary
(30,522 pieces, from the all-MiniLM-L6-v2 package), the same initial weights, the same
batches padded to their longest row, and torch AdamW. transformers masks with its
`DataCollatorForLanguageModeling`; bertforge with its own collator (same 15% rate). Steps
alternate between the two libraries in one process, and we report the median of per-step
real (non-pad) tokens/s and the ratio.

    python -m benchmarks.pretrain_throughput [--sizes mini,base] [--steps 10] [--batch-size 16]
"""

from __future__ import annotations

import argparse
import json

import transformers

from bertforge import Tokenizer

from .common import machine, minilm_dir, save
from .helpers.training import pair_examples, run_size


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="mini,base")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=16)
    args = parser.parse_args()
    tokenizer = Tokenizer.from_pretrained(minilm_dir())
    hf_tokenizer = transformers.BertTokenizerFast.from_pretrained(minilm_dir())
    examples = pair_examples(tokenizer, 128, (args.warmup + args.steps) * args.batch_size)
    result = {"machine": machine(), "seq_len": 128, "batch_size": args.batch_size, "vocab_size": tokenizer.vocab_size,
              "steps_timed": args.steps, "transformers": transformers.__version__,
              "command": f"python -m benchmarks.pretrain_throughput --sizes {args.sizes} --steps {args.steps} "
                         f"--batch-size {args.batch_size}"}
    for size in args.sizes.split(","):
        result[size] = run_size(size, examples, tokenizer, hf_tokenizer, args.steps, args.batch_size, args.warmup)
        print(size, json.dumps(result[size], indent=2), flush=True)
    print("saved", save("pretrain_throughput", result))


if __name__ == "__main__":
    main()
