"""bertforge's own routes: POST /embed, /fill-mask, /classify (with `text_pairs`), /ner, /qa, with
`{"texts": [...]}` in and `{"results": [...]}` out, each equal to `bertforge predict` on the same input.
Long inputs are cut to what the model reads, as sentence-transformers and the pipelines do.
(No `from __future__ import annotations`: FastAPI reads the handlers' annotations.)"""

from typing import Annotated

from pydantic import Field

from ..errors import Refused
from ..schemas import Body, Shapes, either
from .common import Api, normalized

FILL_MASK_DEFAULTS = (5, None)  # top_k, targets: the pipeline's own defaults
NER_DEFAULTS = ("first", 64)  # aggregation, stride
QA_DEFAULTS = (384, 128, 30)  # max_length, stride, max_answer_len


async def embed_texts(api: Api, texts: list[str]) -> dict:
    """/embed in bertforge's dialect (the route is shared with TEI's, in tei.py): the model's own
    normalisation, inputs cut to length."""
    found = await api.vectors(texts, await api.service.tokens(texts))
    return {"results": [v.tolist() for v in normalized(found, None, api.service.normalizes)]}


# The head each route needs (/embed is TEI's route too, declared in tei.py).
ROUTES = {"/fill-mask": "fill-mask", "/ner": "ner", "/classify": "classify", "/qa": "qa"}


def bodies(s: Shapes, known: dict[str, type]) -> dict[str, type]:
    """bertforge's request bodies (`{"texts"}` and the rest) for these limits (`s`)."""
    Text, TextList, MaskedList, max_texts, mask_token = s.Text, s.TextList, s.MaskedList, s.max_texts, s.mask_token

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

    return {"texts": Texts, "fill-mask": MaskedTexts, "classify": ClassifyTexts, "qa": either("items", QAItems, QAItem),
            "qa-item": QAItem}


def add(api: Api) -> None:
    service, submit, bodies = api.service, api.submit, api.bodies
    TextsBody, MaskedBody, ClassifyBody, QABody = bodies["texts"], bodies["fill-mask"], bodies["classify"], bodies["qa"]

    @api.post("/fill-mask", "tei", "the top predictions for each [MASK] of each of 'texts'")
    async def fill_mask(body: MaskedBody):
        counts = await service.tokens(body.texts)
        return {"results": await submit("fill-mask", [(t, FILL_MASK_DEFAULTS) for t in body.texts], sum(counts))}

    @api.post("/ner", "tei", "the entities of each of 'texts'")
    async def ner(body: TextsBody):
        counts = await service.tokens(body.texts)
        return {"results": await submit("ner", [(t, NER_DEFAULTS) for t in body.texts], sum(counts))}

    @api.post("/classify", "tei", "classify each of 'texts' (with 'text_pairs', each pair)")
    async def classify(body: ClassifyBody):
        pairs = body.text_pairs
        if pairs is not None and len(pairs) != len(body.texts):
            raise Refused(422, f"text_pairs has {len(pairs)} texts but texts has {len(body.texts)}",
                          param="text_pairs")
        counts = await service.tokens(body.texts, pairs)
        rows = await submit("classify", [((t, p), ("right",)) for t, p in
                                         zip(body.texts, pairs or [None] * len(body.texts))], sum(counts))
        return {"results": [{k: v for k, v in row.items() if k != "logits"} for row in rows]}

    @api.post("/qa", "tei", "answer a question from a context (or a list of them under 'items')")
    async def qa(body: QABody):
        items = [i.model_dump() for i in body.items] if hasattr(body, "items") else [body.model_dump()]
        counts = await service.tokens([i["question"] for i in items], [i["context"] for i in items])
        # Every window of a long context runs, so its whole length is the work to budget.
        return {"results": await submit("qa", [(i, QA_DEFAULTS) for i in items], sum(counts))}
