"""What the hashed dropout kernel buys a training step: bertforge's model step with it against the
same model with torch's dropout (`F.dropout`: a Bernoulli draw per element, the mask stored for
the backward pass), interleaved step for step on the same batches, per size and precision.

"torch's dropout" runs on the same explicit attention path as the kernel (scores, softmax, dropout,
@ v). Before the kernel, training used SDPA with its own dropout, which measured slower than this
explicit path with F.dropout (18.4 against 16.7 ms for a `mini` attention's forward and backward),
so the ratio here is a conservative "before".

    python -m benchmarks.dropout_ab [--sizes mini,base] [--steps 8]
"""

from __future__ import annotations

import contextlib
import json

import torch
import torch.nn.functional as F

from bertforge import Tokenizer
from bertforge.models import layers

from .common import machine, minilm_dir, save
from .pretrain_throughput import paired_models
from .train_peak import PRECISIONS, interleaved_rates, masked_batches, sizes_and_steps


@contextlib.contextmanager
def torch_dropout():
    """Every dropout of bertforge's layers through F.dropout for the duration."""
    hashed = layers.dropout
    layers.dropout = lambda x, p, training=True: F.dropout(x, p, training)
    try:
        yield
    finally:
        layers.dropout = hashed


def measure(sizes: list[str], steps: int, warmup: int = 2) -> dict:
    tokenizer = Tokenizer.from_pretrained(minilm_dir())
    batches = masked_batches(tokenizer, warmup + steps)
    result = {"machine": machine(), "batch_size": 16, "seq_len": 128, "torch": torch.__version__,
              "command": f"python -m benchmarks.dropout_ab --sizes {','.join(sizes)} --steps {steps}", "rows": []}
    for size in sizes:
        ours, _ = paired_models(size, tokenizer)
        optimizer = torch.optim.AdamW(ours.parameters(), lr=1e-4, eps=1e-6, fused=True)
        runners = {"torch dropout": (ours, optimizer, torch_dropout), "hashed dropout": (ours, optimizer, None)}
        for precision in PRECISIONS:
            rates = interleaved_rates(runners, batches, precision, warmup)
            row = {"size": size, "precision": precision, **{f"{k} tokens/s": round(v) for k, v in rates.items()},
                   "speedup": round(rates["hashed dropout"] / rates["torch dropout"], 2)}
            result["rows"].append(row)
            print(json.dumps(row), flush=True)
    return result


def main() -> None:
    args = sizes_and_steps(__doc__, steps=8).parse_args()
    print("saved", save("dropout_ab", measure(args.sizes.split(","), args.steps)))


if __name__ == "__main__":
    main()
