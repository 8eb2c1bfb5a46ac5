"""Cohere's routes, as its SDKs (`cohere.Client`, `cohere.ClientV2`) call them, and Jina's rerank:
POST /v1/rerank, /v2/rerank, /v1/embed, /v2/embed.

Rerank scores are the sigmoid of a cross-encoder's logit (in [0, 1], as Cohere's relevance_score is;
sentence-transformers' CrossEncoder gives the same with a Sigmoid activation), best first; documents are
cut to what the model reads, as Cohere cuts them. Embeddings come as the model gives them (normalised if
its sentence-transformers directory says so), as floats, base64 (the float32 bytes), or packed bits
(binary, ubinary: one bit per dimension, set where the value is positive, 8 to a byte; binary is the
signed byte, ubinary the unsigned one, as Cohere defines them). int8 and uint8 are refused (the request
schema leaves them out): they need a calibration range that Cohere does not publish. (No `from __future__ import annotations`: FastAPI reads
the handlers' annotations.)
"""


import base64
import uuid

import numpy as np

from .common import Api, normalized


def packed_bits(vectors: np.ndarray, signed: bool) -> list[list[int]]:
    """[N, D] floats -> [N, ceil(D / 8)] bytes: bit j of a vector is 1 where its value j is positive."""
    packed = np.packbits(vectors > 0, axis=-1).astype(np.int16)
    return (packed - 128 if signed else packed).tolist()


def encoded(vectors: np.ndarray, kind: str) -> list:
    """One of Cohere's embedding types for [N, D] float32 vectors."""
    if kind == "float":
        return vectors.tolist()
    if kind == "base64":
        return [base64.b64encode(v.astype("<f4").tobytes()).decode() for v in vectors]
    return packed_bits(vectors, signed=kind == "binary")  # binary or ubinary: the schema allows no other


def meta(version: str | None, tokens: int) -> dict:
    return {"api_version": {"version": version or "1"}, "billed_units": {"input_tokens": tokens},
            "tokens": {"input_tokens": tokens}}


async def rerank(api: Api, body, version: str | None) -> dict:
    """Cohere's rerank answer (v1, v2, and the unversioned /rerank's Cohere shape): results best first."""
    api.check_model(body.model)
    texts = [d if isinstance(d, str) else d.text for d in body.documents]
    limit = api.service.config.max_sequence_length
    scored, counts = await api.scores(body.query, texts)
    order = sorted(range(len(texts)), key=lambda i: -scored[i][0])  # stable: ties keep input order
    results = [{"index": i, "relevance_score": scored[i][0]}
               | ({"document": {"text": texts[i]}} if body.return_documents else {}) for i in order[:body.top_n]]
    tokens = sum(min(n, limit) for n in counts)
    return {"id": str(uuid.uuid4()), "results": results, "meta": meta(version, tokens), "model": api.service.name,
            "usage": {"total_tokens": tokens}}


def add(api: Api) -> None:
    service, bodies = api.service, api.bodies
    RerankBody, EmbedBody = bodies["cohere-rerank"], bodies["cohere-embed"]

    for version in ("1", "2"):
        def routes(version: str = version) -> None:
            @api.post(f"/v{version}/rerank", "cohere",
                      f"Cohere's v{version} rerank" + (" (and Jina's)" if version == "1" else ""))
            async def rerank_route(body: RerankBody):
                return await rerank(api, body, version)

            @api.post(f"/v{version}/embed", "cohere", f"Cohere's v{version} embed")
            async def embed_route(body: EmbedBody):
                api.check_model(body.model)
                limit = service.embed_max_tokens
                truncate = body.truncate != "NONE"
                counts = await api.counted(body.texts, "texts", limit, truncate, hint="; send truncate END or START to cut it")
                side = "left" if body.truncate == "START" else "right"
                found = await api.vectors(body.texts, counts, side, api.prompt("input_type", kind=body.input_type))
                vectors = np.stack(normalized(found, body.output_dimension, service.normalizes))
                kinds = body.embedding_types
                answer = {"id": str(uuid.uuid4()), "texts": body.texts, "meta": meta(version, sum(min(n, limit)
                                                                                             for n in counts))}
                if kinds is None and version == "1":
                    return answer | {"response_type": "embeddings_floats", "embeddings": vectors.tolist()}
                return answer | {"response_type": "embeddings_by_type",
                                 "embeddings": {k: encoded(vectors, k) for k in (kinds or ["float"])}}

            rerank_route.__name__ = f"rerank_v{version}"
            embed_route.__name__ = f"embed_v{version}"

        routes()
