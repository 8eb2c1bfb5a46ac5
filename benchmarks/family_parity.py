"""Family parity report: every architecture x head x shape against transformers, both ways, and tokenizer agreement.

For each family member bertforge reads, builds small random transformers models (every parameter
perturbed), saves them, loads them with bertforge's Auto classes (transformers -> bertforge), saves
them again with bertforge and loads them with transformers (bertforge -> transformers), and records
the largest absolute difference over real tokens of every output, on SST-2 dev sentences tokenised by
a tokenizer of the family trained on WikiText-2. Then counts how many of those sentences (single and
paired) the family's tokenizers encode exactly as transformers' (ids and offsets). ALBERT and ELECTRA
also run their pretraining heads (MLM + sentence order; the replaced-token discriminator).

    python -m benchmarks.family_parity          # writes benchmarks/results/family_parity.json, prints a table
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
from pathlib import Path

import torch

import bertforge

from .common import DATA, ROOT
from .helpers.family import (AUTO_TO_HF, FACTORISED, FACTORISED_LABELS, FAMILIES, HEADS, PRETRAINING, SHAPES, max_diff,
                             sizes_for, texts, tokenizer_agreement, tokenizer_dir)


def main() -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0],
                            epilog=f"reads {DATA / 'wikitext-2-raw/wiki.valid.raw'} and {DATA / 'glue/SST-2/dev.tsv'}"
                            ).parse_args()
    wiki, sst = texts()
    import transformers  # after the data is found: --help and a refusal need not wait ~9 s for it

    rows, tokenizers = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for model_type, (prefix, kind) in FAMILIES.items():
            tok_dir = tokenizer_dir(kind, wiki, root, model_type)
            tokenizers[model_type] = tokenizer_agreement(tok_dir, sst)
            tok = bertforge.AutoTokenizer.from_pretrained(tok_dir)
            batches = [tok(sst[i:i + 32], padding=True, truncation=True, max_length=64, return_tensors="pt",
                           return_token_type_ids=True) for i in range(0, 256, 32)]
            for index, (shape, sizes) in enumerate(SHAPES.items()):
                for auto in HEADS + (("AutoModelForPreTraining",) if model_type in PRETRAINING else ()):
                    if not hasattr(transformers, prefix + AUTO_TO_HF[auto]):  # a head the family lacks (GTE's QA)
                        continue
                    labels = 2 if auto.endswith(("QuestionAnswering", "PreTraining")) else 3
                    config = getattr(transformers, f"{prefix}Config")(vocab_size=tok.vocab_size, num_labels=labels,
                                                                      max_position_embeddings=66,
                                                                      **sizes_for(model_type, sizes, index))
                    torch.manual_seed(0)
                    hf = getattr(transformers, prefix + AUTO_TO_HF[auto])(config)
                    g = torch.Generator().manual_seed(0)
                    with torch.no_grad():
                        for p in hf.parameters():
                            p.add_(torch.randn(p.shape, generator=g) * 0.05)
                    hf.eval().save_pretrained(root / "hf")
                    ours = getattr(bertforge, auto).from_pretrained(root / "hf")
                    ours.save_pretrained(root / "ours")
                    back, info = getattr(transformers, prefix + AUTO_TO_HF[auto]).from_pretrained(
                        root / "ours", output_loading_info=True)
                    back.eval()
                    forward = backward = 0.0
                    with torch.no_grad():
                        for batch in batches:
                            if getattr(config, "type_vocab_size", 1) <= 1:  # DistilBERT, DeBERTa-v3: none at all
                                batch = {k: v for k, v in batch.items() if k != "token_type_ids"}
                            mine = ours(**batch)
                            forward = max(forward, max_diff(mine, hf(**batch), batch["attention_mask"]))
                            backward = max(backward, max_diff(mine, back(**batch), batch["attention_mask"]))
                    label = shape + (FACTORISED_LABELS[model_type][index] if model_type in FACTORISED else "")
                    rows.append({"model_type": model_type, "head": type(ours).__name__, "shape": label,
                                 "transformers_to_bertforge": forward, "bertforge_to_transformers": backward,
                                 "missing": len(info["missing_keys"]), "unexpected": len(info["unexpected_keys"])})
    result = {"machine": platform.processor() or platform.machine(), "torch": torch.__version__,
              "transformers": transformers.__version__, "sentences": 256, "rows": rows, "tokenizers": tokenizers}
    out = ROOT / "benchmarks" / "results" / "family_parity.json"
    out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print("| model_type | head | shape | max abs diff, transformers -> bertforge | bertforge -> transformers "
          "| missing / unexpected keys |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['model_type']} | {r['head']} | {r['shape']} | {r['transformers_to_bertforge']:.1e} "
              f"| {r['bertforge_to_transformers']:.1e} | {r['missing']} / {r['unexpected']} |")
    for model_type, t in tokenizers.items():
        print(f"{model_type} tokenizer: {t['identical']} of {t['inputs']} SST-2 dev inputs (singles and pairs) "
              "identical to transformers' (ids and offsets)")


if __name__ == "__main__":
    main()
