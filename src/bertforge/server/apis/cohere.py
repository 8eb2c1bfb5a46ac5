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
from typing import Annotated, Literal

import numpy as np
from pydantic import Field

from ..schemas import Body, Shapes, choose
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


# The head each route needs.
ROUTES = {"/v1/rerank": "rerank", "/v2/rerank": "rerank", "/v1/embed": "embed", "/v2/embed": "embed"}


def bodies(s: Shapes, known: dict[str, type]) -> dict[str, type]:
    """Cohere's (and Jina's) rerank and embed bodies for these limits (`s`)."""
    Long, LongList, Dimensions, TopK, max_texts = s.Long, s.LongList, s.Dimensions, s.TopK, s.max_texts

    class Document(Body):
        text: Long

    # A text or a {"text"} object, chosen by its shape: a wrong object is then called what it lacks, not what the
    # other shape would have wanted.
    DocumentItem = choose(lambda v: "object" if isinstance(v, dict) else "text", text=Long, object=Document)
    Documents = Annotated[list[DocumentItem], Field(min_length=1, max_length=max_texts)]

    class CohereRerank(Body):
        """Cohere's (and Jina's) rerank body: answers {results: [{index, relevance_score}], ...}."""

        query: Long
        documents: Documents
        model: str | None = Field(None, description="the served model's name, if given")
        top_n: TopK = Field(None, description="return the best N (default: all)")
        return_documents: bool = Field(False, description="echo each document in its answer")

    class CohereEmbed(Body):
        """Cohere's embed body (v1 and v2)."""

        texts: LongList
        model: str | None = None
        input_type: Literal["search_document", "search_query", "classification", "clustering"] | None = Field(
            None, description="chooses the model's prompt of that kind (query or document side); a model without "
                              "named prompts is unchanged by it")
        # int8 and uint8 are left out: they need a calibration range that Cohere does not publish.
        embedding_types: Annotated[list[Literal["float", "base64", "binary", "ubinary"]], Field(min_length=1)] | None = \
            Field(None, description="float (default), base64 (float32 bytes), binary or ubinary (packed sign bits); "
                                    "int8 and uint8 are refused: Cohere does not publish their calibration")
        truncate: Literal["NONE", "START", "END"] = Field("END", description="which end of a long text is cut")
        output_dimension: Dimensions = Field(None, description="keep the first N dimensions (then re-normalise, "
                                                               "for a model that normalises)")

    return {"cohere-rerank": CohereRerank, "cohere-embed": CohereEmbed}


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
