"""`bertforge predict TASK --model DIR [TEXT...] [--input FILE]`: one JSON object per input on stdout."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ..constants import INFERENCE_BACKENDS
from ..errors import InputError

TASKS = ("fill-mask", "classify", "ner", "qa", "embed", "similarity")


def load_for(task: str, model_dir: str):
    """The model `task` needs, refusing a checkpoint whose `architectures` lacks that head."""
    from ..interop.auto import AutoModel
    from ..interop.hf import load_for_task
    from ..models.registry import TASK_ARCHITECTURES

    if task in ("embed", "similarity"):  # any checkpoint has the encoder
        return AutoModel.from_pretrained(model_dir)
    return load_for_task(task, model_dir, TASK_ARCHITECTURES[task])


def _text_of(item: Any, index: int) -> tuple[str, str | None]:
    if isinstance(item, str):
        return item, None
    if isinstance(item, dict) and isinstance(item.get("text"), str):
        return item["text"], item.get("text_pair")
    raise InputError(f"input {index + 1}: expected text or a JSON object with 'text'")


def run_predict(task: str, model_dir: str, inputs: list[Any], top_k: int = 5, targets: list[str] | None = None,
                joint: bool = False, aggregation: str = "first", pooling: str | None = None,
                normalize: bool | None = None, against: list[str] | None = None, batch_size: int = 32,
                null_threshold: float | None = None, progress: bool = False,
                backend: str = INFERENCE_BACKENDS[0], sparse: bool = False, multi_vector: bool = False,
                is_query: bool = False) -> Iterator[dict]:
    from ..tokenization.kinds import load_tokenizer
    from . import backends, pipelines

    if task not in TASKS:
        raise InputError(f"unknown task {task!r}; use one of {', '.join(TASKS)}")
    from ..interop.sparse_dir import is_sparse_dir

    if is_sparse_dir(model_dir):
        if task != "embed":
            raise InputError(f"{model_dir}: a SparseEncoder (SPLADE) directory; predict embed gives its sparse vectors")
        yield from _sparse_rows(model_dir, [_text_of(item, i)[0] for i, item in enumerate(inputs)], batch_size,
                                progress, is_query)
        return
    if sparse:
        raise InputError(f"--sparse: {model_dir} is not a SparseEncoder (SPLADE) directory")
    from ..interop.colbert_dir import is_colbert_dir

    if is_colbert_dir(model_dir) != multi_vector:
        raise InputError(f"{model_dir}: a ColBERT (late-interaction) directory; predict embed --multi-vector gives its "
                         "token vectors" if not multi_vector else
                         f"--multi-vector: {model_dir} is not a ColBERT (PyLate) directory")
    if multi_vector:
        if task != "embed":
            raise InputError("--multi-vector: only predict embed gives token vectors")
        yield from _multi_vector_rows(model_dir, [_text_of(item, i)[0] for i, item in enumerate(inputs)], is_query,
                                      batch_size, progress)
        return
    if is_query:
        raise InputError("--is-query: only for a ColBERT model (--multi-vector) or a SPLADE one (--sparse)")
    if backend not in backends.BACKENDS:
        raise InputError(f"unknown backend {backend!r}; use one of {', '.join(backends.BACKENDS)}")
    model = backends.load(load_for(task, model_dir), backend)
    # --backend auto logs which path it chose, and why (`routed.load_auto`; shown with -v)
    tokenizer = load_tokenizer(model_dir)

    if task == "qa":
        items = [i if isinstance(i, dict) else {} for i in inputs]
        for item, result in zip(items, pipelines.answer(model, tokenizer, items, null_threshold=null_threshold)):
            yield {"question": item["question"], **result}
        return
    texts, pairs = zip(*(_text_of(item, i) for i, item in enumerate(inputs)))
    texts = list(texts)
    if task == "fill-mask":
        if joint:
            for text in texts:
                yield {"text": text, **pipelines.fill_mask_joint(model, tokenizer, text)}
            return
        for text, per_mask in zip(texts, pipelines.fill_mask(model, tokenizer, texts, top_k, targets, batch_size)):
            yield {"text": text, "predictions": per_mask}
    elif task == "classify":
        use_pairs = list(pairs) if any(p is not None for p in pairs) else None
        if use_pairs is not None and any(p is None for p in use_pairs):
            raise InputError("mix of single texts and pairs; give 'text_pair' for every input or none")
        for text, result in zip(texts, pipelines.classify(model, tokenizer, texts, use_pairs, batch_size)):
            yield {"text": text, **result}
    elif task == "ner":
        for text, entities in zip(texts, pipelines.ner(model, tokenizer, texts, aggregation)):
            yield {"text": text, "entities": entities}
    else:
        import torch

        from ..interop.sentence_dir import sentence_pipeline, similarity

        sentence = sentence_pipeline(model_dir, model.config.hidden_size, pooling, bool(normalize))

        def encode(xs: list[str]):
            return torch.from_numpy(pipelines.embed(model, tokenizer, xs, batch_size=batch_size, progress=progress,
                                                    sentence=sentence))

        if task == "embed":
            # Each line carries its text, as every other task's does, so the output stands on its own.
            for text, vector in zip(texts, encode(texts)):
                yield {"text": text, "embedding": [round(float(x), 7) for x in vector]}
        elif against:
            scores = similarity(encode(texts), encode(against), sentence.similarity)
            for text, row in zip(texts, scores):
                best = row.argsort(descending=True)[:top_k].tolist()
                yield {"text": text, "matches": [{"text": against[j], "score": float(row[j])} for j in best]}
        else:
            if any(p is None for p in pairs):
                raise InputError("similarity needs pairs: JSON {'text', 'text_pair'} per input, or --against FILE")
            a, b = encode(texts), encode(list(pairs))
            scores = [float(similarity(x[None], y[None], sentence.similarity)[0, 0]) for x, y in zip(a, b)]
            for text, pair, score in zip(texts, pairs, scores):
                yield {"text": text, "text_pair": pair, "similarity": score}


def _multi_vector_rows(model_dir: str, texts: list[str], is_query: bool, batch_size: int, progress: bool
                       ) -> Iterator[dict]:
    """`predict embed --multi-vector` on a ColBERT directory: each text's kept token vectors, as documents or (with
    --is-query) as queries, as PyLate's `ColBERT.encode(..., is_query=...)` gives them."""
    from ..interop.colbert_dir import load_colbert
    from .multi_vector import multi_vector_embed

    model, spec, tokenizer = load_colbert(model_dir)
    for text, vectors in zip(texts, multi_vector_embed(model, tokenizer, spec, texts, is_query, batch_size,
                                                       progress=progress)):
        yield {"text": text, "embeddings": vectors.tolist()}


def _sparse_rows(model_dir: str, texts: list[str], batch_size: int, progress: bool,
                 is_query: bool = False) -> Iterator[dict]:
    """`predict embed` on a SPLADE directory: each text's non-zero words, heaviest first, as {token: weight}, and the
    same as TEI's [{index, value}] (by index). `is_query`: as `SparseEncoder.encode_query` (the "query" prompt when
    the directory names one; an inference-free model's query weights); else as `encode` (the default route and
    prompt)."""
    from ..interop.sentence_dir import side_prompt
    from .sparse import SparseModel, readable, sparse_items

    sparse = SparseModel.load(model_dir)
    prompt = side_prompt(sparse.spec.prompts, "query") if is_query else None
    vectors = sparse.encode(texts, True if is_query else None, prompt, batch_size, progress=progress)
    for text, items in zip(texts, sparse_items(vectors)):
        yield {"text": text, "weights": readable(items, sparse.tokenizer), "sparse": items}
