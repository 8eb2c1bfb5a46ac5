"""Request bodies of every route, with the server's limits written into their schema.

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


def _shape_of_list(value: Any) -> str:
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


def request_models(max_texts: int, max_chars: int, mask_token: str = "[MASK]", dimension: int = 768,
                   vocab_size: int = 30522, prompts: tuple[str, ...] = ()) -> dict[str, Any]:
    """The request body classes of every route, for these limits, a `dimension`-wide embedding, a
    vocabulary of `vocab_size` ids and the model's named `prompts`."""
    Text = Annotated[str, StringConstraints(min_length=1, max_length=max_chars, pattern=NOT_BLANK)]
    TextList = Annotated[list[Text], Field(min_length=1, max_length=max_texts)]
    Long = Annotated[str, StringConstraints(min_length=1, pattern=NOT_BLANK)]  # may be truncated: see the module doc
    LongList = Annotated[list[Long], Field(min_length=1, max_length=max_texts)]
    Masked = Annotated[str, StringConstraints(min_length=1, max_length=max_chars, pattern=re.escape(mask_token))]
    MaskedList = Annotated[list[Masked], Field(min_length=1, max_length=max_texts)]
    Id = count(ge=0, lt=vocab_size)
    Ids = Annotated[list[Id], Field(min_length=1)]
    IdLists = Annotated[list[Ids], Field(min_length=1, max_length=max_texts)]
    OneOrMore = choose(_shape_of_list, one=Text, many=TextList)
    LongOneOrMore = choose(_shape_of_list, one=Long, many=LongList)
    Dimensions = count(ge=1, le=dimension) | None
    PromptName = Literal[prompts] | None if prompts else type(None)  # the schema names the model's prompts
    TopK = count(ge=1) | None

    class Body(BaseModel):
        model_config = STRICT

    # ------------------------------------------------------------------ bertforge
    class Texts(Body):
        """bertforge's body of /embed, /ner: the inputs, one string each."""

        texts: TextList = Field(..., description="the inputs, one string each")

    class ClassifyTexts(Texts):
        """Body of /classify: texts, and for pair models (MRPC, RTE, NLI) the second segment of each."""

        text_pairs: TextList | None = Field(None, description="the second text of each pair, as many as 'texts'")

    class QAItem(Body):
        """One question about one context."""

        question: Text
        context: Text

    class QAItems(Body):
        """Several questions, each with its context."""

        items: Annotated[list[QAItem], Field(min_length=1, max_length=max_texts)]

    class MaskedTexts(Body):
        """Body of /fill-mask: texts with at least one mask token each."""

        texts: MaskedList = Field(..., description=f"the inputs, each with at least one {mask_token}")

    # ------------------------------------------------------------------ text-embeddings-inference
    class TEIEmbedAll(Body):
        """TEI's body of /embed_all (and /embed_sparse): every token's vector."""

        inputs: LongOneOrMore = Field(..., description="one text, or a list of them")
        truncate: bool | None = TRUNCATE
        truncation_direction: TruncationDirection = DIRECTION
        prompt_name: None = NO_PROMPTS
        options: InferenceOptions | None = OPTIONS

    class TEIEmbedSparse(TEIEmbedAll):
        """TEI's body of /embed_sparse: a SPLADE model's sparse vector of each input, with a named prompt."""

        prompt_name: PromptName = PROMPT_NAME
        readable: bool = Field(False, description="bertforge: answer each input as {token: weight}, heaviest first, "
                                                  "instead of TEI's [{'index', 'value'}]")
        is_query: bool = Field(False, description="bertforge: encode as SparseEncoder.encode_query does (the query "
                                                  "route: an inference-free model's query weights; the 'query' "
                                                  "prompt unless prompt_name says another); else the model's "
                                                  "default route")

    class EmbedMultiVector(TEIEmbedAll):
        """Body of /embed_multi_vector: a ColBERT model's token vectors of each input, as a query or a document."""

        is_query: bool = Field(False, description="encode as queries (prefix, [MASK] expansion to query_length), "
                                                  "else as documents (punctuation dropped), as PyLate's encode")

    class EmbedParameters(Body):
        """The Inference API's feature-extraction parameters (the same settings as TEI's top-level fields)."""

        normalize: bool | None = None
        truncate: bool | None = None
        truncation_direction: TruncationDirection | None = None
        prompt_name: PromptName = PROMPT_NAME

    class TEIEmbed(TEIEmbedAll):
        """TEI's body of /embed, and the Inference API's feature-extraction (`parameters`)."""

        inputs: choose(_shape_of_list, one=Long, many=LongList, ids=Ids, nested=IdLists) = Field(
            ..., description="one text, a list of texts, or token ids of this model's vocabulary (a list, or a list "
                             "of lists), used as given, as TEI takes them")
        normalize: bool = Field(True, description="L2-normalise the vectors")
        dimensions: Dimensions = Field(None, description="keep the first N dimensions (then normalise)")
        prompt_name: PromptName = PROMPT_NAME
        parameters: EmbedParameters | None = Field(None, description="the Inference API's form of the settings above")

    Pair = Annotated[list[Long], Field(min_length=1, max_length=2)]
    PredictInput = choose(_shape_of_list, one=Long, many=Pair,
                          nested=Annotated[list[Pair], Field(min_length=1, max_length=max_texts)])

    class TEIPredict(Body):
        """TEI's body of /predict: a text, a pair [text, text], or a batch of [text] and [text, text]."""

        inputs: PredictInput
        truncate: bool | None = TRUNCATE
        truncation_direction: TruncationDirection = DIRECTION
        raw_scores: bool = Field(False, description="the logits instead of the probabilities")
        options: InferenceOptions | None = OPTIONS

    class TEIRerank(Body):
        """TEI's body of /rerank: answers [{index, score}], best first."""

        query: Long
        texts: LongList
        raw_scores: bool = Field(False, description="the logit instead of its sigmoid")
        return_text: bool = Field(False, description="echo each text in its answer")
        truncate: bool | None = TRUNCATE
        truncation_direction: TruncationDirection = DIRECTION

    class SimilarityInput(Body):
        source_sentence: Long
        sentences: LongList

    class SimilarityParameters(Body):
        truncate: bool | None = TRUNCATE
        truncation_direction: TruncationDirection = DIRECTION
        prompt_name: PromptName = PROMPT_NAME

    class TEISimilarity(Body):
        """TEI's body of /similarity (and the Inference API's sentence-similarity at /): cosine of each
        sentence's vector with the source sentence's."""

        inputs: SimilarityInput
        parameters: SimilarityParameters | None = None
        options: InferenceOptions | None = OPTIONS

    class Tokenize(Body):
        """TEI's body of /tokenize."""

        inputs: LongOneOrMore
        add_special_tokens: bool = True
        prompt_name: None = NO_PROMPTS

    class Decode(Body):
        """TEI's body of /decode: token ids back to text."""

        ids: choose(lambda v: "nested" if _shape_of_list(v) == "nested" else "ids", ids=Ids, nested=IdLists)
        skip_special_tokens: bool = True

    # ------------------------------------------------------------------ Hugging Face Inference API at /
    class ClassifyParameters(Body):
        top_k: TopK = Field(None, description="the best K labels (default: all)")
        function_to_apply: Literal["softmax", "sigmoid", "none"] | None = None

    class HFClassify(Body):
        """The Inference API's text-classification payload: answers [[{label, score}]] per input."""

        inputs: LongOneOrMore
        parameters: ClassifyParameters
        options: InferenceOptions | None = OPTIONS

    class FillMaskParameters(Body):
        top_k: TopK = Field(None, description="predictions per mask (default 5)")
        targets: Annotated[list[Text], Field(min_length=1, max_length=max_texts)] | None = None

    class HFFillMask(Body):
        """The Inference API's fill-mask payload: [{score, token, token_str, sequence}]."""

        inputs: choose(_shape_of_list, one=Masked, many=MaskedList)
        parameters: FillMaskParameters | None = None
        options: InferenceOptions | None = OPTIONS

    class TokenParameters(Body):
        aggregation_strategy: Literal["first", "average", "max"] | None = Field(
            None, description="how word labels come from sub-tokens (default first)")
        ignore_labels: list[str] | None = None
        stride: count(ge=0) | None = None

    class HFTokens(Body):
        """The Inference API's token-classification payload: [{entity_group, score, word, start, end}]."""

        inputs: OneOrMore
        parameters: TokenParameters | None = None
        options: InferenceOptions | None = OPTIONS

    class QAParameters(Body):
        top_k: count(ge=1, le=1) | None = Field(None, description="only the best answer is given")
        doc_stride: count(ge=1) | None = None
        max_answer_len: count(ge=1) | None = None
        max_seq_len: count(ge=8) | None = None

    class HFQA(Body):
        """The Inference API's question-answering payload: {answer, score, start, end}."""

        inputs: QAItem
        parameters: QAParameters | None = None
        options: InferenceOptions | None = OPTIONS

    # ------------------------------------------------------------------ OpenAI
    class OpenAIEmbeddings(Body):
        """OpenAI's body of /v1/embeddings."""

        input: choose(_shape_of_list, one=Long, many=LongList, ids=Ids, nested=IdLists) = Field(
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

    # ------------------------------------------------------------------ Cohere and Jina
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

    TEIRerankOrCohere = either("documents", CohereRerank, TEIRerank)

    return {"texts": Texts, "embed": either("texts", Texts, TEIEmbed), "fill-mask": MaskedTexts,
            "classify": ClassifyTexts, "qa": either("items", QAItems, QAItem), "rerank": TEIRerankOrCohere,
            "tokenize": Tokenize, "openai": OpenAIEmbeddings, "embed_all": TEIEmbedAll, "embed_sparse": TEIEmbedSparse,
            "embed_multi_vector": EmbedMultiVector,
            "predict": TEIPredict,
            "similarity": TEISimilarity, "decode": Decode, "hf-classify": HFClassify, "hf-fill-mask": HFFillMask,
            "hf-tokens": HFTokens, "hf-qa": HFQA, "tei-embed": TEIEmbed, "tei-rerank": TEIRerank,
            "cohere-rerank": CohereRerank, "cohere-embed": CohereEmbed}
