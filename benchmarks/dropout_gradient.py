"""Does dropout train the same way in both libraries? The mean gradient under dropout, compared.

Dropout masks cannot be matched draw for draw across libraries. The step trace
(`trainer_trace.py`) turns dropout off, and the dropout test in tests/test_hf_parity.py
compares only how much noise dropout adds to the last hidden states. What training feels
is the gradient: SGD follows its mean over the dropout draws and is shaken by its spread.
So this script starts both libraries from one set of weights (the new QA head included),
takes one batch of SQuAD training windows, and averages each library's gradient of every
parameter over many dropout draws. Both are scored with bertforge's span loss, so the only
thing left to differ is dropout (the forward passes agree to float round-off).

If the two apply the same dropout, their mean gradients differ only by Monte Carlo error,
whose expected squared size the draws themselves estimate: (tr S_a + tr S_b) / M, with S
the covariance of one draw's gradient and M the number of draws. The ratio

    z = |mean_a - mean_b|^2 / ((tr S_a + tr S_b) / M)

is then about 1, and grows with any systematic difference in any parameter. It is
reported for the whole model and per block (embeddings, each layer, the head). A control
pair, bertforge against bertforge with its own masks, shows what z looks like for two
identical implementations; bertforge variants with one dropout removed show that z can
tell. The spread itself (tr S, the gradient noise dropout injects) is compared as a ratio.

    python -m benchmarks.dropout_gradient [--model DIR] [--label NAME] [--draws 200] [--windows 8]
"""

from __future__ import annotations

import argparse
import json
import re
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
import transformers

from bertforge.data.batching import collate
from bertforge.data.qa import qa_features, read_squad
from bertforge.heads import BertForQuestionAnswering, span_loss
from bertforge.hf import hf_names
from bertforge.tokenizer import Tokenizer

from .common import RESULTS, machine, minilm_dir, save
from .finetune_vs_trainer import squad_split

LossFn = Callable[[torch.nn.Module, dict], torch.Tensor]


def squad_windows(tokenizer: Tokenizer, count: int, seed: int, work: Path) -> dict[str, torch.Tensor]:
    """`count` training windows (seq 384, stride 128) drawn at random from SQuAD dev articles 1-38, collated."""
    train_path, _ = squad_split(work, 0)
    examples, _ = read_squad(train_path)
    rng = np.random.default_rng(seed)
    chosen = [examples[int(i)] for i in rng.choice(len(examples), size=count, replace=False)]
    features = qa_features(chosen, tokenizer, 384, 128, training=True)[:count]
    return collate(features, tokenizer.pad_token_id)


def ours_loss(model: torch.nn.Module, batch: dict) -> torch.Tensor:
    return model(**batch).loss


def theirs_loss(model: torch.nn.Module, batch: dict) -> torch.Tensor:
    out = model(input_ids=batch["input_ids"], token_type_ids=batch["token_type_ids"],
                attention_mask=batch["attention_mask"])
    return span_loss(out.start_logits, out.end_logits, batch["start_positions"], batch["end_positions"],
                     batch["attention_mask"])


def gradient_moments(model: torch.nn.Module, batch: dict, loss_fn: LossFn, draws: int,
                     names: dict[str, str]) -> dict:
    """Mean gradient and the trace of its per-draw covariance, per parameter, over `draws` dropout draws.

    names: the model's parameter names -> a shared name (transformers'), so two libraries line up.
    Returns {"mean": {name: float64 tensor shaped like the parameter}, "trace": {name: float},
    "loss_mean": float, "loss_std": float}.
    """
    model.train()
    params = {names[n]: p for n, p in model.named_parameters()}
    total = {n: torch.zeros_like(p, dtype=torch.float64) for n, p in params.items()}
    squares = {n: torch.zeros_like(p, dtype=torch.float64) for n, p in params.items()}
    losses = []
    for _ in range(draws):
        model.zero_grad(set_to_none=True)
        loss = loss_fn(model, batch)
        loss.backward()
        losses.append(loss.item())
        for n, p in params.items():
            g = p.grad.double()
            total[n] += g
            squares[n] += g * g
    mean = {n: t / draws for n, t in total.items()}
    # Unbiased per-element variance, summed: the trace of one draw's gradient covariance.
    trace = {n: float(((squares[n] - draws * mean[n] ** 2) / (draws - 1)).sum()) for n in params}
    return {"mean": mean, "trace": trace, "loss_mean": float(np.mean(losses)), "loss_std": float(np.std(losses, ddof=1))}


def block_of(name: str) -> str:
    """A transformers parameter name -> its block: 'embeddings', 'layer N' or 'head'."""
    if ".embeddings." in name:
        return "embeddings"
    m = re.search(r"\.layer\.(\d+)\.", name)
    return f"layer {m.group(1)}" if m else "head"


def compare(a: dict, b: dict, draws: int) -> dict:
    """z (whole model and per block) and the ratio of the gradient noise, for two `gradient_moments` results."""
    blocks: dict[str, list[float]] = {}
    for n in a["mean"]:
        gap = float(((a["mean"][n] - b["mean"][n]) ** 2).sum())
        noise = (a["trace"][n] + b["trace"][n]) / draws
        gap_noise = blocks.setdefault(block_of(n), [0.0, 0.0])
        gap_noise[0] += gap
        gap_noise[1] += noise
    gap, noise = sum(v[0] for v in blocks.values()), sum(v[1] for v in blocks.values())
    return {"z": gap / noise, "z_per_block": {k: v[0] / v[1] for k, v in blocks.items()},
            "noise_ratio": sum(a["trace"].values()) / sum(b["trace"].values()),
            "loss": [a["loss_mean"], b["loss_mean"]],
            "loss_gap_in_se": (a["loss_mean"] - b["loss_mean"])
            / float(np.hypot(a["loss_std"], b["loss_std"]) / np.sqrt(draws))}


VARIANTS = {
    # bertforge with one dropout removed: what a real difference in dropout looks like in z.
    "no attention dropout": lambda m: [setattr(layer.attention, "dropout_p", 0.0) for layer in m.bert.layers],
    "no embedding dropout": lambda m: setattr(m.bert.embeddings.dropout, "p", 0.0),
}


def run(model_dir: str, draws: int, windows: int, seed: int) -> dict:
    """Both libraries (and the control and variants) from one start, on one batch; z for each pair."""
    work = Path(tempfile.mkdtemp(prefix="bf-dropgrad-"))
    tokenizer = Tokenizer.from_pretrained(model_dir)
    batch = squad_windows(tokenizer, windows, seed, work)
    torch.manual_seed(seed)
    ours = BertForQuestionAnswering.from_pretrained(model_dir, num_labels=2)
    ours.save_pretrained(work / "start", tokenizer=tokenizer)  # the new head's weights go to transformers too
    theirs = transformers.BertForQuestionAnswering.from_pretrained(work / "start")
    names = hf_names(ours)
    same = {n: n for n, _ in theirs.named_parameters()}

    # (label, model, loss, name map): the pair under test, the control, then one model per variant.
    runs = [("bertforge", ours, ours_loss, names), ("transformers", theirs, theirs_loss, same),
            ("bertforge, second draws", ours, ours_loss, names)]
    for v in VARIANTS:
        changed = BertForQuestionAnswering.from_pretrained(work / "start")
        VARIANTS[v](changed)
        runs.append((f"bertforge, {v}", changed, ours_loss, names))
    timings, moments = {}, {}
    for label, model, loss_fn, name_map in runs:
        start = time.perf_counter()
        moments[label] = gradient_moments(model, batch, loss_fn, draws, name_map)
        timings[label] = time.perf_counter() - start
        print(f"{label}: {draws} draws in {timings[label]:.0f} s, loss {moments[label]['loss_mean']:.4f}", flush=True)

    pairs = {"bertforge vs transformers": compare(moments["bertforge"], moments["transformers"], draws),
             "control: bertforge vs bertforge": compare(moments["bertforge"], moments["bertforge, second draws"], draws)}
    for v in VARIANTS:
        pairs[f"bertforge, {v} vs transformers"] = compare(moments[f"bertforge, {v}"], moments["transformers"], draws)
    real = batch["attention_mask"].sum(1).tolist()
    return {"draws": draws, "windows": windows, "tokens_per_window": real, "pairs": pairs,
            "seconds": {k: round(v, 1) for k, v in timings.items()}}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", help="a checkpoint directory (default: all-MiniLM-L6-v2)")
    parser.add_argument("--label", help="results are stored under this name (default: the directory's name)")
    parser.add_argument("--draws", type=int, default=200)
    parser.add_argument("--windows", type=int, default=8)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    model_dir = str(Path(args.model) if args.model else minilm_dir())
    label = args.label or (Path(args.model).name if args.model else "all-MiniLM-L6-v2")
    result = run(model_dir, args.draws, args.windows, args.seed)
    previous = RESULTS / "dropout_gradient.json"
    stored = json.loads(previous.read_text()) if previous.exists() else {}
    stored[label] = {"machine": machine(), "command": "python -m benchmarks.dropout_gradient"
                     + (f" --model DIR --label {label}" if args.model else "")
                     + f" --draws {args.draws} --windows {args.windows} --seed {args.seed}", **result}
    save("dropout_gradient", stored)
    print(f"{'pair':<48}{'z':>8}{'noise ratio':>13}{'loss gap (se)':>15}   z per block")
    for name, row in result["pairs"].items():
        blocks = " ".join(f"{k}={v:.2f}" for k, v in row["z_per_block"].items())
        print(f"{name:<48}{row['z']:>8.2f}{row['noise_ratio']:>13.3f}{row['loss_gap_in_se']:>+15.2f}   {blocks}")


if __name__ == "__main__":
    main()
