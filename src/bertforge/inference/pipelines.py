"""Using a model on text: fill-mask, classify, NER, QA, embeddings and similarity.

Every pipeline batches by length: inputs are sorted by token count, each batch is padded
only to its own longest row (and unpadded inside the model), and results come back in
input order. Outputs are plain dicts and lists, ready to print as JSON lines.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from ..errors import InputError
from ..interop.sentence_dir import POOLING_MODES, SentencePipeline
from ..models.heads import BertForMaskedLM, BertForPreTraining
from ..tokenization.base import Tokenizer
from .loop import device_of, evaluating, run_sorted


def compile_for_inference(model: torch.nn.Module) -> torch.nn.Module:
    """Compile the encoder (the backbone's forward) with TorchInductor, for inference only.

    Batch and sequence axes are dynamic, so one compilation serves every batch shape, and
    the weights are frozen into the graph as constants, which lets Inductor pre-pack them
    for oneDNN and fuse the bias, GELU, residual and LayerNorm passes. On this 2-core CPU
    that is ~1.2x the eager encoder after a one-off compile of ~20 s, so it pays for files
    and servers, not for a handful of texts. Frozen weights ignore later updates: never
    train a model after this. Returns the same model object.
    """
    import torch._inductor.config as inductor_config

    backbone = getattr(model, "backbone", model)
    backbone.eval()
    compiled = torch.compile(backbone.forward, dynamic=True)

    def forward(*args, **kwargs):
        # Freezing is an Inductor setting; patching it per call keeps it off for any other
        # compilation in the process (training must never freeze its weights).
        with inductor_config.patch(freezing=True):
            return compiled(*args, **kwargs)

    backbone.forward = forward
    return model


def _run_sorted(texts: list, tokenizer: Tokenizer, max_length: int, batch_size: int,
                step: Callable[[dict, list[int]], list], pairs: list | None = None,
                progress: bool = False, device: torch.device | None = None, truncation_side: str = "right",
                segments: bool | None = True) -> list:
    """Tokenise, then `run_sorted`: `step(batch, rows)` -> one result per row, in input order. `segments`: True sends
    a pair's segment ids whatever the tokenizer's model_input_names say (BERT's and ALBERT's pretraining used them;
    transformers 5's ALBERT tokenizer sends none); None follows the tokenizer, as transformers' pipelines do."""
    enc = tokenizer(texts, pairs, truncation=True, max_length=max_length, truncation_side=truncation_side,
                    return_token_type_ids=segments)
    # Without segment ids from the tokenizer (segments None, and its model_input_names have none), all 0: what
    # transformers' pipelines feed the model.
    types = enc.get("token_type_ids") or [[0] * len(ids) for ids in enc["input_ids"]]
    features = [{"input_ids": ids, "token_type_ids": t} for ids, t in zip(enc["input_ids"], types)]
    return run_sorted(features, tokenizer.pad_token_id, batch_size, step, device=device, progress=progress)


# ----------------------------------------------------------------------------- fill-mask
def _check_masks(tokenizer: Tokenizer, text: str, name: str, max_length: int, truncates: bool) -> None:
    """Refuse a text with no mask token, or with one the model would never see: long inputs are cut to
    `max_length` tokens (the last being [SEP]), and a mask past the cut would silently get no prediction."""
    ids = tokenizer.encode(text)
    positions = [p for p, t in enumerate(ids) if t == tokenizer.mask_token_id]
    mask = tokenizer.id_to_token(tokenizer.mask_token_id)
    if not positions:
        raise InputError(f"{name} has no {mask} token: {text[:60]!r}")
    if truncates and positions[-1] > max_length - 2:
        raise InputError(f"{name}: a {mask} is token {positions[-1] + 1} of {len(ids)}, past the {max_length} tokens "
                         "the model reads; shorten the text before it")
    if not truncates and len(ids) > max_length:
        raise InputError(f"{name} is {len(ids)} tokens; the model reads at most {max_length}")


@torch.no_grad()
def fill_mask(model: BertForMaskedLM | BertForPreTraining, tokenizer: Tokenizer, texts: list[str],
              top_k: int = 5, targets: list[str] | None = None, batch_size: int = 32) -> list[list[list[dict]]]:
    """For each text, for each [MASK] in it, the top-k predictions.

    Each prediction is `{"token": id, "token_str": str, "score": probability}`, as the
    transformers fill-mask pipeline gives them. With `targets`, only those words are scored
    (each must be a single WordPiece). Returns [text][mask][k].
    """
    if not texts:
        return []
    mask_id = tokenizer.mask_token_id
    target_ids = None
    if targets:
        target_ids = []
        for word in targets:
            pieces = tokenizer.tokenize(word)
            if len(pieces) != 1:
                raise InputError(f"target {word!r} is not a single token of this vocabulary ({' '.join(pieces)})")
            target_ids.append(tokenizer.token_to_id(pieces[0]))
    for i, text in enumerate(texts):
        _check_masks(tokenizer, text, f"input {i + 1}", model.config.max_sequence_length, truncates=True)
    evaluating(model)
    weight = model.backbone.embeddings.word.weight

    def step(batch, rows):
        hidden = model.backbone(**batch).last_hidden_state
        at_masks = batch["input_ids"] == mask_id
        probs = model.mlm(hidden[at_masks], weight).float().softmax(-1)  # only the masked positions
        if target_ids is not None:
            ids = torch.tensor(target_ids, device=probs.device).expand(probs.shape[0], -1)
            scores = probs.gather(1, ids)
            scores, order = scores.sort(dim=-1, descending=True)
            ids = ids.gather(1, order)
        else:
            scores, ids = probs.topk(min(top_k, probs.shape[-1]), dim=-1)
        per_row: list[list] = [[] for _ in rows]
        for row, s, t in zip(at_masks.nonzero()[:, 0].tolist(), scores.tolist(), ids.tolist()):
            per_row[row].append([{"token": tok, "token_str": tokenizer.id_to_token(tok), "score": sc}
                                 for sc, tok in zip(s, t)])
        return per_row

    return _run_sorted(texts, tokenizer, model.config.max_sequence_length, batch_size, step,
                       device=device_of(model))


@torch.no_grad()
def fill_mask_joint(model, tokenizer: Tokenizer, text: str) -> dict:
    """Fill every [MASK] of one text, most confident first: predict all, fix the surest, repeat."""
    _check_masks(tokenizer, text, "the input", model.config.max_sequence_length, truncates=False)
    ids = torch.tensor([tokenizer.encode(text)])
    evaluating(model)
    filled = []
    while True:
        at = (ids[0] == tokenizer.mask_token_id).nonzero()[:, 0]
        if len(at) == 0:
            break
        hidden = model.backbone(ids.to(device_of(model))).last_hidden_state[0, at]
        probs = model.mlm(hidden, model.backbone.embeddings.word.weight).float().softmax(-1)
        best, token = probs.max(-1)
        k = int(best.argmax())
        ids[0, at[k]] = int(token[k])
        filled.append({"position": int(at[k]), "token": int(token[k]),
                       "token_str": tokenizer.id_to_token(int(token[k])), "score": float(best[k])})
    return {"sequence": tokenizer.decode(ids[0].tolist(), skip_special_tokens=True), "filled": filled}


# ----------------------------------------------------------------------------- classify
@torch.no_grad()
def classify(model, tokenizer: Tokenizer, texts: list[str], pairs: list[str] | None = None,
             batch_size: int = 32, logits: bool = False, truncation_side: str = "right",
             segments: bool | None = True) -> list[dict]:
    """Label and scores per text: softmax, sigmoid for multi-label, the value for regression.
    With `logits`, each row also carries the raw logits (`"logits": [num_labels]`). A long input
    (or pair) is cut on `truncation_side`; `segments`: see `_run_sorted`."""
    evaluating(model)
    config = model.config
    kind = model.problem_type()
    names = config.label_names

    def step(batch, rows):
        out = []
        for row in model(**batch).logits.float():
            raw = {"logits": row.tolist()} if logits else {}
            if kind == "regression":
                out.append({"value": float(row[0]), **raw})
                continue
            probs = torch.sigmoid(row) if kind == "multi_label_classification" else row.softmax(-1)
            scores = {names[i]: float(p) for i, p in enumerate(probs)}
            if kind == "multi_label_classification":
                out.append({"labels": [n for n, p in scores.items() if p >= 0.5], "scores": scores, **raw})
            else:
                best = int(probs.argmax())
                out.append({"label": names[best], "score": float(probs[best]), "scores": scores, **raw})
        return out

    return _run_sorted(texts, tokenizer, config.max_sequence_length, batch_size, step, pairs=pairs,
                       device=device_of(model), truncation_side=truncation_side, segments=segments)


def relevance(model, tokenizer: Tokenizer, pairs: list[tuple[str, str]], batch_size: int = 32,
              truncation_side: str = "right", activation: str = "sigmoid") -> list[tuple[float, float]]:
    """(score, raw score) of each (query, text) by a cross-encoder: the sigmoid of a single logit (or the logit
    itself, `activation` "identity"), as TEI and sentence-transformers' CrossEncoder give it; for two classes, the
    second's probability."""
    scored = classify(model, tokenizer, [q for q, _ in pairs], [t for _, t in pairs], batch_size=batch_size,
                      truncation_side=truncation_side)
    out = []
    for row in scored:
        if "value" in row:  # one logit
            raw = row["value"]
            out.append((float(1 / (1 + np.exp(-raw))) if activation == "sigmoid" else raw, raw))
        else:
            probability = list(row["scores"].values())[1]
            out.append((probability, probability))
    return out


# ----------------------------------------------------------------------------- embeddings
EMBED_POOLING = ("pooler", *POOLING_MODES)


def _features(tokenizer: Tokenizer, inputs: list[str | list[int]], max_length: int,
              truncation_side: str = "right") -> list[dict]:
    """Model inputs for a mix of texts and token-id lists, cut to `max_length` on `truncation_side`.

    A text is tokenised with its special tokens; a list of ids is the model's own tokens and is used
    as given (TEI's rule for token-id input: nothing is added), cut the same way.
    """
    features: list = [None] * len(inputs)
    texts = [i for i, x in enumerate(inputs) if isinstance(x, str)]
    if texts:
        enc = tokenizer([inputs[i] for i in texts], truncation=True, max_length=max_length,
                        return_token_type_ids=True, truncation_side=truncation_side)
        for i, ids, types in zip(texts, enc["input_ids"], enc["token_type_ids"]):
            features[i] = {"input_ids": ids, "token_type_ids": types}
    for i, x in enumerate(inputs):
        if not isinstance(x, str):
            ids = [int(t) for t in x]
            ids = ids[-max_length:] if truncation_side == "left" else ids[:max_length]
            features[i] = {"input_ids": ids, "token_type_ids": [0] * len(ids)}
    return features


@torch.no_grad()
def embed(model, tokenizer: Tokenizer, texts: list[str | list[int]], pooling: str = "mean", normalize: bool = False,
          batch_size: int = 32, max_length: int | None = None, progress: bool = False,
          sentence: SentencePipeline | None = None, truncation_side: str = "right",
          prompt: str | None = None) -> np.ndarray:
    """Sentence vectors, float32 [len(texts), D].

    With `sentence` (read from a sentence-transformers directory by `read_sentence_dir`), its
    pooling, Dense layers, normalisation, prompt, lower-casing and maximum length are applied,
    as sentence-transformers applies them. Otherwise `pooling` is one of sentence-transformers'
    modes (mean over real tokens, cls, max, ...) or "pooler" (the backbone's tanh pooler).
    An input may also be a list of token ids, used as given (no prompt, no special tokens added).
    A long input is cut on `truncation_side` ("right", or "left" to keep its end). `prompt`, when given,
    replaces the directory's default prompt (as `SentenceTransformer.encode(prompt=...)` does; "" for none).
    """
    if sentence is None:
        if pooling not in EMBED_POOLING:
            raise InputError(f"unknown pooling {pooling!r} ({', '.join(EMBED_POOLING)})")
        sentence = SentencePipeline(steps=[("pool", (pooling,))] + ([("normalize", None)] if normalize else []))
    backbone = getattr(model, "backbone", model)
    evaluating(backbone)
    use_pooler = sentence.pooling == ("pooler",)
    if use_pooler and backbone.pooler is None:
        raise InputError("this model has no pooler; use --pooling mean or cls")
    if sentence.lowercase:
        tokenizer = tokenizer.lowercased()
    prompt = sentence.prompt if prompt is None else prompt
    if prompt:
        texts = [prompt + t if isinstance(t, str) else t for t in texts]
    max_length = min(sentence.max_length or max_length or tokenizer.model_max_length,
                     backbone.config.max_sequence_length)

    def step(batch, rows):
        out = backbone(**batch)
        if use_pooler:
            v = out.pooler_output.float()
            v = F.normalize(v, p=2, dim=-1) if sentence.normalize else v
        else:
            v = sentence(out.last_hidden_state.float(), batch["attention_mask"])
        return list(v.cpu().numpy())

    features = _features(tokenizer, texts, max_length, truncation_side)
    vectors = run_sorted(features, tokenizer.pad_token_id, batch_size, step, device=device_of(backbone),
                         progress=progress)
    return np.stack(vectors) if vectors else np.zeros((0, backbone.config.hidden_size), dtype=np.float32)


@torch.no_grad()
def token_vectors(model, tokenizer: Tokenizer, texts: list[str | list[int]], max_length: int | None = None,
                  truncation_side: str = "right", batch_size: int = 32) -> list[np.ndarray]:
    """The encoder's last hidden state at every token of each input, special tokens included:
    float32 [T_i, H] per input (TEI's /embed_all; sentence-transformers' `output_value="token_embeddings"`)."""
    backbone = getattr(model, "backbone", model)
    evaluating(backbone)
    max_length = min(max_length or tokenizer.model_max_length, backbone.config.max_sequence_length)

    def step(batch, rows):
        hidden = backbone(**batch).last_hidden_state.float().cpu().numpy()
        lengths = batch["attention_mask"].sum(-1).tolist()
        return [hidden[j, :n] for j, n in enumerate(lengths)]

    return run_sorted(_features(tokenizer, texts, max_length, truncation_side), tokenizer.pad_token_id, batch_size,
                      step, device=device_of(backbone))


def read_inputs(texts: list[str], input_file: str | None, stdin_lines: list[str] | None = None) -> list[Any]:
    """Inputs from arguments, a file (one per line, or JSONL objects), or stdin lines."""
    if texts:
        return list(texts)
    if input_file:
        from ..data.io import read_text

        lines = read_text(input_file).splitlines()
        source = input_file
    else:
        lines, source = stdin_lines or [], "<stdin>"
    out = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            raise InputError(f"{source}:{number}: empty line; give one input per line")
        if line.lstrip().startswith("{"):
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise InputError(f"{source}:{number}: not valid JSON ({exc.msg})") from None
        else:
            out.append(line)
    if not out:
        raise InputError(f"{source}: no inputs")
    return out


# ----------------------------------------------------------------------------- NER
@torch.no_grad()
def ner(model, tokenizer: Tokenizer, texts: list[str], aggregation: str = "first", stride: int = 64,
        max_length: int | None = None, batch_size: int = 32) -> list[list[dict]]:
    """Entities per text with character offsets: `{"entity_group", "score", "word", "start", "end"}`.

    Long texts are cut into overlapping windows (`stride` tokens of overlap) whose token
    probabilities are averaged where they overlap. Sub-token probabilities become word
    labels by `aggregation`: the first sub-token, the average, or the most confident one.
    transformers' token-level strategies are there too: "none" gives every token as
    `{"entity", "score", "index", "word", "start", "end"}` ("O" included), "simple" groups
    adjacent tokens of one type as transformers does (its `word` is the tokens' text).
    """
    if aggregation not in ("first", "average", "max", "none", "simple"):
        raise InputError(f"unknown aggregation {aggregation!r} (first, average, max, simple or none)")
    evaluating(model)
    names = model.config.id2label
    max_length = min(max_length or model.config.max_sequence_length, model.config.max_sequence_length)
    # Windows must move forward: the overlap has to be shorter than a window's text ([CLS] and [SEP] aside).
    # The default overlap is halved for models whose windows are short.
    stride = min(stride, (max_length - 2) // 2)
    if not texts:
        return []
    # Every window of every text goes through the model in length-sorted batches, as other pipelines do.
    enc = tokenizer(list(texts), truncation=True, max_length=max_length, stride=stride,
                    return_overflowing_tokens=True, return_offsets_mapping=True, return_token_type_ids=True)
    windows = [{"input_ids": ids, "token_type_ids": types} for ids, types in zip(enc["input_ids"], enc["token_type_ids"])]

    def step(batch: dict, rows: list[int]) -> list:
        probs = model(**batch).logits.float().softmax(-1).cpu()  # (B, T, labels)
        return [probs[j, :len(windows[i]["input_ids"])] for j, i in enumerate(rows)]

    window_probs = run_sorted(windows, tokenizer.pad_token_id, batch_size, step, device=device_of(model))
    token_probs: list[dict[tuple[int, int], list]] = [{} for _ in texts]
    token_word: list[dict[tuple[int, int], int]] = [{} for _ in texts]
    token_at: list[dict[tuple[int, int], tuple[int, int]]] = [{} for _ in texts]  # (index in its first window, id)
    for w, text_index in enumerate(enc["overflow_to_sample_mapping"]):
        for t, (span, word) in enumerate(zip(enc["offset_mapping"][w], enc.word_ids(w))):
            if word is None:
                continue
            token_probs[text_index].setdefault(tuple(span), []).append(window_probs[w][t])
            token_word[text_index][tuple(span)] = word
            token_at[text_index].setdefault(tuple(span), (t, enc["input_ids"][w][t]))
    if aggregation in ("none", "simple"):
        return [_token_entities(tokenizer, names, probs_at, at, aggregation)
                for probs_at, at in zip(token_probs, token_at)]
    results = []
    for text, probs_at, word_at in zip(texts, token_probs, token_word):
        words: dict[int, list] = {}
        for span in sorted(probs_at):
            words.setdefault(word_at[span], []).append((span, torch.stack(probs_at[span]).mean(0)))
        tagged = []
        for word in sorted(words):
            pieces = words[word]
            if aggregation == "first":
                p = pieces[0][1]
            elif aggregation == "average":
                p = torch.stack([x[1] for x in pieces]).mean(0)
            else:
                p = max((x[1] for x in pieces), key=lambda q: float(q.max()))
            label = names[int(p.argmax())]
            tagged.append((label, float(p.max()), pieces[0][0][0], pieces[-1][0][1]))
        results.append(_group_entities(tagged, text))
    return results


def _token_entities(tokenizer: Tokenizer, names: dict[int, str], probs_at: dict, at: dict, how: str) -> list[dict]:
    """transformers' token-level answers: every token ("none"), or adjacent tokens grouped ("simple": a B- tag
    or another type starts a group; a tag without a prefix continues one, as transformers reads it)."""
    tokens = []
    for span in sorted(probs_at):
        p = torch.stack(probs_at[span]).mean(0)
        best = int(p.argmax())
        index, token_id = at[span]
        tokens.append({"entity": names[best], "score": float(p[best]), "index": index,
                       "word": tokenizer.id_to_token(token_id), "start": span[0], "end": span[1], "_id": token_id})
    if how == "none":
        return [{k: v for k, v in t.items() if k != "_id"} for t in tokens]

    def tag(label: str) -> tuple[str, str]:
        return (label[0], label[2:]) if label[:2] in ("B-", "I-") else ("I", label)

    groups: list[list[dict]] = []
    for t in tokens:
        bi, kind = tag(t["entity"])
        if groups and bi != "B" and tag(groups[-1][-1]["entity"])[1] == kind:
            groups[-1].append(t)
        else:
            groups.append([t])
    return [{"entity_group": tag(g[0]["entity"])[1], "score": float(np.mean([t["score"] for t in g])),
             "word": tokenizer.decode([t["_id"] for t in g]), "start": g[0]["start"], "end": g[-1]["end"]}
            for g in groups]


def _group_entities(tagged: list[tuple[str, float, int, int]], text: str) -> list[dict]:
    """IOB2 word labels -> entity spans (B- opens, I- of the same type continues)."""
    entities: list[dict] = []
    current = None
    for label, score, start, end in tagged:
        prefix, _, kind = label.partition("-")
        if label == "O" or not kind:
            current = None
            continue
        if prefix == "I" and current is not None and current["entity_group"] == kind:
            current["end"] = end
            current["_scores"].append(score)
        else:
            current = {"entity_group": kind, "start": start, "end": end, "_scores": [score]}
            entities.append(current)
    for e in entities:
        scores = e.pop("_scores")
        e["score"] = sum(scores) / len(scores)
        e["word"] = text[e["start"]:e["end"]]
    return entities


# ----------------------------------------------------------------------------- QA
@torch.no_grad()
def answer(model, tokenizer: Tokenizer, items: list[dict], max_length: int = 384, stride: int = 128,
           n_best: int = 20, max_answer_len: int = 30, null_threshold: float | None = None,
           batch_size: int = 16) -> list[dict]:
    """`{"question", "context"}` items -> `{"answer", "score", "start", "end"}` (character offsets into
    the context). Contexts of any length are windowed; candidates are merged across windows.
    With `null_threshold` (SQuAD v2 models) the answer is "" when no-answer wins by more than it."""
    from ..data.qa import best_answers

    examples, features, starts, ends = _qa_windows(model, tokenizer, items, max_length, stride, batch_size)
    details: dict = {}
    answers, margins = best_answers(examples, features, starts, ends, n_best, max_answer_len, null_threshold,
                                    details=details)
    # A context with no token to answer from has no span at all: its margin is null, not infinity
    # (which JSON cannot carry).
    return [{**details[e.id], "answer": answers[e.id],
             "null_margin": margins[e.id] if np.isfinite(margins[e.id]) else None} for e in examples]


def _qa_windows(model, tokenizer: Tokenizer, items: list[dict], max_length: int, stride: int,
                batch_size: int) -> tuple[list, list[dict], tuple, tuple]:
    """(examples, windows, start logits, end logits) of `{"question", "context"}` items: each context cut into
    windows that overlap by at most half a window (as transformers' QA pipeline keeps them), through the model."""
    from ..data.qa import QAExample, qa_features

    for i, item in enumerate(items):
        if not isinstance(item, dict) or not item.get("question") or not item.get("context"):
            raise InputError(f"item {i + 1}: needs a non-empty 'question' and 'context'")
    examples = [QAExample(str(i), it["question"], it["context"]) for i, it in enumerate(items)]
    max_length = min(max_length, model.config.max_sequence_length)
    features = qa_features(examples, tokenizer, max_length, min(stride, max_length // 2))
    return (examples, features, *_window_logits(model, tokenizer, features, batch_size))


def _window_logits(model, tokenizer: Tokenizer, features: list[dict], batch_size: int) -> tuple[tuple, tuple]:
    """(start logits, end logits) of each QA window, float [T] each, through the one inference loop."""
    evaluating(model)

    def step(batch: dict, rows: list[int]) -> list:
        out = model(**batch)
        start, end = out.start_logits.float().cpu().numpy(), out.end_logits.float().cpu().numpy()
        sizes = [len(features[i]["input_ids"]) for i in rows]
        return [(start[j, :n], end[j, :n]) for j, n in enumerate(sizes)]

    inputs = [{k: f[k] for k in ("input_ids", "token_type_ids")} for f in features]
    starts, ends = zip(*run_sorted(inputs, tokenizer.pad_token_id, batch_size, step, device=device_of(model)))
    return starts, ends


@torch.no_grad()
def answer_spans(model, tokenizer: Tokenizer, items: list[dict], max_length: int = 384, stride: int = 128,
                 top_k: int = 1, max_answer_len: int = 15, handle_impossible_answer: bool = False,
                 batch_size: int = 16) -> list[list[dict]]:
    """The `top_k` best answers of each `{"question", "context"}` item, ranked as transformers' pipeline ranks
    them (`data.qa.ranked_spans`): [{score, start, end, answer}] per item, best first."""
    from ..data.qa import ranked_spans

    examples, features, starts, ends = _qa_windows(model, tokenizer, items, max_length, stride, batch_size)
    windows: list[list] = [[] for _ in examples]
    for f, s, e in zip(features, starts, ends):
        windows[f["example"]].append((f["offsets"], s, e))
    return [ranked_spans(example, w, top_k, max_answer_len, handle_impossible_answer)
            for example, w in zip(examples, windows)]

