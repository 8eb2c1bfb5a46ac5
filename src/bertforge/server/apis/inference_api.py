"""POST / and POST /invocations (SageMaker's path): the model's own task, as TEI routes them, and the
Hugging Face Inference API's payloads, so `huggingface_hub.InferenceClient(base_url=...)` works.

Which task runs is decided by the model's head, then by the payload:
- a fill-mask model: fill-mask (`{"inputs": "... [MASK] ...", "parameters": {top_k, targets}}`);
- a token classifier: token-classification; a QA model: question-answering (`{"inputs": {question, context}}`);
- a one-logit cross-encoder (TEI's "reranker"): `{"query", "texts"}` reranks as /rerank does; otherwise as a
  classifier;
- a classifier: `{"inputs", "parameters"}` is the Inference API's text-classification (`[[{label, score}]]`,
  all labels best first unless `top_k`); without `parameters`, TEI's /predict;
- any other model (an embedding model): `{"inputs": {"source_sentence", "sentences"}}` is sentence-similarity,
  as TEI's /similarity; any other `inputs` is feature-extraction, as TEI's /embed.
(No `from __future__ import annotations`: FastAPI reads the handlers' annotations.)
"""

from typing import Annotated, Literal

from pydantic import Field

from ...inference.hf_pipeline import default_activation, fill_mask_rows, ranked
from ..schemas import OPTIONS, Body, InferenceOptions, Shapes, choose, count, shape_of_list
from .common import Api
from .tei import classify_pairs, embed_tei, predict_tei, rerank_tei, similarity_tei


async def fill_mask(api: Api, body) -> list:
    """[{score, token, token_str, sequence}] for a text with one mask, one such list per mask for more, as
    transformers' fill-mask pipeline gives them (`sequence` keeps special tokens when there are several masks)."""
    service = api.service
    texts = [body.inputs] if isinstance(body.inputs, str) else body.inputs
    params = body.parameters
    options = ((params.top_k if params and params.top_k else 5),
               tuple(params.targets) if params and params.targets else None)
    # the ids the pipeline reads: for the budget and `sequence`
    encoded = await service.off_loop(lambda: [service.encode(t) for t in texts])
    found = await api.submit("fill-mask", [(t, options) for t in texts], sum(len(ids) for ids in encoded))
    out = [fill_mask_rows(ids, masks, service.tokenizer.mask_token_id, service.decode)
           for ids, masks in zip(encoded, found)]
    return out[0] if isinstance(body.inputs, str) else out


async def text_classification(api: Api, body) -> list:
    """[[{label, score}]]: per input, the labels best first (all, or `top_k`), scored by `function_to_apply`
    (default as transformers: a sigmoid for one logit or several independent labels, else a softmax)."""
    texts = [body.inputs] if isinstance(body.inputs, str) else body.inputs
    rows = await classify_pairs(api, [[t] for t in texts], api.truncates(None), "right", "inputs")
    how = body.parameters.function_to_apply or default_activation(api.service.model.problem_type(),
                                                                  api.service.config.num_labels)
    names = api.service.config.label_names
    return [ranked(r["logits"], names, how, body.parameters.top_k) for r in rows]


async def token_classification(api: Api, body) -> list:
    """[{entity_group, score, word, start, end}] per input (one list for a single text)."""
    texts = [body.inputs] if isinstance(body.inputs, str) else body.inputs
    params = body.parameters
    options = ((params.aggregation_strategy if params and params.aggregation_strategy else "first"),
               (params.stride if params and params.stride is not None else 64))
    found = await api.submit("ner", [(t, options) for t in texts], sum(await api.service.tokens(texts)))
    ignored = set(params.ignore_labels or []) if params else set()
    found = [[e for e in entities if e["entity_group"] not in ignored] for entities in found]
    return found[0] if isinstance(body.inputs, str) else found


async def question_answering(api: Api, body) -> dict:
    """{answer, score, start, end}."""
    params = body.parameters
    item = body.inputs.model_dump()
    options = ((params.max_seq_len if params and params.max_seq_len else 384),
               (params.doc_stride if params and params.doc_stride else 128),
               (params.max_answer_len if params and params.max_answer_len else 30))
    counts = await api.service.tokens([item["question"]], [item["context"]])
    return (await api.submit("qa", [(item, options)], sum(counts)))[0]


# The head each route needs: none, each answers the model's own task.
ROUTES = {"/": None, "/invocations": None}


def bodies(s: Shapes, known: dict[str, type]) -> dict[str, type]:
    """The Hugging Face Inference API's payloads at / for these limits (`s`); its question-answering input is
    bertforge's question and context (`known`)."""
    (Text, Masked, MaskedList, OneOrMore, LongOneOrMore, TopK, max_texts) = (
        s.Text, s.Masked, s.MaskedList, s.OneOrMore, s.LongOneOrMore, s.TopK, s.max_texts)
    QAItem = known["qa-item"]

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

        inputs: choose(shape_of_list, one=Masked, many=MaskedList)
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

    return {"hf-classify": HFClassify, "hf-fill-mask": HFFillMask, "hf-tokens": HFTokens, "hf-qa": HFQA}


def add(api: Api) -> None:
    service, bodies = api.service, api.bodies
    tasks = service.tasks
    if "fill-mask" in tasks:
        Body, run, what = bodies["hf-fill-mask"], fill_mask, "fill-mask"
    elif "ner" in tasks:
        Body, run, what = bodies["hf-tokens"], token_classification, "token-classification"
    elif "qa" in tasks:
        Body, run, what = bodies["hf-qa"], question_answering, "question-answering"
    elif "classify" in tasks:
        shapes = {"hf": bodies["hf-classify"], "predict": bodies["predict"]}
        if service.kind == "reranker":
            shapes["rerank"] = bodies["tei-rerank"]

        def pick(data) -> str:
            if isinstance(data, dict) and "query" in data and "rerank" in shapes:
                return "rerank"
            return "hf" if isinstance(data, dict) and "parameters" in data else "predict"

        Body = choose(pick, **shapes)
        what = "rerank, text-classification or predict, by the payload"

        async def run(api: Api, body):
            if hasattr(body, "query"):
                return await rerank_tei(api, body)
            if hasattr(body, "parameters"):
                return await text_classification(api, body)
            return await predict_tei(api, body)
    else:
        def pick(data) -> str:
            return "similarity" if isinstance(data, dict) and isinstance(data.get("inputs"), dict) else "embed"

        Body = choose(pick, embed=bodies["tei-embed"], similarity=bodies["similarity"])
        what = "feature-extraction (TEI's /embed) or sentence-similarity, by the payload"

        async def run(api: Api, body):
            if hasattr(body, "normalize"):
                return await embed_tei(api, body)
            return await similarity_tei(api, body)

    async def own_task(body: Body):
        return await run(api, body)

    api.post("/", "tei", f"this model's own task: {what} (the Inference API's and TEI's /)")(own_task)
    api.post("/invocations", "tei", f"this model's own task: {what} (SageMaker's path)")(own_task)
