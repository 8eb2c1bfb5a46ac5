"""OpenAI's embeddings route, as the `openai` SDK calls it: POST /v1/embeddings (and TEI's unversioned
/embeddings). `input` is a text, a list of texts, or token ids of this model's vocabulary (a list, or a
list of lists), which are used as given, as TEI uses them: nothing is added, so send [CLS] and [SEP]
yourself (/tokenize gives them). A long input is refused (400), as OpenAI refuses it. (No `from __future__
import annotations`: FastAPI reads the handlers' annotations.)"""


import base64

import numpy as np

from .common import Api, normalized


def add(api: Api) -> None:
    service = api.service
    Body = api.bodies["openai"]

    async def embeddings(body: Body):
        api.check_model(body.model)
        inputs = [body.input] if isinstance(body.input, str) or isinstance(body.input[0], int) else body.input
        counts = api.counted(inputs, "input", service.embed_max_tokens, truncate=False, hint="")
        found = await api.vectors(inputs, counts)
        # Shortened vectors are re-normalised only for a model that normalises, as OpenAI's models do.
        found = normalized(found, body.dimensions, service.normalizes)

        def encode(v: np.ndarray):
            return (base64.b64encode(v.astype("<f4").tobytes()).decode() if body.encoding_format == "base64"
                    else v.tolist())

        return {"object": "list", "model": service.name,
                "data": [{"object": "embedding", "index": i, "embedding": encode(v)} for i, v in enumerate(found)],
                "usage": {"prompt_tokens": sum(counts), "total_tokens": sum(counts)}}

    api.post("/v1/embeddings", "openai", "OpenAI-compatible embeddings")(embeddings)
    api.post("/embeddings", "openai", "OpenAI-compatible embeddings (TEI's unversioned path)")(embeddings)
