"""The model routes, one module per API they imitate, so that the clients people already have work:

- `bertforge`: /embed (with `texts`), /fill-mask, /classify, /ner, /qa;
- `tei`: text-embeddings-inference's /embed, /embed_all, /embed_sparse, /predict, /rerank, /similarity,
  /tokenize, /decode;
- `inference_api`: POST / and /invocations, the model's own task (TEI's routing, and the Hugging Face
  Inference API's payloads for `huggingface_hub.InferenceClient`);
- `openai`: /v1/embeddings and /embeddings;
- `cohere`: /v1/rerank (Jina's too), /v2/rerank, /v1/embed, /v2/embed.

`common` holds what they share: the request bodies, the length rules and the calls into the batchers.
docs/serving.md lists every route with the API it imitates.
"""

from __future__ import annotations

from typing import Any

from ..service import Service
from . import bertforge, cohere, inference_api, openai, tei
from .common import Api, Submit

# The head each route needs (None: every model answers it); /embed_sparse answers a SPLADE model alone,
# /embed_multi_vector a ColBERT model.
ROUTE_TASKS: dict[str, str | None] = {
    "/embed": "embed", "/embed_all": "embed", "/similarity": "embed", "/embeddings": "embed", "/v1/embeddings": "embed",
    "/v1/embed": "embed", "/v2/embed": "embed", "/tokenize": None, "/decode": None, "/": None, "/invocations": None,
    "/predict": "classify", "/classify": "classify", "/rerank": "rerank", "/v1/rerank": "rerank",
    "/v2/rerank": "rerank", "/fill-mask": "fill-mask", "/ner": "ner", "/qa": "qa", "/embed_sparse": "splade",
    "/embed_multi_vector": "multi_vector"}


def add_model_routes(app: Any, service: Service, submit: Submit) -> None:
    """Register every model route on `app`; `submit(endpoint, items, tokens)` runs a batch."""
    api = Api(app, service, submit)
    for module in (tei, bertforge, inference_api, openai, cohere):
        module.add(api)
