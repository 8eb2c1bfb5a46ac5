"""Error answers in the shape of the API each route imitates, and one line that says what is wrong.

Three shapes, chosen by the path (`dialect_of`):
- OpenAI (`/v1/embeddings`, `/embeddings`, any other `/v1/` path that is not Cohere's):
  `{"error": {"message", "type", "param", "code"}}`, and 400 for every invalid request, as OpenAI's SDKs
  expect (they raise `BadRequestError` for 400 and something else for 422);
- Cohere (`/v1/rerank`, `/v2/rerank`, `/v1/embed`, `/v2/embed`; Jina shares `/v1/rerank`): `{"message"}`, 400
  for every invalid request;
- text-embeddings-inference, which bertforge's own routes share: `{"error", "error_type"}` with TEI 1.9's
  status codes: an empty batch 400 (`empty`), a limit passed 413 (`validation`), a body of the wrong shape
  422 (`validation`; TEI's JSON reader answers 422 too), overload 429 (`overloaded`).

`describe` turns pydantic's first validation error into that one line: it names the field and the limit
(`inputs has 100 texts; this server takes at most 64 per request (--max-texts)`), never pydantic's
union-branch wording.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from pydantic import BaseModel

DIALECT = "dialect:"  # prefix of union tags in request bodies; a field's path in a message leaves them out

OPENAI_PATHS = ("/v1/embeddings", "/embeddings")
COHERE_PATHS = ("/v1/rerank", "/v2/rerank", "/v1/embed", "/v2/embed")


def json_problem(body: bytes) -> str:
    """What is wrong with a request body that does not parse as JSON, and where: a byte offset into the body
    (what a client can find in what it sent), with the line and column where the body has several lines."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        return (f"the body is not valid UTF-8: byte 0x{body[exc.start]:02x} at byte offset {exc.start} "
                f"({exc.reason}); send JSON text in UTF-8")
    try:
        json.loads(text)
    except json.JSONDecodeError as exc:
        where = f"byte offset {len(text[:exc.pos].encode())}" + (
            f" (line {exc.lineno}, column {exc.colno})" if exc.lineno > 1 else "")
        return f"malformed JSON at {where}: {exc.msg}"
    except RecursionError:
        depth, offset = _deepest(text)
        return (f"the JSON nests {depth:,} arrays or objects deep, past what the parser reads (about "
                f"{sys.getrecursionlimit():,}); the deepest opens at byte offset {offset}")
    return "cannot parse the body as JSON"


def _deepest(text: str) -> tuple[int, int]:
    """(the deepest nesting of arrays and objects in JSON `text`, the byte offset where it opens); brackets inside
    strings do not count."""
    depth = deepest = at = 0
    in_string = escaped = False
    for i, ch in enumerate(text):
        if in_string:
            escaped, in_string = (False, True) if escaped else (ch == "\\", ch != '"')
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            if depth > deepest:
                deepest, at = depth, i
        elif ch in "]}":
            depth -= 1
    return deepest, len(text[:at].encode())


def dialect_of(path: str) -> str:
    """"openai", "cohere" or "tei" (bertforge's own routes answer as TEI's do)."""
    if path in COHERE_PATHS:
        return "cohere"
    if path in OPENAI_PATHS or path.startswith("/v1/"):
        return "openai"
    return "tei"


class Refused(Exception):
    """An answer other than 200: its status, one line saying why, and optionally the field it is about
    (`param`), TEI's `error_type` (`kind`) and OpenAI's `code`."""

    def __init__(self, status: int, message: str, *, param: str | None = None, kind: str | None = None,
                 code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.param, self.kind, self.code = status, param, kind, code


# TEI's error types by status, for answers that do not name one.
TEI_KINDS = {400: "validation", 413: "validation", 422: "validation", 424: "backend", 429: "overloaded",
             503: "unhealthy"}


def status_for(dialect: str, status: int) -> int:
    """OpenAI and Cohere answer every invalid request 400; TEI keeps its own codes."""
    return 400 if dialect != "tei" and status in (413, 422) else status


def error_body(path: str, status: int, message: str, *, param: str | None = None, kind: str | None = None,
               code: str | None = None) -> tuple[int, dict]:
    """(status, body) of an error answer on `path`, in that route's dialect."""
    dialect = dialect_of(path)
    status = status_for(dialect, status)
    if dialect == "openai":
        kind_ = ("authentication_error" if status == 401 else "rate_limit_error" if status == 429
                 else "server_error" if status >= 500 else "invalid_request_error")
        return status, {"error": {"message": message, "type": kind_, "param": param, "code": code}}
    if dialect == "cohere":
        return status, {"message": message}
    return status, {"error": message, "error_type": kind or TEI_KINDS.get(status, "validation")}


# ---------------------------------------------------------------------------------------- documented shapes
class ErrorBody(BaseModel):
    """TEI's error answer (bertforge's routes use it too): one line, and TEI's error type."""

    error: str
    error_type: str


class OpenAIError(BaseModel):
    """OpenAI's error detail."""

    message: str
    type: str
    param: str | None
    code: str | None


class OpenAIErrorBody(BaseModel):
    """Every error answer on OpenAI's routes, so its clients raise with the message."""

    error: OpenAIError


class CohereErrorBody(BaseModel):
    """Every error answer on Cohere's routes."""

    message: str


_WHY = {400: "the body is not valid JSON, or an input list or text is empty",
        401: "--api-key is set and the request lacks 'Authorization: Bearer KEY'",
        404: "the model has no head for this route, or the request names another model",
        413: "the body exceeds --max-body-bytes, an input list exceeds --max-texts or a text --max-chars, or an "
             "input is longer than the model reads and truncation was not asked for",
        415: "the body is not sent as application/json",
        422: "a field is missing, unknown or of the wrong type",
        429: "more requests are in flight than --max-concurrent-requests",
        503: "the server is shutting down"}


def documented(dialect: str) -> dict[int | str, dict[str, Any]]:
    """The error answers a route of `dialect` may give, for its OpenAPI description (and schemathesis)."""
    model = {"tei": ErrorBody, "openai": OpenAIErrorBody, "cohere": CohereErrorBody}[dialect]
    out: dict[int | str, dict[str, Any]] = {}
    for status, why in _WHY.items():
        status = status_for(dialect, status)
        previous = out.get(status, {}).get("description")
        out[status] = {"model": model, "description": f"{previous}; {why}" if previous else why}
    return out


# ---------------------------------------------------------------------------------------- validation errors
def field_path(loc: tuple | list) -> str:
    """("body", "dialect:b", "inputs", 3) -> "inputs[3]"."""
    out = ""
    for part in loc:
        if part == "body" or str(part).startswith(DIALECT):
            continue
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


# The shapes a field of several shapes is told apart by (`schemas.choose`), in a client's words.
SHAPES = {"one": "one text", "many": "a list of texts", "ids": "a list of token ids",
          "nested": "a list of lists (token ids, or text pairs)", "text": "a text", "object": "an object"}


def _shape_words(tag: str) -> str:
    name = tag.strip().strip("'")
    name = name[len(DIALECT):] if name.startswith(DIALECT) else name
    return SHAPES.get(name, name)


def describe(error: dict[str, Any], what: dict[str, str] | None = None) -> tuple[int, str, str | None, str]:
    """(status, message, field, TEI kind) for one pydantic error, in TEI's status codes.

    `what` names the server flags behind limits: {"items": "--max-texts", "chars": "--max-chars"}.
    """
    what = what or {}
    field = field_path(error.get("loc", ())) or "body"
    kind, ctx, value = error.get("type", ""), error.get("ctx") or {}, error.get("input")
    if kind == "too_long":
        n = len(value) if hasattr(value, "__len__") else ctx.get("actual_length")
        things = "texts" if isinstance(value, list) and value and isinstance(value[0], str) else "items"
        return 413, (f"{field} has {n} {things}; this server takes at most {ctx.get('max_length')} per request "
                     f"({what.get('items', 'a fixed limit')})"), field, "validation"
    if kind == "less_than" and isinstance(value, int):
        return 422, (f"{field} is {value}: token ids must be below {ctx.get('lt')}, the size of this model's "
                     "vocabulary"), field, "validation"
    if kind == "too_short":
        return 400, f"{field} is empty: send at least {ctx.get('min_length', 1)}", field, "empty"
    if kind == "string_too_long":
        n = len(value) if isinstance(value, str) else "more"
        return 413, (f"{field} has {n} characters; this server takes at most {ctx.get('max_length')} per text "
                     f"({what.get('chars', 'a fixed limit')})"), field, "validation"
    if kind in ("string_too_short", "string_pattern_mismatch") and (not isinstance(value, str) or not value.strip()):
        return 400, f"{field} is empty or blank", field, "empty"
    if kind == "string_pattern_mismatch":
        return 422, f"{field} {what.get('pattern', 'does not have the form this field needs')}", field, "validation"
    if kind == "union_tag_invalid":  # a value of a shape this field does not take: named in the user's terms
        taken = [_shape_words(t) for t in str(ctx.get("expected_tags", "")).split(",") if t.strip()]
        return 422, (f"{field} is {_shape_words(str(ctx.get('tag', '')))}; this route takes "
                     f"{' or '.join(taken) or 'another shape'}"), field, "validation"
    if kind == "missing":
        return 422, f"{field} is required", field, "validation"
    if kind == "extra_forbidden":
        return 422, f"{field} is not a field of this request", field, "validation"
    return 422, f"{field}: {error.get('msg', 'invalid')}", field, "validation"
