"""The family's test models: each architecture's transformers classes and shapes, a tokenizer of its kind trained on
WikiText-2, and a timed forward; what family_parity.py, family_speed.py, arch_speed.py and latency_vs_infinity.py
share."""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch

import bertforge
from bertforge.models.registry import family
from bertforge.tokenization.bpe import ByteLevelBPETokenizer
from bertforge.tokenization.unigram import AlbertTokenizer, CamembertTokenizer, DebertaV2Tokenizer, UnigramTokenizer
from bertforge.tokenization.verbatim import VerbatimTokenizer
from bertforge.tokenization.wordpiece import MPNetTokenizer

from ..common import DATA, need

HEADS = ("AutoModel", "AutoModelForMaskedLM", "AutoModelForSequenceClassification", "AutoModelForTokenClassification",
         "AutoModelForQuestionAnswering")


# ALBERT's MLM + SOP model and ELECTRA's discriminator are their families' pretraining heads.
PRETRAINING = ("albert", "electra")


FAMILIES = {  # model_type: (transformers class prefix, tokenizer)
    "roberta": ("Roberta", "bpe"),
    "xlm-roberta": ("XLMRoberta", "unigram"),
    "distilbert": ("DistilBert", "wordpiece"),
    "albert": ("Albert", "albert"),
    "electra": ("Electra", "wordpiece"),
    "deberta-v2": ("DebertaV2", "deberta"),
    "modernbert": ("ModernBert", "modern"),
    "mpnet": ("MPNet", "mpnet"),
    "camembert": ("Camembert", "camembert"),
    "gte": ("Gte", "wordpiece"),  # (no question-answering head in transformers)
    "nomic_bert": ("NomicBert", "wordpiece"),  # (nor here)
}


SHAPES = {
    "L2-H32, tied, gelu": dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
                               type_vocab_size=1, layer_norm_eps=1e-5),
    "L1-H24, untied, relu, 2 segments (DistilBERT: sinusoidal)": dict(hidden_size=24, num_hidden_layers=1, num_attention_heads=2,
                                             intermediate_size=40, type_vocab_size=2, hidden_act="relu",
                                             tie_word_embeddings=False, classifier_dropout=0.3),
}


# What ALBERT and ELECTRA add to each shape: embeddings narrower than the hidden size in the first (ALBERT also
# runs 2 groups of 2 shared blocks over 5 layers there), as wide in the second (ALBERT: 1 block run 3 times).
FACTORISED = {
    "albert": ({"embedding_size": 16, "num_hidden_layers": 5, "num_hidden_groups": 2, "inner_group_num": 2},
               {"embedding_size": 24, "num_hidden_layers": 3}),
    "electra": ({"embedding_size": 16}, {"embedding_size": 24}),
    # DeBERTa-v3's settings with 4 buckets (the 64-token rows reach the log-spaced ones), then v2's: 64 buckets,
    # separate position projections for c2p alone, absolute positions, embeddings 16 -> 24 and the convolution.
    "deberta-v2": ({"relative_attention": True, "position_buckets": 4, "max_relative_positions": 64,
                    "pos_att_type": "p2c|c2p", "share_att_key": True, "norm_rel_ebd": "layer_norm",
                    "position_biased_input": False, "type_vocab_size": 0},
                   {"relative_attention": True, "position_buckets": 64, "pos_att_type": ["c2p"],
                    "embedding_size": 16, "conv_kernel_size": 3}),
    # ModernBERT: 3 layers, global then local ones seeing 4 tokens either side (the 64-token rows run on the windowed
    # path); then every layer global with every bias, mean pooling. Its trained tokenizer's ids: [CLS] 1, [SEP] 2,
    # [PAD] 3.
    "modernbert": ({"num_hidden_layers": 3, "local_attention": 8, "global_attn_every_n_layers": 3},
                   {"global_attn_every_n_layers": 1, "norm_bias": True, "attention_bias": True, "mlp_bias": True,
                    "classifier_bias": True, "classifier_pooling": "mean"}),
}


FACTORISED_LABELS = {
    "albert": ("; E=16, 5 layers over 2 groups of 2 shared blocks", "; E=24, 3 layers over 1 shared block"),
    "electra": ("; E=16 projected to H", "; E=H, no projection"),
    "deberta-v2": ("; v3: 4 buckets, shared keys, c2p+p2c, no absolute positions", "; v2: 64 buckets, c2p, E=16, conv"),
    "modernbert": ("; 3 layers, global + 2 local (window 4 either side)", "; all global, all biases, mean pooling"),
}


MODERNBERT_NAMES = {"hidden_act": "hidden_activation", "layer_norm_eps": "norm_eps"}


MODERNBERT_IDS = {"pad_token_id": 3, "cls_token_id": 1, "bos_token_id": 1, "sep_token_id": 2, "eos_token_id": 2}


def sizes_for(model_type: str, sizes: dict, index: int) -> dict:
    """A shape in the config names of the family: DistilBERT has its own, no segments and a fixed eps; its
    second shape also tries the fixed sinusoidal positions. ALBERT and ELECTRA add their factorisation."""
    if model_type in FACTORISED:
        sizes = {**sizes, **FACTORISED[model_type][index]}
        if model_type == "albert":  # ALBERT's name for classifier_dropout
            sizes["classifier_dropout_prob"] = sizes.pop("classifier_dropout", 0.1)
        if model_type == "deberta-v2" and "classifier_dropout" in sizes:  # DeBERTa's
            sizes["cls_dropout"] = sizes.pop("classifier_dropout")
        if model_type == "modernbert":  # its names, no segments, and the ids of its trained tokenizer
            sizes = {MODERNBERT_NAMES.get(k, k): v for k, v in sizes.items() if k != "type_vocab_size"}
            sizes.update(MODERNBERT_IDS)
        return sizes
    if model_type == "mpnet":  # no segments: its config has no type_vocab_size
        return {k: v for k, v in sizes.items() if k != "type_vocab_size"}
    if model_type != "distilbert":
        return sizes
    names = {"hidden_size": "dim", "num_hidden_layers": "n_layers", "num_attention_heads": "n_heads",
             "intermediate_size": "hidden_dim", "hidden_act": "activation", "classifier_dropout": "seq_classif_dropout"}
    out = {names.get(k, k): v for k, v in sizes.items() if k not in ("type_vocab_size", "layer_norm_eps")}
    if "activation" in out:
        out["sinusoidal_pos_embds"] = True
    return out


AUTO_TO_HF = {"AutoModel": "Model", "AutoModelForMaskedLM": "ForMaskedLM", "AutoModelForPreTraining": "ForPreTraining",
              "AutoModelForSequenceClassification": "ForSequenceClassification",
              "AutoModelForTokenClassification": "ForTokenClassification",
              "AutoModelForQuestionAnswering": "ForQuestionAnswering"}


def texts() -> tuple[list[str], list[str]]:
    wiki = [line for line in need(DATA / "wikitext-2-raw" / "wiki.valid.raw").read_text(encoding="utf-8").splitlines()
            if line.strip()][:3000]
    sst = [line.split("\t")[0] for line in need(DATA / "glue/SST-2/dev.tsv").read_text(encoding="utf-8").splitlines()[1:]]
    return wiki, sst


def tokenizer_dir(kind: str, wiki: list[str], root: Path, model_type: str) -> Path:
    """A tokenizer of the family, trained here (WordPiece, MPNet's WordPiece, byte-level BPE, or SentencePiece
    Unigram with XLM-R's, ALBERT's, DeBERTa's or CamemBERT's specials), saved by transformers."""
    import transformers

    path = root / f"tok-{model_type}"
    if kind == "wordpiece":
        tok = bertforge.Tokenizer.train(texts=wiki, vocab_size=2000)
        tok.save(path)
        config = json.loads((path / "tokenizer_config.json").read_text(encoding="utf-8"))
        config["tokenizer_class"] = family(model_type).tokenizer_class
        (path / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
        return path
    cls = {"bpe": ByteLevelBPETokenizer, "unigram": UnigramTokenizer, "albert": AlbertTokenizer,
           "deberta": DebertaV2Tokenizer, "modern": VerbatimTokenizer, "mpnet": MPNetTokenizer,
           "camembert": CamembertTokenizer}[kind]
    cls.train(texts=wiki, vocab_size=2000).save(root / f"ours-{kind}")
    transformers.AutoTokenizer.from_pretrained(root / f"ours-{kind}").save_pretrained(path)
    return path


def tokenizer_agreement(path: Path, sst: list[str]) -> dict[str, int]:
    import transformers

    ours, theirs = bertforge.AutoTokenizer.from_pretrained(path), transformers.AutoTokenizer.from_pretrained(path)
    same = 0
    cases = [(s, None) for s in sst] + list(zip(sst, sst[1:] + sst[:1]))
    for text, pair in cases:
        a = ours(text, pair, return_offsets_mapping=True)
        b = theirs(text, pair, return_offsets_mapping=True)
        same += a["input_ids"] == b["input_ids"] and [tuple(o) for o in a["offset_mapping"]] == \
            [tuple(o) for o in b["offset_mapping"]]
    return {"inputs": len(cases), "identical": same}


def max_diff(a, b, mask: torch.Tensor) -> float:
    worst = 0.0
    real = mask.bool()
    for name in ("last_hidden_state", "pooler_output", "logits", "start_logits", "end_logits", "prediction_logits",
                 "sop_logits"):
        x, y = getattr(a, name, None), getattr(b, name, None)
        if not (isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor)):
            continue
        if x.dim() >= 2 and x.shape[:2] == real.shape:
            x, y = x[real], y[real]
        worst = max(worst, float((x - y).abs().max()))
    return worst


def timed(model, work: list[dict[str, torch.Tensor]]) -> float:
    start = time.perf_counter()
    with torch.inference_mode():
        for batch in work:
            model(**batch)
    return time.perf_counter() - start


BASE_SHAPES = {
    "deberta-v2": ("DebertaV2", "deberta", dict(
        hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
        relative_attention=True, position_buckets=256, max_relative_positions=-1, pos_att_type="p2c|c2p",
        share_att_key=True, norm_rel_ebd="layer_norm", position_biased_input=False, type_vocab_size=0,
        layer_norm_eps=1e-7, max_position_embeddings=512)),
    "modernbert": ("ModernBert", "modern", dict(
        hidden_size=768, num_hidden_layers=22, num_attention_heads=12, intermediate_size=1152, local_attention=128,
        global_attn_every_n_layers=3, global_rope_theta=160000.0, local_rope_theta=10000.0,
        max_position_embeddings=8192)),
}


NAMES = {"deberta-v2": "DeBERTa-v3-base", "modernbert": "ModernBERT-base"}


def build(arch: str, root: Path, wiki: list[str]) -> Path:
    """The random base-shaped model and its tokenizer, saved by transformers in root/m."""
    import transformers

    prefix, kind, shape = BASE_SHAPES[arch]
    tok_dir = tokenizer_dir(kind, wiki, root, arch)
    tok = bertforge.AutoTokenizer.from_pretrained(tok_dir)
    ids = {} if arch != "modernbert" else dict(pad_token_id=tok.pad_token_id, cls_token_id=tok.cls_token_id,
                                               bos_token_id=tok.cls_token_id, sep_token_id=tok.sep_token_id,
                                               eos_token_id=tok.sep_token_id)
    torch.manual_seed(0)
    config = getattr(transformers, prefix + "Config")(vocab_size=tok.vocab_size, **shape, **ids)
    getattr(transformers, prefix + "Model")(config).save_pretrained(root / "m")
    for f in tok_dir.iterdir():
        (root / "m" / f.name).write_bytes(f.read_bytes())
    return root / "m"
