"""Whether bf16 is faster than fp32 for bertforge's own training step, size by size, as `--precision
auto` assumes on CPUs with native bf16.

The same `BertForPreTraining` (one initialisation, copied) is stepped in fp32 and in bf16 autocast,
interleaved step by step on the same batches, so a drift of the machine reaches both; each runner
steps as the training loop does (fused AdamW, bucketed bf16 linears). The batches are train_peak's
L128 WikiText-2 pairs, their ids folded into the vocabulary asked for (`--vocab 8000` is the main
job's: `bertforge pretrain` with no corpus trains an 8,000-piece vocabulary and a `tiny` model on 32
pairs a batch). Each size runs `--rounds` rounds; the figure is bf16/fp32 of the rounds' medians,
mean ± std over the rounds.

    python -m benchmarks.precision_speed [--sizes tiny,mini] [--batch-size 32] [--vocab 8000] [--steps 20] [--rounds 3]
"""

from __future__ import annotations

import copy
import json
import statistics

import torch

from bertforge import BertConfig, BertForPreTraining, Tokenizer

from .common import machine, median, minilm_dir, save
from .pretrain_throughput import train_step
from .train_peak import PRECISIONS, autocast_for, bertforge_runner, masked_batches, sizes_and_steps


def folded_batches(tokenizer: Tokenizer, count: int, batch_size: int, vocab: int) -> list[dict]:
    """train_peak's batches with every id (inputs and masked labels) taken modulo `vocab`."""
    batches = masked_batches(tokenizer, count, batch_size=batch_size)
    for batch in batches:
        batch["input_ids"] = batch["input_ids"] % vocab
        batch["labels"] = torch.where(batch["labels"] >= 0, batch["labels"] % vocab, batch["labels"])
    return batches


def precision_ratio(size: str, batches: list[dict], vocab: int, rounds: int, warmup: int = 2) -> dict:
    """Per round, each precision's median real tokens/s, and bf16 / fp32."""
    torch.manual_seed(0)
    model = BertForPreTraining(BertConfig.from_preset(size, vocab_size=vocab)).train()
    runners = {precision: bertforge_runner(copy.deepcopy(model)) for precision in PRECISIONS}
    per_round = []
    for _ in range(rounds):
        rates: dict[str, list[float]] = {precision: [] for precision in runners}
        for i, batch in enumerate(batches):
            real = int(batch["attention_mask"].sum())
            for precision, (step_model, optimizer, around) in runners.items():  # interleaved
                with around(), autocast_for(precision):
                    seconds = train_step(step_model, optimizer, dict(batch))
                if i >= warmup:
                    rates[precision].append(real / seconds)
        medians = {precision: median(v) for precision, v in rates.items()}
        per_round.append({**{f"{p}_tokens_per_s": round(v) for p, v in medians.items()},
                          "bf16_over_fp32": round(medians["bf16"] / medians["fp32"], 3)})
    ratios = [r["bf16_over_fp32"] for r in per_round]
    return {"size": size, "rounds": per_round, "bf16_over_fp32_mean": round(statistics.mean(ratios), 3),
            "bf16_over_fp32_std": round(statistics.stdev(ratios), 3) if len(ratios) > 1 else 0.0}


def main() -> None:
    parser = sizes_and_steps(__doc__, steps=20)
    parser.set_defaults(sizes="tiny,mini")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--vocab", type=int, default=8000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    tokenizer = Tokenizer.from_pretrained(minilm_dir())
    batches = folded_batches(tokenizer, 2 + args.steps, args.batch_size, args.vocab)
    result = {"machine": machine(), "torch": torch.__version__, "seq_len": 128, "batch_size": args.batch_size,
              "vocab": args.vocab, "rows": [],
              "command": f"python -m benchmarks.precision_speed --sizes {args.sizes} --batch-size {args.batch_size} "
                         f"--vocab {args.vocab} --steps {args.steps} --rounds {args.rounds}"}
    for size in args.sizes.split(","):
        row = precision_ratio(size, batches, args.vocab, args.rounds)
        result["rows"].append(row)
        print(json.dumps(row), flush=True)
    print("saved", save("precision_speed", result))


if __name__ == "__main__":
    main()
