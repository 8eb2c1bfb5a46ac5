"""Request bodies, with the server's limits written into their schema.

So /docs and /openapi.json state exactly what the server accepts: at most `max_texts` inputs per
request, each non-blank and at most `max_chars` long. A field no endpoint knows is refused (422),
never ignored. Three dialects share the limits:
- bertforge's own (`{"texts": [...]}` -> `{"results": [...]}`);
- text-embeddings-inference's (`/embed` with `inputs`, `/rerank` with `query` and `texts`, `/tokenize`);
- OpenAI's `/v1/embeddings` and Cohere/Jina's `/rerank` (`query`, `documents`, `top_n`).
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Discriminator, Field, StringConstraints, Tag

STRICT = ConfigDict(extra="forbid", strict=True)  # unknown fields refused; 0 is not false, "1" is not 1


def _whole_number(value: Any) -> Any:
    """JSON Schema's integer: 11 and 11.0, not 11.5, "11" or true."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def count(**limits: int) -> Any:
    """An integer field with bounds (`ge`, `le`); the bounds come first so the schema shows them."""
    return Annotated[int, Field(**limits), BeforeValidator(_whole_number)]

DIALECT = "dialect:"  # prefix of the union tags below; error messages leave them out of a field's path


def either(key: str, with_key: type, without_key: type) -> Any:
    """A body that is `with_key` when it holds `key`, else `without_key`: one choice, made up front,
    so an error names the fields of the shape the client meant (not of every shape tried)."""
    def pick(data: Any) -> str:
        return DIALECT + ("a" if isinstance(data, dict) and key in data else "b")

    return Annotated[Annotated[with_key, Tag(DIALECT + "a")] | Annotated[without_key, Tag(DIALECT + "b")],
                     Discriminator(pick)]


class Refused(Exception):
    """An answer other than 200, with its status and one line saying why (`ErrorBody` is its shape)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class ErrorBody(BaseModel):
    """Every error answer: one line saying what is wrong, naming the field or limit."""

    error: str


# The error answers every POST endpoint may give, documented so that clients (and schema-driven
# tests) know them.
ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorBody, "description": "the body is not valid JSON"},
    401: {"model": ErrorBody, "description": "--api-key is set and the request lacks 'Authorization: Bearer KEY'"},
    404: {"model": ErrorBody, "description": "the model has no head for this endpoint"},
    413: {"model": ErrorBody, "description": "the body exceeds --max-body-bytes, or an input is too long and "
                                             "truncation was not asked for"},
    422: {"model": ErrorBody, "description": "a field is missing, unknown, of the wrong type, or over a limit"},
    429: {"model": ErrorBody, "description": "more requests are in flight than --max-concurrent-requests"},
}


class OpenAIError(BaseModel):
    """OpenAI's error detail."""

    message: str
    type: str
    param: str | None
    code: int | None


class OpenAIErrorBody(BaseModel):
    """Every error answer under /v1/, in OpenAI's shape, so its clients raise with the message."""

    error: OpenAIError


OPENAI_ERRORS = {status: {**spec, "model": OpenAIErrorBody} for status, spec in ERRORS.items()}
OPENAI_ERRORS[404] = {"model": OpenAIErrorBody, "description": "the request names a model this server does not serve"}
OPENAI_ERRORS[400] = {"model": OpenAIErrorBody, "description": "malformed JSON, or an input longer than the model reads"}


def request_models(max_texts: int, max_chars: int, mask_token: str = "[MASK]", dimension: int = 768) -> dict[str, Any]:
    """The request body classes of every endpoint, for these limits and a `dimension`-wide embedding."""
    Text = Annotated[str, StringConstraints(min_length=1, max_length=max_chars, pattern=r"\S")]
    TextList = Annotated[list[Text], Field(min_length=1, max_length=max_texts)]
    Masked = Annotated[str, StringConstraints(min_length=1, max_length=max_chars, pattern=re.escape(mask_token))]
    OneOrMore = Text | TextList

    class Texts(BaseModel):
        """bertforge's body of /embed, /ner: the inputs, one string each."""

        model_config = STRICT
        texts: TextList = Field(..., description="the inputs, one string each")

    class TEIEmbed(BaseModel):
        """text-embeddings-inference's body of /embed."""

        model_config = STRICT
        inputs: OneOrMore = Field(..., description="one text, or a list of them")
        normalize: bool = Field(True, description="L2-normalise the vectors")
        truncate: bool = Field(False, description="cut inputs longer than the model reads (else 413)")
        truncation_direction: Literal["right", "Right"] = Field("right", description="only right is supported")
        prompt_name: None = Field(None, description="not supported: prompts come from the model directory")
        dimensions: count(ge=1, le=dimension) | None = Field(
            None, description="keep the first N dimensions")

    class ClassifyTexts(Texts):
        """Body of /classify: texts, and for pair models (MRPC, RTE, NLI) the second segment of each."""

        text_pairs: TextList | None = Field(None, description="the second text of each pair, as many as 'texts'")

    class QAItem(BaseModel):
        """One question about one context."""

        model_config = STRICT
        question: Text
        context: Text

    class QAItems(BaseModel):
        """Several questions, each with its context."""

        model_config = STRICT
        items: Annotated[list[QAItem], Field(min_length=1, max_length=max_texts)]

    class MaskedTexts(BaseModel):
        """Body of /fill-mask: texts with at least one mask token each."""

        model_config = STRICT
        texts: Annotated[list[Masked], Field(min_length=1, max_length=max_texts)] = Field(
            ..., description=f"the inputs, each with at least one {mask_token}")

    class TEIRerank(BaseModel):
        """text-embeddings-inference's body of /rerank: answers [{index, score}], best first."""

        model_config = STRICT
        query: Text
        texts: TextList
        raw_scores: bool = Field(False, description="the logit instead of its sigmoid")
        return_text: bool = Field(False, description="echo each text in its answer")
        truncate: bool = Field(False, description="cut pairs longer than the model reads (else 413)")
        truncation_direction: Literal["right", "Right"] = "right"

    class CohereRerank(BaseModel):
        """Cohere's and Jina's body of /rerank: answers {results: [{index, relevance_score}], ...}."""

        model_config = STRICT
        query: Text
        documents: TextList
        top_n: count(ge=1) | None = Field(None, description="return the best N (default: all)")
        return_documents: bool = Field(False, description="echo each document in its answer")
        model: str | None = Field(None, description="the served model's name, if given")

    class Tokenize(BaseModel):
        """text-embeddings-inference's body of /tokenize."""

        model_config = STRICT
        inputs: OneOrMore
        add_special_tokens: bool = True

    class OpenAIEmbeddings(BaseModel):
        """OpenAI's body of /v1/embeddings."""

        model_config = STRICT
        input: OneOrMore = Field(..., description="one text, or a list of them (token-id inputs are refused)")
        model: str = Field(..., description="the served model's name (see /info)")
        encoding_format: Literal["float", "base64"] = "float"
        dimensions: count(ge=1, le=dimension) | None = Field(
            None, description="keep the first N dimensions, then re-normalise")
        user: str | None = Field(None, description="accepted and not used")

    return {"texts": Texts, "embed": either("texts", Texts, TEIEmbed), "fill-mask": MaskedTexts,
            "classify": ClassifyTexts, "qa": either("items", QAItems, QAItem),
            "rerank": either("documents", CohereRerank, TEIRerank), "tokenize": Tokenize, "openai": OpenAIEmbeddings}
