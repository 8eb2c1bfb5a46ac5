"""Bounded load test on loopback: `bertforge serve` against the server anyone would write first
(FastAPI + `SentenceTransformer.encode` per request, benchmarks/baseline_server.py).

    python -m benchmarks.load [--seconds 20] [--concurrency 1,16,64]

Both serve all-MiniLM-L6-v2 on 127.0.0.1 (free ports) and answer {"texts": [one SST-2 dev
sentence]} on /embed. For each concurrency, the two are loaded in turn (bertforge, then the
baseline) for a fixed time by that many keep-alive clients; so each level compares them under the
same drift of this shared machine. Reported: requests/s, p50/p99 latency, the status codes, and
each server's peak resident memory so far (VmHWM). Halfway through each bertforge run an
oversized body and malformed JSON are sent, and what they got is recorded. Last, an overload
phase: bertforge with --max-concurrent-requests 8 under 64 clients must answer 429 quickly, never
5xx, never hang. Writes benchmarks/results/load.json; every run stops by itself.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .common import DATA, machine, minilm_dir, need, save

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from server_utils import call, free_port, running_server, serving  # noqa: E402

from loadtest import run_load  # noqa: E402  (the suite's bounded loopback load generator)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--concurrency", default="1,16,64")
    args = parser.parse_args()
    lines = need(DATA / "glue" / "SST-2" / "dev.tsv").read_text(encoding="utf-8").splitlines()[1:]
    body = {"texts": [lines[0].split("\t")[0]]}
    bad = {"oversized": ("/embed", json.dumps({"texts": ["x" * 200_000]}).encode()),
           "malformed": ("/embed", b'{"texts": [')}
    rows = []
    base_port = free_port()
    baseline_cmd = [sys.executable, "-m", "benchmarks.baseline_server", str(minilm_dir()), str(base_port)]
    with running_server(minilm_dir(), "--max-body-bytes", "100000") as (port, proc), \
            serving(baseline_cmd, base_port) as base_proc:
        for p in (port, base_port):
            call(p, "/embed", body)  # warm up
        for level in (int(c) for c in args.concurrency.split(",")):
            ours = run_load("127.0.0.1", port, "/embed", body, concurrency=level, duration=args.seconds,
                            bad_requests=bad, server_pid=proc.pid).summary()
            theirs = run_load("127.0.0.1", base_port, "/embed", body, concurrency=level, duration=args.seconds,
                              server_pid=base_proc.pid).summary()
            row = {"concurrency": level, "bertforge": ours, "baseline": theirs,
                   "throughput_ratio": round(ours["requests_per_s"] / theirs["requests_per_s"], 2)}
            rows.append(row)
            print(json.dumps(row), flush=True)
        healthy = call(port, "/health")[0] == 200
    with running_server(minilm_dir(), "--max-concurrent-requests", "8") as (port, proc):
        call(port, "/embed", body)
        overload = run_load("127.0.0.1", port, "/embed", {"texts": body["texts"] * 32}, concurrency=64,
                            duration=min(args.seconds, 10.0), server_pid=proc.pid).summary()
        overload["healthy_after"] = call(port, "/health")[0] == 200
    print(json.dumps({"overload": overload}), flush=True)
    save("load", {"machine": machine(), "model": "all-MiniLM-L6-v2", "endpoint": "/embed, 1 sentence per request",
                  "baseline": "FastAPI + SentenceTransformer.encode per request (benchmarks/baseline_server.py)",
                  "seconds_per_level": args.seconds, "rows": rows, "healthy_after": healthy, "overload": overload})


if __name__ == "__main__":
    main()
