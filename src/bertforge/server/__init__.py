"""`bertforge serve`: an HTTP service for one model, on FastAPI + uvicorn.

- `service.py`: the model, its tokenizer and a runner per endpoint (through `pipelines`);
- `batching.py`: admission (`--max-concurrent-requests`, else 429) and token-budget batching;
- `schemas.py`: request bodies with the limits in their schema, in three API dialects;
- `routes.py`: the model endpoints (bertforge's, TEI's, OpenAI's, Cohere's rerank);
- `app.py`: middleware (API key, body limit, metrics), error answers, /health, /info,
  /metrics (Prometheus) and /docs (Swagger UI served from the package, so it works offline);
- `metrics.py`: the Prometheus registry.

The server binds to 127.0.0.1 unless told otherwise, and every error answer is one JSON line
`{"error": ...}` naming the field or limit (OpenAI's error shape under /v1/).
"""

from .app import create_app, serve
from .schemas import ERRORS, request_models
from .service import Limits

__all__ = ["create_app", "serve", "Limits", "ERRORS", "request_models"]
