"""One training step's memory, measured in a fresh process: the step tests/test_memory_and_frictions.py holds
`training/memory.py`'s estimate to, and benchmarks/memory_estimate.py tabulates over sizes."""

from __future__ import annotations

import json
import os
import subprocess
import sys

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

def measure(preset: str, batch: int, length: int, precision: str, native: bool) -> dict:
    env = dict(os.environ, BERTFORGE_NATIVE_KERNELS="1" if native else "0")
    out = subprocess.run([sys.executable, "-c", STEP, preset, str(batch), str(length), precision], env=env,
                         capture_output=True, text=True, check=True)
    row = json.loads(out.stdout.strip().splitlines()[-1])
    return {"model": preset, "batch": batch, "seq_len": length, "precision": precision, "native_kernels": native,
            **row, "ratio": round(row["estimate"] / row["measured"], 2)}
