"""CPU inference, side by side on SST-2 dev (872 sentences) with all-MiniLM-L6-v2, batch 32.

1. Identical batches sorted by length: bertforge's encoder on `--backend fused` (the default;
   also with attention in PyTorch ops, as where the native kernel cannot be compiled),
   `torch` (eager) and `compiled` (TorchInductor; its one-off compile is reported) vs transformers
   `BertModel` (eager and sdpa attention), ONNX Runtime (fp32 and dynamic int8) on bertforge's
   export, OpenVINO (fp32, on the same ONNX graph) and CTranslate2 (fp32 and int8, converted from
   the checkpoint), the last two when installed (`pip install openvino ctranslate2`).
2. File order: bertforge's `embed` pipeline (it sorts by length itself) vs transformers (the
   better of eager and sdpa) on batches of 32 in file order.
3. One sentence at a time (batch 1), the first 200 sentences: a server's quiet hours.
4. Model FLOPs utilisation against a 2048^3 fp32 matmul measured in the same run, counting
   only real tokens.
5. With --classifier DIR (an SST-2 fine-tuned checkpoint), SST-2 dev accuracy on each engine,
   so the int8 accuracy change is measured, not assumed.

Each runner lives in its own process, and their passes take turns (benchmarks/engines.py says
why). Every figure is the median of --repeats full passes.

    python -m benchmarks.inference [--repeats 5] [--classifier runs/sst2]
"""

from __future__ import annotations

import json

from .common import inference_args, save
from .helpers.inference import measure


def main() -> None:
    args = inference_args("for the int8 accuracy change")
    result = measure(args.repeats, args.classifier)
    print(json.dumps(result, indent=2))
    print("saved", save("inference", result))


if __name__ == "__main__":
    main()
