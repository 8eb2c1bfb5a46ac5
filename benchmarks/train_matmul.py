"""fp32 training's linear layers on torch's BLAS against oneDNN, and what `--matmul auto` picks.

Three runners of bertforge's `BertForPreTraining` model step (B16 L128 masked WikiText-2 pairs,
fused AdamW, fp32), interleaved step for step on the same batches and model:

- `torch`: every linear on torch's BLAS (MKL's sgemm in the x86 wheels): `--matmul torch`;
- `onednn`: every linear's forward and both gradients on oneDNN (`training/matmul.py`): `--matmul onednn`;
- `auto`: the default, each linear shape on the library its start-up measurement chose (measured
  here in a fresh cache, so the choices and their timings are printed), settled after the first
  step as in the training loop. Against the faster of the other two, this shows what the choosing
  costs.

    python -m benchmarks.train_matmul [--sizes mini,base] [--steps 8]
"""

from __future__ import annotations

import json
import os
import tempfile

import torch

from bertforge import Tokenizer
from bertforge.training.matmul import MatmulChoice

from .common import machine, minilm_dir, save
from .pretrain_throughput import paired_models
from .train_peak import interleaved_rates, masked_batches, matmul_peaks, sizes_and_steps


def measure(sizes: list[str], steps: int, warmup: int = 2) -> dict:
    tokenizer = Tokenizer.from_pretrained(minilm_dir())
    batches = masked_batches(tokenizer, warmup + steps)
    os.environ["BERTFORGE_CACHE_DIR"] = tempfile.mkdtemp(prefix="bf-matmul-cache-")  # auto measures afresh
    result = {"machine": machine(), "batch_size": 16, "seq_len": 128, "torch": torch.__version__,
              "command": f"python -m benchmarks.train_matmul --sizes {','.join(sizes)} --steps {steps}", "rows": []}
    for size in sizes:
        ours, _ = paired_models(size, tokenizer)
        optimizer = torch.optim.AdamW(ours.parameters(), lr=1e-4, eps=1e-6, fused=True)
        auto = MatmulChoice("auto")

        def auto_context(auto=auto):  # as the training loop does: settled after the first step
            context = auto.context()
            auto.settled = True
            return context
        runners = {"torch": (ours, optimizer, None),
                   "onednn": (ours, optimizer, MatmulChoice("onednn").context),
                   "auto": (ours, optimizer, auto_context)}
        peaks = matmul_peaks()
        rates = interleaved_rates(runners, batches, "fp32", warmup)
        row = {"size": size, "precision": "fp32", "tokens_per_s": {k: round(v) for k, v in rates.items()},
               "onednn_over_torch": round(rates["onednn"] / rates["torch"], 3),
               "auto_over_best": round(rates["auto"] / max(rates["torch"], rates["onednn"]), 3),
               "auto_choices": dict(auto.choices), "auto_measurements": list(auto.reasons),
               "peaks_2048": {k: round(v) for k, v in peaks.items()}}
        result["rows"].append(row)
        print(json.dumps(row), flush=True)
    return result


def main() -> None:
    args = sizes_and_steps(__doc__, steps=8).parse_args()
    print("saved", save("train_matmul", measure(args.sizes.split(","), args.steps)))


if __name__ == "__main__":
    main()
