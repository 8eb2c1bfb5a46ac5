"""Single-request latency and throughput: `bertforge serve` against infinity-emb (torch and ONNX Runtime engines).

infinity-emb is the Python embedding server users pick instead of bertforge. It pins typer < 0.13, so it lives in its
own virtual environment, named by `--infinity` (its `infinity_emb` executable):

    python -m venv ../infinity-venv && ../infinity-venv/bin/pip install torch==2.13.0 \\
        && ../infinity-venv/bin/pip install "infinity-emb[server,torch,optimum]==0.0.78"
    python -m benchmarks.latency_vs_infinity --infinity ../infinity-venv/bin/infinity_emb [--rounds 3] \
        [--bertforge-backends auto,fused]
    python -m benchmarks.latency_vs_infinity --baseline-src ../old/src --out latency_guard_ab   # an A/B of code
    python -m benchmarks.latency_vs_infinity --infinity ... --arch deberta-v2 --engines torch   # a base shape
    python -m benchmarks.latency_vs_infinity --isa avx2 --bertforge-backends auto,fused,torch   # AVX2's kernels

Every server serves the same model (all-MiniLM-L6-v2, copied to a scratch folder so that no engine writes beside
the installed one; or, with --arch, a random-weight model of DeBERTa-v3-base's or ModernBERT-base's shape with a
tokenizer of its kind trained on WikiText-2, built as `benchmarks.arch_speed` builds it) on 127.0.0.1 with the same threads (OMP_NUM_THREADS / MKL_NUM_THREADS = --threads), and is asked
through the same OpenAI-style route (bertforge's /v1/embeddings, infinity's /embeddings). Three measures, each run on
every server in turn inside each round (the order rotating), so every comparison shares the machine's drift:

- single: one SST-2 dev sentence per request, sent one after another (--single requests, >= 200): p50 and p99 ms;
- clients: 16 keep-alive clients sending 8 sentences per request for --seconds: sentences/s and request p99;
- bulk: the SST-2 dev set (872 sentences) in requests of 64, one after another: sentences/s.

Reported: each measure's per-round values and medians, and bertforge's ratio against the best peer (latency: the
peer's over bertforge's, so > 1 means bertforge is faster). Load is bounded in count and time and goes to loopback
only. Writes benchmarks/results/latency_vs_infinity[_ARCH][_avx2].json (or --out).

--isa avx2 runs every server with ATen, oneDNN and MKL capped at AVX2 (ATEN_CPU_CAPABILITY, ONEDNN_MAX_CPU_ISA,
MKL_ENABLE_INSTRUCTIONS; bertforge's native kernels follow ATen's capability and are built for it first): the
kernels an AVX2 machine runs, on this machine's cores and caches. ONNX Runtime has no such cap and keeps its
AVX-512 kernels, so the one-row figures favour it; the batch path's choice (fused or eager) is the part this tests.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .common import DATA, machine, minilm_dir, need, save
from .helpers.family import NAMES

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from server_utils import call, free_port, serving  # noqa: E402

from loadtest import run_load  # noqa: E402  (the suite's bounded loopback load generator)

MODEL_NAME = "model"
ISA_CAPS = {"avx2": {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}}


def sentences() -> list[str]:
    lines = need(DATA / "glue" / "SST-2" / "dev.tsv").read_text(encoding="utf-8").splitlines()[1:]
    return [line.split("\t")[0] for line in lines]


def for_transformers4(model: Path) -> Path:
    """`model` as infinity's transformers 4 reads it: transformers 5 saves a plain tokenizer.json tokenizer as
    `TokenizersBackend`, a class transformers 4 does not have; there it is `PreTrainedTokenizerFast`, which reads the
    same tokenizer.json. A sibling directory of links with that one field changed (the original stays as saved)."""
    config = json.loads((model / "tokenizer_config.json").read_text(encoding="utf-8"))
    if config.get("tokenizer_class") != "TokenizersBackend":
        return model
    copy = model.with_name(model.name + "-transformers4")
    # Real folders, linked files: infinity finds the ONNX export by a glob that does not enter linked folders.
    shutil.copytree(model.resolve(), copy, copy_function=os.symlink)
    (copy / "tokenizer_config.json").unlink()
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    (copy / "tokenizer_config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
    return copy


def servers(model: Path, infinity: str | None, threads: int, engines: list[str],
            backends: list[str], baseline_src: str | None = None) -> dict[str, tuple[list[str], str]]:
    """name -> (command, embeddings route) for every server compared; the port is filled in when each starts.
    bertforge's default backend is named "bertforge", any other "bertforge-<backend>"; `baseline_src` adds
    "bertforge-baseline", the first backend served by the bertforge source tree there (another commit)."""
    out = {}
    serve = [sys.executable, "-m", "bertforge", "serve", "--model", str(model), "--served-model-name", MODEL_NAME,
             "--port", "{port}", "--backend"]
    for backend in backends:
        out["bertforge" if backend == backends[0] else f"bertforge-{backend}"] = (serve + [backend], "/v1/embeddings")
    if baseline_src:
        out["bertforge-baseline"] = (["env", f"PYTHONPATH={Path(baseline_src).resolve()}"] + serve + [backends[0]],
                                     "/v1/embeddings")
    if infinity:
        readable = for_transformers4(model)
        for engine in engines:
            out[f"infinity-{engine}"] = ([infinity, "v2", "--model-id", str(readable), "--served-model-name",
                                          MODEL_NAME, "--engine", engine, "--device", "cpu", "--host", "127.0.0.1",
                                          "--port", "{port}", "--batch-size", "64"], "/embeddings")
    return out


def bulk(port: int, route: str, texts: list[str], size: int = 64) -> float:
    """Sentences per second embedding `texts` in requests of `size`, one after another."""
    start = time.perf_counter()
    for i in range(0, len(texts), size):
        status, body = call(port, route, {"model": MODEL_NAME, "input": texts[i:i + size]})
        if status != 200 or len(body["data"]) != len(texts[i:i + size]):
            raise SystemExit(f"bulk request failed on port {port}: {status} {str(body)[:300]}")
    return len(texts) / (time.perf_counter() - start)


def measure(port: int, route: str, pid: int, texts: list[str], single: int, seconds: float) -> dict[str, float]:
    one = run_load("127.0.0.1", port, route, {"model": MODEL_NAME, "input": [texts[0]]}, concurrency=1,
                   duration=120.0, max_requests=single, server_pid=pid)
    many = run_load("127.0.0.1", port, route, {"model": MODEL_NAME, "input": texts[1:9]}, concurrency=16,
                    duration=seconds, server_pid=pid)
    if one.errors or many.errors:
        raise SystemExit(f"errors on port {port}: {one.statuses} {many.statuses}")
    return {"single_p50_ms": one.percentile(50), "single_p99_ms": one.percentile(99),
            "clients_sentences_per_s": many.requests_per_s * 8, "clients_p99_ms": many.percentile(99),
            "bulk_sentences_per_s": bulk(port, route, texts)}


def export_onnx(model: Path) -> None:
    """onnx/model.onnx beside the model, as the Hub repository ships it for infinity's ONNX Runtime engine (inputs
    input_ids, attention_mask, token_type_ids; output last_hidden_state; batch and length dynamic), exported from
    transformers' own model by torch's ONNX exporter and checked against it. (optimum's exporter is what made the Hub
    file; the optimum release infinity 0.0.78 runs with cannot export under torch 2.13.)"""
    import numpy as np
    import onnxruntime
    import torch
    import transformers

    encoder = transformers.AutoModel.from_pretrained(model, attn_implementation="eager").eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(model)

    # the inputs the model's tokenizer gives (ModernBERT has no segment ids), in the order the Hub files name them
    example = tokenizer(["an example", "a longer example sentence to export"], padding=True, return_tensors="pt")
    names = [n for n in ("input_ids", "attention_mask", "token_type_ids") if n in example]

    class LastHidden(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.encoder = encoder

        def forward(self, input_ids, attention_mask, token_type_ids=None):
            segments = {} if token_type_ids is None else {"token_type_ids": token_type_ids}
            return self.encoder(input_ids=input_ids, attention_mask=attention_mask, **segments).last_hidden_state

    (model / "onnx").mkdir()
    axes = {name: {0: "batch_size", 1: "sequence_length"} for name in names + ["last_hidden_state"]}
    torch.onnx.export(LastHidden().eval(), tuple(example[n] for n in names), str(model / "onnx" / "model.onnx"),
                      input_names=names, output_names=["last_hidden_state"], dynamic_axes=axes, opset_version=18,
                      dynamo=True, external_data=False)
    texts = ["one two three four five six seven eight nine", "x", "a b"]
    batch = tokenizer(texts, padding=True, return_tensors="np")
    got = onnxruntime.InferenceSession(str(model / "onnx" / "model.onnx")).run(
        None, {n: batch[n].astype(np.int64) for n in names})[0]
    with torch.no_grad():
        want = encoder(**tokenizer(texts, padding=True, return_tensors="pt")).last_hidden_state.numpy()
    real = batch["attention_mask"][..., None].astype(bool)
    if np.abs(np.where(real, got - want, 0)).max() > 1e-4:
        raise SystemExit("the ONNX export does not match transformers' model")


LOWER_IS_BETTER = ("single_p50_ms", "single_p99_ms", "clients_p99_ms")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--infinity", help="infinity-emb's `infinity_emb` executable (its own venv); without it, "
                                           "bertforge alone")
    parser.add_argument("--engines", default="torch,optimum", help="infinity engines (optimum: ONNX Runtime)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--single", type=int, default=200, help="sequential single-sentence requests per round")
    parser.add_argument("--seconds", type=float, default=15.0, help="length of the 16-client load per round")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--bertforge-backends", default="auto",
                        help="bertforge serve --backend values; the first is the one compared (its default)")
    parser.add_argument("--baseline-src", help="a bertforge source tree (another commit's src/) served beside this "
                                               "one with the first backend: an A/B of code changes")
    parser.add_argument("--arch", choices=["minilm", "deberta-v2", "modernbert"], default="minilm",
                        help="all-MiniLM-L6-v2, or a random model of DeBERTa-v3-base's or ModernBERT-base's shape")
    parser.add_argument("--isa", choices=sorted(ISA_CAPS), help="cap every server's torch kernels at this ISA")
    parser.add_argument("--out", help="results file name in benchmarks/results/ (default from --arch and --isa)")
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    texts = sentences()
    out = args.out or "latency_vs_infinity" + (f"_{args.arch}" if args.arch != "minilm" else "") + (
        f"_{args.isa}" if args.isa else "")
    os.environ.update(OMP_NUM_THREADS=str(args.threads), MKL_NUM_THREADS=str(args.threads),
                      INFINITY_ANONYMOUS_USAGE_STATS="0", DO_NOT_TRACK="1", HF_HUB_OFFLINE="1")
    os.environ.update(ISA_CAPS.get(args.isa, {}))
    if args.isa:  # built before the servers start, so that none spends its start-up compiling them
        subprocess.run([sys.executable, "-m", "bertforge", "kernels", "build"], check=True)
    with tempfile.TemporaryDirectory() as tmp:
        if args.arch == "minilm":
            model = Path(tmp) / "all-MiniLM-L6-v2"
            shutil.copytree(minilm_dir(), model)
        else:
            from .helpers.family import build, texts as family_texts

            model = build(args.arch, Path(tmp), family_texts()[0])
        if args.infinity and "optimum" in args.engines:
            export_onnx(model)
        commands = servers(model, args.infinity, args.threads, args.engines.split(","),
                           args.bertforge_backends.split(","), args.baseline_src)
        results: dict[str, dict[str, list[float]]] = {name: {} for name in commands}
        started = {}
        # All servers run at once (idle ones cost memory, not CPU), so the rounds can interleave them.
        with contextlib.ExitStack() as stack:
            for name, (command, route) in commands.items():
                port = free_port()
                # a base-shaped model's first start exports and times it (minutes on 2 busy cores)
                proc = stack.enter_context(serving([c.replace("{port}", str(port)) for c in command], port,
                                                   ready_s=900))
                started[name] = (port, route, proc.pid)
                for _ in range(5):  # warm-up: the first calls load kernels and build graphs
                    bulk(port, route, texts[:64], 64)
                print(f"{name} ready on {port}", flush=True)
            names = list(started)
            for r in range(args.rounds):
                order = names[r % len(names):] + names[:r % len(names)]
                for name in order:
                    port, route, pid = started[name]
                    row = measure(port, route, pid, texts, args.single, args.seconds)
                    for key, value in row.items():
                        results[name].setdefault(key, []).append(value)
                    print(f"round {r + 1} {name}: " + ", ".join(f"{k} {v:.1f}" for k, v in row.items()), flush=True)
                # saved after every round: a run stopped part-way (these take up to an hour) keeps its whole rounds
                summary = summarise(results, args, r + 1)
                save(out, summary)
    print(json.dumps({k: v for k, v in summary.items() if k in ("medians", "bertforge_vs_best_peer",
                                                                 "bertforge_vs_baseline")}, indent=2))


def summarise(results: dict[str, dict[str, list[float]]], args: argparse.Namespace, rounds_done: int) -> dict:
    """Medians over the rounds done, and bertforge's ratios against the peers (> 1 means bertforge leads)."""
    medians = {name: {k: statistics.median(v) for k, v in row.items()} for name, row in results.items()}

    def against(peers: list[str]) -> dict[str, float]:
        """bertforge's median over the best of `peers`' (latency: theirs over ours), so > 1 means bertforge leads."""
        ratios = {}
        for key in medians["bertforge"] if peers else ():
            ours = medians["bertforge"][key]
            if key in LOWER_IS_BETTER:
                ratios[key] = min(medians[p][key] for p in peers) / ours
            else:
                ratios[key] = ours / max(medians[p][key] for p in peers)
        return ratios

    shape = {"minilm": "all-MiniLM-L6-v2"}.get(args.arch) or f"{NAMES[args.arch]}-shaped, random weights"
    result = {"machine": machine(), "model": shape, "isa_caps": ISA_CAPS.get(args.isa, {}), "threads": args.threads,
              "command": "python -m benchmarks.latency_vs_infinity " + " ".join(sys.argv[1:]), "rounds": args.rounds,
              "rounds_done": rounds_done, "single_requests": args.single, "client_seconds": args.seconds,
              "per_round": results, "medians": medians,
              "bertforge_vs_best_peer": against([n for n in medians if not n.startswith("bertforge")])}
    if args.baseline_src:
        result.update(baseline_src=args.baseline_src, bertforge_vs_baseline=against(["bertforge-baseline"]))
    return result


if __name__ == "__main__":
    main()
