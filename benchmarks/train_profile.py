"""Where one training step's time goes: torch.profiler over bertforge's `BertForPreTraining` step.

B16 L128 WikiText-2 pairs, forward + backward + AdamW, for each (size, precision, AdamW kernel) asked;
each operator's self time is put into a part by its name and its callers' (`part_of`): the linear
layers' and decoder's matmuls, attention (SDPA or bertforge's native kernel, forward and backward),
dropout masks, the loss (log-softmax, or bertforge's cross-entropy kernel), LayerNorm/GELU/adds, the
optimizer, and the rest (copies, casts, indexing, framework).
The AdamW variants: torch's default on CPU (a loop over tensors), its foreach kernel, its fused one.

    python -m benchmarks.train_profile [--sizes mini,base] [--steps 3]
"""

from __future__ import annotations

import argparse
import contextlib
import json

import numpy as np
import torch
from torch.profiler import ProfilerActivity, profile

from bertforge import BertConfig, BertForPreTraining, Tokenizer
from bertforge.data.pretraining import MaskingCollator
from bertforge.training.matmul import BucketBF16

from .common import machine, minilm_dir, save
from .pretrain_throughput import pair_examples

MATMULS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm")


def part_of(event) -> str:
    """The part of the step an operator's self time belongs to, from its name and those of its callers."""
    chain, node = [], event
    while node is not None:
        chain.append(node.name)
        node = node.cpu_parent
    joined = " ".join(chain).lower()
    if "optimizer.step" in joined:
        return "optimizer"
    if "dropout" in joined or "bernoulli" in joined:
        return "dropout masks"
    if "scaled_dot_product" in joined or "scaleddotproduct" in joined or "varlen_attention" in joined:
        return "attention (SDPA or native kernel)"
    if event.name in MATMULS:
        return "matmuls (linear layers, MLM decoder)"
    if "log_softmax" in joined or "nll_loss" in joined or "cross_entropy" in joined:
        return "loss (log-softmax or native cross-entropy)"
    if any(word in joined for word in ("layer_norm", "gelu", "aten::add", "aten::mul", "aten::sum", "tanh")):
        return "LayerNorm, GELU, adds"
    return "copies, casts, indexing, framework"


def profile_step(size: str, precision: str, adamw: str, examples: list[dict], tokenizer: Tokenizer,
                 steps: int) -> dict:
    torch.manual_seed(0)
    model = BertForPreTraining(BertConfig.from_preset(size, vocab_size=tokenizer.vocab_size)).train()
    kinds = {"loop": dict(foreach=False), "foreach": dict(foreach=True), "fused": dict(fused=True)}
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, eps=1e-6, **kinds[adamw])
    collate = MaskingCollator(tokenizer, 128)
    rng = np.random.default_rng(0)
    batches = [collate(examples[i * 16:(i + 1) * 16], rng) for i in range(2 + steps)]
    context = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if precision == "bf16" else contextlib.nullcontext

    def step(batch):
        with context(), BucketBF16():  # as the training loop runs it (bucketed bf16 linears; no-op in fp32)
            loss = model(**batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    for batch in batches[:2]:
        step(batch)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for batch in batches[2:]:
            step(batch)
    totals: dict[str, float] = {}
    for event in prof.events():
        part = part_of(event)
        totals[part] = totals.get(part, 0.0) + event.self_cpu_time_total / 1e3
    whole = sum(totals.values())
    return {"ms_per_step": round(whole / steps, 1),
            "parts": {k: round(v / whole, 3) for k, v in sorted(totals.items(), key=lambda kv: -kv[1])}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="mini,base")
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    tokenizer = Tokenizer.from_pretrained(minilm_dir())
    examples = pair_examples(tokenizer, 128, (args.steps + 2) * 16)
    result = {"machine": machine(), "command": f"python -m benchmarks.train_profile --sizes {args.sizes} "
                                               f"--steps {args.steps}", "rows": []}
    for size in args.sizes.split(","):
        for precision, adamw in (("fp32", "loop"), ("fp32", "fused"), ("bf16", "fused")):
            row = {"size": size, "precision": precision, "adamw": adamw,
                   **profile_step(size, precision, adamw, examples, tokenizer, args.steps)}
            result["rows"].append(row)
            print(json.dumps(row), flush=True)
    print("saved", save("train_profile", result))


if __name__ == "__main__":
    main()
