"""The FastAPI application: middleware (API key, body limit, metrics), error answers, and the
operational endpoints (/health, /info, /metrics, offline /docs). The model endpoints are in
`routes.py`. (No `from __future__ import annotations`: FastAPI reads the handlers' annotations.)
"""


import logging
import secrets
import sys
import time
from pathlib import Path

from .batching import Admission, Overloaded, TokenBatcher
from .metrics import ServerMetrics, route_label
from .schemas import DIALECT, Refused
from .service import Limits, Service

log = logging.getLogger("bertforge")


OPEN_PATHS = ("/health", "/docs", "/openapi.json")


def error_response(path: str, status: int, message: str, headers: dict | None = None):
    """`{"error": message}`; under /v1/, OpenAI's shape, so its clients raise with the message."""
    from fastapi.responses import JSONResponse

    if path.startswith("/v1/"):
        kind = "invalid_request_error" if status < 500 else "server_error"
        body = {"error": {"message": message, "type": kind, "param": None, "code": status}}
    else:
        body = {"error": message}
    return JSONResponse(status_code=status, content=body, headers=headers)


def swagger_static() -> Path:
    """Swagger UI's files, from the swagger-ui-py package, so /docs works without a network."""
    import swagger_ui

    return Path(swagger_ui.__file__).parent / "static"


def create_app(model_dir: str, limits: Limits | None = None):
    """The FastAPI application for one checkpoint directory."""
    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.openapi.docs import get_swagger_ui_html
    from fastapi.responses import HTMLResponse, Response
    from fastapi.staticfiles import StaticFiles
    from starlette.exceptions import HTTPException as StarletteHTTPException

    from ..errors import BertforgeError
    from . import routes

    limits = limits or Limits()
    service = Service(model_dir, limits)
    metrics = ServerMetrics()
    admission = Admission(limits.max_concurrent_requests)
    metrics.in_flight.set_function(lambda: admission.in_flight)
    batchers: dict[str, TokenBatcher] = {}
    for name in sorted(service.tasks):
        batchers[name] = TokenBatcher(service.runners[name], limits.batch_wait_ms / 1000, limits.max_batch_tokens,
                                      metrics.observer(name))
        metrics.queue.labels(name).set_function(lambda b=batchers[name]: b.queued)

    async def submit(name: str, items: list, tokens: int) -> list:
        """Run `items` (holding `tokens` tokens) through endpoint `name`'s batcher, if admitted."""
        if name not in batchers:
            raise Refused(404, f"this model ({service.architecture}) has no head for /{name}")
        admission.enter()
        try:
            return await batchers[name].submit(items, tokens)
        finally:
            admission.leave()

    app = FastAPI(title="bertforge", version=service.info()["version"], docs_url=None, redoc_url=None,
                  description=f"Serving {service.name} ({service.architecture}).")
    static = swagger_static()
    app.mount("/docs-static", StaticFiles(directory=static), name="docs-static")

    @app.middleware("http")
    async def guard(request: Request, call_next):
        started = time.perf_counter()
        path = request.url.path
        # The key guards the model and its traffic; liveness and the API's own description stay open.
        if limits.api_key and path not in OPEN_PATHS and not path.startswith("/docs-static/"):
            given = request.headers.get("authorization", "")
            if not secrets.compare_digest(given.encode(), f"Bearer {limits.api_key}".encode()):
                response = error_response(path, 401, "missing or wrong API key: send 'Authorization: Bearer KEY'",
                                          {"WWW-Authenticate": "Bearer"})
                metrics.track("unauthorized", 401, time.perf_counter() - started)
                return response
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limits.max_body_bytes:
            response = error_response(path, 413, f"request body of {declared} bytes exceeds the limit of "
                                                 f"{limits.max_body_bytes} bytes")
        elif request.method == "POST" and len(await request.body()) > limits.max_body_bytes:
            # also catches chunked bodies that declared no length
            response = error_response(path, 413, f"request body exceeds the limit of {limits.max_body_bytes} bytes")
        else:
            response = await call_next(request)
        metrics.track(route_label(request.scope), response.status_code, time.perf_counter() - started)
        return response

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError):
        problems = exc.errors()
        first = problems[0] if problems else {}
        if first.get("type") == "json_invalid":
            return error_response(request.url.path, 400, "malformed JSON: "
                                  f"{first.get('ctx', {}).get('error', 'cannot parse the body')}")
        where = ".".join(str(p) for p in first.get("loc", []) if p != "body" and not str(p).startswith(DIALECT))
        return error_response(request.url.path, 422, f"invalid request: {where or 'body'}: "
                                                     f"{first.get('msg', 'invalid')}")

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException):
        # FastAPI's own errors (a body that is not UTF-8, an unknown path, a wrong method) in the same shape
        return error_response(request.url.path, exc.status_code, str(exc.detail), exc.headers)

    @app.exception_handler(Refused)
    async def refused(request: Request, exc: Refused):
        return error_response(request.url.path, exc.status, str(exc))

    @app.exception_handler(Overloaded)
    async def overloaded(request: Request, exc: Overloaded):
        metrics.rejected.inc()
        return error_response(request.url.path, 429, str(exc), {"Retry-After": "1"})

    @app.exception_handler(BertforgeError)
    async def user_error(request: Request, exc: BertforgeError):
        return error_response(request.url.path, 422, str(exc))

    @app.get("/health", summary="liveness: the model is loaded and answering")
    async def health() -> dict:
        return {"status": "ok", "model": str(model_dir), "architecture": service.architecture,
                "endpoints": sorted(f"/{n}" for n in batchers)}

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
    routes.add_model_routes(app, service, submit)
    return app


def serve(model_dir: str, host: str = "127.0.0.1", port: int = 8000, limits: Limits | None = None) -> None:
    import uvicorn

    limits = limits or Limits()
    if host not in ("127.0.0.1", "localhost", "::1") and not limits.api_key:
        log.warning("serving on %s: reachable from other machines, and no --api-key is set", host)
    app = create_app(model_dir, limits)
    shown = f"[{host}]" if ":" in host else host
    print(f"bertforge: serving {model_dir} on http://{shown}:{port} (endpoints at /health and /info, API docs at "
          "/docs, metrics at /metrics); Ctrl-C stops", file=sys.stderr, flush=True)
    # uvicorn's access log gives one line per request: client, method, path, status.
    uvicorn.run(app, host=host, port=port, log_level="info")
