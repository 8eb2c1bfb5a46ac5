"""Where the JAX loop's arrays live: the only JAX module that knows about devices (as
`training/distributed.py` is for torch).

With one device (a CPU, one GPU) nothing changes. With several (`jax.devices()` on a multi-GPU
host, or `XLA_FLAGS=--xla_force_host_platform_device_count=N` on a CPU) the loop trains data
parallel in one process: the parameters and optimizer state are replicated on a 1-D mesh, each
step's batch is split along its batch axis, and `jit` partitions the step over the mesh (XLA
inserts the gradient all-reduce). The arithmetic is the single-device step's; only the order of
the cross-device sums differs, so results agree to float round-off, not bit for bit.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from ..errors import BertforgeError


def check_batch_split(batch_size: int) -> None:
    """Refuse a per-process batch that does not split evenly over the JAX devices."""
    count = jax.device_count()
    if batch_size % count:
        raise BertforgeError(f"batch_size (--batch-size) {batch_size} does not split over {count} JAX "
                             "devices; use a multiple of the device count")


def data_mesh(batch_size: int) -> Mesh | None:
    """A 1-D mesh ("data") over every device, or None with one device. The per-process batch
    must split evenly over the devices."""
    devices = jax.devices()
    if len(devices) == 1:
        return None
    check_batch_split(batch_size)
    return Mesh(np.array(devices), ("data",))


def replicate(tree: Any, mesh: Mesh) -> Any:
    """Every array of `tree` on every device of `mesh`."""
    return jax.device_put(tree, NamedSharding(mesh, PartitionSpec()))


def split_batch(arrays: dict[str, Any], mesh: Mesh) -> dict[str, Any]:
    """Stacked micro-batches [accum, batch, ...], each device holding its share of the batch axis."""
    return {k: jax.device_put(v, NamedSharding(mesh, PartitionSpec(None, "data"))) for k, v in arrays.items()}
