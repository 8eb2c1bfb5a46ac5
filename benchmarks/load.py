"""Bounded load test of `bertforge serve` on loopback: requests/s, p50/p99 latency, errors, peak memory.

    python -m benchmarks.load [--seconds 20] [--concurrency 1,16,64]

Serves all-MiniLM-L6-v2 (/embed, one SST-2 dev sentence per request, the next one each run) on
127.0.0.1 and a free port, and for each concurrency runs that many keep-alive clients for a fixed
time. Halfway through each run it sends an oversized body and malformed JSON, and records what
they got. The server's peak resident memory (VmHWM) is read at the end of each run, so it is the
peak so far. Writes benchmarks/results/load.json.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .common import DATA, machine, minilm_dir, need, save

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from server_utils import call, running_server  # noqa: E402

from bertforge.loadtest import run_load  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--concurrency", default="1,16,64")
    args = parser.parse_args()
    lines = need(DATA / "glue" / "SST-2" / "dev.tsv").read_text(encoding="utf-8").splitlines()[1:]
    sentence = lines[0].split("\t")[0]
    rows = []
    with running_server(minilm_dir(), "--max-body-bytes", "100000") as (port, proc):
        call(port, "/embed", {"texts": [sentence]})  # warm up
        for level in (int(c) for c in args.concurrency.split(",")):
            bad = {"oversized": ("/embed", json.dumps({"texts": ["x" * 200_000]}).encode()),
                   "malformed": ("/embed", b'{"texts": [')}
            result = run_load("127.0.0.1", port, "/embed", {"texts": [sentence]}, concurrency=level,
                              duration=args.seconds, bad_requests=bad, server_pid=proc.pid)
            rows.append(result.summary())
            print(json.dumps(rows[-1]), flush=True)
        rows.append({"healthy_after": call(port, "/health")[0] == 200})
    print(json.dumps(rows[-1]))
    save("load", {"machine": machine(), "model": "all-MiniLM-L6-v2", "endpoint": "/embed, 1 sentence per request",
                  "seconds_per_level": args.seconds, "rows": rows})


if __name__ == "__main__":
    main()
