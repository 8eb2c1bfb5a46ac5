"""DeBERTa-v3-base-shaped inference on CPU: bertforge against transformers and ONNX Runtime, in one process.

A random model of DeBERTa-v3-base's shape (12 layers, 768 wide, 12 heads, FFN 3072, relative positions
in 256 buckets, shared keys, c2p + p2c, no absolute positions, no segments; its speed does not depend
on the weights) with a DeBERTa tokenizer trained on WikiText-2. Inputs: every SST-2 dev sentence, in
length-sorted batches of 32 (or, with --tokens N, 64 rows of N tokens cut from WikiText-2 in batches
of 8). Runners, interleaved pass by pass so the machine's drift falls on all alike:
- bertforge: `AutoModel` on torch, unpadded (every bertforge backend but ONNX runs DeBERTa this way:
  the fused one leaves its blocks as they are);
- transformers: `DebertaV2Model`, eager (transformers has no SDPA path for DeBERTa-v2);
- onnxruntime: bertforge's ONNX export of the same model (`--backend onnx`), where installed.
Reports sentences (rows)/s per runner and bertforge's ratio to each, per pass as mean ± std.

    python -m benchmarks.deberta_speed [--repeats 5] [--tokens N]   # writes benchmarks/results/deberta_speed*.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

import torch
import transformers

import bertforge
from bertforge.inference.backends import load as load_backend

from .common import machine, save
from .family_parity import texts, tokenizer_dir
from .family_speed import timed

V3_BASE = dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
               relative_attention=True, position_buckets=256, max_relative_positions=-1, pos_att_type="p2c|c2p",
               share_att_key=True, norm_rel_ebd="layer_norm", position_biased_input=False, type_vocab_size=0,
               layer_norm_eps=1e-7, max_position_embeddings=512)


def inputs(path: Path, sst: list[str], wiki: list[str], tokens: int | None) -> list[dict[str, torch.Tensor]]:
    tok = bertforge.AutoTokenizer.from_pretrained(path)
    if tokens:  # 64 rows of exactly `tokens` ids, cut from WikiText-2 as one stream
        ids = [i for line in wiki for i in tok(line, add_special_tokens=False)["input_ids"]]
        rows = torch.tensor(ids[:64 * tokens]).view(64, tokens)
        return [{"input_ids": rows[i:i + 8], "attention_mask": torch.ones_like(rows[i:i + 8])} for i in range(0, 64, 8)]
    ordered = sorted(sst, key=lambda s: len(tok(s)["input_ids"]))
    return [dict(tok(ordered[i:i + 32], padding=True, return_tensors="pt")) for i in range(0, len(ordered), 32)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=None, help="rows of this many tokens instead of SST-2 sentences")
    args = parser.parse_args()
    wiki, sst = texts()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        tok_dir = tokenizer_dir("deberta", wiki, root, "deberta-v2")
        vocab = bertforge.AutoTokenizer.from_pretrained(tok_dir).vocab_size
        torch.manual_seed(0)
        transformers.DebertaV2Model(transformers.DebertaV2Config(vocab_size=vocab, **V3_BASE)).save_pretrained(root / "m")
        for f in tok_dir.iterdir():
            (root / "m" / f.name).write_bytes(f.read_bytes())
        work = inputs(root / "m", sst, wiki, args.tokens)
        runners = {"bertforge": bertforge.AutoModel.from_pretrained(root / "m").eval(),
                   "transformers": transformers.AutoModel.from_pretrained(root / "m").eval()}
        try:
            runners["onnxruntime"] = load_backend(bertforge.AutoModel.from_pretrained(root / "m"), "onnx")
        except Exception as exc:  # onnxruntime not installed: the other two still compare
            print(f"onnxruntime left out: {exc}")
        for model in runners.values():
            timed(model, work[:2])  # warm-up
        times: dict[str, list[float]] = {name: [] for name in runners}
        for _ in range(args.repeats):
            for name, model in runners.items():
                times[name].append(timed(model, work))
    rows = sum(int(b["input_ids"].shape[0]) for b in work)
    tokens = sum(int(b["attention_mask"].sum()) for b in work)
    result = {"machine": machine(), "torch": torch.__version__, "transformers": transformers.__version__,
              "shape": "DeBERTa-v3-base (random weights)", "rows": rows, "tokens_per_row": round(tokens / rows, 1),
              "repeats": args.repeats, "command": "python -m benchmarks.deberta_speed --repeats "
              f"{args.repeats}" + (f" --tokens {args.tokens}" if args.tokens else ""),
              "rows_per_s": {name: round(rows / statistics.median(t), 2) for name, t in times.items()}, "ratios": {}}
    for name in runners:
        if name == "bertforge":
            continue
        per_pass = [theirs / mine for mine, theirs in zip(times["bertforge"], times[name])]
        result["ratios"][name] = {"of_medians": round(statistics.median(times[name]) / statistics.median(times["bertforge"]), 3),
                                  "per_pass_mean": round(statistics.mean(per_pass), 3),
                                  "per_pass_std": round(statistics.stdev(per_pass), 3) if len(per_pass) > 1 else None}
    print(json.dumps(result, indent=2))
    print("saved", save("deberta_speed" + (f"_{args.tokens}" if args.tokens else ""), result))


if __name__ == "__main__":
    main()
