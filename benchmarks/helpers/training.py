"""The training benchmarks' shared parts: WikiText-2 pretraining pairs, bertforge and transformers models with the same
weights, a timed step, the matmul peaks and the step-for-step interleaving train_peak.py, gpu_train.py and run.py
share."""

from __future__ import annotations

import argparse
import contextlib
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
from bertforge.training.matmul import BucketBF16
from bertforge.training.pretrain import PretrainConfig, run_pretrain

from ..common import machine, median, minilm_dir, wikitext_articles


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


PRECISIONS = ("fp32", "bf16")


def sizes_and_steps(doc: str, steps: int) -> argparse.ArgumentParser:
    """The options the training benchmarks share: which presets, and how many timed steps."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--sizes", default="mini,base")
    parser.add_argument("--steps", type=int, default=steps)
    return parser


def matmul_peaks(n: int = 2048, repeats: int = 9) -> dict[str, float]:
    """GFLOP/s of an n x n x n matmul: MKL fp32, oneDNN fp32, bf16 (medians)."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    packed = torch.ops.mkldnn._reorder_linear_weight(b.t().contiguous())
    ab, bb = a.bfloat16(), b.bfloat16()
    runs = {"mkl_fp32": lambda: torch.mm(a, b),
            "onednn_fp32": lambda: torch.ops.mkldnn._linear_pointwise(a, packed, None, "none", [], ""),
            "bf16": lambda: torch.mm(ab, bb)}
    times: dict[str, list[float]] = {k: [] for k in runs}
    for f in runs.values():
        f()
    for _ in range(repeats):  # interleaved, so a drift of the machine reaches all three
        for name, f in runs.items():
            start = time.perf_counter()
            f()
            times[name].append(time.perf_counter() - start)
    peaks = {k: 2 * n ** 3 / median(v) / 1e9 for k, v in times.items()}
    peaks["fp32"] = max(peaks["mkl_fp32"], peaks["onednn_fp32"])
    return peaks


def sustained_peaks(n: int = 2048, seconds: float = 3.0) -> dict[str, float]:
    """GFLOP/s of the n x n x n matmul kept running for `seconds`, fp32 (MKL) then bf16: the median
    of the second half's calls. On this project's AMX host the bf16 rate falls to about a third
    after a second of sustained use (docs/results.md), which a burst of a few calls never sees."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    ab, bb = a.bfloat16(), b.bfloat16()
    rates = {}
    for name, f in (("fp32_sustained", lambda: torch.mm(a, b)), ("bf16_sustained", lambda: torch.mm(ab, bb))):
        times, start = [], time.perf_counter()
        while time.perf_counter() - start < seconds:
            t0 = time.perf_counter()
            f()
            times.append((t0 - start, time.perf_counter() - t0))
        rates[name] = 2 * n ** 3 / median([t for at, t in times if at >= seconds / 2]) / 1e9
    return rates


def non_embedding_parameters(model: torch.nn.Module) -> int:
    return sum(p.numel() for name, p in model.named_parameters() if ".embeddings." not in f".{name}")


def autocast_for(precision: str):
    """A fresh context per use: bf16 autocast, or nothing for fp32."""
    return torch.autocast("cpu", dtype=torch.bfloat16) if precision == "bf16" else contextlib.nullcontext()


def interleaved_rates(runners: dict[str, tuple], batches: list[dict], precision: str, warmup: int) -> dict[str, float]:
    """Median real tokens/s of each runner's training step, step for step on the same batches.

    runners: name -> (model, optimizer, a context-manager factory around the step, or None)."""
    rates: dict[str, list[float]] = {name: [] for name in runners}
    for i, batch in enumerate(batches):
        real = int(batch["attention_mask"].sum())
        for name, (model, optimizer, around) in runners.items():  # interleaved: a drift reaches all
            with (around() if around else contextlib.nullcontext()), autocast_for(precision):
                seconds = train_step(model, optimizer, dict(batch))
            if i >= warmup:
                rates[name].append(real / seconds)
    return {name: median(v) for name, v in rates.items()}


def masked_batches(tokenizer: Tokenizer, count: int, batch_size: int = 16) -> list[dict]:
    """`count` L128 masked WikiText-2 pair batches of `batch_size` rows, the same on every call."""
    examples = pair_examples(tokenizer, 128, count * batch_size)
    collate = MaskingCollator(tokenizer, 128)
    rng = np.random.default_rng(0)
    return [collate(examples[i * batch_size:(i + 1) * batch_size], rng) for i in range(count)]


def bertforge_runner(model: torch.nn.Module) -> tuple:
    """bertforge's runner for `interleaved_rates`: the fused AdamW its training loop uses
    (training/optim.py), and the step as the loop runs it (bucketed bf16 linears; no-op in fp32)."""
    return model, torch.optim.AdamW(model.parameters(), lr=1e-4, eps=1e-6, fused=True), BucketBF16


def model_steps(size: str, tokenizer: Tokenizer, steps: int, warmup: int = 2) -> dict:
    """Model-step tokens/s of bertforge and transformers, per precision, interleaved step by step."""
    ours, hf_model = paired_models(size, tokenizer)
    # Each library's default AdamW: torch's fused kernel is what bertforge's loop uses (training/optim.py).
    runners = {"transformers": (hf_model, torch.optim.AdamW(hf_model.parameters(), lr=1e-4), None),
               "bertforge": bertforge_runner(ours)}
    batches = masked_batches(tokenizer, warmup + steps)
    result = {"non_embedding_parameters": non_embedding_parameters(ours)}
    for precision in PRECISIONS:
        result[precision] = interleaved_rates(runners, batches, precision, warmup)
    return result


def model_step_now(size: str, tokenizer: Tokenizer, precision: str, steps: int, warmup: int = 2) -> float:
    """bertforge's model-step tokens/s alone, as `model_steps` times it, at this minute."""
    ours, _ = paired_models(size, tokenizer)  # the same weights as model_steps' runner
    runners = {"bertforge": bertforge_runner(ours)}
    return interleaved_rates(runners, masked_batches(tokenizer, warmup + steps), precision, warmup)["bertforge"]


def end_to_end(size: str, corpus: Path, work: Path, precision: str, steps: int, batch_size: int = 16) -> float:
    """Median logged real tokens/s of `bertforge pretrain` (first 10 steps left out)."""
    out = work / f"{size}-{precision}"
    cfg = PretrainConfig(corpus=[str(corpus)], model=size, out=str(out), seq_len=128,
                         batch_size=batch_size, max_steps=steps, eval_every=10_000, save_every=10_000, log_every=5,
                         progress=False, precision=precision, seed=0, tokenizer=str(minilm_dir()))
    run_pretrain(cfg)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return median([r["tokens_per_s"] for r in rows if "tokens_per_s" in r and r["step"] > 10])


def measure(sizes: list[str], steps: int, e2e_steps: int) -> dict:
    """The shares of peak for each size and precision (the rows of benchmarks/results/train_peak.json)."""
    tokenizer = Tokenizer.from_pretrained(minilm_dir())
    work = Path(tempfile.mkdtemp(prefix="bf-train-peak-"))
    corpus = work / "wikitext2-articles.jsonl"
    corpus.write_text("".join(json.dumps({"text": a}) + "\n" for a in wikitext_articles()), encoding="utf-8")
    result = {"machine": machine(), "batch_size": 16, "seq_len": 128, "torch": torch.__version__,
              "transformers": transformers.__version__, "flops": "6 x non-embedding parameters x real tokens",
              "command": f"python -m benchmarks.train_peak --sizes {','.join(sizes)} --steps {steps} "
                         f"--e2e-steps {e2e_steps}", "rows": []}
    for size in sizes:
        peaks = {**matmul_peaks(), **sustained_peaks()}
        timed = model_steps(size, tokenizer, steps)
        flops_per_token = 6 * timed["non_embedding_parameters"]
        for precision in PRECISIONS:
            peak = peaks[precision]
            e2e = end_to_end(size, corpus, work, precision, e2e_steps)
            after = model_step_now(size, tokenizer, precision, steps)
            ours, theirs = timed[precision]["bertforge"], timed[precision]["transformers"]
            row = {"size": size, "precision": precision, "peak_gflops": round(peak),
                   "peaks": {k: round(v) for k, v in peaks.items()},
                   "model_step_tokens_per_s": round(ours), "model_step_share": round(ours * flops_per_token / 1e9 / peak, 3),
                   "transformers_step_tokens_per_s": round(theirs), "vs_transformers": round(ours / theirs, 2),
                   "end_to_end_tokens_per_s": round(e2e), "end_to_end_share": round(e2e * flops_per_token / 1e9 / peak, 3),
                   "end_to_end_over_model_step": round(e2e / ours, 2),
                   "model_step_after_tokens_per_s": round(after),
                   "end_to_end_over_model_step_after": round(e2e / after, 2),
                   # the same end to end against the rate the units sustain (see sustained_peaks)
                   "end_to_end_share_of_sustained": round(e2e * flops_per_token / 1e9 / peaks[f"{precision}_sustained"], 3)}
            result["rows"].append(row)
            print(json.dumps(row), flush=True)
    return result
