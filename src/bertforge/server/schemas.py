"""What every dialect's request bodies are made of, with the server's limits written into their schema; each
dialect (`apis/<dialect>.py`) declares its own bodies from these `Shapes`.

So /docs and /openapi.json state exactly what the server accepts: at most `max_texts` inputs per
request, each non-blank, token ids inside the vocabulary. A field no route knows is refused, never
ignored, with one exception: the Hugging Face Inference API's `options` object, whose keys beyond the two it
documents are accepted and named back in the `X-Bertforge-Ignored` response header (and the log), as real
clients (langchain's) send it whatever the server. Where a value may take several shapes (one text or a list; texts or token ids), the shape is
chosen up front from the value itself (`choose`), so an error names the field of the shape the client
sent, not of every shape tried. The dialects:
- bertforge's own (`{"texts": [...]}` -> `{"results": [...]}`);
- text-embeddings-inference's (`/embed`, `/embed_all`, `/predict`, `/rerank`, `/similarity`, `/tokenize`,
  `/decode`), and the Hugging Face Inference API's payloads at `/` (`{"inputs", "parameters"}`);
- OpenAI's `/v1/embeddings`; Cohere's `/v1|v2/rerank` and `/v1|v2/embed` (Jina's `/v1/rerank` is Cohere's v1).

Texts that may be truncated (TEI's, OpenAI's, Cohere's) carry no character limit in the schema: with
truncation asked for, a text of any length is cut (the body limit still bounds it); without, the route
refuses one over `--max-chars` itself.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import (BaseModel, BeforeValidator, ConfigDict, Discriminator, Field, StringConstraints, Tag,
                      model_validator)

from .errors import DIALECT

STRICT = ConfigDict(extra="forbid", strict=True)  # unknown fields refused; 0 is not false, "1" is not 1

# The fields a request sent that were accepted without effect (`options.x`), for the response header: the server's
# middleware sets a fresh list for each request, validation adds to it.
IGNORED: ContextVar[list[str] | None] = ContextVar("ignored_fields", default=None)


class InferenceOptions(BaseModel):
    """The Hugging Face Inference API's `options`. Both documented keys hold here without doing anything: the
    model is loaded before the server answers (`wait_for_model`), and the server keeps no cache (`use_cache`:
    every answer is computed). Other keys are accepted and named back (`X-Bertforge-Ignored`)."""

    model_config = ConfigDict(extra="allow", strict=True)

    wait_for_model: bool | None = Field(None, description="holds always: the model is loaded before any answer")
    use_cache: bool | None = Field(None, description="holds always: no answer is cached, each is computed")

    @model_validator(mode="after")
    def _note_extra(self) -> InferenceOptions:
        ignored = IGNORED.get()
        if ignored is not None:
            ignored.extend(f"options.{key}" for key in (self.model_extra or {}))
        return self


OPTIONS = Field(None, description="the Inference API's options: wait_for_model and use_cache hold already; other "
                                  "keys are ignored and named in the X-Bertforge-Ignored header")


def _whole_number(value: Any) -> Any:
    """JSON Schema's integer: 11 and 11.0, not 11.5, "11" or true."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def count(**limits: int) -> Any:
    """An integer field with bounds (`ge`, `le`, `lt`); the bounds come first so the schema shows them."""
    return Annotated[int, Field(**limits), BeforeValidator(_whole_number)]


def choose(pick: Callable[[Any], str], **shapes: Any) -> Any:
    """A value of one of `shapes` (name -> type), the one named by `pick(value)`: chosen before validating."""
    options = [Annotated[shape, Tag(DIALECT + name)] for name, shape in shapes.items()]
    union = options[0]
    for option in options[1:]:
        union = union | option
    return Annotated[union, Discriminator(lambda value: DIALECT + pick(value))]


def either(key: str, with_key: type, without_key: type) -> Any:
    """A body that is `with_key` when it holds `key`, else `without_key`."""
    return choose(lambda data: "a" if isinstance(data, dict) and key in data else "b", a=with_key, b=without_key)


def shape_of_list(value: Any) -> str:
    """"one" for a string, "nested" for a list whose first item is a list, "ids" for one of integers, else "many"."""
    if isinstance(value, str) or not isinstance(value, list):
        return "one"
    first = value[0] if value else None
    number = isinstance(first, (int, float)) and not isinstance(first, bool)  # 7.0 is JSON Schema's integer too
    return "nested" if isinstance(first, list) else "ids" if number else "many"


# A text must hold something other than white space. "White space" is written out so that JSON Schema's
# regular expressions (ECMAScript's \s has U+FEFF, not U+0085) and pydantic's (Rust's \s: U+0085, not U+FEFF)
# mean the same set: the schema states exactly what the server accepts.
NOT_BLANK = r"[^\s\u0085\ufeff]"

TruncationDirection = Literal["left", "right", "Left", "Right"]
TRUNCATE = Field(None, description="cut inputs longer than the model reads; null: the server's --auto-truncate")
DIRECTION = Field("right", description="which end of a long input is cut")
NO_PROMPTS = Field(None, description="not supported on this route (see /embed)")
PROMPT_NAME = Field(None, description="one of the model's named prompts (config_sentence_transformers.json), put "
                                      "before each text; null: its default prompt")




class Body(BaseModel):
    """A request body: unknown fields refused, no coercion (`STRICT`)."""

    model_config = STRICT


@dataclass(frozen=True)
class Shapes:
    """The field types of one server's bodies, its limits written in: non-blank texts (`Text`: at most --max-chars;
    `Long`: a text that may be truncated, see the module doc), lists of at most `max_texts`, texts with the mask
    token, token ids of the vocabulary, a vector width up to the model's, and the model's named prompts."""

    max_texts: int
    mask_token: str
    Text: Any
    TextList: Any
    Long: Any
    LongList: Any
    Masked: Any
    MaskedList: Any
    Ids: Any
    IdLists: Any
    OneOrMore: Any
    LongOneOrMore: Any
    Dimensions: Any
    PromptName: Any
    TopK: Any


def shapes(max_texts: int, max_chars: int, mask_token: str = "[MASK]", dimension: int = 768,
           vocab_size: int = 30522, prompts: tuple[str, ...] = ()) -> Shapes:
    """The `Shapes` for these limits, a `dimension`-wide embedding, a vocabulary of `vocab_size` ids and the
    model's named `prompts`."""
    Text = Annotated[str, StringConstraints(min_length=1, max_length=max_chars, pattern=NOT_BLANK)]
    TextList = Annotated[list[Text], Field(min_length=1, max_length=max_texts)]
    Long = Annotated[str, StringConstraints(min_length=1, pattern=NOT_BLANK)]
    LongList = Annotated[list[Long], Field(min_length=1, max_length=max_texts)]
    Masked = Annotated[str, StringConstraints(min_length=1, max_length=max_chars, pattern=re.escape(mask_token))]
    Ids = Annotated[list[count(ge=0, lt=vocab_size)], Field(min_length=1)]
    return Shapes(
        max_texts=max_texts, mask_token=mask_token, Text=Text, TextList=TextList, Long=Long, LongList=LongList,
        Masked=Masked, MaskedList=Annotated[list[Masked], Field(min_length=1, max_length=max_texts)], Ids=Ids,
        IdLists=Annotated[list[Ids], Field(min_length=1, max_length=max_texts)],
        OneOrMore=choose(shape_of_list, one=Text, many=TextList),
        LongOneOrMore=choose(shape_of_list, one=Long, many=LongList),
        Dimensions=count(ge=1, le=dimension) | None,
        PromptName=Literal[prompts] | None if prompts else type(None),  # the schema names the model's prompts
        TopK=count(ge=1) | None)
