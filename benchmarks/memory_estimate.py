"""A training step's memory: `training/memory.py`'s estimate against the peak a real step reaches.

Each configuration runs in a fresh process: a BertForPreTraining of the given size, AdamW, and two
optimizer steps on full rows (every token real, 15% of them predicted), under the precision asked for
and with the native kernels on or off; the process's peak resident memory over those steps (VmHWM, set
back to the resident size just before them), less what it held then, is what the step added. Prints estimate / measured per configuration: the
refusal in `check_fits` is only as good as this ratio (it should sit at or above 1, and not far above).

    python -m benchmarks.memory_estimate
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from .common import machine, save

STEP = r"""
import json, math, sys, torch
from bertforge import BertConfig, BertForPreTraining
from bertforge.training.memory import step_bytes
from bertforge.training.precision import autocast_for
preset, B, T, precision = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
torch.manual_seed(0)
model = BertForPreTraining(BertConfig.from_preset(preset, vocab_size=8000))
optimizer = torch.optim.AdamW(model.parameters())
P = math.ceil(0.15 * T)
ids = torch.randint(5, 8000, (B, T))
labels = torch.full_like(ids, -100)
labels[:, 1:P + 1] = ids[:, 1:P + 1]
nsp = torch.zeros(B, dtype=torch.long)
def status(key):  # /proc/self/status, in bytes
    return next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith(key + ":"))
# The peak so far is set back to what is resident now (Linux: clear_refs 5), so that a transient peak of the
# imports or the model's initialisation cannot hide the step's own.
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")
before = status("VmRSS")
for _ in range(2):
    with autocast_for(precision, torch.device("cpu"))():
        out = model(ids, torch.zeros_like(ids), torch.ones_like(ids), labels=labels, next_sentence_label=nsp)
    out.loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
grew = status("VmHWM") - before
from bertforge import kernels
print(json.dumps({"measured": grew, "estimate": step_bytes(model, B, T, precision, predictions=P,
                                                           native=kernels.library())}))
"""

CONFIGS = [("L4-H256", 16, 128), ("L4-H256", 32, 128), ("L4-H256", 8, 512), ("L8-H512", 16, 128),
           ("L12-H768", 8, 128), ("L12-H768", 4, 512)]


def measure(preset: str, batch: int, length: int, precision: str, native: bool) -> dict:
    env = dict(os.environ, BERTFORGE_NATIVE_KERNELS="1" if native else "0")
    out = subprocess.run([sys.executable, "-c", STEP, preset, str(batch), str(length), precision], env=env,
                         capture_output=True, text=True, check=True)
    row = json.loads(out.stdout.strip().splitlines()[-1])
    return {"model": preset, "batch": batch, "seq_len": length, "precision": precision, "native_kernels": native,
            **row, "ratio": round(row["estimate"] / row["measured"], 2)}


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
