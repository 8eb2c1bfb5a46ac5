"""Training against the machine's peak: shares of the matmul peak, measured in the same run.

For each size (`mini`, `base`) and precision (fp32, bf16 autocast), three figures in real (non-pad)
tokens/s, each turned into a share of peak with FLOPs = 6 x non-embedding parameters x real tokens
(which gives no credit for attention scores or transformers' full-vocabulary decoder: conservative):

- the model step alone: bertforge's `BertForPreTraining` forward, backward and optimizer update on
  B16 L128 WikiText-2 sentence pairs, interleaved step for step with transformers' on the same
  batches and weights (AdamW each; transformers' under the same autocast);
- end to end: `bertforge pretrain` on the same corpus, from the median logged tokens/s (batch
  building, masking, logging, clipping and the optimizer all counted); and, right after it, the
  model step once more (bertforge's alone), so that end to end is also set against a step timed
  the same minute: at `base` the first model-step figure is minutes older, and this host's rate
  drifts that much in minutes;
- the peaks: a 2048² matmul in fp32 (MKL's sgemm, which `torch.mm` uses, and oneDNN's, through the
  fused path's packed linear; the faster counts) and in bf16, measured in a burst before each size;
  and each precision's rate when that matmul runs for seconds (`sustained_peaks`), against which
  the end-to-end figure is also given, since a host may not sustain its burst rate.

    python -m benchmarks.train_peak [--sizes mini,base] [--steps 6] [--e2e-steps 60]
"""

from __future__ import annotations

from .common import save
from .helpers.training import measure, sizes_and_steps


def main() -> None:
    parser = sizes_and_steps(__doc__, steps=6)
    parser.add_argument("--e2e-steps", type=int, default=60)
    args = parser.parse_args()
    print("saved", save("train_peak", measure(args.sizes.split(","), args.steps, args.e2e_steps)))


if __name__ == "__main__":
    main()
