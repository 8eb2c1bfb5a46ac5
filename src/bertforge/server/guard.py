"""The server's front door, as plain ASGI middleware: the drain's 503, the API key, the body limit, the JSON
content type, the metrics of every answer, and the `X-Bertforge-Ignored` header.

Plain ASGI rather than Starlette's `BaseHTTPMiddleware` (`@app.middleware("http")`), which runs the application in
a second task and passes the response back through a memory stream: that hand-off cost every request time on the
one-query path (see docs/results.md). Here the application runs in the request's own task, so the context
variables set below (`BODY`, `IGNORED`) reach it without copying, and a body over the limit is refused as soon as
its bytes pass the limit instead of after all of them have been read.
"""

from __future__ import annotations

import json
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from typing import Any

from .metrics import ServerMetrics, matched_route, route_label
from .schemas import IGNORED

log = logging.getLogger("bertforge")

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

# The body of the request being answered, as the guard read it: a body FastAPI cannot parse is diagnosed from it
# (what is wrong, at which byte), where FastAPI says only that parsing failed.
BODY: ContextVar[bytes] = ContextVar("request_body", default=b"")

# Liveness, metrics and the API's own description stay open without the API key, as in TEI; GET only, so POST /
# (the model's task) still needs it.
OPEN_PATHS = ("/health", "/", "/ping", "/metrics", "/docs", "/openapi.json")


def json_content_type(value: str | None) -> bool:
    """application/json, or a +json type (charset and other parameters allowed)."""
    media = (value or "").split(";")[0].strip().lower()
    return media == "application/json" or media.endswith("+json")


def ignored_header(fields: list[str], most: int = 10) -> str:
    """The X-Bertforge-Ignored header's value: the fields, as JSON escapes them to ASCII (a header is Latin-1 and a
    client's key may be anything), at most `most` of them and 1,000 characters. A name a header cannot carry bare
    (empty, with a comma, or ending in a space: HTTP strips or refuses those, and uvicorn dropped the connection on
    `options.' '`) keeps its JSON quotes."""
    def one(field: str) -> str:
        bare = json.dumps(field)[1:-1]
        return bare if bare and bare == bare.strip() and "," not in bare and '"' not in bare else json.dumps(field)

    said = ", ".join(one(f) for f in fields[:most])
    said = said if len(said) <= 1000 else said[:997] + "..."
    return said + (f", and {len(fields) - most} more" if len(fields) > most else "")


class Guard:
    """ASGI middleware around the FastAPI application (`app.add_middleware(Guard, ...)`).

    `error(path, status, message, headers=None, **details)` builds the refusal in the shape of the API the path
    imitates; `drain` is the server's `Drain`; `routes()` gives the application's routes (to label a request
    refused before routing under the route it was sent to)."""

    def __init__(self, app, *, limits, drain, metrics: ServerMetrics, error: Callable[..., Any],
                 shutting_down: tuple[str, dict], routes: Callable[[], list]) -> None:
        self.app, self.limits, self.drain, self.metrics = app, limits, drain, metrics
        self.error, self.shutting_down, self.routes = error, shutting_down, routes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":  # lifespan: nothing to guard
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        drain = self.drain
        if drain.draining:
            # Health answers 503 too, so a load balancer or readiness probe takes this replica out.
            drain.last_seen = time.monotonic()
            await self.refuse(scope, receive, send, started, 503, *self.shutting_down)
            return
        drain.in_flight += 1
        ignored: list[str] = []  # fields validation accepted without effect (`options.x`): said back in a header
        token = IGNORED.set(ignored)
        try:
            await self.answer(scope, receive, send, started, ignored)
        finally:
            IGNORED.reset(token)
            drain.in_flight -= 1
            drain.last_seen = time.monotonic()
            if drain.draining:
                drain.finished_after += 1

    async def refuse(self, scope: Scope, receive: Receive, send: Send, started: float, status: int, message: str,
                     headers: dict | None = None, **details: str | None) -> None:
        response = self.error(scope["path"], status, message, headers, **details)
        await response(scope, receive, send)
        self.metrics.track(route_label(scope, self.routes()), response.status_code, time.perf_counter() - started)

    async def answer(self, scope: Scope, receive: Receive, send: Send, started: float, ignored: list[str]) -> None:
        method, path, limit = scope["method"], scope["path"], self.limits.max_body_bytes
        headers: dict[str, str] = {}
        for key, value in scope["headers"]:  # the first of a repeated header counts, as in Starlette's Headers
            headers.setdefault(key.decode("latin-1").lower(), value.decode("latin-1"))
        # The key guards the model and its traffic; liveness, metrics and the API's description stay open.
        open_path = (method in ("GET", "HEAD") and path in OPEN_PATHS) or path.startswith("/docs-static/")
        if self.limits.api_key and not open_path:
            given = headers.get("authorization", "")
            if not secrets.compare_digest(given.encode(), f"Bearer {self.limits.api_key}".encode()):
                await self.refuse(scope, receive, send, started, 401, "missing or wrong API key: send "
                                  "'Authorization: Bearer KEY'", {"WWW-Authenticate": "Bearer"}, code="invalid_api_key")
                return
        declared = headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            await self.refuse(scope, receive, send, started, 413, f"request body of {declared} bytes exceeds the "
                              f"limit of {limit} bytes (--max-body-bytes)")
            return
        if method == "POST":
            body = await read_body(receive, limit)
            if body is None:  # a chunked body that declared no length, or a length it did not keep to
                await self.refuse(scope, receive, send, started, 413, f"request body exceeds the limit of {limit} "
                                  "bytes (--max-body-bytes)")
                return
            if matched_route(scope, self.routes()) is not None and not json_content_type(headers.get("content-type")):
                got = headers.get("content-type")
                await self.refuse(scope, receive, send, started, 415, "send the body as JSON, with 'Content-Type: "
                                  f"application/json' (got {repr(got) if got else 'no Content-Type'})")
                return
            BODY.set(body)
            receive = replay(body, receive)
        status = 500  # what the client gets if the application raises before answering

        async def sending(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                if ignored and status < 400:
                    said = ignored_header(ignored)
                    message.setdefault("headers", []).append((b"x-bertforge-ignored", said.encode("latin-1")))
                    log.info("%s: ignored %s (accepted for the client's sake; no effect here)", path, said)
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            self.metrics.track(route_label(scope, self.routes()), status, time.perf_counter() - started)


async def read_body(receive: Receive, limit: int) -> bytes | None:
    """The request's whole body, or None as soon as it passes `limit` bytes (the rest is not read)."""
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":  # the client left: the application sees an empty body and ends
            break
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


def replay(body: bytes, receive: Receive) -> Receive:
    """A `receive` that gives the application the body already read, then the connection's own messages (a
    disconnect, which a long request listens for)."""
    given = False

    async def again() -> Message:
        nonlocal given
        if not given:
            given = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return again
