"""Task-specific distillation: all-MiniLM-L6-v2 fine-tuned on a task, then distilled into its layers 0, 2 and 4.

--task classify (SST-2), ner (CoNLL-2003) or qa (SQuAD v1.1):

1. The teacher: `bertforge finetune TASK` from all-MiniLM-L6-v2 (6 layers) on the first --rows training
   examples, evaluated on the dev set: SST-2's (872 sentences), CoNLL-2003's validation file (3,250
   sentences), or, for qa, where only SQuAD's dev file is at hand, its articles split in two: the first 40
   articles to train on (--rows questions of them), the last 8 to evaluate on.
2. The student, twice per seed, from the same start (the teacher's embeddings, layers 0, 2, 4 and head)
   with the same settings and data: `bertforge distill TASK` with the teacher's soft targets (alpha 0.5,
   T 2), and with alpha 0, which is fine-tuning on the gold labels alone.
3. Speed: the student's dev-set throughput against the teacher's on the fused backend (from the runs).

The rules, set before measuring: the distilled student "reaches 97% of the teacher" when its mean dev
score (accuracy, entity F1, SQuAD F1) over the seeds is at least 0.97 x the teacher's; the student trained
without the teacher "does not do as well" when its mean is below the distilled mean by more than one
standard deviation (the larger of the two); the student is fast enough when its speed-up is at least 1.8x.

    python -m benchmarks.distill_task [--task classify] [--rows 16000] [--seeds 1,2,3] [--epochs 2]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from bertforge.settings import DistillConfig, FinetuneConfig
from bertforge.training.distill import run_distill
from bertforge.training.finetune import run_finetune

from .common import DATA, machine, minilm_dir, need, save, sst2_train_rows

RESULT_NAMES = {"classify": "distill_sst2", "ner": "distill_conll", "qa": "distill_squad"}


def task_data(task: str, work: Path, rows: int) -> tuple[Path, Path, dict]:
    """(train file, dev file, the task's own settings)."""
    if task == "classify":
        return sst2_train_rows(work, rows), need(DATA / "glue/SST-2/dev.tsv"), {"seq_len": 64}
    if task == "ner":  # the first `rows` sentences (a sentence ends at a blank line)
        lines, kept, count = need(DATA / "conll2003/train.txt").read_text(encoding="utf-8").splitlines(True), [], 0
        for line in lines:
            kept.append(line)
            count += not line.strip()
            if count > rows:
                break
        (work / "train.txt").write_text("".join(kept), encoding="utf-8")
        return work / "train.txt", need(DATA / "conll2003/valid.txt"), {"seq_len": 128}
    squad = json.loads(need(DATA / "squad/dev-v1.1.json").read_text(encoding="utf-8"))
    train, left = [], rows
    for article in squad["data"][:40]:
        paragraphs = []
        for p in article["paragraphs"]:
            if left <= 0:
                break
            paragraphs.append({**p, "qas": p["qas"][:left]})
            left -= len(paragraphs[-1]["qas"])
        if paragraphs:
            train.append({**article, "paragraphs": paragraphs})
    for name, data in (("train.json", train), ("dev.json", squad["data"][40:])):
        (work / name).write_text(json.dumps({"version": "1.1", "data": data}), encoding="utf-8")
    return work / "train.json", work / "dev.json", {"seq_len": 256, "doc_stride": 96}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", choices=sorted(RESULT_NAMES), default="classify")
    parser.add_argument("--rows", type=int, default=16000)
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--epochs", type=float, default=2)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bf-distill-"))
    train, dev, own = task_data(args.task, work, args.rows)
    hyper = dict(batch_size=32, lr=5e-5 if args.task == "classify" else 1e-4, epochs=args.epochs, progress=False,
                 **own)
    common = dict(task=args.task, train=str(train), dev=str(dev), **hyper)
    started = time.perf_counter()
    teacher = run_finetune(FinetuneConfig(model=str(minilm_dir()), out=str(work / "teacher"), seed=0, **common),
                           as_json=True)
    teacher_s = time.perf_counter() - started
    metric = {"classify": "accuracy"}.get(args.task, "f1")
    runs = {}
    for name, alpha in (("distilled", 0.5), ("labels_only", 0.0)):
        started = time.perf_counter()
        summary = run_distill(DistillConfig(teacher=str(work / "teacher"), out=str(work / name), student_layers="3",
                                            alpha=alpha, temperature=2.0, seeds=args.seeds, **common), as_json=True)
        seeds = [json.loads((work / name / f"seed-{s}" / "eval_results.json").read_text())
                 for s in args.seeds.split(",")]
        scores = [s[metric] for s in seeds]
        runs[name] = {"alpha": alpha, metric: scores, "mean": statistics.mean(scores),
                      "std": statistics.stdev(scores) if len(scores) > 1 else 0.0,
                      "speedup_fused": [s["speedup_fused"] for s in seeds],
                      "student_parameters": seeds[0]["student_parameters"],
                      "teacher_parameters": seeds[0]["teacher"]["parameters"],
                      "seconds": round(time.perf_counter() - started)}
        print(name, json.dumps(runs[name]), flush=True)
        del summary
    distilled, plain = runs["distilled"], runs["labels_only"]
    margin = max(distilled["std"], plain["std"])
    speedup = statistics.median(distilled["speedup_fused"] + plain["speedup_fused"])
    task_flag = "" if args.task == "classify" else f" --task {args.task}"
    result = {
        "machine": machine(), "command": f"python -m benchmarks.distill_task{task_flag} --rows {args.rows} "
                                         f"--seeds {args.seeds} --epochs {args.epochs:g}",
        "settings": {**hyper, "rows": args.rows, "student_layers": [0, 2, 4], "temperature": 2.0},
        "teacher": {metric: float(teacher[metric]), "seconds": round(teacher_s)},
        "students": runs,
        "distilled_of_teacher": round(distilled["mean"] / teacher[metric], 4),
        # (bool(): seqeval's scores are numpy floats, and json writes no numpy bool)
        "reaches_97_percent": bool(distilled["mean"] >= 0.97 * teacher[metric]),
        "labels_only_does_not_do_as_well": bool(plain["mean"] < distilled["mean"] - margin),
        "student_speedup_fused_median": speedup, "fast_enough": bool(speedup >= 1.8),
    }
    print(json.dumps(result, indent=2))
    print("saved", save(RESULT_NAMES[args.task], result))


if __name__ == "__main__":
    main()
