"""Commands that run a trained model: predict, serve, attention, export onnx."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Literal

from ...constants import INFERENCE_BACKENDS
from ...errors import BertforgeError
from ...inference.predict import TASKS as PREDICT_TASKS
from ...jsonfile import dumps
from ..build import command
from .apps import app, export_app, show


@command(app, "predict")
def predict(task: Literal[PREDICT_TASKS], texts: list[str] | None = None, *, model: str, input: str | None = None,
            batch_size: int = 32, top_k: int = 5, targets: str | None = None, joint: bool = False,
            aggregation: Literal["first", "average", "max"] = "first",
            pooling: Literal["mean", "cls", "max", "mean_sqrt_len_tokens", "weightedmean", "lasttoken",
                             "pooler"] | None = None,
            normalize: bool = False, against: str | None = None, null_threshold: float | None = None,
            backend: Literal[INFERENCE_BACKENDS] = INFERENCE_BACKENDS[0], sparse: bool = False,
            multi_vector: bool = False, is_query: bool = False) -> None:
    """Run a model on texts: fill-mask, classify, ner, qa, embed, similarity.

    Inputs are the TEXTS given, a file (--input: one per line, or JSONL objects such as
    {"text": ..., "text_pair": ...} or {"question": ..., "context": ...}), or stdin. Prints one
    JSON object per input.

    Args:
        task: what to run
        texts: input texts (else --input or stdin)
        model: checkpoint directory
        input: file of inputs, one per line or JSONL
        batch_size: inputs per forward pass
        top_k: fill-mask predictions per mask; similarity matches
        targets: fill-mask: comma-separated words to score instead of the top-k
        joint: fill-mask: fill all masks, most confident first
        aggregation: ner: how sub-token scores become word labels
        pooling: embed/similarity pooling (default: the sentence-transformers setting, else mean)
        normalize: embed: L2-normalise the vectors
        against: similarity: file of candidates; print the --top-k matches of each input
        null_threshold: qa (SQuAD v2 models): answer '' above this null margin
        sparse: embed: the model is a SparseEncoder (SPLADE) directory (found by itself; the flag checks it): each
            text's non-zero words and weights, {token: weight} and TEI's [{index, value}]
        multi_vector: embed: the model is a ColBERT (PyLate) directory: each text's token vectors ("embeddings"),
            encoded as a document (punctuation dropped) unless --is-query
        is_query: embed --multi-vector: encode the texts as queries (prefix, [MASK] expansion to query_length);
            embed --sparse: as SparseEncoder.encode_query (an inference-free model's query weights)
        backend: auto (the faster of fused and torch for batches, measured once per machine and model
            shape; serve adds ONNX Runtime for one-text requests where it is faster there; -v says which),
            fused (oneDNN kernels, eager PyTorch's numbers), torch (eager, as models/bert.py reads), fused-bf16 (the fused path with bf16 matmuls, for
            CPUs with AMX or AVX512-BF16; close to, not equal to, the fp32 numbers), compiled
            (TorchInductor, a one-off ~20 s), onnx or onnx-int8 (ONNX Runtime, exported and checked
            against PyTorch at start-up), or jax (Flax NNX)
    """
    from ...inference.pipelines import read_inputs
    from ...inference.predict import run_predict

    stdin = None if texts or input else sys.stdin.read().splitlines()
    inputs = read_inputs(list(texts or []), input, stdin)
    candidates = read_inputs([], against) if against else None
    for row in run_predict(task, model, inputs, top_k=top_k, targets=targets.split(",") if targets else None,
                           joint=joint, aggregation=aggregation, pooling=pooling, normalize=True if normalize else None,
                           against=candidates, batch_size=batch_size, null_threshold=null_threshold,
                           progress=bool(input) and sys.stderr.isatty(), backend=backend, sparse=sparse,
                           multi_vector=multi_vector, is_query=is_query):
        print(dumps(row, ensure_ascii=False), flush=True)


@command(app, "serve")
def serve(*, model: str, host: str = "127.0.0.1", port: int = 8000, max_body_bytes: int = 2_000_000,
          max_texts: int = 2048, max_chars: int | None = None, auto_truncate: bool = False, batch_wait_ms: float = 0.0,
          max_batch_tokens: int = 16_384,
          max_concurrent_requests: int = 512, api_key: str | None = None,
          served_model_name: str | None = None, shutdown_grace_s: float = 25.0, request_timeout_s: float = 300.0,
          backend: Literal[INFERENCE_BACKENDS] = INFERENCE_BACKENDS[0]) -> None:
    """Serve a model over HTTP, in the APIs its clients already speak: bertforge's, TEI's, the Hugging Face
    Inference API's, OpenAI's, Cohere's and Jina's; metrics; offline API docs.

    Routes: /embed, /fill-mask, /classify, /ner, /qa (bertforge's {"texts"}); TEI's /embed, /embed_all,
    /predict, /rerank, /similarity, /tokenize, /decode, /info and POST / (the model's own task, also for
    huggingface_hub's InferenceClient) and /invocations; /v1/embeddings as OpenAI; /v1/rerank, /v2/rerank,
    /v1/embed, /v2/embed as Cohere (and Jina); /metrics for Prometheus; /docs (offline). docs/serving.md
    lists them all. Routes the model has no head for answer 404. Binds to 127.0.0.1 unless --host says
    otherwise. The API key may also come from the BERTFORGE_API_KEY environment variable, which other
    users cannot read from the process list.

    Args:
        model: checkpoint directory
        host: address to bind (127.0.0.1: this machine only)
        port: TCP port
        max_body_bytes: larger request bodies get 413 (TEI's default, 2 MB)
        max_texts: inputs per request (else 413); 2048, OpenAI's own limit, takes LangChain's (1000) and
            LlamaIndex's (100) default batches
        max_chars: characters per input that is not to be truncated (else 413); default: 20 per position the
            model reads, at least 10,000 (10,240 for 512 positions, 163,840 for 8,192); /info says it
        auto_truncate: cut long inputs when a TEI request leaves `truncate` unset (null), as TEI's flag does
        batch_wait_ms: how long a batch waits for more requests (0: it takes those that queued while the last
            batch ran)
        max_batch_tokens: tokens per batch: concurrent requests are grouped under this budget
        max_concurrent_requests: requests in flight; one more gets 429 at once
        api_key: require 'Authorization: Bearer KEY' on every endpoint but /health and the API docs
        served_model_name: the name /v1/embeddings and /info use (default: the directory's name)
        shutdown_grace_s: on SIGTERM or Ctrl-C, new requests get 503 and those in flight get this many seconds
            to finish before the server exits (0, the default exit status); a second signal stops at once
        request_timeout_s: a request still unanswered after this many seconds is answered 503 and stopped (its
            tokenising, its wait for a batch); the server and the other requests go on
        backend: auto (the faster of fused and torch for batches, and ONNX Runtime for one-text requests
            where it is faster there, measured once per machine and model shape and said at start-up),
            fused (oneDNN kernels, eager PyTorch's numbers), torch (eager, as models/bert.py reads), fused-bf16 (the fused path with bf16 matmuls, for
            CPUs with AMX or AVX512-BF16; close to, not equal to, the fp32 numbers), compiled
            (TorchInductor, a one-off ~20 s), onnx or onnx-int8 (ONNX Runtime, exported and checked
            against PyTorch at start-up), or jax (Flax NNX)
    """
    import os

    from ...errors import require

    require("serve", "fastapi", "uvicorn", "pydantic", "prometheus_client", "swagger_ui", what="bertforge serve")
    from ...server import Limits
    from ...server import serve as run_server

    run_server(model, host, port, Limits(max_body_bytes=max_body_bytes, max_texts=max_texts, max_chars=max_chars,
                                         auto_truncate=auto_truncate,
                                         batch_wait_ms=batch_wait_ms, max_batch_tokens=max_batch_tokens,
                                         max_concurrent_requests=max_concurrent_requests,
                                         api_key=api_key or os.environ.get("BERTFORGE_API_KEY") or None,
                                         served_model_name=served_model_name, backend=backend,
                                         request_timeout_s=request_timeout_s),
               shutdown_grace_s=shutdown_grace_s)


@command(app, "attention")
def attention(*, model: str, text: str, out: str, pair: str | None = None, layer: int | None = None,
              head: int | None = None, html: str | None = None, overwrite: bool = False, json: bool = False) -> None:
    """Draw attention heatmaps (a PNG grid, or an interactive HTML page).

    Draws a model's attention for one input: a PNG grid of every layer x head, or one layer/head
    with the WordPiece tokens on both axes; --html writes a static page with layer and head
    pickers that opens in any browser without a server.

    Args:
        model: checkpoint directory
        text: the input text
        out: PNG file to write
        pair: second segment (sentence B)
        layer: 1-based layer to draw alone (default: the whole grid)
        head: 1-based head (with --layer; default: the mean of the heads)
        html: also write an interactive HTML page here
        overwrite: replace existing --out / --html files
        json: print one JSON object instead of a summary
    """
    from ...interop.auto import AutoModel
    from ...tokenization.kinds import load_tokenizer
    from ...viz import attention_maps, plot_attention, write_attention_html

    for target in (out, html):
        if target and Path(target).exists() and not overwrite:
            raise BertforgeError(f"{target}: exists; pass --overwrite to replace it")
    encoder = AutoModel.from_pretrained(model)
    tokens, attn = attention_maps(encoder, load_tokenizer(model), text, pair)
    n_layers, n_heads = attn.shape[:2]
    for name, value, limit in (("--layer", layer, n_layers), ("--head", head, n_heads)):
        if value is not None and not 1 <= value <= limit:
            raise BertforgeError(f"{name} {value} is out of range: the model has {limit}")
    written = [str(plot_attention(tokens, attn, Path(out), layer - 1 if layer else None,
                                  head - 1 if head else None))]
    if html:
        written.append(str(write_attention_html(tokens, attn, Path(html))))
    show({"tokens": len(tokens), "layers": n_layers, "heads": n_heads, "written": written}, json, "attention drawn")


@command(export_app, "onnx")
def export_onnx(*, model: str, out: str, int8: bool = False, opset: int = 18, overwrite: bool = False,
                json: bool = False) -> None:
    """ONNX with dynamic batch and sequence axes, checked against ONNX Runtime.

    Exports a checkpoint to ONNX, runs it in ONNX Runtime on a new padded shape and requires a
    match with PyTorch within 1e-4. --int8 adds a dynamically quantised copy for CPU inference.

    Args:
        model: checkpoint directory
        out: the .onnx file to write
        int8: also write OUT.int8.onnx with int8 weights
        opset: ONNX opset version
        overwrite: replace an existing --out
        json: print one JSON object instead of a summary
    """
    from ...inference.export import export_onnx as run_export

    show(run_export(model, out, int8=int8, opset=opset, overwrite=overwrite), json, "exported")
