"""Starting `bertforge serve` for real on a free loopback port, and calling it over HTTP."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from conftest import SERVE_KEY as KEY  # the `embedder` server's API key


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def call(port: int, path: str, body: bytes | dict | None = None, method: str | None = None) -> tuple[int, dict]:
    data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, method=method,
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


@contextlib.contextmanager
def serving(command: list[str], port: int, ready_path: str = "/health",
            ready_s: float = 120) -> Iterator[subprocess.Popen]:
    """Run a server command until `ready_path` answers 200 on 127.0.0.1:`port` (within `ready_s`); stop it
    afterwards."""
    # The server's output goes to a file, not a pipe: nobody reads a pipe while the server runs, and
    # once its buffer (64 KB) is full of access-log lines, the server would block writing the next.
    log = tempfile.TemporaryFile()
    proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ, PYTHONWARNINGS="ignore"))
    proc.log = log  # the server's output so far: proc.log.seek(0); proc.log.read()
    try:
        deadline = time.time() + ready_s
        while True:
            try:
                if call(port, ready_path)[0] == 200:
                    break
            except OSError:
                time.sleep(0.3)
            if proc.poll() is not None:
                log.seek(0)
                raise RuntimeError(log.read().decode())
            if time.time() > deadline:
                log.seek(0)
                raise TimeoutError(f"the server did not answer {ready_path} within {ready_s:g} s; it said:\n"
                                   + log.read().decode(errors="replace")[-3000:])
        yield proc
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


@contextlib.contextmanager
def running_server(model_dir: Path, *flags: str, ready_s: float = 120) -> Iterator[tuple[int, subprocess.Popen]]:
    """`bertforge serve` on 127.0.0.1 and a free port; yields (port, process) once /health answers (within
    `ready_s`)."""
    port = free_port()
    with serving([sys.executable, "-m", "bertforge", "serve", "--model", str(model_dir), "--port", str(port),
                  *flags], port, ready_s=ready_s) as proc:
        yield port, proc


def post(port: int, path: str, body, key: str | None = KEY, content_type: str = "application/json"):
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = {"Content-Type": content_type} | ({"Authorization": f"Bearer {key}"} if key else {})
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())
