"""The CUDA paths, on a lent GPU: family parity, ModernBERT's long rows and memory, and a bf16 training step.

Run where a GPU is present (bertforge from `src/` on PYTHONPATH is enough; no data files are read):
1. parity: every family's encoder (a small random transformers model, every parameter perturbed) against
   transformers on the GPU in fp32 with TF32 off, at real tokens of padded rows;
2. ModernBERT-base-shaped forward at 512, 2,048 and 8,192 tokens: bertforge against transformers (SDPA and
   eager), fp32 and bf16 autocast, as median seconds of 5 interleaved passes, plus peak GPU memory at 8,192;
3. a training step of each family's masked-LM head under bf16 autocast (the hashed dropout falls back to
   torch's on CUDA): finite loss and gradients.

    python -m benchmarks.gpu_check --out DIR     # writes DIR/gpu_check.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch
import transformers

import bertforge

FAMILIES = {
    "BertModel": ("BertConfig", dict(type_vocab_size=2)),
    "RobertaModel": ("RobertaConfig", dict(max_position_embeddings=300, pad_token_id=1)),
    "DistilBertModel": ("DistilBertConfig", dict(dim=64, n_layers=2, n_heads=4, hidden_dim=96)),
    "AlbertModel": ("AlbertConfig", dict(embedding_size=32)),
    "ElectraModel": ("ElectraConfig", dict(embedding_size=32)),
    "DebertaV2Model": ("DebertaV2Config", dict(relative_attention=True, position_buckets=32, pos_att_type="p2c|c2p",
                                               share_att_key=True, norm_rel_ebd="layer_norm",
                                               position_biased_input=False, type_vocab_size=0)),
    "ModernBertModel": ("ModernBertConfig", dict(local_attention=16, pad_token_id=0, bos_token_id=1, cls_token_id=1,
                                                 eos_token_id=2, sep_token_id=2, max_position_embeddings=4096)),
}
SMALL = dict(vocab_size=300, hidden_size=64, num_hidden_layers=3, num_attention_heads=4, intermediate_size=96)
MODERN_BASE = dict(vocab_size=50368, hidden_size=768, num_hidden_layers=22, num_attention_heads=12,
                   intermediate_size=1152, local_attention=128, max_position_embeddings=8192, pad_token_id=50283,
                   bos_token_id=50281, cls_token_id=50281, eos_token_id=50282, sep_token_id=50282)


def small_config(name: str):
    config_name, extra = FAMILIES[name]
    sizes = {} if name == "DistilBertModel" else SMALL
    if name == "DistilBertModel":
        extra = {**extra, "vocab_size": SMALL["vocab_size"]}
    return getattr(transformers, config_name)(**sizes, **extra)


def parity(root: Path) -> dict[str, float]:
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    out = {}
    for name in FAMILIES:
        torch.manual_seed(0)
        theirs = getattr(transformers, name)(small_config(name))
        with torch.no_grad():
            for p in theirs.parameters():
                p.add_(torch.randn_like(p) * 0.05)
        theirs.save_pretrained(root / name)
        ours = bertforge.AutoModel.from_pretrained(root / name).cuda().eval()
        theirs = theirs.cuda().eval()
        ids = torch.randint(3, 300, (3, 200), device="cuda")
        mask = torch.ones_like(ids)
        mask[1, 150:] = 0
        mask[2, 7:] = 0
        with torch.no_grad():
            a = theirs(input_ids=ids, attention_mask=mask).last_hidden_state
            b = ours(ids, attention_mask=mask).last_hidden_state
        out[name] = float((a - b)[mask.bool()].abs().max())
        print(name, out[name], flush=True)
    return out


def timed(model, ids: torch.Tensor, dtype: torch.dtype | None) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    with torch.inference_mode(), torch.autocast("cuda", dtype=dtype or torch.float32, enabled=dtype is not None):
        model(input_ids=ids, attention_mask=torch.ones_like(ids))
    torch.cuda.synchronize()
    return time.perf_counter() - start


def modernbert(root: Path) -> dict:
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True  # as users run it
    torch.manual_seed(0)
    transformers.ModernBertModel(transformers.ModernBertConfig(**MODERN_BASE)).save_pretrained(root / "modern")
    runners = {"bertforge": bertforge.AutoModel.from_pretrained(root / "modern").cuda().eval()}
    for kind in ("sdpa", "eager"):
        runners[f"transformers-{kind}"] = transformers.AutoModel.from_pretrained(
            root / "modern", attn_implementation=kind).cuda().eval()
    out: dict = {"speed": {}, "memory_8192": {}}
    for tokens, rows in ((512, 32), (2048, 8), (8192, 2)):
        for precision, dtype in (("fp32", None), ("bf16", torch.bfloat16)):
            ids = torch.randint(5, 50000, (rows, tokens), device="cuda")
            times: dict[str, list[float]] = {name: [] for name in runners}
            for name, model in runners.items():
                timed(model, ids, dtype)  # warm-up
            for _ in range(5):
                for name, model in runners.items():
                    times[name].append(timed(model, ids, dtype))
            rate = {name: round(rows / statistics.median(t), 2) for name, t in times.items()}
            out["speed"][f"{tokens}_{precision}"] = {"rows": rows, "rows_per_s": rate,
                                                     "ratios": {n: round(rate["bertforge"] / r, 3)
                                                                for n, r in rate.items() if n != "bertforge"}}
            print(tokens, precision, out["speed"][f"{tokens}_{precision}"], flush=True)
    ids = torch.randint(5, 50000, (1, 8192), device="cuda")
    for name, model in runners.items():
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        timed(model, ids, None)
        out["memory_8192"][name] = round((torch.cuda.max_memory_allocated() - base) / 2**20)
    print("memory", out["memory_8192"], flush=True)
    return out


def training(root: Path) -> dict[str, float]:
    out = {}
    for name in FAMILIES:
        model = bertforge.AutoModelForMaskedLM.from_pretrained(root / name).cuda().train()
        ids = torch.randint(3, 300, (4, 128), device="cuda")
        labels = torch.where(torch.rand(ids.shape, device="cuda") < 0.15, ids, -100)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(ids, attention_mask=torch.ones_like(ids), labels=labels).loss
        loss.backward()
        finite = all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
        out[name] = float(loss.detach()) if finite and torch.isfinite(loss) else float("nan")
        print(name, "bf16 step loss", out[name], flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "transformers": transformers.__version__, "command": "python -m benchmarks.gpu_check --out DIR"}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        result["parity_max_abs_diff_fp32"] = parity(root)
        result["masked_lm_bf16_step_loss"] = training(root)
        result["modernbert_base"] = modernbert(root)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gpu_check.json").write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
