"""What every dialect's routes share: the length rules and the model calls.

Lengths follow one rule everywhere: an input longer than the model reads is cut when the request asks
for truncation (TEI's `truncate: true`, or null with `--auto-truncate`; Cohere's `truncate` START or
END; bertforge's own routes always, as sentence-transformers does), and otherwise refused with 413 (400
on OpenAI's and Cohere's routes), naming the input, its length and the limit.
"""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np

from ...interop.sentence_dir import PROMPT_SIDES, SIDE_OF_KIND
from ..errors import Refused, documented
from ..service import Service

Submit = Callable[[str, list, int], Awaitable[list]]


def normalized(vectors: list[np.ndarray], dimensions: int | None, unit: bool) -> list[np.ndarray]:
    """The first `dimensions` of each vector, then L2-normalised when `unit` (as OpenAI's shortened
    embeddings are)."""
    out = []
    for v in vectors:
        v = v[:dimensions] if dimensions else v
        out.append(v / max(float(np.linalg.norm(v)), 1e-12) if unit else v)
    return out


def rendered(content: Any) -> Any:
    """A route's answer as the JSON response FastAPI would give, without FastAPI's `jsonable_encoder` walk.

    That walk visits every float of every vector in Python (about 1 ms for one 384-float embedding, ~30 ms for a
    batch of 64 on the 2-core VM); the answers here are plain lists, dicts, strings and numbers already, which
    `json.dumps` encodes in C. The bytes are Starlette's JSONResponse's (the same separators, ensure_ascii off,
    NaN refused). Anything json cannot take as it is (a NumPy scalar, a model object) still goes through
    `jsonable_encoder` first, so the answer never changes, only its cost."""
    from fastapi.encoders import jsonable_encoder
    from fastapi.responses import Response

    if isinstance(content, Response):
        return content
    try:
        body = json.dumps(content, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    except TypeError:
        body = json.dumps(jsonable_encoder(content), ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    return Response(body.encode("utf-8"), media_type="application/json")


class Api:
    """The app, the service and the batch runner, with the helpers every route uses."""

    def __init__(self, app: Any, service: Service, submit: Submit, bodies: dict[str, Any]) -> None:
        self.app, self.service, self.submit = app, service, submit
        self.limits = service.limits
        self.bodies = bodies  # every dialect's request bodies, by name (`apis.request_models`)

    def post(self, path: str, dialect: str, summary: str) -> Callable:
        """Register a POST route whose errors come in `dialect`'s shape. Its answer is rendered by `rendered`."""
        register = self.app.post(path, responses=documented(dialect), summary=summary)

        def decorate(endpoint: Callable) -> Callable:
            @functools.wraps(endpoint)  # FastAPI reads the body's parameters through the wrapper
            async def answer(*args: Any, **kwargs: Any) -> Any:
                bound = self.limits.request_timeout_s
                try:  # every request has a time bound: a stuck one is answered, and the server goes on
                    return rendered(await asyncio.wait_for(endpoint(*args, **kwargs), bound))
                except TimeoutError:
                    raise Refused(503, f"the request took longer than {bound:g} s (--request-timeout-s) and was "
                                       "stopped; the server goes on: send fewer or shorter inputs, or retry",
                                  kind="unhealthy") from None
            return register(answer)
        return decorate

    # ------------------------------------------------------------------ lengths
    def truncates(self, truncate: bool | None) -> bool:
        """TEI's rule: `truncate: null` means the server's default (--auto-truncate)."""
        return self.limits.auto_truncate if truncate is None else truncate

    async def counted(self, inputs: list, field: str, limit: int, truncate: bool, pairs: list[str] | None = None,
                      hint: str = "; send truncate: true to cut it", names: list[str] | None = None,
                      pair_names: list[str] | None = None) -> list[int]:
        """Tokens of each input (with its pair), after refusing, unless `truncate`, a text longer than
        --max-chars or an input longer than `limit` tokens (413). `names` and `pair_names` are what the request
        calls each input and pair (default `field[i]`), so that a refusal names the text at fault: a long query
        is `query`, not the passage it is paired with."""
        names = names or [f"{field}[{i}]" for i in range(len(inputs))]
        pair_names = pair_names or [f"{field}[{i}]" for i in range(len(inputs))]
        if not truncate:
            for texts, labels in ((inputs, names), (pairs or [], pair_names)):
                for text, label in zip(texts, labels):
                    if isinstance(text, str) and len(text) > self.limits.max_chars:
                        raise Refused(413, f"{label} has {len(text)} characters; this server takes at most "
                                           f"{self.limits.max_chars} per text (--max-chars){hint}",
                                      param=label.split("[", 1)[0])
        counts = await self.service.tokens(inputs, pairs)
        if not truncate:
            long = next((i for i, n in enumerate(counts) if n > limit), None)
            if long is not None:
                label = f"{pair_names[long]} with {names[long]}" if pairs else names[long]
                raise Refused(413, f"{label} has {counts[long]} tokens; this model reads at most {limit}{hint}",
                              param=field)
        return counts

    # ------------------------------------------------------------------ model calls
    async def vectors(self, inputs: list, counts: list[int], side: str = "right",
                      prompt: str | None = None) -> list[np.ndarray]:
        """Sentence vectors (before the model's own normalisation) of texts or token-id lists, with `prompt`
        before each text (None: the model's default prompt; see `prompt`)."""
        most = self.service.embed_max_tokens
        return await self.submit("embed", [(x, (side, prompt)) for x in inputs], sum(min(n, most) for n in counts))

    # ------------------------------------------------------------------ prompts
    def prompt(self, field: str, name: str | None = None, kind: str | None = None) -> str | None:
        """The prompt a request asks for: by `name` (TEI's `prompt_name`: one of the model's prompts, or 422), or by
        the `kind` of text (Jina's `task`, Voyage's and Cohere's `input_type`): the model's prompt of that name, else
        of another name for the same side ("query"; "document", "passage", ...). None: the model's default prompt.

        A kind asked of a model that has named prompts but none for that kind is refused: the vectors would not be
        the ones asked for. A model without named prompts has nothing a kind could change: it is accepted."""
        sentence = self.service.sentence
        prompts = sentence.prompts
        if name is None and kind is None:
            return None
        if prompts and sentence.prompt_excluded_by is not None:
            raise Refused(422, f"{field}: this model's pooling excludes the prompt (include_prompt false in "
                               f"{sentence.prompt_excluded_by}), which bertforge does not implement", param=field)
        if name is not None:
            if name not in prompts:
                have = ", ".join(sorted(prompts)) or "none"
                raise Refused(422, f"{field}: prompt '{name}' is not one of this model's prompts ({have})",
                              param=field)
            return prompts[name]
        if not prompts:
            return None
        candidates = [c for c in (kind, *PROMPT_SIDES.get(SIDE_OF_KIND.get(kind, ""), ())) if c in prompts]
        if candidates:  # an empty entry ("document": "", which sentence-transformers 6 adds) yields to a real one
            return next((prompts[c] for c in candidates if prompts[c]), "")
        raise Refused(422, f"{field}: '{kind}' asks for a prompt this model lacks (its prompts: "
                           f"{', '.join(sorted(prompts))})", param=field)

    async def scores(self, query: str, texts: list[str], side: str = "right",
                     counts: list[int] | None = None) -> tuple[list, list[int]]:
        """(score, raw score) of each text against `query` (see `Service.relevance`), and the pairs' token counts
        (`counts`, when the caller has them already)."""
        limit = self.service.config.max_sequence_length
        if counts is None:
            counts = await self.service.tokens([query] * len(texts), texts)
        found = await self.submit("rerank", [((query, t), (side,)) for t in texts], sum(min(n, limit) for n in counts))
        return found, counts

    def check_model(self, name: str | None) -> None:
        """A request that names a model must name this one (404 otherwise, as OpenAI and Cohere answer)."""
        if name is not None and name != self.service.name:
            raise Refused(404, f"model '{name}' is not served here; this server serves '{self.service.name}'",
                          param="model", code="model_not_found")


def side_of(direction: str) -> str:
    """TEI's truncation_direction ("left", "Right", ...) as the tokenizer's truncation side."""
    return direction.lower()
