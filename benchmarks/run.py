"""The speed suite: every side-by-side speed measurement in one command.

    python -m benchmarks.run [--sections pretrain,memory,finetune,inference,training] [--steps 10] [--repeats 3]

(a) pretraining real tokens/s, `mini` and `base` at seq 128 on ragged WikiText-2 pairs,
    against transformers.BertForPreTraining (steps alternate in one process; see
    pretrain_throughput.py);
(b) fine-tuning on SST-2 (first 2,000 training rows, one epoch, then the 872 dev
    sentences), bertforge's trainer with and without --pack against the transformers Trainer;
(c) inference on SST-2 dev with all-MiniLM-L6-v2 (see inference.py);
(d) model FLOPs utilisation against a 2048^3 fp32 matmul timed in this run;
(e) peak training memory: each library trains in a fresh subprocess (the same batches;
    transformers is imported in both so the baseline is the same) and reports its peak
    resident memory during steady-state steps above its resident memory before the model
    was built;
(f) training against the machine's peak (see train_peak.py): for `mini` and `base`, fp32 and bf16
    autocast, the model step and `bertforge pretrain` end to end as shares of the matmul peak of
    that precision measured in the run, and the model step against transformers' at the same precision.

It prints ratios, writes benchmarks/results/suite.json and rewrites the table between the
`suite` markers in docs/results.md.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from .common import DATA, ROOT, machine, median, minilm_dir, need, save
from .helpers.inference import matmul_peak

TARGETS = {"pretrain_mini": 4.0, "pretrain_base": 1.75, "mfu_base": 0.55, "sorted_vs_hf": 1.2, "sorted_vs_ort": 1.0,
           "file_order_vs_hf": 2.0, "int8_vs_ort": 1.5, "memory": 1.0}
# Training shares of peak, end to end, by (size, precision); and the model step against transformers' (#30).
PEAK_TARGETS = {("base", "fp32"): 0.75, ("base", "bf16"): 0.70, ("mini", "fp32"): 0.50, ("mini", "bf16"): 0.40}
MINI_VS_TRANSFORMERS = 4.0


def pretrain_flops(config, batch: dict) -> float:
    """Training FLOPs of one batch's useful work: 3 x the forward of the real tokens, the
    attention over each real sequence, and the MLM decoder on the masked positions only."""
    L, H, F, V = config.num_hidden_layers, config.hidden_size, config.intermediate_size, config.vocab_size
    lengths = batch["attention_mask"].sum(1).double()
    masked = float((batch["labels"] != -100).sum())
    forward = (2 * L * (4 * H * H + 2 * H * F) * float(lengths.sum()) + float((4 * L * H * lengths ** 2).sum())
               + 2 * masked * (H * H + H * V))
    return 3 * forward


def section_pretrain(args, result: dict) -> None:
    import transformers

    from bertforge import BertConfig, Tokenizer
    from bertforge.data.pretraining import MaskingCollator

    from .helpers.training import pair_examples, run_size

    tokenizer = Tokenizer.from_pretrained(minilm_dir())
    hf_tokenizer = transformers.BertTokenizerFast.from_pretrained(minilm_dir())
    examples = pair_examples(tokenizer, 128, (2 + args.steps) * 16)
    out = {}
    for size in ("mini", "base"):
        r = run_size(size, examples, tokenizer, hf_tokenizer, args.steps, 16, 2)
        config = BertConfig.from_preset(size, vocab_size=tokenizer.vocab_size)
        collate = MaskingCollator(tokenizer, 128)
        rng = np.random.default_rng(0)
        # MFU is computed in main(), once the run's best matmul peak is known.
        r["flops_per_step"] = median([pretrain_flops(config, collate(examples[i * 16:(i + 1) * 16], rng))
                                      for i in range(2, 2 + args.steps)])
        out[size] = r
        print(f"pretrain {size}: bertforge {r['bertforge']['real_tokens_per_s']:.0f} real tok/s, transformers "
              f"{r['transformers']['real_tokens_per_s']:.0f} -> {r['ratio_real_tokens_per_s']:.2f}x", flush=True)
    result["pretrain"] = out


def rss_mb(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def memory_probe(lib: str, size: str, batches_file: str, steps: int) -> None:
    """Child process: train `lib`'s BertForPreTraining on the saved batches; print peak MB above the baseline."""
    import transformers  # imported by both libraries' probes, so their baselines match

    from bertforge import BertConfig, BertForPreTraining

    batches = [{k: torch.tensor(v) for k, v in b.items()} for b in json.loads(Path(batches_file).read_text())]
    baseline = rss_mb("VmRSS")
    config = BertConfig.from_preset(size, vocab_size=30522)
    if lib == "bertforge":
        model = BertForPreTraining(config)
    else:
        hf_config = transformers.BertConfig(**{k: v for k, v in config.to_dict().items()
                                               if k not in ("id2label", "label2id")}, attn_implementation="sdpa")
        model = transformers.BertForPreTraining(hf_config)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for i in range(steps):
        if i == 2:  # steady state from here: optimizer state exists; reset the kernel's peak-RSS mark
            Path("/proc/self/clear_refs").write_text("5")
        model(**batches[i % len(batches)]).loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    print(json.dumps({"peak_mb": rss_mb("VmHWM") - baseline}))


def section_memory(args, result: dict) -> None:
    from bertforge import Tokenizer
    from bertforge.data.pretraining import MaskingCollator

    from .helpers.training import pair_examples

    tokenizer = Tokenizer.from_pretrained(minilm_dir())
    examples = pair_examples(tokenizer, 128, 6 * 16, seed=1)
    collate = MaskingCollator(tokenizer, 128)
    rng = np.random.default_rng(1)
    batches = [{k: v.tolist() for k, v in collate(examples[i * 16:(i + 1) * 16], rng).items()} for i in range(6)]
    path = Path(tempfile.mkdtemp(prefix="bf-memory-")) / "batches.json"
    path.write_text(json.dumps(batches))
    out = {}
    for size in ("mini", "base"):
        row = {}
        for lib in ("bertforge", "transformers"):
            proc = subprocess.run([sys.executable, "-m", "benchmarks.run", "--memory-probe", lib, size, str(path)],
                                  capture_output=True, text=True, cwd=ROOT, check=True)
            row[lib] = json.loads(proc.stdout.strip().splitlines()[-1])["peak_mb"]
        row["ratio"] = row["bertforge"] / row["transformers"]
        out[size] = row
        print(f"memory {size}: bertforge {row['bertforge']:.0f} MB, transformers {row['transformers']:.0f} MB "
              f"-> {row['ratio']:.2f}x", flush=True)
    result["memory"] = out


def section_finetune(args, result: dict) -> None:
    from bertforge.training.finetune import FinetuneConfig, run_finetune

    from .helpers.finetune import run_trainer, subset

    work = Path(tempfile.mkdtemp(prefix="bf-suite-ft-"))
    rows = 2000
    train = subset(need(DATA / "glue/SST-2/train.tsv"), work / "train.tsv", rows)
    dev = need(DATA / "glue/SST-2/dev.tsv")
    common = dict(task="classify", model=str(minilm_dir()), train=str(train), dev=str(dev), seed=1, lr=5e-5,
                  epochs=1, batch_size=32, seq_len=128, warmup=0.1, progress=False)
    seconds = {}
    for name, extra in (("bertforge", {}), ("bertforge_pack", {"pack": True})):
        start = time.perf_counter()
        ours = run_finetune(FinetuneConfig(**common, **extra, out=str(work / name)))
        seconds[name] = (time.perf_counter() - start, ours["accuracy"])
    theirs, hf_seconds = run_trainer(FinetuneConfig(**common, out=str(work / "hf")), str(train), str(dev), work / "hf")
    seconds["transformers_trainer"] = (hf_seconds, theirs["accuracy"])
    out = {"train_rows": rows, "epochs": 1, "batch_size": 32, "eval_rows": 872}
    for name, (s, acc) in seconds.items():
        out[name] = {"wall_s": s, "train_examples_per_s": rows / s, "dev_accuracy": acc}
    out["ratio"] = seconds["transformers_trainer"][0] / seconds["bertforge"][0]
    out["ratio_pack"] = seconds["transformers_trainer"][0] / seconds["bertforge_pack"][0]
    print(f"finetune sst2: bertforge {seconds['bertforge'][0]:.0f} s (pack {seconds['bertforge_pack'][0]:.0f} s), "
          f"Trainer {hf_seconds:.0f} s -> {out['ratio']:.2f}x", flush=True)
    result["finetune"] = out


def section_inference(args, result: dict) -> None:
    from .helpers.inference import measure

    r = measure(args.repeats, args.classifier)
    result["inference"] = r
    ratios = r["sorted_ratios"]
    print(f"inference: sorted, fused {ratios['fused_vs_eager']:.2f}x eager; bertforge's best "
          f"({ratios['best_bertforge_fp32']}) {ratios['bertforge_best_vs_best_engine_fp32']:.2f}x the best fp32 "
          f"engine ({ratios['best_fp32_engine']}); file order {r['file_order_sentences_per_s']['ratio_fused']:.2f}x "
          "transformers", flush=True)


def section_training(args, result: dict) -> None:
    from .helpers.training import measure

    r = measure(["mini", "base"], steps=6, e2e_steps=40)
    result["training"] = r
    for row in r["rows"]:
        print(f"training {row['size']} {row['precision']}: end to end {row['end_to_end_share']:.0%} of peak, "
              f"model step {row['vs_transformers']:.2f}x transformers", flush=True)


def training_rows(training: dict) -> list[tuple]:
    """(measure, bertforge, competitor, ratio, target) rows of the training-at-peak table."""
    rows = []
    for r in training["rows"]:
        size, precision = r["size"], r["precision"]
        rows.append((f"Training `{size}` {precision}, `bertforge pretrain` end to end, share of the {precision} "
                     f"matmul peak ({r['peak_gflops']:,} GFLOP/s)", f"{r['end_to_end_share']:.0%}",
                     f"{r['model_step_share']:.0%} (its model step alone)", f"{r['end_to_end_over_model_step']:.2f}×",
                     f"≥ {PEAK_TARGETS[size, precision]:.0%}; ≥ 0.90×"))
        rows.append(("… model step, real tokens/s", f"{r['model_step_tokens_per_s']:,}",
                     f"{r['transformers_step_tokens_per_s']:,} (transformers, same precision)",
                     f"{r['vs_transformers']:.2f}×", f"≥ {MINI_VS_TRANSFORMERS:.0f}×" if size == "mini" else ""))
    return rows


def table(result: dict) -> str:
    """The speed table of docs/results.md, generated from a suite result."""
    rows = ["| Measure | bertforge | Competitor | Ratio | Target |", "|---|---:|---:|---:|---:|"]

    def row(name, ours, theirs, ratio, target):
        rows.append(f"| {name} | {ours} | {theirs} | {ratio} | {target} |")

    p = result.get("pretrain")
    if p:
        for size, target in (("mini", TARGETS["pretrain_mini"]), ("base", TARGETS["pretrain_base"])):
            r = p[size]
            row(f"Pretraining `{size}`, real tokens/s (B=16, T=128, WikiText-2 pairs)",
                f"{r['bertforge']['real_tokens_per_s']:,.0f}",
                f"{r['transformers']['real_tokens_per_s']:,.0f} (BertForPreTraining)",
                f"{r['ratio_real_tokens_per_s']:.2f}×", f"≥ {target}×")
        row("Pretraining `base`, model FLOPs utilisation", f"{p['base']['bertforge']['mfu']:.0%}",
            f"{p['base']['transformers']['mfu']:.0%}", "", f"≥ {TARGETS['mfu_base']:.0%}")
    m = result.get("memory")
    if m:
        for size in ("mini", "base"):
            row(f"Peak training memory `{size}`, MB above baseline", f"{m[size]['bertforge']:,.0f}",
                f"{m[size]['transformers']:,.0f}", f"{m[size]['ratio']:.2f}×", "≤ 1.0×")
    f = result.get("finetune")
    if f:
        row("Fine-tuning SST-2 (2,000 rows, 1 epoch + dev eval), examples/s",
            f"{f['bertforge']['train_examples_per_s']:.1f}",
            f"{f['transformers_trainer']['train_examples_per_s']:.1f} (Trainer)", f"{f['ratio']:.2f}×", "")
        row("… with `--pack`", f"{f['bertforge_pack']['train_examples_per_s']:.1f}",
            f"{f['transformers_trainer']['train_examples_per_s']:.1f} (Trainer)", f"{f['ratio_pack']:.2f}×", "")
    i = result.get("inference")
    if i:
        s = i["sorted_sentences_per_s"]
        ratios = i["sorted_ratios"]
        best = max(s["transformers_eager"], s["transformers_sdpa"])
        fused = s.get("bertforge_fused", s["bertforge"])  # older results have no fused path
        row("Inference, sorted batches of 32, sentences/s (`--backend fused`, the default)", f"{fused:.0f}",
            f"{best:.0f} (best of transformers eager/sdpa)", f"{fused / best:.2f}×", f"≥ {TARGETS['sorted_vs_hf']}×")
        row("… eager encoder (`--backend torch`)", f"{s['bertforge']:.0f}", f"{best:.0f}",
            f"{ratios['bertforge_vs_best_transformers']:.2f}×", "")
        for engine, name in (("onnxruntime_fp32", "ONNX Runtime fp32"), ("openvino_fp32", "OpenVINO fp32"),
                             ("ctranslate2_fp32", "CTranslate2 fp32")):
            if engine in s:
                row(f"… against {name}", f"{fused:.0f}", f"{s[engine]:.0f}", f"{fused / s[engine]:.2f}×",
                    f"≥ {TARGETS['sorted_vs_ort']}×")
        row(f"… encoder compiled (`--backend compiled`, one-off {i['compile_s']:.0f} s)",
            f"{s['bertforge_compiled']:.0f}", f"{best:.0f} (transformers)",
            f"{ratios['compiled_vs_best_transformers']:.2f}×", "")
        fo = i["file_order_sentences_per_s"]
        fo_fused = fo.get("bertforge_embed_pipeline_fused", fo["bertforge_embed_pipeline"])
        row("`embed` pipeline in file order, sentences/s", f"{fo_fused:.0f}",
            f"{fo['best_transformers']:.0f} (transformers, file order)", f"{fo_fused / fo['best_transformers']:.2f}×",
            f"≥ {TARGETS['file_order_vs_hf']}×")
        engines = [k for k in ("onnxruntime_fp32", "openvino_fp32", "ctranslate2_fp32") if k in s]
        best_engine = max(engines, key=lambda k: s[k])
        for engine, name in (("onnxruntime_int8", "ONNX Runtime int8 (`--backend onnx-int8`)"),
                             ("ctranslate2_int8", "CTranslate2 int8")):
            if engine in s:
                row(f"{name} vs the best fp32 engine ({best_engine}), sentences/s", f"{s[engine]:.0f}",
                    f"{s[best_engine]:.0f}", f"{s[engine] / s[best_engine]:.2f}×", f"≥ {TARGETS['int8_vs_ort']}×")
        if "sst2_accuracy" in i:
            a = i["sst2_accuracy"]
            for engine in ("onnx_int8", "ctranslate2_int8"):
                if engine in a:
                    row(f"… {engine} SST-2 dev accuracy (fine-tuned MiniLM)", f"{a[engine]:.2%}",
                        f"{a['pytorch']:.2%} (PyTorch fp32)", f"{(a[engine] - a['pytorch']) * 100:+.2f} points",
                        "≥ −0.5 points")
        mfu = i["mfu_sorted"]
        row("Inference model FLOPs utilisation (real tokens)",
            f"{mfu.get('bertforge_fused', mfu['bertforge']):.0%} fused, {mfu['bertforge']:.0%} eager",
            " / ".join(f"{mfu[k]:.0%} {k}" for k in engines), "", "")
    if result.get("training"):
        for cells in training_rows(result["training"]):
            row(*cells)
    lines = [f"Machine: {result['machine']}; fp32 matmul peak measured in the run: "
             f"{result['matmul_peak_gflops']:.0f} GFLOP/s. Command: `{result['command']}` "
             f"({result['wall_s'] / 60:.0f} min). Medians throughout.", "", *rows]
    return "\n".join(lines)


def update_results_page(text: str) -> None:
    page = ROOT / "docs" / "results.md"
    content = page.read_text(encoding="utf-8")
    begin, end = "<!-- suite:begin -->", "<!-- suite:end -->"
    if begin not in content:
        print("docs/results.md has no suite markers; table not written", file=sys.stderr)
        return
    head, rest = content.split(begin, 1)
    tail = rest.split(end, 1)[1]
    page.write_text(f"{head}{begin}\n{text}\n{end}{tail}", encoding="utf-8")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sections", default="pretrain,memory,finetune,inference,training")
    parser.add_argument("--steps", type=int, default=10, help="timed pretraining steps per size")
    parser.add_argument("--repeats", type=int, default=3, help="timed passes over SST-2 dev per runner")
    parser.add_argument("--classifier", help="an SST-2 fine-tuned checkpoint, for the int8 accuracy change")
    parser.add_argument("--memory-probe", nargs=3, metavar=("LIB", "SIZE", "BATCHES"), help=argparse.SUPPRESS)
    parser.add_argument("--no-write", action="store_true", help="do not rewrite the table in docs/results.md")
    args = parser.parse_args()
    if args.memory_probe:
        memory_probe(*args.memory_probe, steps=6)
        return
    start = time.perf_counter()
    sections = args.sections.split(",")
    command = "python -m benchmarks.run" + (f" --sections {args.sections}" if args.sections != parser.get_default("sections") else "")
    command += " --classifier DIR" if args.classifier else ""
    peak = max(matmul_peak() for _ in range(3))
    result = {"machine": machine(), "command": command, "classifier": args.classifier, "matmul_peak_gflops": peak,
              "threads": torch.get_num_threads(), "cpu_count": os.cpu_count()}
    for name in sections:
        globals()[f"section_{name}"](args, result)
    # The peak is the best the hardware showed in this run (start, end, inference's own):
    # a busy moment must not make every MFU look higher than it is.
    peak = max(peak, matmul_peak(), result.get("inference", {}).get("matmul_peak_gflops", 0.0))
    result["matmul_peak_gflops"] = peak
    for r in result.get("pretrain", {}).values():
        for lib in ("bertforge", "transformers"):
            r[lib]["mfu"] = r["flops_per_step"] / r[lib]["median_step_s"] / 1e9 / peak
    if "inference" in result:
        i = result["inference"]
        i["mfu_sorted"] = {k: i["flops_sorted_pass"] * v / i["sentences"] / 1e9 / peak
                           for k, v in i["sorted_sentences_per_s"].items()}
    result["wall_s"] = time.perf_counter() - start
    text = table(result)
    print(text)
    print("saved", save("suite", result))
    if not args.no_write and set(sections) == set(parser.get_default("sections").split(",")):
        update_results_page(text)


if __name__ == "__main__":
    main()
