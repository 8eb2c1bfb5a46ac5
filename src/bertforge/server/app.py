"""The FastAPI application: the guard in front of it (`guard.py`), error answers, and the
operational endpoints (/health, /info, /metrics, offline /docs). The model endpoints are in
`apis/`. (No `from __future__ import annotations`: FastAPI reads the handlers' annotations.)
"""


import errno
import gc
import logging
import signal
import socket
import sys
import time
from pathlib import Path

from ..errors import InputError
from ..inference.loop import Abandoned, abandon_all
from .batching import Admission, Overloaded, TokenBatcher
from .errors import Refused, describe, error_body, json_problem
from .guard import BODY, Guard
from .metrics import ServerMetrics
from .service import Limits, Service

log = logging.getLogger("bertforge")


def error_response(path: str, status: int, message: str, headers: dict | None = None, **details: str | None):
    """The error answer in the shape of the API that `path` imitates (see `errors.error_body`)."""
    from fastapi.responses import JSONResponse

    status, body = error_body(path, status, message, **details)
    return JSONResponse(status_code=status, content=body, headers=headers)


# What each task needs, in the words of transformers' head classes.
HEADS = {"classify": "sequence-classification", "rerank": "cross-encoder (sequence classification with one logit "
         "or two classes)", "fill-mask": "masked-LM", "ner": "token-classification", "qa": "question-answering"}


def swagger_static() -> Path:
    """Swagger UI's files, from the swagger-ui-py package, so /docs works without a network."""
    import swagger_ui

    return Path(swagger_ui.__file__).parent / "static"


class Drain:
    """The server's orderly stop. Once `begin` is called (the first SIGTERM or Ctrl-C), every new request
    is answered 503 and the server exits when the requests already in flight have finished, or when
    `grace_s` has passed. `in_flight` counts the requests the application is answering now.

    At the end of the grace, the requests still in flight are abandoned (`on_grace_end`): those waiting for a
    batch are answered 503 at once, and the batch in the model stops before its next batch of rows (the one
    inference loop checks between batches), so its requests are answered 503 too. The process then exits
    within the grace plus one batch's time, every request answered, rather than cut off mid-answer."""

    QUIET_S = 0.25  # a request can be on the wire when the last one ends: wait this long with none in flight
    # After the grace, how long abandoned requests may take to be answered: one batch's time, bounded for a
    # client that never finishes sending its body (whose request is then cut off, as uvicorn does).
    ABANDON_LIMIT_S = 30.0

    def __init__(self, grace_s: float = 25.0) -> None:
        self.grace_s = grace_s
        self.since: float | None = None
        self.in_flight = 0
        self.finished_after = 0  # requests that were in flight at the signal and finished since
        self.last_seen = 0.0
        self.abandoned_at: float | None = None
        self.abandoned = 0  # requests in flight when the grace ended
        self.on_grace_end = lambda: None  # what `create_app` abandons the work in flight with

    @property
    def draining(self) -> bool:
        return self.since is not None

    def begin(self, signum: int) -> None:
        self.since = self.last_seen = time.monotonic()
        print(f"bertforge: {signal.Signals(signum).name} received: draining; new requests get 503, "
              f"{self.in_flight} in flight finish within {self.grace_s:g} s (--shutdown-grace-s); "
              "a second signal stops at once", file=sys.stderr, flush=True)

    def done(self) -> bool:
        """True once the drain is over: nothing in flight for QUIET_S, or, after the grace, the requests then in
        flight answered 503 (or ABANDON_LIMIT_S spent on them)."""
        now = time.monotonic()
        if self.since is None:
            return False
        if self.abandoned_at is None and self.in_flight == 0 and now - self.last_seen >= self.QUIET_S:
            print(f"bertforge: drained ({self.finished_after} requests finished after the signal); stopped",
                  file=sys.stderr, flush=True)
            return True
        if self.abandoned_at is None and now - self.since >= self.grace_s:
            self.abandoned_at, self.abandoned = now, self.in_flight
            print(f"bertforge: --shutdown-grace-s {self.grace_s:g} s passed with {self.in_flight} requests in flight;"
                  " they are answered 503 when the batch in the model ends", file=sys.stderr, flush=True)
            self.on_grace_end()
        if self.abandoned_at is not None:
            if self.in_flight == 0:
                print(f"bertforge: stopped ({self.abandoned} requests answered 503 at the end of the grace, "
                      f"{now - self.abandoned_at:.1f} s after it)", file=sys.stderr, flush=True)
                return True
            if now - self.abandoned_at >= self.ABANDON_LIMIT_S:
                print(f"bertforge: {self.in_flight} requests still unanswered {self.ABANDON_LIMIT_S:g} s after the "
                      "grace; they are cut off", file=sys.stderr, flush=True)
                return True
        return False


def create_app(model_dir: str, limits: Limits | None = None, drain: Drain | None = None):
    """The FastAPI application for one checkpoint directory. `drain` (from `serve`) turns new requests
    away with 503 once a stop has begun."""
    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.openapi.docs import get_swagger_ui_html
    from fastapi.responses import HTMLResponse, Response
    from fastapi.staticfiles import StaticFiles
    from starlette.exceptions import HTTPException as StarletteHTTPException
    from starlette.routing import Match

    from ..errors import BertforgeError
    from . import apis as routes

    limits = limits or Limits()
    drain = drain or Drain()
    service = Service(model_dir, limits)
    metrics = ServerMetrics()
    admission = Admission(limits.max_concurrent_requests)
    metrics.in_flight.set_function(lambda: admission.in_flight)
    batchers: dict[str, TokenBatcher] = {}
    for name in sorted(service.tasks):
        batchers[name] = TokenBatcher(service.runners[name], limits.batch_wait_ms / 1000, limits.max_batch_tokens,
                                      metrics.observer(name))
        metrics.queue.labels(name).set_function(lambda b=batchers[name]: b.queued)

    shutting_down = ("the server is shutting down; send this request to another replica or retry once it is back",
                     {"Connection": "close", "Retry-After": "1"})

    def abandon() -> None:
        abandon_all()  # the batch in the model stops before its next rows
        for batcher in batchers.values():
            batcher.abandon(Abandoned("the server is shutting down"))

    drain.on_grace_end = abandon

    async def submit(name: str, items: list, tokens: int) -> list:
        """Run `items` (holding `tokens` tokens) through endpoint `name`'s batcher, if admitted."""
        if name == "embed" and service.splade is not None:
            raise Refused(404, f"this model ({service.architecture}) is a SPLADE sparse encoder: its vectors are "
                               "sparse, one weight per vocabulary word; ask /embed_sparse")
        if name == "embed" and service.colbert is not None:
            raise Refused(404, f"this model ({service.architecture}) is a ColBERT late-interaction model: it gives a "
                               "vector per token, not one per text; ask /embed_multi_vector (or /rerank: MaxSim)")
        if name not in batchers:
            raise Refused(404, f"this model ({service.architecture}) has no {HEADS.get(name, name)} head, which this "
                               "route needs")
        admission.enter()
        try:
            return await batchers[name].submit(items, tokens)
        finally:
            admission.leave()

    app = FastAPI(title="bertforge", version=service.info()["version"], docs_url=None, redoc_url=None,
                  description=f"Serving {service.name} ({service.architecture}).")
    static = swagger_static()
    app.mount("/docs-static", StaticFiles(directory=static), name="docs-static")

    app.add_middleware(Guard, limits=limits, drain=drain, metrics=metrics, error=error_response,
                       shutting_down=shutting_down, routes=lambda: app.router.routes)

    limit_flags = {"items": "--max-texts", "chars": "--max-chars", "pattern": f"has no {service.tokenizer.mask_token}"}

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError):
        problems = exc.errors()
        first = problems[0] if problems else {}
        if first.get("type") == "json_invalid":
            return error_response(request.url.path, 400, json_problem(BODY.get()))
        status, message, field, kind = describe(first, limit_flags)
        return error_response(request.url.path, status, message, param=field, kind=kind)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException):
        # FastAPI's own errors (a body that is not UTF-8, an unknown path, a wrong method) in the same shape
        headers, detail = exc.headers, str(exc.detail)
        if exc.status_code == 400 and detail == "There was an error parsing the body":  # not UTF-8, too deep
            detail = json_problem(BODY.get())
        if exc.status_code == 405:  # GET / and POST / are two routes: Allow names the methods of both
            methods = {m for r in app.router.routes if r.matches(request.scope)[0] != Match.NONE
                       for m in getattr(r, "methods", ())}
            headers = {**(headers or {}), "Allow": ", ".join(sorted(methods))}
        return error_response(request.url.path, exc.status_code, detail, headers)

    @app.exception_handler(Refused)
    async def refused(request: Request, exc: Refused):
        return error_response(request.url.path, exc.status, str(exc), param=exc.param, kind=exc.kind, code=exc.code)

    @app.exception_handler(Abandoned)
    async def abandoned(request: Request, exc: Abandoned):
        return error_response(request.url.path, 503, *shutting_down)

    @app.exception_handler(Overloaded)
    async def overloaded(request: Request, exc: Overloaded):
        metrics.rejected.inc()
        return error_response(request.url.path, 429, str(exc), {"Retry-After": "1"})

    @app.exception_handler(BertforgeError)
    async def user_error(request: Request, exc: BertforgeError):
        return error_response(request.url.path, 422, str(exc))

    def served(route) -> bool:
        """Whether a route answers for this model: the model routes need their head, the rest always do."""
        if "POST" not in getattr(route, "methods", ()):
            return True
        task = routes.ROUTE_TASKS.get(route.path)
        return task is None or task in batchers

    @app.get("/ping", summary="liveness (SageMaker's path)")
    @app.get("/", summary="liveness (the Inference API's path)")
    @app.get("/health", summary="liveness: the model is loaded and answering")
    async def health() -> dict:
        routes = sorted({r.path for r in app.routes if getattr(r, "include_in_schema", False) and served(r)})
        return {"status": "ok", "model": str(model_dir), "architecture": service.architecture,
                "endpoints": [*routes, "/docs"]}

    @app.get("/info", summary="what is served and under which limits (TEI's /info)")
    async def info() -> dict:
        return service.info()

    @app.get("/metrics", summary="Prometheus metrics", response_class=Response)
    async def prometheus() -> Response:
        body, content_type = metrics.render()
        return Response(body, media_type=content_type)

    @app.get("/docs", include_in_schema=False)
    async def docs() -> HTMLResponse:
        return get_swagger_ui_html(openapi_url="/openapi.json", title="bertforge API",
                                   swagger_js_url="/docs-static/swagger-ui-bundle.js",
                                   swagger_css_url="/docs-static/swagger-ui.css",
                                   swagger_favicon_url="/docs-static/favicon-32x32.png")

    app.state.batchers = batchers  # for introspection (tests, debugging)
    app.state.route = service.route
    routes.add_model_routes(app, service, submit)
    return app


def listening_socket(host: str, port: int) -> socket.socket:
    """A socket bound to (host, port), made before the model loads: a port in use is refused in one line at
    once, and "serving ... on" is printed only once the address is ours."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except socket.gaierror as exc:
        raise InputError(f"--host {host}: cannot be resolved ({exc.strerror})") from None
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does: a restart need not wait out TIME_WAIT
    try:
        sock.bind(address)
    except OSError as exc:
        sock.close()
        hint = ("another process is listening there: stop it or choose another --port" if exc.errno == errno.EADDRINUSE
                else "binding a port below 1024 needs root: choose another --port" if exc.errno == errno.EACCES
                else "check --host and --port")
        raise InputError(f"cannot listen on {host}:{port}: {exc.strerror}; {hint}") from None
    return sock


def _draining_server(config, drain: Drain, announce: str):
    """uvicorn's Server, stopping as TEI and Kubernetes expect: the first SIGTERM or SIGINT begins a drain (new
    requests 503, those in flight finish, then exit 0); a second one stops at once, as uvicorn does."""
    import uvicorn

    class DrainingServer(uvicorn.Server):
        def handle_exit(self, sig, frame) -> None:
            if not drain.draining and not self.should_exit:
                drain.begin(sig)
                return
            super().handle_exit(sig, frame)  # stop now; uvicorn re-raises the signal as it exits (status 128 + n)

        async def on_tick(self, counter: int) -> bool:
            return drain.done() or await super().on_tick(counter)

        async def startup(self, sockets=None) -> None:
            await super().startup(sockets=sockets)
            if self.started:
                print(announce, file=sys.stderr, flush=True)

    return DrainingServer(config)


def serve(model_dir: str, host: str = "127.0.0.1", port: int = 8000, limits: Limits | None = None,
          shutdown_grace_s: float = 25.0) -> None:
    """Serve `model_dir` until a signal: SIGTERM or Ctrl-C drains (see `Drain`) and returns normally."""
    import uvicorn

    limits = limits or Limits()
    if shutdown_grace_s < 0:
        raise InputError("--shutdown-grace-s must be >= 0")
    if host not in ("127.0.0.1", "localhost", "::1") and not limits.api_key:
        log.warning("serving on %s: reachable from other machines, and no --api-key is set", host)
    sock = listening_socket(host, port)
    drain = Drain(shutdown_grace_s)
    app = create_app(model_dir, limits, drain)
    shown = f"[{host}]" if ":" in host else host
    announce = (f"bertforge: serving {model_dir} on http://{shown}:{port} (endpoints at /health and /info, API docs "
                "at /docs, metrics at /metrics); Ctrl-C or SIGTERM drains and stops")
    route = getattr(app.state, "route", None)
    if route is not None:  # --backend auto: which engines it chose, and the timings why
        announce += f"\nbertforge: backend {route.describe()}"
    # uvicorn's access log gives one line per request: client, method, path, status. Its own graceful
    # shutdown follows the drain, when every request has been answered: only idle connections are left to close.
    config = uvicorn.Config(app, log_level="info", timeout_graceful_shutdown=2)
    # What start-up made (the model, tokenizer, application: ~220,000 objects the collector tracks for MiniLM) lives
    # as long as the server: moved out of the collector's reach, a full collection no longer walks it (114 ms of a
    # request's time on a 2-core EPYC when one came due; afterwards, under 1 ms).
    gc.freeze()
    _draining_server(config, drain, announce).run(sockets=[sock])
