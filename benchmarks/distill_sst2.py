"""Task-specific distillation on SST-2: all-MiniLM-L6-v2 fine-tuned, then distilled into its layers 0, 2 and 4.

1. The teacher: `bertforge finetune classify` from all-MiniLM-L6-v2 (6 layers) on the first --rows rows of
   SST-2's training set, evaluated on the whole dev set (872 sentences).
2. The student, twice per seed, from the same start (the teacher's embeddings, layers 0, 2, 4, pooler and
   classifier) with the same settings and data: `bertforge distill classify` with the teacher's soft
   targets (alpha 0.5, T 2), and with alpha 0, which is fine-tuning on the gold labels alone.
3. Speed: the student's dev-set throughput against the teacher's on the fused backend (from the runs).

The rules, set before measuring: the distilled student "reaches 97% of the teacher" when its mean dev
accuracy over the seeds is at least 0.97 x the teacher's; the student fine-tuned without the teacher "does
not do as well" when its mean is below the distilled mean by more than one standard deviation (the larger
of the two); the student is fast enough when its speed-up is at least 1.8x.

    python -m benchmarks.distill_sst2 [--rows 16000] [--seeds 1,2,3] [--epochs 2]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from bertforge.runconfig import DistillConfig, FinetuneConfig
from bertforge.training.distill import run_distill
from bertforge.training.finetune import run_finetune

from .common import DATA, machine, minilm_dir, need, save, sst2_train_rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=16000)
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--epochs", type=float, default=2)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bf-distill-"))
    train = sst2_train_rows(work, args.rows)
    dev = str(need(DATA / "glue/SST-2/dev.tsv"))
    hyper = dict(seq_len=64, batch_size=32, lr=5e-5, epochs=args.epochs, progress=False)
    started = time.perf_counter()
    teacher = run_finetune(FinetuneConfig(task="classify", model=str(minilm_dir()), train=str(train), dev=dev,
                                          out=str(work / "teacher"), seed=0, **hyper), as_json=True)
    teacher_s = time.perf_counter() - started
    runs = {}
    for name, alpha in (("distilled", 0.5), ("labels_only", 0.0)):
        started = time.perf_counter()
        summary = run_distill(DistillConfig(task="classify", teacher=str(work / "teacher"), train=str(train), dev=dev,
                                            out=str(work / name), student_layers="3", alpha=alpha, temperature=2.0,
                                            seeds=args.seeds, **hyper), as_json=True)
        seeds = [json.loads((work / name / f"seed-{s}" / "eval_results.json").read_text())
                 for s in args.seeds.split(",")]
        accuracy = [s["accuracy"] for s in seeds]
        runs[name] = {"alpha": alpha, "accuracy": accuracy, "mean": statistics.mean(accuracy),
                      "std": statistics.stdev(accuracy) if len(accuracy) > 1 else 0.0,
                      "speedup_fused": [s["speedup_fused"] for s in seeds],
                      "student_parameters": seeds[0]["student_parameters"],
                      "teacher_parameters": seeds[0]["teacher"]["parameters"],
                      "seconds": round(time.perf_counter() - started)}
        print(name, json.dumps(runs[name]), flush=True)
        del summary
    distilled, plain = runs["distilled"], runs["labels_only"]
    margin = max(distilled["std"], plain["std"])
    speedup = statistics.median(distilled["speedup_fused"] + plain["speedup_fused"])
    result = {
        "machine": machine(), "command": f"python -m benchmarks.distill_sst2 --rows {args.rows} --seeds {args.seeds} "
                                         f"--epochs {args.epochs:g}",
        "settings": {**hyper, "rows": args.rows, "student_layers": [0, 2, 4], "temperature": 2.0},
        "teacher": {"accuracy": teacher["accuracy"], "seconds": round(teacher_s)},
        "students": runs,
        "distilled_of_teacher": round(distilled["mean"] / teacher["accuracy"], 4),
        "reaches_97_percent": distilled["mean"] >= 0.97 * teacher["accuracy"],
        "labels_only_does_not_do_as_well": plain["mean"] < distilled["mean"] - margin,
        "student_speedup_fused_median": speedup, "fast_enough": speedup >= 1.8,
    }
    print(json.dumps(result, indent=2))
    print("saved", save("distill_sst2", result))


if __name__ == "__main__":
    main()
