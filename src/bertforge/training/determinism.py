"""Bit-for-bit repeatable training on a GPU (`--deterministic`).

On the CPU every kernel the loop runs is deterministic, so a run and its resume repeat bit for bit
with no setting. On CUDA several are not by default: the embedding and gather backward passes add
into shared rows with atomics, whose order varies from run to run, and cuBLAS may split a product
differently. Measured on an H100 (docs/results.md): without this setting a run killed with SIGKILL
and resumed ends with weights that differ from its uninterrupted twin's in the last bits, because
two uninterrupted runs already differ that way. With it, they are equal.

This is PyTorch's documented recipe (its "Reproducibility" notes), which transformers'
`full_determinism` follows too: deterministic algorithms (an op without a deterministic
implementation raises rather than run nondeterministically), cuBLAS's fixed workspace, and cuDNN
without autotuning. It is a process-wide setting and costs speed, so it is opt-in.
"""

from __future__ import annotations

import os

import torch


def use_deterministic_algorithms() -> None:
    """Make this process's CUDA kernels deterministic. Call before the first CUDA product: cuBLAS reads
    CUBLAS_WORKSPACE_CONFIG when it creates its handle (an existing setting of the variable is kept)."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True
