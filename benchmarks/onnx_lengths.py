"""`bertforge export onnx`'s length check for every family member: ONNX Runtime against PyTorch on short rows
and on rows past whatever depends on the length (ModernBERT's local window, DeBERTa's position buckets,
RoBERTa's offset positions), for the fp32 graph and the int8 one.

Each family's backbone is built at a small size (2 layers, hidden 64) with the settings that make
attention depend on the length as in its published base model (ModernBERT's 128-token window,
DeBERTa-v3's 256 buckets over 512 relative positions), every parameter perturbed, then exported with
`export_model`, which checks both lengths itself and refuses a graph that fails either. Prints each
family's largest difference at each length.

    python -m benchmarks.onnx_lengths        # writes benchmarks/results/onnx_lengths.json
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch

from bertforge.inference.export import export_model
from bertforge.models.registry import FAMILIES

from .common import machine, save

SETTINGS = {  # what makes each family's attention depend on the length, as in its published base model
    "deberta-v2": dict(relative_attention=True, position_buckets=256, max_relative_positions=512,
                       pos_att_type=["p2c", "c2p"], share_att_key=True, norm_rel_ebd="layer_norm",
                       position_biased_input=False),
    "modernbert": dict(local_attention=128, max_position_embeddings=8192),
}


def backbone(model_type: str) -> torch.nn.Module:
    row = FAMILIES[model_type]
    config = row.config.from_preset("L2-H64", vocab_size=500, pad_token_id=0, **SETTINGS.get(model_type, {}))
    torch.manual_seed(0)
    model = row.backbone(config).eval()
    with torch.no_grad():  # random weights, LayerNorms and biases included, away from their initial values
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model


def main() -> None:
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        for model_type in FAMILIES:
            report = export_model(backbone(model_type), Path(tmp) / f"{model_type}.onnx", int8=True)
            rows[model_type] = {k: report[k] for k in ("checked_lengths", "max_abs_diff_fp32_by_length",
                                                       "max_abs_diff_int8_by_length")}
            fp32, int8 = report["max_abs_diff_fp32_by_length"], report["max_abs_diff_int8_by_length"]
            print(f"{model_type:12} lengths {report['checked_lengths']}  fp32 "
                  + "  ".join(f"{n}: {d:.1e}" for n, d in fp32.items()) + "  int8 "
                  + "  ".join(f"{n}: {d:.1e}" for n, d in int8.items()), flush=True)
    print(f"saved {save('onnx_lengths', {'machine': machine(), 'families': rows})}")


if __name__ == "__main__":
    main()
