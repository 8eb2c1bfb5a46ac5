"""The server anyone would write first, as the load benchmark's baseline: FastAPI, and
`SentenceTransformer.encode` on each request's texts (a plain `def` endpoint, so FastAPI runs it
in its thread pool). Loopback only.

    python -m benchmarks.baseline_server MODEL_DIR PORT
"""

from __future__ import annotations

import sys

import uvicorn
from fastapi import FastAPI
from pydantic import BaseModel
from sentence_transformers import SentenceTransformer


class Texts(BaseModel):
    texts: list[str]


def build(model_dir: str) -> FastAPI:
    model = SentenceTransformer(model_dir, device="cpu")
    app = FastAPI()

    @app.get("/health")
    def health() -> dict:
        return {"status": "ok"}

    @app.post("/embed")
    def embed(body: Texts) -> dict:
        return {"results": model.encode(body.texts).tolist()}

    return app


if __name__ == "__main__":
    uvicorn.run(build(sys.argv[1]), host="127.0.0.1", port=int(sys.argv[2]), log_level="warning")
