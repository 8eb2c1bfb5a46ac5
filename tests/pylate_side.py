"""PyLate's side of tests/test_colbert.py, run by a Python that has pylate (its own environment: PyLate 1.6 pins
sentence-transformers 5.3).

    python pylate_side.py make BASE OUT [attend] # a ColBERT from a family checkpoint (8-wide projection), saved
    python pylate_side.py encode DIR TEXTS OUT # TEXTS: {"queries": [...], "documents": [...]}; OUT: .npz q0.., d0..
"""

import json
import os
import sys

import numpy as np
import torch
from pylate import models


def main() -> None:
    command, *args = sys.argv[1:]
    if command == "make":
        base, out, *attend = args
        torch.manual_seed(2)
        model = models.ColBERT(base, device="cpu", embedding_size=8, query_length=12, document_length=20,
                               attend_to_expansion_tokens=bool(attend))
        with torch.no_grad():  # the new prefix rows and the projection are random; move them off their init too
            for p in model.parameters():
                p.add_(torch.randn(p.shape) * 0.01)
        model.save(out)
        # The tests give every family BERT's WordPiece files; under a non-BERT config transformers 5.3 saves them as
        # its generic class, which bertforge reads only for tokenizer.json pipelines of their own kind (ModernBERT's).
        config_file = os.path.join(out, "tokenizer_config.json")
        config = json.loads(open(config_file, encoding="utf-8").read())
        if config.get("tokenizer_class") == "TokenizersBackend" and "do_basic_tokenize" in config:
            config["tokenizer_class"] = "BertTokenizer"
            open(config_file, "w", encoding="utf-8").write(json.dumps(config, indent=2))
    elif command == "encode":
        path, texts, out = args
        texts = json.loads(open(texts, encoding="utf-8").read())
        model = models.ColBERT(path, device="cpu")
        q = model.encode(texts["queries"], is_query=True, batch_size=2)
        d = model.encode(texts["documents"], is_query=False, batch_size=2)
        np.savez(out, **{f"q{i}": v for i, v in enumerate(q)}, **{f"d{i}": v for i, v in enumerate(d)})
    else:
        sys.exit(f"unknown command {command!r}")


if __name__ == "__main__":
    main()
