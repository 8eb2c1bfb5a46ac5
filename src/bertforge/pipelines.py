"""Using a model on text: fill-mask (more pipelines arrive with the inference issue)."""

from __future__ import annotations

import torch

from .errors import InputError
from .heads import BertForMaskedLM, BertForPreTraining
from .tokenizer import Tokenizer


@torch.no_grad()
def fill_mask(model: BertForMaskedLM | BertForPreTraining, tokenizer: Tokenizer, texts: list[str],
              top_k: int = 5) -> list[list[list[dict]]]:
    """For each text, for each [MASK] in it, the top-k predictions.

    Each prediction is `{"token": id, "token_str": str, "score": probability}`, as the
    transformers fill-mask pipeline gives them. Returns [text][mask][k].
    """
    if not texts:
        return []
    enc = tokenizer(texts, padding=True, truncation=True, max_length=model.config.max_position_embeddings,
                    return_tensors="pt")
    mask_id = tokenizer.mask_token_id
    for i, text in enumerate(texts):
        if not bool((enc["input_ids"][i] == mask_id).any()):
            raise InputError(f"input {i + 1} has no [MASK] token: {text[:60]!r}")
    was_training = model.training
    model.eval()
    hidden = model.bert(enc["input_ids"], enc["token_type_ids"], enc["attention_mask"]).last_hidden_state
    model.train(was_training)
    at_masks = enc["input_ids"] == mask_id  # (B, T)
    # Project only the masked positions onto the vocabulary.
    probs = model.mlm(hidden[at_masks], model.bert.embeddings.word.weight).softmax(-1)  # (N, V)
    scores, ids = probs.topk(min(top_k, probs.shape[-1]), dim=-1)
    rows = at_masks.nonzero()[:, 0].tolist()
    results: list[list[list[dict]]] = [[] for _ in texts]
    for row, s, t in zip(rows, scores.tolist(), ids.tolist()):
        results[row].append([{"token": tok, "token_str": tokenizer.id_to_token(tok), "score": sc}
                             for sc, tok in zip(s, t)])
    return results
