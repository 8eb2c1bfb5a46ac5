"""`bertforge.pipeline(task, model=DIR)`: transformers' `pipeline` call and output structures, on bertforge's one
inference path (`pipelines.py`: length-sorted batches, unpadded, the fused backend by default).

    from bertforge import pipeline
    fill = pipeline("fill-mask", model="out/mlm")
    fill("the capital of france is [MASK] .")        # [{"score", "token", "token_str", "sequence"}, ...]

Tasks, by transformers' names: fill-mask, text-classification (sentiment-analysis), token-classification (ner),
question-answering, feature-extraction, and sentence-similarity (sentence-transformers' task: cosine scores of
sentences against a source sentence). The structures are transformers' (a single input gives one result, a list
gives a list); so are the defaults: top_k 5 (fill-mask) or 1 (text-classification), function_to_apply by the
model's problem type, aggregation_strategy "none" (token-classification), top_k 1 (question-answering).
The formatting helpers are shared with the server's Inference API routes, which answer in the same structures.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from ..errors import InputError

TASKS = {"fill-mask": "fill-mask", "text-classification": "classify", "sentiment-analysis": "classify",
         "token-classification": "ner", "ner": "ner", "question-answering": "qa", "feature-extraction": "embed",
         "sentence-similarity": "similarity"}


# ----------------------------------------------------------------------------- shared formatting
def class_scores(logits: list[float], how: str) -> np.ndarray:
    """Scores from one input's logits: "softmax", "sigmoid" or "none" (the logits)."""
    x = np.asarray(logits, dtype=np.float64)
    if how == "none":
        return x
    if how == "sigmoid":
        return 1 / (1 + np.exp(-x))
    e = np.exp(x - x.max())
    return e / e.sum()


def ranked(logits: list[float], names: list[str], how: str, top_k: int | None = None) -> list[dict]:
    """[{label, score}] best first (ties keep the label order), at most `top_k`."""
    scores = class_scores(logits, how)
    order = sorted(range(len(scores)), key=lambda i: -scores[i])
    return [{"label": names[i], "score": float(scores[i])} for i in order[:top_k]]


def default_activation(problem_type: str, num_labels: int) -> str:
    """transformers' text-classification default: a sigmoid for one logit or independent labels, else a softmax."""
    return "sigmoid" if num_labels == 1 or problem_type in ("regression", "multi_label_classification") else "softmax"


def fill_mask_rows(ids: list[int], masks: list[list[dict]], mask_id: int,
                   decode: Callable[[list[list[int]], bool], list[str]]) -> list:
    """transformers' fill-mask answer for one text: [{score, token, token_str, sequence}] for one mask, one such
    list per mask for several (`sequence` then keeps the special tokens, as transformers' does).
    `ids`: the text's ids; `masks`: bertforge's predictions per mask; `decode(rows, skip_special_tokens)`."""
    positions = [i for i, t in enumerate(ids) if t == mask_id]
    single = len(positions) == 1
    per_mask = []
    for position, predictions in zip(positions, masks):
        rows = []
        for p in predictions:
            filled = ids[:position] + [p["token"]] + ids[position + 1:]
            # The token alone keeps a special token's text ("[UNK]"), as transformers' `decode([p])` does.
            (token_str,), (sequence,) = decode([[p["token"]]], False), decode([filled], single)
            rows.append({"score": p["score"], "token": p["token"], "token_str": token_str, "sequence": sequence})
        per_mask.append(rows)
    return per_mask[0] if single else per_mask


# ----------------------------------------------------------------------------- the pipelines
class Pipeline:
    """A model directory loaded once for one task; call it on one input or a list."""

    task = ""

    def __init__(self, model: Any, tokenizer: Any, model_dir: str, batch_size: int, defaults: dict[str, Any]) -> None:
        self.model, self.tokenizer, self.model_dir = model, tokenizer, model_dir
        self.batch_size, self.defaults = batch_size, defaults

    def __call__(self, inputs: Any, **kwargs: Any) -> Any:
        options = {**self.defaults, **kwargs}
        single = not isinstance(inputs, list)
        results = self.run([inputs] if single else list(inputs), **options)
        return results[0] if single else results

    def run(self, inputs: list, **options: Any) -> list:
        raise NotImplementedError


class FillMaskPipeline(Pipeline):
    task = "fill-mask"

    def run(self, inputs: list, top_k: int = 5, targets: list[str] | str | None = None) -> list:
        from . import pipelines

        tok = self.tokenizer
        targets = [targets] if isinstance(targets, str) else targets
        found = pipelines.fill_mask(self.model, tok, inputs, top_k, targets, self.batch_size)

        def decode(rows: list[list[int]], skip: bool) -> list[str]:
            return [tok.decode(r, skip_special_tokens=skip) for r in rows]

        limit = self.model.config.max_sequence_length
        return [fill_mask_rows(tok(text, truncation=True, max_length=limit)["input_ids"], masks, tok.mask_token_id,
                               decode) for text, masks in zip(inputs, found)]


class TextClassificationPipeline(Pipeline):
    task = "text-classification"

    def __call__(self, inputs: Any, **kwargs: Any) -> Any:
        options = {**self.defaults, **kwargs}
        single = not isinstance(inputs, list)
        results = self.run([inputs] if single else list(inputs), **options)
        # transformers: one text with top_k 1 is [{label, score}], one {text, text_pair} is {label, score}; a list
        # with top_k 1 is one dict each
        top_k = options.get("top_k", 1)
        if single:
            return results[0][0] if isinstance(inputs, dict) and top_k == 1 else results[0]
        return [r[0] for r in results] if top_k == 1 else results

    def run(self, inputs: list, top_k: int | None = 1, function_to_apply: str | None = None) -> list:
        from . import pipelines

        texts, pairs = [], []
        for i, item in enumerate(inputs):
            if isinstance(item, str):
                texts.append(item)
                pairs.append(None)
            elif isinstance(item, dict) and isinstance(item.get("text"), str):
                texts.append(item["text"])
                pairs.append(item.get("text_pair"))
            else:
                raise InputError(f"input {i + 1}: a text, or {{'text': ..., 'text_pair': ...}}")
        if any(p is not None for p in pairs) and any(p is None for p in pairs):
            raise InputError("a mix of single texts and pairs: give 'text_pair' for every input or none")
        config = self.model.config
        how = (function_to_apply or default_activation(self.model.problem_type(), config.num_labels)).lower()
        if how not in ("softmax", "sigmoid", "none"):
            raise InputError(f"function_to_apply {function_to_apply!r}: softmax, sigmoid or none")
        # The segment ids the tokenizer gives, as transformers' pipeline feeds them (an ALBERT tokenizer of
        # transformers 5 gives none for a pair; bertforge's own classify and /rerank send them).
        rows = pipelines.classify(self.model, self.tokenizer, texts, pairs if pairs[0] is not None else None,
                                  self.batch_size, logits=True, segments=None)
        return [ranked(r["logits"], config.label_names, how, top_k) for r in rows]


class TokenClassificationPipeline(Pipeline):
    task = "token-classification"

    def run(self, inputs: list, aggregation_strategy: str = "none", stride: int | None = None,
            ignore_labels: list[str] | None = None) -> list:
        from . import pipelines

        ignore = set(ignore_labels if ignore_labels is not None else ["O"])
        found = pipelines.ner(self.model, self.tokenizer, inputs, aggregation_strategy,
                              stride if stride is not None else 64, batch_size=self.batch_size)
        key = "entity" if aggregation_strategy == "none" else "entity_group"
        if aggregation_strategy in ("first", "average", "max"):
            # transformers' `word` is the entity's tokens decoded (lower-cased by an uncased tokenizer); bertforge's
            # word-level answers (`predict ner`, the server) carry the text's own characters instead.
            for text, entities in zip(inputs, found):
                enc = self.tokenizer(text, return_offsets_mapping=True, return_special_tokens_mask=True)
                for e in entities:
                    ids = [i for i, (a, b), special in zip(enc["input_ids"], enc["offset_mapping"],
                                                           enc["special_tokens_mask"])
                           if not special and a >= e["start"] and b <= e["end"] and b > a]
                    e["word"] = self.tokenizer.decode(ids)
        return [[e for e in entities if e[key] not in ignore] for entities in found]


class QuestionAnsweringPipeline(Pipeline):
    task = "question-answering"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """`qa(question=..., context=...)`, `qa({"question", "context"})` or a list of such dicts."""
        if "question" in kwargs and "context" in kwargs:
            question, context = kwargs.pop("question"), kwargs.pop("context")
            if isinstance(question, list):
                return self.run([{"question": q, "context": c} for q, c in zip(question, context)],
                                **{**self.defaults, **kwargs})
            return self.run([{"question": question, "context": context}], **{**self.defaults, **kwargs})[0]
        return super().__call__(args[0], **kwargs)

    def run(self, inputs: list, top_k: int = 1, doc_stride: int = 128, max_answer_len: int = 15,
            max_seq_len: int = 384, handle_impossible_answer: bool = False) -> list:
        """One {score, start, end, answer} per question (a list of `top_k` of them when top_k > 1), ranked as
        transformers' (4.x) pipeline ranks spans (`data.qa.ranked_spans`); contexts of any length are windowed."""
        from . import pipelines

        if top_k < 1:
            raise InputError(f"top_k {top_k}: at least 1")
        found = pipelines.answer_spans(self.model, self.tokenizer, inputs, max_seq_len, doc_stride, top_k,
                                       max_answer_len, handle_impossible_answer, self.batch_size)
        return [spans[0] if top_k == 1 and spans else spans for spans in found]


class FeatureExtractionPipeline(Pipeline):
    task = "feature-extraction"

    def run(self, inputs: list, return_tensors: bool = False) -> list:
        """As transformers' feature-extraction: every token's vector, [1, T, H] per input (special tokens included;
        an input longer than the model reads is cut at its length)."""
        from . import pipelines

        found = pipelines.token_vectors(self.model, self.tokenizer, inputs, batch_size=self.batch_size)
        return [torch.from_numpy(v)[None] if return_tensors else [v.tolist()] for v in found]


class SentenceSimilarityPipeline(Pipeline):
    task = "sentence-similarity"

    def __call__(self, inputs: dict, **kwargs: Any) -> list[float]:
        """{"source_sentence", "sentences"} -> the cosine of each sentence's embedding with the source's."""
        if not isinstance(inputs, dict) or not {"source_sentence", "sentences"} <= set(inputs):
            raise InputError("sentence-similarity takes {'source_sentence': ..., 'sentences': [...]}")
        from ..interop.sentence_dir import sentence_pipeline
        from . import pipelines

        sentence = sentence_pipeline(self.model_dir, self.model.config.hidden_size)
        texts = [inputs["source_sentence"], *inputs["sentences"]]
        v = torch.from_numpy(pipelines.embed(self.model, self.tokenizer, texts, batch_size=self.batch_size,
                                             sentence=sentence))
        v = torch.nn.functional.normalize(v.double(), dim=-1)
        return (v[1:] @ v[0]).tolist()


_CLASSES = {"fill-mask": FillMaskPipeline, "classify": TextClassificationPipeline, "ner": TokenClassificationPipeline,
            "qa": QuestionAnsweringPipeline, "embed": FeatureExtractionPipeline,
            "similarity": SentenceSimilarityPipeline}


def pipeline(task: str, model: str, tokenizer: str | None = None, device: Any = None, backend: str = "fused",
             batch_size: int = 32, **defaults: Any) -> Pipeline:
    """A transformers-style pipeline for `task` on the checkpoint directory `model` (its own tokenizer unless
    `tokenizer` names another directory). `backend`: bertforge's inference backend ("fused" by default, "torch",
    "onnx", ...). Keyword arguments are the task's call options, applied to every call unless a call overrides them."""
    from ..tokenization.kinds import load_tokenizer
    from . import backends
    from .predict import load_for

    if task not in TASKS:
        raise InputError(f"unknown task {task!r}; bertforge's pipelines: {', '.join(TASKS)}")
    if not isinstance(model, (str, bytes)) and not hasattr(model, "__fspath__"):
        raise InputError("pipeline(model=...) takes a checkpoint directory")
    kind = TASKS[task]
    loaded = load_for(kind, str(model))
    if device is not None:
        loaded = loaded.to(torch.device(device if not isinstance(device, int) else
                                        ("cpu" if device < 0 else f"cuda:{device}")))
    return _CLASSES[kind](backends.load(loaded, backend), load_tokenizer(tokenizer or str(model)), str(model),
                          batch_size, defaults)
