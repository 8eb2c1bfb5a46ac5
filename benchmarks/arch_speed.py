"""DeBERTa-v3-base- and ModernBERT-base-shaped inference on CPU: bertforge against transformers and ONNX Runtime.

A random model of the published base shape (its speed does not depend on the weights) with a tokenizer
of its family trained on WikiText-2:
- deberta-v2: DeBERTa-v3-base (12 layers, 768 wide, 12 heads, FFN 3072, relative positions in 256
  buckets, shared keys, c2p + p2c, no absolute positions, no segments);
- modernbert: ModernBERT-base (22 layers, 768 wide, 12 heads, GeGLU 1152, a global layer every third,
  the others seeing 64 tokens either side, rotary bases 160k / 10k).
Inputs: every SST-2 dev sentence in length-sorted batches of 32, or (--tokens N) --rows rows of exactly
N tokens cut from WikiText-2 as one stream, in batches of --batch. Runners, interleaved pass by pass so
the machine's drift falls on all alike:
- bertforge: `AutoModel` on its default backend, `fused` (ModernBERT's blocks on packed oneDNN weights
  and the native rotary/windowed attention kernel; DeBERTa's on packed oneDNN weights and its
  native attention kernel), unpadded; --precision bf16 runs it under bf16 autocast, which
  the fused blocks honour with bf16-packed weights;
- transformers: eager and, where the family has it (ModernBERT), SDPA attention;
- onnxruntime: bertforge's ONNX export of the same model (`--backend onnx`), where installed.
Reports rows/s per runner and bertforge's ratio to each, per pass as mean ± std; --precision bf16 runs
every torch runner under bf16 autocast (ONNX Runtime stays fp32).

--memory N instead measures one forward pass of one row of N tokens per runner, each in a fresh
process: its seconds and the peak resident memory it added to the loaded model.

    python -m benchmarks.arch_speed --arch deberta-v2 [--repeats 5] [--tokens N]
    python -m benchmarks.arch_speed --arch modernbert --tokens 2048 --rows 8 --batch 2
    python -m benchmarks.arch_speed --arch modernbert --memory 8192
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import transformers

import bertforge
from bertforge.inference.backends import load as load_backend

from .common import machine, save
from .helpers.family import BASE_SHAPES, NAMES, build, texts, timed


def inputs(path: Path, sst: list[str], wiki: list[str], tokens: int | None, rows: int = 64,
           batch: int = 8) -> list[dict[str, torch.Tensor]]:
    tok = bertforge.AutoTokenizer.from_pretrained(path)
    if tokens:  # `rows` rows of exactly `tokens` ids, cut from WikiText-2 as one stream
        ids = [i for line in wiki for i in tok(line, add_special_tokens=False)["input_ids"]]
        while len(ids) < rows * tokens:
            ids = ids + ids
        cut = torch.tensor(ids[:rows * tokens]).view(rows, tokens)
        return [{"input_ids": cut[i:i + batch], "attention_mask": torch.ones_like(cut[i:i + batch])}
                for i in range(0, rows, batch)]
    ordered = sorted(sst, key=lambda s: len(tok(s)["input_ids"]))
    return [{k: v for k, v in tok(ordered[i:i + 32], padding=True, return_tensors="pt").items()
             if k != "token_type_ids" or "token_type_ids" in tok.model_input_names}
            for i in range(0, len(ordered), 32)]


def runners(arch: str, path: Path, onnx: bool = True) -> dict:
    out = {"bertforge": load_backend(bertforge.AutoModel.from_pretrained(path), "fused")}
    kinds = ("sdpa", "eager") if arch == "modernbert" else ("eager",)
    for kind in kinds:
        name = "transformers" if len(kinds) == 1 else f"transformers-{kind}"
        out[name] = transformers.AutoModel.from_pretrained(path, attn_implementation=kind).eval()
    if onnx:
        try:
            out["onnxruntime"] = load_backend(bertforge.AutoModel.from_pretrained(path), "onnx")
        except Exception as exc:  # noqa: BLE001  (onnxruntime not installed: the others still compare)
            print(f"onnxruntime left out: {exc}")
    return out


def ratios(times: dict[str, list[float]]) -> dict[str, dict[str, float | None]]:
    """bertforge's speed-up over each other runner: of the medians, and per pass as mean and std."""
    out = {}
    for name in times:
        if name == "bertforge":
            continue
        per_pass = [theirs / mine for mine, theirs in zip(times["bertforge"], times[name])]
        out[name] = {"of_medians": round(statistics.median(times[name]) / statistics.median(times["bertforge"]), 3),
                     "per_pass_mean": round(statistics.mean(per_pass), 3),
                     "per_pass_std": round(statistics.stdev(per_pass), 3) if len(per_pass) > 1 else None}
    return out


def speed(args: argparse.Namespace) -> None:
    wiki, sst = texts()
    autocast = (torch.autocast("cpu", dtype=torch.bfloat16) if args.precision == "bf16"
                else contextlib.nullcontext())
    with tempfile.TemporaryDirectory() as tmp:
        path = build(args.arch, Path(tmp), wiki)
        work = inputs(path, sst, wiki, args.tokens, args.rows, args.batch)
        models = runners(args.arch, path, onnx=args.precision == "fp32")
        with autocast:
            for model in models.values():
                timed(model, work[:1])  # warm-up
            times: dict[str, list[float]] = {name: [] for name in models}
            for _ in range(args.repeats):
                for name, model in models.items():
                    times[name].append(timed(model, work))
    rows = sum(int(b["input_ids"].shape[0]) for b in work)
    tokens = sum(int(b["attention_mask"].sum()) for b in work)
    flags = f" --repeats {args.repeats}" + (f" --tokens {args.tokens} --rows {args.rows} --batch {args.batch}"
                                            if args.tokens else "")
    flags += " --precision bf16" if args.precision == "bf16" else ""
    result = {"machine": machine(), "torch": torch.__version__, "transformers": transformers.__version__,
              "shape": f"{NAMES[args.arch]} (random weights)", "precision": args.precision, "rows": rows,
              "tokens_per_row": round(tokens / rows, 1), "repeats": args.repeats,
              "command": f"python -m benchmarks.arch_speed --arch {args.arch}{flags}",
              "rows_per_s": {name: round(rows / statistics.median(t), 2) for name, t in times.items()},
              "ratios": ratios(times)}
    print(json.dumps(result, indent=2))
    name = {"deberta-v2": "deberta"}.get(args.arch, args.arch) + "_speed"
    name += (f"_{args.tokens}" if args.tokens else "") + ("_bf16" if args.precision == "bf16" else "")
    print("saved", save(name, result))


def _status_kib(field: str) -> int:
    """A memory figure of this process from /proc/self/status (VmRSS, VmHWM), in KiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def memory_one(arch: str, path: Path, runner: str, tokens: int) -> None:
    """In this (fresh) process: one forward of one row of `tokens` tokens by `runner` alone; prints its seconds and
    the peak resident memory it added above the loaded model (the high-water mark is reset before the pass)."""
    if runner == "bertforge":
        model = load_backend(bertforge.AutoModel.from_pretrained(path), "fused")
    else:
        model = transformers.AutoModel.from_pretrained(path, attn_implementation=runner.split("-")[1]).eval()
    with torch.inference_mode():  # a short warm-up first: the fused backend packs its weights on first use
        model(input_ids=torch.randint(5, 1000, (1, 16)), attention_mask=torch.ones(1, 16, dtype=torch.long))
    ids = torch.randint(5, 1000, (1, tokens))
    Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM, the peak, to the resident size now
    before = _status_kib("VmRSS")
    start = time.perf_counter()
    with torch.inference_mode():
        model(input_ids=ids, attention_mask=torch.ones_like(ids))
    seconds = time.perf_counter() - start
    added = (_status_kib("VmHWM") - before) / 1024
    print(json.dumps({"runner": runner, "seconds": round(seconds, 2), "peak_added_mib": round(added)}))


def memory(args: argparse.Namespace) -> None:
    wiki, _ = texts()
    with tempfile.TemporaryDirectory() as tmp:
        path = build(args.arch, Path(tmp), wiki)
        names = list(runners(args.arch, path, onnx=False))
        out = {}
        for runner in names:
            proc = subprocess.run([sys.executable, "-m", "benchmarks.arch_speed", "--arch", args.arch,
                                   "--memory-one", runner, "--model-dir", str(path), "--memory", str(args.memory)],
                                  capture_output=True, text=True)
            line = proc.stdout.strip().splitlines()[-1] if proc.returncode == 0 else None
            out[runner] = json.loads(line) if line else {"error": proc.stderr.strip().splitlines()[-1]}
            print(runner, out[runner], flush=True)
    result = {"machine": machine(), "torch": torch.__version__, "transformers": transformers.__version__,
              "shape": f"{NAMES[args.arch]} (random weights)", "tokens": args.memory, "rows": 1,
              "command": f"python -m benchmarks.arch_speed --arch {args.arch} --memory {args.memory}",
              "runners": out}
    print("saved", save(f"{args.arch}_memory_{args.memory}", result))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", choices=sorted(BASE_SHAPES), default="deberta-v2")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=None, help="rows of this many tokens instead of SST-2 sentences")
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    parser.add_argument("--memory", type=int, default=None, help="measure one row of this many tokens per runner")
    parser.add_argument("--memory-one", help=argparse.SUPPRESS)
    parser.add_argument("--model-dir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.memory_one:
        memory_one(args.arch, Path(args.model_dir), args.memory_one, args.memory)
    elif args.memory:
        memory(args)
    else:
        speed(args)


if __name__ == "__main__":
    main()
