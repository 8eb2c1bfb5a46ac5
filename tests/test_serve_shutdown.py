"""`bertforge serve` stops as a scheduler expects: SIGTERM under load drains (new requests get 503, those in
flight finish with 200), then the process exits 0; a port already taken is refused in one line before the
model loads, and the server says it is serving only once it is."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import threading
import time

import pytest

pytest.importorskip("fastapi")

from loadtest import run_load  # noqa: E402  (the suite's bounded loopback load generator)
from server_utils import call, running_server  # noqa: E402


def test_sigterm_under_load_drains_then_exits_0(minilm_dir):
    # Batches wait 300 ms for company, so at any moment several requests are in flight.
    with running_server(minilm_dir, "--batch-wait-ms", "300", "--shutdown-grace-s", "20") as (port, proc):
        signalled = []

        def stop_soon() -> None:
            time.sleep(2.0)
            signalled.append(time.perf_counter())
            proc.send_signal(signal.SIGTERM)

        threading.Thread(target=stop_soon, daemon=True).start()
        result = run_load("127.0.0.1", port, "/embed", {"texts": ["a sentence to embed while the server stops"]},
                          concurrency=8, duration=15, max_requests=400, stop_on=(503,))
        code = proc.wait(timeout=30)
        proc.log.seek(0)
        log = proc.log.read().decode()
    at = signalled[0] - result.started
    # Every request the server took was answered: 200 before and across the signal, 503 after it; none cut off.
    assert set(result.statuses) <= {200, 503} and result.statuses.get(503, 0) >= 1, result.summary()
    across = [row for row in result.timeline if row[0] < at < row[1]]
    # A request sent in the last moments before the signal may reach the server after it (on a loaded 2-core machine
    # CI measured one sent 4 ms before it, answered 503): those sent 50 ms earlier were taken before it.
    # The clients send in waves (a batch waits 300 ms), so a whole wave may have been sent within those 50 ms: then
    # none is "taken" by that rule, but some request in flight across the signal must still have finished with 200
    # (CI's red run: a wave sent 1.950 s in, the signal 10-50 ms later, each of the wave answered 200).
    taken = [row for row in across if row[0] < at - 0.05]
    assert any(status == 200 for _, _, status in across), result.timeline
    assert all(status == 200 for _, _, status in taken), result.timeline
    assert all(status in (200, 503) for _, _, status in across), result.timeline
    assert all(status == 503 for sent, _, status in result.timeline if sent > at + 0.5)  # (the handler runs promptly)
    assert code == 0, log
    assert "SIGTERM received: draining" in log and "drained (" in log and "Traceback" not in log


def test_health_answers_503_while_draining(minilm_dir):
    """A readiness probe sees the drain, so a load balancer stops sending here."""
    with running_server(minilm_dir, "--batch-wait-ms", "1500", "--shutdown-grace-s", "20") as (port, proc):
        slow = threading.Thread(target=call, args=(port, "/embed", {"texts": ["keeps the server draining"]}))
        slow.start()
        time.sleep(0.5)  # the request waits in its batch for 1.5 s
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        status, body = call(port, "/health")
        slow.join()
        assert status == 503 and "shutting down" in body["error"]
        assert proc.wait(timeout=30) == 0


def test_a_port_in_use_is_refused_in_one_line_before_loading(minilm_dir):
    with running_server(minilm_dir) as (taken, _):
        result = subprocess.run([sys.executable, "-m", "bertforge", "serve", "--model", str(minilm_dir), "--port",
                                 str(taken)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and f"cannot listen on 127.0.0.1:{taken}" in lines[0] and "--port" in lines[0], lines
    assert "serving" not in result.stderr


def test_requests_in_flight_past_the_grace_get_503_and_the_exit_is_bounded(minilm_dir):
    """Four large /embed requests (thousands of rows each: seconds of model work) and SIGTERM with a 1 s grace:
    each used to get a 500 and a CancelledError traceback, and the process ran on to the end of the batch in the
    model (64-270 s). Now every one is answered 503 with the shutdown message, no traceback is printed, and the
    process exits within the grace plus one batch (of at most 32 rows) of its last request."""
    texts = [f"sentence number {i} " + "with quite a few words in it to make the rows long " * 12 for i in range(2048)]
    with running_server(minilm_dir, "--shutdown-grace-s", "1") as (port, proc):
        answers: list[tuple[int, dict]] = []
        threads = [threading.Thread(target=lambda: answers.append(call(port, "/embed", {"inputs": texts})))
                   for _ in range(4)]
        for thread in threads:
            thread.start()
        time.sleep(1.0)  # the requests are in: one in the model, three waiting for it
        sent = time.perf_counter()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=60)
        took = time.perf_counter() - sent
        for thread in threads:
            thread.join(timeout=30)
        proc.log.seek(0)
        log = proc.log.read().decode()
    assert code == 0, log
    assert [status for status, _ in answers] == [503] * 4, (answers, log)
    assert all("shutting down" in body["error"] for _, body in answers)
    assert "Traceback" not in log and "CancelledError" not in log, log
    # Those the server had begun when the grace ended (the others were still sending their bodies, and got the
    # drain's 503 on arrival): every one answered 503, none cut off.
    assert re.search(r"stopped \([1-4] requests answered 503 at the end of the grace", log), log
    assert took < 1 + 10, (took, log)  # the grace, one batch, and uvicorn closing idle connections
