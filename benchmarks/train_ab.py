"""What one of bertforge's training kernels buys a training step: bertforge's model step with it
against the same model without it, interleaved step for step on the same batches (B16 L128 masked
WikiText-2 pairs, AdamW), per size and precision. `--change` picks the kernel:

- `dropout`: the hashed dropout kernel against torch's dropout (`F.dropout`: a Bernoulli draw per
  element, the mask stored for the backward pass), both on the explicit attention path (scores,
  softmax, dropout, @ v). Before the kernel, training used SDPA with its own dropout, which measured
  slower than that explicit path with F.dropout (18.4 against 16.7 ms for a `mini` attention's
  forward and backward), so the ratio is a conservative "before". (Recorded as
  `benchmarks.dropout_ab`, this module's name then.)
- `attention`: the fused varlen attention for training (`kernels/attention_train.cpp`: forward and
  backward on the real tokens, dropout hashed in) against the explicit path it replaced, which
  scatters the tokens into padded rows and keeps [B, nh, T, T] scores; both with hashed dropout.
- `loss`: the masked-LM loss on the native cross-entropy (`kernels/cross_entropy.cpp`) against
  torch's `F.cross_entropy(logits.float(), targets)`, which writes [M, V] float32 tensors.
- `scratch`: the masked-LM decoder's largest tensors on reused memory (`kernels/scratch.py`) against
  fresh pages every step. fp32: the decoder and loss in one autograd node whose logits, their
  gradient and the [V, E] weight's gradient go there; bf16: the weight's bf16 copy and its gradient's
  float32 copy back (autocast's cast, made by the head).
- `buckets` (bf16 only): the training loop's linears under bf16 autocast with their token counts
  rounded up to a bucket (`training/matmul.py`'s `BucketBF16`), so that oneDNN reuses its compiled
  primitives, against autocast's linears on each batch's own count.
- `ffn` (bf16 only): bucketed feed-forward blocks kept padded from their first linear to their second
  (the activation runs on the padded rows) against padding the activation again for the second.
- `norm`: a post-LN block's residual add and LayerNorm on the native training kernel
  (`kernels/residual_norm.cpp`, one pass each way) against torch's add and LayerNorm.
- `tied`: the tied word-embedding matrix's gradient made once (`models/tied.py`: the lookup's rows
  added in place into the decoder's gradient) against autograd's two dense [V, E] gradients and
  their sum.
- `amx` (bf16 only): the training attention kernel's products on AMX tiles (`kernels/amx.h`: bf16
  products, float32 sums) against its float32 FMAs on the same bf16 inputs, where the CPU has AMX.

Several changes joined by commas (`--change tied,ffn`) are measured together: all off against all on.

    python -m benchmarks.train_ab --change dropout|attention|loss|scratch|buckets|ffn|norm|tied|amx[,...] [--sizes mini,base] [--steps 8]
"""

from __future__ import annotations

import contextlib
import json
from unittest.mock import patch

import torch
import torch.nn.functional as F

from bertforge import Tokenizer
from bertforge.kernels import attention, residual_norm
from bertforge.models import heads, layers
from bertforge.models.tied import TiedEmbedding
from bertforge.training import matmul
from bertforge.training.matmul import BucketBF16

from .common import machine, minilm_dir, save
from .pretrain_throughput import paired_models
from .train_peak import PRECISIONS, interleaved_rates, masked_batches, sizes_and_steps


# --change: (the result file, the name of the step without the change, a context that swaps it out for
# torch's own ops, the name with it, a context that turns it on (None: on by default), the precisions).
CHANGES = {
    "dropout": ("dropout_ab", "torch dropout",
                lambda: patch.object(layers, "dropout", lambda x, p, training=True: F.dropout(x, p, training)),
                "hashed dropout", None, PRECISIONS),
    "attention": ("attention_ab", "explicit attention",
                  lambda: patch.object(layers, "fused_training", lambda module, q: False), "fused attention",
                  None, PRECISIONS),
    "loss": ("loss_ab", "torch's cross-entropy",
             lambda: _torch_loss(),
             "native cross-entropy", None, PRECISIONS),
    "scratch": ("scratch_ab", "fresh memory", lambda: _scratch_off(), "reused memory", None, PRECISIONS),
    "buckets": ("buckets_ab", "autocast's linears", None, "bucketed token counts", BucketBF16, ("bf16",)),
    "ffn": ("ffn_ab", "activation padded again", lambda: patch.object(matmul, "_ROWWISE", ()),
            "feed-forward kept padded", None, ("bf16",)),
    "norm": ("norm_ab", "torch's add and LayerNorm", lambda: patch.object(residual_norm, "_native", lambda *a: None),
             "residual LayerNorm kernel", None, PRECISIONS),
    "tied": ("tied_ab", "two dense gradients", lambda: patch.object(TiedEmbedding, "_tracked", lambda self: False),
             "one gradient matrix", None, PRECISIONS),
    "amx": ("amx_ab", "float32 FMAs", lambda: _amx_off(), "AMX tiles", None, ("bf16",)),
}


@contextlib.contextmanager
def _torch_loss():
    """torch's F.cross_entropy on float32 logits for the masked-LM loss while inside (the decoder too
    back on its own F.linear, since the fused node would take the native loss)."""
    with patch.object(heads, "cross_entropy", lambda logits, t: F.cross_entropy(logits.float(), t)), _scratch_off():
        yield


@contextlib.contextmanager
def _scratch_off():
    """The masked-LM head's decoder and loss back to two steps, and autocast's own weight cast, on fresh
    memory while inside."""
    with patch.object(heads, "linear_cross_entropy", lambda *args: None), \
            patch.object(heads, "cast", lambda weight, dtype, scratch: weight):
        yield


@contextlib.contextmanager
def _amx_off():
    """The attention kernel's products back on float32 FMAs while inside."""
    if not attention.amx():
        raise SystemExit("train_ab: this CPU has no AMX tiles (or the native kernels did not build)")
    attention.amx(False)
    try:
        yield
    finally:
        attention.amx(True)


def along(*factories):
    """One context-manager factory entering each of `factories` (None ones skipped), or None if none is left."""
    factories = [f for f in factories if f is not None]
    if not factories:
        return None

    def enter_all():
        stack = contextlib.ExitStack()
        for factory in factories:
            stack.enter_context(factory())
        return stack
    return enter_all


def combined(names: list[str]) -> tuple:
    """Several changes measured together, as one CHANGES entry: all of them off against all on (each
    must be on by default), in the precisions they share."""
    entries = [CHANGES[name] for name in names]
    if any(entry[4] is not None for entry in entries):
        raise SystemExit("train_ab: a change that is off by default (buckets) is measured alone")
    precisions = tuple(p for p in PRECISIONS if all(p in entry[5] for entry in entries))
    return ("_".join(names) + "_ab", "without " + ", ".join(names), along(*(entry[2] for entry in entries)),
            "with " + ", ".join(names), None, precisions)


def measure(change: str, sizes: list[str], steps: int, warmup: int = 2) -> dict:
    _, before, without, after, with_it, precisions = CHANGES[change] if change in CHANGES else combined(change.split(","))
    tokenizer = Tokenizer.from_pretrained(minilm_dir())
    batches = masked_batches(tokenizer, warmup + steps)
    result = {"machine": machine(), "batch_size": 16, "seq_len": 128, "torch": torch.__version__,
              "command": f"python -m benchmarks.train_ab --change {change} --sizes {','.join(sizes)} --steps {steps}",
              "rows": []}
    for size in sizes:
        ours, _ = paired_models(size, tokenizer)
        optimizer = torch.optim.AdamW(ours.parameters(), lr=1e-4, eps=1e-6, fused=True)
        # Both runners step as the training loop does (bf16 linears on bucketed token counts; nothing in
        # fp32), except in the `buckets` comparison itself.
        loop = None if change == "buckets" else BucketBF16
        runners = {before: (ours, optimizer, along(without, loop)), after: (ours, optimizer, along(with_it, loop))}
        for precision in precisions:
            rates = interleaved_rates(runners, batches, precision, warmup)
            row = {"size": size, "precision": precision, **{f"{k} tokens/s": round(v) for k, v in rates.items()},
                   "speedup": round(rates[after] / rates[before], 2)}
            result["rows"].append(row)
            print(json.dumps(row), flush=True)
    return result


def main() -> None:
    parser = sizes_and_steps(__doc__, steps=8)
    parser.add_argument("--change", required=True,
                        help=f"which change to measure: one of {', '.join(sorted(CHANGES))}, or several joined by commas "
                             "(all off against all on)")
    args = parser.parse_args()
    names = args.change.split(",")
    if any(name not in CHANGES for name in names):
        parser.error(f"--change: choose from {', '.join(sorted(CHANGES))}")
    name = CHANGES[args.change][0] if args.change in CHANGES else combined(names)[0]
    print("saved", save(name, measure(args.change, args.sizes.split(","), args.steps)))


if __name__ == "__main__":
    main()
