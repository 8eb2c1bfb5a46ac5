"""text-embeddings-inference's routes, with TEI 1.9's request and answer shapes: POST /embed, /embed_all,
/embed_sparse (a SPLADE model's sparse vectors), /predict, /rerank, /similarity, /tokenize, /decode; and, in the
same style, /embed_multi_vector (a ColBERT model's token vectors, which TEI does not serve).
/embed and /rerank also take bertforge's `{"texts"}` and Cohere's `{"documents"}`, chosen by the body's keys.
(No `from __future__ import annotations`: FastAPI reads the handlers' annotations.)"""

from typing import Annotated

import numpy as np
from pydantic import Field

from ...inference.hf_pipeline import ranked
from ...interop.sentence_dir import side_prompt
from ...inference.sparse import readable, sparse_items
from ..errors import Refused
from ..schemas import (DIRECTION, NO_PROMPTS, OPTIONS, PROMPT_NAME, TRUNCATE, Body, InferenceOptions, Shapes,
                       TruncationDirection, choose, either, shape_of_list)
from .bertforge import embed_texts
from .cohere import rerank as cohere_rerank
from .common import Api, normalized, side_of


def tei_activation(logits: list[float], raw_scores: bool) -> str:
    """TEI's rule: the logits as they are with raw_scores, else a sigmoid for one logit and a softmax for more."""
    return "none" if raw_scores else "sigmoid" if len(logits) == 1 else "softmax"


async def classify_pairs(api: Api, sequences: list[list[str]], truncate: bool, side: str, field: str) -> list[dict]:
    """The classifier's rows (with logits) for [text] or [text, pair] sequences."""
    texts = [s[0] for s in sequences]
    pairs = [s[1] if len(s) > 1 else None for s in sequences]
    singles = [i for i, p in enumerate(pairs) if p is None]
    limit = api.service.config.max_sequence_length
    counts = [0] * len(sequences)
    for rows, with_pairs in ((singles, None), ([i for i in range(len(pairs)) if pairs[i] is not None], True)):
        if rows:
            found = await api.counted([texts[i] for i in rows], field, limit, truncate,
                                      [pairs[i] for i in rows] if with_pairs else None,
                                      names=[f"{field}[{i}]" + ("[0]" if with_pairs else "") for i in rows],
                                      pair_names=[f"{field}[{i}][1]" for i in rows])
            for i, n in zip(rows, found):
                counts[i] = n
    items = [((t, p), (side,)) for t, p in zip(texts, pairs)]
    return await api.submit("classify", items, sum(min(n, limit) for n in counts))


def setting(body, name: str):
    """A feature-extraction setting, given at the top level (TEI) or in `parameters` (the Inference API); given in
    both with different values, refused (422) rather than one silently chosen."""
    top, parameters = getattr(body, name), body.parameters
    inner = getattr(parameters, name) if parameters is not None else None
    if inner is None:
        return top
    if top is not None and name in body.model_fields_set and top != inner:
        raise Refused(422, f"{name} is {top!r} and parameters.{name} is {inner!r}: give it once", param=name)
    return inner


async def embed_tei(api: Api, body) -> list:
    """TEI's /embed (and the Inference API's feature-extraction): a vector per input."""
    one = isinstance(body.inputs, str) or isinstance(body.inputs[0], int)  # a text, or one input's token ids
    texts = [body.inputs] if one else body.inputs
    counts = await api.counted(texts, "inputs", api.service.embed_max_tokens, api.truncates(setting(body, "truncate")))
    prompt = api.prompt("prompt_name", name=setting(body, "prompt_name"))
    found = await api.vectors(texts, counts, side_of(setting(body, "truncation_direction")), prompt)
    return [v.tolist() for v in normalized(found, body.dimensions, setting(body, "normalize"))]


async def predict_tei(api: Api, body) -> list:
    """TEI's /predict: [{label, score}] best first for one input, a list of those for a batch."""
    one = isinstance(body.inputs, str) or (body.inputs and isinstance(body.inputs[0], str))
    sequences = [[body.inputs]] if isinstance(body.inputs, str) else [body.inputs] if one else body.inputs
    rows = await classify_pairs(api, sequences, api.truncates(body.truncate), side_of(body.truncation_direction),
                                "inputs")
    names = api.service.config.label_names
    answers = [ranked(r["logits"], names, tei_activation(r["logits"], body.raw_scores)) for r in rows]
    return answers[0] if one else answers


async def rerank_tei(api: Api, body) -> list:
    """TEI's /rerank: [{index, score}] best first."""
    # A ColBERT model encodes the query and each text apart, each cut to its own length (PyLate's rule): a pair is
    # never too long for it.
    truncate = api.truncates(body.truncate) or api.service.colbert is not None
    counts = await api.counted([body.query] * len(body.texts), "texts", api.service.config.max_sequence_length,
                               truncate, body.texts, names=["query"] * len(body.texts))
    scored, _ = await api.scores(body.query, body.texts, side_of(body.truncation_direction), counts)
    order = sorted(range(len(body.texts)), key=lambda i: -scored[i][0])  # stable: ties keep input order
    return [{"index": i, "score": scored[i][1] if body.raw_scores else scored[i][0]}
            | ({"text": body.texts[i]} if body.return_text else {}) for i in order]


async def similarity_tei(api: Api, body) -> list[float]:
    """TEI's /similarity (the Inference API's sentence-similarity): cosine with the source sentence."""
    parameters = body.parameters
    truncate = api.truncates(parameters.truncate if parameters else None)
    side = side_of(parameters.truncation_direction if parameters else "right")
    texts = [body.inputs.source_sentence, *body.inputs.sentences]
    counts = await api.counted(texts, "inputs.sentences", api.service.embed_max_tokens, truncate,
                               names=["inputs.source_sentence", *(f"inputs.sentences[{i}]"
                                                                  for i in range(len(texts) - 1))])
    prompt = api.prompt("parameters.prompt_name", name=parameters.prompt_name if parameters else None)
    unit = np.stack(normalized(await api.vectors(texts, counts, side, prompt), None, True))
    return [float(x) for x in unit[1:] @ unit[0]]


# The head each route needs (None: every model answers it): /embed_sparse a SPLADE model's, /embed_multi_vector
# a ColBERT model's.
ROUTES = {"/embed": "embed", "/embed_all": "embed", "/embed_sparse": "splade", "/embed_multi_vector": "multi_vector",
          "/predict": "classify", "/rerank": "rerank", "/similarity": "embed", "/tokenize": None, "/decode": None}


def bodies(s: Shapes, known: dict[str, type]) -> dict[str, type]:
    """TEI's request bodies for these limits (`s`); /embed and /rerank also take bertforge's `{"texts"}` and
    Cohere's `{"documents"}` (`known`: the bodies of the dialects read before this one), chosen by the body's keys."""
    (Long, LongList, Ids, IdLists, LongOneOrMore, Dimensions, PromptName, max_texts) = (
        s.Long, s.LongList, s.Ids, s.IdLists, s.LongOneOrMore, s.Dimensions, s.PromptName, s.max_texts)

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

        inputs: choose(shape_of_list, one=Long, many=LongList, ids=Ids, nested=IdLists) = Field(
            ..., description="one text, a list of texts, or token ids of this model's vocabulary (a list, or a list "
                             "of lists), used as given, as TEI takes them")
        normalize: bool = Field(True, description="L2-normalise the vectors")
        dimensions: Dimensions = Field(None, description="keep the first N dimensions (then normalise)")
        prompt_name: PromptName = PROMPT_NAME
        parameters: EmbedParameters | None = Field(None, description="the Inference API's form of the settings above")

    Pair = Annotated[list[Long], Field(min_length=1, max_length=2)]
    PredictInput = choose(shape_of_list, one=Long, many=Pair,
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

        ids: choose(lambda v: "nested" if shape_of_list(v) == "nested" else "ids", ids=Ids, nested=IdLists)
        skip_special_tokens: bool = True

    return {"embed": either("texts", known["texts"], TEIEmbed),
            "rerank": either("documents", known["cohere-rerank"], TEIRerank), "tokenize": Tokenize, "embed_all": TEIEmbedAll, "embed_sparse": TEIEmbedSparse,
            "embed_multi_vector": EmbedMultiVector, "predict": TEIPredict, "similarity": TEISimilarity,
            "decode": Decode, "tei-embed": TEIEmbed, "tei-rerank": TEIRerank}


def add(api: Api) -> None:
    service, bodies = api.service, api.bodies
    EmbedBody, EmbedAllBody, PredictBody = bodies["embed"], bodies["embed_all"], bodies["predict"]
    EmbedSparseBody, MultiVectorBody = bodies["embed_sparse"], bodies["embed_multi_vector"]
    RerankBody, SimilarityBody, TokenizeBody, DecodeBody = (bodies["rerank"], bodies["similarity"], bodies["tokenize"],
                                                            bodies["decode"])
    most = service.embed_max_tokens

    @api.post("/embed", "tei", "sentence vectors: {'inputs', 'normalize', 'truncate', ...} (TEI) or {'texts'} "
                               "(bertforge)")
    async def embed(body: EmbedBody):
        if hasattr(body, "texts"):
            return await embed_texts(api, body.texts)
        return await embed_tei(api, body)

    @api.post("/embed_all", "tei", "every token's vector of each input, special tokens included (TEI's /embed_all)")
    async def embed_all(body: EmbedAllBody):
        texts = [body.inputs] if isinstance(body.inputs, str) else body.inputs
        counts = await api.counted(texts, "inputs", most, api.truncates(body.truncate))
        found = await api.submit("embed_all", [(t, (side_of(body.truncation_direction),)) for t in texts],
                                 sum(min(n, most) for n in counts))
        return [v.tolist() for v in found]

    @api.post("/embed_sparse", "tei", "a SPLADE model's sparse vectors: [{'index', 'value'}] per input (TEI's "
                                      "/embed_sparse), or {token: weight} with 'readable': true")
    async def embed_sparse(body: EmbedSparseBody):
        if service.splade is None:
            raise Refused(404, f"this model ({service.architecture}) is not a SPLADE model: /embed_sparse needs a "
                               "sentence-transformers SparseEncoder directory; use /embed")
        texts = [body.inputs] if isinstance(body.inputs, str) else body.inputs
        # An inference-free model's queries are cut to its query tokenizer's length, as SparseStaticEmbedding cuts
        # them: the document encoder's limit does not apply to them.
        static = body.is_query and service.splade.model.inference_free
        counts = await api.counted(texts, "inputs", most, api.truncates(body.truncate) or static)
        prompt = api.prompt("prompt_name", name=body.prompt_name)
        if body.is_query and body.prompt_name is None:  # as SparseEncoder.encode_query: the "query" prompt, if any
            prompt = side_prompt(service.sentence.prompts, "query")
        found = await api.submit("splade", [(t, (side_of(body.truncation_direction), prompt, body.is_query))
                                            for t in texts], sum(min(n, most) for n in counts))
        from scipy import sparse

        items = sparse_items(sparse.vstack(found, format="csr")) if found else []
        return [readable(row, service.tokenizer) for row in items] if body.readable else items

    @api.post("/embed_multi_vector", "tei", "a ColBERT model's token vectors of each input, as a query or a document "
                                            "({'inputs', 'is_query'}; PyLate's encode)")
    async def embed_multi_vector(body: MultiVectorBody):
        if service.colbert is None:
            raise Refused(404, f"this model ({service.architecture}) is not a ColBERT model: /embed_multi_vector needs "
                               "a PyLate ColBERT directory; use /embed_all for a plain encoder's token vectors")
        texts = [body.inputs] if isinstance(body.inputs, str) else body.inputs
        # ColBERT cuts every text to its query_length or document_length, as PyLate does: nothing to refuse.
        counts = await api.counted(texts, "inputs", most, True)
        found = await api.submit("multi_vector", [(t, (body.is_query,)) for t in texts], sum(min(n, most) for n in counts))
        return [v.tolist() for v in found]

    @api.post("/predict", "tei", "classify a text, a pair [text, text], or a batch of them (TEI's /predict)")
    async def predict(body: PredictBody):
        return await predict_tei(api, body)

    @api.post("/rerank", "tei", "score texts against a query: TEI's {'query', 'texts'}, or Cohere's {'query', "
                                "'documents'} (see /v1/rerank)")
    async def rerank(body: RerankBody):
        if hasattr(body, "documents"):
            return await cohere_rerank(api, body, version=None)
        return await rerank_tei(api, body)

    @api.post("/similarity", "tei", "cosine similarity of each sentence with the source sentence (TEI's /similarity)")
    async def similarity(body: SimilarityBody):
        return await similarity_tei(api, body)

    @api.post("/tokenize", "tei", "the tokens of each input (TEI's /tokenize)")
    async def tokenize(body: TokenizeBody):
        texts = [body.inputs] if isinstance(body.inputs, str) else body.inputs
        return await service.off_loop(service.tokenize, texts, body.add_special_tokens)

    @api.post("/decode", "tei", "token ids back to text (TEI's /decode)")
    async def decode(body: DecodeBody):
        rows = body.ids if isinstance(body.ids[0], list) else [body.ids]
        return await service.off_loop(service.decode, rows, body.skip_special_tokens)
