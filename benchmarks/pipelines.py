"""`bertforge.pipeline` against transformers' `pipeline`, side by side, on the same directories and inputs.

all-MiniLM-L6-v2's encoder with a seeded random head of each kind (a masked-LM head, a 2-label classifier),
saved once; SST-2 dev sentences (872; fill-mask: the first 200 with their third word masked). Both libraries
run in this process with 2 threads, batch 32, their passes interleaved, and each task's answers are compared
(largest score difference; the same labels and tokens). Figures are medians of --repeats passes.

    python -m benchmarks.pipelines [--repeats 5]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

import bertforge

from .common import DATA, machine, minilm_dir, need, save


def sst2() -> list[str]:
    rows = need(DATA / "glue/SST-2/dev.tsv").read_text(encoding="utf-8").splitlines()[1:]
    return [r.split("\t")[0] for r in rows]


def checkpoints(root: Path) -> dict[str, Path]:
    """MiniLM's encoder under a seeded masked-LM head and a seeded 2-label classifier, with its tokenizer."""
    import shutil

    source = minilm_dir()
    out = {}
    for name, cls, extra in (("mlm", bertforge.BertForMaskedLM, {}),
                             ("cls", bertforge.BertForSequenceClassification, {"num_labels": 2})):
        torch.manual_seed(0)
        model = cls.from_pretrained(source, **extra)
        model.save_pretrained(root / name)
        for file in ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
            if (source / file).is_file():
                shutil.copy(source / file, root / name / file)
        out[name] = root / name
    return out


def difference(a, b) -> float:
    """The largest score difference between two answers of the same structure (inf if labels or tokens differ)."""
    if isinstance(a, dict):
        if {k: v for k, v in a.items() if k != "score"} != {k: v for k, v in b.items() if k != "score"}:
            return float("inf")
        return abs(float(a["score"]) - float(b["score"]))
    if isinstance(a, list):
        if len(a) != len(b):
            return float("inf")
        return max((difference(x, y) for x, y in zip(a, b)), default=0.0)
    return abs(float(a) - float(b))


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    import transformers

    torch.set_num_threads(2)
    texts = sst2()
    masked = []
    for text in texts[:200]:
        words = text.split()
        masked.append(" ".join(words[:2] + ["[MASK]"] + words[3:]) if len(words) > 3 else text + " [MASK]")
    with tempfile.TemporaryDirectory() as tmp:
        dirs = checkpoints(Path(tmp))
        tasks = {"text-classification": ("cls", texts, {}), "fill-mask": ("mlm", masked, {"top_k": 5}),
                 "feature-extraction": ("mlm", texts, {})}
        result = {"machine": machine(), "torch": torch.__version__, "transformers": transformers.__version__,
                  "threads": 2, "batch_size": 32, "repeats": args.repeats, "tasks": {}}
        for task, (which, inputs, options) in tasks.items():
            runners = {"transformers": transformers.pipeline(task, model=str(dirs[which]), batch_size=32),
                       "bertforge": bertforge.pipeline(task, model=str(dirs[which]), batch_size=32)}
            answers = {name: run(inputs[:8], **options) for name, run in runners.items()}  # warm-up
            times: dict[str, list[float]] = {name: [] for name in runners}
            for r in range(args.repeats):
                for name in (list(runners) if r % 2 == 0 else list(runners)[::-1]):  # interleaved, alternating
                    start = time.perf_counter()
                    answers[name] = runners[name](inputs, **options)
                    times[name].append(time.perf_counter() - start)
            if task == "feature-extraction":  # [1, T, H] nested lists, compared at each text's own tokens: with
                # batch_size > 1, transformers' answer keeps the batch's padding positions after them
                diff = max(float((torch.tensor(a)[:, :len(b[0])] - torch.tensor(b)).abs().max())
                           for a, b in zip(answers["transformers"], answers["bertforge"]))
            else:
                diff = difference(answers["transformers"], answers["bertforge"])
            medians = {name: statistics.median(t) for name, t in times.items()}
            row = {"inputs": len(inputs), "seconds": medians,
                   "speedup": medians["transformers"] / medians["bertforge"], "largest_difference": diff}
            result["tasks"][task] = row
            print(f"{task:20s} transformers {medians['transformers']:.2f} s  bertforge {medians['bertforge']:.2f} s  "
                  f"x{row['speedup']:.2f}  largest difference {diff:.1e}", flush=True)
    save("pipelines", result)
    return result


if __name__ == "__main__":
    main()
