"""The model routes, one module per API they imitate, so that the clients people already have work:

- `bertforge`: /embed (with `texts`), /fill-mask, /classify, /ner, /qa;
- `tei`: text-embeddings-inference's /embed, /embed_all, /embed_sparse, /predict, /rerank, /similarity,
  /tokenize, /decode;
- `inference_api`: POST / and /invocations, the model's own task (TEI's routing, and the Hugging Face
  Inference API's payloads for `huggingface_hub.InferenceClient`);
- `openai`: /v1/embeddings and /embeddings;
- `cohere`: /v1/rerank (Jina's too), /v2/rerank, /v1/embed, /v2/embed.

Each module declares its request bodies (`bodies(shapes, known)`, from `schemas.Shapes`), the head each of its
routes needs (`ROUTES`), and its routes (`add`); `common` holds what they share: the length rules and the calls
into the batchers. Adding a route is one module's edit and its row in docs/serving.md.
"""

from __future__ import annotations

from typing import Any

from ..service import Service
from . import bertforge, cohere, inference_api, openai, tei
from ..schemas import shapes
from .common import Api, Submit

# The order the dialects' bodies are declared in: a dialect may take another's body (TEI's /embed takes bertforge's
# {"texts"}, its /rerank Cohere's {"documents"}; the Inference API's question-answering, bertforge's question).
DIALECTS = (bertforge, cohere, openai, tei, inference_api)
# The head each route needs (None: every model answers it).
ROUTE_TASKS: dict[str, str | None] = {path: task for module in DIALECTS for path, task in module.ROUTES.items()}


def request_models(max_texts: int, max_chars: int, mask_token: str = "[MASK]", dimension: int = 768,
                   vocab_size: int = 30522, prompts: tuple[str, ...] = ()) -> dict[str, Any]:
    """The request body classes of every route, by name, for these limits (`schemas.shapes`)."""
    made_of = shapes(max_texts, max_chars, mask_token, dimension, vocab_size, prompts)
    found: dict[str, Any] = {}
    for module in DIALECTS:
        found.update(module.bodies(made_of, found))
    return found


def add_model_routes(app: Any, service: Service, submit: Submit) -> None:
    """Register every model route on `app`; `submit(endpoint, items, tokens)` runs a batch."""
    # A token id must name a row of the embedding matrix and a token the tokenizer can decode.
    ids = min(len(service.tokenizer), service.config.vocab_size)
    bodies = request_models(service.limits.max_texts, service.limits.max_chars, service.tokenizer.mask_token,
                            service.dimension, ids, tuple(sorted(service.sentence.prompts)))
    api = Api(app, service, submit, bodies)
    for module in (tei, bertforge, inference_api, openai, cohere):  # the order the routes are listed in /docs
        module.add(api)
