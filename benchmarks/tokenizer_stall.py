"""Does a slow tokenizer stall the server? `/health` latency while one request's tokenising backtracks.

A tiny ModernBERT directory (its tokenizer.json is read as it is) gets a pre-tokenizer that splits on the
backtracking expression `(a|a)+b`, as a hostile or careless tokenizer.json can. The server is started on loopback,
one `/embed` request with a long text of `a`s is sent from a thread, and `/health` is asked `--probes` times
meanwhile. Printed: each server's `/health` median and slowest answer while the request runs, and how and when the
slow request was answered. `--baseline-src DIR` also runs another source tree (an earlier commit's `src/`) the
same way, for an A/B; it gets no --request-timeout-s (a flag it may not have).

    python -m benchmarks.tokenizer_stall
    python -m benchmarks.tokenizer_stall --baseline-src ../old/src

Bounded: one slow request and `--probes` health calls per server, loopback only.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

from .common import machine, save


def hostile_model(root: Path) -> Path:
    """A one-layer random ModernBERT with a trained tokenizer whose pre-tokenizer backtracks."""
    import transformers

    from bertforge.tokenization.verbatim import VerbatimTokenizer

    words = "the a of and to in is was for on that with as by at from his her it an were".split()
    texts = [" ".join(words[(i * 7 + j) % len(words)] for j in range(12)) for i in range(400)]
    VerbatimTokenizer.train(texts=texts, vocab_size=300).save(root)
    vocab = json.loads((root / "tokenizer.json").read_text())["model"]["vocab"]
    config = transformers.ModernBertConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=1,
                                           num_attention_heads=2, intermediate_size=40, max_position_embeddings=512,
                                           pad_token_id=0, bos_token_id=1, cls_token_id=1, eos_token_id=2,
                                           sep_token_id=2)
    transformers.ModernBertModel(config).save_pretrained(root)
    spec = json.loads((root / "tokenizer.json").read_text())
    spec["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": "(a|a)+b"}, "behavior": "Isolated", "invert": False},
        spec["pre_tokenizer"]]}
    (root / "tokenizer.json").write_text(json.dumps(spec))
    return root


def measure(model: Path, src: str | None, flags: list[str], length: int, probes: int) -> dict:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from server_utils import call, free_port, serving

    port = free_port()
    prefix = ["env", f"PYTHONPATH={Path(src).resolve()}"] if src else []
    command = [*prefix, sys.executable, "-m", "bertforge", "serve", "--model", str(model), "--port", str(port), "--backend", "torch", "--max-chars", "1000000",
               *flags]
    with serving(command, port):
        slow = ("a" * 17 + " ") * (length // 18)
        answer: list = []

        def send() -> None:
            began = time.perf_counter()
            answer.append((*call(port, "/embed", {"inputs": slow, "truncate": True}), time.perf_counter() - began))

        worker = threading.Thread(target=send)
        worker.start()
        time.sleep(0.3)
        waits = []
        for _ in range(probes):
            began = time.perf_counter()
            call(port, "/health")
            waits.append(time.perf_counter() - began)
            time.sleep(0.2)
        worker.join(600)
    status, body, seconds = answer[0]
    return {"health_median_s": statistics.median(waits), "health_max_s": max(waits), "slow_status": status,
            "slow_answered_after_s": seconds, "slow_answer": str(body)[:160]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline-src", help="another source tree's src/ to run the same way (no timeout flag)")
    parser.add_argument("--length", type=int, default=54_000, help="characters of the slow text")
    parser.add_argument("--probes", type=int, default=10, help="/health calls while it runs")
    parser.add_argument("--timeout-s", type=float, default=2.0, help="this tree's --request-timeout-s")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model = hostile_model(Path(tmp) / "model")
        results = {"machine": machine(), "length": args.length, "probes": args.probes,
                   "bertforge": measure(model, None, ["--request-timeout-s", str(args.timeout_s)], args.length,
                                        args.probes)}
        if args.baseline_src:
            results["baseline"] = measure(model, args.baseline_src, [], args.length, args.probes)
    for name in ("bertforge", "baseline"):
        if name in results:
            r = results[name]
            print(f"{name:10s} /health median {r['health_median_s'] * 1e3:7.1f} ms, slowest {r['health_max_s'] * 1e3:7.1f}"
                  f" ms; slow request {r['slow_status']} after {r['slow_answered_after_s']:.1f} s")
    print(f"saved to {save('tokenizer_stall', results)}")


if __name__ == "__main__":
    main()
