"""Where one embedding request's time goes: a single sentence through `bertforge serve`, stage by stage.

In one process, interleaved round by round (so every stage shares the machine's drift), for one SST-2 dev sentence
and all-MiniLM-L6-v2:

- tokenise: the tokenizer's call on one text (the server tokenises twice: once to count and check the length, once
  to build the batch);
- forward at 1 row, on every CPU backend bertforge has (fused, torch, fused-bf16, onnx, openvino where installed),
  and on `auto` as `serve` loads it ("auto-serve": one row to ONNX Runtime where it measured faster, batches to
  the batch path), the in-process latency a served query gets;
- pool + normalise, and JSON: the response body with the standard library and with orjson;
- the whole request through the HTTP server (`/v1/embeddings`, keep-alive client, loopback), whose remainder over the
  stages above is the server's own overhead (HTTP parsing, validation, the batcher's hand-off to its thread).

Reported: median microseconds of each stage over --repeats calls per round, medians over --rounds rounds; the
backends' forward times at --rows 1, 2, 4, 8, 16, 32, 64 as well, since a latency path must not lose the batches.

`--arch deberta-v2|modernbert` profiles a random model of DeBERTa-v3-base's or ModernBERT-base's shape instead (built
as `benchmarks.arch_speed` builds it), and adds the peer's graph: `latency_vs_infinity`'s ONNX export of transformers'
model (what infinity's ONNX Runtime engine serves), run by a plain ONNX Runtime session, so the one-row forward of
bertforge's default stands beside the engine it is measured against, in the same process.

    python -m benchmarks.latency_profile [--rounds 5] [--repeats 200] [--arch modernbert]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from .common import DATA, machine, minilm_dir, need, save

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))


def timed(fn, repeats: int) -> float:
    """Median microseconds of `fn()` over `repeats` calls (after 3 unmeasured ones)."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--rows", default="1,2,4,8,16,32,64")
    parser.add_argument("--backends", default="auto-serve,fused,torch,fused-bf16,onnx,openvino")
    parser.add_argument("--arch", choices=["minilm", "deberta-v2", "modernbert"], default="minilm",
                        help="all-MiniLM-L6-v2, or a random model of DeBERTa-v3-base's or ModernBERT-base's shape")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        if args.arch == "minilm":
            profile(args, minilm_dir(), None)
        else:
            from .arch_speed import build
            from .family_parity import texts as family_texts
            from .latency_vs_infinity import export_onnx

            model_dir = build(args.arch, Path(tmp), family_texts()[0])
            export_onnx(model_dir)
            profile(args, model_dir, model_dir / "onnx" / "model.onnx")


def peer_session(path: Path):
    """A plain ONNX Runtime session of the peer's graph on as many threads as torch uses, and the inputs it takes."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = torch.get_num_threads()
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return session, [i.name for i in session.get_inputs()]


def profile(args: argparse.Namespace, model_dir: Path, peer_onnx: Path | None) -> None:
    """Every stage of one request for the model in `model_dir`; with `peer_onnx`, that graph's one-row forward too."""
    from bertforge.inference import backends, pipelines
    from bertforge.interop.hf import load_pretrained, family_of
    from bertforge.interop.sentence_dir import sentence_pipeline
    from bertforge.tokenization.kinds import load_tokenizer

    torch.set_grad_enabled(False)
    lines = need(DATA / "glue" / "SST-2" / "dev.tsv").read_text(encoding="utf-8").splitlines()[1:]
    texts = [line.split("\t")[0] for line in lines]
    sentence = texts[0]
    tokenizer = load_tokenizer(model_dir)
    pipeline = sentence_pipeline(model_dir, json.loads((model_dir / "config.json").read_text())["hidden_size"])
    models = {}
    for name in args.backends.split(","):
        try:
            encoder = load_pretrained(family_of(model_dir).backbone, model_dir).eval()
            # auto-serve: `--backend auto` as `serve` loads it (one-row calls routed to ONNX Runtime where faster)
            models[name] = (backends.load(encoder, "auto", small_batches=True) if name == "auto-serve"
                            else backends.load(encoder, name))
        except Exception as exc:  # a backend this machine lacks (openvino not installed, no bf16): said, skipped
            print(f"{name}: skipped ({str(exc).splitlines()[0][:120]})", flush=True)
    rows = [int(r) for r in args.rows.split(",")]
    batches = {n: tokenizer(texts[:n], padding=True, return_tensors="pt", return_token_type_ids=True) for n in rows}
    peer = peer_session(peer_onnx) if peer_onnx is not None else None
    vector = pipelines.embed(models["torch"] if "torch" in models else next(iter(models.values())), tokenizer,
                             [sentence], sentence=pipeline)[0]
    body = {"object": "list", "data": [{"object": "embedding", "index": 0, "embedding": vector.tolist()}],
            "model": "minilm", "usage": {"prompt_tokens": 10, "total_tokens": 10}}
    try:
        import orjson
    except ImportError:
        orjson = None

    stages: dict[str, list[float]] = {}

    def record(name: str, value: float) -> None:
        stages.setdefault(name, []).append(value)

    from server_utils import running_server

    import http.client

    # a base-shaped model's server exports its graph at start (minutes on 2 cores, unless cached)
    with running_server(model_dir, "--served-model-name", "minilm", ready_s=900) as (port, _):
        payload = json.dumps({"model": "minilm", "input": [sentence]}).encode()
        conn = None

        def request() -> None:
            conn.request("POST", "/v1/embeddings", body=payload, headers={"Content-Type": "application/json"})
            answer = conn.getresponse()
            answer.read()
            if answer.status != 200:
                raise SystemExit(f"the server answered {answer.status}")

        for r in range(args.rounds):
            # A new keep-alive connection each round: the server closes one left idle while the stages run.
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
            record("http request, whole", timed(request, args.repeats))
            conn.close()
            record("tokenise 1 text", timed(lambda: tokenizer([sentence], truncation=True, max_length=256,
                                                              return_token_type_ids=True), args.repeats))
            for name, model in models.items():
                for n in rows:
                    batch = batches[n]
                    record(f"forward {name} x{n}", timed(lambda: model(
                        input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                        token_type_ids=batch["token_type_ids"]), max(10, args.repeats // n)))
                record(f"embed() {name} x1 (tokenise, forward, pool)", timed(
                    lambda: pipelines.embed(model, tokenizer, [sentence], sentence=pipeline), args.repeats))
            if peer is not None:  # the peer's graph at one row, fed what its tokenizer would give (the same ids)
                session, names = peer
                feeds = {k: batches[1][k].numpy() for k in names}
                record("forward peer-onnx x1", timed(lambda: session.run(None, feeds), args.repeats))
            record("json.dumps response", timed(lambda: json.dumps(body).encode(), args.repeats))
            if orjson is not None:
                record("orjson.dumps response", timed(lambda: orjson.dumps(body), args.repeats))
            print(f"round {r + 1}: " + ", ".join(f"{k} {v[-1]:.0f}" for k, v in stages.items()
                                               if not k.startswith("forward") or k.endswith(" x1")), flush=True)
    medians = {name: statistics.median(values) for name, values in stages.items()}
    model_name = "all-MiniLM-L6-v2" if args.arch == "minilm" else f"a random {args.arch} model of the base shape"
    result = {"machine": machine(), "model": model_name, "sentence_tokens": len(tokenizer(sentence)["input_ids"]),
              "rounds": args.rounds, "repeats": args.repeats, "median_us": medians, "per_round_us": stages}
    print(json.dumps({"median_us": {k: round(v) for k, v in medians.items()}}, indent=2))
    save("latency_profile" + ("" if args.arch == "minilm" else f"_{args.arch}"), result)


if __name__ == "__main__":
    main()
