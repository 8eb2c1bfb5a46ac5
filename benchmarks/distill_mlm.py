"""Task-agnostic distillation on WikiText-2: a BERT `mini` teacher, distilled by `bertforge distill mlm` into 2 layers.

1. The teacher: `bertforge pretrain` (BERT, MLM + NSP) of a `mini` model (4 layers, 256 wide) on WikiText-2
   (valid + test articles, a new 8,000-piece WordPiece vocabulary), --steps steps of 32 x 128 tokens.
2. The student: `bertforge distill mlm` on the same corpus, its every other layer (2 of 4), written as a
   DistilBERT, for --steps steps, checkpointed every 100.
3. Both fine-tuned on the first --rows rows of SST-2's training set (2 epochs, seq 64), one seed, evaluated
   on the 872 dev sentences; the student's speed against the teacher's on the fused backend.

This shows the path works end to end at this scale (the rule set before measuring: the student "fine-tunes"
when its SST-2 dev accuracy is at least 0.65, as for the family's other end-to-end runs); it is not
DistilBERT's scale.

    python -m benchmarks.distill_mlm [--steps 400] [--rows 8000]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from bertforge.settings import DistillMLMConfig
from bertforge.training.finetune import FinetuneConfig, run_finetune
from bertforge.training.pretrain import PretrainConfig, run_pretrain

from .common import DATA, machine, need, save, sst2_train_rows, wikitext_corpus


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--rows", type=int, default=8000)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bf-distill-mlm-"))
    corpus = wikitext_corpus(work)
    train = sst2_train_rows(work, args.rows)
    loop = dict(seq_len=128, batch_size=32, lr=1e-3, warmup=0.06, max_steps=args.steps, eval_every=args.steps,
                eval_fraction=0.05, eval_batches=20, save_every=100, log_every=20, progress=False, seed=0)
    result = {"machine": machine(), "command": f"python -m benchmarks.distill_mlm --steps {args.steps} --rows {args.rows}"}
    started = time.perf_counter()
    teacher = run_pretrain(PretrainConfig(corpus=[str(corpus)], model="mini", out=str(work / "teacher"),
                                          vocab_size=8000, **loop), as_json=True)
    result["teacher_pretraining"] = {"eval": teacher["eval"], "seconds": round(time.perf_counter() - started)}
    started = time.perf_counter()
    student = run_pretrain(DistillMLMConfig(corpus=[str(corpus)], teacher=str(work / "teacher"),
                                            out=str(work / "student"), **loop), as_json=True)
    result["distillation"] = {"eval": student["eval"], "seconds": round(time.perf_counter() - started),
                              "checkpoints": sorted(p.name for p in (work / "student" / "checkpoints").iterdir()),
                              "architecture": json.loads((work / "student" / "config.json").read_text())["architectures"]}
    for name in ("teacher", "student"):
        tuned = run_finetune(FinetuneConfig(
            task="classify", model=str(work / name), train=str(train), dev=str(need(DATA / "glue/SST-2/dev.tsv")),
            out=str(work / f"{name}-sst2"), seq_len=64, batch_size=32, lr=1e-4, epochs=2, seed=0, progress=False),
            as_json=True)
        result[f"{name}_sst2_accuracy"] = tuned["accuracy"]
    result["student_fine_tunes"] = result["student_sst2_accuracy"] >= 0.65
    print(json.dumps(result, indent=2))
    print("saved", save("distill_mlm", result))


if __name__ == "__main__":
    main()
