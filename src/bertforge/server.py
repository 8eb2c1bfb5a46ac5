"""`bertforge serve`: an HTTP service for a model, on FastAPI + uvicorn.

Endpoints: GET /health; POST /embed, /fill-mask, /classify, /ner with {"texts": [...]}
(/classify also takes "text_pairs" for pair models); POST /qa with {"question", "context"} or
{"items": [...]}; OpenAPI docs at /docs. A field no endpoint knows is refused with 422. An
endpoint whose head the model lacks answers 404 with a message saying so.

Concurrent requests to one endpoint are micro-batched: the first request waits up to
`batch_wait_ms` for others, and all of them run as one length-bucketed batch. Requests are
limited in body size (413), number of texts and characters per text (422), each with a
JSON `{"error": ...}` naming the limit. The server binds to 127.0.0.1 unless told otherwise.
"""


import asyncio
import re
import sys
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

log = logging.getLogger("bertforge")


def request_models(limits: "Limits", mask_token: str = "[MASK]") -> dict[str, type[BaseModel]]:
    """The request bodies, with the server's limits written into their schema: at most `max_texts`
    texts per request, each non-blank and at most `max_chars` long (and holding the mask token, for
    /fill-mask). So /docs and /openapi.json state exactly what the server accepts, and a field no
    endpoint knows is refused (422), never ignored."""
    Text = Annotated[str, StringConstraints(min_length=1, max_length=limits.max_chars, pattern=r"\S")]
    TextList = Annotated[list[Text], Field(min_length=1, max_length=limits.max_texts)]
    Masked = Annotated[str, StringConstraints(min_length=1, max_length=limits.max_chars, pattern=re.escape(mask_token))]
    strict = ConfigDict(extra="forbid")

    class Texts(BaseModel):
        """Body of /embed, /fill-mask and /ner."""

        model_config = strict
        texts: TextList = Field(..., description="the inputs, one string each")

    class ClassifyTexts(Texts):
        """Body of /classify: texts, and for pair models (MRPC, RTE, NLI) the second segment of each."""

        text_pairs: TextList | None = Field(None, description="the second text of each pair, as many as 'texts'")

    class QAItem(BaseModel):
        """One question about one context."""

        model_config = strict
        question: Text
        context: Text

    class QAItems(BaseModel):
        """Several questions, each with its context."""

        model_config = strict
        items: Annotated[list[QAItem], Field(min_length=1, max_length=limits.max_texts)]

    class MaskedTexts(BaseModel):
        """Body of /fill-mask: texts with at least one mask token each."""

        model_config = strict
        texts: Annotated[list[Masked], Field(min_length=1, max_length=limits.max_texts)] = Field(
            ..., description=f"the inputs, each with at least one {mask_token}")

    return {"texts": Texts, "fill-mask": MaskedTexts, "classify": ClassifyTexts, "qa": QAItem | QAItems}


class ErrorBody(BaseModel):
    """Every error answer: one line saying what is wrong, naming the field or limit."""

    error: str


# The error answers every POST endpoint may give, documented so that clients (and schema-driven
# tests) know them: malformed JSON, no head for this endpoint, a body over the size limit, and a
# request that breaks the schema or a limit.
ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorBody, "description": "the body is not valid JSON"},
    404: {"model": ErrorBody, "description": "the model has no head for this endpoint"},
    413: {"model": ErrorBody, "description": "the body exceeds --max-body-bytes"},
    422: {"model": ErrorBody, "description": "a field is missing, unknown, of the wrong type, or over a limit"},
}


@dataclass
class Limits:
    max_body_bytes: int = 1_000_000
    max_texts: int = 64
    max_chars: int = 10_000
    batch_wait_ms: float = 5.0
    max_batch: int = 64


class MicroBatcher:
    """Collects concurrent calls for up to `wait` seconds and runs them as one batch in a worker thread."""

    def __init__(self, run, wait: float, max_batch: int) -> None:
        self.run, self.wait, self.max_batch = run, wait, max_batch
        self.queue: asyncio.Queue | None = None
        self.worker: asyncio.Task | None = None

    async def submit(self, items: list) -> list:
        if self.queue is None:
            self.queue = asyncio.Queue()
            self.worker = asyncio.create_task(self._loop())
        future = asyncio.get_running_loop().create_future()
        await self.queue.put((items, future))
        return await future

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            first = await self.queue.get()
            pending = [first]
            deadline = loop.time() + self.wait
            while sum(len(p[0]) for p in pending) < self.max_batch:
                remaining = deadline - loop.time()
                if remaining <= 0:
                    break
                try:
                    pending.append(await asyncio.wait_for(self.queue.get(), remaining))
                except asyncio.TimeoutError:
                    break
            flat = [item for items, _ in pending for item in items]
            try:
                results = await loop.run_in_executor(None, self.run, flat)
            except Exception as exc:  # one bad batch must not stop the service
                for _, future in pending:
                    if not future.done():
                        future.set_exception(exc)
                continue
            start = 0
            for items, future in pending:
                if not future.done():
                    future.set_result(results[start:start + len(items)])
                start += len(items)


def create_app(model_dir: str, limits: Limits | None = None):
    """The FastAPI application for one checkpoint directory."""
    import torch
    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse
    from starlette.exceptions import HTTPException as StarletteHTTPException

    from . import pipelines
    from .errors import BertforgeError
    from .heads import head_info
    from .hf import architecture_of
    from .sentence_dir import sentence_pipeline
    from .tokenizer import Tokenizer

    limits = limits or Limits()
    architecture = architecture_of(model_dir)
    model = head_info(architecture).cls.from_pretrained(model_dir).eval()
    tokenizer = Tokenizer.from_pretrained(model_dir)
    sentence = sentence_pipeline(model_dir, model.config.hidden_size)
    backbone = getattr(model, "bert", model)
    torch.set_grad_enabled(False)

    served = {"embed", *head_info(architecture).tasks}  # every model has the encoder; the rest, per its head
    runners = {
        "embed": lambda texts: [v.tolist() for v in pipelines.embed(backbone, tokenizer, texts, sentence=sentence)],
        "fill-mask": lambda texts: pipelines.fill_mask(model, tokenizer, texts),
        "classify": lambda items: classify_items(items),
        "ner": lambda texts: pipelines.ner(model, tokenizer, texts),
        "qa": lambda items: pipelines.answer(model, tokenizer, items),
    }
    def classify_items(items: list[tuple[str, str | None]]) -> list[dict]:
        """(text, pair or None) items from any mix of requests: singles and pairs run as two batches."""
        results: list = [None] * len(items)
        for with_pair in (False, True):
            rows = [i for i, (_, pair) in enumerate(items) if (pair is not None) == with_pair]
            if rows:
                pairs = [items[i][1] for i in rows] if with_pair else None
                for i, r in zip(rows, pipelines.classify(model, tokenizer, [items[i][0] for i in rows], pairs)):
                    results[i] = r
        return results

    wait = limits.batch_wait_ms / 1000
    batchers = {name: MicroBatcher(run, wait, limits.max_batch) for name, run in runners.items() if name in served}

    app = FastAPI(title="bertforge", description=f"Serving {Path(model_dir).name} ({architecture}).")

    def error(status: int, message: str) -> JSONResponse:
        return JSONResponse(status_code=status, content={"error": message})

    @app.middleware("http")
    async def limit_body(request: Request, call_next):
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limits.max_body_bytes:
            return error(413, f"request body of {declared} bytes exceeds the limit of {limits.max_body_bytes} bytes")
        if request.method == "POST":
            body = await request.body()  # also catches chunked bodies that declared no length
            if len(body) > limits.max_body_bytes:
                return error(413, f"request body exceeds the limit of {limits.max_body_bytes} bytes")
        return await call_next(request)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError):
        problems = exc.errors()
        first = problems[0] if problems else {}
        if first.get("type") == "json_invalid":
            return error(400, f"malformed JSON: {first.get('ctx', {}).get('error', 'cannot parse the body')}")
        where = ".".join(str(p) for p in first.get("loc", []) if p != "body")
        return error(422, f"invalid request: {where or 'body'}: {first.get('msg', 'invalid')}")

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException):
        # FastAPI's own errors (a body that is not UTF-8, an unknown path, a wrong method) in the same shape
        return JSONResponse(status_code=exc.status_code, content={"error": str(exc.detail)}, headers=exc.headers)

    @app.exception_handler(BertforgeError)
    async def user_error(request: Request, exc: BertforgeError):
        return error(422, str(exc))

    async def serve(name: str, items: list) -> Any:
        if name not in batchers:
            return error(404, f"this model ({architecture}) has no head for /{name}")
        return {"results": await batchers[name].submit(items)}

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok", "model": str(model_dir), "architecture": architecture,
                "endpoints": sorted(f"/{n}" for n in batchers)}

    bodies = request_models(limits, tokenizer.mask_token)
    ClassifyTexts, QABody = bodies["classify"], bodies["qa"]

    def text_endpoint(name: str):
        Body = bodies.get(name, bodies["texts"])  # /fill-mask's texts must hold the mask token

        async def handler(body: Body):
            return await serve(name, body.texts)

        handler.__name__ = name.replace("-", "_")
        app.post(f"/{name}", summary=f"{name} for each of 'texts'", responses=ERRORS)(handler)

    for name in ("embed", "fill-mask", "ner"):
        text_endpoint(name)

    @app.post("/classify", summary="classify each of 'texts' (with 'text_pairs', each pair)", responses=ERRORS)
    async def classify(body: ClassifyTexts):
        pairs = body.text_pairs
        if pairs is not None and len(pairs) != len(body.texts):
            return error(422, f"'text_pairs' has {len(pairs)} texts but 'texts' has {len(body.texts)}")
        return await serve("classify", list(zip(body.texts, pairs or [None] * len(body.texts))))

    @app.post("/qa", summary="answer a question from a context (or a list of them under 'items')", responses=ERRORS)
    async def qa(body: QABody):
        items = [i.model_dump() for i in body.items] if hasattr(body, "items") else [body.model_dump()]
        return await serve("qa", items)

    return app


def serve(model_dir: str, host: str = "127.0.0.1", port: int = 8000, limits: Limits | None = None) -> None:
    import uvicorn

    if host not in ("127.0.0.1", "localhost", "::1"):
        log.warning("serving on %s: reachable from other machines; there is no authentication", host)
    app = create_app(model_dir, limits)
    shown = f"[{host}]" if ":" in host else host
    print(f"bertforge: serving {model_dir} on http://{shown}:{port} (endpoints at /health, API docs at /docs); "
          "Ctrl-C stops", file=sys.stderr, flush=True)
    # uvicorn's access log gives one line per request: client, method, path, status.
    uvicorn.run(app, host=host, port=port, log_level="info")

