"""The server's guard as ASGI middleware, around stand-in applications (no model, no socket): what reaches the
application, what is refused before it, and what the metrics count."""

from __future__ import annotations

import asyncio
import json

import pytest

pytest.importorskip("fastapi")

from bertforge.server.app import Drain, error_response  # noqa: E402
from bertforge.server.guard import Guard  # noqa: E402
from bertforge.server.metrics import ServerMetrics  # noqa: E402
from bertforge.server.service import Limits  # noqa: E402

SHUTTING_DOWN = ("shutting down", {"Connection": "close"})


def scope(method: str = "POST", path: str = "/embed", headers: dict | None = None) -> dict:
    headers = {"content-type": "application/json", **(headers or {})}
    return {"type": "http", "method": method, "path": path, "raw_path": path.encode(), "query_string": b"",
            "root_path": "", "scheme": "http", "server": ("127.0.0.1", 8000), "client": ("127.0.0.1", 5000),
            "http_version": "1.1", "headers": [(k.encode(), v.encode()) for k, v in headers.items()]}


def run(app, scope_: dict, chunks: list[bytes]) -> tuple[list[dict], list[dict]]:
    """Call `app` with the body in `chunks`; (the messages it sent, the messages it was given)."""
    given, sent = [], []
    queue = [{"type": "http.request", "body": c, "more_body": i < len(chunks) - 1} for i, c in enumerate(chunks)]

    async def receive():
        message = queue.pop(0) if queue else {"type": "http.disconnect"}
        given.append(message)
        return message

    async def send(message):
        sent.append(message)

    asyncio.run(app(scope_, receive, send))
    return sent, given


def guard(inner, metrics: ServerMetrics, drain: Drain | None = None, max_body_bytes: int = 100) -> Guard:
    return Guard(inner, limits=Limits(max_body_bytes=max_body_bytes), drain=drain or Drain(), metrics=metrics,
                 error=error_response, shutting_down=SHUTTING_DOWN, routes=lambda: [])


def counted(metrics: ServerMetrics) -> dict[tuple[str, str], float]:
    return {(s.labels["path"], s.labels["status"]): s.value for m in metrics.requests.collect() for s in m.samples
            if s.name.endswith("_total")}


def test_the_application_gets_the_whole_body_once_then_the_connection():
    seen = []

    async def echo(scope_, receive, send):
        seen.append(await receive())
        seen.append(await receive())  # a long request listens for the client leaving
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    metrics = ServerMetrics()
    sent, given = run(guard(echo, metrics), scope(), [b'{"texts":', b' ["a"]', b"}"])
    assert seen == [{"type": "http.request", "body": b'{"texts": ["a"]}', "more_body": False},
                    {"type": "http.disconnect"}]
    assert sent[0]["status"] == 200 and counted(metrics) == {("unmatched", "200"): 1.0}


def test_a_body_past_the_limit_is_refused_without_reading_the_rest():
    async def never(scope_, receive, send):
        raise AssertionError("the application must not be called")

    metrics = ServerMetrics()
    sent, given = run(guard(never, metrics, max_body_bytes=100), scope(), [b"x" * 60, b"x" * 60, b"x" * 60])
    assert sent[0]["status"] == 413 and len(given) == 2  # the third chunk was never asked for
    assert json.loads(sent[1]["body"])["error"] == "request body exceeds the limit of 100 bytes (--max-body-bytes)"
    # a declared length over the limit is refused before any of the body is read
    sent, given = run(guard(never, metrics), scope(headers={"content-length": "101"}), [b"x" * 101])
    assert sent[0]["status"] == 413 and given == [] and "of 101 bytes" in json.loads(sent[1]["body"])["error"]
    assert counted(metrics) == {("unmatched", "413"): 2.0}


def test_an_application_error_is_counted_as_a_500_and_raised_on():
    async def broken(scope_, receive, send):
        raise RuntimeError("a bug")

    metrics, drain = ServerMetrics(), Drain()
    with pytest.raises(RuntimeError, match="a bug"):  # Starlette's outer error middleware answers it 500
        run(guard(broken, metrics, drain), scope(method="GET", path="/health"), [b""])
    assert counted(metrics) == {("unmatched", "500"): 1.0} and drain.in_flight == 0


def test_a_draining_server_answers_503_without_the_application():
    async def never(scope_, receive, send):
        raise AssertionError("the application must not be called")

    metrics, drain = ServerMetrics(), Drain()
    drain.since = 0.0  # a stop has begun
    sent, _ = run(guard(never, metrics, drain), scope(method="GET", path="/health"), [b""])
    assert sent[0]["status"] == 503 and (b"connection", b"close") in sent[0]["headers"]
    assert counted(metrics) == {("unmatched", "503"): 1.0}


def test_serve_moves_what_start_up_made_out_of_the_collectors_reach(monkeypatch):
    """`serve` freezes the objects start-up made before it takes requests, so that a full collection (114 ms over
    MiniLM's ~220,000 start-up objects) never walks them while a request waits."""
    import gc
    import types

    from bertforge.server import app as app_module

    seen = {}
    made = [object() for _ in range(1000)]  # stands for the model and the application start-up builds

    class Server:
        def run(self, sockets):
            seen["frozen"] = gc.get_freeze_count()
            sockets[0].close()

    gc.unfreeze()
    monkeypatch.setattr(app_module, "create_app", lambda *args, **kwargs: types.SimpleNamespace(state=types.SimpleNamespace()))
    monkeypatch.setattr(app_module, "_draining_server", lambda config, drain, announce: Server())
    try:
        app_module.serve("model", port=0)
        assert seen["frozen"] >= len(made)  # 0 without the freeze
    finally:
        gc.unfreeze()
