"""`bertforge demo`: the whole foundation in one offline run, on a corpus every Python install has.

It trains a WordPiece vocabulary on the standard library's docstrings, builds a
`tiny` BERT for pretraining, runs a forward pass with MLM + NSP losses, saves the
model in the Hugging Face layout, reloads it, and shows fill-mask. The model is
untrained, so its guesses are random: `bertforge pretrain` is what makes them good.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch

from ..data.builtin_corpus import stdlib_docstrings
from ..errors import BertforgeError
from ..inference.pipelines import fill_mask
from ..interop.inspect import format_report, inspect_checkpoint
from ..models.config import BertConfig
from ..models.heads import BertForPreTraining
from ..tokenization.wordpiece import WordPieceTokenizer

DEMO_SENTENCES = [
    "Return a new [MASK] containing the items of the iterable.",
    "The file is opened in binary [MASK].",
]


def run_demo(out: Path, preset: str = "tiny", vocab_size: int = 8000, seed: int = 0, overwrite: bool = False) -> dict:
    """Returns a summary dict; prints progress as it goes."""
    if out.exists() and any(out.iterdir()) and not overwrite:
        raise BertforgeError(f"{out}: directory exists and is not empty; pass --overwrite or choose another --out")
    torch.manual_seed(seed)
    t0 = time.perf_counter()
    docs = list(stdlib_docstrings())
    print(f"corpus: {len(docs):,} standard-library docstrings, {sum(map(len, docs)) / 1e6:.1f} MB")
    tokenizer = WordPieceTokenizer.train(texts=docs, vocab_size=vocab_size, lowercase=True)
    print(f"tokenizer: trained a WordPiece vocabulary of {len(tokenizer):,} in {time.perf_counter() - t0:.1f}s")

    config = BertConfig.from_preset(preset, vocab_size=len(tokenizer), max_position_embeddings=128)
    model = BertForPreTraining(config)
    print(f"model: {preset} BERT, {model.num_parameters():,} parameters")

    # One batch of real sentence pairs: consecutive docstrings, with ~15% of tokens masked.
    batch = tokenizer(docs[:8], docs[1:9], truncation=True, max_length=128, padding=True, return_tensors="pt")
    ids = batch["input_ids"]
    maskable = (batch["attention_mask"] == 1) & ~torch.isin(ids, torch.tensor(sorted(tokenizer.special_ids)))
    chosen = maskable & (torch.rand(ids.shape) < 0.15)
    labels = torch.where(chosen, ids, torch.full_like(ids, -100))
    inputs = torch.where(chosen, torch.full_like(ids, tokenizer.mask_token_id), ids)
    result = model(inputs, batch["token_type_ids"], batch["attention_mask"], labels=labels,
                next_sentence_label=torch.zeros(ids.shape[0], dtype=torch.long))
    print(f"forward: batch {tuple(ids.shape)}, {int(chosen.sum())} masked positions -> "
          f"MLM logits {tuple(result.logits.shape)}, loss {result.loss.item():.3f} "
          f"(MLM {result.mlm_loss.item():.3f} + NSP {result.nsp_loss.item():.3f}; ln V = {torch.log(torch.tensor(float(config.vocab_size))):.3f})")

    model.save_pretrained(out, tokenizer=tokenizer)
    print(f"saved: {out} (config.json, model.safetensors, vocab.txt, tokenizer.json)\n")
    print(format_report(inspect_checkpoint(out)) + "\n")

    reloaded = BertForPreTraining.from_pretrained(out)
    tok2 = WordPieceTokenizer.from_pretrained(out)
    print("fill-mask (untrained model, so the guesses are random):")
    results = fill_mask(reloaded, tok2, DEMO_SENTENCES, top_k=3)
    for text, per_mask in zip(DEMO_SENTENCES, results):
        print(json.dumps({"text": text, "predictions": [[{"token_str": p["token_str"], "score": round(p["score"], 4)}
                                                           for p in preds] for preds in per_mask]}))
    return {"loss": result.loss.item(), "out": str(out), "seconds": time.perf_counter() - t0}
