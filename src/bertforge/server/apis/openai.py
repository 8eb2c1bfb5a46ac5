"""OpenAI's embeddings route, as the `openai` SDK calls it: POST /v1/embeddings (and TEI's unversioned
/embeddings). `input` is a text, a list of texts, or token ids of this model's vocabulary (a list, or a
list of lists), which are used as given, as TEI uses them: nothing is added, so send [CLS] and [SEP]
yourself (/tokenize gives them). A long input is refused (400), as OpenAI refuses it.

Jina's and Voyage's embedding APIs are OpenAI's route with more fields, and their clients post them here:
the query or document side (Jina's `task`, Voyage's `input_type`) chooses the model's prompt of that side;
`normalized`, `truncate`/`truncation`, `output_dimension`, and the packed-bit output types are honoured. What
would change the answer and cannot be honoured (Jina's late chunking, Voyage's int8) is refused by name.
(No `from __future__ import annotations`: FastAPI reads the handlers' annotations.)"""

import base64
from typing import Literal

import numpy as np
from pydantic import Field

from ..errors import Refused
from ..schemas import Body, Shapes, choose, shape_of_list
from .cohere import packed_bits
from .common import Api, normalized


def one_of(body, *names: str):
    """The value of whichever of `names` (one setting under several APIs' names) the request gave; two that
    disagree are refused (422)."""
    given = [(n, getattr(body, n)) for n in names if getattr(body, n) is not None]
    if len({repr(v) for _, v in given}) > 1:
        (a, x), (b, y) = given[:2]
        raise Refused(422, f"{a} is {x!r} and {b} is {y!r}: they are one setting, give it once", param=b)
    return given[0][1] if given else None


# The head each route needs.
ROUTES = {"/v1/embeddings": "embed", "/embeddings": "embed"}


def bodies(s: Shapes, known: dict[str, type]) -> dict[str, type]:
    """OpenAI's embeddings body (with Jina's, Voyage's and PyLate's fields) for these limits (`s`)."""
    Long, LongList, Ids, IdLists, Dimensions = s.Long, s.LongList, s.Ids, s.IdLists, s.Dimensions

    class OpenAIEmbeddings(Body):
        """OpenAI's body of /v1/embeddings."""

        input: choose(shape_of_list, one=Long, many=LongList, ids=Ids, nested=IdLists) = Field(
            ..., description="a text, a list of texts, or token ids of this model's vocabulary (a list, or a list "
                             "of lists), used as given")
        model: str = Field(..., description="the served model's name (see /info)")
        encoding_format: Literal["float", "base64"] | None = Field("float", description="null: float (Voyage)")
        dimensions: Dimensions = Field(None, description="keep the first N dimensions, then re-normalise")
        user: str | None = Field(None, description="accepted and not used")
        # Jina's embedding fields.
        task: str | None = Field(None, description="Jina's task: retrieval.query / retrieval.passage (or any prompt "
                                                   "name of the model) choose the model's prompt")
        normalized: bool | None = Field(None, description="Jina's: L2-normalise (true) or not (false); null: as the "
                                                          "model does")
        embedding_type: Literal["float", "base64", "binary", "ubinary"] | None = Field(
            None, description="Jina's output type: float, base64 (float32 bytes), or packed sign bits")
        late_chunking: bool | None = Field(None, description="Jina's late chunking: only false (or null)")
        truncate: bool | None = Field(None, description="Jina's: cut inputs longer than the model reads")
        # Voyage's embedding fields.
        input_type: Literal["query", "document"] | None = Field(None, description="Voyage's: chooses the model's "
                                                                                  "query or document prompt")
        truncation: bool | None = Field(None, description="Voyage's: cut inputs longer than the model reads")
        output_dimension: Dimensions = Field(None, description="Voyage's name for dimensions")
        output_dtype: Literal["float", "binary", "ubinary"] | None = Field(
            None, description="Voyage's output type; int8 and uint8 are refused (their calibration is not published)")
        # PyLate's server field.
        is_query: bool | None = Field(None, description="PyLate's server, on a ColBERT model: encode as queries "
                                                        "(true, its default) or documents; each embedding is then "
                                                        "the text's token vectors. Refused on other models")

    return {"openai": OpenAIEmbeddings}


def add(api: Api) -> None:
    service = api.service
    Body = api.bodies["openai"]

    async def embeddings(body: Body):
        api.check_model(body.model)
        if service.colbert is not None:
            return await late_interaction(body)
        if body.is_query is not None:
            raise Refused(422, f"is_query is PyLate's field for a ColBERT model; this model ({service.architecture}) "
                               "gives one vector per text (a query prompt: task or input_type)", param="is_query")
        if body.late_chunking:
            raise Refused(422, "late_chunking: true is not supported: it pools each chunk over the whole document's "
                               "tokens, which bertforge does not implement", param="late_chunking")
        inputs = [body.input] if isinstance(body.input, str) or isinstance(body.input[0], int) else body.input
        truncate = bool(one_of(body, "truncate", "truncation"))
        counts = await api.counted(inputs, "input", service.embed_max_tokens, truncate=truncate,
                             hint="; send truncate (Jina) or truncation (Voyage): true to cut it")
        kind = one_of(body, "task", "input_type")
        field = "task" if body.task is not None else "input_type"
        found = await api.vectors(inputs, counts, prompt=api.prompt(field, kind=kind))
        # The vectors come before the model's own Normalize: shortened ones are re-normalised only for a model that
        # normalises, as OpenAI's models do, or as Jina's `normalized` says.
        unit = service.normalizes if body.normalized is None else body.normalized
        found = normalized(found, one_of(body, "dimensions", "output_dimension"), unit)
        output = one_of(body, "embedding_type", "output_dtype")
        if output is None or output == "float":
            output = "base64" if body.encoding_format == "base64" else "float"
        elif body.encoding_format == "base64" and output != "base64":
            raise Refused(422, f"encoding_format base64 with {output} output: give one", param="encoding_format")

        tokens = sum(min(n, service.embed_max_tokens) for n in counts)

        def encode(v: np.ndarray):
            if output == "base64":
                return base64.b64encode(v.astype("<f4").tobytes()).decode()
            if output in ("binary", "ubinary"):
                return packed_bits(v[None], signed=output == "binary")[0]
            return v.tolist()

        return {"object": "list", "model": service.name,
                "data": [{"object": "embedding", "index": i, "embedding": encode(v)} for i, v in enumerate(found)],
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}

    async def late_interaction(body) -> dict:
        """PyLate's server on a ColBERT model: each input's token vectors as its `embedding` (a list of vectors),
        encoded as a query unless `is_query` is false (PyLate's default is a query). Fields that would reshape one
        vector per text (dimensions, packed or base64 output, normalized: false, Jina's or Voyage's side names
        that disagree with is_query) are refused by name."""
        for name in ("dimensions", "output_dimension", "embedding_type", "output_dtype", "late_chunking"):
            if getattr(body, name) not in (None, "float", False):
                raise Refused(422, f"{name} does not apply to a ColBERT model's token vectors", param=name)
        if body.encoding_format == "base64" or body.normalized is False:
            name = "encoding_format" if body.encoding_format == "base64" else "normalized"
            raise Refused(422, f"{name} does not apply to a ColBERT model's token vectors (float, normalised, as "
                               "PyLate gives them)", param=name)
        if not (isinstance(body.input, str) or isinstance(body.input[0], str)):
            raise Refused(422, "a ColBERT model takes texts here, not token ids (it adds its own prefixes and "
                               "[MASK] expansion)", param="input")
        side = one_of(body, "task", "input_type")
        is_query = True if body.is_query is None else body.is_query
        if side is not None and (side in ("query", "retrieval.query")) != is_query:
            raise Refused(422, f"{'task' if body.task is not None else 'input_type'} {side!r} and is_query "
                               f"{body.is_query} disagree: give one", param="is_query")
        texts = [body.input] if isinstance(body.input, str) else body.input
        most = service.embed_max_tokens
        counts = await api.counted(texts, "input", most, True)  # cut to query_length or document_length, as PyLate cuts
        found = await api.submit("multi_vector", [(t, (is_query,)) for t in texts], sum(min(n, most) for n in counts))
        tokens = sum(min(n, most) for n in counts)
        return {"object": "list", "model": service.name,
                "data": [{"object": "embedding", "index": i, "embedding": v.tolist()} for i, v in enumerate(found)],
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}

    api.post("/v1/embeddings", "openai", "OpenAI-compatible embeddings")(embeddings)
    api.post("/embeddings", "openai", "OpenAI-compatible embeddings (TEI's unversioned path)")(embeddings)
