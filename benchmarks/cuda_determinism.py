"""On a GPU: do two identical `bertforge pretrain` runs end with the same weights, without and with
`--deterministic`? And what does the flag cost at `base` size?

1. Two runs of a tiny model (L2-H64, bf16 autocast, 14 steps, the test suite's synthetic corpus and
   a 400-piece vocabulary trained on it), first without the flag, then with it: how many weight
   tensors differ between the twins, and by how much at most.
2. `base` bf16, B64 L128 on WikiText-2, 60 steps, without and with the flag in turn, two rounds: the
   median logged tokens/s of each run (steps after the 10th).

Run from the repo root where a GPU is present (it reads tests/corpus_utils.py, ../shared/data and the
all-MiniLM-L6-v2 package's tokenizer):

    python benchmarks/cuda_determinism.py
"""

import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file

sys.path[:0] = ["tests", "."]
from corpus_utils import write_corpus  # noqa: E402  (the suite's synthetic corpus)

from bertforge import Tokenizer  # noqa: E402
from benchmarks.common import minilm_dir, wikitext_articles  # noqa: E402

if not torch.cuda.is_available():
    sys.exit("benchmarks/cuda_determinism.py needs a GPU (torch.cuda.is_available() is False)")

work = Path(tempfile.mkdtemp())
corpus = write_corpus(work / "corpus.txt", n_docs=160, seed=7)
Tokenizer.train([corpus], vocab_size=400, min_frequency=1).save(work / "tok")
for flag in ([], ["--deterministic"]):
    outs = []
    for i in range(2):
        out = work / f"run{len(flag)}{i}"
        r = subprocess.run([sys.executable, "-m", "bertforge", "pretrain", str(corpus), "--tokenizer", str(work / "tok"),
                            "--model", "L2-H64", "--seq-len", "32", "--batch-size", "8", "--lr", "2e-3", "--warmup", "2",
                            "--seed", "3", "--workers", "1", "--max-steps", "14", "--eval-every", "14",
                            "--precision", "bf16", "--out", str(out), *flag], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr[-2000:]
        outs.append(load_file(str(out / "model.safetensors")))
    a, b = outs
    differ = [k for k in a if not torch.equal(a[k], b[k])]
    worst = max((float((a[k].float() - b[k].float()).abs().max()) for k in differ), default=0.0)
    print(f"flags {flag or ['(none)']}: {len(differ)} of {len(a)} tensors differ between two identical runs; "
          f"largest difference {worst:.3g}", flush=True)

text = work / "wiki.jsonl"
text.write_text("".join(json.dumps({"text": a}) + "\n" for a in wikitext_articles()))
rates: dict[str, list[float]] = {"plain": [], "deterministic": []}
for rnd in range(2):
    for name, flag in (("plain", []), ("deterministic", ["--deterministic"])):
        out = work / f"base-{name}-{rnd}"
        r = subprocess.run([sys.executable, "-m", "bertforge", "pretrain", str(text), "--tokenizer", str(minilm_dir()),
                            "--model", "base", "--seq-len", "128", "--batch-size", "64", "--max-steps", "60",
                            "--eval-every", "100000", "--save-every", "100000", "--log-every", "5", "--seed", "0",
                            "--out", str(out), *flag], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr[-2000:]
        rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        rates[name].append(statistics.median(x["tokens_per_s"] for x in rows if "tokens_per_s" in x and x["step"] > 10))
        print(name, rnd, round(rates[name][-1]), flush=True)
print("base bf16 B64 tokens/s, median of each run:", {k: [round(v) for v in vs] for k, vs in rates.items()},
      "deterministic / plain:", round(statistics.median(rates["deterministic"]) / statistics.median(rates["plain"]), 3))
