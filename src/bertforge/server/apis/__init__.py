"""The model endpoints, in the dialects clients already speak. (No `from __future__ import
annotations` here: FastAPI reads the handlers' annotations, which name classes made at run time.)

- bertforge: POST /embed, /fill-mask, /classify (with `text_pairs`), /ner, /qa; `{"texts": [...]}`
  in, `{"results": [...]}` out.
- text-embeddings-inference: POST /embed with `inputs` (a bare list of vectors out), /rerank with
  `query` + `texts` (`[{index, score}]`, best first), /tokenize.
- OpenAI: POST /v1/embeddings (`input`, `model`, `encoding_format`, `dimensions`), answered as the
  `openai` client expects, with token usage.
- Cohere / Jina: POST /rerank with `query` + `documents` (+ `top_n`): `{results: [{index,
  relevance_score}]}`.

An input longer than the model reads is cut only where the dialect says so (bertforge's own
endpoints and Cohere's, like sentence-transformers; TEI with `truncate: true`); TEI without it
answers 413 and OpenAI answers 400, as those servers do.
"""


import base64
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np

from .schemas import ERRORS, OPENAI_ERRORS, Refused, request_models
from .service import Service

Submit = Callable[[str, list, int], Awaitable[list]]


def _normalize(vectors: list[np.ndarray], dimensions: int | None, unit: bool) -> list[np.ndarray]:
    """The first `dimensions` of each vector, then L2-normalised when `unit` (as OpenAI's
    shortened embeddings are)."""
    out = []
    for v in vectors:
        v = v[:dimensions] if dimensions else v
        out.append(v / max(float(np.linalg.norm(v)), 1e-12) if unit else v)
    return out


def add_model_routes(app: Any, service: Service, submit: Submit) -> None:
    """Register every model endpoint on `app`; `submit(endpoint, items, tokens)` runs a batch."""
    limits = service.limits
    bodies = request_models(limits.max_texts, limits.max_chars, service.tokenizer.mask_token, service.dimension)
    TextsBody, EmbedBody, MaskedBody = bodies["texts"], bodies["embed"], bodies["fill-mask"]
    ClassifyBody, QABody, RerankBody = bodies["classify"], bodies["qa"], bodies["rerank"]
    TokenizeBody, OpenAIBody = bodies["tokenize"], bodies["openai"]
    most = service.embed_max_tokens

    def over_length(counts: list[int], limit: int, field: str) -> str | None:
        long = next((i for i, n in enumerate(counts) if n > limit), None)
        if long is None:
            return None
        return f"{field}[{long}] has {counts[long]} tokens; this model reads at most {limit}"

    async def vectors(texts: list[str], counts: list[int]) -> list[np.ndarray]:
        return await submit("embed", texts, sum(min(n, most) for n in counts))

    # ------------------------------------------------------------------ embeddings
    @app.post("/embed", responses=ERRORS,
              summary="sentence vectors: {'texts'} (bertforge) or {'inputs', 'normalize', 'truncate'} (TEI)")
    async def embed(body: EmbedBody):
        if hasattr(body, "texts"):  # bertforge's dialect: the model's own normalisation, cut to length
            found = await vectors(body.texts, service.token_counts(body.texts))
            return {"results": [v.tolist() for v in _normalize(found, None, service.normalizes)]}
        texts = [body.inputs] if isinstance(body.inputs, str) else body.inputs
        counts = service.token_counts(texts)
        problem = None if body.truncate else over_length(counts, most, "inputs")
        if problem:
            raise Refused(413, problem + "; send truncate: true to cut it")
        found = await vectors(texts, counts)
        return [v.tolist() for v in _normalize(found, body.dimensions, body.normalize)]

    @app.post("/v1/embeddings", responses=OPENAI_ERRORS, summary="OpenAI-compatible embeddings")
    async def openai_embeddings(body: OpenAIBody):
        if body.model != service.name:
            raise Refused(404, f"model '{body.model}' is not served here; this server serves '{service.name}'")
        texts = [body.input] if isinstance(body.input, str) else body.input
        counts = service.token_counts(texts)
        problem = over_length(counts, most, "input")
        if problem:
            raise Refused(400, problem)
        found = await vectors(texts, counts)
        # Shortened vectors are re-normalised only for a model that normalises, as OpenAI's models do.
        found = _normalize(found, body.dimensions, service.normalizes)

        def encode(v: np.ndarray) -> Any:
            return (base64.b64encode(v.astype("<f4").tobytes()).decode() if body.encoding_format == "base64"
                    else v.tolist())

        return {"object": "list", "model": service.name,
                "data": [{"object": "embedding", "index": i, "embedding": encode(v)} for i, v in enumerate(found)],
                "usage": {"prompt_tokens": sum(counts), "total_tokens": sum(counts)}}

    # ------------------------------------------------------------------ heads
    def text_endpoint(name: str, Body: type) -> None:
        async def handler(body: Body):
            counts = service.token_counts(body.texts)
            return {"results": await submit(name, body.texts, sum(counts))}

        handler.__name__ = name.replace("-", "_")
        app.post(f"/{name}", summary=f"{name} for each of 'texts'", responses=ERRORS)(handler)

    text_endpoint("fill-mask", MaskedBody)
    text_endpoint("ner", TextsBody)

    @app.post("/classify", summary="classify each of 'texts' (with 'text_pairs', each pair)", responses=ERRORS)
    async def classify(body: ClassifyBody):
        pairs = body.text_pairs
        if pairs is not None and len(pairs) != len(body.texts):
            raise Refused(422, f"'text_pairs' has {len(pairs)} texts but 'texts' has {len(body.texts)}")
        counts = service.token_counts(body.texts, pairs)
        return {"results": await submit("classify", list(zip(body.texts, pairs or [None] * len(body.texts))),
                                        sum(counts))}

    @app.post("/qa", summary="answer a question from a context (or a list of them under 'items')", responses=ERRORS)
    async def qa(body: QABody):
        items = [i.model_dump() for i in body.items] if hasattr(body, "items") else [body.model_dump()]
        counts = service.token_counts([i["question"] for i in items], [i["context"] for i in items])
        # Every window of a long context runs, so its whole length is the work to budget.
        return {"results": await submit("qa", items, sum(counts))}

    @app.post("/rerank", responses=ERRORS,
              summary="score texts against a query: TEI's {'query', 'texts'} or Cohere's {'query', 'documents'}")
    async def rerank(body: RerankBody):
        cohere = hasattr(body, "documents")
        texts = body.documents if cohere else body.texts
        counts = service.token_counts([body.query] * len(texts), texts)
        limit = service.config.max_sequence_length
        problem = None if cohere or body.truncate else over_length(counts, limit, "texts")
        if problem:
            raise Refused(413, problem + " with the query; send truncate: true to cut it")
        if cohere and body.model is not None and body.model != service.name:
            raise Refused(404, f"model '{body.model}' is not served here; this server serves '{service.name}'")
        scored = await submit("rerank", [(body.query, t) for t in texts], sum(min(n, limit) for n in counts))
        order = sorted(range(len(texts)), key=lambda i: -scored[i][0])  # stable: ties keep input order
        if cohere:
            results = [{"index": i, "relevance_score": scored[i][0]} | ({"document": {"text": texts[i]}}
                                                                        if body.return_documents else {})
                       for i in order[:body.top_n]]
            return {"results": results, "model": service.name, "usage": {"total_tokens": sum(counts)}}
        return [{"index": i, "score": scored[i][1] if body.raw_scores else scored[i][0]}
                | ({"text": texts[i]} if body.return_text else {}) for i in order]

    @app.post("/tokenize", responses=ERRORS, summary="the tokens of each input (TEI's /tokenize)")
    async def tokenize(body: TokenizeBody):
        texts = [body.inputs] if isinstance(body.inputs, str) else body.inputs
        return service.tokenize(texts, body.add_special_tokens)
