"""A training step's memory: `training/memory.py`'s estimate against the peak a real step reaches.

Each configuration runs in a fresh process: a BertForPreTraining of the given size, AdamW, and two
optimizer steps on full rows (every token real, 15% of them predicted), under the precision asked for
and with the native kernels on or off; the process's peak resident memory over those steps (VmHWM, set
back to the resident size just before them), less what it held then, is what the step added. Prints estimate / measured per configuration: the
refusal in `check_fits` is only as good as this ratio (it should sit at or above 1, and not far above).

    python -m benchmarks.memory_estimate
"""

from __future__ import annotations

import sys

from .common import ROOT, machine, save

sys.path.insert(0, str(ROOT / "tests"))
from memory_step import measure  # noqa: E402  (the test suite's measured step)

CONFIGS = [("L4-H256", 16, 128), ("L4-H256", 32, 128), ("L4-H256", 8, 512), ("L8-H512", 16, 128),
           ("L12-H768", 8, 128), ("L12-H768", 4, 512)]


def main() -> None:
    rows = []
    for preset, batch, length in CONFIGS:
        for precision, native in (("fp32", True), ("fp32", False), ("bf16", True), ("bf16", False)):
            row = measure(preset, batch, length, precision, native)
            rows.append(row)
            print(f"{preset:9} B{batch:<3} T{length:<4} {precision} native={native!s:5}  measured "
                  f"{row['measured'] / 2**20:7.0f} MiB  estimate {row['estimate'] / 2**20:7.0f} MiB  "
                  f"estimate/measured {row['ratio']:.2f}", flush=True)
    ratios = [r["ratio"] for r in rows]
    print(f"estimate/measured: min {min(ratios):.2f}, max {max(ratios):.2f} ({machine()})")
    print(f"saved {save('memory_estimate', {'machine': machine(), 'rows': rows})}")


if __name__ == "__main__":
    main()
