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
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import transformers

from bertforge import BertConfig, BertForPreTraining, Tokenizer
from bertforge.data.pretraining import MaskingCollator, PretrainingExamples
from bertforge.data.shards import TokenShards, prepare_documents
from bertforge.interop.hf import from_hf_state_dict

from .common import machine, median, minilm_dir, save, wikitext_articles


def pair_examples(tokenizer: Tokenizer, seq_len: int, count: int, seed: int = 0) -> list[dict]:
    work = Path(tempfile.mkdtemp(prefix="bf-throughput-"))
    prepare_documents(wikitext_articles(), ["wikitext-2"], work / "data", tokenizer, workers=1)
    shards = TokenShards(work / "data")
    examples = PretrainingExamples(shards, np.arange(shards.num_documents), tokenizer, seq_len, seed=seed)
    order = np.random.default_rng(seed).permutation(len(examples.instances(0)))[:count]
    return [examples.example(0, int(i)) for i in order]


def train_step(model, optimizer, batch) -> float:
    start = time.perf_counter()
    loss = model(**batch).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return time.perf_counter() - start


def paired_models(size: str, tokenizer: Tokenizer):
    """(bertforge's, transformers') `BertForPreTraining` of a preset, in train mode, with the same weights."""
    ours_config = BertConfig.from_preset(size, vocab_size=tokenizer.vocab_size)
    hf_config = transformers.BertConfig(**{k: v for k, v in ours_config.to_dict().items()
                                           if k not in ("id2label", "label2id")}, attn_implementation="sdpa")
    torch.manual_seed(0)
    hf_model = transformers.BertForPreTraining(hf_config).train()
    ours = BertForPreTraining(ours_config).train()
    from_hf_state_dict(ours, hf_model.state_dict())
    return ours, hf_model


def run_size(size: str, examples: list[dict], tokenizer: Tokenizer, hf_tokenizer, steps: int, batch_size: int,
             warmup: int) -> dict:
    ours, hf_model = paired_models(size, tokenizer)
    hf_opt = torch.optim.AdamW(hf_model.parameters(), lr=1e-4)
    our_opt = torch.optim.AdamW(ours.parameters(), lr=1e-4)
    hf_collate = transformers.DataCollatorForLanguageModeling(hf_tokenizer, mlm_probability=0.15)
    our_collate = MaskingCollator(tokenizer, 128)
    rng = np.random.default_rng(0)
    times = {"transformers": [], "bertforge": []}
    real_tokens, padded_tokens = [], []
    for step in range(warmup + steps):
        chunk = examples[step * batch_size:(step + 1) * batch_size]
        hf_batch = hf_collate([{"input_ids": e["input_ids"].tolist(), "token_type_ids": e["token_type_ids"].tolist()}
                               for e in chunk])
        hf_batch["next_sentence_label"] = torch.tensor([e["next_sentence_label"] for e in chunk])
        our_batch = our_collate(chunk, rng)
        assert torch.equal(hf_batch["attention_mask"], our_batch["attention_mask"])  # identical padding
        t_hf = train_step(hf_model, hf_opt, dict(hf_batch))
        t_ours = train_step(ours, our_opt, our_batch)
        if step >= warmup:
            times["transformers"].append(t_hf)
            times["bertforge"].append(t_ours)
            real_tokens.append(int(our_batch["attention_mask"].sum()))
            padded_tokens.append(our_batch["attention_mask"].numel())
    result = {}
    for name, t in times.items():
        result[name] = {
            "median_step_s": median(t),
            "real_tokens_per_s": median([r / s for r, s in zip(real_tokens, t)]),
            "padded_tokens_per_s": median([p / s for p, s in zip(padded_tokens, t)]),
        }
    result["ratio_real_tokens_per_s"] = result["bertforge"]["real_tokens_per_s"] / result["transformers"]["real_tokens_per_s"]
    result["real_token_fraction"] = sum(real_tokens) / sum(padded_tokens)
    return result


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
