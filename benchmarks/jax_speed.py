"""JAX (Flax NNX) against bertforge's torch path and transformers, on this machine.

1. Pretraining: real (non-pad) tokens/s of a full MLM+NSP optimizer step (forward, backward,
   AdamW) on the same WikiText-2 sentence pairs at seq 128 (bertforge's pair builder and masking
   collator), for the `mini` and `base` shapes, all three from the same initial weights. torch
   steps run on batches padded to their longest row (bertforge also unpads inside); the JAX step
   pads every batch to 128, so it compiles once: that compile is timed apart. The three take
   turns step by step; medians of per-step rates.
2. Inference: sentences/s of the encoder on SST-2 dev (872 sentences, all-MiniLM-L6-v2), batches
   of 32 sorted by length; JAX pads each batch to a multiple of 32 tokens, so a handful of
   shapes compile once each (compile time reported apart); medians of --repeats passes.

    python -m benchmarks.jax_speed [--steps 8] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import time

import jax
import jax.numpy as jnp
import numpy as np
import torch
import transformers

from bertforge import BertConfig, BertForPreTraining, BertModel, Tokenizer, jax as bjax
from bertforge.data.pretraining import MaskingCollator
from bertforge.interop.hf import from_hf_state_dict
from bertforge.jax.checkpoint import load_torch_state
from bertforge.jax.train import make_optimizer, train_step as jax_step

from .common import DATA, machine, median, minilm_dir, need, save
from .helpers.inference import batches
from .helpers.training import pair_examples, train_step as torch_step


def pretraining(size: str, steps: int, batch_size: int) -> dict:
    tok = Tokenizer.from_pretrained(minilm_dir())
    examples = pair_examples(tok, 128, (steps + 2) * batch_size)
    collator = MaskingCollator(tok, 128)
    rng = np.random.default_rng(0)
    data = [collator(examples[i * batch_size:(i + 1) * batch_size], rng) for i in range(steps + 2)]
    config = BertConfig.from_preset(size, vocab_size=tok.vocab_size)
    torch.manual_seed(0)
    ours = BertForPreTraining(config).train()
    hf = transformers.BertForPreTraining(transformers.BertConfig(**{k: v for k, v in config.to_dict().items()
                                                                    if k not in ("id2label", "label2id")},
                                                                 attn_implementation="sdpa")).train()
    from_hf_state_dict(ours, hf.state_dict())
    jmodel = bjax.bert.BertForPreTraining(config, bjax.bert.seeded(0))
    load_torch_state(jmodel, ours.state_dict())
    jmodel.max_predictions = collator.cap  # as `pretrain --backend jax` sets it
    jmodel.train()
    optimizers = {"bertforge": torch.optim.AdamW(ours.parameters(), lr=1e-4),
                  "transformers": torch.optim.AdamW(hf.parameters(), lr=1e-4)}
    jopt = make_optimizer(jmodel)

    def padded(batch: dict) -> dict:
        out = {}
        for k, v in batch.items():
            a = v.numpy()
            if a.ndim == 2 and a.shape[1] < 128:
                a = np.pad(a, ((0, 0), (0, 128 - a.shape[1])), constant_values=-100 if k == "labels" else 0)
            out[k] = jnp.asarray(a)[None]  # one micro-batch
        return out

    def run_jax(batch: dict) -> float:
        start = time.perf_counter()
        out = jax_step(jmodel, jopt, padded(batch), 1e-4)
        jax.block_until_ready(out["loss"])
        return time.perf_counter() - start

    hf_batch = lambda b: {**{k: v for k, v in b.items() if k != "next_sentence_label"},  # noqa: E731
                          "next_sentence_label": b["next_sentence_label"]}
    compile_s = run_jax(data[0])  # trace + compile + the first step
    torch_step(ours, optimizers["bertforge"], data[0])
    torch_step(hf, optimizers["transformers"], hf_batch(data[0]))
    rates: dict[str, list[float]] = {"bertforge": [], "transformers": [], "jax": []}
    for batch in data[1:steps + 1]:
        tokens = int(batch["attention_mask"].sum())
        rates["bertforge"].append(tokens / torch_step(ours, optimizers["bertforge"], batch))
        rates["jax"].append(tokens / run_jax(batch))
        rates["transformers"].append(tokens / torch_step(hf, optimizers["transformers"], hf_batch(batch)))
    medians = {k: median(v) for k, v in rates.items()}
    return {"size": size, "batch_size": batch_size, "steps": steps, "real_tokens_per_s": medians,
            "jax_compile_and_first_step_s": compile_s,
            "jax_vs_bertforge": medians["jax"] / medians["bertforge"],
            "jax_vs_transformers": medians["jax"] / medians["transformers"]}


def inference(repeats: int) -> dict:
    model_dir = minilm_dir()
    tok = Tokenizer.from_pretrained(model_dir)
    texts = [line.split("\t")[0] for line in
             need(DATA / "glue/SST-2/dev.tsv").read_text(encoding="utf-8").splitlines()[1:]]
    data = batches(tok, texts, 32, sort=True)
    ours = BertModel.from_pretrained(model_dir).eval()
    hf = transformers.BertModel.from_pretrained(model_dir, attn_implementation="sdpa").eval()
    jmodel = bjax.from_pretrained(model_dir)
    forward = jax.jit(lambda ids, types, mask: jmodel(ids, types, mask).last_hidden_state)

    def bucketed(b: dict) -> tuple:
        width = -(-b["input_ids"].shape[1] // 32) * 32  # a multiple of 32: a few shapes, each compiled once
        return tuple(jnp.asarray(np.pad(b[k], ((0, 0), (0, width - b[k].shape[1])))) for k in
                     ("input_ids", "token_type_ids", "attention_mask"))

    jax_batches = [bucketed(b) for b in data]
    start = time.perf_counter()
    for shape in {b[0].shape for b in jax_batches}:
        jax.block_until_ready(forward(*next(b for b in jax_batches if b[0].shape == shape)))
    compile_s = time.perf_counter() - start

    def run_torch(model):
        with torch.no_grad():
            for b in data:
                model(**{k: torch.from_numpy(v) for k, v in b.items()})

    def run_jax():
        for b in jax_batches:
            jax.block_until_ready(forward(*b))

    runners = {"bertforge": lambda: run_torch(ours), "transformers_sdpa": lambda: run_torch(hf), "jax": run_jax}
    times: dict[str, list[float]] = {k: [] for k in runners}
    for r in range(repeats):
        for name in list(runners)[r % 3:] + list(runners)[:r % 3]:
            start = time.perf_counter()
            runners[name]()
            times[name].append(time.perf_counter() - start)
    rates = {k: len(texts) / median(v) for k, v in times.items()}
    return {"sentences": len(texts), "sentences_per_s": rates, "jax_compile_s": compile_s,
            "jax_vs_bertforge": rates["jax"] / rates["bertforge"],
            "jax_vs_transformers": rates["jax"] / rates["transformers_sdpa"]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    result = {"machine": machine(), "jax": jax.__version__, "command": "python -m benchmarks.jax_speed",
              "pretraining": [pretraining("mini", args.steps, 32), pretraining("base", max(3, args.steps // 2), 8)],
              "inference": inference(args.repeats)}
    print(json.dumps(result, indent=2))
    print("saved", save("jax_speed", result))


if __name__ == "__main__":
    main()
