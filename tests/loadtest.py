"""A bounded load generator for `bertforge serve`, for loopback addresses only.

`run_load` starts `concurrency` client threads, each with its own keep-alive connection, that
send the same request again and again until `duration` seconds have passed or `max_requests`
have been sent, whichever comes first; it stops by itself. A client stops early on a status in
`stop_on` (a draining server's 503: a real client would go to another replica) or when the server
no longer takes connections. Halfway through, it also sends the
bad requests it is given (an oversized body, malformed JSON) and records what they got, so a
run shows whether one bad request disturbs the others. It refuses any host that is not a
loopback address: load is only ever sent to this machine.
"""

from __future__ import annotations

import http.client
import ipaddress
import json
import socket
import statistics
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from bertforge.errors import InputError


@dataclass
class LoadResult:
    """What one run measured. Latencies are in milliseconds; `statuses` counts every normal request's answer."""

    concurrency: int
    seconds: float
    requests: int
    statuses: dict[int, int]
    latencies_ms: list[float] = field(repr=False)
    bad_requests: dict[str, int] = field(default_factory=dict)  # name -> status it got
    server_peak_rss_mb: float | None = None
    timeline: list[tuple[float, float, int]] = field(default_factory=list, repr=False)  # (sent, answered, status) s
    refused: int = 0  # connections the server no longer took (it had stopped listening): never sent
    started: float = 0.0  # time.perf_counter() when the clients began; the timeline counts from here

    @property
    def requests_per_s(self) -> float:
        return self.requests / self.seconds

    def percentile(self, q: float) -> float:
        values = sorted(self.latencies_ms)
        return values[min(len(values) - 1, int(q / 100 * len(values)))] if values else float("nan")

    @property
    def errors(self) -> int:
        return sum(n for status, n in self.statuses.items() if status >= 400)

    def summary(self) -> dict:
        return {"concurrency": self.concurrency, "seconds": round(self.seconds, 2), "requests": self.requests,
                "requests_per_s": round(self.requests_per_s, 2), "p50_ms": round(self.percentile(50), 1),
                "p99_ms": round(self.percentile(99), 1),
                "mean_ms": round(statistics.fmean(self.latencies_ms), 1) if self.latencies_ms else None,
                "errors": self.errors, "server_errors_5xx": sum(n for s, n in self.statuses.items() if s >= 500),
                "statuses": {str(k): v for k, v in sorted(self.statuses.items())},
                "bad_requests": self.bad_requests, "server_peak_rss_mb": self.server_peak_rss_mb}


def check_loopback(host: str) -> None:
    """Refuse any target that is not this machine."""
    try:
        address = ipaddress.ip_address(socket.gethostbyname(host))
    except (OSError, ValueError):
        raise InputError(f"load target {host!r} cannot be resolved") from None
    if not address.is_loopback:
        raise InputError(f"load target {host} ({address}) is not a loopback address; load tests stay on this machine")


def peak_rss_mb(pid: int) -> float | None:
    """The peak resident memory of process `pid` so far (Linux's VmHWM), in MiB."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def _send(conn: http.client.HTTPConnection, path: str, body: bytes) -> int:
    conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
    response = conn.getresponse()
    response.read()
    return response.status


def run_load(host: str, port: int, path: str, body: dict, concurrency: int, duration: float = 10.0,
             max_requests: int = 100_000, bad_requests: dict[str, tuple[str, bytes]] | None = None,
             server_pid: int | None = None, timeout: float = 60.0, stop_on: tuple[int, ...] = ()) -> LoadResult:
    """Send `body` to `path` from `concurrency` clients for `duration` seconds (at most `max_requests`).

    Status 599 stands for a request that got no answer (the connection failed after it was sent)."""
    check_loopback(host)
    if not 1 <= concurrency <= 1024 or not 0 < duration <= 600:
        raise InputError("concurrency must be 1..1024 and duration 0..600 s")
    payload = json.dumps(body).encode()
    lock = threading.Lock()
    latencies: list[float] = []
    statuses: dict[int, int] = {}
    sent = [0]
    timeline: list[tuple[float, float, int]] = []
    refused = [0]
    start = time.perf_counter()
    deadline = start + duration

    def client() -> None:
        conn = http.client.HTTPConnection(host, port, timeout=timeout)
        try:
            while time.perf_counter() < deadline:
                with lock:
                    if sent[0] >= max_requests:
                        return
                    sent[0] += 1
                t0 = time.perf_counter()
                try:
                    status = _send(conn, path, payload)
                except ConnectionRefusedError:  # nothing listens any more: the request was never sent
                    with lock:
                        sent[0] -= 1
                        refused[0] += 1
                    return
                except (OSError, http.client.HTTPException):
                    status = 599  # no answer: counted as an error, and the connection is made again
                    conn.close()
                    conn = http.client.HTTPConnection(host, port, timeout=timeout)
                t1 = time.perf_counter()
                with lock:
                    latencies.append((t1 - t0) * 1000)
                    statuses[status] = statuses.get(status, 0) + 1
                    timeline.append((t0 - start, t1 - start, status))
                if status in stop_on:
                    return
        finally:
            conn.close()

    bad_results: dict[str, int] = {}

    def saboteur() -> None:
        time.sleep(duration / 2)
        for name, (bad_path, bad_body) in (bad_requests or {}).items():
            conn = http.client.HTTPConnection(host, port, timeout=timeout)
            try:
                bad_results[name] = _send(conn, bad_path, bad_body)
            except (OSError, http.client.HTTPException):
                bad_results[name] = 599
            finally:
                conn.close()

    threads = [threading.Thread(target=client, daemon=True) for _ in range(concurrency)]
    if bad_requests:
        threads.append(threading.Thread(target=saboteur, daemon=True))
    for t in threads:
        t.start()
    for t in threads:
        t.join(duration + timeout + 5)
    seconds = time.perf_counter() - start
    return LoadResult(concurrency, seconds, len(latencies), statuses, latencies, bad_results,
                      peak_rss_mb(server_pid) if server_pid else None, sorted(timeline), refused[0], start)
