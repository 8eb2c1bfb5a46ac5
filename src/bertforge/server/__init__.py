"""`bertforge serve`: an HTTP service for one model, on FastAPI + uvicorn.

- `service.py`: the model, its tokenizer and a runner per endpoint (through `pipelines`);
- `batching.py`: admission (`--max-concurrent-requests`, else 429) and token-budget batching;
- `schemas.py`: what request bodies are made of, the server's limits in their schema;
- `apis/`: the model routes, one module per API (bertforge's, TEI's, the Inference API's at /, OpenAI's,
  Cohere's and Jina's), each with its own request bodies and routes;
- `errors.py`: error answers in the shape of the API each route imitates, one line naming the field and limit;
- `guard.py`: the ASGI middleware in front of the application: drain, API key, body limit, content type, metrics;
- `app.py`: the application, its error answers, /health, /info, /metrics (Prometheus) and /docs (Swagger UI
  served from the package, so it works offline);
- `metrics.py`: the Prometheus registry.

The server binds to 127.0.0.1 unless told otherwise.
"""

from .app import create_app, serve
from .apis import request_models
from .service import Limits

__all__ = ["create_app", "serve", "Limits", "request_models"]
